/* The MPI communicator (Open MPI): the same cf_comm over MPI_COMM_WORLD, for programs started by
 * mpirun. Errors are returned (MPI_ERRORS_RETURN on our duplicate of the world), not fatal. A
 * dead rank is reported by the MPI runtime itself (Open MPI ends the job). Sums are MPI's: the
 * same on every rank, but not necessarily in rank order. */
#include "corefit/par.h"

#ifndef CF_HAVE_MPI

cf_status cf_comm_mpi_new(cf_comm **out) {
    if (out) *out = NULL;
    return cf_fail(CF_ERR_UNSUPPORTED,
                   "cf_comm_mpi_new: corefit was built without MPI (configure with Open MPI "
                   "installed and -DCF_WITH_MPI=ON)");
}

#else

#include <limits.h>
#include <mpi.h>
#include <string.h>

typedef struct mpi_comm {
    cf_comm base;
    MPI_Comm world; /* our duplicate of MPI_COMM_WORLD */
    bool we_initialised;
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

#define CHUNK_ELEMS ((size_t)1 << 30) /* counts are int in MPI-3 */

static cf_status mpi_allreduce_f32(cf_comm *comm, float *buf, size_t n, bool mean) {
    for (size_t off = 0; off < n; off += CHUNK_ELEMS) {
        size_t m = n - off < CHUNK_ELEMS ? n - off : CHUNK_ELEMS;
        int rc =
            MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)m, MPI_FLOAT, MPI_SUM, mc(comm)->world);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allreduce");
    }
    if (mean) {
        float div = (float)comm->size;
        for (size_t i = 0; i < n; i++) buf[i] /= div;
    }
    return CF_OK;
}

static cf_status mpi_allreduce_f64(cf_comm *comm, double *buf, size_t n) {
    for (size_t off = 0; off < n; off += CHUNK_ELEMS) {
        size_t m = n - off < CHUNK_ELEMS ? n - off : CHUNK_ELEMS;
        int rc =
            MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)m, MPI_DOUBLE, MPI_SUM, mc(comm)->world);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allreduce");
    }
    return CF_OK;
}

static cf_status mpi_broadcast(cf_comm *comm, void *buf, size_t bytes, int root) {
    for (size_t off = 0; off < bytes; off += CHUNK_ELEMS) {
        size_t m = bytes - off < CHUNK_ELEMS ? bytes - off : CHUNK_ELEMS;
        int rc = MPI_Bcast((char *)buf + off, (int)m, MPI_BYTE, root, mc(comm)->world);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Bcast");
    }
    return CF_OK;
}

static cf_status mpi_gather(cf_comm *comm, const void *send, size_t bytes, void *recv, int root) {
    MPI_Comm w = mc(comm)->world;
    if (bytes <= CHUNK_ELEMS) {
        int rc = MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, w);
        return rc == MPI_SUCCESS ? CF_OK : mpi_error(rc, "MPI_Gather");
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
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Gather");
    }
    return CF_OK;
}

static cf_status mpi_barrier(cf_comm *comm) {
    int rc = MPI_Barrier(mc(comm)->world);
    return rc == MPI_SUCCESS ? CF_OK : mpi_error(rc, "MPI_Barrier");
}

static cf_status mpi_any(cf_comm *comm, bool flag, bool *any) {
    int v = flag ? 1 : 0;
    int rc = MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LOR, mc(comm)->world);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allreduce");
    *any = v != 0;
    return CF_OK;
}

static void mpi_free(cf_comm *comm) {
    mpi_comm *c = mc(comm);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
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

cf_status cf_comm_mpi_new(cf_comm **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_comm_mpi_new: out is NULL");
    *out = NULL;
    int initialised = 0, finalized = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalized);
    if (finalized) return cf_fail(CF_ERR_STATE, "cf_comm_mpi_new: MPI was already finalized");
    mpi_comm *c = cf_calloc(1, sizeof *c);
    if (!c) return cf_fail_context(CF_ERR_NOMEM, "cf_comm_mpi_new");
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
    if (rc != MPI_SUCCESS) goto fail;
    MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN);
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
    if (c->world != MPI_COMM_NULL && c->world) MPI_Comm_free(&c->world);
    if (c->we_initialised) MPI_Finalize();
    cf_free(c);
    return st;
}

#endif
