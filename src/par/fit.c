/* The cf_par_ twins of the fit methods: run the ordinary method in every replica of a
 * data-parallel group (fork workers or MPI ranks), then bring everything home.
 *
 * A replica differs from a single-process learner by three things only: the parallel callback
 * below (broadcast parameters at the start, all-reduce gradients before each step, average
 * BatchNorm statistics before validation, sum validation totals and metric statistics, agree on
 * cancellations), the loaders' shard setting, and the communicator. */
#include "corefit/par.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/learn.h"
#include "learn/internal.h"
#include "par/par_internal.h"

/* ---- the parallel callback ----------------------------------------------------------------- */

typedef struct par_cb_state {
    cf_comm *comm;
    bool split_batch;
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
    if (w != 1.0)
        for (size_t i = 0; i < m->n_weights; i++) m->grads[i] *= (float)w;
    if ((st = cf_comm_allreduce_sum_f32(s->comm, m->grads, m->n_weights)) != CF_OK) return st;
    float inv = sums[1] > 0 ? (float)(1.0 / sums[1]) : 0.0f;
    for (size_t i = 0; i < m->n_weights; i++) m->grads[i] *= inv;
    learn->loss_value = sums[1] > 0 ? (float)(sums[0] / sums[1]) : learn->loss_value;
    return CF_OK;
}

/* BatchNorm running statistics: the mean over replicas, so every replica validates (and the
 * caller receives) one model. */
