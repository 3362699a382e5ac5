/* fastai's training loop: events in fastai's order, cancellations, the default callbacks. */
#include "corefit/learn.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/pool.h"
#include "learn/internal.h"

/* ---- CF_TIMING=1: the fit phase by phase -------------------------------------------------- */

/* CF_TIMING=1: where a fit's time goes, phase by phase (the loader's batches, forward, loss,
 * backward, the optimizer step, each event's callbacks, the replicas' cancel agreement), in wall
 * seconds and in this process's CPU seconds (every thread: the pool's parts count), for the
 * training and the validation batches apart: marks taken with cf__phase_begin and summed by
 * cf__phase_end into a phase (or an event: CF__PH_COUNT + the event); cf__phases_report prints
 * them on stderr at the end of each fit (each fork worker its own) and clears them.
 * bench/scaling.py --env CF_TIMING=1 --show shows them. Off: one branch a mark. */
enum {
    CF__PH_DATA,
    CF__PH_FORWARD,
    CF__PH_LOSS,
    CF__PH_BACKWARD,
    CF__PH_STEP,
    CF__PH_SYNC,
    CF__PH_COUNT
};
typedef struct cf__phase_mark {
    double wall, cpu;
} cf__phase_mark;
enum { SLOTS = CF__PH_COUNT + CF_EV_COUNT };

typedef struct phase_sum {
    double wall, cpu;
    long n;
} phase_sum;

/* Process-wide: fits running on several threads at once (with CF_TIMING=1) mix their sums. */
static _Atomic int on = -1;      /* -1: not read yet */
static phase_sum sums[2][SLOTS]; /* [training][slot] */

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool cf__phases_on(void) {
    if (on < 0) on = cf__timing_requested();
    return on;
}

static cf__phase_mark cf__phase_begin(void) {
    if (!cf__phases_on()) return (cf__phase_mark){0, 0};
    return (cf__phase_mark){clock_s(CLOCK_MONOTONIC), clock_s(CLOCK_PROCESS_CPUTIME_ID)};
}

static void cf__phase_end(const cf_learner *learn, cf__phase_mark m, int slot) {
    if (!cf__phases_on() || slot < 0 || slot >= SLOTS) return;
    phase_sum *s = &sums[learn->training ? 1 : 0][slot];
    s->wall += clock_s(CLOCK_MONOTONIC) - m.wall;
    s->cpu += clock_s(CLOCK_PROCESS_CPUTIME_ID) - m.cpu;
    s->n++;
}

static void cf__phases_reset(void) {
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < SLOTS; i++) sums[t][i] = (phase_sum){0, 0, 0};
}

static const char *const phase_names[CF__PH_COUNT] = {"data",     "forward", "loss",
                                                      "backward", "step",    "sync"};

/* Appends to the report (whole lines, written at once: fork workers print side by side). */
typedef struct report {
    char text[8192];
    size_t len;
} report;

static void add(report *r, const char *fmt, ...) {
    if (r->len >= sizeof r->text) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->text + r->len, sizeof r->text - r->len, fmt, ap);
    va_end(ap);
    if (n > 0) r->len += (size_t)n < sizeof r->text - r->len ? (size_t)n : sizeof r->text - r->len;
}

