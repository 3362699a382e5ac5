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

static inline void wino_store_pairs(uint32_t *p, int n, __m512 lo, __m512 hi) {
    const __m512i w = cf__bf16_pairs(lo, hi);
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

/* ---- the pair stores without a subnormal test per vector -----------------------------------
 *
 * cf__bf16_pairs tests both vectors for subnormal lanes (which vcvtne2ps2bf16 reads as zero) before
 * every store: two vfpclassps, a mask or and a branch for 16 words. The transforms' values are
 * sums and differences (no products) of the layer's values and +0. A finite value that is 0 or
 * at least 2^-103 in magnitude is a multiple of 2^-126, and so is every sum or difference of two
 * such: the exact result is one; under 2^-102 in magnitude it has at most 24 significant bits
 * and is the float result, and a float of 2^-102 or more has its last place at 2^-125 or above.
 * A nonzero multiple of 2^-126 is normal, so no value computed from such inputs is subnormal
 * (infinities and NaNs give infinities and NaNs). Where the inputs of a window (dy_pairs_nchw:
 * checked as they are loaded for the transposition) or of a vector of tiles (short_input and
 * the 32k-column planes' direct transforms: its patch rows, in registers, with the lanes before
 * and after them that the row sums read) hold no value with 0 < |x| < 2^-100, the words are
 * stored with cf__bf16_pairs_plain or vcvtneps2bf16 alone, which then make cf__bf16_pairs's and
 * wino_store_bf16's words; elsewhere every vector is tested as before (test_wino_transforms:
 * inputs of 2^-126 .. 2^-100 whose differences are subnormal, alone in a pair's second channel
 * or a later block of channels, and subnormal inputs). A separate pass over the rows that a call
 * or a plane reads, before the transforms, cost more than it saved (perf: 0.18 -> 0.20 of the
 * products' samples for all the input transforms). */
enum { TINY_BITS = 0x0d800000 }; /* 2^-100 */

/* acc lane by lane the smaller with 2 |v| - 1 (v's bits without the sign, then 1 less): after
 * all the inputs, some lane is under 2 TINY_BITS - 1 iff one was 0 < |x| < 2^-100 (0 gives
 * 2^32 - 1; infinities and NaNs are above) */
static inline __m512i tiny_acc(__m512i acc, __m512 v) {
    return _mm512_min_epu32(
        acc, _mm512_sub_epi32(_mm512_slli_epi32(_mm512_castps_si512(v), 1), _mm512_set1_epi32(1)));
}

static inline bool tiny_any(__m512i acc) {
    return _mm512_cmplt_epu32_mask(acc, _mm512_set1_epi32(2 * TINY_BITS - 1)) != 0;
}

/* the first n words bf16(lo) | bf16(hi) << 16 at p; plain: no subnormal can be among them */
static inline __attribute__((always_inline)) void store_pairs_as(uint32_t *p, int n, bool plain,
                                                                 __m512 lo, __m512 hi) {
    cf__store_words(p, n, plain ? cf__bf16_pairs_plain(lo, hi) : cf__bf16_pairs(lo, hi));
}

/* the first n values bf16(v) at p; plain: no subnormal can be among them */
static inline __attribute__((always_inline)) void store_bf16_as(uint16_t *p, int n, bool plain,
                                                                __m512 v) {
    if (!plain) {
        wino_store_bf16(p, n, v);
        return;
    }
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    if (n >= 16)
        _mm256_storeu_si256((__m256i *)p, h);
    else
        _mm256_mask_storeu_epi16(p, (__mmask16)((1u << n) - 1u), h);
}

/* ---- input_pairs and input_bf16 straight from the image, on planes of 32k columns ----------
 *
 * loops_wino_input_pairs and _input_bf16 split each plane into its tiles' four patch columns
 * (wino_split_plane: four loads, two unzips and four stores per image row, into eight arrays),
 * then load 16 vectors of those arrays per vector of tiles. On planes whose rows are a whole
 * number of vectors of tiles (w = 2 tw, tw a multiple of 16: W3's 32 x 32 layers, 64 x 64 ...)
 * the columns are taken from registers instead: B^T's row sums (d0 - d2, d1 + d2, d2 - d1,
 * d1 - d3) are formed on whole image rows first, then each such
 * row R is unzipped into its even and odd lanes, R[2u] (patch column 1) and R[2u + 1] (column
 * 2), and columns 0 and 3, R[2u - 1] and R[2u + 2], are those shifted by one lane (valignd), the
 * lane that crosses into the next 32 columns taken from the image too (0 at the plane's edges).
 * Each value is the same float operation on the same operands as the split's path (splitting
 * is a permutation; a row sum of two columns is the column of the row sum; rows and columns
 * outside the image are +0 both ways and go through the same additions), so the words are
 * bitwise the same (test_wino_transforms' direct cases; the NaN an operation returns among two
 * NaN operands is the compiler's choice in both, as the test notes). */

/* 16 values of x's row r (0 <= r < h; else +0) from column c0, the lanes of `lanes` only */
static inline __m512 row_lanes(const float *p, int h, int w, int r, int c0, __mmask16 lanes) {
    if (r < 0 || r >= h) return _mm512_setzero_ps();
    return lanes == 0xffff ? _mm512_loadu_ps(p + (size_t)r * w + c0)
                           : _mm512_maskz_loadu_ps(lanes, p + (size_t)r * w + c0);
}

/* B^T's row sum i of the patch rows 2ty - 1 .. 2ty + 2 (d0 .. d3), in loops_wino_input's
 * operand order: d0 - d2, d1 + d2, d2 - d1, d1 - d3 */
static inline __m512 row_sum(const float *p, int h, int w, int ty, int i, int c0, __mmask16 lanes) {
    const int r = 2 * ty - 1;
    switch (i) {
    case 0:
        return _mm512_sub_ps(row_lanes(p, h, w, r, c0, lanes),
                             row_lanes(p, h, w, r + 2, c0, lanes));
    case 1:
        return _mm512_add_ps(row_lanes(p, h, w, r + 1, c0, lanes),
                             row_lanes(p, h, w, r + 2, c0, lanes));
    case 2:
        return _mm512_sub_ps(row_lanes(p, h, w, r + 2, c0, lanes),
                             row_lanes(p, h, w, r + 1, c0, lanes));
    default:
        return _mm512_sub_ps(row_lanes(p, h, w, r + 1, c0, lanes),
                             row_lanes(p, h, w, r + 3, c0, lanes));
    }
}

/* The patch rows 2ty - 1 .. 2ty + 2 of the 16 tiles from 16 j in tile row ty of plane p: r[a][0]
 * and r[a][1], columns c0 .. c0 + 31 (c0 = 32 j; +0 for rows outside the image), loaded once for
 * the four row sums; into *tiny (tiny_acc) with the lanes before and after them that the row
 * sums also read (columns c0 - 1 and c0 + 32, where in the plane) */
static inline __attribute__((always_inline)) void
direct_load(const float *p, int h, int w, int ty, int j, __m512 r[4][2], __m512i *tiny) {
    const int c0 = 32 * j, r0 = 2 * ty - 1;
    __m512i acc = *tiny;
    for (int a = 0; a < 4; a++) {
        r[a][0] = row_lanes(p, h, w, r0 + a, c0, 0xffff);
        r[a][1] = row_lanes(p, h, w, r0 + a, c0 + 16, 0xffff);
        acc = tiny_acc(tiny_acc(acc, r[a][0]), r[a][1]);
        if (c0 > 0) acc = tiny_acc(acc, row_lanes(p, h, w, r0 + a, c0 - 16, 0x8000));
        if (c0 + 32 < w) acc = tiny_acc(acc, row_lanes(p, h, w, r0 + a, c0 + 32, 0x0001));
    }
    *tiny = acc;
}

/* row_sum i of the loaded patch rows r, half k */
static inline __attribute__((always_inline)) __m512 loaded_sum(__m512 r[4][2], int i, int k) {
    return i == 0   ? _mm512_sub_ps(r[0][k], r[2][k])
           : i == 1 ? _mm512_add_ps(r[1][k], r[2][k])
           : i == 2 ? _mm512_sub_ps(r[2][k], r[1][k])
                    : _mm512_sub_ps(r[1][k], r[3][k]);
}

/* V's points 4i .. 4i + 3 of the 16 tiles from 16 j in tile row ty of plane p (w = 32 k), from
 * their patch rows r (direct_load; the lanes before and after them loaded here) */
static inline __attribute__((always_inline)) void
direct_points(const float *p, int h, int w, int ty, int j, int i, __m512 r[4][2], __m512 out[4]) {
    const int c0 = 32 * j;
    const __m512 lo = loaded_sum(r, i, 0), hi = loaded_sum(r, i, 1);
    /* R[c0 - 1] in lane 15 and R[c0 + 32] in lane 0 (+0 outside the plane) */
    const __m512 before = c0 > 0 ? row_sum(p, h, w, ty, i, c0 - 16, 0x8000) : _mm512_setzero_ps();
    const __m512 after =
        c0 + 32 < w ? row_sum(p, h, w, ty, i, c0 + 32, 0x0001) : _mm512_setzero_ps();
    __m512 ev, od;
    V_UNZIP(lo, hi, ev, od);
    const __m512 col0 = _mm512_castsi512_ps(
        _mm512_alignr_epi32(_mm512_castps_si512(od), _mm512_castps_si512(before), 15));
    const __m512 col3 = _mm512_castsi512_ps(
        _mm512_alignr_epi32(_mm512_castps_si512(after), _mm512_castps_si512(ev), 1));
    /* t B: t0 - t2, t1 + t2, t2 - t1, t1 - t3 (WINO_T_B) */
    out[0] = _mm512_sub_ps(col0, od);
    out[1] = _mm512_add_ps(ev, od);
    out[2] = _mm512_sub_ps(od, ev);
    out[3] = _mm512_sub_ps(ev, col3);
}

/* V's 16 points of a vector of tiles (tile row ty, columns from 32 j) of the planes p0 and p1
 * (pairs; two: p1 is the call's, else +0) from their loaded patch rows ra and rb, stored at out:
 * pairs, or bf16 values of p0 (p1 NULL); plain: no subnormal can be among them */
static inline __attribute__((always_inline)) void
direct_emit(const float *p0, const float *p1, bool two, int h, int w, int ty, int j,
            __m512 ra[4][2], __m512 rb[4][2], void *out, size_t v_xi, int left, bool plain) {
    for (int i = 0; i < 4; i++) {
        __m512 a[4], b[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                             _mm512_setzero_ps()};
        direct_points(p0, h, w, ty, j, i, ra, a);
        if (!p1) {
            for (int k = 0; k < 4; k++)
                store_bf16_as((uint16_t *)out + (size_t)(4 * i + k) * v_xi, left, plain, a[k]);
            continue;
        }
        if (two) direct_points(p1, h, w, ty, j, i, rb, b);
        for (int k = 0; k < 4; k++)
            store_pairs_as((uint32_t *)out + (size_t)(4 * i + k) * v_xi, left, plain, a[k], b[k]);
    }
}

/* The vector of tiles from t0 of one plane's band (p0, and p1 for pairs) as direct_emit stores
 * it: the patch rows loaded once and checked, so that the stores go without the subnormal test
 * where they allow */
static inline __attribute__((always_inline)) void direct_stores(const float *p0, const float *p1,
                                                                bool two, int h, int w, int ty0,
                                                                int t0, void *out, size_t v_xi,
                                                                int left) {
    const int tw = w / 2, ty = ty0 + t0 / tw, j = t0 % tw / 16;
    __m512 ra[4][2], rb[4][2];
    __m512i tiny = _mm512_set1_epi32(-1);
    direct_load(p0, h, w, ty, j, ra, &tiny);
    if (two)
        direct_load(p1, h, w, ty, j, rb, &tiny);
    else /* not read */
        for (int a = 0; a < 4; a++) rb[a][0] = rb[a][1] = _mm512_setzero_ps();
    if (tiny_any(tiny))
        direct_emit(p0, p1, two, h, w, ty, j, ra, rb, out, v_xi, left, false);
    else
        direct_emit(p0, p1, two, h, w, ty, j, ra, rb, out, v_xi, left, true);
}

/* Planes the direct transforms take: rows of whole vectors of tiles. Rows of 2, 4 and 8 tiles
 * (4 x 4 to 16 x 16 planes) take short_input below; a first form of it with masked loads at lane
 * g w (one plane's band a vector, in this branch's history) measured slower than the split on
 * Zen 5 (bench_conv's 256 -> 256 8 x 8 layer 7.3 / 19.7 -> 8.7 / 22.6 ms forward / backward). */
static bool direct_fits(int w) {
    return w >= 32 && w % 32 == 0;
}

/* The band's rows of the next plane into the caches, as wino_split_plane does: the hardware
 * prefetcher follows one plane's rows but not the jump to the next plane. */
static void direct_prefetch(const float *next, int h, int w, int ty0, int th) {
    if (!next) return;
    const int lo = 2 * ty0 - 1 < 0 ? 0 : 2 * ty0 - 1;
    const int hi = 2 * (ty0 + th) + 1 < h ? 2 * (ty0 + th) + 1 : h;
    for (int r = lo; r < hi; r++)
        for (int c = 0; c < w; c += 16)
            _mm_prefetch((const char *)(next + (size_t)r * w + c), _MM_HINT_T0);
}

/* ---- input_pairs and input_bf16 on planes of 4, 8 and 16 columns ----------------------------
 *
 * These planes took the split (wino_split_plane: per image row masked loads, unzips and stores
 * into eight column arrays, then 16 loads per vector of tiles), and a vector ran over one plane's
 * band of tiles: 4 of 16 lanes on a 4 x 4 plane. Here a vector holds 16 / tw consecutive tile
 * rows of the call (image after image: V's tiles of a channel are consecutive across the images,
 * t = n * band + local tile) and is formed in registers: patch row a (0..3) of those tile rows,
 * each row's w values side by side, is two vectors of whole image rows (32 / w row loads, +0 for
 * rows outside the image or past the call's tiles); B^T's row sums (d0 - d2, d1 + d2, d2 - d1,
 * d1 - d3) are taken on them, unzipped into patch columns 1 and 2 (R[2u], R[2u + 1]), and
 * columns 0 and 3 (R[2u - 1], R[2u + 2]) are those moved by one lane within each tile row, +0
 * at its ends (a zero-masked permute). Each value is the same float operation on the same
 * operands as the split's path (a permutation of its columns, the same +0 outside the image), so
 * the words are bitwise the same (test_wino_transforms' direct cases). The form measured slower
 * with masked loads at lane g w (see direct_fits) is not this one: here the rows come in with
 * plain loads and inserts, and vectors are full across images. */

enum { SHORT_ROWS = 8 }; /* tile rows a vector at most (w = 4) */

/* a vector's tile rows: the offset of patch row 0 of each from the channel's plane in image 0
 * (n x_image + (2 ty - 1) w), and which of its four patch rows lie in the image (bit a) */
typedef struct {
    ptrdiff_t base[SHORT_ROWS];
    unsigned valid[SHORT_ROWS];
} short_vec;

/* patch row a of tile row g (w values; +0 where it is not in the image) */
static inline __attribute__((always_inline)) __m128 row4(const float *xc, const short_vec *s, int g,
                                                         int a) {
    return s->valid[g] >> a & 1 ? _mm_loadu_ps(xc + s->base[g] + 4 * a) : _mm_setzero_ps();
}
static inline __attribute__((always_inline)) __m256 row8(const float *xc, const short_vec *s, int g,
                                                         int a) {
    return s->valid[g] >> a & 1 ? _mm256_loadu_ps(xc + s->base[g] + 8 * a) : _mm256_setzero_ps();
}

/* half k (0, 1) of patch row a of the vector's tile rows: tile rows k 16 / w .. (k + 1) 16 / w - 1
 */
static inline __attribute__((always_inline)) __m512 short_half(const float *xc, const short_vec *s,
                                                               int w, int a, int k) {
    if (w == 16)
        return s->valid[k] >> a & 1 ? _mm512_loadu_ps(xc + s->base[k] + 16 * a)
                                    : _mm512_setzero_ps();
    if (w == 8)
        return _mm512_insertf32x8(_mm512_castps256_ps512(row8(xc, s, 2 * k, a)),
                                  row8(xc, s, 2 * k + 1, a), 1);
    const __m256 lo = _mm256_insertf128_ps(_mm256_castps128_ps256(row4(xc, s, 4 * k, a)),
                                           row4(xc, s, 4 * k + 1, a), 1);
    const __m256 hi = _mm256_insertf128_ps(_mm256_castps128_ps256(row4(xc, s, 4 * k + 2, a)),
                                           row4(xc, s, 4 * k + 3, a), 1);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

/* patch rows 0..3 of the vector's tile rows of one channel (xc: its plane in image 0), two
 * vectors each */
static inline __attribute__((always_inline)) void short_load(const float *xc, const short_vec *s,
                                                             int w, __m512 p[4][2]) {
    for (int a = 0; a < 4; a++)
        for (int k = 0; k < 2; k++) p[a][k] = short_half(xc, s, w, a, k);
}

/* V's points 4i .. 4i + 3 of the vector's tiles from their patch rows p */
static inline __attribute__((always_inline)) void short_points(__m512 p[4][2], int w, int i,
                                                               __m512 out[4]) {
    const int tw = w / 2;
    /* lanes L - 1 and L + 1, and the lanes that have them within their tile row */
    const __m512i prev = _mm512_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14);
    const __m512i next = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 15);
    const __mmask16 first = tw == 8 ? 0x0101 : tw == 4 ? 0x1111 : 0x5555;
    const __mmask16 has_prev = (__mmask16)~first, has_next = (__mmask16) ~(first << (tw - 1));
    __m512 r[2];
    for (int k = 0; k < 2; k++) /* B^T's row sum i, in loops_wino_input's operand order */
        r[k] = i == 0   ? _mm512_sub_ps(p[0][k], p[2][k])
               : i == 1 ? _mm512_add_ps(p[1][k], p[2][k])
               : i == 2 ? _mm512_sub_ps(p[2][k], p[1][k])
                        : _mm512_sub_ps(p[1][k], p[3][k]);
    __m512 ev, od;
    V_UNZIP(r[0], r[1], ev, od);
    const __m512 col0 = _mm512_maskz_permutexvar_ps(has_prev, prev, od);
    const __m512 col3 = _mm512_maskz_permutexvar_ps(has_next, next, ev);
    /* t B: t0 - t2, t1 + t2, t2 - t1, t1 - t3 (WINO_T_B) */
    out[0] = _mm512_sub_ps(col0, od);
    out[1] = _mm512_add_ps(ev, od);
    out[2] = _mm512_sub_ps(od, ev);
    out[3] = _mm512_sub_ps(ev, col3);
}

