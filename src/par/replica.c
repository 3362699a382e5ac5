/* One replica of a data-parallel group. A replica differs from a single-process learner by
 * three things only: the parallel callback below (broadcast parameters at the start, all-reduce
 * gradients before each step, average BatchNorm statistics before validation, sum validation
 * totals and metric statistics, agree on cancellations), the loaders' shard setting, and the
 * communicator. */
#include <math.h>
#include <string.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "par/twin.h"

/* ---- the call's options and callbacks ---------------------------------------------------- */

void *cf__par_copy_opts(const cf__par_method *method) {
    void *copy = cf_malloc(method->opts_size);
    if (copy) memcpy(copy, method->opts, method->opts_size);
    return copy;
}

void cf__par_free_call_cbs(const cf_fit_common *common) {
    for (int i = 0; i < common->n_cbs; i++) cf_callback_free(common->cbs[i]);
    for (int i = 0; i < common->par.n_master_cbs; i++) cf_callback_free(common->par.master_cbs[i]);
}

/* ---- the parallel callback ----------------------------------------------------------------- */

typedef struct par_cb_state {
    cf_comm *comm;
    bool split_batch, sync_bn;
    double *metric_buf; /* valid totals + metric statistics, sized at before_fit */
    size_t metric_len;
} par_cb_state;

static cf_status pc_before_fit(cf_callback *cb, cf_learner *learn) {
    par_cb_state *s = cb->state;
    cf_model *m = learn->model;
    size_t len = 2;
    for (int i = 0; i < learn->n_metrics; i++) len += (size_t)learn->metrics[i]->n_acc;
    cf_free(s->metric_buf);
    s->metric_buf = cf_calloc(len, sizeof(double));
    if (!s->metric_buf) return CF_ERR_NOMEM;
    s->metric_len = len;
    /* Replicas start from rank 0's parameters, whatever they built. */
    cf_status st = cf_comm_broadcast(s->comm, m->weights, m->n_weights * sizeof(float), 0);
    if (st == CF_OK && m->n_buffers)
        st = cf_comm_broadcast(s->comm, m->buffers, m->n_buffers * sizeof(float), 0);
    return st;
}

/* Gradients: sum_r w_r g_r / sum_r w_r, with w_r the rows this replica's loss averaged over
 * (split batches: its real rows, so N replicas reproduce one process). The smoothed loss sees
 * the same weighted mean. Done at before_step, so that gradients accumulated over several
 * batches (GradientAccumulation cancels the batches before it) are reduced once, and gradient
 * clipping sees the global gradient. */
static cf_status pc_before_step(cf_callback *cb, cf_learner *learn) {
    par_cb_state *s = cb->state;
    const cf_batch *b = learn->batch;
    cf_model *m = learn->model;
    double w = s->split_batch ? b->n_real : b->size;
    double sums[2] = {w * learn->loss_value, w};
    cf_status st = cf_comm_allreduce_sum_f64(s->comm, sums, 2);
    if (st != CF_OK) return st;
    /* the weighting and the division ride on the reduction's own copies in and out of shared
     * memory (the same float products as passes of their own over every gradient) */
    float inv = sums[1] > 0 ? (float)(1.0 / sums[1]) : 0.0f;
    st = cf_comm_allreduce_scaled_f32(s->comm, m->grads, m->n_weights, (float)w, inv);
    if (st != CF_OK) return st;
    learn->loss_value = sums[1] > 0 ? (float)(sums[0] / sums[1]) : learn->loss_value;
    return CF_OK;
}

/* BatchNorm running statistics: the mean over replicas, so every replica validates (and the
 * caller receives) one model. */
static cf_status pc_after_train(cf_callback *cb, cf_learner *learn) {
    par_cb_state *s = cb->state;
    cf_model *m = learn->model;
    /* synchronised BatchNorm: every replica already holds the same statistics */
    if (!m->n_buffers || s->sync_bn) return CF_OK;
    return cf_comm_allreduce_mean_f32(s->comm, m->buffers, m->n_buffers);
}

