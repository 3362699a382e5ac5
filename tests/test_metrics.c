/* Metrics: fastai's AvgMetric / AccumMetric values against the PyTorch oracle (metrics.py) on
 * random predictions fed in odd batch splits with padding rows, and additivity of acc (what the
 * parallel layer's all-reduce relies on). */
#include "oracle.h"

#include <stdlib.h>
#include <string.h>

#include "corefit/learn.h"

enum { N = 203, C = 5, T = 3 };
static const int splits[] = {17, 1, 50, 64, 71};
enum { N_SPLITS = 5 };

/* Random class scores, class codes and ~10% padding rows. */
static void make_class_data(float *pred, float *targ, bool *pad, float *padf, int n, int c,
                            uint64_t seed) {
    fill_uniform(pred, (size_t)n * c, seed, -3, 3);
    cf_rng rng;
    cf_rng_seed(&rng, seed + 1);
    for (int i = 0; i < n; i++) {
        targ[i] = (float)cf_rng_below(&rng, (uint64_t)c);
        pad[i] = cf_rng_uniform(&rng) < 0.1;
        padf[i] = pad[i] ? 1.0f : 0.0f;
    }
}

/* Feeds rows [0, n) to m in the batches of `splits`. */
static void feed(cf_metric *m, const float *pred, const float *targ, const bool *pad, int cols,
                 int tcols) {
    int start = 0;
    for (int s = 0; s < N_SPLITS; s++) {
        int b = splits[s];
        cf_tensor p = cf_tensor_view((float *)pred + (size_t)start * cols, cf_shape2(b, cols));
        cf_tensor t =
            tcols == 1 ? cf_tensor_view((float *)targ + start, cf_shape1(b))
                       : cf_tensor_view((float *)targ + (size_t)start * tcols, cf_shape2(b, tcols));
        m->accumulate(m, &p, &t, pad + start);
        start += b;
    }
    assert_int_equal(start, N);
}

static void put_splits(oracle *o) {
    float s[N_SPLITS];
    for (int i = 0; i < N_SPLITS; i++) s[i] = (float)splits[i];
    oracle_put(o, "splits", s, cf_shape1(N_SPLITS));
}

static void check_value(const char *what, double got, float want) {
    float g = (float)got;
    assert_close(what, &g, &want, 1, 1e-5, 1e-6);
}

/* n_classes is the metric's class count (larger than C: classes never seen, left out of the
 * macro average as sklearn does); no_target_4: class 4 is predicted but never a target. */
static void run_classification(uint64_t seed, int n_classes, bool no_target_4) {
    static float pred[N * C], targ[N], padf[N];
    static bool pad[N];
    make_class_data(pred, targ, pad, padf, N, C, seed);
    if (no_target_4)
        for (int i = 0; i < N; i++)
            if (targ[i] == 4) targ[i] = 3;
    const int k = 3;
    cf_metric *ms[6] = {cf_accuracy(),
                        cf_error_rate(),
                        cf_top_k_accuracy(k),
                        cf_precision(n_classes, true),
                        cf_recall(n_classes, true),
                        cf_f1_score(n_classes, true)};
    const char *names[6] = {"accuracy",        "error_rate",   "top_k_accuracy",
                            "precision_score", "recall_score", "f1_score"};
    for (int i = 0; i < 6; i++) {
        assert_non_null(ms[i]);
        assert_string_equal(ms[i]->name, names[i]);
        assert_true(isnan(cf_metric_value(ms[i]))); /* nothing accumulated yet */
        feed(ms[i], pred, targ, pad, C, 1);
    }
    assert_true(ms[1]->lower_is_better);
    assert_false(ms[0]->lower_is_better);

    oracle o;
    oracle_init(&o);
    oracle_put(&o, "pred", pred, cf_shape2(N, C));
    oracle_put(&o, "targ", targ, cf_shape1(N));
    oracle_put(&o, "pad", padf, cf_shape1(N));
    put_splits(&o);
    char args[32];
    snprintf(args, sizeof args, "class %d", k);
    oracle_run(&o, "metrics.py", args);
    cf_tensor want = oracle_get(&o, "out");
    assert_int_equal(cf_tensor_numel(&want), 6);
    for (int i = 0; i < 6; i++) check_value(names[i], cf_metric_value(ms[i]), want.data[i]);
    /* the data must not make these trivial */
    assert_true(want.data[0] > 0.05 && want.data[0] < 0.6);
    free(want.data);
    oracle_cleanup(&o);

    /* reset forgets everything */
    cf_metric_reset(ms[0]);
    assert_true(isnan(cf_metric_value(ms[0])));
    for (int i = 0; i < 6; i++) cf_metric_free(ms[i]);
}

