/* The model zoo: fastai's create_head, the W1 mini-resnet, xresnet18/34/50, SimpleCNN and the
 * fastai's TabularModel, and the parameter-group splitters.
 *
 * Initialisation. cf_model_new initialises each module when its walk reaches it, parents before
 * children (PyTorch's state_dict order), so a module cannot re-initialise its children from its
 * own init. fastai's model-level initialisation (init_cnn, apply_init, the BatchNorm helper's
 * bias 1e-3, zeroed BatchNorm weights) therefore runs from an "init hook": a parameterless
 * pass-through module appended as the last child of the subtree it initialises. It has no
 * parameters (so no names), reserves no memory and returns its input untouched. */

#include "corefit/nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum zoo_mark_kind {
    ZOO_MARK_BN,        /* fastai's BatchNorm(): weight 1, bias 1e-3 */
    ZOO_MARK_BN_ZERO,   /* BatchNorm(norm_type=BatchZero): weight 0, bias 1e-3 */
    ZOO_MARK_CONV_RELU, /* ConvLayer's init_linear (ReLU): kaiming_uniform_, bias N(0, .01) */
    ZOO_MARK_EMBEDDING, /* fastai's Embedding: trunc_normal_(std 0.01) */
} zoo_mark_kind;

typedef enum zoo_init_pass {
    ZOO_PASS_NONE,
    ZOO_PASS_APPLY_INIT,  /* vision_learner's apply_init(head, kaiming_normal_) */
    ZOO_PASS_INIT_CNN,    /* xresnet's init_cnn */
    ZOO_PASS_TORCHVISION, /* torchvision's ResNet: conv weights kaiming_normal_(fan_out, relu) */
} zoo_init_pass;

typedef struct zoo_init_mark {
    cf_module *module;
    zoo_mark_kind kind;
} zoo_init_mark;

/* Marks are applied first (the layers' own fastai init), then the pass over the target. */
typedef struct zoo_init_hook {
    cf_module *target; /* the subtree the hook ends (not owned) */
    zoo_init_pass pass;
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

static cf_module *zoo_module_list(void) {
    return cf_module_new(&module_list_ops, NULL);
}

static cf_module *zoo_hook_new(zoo_init_pass pass) {
    zoo_init_hook *h = cf_calloc(1, sizeof *h);
    if (!h) return NULL;
    h->pass = pass;
    return cf_module_new(&hook_ops, h);
}

static bool zoo_hook_mark(cf_module *hook, cf_module *target, zoo_mark_kind kind) {
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
    h->marks[h->n_marks++] = (zoo_init_mark){.module = target, .kind = kind};
    return true;
}

static bool zoo_finish(cf_module *seq, cf_module *hook, bool ok) {
    if (!ok || !seq) {
        cf_module_free(hook);
        return false;
    }
    ((zoo_init_hook *)hook->impl)->target = seq;
    return cf_sequential_append(seq, hook) == CF_OK;
}

static void zoo_add(cf_module *seq, bool *ok, cf_module *child) {
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

static bool is_norm(const cf_module *m) {
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].kind == CF_PARAM_NORM) return true;
    return false;
}

static void apply_mark(const zoo_init_mark *mk, cf_rng *rng) {
    cf_module *m = mk->module;
    switch (mk->kind) {
    case ZOO_MARK_BN: /* fastai's BatchNorm(): weight 1, bias 1e-3 */
        fill(find_param(m, "weight"), 1.0f);
        fill(find_param(m, "bias"), 1e-3f);
        break;
    case ZOO_MARK_BN_ZERO: /* NormType.BatchZero */
        fill(find_param(m, "weight"), 0.0f);
        fill(find_param(m, "bias"), 1e-3f);
        break;
    case ZOO_MARK_CONV_RELU: { /* ConvLayer's init_linear(conv, ReLU): kaiming_uniform_ */
        kaiming_uniform(find_param(m, "weight"), rng);
        cf_param *b = find_param(m, "bias"); /* normal_(bias, 0, 0.01) */
        if (b && b->data)
            for (size_t i = 0; i < b->numel; i++) b->data[i] = (float)(0.01 * cf_rng_normal(rng));
        break;
    }
    case ZOO_MARK_EMBEDDING: { /* fastai's trunc_normal_(std=0.01): normal_().fmod_(2)*0.01 */
        cf_param *w = find_param(m, "weight");
        if (w && w->data)
            for (size_t i = 0; i < w->numel; i++)
                w->data[i] = (float)(fmod(cf_rng_normal(rng), 2.0) * 0.01);
        break;
    }
    }
}

/* apply_init(m, kaiming_normal_): every non-norm module with parameters gets kaiming_normal_
 * weights and zero biases. init_cnn: every bias 0 (BatchNorm too), conv/linear weights
 * kaiming_normal_. */
static void init_pass(cf_module *m, zoo_init_pass pass, cf_rng *rng) {
    if (pass == ZOO_PASS_APPLY_INIT && !is_norm(m)) {
        for (int i = 0; i < m->n_params; i++) {
            cf_param *p = &m->params[i];
            if (p->kind == CF_PARAM_WEIGHT && strcmp(p->name, "weight") == 0)
                kaiming_normal(p, rng);
            else if (p->kind == CF_PARAM_BIAS || strcmp(p->name, "bias") == 0)
                fill(p, 0.0f);
        }
    } else if (pass == ZOO_PASS_TORCHVISION) {
        cf_param *w = strcmp(m->ops->kind, "Conv2d") == 0 ? find_param(m, "weight") : NULL;
        if (w && w->data && w->shape.ndim == 4) { /* fan_out = out_channels * kh * kw */
            double std = sqrt(2.0 / (double)(w->numel / (size_t)w->shape.dim[1]));
            for (size_t i = 0; i < w->numel; i++) w->data[i] = (float)(std * cf_rng_normal(rng));
        }
    } else if (pass == ZOO_PASS_INIT_CNN) {
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
    if (h->target && h->pass != ZOO_PASS_NONE) init_pass(h->target, h->pass, rng);
}

/* ---- AvgPool2d(k, s, p, ceil_mode=True, count_include_pad=True) ----------------------------- */

typedef struct avgpool_impl {
    int k, s, p;
} avgpool_impl;

static int ceil_out(int n, int k, int s, int p) {
    int o = (n + 2 * p - k + s - 1) / s + 1;
    if ((o - 1) * s >= n + p) o--; /* the last window must start inside the input or left pad */
    return o;
}

static cf_status avgpool_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    avgpool_impl *a = m->impl;
    if (in->ndim != 4 || in->dim[2] + 2 * a->p < a->k || in->dim[3] + 2 * a->p < a->k) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "AvgPool2d(kernel %d, stride %d, padding %d, ceil_mode): input %s is not "
                       "(N, C, H, W) with H, W >= %d",
                       a->k, a->s, a->p, cf_shape_str(in, s, sizeof s), a->k - 2 * a->p);
    }
    *out = cf_shape4(in->dim[0], in->dim[1], ceil_out(in->dim[2], a->k, a->s, a->p),
                     ceil_out(in->dim[3], a->k, a->s, a->p));
    return CF_OK;
}

