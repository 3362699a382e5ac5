/* Consecutive fits continue one data stream (corefit/learn.h, cf_learner.data_epochs): as
 * fastai's DataLoader draws a fresh shuffle at every epoch across fits, the second of two fits
 * (fine_tune's second call, each stage of ULMFiT's gradual unfreezing) sees other orders, other
 * augmentation and other dropout draws than the first, and exactly those a single longer fit
 * would have drawn for its later epochs. The count comes home from cf_par_ twins and is kept in
 * checkpoints, so a second fit stopped and resumed in a new learner ends as the fit that never
 * stopped, in one process and with fork workers. */
#include "child.h"
#include "learn_fixture.h"
#include "resume_fixture.h"
#include "same_fit.h"

#include <stdio.h>
#include <string.h>

#include "corefit/par.h"

enum { MAX_EPOCHS = 8, MAX_BATCH = 64 };

static cf_aug_opts aug;

/* The sample ids of each training epoch's batches, in the order they ran. */
typedef struct orders {
    int n_epochs;
    int64_t n[MAX_EPOCHS];
    int64_t ids[MAX_EPOCHS][MAX_BATCH * 8];
} orders;

static cf_status note_batch(cf_callback *cb, cf_learner *learn) {
    orders *o = *(orders **)cb->state;
    if (!learn->training || !learn->batch) return CF_OK;
    if (learn->iter == 0) o->n_epochs++;
    const int e = o->n_epochs - 1;
    for (int i = 0; i < learn->batch->size && e < MAX_EPOCHS; i++)
        if (o->n[e] < MAX_BATCH * 8) o->ids[e][o->n[e]++] = learn->batch->idx[i];
    return CF_OK;
}

static cf_callback *orders_cb(orders *o) {
    cf_callback *cb = cf_callback_new("NoteOrder", 0, sizeof(orders *));
    if (cb) {
        *(orders **)cb->state = o;
        cb->on[CF_EV_BEFORE_BATCH] = note_batch;
    }
    return cb;
}

static bool same_order(const orders *a, int ea, const orders *b, int eb) {
    return a->n[ea] == b->n[eb] && a->n[ea] > 0 &&
           memcmp(a->ids[ea], b->ids[eb], (size_t)a->n[ea] * sizeof(int64_t)) == 0;
}

static cf_learner *learner(cf_dls *dls, uint64_t seed, const char *path) {
    cf_learner *learn = resume_learner(dls, seed, path);
    if (!learn) fail_msg("learner: %s", cf_last_error());
    return learn;
}

/* workers 0: in this process; else cf_par_ with that many fork workers. */
static cf_status cycle(cf_learner *learn, int epochs, int workers, cf_callback **cbs, int n_cbs,
                       const char *resume) {
    cf_one_cycle_opts o = {.lr_max = CF_LR(2e-2), .cbs = cbs, .n_cbs = n_cbs, .resume = resume};
    if (!workers) return cf_fit_one_cycle_(learn, epochs, &o);
    o.par.num_cores = workers;
    return cf_par_fit_one_cycle_(learn, epochs, &o);
}

/* Two fits of one epoch see other orders; the second sees the order of a two-epoch fit's
 * second epoch (its augmentation and dropout too: the same weights after a plain fit). */
static void test_second_fit_draws_fresh(void **state) {
    (void)state;
    cf_dls *dls = resume_dls(&aug);
    assert_non_null(dls);
    static orders two_fits, one_fit;
    memset(&two_fits, 0, sizeof two_fits);
    memset(&one_fit, 0, sizeof one_fit);
    cf_learner *a = learner(dls, 3, NULL);
    assert_int_equal(a->data_epochs, 0);
    for (int k = 0; k < 2; k++) {
        cf_callback *cbs[] = {orders_cb(&two_fits)};
        assert_int_equal(cf_fit_(a, 1, &(cf_fit_opts){.lr = CF_LR(1e-2), .cbs = cbs, .n_cbs = 1}),
                         CF_OK);
        assert_int_equal(a->data_epochs, k + 1);
    }
    assert_int_equal(two_fits.n_epochs, 2);
    if (same_order(&two_fits, 0, &two_fits, 1))
        fail_msg("the second fit drew the first fit's shuffle again");

    cf_learner *b = learner(dls, 3, NULL);
    cf_callback *cbs[] = {orders_cb(&one_fit)};
    assert_int_equal(cf_fit_(b, 2, &(cf_fit_opts){.lr = CF_LR(1e-2), .cbs = cbs, .n_cbs = 1}),
                     CF_OK);
    assert_int_equal(b->data_epochs, 2);
    assert_true(same_order(&two_fits, 0, &one_fit, 0));
    assert_true(same_order(&two_fits, 1, &one_fit, 1));
    /* plain fits at one lr with Adam's state kept: two fits of one epoch are one fit of two */
    assert_same_model_state(b, a, "fit(1) twice against fit(2)");

    /* validation and get_preds are not training epochs: the count stays */
    double v[2];
    assert_int_equal(cf_validate(b, v), CF_OK);
    assert_int_equal(b->data_epochs, 2);
    cf_learner_free(a);
    cf_learner_free(b);
    cf_dls_free(dls);
}

