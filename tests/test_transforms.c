/* fastai's item and batch transforms: the composed affine + warp sampling and the lighting
 * against PyTorch's affine_grid/grid_sample with the matrices rebuilt from fastai's formulas
 * (tests/oracle/transforms.py), padding against F.pad, Resize/RandomResizedCrop regions against
 * fastai's arithmetic, the sampled parameters' ranges and frequencies against aug_transforms'
 * defaults, and the DataLoader hook (per-item draws: the same batches with or without the
 * prefetch thread and under sharding). */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/data.h"

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#include <sys/stat.h>
#endif

/* ---- the affine/warp/lighting pass against PyTorch ----------------------------------------- */

static void affine_case(const cf_aug_opts *o, const char *pad_name, cf_pad_mode pad,
                        uint64_t seed) {
    enum { N = 8, C = 3, H = 20, W = 28 };
    const size_t per = (size_t)C * H * W;
    float *img = malloc(N * per * sizeof(float)), *out = malloc(N * per * sizeof(float));
    float draws[N * 10], mats[N * 6];
    double coeffs[N * 8];
    bool warped[N];
    fill_uniform(img, N * per, seed, 0.0f, 1.0f);
    for (int i = 0; i < N; i++) {
        cf_aug_params p;
        cf_aug_draw(o, seed, 3, i, H, W, &p);
        const float d[10] = {p.flip,    (float)p.dihedral, p.rotate_deg, p.zoom,       p.col_pct,
                             p.row_pct, p.warp_x,          p.warp_y,     p.brightness, p.contrast};
        memcpy(draws + i * 10, d, sizeof d);
        memcpy(mats + i * 6, p.mat, sizeof p.mat);
        warped[i] = p.has_warp;
        for (int k = 0; k < 8; k++) coeffs[i * 8 + k] = p.has_warp ? p.warp[k] : (k == 0 || k == 4);
        cf_aug_apply(&p, pad, img + i * per, C, H, W, out + i * per);
    }
    oracle o_;
    oracle_init(&o_);
    oracle_put(&o_, "img", img, cf_shape4(N, C, H, W));
    oracle_put(&o_, "draws", draws, cf_shape2(N, 10));
    oracle_put_values(&o_, "opts", 2, (double)o->flip_vert, 0.0);
    char args[64];
    snprintf(args, sizeof args, "affine pad=%s", pad_name);
    oracle_run(&o_, "transforms.py", args);
    cf_tensor mref = oracle_get(&o_, "mat"), cref = oracle_get(&o_, "coeffs"),
              oref = oracle_get(&o_, "out");
    assert_close("matrix", mats, mref.data, N * 6, 1e-6, 1e-6);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 8; k++)
            if (fabs(coeffs[i * 8 + k] - cref.data[i * 8 + k]) > 1e-6)
                fail_msg("item %d warp coefficient %d: %g vs torch %g (warped %d)", i, k,
                         coeffs[i * 8 + k], (double)cref.data[i * 8 + k], warped[i]);
    assert_close("augmented images", out, oref.data, N * per, 1e-4, 1e-4);
    free(mref.data);
    free(cref.data);
    free(oref.data);
    free(img);
    free(out);
    oracle_cleanup(&o_);
}

static void test_affine_defaults_reflection(void **state) {
    (void)state;
    cf_aug_opts o = cf_aug_transforms_defaults(1.0f);
    affine_case(&o, "reflection", CF_PAD_REFLECTION, 11);
}

/* every transform on for every item, larger ranges (sampling reaches outside the image) */
static void test_affine_strong_zeros_and_border(void **state) {
    (void)state;
    cf_aug_opts o = cf_aug_transforms_defaults(2.0f);
    o.p_affine = o.p_lighting = 1.0f;
    o.min_zoom = 0.7f;
    o.max_zoom = 1.6f;
    affine_case(&o, "zeros", CF_PAD_ZEROS, 12);
    affine_case(&o, "border", CF_PAD_BORDER, 13);
    affine_case(&o, "reflection", CF_PAD_REFLECTION, 14);
}

/* Coordinates far outside the image (a huge scale) or NaN read zero padding: all zeros, and
 * no float-to-int conversion out of range (the sanitizer build checks float-cast-overflow). */
