/* fastai's item transforms (Resize, RandomResizedCrop) and batch transforms (aug_transforms:
 * flip or dihedral, rotate, zoom, warp, brightness, contrast), per image.
 *
 * Randomness: each item's draws come from a generator seeded with (seed, epoch, item, a tag per
 * transform family), always consumed in the same order (also for a transform that is off or
 * masked), so an item's parameters do not depend on which thread or process handles it, or on
 * the other items. fastai draws per batch on the GPU; the distributions and probabilities are
 * the same (fastai/vision/augment.py). */
#include "data_internal.h"

#include <math.h>
#include <string.h>

#ifdef CF_HAVE_STB
#include <stb_image.h>
#endif
#include <limits.h>

enum { TAG_ITEM = 0x17e3, TAG_AUG = 0xa06 };

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void item_rng(cf_rng *rng, uint64_t seed, int epoch, int64_t item, uint64_t tag) {
    uint64_t z = mix64(seed ^ mix64(tag));
    z = mix64(z ^ (uint64_t)(int64_t)epoch);
    z = mix64(z ^ (uint64_t)item);
    cf_rng_seed(rng, z);
}

static double uniform(cf_rng *rng, double lo, double hi) {
    return lo + (hi - lo) * cf_rng_uniform(rng);
}

/* ---- crop, pad and resize ------------------------------------------------------------------ */

/* A source index for position i of an axis of n pixels under the pad mode (-1: zero). */
static int pad_index(int i, int n, cf_pad_mode pad) {
    if (i >= 0 && i < n) return i;
    switch (pad) {
    case CF_PAD_ZEROS:
        return -1;
    case CF_PAD_BORDER:
        return i < 0 ? 0 : n - 1;
    case CF_PAD_REFLECTION:
    default:
        if (n == 1) return 0;
        /* mirror without repeating the edge: period 2(n - 1) */
        int period = 2 * (n - 1);
        int k = i % period;
        if (k < 0) k += period;
        return k < n ? k : period - k;
    }
}

cf_status cf_crop_pad_resize(const float *img, int c, int h, int w, cf_crop_box box,
                             cf_pad_mode pad, int out_w, int out_h, float *out) {
    if (c < 1 || h < 1 || w < 1 || box.width < 1 || box.height < 1 || out_w < 1 || out_h < 1)
        return cf_fail(CF_ERR_INVALID,
                       "crop_pad_resize: image %dx%dx%d, region %dx%d at (%d, %d), output %dx%d", c,
                       h, w, box.width, box.height, box.left, box.top, out_w, out_h);
    bool inside =
        box.left >= 0 && box.top >= 0 && box.left + box.width <= w && box.top + box.height <= h;
    /* a region reaching past the image is padded into a copy; one inside is read in place */
    float *region = NULL;
    if (!inside) {
        region = cf_malloc((size_t)c * box.width * box.height * sizeof(float));
        if (!region)
            return cf_fail(CF_ERR_NOMEM, "crop_pad_resize: %dx%d region", box.width, box.height);
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < box.height; y++) {
                int sy = pad_index(box.top + y, h, pad);
                float *row = region + ((size_t)ch * box.height + y) * box.width;
                for (int x = 0; x < box.width; x++) {
                    int sx = pad_index(box.left + x, w, pad);
                    row[x] = sy < 0 || sx < 0 ? 0.0f : img[((size_t)ch * h + sy) * w + sx];
                }
            }
    }
    /* the region as planes with a row stride */
    const float *src = region ? region : img + (size_t)box.top * w + box.left;
    size_t row_stride = region ? (size_t)box.width : (size_t)w;
    size_t plane = region ? (size_t)box.width * box.height : (size_t)w * h;
    cf_status st = CF_OK;
    if (box.width == out_w && box.height == out_h) {
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < out_h; y++)
                memcpy(out + (size_t)ch * out_w * out_h + (size_t)y * out_w,
                       src + (size_t)ch * plane + (size_t)y * row_stride, out_w * sizeof(float));
    } else {
#ifdef CF_HAVE_STB
        /* stb_image_resize's triangle filter, plane by plane, its filters computed once */
        if (!cf__resize_planes_triangle(src, box.width, box.height,
                                        (int)(row_stride * sizeof(float)), plane, out, out_w, out_h,
                                        (size_t)out_w * out_h, c))
            st = cf_fail(CF_ERR_NOMEM, "crop_pad_resize: resizing %dx%d to %dx%d", box.width,
                         box.height, out_w, out_h);
#else
        st = cf_fail(CF_ERR_UNSUPPORTED, "crop_pad_resize: corefit was built without stb");
#endif
    }
    cf_free(region);
    return st;
}

