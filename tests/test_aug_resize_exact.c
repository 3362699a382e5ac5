/* The image pipeline's crop-and-resize and its batch augmentation give the same bits as the
 * straightforward code they replace: cf_crop_pad_resize against a padded copy of the region
 * resized plane by plane with stb_image_resize's own float triangle filter (one
 * stbir_resize_float_generic call per plane), and cf_aug_apply against the per-pixel reference
 * below (grid, perspective, padding, four bounds-checked taps per channel, then the lighting on
 * the logits), on random images, sizes and draws: region sizes up and down, regions reaching
 * past the edges in each padding mode, rows wider than the sampler's chunks, one-pixel images,
 * and values outside [0, 1] for the lighting's clamp. Compared with memcmp: a single bit of
 * difference fails. */
#include "oracle.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/data.h"

#ifdef CF_HAVE_STB
#include "data/stb_resize.h" /* stb_image_resize as src/data/resize.c compiles it */
#endif

static uint64_t rng_state;
static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static int below(int n) {
    return (int)(next_u64() % (uint64_t)n);
}

/* ---- reference: the region copied with padding, then one stb call per plane ---------------- */

static int ref_pad_index(int i, int n, cf_pad_mode pad) {
    if (i >= 0 && i < n) return i;
    if (pad == CF_PAD_ZEROS) return -1;
    if (pad == CF_PAD_BORDER) return i < 0 ? 0 : n - 1;
    if (n == 1) return 0;
    int period = 2 * (n - 1), k = i % period;
    if (k < 0) k += period;
    return k < n ? k : period - k;
}

static void ref_crop_pad_resize(const float *img, int c, int h, int w, cf_crop_box box,
                                cf_pad_mode pad, int out_w, int out_h, float *out) {
    float *region = malloc((size_t)c * box.width * box.height * sizeof(float));
    assert_non_null(region);
    for (int ch = 0; ch < c; ch++)
        for (int y = 0; y < box.height; y++)
            for (int x = 0; x < box.width; x++) {
                int sy = ref_pad_index(box.top + y, h, pad),
                    sx = ref_pad_index(box.left + x, w, pad);
                region[((size_t)ch * box.height + y) * box.width + x] =
                    sy < 0 || sx < 0 ? 0.0f : img[((size_t)ch * h + sy) * w + sx];
            }
    for (int ch = 0; ch < c; ch++) {
        const float *p = region + (size_t)ch * box.width * box.height;
        float *o = out + (size_t)ch * out_w * out_h;
        if (box.width == out_w && box.height == out_h) {
            memcpy(o, p, (size_t)out_w * out_h * sizeof(float));
            continue;
        }
#ifdef CF_HAVE_STB
        assert_true(stbir_resize_float_generic(
            p, box.width, box.height, 0, o, out_w, out_h, 0, 1, STBIR_ALPHA_CHANNEL_NONE, 0,
            STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, NULL));
#endif
    }
    free(region);
}

static void check_resize(int c, int h, int w, cf_crop_box box, cf_pad_mode pad, int out_w,
                         int out_h) {
    float *img = malloc((size_t)c * h * w * sizeof(float));
    float *got = malloc((size_t)c * out_w * out_h * sizeof(float));
    float *want = malloc((size_t)c * out_w * out_h * sizeof(float));
    assert_true(img && got && want);
    fill_uniform(img, (size_t)c * h * w, next_u64(), 0.0f, 1.0f);
    assert_int_equal(cf_crop_pad_resize(img, c, h, w, box, pad, out_w, out_h, got), CF_OK);
    ref_crop_pad_resize(img, c, h, w, box, pad, out_w, out_h, want);
    if (memcmp(got, want, (size_t)c * out_w * out_h * sizeof(float)) != 0) {
        size_t n = (size_t)c * out_w * out_h, i = 0;
        while (i < n && memcmp(got + i, want + i, sizeof(float)) == 0) i++;
        fail_msg("image %dx%dx%d, region %dx%d at (%d, %d), pad %d, output %dx%d: value %zu is "
                 "%.9g, stb per plane gives %.9g",
                 c, h, w, box.width, box.height, box.left, box.top, (int)pad, out_w, out_h, i,
                 (double)got[i], (double)want[i]);
    }
    free(img);
    free(got);
    free(want);
}

