/* fastai's lr_find: an exponential lr sweep with the LRFinder callback, the four suggestion
 * functions, and weights and optimizer state restored afterwards. */
#include "corefit/learn.h"

#include <math.h>
#include <string.h>

#include "learn/internal.h"

typedef struct finder_state {
    double start_lr, end_lr;
    int num_it;
    bool stop_div;
    double best_loss;
    /* snapshot taken at before_fit */
    float *weights, *buffers;
    cf_optimizer *opt_copy;
} finder_state;

static cf_status lf_before_fit(cf_callback *cb, cf_learner *learn) {
    finder_state *s = cb->state;
    cf_model *m = learn->model;
    s->weights = cf_malloc((m->n_weights + 1) * sizeof(float));
    s->buffers = cf_malloc((m->n_buffers + 1) * sizeof(float));
    if (!s->weights || !s->buffers) return CF_ERR_NOMEM;
    memcpy(s->weights, m->weights, m->n_weights * sizeof(float));
    memcpy(s->buffers, m->buffers, m->n_buffers * sizeof(float));
    cf_status st = cf_optimizer_new(&s->opt_copy, m, &learn->opt->config);
    if (st == CF_OK) st = cf_optimizer_copy_state(s->opt_copy, learn->opt);
    s->best_loss = INFINITY;
    learn->in_lr_find = true;
    return st;
}

static cf_status lf_before_batch(cf_callback *cb, cf_learner *learn) {
    finder_state *s = cb->state;
    double lr = cf_sched_exp(s->start_lr, s->end_lr, (double)learn->train_iter / s->num_it);
    return cf_optimizer_set_hyper(learn->opt, "lr", &lr, 1);
}

static cf_status lf_after_batch(cf_callback *cb, cf_learner *learn) {
    finder_state *s = cb->state;
    cf_recorder *rec = &learn->recorder;
    if (rec->n_hps < rec->batch_capacity) {
        const cf_hypers *h = &learn->opt->hypers[learn->opt->n_groups - 1];
        rec->hp_lr[rec->n_hps] = h->lr;
        rec->hp_mom[rec->n_hps] = h->mom;
        rec->n_hps++;
    }
    if (learn->smooth_loss < s->best_loss) s->best_loss = learn->smooth_loss;
    if (learn->smooth_loss > 4 * s->best_loss && s->stop_div)
        cf_learner_cancel(learn, CF_CANCEL_FIT);
    if (learn->train_iter >= s->num_it) cf_learner_cancel(learn, CF_CANCEL_FIT);
    return CF_OK;
}

static cf_status lf_before_validate(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_learner_cancel(learn, CF_CANCEL_VALIDATE);
    return CF_OK;
}

static cf_status lf_after_fit(cf_callback *cb, cf_learner *learn) {
    finder_state *s = cb->state;
    cf_model *m = learn->model;
    learn->in_lr_find = false;
    cf_optimizer_zero_grad(learn->opt);
    if (s->weights) memcpy(m->weights, s->weights, m->n_weights * sizeof(float));
    if (s->buffers) memcpy(m->buffers, s->buffers, m->n_buffers * sizeof(float));
    if (s->opt_copy) return cf_optimizer_copy_state(learn->opt, s->opt_copy);
    return CF_OK;
}

static void lf_free(cf_callback *cb) {
    finder_state *s = cb->state;
    if (s) {
        cf_free(s->weights);
        cf_free(s->buffers);
        cf_optimizer_free(s->opt_copy);
    }
    cf_free(s);
    cf_free(cb);
}

static cf_callback *lr_finder_cb(double start_lr, double end_lr, int num_it, bool stop_div) {
    cf_callback *cb = cf_callback_new("LRFinder", CF_ORDER_SCHEDULER, sizeof(finder_state));
    if (!cb) return NULL;
    *(finder_state *)cb->state = (finder_state){
        .start_lr = start_lr, .end_lr = end_lr, .num_it = num_it, .stop_div = stop_div};
    cb->skip_valid = true;
    cb->free = lf_free;
    cb->on[CF_EV_BEFORE_FIT] = lf_before_fit;
    cb->on[CF_EV_BEFORE_BATCH] = lf_before_batch;
    cb->on[CF_EV_AFTER_BATCH] = lf_after_batch;
    cb->on[CF_EV_BEFORE_VALIDATE] = lf_before_validate;
    cb->on[CF_EV_AFTER_FIT] = lf_after_fit;
    return cb;
}

/* ---- suggestions --------------------------------------------------------------------------- */

/* np.interp on increasing xs. */
static double interp(double x, const double *xs, const double *ys, int n) {
    if (x <= xs[0]) return ys[0];
    if (x >= xs[n - 1]) return ys[n - 1];
    for (int i = 1; i < n; i++)
        if (x <= xs[i])
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1]);
    return ys[n - 1];
}

