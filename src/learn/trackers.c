/* fastai's tracker callbacks (callback/tracker.py): SaveModelCallback, EarlyStoppingCallback,
 * ReduceLROnPlateau, and TerminateOnNaNCallback.
 *
 * A tracker reads the monitored value from the Recorder's last row (metric_names[1:] are the
 * columns: train_loss, valid_loss, metrics) after the Recorder's after_epoch (trackers run at
 * orders 61-63, the Recorder at 50). Trackers sit out lr_find, validate and get_preds (fastai
 * skips them when an LRFinder or GatherPreds is present), i.e. whenever learn->in_lr_find or
 * !learn->logging at before_fit. */
#include "corefit/learn.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "learn/internal.h"

typedef enum tracker_kind { TK_SAVE_MODEL, TK_EARLY_STOPPING, TK_REDUCE_LR } tracker_kind;

typedef struct tracker {
    tracker_kind kind;
    char monitor[64];
    char fname[256];
    double min_delta;
    int patience;
    double factor, min_lr;
    bool every_epoch, with_opt, at_end;
    int comp;
    /* per fit */
    bool active, lower, new_best, saved;
    int idx, wait;
    double best;
} tracker;

static const char *tracker_name(tracker_kind k) {
    return k == TK_SAVE_MODEL       ? "SaveModelCallback"
           : k == TK_EARLY_STOPPING ? "EarlyStoppingCallback"
                                    : "ReduceLROnPlateau";
}

static bool speaks(const cf_learner *learn) {
    return learn->replica.is_master && !learn->quiet;
}

static bool lower_is_better(const tracker *t, const cf_learner *learn) {
    if (t->comp) return t->comp < 0;
    if (strstr(t->monitor, "loss") || strstr(t->monitor, "error")) return true;
    for (int i = 0; i < learn->n_metrics; i++)
        if (learn->metrics[i] && strcmp(learn->metrics[i]->name, t->monitor) == 0)
            return learn->metrics[i]->lower_is_better;
    return false;
}

static cf_status tr_before_fit(cf_callback *cb, cf_learner *learn) {
    tracker *t = cb->state;
    t->active = !learn->in_lr_find && learn->logging;
    t->wait = 0;
    t->new_best = false;
    t->saved = false;
    if (!t->active) return CF_OK;
    const cf_recorder *rec = &learn->recorder;
    t->idx = -1;
    for (int j = 1; j + 1 < rec->n_names && j - 1 < rec->n_values; j++)
        if (rec->metric_names[j] && strcmp(rec->metric_names[j], t->monitor) == 0) t->idx = j - 1;
    if (t->idx < 0) {
        char names[512] = "";
        size_t k = 0;
        for (int j = 1; j + 1 < rec->n_names && k < sizeof names; j++)
            k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", j > 1 ? ", " : "",
                                  rec->metric_names[j] ? rec->metric_names[j] : "?");
        return cf_fail(CF_ERR_INVALID, "%s: monitor '%s' is not a recorded value (%s)",
                       tracker_name(t->kind), t->monitor, names);
    }
    t->lower = lower_is_better(t, learn);
    t->best = t->lower ? INFINITY : -INFINITY; /* reset_on_fit */
    return CF_OK;
}

/* TrackerCallback.after_epoch: compares the last value with the best so far. */
static void track(tracker *t, const cf_learner *learn) {
    const cf_recorder *rec = &learn->recorder;
    t->new_best = false;
    if (rec->n_epochs < 1 || t->idx >= rec->n_values) return;
    double val = rec->values[(size_t)(rec->n_epochs - 1) * (size_t)rec->n_values + (size_t)t->idx];
    bool better = t->lower ? val + t->min_delta < t->best : val - t->min_delta > t->best;
    if (better) {
        t->best = val;
        t->new_best = true;
    }
}

static cf_status save_after_epoch(cf_callback *cb, cf_learner *learn) {
    tracker *t = cb->state;
    if (!t->active) return CF_OK;
    cf_status st;
    if (t->every_epoch) {
        char name[300];
        snprintf(name, sizeof name, "%s_%d", t->fname, learn->epoch);
        if ((st = cf_learner_save(learn, name, t->with_opt)) != CF_OK)
            return cf_fail_context(st, "SaveModelCallback saving %s", name);
        t->saved = true;
        return CF_OK;
    }
    track(t, learn);
    if (!t->new_best) return CF_OK;
    if (speaks(learn)) {
        char v[40];
        printf("Better model found at epoch %d with %s value: %s.\n", learn->epoch, t->monitor,
               cf_format_float(t->best, v, sizeof v));
        fflush(stdout);
    }
    if ((st = cf_learner_save(learn, t->fname, t->with_opt)) != CF_OK)
        return cf_fail_context(st, "SaveModelCallback saving %s", t->fname);
    t->saved = true;
    return CF_OK;
}

