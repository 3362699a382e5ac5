/* Saving and loading a model (and optionally its optimizer) as safetensors under PyTorch's
 * state_dict names, so that torch's load_state_dict(strict=True) takes the file as it is once the
 * "opt." entries are left out.
 *
 * Optimizer entries: "opt.<name>.grad_avg" and "opt.<name>.sqr_avg" (when the optimizer keeps
 * them), "opt.<name>.step" (I64 scalar) for every trainable-kind parameter, and "opt.hypers"
 * (n_groups x 5: lr, mom, sqr_mom, eps, wd). Metadata: "format": "pt", and with an optimizer
 * "corefit.optimizer": "Adam" or "SGD" and "corefit.opt.hypers", the same hypers as text in full
 * double precision (so that a reloaded optimizer continues bit for bit), which must agree with
 * the float32 tensor. */
#include "corefit/io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPT_PREFIX "opt."

static bool is_buffer_kind(cf_param_kind k) {
    return k == CF_PARAM_BUFFER || k == CF_PARAM_COUNTER;
}

static const char *opt_kind_name(const cf_optimizer *opt) {
    return opt->config.kind == CF_OPT_ADAM ? "Adam" : "SGD";
}

static char *opt_name(const char *param, const char *what) {
    size_t n = strlen(OPT_PREFIX) + strlen(param) + strlen(what) + 2;
    char *s = cf_malloc(n);
    if (s) snprintf(s, n, OPT_PREFIX "%s.%s", param, what);
    return s;
}

cf_status cf_model_save(const cf_model *model, const cf_optimizer *opt, const char *path) {
    if (!model || !path) return cf_fail(CF_ERR_INVALID, "cf_model_save: NULL model or path");
    if (opt && (opt->model != model))
        return cf_fail(CF_ERR_INVALID, "saving %s: the optimizer belongs to another model", path);
    int n_train = 0;
    for (int i = 0; i < model->n_params; i++)
        if (!is_buffer_kind(model->params[i]->kind)) n_train++;
    int per = opt ? 1 + (opt->grad_avg ? 1 : 0) + (opt->sqr_avg ? 1 : 0) : 0;
    int cap = model->n_params + n_train * per + (opt ? 1 : 0);
    cf_st_entry *entries = cf_calloc((size_t)cap + 1, sizeof *entries);
    float *hypers = opt ? cf_calloc((size_t)opt->n_groups * 5, sizeof(float)) : NULL;
    char *hyper_text = NULL;
    cf_status st = CF_OK;
    int n = 0, first_owned = 0; /* entries from first_owned on have allocated names */
    if (!entries || (opt && !hypers)) {
        st = cf_fail_context(CF_ERR_NOMEM, "saving %s", path);
        goto done;
    }
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        bool counter = p->kind == CF_PARAM_COUNTER;
        entries[n++] = (cf_st_entry){
            .name = p->full_name,
            .dtype = counter ? CF_DTYPE_I64 : CF_DTYPE_F32,
            /* PyTorch keeps num_batches_tracked as a 0-dim int64 tensor */
            .shape = counter && p->numel == 1 ? (cf_shape){.ndim = 0} : p->shape,
            .numel = p->numel,
            .data = p->data,
        };
    }
    first_owned = n;
    if (opt) {
        for (int i = 0; i < model->n_params; i++) {
            const cf_param *p = model->params[i];
            if (is_buffer_kind(p->kind)) continue;
            if (opt->grad_avg) {
                entries[n] = (cf_st_entry){.name = opt_name(p->full_name, "grad_avg"),
                                           .shape = p->shape,
                                           .numel = p->numel,
                                           .data = opt->grad_avg + p->offset};
                if (!entries[n++].name) goto nomem;
            }
            if (opt->sqr_avg) {
                entries[n] = (cf_st_entry){.name = opt_name(p->full_name, "sqr_avg"),
                                           .shape = p->shape,
                                           .numel = p->numel,
                                           .data = opt->sqr_avg + p->offset};
                if (!entries[n++].name) goto nomem;
            }
            entries[n] = (cf_st_entry){.name = opt_name(p->full_name, "step"),
                                       .dtype = CF_DTYPE_I64,
                                       .shape = {.ndim = 0},
                                       .numel = 1,
                                       .data = &opt->steps[i]};
            if (!entries[n++].name) goto nomem;
        }
        for (int g = 0; g < opt->n_groups; g++) {
            const cf_hypers *h = &opt->hypers[g];
            float *row = hypers + 5 * g;
            row[0] = (float)h->lr;
            row[1] = (float)h->mom;
            row[2] = (float)h->sqr_mom;
            row[3] = (float)h->eps;
            row[4] = (float)h->wd;
        }
        hyper_text = cf_malloc((size_t)opt->n_groups * 5 * 26 + 1);
        if (!hyper_text) goto nomem;
        size_t at = 0;
        for (int g = 0; g < opt->n_groups; g++) {
            const cf_hypers *h = &opt->hypers[g];
            const double v[5] = {h->lr, h->mom, h->sqr_mom, h->eps, h->wd};
            for (int k = 0; k < 5; k++)
                at += (size_t)snprintf(hyper_text + at, 27, "%s%.17g", at ? " " : "", v[k]);
        }
        entries[n] = (cf_st_entry){.name = cf_strdup(OPT_PREFIX "hypers"),
                                   .shape = cf_shape2(opt->n_groups, 5),
                                   .numel = (size_t)opt->n_groups * 5,
                                   .data = hypers};
        if (!entries[n++].name) goto nomem;
    }
    {
        const char *keys[3] = {"format", "corefit.optimizer", "corefit.opt.hypers"};
        const char *values[3] = {"pt", opt ? opt_kind_name(opt) : "", hyper_text};
        st = cf_st_write(path, entries, n, keys, values, opt ? 3 : 1);
    }
    goto done;
