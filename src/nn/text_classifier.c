/* fastai's ULMFiT classifier (fastai/text/models/core.py): SentenceEncoder, masked concat pooling,
 * PoolingLinearClassifier, get_text_classifier and the classifier splitter.
 *
 * SentenceEncoder runs the AWD_LSTM over the batch in chunks of bptt columns, the state carried
 * (detached) from chunk to chunk; only the chunks within the last max_len columns keep their
 * output (and get a gradient), the earlier ones just warm the state. Each chunk's forward draws
 * its own dropout masks, and the AWD_LSTM keeps the activations of its last forward only, so
 * backward recomputes each kept chunk but the last from the random streams and the state saved
 * before it (memory of one chunk instead of max_len / bptt of them), then puts the streams and
 * the state back as the forward left them. */
#include "corefit/nn.h"
#include "nn_internal.h"
#include "rnn_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- SentenceEncoder ----------------------------------------------------------------------- */

typedef struct chunk_info {
    int start, len, rows; /* columns [start, start + len) of the first rows rows */
    int slot;             /* kept: where its streams and state were saved; -1: not kept */
} chunk_info;

typedef struct sentence_encoder_impl {
    int bptt, max_len, pad, emb;
    /* arena, for the planned capacity */
    float *ids, *dy;    /* one chunk: (B, bptt) ids, (B, bptt, emb) output gradient */
    chunk_info *chunks; /* ceil(T / bptt) */
    cf_rng *rngs;       /* n_modules per slot */
    float *states;      /* state_floats per slot */
    int n_modules, cap_rows;
    int cap_kept; /* the most kept columns of any input up to the planned length */
    size_t state_floats;
    /* the last forward */
    int n_chunks, n_kept, live; /* live: the chunk whose activations the AWD_LSTM holds */
    cf_tensor chunk_in;
    void (*on_chunk)(void *ctx, int chunk, const cf_module *awd);
    void *on_chunk_ctx;
} sentence_encoder_impl;

static cf_module *se_awd(const cf_module *m) {
    return m->children[0];
}

/* the first column whose chunk keeps its output (chunks start at multiples of bptt) */
static int se_kept_from(const sentence_encoder_impl *s, int steps) {
    if (s->max_len < 0) return 0;
    int from = 0;
    while (steps - from > s->max_len) from += s->bptt;
    return from;
}

static cf_status se_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    sentence_encoder_impl *s = m->impl;
    if (in->ndim != 2 || in->dim[1] < 1) {
        char str[64];
        return cf_fail(CF_ERR_INVALID,
                       "SentenceEncoder: input %s does not fit (expected (B, T) token ids)",
                       cf_shape_str(in, str, sizeof str));
    }
    const int kept = in->dim[1] - se_kept_from(s, in->dim[1]);
    *out = (cf_shape){.ndim = 3, .dim = {in->dim[0], kept, s->emb}};
    return CF_OK;
}

/* The most columns an input of at most T columns keeps: the plan holds every shorter input
 * (the kept columns of a longer one can be fewer, hence not simply those of T). */
static int se_cap_kept(const sentence_encoder_impl *s, int T) {
    return s->max_len >= 0 && T > s->max_len ? s->max_len : T;
}

/* Planned for (B, T), it runs any (B', T') with B' <= B and T' <= T: a classifier's batches
 * (sorted by length, padded to their longest) share one plan. */
static void se_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    sentence_encoder_impl *s = m->impl;
    cf_module *awd = se_awd(m);
    const int B = in->dim[0], T = in->dim[1], len = T < s->bptt ? T : s->bptt;
    const int n_chunks = (T + s->bptt - 1) / s->bptt;
    const int cap_kept = se_cap_kept(s, T);
    /* the kept chunks of any such input: its kept columns start at a chunk boundary */
    const int kept_chunks = (cap_kept + s->bptt - 1) / s->bptt;
    cf_shape out;
    se_out_shape(m, in, &out);
    m->out.data = cf_arena_floats(arena, (size_t)B * cap_kept * s->emb);
    m->out.shape = out;
    s->cap_kept = cap_kept;
    m->dx.data = cf_arena_floats(arena, cf_shape_numel(in));
    m->dx.shape = *in;
    m->grad_arena = NULL;
    cf_shape chunk = cf_shape2(B, len);
    awd->ops->plan(awd, &chunk, arena);
    s->ids = cf_arena_floats(arena, (size_t)B * len);
    s->dy = cf_arena_floats(arena, (size_t)B * len * s->emb);
    s->chunks = cf_arena_bytes(arena, (size_t)n_chunks * sizeof(chunk_info));
    s->n_modules = cf_nn_count_modules(awd);
    s->cap_rows = B;
    s->state_floats = cf_nn_rnn_state_floats(awd, B);
    /* one slot per kept chunk, and one for the state the forward ends with */
    s->rngs = cf_arena_bytes(arena, (size_t)(kept_chunks + 1) * s->n_modules * sizeof(cf_rng));
    s->states = cf_arena_floats(arena, (size_t)(kept_chunks + 1) * s->state_floats);
}

