/* The MPI communicator (Open MPI): the same cf_comm over MPI_COMM_WORLD, for programs started by
 * mpirun. Errors are returned (MPI_ERRORS_RETURN on our duplicates of the world), not fatal.
 * Sums are MPI's: the same on every rank, but not necessarily in rank order.
 *
 * No hang on a failed rank: every collective starts with a "go" vote, a tiny non-blocking
 * all-reduce on a second duplicate of the world that carries this rank's failure flag and the
 * collective's kind, size and root. A rank whose fit failed locally (a callback's error, say)
 * casts one failing vote instead of its next collective (cf_mpi_agree); the others' next vote
 * sees it, every rank receives the failed rank's message and returns an error, and the group
 * is still in step, so later jobs can run. Ranks that called different collectives are caught
 * by the same vote. A vote that waits longer than the deadline means a rank is hung or gone:
 * the waiting rank prints why and ends the job with MPI_Abort (the last resort). A rank that
 * dies is reported by the MPI runtime itself (mpirun ends the job). */
#include "corefit/par.h"
#include "par/par_internal.h"

#ifndef CF_HAVE_MPI

cf_status cf_comm_mpi_new(cf_comm **out) {
    if (out) *out = NULL;
    return cf_fail(CF_ERR_UNSUPPORTED,
                   "cf_comm_mpi_new: corefit was built without MPI (install Open MPI with "
                   "scripts/install-deps, then configure with -DCF_WITH_MPI=ON)");
}

bool cf_mpi_launched(void) {
    return false;
}
void cf_mpi_begin_job(cf_comm *comm, double deadline_s) {
    (void)comm, (void)deadline_s;
}
cf_status cf_mpi_agree(cf_comm *comm, cf_status local) {
    (void)comm;
    return local;
}

#else

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MSG_BYTES 512

typedef struct mpi_comm {
    cf_comm base;
    MPI_Comm world; /* our duplicate of MPI_COMM_WORLD: the data collectives */
    MPI_Comm ctl;   /* a second duplicate: the votes and failure messages */
    bool we_initialised;
    double deadline_s; /* a vote waiting this long ends the job */
    uint64_t count;    /* collectives started (for messages) */
    bool agreed;       /* the group agreed on a failure: no vote until the next job */
    bool in_step;      /* every failure so far was agreed: the group is still in step */
} mpi_comm;

static inline mpi_comm *mc(cf_comm *c) {
    return (mpi_comm *)c;
}

static cf_status mpi_error(int code, const char *call) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
    text[len] = '\0';
    return cf_fail(CF_ERR_WORKER, "%s failed: %s (MPI error %d)", call, text, code);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Waits for a non-blocking operation on the control communicator: spins first, then yields
 * (ranks may share cores), then naps. Past the deadline the job is ended: some rank is hung
 * or gone, and no collective can complete without it. */
static cf_status wait_req(mpi_comm *c, MPI_Request *req, const char *what) {
    double start = 0;
    for (long i = 0;; i++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Test");
        if (done) return CF_OK;
        if (i < 2000) continue;
        if (i == 2000) start = now_s();
        double waited = now_s() - start;
        if (waited > c->deadline_s) {
            fprintf(stderr,
                    "corefit: rank %d: no answer from the group for %.1f s at collective %llu "
                    "(%s): a rank is hung or gone; ending the job (MPI_Abort)\n",
                    c->base.rank, waited, (unsigned long long)c->count, what);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 3);
            return cf_fail(CF_ERR_WORKER, "%s: the group stopped answering", what);
        }
        if (waited < 0.001) {
            sched_yield();
        } else {
            struct timespec nap = {0, 100 * 1000};
            nanosleep(&nap, NULL);
        }
    }
}

enum { GO_FAIL, GO_OP, GO_NOP, GO_N, GO_NN, GO_ROOT, GO_NROOT, GO_LEN };

/* The vote before collective `op` (CF_OP_*, CF_OP_NONE with failed set). Returns CF_OK when
 * every rank called the same collective and none failed; otherwise the same error on every
 * rank (the failed rank's message), and the group stays in step. */
