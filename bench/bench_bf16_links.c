/* W1's step with and without mixed precision's bf16 words links (nn_internal.h): a BatchNorm
 * writing the next Conv2d's input words (x, the forward link) and the previous Conv2d's output
 * gradient words (dy, the backward link), in one process, alternating step by step: on a machine
 * shared with other work, whole-process A/B runs of bench_step drift by more than the
 * difference, while the two modes of one process see the same load within a few milliseconds.
 *
 *   bench_bf16_links [--steps N] [--threads T] [--batch B] [--fp32] [--model w1|w3]
 *                    [--link x|xpair|dy|both|bn|dx2|mask|stats|outpf|stem|wgpf|s2dx|stemdx|
 *                            bnpair|d2sp|foldw|wgnext|wloops]
 *
 * --model w3: W3's resnet18 (cf_resnet(18, 3, 10)) on RGB 128 x 128 images instead of W1 (a
 * step is about 70 times W1's: take --steps 10 or so).
 *
 * Each step is a training forward and backward of W1 (mini-resnet, the Fashion-MNIST shape,
 * random inputs and upstream gradient, no optimizer step: the weights stay as they are), in bf16
 * unless --fp32; the mode alternates every step (the first of each pair alternating too). Prints
 * the CPU time of the process per forward + backward and of the backward alone, medians over the
 * steps of each mode, and their ratio (with the link(s) / without). --link picks which links the
 * mode switches (both by default); the others stay on. --link bn switches BatchNorm's fused
 * passes instead (cf__nn_set_bn_fused_passes: the convpath's last BatchNorm's output left to the
 * residual fold, the forward link's words rounded in registers), both words links on; --link dx2
 * switches stride 2's dx over its phases' own positions (cf__conv_bf16_set_dx2_cols,
 * kernel_table.h), both words links on; --link mask switches the residual blocks' ReLU mask bits
 * (cf__nn_set_res_mask_bits: the fold writes the mask as bits and the last BatchNorms apply them
 * to dy, against the block's mask pass), every other link and pass on; --link xpair switches the
 * x link through a residual block's stride-2 pair alone (cf__nn_set_x_pair_link: W1's stem
 * BatchNorm into block 0.3), both words links on; --link stats switches the statistics link
 * (cf__nn_set_stats_link: each bf16 Conv2d's epilogue takes the next BatchNorm's per-image sums
 * while its output is in cache, the BatchNorm skips its statistics pass), every other link and
 * pass on, and also prints the forward's medians and how many BatchNorms took the sums; --link
 * outpf switches conv_cols' prefetch of its output planes' lines for writing
 * (cf__conv_bf16_set_cols_prefetch, kernel_table.h), every link and pass on, and prints the
 * forward's medians too; --link stem
 * switches the direct stem (cf__nn_set_stem_direct: W1's gray stem per image, without the patch
 * matrix and GEMM, its BatchNorm's sums from its epilogue) against the lowered product, every
 * link and pass on, with the forward's medians and the sums taken too; wgpf switches the weight
 * gradient's fetch of the next image's bf16 words of x and dy while it copies this image's
 * (cf__conv_bf16_set_wgrad_prefetch), every link and pass on; s2dx switches stride 2's dx stored
 * straight into dx's rows (cf__conv_bf16_set_dx_spread), every link and pass on; stemdx switches
 * the stem BatchNorm's dx made image by image inside the direct stem's weight gradient
 * (cf__nn_set_stem_dx_link); bnpair switches the residual blocks' two last BatchNorms' backward in
 * one (cf__nn_set_bn_pair_backward), all else on; d2sp switches dx2_cols' phases stored into dx's
 * rows (cf__conv_bf16_set_dx2_spread); foldw switches block 0.3's fold writing block
 * 0.4's pair its words (cf__nn_set_fold_words_link), all else on, with the forward's medians;
 * wgnext switches the weight gradient's fetch across its blocks (the block's last image fetching
 * the next block's first, cf__conv_bf16_set_wgrad_fetch_next), all else on; wloops switches
 * the weight gradient's word copies' own loops for short rows (cf__bf16_set_words_loops: rows_h
 * up to 32 words, deal2_h 17 to 32, a row pair a step with the masks made once), all else on. */
#include <corefit.h>

#include "nn/nn_internal.h"
#include "tensor/kernel_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int count_took(const cf_module *m) {
    int k = cf_nn_bn_took_stats(m);
    for (int i = 0; i < m->n_children; i++) k += count_took(m->children[i]);
    return k;
}