typedef struct avgpool_job {
    const avgpool_impl *a;
    int h, w, oh, ow;
    const float *src; /* forward: x; backward: dy */
    float *dst;       /* forward: y; backward: dx */
} avgpool_job;

/* Window [start, end) along one axis and PyTorch's divisor length (window clipped to the
 * padded input). */
static void window(int o, const avgpool_impl *a, int n, int *start, int *end, int *len) {
    int s0 = o * a->s - a->p;
    int e0 = s0 + a->k;
    if (e0 > n + a->p) e0 = n + a->p;
    *len = e0 - s0;
    *start = s0 < 0 ? 0 : s0;
    *end = e0 > n ? n : e0;
}

static void avgpool_fwd_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const avgpool_job *j = ctx;
    for (int64_t plane = begin; plane < end; plane++) {
        const float *x = j->src + plane * j->h * j->w;
        float *y = j->dst + plane * j->oh * j->ow;
        for (int oy = 0; oy < j->oh; oy++) {
            int y0, y1, ly;
            window(oy, j->a, j->h, &y0, &y1, &ly);
            for (int ox = 0; ox < j->ow; ox++) {
                int x0, x1, lx;
                window(ox, j->a, j->w, &x0, &x1, &lx);
                float sum = 0.0f;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) sum += x[iy * j->w + ix];
                y[oy * j->ow + ox] = sum / (float)(ly * lx);
            }
        }
    }
}

static void avgpool_bwd_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const avgpool_job *j = ctx;
    for (int64_t plane = begin; plane < end; plane++) {
        const float *dy = j->src + plane * j->oh * j->ow;
        float *dx = j->dst + plane * j->h * j->w;
        memset(dx, 0, (size_t)j->h * (size_t)j->w * sizeof(float));
        for (int oy = 0; oy < j->oh; oy++) {
            int y0, y1, ly;
            window(oy, j->a, j->h, &y0, &y1, &ly);
            for (int ox = 0; ox < j->ow; ox++) {
                int x0, x1, lx;
                window(ox, j->a, j->w, &x0, &x1, &lx);
                float g = dy[oy * j->ow + ox] / (float)(ly * lx);
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) dx[iy * j->w + ix] += g;
            }
        }
    }
}

static const cf_tensor *avgpool_forward(cf_module *m, const cf_tensor *x) {
    m->in = x;
    cf_shape os;
    avgpool_out_shape(m, &x->shape, &os); /* checked when the model was planned */
    cf_tensor *y = cf_module_output(m, &os);
    avgpool_job j = {m->impl,   x->shape.dim[2], x->shape.dim[3], os.dim[2],
                     os.dim[3], x->data,         y->data};
    cf_parallel_for((int64_t)x->shape.dim[0] * x->shape.dim[1], avgpool_fwd_range, &j);
    return y;
}

static const cf_tensor *avgpool_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m);
    avgpool_job j = {m->impl,          dx->shape.dim[2], dx->shape.dim[3], dy->shape.dim[2],
                     dy->shape.dim[3], dy->data,         dx->data};
    cf_parallel_for((int64_t)dx->shape.dim[0] * dx->shape.dim[1], avgpool_bwd_range, &j);
    return dx;
}

static const cf_module_ops avgpool_ceil_ops = {
    .kind = "AvgPool2d",
    .out_shape = avgpool_out_shape,
    .forward = avgpool_forward,
    .backward = avgpool_backward,
};

static cf_module *zoo_avgpool2d_ceil(int kernel, int stride, int padding) {
    if (kernel < 1 || stride < 1 || padding < 0 || 2 * padding > kernel) {
        cf_fail(CF_ERR_INVALID, "AvgPool2d: kernel %d, stride %d, padding %d", kernel, stride,
                padding);
        return NULL;
    }
    avgpool_impl *a = cf_calloc(1, sizeof *a);
    if (!a) return NULL;
    *a = (avgpool_impl){kernel, stride, padding};
    return cf_module_new(&avgpool_ceil_ops, a);
}

/* ---- SigmoidRange(lo, hi): lo + (hi - lo) * sigmoid(x) -------------------------------------- */

typedef struct sigrange_impl {
    float lo, hi;
} sigrange_impl;

static const cf_tensor *sigrange_forward(cf_module *m, const cf_tensor *x) {
    sigrange_impl *r = m->impl;
    m->in = x;
    cf_tensor *y = cf_module_output(m, &x->shape);
    size_t n = cf_tensor_numel(x);
    for (size_t i = 0; i < n; i++)
        y->data[i] = r->lo + (r->hi - r->lo) / (1.0f + expf(-x->data[i]));
    return y;
}

static const cf_tensor *sigrange_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    sigrange_impl *r = m->impl;
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m);
    size_t n = cf_tensor_numel(dy);
    for (size_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-m->in->data[i]));
        dx->data[i] = dy->data[i] * (r->hi - r->lo) * s * (1.0f - s);
    }
    return dx;
}

static const cf_module_ops sigrange_ops = {
    .kind = "SigmoidRange",
    .out_shape = pass_out_shape,
    .forward = sigrange_forward,
    .backward = sigrange_backward,
};

static cf_module *zoo_sigmoid_range(float lo, float hi) {
    if (!(hi > lo)) {
        cf_fail(CF_ERR_INVALID, "SigmoidRange: y_range (%g, %g) needs low < high", lo, hi);
        return NULL;
    }
    sigrange_impl *r = cf_calloc(1, sizeof *r);
    if (!r) return NULL;
    *r = (sigrange_impl){lo, hi};
    return cf_module_new(&sigrange_ops, r);
}

/* ---- create_head --------------------------------------------------------------------------- */

cf_head_opts cf_head_defaults(void) {
    return (cf_head_opts){
        .n_lin_ftrs = 1,
        .lin_ftrs = {512},
        .n_ps = 1,
        .ps = {0.5f},
        .pool = true,
        .concat_pool = true,
        .first_bn = true,
        .bn_final = false,
        .lin_first = false,
        .y_range = false,
        .init = true,
    };
}

