/* Linear (fully connected) layer: y = x W^T + b, as PyTorch's nn.Linear, through cf_sgemm
 * (OpenBLAS). */
#include "corefit/nn.h"

#include <math.h>

typedef struct linear_impl {
    int in_features, out_features;
    bool has_bias;
} linear_impl;

static cf_status linear_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    linear_impl *l = m->impl;
    if (in->ndim != 2 || in->dim[1] != l->in_features) {
        char s[64];
        return cf_fail(CF_ERR_INVALID, "Linear(%d, %d): input %s does not fit (expected (N, %d))",
                       l->in_features, l->out_features, cf_shape_str(in, s, sizeof s),
                       l->in_features);
    }
    *out = cf_shape2(in->dim[0], l->out_features);
    return CF_OK;
}

/* PyTorch's reset_parameters: kaiming_uniform_(a=sqrt(5)) on the weight, which is
 * U(-1/sqrt(in), 1/sqrt(in)), and the same bound for the bias. */
static void linear_init(cf_module *m, cf_rng *rng) {
    linear_impl *l = m->impl;
    double bound = 1.0 / sqrt((double)l->in_features);
    for (int i = 0; i < m->n_params; i++) {
        cf_param *p = &m->params[i];
        for (size_t k = 0; k < p->numel; k++)
            p->data[k] = (float)(bound * (2.0 * cf_rng_uniform(rng) - 1.0));
    }
}

static const cf_tensor *linear_forward(cf_module *m, const cf_tensor *x) {
    linear_impl *l = m->impl;
    m->in = x;
    const int n = x->shape.dim[0], in = l->in_features, out = l->out_features;
    cf_tensor *y = cf_module_output(m, &(cf_shape){.ndim = 2, .dim = {n, out}});
    const float *w = m->params[0].data;
    if (l->has_bias) {
        const float *b = m->params[1].data;
        for (int i = 0; i < n; i++) {
            float *restrict row = y->data + (size_t)i * out;
            for (int j = 0; j < out; j++) row[j] = b[j];
        }
    }
    cf_sgemm(false, true, n, out, in, 1.0f, x->data, in, w, in, l->has_bias ? 1.0f : 0.0f, y->data,
             out);
    return y;
}

static const cf_tensor *linear_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    linear_impl *l = m->impl;
    const cf_tensor *x = m->in;
    const int n = x->shape.dim[0], in = l->in_features, out = l->out_features;
    cf_param *w = &m->params[0];
    if (w->trainable) /* dW += dy^T x */
        cf_sgemm(true, false, out, in, n, 1.0f, dy->data, out, x->data, in, 1.0f, w->grad, in);
    if (l->has_bias && m->params[1].trainable) {
        float *restrict db = m->params[1].grad;
        for (int i = 0; i < n; i++) {
            const float *g = dy->data + (size_t)i * out;
            for (int j = 0; j < out; j++) db[j] += g[j];
        }
    }
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m); /* dx = dy W */
    cf_sgemm(false, false, n, in, out, 1.0f, dy->data, out, w->data, in, 0.0f, dx->data, in);
    return dx;
}

static const cf_module_ops linear_ops = {
    .kind = "Linear",
    .out_shape = linear_out_shape,
    .init = linear_init,
    .forward = linear_forward,
    .backward = linear_backward,
};

cf_module *cf_linear(int in_features, int out_features, bool bias) {
    if (in_features < 1 || out_features < 1) {
        cf_fail(CF_ERR_INVALID, "cf_linear: in_features %d and out_features %d must be >= 1",
                in_features, out_features);
        return NULL;
    }
    linear_impl *l = cf_calloc(1, sizeof *l);
    if (!l) return NULL;
    *l = (linear_impl){in_features, out_features, bias};
    cf_module *m = cf_module_new(&linear_ops, l);
    if (!m) return NULL;
    cf_module_add_param(m, "weight", CF_PARAM_WEIGHT, cf_shape2(out_features, in_features));
    if (bias) cf_module_add_param(m, "bias", CF_PARAM_BIAS, cf_shape1(out_features));
    return m;
}