void cf_lr_find_suggest(cf_lr_find_result *r, int num_it, int which) {
    r->suggest = which ? which : CF_SUGGEST_VALLEY;
    r->valley = r->slide = r->minimum = r->steep = NAN;
    r->valley_loss = r->slide_loss = r->minimum_lr_at = r->minimum_loss = r->steep_loss = NAN;
    /* fastai: lrs[num_it//10 : -5], losses likewise, cut at the first NaN */
    int begin = num_it / 10, end = r->n - 5;
    if (end - begin < 2) return;
    const double *lrs = r->lrs + begin, *losses = r->losses + begin;
    int n = end - begin;
    for (int i = 0; i < n; i++)
        if (isnan(losses[i])) {
            n = i;
            break;
        }
    if (n < 2) return;
    if (r->suggest & CF_SUGGEST_VALLEY) {
        /* longest decreasing run (O(n^2) as fastai), then 1/3 + 1/6 into it */
        int max_start = 0, max_end = 0;
        int lds[n];
        for (int i = 0; i < n; i++) lds[i] = 1;
        for (int i = 1; i < n; i++)
            for (int j = 0; j < i; j++) {
                if (losses[i] < losses[j] && lds[i] < lds[j] + 1) lds[i] = lds[j] + 1;
                /* inside the j loop, as fastai has it: max_start is fixed by lds[i] when it first
                 * exceeds the longest run so far, not by its final value */
                if (lds[max_end] < lds[i]) {
                    max_end = i;
                    max_start = max_end - lds[max_end];
                }
            }
        double sections = (max_end - max_start) / 3.0;
        int idx = max_start + (int)sections + (int)(sections / 2);
        /* a run from the first point makes max_start -1 and idx may be -1: Python's lrs[-1] */
        if (idx < 0) idx += n;
        r->valley = lrs[idx];
        r->valley_loss = losses[idx];
    }
    if (r->suggest & CF_SUGGEST_SLIDE) {
        /* np.gradient (second order inside, first order at the ends), then slide back while
         * the gradient changes by more than thresh */
        const int lr_diff = 15;
        const double thresh = 0.005;
        double g[n];
        g[0] = losses[1] - losses[0];
        g[n - 1] = losses[n - 1] - losses[n - 2];
        for (int i = 1; i < n - 1; i++) g[i] = (losses[i + 1] - losses[i - 1]) / 2;
        int r_i = n - 1, l_i = r_i - lr_diff;
        double local = l_i >= 0 ? lrs[l_i] : lrs[(l_i % n + n) % n];
        while (l_i >= 0 && fabs(g[r_i] - g[l_i]) > thresh) {
            local = lrs[l_i];
            r_i--;
            l_i--;
        }
        r->slide = local;
        double lx[n];
        for (int i = 0; i < n; i++) lx[i] = log10(lrs[i]);
        r->slide_loss = interp(log10(local), lx, losses, n);
    }
    if (r->suggest & CF_SUGGEST_MINIMUM) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (losses[i] < losses[best]) best = i;
        r->minimum = lrs[best] / 10;
        r->minimum_lr_at = lrs[best];
        r->minimum_loss = losses[best];
    }
    if (r->suggest & CF_SUGGEST_STEEP) {
        int best = 0;
        double best_g = INFINITY;
        for (int i = 0; i < n - 1; i++) {
            double gr = (losses[i + 1] - losses[i]) / (log(lrs[i + 1]) - log(lrs[i]));
            if (gr < best_g) {
                best_g = gr;
                best = i;
            }
        }
        r->steep = lrs[best];
        r->steep_loss = losses[best];
    }
}

void cf_lr_find_result_free(cf_lr_find_result *r) {
    if (!r) return;
    cf_free(r->lrs);
    cf_free(r->losses);
    memset(r, 0, sizeof *r);
}