static void cf__phases_report(const cf_learner *learn, cf__phase_mark fit) {
    if (!cf__phases_on()) return;
    const double wall = clock_s(CLOCK_MONOTONIC) - fit.wall;
    const double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - fit.cpu;
    double timed_wall = 0, timed_cpu = 0;
    char who[32] = "";
    if (learn->replica.world > 1) snprintf(who, sizeof who, " (rank %d)", learn->replica.rank);
    static report r; /* 8 KiB: not on a worker's stack */
    r.len = 0;
    add(&r, "timing: fit%s: wall %.3f s, CPU %.3f s\n", who, wall, cpu);
    for (int t = 1; t >= 0; t--) {
        add(&r, "timing: fit%s %s (wall/CPU s, calls):", who, t ? "train" : "valid");
        double w = 0, c = 0;
        for (int i = 0; i < SLOTS; i++) {
            const phase_sum *s = &sums[t][i];
            w += s->wall;
            c += s->cpu;
            if (i < CF__PH_COUNT)
                add(&r, " %s %.3f/%.3f %ld,", phase_names[i], s->wall, s->cpu, s->n);
        }
        double ew = 0, ec = 0;
        for (int i = CF__PH_COUNT; i < SLOTS; i++) {
            ew += sums[t][i].wall;
            ec += sums[t][i].cpu;
        }
        add(&r, " events %.3f/%.3f; all %.3f/%.3f\n", ew, ec, w, c);
        for (int i = CF__PH_COUNT; i < SLOTS; i++) {
            const phase_sum *s = &sums[t][i];
            if (s->wall >= 1e-3)
                add(&r, "timing: fit%s %s event %s: %.3f/%.3f s, %ld calls\n", who,
                    t ? "train" : "valid", cf_event_name((cf_event)(i - CF__PH_COUNT)), s->wall,
                    s->cpu, s->n);
        }
        timed_wall += w;
        timed_cpu += c;
    }
    add(&r, "timing: fit%s untimed (the loop itself, epoch set-up): %.3f/%.3f s\n", who,
        wall - timed_wall, cpu - timed_cpu);
    fwrite(r.text, 1, r.len, stderr);
    cf__phases_reset();
}

static const char *const event_names[CF_EV_COUNT] = {
    "after_create",
    "before_fit",
    "before_epoch",
    "before_train",
    "before_batch",
    "after_pred",
    "after_loss",
    "before_backward",
    "after_cancel_backward",
    "after_backward",
    "before_step",
    "after_cancel_step",
    "after_step",
    "after_cancel_batch",
    "after_batch",
    "after_cancel_train",
    "after_train",
    "before_validate",
    "after_cancel_validate",
    "after_validate",
    "after_cancel_epoch",
    "after_epoch",
    "after_cancel_fit",
    "after_fit",
};

const char *cf_event_name(cf_event ev) {
    return ev >= 0 && ev < CF_EV_COUNT ? event_names[ev] : "unknown";
}

/* Events of the inner loop obey a callback's skip_train / skip_valid (fastai's run_train,
 * run_valid). */
static bool inner_event(cf_event ev) {
    return ev >= CF_EV_BEFORE_BATCH && ev <= CF_EV_AFTER_BATCH;
}

cf_status cf__event(cf_learner *learn, cf_event ev) {
    const cf__phase_mark m = cf__phase_begin();
    cf_status st = CF_OK;
    for (int i = 0; i < learn->n_active; i++) {
        cf_callback *cb = learn->active[i];
        if (!cb->on[ev] || !cb->running) continue;
        if (inner_event(ev) &&
            ((learn->training && cb->skip_train) || (!learn->training && cb->skip_valid)))
            continue;
        st = cb->on[ev](cb, learn);
        if (st != CF_OK) {
            st = cf_fail_context(st, "callback %s at %s", cb->name ? cb->name : "?",
                                 cf_event_name(ev));
            break;
        }
        if (learn->cancel != CF_CANCEL_NONE) break; /* like an exception: skip the rest */
    }
    cf__phase_end(learn, m, CF__PH_COUNT + (int)ev);
    return st;
}

/* fastai's _with_events: before_X; f(); on the matching cancellation after_cancel_X; then
 * after_X unless another cancellation is escaping. */
typedef cf_status (*body_fn)(cf_learner *learn, void *ctx);

static cf_status with_events(cf_learner *learn, cf_event before, body_fn body, void *ctx,
                             cf_cancel catches, cf_event after_cancel, cf_event after) {
    cf_status st = cf__event(learn, before);
    if (st == CF_OK && learn->cancel == CF_CANCEL_NONE) st = body(learn, ctx);
    if (st != CF_OK) return st;
    if (learn->cancel == catches) {
        learn->cancel = CF_CANCEL_NONE;
        if ((st = cf__event(learn, after_cancel)) != CF_OK) return st;
    }
    if (learn->cancel != CF_CANCEL_NONE) return CF_OK; /* escaping to an outer level */
    return cf__event(learn, after);
}