static void test_classification_vs_oracle(void **state) {
    (void)state;
    run_classification(11, C, false);
    run_classification(12, C + 2, false);
    run_classification(13, C, true);
}

static void run_binary(int cols, uint64_t seed, bool no_positive_preds) {
    static float pred[N * 2], targ[N], padf[N];
    static bool pad[N];
    make_class_data(pred, targ, pad, padf, N, 2, seed);
    if (cols == 1) fill_uniform(pred, N, seed + 7, -2, 2);
    if (no_positive_preds)
        for (int i = 0; i < N; i++) {
            if (cols == 1)
                pred[i] = -1;
            else {
                pred[2 * i] = 1;
                pred[2 * i + 1] = 0;
            }
        }
    cf_metric *ms[3] = {cf_precision(2, false), cf_recall(2, false), cf_f1_score(2, false)};
    for (int i = 0; i < 3; i++) feed(ms[i], pred, targ, pad, cols, 1);
    oracle o;
    oracle_init(&o);
    oracle_put(&o, "pred", pred, cf_shape2(N, cols));
    oracle_put(&o, "targ", targ, cf_shape1(N));
    oracle_put(&o, "pad", padf, cf_shape1(N));
    oracle_run(&o, "metrics.py", "binary");
    cf_tensor want = oracle_get(&o, "out");
    assert_int_equal(cf_tensor_numel(&want), 3);
    const char *names[3] = {"binary precision", "binary recall", "binary f1"};
    for (int i = 0; i < 3; i++) check_value(names[i], cf_metric_value(ms[i]), want.data[i]);
    if (no_positive_preds) assert_true(cf_metric_value(ms[0]) == 0.0);
    free(want.data);
    oracle_cleanup(&o);
    for (int i = 0; i < 3; i++) cf_metric_free(ms[i]);
}

static void test_binary_vs_oracle(void **state) {
    (void)state;
    run_binary(2, 21, false);
    run_binary(1, 22, false); /* one logit: positive when > 0 */
    run_binary(2, 23, true);  /* zero_division: precision 0 */
}

static void test_regression_vs_oracle(void **state) {
    (void)state;
    static float pred[N * T], targ[N * T], padf[N];
    static bool pad[N];
    fill_uniform(pred, N * T, 31, -2, 2);
    fill_uniform(targ, N * T, 32, -1, 3);
    cf_rng rng;
    cf_rng_seed(&rng, 33);
    for (int i = 0; i < N; i++) {
        pad[i] = cf_rng_uniform(&rng) < 0.1;
        padf[i] = pad[i];
    }
    cf_metric *ms[3] = {cf_mse_metric(), cf_mae(), cf_rmse()};
    const char *names[3] = {"mse", "mae", "_rmse"};
    for (int i = 0; i < 3; i++) {
        assert_string_equal(ms[i]->name, names[i]);
        assert_true(ms[i]->lower_is_better);
        feed(ms[i], pred, targ, pad, T, T);
    }
    oracle o;
    oracle_init(&o);
    oracle_put(&o, "pred", pred, cf_shape2(N, T));
    oracle_put(&o, "targ", targ, cf_shape2(N, T));
    oracle_put(&o, "pad", padf, cf_shape1(N));
    put_splits(&o);
    oracle_run(&o, "metrics.py", "regression");
    cf_tensor want = oracle_get(&o, "out");
    for (int i = 0; i < 3; i++) check_value(names[i], cf_metric_value(ms[i]), want.data[i]);
    free(want.data);
    oracle_cleanup(&o);
    for (int i = 0; i < 3; i++) cf_metric_free(ms[i]);
}

