/* The communicator front end: argument checks, the broken state, dispatch to a backend; and the
 * single (world of one) backend. */
#include "corefit/par.h"

#include <stdio.h>
#include <string.h>

/* ---- single ------------------------------------------------------------------------------ */

static cf_status single_allreduce_f32(cf_comm *c, float *buf, size_t n, bool mean) {
    (void)c, (void)buf, (void)n, (void)mean;
    return CF_OK;
}
static cf_status single_allreduce_f64(cf_comm *c, double *buf, size_t n) {
    (void)c, (void)buf, (void)n;
    return CF_OK;
}
static cf_status single_broadcast(cf_comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes, (void)root;
    return CF_OK;
}
static cf_status single_gather(cf_comm *c, const void *send, size_t bytes, void *recv, int root) {
    (void)c, (void)root;
    if (recv != send) memmove(recv, send, bytes);
    return CF_OK;
}
static cf_status single_barrier(cf_comm *c) {
    (void)c;
    return CF_OK;
}
static cf_status single_any(cf_comm *c, bool flag, bool *any) {
    (void)c;
    *any = flag;
    return CF_OK;
}

static const cf_comm_ops single_ops = {
    .name = "single",
    .allreduce_f32 = single_allreduce_f32,
    .allreduce_sum_f64 = single_allreduce_f64,
    .broadcast = single_broadcast,
    .gather = single_gather,
    .barrier = single_barrier,
    .any = single_any,
};

static cf_comm single_comm = {
    .ops = &single_ops, .rank = 0, .size = 1, .local_rank = 0, .local_size = 1};

cf_comm *cf_comm_single(void) {
    return &single_comm;
}

/* ---- front end ---------------------------------------------------------------------------- */

void cf_comm_free(cf_comm *comm) {
    if (!comm || comm == &single_comm || !comm->ops->free) return;
    comm->ops->free(comm);
}

const char *cf_comm_kind(const cf_comm *comm) {
    return comm ? comm->ops->name : "none";
}
int cf_comm_rank(const cf_comm *comm) {
    return comm ? comm->rank : 0;
}
int cf_comm_size(const cf_comm *comm) {
    return comm ? comm->size : 1;
}
int cf_comm_local_rank(const cf_comm *comm) {
    return comm ? comm->local_rank : 0;
}
int cf_comm_local_size(const cf_comm *comm) {
    return comm ? comm->local_size : 1;
}

void cf_comm_heartbeat(cf_comm *comm) {
    if (comm && comm->ops->heartbeat) comm->ops->heartbeat(comm);
}

void *cf_comm_results(cf_comm *comm, size_t *bytes) {
    if (comm && comm->ops->results) return comm->ops->results(comm, bytes);
    if (bytes) *bytes = 0;
    return NULL;
}

/* Checks the common preconditions of a collective named `what`. */
static cf_status enter(cf_comm *comm, const char *what) {
    if (!comm) return cf_fail(CF_ERR_INVALID, "%s: communicator is NULL", what);
    if (comm->broken != CF_OK)
        return cf_fail(comm->broken, "%s: communicator unusable after an earlier failure: %s", what,
                       comm->broken_msg);
    return CF_OK;
}

/* Records a failure: a group whose collective failed on one rank is out of step for good. */
static cf_status leave(cf_comm *comm, cf_status st) {
    if (st != CF_OK && comm->size > 1 && comm->broken == CF_OK) {
        comm->broken = st;
        snprintf(comm->broken_msg, sizeof comm->broken_msg, "%s", cf_last_error());
    }
    return st;
}

static cf_status bad(cf_comm *comm, cf_status st) {
    return leave(comm, st);
}

static cf_status allreduce_f32(cf_comm *comm, float *buf, size_t n, bool mean, const char *what) {
    cf_status st = enter(comm, what);
    if (st != CF_OK) return st;
    if (n == 0) return CF_OK;
    if (!buf) return bad(comm, cf_fail(CF_ERR_INVALID, "%s: buffer is NULL (n = %zu)", what, n));
    if (comm->size == 1) return CF_OK;
    return leave(comm, comm->ops->allreduce_f32(comm, buf, n, mean));
}