/* LinBnDrop(n_in, n_out, bn, p, act, lin_first) appended flat to seq (fastai's `layers +=`). */
static void lin_bn_drop(cf_module *seq, cf_module *hook, bool *ok, int n_in, int n_out, bool bn,
                        float p, bool act, bool lin_first) {
    cf_module *bn_m = NULL, *drop = NULL;
    if (bn) {
        bn_m = cf_batchnorm1d(lin_first ? n_out : n_in);
        if (!bn_m || !zoo_hook_mark(hook, bn_m, ZOO_MARK_BN)) *ok = false;
    }
    if (p != 0.0f && !(drop = cf_dropout(p))) *ok = false;
    cf_module *lin = cf_linear(n_in, n_out, !bn);
    cf_module *relu = act ? cf_relu() : NULL;
    if (!lin || (act && !relu)) *ok = false;
    if (lin_first) {
        zoo_add(seq, ok, lin);
        if (act) zoo_add(seq, ok, relu);
        if (bn) zoo_add(seq, ok, bn_m);
        if (drop) zoo_add(seq, ok, drop);
    } else {
        if (bn) zoo_add(seq, ok, bn_m);
        if (drop) zoo_add(seq, ok, drop);
        zoo_add(seq, ok, lin);
        if (act) zoo_add(seq, ok, relu);
    }
}

cf_module *cf_create_head(int nf, int n_out, const cf_head_opts *opts) {
    cf_head_opts o = opts ? *opts : cf_head_defaults();
    if (nf < 1 || n_out < 1)
        return cf_fail(CF_ERR_INVALID, "create_head: nf %d and n_out %d must be positive", nf,
                       n_out),
               NULL;
    if (o.n_lin_ftrs < 0 || o.n_lin_ftrs > CF_HEAD_MAX_LAYERS)
        return cf_fail(CF_ERR_INVALID, "create_head: %d hidden layers (0..%d)", o.n_lin_ftrs,
                       CF_HEAD_MAX_LAYERS),
               NULL;
    int n_blocks = o.n_lin_ftrs + 1; /* len(lin_ftrs) - 1 */
    if (o.n_ps != 1 && o.n_ps != n_blocks)
        return cf_fail(CF_ERR_INVALID,
                       "create_head: %d dropout values for %d blocks (give 1 or %d)", o.n_ps,
                       n_blocks, n_blocks),
               NULL;
    int sizes[CF_HEAD_MAX_LAYERS + 2];
    float ps[CF_HEAD_MAX_LAYERS + 1];
    sizes[0] = o.pool && o.concat_pool ? 2 * nf : nf;
    for (int i = 0; i < o.n_lin_ftrs; i++) {
        if (o.lin_ftrs[i] < 1)
            return cf_fail(CF_ERR_INVALID, "create_head: lin_ftrs[%d] = %d", i, o.lin_ftrs[i]),
                   NULL;
        sizes[i + 1] = o.lin_ftrs[i];
    }
    sizes[n_blocks] = n_out;
    for (int i = 0; i < n_blocks; i++) {
        ps[i] = o.n_ps == 1 ? (i < n_blocks - 1 ? o.ps[0] / 2 : o.ps[0]) : o.ps[i];
        if (!(ps[i] >= 0.0f && ps[i] < 1.0f))
            return cf_fail(CF_ERR_INVALID, "create_head: dropout p %g for block %d not in [0, 1)",
                           ps[i], i),
                   NULL;
    }
    bool ok = true;
    cf_module *seq = cf_sequential(0, NULL);
    cf_module *hook = zoo_hook_new(o.init ? ZOO_PASS_APPLY_INIT : ZOO_PASS_NONE);
    if (!seq || !hook) ok = false;
    if (o.pool) {
        zoo_add(seq, &ok,
                o.concat_pool ? cf_adaptive_concat_pool2d() : cf_adaptive_avgpool2d(1, 1));
        zoo_add(seq, &ok, cf_flatten());
    }
    int first_p = 0;
    if (o.lin_first) zoo_add(seq, &ok, cf_dropout(ps[first_p++])); /* ps.pop(0) */
    /* zip(lin_ftrs[:-1], lin_ftrs[1:], bns, ps, actns): as many blocks as ps values left */
    int n_zip = n_blocks - first_p;
    for (int i = 0; i < n_zip && ok; i++)
        lin_bn_drop(seq, hook, &ok, sizes[i], sizes[i + 1], i == 0 ? o.first_bn : true,
                    ps[first_p + i], i < n_blocks - 1, o.lin_first);
    if (o.lin_first) zoo_add(seq, &ok, cf_linear(sizes[n_blocks - 1], n_out, true));
    if (o.bn_final) zoo_add(seq, &ok, cf_batchnorm_ex(n_out, false, 1e-5f, 0.01f));
    if (o.y_range) zoo_add(seq, &ok, zoo_sigmoid_range(o.y_lo, o.y_hi));
    if (!zoo_finish(seq, hook, ok)) {
        cf_module_free(seq);
        cf_fail_context(CF_ERR_INVALID, "create_head(nf %d, n_out %d)", nf, n_out);
        return NULL;
    }
    return seq;
}

/* ---- W1: mini-resnet ----------------------------------------------------------------------- */

static cf_module *mini_block(int ni, int nf) {
    bool ok = true;
    cf_module *conv = cf_sequential(0, NULL), *id = cf_sequential(0, NULL);
    if (!conv || !id) ok = false;
    zoo_add(conv, &ok, cf_conv2d(ni, nf, 3, 2, 1, false));
    zoo_add(conv, &ok, cf_batchnorm2d(nf));
    zoo_add(conv, &ok, cf_relu());
    zoo_add(conv, &ok, cf_conv2d(nf, nf, 3, 1, 1, false));
    zoo_add(conv, &ok, cf_batchnorm2d(nf));
    zoo_add(id, &ok, cf_conv2d(ni, nf, 1, 2, 0, false));
    zoo_add(id, &ok, cf_batchnorm2d(nf));
    if (!ok) {
        cf_module_free(conv);
        cf_module_free(id);
        return NULL;
    }
    return cf_residual(conv, id, true);
}

cf_module *cf_mini_resnet_body(int c_in) {
    if (c_in < 1) return cf_fail(CF_ERR_INVALID, "mini-resnet: c_in %d", c_in), NULL;
    bool ok = true;
    cf_module *body = cf_sequential(0, NULL);
    zoo_add(body, &ok, cf_conv2d(c_in, 16, 3, 1, 1, false));
    zoo_add(body, &ok, cf_batchnorm2d(16));
    zoo_add(body, &ok, cf_relu());
    zoo_add(body, &ok, mini_block(16, 32));
    zoo_add(body, &ok, mini_block(32, 64));
    if (!ok) {
        cf_module_free(body);
        cf_fail_context(CF_ERR_INVALID, "mini-resnet body");
        return NULL;
    }
    return body;
}

