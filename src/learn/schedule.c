/* fastai's schedules (callback/schedule.py), the ParamScheduler, and the fit variants built on
 * them: fit_one_cycle, fit_flat_cos, fit_sgdr, fine_tune. */
#include "corefit/learn.h"

#include <math.h>
#include <string.h>

#include "learn/internal.h"

double cf_sched_lin(double start, double end, double pos) {
    return start + pos * (end - start);
}
double cf_sched_cos(double start, double end, double pos) {
    return start + (1 + cos(M_PI * (1 - pos))) * (end - start) / 2;
}
double cf_sched_no(double start, double end, double pos) {
    (void)end;
    (void)pos;
    return start;
}
double cf_sched_exp(double start, double end, double pos) {
    return start * pow(end / start, pos);
}

/* combine_scheds([pct, 1-pct], [SchedCos(start, middle), SchedCos(middle, end)]) */
double cf_combined_cos(double pct, double start, double middle, double end, double pos) {
    if (pct <= 0) return cf_sched_cos(middle, end, pos);
    if (pos >= pct && pct < 1) return cf_sched_cos(middle, end, (pos - pct) / (1 - pct));
    return cf_sched_cos(start, middle, pos / pct);
}

/* ---- ParamScheduler ------------------------------------------------------------------------ */

typedef struct sched_state {
    cf_sched_fn lr, mom;
    void *ctx;
} sched_state;

static cf_status apply_hypers(cf_learner *learn, const sched_state *s, double pos) {
    int n = learn->opt->n_groups;
    double values[65];
    if (n > 64) return cf_fail(CF_ERR_INVALID, "too many parameter groups (%d)", n);
    cf_status st = CF_OK;
    if (s->lr) {
        for (int g = 0; g < n; g++) values[g] = s->lr(pos, g, s->ctx);
        st = cf_optimizer_set_hyper(learn->opt, "lr", values, n);
    }
    if (st == CF_OK && s->mom) {
        for (int g = 0; g < n; g++) values[g] = s->mom(pos, g, s->ctx);
        st = cf_optimizer_set_hyper(learn->opt, "mom", values, n);
    }
    return st;
}

static cf_status ps_before_batch(cf_callback *cb, cf_learner *learn) {
    return apply_hypers(learn, cb->state, learn->pct_train);
}

/* Records the hyper-parameters of the last group that this batch used (fastai's hps). */
static cf_status ps_after_batch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_recorder *rec = &learn->recorder;
    if (learn->validating || rec->n_hps >= rec->batch_capacity) return CF_OK;
    const cf_hypers *h = &learn->opt->hypers[learn->opt->n_groups - 1];
    rec->hp_lr[rec->n_hps] = h->lr;
    rec->hp_mom[rec->n_hps] = h->mom;
    rec->n_hps++;
    return CF_OK;
}

static void free_sched(cf_callback *cb) {
    sched_state *s = cb->state;
    if (s) cf_free(s->ctx);
    cf_free(s);
    cf_free(cb);
}

cf_callback *cf_param_scheduler_cb(cf_sched_fn lr, cf_sched_fn mom, const void *ctx,
                                   size_t ctx_size) {
    cf_callback *cb = cf_callback_new("ParamScheduler", CF_ORDER_SCHEDULER, sizeof(sched_state));
    void *copy = cb ? cf_calloc(1, ctx_size ? ctx_size : 1) : NULL;
    if (!copy) {
        cf_callback_free(cb);
        return NULL;
    }
    if (ctx_size) memcpy(copy, ctx, ctx_size);
    *(sched_state *)cb->state = (sched_state){lr, mom, copy};
    cb->skip_valid = true;
    cb->free = free_sched;
    cb->on[CF_EV_BEFORE_BATCH] = ps_before_batch;
    cb->on[CF_EV_AFTER_BATCH] = ps_after_batch;
    return cb;
}

/* ---- fit variants -------------------------------------------------------------------------- */

#define MAX_GROUPS 64

typedef struct cycle_ctx {
    double pct, div, div_final;
    double lr_max[MAX_GROUPS];
    double moms[3];
    /* sgdr */
    int n_cycles;
    double pcts[32];
} cycle_ctx;

static double one_cycle_lr(double pos, int g, const void *vctx) {
    const cycle_ctx *c = vctx;
    double m = c->lr_max[g];
    return cf_combined_cos(c->pct, m / c->div, m, m / c->div_final, pos);
}

static double one_cycle_mom(double pos, int g, const void *vctx) {
    const cycle_ctx *c = vctx;
    (void)g;
    return cf_combined_cos(c->pct, c->moms[0], c->moms[1], c->moms[2], pos);
}