static void se_save(sentence_encoder_impl *s, const cf_module *awd, int slot) {
    cf_nn_rng_save(awd, s->rngs + (size_t)slot * s->n_modules);
    cf_nn_rnn_state_save(awd, s->states + (size_t)slot * s->state_floats);
}

static void se_restore(sentence_encoder_impl *s, cf_module *awd, int slot) {
    cf_nn_rng_restore(awd, s->rngs + (size_t)slot * s->n_modules);
    cf_nn_rnn_state_restore(awd, s->states + (size_t)slot * s->state_floats);
}

/* runs the AWD_LSTM on chunk c of the input x (B, T) */
static const cf_tensor *se_run_chunk(cf_module *m, const cf_tensor *x, const chunk_info *c) {
    sentence_encoder_impl *s = m->impl;
    cf_module *awd = se_awd(m);
    const int T = x->shape.dim[1];
    for (int b = 0; b < c->rows; b++)
        memcpy(s->ids + (size_t)b * c->len, x->data + (size_t)b * T + c->start,
               (size_t)c->len * sizeof(float));
    s->chunk_in = cf_tensor_view(s->ids, cf_shape2(c->rows, c->len));
    awd->in = &s->chunk_in;
    /* Inside a fit the dropouts draw from the model's key: each chunk is a run of its own (sub)
     * over the batch's first c->rows rows, and a recomputation draws what its forward drew. The
     * key is the model's (m->draw_key points into it), set back after the chunk. */
    cf_draw_key *k = (cf_draw_key *)m->draw_key;
    const bool keyed = k && k->ids && k->n == x->shape.dim[0];
    const cf_draw_key saved = keyed ? *k : (cf_draw_key){0};
    if (keyed) {
        k->n = c->rows;
        k->sub = (uint64_t)(c - s->chunks) + 1;
    }
    const cf_tensor *y = awd->ops->forward(awd, &s->chunk_in);
    if (keyed) *k = saved;
    return y;
}

static const cf_tensor *se_forward(cf_module *m, const cf_tensor *x) {
    sentence_encoder_impl *s = m->impl;
    cf_module *awd = se_awd(m);
    m->in = x;
    const int B = x->shape.dim[0], T = x->shape.dim[1], E = s->emb;
    const int from = se_kept_from(s, T), K = T - from;
    cf_tensor *y = cf_module_output(m, &(cf_shape){.ndim = 3, .dim = {B, K, E}});
    cf_rnn_reset(awd); /* SentenceEncoder.forward starts with reset() */
    s->n_chunks = 0;
    s->n_kept = 0;
    s->live = -1;
    for (int start = 0; start < T; start += s->bptt) {
        chunk_info *c = &s->chunks[s->n_chunks];
        c->start = start;
        c->len = T - start < s->bptt ? T - start : s->bptt;
        /* fastai's real_bs: the rows whose first column of the chunk is not padding (they are
         * assumed to be the first rows: batches sorted by length, padded in front) */
        c->rows = 0;
        for (int b = 0; b < B; b++) c->rows += x->data[(size_t)b * T + start] != (float)s->pad;
        c->slot = start >= from ? s->n_kept++ : -1;
        const int chunk = s->n_chunks++;
        if (c->slot >= 0) se_save(s, awd, c->slot);
        const cf_tensor *o = NULL;
        if (c->rows > 0) {
            o = se_run_chunk(m, x, c);
            s->live = chunk;
            if (s->on_chunk) s->on_chunk(s->on_chunk_ctx, chunk, awd);
        } else {
            cf_rnn_reset(awd); /* an empty batch leaves no state rows: the next starts at 0 */
        }
        if (c->slot < 0) continue;
        /* rows past real_bs are zero (fastai's _pad_tensor) */
        for (int b = 0; b < B; b++) {
            float *dst = y->data + ((size_t)b * K + (start - from)) * E;
            if (b < c->rows)
                memcpy(dst, o->data + (size_t)b * c->len * E, (size_t)c->len * E * sizeof(float));
            else
                memset(dst, 0, (size_t)c->len * E * sizeof(float));
        }
    }
    se_save(s, awd, s->n_kept);
    return y;
}

