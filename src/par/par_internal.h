/* Private to the par layer: the shared-memory region that cf_launch_fork maps before forking
 * and the shm communicator built on it. */
#ifndef CF_PAR_INTERNAL_H
#define CF_PAR_INTERNAL_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "corefit/par.h"

#define CF_SHM_LINE 64
#define CF_SHM_MSG 1024

enum { CF_SHM_RUNNING = 0, CF_SHM_DONE_OK = 1, CF_SHM_DONE_ERR = 2 };

/* Collective kinds, recorded by each rank before it arrives so mismatched calls are caught. */
enum {
    CF_OP_NONE = 0,
    CF_OP_ALLREDUCE_SUM_F32,
    CF_OP_ALLREDUCE_MEAN_F32,
    CF_OP_ALLREDUCE_SUM_F64,
    CF_OP_BROADCAST,
    CF_OP_GATHER,
    CF_OP_BARRIER,
    CF_OP_ANY,
};

/* One per rank, each on its own cache lines. Written by that rank only (except at setup). */
typedef struct cf_shm_rank {
    alignas(CF_SHM_LINE) _Atomic uint64_t heartbeat_ns; /* last sign of progress */
    _Atomic uint64_t wait_since_ns; /* when a collective wait went slow; 0 when not waiting */
    _Atomic uint64_t arrived;       /* barrier arrivals so far */
    _Atomic uint32_t state;         /* CF_SHM_RUNNING / DONE_OK / DONE_ERR */
    /* the collective in progress, published like a seqlock: op_seq = 0, the fields, then
     * op_seq = the collective's number (release) */
    _Atomic uint64_t op_seq;
    _Atomic uint32_t op;
    _Atomic int32_t root;
    _Atomic uint64_t op_count;
    /* the worker's outcome, written before state */
    alignas(CF_SHM_LINE) int32_t status;
    int32_t blame; /* 1 + the rank whose departure made a collective fail here; 0: none */
    char message[CF_SHM_MSG];
} cf_shm_rank;

typedef struct cf_shm_header {
    uint32_t magic;
    int32_t nranks;
    int32_t supervisor_pid;
    int32_t cores; /* cores the supervisor may run on */
    double deadline_s;
    size_t slot_bytes;     /* per data slot, multiple of 64 */
    size_t ranks_offset;   /* cf_shm_rank[nranks] */
    size_t slots_offset;   /* (nranks + 1) slots: one per rank, then the shared result slot */
    size_t results_offset; /* page aligned */
    size_t results_bytes;
    size_t total_bytes;
    alignas(CF_SHM_LINE) _Atomic uint32_t abort_flag;
    alignas(CF_SHM_LINE) _Atomic uint32_t bar_count;
    alignas(CF_SHM_LINE) _Atomic uint32_t bar_gen; /* futex word */
    _Atomic uint32_t bar_sleepers;
} cf_shm_header;

/* The communicator a worker receives (lives on the worker's stack). */
typedef struct cf_shm_comm {
    cf_comm base;
    cf_shm_header *hdr;
    cf_shm_rank *ranks;
    char *slots;
    uint64_t seq;   /* collectives started by this rank */
    int spin;       /* busy-wait iterations before yielding, on a crowded machine */
    double spin_ns; /* otherwise a spin of this many ns (0: the iterations always) */
    int yields;     /* sched_yield calls before sleeping on the futex */
    /* barrier statistics (printed by a worker under CF_TIMING=1): barriers passed, nanoseconds
     * spent in them, waits that outlasted the spin, futex naps taken */
    uint64_t barriers, wait_ns, slow_waits, naps;
} cf_shm_comm;

/* Maps and initialises a region (anonymous MAP_SHARED | MAP_NORESERVE). */
cf_status cf_shm_region_create(int nranks, size_t slot_bytes, size_t results_bytes,
                               double deadline_s, cf_shm_header **out);
void cf_shm_region_destroy(cf_shm_header *hdr);
static inline cf_shm_rank *cf_shm_rank_at(cf_shm_header *h, int r) {
    return (cf_shm_rank *)((char *)h + h->ranks_offset) + r;
}
/* Builds rank r's communicator over the region (in the worker, after fork). */
void cf_shm_comm_init(cf_shm_comm *c, cf_shm_header *hdr, int rank);
/* Sets the abort flag and wakes every rank sleeping in a collective. */
void cf_shm_abort(cf_shm_header *hdr);
/* Monotonic clock in nanoseconds (the same clock in every process). */
uint64_t cf_shm_now_ns(void);
/* "barrier", "allreduce_sum_f32", ... */
const char *cf_shm_op_name(uint32_t op);

/* What ended the calling thread's last cf_launch_fork call, for the fit runner's recovery. */
typedef enum cf__fault_kind {
    CF_FAULT_NONE = 0, /* success */
    CF_FAULT_KILLED,   /* a worker died of a signal */
    CF_FAULT_HUNG,     /* a worker made no progress within the deadline */
    CF_FAULT_EXITED,   /* a worker exited without reporting an outcome */
    CF_FAULT_FAILED,   /* a worker returned an error (its own, not a lost peer's) */
    CF_FAULT_OTHER,    /* interrupted, bad options, no memory, no fork */
} cf__fault_kind;
typedef struct cf__launch_fault {
    cf__fault_kind kind;
    int rank;   /* the worker at fault (-1: none) */
    int signal; /* CF_FAULT_KILLED: the signal */
} cf__launch_fault;
cf__launch_fault cf__launch_last_fault(void);

/* cf_launch_fork with forked(forked_ctx) called in the supervisor once every worker is forked,
 * before it starts watching them (not called when a fork failed). */
cf_status cf__launch_fork_hooked(const cf_launch_options *opt, cf_worker_fn fn, void *ctx,
                                 cf_results *results_out, void (*forked)(void *), void *forked_ctx);

/* MPI backend hooks for the parallel twins (comm_mpi.c; harmless without MPI). */
/* True when this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE). */
bool cf_mpi_launched(void);
/* Before each job: the deadline for a collective's vote (0: 120 s), and a communicator whose
 * last failure every rank agreed on is usable again. */
void cf_mpi_begin_job(cf_comm *comm, double deadline_s);
/* After each job, on every rank: returns the job's status agreed by the group. A rank that
 * failed (local != CF_OK) casts a failing vote, which the others' next collective or their own
 * cf_mpi_agree sees: they get CF_ERR_WORKER "rank R failed: <R's message>"; the failed rank
 * keeps its own error. At most one vote per job, so the group stays in step. */
cf_status cf_mpi_agree(cf_comm *comm, cf_status local);

#endif