cf_status cf_lr_find_(cf_learner *learn, cf_lr_find_result *result, const cf_lr_find_opts *o) {
    memset(result, 0, sizeof *result);
    double start_lr = o->start_lr > 0 ? o->start_lr : 1e-7;
    double end_lr = o->end_lr > 0 ? o->end_lr : 10;
    int num_it = o->num_it > 0 ? o->num_it : 100;
    if (num_it < 6) num_it = 6;
    if (!(end_lr > start_lr)) {
        for (int i = 0; i < o->n_cbs; i++) cf_callback_free(o->cbs[i]);
        return cf_fail(CF_ERR_INVALID, "lr_find: end_lr %g must exceed start_lr %g", end_lr,
                       start_lr);
    }
    int64_t per_epoch = cf_dataloader_len(learn->dls->train);
    if (per_epoch < 1) {
        for (int i = 0; i < o->n_cbs; i++) cf_callback_free(o->cbs[i]);
        return cf_fail(CF_ERR_INVALID, "lr_find: the training set has no full batch");
    }
    int n_epoch = (int)(num_it / per_epoch) + 1;
    cf_callback *finder = lr_finder_cb(start_lr, end_lr, num_it, !o->no_stop_div);
    cf_callback **all = cf_calloc((size_t)o->n_cbs + 1, sizeof *all);
    if (!finder || !all) {
        cf_callback_free(finder);
        cf_free(all);
        for (int i = 0; i < o->n_cbs; i++) cf_callback_free(o->cbs[i]);
        return CF_ERR_NOMEM;
    }
    all[0] = finder;
    for (int i = 0; i < o->n_cbs; i++) all[1 + i] = o->cbs[i];
    bool saved_logging = learn->logging;
    learn->logging = false; /* fastai's no_logging */
    cf_status st = cf__fit(learn, n_epoch, (cf_lr){0}, o->wd, all, o->n_cbs + 1, o->reset_opt, 0,
                           NULL, "method=lr_find");
    learn->logging = saved_logging;
    learn->in_lr_find = false;
    cf_free(all);
    if (st != CF_OK) return st;
    const cf_recorder *rec = &learn->recorder;
    result->n = (int)rec->n_batches;
    result->lrs = cf_calloc((size_t)result->n + 1, sizeof(double));
    result->losses = cf_calloc((size_t)result->n + 1, sizeof(double));
    if (!result->lrs || !result->losses) {
        cf_lr_find_result_free(result);
        return CF_ERR_NOMEM;
    }
    memcpy(result->lrs, rec->lrs, (size_t)result->n * sizeof(double));
    memcpy(result->losses, rec->losses, (size_t)result->n * sizeof(double));
    cf_lr_find_suggest(result, num_it, o->suggest);
    if (o->plot && o->plot_path && learn->replica.is_master) {
        char path[4096];
        if (o->plot_path[0] == '/' || !learn->path)
            snprintf(path, sizeof path, "%s", o->plot_path);
        else
            snprintf(path, sizeof path, "%s/%s", learn->path, o->plot_path);
        st = o->plot(result, path);
        if (st == CF_OK) st = cf_learner_note_figure(learn, path);
        if (st != CF_OK) {
            cf_lr_find_result_free(result);
            return cf_fail_context(st, "lr_find: drawing %s", path);
        }
    }
    return CF_OK;
}

/* ---- the result as bytes ------------------------------------------------------------------- */

static void put_lr_find_result(const void *obj, cf__writer *w) {
    const cf_lr_find_result *r = obj;
    cf__put_header(w, "CFLF", 1);
    cf__put_array(w, r->lrs, r->n, sizeof(double));
    cf__put_array(w, r->losses, r->n, sizeof(double));
    cf__put_u64(w, (uint64_t)(uint32_t)r->suggest);
    const double v[] = {r->valley,        r->slide,        r->minimum,
                        r->steep,         r->valley_loss,  r->slide_loss,
                        r->minimum_lr_at, r->minimum_loss, r->steep_loss};
    cf__put(w, v, sizeof v);
}

size_t cf_lr_find_result_export(const cf_lr_find_result *r, void *buf, size_t size) {
    return cf__export(put_lr_find_result, r, buf, size);
}

cf_status cf_lr_find_result_import(cf_lr_find_result *out, const void *buf, size_t size) {
    cf__reader rd = cf__reader_make(buf, size, "lr_find result");
    cf_lr_find_result t = {0};
    int64_t n = 0, n2 = 0;
    cf__get_header(&rd, "CFLF", 1);
    t.lrs = cf__get_array(&rd, "lrs", INT32_MAX, sizeof(double), &n);
    t.losses = cf__get_array(&rd, "losses", INT32_MAX, sizeof(double), &n2);
    if (rd.st == CF_OK && n != n2)
        cf__reader_fail(&rd, "%lld lrs and %lld losses differ", (long long)n, (long long)n2);
    t.n = (int)n;
    t.suggest = (int)cf__get_u64(&rd);
    double v[9] = {0};
    cf__get(&rd, v, sizeof v);
    cf__get_end(&rd);
    if (rd.st != CF_OK) {
        cf_lr_find_result_free(&t);
        return rd.st;
    }
    t.valley = v[0], t.slide = v[1], t.minimum = v[2], t.steep = v[3];
    t.valley_loss = v[4], t.slide_loss = v[5], t.minimum_lr_at = v[6], t.minimum_loss = v[7];
    t.steep_loss = v[8];
    cf_lr_find_result_free(out);
    *out = t;
    return CF_OK;
}
