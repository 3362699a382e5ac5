/* fastai's text dropouts (fastai/text/models/awdlstm.py):
 *   RNNDropout(p): one mask per row of the batch, shared over time: input (B, ..., F), mask
 *     (B, 1, F), kept with probability 1 - p and scaled by 1 / (1 - p);
 *   EmbeddingDropout(embed_p) around an embedding with a padding row: whole rows of the table
 *     dropped (mask (vocab, 1)), the padding row's lookup gets no gradient;
 * Masks are redrawn at every training forward. Inside a fit (the model's draw key set, as for
 * Dropout) RNNDropout's row b draws from (module, epoch, sample ids[b]) and EmbeddingDropout's
 * table mask from (module, epoch, batch position): they do not depend on which process holds a
 * row, so a batch split over workers draws what one process draws. Without a key the masks come
 * from the module's own stream (seeded by the model), so one seed gives the same masks run after
 * run. Eval and p = 0 are the identity. */
#include "corefit/nn.h"
#include "rnn_internal.h"

#include <math.h>
#include <string.h>

/* p in [0, 1): keep with probability 1 - p, value 1 / (1 - p); p = 1: all 0 */
static void draw_scaled_mask(cf_rng *rng, float p, float *mask, size_t n) {
    const uint64_t threshold = (uint64_t)llround((double)p * 4294967296.0);
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < n; i += 2) {
        const uint64_t r = cf_rng_next(rng);
        mask[i] = (r & 0xffffffffu) >= threshold ? scale : 0.0f;
        if (i + 1 < n) mask[i + 1] = (r >> 32) >= threshold ? scale : 0.0f;
    }
}

/* splitmix64's finaliser (a bijective mix), as Dropout's keyed masks use */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

bool cf_nn_keyed_rng(const cf_module *m, int rows, int64_t row, cf_rng *rng) {
    const cf_draw_key *k = m->draw_key;
    if (!k || !k->ids || k->n != rows || rows < 1) return false;
    uint64_t h = mix64(m->rng.s[0] ^ mix64(m->rng.s[1]));
    h = mix64(h ^ mix64(k->key + 0x9e3779b97f4a7c15ULL));
    h = mix64(h ^ mix64((uint64_t)k->step + 0x632be59bd9b4e019ULL));
    h = mix64(h ^ mix64(k->sub + 0x8cb92ba72f3d8dd7ULL));
    h = mix64(h ^ mix64((uint64_t)row + 0xd6e8feb86659fd93ULL));
    cf_rng_seed(rng, h);
    return true;
}

/* ---- RNNDropout ---------------------------------------------------------------------------- */

typedef struct rnn_dropout_impl {
    float p;
    bool masked;
    float *mask; /* arena: (B, F) */
} rnn_dropout_impl;

static cf_status rdo_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    if (in->ndim < 2) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "RNNDropout(%g): input %s does not fit (expected (B, ..., F))",
                       (double)((rnn_dropout_impl *)m->impl)->p, cf_shape_str(in, s, sizeof s));
    }
    *out = *in;
    return CF_OK;
}

static void rdo_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    rnn_dropout_impl *d = m->impl;
    const size_t n = cf_shape_numel(in);
    m->out.data = cf_arena_floats(arena, n);
    m->out.shape = *in;
    m->dx.data = cf_arena_floats(arena, n);
    m->dx.shape = *in;
    m->grad_arena = NULL;
    d->mask = cf_arena_floats(arena, (size_t)in->dim[0] * in->dim[in->ndim - 1]);
}

