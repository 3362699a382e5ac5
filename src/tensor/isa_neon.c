/* The NEON kernels (AArch64 Advanced SIMD, present on every arm64 CPU): the shared
 * register-blocked kernels of simd_kernels.h over 4-float vectors, with tiles of 8 rows x 3
 * vectors (24 accumulators of the 32 registers). NEON has no masked loads or stores: a lane
 * mask is a vector of all-ones or zero lanes, a vector whose every lane is wanted is one plain
 * load or store, and otherwise each wanted lane is loaded or stored on its own, so a lane
 * outside the mask never touches memory. Since NEON is part of the arm64 baseline, this file
 * needs no extra compiler flags; on other architectures it compiles to nothing. */
#if defined(__aarch64__)
#include "tensor/kernel_table.h"

#include <arm_neon.h>
#include <math.h>

#define VL 4
#define VMASK_ALL 0xfu
#define MR 8
#define NV_MAX 3
typedef float32x4_t vf;
typedef uint32x4_t vmaskv;

static inline uint32x4_t neon_lane_mask(unsigned bits) { /* bit i -> lane i all ones */
    const uint32x4_t lane_bit = {1, 2, 4, 8};
    return vtstq_u32(vdupq_n_u32(bits), lane_bit);
}

/* The lanes of m from p, the others from src. */
static inline float32x4_t neon_load_masked(float32x4_t src, uint32x4_t m, const float *p) {
    if (vminvq_u32(m)) return vld1q_f32(p); /* every lane */
    if (vgetq_lane_u32(m, 0)) src = vld1q_lane_f32(p, src, 0);
    if (vgetq_lane_u32(m, 1)) src = vld1q_lane_f32(p + 1, src, 1);
    if (vgetq_lane_u32(m, 2)) src = vld1q_lane_f32(p + 2, src, 2);
    if (vgetq_lane_u32(m, 3)) src = vld1q_lane_f32(p + 3, src, 3);
    return src;
}

static inline void neon_store_masked(float *p, uint32x4_t m, float32x4_t v) {
    if (vminvq_u32(m)) {
        vst1q_f32(p, v);
        return;
    }
    if (vgetq_lane_u32(m, 0)) vst1q_lane_f32(p, v, 0);
    if (vgetq_lane_u32(m, 1)) vst1q_lane_f32(p + 1, v, 1);
    if (vgetq_lane_u32(m, 2)) vst1q_lane_f32(p + 2, v, 2);
    if (vgetq_lane_u32(m, 3)) vst1q_lane_f32(p + 3, v, 3);
}

static inline float32x4_t neon_zero_outside(uint32x4_t m, float32x4_t v) {
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), m));
}

#define V_MASKV(bits) neon_lane_mask(bits)
#define V_ZERO() vdupq_n_f32(0.0f)
#define V_SET1(x) vdupq_n_f32(x)
#define V_LOADU(p) vld1q_f32(p)
#define V_STOREU(p, v) vst1q_f32((p), (v))
#define V_ADD(a, b) vaddq_f32((a), (b))
#define V_FMA(a, b, c) vfmaq_f32((c), (a), (b))
#define V_LOADZ(mv, p) neon_load_masked(vdupq_n_f32(0.0f), (mv), (p))
#define V_LOADM(src, mv, p) neon_load_masked((src), (mv), (p))
/* every lane readable: one load, the lanes outside mv zeroed after it */
#define V_LOADZ_READABLE(mv, p) neon_zero_outside((mv), vld1q_f32(p))
#define V_STOREM(p, mv, v) neon_store_masked((p), (mv), (v))
#define V_SUB(a, b) vsubq_f32((a), (b))
/* a > b ? a : b, as x86's max: the second operand when either is NaN or both are zero (NEON's
 * own fmax would return the NaN, where ReLU gives 0) */
#define V_MAX(a, b) neon_max_second(a, b)
#define V_ZMASK(mv, v) neon_zero_outside((mv), (v))
#define V_GT0(v) vcgtq_f32((v), vdupq_n_f32(0.0f))
#define V_MASK_AND(a, b) vandq_u32((a), (b))
#define V_MASK_BITS(mv) neon_mask_bits(mv)

static inline unsigned neon_mask_bits(uint32x4_t m) { /* lane i all ones -> bit i */
    const uint32x4_t lane_bit = {1, 2, 4, 8};
    return vaddvq_u32(vandq_u32(m, lane_bit));
}

static inline float32x4_t neon_max_second(float32x4_t a, float32x4_t b) {
    return vbslq_f32(vcgtq_f32(a, b), a, b);
}

