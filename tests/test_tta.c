/* Test-time augmentation (cf_tta, fastai's Learner.tta): beta 1 is get_preds; the augmented
 * passes are the training augmentations drawn from cf_tta_seed, blended as torch.lerp (checked
 * against PyTorch on passes made by hand); the cf_par_tta twin equals the in-process result;
 * bad options are refused. */
#include "oracle.h"

#include <stdio.h>
#include <string.h>

#include "corefit.h"

enum { C = 3, H = 12, W = 12, N_TRAIN = 24, N_VALID = 10, N_CLASSES = 3 };
#define NUMEL (C * H * W)

/* 3 x 12 x 12 random images of 3 classes, batches of 4 (the last validation batch is short),
 * fastai's aug_transforms on the training loader. */
static cf_dls *image_dls(const cf_aug_opts *aug) {
    float *x = malloc((N_TRAIN + N_VALID) * NUMEL * sizeof(float));
    float y[N_TRAIN + N_VALID];
    fill_uniform(x, (N_TRAIN + N_VALID) * NUMEL, 11, 0, 1);
    for (int i = 0; i < N_TRAIN + N_VALID; i++) y[i] = (float)(i % N_CLASSES);
    int dims[3] = {C, H, W};
    cf_dataset *tr = NULL, *va = NULL;
    assert_int_equal(
        cf_dataset_from_arrays(x, y, N_TRAIN, cf_shape_make(3, dims), 1, N_CLASSES, &tr), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(x + N_TRAIN * NUMEL, y + N_TRAIN, N_VALID,
                                            cf_shape_make(3, dims), 1, N_CLASSES, &va),
                     CF_OK);
    free(x);
    cf_dls *dls = NULL;
    assert_int_equal(cf_dls_new(tr, va, &(cf_dls_options){.bs = 4, .seed = 21, .aug = aug}, &dls),
                     CF_OK);
    return dls;
}

/* conv 3->4, ReLU, flatten, linear to 3 classes: predictions that change when the image does. */
static cf_learner *image_learner(cf_dls *dls) {
    cf_module *layers[] = {cf_conv2d(C, 4, 3, 1, 1, true), cf_relu(), cf_flatten(),
                           cf_linear(4 * H * W, N_CLASSES, true)};
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(4, layers), 5), CF_OK);
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, m, .quiet = true), CF_OK);
    return learn;
}

/* The probabilities of validation item i as tta's augmented pass `pass` makes it: the item drawn
 * through the training aug_transforms with cf_tta_seed(loader seed, pass) at epoch 0 (pass < 0:
 * the plain item). */
static void hand_pass(cf_learner *learn, const cf_aug_opts *aug, int pass, float *probs) {
    const cf_dataset *va = learn->dls->valid_ds;
    uint64_t seed = cf_dataloader_options(learn->dls->train)->seed;
    float img[NUMEL];
    for (int i = 0; i < N_VALID; i++) {
        const float *x = va->x + (size_t)i * NUMEL;
        if (pass >= 0) {
            cf_aug_params prm;
            cf_aug_draw(aug, cf_tta_seed(seed, pass), 0, i, H, W, &prm);
            cf_aug_apply(&prm, aug->pad_mode, x, C, H, W, img);
        } else {
            memcpy(img, x, sizeof img);
        }
        assert_int_equal(cf_predict(learn, img, probs + i * N_CLASSES, NULL), CF_OK);
    }
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN wins */
    }
    return m;
}

/* beta 1 is the plain pass: bitwise get_preds, targets included. The default beta is not (the
 * augmentations change the predictions), which shows the comparison can fail. */
