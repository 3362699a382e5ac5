/* In-place recovery of fork workers (.par.max_restarts): a fit whose worker is SIGKILLed or
 * SIGSTOPped at a random batch ends with bitwise the weights, BatchNorm buffers, optimizer
 * state and Recorder of the undisturbed fit, at 2 and 3 workers; the restart is reported; after
 * max_restarts restarts the next fault ends the call as without recovery, the learner
 * untouched; no process or file descriptor is left behind.
 *
 * The fault comes from a callback that stops its own process at a chosen rank, epoch and batch
 * while a flag in shared memory (set by the test, cleared by the first shot) says to. The seed
 * of the random positions is printed (CF_TEST_SEED repeats a run). */
#include "learn_fixture.h"
#include "same_fit.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corefit/par.h"
#include "par_time.h"

enum { N_EPOCH = 3 };

/* ---- the fault ---------------------------------------------------------------------------- */

typedef struct shot {
    _Atomic int shots_left; /* faults still to cause (one per attempt) */
    int rank, epoch, batch, sig;
    /* rank 0 of the latest group, and the training iteration it began at. The latest group, not
     * "a later one than the first": a fault at the first batch may come before the first
     * group's rank 0 has run any batch, and then the only group rank 0 is seen in is the
     * restarted one. */
    _Atomic int group_pid;
    _Atomic long long resumed_at;
} shot;

static shot *shared_shot(void) {
    shot *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(s != MAP_FAILED);
    memset(s, 0, sizeof *s);
    atomic_store(&s->resumed_at, -1);
    return s;
}

static cf_status fault_before_batch(cf_callback *cb, cf_learner *learn) {
    shot *s = cb->state;
    if (learn->training && learn->replica.rank == 0) {
        int pid = (int)getpid();
        if (atomic_exchange(&s->group_pid, pid) != pid)
            atomic_store(&s->resumed_at, (long long)(learn->epoch * learn->n_iter + learn->iter));
    }
    if (!learn->training || learn->replica.rank != s->rank || learn->epoch != s->epoch ||
        learn->iter != s->batch)
        return CF_OK;
    if (atomic_load(&s->shots_left) <= 0) return CF_OK;
    atomic_fetch_sub(&s->shots_left, 1);
    raise(s->sig);
    return CF_OK;
}

static void free_plain(cf_callback *cb) {
    free(cb);
}

static cf_callback *fault_cb(shot *s) {
    cf_callback *cb = calloc(1, sizeof *cb);
    cb->name = "Fault";
    cb->state = s;
    cb->free = free_plain;
    cb->on[CF_EV_BEFORE_BATCH] = fault_before_batch;
    return cb;
}

/* ---- the fit ------------------------------------------------------------------------------ */

/* Linear -> BatchNorm1d -> ReLU -> Dropout -> Linear: weights, buffers, optimizer state and
 * dropout masks that a restart must reproduce. */
static cf_learner *learner(cf_dls *dls, bool quiet) {
    cf_module *layers[] = {cf_linear(4, 16, true), cf_batchnorm1d(16), cf_relu(), cf_dropout(0.3f),
                           cf_linear(16, 3, true)};
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(5, layers), 5), CF_OK);
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    assert_int_equal(cf_learner_new(&learn, dls, m, .quiet = quiet, .metrics = metrics,
                                    .n_metrics = 1, .wd = 0.05),
                     CF_OK);
    return learn;
}

enum { COMMIT_EVERY = 5 };

static cf_status fit(cf_learner *learn, int world, int max_restarts, double deadline_s, shot *s) {
    cf_callback *cbs[1] = {s ? fault_cb(s) : NULL};
    return cf_par_fit_one_cycle(learn, N_EPOCH, .lr_max = CF_LR(2e-2), .cbs = cbs,
                                .n_cbs = s ? 1 : 0,
                                .par = {.num_cores = world,
                                        .max_restarts = max_restarts,
                                        .commit_every = COMMIT_EVERY,
                                        .deadline_s = deadline_s});
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* No worker, no open file, no commit directory of this process in shared memory. */
static void assert_nothing_left(int fds_before) {
    errno = 0;
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
    assert_int_equal(open_fds(), fds_before);
    char mine[64];
    snprintf(mine, sizeof mine, "corefit-commit-%ld-", (long)getpid());
    const char *tmp = getenv("TMPDIR");
    const char *dirs[] = {"/dev/shm", tmp && *tmp ? tmp : "/tmp"};
    for (int i = 0; i < 2; i++) {
        DIR *d = opendir(dirs[i]);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d)))
            if (!strncmp(e->d_name, mine, strlen(mine)))
                fail_msg("%s/%s is left behind", dirs[i], e->d_name);
        closedir(d);
    }
}