/* Validation loss and metrics as sums and counts over the whole set (padding excluded). */
static cf_status pc_after_validate(cf_callback *cb, cf_learner *learn) {
    par_cb_state *s = cb->state;
    double *buf = s->metric_buf;
    size_t at = 0;
    buf[at++] = learn->recorder.valid_loss_total;
    buf[at++] = learn->recorder.valid_loss_count;
    for (int i = 0; i < learn->n_metrics; i++) {
        cf_metric *mt = learn->metrics[i];
        memcpy(buf + at, mt->acc, (size_t)mt->n_acc * sizeof(double));
        at += (size_t)mt->n_acc;
    }
    cf_status st = cf_comm_allreduce_sum_f64(s->comm, buf, at);
    if (st != CF_OK) return st;
    at = 0;
    learn->recorder.valid_loss_total = buf[at++];
    learn->recorder.valid_loss_count = buf[at++];
    for (int i = 0; i < learn->n_metrics; i++) {
        cf_metric *mt = learn->metrics[i];
        memcpy(mt->acc, buf + at, (size_t)mt->n_acc * sizeof(double));
        at += (size_t)mt->n_acc;
    }
    return CF_OK;
}

static void pc_free(cf_callback *cb) {
    par_cb_state *s = cb->state;
    if (s) cf_free(s->metric_buf);
    cf_free(s);
    cf_free(cb);
}

static cf_callback *parallel_cb(cf_comm *comm, bool split_batch, bool sync_bn) {
    cf_callback *cb = cf_callback_new("ParallelCallback", CF_ORDER_PARALLEL, sizeof(par_cb_state));
    if (!cb) return NULL;
    par_cb_state *s = cb->state;
    s->comm = comm;
    s->split_batch = split_batch;
    s->sync_bn = sync_bn;
    cb->free = pc_free;
    cb->on[CF_EV_BEFORE_FIT] = pc_before_fit;
    cb->on[CF_EV_BEFORE_STEP] = pc_before_step;
    cb->on[CF_EV_AFTER_TRAIN] = pc_after_train;
    cb->on[CF_EV_AFTER_VALIDATE] = pc_after_validate;
    return cb;
}

/* Every replica ends each batch and epoch with the same pending cancellation: the strongest
 * one requested on any replica. */
static cf_status sync_cancel(cf_learner *learn) {
    cf_comm *comm = learn->replica.comm;
    double votes[CF_CANCEL_FIT + 1] = {0};
    votes[learn->cancel] = 1;
    cf_status st = cf_comm_allreduce_sum_f64(comm, votes, CF_CANCEL_FIT + 1);
    if (st != CF_OK) return st;
    static const cf_cancel strength[] = {CF_CANCEL_FIT,      CF_CANCEL_EPOCH, CF_CANCEL_TRAIN,
                                         CF_CANCEL_VALIDATE, CF_CANCEL_BATCH, CF_CANCEL_STEP,
                                         CF_CANCEL_BACKWARD};
    for (size_t i = 0; i < sizeof strength / sizeof *strength; i++)
        if (votes[strength[i]] > 0) {
            learn->cancel = strength[i];
            break;
        }
    return CF_OK;
}

static cf_status agree_any(cf_learner *learn, bool flag, bool *any) {
    return cf_comm_any(learn->replica.comm, flag, any);
}

static cf_status broadcast0(cf_learner *learn, void *buf, size_t bytes) {
    return bytes ? cf_comm_broadcast(learn->replica.comm, buf, bytes, 0) : CF_OK;
}

static cf_status gather0(cf_learner *learn, const void *send, size_t bytes, void *recv) {
    return bytes ? cf_comm_gather(learn->replica.comm, send, bytes, recv, 0) : CF_OK;
}

/* Synchronised BatchNorm's reduce (cf_model_set_bn_reduce). Forward: plain sums. Backward:
 * each replica's sums are in its own gradient scale (its loss is the mean over its count rows),
 * so they are weighted by that count before the sum and the result is brought back into this
 * replica's scale: sum_r count_r S_r / count_self, with the total count in buf[0]. */
