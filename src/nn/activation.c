/* Element-wise and shape layers: ReLU, LeakyReLU, Flatten, Dropout. */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <math.h>
#include <string.h>

static cf_status same_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    (void)m;
    *out = *in;
    return CF_OK;
}

/* Large element-wise loops are split over the thread pool (memory-bound, but the stem's
 * activations are a few MB), by whole images. Results do not depend on the split. */
#define PAR_MIN (1 << 16)

typedef struct ew_ctx {
    const float *a, *b;
    float *out;
    float slope;
} ew_ctx;

typedef void (*ew_kernel)(const ew_ctx *c, int64_t begin, int64_t end);

typedef struct ew_job {
    ew_ctx ctx;
    ew_kernel kernel;
} ew_job;

static void ew_range(void *vjob, int64_t begin, int64_t end, int thread) {
    (void)thread;
    ew_job *job = vjob;
    job->kernel(&job->ctx, begin, end);
}

/* Over the n values of a tensor of the given shape; split by whole images (the batch's first
 * dimension), as the layers around it split it (cf_nn_parallel_images). */
static void ew_run(ew_kernel kernel, ew_ctx ctx, const cf_shape *shape) {
    const int64_t n = (int64_t)cf_shape_numel(shape);
    if (n >= PAR_MIN && cf_get_num_threads() > 1) {
        ew_job job = {ctx, kernel};
        const int64_t images = shape->ndim > 1 ? shape->dim[0] : 1;
        if (images > 1)
            cf_nn_parallel_images(images, n / images, ew_range, &job);
        else
            cf_parallel_for(n, ew_range, &job);
    } else {
        kernel(&ctx, 0, n);
    }
}

/* ---- ReLU ----------------------------------------------------------------------------------
 * A ReLU that follows a BatchNorm fused with it (see nn_internal.h) passes its input and the
 * upstream gradient through: the BatchNorm already wrote max(bn(x), 0) and masks the gradient
 * itself. Nothing is reserved for it then; out and dx alias x and dy, as Flatten's do. */

typedef struct relu_impl {
    const cf_module *bn; /* the BatchNorm before it, when planned fused */
} relu_impl;

static const cf_module_ops relu_ops;

bool cf_nn_is_relu(const cf_module *m) {
    return m && m->ops == &relu_ops;
}

void cf_nn_relu_follow_bn(cf_module *relu, const cf_module *bn) {
    ((relu_impl *)relu->impl)->bn = bn;
}

static bool relu_passes(const cf_module *m) {
    const relu_impl *r = m->impl;
    return r->bn && cf_nn_bn_fused_with(r->bn, m);
}

static void relu_fwd_k(const ew_ctx *c, int64_t b, int64_t e) {
    const float *restrict x = c->a;
    float *restrict y = c->out;
    for (int64_t i = b; i < e; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void relu_bwd_k(const ew_ctx *c, int64_t b, int64_t e) {
    const float *restrict y = c->a, *restrict g = c->b;
    float *restrict dx = c->out;
    for (int64_t i = b; i < e; i++) {
        const float gi = g[i]; /* loaded unconditionally so that the select vectorises */
        dx[i] = y[i] > 0.0f ? gi : 0.0f;
    }
}

static void relu_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    if (relu_passes(m)) {
        m->out.data = m->dx.data = NULL;
        return;
    }
    cf_module_plan_default(m, in, arena);
}

static const cf_tensor *relu_forward(cf_module *m, const cf_tensor *x) {
    m->in = x;
    if (relu_passes(m)) {
        m->out = *x;
        return x;
    }
    cf_tensor *y = cf_module_output(m, &x->shape);
    ew_run(relu_fwd_k, (ew_ctx){.a = x->data, .out = y->data}, &x->shape);
    return y;
}

static const cf_tensor *relu_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    if (!need_dx) return NULL;
    if (relu_passes(m)) {
        m->dx = *dy;
        return dy;
    }
    cf_tensor *dx = cf_module_input_grad(m);
    ew_run(relu_bwd_k, (ew_ctx){.a = m->out.data, .b = dy->data, .out = dx->data}, &dx->shape);
    return dx;
}

static const cf_module_ops relu_ops = {
    .kind = "ReLU",
    .out_shape = same_shape,
    .plan = relu_plan,
    .forward = relu_forward,
    .backward = relu_backward,
};

cf_module *cf_relu(void) {
    relu_impl *r = cf_calloc(1, sizeof *r);
    if (!r) return NULL;
    return cf_module_new(&relu_ops, r);
}

/* ---- LeakyReLU ----------------------------------------------------------------------------- */

typedef struct leaky_impl {
    float slope;
} leaky_impl;

