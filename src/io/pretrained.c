/* Pretrained ResNet weights from torchvision's and timm's safetensors files. */
#include "corefit/io.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- torchvision's names in a corefit model ---- */

static const char *drop_wrapper_prefix(const char *name) {
    for (;;) {
        if (strncmp(name, "module.", 7) == 0)
            name += 7;
        else if (strncmp(name, "model.", 6) == 0)
            name += 6;
        else
            return name;
    }
}

/* The remainder after "<word>." when name starts with it, else NULL. */
static const char *after(const char *name, const char *word) {
    size_t n = strlen(word);
    return strncmp(name, word, n) == 0 && name[n] == '.' ? name + n + 1 : NULL;
}

int cf_resnet_param_name(const char *name, const char *body_prefix, char *out, size_t size) {
    name = drop_wrapper_prefix(name);
    const char *rest;
    if (after(name, "fc")) return 0;
    int index = -1;
    if ((rest = after(name, "conv1")))
        index = 0;
    else if ((rest = after(name, "bn1")))
        index = 1;
    else
        for (int k = 1; k <= 4 && index < 0; k++) {
            char layer[8];
            snprintf(layer, sizeof layer, "layer%d", k);
            if ((rest = after(name, layer))) index = 3 + k;
        }
    /* the stem's parameters are single tensors: "conv1.weight", "bn1.running_var", ... */
    if (index < 0 || (index < 2 && strchr(rest, '.'))) return -1;
    int n = body_prefix ? snprintf(out, size, "%s%d.%s", body_prefix, index, rest)
                        : snprintf(out, size, "%s", name);
    return n > 0 && (size_t)n < size ? 1 : -1;
}

bool cf_resnet_torchvision_name(const char *name, const char *body_prefix, char *out, size_t size) {
    size_t np = strlen(body_prefix);
    if (strncmp(name, body_prefix, np) != 0) return false;
    char *end;
    long index = strtol(name + np, &end, 10);
    if (end == name + np || *end != '.' || index < 0 || index > 7 || index == 2 || index == 3)
        return false;
    static const char *const stem[2] = {"conv1", "bn1"};
    int n = index < 2 ? snprintf(out, size, "%s.%s", stem[index], end + 1)
                      : snprintf(out, size, "layer%ld.%s", index - 3, end + 1);
    return n > 0 && (size_t)n < size;
}

/* ---- loading ---- */

/* Where the model keeps its body: NULL for cf_resnet's torchvision layout, "0." for
 * cf_resnet_learner_model, "" for cf_resnet_body, "layers.0." for a U-Net's encoder; false when
 * it is none of them. */
static bool body_layout(const cf_model *model, const char **prefix) {
    if (cf_model_param(model, "conv1.weight") && cf_model_param(model, "layer1.0.conv1.weight")) {
        *prefix = NULL;
        return true;
    }
    if (cf_model_param(model, "0.0.weight") && cf_model_param(model, "0.4.0.conv1.weight")) {
        *prefix = "0.";
        return true;
    }
    if (cf_model_param(model, "0.weight") && cf_model_param(model, "4.0.conv1.weight")) {
        *prefix = "";
        return true;
    }
    /* a U-Net (cf_unet_model) on a torchvision ResNet body: its encoder is layers.0 */
    if (cf_model_param(model, "layers.0.0.weight") &&
        cf_model_param(model, "layers.0.4.0.conv1.weight")) {
        *prefix = "layers.0.";
        return true;
    }
    return false;
}

static int param_index(const cf_model *model, const char *name) {
    for (int i = 0; i < model->n_params; i++)
        if (strcmp(model->params[i]->full_name, name) == 0) return i;
    return -1;
}

static bool same_shape(const cf_st_entry *e, const cf_param *p) {
    if (p->kind == CF_PARAM_COUNTER) return e->numel == 1;
    return cf_shape_equal(&e->shape, &p->shape);
}

/* A body parameter: everything under the prefix (fastai layout), everything but fc. */
static bool in_body(const cf_param *p, const char *prefix) {
    if (!prefix) return strncmp(p->full_name, "fc.", 3) != 0;
    return strncmp(p->full_name, prefix, strlen(prefix)) == 0;
}

