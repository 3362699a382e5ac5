/* Convolutions without a patch matrix ("implicit GEMM"), for stride 1 with the output as large
 * as the input and for stride 2 on even-sized images (ResNets' 3x3 layers, their 1x1 and 3x3
 * downsampling layers).
 *
 * A stride-2 image is split into its four phase planes, x_ab[u][v] = x[2u + a][2v + b], each
 * as large as the output; a kernel tap then reads one phase plane shifted by a whole number of
 * rows and columns, exactly as a stride-1 tap reads the image. So every layer is a sum over
 * taps of shifted planes: tap t reads plane phase(t) at offset shift(t), masked where the
 * shifted position leaves the plane. The GEMM kernel keeps a tile of 8 output rows by up to 3
 * vectors of 16 output positions in registers and runs taps outside, channels inside: per tap
 * the load offsets and masks are fixed. Positions run over the images one after the other, so a
 * vector may hold the end of one image and the start of the next; its lanes then come from two
 * masked loads and go out in two masked stores.
 *
 *   forward   y[o] = sum over taps t, channels c of w[o][c][t] * shift_t(x_phase(t)[c])
 *   dx        phase ab of dx[c] = sum over the taps of phase ab, o of w[o][c][t] * shift_-t(dy[o])
 *   dW        dW[o][c][t] = sum over output positions (u, v) of dy[o][u][v] *
 *             x[c][s*u + ki - pad][s*v + kj - pad] for tap t = (ki, kj), from the image
 *             transposed (channels contiguous) into a zero border, so that every tap is a plain
 *             walk with no masks, s positions apart (no phase split: the walk's step is s times
 *             the channels); a register tile sums the positions of a block of images
 *             (wgrad_block). */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <stdint.h>
#include <string.h>

#define PACK_ROWS CF_PACK_ROWS

static size_t round_rows(int rows) { /* rows padded to whole packed blocks */
    return (size_t)((rows + PACK_ROWS - 1) / PACK_ROWS * PACK_ROWS);
}

typedef struct layout {
    int stride, phases; /* 1 and 1, or 2 and 4 */
    int oh, ow, plane;  /* output (= phase plane) size */
    int taps;
    int phase[CF_IMPLICIT_MAX_TAPS], di[CF_IMPLICIT_MAX_TAPS], dj[CF_IMPLICIT_MAX_TAPS];
    /* dW's transposed image: hp x wp positions, the image's first row and column at pad */
    int hp, wp, pad;
} layout;

static int floor_div2(int v) {
    return v >= 0 ? v / 2 : -((1 - v) / 2);
}

static void layout_make(layout *l, const cf_conv_geom *g) {
    l->stride = g->sh;
    l->phases = g->sh * g->sh;
    l->oh = g->oh;
    l->ow = g->ow;
    l->plane = g->oh * g->ow;
    l->taps = g->kh * g->kw;
    /* every tap of every output position inside: rows 0 .. (oh - 1) * s + kh - 1 */
    l->pad = g->ph;
    l->hp = (g->oh - 1) * g->sh + g->kh > g->ph + g->h ? (g->oh - 1) * g->sh + g->kh : g->ph + g->h;
    l->wp = (g->ow - 1) * g->sw + g->kw > g->pw + g->w ? (g->ow - 1) * g->sw + g->kw : g->pw + g->w;
    for (int t = 0; t < l->taps; t++) {
        const int ri = t / g->kw - g->ph, rj = t % g->kw - g->pw; /* input offset from s*out */
        if (l->stride == 1) {
            l->phase[t] = 0;
            l->di[t] = ri;
            l->dj[t] = rj;
        } else {
            l->di[t] = floor_div2(ri);
            l->dj[t] = floor_div2(rj);
            l->phase[t] = (ri - 2 * l->di[t]) * 2 + (rj - 2 * l->dj[t]);
        }
    }
}