static void leaky_fwd_k(const ew_ctx *c, int64_t b, int64_t e) {
    const float *restrict x = c->a;
    float *restrict y = c->out;
    const float s = c->slope;
    for (int64_t i = b; i < e; i++) y[i] = x[i] > 0.0f ? x[i] : x[i] * s;
}

/* PyTorch's leaky_relu_backward: grad where x > 0, grad * slope elsewhere. */
static void leaky_bwd_k(const ew_ctx *c, int64_t b, int64_t e) {
    const float *restrict x = c->a, *restrict g = c->b;
    float *restrict dx = c->out;
    const float s = c->slope;
    for (int64_t i = b; i < e; i++) dx[i] = x[i] > 0.0f ? g[i] : g[i] * s;
}

static const cf_tensor *leaky_forward(cf_module *m, const cf_tensor *x) {
    leaky_impl *l = m->impl;
    m->in = x;
    cf_tensor *y = cf_module_output(m, &x->shape);
    ew_run(leaky_fwd_k, (ew_ctx){.a = x->data, .out = y->data, .slope = l->slope}, &x->shape);
    return y;
}

static const cf_tensor *leaky_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    leaky_impl *l = m->impl;
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m);
    ew_run(leaky_bwd_k,
           (ew_ctx){.a = m->in->data, .b = dy->data, .out = dx->data, .slope = l->slope},
           &dx->shape);
    return dx;
}

static const cf_module_ops leaky_ops = {
    .kind = "LeakyReLU",
    .out_shape = same_shape,
    .forward = leaky_forward,
    .backward = leaky_backward,
};

cf_module *cf_leaky_relu(float negative_slope) {
    if (!isfinite(negative_slope)) {
        cf_fail(CF_ERR_INVALID, "cf_leaky_relu: negative_slope %g is not finite",
                (double)negative_slope);
        return NULL;
    }
    leaky_impl *l = cf_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->slope = negative_slope;
    return cf_module_new(&leaky_ops, l);
}

/* ---- Flatten: a view, no copy -------------------------------------------------------------- */

static cf_status flatten_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    (void)m;
    size_t per = cf_shape_sample_numel(in);
    if (per > (size_t)INT32_MAX) {
        char s[64];
        return cf_fail(CF_ERR_INVALID, "Flatten: input %s has too many values per sample",
                       cf_shape_str(in, s, sizeof s));
    }
    *out = cf_shape2(in->dim[0], (int)per);
    return CF_OK;
}

/* Output and input gradient alias the input and the upstream gradient; nothing is reserved. */
static void flatten_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    (void)m;
    (void)in;
    (void)arena;
}

static const cf_tensor *flatten_forward(cf_module *m, const cf_tensor *x) {
    m->in = x;
    m->out.data = x->data;
    m->out.shape = cf_shape2(x->shape.dim[0], (int)cf_shape_sample_numel(&x->shape));
    return &m->out;
}

static const cf_tensor *flatten_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    if (!need_dx) return NULL;
    m->dx.data = dy->data;
    m->dx.shape = m->in->shape;
    return &m->dx;
}

static const cf_module_ops flatten_ops = {
    .kind = "Flatten",
    .out_shape = flatten_out_shape,
    .plan = flatten_plan,
    .forward = flatten_forward,
    .backward = flatten_backward,
};

cf_module *cf_flatten(void) {
    return cf_module_new(&flatten_ops, NULL);
}

/* ---- Dropout ------------------------------------------------------------------------------- *
 * Inverted dropout: in training each value is kept with probability 1 - p and scaled by
 * 1 / (1 - p). Each 64-bit draw decides two values (32 bits each). Inside a fit the model's
 * draw key is set (cf_model_set_draw_key): the draws of row b are a counter-based hash of (this
 * module's stream state, the key, the row's dataset index, the position in the row), so they do not
 * depend on how many batches a process has run, on which process runs the row, or on the rows
 * around it — a resumed or restarted fit, and a batch split over processes, draw the same masks.
 * Without a key the mask comes from the module's own stream (m->rng, seeded by the model), so
 * one seed still gives the same masks run after run. Eval (and p = 0): identity. p = 1 drops
 * everything (output 0, as PyTorch). */

typedef struct dropout_impl {
    float p;
    bool masked;   /* the last forward applied a mask */
    uint8_t *mask; /* arena: 1 = kept */
} dropout_impl;

/* splitmix64's finaliser: a bijective mix, so distinct counters give independent-looking words */
static inline uint64_t dropout_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The keyed rows of `per` values, row b keyed by ids[b]: its draws and its product in one call
 * of the tensor layer's cf_dropout_keyed_row (vectorised where the level has it). */