/* Sets the optimizer's lr from an lr spec and reads back the per-group values. */
static cf_status group_lrs(cf_learner *learn, cf_lr lr, cycle_ctx *c) {
    cf_status st = cf__set_lr(learn, lr);
    if (st != CF_OK) return st;
    if (learn->opt->n_groups > MAX_GROUPS)
        return cf_fail(CF_ERR_INVALID, "too many parameter groups (%d)", learn->opt->n_groups);
    for (int g = 0; g < learn->opt->n_groups; g++) c->lr_max[g] = learn->opt->hypers[g].lr;
    return CF_OK;
}

/* The schedule's parameters as a checkpoint records them (full precision). */
static void schedule_params(const char *method, const cycle_ctx *c, int n_groups, char *buf,
                            size_t n) {
    size_t at = 0;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        int k_ = snprintf(buf + at, at < n ? n - at : 0, __VA_ARGS__);                             \
        if (k_ > 0) at = at + (size_t)k_ < n ? at + (size_t)k_ : n - 1;                            \
    } while (0)
    ADD("method=%s pct=%.17g div=%.17g div_final=%.17g moms=%.17g,%.17g,%.17g lr_max=", method,
        c->pct, c->div, c->div_final, c->moms[0], c->moms[1], c->moms[2]);
    for (int g = 0; g < n_groups && g < MAX_GROUPS; g++) ADD("%s%.17g", g ? "," : "", c->lr_max[g]);
    ADD(" cycles=%d", c->n_cycles);
    for (int i = 0; i < c->n_cycles && i < 32; i++) ADD("%s%.17g", i ? "," : ":", c->pcts[i]);
#undef ADD
}

static cf_status run_scheduled(cf_learner *learn, const char *method, int n_epoch, cycle_ctx *c,
                               cf_sched_fn lr, cf_sched_fn mom, double wd, cf_callback **cbs,
                               int n_cbs, bool reset_opt, int start_epoch, const char *resume) {
    char params[4096];
    schedule_params(method, c, learn->opt->n_groups, params, sizeof params);
    cf_callback *sched = cf_param_scheduler_cb(lr, mom, c, sizeof *c);
    cf_callback **all = cf_calloc((size_t)n_cbs + 1, sizeof *all);
    if (!sched || !all) {
        cf_callback_free(sched);
        cf_free(all);
        for (int i = 0; i < n_cbs; i++) cf_callback_free(cbs[i]);
        return CF_ERR_NOMEM;
    }
    all[0] = sched;
    for (int i = 0; i < n_cbs; i++) all[1 + i] = cbs[i];
    cf_status st = cf__fit(learn, n_epoch, (cf_lr){0}, wd, all, n_cbs + 1, reset_opt, start_epoch,
                           resume, params);
    cf_free(all);
    return st;
}

static void free_cbs(cf_callback **cbs, int n) {
    for (int i = 0; i < n; i++) cf_callback_free(cbs[i]);
}

cf_status cf_fit_one_cycle_(cf_learner *learn, int n_epoch, const cf_one_cycle_opts *o) {
    cycle_ctx c = {.pct = o->pct_start > 0 ? o->pct_start : 0.25,
                   .div = o->div > 0 ? o->div : 25.0,
                   .div_final = o->div_final > 0 ? o->div_final : 1e5};
    memcpy(c.moms, o->moms ? o->moms : learn->moms, sizeof c.moms);
    cf_status st = group_lrs(learn, o->lr_max, &c);
    if (st != CF_OK) {
        free_cbs(o->cbs, o->n_cbs);
        return st;
    }
    return run_scheduled(learn, "fit_one_cycle", n_epoch, &c, one_cycle_lr, one_cycle_mom, o->wd,
                         o->cbs, o->n_cbs, o->reset_opt, o->start_epoch, o->resume);
}

static double flat_cos_lr(double pos, int g, const void *vctx) {
    const cycle_ctx *c = vctx;
    double lr = c->lr_max[g];
    return cf_combined_cos(c->pct, lr, lr, lr / c->div_final, pos);
}

cf_status cf_fit_flat_cos_(cf_learner *learn, int n_epoch, const cf_flat_cos_opts *o) {
    cycle_ctx c = {.pct = o->pct_start > 0 ? o->pct_start : 0.75,
                   .div_final = o->div_final > 0 ? o->div_final : 1e5};
    cf_status st = group_lrs(learn, o->lr, &c);
    if (st != CF_OK) {
        free_cbs(o->cbs, o->n_cbs);
        return st;
    }
    return run_scheduled(learn, "fit_flat_cos", n_epoch, &c, flat_cos_lr, NULL, o->wd, o->cbs,
                         o->n_cbs, o->reset_opt, o->start_epoch, o->resume);
}