/* ---- one batch ----------------------------------------------------------------------------- */

cf_status cf__ensure_scratch(cf_learner *learn, const cf_shape *pred_shape) {
    size_t need = cf_shape_numel(pred_shape);
    if ((int64_t)need > learn->scratch_rows) {
        float *d = cf_calloc(need, sizeof(float));
        float *l = cf_calloc((size_t)pred_shape->dim[0], sizeof(float));
        if (!d || !l) {
            cf_free(d);
            cf_free(l);
            return cf_fail_context(CF_ERR_NOMEM, "loss scratch");
        }
        cf_free(learn->dpred.data);
        cf_free(learn->per_item_loss);
        learn->dpred.data = d;
        learn->per_item_loss = l;
        learn->scratch_rows = (int64_t)need;
    }
    learn->dpred.shape = *pred_shape;
    return CF_OK;
}

static cf_status do_backward_body(cf_learner *learn);

static cf_status do_backward(cf_learner *learn, void *ctx) {
    (void)ctx;
    const cf__phase_mark m = cf__phase_begin();
    cf_status st = do_backward_body(learn);
    cf__phase_end(learn, m, CF__PH_BACKWARD);
    return st;
}

static cf_status do_backward_body(cf_learner *learn) {
    cf_loss_backward(&learn->loss, learn->pred, &learn->batch->y, &learn->dpred);
    float scale = learn->loss_grad_scale; /* fastai's loss_grad scaling (GradientAccumulation) */
    if (scale != 0.0f && scale != 1.0f) {
        size_t n = cf_tensor_numel(&learn->dpred);
        for (size_t i = 0; i < n; i++) learn->dpred.data[i] *= scale;
    }
    return cf_model_backward(learn->model, &learn->dpred);
}

static cf_status do_step(cf_learner *learn, void *ctx) {
    (void)ctx;
    const cf__phase_mark m = cf__phase_begin();
    cf_optimizer_step(learn->opt);
    cf__phase_end(learn, m, CF__PH_STEP);
    return CF_OK;
}

static cf_status do_one_batch(cf_learner *learn, void *ctx) {
    (void)ctx;
    const cf_batch *b = learn->batch;
    cf__phase_mark m = cf__phase_begin();
    cf_status st = cf_model_forward(learn->model, &b->x, &learn->pred);
    cf__phase_end(learn, m, CF__PH_FORWARD);
    if (st != CF_OK) return st;
    if ((st = cf__event(learn, CF_EV_AFTER_PRED)) != CF_OK || learn->cancel) return st;
    m = cf__phase_begin();
    if ((st = cf__ensure_scratch(learn, &learn->pred->shape)) != CF_OK) return st;
    float mean = 0;
    st = cf_loss_forward(&learn->loss, learn->pred, &b->y, &mean, learn->per_item_loss);
    cf__phase_end(learn, m, CF__PH_LOSS);
    if (st != CF_OK) return st;
    learn->loss_value = mean;
    learn->loss_grad_scale = 1.0f;
    if ((st = cf__event(learn, CF_EV_AFTER_LOSS)) != CF_OK || learn->cancel) return st;
    if (!learn->training) return CF_OK;
    st = with_events(learn, CF_EV_BEFORE_BACKWARD, do_backward, NULL, CF_CANCEL_BACKWARD,
                     CF_EV_AFTER_CANCEL_BACKWARD, CF_EV_AFTER_BACKWARD);
    if (st != CF_OK || learn->cancel) return st;
    st = with_events(learn, CF_EV_BEFORE_STEP, do_step, NULL, CF_CANCEL_STEP,
                     CF_EV_AFTER_CANCEL_STEP, CF_EV_AFTER_STEP);
    if (st != CF_OK || learn->cancel) return st;
    m = cf__phase_begin();
    cf_optimizer_zero_grad(learn->opt);
    cf__phase_end(learn, m, CF__PH_STEP);
    return CF_OK;
}

