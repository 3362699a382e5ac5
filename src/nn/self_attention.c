/* fastai's SelfAttention(n_channels) (fastai/layers.py), as DynamicUnet(self_attention=True)
 * puts it after the second ConvLayer of one UnetBlock:
 *
 *   x (B, C, N = H*W); f = Wq x, g = Wk x (C/8 channels), h = Wv x (C channels), each a 1x1
 *   Conv1d without bias under spectral_norm; beta = softmax(f^T g, dim=1) (over the first N,
 *   for each column); out = gamma * (h beta) + x, gamma a parameter that starts at 0.
 *
 * spectral_norm (torch.nn.utils.spectral_norm, one power iteration, eps 1e-12): the weight used is
 * weight_orig / sigma with sigma = u^T W v; a training forward first updates the buffers
 * v = normalize(W^T u), u = normalize(W v); evaluation uses them as they are. The gradient flows
 * through sigma with u and v held constant: dW_orig = dW / sigma - <dW, W_orig> / sigma^2 u v^T.
 *
 * State-dict names are fastai's: "gamma", then "query.0", "key.0", "value.0", each with
 * weight_orig (n_out, C, 1), weight_u (n_out) and weight_v (C). The three convs are children
 * that only hold their parameters; this module does their arithmetic (cf_sgemm per image). */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <math.h>
#include <string.h>

enum { SA_Q, SA_K, SA_V };

/* ---- the spectral-normed 1x1 convolutions: parameter holders ------------------------------ */

static cf_status snconv_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    (void)m;
    *out = *in;
    return CF_OK;
}

static const cf_tensor *snconv_forward(cf_module *m, const cf_tensor *x) {
    (void)m;
    return x; /* never run alone: SelfAttention does the arithmetic */
}

static const cf_tensor *snconv_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    (void)m;
    return need_dx ? dy : NULL;
}

static void normalize(float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    const double norm = sqrt(s) > 1e-12 ? sqrt(s) : 1e-12;
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / norm);
}

/* fastai's apply_init reaches weight_orig (kaiming_normal_, fan_in = C); u and v start as
 * normalised standard normal draws, as spectral_norm's. */
static void snconv_init(cf_module *m, cf_rng *rng) {
    cf_param *w = &m->params[0], *u = &m->params[1], *v = &m->params[2];
    const double std = sqrt(2.0 / (double)w->shape.dim[1]);
    for (size_t i = 0; i < w->numel; i++) w->data[i] = (float)(std * cf_rng_normal(rng));
    for (size_t i = 0; i < u->numel; i++) u->data[i] = (float)cf_rng_normal(rng);
    for (size_t i = 0; i < v->numel; i++) v->data[i] = (float)cf_rng_normal(rng);
    normalize(u->data, (int)u->numel);
    normalize(v->data, (int)v->numel);
}

static const cf_module_ops snconv_ops = {
    .kind = "SpectralConv1d",
    .out_shape = snconv_out_shape,
    .init = snconv_init,
    .forward = snconv_forward,
    .backward = snconv_backward,
};

