/* fastai's vision_learner and tabular_learner. */
#include "corefit/learn.h"

#include "corefit/io.h"

#include <stdio.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "learn/internal.h"

static const char *const arch_names[] = {
    [CF_ARCH_MINI_RESNET] = "mini-resnet", [CF_ARCH_SIMPLE_CNN] = "simple-cnn",
    [CF_ARCH_XRESNET18] = "xresnet18",     [CF_ARCH_XRESNET34] = "xresnet34",
    [CF_ARCH_XRESNET50] = "xresnet50",     [CF_ARCH_RESNET18] = "resnet18",
    [CF_ARCH_RESNET34] = "resnet34",       [CF_ARCH_RESNET50] = "resnet50",
    [CF_ARCH_FAST_CNN] = "fast-cnn",
};

static int resnet_depth(cf_arch arch) {
    return arch == CF_ARCH_RESNET18   ? 18
           : arch == CF_ARCH_RESNET34 ? 34
           : arch == CF_ARCH_RESNET50 ? 50
                                      : 0;
}

/* ImageNet's statistics (fastai's imagenet_stats). */
static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f},
                   imagenet_std[3] = {0.229f, 0.224f, 0.225f};

const char *cf_arch_name(cf_arch arch) {
    return (unsigned)arch < sizeof arch_names / sizeof *arch_names ? arch_names[arch] : "unknown";
}

int cf_arch_from_name(const char *name) {
    for (size_t i = 0; i < sizeof arch_names / sizeof *arch_names; i++)
        if (strcasecmp(name, arch_names[i]) == 0) return (int)i;
    return -1;
}

static void drop_owned(cf_metric **metrics, int n_metrics, cf_callback **cbs, int n_cbs) {
    for (int i = 0; i < n_metrics; i++) cf_metric_free(metrics[i]);
    for (int i = 0; i < n_cbs; i++) cf_callback_free(cbs[i]);
}

static cf_head_opts head_options(cf_arch arch, const cf_vision_opts *o) {
    cf_head_opts h = cf_head_defaults();
    if (arch == CF_ARCH_MINI_RESNET) { /* W1's head */
        h.n_lin_ftrs = 1;
        h.lin_ftrs[0] = 256;
        h.n_ps = 2;
        h.ps[0] = 0.25f;
        h.ps[1] = 0.5f;
    }
    if (arch == CF_ARCH_FAST_CNN) h = cf_fast_cnn_head(); /* a BatchNorm1d and a Linear */
    if (o->n_lin_ftrs > 0) {
        h.n_lin_ftrs = o->n_lin_ftrs;
        memcpy(h.lin_ftrs, o->lin_ftrs, sizeof h.lin_ftrs);
    }
    if (o->n_ps > 0) {
        h.n_ps = o->n_ps;
        memcpy(h.ps, o->ps, sizeof h.ps);
    }
    h.concat_pool = !o->no_concat_pool;
    h.first_bn = !o->no_first_bn;
    h.bn_final = o->bn_final;
    h.y_range = o->y_range;
    h.y_lo = o->y_lo;
    h.y_hi = o->y_hi;
    return h;
}

/* Copies the body ("0.*") of a saved model into this one, by name and shape. */
static cf_status load_body(cf_model *model, const char *path) {
    cf_st_file *file = NULL;
    cf_status st = cf_st_read(path, &file);
    if (st != CF_OK) return cf_fail_context(st, "pretrained model");
    int copied = 0;
    for (int i = 0; i < model->n_params && st == CF_OK; i++) {
        cf_param *p = model->params[i];
        if (strncmp(p->full_name, "0.", 2) != 0) continue;
        const cf_st_entry *e = cf_st_find(file, p->full_name);
        if (!e) {
            st = cf_fail(CF_ERR_FORMAT, "pretrained model %s has no %s", path, p->full_name);
        } else if (e->numel != p->numel) {
            st = cf_fail(CF_ERR_FORMAT, "pretrained model %s: %s has %zu values, expected %zu",
                         path, p->full_name, e->numel, p->numel);
        }
        /* refused on load, as eval and predict refuse it: a fit would fail at its first batch */
        for (size_t k = 0; st == CF_OK && k < e->numel; k++)
            if (!isfinite(e->data[k]))
                st = cf_fail(CF_ERR_NONFINITE,
                             "pretrained model %s: tensor '%s' holds %s at element %zu (a "
                             "diverged fit?)",
                             path, p->full_name, isnan(e->data[k]) ? "NaN" : "an infinity", k);
        copied++;
    }
    if (st == CF_OK && copied == 0)
        st = cf_fail(CF_ERR_FORMAT, "pretrained model %s: the model has no body parameters", path);
    /* validated: now copy */
    for (int i = 0; i < model->n_params && st == CF_OK; i++) {
        cf_param *p = model->params[i];
        if (strncmp(p->full_name, "0.", 2) != 0) continue;
        memcpy(p->data, cf_st_find(file, p->full_name)->data, p->numel * sizeof(float));
    }
    cf_st_free(file);
    return st;
}

