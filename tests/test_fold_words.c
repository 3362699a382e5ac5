/* The forward link from one residual block's fold to the next block's stride-2 pair
 * (cf_nn_bn_fold_feed_conv): the first block's idpath's last BatchNorm, which writes
 * relu(convpath + bn(.)) and the ReLU's mask bits, writes the second block's convpath's first
 * conv its bf16 input words (the rounding that conv's own deal pass would make) and the mask
 * bits in place of its fp32 output; that conv computes the second block's 1x1 stride-2 shortcut
 * from the same words, and the first block's backward reads the mask alone.
 *
 * Each case runs STEPS training steps and an eval forward twice from the same seed, linked and
 * with the fold's link off (cf__nn_set_fold_words_link(false)): every output, input gradient,
 * gradient, buffer and updated weight must be memcmp-equal, at 1, 2 and 3 threads, on W1's two
 * blocks alone (16 -> 32 -> 64 channels, 28 -> 14 -> 7) and on W1 itself (the stem BatchNorm's
 * link into the first block on in both runs). At a level with bf16 kernels the linked run's fold
 * must have written the words and the pair read them every training step (none in the other run);
 * at one without (tests/fold_words.cmake caps CF_ISA at each level) the link stays off: the test
 * says so and still checks the two runs agree. With the mask bits off (cf__nn_set_res_mask_bits)
 * the fold declines (it writes fp32, the block's mask pass reads it). A backward that cannot arm
 * the mask after a linked forward (a wrapper installed in between) fails rather than read the
 * unwritten output. Against PyTorch
 * (tests/oracle/fold_words.py, the two blocks in fp32 from the same weights, x and dy) the output
 * and the input gradient are within bf16 tolerance. Without the words the linked pair reads
 * bf16_x unwritten, and the equality checks fail. */
#include "block_nets.h"
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"

#define STEPS 3
#define N 6

static const block_net two_blocks = {"two blocks", BNET_BLOCK, N, 16, 28, 28, 32, 2};
static const block_net w1 = {"W1", BNET_W1, N, 1, 28, 28, 16, 2};

/* Sequential(block 16 -> 32, block 32 -> 64), W1's blocks 0.3 and 0.4. */
static cf_module *build(const block_net *k) {
    if (k->kind == BNET_W1) return block_net_build(k);
    block_net b2 = *k;
    b2.c = k->o, b2.o = 2 * k->o;
    cf_module *m[] = {block_net_build(k), block_net_build(&b2)};
    return cf_sequential(2, m);
}

/* The Sequential holding the two blocks, and its first block's index there. */
static cf_module *blocks_of(cf_model *model, int *at) {
    cf_module *seq = model->root;
    if (!cf_nn_is_residual(seq->children[0])) seq = seq->children[0]; /* W1's body */
    for (*at = 0; *at + 1 < seq->n_children; (*at)++)
        if (cf_nn_is_residual(seq->children[*at])) break;
    return seq;
}

static cf_module *fold_of(cf_model *model) {
    int at;
    cf_module *seq = blocks_of(model, &at);
    return seq->children[at]->children[1]->children[1];
}

static cf_module *pair_of(cf_model *model) {
    int at;
    cf_module *seq = blocks_of(model, &at);
    return seq->children[at + 1]->children[0]->children[0];
}

/* One run; *wrote and *read: the training forwards whose fold wrote the words and whose pair read
 * them. */
static record run_case(const block_net *k, bool link, bool bits, int threads, int *wrote,
                       int *read) {
    cf_set_num_threads(threads);
    cf__nn_set_fold_words_link(link);
    cf__nn_set_res_mask_bits(bits);
    cf_model *model = block_model(build(k), 33, true, false);
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    assert_non_null(x);
    record r = {0};
    *wrote = *read = 0;
    for (int step = 0; step <= STEPS; step++) {
        const bool training = step < STEPS;
        step_start(model, x, nx, 300 + (uint64_t)step, training);
        cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        if (cf_nn_bn_wrote_words(fold_of(model))) (*wrote)++;
        if (cf_nn_conv_read_words(pair_of(model))) (*read)++;
        put(&r, y->data, cf_tensor_numel(y));
        if (!training) break;
        record_backward_step(&r, model, y, nx, step);
    }
    free(x);
    cf_model_free(model);
    cf__nn_set_fold_words_link(true);
    cf__nn_set_res_mask_bits(true);
    cf_set_num_threads(1);
    return r;
}

