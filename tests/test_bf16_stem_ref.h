/* The bf16 stride-2 stem as it was first written (src/tensor/conv_stem_bf16.c before its
 * forward pass stored straight into y's rows and its weight gradient dropped the padding
 * columns): K' = C k 2 ((k + 1) / 2) columns in the weight gradient, the forward pass in bands
 * copied out of a padded-stride buffer, X'^T built by scalar loops. test_bf16_stem checks the
 * library's stem bitwise against it: the products and the order of every sum are meant to be the
 * same. Uses the level's conv_run, copy_rows, gemm_rows and from_fp32 (and conv_order, if any). */
#ifndef CF_TEST_BF16_STEM_REF_H
#define CF_TEST_BF16_STEM_REF_H

#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <string.h>

enum { REF_CHUNK = 256 }; /* positions of a dW chunk: 128 pairs, one k-block of the bf16 GEMM */
enum {
    REF_BAND_WORDS = 512
}; /* about this many positions (with a row's padding) per forward band */

typedef struct ref_layout {
    int C, O, k, p, kxp; /* kernel row pairs: (k + 1) / 2 */
    int taps;            /* C * k: one per (channel, kernel row) */
    int oh, ow, P;       /* output */
    size_t wp;           /* words of a padded row (ow + kxp) */
    size_t prow;         /* rows of a parity plane */
    size_t pad_words;    /* the padded image, with slack */
    size_t kk;           /* K' = taps * 2 kxp */
    size_t ldb;          /* dW's X'^T row stride, words */
    int band;            /* output rows per forward band */
    size_t nqb;          /* positions of a band, rounded up to 16 */
    size_t packed_words, order_words, out_floats, a_words, b_words, dw_floats;
} ref_layout;

static size_t ref_up(size_t n, size_t m) {
    return (n + m - 1) / m * m;
}

static void ref_layout_make(ref_layout *l, const cf_conv_geom *g, int out_channels) {
    l->C = g->c, l->O = out_channels, l->k = g->kh, l->p = g->ph, l->kxp = (g->kh + 1) / 2;
    l->taps = l->C * l->k;
    l->oh = g->oh, l->ow = g->ow, l->P = g->oh * g->ow;
    l->wp = (size_t)l->ow + l->kxp;
    l->prow = (size_t)(g->h + 2 * l->p + 1) / 2 + 1;
    /* conv_run reads up to 47 words past a band's last position, past the last tap's offset */
    l->pad_words = (size_t)l->C * 2 * l->prow * l->wp + 64;
    l->kk = (size_t)l->taps * 2 * l->kxp;
    l->ldb = ref_up(l->kk, 16);
    if (l->ldb / 16 % 2 == 0) l->ldb += 16; /* rows an odd number of lines apart */
    l->band = REF_BAND_WORDS / (int)l->wp < 1 ? 1 : REF_BAND_WORDS / (int)l->wp;
    if (l->band > l->oh) l->band = l->oh;
    l->nqb = ref_up((size_t)l->band * l->wp, 16);
    l->packed_words = ref_up((size_t)l->O, 8) * l->taps * l->kxp;
    l->order_words = 16 * (size_t)l->taps * l->kxp;
    l->out_floats = ref_up((size_t)l->O, 8) * l->nqb;
    l->a_words = (size_t)l->O * REF_CHUNK / 2;
    l->b_words = (size_t)REF_CHUNK / 2 * l->ldb + 16;
    l->dw_floats = (size_t)l->O * l->kk;
}

static size_t ref_stem_scratch(const cf_conv_geom *g, int out_channels) {
    ref_layout l;
    ref_layout_make(&l, g, out_channels);
    const size_t fwd = l.packed_words + l.order_words + l.out_floats;
    const size_t bwd = l.a_words + l.b_words + l.dw_floats;
    return l.pad_words + (fwd > bwd ? fwd : bwd) + 64;
}

/* x (C x h x w) rounded to bf16 into the padded parity planes (plane (c, parity) at c * 2 + parity,
 * rows of wp words). */
static void ref_pad_image(const ref_layout *l, const cf_conv_geom *g, const float *x,
                          uint16_t *pad) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    memset(pad, 0, l->pad_words * sizeof(uint32_t));
    const size_t row16 = 2 * l->wp, plane16 = l->prow * row16;
    for (int c = 0; c < l->C; c++)
        for (int iy = 0; iy < g->h; iy++) {
            const int pr = iy + l->p;
            uint16_t *dst =
                pad + (size_t)(2 * c + pr % 2) * plane16 + (size_t)(pr / 2) * row16 + l->p;
            k->from_fp32(x + ((size_t)c * g->h + iy) * g->w, dst, (size_t)g->w);
        }
}

/* The weight word of row o, tap t = c * k + ky, pair j. */
static uint32_t ref_weight_pair(const ref_layout *l, const float *w, int o, int t, int j) {
    const float *row = w + ((size_t)o * l->C * l->k + t) * l->k; /* (O, C, k, k): row t of o */
    float v[2] = {row[2 * j], 2 * j + 1 < l->k ? row[2 * j + 1] : 0.0f};
    uint16_t b[2];
    cf_fp32_to_bf16(v, b, 2);
    return (uint32_t)b[0] | (uint32_t)b[1] << 16;
}

