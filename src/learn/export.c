/* fastai's export in one format: the model's tensors plus the metadata that rebuilds the model
 * and prepares its input (cf_model_info, documented in corefit/learn.h; model_info.c reads it
 * back). */
#include "internal.h"

#include "corefit/io.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>

static cJSON *str_array(char *const *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
    return a;
}

static char *print_json(cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    char *out = s ? cf_strdup(s) : NULL;
    if (s) cJSON_free(s);
    cJSON_Delete(j);
    return out;
}

static const char *const resize_names[] = {
    [CF_RESIZE_CROP] = "crop", [CF_RESIZE_PAD] = "pad", [CF_RESIZE_SQUISH] = "squish"};
static const char *const pad_names[] = {
    [CF_PAD_REFLECTION] = "reflection", [CF_PAD_ZEROS] = "zeros", [CF_PAD_BORDER] = "border"};

static void add_pair(cJSON *j, const char *name, double a, double b) {
    cJSON *v = cJSON_AddArrayToObject(j, name);
    cJSON_AddItemToArray(v, cJSON_CreateNumber(a));
    cJSON_AddItemToArray(v, cJSON_CreateNumber(b));
}

/* corefit.item_tfm (documented in corefit/learn.h) */
static char *item_tfm_json(const cf_item_tfm *t) {
    cJSON *j = cJSON_CreateObject();
    bool rrc = t->kind == CF_ITEM_TFM_RANDOM_RESIZED_CROP;
    cJSON_AddStringToObject(j, "kind", rrc ? "random_resized_crop" : "resize");
    add_pair(j, "size", t->height, t->width);
    if (rrc) {
        cJSON_AddNumberToObject(j, "min_scale", t->min_scale);
        cJSON_AddNumberToObject(j, "max_scale", t->max_scale);
        add_pair(j, "ratio", t->ratio_lo, t->ratio_hi);
        cJSON_AddNumberToObject(j, "val_xtra", t->val_xtra);
    } else {
        cJSON_AddStringToObject(j, "method", resize_names[t->method]);
        cJSON_AddStringToObject(j, "pad_mode", pad_names[t->pad_mode]);
    }
    return print_json(j);
}

/* corefit.batch_tfms */
static char *batch_tfms_json(bool has_aug, const cf_aug_opts *a) {
    cJSON *j = cJSON_CreateObject();
    if (!has_aug) {
        cJSON_AddBoolToObject(j, "aug_transforms", false);
        return print_json(j);
    }
    cJSON *o = cJSON_AddObjectToObject(j, "aug_transforms");
    cJSON_AddBoolToObject(o, "do_flip", a->do_flip);
    cJSON_AddBoolToObject(o, "flip_vert", a->flip_vert);
    cJSON_AddNumberToObject(o, "max_rotate", a->max_rotate);
    cJSON_AddNumberToObject(o, "min_zoom", a->min_zoom);
    cJSON_AddNumberToObject(o, "max_zoom", a->max_zoom);
    cJSON_AddNumberToObject(o, "max_lighting", a->max_lighting);
    cJSON_AddNumberToObject(o, "max_warp", a->max_warp);
    cJSON_AddNumberToObject(o, "p_affine", a->p_affine);
    cJSON_AddNumberToObject(o, "p_lighting", a->p_lighting);
    cJSON_AddStringToObject(o, "pad_mode", pad_names[a->pad_mode]);
    return print_json(j);
}

