/* BatchNorm's several-plane kernels and the one-thread passes built on them (src/nn/batchnorm.c,
 * src/tensor/simd_kernels.h), and Dropout's select by bits (src/nn/activation.c). Each must give
 * bitwise what the code it replaced gave:
 *
 * - cf_bn_planes_sums / cf_bn_planes_dy_sums against one cf_bn_plane_sums / cf_bn_plane_dy_sums
 *   call per plane (the one-plane kernels are the old path), for plane sizes with and without a
 *   vector tail, 1 to 9 planes (more than one call's CF_BN_PLANES), with and without the fused
 *   ReLU's mask, accumulators that repeat (a channel's planes of several images) and start away
 *   from zero;
 * - cf_bn_planes_affine / cf_bn_planes_dx against one call per plane;
 * - cf_bn_planes_affine_stream against cf_bn_planes_affine, for outputs at every offset from a
 *   vector's alignment, planes shorter and longer than a vector, NaN, infinities and zeros of
 *   both signs among the inputs, with nothing written outside the output;
 * - BatchNorm2d + ReLU and BatchNorm2d as a residual block's last layer, a training forward and
 *   backward on W1's shapes, 1 and 2 threads, against a copy of the layer's former one-thread
 *   passes (one kernel call per plane, channel by channel in image order): output, input
 *   gradient, weight and bias gradients and running statistics;
 * - Dropout's output and input gradient against the former `mask ? v * scale : 0.0f`, with
 *   zeros, negative zeros, infinities and NaNs among the values.
 *
 * ctest runs it at every CF_ISA cap (tests/isa.cmake), the generic table taking the one-plane
 * fallbacks of src/tensor/kernels.c. */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"

static const int64_t sizes[] = {1, 5, 16, 17, 49, 196, 784, 1001};

/* ---- the kernels against one call per plane ------------------------------------------------ */

static void test_planes_sums(void **state) {
    (void)state;
    enum { MAXP = 9 };
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t s = sizes[si];
        float *x = malloc((size_t)(MAXP * s) * sizeof(float));
        fill_uniform(x, (size_t)(MAXP * s), 7 + si, 2.0f, 6.0f);
        for (int np = 1; np <= MAXP; np++) {
            const float *xs[MAXP];
            float k[MAXP];
            double s1[MAXP], s2[MAXP];
            for (int i = 0; i < np; i++) {
                xs[i] = x + (size_t)((i * 5) % MAXP) * s; /* not in memory order */
                k[i] = xs[i][0] + 0.25f * (float)i;
            }
            cf_bn_planes_sums(np, xs, s, k, s1, s2);
            for (int i = 0; i < np; i++) {
                double r1, r2;
                cf_bn_plane_sums(xs[i], s, k[i], &r1, &r2);
                if (memcmp(&r1, &s1[i], sizeof r1) || memcmp(&r2, &s2[i], sizeof r2))
                    fail_msg(
                        "sums: s %lld, %d planes, plane %d: %.17g %.17g, one plane %.17g %.17g",
                        (long long)s, np, i, s1[i], s2[i], r1, r2);
            }
        }
        free(x);
    }
}

static void test_planes_dy_sums(void **state) {
    (void)state;
    enum { MAXP = 9 };
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t s = sizes[si];
        const size_t n = (size_t)(MAXP * s);
        float *x = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
        fill_uniform(x, n, 17 + si, -2.0f, 2.0f);
        fill_uniform(dy, n, 27 + si, -1.0f, 1.0f);
        for (int relu = 0; relu < 2; relu++)
            for (int np = 1; np <= MAXP; np++) {
                const float *dys[MAXP], *xs[MAXP];
                float mean[MAXP], scale[MAXP], shift[MAXP];
                /* two accumulators shared in turn: as a channel's planes of several images */
                double acc[4] = {0.5, -1.25, 3.0, 0.0}, ref[4];
                double *a1[MAXP], *a2[MAXP];
                memcpy(ref, acc, sizeof acc);
                for (int i = 0; i < np; i++) {
                    const size_t at = (size_t)((i * 4) % MAXP) * (size_t)s;
                    dys[i] = dy + at;
                    xs[i] = x + at;
                    mean[i] = 0.1f * (float)i - 0.2f;
                    scale[i] = 0.5f + 0.125f * (float)i;
                    shift[i] = 0.3f - 0.1f * (float)i;
                    a1[i] = &acc[i % 2];
                    a2[i] = &acc[2 + i % 2];
                }
                cf_bn_planes_dy_sums(np, dys, xs, s, mean, relu, scale, shift, a1, a2);
                for (int i = 0; i < np; i++)
                    cf_bn_plane_dy_sums(dys[i], xs[i], s, mean[i], relu, scale[i], shift[i],
                                        &ref[i % 2], &ref[2 + i % 2]);
                if (memcmp(acc, ref, sizeof acc))
                    fail_msg("dy sums: s %lld, %d planes, relu %d: %.17g %.17g %.17g %.17g, one "
                             "plane at a time %.17g %.17g %.17g %.17g",
                             (long long)s, np, relu, acc[0], acc[1], acc[2], acc[3], ref[0], ref[1],
                             ref[2], ref[3]);
            }
        free(x);
        free(dy);
    }
}

