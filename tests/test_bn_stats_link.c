/* The statistics link (src/nn/nn_internal.h, cf_nn_conv_stats_bn): a bf16 Conv2d's forward
 * computes the next BatchNorm2d's per-image shifted sums in its epilogue
 * (cf_conv_bf16_forward_each), and the BatchNorm skips its statistics pass. Everything must stay
 * bitwise what the unlinked layers compute, for every thread count.
 *
 * The epilogue itself against cf_conv_bf16_forward_keep / _from_kept_with: every image reported
 * once (and a paired shortcut's), each image's output already final when it is reported, the
 * outputs and kept words bitwise the same; on the cols path, run_images' path (the level without
 * conv_cols), the compact small-plane path and from x's words. The networks (W1's first block,
 * W1, a stride-1 block, a block with a lone BatchNorm idpath, a U-Net on W1's body) run training
 * steps then an eval forward with the link (cf__nn_set_stats_link(true), the default) and
 * without: every output, input gradient, gradient, buffer and weight equal (memcmp), on 1, 2 and
 * 3 threads, and the link taken by exactly the expected BatchNorms each training forward
 * (cf_nn_bn_took_stats; none in eval, in fp32, with synchronised statistics, or behind a Conv2d
 * hooked after the plan whose hook changes its output), W1's gray stem's BatchNorm too, fp32 or
 * bf16, where the level has the direct stem (cf_conv_stem_pays; tests/test_conv_stem.c).
 * tests/bn_stats_link.cmake runs this under every CF_ISA cap and over the amx tile emulation. */
#include "block_nets.h"
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"
#include "tensor/kernel_table.h"

#define STEPS 3

/* ---- the epilogue --------------------------------------------------------------------------- */

typedef struct ep_check {
    int n, o, so;
    size_t out_n, so_n;
    const float *y, *sy;     /* the call's outputs */
    const float *ref, *sref; /* the reference outputs */
    int *seen, *sseen;       /* times each image was reported */
    int calls;
} ep_check;

static void ep_fn(void *v, bool shortcut, int n0, int count) {
    ep_check *e = v;
    e->calls++;
    assert_true(n0 >= 0 && count >= 1 && n0 + count <= e->n);
    assert_true(!shortcut || e->so > 0);
    for (int i = n0; i < n0 + count; i++) {
        (shortcut ? e->sseen : e->seen)[i]++;
        const size_t per = shortcut ? e->so_n : e->out_n;
        const float *got = (shortcut ? e->sy : e->y) + (size_t)i * per,
                    *want = (shortcut ? e->sref : e->ref) + (size_t)i * per;
        if (memcmp(got, want, per * sizeof(float)) != 0)
            fail_msg("image %d%s reported before its output was final", i,
                     shortcut ? " (shortcut)" : "");
    }
}

/* forward_each with the epilogue against forward_keep (x in fp32) and from_kept_with (its
 * words), a layer of c -> o channels, k x k, stride s on h x w, a paired shortcut of so channels
 * (stride 2 only; 0: none); with the level's kernels and without conv_cols. */