static void check(const block_net *k, bool bits, int threads) {
    int wrote_on, read_on, wrote_off, read_off;
    record a = run_case(k, true, bits, threads, &wrote_on, &read_on);
    record b = run_case(k, false, bits, threads, &wrote_off, &read_off);
    const int want = cf_bf16_compute() && bits ? STEPS : 0;
    if (wrote_on != want || read_on != want)
        fail_msg("%s, %d threads: the fold wrote the words %d times and the pair read them %d "
                 "times in %d training steps, expected %d",
                 k->name, threads, wrote_on, read_on, STEPS, want);
    assert_int_equal(wrote_off, 0);
    /* with the fold's link off, the pair reads fp32 (W1's stem link is into the first block) */
    assert_int_equal(read_off, 0);
    char what[96];
    snprintf(what, sizeof what, "%s%s (%d threads)", k->name, bits ? "" : ", mask bits off",
             threads);
    records_equal(a, b, what, "linked", "fold link off");
}

static void skip_note(void) {
    if (!cf_bf16_compute())
        printf("[  SKIPPED ] fold_words: no bf16 kernels at this level (the link is off); only "
               "the fp32 runs' agreement is checked\n");
}

static void test_two_blocks(void **state) {
    (void)state;
    skip_note();
    for (int t = 1; t <= 3; t++) check(&two_blocks, true, t);
}

static void test_w1(void **state) {
    (void)state;
    skip_note();
    for (int t = 1; t <= 2; t++) check(&w1, true, t);
}

static void test_no_mask_bits_declines(void **state) {
    (void)state;
    check(&two_blocks, false, 1);
}

/* A wrapper installed on block 0.3's convpath's last BatchNorm between a linked forward and its
 * backward: the block cannot arm the mask bits there, and its output was never written, so the
 * backward fails with an error (at a level without bf16 kernels nothing was linked: it runs), on
 * the two blocks alone and inside W1 (where the stem's ReLU runs after the block's backward: the
 * pass must run to its end, not stop with a NULL gradient). */
static cf_module_ops wrapped_ops;

static void backward_without_mask(const block_net *k) {
    cf_model *model = block_model(build(k), 33, true, false);
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    assert_non_null(x);
    fill_uniform(x, nx, 300, -2, 2);
    cf_model_train(model, true);
    cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    const bool linked = cf_nn_bn_wrote_words(fold_of(model));
    assert_int_equal(linked, cf_bf16_compute());
    int at;
    cf_module *ta = blocks_of(model, &at)->children[at]->children[0]->children[4];
    assert_true(cf_nn_is_batchnorm(ta));
    const cf_module_ops *own;
    wrap_ops(ta, &own, &wrapped_ops);
    const size_t ny = cf_tensor_numel(y);
    float *dy = malloc(ny * sizeof(float));
    assert_non_null(dy);
    fill_uniform(dy, ny, 400, -1, 1);
    cf_tensor tdy = cf_tensor_view(dy, y->shape);
    const cf_status st = cf_model_backward(model, &tdy);
    if (linked) {
        assert_int_not_equal(st, CF_OK);
        assert_non_null(strstr(cf_last_error(), "mask"));
    } else {
        assert_int_equal(st, CF_OK);
    }
    ta->ops = own;
    free(x), free(dy);
    cf_model_free(model);
}

static void test_backward_without_mask_fails(void **state) {
    (void)state;
    backward_without_mask(&two_blocks);
    backward_without_mask(&w1);
}

/* A first block whose backward can never take the mask bits (its convpath ends in a Conv2d, not
 * a BatchNorm; or its convpath's last BatchNorm wrapped before the first forward): the fold keeps
 * writing its fp32 output, and training runs as with the link off. */
