/* Models: the module tree's names and flat blocks of parameters, the arena, planning (fusion
 * first, fuse.c), forward and backward, parameter groups. */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct walk_state {
    cf_model *model;
    int count;
    size_t n_weights, n_buffers;
    cf_rng rng;
    int module_index;
    bool assign;
} walk_state;

static bool is_buffer(const cf_param *p) {
    return p->kind == CF_PARAM_BUFFER || p->kind == CF_PARAM_COUNTER;
}

/* Pre-order walk: a module's own parameters, then its children's (PyTorch's state_dict order). */
static cf_status walk(cf_module *m, const char *prefix, walk_state *ws) {
    for (int i = 0; i < m->n_params; i++) {
        cf_param *p = &m->params[i];
        size_t *counter = is_buffer(p) ? &ws->n_buffers : &ws->n_weights;
        if (ws->assign) {
            size_t len = strlen(prefix) + strlen(p->name) + 1;
            cf_free(p->full_name);
            p->full_name = cf_malloc(len);
            if (!p->full_name) return CF_ERR_NOMEM;
            snprintf(p->full_name, len, "%s%s", prefix, p->name);
            p->offset = *counter;
            if (is_buffer(p)) {
                p->data = ws->model->buffers + p->offset;
                p->grad = NULL;
            } else {
                p->data = ws->model->weights + p->offset;
                p->grad = ws->model->grads + p->offset;
            }
            ws->model->params[ws->count] = p;
        }
        *counter += p->numel;
        ws->count++;
    }
    if (ws->assign) {
        cf_rng_seed(&m->rng, ws->model->seed * 0x9E3779B97F4A7C15ULL + (uint64_t)ws->module_index);
        m->draw_key = &ws->model->draw_key;
        ws->module_index++;
        if (m->ops->init) m->ops->init(m, &ws->rng);
    }
    for (int i = 0; i < m->n_children; i++) {
        char child_prefix[512];
        if (m->child_names[i][0]) /* an empty name adds nothing (nn.h, cf_module_add_child) */
            snprintf(child_prefix, sizeof child_prefix, "%s%s.", prefix, m->child_names[i]);
        else
            snprintf(child_prefix, sizeof child_prefix, "%s", prefix);
        cf_status st = walk(m->children[i], child_prefix, ws);
        if (st != CF_OK) return st;
    }
    return CF_OK;
}

cf_status cf_model_new(cf_model **out, cf_module *root, uint64_t seed) {
    *out = NULL;
    if (!root) return cf_fail_context(CF_ERR_INVALID, "cf_model_new: no root module");
    cf_model *model = cf_calloc(1, sizeof *model);
    if (!model) {
        cf_module_free(root);
        return CF_ERR_NOMEM;
    }
    model->root = root;
    model->seed = seed;
    model->n_groups = 1;
    walk_state ws = {.model = model};
    walk(root, "", &ws); /* count */
    model->n_params = ws.count;
    model->n_weights = ws.n_weights;
    model->n_buffers = ws.n_buffers;
    model->params = cf_calloc((size_t)ws.count + 1, sizeof *model->params);
    model->weights = cf_calloc(ws.n_weights + 1, sizeof(float));
    model->grads = cf_calloc(ws.n_weights + 1, sizeof(float));
    model->buffers = cf_calloc(ws.n_buffers + 1, sizeof(float));
    if (!model->params || !model->weights || !model->grads || !model->buffers) {
        cf_model_free(model);
        return cf_fail_context(CF_ERR_NOMEM, "model with %zu parameters", ws.n_weights);
    }
    ws = (walk_state){.model = model, .assign = true};
    cf_rng_seed(&ws.rng, seed);
    cf_status st = walk(root, "", &ws);
    if (st != CF_OK) {
        cf_model_free(model);
        return st;
    }
    cf_model_train(model, true);
    *out = model;
    return CF_OK;
}

void cf_model_free(cf_model *model) {
    if (!model) return;
    cf_module_free(model->root);
    cf_free(model->params);
    cf_free(model->weights);
    cf_free(model->grads);
    cf_free(model->buffers);
    cf_arena_release(&model->arena);
    cf_free(model);
}

static void set_training(cf_module *m, bool training) {
    m->training = training;
    for (int i = 0; i < m->n_children; i++) set_training(m->children[i], training);
}

void cf_model_set_draw_key(cf_model *model, uint64_t key, const int64_t *ids, int n) {
    model->draw_key = (cf_draw_key){.key = key, .ids = ids, .n = ids ? n : 0};
}

void cf_model_train(cf_model *model, bool training) {
    model->training = training;
    set_training(model->root, training);
}

static bool needs_plan(const cf_model *model, const cf_shape *in) {
    if (model->planned.ndim != in->ndim || model->planned_threads != cf_get_num_threads() ||
        model->planned_bf16 != cf__conv_bf16_generation())
        return true;
    if (in->dim[0] > model->planned.dim[0]) return true;
    /* a language model runs a shorter sequence (the short last batch of fastai's LMDataLoader)
     * within its plan, as it runs fewer rows: one plan an epoch */
    const bool shorter_seq_ok = in->ndim == 2 && model->root->seq_within_plan;
    for (int i = 1; i < in->ndim; i++)
        if (in->dim[i] != model->planned.dim[i] &&
            !(i == 1 && shorter_seq_ok && in->dim[i] < model->planned.dim[i]))
            return true;
    return false;
}

