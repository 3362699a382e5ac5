/* fastai's CSVLogger (callback/progress.py), GradientClip and GradientAccumulation
 * (callback/training.py). */
#include "corefit/learn.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void free_with_state(cf_callback *cb) {
    if (!cb) return;
    cf_free(cb->state);
    cf_free(cb);
}

static cf_callback *callback_new(const char *name, int order, void *state,
                                 void (*free_fn)(cf_callback *)) {
    cf_callback *cb = cf_calloc(1, sizeof *cb);
    if (!cb) return NULL;
    cb->name = name;
    cb->order = order;
    cb->state = state;
    cb->free = free_fn;
    cb->running = true;
    return cb;
}

/* ---- CSVLogger ----------------------------------------------------------------------------- */

/* The log is appended to as the fit goes (flushed every epoch, as fastai's fsync'd lines), so
 * it is written in place rather than through a temporary file. */
typedef struct csv_logger {
    char *fname;
    bool append;
    FILE *f;
    char path[4096];
} csv_logger;

static void csv_close(csv_logger *c) {
    if (c->f) fclose(c->f);
    c->f = NULL;
}

static cf_status csv_before_fit(cf_callback *cb, cf_learner *learn) {
    csv_logger *c = cb->state;
    csv_close(c); /* a fit that failed before after_fit left it open */
    if (!learn->replica.is_master || !learn->logging || learn->in_lr_find) return CF_OK;
    const char *base = learn->path && *learn->path ? learn->path : ".";
    int n = c->fname[0] == '/' ? snprintf(c->path, sizeof c->path, "%s", c->fname)
                               : snprintf(c->path, sizeof c->path, "%s/%s", base, c->fname);
    if (n < 0 || (size_t)n >= sizeof c->path)
        return cf_fail(CF_ERR_INVALID, "CSVLogger: path too long: %s/%s", base, c->fname);
    if (c->fname[0] != '/' && mkdir(base, 0755) != 0 && errno != EEXIST)
        return cf_fail(CF_ERR_IO, "CSVLogger: cannot create folder %s: %s", base, strerror(errno));
    c->f = fopen(c->path, c->append ? "a" : "w");
    if (!c->f) return cf_fail(CF_ERR_IO, "CSVLogger: cannot open %s: %s", c->path, strerror(errno));
    const cf_recorder *rec = &learn->recorder;
    for (int j = 0; j < rec->n_names; j++)
        fprintf(c->f, "%s%s", j ? "," : "", rec->metric_names[j] ? rec->metric_names[j] : "");
    fputc('\n', c->f);
    if (fflush(c->f) != 0) return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s", c->path);
    return CF_OK;
}

static cf_status csv_after_epoch(cf_callback *cb, cf_learner *learn) {
    csv_logger *c = cb->state;
    const cf_recorder *rec = &learn->recorder;
    if (!c->f || !learn->logging || rec->n_epochs < 1) return CF_OK;
    int e = rec->n_epochs - 1;
    char t[48];
    fprintf(c->f, "%d", learn->epoch);
    for (int j = 0; j < rec->n_values; j++)
        fprintf(c->f, ",%s",
                cf_format_float(rec->values[(size_t)e * (size_t)rec->n_values + (size_t)j], t,
                                sizeof t));
    fprintf(c->f, ",%s\n", cf_format_time(rec->times ? rec->times[e] : 0, t, sizeof t));
    if (fflush(c->f) != 0) return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s", c->path);
    return CF_OK;
}

static cf_status csv_after_fit(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    csv_close(cb->state);
    return CF_OK;
}

static void csv_free(cf_callback *cb) {
    if (!cb) return;
    csv_logger *c = cb->state;
    if (c) {
        csv_close(c);
        cf_free(c->fname);
    }
    cf_free(c);
    cf_free(cb);
}

cf_callback *cf_csv_logger_cb(const char *path, bool append) {
    csv_logger *c = cf_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fname = cf_strdup(path && *path ? path : "history.csv");
    c->append = append;
    cf_callback *cb = c->fname ? callback_new("CSVLogger", 60, c, csv_free) : NULL;
    if (!cb) {
        cf_free(c->fname);
        cf_free(c);
        return NULL;
    }
    cb->on[CF_EV_BEFORE_FIT] = csv_before_fit;
    cb->on[CF_EV_AFTER_EPOCH] = csv_after_epoch;
    cb->on[CF_EV_AFTER_FIT] = csv_after_fit;
    return cb;
}

