/* BatchNorm's fused passes (src/nn/nn_internal.h, src/nn/batchnorm.c): a residual block's
 * convpath's last BatchNorm leaves its output to the block's fold (the idpath's last BatchNorm,
 * which writes relu(a + bn(.))), which computes a in registers from that layer's input, scale and
 * shift (cf_bn_planes_affine_add2); and a BatchNorm linked to the next bf16 convolution rounds its
 * words in registers (cf_bn_planes_affine_bf16). Both must stay bitwise what the separate passes
 * compute.
 *
 * The kernels against the passes they replace (cf_bn_planes_affine into a buffer, then
 * cf_fp32_to_bf16 or cf_bn_planes_affine with that buffer as add) on special values (NaN,
 * infinities, subnormals, -0, values that round to even) and planes of 1 to 4100 values. The
 * networks (W1's first block, W1, a block without a paired shortcut, a block whose idpath is a
 * lone BatchNorm, 48 x 48 planes) run training steps then an eval forward with the passes
 * (cf__nn_set_bn_fused_passes(true), the default) and without: every output, input gradient,
 * gradient, buffer and weight equal (memcmp), in fp32 and bf16, on 1 and 2 threads, with
 * synchronised statistics; the deferral taken once per block and forward (cf_nn_bn_deferred),
 * not with a hook on the convpath's last BatchNorm (which must see its real output), not when the
 * convpath runs outside its block, and a fold given another add writes the deferred output
 * first. tests/bn_fused_passes.cmake runs this under every CF_ISA cap and over the amx tile
 * emulation. */
#include "block_nets.h"
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"

#define STEPS 3

/* ---- the kernels ---------------------------------------------------------------------------- */

static void fill_case(float *x, size_t n, uint64_t seed) {
    fill_bf16_specials(x, n, seed);
    /* and plain values of both signs, most of them */
    for (size_t i = 0; i < n; i += 3) x[i] = (float)((double)(i % 97) / 13.0 - 3.5);
}

static void check_affine_bf16(int64_t s, int nc, bool relu, bool ahead) {
    const size_t n = (size_t)s * nc, tot = ahead ? 2 * n : n;
    float *x = malloc(tot * sizeof(float)), *y = malloc(tot * sizeof(float));
    uint16_t *w1 = malloc(tot * sizeof(uint16_t)), *w2 = malloc(tot * sizeof(uint16_t));
    float scale[8], shift[8];
    fill_case(x, tot, (uint64_t)(s * 31 + nc));
    for (int i = 0; i < nc; i++) {
        scale[i] = i == 1 ? 3e-39f : (float)(0.37 + 0.61 * i) * (i % 2 ? -1.0f : 1.0f);
        shift[i] = i == 1 ? 1e-39f : (float)(0.11 * i - 0.2);
    }
    cf_bn_planes_affine(x, NULL, y, s, nc, scale, shift, relu, 0);
    cf_fp32_to_bf16(y, w1, n);
    memset(w2, 0xa5, tot * sizeof(uint16_t));
    cf_bn_planes_affine_bf16(x, w2, s, nc, scale, shift, relu, ahead ? (ptrdiff_t)n : 0);
    if (memcmp(w1, w2, n * sizeof(uint16_t)) != 0) {
        for (size_t i = 0; i < n; i++)
            if (w1[i] != w2[i])
                fail_msg("affine_bf16 s %lld nc %d relu %d: word %zu is %04x, expected %04x "
                         "(x %g)",
                         (long long)s, nc, relu, i, w2[i], w1[i], (double)x[i]);
    }
    if (ahead) /* nothing written past the planes */
        for (size_t i = n; i < tot; i++) assert_int_equal(w2[i], 0xa5a5);
    free(x), free(y), free(w1), free(w2);
}

