/* fastai's text dropouts and decoder (fastai/text/models/awdlstm.py, core.py):
 *   RNNDropout(p): one mask per row of the batch, shared over time: input (B, ..., F), mask
 *     (B, 1, F), kept with probability 1 - p and scaled by 1 / (1 - p);
 *   EmbeddingDropout(embed_p) around an embedding with a padding row: whole rows of the table
 *     dropped (mask (vocab, 1)), the padding row's lookup gets no gradient;
 *   LinearDecoder(n_out, n_hid, output_p, tied encoder): RNNDropout(output_p), then a Linear
 *     whose weight may be the encoder's table itself.
 * Masks are redrawn at every training forward from the module's random stream (seeded by the
 * model), so one seed gives the same masks run after run and in every process of a group; eval
 * and p = 0 are the identity. */
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
    if (e->masked) draw_scaled_mask(&m->rng, e->p, e->mask, (size_t)e->vocab);
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

/* ---- LinearDecoder ------------------------------------------------------------------------- */

typedef struct decoder_impl {
    int n_out, n_hid;
    bool bias;
    const cf_module *tied; /* the encoder whose table is the weight (NULL: own "decoder.weight") */
    float ar_alpha, tar_beta; /* fastai's RNNRegularizer, added by training backwards (0: off) */
} decoder_impl;

static cf_module *dec_dropout(const cf_module *m) {
    return m->children[0];
}

static cf_status dec_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    decoder_impl *d = m->impl;
    if (in->ndim != 3 || in->dim[2] != d->n_hid) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "LinearDecoder(%d, %d): input %s does not fit (expected (B, T, %d))",
                       d->n_out, d->n_hid, cf_shape_str(in, s, sizeof s), d->n_hid);
    }
    *out = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], d->n_out}};
    return CF_OK;
}

static void dec_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    decoder_impl *d = m->impl;
    cf_module *dp = dec_dropout(m);
    dp->ops->plan(dp, in, arena);
    const size_t rows = (size_t)in->dim[0] * in->dim[1];
    m->out.data = cf_arena_floats(arena, rows * d->n_out);
    m->out.shape = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], d->n_out}};
    m->dx.data = cf_arena_floats(arena, rows * d->n_hid);
    m->dx.shape = *in;
    m->grad_arena = NULL;
}

/* fastai's LinearDecoder init: weight U(-0.1, 0.1) (when not tied), bias 0 */
static void dec_init(cf_module *m, cf_rng *rng) {
    decoder_impl *d = m->impl;
    for (int i = 0; i < m->n_params; i++) {
        cf_param *p = &m->params[i];
        const bool is_bias = d->bias && i == m->n_params - 1;
        for (size_t k = 0; k < p->numel; k++)
            p->data[k] = is_bias ? 0.0f : (float)(0.2 * cf_rng_uniform(rng) - 0.1);
    }
}

static cf_param *dec_weight(cf_module *m) {
    decoder_impl *d = m->impl;
    return d->tied ? (cf_param *)&d->tied->params[0] : &m->params[0];
}

static const cf_tensor *dec_forward(cf_module *m, const cf_tensor *x) {
    decoder_impl *d = m->impl;
    m->in = x;
    cf_module *dp = dec_dropout(m);
    dp->in = x;
    const cf_tensor *xd = dp->ops->forward(dp, x);
    const int rows = x->shape.dim[0] * x->shape.dim[1];
    cf_tensor *y = cf_module_output(
        m, &(cf_shape){.ndim = 3, .dim = {x->shape.dim[0], x->shape.dim[1], d->n_out}});
    if (d->bias) {
        const float *b = m->params[m->n_params - 1].data;
        for (int r = 0; r < rows; r++) memcpy(y->data + (size_t)r * d->n_out, b, d->n_out * 4);
    }
    cf_nn_par_sgemm(false, true, rows, d->n_out, d->n_hid, xd->data, d->n_hid, dec_weight(m)->data,
                    d->n_hid, d->bias ? 1.0f : 0.0f, y->data, d->n_out);
    return y;
}

static const cf_tensor *dec_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    decoder_impl *d = m->impl;
    cf_module *dp = dec_dropout(m);
    const cf_tensor *xd = &dp->out; /* the dropped input */
    const int rows = m->in->shape.dim[0] * m->in->shape.dim[1];
    cf_param *w = dec_weight(m);
    if (w->trainable) /* dW += dy^T x */
        cf_nn_par_sgemm(true, false, d->n_out, d->n_hid, rows, dy->data, d->n_out, xd->data,
                        d->n_hid, 1.0f, w->grad, d->n_hid);
    if (d->bias && m->params[m->n_params - 1].trainable) {
        float *restrict db = m->params[m->n_params - 1].grad;
        for (int r = 0; r < rows; r++) {
            const float *g = dy->data + (size_t)r * d->n_out;
            for (int j = 0; j < d->n_out; j++) db[j] += g[j];
        }
    }
    if (!need_dx) return NULL;
    /* dx of the dropped input, then through the dropout */
    cf_tensor *dxd = cf_module_input_grad(m);
    cf_nn_par_sgemm(false, false, rows, d->n_hid, d->n_out, dy->data, d->n_out, w->data, d->n_hid,
                    0.0f, dxd->data, d->n_hid);
    /* AR: alpha * mean(out^2), out the dropped input */
    const bool reg = m->training && (d->ar_alpha != 0.0f || d->tar_beta != 0.0f);
    if (reg && d->ar_alpha != 0.0f) {
        const size_t n = (size_t)rows * d->n_hid;
        const float s = 2.0f * d->ar_alpha / (float)n;
        for (size_t i = 0; i < n; i++) dxd->data[i] += s * xd->data[i];
    }
    cf_tensor *dx = (cf_tensor *)dp->ops->backward(dp, dxd, true);
    /* TAR: beta * mean((raw[:, 1:] - raw[:, :-1])^2) over (B, T - 1, n_hid), raw the input */
    const int B = m->in->shape.dim[0], T = m->in->shape.dim[1], H = d->n_hid;
    if (reg && d->tar_beta != 0.0f && T > 1) {
        const float s = 2.0f * d->tar_beta / ((float)B * (float)(T - 1) * (float)H);
        for (int b = 0; b < B; b++)
            for (int t = 0; t + 1 < T; t++) {
                const float *r0 = m->in->data + ((size_t)b * T + t) * H, *r1 = r0 + H;
                float *g0 = dx->data + ((size_t)b * T + t) * H, *g1 = g0 + H;
                for (int j = 0; j < H; j++) {
                    const float diff = s * (r1[j] - r0[j]);
                    g1[j] += diff;
                    g0[j] -= diff;
                }
            }
    }
    return dx;
}

