/* A stride-2 stem on a few input channels in bf16 (an RGB image's 7x7 stride-2 layer: resnet's
 * first convolution), without the fp32 patch matrix.
 *
 * The image is rounded to bf16 once per call into zero-padded rows (p = (k - 1) / 2 zeros on each
 * side), the even and the odd padded rows in two planes per channel. Tap (ky, kx) of output
 * (oy, ox) reads padded row 2 oy + ky, column 2 ox + kx, so the pair of taps (2j, 2j + 1) of a
 * kernel row is the 32-bit word ox + j of that row: the forward pass is the level's implicit bf16
 * kernel (cf_bf16_kernels.conv_rows, conv_run's sums stored straight into y's rows) with one
 * "tap" per (channel, kernel row) at the row's offset in its parity plane and (k + 1) / 2
 * "channel pairs" one word apart (the last pair's second value a zero weight), over the output
 * rows oy, row oy's positions at oy * Wp + ox (Wp = ow + (k + 1) / 2 words a row).
 *
 *   forward  y (O x P) = W' (O x K') . X' (K' x P), K' = C * k * 2 ((k + 1) / 2) (K padded per
 *            kernel row to even), the whole image in one call
 *   dW       dW (O x K) = bf16(dy) (O x S) . X'^T (S x K) over chunks of S positions: dy's rows,
 *            rounded once per image (or span of positions), are already rows of pairs over the
 *            positions (cf_bf16_kernels.gemm_rows), X'^T is paired over position pairs (ox,
 *            ox + 1) straight from the padded rows (cf_bf16_kernels.stem_pairs, K columns, no
 *            padding); dW is then added, transposed (K x O), into the caller's sums
 *
 * Numerics: the products of bf16(x) and bf16(w) (forward), bf16(x) and bf16(dy) (dW) are exact in
 * fp32 and summed in fp32: autocast's rounding of the layer's operands. The order of the sums is
 * fixed (tests/test_bf16_stem.c holds the earlier layout, K' columns and a copy-out per band, and
 * checks these bitwise against it). */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <string.h>

enum { CHUNK = 256 }; /* positions of a dW chunk: 128 pairs, one k-block of the bf16 GEMM */

typedef struct stem_layout {
    int C, O, k, p, kxp; /* kernel row pairs: (k + 1) / 2 */
    int taps;            /* C * k: one per (channel, kernel row) */
    int K;               /* C * k * k */
    int oh, ow, P;       /* output */
    size_t wp;           /* words of a padded row (ow + kxp) */
    size_t prow;         /* rows of a parity plane */
    size_t pad_words;    /* the padded image, with slack */
    size_t ldb;          /* dW's X'^T row stride, words */
    int span;            /* positions of dy rounded at a time (a multiple of CHUNK, or P) */
    size_t packed_words, wb_words, a_words, b_words, dw_floats;
} stem_layout;

static size_t up(size_t n, size_t m) {
    return (n + m - 1) / m * m;
}

static void layout_make(stem_layout *l, const cf_conv_geom *g, int out_channels) {
    l->C = g->c, l->O = out_channels, l->k = g->kh, l->p = g->ph, l->kxp = (g->kh + 1) / 2;
    l->taps = l->C * l->k;
    l->K = l->taps * l->k;
    l->oh = g->oh, l->ow = g->ow, l->P = g->oh * g->ow;
    l->wp = (size_t)l->ow + l->kxp;
    l->prow = (size_t)(g->h + 2 * l->p + 1) / 2 + 1;
    /* conv_rows reads up to 47 words past a row's last position, past the last tap's offset */
    l->pad_words = (size_t)l->C * 2 * l->prow * l->wp + 64;
    l->ldb = up((size_t)l->K, 16);
    if (l->ldb / 16 % 2 == 0) l->ldb += 16; /* rows an odd number of lines apart */
    l->packed_words = up((size_t)l->O, 8) * l->taps * l->kxp;
    l->wb_words = ((size_t)l->O * l->K + 1) / 2;
    /* dy's rows rounded a whole image at a time (one pass over it, the rows then read from L2
     * by the chunks) where that takes at most K P / 2 words (within the patch matrix the caller
     * would have had: conv.c's scratch), else in spans of whole chunks */
    const size_t cap = (size_t)l->K * l->P / 2;
    if ((size_t)l->O * l->P / 2 <= cap)
        l->span = l->P;
    else {
        const size_t chunks = cap / ((size_t)l->O * CHUNK / 2);
        l->span = CHUNK * (int)(chunks < 1 ? 1 : chunks);
        if (l->span > l->P) l->span = l->P;
    }
    l->a_words = (size_t)l->O * (size_t)(l->span + 1) / 2;
    l->b_words = (size_t)CHUNK / 2 * l->ldb + 16;
    l->dw_floats = (size_t)l->O * l->K;
}