static const cf_tensor *rdo_forward(cf_module *m, const cf_tensor *x) {
    rnn_dropout_impl *d = m->impl;
    m->in = x;
    cf_tensor *y = cf_module_output(m, &x->shape);
    const size_t n = cf_tensor_numel(x);
    d->masked = m->training && d->p > 0.0f;
    if (!d->masked) {
        memcpy(y->data, x->data, n * sizeof(float));
        return y;
    }
    const int B = x->shape.dim[0], F = x->shape.dim[x->shape.ndim - 1];
    const size_t per_row = n / (size_t)B, steps = per_row / (size_t)F;
    cf_rng keyed;
    if (cf_nn_keyed_rng(m, B, 0, &keyed))
        for (int b = 0; b < B; b++) { /* each row from its own sample */
            cf_nn_keyed_rng(m, B, m->draw_key->ids[b], &keyed);
            draw_scaled_mask(&keyed, d->p, d->mask + (size_t)b * F, (size_t)F);
        }
    else
        draw_scaled_mask(&m->rng, d->p, d->mask, (size_t)B * F);
    for (int b = 0; b < B; b++) {
        const float *restrict mk = d->mask + (size_t)b * F;
        for (size_t t = 0; t < steps; t++) {
            const float *restrict xr = x->data + b * per_row + t * F;
            float *restrict yr = y->data + b * per_row + t * F;
            for (int j = 0; j < F; j++) yr[j] = xr[j] * mk[j];
        }
    }
    return y;
}

static const cf_tensor *rdo_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    rnn_dropout_impl *d = m->impl;
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m);
    const size_t n = cf_tensor_numel(dx);
    if (!d->masked) {
        memcpy(dx->data, dy->data, n * sizeof(float));
        return dx;
    }
    const int B = dx->shape.dim[0], F = dx->shape.dim[dx->shape.ndim - 1];
    const size_t per_row = n / (size_t)B, steps = per_row / (size_t)F;
    for (int b = 0; b < B; b++) {
        const float *restrict mk = d->mask + (size_t)b * F;
        for (size_t t = 0; t < steps; t++) {
            const float *restrict g = dy->data + b * per_row + t * F;
            float *restrict o = dx->data + b * per_row + t * F;
            for (int j = 0; j < F; j++) o[j] = g[j] * mk[j];
        }
    }
    return dx;
}

static const cf_module_ops rnn_dropout_ops = {
    .kind = "RNNDropout",
    .out_shape = rdo_out_shape,
    .plan = rdo_plan,
    .forward = rdo_forward,
    .backward = rdo_backward,
};

cf_module *cf_rnn_dropout(float p) {
    if (!(p >= 0.0f && p <= 1.0f)) {
        cf_fail(CF_ERR_INVALID, "cf_rnn_dropout: p %g must be in [0, 1]", (double)p);
        return NULL;
    }
    rnn_dropout_impl *d = cf_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->p = p;
    return cf_module_new(&rnn_dropout_ops, d);
}

float cf_rnn_dropout_p(const cf_module *m) {
    if (!m || m->ops != &rnn_dropout_ops) return -1.0f;
    return ((const rnn_dropout_impl *)m->impl)->p;
}

const float *cf_nn_rnn_dropout_mask(const cf_module *m) {
    if (!m || m->ops != &rnn_dropout_ops) return NULL;
    const rnn_dropout_impl *d = m->impl;
    return d->masked ? d->mask : NULL;
}

/* ---- EmbeddingDropout (the encoder with its dropout) --------------------------------------- */

typedef struct emb_dropout_impl {
    int vocab, dim, pad;
    float p;
    bool masked;
    float *mask; /* heap (vocab) */
} emb_dropout_impl;

static cf_status edo_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    emb_dropout_impl *e = m->impl;
    if (in->ndim != 2) {
        char s[64];
        return cf_fail(
            CF_ERR_INVALID,
            "EmbeddingDropout(%d, %d): input %s does not fit (expected (B, T) token ids)", e->vocab,
            e->dim, cf_shape_str(in, s, sizeof s));
    }
    *out = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], e->dim}};
    return CF_OK;
}

static void edo_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    emb_dropout_impl *e = m->impl;
    const size_t n = cf_shape_numel(in);
    m->out.data = cf_arena_floats(arena, n * e->dim);
    m->out.shape = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], e->dim}};
    m->dx.data = cf_arena_floats(arena, n);
    m->dx.shape = *in;
    m->grad_arena = NULL;
}

/* fastai's AWD_LSTM init: U(-0.1, 0.1) over the whole table, the padding row included */
static void edo_init(cf_module *m, cf_rng *rng) {
    cf_param *w = &m->params[0];
    for (size_t i = 0; i < w->numel; i++) w->data[i] = (float)(0.2 * cf_rng_uniform(rng) - 0.1);
}

