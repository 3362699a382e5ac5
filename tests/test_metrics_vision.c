/* Multi-label and segmentation metrics on hand-worked cases (fastai's and sklearn's formulas
 * worked out below), accumulated over batches, left out for padding rows, and through the
 * (sum, count) reduction of parallel fits: the acc vectors of two shards add up to the metric
 * over the whole set. */
#include "oracle.h"

#include <stdio.h>
#include <string.h>

#include "corefit/learn.h"

/* Multi-label: logits +-2 (sigmoid >= 0.5 where +2), B 4, C 3.
 *   pred [1,0,1] [0,1,1] [1,1,0] [0,0,0]   targ [1,0,0] [0,1,1] [0,1,0] [1,0,0]
 * accuracy_multi 9/12; per class (tp, fp, fn) (1,1,1) (2,0,0) (1,1,0), support 2, 2, 1:
 * F1 0.5, 1, 2/3; macro 13/18, micro 8/11, weighted (1 + 2 + 2/3) / 5, samples (2/3 + 1 + 2/3
 * + 0) / 4; F2 macro (0.5 + 1 + 5/6) / 3. */
static const float ml_bits[12] = {1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0};
static const float ml_targ[12] = {1, 0, 0, 0, 1, 1, 0, 1, 0, 1, 0, 0};

static double multi_value(cf_metric *m, bool split) {
    float logits[12];
    for (int i = 0; i < 12; i++) logits[i] = ml_bits[i] ? 2.0f : -2.0f;
    if (!split) {
        cf_tensor p = cf_tensor_view(logits, cf_shape2(4, 3));
        cf_tensor t = cf_tensor_view((float *)ml_targ, cf_shape2(4, 3));
        m->accumulate(m, &p, &t, NULL);
        return cf_metric_value(m);
    }
    /* two shards: rows 0-1 and 2-3 plus a padding copy of row 0 */
    float p2[9], t2[9];
    memcpy(p2, logits + 6, 6 * sizeof(float));
    memcpy(p2 + 6, logits, 3 * sizeof(float));
    memcpy(t2, ml_targ + 6, 6 * sizeof(float));
    memcpy(t2 + 6, ml_targ, 3 * sizeof(float));
    const bool pad[3] = {false, false, true};
    cf_tensor pa = cf_tensor_view(logits, cf_shape2(2, 3));
    cf_tensor ta = cf_tensor_view((float *)ml_targ, cf_shape2(2, 3));
    cf_tensor pb = cf_tensor_view(p2, cf_shape2(3, 3)), tb = cf_tensor_view(t2, cf_shape2(3, 3));
    double *other = calloc((size_t)m->n_acc, sizeof(double));
    m->accumulate(m, &pb, &tb, pad);
    memcpy(other, m->acc, (size_t)m->n_acc * sizeof(double));
    cf_metric_reset(m);
    m->accumulate(m, &pa, &ta, NULL);
    for (int i = 0; i < m->n_acc; i++) m->acc[i] += other[i];
    free(other);
    return cf_metric_value(m);
}

static void expect_multi(cf_metric *m, double want) {
    for (int split = 0; split < 2; split++) {
        cf_metric_reset(m);
        double got = multi_value(m, split);
        if (fabs(got - want) > 1e-12)
            fail_msg("%s (%s): %.15g, expected %.15g", m->name, split ? "two shards" : "one batch",
                     got, want);
    }
    cf_metric_free(m);
}

