/* What the fork supervisor keeps resident while its workers fit, and what the results cost it
 * when they come home: a model with a large Adam state (8.4 M weights: 34 MB of weights, as
 * much of gradients, twice that of optimizer state), its resident memory read from rank 0 (by
 * the supervisor's pid) in the middle of the fit, and its peak over the call. Everything still
 * comes home bitwise, and a lost group leaves the caller's learner as it was. */
#include "learn_fixture.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "corefit/par.h"

#define HIDDEN 2048
#define WIDE 4096

/* Linear(4, 2048) -> ReLU -> Linear(2048, 4096) -> ReLU -> Linear(4096, 3) */
static cf_learner *big_learner(cf_dls *dls) {
    cf_module *layers[] = {cf_linear(4, HIDDEN, true), cf_relu(), cf_linear(HIDDEN, WIDE, true),
                           cf_relu(), cf_linear(WIDE, 3, true)};
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(5, layers), 5), CF_OK);
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, m, .quiet = true), CF_OK);
    return learn;
}

/* VmRSS or VmHWM of a process, in bytes. */
static double status_bytes(pid_t pid, const char *key) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    double kb = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') kb = atof(line + n + 1);
    fclose(f);
    return kb * 1024;
}

/* Resets this process's VmHWM to its current resident set (Linux 4.0 and later). */
static bool reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* Shared with the workers (mapped before the call): what rank 0 saw of the supervisor. */
typedef struct probe {
    pid_t supervisor;
    double resident; /* the supervisor's VmRSS at the probe's batch (bytes) */
    int kill_at;     /* > 0: rank 0 kills itself at that training batch, after the probe */
} probe;

static probe *shared_probe;

static cf_status probe_batch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (!learn->training || learn->replica.rank != 0 || learn->train_iter != 2) return CF_OK;
    shared_probe->resident = status_bytes(shared_probe->supervisor, "VmRSS");
    if (shared_probe->kill_at > 0) raise(SIGKILL);
    return CF_OK;
}

static cf_callback *probe_cb(void) {
    cf_callback *cb = cf_callback_new("MemoryProbe", 0, 0);
    assert_non_null(cb);
    cb->on[CF_EV_AFTER_BATCH] = probe_batch;
    return cb;
}

static void test_supervisor_memory_and_bitwise_home(void **state) {
    (void)state;
    shared_probe =
        mmap(NULL, sizeof *shared_probe, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(shared_probe != MAP_FAILED);
    shared_probe->supervisor = getpid();
    cf_dls *dls = fixture_dls(96, 24, 12);

    /* the reference: the same call without a probe */
    cf_learner *ref = big_learner(dls);
    assert_int_equal(cf_par_fit(ref, 1, .lr = CF_LR(1e-3), .par = {.num_cores = 2}), CF_OK);

    cf_learner *learn = big_learner(dls);
    const double w = (double)learn->model->n_weights * sizeof(float);
    assert_true(w > 30e6);
    /* the gradients made resident before the fit, as a fit in this process leaves them (they
     * are allocated as untouched zero pages, cf_calloc mapping large blocks) */
    memset(learn->model->grads, 0, (size_t)w);
    double before = status_bytes(getpid(), "VmRSS");
    assert_true(reset_peak());
    cf_callback *cbs[] = {probe_cb()};
    cf_status st =
        cf_par_fit(learn, 1, .lr = CF_LR(1e-3), .cbs = cbs, .n_cbs = 1, .par = {.num_cores = 2});
    if (st != CF_OK) fail_msg("%s", cf_last_error());
    double peak = status_bytes(getpid(), "VmHWM");
    /* during the fit the supervisor gave its (zero) gradients back */
    print_message("supervisor: %.1f MB before, %.1f MB during the fit, peak %.1f MB; weights "
                  "%.1f MB\n",
                  before / 1e6, shared_probe->resident / 1e6, peak / 1e6, w / 1e6);
    assert_true(shared_probe->resident > 0);
    assert_true(shared_probe->resident < before - 0.8 * w);
    /* Coming home: the new Adam state (2w) and its copy in the results (2w, given back once
     * copied), then the weights (w) after it: at most before - w + 4w; 5w and more when the
     * copy of the optimizer state stays resident with the rest. */
    assert_true(peak < before + 3.5 * w);
    /* bitwise what the same call brings home without the probe */
    assert_memory_equal(learn->model->weights, ref->model->weights, (size_t)w);
    assert_non_null(learn->opt);
    assert_memory_equal(learn->opt->sqr_avg, ref->opt->sqr_avg, (size_t)w);
    assert_memory_equal(learn->opt->grad_avg, ref->opt->grad_avg, (size_t)w);
    for (size_t i = 0; i < learn->model->n_weights; i++)
        if (learn->model->grads[i] != 0)
            fail_msg("gradient %zu is %g, not 0", i, learn->model->grads[i]);
    assert_int_equal(learn->recorder.n_batches, ref->recorder.n_batches);
    assert_memory_equal(learn->recorder.losses, ref->recorder.losses,
                        (size_t)ref->recorder.n_batches * sizeof *ref->recorder.losses);

    /* A lost group: the caller's learner (weights, optimizer state, gradients) as it was, and
     * the next call from it equals the same call on the reference. */
    size_t n = learn->model->n_weights;
    float *keep = malloc(3 * n * sizeof(float));
    assert_non_null(keep);
    memcpy(keep, learn->model->weights, n * sizeof(float));
    memcpy(keep + n, learn->opt->grad_avg, n * sizeof(float));
    memcpy(keep + 2 * n, learn->opt->sqr_avg, n * sizeof(float));
    shared_probe->kill_at = 2;
    shared_probe->resident = 0;
    cf_callback *kill_cbs[] = {probe_cb()};
    st = cf_par_fit(learn, 1, .lr = CF_LR(1e-3), .cbs = kill_cbs, .n_cbs = 1,
                    .par = {.num_cores = 2});
    assert_int_equal(st, CF_ERR_WORKER);
    assert_true(shared_probe->resident > 0);
    assert_memory_equal(learn->model->weights, keep, n * sizeof(float));
    assert_memory_equal(learn->opt->grad_avg, keep + n, n * sizeof(float));
    assert_memory_equal(learn->opt->sqr_avg, keep + 2 * n, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        if (learn->model->grads[i] != 0)
            fail_msg("gradient %zu is %g, not 0", i, learn->model->grads[i]);
    free(keep);
    assert_int_equal(cf_par_fit(learn, 1, .lr = CF_LR(1e-3), .par = {.num_cores = 2}), CF_OK);
    assert_int_equal(cf_par_fit(ref, 1, .lr = CF_LR(1e-3), .par = {.num_cores = 2}), CF_OK);
    assert_memory_equal(learn->model->weights, ref->model->weights, n * sizeof(float));
    assert_memory_equal(learn->opt->sqr_avg, ref->opt->sqr_avg, n * sizeof(float));

    cf_learner_free(learn);
    cf_learner_free(ref);
    cf_dls_free(dls);
    munmap(shared_probe, sizeof *shared_probe);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supervisor_memory_and_bitwise_home),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