static inline int64_t token_of(float v, int vocab) {
    if (!(v >= 0.0f && v < (float)vocab) || v != floorf(v)) return -1;
    return (int64_t)v;
}

static const cf_tensor *edo_forward(cf_module *m, const cf_tensor *x) {
    emb_dropout_impl *e = m->impl;
    m->in = x;
    const size_t n = cf_tensor_numel(x), dim = (size_t)e->dim;
    cf_tensor *y = cf_module_output(
        m, &(cf_shape){.ndim = 3, .dim = {x->shape.dim[0], x->shape.dim[1], e->dim}});
    e->masked = m->training && e->p > 0.0f;
    if (e->masked) { /* one table mask for the batch: keyed by its position, not its rows */
        cf_rng keyed;
        const bool by_key = cf_nn_keyed_rng(m, x->shape.dim[0], -1, &keyed);
        draw_scaled_mask(by_key ? &keyed : &m->rng, e->p, e->mask, (size_t)e->vocab);
    }
    const float *w = m->params[0].data;
    for (size_t i = 0; i < n; i++) {
        const int64_t c = token_of(x->data[i], e->vocab);
        float *restrict row = y->data + i * dim;
        if (c < 0) {
            memset(row, 0, dim * sizeof(float));
            continue;
        }
        const float *restrict src = w + (size_t)c * dim;
        if (e->masked) {
            const float s = e->mask[c];
            for (size_t j = 0; j < dim; j++) row[j] = src[j] * s;
        } else {
            memcpy(row, src, dim * sizeof(float));
        }
    }
    return y;
}

static const cf_tensor *edo_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    emb_dropout_impl *e = m->impl;
    const cf_tensor *x = m->in;
    cf_param *w = &m->params[0];
    const size_t n = cf_tensor_numel(x), dim = (size_t)e->dim;
    if (w->trainable)
        for (size_t i = 0; i < n; i++) {
            const int64_t c = token_of(x->data[i], e->vocab);
            if (c < 0 || c == e->pad) continue; /* padding_idx: no gradient */
            const float s = e->masked ? e->mask[c] : 1.0f;
            float *restrict g = w->grad + (size_t)c * dim;
            const float *restrict d = dy->data + i * dim;
            for (size_t j = 0; j < dim; j++) g[j] += d[j] * s;
        }
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m); /* token ids are not differentiable */
    memset(dx->data, 0, n * sizeof(float));
    return dx;
}

static void edo_destroy(cf_module *m) {
    cf_free(((emb_dropout_impl *)m->impl)->mask);
}

static const cf_module_ops emb_dropout_ops = {
    .kind = "EmbeddingDropout",
    .out_shape = edo_out_shape,
    .plan = edo_plan,
    .init = edo_init,
    .forward = edo_forward,
    .backward = edo_backward,
    .destroy = edo_destroy,
};

cf_module *cf_embedding_dropout(int vocab_size, int dim, float embed_p, int pad_idx) {
    if (vocab_size < 1 || dim < 1 || !(embed_p >= 0.0f && embed_p <= 1.0f)) {
        cf_fail(CF_ERR_INVALID,
                "cf_embedding_dropout: vocab_size %d, dim %d (both >= 1) or embed_p %g (in [0, 1]) "
                "out of range",
                vocab_size, dim, (double)embed_p);
        return NULL;
    }
    emb_dropout_impl *e = cf_calloc(1, sizeof *e);
    float *mask = cf_malloc((size_t)vocab_size * sizeof(float));
    if (!e || !mask) {
        cf_free(e);
        cf_free(mask);
        return NULL;
    }
    *e = (emb_dropout_impl){
        .vocab = vocab_size, .dim = dim, .pad = pad_idx, .p = embed_p, .mask = mask};
    cf_module *m = cf_module_new(&emb_dropout_ops, e);
    if (!m) {
        cf_free(mask);
        return NULL;
    }
    cf_module_add_param(m, "weight", CF_PARAM_WEIGHT, cf_shape2(vocab_size, dim));
    return m;
}

const float *cf_nn_embedding_dropout_mask(const cf_module *m) {
    if (!m || m->ops != &emb_dropout_ops) return NULL;
    const emb_dropout_impl *e = m->impl;
    return e->masked ? e->mask : NULL;
}