cf_status cf_model_export(const cf_model *model, const cf_model_info *m, const char *path) {
    cf_st_entry *entries = cf_calloc((size_t)model->n_params + 1, sizeof *entries);
    if (!entries) return cf_fail_context(CF_ERR_NOMEM, "saving %s", path);
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        bool counter = p->kind == CF_PARAM_COUNTER;
        entries[i] = (cf_st_entry){
            .name = p->full_name,
            .dtype = counter ? CF_DTYPE_I64 : CF_DTYPE_F32,
            .shape = counter && p->numel == 1 ? (cf_shape){.ndim = 0} : p->shape,
            .numel = p->numel,
            .data = p->data,
        };
    }
    char n_in[32], size[64], n_out[32];
    snprintf(n_in, sizeof n_in, "%d", m->n_in);
    snprintf(size, sizeof size, "%dx%d", m->height, m->width);
    snprintf(n_out, sizeof n_out, "%d", m->recipe.n_out);
    char *vocab = m->n_vocab ? print_json(str_array(m->vocab, m->n_vocab)) : NULL;
    char *norm = NULL, *tab = NULL, *head = NULL, *tvocab = NULL, *tok = NULL, *text = NULL;
    const cf_learner_recipe *r = &m->recipe;
    const bool unet = strncmp(r->arch, "unet-", 5) == 0; /* DynamicUnet's options too */
    char *unet_json = unet ? cf__unet_opts_json(&r->unet) : NULL;
    bool tabular = strcmp(r->arch, "tabular") == 0;
    const bool is_text = m->text_vocab != NULL;
    cf_status st = CF_OK;
    if (is_text) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "emb_sz", m->emb_sz);
        cJSON_AddNumberToObject(j, "n_hid", m->n_hid);
        cJSON_AddNumberToObject(j, "n_layers", m->n_layers);
        if (strcmp(r->arch, "awd_lstm_clas") == 0) {
            cJSON_AddNumberToObject(j, "seq_len", r->text_seq_len);
            cJSON_AddNumberToObject(j, "max_len", r->text_max_len);
            cJSON *lin = cJSON_AddArrayToObject(j, "lin_ftrs");
            for (int i = 0; i < r->n_lin_ftrs; i++)
                cJSON_AddItemToArray(lin, cJSON_CreateNumber(r->lin_ftrs[i]));
        }
        text = print_json(j);
        tvocab = print_json(str_array(m->text_vocab, m->n_text_vocab));
        st = cf_text_tok_options_to_json(&m->tok, &tok);
    }
    if (r->arch[0] && !tabular && !is_text) {
        cJSON *j = cJSON_CreateObject();
        cJSON *lin = cJSON_AddArrayToObject(j, "lin_ftrs"), *ps = cJSON_AddArrayToObject(j, "ps");
        for (int i = 0; i < r->n_lin_ftrs; i++)
            cJSON_AddItemToArray(lin, cJSON_CreateNumber(r->lin_ftrs[i]));
        for (int i = 0; i < r->n_ps; i++) cJSON_AddItemToArray(ps, cJSON_CreateNumber(r->ps[i]));
        cJSON_AddBoolToObject(j, "concat_pool", !r->no_concat_pool);
        cJSON_AddBoolToObject(j, "first_bn", !r->no_first_bn);
        cJSON_AddBoolToObject(j, "bn_final", r->bn_final);
        if (r->y_range) {
            cJSON *yr = cJSON_AddArrayToObject(j, "y_range");
            cJSON_AddItemToArray(yr, cJSON_CreateNumber(r->y_lo));
            cJSON_AddItemToArray(yr, cJSON_CreateNumber(r->y_hi));
        }
        /* what the targets are, so that load_learner rebuilds the loss and decoding */
        if (r->multi_label) cJSON_AddStringToObject(j, "targets", "multi_label");
        if (r->n_points > 0) cJSON_AddNumberToObject(j, "points", r->n_points);
        head = print_json(j);
    }
    if (m->n_norm > 0) {
        cJSON *j = cJSON_CreateObject();
        cJSON *mean = cJSON_AddArrayToObject(j, "mean"), *std = cJSON_AddArrayToObject(j, "std");
        for (int i = 0; i < m->n_norm; i++) {
            cJSON_AddItemToArray(mean, cJSON_CreateNumber(m->mean[i]));
            cJSON_AddItemToArray(std, cJSON_CreateNumber(m->std[i]));
        }
        norm = print_json(j);
    }
    char *item = NULL, *batch = NULL;
    if (m->item_tfm.kind != CF_ITEM_TFM_NONE) item = item_tfm_json(&m->item_tfm);
    if (m->has_batch_tfms) batch = batch_tfms_json(m->has_aug, &m->aug);
    if (m->feature_names) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "target", m->target ? m->target : "");
        cJSON_AddBoolToObject(j, "regression", m->regression);
        cJSON *layers = cJSON_AddArrayToObject(j, "layers");
        for (int i = 0; i < m->recipe.n_layers; i++)
            cJSON_AddItemToArray(layers, cJSON_CreateNumber(m->recipe.layers[i]));
        if (r->y_range) {
            cJSON *yr = cJSON_AddArrayToObject(j, "y_range");
            cJSON_AddItemToArray(yr, cJSON_CreateNumber(r->y_lo));
            cJSON_AddItemToArray(yr, cJSON_CreateNumber(r->y_hi));
        }
        if (r->tab_ps > 0) cJSON_AddNumberToObject(j, "ps", r->tab_ps);
        if (r->embed_p > 0) cJSON_AddNumberToObject(j, "embed_p", r->embed_p);
        cJSON *cat = cJSON_AddArrayToObject(j, "cat"), *cont = cJSON_AddArrayToObject(j, "cont");
        for (int i = 0; i < m->n_cat; i++) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "name", m->feature_names[i]);
            cJSON_AddItemToObject(c, "vocab", str_array(m->cat_vocab[i], m->cat_cardinality[i]));
            if (m->flag_of[i]) cJSON_AddStringToObject(c, "flag_of", m->flag_of[i]);
            cJSON_AddItemToArray(cat, c);
        }
        for (int i = 0; i < m->n_cont; i++) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "name", m->feature_names[m->n_cat + i]);
            cJSON_AddNumberToObject(c, "mean", m->cont_mean[i]);
            cJSON_AddNumberToObject(c, "std", m->cont_std[i]);
            cJSON_AddNumberToObject(c, "fill", m->cont_fill[i]);
            cJSON_AddItemToArray(cont, c);
        }
        tab = print_json(j);
    }
    const char *keys[20], *values[20];
    int n = 0;