static cf_status sync_cancel(cf_learner *learn) {
    if (!learn->replica.sync_cancel) return CF_OK;
    const cf__phase_mark m = cf__phase_begin();
    cf_status st = learn->replica.sync_cancel(learn);
    cf__phase_end(learn, m, CF__PH_SYNC);
    return st;
}

static cf_status all_batches(cf_learner *learn, void *ctx) {
    (void)ctx;
    cf_dataloader *dl = learn->dl;
    learn->n_iter = cf_dataloader_len(dl);
    /* training continues the stream of earlier fits; validation, get_preds and tta keep the
     * fit's own epoch */
    int epoch = learn->training ? cf__data_epoch(learn) : learn->epoch;
    cf__phase_mark m = cf__phase_begin();
    cf_status st = cf_dataloader_begin_epoch(dl, epoch);
    cf__phase_end(learn, m, CF__PH_DATA);
    if (st != CF_OK) return st;
    int64_t first = 0;
    if (learn->resume && learn->training) { /* a resumed fit continues at its checkpoint */
        first = cf__resume_apply_position(learn);
        if ((st = cf_dataloader_seek(dl, first)) != CF_OK) return st;
    }
    for (int64_t i = first;; i++) {
        const cf_batch *b = NULL;
        m = cf__phase_begin();
        st = cf_dataloader_next(dl, &b);
        cf__phase_end(learn, m, CF__PH_DATA);
        if (st != CF_OK) break;
        if (!b) break;
        learn->iter = i;
        learn->batch = b;
        /* dropout draws from (epoch, sample), not from how many batches ran */
        cf_model_set_draw_key(learn->model, (uint64_t)epoch, b->idx, b->size);
        learn->model->draw_key.step = i; /* the text layers' batch-wide draws */
        st = with_events(learn, CF_EV_BEFORE_BATCH, do_one_batch, NULL, CF_CANCEL_BATCH,
                         CF_EV_AFTER_CANCEL_BATCH, CF_EV_AFTER_BATCH);
        if (st == CF_OK) st = sync_cancel(learn);
        if (st != CF_OK || learn->cancel != CF_CANCEL_NONE) break;
    }
    cf_model_set_draw_key(learn->model, 0, NULL, 0);
    learn->batch = NULL;
    return st;
}

static cf_status do_epoch_train(cf_learner *learn) {
    learn->dl = learn->dls->train;
    learn->n_iter = cf_dataloader_len(learn->dl); /* known to before_train (progress bars) */
    return with_events(learn, CF_EV_BEFORE_TRAIN, all_batches, NULL, CF_CANCEL_TRAIN,
                       CF_EV_AFTER_CANCEL_TRAIN, CF_EV_AFTER_TRAIN);
}

static cf_status do_epoch_validate(cf_learner *learn, cf_dataloader *dl) {
    learn->dl = dl;
    learn->n_iter = cf_dataloader_len(dl);
    return with_events(learn, CF_EV_BEFORE_VALIDATE, all_batches, NULL, CF_CANCEL_VALIDATE,
                       CF_EV_AFTER_CANCEL_VALIDATE, CF_EV_AFTER_VALIDATE);
}

static cf_status do_epoch(cf_learner *learn, void *ctx) {
    (void)ctx;
    cf_status st = do_epoch_train(learn);
    if (st != CF_OK || learn->cancel) return st;
    return do_epoch_validate(learn, learn->dls->valid);
}