static void check_epilogue(int n, int c, int h, int w, int o, int k, int s, int so) {
    const int pad = (k - 1) / 2;
    cf_conv_geom g, sg;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, s, s, pad, pad));
    assert_true(cf_conv_geom_init(&sg, c, h, w, 1, 1, 2, 2, 0, 0));
    if (!cf_bf16_compute() || !cf_conv_bf16_supported(&g, o)) return;
    if (so) assert_true(cf_conv_bf16_pair_fits(&g, o, &sg, so));
    const size_t nx = (size_t)n * c * h * w, out_n = (size_t)o * g.oh * g.ow,
                 so_n = (size_t)so * g.oh * g.ow, nw = (size_t)o * c * k * k;
    float *x = malloc(nx * sizeof(float)), *wt = malloc(nw * sizeof(float));
    float *sw = malloc(((size_t)so * c + 1) * sizeof(float));
    float *y1 = malloc(n * out_n * sizeof(float)), *y2 = malloc(n * out_n * sizeof(float));
    float *sy1 = malloc((n * so_n + 1) * sizeof(float)),
          *sy2 = malloc((n * so_n + 1) * sizeof(float));
    uint16_t *kept1 = malloc(nx * sizeof(uint16_t)), *kept2 = malloc(nx * sizeof(uint16_t));
    float *packed = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float));
    float *spacked = malloc(cf_conv_bf16_packed_floats(&sg, so ? so : 1) * sizeof(float));
    float *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float));
    int *seen = calloc((size_t)n, sizeof(int)), *sseen = calloc((size_t)n, sizeof(int));
    fill_bf16_specials(x, nx, 17);
    fill_uniform(wt, nw, 18, -1, 1);
    fill_uniform(sw, (size_t)so * c, 19, -1, 1);
    const cf_kernel_table *level = cf_active_kernels;
    cf_kernel_table without = *level;
    cf_bf16_kernels without_bf16 = *level->bf16;
    without_bf16.conv_cols = NULL;
    without.bf16 = &without_bf16;
    for (int pass = 0; pass < 2; pass++)
        for (int words = 0; words < 2; words++) {
            cf_active_kernels = pass ? &without : level;
            if (words && !cf_conv_bf16_forward_from_kept_fits(&g, o)) continue;
            cf_conv_bf16_pack(&g, o, wt, packed);
            if (so) cf_conv_bf16_pack(&sg, so, sw, spacked);
            const cf_conv_shortcut sc1 = {.out_channels = so, .w = spacked, .y = sy1},
                                   sc2 = {.out_channels = so, .w = spacked, .y = sy2};
            assert_int_equal(cf_conv_bf16_forward_keep(&g, o, packed, x, n, y1, scratch,
                                                       so ? &sc1 : NULL, kept1),
                             CF_OK);
            for (size_t i = 0; i < n * out_n; i++) y2[i] = 1e30f;
            for (size_t i = 0; i < n * so_n; i++) sy2[i] = 1e30f;
            memset(kept2, 0xa5, nx * sizeof(uint16_t));
            memset(seen, 0, (size_t)n * sizeof(int));
            memset(sseen, 0, (size_t)n * sizeof(int));
            ep_check e = {n, o, so, out_n, so_n, y2, sy2, y1, sy1, seen, sseen, 0};
            const cf_conv_epilogue ep = {ep_fn, &e};
            assert_int_equal(cf_conv_bf16_forward_each(&g, o, packed, words ? NULL : x,
                                                       words ? kept1 : NULL, n, y2, scratch,
                                                       so ? &sc2 : NULL, words ? NULL : kept2, &ep),
                             CF_OK);
            if (memcmp(y1, y2, n * out_n * sizeof(float)) != 0 ||
                memcmp(sy1, sy2, n * so_n * sizeof(float)) != 0)
                fail_msg("forward_each %d -> %d %dx%d stride %d on %dx%d, shortcut %d (%s, %s): "
                         "not bitwise forward_keep's",
                         c, o, k, k, s, h, w, so, pass ? "without conv_cols" : "the level's",
                         words ? "from words" : "from fp32");
            if (!words) assert_memory_equal(kept1, kept2, nx * sizeof(uint16_t));
            for (int i = 0; i < n; i++) {
                if (seen[i] != 1 || sseen[i] != (so ? 1 : 0))
                    fail_msg("forward_each %d -> %d on %dx%d (%s, %s): image %d reported %d "
                             "times, its shortcut's %d",
                             c, o, h, w, pass ? "without conv_cols" : "the level's",
                             words ? "from words" : "from fp32", i, seen[i], sseen[i]);
            }
            assert_true(e.calls >= 1);
        }
    cf_active_kernels = level;
    /* bad input is refused: both x and its words, or neither */
    ep_check e = {0};
    const cf_conv_epilogue ep = {ep_fn, &e};
    assert_int_equal(
        cf_conv_bf16_forward_each(&g, o, packed, x, kept1, n, y2, scratch, NULL, NULL, &ep),
        CF_ERR_INVALID);
    assert_int_equal(
        cf_conv_bf16_forward_each(&g, o, packed, NULL, NULL, n, y2, scratch, NULL, NULL, &ep),
        CF_ERR_INVALID);
    /* ... with no epilogue too */
    assert_int_equal(
        cf_conv_bf16_forward_each(&g, o, packed, x, kept1, n, y2, scratch, NULL, NULL, NULL),
        CF_ERR_INVALID);
    assert_int_equal(
        cf_conv_bf16_forward_each(&g, o, packed, NULL, NULL, n, y2, scratch, NULL, NULL, NULL),
        CF_ERR_INVALID);
    assert_int_equal(e.calls, 0);
    free(x), free(wt), free(sw), free(y1), free(y2), free(sy1), free(sy2), free(kept1), free(kept2),
        free(packed), free(spacked), free(scratch), free(seen), free(sseen);
}

