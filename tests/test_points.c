/* Points on images: PointScaler against its formula, points read from a CSV scaled by each
 * image's own size, the loader's flip and random crop moving a point with its image, and a
 * point fit (vision_learner with y_range (-1, 1), MSELossFlat) that lowers the error, exported
 * and loaded back with the same predictions, decoded to pixels. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "child.h"
#include "corefit.h"
#include "oracle.h"

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#endif

static char dir[256];

static const char *at(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

static void test_point_scaler_formula(void **state) {
    (void)state;
    /* fastai: p * 2 / (W, H) - 1, decoded (p + 1) * (W, H) / 2 */
    float p[4] = {16, 8, 64, 0};
    cf_points_scale(p, 2, 64, 32);
    const float want[4] = {16 * 2.0f / 64 - 1, 8 * 2.0f / 32 - 1, 1, -1};
    assert_memory_equal(p, want, sizeof want);
    cf_points_flip_lr(p, 2);
    assert_float_equal(p[0], 0.5f, 0);
    assert_float_equal(p[1], -0.5f, 0);
    assert_float_equal(p[2], -1.0f, 0);
    cf_points_unscale(p, 2, 64, 32);
    /* flipped: x -> W - x */
    assert_float_equal(p[0], 64 - 16, 1e-5);
    assert_float_equal(p[1], 8, 1e-5);
    assert_float_equal(p[2], 0, 1e-5);
}

#define write_text(name, text) test_write_in(dir, name, text)

static void test_points_from_csv(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    test_tmpdir_make(dir, sizeof dir, "cf_points_");
    static uint8_t px[64 * 64];
    assert_true(stbi_write_png(at("wide.png"), 40, 20, 1, px, 40) != 0);
    assert_true(stbi_write_png(at("square.png"), 64, 64, 1, px, 64) != 0);
    write_text("points.csv", "fname,x,y,is_valid\nwide.png,10,15,0\nsquare.png,48,16,1\n");
    cf_dataset *tr = NULL, *va = NULL;
    /* resized (squashed) to 32 x 32: the scaled points are the files' */
    cf_image_folder_options o = {.channels = 1, .size = 32};
    assert_int_equal(cf_datasets_from_image_points_csv(at("points.csv"), NULL, NULL, NULL, NULL,
                                                       "is_valid", &o, &tr, &va),
                     CF_OK);
    assert_int_equal(tr->n, 1);
    assert_int_equal(va->n, 1);
    assert_int_equal(tr->target_dim, 2);
    assert_int_equal(tr->n_points, 1);
    assert_int_equal(tr->n_classes, 0);
    assert_false(cf_dataset_is_multi_label(tr));
    assert_float_equal(tr->y[0], 10 * 2.0f / 40 - 1, 1e-6);
    assert_float_equal(tr->y[1], 15 * 2.0f / 20 - 1, 1e-6);
    assert_float_equal(va->y[0], 48 * 2.0f / 64 - 1, 1e-6);
    assert_float_equal(va->y[1], 16 * 2.0f / 64 - 1, 1e-6);
    cf_dataset_free(tr);
    cf_dataset_free(va);
    /* a coordinate that is not a number: the file, line, column and value */
    write_text("bad.csv", "fname,px,py\nwide.png,10,15\nsquare.png,4x,16\n");
    assert_int_equal(cf_datasets_from_image_points_csv(at("bad.csv"), NULL, NULL, "px", "py", NULL,
                                                       &o, &tr, &va),
                     CF_ERR_FORMAT);
    assert_null(tr);
    assert_non_null(strstr(cf_last_error(), "bad.csv:3: column px is '4x'"));
    /* a crop would move the points: refused */
    cf_item_tfm crop = cf_resize_tfm(32, CF_RESIZE_CROP);
    o.item_tfm = &crop;
    assert_int_equal(cf_datasets_from_image_points_csv(at("points.csv"), NULL, NULL, NULL, NULL,
                                                       NULL, &o, &tr, &va),
                     CF_ERR_UNSUPPORTED);
    assert_int_equal(test_tmpdir_remove(dir), 0);
#endif
}

/* n 1 x s x s images, each a bright 3 x 3 square at random whose centre is the target (scaled),
 * a dimmer square elsewhere as a distraction. */