static cf_status pc_after_train(cf_callback *cb, cf_learner *learn) {
    par_cb_state *s = cb->state;
    cf_model *m = learn->model;
    if (!m->n_buffers) return CF_OK;
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

static cf_callback *parallel_cb(cf_comm *comm, bool split_batch) {
    cf_callback *cb = cf_calloc(1, sizeof *cb);
    par_cb_state *s = cf_calloc(1, sizeof *s);
    if (!cb || !s) {
        cf_free(cb);
        cf_free(s);
        return NULL;
    }
    s->comm = comm;
    s->split_batch = split_batch;
    cb->name = "ParallelCallback";
    cb->order = CF_ORDER_PARALLEL;
    cb->state = s;
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
    cf_comm *comm = learn->comm;
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
    return cf_comm_any(learn->comm, flag, any);
}

/* ---- jobs ---------------------------------------------------------------------------------- */

typedef enum job_kind {
    JOB_FIT,
    JOB_ONE_CYCLE,
    JOB_FLAT_COS,
    JOB_SGDR,
    JOB_FINE_TUNE,
    JOB_LR_FIND,
    JOB_VALIDATE,
    JOB_GET_PREDS,
} job_kind;

typedef struct par_job {
    job_kind kind;
    int n, n2;
    union {
        cf_fit_opts fit;
        cf_one_cycle_opts one_cycle;
        cf_flat_cos_opts flat_cos;
        cf_sgdr_opts sgdr;
        cf_fine_tune_opts fine_tune;
        cf_lr_find_opts lr_find;
        cf_validate_opts validate;
        cf_get_preds_opts get_preds;
    } o;
    cf_callback **cbs; /* the call's callbacks (taken over) */
    int n_cbs;
    const cf_par_opts *par;
    /* outputs in the replica */
    cf_lr_find_result lr_result;
    cf_preds preds;
    double *values;
} par_job;

/* Sets the call's callbacks into the job's options. */
static void set_cbs(par_job *job, cf_callback **cbs, int n) {
    switch (job->kind) {
    case JOB_FIT:
        job->o.fit.cbs = cbs, job->o.fit.n_cbs = n;
        break;
    case JOB_ONE_CYCLE:
        job->o.one_cycle.cbs = cbs, job->o.one_cycle.n_cbs = n;
        break;
    case JOB_FLAT_COS:
        job->o.flat_cos.cbs = cbs, job->o.flat_cos.n_cbs = n;
        break;
    case JOB_SGDR:
        job->o.sgdr.cbs = cbs, job->o.sgdr.n_cbs = n;
        break;
    case JOB_FINE_TUNE:
        job->o.fine_tune.cbs = cbs, job->o.fine_tune.n_cbs = n;
        break;
    case JOB_LR_FIND:
        job->o.lr_find.cbs = cbs, job->o.lr_find.n_cbs = n;
        break;
    case JOB_VALIDATE:
        job->o.validate.cbs = cbs, job->o.validate.n_cbs = n;
        break;
    case JOB_GET_PREDS:
        job->o.get_preds.cbs = cbs, job->o.get_preds.n_cbs = n;
        break;
    }
}

static cf_status run_method(cf_learner *learn, par_job *job) {
    switch (job->kind) {
    case JOB_FIT:
        return cf_fit_(learn, job->n, &job->o.fit);
    case JOB_ONE_CYCLE:
        return cf_fit_one_cycle_(learn, job->n, &job->o.one_cycle);
    case JOB_FLAT_COS:
        return cf_fit_flat_cos_(learn, job->n, &job->o.flat_cos);
    case JOB_SGDR:
        return cf_fit_sgdr_(learn, job->n, job->n2, &job->o.sgdr);
    case JOB_FINE_TUNE:
        return cf_fine_tune_(learn, job->n, &job->o.fine_tune);
    case JOB_LR_FIND:
        return cf_lr_find_(learn, &job->lr_result, &job->o.lr_find);
    case JOB_VALIDATE:
        return cf_validate_(learn, job->values, &job->o.validate);
    case JOB_GET_PREDS:
        return cf_get_preds_(learn, &job->preds, &job->o.get_preds);
    }
    return cf_fail(CF_ERR_INVALID, "unknown parallel job");
}

static cf_status set_shards(cf_learner *learn, int rank, int world, cf_shard_mode mode) {
    cf_status st = cf_dataloader_set_shard(learn->dls->train, rank, world, mode);
    if (st == CF_OK && learn->dls->valid)
        st = cf_dataloader_set_shard(learn->dls->valid, rank, world, mode);
    learn->shard_rank = rank;
    learn->shard_world = world;
    learn->shard_mode = mode;
    return st;
}

/* Makes the learner one replica of comm's group, runs the job, and makes it a single-process
 * learner again. The call's callbacks (and master callbacks on rank 0) are taken over. */
static cf_status run_replica(cf_learner *learn, cf_comm *comm, par_job *job,
                             cf_callback **master_cbs, int n_master) {
    int rank = cf_comm_rank(comm), world = cf_comm_size(comm);
    bool is_master = rank == 0;
    cf_shard_mode mode = job->par->split_batch ? CF_SHARD_SPLIT_BATCH : CF_SHARD_PER_RANK;
    int n_all = job->n_cbs + (is_master ? n_master : 0);
    cf_callback **all = cf_calloc((size_t)n_all + 1, sizeof *all);
    /* The parallel callback joins the learner itself for the call, so that it runs in every fit
     * a method makes (fine_tune's two phases); the call's callbacks go with the call. */
    cf_callback *pcb = parallel_cb(comm, job->par->split_batch);
    cf_status st = all && pcb ? CF_OK : CF_ERR_NOMEM;
    if (st == CF_OK) {
        st = cf_learner_add_cb(learn, pcb); /* frees pcb on failure */
        pcb = NULL;
    }
    int n = 0;
    if (st == CF_OK) {
        for (int i = 0; i < job->n_cbs; i++) all[n++] = job->cbs[i];
        for (int i = 0; i < n_master; i++) {
            if (is_master)
                all[n++] = master_cbs[i];
            else
                cf_callback_free(master_cbs[i]);
        }
    } else {
        cf_callback_free(pcb);
        for (int i = 0; i < job->n_cbs; i++) cf_callback_free(job->cbs[i]);
        for (int i = 0; i < n_master; i++) cf_callback_free(master_cbs[i]);
        cf_free(all);
        return st;
    }
    set_cbs(job, all, n);
    bool was_master = learn->is_master;
    learn->comm = comm;
    learn->is_master = is_master;
    learn->sync_cancel = sync_cancel;
    learn->agree_any = agree_any;
    st = set_shards(learn, rank, world, mode);
    if (st == CF_OK) {
        st = run_method(learn, job);
    } else {
        for (int i = 0; i < n; i++) cf_callback_free(all[i]);
    }
    cf_free(all);
    cf_learner_remove_cb(learn, "ParallelCallback");
    /* get_preds: each replica filled its own rows (padding excluded): sums give every row. */
    if (st == CF_OK && job->kind == JOB_GET_PREDS && world > 1) {
        cf_preds *p = &job->preds;
        st = cf_comm_allreduce_sum_f32(comm, p->preds.data, cf_tensor_numel(&p->preds));
        if (st == CF_OK)
            st = cf_comm_allreduce_sum_f32(comm, p->targs.data, cf_tensor_numel(&p->targs));
        if (st == CF_OK && p->inputs.data)
            st = cf_comm_allreduce_sum_f32(comm, p->inputs.data, cf_tensor_numel(&p->inputs));
        if (st == CF_OK && p->losses) st = cf_comm_allreduce_sum_f32(comm, p->losses, (size_t)p->n);
        if (st == CF_OK && p->decoded) {
            double *d = cf_calloc((size_t)p->n + 1, sizeof *d);
            if (!d) st = CF_ERR_NOMEM;
            for (int64_t i = 0; st == CF_OK && i < p->n; i++) d[i] = (double)p->decoded[i];
            if (st == CF_OK) st = cf_comm_allreduce_sum_f64(comm, d, (size_t)p->n);
            for (int64_t i = 0; st == CF_OK && i < p->n; i++) p->decoded[i] = (int64_t)d[i];
            cf_free(d);
        }
    }
    cf_status restore = set_shards(learn, 0, 1, CF_SHARD_PER_RANK);
    learn->comm = NULL;
    learn->is_master = was_master;
    learn->sync_cancel = NULL;
    learn->agree_any = NULL;
    return st != CF_OK ? st : restore;
}

/* ---- what comes home: a flat byte stream in the results area ------------------------------- */

typedef struct stream {
    unsigned char *p;
    size_t cap, at;
    bool overflow;
} stream;

static void put(stream *s, const void *data, size_t n) {
    if (s->overflow || n > s->cap - s->at) {
        s->overflow = true;
        return;
    }
    if (n) memcpy(s->p + s->at, data, n);
    s->at += n;
}
static void put_i64(stream *s, int64_t v) {
    put(s, &v, sizeof v);
}
static void put_doubles(stream *s, const double *v, int64_t n) {
    put_i64(s, n);
    put(s, v, (size_t)n * sizeof *v);
}
static void put_str(stream *s, const char *str) {
    int64_t n = (int64_t)strlen(str);
    put_i64(s, n);
    put(s, str, (size_t)n);
}

static bool get(stream *s, void *data, size_t n) {
    if (s->overflow || n > s->cap - s->at) {
        s->overflow = true;
        return false;
    }
    if (n) memcpy(data, s->p + s->at, n);
    s->at += n;
    return true;
}
static int64_t get_i64(stream *s) {
    int64_t v = 0;
    get(s, &v, sizeof v);
    return v;
}
/* Allocates and reads an array written by put_doubles. */
static double *get_doubles(stream *s, int64_t *n) {
    *n = get_i64(s);
    if (*n < 0 || (size_t)*n > (s->cap - s->at) / sizeof(double)) {
        s->overflow = true;
        *n = 0;
        return NULL;
    }
    double *v = cf_calloc((size_t)*n + 1, sizeof *v);
    if (v) get(s, v, (size_t)*n * sizeof *v);
    return v;
}
static char *get_str(stream *s) {
    int64_t n = get_i64(s);
    if (n < 0 || (size_t)n > s->cap - s->at) {
        s->overflow = true;
        return NULL;
    }
    char *str = cf_calloc((size_t)n + 1, 1);
    if (str) get(s, str, (size_t)n);
    return str;
}

#define HOME_MAGIC 0x636f726566697401LL /* "corefit" v1 */

static void put_recorder(stream *s, const cf_recorder *r) {
    put_doubles(s, r->lrs, r->n_batches);
    put_doubles(s, r->moms, r->n_batches);
    put_doubles(s, r->losses, r->n_batches);
    put_doubles(s, r->hp_lr, r->n_hps);
    put_doubles(s, r->hp_mom, r->n_hps);
    put_i64(s, r->n_epochs);
    put_i64(s, r->n_values);
    put(s, r->values, (size_t)r->n_epochs * r->n_values * sizeof(double));
    put(s, r->iters, (size_t)r->n_epochs * sizeof(int64_t));
    put(s, r->times, (size_t)r->n_epochs * sizeof(double));
    put_i64(s, r->n_names);
    for (int i = 0; i < r->n_names; i++) put_str(s, r->metric_names[i]);
    put(s, &r->smooth_val, sizeof r->smooth_val);
    put_i64(s, r->smooth_count);
}

static cf_status get_recorder(stream *s, cf_recorder *r) {
    memset(r, 0, sizeof *r);
    int64_t n;
    r->lrs = get_doubles(s, &r->n_batches);
    r->moms = get_doubles(s, &n);
    r->losses = get_doubles(s, &n);
    r->hp_lr = get_doubles(s, &r->n_hps);
    r->hp_mom = get_doubles(s, &n);
    r->batch_capacity = r->n_batches > r->n_hps ? r->n_batches : r->n_hps;
    r->n_epochs = (int)get_i64(s);
    r->n_values = (int)get_i64(s);
    if (r->n_epochs < 0 || r->n_values < 0 || r->n_epochs > 1000000 || r->n_values > 10000)
        s->overflow = true;
    if (!s->overflow) {
        r->epoch_capacity = r->n_epochs;
        r->values = cf_calloc((size_t)r->n_epochs * r->n_values + 1, sizeof(double));
        r->iters = cf_calloc((size_t)r->n_epochs + 1, sizeof(int64_t));
        r->times = cf_calloc((size_t)r->n_epochs + 1, sizeof(double));
        if (r->values && r->iters && r->times) {
            get(s, r->values, (size_t)r->n_epochs * r->n_values * sizeof(double));
            get(s, r->iters, (size_t)r->n_epochs * sizeof(int64_t));
            get(s, r->times, (size_t)r->n_epochs * sizeof(double));
        }
    }
    int64_t names = get_i64(s);
    if (names < 0 || names > 10000) s->overflow = true;
    if (!s->overflow) {
        r->metric_names = cf_calloc((size_t)names + 1, sizeof(char *));
        for (int64_t i = 0; r->metric_names && i < names && !s->overflow; i++) {
            r->metric_names[i] = get_str(s);
            r->n_names++;
        }
    }
    get(s, &r->smooth_val, sizeof r->smooth_val);
    r->smooth_count = get_i64(s);
    bool ok = !s->overflow && r->lrs && r->moms && r->losses && r->hp_lr && r->hp_mom &&
              r->values && r->iters && r->times && r->metric_names;
    for (int i = 0; ok && i < r->n_names; i++) ok = r->metric_names[i] != NULL;
    if (!ok) {
        cf_recorder_clear(r);
        return cf_fail(CF_ERR_WORKER, "the results from the workers are incomplete");
    }
    return CF_OK;
}

/* Rank 0 writes the learner state (weights, buffers, optimizer, freezing, Recorder, figures)
 * and the job's outputs. */
static cf_status write_home(cf_learner *learn, par_job *job, cf_status outcome,
                            const char *outcome_msg, void *area, size_t bytes) {
    stream s = {area, bytes, 0, false};
    cf_model *m = learn->model;
    put_i64(&s, HOME_MAGIC);
    /* the outcome: CF_OK, or CF_ERR_NONFINITE with its message (the state is the last good) */
    put_i64(&s, outcome);
    put_str(&s, outcome_msg);
    put_i64(&s, (int64_t)m->n_weights);
    put(&s, m->weights, m->n_weights * sizeof(float));
    put_i64(&s, (int64_t)m->n_buffers);
    put(&s, m->buffers, m->n_buffers * sizeof(float));
    for (int i = 0; i < m->n_params; i++) put(&s, &m->params[i]->trainable, sizeof(bool));
    cf_optimizer *opt = learn->opt;
    put_i64(&s, opt != NULL);
    if (opt) {
        put_i64(&s, opt->n_groups);
        put(&s, opt->hypers, (size_t)opt->n_groups * sizeof *opt->hypers);
        put_i64(&s, opt->grad_avg != NULL);
        if (opt->grad_avg) put(&s, opt->grad_avg, m->n_weights * sizeof(float));
        put_i64(&s, opt->sqr_avg != NULL);
        if (opt->sqr_avg) put(&s, opt->sqr_avg, m->n_weights * sizeof(float));
        put(&s, opt->steps, (size_t)m->n_params * sizeof(float));
    }
    put_recorder(&s, &learn->recorder);
    put_doubles(&s, learn->final_record, learn->final_record ? learn->n_final_record : 0);
    put_i64(&s, learn->n_figures);
    for (int i = 0; i < learn->n_figures; i++) put_str(&s, learn->figures[i]);
    if (job->kind == JOB_LR_FIND) {
        cf_lr_find_result *r = &job->lr_result;
        put_doubles(&s, r->lrs, r->n);
        put_doubles(&s, r->losses, r->n);
        put(&s, r, sizeof *r); /* the scalars (pointers are ignored on reading) */
    }
    if (job->kind == JOB_GET_PREDS) {
        cf_preds *p = &job->preds;
        put(&s, p, sizeof *p);
        put(&s, p->preds.data, cf_tensor_numel(&p->preds) * sizeof(float));
        put(&s, p->targs.data, cf_tensor_numel(&p->targs) * sizeof(float));
        if (p->inputs.data) put(&s, p->inputs.data, cf_tensor_numel(&p->inputs) * sizeof(float));
        if (p->decoded) put(&s, p->decoded, (size_t)p->n * sizeof(int64_t));
        if (p->losses) put(&s, p->losses, (size_t)p->n * sizeof(float));
    }
    if (s.overflow)
        return cf_fail(CF_ERR_NOMEM, "the results (%zu bytes so far) do not fit the %zu-byte area",
                       s.at, bytes);
    return CF_OK;
}

/* The caller's side: everything is read and checked into temporaries first, then committed,
 * so a malformed area leaves the learner as it was. */
static cf_status read_home(cf_learner *learn, par_job *job, void *area, size_t bytes) {
    stream s = {area, bytes, 0, false};
    cf_model *m = learn->model;
    if (get_i64(&s) != HOME_MAGIC) return cf_fail(CF_ERR_WORKER, "no results came home");
    cf_status outcome = (cf_status)get_i64(&s);
    char outcome_msg[1024];
    char *msg = get_str(&s);
    if (!msg) return cf_fail(CF_ERR_WORKER, "the results from the workers are incomplete");
    snprintf(outcome_msg, sizeof outcome_msg, "%s", msg);
    cf_free(msg);
    if (get_i64(&s) != (int64_t)m->n_weights)
        return cf_fail(CF_ERR_WORKER, "results: weight count differs");
    const float *weights = (const float *)(s.p + s.at);
    s.at += m->n_weights * sizeof(float);
    if (get_i64(&s) != (int64_t)m->n_buffers)
        return cf_fail(CF_ERR_WORKER, "results: buffer count differs");
    const float *buffers = (const float *)(s.p + s.at);
    s.at += m->n_buffers * sizeof(float);
    const bool *trainable = (const bool *)(s.p + s.at);
    s.at += (size_t)m->n_params * sizeof(bool);
    cf_status st = CF_OK;
    cf_optimizer *opt = NULL;
    if (get_i64(&s)) {
        st = cf_optimizer_new(&opt, m, &learn->opt_config);
        if (st != CF_OK) return st;
        int64_t groups = get_i64(&s);
        if (groups != opt->n_groups) {
            cf_optimizer_free(opt);
            return cf_fail(CF_ERR_WORKER, "results: %lld parameter groups, expected %d",
                           (long long)groups, opt->n_groups);
        }
        get(&s, opt->hypers, (size_t)groups * sizeof *opt->hypers);
        if (get_i64(&s)) {
            if (opt->grad_avg)
                get(&s, opt->grad_avg, m->n_weights * sizeof(float));
            else
                s.at += m->n_weights * sizeof(float);
        }
        if (get_i64(&s)) {
            if (opt->sqr_avg)
                get(&s, opt->sqr_avg, m->n_weights * sizeof(float));
            else
                s.at += m->n_weights * sizeof(float);
        }
        get(&s, opt->steps, (size_t)m->n_params * sizeof(float));
    }
    cf_recorder rec;
    if ((st = get_recorder(&s, &rec)) != CF_OK) {
        cf_optimizer_free(opt);
        return st;
    }
    int64_t n_final = 0;
    double *final = get_doubles(&s, &n_final);
    int64_t n_fig = get_i64(&s);
    char **figs = n_fig >= 0 && n_fig < 100000 ? cf_calloc((size_t)n_fig + 1, sizeof *figs) : NULL;
    for (int64_t i = 0; figs && i < n_fig; i++) figs[i] = get_str(&s);
    cf_lr_find_result lr = {0};
    if (job->kind == JOB_LR_FIND) {
        int64_t n1, n2;
        double *lrs = get_doubles(&s, &n1), *losses = get_doubles(&s, &n2);
        get(&s, &lr, sizeof lr);
        lr.lrs = lrs;
        lr.losses = losses;
        lr.n = (int)n1;
    }
    cf_preds preds = {0};
    if (job->kind == JOB_GET_PREDS && get(&s, &preds, sizeof preds)) {
        cf_preds p = preds;
        memset(&preds, 0, sizeof preds);
        preds.n = p.n;
        preds.preds.shape = p.preds.shape;
        preds.targs.shape = p.targs.shape;
        preds.inputs.shape = p.inputs.shape;
        size_t np = cf_tensor_numel(&p.preds), nt = cf_tensor_numel(&p.targs);
        preds.preds.data = cf_malloc(np * sizeof(float) + 1);
        preds.targs.data = cf_malloc(nt * sizeof(float) + 1);
        if (preds.preds.data) get(&s, preds.preds.data, np * sizeof(float));
        if (preds.targs.data) get(&s, preds.targs.data, nt * sizeof(float));
        if (p.inputs.data) {
            size_t ni = cf_tensor_numel(&p.inputs);
            preds.inputs.data = cf_malloc(ni * sizeof(float) + 1);
            if (preds.inputs.data) get(&s, preds.inputs.data, ni * sizeof(float));
        }
        if (p.decoded) {
            preds.decoded = cf_malloc((size_t)p.n * sizeof(int64_t) + 1);
            if (preds.decoded) get(&s, preds.decoded, (size_t)p.n * sizeof(int64_t));
        }
        if (p.losses) {
            preds.losses = cf_malloc((size_t)p.n * sizeof(float) + 1);
            if (preds.losses) get(&s, preds.losses, (size_t)p.n * sizeof(float));
        }
    }
    bool ok = !s.overflow && final && figs;
    for (int64_t i = 0; ok && i < n_fig; i++) ok = figs[i] != NULL;
    if (!ok) {
        cf_optimizer_free(opt);
        cf_recorder_clear(&rec);
        cf_free(final);
        for (int64_t i = 0; figs && i < n_fig; i++) cf_free(figs[i]);
        cf_free(figs);
        cf_lr_find_result_free(&lr);
        cf_preds_free(&preds);
        return cf_fail(CF_ERR_WORKER, "the results from the workers are incomplete");
    }
    /* commit */
    memcpy(m->weights, weights, m->n_weights * sizeof(float));
    memcpy(m->buffers, buffers, m->n_buffers * sizeof(float));
    for (int i = 0; i < m->n_params; i++) m->params[i]->trainable = trainable[i];
    if (opt) {
        cf_optimizer_free(learn->opt);
        learn->opt = opt;
    }
    cf_recorder_clear(&learn->recorder);
    learn->recorder = rec;
    cf_free(learn->final_record);
    learn->final_record = final;
    learn->n_final_record = (int)n_final;
    for (int64_t i = 0; i < n_fig; i++) {
        if (cf_learner_note_figure(learn, figs[i]) != CF_OK) break;
    }
    for (int64_t i = 0; i < n_fig; i++) cf_free(figs[i]);
    cf_free(figs);
    job->lr_result = lr;
    job->preds = preds;
    if (job->values && final) memcpy(job->values, final, (size_t)n_final * sizeof(double));
    return outcome == CF_OK ? CF_OK : cf_fail(outcome, "%s", outcome_msg);
}

/* ---- launching ----------------------------------------------------------------------------- */

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

typedef struct worker_ctx {
    cf_learner *learn;
    par_job *job;
    cf_callback **master_cbs;
    int n_master;
} worker_ctx;

static cf_status worker_main(cf_comm *comm, void *vctx) {
    worker_ctx *w = vctx;
    /* A worker that crashes must die of it, whatever handlers the caller installed (a test
     * framework's, a crash reporter's): the supervisor then reports the signal. */
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++) signal(fatal[i], SIG_DFL);
    cf_learner *learn = w->learn;
    par_job *job = w->job;
    /* The caller's figures are the caller's: the worker reports only what it writes now. */
    learn->n_figures = 0;
    learn->figures = NULL;
    cf_status st = run_replica(learn, comm, job, w->master_cbs, w->n_master);
    /* A fit that every replica stopped alike on a non-finite loss (TerminateOnNaN agrees across
     * replicas) brings its last good state home, with the error. */
    cf_status outcome = CF_OK;
    char outcome_msg[1024] = "";
    if (st == CF_ERR_NONFINITE) {
        outcome = st;
        snprintf(outcome_msg, sizeof outcome_msg, "%s", cf_last_error());
        st = CF_OK;
    }
    if (st != CF_OK) return st;
    if (cf_comm_rank(comm) == 0) {
        size_t bytes = 0;
        void *area = cf_comm_results(comm, &bytes);
        st = write_home(learn, job, outcome, outcome_msg, area, bytes);
    }
    if (st == CF_OK) st = cf_comm_barrier(comm);
    return st;
}