static void test_unmaskable_block_declines(void **state) {
    (void)state;
    for (int kind = 0; kind < 2; kind++) {
        record r[2];
        for (int link = 0; link <= 1; link++) {
            cf__nn_set_fold_words_link(link);
            cf_module *cp[] = {cf_conv2d(16, 32, 3, 2, 1, false), cf_batchnorm2d(32), cf_relu(),
                               cf_conv2d(32, 32, 3, 1, 1, false), cf_batchnorm2d(32)};
            cf_module *ip[] = {cf_conv2d(16, 32, 1, 2, 0, false), cf_batchnorm2d(32)};
            block_net b2 = two_blocks;
            b2.c = 32, b2.o = 64;
            if (kind == 0) cf_module_free(cp[4]);
            cf_module *blocks[] = {
                cf_residual(cf_sequential(kind == 0 ? 4 : 5, cp), cf_sequential(2, ip), true),
                block_net_build(&b2)};
            cf_model *model = block_model(cf_sequential(2, blocks), 33, true, false);
            cf_module *ta = model->root->children[0]->children[0]->children[3 + kind];
            const cf_module_ops *own = ta->ops;
            wrapped_ops = *own;
            if (kind == 1) ta->ops = &wrapped_ops;
            const size_t nx = (size_t)N * 16 * 28 * 28;
            float *x = malloc(nx * sizeof(float));
            assert_non_null(x);
            r[link] = (record){0};
            for (int step = 0; step < STEPS; step++) {
                step_start(model, x, nx, 300 + (uint64_t)step, true);
                cf_tensor tx = cf_tensor_view(x, cf_shape4(N, 16, 28, 28));
                const cf_tensor *y;
                assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
                assert_false(
                    cf_nn_bn_wrote_words(model->root->children[0]->children[1]->children[1]));
                put(&r[link], y->data, cf_tensor_numel(y));
                record_backward_step(&r[link], model, y, nx, step);
            }
            ta->ops = own;
            free(x);
            cf_model_free(model);
        }
        cf__nn_set_fold_words_link(true);
        records_equal(r[1], r[0],
                      kind == 0 ? "a convpath ending in a Conv2d"
                                : "a convpath whose last BatchNorm is wrapped",
                      "linked", "fold link off");
    }
}

/* PyTorch (tests/oracle/fold_words.py): the two blocks in fp32 from the same weights, x and dy,
 * one training step at 2 threads; y and dx to bf16 tolerance (fp32's at a level without). */
static void test_oracle(void **state) {
    (void)state;
    cf_set_num_threads(2);
    cf_model *model = block_model(build(&two_blocks), 33, true, false);
    oracle o;
    oracle_init(&o);
    /* per block: ca, bna, cb, bnb (convpath), cs, bns (idpath); BatchNorms away from 1 and 0 */
    const char *names[] = {"ca", "bna", "cb", "bnb", "cs", "bns"};
    for (int b = 0; b < 2; b++) {
        cf_module *blk = model->root->children[b], *cp = blk->children[0], *ip = blk->children[1];
        cf_module *mods[] = {cp->children[0], cp->children[1], cp->children[3],
                             cp->children[4], ip->children[0], ip->children[1]};
        for (int i = 0; i < 6; i++) {
            char name[16];
            if (cf_nn_is_batchnorm(mods[i])) {
                cf_param *w = &mods[i]->params[0], *bi = &mods[i]->params[1];
                fill_uniform(w->data, w->numel, 50 + (uint64_t)(b * 8 + i), 0.5f, 1.5f);
                fill_uniform(bi->data, bi->numel, 70 + (uint64_t)(b * 8 + i), -0.5f, 0.5f);
                snprintf(name, sizeof name, "%s%d_w", names[i], b);
                oracle_put(&o, name, w->data, w->shape);
                snprintf(name, sizeof name, "%s%d_b", names[i], b);
                oracle_put(&o, name, bi->data, bi->shape);
            } else {
                snprintf(name, sizeof name, "%s%d", names[i], b);
                oracle_put(&o, name, mods[i]->params[0].data, mods[i]->params[0].shape);
            }
        }
    }
    const size_t nx = (size_t)N * 16 * 28 * 28;
    float *x = malloc(nx * sizeof(float));
    assert_non_null(x);
    step_start(model, x, nx, 300, true);
    cf_tensor tx = cf_tensor_view(x, cf_shape4(N, 16, 28, 28));
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    assert_int_equal(cf_nn_conv_read_words(pair_of(model)), cf_bf16_compute());
    const size_t ny = cf_tensor_numel(y);
    float *dy = malloc(ny * sizeof(float)), *yc = malloc(ny * sizeof(float));
    assert_non_null(dy), assert_non_null(yc);
    memcpy(yc, y->data, ny * sizeof(float));
    fill_uniform(dy, ny, 400, -1, 1);
    cf_tensor tdy = cf_tensor_view(dy, y->shape);
    const cf_tensor *dx = model->root->ops->backward(model->root, &tdy, true);
    assert_non_null(dx);
    oracle_put(&o, "x", x, tx.shape);
    oracle_put(&o, "dy", dy, tdy.shape);
    oracle_run(&o, "fold_words.py", "");
    cf_tensor ry = oracle_get(&o, "y"), rdx = oracle_get(&o, "dx");
    assert_int_equal(cf_tensor_numel(&ry), ny);
    assert_int_equal(cf_tensor_numel(&rdx), nx);
    const double tol = cf_bf16_compute() ? 3e-2 : 1e-4;
    assert_close("y", yc, ry.data, ny, tol, tol);
    /* dx by the norm of its error: bf16 operands through four convolutions and the BatchNorms'
     * backward on 7 x 7 planes (about 0.09 here, linked or not: the runs are bitwise equal) */
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < nx; i++) {
        const double d = (double)dx->data[i] - rdx.data[i];
        e2 += d * d, r2 += (double)rdx.data[i] * rdx.data[i];
    }
    const double rel = sqrt(e2 / r2);
    printf("dx: relative error %.3g of its norm\n", rel);
    assert_true(rel < (cf_bf16_compute() ? 0.15 : 1e-5));
    free(ry.data), free(rdx.data);
    oracle_cleanup(&o);
    free(x), free(dy), free(yc);
    cf_model_free(model);
    cf_set_num_threads(1);
}