static cf_module *body_head(cf_module *body, cf_module *head) {
    if (!body || !head) {
        cf_module_free(body);
        cf_module_free(head);
        return NULL;
    }
    cf_module *parts[2] = {body, head};
    return cf_sequential(2, parts);
}

cf_module *cf_mini_resnet_ex(int c_in, int n_out, const cf_head_opts *head) {
    return body_head(cf_mini_resnet_body(c_in), cf_create_head(64, n_out, head));
}

cf_module *cf_mini_resnet(int c_in, int n_out) {
    cf_head_opts h = cf_head_defaults();
    h.n_lin_ftrs = 1;
    h.lin_ftrs[0] = 256;
    h.n_ps = 2;
    h.ps[0] = 0.25f;
    h.ps[1] = 0.5f;
    return cf_mini_resnet_ex(c_in, n_out, &h);
}

/* ---- xresnet ------------------------------------------------------------------------------- */

cf_xresnet_opts cf_xresnet_defaults(void) {
    return (cf_xresnet_opts){.c_in = 3, .small_images = false, .head = cf_head_defaults()};
}

/* fastai's ConvLayer(ni, nf, ks, stride) with BatchNorm: Sequential(Conv2d(no bias),
 * BatchNorm2d, [ReLU]); zero_bn: NormType.BatchZero. */
static cf_module *conv_layer(cf_module *hook, int ni, int nf, int ks, int stride, bool act,
                             bool zero_bn) {
    bool ok = true;
    cf_module *seq = cf_sequential(0, NULL);
    cf_module *conv = cf_conv2d(ni, nf, ks, stride, (ks - 1) / 2, false);
    cf_module *bn = cf_batchnorm2d(nf);
    if (!conv || !bn || !zoo_hook_mark(hook, bn, zero_bn ? ZOO_MARK_BN_ZERO : ZOO_MARK_BN))
        ok = false;
    zoo_add(seq, &ok, conv);
    zoo_add(seq, &ok, bn);
    if (act) zoo_add(seq, &ok, cf_relu());
    if (!ok) {
        cf_module_free(seq);
        return NULL;
    }
    return seq;
}

/* fastai's ResBlock(expansion, ni, nf, stride) with the default options. */
static cf_module *res_block(cf_module *hook, int expansion, int ni, int nf, int stride) {
    int nh = nf;
    nf *= expansion;
    ni *= expansion;
    bool ok = true;
    cf_module *conv = cf_sequential(0, NULL);
    if (expansion == 1) {
        zoo_add(conv, &ok, conv_layer(hook, ni, nh, 3, stride, true, false));
        zoo_add(conv, &ok, conv_layer(hook, nh, nf, 3, 1, false, true));
    } else {
        zoo_add(conv, &ok, conv_layer(hook, ni, nh, 1, 1, true, false));
        zoo_add(conv, &ok, conv_layer(hook, nh, nh, 3, stride, true, false));
        zoo_add(conv, &ok, conv_layer(hook, nh, nf, 1, 1, false, true));
    }
    cf_module *id = NULL;
    if (ni != nf || stride != 1) {
        id = cf_sequential(0, NULL);
        if (stride != 1) zoo_add(id, &ok, zoo_avgpool2d_ceil(stride, stride, 0));
        if (ni != nf) zoo_add(id, &ok, conv_layer(hook, ni, nf, 1, 1, false, false));
    }
    if (!ok) {
        cf_module_free(conv);
        cf_module_free(id);
        return NULL;
    }
    return cf_residual(conv, id, true);
}

static bool xresnet_layout(int depth, int *expansion, int layers[4]) {
    static const int l18[4] = {2, 2, 2, 2}, l34[4] = {3, 4, 6, 3};
    switch (depth) {
    case 18:
        *expansion = 1;
        memcpy(layers, l18, sizeof l18);
        return true;
    case 34:
        *expansion = 1;
        memcpy(layers, l34, sizeof l34);
        return true;
    case 50:
        *expansion = 4;
        memcpy(layers, l34, sizeof l34);
        return true;
    default:
        return false;
    }
}

int cf_xresnet_nf(int depth) {
    int e, l[4];
    return xresnet_layout(depth, &e, l) ? 512 * e : 0;
}

cf_module *cf_xresnet_body(int depth, const cf_xresnet_opts *opts) {
    cf_xresnet_opts o = opts ? *opts : cf_xresnet_defaults();
    int expansion, layers[4];
    if (!xresnet_layout(depth, &expansion, layers))
        return cf_fail(CF_ERR_INVALID, "xresnet: depth %d (18, 34 or 50)", depth), NULL;
    if (o.c_in < 1) return cf_fail(CF_ERR_INVALID, "xresnet: c_in %d", o.c_in), NULL;
    bool ok = true;
    cf_module *body = cf_sequential(0, NULL);
    cf_module *hook = zoo_hook_new(ZOO_PASS_INIT_CNN);
    if (!body || !hook) ok = false;
    const int stem[4] = {o.c_in, 32, 32, 64};
    for (int i = 0; i < 3 && ok; i++)
        zoo_add(body, &ok,
                conv_layer(hook, stem[i], stem[i + 1], 3, i == 0 && !o.small_images ? 2 : 1, true,
                           false));
    zoo_add(body, &ok, cf_maxpool2d(3, 2, 1));
    const int szs[5] = {64 / expansion, 64, 128, 256, 512};
    for (int s = 0; s < 4 && ok; s++) {
        cf_module *stage = cf_sequential(0, NULL);
        bool sok = stage != NULL;
        for (int b = 0; b < layers[s] && sok; b++)
            zoo_add(stage, &sok,
                    res_block(hook, expansion, b == 0 ? szs[s] : szs[s + 1], szs[s + 1],
                              b == 0 && s > 0 ? 2 : 1));
        if (!sok) {
            cf_module_free(stage);
            stage = NULL;
        }
        zoo_add(body, &ok, stage);
    }
    if (!zoo_finish(body, hook, ok)) {
        cf_module_free(body);
        cf_fail_context(CF_ERR_INVALID, "xresnet%d body", depth);
        return NULL;
    }
    return body;
}

