/* The fork runner: the caller supervises num_cores forked workers (cf_launch_fork), rank 0
 * writes what comes home into a results file, and the caller reads it into its learner only
 * when every worker succeeded. With .par.max_restarts, a group that lost a worker is forked
 * again from the last commit every replica holds (recover.c), up to max_restarts times.
 *
 * The results file is an anonymous in-memory file (memfd) made before the fork: rank 0 sizes
 * it to exactly what it writes (one pass to measure, one to write), so nothing is reserved up
 * front and the cost in memory is what comes home. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "par/par_internal.h"
#include "par/twin.h"

typedef struct worker_ctx {
    cf_learner *learn;
    const cf__par_method *method;
    const cf_fit_common *common;
    int results_fd;
    cf__par_recovery recovery;
} worker_ctx;

static _Thread_local int last_restarts;

int cf_par_last_restarts(void) {
    return last_restarts;
}

/* Rank 0: the envelope into the results file. */
static cf_status write_results(int fd, const cf_learner *learn, const cf__par_method *method,
                               cf_status outcome, const char *msg) {
    size_t need = cf__par_home_write(learn, method, outcome, msg, NULL, 0);
    if (ftruncate(fd, (off_t)need) != 0)
        return cf_fail(CF_ERR_NOMEM, "results: cannot size the results file to %zu bytes: %s", need,
                       strerror(errno));
    void *map = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return cf_fail(CF_ERR_NOMEM, "results: cannot map %zu bytes: %s", need, strerror(errno));
    size_t wrote = cf__par_home_write(learn, method, outcome, msg, map, need);
    /* A full memory file shows up as SIGBUS on the stores above, which the supervisor reports
     * with the rank; msync makes the pages the caller's before this worker reports success. */
    int rc = msync(map, need, MS_SYNC);
    munmap(map, need);
    if (wrote != need)
        return cf_fail(CF_ERR_STATE, "results: %zu bytes written, %zu measured", wrote, need);
    if (rc != 0) return cf_fail(CF_ERR_IO, "results: %s", strerror(errno));
    return CF_OK;
}

static cf_status worker_main(cf_comm *comm, void *vctx) {
    worker_ctx *w = vctx;
    /* A worker that crashes must die of it, whatever handlers the caller installed (a test
     * framework's, a crash reporter's): the supervisor then reports the signal. */
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++) signal(fatal[i], SIG_DFL);
    void *opts = cf__par_copy_opts(w->method);
    if (!opts) return CF_ERR_NOMEM;
    cf_status st = cf__par_run_replica(w->learn, comm, w->method, opts, w->common->par.master_cbs,
                                       w->common->par.n_master_cbs, &w->recovery);
    cf_free(opts);
    /* A fit that every replica stopped alike on a non-finite loss (TerminateOnNaN agrees across
     * replicas) brings its last good state home, with the error. */
    cf_status outcome = CF_OK;
    char outcome_msg[1024] = "";
    if (st == CF_ERR_NONFINITE) {
        outcome = st;
        snprintf(outcome_msg, sizeof outcome_msg, "%s", cf_last_error());
        st = CF_OK;
    }
    if (st == CF_OK && cf_comm_rank(comm) == 0)
        st = write_results(w->results_fd, w->learn, w->method, outcome, outcome_msg);
    if (st == CF_OK) st = cf_comm_barrier(comm);
    return st;
}

static int results_file(void) {
    int fd = memfd_create("corefit-results", MFD_CLOEXEC);
    if (fd >= 0) return fd;
    FILE *f = tmpfile(); /* kernels without memfd */
    if (!f) return -1;
    fd = dup(fileno(f));
    fclose(f);
    return fd;
}

/* The caller: reads what rank 0 wrote. */
static cf_status read_results(int fd, cf_learner *learn, const cf__par_method *method) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) return cf_fail(CF_ERR_IO, "results: %s", strerror(errno));
    size_t size = (size_t)sb.st_size;
    if (size == 0) return cf_fail(CF_ERR_WORKER, "no results came home");
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return cf_fail(CF_ERR_NOMEM, "results: cannot map %zu bytes: %s", size, strerror(errno));
    cf_status st = cf__par_home_read(learn, method, map, size);
    munmap(map, size);
    return st;
}

/* Faults that a fresh group may not meet again: a lost worker (killed, crashed, gone, silent).
 * A worker's own error (bad data, a non-finite loss) or Ctrl-C would only repeat. */
