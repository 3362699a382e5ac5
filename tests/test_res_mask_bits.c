/* A residual block's ReLU mask kept as bits (src/nn/nn_internal.h, src/nn/residual.c,
 * src/nn/batchnorm.c): the fold writes y > 0 as one bit a value beside the block's output
 * (cf_bn_planes_fold_mask), and both paths' last BatchNorms apply the bits to the block's
 * gradient in their sums and dx passes (cf_bn_planes_dy_sums_mask, cf_bn_planes_dx_mask,
 * cf_bn_planes_dx_bf16_mask), so that the masked gradient is never written. Bitwise what the
 * block's mask pass (dz = y > 0 ? dy : 0) and the unmasked kernels give.
 *
 * The kernels against the passes they replace on special values (NaN, infinities, subnormals,
 * -0) and planes of 1 to 4100 values: the fold's output and its bits (the bits past each plane
 * zero, nothing written past the planes), and the gradient kernels against the unmasked ones
 * given dz. The networks (W1's first block, W1, a stride-1 block, a block whose idpath is a lone
 * BatchNorm, 7 x 7 and 48 x 48 planes) run training steps and an eval forward with the bits
 * (cf__nn_set_res_mask_bits(true), the default) and without: every output, input gradient,
 * gradient, buffer and weight equal (memcmp), in fp32 and bf16, on 1 and 2 threads, with
 * synchronised statistics, the bits written at every training forward; with a hook on a path's
 * last BatchNorm the block masks as before. tests/res_mask_bits.cmake runs this under every
 * CF_ISA cap and over the amx tile emulation. */
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
    for (size_t i = 0; i < n; i += 3) x[i] = (float)((double)((i * 7 + seed) % 97) / 13.0 - 3.5);
}

static bool bit_of(const uint16_t *w, size_t j) {
    return (w[j / 16] >> (j % 16)) & 1u;
}