static void check_affine_add2(int64_t s, int nc, bool ahead) {
    const size_t n = (size_t)s * nc, tot = ahead ? 2 * n : n;
    float *x = malloc(tot * sizeof(float)), *x2 = malloc(tot * sizeof(float));
    float *a = malloc(n * sizeof(float)), *y1 = malloc(n * sizeof(float));
    float *y2 = malloc(tot * sizeof(float));
    float scale[8], shift[8], scale2[8], shift2[8];
    fill_case(x, tot, (uint64_t)(s * 7 + nc));
    fill_case(x2, tot, (uint64_t)(s * 11 + nc + 5));
    for (int i = 0; i < nc; i++) {
        scale[i] = (float)(0.9 - 0.3 * i);
        shift[i] = (float)(0.05 * i - 0.1);
        scale2[i] = i == 2 ? 3e-39f : (float)(-0.7 + 0.45 * i);
        shift2[i] = (float)(0.3 - 0.07 * i);
    }
    /* the passes it replaces: a = bn_a(x2) written, then max(a + bn(x), 0) */
    cf_bn_planes_affine(x2, NULL, a, s, nc, scale2, shift2, false, 0);
    cf_bn_planes_affine(x, a, y1, s, nc, scale, shift, false, 0);
    for (size_t i = 0; i < tot; i++) y2[i] = 1234.5f;
    cf_bn_planes_affine_add2(x, x2, y2, s, nc, scale, shift, scale2, shift2,
                             ahead ? (ptrdiff_t)n : 0);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&y1[i], &y2[i], sizeof(float)) != 0)
            fail_msg("affine_add2 s %lld nc %d: value %zu is %.9g, expected %.9g (x %g, x2 %g)",
                     (long long)s, nc, i, (double)y2[i], (double)y1[i], (double)x[i],
                     (double)x2[i]);
    for (size_t i = n; i < tot; i++) assert_true(y2[i] == 1234.5f);
    free(x), free(x2), free(a), free(y1), free(y2);
}

static void test_kernels(void **state) {
    (void)state;
    static const int64_t sizes[] = {1,   2,   7,   15,   16,   17,   31,  49,
                                    196, 511, 784, 2047, 2048, 2049, 4100};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int nc = 1; nc <= 5; nc += 2)
            for (int ahead = 0; ahead < 2; ahead++) {
                check_affine_bf16(sizes[k], nc, false, ahead);
                check_affine_bf16(sizes[k], nc, true, ahead);
                check_affine_add2(sizes[k], nc, ahead);
            }
}

/* ---- a hook on BatchNorm: a copy of its ops whose forward records the output it returns ----- */

static const cf_module_ops *hook_orig;
static cf_module_ops hook_ops;
static float *hook_seen;
static size_t hook_n, hook_cap;

static const cf_tensor *hook_forward(cf_module *m, const cf_tensor *x) {
    const cf_tensor *y = hook_orig->forward(m, x);
    const size_t n = cf_tensor_numel(y);
    if (hook_n + n > hook_cap) {
        hook_cap = 2 * (hook_n + n);
        hook_seen = realloc(hook_seen, hook_cap * sizeof(float));
        assert_non_null(hook_seen);
    }
    memcpy(hook_seen + hook_n, y->data, n * sizeof(float));
    hook_n += n;
    return y;
}

/* ---- networks ------------------------------------------------------------------------------- */

typedef struct run_opts {
    bool fused, bf16, hook, sync;
    int threads;
} run_opts;

/* STEPS training steps (forward, backward, w -= 0.05 grad) and an eval forward; each forward must
 * defer `expect` outputs (none once the hook is on). */
static record run_case(const block_net *k, run_opts o, int expect) {
    cf_set_num_threads(o.threads);
    cf__nn_set_bn_fused_passes(o.fused);
    cf_model *model = block_model(block_net_build(k), 21, o.bf16, o.sync);
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    record r = {0};
    hook_n = 0;
    cf_module *hooked = NULL;
    for (int step = 0; step <= STEPS; step++) {
        const bool training = step < STEPS;
        step_start(model, x, nx, 100 + (uint64_t)step, training);
        if (o.hook && step == 1) { /* the first block's convpath's last BatchNorm, after the plan */
            cf_module *cp = first_block(model->root)->children[0];
            hooked = cp->children[cp->n_children - 1];
            wrap_ops(hooked, &hook_orig, &hook_ops);
            hook_ops.forward = hook_forward;
        }
        cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        const int got = count_modules(model->root, cf_nn_bn_deferred);
        const int want = !o.fused ? 0 : hooked ? expect - 1 : expect;
        if (got != want)
            fail_msg("%s (fused %d, bf16 %d, hook %d, %d threads) step %d: %d outputs deferred, "
                     "expected %d",
                     k->name, o.fused, o.bf16, o.hook, o.threads, step, got, want);
        const size_t ny = cf_tensor_numel(y);
        put(&r, y->data, ny);
        if (!training) break;
        record_backward_step(&r, model, y, nx, step);
    }
    if (hooked) {
        put(&r, hook_seen, hook_n); /* what the hook saw: the layer's real outputs */
        hooked->ops = hook_orig;
    }
    free(x);
    cf_model_free(model);
    cf__nn_set_bn_fused_passes(true);
    cf_set_num_threads(1);
    return r;
}

