/* Linear (fully connected) layer: y = x W^T + b, as PyTorch's nn.Linear, through cf_sgemm
 * (OpenBLAS), or in mixed precision through cf_sgemm_bf16 (cf_linear_set_bf16). */
#include "corefit/nn.h"

#include <math.h>

typedef struct linear_impl {
    int in_features, out_features;
    bool has_bias;
    bool bf16; /* the three products in bf16 with fp32 sums (the bias and its sum stay fp32) */
} linear_impl;

/* C (+)= op(A) . op(B) in the layer's precision. */
static void linear_gemm(const linear_impl *l, bool ta, bool tb, int m, int n, int k, const float *a,
                        int lda, const float *b, int ldb, float *c, int ldc, bool accumulate) {
    if (l->bf16)
        cf_sgemm_bf16(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
    else
        cf_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

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
    linear_gemm(l, false, true, n, out, in, x->data, in, w, in, y->data, out, l->has_bias);
    return y;
}

/* Backward products of at least this many multiply-adds each run side by side on two of the
 * pool's threads, dW on one and dx on the other: each is the same whole call as on one thread,
 * so the results do not change. W1's Linear(128, 256): 2.1 M each, about 45 us apiece on a Zen 4
 * core, serial work the other thread waited on (bench/README.md, "Issue 32: a whole W1 run phase
 * by phase"). Splitting one product by rows is not bitwise: OpenBLAS may take another kernel or
 * another blocking for a part. */
#define LINEAR_PAIR_MIN (1 << 20)

typedef struct backward_pair {
    const linear_impl *l;
    int n, in, out;
    const float *dy, *x, *w;
    float *dw, *dx;
} backward_pair;

static void backward_pair_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const backward_pair *p = ctx;
    for (int64_t i = begin; i < end; i++) {
        if (i == 0) /* dW += dy^T x */
            linear_gemm(p->l, true, false, p->out, p->in, p->n, p->dy, p->out, p->x, p->in, p->dw,
                        p->in, true);
        else /* dx = dy W */
            linear_gemm(p->l, false, false, p->n, p->in, p->out, p->dy, p->out, p->w, p->in, p->dx,
                        p->in, false);
    }
}

/* db += the column sums of dy, where the layer has a trainable bias. */
static void add_bias_grad(cf_module *m, const cf_tensor *dy, int n, int out) {
    const linear_impl *l = m->impl;
    if (!l->has_bias || !m->params[1].trainable) return;
    float *restrict db = m->params[1].grad;
    for (int i = 0; i < n; i++) {
        const float *g = dy->data + (size_t)i * out;
        for (int j = 0; j < out; j++) db[j] += g[j];
    }
}

static const cf_tensor *linear_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    linear_impl *l = m->impl;
    const cf_tensor *x = m->in;
    const int n = x->shape.dim[0], in = l->in_features, out = l->out_features;
    cf_param *w = &m->params[0];
    cf_tensor *dx = need_dx ? cf_module_input_grad(m) : NULL;
    backward_pair p = {l, n, in, out, dy->data, x->data, w->data, w->grad, dx ? dx->data : NULL};
    /* product 0 is dW (when the weight trains), product 1 dx (when wanted) */
    const int64_t first = w->trainable ? 0 : 1, last = need_dx ? 2 : 1;
    if (last - first == 2 && cf_get_num_threads() >= 2 && (double)n * in * out >= LINEAR_PAIR_MIN)
        cf_parallel_for(2, backward_pair_range, &p);
    else
        backward_pair_range(&p, first, last, 0);
    add_bias_grad(m, dy, n, out);
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
    *l = (linear_impl){in_features, out_features, bias, false};
    cf_module *m = cf_module_new(&linear_ops, l);
    if (!m) return NULL;
    cf_module_add_param(m, "weight", CF_PARAM_WEIGHT, cf_shape2(out_features, in_features));
    if (bias) cf_module_add_param(m, "bias", CF_PARAM_BIAS, cf_shape1(out_features));
    return m;
}

int cf_linear_set_bf16(cf_module *root, bool on) {
    if (!root) return 0;
    int count = 0;
    if (root->ops == &linear_ops) {
        ((linear_impl *)root->impl)->bf16 = on;
        count++;
    }
    for (int i = 0; i < root->n_children; i++) count += cf_linear_set_bf16(root->children[i], on);
    return count;
}