/* The stem's shapes, on any level (cf_conv_stem_bf16_supported adds the level's kernels). */
static bool stem_shape(const cf_conv_geom *g, int out_channels) {
    return g->c >= 1 && g->c < 8 && out_channels >= 1 && g->kh == g->kw && g->kh % 2 == 1 &&
           g->kh >= 3 && g->kh <= 11 && g->sh == 2 && g->sw == 2 && g->ph == (g->kh - 1) / 2 &&
           g->pw == g->ph && g->h % 2 == 0 && g->w % 2 == 0 && 2 * g->oh == g->h &&
           2 * g->ow == g->w && g->ow % 2 == 0;
}

bool cf_conv_stem_bf16_supported(const cf_conv_geom *g, int out_channels) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    return cf_bf16_compute() && k && k->conv_rows && k->stem_pairs && k->gemm_rows &&
           k->from_fp32 && stem_shape(g, out_channels);
}

/* The rule of tensor.h, on the shape alone (measured with bench_conv and bench_step: W1's gray
 * 3x3 stem, K = 9, lost in bf16 on every path tried: lowered 2.7 ms a step against fp32's 1.6;
 * a pair of input channels per bf16 word leaves half of each dot product zero). */
cf_conv_precision cf_conv_bf16_precision(const cf_conv_geom *g, int out_channels) {
    if (g->c >= 8) return CF_CONV_BF16;
    if (g->c * g->kh * g->kw >= 64 && stem_shape(g, out_channels)) return CF_CONV_BF16_STEM;
    return CF_CONV_FP32;
}

size_t cf_conv_stem_bf16_scratch(const cf_conv_geom *g, int out_channels) {
    stem_layout l;
    layout_make(&l, g, out_channels);
    const size_t fwd = l.packed_words + l.wb_words;
    const size_t bwd = l.a_words + l.b_words + l.dw_floats;
    return l.pad_words + (fwd > bwd ? fwd : bwd) + 64;
}

/* x (C x h x w) rounded to bf16 into the padded parity planes (plane (c, parity) at c * 2 + parity,
 * rows of wp words), everything else zero: each padded row written once. */
static void pad_image(const stem_layout *l, const cf_conv_geom *g, const float *x, uint16_t *pad) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    const size_t row16 = 2 * l->wp;
    uint16_t *row = pad;
    for (int c = 0; c < l->C; c++)
        for (int parity = 0; parity < 2; parity++)
            for (size_t r = 0; r < l->prow; r++, row += row16) {
                const int iy = (int)(2 * r) + parity - l->p; /* padded row 2r + parity */
                if (iy < 0 || iy >= g->h) {
                    memset(row, 0, row16 * sizeof(uint16_t));
                    continue;
                }
                memset(row, 0, (size_t)l->p * sizeof(uint16_t));
                k->from_fp32(x + ((size_t)c * g->h + iy) * g->w, row + l->p, (size_t)g->w);
                memset(row + l->p + g->w, 0, (row16 - l->p - g->w) * sizeof(uint16_t));
            }
    memset(row, 0, (l->pad_words * 2 - (size_t)(row - pad)) * sizeof(uint16_t));
}

/* The offsets of the taps (channel c, kernel row ky: its parity plane, row ky / 2), in words. */
static void tap_offsets(const stem_layout *l, int *off) {
    for (int t = 0; t < l->taps; t++) {
        const int c = t / l->k, ky = t % l->k;
        off[t] = (int)(((size_t)(2 * c + ky % 2) * l->prow + (size_t)(ky / 2)) * l->wp);
    }
}

