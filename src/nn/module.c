/* Modules, the Sequential and residual containers, and models (names, flat blocks, arena). */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- modules ------------------------------------------------------------------------------- */

cf_module *cf_module_new(const cf_module_ops *ops, void *impl) {
    cf_module *m = cf_calloc(1, sizeof *m);
    if (!m) {
        cf_free(impl);
        return NULL;
    }
    m->ops = ops;
    m->impl = impl;
    m->training = true;
    return m;
}

cf_param *cf_module_add_param(cf_module *m, const char *name, cf_param_kind kind, cf_shape shape) {
    if (m->n_params >= CF_MODULE_MAX_PARAMS) return NULL;
    cf_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    p->name = name;
    p->kind = kind;
    p->shape = shape;
    p->numel = cf_shape_numel(&shape);
    p->trainable = kind != CF_PARAM_BUFFER && kind != CF_PARAM_COUNTER;
    return p;
}

void cf_module_free(cf_module *m) {
    if (!m) return;
    for (int i = 0; i < m->n_children; i++) {
        cf_module_free(m->children[i]);
        cf_free(m->child_names[i]);
    }
    cf_free(m->children);
    cf_free(m->child_names);
    for (int i = 0; i < m->n_params; i++) cf_free(m->params[i].full_name);
    if (m->ops && m->ops->destroy) m->ops->destroy(m);
    cf_free(m->impl);
    cf_free(m);
}

static cf_status module_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    return m->ops->out_shape(m, in, out);
}

void cf_module_plan_default(cf_module *m, const cf_shape *in, cf_arena *arena) {
    cf_shape out;
    if (module_out_shape(m, in, &out) != CF_OK) return; /* checked before planning */
    m->out.data = cf_arena_floats(arena, cf_shape_numel(&out));
    m->out.shape = out;
    m->dx.data = NULL;
    m->dx.shape = *in;
    cf_arena_reserve_transient(arena, cf_shape_numel(in) * sizeof(float));
    m->grad_arena = arena;
}

static void module_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    if (m->ops->plan)
        m->ops->plan(m, in, arena);
    else
        cf_module_plan_default(m, in, arena);
}

cf_tensor *cf_module_output(cf_module *m, const cf_shape *shape) {
    m->out.shape = *shape;
    return &m->out;
}

cf_tensor *cf_module_input_grad(cf_module *m) {
    m->dx.shape = m->in->shape;
    cf_arena *pool = m->grad_arena;
    if (pool && !cf_arena_holds(pool, m->dx.data, m))
        m->dx.data = cf_arena_take(pool, cf_shape_numel(&m->dx.shape) * sizeof(float), m);
    return &m->dx;
}

void cf_module_give_grad(const cf_module *m, const float *p, const float *keep) {
    if (m->grad_arena) cf_arena_give(m->grad_arena, p, keep);
}

cf_status cf_module_add_child(cf_module *parent, cf_module *child, const char *name) {
    int n = parent->n_children;
    cf_module **children = cf_calloc((size_t)n + 1, sizeof *children);
    char **names = cf_calloc((size_t)n + 1, sizeof *names);
    char *copy = cf_strdup(name);
    if (!children || !names || !copy) {
        cf_free(children);
        cf_free(names);
        cf_free(copy);
        cf_module_free(child);
        return CF_ERR_NOMEM;
    }
    if (n) {
        memcpy(children, parent->children, (size_t)n * sizeof *children);
        memcpy(names, parent->child_names, (size_t)n * sizeof *names);
    }
    children[n] = child;
    names[n] = copy;
    cf_free(parent->children);
    cf_free(parent->child_names);
    parent->children = children;
    parent->child_names = names;
    parent->n_children = n + 1;
    return CF_OK;
}

/* ---- Sequential ---------------------------------------------------------------------------- */

static cf_status seq_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    cf_shape s = *in;
    for (int i = 0; i < m->n_children; i++) {
        cf_shape next;
        cf_status st = module_out_shape(m->children[i], &s, &next);
        if (st != CF_OK) return cf_fail_context(st, "in Sequential child %s", m->child_names[i]);
        s = next;
    }
    *out = s;
    return CF_OK;
}

