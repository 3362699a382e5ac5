/* The portable table: plain C, built with the compiler's baseline for the target, so it runs on
 * any CPU of the architecture. GEMM-shaped work goes to OpenBLAS (convolutions lower with
 * im2col); the loops below are written in lanes the compiler vectorises with whatever the
 * baseline has. */
#include "tensor/kernel_table.h"
#include "tensor/optim_loops.h"
#include "tensor/lstm_loops.h"
#include "tensor/grid_sample_loops.h"
#include "tensor/softmax_loops.h"

#include <string.h>

#define LANES 16

/* ---- BatchNorm over one channel plane (the algorithm of cf_bn_kernels, in float lanes) ------ */

static void generic_bn_shifted_sums(const float *restrict x, int64_t s, float k, double *s1,
                                    double *s2) {
    float l1[LANES] = {0}, l2[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= s; i += LANES)
        for (int j = 0; j < LANES; j++) {
            const float d = x[i + j] - k;
            l1[j] += d;
            l2[j] += d * d;
        }
    for (int j = 0; i + j < s; j++) {
        const float d = x[i + j] - k;
        l1[j] += d;
        l2[j] += d * d;
    }
    double t1 = 0, t2 = 0;
    for (int j = 0; j < LANES; j++) {
        t1 += l1[j];
        t2 += l2[j];
    }
    *s1 = t1;
    *s2 = t2;
}

static void generic_bn_affine(const float *restrict x, const float *restrict add, float *restrict y,
                              int64_t s, float scale, float shift, bool relu) {
    if (add)
        for (int64_t i = 0; i < s; i++) {
            const float v = add[i] + (x[i] * scale + shift);
            y[i] = v > 0.0f ? v : 0.0f;
        }
    else if (relu)
        for (int64_t i = 0; i < s; i++) {
            const float v = x[i] * scale + shift;
            y[i] = v > 0.0f ? v : 0.0f;
        }
    else
        for (int64_t i = 0; i < s; i++) y[i] = x[i] * scale + shift;
}

static bool mask_bit(const uint16_t *w, int64_t j) {
    return (w[j >> 4] >> (j & 15)) & 1u;
}

/* the upstream gradient at i: dy where the block's mask bit is set (w given; +0 elsewhere), or
 * dy with a fused ReLU's 0 where x * scale + shift <= 0 */
static inline float grad_at(const float *dy, const float *x, int64_t i, bool relu, float scale,
                            float shift, const uint16_t *w) {
    if (w) return mask_bit(w, i) ? dy[i] : 0.0f;
    return relu && !(x[i] * scale + shift > 0.0f) ? 0.0f : dy[i];
}

/* A plane's sums of g and g (x - mean) over LANES lanes, then the lanes in order, in double. One
 * body for the masked and unmasked callers (not inlined into either): the same instructions, so a
 * NaN's sign comes out the same whichever rule zeroed the gradient. */
static __attribute__((noinline)) void lane_dy_sums(const float *restrict dy,
                                                   const float *restrict x, int64_t s, float mean,
                                                   bool relu, float scale, float shift,
                                                   const uint16_t *w, double *t1, double *t2) {
    float l1[LANES] = {0}, l2[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= s; i += LANES)
        for (int j = 0; j < LANES; j++) {
            const float g = grad_at(dy, x, i + j, relu, scale, shift, w);
            l1[j] += g;
            l2[j] += g * (x[i + j] - mean);
        }
    for (int j = 0; i + j < s; j++) {
        const float g = grad_at(dy, x, i + j, relu, scale, shift, w);
        l1[j] += g;
        l2[j] += g * (x[i + j] - mean);
    }
    *t1 = *t2 = 0;
    for (int j = 0; j < LANES; j++) {
        *t1 += l1[j];
        *t2 += l2[j];
    }
}

static void generic_bn_dy_sums(const float *restrict dy, const float *restrict x, int64_t s,
                               float mean, bool relu, float scale, float shift, double *sdy,
                               double *sdyx) {
    double t1, t2;
    lane_dy_sums(dy, x, s, mean, relu, scale, shift, NULL, &t1, &t2);
    *sdy += t1;
    *sdyx += t2;
}