static cf_dataset *square_points(int64_t n, int s, uint64_t seed) {
    float *x = calloc((size_t)n * s * s, sizeof(float)), *y = calloc((size_t)n * 2, sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (int64_t i = 0; i < n; i++) {
        const int l = (int)cf_rng_below(&rng, (uint64_t)(s - 3)),
                  t = (int)cf_rng_below(&rng, (uint64_t)(s - 3));
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 3; c++) x[i * s * s + (t + r) * s + l + c] = 1.0f;
        y[2 * i] = (float)l + 1.5f; /* pixel units: pixel j spans [j, j + 1) */
        y[2 * i + 1] = (float)t + 1.5f;
        cf_points_scale(y + 2 * i, 1, s, s);
    }
    cf_dataset *ds = NULL;
    assert_int_equal(cf_dataset_from_arrays(x, y, n, cf_shape_make(3, (int[]){1, s, s}), 2, 0, &ds),
                     CF_OK);
    ds->n_points = 1;
    free(x);
    free(y);
    return ds;
}

static void test_flip_and_crop_move_points(void **state) {
    (void)state;
    const int s = 16;
    cf_dataset *ds = square_points(64, s, 5);
    cf_dl_options o = {.bs = 64, .flip = true, .crop_pad = 2, .seed = 9, .prefetch = -1};
    cf_dataloader *dl = NULL;
    assert_int_equal(cf_dataloader_new(ds, &o, &dl), CF_OK);
    int flipped = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        assert_int_equal(cf_dataloader_begin_epoch(dl, epoch), CF_OK);
        const cf_batch *b = NULL;
        assert_int_equal(cf_dataloader_next(dl, &b), CF_OK);
        assert_non_null(b);
        for (int i = 0; i < b->size; i++) {
            /* the square's centre in the augmented image, where it is whole */
            const float *img = b->x.data + (size_t)i * s * s;
            double sx = 0, sy = 0, m = 0;
            for (int r = 0; r < s; r++)
                for (int c = 0; c < s; c++)
                    if (img[r * s + c] > 0.5f) sx += c + 0.5, sy += r + 0.5, m += 1;
            if (m != 9) continue; /* cut by the crop */
            float want[2] = {(float)(sx / m), (float)(sy / m)};
            cf_points_scale(want, 1, s, s);
            assert_float_equal(b->y.data[2 * i], want[0], 1e-5);
            assert_float_equal(b->y.data[2 * i + 1], want[1], 1e-5);
            flipped += fabsf(b->y.data[2 * i] - ds->y[2 * b->idx[i]]) > 0.3f;
        }
    }
    assert_true(flipped > 10); /* the flips did move points */
    /* the data set's own targets are untouched */
    cf_dataset *again = square_points(64, s, 5);
    assert_memory_equal(again->y, ds->y, 128 * sizeof(float));
    cf_dataset_free(again);
    /* fastai's affine batch transforms would leave the points behind: refused */
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    o.aug = &aug;
    cf_dataloader *bad = NULL;
    assert_int_equal(cf_dataloader_new(ds, &o, &bad), CF_ERR_UNSUPPORTED);
    cf_dataloader_free(dl);
    cf_dataset_free(ds);
}