bool cf_conv_implicit_supported(const cf_conv_geom *g) {
    if (!cf_active_kernels->implicit_run) return false;
    if (g->kh != g->kw || g->sh != g->sw || g->ph != g->pw) return false;
    if (g->kh * g->kw > CF_IMPLICIT_MAX_TAPS) return false;
    const int plane = g->oh * g->ow;
    if (plane < 16 || plane > CF_IMPLICIT_MAX_PLANE) return false;
    if (g->sh == 1) return g->oh == g->h && g->ow == g->w;
    if (g->sh == 2) return g->h % 2 == 0 && g->w % 2 == 0 && 2 * g->oh == g->h && 2 * g->ow == g->w;
    return false;
}

typedef cf_implicit_taps taps;
#define ROW_BYTES CF_TAPS_ROW_BYTES

/* The scratch starts with room for four tap lists (dx has one per phase), in floats rounded up
 * to a cache line. */
#define TAPS_FLOATS ((sizeof(taps) + 63) / 64 * 16)
#define TAP_LISTS 4

/* Images per block of a stride-2 call: the phase split of a block sits in the scratch, and a
 * block has at least 1024 output positions (mostly full tiles of 3 vectors; measured: 256 left
 * a fifth of the tiles at 2 vectors and cost 10% on W1's stride-2 layers). */
static int block_images(const layout *l) {
    return l->stride == 1 ? 1 : (1024 + l->plane - 1) / l->plane;
}

/* Images per block of the weight gradient: the kernel's register tiles sum over the positions
 * of a whole block, at least WGRAD_POSITIONS of them (1 image of 14x14, 3 of 7x7). Longer blocks
 * lost more than they saved: a tap's rows of a block of 14x14 images no longer stay in L1 while
 * every tile of output channels reads them (measured at AVX2: 512 positions took W1's 32-channel
 * 14x14 layer from 108 to 100 GFLOP/s; 128 took its 7x7 layer from 102 to 105). */
#define WGRAD_POSITIONS 128

static int wgrad_block(const layout *l) {
    return (WGRAD_POSITIONS + l->plane - 1) / l->plane;
}

/* Floats per image of the weight gradient's transposed, zero-bordered image. */
static size_t wgrad_image_floats(const layout *l, int channels) {
    return (size_t)l->hp * l->wp * channels;
}

size_t cf_conv_implicit_wgrad_scratch(const cf_conv_geom *g) {
    layout l;
    layout_make(&l, g);
    /* a block's transposed images */
    return TAP_LISTS * TAPS_FLOATS + (size_t)wgrad_block(&l) * wgrad_image_floats(&l, g->c);
}

size_t cf_conv_implicit_scratch(const cf_conv_geom *g, int out_channels) {
    layout l;
    layout_make(&l, g);
    (void)out_channels;
    /* the weight gradient's, or a stride-2 block's phase split */
    const size_t wgrad = cf_conv_implicit_wgrad_scratch(g),
                 blocks = TAP_LISTS * TAPS_FLOATS +
                          (l.stride == 1 ? 0 : (size_t)block_images(&l) * g->c * g->h * g->w);
    return wgrad > blocks ? wgrad : blocks;
}

size_t cf_conv_implicit_packed_size(const cf_conv_geom *g, int out_channels) {
    /* forward: blocks of output channels by input channels; dx: the other way round */
    const size_t fwd = round_rows(out_channels) * g->c, dx = round_rows(g->c) * out_channels;
    return (fwd > dx ? fwd : dx) * g->kh * g->kw;
}

/* packed = A in the kernel's order for the taps list[0..n): blocks of 8 rows; in a block,
 * tap-major then channel, the 8 rows' values side by side (rows past m are 0). A(r, c, t) =
 * a[r*a_row + c*a_c + t]. */
static float *pack(int m, int channels, const int *list, int n, const float *a, ptrdiff_t a_row,
                   ptrdiff_t a_c, float *packed) {
    for (int m0 = 0; m0 < m; m0 += PACK_ROWS)
        for (int s = 0; s < n; s++)
            for (int c = 0; c < channels; c++) {
                float *d = packed + (((size_t)m0 * n + (size_t)s * PACK_ROWS) * channels) +
                           (size_t)c * PACK_ROWS;
                for (int i = 0; i < PACK_ROWS; i++)
                    d[i] = m0 + i < m ? a[(m0 + i) * a_row + c * a_c + list[s]] : 0.0f;
            }
    return packed + round_rows(m) * n * channels;
}

