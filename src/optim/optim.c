/* Optimizers over the model's flat weight block: fastai's SGD and Adam with per-group
 * hyper-parameters, decoupled or L2 weight decay, and per-parameter do_wd.
 *
 * A step first computes, for every trainable parameter, the coefficients of its update (the
 * group's hypers, its weight decay, Adam's bias corrections from its own step counter), then runs
 * one fused element-wise pass over the weight block. The pass is split over the thread pool for
 * large models; being element-wise, the result does not depend on the split. */
#include "corefit/optim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/bytes.h"

/* Models smaller than this (weights, not bytes) are stepped on the calling thread. The
 * gradients come from the calling thread (the layers reduce their per-thread partial sums
 * there) and the next forward packs the weights there, so a parallel step moves the other
 * threads' shares of both between cores and back each step; below about 2 MB a weight (W1's
 * mini-resnet: 108,528), that costs about what the split saves, and more where the host places
 * the cores far apart. */
#define CF_OPT_PARALLEL_MIN (1 << 19)

typedef struct opt_coef {
    size_t begin, end; /* element range in the weight block */
    bool active;       /* trainable this step */
    cf_opt_update u;   /* the update's coefficients */
} opt_coef;

typedef struct opt_work {
    opt_coef *coefs; /* one per trainable-kind parameter, in weight-block order */
    int n_coefs;
    int *coef_param; /* index into model->params of each coef */
} opt_work;

static bool is_buffer_kind(cf_param_kind k) {
    return k == CF_PARAM_BUFFER || k == CF_PARAM_COUNTER;
}

cf_opt_config cf_opt_adam_defaults(void) {
    return (cf_opt_config){
        .kind = CF_OPT_ADAM,
        .hypers = {.lr = 1e-3, .mom = 0.9, .sqr_mom = 0.99, .eps = 1e-5, .wd = 0.01},
        .decouple_wd = true,
        .wd_bn_bias = false,
    };
}

cf_opt_config cf_opt_sgd_defaults(void) {
    return (cf_opt_config){
        .kind = CF_OPT_SGD,
        .hypers = {.lr = 1e-3, .mom = 0.0, .sqr_mom = 0.99, .eps = 1e-5, .wd = 0.0},
        .decouple_wd = true,
        .wd_bn_bias = false,
    };
}

static cf_status check_hypers(const cf_hypers *h, const char *what) {
    const double v[5] = {h->lr, h->mom, h->sqr_mom, h->eps, h->wd};
    const char *names[5] = {"lr", "mom", "sqr_mom", "eps", "wd"};
    for (int i = 0; i < 5; i++)
        if (!isfinite(v[i]))
            return cf_fail(CF_ERR_INVALID, "%s: hyper-parameter %s is %g (must be finite)", what,
                           names[i], v[i]);
    return CF_OK;
}

void cf_optimizer_free(cf_optimizer *opt) {
    if (!opt) return;
    opt_work *w = opt->work;
    if (w) {
        cf_free(w->coefs);
        cf_free(w->coef_param);
        cf_free(w);
    }
    cf_free(opt->hypers);
    cf_free(opt->grad_avg);
    cf_free(opt->sqr_avg);
    cf_free(opt->steps);
    cf_free(opt->do_wd);
    cf_free(opt);
}

