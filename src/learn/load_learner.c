/* fastai's load_learner and predict: a learner rebuilt from an exported model's metadata, and
 * the prediction of one image decoded and normalised as the training images were. */
#include "internal.h"

#include "corefit/io.h"

#include <string.h>

/* ---- load_learner -------------------------------------------------------------------------- */

cf_status cf_learner_from_info(const cf_model_info *m, cf_dls *dls, cf_metric **metrics,
                               int n_metrics, cf_learner **out) {
    *out = NULL;
    const cf_learner_recipe *r = &m->recipe;
    cf_status st;
    if (cf__is_text_arch(r->arch)) {
        st = cf__text_learner_from_info(m, dls, metrics, n_metrics, out);
    } else if (strcmp(r->arch, "tabular") == 0) {
        cf_tabular_learner_opts to = {.n_out = r->n_out,
                                      .n_layers = r->n_layers,
                                      .ps = r->tab_ps,
                                      .embed_p = r->embed_p,
                                      .y_range = r->y_range,
                                      .y_lo = r->y_lo,
                                      .y_hi = r->y_hi,
                                      .metrics = metrics,
                                      .n_metrics = n_metrics,
                                      .quiet = true};
        memcpy(to.layers, r->layers, sizeof to.layers);
        st = cf_tabular_learner_(out, dls, &to);
    } else if (strncmp(r->arch, "unet-", 5) == 0) { /* cf_unet_learner on the body after it */
        st = cf_unet_learner_(
            out, dls, r->arch + 5,
            &(cf_unet_learner_opts){
                .metrics = metrics, .n_metrics = n_metrics, .quiet = true, .unet = &r->unet});
    } else {
        int arch = cf_arch_from_name(r->arch);
        if (arch < 0) {
            for (int i = 0; i < n_metrics; i++) cf_metric_free(metrics[i]);
            return cf_fail(CF_ERR_FORMAT, "unknown architecture '%s'", r->arch);
        }
        cf_vision_opts vo = {.n_out = r->n_out,
                             .n_lin_ftrs = r->n_lin_ftrs,
                             .n_ps = r->n_ps,
                             .no_concat_pool = r->no_concat_pool,
                             .no_first_bn = r->no_first_bn,
                             .bn_final = r->bn_final,
                             .y_range = r->y_range,
                             .y_lo = r->y_lo,
                             .y_hi = r->y_hi,
                             .metrics = metrics,
                             .n_metrics = n_metrics,
                             .quiet = true};
        memcpy(vo.lin_ftrs, r->lin_ftrs, sizeof vo.lin_ftrs);
        memcpy(vo.ps, r->ps, sizeof vo.ps);
        st = cf_vision_learner_(out, dls, (cf_arch)arch, &vo);
    }
    return st;
}

/* One zero sample shaped and labelled as the model's training data, carrying its vocabularies
 * and statistics (so that a loaded learner exports the same metadata again). */
static cf_status placeholder(const cf_model_info *m, cf_dataset **out) {
    bool tabular = strcmp(m->recipe.arch, "tabular") == 0;
    cf_shape shape =
        tabular ? cf_shape1(m->n_in) : cf_shape_make(3, (int[]){m->n_in, m->height, m->width});
    size_t per = cf_shape_numel(&shape);
    /* targets shaped as training's: a class code, a multi-hot row or the points */
    const bool unet = strncmp(m->recipe.arch, "unet-", 5) == 0; /* masks of the image's size */
    const int target_dim = unet ? m->height * m->width
                           : m->recipe.multi_label || m->recipe.n_points > 0
                               ? (m->recipe.n_out > 0 ? m->recipe.n_out : 1)
                               : 1;
    float *x = cf_calloc(per, sizeof(float)), *y = cf_calloc((size_t)target_dim, sizeof(float));
    if (!x || !y) {
        cf_free(x);
        cf_free(y);
        return CF_ERR_NOMEM;
    }
    /* a tabular set takes its classes with the rest of its state */
    int n_classes = tabular || m->regression || m->n_vocab == 0 ? 0 : m->recipe.n_out;
    cf_status st = cf_dataset_from_arrays(x, y, 1, shape, target_dim, n_classes, out);
    cf_free(x);
    cf_free(y);
    if (st) return st;
    cf_dataset *ds = *out;
    ds->n_points = m->recipe.n_points;
    ds->masks = unet;
    if (n_classes && n_classes == m->n_vocab)
        st = cf_dataset_set_vocab(ds, (const char *const *)m->vocab, m->n_vocab);
    if (st == CF_OK && m->item_tfm.kind != CF_ITEM_TFM_NONE) { /* predict resizes as training */
        if ((ds->item_tfm = cf_malloc(sizeof *ds->item_tfm)))
            *ds->item_tfm = m->item_tfm;
        else
            st = CF_ERR_NOMEM;
    }
    if (st == CF_OK && tabular) {
        cf_tabular_state s;
        if ((st = cf__tabular_state_of_info(m, &s)) == CF_OK) {
            st = cf_tabular_state_save(&s, ds);
            cf_tabular_state_free(&s);
        }
    }
    if (st) {
        cf_dataset_free(*out);
        *out = NULL;
    }
    return st;
}

