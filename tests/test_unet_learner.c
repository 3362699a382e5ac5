/* unet_learner: CrossEntropyLossFlat(axis=1) and the unet splitter's groups on a DynamicUnet,
 * and a short fit on tiny 24x24 scenes that raises foreground accuracy and DiceMulti (the
 * decoder's cost grows with the pixels); DynamicUnet's options through export and load_learner;
 * an xresnet body on 16x16 images (1x1 maps in its last stage). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "corefit.h"
#include "corefit/io.h"
#include "scenes_fixture.h"

static void test_unet_learner_fit(void **state) {
    (void)state;
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 16, .seed = 3, .prefetch = -1, .flip = true};
    assert_int_equal(cf_dls_new(scenes(64, 1), scenes(16, 2), &o, &dls), CF_OK);
    cf_metric *metrics[] = {cf_foreground_acc(0), cf_dice_multi(N_CODES)};
    cf_learner *learn = NULL;
    cf_status made = cf_unet_learner(&learn, dls, "xresnet18", .metrics = metrics, .n_metrics = 2,
                                     .quiet = true, .seed = 5);
    if (made) print_message("%s\n", cf_last_error());
    assert_int_equal(made, CF_OK);
    assert_int_equal(learn->model->n_groups, 3);
    assert_int_equal(learn->loss.kind, cf_cross_entropy_loss_flat(1).kind);
    double before[3], after[3];
    cf_status st = cf_validate(learn, before);
    if (st) print_message("%s\n", cf_last_error());
    assert_int_equal(st, CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 4, .lr_max = CF_LR(1e-3)), CF_OK);
    assert_int_equal(cf_validate(learn, after), CF_OK);
    printf("unet: loss %.4f -> %.4f, foreground_acc %.4f -> %.4f, dice_multi %.4f -> %.4f\n",
           before[0], after[0], before[1], after[1], before[2], after[2]);
    assert_true(after[0] < before[0]);
    assert_true(after[1] > before[1] + 0.2);
    assert_true(after[2] > before[2] + 0.2 && after[2] > 0.5);
    /* exported and loaded back: the same U-Net, the same validation */
    char path[256];
    snprintf(path, sizeof path, "/tmp/cf_unet_model_%d.safetensors", (int)getpid());
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    cf_learner *back = NULL;
    st = cf_load_learner(path, &back);
    if (st) print_message("%s\n", cf_last_error());
    assert_int_equal(st, CF_OK);
    unlink(path);
    assert_true(cf_is_dynamic_unet(back->model->root));
    assert_int_equal(back->model->n_params, learn->model->n_params);
    assert_int_equal(back->model->n_groups, 3);
    for (int i = 0; i < learn->model->n_params; i++) {
        const cf_param *p = learn->model->params[i], *q = back->model->params[i];
        assert_string_equal(p->full_name, q->full_name);
        assert_int_equal(p->numel, q->numel);
        assert_memory_equal(p->data, q->data, p->numel * sizeof(float));
    }
    cf_learner_free(back);
    cf_learner_free(learn);
    cf_dls_free(dls);

    /* a data set without masks is refused, and the caller's metrics are taken over */
    assert_int_equal(cf_dls_new(scenes(4, 3), scenes(4, 4), &o, &dls), CF_OK);
    ((cf_dataset *)dls->train_ds)->masks = false;
    cf_metric *m1[] = {cf_foreground_acc(0)};
    assert_int_equal(cf_unet_learner(&learn, dls, "xresnet18", .metrics = m1, .n_metrics = 1),
                     CF_ERR_INVALID);
    assert_null(learn);
    cf_dls_free(dls);
}

/* Rewrites the model file at src as dst with corefit.unet set to unet (NULL: left out). */
static void rewrite_unet_meta(const char *src, const char *dst, const char *unet) {
    cf_st_file *f = NULL;
    assert_int_equal(cf_st_read(src, &f), CF_OK);
    const char *keys[32], *values[32];
    int n = 0;
    for (int i = 0; i < f->n_meta && n < 31; i++) {
        if (strcmp(f->meta_keys[i], "corefit.unet") == 0) continue;
        keys[n] = f->meta_keys[i];
        values[n++] = f->meta_values[i];
    }
    if (unet) {
        keys[n] = "corefit.unet";
        values[n++] = unet;
    }
    assert_int_equal(cf_st_write(dst, f->entries, f->n_entries, keys, values, n), CF_OK);
    cf_st_free(f);
}