static inline double neon_hsum_d(float32x4_t v) {
    const float64x2_t s = vaddq_f64(vcvt_f64_f32(vget_low_f32(v)), vcvt_high_f64_f32(v));
    return vaddvq_f64(s);
}
#define V_HSUM_D(v) neon_hsum_d(v)
#include "tensor/optim_loops.h"
#include "tensor/lstm_loops.h"
#include "tensor/grid_sample_loops.h"
#include "tensor/softmax_loops.h"
/* lo = a0 b0 a1 b1, hi = a2 b2 a3 b3; ev = a0 a2 b0 b2, od = a1 a3 b1 b3 */
#define V_ZIP(a, b, lo, hi)                                                                        \
    do {                                                                                           \
        const float32x4_t zip_a_ = (a), zip_b_ = (b);                                              \
        (lo) = vzip1q_f32(zip_a_, zip_b_);                                                         \
        (hi) = vzip2q_f32(zip_a_, zip_b_);                                                         \
    } while (0)
#define V_UNZIP(a, b, ev, od)                                                                      \
    do {                                                                                           \
        const float32x4_t unzip_a_ = (a), unzip_b_ = (b);                                          \
        (ev) = vuzp1q_f32(unzip_a_, unzip_b_);                                                     \
        (od) = vuzp2q_f32(unzip_a_, unzip_b_);                                                     \
    } while (0)
#include "tensor/simd_kernels.h"
#include "tensor/winograd_loops.h"

/* ---- transpose ------------------------------------------------------------------------------ */

/* dst[j * ldd + i] = src[i * lds + j], in blocks of 4 x 4 (rows and columns past the last whole
 * block one value at a time). */
static void neon_transpose(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                           ptrdiff_t ldd) {
    int i0 = 0;
    for (; i0 + 4 <= rows; i0 += 4) {
        const float *s = src + i0 * lds;
        int j0 = 0;
        for (; j0 + 4 <= cols; j0 += 4) {
            const float32x4_t r0 = vld1q_f32(s + j0), r1 = vld1q_f32(s + lds + j0),
                              r2 = vld1q_f32(s + 2 * lds + j0), r3 = vld1q_f32(s + 3 * lds + j0);
            /* pairs of rows interleaved, then pairs of pairs */
            const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1)),
                              t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1)),
                              t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3)),
                              t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
            float *d = dst + j0 * ldd + i0;
            vst1q_f32(d, vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)));
            vst1q_f32(d + ldd, vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)));
            vst1q_f32(d + 2 * ldd, vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)));
            vst1q_f32(d + 3 * ldd, vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)));
        }
        for (int j = j0; j < cols; j++)
            for (int i = i0; i < i0 + 4; i++) dst[j * ldd + i] = src[i * lds + j];
    }
    for (int j = 0; j < cols; j++)
        for (int i = i0; i < rows; i++) dst[j * ldd + i] = src[i * lds + j];
}

/* ---- pooling -------------------------------------------------------------------------------- */

/* AdaptiveConcatPool2d on one plane: the maximum, its first index and the sum, 4 lanes at a
 * time. Returns false, leaving the plane to the scalar loop, when the plane holds a NaN. */
static bool neon_max_sum_plane(const float *x, size_t n, float *best, int32_t *arg, float *sum) {
    float32x4_t mx = vdupq_n_f32(-INFINITY), s = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        if (!vminvq_u32(vceqq_f32(v, v))) return false; /* a lane is NaN */
        mx = vmaxq_f32(mx, v);
        s = vaddq_f32(s, v);
    }
    float b = vmaxvq_f32(mx), t = vaddvq_f32(s);
    for (; i < n; i++) {
        if (isnan(x[i])) return false;
        if (x[i] > b) b = x[i];
        t += x[i];
    }
    size_t k = 0;
    while (x[k] != b) k++; /* the first position of the maximum */
    *best = b;
    *arg = (int32_t)k;
    *sum = t;
    return true;
}

const cf_kernel_table cf_kernels_neon = {
    .isa = CF_ISA_NEON,
    .sgemm_strided = simd_sgemm_strided,
    .transpose = neon_transpose,
    .implicit_run = simd_implicit_run,
    .implicit_wgrad = simd_implicit_wgrad,
    .bn = &simd_bn_kernels,
    .max_sum_plane = neon_max_sum_plane,
    .optim = &loops_optim,
    .wino = &loops_wino,
    .lstm = &loops_lstm,
    .softmax = &loops_softmax,
    .grid_sample = &loops_grid_sample,
};
#endif