void cf_conv_implicit_pack(const cf_conv_geom *g, int out_channels, const float *w, float *packed) {
    int list[CF_IMPLICIT_MAX_TAPS];
    const int T = g->kh * g->kw;
    for (int t = 0; t < T; t++) list[t] = t;
    pack(out_channels, g->c, list, T, w, (ptrdiff_t)g->c * T, T, packed);
}

void cf_conv_implicit_pack_dx(const cf_conv_geom *g, int out_channels, const float *w,
                              float *packed) {
    /* per phase of dx, its taps: A(r = input channel, c = output channel, t) = w[c][r][t] */
    layout l;
    layout_make(&l, g);
    const int T = l.taps;
    for (int ph = 0; ph < l.phases; ph++) {
        int list[CF_IMPLICIT_MAX_TAPS], n = 0;
        for (int t = 0; t < T; t++)
            if (l.phase[t] == ph) list[n++] = t;
        packed = pack(g->c, out_channels, list, n, w, T, (ptrdiff_t)g->c * T, packed);
    }
}

/* Adds a tap reading the plane at base, shifted by (di, dj) in an oh x ow plane. */
static void taps_add(taps *tp, const layout *l, ptrdiff_t base, int di, int dj) {
    const int t = tp->n++;
    tp->plane = l->plane;
    tp->offset[t] = base + (ptrdiff_t)di * l->ow + dj;
    unsigned char *row = tp->valid[t];
    memset(row, 0, ROW_BYTES);
    for (int y = 0, p = 0; y < l->oh; y++)
        for (int x = 0; x < l->ow; x++, p++)
            if (y + di >= 0 && y + di < l->oh && x + dj >= 0 && x + dj < l->ow)
                row[p >> 3] |= (unsigned char)(1u << (p & 7));
}

/* Stride 2: the phase planes of one image, xs[c][a*2 + b][u][v] = x[c][2u + a][2v + b], for
 * the phases whose bit is set in `used`. */
static void split_phases(const cf_conv_geom *g, const float *x, float *xs, unsigned used) {
    if (cf_active_kernels->split_phases) {
        cf_active_kernels->split_phases(g, x, xs, used);
        return;
    }
    const int oh = g->oh, ow = g->ow, w = g->w;
    const size_t plane = (size_t)oh * ow;
    for (int c = 0; c < g->c; c++) {
        const float *xc = x + (size_t)c * g->h * w;
        float *sc = xs + (size_t)c * 4 * plane;
        for (int ph = 0; ph < 4; ph++) {
            if (!(used >> ph & 1u)) continue;
            const int a = ph / 2, b = ph % 2;
            float *restrict d = sc + (size_t)ph * plane;
            for (int u = 0; u < oh; u++) {
                const float *restrict r = xc + (size_t)(2 * u + a) * w + b;
                for (int v = 0; v < ow; v++) d[(size_t)u * ow + v] = r[2 * v];
            }
        }
    }
}

/* The inverse: x[c][2u + a][2v + b] = xs[c][a*2 + b][u][v]. */
static void merge_phases(const cf_conv_geom *g, const float *xs, float *x) {
    if (cf_active_kernels->merge_phases) {
        cf_active_kernels->merge_phases(g, xs, x);
        return;
    }
    const int oh = g->oh, ow = g->ow, w = g->w;
    const size_t plane = (size_t)oh * ow;
    for (int c = 0; c < g->c; c++) {
        float *xc = x + (size_t)c * g->h * w;
        const float *sc = xs + (size_t)c * 4 * plane;
        for (int a = 0; a < 2; a++) {
            const float *restrict s0 = sc + (size_t)(2 * a) * plane, *restrict s1 = s0 + plane;
            for (int u = 0; u < oh; u++) {
                float *restrict r = xc + (size_t)(2 * u + a) * w;
                for (int v = 0; v < ow; v++) {
                    r[2 * v] = s0[(size_t)u * ow + v];
                    r[2 * v + 1] = s1[(size_t)u * ow + v];
                }
            }
        }
    }
}