cf_status cf_load_learner(const char *path, cf_learner **out) {
    if (!out || !path) return cf_fail(CF_ERR_INVALID, "load_learner: NULL path or out");
    *out = NULL;
    cf_model_info m;
    cf_status st = cf_model_info_read(path, &m);
    if (st) return st;
    cf_dataset *a = NULL, *b = NULL;
    cf_dls *dls = NULL;
    cf_learner *learn = NULL;
    if (cf__is_text_arch(m.recipe.arch)) {
        if ((st = cf__text_placeholder_dls(&m, &dls))) goto done;
        goto have_dls;
    }
    cf_dls_options o = {.bs = 1, .prefetch = -1, .n_norm = m.n_norm};
    memcpy(o.mean, m.mean, sizeof o.mean);
    memcpy(o.std, m.std, sizeof o.std);
    if ((st = placeholder(&m, &a)) || (st = placeholder(&m, &b))) {
        cf_dataset_free(a);
        goto done;
    }
    if ((st = cf_dls_new(a, b, &o, &dls))) goto done;
have_dls:
    if ((st = cf_learner_from_info(&m, dls, NULL, 0, &learn))) goto done;
    learn->owned_dls = dls;
    dls = NULL;
    if ((st = cf_model_load(learn->model, NULL, path))) goto done;
    *out = learn;
    learn = NULL;
done:
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_model_info_free(&m);
    if (st) cf_fail_context(st, "load_learner %s", path);
    return st;
}

cf_status cf_predict_image(cf_learner *learn, const void *bytes, size_t size, const char *name,
                           float *probs, int *decoded) {
    const cf_dataset *ds = learn && learn->dls ? learn->dls->train_ds : NULL;
    if (!ds || ds->sample_shape.ndim != 3)
        return cf_fail(CF_ERR_STATE, "predict %s: the learner is not an image model", name);
    int c = ds->sample_shape.dim[0], h = ds->sample_shape.dim[1], w = ds->sample_shape.dim[2];
    float *x = cf_malloc((size_t)c * h * w * sizeof(float));
    if (!x) return CF_ERR_NOMEM;
    int iw = w, ih = h;
    /* decoded and resized as the training images were (their item transform's validation
     * choice, or squished to the size), then normalised as the training loader did */
    const cf_item_tfm *t = ds->item_tfm;
    cf_status st = t && t->width == w && t->height == h
                       ? cf_image_decode_tfm(bytes, size, name, c, t, false, 0, 0, 0, x)
                       : cf_image_decode(bytes, size, name, c, h == w ? h : 0, x, &iw, &ih);
    const cf_dl_options *lo = cf_dataloader_options(learn->dls->train);
    for (int ch = 0; st == CF_OK && lo && lo->n_norm > 0 && ch < c; ch++) {
        int k = lo->n_norm == 1 ? 0 : ch;
        const float a = 1.0f / lo->std[k], b = -lo->mean[k] / lo->std[k]; /* as the loader */
        for (size_t i = 0; i < (size_t)h * w; i++)
            x[(size_t)ch * h * w + i] = x[(size_t)ch * h * w + i] * a + b;
    }
    if (st == CF_OK) st = cf_predict(learn, x, probs, decoded);
    cf_free(x);
    return st;
}

cf_status cf_predict_image_file(cf_learner *learn, const char *path, float *probs, int *decoded) {
    /* Bounded as the image folders' reader: a device or a FIFO is an error, not a runaway. */
    void *buf;
    size_t len;
    cf_status st = cf_read_file(path, (size_t)1 << 28, &buf, &len);
    if (st != CF_OK) return st;
    st = cf_predict_image(learn, buf, len, path, probs, decoded);
    cf_free(buf);
    return st;
}