nomem:
    st = cf_fail_context(CF_ERR_NOMEM, "saving %s", path);
done:
    if (entries)
        for (int i = first_owned; i < n; i++) cf_free(entries[i].name);
    cf_free(entries);
    cf_free(hypers);
    cf_free(hyper_text);
    return st;
}

static cf_status expect_shape(const char *path, const cf_st_entry *e, const char *name,
                              const cf_shape *shape) {
    char a[96], b[96];
    if (!e)
        return cf_fail(CF_ERR_FORMAT, "%s: tensor '%s' (shape %s) is missing from the file", path,
                       name, cf_shape_str(shape, b, sizeof b));
    if (!cf_shape_equal(&e->shape, shape))
        return cf_fail(CF_ERR_FORMAT,
                       "%s: tensor '%s' has shape %s in the file but %s in the model", path, name,
                       cf_shape_str(&e->shape, a, sizeof a), cf_shape_str(shape, b, sizeof b));
    return CF_OK;
}

/* The file's optimizer entries, checked against opt. *present is false when the file holds no
 * optimizer state at all. */
static cf_status check_opt(const char *path, const cf_st_file *f, const cf_optimizer *opt,
                           bool *present, double *hyp) {
    const cf_model *model = opt->model;
    const cf_st_entry *h = cf_st_find(f, OPT_PREFIX "hypers");
    bool any = false;
    for (int i = 0; i < f->n_entries; i++)
        if (strncmp(f->entries[i].name, OPT_PREFIX, strlen(OPT_PREFIX)) == 0) any = true;
    *present = any;
    if (!any) return CF_OK;
    const char *kind = cf_st_meta(f, "corefit.optimizer");
    if (kind && strcmp(kind, opt_kind_name(opt)) != 0)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: the file holds %s optimizer state but the optimizer is %s", path, kind,
                       opt_kind_name(opt));
    cf_shape hs = cf_shape2(opt->n_groups, 5);
    cf_status st = expect_shape(path, h, OPT_PREFIX "hypers", &hs);
    if (st != CF_OK) return st;
    for (size_t i = 0; i < h->numel; i++)
        if (!isfinite(h->data[i]))
            return cf_fail(CF_ERR_FORMAT, "%s: opt.hypers[%zu][%zu] is %g", path, i / 5, i % 5,
                           (double)h->data[i]);
    for (size_t i = 0; i < h->numel; i++) hyp[i] = h->data[i];
    const char *text = cf_st_meta(f, "corefit.opt.hypers");
    if (text) { /* the exact values; they must agree with the tensor */
        const char *at = text;
        for (size_t i = 0; i < h->numel; i++) {
            char *end;
            double v = strtod(at, &end);
            if (end == at || !isfinite(v) || (float)v != h->data[i])
                return cf_fail(CF_ERR_FORMAT,
                               "%s: metadata corefit.opt.hypers value %zu (\"%.24s\") does not "
                               "match opt.hypers[%zu][%zu] = %.9g",
                               path, i, at, i / 5, i % 5, (double)h->data[i]);
            hyp[i] = v;
            at = end;
        }
        while (*at == ' ') at++;
        if (*at)
            return cf_fail(CF_ERR_FORMAT,
                           "%s: metadata corefit.opt.hypers has more than %zu values (\"%.24s\")",
                           path, h->numel, at);
    }
    char name[600];
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (is_buffer_kind(p->kind)) continue;
        if (opt->grad_avg) {
            snprintf(name, sizeof name, OPT_PREFIX "%s.grad_avg", p->full_name);
            if ((st = expect_shape(path, cf_st_find(f, name), name, &p->shape)) != CF_OK) return st;
        }
        if (opt->sqr_avg) {
            snprintf(name, sizeof name, OPT_PREFIX "%s.sqr_avg", p->full_name);
            if ((st = expect_shape(path, cf_st_find(f, name), name, &p->shape)) != CF_OK) return st;
        }
        snprintf(name, sizeof name, OPT_PREFIX "%s.step", p->full_name);
        const cf_st_entry *s = cf_st_find(f, name);
        if (!s)
            return cf_fail(CF_ERR_FORMAT, "%s: tensor '%s' is missing from the file", path, name);
        if (s->numel != 1)
            return cf_fail(CF_ERR_FORMAT, "%s: tensor '%s' has %zu elements (expected a scalar)",
                           path, name, s->numel);
        if (!(s->data[0] >= 0.0f) || !isfinite(s->data[0]) || floorf(s->data[0]) != s->data[0])
            return cf_fail(CF_ERR_FORMAT, "%s: tensor '%s' is %g (expected a step count)", path,
                           name, (double)s->data[0]);
    }
    return CF_OK;
}