static void check_kernels(int64_t s, int nc, bool two, bool ahead) {
    const size_t n = (size_t)s * nc, tot = ahead ? 2 * n : n;
    const size_t mw = CF_MASK_WORDS((size_t)s), nw = mw * nc;
    float *x = malloc(tot * sizeof(float)), *x2 = malloc(tot * sizeof(float));
    float *a = malloc(tot * sizeof(float)), *y1 = malloc(n * sizeof(float));
    float *y2 = malloc(tot * sizeof(float)), *dy = malloc(n * sizeof(float));
    float *dz = malloc(n * sizeof(float)), *dx1 = malloc(n * sizeof(float));
    float *dx2 = malloc(tot * sizeof(float));
    uint16_t *mask = malloc((ahead ? 2 * nw : nw) * sizeof(uint16_t));
    uint16_t *h1 = malloc(n * sizeof(uint16_t)), *h2 = malloc(tot * sizeof(uint16_t));
    float scale[8], shift[8], scale2[8], shift2[8], mean[8], k1[8], k2[8], k3[8];
    fill_case(x, tot, (uint64_t)(s * 7 + nc));
    fill_case(x2, tot, (uint64_t)(s * 11 + nc + 5));
    fill_case(a, tot, (uint64_t)(s * 3 + nc + 9));
    fill_case(dy, n, (uint64_t)(s * 5 + nc + 1));
    for (int i = 0; i < nc; i++) {
        scale[i] = (float)(0.9 - 0.3 * i);
        shift[i] = (float)(0.05 * i - 0.1);
        scale2[i] = i == 2 ? 3e-39f : (float)(-0.7 + 0.45 * i);
        shift2[i] = (float)(0.3 - 0.07 * i);
        mean[i] = (float)(0.2 * i - 0.3);
        k1[i] = (float)(1.1 - 0.2 * i);
        k2[i] = (float)(0.03 * i - 0.05);
        k3[i] = (float)(0.01 - 0.02 * i);
    }
    /* the passes the fold replaces, then the block's mask pass */
    if (two) {
        float *t = malloc(n * sizeof(float));
        cf_bn_planes_affine(x2, NULL, t, s, nc, scale2, shift2, false, 0);
        cf_bn_planes_affine(x, t, y1, s, nc, scale, shift, false, 0);
        free(t);
    } else {
        cf_bn_planes_affine(x, a, y1, s, nc, scale, shift, false, 0);
    }
    for (size_t i = 0; i < tot; i++) y2[i] = 1234.5f;
    memset(mask, 0xa5, (ahead ? 2 * nw : nw) * sizeof(uint16_t));
    cf_bn_planes_fold_mask(x, two ? NULL : a, two ? x2 : NULL, y2, s, nc, scale, shift,
                           two ? scale2 : NULL, two ? shift2 : NULL, mask,
                           ahead ? (ptrdiff_t)n : 0);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&y1[i], &y2[i], sizeof(float)) != 0)
            fail_msg("fold_mask s %lld nc %d two %d: value %zu is %.9g, expected %.9g",
                     (long long)s, nc, two, i, (double)y2[i], (double)y1[i]);
    for (size_t i = n; i < tot; i++) assert_true(y2[i] == 1234.5f);
    for (int p = 0; p < nc; p++)
        for (size_t j = 0; j < mw * 16; j++) {
            const bool want = j < (size_t)s && y1[(size_t)p * s + j] > 0.0f;
            if (bit_of(mask + p * mw, j) != want)
                fail_msg("fold_mask s %lld nc %d two %d: plane %d bit %zu is %d (y %g)",
                         (long long)s, nc, two, p, j, !want,
                         j < (size_t)s ? (double)y1[(size_t)p * s + j] : 0.0);
        }
    for (size_t i = nw; i < (ahead ? 2 * nw : nw); i++) assert_int_equal(mask[i], 0xa5a5);
    for (size_t i = 0; i < n; i++) dz[i] = y1[i] > 0.0f ? dy[i] : 0.0f; /* residual.c's pass */

    /* gradient sums: the unmasked kernel given dz */
    const float *dys[8], *dzs[8], *xs[8];
    const uint16_t *ms[8];
    double s1[8] = {0}, s2[8] = {0}, t1[8] = {0}, t2[8] = {0};
    double *p1[8], *p2[8], *q1[8], *q2[8];
    for (int i = 0; i < nc; i++) {
        dys[i] = dy + (size_t)i * s, dzs[i] = dz + (size_t)i * s, xs[i] = x + (size_t)i * s;
        ms[i] = mask + (size_t)i * mw;
        p1[i] = &s1[i], p2[i] = &s2[i], q1[i] = &t1[i], q2[i] = &t2[i];
    }
    cf_bn_planes_dy_sums(nc, dzs, xs, s, mean, false, scale, shift, p1, p2);
    cf_bn_planes_dy_sums_mask(nc, dys, xs, s, mean, ms, q1, q2);
    for (int i = 0; i < nc; i++)
        if (memcmp(&s1[i], &t1[i], sizeof(double)) || memcmp(&s2[i], &t2[i], sizeof(double)))
            fail_msg("dy_sums_mask s %lld nc %d: plane %d sums %.17g %.17g, expected %.17g %.17g",
                     (long long)s, nc, i, t1[i], t2[i], s1[i], s2[i]);
    /* dx in fp32 and in bf16 words */
    cf_bn_planes_dx(dz, x, dx1, s, nc, mean, k1, k2, k3, false, scale, shift, 0);
    for (size_t i = 0; i < tot; i++) dx2[i] = 4321.5f;
    cf_bn_planes_dx_mask(dy, x, dx2, s, nc, mean, k1, k2, k3, mask, ahead ? (ptrdiff_t)n : 0);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&dx1[i], &dx2[i], sizeof(float)) != 0)
            fail_msg("dx_mask s %lld nc %d: value %zu is %.9g, expected %.9g (dy %g, bit %d)",
                     (long long)s, nc, i, (double)dx2[i], (double)dx1[i], (double)dy[i],
                     y1[i] > 0.0f);
    for (size_t i = n; i < tot; i++) assert_true(dx2[i] == 4321.5f);
    cf_bn_planes_dx_bf16(dz, x, h1, s, nc, mean, k1, k2, k3, false, scale, shift, 0);
    memset(h2, 0xa5, tot * sizeof(uint16_t));
    cf_bn_planes_dx_bf16_mask(dy, x, h2, s, nc, mean, k1, k2, k3, mask, ahead ? (ptrdiff_t)n : 0);
    for (size_t i = 0; i < n; i++)
        if (h1[i] != h2[i])
            fail_msg("dx_bf16_mask s %lld nc %d: word %zu is %04x, expected %04x", (long long)s, nc,
                     i, h2[i], h1[i]);
    for (size_t i = n; i < tot; i++) assert_int_equal(h2[i], 0xa5a5);
    free(x), free(x2), free(a), free(y1), free(y2), free(dy), free(dz), free(dx1), free(dx2);
    free(mask), free(h1), free(h2);
}

static void test_kernels(void **state) {
    (void)state;
    static const int64_t sizes[] = {1,  2,  4,   7,   8,   15,   16,   17,   31,
                                    33, 49, 196, 511, 784, 2047, 2048, 2049, 4100};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int nc = 1; nc <= 5; nc += 2)
            for (int two = 0; two < 2; two++)
                for (int ahead = 0; ahead < 2; ahead++) check_kernels(sizes[k], nc, two, ahead);
}