static void test_zeros_far_outside_and_nan(void **state) {
    (void)state;
    enum { C = 2, H = 4, W = 6 };
    float img[C * H * W], out[C * H * W];
    for (int i = 0; i < C * H * W; i++) img[i] = 1.0f + (float)i;
    const float scales[] = {1e30f, -1e30f, 3e9f, NAN, INFINITY};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        cf_aug_params p;
        memset(&p, 0, sizeof p);
        p.brightness = 0.5f;
        p.contrast = 1.0f;
        p.mat[0][0] = scales[s];
        p.mat[1][1] = scales[s];
        p.has_affine = true;
        for (int i = 0; i < C * H * W; i++) out[i] = -1.0f;
        cf_aug_apply(&p, CF_PAD_ZEROS, img, C, H, W, out);
        for (int i = 0; i < C * H * W; i++) assert_true(out[i] == 0.0f);
    }
}

static void test_affine_dihedral(void **state) {
    (void)state;
    cf_aug_opts o = cf_aug_transforms_defaults(1.0f);
    o.flip_vert = true;
    affine_case(&o, "reflection", CF_PAD_REFLECTION, 15);
}

/* ---- padding and resizing ------------------------------------------------------------------ */

static void pad_case(const char *mode, cf_pad_mode pad) {
    enum { C = 2, H = 5, W = 7, L = 3, R = 2, T = 4, B = 1 };
    float img[C * H * W], out[C * (H + T + B) * (W + L + R)];
    fill_uniform(img, C * H * W, 21, 0.0f, 1.0f);
    cf_crop_box box = {-L, -T, W + L + R, H + T + B};
    assert_int_equal(cf_crop_pad_resize(img, C, H, W, box, pad, box.width, box.height, out), CF_OK);
    oracle o;
    oracle_init(&o);
    oracle_put(&o, "img", img, cf_shape_make(3, (int[]){C, H, W}));
    char args[64];
    snprintf(args, sizeof args, "pad mode=%s p=%d,%d,%d,%d", mode, L, R, T, B);
    oracle_run(&o, "transforms.py", args);
    cf_tensor ref = oracle_get(&o, "out");
    assert_int_equal(cf_shape_numel(&ref.shape), C * (H + T + B) * (W + L + R));
    assert_close(mode, out, ref.data, cf_shape_numel(&ref.shape), 0, 0);
    free(ref.data);
    oracle_cleanup(&o);
}

static void test_pad_modes_match_torch(void **state) {
    (void)state;
    pad_case("reflect", CF_PAD_REFLECTION);
    pad_case("constant", CF_PAD_ZEROS);
    pad_case("replicate", CF_PAD_BORDER);
}

static void test_resize_regions(void **state) {
    (void)state;
    /* 200 x 100 to 50 x 50 (fastai: m = min(200/50, 100/50) = 2 for Crop, 4 for Pad) */
    cf_item_tfm crop = cf_resize_tfm(50, CF_RESIZE_CROP), pad = cf_resize_tfm(50, CF_RESIZE_PAD),
                squish = cf_resize_tfm(50, CF_RESIZE_SQUISH);
    cf_crop_box b = cf_item_tfm_box(&crop, 200, 100, false, 1, 0, 0);
    assert_int_equal(b.left, 50);
    assert_int_equal(b.top, 0);
    assert_int_equal(b.width, 100);
    assert_int_equal(b.height, 100);
    b = cf_item_tfm_box(&pad, 200, 100, false, 1, 0, 0);
    assert_int_equal(b.left, 0);
    assert_int_equal(b.top, -50);
    assert_int_equal(b.width, 200);
    assert_int_equal(b.height, 200);
    b = cf_item_tfm_box(&squish, 200, 100, true, 1, 0, 0);
    assert_int_equal(b.width, 200);
    assert_int_equal(b.height, 100);
    /* training crops: random positions covering the whole range, always inside */
    int lo = 1000, hi = -1;
    for (int i = 0; i < 2000; i++) {
        b = cf_item_tfm_box(&crop, 200, 100, true, 1, 0, i);
        assert_int_equal(b.width, 100);
        assert_true(b.left >= 0 && b.left <= 100 && b.top == 0);
        if (b.left < lo) lo = b.left;
        if (b.left > hi) hi = b.left;
    }
    assert_true(lo <= 2 && hi >= 98);

    /* a constant image stays constant through crop, pad (reflection) and resize */
    float img[3 * 100 * 200], out[3 * 50 * 50];
    for (int i = 0; i < 3 * 100 * 200; i++) img[i] = 0.25f;
    assert_int_equal(cf_item_tfm_apply(&pad, img, 3, 100, 200, true, 1, 0, 5, out), CF_OK);
    for (int i = 0; i < 3 * 50 * 50; i++) assert_true(fabsf(out[i] - 0.25f) < 1e-6f);
    /* a horizontal ramp keeps its mean and order under squish */
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 100; y++)
            for (int x = 0; x < 200; x++) img[(c * 100 + y) * 200 + x] = (float)x / 199.0f;
    assert_int_equal(cf_item_tfm_apply(&squish, img, 3, 100, 200, false, 1, 0, 5, out), CF_OK);
    for (int x = 1; x < 50; x++) assert_true(out[x] > out[x - 1]);
    assert_true(fabsf(out[0] + out[49] - 1.0f) < 0.02f);
    assert_int_equal(
        cf_crop_pad_resize(img, 3, 100, 200, (cf_crop_box){0, 0, 0, 10}, CF_PAD_ZEROS, 5, 5, out),
        CF_ERR_INVALID);
}