static bool fusion_enabled = true;

void cf_nn_set_fusion(bool enabled) {
    fusion_enabled = enabled;
}

bool cf_nn_fusion_enabled(void) {
    return fusion_enabled;
}

/* Links each BatchNorm child to a ReLU child right after it (nn_internal.h); a child whose ops
 * are not the layer's own (a wrapper's: timers, hooks) is never fused. Every link from an
 * earlier plan is dropped first. */
static void seq_fuse(cf_module *m) {
    for (int i = 0; i < m->n_children; i++) {
        cf_module *c = m->children[i];
        if (cf_nn_is_batchnorm(c))
            cf_nn_bn_fuse_relu(c, NULL);
        else if (cf_nn_is_relu(c))
            cf_nn_relu_follow_bn(c, NULL);
    }
    if (!fusion_enabled) return;
    for (int i = 0; i + 1 < m->n_children; i++) {
        cf_module *bn = m->children[i], *relu = m->children[i + 1];
        if (cf_nn_is_batchnorm(bn) && cf_nn_is_relu(relu)) {
            cf_nn_bn_fuse_relu(bn, relu);
            cf_nn_relu_follow_bn(relu, bn);
        }
    }
}

static void seq_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    seq_fuse(m);
    m->grad_arena = arena; /* where the children's gradients are given back */
    cf_shape s = *in;
    for (int i = 0; i < m->n_children; i++) {
        cf_shape next;
        module_plan(m->children[i], &s, arena);
        module_out_shape(m->children[i], &s, &next);
        s = next;
    }
}

static const cf_tensor *seq_forward(cf_module *m, const cf_tensor *x) {
    m->in = x;
    for (int i = 0; i < m->n_children; i++) {
        cf_module *c = m->children[i];
        c->in = x;
        x = c->ops->forward(c, x);
    }
    return x;
}

static const cf_tensor *seq_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    const float *given = dy->data; /* the caller's */
    for (int i = m->n_children - 1; i >= 0; i--) {
        cf_module *c = m->children[i];
        const cf_tensor *dx = c->ops->backward(c, dy, i > 0 || need_dx);
        /* the child has read its upstream gradient: a block a later child returned is dead
         * unless it passed through (the same memory) */
        if (dy->data != given) cf_module_give_grad(m, dy->data, dx ? dx->data : NULL);
        dy = dx;
    }
    return need_dx ? dy : NULL;
}

static const cf_module_ops sequential_ops = {
    .kind = "Sequential",
    .out_shape = seq_out_shape,
    .plan = seq_plan,
    .forward = seq_forward,
    .backward = seq_backward,
};

cf_module *cf_sequential(int n, cf_module *const *children) {
    cf_module *m = cf_module_new(&sequential_ops, NULL);
    for (int i = 0; i < n; i++) {
        if (!m || !children[i] || cf_sequential_append(m, children[i]) != CF_OK) {
            for (int j = i + (m && children[i] ? 1 : 0); j < n; j++) cf_module_free(children[j]);
            cf_module_free(m);
            if (!children[i]) cf_fail_context(CF_ERR_INVALID, "Sequential child %d", i);
            return NULL;
        }
    }
    return m;
}

cf_status cf_sequential_append(cf_module *seq, cf_module *child) {
    if (!child) return cf_fail(CF_ERR_INVALID, "cf_sequential_append: NULL child");
    char name[16];
    snprintf(name, sizeof name, "%d", seq->n_children);
    return cf_module_add_child(seq, child, name);
}

/* ---- residual block: act(convpath(x) + idpath(x)) ------------------------------------------ *
 * The element-wise passes (sum and ReLU forward; ReLU's mask and the sum of the two input
 * gradients backward) are memory-bound over the block's activations; large ones are split over
 * the thread pool in contiguous chunks (results do not depend on the split). With ReLU after the
 * sum and an idpath that ends in a BatchNorm, that BatchNorm writes relu(a + bn(.)) itself
 * (nn_internal.h) and its output is the block's output. The input gradient is summed into the
 * convpath's input gradient in place (that buffer is dead once the convpath's backward has
 * returned, and writing it back where it was just read costs no extra read of a fresh
 * destination), unless that buffer is the upstream gradient itself (a convpath that passes its
 * gradient through, without ReLU after the sum) or the idpath's: then into the block's own
 * buffer. */

