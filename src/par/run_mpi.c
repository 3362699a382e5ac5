/* The MPI runner: SPMD under mpirun, this process is one rank and its learner one replica.
 * Every rank starts from rank 0's learner state, runs the method (with one thread when it
 * shares its machine; binding to cores is mpirun's), agrees with the others on the outcome,
 * and then either ends with rank 0's state (the same envelope the fork runner brings home,
 * broadcast) or, when the call failed on any rank, is rolled back to the state it had when the
 * call began. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "par/par_internal.h"
#include "par/twin.h"

/* The MPI world of this process, created at the first mpi call and kept (MPI can be
 * initialised once per process); freed at exit, which finalizes MPI if corefit initialised it. */
static cf_comm *mpi_world;

static void free_mpi_world(void) {
    cf_comm_free(mpi_world);
    mpi_world = NULL;
}

cf_status cf_par_mpi_comm(cf_comm **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_par_mpi_comm: out is NULL");
    *out = NULL;
    if (!mpi_world) {
        cf_status st = cf_comm_mpi_new(&mpi_world);
        if (st != CF_OK) return cf_fail_context(st, "start_method mpi");
        atexit(free_mpi_world);
    }
    *out = mpi_world;
    return CF_OK;
}

/* Rank root's bytes on every rank: the size, then the bytes in chunks. On rank root *buf and
 * size are its own; elsewhere *buf is allocated here (free with cf_free). A rank that cannot
 * allocate still receives every chunk (into scratch), so the group stays in step, and then
 * reports the failure. */
#define CHUNK ((size_t)1 << 20)
static cf_status broadcast_bytes(cf_comm *comm, void **buf, size_t *size, int root) {
    static unsigned char scratch[CHUNK];
    uint64_t n = *size;
    cf_status st = cf_comm_broadcast(comm, &n, sizeof n, root);
    if (st != CF_OK) return st;
    bool lost = false;
    if (cf_comm_rank(comm) != root) {
        *size = (size_t)n;
        *buf = cf_malloc((size_t)n + 1);
        lost = *buf == NULL;
    }
    for (size_t at = 0; st == CF_OK && at < n; at += CHUNK) {
        size_t len = n - at < CHUNK ? (size_t)(n - at) : CHUNK;
        st = cf_comm_broadcast(comm, lost ? scratch : (unsigned char *)*buf + at, len, root);
    }
    if (st == CF_OK && lost)
        st = cf_fail(CF_ERR_NOMEM, "rank %d: %llu bytes of state", cf_comm_rank(comm),
                     (unsigned long long)n);
    return st;
}

/* Copies the random streams of modules lo..hi-1 (pre-order) into buf, or out of it when put;
 * returns the index after m's subtree. */
static size_t module_rngs(cf_module *m, size_t at, size_t lo, size_t hi, cf_rng *buf, bool put) {
    if (at >= lo && at < hi) {
        if (put)
            m->rng = buf[at - lo];
        else
            buf[at - lo] = m->rng;
    }
    at++;
    for (int i = 0; i < m->n_children; i++) at = module_rngs(m->children[i], at, lo, hi, buf, put);
    return at;
}

/* The learner state of rank 0 on every rank (ranks may have built theirs differently): the
 * weights, the buffers and the modules' random streams, from which the dropouts' keyed masks
 * are drawn (a rank whose model came from another seed would otherwise draw other masks). */
static cf_status share_start(cf_learner *learn, cf_comm *comm) {
    cf_model *m = learn->model;
    cf_status st = cf_comm_broadcast(comm, m->weights, m->n_weights * sizeof(float), 0);
    if (st == CF_OK && m->n_buffers)
        st = cf_comm_broadcast(comm, m->buffers, m->n_buffers * sizeof(float), 0);
    enum { PIECE = 256 };
    cf_rng piece[PIECE];
    const size_t n = module_rngs(m->root, 0, 0, 0, piece, false);
    for (size_t lo = 0; st == CF_OK && lo < n; lo += PIECE) {
        const size_t hi = n - lo < PIECE ? n : lo + PIECE;
        module_rngs(m->root, 0, lo, hi, piece, false);
        st = cf_comm_broadcast(comm, piece, (hi - lo) * sizeof *piece, 0);
        if (st == CF_OK) module_rngs(m->root, 0, lo, hi, piece, true);
    }
    return st;
}

