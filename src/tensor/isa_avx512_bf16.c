/* The bfloat16 kernels of the AVX512_BF16 level (AVX-512 F/BW/DQ/VL + AVX512_BF16): the
 * fp32 -> bf16 conversion and C (+)= bf16(A) . bf16(B) with fp32 accumulation through
 * vdpbf16ps. Compiled with those instruction sets whatever the build's baseline; used only when
 * the CPU reports all of them (isa.c builds the level's table from the AVX-512 one plus these).
 *
 * The GEMM packs both operands, rounding to bf16 as it copies: vdpbf16ps multiplies pairs of
 * bf16 values along k held in one 32-bit lane (a.lo * b.lo + a.hi * b.hi, summed into fp32), so
 * A is packed in blocks of MR rows (per k-pair, the MR rows' pairs side by side, each broadcast
 * to a vector) and B in panels of NR columns (per k-pair, the NR columns' pairs, read as NV
 * vectors). An odd k is padded with a zero, rows past m and columns past n with zero rows and
 * columns that are never stored. */
#if defined(__x86_64__)
#include "corefit/core.h"
#include "tensor/kernel_table.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MR 8         /* rows of a register tile */
#define NV 3         /* vectors of columns of a register tile: 8 x 3 accumulators */
#define NR (16 * NV) /* columns of a register tile */
#define KC2 128      /* k-pairs per packed block: a B panel of 24 KiB stays in L1 */

#include "tensor/bf16_lanes_avx512.h"

static inline __mmask16 lanes_below(int n) {
    return (__mmask16)(n >= 16 ? 0xffffu : n <= 0 ? 0u : (1u << n) - 1u);
}

static void bf16_from_fp32(const float *x, uint16_t *y, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtepi32_epi16(cf__bf16_round_lanes(_mm512_loadu_ps(x + i))));
    if (i < n) {
        const __mmask16 m = lanes_below((int)(n - i));
        _mm512_mask_cvtepi32_storeu_epi16(y + i, m,
                                          cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* An operand as the GEMM reads it: element (r, p) of the r-th row/column ("lane") and the p-th
 * step of k at src[r * lane_step + p * k_step]. */
typedef struct operand {
    const float *src;
    ptrdiff_t lane_step, k_step;
} operand;

static inline void transpose_words(__m512i r[16]);

/* Packs lanes [l0, l0 + nl) (nl <= width, lanes past nl zero) of k-pairs [q0, q0 + nq) into
 * out[q * width + l] = bf16(X(l, 2q)) | bf16(X(l, 2q + 1)) << 16, k past `k` zero. */
static void pack_pairs(const operand *x, int l0, int nl, int width, int q0, int nq, int k,
                       uint32_t *out) {
    if (x->lane_step == 1) { /* lanes contiguous: two k rows give 16 lanes' pairs at once */
        for (int q = 0; q < nq; q++) {
            const int p = 2 * (q0 + q);
            const float *r0 = x->src + p * x->k_step + l0, *r1 = r0 + x->k_step;
            for (int l = 0; l < width; l += 16) {
                const __mmask16 m = lanes_below(nl - l);
                const __m512i lo = cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m, r0 + l));
                const __m512i hi = p + 1 < k
                                       ? cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m, r1 + l))
                                       : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(out + (size_t)q * width + l, lanes_below(width - l),
                                         _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
        return;
    }
    if (x->k_step == 1) { /* k contiguous: 32 values of a lane give its next 16 pairs */
        for (int lb = 0; lb < width; lb += 16) { /* 16 lanes at a time, transposed */
            const int lanes = width - lb < 16 ? width - lb : 16;
            for (int q = 0; q < nq; q += 16) {
                const int p = 2 * (q0 + q);
                __m512i r[16];
                for (int i = 0; i < 16; i++) {
                    const int l = lb + i, left = l < nl ? k - p : 0;
                    if (i >= lanes || left <= 0) {
                        r[i] = _mm512_setzero_si512();
                        continue;
                    }
                    const float *row = x->src + (ptrdiff_t)(l0 + l) * x->lane_step + p;
                    const __m512i lo =
                        cf__bf16_round_lanes(_mm512_maskz_loadu_ps(lanes_below(left), row));
                    const __m512i hi = cf__bf16_round_lanes(
                        _mm512_maskz_loadu_ps(lanes_below(left - 16), row + 16));
                    /* 32 bf16 in k order are 16 pairs: words 0-7 from lo, 8-15 from hi */
                    r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)),
                                              _mm512_cvtepi32_epi16(hi), 1);
                }
                transpose_words(r); /* r[t]: pair q + t of the 16 lanes */
                const int n = nq - q < 16 ? nq - q : 16;
                for (int t = 0; t < n; t++)
                    _mm512_mask_storeu_epi32(out + (size_t)(q + t) * width + lb, lanes_below(lanes),
                                             r[t]);
            }
        }
        return;
    }
    for (int q = 0; q < nq; q++) /* any other strides (not used by cf_sgemm_bf16) */
        for (int l = 0; l < width; l++) {
            const int p = 2 * (q0 + q);
            float v[2] = {0, 0};
            for (int h = 0; h < 2; h++)
                if (l < nl && p + h < k)
                    v[h] =
                        x->src[(ptrdiff_t)(l0 + l) * x->lane_step + (ptrdiff_t)(p + h) * x->k_step];
            uint16_t b[2];
            bf16_from_fp32(v, b, 2);
            out[(size_t)q * width + l] = (uint32_t)b[0] | (uint32_t)b[1] << 16;
        }
}

/* C (rows x the columns of cmask, row stride ldc) (+)= the MR x (16 nv) tile of A and B over nq
 * k-pairs (B's rows of pairs ldb words apart: NR in a packed panel; nv vectors of columns, the
 * panel's others padding that is neither computed nor stored). A packed (lda 0): pair q of row r
 * at ap[q * MR + r]; else rows of pairs lda words apart, ap[r * lda + q], the rows past `rows`
 * reading the last one (their sums are not stored). */
static inline __attribute__((always_inline)) void
tile_nv(int nv, int nq, const uint32_t *ap, size_t lda, const uint32_t *bp, size_t ldb, float *c,
        int ldc, int rows, const __mmask16 cmask[NV], bool accumulate) {
    __m512 acc[MR][NV];
    const uint32_t *ar[MR];
    for (int r = 0; r < MR; r++) {
        ar[r] = lda ? ap + (size_t)(r < rows ? r : rows - 1) * lda : ap + r;
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    }
    const size_t a_q = lda ? 1 : MR;
    for (int q = 0; q < nq; q++, bp += ldb) {
        __m512bh b[NV];
        for (int v = 0; v < nv; v++) b[v] = (__m512bh)_mm512_loadu_si512(bp + 16 * v);
        for (int r = 0; r < MR; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ar[r][q * a_q]);
            for (int v = 0; v < nv; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float *cr = c + (size_t)r * ldc;
        for (int v = 0; v < nv; v++) {
            __m512 s = acc[r][v];
            if (accumulate) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(cmask[v], cr + 16 * v));
            _mm512_mask_storeu_ps(cr + 16 * v, cmask[v], s);
        }
    }
}

/* The tile of the panel's nv vectors of columns that hold some of C's, B's rows of pairs ldb
 * words apart (NR for a packed panel; a column's sums do not depend on nv: the same products in
 * the same order). */
static void tile_strided(int nv, int nq, const uint32_t *ap, const uint32_t *bp, size_t ldb,
                         float *c, int ldc, int rows, const __mmask16 cmask[NV], bool accumulate) {
    if (nv >= 3)
        tile_nv(3, nq, ap, 0, bp, ldb, c, ldc, rows, cmask, accumulate);
    else if (nv == 2)
        tile_nv(2, nq, ap, 0, bp, ldb, c, ldc, rows, cmask, accumulate);
    else
        tile_nv(1, nq, ap, 0, bp, ldb, c, ldc, rows, cmask, accumulate);
}

/* The same with A's rows of pairs lda words apart (gemm_rows). */
static void tile_rows(int nv, int nq, const uint32_t *ap, size_t lda, const uint32_t *bp,
                      size_t ldb, float *c, int ldc, int rows, const __mmask16 cmask[NV],
                      bool accumulate) {
    if (nv >= 3)
        tile_nv(3, nq, ap, lda, bp, ldb, c, ldc, rows, cmask, accumulate);
    else if (nv == 2)
        tile_nv(2, nq, ap, lda, bp, ldb, c, ldc, rows, cmask, accumulate);
    else
        tile_nv(1, nq, ap, lda, bp, ldb, c, ldc, rows, cmask, accumulate);
}

/* The bf16 GEMMs' packing scratch of the calling thread (this file's and amx_tiles.h's), kept
 * between calls (a layer calls the GEMM once per image group, and allocating per call cost as
 * much as packing a small group) and freed when the thread ends. One buffer serves both levels:
 * a GEMM packs into it and computes without calling another GEMM. */
typedef struct pack_scratch {
    size_t words; /* capacity of data, in uint32_t */
    uint32_t *data;
} pack_scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_ok;

static void free_scratch(void *p) {
    pack_scratch *s = p;
    cf_free(s->data);
    cf_free(s);
}

static void make_scratch_key(void) {
    scratch_key_ok = pthread_key_create(&scratch_key, free_scratch) == 0;
}

uint32_t *cf__bf16_pack_scratch(size_t words) {
    (void)pthread_once(&scratch_once, make_scratch_key);
    if (!scratch_key_ok) return NULL; /* no key: the caller reports out of memory */
    pack_scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = cf_malloc(sizeof *s);
        if (!s) return NULL;
        *s = (pack_scratch){0, NULL};
        if (pthread_setspecific(scratch_key, s) != 0) {
            cf_free(s);
            return NULL;
        }
    }
    if (s->words < words) {
        uint32_t *grown = cf_malloc(words * sizeof(uint32_t));
        if (!grown) return NULL;
        cf_free(s->data);
        s->data = grown;
        s->words = words;
    }
    return s->data;
}

/* Words of A (m x k) packed whole: per k-block of KC2 pairs, its row blocks of MR rows. */
static size_t gemm_a_words(int m, int k) {
    return (size_t)(m + MR - 1) / MR * MR * (size_t)((k + 1) / 2);
}

/* Packs op(A) (m x k) whole into ap (gemm_a_words(m, k) words): per k-block, its row blocks. */
static void gemm_pack_a(bool trans_a, int m, int k, const float *a, int lda, uint32_t *ap) {
    const int row_blocks = (m + MR - 1) / MR, pairs = (k + 1) / 2;
    const operand A = {a, trans_a ? 1 : lda, trans_a ? lda : 1};
    for (int q0 = 0; q0 < pairs; q0 += KC2) {
        const int nq = pairs - q0 < KC2 ? pairs - q0 : KC2;
        uint32_t *ablock = ap + (size_t)row_blocks * MR * q0;
        for (int i = 0; i < row_blocks; i++)
            pack_pairs(&A, i * MR, m - i * MR, MR, q0, nq, k, ablock + (size_t)i * MR * nq);
    }
}

/* Rows [r0, r0 + nr) of A (m x k, row r at a + (r - r0) * lda; r0 a multiple of MR, nr too
 * unless r0 + nr = m) into ap as gemm_pack_a(false, m, k, ...) packs them: the same blocks and the
 * same pack_pairs calls on the same values, lanes past m zero. */
static void gemm_pack_a_rows(int m, int k, int r0, int nr, const float *a, int lda, uint32_t *ap) {
    const int row_blocks = (m + MR - 1) / MR, pairs = (k + 1) / 2;
    const operand A = {a, lda, 1};
    for (int q0 = 0; q0 < pairs; q0 += KC2) {
        const int nq = pairs - q0 < KC2 ? pairs - q0 : KC2;
        uint32_t *ablock = ap + (size_t)row_blocks * MR * q0;
        for (int i = r0 / MR; i * MR < r0 + nr; i++)
            pack_pairs(&A, i * MR - r0, r0 + nr - i * MR, MR, q0, nq, k,
                       ablock + (size_t)i * MR * nq);
    }
}