/* ---- item transforms ----------------------------------------------------------------------- */

cf_item_tfm cf_resize_tfm(int size, cf_resize_method method) {
    return (cf_item_tfm){.kind = CF_ITEM_TFM_RESIZE,
                         .width = size,
                         .height = size,
                         .method = method,
                         .pad_mode = CF_PAD_REFLECTION};
}

cf_item_tfm cf_random_resized_crop_tfm(int size, float min_scale) {
    return (cf_item_tfm){.kind = CF_ITEM_TFM_RANDOM_RESIZED_CROP,
                         .width = size,
                         .height = size,
                         .pad_mode = CF_PAD_REFLECTION,
                         .min_scale = min_scale > 0 ? min_scale : 0.08f,
                         .max_scale = 1.0f,
                         .ratio_lo = 3.0f / 4.0f,
                         .ratio_hi = 4.0f / 3.0f,
                         .val_xtra = 0.14f};
}

/* fastai's Resize.encodes: the crop (or padded) region of the target aspect. */
static cf_crop_box resize_box(const cf_item_tfm *t, int w, int h, bool train, cf_rng *rng) {
    if (t->method == CF_RESIZE_SQUISH) return (cf_crop_box){0, 0, w, h};
    double pct_x = 0.5, pct_y = 0.5;
    if (train) {
        pct_x = cf_rng_uniform(rng);
        pct_y = cf_rng_uniform(rng);
    }
    double rw = (double)w / t->width, rh = (double)h / t->height;
    bool take_w = t->method == CF_RESIZE_PAD ? rw > rh : rw < rh;
    double m = take_w ? rw : rh;
    int cw = (int)(m * t->width), chh = (int)(m * t->height);
    return (cf_crop_box){(int)(pct_x * (w - cw)), (int)(pct_y * (h - chh)), cw, chh};
}

/* fastai's RandomResizedCrop.before_call (training). */
static cf_crop_box rrc_box(const cf_item_tfm *t, int w, int h, cf_rng *rng) {
    for (int attempt = 0; attempt < 10; attempt++) {
        double area = uniform(rng, t->min_scale, t->max_scale) * w * h;
        double ratio = exp(uniform(rng, log(t->ratio_lo), log(t->ratio_hi)));
        int nw = (int)nearbyint(sqrt(area * ratio)), nh = (int)nearbyint(sqrt(area / ratio));
        if (nw <= w && nh <= h) {
            int left = (int)cf_rng_below(rng, (uint64_t)(w - nw + 1));
            int top = (int)cf_rng_below(rng, (uint64_t)(h - nh + 1));
            return (cf_crop_box){left, top, nw, nh};
        }
    }
    int cw = w, chh = h;
    if ((double)w / h < t->ratio_lo)
        chh = (int)(w / t->ratio_lo);
    else if ((double)w / h > t->ratio_hi)
        cw = (int)(h * t->ratio_hi);
    return (cf_crop_box){(w - cw) / 2, (h - chh) / 2, cw, chh};
}

cf_crop_box cf_item_tfm_box(const cf_item_tfm *t, int w, int h, bool train, uint64_t seed,
                            int epoch, int64_t item) {
    cf_rng rng;
    item_rng(&rng, seed, epoch, item, TAG_ITEM);
    switch (t->kind) {
    case CF_ITEM_TFM_RESIZE:
        return resize_box(t, w, h, train, &rng);
    case CF_ITEM_TFM_RANDOM_RESIZED_CROP:
        return train ? rrc_box(t, w, h, &rng) : (cf_crop_box){0, 0, w, h};
    default:
        return (cf_crop_box){0, 0, w, h};
    }
}