/* ---- networks ------------------------------------------------------------------------------- */

/* Blocks whose fold wrote the bits at the last forward. */
static int count_masks(const cf_module *m) {
    int n = 0;
    if (cf_nn_is_residual(m) && m->n_children == 2) {
        const cf_module *ip = m->children[1];
        n += cf_nn_bn_wrote_mask(ip->children[ip->n_children - 1]);
    }
    for (int i = 0; i < m->n_children; i++) n += count_masks(m->children[i]);
    return n;
}

typedef struct run_opts {
    bool bits, bf16, sync;
    int hook; /* a wrapper on the first block's 1: convpath's, 2: idpath's last BatchNorm */
    int threads;
} run_opts;

static const cf_module_ops *hook_orig;
static cf_module_ops hook_ops;
static const cf_tensor *hook_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    return hook_orig->backward(m, dy, need_dx);
}

static record run_case(const block_net *k, run_opts o) {
    cf_set_num_threads(o.threads);
    cf__nn_set_res_mask_bits(o.bits);
    cf_model *model = block_model(block_net_build(k), 21, o.bf16, o.sync);
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    record r = {0};
    cf_module *hooked = NULL;
    for (int step = 0; step <= STEPS; step++) {
        const bool training = step < STEPS;
        step_start(model, x, nx, 100 + (uint64_t)step, training);
        if (o.hook && step == 1) /* after the plan */
            hooked = hook_path_end(model->root, o.hook - 1, &hook_orig, &hook_ops, hook_backward);
        cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        const int got = count_masks(model->root);
        const int want = o.bits ? k->blocks : 0;
        /* a hook on the fold itself stops the bits (its ops are not its own) */
        if (!(hooked && o.hook == 2) && got != want)
            fail_msg("%s (bits %d, bf16 %d, %d threads) step %d: %d blocks wrote the bits, "
                     "expected %d",
                     k->name, o.bits, o.bf16, o.threads, step, got, want);
        const size_t ny = cf_tensor_numel(y);
        put(&r, y->data, ny);
        if (!training) break;
        record_backward_step(&r, model, y, nx, step);
    }
    if (hooked) hooked->ops = hook_orig;
    free(x);
    cf_model_free(model);
    cf__nn_set_res_mask_bits(true);
    cf_set_num_threads(1);
    return r;
}

static void check_case(const block_net *k, run_opts o) {
    o.bits = true;
    record a = run_case(k, o);
    o.bits = false;
    record b = run_case(k, o);
    char name[160];
    snprintf(name, sizeof name, "%s (bf16 %d, hook %d, sync %d, %d threads)", k->name, o.bf16,
             o.hook, o.sync, o.threads);
    records_equal(a, b, name, "with the bits", "without");
}

static const block_net cases[] = {
    {"W1's first block", BNET_BLOCK, 6, 16, 28, 28, 32, 1},
    {"W1", BNET_W1, 4, 1, 28, 28, 0, 2},
    {"a stride-1 block 16ch 7x7", BNET_BLOCK_S1, 5, 16, 7, 7, 16, 1},
    {"a block with a BatchNorm idpath 8ch 48x48", BNET_BLOCK_BN_ID, 2, 3, 48, 48, 8, 1},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static void test_bits_equal_mask_pass(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int t = 1; t <= 2; t++)
                check_case(&cases[i], (run_opts){.bf16 = bf16, .threads = t});
}

static void test_bits_sync(void **state) {
    (void)state;
    check_case(&cases[0], (run_opts){.bf16 = true, .sync = true, .threads = 1});
    check_case(&cases[1], (run_opts){.bf16 = true, .sync = true, .threads = 2});
    check_case(&cases[3], (run_opts){.sync = true, .threads = 2});
}

/* A wrapper on either path's last BatchNorm installed after the plan: the block masks dy itself. */
static void test_hooked(void **state) {
    (void)state;
    check_case(&cases[0], (run_opts){.bf16 = true, .hook = 1, .threads = 1});
    check_case(&cases[1], (run_opts){.hook = 2, .threads = 2});
    check_case(&cases[2], (run_opts){.hook = 1, .threads = 2});
}

int main(void) {
    printf("level %s, bf16 compute %d\n", cf_isa_name(cf_isa_active()), cf_bf16_compute());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_bits_equal_mask_pass),
        cmocka_unit_test(test_bits_sync),
        cmocka_unit_test(test_hooked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