/* The call's tile rows from (n, ty) on: the vector's 16 / tw of them into s, (n, ty) moved past
 * them; rows past the call's n_images are all +0. */
static inline __attribute__((always_inline)) void short_rows_of(int h, int w, int n_images,
                                                                size_t x_image, int ty0, int th,
                                                                int *n, int *ty, short_vec *s) {
    const int per = 32 / w;
    for (int g = 0; g < per; g++) {
        const int r0 = 2 * *ty - 1;
        s->base[g] = (ptrdiff_t)(*n * x_image) + (ptrdiff_t)r0 * w;
        unsigned bits = 0;
        if (*n < n_images)
            for (int a = 0; a < 4; a++) bits |= (unsigned)(r0 + a >= 0 && r0 + a < h) << a;
        s->valid[g] = bits;
        if (++*ty == ty0 + th) *ty = ty0, ++*n;
    }
}

/* whether a vector's patch rows p hold a value 0 < |x| < 2^-100 (tiny_acc) */
static inline __attribute__((always_inline)) __m512i short_tiny(__m512i acc, __m512 p[4][2]) {
    for (int a = 0; a < 4; a++)
        for (int k = 0; k < 2; k++) acc = tiny_acc(acc, p[a][k]);
    return acc;
}

/* V's 16 points of a vector of tiles from its patch rows, stored: bf16 values at out (pb NULL),
 * else pairs with pb's channel (two: pb holds one) */