static cf_status go(mpi_comm *c, int op, size_t n, int root, bool failed, cf_status local) {
    int size = c->base.size, rank = c->base.rank;
    const char *what = cf_shm_op_name((uint32_t)op);
    c->count++;
    int64_t v[GO_LEN] = {failed ? size - rank : 0, op, -op, (int64_t)n, -(int64_t)n, root, -root};
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, v, GO_LEN, MPI_INT64_T, MPI_MAX, c->ctl, &req);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Iallreduce");
    cf_status st = wait_req(c, &req, failed ? "failure vote" : what);
    if (st != CF_OK) return st;
    if (v[GO_FAIL] > 0) {
        /* The lowest failed rank tells everyone why. */
        int who = size - (int)v[GO_FAIL];
        char msg[MSG_BYTES] = {0};
        if (who == rank) snprintf(msg, sizeof msg, "%s", cf_last_error());
        rc = MPI_Ibcast(msg, MSG_BYTES, MPI_CHAR, who, c->ctl, &req);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Ibcast");
        if ((st = wait_req(c, &req, "failure message")) != CF_OK) return st;
        msg[MSG_BYTES - 1] = '\0';
        c->agreed = true;
        if (failed) return local; /* this rank's own error stands, message unchanged */
        return cf_fail(CF_ERR_WORKER, "rank %d failed: %s", who, msg);
    }
    if (v[GO_OP] != -v[GO_NOP] || v[GO_N] != -v[GO_NN] || v[GO_ROOT] != -v[GO_NROOT]) {
        c->agreed = true;
        return cf_fail(CF_ERR_STATE,
                       "collective %llu: ranks called different collectives (this rank: %s of "
                       "%zu with root %d; kinds %lld..%lld, sizes %lld..%lld, roots %lld..%lld)",
                       (unsigned long long)c->count, what, n, root, (long long)-v[GO_NOP],
                       (long long)v[GO_OP], (long long)-v[GO_NN], (long long)v[GO_N],
                       (long long)-v[GO_NROOT], (long long)v[GO_ROOT]);
    }
    return CF_OK;
}

/* A failed MPI call (not a vote) leaves the group out of step for good. */
static cf_status out_of_step(mpi_comm *c, cf_status st) {
    if (st != CF_OK && !c->agreed) c->in_step = false;
    return st;
}

#define CHUNK_ELEMS ((size_t)1 << 30) /* counts are int in MPI-3 */

static cf_status allreduce(cf_comm *comm, void *buf, size_t n, MPI_Datatype type, size_t elem,
                           int op) {
    mpi_comm *c = mc(comm);
    cf_status st = go(c, op, n, 0, false, CF_OK);
    if (st != CF_OK) return out_of_step(c, st);
    for (size_t off = 0; off < n; off += CHUNK_ELEMS) {
        size_t m = n - off < CHUNK_ELEMS ? n - off : CHUNK_ELEMS;
        int rc =
            MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)m, type, MPI_SUM, c->world);
        if (rc != MPI_SUCCESS) return out_of_step(c, mpi_error(rc, "MPI_Allreduce"));
    }
    return CF_OK;
}

static cf_status mpi_allreduce_f32(cf_comm *comm, float *buf, size_t n, bool mean) {
    cf_status st = allreduce(comm, buf, n, MPI_FLOAT, sizeof(float),
                             mean ? CF_OP_ALLREDUCE_MEAN_F32 : CF_OP_ALLREDUCE_SUM_F32);
    if (st == CF_OK && mean) {
        float div = (float)comm->size;
        for (size_t i = 0; i < n; i++) buf[i] /= div;
    }
    return st;
}

static cf_status mpi_allreduce_f64(cf_comm *comm, double *buf, size_t n) {
    return allreduce(comm, buf, n, MPI_DOUBLE, sizeof(double), CF_OP_ALLREDUCE_SUM_F64);
}

static cf_status mpi_broadcast(cf_comm *comm, void *buf, size_t bytes, int root) {
    mpi_comm *c = mc(comm);
    cf_status st = go(c, CF_OP_BROADCAST, bytes, root, false, CF_OK);
    if (st != CF_OK) return out_of_step(c, st);
    for (size_t off = 0; off < bytes; off += CHUNK_ELEMS) {
        size_t m = bytes - off < CHUNK_ELEMS ? bytes - off : CHUNK_ELEMS;
        int rc = MPI_Bcast((char *)buf + off, (int)m, MPI_BYTE, root, c->world);
        if (rc != MPI_SUCCESS) return out_of_step(c, mpi_error(rc, "MPI_Bcast"));
    }
    return CF_OK;
}

static cf_status mpi_gather(cf_comm *comm, const void *send, size_t bytes, void *recv, int root) {
    mpi_comm *c = mc(comm);
    cf_status st = go(c, CF_OP_GATHER, bytes, root, false, CF_OK);
    if (st != CF_OK) return out_of_step(c, st);
    MPI_Comm w = c->world;
    if (bytes <= CHUNK_ELEMS) {
        int rc = MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, w);
        return rc == MPI_SUCCESS ? CF_OK : out_of_step(c, mpi_error(rc, "MPI_Gather"));
    }
    /* Large pieces: gather chunk by chunk into a strided receive type. */
    for (size_t off = 0; off < bytes; off += CHUNK_ELEMS) {
        size_t m = bytes - off < CHUNK_ELEMS ? bytes - off : CHUNK_ELEMS;
        MPI_Datatype piece, strided;
        MPI_Type_contiguous((int)m, MPI_BYTE, &piece);
        MPI_Type_create_resized(piece, 0, (MPI_Aint)bytes, &strided);
        MPI_Type_commit(&strided);
        int rc = MPI_Gather((const char *)send + off, (int)m, MPI_BYTE,
                            recv ? (char *)recv + off : NULL, 1, strided, root, w);
        MPI_Type_free(&strided);
        MPI_Type_free(&piece);
        if (rc != MPI_SUCCESS) return out_of_step(c, mpi_error(rc, "MPI_Gather"));
    }
    return CF_OK;
}

