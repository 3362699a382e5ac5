/* The AVX2 kernels (AVX2 + FMA): the shared register-blocked kernels of simd_kernels.h over
 * 8-float ymm vectors, with tiles of 4 rows x 3 vectors (12 accumulators of the 16 registers).
 * Lane masks are vectors here: AVX2's masked loads and stores take one int32 per lane (a
 * masked-out lane never touches memory, as with AVX-512's masks). Compiled with these
 * instruction sets whatever the build's baseline; used only when the CPU reports them (isa.c). */
#if defined(__x86_64__)
#include "tensor/kernel_table.h"

#include <immintrin.h>
#include <math.h>

#define VL 8
#define VMASK_ALL 0xffu
#define MR 4
#define NV_MAX 3
typedef __m256 vf;
typedef __m256i vmaskv;

static inline __m256i avx2_lane_mask(unsigned bits) { /* bit i -> lane i all ones */
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), lane_bit), lane_bit);
}

#define V_MASKV(bits) avx2_lane_mask(bits)
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_STOREU(p, v) _mm256_storeu_ps((p), (v))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_LOADZ(mv, p) _mm256_maskload_ps((p), (mv))
/* src is 0 in mv's lanes: an OR, which needs no mask register beside the load's own (a blend's
 * mask operand would keep one more of the 16 registers busy and spill an accumulator) */
#define V_LOADM(src, mv, p) _mm256_or_ps((src), _mm256_maskload_ps((p), (mv)))
#define V_STOREM(p, mv, v) _mm256_maskstore_ps((p), (mv), (v))
#define V_SUB(a, b) _mm256_sub_ps((a), (b))
#define V_MAX(a, b) _mm256_max_ps((a), (b))
#define V_ZMASK(mv, v) _mm256_and_ps((v), _mm256_castsi256_ps(mv))
#define V_GT0(v) _mm256_castps_si256(_mm256_cmp_ps((v), _mm256_setzero_ps(), _CMP_GT_OQ))
#define V_MASK_AND(a, b) _mm256_and_si256((a), (b))

static inline double avx2_hsum_d(__m256 v) {
    const __m256d s = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                                    _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}
#define V_HSUM_D(v) avx2_hsum_d(v)
/* lo = a0 b0 a1 b1 a2 b2 a3 b3, hi = a4 b4 ... a7 b7 */
#define V_ZIP(a, b, lo, hi)                                                                        \
    do {                                                                                           \
        const __m256 zip_l_ = _mm256_unpacklo_ps((a), (b)), zip_h_ = _mm256_unpackhi_ps((a), (b)); \
        (lo) = _mm256_permute2f128_ps(zip_l_, zip_h_, 0x20);                                       \
        (hi) = _mm256_permute2f128_ps(zip_l_, zip_h_, 0x31);                                       \
    } while (0)
/* ev = a0 a2 a4 a6 b0 b2 b4 b6, od = a1 a3 ... b7 */
#define V_UNZIP(a, b, ev, od)                                                                      \
    do {                                                                                           \
        const __m256 unzip_a_ = (a), unzip_b_ = (b);                                               \
        (ev) = _mm256_castpd_ps(_mm256_permute4x64_pd(                                             \
            _mm256_castps_pd(_mm256_shuffle_ps(unzip_a_, unzip_b_, 0x88)), 0xd8));                 \
        (od) = _mm256_castpd_ps(_mm256_permute4x64_pd(                                             \
            _mm256_castps_pd(_mm256_shuffle_ps(unzip_a_, unzip_b_, 0xdd)), 0xd8));                 \
    } while (0)
#include "tensor/optim_loops.h"
#include "tensor/lstm_loops.h"
#include "tensor/softmax_loops.h"
#include "tensor/simd_kernels.h"
/* cf_conv_winograd_pays: bench_conv on W1 and W2 */
#define WINO_SHORT_ROW_COST 140
#include "tensor/winograd_loops.h"
#include "tensor/lstm_gemm_loops.h"

/* ---- transpose ------------------------------------------------------------------------------ */

/* t[j] lane i = r[i] lane j: one 8x8 block transposed in registers (r is clobbered). */
static inline void transpose8_regs(__m256 r[8], __m256 t[8]) {
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
}

/* dst[j * ldd + i] = src[i * lds + j] for one 8x8 block in registers. */
static inline void transpose8(const float *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    transpose8_regs(r, t);
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + i * ldd, t[i]);
}

