/* corefit/par.h — the multi-core runtime: communicators and the fork launcher.
 *
 * A communicator (cf_comm) joins the replicas of a data-parallel group: rank, size, and the
 * collectives a fit needs (all-reduce of gradients and metric sums, broadcast of parameters,
 * gather of predictions, a barrier, and "did any rank ask to stop"). Three backends share one
 * small vtable: single (a world of one), shared memory (the workers of cf_launch_fork) and MPI.
 *
 * Every collective must be called by every rank of the group, in the same order, with the same
 * sizes and root. A collective that fails (a peer died, the group was aborted, the supervisor is
 * gone, a mismatched call, a deadline) returns an error naming the cause and leaves the
 * communicator broken: every later collective returns the same error at once, so a worker that
 * keeps going cannot desynchronise the group further. */
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

/* The MPI world (MPI_COMM_WORLD duplicated). Calls MPI_Init_thread when MPI is not yet
 * initialised (and MPI_Finalize in cf_comm_free in that case). The local rank comes from
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Returns CF_ERR_UNSUPPORTED when corefit was built
 * without MPI. */
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

/* The results area of a cf_launch_fork worker: the memory (results_bytes long, zero-filled at
 * start, shared by all workers) that the supervisor hands to the caller when every worker
 * succeeded. Workers agree on its layout themselves (e.g. rank 0 writes the model, every rank
 * its slice of predictions). NULL with *bytes = 0 for single and MPI, or when results_bytes
 * was 0. */
void *cf_comm_results(cf_comm *comm, size_t *bytes);

/* ---- the fork launcher and supervisor -------------------------------------------------------- */

/* What each worker runs. It returns CF_OK or an error with a message (cf_fail); the supervisor
 * reports that message. It runs in a forked child: it may read everything the caller had at
 * the call (the learner, the loaders), and what it changes stays in the child except what it
 * writes into cf_comm_results. It must not free comm. Do not call exit() in it. */
typedef cf_status (*cf_worker_fn)(cf_comm *comm, void *ctx);