static void test_epilogue(void **state) {
    (void)state;
    check_epilogue(5, 16, 28, 28, 32, 3, 2, 32); /* W1's block 0.3 pair (cols) */
    check_epilogue(9, 32, 14, 14, 64, 3, 2, 64); /* block 0.4's (7 x 7 out: 8 images a call) */
    check_epilogue(3, 32, 14, 14, 32, 3, 1, 0);  /* convpath.3 of block 0.3 */
    check_epilogue(9, 64, 7, 7, 64, 3, 1, 0);    /* ... of block 0.4 */
    check_epilogue(4, 16, 14, 14, 16, 3, 1, 0);  /* 16 outputs: run_images' path */
    check_epilogue(7, 16, 4, 4, 24, 3, 1, 0);    /* small planes: compact where it pays */
    check_epilogue(3, 16, 28, 28, 32, 1, 2, 0);  /* a 1x1 stride-2 shortcut alone */
}

/* ---- a hook on Conv2d: a copy of its ops whose forward changes its output after the layer ---- */

static const cf_module_ops *hook_orig;
static cf_module_ops hook_ops;

static const cf_tensor *hook_forward(cf_module *m, const cf_tensor *x) {
    const cf_tensor *y = hook_orig->forward(m, x);
    const size_t n = cf_tensor_numel(y);
    for (size_t i = 0; i < n; i += 3) y->data[i] *= 0.75f; /* the BatchNorm must see this */
    return y;
}

/* ---- networks ------------------------------------------------------------------------------- */

typedef struct run_opts {
    bool link, bf16, hook, sync;
    int threads;
} run_opts;

typedef struct net {
    block_net k;
    int links; /* BatchNorms taking the link each training forward at a bf16 level */
    bool unet; /* the body of W1 as a U-Net's encoder (k's c, h, w) */
    bool bias; /* a Sequential conv(bias) - BN - ReLU - conv - BN (k's c, h, w, o) */
    bool stem; /* W1's gray stem: its BatchNorm takes the direct stem's sums, fp32 or bf16, where
                  the level has the direct stem's kernels (cf_conv_stem_pays) */
} net;

static cf_module *net_build(const net *t) {
    if (t->bias) {
        const block_net *k = &t->k;
        cf_module *m[] = {cf_conv2d(k->c, k->o, 3, 1, 1, true), cf_batchnorm2d(k->o), cf_relu(),
                          cf_conv2d(k->o, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o)};
        return cf_sequential(5, m);
    }
    return t->unet ? cf_dynamic_unet(cf_mini_resnet_body(t->k.c), t->k.c, 3, t->k.h, t->k.w, NULL)
                   : block_net_build(&t->k);
}