static unsigned phases_used(const layout *l) {
    unsigned used = 0;
    for (int t = 0; t < l->taps; t++) used |= 1u << l->phase[t];
    return used;
}

/* Part `part` of `parts` of the floats at p into L2 (spread over the parts of a computation). */
static void prefetch_part(const float *p, size_t floats, int part, int parts) {
    const size_t bytes = floats * sizeof(float),
                 slice = ((bytes + (size_t)parts - 1) / (size_t)parts + 63) / 64 * 64,
                 from = (size_t)part * slice;
    if (from < bytes)
        cf_prefetch((const char *)p + from, bytes - from < slice ? bytes - from : slice, false,
                    false);
}

void cf_conv_implicit_forward(const cf_conv_geom *g, int out_channels, const float *packed,
                              const float *x, int n_images, float *y, float *scratch) {
    cf_conv_implicit_forward_with(g, out_channels, packed, x, n_images, y, scratch, NULL);
}

void cf_conv_implicit_forward_with(const cf_conv_geom *g, int out_channels, const float *packed,
                                   const float *x, int n_images, float *y, float *scratch,
                                   const cf_conv_shortcut *shortcut) {
    layout l;
    layout_make(&l, g);
    taps *tp = (taps *)scratch;
    scratch += TAP_LISTS * TAPS_FLOATS;
    tp->n = 0;
    for (int t = 0; t < l.taps; t++)
        taps_add(tp, &l, (ptrdiff_t)l.phase[t] * l.plane, l.di[t], l.dj[t]);
    const size_t image = (size_t)g->c * g->h * g->w, y_image = (size_t)out_channels * l.plane;
    if (l.stride == 1) {
        cf_active_kernels->implicit_run(tp, g->c, out_channels, packed, x, (size_t)l.plane, image,
                                        n_images, y, (size_t)l.plane, y_image);
        return;
    }
    const unsigned used = phases_used(&l) | (shortcut ? 1u : 0u);
    const int block = block_images(&l);
    for (int n0 = 0; n0 < n_images; n0 += block) {
        const int nb = n_images - n0 < block ? n_images - n0 : block;
        for (int n = 0; n < nb; n++) {
            if (n0 + n + 1 < n_images)
                cf_prefetch(x + (size_t)(n0 + n + 1) * image, image * sizeof(float), false, false);
            split_phases(g, x + (size_t)(n0 + n) * image, scratch + (size_t)n * image, used);
        }
        cf_active_kernels->implicit_run(tp, g->c, out_channels, packed, scratch,
                                        4 * (size_t)l.plane, image, nb, y + (size_t)n0 * y_image,
                                        (size_t)l.plane, y_image);
        if (!shortcut) continue;
        /* phase 0 of channel c at c * 4 * plane: the shortcut's patch matrix, rows 4 planes
         * apart */
        const size_t s_image = (size_t)shortcut->out_channels * l.plane;
        for (int n = 0; n < nb; n++) {
            if (n0 + n + 1 < n_images)
                cf_prefetch(shortcut->y + (size_t)(n0 + n + 1) * s_image, s_image * sizeof(float),
                            true, false);
            cf_sgemm_strided(shortcut->out_channels, l.plane, g->c, shortcut->w, g->c, 1,
                             scratch + (size_t)n * image, 4 * l.plane,
                             shortcut->y + (size_t)(n0 + n) * s_image, l.plane, false);
        }
    }
}

void cf_conv_implicit_dx(const cf_conv_geom *g, int out_channels, const float *packed_dx,
                         const float *dy, int n_images, float *dx, float *scratch) {
    cf_conv_implicit_dx_with(g, out_channels, packed_dx, dy, n_images, dx, scratch, NULL);
}

