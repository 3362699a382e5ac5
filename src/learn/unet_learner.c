/* fastai's unet_learner: a DynamicUnet on a ResNet body, CrossEntropyLossFlat over pixels and
 * the unet splitter's three parameter groups. */
#include "corefit/learn.h"

#include "corefit/io.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "learn/internal.h"

/* Copies the encoder ("layers.0.*") of a saved U-Net into this one, by name and shape; checks
 * everything before copying anything. */
static cf_status load_encoder(cf_model *model, const char *path) {
    cf_st_file *file = NULL;
    cf_status st = cf_st_read(path, &file);
    if (st != CF_OK) return cf_fail_context(st, "pretrained model");
    int found = 0;
    for (int i = 0; i < model->n_params && st == CF_OK; i++) {
        const cf_param *p = model->params[i];
        if (strncmp(p->full_name, "layers.0.", 9) != 0) continue;
        const cf_st_entry *e = cf_st_find(file, p->full_name);
        if (!e)
            st = cf_fail(CF_ERR_FORMAT, "pretrained model %s has no %s", path, p->full_name);
        else if (e->numel != p->numel)
            st = cf_fail(CF_ERR_FORMAT, "pretrained model %s: %s has %zu values, expected %zu",
                         path, p->full_name, e->numel, p->numel);
        for (size_t k = 0; st == CF_OK && k < e->numel; k++)
            if (!isfinite(e->data[k]))
                st = cf_fail(CF_ERR_NONFINITE, "pretrained model %s: %s holds %s at element %zu",
                             path, p->full_name, isnan(e->data[k]) ? "NaN" : "an infinity", k);
        found++;
    }
    if (st == CF_OK && found == 0)
        st = cf_fail(CF_ERR_FORMAT, "pretrained model %s: the U-Net has no encoder parameters",
                     path);
    for (int i = 0; i < model->n_params && st == CF_OK; i++) {
        cf_param *p = model->params[i];
        if (strncmp(p->full_name, "layers.0.", 9) != 0) continue;
        memcpy(p->data, cf_st_find(file, p->full_name)->data, p->numel * sizeof(float));
    }
    cf_st_free(file);
    return st;
}

static void drop_owned(const cf_unet_learner_opts *o) {
    for (int i = 0; i < o->n_metrics; i++) cf_metric_free(o->metrics[i]);
    for (int i = 0; i < o->n_cbs; i++) cf_callback_free(o->cbs[i]);
}

cf_status cf_unet_learner_(cf_learner **out, cf_dls *dls, const char *arch,
                           const cf_unet_learner_opts *o) {
    if (!out) return cf_fail(CF_ERR_INVALID, "unet_learner: out is NULL");
    *out = NULL;
    const cf_dataset *ds = dls ? dls->train_ds : NULL;
    cf_status st = CF_OK;
    if (!ds || ds->sample_shape.ndim != 3 || !ds->masks)
        st = cf_fail(CF_ERR_INVALID,
                     "unet_learner needs images with masks (cf_datasets_from_masks)");
    else if (!arch)
        st = cf_fail(CF_ERR_INVALID, "unet_learner: no architecture");
    const bool xresnet = arch && strncmp(arch, "xresnet", 7) == 0;
    cf_module *root = NULL;
    const cf_unet_opts uo = o->unet ? *o->unet : cf_unet_defaults();
    if (st == CF_OK) {
        root = cf_unet_model(arch, ds->sample_shape.dim[0], ds->n_classes, ds->sample_shape.dim[1],
                             ds->sample_shape.dim[2], &uo);
        if (!root) st = cf_fail_context(CF_ERR_INVALID, "unet_learner on %s", arch);
    }
    cf_model *model = NULL;
    if (st == CF_OK) st = cf_model_new(&model, root, o->seed);
    /* fastai's body cut: a torchvision resnet's stem is its first 6 children, an xresnet's 3 */
    if (st == CF_OK) st = cf_split_unet(model, xresnet ? 3 : 6);
    /* torchvision's or timm's ResNet weights (no U-Net in the file), else a corefit U-Net */
    int depth = 0;
    if (st == CF_OK && o->pretrained)
        st = !xresnet && cf_resnet_weights_depth(o->pretrained, &depth) == CF_OK
                 ? cf_resnet_load_pretrained(model, o->pretrained)
                 : (cf_clear_error(), load_encoder(model, o->pretrained));
    if (st != CF_OK) {
        cf_model_free(model);
        drop_owned(o);
        return st;
    }
    cf_learner_opts lo = {0};
    COPY_LEARNER_FIELDS(lo, o);
    if (!o->loss_set) {
        lo.loss = cf_cross_entropy_loss_flat(1);
        lo.loss_set = true;
    }
    if ((st = cf_learner_new_(out, dls, model, &lo)) != CF_OK) return st;
    snprintf((*out)->recipe.arch, sizeof(*out)->recipe.arch, "unet-%s", arch);
    (*out)->recipe.n_out = ds->n_classes;
    (*out)->recipe.unet = uo; /* what export records and load_learner builds again */
    if (o->pretrained && (st = cf_learner_freeze(*out)) != CF_OK) {
        cf_learner_free(*out);
        *out = NULL;
    }
    return st;
}
