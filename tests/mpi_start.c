/* start_method mpi without mpirun: a world of one (an MPI singleton) that trains like one
 * process; auto picks fork; a num_cores that contradicts the world is refused. In a build
 * without MPI: a clear CF_ERR_UNSUPPORTED, and the call's callbacks are freed. */
#include "learn_fixture.h"

#include <string.h>

#include "corefit/par.h"

static cf_learner *make_learner(cf_dls *dls, uint64_t seed) {
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(seed, false), .quiet = true), CF_OK);
    return learn;
}

static int freed;
static void count_free(cf_callback *cb) {
    (void)cb;
    freed++;
}

#ifdef CF_HAVE_MPI

static void test_singleton_world_trains_like_one_process(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(96, 20, 8);
    cf_learner *mpi = make_learner(dls, 5), *one = make_learner(dls, 5);
    assert_int_equal(cf_par_fit_one_cycle(mpi, 2, .par.start_method = CF_START_MPI), CF_OK);
    assert_int_equal(cf_fit_one_cycle(one, 2), CF_OK);
    assert_rel_err_within("weights against one process", mpi->model->weights, one->model->weights,
                          one->model->n_weights, 1e-3, 1e-6);
    assert_int_equal(mpi->recorder.n_epochs, 2);
    cf_comm *comm = NULL;
    assert_int_equal(cf_par_mpi_comm(&comm), CF_OK);
    assert_string_equal(cf_comm_kind(comm), "mpi");
    assert_int_equal(cf_comm_size(comm), 1);
    assert_int_equal(cf_comm_local_size(comm), 1);
    cf_preds p;
    assert_int_equal(cf_par_get_preds(mpi, &p, .par.start_method = CF_START_MPI), CF_OK);
    assert_int_equal(p.n, 20);
    cf_preds_free(&p);
    cf_learner_free(mpi);
    cf_learner_free(one);
    cf_dls_free(dls);
}

static void test_num_cores_must_match_the_world(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(32, 8, 8);
    cf_learner *learn = make_learner(dls, 5);
    freed = 0;
    cf_callback cb = {.name = "counted", .free = count_free};
    cf_callback *cbs[] = {&cb};
    assert_int_equal(cf_par_fit(learn, 1, .cbs = cbs, .n_cbs = 1,
                                .par = {.start_method = CF_START_MPI, .num_cores = 3}),
                     CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "num_cores is 3 but the MPI world has 1 ranks"));
    assert_int_equal(freed, 1);
    /* the world is still usable */
    assert_int_equal(cf_par_fit(learn, 1, .par.start_method = CF_START_MPI), CF_OK);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

#else

static void test_without_mpi_is_a_clear_error(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(32, 8, 8);
    cf_learner *learn = make_learner(dls, 5);
    freed = 0;
    cf_callback cb = {.name = "counted", .free = count_free};
    cf_callback *cbs[] = {&cb};
    assert_int_equal(cf_par_fit(learn, 1, .cbs = cbs, .n_cbs = 1, .par.start_method = CF_START_MPI),
                     CF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cf_last_error(), "built without MPI"));
    assert_int_equal(freed, 1);
    cf_comm *comm = (cf_comm *)1;
    assert_int_equal(cf_par_mpi_comm(&comm), CF_ERR_UNSUPPORTED);
    assert_null(comm);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

#endif

/* Not started by mpirun: auto is fork (deterministic, so bitwise equal to fork). */
static void test_auto_without_mpirun_is_fork(void **state) {
    (void)state;
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE")) skip();
    cf_dls *dls = fixture_dls(96, 20, 8);
    cf_learner *a = make_learner(dls, 9), *f = make_learner(dls, 9);
    assert_int_equal(cf_par_fit(a, 1, .par = {.start_method = CF_START_AUTO, .num_cores = 2}),
                     CF_OK);
    assert_int_equal(cf_par_fit(f, 1, .par = {.start_method = CF_START_FORK, .num_cores = 2}),
                     CF_OK);
    assert_memory_equal(a->model->weights, f->model->weights, f->model->n_weights * sizeof(float));
    cf_learner_free(a);
    cf_learner_free(f);
    cf_dls_free(dls);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
#ifdef CF_HAVE_MPI
        cmocka_unit_test(test_singleton_world_trains_like_one_process),
        cmocka_unit_test(test_num_cores_must_match_the_world),
#else
        cmocka_unit_test(test_without_mpi_is_a_clear_error),
#endif
        cmocka_unit_test(test_auto_without_mpirun_is_fork),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
