/* The fork runner: the caller supervises num_cores forked workers (cf_launch_fork), rank 0
 * writes what comes home into a results file, and the caller reads it into its learner only
 * when every worker succeeded. With .par.max_restarts, a group that lost a worker is forked
 * again from the last commit every replica holds (recover.c), up to max_restarts times.
 *
 * The results file is an anonymous in-memory file (memfd) made before the fork: rank 0 sizes
 * it to exactly what it writes (one pass to measure, one to write), so nothing is reserved up
 * front and the cost in memory is what comes home. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "core/pool.h"
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

/* Gives back every page of [p, p + bytes) (whole pages inside the range only): they read as
 * zeros afterwards. For memory nothing reads again. */
static void drop_pages(void *p, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) / page * page,
              hi = ((uintptr_t)p + bytes) / page * page;
    if (p && hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Gives back the pages of [p, p + bytes) that hold only zeros. Private anonymous memory comes
 * back zero-filled when next touched, so what the range reads does not change; only the
 * resident memory does. */
static void drop_zero_pages(void *p, size_t bytes) {
    static const unsigned char zeros[4096];
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!p || page > sizeof zeros) return;
    uintptr_t lo = ((uintptr_t)p + page - 1) / page * page,
              hi = ((uintptr_t)p + bytes) / page * page;
    uintptr_t run = 0; /* start of the current run of zero pages (0: none) */
    for (uintptr_t at = lo; at < hi; at += page) {
        bool zero = memcmp((const void *)at, zeros, page) == 0;
        if (zero && !run) run = at;
        if (!zero && run) {
            madvise((void *)run, at - run, MADV_DONTNEED);
            run = 0;
        }
    }
    if (run) madvise((void *)run, hi - run, MADV_DONTNEED);
}

/* Rank 0, once the method returned, before it writes what comes home: the gradients and the
 * activation memory are not part of it, and this process ends after the write, so their pages
 * go back first and the results file's pages take their place instead of adding to the peak. */
static void drop_fit_memory(cf_learner *learn) {
    cf_model *m = learn->model;
    if (!m) return;
    drop_pages(m->grads, m->n_weights * sizeof(float));
    drop_pages(m->arena.base, m->arena.capacity);
    drop_pages(m->arena.pool, m->arena.pool_capacity);
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
    if (st == CF_OK && cf_comm_rank(comm) == 0) {
        drop_fit_memory(w->learn);
        st = write_results(w->results_fd, w->learn, w->method, outcome, outcome_msg);
    }
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

/* The results file as the caller maps it. */
typedef struct results_view {
    int fd;
    const unsigned char *map;
} results_view;

/* The caller's import copied [p, p + n) of the mapped results file and will not read it again
 * (the optimizer state, two floats a weight with Adam): its whole pages leave the file (a hole
 * punched in the memory file frees them), before the rest is copied, so that the results and
 * the state they are copied into are not all resident together. A file system without holes
 * keeps them until the file is closed. */
static void free_consumed(const void *p, size_t n, void *ctx) {
    results_view *v = ctx;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t lo = ((size_t)((const unsigned char *)p - v->map) + page - 1) / page * page;
    size_t hi = ((size_t)((const unsigned char *)p - v->map) + n) / page * page;
    if (hi > lo)
        (void)fallocate(v->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)lo,
                        (off_t)(hi - lo));
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
    results_view view = {fd, map};
    cf_status st = cf__par_home_read_consuming(learn, method, map, size, free_consumed, &view);
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

/* CF_TIMING=1: the supervisor's resident memory at each stage of the call, on stderr (bench/
 * README.md's memory figures): "timing: supervisor: WHEN: resident R MB (anon A, file F, shmem
 * S), peak P MB". */
static void report_memory(const char *when) {
    if (!cf__timing_requested()) return;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    static const char *keys[] = {"VmRSS:", "RssAnon:", "RssFile:", "RssShmem:", "VmHWM:"};
    double kb[5] = {0};
    char line[256];
    while (fgets(line, sizeof line, f))
        for (int i = 0; i < 5; i++)
            if (!strncmp(line, keys[i], strlen(keys[i]))) kb[i] = atof(line + strlen(keys[i]));
    fclose(f);
    fprintf(stderr,
            "timing: supervisor: %s: resident %.1f MB (anon %.1f, file %.1f, shmem %.1f), peak "
            "%.1f MB\n",
            when, kb[0] / 1024, kb[1] / 1024, kb[2] / 1024, kb[3] / 1024, kb[4] / 1024);
}

/* The supervisor, once every worker is forked: each worker has its own copy of the learner
 * now, and the caller's is read again only when the results come home (which replace its
 * weights, buffers and optimizer state) or when a lost group is forked again (from the
 * caller's state as it was). Its gradients and optimizer state pages that hold only zeros (a
 * learner that has not trained yet, gradients zeroed after a step) go back: they read the same
 * afterwards, and the pages the workers still share with this process become theirs alone. */
static void on_forked(void *ctx) {
    worker_ctx *w = ctx;
    cf_model *m = w->learn->model;
    if (m) drop_zero_pages(m->grads, m->n_weights * sizeof(float));
    cf_optimizer *opt = w->learn->opt;
    if (m && opt) {
        drop_zero_pages(opt->grad_avg, m->n_weights * sizeof(float));
        drop_zero_pages(opt->sqr_avg, m->n_weights * sizeof(float));
    }
    report_memory("workers forked");
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
    report_memory("before the fork");
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
        st = cf__launch_fork_hooked(&lo, worker_main, &w, NULL, on_forked, &w);
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
    report_memory("workers ended");
    if (st == CF_OK) st = read_results(fd, learn, method);
    close(fd);
    report_memory("results home");
    return st;
}