static inline __attribute__((always_inline)) void short_stores(__m512 pa[4][2], __m512 pb[4][2],
                                                               bool two, int w, void *out,
                                                               size_t v_xi, int left, bool plain) {
    for (int i = 0; i < 4; i++) {
        __m512 a[4], b[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                             _mm512_setzero_ps()};
        short_points(pa, w, i, a);
        if (!pb) {
            for (int k = 0; k < 4; k++)
                store_bf16_as((uint16_t *)out + (size_t)(4 * i + k) * v_xi, left, plain, a[k]);
            continue;
        }
        if (two) short_points(pb, w, i, b);
        for (int k = 0; k < 4; k++)
            store_pairs_as((uint32_t *)out + (size_t)(4 * i + k) * v_xi, left, plain, a[k], b[k]);
    }
}

static inline __attribute__((always_inline)) void short_input(const float *x, int channels, int h,
                                                              int w, int n_images, size_t x_image,
                                                              int ty0, int th, void *v, size_t v_xi,
                                                              int ldv, bool pairs) {
    const int tiles = n_images * th * (w / 2);
    const size_t plane = (size_t)h * w;
    /* vectors of tiles outside, channels inside: the loads run through each image's channels
     * in order (with the channels outside, they jumped an image apart, 32 KiB on W3's 512 x 4 x
     * 4, each a new line); two vectors a group where a vector's stores are half lines (bf16) */
    const int per = pairs || w == 16 ? 1 : 2;
    int n = 0, ty = ty0;
    for (int g0 = 0; g0 < tiles; g0 += 16 * per) {
        short_vec s[2];
        for (int u = 0; u < per; u++)
            short_rows_of(h, w, n_images, x_image, ty0, th, &n, &ty, &s[u]);
        for (int c = 0; c < channels; c += pairs ? 2 : 1) {
            const float *x0 = x + (size_t)c * plane, *x1 = x0 + plane;
            const bool two = pairs && c + 1 < channels;
            for (int u = 0; u < per; u++) {
                const int t0 = g0 + 16 * u;
                if (t0 >= tiles) break;
                const int left = tiles - t0 < 16 ? tiles - t0 : 16;
                __m512 pa[4][2], pb[4][2];
                short_load(x0, &s[u], w, pa);
                __m512i tiny = short_tiny(_mm512_set1_epi32(-1), pa);
                void *out;
                if (!pairs) {
                    out = (uint16_t *)v + (size_t)c * ldv + t0;
                } else {
                    if (two) {
                        short_load(x1, &s[u], w, pb);
                        tiny = short_tiny(tiny, pb);
                    } else /* channel c + 1 past the call's: its half of the words is +0 */
                        for (int a = 0; a < 4; a++) pb[a][0] = pb[a][1] = _mm512_setzero_ps();
                    out = (uint32_t *)v + (size_t)(c / 2) * ldv + t0;
                }
                if (tiny_any(tiny))
                    short_stores(pa, pairs ? pb : NULL, two, w, out, v_xi, left, false);
                else
                    short_stores(pa, pairs ? pb : NULL, two, w, out, v_xi, left, true);
            }
        }
    }
}