/* ctx: the number of this fit's epochs begun (the last one's index + 1), set as they begin. */
static cf_status do_fit(cf_learner *learn, void *ctx) {
    int *begun = ctx;
    int first = 0;
    if (learn->resume) {
        cf_status st = cf__resume_apply_state(learn, &first);
        if (st != CF_OK) return st;
    }
    for (int epoch = first; epoch < learn->n_epoch; epoch++) {
        learn->epoch = epoch;
        *begun = epoch + 1;
        cf_status st = with_events(learn, CF_EV_BEFORE_EPOCH, do_epoch, NULL, CF_CANCEL_EPOCH,
                                   CF_EV_AFTER_CANCEL_EPOCH, CF_EV_AFTER_EPOCH);
        if (st == CF_OK) st = sync_cancel(learn);
        if (st != CF_OK || learn->cancel) return st;
    }
    return CF_OK;
}

/* ---- assembling the callbacks of one call -------------------------------------------------- */

static int by_order(const void *a, const void *b) {
    const cf_callback *x = *(cf_callback *const *)a, *y = *(cf_callback *const *)b;
    if (x->order != y->order) return x->order < y->order ? -1 : 1;
    return 0;
}

/* Stable sort: insertion sort keeps equal orders in insertion sequence (fastai sorts stably). */
static void sort_stable(cf_callback **cbs, int n) {
    for (int i = 1; i < n; i++) {
        cf_callback *x = cbs[i];
        int j = i - 1;
        while (j >= 0 && by_order(&cbs[j], &x) > 0) {
            cbs[j + 1] = cbs[j];
            j--;
        }
        cbs[j + 1] = x;
    }
}

typedef struct call_cbs {
    cf_callback *defaults[4];
    int n_defaults;
    cf_callback **extra; /* owned by this call */
    int n_extra;
} call_cbs;

static cf_status activate(cf_learner *learn, call_cbs *call) {
    int total = call->n_defaults + learn->n_cbs + call->n_extra +
                (learn->replica.is_master ? learn->n_master_cbs : 0);
    cf_callback **active = cf_calloc((size_t)total + 1, sizeof *active);
    if (!active) return CF_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < call->n_defaults; i++) active[n++] = call->defaults[i];
    for (int i = 0; i < learn->n_cbs; i++) active[n++] = learn->cbs[i];
    if (learn->replica.is_master)
        for (int i = 0; i < learn->n_master_cbs; i++) active[n++] = learn->master_cbs[i];
    for (int i = 0; i < call->n_extra; i++) active[n++] = call->extra[i];
    sort_stable(active, n);
    for (int i = 0; i < n; i++) active[i]->running = true;
    cf_free(learn->active);
    learn->active = active;
    learn->n_active = n;
    return CF_OK;
}

static void release_call(cf_learner *learn, call_cbs *call) {
    for (int i = 0; i < call->n_defaults; i++) cf_callback_free(call->defaults[i]);
    for (int i = 0; i < call->n_extra; i++) cf_callback_free(call->extra[i]);
    cf_free(learn->active);
    learn->active = NULL;
    learn->n_active = 0;
}

static cf_status make_defaults(cf_learner *learn, call_cbs *call) {
    call->defaults[call->n_defaults++] = cf__train_eval_cb();
    call->defaults[call->n_defaults++] = cf__recorder_cb();
    if (!learn->quiet && learn->replica.is_master && learn->logging)
        call->defaults[call->n_defaults++] = cf_progress_cb();
    for (int i = 0; i < call->n_defaults; i++)
        if (!call->defaults[i]) return CF_ERR_NOMEM;
    return CF_OK;
}

/* fastai's SkipToEpoch: epochs before start_epoch run no training or validation. */
static cf_status skip_train(cf_callback *cb, cf_learner *learn) {
    if (learn->epoch < *(int *)cb->state) cf_learner_cancel(learn, CF_CANCEL_TRAIN);
    return CF_OK;
}
static cf_status skip_valid(cf_callback *cb, cf_learner *learn) {
    if (learn->epoch < *(int *)cb->state) cf_learner_cancel(learn, CF_CANCEL_VALIDATE);
    return CF_OK;
}
static cf_callback *skip_to_epoch_cb(int start_epoch) {
    cf_callback *cb = cf_callback_new("SkipToEpoch", 70, sizeof(int));
    if (!cb) return NULL;
    *(int *)cb->state = start_epoch;
    cb->on[CF_EV_BEFORE_TRAIN] = skip_train;
    cb->on[CF_EV_BEFORE_VALIDATE] = skip_valid;
    return cb;
}