/* ---- GradientClip -------------------------------------------------------------------------- */

/* torch.nn.utils.clip_grad_norm_(params, max_norm, 2): total = ||all grads||_2, and every
 * gradient is multiplied by min(1, max_norm / (total + 1e-6)). */
static cf_status clip_before_step(cf_callback *cb, cf_learner *learn) {
    double max_norm = *(double *)cb->state;
    const cf_model *model = learn->model;
    double sq = 0;
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (!p->grad || !p->trainable) continue;
        double s = 0;
        for (size_t k = 0; k < p->numel; k++) s += (double)p->grad[k] * p->grad[k];
        sq += s;
    }
    double coef = max_norm / (sqrt(sq) + 1e-6);
    if (!(coef < 1.0)) return CF_OK; /* also leaves NaN norms alone for TerminateOnNaN */
    float c = (float)coef;
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (!p->grad || !p->trainable) continue;
        for (size_t k = 0; k < p->numel; k++) p->grad[k] *= c;
    }
    return CF_OK;
}

cf_callback *cf_gradient_clip_cb(double max_norm) {
    double *state = cf_malloc(sizeof *state);
    if (!state) return NULL;
    *state = max_norm > 0 ? max_norm : 1.0;
    /* fastai: MixedPrecision.order + 1 */
    cf_callback *cb = callback_new("GradientClip", CF_ORDER_GRAD_CLIP, state, free_with_state);
    if (!cb) {
        cf_free(state);
        return NULL;
    }
    cb->skip_valid = true;
    cb->on[CF_EV_BEFORE_STEP] = clip_before_step;
    return cb;
}

/* ---- GradientAccumulation ------------------------------------------------------------------ */

/* Current fastai: after_loss divides loss_grad by n_acc / bs, so the accumulated gradient is
 * the sum over the accumulated batches of bs/n_acc times each batch's mean-loss gradient (the
 * gradient of the mean loss over n_acc samples when batches are full); before_step counts the
 * samples and raises CancelBatchException (no step, no zero_grad) until n_acc were seen. The
 * recorded loss is not scaled. Batch sizes are the rows of this process's batch (fastai's
 * find_bs). */
typedef struct grad_acc {
    int n_acc;
    int64_t count;
} grad_acc;

static cf_status acc_before_fit(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    ((grad_acc *)cb->state)->count = 0;
    return CF_OK;
}

static cf_status acc_after_loss(cf_callback *cb, cf_learner *learn) {
    grad_acc *a = cb->state;
    int bs = learn->batch ? learn->batch->size : 0;
    learn->loss_grad_scale = (float)((double)bs / (double)a->n_acc);
    return CF_OK;
}

static cf_status acc_before_step(cf_callback *cb, cf_learner *learn) {
    grad_acc *a = cb->state;
    a->count += learn->batch ? learn->batch->size : 0;
    if (a->count < a->n_acc)
        cf_learner_cancel(learn, CF_CANCEL_BATCH); /* skip step and zero_grad */
    else
        a->count = 0;
    return CF_OK;
}

static cf_status acc_after_fit(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->loss_grad_scale = 1.0f;
    return CF_OK;
}

cf_callback *cf_gradient_accumulation_cb(int n_acc) {
    grad_acc *a = cf_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->n_acc = n_acc > 0 ? n_acc : 32;
    /* fastai: MixedPrecision.order - 4 */
    cf_callback *cb =
        callback_new("GradientAccumulation", CF_ORDER_GRAD_ACCUMULATION, a, free_with_state);
    if (!cb) {
        cf_free(a);
        return NULL;
    }
    cb->skip_valid = true;
    cb->on[CF_EV_BEFORE_FIT] = acc_before_fit;
    cb->on[CF_EV_AFTER_LOSS] = acc_after_loss;
    cb->on[CF_EV_BEFORE_STEP] = acc_before_step;
    cb->on[CF_EV_AFTER_FIT] = acc_after_fit;
    cb->on[CF_EV_AFTER_CANCEL_FIT] = acc_after_fit;
    return cb;
}