/* the planes short_input takes, and the call for each width (w a constant inside) */
static bool short_fits(int w) {
    return w == 4 || w == 8 || w == 16;
}

static void short_input_w(const float *x, int channels, int h, int w, int n_images, size_t x_image,
                          int ty0, int th, void *v, size_t v_xi, int ldv, bool pairs) {
#define SHORT_W(W)                                                                                 \
    case W:                                                                                        \
        if (pairs)                                                                                 \
            short_input(x, channels, h, W, n_images, x_image, ty0, th, v, v_xi, ldv, true);        \
        else                                                                                       \
            short_input(x, channels, h, W, n_images, x_image, ty0, th, v, v_xi, ldv, false);       \
        return
    switch (w) {
        SHORT_W(4);
        SHORT_W(8);
        SHORT_W(16);
    default:
        return;
    }
#undef SHORT_W
}

static void input_pairs(const float *x, int channels, int h, int w, int n_images, size_t x_image,
                        int ty0, int th, uint32_t *v, size_t v_xi, int ldv, float *pad) {
    if (short_fits(w)) {
        short_input_w(x, channels, h, w, n_images, x_image, ty0, th, v, v_xi, ldv, true);
        return;
    }
    if (!direct_fits(w)) {
        loops_wino_input_pairs(x, channels, h, w, n_images, x_image, ty0, th, v, v_xi, ldv, pad);
        return;
    }
    const int tiles = th * (w / 2);
    const size_t plane = (size_t)h * w;
    for (int n = 0; n < n_images; n++)
        for (int c = 0; c < channels; c += 2) {
            const float *p0 = x + (size_t)n * x_image + (size_t)c * plane, *p1 = p0 + plane;
            const bool two = c + 1 < channels;
            const float *next = c + 2 < channels   ? p0 + 2 * plane
                                : n + 1 < n_images ? x + (size_t)(n + 1) * x_image
                                                   : NULL;
            direct_prefetch(next, h, w, ty0, th);
            if (next && c + 3 < channels) direct_prefetch(next + plane, h, w, ty0, th);
            uint32_t *out = v + (size_t)(c / 2) * ldv + (size_t)n * tiles;
            for (int t0 = 0; t0 < tiles; t0 += 16)
                direct_stores(p0, p1, two, h, w, ty0, t0, out + t0, v_xi,
                              tiles - t0 < 16 ? tiles - t0 : 16);
        }
}