/* A (m x k) back from ap (gemm_pack_a's layout) as fp32, row r at a + r * lda. */
static void gemm_unpack_a(int m, int k, const uint32_t *ap, float *a, int lda) {
    const int row_blocks = (m + MR - 1) / MR, pairs = (k + 1) / 2;
    for (int q0 = 0; q0 < pairs; q0 += KC2) {
        const int nq = pairs - q0 < KC2 ? pairs - q0 : KC2;
        const uint32_t *ablock = ap + (size_t)row_blocks * MR * q0;
        for (int r = 0; r < m; r++) {
            const uint32_t *in = ablock + (size_t)(r / MR) * MR * nq + r % MR;
            float *out = a + (size_t)r * lda;
            for (int q = 0; q < nq; q++) {
                const int p = 2 * (q0 + q);
                const uint32_t word = in[(size_t)q * MR], lo = word << 16, hi = word & 0xffff0000u;
                memcpy(out + p, &lo, sizeof lo);
                if (p + 1 < k) memcpy(out + p + 1, &hi, sizeof hi);
            }
        }
    }
}

/* vfpclassps: a subnormal lane */
#define SUBNORMAL_LANES 0x20

static inline bool any_subnormal(__m512 a, __m512 b) {
    return __builtin_expect((_mm512_fpclass_ps_mask(a, SUBNORMAL_LANES) |
                             _mm512_fpclass_ps_mask(b, SUBNORMAL_LANES)) != 0,
                            0);
}

/* Every third value of the 48 in a, b, c from the s-th (lane i: value 3 i + s), s = 0, 1, 2:
 * values below 32 from a and b (vpermt2ps), the rest from c (vpermps merged into those lanes:
 * the index's low 4 bits are 3 i + s - 32 there). */
static inline void deal3(__m512 a, __m512 b, __m512 c, __m512 out[3]) {
    const __m512i idx0 =
        _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39, 42, 45);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i idx1 = _mm512_add_epi32(idx0, one), idx2 = _mm512_add_epi32(idx1, one);
    /* the lanes whose value is 32 or more: i >= 11, 11, 10 */
    out[0] = _mm512_mask_permutexvar_ps(_mm512_permutex2var_ps(a, idx0, b), 0xf800, idx0, c);
    out[1] = _mm512_mask_permutexvar_ps(_mm512_permutex2var_ps(a, idx1, b), 0xf800, idx1, c);
    out[2] = _mm512_mask_permutexvar_ps(_mm512_permutex2var_ps(a, idx2, b), 0xfc00, idx2, c);
}

/* The Winograd F(2x2, 3x3) weight transform U = G g G^T (winograd.c's weight_transform: the same
 * operations in the same order) of the 16 kernels side by side at k (kernel l's tap t at
 * k[9 l + t], or at k[9 l + 8 - t] when flipped), lanes l < n, the others zero: u[xi], one
 * vector per point. The 144 taps are loaded in a row (zero from 9 n on) and dealt out to the
 * taps in two rounds of every third value (deal3): value e = 9 l + t is 3 f + t % 3 with
 * f = 3 l + t / 3, so the first round splits the values by t % 3 (each as f in order) and the
 * second splits those by t / 3. 36 permutes (gathering the taps took 1.5 times as long as the
 * 117 permutes, compares and blends of one vpermt2ps per vector pair, which this replaces). */
static inline void wino_weights16(const float *k, bool flip, int n, __m512 u[16]) {
    __m512 v[9], f[3][3], g[9];
    for (int i = 0; i < 9; i++)
        v[i] = _mm512_maskz_loadu_ps(lanes_below(9 * n - 16 * i), k + 16 * i);
    for (int c = 0; c < 3; c++) { /* f[s][c]: values 48 c + 3 i + s */
        __m512 d[3];
        deal3(v[3 * c], v[3 * c + 1], v[3 * c + 2], d);
        for (int s = 0; s < 3; s++) f[s][c] = d[s];
    }
    for (int s = 0; s < 3; s++) { /* taps t = 3 r + s: f's value 3 l + r */
        __m512 d[3];
        deal3(f[s][0], f[s][1], f[s][2], d);
        for (int r = 0; r < 3; r++) g[flip ? 8 - (3 * r + s) : 3 * r + s] = d[r];
    }
    const __m512 half = _mm512_set1_ps(0.5f);
    __m512 a[4][3]; /* G g: rows g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2 */
    for (int j = 0; j < 3; j++) {
        const __m512 g0 = g[j], g1 = g[3 + j], g2 = g[6 + j];
        a[0][j] = g0;
        a[1][j] = _mm512_mul_ps(half, _mm512_add_ps(_mm512_add_ps(g0, g1), g2));
        a[2][j] = _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(g0, g1), g2));
        a[3][j] = g2;
    }
    for (int i = 0; i < 4; i++) { /* then G^T on the right, the same over the columns */
        const __m512 a0 = a[i][0], a1 = a[i][1], a2 = a[i][2];
        u[4 * i] = a0;
        u[4 * i + 1] = _mm512_mul_ps(half, _mm512_add_ps(_mm512_add_ps(a0, a1), a2));
        u[4 * i + 2] = _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(a0, a1), a2));
        u[4 * i + 3] = a2;
    }
}

/* Column pairs of wino_pack_a's words gathered in a buffer before they are copied out */
#define WINO_QB 8

/* Rows [r0, r0 + 16) (r0 a multiple of 16) of the 16 Winograd points' weight matrices (m x k;
 * the kernel of row r0 + i, column j at w + 9 i + j js: each column's 16 side by side),
 * transformed and packed into point xi's packed A at ap + xi * point_words: per pair of columns,
 * the 16 rows' words (the two columns rounded and paired, cf__bf16_pairs) of their two row blocks.
 * Bitwise gemm_pack_a on the fp32 matrices (the same values, rounded the same way; rows past m
 * and the high half past k zero).
 * The words of WINO_QB column pairs go to a buffer (8 KiB, in L1) and then out, a point's row
 * block at a time, WINO_QB x 32 bytes in a row: stored straight (32 bytes per point and block
 * per column pair), the 32 rows of lines written at once are point_words apart, a multiple of
 * 4 KiB for the large layers (512 KiB for 512 x 512 channels), so they share the caches' sets and
 * each half-written line was evicted and fetched again before its second half came (the stores
 * took 2/3 of the kernel on 512 x 512 channels). */
static void wino_pack_a(const float *w, size_t js, bool flip, int m, int k, int r0, uint32_t *ap,
                        size_t point_words) {
    const int row_blocks = (m + MR - 1) / MR, pairs = (k + 1) / 2, n = m - r0 < 16 ? m - r0 : 16;
    const int blocks = n > MR ? 2 : 1; /* the row blocks of these rows that exist */
    const float *wr = w;               /* row r0 */
    uint32_t buf[16][2][WINO_QB * MR] __attribute__((aligned(64)));
    for (int q0 = 0; q0 < pairs; q0 += KC2) {
        const int nq = pairs - q0 < KC2 ? pairs - q0 : KC2;
        const size_t base = (size_t)row_blocks * MR * q0 + (size_t)(r0 / MR) * MR * nq;
        for (int qb = 0; qb < nq; qb += WINO_QB) {
            const int nb = nq - qb < WINO_QB ? nq - qb : WINO_QB;
            for (int q = qb; q < qb + nb; q++) {
                const int j = 2 * (q0 + q);
                __m512 lo[16], hi[16];
                wino_weights16(wr + (size_t)j * js, flip, n, lo);
                if (j + 1 < k)
                    wino_weights16(wr + (size_t)(j + 1) * js, flip, n, hi);
                else
                    for (int xi = 0; xi < 16; xi++) hi[xi] = _mm512_setzero_ps();
                for (int xi = 0; xi < 16; xi++) {
                    const __m512i word = cf__bf16_pairs(lo[xi], hi[xi]);
                    _mm256_store_si256((__m256i *)&buf[xi][0][(q - qb) * MR],
                                       _mm512_castsi512_si256(word));
                    _mm256_store_si256((__m256i *)&buf[xi][1][(q - qb) * MR],
                                       _mm512_extracti64x4_epi64(word, 1));
                }
            }
            const int words = nb * MR; /* a multiple of 8 */
            for (int xi = 0; xi < 16; xi++)
                for (int bl = 0; bl < blocks; bl++) {
                    uint32_t *out = ap + (size_t)xi * point_words + base + (size_t)bl * MR * nq +
                                    (size_t)qb * MR;
                    int i = 0;
                    for (; i + 16 <= words; i += 16)
                        _mm512_storeu_si512(out + i, _mm512_load_si512(&buf[xi][bl][i]));
                    if (i < words)
                        _mm256_storeu_si256((__m256i *)(out + i),
                                            _mm256_load_si256((const __m256i *)&buf[xi][bl][i]));
                }
        }
    }
}

/* C (+)= A . op(B) with A packed by gemm_pack_a; B one NR-column panel at a time into bp (NR x
 * KC2 words), just before the row blocks read it, so the panel (24 KiB) is still in L1 and the
 * k-block of packed A (m x 2 KC2 bf16) stays in L2 across the panels. */
static void gemm_run(int m, int n, int k, const uint32_t *ap, const operand *B, uint32_t *bp,
                     float *c, int ldc, bool accumulate) {
    const int row_blocks = (m + MR - 1) / MR, panels = (n + NR - 1) / NR, pairs = (k + 1) / 2;
    for (int q0 = 0; q0 < pairs; q0 += KC2) {
        const int nq = pairs - q0 < KC2 ? pairs - q0 : KC2;
        const bool add = accumulate || q0 > 0;
        const uint32_t *ablock = ap + (size_t)row_blocks * MR * q0;
        for (int j = 0; j < panels; j++) {
            pack_pairs(B, j * NR, n - j * NR, NR, q0, nq, k, bp);
            __mmask16 cmask[NV];
            for (int v = 0; v < NV; v++) cmask[v] = lanes_below(n - j * NR - 16 * v);
            const int cols = n - j * NR, nv = cols >= NR ? NV : (cols + 15) / 16;
            for (int i = 0; i < row_blocks; i++) {
                const int rows = m - i * MR < MR ? m - i * MR : MR;
                tile_strided(nv, nq, ablock + (size_t)i * MR * nq, bp, NR,
                             c + (size_t)i * MR * ldc + (size_t)j * NR, ldc, rows, cmask, add);
            }
        }
    }
}

/* A is packed once per call, whole; then gemm_run. */
static bool bf16_gemm(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                      const float *b, int ldb, float *c, int ldc, bool accumulate) {
    const int pairs = (k + 1) / 2, kc2 = pairs < KC2 ? pairs : KC2;
    const size_t a_words = gemm_a_words(m, k), b_words = (size_t)NR * kc2;
    uint32_t *ap = cf__bf16_pack_scratch(a_words + b_words);
    if (!ap) return false;
    gemm_pack_a(trans_a, m, k, a, lda, ap);
    const operand B = {b, trans_b ? ldb : 1, trans_b ? 1 : ldb};
    gemm_run(m, n, k, ap, &B, ap + a_words, c, ldc, accumulate);
    return true;
}

/* The same with A packed beforehand by gemm_pack_a (bitwise bf16_gemm's result). */
static bool bf16_gemm_packed(int m, int n, int k, const uint32_t *packed_a, bool trans_b,
                             const float *b, int ldb, float *c, int ldc, bool accumulate) {
    const int pairs = (k + 1) / 2, kc2 = pairs < KC2 ? pairs : KC2;
    uint32_t *bp = cf__bf16_pack_scratch((size_t)NR * kc2);
    if (!bp) return false;
    const operand B = {b, trans_b ? ldb : 1, trans_b ? 1 : ldb};
    gemm_run(m, n, k, packed_a, &B, bp, c, ldc, accumulate);
    return true;
}

/* C (+)= A . B with B already paired, its rows of pairs ldb words apart (the Winograd
 * convolutions' transformed input, cf_wino_kernels.input_pairs), and A either packed by
 * gemm_pack_a (lda 0) or given as rows of pairs lda words apart (the Winograd weight gradient's
 * transformed input, cf_wino_kernels.input_bf16): gemm_run's blocks, tiles and order of sums,
 * each panel read in place instead of packed first, so the result is bitwise gemm_packed's on
 * the same values either way. */