typedef struct residual_impl {
    bool relu_after;
    bool has_idpath;
    cf_module *fold; /* the idpath's last BatchNorm, which writes the block's output */
    cf_tensor dz;    /* gradient after the activation */
    cf_tensor gx;    /* the input gradient when summed into the convpath's */
} residual_impl;

#define RES_PAR_MIN (1 << 16)

typedef enum { RES_ADD, RES_ADD_TO, RES_ADD_RELU, RES_MASK } res_op;

typedef struct res_ew {
    res_op op;
    const float *a, *b;
    float *out;
} res_ew;

static void res_ew_range(void *vctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const res_ew *c = vctx;
    const float *restrict a = c->a, *restrict b = c->b;
    float *restrict o = c->out; /* never a or b (but for RES_ADD_TO, where a is unused) */
    switch (c->op) {
    case RES_ADD:
        for (int64_t i = begin; i < end; i++) o[i] = a[i] + b[i];
        break;
    case RES_ADD_TO: /* out is a (a separate pointer to it would break restrict) */
        for (int64_t i = begin; i < end; i++) o[i] += b[i];
        break;
    case RES_ADD_RELU:
        for (int64_t i = begin; i < end; i++) {
            const float v = a[i] + b[i];
            o[i] = v > 0.0f ? v : 0.0f;
        }
        break;
    case RES_MASK: /* a: the ReLU's output, b: the gradient */
        for (int64_t i = begin; i < end; i++) {
            const float g = b[i]; /* loaded unconditionally so that the select vectorises */
            o[i] = a[i] > 0.0f ? g : 0.0f;
        }
        break;
    }
}

static void res_ew_run(res_op op, const float *a, const float *b, float *out, size_t n) {
    res_ew ctx = {op, a, b, out};
    if (n >= RES_PAR_MIN && cf_get_num_threads() > 1)
        cf_parallel_for((int64_t)n, res_ew_range, &ctx);
    else
        res_ew_range(&ctx, 0, (int64_t)n, 0);
}

static cf_status res_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    residual_impl *r = m->impl;
    cf_shape a, b = *in;
    cf_status st = module_out_shape(m->children[0], in, &a);
    if (st != CF_OK) return cf_fail_context(st, "in residual convpath");
    if (r->has_idpath && (st = module_out_shape(m->children[1], in, &b)) != CF_OK)
        return cf_fail_context(st, "in residual idpath");
    if (!cf_shape_equal(&a, &b)) {
        char sa[64], sb[64];
        return cf_fail(CF_ERR_INVALID, "residual block: convpath gives %s but idpath gives %s",
                       cf_shape_str(&a, sa, sizeof sa), cf_shape_str(&b, sb, sizeof sb));
    }
    *out = a;
    return CF_OK;
}

/* The idpath's last module when it is a BatchNorm (its own ops, in a Sequential with its own
 * ops or alone) that can write the block's output; NULL otherwise. */
static cf_module *res_fold_target(cf_module *m) {
    residual_impl *r = m->impl;
    if (!fusion_enabled || !r->relu_after || !r->has_idpath) return NULL;
    cf_module *last = m->children[1];
    if (last->ops == &sequential_ops && last->n_children > 0)
        last = last->children[last->n_children - 1];
    return cf_nn_is_batchnorm(last) ? last : NULL;
}

static void res_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    residual_impl *r = m->impl;
    for (int i = 0; i < m->n_children; i++) module_plan(m->children[i], in, arena);
    r->fold = res_fold_target(m);
    cf_shape out;
    if (res_out_shape(m, in, &out) != CF_OK) return; /* checked before planning */
    m->out.data = r->fold ? NULL : cf_arena_floats(arena, cf_shape_numel(&out));
    m->out.shape = out;
    m->dx.data = NULL;
    m->dx.shape = *in;
    cf_arena_reserve_transient(arena, cf_shape_numel(in) * sizeof(float));
    m->grad_arena = arena;
    r->dz.data = NULL;
    if (r->relu_after) cf_arena_reserve_transient(arena, cf_shape_numel(&out) * sizeof(float));
}