static size_t results_size(const cf_learner *learn) {
    const cf_model *m = learn->model;
    size_t model = (m->n_weights * 3 + m->n_buffers + (size_t)m->n_params * 2) * sizeof(float);
    size_t data = 0;
    const cf_dataset *sets[2] = {learn->dls->train_ds, learn->dls->valid_ds};
    for (int i = 0; i < 2; i++)
        if (sets[i])
            data += (size_t)sets[i]->n *
                    (cf_shape_numel(&sets[i]->sample_shape) + (size_t)sets[i]->target_dim + 4) *
                    sizeof(float);
    /* Reserved, not committed: only the pages written cost memory. */
    return model + data + ((size_t)1 << 30);
}

/* Rank 0's model (and, after a fit, optimizer state) on every rank. */
static cf_status share_state(cf_learner *learn, cf_comm *comm, bool with_opt) {
    cf_model *m = learn->model;
    cf_status st = cf_comm_broadcast(comm, m->weights, m->n_weights * sizeof(float), 0);
    if (st == CF_OK && m->n_buffers)
        st = cf_comm_broadcast(comm, m->buffers, m->n_buffers * sizeof(float), 0);
    cf_optimizer *opt = learn->opt;
    if (with_opt && opt) {
        size_t bytes = m->n_weights * sizeof(float);
        if (st == CF_OK && opt->grad_avg) st = cf_comm_broadcast(comm, opt->grad_avg, bytes, 0);
        if (st == CF_OK && opt->sqr_avg) st = cf_comm_broadcast(comm, opt->sqr_avg, bytes, 0);
    }
    return st;
}

