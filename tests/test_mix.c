/* MixUp and CutMix: the draws against fastai's rules (Beta(alpha, alpha), max(lam, 1 - lam),
 * a permutation, rand_bbox and lam from the box's area), the mixed inputs and fastai's mixed
 * loss against PyTorch for one batch with the same lam and permutation, and fits: the same
 * result in one process and in one worker of cf_par_fit, two runs of two workers alike. */
#include "learn_fixture.h"

#include <stdio.h>
#include <string.h>

#include "corefit/par.h"
#include "same_fit.h"

enum { B = 6, C = 2, H = 5, W = 7, K = 4 };

static void check(const char *what, const float *a, const float *b, size_t n) {
    double mx = 1e-30;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    assert_close(what, a, b, n, 1e-4, 1e-5 * mx);
}

static void assert_permutation(const cf_mix_draws *d) {
    bool seen[CF_MIX_MAX_BS] = {0};
    for (int i = 0; i < d->bs; i++) {
        assert_true(d->perm[i] >= 0 && d->perm[i] < d->bs);
        assert_false(seen[d->perm[i]]);
        seen[d->perm[i]] = true;
    }
}

static void test_draw_rules(void **state) {
    (void)state;
    static cf_mix_draws d, again, other;
    /* MixUp: lam per sample in [0.5, 1], the same for the same key, another for another batch */
    assert_int_equal(cf_mix_draw(CF_MIX_MIXUP, 0.4, 3, 1, 5, 64, 0, 0, &d), CF_OK);
    assert_int_equal(cf_mix_draw(CF_MIX_MIXUP, 0.4, 3, 1, 5, 64, 0, 0, &again), CF_OK);
    assert_int_equal(cf_mix_draw(CF_MIX_MIXUP, 0.4, 3, 1, 6, 64, 0, 0, &other), CF_OK);
    assert_memory_equal(&d, &again, sizeof d);
    assert_memory_not_equal(d.lam, other.lam, sizeof d.lam);
    assert_permutation(&d);
    bool varies = false;
    for (int i = 0; i < 64; i++) {
        assert_true(d.lam[i] >= 0.5f && d.lam[i] <= 1.0f);
        varies |= d.lam[i] != d.lam[0];
    }
    assert_true(varies);
    /* CutMix: fastai's rand_bbox from the drawn lam, lam from the box's area */
    int full_boxes = 0;
    double lam_sum = 0;
    for (int b = 0; b < 400; b++) {
        assert_int_equal(cf_mix_draw(CF_MIX_CUTMIX, 1.0, 9, 0, b, 8, H, W, &d), CF_OK);
        assert_permutation(&d);
        const float r = sqrtf(1.0f - d.drawn_lam);
        const int cut_w = (int)rintf(W * r), cut_h = (int)rintf(H * r);
        assert_true(d.x1 >= 0 && d.x1 <= d.x2 && d.x2 <= W);
        assert_true(d.y1 >= 0 && d.y1 <= d.y2 && d.y2 <= H);
        assert_true(d.x2 - d.x1 <= 2 * (cut_w / 2) && d.y2 - d.y1 <= 2 * (cut_h / 2));
        /* an unclamped box is exactly 2 * (cut // 2) wide */
        if (d.x1 > 0 && d.x2 < W) assert_int_equal(d.x2 - d.x1, 2 * (cut_w / 2));
        if (d.y1 > 0 && d.y2 < H) assert_int_equal(d.y2 - d.y1, 2 * (cut_h / 2));
        const float want = 1.0f - (float)((d.x2 - d.x1) * (d.y2 - d.y1)) / (float)(W * H);
        for (int i = 0; i < 8; i++) assert_true(d.lam[i] == want);
        full_boxes += d.x2 - d.x1 == W;
        lam_sum += d.drawn_lam;
    }
    assert_true(full_boxes < 400);
    /* Beta(1, 1) is uniform: 400 draws average 0.5 within 4 standard errors (0.058) */
    assert_true(fabs(lam_sum / 400 - 0.5) < 0.058);
    /* bad arguments */
    assert_int_equal(cf_mix_draw(CF_MIX_MIXUP, -1, 0, 0, 0, 4, 0, 0, &d), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "alpha -1"));
    assert_int_equal(cf_mix_draw(CF_MIX_CUTMIX, 1, 0, 0, 0, 4, 0, 3, &d), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "0x3"));
    assert_null(cf_mixup_cb(-0.5));
    assert_non_null(strstr(cf_last_error(), "MixUp: alpha -0.5"));
}