static void input_bf16(const float *x, int channels, int h, int w, int n_images, size_t x_image,
                       int ty0, int th, uint16_t *v, size_t v_xi, int ldv, float *pad) {
    if (short_fits(w)) {
        short_input_w(x, channels, h, w, n_images, x_image, ty0, th, v, v_xi, ldv, false);
        return;
    }
    if (!direct_fits(w)) {
        loops_wino_input_bf16(x, channels, h, w, n_images, x_image, ty0, th, v, v_xi, ldv, pad);
        return;
    }
    const int tiles = th * (w / 2);
    const size_t plane = (size_t)h * w;
    for (int n = 0; n < n_images; n++)
        for (int c = 0; c < channels; c++) {
            const float *p = x + (size_t)n * x_image + (size_t)c * plane;
            const float *next = c + 1 < channels   ? p + plane
                                : n + 1 < n_images ? x + (size_t)(n + 1) * x_image
                                                   : NULL;
            direct_prefetch(next, h, w, ty0, th);
            uint16_t *out = v + (size_t)c * ldv + (size_t)n * tiles;
            for (int t0 = 0; t0 < tiles; t0 += 16)
                direct_stores(p, NULL, false, h, w, ty0, t0, out + t0, v_xi,
                              tiles - t0 < 16 ? tiles - t0 : 16);
        }
}

/* ---- the output transform on planes of 4, 8 and 16 columns ----------------------------------
 *
 * loops_wino_output's short-row form (wino_output_short) runs its vectors over one image's band
 * of tiles at a time, zips each vector's two output rows into a buffer on the stack and copies
 * them out a tile row (g = w floats) at a time: 4 x 4 planes fill 4 of 16 lanes (an image's band
 * is 4 tiles), and every vector went through 4 stores, then 8 to 16 loads and stores of 16 to
 * 64 bytes. Here the vectors run over all of a channel's tiles of the call, image after image
 * (M's tiles of a channel are consecutive across the images: t = n * band + local tile), and the
 * zipped rows are dealt into place with 128-bit lane shuffles: a tile row's two output rows are
 * 2 g adjacent floats of y (rows 2 ty and 2 ty + 1 of its image), so with w = 2 tw
 *   g = 16  two tile rows a vector: each row's lo / hi half is a whole output row
 *   g = 8   four: tile row j's 16 floats are the j-th 256-bit halves of the two rows' zips
 *   g = 4   eight: tile rows 2m and 2m + 1 are the m-th 128-bit lanes of the two zips
 * The same sums of the same M as wino_output_short and loops_wino_output (test_wino_transforms:
 * odd bands, bands crossing images inside a vector, tails). */