static void dropout_keyed_rows(uint64_t seed, const cf_draw_key *k, size_t per, uint64_t threshold,
                               float scale, const float *x, uint8_t *mask, float *y) {
    const uint64_t base = dropout_mix(seed ^ dropout_mix(k->key + 0x9e3779b97f4a7c15ULL));
    for (int b = 0; b < k->n; b++) {
        const uint64_t row =
            dropout_mix(base ^ dropout_mix((uint64_t)k->ids[b] + 0x632be59bd9b4e019ULL));
        const size_t at = (size_t)b * per;
        cf_dropout_keyed_row(row, per, threshold, scale, x + at, mask + at, y + at);
    }
}

static void dropout_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    dropout_impl *d = m->impl;
    cf_module_plan_default(m, in, arena);
    d->mask = cf_arena_bytes(arena, cf_shape_numel(in));
}

/* y = x * scale where the mask is set, else +0, as mask ? x * scale : 0.0f gives it: the product's
 * bits kept or cleared. A branch on a random mask mispredicts about half the time (p = 0.5), and
 * the compiler does not vectorise the select from bytes; this loop it does. */
static void dropout_apply(const uint8_t *restrict mask, const float *restrict x, float scale,
                          float *restrict y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float v = x[i] * scale;
        uint32_t b;
        memcpy(&b, &v, sizeof b);
        b &= 0u - (uint32_t)mask[i]; /* mask[i] is 0 or 1 */
        memcpy(&y[i], &b, sizeof b);
    }
}

static const cf_tensor *dropout_forward(cf_module *m, const cf_tensor *x) {
    dropout_impl *d = m->impl;
    m->in = x;
    cf_tensor *y = cf_module_output(m, &x->shape);
    size_t n = cf_tensor_numel(x);
    d->masked = m->training && d->p > 0.0f;
    if (!d->masked) {
        memcpy(y->data, x->data, n * sizeof(float));
        return y;
    }
    const uint64_t threshold = (uint64_t)llround((double)d->p * 4294967296.0);
    const float scale = d->p < 1.0f ? 1.0f / (1.0f - d->p) : 0.0f;
    uint8_t *restrict mask = d->mask;
    const cf_draw_key *k = m->draw_key;
    if (k && k->ids && x->shape.ndim > 0 && x->shape.dim[0] == k->n && k->n > 0) {
        /* the module's seed is its stream's state, which keyed draws never advance (so a
         * checkpoint, which keeps the streams, keeps it) */
        const uint64_t seed = dropout_mix(m->rng.s[0] ^ dropout_mix(m->rng.s[1]));
        dropout_keyed_rows(seed, k, n / (size_t)k->n, threshold, scale, x->data, mask, y->data);
        return y;
    }
    for (size_t i = 0; i < n; i += 2) {
        uint64_t r = cf_rng_next(&m->rng);
        mask[i] = (r & 0xffffffffu) >= threshold;
        if (i + 1 < n) mask[i + 1] = (r >> 32) >= threshold;
    }
    dropout_apply(mask, x->data, scale, y->data, n);
    return y;
}

static const cf_tensor *dropout_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    dropout_impl *d = m->impl;
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m);
    size_t n = cf_tensor_numel(dx);
    if (!d->masked) {
        memcpy(dx->data, dy->data, n * sizeof(float));
        return dx;
    }
    const float scale = d->p < 1.0f ? 1.0f / (1.0f - d->p) : 0.0f;
    dropout_apply(d->mask, dy->data, scale, dx->data, n);
    return dx;
}

static const cf_module_ops dropout_ops = {
    .kind = "Dropout",
    .out_shape = same_shape,
    .plan = dropout_plan,
    .forward = dropout_forward,
    .backward = dropout_backward,
};

cf_module *cf_dropout(float p) {
    if (!(p >= 0.0f && p <= 1.0f)) {
        cf_fail(CF_ERR_INVALID, "cf_dropout: p %g must be in [0, 1]", (double)p);
        return NULL;
    }
    dropout_impl *d = cf_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->p = p;
    return cf_module_new(&dropout_ops, d);
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
    .out_shape = same_shape,
    .forward = sigrange_forward,
    .backward = sigrange_backward,
};

cf_module *cf_nn_sigmoid_range(float lo, float hi) {
    if (!(hi > lo)) {
        cf_fail(CF_ERR_INVALID, "SigmoidRange: y_range (%g, %g) needs low < high", lo, hi);
        return NULL;
    }
    sigrange_impl *r = cf_calloc(1, sizeof *r);
    if (!r) return NULL;
    *r = (sigrange_impl){lo, hi};
    return cf_module_new(&sigrange_ops, r);
}