static void test_mixing_and_loss_match_pytorch(void **state) {
    (void)state;
    static oracle o;
    oracle_init(&o);
    static cf_mix_draws mu, cm;
    float x[B * C * H * W], logits[B * K], codes[B], multi[B * K];
    fill_uniform(x, sizeof x / sizeof *x, 11, -1, 1);
    fill_uniform(logits, B * K, 12, -2, 2);
    fill_uniform(multi, B * K, 13, 0, 1);
    for (int i = 0; i < B * K; i++) multi[i] = multi[i] < 0.5f ? 0 : 1;
    for (int i = 0; i < B; i++) codes[i] = (float)((i * 3) % K);
    assert_int_equal(cf_mix_draw(CF_MIX_MIXUP, 0.4, 21, 2, 3, B, H, W, &mu), CF_OK);
    /* a CutMix box away from the image's border and the same permutation */
    for (int b = 0;; b++) {
        assert_int_equal(cf_mix_draw(CF_MIX_CUTMIX, 1.0, 21, 2, b, B, H, W, &cm), CF_OK);
        if (cm.x2 - cm.x1 >= 2 && cm.y2 - cm.y1 >= 2 && cm.x2 - cm.x1 < W) break;
    }
    memcpy(cm.perm, mu.perm, sizeof mu.perm);
    float lam[B], perm[B];
    for (int i = 0; i < B; i++) lam[i] = mu.lam[i], perm[i] = (float)mu.perm[i];
    const float eps = 0.1f;
    oracle_put(&o, "x", x, cf_shape4(B, C, H, W));
    oracle_put(&o, "logits", logits, cf_shape2(B, K));
    oracle_put(&o, "codes", codes, cf_shape1(B));
    oracle_put(&o, "multi", multi, cf_shape2(B, K));
    oracle_put(&o, "lam", lam, cf_shape1(B));
    oracle_put(&o, "perm", perm, cf_shape1(B));
    oracle_put_values(&o, "box", 4, (double)cm.x1, (double)cm.y1, (double)cm.x2, (double)cm.y2);
    oracle_put_values(&o, "eps", 1, (double)eps);
    oracle_run(&o, "mix.py", "");

    float mixed[B * C * H * W];
    cf_tensor tx = cf_tensor_view(x, cf_shape4(B, C, H, W));
    assert_int_equal(cf_mix_inputs(CF_MIX_MIXUP, &mu, &tx, mixed), CF_OK);
    cf_tensor ref = oracle_get(&o, "mixup_x");
    check("MixUp inputs", mixed, ref.data, sizeof x / sizeof *x);
    free(ref.data);
    assert_int_equal(cf_mix_inputs(CF_MIX_CUTMIX, &cm, &tx, mixed), CF_OK);
    ref = oracle_get(&o, "cutmix_x");
    assert_memory_equal(mixed, ref.data, sizeof mixed); /* pasted pixels are copied exactly */
    free(ref.data);

    /* fastai's mixed LabelSmoothingCrossEntropy: CE against the mixed one-hot targets */
    cf_loss loss = cf_label_smoothing_ce(eps);
    cf_shape ps = cf_shape2(B, K);
    float soft[B * K], mean, grad[B * K];
    cf_tensor ty = cf_tensor_view(codes, cf_shape1(B)), tp = cf_tensor_view(logits, ps);
    assert_int_equal(cf_mix_class_targets(&mu, &loss, &ps, &ty, soft), CF_OK);
    cf_tensor ts = cf_tensor_view(soft, ps), tg = cf_tensor_view(grad, ps);
    assert_int_equal(cf_loss_forward(&loss, &tp, &ts, &mean, NULL), CF_OK);
    cf_loss_backward(&loss, &tp, &ts, &tg);
    ref = oracle_get(&o, "loss");
    check("mixed loss", &mean, ref.data, 1);
    free(ref.data);
    ref = oracle_get(&o, "grad");
    check("mixed loss gradient", grad, ref.data, B * K);
    free(ref.data);

    /* BCE: the targets are mixed */
    float mt[B * K];
    cf_tensor tm = cf_tensor_view(multi, cf_shape2(B, K));
    cf_mix_targets(&mu, &tm, mt);
    ref = oracle_get(&o, "bce_targets");
    check("mixed multi-label targets", mt, ref.data, B * K);
    free(ref.data);

    /* the distribution of MixUp's lam: max(L, 1 - L), L ~ Beta(0.4, 0.4) */
    double s = 0, s2 = 0;
    int n = 0;
    static cf_mix_draws d;
    for (int b = 0; b < 40; b++) {
        assert_int_equal(cf_mix_draw(CF_MIX_MIXUP, 0.4, 5, 0, b, CF_MIX_MAX_BS, 0, 0, &d), CF_OK);
        for (int i = 0; i < CF_MIX_MAX_BS; i++, n++)
            s += d.lam[i], s2 += (double)d.lam[i] * d.lam[i];
    }
    ref = oracle_get(&o, "beta_stats");
    double m = s / n, sd = sqrt(s2 / n - m * m);
    /* 163840 draws: standard error of the mean ~ 0.16 / 405 = 4e-4 */
    if (fabs(m - ref.data[0]) > 2e-3 || fabs(sd - ref.data[1]) > 2e-3)
        fail_msg("MixUp lam: mean %g sd %g, PyTorch's Beta %g %g", m, sd, (double)ref.data[0],
                 (double)ref.data[1]);
    free(ref.data);
    oracle_cleanup(&o);
}