static void copy_opt(const cf_st_file *f, cf_optimizer *opt, const double *hyp) {
    const cf_model *model = opt->model;
    for (int g = 0; g < opt->n_groups; g++) {
        const double *row = hyp + 5 * g;
        opt->hypers[g] = (cf_hypers){row[0], row[1], row[2], row[3], row[4]};
    }
    char name[600];
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (is_buffer_kind(p->kind)) continue;
        if (opt->grad_avg) {
            snprintf(name, sizeof name, OPT_PREFIX "%s.grad_avg", p->full_name);
            memcpy(opt->grad_avg + p->offset, cf_st_find(f, name)->data, p->numel * sizeof(float));
        }
        if (opt->sqr_avg) {
            snprintf(name, sizeof name, OPT_PREFIX "%s.sqr_avg", p->full_name);
            memcpy(opt->sqr_avg + p->offset, cf_st_find(f, name)->data, p->numel * sizeof(float));
        }
        snprintf(name, sizeof name, OPT_PREFIX "%s.step", p->full_name);
        opt->steps[i] = cf_st_find(f, name)->data[0];
    }
}

cf_status cf_model_load(cf_model *model, cf_optimizer *opt, const char *path) {
    if (!model || !path) return cf_fail(CF_ERR_INVALID, "cf_model_load: NULL model or path");
    if (opt && opt->model != model)
        return cf_fail(CF_ERR_INVALID, "loading %s: the optimizer belongs to another model", path);
    cf_st_file *f = NULL;
    cf_status st = cf_st_read(path, &f);
    if (st != CF_OK) return st;
    /* Validate everything before touching the model. */
    for (int i = 0; i < model->n_params && st == CF_OK; i++) {
        const cf_param *p = model->params[i];
        const cf_st_entry *e = cf_st_find(f, p->full_name);
        if (e && p->kind == CF_PARAM_COUNTER && p->numel == 1 && e->numel == 1)
            continue; /* a counter may be a scalar or a one-element vector */
        st = expect_shape(path, e, p->full_name, &p->shape);
        /* NaN or infinite weights (a diverged fit saved) would only predict NaN. */
        for (size_t k = 0; st == CF_OK && k < p->numel; k++)
            if (!isfinite(e->data[k]))
                st = cf_fail(CF_ERR_NONFINITE,
                             "%s: tensor '%s' holds %s at element %zu (a diverged fit? the model "
                             "is left as it was)",
                             path, p->full_name, isnan(e->data[k]) ? "NaN" : "an infinity", k);
        /* A variance below 0 would make BatchNorm's evaluation take the root of a negative. */
        size_t len = strlen(p->full_name), suffix = strlen(".running_var");
        if (p->kind == CF_PARAM_BUFFER && len >= suffix &&
            strcmp(p->full_name + len - suffix, ".running_var") == 0)
            for (size_t k = 0; st == CF_OK && k < p->numel; k++)
                if (e->data[k] < 0)
                    st = cf_fail(CF_ERR_FORMAT,
                                 "%s: tensor '%s' holds the negative variance %g at element %zu "
                                 "(a running variance is never below 0; the model is left as it "
                                 "was)",
                                 path, p->full_name, (double)e->data[k], k);
    }
    for (int i = 0; i < f->n_entries && st == CF_OK; i++) {
        const char *name = f->entries[i].name;
        if (strncmp(name, OPT_PREFIX, strlen(OPT_PREFIX)) == 0) continue;
        if (!cf_model_param(model, name))
            st = cf_fail(CF_ERR_FORMAT,
                         "%s: unexpected tensor '%s' (not a parameter or buffer of the model)",
                         path, name);
    }
    bool opt_present = false;
    double *hyp = NULL;
    if (st == CF_OK && opt) {
        hyp = cf_calloc((size_t)opt->n_groups * 5, sizeof *hyp);
        st = hyp ? check_opt(path, f, opt, &opt_present, hyp)
                 : cf_fail_context(CF_ERR_NOMEM, "loading %s", path);
    }
    if (st == CF_OK) {
        for (int i = 0; i < model->n_params; i++) {
            cf_param *p = model->params[i];
            memcpy(p->data, cf_st_find(f, p->full_name)->data, p->numel * sizeof(float));
        }
        if (opt && opt_present) copy_opt(f, opt, hyp);
    }
    cf_free(hyp);
    cf_st_free(f);
    return st;
}