static void check_case(const block_net *k, run_opts o) {
    o.fused = true;
    record a = run_case(k, o, k->blocks);
    o.fused = false;
    record b = run_case(k, o, 0);
    char name[160];
    snprintf(name, sizeof name, "%s (bf16 %d, hook %d, sync %d, %d threads)", k->name, o.bf16,
             o.hook, o.sync, o.threads);
    records_equal(a, b, name, "fused", "not");
}

static const block_net cases[] = {
    {"W1's first block", BNET_BLOCK, 6, 16, 28, 28, 32, 1},
    {"W1", BNET_W1, 4, 1, 28, 28, 0, 2},
    {"a stride-1 block 16ch 14x14", BNET_BLOCK_S1, 5, 16, 14, 14, 16, 1},
    {"a block with a BatchNorm idpath 8ch 48x48", BNET_BLOCK_BN_ID, 2, 3, 48, 48, 8, 1},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static void test_fused_equals_separate(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int t = 1; t <= 2; t++)
                check_case(&cases[i], (run_opts){.bf16 = bf16, .threads = t});
}

static void test_fused_sync(void **state) {
    (void)state;
    check_case(&cases[0], (run_opts){.bf16 = true, .sync = true, .threads = 1});
    check_case(&cases[1], (run_opts){.bf16 = true, .sync = true, .threads = 2});
    check_case(&cases[3], (run_opts){.sync = true, .threads = 2});
}

/* A hook on the convpath's last BatchNorm installed after the plan must see its real output. */
static void test_hooked(void **state) {
    (void)state;
    check_case(&cases[0], (run_opts){.bf16 = true, .hook = true, .threads = 1});
    check_case(&cases[1], (run_opts){.hook = true, .threads = 2});
}

/* The convpath run outside its block writes its last BatchNorm's output; a fold given another
 * add than the deferred output writes that output first. */
static void test_outside_the_block(void **state) {
    (void)state;
    const block_net *k = &cases[0];
    cf_model *model;
    assert_int_equal(cf_model_new(&model, block_net_build(k), 21), CF_OK);
    cf_model_train(model, false); /* eval: the statistics stay as they are between the calls */
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    fill_uniform(x, nx, 3, -2, 2);
    cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
    const cf_tensor *y;
    cf__nn_set_bn_fused_passes(false);
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    cf__nn_set_bn_fused_passes(true);
    cf_module *block = model->root, *cp = block->children[0], *ip = block->children[1];
    cf_module *last = cp->children[cp->n_children - 1], *fold = ip->children[1];
    const size_t na = cf_tensor_numel(&last->out), ny = cf_tensor_numel(y);
    float *a_ref = malloc(na * sizeof(float)), *y_ref = malloc(ny * sizeof(float));
    memcpy(a_ref, last->out.data, na * sizeof(float));
    memcpy(y_ref, y->data, ny * sizeof(float));
    /* the block deferred: the same output; then the convpath alone writes its last output */
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    assert_true(cf_nn_bn_deferred(last));
    assert_memory_equal(y->data, y_ref, ny * sizeof(float));
    for (size_t i = 0; i < na; i++) last->out.data[i] = NAN;
    cp->in = &tx;
    const cf_tensor *a = cp->ops->forward(cp, &tx);
    assert_false(cf_nn_bn_deferred(last));
    assert_memory_equal(a->data, a_ref, na * sizeof(float));
    /* armed, deferred, then a fold whose add is another buffer: the output written first */
    for (size_t i = 0; i < na; i++) last->out.data[i] = NAN;
    cf_nn_bn_fold_arm(fold);
    a = last->ops->forward(last, last->in);
    assert_true(cf_nn_bn_deferred(last));
    assert_true(isnan(a->data[0]));
    float *other = malloc(na * sizeof(float));
    memcpy(other, a_ref, na * sizeof(float));
    const cf_tensor *out = cf_nn_bn_forward_add_relu(fold, fold->in, other);
    assert_memory_equal(last->out.data, a_ref, na * sizeof(float));
    assert_memory_equal(out->data, y_ref, ny * sizeof(float));
    free(x), free(a_ref), free(y_ref), free(other);
    cf_model_free(model);
}

int main(void) {
    printf("level %s, bf16 compute %d\n", cf_isa_name(cf_isa_active()), cf_bf16_compute());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels),           cmocka_unit_test(test_fused_equals_separate),
        cmocka_unit_test(test_fused_sync),        cmocka_unit_test(test_hooked),
        cmocka_unit_test(test_outside_the_block),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(hook_seen);
    return rc;
}