static const cf_tensor *se_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    sentence_encoder_impl *s = m->impl;
    cf_module *awd = se_awd(m);
    const cf_tensor *x = m->in;
    const int T = x->shape.dim[1], E = s->emb;
    const int from = se_kept_from(s, T), K = T - from;
    /* the chunks are independent (the state between them is detached): the last first, while
     * its activations are live, then each earlier kept one recomputed */
    for (int i = s->n_chunks - 1; i >= 0; i--) {
        const chunk_info *c = &s->chunks[i];
        if (c->slot < 0 || c->rows == 0) continue;
        if (i != s->live) {
            se_restore(s, awd, c->slot);
            se_run_chunk(m, x, c);
            s->live = i;
        }
        for (int b = 0; b < c->rows; b++)
            memcpy(s->dy + (size_t)b * c->len * E, dy->data + ((size_t)b * K + c->start - from) * E,
                   (size_t)c->len * E * sizeof(float));
        cf_tensor d = cf_tensor_view(s->dy, (cf_shape){.ndim = 3, .dim = {c->rows, c->len, E}});
        awd->ops->backward(awd, &d, false);
    }
    if (s->live != s->n_chunks - 1) { /* recomputed: the streams and state as forward left them */
        se_restore(s, awd, s->n_kept);
        s->live = -1;
    }
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m); /* token ids are not differentiable */
    memset(dx->data, 0, cf_tensor_numel(dx) * sizeof(float));
    return dx;
}

static const cf_module_ops sentence_encoder_ops = {
    .kind = "SentenceEncoder",
    .out_shape = se_out_shape,
    .plan = se_plan,
    .forward = se_forward,
    .backward = se_backward,
};

void cf_nn_sentence_encoder_on_chunk(cf_module *encoder,
                                     void (*fn)(void *ctx, int chunk, const cf_module *awd),
                                     void *ctx) {
    if (!encoder || encoder->ops != &sentence_encoder_ops) return;
    sentence_encoder_impl *s = encoder->impl;
    s->on_chunk = fn;
    s->on_chunk_ctx = ctx;
}

cf_module *cf_sentence_encoder(int bptt, cf_module *awd_lstm, int pad_idx, int max_len) {
    if (!cf_nn_is_awd_lstm(awd_lstm) || bptt < 1 || (max_len >= 0 && max_len < bptt)) {
        cf_fail(CF_ERR_INVALID,
                "cf_sentence_encoder: needs an AWD_LSTM, bptt %d >= 1 and max_len %d >= bptt (or "
                "< 0: no limit)",
                bptt, max_len);
        cf_module_free(awd_lstm);
        return NULL;
    }
    sentence_encoder_impl *s = cf_calloc(1, sizeof *s);
    if (!s) {
        cf_module_free(awd_lstm);
        return NULL;
    }
    cf_shape out;
    awd_lstm->ops->out_shape(awd_lstm, &(cf_shape){.ndim = 2, .dim = {1, 1}}, &out);
    *s = (sentence_encoder_impl){
        .bptt = bptt, .max_len = max_len, .pad = pad_idx, .emb = out.dim[2], .live = -1};
    cf_module *m = cf_module_new(&sentence_encoder_ops, s);
    if (!m) {
        cf_module_free(awd_lstm);
        return NULL;
    }
    if (cf_module_add_child(m, awd_lstm, "module") != CF_OK) {
        cf_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- PoolingLinearClassifier --------------------------------------------------------------- *
 * masked_concat_pool over the encoder's output (B, K, E) and the padding of the kept columns of
 * its input, then the LinBnDrop blocks (child "layers"). A parameterless child after "layers"
 * sets fastai's BatchNorm init (weight 1, bias 1e-3) once the layers have their own. */

typedef struct pooling_impl {
    const cf_module *encoder; /* the SentenceEncoder before it (its input: the padding) */
    int bptt, emb;
    float *pooled;   /* arena (B, 3E) */
    int32_t *argmax; /* arena (B, E): the column of each max; -1: none */
    int32_t *last;   /* arena (B): the column pooled as last; -1: none */
    float *count;    /* arena (B): the non-padding columns */
    cf_tensor pooled_t;
} pooling_impl;

static cf_module *pool_layers(const cf_module *m) {
    return m->children[0];
}

static cf_status pool_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    pooling_impl *p = m->impl;
    if (in->ndim != 3 || in->dim[2] != p->emb) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "PoolingLinearClassifier: input %s does not fit (expected (B, K, %d))",
                       cf_shape_str(in, s, sizeof s), p->emb);
    }
    cf_module *layers = pool_layers(m);
    return layers->ops->out_shape(layers, &(cf_shape){.ndim = 2, .dim = {in->dim[0], 3 * p->emb}},
                                  out);
}