static void test_planes_affine_dx(void **state) {
    (void)state;
    enum { NC = 6 };
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t s = sizes[si];
        const size_t n = (size_t)(NC * s);
        float *x = malloc(n * sizeof(float)), *add = malloc(n * sizeof(float));
        float *dy = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        float *ref = malloc(n * sizeof(float));
        fill_uniform(x, n, 37 + si, -2.0f, 2.0f);
        fill_uniform(add, n, 47 + si, -1.0f, 1.0f);
        fill_uniform(dy, n, 57 + si, -1.0f, 1.0f);
        float scale[NC], shift[NC], mean[NC], k1[NC], k2[NC], k3[NC];
        for (int i = 0; i < NC; i++) {
            scale[i] = 0.75f + 0.1f * (float)i;
            shift[i] = 0.2f - 0.15f * (float)i;
            mean[i] = 0.05f * (float)i;
            k1[i] = 1.1f - 0.05f * (float)i;
            k2[i] = -0.01f * (float)(i + 1);
            k3[i] = 0.003f * (float)i;
        }
        for (int mode = 0; mode < 3; mode++) { /* plain, ReLU, a residual add */
            const bool relu = mode > 0;
            const float *a = mode == 2 ? add : NULL;
            memset(y, 0xff, n * sizeof(float));
            memset(ref, 0xff, n * sizeof(float));
            cf_bn_planes_affine(x, a, y, s, NC, scale, shift, relu, mode == 1 ? (ptrdiff_t)s : 0);
            for (int i = 0; i < NC; i++) {
                const size_t at = (size_t)i * (size_t)s;
                cf_bn_plane_affine(x + at, a ? a + at : NULL, ref + at, s, scale[i], shift[i],
                                   relu);
            }
            if (memcmp(y, ref, n * sizeof(float)))
                fail_msg("affine: s %lld, mode %d differs from one call per plane", (long long)s,
                         mode);
            if (mode == 2) continue;
            memset(y, 0xff, n * sizeof(float));
            memset(ref, 0xff, n * sizeof(float));
            cf_bn_planes_dx(dy, x, y, s, NC, mean, k1, k2, k3, relu, scale, shift, relu ? s : 0);
            for (int i = 0; i < NC; i++) {
                const size_t at = (size_t)i * (size_t)s;
                cf_bn_plane_dx(dy + at, x + at, ref + at, s, mean[i], k1[i], k2[i], k3[i], relu,
                               scale[i], shift[i]);
            }
            if (memcmp(y, ref, n * sizeof(float)))
                fail_msg("dx: s %lld, relu %d differs from one call per plane", (long long)s, relu);
        }
        free(x);
        free(add);
        free(dy);
        free(y);
        free(ref);
    }
}

/* The streamed affine writes its aligned whole vectors with non-temporal stores, the values
 * around them with the plain kernel: every offset of y from a 64-byte line (0..15 floats) and
 * plane sizes around one and two vectors must give cf_bn_planes_affine's words exactly, and no
 * word outside y may change. */