cf_status cf_comm_allreduce_sum_f32(cf_comm *comm, float *buf, size_t n) {
    return allreduce_f32(comm, buf, n, false, "allreduce_sum_f32");
}

cf_status cf_comm_allreduce_mean_f32(cf_comm *comm, float *buf, size_t n) {
    return allreduce_f32(comm, buf, n, true, "allreduce_mean_f32");
}

static void scale_f32(float *buf, size_t n, float by) {
    if (by != 1.0f)
        for (size_t i = 0; i < n; i++) buf[i] *= by;
}

cf_status cf_comm_allreduce_scaled_f32(cf_comm *comm, float *buf, size_t n, float pre, float post) {
    const char *what = "allreduce_scaled_f32";
    cf_status st = enter(comm, what);
    if (st != CF_OK) return st;
    if (n == 0) return CF_OK;
    if (!buf) return bad(comm, cf_fail(CF_ERR_INVALID, "%s: buffer is NULL (n = %zu)", what, n));
    if (comm->size > 1 && comm->ops->allreduce_scaled_f32)
        return leave(comm, comm->ops->allreduce_scaled_f32(comm, buf, n, pre, post));
    scale_f32(buf, n, pre);
    if (comm->size > 1 && (st = comm->ops->allreduce_f32(comm, buf, n, false)) != CF_OK)
        return leave(comm, st);
    scale_f32(buf, n, post);
    return CF_OK;
}

cf_status cf_comm_allreduce_sum_f64(cf_comm *comm, double *buf, size_t n) {
    const char *what = "allreduce_sum_f64";
    cf_status st = enter(comm, what);
    if (st != CF_OK) return st;
    if (n == 0) return CF_OK;
    if (!buf) return bad(comm, cf_fail(CF_ERR_INVALID, "%s: buffer is NULL (n = %zu)", what, n));
    if (comm->size == 1) return CF_OK;
    return leave(comm, comm->ops->allreduce_sum_f64(comm, buf, n));
}

cf_status cf_comm_broadcast(cf_comm *comm, void *buf, size_t bytes, int root) {
    const char *what = "broadcast";
    cf_status st = enter(comm, what);
    if (st != CF_OK) return st;
    if (root < 0 || root >= comm->size)
        return bad(comm, cf_fail(CF_ERR_INVALID, "%s: root %d is not a rank of a world of %d", what,
                                 root, comm->size));
    if (bytes == 0) return CF_OK;
    if (!buf)
        return bad(comm, cf_fail(CF_ERR_INVALID, "%s: buffer is NULL (%zu bytes)", what, bytes));
    if (comm->size == 1) return CF_OK;
    return leave(comm, comm->ops->broadcast(comm, buf, bytes, root));
}

cf_status cf_comm_gather(cf_comm *comm, const void *send, size_t bytes, void *recv, int root) {
    const char *what = "gather";
    cf_status st = enter(comm, what);
    if (st != CF_OK) return st;
    if (root < 0 || root >= comm->size)
        return bad(comm, cf_fail(CF_ERR_INVALID, "%s: root %d is not a rank of a world of %d", what,
                                 root, comm->size));
    if (bytes == 0) return CF_OK;
    if (!send)
        return bad(comm,
                   cf_fail(CF_ERR_INVALID, "%s: send buffer is NULL (%zu bytes)", what, bytes));
    if (comm->rank == root && !recv)
        return bad(comm, cf_fail(CF_ERR_INVALID, "%s: recv buffer is NULL on root %d", what, root));
    return leave(comm, comm->ops->gather(comm, send, bytes, recv, root));
}

cf_status cf_comm_barrier(cf_comm *comm) {
    cf_status st = enter(comm, "barrier");
    if (st != CF_OK) return st;
    if (comm->size == 1) return CF_OK;
    return leave(comm, comm->ops->barrier(comm));
}

cf_status cf_comm_any(cf_comm *comm, bool flag, bool *any) {
    const char *what = "any";
    cf_status st = enter(comm, what);
    if (st != CF_OK) return st;
    if (!any) return bad(comm, cf_fail(CF_ERR_INVALID, "%s: result pointer is NULL", what));
    return leave(comm, comm->ops->any(comm, flag, any));
}