/* Images (1, 4, 4), 3 classes by where the bright quarter is (or none). */
static cf_dls *image_dls(void) {
    enum { N = 48, NV = 16 };
    static float x[(N + NV) * 16], y[N + NV];
    fill_uniform(x, sizeof x / sizeof *x, 77, 0, 0.3f);
    for (int i = 0; i < N + NV; i++) {
        int cls = i % 3;
        y[i] = (float)cls;
        for (int r = 0; r < 2 && cls; r++)
            for (int c = 0; c < 2; c++)
                x[i * 16 + (cls == 1 ? r : r + 2) * 4 + c + (cls == 2) * 2] += 1;
    }
    cf_dataset *tr = NULL, *va = NULL;
    int dims[3] = {1, 4, 4};
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape_make(3, dims), 1, 3, &tr), CF_OK);
    assert_int_equal(
        cf_dataset_from_arrays(x + N * 16, y + N, NV, cf_shape_make(3, dims), 1, 3, &va), CF_OK);
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 8, .seed = 5};
    assert_int_equal(cf_dls_new(tr, va, &o, &dls), CF_OK);
    return dls;
}

static cf_learner *image_learner(cf_dls *dls, cf_loss loss) {
    cf_module *layers[] = {cf_flatten(), cf_linear(16, loss.kind == CF_LOSS_MSE ? 1 : 3, true)};
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(2, layers), 17), CF_OK);
    cf_metric *metrics[] = {loss.kind == CF_LOSS_MSE ? cf_mse_metric() : cf_accuracy()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, m, .quiet = true, .loss = loss, .loss_set = true,
                                    .metrics = metrics, .n_metrics = 1, .seed = 4),
                     CF_OK);
    return learn;
}

static void assert_weights_near(const cf_learner *a, const cf_learner *b, const char *what) {
    assert_int_equal(a->model->n_weights, b->model->n_weights);
    assert_close(what, a->model->weights, b->model->weights, a->model->n_weights, 1e-5, 1e-6);
}

static void fits_agree(bool cutmix, cf_loss loss) {
    cf_dls *dls = image_dls();
    cf_learner *single = image_learner(dls, loss), *one = image_learner(dls, loss),
               *plain = image_learner(dls, loss), *two_a = image_learner(dls, loss),
               *two_b = image_learner(dls, loss);
#define MIXCB() (cutmix ? cf_cutmix_cb(0) : cf_mixup_cb(0))
    cf_callback *c1[] = {MIXCB()}, *c2[] = {MIXCB()}, *c3[] = {MIXCB()}, *c4[] = {MIXCB()};
    assert_int_equal(cf_fit(single, 2, .lr = CF_LR(0.05), .cbs = c1, .n_cbs = 1), CF_OK);
    assert_int_equal(
        cf_par_fit(one, 2, .lr = CF_LR(0.05), .cbs = c2, .n_cbs = 1, .par.num_cores = 1), CF_OK);
    assert_weights_near(single, one, "one worker against one process");
    assert_close("recorded losses", (const float[]){(float)single->recorder.losses[11]},
                 (const float[]){(float)one->recorder.losses[11]}, 1, 1e-5, 1e-6);
    /* the callback did mix: a plain fit ends elsewhere */
    assert_int_equal(cf_fit(plain, 2, .lr = CF_LR(0.05)), CF_OK);
    assert_memory_not_equal(plain->model->weights, single->model->weights,
                            plain->model->n_weights * sizeof(float));
    assert_int_equal(
        cf_par_fit(two_a, 2, .lr = CF_LR(0.05), .cbs = c3, .n_cbs = 1, .par.num_cores = 2), CF_OK);
    assert_int_equal(
        cf_par_fit(two_b, 2, .lr = CF_LR(0.05), .cbs = c4, .n_cbs = 1, .par.num_cores = 2), CF_OK);
    assert_same_fit(two_a, two_b, "two runs of two workers");
#undef MIXCB
    cf_learner_free(single), cf_learner_free(one), cf_learner_free(plain);
    cf_learner_free(two_a), cf_learner_free(two_b);
    cf_dls_free(dls);
}

static void test_mixup_fit_and_par_fit(void **state) {
    (void)state;
    fits_agree(false, cf_label_smoothing_ce(0));
}

static void test_cutmix_fit_and_par_fit(void **state) {
    (void)state;
    fits_agree(true, cf_cross_entropy_loss_flat(0));
}

static void test_mixup_with_mse(void **state) {
    (void)state;
    /* targets mixed for a loss without class codes: MSE against the class as a number */
    fits_agree(false, cf_mse_loss_flat());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draw_rules),
        cmocka_unit_test(test_mixing_and_loss_match_pytorch),
        cmocka_unit_test(test_mixup_fit_and_par_fit),
        cmocka_unit_test(test_cutmix_fit_and_par_fit),
        cmocka_unit_test(test_mixup_with_mse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
