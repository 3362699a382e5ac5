/* The fork runner: the caller supervises num_cores forked workers (cf_launch_fork), rank 0
 * writes what comes home into a results file, and the caller reads it into its learner only
 * when every worker succeeded.
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
#include "par/twin.h"

typedef struct worker_ctx {
    cf_learner *learn;
    const cf__par_method *method;
    const cf_fit_common *common;
    int results_fd;
} worker_ctx;

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
                                       w->common->par.n_master_cbs);
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

cf_status cf__par_run_fork(cf_learner *learn, const cf__par_method *method,
                           const cf_fit_common *common) {
    const cf_par_opts *par = &common->par;
    int fd = results_file();
    if (fd < 0) {
        cf__par_free_call_cbs(common);
        return cf_fail(CF_ERR_NOMEM, "cannot create the results file: %s", strerror(errno));
    }
    worker_ctx w = {learn, method, common, fd};
    cf_launch_options lo = {.num_workers = par->num_cores,
                            .deadline_s = par->deadline_s > 0 ? par->deadline_s : 120,
                            .pin_cores = true};
    cf_status st = cf_launch_fork(&lo, worker_main, &w, NULL);
    /* The workers took over copies of the call's callbacks; the caller's copies go now. */
    cf__par_free_call_cbs(common);
    if (st == CF_OK) st = read_results(fd, learn, method);
    close(fd);
    return st;
}