static void test_planes_affine_stream(void **state) {
    (void)state;
    enum { NC = 5, PAD = 32 };
    static const int64_t ss[] = {1, 7, 15, 16, 17, 31, 32, 33, 47, 49, 64, 196, 1001};
    for (size_t si = 0; si < sizeof ss / sizeof *ss; si++) {
        const int64_t s = ss[si];
        const size_t n = (size_t)(NC * s);
        float *x = malloc(n * sizeof(float)), *add = malloc(n * sizeof(float));
        float *ref = malloc(n * sizeof(float));
        float *buf = cf_malloc((n + 2 * PAD) * sizeof(float)); /* 64-byte aligned */
        assert_non_null(buf);
        fill_uniform(x, n, 71 + si, -2.0f, 2.0f);
        fill_uniform(add, n, 81 + si, -2.0f, 2.0f);
        /* specials: NaN, infinities, signed zeros in x and add, and sums that cancel to -0 */
        const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -NAN};
        for (size_t i = 0; i < n; i += 3) x[i] = sp[(i / 3) % 6];
        for (size_t i = 1; i < n; i += 5) add[i] = sp[(i / 5) % 6];
        float scale[NC], shift[NC];
        for (int i = 0; i < NC; i++) {
            scale[i] = i == 0 ? 0.0f : i == 1 ? -0.5f : 0.75f + 0.1f * (float)i;
            shift[i] = i == 0 ? -0.0f : 0.2f - 0.15f * (float)i;
        }
        for (int mode = 0; mode < 3; mode++) { /* plain, ReLU, a residual add */
            const bool relu = mode > 0;
            const float *a = mode == 2 ? add : NULL;
            memset(ref, 0xff, n * sizeof(float));
            cf_bn_planes_affine(x, a, ref, s, NC, scale, shift, relu, 0);
            for (int off = 0; off < 16; off++) {
                memset(buf, 0x5a, (n + 2 * PAD) * sizeof(float));
                float *y = buf + PAD + off;
                cf_bn_planes_affine_stream(x, a, y, s, NC, scale, shift, relu,
                                           off & 1 ? (ptrdiff_t)s : 0);
                if (memcmp(y, ref, n * sizeof(float)))
                    fail_msg("affine stream: s %lld, mode %d, offset %d differs from the plain "
                             "kernel",
                             (long long)s, mode, off);
                const unsigned char *bytes = (const unsigned char *)buf;
                const size_t lo = (PAD + (size_t)off) * sizeof(float), hi = lo + n * sizeof(float);
                for (size_t b = 0; b < (n + 2 * PAD) * sizeof(float); b++)
                    if ((b < lo || b >= hi) && bytes[b] != 0x5a)
                        fail_msg("affine stream: s %lld, mode %d, offset %d wrote byte %zu outside "
                                 "y",
                                 (long long)s, mode, off, b);
            }
        }
        free(x);
        free(add);
        free(ref);
        cf_free(buf);
    }
}

/* ---- the layer against its former passes --------------------------------------------------- */

typedef struct bn_ref {
    float *y, *dx, *dw, *db, *rmean, *rvar;
} bn_ref;

static void free_ref(bn_ref *r) {
    free(r->y);
    free(r->dx);
    free(r->dw);
    free(r->db);
    free(r->rmean);
    free(r->rvar);
}

/* The former one-thread passes of a training forward and backward (batchnorm.c before the
 * several-plane kernels): per channel, one kernel call per plane in image order. add: a residual
 * block's other path (the output max(add + bn(x), 0), the backward then without the mask). */
static bn_ref reference(const float *x, const float *add, const float *dy, int n, int c, int64_t s,
                        const float *gamma, const float *beta) {
    const size_t cs = (size_t)s, total = (size_t)n * c * cs;
    const double count = (double)n * (double)s;
    const float eps = 1e-5f;
    const double mom = 0.1f; /* the layer's float momentum, in double */
    bn_ref r = {malloc(total * sizeof(float)),     malloc(total * sizeof(float)),
                calloc((size_t)c, sizeof(float)),  calloc((size_t)c, sizeof(float)),
                malloc((size_t)c * sizeof(float)), malloc((size_t)c * sizeof(float))};
    float *mean = malloc((size_t)c * sizeof(float)), *invstd = malloc((size_t)c * sizeof(float));
    float *scale = malloc((size_t)c * sizeof(float)), *shift = malloc((size_t)c * sizeof(float));
    for (int ch = 0; ch < c; ch++) {
        double s1 = 0, s2 = 0;
        const float k = x[(size_t)ch * cs];
        for (int i = 0; i < n; i++) {
            double a1, a2;
            cf_bn_plane_sums(x + ((size_t)i * c + ch) * cs, s, k, &a1, &a2);
            s1 += a1;
            s2 += a2;
        }
        const double d = s1 / count;
        double v = s2 / count - d * d;
        if (v < 0) v = 0;
        mean[ch] = (float)(k + d);
        invstd[ch] = (float)(1.0 / sqrt(v + eps));
        scale[ch] = gamma[ch] * invstd[ch];
        shift[ch] = beta[ch] - mean[ch] * scale[ch];
        const double unbias = count / (count - 1);
        r.rmean[ch] = (float)((1 - mom) * 0.0f + mom * mean[ch]);
        r.rvar[ch] = (float)((1 - mom) * 1.0f + mom * v * unbias);
        for (int i = 0; i < n; i++) {
            const size_t at = ((size_t)i * c + ch) * cs;
            cf_bn_plane_affine(x + at, add ? add + at : NULL, r.y + at, s, scale[ch], shift[ch],
                               true);
        }
    }
    const bool mask = !add; /* a residual block masks its own gradient */
    for (int ch = 0; ch < c; ch++) {
        double sdy = 0, sdyx = 0;
        for (int i = 0; i < n; i++) {
            const size_t at = ((size_t)i * c + ch) * cs;
            cf_bn_plane_dy_sums(dy + at, x + at, s, mean[ch], mask, scale[ch], shift[ch], &sdy,
                                &sdyx);
        }
        r.dw[ch] += (float)(sdyx * invstd[ch]);
        r.db[ch] += (float)sdy;
        const float k1 = gamma[ch] * invstd[ch];
        const float k2 = (float)(-(double)k1 * invstd[ch] * invstd[ch] * sdyx / count);
        const float k3 = (float)(-(double)k1 * sdy / count);
        for (int i = 0; i < n; i++) {
            const size_t at = ((size_t)i * c + ch) * cs;
            cf_bn_plane_dx(dy + at, x + at, r.dx + at, s, mean[ch], k1, k2, k3, mask, scale[ch],
                           shift[ch]);
        }
    }
    free(mean);
    free(invstd);
    free(scale);
    free(shift);
    return r;
}