/* SPMD under mpirun: this process is one rank and its learner one replica. Every rank starts
 * from rank 0's model (ranks may have built theirs differently), runs the method with one
 * thread when it shares its machine (binding to cores is mpirun's), agrees with the others on
 * the outcome, and on success ends with rank 0's state. */
static cf_status par_run_mpi(cf_learner *learn, cf_comm *comm, par_job *job, cf_callback **master,
                             int n_master) {
    const cf_par_opts *par = job->par;
    cf_mpi_begin_job(comm, par->deadline_s);
    cf_status st = CF_OK;
    if (par->num_cores != 0 && par->num_cores != cf_comm_size(comm))
        st = cf_fail(CF_ERR_INVALID,
                     "start_method mpi: num_cores is %d but the MPI world has %d ranks (mpirun -np "
                     "sets the world; pass 0)",
                     par->num_cores, cf_comm_size(comm));
    if (st == CF_OK) st = share_state(learn, comm, false);
    if (st == CF_OK) {
        int threads = cf_get_num_threads();
        if (cf_comm_local_size(comm) > 1) cf_set_num_threads(1);
        st = run_replica(learn, comm, job, master, n_master);
        cf_set_num_threads(threads);
    } else {
        for (int i = 0; i < job->n_cbs; i++) cf_callback_free(job->cbs[i]);
        for (int i = 0; i < n_master; i++) cf_callback_free(master[i]);
    }
    st = cf_mpi_agree(comm, st);
    bool fit = job->kind != JOB_LR_FIND && job->kind != JOB_VALIDATE && job->kind != JOB_GET_PREDS;
    if (st == CF_OK) st = share_state(learn, comm, fit);
    if (st != CF_OK) {
        cf_preds_free(&job->preds);
        cf_lr_find_result_free(&job->lr_result);
    }
    return st;
}