static void test_random_resized_crop(void **state) {
    (void)state;
    cf_item_tfm t = cf_random_resized_crop_tfm(64, 0.0f); /* min_scale 0.08 */
    assert_true(fabsf(t.min_scale - 0.08f) < 1e-7f);
    const int w = 160, h = 120;
    double area_lo = 1, area_hi = 0;
    for (int i = 0; i < 3000; i++) {
        cf_crop_box b = cf_item_tfm_box(&t, w, h, true, 9, 1, i);
        assert_true(b.left >= 0 && b.top >= 0 && b.left + b.width <= w && b.top + b.height <= h);
        double frac = (double)b.width * b.height / (w * h);
        double ratio = (double)b.width / b.height;
        /* rounding of nw, nh moves the area and aspect a little */
        assert_true(frac > 0.08 * 0.8 && frac <= 1.0);
        assert_true(ratio > 0.75 * 0.85 && ratio < 4.0 / 3.0 * 1.15);
        if (frac < area_lo) area_lo = frac;
        if (frac > area_hi) area_hi = frac;
    }
    assert_true(area_lo < 0.1 && area_hi > 0.9);
    /* validation: the whole image squished to 64 + ceil(64 * 0.14 / 8) * 8 = 80, centre 64 */
    cf_crop_box v = cf_item_tfm_box(&t, w, h, false, 9, 1, 0);
    assert_int_equal(v.width, w);
    assert_int_equal(v.height, h);
    float *img = malloc(3 * w * h * sizeof(float)), out[3 * 64 * 64], big[3 * 80 * 80],
          ref[3 * 64 * 64];
    fill_uniform(img, 3 * w * h, 4, 0.0f, 1.0f);
    assert_int_equal(cf_item_tfm_apply(&t, img, 3, h, w, false, 9, 1, 0, out), CF_OK);
    assert_int_equal(cf_crop_pad_resize(img, 3, h, w, v, CF_PAD_REFLECTION, 80, 80, big), CF_OK);
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 64; y++)
            for (int x = 0; x < 64; x++)
                ref[(c * 64 + y) * 64 + x] = big[(c * 80 + y + 8) * 80 + x + 8];
    assert_memory_equal(out, ref, sizeof ref);
    free(img);
}

/* ---- parameter distributions against aug_transforms' defaults ------------------------------ */

