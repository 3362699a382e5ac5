/* Embedding: a lookup table of num_embeddings rows of `dim` floats, as PyTorch's nn.Embedding.
 *
 * Input (N) or (N, k) of category codes stored as floats; output (N, dim) or (N, k * dim) (the k
 * embeddings of a sample side by side, as fastai's TabularModel concatenates them). A code that
 * is not an integer in [0, num_embeddings) (negative, too large, fractional, NaN) cannot fail the
 * forward pass: it yields a row of zeros, receives no gradient, and is counted (see
 * cf_embedding_invalid_codes). Data loaders are expected to validate codes beforehand. */
#include "corefit/nn.h"

#include <math.h>
#include <string.h>

typedef struct embedding_impl {
    int num, dim;
    int64_t invalid; /* codes seen out of range since creation */
} embedding_impl;

static cf_status emb_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    embedding_impl *e = m->impl;
    if (in->ndim != 1 && in->ndim != 2) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "Embedding(%d, %d): input %s does not fit (expected (N) or (N, k) codes)",
                       e->num, e->dim, cf_shape_str(in, s, sizeof s));
    }
    int k = in->ndim == 2 ? in->dim[1] : 1;
    if ((int64_t)k * e->dim > INT32_MAX)
        return cf_fail(CF_ERR_INVALID, "Embedding(%d, %d): %d codes per sample is too many", e->num,
                       e->dim, k);
    *out = cf_shape2(in->dim[0], k * e->dim);
    return CF_OK;
}

/* PyTorch's default: N(0, 1). */
static void emb_init(cf_module *m, cf_rng *rng) {
    cf_param *w = &m->params[0];
    for (size_t i = 0; i < w->numel; i++) w->data[i] = (float)cf_rng_normal(rng);
}

static inline int64_t code_of(float v, int num) {
    if (!(v >= 0.0f && v < (float)num) || v != floorf(v)) return -1;
    return (int64_t)v;
}

static const cf_tensor *emb_forward(cf_module *m, const cf_tensor *x) {
    embedding_impl *e = m->impl;
    m->in = x;
    const int n = x->shape.dim[0], k = x->shape.ndim == 2 ? x->shape.dim[1] : 1;
    cf_tensor *y = cf_module_output(m, &(cf_shape){.ndim = 2, .dim = {n, k * e->dim}});
    const float *w = m->params[0].data;
    const size_t count = (size_t)n * k, dim = (size_t)e->dim;
    for (size_t i = 0; i < count; i++) {
        int64_t c = code_of(x->data[i], e->num);
        float *row = y->data + i * dim;
        if (c < 0) {
            memset(row, 0, dim * sizeof(float));
            e->invalid++;
        } else {
            memcpy(row, w + (size_t)c * dim, dim * sizeof(float));
        }
    }
    return y;
}

static const cf_tensor *emb_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    embedding_impl *e = m->impl;
    const cf_tensor *x = m->in;
    cf_param *w = &m->params[0];
    const size_t count = cf_tensor_numel(x), dim = (size_t)e->dim;
    if (w->trainable)
        for (size_t i = 0; i < count; i++) {
            int64_t c = code_of(x->data[i], e->num);
            if (c < 0) continue;
            float *restrict g = w->grad + (size_t)c * dim;
            const float *restrict d = dy->data + i * dim;
            for (size_t j = 0; j < dim; j++) g[j] += d[j];
        }
    if (!need_dx) return NULL;
    /* Codes are not differentiable: their gradient is zero. */
    cf_tensor *dx = cf_module_input_grad(m);
    memset(dx->data, 0, count * sizeof(float));
    return dx;
}

static const cf_module_ops embedding_ops = {
    .kind = "Embedding",
    .out_shape = emb_out_shape,
    .init = emb_init,
    .forward = emb_forward,
    .backward = emb_backward,
};

cf_module *cf_embedding(int num_embeddings, int dim) {
    if (num_embeddings < 1 || dim < 1) {
        cf_fail(CF_ERR_INVALID, "cf_embedding: num_embeddings %d and dim %d must be >= 1",
                num_embeddings, dim);
        return NULL;
    }
    embedding_impl *e = cf_calloc(1, sizeof *e);
    if (!e) return NULL;
    e->num = num_embeddings;
    e->dim = dim;
    cf_module *m = cf_module_new(&embedding_ops, e);
    if (!m) return NULL;
    cf_module_add_param(m, "weight", CF_PARAM_WEIGHT, cf_shape2(num_embeddings, dim));
    return m;
}

int64_t cf_embedding_invalid_codes(const cf_module *m) {
    if (!m || m->ops != &embedding_ops) return -1;
    return ((const embedding_impl *)m->impl)->invalid;
}