static cf_module *snconv(int n_in, int n_out) {
    cf_module *m = cf_module_new(&snconv_ops, NULL);
    if (!m) return NULL;
    if (!cf_module_add_param(m, "weight_orig", CF_PARAM_WEIGHT,
                             cf_shape_make(3, (int[]){n_out, n_in, 1})) ||
        !cf_module_add_param(m, "weight_u", CF_PARAM_BUFFER, cf_shape1(n_out)) ||
        !cf_module_add_param(m, "weight_v", CF_PARAM_BUFFER, cf_shape1(n_in))) {
        cf_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- SelfAttention -------------------------------------------------------------------------- */

typedef struct sa_impl {
    int c, c8;
    float *w[3];               /* the weights in use: weight_orig / sigma (c8 x c, c8 x c, c x c) */
    float *dw[3];              /* their gradients over the batch */
    float sigma[3];            /* at the last forward */
    float *wv_tmp;             /* W v (the largest n_out) */
    float *f, *g, *h;          /* per image of the batch: (c8, N), (c8, N), (c, N) */
    float *bt;                 /* beta transposed, (N, N) per image: bt[j][i] = beta[i][j] */
    float *hb;                 /* h beta, (c, N) per image */
    float *dbt, *dh, *df, *dg; /* backward scratch for one image */
} sa_impl;

static cf_param *sn_param(cf_module *m, int which, int k) {
    return &m->children[which]->children[0]->params[k];
}

static cf_status sa_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    const sa_impl *s = m->impl;
    if (in->ndim != 4 || in->dim[1] != s->c) {
        char b[64];
        return cf_fail(CF_ERR_INVALID, "SelfAttention(%d): input %s, expected (N, %d, H, W)", s->c,
                       cf_shape_str(in, b, sizeof b), s->c);
    }
    *out = *in;
    return CF_OK;
}

static void sa_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    sa_impl *s = m->impl;
    cf_module_plan_default(m, in, arena);
    const size_t b = (size_t)in->dim[0], n = (size_t)in->dim[2] * in->dim[3];
    s->f = cf_arena_floats(arena, b * s->c8 * n);
    s->g = cf_arena_floats(arena, b * s->c8 * n);
    s->h = cf_arena_floats(arena, b * s->c * n);
    s->hb = cf_arena_floats(arena, b * s->c * n);
    s->bt = cf_arena_floats(arena, b * n * n);
    s->dbt = cf_arena_floats(arena, n * n);
    s->dh = cf_arena_floats(arena, s->c * n);
    s->df = cf_arena_floats(arena, s->c8 * n);
    s->dg = cf_arena_floats(arena, s->c8 * n);
}

/* w = weight_orig / sigma for conv `which`, with one power iteration first when training. */
static void sa_weight(cf_module *m, int which) {
    sa_impl *s = m->impl;
    const cf_param *wo = sn_param(m, which, 0), *pu = sn_param(m, which, 1),
                   *pv = sn_param(m, which, 2);
    const int rows = wo->shape.dim[0], cols = wo->shape.dim[1];
    float *u = pu->data, *v = pv->data, *wv = s->wv_tmp;
    const float *w = wo->data;
    if (m->training) {
        for (int j = 0; j < cols; j++) v[j] = 0;
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) v[j] += w[(size_t)i * cols + j] * u[i];
        normalize(v, cols);
        for (int i = 0; i < rows; i++) {
            double a = 0;
            for (int j = 0; j < cols; j++) a += (double)w[(size_t)i * cols + j] * v[j];
            u[i] = (float)a;
        }
        normalize(u, rows);
    }
    double sigma = 0;
    for (int i = 0; i < rows; i++) {
        double a = 0;
        for (int j = 0; j < cols; j++) a += (double)w[(size_t)i * cols + j] * v[j];
        wv[i] = (float)a;
        sigma += (double)u[i] * a;
    }
    s->sigma[which] = (float)sigma;
    for (size_t k = 0; k < (size_t)rows * cols; k++) s->w[which][k] = (float)(w[k] / sigma);
}