void cf_conv_implicit_dx_with(const cf_conv_geom *g, int out_channels, const float *packed_dx,
                              const float *dy, int n_images, float *dx, float *scratch,
                              const cf_conv_shortcut *shortcut) {
    layout l;
    layout_make(&l, g);
    const size_t image = (size_t)g->c * g->h * g->w, dy_image = (size_t)out_channels * l.plane;
    const size_t per_tap = round_rows(g->c) * out_channels; /* packed floats per tap */
    /* stride 1 writes dx itself, all images in one call; stride 2 writes a block's phases into
     * the scratch, then merges them into dx */
    const int block = l.stride == 1 ? n_images : block_images(&l);
    taps *phase_taps = (taps *)scratch;
    scratch += TAP_LISTS * TAPS_FLOATS;
    for (int ph = 0; ph < l.phases; ph++) {
        phase_taps[ph].n = 0;
        phase_taps[ph].plane = l.plane;
        for (int t = 0; t < l.taps; t++)
            if (l.phase[t] == ph) taps_add(&phase_taps[ph], &l, 0, -l.di[t], -l.dj[t]);
    }
    for (int n0 = 0; n0 < n_images; n0 += block) {
        const int nb = n_images - n0 < block ? n_images - n0 : block;
        float *out = l.stride == 1 ? dx + (size_t)n0 * image : scratch;
        const float *a = packed_dx;
        for (int ph = 0; ph < l.phases; ph++) {
            const taps *tp = &phase_taps[ph];
            float *yp = out + (size_t)ph * l.plane;
            const size_t y_row = (size_t)l.phases * l.plane;
            if (tp->n == 0) { /* no tap reads this phase: its gradient is zero */
                for (int n = 0; n < nb; n++)
                    for (int c = 0; c < g->c; c++)
                        memset(yp + n * image + c * y_row, 0, (size_t)l.plane * sizeof(float));
                continue;
            }
            cf_active_kernels->implicit_run(tp, out_channels, g->c, a, dy + (size_t)n0 * dy_image,
                                            (size_t)l.plane, dy_image, nb, yp, y_row, image);
            a += per_tap * tp->n;
        }
        if (shortcut && l.stride == 2) { /* phase 0 += w^T . dy_shortcut, image by image */
            const size_t s_image = (size_t)shortcut->out_channels * l.plane;
            for (int n = 0; n < nb; n++) {
                if (n0 + n + 1 < n_images) /* written long before, by the idpath's backward */
                    cf_prefetch(shortcut->dy + (size_t)(n0 + n + 1) * s_image,
                                s_image * sizeof(float), false, false);
                cf_sgemm_strided(g->c, l.plane, shortcut->out_channels, shortcut->w, 1, g->c,
                                 shortcut->dy + (size_t)(n0 + n) * s_image, l.plane,
                                 scratch + (size_t)n * image, 4 * l.plane, true);
            }
        }
        if (l.stride == 2)
            for (int n = 0; n < nb; n++) {
                if (n0 + n + 1 < n_images)
                    cf_prefetch(dx + (size_t)(n0 + n + 1) * image, image * sizeof(float), true,
                                false);
                merge_phases(g, scratch + (size_t)n * image, dx + (size_t)(n0 + n) * image);
            }
    }
}

/* One image transposed (channels contiguous) into xt's zero border: xt[(y + pad) * wp + x + pad]
 * holds x[:][y][x]. Rows that no tap reads (the odd ones of a 1x1 stride-2 layer) are skipped. */