cf_module *cf_xresnet(int depth, int n_out, const cf_xresnet_opts *opts) {
    cf_xresnet_opts o = opts ? *opts : cf_xresnet_defaults();
    if (!cf_xresnet_nf(depth))
        return cf_fail(CF_ERR_INVALID, "xresnet: depth %d (18, 34 or 50)", depth), NULL;
    return body_head(cf_xresnet_body(depth, &o),
                     cf_create_head(cf_xresnet_nf(depth), n_out, &o.head));
}

static cf_module *xresnet_plain(int depth, int c_in, int n_out) {
    cf_xresnet_opts o = cf_xresnet_defaults();
    o.c_in = c_in;
    return cf_xresnet(depth, n_out, &o);
}

cf_module *cf_xresnet18(int c_in, int n_out) {
    return xresnet_plain(18, c_in, n_out);
}
cf_module *cf_xresnet34(int c_in, int n_out) {
    return xresnet_plain(34, c_in, n_out);
}
cf_module *cf_xresnet50(int c_in, int n_out) {
    return xresnet_plain(50, c_in, n_out);
}

cf_module *cf_vision_model(const char *arch, int c_in, int n_out) {
    if (!arch) return cf_fail(CF_ERR_INVALID, "vision model: no architecture name"), NULL;
    if (strcmp(arch, "mini-resnet") == 0) return cf_mini_resnet(c_in, n_out);
    static const int depths[3] = {18, 34, 50};
    for (int i = 0; i < 3; i++) {
        char plain[32], small[32];
        snprintf(plain, sizeof plain, "xresnet%d", depths[i]);
        snprintf(small, sizeof small, "xresnet%d-small", depths[i]);
        bool is_small = strcmp(arch, small) == 0;
        if (is_small || strcmp(arch, plain) == 0) {
            cf_xresnet_opts o = cf_xresnet_defaults();
            o.c_in = c_in;
            o.small_images = is_small;
            return cf_xresnet(depths[i], n_out, &o);
        }
    }
    int depth = 0;
    char tail = 0;
    if (sscanf(arch, "resnet%d%c", &depth, &tail) == 1 && cf_resnet_nf(depth))
        return cf_resnet_learner_model(depth, c_in, n_out, NULL);
    return cf_fail(CF_ERR_INVALID,
                   "unknown architecture '%s' (mini-resnet, xresnet18, xresnet34, xresnet50, "
                   "xresnetNN-small, resnet18, resnet34, resnet50, resnet101 or resnet152)",
                   arch),
           NULL;
}

/* ---- torchvision's ResNet ------------------------------------------------------------------ *
 * A block is cf_residual(main path, downsample, ReLU after the add) whose main path is a
 * Sequential of conv1, bn1, relu, conv2, bn2 (Bottleneck: ..., relu, conv3, bn3) joined under
 * an empty name, so the names are torchvision's: "layer1.0.conv1.weight",
 * "layer2.0.downsample.0.weight". */

static bool resnet_layout(int depth, bool *bottleneck, int layers[4]) {
    static const struct {
        int depth, bottleneck, layers[4];
    } table[] = {{18, 0, {2, 2, 2, 2}},
                 {34, 0, {3, 4, 6, 3}},
                 {50, 1, {3, 4, 6, 3}},
                 {101, 1, {3, 4, 23, 3}},
                 {152, 1, {3, 8, 36, 3}}};
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (table[i].depth == depth) {
            *bottleneck = table[i].bottleneck;
            memcpy(layers, table[i].layers, sizeof table[i].layers);
            return true;
        }
    return false;
}

int cf_resnet_nf(int depth) {
    bool bottleneck;
    int layers[4];
    return resnet_layout(depth, &bottleneck, layers) ? (bottleneck ? 2048 : 512) : 0;
}

static void named_add(cf_module *parent, bool *ok, const char *name, cf_module *child) {
    if (!*ok || !parent || !child) {
        cf_module_free(child);
        *ok = false;
        return;
    }
    if (cf_module_add_child(parent, child, name) != CF_OK) *ok = false;
}

static bool rename_child(cf_module *m, int i, const char *name) {
    char *copy = cf_strdup(name);
    if (!copy) return false;
    cf_free(m->child_names[i]);
    m->child_names[i] = copy;
    return true;
}

/* BasicBlock / Bottleneck (torchvision >= 0.4: the stride on the 3x3 conv). */
static cf_module *tv_block(int inplanes, int planes, int stride, bool bottleneck) {
    const int out = bottleneck ? 4 * planes : planes;
    bool ok = true;
    cf_module *main = cf_sequential(0, NULL);
    if (bottleneck) {
        named_add(main, &ok, "conv1", cf_conv2d(inplanes, planes, 1, 1, 0, false));
        named_add(main, &ok, "bn1", cf_batchnorm2d(planes));
        named_add(main, &ok, "relu", cf_relu());
        named_add(main, &ok, "conv2", cf_conv2d(planes, planes, 3, stride, 1, false));
        named_add(main, &ok, "bn2", cf_batchnorm2d(planes));
        named_add(main, &ok, "relu", cf_relu());
        named_add(main, &ok, "conv3", cf_conv2d(planes, out, 1, 1, 0, false));
        named_add(main, &ok, "bn3", cf_batchnorm2d(out));
    } else {
        named_add(main, &ok, "conv1", cf_conv2d(inplanes, planes, 3, stride, 1, false));
        named_add(main, &ok, "bn1", cf_batchnorm2d(planes));
        named_add(main, &ok, "relu", cf_relu());
        named_add(main, &ok, "conv2", cf_conv2d(planes, planes, 3, 1, 1, false));
        named_add(main, &ok, "bn2", cf_batchnorm2d(planes));
    }
    cf_module *down = NULL;
    if (stride != 1 || inplanes != out) {
        down = cf_sequential(0, NULL);
        zoo_add(down, &ok, cf_conv2d(inplanes, out, 1, stride, 0, false));
        zoo_add(down, &ok, cf_batchnorm2d(out));
    }
    if (!ok) {
        cf_module_free(main);
        cf_module_free(down);
        return NULL;
    }
    cf_module *block = cf_residual(main, down, true);
    if (block && (!rename_child(block, 0, "") || (down && !rename_child(block, 1, "downsample")))) {
        cf_module_free(block);
        return NULL;
    }
    return block;
}