cf_status cf_optimizer_new(cf_optimizer **out, cf_model *model, const cf_opt_config *config) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_optimizer_new: NULL out");
    *out = NULL;
    if (!model || !config) return cf_fail(CF_ERR_INVALID, "cf_optimizer_new: NULL model or config");
    if (config->kind != CF_OPT_SGD && config->kind != CF_OPT_ADAM)
        return cf_fail(CF_ERR_INVALID, "cf_optimizer_new: unknown optimizer kind %d",
                       (int)config->kind);
    cf_status st = check_hypers(&config->hypers, "cf_optimizer_new");
    if (st != CF_OK) return st;
    int n_groups = model->n_groups > 0 ? model->n_groups : 1;

    cf_optimizer *opt = cf_calloc(1, sizeof *opt);
    if (!opt) return cf_fail_context(CF_ERR_NOMEM, "optimizer");
    opt->config = *config;
    opt->model = model;
    opt->n_groups = n_groups;
    opt->hypers = cf_calloc((size_t)n_groups, sizeof *opt->hypers);
    opt->steps = cf_calloc((size_t)model->n_params + 1, sizeof *opt->steps);
    opt->do_wd = cf_calloc((size_t)model->n_params + 1, sizeof *opt->do_wd);
    bool momentum = config->kind == CF_OPT_ADAM || config->hypers.mom != 0.0;
    if (momentum) opt->grad_avg = cf_calloc(model->n_weights + 1, sizeof(float));
    if (config->kind == CF_OPT_ADAM) opt->sqr_avg = cf_calloc(model->n_weights + 1, sizeof(float));
    opt_work *w = cf_calloc(1, sizeof *w);
    opt->work = w;
    if (w) {
        w->coefs = cf_calloc((size_t)model->n_params + 1, sizeof *w->coefs);
        w->coef_param = cf_calloc((size_t)model->n_params + 1, sizeof *w->coef_param);
    }
    if (!opt->hypers || !opt->steps || !opt->do_wd || (momentum && !opt->grad_avg) ||
        (config->kind == CF_OPT_ADAM && !opt->sqr_avg) || !w || !w->coefs || !w->coef_param) {
        cf_optimizer_free(opt);
        return cf_fail_context(CF_ERR_NOMEM, "optimizer state for %zu weights", model->n_weights);
    }
    for (int g = 0; g < n_groups; g++) opt->hypers[g] = config->hypers;
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (is_buffer_kind(p->kind)) continue;
        opt->do_wd[i] = p->kind == CF_PARAM_WEIGHT || config->wd_bn_bias;
        opt_coef *c = &w->coefs[w->n_coefs];
        c->begin = p->offset;
        c->end = p->offset + p->numel;
        w->coef_param[w->n_coefs] = i;
        w->n_coefs++;
    }
    *out = opt;
    return CF_OK;
}

/* Fills the coefficients of this step and advances the step counters of trainable parameters. */
static void prepare_step(cf_optimizer *opt) {
    opt_work *w = opt->work;
    const cf_model *model = opt->model;
    bool adam = opt->config.kind == CF_OPT_ADAM;
    for (int k = 0; k < w->n_coefs; k++) {
        opt_coef *c = &w->coefs[k];
        int i = w->coef_param[k];
        const cf_param *p = model->params[i];
        c->active = p->trainable;
        if (!c->active) continue;
        int g = p->group;
        if (g < 0) g = 0;
        if (g >= opt->n_groups) g = opt->n_groups - 1; /* groups added after the optimizer */
        const cf_hypers *h = &opt->hypers[g];
        bool wd = opt->do_wd[i] && h->wd != 0.0;
        cf_opt_update *u = &c->u;
        u->decoupled = wd && opt->config.decouple_wd;
        u->l2 = wd && !opt->config.decouple_wd;
        u->decay = (float)(1.0 - h->lr * h->wd);
        u->wd = (float)h->wd;
        u->lr = (float)h->lr;
        u->mom = (float)h->mom;
        u->mom_w = adam ? (float)(1.0 - h->mom) : 1.0f;
        u->sqr_mom = (float)h->sqr_mom;
        u->sqr_w = (float)(1.0 - h->sqr_mom);
        u->eps = (float)h->eps;
        opt->steps[i] += 1.0f;
        if (adam) {
            double step = opt->steps[i];
            double debias1 = 1.0 - pow(h->mom, step);
            double debias2 = 1.0 - pow(h->sqr_mom, step);
            u->step_size = (float)(h->lr / debias1);
            u->debias2_sqrt = (float)sqrt(debias2);
        }
    }
}

typedef struct step_ctx {
    cf_optimizer *opt;
} step_ctx;