static void ref_stem_forward(const cf_conv_geom *g, int out_channels, const float *w,
                             const float *x, int n_images, float *y, float *scratch) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    ref_layout l;
    ref_layout_make(&l, g, out_channels);
    uint32_t *pad = (uint32_t *)scratch, *packed = pad + l.pad_words;
    uint32_t *tmp = packed + l.packed_words;
    float *out = (float *)(tmp + l.order_words);
    /* W' in conv_run's blocks of 8 rows, [block][tap][pair][8], rows past O zero */
    const int mb = (int)ref_up((size_t)l.O, 8);
    for (int o = 0; o < mb; o++)
        for (int t = 0; t < l.taps; t++)
            for (int j = 0; j < l.kxp; j++)
                packed[(((size_t)(o / 8) * l.taps + t) * l.kxp + j) * 8 + o % 8] =
                    o < l.O ? ref_weight_pair(&l, w, o, t, j) : 0;
    if (k->conv_order) k->conv_order(packed, l.taps, l.kxp, l.O, tmp);
    int off[8 * 11];
    for (int t = 0; t < l.taps; t++) { /* channel c, kernel row ky: its parity plane, row ky / 2 */
        const int c = t / l.k, ky = t % l.k;
        off[t] = (int)(((size_t)(2 * c + ky % 2) * l.prow + (size_t)(ky / 2)) * l.wp);
    }
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)l.O * l.P;
    for (int n = 0; n < n_images; n++) {
        ref_pad_image(&l, g, x + (size_t)n * in_n, (uint16_t *)pad);
        float *yn = y + (size_t)n * out_n;
        for (int oy0 = 0; oy0 < l.oh; oy0 += l.band) {
            const int rows = l.oh - oy0 < l.band ? l.oh - oy0 : l.band;
            const int nq = (int)ref_up((size_t)rows * l.wp, 16);
            k->conv_run(l.taps, off, l.kxp, l.O, packed, pad + (size_t)oy0 * l.wp, 1, nq, out,
                        l.nqb);
            for (int o = 0; o < l.O; o++)
                k->copy_rows(out + (size_t)o * l.nqb, l.wp, rows, l.ow,
                             yn + (size_t)o * l.P + (size_t)oy0 * l.ow);
        }
    }
}

/* X'^T of the positions [p0, p0 + n) (n even, whole pairs within rows: ow even) paired over
 * position pairs: b[q * ldb + (t * kxp + j) * 2 + e] for pair q, tap t, kernel column kx = 2j + e
 * is x'(kx, 2q) | x'(kx, 2q + 1) << 16, x'(kx, s) the padded row's value at 2 ox_s + kx. */
static void ref_position_pairs(const ref_layout *l, const uint16_t *pad, int p0, int n,
                               uint32_t *b) {
    const size_t row16 = 2 * l->wp, plane16 = l->prow * row16;
    const int kx2 = 2 * l->kxp;
    for (int q = 0; q < n / 2; q++) {
        const int pos = p0 + 2 * q, oy = pos / l->ow, ox = pos % l->ow;
        uint32_t *bq = b + (size_t)q * l->ldb;
        for (int t = 0; t < l->taps; t++) {
            const int c = t / l->k, ky = t % l->k, pr = 2 * oy + ky;
            const uint16_t *r =
                pad + (size_t)(2 * c + pr % 2) * plane16 + (size_t)(pr / 2) * row16 + 2 * ox;
            uint32_t *bt = bq + (size_t)t * kx2;
            for (int kx = 0; kx < kx2; kx++) bt[kx] = (uint32_t)r[kx] | (uint32_t)r[kx + 2] << 16;
        }
    }
}

static void ref_stem_wgrad(const cf_conv_geom *g, int out_channels, const float *dy, const float *x,
                           int n_images, float *dwt, bool accumulate, float *scratch) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    ref_layout l;
    ref_layout_make(&l, g, out_channels);
    uint32_t *pad = (uint32_t *)scratch, *a = pad + l.pad_words, *b = a + l.a_words;
    float *dwp = (float *)(b + l.b_words);
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)l.O * l.P;
    bool add = false;
    for (int n = 0; n < n_images; n++) {
        ref_pad_image(&l, g, x + (size_t)n * in_n, (uint16_t *)pad);
        const float *dyn = dy + (size_t)n * out_n;
        for (int p0 = 0; p0 < l.P; p0 += REF_CHUNK) {
            const int cnt = l.P - p0 < REF_CHUNK ? l.P - p0 : REF_CHUNK; /* even: ow is */
            for (int o = 0; o < l.O; o++)
                k->from_fp32(dyn + (size_t)o * l.P + p0, (uint16_t *)(a + (size_t)o * cnt / 2),
                             (size_t)cnt);
            ref_position_pairs(&l, (const uint16_t *)pad, p0, cnt, b);
            k->gemm_rows(l.O, (int)l.kk, cnt, a, (size_t)cnt / 2, b, l.ldb, dwp, (int)l.kk, add);
            add = true;
        }
    }
    /* dwt (K x O, K = C * k * k) (+)= dW' transposed, without the padding columns */
    const int K = l.C * l.k * l.k, kx2 = 2 * l.kxp;
    for (int kk = 0; kk < K; kk++) {
        const int t = kk / l.k, kx = kk % l.k;
        const float *src = dwp + (size_t)t * kx2 + kx;
        float *dst = dwt + (size_t)kk * l.O;
        for (int o = 0; o < l.O; o++) {
            const float v = n_images > 0 ? src[(size_t)o * l.kk] : 0.0f;
            dst[o] = accumulate ? dst[o] + v : v;
        }
    }
}

#endif
