/* The Winograd transforms of the AVX512_BF16 level (cf_wino_avx512_bf16, isa.c): winograd_loops.h
 * over the AVX-512 vectors as in isa_avx512.c, with the bf16 stores of input_pairs, dy_pairs and
 * input_bf16 on the conversion instructions. Compiled with AVX512_BF16 whatever the build's
 * baseline; used only where the CPU has it.
 *
 * cf__bf16_round_lanes (AVX-512F, the AVX-512 table's stores and the bf16 GEMM's packing) takes
 * nine instructions a vector and a pair of them took most of the time of input_pairs and dy_pairs;
 * vcvtne2ps2bf16 rounds two vectors in one, to nearest even, and makes a NaN quiet the same way
 * (its upper 16 bits with bit 6 set), but reads a subnormal input as zero: a vector that holds one
 * (vfpclassps) takes cf__bf16_round_lanes instead. Bitwise the same values either way
 * (test_wino_transforms: subnormals, NaNs, infinities, ties, against cf_fp32_to_bf16). */
#if defined(__x86_64__)
#include "tensor/avx512_vectors.h"
#include "tensor/kernel_table.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define CF_INLINE static inline __attribute__((always_inline))

static inline unsigned simd_first_lanes(int n) { /* lanes [0, n) of a vector, n clamped */
    return n >= VL ? VMASK_ALL : n <= 0 ? 0u : (1u << n) - 1u;
}

#include "tensor/bf16_lanes_avx512.h"

/* vfpclassps: a subnormal lane */
#define SUBNORMAL 0x20

/* The words bf16(lo[i]) | bf16(hi[i]) << 16. */
static inline __m512i pairs_of(__m512 lo, __m512 hi) {
    if (__builtin_expect(
            (_mm512_fpclass_ps_mask(lo, SUBNORMAL) | _mm512_fpclass_ps_mask(hi, SUBNORMAL)) != 0,
            0))
        return _mm512_or_si512(cf__bf16_round_lanes(lo),
                               _mm512_slli_epi32(cf__bf16_round_lanes(hi), 16));
    /* lo's 16 values in the low half, hi's in the high half, then interleaved */
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(zip, both);
}

static inline void wino_store_pairs(uint32_t *p, int n, __m512 lo, __m512 hi) {
    const __m512i w = pairs_of(lo, hi);
    cf__store_words(p, n, w);
}
#define WINO_STORE_PAIRS(p, n, lo, hi) wino_store_pairs(p, n, lo, hi)

static inline void wino_store_bf16(uint16_t *p, int n, __m512 v) {
    const __m256i h = __builtin_expect(_mm512_fpclass_ps_mask(v, SUBNORMAL) != 0, 0)
                          ? _mm512_cvtepi32_epi16(cf__bf16_round_lanes(v))
                          : (__m256i)_mm512_cvtneps_pbh(v);
    if (n >= 16)
        _mm256_storeu_si256((__m256i *)p, h);
    else
        _mm256_mask_storeu_epi16(p, (__mmask16)((1u << n) - 1u), h);
}
#define WINO_STORE_BF16(p, n, v) wino_store_bf16(p, n, v)
#define WINO_SHORT_ROW_COST 224 /* isa_avx512.c's */
#include "tensor/winograd_loops.h"

const cf_wino_kernels *const cf_wino_avx512_bf16 = &loops_wino;
#endif