cf_status cf_item_tfm_apply(const cf_item_tfm *t, const float *img, int c, int h, int w, bool train,
                            uint64_t seed, int epoch, int64_t item, float *out) {
    if (!t || t->kind == CF_ITEM_TFM_NONE || t->width < 1 || t->height < 1)
        return cf_fail(CF_ERR_INVALID, "item transform: no transform or size %dx%d",
                       t ? t->width : 0, t ? t->height : 0);
    cf_crop_box box = cf_item_tfm_box(t, w, h, train, seed, epoch, item);
    if (t->kind != CF_ITEM_TFM_RANDOM_RESIZED_CROP || train)
        return cf_crop_pad_resize(img, c, h, w, box, t->pad_mode, t->width, t->height, out);
    /* validation: squish to size + extra, then the centre */
    int big = t->width > t->height ? t->width : t->height;
    int xtra = (int)ceil(big * (double)t->val_xtra / 8.0) * 8;
    int fw = t->width + xtra, fh = t->height + xtra;
    float *tmp = cf_malloc((size_t)c * fw * fh * sizeof(float));
    if (!tmp) return cf_fail(CF_ERR_NOMEM, "RandomResizedCrop: %dx%d buffer", fw, fh);
    cf_status st = cf_crop_pad_resize(img, c, h, w, box, t->pad_mode, fw, fh, tmp);
    if (st == CF_OK)
        st = cf_crop_pad_resize(
            tmp, c, fh, fw,
            (cf_crop_box){(fw - t->width) / 2, (fh - t->height) / 2, t->width, t->height},
            t->pad_mode, t->width, t->height, out);
    cf_free(tmp);
    return st;
}

cf_status cf_image_decode_tfm(const void *bytes, size_t n, const char *name, int channels,
                              const cf_item_tfm *t, bool train, uint64_t seed, int epoch,
                              int64_t item, float *out) {
    if (!bytes || !out || !t || (channels != 1 && channels != 3))
        return cf_fail(CF_ERR_INVALID, "%s: cf_image_decode_tfm: bad arguments", name);
#ifdef CF_HAVE_STB
    int w = 0, h = 0, comp = 0;
    if (n > INT_MAX || !stbi_info_from_memory(bytes, (int)n, &w, &h, &comp) || w < 1 || h < 1)
        /* cf_image_decode says what is wrong with the file */
        return cf_image_decode(bytes, n, name, channels, 1, out, &w, &h);
    if ((int64_t)w * h > ((int64_t)1 << 26))
        return cf_fail(CF_ERR_FORMAT, "%s: image size %d x %d refused", name, w, h);
    float *full = cf_malloc((size_t)channels * w * h * sizeof(float));
    if (!full) return cf_fail(CF_ERR_NOMEM, "%s: %d x %d image", name, w, h);
    cf_status st = cf_image_decode(bytes, n, name, channels, 0, full, &w, &h);
    if (st == CF_OK) st = cf_item_tfm_apply(t, full, channels, h, w, train, seed, epoch, item, out);
    if (st != CF_OK) cf_fail_context(st, "%s", name);
    cf_free(full);
    return st;
#else
    (void)n, (void)train, (void)seed, (void)epoch, (void)item;
    return cf_fail(CF_ERR_UNSUPPORTED, "%s: corefit was built without stb", name);
#endif
}

/* ---- batch transforms ---------------------------------------------------------------------- */

cf_aug_opts cf_aug_transforms_defaults(float mult) {
    if (!(mult > 0)) mult = 1.0f;
    return (cf_aug_opts){.do_flip = true,
                         .flip_vert = false,
                         .max_rotate = 10.0f * mult,
                         .min_zoom = 1.0f,
                         .max_zoom = 1.1f,
                         .max_lighting = 0.2f * mult,
                         .max_warp = 0.2f * mult,
                         .p_affine = 0.75f,
                         .p_lighting = 0.75f,
                         .pad_mode = CF_PAD_REFLECTION};
}

static void matmul3(double a[3][3], const double b[3][3]) {
    double r[3][3];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            r[i][j] = a[i][0] * b[0][j] + a[i][1] * b[1][j] + a[i][2] * b[2][j];
    memcpy(a, r, sizeof r);
}

/* Solves the 8x8 system a x = b by Gaussian elimination with partial pivoting (fastai's
 * find_coeffs uses torch.solve). */
static bool solve8(double a[8][8], double b[8], double x[8]) {
    for (int col = 0; col < 8; col++) {
        int piv = col;
        for (int r = col + 1; r < 8; r++)
            if (fabs(a[r][col]) > fabs(a[piv][col])) piv = r;
        if (fabs(a[piv][col]) < 1e-12) return false;
        if (piv != col) {
            for (int k = 0; k < 8; k++) {
                double t = a[col][k];
                a[col][k] = a[piv][k];
                a[piv][k] = t;
            }
            double t = b[col];
            b[col] = b[piv];
            b[piv] = t;
        }
        for (int r = col + 1; r < 8; r++) {
            double f = a[r][col] / a[col][col];
            for (int k = col; k < 8; k++) a[r][k] -= f * a[col][k];
            b[r] -= f * b[col];
        }
    }
    for (int r = 7; r >= 0; r--) {
        double s = b[r];
        for (int k = r + 1; k < 8; k++) s -= a[r][k] * x[k];
        x[r] = s / a[r][r];
    }
    return true;
}