/* The vote is itself a barrier. */
static cf_status mpi_barrier(cf_comm *comm) {
    mpi_comm *c = mc(comm);
    return out_of_step(c, go(c, CF_OP_BARRIER, 0, 0, false, CF_OK));
}

static cf_status mpi_any(cf_comm *comm, bool flag, bool *any) {
    mpi_comm *c = mc(comm);
    cf_status st = go(c, CF_OP_ANY, 1, 0, false, CF_OK);
    if (st != CF_OK) return out_of_step(c, st);
    int v = flag ? 1 : 0;
    int rc = MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LOR, c->world);
    if (rc != MPI_SUCCESS) return out_of_step(c, mpi_error(rc, "MPI_Allreduce"));
    *any = v != 0;
    return CF_OK;
}

static void mpi_free(cf_comm *comm) {
    mpi_comm *c = mc(comm);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        MPI_Comm_free(&c->ctl);
        MPI_Comm_free(&c->world);
        if (c->we_initialised) MPI_Finalize();
    }
    cf_free(c);
}

static const cf_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce_f32 = mpi_allreduce_f32,
    .allreduce_sum_f64 = mpi_allreduce_f64,
    .broadcast = mpi_broadcast,
    .gather = mpi_gather,
    .barrier = mpi_barrier,
    .any = mpi_any,
    .heartbeat = NULL,
    .results = NULL,
    .free = mpi_free,
};

static bool is_mpi(cf_comm *comm) {
    return comm && comm->ops == &mpi_ops;
}

bool cf_mpi_launched(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

void cf_mpi_begin_job(cf_comm *comm, double deadline_s) {
    if (!is_mpi(comm)) return;
    mpi_comm *c = mc(comm);
    c->deadline_s = deadline_s > 0 ? deadline_s : 120;
    c->agreed = false;
    /* A failure the group agreed on left it in step: it can run the next job. */
    if (c->in_step) {
        comm->broken = CF_OK;
        comm->broken_msg[0] = '\0';
    }
}

cf_status cf_mpi_agree(cf_comm *comm, cf_status local) {
    if (!is_mpi(comm) || comm->size == 1) return local;
    mpi_comm *c = mc(comm);
    if (c->agreed) return local; /* a vote already told every rank */
    if (!c->in_step) return local;
    char keep[MSG_BYTES];
    snprintf(keep, sizeof keep, "%s", cf_last_error());
    cf_status st = go(c, CF_OP_NONE, 0, 0, local != CF_OK, local);
    if (local != CF_OK) {
        /* this rank's error, unchanged; the communicator refuses collectives until the next job */
        if (comm->broken == CF_OK) {
            comm->broken = local;
            snprintf(comm->broken_msg, sizeof comm->broken_msg, "%.*s",
                     (int)sizeof comm->broken_msg - 1, keep);
        }
        return cf_fail(local, "%s", keep);
    }
    if (st != CF_OK && comm->broken == CF_OK) {
        comm->broken = st;
        snprintf(comm->broken_msg, sizeof comm->broken_msg, "%s", cf_last_error());
    }
    return out_of_step(c, st);
}

cf_status cf_comm_mpi_new(cf_comm **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_comm_mpi_new: out is NULL");
    *out = NULL;
    int initialised = 0, finalized = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalized);
    if (finalized) return cf_fail(CF_ERR_STATE, "cf_comm_mpi_new: MPI was already finalized");
    mpi_comm *c = cf_calloc(1, sizeof *c);
    if (!c) return cf_fail_context(CF_ERR_NOMEM, "cf_comm_mpi_new");
    c->world = c->ctl = MPI_COMM_NULL;
    c->deadline_s = 120;
    c->in_step = true;
    if (!initialised) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            cf_free(c);
            return mpi_error(rc, "MPI_Init_thread");
        }
        c->we_initialised = true;
    }
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->world);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->ctl);
    if (rc != MPI_SUCCESS) goto fail;
    MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(c->ctl, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->world, &c->base.rank);
    MPI_Comm_size(c->world, &c->base.size);
    MPI_Comm local;
    rc = MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->base.rank, MPI_INFO_NULL, &local);
    if (rc != MPI_SUCCESS) goto fail;
    MPI_Comm_rank(local, &c->base.local_rank);
    MPI_Comm_size(local, &c->base.local_size);
    MPI_Comm_free(&local);
    c->base.ops = &mpi_ops;
    *out = &c->base;
    return CF_OK;
fail:;
    cf_status st = mpi_error(rc, "cf_comm_mpi_new");
    if (c->ctl != MPI_COMM_NULL) MPI_Comm_free(&c->ctl);
    if (c->world != MPI_COMM_NULL) MPI_Comm_free(&c->world);
    if (c->we_initialised) MPI_Finalize();
    cf_free(c);
    return st;
}

#endif