/* the 2 g floats of tile row R of the call (image R / th, tile row ty0 + R % th), channel k */
static inline float *short_rows(float *y, size_t y_image, size_t k_plane, int g, int ty0, int th,
                                int R) {
    return y + (size_t)(R / th) * y_image + k_plane + (size_t)(2 * (ty0 + R % th)) * g;
}

static void output(const float *m, size_t m_xi, int ldm, int channels, int h, int w, int n_images,
                   int ty0, int th, float *y, size_t y_image) {
    if (h % 2 || !(w == 4 || w == 8 || w == 16)) {
        loops_wino_output(m, m_xi, ldm, channels, h, w, n_images, ty0, th, y, y_image);
        return;
    }
    const int g = w, tw = w / 2, tiles = n_images * th * tw;
    for (int k = 0; k < channels; k++) {
        const float *mk = m + (size_t)k * ldm;
        const size_t k_plane = (size_t)k * h * w;
        for (int t0 = 0; t0 < tiles; t0 += 16) {
            const int n_t = tiles - t0, R0 = t0 / tw;
            const int rows = (n_t < 16 ? n_t : 16) / tw; /* tile rows in this vector */
            vf a[4], b[4];
            wino_out_columns(mk + t0, m_xi, n_t, a, b);
            const vf y00 = V_ADD(V_ADD(a[0], a[1]), a[2]);
            const vf y01 = V_ADD(V_ADD(b[0], b[1]), b[2]);
            const vf y10 = V_SUB(V_SUB(a[1], a[2]), a[3]);
            const vf y11 = V_SUB(V_SUB(b[1], b[2]), b[3]);
            vf lo0, hi0, lo1, hi1; /* the zipped first and second output rows */
            V_ZIP(y00, y01, lo0, hi0);
            V_ZIP(y10, y11, lo1, hi1);
            if (g == 16) {
                const vf r0[2] = {lo0, hi0}, r1[2] = {lo1, hi1};
                for (int j = 0; j < rows; j++) {
                    float *out = short_rows(y, y_image, k_plane, g, ty0, th, R0 + j);
                    _mm512_storeu_ps(out, r0[j]);
                    _mm512_storeu_ps(out + 16, r1[j]);
                }
            } else if (g == 8) {
                const vf v[4] = {
                    _mm512_shuffle_f32x4(lo0, lo1, 0x44), _mm512_shuffle_f32x4(lo0, lo1, 0xee),
                    _mm512_shuffle_f32x4(hi0, hi1, 0x44), _mm512_shuffle_f32x4(hi0, hi1, 0xee)};
                for (int j = 0; j < rows; j++)
                    _mm512_storeu_ps(short_rows(y, y_image, k_plane, g, ty0, th, R0 + j), v[j]);
            } else { /* g == 4: 128-bit lanes [r0 2m, r1 2m, r0 2m+1, r1 2m+1] */
                const vf s[4] = {
                    _mm512_shuffle_f32x4(lo0, lo1, 0x44), _mm512_shuffle_f32x4(lo0, lo1, 0xee),
                    _mm512_shuffle_f32x4(hi0, hi1, 0x44), _mm512_shuffle_f32x4(hi0, hi1, 0xee)};
                for (int j = 0; j < rows; j += 2) {
                    const vf v = _mm512_shuffle_f32x4(s[j / 2], s[j / 2], 0xd8);
                    float *out = short_rows(y, y_image, k_plane, g, ty0, th, R0 + j);
                    if (j + 1 < rows) {
                        float *next = short_rows(y, y_image, k_plane, g, ty0, th, R0 + j + 1);
                        if (next == out + 8) {
                            _mm512_storeu_ps(out, v);
                            continue;
                        }
                        _mm256_storeu_ps(next, _mm512_extractf32x8_ps(v, 1));
                    }
                    _mm256_storeu_ps(out, _mm512_castps512_ps256(v));
                }
            }
        }
    }
}

/* ---- dy_pairs from the output gradient as the layer holds it --------------------------------
 *
 * The weight gradient's Mg^T pairs (loops_wino_dy_pairs) read dy pixel-major, so winograd.c
 * transposed each image of dy (K x h w floats, 256 KiB for W3's 64 x 32 x 32) into a copy that
 * dy_pairs then read back. Here the transposition goes by windows: the two image rows of a tile
 * row (up to 128 columns of them; a few tile rows on planes under 8 wide), with as many channels
 * as fit a 16 KiB buffer on the stack (W3's four shapes: all of them, but 256 of l4's 512),
 * transposed in registers 16 x 16 at a time and read at once from L1 by the tiles of the window,
 * each tile pair's words for all those channels in a row (as dy_pairs writes them: with 16
 * channels a window over 8 tile rows, the 16 x 16 planes' pairs came out 0.75x as fast as the
 * transposed copy's, 32 x 32 no faster; measured in a thread-CPU-time loop). Each Mg value is the
 * same operations on the same dy values as wino_dy_tile's (the copy is a permutation; channels past
 * the call's are 0 in the buffer and not stored), so the words are bitwise dy_pairs's on the
 * transposed copy (test_wino_transforms). Tile pairs stay within a window when the rows have an
 * even number of tiles, which the caller checks. */