/* fastai's _WarpCoord: the perspective taking the corners (-1, -1), (-1, 1), (1, -1), (1, 1) to
 * the moved ones (find_coeffs(orig, targ)). */
static bool warp_coeffs(double xt, double yt, double c[8]) {
    const double p1[4][2] = {{-1, -1}, {-1, 1}, {1, -1}, {1, 1}};
    const double p2[4][2] = {
        {-1 - yt, -1 - xt}, {-1 + yt, 1 + xt}, {1 + yt, -1 + xt}, {1 - yt, 1 - xt}};
    double a[8][8], b[8];
    for (int i = 0; i < 4; i++) {
        const double X = p2[i][0], Y = p2[i][1];
        const double ra[8] = {X, Y, 1, 0, 0, 0, -p1[i][0] * X, -p1[i][0] * Y};
        const double rb[8] = {0, 0, 0, X, Y, 1, -p1[i][1] * X, -p1[i][1] * Y};
        memcpy(a[2 * i], ra, sizeof ra);
        memcpy(a[2 * i + 1], rb, sizeof rb);
        b[2 * i] = p1[i][0];
        b[2 * i + 1] = p1[i][1];
    }
    return solve8(a, b, c);
}

void cf_aug_draw(const cf_aug_opts *o, uint64_t seed, int epoch, int64_t item, int h, int w,
                 cf_aug_params *p) {
    cf_rng rng;
    item_rng(&rng, seed, epoch, item, TAG_AUG);
    memset(p, 0, sizeof *p);
    /* every draw is made whether or not it is used, so the stream's order never changes */
    const int dihedral = (int)cf_rng_below(&rng, 8);
    const bool flip_on = cf_rng_uniform(&rng) < 0.5;
    const double deg = uniform(&rng, -o->max_rotate, o->max_rotate);
    const bool rot_on = cf_rng_uniform(&rng) < o->p_affine;
    const double zoom = uniform(&rng, o->min_zoom, o->max_zoom);
    const bool zoom_on = cf_rng_uniform(&rng) < o->p_affine;
    const double col = cf_rng_uniform(&rng), row = cf_rng_uniform(&rng);
    const double wx = uniform(&rng, -o->max_warp, o->max_warp);
    const bool wx_on = cf_rng_uniform(&rng) < o->p_affine;
    const double wy = uniform(&rng, -o->max_warp, o->max_warp);
    const bool wy_on = cf_rng_uniform(&rng) < o->p_affine;
    const double ml = o->max_lighting;
    const double bright = uniform(&rng, 0.5 * (1 - ml), 0.5 * (1 + ml));
    const bool bright_on = cf_rng_uniform(&rng) < o->p_lighting;
    const double contrast = ml < 1 ? exp(uniform(&rng, log(1 - ml), -log(1 - ml))) : 1.0;
    const bool contrast_on = cf_rng_uniform(&rng) < o->p_lighting;

    p->flip = 1.0f;
    p->zoom = 1.0f;
    p->brightness = 0.5f;
    p->contrast = 1.0f;
    p->col_pct = (float)col;
    p->row_pct = (float)row;
    if (o->flip_vert)
        p->dihedral = flip_on ? dihedral : 0;
    else if (o->do_flip && flip_on)
        p->flip = -1.0f;
    if (o->max_rotate > 0 && rot_on) p->rotate_deg = (float)deg;
    if ((o->min_zoom < 1 || o->max_zoom > 1) && zoom_on) p->zoom = (float)(1.0 / zoom);
    if (o->max_warp > 0) {
        p->warp_x = wx_on ? (float)wx : 0.0f;
        p->warp_y = wy_on ? (float)wy : 0.0f;
    }
    if (ml > 0) {
        if (bright_on) p->brightness = (float)bright;
        if (contrast_on) p->contrast = (float)contrast;
    }

    /* aff_m = flip (or dihedral) @ rotate @ zoom, as setup_aug_tfms composes them */
    double m[3][3] = {{p->flip, 0, 0}, {0, 1, 0}, {0, 0, 1}};
    if (o->flip_vert) {
        static const int xs[8] = {1, -1, 1, -1, -1, 1, 1, -1}, ys[8] = {1, 1, -1, 1, -1, -1, 1, -1};
        static const int m0[8] = {1, 1, 1, 0, 1, 0, 0, 0}, m1[8] = {0, 0, 0, 1, 0, 1, 1, 1};
        int k = p->dihedral;
        const double d[3][3] = {
            {xs[k] * m0[k], xs[k] * m1[k], 0}, {ys[k] * m1[k], ys[k] * m0[k], 0}, {0, 0, 1}};
        memcpy(m, d, sizeof d);
    }
    const double th = p->rotate_deg * M_PI / 180.0;
    const double r[3][3] = {{cos(th), sin(th), 0}, {-sin(th), cos(th), 0}, {0, 0, 1}};
    matmul3(m, r);
    const double s = p->zoom;
    const double z[3][3] = {
        {s, 0, (1 - s) * (2 * col - 1)}, {0, s, (1 - s) * (2 * row - 1)}, {0, 0, 1}};
    matmul3(m, z);
    m[0][1] *= (double)h / w; /* _prepare_mat */
    m[1][0] *= (double)w / h;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) p->mat[i][j] = (float)m[i][j];
    p->has_affine = !(m[0][0] == 1 && m[0][1] == 0 && m[0][2] == 0 && m[1][0] == 0 &&
                      m[1][1] == 1 && m[1][2] == 0);
    p->has_warp = (p->warp_x != 0 || p->warp_y != 0) && warp_coeffs(p->warp_x, p->warp_y, p->warp);
    p->has_lighting = p->brightness != 0.5f || p->contrast != 1.0f;
}