void cf_conv_stem_bf16_forward(const cf_conv_geom *g, int out_channels, const float *w,
                               const float *x, int n_images, float *y, float *scratch) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    stem_layout l;
    layout_make(&l, g, out_channels);
    uint32_t *pad = (uint32_t *)scratch, *packed = pad + l.pad_words;
    uint16_t *wb = (uint16_t *)(packed + l.packed_words);
    /* W' in conv_rows' blocks of 8 rows, [block][tap][pair][8], rows past O zero: the weights
     * (O, C, k, k) rounded in one pass, row t of o at wb + (o * taps + t) * k */
    k->from_fp32(w, wb, (size_t)l.O * l.K);
    const int mb = (int)up((size_t)l.O, 8);
    for (int o = 0; o < mb; o++)
        for (int t = 0; t < l.taps; t++) {
            const uint16_t *row = wb + ((size_t)o * l.taps + t) * l.k;
            uint32_t *dst = packed + ((size_t)(o / 8) * l.taps + t) * l.kxp * 8 + o % 8;
            for (int j = 0; j < l.kxp; j++) {
                uint32_t word = 0;
                if (o < l.O)
                    word = (uint32_t)row[2 * j] | (2 * j + 1 < l.k ? row[2 * j + 1] : 0u) << 16;
                dst[(size_t)j * 8] = word;
            }
        }
    int off[8 * 11];
    tap_offsets(&l, off);
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)l.O * l.P;
    for (int n = 0; n < n_images; n++) {
        pad_image(&l, g, x + (size_t)n * in_n, (uint16_t *)pad);
        k->conv_rows(l.taps, off, l.kxp, l.O, packed, pad, 1, l.wp, l.oh, l.ow,
                     y + (size_t)n * out_n, (size_t)l.P);
    }
}

void cf_conv_stem_bf16_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                             const float *x, int n_images, float *dwt, bool accumulate,
                             float *scratch) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    stem_layout l;
    layout_make(&l, g, out_channels);
    uint32_t *pad = (uint32_t *)scratch, *a = pad + l.pad_words, *b = a + l.a_words;
    float *dwp = (float *)(b + l.b_words);
    const uint16_t *pad16 = (const uint16_t *)pad;
    /* the columns past K of b's rows are read (the kernel's last vector) and never stored */
    memset(b, 0, l.b_words * sizeof(uint32_t));
    int off[8 * 11];
    tap_offsets(&l, off);
    for (int t = 0; t < l.taps; t++) off[t] *= 2; /* in values */
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)l.O * l.P;
    const size_t row16 = 2 * l.wp, lda = (size_t)l.span / 2;
    bool add = false;
    for (int n = 0; n < n_images; n++) {
        pad_image(&l, g, x + (size_t)n * in_n, (uint16_t *)pad);
        const float *dyn = dy + (size_t)n * out_n;
        for (int s0 = 0; s0 < l.P; s0 += l.span) {
            const int scnt = l.P - s0 < l.span ? l.P - s0 : l.span; /* even: ow is */
            if (l.span == l.P) /* the image's rows one after another */
                k->from_fp32(dyn, (uint16_t *)a, out_n);
            else
                for (int o = 0; o < l.O; o++)
                    k->from_fp32(dyn + (size_t)o * l.P + s0, (uint16_t *)(a + (size_t)o * lda),
                                 (size_t)scnt);
            for (int p0 = s0; p0 < s0 + scnt; p0 += CHUNK) {
                const int cnt = s0 + scnt - p0 < CHUNK ? s0 + scnt - p0 : CHUNK;
                for (int pos = p0; pos < p0 + cnt;) { /* the chunk's pieces of output rows */
                    const int oy = pos / l.ow, ox = pos % l.ow;
                    const int end = (oy + 1) * l.ow < p0 + cnt ? (oy + 1) * l.ow : p0 + cnt;
                    k->stem_pairs(pad16 + (size_t)oy * row16 + 2 * (size_t)ox, off, l.taps, l.k,
                                  (end - pos) / 2, b + (size_t)(pos - p0) / 2 * l.ldb, l.ldb);
                    pos = end;
                }
                k->gemm_rows(l.O, l.K, cnt, a + (size_t)(p0 - s0) / 2, lda, b, l.ldb, dwp, l.K,
                             add);
                add = true;
            }
        }
    }
    /* dwt (K x O) (+)= dW transposed */
    for (int kk = 0; kk < l.K; kk++) {
        const float *src = dwp + kk;
        float *dst = dwt + (size_t)kk * l.O;
        for (int o = 0; o < l.O; o++) {
            const float v = n_images > 0 ? src[(size_t)o * l.K] : 0.0f;
            dst[o] = accumulate ? dst[o] + v : v;
        }
    }
}