static cf_status save_after_fit(cf_callback *cb, cf_learner *learn) {
    tracker *t = cb->state;
    if (!t->active) return CF_OK;
    t->active = false;
    cf_status st = CF_OK;
    if (t->at_end) {
        if ((st = cf_learner_save(learn, t->fname, t->with_opt)) != CF_OK)
            return cf_fail_context(st, "SaveModelCallback saving %s", t->fname);
    } else if (!t->every_epoch && t->saved) {
        /* fastai loads unconditionally; a fit that never improved (or never finished an
         * epoch) saved nothing to load, so the weights are left as they are. */
        if ((st = cf_learner_load(learn, t->fname, t->with_opt)) != CF_OK)
            return cf_fail_context(st, "SaveModelCallback loading the best model %s", t->fname);
    }
    return CF_OK;
}

static cf_status early_after_epoch(cf_callback *cb, cf_learner *learn) {
    tracker *t = cb->state;
    if (!t->active) return CF_OK;
    track(t, learn);
    if (t->new_best) {
        t->wait = 0;
        return CF_OK;
    }
    if (++t->wait >= t->patience) {
        if (speaks(learn)) {
            printf("No improvement since epoch %d: early stopping\n", learn->epoch - t->wait);
            fflush(stdout);
        }
        cf_learner_cancel(learn, CF_CANCEL_FIT);
    }
    return CF_OK;
}

static cf_status reduce_after_epoch(cf_callback *cb, cf_learner *learn) {
    tracker *t = cb->state;
    if (!t->active) return CF_OK;
    track(t, learn);
    if (t->new_best) {
        t->wait = 0;
        return CF_OK;
    }
    if (++t->wait < t->patience) return CF_OK;
    t->wait = 0;
    cf_optimizer *opt = learn->opt;
    if (!opt || opt->n_groups < 1) return CF_OK;
    double old_lr = opt->hypers[opt->n_groups - 1].lr;
    for (int g = 0; g < opt->n_groups; g++)
        opt->hypers[g].lr = fmax(opt->hypers[g].lr / t->factor, t->min_lr);
    double new_lr = opt->hypers[opt->n_groups - 1].lr;
    if (new_lr < old_lr && speaks(learn)) {
        char v[40];
        printf("Epoch %d: reducing lr to %s\n", learn->epoch, cf_format_float(new_lr, v, sizeof v));
        fflush(stdout);
    }
    return CF_OK;
}

static cf_status tr_after_fit(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    ((tracker *)cb->state)->active = false;
    return CF_OK;
}

/* What a tracker learned during a fit (its best value, patience used, whether it saved), so
 * that it comes home from a parallel fit: "CFTR" v1, kind, then the fields below. */
static void tr_put(const void *obj, cf__writer *w) {
    const tracker *t = obj;
    cf__put_header(w, "CFTR", 1);
    const uint64_t u[] = {t->kind,
                          t->active,
                          t->lower,
                          t->new_best,
                          t->saved,
                          (uint64_t)(int64_t)t->idx,
                          (uint64_t)(int64_t)t->wait};
    cf__put(w, u, sizeof u);
    cf__put_f64(w, t->best);
}

static size_t tr_export(const cf_callback *cb, void *buf, size_t size) {
    return cf__export(tr_put, cb->state, buf, size);
}

static cf_status tr_import(cf_callback *cb, const void *buf, size_t size) {
    tracker *t = cb->state;
    cf__reader r = cf__reader_make(buf, size, cb->name);
    uint64_t u[7] = {0};
    cf__get_header(&r, "CFTR", 1);
    cf__get(&r, u, sizeof u);
    double best = cf__get_f64(&r);
    cf__get_end(&r);
    if (r.st == CF_OK && u[0] != (uint64_t)t->kind) {
        r.at = 8;
        cf__reader_fail(&r, "the state of a %s, not of a %s", tracker_name((tracker_kind)u[0] % 3),
                        tracker_name(t->kind));
    }
    if (r.st != CF_OK) return r.st;
    t->active = u[1], t->lower = u[2], t->new_best = u[3], t->saved = u[4];
    t->idx = (int)(int64_t)u[5], t->wait = (int)(int64_t)u[6];
    t->best = best;
    return CF_OK;
}