/* The stem and the four stages, appended to seq (names from `names`, or "0".."7"). */
static void resnet_features(cf_module *seq, bool *ok, int depth, int c_in, bool named) {
    bool bottleneck = false;
    int layers[4] = {0};
    resnet_layout(depth, &bottleneck, layers);
    static const char *const names[8] = {"conv1",  "bn1",    "relu",   "maxpool",
                                         "layer1", "layer2", "layer3", "layer4"};
    cf_module *stem[4] = {cf_conv2d(c_in, 64, 7, 2, 3, false), cf_batchnorm2d(64), cf_relu(),
                          cf_maxpool2d(3, 2, 1)};
    int next = 0;
    for (int i = 0; i < 4; i++, next++) {
        if (named)
            named_add(seq, ok, names[next], stem[i]);
        else
            zoo_add(seq, ok, stem[i]);
    }
    int inplanes = 64;
    for (int s = 0; s < 4; s++, next++) {
        int planes = 64 << s;
        cf_module *stage = cf_sequential(0, NULL);
        bool sok = stage != NULL;
        for (int b = 0; b < layers[s] && sok; b++) {
            zoo_add(stage, &sok, tv_block(inplanes, planes, b == 0 && s > 0 ? 2 : 1, bottleneck));
            inplanes = bottleneck ? 4 * planes : planes;
        }
        if (!sok) {
            cf_module_free(stage);
            stage = NULL;
        }
        if (named)
            named_add(seq, ok, names[next], stage);
        else
            zoo_add(seq, ok, stage);
    }
}

static bool resnet_args(int depth, int c_in, const char *what) {
    if (!cf_resnet_nf(depth))
        return cf_fail(CF_ERR_INVALID, "%s: depth %d (18, 34, 50, 101 or 152)", what, depth), false;
    if (c_in < 1) return cf_fail(CF_ERR_INVALID, "%s: c_in %d", what, c_in), false;
    return true;
}

cf_module *cf_resnet(int depth, int c_in, int num_classes) {
    if (!resnet_args(depth, c_in, "resnet")) return NULL;
    if (num_classes < 1)
        return cf_fail(CF_ERR_INVALID, "resnet: num_classes %d", num_classes), NULL;
    bool ok = true;
    cf_module *model = cf_sequential(0, NULL);
    cf_module *hook = zoo_hook_new(ZOO_PASS_TORCHVISION);
    if (!model || !hook) ok = false;
    resnet_features(model, &ok, depth, c_in, true);
    named_add(model, &ok, "avgpool", cf_adaptive_avgpool2d(1, 1));
    named_add(model, &ok, "flatten", cf_flatten());
    named_add(model, &ok, "fc", cf_linear(cf_resnet_nf(depth), num_classes, true));
    if (!zoo_finish(model, hook, ok)) {
        cf_module_free(model);
        cf_fail_context(CF_ERR_INVALID, "resnet%d", depth);
        return NULL;
    }
    return model;
}

cf_module *cf_resnet_body(int depth, int c_in) {
    if (!resnet_args(depth, c_in, "resnet body")) return NULL;
    bool ok = true;
    cf_module *body = cf_sequential(0, NULL);
    cf_module *hook = zoo_hook_new(ZOO_PASS_TORCHVISION);
    if (!body || !hook) ok = false;
    resnet_features(body, &ok, depth, c_in, false);
    if (!zoo_finish(body, hook, ok)) {
        cf_module_free(body);
        cf_fail_context(CF_ERR_INVALID, "resnet%d body", depth);
        return NULL;
    }
    return body;
}

cf_module *cf_resnet_learner_model(int depth, int c_in, int n_out, const cf_head_opts *head) {
    if (!resnet_args(depth, c_in, "resnet")) return NULL;
    return body_head(cf_resnet_body(depth, c_in), cf_create_head(cf_resnet_nf(depth), n_out, head));
}

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

/* ---- SimpleCNN ----------------------------------------------------------------------------- */

cf_module *cf_simple_cnn(int n_filters, const int *filters, const int *kernel_szs,
                         const int *strides, bool bn) {
    if (n_filters < 2 || !filters)
        return cf_fail(CF_ERR_INVALID, "simple_cnn: needs at least 2 filter sizes, got %d",
                       n_filters),
               NULL;
    int nl = n_filters - 1;
    bool ok = true;
    cf_module *seq = cf_sequential(0, NULL);
    cf_module *hook = zoo_hook_new(ZOO_PASS_NONE);
    if (!seq || !hook) ok = false;
    for (int i = 0; i < nl && ok; i++) {
        int ks = kernel_szs ? kernel_szs[i] : 3, st = strides ? strides[i] : 2;
        bool with_bn = bn && i < nl - 1;
        if (ks < 1 || st < 1 || filters[i] < 1 || filters[i + 1] < 1) {
            cf_fail(CF_ERR_INVALID, "simple_cnn: layer %d: %d -> %d, kernel %d, stride %d", i,
                    filters[i], filters[i + 1], ks, st);
            ok = false;
            break;
        }
        cf_module *layer = cf_sequential(0, NULL);
        bool lok = layer != NULL;
        cf_module *conv = cf_conv2d(filters[i], filters[i + 1], ks, st, (ks - 1) / 2, !with_bn);
        if (!conv || !zoo_hook_mark(hook, conv, ZOO_MARK_CONV_RELU)) lok = false;
        zoo_add(layer, &lok, conv);
        if (with_bn) {
            cf_module *b = cf_batchnorm2d(filters[i + 1]);
            if (!b || !zoo_hook_mark(hook, b, ZOO_MARK_BN)) lok = false;
            zoo_add(layer, &lok, b);
        }
        zoo_add(layer, &lok, cf_relu());
        if (!lok) {
            cf_module_free(layer);
            layer = NULL;
        }
        zoo_add(seq, &ok, layer);
    }
    cf_module *pf = NULL;
    if (ok) {
        cf_module *parts[2] = {cf_adaptive_avgpool2d(1, 1), cf_flatten()};
        if (!parts[0] || !parts[1]) {
            cf_module_free(parts[0]);
            cf_module_free(parts[1]);
        } else {
            pf = cf_sequential(2, parts);
        }
    }
    zoo_add(seq, &ok, pf);
    if (!zoo_finish(seq, hook, ok)) {
        cf_module_free(seq);
        cf_fail_context(CF_ERR_INVALID, "simple_cnn");
        return NULL;
    }
    return seq;
}

/* ---- TabularModel -------------------------------------------------------------------------- */

/* Children: "embeds" (ModuleList of Embedding), "emb_drop" (Dropout), "bn_cont" (BatchNorm1d,
 * when there are continuous columns and bn_cont), "layers" (Sequential of LinBnDrop blocks),
 * and the init hook. The input (N, n_cat + n_cont) is split here: column i feeds embeds.i. */
typedef struct tabular_impl {
    int n_cat, n_cont, n_emb, max_dim;
    int *dims; /* n_cat embedding sizes */
    cf_module *embeds, *emb_drop, *bn_cont, *layers;
    cf_tensor *codes; /* n_cat views (N): the code columns */
    /* arena memory; the tensors live here because layers keep a pointer to their input */
    cf_tensor emb, cont, feat, g_emb, g_slice, g_cont;
} tabular_impl;

