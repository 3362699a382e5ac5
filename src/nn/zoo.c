/* What the model zoo shares: fastai's initialisation through init hooks (zoo.h), the
 * pass-through modules (hooks, ModuleList), Sequential(body, head) and the parameter-group
 * splitters. */
#include "corefit/nn.h"
#include "nn_internal.h"
#include "zoo.h"

#include <math.h>
#include <string.h>

typedef struct zoo_init_mark {
    cf_module *module;
    cf_zoo_mark_kind kind;
    int arg;
} zoo_init_mark;

/* Marks are applied first (the layers' own fastai init), then the pass over the target. */
typedef struct zoo_init_hook {
    cf_module *target; /* the subtree the hook ends (not owned) */
    cf_zoo_init_pass pass;
    zoo_init_mark *marks;
    int n_marks, cap;
} zoo_init_hook;

/* ---- pass-through modules (init hooks, ModuleList) ---------------------------------------- */

static cf_status pass_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    (void)m;
    *out = *in;
    return CF_OK;
}

static void pass_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    (void)m;
    (void)in;
    (void)arena;
}

static const cf_tensor *pass_forward(cf_module *m, const cf_tensor *x) {
    m->in = x;
    return x;
}

static const cf_tensor *pass_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    (void)m;
    return need_dx ? dy : NULL;
}

static void hook_destroy(cf_module *m) {
    zoo_init_hook *h = m->impl;
    if (h) cf_free(h->marks);
}

static void hook_init(cf_module *m, cf_rng *rng);

static const cf_module_ops hook_ops = {
    .kind = "InitHook",
    .out_shape = pass_out_shape,
    .plan = pass_plan,
    .init = hook_init,
    .forward = pass_forward,
    .backward = pass_backward,
    .destroy = hook_destroy,
};

static const cf_module_ops module_list_ops = {
    .kind = "ModuleList",
    .out_shape = pass_out_shape,
    .plan = pass_plan,
    .forward = pass_forward,
    .backward = pass_backward,
};

cf_module *cf_zoo_module_list(void) {
    return cf_module_new(&module_list_ops, NULL);
}

cf_module *cf_zoo_hook_new(cf_zoo_init_pass pass) {
    zoo_init_hook *h = cf_calloc(1, sizeof *h);
    if (!h) return NULL;
    h->pass = pass;
    return cf_module_new(&hook_ops, h);
}

bool cf_zoo_hook_mark(cf_module *hook, cf_module *target, cf_zoo_mark_kind kind) {
    return cf_zoo_hook_mark_arg(hook, target, kind, 0);
}

bool cf_zoo_hook_mark_arg(cf_module *hook, cf_module *target, cf_zoo_mark_kind kind, int arg) {
    zoo_init_hook *h = hook->impl;
    if (!target) return false;
    if (h->n_marks == h->cap) {
        int cap = h->cap ? 2 * h->cap : 16;
        zoo_init_mark *marks = cf_calloc((size_t)cap, sizeof *marks);
        if (!marks) return false;
        if (h->n_marks) memcpy(marks, h->marks, (size_t)h->n_marks * sizeof *marks);
        cf_free(h->marks);
        h->marks = marks;
        h->cap = cap;
    }
    h->marks[h->n_marks++] = (zoo_init_mark){.module = target, .kind = kind, .arg = arg};
    return true;
}

void cf_zoo_hook_target(cf_module *hook, cf_module *target) {
    ((zoo_init_hook *)hook->impl)->target = target;
}

bool cf_zoo_finish(cf_module *seq, cf_module *hook, bool ok) {
    if (!ok || !seq) {
        cf_module_free(hook);
        return false;
    }
    ((zoo_init_hook *)hook->impl)->target = seq;
    return cf_sequential_append(seq, hook) == CF_OK;
}

void cf_zoo_add(cf_module *seq, bool *ok, cf_module *child) {
    if (!*ok || !seq) {
        cf_module_free(child);
        *ok = false;
        return;
    }
    if (!child || cf_sequential_append(seq, child) != CF_OK) *ok = false;
}

/* ---- initialisation ------------------------------------------------------------------------ */