static inline float logit_clamp(float x) {
    const float lo = 1e-7f, hi = 1.0f - 1e-7f;
    return x < lo ? lo : x > hi ? hi : x;
}

/* fastai's brightness and contrast on the logits of n values in place:
 * 1 / (1 + exp(-(logit(x) + lb) k)) with logit(x) = -log(1 / x - 1) of x clamped to
 * [1e-7, 1 - 1e-7]. The arithmetic around logf and expf is in passes of its own (the
 * divisions vectorise); every value takes the same operations in the same order. */
static void lighting(float *x, size_t n, float lb, float k) {
    enum { LIGHT_CHUNK = 256 };
    float t[LIGHT_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += LIGHT_CHUNK) {
        const size_t m = n - i0 < LIGHT_CHUNK ? n - i0 : LIGHT_CHUNK;
        float *v = x + i0;
        for (size_t i = 0; i < m; i++) t[i] = 1.0f / logit_clamp(v[i]) - 1.0f;
        for (size_t i = 0; i < m; i++) t[i] = logf(t[i]);
        for (size_t i = 0; i < m; i++) t[i] = -(-t[i] + lb) * k;
        for (size_t i = 0; i < m; i++) t[i] = expf(t[i]);
        for (size_t i = 0; i < m; i++) v[i] = 1.0f / (1.0f + t[i]);
    }
}

void cf_aug_apply(const cf_aug_params *p, cf_pad_mode pad, const float *in, int c, int h, int w,
                  float *out) {
    const size_t plane = (size_t)h * w;
    if (!p->has_affine && !p->has_warp) {
        memcpy(out, in, (size_t)c * plane * sizeof(float));
    } else {
        /* a chunk of a row at a time: its taps and weights (the tensor layer's grid_sample),
         * then each plane */
        const cf_grid_pad gp = pad == CF_PAD_ZEROS    ? CF_GRID_ZEROS
                               : pad == CF_PAD_BORDER ? CF_GRID_BORDER
                                                      : CF_GRID_REFLECTION;
        int32_t idx[4 * CF_GRID_CHUNK];
        float wt[4 * CF_GRID_CHUNK];
        for (int i = 0; i < h; i++)
            for (int j0 = 0; j0 < w; j0 += CF_GRID_CHUNK) {
                const int n = w - j0 < CF_GRID_CHUNK ? w - j0 : CF_GRID_CHUNK;
                cf_grid_sample_taps(p->mat, p->has_warp ? p->warp : NULL, gp, h, w, i, j0, n, idx,
                                    wt);
                for (int ch = 0; ch < c; ch++)
                    cf_grid_sample_gather(n, idx, wt, in + (size_t)ch * plane,
                                          out + (size_t)ch * plane + (size_t)i * w + j0);
            }
    }
    if (p->has_lighting) {
        const float lb = -logf(1.0f / logit_clamp(p->brightness) - 1.0f);
        lighting(out, (size_t)c * plane, lb, p->contrast);
    }
}