typedef struct cf_launch_options {
    int num_workers;      /* 0: cf_available_cores() */
    double deadline_s;    /* a worker making no progress this long is declared hung: no heartbeat
                             outside a collective, or waiting this long inside one. 0: 60 s */
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

/* Runs fn(comm, ctx) in num_workers forked worker processes (ranks 0..num_workers-1) joined by a
 * shared-memory communicator, and waits for them. The calling process is the supervisor and
 * does no training. Each worker ignores SIGINT, is killed if the supervisor dies, optionally
 * pins itself to a core, runs one thread (cf_set_num_threads(1), one BLAS thread), and leaves
 * with _exit (no atexit handlers, no return into the caller's code).
 *
 * On success (every worker returned CF_OK) returns CF_OK and, when results_out is not NULL,
 * the results area in it (release it with cf_results_release). On any fault it aborts the
 * group, SIGKILLs every worker, reaps them all, unmaps the shared memory, leaves *results_out
 * zeroed and returns, within about 2 s of the fault (or of the deadline):
 *   CF_ERR_WORKER  "worker 1 was killed by signal 9 (SIGKILL)", "worker 0 failed: <its error
 *                  message>", "worker 2 made no progress for 5.0 s", "worker 3 exited with
 *                  code 1 before finishing";
 *   CF_ERR_INTERRUPTED "interrupted" when SIGINT reached the caller during the call;
 *   CF_ERR_INVALID / CF_ERR_NOMEM / CF_ERR_STATE for bad options, a failed mapping or fork,
 *                  or a call while another cf_launch_fork runs in this process.
 * During the call SIGINT is caught (unless the caller ignores it) and SIGCHLD is set to the
 * default; both dispositions are restored before return. Only the workers' own pids are waited
 * for, so the caller's other children are left alone. Flushes stdio before forking. */
cf_status cf_launch_fork(const cf_launch_options *opt, cf_worker_fn fn, void *ctx,
                         cf_results *results_out);

/* Unmaps a results area. Zeroes *results. NULL and zeroed results are ignored. */
void cf_results_release(cf_results *results);

/* ---- the parallel twins of the fit methods ------------------------------------------------- */

/* cf_par_X runs cf_X in every replica of a data-parallel group and brings everything home.
 * Same options as the single-process method, plus .par (cf_par_opts, corefit/learn.h):
 *   .par.num_cores    worker processes (0: the cores this process may run on);
 *   .par.start_method CF_START_FORK (the caller supervises forked workers), CF_START_MPI
 *                     (SPMD under mpirun: every rank calls the same method; see docs/mpi.md)
 *                     or CF_START_AUTO (mpi when started by mpirun, else fork);
 *   .par.master_cbs   callbacks run on rank 0 only for this call (added to the learner's
 *                     master callbacks, cf_learner_add_master_cbs);
 *   .par.split_batch  cut each global batch of bs across the workers (results equal one
 *                     process); by default each worker takes batches of bs (global bs * cores);
 *   .par.deadline_s   a worker silent this long is declared hung (0: 120 s);
 *   .par.sync_bn      synchronised BatchNorm (PyTorch's SyncBatchNorm): in training, every
 *                     BatchNorm layer normalises with the statistics of the global batch (its
 *                     sums reduced over the replicas in forward, the sums its input gradient
 *                     needs in backward), so with .par.split_batch N workers equal one process
 *                     for models with BatchNorm too; it costs two small all-reduces per
 *                     BatchNorm layer and step. Without it each replica normalises with its own
 *                     slice's statistics and the running statistics are averaged before each
 *                     validation.
 *   .par.max_restarts fork: recover in place from a lost worker, at most this many times
 *                     (0: none, a lost worker ends the call as below). Rank 0 keeps a commit
 *                     of the fit every .par.commit_every training batches: the checkpoint of
 *                     cf_checkpoint_cb (corefit/learn.h: everything the rest of the fit
 *                     depends on, every replica's BatchNorm buffers included) in a private
 *                     directory on /dev/shm (a memory file system; the temporary directory
 *                     where there is none), removed when the call ends. When a worker is
 *                     killed, crashes, exits early or makes no progress for .par.deadline_s,
 *                     the supervisor stops the others, says on stderr what happened and where
 *                     the group carries on from ("worker 1 was killed by signal 9 (SIGKILL)
 *                     at epoch 0 batch 37; restarting 2 workers from epoch 0 batch 35 (restart
 *                     1 of 3)"; nothing when the learner is quiet), forks a fresh group that
 *                     resumes from the commit (.resume) and carries on: the fit's results
 *                     (weights, BatchNorm buffers, optimizer state, the Recorder of the whole
 *                     fit) are bitwise those of an undisturbed fit. A fault before the first
 *                     commit restarts from the beginning, as do lr_find, validate,
 *                     get_preds and tta (they take no commits) and fine_tune in its frozen
 *                     phase. A
 *                     worker that fails with an error of its own (bad data, a non-finite
 *                     loss) and Ctrl-C are not retried: they would only repeat. After
 *                     max_restarts restarts the next fault ends the call as without recovery.
 *                     cf_par_last_restarts() says how many restarts a call made.
 *   .par.commit_every training batches between commits (0: CF_PAR_COMMIT_EVERY).
 *
 *     cf_par_fit_one_cycle(learn, 5, .lr_max = CF_SLICE(2e-3), .par.num_cores = 8);
 *
 * Each replica: one core, one BLAS thread, loaders sharded by rank, progress and master
 * callbacks on rank 0 only, gradients all-reduced (averaged) before every step, BatchNorm
 * statistics averaged before each validation, validation loss and metrics summed over the
 * whole set without padding, cancellations agreed at every batch.
 *
 * Coming home, only when every worker succeeded: rank 0's learner state as
 * cf_learner_export_state writes it (weights and buffers, freezing, the optimizer and its state,
 * the whole Recorder, final_record, the figure paths noted on the learner, and the state of the
 * learner's callbacks and master callbacks that have export_state), and the method's output
 * (lr_find's result, validate's values, or get_preds' and tta's predictions in dataset order
 * without padding). Not coming home: the state of the call's own callbacks (.cbs, .par.master_cbs:
 * the call takes them over and frees them), of callbacks without export_state, and anything a
 * worker changes outside its learner other than files it writes. On any failure the caller's
 * learner is left exactly as it was (fork: nothing is copied; mpi: every rank is rolled back to its
 * state at the call) and the error names the rank and the cause. */
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

/* The MPI world the twins use with start_method mpi (made at the first call, kept for the
 * process; MPI is finalized at exit when corefit initialised it). Call it on every rank, e.g.
 * to learn this rank (cf_comm_rank) before writing files from rank 0 only. Under MPI every
 * rank of a twin ends with the same learner state; a rank that fails makes every rank return
 * an error (CF_ERR_WORKER "rank R failed: ..." on the others) instead of hanging; a rank
 * silent past .par.deadline_s inside a collective ends the job (MPI_Abort). Returns
 * CF_ERR_UNSUPPORTED when corefit was built without MPI. */
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