/* The update of one coefficient's elements [s, t): the tensor layer's element-wise kernels. */
static void step_segment(const cf_optimizer *opt, const opt_coef *c, size_t s, size_t t) {
    float *w = opt->model->weights + s, *ga = opt->grad_avg ? opt->grad_avg + s : NULL;
    const float *g = opt->model->grads + s;
    if (opt->config.kind == CF_OPT_SGD)
        cf_sgd_update(&c->u, w, g, ga, t - s);
    else
        cf_adam_update(&c->u, w, g, ga, opt->sqr_avg + s, t - s);
}

static void step_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const cf_optimizer *opt = ((step_ctx *)ctx)->opt;
    const opt_work *w = opt->work;
    /* first coefficient whose range ends after `begin` */
    int lo = 0, hi = w->n_coefs;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (w->coefs[mid].end <= (size_t)begin)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int k = lo; k < w->n_coefs && w->coefs[k].begin < (size_t)end; k++) {
        const opt_coef *c = &w->coefs[k];
        if (!c->active) continue;
        size_t s = c->begin > (size_t)begin ? c->begin : (size_t)begin;
        size_t t = c->end < (size_t)end ? c->end : (size_t)end;
        if (s < t) step_segment(opt, c, s, t);
    }
}

void cf_optimizer_step(cf_optimizer *opt) {
    if (!opt || !opt->model->n_weights) return;
    prepare_step(opt);
    step_ctx ctx = {opt};
    int64_t n = (int64_t)opt->model->n_weights;
    if (n < CF_OPT_PARALLEL_MIN)
        step_range(&ctx, 0, n, 0);
    else
        cf_parallel_for(n, step_range, &ctx);
}

void cf_optimizer_zero_grad(cf_optimizer *opt) {
    if (opt) cf_model_zero_grad(opt->model);
}

void cf_optimizer_clear_state(cf_optimizer *opt) {
    if (!opt) return;
    size_t n = opt->model->n_weights;
    if (opt->grad_avg) memset(opt->grad_avg, 0, n * sizeof(float));
    if (opt->sqr_avg) memset(opt->sqr_avg, 0, n * sizeof(float));
    memset(opt->steps, 0, (size_t)opt->model->n_params * sizeof *opt->steps);
}

static double *hyper_field(cf_hypers *h, const char *name) {
    if (strcmp(name, "lr") == 0) return &h->lr;
    if (strcmp(name, "mom") == 0) return &h->mom;
    if (strcmp(name, "sqr_mom") == 0) return &h->sqr_mom;
    if (strcmp(name, "eps") == 0) return &h->eps;
    if (strcmp(name, "wd") == 0) return &h->wd;
    return NULL;
}

cf_status cf_optimizer_set_hyper(cf_optimizer *opt, const char *name, const double *values, int n) {
    if (!opt || !name) return cf_fail(CF_ERR_INVALID, "cf_optimizer_set_hyper: NULL argument");
    if (!hyper_field(&opt->hypers[0], name))
        return cf_fail(CF_ERR_INVALID,
                       "cf_optimizer_set_hyper: unknown hyper-parameter \"%s\" (expected lr, "
                       "mom, sqr_mom, eps or wd)",
                       name);
    if (!values || n < 1)
        return cf_fail(CF_ERR_INVALID, "cf_optimizer_set_hyper(\"%s\"): no values given", name);
    if (n != 1 && n != opt->n_groups)
        return cf_fail(CF_ERR_INVALID,
                       "cf_optimizer_set_hyper(\"%s\"): %d values for %d parameter groups (give "
                       "1 or %d)",
                       name, n, opt->n_groups, opt->n_groups);
    for (int i = 0; i < n; i++)
        if (!isfinite(values[i]))
            return cf_fail(CF_ERR_INVALID,
                           "cf_optimizer_set_hyper(\"%s\"): value %d is %g (must be finite)", name,
                           i, values[i]);
    for (int g = 0; g < opt->n_groups; g++)
        *hyper_field(&opt->hypers[g], name) = values[n == 1 ? 0 : g];
    return CF_OK;
}