static void tabular_destroy(cf_module *m) {
    tabular_impl *t = m->impl;
    if (!t) return;
    cf_free(t->dims);
    cf_free(t->codes);
}

static cf_status child_out_shape(cf_module *c, const cf_shape *in, cf_shape *out) {
    return c->ops->out_shape(c, in, out);
}

static void child_plan(cf_module *c, const cf_shape *in, cf_arena *arena) {
    if (c->ops->plan)
        c->ops->plan(c, in, arena);
    else
        cf_module_plan_default(c, in, arena);
}

static cf_status tabular_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    tabular_impl *t = m->impl;
    int f = t->n_cat + t->n_cont;
    if (in->ndim != 2 || in->dim[1] != f) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "TabularModel: input %s is not (N, %d) (%d category codes, then %d "
                       "continuous values)",
                       cf_shape_str(in, s, sizeof s), f, t->n_cat, t->n_cont);
    }
    cf_shape feat = cf_shape2(in->dim[0], t->n_emb + t->n_cont);
    cf_status st = child_out_shape(t->layers, &feat, out);
    return st == CF_OK ? CF_OK : cf_fail_context(st, "in TabularModel layers");
}

static void tabular_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    tabular_impl *t = m->impl;
    int n = in->dim[0];
    size_t un = (size_t)n;
    cf_shape codes = cf_shape1(n);
    for (int i = 0; i < t->n_cat; i++) {
        child_plan(t->embeds->children[i], &codes, arena);
        t->codes[i].data = cf_arena_floats(arena, un);
        t->codes[i].shape = codes;
    }
    if (t->n_emb) {
        cf_shape es = cf_shape2(n, t->n_emb);
        child_plan(t->emb_drop, &es, arena);
        t->emb.data = cf_arena_floats(arena, un * (size_t)t->n_emb);
        t->g_emb.data = cf_arena_floats(arena, un * (size_t)t->n_emb);
        t->g_slice.data = cf_arena_floats(arena, un * (size_t)t->max_dim);
    }
    if (t->n_cont) {
        cf_shape cs = cf_shape2(n, t->n_cont);
        if (t->bn_cont) child_plan(t->bn_cont, &cs, arena);
        t->cont.data = cf_arena_floats(arena, un * (size_t)t->n_cont);
        t->g_cont.data = cf_arena_floats(arena, un * (size_t)t->n_cont);
    }
    cf_shape fs = cf_shape2(n, t->n_emb + t->n_cont);
    child_plan(t->layers, &fs, arena);
    t->feat.data = cf_arena_floats(arena, un * (size_t)(t->n_emb + t->n_cont));
    m->dx.data = cf_arena_floats(arena, cf_shape_numel(in));
    m->dx.shape = *in;
}

static const cf_tensor *run_forward(cf_module *c, const cf_tensor *x) {
    c->in = x;
    return c->ops->forward(c, x);
}

/* Copies columns [src_off, src_off + w) of an (n, src_cols) matrix into columns
 * [dst_off, dst_off + w) of an (n, dst_cols) one. */
static void copy_cols(float *dst, int dst_cols, int dst_off, const float *src, int src_cols,
                      int src_off, int n, int w) {
    for (int r = 0; r < n; r++)
        memcpy(dst + (size_t)r * dst_cols + dst_off, src + (size_t)r * src_cols + src_off,
               (size_t)w * sizeof(float));
}

static const cf_tensor *tabular_forward(cf_module *m, const cf_tensor *x) {
    tabular_impl *t = m->impl;
    m->in = x;
    int n = x->shape.dim[0], f = t->n_cat + t->n_cont, nf = t->n_emb + t->n_cont;
    t->feat.shape = cf_shape2(n, nf);
    if (t->n_emb) {
        t->emb.shape = cf_shape2(n, t->n_emb);
        for (int i = 0, off = 0; i < t->n_cat; off += t->dims[i], i++) {
            cf_tensor *c = &t->codes[i];
            c->shape = cf_shape1(n);
            for (int r = 0; r < n; r++) c->data[r] = x->data[(size_t)r * f + i];
            const cf_tensor *e = run_forward(t->embeds->children[i], c);
            copy_cols(t->emb.data, t->n_emb, off, e->data, t->dims[i], 0, n, t->dims[i]);
        }
        const cf_tensor *de = run_forward(t->emb_drop, &t->emb);
        copy_cols(t->feat.data, nf, 0, de->data, t->n_emb, 0, n, t->n_emb);
    }
    if (t->n_cont) {
        t->cont.shape = cf_shape2(n, t->n_cont);
        copy_cols(t->cont.data, t->n_cont, 0, x->data, f, t->n_cat, n, t->n_cont);
        const cf_tensor *c = t->bn_cont ? run_forward(t->bn_cont, &t->cont) : &t->cont;
        copy_cols(t->feat.data, nf, t->n_emb, c->data, t->n_cont, 0, n, t->n_cont);
    }
    return run_forward(t->layers, &t->feat);
}

static const cf_tensor *tabular_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    tabular_impl *t = m->impl;
    int n = dy->shape.dim[0], f = t->n_cat + t->n_cont, nf = t->n_emb + t->n_cont;
    const cf_tensor *g = t->layers->ops->backward(t->layers, dy, true);
    if (t->n_emb) {
        t->g_emb.shape = cf_shape2(n, t->n_emb);
        copy_cols(t->g_emb.data, t->n_emb, 0, g->data, nf, 0, n, t->n_emb);
        const cf_tensor *gd = t->emb_drop->ops->backward(t->emb_drop, &t->g_emb, true);
        for (int i = 0, off = 0; i < t->n_cat; off += t->dims[i], i++) {
            int d = t->dims[i];
            t->g_slice.shape = cf_shape2(n, d);
            copy_cols(t->g_slice.data, d, 0, gd->data, t->n_emb, off, n, d);
            cf_module *e = t->embeds->children[i];
            e->ops->backward(e, &t->g_slice, false);
        }
    }
    const cf_tensor *gc = NULL;
    if (t->n_cont) {
        t->g_cont.shape = cf_shape2(n, t->n_cont);
        copy_cols(t->g_cont.data, t->n_cont, 0, g->data, nf, t->n_emb, n, t->n_cont);
        gc = t->bn_cont ? t->bn_cont->ops->backward(t->bn_cont, &t->g_cont, need_dx) : &t->g_cont;
    }
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m);
    for (int r = 0; r < n; r++)
        memset(dx->data + (size_t)r * f, 0, (size_t)t->n_cat * sizeof(float));
    if (gc) copy_cols(dx->data, f, t->n_cat, gc->data, t->n_cont, 0, n, t->n_cont);
    return dx;
}