static void test_resize_same_bits_as_stb_per_plane(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#endif
    rng_state = 11;
    /* W3's case: RandomResizedCrop regions inside 128-160 px photos, to 128 and to 152 */
    for (int k = 0; k < 60; k++) {
        int h = 128 + below(33), w = 128 + below(33);
        int bw = 40 + below(w - 39), bh = 40 + below(h - 39);
        cf_crop_box box = {below(w - bw + 1), below(h - bh + 1), bw, bh};
        check_resize(3, h, w, box, CF_PAD_REFLECTION, k % 4 ? 128 : 152, k % 4 ? 128 : 152);
    }
    /* small and odd sizes, one axis kept, up and down, the sizes the shrinking assertion hit */
    const int sizes[][4] = {{17, 17, 12, 12}, {21, 9, 16, 9},  {45, 27, 32, 20}, {1, 1, 5, 3},
                            {7, 1, 3, 4},     {3, 30, 30, 3},  {64, 64, 64, 32}, {10, 40, 10, 7},
                            {2, 2, 1, 1},     {300, 5, 41, 5}, {5, 300, 5, 97},  {33, 31, 64, 62}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int h = sizes[k][0] + 3, w = sizes[k][1] + 2;
        cf_crop_box box = {1, 2, sizes[k][1], sizes[k][0]};
        for (int c = 1; c <= 4; c += 2)
            check_resize(c, h, w, box, CF_PAD_REFLECTION, sizes[k][3], sizes[k][2]);
    }
    /* regions reaching past the edges, every padding mode */
    const cf_pad_mode pads[] = {CF_PAD_ZEROS, CF_PAD_BORDER, CF_PAD_REFLECTION};
    for (int k = 0; k < 24; k++) {
        int h = 20 + below(40), w = 20 + below(40);
        int bw = w / 2 + below(w), bh = h / 2 + below(h);
        cf_crop_box box = {below(w) - w / 2, below(h) - h / 2, bw, bh};
        check_resize(3, h, w, box, pads[k % 3], 8 + below(60), 8 + below(60));
    }
    /* a region the size of the output, inside and outside */
    check_resize(3, 50, 60, (cf_crop_box){5, 7, 32, 24}, CF_PAD_ZEROS, 32, 24);
    check_resize(3, 50, 60, (cf_crop_box){-5, 30, 32, 24}, CF_PAD_REFLECTION, 32, 24);
    /* regions read in place that touch the image's last row and column, up and down, and
     * one-pixel images and regions (the last pixel of the last plane) */
    check_resize(3, 50, 60, (cf_crop_box){60 - 37, 50 - 21, 37, 21}, CF_PAD_REFLECTION, 16, 16);
    check_resize(2, 50, 60, (cf_crop_box){60 - 7, 50 - 5, 7, 5}, CF_PAD_REFLECTION, 23, 19);
    check_resize(5, 50, 60, (cf_crop_box){0, 0, 60, 50}, CF_PAD_ZEROS, 13, 77);
    check_resize(3, 1, 1, (cf_crop_box){0, 0, 1, 1}, CF_PAD_REFLECTION, 4, 5);
    check_resize(3, 9, 7, (cf_crop_box){6, 8, 1, 1}, CF_PAD_BORDER, 3, 2);
    check_resize(1, 9, 7, (cf_crop_box){6, 0, 1, 9}, CF_PAD_ZEROS, 5, 4);
    check_resize(1, 9, 7, (cf_crop_box){0, 8, 7, 1}, CF_PAD_ZEROS, 2, 6);
    check_resize(3, 1, 1, (cf_crop_box){-2, -1, 4, 3}, CF_PAD_REFLECTION, 1, 1);
    check_resize(3, 30, 30, (cf_crop_box){0, 0, 30, 30}, CF_PAD_REFLECTION, 1, 1);
}

