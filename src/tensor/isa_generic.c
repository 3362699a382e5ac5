/* The portable table: plain C, built with the compiler's baseline for the target, so it runs on
 * any CPU of the architecture. GEMM-shaped work goes to OpenBLAS (convolutions lower with
 * im2col); the loops below are written in lanes the compiler vectorises with whatever the
 * baseline has. */
#include "tensor/kernel_table.h"
#include "tensor/optim_loops.h"
#include "tensor/lstm_loops.h"
#include "tensor/softmax_loops.h"

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

/* the upstream gradient at i: dy, or with a fused ReLU 0 where x * scale + shift <= 0 */
#define GRAD_AT(i) (relu && !(x[i] * scale + shift > 0.0f) ? 0.0f : dy[i])

static void generic_bn_dy_sums(const float *restrict dy, const float *restrict x, int64_t s,
                               float mean, bool relu, float scale, float shift, double *sdy,
                               double *sdyx) {
    float l1[LANES] = {0}, l2[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= s; i += LANES)
        for (int j = 0; j < LANES; j++) {
            const float g = GRAD_AT(i + j);
            l1[j] += g;
            l2[j] += g * (x[i + j] - mean);
        }
    for (int j = 0; i + j < s; j++) {
        const float g = GRAD_AT(i + j);
        l1[j] += g;
        l2[j] += g * (x[i + j] - mean);
    }
    double t1 = 0, t2 = 0;
    for (int j = 0; j < LANES; j++) {
        t1 += l1[j];
        t2 += l2[j];
    }
    *sdy += t1;
    *sdyx += t2;
}

static void generic_bn_dx(const float *restrict dy, const float *restrict x, float *restrict dx,
                          int64_t s, float mean, float k1, float k2, float k3, bool relu,
                          float scale, float shift) {
    for (int64_t i = 0; i < s; i++) dx[i] = k1 * GRAD_AT(i) + (k2 * (x[i] - mean) + k3);
}
#undef GRAD_AT

static const cf_bn_kernels generic_bn = {
    .shifted_sums = generic_bn_shifted_sums,
    .affine = generic_bn_affine,
    .dy_sums = generic_bn_dy_sums,
    .dx = generic_bn_dx,
};

const cf_kernel_table cf_kernels_generic = {.isa = CF_ISA_GENERIC,
                                            .bn = &generic_bn,
                                            .optim = &loops_optim,
                                            .lstm = &loops_lstm,
                                            .softmax = &loops_softmax};