/* A model file corefit wrote (fastai's names, "0.0.weight") rather than torchvision's. */
static bool is_corefit_file(const char *path) {
    cf_st_file *file = NULL;
    if (cf_st_read(path, &file) != CF_OK) return false; /* the loader reports the error */
    bool ours = cf_st_find(file, "0.0.weight") != NULL;
    cf_st_free(file);
    return ours;
}

/* fastai's vision_learner adds Normalize.from_stats(*imagenet_stats) when the loaders have no
 * Normalize and the model is pretrained. */
static cf_status imagenet_normalize(cf_dls *dls) {
    cf_dataloader *dl[2] = {dls->train, dls->valid};
    for (int i = 0; i < 2; i++) {
        const cf_dl_options *o = dl[i] ? cf_dataloader_options(dl[i]) : NULL;
        if (!o || o->n_norm > 0) continue;
        cf_status st = cf_dataloader_set_normalize(dl[i], 3, imagenet_mean, imagenet_std);
        if (st != CF_OK) return st;
    }
    return CF_OK;
}

cf_status cf_vision_learner_(cf_learner **out, cf_dls *dls, cf_arch arch, const cf_vision_opts *o) {
    *out = NULL;
    const cf_dataset *ds = dls ? dls->train_ds : NULL;
    cf_status st = CF_OK;
    if (!ds || ds->sample_shape.ndim != 3)
        st = cf_fail(CF_ERR_INVALID, "vision_learner needs image data (C, H, W)");
    int n_out = o->n_out > 0    ? o->n_out
                : !ds           ? 0
                : ds->n_classes ? ds->n_classes
                                : ds->target_dim; /* regression and points */
    if (st == CF_OK && n_out < 1)
        st = cf_fail(CF_ERR_INVALID, "vision_learner: the data set has no classes; set n_out");
    if (st == CF_OK && o->y_range && !(o->y_lo < o->y_hi))
        st = cf_fail(CF_ERR_INVALID, "vision_learner: y_range (%g, %g) is not low < high",
                     (double)o->y_lo, (double)o->y_hi);
    if (st != CF_OK) {
        drop_owned(o->metrics, o->n_metrics, o->cbs, o->n_cbs);
        return st;
    }
    int c_in = ds->sample_shape.dim[0], h = ds->sample_shape.dim[1];
    cf_head_opts head = head_options(arch, o);
    cf_module *root = NULL;
    switch (arch) {
    case CF_ARCH_MINI_RESNET:
        root = cf_mini_resnet_ex(c_in, n_out, &head);
        break;
    case CF_ARCH_FAST_CNN:
        root = cf_fast_cnn_ex(c_in, n_out, &head);
        break;
    case CF_ARCH_SIMPLE_CNN: {
        int filters[] = {c_in, 16, 32, 64};
        cf_module *body = cf_simple_cnn(4, filters, NULL, NULL, true);
        head.pool = false; /* simple_cnn ends pooled and flattened */
        head.concat_pool = false;
        cf_module *parts[] = {body, body ? cf_create_head(64, n_out, &head) : NULL};
        root = parts[1] ? cf_sequential(2, parts) : NULL;
        if (!parts[1]) cf_module_free(body);
        break;
    }
    case CF_ARCH_XRESNET18:
    case CF_ARCH_XRESNET34:
    case CF_ARCH_XRESNET50: {
        cf_xresnet_opts xo = cf_xresnet_defaults();
        xo.c_in = c_in;
        xo.small_images = h < 64;
        xo.head = head;
        int depth = arch == CF_ARCH_XRESNET18 ? 18 : arch == CF_ARCH_XRESNET34 ? 34 : 50;
        root = cf_xresnet(depth, n_out, &xo);
        break;
    }
    case CF_ARCH_RESNET18:
    case CF_ARCH_RESNET34:
    case CF_ARCH_RESNET50:
        root = cf_resnet_learner_model(resnet_depth(arch), c_in, n_out, &head);
        break;
    default:
        st = cf_fail(CF_ERR_INVALID, "unknown architecture %d", (int)arch);
    }
    cf_model *model = NULL;
    if (st == CF_OK && !root)
        st = cf_fail_context(CF_ERR_INVALID, "building %s", cf_arch_name(arch));
    if (st == CF_OK) st = cf_model_new(&model, root, o->seed);
    const bool resnet = resnet_depth(arch) > 0;
    if (st == CF_OK) st = resnet ? cf_split_resnet(model) : cf_split_default(model);
    if (st == CF_OK && o->pretrained)
        st = resnet && !is_corefit_file(o->pretrained)
                 ? cf_resnet_load_pretrained(model, o->pretrained)
                 : load_body(model, o->pretrained);
    if (st == CF_OK && o->pretrained && resnet && c_in == 3) st = imagenet_normalize(dls);
    if (st != CF_OK) {
        cf_model_free(model);
        drop_owned(o->metrics, o->n_metrics, o->cbs, o->n_cbs);
        return st;
    }
    cf_learner_opts lo = {0};
    COPY_LEARNER_FIELDS(lo, o);
    if ((st = cf_learner_new_(out, dls, model, &lo)) != CF_OK) return st;
    cf_learner_recipe *r = &(*out)->recipe;
    snprintf(r->arch, sizeof r->arch, "%s", cf_arch_name(arch));
    r->n_out = n_out;
    r->n_lin_ftrs = o->n_lin_ftrs;
    memcpy(r->lin_ftrs, o->lin_ftrs, sizeof r->lin_ftrs);
    r->n_ps = o->n_ps;
    memcpy(r->ps, o->ps, sizeof r->ps);
    r->no_concat_pool = o->no_concat_pool;
    r->no_first_bn = o->no_first_bn;
    r->bn_final = o->bn_final;
    r->y_range = o->y_range;
    r->y_lo = o->y_lo;
    r->y_hi = o->y_hi;
    r->multi_label = cf_dataset_is_multi_label(ds);
    r->n_points = ds->n_points;
    if (o->pretrained && (st = cf_learner_freeze(*out)) != CF_OK) {
        cf_learner_free(*out);
        *out = NULL;
    }
    return st;
}