static uint64_t test_seed(void) {
    const char *env = getenv("CF_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    print_message("recovery positions from seed %llu (CF_TEST_SEED=%llu repeats them)\n",
                  (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

static uint64_t next(uint64_t *x) { /* splitmix64 */
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One fault of kind sig at a random rank and batch of epoch (or a random epoch when < 0). */
static void recover_once(int world, int sig, int epoch, uint64_t *rng) {
    cf_dls *dls = fixture_dls(192, 40, 8);
    cf_learner *ref = learner(dls, true);
    assert_int_equal(fit(ref, world, 0, 0, NULL), CF_OK);
    int64_t per_epoch = ref->recorder.n_batches / N_EPOCH;

    shot *s = shared_shot();
    s->rank = (int)(next(rng) % (uint64_t)world);
    s->epoch = epoch >= 0 ? epoch : (int)(next(rng) % N_EPOCH);
    s->batch = (int)(next(rng) % (uint64_t)per_epoch);
    s->sig = sig;
    atomic_store(&s->shots_left, 1);
    char what[128];
    snprintf(what, sizeof what, "%d workers, %s of worker %d at epoch %d batch %d", world,
             sig == SIGKILL ? "SIGKILL" : "SIGSTOP", s->rank, s->epoch, s->batch);
    print_message("%s\n", what);

    int fds = open_fds();
    cf_learner *hit = learner(dls, true);
    /* a stopped worker is found by the deadline; under load a busy one may be too (another
     * restart, the same result), so the bound is a liveness one */
    double deadline = sig == SIGSTOP ? 2.0 * par_time_scale() : 0;
    cf_status st = fit(hit, world, 3, deadline, s);
    if (st != CF_OK) fail_msg("%s: %s", what, cf_last_error());
    assert_int_equal(atomic_load(&s->shots_left), 0);
    assert_true(cf_par_last_restarts() >= 1);
    /* the fresh group began at the last commit before the fault (every COMMIT_EVERY training
     * iterations), not at the beginning */
    long long at = (long long)s->epoch * per_epoch + s->batch;
    if (cf_par_last_restarts() == 1)
        assert_int_equal(atomic_load(&s->resumed_at), at / COMMIT_EVERY * COMMIT_EVERY);
    assert_same_fit(hit, ref, what);
    assert_nothing_left(fds);

    cf_learner_free(hit);
    cf_learner_free(ref);
    munmap(s, sizeof *s);
    cf_dls_free(dls);
}

static void test_sigkill_2_workers(void **state) {
    (void)state;
    uint64_t rng = test_seed();
    recover_once(2, SIGKILL, 1 + (int)(next(&rng) % (N_EPOCH - 1)), &rng); /* from a commit */
    recover_once(2, SIGKILL, 0, &rng); /* before the first commit: from the beginning */
}

static void test_sigkill_3_workers(void **state) {
    (void)state;
    uint64_t rng = test_seed() + 1;
    recover_once(3, SIGKILL, -1, &rng);
}

static void test_sigstop_2_workers(void **state) {
    (void)state;
    uint64_t rng = test_seed() + 2;
    recover_once(2, SIGSTOP, 1 + (int)(next(&rng) % (N_EPOCH - 1)), &rng);
}

static void test_sigstop_3_workers(void **state) {
    (void)state;
    uint64_t rng = test_seed() + 3;
    recover_once(3, SIGSTOP, -1, &rng);
}

/* Recovery costs nothing in the result when nothing goes wrong (the commits change no state). */
static void test_commits_change_nothing(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(192, 40, 8);
    cf_learner *ref = learner(dls, true), *with = learner(dls, true);
    assert_int_equal(fit(ref, 2, 0, 0, NULL), CF_OK);
    assert_int_equal(fit(with, 2, 2, 0, NULL), CF_OK);
    assert_int_equal(cf_par_last_restarts(), 0);
    assert_same_fit(with, ref, "2 workers, no fault");
    cf_learner_free(with);
    cf_learner_free(ref);
    cf_dls_free(dls);
}

/* fine_tune: its unfrozen phase commits and resumes (the frozen one runs no call callbacks, so
 * the fault comes in the unfrozen phase). */
static void test_fine_tune_sigkill(void **state) {
    (void)state;
    uint64_t rng = test_seed() + 4;
    cf_dls *dls = fixture_dls(192, 40, 8);
    cf_learner *ref = NULL, *hit = NULL;
    cf_metric *m1[] = {cf_accuracy()}, *m2[] = {cf_accuracy()};
    assert_int_equal(cf_learner_new(&ref, dls, fixture_model(9, true), .quiet = true, .metrics = m1,
                                    .n_metrics = 1),
                     CF_OK);
    assert_int_equal(cf_learner_new(&hit, dls, fixture_model(9, true), .quiet = true, .metrics = m2,
                                    .n_metrics = 1),
                     CF_OK);
    assert_int_equal(cf_par_fine_tune(ref, 2, .base_lr = 1e-2, .par.num_cores = 2), CF_OK);
    shot *s = shared_shot();
    *s = (shot){
        .rank = (int)(next(&rng) % 2), .epoch = 1, .batch = (int)(next(&rng) % 12), .sig = SIGKILL};
    atomic_store(&s->resumed_at, -1);
    atomic_store(&s->shots_left, 1);
    cf_callback *cbs[] = {fault_cb(s)};
    cf_status st =
        cf_par_fine_tune(hit, 2, .base_lr = 1e-2, .cbs = cbs, .n_cbs = 1,
                         .par = {.num_cores = 2, .max_restarts = 2, .commit_every = COMMIT_EVERY});
    if (st != CF_OK) fail_msg("fine_tune: %s", cf_last_error());
    assert_int_equal(atomic_load(&s->shots_left), 0);
    assert_int_equal(cf_par_last_restarts(), 1);
    long long at = 12 + s->batch;
    assert_int_equal(atomic_load(&s->resumed_at), at / COMMIT_EVERY * COMMIT_EVERY);
    assert_same_fit(hit, ref, "fine_tune, SIGKILL in the unfrozen phase");
    munmap(s, sizeof *s);
    cf_learner_free(hit);
    cf_learner_free(ref);
    cf_dls_free(dls);
}

/* The display says what happened and where the group carries on from. */
static void test_restart_is_reported(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(192, 40, 8);
    cf_learner *learn = learner(dls, false);
    shot *s = shared_shot();
    *s = (shot){.rank = 1, .epoch = 1, .batch = 5, .sig = SIGKILL};
    atomic_store(&s->shots_left, 1);
    fflush(stderr);
    FILE *err = tmpfile();
    int saved = dup(2);
    dup2(fileno(err), 2);
    cf_status st = fit(learn, 2, 3, 0, s);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_int_equal(st, CF_OK);
    char text[4096] = "";
    rewind(err);
    size_t n = fread(text, 1, sizeof text - 1, err);
    text[n] = '\0';
    fclose(err);
    /* 12 batches an epoch: the last commit before batch 5 of epoch 1 (iteration 18) was made
     * after iteration 15, so the group carries on at epoch 1 batch 3 */
    const char *want = "worker 1 was killed by signal 9 (SIGKILL) at epoch 1 batch 5; restarting "
                       "2 workers from epoch 1 batch 3 (restart 1 of 3)";
    if (!strstr(text, want)) fail_msg("stderr lacks \"%s\":\n%s", want, text);
    munmap(s, sizeof *s);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* max_restarts + 1 faults: the call fails as without recovery and the learner is untouched. */
static void test_too_many_faults(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(192, 40, 8);
    cf_learner *learn = learner(dls, true);
    size_t before_n = cf_learner_export_state(learn, NULL, 0);
    void *before = malloc(before_n), *after = malloc(before_n);
    cf_learner_export_state(learn, before, before_n);
    shot *s = shared_shot();
    *s = (shot){.rank = 0, .epoch = 1, .batch = 2, .sig = SIGKILL};
    atomic_store(&s->shots_left, 3);
    int fds = open_fds();
    cf_status st = fit(learn, 2, 2, 0, s);
    assert_int_equal(st, CF_ERR_WORKER);
    if (!strstr(cf_last_error(), "worker 0 was killed by signal 9 (SIGKILL)"))
        fail_msg("unexpected error: %s", cf_last_error());
    assert_int_equal(atomic_load(&s->shots_left), 0);
    assert_int_equal(cf_par_last_restarts(), 2);
    assert_int_equal(cf_learner_export_state(learn, NULL, 0), before_n);
    cf_learner_export_state(learn, after, before_n);
    assert_memory_equal(before, after, before_n);
    assert_nothing_left(fds);
    free(before);
    free(after);
    munmap(s, sizeof *s);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* A worker's own error is not a lost worker: it would only repeat, so it is not retried. */
static cf_status fail_at_epoch_1(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (learn->epoch == 1 && learn->replica.rank == 1)
        return cf_fail(CF_ERR_INVALID, "bad batch on purpose");
    return CF_OK;
}

static void test_errors_are_not_retried(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(192, 40, 8);
    cf_learner *learn = learner(dls, true);
    cf_callback *cb = calloc(1, sizeof *cb);
    cb->name = "Fails";
    cb->free = free_plain;
    cb->on[CF_EV_BEFORE_EPOCH] = fail_at_epoch_1;
    cf_callback *cbs[] = {cb};
    cf_status st = cf_par_fit_one_cycle(learn, N_EPOCH, .lr_max = CF_LR(2e-2), .cbs = cbs,
                                        .n_cbs = 1, .par = {.num_cores = 2, .max_restarts = 3});
    assert_int_equal(st, CF_ERR_WORKER);
    if (!strstr(cf_last_error(), "bad batch on purpose"))
        fail_msg("unexpected error: %s", cf_last_error());
    assert_int_equal(cf_par_last_restarts(), 0);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commits_change_nothing), cmocka_unit_test(test_sigkill_2_workers),
        cmocka_unit_test(test_sigkill_3_workers),      cmocka_unit_test(test_sigstop_2_workers),
        cmocka_unit_test(test_sigstop_3_workers),      cmocka_unit_test(test_fine_tune_sigkill),
        cmocka_unit_test(test_restart_is_reported),    cmocka_unit_test(test_too_many_faults),
        cmocka_unit_test(test_errors_are_not_retried),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