static const cf_module_ops decoder_ops = {
    .kind = "LinearDecoder",
    .out_shape = dec_out_shape,
    .plan = dec_plan,
    .init = dec_init,
    .forward = dec_forward,
    .backward = dec_backward,
};

cf_module *cf_linear_decoder(int n_out, int n_hid, float output_p, const cf_module *tied_encoder,
                             bool bias) {
    if (n_out < 1 || n_hid < 1) {
        cf_fail(CF_ERR_INVALID, "cf_linear_decoder: n_out %d and n_hid %d must be >= 1", n_out,
                n_hid);
        return NULL;
    }
    if (tied_encoder && (tied_encoder->n_params < 1 || tied_encoder->params[0].shape.ndim != 2 ||
                         tied_encoder->params[0].shape.dim[0] != n_out ||
                         tied_encoder->params[0].shape.dim[1] != n_hid)) {
        cf_fail(CF_ERR_INVALID,
                "cf_linear_decoder: the tied encoder's table is not (%d, %d) (n_out, n_hid)", n_out,
                n_hid);
        return NULL;
    }
    cf_module *dp = cf_rnn_dropout(output_p);
    if (!dp) return NULL;
    decoder_impl *d = cf_calloc(1, sizeof *d);
    if (!d) {
        cf_module_free(dp);
        return NULL;
    }
    *d = (decoder_impl){.n_out = n_out, .n_hid = n_hid, .bias = bias, .tied = tied_encoder};
    cf_module *m = cf_module_new(&decoder_ops, d);
    if (!m) {
        cf_module_free(dp);
        return NULL;
    }
    if (!tied_encoder)
        cf_module_add_param(m, "decoder.weight", CF_PARAM_WEIGHT, cf_shape2(n_out, n_hid));
    if (bias) cf_module_add_param(m, "decoder.bias", CF_PARAM_BIAS, cf_shape1(n_out));
    if (cf_module_add_child(m, dp, "output_dp") != CF_OK) {
        cf_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- fastai's RNNRegularizer on the language model ----------------------------------------- */

static decoder_impl *lm_decoder(const cf_module *lm) {
    if (!lm || lm->n_children != 2 || !cf_nn_is_awd_lstm(lm->children[0]) ||
        lm->children[1]->ops != &decoder_ops)
        return NULL;
    return lm->children[1]->impl;
}

const cf_tensor *cf_awd_lstm_lm_raw_out(const cf_module *lm) {
    return lm_decoder(lm) ? lm->children[1]->in : NULL;
}

const cf_tensor *cf_awd_lstm_lm_out(const cf_module *lm) {
    if (!lm_decoder(lm) || !lm->children[1]->in) return NULL;
    return &dec_dropout(lm->children[1])->out;
}

double cf_rnn_regularizer_loss(const cf_module *lm, float alpha, float beta) {
    const cf_tensor *raw = cf_awd_lstm_lm_raw_out(lm), *out = cf_awd_lstm_lm_out(lm);
    if (!raw || !out) return 0.0;
    const int B = raw->shape.dim[0], T = raw->shape.dim[1], H = raw->shape.dim[2];
    double ar = 0.0, tar = 0.0;
    const size_t n = (size_t)B * T * H;
    for (size_t i = 0; i < n; i++) ar += (double)out->data[i] * out->data[i];
    for (int b = 0; b < B; b++)
        for (int t = 0; t + 1 < T; t++) {
            const float *r0 = raw->data + ((size_t)b * T + t) * H, *r1 = r0 + H;
            for (int j = 0; j < H; j++) tar += ((double)r1[j] - r0[j]) * ((double)r1[j] - r0[j]);
        }
    double loss = alpha * ar / (double)n;
    if (T > 1) loss += beta * tar / ((double)B * (T - 1) * H);
    return loss;
}

cf_status cf_rnn_regularizer_set(cf_module *lm, float alpha, float beta) {
    decoder_impl *d = lm_decoder(lm);
    if (!d)
        return cf_fail(CF_ERR_INVALID, "cf_rnn_regularizer_set: the module is not an AWD-LSTM "
                                       "language model (cf_awd_lstm_lm)");
    if (!(alpha >= 0.0f && beta >= 0.0f && isfinite(alpha) && isfinite(beta)))
        return cf_fail(CF_ERR_INVALID,
                       "cf_rnn_regularizer_set: alpha %g and beta %g must be finite and >= 0",
                       (double)alpha, (double)beta);
    d->ar_alpha = alpha;
    d->tar_beta = beta;
    return CF_OK;
}