/* The count is part of the learner's state: it comes home from fork workers, and a state
 * carried into another learner carries it. */
static void test_count_comes_home(void **state) {
    (void)state;
    cf_dls *dls = resume_dls(&aug);
    assert_non_null(dls);
    cf_learner *a = learner(dls, 3, NULL);
    assert_int_equal(cycle(a, 1, 2, NULL, 0, NULL), CF_OK);
    assert_int_equal(a->data_epochs, 1);
    assert_int_equal(cycle(a, 2, 2, NULL, 0, NULL), CF_OK);
    assert_int_equal(a->data_epochs, 3);
    size_t n = cf_learner_export_state(a, NULL, 0);
    void *bytes = malloc(n);
    assert_non_null(bytes);
    cf_learner_export_state(a, bytes, n);
    cf_learner *b = learner(dls, 4, NULL);
    assert_int_equal(cf_learner_import_state(b, bytes, n), CF_OK);
    assert_int_equal(b->data_epochs, 3);
    /* a version-1 state (before the count: the same bytes without it) still reads, as count 0 */
    uint32_t v1 = 1;
    memcpy((char *)bytes + 4, &v1, sizeof v1);
    assert_int_equal(cf_learner_import_state(b, bytes, n - 8), CF_OK);
    assert_int_equal(b->data_epochs, 0);
    uint32_t v3 = 3;
    memcpy((char *)bytes + 4, &v3, sizeof v3);
    assert_int_not_equal(cf_learner_import_state(b, bytes, n), CF_OK);
    free(bytes);
    cf_learner_free(a);
    cf_learner_free(b);
    cf_dls_free(dls);
}

/* A first fit, then a second stopped at several batches and resumed in a new learner (whose
 * count starts at 0): each ends as the two fits that never stopped. */
static void run_resume(int workers) {
    oracle dir;
    oracle_init(&dir);
    cf_dls *dls = resume_dls(&aug);
    assert_non_null(dls);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/second.ckpt", dir.dir);
    const int E1 = 1, E2 = RESUME_N_EPOCH;

    cf_learner *full = learner(dls, 3, dir.dir);
    assert_int_equal(cycle(full, E1, workers, NULL, 0, NULL), CF_OK);
    cf_callback *cbs0[] = {cf_checkpoint_cb(.fname = ckpt)};
    assert_int_equal(cycle(full, E2, workers, cbs0, 1, NULL), CF_OK);
    assert_int_equal(full->data_epochs, E1 + E2);
    int64_t per_epoch = full->recorder.n_batches / E2;

    int64_t stops[] = {1, per_epoch + per_epoch / 2};
    for (size_t k = 0; k < sizeof stops / sizeof *stops; k++) {
        char what[96];
        snprintf(what, sizeof what, "%d workers, second fit stopped after batch %lld", workers,
                 (long long)stops[k]);
        cf_learner *stopped = learner(dls, 3, dir.dir);
        assert_int_equal(cycle(stopped, E1, workers, NULL, 0, NULL), CF_OK);
        cf_callback *cbs1[] = {resume_request_cb(stops[k]), cf_checkpoint_cb(.fname = ckpt)};
        cf_status st = cycle(stopped, E2, workers, cbs1, 2, NULL);
        if (st != (workers ? CF_ERR_WORKER : CF_ERR_INTERRUPTED))
            fail_msg("%s: status %d: %s", what, st, cf_last_error());
        cf_learner_free(stopped);

        cf_learner *resumed = learner(dls, 1000 + k, dir.dir);
        assert_int_equal(resumed->data_epochs, 0);
        cf_callback *cbs2[] = {resume_request_cb(-1), cf_checkpoint_cb(.fname = ckpt)};
        st = cycle(resumed, E2, workers, cbs2, 2, ckpt);
        if (st != CF_OK) fail_msg("%s: resume failed: %s", what, cf_last_error());
        assert_int_equal(resumed->data_epochs, E1 + E2);
        assert_same_fit(full, resumed, what);
        cf_learner_free(resumed);
    }
    cf_learner_free(full);
    cf_dls_free(dls);
    oracle_cleanup(&dir);
}

static void test_resume_in_process(void **state) {
    (void)state;
    run_resume(0);
}

static void test_resume_fork_2(void **state) {
    (void)state;
    run_resume(2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_fit_draws_fresh),
        cmocka_unit_test(test_count_comes_home),
        cmocka_unit_test(test_resume_in_process),
        cmocka_unit_test(test_resume_fork_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