void cf_hyper_slice(double start, double stop, int n, double *out) {
    if (n <= 0 || !out) return;
    if (start > 0.0) {
        if (n == 1) {
            out[0] = stop;
            return;
        }
        /* fastai's even_mults: step = (stop/start)**(1/(n-1)), start * step**i */
        double step = pow(stop / start, 1.0 / (double)(n - 1));
        for (int i = 0; i < n; i++) out[i] = start * pow(step, (double)i);
        return;
    }
    for (int i = 0; i < n - 1; i++) out[i] = stop / 10.0;
    out[n - 1] = stop;
}

cf_status cf_optimizer_copy_state(cf_optimizer *dst, const cf_optimizer *src) {
    if (!dst || !src) return cf_fail(CF_ERR_INVALID, "cf_optimizer_copy_state: NULL optimizer");
    if (dst == src) return CF_OK;
    const cf_model *a = dst->model, *b = src->model;
    if (a->n_weights != b->n_weights || a->n_params != b->n_params ||
        dst->n_groups != src->n_groups)
        return cf_fail(CF_ERR_INVALID,
                       "cf_optimizer_copy_state: optimizers differ (%zu vs %zu weights, %d vs %d "
                       "parameters, %d vs %d groups)",
                       a->n_weights, b->n_weights, a->n_params, b->n_params, dst->n_groups,
                       src->n_groups);
    if (dst->config.kind != src->config.kind || !dst->grad_avg != !src->grad_avg ||
        !dst->sqr_avg != !src->sqr_avg)
        return cf_fail(CF_ERR_INVALID,
                       "cf_optimizer_copy_state: optimizers of different kinds (%s%s vs %s%s)",
                       dst->config.kind == CF_OPT_ADAM ? "Adam" : "SGD",
                       dst->grad_avg ? " with moving averages" : "",
                       src->config.kind == CF_OPT_ADAM ? "Adam" : "SGD",
                       src->grad_avg ? " with moving averages" : "");
    memcpy(dst->hypers, src->hypers, (size_t)src->n_groups * sizeof *src->hypers);
    if (src->grad_avg) memcpy(dst->grad_avg, src->grad_avg, b->n_weights * sizeof(float));
    if (src->sqr_avg) memcpy(dst->sqr_avg, src->sqr_avg, b->n_weights * sizeof(float));
    memcpy(dst->steps, src->steps, (size_t)b->n_params * sizeof *src->steps);
    return CF_OK;
}

size_t cf_optimizer_state_floats(const cf_optimizer *opt) {
    if (!opt) return 0;
    size_t n = (size_t)opt->model->n_params;
    if (opt->grad_avg) n += opt->model->n_weights;
    if (opt->sqr_avg) n += opt->model->n_weights;
    return n;
}

/* ---- state as bytes ------------------------------------------------------------------------ */

/* Format v1 (host byte order; for moving state between processes of one program):
 *   u32 magic "CFOP", u32 version, u32 kind, u32 n_groups, u64 n_weights, u64 n_params,
 *   u32 has_grad_avg, u32 has_sqr_avg, cf_hypers[n_groups] (5 doubles each),
 *   f32 grad_avg[n_weights] (if present), f32 sqr_avg[n_weights] (if present),
 *   f32 steps[n_params]. */
#define OPT_MAGIC 0x504f4643u /* "CFOP" */
#define OPT_VERSION 1u
#define OPT_HEADER_BYTES (4 * 4 + 2 * 8 + 2 * 4)

static size_t opt_state_bytes(const cf_optimizer *opt) {
    return OPT_HEADER_BYTES + (size_t)opt->n_groups * sizeof(cf_hypers) +
           cf_optimizer_state_floats(opt) * sizeof(float);
}