/* The error of loading path, which must fail, holds each of needles. */
static void expect_load_error(const char *path, const char *const *needles) {
    cf_learner *learn = NULL;
    assert_int_not_equal(cf_load_learner(path, &learn), CF_OK);
    assert_null(learn);
    const char *msg = cf_last_error();
    for (int i = 0; needles[i]; i++)
        if (!strstr(msg, needles[i])) fail_msg("error \"%s\" lacks \"%s\"", msg, needles[i]);
}

/* DynamicUnet's options survive export and load_learner: a U-Net with self-attention, blur
 * without blur_final, y_range and no last_cross, trained a little (gamma and the spectral norm's
 * u, v move), exported and loaded back gives bitwise the same outputs on the same images (each
 * option changes the outputs or the tensors, so one dropped would show); a file from before the
 * options were recorded loads with fastai's defaults; a missing or unknown option or a value
 * corefit does not build is an error naming the file, the option and the value. */
static void test_unet_options_survive_export(void **state) {
    (void)state;
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 8, .seed = 3, .prefetch = -1};
    assert_int_equal(cf_dls_new(scenes(16, 1), scenes(8, 2), &o, &dls), CF_OK);
    cf_unet_opts uo = cf_unet_defaults();
    uo.blur = true;
    uo.blur_final = false;
    uo.self_attention = true;
    uo.y_range = true;
    uo.y_lo = -3.0f;
    uo.y_hi = 3.0f;
    uo.last_cross = false;
    cf_learner *learn = NULL;
    cf_status st = cf_unet_learner(&learn, dls, "xresnet18", .quiet = true, .seed = 7, .unet = &uo);
    if (st) print_message("%s\n", cf_last_error());
    assert_int_equal(st, CF_OK);
    const cf_param *gamma = NULL;
    for (int i = 0; i < learn->model->n_params; i++)
        if (strstr(learn->model->params[i]->full_name, ".gamma")) gamma = learn->model->params[i];
    assert_non_null(gamma); /* the self-attention layer is there */
    assert_int_equal(cf_fit_one_cycle(learn, 1, .lr_max = CF_LR(1e-2)), CF_OK);
    assert_true(gamma->data[0] != 0.0f);

    char path[256], other[256];
    snprintf(path, sizeof path, "/tmp/cf_unet_opts_%d.safetensors", (int)getpid());
    snprintf(other, sizeof other, "/tmp/cf_unet_opts_%d_b.safetensors", (int)getpid());
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    cf_model_info info;
    assert_int_equal(cf_model_info_read(path, &info), CF_OK);
    const cf_unet_opts *r = &info.recipe.unet;
    assert_true(r->blur && !r->blur_final && r->self_attention && r->y_range && !r->last_cross &&
                !r->bottle);
    assert_true(r->y_lo == -3.0f && r->y_hi == 3.0f);
    cf_model_info_free(&info);
    cf_learner *back = NULL;
    st = cf_load_learner(path, &back);
    if (st) print_message("%s\n", cf_last_error());
    assert_int_equal(st, CF_OK);
    assert_int_equal(back->model->n_params, learn->model->n_params);
    assert_memory_equal(&back->recipe.unet, &learn->recipe.unet, sizeof uo);

    /* the same four validation images through both models, in evaluation mode */
    const int n = 4;
    float *x = malloc(sizeof(float) * n * S * S);
    for (int i = 0; i < n; i++) {
        assert_int_equal(cf_dataset_get(dls->valid_ds, i, 0, x + (size_t)i * S * S), CF_OK);
    }
    cf_tensor xt = cf_tensor_view(x, cf_shape_make(4, (int[]){n, 1, S, S}));
    const cf_tensor *ya = NULL, *yb = NULL;
    cf_model_train(learn->model, false);
    cf_model_train(back->model, false);
    assert_int_equal(cf_model_forward(learn->model, &xt, &ya), CF_OK);
    assert_int_equal(cf_model_forward(back->model, &xt, &yb), CF_OK);
    assert_int_equal(cf_tensor_numel(ya), (size_t)n * N_CODES * S * S);
    assert_true(cf_shape_equal(&ya->shape, &yb->shape));
    assert_memory_equal(ya->data, yb->data, cf_tensor_numel(ya) * sizeof(float));
    for (size_t i = 0; i < cf_tensor_numel(yb); i++) /* SigmoidRange(-3, 3) */
        assert_true(yb->data[i] >= -3.0f && yb->data[i] <= 3.0f);
    free(x);
    cf_learner_free(back);
    cf_learner_free(learn);

    /* a file without corefit.unet (written before it was recorded): fastai's defaults */
    assert_int_equal(cf_unet_learner(&learn, dls, "xresnet18", .quiet = true, .seed = 7), CF_OK);
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    cf_learner_free(learn);
    rewrite_unet_meta(path, other, NULL);
    assert_int_equal(cf_model_info_read(other, &info), CF_OK);
    const cf_unet_opts def = cf_unet_defaults();
    assert_memory_equal(&info.recipe.unet, &def, sizeof def);
    cf_model_info_free(&info);
    assert_int_equal(cf_load_learner(other, &back), CF_OK);
    cf_learner_free(back);

    /* options missing, unknown or not built by corefit: the file, the option, the value */
    static const char *const ok = "\"blur\":false,\"blur_final\":true,\"y_range\":null,"
                                  "\"last_cross\":true,\"bottle\":false,\"act_cls\":\"ReLU\"";
    char meta[512];
    snprintf(meta, sizeof meta, "{%s,\"norm_type\":null}", ok); /* no self_attention */
    rewrite_unet_meta(path, other, meta);
    expect_load_error(other,
                      (const char *[]){other, "corefit.unet", "self_attention", "missing", NULL});
    snprintf(meta, sizeof meta, "{%s,\"norm_type\":null,\"self_attention\":false,\"blurr\":1}", ok);
    rewrite_unet_meta(path, other, meta);
    expect_load_error(other, (const char *[]){other, "unknown option 'blurr'", NULL});
    snprintf(meta, sizeof meta, "{%s,\"norm_type\":\"Batch\",\"self_attention\":false}", ok);
    rewrite_unet_meta(path, other, meta);
    expect_load_error(other, (const char *[]){other, "norm_type is \"Batch\"", NULL});
    snprintf(meta, sizeof meta, "{%s,\"norm_type\":null,\"self_attention\":\"yes\"}", ok);
    rewrite_unet_meta(path, other, meta);
    expect_load_error(other, (const char *[]){"self_attention is \"yes\"", "true or false", NULL});
    rewrite_unet_meta(path, other,
                      "{\"blur\":false,\"blur_final\":true,\"y_range\":[2,1],\"last_cross\":true,"
                      "\"bottle\":false,\"act_cls\":\"ReLU\",\"norm_type\":null,"
                      "\"self_attention\":false}");
    expect_load_error(other, (const char *[]){"y_range is [2,1]", "low < high", NULL});
    snprintf(meta, sizeof meta, "{%s,\"norm_type\":null,\"self_attention\":false}", ok);
    char *mish = strstr(meta, "\"ReLU\"");
    memcpy(mish, "\"Mish\"", 6);
    rewrite_unet_meta(path, other, meta);
    expect_load_error(other, (const char *[]){"act_cls is \"Mish\"", NULL});
    rewrite_unet_meta(path, other, "[true]");
    expect_load_error(other, (const char *[]){other, "corefit.unet is not a JSON object", NULL});
    unlink(other);
    unlink(path);
    cf_dls_free(dls);
}