static bool retryable(cf__fault_kind kind) {
    return kind == CF_FAULT_KILLED || kind == CF_FAULT_HUNG || kind == CF_FAULT_EXITED;
}

/* "worker 1 was killed by signal 9 (SIGKILL) at epoch 0 batch 37; restarting 2 workers from
 * epoch 0 batch 32 (restart 1 of 3)" */
static void say_restart(const cf__commit_area *area, cf__launch_fault fault, const char *what,
                        int n, int restart, int max) {
    char where[96] = "", from[96] = "the beginning";
    int64_t epoch, batch;
    if (cf__commit_position(area, fault.rank, &epoch, &batch))
        snprintf(where, sizeof where, " at epoch %lld batch %lld", (long long)epoch,
                 (long long)batch);
    if (cf__commit_latest(area, &epoch, &batch))
        snprintf(from, sizeof from, "epoch %lld batch %lld", (long long)epoch, (long long)batch);
    fprintf(stderr, "%s%s; restarting %d workers from %s (restart %d of %d)\n", what, where, n,
            from, restart, max);
    fflush(stderr);
}

/* The staging slot of the gradient all-reduce: the launcher's default (512 KiB, the fastest
 * for a few million floats, whose chunks stay in L2) unless the parameter vector is large. A
 * large one (W4's language model: 25 M floats, 100 MB) in 8 MiB chunks takes 26 barriers a step
 * instead of 382, and on a busy machine each barrier can wait for a peer's time slice
 * (bench/bench_grad_reduce: 2 workers, 100 MB, load 21 on 2 cores: 0.40 s and 54 CPU-ms a
 * reduction against 1.5 s and 118 CPU-ms). The slots' pages cost memory only once written:
 * 3 x 8 MiB of shared memory at 2 workers. */
static size_t fit_comm_bytes(const cf_learner *learn) {
    const size_t big = (size_t)16 << 20, slot = (size_t)8 << 20;
    return learn && learn->model && learn->model->n_weights * sizeof(float) > big ? slot : 0;
}

cf_status cf__par_run_fork(cf_learner *learn, const cf__par_method *method,
                           const cf_fit_common *common) {
    const cf_par_opts *par = &common->par;
    last_restarts = 0;
    if (par->max_restarts < 0 || par->commit_every < 0) {
        cf__par_free_call_cbs(common);
        return cf_fail(CF_ERR_INVALID, "max_restarts %d and commit_every %d must be >= 0",
                       par->max_restarts, par->commit_every);
    }
    int fd = results_file();
    if (fd < 0) {
        cf__par_free_call_cbs(common);
        return cf_fail(CF_ERR_NOMEM, "cannot create the results file: %s", strerror(errno));
    }
    int n = par->num_cores ? par->num_cores : cf_available_cores();
    worker_ctx w = {learn, method, common, fd, {NULL, false, method->resumable}};
    cf_status st = CF_OK;
    if (par->max_restarts > 0 && n >= 1 && n <= 256)
        st = cf__commit_area_new(n, par->commit_every ? par->commit_every : CF_PAR_COMMIT_EVERY,
                                 &w.recovery.area);
    cf_launch_options lo = {.num_workers = par->num_cores,
                            .deadline_s = par->deadline_s > 0 ? par->deadline_s : 120,
                            .pin_cores = true,
                            .comm_bytes = fit_comm_bytes(learn)};
    for (int restart = 0; st == CF_OK; restart++) {
        st = cf_launch_fork(&lo, worker_main, &w, NULL);
        cf__launch_fault fault = cf__launch_last_fault();
        if (st == CF_OK || !w.recovery.area || restart >= par->max_restarts ||
            !retryable(fault.kind))
            break;
        char what[1024];
        snprintf(what, sizeof what, "%s", cf_last_error());
        /* A fresh group: an empty results file, the last commit (if any). */
        if (ftruncate(fd, 0) != 0) break;
        int64_t epoch, batch;
        w.recovery.resume = cf__commit_latest(w.recovery.area, &epoch, &batch);
        if (!learn->quiet)
            say_restart(w.recovery.area, fault, what, n, restart + 1, par->max_restarts);
        cf__commit_forget_positions(w.recovery.area);
        last_restarts = restart + 1;
        st = CF_OK;
    }
    cf__commit_area_free(w.recovery.area);
    /* The workers took over copies of the call's callbacks; the caller's copies go now. */
    cf__par_free_call_cbs(common);
    if (st == CF_OK) st = read_results(fd, learn, method);
    close(fd);
    return st;
}