/* ---- reference: cf_aug_apply's per-pixel loop ---------------------------------------------- */

static float ref_source_coord(float g, int n, cf_pad_mode pad) {
    float x = (g + 1.0f) * 0.5f * (float)(n - 1);
    if (pad == CF_PAD_ZEROS) return x;
    if (pad == CF_PAD_REFLECTION) {
        if (n == 1) return 0.0f;
        float span = (float)(n - 1);
        x = fabsf(x);
        float extra = fmodf(x, span);
        float flips = floorf(x / span); /* past int's range or infinite (extra NaN): even */
        x = !(flips < 2147483648.0f) || (int)flips % 2 == 0 ? extra : span - extra;
    }
    return x < 0 ? 0.0f : x > (float)(n - 1) ? (float)(n - 1) : x;
}

static float ref_logit(float x) {
    const float lo = 1e-7f, hi = 1.0f - 1e-7f;
    x = x < lo ? lo : x > hi ? hi : x;
    return -logf(1.0f / x - 1.0f);
}

static void ref_aug_apply(const cf_aug_params *p, cf_pad_mode pad, const float *in, int c, int h,
                          int w, float *out) {
    const size_t plane = (size_t)h * w;
    if (!p->has_affine && !p->has_warp) {
        memcpy(out, in, (size_t)c * plane * sizeof(float));
    } else {
        for (int i = 0; i < h; i++) {
            const float yn = h > 1 ? -1.0f + 2.0f * (float)i / (float)(h - 1) : -1.0f;
            for (int j = 0; j < w; j++) {
                const float xn = w > 1 ? -1.0f + 2.0f * (float)j / (float)(w - 1) : -1.0f;
                float gx = p->mat[0][0] * xn + p->mat[0][1] * yn + p->mat[0][2];
                float gy = p->mat[1][0] * xn + p->mat[1][1] * yn + p->mat[1][2];
                if (p->has_warp) {
                    const double *k = p->warp;
                    double X = k[0] * gx + k[1] * gy + k[2], Y = k[3] * gx + k[4] * gy + k[5];
                    double Z = k[6] * gx + k[7] * gy + 1.0;
                    if (Z != 0.0) {
                        gx = (float)(X / Z);
                        gy = (float)(Y / Z);
                    }
                }
                const float ix = ref_source_coord(gx, w, pad), iy = ref_source_coord(gy, h, pad);
                /* a coordinate past int's range, or NaN, has every tap outside */
                const int x0 = fabsf(ix) < 1e9f ? (int)floorf(ix) : INT_MIN / 2,
                          y0 = fabsf(iy) < 1e9f ? (int)floorf(iy) : INT_MIN / 2;
                const float ax = ix - (float)x0, ay = iy - (float)y0;
                const float wt[4] = {(1 - ax) * (1 - ay), ax * (1 - ay), (1 - ax) * ay, ax * ay};
                const int tx[4] = {x0, x0 + 1, x0, x0 + 1}, ty[4] = {y0, y0, y0 + 1, y0 + 1};
                for (int ch = 0; ch < c; ch++) {
                    const float *src = in + (size_t)ch * plane;
                    float v = 0.0f;
                    for (int t = 0; t < 4; t++)
                        if (tx[t] >= 0 && tx[t] < w && ty[t] >= 0 && ty[t] < h)
                            v += src[(size_t)ty[t] * w + tx[t]] * wt[t];
                    out[(size_t)ch * plane + (size_t)i * w + j] = v;
                }
            }
        }
    }
    if (p->has_lighting) {
        const float lb = ref_logit(p->brightness), k = p->contrast;
        const size_t n = (size_t)c * plane;
        for (size_t i = 0; i < n; i++) out[i] = 1.0f / (1.0f + expf(-(ref_logit(out[i]) + lb) * k));
    }
}

/* The augmentation of img against the per-pixel reference, value for value; `what` names the
 * case in the failure. */