/* fastai's xresnet at 16x16 reaches 1x1 maps, where the shortcut's AvgPool2d(2, ceil_mode=True)
 * takes the pixel itself (as PyTorch): the U-Net builds, trains a step and keeps the size. */
static void test_unet_xresnet_small_images(void **state) {
    (void)state;
    enum { T = 16 };
    float *x = calloc((size_t)4 * T * T, sizeof(float)), *y = calloc((size_t)4 * T * T, 4);
    for (int i = 0; i < 4 * T * T; i++) {
        y[i] = (float)((i / 5) % 2);
        x[i] = 0.2f + 0.6f * y[i];
    }
    cf_dataset *a = NULL, *b = NULL;
    const cf_shape shape = cf_shape_make(3, (int[]){1, T, T});
    assert_int_equal(cf_dataset_from_arrays(x, y, 4, shape, T * T, 2, &a), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(x, y, 4, shape, T * T, 2, &b), CF_OK);
    a->masks = b->masks = true;
    free(x);
    free(y);
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 4, .seed = 1, .prefetch = -1};
    assert_int_equal(cf_dls_new(a, b, &o, &dls), CF_OK);
    cf_learner *learn = NULL;
    cf_status st = cf_unet_learner(&learn, dls, "xresnet18", .quiet = true, .seed = 2);
    if (st) print_message("%s\n", cf_last_error());
    assert_int_equal(st, CF_OK);
    double rec[1];
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-3)), CF_OK);
    assert_int_equal(cf_validate(learn, rec), CF_OK);
    assert_true(isfinite(rec[0]));
    cf_learner_free(learn);
    cf_dls_free(dls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unet_learner_fit),
        cmocka_unit_test(test_unet_options_survive_export),
        cmocka_unit_test(test_unet_xresnet_small_images),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
