/* The AVX-512 vector vocabulary that the shared loop headers (simd_kernels.h, winograd_loops.h,
 * optim_loops.h, ...) are written in, for the objects compiled with AVX-512 (isa_avx512.c,
 * isa_avx512_bf16_wino.c). */
#ifndef CF_TENSOR_AVX512_VECTORS_H
#define CF_TENSOR_AVX512_VECTORS_H

#include "tensor/bf16_lanes_avx512.h"

#include <immintrin.h>

#define VL 16
#define VMASK_ALL 0xffffu
typedef __m512 vf;
typedef __mmask16 vmaskv;
#define V_MASKV(bits) ((__mmask16)(bits))
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_STOREU(p, v) _mm512_storeu_ps((p), (v))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_LOADZ(mv, p) _mm512_maskz_loadu_ps((mv), (p))
#define V_LOADM(src, mv, p) _mm512_mask_loadu_ps((src), (mv), (p))
#define V_STOREM(p, mv, v) _mm512_mask_storeu_ps((p), (mv), (v))
#define V_SUB(a, b) _mm512_sub_ps((a), (b))
#define V_MAX(a, b) _mm512_max_ps((a), (b))
#define V_ZMASK(mv, v) _mm512_maskz_mov_ps((mv), (v))
#define V_GT0(v) _mm512_cmp_ps_mask((v), _mm512_setzero_ps(), _CMP_GT_OQ)
#define V_MASK_AND(a, b) ((__mmask16)((a) & (b)))
#define V_MASK_BITS(mv) ((unsigned)(mv))
/* the lanes in mv of v as bf16 words at p (uint16_t *): cf_fp32_to_bf16's rounding */
#define V_STORE_BF16(p, mv, v)                                                                     \
    _mm256_mask_storeu_epi16((p), (mv), _mm512_cvtepi32_epi16(cf__bf16_round_lanes(v)))
/* lo = a0 b0 a1 b1 ... a7 b7, hi = a8 b8 ... a15 b15 */
#define V_ZIP(a, b, lo, hi)                                                                        \
    do {                                                                                           \
        const __m512i zip_lo_ =                                                                    \
            _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);             \
        const __m512i zip_hi_ = _mm512_add_epi32(zip_lo_, _mm512_set1_epi32(8));                   \
        const __m512 zip_a_ = (a), zip_b_ = (b);                                                   \
        (lo) = _mm512_permutex2var_ps(zip_a_, zip_lo_, zip_b_);                                    \
        (hi) = _mm512_permutex2var_ps(zip_a_, zip_hi_, zip_b_);                                    \
    } while (0)
/* ev = the even lanes of a then b, od = the odd ones */
#define V_UNZIP(a, b, ev, od)                                                                      \
    do {                                                                                           \
        const __m512i unzip_ev_ =                                                                  \
            _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);          \
        const __m512i unzip_od_ = _mm512_add_epi32(unzip_ev_, _mm512_set1_epi32(1));               \
        const __m512 unzip_a_ = (a), unzip_b_ = (b);                                               \
        (ev) = _mm512_permutex2var_ps(unzip_a_, unzip_ev_, unzip_b_);                              \
        (od) = _mm512_permutex2var_ps(unzip_a_, unzip_od_, unzip_b_);                              \
    } while (0)

#endif