static cf_status plan(cf_model *model, const cf_shape *in) {
    cf_shape out;
    cf_status st = cf_nn_module_out_shape(model->root, in, &out);
    if (st != CF_OK) {
        char s[64];
        return cf_fail_context(st, "model input %s", cf_shape_str(in, s, sizeof s));
    }
    cf_nn_fuse(model->root, !model->unfused);
    cf_arena_begin_measure(&model->arena);
    cf_nn_module_plan(model->root, in, &model->arena);
    if ((st = cf_arena_commit(&model->arena)) != CF_OK) return st;
    cf_nn_module_plan(model->root, in, &model->arena);
    model->planned = *in;
    model->planned_threads = cf_get_num_threads();
    model->planned_bf16 = cf__conv_bf16_generation();
    model->n_plans++;
    return CF_OK;
}

cf_status cf_model_forward(cf_model *model, const cf_tensor *x, const cf_tensor **y) {
    if (x->shape.ndim < 1 || x->shape.dim[0] < 1) return cf_fail(CF_ERR_INVALID, "empty batch");
    if (needs_plan(model, &x->shape)) {
        cf_shape cap = x->shape;
        if (model->planned.ndim == x->shape.ndim && model->planned.dim[0] > cap.dim[0])
            cap.dim[0] = model->planned.dim[0];
        /* a language model planned for longer sequences keeps that capacity */
        if (model->root->seq_within_plan && model->planned.ndim == 2 && cap.ndim == 2 &&
            model->planned.dim[1] > cap.dim[1])
            cap.dim[1] = model->planned.dim[1];
        cf_status st = plan(model, &cap);
        if (st != CF_OK) return st;
    }
    model->root->in = x;
    cf__nn_pass_begin();
    *y = model->root->ops->forward(model->root, x);
    return cf__nn_pass_end();
}

cf_status cf_model_backward(cf_model *model, const cf_tensor *dy) {
    if (!model->root->in) return cf_fail(CF_ERR_STATE, "backward before forward");
    /* a container that does not give its children's gradients back holds them until here */
    cf_arena_give_all(&model->arena);
    cf__nn_pass_begin();
    model->root->ops->backward(model->root, dy, false);
    return cf__nn_pass_end();
}

void cf_model_zero_grad(cf_model *model) {
    memset(model->grads, 0, model->n_weights * sizeof(float));
}

cf_param *cf_model_param(const cf_model *model, const char *full_name) {
    for (int i = 0; i < model->n_params; i++)
        if (strcmp(model->params[i]->full_name, full_name) == 0) return model->params[i];
    return NULL;
}

static void set_group(cf_module *m, int group) {
    for (int i = 0; i < m->n_params; i++) m->params[i].group = group;
    for (int i = 0; i < m->n_children; i++) set_group(m->children[i], group);
}

static bool contains(const cf_module *tree, const cf_module *sub) {
    if (tree == sub) return true;
    for (int i = 0; i < tree->n_children; i++)
        if (contains(tree->children[i], sub)) return true;
    return false;
}

cf_status cf_model_set_group(cf_model *model, const cf_module *sub, int group) {
    if (group < 0 || group > 64)
        return cf_fail(CF_ERR_INVALID, "parameter group %d out of range 0..64", group);
    if (!contains(model->root, sub))
        return cf_fail(CF_ERR_INVALID, "cf_model_set_group: module is not part of the model");
    set_group((cf_module *)sub, group);
    if (group + 1 > model->n_groups) model->n_groups = group + 1;
    return CF_OK;
}

void cf_model_freeze_to(cf_model *model, int n, bool train_bn) {
    int frozen = n >= 0 ? n : model->n_groups + n;
    for (int i = 0; i < model->n_params; i++) {
        cf_param *p = model->params[i];
        if (is_buffer(p)) continue;
        p->trainable = p->group >= frozen || (train_bn && p->kind == CF_PARAM_NORM);
    }
}

cf_status cf_model_copy_state(cf_model *dst, const cf_model *src) {
    if (dst->n_weights != src->n_weights || dst->n_buffers != src->n_buffers ||
        dst->n_params != src->n_params)
        return cf_fail(CF_ERR_INVALID,
                       "cf_model_copy_state: models differ (%zu vs %zu weights, %zu vs %zu "
                       "buffers)",
                       dst->n_weights, src->n_weights, dst->n_buffers, src->n_buffers);
    memcpy(dst->weights, src->weights, src->n_weights * sizeof(float));
    memcpy(dst->buffers, src->buffers, src->n_buffers * sizeof(float));
    return CF_OK;
}

size_t cf_model_num_weights(const cf_model *model) {
    return model->n_weights;
}