static void test_aug_frequencies(void **state) {
    (void)state;
    cf_aug_opts o = cf_aug_transforms_defaults(1.0f);
    const int n = 40000;
    int flips = 0, rot = 0, zoom = 0, wx = 0, wy = 0, bright = 0, contrast = 0, warped = 0;
    double sum_deg = 0, sum_logc = 0, sum_z = 0, sum_col = 0;
    for (int i = 0; i < n; i++) {
        cf_aug_params p;
        cf_aug_draw(&o, 42, 0, i, 64, 96, &p);
        flips += p.flip < 0;
        assert_true(p.flip == 1.0f || p.flip == -1.0f);
        assert_int_equal(p.dihedral, 0);
        assert_true(fabsf(p.rotate_deg) <= 10.0f);
        if (p.rotate_deg != 0) {
            rot++;
            sum_deg += p.rotate_deg;
        }
        assert_true(p.zoom <= 1.0f && p.zoom >= 1.0f / 1.1f - 1e-6f); /* s = 1 / U(1, 1.1) */
        if (p.zoom != 1.0f) {
            zoom++;
            sum_z += 1.0 / p.zoom;
        }
        assert_true(p.col_pct >= 0 && p.col_pct < 1);
        sum_col += p.col_pct;
        assert_true(fabsf(p.warp_x) <= 0.2f && fabsf(p.warp_y) <= 0.2f);
        wx += p.warp_x != 0;
        wy += p.warp_y != 0;
        warped += p.has_warp;
        assert_true(p.brightness >= 0.4f && p.brightness <= 0.6f);
        bright += p.brightness != 0.5f;
        assert_true(p.contrast >= 0.8f - 1e-6f && p.contrast <= 1.25f + 1e-6f);
        if (p.contrast != 1.0f) {
            contrast++;
            sum_logc += log(p.contrast);
        }
    }
    /* binomial(40000, p): 4 standard deviations are under 0.01 */
    assert_true(fabs(flips / (double)n - 0.5) < 0.01);
    assert_true(fabs(rot / (double)n - 0.75) < 0.01);
    assert_true(fabs(zoom / (double)n - 0.75) < 0.01);
    assert_true(fabs(wx / (double)n - 0.75) < 0.01 && fabs(wy / (double)n - 0.75) < 0.01);
    assert_true(fabs(warped / (double)n - (1 - 0.25 * 0.25)) < 0.01);
    assert_true(fabs(bright / (double)n - 0.75) < 0.01);
    assert_true(fabs(contrast / (double)n - 0.75) < 0.01);
    /* uniform draws: means of U(-10, 10), U(1, 1.1), U(0, 1), log-uniform contrast */
    assert_true(fabs(sum_deg / rot) < 0.15);
    assert_true(fabs(sum_z / zoom - 1.05) < 0.002);
    assert_true(fabs(sum_col / n - 0.5) < 0.01);
    assert_true(fabs(sum_logc / contrast) < 0.005);

    /* mult scales rotation, lighting and warp; zero maxima switch them off */
    cf_aug_opts off = cf_aug_transforms_defaults(1.0f);
    off.do_flip = false;
    off.max_rotate = off.max_warp = off.max_lighting = 0.0f;
    off.max_zoom = 1.0f;
    cf_aug_opts big = cf_aug_transforms_defaults(2.0f);
    assert_true(fabsf(big.max_rotate - 20.0f) < 1e-6f && fabsf(big.max_warp - 0.4f) < 1e-6f &&
                fabsf(big.max_lighting - 0.4f) < 1e-6f);
    for (int i = 0; i < 200; i++) {
        cf_aug_params p;
        cf_aug_draw(&off, 42, 0, i, 64, 64, &p);
        assert_false(p.has_affine || p.has_warp || p.has_lighting);
    }
}

static void test_draws_depend_on_seed_epoch_item_only(void **state) {
    (void)state;
    cf_aug_opts o = cf_aug_transforms_defaults(1.0f);
    cf_aug_params a, b, c;
    cf_aug_draw(&o, 7, 2, 123, 32, 32, &a);
    cf_aug_draw(&o, 7, 2, 999, 32, 32, &c); /* another item in between changes nothing */
    cf_aug_draw(&o, 7, 2, 123, 32, 32, &b);
    assert_memory_equal(&a, &b, sizeof a);
    cf_aug_draw(&o, 7, 3, 123, 32, 32, &b);
    assert_true(memcmp(&a, &b, sizeof a) != 0);
    cf_aug_draw(&o, 8, 2, 123, 32, 32, &b);
    assert_true(memcmp(&a, &b, sizeof a) != 0);
    (void)c;
}

