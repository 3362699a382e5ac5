/* The Learner: creation, callbacks, optimizer, freezing, saving. */
#include "corefit/learn.h"

#include "corefit/io.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "learn/internal.h"

static cf_status push_cb(cf_callback ***list, int *n, cf_callback *cb) {
    cf_callback **grown = cf_calloc((size_t)*n + 1, sizeof *grown);
    if (!grown) {
        cf_callback_free(cb);
        return CF_ERR_NOMEM;
    }
    if (*n) memcpy(grown, *list, (size_t)*n * sizeof *grown);
    grown[*n] = cb;
    cf_free(*list);
    *list = grown;
    (*n)++;
    return CF_OK;
}

static int remove_cbs(cf_callback **list, int *n, const char *name) {
    int kept = 0, removed = 0;
    for (int i = 0; i < *n; i++) {
        if (list[i] && list[i]->name && strcmp(list[i]->name, name) == 0) {
            cf_callback_free(list[i]);
            removed++;
        } else {
            list[kept++] = list[i];
        }
    }
    *n = kept;
    return removed;
}

cf_status cf_learner_new_(cf_learner **out, cf_dls *dls, cf_model *model,
                          const cf_learner_opts *o) {
    *out = NULL;
    cf_status st = CF_OK;
    cf_learner *learn = cf_calloc(1, sizeof *learn);
    if (!learn || !dls || !model) {
        if (learn && !dls)
            st = cf_fail(CF_ERR_INVALID, "cf_learner_new: no DataLoaders");
        else if (learn)
            st = cf_fail(CF_ERR_INVALID, "cf_learner_new: no model");
        else
            st = CF_ERR_NOMEM;
        cf_model_free(model);
        for (int i = 0; i < o->n_metrics; i++) cf_metric_free(o->metrics[i]);
        for (int i = 0; i < o->n_cbs; i++) cf_callback_free(o->cbs[i]);
        cf_free(learn);
        return st;
    }
    learn->dls = dls;
    learn->model = model;
    if (o->loss_set) {
        learn->loss = o->loss;
    } else {
        /* fastai's default loss follows the targets: cross-entropy for classes,
         * BCEWithLogitsLossFlat for multi-hot label sets, else MSE. */
        learn->loss =
            (cf_loss){.kind = dls->train_ds && dls->train_ds->n_classes > 0 ? CF_LOSS_CROSS_ENTROPY
                                                                            : CF_LOSS_MSE};
        if (cf_dataset_is_multi_label(dls->train_ds)) learn->loss = cf_bce_with_logits_loss_flat(0);
        learn->loss.label_smoothing = o->loss.label_smoothing;
    }
    learn->opt_config = o->opt_set ? o->opt : cf_opt_adam_defaults();
    learn->lr = o->lr > 0 ? o->lr : 1e-3;
    learn->wd = o->wd;
    learn->wd_bn_bias = o->wd_bn_bias;
    learn->train_bn = !o->no_train_bn;
    learn->opt_config.wd_bn_bias = learn->wd_bn_bias;
    if (o->moms[0] > 0)
        memcpy(learn->moms, o->moms, sizeof learn->moms);
    else {
        learn->moms[0] = 0.95;
        learn->moms[1] = 0.85;
        learn->moms[2] = 0.95;
    }
    learn->path = cf_strdup(o->path ? o->path : ".");
    learn->model_dir = cf_strdup(o->model_dir ? o->model_dir : "models");
    learn->quiet = o->quiet;
    learn->seed = o->seed;
    learn->replica = (cf_replica){.is_master = true, .world = 1};
    learn->logging = true;
    learn->metrics = cf_calloc((size_t)o->n_metrics + 1, sizeof *learn->metrics);
    if (!learn->path || !learn->model_dir || !learn->metrics) st = CF_ERR_NOMEM;
    for (int i = 0; i < o->n_metrics; i++) {
        if (st == CF_OK && !o->metrics[i])
            st = cf_fail(CF_ERR_INVALID, "cf_learner_new: metric %d is NULL", i);
        if (st == CF_OK)
            learn->metrics[learn->n_metrics++] = o->metrics[i];
        else
            cf_metric_free(o->metrics[i]);
    }
    for (int i = 0; i < o->n_cbs; i++) {
        if (st == CF_OK && o->cbs[i])
            st = push_cb(&learn->cbs, &learn->n_cbs, o->cbs[i]);
        else
            cf_callback_free(o->cbs[i]);
    }
    if (st != CF_OK) {
        cf_learner_free(learn);
        return st;
    }
    learn->cancel = CF_CANCEL_NONE;
    *out = learn;
    return CF_OK;
}

void cf_learner_free(cf_learner *learn) {
    if (!learn) return;
    for (int i = 0; i < learn->n_cbs; i++) cf_callback_free(learn->cbs[i]);
    for (int i = 0; i < learn->n_master_cbs; i++) cf_callback_free(learn->master_cbs[i]);
    for (int i = 0; i < learn->n_metrics; i++) cf_metric_free(learn->metrics[i]);
    for (int i = 0; i < learn->n_figures; i++) cf_free(learn->figures[i]);
    cf_free(learn->figures);
    cf_free(learn->cbs);
    cf_free(learn->master_cbs);
    cf_free(learn->metrics);
    cf_free(learn->active);
    cf_free(learn->final_record);
    cf_free(learn->dpred.data);
    cf_free(learn->per_item_loss);
    cf_free(learn->path);
    cf_free(learn->model_dir);
    cf_recorder_clear(&learn->recorder);
    cf_optimizer_free(learn->opt);
    cf_model_free(learn->model);
    cf_dls_free(learn->owned_dls);
    cf_free(learn);
}