/* combine_scheds(pcts, [SchedCos(lr_max, 0)] * n_cycles) */
static double sgdr_lr(double pos, int g, const void *vctx) {
    const cycle_ctx *c = vctx;
    double start = 0;
    int idx = 0;
    for (int i = 0; i < c->n_cycles; i++) {
        if (pos >= start) idx = i;
        start += c->pcts[i];
    }
    double begin = 0;
    for (int i = 0; i < idx; i++) begin += c->pcts[i];
    return cf_sched_cos(c->lr_max[g], 0, (pos - begin) / c->pcts[idx]);
}

cf_status cf_fit_sgdr_(cf_learner *learn, int n_cycles, int cycle_len, const cf_sgdr_opts *o) {
    int mult = o->cycle_mult > 0 ? o->cycle_mult : 2;
    if (n_cycles < 1 || n_cycles > 30 || cycle_len < 1) {
        free_cbs(o->cbs, o->n_cbs);
        return cf_fail(CF_ERR_INVALID, "fit_sgdr: n_cycles %d (1..30) and cycle_len %d (>= 1)",
                       n_cycles, cycle_len);
    }
    /* n_epoch = cycle_len * (mult**n_cycles - 1) // (mult - 1); with mult 1 each cycle is
     * cycle_len epochs. */
    long long n_epoch = 0;
    for (int i = 0; i < n_cycles; i++) n_epoch += (long long)cycle_len * (long long)pow(mult, i);
    if (n_epoch > 100000) {
        free_cbs(o->cbs, o->n_cbs);
        return cf_fail(CF_ERR_INVALID, "fit_sgdr: %lld epochs is too many", n_epoch);
    }
    cycle_ctx c = {.n_cycles = n_cycles};
    for (int i = 0; i < n_cycles; i++) c.pcts[i] = cycle_len * pow(mult, i) / (double)n_epoch;
    cf_status st = group_lrs(learn, o->lr_max, &c);
    if (st != CF_OK) {
        free_cbs(o->cbs, o->n_cbs);
        return st;
    }
    return run_scheduled(learn, "fit_sgdr", (int)n_epoch, &c, sgdr_lr, NULL, o->wd, o->cbs,
                         o->n_cbs, o->reset_opt, o->start_epoch, o->resume);
}

/* fastai's fine_tune: one frozen one-cycle phase (pct_start 0.99, div 25), then the unfrozen
 * phase with discriminative rates. fastai passes **kwargs (cbs included) to both phases; the
 * per-call callbacks here are owned objects, so they run in the unfrozen phase only, where
 * trackers and loggers matter. Learner callbacks run in both. */
cf_status cf_fine_tune_(cf_learner *learn, int epochs, const cf_fine_tune_opts *o) {
    double base_lr = o->base_lr > 0 ? o->base_lr : 2e-3;
    int freeze_epochs = o->freeze_epochs == 0 ? 1 : (o->freeze_epochs < 0 ? 0 : o->freeze_epochs);
    double lr_mult = o->lr_mult > 0 ? o->lr_mult : 100;
    double pct_start = o->pct_start > 0 ? o->pct_start : 0.3;
    double div = o->div > 0 ? o->div : 5.0;
    /* resuming: the checkpoint is of the unfrozen phase (the only one that runs the call's
     * callbacks), so the frozen phase is not run again */
    cf_status st = o->resume ? CF_OK : cf_learner_freeze(learn);
    if (st == CF_OK && freeze_epochs > 0 && !o->resume)
        st = cf_fit_one_cycle(learn, freeze_epochs, .lr_max = CF_SLICE(base_lr), .pct_start = 0.99,
                              .wd = o->wd, .reset_opt = o->reset_opt);
    if (st != CF_OK) {
        free_cbs(o->cbs, o->n_cbs);
        return st;
    }
    base_lr /= 2;
    st = cf_learner_unfreeze(learn);
    if (st != CF_OK) {
        free_cbs(o->cbs, o->n_cbs);
        return st;
    }
    return cf_fit_one_cycle(learn, epochs, .lr_max = CF_SLICE2(base_lr / lr_mult, base_lr),
                            .pct_start = pct_start, .div = div, .wd = o->wd, .cbs = o->cbs,
                            .n_cbs = o->n_cbs, .resume = o->resume);
}