static const cf_tensor *sa_forward(cf_module *m, const cf_tensor *x) {
    sa_impl *s = m->impl;
    m->in = x;
    for (int k = 0; k < 3; k++) sa_weight(m, k);
    const float gamma = m->params[0].data[0];
    cf_tensor *y = cf_module_output(m, &x->shape);
    const int b = x->shape.dim[0], c = s->c, c8 = s->c8, n = x->shape.dim[2] * x->shape.dim[3];
    for (int i = 0; i < b; i++) {
        const float *xi = x->data + (size_t)i * c * n;
        float *f = s->f + (size_t)i * c8 * n, *g = s->g + (size_t)i * c8 * n,
              *h = s->h + (size_t)i * c * n, *hb = s->hb + (size_t)i * c * n,
              *bt = s->bt + (size_t)i * n * n, *yi = y->data + (size_t)i * c * n;
        cf_sgemm(false, false, c8, n, c, 1.0f, s->w[SA_Q], c, xi, n, 0.0f, f, n);
        cf_sgemm(false, false, c8, n, c, 1.0f, s->w[SA_K], c, xi, n, 0.0f, g, n);
        cf_sgemm(false, false, c, n, c, 1.0f, s->w[SA_V], c, xi, n, 0.0f, h, n);
        /* bt = (f^T g)^T = g^T f, softmax along its rows (beta's columns) */
        cf_sgemm(true, false, n, n, c8, 1.0f, g, n, f, n, 0.0f, bt, n);
        for (int r = 0; r < n; r++) {
            float *row = bt + (size_t)r * n, mx = row[0];
            for (int q = 1; q < n; q++) mx = row[q] > mx ? row[q] : mx;
            double sum = 0;
            for (int q = 0; q < n; q++) sum += row[q] = expf(row[q] - mx);
            const float inv = (float)(1.0 / sum);
            for (int q = 0; q < n; q++) row[q] *= inv;
        }
        /* hb[c][j] = sum_i h[c][i] beta[i][j] = sum_i h[c][i] bt[j][i] */
        cf_sgemm(false, true, c, n, n, 1.0f, h, n, bt, n, 0.0f, hb, n);
        for (size_t k = 0; k < (size_t)c * n; k++) yi[k] = gamma * hb[k] + xi[k];
    }
    return y;
}

static const cf_tensor *sa_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    sa_impl *s = m->impl;
    const cf_tensor *x = m->in;
    const int b = x->shape.dim[0], c = s->c, c8 = s->c8, n = x->shape.dim[2] * x->shape.dim[3];
    const float gamma = m->params[0].data[0];
    cf_tensor *dx = need_dx ? cf_module_input_grad(m) : NULL;
    for (int k = 0; k < 3; k++)
        memset(s->dw[k], 0, (size_t)(k == SA_V ? c : c8) * c * sizeof(float));
    double dgamma = 0;
    for (int i = 0; i < b; i++) {
        const float *xi = x->data + (size_t)i * c * n, *dyi = dy->data + (size_t)i * c * n;
        const float *f = s->f + (size_t)i * c8 * n, *g = s->g + (size_t)i * c8 * n,
                    *h = s->h + (size_t)i * c * n, *hb = s->hb + (size_t)i * c * n,
                    *bt = s->bt + (size_t)i * n * n;
        for (size_t k = 0; k < (size_t)c * n; k++) dgamma += (double)dyi[k] * hb[k];
        /* d(h beta) = gamma dy: dh = gamma dy beta^T, dbt[j][i] = gamma sum_c dy[c][j] h[c][i] */
        cf_sgemm(false, false, c, n, n, gamma, dyi, n, bt, n, 0.0f, s->dh, n);
        cf_sgemm(true, false, n, n, c, gamma, dyi, n, h, n, 0.0f, s->dbt, n);
        /* softmax backward along bt's rows: dst = bt * (dbt - sum(bt * dbt)) */
        for (int r = 0; r < n; r++) {
            const float *p = bt + (size_t)r * n;
            float *d = s->dbt + (size_t)r * n;
            double dot = 0;
            for (int q = 0; q < n; q++) dot += (double)p[q] * d[q];
            for (int q = 0; q < n; q++) d[q] = p[q] * (d[q] - (float)dot);
        }
        /* S = f^T g, dst = dS^T: df = g dst, dg = f dst^T */
        cf_sgemm(false, false, c8, n, n, 1.0f, g, n, s->dbt, n, 0.0f, s->df, n);
        cf_sgemm(false, true, c8, n, n, 1.0f, f, n, s->dbt, n, 0.0f, s->dg, n);
        cf_sgemm(false, true, c8, c, n, 1.0f, s->df, n, xi, n, 1.0f, s->dw[SA_Q], c);
        cf_sgemm(false, true, c8, c, n, 1.0f, s->dg, n, xi, n, 1.0f, s->dw[SA_K], c);
        cf_sgemm(false, true, c, c, n, 1.0f, s->dh, n, xi, n, 1.0f, s->dw[SA_V], c);
        if (dx) {
            float *dxi = dx->data + (size_t)i * c * n;
            memcpy(dxi, dyi, (size_t)c * n * sizeof(float));
            cf_sgemm(true, false, c, n, c8, 1.0f, s->w[SA_Q], c, s->df, n, 1.0f, dxi, n);
            cf_sgemm(true, false, c, n, c8, 1.0f, s->w[SA_K], c, s->dg, n, 1.0f, dxi, n);
            cf_sgemm(true, false, c, n, c, 1.0f, s->w[SA_V], c, s->dh, n, 1.0f, dxi, n);
        }
    }
    if (m->params[0].grad) m->params[0].grad[0] += (float)dgamma;
    /* through W = W_orig / sigma, sigma = u^T W_orig v */
    for (int k = 0; k < 3; k++) {
        cf_param *wo = sn_param(m, k, 0);
        if (!wo->grad) continue;
        const float *u = sn_param(m, k, 1)->data, *v = sn_param(m, k, 2)->data;
        const int rows = wo->shape.dim[0], cols = wo->shape.dim[1];
        const double sigma = s->sigma[k];
        double dot = 0;
        for (size_t q = 0; q < (size_t)rows * cols; q++) dot += (double)s->dw[k][q] * wo->data[q];
        const double coef = dot / (sigma * sigma);
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < cols; q++) {
                const size_t at = (size_t)r * cols + q;
                wo->grad[at] += (float)(s->dw[k][at] / sigma - coef * u[r] * v[q]);
            }
    }
    return dx;
}