static cf_status par_run(cf_learner *learn, par_job *job) {
    const cf_par_opts *par = job->par;
    cf_callback **master = par->master_cbs;
    int n_master = par->n_master_cbs;
    cf_status st = CF_OK;
    if (par->num_cores < 0) st = cf_fail(CF_ERR_INVALID, "num_cores %d < 0", par->num_cores);
    cf_start_method method = par->start_method;
    if (method == CF_START_AUTO) method = cf_mpi_launched() ? CF_START_MPI : CF_START_FORK;
    if (st == CF_OK && method == CF_START_MPI) {
        cf_comm *comm = NULL;
        st = cf_par_mpi_comm(&comm);
        if (st == CF_OK) return par_run_mpi(learn, comm, job, master, n_master);
    }
    if (st != CF_OK) {
        for (int i = 0; i < job->n_cbs; i++) cf_callback_free(job->cbs[i]);
        for (int i = 0; i < n_master; i++) cf_callback_free(master[i]);
        return st;
    }
    worker_ctx w = {learn, job, master, n_master};
    cf_launch_options lo = {.num_workers = par->num_cores,
                            .deadline_s = par->deadline_s > 0 ? par->deadline_s : 120,
                            .results_bytes = results_size(learn),
                            .pin_cores = true};
    cf_results res = {0};
    st = cf_launch_fork(&lo, worker_main, &w, &res);
    /* The workers took over copies of the call's callbacks; the caller's copies go now. */
    for (int i = 0; i < job->n_cbs; i++) cf_callback_free(job->cbs[i]);
    for (int i = 0; i < n_master; i++) cf_callback_free(master[i]);
    if (st == CF_OK) st = read_home(learn, job, res.data, res.bytes);
    cf_results_release(&res);
    return st;
}