static void gemm_in_place(int m, int n, int k, const uint32_t *a, size_t lda, const uint32_t *b,
                          size_t ldb, float *c, int ldc, bool accumulate) {
    const int row_blocks = (m + MR - 1) / MR, panels = (n + NR - 1) / NR, pairs = (k + 1) / 2;
    for (int q0 = 0; q0 < pairs; q0 += KC2) {
        const int nq = pairs - q0 < KC2 ? pairs - q0 : KC2;
        const bool add = accumulate || q0 > 0;
        const uint32_t *ablock = a + (size_t)row_blocks * MR * q0; /* packed A's k-block */
        for (int j = 0; j < panels; j++) {
            const uint32_t *bp = b + (size_t)q0 * ldb + (size_t)j * NR;
            __mmask16 cmask[NV];
            for (int v = 0; v < NV; v++) cmask[v] = lanes_below(n - j * NR - 16 * v);
            const int cols = n - j * NR, nv = cols >= NR ? NV : (cols + 15) / 16;
            for (int i = 0; i < row_blocks; i++) {
                const int rows = m - i * MR < MR ? m - i * MR : MR;
                float *ct = c + (size_t)i * MR * ldc + (size_t)j * NR;
                if (lda == 0)
                    tile_strided(nv, nq, ablock + (size_t)i * MR * nq, bp, ldb, ct, ldc, rows,
                                 cmask, add);
                else
                    tile_rows(nv, nq, a + (size_t)i * MR * lda + q0, lda, bp, ldb, ct, ldc, rows,
                              cmask, add);
            }
        }
    }
}

static void bf16_gemm_paired(int m, int n, int k, const uint32_t *ap, const uint32_t *b, size_t ldb,
                             float *c, int ldc, bool accumulate) {
    gemm_in_place(m, n, k, ap, 0, b, ldb, c, ldc, accumulate);
}

/* A's rows of pairs lda words apart (lda >= (k + 1) / 2 > 0). */
static void bf16_gemm_rows(int m, int n, int k, const uint32_t *a, size_t lda, const uint32_t *b,
                           size_t ldb, float *c, int ldc, bool accumulate) {
    gemm_in_place(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

/* ---- the implicit bf16 convolution (conv_bf16.c) ---------------------------------------------
 *
 * out[i] = bf16(lo[i]) | bf16(hi[i]) << 16 for i < n (hi NULL: zero). */
static void bf16_pairs(const float *lo, const float *hi, uint32_t *out, int n) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = lanes_below(n - i);
        const __m512i l = cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m, lo + i));
        const __m512i h =
            hi ? cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m, hi + i)) : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(out + i, m, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
    }
}

/* One tile of conv_run: 8 rows by nv (1-3) vectors of 16 positions from q. */
static inline __attribute__((always_inline)) void conv_tile(int nv, int taps, const int *off,
                                                            int pairs, const uint32_t *ap,
                                                            const uint32_t *x, size_t plane,
                                                            float *out, size_t ldo) {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int t = 0; t < taps; t++) {
        const uint32_t *xt = x + off[t];
        for (int p = 0; p < pairs; p++, ap += MR, xt += plane) {
            __m512bh b[NV];
            for (int v = 0; v < nv; v++) b[v] = (__m512bh)_mm512_loadu_si512(xt + 16 * v);
            for (int r = 0; r < MR; r++) {
                const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[r]);
                for (int v = 0; v < nv; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(out + (size_t)r * ldo + 16 * v, acc[r][v]);
}

/* out[r * ldo + q] = sum over taps t and channel pairs p of the dot product of row r's weight
 * pair (packed: blocks of 8 rows, [tap][pair][8 rows]) with x[p * plane + q + off[t]], for r in
 * whole blocks of 8 covering m and q < nq (a multiple of 16). */
static void bf16_conv_run(int taps, const int *off, int pairs, int m, const uint32_t *packed,
                          const uint32_t *x, size_t plane, int nq, float *out, size_t ldo) {
    const size_t block = (size_t)taps * pairs * MR;
    for (int rb = 0; rb < (m + MR - 1) / MR; rb++) {
        const uint32_t *ap = packed + (size_t)rb * block;
        float *o = out + (size_t)rb * MR * ldo;
        int q = 0;
        for (; q + NR <= nq; q += NR) conv_tile(3, taps, off, pairs, ap, x + q, plane, o + q, ldo);
        if (nq - q == 32) conv_tile(2, taps, off, pairs, ap, x + q, plane, o + q, ldo);
        if (nq - q == 16) conv_tile(1, taps, off, pairs, ap, x + q, plane, o + q, ldo);
    }
}

/* ---- the forward over output positions (conv_bf16.c's cols path) -----------------------------
 *
 * conv_run's sums with the roles turned: a register tile is np output positions by nv vectors of
 * 16 output channels, each position's input pair broadcast and each weight pair (16 channels)
 * loaded as a vector, so only the image's own positions are computed (conv_run computes the
 * padded rows' dropped columns too: 64 positions for a 7 x 7 plane's 49) and the channels need
 * no blocks of 8 rows. Every sum is conv_run's: the same dot products, weight pair as the first
 * operand, in the same order of taps and pairs from zero. */

/* One tile: positions k < n1 at xa + k, the others at xb + k (the tile's part in the next row,
 * offset by -n1), their sums stored at tmp + k * ldt (nv vectors). */
static inline __attribute__((always_inline)) void cols_tile(int nv, int np, int n1, int taps,
                                                            const int *off, int pairs,
                                                            const uint32_t *w, size_t ldw,
                                                            const uint32_t *xa, const uint32_t *xb,
                                                            size_t plane, float *tmp, size_t ldt) {
    __m512 acc[12][4];
    for (int k = 0; k < np; k++)
        for (int v = 0; v < nv; v++) acc[k][v] = _mm512_setzero_ps();
    for (int t = 0; t < taps; t++) {
        const uint32_t *a = xa + off[t], *b = xb + off[t], *wt = w + (size_t)t * pairs * ldw;
        for (int p = 0; p < pairs; p++, wt += ldw, a += plane, b += plane) {
            __m512bh wv[4];
            for (int v = 0; v < nv; v++) wv[v] = (__m512bh)_mm512_loadu_si512(wt + 16 * v);
            for (int k = 0; k < np; k++) {
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)(k < n1 ? a[k] : b[k]));
                for (int v = 0; v < nv; v++) acc[k][v] = _mm512_dpbf16_ps(acc[k][v], wv[v], xv);
            }
        }
    }
    for (int k = 0; k < np; k++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(tmp + (size_t)k * ldt + 16 * v, acc[k][v]);
}

/* The tile of np positions (np = 24 / nv) for the tile's n1 (1..np), each its own code (the
 * positions' offsets constant). */
/* clang-format off */
#define COLS_CASE(NV, NP, N1)                                                                      \
    case N1:                                                                                       \
        cols_tile(NV, NP, N1, taps, off, pairs, w, ldw, xa, xb, plane, tmp, ldt);                  \
        break;
static void cols_tile2(int n1, int taps, const int *off, int pairs, const uint32_t *w, size_t ldw,
                       const uint32_t *xa, const uint32_t *xb, size_t plane, float *tmp,
                       size_t ldt) {
    switch (n1) {
        COLS_CASE(2, 12, 1)
        COLS_CASE(2, 12, 2)
        COLS_CASE(2, 12, 3)
        COLS_CASE(2, 12, 4)
        COLS_CASE(2, 12, 5)
        COLS_CASE(2, 12, 6)
        COLS_CASE(2, 12, 7)
        COLS_CASE(2, 12, 8)
        COLS_CASE(2, 12, 9)
        COLS_CASE(2, 12, 10)
        COLS_CASE(2, 12, 11)
    default:
        cols_tile(2, 12, 12, taps, off, pairs, w, ldw, xa, xb, plane, tmp, ldt);
    }
}
static void cols_tile3(int n1, int taps, const int *off, int pairs, const uint32_t *w, size_t ldw,
                       const uint32_t *xa, const uint32_t *xb, size_t plane, float *tmp,
                       size_t ldt) {
    switch (n1) {
        COLS_CASE(3, 8, 1)
        COLS_CASE(3, 8, 2)
        COLS_CASE(3, 8, 3)
        COLS_CASE(3, 8, 4)
        COLS_CASE(3, 8, 5)
        COLS_CASE(3, 8, 6)
        COLS_CASE(3, 8, 7)
    default:
        cols_tile(3, 8, 8, taps, off, pairs, w, ldw, xa, xb, plane, tmp, ldt);
    }
}
static void cols_tile4(int n1, int taps, const int *off, int pairs, const uint32_t *w, size_t ldw,
                       const uint32_t *xa, const uint32_t *xb, size_t plane, float *tmp,
                       size_t ldt) {
    switch (n1) {
        COLS_CASE(4, 6, 1)
        COLS_CASE(4, 6, 2)
        COLS_CASE(4, 6, 3)
        COLS_CASE(4, 6, 4)
        COLS_CASE(4, 6, 5)
    default:
        cols_tile(4, 6, 6, taps, off, pairs, w, ldw, xa, xb, plane, tmp, ldt);
    }
}
/* Planes narrower than the usual tile (6 to 11 wide for 17 to 32 channels, 6 or 7 for 33 to 48;
 * stride 2's dx of W1's second block: 7 x 7 phases): a tile is a whole row (np = w), so every
 * tile starts a row and none runs past the last image. */
#define ROW_CASE(NV, W)                                                                            \
    case W:                                                                                        \
        cols_tile(NV, W, W, taps, off, pairs, w, ldw, xa, xa, plane, tmp, ldt);                    \
        break;
static void cols_tile_row(int nv, int wd, int taps, const int *off, int pairs, const uint32_t *w,
                          size_t ldw, const uint32_t *xa, size_t plane, float *tmp, size_t ldt) {
    if (nv == 3) {
        switch (wd) {
            ROW_CASE(3, 6)
        default:
            cols_tile(3, 7, 7, taps, off, pairs, w, ldw, xa, xa, plane, tmp, ldt);
        }
        return;
    }
    switch (wd) {
        ROW_CASE(2, 6)
        ROW_CASE(2, 7)
        ROW_CASE(2, 8)
        ROW_CASE(2, 9)
        ROW_CASE(2, 10)
    default:
        cols_tile(2, 11, 11, taps, off, pairs, w, ldw, xa, xa, plane, tmp, ldt);
    }
}
#undef ROW_CASE
#undef COLS_CASE
/* clang-format on */

/* out[r * ldo + q] = tmp[q * ldt + r] for r < m, q < n: 16 x 16 blocks transposed in registers. */
static void cols_out(const float *tmp, size_t ldt, int m, int n, float *out, size_t ldo) {
    for (int q0 = 0; q0 < n; q0 += 16) {
        const int nq = n - q0 < 16 ? n - q0 : 16;
        const __mmask16 mq = lanes_below(nq);
        for (int r0 = 0; r0 < m; r0 += 16) {
            const int nr = m - r0 < 16 ? m - r0 : 16;
            __m512i v[16];
            for (int i = 0; i < 16; i++)
                v[i] = i < nq ? _mm512_loadu_si512(tmp + (size_t)(q0 + i) * ldt + r0)
                              : _mm512_setzero_si512();
            transpose_words(v);
            for (int j = 0; j < nr; j++)
                _mm512_mask_storeu_epi32(out + (size_t)(r0 + j) * ldo + q0, mq, v[j]);
        }
    }
}

/* The line at p fetched for writing (prefetchw: every CPU with AVX512_BF16 has it), owned; one
 * not written soon after leaves L1 for L2 and is still owned there. */
static inline void prefetch_w(const char *p) {
    __asm__ volatile("prefetchw %0" ::"m"(*p));
}

/* Every line of the bytes [p, p + bytes) fetched for writing. */
static inline void prefetch_w_span(const void *p, size_t bytes) {
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63; a < (uintptr_t)p + bytes; a += 64)
        prefetch_w((const char *)a);
}

/* kernel_table.h's cols_spread: two phases' sums as conv_cols leaves them in tmp (position q at
 * t[f][q * ldt + r]) into out's rows, interleaved: 16 of a row's places at a time, each place's
 * position (from t[0] or t[1], plus add[f]'s value where add[f] is not NULL) loaded as a vector of
 * 16 rows, the 16 x 16 block transposed in registers (cols_out's transposition with the loads'
 * positions interleaved), each row's 16 places stored under a mask. */