int main(int argc, char **argv) {
    int steps = 200, threads = 1, batch = 64;
    bool bf16 = true, link_x = true, link_dy = true, bn_passes = false, dx2 = false,
         mask_bits = false, xpair = false, stats = false, outpf = false, stem = false, wgpf = false,
         s2dx = false, stemdx = false, bnpair = false, d2sp = false, foldw = false, w3 = false,
         wgnext = false, wloops = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fp32"))
            bf16 = false;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc && !strcmp(argv[i + 1], "w3"))
            w3 = true, i++;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc && !strcmp(argv[i + 1], "w1"))
            w3 = false, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "x"))
            link_dy = false, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "dy"))
            link_x = false, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "dx2"))
            link_x = link_dy = false, dx2 = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "xpair"))
            link_x = link_dy = false, xpair = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "both"))
            i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "bn"))
            link_x = link_dy = false, bn_passes = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "mask"))
            link_x = link_dy = false, mask_bits = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "stats"))
            link_x = link_dy = false, stats = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "outpf"))
            link_x = link_dy = false, outpf = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "stem"))
            link_x = link_dy = false, stem = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "wgpf"))
            link_x = link_dy = false, wgpf = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "s2dx"))
            link_x = link_dy = false, s2dx = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "stemdx"))
            link_x = link_dy = false, stemdx = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "bnpair"))
            link_x = link_dy = false, bnpair = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "d2sp"))
            link_x = link_dy = false, d2sp = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "foldw"))
            link_x = link_dy = false, foldw = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "wgnext"))
            link_x = link_dy = false, wgnext = true, i++;
        else if (!strcmp(argv[i], "--link") && i + 1 < argc && !strcmp(argv[i + 1], "wloops"))
            link_x = link_dy = false, wloops = true, i++;
        else {
            fprintf(stderr,
                    "usage: %s [--steps N] [--threads T] [--batch B] [--fp32] "
                    "[--link "
                    "x|xpair|dy|both|bn|dx2|mask|stats|outpf|stem|wgpf|s2dx|stemdx|bnpair|d2sp|"
                    "foldw|wgnext|wloops] [--model w1|w3]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 2 || threads < 1 || batch < 1) {
        fprintf(stderr, "bench_bf16_links: steps >= 2, threads and batch >= 1\n");
        return 2;
    }
    cf_set_num_threads(threads);
    cf_model *model;
    const int ch = w3 ? 3 : 1, side = w3 ? 128 : 28;
    if (cf_model_new(&model, w3 ? cf_resnet(18, 3, 10) : cf_mini_resnet(1, 10), 1) != CF_OK) {
        fprintf(stderr, "bench_bf16_links: %s\n", cf_last_error());
        return 1;
    }
    if (bf16) cf_conv_set_bf16(model->root, true);
    cf_model_train(model, true);
    const size_t nx = (size_t)batch * ch * side * side;
    float *x = malloc(nx * sizeof(float)), *dy = malloc((size_t)batch * 10 * sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, 7);
    for (size_t i = 0; i < nx; i++) x[i] = (float)(2 * cf_rng_uniform(&rng) - 1);
    for (int i = 0; i < batch * 10; i++) dy[i] = (float)(cf_rng_uniform(&rng) - 0.5) / batch;
    const cf_tensor tx = cf_tensor_view(x, cf_shape4(batch, ch, side, side));
    const cf_tensor tdy = cf_tensor_view(dy, cf_shape2(batch, 10));
    double *step_ms[2], *bwd_ms[2], *fwd_ms[2];
    int took = 0; /* BatchNorms that took the linked sums, the last step with the link */
    for (int m = 0; m < 2; m++) {
        step_ms[m] = malloc((size_t)steps * sizeof(double));
        bwd_ms[m] = malloc((size_t)steps * sizeof(double));
        fwd_ms[m] = malloc((size_t)steps * sizeof(double));
    }
    int n[2] = {0, 0};
    for (int s = -4; s < 2 * steps; s++) {                /* 4 warm-up steps */
        const int mode = s < 0 ? s & 1 : (s / 2 + s) & 1; /* on, off / off, on alternately */
        if (link_x) cf__nn_set_x_words_link(mode == 1);
        if (link_dy) cf__nn_set_dy_words_link(mode == 1);
        if (bn_passes) cf__nn_set_bn_fused_passes(mode == 1);
        if (dx2) cf__conv_bf16_set_dx2_cols(mode == 1);
        if (mask_bits) cf__nn_set_res_mask_bits(mode == 1);
        if (xpair) cf__nn_set_x_pair_link(mode == 1);
        if (stats) cf__nn_set_stats_link(mode == 1);
        if (outpf) cf__conv_bf16_set_cols_prefetch(mode == 1);
        if (stem) cf__nn_set_stem_direct(mode == 1);
        if (wgpf) cf__conv_bf16_set_wgrad_prefetch(mode == 1);
        if (s2dx) cf__conv_bf16_set_dx_spread(mode == 1);
        if (stemdx) cf__nn_set_stem_dx_link(mode == 1);
        if (bnpair) cf__nn_set_bn_pair_backward(mode == 1);
        if (d2sp) cf__conv_bf16_set_dx2_spread(mode == 1);
        if (foldw) cf__nn_set_fold_words_link(mode == 1);
        if (wgnext) cf__conv_bf16_set_wgrad_fetch_next(mode == 1);
        if (wloops) cf__bf16_set_words_loops(mode == 1);
        const cf_tensor *y;
        const double t0 = cpu_ms();
        if (cf_model_forward(model, &tx, &y) != CF_OK) {
            fprintf(stderr, "bench_bf16_links: forward: %s\n", cf_last_error());
            return 1;
        }
        const double t1 = cpu_ms();
        if ((stats || stem) && mode == 1) took = count_took(model->root);
        if (cf_model_backward(model, &tdy) != CF_OK) {
            fprintf(stderr, "bench_bf16_links: backward: %s\n", cf_last_error());
            return 1;
        }
        const double t2 = cpu_ms();
        cf_model_zero_grad(model);
        if (s < 0) continue;
        step_ms[mode][n[mode]] = t2 - t0;
        fwd_ms[mode][n[mode]] = t1 - t0;
        bwd_ms[mode][n[mode]++] = t2 - t1;
    }
    cf__nn_set_x_words_link(true);
    cf__nn_set_dy_words_link(true);
    cf__nn_set_bn_fused_passes(true);
    cf__conv_bf16_set_dx2_cols(true);
    cf__nn_set_res_mask_bits(true);
    cf__nn_set_x_pair_link(true);
    cf__nn_set_stats_link(true);
    cf__conv_bf16_set_cols_prefetch(true);
    cf__nn_set_stem_direct(true);
    cf__conv_bf16_set_wgrad_prefetch(true);
    cf__conv_bf16_set_dx_spread(true);
    cf__nn_set_stem_dx_link(true);
    cf__nn_set_bn_pair_backward(true);
    cf__conv_bf16_set_dx2_spread(true);
    cf__nn_set_fold_words_link(true);
    cf__conv_bf16_set_wgrad_fetch_next(true);
    cf__bf16_set_words_loops(true);
    const double s_off = median(step_ms[0], n[0]), s_on = median(step_ms[1], n[1]),
                 b_off = median(bwd_ms[0], n[0]), b_on = median(bwd_ms[1], n[1]);
    printf("%s forward + backward (no optimizer), batch %d, %d thread(s), %s, kernels %s, %d steps "
           "per mode, switching %s\n",
           w3 ? "W3 (resnet18, 3 x 128 x 128)" : "W1", batch, threads, bf16 ? "bf16" : "fp32",
           cf_isa_name(cf_isa_active()), n[1],
           wloops      ? "rows_h's and deal2_h's short rows' loops (every link on)"
           : wgnext    ? "the weight gradient's fetch across its blocks (every link on)"
           : foldw     ? "block 0.3's fold writing block 0.4's words (every link on)"
           : s2dx      ? "stride 2's dx stored into dx's rows (every link on)"
           : stemdx    ? "the stem BatchNorm's dx in the stem's weight gradient (every link on)"
           : bnpair    ? "the blocks' last BatchNorms' backward in one (every link on)"
           : d2sp      ? "dx2_cols' phases stored into dx's rows (every link on)"
           : wgpf      ? "the weight gradient's prefetch of the next image's words (every link on)"
           : outpf     ? "conv_cols' output prefetch (every link on)"
           : stem      ? "the direct stem (every link on)"
           : stats     ? "the statistics link (every other link on)"
           : mask_bits ? "the residual blocks' mask bits (every other link on)"
           : bn_passes ? "BatchNorm's fused passes (both words links on)"
           : dx2       ? "stride 2's dx path (dx2_cols; both words links on)"
           : xpair     ? "the x link through block 0.3's pair (both words links on otherwise)"
           : link_x && link_dy ? "the x and dy links"
           : link_x            ? "the x link"
                               : "the dy link");
    printf("CPU ms, medians: fwd+bwd without %.3f, with %.3f (ratio %.3f); bwd without %.3f, "
           "with %.3f (ratio %.3f)\n",
           s_off, s_on, s_on / s_off, b_off, b_on, b_on / b_off);
    if (stats || outpf || stem || foldw) {
        const double f_off = median(fwd_ms[0], n[0]), f_on = median(fwd_ms[1], n[1]);
        printf("forward without %.3f, with %.3f (ratio %.3f)", f_off, f_on, f_on / f_off);
        if (stats || stem) printf("; %d BatchNorms took the linked sums", took);
        printf("\n");
    }
    for (int m = 0; m < 2; m++) free(step_ms[m]), free(bwd_ms[m]), free(fwd_ms[m]);
    free(x), free(dy);
    cf_model_free(model);
    return 0;
}