static void test_beta_one_is_get_preds(void **state) {
    (void)state;
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_dls *dls = image_dls(&aug);
    cf_learner *learn = image_learner(dls);
    cf_preds plain = {0}, one = {0}, dflt = {0};
    assert_int_equal(cf_get_preds(learn, &plain), CF_OK);
    assert_int_equal(cf_tta(learn, &one, .beta = 1.0), CF_OK);
    assert_int_equal(one.n, N_VALID);
    assert_int_equal(one.preds.shape.dim[0], N_VALID);
    assert_int_equal(one.preds.shape.dim[1], N_CLASSES);
    assert_memory_equal(one.preds.data, plain.preds.data, N_VALID * N_CLASSES * sizeof(float));
    assert_memory_equal(one.targs.data, plain.targs.data, N_VALID * sizeof(float));
    assert_int_equal(cf_tta(learn, &dflt), CF_OK);
    double d = max_abs_diff(dflt.preds.data, plain.preds.data, N_VALID * N_CLASSES);
    if (!(d > 1e-4)) fail_msg("tta with augmentations equals get_preds (difference %.3g)", d);
    /* still probabilities */
    for (int i = 0; i < N_VALID; i++) {
        double s = 0;
        for (int k = 0; k < N_CLASSES; k++) s += dflt.preds.data[i * N_CLASSES + k];
        assert_true(fabs(s - 1) < 1e-5);
    }
    cf_preds_free(&plain);
    cf_preds_free(&one);
    cf_preds_free(&dflt);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* n 1: 0.75 * (the item through the augmentation drawn for pass 0) + 0.25 * (the plain item),
 * each predicted one at a time with cf_predict. A zoom-only augmentation that always applies
 * (p_affine 1, min_zoom = max_zoom 1.5: only the zoom's centre is drawn) and, as the training
 * loader's, fastai's aug_transforms. */
static void test_one_pass_is_hand_made_blend(void **state) {
    (void)state;
    cf_aug_opts zoom = cf_aug_transforms_defaults(1.0f);
    zoom.do_flip = false;
    zoom.max_rotate = 0;
    zoom.max_lighting = 0;
    zoom.max_warp = 0;
    zoom.min_zoom = zoom.max_zoom = 1.5f;
    zoom.p_affine = 1;
    cf_aug_opts full = cf_aug_transforms_defaults(1.0f);
    const cf_aug_opts *cases[] = {&zoom, &full};
    for (int c = 0; c < 2; c++) {
        cf_dls *dls = image_dls(cases[c]);
        cf_learner *learn = image_learner(dls);
        float plain[N_VALID * N_CLASSES], aug[N_VALID * N_CLASSES], want[N_VALID * N_CLASSES];
        hand_pass(learn, cases[c], -1, plain);
        hand_pass(learn, cases[c], 0, aug);
        for (int i = 0; i < N_VALID * N_CLASSES; i++) want[i] = 0.75f * aug[i] + 0.25f * plain[i];
        cf_preds p = {0};
        assert_int_equal(cf_tta(learn, &p, .n = 1), CF_OK);
        assert_close(c ? "aug_transforms, n 1" : "zoom, n 1", p.preds.data, want,
                     N_VALID * N_CLASSES, 1e-5, 1e-6);
        double d = max_abs_diff(aug, plain, N_VALID * N_CLASSES);
        if (!(d > 1e-4)) fail_msg("case %d: the augmentation changed nothing (%.3g)", c, d);
        /* the same with the augmentation given to the call instead of the loader's */
        cf_preds q = {0};
        cf_dls *bare = image_dls(NULL);
        cf_learner *other = image_learner(bare);
        assert_int_equal(cf_tta(other, &q, .n = 1, .aug = cases[c]), CF_OK);
        assert_close("aug given to the call", q.preds.data, p.preds.data, N_VALID * N_CLASSES, 1e-6,
                     1e-7);
        cf_preds_free(&q);
        cf_learner_free(other);
        cf_dls_free(bare);
        cf_preds_free(&p);
        cf_learner_free(learn);
        cf_dls_free(dls);
    }
}

/* n 3, the passes made by hand, blended by PyTorch: torch.lerp(aug.mean(0), plain, beta) for
 * beta 0.25 (the default) and 0.6, and with use_max torch.stack([plain, aug.max(0)]).max(0). */
static void test_blend_matches_pytorch(void **state) {
    (void)state;
    cf_aug_opts augo = cf_aug_transforms_defaults(1.0f);
    cf_dls *dls = image_dls(&augo);
    cf_learner *learn = image_learner(dls);
    enum { PASSES = 3 };
    float plain[N_VALID * N_CLASSES], aug[PASSES * N_VALID * N_CLASSES];
    hand_pass(learn, &augo, -1, plain);
    for (int pass = 0; pass < PASSES; pass++)
        hand_pass(learn, &augo, pass, aug + pass * N_VALID * N_CLASSES);
    oracle o;
    oracle_init(&o);
    oracle_put(&o, "plain", plain, cf_shape2(N_VALID, N_CLASSES));
    int dims[3] = {PASSES, N_VALID, N_CLASSES};
    oracle_put(&o, "aug", aug, cf_shape_make(3, dims));
    const double betas[] = {0.25, 0.6};
    for (int b = 0; b < 2; b++) {
        char arg[32];
        snprintf(arg, sizeof arg, "%g", betas[b]);
        oracle_run(&o, "tta.py", arg);
        cf_tensor want = oracle_get(&o, "blend"), want_max = oracle_get(&o, "blend_max");
        cf_preds p = {0}, q = {0};
        if (b == 0)
            assert_int_equal(cf_tta(learn, &p, .n = PASSES), CF_OK);
        else
            assert_int_equal(cf_tta(learn, &p, .n = PASSES, .beta = betas[b]), CF_OK);
        assert_close("tta blend", p.preds.data, want.data, N_VALID * N_CLASSES, 1e-5, 1e-6);
        assert_int_equal(cf_tta(learn, &q, .n = PASSES, .use_max = true), CF_OK);
        assert_close("tta use_max", q.preds.data, want_max.data, N_VALID * N_CLASSES, 1e-5, 1e-6);
        cf_preds_free(&p);
        cf_preds_free(&q);
        free(want.data);
        free(want_max.data);
    }
    /* aug_only: the mean of the passes alone (beta 0) */
    cf_preds p = {0};
    assert_int_equal(cf_tta(learn, &p, .n = PASSES, .aug_only = true), CF_OK);
    float mean[N_VALID * N_CLASSES];
    for (int i = 0; i < N_VALID * N_CLASSES; i++)
        mean[i] = (aug[i] + aug[N_VALID * N_CLASSES + i] + aug[2 * N_VALID * N_CLASSES + i]) / 3;
    assert_close("aug_only", p.preds.data, mean, N_VALID * N_CLASSES, 1e-5, 1e-6);
    cf_preds_free(&p);
    oracle_cleanup(&o);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* cf_par_tta on 2 and 3 fork workers (the validation set split unevenly, with padding) equals
 * cf_tta: the same augmentations for the same seed, rows in dataset order. */
static void test_twin_equals_in_process(void **state) {
    (void)state;
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_dls *dls = image_dls(&aug);
    cf_learner *learn = image_learner(dls);
    cf_preds want = {0};
    assert_int_equal(cf_tta(learn, &want, .n = 2), CF_OK);
    for (int world = 2; world <= 3; world++) {
        cf_preds got = {0};
        cf_status st = cf_par_tta(learn, &got, .n = 2, .par.num_cores = world);
        if (st != CF_OK) fail_msg("%d workers: %s", world, cf_last_error());
        assert_int_equal(got.n, N_VALID);
        assert_close("cf_par_tta", got.preds.data, want.preds.data, N_VALID * N_CLASSES, 1e-5,
                     1e-6);
        assert_memory_equal(got.targs.data, want.targs.data, N_VALID * sizeof(float));
        cf_preds_free(&got);
    }
    cf_preds_free(&want);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* flip_pass: one pass with every image mirrored left to right, whatever the training loader's
 * augmentations: aug_only gives each mirrored item's cf_predict, and beta 0.5 the mean of the
 * plain and mirrored probabilities (flip TTA); the same on 2 fork workers. */
static void test_flip_pass_is_mirrored_items(void **state) {
    (void)state;
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_dls *dls = image_dls(&aug);
    cf_learner *learn = image_learner(dls);
    const cf_dataset *va = learn->dls->valid_ds;
    float mirrored[N_VALID * N_CLASSES], plain[N_VALID * N_CLASSES], img[NUMEL];
    for (int i = 0; i < N_VALID; i++) {
        const float *x = va->x + (size_t)i * NUMEL;
        for (int r = 0; r < C * H; r++)
            for (int j = 0; j < W; j++) img[r * W + j] = x[r * W + (W - 1 - j)];
        assert_int_equal(cf_predict(learn, img, mirrored + i * N_CLASSES, NULL), CF_OK);
        assert_int_equal(cf_predict(learn, x, plain + i * N_CLASSES, NULL), CF_OK);
    }
    cf_preds only = {0}, avg = {0}, twin = {0};
    assert_int_equal(cf_tta(learn, &only, .flip_pass = true, .aug_only = true), CF_OK);
    assert_close("flip pass", only.preds.data, mirrored, N_VALID * N_CLASSES, 1e-5, 1e-6);
    double d = max_abs_diff(mirrored, plain, N_VALID * N_CLASSES);
    if (!(d > 1e-4)) fail_msg("mirrored items predicted as the plain ones (difference %.3g)", d);
    assert_int_equal(cf_tta(learn, &avg, .flip_pass = true, .beta = 0.5), CF_OK);
    float mean[N_VALID * N_CLASSES];
    for (int i = 0; i < N_VALID * N_CLASSES; i++) mean[i] = 0.5f * (mirrored[i] + plain[i]);
    assert_close("flip TTA", avg.preds.data, mean, N_VALID * N_CLASSES, 1e-5, 1e-6);
    cf_status st = cf_par_tta(learn, &twin, .flip_pass = true, .beta = 0.5, .par.num_cores = 2);
    if (st != CF_OK) fail_msg("2 workers: %s", cf_last_error());
    assert_close("flip TTA on 2 workers", twin.preds.data, avg.preds.data, N_VALID * N_CLASSES,
                 1e-5, 1e-6);
    cf_preds_free(&only);
    cf_preds_free(&avg);
    cf_preds_free(&twin);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* Bad options: an error naming the value; out left empty. */
static void test_bad_options(void **state) {
    (void)state;
    cf_dls *dls = image_dls(NULL);
    cf_learner *learn = image_learner(dls);
    cf_preds p = {0};
    assert_int_equal(cf_tta(learn, &p, .n = -2), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "n -2"));
    assert_null(p.preds.data);
    assert_int_equal(cf_tta(learn, &p, .beta = 1.5), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "beta 1.5"));
    assert_int_equal(cf_tta(learn, &p, .beta = NAN), CF_ERR_INVALID);
    assert_null(p.preds.data);
    /* the twin: the workers' error, and the caller's output untouched */
    assert_int_not_equal(cf_par_tta(learn, &p, .n = -1, .par.num_cores = 2), CF_OK);
    if (!strstr(cf_last_error(), "n -1")) fail_msg("cf_par_tta's error: %s", cf_last_error());
    assert_null(p.preds.data);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_beta_one_is_get_preds),
        cmocka_unit_test(test_one_pass_is_hand_made_blend),
        cmocka_unit_test(test_blend_matches_pytorch),
        cmocka_unit_test(test_twin_equals_in_process),
        cmocka_unit_test(test_flip_pass_is_mirrored_items),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
