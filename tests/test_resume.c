/* Resuming a fit from a checkpoint: SaveModel(every_epoch, with_opt) writes one checkpoint per
 * epoch (weights, BatchNorm buffers, optimizer state); a new learner that loads the checkpoint of
 * epoch k-1 and runs the same fit_one_cycle with .start_epoch = k (fastai's SkipToEpoch) ends
 * with bitwise the same weights, buffers and optimizer state as the uninterrupted run: the data
 * order of each epoch is a function of seed + epoch, and the schedule position of start_epoch.
 *
 * This is resuming from model files at epoch ends; tests/test_resume_exact.c resumes from
 * checkpoints taken at any batch (cf_checkpoint_cb, .resume), with dropout and augmentation. */
#include "learn_fixture.h"
#include "same_fit.h"

#include <stdio.h>
#include <string.h>

#include "corefit/par.h"

enum { N_EPOCH = 4 };

/* Linear -> BatchNorm1d -> ReLU -> Linear: weights, buffers and a counter in the checkpoint. */
static cf_model *bn_model(uint64_t seed) {
    cf_module *layers[] = {cf_linear(4, 16, true), cf_batchnorm1d(16), cf_relu(),
                           cf_linear(16, 3, true)};
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(4, layers), seed), CF_OK);
    return m;
}

static cf_learner *learner(cf_dls *dls, uint64_t seed, const char *path) {
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    assert_int_equal(cf_learner_new(&learn, dls, bn_model(seed), .quiet = true, .path = path,
                                    .metrics = metrics, .n_metrics = 1, .wd = 0.05),
                     CF_OK);
    return learn;
}

static void run_resume(bool parallel) {
    oracle dir;
    oracle_init(&dir);
    cf_dls *dls = fixture_dls(96, 32, 8);
    cf_one_cycle_opts o = {.lr_max = CF_LR(2e-2)};

    /* The uninterrupted run, checkpointing every epoch. */
    cf_learner *full = learner(dls, 3, dir.dir);
    cf_callback *save[] = {
        cf_save_model_cb(.fname = "ckpt", .every_epoch = true, .with_opt = true)};
    cf_one_cycle_opts fo = o;
    if (parallel) {
        fo.par = (cf_par_opts){.num_cores = 2, .master_cbs = save, .n_master_cbs = 1};
        assert_int_equal(cf_par_fit_one_cycle_(full, N_EPOCH, &fo), CF_OK);
    } else {
        fo.cbs = save, fo.n_cbs = 1;
        assert_int_equal(cf_fit_one_cycle_(full, N_EPOCH, &fo), CF_OK);
    }
    assert_int_equal(full->recorder.n_epochs, N_EPOCH);

    for (int k = 1; k < N_EPOCH; k++) {
        /* A new learner (other initial weights) resumes from the checkpoint of epoch k-1. */
        cf_learner *resumed = learner(dls, 1000 + (uint64_t)k, dir.dir);
        char name[32];
        snprintf(name, sizeof name, "ckpt_%d", k - 1);
        assert_int_equal(cf_learner_load(resumed, name, true), CF_OK);
        cf_one_cycle_opts ro = o;
        ro.start_epoch = k;
        if (parallel) {
            ro.par.num_cores = 2;
            assert_int_equal(cf_par_fit_one_cycle_(resumed, N_EPOCH, &ro), CF_OK);
        } else {
            assert_int_equal(cf_fit_one_cycle_(resumed, N_EPOCH, &ro), CF_OK);
        }
        char what[64];
        snprintf(what, sizeof what, "%s resume at epoch %d", parallel ? "parallel" : "single", k);
        assert_same_model_state(full, resumed, what);
        /* the resumed run trained only epochs k.. */
        assert_int_equal(resumed->recorder.n_epochs, N_EPOCH);
        cf_learner_free(resumed);
    }

    /* Resuming without the optimizer state does not give the same weights (so the check above
     * does test that the state is restored). */
    cf_learner *cold = learner(dls, 2000, dir.dir);
    assert_int_equal(cf_learner_load(cold, "ckpt_1", false), CF_OK);
    cf_one_cycle_opts co = o;
    co.start_epoch = 2;
    if (parallel) co.par.num_cores = 2;
    assert_int_equal(parallel ? cf_par_fit_one_cycle_(cold, N_EPOCH, &co)
                              : cf_fit_one_cycle_(cold, N_EPOCH, &co),
                     CF_OK);
    assert_true(memcmp(cold->model->weights, full->model->weights,
                       full->model->n_weights * sizeof(float)) != 0);
    cf_learner_free(cold);

    cf_learner_free(full);
    cf_dls_free(dls);
    oracle_cleanup(&dir);
}

static void test_resume_single_process(void **state) {
    (void)state;
    run_resume(false);
}

static void test_resume_parallel(void **state) {
    (void)state;
    run_resume(true);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_single_process),
        cmocka_unit_test(test_resume_parallel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