/* The module a path starts with: its first child when it is a Sequential (ops its own). */
static cf_module *path_first(cf_module *path) {
    return path->ops == &sequential_ops && path->n_children ? path->children[0] : path;
}

static const cf_tensor *res_forward(cf_module *m, const cf_tensor *x) {
    residual_impl *r = m->impl;
    m->in = x;
    cf_module *cp = m->children[0];
    cp->in = x;
    /* a strided convpath conv may compute the idpath's strided 1x1 conv from its phase split */
    cf_module *first_a = path_first(cp),
              *first_b = r->has_idpath ? path_first(m->children[1]) : NULL;
    const bool shortcut =
        fusion_enabled && first_b && cf_nn_is_conv(first_a) && cf_nn_is_conv(first_b);
    if (shortcut) cf_nn_conv_shortcut_next(first_a, first_b);
    const cf_tensor *a = cp->ops->forward(cp, x);
    const cf_tensor *b = x;
    if (r->has_idpath) {
        cf_module *ip = m->children[1];
        ip->in = x;
        if (r->fold) cf_nn_bn_add_relu_next(r->fold, a->data);
        b = ip->ops->forward(ip, x);
        if (shortcut) cf_nn_conv_shortcut_done(first_a, first_b);
        if (r->fold) { /* b is relu(a + idpath(x)) */
            m->out = *b;
            return &m->out;
        }
    }
    cf_tensor *y = cf_module_output(m, &a->shape);
    res_ew_run(r->relu_after ? RES_ADD_RELU : RES_ADD, a->data, b->data, y->data,
               cf_tensor_numel(y));
    return y;
}

/* Gives back a gradient the block has read (not dy, the caller's, nor keep, what it returns). */
static void res_give(const cf_module *m, const cf_tensor *t, const cf_tensor *dy,
                     const float *keep) {
    if (t && t->data != dy->data && t->data != keep) cf_module_give_grad(m, t->data, keep);
}

static const cf_tensor *res_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    residual_impl *r = m->impl;
    const cf_tensor *dz = dy;
    if (r->relu_after) {
        r->dz.shape = dy->shape;
        r->dz.data = cf_arena_take(m->grad_arena, cf_tensor_numel(dy) * sizeof(float), &r->dz);
        res_ew_run(RES_MASK, m->out.data, dy->data, r->dz.data, cf_tensor_numel(dy));
        dz = &r->dz;
    }
    cf_module *cp = m->children[0];
    /* a shortcut whose output the convpath's first conv computed may leave its input gradient
     * to that conv as well: the idpath runs first and returns the shortcut's output gradient,
     * dead once the convpath has run */
    cf_module *first_a = path_first(cp),
              *first_b = r->has_idpath ? path_first(m->children[1]) : NULL;
    if (fusion_enabled && need_dx && first_b && cf_nn_is_conv(first_a) && cf_nn_is_conv(first_b) &&
        cf_nn_conv_shortcut_dx_next(first_a, first_b)) {
        cf_module *ip = m->children[1];
        const cf_tensor *handed = ip->ops->backward(ip, dz, true);
        const cf_tensor *dx = cp->ops->backward(cp, dz, true);
        res_give(m, handed, dy, dx->data);
        if (dz != dy) res_give(m, dz, dy, dx->data);
        return dx;
    }
    const cf_tensor *da = cp->ops->backward(cp, dz, need_dx);
    const cf_tensor *db = dz;
    const cf_tensor *dx = NULL;
    if (r->has_idpath) {
        cf_module *ip = m->children[1];
        /* an idpath that starts with a convolution may add its gradient into the convpath's
         * (a buffer of the convpath's own, dead once read here) */
        cf_module *first = path_first(ip);
        const bool add = fusion_enabled && need_dx && da->data != dy->data &&
                         da->data != dz->data && cf_nn_is_conv(first);
        if (add) cf_nn_conv_add_dx_next(first, da->data);
        db = ip->ops->backward(ip, dz, need_dx);
        if (add && db->data == da->data) dx = db; /* added in place */
    }
    if (need_dx && !dx) {
        if (da->data != dy->data && da->data != db->data && da->data != dz->data) {
            r->gx = (cf_tensor){.data = da->data, .shape = m->in->shape};
            res_ew_run(RES_ADD_TO, NULL, db->data, r->gx.data, cf_tensor_numel(&r->gx));
            dx = &r->gx;
        } else {
            cf_tensor *sum = cf_module_input_grad(m);
            res_ew_run(RES_ADD, da->data, db->data, sum->data, cf_tensor_numel(sum));
            dx = sum;
        }
    }
    /* what the paths returned and the masked gradient are dead now, unless returned */
    const float *keep = dx ? dx->data : NULL;
    res_give(m, da, dy, keep);
    if (db != dz) res_give(m, db, dy, keep);
    if (dz != dy) res_give(m, dz, dy, keep);
    return dx;
}