static void expect_same_aug(const cf_aug_params *p, cf_pad_mode pad, const float *img, int c, int h,
                            int w, float *got, float *want, const char *what) {
    const size_t per = (size_t)c * h * w;
    cf_aug_apply(p, pad, img, c, h, w, got);
    ref_aug_apply(p, pad, img, c, h, w, want);
    if (memcmp(got, want, per * sizeof(float)) != 0) {
        size_t i = 0;
        while (i < per && memcmp(got + i, want + i, sizeof(float)) == 0) i++;
        fail_msg("%s %dx%dx%d pad %d warp %d: value %zu is %.9g, the per-pixel loop gives %.9g",
                 what, c, h, w, (int)pad, (int)p->has_warp, i, (double)got[i], (double)want[i]);
    }
}

static void check_aug(const cf_aug_opts *o, cf_pad_mode pad, int c, int h, int w, int items,
                      uint64_t seed) {
    const size_t per = (size_t)c * h * w;
    float *img = malloc(per * sizeof(float)), *got = malloc(per * sizeof(float)),
          *want = malloc(per * sizeof(float));
    assert_true(img && got && want);
    int warped = 0, lit = 0;
    for (int it = 0; it < items; it++) {
        /* values past [0, 1] and exactly 0 and 1 reach the lighting's clamp */
        fill_uniform(img, per, seed * 7919 + (uint64_t)it, -0.05f, 1.05f);
        img[0] = 0.0f;
        img[per - 1] = 1.0f;
        cf_aug_params p;
        cf_aug_draw(o, seed, 1, it, h, w, &p);
        warped += p.has_warp;
        lit += p.has_lighting;
        char what[32];
        snprintf(what, sizeof what, "item %d", it);
        expect_same_aug(&p, pad, img, c, h, w, got, want, what);
    }
    /* the draws exercised the perspective and the lighting */
    if (items >= 8 && o->max_warp > 0) assert_true(warped > 0);
    if (items >= 8 && o->max_lighting > 0) assert_true(lit > 0);
    free(img);
    free(got);
    free(want);
}

static void test_aug_same_bits_as_per_pixel_loop(void **state) {
    (void)state;
    const cf_aug_opts def = cf_aug_transforms_defaults(1.0f);
    cf_aug_opts strong = cf_aug_transforms_defaults(2.5f); /* rotation 25, warp 0.5 */
    strong.max_zoom = 1.8f;
    strong.p_affine = 1.0f;
    cf_aug_opts dihedral = def;
    dihedral.flip_vert = true;
    const cf_pad_mode pads[] = {CF_PAD_REFLECTION, CF_PAD_ZEROS, CF_PAD_BORDER};
    for (int k = 0; k < 3; k++) {
        check_aug(&def, pads[k], 3, 128, 128, 12, 1 + (uint64_t)k); /* W3's batch images */
        check_aug(&strong, pads[k], 3, 37, 53, 16, 10 + (uint64_t)k);
        check_aug(&dihedral, pads[k], 1, 24, 24, 8, 20 + (uint64_t)k);
        check_aug(&strong, pads[k], 2, 9, 600, 4, 30 + (uint64_t)k); /* rows of 3 chunks */
        check_aug(&strong, pads[k], 3, 1, 7, 4, 40 + (uint64_t)k);   /* one row */
        check_aug(&strong, pads[k], 3, 6, 1, 4, 50 + (uint64_t)k);   /* one column */
        check_aug(&def, pads[k], 1, 1, 1, 4, 60 + (uint64_t)k);      /* one pixel */
        check_aug(&strong, pads[k], 2, 2, 2, 8, 70 + (uint64_t)k);   /* every tap near the edge */
        check_aug(&strong, pads[k], 1, 3, 257, 4, 80 + (uint64_t)k); /* a one-pixel last chunk */
    }
}

/* Affine and perspective parameters drawn at random rather than by cf_aug_draw: rotations of
 * any angle, zooms out to a quarter (coordinates several image widths outside, reflected many
 * times), translations, perspectives whose divisor crosses zero (coordinates far outside or
 * infinite), with and without the lighting, on odd sizes. The kernel table in use is whatever
 * CF_ISA caps it to (the test runs at every level, tests/grid_sample.cmake). */