static cf_param *find_param(cf_module *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

static void fill(cf_param *p, float v) {
    if (!p || !p->data) return;
    for (size_t i = 0; i < p->numel; i++) p->data[i] = v;
}

static size_t fan_in(const cf_param *p) {
    return p->shape.ndim > 0 && p->shape.dim[0] > 0 ? p->numel / (size_t)p->shape.dim[0] : 1;
}

/* torch.nn.init.kaiming_normal_ (a 0, fan_in): N(0, 2 / fan_in). */
static void kaiming_normal(cf_param *p, cf_rng *rng) {
    if (!p || !p->data) return;
    double std = sqrt(2.0 / (double)fan_in(p));
    for (size_t i = 0; i < p->numel; i++) p->data[i] = (float)(std * cf_rng_normal(rng));
}

/* torch.nn.init.kaiming_uniform_ (a 0, fan_in): U(-sqrt(6 / fan_in), sqrt(6 / fan_in)). */
static void kaiming_uniform(cf_param *p, cf_rng *rng) {
    if (!p || !p->data) return;
    double bound = sqrt(6.0 / (double)fan_in(p));
    for (size_t i = 0; i < p->numel; i++)
        p->data[i] = (float)(bound * (2.0 * cf_rng_uniform(rng) - 1.0));
}

/* ---- ICNR (fastai's icnr_init)
 * ----------------------------------------------------------------------------------- */

void cf_icnr_init(float *weight, int out_channels, int in_channels, int kh, int kw, int scale,
                  cf_rng *rng) {
    const int s2 = scale * scale;
    const size_t k = (size_t)in_channels * kh * kw; /* one output channel's kernel, = fan_in */
    const double std = sqrt(2.0 / (double)k);
    /* the base kernels first (out_channels / s2 of them), then output channel o takes base
     * o / s2: at init the s2 sub-pixels of every position are equal, nearest upsampling */
    const int n_base = out_channels / s2;
    for (int b = 0; b < n_base; b++)
        for (size_t i = 0; i < k; i++)
            weight[(size_t)b * s2 * k + i] = (float)(std * cf_rng_normal(rng));
    for (int b = 0; b < n_base; b++)
        for (int r = 1; r < s2; r++)
            memcpy(weight + ((size_t)b * s2 + r) * k, weight + (size_t)b * s2 * k,
                   k * sizeof(float));
}

static bool is_norm(const cf_module *m) {
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].kind == CF_PARAM_NORM) return true;
    return false;
}

static void init_pass(cf_module *m, cf_zoo_init_pass pass, cf_rng *rng);

static void apply_mark(const zoo_init_mark *mk, cf_rng *rng) {
    cf_module *m = mk->module;
    switch (mk->kind) {
    case CF_ZOO_MARK_BN: /* fastai's BatchNorm(): weight 1, bias 1e-3 */
        fill(find_param(m, "weight"), 1.0f);
        fill(find_param(m, "bias"), 1e-3f);
        break;
    case CF_ZOO_MARK_BN_ZERO: /* NormType.BatchZero */
        fill(find_param(m, "weight"), 0.0f);
        fill(find_param(m, "bias"), 1e-3f);
        break;
    case CF_ZOO_MARK_CONV_RELU: { /* ConvLayer's init_linear(conv, ReLU): kaiming_uniform_ */
        kaiming_uniform(find_param(m, "weight"), rng);
        cf_param *b = find_param(m, "bias"); /* normal_(bias, 0, 0.01) */
        if (b && b->data)
            for (size_t i = 0; i < b->numel; i++) b->data[i] = (float)(0.01 * cf_rng_normal(rng));
        break;
    }
    case CF_ZOO_MARK_EMBEDDING: { /* fastai's trunc_normal_(std=0.01): normal_().fmod_(2)*0.01 */
        cf_param *w = find_param(m, "weight");
        if (w && w->data)
            for (size_t i = 0; i < w->numel; i++)
                w->data[i] = (float)(fmod(cf_rng_normal(rng), 2.0) * 0.01);
        break;
    }
    case CF_ZOO_MARK_APPLY_INIT:
        init_pass(m, CF_ZOO_PASS_APPLY_INIT, rng);
        break;
    case CF_ZOO_MARK_ICNR: { /* bias_std 0: the bias starts at 0 */
        cf_param *w = find_param(m, "weight");
        if (w && w->data && w->shape.ndim == 4)
            cf_icnr_init(w->data, w->shape.dim[0], w->shape.dim[1], w->shape.dim[2],
                         w->shape.dim[3], mk->arg, rng);
        fill(find_param(m, "bias"), 0.0f);
        break;
    }
    }
}