static cf_callback *tracker_new(tracker_kind kind, const cf_tracker_opts *o) {
    cf_tracker_opts none = {0};
    if (!o) o = &none;
    const char *monitor = o->monitor && *o->monitor ? o->monitor : "valid_loss";
    const char *fname = o->fname && *o->fname ? o->fname : "model";
    if (strlen(monitor) >= sizeof(((tracker *)0)->monitor) ||
        strlen(fname) >= sizeof(((tracker *)0)->fname)) {
        cf_fail(CF_ERR_INVALID, "%s: monitor or fname too long", tracker_name(kind));
        return NULL;
    }
    if (o->min_delta < 0 || !isfinite(o->min_delta) || o->factor < 0 || o->min_lr < 0 ||
        o->patience < 0) {
        cf_fail(CF_ERR_INVALID,
                "%s: min_delta (%g), patience (%d), factor (%g) and min_lr (%g) must not be "
                "negative",
                tracker_name(kind), o->min_delta, o->patience, o->factor, o->min_lr);
        return NULL;
    }
    if (kind == TK_SAVE_MODEL && o->every_epoch && o->at_end) {
        cf_fail(CF_ERR_INVALID, "SaveModelCallback: every_epoch and at_end cannot both be set");
        return NULL;
    }
    cf_callback *cb = cf_callback_new(tracker_name(kind), 0, sizeof(tracker));
    if (!cb) return NULL;
    tracker *t = cb->state;
    t->kind = kind;
    snprintf(t->monitor, sizeof t->monitor, "%s", monitor);
    snprintf(t->fname, sizeof t->fname, "%s", fname);
    t->min_delta = o->min_delta;
    t->patience = o->patience > 0 ? o->patience : 1;
    t->factor = o->factor > 0 ? o->factor : 10.0;
    t->min_lr = o->min_lr;
    t->every_epoch = o->every_epoch;
    t->with_opt = o->with_opt;
    t->at_end = o->at_end;
    t->comp = o->comp;
    cb->export_state = tr_export;
    cb->import_state = tr_import;
    cb->on[CF_EV_BEFORE_FIT] = tr_before_fit;
    cb->on[CF_EV_AFTER_FIT] = tr_after_fit;
    switch (kind) {
    case TK_SAVE_MODEL:
        cb->order = CF_ORDER_SAVE_MODEL;
        cb->on[CF_EV_AFTER_EPOCH] = save_after_epoch;
        cb->on[CF_EV_AFTER_FIT] = save_after_fit;
        break;
    case TK_EARLY_STOPPING:
        cb->order = CF_ORDER_EARLY_STOPPING;
        cb->on[CF_EV_AFTER_EPOCH] = early_after_epoch;
        break;
    case TK_REDUCE_LR:
        cb->order = CF_ORDER_REDUCE_LR;
        cb->on[CF_EV_AFTER_EPOCH] = reduce_after_epoch;
        break;
    }
    return cb;
}

cf_callback *cf_save_model_cb_(const cf_tracker_opts *o) {
    return tracker_new(TK_SAVE_MODEL, o);
}
cf_callback *cf_early_stopping_cb_(const cf_tracker_opts *o) {
    return tracker_new(TK_EARLY_STOPPING, o);
}
cf_callback *cf_reduce_lr_on_plateau_cb_(const cf_tracker_opts *o) {
    return tracker_new(TK_REDUCE_LR, o);
}

/* ---- TerminateOnNaN ------------------------------------------------------------------------ */

typedef struct nan_guard {
    float *buffers; /* the model's buffers before this training batch */
    size_t n_buffers;
    bool saved;
} nan_guard;

/* Active in ordinary fits; in lr_find a non-finite loss only ends the search (as fastai, where
 * CancelFitException ends lr_find quietly); validate/get_preds are left alone. */
static cf_status nan_stop(cf_learner *learn, nan_guard *g, const char *what) {
    if (learn->training && g->saved && g->n_buffers == learn->model->n_buffers)
        memcpy(learn->model->buffers, g->buffers, g->n_buffers * sizeof(float));
    if (learn->in_lr_find) {
        cf_learner_cancel(learn, CF_CANCEL_FIT);
        return CF_OK;
    }
    cf_learner_cancel(learn, CF_CANCEL_FIT);
    return cf_fail(CF_ERR_NONFINITE,
                   "TerminateOnNaNCallback: %s at epoch %d, %s batch %lld; the fit was stopped "
                   "before the step (weights and buffers are those from before this batch)",
                   what, learn->epoch, learn->training ? "training" : "validation",
                   (long long)learn->iter);
}