/* ---- the DataLoader hook ------------------------------------------------------------------- */

static void collect(cf_dataloader *dl, int epoch, float *xs, int64_t *order, int *count) {
    const cf_batch *b;
    assert_int_equal(cf_dataloader_begin_epoch(dl, epoch), CF_OK);
    int k = 0;
    for (;;) {
        assert_int_equal(cf_dataloader_next(dl, &b), CF_OK);
        if (!b) break;
        size_t per = cf_shape_sample_numel(&b->x.shape);
        for (int i = 0; i < b->size; i++, k++) {
            memcpy(xs + (size_t)k * per, b->x.data + (size_t)i * per, per * sizeof(float));
            order[k] = b->idx[i];
        }
    }
    *count = k;
}

static void test_loader_applies_per_item_augmentation(void **state) {
    (void)state;
    enum { N = 10, C = 3, H = 16, W = 12 };
    const size_t per = (size_t)C * H * W;
    float *x = malloc(N * per * sizeof(float)), y[N];
    fill_uniform(x, N * per, 5, 0.0f, 1.0f);
    for (int i = 0; i < N; i++) y[i] = (float)(i % 3);
    cf_dataset *ds;
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape_make(3, (int[]){C, H, W}), 1, 3, &ds),
                     CF_OK);
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    aug.p_affine = aug.p_lighting = 1.0f;
    cf_dl_options opt = {.bs = 4,
                         .shuffle = true,
                         .seed = 77,
                         .aug = &aug,
                         .n_norm = 3,
                         .mean = {0.485f, 0.456f, 0.406f},
                         .std = {0.229f, 0.224f, 0.225f}};
    cf_dataloader *threaded, *inline_dl, *shard;
    assert_int_equal(cf_dataloader_new(ds, &opt, &threaded), CF_OK);
    aug.max_rotate = 0; /* the loader keeps its own copy of the options */
    opt.prefetch = -1;
    opt.aug = &(cf_aug_opts){0};
    *(cf_aug_opts *)opt.aug = cf_aug_transforms_defaults(1.0f);
    ((cf_aug_opts *)opt.aug)->p_affine = ((cf_aug_opts *)opt.aug)->p_lighting = 1.0f;
    assert_int_equal(cf_dataloader_new(ds, &opt, &inline_dl), CF_OK);
    assert_int_equal(cf_dataloader_new(ds, &opt, &shard), CF_OK);
    assert_int_equal(cf_dataloader_set_shard(shard, 1, 2, CF_SHARD_PER_RANK), CF_OK);

    float *a = malloc(N * per * sizeof(float)), *b = malloc(N * per * sizeof(float)),
          *s = malloc(N * per * sizeof(float)), *ref = malloc(per * sizeof(float));
    int64_t oa[N], ob[N], os[N];
    int na, nb, ns;
    collect(threaded, 1, a, oa, &na);
    collect(inline_dl, 1, b, ob, &nb);
    collect(shard, 1, s, os, &ns);
    assert_int_equal(na, N);
    assert_int_equal(nb, N);
    assert_memory_equal(oa, ob, sizeof oa);
    assert_memory_equal(a, b, N * per * sizeof(float));
    cf_aug_opts full = cf_aug_transforms_defaults(1.0f);
    full.p_affine = full.p_lighting = 1.0f;
    for (int k = 0; k < na; k++) { /* each sample: its own draws, then normalisation */
        cf_aug_params p;
        cf_aug_draw(&full, 77, 1, oa[k], H, W, &p);
        assert_true(p.has_affine && p.has_lighting);
        cf_aug_apply(&p, CF_PAD_REFLECTION, x + oa[k] * per, C, H, W, ref);
        for (int c = 0; c < C; c++)
            for (int i = 0; i < H * W; i++)
                ref[c * H * W + i] = (ref[c * H * W + i] - opt.mean[c]) / opt.std[c];
        assert_close("loader sample", a + k * per, ref, per, 1e-5, 1e-5);
    }
    /* rank 1 of 2 sees the same augmented values for the samples it gets */
    assert_int_equal(ns, N / 2);
    for (int k = 0; k < ns; k++)
        for (int j = 0; j < na; j++)
            if (oa[j] == os[k]) assert_memory_equal(s + k * per, a + j * per, per * sizeof(float));
    /* another epoch draws again */
    collect(inline_dl, 2, b, ob, &nb);
    bool differs = false;
    for (int k = 0; k < nb && !differs; k++)
        for (int j = 0; j < na; j++)
            if (oa[j] == ob[k] && memcmp(a + j * per, b + k * per, per * sizeof(float)) != 0)
                differs = true;
    assert_true(differs);
    cf_dataloader_free(threaded);
    cf_dataloader_free(inline_dl);
    cf_dataloader_free(shard);
    cf_dataset_free(ds);
    free(a);
    free(b);
    free(s);
    free(ref);
    free(x);
}