static cf_status bn_reduce(double *buf, size_t n, bool backward, void *ctx) {
    cf_comm *comm = ctx;
    if (!backward) return cf_comm_allreduce_sum_f64(comm, buf, n);
    const double own = buf[0];
    for (size_t i = 1; i < n; i++) buf[i] *= own;
    cf_status st = cf_comm_allreduce_sum_f64(comm, buf, n);
    for (size_t i = 1; st == CF_OK && i < n; i++) buf[i] = own > 0 ? buf[i] / own : 0;
    return st;
}

/* ---- a call in a replica ------------------------------------------------------------------- */

static cf_status set_shards(cf_learner *learn, int rank, int world, cf_shard_mode mode) {
    cf_status st = cf_dataloader_set_shard(learn->dls->train, rank, world, mode);
    if (st == CF_OK && learn->dls->valid)
        st = cf_dataloader_set_shard(learn->dls->valid, rank, world, mode);
    learn->replica.rank = rank;
    learn->replica.world = world;
    learn->replica.shard_mode = mode;
    return st;
}

cf_status cf__par_run_replica(cf_learner *learn, cf_comm *comm, const cf__par_method *method,
                              void *opts, cf_callback **master_cbs, int n_master,
                              const cf__par_recovery *recovery) {
    cf_fit_common *common = opts;
    int rank = cf_comm_rank(comm), world = cf_comm_size(comm);
    bool is_master = rank == 0;
    cf_shard_mode mode = common->par.split_batch ? CF_SHARD_SPLIT_BATCH : CF_SHARD_PER_RANK;
    int n_all = common->n_cbs + (is_master ? n_master : 0);
    cf_callback **all = cf_calloc((size_t)n_all + 4, sizeof *all); /* + recovery's */
    /* The parallel callback joins the learner itself for the call, so that it runs in every fit
     * a method makes (fine_tune's two phases); the call's callbacks go with the call. */
    cf_callback *pcb = parallel_cb(comm, common->par.split_batch, common->par.sync_bn);
    cf_status st = all && pcb ? CF_OK : CF_ERR_NOMEM;
    if (st == CF_OK) {
        st = cf_learner_add_cb(learn, pcb); /* frees pcb on failure */
        pcb = NULL;
    }
    if (st != CF_OK) {
        cf_callback_free(pcb);
        for (int i = 0; i < common->n_cbs; i++) cf_callback_free(common->cbs[i]);
        for (int i = 0; i < n_master; i++) cf_callback_free(master_cbs[i]);
        cf_free(all);
        return st;
    }
    int n = 0;
    for (int i = 0; i < common->n_cbs; i++) all[n++] = common->cbs[i];
    for (int i = 0; i < n_master; i++) {
        if (is_master)
            all[n++] = master_cbs[i];
        else
            cf_callback_free(master_cbs[i]);
    }
    if (recovery && recovery->area) st = cf__recovery_join(recovery, rank, common, all, &n);
    common->cbs = all;
    common->n_cbs = n;
    cf_replica single = learn->replica;
    learn->replica.comm = comm;
    learn->replica.is_master = is_master;
    learn->replica.sync_cancel = sync_cancel;
    learn->replica.agree_any = agree_any;
    learn->replica.broadcast = broadcast0;
    learn->replica.gather = gather0;
    if (st == CF_OK) st = set_shards(learn, rank, world, mode);
    if (st == CF_OK && common->par.sync_bn)
        st = cf_model_set_bn_reduce(learn->model, bn_reduce, comm);
    if (st == CF_OK) {
        st = method->run(learn, opts, method->args);
    } else {
        for (int i = 0; i < n; i++) cf_callback_free(all[i]);
    }
    cf_free(all);
    cf_learner_remove_cb(learn, "ParallelCallback");
    if (common->par.sync_bn) cf_model_set_bn_reduce(learn->model, NULL, NULL);
    /* Outputs that each replica computed in part (get_preds: its own rows) are made whole. */
    if (st == CF_OK && world > 1 && method->output && method->output->combine)
        st = method->output->combine(comm, cf__par_out(method));
    cf_status restore = set_shards(learn, single.rank, single.world, single.shard_mode);
    learn->replica = single;
    return st != CF_OK ? st : restore;
}