/* gamma starts at 0: the layer starts as the identity */
static void sa_init(cf_module *m, cf_rng *rng) {
    (void)rng;
    m->params[0].data[0] = 0.0f;
}

static void sa_destroy(cf_module *m) {
    sa_impl *s = m->impl;
    for (int k = 0; k < 3; k++) {
        cf_free(s->w[k]);
        cf_free(s->dw[k]);
    }
    cf_free(s->wv_tmp);
}

static const cf_module_ops sa_ops = {
    .kind = "SelfAttention",
    .out_shape = sa_out_shape,
    .plan = sa_plan,
    .init = sa_init,
    .forward = sa_forward,
    .backward = sa_backward,
    .destroy = sa_destroy,
};

cf_module *cf_self_attention(int n_channels) {
    if (n_channels < 8)
        return cf_fail(CF_ERR_INVALID, "SelfAttention(%d): needs at least 8 channels", n_channels),
               NULL;
    sa_impl *s = cf_calloc(1, sizeof *s);
    cf_module *m = s ? cf_module_new(&sa_ops, s) : NULL;
    if (!m) return cf_fail(CF_ERR_NOMEM, "SelfAttention(%d)", n_channels), NULL;
    const int c = n_channels, c8 = n_channels / 8;
    s->c = c;
    s->c8 = c8;
    bool ok = cf_module_add_param(m, "gamma", CF_PARAM_WEIGHT, cf_shape1(1)) != NULL;
    const char *names[3] = {"query", "key", "value"};
    for (int k = 0; k < 3 && ok; k++) {
        const int n_out = k == SA_V ? c : c8;
        s->w[k] = cf_malloc((size_t)n_out * c * sizeof(float));
        s->dw[k] = cf_malloc((size_t)n_out * c * sizeof(float));
        cf_module *conv = snconv(c, n_out);
        cf_module *holder = conv ? cf_sequential(1, &conv) : NULL;
        ok = s->w[k] && s->dw[k] && holder && cf_module_add_child(m, holder, names[k]) == CF_OK;
    }
    s->wv_tmp = ok ? cf_malloc((size_t)c * sizeof(float)) : NULL;
    if (!ok || !s->wv_tmp) {
        cf_module_free(m);
        return cf_fail(CF_ERR_NOMEM, "SelfAttention(%d)", n_channels), NULL;
    }
    return m;
}