static void bf16_cols_spread(const float *const t[2], const float *const add[2], size_t ldt, int m,
                             int h, int n, int n_images, float *out, size_t ldo, size_t ldr,
                             size_t ldoimg) {
    const int half = (n + 1) / 2; /* positions a phase row: t[0]'s; t[1]'s n / 2 of them */
    for (int b = 0; b < n_images; b++)
        for (int i = 0; i < h; i++) {
            const size_t q = ((size_t)b * h + i) * half;
            float *row = out + (size_t)b * ldoimg + (size_t)i * ldr;
            /* the next phase row's lines fetched for writing (dx has left the caches) */
            const int nb_ = i + 1 < h ? b : b + 1;
            if (nb_ < n_images) {
                const float *nx =
                    out + (size_t)nb_ * ldoimg + (size_t)(i + 1 < h ? i + 1 : 0) * ldr;
                for (int r = 0; r < m; r++, nx += ldo)
                    prefetch_w_span(nx, (size_t)n * sizeof(float));
            }
            for (int j0 = 0; j0 < n; j0 += 16) {
                const int nj = n - j0 < 16 ? n - j0 : 16;
                const __mmask16 mj = lanes_below(nj);
                for (int r0 = 0; r0 < m; r0 += 16) {
                    const int nr = m - r0 < 16 ? m - r0 : 16;
                    __m512i v[16];
                    for (int k = 0; k < 16; k++) {
                        const int j = j0 + k, f = j & 1;
                        const size_t at = (q + (size_t)(j >> 1)) * ldt + r0;
                        if (k >= nj) {
                            v[k] = _mm512_setzero_si512();
                            continue;
                        }
                        __m512 x = _mm512_loadu_ps(t[f] + at);
                        if (add[f]) x = _mm512_add_ps(x, _mm512_loadu_ps(add[f] + at));
                        v[k] = _mm512_castps_si512(x);
                    }
                    transpose_words(v);
                    for (int j = 0; j < nr; j++)
                        _mm512_mask_storeu_epi32(row + (size_t)(r0 + j) * ldo + j0, mj, v[j]);
                }
            }
        }
}

/* The lines of the planes that positions [q, q + np) write (clipped to n; image b's planes from
 * out + b * ldoimg, hw positions each, row r of a plane at r * ldo), m rows each, fetched for
 * writing; a line that the position before q (in its image) also writes is left out (the tile
 * before fetched it). A tile's positions lie in at most two images, at most 48 bytes of a row in
 * each: two lines. */
static void cols_prefetch_out(float *out, size_t ldo, size_t ldoimg, int hw, int m, int q, int np,
                              int n) {
    for (const int e = q + np < n ? q + np : n; q < e;) {
        const int b = q / hw, i = q - b * hw, c = hw - i < e - q ? hw - i : e - q;
        const char *p = (const char *)(out + (size_t)b * ldoimg + i);
        const size_t last = (size_t)(c - 1) * sizeof(float), bytes = ldo * sizeof(float);
        for (int r = 0; r < m; r++, p += bytes) {
            if (!i || ((uintptr_t)p & 63) < sizeof(float)) prefetch_w(p);
            if (((uintptr_t)p ^ (uintptr_t)(p + last)) >= 64) prefetch_w(p + last);
        }
        q += c;
    }
}

/* kernel_table.h's conv_cols: the images' h x w positions in tiles of np (12, 8 or 6 for m up to
 * 32, 48 or 64; w where w is below that np: a row), in row-major
 * order over the images, a tile's positions in at most two rows (w >= np; the row after an image's
 * last is the next image's first); the last tile's positions past the last image continue the order
 * into the rows below it (read, not stored). */
static void bf16_conv_cols(int taps, const int *off, int pairs, int m, const uint32_t *w,
                           const uint32_t *x, size_t plane, size_t ldx, size_t ldimg, int h, int wd,
                           int n_images, float *out, size_t ldo, size_t ldoimg, float *tmp,
                           const void *next, size_t next_bytes) {
    const int nv = (m + 15) / 16, np0 = 24 / nv, np = wd < np0 ? wd : np0, hw = h * wd,
              n = n_images * hw;
    const size_t ldw = (size_t)16 * nv, ldt = ldw, tiles = (size_t)(n + np - 1) / np;
    /* next's lines towards L2, a few per tile while the tiles compute */
    const char *pf = next, *pf_end = pf ? pf + next_bytes : NULL;
    const size_t pf_step = 64 * ((next_bytes / 64 + tiles - 1) / tiles);
    /* each tile's lines of the planes, fetched for writing as the tile starts. cols_out writes
     * an image's planes only once all of its tiles are done (some 130 tiles later for a 28x28
     * plane of 64 channels: 200 KB against a 32 KB L1), so by then most of the lines have left
     * L1 and wait in L2, owned; that still spares the transposition's stores the trip to memory
     * (W1's layers' planes, 1.6 MB a batch, are out of L2; cf__conv_bf16_set_cols_prefetch) */
    const bool pw = cf__conv_bf16_cols_prefetch();
#define ROW_AT(R) (x + (size_t)((R) / h) * ldimg + (size_t)((R) % h) * ldx)
    for (int q0 = 0, done = 0; q0 < n; q0 += np) {
        const int r0 = q0 / wd, j0 = q0 % wd, n1 = wd - j0 < np ? wd - j0 : np;
        const uint32_t *xa = ROW_AT(r0) + j0, *xb = ROW_AT(r0 + 1) - n1;
        float *tt = tmp + (size_t)q0 * ldt;
        for (const char *e = pf + pf_step; pf && pf < pf_end && pf < e; pf += 64)
            _mm_prefetch(pf, _MM_HINT_T1);
        if (pw && out) cols_prefetch_out(out, ldo, ldoimg, hw, m, q0, np, n);
        if (np < np0)
            cols_tile_row(nv, wd, taps, off, pairs, w, ldw, xa, plane, tt, ldt);
        else if (nv == 2)
            cols_tile2(n1, taps, off, pairs, w, ldw, xa, xb, plane, tt, ldt);
        else if (nv == 3)
            cols_tile3(n1, taps, off, pairs, w, ldw, xa, xb, plane, tt, ldt);
        else
            cols_tile4(n1, taps, off, pairs, w, ldw, xa, xb, plane, tt, ldt);
        /* the images whose sums are complete, into their planes while tmp's rows are in L1 */
        for (; out && done < n_images && (done + 1) * hw <= q0 + np; done++)
            cols_out(tmp + (size_t)done * hw * ldt, ldt, m, hw, out + (size_t)done * ldoimg, ldo);
    }
#undef ROW_AT
}

/* The pair planes and rows of the forward, dx and dW (forward_cols, fwd_pairs_rows,
 * fwd_deal_pairs, rows_short) on the conversion instructions, as cf__bf16_pairs
 * (bf16_lanes_avx512.h): vcvtne2ps2bf16 rounds two vectors in one, to nearest even, and makes a NaN
 * quiet as cf__bf16_round_lanes does, but reads a subnormal as zero, so a vector pair that holds
 * one (any_subnormal) takes cf__bf16_round_lanes. Bitwise bf16_pairs_rows' and bf16_deal_pairs'
 * words (test_bf16_cols, test_bf16_ne_paths), in about a quarter of the instructions. */
/* The 32 values a then b as bf16 words, in order. */
static inline __m512i ne_words(__m512 a, __m512 b) {
    if (any_subnormal(a, b))
        return _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm512_cvtepi32_epi16(cf__bf16_round_lanes(a))),
            _mm512_cvtepi32_epi16(cf__bf16_round_lanes(b)), 1);
    return (__m512i)_mm512_cvtne2ps_pbh(b, a);
}

/* The 32 words of a mask that holds the first n (at most 32). */
static inline __mmask32 words_below(int n) {
    return n >= 32 ? 0xffffffffu : n <= 0 ? 0u : (__mmask32)((1u << n) - 1u);
}

/* As bf16_from_fp32 (bitwise), 32 values per vcvtne2ps2bf16 (ne_words): the level's from_fp32
 * (cf_fp32_to_bf16; the forward's kept copy of x, cf_conv_bf16_forward_keep). */
static void bf16_from_fp32_ne(const float *x, uint16_t *y, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm512_storeu_si512(y + i, ne_words(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16)));
    if (i < n) {
        const int left = (int)(n - i);
        _mm512_mask_storeu_epi16(
            y + i, words_below(left),
            ne_words(_mm512_maskz_loadu_ps(lanes_below(left), x + i),
                     _mm512_maskz_loadu_ps(lanes_below(left - 16), x + i + 16)));
    }
}

/* As bf16_from_fp32_ne (bitwise), the whole 64-byte lines of y written with streaming stores
 * (kernel_table.h's keep_words: words read long after, by the backward; a plain store would
 * first read each line of y from memory), fenced before it returns. */
static void bf16_keep_words(const float *x, uint16_t *y, size_t n) {
    size_t i = 0;
    /* up to y's first whole line (y is 2-byte aligned: a line holds 32 words) */
    const size_t head = ((64 - ((uintptr_t)y & 63)) & 63) / 2;
    if (head) {
        bf16_from_fp32_ne(x, y, head < n ? head : n);
        i = head < n ? head : n;
    }
    for (; i + 32 <= n; i += 32)
        _mm512_stream_si512((__m512i *)(y + i),
                            ne_words(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16)));
    if (i < n) bf16_from_fp32_ne(x + i, y + i, n - i);
    _mm_sfence();
}

/* As bf16_pairs_rows (kernel_table.h's fwd_pairs_rows). */
static void bf16_fwd_pairs_rows(const float *lo, const float *hi, int h, int w, uint32_t *out,
                                size_t ldo) {
    /* lo's words in the low half, hi's in the high half, interleaved into pairs */
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int i = 0; i < h; i++, lo += w, hi = hi ? hi + w : NULL, out += ldo)
        for (int j = 0; j < w; j += 16) {
            const __mmask16 m = lanes_below(w - j);
            const __m512 l = _mm512_maskz_loadu_ps(m, lo + j),
                         u = hi ? _mm512_maskz_loadu_ps(m, hi + j) : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(out + j, m, _mm512_permutexvar_epi16(zip, ne_words(l, u)));
        }
}

/* As bf16_deal_pairs (kernel_table.h's fwd_deal_pairs). */
static void bf16_fwd_deal_pairs(const float *lo, const float *hi, size_t ldx, int h, int n,
                                uint32_t *e, uint32_t *o, size_t ld) {
    /* pair v of the even values: words 2v of lo's and hi's 32; of the odd ones, words 2v + 1 */
    const __m512i even = _mm512_set_epi16(62, 30, 60, 28, 58, 26, 56, 24, 54, 22, 52, 20, 50, 18,
                                          48, 16, 46, 14, 44, 12, 42, 10, 40, 8, 38, 6, 36, 4, 34,
                                          2, 32, 0),
                  odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
    for (int i = 0; i < h;
         i++, lo += ldx, hi = hi ? hi + ldx : NULL, e += ld, o = o ? o + ld : NULL)
        for (int j = 0; j < n; j += 32) {
            const int left = n - j;
            const __mmask16 m0 = lanes_below(left), m1 = lanes_below(left - 16);
            const __m512i l =
                ne_words(_mm512_maskz_loadu_ps(m0, lo + j), _mm512_maskz_loadu_ps(m1, lo + j + 16));
            const __m512i u = hi ? ne_words(_mm512_maskz_loadu_ps(m0, hi + j),
                                            _mm512_maskz_loadu_ps(m1, hi + j + 16))
                                 : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(e + j / 2, lanes_below((left + 1) / 2),
                                     _mm512_permutex2var_epi16(l, even, u));
            if (o)
                _mm512_mask_storeu_epi32(o + j / 2, lanes_below(left / 2),
                                         _mm512_permutex2var_epi16(l, odd, u));
        }
}

/* One tile of conv_wgrad: 8 rows of a by nv (1-3) vectors of 16 columns of b from c0. */
static inline __attribute__((always_inline)) void wgrad_tile(int nv, int nq2, const uint32_t *a,
                                                             size_t lda, const uint32_t *b,
                                                             size_t ldb, float *out, size_t ldo,
                                                             int rows, int cols, bool accumulate) {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int q = 0; q < nq2; q++, a++, b += ldb) {
        __m512bh bv[NV];
        for (int v = 0; v < nv; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + 16 * v);
        for (int r = 0; r < MR; r++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[(size_t)r * lda]);
            for (int v = 0; v < nv; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float *o = out + (size_t)r * ldo;
        for (int v = 0; v < nv; v++) {
            const __mmask16 m = lanes_below(cols - 16 * v);
            __m512 s = acc[r][v];
            if (accumulate) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, o + 16 * v));
            _mm512_mask_storeu_ps(o + 16 * v, m, s);
        }
    }
}

