/* corefit/par.h — the multi-core runtime: communicators, the fork launcher and the cf_par_
 * twins of the fit methods. Every collective must be called by every rank, in the same order,
 * with the same sizes and root; a failed collective returns an error naming the cause and
 * leaves the communicator broken (later calls fail at once). Details: docs/api.md, docs/mpi.md. */
#ifndef COREFIT_PAR_H
#define COREFIT_PAR_H

#include <stdbool.h>
#include <stddef.h>

#include "corefit/core.h"
/* The twins take the fit methods' options, whose .par member (cf_par_opts) is declared there. */
#include "corefit/learn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- communicator -------------------------------------------------------------------------- */

typedef struct cf_comm cf_comm;

/* The backend interface. Users call the cf_comm_* functions below, which check arguments,
 * keep the broken state, and dispatch here. A backend embeds struct cf_comm as its first
 * member. Entries may assume valid arguments, n > 0 and size > 1 for data movement. */
typedef struct cf_comm_ops {
    const char *name; /* "single", "shm", "mpi" */
    cf_status (*allreduce_f32)(cf_comm *comm, float *buf, size_t n, bool mean);
    cf_status (*allreduce_sum_f64)(cf_comm *comm, double *buf, size_t n);
    cf_status (*broadcast)(cf_comm *comm, void *buf, size_t bytes, int root);
    cf_status (*gather)(cf_comm *comm, const void *send, size_t bytes, void *recv, int root);
    cf_status (*barrier)(cf_comm *comm);
    cf_status (*any)(cf_comm *comm, bool flag, bool *any);
    void (*heartbeat)(cf_comm *comm);               /* may be NULL */
    void *(*results)(cf_comm *comm, size_t *bytes); /* may be NULL: no results area */
    void (*free)(cf_comm *comm);                    /* may be NULL: not owned by the caller */
    /* May be NULL (the front end scales around allreduce_f32): buf = post * sum_r (pre * buf_r),
     * pre applied before the sum on each rank and post after it, the same rounding as the
     * three passes. */
    cf_status (*allreduce_scaled_f32)(cf_comm *comm, float *buf, size_t n, float pre, float post);
} cf_comm_ops;

struct cf_comm {
    const cf_comm_ops *ops;
    int rank, size;             /* this replica's rank in [0, size) */
    int local_rank, local_size; /* the same on this machine (== rank, size for single and shm) */
    cf_status broken;           /* CF_OK, or the status of the first failed collective */
    char broken_msg[256];       /* its message */
};

/* A world of one (rank 0, size 1): collectives are no-ops (gather copies send to recv). A
 * shared static object; cf_comm_free on it does nothing. Never fails. */
cf_comm *cf_comm_single(void);

/* The MPI world (MPI_COMM_WORLD duplicated), initialising MPI if needed (then finalized in
 * cf_comm_free). CF_ERR_UNSUPPORTED when built without MPI. */
cf_status cf_comm_mpi_new(cf_comm **out);

/* Frees a communicator made by cf_comm_mpi_new. NULL, the single communicator and the one a
 * worker receives from cf_launch_fork (owned by the launcher) are ignored. */
void cf_comm_free(cf_comm *comm);

const char *cf_comm_kind(const cf_comm *comm); /* the backend's name */
int cf_comm_rank(const cf_comm *comm);
int cf_comm_size(const cf_comm *comm);
int cf_comm_local_rank(const cf_comm *comm);
int cf_comm_local_size(const cf_comm *comm);

/* In-place sum over ranks of n floats. Over shared memory the result is bitwise deterministic
 * and equal to the serial sum in rank order ((x0 + x1) + x2 ...), identical on every rank. */
cf_status cf_comm_allreduce_sum_f32(cf_comm *comm, float *buf, size_t n);
/* In-place mean: the sum above divided by the world size (float division, as torch does). */
cf_status cf_comm_allreduce_mean_f32(cf_comm *comm, float *buf, size_t n);
/* In-place weighted sum: buf = post * sum_r (pre_r * buf_r), with pre the calling rank's own
 * factor and post the same on every rank; bitwise the three steps (buf *= pre; sum; buf *= post)
 * in float, but over shared memory in one pass over buf each way (the data-parallel gradient
 * reduction: pre the rows a replica's loss averaged over, post one over their total). */
cf_status cf_comm_allreduce_scaled_f32(cf_comm *comm, float *buf, size_t n, float pre, float post);
/* In-place sum of doubles (loss/metric totals and counts). */
cf_status cf_comm_allreduce_sum_f64(cf_comm *comm, double *buf, size_t n);
/* Copies `bytes` bytes of root's buf into every other rank's buf. */
cf_status cf_comm_broadcast(cf_comm *comm, void *buf, size_t bytes, int root);
/* Concatenates every rank's `bytes` bytes of send, in rank order, into recv on root (recv holds
 * size * bytes there; it is ignored and may be NULL on the other ranks). */
cf_status cf_comm_gather(cf_comm *comm, const void *send, size_t bytes, void *recv, int root);
/* Returns when every rank has called it. */
cf_status cf_comm_barrier(cf_comm *comm);
/* Logical OR of flag over ranks into *any, the same on every rank (so a cancellation requested
 * on one rank stops every rank at the same batch). */
cf_status cf_comm_any(cf_comm *comm, bool flag, bool *any);

/* Tells the supervisor this worker is making progress. Collectives call it themselves; call it
 * in long stretches of work without collectives (e.g. once a batch). Cheap (a clock read and a
 * store). A no-op for single and MPI. */
void cf_comm_heartbeat(cf_comm *comm);

/* A cf_launch_fork worker's shared results area (results_bytes, zero-filled), handed to the
 * caller when every worker succeeded; workers agree on its layout. NULL, *bytes 0 otherwise. */