static bool nan_applies(const cf_learner *learn) {
    return learn->logging || learn->in_lr_find;
}

static cf_status nan_before_fit(cf_callback *cb, cf_learner *learn) {
    nan_guard *g = cb->state;
    g->saved = false;
    size_t n = learn->model ? learn->model->n_buffers : 0;
    if (n != g->n_buffers) {
        cf_free(g->buffers);
        g->buffers = NULL;
        g->n_buffers = 0;
        if (n) {
            if (!(g->buffers = cf_malloc(n * sizeof(float))))
                return cf_fail_context(CF_ERR_NOMEM, "TerminateOnNaNCallback");
            g->n_buffers = n;
        }
    }
    return CF_OK;
}

static cf_status nan_before_batch(cf_callback *cb, cf_learner *learn) {
    nan_guard *g = cb->state;
    if (!learn->training || !g->n_buffers || g->n_buffers != learn->model->n_buffers) return CF_OK;
    memcpy(g->buffers, learn->model->buffers, g->n_buffers * sizeof(float));
    g->saved = true;
    return CF_OK;
}

/* In a data-parallel replica the decision is taken by every replica alike (agree_any), once a
 * batch: at before_step in training (after the local loss and gradients are known, before they
 * are all-reduced and stepped), at after_loss in validation. */
static cf_status nan_agree(cf_learner *learn, bool *bad) {
    return learn->replica.agree_any ? learn->replica.agree_any(learn, *bad, bad) : CF_OK;
}

static cf_status nan_after_loss(cf_callback *cb, cf_learner *learn) {
    if (!nan_applies(learn)) return CF_OK;
    bool bad = !isfinite(learn->loss_value);
    if (learn->replica.agree_any) {
        if (learn->training) return CF_OK; /* decided at before_step */
        cf_status st = nan_agree(learn, &bad);
        if (st != CF_OK) return st;
    }
    if (!bad) return CF_OK;
    char what[64];
    snprintf(what, sizeof what, "the loss is %s on a replica or here",
             isnan(learn->loss_value) ? "nan" : "not finite");
    if (!learn->replica.agree_any)
        snprintf(what, sizeof what, "the loss is %s", isnan(learn->loss_value) ? "nan" : "inf");
    return nan_stop(learn, cb->state, what);
}

/* True when any of n floats is NaN or infinite (x * 0 is NaN exactly for those). */
static bool any_nonfinite(const float *x, size_t n) {
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * 0.0f;
    for (; i < n; i++) acc[0] += x[i] * 0.0f;
    float s = 0;
    for (int k = 0; k < 8; k++) s += acc[k];
    return s != 0.0f || isnan(s);
}

static cf_status nan_before_step(cf_callback *cb, cf_learner *learn) {
    if (!nan_applies(learn)) return CF_OK;
    const cf_model *model = learn->model;
    if (learn->replica.agree_any) {
        bool bad = !isfinite(learn->loss_value);
        for (int i = 0; i < model->n_params && !bad; i++) {
            const cf_param *p = model->params[i];
            if (p->grad && p->trainable) bad = any_nonfinite(p->grad, p->numel);
        }
        cf_status st = nan_agree(learn, &bad);
        if (st != CF_OK || !bad) return st;
        return nan_stop(learn, cb->state, "the loss or a gradient is not finite on some replica");
    }
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (!p->grad || !p->trainable) continue;
        if (any_nonfinite(p->grad, p->numel)) {
            char what[300];
            snprintf(what, sizeof what, "the gradient of %s is not finite",
                     p->full_name ? p->full_name : p->name);
            return nan_stop(learn, cb->state, what);
        }
    }
    return CF_OK;
}

static void nan_free(cf_callback *cb) {
    if (!cb) return;
    nan_guard *g = cb->state;
    if (g) cf_free(g->buffers);
    cf_free(g);
    cf_free(cb);
}

cf_callback *cf_terminate_on_nan_cb(void) {
    cf_callback *cb =
        cf_callback_new("TerminateOnNaNCallback", CF_ORDER_TERMINATE_ON_NAN, sizeof(nan_guard));
    if (!cb) return NULL;
    cb->free = nan_free;
    cb->on[CF_EV_BEFORE_FIT] = nan_before_fit;
    cb->on[CF_EV_BEFORE_BATCH] = nan_before_batch;
    cb->on[CF_EV_AFTER_LOSS] = nan_after_loss;
    cb->on[CF_EV_BEFORE_STEP] = nan_before_step;
    return cb;
}