/* ---- the image-folder hook: item transforms applied as images are decoded ------------------- */

static void test_image_folder_item_tfm(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    char dir[256], path[512];
    test_tmpdir_make(dir, sizeof dir, "cf-itfm-");
    static const char *const parts[2] = {"train", "valid"}, *const cls[2] = {"a", "b"};
    const int sizes[2][2] = {{40, 30}, {30, 50}}; /* w, h per class */
    cf_rng rng;
    cf_rng_seed(&rng, 3);
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/%s", dir, parts[s]);
        mkdir(path, 0777);
        for (int c = 0; c < 2; c++) {
            snprintf(path, sizeof path, "%s/%s/%s", dir, parts[s], cls[c]);
            mkdir(path, 0777);
            int w = sizes[c][0], h = sizes[c][1];
            unsigned char px[50 * 50 * 3];
            for (int i = 0; i < w * h * 3; i++) px[i] = (unsigned char)cf_rng_below(&rng, 256);
            snprintf(path, sizeof path, "%s/%s/%s/0.png", dir, parts[s], cls[c]);
            assert_true(stbi_write_png(path, w, h, 3, px, w * 3) != 0);
        }
    }
    cf_item_tfm t = cf_resize_tfm(24, CF_RESIZE_CROP);
    cf_dataset *train, *valid;
    if (cf_datasets_from_image_folder(dir, &(cf_image_folder_options){.item_tfm = &t, .seed = 9},
                                      &train, &valid) != CF_OK)
        fail_msg("%s", cf_last_error());
    assert_int_equal(train->sample_shape.dim[0], 3);
    assert_int_equal(train->sample_shape.dim[1], 24);
    assert_int_equal(train->sample_shape.dim[2], 24);
    float full[3 * 50 * 50], ref[3 * 24 * 24];
    for (int s = 0; s < 2; s++)
        for (int c = 0; c < 2; c++) {
            int w = 0, h = 0;
            snprintf(path, sizeof path, "%s/%s/%s/0.png", dir, parts[s], cls[c]);
            assert_int_equal(cf_image_read(path, 3, 0, full, &w, &h), CF_OK);
            assert_int_equal(w, sizes[c][0]);
            assert_int_equal(cf_item_tfm_apply(&t, full, 3, h, w, s == 0, 9, 0, c, ref), CF_OK);
            const cf_dataset *ds = s ? valid : train;
            assert_memory_equal(ds->x + (size_t)c * 3 * 24 * 24, ref, sizeof ref);
        }
    cf_dataset_free(train);
    cf_dataset_free(valid);
    cf_item_tfm bad = t;
    bad.width = 0;
    assert_int_equal(cf_datasets_from_image_folder(
                         dir, &(cf_image_folder_options){.item_tfm = &bad}, &train, &valid),
                     CF_ERR_INVALID);
    assert_null(train);
    test_tmpdir_remove(dir);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_affine_defaults_reflection),
        cmocka_unit_test(test_affine_strong_zeros_and_border),
        cmocka_unit_test(test_zeros_far_outside_and_nan),
        cmocka_unit_test(test_affine_dihedral),
        cmocka_unit_test(test_pad_modes_match_torch),
        cmocka_unit_test(test_resize_regions),
        cmocka_unit_test(test_random_resized_crop),
        cmocka_unit_test(test_aug_frequencies),
        cmocka_unit_test(test_draws_depend_on_seed_epoch_item_only),
        cmocka_unit_test(test_loader_applies_per_item_augmentation),
        cmocka_unit_test(test_image_folder_item_tfm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