cf_status cf__set_lr(cf_learner *learn, cf_lr lr) {
    if (!learn->opt) {
        cf_status st = cf_learner_create_opt(learn);
        if (st != CF_OK) return st;
    }
    if (lr.kind == CF_LR_UNSET) lr = CF_LR(lr.stop != 0 ? lr.stop : learn->lr);
    if (!(lr.stop > 0) || !isfinite(lr.stop) || lr.start < 0)
        return cf_fail(CF_ERR_INVALID, "learning rate %g (slice start %g) must be positive",
                       lr.stop, lr.start);
    int n = learn->opt->n_groups;
    double values[65];
    if (n > 64) return cf_fail(CF_ERR_INVALID, "too many parameter groups (%d)", n);
    cf_lr_expand(lr, n, values);
    return cf_optimizer_set_hyper(learn->opt, "lr", values, n);
}

cf_status cf__fit(cf_learner *learn, int n_epoch, cf_lr lr, double wd, cf_callback **extra,
                  int n_extra, bool reset_opt, int start_epoch, const char *resume,
                  const char *method_params) {
    call_cbs call = {.n_extra = 0};
    cf_status st = CF_OK;
    call.extra = cf_calloc((size_t)n_extra + 2, sizeof *call.extra);
    if (!call.extra) st = CF_ERR_NOMEM;
    for (int i = 0; i < n_extra; i++) {
        if (st == CF_OK && extra[i])
            call.extra[call.n_extra++] = extra[i];
        else
            cf_callback_free(extra[i]);
    }
    if (st == CF_OK && n_epoch < 0) st = cf_fail(CF_ERR_INVALID, "n_epoch %d < 0", n_epoch);
    if (st == CF_OK && start_epoch > 0) {
        cf_callback *skip = skip_to_epoch_cb(start_epoch);
        if (skip)
            call.extra[call.n_extra++] = skip;
        else
            st = CF_ERR_NOMEM;
    }
    char *params = NULL;
    struct cf__resume *from = NULL;
    if (st == CF_OK) {
        params = cf__fit_params(learn, n_epoch, lr, wd == 0 ? learn->wd : wd, reset_opt,
                                start_epoch, method_params);
        if (!params) st = CF_ERR_NOMEM;
    }
    /* the checkpoint is read and checked before anything changes */
    if (st == CF_OK && resume)
        st = cf__resume_load(learn, resume, params, n_epoch, start_epoch, &from);
    if (st == CF_OK) st = make_defaults(learn, &call);
    if (st == CF_OK && (reset_opt || !learn->opt)) st = cf_learner_create_opt(learn);
    if (st == CF_OK && wd == 0) wd = learn->wd;
    if (st == CF_OK && wd != 0) st = cf_optimizer_set_hyper(learn->opt, "wd", &wd, 1);
    if (st == CF_OK) st = cf__set_lr(learn, lr);
    if (st == CF_OK) st = activate(learn, &call);
    if (st != CF_OK) {
        cf__resume_free(from);
        cf_free(params);
        release_call(learn, &call);
        cf_free(call.extra);
        return st;
    }
    cf_free(learn->fit_params);
    learn->fit_params = params;
    learn->resume = from;
    learn->n_epoch = n_epoch;
    learn->cancel = CF_CANCEL_NONE;
    learn->validating = false;
    cf_clear_error();
    int begun = 0;
    cf__phases_reset();
    const cf__phase_mark fit_mark = cf__phase_begin();
    st = with_events(learn, CF_EV_BEFORE_FIT, do_fit, &begun, CF_CANCEL_FIT, CF_EV_AFTER_CANCEL_FIT,
                     CF_EV_AFTER_FIT);
    /* A cancellation nobody caught ends the fit like CancelFit. */
    if (st == CF_OK && learn->cancel != CF_CANCEL_NONE) {
        learn->cancel = CF_CANCEL_NONE;
        st = cf__event(learn, CF_EV_AFTER_CANCEL_FIT);
        if (st == CF_OK) st = cf__event(learn, CF_EV_AFTER_FIT);
    }
    learn->cancel = CF_CANCEL_NONE;
    cf__phases_report(learn, fit_mark);
    /* the next fit draws fresh shuffles (a resumed fit's count came back with its state) */
    learn->data_epochs += begun;
    cf__checkpoint_fit_ended();
    cf__resume_free(learn->resume); /* a fit that ended before reaching its position */
    learn->resume = NULL;
    cf_free(learn->fit_params);
    learn->fit_params = NULL;
    cf_model_train(learn->model, false);
    release_call(learn, &call);
    cf_free(call.extra);
    return st;
}