/* out[t * tapo + r * ldo + c] (+)= sum over q < nq2 of the dot product of a[r * lda + q] with
 * (odd[t] ? b1 : b0)[(q + half[t]) * ldb + c], for t < taps, r < m (a has whole blocks of 8
 * rows), c < ch (b's rows hold ldb >= ch words, a multiple of 16, zero past ch). */
static void bf16_conv_wgrad(int taps, const int *half, const unsigned char *odd, int m, int ch,
                            int nq2, const uint32_t *a, size_t lda, const uint32_t *b0,
                            const uint32_t *b1, size_t ldb, float *out, size_t ldo, size_t tapo,
                            bool accumulate) {
    for (int t = 0; t < taps; t++) {
        const uint32_t *b = (odd[t] ? b1 : b0) + (size_t)half[t] * ldb;
        for (int r0 = 0; r0 < m; r0 += MR) {
            const int rows = m - r0 < MR ? m - r0 : MR;
            for (int c0 = 0; c0 < ch; c0 += NR) {
                const int cols = ch - c0 < NR ? ch - c0 : NR, nv = (cols + 15) / 16;
                float *o = out + (size_t)t * tapo + (size_t)r0 * ldo + c0;
                const uint32_t *ar = a + (size_t)r0 * lda;
                if (nv == 3)
                    wgrad_tile(3, nq2, ar, lda, b + c0, ldb, o, ldo, rows, cols, accumulate);
                else if (nv == 2)
                    wgrad_tile(2, nq2, ar, lda, b + c0, ldb, o, ldo, rows, cols, accumulate);
                else
                    wgrad_tile(1, nq2, ar, lda, b + c0, ldb, o, ldo, rows, cols, accumulate);
            }
        }
    }
}

/* One tile of conv_wgrad_runs: R rows of a by nv vectors of 16 columns of b, for tt taps at once
 * (b's rows of tap i from bt[i], the sums into out[i]), over the runs of q. Each tap's dy row
 * value (broadcast) is shared by the taps and vectors of the tile, so a tile of 3 taps loads
 * fewer operands per product than conv_wgrad's 8 x nv one; each sum still adds its products
 * in q's order. */
static inline __attribute__((always_inline)) void
wgrad_runs_tile(int R, int nv, int tt, const uint32_t *a, size_t lda, const uint32_t *const *bt,
                size_t ldb, int images, int istep, int runs, const int *run_at, const int *run_len,
                float *const *out, size_t ldo, int rows, int cols, bool accumulate) {
    __m512 acc[MR][3][NV];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < tt; i++)
            for (int v = 0; v < nv; v++) acc[r][i][v] = _mm512_setzero_ps();
    for (int n = 0; n < images; n++)
        for (int j = 0; j < runs; j++) {
            const size_t q0 = (size_t)n * istep + run_at[j];
            const uint32_t *ap = a + q0, *bp[3];
            for (int i = 0; i < tt; i++) bp[i] = bt[i] + q0 * ldb;
            for (int q = 0; q < run_len[j]; q++, ap++) {
                __m512bh bv[3][NV];
                for (int i = 0; i < tt; i++)
                    for (int v = 0; v < nv; v++)
                        bv[i][v] = (__m512bh)_mm512_loadu_si512(bp[i] + (size_t)q * ldb + 16 * v);
                for (int r = 0; r < R; r++) {
                    const __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[(size_t)r * lda]);
                    for (int i = 0; i < tt; i++)
                        for (int v = 0; v < nv; v++)
                            acc[r][i][v] = _mm512_dpbf16_ps(acc[r][i][v], av, bv[i][v]);
                }
            }
        }
    for (int i = 0; i < tt; i++)
        for (int r = 0; r < rows; r++) {
            float *o = out[i] + (size_t)r * ldo;
            for (int v = 0; v < nv; v++) {
                const __mmask16 m = lanes_below(cols - 16 * v);
                __m512 s = acc[r][i][v];
                if (accumulate) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, o + 16 * v));
                _mm512_mask_storeu_ps(o + 16 * v, m, s);
            }
        }
}

/* conv_wgrad with the sum over q restricted to the runs q = n * istep + run_at[j] + i, i <
 * run_len[j], for n < images and j < runs (increasing, within istep): the pairs between the runs
 * are left out. Bitwise conv_wgrad over all images * istep pairs where every pair left out has
 * a zero dy word (a zero product adds nothing to a sum). Taps go three at a time: 4 rows by 2
 * vectors, or 8 rows by 1 vector on a last 16 columns; the taps past a multiple of 3 as
 * conv_wgrad's tiles. */
static void bf16_conv_wgrad_runs(int taps, const int *half, const unsigned char *odd, int m, int ch,
                                 int images, int istep, int runs, const int *run_at,
                                 const int *run_len, const uint32_t *a, size_t lda,
                                 const uint32_t *b0, const uint32_t *b1, size_t ldb, float *out,
                                 size_t ldo, size_t tapo, bool accumulate) {
    for (int t = 0; t < taps;) {
        const int tt = taps - t >= 3 ? 3 : 1;
        const uint32_t *bt[3];
        for (int i = 0; i < tt; i++) bt[i] = (odd[t + i] ? b1 : b0) + (size_t)half[t + i] * ldb;
        for (int c0 = 0; c0 < ch;) {
            const int left = ch - c0, nv = tt == 3 ? (left > 16 ? 2 : 1)
                                                   : (left > 32   ? 3
                                                      : left > 16 ? 2
                                                                  : 1);
            const int cols = left < 16 * nv ? left : 16 * nv, R = tt == 3 && nv == 2 ? 4 : MR;
            const uint32_t *bc[3];
            for (int i = 0; i < tt; i++) bc[i] = bt[i] + c0;
            for (int r0 = 0; r0 < m; r0 += R) {
                const int rows = m - r0 < R ? m - r0 : R;
                const uint32_t *ar = a + (size_t)r0 * lda;
                float *o[3];
                for (int i = 0; i < tt; i++)
                    o[i] = out + (size_t)(t + i) * tapo + (size_t)r0 * ldo + c0;
                if (tt == 3 && nv == 2)
                    wgrad_runs_tile(4, 2, 3, ar, lda, bc, ldb, images, istep, runs, run_at, run_len,
                                    o, ldo, rows, cols, accumulate);
                else if (tt == 3)
                    wgrad_runs_tile(MR, 1, 3, ar, lda, bc, ldb, images, istep, runs, run_at,
                                    run_len, o, ldo, rows, cols, accumulate);
                else if (nv == 3)
                    wgrad_runs_tile(MR, 3, 1, ar, lda, bc, ldb, images, istep, runs, run_at,
                                    run_len, o, ldo, rows, cols, accumulate);
                else if (nv == 2)
                    wgrad_runs_tile(MR, 2, 1, ar, lda, bc, ldb, images, istep, runs, run_at,
                                    run_len, o, ldo, rows, cols, accumulate);
                else
                    wgrad_runs_tile(MR, 1, 1, ar, lda, bc, ldb, images, istep, runs, run_at,
                                    run_len, o, ldo, rows, cols, accumulate);
            }
            c0 += 16 * nv;
        }
        t += tt;
    }
}

/* y[i * ldy + j] = bf16(x[i * ldx + 2 j]) for i < h, j < n: the even values of h rows (a 1x1
 * stride-2 layer's subsampled image), picked before they are rounded, 32 per vcvtne2ps2bf16
 * (ne_words: bitwise cf__bf16_round_lanes' words). Rows of at most 16 even values (W3's
 * downsamples: 16, 8 and 4) go two at a time, the first row's words in the low half and the
 * second's in the high half. */
static void bf16_even_rows(const float *x, size_t ldx, int h, int n, uint16_t *y, size_t ldy) {
    const __m512i idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    if (n <= 16) {
        /* the values from x[0] to the last even one, x[2 n - 2] */
        const __mmask16 m0 = lanes_below(2 * n - 1), m1 = lanes_below(2 * n - 17),
                        out = lanes_below(n);
        int i = 0;
        for (; i + 2 <= h; i += 2, x += 2 * ldx, y += 2 * ldy) {
            const __m512 e0 = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(m0, x), idx,
                                                     _mm512_maskz_loadu_ps(m1, x + 16)),
                         e1 = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(m0, x + ldx), idx,
                                                     _mm512_maskz_loadu_ps(m1, x + ldx + 16));
            const __m512i v = ne_words(e0, e1);
            _mm256_mask_storeu_epi16(y, out, _mm512_castsi512_si256(v));
            _mm256_mask_storeu_epi16(y + ldy, out, _mm512_extracti64x4_epi64(v, 1));
        }
        if (i < h) {
            const __m512 e0 = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(m0, x), idx,
                                                     _mm512_maskz_loadu_ps(m1, x + 16));
            _mm256_mask_storeu_epi16(y, out,
                                     _mm512_castsi512_si256(ne_words(e0, _mm512_setzero_ps())));
        }
        return;
    }
    for (int i = 0; i < h; i++, x += ldx, y += ldy)
        for (int j = 0; j < n; j += 32) {
            const int left = 2 * (n - j) - 1; /* values from x[2j] to the last even one */
            const float *at = x + 2 * j;
            const __m512 e0 =
                _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(lanes_below(left), at), idx,
                                       _mm512_maskz_loadu_ps(lanes_below(left - 16), at + 16));
            const __m512 e1 =
                _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(lanes_below(left - 32), at + 32), idx,
                                       _mm512_maskz_loadu_ps(lanes_below(left - 48), at + 48));
            _mm512_mask_storeu_epi16(y + j, words_below(n - j), ne_words(e0, e1));
        }
}

/* ---- the convolution's conversions and layouts (conv_bf16.c) ---------------------------------
 *
 * y[i * ldy + j] = bf16(x[i * w + j]) for i < h, j < w: a plane's rows into padded rows, one call
 * per plane (rows are 7 to 28 values in W1, so a call per row cost more than its conversion). */
static void bf16_rows(const float *x, int h, int w, uint16_t *y, size_t ldy) {
    for (int i = 0; i < h; i++, x += w, y += ldy) bf16_from_fp32(x, y, (size_t)w);
}

/* out[i * ldo + j] = bf16(lo[i * w + j]) | bf16(hi[i * w + j]) << 16 (hi NULL: zero). */
static void bf16_pairs_rows(const float *lo, const float *hi, int h, int w, uint32_t *out,
                            size_t ldo) {
    for (int i = 0; i < h; i++, lo += w, out += ldo) {
        bf16_pairs(lo, hi, out, w);
        if (hi) hi += w;
    }
}

/* The even and odd lanes of the 32 lanes of a then b (index vectors of vpermt2d). */
static inline __m512i even_lanes(__m512i a, __m512i b) {
    const __m512i idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    return _mm512_permutex2var_epi32(a, idx, b);
}
static inline __m512i odd_lanes(__m512i a, __m512i b) {
    const __m512i idx = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi32(a, idx, b);
}

/* A row of n values dealt to its even and odd positions: e[v] = bf16(x[2v]) for 2v < n and
 * o[v] = bf16(x[2v + 1]) for 2v + 1 < n (a stride-2 layer's phase rows; o NULL: the even ones
 * alone). */
static inline void deal_row(const float *x, int n, uint16_t *e, uint16_t *o) {
    for (int j = 0; j < n; j += 32, e += 16, o = o ? o + 16 : NULL) {
        const int left = n - j;
        const __m512i a = cf__bf16_round_lanes(_mm512_maskz_loadu_ps(lanes_below(left), x + j));
        const __m512i b =
            cf__bf16_round_lanes(_mm512_maskz_loadu_ps(lanes_below(left - 16), x + j + 16));
        _mm512_mask_cvtepi32_storeu_epi16(e, lanes_below((left + 1) / 2), even_lanes(a, b));
        if (o) _mm512_mask_cvtepi32_storeu_epi16(o, lanes_below(left / 2), odd_lanes(a, b));
    }
}

/* The same of the pairs bf16(lo[j]) | bf16(hi[j]) << 16 (hi NULL: zero). */
static inline void deal_pairs_row(const float *lo, const float *hi, int n, uint32_t *e,
                                  uint32_t *o) {
    for (int j = 0; j < n; j += 32, e += 16, o = o ? o + 16 : NULL) {
        const int left = n - j;
        const __mmask16 m0 = lanes_below(left), m1 = lanes_below(left - 16);
        __m512i a = cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m0, lo + j));
        __m512i b = cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m1, lo + j + 16));
        if (hi) {
            a = _mm512_or_si512(
                a, _mm512_slli_epi32(cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m0, hi + j)), 16));
            b = _mm512_or_si512(
                b, _mm512_slli_epi32(cf__bf16_round_lanes(_mm512_maskz_loadu_ps(m1, hi + j + 16)),
                                     16));
        }
        _mm512_mask_storeu_epi32(e, lanes_below((left + 1) / 2), even_lanes(a, b));
        if (o) _mm512_mask_storeu_epi32(o, lanes_below(left / 2), odd_lanes(a, b));
    }
}