static void pool_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    pooling_impl *p = m->impl;
    const size_t B = (size_t)in->dim[0], E = (size_t)p->emb;
    /* the encoder, planned just before, may keep more columns for a shorter input */
    const int cap_kept = ((const sentence_encoder_impl *)p->encoder->impl)->cap_kept;
    const size_t K = (size_t)(cap_kept > in->dim[1] ? cap_kept : in->dim[1]);
    p->pooled = cf_arena_floats(arena, B * 3 * E);
    p->argmax = cf_arena_bytes(arena, B * E * sizeof(int32_t));
    p->last = cf_arena_bytes(arena, B * sizeof(int32_t));
    p->count = cf_arena_floats(arena, B);
    m->dx.data = cf_arena_floats(arena, B * K * E);
    m->dx.shape = *in;
    m->grad_arena = NULL;
    cf_module *layers = pool_layers(m);
    cf_shape s = cf_shape2((int)B, 3 * (int)E);
    layers->ops->plan(layers, &s, arena);
}

/* fastai's masked_concat_pool: [output at the last non-padding column (index
 * -(padding in the last bptt columns) - 1), max over non-padding, mean over non-padding]. A row
 * with no token in the kept columns pools zeros (PyTorch would give -inf and nan). */
static const cf_tensor *pool_forward(cf_module *m, const cf_tensor *x) {
    pooling_impl *p = m->impl;
    m->in = x;
    const cf_tensor *ids = p->encoder->in;
    const int B = x->shape.dim[0], K = x->shape.dim[1], E = p->emb, T = ids->shape.dim[1];
    const int from = T - K, pad = ((const sentence_encoder_impl *)p->encoder->impl)->pad;
    const int tail = K < p->bptt ? K : p->bptt;
    for (int b = 0; b < B; b++) {
        const float *row_ids = ids->data + (size_t)b * T + from;
        const float *xb = x->data + (size_t)b * K * E;
        float *out = p->pooled + (size_t)b * 3 * E;
        int32_t *am = p->argmax + (size_t)b * E;
        int n = 0, tail_pads = 0;
        for (int t = 0; t < K; t++) {
            const bool is_pad = row_ids[t] == (float)pad;
            n += !is_pad;
            tail_pads += is_pad && t >= K - tail;
        }
        p->count[b] = (float)n;
        p->last[b] = tail_pads < K ? K - tail_pads - 1 : -1;
        for (int e = 0; e < E; e++) {
            out[e] = p->last[b] >= 0 ? xb[(size_t)p->last[b] * E + e] : 0.0f;
            am[e] = -1;
            out[E + e] = 0.0f;
            out[2 * E + e] = 0.0f;
        }
        for (int t = 0; t < K; t++) {
            if (row_ids[t] == (float)pad) continue;
            const float *xt = xb + (size_t)t * E;
            for (int e = 0; e < E; e++) {
                if (am[e] < 0 || xt[e] > out[E + e]) {
                    out[E + e] = xt[e];
                    am[e] = t;
                }
                out[2 * E + e] += xt[e];
            }
        }
        if (n > 0)
            for (int e = 0; e < E; e++) out[2 * E + e] /= (float)n;
    }
    p->pooled_t = cf_tensor_view(p->pooled, cf_shape2(B, 3 * E));
    cf_module *layers = pool_layers(m);
    layers->in = &p->pooled_t;
    return layers->ops->forward(layers, &p->pooled_t);
}

