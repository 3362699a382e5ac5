/* The AVX2 kernels (AVX2 + FMA): the shared register-blocked kernels of simd_kernels.h over
 * 8-float ymm vectors, with tiles of 4 rows x 3 vectors (12 accumulators of the 16 registers).
 * Lane masks are vectors here: AVX2's masked loads and stores take one int32 per lane (a
 * masked-out lane never touches memory, as with AVX-512's masks). Compiled with these
 * instruction sets whatever the build's baseline; used only when the CPU reports them (isa.c). */
#if defined(__x86_64__)
#include "tensor/kernel_table.h"

#include <immintrin.h>

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
#include "tensor/optim_loops.h"
#include "tensor/simd_kernels.h"

const cf_kernel_table cf_kernels_avx2 = {
    .isa = CF_ISA_AVX2,
    .sgemm_strided = simd_sgemm_strided,
    .implicit_run = simd_implicit_run,
    .implicit_wgrad = simd_implicit_wgrad,
    .bn = &simd_bn_kernels,
    .optim = &loops_optim,
};
#endif