static const cf_module_ops residual_ops = {
    .kind = "ResBlock",
    .out_shape = res_out_shape,
    .plan = res_plan,
    .forward = res_forward,
    .backward = res_backward,
};

cf_module *cf_residual(cf_module *convpath, cf_module *idpath, bool relu_after) {
    residual_impl *r = cf_calloc(1, sizeof *r);
    cf_module *m = r ? cf_module_new(&residual_ops, r) : NULL;
    if (!m || !convpath) {
        cf_module_free(m);
        cf_module_free(convpath);
        cf_module_free(idpath);
        if (!convpath) cf_fail(CF_ERR_INVALID, "cf_residual: NULL convpath");
        return NULL;
    }
    r->relu_after = relu_after;
    r->has_idpath = idpath != NULL;
    if (cf_module_add_child(m, convpath, "convpath") != CF_OK ||
        (idpath && cf_module_add_child(m, idpath, "idpath") != CF_OK)) {
        if (m->n_children == 1 && idpath) cf_module_free(idpath);
        cf_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- models -------------------------------------------------------------------------------- */

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
    if (model->planned.ndim != in->ndim || model->planned_threads != cf_get_num_threads())
        return true;
    if (in->dim[0] > model->planned.dim[0]) return true;
    for (int i = 1; i < in->ndim; i++)
        if (in->dim[i] != model->planned.dim[i]) return true;
    return false;
}

static cf_status plan(cf_model *model, const cf_shape *in) {
    cf_shape out;
    cf_status st = module_out_shape(model->root, in, &out);
    if (st != CF_OK) {
        char s[64];
        return cf_fail_context(st, "model input %s", cf_shape_str(in, s, sizeof s));
    }
    cf_arena_begin_measure(&model->arena);
    module_plan(model->root, in, &model->arena);
    if ((st = cf_arena_commit(&model->arena)) != CF_OK) return st;
    module_plan(model->root, in, &model->arena);
    model->planned = *in;
    model->planned_threads = cf_get_num_threads();
    return CF_OK;
}

cf_status cf_model_forward(cf_model *model, const cf_tensor *x, const cf_tensor **y) {
    if (x->shape.ndim < 1 || x->shape.dim[0] < 1) return cf_fail(CF_ERR_INVALID, "empty batch");
    if (needs_plan(model, &x->shape)) {
        cf_shape cap = x->shape;
        if (model->planned.ndim == x->shape.ndim && model->planned.dim[0] > cap.dim[0])
            cap.dim[0] = model->planned.dim[0];
        cf_status st = plan(model, &cap);
        if (st != CF_OK) return st;
    }
    model->root->in = x;
    *y = model->root->ops->forward(model->root, x);
    return CF_OK;
}

cf_status cf_model_backward(cf_model *model, const cf_tensor *dy) {
    if (!model->root->in) return cf_fail(CF_ERR_STATE, "backward before forward");
    /* a container that does not give its children's gradients back holds them until here */
    cf_arena_give_all(&model->arena);
    model->root->ops->backward(model->root, dy, false);
    return CF_OK;
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