static const cf_tensor *pool_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    pooling_impl *p = m->impl;
    cf_module *layers = pool_layers(m);
    const cf_tensor *dp = layers->ops->backward(layers, dy, need_dx);
    if (!need_dx) return NULL;
    const cf_tensor *ids = p->encoder->in;
    const int B = m->in->shape.dim[0], K = m->in->shape.dim[1], E = p->emb, T = ids->shape.dim[1];
    const int from = T - K, pad = ((const sentence_encoder_impl *)p->encoder->impl)->pad;
    cf_tensor *dx = cf_module_input_grad(m);
    memset(dx->data, 0, cf_tensor_numel(dx) * sizeof(float));
    for (int b = 0; b < B; b++) {
        const float *g = dp->data + (size_t)b * 3 * E;
        float *db = dx->data + (size_t)b * K * E;
        const int32_t *am = p->argmax + (size_t)b * E;
        if (p->last[b] >= 0)
            for (int e = 0; e < E; e++) db[(size_t)p->last[b] * E + e] += g[e];
        for (int e = 0; e < E; e++)
            if (am[e] >= 0) db[(size_t)am[e] * E + e] += g[E + e];
        if (p->count[b] == 0.0f) continue;
        const float *row_ids = ids->data + (size_t)b * T + from;
        const float inv = 1.0f / p->count[b];
        for (int t = 0; t < K; t++) {
            if (row_ids[t] == (float)pad) continue;
            float *dt = db + (size_t)t * E;
            for (int e = 0; e < E; e++) dt[e] += g[2 * E + e] * inv;
        }
    }
    cf_module_give_grad(layers, dp->data, NULL);
    return dx;
}

static const cf_module_ops pooling_ops = {
    .kind = "PoolingLinearClassifier",
    .out_shape = pool_out_shape,
    .plan = pool_plan,
    .forward = pool_forward,
    .backward = pool_backward,
};

/* the init child: fastai's BatchNorm(n, ndim=1) on the first module of each LinBnDrop */
static cf_status bn_init_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    (void)m;
    *out = *in;
    return CF_OK;
}

static void bn_init(cf_module *m, cf_rng *rng) {
    (void)rng;
    const cf_module *layers = m->impl ? *(cf_module **)m->impl : NULL;
    for (int i = 0; layers && i < layers->n_children; i++) {
        cf_module *bn = layers->children[i]->children[0];
        for (int k = 0; k < bn->n_params; k++) {
            cf_param *q = &bn->params[k];
            const float v = strcmp(q->name, "weight") == 0 ? 1.0f
                            : strcmp(q->name, "bias") == 0 ? 1e-3f
                                                           : NAN;
            if (!isnan(v))
                for (size_t j = 0; j < q->numel; j++) q->data[j] = v;
        }
    }
}

static const cf_tensor *bn_init_forward(cf_module *m, const cf_tensor *x) {
    m->in = x;
    return x;
}

static const cf_tensor *bn_init_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    (void)m;
    return need_dx ? dy : NULL;
}

/* never run by the classifier; a pass-through should anything else walk it */
static const cf_module_ops bn_init_ops = {
    .kind = "InitHook",
    .out_shape = bn_init_out_shape,
    .init = bn_init,
    .forward = bn_init_forward,
    .backward = bn_init_backward,
};

/* fastai's LinBnDrop(n_in, n_out, bn=True, p, act): BatchNorm1d, Dropout(p) when p > 0,
 * Linear without bias, ReLU when relu */
static cf_module *lin_bn_drop(int n_in, int n_out, float p, bool relu) {
    cf_module *seq = cf_sequential(1, (cf_module *[]){cf_batchnorm1d(n_in)});
    bool ok = seq != NULL;
    if (ok && p > 0.0f) ok = cf_sequential_append(seq, cf_dropout(p)) == CF_OK;
    if (ok) ok = cf_sequential_append(seq, cf_linear(n_in, n_out, false)) == CF_OK;
    if (ok && relu) ok = cf_sequential_append(seq, cf_relu()) == CF_OK;
    if (!ok) {
        cf_module_free(seq);
        return NULL;
    }
    return seq;
}

