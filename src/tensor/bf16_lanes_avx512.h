/* The bf16 of each fp32 lane of an AVX-512 vector (round to nearest even, as PyTorch's
 * c10::BFloat16 and cf_fp32_to_bf16: subnormals kept, infinities kept, a NaN stays a quiet NaN of
 * the same sign), in the low 16 bits of the lane and zero above; AVX-512F alone
 * (vcvtneps2bf16 would flush subnormals to zero). Included by the avx512 and avx512_bf16 kernel
 * files, which must round alike: the bf16 Winograd's fused transforms (isa_avx512.c) and the bf16
 * GEMM's packing (isa_avx512_bf16.c) give bitwise the same operands. Where the file is built
 * with AVX512_BF16, the pair words on vcvtne2ps2bf16 too (cf__bf16_pairs). */
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

#ifdef __AVX512BF16__
/* The words bf16(lo[i]) | bf16(hi[i]) << 16 on vcvtne2ps2bf16, where no lane of lo or hi is
 * subnormal (the instruction rounds to nearest even and quiets a NaN as cf__bf16_round_lanes
 * does, but reads a subnormal as zero). */
static inline __m512i cf__bf16_pairs_plain(__m512 lo, __m512 hi) {
    /* lo's 16 values in the low half, hi's in the high half, then interleaved */
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(zip, both);
}

/* The words bf16(lo[i]) | bf16(hi[i]) << 16, cf__bf16_round_lanes' values: on vcvtne2ps2bf16
 * unless a lane is subnormal (vfpclassps 0x20), then in integer operations. The bf16 levels'
 * pair stores (the bf16 Winograd's transforms and weight packs). */
static inline __m512i cf__bf16_pairs(__m512 lo, __m512 hi) {
    if (__builtin_expect((_mm512_fpclass_ps_mask(lo, 0x20) | _mm512_fpclass_ps_mask(hi, 0x20)) != 0,
                         0))
        return _mm512_or_si512(cf__bf16_round_lanes(lo),
                               _mm512_slli_epi32(cf__bf16_round_lanes(hi), 16));
    return cf__bf16_pairs_plain(lo, hi);
}
#endif

#endif