static void generic_bn_dx(const float *restrict dy, const float *restrict x, float *restrict dx,
                          int64_t s, float mean, float k1, float k2, float k3, bool relu,
                          float scale, float shift) {
    for (int64_t i = 0; i < s; i++)
        dx[i] = k1 * grad_at(dy, x, i, relu, scale, shift, NULL) + (k2 * (x[i] - mean) + k3);
}

/* ---- a residual block's ReLU mask as bits (CF_MASK_WORDS layout) ---- */

/* generic_bn_affine's add branch, with add = x2 * scale2 + shift2 where x2 is given (the values
 * generic_bn_affine without add gives), and each value's bit y > 0 */
static void generic_bn_fold_mask(const float *x, const float *add, const float *x2, float *y,
                                 int64_t s, float scale, float shift, float scale2, float shift2,
                                 uint16_t *mask) {
    memset(mask, 0, (size_t)CF_MASK_WORDS(s) * sizeof *mask);
    for (int64_t i = 0; i < s; i++) {
        const float a = x2 ? x2[i] * scale2 + shift2 : add[i];
        const float v = a + (x[i] * scale + shift);
        y[i] = v > 0.0f ? v : 0.0f;
        if (v > 0.0f) mask[i >> 4] |= (uint16_t)(1u << (i & 15));
    }
}

static void generic_bn_fold_mask_n(const float *x, const float *add, const float *x2, float *y,
                                   int64_t s, int nc, const float *scale, const float *shift,
                                   const float *scale2, const float *shift2, uint16_t *mask,
                                   ptrdiff_t ahead) {
    (void)ahead;
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        generic_bn_fold_mask(x + at, add ? add + at : NULL, x2 ? x2 + at : NULL, y + at, s,
                             scale[i], shift[i], x2 ? scale2[i] : 0.0f, x2 ? shift2[i] : 0.0f,
                             mask + (size_t)i * CF_MASK_WORDS(s));
    }
}

static void generic_bn_dy_sums_mask_n(int np, const float *const *dys, const float *const *xs,
                                      int64_t s, const float *means, const uint16_t *const *masks,
                                      double *sdy, double *sdyx) {
    for (int p = 0; p < np; p++)
        lane_dy_sums(dys[p], xs[p], s, means[p], false, 0.0f, 0.0f, masks[p], &sdy[p], &sdyx[p]);
}

static void generic_bn_dx_mask_n(const float *dy0, const float *x0, float *dx0, int64_t s, int nc,
                                 const float *mean, const float *k1, const float *k2,
                                 const float *k3, const uint16_t *mask, ptrdiff_t ahead) {
    (void)ahead;
    for (int p = 0; p < nc; p++) {
        const size_t at = (size_t)p * (size_t)s;
        const float *restrict dy = dy0 + at, *restrict x = x0 + at;
        float *restrict dx = dx0 + at;
        const uint16_t *w = mask + (size_t)p * CF_MASK_WORDS(s);
        for (int64_t i = 0; i < s; i++)
            dx[i] = k1[p] * grad_at(dy, x, i, false, 0.0f, 0.0f, w) +
                    (k2[p] * (x[i] - mean[p]) + k3[p]);
    }
}

static const cf_bn_kernels generic_bn = {
    .shifted_sums = generic_bn_shifted_sums,
    .affine = generic_bn_affine,
    .dy_sums = generic_bn_dy_sums,
    .dx = generic_bn_dx,
    .fold_mask_n = generic_bn_fold_mask_n,
    .dy_sums_mask_n = generic_bn_dy_sums_mask_n,
    .dx_mask_n = generic_bn_dx_mask_n,
};

const cf_kernel_table cf_kernels_generic = {.isa = CF_ISA_GENERIC,
                                            .bn = &generic_bn,
                                            .optim = &loops_optim,
                                            .lstm = &loops_lstm,
                                            .softmax = &loops_softmax,
                                            .grid_sample = &loops_grid_sample};
