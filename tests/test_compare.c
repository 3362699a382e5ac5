/* The comparisons the other tests rely on must fail on what they are there to catch: a NaN or an
 * infinity anywhere (fmax alone drops a NaN, so all-NaN weights once compared as equal), and a
 * difference in any part of two fits that should be the same. A helper that must fail is run in
 * a child process, whose cmocka run has to report exactly one failed test. */
#include "learn_fixture.h"
#include "same_fit.h"

#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 8 };

static void test_max_rel_err_sees_nan(void **state) {
    (void)state;
    float a[N], b[N];
    fill_uniform(a, N, 1, -1, 1);
    memcpy(b, a, sizeof a);
    assert_true(max_rel_err(a, b, N, 1e-3) == 0);
    b[3] += 0.5f;
    assert_true(max_rel_err(a, b, N, 1e-3) > 0.1);
    memcpy(b, a, sizeof a);
    for (int i = 0; i < N; i++) { /* NaN at any place, on either side */
        float keep = a[i];
        a[i] = NAN;
        assert_false(max_rel_err(a, b, N, 1e-3) <= 1e30);
        assert_false(max_rel_err(b, a, N, 1e-3) <= 1e30);
        a[i] = INFINITY;
        assert_false(max_rel_err(a, b, N, 1e-3) <= 1e30);
        a[i] = keep;
    }
    float nan_a[N], nan_b[N];
    for (int i = 0; i < N; i++) nan_a[i] = nan_b[i] = NAN;
    assert_false(max_rel_err(nan_a, nan_b, N, 1e-3) <= 1e30);
}

/* ---- helpers that must fail ----------------------------------------------------------------- */

static float nan_weights[N], good_weights[N];
static cf_learner *ref_learner, *other_learner;

static void compare_with_nan(void **state) {
    (void)state;
    assert_rel_err_within("weights", nan_weights, good_weights, N, 1e-3, 1e-5);
}
static void compare_all_nan(void **state) {
    (void)state;
    assert_rel_err_within("weights", nan_weights, nan_weights, N, 1e-3, 1e-5);
}
static void finite_with_nan(void **state) {
    (void)state;
    assert_all_finite("weights", nan_weights, N);
}
static void same_fit_pair(void **state) {
    (void)state;
    assert_same_fit(ref_learner, other_learner, "pair");
}

/* Runs one test in a child with its output discarded; returns the number of failed tests the
 * child's cmocka run reported. */
static int failures_of(CMUnitTestFunction fn, const char *name) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        const struct CMUnitTest one[] = {{name, fn, NULL, NULL, NULL}};
        _exit(cmocka_run_group_tests_name(name, one, NULL, NULL));
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_nan_fails_the_comparisons(void **state) {
    (void)state;
    fill_uniform(good_weights, N, 2, -1, 1);
    memcpy(nan_weights, good_weights, sizeof good_weights);
    nan_weights[5] = NAN;
    assert_int_equal(failures_of(compare_with_nan, "one NaN"), 1);
    for (int i = 0; i < N; i++) nan_weights[i] = NAN;
    assert_int_equal(failures_of(compare_all_nan, "all NaN"), 1);
    assert_int_equal(failures_of(finite_with_nan, "finite"), 1);
    /* and the helper passes what it should */
    assert_rel_err_within("equal", good_weights, good_weights, N, 1e-3, 0);
    assert_all_finite("finite", good_weights, N);
}

/* Two learners trained the same way are the same fit; each part that differs is caught. */
static void test_same_fit_checks_every_part(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(48, 16, 8);
    cf_learner *l[2];
    for (int k = 0; k < 2; k++) {
        cf_metric *metrics[] = {cf_accuracy()};
        assert_int_equal(cf_learner_new(&l[k], dls, fixture_model(4, false), .quiet = true,
                                        .metrics = metrics, .n_metrics = 1),
                         CF_OK);
        assert_int_equal(cf_fit_one_cycle(l[k], 2, .lr_max = CF_LR(1e-2)), CF_OK);
    }
    ref_learner = l[0], other_learner = l[1];
    assert_same_fit(l[0], l[1], "identical fits");
    assert_int_equal(failures_of(same_fit_pair, "identical"), 0);

/* changes one field of b by 1, expects the comparison to fail, restores the field bitwise */
#define EXPECT_CAUGHT(field, label)                                                                \
    do {                                                                                           \
        unsigned char keep[sizeof(field)];                                                         \
        memcpy(keep, &(field), sizeof keep);                                                       \
        (field) += 1;                                                                              \
        if (failures_of(same_fit_pair, label) != 1)                                                \
            fail_msg("a changed %s went unnoticed", label);                                        \
        memcpy(&(field), keep, sizeof keep);                                                       \
    } while (0)
    cf_learner *b = l[1];
    EXPECT_CAUGHT(b->model->weights[3], "weight");
    EXPECT_CAUGHT(b->opt->grad_avg[2], "gradient average");
    EXPECT_CAUGHT(b->opt->sqr_avg[1], "square average");
    EXPECT_CAUGHT(b->opt->steps[0], "step count");
    EXPECT_CAUGHT(b->opt->hypers[0].lr, "group lr");
    EXPECT_CAUGHT(b->recorder.lrs[4], "recorded lr");
    EXPECT_CAUGHT(b->recorder.moms[4], "recorded mom");
    EXPECT_CAUGHT(b->recorder.losses[5], "smoothed loss");
    EXPECT_CAUGHT(b->recorder.hp_lr[6], "scheduled lr");
    EXPECT_CAUGHT(b->recorder.hp_mom[6], "scheduled mom");
    EXPECT_CAUGHT(b->recorder.values[1], "epoch value");
    EXPECT_CAUGHT(b->recorder.iters[1], "iteration count");
    EXPECT_CAUGHT(b->recorder.smooth_val, "smoothing state");
    EXPECT_CAUGHT(b->recorder.smooth_count, "smoothing count");
    EXPECT_CAUGHT(b->final_record[0], "final record");
#undef EXPECT_CAUGHT
    /* both fits diverged to NaN: bitwise equal, still not a fit */
    for (int k = 0; k < 2; k++) l[k]->model->weights[0] = NAN;
    assert_int_equal(failures_of(same_fit_pair, "NaN"), 1);
    cf_learner_free(l[0]);
    cf_learner_free(l[1]);
    cf_dls_free(dls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_rel_err_sees_nan),
        cmocka_unit_test(test_nan_fails_the_comparisons),
        cmocka_unit_test(test_same_fit_checks_every_part),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