/* h rows dealt, row i read at x + i * ldx and written at e + i * ld and o + i * ld (one call
 * per plane: the rows are short). */
static void bf16_deal(const float *x, size_t ldx, int h, int n, uint16_t *e, uint16_t *o,
                      size_t ld) {
    for (int i = 0; i < h; i++, x += ldx, e += ld, o = o ? o + ld : NULL) deal_row(x, n, e, o);
}

static void bf16_deal_pairs(const float *lo, const float *hi, size_t ldx, int h, int n, uint32_t *e,
                            uint32_t *o, size_t ld) {
    for (int i = 0; i < h;
         i++, lo += ldx, hi = hi ? hi + ldx : NULL, e += ld, o = o ? o + ld : NULL)
        deal_pairs_row(lo, hi, n, e, o);
}

/* out[j] = a[j / 2] for even j, b[j / 2] for odd j (b NULL: zero), j < n (a stride-2 layer's
 * input gradient rows from its phase rows). */
static void bf16_interleave(const float *a, const float *b, int n, float *out) {
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int j = 0; j < n; j += 32, a += 16, b = b ? b + 16 : NULL) {
        const int left = n - j;
        const __m512 va = _mm512_maskz_loadu_ps(lanes_below((left + 1) / 2), a);
        const __m512 vb = b ? _mm512_maskz_loadu_ps(lanes_below(left / 2), b) : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(out + j, lanes_below(left), _mm512_permutex2var_ps(va, lo_idx, vb));
        _mm512_mask_storeu_ps(out + j + 16, lanes_below(left - 16),
                              _mm512_permutex2var_ps(va, hi_idx, vb));
    }
}

/* h rows of bf16_interleave in one call: out[i * ldo + j] = (j even ? a : b)[i * lds + j / 2]
 * for i < h, j < n (b NULL: zero). Stride 2's dx takes a channel's rows of one row parity at
 * once (every other row of dx, from consecutive rows of its phases), rather than a call per
 * row of 7 to 28 values. */
static void bf16_interleave_rows(const float *a, const float *b, size_t lds, int h, int n,
                                 float *out, size_t ldo) {
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int i = 0; i < h; i++, a += lds, b = b ? b + lds : NULL, out += ldo)
        for (int j = 0; j < n; j += 32) {
            const int left = n - j;
            const __m512 va = _mm512_maskz_loadu_ps(lanes_below((left + 1) / 2), a + j / 2);
            const __m512 vb =
                b ? _mm512_maskz_loadu_ps(lanes_below(left / 2), b + j / 2) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(out + j, lanes_below(left),
                                  _mm512_permutex2var_ps(va, lo_idx, vb));
            if (left > 16)
                _mm512_mask_storeu_ps(out + j + 16, lanes_below(left - 16),
                                      _mm512_permutex2var_ps(va, hi_idx, vb));
        }
}

/* out[2j] += a[j] for j < n (a shortcut's input gradient added at the even columns of a row;
 * the odd ones untouched). */
static void bf16_add_even(const float *a, int n, float *out) {
    const __m512i lo_idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i hi_idx =
        _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    for (int j = 0; j < n; j += 16, a += 16, out += 32) {
        const int left = 2 * (n - j) - 1; /* values of out from out[0] to the last even one */
        const __m512 va = _mm512_maskz_loadu_ps(lanes_below(n - j), a);
        const __mmask16 m0 = lanes_below(left) & 0x5555, m1 = lanes_below(left - 16) & 0x5555;
        _mm512_mask_storeu_ps(
            out, m0,
            _mm512_add_ps(_mm512_maskz_loadu_ps(m0, out), _mm512_permutexvar_ps(lo_idx, va)));
        _mm512_mask_storeu_ps(
            out + 16, m1,
            _mm512_add_ps(_mm512_maskz_loadu_ps(m1, out + 16), _mm512_permutexvar_ps(hi_idx, va)));
    }
}

/* dst[i * w + j] = src[i * lds + j] for i < h, j < w (the kernels' output rows, computed lds
 * apart, into an image plane). */
static void bf16_copy_rows(const float *src, size_t lds, int h, int w, float *dst) {
    for (int i = 0; i < h; i++, src += lds, dst += w)
        for (int j = 0; j < w; j += 16) {
            const __mmask16 m = lanes_below(w - j);
            _mm512_mask_storeu_ps(dst + j, m, _mm512_maskz_loadu_ps(m, src + j));
        }
}

/* out[i * ldo + j] = lo[i * ldi + j] | hi[i * ldi + j] << 16 for i < h, j < w (bf16 rows paired:
 * stride 1's dx takes one row of a whole plane, stride 2's the short rows of dy). */
static void bf16_halves_rows(const uint16_t *lo, const uint16_t *hi, size_t ldi, int h, int w,
                             uint32_t *out, size_t ldo) {
    for (int i = 0; i < h; i++, lo += ldi, hi += ldi, out += ldo)
        for (int j = 0; j < w; j += 16) {
            const __mmask16 m = lanes_below(w - j);
            const __m512i l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + j)),
                          u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + j));
            _mm512_mask_storeu_epi32(out + j, m, _mm512_or_si512(l, _mm512_slli_epi32(u, 16)));
        }
}

/* The 16 x 16 words of r transposed in place (r[i] lane j <-> r[j] lane i). */
static inline void transpose_words(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* r[4q + s] holds, in 128-bit lane L, the words (rows 4q..4q+3, column 4L + s) */
    for (int q = 0; q < 4; q += 2)
        for (int s = 0; s < 4; s++) {
            const __m512i a = r[4 * q + s], b = r[4 * q + 4 + s];
            t[4 * q + s] = _mm512_shuffle_i32x4(a, b, 0x88);
            t[4 * q + 4 + s] = _mm512_shuffle_i32x4(a, b, 0xdd);
        }
    for (int s = 0; s < 4; s++) {
        const __m512i a0 = t[s], a1 = t[4 + s], b0 = t[8 + s], b1 = t[12 + s];
        r[s] = _mm512_shuffle_i32x4(a0, b0, 0x88);
        r[8 + s] = _mm512_shuffle_i32x4(a0, b0, 0xdd);
        r[4 + s] = _mm512_shuffle_i32x4(a1, b1, 0x88);
        r[12 + s] = _mm512_shuffle_i32x4(a1, b1, 0xdd);
    }
}

/* The weight gradient's position pairs of ch bf16 rows (row c at x + c * lx): x0[r * ldb + c] =
 * x[c][2r] | x[c][2r + 1] << 16 and x1[r * ldb + c] = x[c][2r + 1] | x[c][2r + 2] << 16 for
 * r < rows, c < ch (the words past ch are not written). Both from the same rows in one pass: x1
 * is x0 read one value on. */
static void bf16_position_pairs(const uint16_t *x, size_t lx, int ch, int rows, uint32_t *x0,
                                uint32_t *x1, size_t ldb) {
    for (int r0 = 0; r0 < rows; r0 += 16) {
        const __mmask16 mr = lanes_below(rows - r0);
        const int nr = rows - r0 < 16 ? rows - r0 : 16;
        for (int c0 = 0; c0 < ch; c0 += 16) {
            const int nc = ch - c0 < 16 ? ch - c0 : 16;
            const __mmask16 mc = lanes_below(nc);
            for (int shift = 0; shift < 2; shift++) {
                __m512i v[16];
                for (int i = 0; i < 16; i++)
                    v[i] = i < nc ? _mm512_maskz_loadu_epi32(mr, x + (size_t)(c0 + i) * lx +
                                                                     2 * (size_t)r0 + shift)
                                  : _mm512_setzero_si512();
                transpose_words(v);
                uint32_t *dst = (shift ? x1 : x0) + (size_t)r0 * ldb + c0;
                for (int j = 0; j < nr; j++)
                    _mm512_mask_storeu_epi32(dst + (size_t)j * ldb, mc, v[j]);
            }
        }
    }
}

/* As rows, y[i * ldy + j] = bf16(x[i * w + j]) for i < h, j < w, on the conversion
 * instruction (ne_words: vcvtne2ps2bf16, cf__bf16_round_lanes for a vector pair that holds a
 * subnormal, so bitwise rows' words). Rows of at most 16 values (W1's 7 x 7 and 14 x 14
 * planes) go two at a time, the first row's words in the low half of the vector and the
 * second's in the high half, each stored to its own row; longer rows 32 values at a time. */
static void bf16_rows_short(const float *x, int h, int w, uint16_t *y, size_t ldy) {
    if (w <= 16) {
        const __mmask16 in = lanes_below(w);
        int i = 0;
        for (; i + 2 <= h; i += 2, x += 2 * w, y += 2 * ldy) {
            const __m512i v =
                ne_words(_mm512_maskz_loadu_ps(in, x), _mm512_maskz_loadu_ps(in, x + w));
            _mm256_mask_storeu_epi16(y, in, _mm512_castsi512_si256(v));
            _mm256_mask_storeu_epi16(y + ldy, in, _mm512_extracti64x4_epi64(v, 1));
        }
        if (i < h)
            _mm256_mask_storeu_epi16(y, in,
                                     _mm512_castsi512_si256(ne_words(_mm512_maskz_loadu_ps(in, x),
                                                                     _mm512_setzero_ps())));
        return;
    }
    for (int i = 0; i < h; i++, x += w, y += ldy)
        for (int j = 0; j < w; j += 32) {
            const int left = w - j;
            _mm512_mask_storeu_epi16(
                y + j, words_below(left),
                ne_words(_mm512_maskz_loadu_ps(lanes_below(left), x + j),
                         _mm512_maskz_loadu_ps(lanes_below(left - 16), x + j + 16)));
        }
}

/* As deal, h rows' even and odd values to e and o (i * ld on; o NULL: the even ones alone), on
 * the conversion instruction as rows_short (bitwise deal's words). Rows of at most 16 values go
 * two at a time (ldx apart): the first row's words in the low half, the second's in the high
 * half, permuted to [first's even | second's even | first's odd | second's odd], 8 words each,
 * each quarter stored to its row. Longer rows 32 values at a time, permuted to [even | odd]. */
static void bf16_deal_short(const float *x, size_t ldx, int h, int n, uint16_t *e, uint16_t *o,
                            size_t ld) {
    /* the even words of the 32, then the odd ones: [first's even | second's even | first's odd |
     * second's odd] for two short rows, [even | odd] for 32 values of one row */
    const __m512i evens_odds =
        _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 30, 28, 26, 24,
                         22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    if (n <= 16) {
        const __mmask16 in = lanes_below(n);
        const __mmask8 ne = (__mmask8)lanes_below((n + 1) / 2), no = (__mmask8)lanes_below(n / 2);
        for (int i = 0; i < h; i += 2, x += 2 * ldx, e += 2 * ld, o = o ? o + 2 * ld : NULL) {
            const bool two = i + 1 < h;
            const __m512i v = _mm512_permutexvar_epi16(
                evens_odds,
                ne_words(_mm512_maskz_loadu_ps(in, x),
                         two ? _mm512_maskz_loadu_ps(in, x + ldx) : _mm512_setzero_ps()));
            _mm_mask_storeu_epi16(e, ne, _mm512_castsi512_si128(v));
            if (two) _mm_mask_storeu_epi16(e + ld, ne, _mm512_extracti32x4_epi32(v, 1));
            if (o) _mm_mask_storeu_epi16(o, no, _mm512_extracti32x4_epi32(v, 2));
            if (o && two) _mm_mask_storeu_epi16(o + ld, no, _mm512_extracti32x4_epi32(v, 3));
        }
        return;
    }
    for (int i = 0; i < h; i++, x += ldx, e += ld, o = o ? o + ld : NULL)
        for (int j = 0; j < n; j += 32) {
            const int left = n - j;
            const __m512i v = _mm512_permutexvar_epi16(
                evens_odds, ne_words(_mm512_maskz_loadu_ps(lanes_below(left), x + j),
                                     _mm512_maskz_loadu_ps(lanes_below(left - 16), x + j + 16)));
            _mm256_mask_storeu_epi16(e + j / 2, lanes_below((left + 1) / 2),
                                     _mm512_castsi512_si256(v));
            if (o)
                _mm256_mask_storeu_epi16(o + j / 2, lanes_below(left / 2),
                                         _mm512_extracti64x4_epi64(v, 1));
        }
}