static const cf_module_ops tabular_ops = {
    .kind = "TabularModel",
    .out_shape = tabular_out_shape,
    .plan = tabular_plan,
    .forward = tabular_forward,
    .backward = tabular_backward,
    .destroy = tabular_destroy,
};

cf_tabular_opts cf_tabular_defaults(void) {
    return (cf_tabular_opts){
        .n_layers = 2,
        .layers = {200, 100},
        .n_ps = 0,
        .embed_p = 0.0f,
        .use_bn = true,
        .bn_final = false,
        .bn_cont = true,
        .lin_first = true,
        .y_range = false,
    };
}

int cf_emb_sz_rule(int n_cat) {
    double v = rint(1.6 * pow((double)n_cat, 0.56)); /* Python's round: half to even */
    return v > 600.0 ? 600 : (int)v;
}

cf_module *cf_tabular_model(int n_cat, const int *cardinalities, const int *emb_dims, int n_cont,
                            int out_sz, const cf_tabular_opts *opts) {
    cf_tabular_opts o = opts ? *opts : cf_tabular_defaults();
    if (n_cat < 0 || n_cont < 0 || n_cat + n_cont < 1 || out_sz < 1 ||
        (n_cat > 0 && !cardinalities))
        return cf_fail(CF_ERR_INVALID,
                       "TabularModel: %d categorical and %d continuous columns, %d outputs", n_cat,
                       n_cont, out_sz),
               NULL;
    if (o.n_layers < 0 || o.n_layers > CF_TABULAR_MAX_LAYERS)
        return cf_fail(CF_ERR_INVALID, "TabularModel: %d layers (0..%d)", o.n_layers,
                       CF_TABULAR_MAX_LAYERS),
               NULL;
    if (o.n_ps != 0 && o.n_ps != 1 && o.n_ps != o.n_layers)
        return cf_fail(CF_ERR_INVALID, "TabularModel: %d dropout values for %d layers", o.n_ps,
                       o.n_layers),
               NULL;
    if (!(o.embed_p >= 0.0f && o.embed_p < 1.0f))
        return cf_fail(CF_ERR_INVALID, "TabularModel: embed_p %g not in [0, 1)", o.embed_p), NULL;
    tabular_impl *t = cf_calloc(1, sizeof *t);
    cf_module *m = t ? cf_module_new(&tabular_ops, t) : NULL;
    if (!m) return NULL;
    t->n_cat = n_cat;
    t->n_cont = n_cont;
    t->dims = cf_calloc((size_t)n_cat + 1, sizeof *t->dims);
    t->codes = cf_calloc((size_t)n_cat + 1, sizeof *t->codes);
    bool ok = t->dims && t->codes;
    cf_module *hook = zoo_hook_new(ZOO_PASS_NONE);
    if (!hook) ok = false;
    cf_module *embeds = ok ? zoo_module_list() : NULL;
    if (!embeds) ok = false;
    for (int i = 0; i < n_cat && ok; i++) {
        if (cardinalities[i] < 1) {
            cf_fail(CF_ERR_INVALID, "TabularModel: category %d has %d classes", i,
                    cardinalities[i]);
            ok = false;
            break;
        }
        int d = emb_dims && emb_dims[i] > 0 ? emb_dims[i] : cf_emb_sz_rule(cardinalities[i]);
        t->dims[i] = d;
        t->n_emb += d;
        if (d > t->max_dim) t->max_dim = d;
        cf_module *e = cf_embedding(cardinalities[i], d);
        if (!e || !zoo_hook_mark(hook, e, ZOO_MARK_EMBEDDING)) {
            cf_module_free(e);
            ok = false;
            break;
        }
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        if (cf_module_add_child(embeds, e, name) != CF_OK) ok = false;
    }
    if (ok) {
        t->embeds = embeds;
        ok = cf_module_add_child(m, embeds, "embeds") == CF_OK;
    } else {
        cf_module_free(embeds);
    }
    if (ok) {
        t->emb_drop = cf_dropout(o.embed_p);
        ok = t->emb_drop && cf_module_add_child(m, t->emb_drop, "emb_drop") == CF_OK;
    }
    if (ok && n_cont > 0 && o.bn_cont) {
        t->bn_cont = cf_batchnorm1d(n_cont);
        ok = t->bn_cont && cf_module_add_child(m, t->bn_cont, "bn_cont") == CF_OK;
    }
    cf_module *layers = ok ? cf_sequential(0, NULL) : NULL;
    if (!layers) ok = false;
    int sizes[CF_TABULAR_MAX_LAYERS + 2];
    sizes[0] = t->n_emb + n_cont;
    for (int i = 0; i < o.n_layers; i++) sizes[i + 1] = o.layers[i];
    sizes[o.n_layers + 1] = out_sz;
    for (int i = 0; i <= o.n_layers && ok; i++) {
        bool last = i == o.n_layers;
        float p = last || o.n_ps == 0 ? 0.0f : o.ps[o.n_ps == 1 ? 0 : i];
        if (sizes[i + 1] < 1 || !(p >= 0.0f && p < 1.0f)) {
            cf_fail(CF_ERR_INVALID, "TabularModel: layer %d has %d units and dropout %g", i,
                    sizes[i + 1], p);
            ok = false;
            break;
        }
        cf_module *block = cf_sequential(0, NULL);
        bool bok = block != NULL;
        lin_bn_drop(block, hook, &bok, sizes[i], sizes[i + 1], o.use_bn && (!last || o.bn_final), p,
                    !last, o.lin_first);
        if (!bok) {
            cf_module_free(block);
            block = NULL;
        }
        zoo_add(layers, &ok, block);
    }
    if (o.y_range) zoo_add(layers, &ok, zoo_sigmoid_range(o.y_lo, o.y_hi));
    if (ok) {
        t->layers = layers;
        ok = cf_module_add_child(m, layers, "layers") == CF_OK;
    } else {
        cf_module_free(layers);
    }
    if (ok) {
        ((zoo_init_hook *)hook->impl)->target = m;
        ok = cf_module_add_child(m, hook, "init") == CF_OK;
    } else {
        cf_module_free(hook);
    }
    if (!ok) {
        cf_module_free(m);
        cf_fail_context(CF_ERR_INVALID, "TabularModel(%d categories, %d continuous)", n_cat,
                        n_cont);
        return NULL;
    }
    return m;
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