/* Rank 0's envelope (state and output) on every other rank. */
static cf_status share_home(cf_learner *learn, cf_comm *comm, const cf__par_method *method) {
    int rank = cf_comm_rank(comm);
    void *buf = NULL;
    size_t size = 0;
    cf_status st = CF_OK;
    if (rank == 0) {
        size = cf__par_home_write(learn, method, CF_OK, "", NULL, 0);
        buf = cf_malloc(size + 1);
        if (buf) cf__par_home_write(learn, method, CF_OK, "", buf, size);
        /* an allocation failure on rank 0 is announced as an empty envelope */
        if (!buf) size = 0;
    }
    st = broadcast_bytes(comm, &buf, &size, 0);
    if (st == CF_OK && rank != 0) {
        if (size == 0)
            st = cf_fail(CF_ERR_WORKER, "rank 0 could not serialise its state");
        else
            st = cf__par_home_read(learn, method, buf, size);
    } else if (st == CF_OK && size == 0) {
        st = cf_fail(CF_ERR_NOMEM, "rank 0: serialising the learner state");
    }
    cf_free(buf);
    return st;
}

cf_status cf__par_run_mpi(cf_learner *learn, cf_comm *comm, const cf__par_method *method,
                          const cf_fit_common *common) {
    const cf_par_opts *par = &common->par;
    cf_mpi_begin_job(comm, par->deadline_s);
    cf_status st = CF_OK;
    /* the roll-back point: this rank's learner as the call found it */
    size_t snap_size = cf_learner_export_state(learn, NULL, 0);
    void *snap = cf_malloc(snap_size + 1);
    void *opts = cf__par_copy_opts(method);
    if (!snap || !opts) st = cf_fail(CF_ERR_NOMEM, "start_method mpi: the roll-back copy");
    if (st == CF_OK) cf_learner_export_state(learn, snap, snap_size);
    if (st == CF_OK && par->num_cores != 0 && par->num_cores != cf_comm_size(comm))
        st = cf_fail(CF_ERR_INVALID,
                     "start_method mpi: num_cores is %d but the MPI world has %d ranks (mpirun -np "
                     "sets the world; pass 0)",
                     par->num_cores, cf_comm_size(comm));
    if (st == CF_OK) st = share_start(learn, comm);
    if (st == CF_OK) {
        int threads = cf_get_num_threads();
        if (cf_comm_local_size(comm) > 1) cf_set_num_threads(1);
        st = cf__par_run_replica(learn, comm, method, opts, par->master_cbs, par->n_master_cbs,
                                 NULL);
        cf_set_num_threads(threads);
    } else {
        cf__par_free_call_cbs(common);
    }
    cf_free(opts);
    st = cf_mpi_agree(comm, st);
    if (st == CF_OK) {
        /* a rank that could not take rank 0's state makes every rank roll back */
        st = share_home(learn, comm, method);
        bool any = false;
        cf_status vote = cf_comm_any(comm, st != CF_OK, &any);
        if (st == CF_OK && vote != CF_OK) st = vote;
        if (st == CF_OK && any)
            st = cf_fail(CF_ERR_WORKER, "another rank could not take rank 0's state");
    }
    if (st != CF_OK) {
        /* Every rank returns to where it began (the agreement above makes them all take this
         * branch together, or the failed collective in share_home does). */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cf_last_error());
        if (snap && cf_learner_import_state(learn, snap, snap_size) != CF_OK)
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg),
                     " (and the learner could not be rolled back: %s)", cf_last_error());
        if (method->output && method->output->release) method->output->release(cf__par_out(method));
        cf_fail(st, "%s", msg);
    }
    cf_free(snap);
    return st;
}