static void test_aug_random_params_same_bits(void **state) {
    (void)state;
    rng_state = 0x5eed;
    const cf_pad_mode pads[] = {CF_PAD_REFLECTION, CF_PAD_ZEROS, CF_PAD_BORDER};
    int far = 0, lit = 0, warped = 0;
    for (int trial = 0; trial < 600; trial++) {
        const cf_pad_mode pad = pads[trial % 3];
        const int c = 1 + below(3), h = 1 + below(trial < 60 ? 4 : 41),
                  w = 1 + below(trial < 60 ? 4 : 300);
        const size_t per = (size_t)c * h * w;
        float *img = malloc(per * sizeof(float)), *got = malloc(per * sizeof(float)),
              *want = malloc(per * sizeof(float));
        assert_true(img && got && want);
        fill_uniform(img, per, 1000 + (uint64_t)trial, -0.05f, 1.05f);
        cf_aug_params p;
        memset(&p, 0, sizeof p);
        const double th = (double)below(1 << 16) / (1 << 16) * 2 * M_PI;
        const double zoom = 0.25 + 2.0 * (double)below(1 << 16) / (1 << 16);
        const double tx = ((double)below(1 << 16) / (1 << 16) - 0.5) * 6,
                     ty = ((double)below(1 << 16) / (1 << 16) - 0.5) * 6;
        p.mat[0][0] = (float)(cos(th) * zoom);
        p.mat[0][1] = (float)(sin(th) * zoom * h / w);
        p.mat[0][2] = (float)tx;
        p.mat[1][0] = (float)(-sin(th) * zoom * w / h);
        p.mat[1][1] = (float)(cos(th) * zoom);
        p.mat[1][2] = (float)ty;
        if (below(8) == 0) { /* the identity with a shift of whole or half pixels */
            p.mat[0][0] = p.mat[1][1] = 1.0f;
            p.mat[0][1] = p.mat[1][0] = 0.0f;
            p.mat[0][2] = (float)(below(5) - 2) / (float)(w > 1 ? w - 1 : 1);
            p.mat[1][2] = (float)(below(5) - 2) * 0.5f / (float)(h > 1 ? h - 1 : 1);
        }
        p.has_affine = true;
        p.has_warp = below(2);
        for (int k = 0; k < 8; k++)
            p.warp[k] = ((double)below(1 << 16) / (1 << 16) - 0.5) * (k < 6 ? 2.0 : 4.0);
        if (p.has_warp && below(4) == 0) {
            /* a divisor of exactly zero on the last column: gx = xn = 1 there, Z = 1 - gx */
            p.mat[0][0] = p.mat[1][1] = 1.0f;
            p.mat[0][1] = p.mat[1][0] = p.mat[0][2] = p.mat[1][2] = 0.0f;
            p.warp[6] = -1.0;
            p.warp[7] = 0.0;
            /* or nearly zero, with a large numerator: coordinates past float's range */
            if (below(2)) {
                p.warp[6] = -(1.0 - 0x1p-52);
                p.warp[0] = 1e30;
            }
        }
        p.brightness = 0.5f;
        p.contrast = 1.0f;
        if (below(2)) {
            p.brightness = 0.3f + 0.4f * (float)below(1000) / 1000.0f;
            p.contrast = 0.6f + 0.8f * (float)below(1000) / 1000.0f;
            p.has_lighting = true;
        }
        far += zoom > 1.5 || fabs(tx) > 2;
        lit += p.has_lighting;
        warped += p.has_warp;
        char what[32];
        snprintf(what, sizeof what, "trial %d", trial);
        expect_same_aug(&p, pad, img, c, h, w, got, want, what);
        free(img);
        free(got);
        free(want);
    }
    assert_true(far > 50 && lit > 100 && warped > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resize_same_bits_as_stb_per_plane),
        cmocka_unit_test(test_aug_same_bits_as_per_pixel_loop),
        cmocka_unit_test(test_aug_random_params_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