/* a window: up to 128 columns of one tile row's two image rows (of a few tile rows on planes
 * under 8 wide); its channels in chunks whose transposed pixels fill at most 16 KiB */
enum { DY_WINDOW_COLS = 128, DY_WINDOW_FLOATS = 4096 };

/* r[i] lane j -> r[j] lane i (32-bit lanes). The loops unrolled (as dy_block's): left as loops,
 * GCC kept the 16 vectors in a stack array and copied it (rep movs), which made the whole
 * kernel slower than the transposed copy it replaces. */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    /* u[4 g + c], 128-bit lane L: rows 4 g .. 4 g + 3 of column 4 L + c */
#pragma GCC unroll 16
    for (int g = 0; g < 4; g++) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
#pragma GCC unroll 16
    for (int c = 0; c < 4; c++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        const __m512 w0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        const __m512 v1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_f32x4(v0, v1, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(v0, v1, 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(w0, w1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(w0, w1, 0xdd);
    }
}

/* n pixels (up to 16) from src of the nk channels (plane floats apart) into buf, pixel-major
 * (16 floats a pixel, lanes past nk 0); their values into *tiny (tiny_acc) */
static inline __attribute__((always_inline)) void dy_block(const float *src, size_t plane, int nk,
                                                           int n, float *buf, __m512i *tiny) {
    const __mmask16 lanes = (__mmask16)simd_first_lanes(n);
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_maskz_loadu_ps(i < nk ? lanes : 0, src + (size_t)(i < nk ? i : 0) * plane);
    __m512i acc = *tiny;
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc = tiny_acc(acc, r[i]);
    *tiny = acc;
    transpose16(r);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        if (j < n) _mm512_store_ps(buf + (size_t)j * 16, r[j]);
}

/* The Mg values of the tile pair whose first tile's pixel (0, 0) is at p00 in a window buffer of
 * rows of cw pixels (the second's 2 pixels on), as wino_dy_tile computes them (the same
 * operations on the same values), stored as pairs: out + xi m_xi, nk words. Row i of the 4 x 4
 * at a time, so that the two tiles' 32 vectors are not all live at once (GCC spilled them). */
static inline __attribute__((always_inline)) void dy_pair_tiles(const float *p00, int cw,
                                                                bool right_a, bool right_b,
                                                                bool down, uint32_t *out,
                                                                size_t m_xi, int nk, bool plain) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 y[2][4]; /* each tile's dY00, dY01, dY10, dY11 */
    for (int t = 0; t < 2; t++) {
        const float *p = p00 + 32 * t;
        const bool right = t ? right_b : right_a;
        y[t][0] = _mm512_load_ps(p);
        y[t][1] = right ? _mm512_load_ps(p + 16) : zero;
        y[t][2] = down ? _mm512_load_ps(p + (size_t)cw * 16) : zero;
        y[t][3] = right && down ? _mm512_load_ps(p + (size_t)(cw + 1) * 16) : zero;
    }
    for (int i = 0; i < 4; i++) {
        __m512 z[2][4];
        for (int t = 0; t < 2; t++) {
            /* A dY's row i: dY0, dY0 + dY1, dY0 - dY1, -dY1; then the same over its columns */
            const __m512 y0 = y[t][0], y1 = y[t][1], y2 = y[t][2], y3 = y[t][3];
            const __m512 r0 = i == 0   ? y0
                              : i == 1 ? _mm512_add_ps(y0, y2)
                              : i == 2 ? _mm512_sub_ps(y0, y2)
                                       : _mm512_sub_ps(zero, y2);
            const __m512 r1 = i == 0   ? y1
                              : i == 1 ? _mm512_add_ps(y1, y3)
                              : i == 2 ? _mm512_sub_ps(y1, y3)
                                       : _mm512_sub_ps(zero, y3);
            z[t][0] = r0;
            z[t][1] = _mm512_add_ps(r0, r1);
            z[t][2] = _mm512_sub_ps(r0, r1);
            z[t][3] = _mm512_sub_ps(zero, r1);
        }
        for (int j = 0; j < 4; j++)
            store_pairs_as(out + (size_t)(4 * i + j) * m_xi, nk, plain, z[0][j], z[1][j]);
    }
}

/* the pairs of a window's chunk of channels [c0, c1) from its transposed pixels in buf (P
 * pixels a block of 16 channels): nu tile rows from ty, columns [cs, cs + cw) */
static inline __attribute__((always_inline)) void
dy_window_pairs(const float *buf, int P, int cw, int cs, int w, int h, int n, int ty, int nu,
                int ty0, int th, int c0, int c1, int K, uint32_t *m, size_t m_xi, int ldm,
                bool plain) {
    const int tw = (w + 1) / 2, tx_end = (cs + cw + 1) / 2;
    for (int u = 0; u < nu; u++) {
        const bool down = 2 * (ty + u) + 1 < h;
        const size_t t_row = ((size_t)n * th + ty + u - ty0) * tw;
        for (int tx = cs / 2; tx < tx_end; tx += 2) {
            const size_t at = ((size_t)(2 * u) * cw + 2 * tx - cs) * 16;
            uint32_t *out = m + (t_row + tx) / 2 * ldm;
            for (int k0 = c0; k0 < c1; k0 += 16)
                dy_pair_tiles(buf + (size_t)(k0 - c0) * P + at, cw, 2 * tx + 1 < w, 2 * tx + 3 < w,
                              down, out + k0, m_xi, K - k0 < 16 ? K - k0 : 16, plain);
        }
    }
}

/* a window of dy_pairs_nchw's walk (image n, columns [cs, cs + cw), nu tile rows from ty: image
 * rows [r0, r0 + nr)) */
typedef struct {
    int n, cs, cw, ty, nu, r0, nr;
} dy_window;

static inline dy_window dy_window_at(int h, int w, int ty0, int th, int n, int cs, int ty) {
    dy_window d = {.n = n, .cs = cs, .ty = ty};
    d.cw = w - cs < DY_WINDOW_COLS ? w - cs : DY_WINDOW_COLS;
    /* tile rows a window: one, or as many as fill 16 pixels on planes under 8 wide */
    const int per = d.cw == w && d.cw < 8 ? 8 / d.cw : 1;
    d.nu = ty0 + th - ty < per ? ty0 + th - ty : per;
    d.r0 = 2 * ty;
    d.nr = h - d.r0 < 2 * d.nu ? h - d.r0 : 2 * d.nu;
    return d;
}

/* The lines of window d's channels [k0, k0 + nk) into the caches (dy: image 0, channel 0), while
 * the window before it is transposed: its channels' rows are a plane apart (4 KiB on 32 x 32),
 * streams the hardware prefetcher did not follow (perf annotate: most of the kernel's samples
 * were on those loads). */
static inline void dy_prefetch(const float *dy, size_t dy_image, size_t plane, int w,
                               const dy_window *d, int k0, int nk) {
    for (int k = k0; k < k0 + nk; k++) {
        const float *src = dy + (size_t)d->n * dy_image + (size_t)k * plane;
        for (int r = 0; r < d->nr; r++) {
            const float *row = src + (size_t)(d->r0 + r) * w + d->cs;
            const uintptr_t end = (uintptr_t)(row + d->cw);
            for (uintptr_t l = (uintptr_t)row & ~(uintptr_t)63; l < end; l += 64)
                _mm_prefetch((const char *)l, _MM_HINT_T0);
        }
    }
}

static void dy_pairs_nchw(const float *dy, size_t dy_image, int channels, int h, int w,
                          int n_images, int ty0, int th, uint32_t *m, size_t m_xi, int ldm) {
    const int K = channels;
    const size_t plane = (size_t)h * w;
    float buf[DY_WINDOW_FLOATS] __attribute__((aligned(64)));
    for (int n = 0; n < n_images; n++)
        for (int cs = 0; cs < w; cs += DY_WINDOW_COLS)
            for (int ty = ty0; ty < ty0 + th;) {
                const dy_window d = dy_window_at(h, w, ty0, th, n, cs, ty);
                const int cw = d.cw, nu = d.nu, r0 = d.r0, nr = d.nr;
                /* the window after this one, prefetched while this one is transposed */
                const bool more = ty + nu < ty0 + th || cs + DY_WINDOW_COLS < w || n + 1 < n_images;
                const dy_window next =
                    ty + nu < ty0 + th ? dy_window_at(h, w, ty0, th, n, cs, ty + nu)
                    : cs + DY_WINDOW_COLS < w
                        ? dy_window_at(h, w, ty0, th, n, cs + DY_WINDOW_COLS, ty0)
                        : dy_window_at(h, w, ty0, th, n + 1, 0, ty0);
                /* P pixels a block of 16 channels in the buffer; chunks of kc channels */
                const int P = 2 * nu * cw, kc = DY_WINDOW_FLOATS / 16 / P * 16;
                for (int c0 = 0; c0 < K; c0 += kc) {
                    const int c1 = K - c0 < kc ? K : c0 + kc;
                    __m512i tiny = _mm512_set1_epi32(-1);
                    for (int k0 = c0; k0 < c1; k0 += 16) {
                        const int nk = K - k0 < 16 ? K - k0 : 16;
                        const float *src = dy + (size_t)n * dy_image + (size_t)k0 * plane;
                        float *bk = buf + (size_t)(k0 - c0) * P;
                        if (more) dy_prefetch(dy, dy_image, plane, w, &next, k0, nk);
                        if (cw == w) /* the window's rows are one run of dy */
                            for (int p0 = 0; p0 < nr * w; p0 += 16)
                                dy_block(src + (size_t)r0 * w + p0, plane, nk,
                                         nr * w - p0 < 16 ? nr * w - p0 : 16, bk + (size_t)p0 * 16,
                                         &tiny);
                        else
                            for (int r = 0; r < nr; r++)
                                for (int x0 = 0; x0 < cw; x0 += 16)
                                    dy_block(src + (size_t)(r0 + r) * w + cs + x0, plane, nk,
                                             cw - x0 < 16 ? cw - x0 : 16,
                                             bk + ((size_t)r * cw + x0) * 16, &tiny);
                    }
                    if (tiny_any(tiny))
                        dy_window_pairs(buf, P, cw, cs, w, h, n, ty, nu, ty0, th, c0, c1, K, m,
                                        m_xi, ldm, false);
                    else
                        dy_window_pairs(buf, P, cw, cs, w, h, n, ty, nu, ty0, th, c0, c1, K, m,
                                        m_xi, ldm, true);
                }
                ty += nu;
            }
}

/* winograd_loops.h's table with the two inputs, the output and dy_pairs_nchw above */
static const cf_wino_kernels avx512_bf16_wino = {
    .short_row_cost = WINO_SHORT_ROW_COST,
    .input = loops_wino_input,
    .output = output,
    .dy_nhwc = loops_wino_dy_nhwc,
    .input_pairs = input_pairs,
    .dy_pairs = loops_wino_dy_pairs,
    .input_bf16 = input_bf16,
    .dy_pairs_nchw = dy_pairs_nchw,
};

const cf_wino_kernels *const cf_wino_avx512_bf16 = &avx512_bf16_wino;
#endif