static void test_point_fit_export_load(void **state) {
    (void)state;
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 32, .seed = 3, .prefetch = -1, .flip = true};
    assert_int_equal(cf_dls_new(square_points(1024, 24, 1), square_points(128, 24, 2), &o, &dls),
                     CF_OK);
    cf_learner *learn = NULL;
    assert_int_equal(cf_vision_learner(&learn, dls, CF_ARCH_SIMPLE_CNN, .y_range = true, .y_lo = -1,
                                       .y_hi = 1, .quiet = true, .seed = 4),
                     CF_OK);
    assert_int_equal(learn->loss.kind, CF_LOSS_MSE); /* MSELossFlat for points */
    double before, after;
    assert_int_equal(cf_validate(learn, &before), CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 8, .lr_max = CF_LR(2e-2)), CF_OK);
    assert_int_equal(cf_validate(learn, &after), CF_OK);
    /* predicting the mean point: the targets' variance */
    double var = 0, mean[2] = {0, 0};
    const cf_dataset *va = dls->valid_ds;
    for (int64_t i = 0; i < va->n * 2; i++) mean[i % 2] += va->y[i] / (double)va->n;
    for (int64_t i = 0; i < va->n * 2; i++)
        var += (va->y[i] - mean[i % 2]) * (va->y[i] - mean[i % 2]) / (double)(va->n * 2);
    printf("points MSE: %.4f before, %.4f after; predicting the mean %.4f\n", before, after, var);
    assert_true(after < 0.5 * var);

    char path[256];
    snprintf(path, sizeof path, "/tmp/cf_points_model_%d.safetensors", (int)getpid());
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    cf_learner *back = NULL;
    assert_int_equal(cf_load_learner(path, &back), CF_OK);
    unlink(path);
    assert_int_equal(back->loss.kind, CF_LOSS_MSE);
    assert_int_equal(back->dls->train_ds->n_points, 1);
    assert_true(back->recipe.y_range);
    float a[2], b[2], px[2];
    assert_int_equal(cf_predict(learn, va->x, a, NULL), CF_OK);
    assert_int_equal(cf_predict(back, va->x, b, NULL), CF_OK);
    assert_close("loaded learner's point", a, b, 2, 1e-5, 1e-6);
    assert_true(a[0] > -1 && a[0] < 1 && a[1] > -1 && a[1] < 1); /* y_range */
    /* decoded to pixels of the 24 x 24 input, or of a 48 x 96 original */
    assert_int_equal(cf_learner_decodes(back, b, 1, 0, 0, px), 2);
    assert_float_equal(px[0], (b[0] + 1) * 12, 1e-5);
    assert_float_equal(px[1], (b[1] + 1) * 12, 1e-5);
    cf_learner_decodes(back, b, 1, 48, 96, px);
    assert_float_equal(px[1], (b[1] + 1) * 48, 1e-5);
    /* the prediction lands near the square */
    assert_float_equal(px[0] / 2, va->y[0] * 12 + 12, 3.0);
    cf_learner_free(back);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* The mean column and row of the clearly green and the clearly red pixels of a PNG. */
static void colour_centres(const char *path, double g[3], double r[3]) {
    int w, h;
    unsigned char *px = test_png_load_rgb(path, &w, &h);
    assert_non_null(px);
    memset(g, 0, 3 * sizeof(double));
    memset(r, 0, 3 * sizeof(double));
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            const unsigned char *p = px + 3 * ((size_t)y * w + x);
            double *c = p[1] > 150 && p[0] < 80 && p[2] < 80   ? g
                        : p[0] > 180 && p[1] < 80 && p[2] < 80 ? r
                                                               : NULL;
            if (c) c[0] += x, c[1] += y, c[2] += 1;
        }
    for (int k = 0; k < 2; k++) g[k] /= g[2] > 0 ? g[2] : 1, r[k] /= r[2] > 0 ? r[2] : 1;
    free(px);
}

static void test_show_points(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    enum { H = 32, W = 32 };
    float x[H * W] = {0};
    /* target at the left, upper quarter; prediction at the right, lower quarter */
    float targs[2] = {-0.5f, -0.5f}, preds[2] = {0.5f, 0.5f};
    cf_preds p = {.n = 1,
                  .preds = cf_tensor_view(preds, cf_shape2(1, 2)),
                  .targs = cf_tensor_view(targs, cf_shape2(1, 2)),
                  .inputs = cf_tensor_view(x, cf_shape4(1, 1, H, W))};
    char png[256];
    snprintf(png, sizeof png, "/tmp/cf_points_show_%d.png", (int)getpid());
    assert_int_equal(cf_show_results(&p, 1, NULL, png), CF_OK);
    double g[3], r[3];
    colour_centres(png, g, r);
    assert_true(g[2] > 10 && r[2] > 10);
    assert_true(g[0] < r[0] && g[1] < r[1]); /* the target's '+' up and left of the 'x' */
    /* show_batch marks the target alone */
    cf_batch b = {.x = p.inputs, .y = p.targs};
    assert_int_equal(cf_show_batch(&b, 1, NULL, png), CF_OK);
    colour_centres(png, g, r);
    assert_true(g[2] > 10 && r[2] == 0);
    unlink(png);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_point_scaler_formula),
        cmocka_unit_test(test_points_from_csv),
        cmocka_unit_test(test_flip_and_crop_move_points),
        cmocka_unit_test(test_point_fit_export_load),
        cmocka_unit_test(test_show_points),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