/* ---- the twins ----------------------------------------------------------------------------- */

#define PAR_TWIN(kind_, field_, learn_, n_, n2_, opts_)                                            \
    par_job job = {.kind = (kind_),                                                                \
                   .n = (n_),                                                                      \
                   .n2 = (n2_),                                                                    \
                   .par = &(opts_)->par,                                                           \
                   .cbs = (opts_)->cbs,                                                            \
                   .n_cbs = (opts_)->n_cbs};                                                       \
    job.o.field_ = *(opts_);                                                                       \
    return par_run((learn_), &job)

cf_status cf_par_fit_(cf_learner *learn, int n_epoch, const cf_fit_opts *o) {
    PAR_TWIN(JOB_FIT, fit, learn, n_epoch, 0, o);
}
cf_status cf_par_fit_one_cycle_(cf_learner *learn, int n_epoch, const cf_one_cycle_opts *o) {
    PAR_TWIN(JOB_ONE_CYCLE, one_cycle, learn, n_epoch, 0, o);
}
cf_status cf_par_fit_flat_cos_(cf_learner *learn, int n_epoch, const cf_flat_cos_opts *o) {
    PAR_TWIN(JOB_FLAT_COS, flat_cos, learn, n_epoch, 0, o);
}
cf_status cf_par_fit_sgdr_(cf_learner *learn, int n_cycles, int cycle_len, const cf_sgdr_opts *o) {
    PAR_TWIN(JOB_SGDR, sgdr, learn, n_cycles, cycle_len, o);
}
cf_status cf_par_fine_tune_(cf_learner *learn, int epochs, const cf_fine_tune_opts *o) {
    PAR_TWIN(JOB_FINE_TUNE, fine_tune, learn, epochs, 0, o);
}

cf_status cf_par_lr_find_(cf_learner *learn, cf_lr_find_result *result, const cf_lr_find_opts *o) {
    memset(result, 0, sizeof *result);
    par_job job = {.kind = JOB_LR_FIND, .par = &o->par, .cbs = o->cbs, .n_cbs = o->n_cbs};
    job.o.lr_find = *o;
    cf_status st = par_run(learn, &job);
    if (st == CF_OK) *result = job.lr_result;
    return st;
}

cf_status cf_par_validate_(cf_learner *learn, double *values, const cf_validate_opts *o) {
    par_job job = {
        .kind = JOB_VALIDATE, .par = &o->par, .cbs = o->cbs, .n_cbs = o->n_cbs, .values = values};
    job.o.validate = *o;
    return par_run(learn, &job);
}

cf_status cf_par_get_preds_(cf_learner *learn, cf_preds *out, const cf_get_preds_opts *o) {
    memset(out, 0, sizeof *out);
    par_job job = {.kind = JOB_GET_PREDS, .par = &o->par, .cbs = o->cbs, .n_cbs = o->n_cbs};
    job.o.get_preds = *o;
    cf_status st = par_run(learn, &job);
    if (st == CF_OK) *out = job.preds;
    return st;
}