/* cf_bn_planes_fold_mask_bf16 is cf_bn_planes_fold_mask then cf_fp32_to_bf16, with the same
 * mask bits (memcmp), with and without x2, on planes shorter and longer than the fallback's chunk
 * and not a multiple of 16, x with the bf16 rounding's special cases (at every level: the
 * fallback where the level has no kernel). */
static void test_kernel(void **state) {
    (void)state;
    const int64_t sizes[] = {49, 196, 2500};
    const int nc = 3;
    for (int si = 0; si < 3; si++)
        for (int with_x2 = 0; with_x2 < 2; with_x2++) {
            const int64_t s = sizes[si];
            const size_t n = (size_t)nc * (size_t)s, nw = (size_t)nc * CF_MASK_WORDS((size_t)s);
            float *x = malloc(n * sizeof(float)), *other = malloc(n * sizeof(float)),
                  *y = malloc(n * sizeof(float)), ss[4 * 3];
            uint16_t *want = malloc(n * 2), *got = malloc(n * 2), *mw = calloc(nw, 2),
                     *mg = calloc(nw, 2);
            assert_true(x && other && y && want && got && mw && mg);
            fill_bf16_specials(x, n, 11 + (uint64_t)si);
            fill_uniform(other, n, 12 + (uint64_t)si, -3, 3);
            fill_uniform(ss, 12, 13, -1.5f, 1.5f);
            const float *add = with_x2 ? NULL : other, *x2 = with_x2 ? other : NULL;
            cf_bn_planes_fold_mask(x, add, x2, y, s, nc, ss, ss + 3, ss + 6, ss + 9, mw, 0);
            cf_fp32_to_bf16(y, want, n);
            cf_bn_planes_fold_mask_bf16(x, add, x2, got, s, nc, ss, ss + 3, ss + 6, ss + 9, mg,
                                        (ptrdiff_t)s);
            if (memcmp(want, got, n * 2) != 0 || memcmp(mw, mg, nw * 2) != 0)
                fail_msg("fold_mask_bf16, s %lld, x2 %d: not fold_mask's rounded words and bits",
                         (long long)s, with_x2);
            free(x), free(other), free(y), free(want), free(got), free(mw), free(mg);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_two_blocks),
        cmocka_unit_test(test_w1),
        cmocka_unit_test(test_no_mask_bits_declines),
        cmocka_unit_test(test_backward_without_mask_fails),
        cmocka_unit_test(test_unmaskable_block_declines),
        cmocka_unit_test(test_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