#define META(k, v)                                                                                 \
    do {                                                                                           \
        keys[n] = (k);                                                                             \
        values[n++] = (v);                                                                         \
    } while (0)
    META("format", "pt");
    META("corefit.version", "1");
    if (r->arch[0]) META("corefit.arch", r->arch); /* not for a hand-made model */
    META("corefit.input", m->input);
    META("corefit.n_in", n_in);
    if (m->height > 0) META("corefit.image_size", size);
    META("corefit.n_out", n_out);
    if (vocab) META("corefit.vocab", vocab);
    if (norm) META("corefit.normalize", norm);
    if (item) META("corefit.item_tfm", item);
    if (batch) META("corefit.batch_tfms", batch);
    if (tab) META("corefit.tabular", tab);
    if (head) META("corefit.head", head);
    if (text) META("corefit.text", text);
    if (tvocab) META("corefit.text_vocab", tvocab);
    if (tok) META("corefit.tokenizer", tok);
    if (unet_json) META("corefit.unet", unet_json);
#undef META
    if (st != CF_OK)
        ;
    else if ((m->n_vocab && !vocab) || (m->n_norm && !norm) || (m->feature_names && !tab) ||
             (r->arch[0] && !tabular && !is_text && !head) ||
             (is_text && (!text || !tvocab || !tok)) ||
             (m->item_tfm.kind != CF_ITEM_TFM_NONE && !item) || (m->has_batch_tfms && !batch) ||
             (unet && !unet_json))
        st = cf_fail_context(CF_ERR_NOMEM, "saving %s", path);
    else
        st = cf_st_write(path, entries, model->n_params, keys, values, n);
    cf_free(text);
    cf_free(tvocab);
    cf_free(tok);
    cf_free(vocab);
    cf_free(norm);
    cf_free(item);
    cf_free(batch);
    cf_free(tab);
    cf_free(head);
    cf_free(unet_json);
    cf_free(entries);
    return st;
}

cf_status cf_learner_export(cf_learner *learn, const char *path) {
    if (!learn || !path) return cf_fail(CF_ERR_INVALID, "export: NULL learner or path");
    cf_model_info info;
    cf_status st = cf_learner_info(learn, &info);
    if (st) return cf_fail_context(st, "exporting %s", path);
    st = cf_model_export(learn->model, &info, path);
    cf_model_info_free(&info);
    return st;
}