static void wgrad_transpose(const cf_conv_geom *g, const layout *l, const float *x, float *xt) {
    const int C = g->c, s = l->stride;
    const size_t row = (size_t)l->wp * C, x_plane = (size_t)g->h * g->w;
    for (int y = 0; y < l->hp; y++) {
        bool read = false; /* y = s*u + ki for some output row u and tap row ki */
        for (int ki = 0; ki < g->kh && !read; ki++)
            read = y >= ki && (y - ki) % s == 0 && (y - ki) / s < l->oh;
        if (!read) continue;
        float *t = xt + (size_t)y * row;
        const int iy = y - l->pad;
        if (iy < 0 || iy >= g->h) {
            memset(t, 0, row * sizeof(float));
            continue;
        }
        memset(t, 0, (size_t)l->pad * C * sizeof(float));
        memset(t + (size_t)(l->pad + g->w) * C, 0,
               (size_t)(l->wp - l->pad - g->w) * C * sizeof(float));
        cf_transpose(C, g->w, x + (size_t)iy * g->w, (ptrdiff_t)x_plane, t + (size_t)l->pad * C, C);
    }
}

void cf_conv_implicit_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                            const float *x, int n_images, float *dwt, bool accumulate,
                            float *scratch) {
    cf_conv_implicit_wgrad_with(g, out_channels, dy, x, n_images, dwt, accumulate, scratch, NULL);
}

void cf_conv_implicit_wgrad_with(const cf_conv_geom *g, int out_channels, const float *dy,
                                 const float *x, int n_images, float *dwt, bool accumulate,
                                 float *scratch, const cf_conv_shortcut *shortcut) {
    layout l;
    layout_make(&l, g);
    const int C = g->c, m = out_channels, block = wgrad_block(&l);
    const size_t plane = (size_t)l.plane, image = (size_t)C * g->h * g->w,
                 dy_image = (size_t)m * plane, xt_image = wgrad_image_floats(&l, C);
    /* a block's transposed images */
    float *xt = scratch + TAP_LISTS * TAPS_FLOATS;
    const ptrdiff_t row_step = (ptrdiff_t)l.stride * l.wp * C, pos_step = (ptrdiff_t)l.stride * C;
    for (int n0 = 0; n0 < n_images; n0 += block) {
        const int nb = n_images - n0 < block ? n_images - n0 : block;
        for (int n = 0; n < nb; n++)
            wgrad_transpose(g, &l, x + (size_t)(n0 + n) * image, xt + (size_t)n * xt_image);
        /* the next block's images and output gradients, a slice per tap, are brought into L2
         * while this block's taps compute (a layer's input was written in forward and has left
         * the caches; the transposes read a row of every channel plane at once, too many
         * streams for the hardware prefetchers). Not the images of 1x1 strided layers, whose
         * transposes skip rows. */
        const int next_nb = n0 + nb >= n_images          ? 0
                            : n_images - n0 - nb < block ? n_images - n0 - nb
                                                         : block;
        const size_t s_image = shortcut ? (size_t)shortcut->out_channels * plane : 0;
        for (int tap = 0; tap < l.taps; tap++) {
            if (g->kh > 1 || l.stride == 1)
                prefetch_part(x + (size_t)(n0 + nb) * image, next_nb * image, tap, l.taps);
            prefetch_part(dy + (size_t)(n0 + nb) * dy_image, next_nb * dy_image, tap, l.taps);
            if (shortcut)
                prefetch_part(shortcut->dy + (size_t)(n0 + nb) * s_image, next_nb * s_image, tap,
                              l.taps);
            const int ki = tap / g->kw, kj = tap % g->kw;
            const float *bt = xt + ((size_t)ki * l.wp + kj) * C;
            cf_active_kernels->implicit_wgrad(
                m, C, l.oh, l.ow, nb, dy + (size_t)n0 * dy_image, (ptrdiff_t)plane, dy_image, bt,
                row_step, pos_step, xt_image, dwt + (size_t)tap * m * C, accumulate || n0 > 0);
        }
        if (shortcut) /* x[2u][2v] sits at padded (2u + pad, 2v + pad) */
            cf_active_kernels->implicit_wgrad(
                shortcut->out_channels, C, l.oh, l.ow, nb, shortcut->dy + (size_t)n0 * s_image,
                (ptrdiff_t)plane, s_image, xt + ((size_t)l.pad * l.wp + l.pad) * C, row_step,
                pos_step, xt_image, shortcut->dw, accumulate || n0 > 0);
    }
}