static void put_opt_state(const void *obj, cf__writer *w) {
    const cf_optimizer *opt = obj;
    uint32_t u32[4] = {OPT_MAGIC, OPT_VERSION, (uint32_t)opt->config.kind, (uint32_t)opt->n_groups};
    uint64_t u64[2] = {opt->model->n_weights, (uint64_t)opt->model->n_params};
    uint32_t has[2] = {opt->grad_avg != NULL, opt->sqr_avg != NULL};
    size_t hb = (size_t)opt->n_groups * sizeof(cf_hypers),
           wb = opt->model->n_weights * sizeof(float);
    cf__put(w, u32, sizeof u32);
    cf__put(w, u64, sizeof u64);
    cf__put(w, has, sizeof has);
    cf__put(w, opt->hypers, hb);
    if (opt->grad_avg) cf__put(w, opt->grad_avg, wb);
    if (opt->sqr_avg) cf__put(w, opt->sqr_avg, wb);
    cf__put(w, opt->steps, (size_t)opt->model->n_params * sizeof(float));
}

size_t cf_optimizer_export(const cf_optimizer *opt, void *buf, size_t size) {
    return opt ? cf__export(put_opt_state, opt, buf, size) : 0;
}

cf_status cf_optimizer_import(cf_optimizer *opt, const void *buf, size_t size) {
    if (!opt || (!buf && size))
        return cf_fail(CF_ERR_INVALID, "optimizer state: NULL optimizer or buffer");
    if (size < OPT_HEADER_BYTES)
        return cf_fail(CF_ERR_INVALID,
                       "optimizer state: %zu bytes, shorter than its %d-byte header", size,
                       OPT_HEADER_BYTES);
    cf__reader rd = cf__reader_make(buf, size, "optimizer state");
    uint32_t u32[4], has[2];
    uint64_t u64[2];
    cf__get(&rd, u32, sizeof u32); /* within the header: cannot fail */
    cf__get(&rd, u64, sizeof u64);
    cf__get(&rd, has, sizeof has);
    if (u32[0] != OPT_MAGIC)
        return cf_fail(CF_ERR_INVALID, "optimizer state: offset 0: magic 0x%08x is not \"CFOP\"",
                       u32[0]);
    if (u32[1] != OPT_VERSION)
        return cf_fail(CF_ERR_INVALID,
                       "optimizer state: offset 4: version %u (this build reads %u)", u32[1],
                       OPT_VERSION);
    if (u32[2] != (uint32_t)opt->config.kind || u32[3] != (uint32_t)opt->n_groups ||
        u64[0] != opt->model->n_weights || u64[1] != (uint64_t)opt->model->n_params ||
        has[0] != (opt->grad_avg != NULL) || has[1] != (opt->sqr_avg != NULL))
        return cf_fail(CF_ERR_INVALID,
                       "optimizer state: offset 8: kind %u, %u groups, %llu weights, %llu "
                       "parameters, averages %u/%u; this optimizer has kind %d, %d groups, %zu "
                       "weights, %d parameters, averages %d/%d",
                       u32[2], u32[3], (unsigned long long)u64[0], (unsigned long long)u64[1],
                       has[0], has[1], (int)opt->config.kind, opt->n_groups, opt->model->n_weights,
                       opt->model->n_params, opt->grad_avg != NULL, opt->sqr_avg != NULL);
    size_t need = opt_state_bytes(opt);
    if (size != need)
        return cf_fail(CF_ERR_INVALID, "optimizer state: %zu bytes, expected %zu", size, need);
    size_t hb = (size_t)opt->n_groups * sizeof(cf_hypers),
           wb = opt->model->n_weights * sizeof(float);
    cf__get(&rd, opt->hypers, hb); /* the size is checked: these cannot fail */
    if (opt->grad_avg) cf__get(&rd, opt->grad_avg, wb);
    if (opt->sqr_avg) cf__get(&rd, opt->sqr_avg, wb);
    cf__get(&rd, opt->steps, (size_t)opt->model->n_params * sizeof(float));
    return rd.st;
}
