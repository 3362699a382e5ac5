/* Private to the par layer: how a parallel twin describes its fit method to the runners.
 *
 * A twin is one line in twins.c: it names the method, its options type and its argument. The
 * runners (run_fork.c, run_mpi.c) know nothing of individual methods: they call `run` in every
 * replica with a copy of the options whose common member (first in every options struct) holds
 * the call's callbacks, and bring home the learner's state (cf_learner_export_state) and, for
 * methods that return something, the output through its `home` description. */
#ifndef CF_PAR_TWIN_H
#define CF_PAR_TWIN_H

#include "corefit/learn.h"
#include "corefit/par.h"

/* A method's output (lr_find's result, validate's values, get_preds' predictions). */
typedef struct cf__par_output {
    /* bytes of the output at *out, in the replica that computed it (rank 0) */
    size_t (*export_fn)(const cf_learner *learn, const void *out, void *buf, size_t size);
    /* reads them into *out in the caller (or another rank); out unchanged on error */
    cf_status (*import_fn)(const cf_learner *learn, void *out, const void *buf, size_t size);
    /* every rank, after the method: combines the ranks' partial outputs (NULL: none needed) */
    cf_status (*combine)(cf_comm *comm, void *out);
    void (*release)(void *out); /* frees an output after a failure (NULL: nothing owned) */
    size_t clear_bytes;         /* zeroed at the start of the call */
} cf__par_output;

typedef struct cf__par_method {
    /* runs the single-process method with (a copy of) the options and the call's arguments */
    cf_status (*run)(cf_learner *learn, const void *opts, void *args);
    const void *opts; /* the caller's options: a cf_fit_common first */
    size_t opts_size;
    void *args;                   /* the method's arguments (its output pointer first) */
    const cf__par_output *output; /* NULL: the method returns nothing but the learner */
    bool resumable;               /* one fit that honours start_epoch (fit, one_cycle, ...) */
} cf__par_method;

/* The output pointer a method writes to (args point at it), or NULL. */
static inline void *cf__par_out(const cf__par_method *m) {
    return m->output ? *(void **)m->args : NULL;
}

/* The outputs of lr_find, validate and get_preds (home.c). */
extern const cf__par_output cf__par_lr_find_output, cf__par_values_output, cf__par_preds_output;

/* In-place recovery of a fork group (recover.c): the commit the group keeps (the learn layer's
 * checkpoint, on a memory file system) and where each replica is. The supervisor makes the area
 * before the first fork and keeps it across restarts. */
typedef struct cf__commit_area cf__commit_area;
/* every: training batches between commits. */
cf_status cf__commit_area_new(int nranks, int every, cf__commit_area **out);
/* Removes the commit and its directory, and unmaps the area. NULL is ignored. */
void cf__commit_area_free(cf__commit_area *area);
/* Whether there is a commit, and the batch a fit resumed from it begins with. */
bool cf__commit_latest(const cf__commit_area *area, int64_t *epoch, int64_t *batch);
/* The training batch replica rank last began (false: none since the last forget). */
bool cf__commit_position(const cf__commit_area *area, int rank, int64_t *epoch, int64_t *batch);
void cf__commit_forget_positions(cf__commit_area *area);

typedef struct cf__par_recovery {
    cf__commit_area *area; /* NULL: no recovery */
    bool resume;           /* resume from the area's commit */
    bool resumable;        /* the method resumes from a checkpoint (.resume); others restart
                              from the beginning and commit nothing */
} cf__par_recovery;

/* In a replica, before the method runs: adds to extra (room for 3) the callbacks that note the
 * replica's position and write the group's commits (cf_checkpoint_cb), and, when resuming,
 * points common->resume at the commit. Nothing when rec is NULL or has no area. */
cf_status cf__recovery_join(const cf__par_recovery *rec, int rank, cf_fit_common *common,
                            cf_callback **extra, int *n_extra);

/* One call of a method in this process as one replica of comm's group (replica.c): joins the
 * group (parallel callback, shards, agreement hooks), runs the method with the call's
 * callbacks (cbs, and master_cbs on rank 0; all taken over), combines the output, and makes
 * the learner a single-process learner again. opts is a private copy the call may change. */
cf_status cf__par_run_replica(cf_learner *learn, cf_comm *comm, const cf__par_method *method,
                              void *opts, cf_callback **master_cbs, int n_master,
                              const cf__par_recovery *recovery);

/* What comes home (home.c): the envelope "CFHM" v1 = the outcome (CF_OK, or CF_ERR_NONFINITE
 * when every replica stopped alike on a non-finite loss and the state is the last good one)
 * with its message, the learner's state, and the output. Returns the bytes needed; writes them
 * only when size is enough. */
size_t cf__par_home_write(const cf_learner *learn, const cf__par_method *method, cf_status outcome,
                          const char *outcome_msg, void *buf, size_t size);
/* Reads an envelope into the learner and the output, all or nothing, and returns the outcome
 * (with its message) or the error that kept it from reading. */
cf_status cf__par_home_read(cf_learner *learn, const cf__par_method *method, const void *buf,
                            size_t size);
/* cf__par_home_read, calling consumed on parts of buf read for the last time (see
 * cf__learner_import_state_consuming); consumed may be NULL. */
cf_status cf__par_home_read_consuming(cf_learner *learn, const cf__par_method *method,
                                      const void *buf, size_t size,
                                      void (*consumed)(const void *p, size_t n, void *ctx),
                                      void *ctx);

/* The runners: run the method in forked workers (run_fork.c) or as this MPI rank (run_mpi.c).
 * Both take over the call's callbacks (opts' cbs and master_cbs) in every case. */
cf_status cf__par_run_fork(cf_learner *learn, const cf__par_method *method,
                           const cf_fit_common *common);
cf_status cf__par_run_mpi(cf_learner *learn, cf_comm *comm, const cf__par_method *method,
                          const cf_fit_common *common);
/* What the twins and the runners do with a call (replica.c, below both, so the runners never
 * call back into twins.c): a private copy of the method's options (NULL: out of memory, error
 * set), and freeing the call's callbacks (those of opts' common member and its
 * par.master_cbs). */
void *cf__par_copy_opts(const cf__par_method *method);
void cf__par_free_call_cbs(const cf_fit_common *common);

#endif