void *cf_comm_results(cf_comm *comm, size_t *bytes);

/* ---- the fork launcher and supervisor -------------------------------------------------------- */

/* What each worker runs, in a forked child: CF_OK or an error (cf_fail), which the supervisor
 * reports. Only what it writes into cf_comm_results comes back. Must not free comm or exit(). */
typedef cf_status (*cf_worker_fn)(cf_comm *comm, void *ctx);

typedef struct cf_launch_options {
    int num_workers;      /* 0: cf_available_cores() */
    double deadline_s;    /* a worker making no progress this long is declared hung: no heartbeat
                             outside a collective, or waiting inside one this long and an eighth
                             more (so that a peer silent outside is named first). 0: 60 s */
    size_t comm_bytes;    /* per-rank staging slot for collectives (larger buffers go in chunks);
                             0: 512 KiB; rounded up to 64 bytes */
    size_t results_bytes; /* size of the results area (0: none). Reserved, not committed: pages
                             cost memory only once written */
    bool pin_cores;       /* pin worker r to the (r % cores)-th core this process may run on */
} cf_launch_options;

/* What came home: the results area, kept mapped (no copy) until cf_results_release. */
typedef struct cf_results {
    void *data;   /* NULL when results_bytes was 0 */
    size_t bytes; /* results_bytes */
    void *map_;   /* internal */
    size_t map_bytes_;
} cf_results;

/* Runs fn(comm, ctx) in num_workers forked workers joined by a shared-memory communicator and
 * waits; the caller only supervises. On success CF_OK and, when results_out is not NULL, the
 * results area (release with cf_results_release). On any fault every worker is killed and reaped
 * within about 2 s and it returns CF_ERR_WORKER (naming the worker and cause), CF_ERR_INTERRUPTED
 * (SIGINT), or CF_ERR_INVALID / NOMEM / STATE. Signals and process details: docs/api.md. */
cf_status cf_launch_fork(const cf_launch_options *opt, cf_worker_fn fn, void *ctx,
                         cf_results *results_out);

/* Unmaps a results area. Zeroes *results. NULL and zeroed results are ignored. */
void cf_results_release(cf_results *results);

/* ---- the parallel twins of the fit methods ------------------------------------------------- */

/* cf_par_X runs cf_X in every replica of a data-parallel group (.par options, cf_par_opts in
 * corefit/learn.h) and brings rank 0's learner state and the method's output home, only when
 * every worker succeeded; on failure the caller's learner is left as it was and the error names
 * the rank and cause. The call's own callbacks are taken over and do not come home.
 *     cf_par_fit_one_cycle(learn, 5, .lr_max = CF_SLICE(2e-3), .par.num_cores = 8);
 * The options, restarts and what comes home: docs/api.md. */
cf_status cf_par_fit_(cf_learner *learn, int n_epoch, const cf_fit_opts *opts);
cf_status cf_par_fit_one_cycle_(cf_learner *learn, int n_epoch, const cf_one_cycle_opts *opts);
cf_status cf_par_fit_flat_cos_(cf_learner *learn, int n_epoch, const cf_flat_cos_opts *opts);
cf_status cf_par_fit_sgdr_(cf_learner *learn, int n_cycles, int cycle_len,
                           const cf_sgdr_opts *opts);
cf_status cf_par_fine_tune_(cf_learner *learn, int epochs, const cf_fine_tune_opts *opts);
cf_status cf_par_lr_find_(cf_learner *learn, cf_lr_find_result *result,
                          const cf_lr_find_opts *opts);
cf_status cf_par_validate_(cf_learner *learn, double *values, const cf_validate_opts *opts);
cf_status cf_par_get_preds_(cf_learner *learn, cf_preds *out, const cf_get_preds_opts *opts);
cf_status cf_par_tta_(cf_learner *learn, cf_preds *out, const cf_tta_opts *opts);

/* How many times this thread's last fork-started parallel call restarted its workers
 * (.par.max_restarts). */
int cf_par_last_restarts(void);

/* The MPI world the twins use with start_method mpi (made at first call, kept for the process).
 * Call it on every rank (e.g. to learn this rank). CF_ERR_UNSUPPORTED when built without MPI. */
cf_status cf_par_mpi_comm(cf_comm **out);

#define cf_par_fit(...) CF_CALL2_(cf_par_fit_, cf_fit_opts, __VA_ARGS__, )
#define cf_par_fit_one_cycle(...) CF_CALL2_(cf_par_fit_one_cycle_, cf_one_cycle_opts, __VA_ARGS__, )
#define cf_par_fit_flat_cos(...) CF_CALL2_(cf_par_fit_flat_cos_, cf_flat_cos_opts, __VA_ARGS__, )
#define cf_par_fit_sgdr(...) CF_CALL3_(cf_par_fit_sgdr_, cf_sgdr_opts, __VA_ARGS__, )
#define cf_par_fine_tune(...) CF_CALL2_(cf_par_fine_tune_, cf_fine_tune_opts, __VA_ARGS__, )
#define cf_par_lr_find(...) CF_CALL2_(cf_par_lr_find_, cf_lr_find_opts, __VA_ARGS__, )
#define cf_par_validate(...) CF_CALL2_(cf_par_validate_, cf_validate_opts, __VA_ARGS__, )
#define cf_par_get_preds(...) CF_CALL2_(cf_par_get_preds_, cf_get_preds_opts, __VA_ARGS__, )
#define cf_par_tta(...) CF_CALL2_(cf_par_tta_, cf_tta_opts, __VA_ARGS__, )

#ifdef __cplusplus
}
#endif
#endif