static cf_status check_and_copy(cf_model *model, const cf_st_file *file, const char *path,
                                const char *prefix) {
    const cf_st_entry **src = cf_calloc((size_t)model->n_params + 1, sizeof *src);
    if (!src) return CF_ERR_NOMEM;
    cf_status st = CF_OK;
    char name[512], a[64], b[64];
    for (int i = 0; i < file->n_entries && st == CF_OK; i++) {
        const cf_st_entry *e = &file->entries[i];
        int kind = cf_resnet_param_name(e->name, prefix, name, sizeof name);
        if (kind < 0) {
            st = cf_fail(CF_ERR_FORMAT,
                         "%s: tensor '%s' is not part of a torchvision/timm ResNet (a deep-stem "
                         "or other variant is not supported)",
                         path, e->name);
            break;
        }
        if (kind == 0) { /* the classifier: kept by cf_resnet's model when it fits */
            if (prefix) continue;
            int j = param_index(model, strstr(e->name, "fc.")); /* after module./model. */
            if (j >= 0 && same_shape(e, model->params[j])) src[j] = e;
            continue;
        }
        int j = param_index(model, name);
        if (j < 0) {
            st = cf_fail(CF_ERR_FORMAT,
                         "%s: tensor '%s' has no place in the model (no parameter %s): is the "
                         "file for another depth?",
                         path, e->name, name);
        } else if (!same_shape(e, model->params[j])) {
            st = cf_fail(CF_ERR_FORMAT, "%s: tensor '%s' has shape %s but the model's %s is %s",
                         path, e->name, cf_shape_str(&e->shape, a, sizeof a), name,
                         cf_shape_str(&model->params[j]->shape, b, sizeof b));
        } else {
            src[j] = e;
        }
        for (size_t k = 0; st == CF_OK && src[j] == e && k < e->numel; k++)
            if (!isfinite(e->data[k]))
                st = cf_fail(CF_ERR_NONFINITE, "%s: tensor '%s' holds %s at element %zu", path,
                             e->name, isnan(e->data[k]) ? "NaN" : "an infinity", k);
    }
    for (int j = 0; j < model->n_params && st == CF_OK; j++) {
        const cf_param *p = model->params[j];
        if (src[j] || !in_body(p, prefix) || p->kind == CF_PARAM_COUNTER) continue;
        const char *tv = p->full_name;
        if (prefix && cf_resnet_torchvision_name(p->full_name, prefix, name, sizeof name))
            tv = name;
        st = cf_fail(CF_ERR_FORMAT, "%s has no tensor '%s' (the model's %s, shape %s)", path, tv,
                     p->full_name, cf_shape_str(&p->shape, a, sizeof a));
    }
    if (st == CF_OK) /* validated: now copy */
        for (int j = 0; j < model->n_params; j++)
            if (src[j]) memcpy(model->params[j]->data, src[j]->data, src[j]->numel * sizeof(float));
    cf_free(src);
    return st;
}

cf_status cf_resnet_load_pretrained(cf_model *model, const char *path) {
    const char *prefix;
    if (!model || !path) return cf_fail(CF_ERR_INVALID, "cf_resnet_load_pretrained: NULL argument");
    if (!body_layout(model, &prefix))
        return cf_fail(CF_ERR_INVALID,
                       "%s: the model is not a torchvision ResNet "
                       "(cf_resnet, cf_resnet_body or cf_resnet_learner_model)",
                       path);
    cf_st_file *file = NULL;
    cf_status st = cf_st_read(path, &file);
    if (st != CF_OK) return cf_fail_context(st, "pretrained ResNet weights");
    st = check_and_copy(model, file, path, prefix);
    cf_st_free(file);
    return st;
}

/* ---- which ResNet a file holds ---- */

/* Whether the file has the tensor `name` under any wrapper prefix (module., model.). */
static bool has_tensor(const cf_st_file *file, const char *name) {
    for (int i = 0; i < file->n_entries; i++)
        if (strcmp(drop_wrapper_prefix(file->entries[i].name), name) == 0) return true;
    return false;
}

/* The blocks of layer<k>: one more than the highest block index found. */
static int count_blocks(const cf_st_file *file, int k) {
    char layer[16];
    int n = snprintf(layer, sizeof layer, "layer%d.", k), blocks = 0;
    for (int i = 0; i < file->n_entries; i++) {
        const char *name = drop_wrapper_prefix(file->entries[i].name);
        if (strncmp(name, layer, (size_t)n) != 0) continue;
        char *end;
        long b = strtol(name + n, &end, 10);
        if (end != name + n && *end == '.' && b >= 0 && b < 1000 && b + 1 > blocks)
            blocks = (int)b + 1;
    }
    return blocks;
}

cf_status cf_resnet_weights_depth(const char *path, int *depth) {
    if (!path || !depth) return cf_fail(CF_ERR_INVALID, "cf_resnet_weights_depth: NULL argument");
    *depth = 0;
    cf_st_file *file = NULL;
    cf_status st = cf_st_read(path, &file);
    if (st != CF_OK) return st;
    bool resnet = has_tensor(file, "conv1.weight") && has_tensor(file, "bn1.weight") &&
                  has_tensor(file, "layer1.0.conv1.weight") &&
                  has_tensor(file, "layer4.0.conv1.weight");
    bool bottleneck = has_tensor(file, "layer1.0.conv3.weight");
    /* torchvision's block counts per depth (layer1..layer4) */
    static const struct {
        int depth, blocks[4];
        bool bottleneck;
    } known[] = {{18, {2, 2, 2, 2}, false},
                 {34, {3, 4, 6, 3}, false},
                 {50, {3, 4, 6, 3}, true},
                 {101, {3, 4, 23, 3}, true},
                 {152, {3, 8, 36, 3}, true}};
    int blocks[4] = {0};
    for (int k = 0; k < 4; k++) blocks[k] = count_blocks(file, k + 1);
    for (size_t i = 0; resnet && i < sizeof known / sizeof *known && !*depth; i++)
        if (known[i].bottleneck == bottleneck &&
            memcmp(known[i].blocks, blocks, sizeof blocks) == 0)
            *depth = known[i].depth;
    cf_st_free(file);
    if (*depth == 0)
        return cf_fail(CF_ERR_FORMAT, "%s: not torchvision's or timm's ResNet weights (%s)", path,
                       resnet ? "blocks per stage unlike resnet18/34/50/101/152"
                              : "no conv1.weight, bn1.weight and layer1.0.conv1.weight tensors");
    return CF_OK;
}