cf_status cf_learner_add_cb(cf_learner *learn, cf_callback *cb) {
    if (!cb) return cf_fail(CF_ERR_INVALID, "cf_learner_add_cb: NULL callback");
    return push_cb(&learn->cbs, &learn->n_cbs, cb);
}

int cf_learner_remove_cb(cf_learner *learn, const char *name) {
    return remove_cbs(learn->cbs, &learn->n_cbs, name);
}

cf_status cf_learner_add_master_cbs(cf_learner *learn, cf_callback **cbs, int n) {
    cf_status st = CF_OK;
    for (int i = 0; i < n; i++) {
        if (st == CF_OK && cbs[i])
            st = push_cb(&learn->master_cbs, &learn->n_master_cbs, cbs[i]);
        else
            cf_callback_free(cbs[i]);
    }
    return st;
}

int cf_learner_remove_master_cbs(cf_learner *learn, const char *name) {
    return remove_cbs(learn->master_cbs, &learn->n_master_cbs, name);
}

void cf_learner_cancel(cf_learner *learn, cf_cancel what) {
    if (learn->cancel == CF_CANCEL_NONE || what == CF_CANCEL_FIT) learn->cancel = what;
}

cf_status cf_learner_create_opt(cf_learner *learn) {
    cf_optimizer *opt = NULL;
    cf_opt_config config = learn->opt_config;
    config.wd_bn_bias = learn->wd_bn_bias;
    config.hypers.lr = learn->lr;
    cf_status st = cf_optimizer_new(&opt, learn->model, &config);
    if (st != CF_OK) return st;
    cf_optimizer_free(learn->opt);
    learn->opt = opt;
    return CF_OK;
}

cf_status cf_learner_freeze_to(cf_learner *learn, int n) {
    if (!learn->opt) {
        cf_status st = cf_learner_create_opt(learn);
        if (st != CF_OK) return st;
    }
    cf_model_freeze_to(learn->model, n, learn->train_bn);
    cf_optimizer_clear_state(learn->opt);
    return CF_OK;
}

cf_status cf_learner_freeze(cf_learner *learn) {
    return cf_learner_freeze_to(learn, -1);
}
cf_status cf_learner_unfreeze(cf_learner *learn) {
    return cf_learner_freeze_to(learn, 0);
}

/* name -> path/model_dir/name.safetensors unless name already looks like a path. */
cf_status cf__model_file(const cf_learner *learn, const char *name, bool make_dir, char *buf,
                         size_t size) {
    if (strchr(name, '/')) {
        snprintf(buf, size, "%s", name);
        return CF_OK;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", learn->path, learn->model_dir);
    if (make_dir) {
        mkdir(learn->path, 0755);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return cf_fail(CF_ERR_IO, "cannot create folder %s", dir);
    }
    const char *ext = strstr(name, ".safetensors") ? "" : ".safetensors";
    if ((size_t)snprintf(buf, size, "%s/%s%s", dir, name, ext) >= size)
        return cf_fail(CF_ERR_INVALID, "model path too long: %s/%s", dir, name);
    return CF_OK;
}

cf_status cf_learner_save(cf_learner *learn, const char *name, bool with_opt) {
    char path[4096];
    cf_status st = cf__model_file(learn, name, true, path, sizeof path);
    if (st != CF_OK) return st;
    return cf_model_save(learn->model, with_opt ? learn->opt : NULL, path);
}

cf_status cf_learner_load(cf_learner *learn, const char *name, bool with_opt) {
    char path[4096];
    cf_status st = cf__model_file(learn, name, false, path, sizeof path);
    if (st != CF_OK) return st;
    if (with_opt && !learn->opt && (st = cf_learner_create_opt(learn)) != CF_OK) return st;
    return cf_model_load(learn->model, with_opt ? learn->opt : NULL, path);
}

cf_status cf_learner_note_figure(cf_learner *learn, const char *path) {
    if (!learn || !path) return cf_fail(CF_ERR_INVALID, "cf_learner_note_figure: NULL argument");
    for (int i = 0; i < learn->n_figures; i++)
        if (strcmp(learn->figures[i], path) == 0) return CF_OK;
    char *copy = cf_strdup(path);
    char **grown = cf_calloc((size_t)learn->n_figures + 1, sizeof *grown);
    if (!copy || !grown) {
        cf_free(copy);
        cf_free(grown);
        return CF_ERR_NOMEM;
    }
    if (learn->n_figures) memcpy(grown, learn->figures, (size_t)learn->n_figures * sizeof *grown);
    grown[learn->n_figures++] = copy;
    cf_free(learn->figures);
    learn->figures = grown;
    return CF_OK;
}

void cf_lr_expand(cf_lr lr, int n, double *out) {
    if (n < 1) return;
    if (lr.kind == CF_LR_SLICE) {
        cf_hyper_slice(lr.start, lr.stop, n, out);
        return;
    }
    for (int i = 0; i < n; i++) out[i] = lr.stop;
}