cf_status cf_fit_(cf_learner *learn, int n_epoch, const cf_fit_opts *o) {
    return cf__fit(learn, n_epoch, o->lr, o->wd, o->cbs, o->n_cbs, o->reset_opt, o->start_epoch,
                   o->resume, "method=fit");
}

/* ---- inference passes (validate, get_preds) ------------------------------------------------ */

typedef struct sink_cb_state {
    cf__batch_sink sink;
    void *ctx;
} sink_cb_state;

static cf_status sink_after_loss(cf_callback *cb, cf_learner *learn) {
    sink_cb_state *s = cb->state;
    s->sink(learn, learn->batch, learn->pred, learn->per_item_loss, s->ctx);
    return CF_OK;
}

static cf_status inference_body(cf_learner *learn, void *ctx) {
    return do_epoch_validate(learn, ctx);
}

cf_status cf__run_inference(cf_learner *learn, cf_dataloader *dl, cf_callback **cbs, int n_cbs,
                            cf__batch_sink sink, void *ctx) {
    call_cbs call = {0};
    sink_cb_state sink_state = {sink, ctx};
    cf_callback sink_cb = {.name = "GatherPreds", .order = 0, .state = &sink_state};
    sink_cb.on[CF_EV_AFTER_LOSS] = sink_after_loss;
    cf_status st = CF_OK;
    call.extra = cf_calloc((size_t)n_cbs + 2, sizeof *call.extra);
    if (!call.extra) st = CF_ERR_NOMEM;
    for (int i = 0; i < n_cbs; i++) {
        if (st == CF_OK && cbs[i])
            call.extra[call.n_extra++] = cbs[i];
        else
            cf_callback_free(cbs[i]);
    }
    if (st == CF_OK && sink) call.extra[call.n_extra++] = &sink_cb; /* static: free is NULL */
    bool saved_logging = learn->logging;
    learn->logging = false; /* fastai's validation_context: no_logging, no_mbar */
    if (st == CF_OK) st = make_defaults(learn, &call);
    if (st == CF_OK && !learn->opt) st = cf_learner_create_opt(learn);
    if (st == CF_OK) st = activate(learn, &call);
    if (st == CF_OK) {
        learn->validating = true;
        learn->cancel = CF_CANCEL_NONE;
        learn->n_epoch = 1;
        learn->epoch = 0;
        /* fastai wraps the pass in before_fit/before_epoch ... after_epoch/after_fit. */
        st = cf__event(learn, CF_EV_BEFORE_FIT);
        if (st == CF_OK) st = cf__event(learn, CF_EV_BEFORE_EPOCH);
        if (st == CF_OK) st = inference_body(learn, dl);
        if (st == CF_OK) learn->cancel = CF_CANCEL_NONE;
        if (st == CF_OK) st = cf__event(learn, CF_EV_AFTER_EPOCH);
        if (st == CF_OK) st = cf__event(learn, CF_EV_AFTER_FIT);
        learn->validating = false;
        learn->cancel = CF_CANCEL_NONE;
    }
    learn->logging = saved_logging;
    release_call(learn, &call);
    cf_free(call.extra);
    return st;
}