static void avx2_transpose(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                           ptrdiff_t ldd) {
    int j0 = 0;
    for (; j0 + 8 <= cols; j0 += 8) {
        int i0 = 0;
        for (; i0 + 8 <= rows; i0 += 8)
            transpose8(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
        for (int j = j0; j < j0 + 8; j++) /* rows past the last block of 8 */
            for (int i = i0; i < rows; i++) dst[j * ldd + i] = src[i * lds + j];
    }
    if (j0 == cols) return;
    /* the last cols - j0 < 8 columns: blocks of 8 rows read with masked loads, the block's first
     * cols - j0 rows of the transpose stored (a 7x7 plane's rows are all such columns) */
    const int n = cols - j0;
    const __m256i m = avx2_lane_mask(simd_first_lanes(n));
    int i0 = 0;
    for (; i0 + 8 <= rows; i0 += 8) {
        __m256 r[8], t[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_maskload_ps(src + (i0 + i) * lds + j0, m);
        transpose8_regs(r, t);
        for (int j = 0; j < n; j++) _mm256_storeu_ps(dst + (j0 + j) * ldd + i0, t[j]);
    }
    for (int j = j0; j < cols; j++) /* and the rows past the last block of 8 */
        for (int i = i0; i < rows; i++) dst[j * ldd + i] = src[i * lds + j];
}

/* ---- MaxPool2d(2) ---------------------------------------------------------------------------- */

/* Vectors of 8 outputs: the window's four values are the even and odd lanes of two input rows;
 * each later value replaces the best where it is greater or NaN, as the scalar loop. */
static void avx2_max_pool_2x2(const float *x, int h, int w, float *y, int32_t *idx) {
    const int oh = h / 2, ow = w / 2;
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    for (int oy = 0; oy < oh; oy++) {
        const float *r0 = x + (size_t)(2 * oy) * w, *r1 = r0 + w;
        for (int ox0 = 0; ox0 < ow; ox0 += 8) {
            const int n_in = 2 * (ow - ox0), n_out = ow - ox0;
            const __m256i m_lo = avx2_lane_mask(simd_first_lanes(n_in)),
                          m_hi = avx2_lane_mask(simd_first_lanes(n_in - 8)),
                          m_out = avx2_lane_mask(simd_first_lanes(n_out));
            __m256 v[4];
            V_UNZIP(_mm256_maskload_ps(r0 + 2 * ox0, m_lo),
                    _mm256_maskload_ps(r0 + 2 * ox0 + 8, m_hi), v[0], v[1]);
            V_UNZIP(_mm256_maskload_ps(r1 + 2 * ox0, m_lo),
                    _mm256_maskload_ps(r1 + 2 * ox0 + 8, m_hi), v[2], v[3]);
            const __m256i at = _mm256_add_epi32(_mm256_set1_epi32(2 * oy * w + 2 * ox0), lane2);
            const int off[4] = {0, 1, w, w + 1};
            __m256 best = v[0], arg = _mm256_castsi256_ps(at);
            for (int i = 1; i < 4; i++) {
                const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v[i], best, _CMP_GT_OQ),
                                                 _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
                best = _mm256_blendv_ps(best, v[i], take);
                arg = _mm256_blendv_ps(
                    arg, _mm256_castsi256_ps(_mm256_add_epi32(at, _mm256_set1_epi32(off[i]))),
                    take);
            }
            _mm256_maskstore_ps(y + (size_t)oy * ow + ox0, m_out, best);
            _mm256_maskstore_ps((float *)(idx + (size_t)oy * ow + ox0), m_out, arg);
        }
    }
}

/* ---- pooling -------------------------------------------------------------------------------- */

/* AdaptiveConcatPool2d on one plane: the maximum, its first index and the sum, 8 lanes at a
 * time and the last values one by one. Returns false, leaving the plane to the scalar loop,
 * when the plane holds a NaN (which must win the maximum at its first position). */
static bool avx2_max_sum_plane(const float *x, size_t n, float *best, int32_t *arg, float *sum) {
    __m256 mx = _mm256_set1_ps(-INFINITY), s = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) return false;
        mx = _mm256_max_ps(mx, v);
        s = _mm256_add_ps(s, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    float b = _mm_cvtss_f32(m4), t = _mm_cvtss_f32(s4);
    for (; i < n; i++) {
        if (isnan(x[i])) return false;
        if (x[i] > b) b = x[i];
        t += x[i];
    }
    const __m256 bv = _mm256_set1_ps(b);
    size_t k = 0; /* the first position of the maximum: the first vector holding it, then */
    while (k + 8 <= n && !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + k), bv, _CMP_EQ_OQ)))
        k += 8;
    while (x[k] != b) k++;
    *best = b;
    *arg = (int32_t)k;
    *sum = t;
    return true;
}

const cf_kernel_table cf_kernels_avx2 = {
    .isa = CF_ISA_AVX2,
    .sgemm_strided = simd_sgemm_strided,
    .sgemm_nt = simd_sgemm_nt,
    .transpose = avx2_transpose,
    .implicit_run = simd_implicit_run,
    .implicit_wgrad = simd_implicit_wgrad,
    .split_phases = simd_split_phases,
    .merge_phases = simd_merge_phases,
    .bn = &simd_bn_kernels,
    .max_sum_plane = avx2_max_sum_plane,
    .optim = &loops_optim,
    .wino = &loops_wino,
    .max_pool_2x2 = avx2_max_pool_2x2,
    .lstm = &loops_lstm,
    .softmax = &loops_softmax,
    .packed_gemm = &simd_packed_gemm,
};
#endif