cf_module *cf_pooling_linear_classifier(const cf_module *encoder, const int *dims, int n_dims,
                                        const float *ps) {
    if (!encoder || encoder->ops != &sentence_encoder_ops || !dims || n_dims < 2 || !ps) {
        cf_fail(CF_ERR_INVALID,
                "cf_pooling_linear_classifier: needs a SentenceEncoder, at least 2 dims and "
                "n_dims - 1 dropouts");
        return NULL;
    }
    const sentence_encoder_impl *s = encoder->impl;
    if (dims[0] != 3 * s->emb) {
        cf_fail(CF_ERR_INVALID,
                "cf_pooling_linear_classifier: dims[0] %d must be 3 * the encoder's size %d",
                dims[0], 3 * s->emb);
        return NULL;
    }
    for (int i = 0; i < n_dims; i++)
        if (dims[i] < 1 || (i < n_dims - 1 && !(ps[i] >= 0.0f && ps[i] <= 1.0f))) {
            cf_fail(CF_ERR_INVALID,
                    "cf_pooling_linear_classifier: dims[%d] %d must be >= 1 and ps[%d] %g in "
                    "[0, 1]",
                    i, dims[i], i, i < n_dims - 1 ? (double)ps[i] : 0.0);
            return NULL;
        }
    pooling_impl *p = cf_calloc(1, sizeof *p);
    if (!p) return NULL;
    *p = (pooling_impl){.encoder = encoder, .bptt = s->bptt, .emb = s->emb};
    cf_module *m = cf_module_new(&pooling_ops, p);
    if (!m) return NULL;
    cf_module *layers = cf_sequential(0, NULL);
    if (!layers || cf_module_add_child(m, layers, "layers") != CF_OK) goto fail;
    for (int i = 0; i + 1 < n_dims; i++) {
        cf_module *block = lin_bn_drop(dims[i], dims[i + 1], ps[i], i + 2 < n_dims);
        if (!block || cf_sequential_append(layers, block) != CF_OK) goto fail;
    }
    cf_module **target = cf_calloc(1, sizeof *target);
    if (!target) goto fail;
    *target = layers;
    cf_module *hook = cf_module_new(&bn_init_ops, target);
    if (!hook || cf_module_add_child(m, hook, "init") != CF_OK) goto fail;
    return m;
fail:
    cf_module_free(m);
    return NULL;
}

/* ---- get_text_classifier and its splitter -------------------------------------------------- */

cf_module *cf_text_classifier(int vocab_size, int n_class, const cf_awd_lstm_config *config,
                              float drop_mult, const cf_text_classifier_opts *opts) {
    const cf_awd_lstm_config c = config ? *config : cf_awd_lstm_clas_config();
    const cf_text_classifier_opts o = opts ? *opts : (cf_text_classifier_opts){0};
    const int seq_len = o.seq_len > 0 ? o.seq_len : 72;
    const int max_len = o.max_len == 0 ? 72 * 20 : o.max_len;
    const int default_ftrs[] = {50};
    const int *ftrs = o.lin_ftrs ? o.lin_ftrs : default_ftrs;
    const int n_ftrs = o.lin_ftrs ? o.n_lin_ftrs : 1;
    if (n_class < 1 || n_ftrs < 0 || n_ftrs > 14) {
        cf_fail(CF_ERR_INVALID, "cf_text_classifier: n_class %d (>= 1) or n_lin_ftrs %d (0..14)",
                n_class, n_ftrs);
        return NULL;
    }
    int dims[16];
    float ps[15];
    dims[0] = 3 * c.emb_sz;
    ps[0] = c.output_p * drop_mult; /* the first block drops with output_p (scaled) */
    for (int i = 0; i < n_ftrs; i++) {
        dims[1 + i] = ftrs[i];
        ps[1 + i] = o.ps ? o.ps[i] : 0.1f; /* not scaled by drop_mult */
    }
    dims[1 + n_ftrs] = n_class;
    cf_module *awd = cf_awd_lstm(vocab_size, &c, drop_mult);
    if (!awd) return NULL;
    cf_module *enc = cf_sentence_encoder(seq_len, awd, c.pad_token, max_len);
    if (!enc) return NULL;
    cf_module *head = cf_pooling_linear_classifier(enc, dims, n_ftrs + 2, ps);
    if (!head) {
        cf_module_free(enc);
        return NULL;
    }
    cf_module *clas = cf_sequential(2, (cf_module *[]){enc, head});
    /* batches of fewer rows and columns run within the plan of the first (the longest, as
     * fastai's SortedDL orders them): one plan a fit, not one a batch */
    if (clas) clas->seq_within_plan = true;
    return clas;
}

cf_status cf_split_text_classifier(cf_model *model) {
    cf_module *root = model->root;
    if (root->n_children != 2 || root->children[0]->ops != &sentence_encoder_ops ||
        root->children[1]->ops != &pooling_ops)
        return cf_fail(CF_ERR_INVALID, "cf_split_text_classifier: the model is not a text "
                                       "classifier (cf_text_classifier)");
    cf_module *awd = se_awd(root->children[0]);
    const int n = cf_nn_awd_lstm_layers(awd);
    cf_model_set_group(model, awd->children[0], 0); /* encoder (and encoder_dp) */
    for (int l = 0; l < n; l++) cf_model_set_group(model, awd->children[1 + l], 1 + l);
    cf_model_set_group(model, root->children[1], n + 1);
    model->n_groups = n + 2;
    return CF_OK;
}