/* apply_init(m, kaiming_normal_): every non-norm module with parameters gets kaiming_normal_
 * weights and zero biases. init_cnn: every bias 0 (BatchNorm too), conv/linear weights
 * kaiming_normal_. */
static void init_pass(cf_module *m, cf_zoo_init_pass pass, cf_rng *rng) {
    if (pass == CF_ZOO_PASS_APPLY_INIT && !is_norm(m)) {
        for (int i = 0; i < m->n_params; i++) {
            cf_param *p = &m->params[i];
            if (p->kind == CF_PARAM_WEIGHT && strcmp(p->name, "weight") == 0)
                kaiming_normal(p, rng);
            else if (p->kind == CF_PARAM_BIAS || strcmp(p->name, "bias") == 0)
                fill(p, 0.0f);
        }
    } else if (pass == CF_ZOO_PASS_TORCHVISION) {
        cf_param *w = strcmp(m->ops->kind, "Conv2d") == 0 ? find_param(m, "weight") : NULL;
        if (w && w->data && w->shape.ndim == 4) { /* fan_out = out_channels * kh * kw */
            double std = sqrt(2.0 / (double)(w->numel / (size_t)w->shape.dim[1]));
            for (size_t i = 0; i < w->numel; i++) w->data[i] = (float)(std * cf_rng_normal(rng));
        }
    } else if (pass == CF_ZOO_PASS_INIT_CNN) {
        for (int i = 0; i < m->n_params; i++) {
            cf_param *p = &m->params[i];
            if (strcmp(p->name, "bias") == 0)
                fill(p, 0.0f);
            else if (p->kind == CF_PARAM_WEIGHT && strcmp(p->name, "weight") == 0)
                kaiming_normal(p, rng);
        }
    }
    for (int i = 0; i < m->n_children; i++) init_pass(m->children[i], pass, rng);
}

/* Runs after every parameter of the target subtree has storage and its layer's own init. */
static void hook_init(cf_module *m, cf_rng *rng) {
    zoo_init_hook *h = m->impl;
    for (int i = 0; i < h->n_marks; i++) apply_mark(&h->marks[i], rng);
    if (h->target && h->pass != CF_ZOO_PASS_NONE) init_pass(h->target, h->pass, rng);
}

cf_module *cf_zoo_body_head(cf_module *body, cf_module *head) {
    if (!body || !head) {
        cf_module_free(body);
        cf_module_free(head);
        return NULL;
    }
    cf_module *parts[2] = {body, head};
    return cf_sequential(2, parts);
}

/* ---- parameter groups ---------------------------------------------------------------------- */

static void group_all(cf_module *m, int group) {
    for (int i = 0; i < m->n_params; i++) m->params[i].group = group;
    for (int i = 0; i < m->n_children; i++) group_all(m->children[i], group);
}

cf_status cf_split_default(cf_model *model) {
    cf_module *root = model->root;
    if (root->n_children < 2)
        return cf_fail(CF_ERR_INVALID,
                       "default split: the model's root (%s) has %d children; needs a body and a "
                       "head",
                       root->ops->kind, root->n_children);
    group_all(root, 1);
    group_all(root->children[0], 0);
    model->n_groups = 2;
    return CF_OK;
}

cf_status cf_split_resnet(cf_model *model) {
    cf_module *root = model->root;
    if (root->n_children < 2 || root->children[0]->n_children <= 6)
        return cf_fail(CF_ERR_INVALID,
                       "resnet split: needs Sequential(body, head) with more than 6 body "
                       "children");
    cf_module *body = root->children[0];
    group_all(root, 2);
    for (int i = 0; i < body->n_children; i++) group_all(body->children[i], i < 6 ? 0 : 1);
    model->n_groups = 3;
    return CF_OK;
}

void cf_split_none(cf_model *model) {
    group_all(model->root, 0);
    model->n_groups = 1;
}