static void test_multi_label_metrics(void **state) {
    (void)state;
    expect_multi(cf_accuracy_multi(0, false), 9.0 / 12);
    expect_multi(cf_f1_score_multi(3, CF_AVERAGE_MACRO), 13.0 / 18);
    expect_multi(cf_f1_score_multi(3, CF_AVERAGE_MICRO), 8.0 / 11);
    expect_multi(cf_f1_score_multi(3, CF_AVERAGE_WEIGHTED), (1 + 2 + 2.0 / 3) / 5);
    expect_multi(cf_f1_score_multi(3, CF_AVERAGE_SAMPLES), (2.0 / 3 + 1 + 2.0 / 3) / 4);
    expect_multi(cf_fbeta_multi(2, 3, CF_AVERAGE_MACRO, 0, false), (0.5 + 1 + 5.0 / 6) / 3);
    /* thresholds: sigmoid(2) = 0.88 and sigmoid(-2) = 0.12; at 0.9 nothing is predicted, so
     * only the zeros of the targets are right (7 of 12) */
    expect_multi(cf_accuracy_multi(0.9f, false), 7.0 / 12);
    cf_metric *m = cf_accuracy_multi(0, false);
    assert_string_equal(m->name, "accuracy_multi");
    cf_metric_free(m);
    m = cf_f1_score_multi(3, CF_AVERAGE_MACRO);
    assert_string_equal(m->name, "f1_score");
    cf_metric_free(m);
    assert_null(cf_fbeta_multi(0, 3, CF_AVERAGE_MACRO, 0, false));
    assert_non_null(strstr(cf_last_error(), "beta 0"));
    assert_null(cf_dice_multi(0));
    assert_non_null(strstr(cf_last_error(), "got 0"));
}

/* Segmentation: (B, C, 1, W) one-hot logits of the given argmax classes. */
static void one_hot(const int *cls, int b, int c, int w, float *out) {
    memset(out, 0, (size_t)b * c * w * sizeof(float));
    for (int i = 0; i < b; i++)
        for (int k = 0; k < w; k++) out[(i * c + cls[i * w + k]) * w + k] = 1;
}

static double seg_value(cf_metric *m, const int *pred_cls, const float *targ, int b, int c, int w,
                        bool split) {
    float logits[64];
    one_hot(pred_cls, b, c, w, logits);
    cf_metric_reset(m);
    /* one batch per sample, or all at once: whole-set metrics must not care */
    for (int i = 0; i < (split ? b : 1); i++) {
        int n = split ? 1 : b;
        cf_tensor p = cf_tensor_view(logits + i * c * w, cf_shape4(n, c, 1, w));
        int dims[3] = {n, 1, w};
        cf_tensor t = cf_tensor_view((float *)targ + i * w, cf_shape_make(3, dims));
        m->accumulate(m, &p, &t, NULL);
    }
    return cf_metric_value(m);
}

static void test_segmentation_metrics(void **state) {
    (void)state;
    /* sample 0: pred 0 1 2 1, targ 0 1 1 2; sample 1: pred 2 2 0 0, targ 2 0 0 1.
     * foreground_acc: 2 of 5 foreground pixels right (one batch). DiceMulti: class 0 inter 2,
     * union 6; class 1 inter 1, union 5; class 2 inter 1, union 5: (4/6 + 2/5 + 2/5) / 3. */
    const int pc[8] = {0, 1, 2, 1, 2, 2, 0, 0};
    const float tc[8] = {0, 1, 1, 2, 2, 0, 0, 1};
    cf_metric *fg = cf_foreground_acc(0), *dm = cf_dice_multi(3);
    assert_true(fabs(seg_value(fg, pc, tc, 2, 3, 4, false) - 0.4) < 1e-12);
    /* per batch, averaged by samples: sample 0 1/3, sample 1 1/2 */
    assert_true(fabs(seg_value(fg, pc, tc, 2, 3, 4, true) - (1.0 / 3 + 0.5) / 2) < 1e-12);
    for (int split = 0; split < 2; split++)
        assert_true(fabs(seg_value(dm, pc, tc, 2, 3, 4, split) - (4.0 / 6 + 0.8) / 3) < 1e-12);
    /* binary: pred 1 0 1 1, targ 1 1 0 1: inter 2, union 6 */
    const int pb[4] = {1, 0, 1, 1};
    const float tb[4] = {1, 1, 0, 1};
    cf_metric *dice = cf_dice(), *jac = cf_jaccard_coeff();
    assert_true(fabs(seg_value(dice, pb, tb, 1, 2, 4, false) - 4.0 / 6) < 1e-12);
    assert_true(fabs(seg_value(jac, pb, tb, 1, 2, 4, false) - 0.5) < 1e-12);
    /* nothing predicted or present: fastai's None */
    const int p0[4] = {0};
    const float t0[4] = {0};
    assert_true(isnan(seg_value(dice, p0, t0, 1, 2, 4, false)));
    cf_metric_free(fg), cf_metric_free(dm), cf_metric_free(dice), cf_metric_free(jac);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_label_metrics),
        cmocka_unit_test(test_segmentation_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