/* As rows, of x already in bf16 (the forward's kept copy, cf_conv_bf16_forward_keep): h rows of
 * w words copied into rows ldy apart, 32 words per masked load and store. */
static void bf16_rows_h(const uint16_t *x, int h, int w, uint16_t *y, size_t ldy) {
    if (w <= 32 && cf__bf16_words_loops_take()) {
        /* rows of at most 32 words (W1's 14 x 14 and 7 x 7 planes): the mask made once, a row
         * pair a step */
        const __mmask32 in = words_below(w);
        int i = 0;
        for (; i + 2 <= h; i += 2, x += 2 * w, y += 2 * ldy) {
            const __m512i a = _mm512_maskz_loadu_epi16(in, x),
                          b = _mm512_maskz_loadu_epi16(in, x + w);
            _mm512_mask_storeu_epi16(y, in, a);
            _mm512_mask_storeu_epi16(y + ldy, in, b);
        }
        if (i < h) _mm512_mask_storeu_epi16(y, in, _mm512_maskz_loadu_epi16(in, x));
        return;
    }
    for (int i = 0; i < h; i++, x += w, y += ldy)
        for (int j = 0; j < w; j += 32) {
            const __mmask32 m = words_below(w - j);
            _mm512_mask_storeu_epi16(y + j, m, _mm512_maskz_loadu_epi16(m, x + j));
        }
}

/* As deal, of x already in bf16: h rows' even and odd words (row i at x + i * ldx) to e and o
 * (i * ld on; o NULL: the even ones alone), 32 words of a row per load, permuted to
 * [even | odd]. */
static void bf16_deal_h(const uint16_t *x, size_t ldx, int h, int n, uint16_t *e, uint16_t *o,
                        size_t ld) {
    const __m512i evens_odds =
        _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 30, 28, 26, 24,
                         22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int i = 0; i < h; i++, x += ldx, e += ld, o = o ? o + ld : NULL)
        for (int j = 0; j < n; j += 32) {
            const int left = n - j;
            const __m512i v = _mm512_permutexvar_epi16(
                evens_odds, _mm512_maskz_loadu_epi16(words_below(left), x + j));
            _mm256_mask_storeu_epi16(e + j / 2, lanes_below((left + 1) / 2),
                                     _mm512_castsi512_si256(v));
            if (o)
                _mm256_mask_storeu_epi16(o + j / 2, lanes_below(left / 2),
                                         _mm512_extracti64x4_epi64(v, 1));
        }
}

/* As deal_pairs, of two channels' rows already in bf16 (kernel_table.h's deal_pairs_h): each
 * 32-bit lane of a row's 32 words holds an even word low and an odd one high, so the even pairs
 * are lo's low halves with hi's low halves shifted up, the odd ones lo's high halves shifted down
 * with hi's high halves (two blends, no rounding). */
static void bf16_deal_pairs_h(const uint16_t *lo, const uint16_t *hi, size_t ldx, int h, int n,
                              uint32_t *e, uint32_t *o, size_t ld) {
    const __mmask32 high = 0xAAAAAAAAu; /* the high word of each lane */
    for (int i = 0; i < h; i++, lo += ldx, hi += ldx, e += ld, o = o ? o + ld : NULL)
        for (int j = 0; j < n; j += 32) {
            const int left = n - j;
            const __m512i a = _mm512_maskz_loadu_epi16(words_below(left), lo + j),
                          b = _mm512_maskz_loadu_epi16(words_below(left), hi + j);
            _mm512_mask_storeu_epi32(e + j / 2, lanes_below((left + 1) / 2),
                                     _mm512_mask_blend_epi16(high, a, _mm512_slli_epi32(b, 16)));
            if (o)
                _mm512_mask_storeu_epi32(
                    o + j / 2, lanes_below(left / 2),
                    _mm512_mask_blend_epi16(high, _mm512_srli_epi32(a, 16), b));
        }
}

/* deal_h of a whole plane in one pass (kernel_table.h's deal2_h): rows in order, row r to the
 * destinations of its parity; rows of at most 16 words two per load (2w contiguous words),
 * permuted to [row r's even | odd | row r + 1's even | odd] in 8-word quarters. */
static void bf16_deal2_h(const uint16_t *x, int h, int w, uint16_t *e0, uint16_t *o0, uint16_t *e1,
                         uint16_t *o1, size_t ld) {
    if (w <= 16) {
        /* quarter q, word i: row q / 2's word 2 i + q % 2, rows w words apart */
        uint16_t idx[32];
        for (int q = 0; q < 4; q++)
            for (int i = 0; i < 8; i++) idx[8 * q + i] = (uint16_t)((q / 2) * w + 2 * i + q % 2);
        const __m512i perm = _mm512_loadu_si512(idx);
        const __mmask8 ne = (__mmask8)lanes_below((w + 1) / 2), no = (__mmask8)lanes_below(w / 2);
        for (int r = 0; r < h; r += 2, x += 2 * w, e0 += ld, o0 += ld, e1 += ld, o1 += ld) {
            const bool two = r + 1 < h;
            const __m512i v = _mm512_permutexvar_epi16(
                perm, _mm512_maskz_loadu_epi16(words_below(two ? 2 * w : w), x));
            _mm_mask_storeu_epi16(e0, ne, _mm512_castsi512_si128(v));
            _mm_mask_storeu_epi16(o0, no, _mm512_extracti32x4_epi32(v, 1));
            if (!two) break;
            _mm_mask_storeu_epi16(e1, ne, _mm512_extracti32x4_epi32(v, 2));
            _mm_mask_storeu_epi16(o1, no, _mm512_extracti32x4_epi32(v, 3));
        }
        return;
    }
    if (w <= 32 && cf__bf16_words_loops_take()) {
        /* rows of 17 to 32 words (W1's 28 x 28 planes): one load a row, permuted to [even | odd]
         * as deal_h's, the masks made once, a row pair per step (deal_h a call a row made the
         * masks again for every row) */
        const __m512i evens_odds =
            _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 30, 28, 26,
                             24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        const __mmask32 in = words_below(w);
        const __mmask16 ne = lanes_below((w + 1) / 2), no = lanes_below(w / 2);
        int r = 0;
        for (; r + 2 <= h; r += 2, x += 2 * w, e0 += ld, o0 += ld, e1 += ld, o1 += ld) {
            const __m512i a = _mm512_permutexvar_epi16(evens_odds, _mm512_maskz_loadu_epi16(in, x)),
                          b = _mm512_permutexvar_epi16(evens_odds,
                                                       _mm512_maskz_loadu_epi16(in, x + w));
            _mm256_mask_storeu_epi16(e0, ne, _mm512_castsi512_si256(a));
            _mm256_mask_storeu_epi16(o0, no, _mm512_extracti64x4_epi64(a, 1));
            _mm256_mask_storeu_epi16(e1, ne, _mm512_castsi512_si256(b));
            _mm256_mask_storeu_epi16(o1, no, _mm512_extracti64x4_epi64(b, 1));
        }
        if (r < h) {
            const __m512i a = _mm512_permutexvar_epi16(evens_odds, _mm512_maskz_loadu_epi16(in, x));
            _mm256_mask_storeu_epi16(e0, ne, _mm512_castsi512_si256(a));
            _mm256_mask_storeu_epi16(o0, no, _mm512_extracti64x4_epi64(a, 1));
        }
        return;
    }
    for (int r = 0; r < h; r++, x += w) { /* longer rows: deal_h's, one row at a time */
        const size_t at = (size_t)(r / 2) * ld;
        bf16_deal_h(x, (size_t)w, 1, w, (r % 2 ? e1 : e0) + at, (r % 2 ? o1 : o0) + at, ld);
    }
}

/* interleave_rows of a whole plane in one pass (kernel_table.h's interleave2_rows): rows in
 * order; rows of at most 16 values two at a time (2n contiguous values of out): the even row's a
 * and b values in the low halves of two vectors, the odd row's in the high halves, then two
 * permutes into out's 2n values. */
static void bf16_interleave2_rows(const float *a0, const float *b0, const float *a1,
                                  const float *b1, size_t lds, int h, int n, float *out) {
    if (n <= 16) {
        /* out's value j of the pair of rows: row j / n, its value jj = j % n from a (jj even)
         * or b (16 on in permutex2var's index) at 8 * row + jj / 2 */
        int32_t idx[32];
        for (int j = 0; j < 32; j++) {
            const int row = j / n, jj = j % n;
            idx[j] = row > 1 ? 0 : (jj % 2 ? 16 : 0) + 8 * row + jj / 2;
        }
        const __m512i lo_idx = _mm512_loadu_si512(idx), hi_idx = _mm512_loadu_si512(idx + 16);
        const __mmask8 na = (__mmask8)lanes_below((n + 1) / 2), nb = (__mmask8)lanes_below(n / 2);
        for (int r = 0; r < h; r += 2, a0 += lds, b0 += lds, a1 += lds, b1 += lds, out += 2 * n) {
            const bool two = r + 1 < h;
            __m512 va = _mm512_castps256_ps512(_mm256_maskz_loadu_ps(na, a0));
            __m512 vb = _mm512_castps256_ps512(_mm256_maskz_loadu_ps(nb, b0));
            if (two) {
                va = _mm512_insertf32x8(va, _mm256_maskz_loadu_ps(na, a1), 1);
                vb = _mm512_insertf32x8(vb, _mm256_maskz_loadu_ps(nb, b1), 1);
            }
            const int left = two ? 2 * n : n;
            _mm512_mask_storeu_ps(out, lanes_below(left), _mm512_permutex2var_ps(va, lo_idx, vb));
            if (left > 16)
                _mm512_mask_storeu_ps(out + 16, lanes_below(left - 16),
                                      _mm512_permutex2var_ps(va, hi_idx, vb));
        }
        return;
    }
    for (int r = 0; r < h; r++, out += n) {
        const size_t at = (size_t)(r / 2) * lds;
        bf16_interleave_rows((r % 2 ? a1 : a0) + at, (r % 2 ? b1 : b0) + at, lds, 1, n, out,
                             (size_t)n);
    }
}

/* ---- the stride-2 stem (conv_stem_bf16.c) ------------------------------------------------------
 *
 * The sums of one tile of 8 rows (the block at ap) by nv vectors at xv[v] + off[t]: conv_tile's
 * products and order of sums, term for term; rows_tile's and each conv_spread phase's. */
static inline __attribute__((always_inline)) void tile_sums(int nv, int taps, const int *off,
                                                            int pairs, const uint32_t *ap,
                                                            const uint32_t *xv[NV], size_t plane,
                                                            __m512 acc[MR][NV]) {
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int t = 0; t < taps; t++) {
        const size_t o = (size_t)off[t];
        for (int p = 0; p < pairs; p++, ap += MR) {
            const size_t at = o + (size_t)p * plane;
            __m512bh b[NV];
            for (int v = 0; v < nv; v++) b[v] = (__m512bh)_mm512_loadu_si512(xv[v] + at);
            for (int r = 0; r < MR; r++) {
                const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[r]);
                for (int v = 0; v < nv; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
            }
        }
    }
}

/* One tile of conv_rows: 8 rows by nv (1-3) vectors of 16 positions, vector v's positions at
 * xv[v] (conv_run's x + q) and stored at ov[v] under mask mk[v]; rows past `rows` not stored.
 * The same products and order of sums as conv_tile. */
static inline __attribute__((always_inline)) void
rows_tile(int nv, bool stream, int taps, const int *off, int pairs, const uint32_t *ap,
          const uint32_t *xv[NV], size_t plane, float *ov[NV], const __mmask16 mk[NV], size_t ldo,
          int rows) {
    __m512 acc[MR][NV];
    tile_sums(nv, taps, off, pairs, ap, xv, plane, acc);
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++)
            if (stream) /* whole aligned lines: no read of y's lines before they are written */
                _mm512_stream_ps(ov[v] + (size_t)r * ldo, acc[r][v]);
            else
                _mm512_mask_storeu_ps(ov[v] + (size_t)r * ldo, mk[v], acc[r][v]);
}