/* The first Conv2d under m right before a BatchNorm (the hook's target). */
static cf_module *first_conv(cf_module *m) {
    if (cf_nn_is_sequential(m))
        for (int i = 0; i + 1 < m->n_children; i++)
            if (cf_nn_is_conv(m->children[i]) && cf_nn_is_batchnorm(m->children[i + 1]))
                return m->children[i];
    for (int i = 0; i < m->n_children; i++) {
        cf_module *c = first_conv(m->children[i]);
        if (c) return c;
    }
    return NULL;
}

/* STEPS training steps (forward, backward, w -= 0.05 grad) and an eval forward; each training
 * forward must take `expect` links (one fewer once the hook is on, none in eval). */
static record run_case(const net *t, run_opts o, int expect) {
    const block_net *k = &t->k;
    cf_set_num_threads(o.threads);
    cf__nn_set_stats_link(o.link);
    cf_model *model = block_model(net_build(t), 21, o.bf16, o.sync);
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    record r = {0};
    cf_module *hooked = NULL;
    for (int step = 0; step <= STEPS; step++) {
        const bool training = step < STEPS;
        step_start(model, x, nx, 100 + (uint64_t)step, training);
        if (o.hook && step == 1) { /* a linked Conv2d hooked after the plan */
            /* in the first residual block: a linked one (W1's stem conv is not bf16) */
            hooked = first_conv(first_block(model->root));
            assert_non_null(hooked);
            wrap_ops(hooked, &hook_orig, &hook_ops);
            hook_ops.forward = hook_forward;
        }
        cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        const int got = count_modules(model->root, cf_nn_bn_took_stats);
        /* the hooked conv (a bf16 one) had its link where the level computes in bf16 */
        const bool hook_linked = hooked && o.bf16 && !o.sync && cf_bf16_compute();
        const int want = !training || !o.link ? 0 : hook_linked && expect ? expect - 1 : expect;
        if (got != want)
            fail_msg("%s (link %d, bf16 %d, hook %d, sync %d, %d threads) step %d: %d BatchNorms "
                     "took the linked sums, expected %d",
                     k->name, o.link, o.bf16, o.hook, o.sync, o.threads, step, got, want);
        const size_t ny = cf_tensor_numel(y);
        put(&r, y->data, ny);
        if (!training) break;
        record_backward_step(&r, model, y, nx, step);
    }
    if (hooked) hooked->ops = hook_orig;
    free(x);
    cf_model_free(model);
    cf__nn_set_stats_link(true);
    cf_set_num_threads(1);
    return r;
}

/* Whether the level takes W1's 1 -> 16 stem on 28 x 28 through the direct stem. */
static bool stem_direct(void) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, 1, 28, 28, 3, 3, 1, 1, 1, 1));
    return cf_conv_stem_pays(&g, 16) && !cf_kernels_reference();
}

static void check_case(const net *t, run_opts o) {
    const int links = (o.bf16 && !o.sync && cf_bf16_compute() ? t->links : 0) +
                      (t->stem && !o.sync && stem_direct() ? 1 : 0);
    o.link = true;
    record a = run_case(t, o, links);
    o.link = false;
    record b = run_case(t, o, 0);
    char name[160];
    snprintf(name, sizeof name, "%s (bf16 %d, hook %d, sync %d, %d threads)", t->k.name, o.bf16,
             o.hook, o.sync, o.threads);
    records_equal(a, b, name, "linked", "not");
}

static const net cases[] = {
    /* convpath.0 and its paired shortcut, convpath.3 */
    {{"W1's first block", BNET_BLOCK, 7, 16, 28, 28, 32, 1}, 3, false, false, false},
    /* both blocks' (the stem conv, 1 -> 16, is not a bf16 one: its BatchNorm's link is the
     * direct stem's) */
    {{"W1", BNET_W1, 7, 1, 28, 28, 0, 2}, 6, false, false, true},
    /* the convpath's two (16 outputs: run_images' path); the 1x1 stride-1 idpath is no bf16 one */
    {{"a stride-1 block 16ch 14x14", BNET_BLOCK_S1, 5, 16, 14, 14, 16, 1}, 2, false, false, false},
    /* the convpath's two (8 channels of 48 x 48); the stem (3 -> 8) is no bf16 one */
    {{"a block with a BatchNorm idpath 8ch 48x48", BNET_BLOCK_BN_ID, 3, 3, 48, 48, 8, 1},
     2,
     false,
     false,
     false},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static void test_linked_equals_unlinked(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++)
        for (int t = 1; t <= 3; t++) check_case(&cases[i], (run_opts){.bf16 = true, .threads = t});
}