static void check_same(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("%s differs at %zu: %.9g, former passes %.9g", what, i, (double)a[i],
                     (double)b[i]);
}

/* BatchNorm2d + ReLU (add NULL), or a BatchNorm2d folded into a residual block's
 * max(a + bn(x), 0) through cf_nn_bn_forward_add_relu. */
static void check_layer(int n, int c, int h, int w, bool residual, bool craft, int threads) {
    const cf_shape xs = cf_shape4(n, c, h, w);
    const size_t total = cf_shape_numel(&xs);
    const int64_t s = (int64_t)h * w;
    float *x = malloc(total * sizeof(float)), *dy = malloc(total * sizeof(float));
    float *add = residual ? malloc(total * sizeof(float)) : NULL;
    fill_uniform(x, total, 101 + (uint64_t)c, 3.0f, 5.0f); /* a mean away from 0 */
    fill_uniform(dy, total, 201 + (uint64_t)c, -1.0f, 1.0f);
    if (add) fill_uniform(add, total, 301 + (uint64_t)c, -1.0f, 1.0f);
    if (craft) { /* planes whose sums add differently in another order (see the caller) */
        memset(x, 0, total * sizeof(float));
        memset(dy, 0, total * sizeof(float));
        const size_t plane = (size_t)c * (size_t)s;
        for (size_t i = 1; i < (size_t)s; i++) {
            x[i] = dy[i] = 0x1p50f;                          /* image 0 */
            x[2 * plane + i] = dy[2 * plane + i] = -0x1p50f; /* image 2 */
        }
        x[plane + 3] = dy[plane + 3] = 1.0f; /* images 1 and 3 */
        x[3 * plane + 3] = dy[3 * plane + 3] = 1.0f;
    }

    cf_set_num_threads(threads);
    cf_module *bn = cf_batchnorm2d(c), *relu = residual ? NULL : cf_relu();
    cf_module *mods[] = {bn, relu};
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_sequential(residual ? 1 : 2, mods), 5), CF_OK);
    fill_uniform(bn->params[0].data, (size_t)c, 11, 0.5f, 1.5f);
    fill_uniform(bn->params[1].data, (size_t)c, 12, -0.5f, 0.5f);
    cf_model_train(model, true);
    cf_model_zero_grad(model);
    cf_tensor tx = cf_tensor_view(x, xs), tdy = cf_tensor_view(dy, xs);
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK); /* plans the model */
    if (residual) y = cf_nn_bn_forward_add_relu(bn, &tx, add);
    /* the BatchNorm's own backward: with the ReLU fused, the Sequential's would hand it dy */
    if (!residual) assert_true(cf_nn_bn_fused_with(bn, relu));
    const cf_tensor *dx = bn->ops->backward(bn, &tdy, true);

    bn_ref r = reference(x, add, dy, n, c, s, bn->params[0].data, bn->params[1].data);
    char what[160];
    snprintf(what, sizeof what, "(%d, %d, %d, %d)%s, %d thread(s): output", n, c, h, w,
             residual ? " residual" : " + ReLU", threads);
    check_same(what, y->data, r.y, total);
    snprintf(what, sizeof what, "(%d, %d, %d, %d)%s, %d thread(s): input gradient", n, c, h, w,
             residual ? " residual" : " + ReLU", threads);
    check_same(what, dx->data, r.dx, total);
    check_same("weight gradient", bn->params[0].grad, r.dw, (size_t)c);
    check_same("bias gradient", bn->params[1].grad, r.db, (size_t)c);
    /* the residual case ran two training forwards: its running statistics moved twice */
    if (!residual) {
        check_same("running mean", bn->params[2].data, r.rmean, (size_t)c);
        check_same("running variance", bn->params[3].data, r.rvar, (size_t)c);
    }
    free_ref(&r);
    cf_model_free(model);
    free(x);
    free(dy);
    free(add);
    cf_set_num_threads(1);
}