/* conv_run over h rows of w positions (row i at x + i * ldx), into dense rows: vectors of 16
 * positions within a row, three to a tile (a tile's vectors may lie in different rows), each
 * tile computed for every block of 8 rows while its positions are in L1. */
static void bf16_conv_rows(int taps, const int *off, int pairs, int m, const uint32_t *packed,
                           const uint32_t *x, size_t plane, size_t ldx, int h, int w, float *out,
                           size_t ldo) {
    const size_t block = (size_t)taps * pairs * MR;
    const int per_row = (w + 15) / 16, vectors = h * per_row;
    /* y's rows of whole lines (resnet's 64 x 64 outputs): streamed, as y (a batch's outputs, 1
     * MiB an image at W3) is not read again before it has left the caches */
    const bool stream = w % 16 == 0 && ldo % 16 == 0 && (uintptr_t)out % 64 == 0;
    for (int v0 = 0; v0 < vectors; v0 += NV) {
        const int nv = vectors - v0 < NV ? vectors - v0 : NV;
        const uint32_t *xv[NV];
        float *ov[NV];
        __mmask16 mk[NV];
        for (int v = 0; v < NV; v++) {
            const int g = v0 + (v < nv ? v : 0), i = g / per_row, j = 16 * (g % per_row);
            xv[v] = x + (size_t)i * ldx + j;
            ov[v] = out + (size_t)i * w + j;
            mk[v] = lanes_below(w - j);
        }
        for (int r0 = 0; r0 < m; r0 += MR) {
            const uint32_t *ap = packed + (size_t)(r0 / MR) * block;
            const int rows = m - r0 < MR ? m - r0 : MR;
            float *o[NV];
            for (int v = 0; v < NV; v++) o[v] = ov[v] + (size_t)r0 * ldo;
            if (nv == 3 && stream)
                rows_tile(3, true, taps, off, pairs, ap, xv, plane, o, mk, ldo, rows);
            else if (nv == 3)
                rows_tile(3, false, taps, off, pairs, ap, xv, plane, o, mk, ldo, rows);
            else if (nv == 2)
                rows_tile(2, stream, taps, off, pairs, ap, xv, plane, o, mk, ldo, rows);
            else
                rows_tile(1, stream, taps, off, pairs, ap, xv, plane, o, mk, ldo, rows);
        }
    }
    if (stream) _mm_sfence(); /* the streamed lines ordered before what the caller does next */
}

#define SR MR /* conv_spread's tile: 8 rows by NV vectors, one phase after the other */

/* One tile of conv_spread: the even phase's sums, set aside in L1 (both phases' accumulators
 * at once would not fit the registers), then the odd phase's; per row and vector the two
 * phases' 16 values (each plus its addend where given) interleaved in registers into 32 places
 * of out from ov[v], stored under mk[v][0] and mk[v][1]. */
static inline __attribute__((always_inline)) void
spread_tile(int nv, const int taps[2], const int *const off[2], int pairs, const uint32_t *ap[2],
            const uint32_t *xv[NV], size_t plane, const float *av[2][NV], const __mmask16 ak[2][NV],
            size_t lda, float *ov[NV], const __mmask16 mk[NV][2], size_t ldo, int rows) {
    __m512 acc[SR][NV];
    float even[SR][NV][16] __attribute__((aligned(64)));
    tile_sums(nv, taps[0], off[0], pairs, ap[0], xv, plane, acc);
    for (int r = 0; r < SR; r++)
        for (int v = 0; v < nv; v++) _mm512_store_ps(even[r][v], acc[r][v]);
    tile_sums(nv, taps[1], off[1], pairs, ap[1], xv, plane, acc);
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0),
                  hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    /* unrolled, so that the accumulators stay in registers (a loop to rows spills them) */
#pragma GCC unroll 8
    for (int r = 0; r < SR; r++) {
        if (r >= rows) break;
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) {
            __m512 e = _mm512_load_ps(even[r][v]), o = acc[r][v];
            if (av[0][v]) e = _mm512_add_ps(e, _mm512_maskz_loadu_ps(ak[0][v], av[0][v] + r * lda));
            if (av[1][v]) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(ak[1][v], av[1][v] + r * lda));
            float *d = ov[v] + (size_t)r * ldo;
            _mm512_mask_storeu_ps(d, mk[v][0], _mm512_permutex2var_ps(e, lo, o));
            if (mk[v][1]) _mm512_mask_storeu_ps(d + 16, mk[v][1], _mm512_permutex2var_ps(e, hi, o));
        }
    }
}

/* kernel_table.h's conv_spread: conv_rows' vectors (16 positions within a row), three to a tile,
 * each tile computed for every block of 8 rows of m while its positions are in L1; out's lines of a
 * tile fetched for writing as it starts (out, stride 2's dx, has left the caches since the last
 * step, and a store that waits for its line stalls the tile). */
static void bf16_conv_spread(const int taps[2], const int *const off[2], const uint32_t *packed[2],
                             int pairs, int m, const uint32_t *x, size_t plane, size_t ldx, int h,
                             int n, const float *const add[2], size_t lda, float *out, size_t ldo,
                             size_t ldr) {
    const int per_row = ((n + 1) / 2 + 15) / 16, vectors = h * per_row;
    const size_t block[2] = {(size_t)taps[0] * pairs * MR, (size_t)taps[1] * pairs * MR};
    for (int v0 = 0; v0 < vectors; v0 += NV) {
        const int nv = vectors - v0 < NV ? vectors - v0 : NV;
        const uint32_t *xv[NV];
        const float *av[2][NV];
        float *ov[NV];
        __mmask16 ak[2][NV], mk[NV][2];
        for (int v = 0; v < NV; v++) {
            const int g = v0 + (v < nv ? v : 0), i = g / per_row, j = 16 * (g % per_row);
            const int left = n - 2 * j; /* out's places from the vector's first */
            xv[v] = x + (size_t)i * ldx + j;
            for (int ph = 0; ph < 2; ph++) {
                av[ph][v] = add[ph] ? add[ph] + (size_t)i * ldx + j : NULL;
                ak[ph][v] = lanes_below((left - ph + 1) / 2); /* the phase's values */
            }
            ov[v] = out + (size_t)i * ldr + 2 * (size_t)j;
            mk[v][0] = lanes_below(left);
            mk[v][1] = lanes_below(left - 16);
        }
        for (int r0 = 0; r0 < m; r0 += SR) {
            const int rows = m - r0 < SR ? m - r0 : SR;
            const uint32_t *ap[2];
            for (int ph = 0; ph < 2; ph++)
                ap[ph] = packed[ph] + (size_t)(r0 / MR) * block[ph] + r0 % MR;
            const float *a[2][NV];
            float *o[NV];
            for (int v = 0; v < NV; v++) {
                for (int ph = 0; ph < 2; ph++) a[ph][v] = av[ph][v] ? av[ph][v] + r0 * lda : NULL;
                o[v] = ov[v] + (size_t)r0 * ldo;
            }
            for (int v = 0; v < nv; v++) {
                const int left = n - 32 * ((v0 + v) % per_row);
                const size_t count = (size_t)(left < 32 ? left : 32);
                for (int r = 0; r < rows; r++)
                    prefetch_w_span(o[v] + (size_t)r * ldo, count * sizeof(float));
            }
            if (nv == 3)
                spread_tile(3, taps, off, pairs, ap, xv, plane, a, ak, lda, o, mk, ldo, rows);
            else if (nv == 2)
                spread_tile(2, taps, off, pairs, ap, xv, plane, a, ak, lda, o, mk, ldo, rows);
            else
                spread_tile(1, taps, off, pairs, ap, xv, plane, a, ak, lda, o, mk, ldo, rows);
        }
    }
}

/* b[q * ldb + t * k + kx] = x[off[t] + 4q + kx] | x[off[t] + 4q + kx + 2] << 16 (q < nq, t <
 * taps, kx < k <= 14): per (q, t) one load of the k + 2 values, one vpermw, one store of k
 * words. */
static void bf16_stem_pairs(const uint16_t *x, const int *off, int taps, int k, int nq, uint32_t *b,
                            size_t ldb) {
    /* halves (kx, kx + 2) of word kx */
    const __m512i idx = _mm512_set_epi16(17, 15, 16, 14, 15, 13, 14, 12, 13, 11, 12, 10, 11, 9, 10,
                                         8, 9, 7, 8, 6, 7, 5, 6, 4, 5, 3, 4, 2, 3, 1, 2, 0);
    const __mmask32 in = (__mmask32)((1u << (k + 2)) - 1u);
    const __mmask16 words = lanes_below(k);
    for (int q = 0; q < nq; q++, x += 4, b += ldb)
        for (int t = 0; t < taps; t++) {
            const __m512i r = _mm512_maskz_loadu_epi16(in, x + off[t]);
            _mm512_mask_storeu_epi32(b + (size_t)t * k, words, _mm512_permutexvar_epi16(idx, r));
        }
}

const cf_bf16_kernels cf_bf16_kernels_avx512 = {
    .from_fp32 = bf16_from_fp32_ne,
    .gemm = bf16_gemm,
    .gemm_a_words = gemm_a_words,
    .gemm_pack_a = gemm_pack_a,
    .gemm_packed = bf16_gemm_packed,
    .gemm_paired = bf16_gemm_paired,
    .gemm_rows = bf16_gemm_rows,
    .gemm_pack_a_rows = gemm_pack_a_rows,
    .gemm_unpack_a = gemm_unpack_a,
    .wino_pack_a = wino_pack_a,
    .pairs = bf16_pairs,
    .conv_run = bf16_conv_run,
    .conv_wgrad = bf16_conv_wgrad,
    .rows = bf16_rows,
    .pairs_rows = bf16_pairs_rows,
    .deal = bf16_deal,
    .deal_pairs = bf16_deal_pairs,
    .interleave = bf16_interleave,
    .position_pairs = bf16_position_pairs,
    .add_even = bf16_add_even,
    .copy_rows = bf16_copy_rows,
    .halves_rows = bf16_halves_rows,
    .conv_rows = bf16_conv_rows,
    .stem_pairs = bf16_stem_pairs,
    .interleave_rows = bf16_interleave_rows,
    .conv_cols = bf16_conv_cols,
    .fwd_pairs_rows = bf16_fwd_pairs_rows,
    .fwd_deal_pairs = bf16_fwd_deal_pairs,
    .conv_wgrad_runs = bf16_conv_wgrad_runs,
    .even_rows = bf16_even_rows,
    .rows_short = bf16_rows_short,
    .deal_short = bf16_deal_short,
    .rows_h = bf16_rows_h,
    .deal_h = bf16_deal_h,
    .keep_words = bf16_keep_words,
    .deal2_h = bf16_deal2_h,
    .interleave2_rows = bf16_interleave2_rows,
    .cols_spread = bf16_cols_spread,
    .deal_pairs_h = bf16_deal_pairs_h,
    .conv_spread = bf16_conv_spread,
};
#endif

/* conv_cols' prefetch of its output planes (kernel_table.h), here on every architecture so that
 * the switch links wherever the tests and benchmarks do; only this file's conv_cols reads it. */
#include <stdatomic.h>
#include <stdbool.h>

static atomic_bool cols_prefetch_on = true;

void cf__conv_bf16_set_cols_prefetch(bool on) {
    atomic_store(&cols_prefetch_on, on);
}

bool cf__conv_bf16_cols_prefetch(void) {
    return atomic_load_explicit(&cols_prefetch_on, memory_order_relaxed);
}

/* rows_h's and deal2_h's own loops for short rows (kernel_table.h), here on every architecture
 * as the switch above; only this file's rows_h and deal2_h read it. */
static atomic_bool words_loops_on = true;
/* Counted only once a test has read the count: a count on every call (25,600 a W1 step) moved
 * its cache line between the threads of a two-thread step, 0.45% of it. */
static atomic_bool words_loops_counting;
static atomic_ulong words_loops_calls;

void cf__bf16_set_words_loops(bool on) {
    atomic_store(&words_loops_on, on);
}

bool cf__bf16_words_loops_take(void) {
    if (!atomic_load_explicit(&words_loops_on, memory_order_relaxed)) return false;
    if (atomic_load_explicit(&words_loops_counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&words_loops_calls, 1, memory_order_relaxed);
    return true;
}

unsigned long cf__bf16_words_loops_calls(void) {
    atomic_store(&words_loops_counting, true);
    return atomic_load(&words_loops_calls);
}