cf_status cf_tabular_learner_(cf_learner **out, cf_dls *dls, const cf_tabular_learner_opts *o) {
    *out = NULL;
    const cf_dataset *ds = dls ? dls->train_ds : NULL;
    cf_status st = CF_OK;
    if (!ds || ds->sample_shape.ndim != 1 || ds->n_cat + ds->n_cont != ds->sample_shape.dim[0])
        st = cf_fail(CF_ERR_INVALID, "tabular_learner needs a tabular data set (categorical "
                                     "codes then continuous values)");
    int n_out = o->n_out > 0 ? o->n_out
                : ds         ? (ds->n_classes > 0 ? ds->n_classes : ds->target_dim)
                             : 0;
    if (st != CF_OK) {
        drop_owned(o->metrics, o->n_metrics, o->cbs, o->n_cbs);
        return st;
    }
    cf_tabular_opts to = cf_tabular_defaults();
    if (o->n_layers > 0) {
        to.n_layers = o->n_layers;
        memcpy(to.layers, o->layers, sizeof to.layers);
    }
    if (o->ps > 0) {
        to.n_ps = 1;
        to.ps[0] = o->ps;
    }
    to.embed_p = o->embed_p;
    to.y_range = o->y_range;
    to.y_lo = o->y_lo;
    to.y_hi = o->y_hi;
    cf_module *root =
        cf_tabular_model(ds->n_cat, ds->cat_cardinality, NULL, ds->n_cont, n_out, &to);
    cf_model *model = NULL;
    st = root ? cf_model_new(&model, root, o->seed)
              : cf_fail_context(CF_ERR_INVALID, "tabular model");
    if (st != CF_OK) {
        drop_owned(o->metrics, o->n_metrics, o->cbs, o->n_cbs);
        return st;
    }
    cf_learner_opts lo = {0};
    COPY_LEARNER_FIELDS(lo, o);
    if ((st = cf_learner_new_(out, dls, model, &lo)) != CF_OK) return st;
    cf_learner_recipe *r = &(*out)->recipe;
    snprintf(r->arch, sizeof r->arch, "tabular");
    r->n_out = n_out;
    r->n_layers = o->n_layers;
    memcpy(r->layers, o->layers, sizeof r->layers);
    r->tab_ps = o->ps;
    r->embed_p = o->embed_p;
    r->y_range = o->y_range;
    r->y_lo = o->y_lo;
    r->y_hi = o->y_hi;
    return CF_OK;
}