static void test_layer_against_former_passes(void **state) {
    (void)state;
    for (int t = 1; t <= 2; t++) {
        /* W1's stem: one channel per block, a call's planes are images */
        check_layer(64, 16, 28, 28, false, false, t);
        check_layer(64, 32, 14, 14, false, false, t); /* block 1: a few channels per block */
        check_layer(64, 64, 7, 7, false, false, t);   /* block 2: many channels, a 1-lane tail */
        check_layer(3, 7, 5, 9, false, false, t);     /* small, odd */
        check_layer(64, 32, 14, 14, true, false, t);  /* a residual block's last BatchNorm */
    }
    /* Random planes' sums add exactly in double in any order; these do not. Image 0's plane sums
     * to B = 15 * 2^50 (2^50 in each value but the first, the shift), image 2's to -B, images
     * 1 and 3 to 1: in image order B + 1 rounds to B and the total is 1, backwards it is 0. So
     * the images' sums must go in image order, forward (the statistics) and backward (dy's sums;
     * a residual block's BatchNorm has no ReLU mask). */
    for (int t = 1; t <= 2; t++) check_layer(5, 1, 4, 4, true, true, t);
}

/* ---- Dropout -------------------------------------------------------------------------------- */

static void test_dropout_select(void **state) {
    (void)state;
    const float p = 0.5f, scale = 1.0f / (1.0f - p);
    const cf_shape xs = cf_shape2(64, 259); /* an odd row: a vector tail */
    const size_t n = cf_shape_numel(&xs);
    float *x = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
    float *ones = malloc(n * sizeof(float));
    fill_uniform(x, n, 5, -3.0f, 3.0f);
    fill_uniform(dy, n, 6, -1.0f, 1.0f);
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, -3e38f};
    for (size_t i = 0; i < n; i += 13) {
        x[i] = specials[(i / 13) % 8];
        dy[i] = specials[(i / 13 + 3) % 8];
    }
    cf_model *model;
    cf_module *drop = cf_dropout(p);
    cf_module *mods[] = {drop};
    assert_int_equal(cf_model_new(&model, cf_sequential(1, mods), 9), CF_OK);
    cf_model_train(model, true);
    /* the mask the next forward draws: a forward of ones from the same stream state */
    const cf_rng start = drop->rng;
    cf_tensor t1 = cf_tensor_view(ones, xs), tx = cf_tensor_view(x, xs),
              tdy = cf_tensor_view(dy, xs);
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &t1, &y), CF_OK);
    unsigned char *mask = malloc(n);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(y->data[i] == 0.0f || y->data[i] == scale);
        mask[i] = y->data[i] != 0.0f;
        kept += mask[i];
    }
    assert_true(kept > n / 4 && kept < 3 * n / 4);
    drop->rng = start;
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    const cf_tensor *dx = drop->ops->backward(drop, &tdy, true);
    for (size_t i = 0; i < n; i++) {
        const float ry = mask[i] ? x[i] * scale : 0.0f; /* the former expressions */
        const float gi = dy[i] * scale;
        const float rdx = mask[i] ? gi : 0.0f;
        if (memcmp(&ry, &y->data[i], sizeof ry))
            fail_msg("dropout output %zu: %g, former %g (x %g, mask %d)", i, (double)y->data[i],
                     (double)ry, (double)x[i], mask[i]);
        if (memcmp(&rdx, &dx->data[i], sizeof rdx))
            fail_msg("dropout input gradient %zu: %g, former %g", i, (double)dx->data[i],
                     (double)rdx);
    }
    cf_model_free(model);
    free(mask);
    free(x);
    free(dy);
    free(ones);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planes_sums),
        cmocka_unit_test(test_planes_dy_sums),
        cmocka_unit_test(test_planes_affine_dx),
        cmocka_unit_test(test_planes_affine_stream),
        cmocka_unit_test(test_layer_against_former_passes),
        cmocka_unit_test(test_dropout_select),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