/* Not taken: a biased convolution, fp32 convolutions, synchronised statistics, and a BatchNorm
 * behind a Conv2d hooked after the plan (whose hook changes the output the BatchNorm must
 * normalise). */
static void test_not_taken(void **state) {
    (void)state;
    /* a biased convolution (its bias is added after the call): the second conv's link only */
    const net bias = {
        {"conv(bias)-BN-ReLU-conv-BN 16 -> 32ch 14x14", BNET_BLOCK, 5, 16, 14, 14, 32, 0},
        1,
        false,
        true,
        false};
    for (int t = 1; t <= 3; t++) check_case(&bias, (run_opts){.bf16 = true, .threads = t});
    check_case(&cases[0], (run_opts){.bf16 = false, .threads = 1});
    check_case(&cases[1], (run_opts){.bf16 = true, .sync = true, .threads = 2});
    check_case(&cases[0], (run_opts){.bf16 = true, .hook = true, .threads = 1});
    check_case(&cases[1], (run_opts){.bf16 = true, .hook = true, .threads = 3});
}

/* A frozen BatchNorm (eval while the Conv2d before it trains: it keeps its running statistics)
 * never takes the sums, so the convolution must not compute them either. */
static void test_frozen_bn(void **state) {
    (void)state;
    if (!cf_bf16_compute()) skip();
    cf_module *mods[] = {cf_conv2d(16, 32, 3, 1, 1, false), cf_batchnorm2d(32)};
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_sequential(2, mods), 1), CF_OK);
    cf_conv_set_bf16(model->root, true);
    const size_t nx = (size_t)8 * 16 * 14 * 14;
    float *x = malloc(nx * sizeof(float));
    fill_uniform(x, nx, 5, -1, 1);
    cf_tensor tx = cf_tensor_view(x, cf_shape4(8, 16, 14, 14));
    const cf_tensor *y;
    for (int step = 0; step < 3; step++) {
        cf_model_train(model, true);
        const bool frozen = step != 1; /* the link is taken when the BatchNorm trains */
        if (frozen) model->root->children[1]->training = false;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        if (cf_nn_conv_wrote_stats(model->root->children[0]) == frozen ||
            cf_nn_bn_took_stats(model->root->children[1]) == frozen)
            fail_msg("step %d (BatchNorm %s): the Conv2d wrote the sums %d, the BatchNorm took "
                     "them %d",
                     step, frozen ? "frozen" : "training",
                     cf_nn_conv_wrote_stats(model->root->children[0]),
                     cf_nn_bn_took_stats(model->root->children[1]));
    }
    free(x);
    cf_model_free(model);
}

/* W1's body as a U-Net's encoder: the blocks' links as in W1 (the U-Net keeps outputs as skips
 * but never changes them), bitwise the unlinked run. */
static void test_unet(void **state) {
    (void)state;
    const net unet = {{"U-Net on W1's body", BNET_W1, 3, 1, 28, 28, 0, 2}, 6, true, false, true};
    check_case(&unet, (run_opts){.bf16 = true, .threads = 1});
    check_case(&unet, (run_opts){.bf16 = true, .threads = 2});
}

int main(void) {
    printf("level %s, bf16 compute %d\n", cf_isa_name(cf_isa_active()), cf_bf16_compute());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_epilogue),  cmocka_unit_test(test_linked_equals_unlinked),
        cmocka_unit_test(test_not_taken), cmocka_unit_test(test_unet),
        cmocka_unit_test(test_frozen_bn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
