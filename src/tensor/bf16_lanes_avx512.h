/* The bf16 of each fp32 lane of an AVX-512 vector (round to nearest even, as PyTorch's
 * c10::BFloat16 and cf_fp32_to_bf16: subnormals kept, infinities kept, a NaN stays a quiet NaN of
 * the same sign), in the low 16 bits of the lane and zero above; AVX-512F alone
 * (vcvtneps2bf16 would flush subnormals to zero). Included by the avx512 and avx512_bf16 kernel
 * files, which must round alike: the bf16 Winograd's fused transforms (isa_avx512.c) and the bf16
 * GEMM's packing (isa_avx512_bf16.c) give bitwise the same operands. */
#ifndef CF_TENSOR_BF16_LANES_AVX512_H
#define CF_TENSOR_BF16_LANES_AVX512_H

#include <immintrin.h>
#include <stdint.h>

static inline __m512i cf__bf16_round_lanes(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_mov_epi32(rounded, nan, quiet);
}

/* The first n (at most 16) 32-bit words of w stored at p: the bf16 Winograd's pair stores. */
static inline void cf__store_words(uint32_t *p, int n, __m512i w) {
    if (n >= 16)
        _mm512_storeu_si512(p, w);
    else
        _mm512_mask_storeu_epi32(p, (__mmask16)((1u << n) - 1u), w);
}

#endif