/* Two processes' acc added together give the metric over the union of their rows. */
static void test_acc_is_additive(void **state) {
    (void)state;
    static float pred[N * C], targ[N], padf[N];
    static bool pad[N];
    make_class_data(pred, targ, pad, padf, N, C, 41);
    static float rp[N * T], rt[N * T];
    fill_uniform(rp, N * T, 42, -2, 2);
    fill_uniform(rt, N * T, 43, -2, 2);
    cf_metric *(*makers[])(void) = {cf_accuracy, cf_error_rate, cf_mse_metric, cf_mae, cf_rmse};
    int n_kinds = 5 + 4;
    for (int kind = 0; kind < n_kinds; kind++) {
        cf_metric *whole, *a, *b;
        if (kind < 5) {
            whole = makers[kind]();
            a = makers[kind]();
            b = makers[kind]();
        } else {
            cf_metric *(*mk)(int, bool) = kind == 5   ? cf_precision
                                          : kind == 6 ? cf_recall
                                                      : cf_f1_score;
            if (kind == 8) {
                whole = cf_top_k_accuracy(2), a = cf_top_k_accuracy(2), b = cf_top_k_accuracy(2);
            } else {
                whole = mk(C, true), a = mk(C, true), b = mk(C, true);
            }
        }
        bool reg = kind >= 2 && kind <= 4;
        int cols = reg ? T : C, tcols = reg ? T : 1;
        const float *p = reg ? rp : pred, *t = reg ? rt : targ;
        feed(whole, p, t, pad, cols, tcols);
        /* rank 0 takes the first 120 rows, rank 1 the rest, in other batch sizes */
        int cut = 120;
        cf_tensor pa = cf_tensor_view((float *)p, cf_shape2(cut, cols));
        cf_tensor ta = tcols == 1 ? cf_tensor_view((float *)t, cf_shape1(cut))
                                  : cf_tensor_view((float *)t, cf_shape2(cut, tcols));
        cf_tensor pb = cf_tensor_view((float *)p + (size_t)cut * cols, cf_shape2(N - cut, cols));
        cf_tensor tb = tcols == 1 ? cf_tensor_view((float *)t + cut, cf_shape1(N - cut))
                                  : cf_tensor_view((float *)t + (size_t)cut * tcols,
                                                   cf_shape2(N - cut, tcols));
        a->accumulate(a, &pa, &ta, pad);
        b->accumulate(b, &pb, &tb, pad + cut);
        assert_int_equal(a->n_acc, whole->n_acc);
        for (int i = 0; i < a->n_acc; i++) a->acc[i] += b->acc[i];
        double va = cf_metric_value(a), vw = cf_metric_value(whole);
        if (!(fabs(va - vw) <= 1e-12 * fmax(1.0, fabs(vw))))
            fail_msg("%s: summed acc gives %.17g, whole set %.17g", whole->name, va, vw);
        assert_false(isnan(vw));
        cf_metric_free(whole);
        cf_metric_free(a);
        cf_metric_free(b);
    }
}

/* padding rows change nothing: the same rows without padding give the same value */
static void test_padding_left_out(void **state) {
    (void)state;
    float pred[4 * 2] = {1, 0, 0, 1, 0, 1, 0, 1};
    float targ[4] = {0, 1, 0, 0}; /* rows 2, 3 wrong */
    bool pad[4] = {false, false, true, true};
    cf_metric *m = cf_accuracy();
    cf_tensor p = cf_tensor_view(pred, cf_shape2(4, 2)), t = cf_tensor_view(targ, cf_shape1(4));
    m->accumulate(m, &p, &t, pad);
    assert_true(cf_metric_value(m) == 1.0);
    assert_true(m->acc[1] == 2.0);
    m->accumulate(m, &p, &t, NULL); /* no pad array: every row counts */
    assert_true(fabs(cf_metric_value(m) - 4.0 / 6.0) < 1e-15);
    cf_metric_free(m);
}

static double mean_abs_first(const cf_tensor *pred, const cf_tensor *targ, const bool *pad,
                             int *n) {
    double s = 0;
    *n = 0;
    int b = pred->shape.dim[0], c = (int)cf_shape_sample_numel(&pred->shape);
    for (int i = 0; i < b; i++) {
        if (pad && pad[i]) continue;
        s += fabs(pred->data[i * c] - targ->data[i]);
        (*n)++;
    }
    return *n ? s / *n : 0;
}

static void test_user_avg_metric(void **state) {
    (void)state;
    static float pred[N * C], targ[N], padf[N];
    static bool pad[N];
    make_class_data(pred, targ, pad, padf, N, C, 51);
    cf_metric *m = cf_avg_metric("first_mae", mean_abs_first);
    assert_non_null(m);
    assert_string_equal(m->name, "first_mae");
    feed(m, pred, targ, pad, C, 1);
    double s = 0;
    int n = 0;
    for (int i = 0; i < N; i++)
        if (!pad[i]) {
            s += fabs(pred[i * C] - targ[i]);
            n++;
        }
    assert_true(fabs(cf_metric_value(m) - s / n) < 1e-12);
    cf_metric_free(m);
    assert_null(cf_avg_metric("x", NULL));
    assert_true(strstr(cf_last_error(), "cf_avg_metric") != NULL);
    assert_null(cf_top_k_accuracy(0));
    assert_null(cf_precision(1, false));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classification_vs_oracle), cmocka_unit_test(test_binary_vs_oracle),
        cmocka_unit_test(test_regression_vs_oracle),     cmocka_unit_test(test_acc_is_additive),
        cmocka_unit_test(test_padding_left_out),         cmocka_unit_test(test_user_avg_metric),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
