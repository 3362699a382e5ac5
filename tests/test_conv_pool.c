/* Conv2d and the pooling layers against PyTorch (tests/oracle/conv_pool.py), against central
 * finite differences in double, across thread counts, and their shape errors.
 *
 * Tolerance against PyTorch: |ours - ref| <= 1e-4 * |ref| + 1e-5 * max|ref| elementwise. The
 * reference is computed by PyTorch in float64 from the same float32 inputs and weights, so the
 * difference is corefit's float32 rounding only; the small absolute floor (relative to the
 * tensor's largest element) covers elements that are sums cancelling to near zero, where a
 * purely relative bound is meaningless. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"

#define RTOL 1e-4
#define ATOL_SCALE 1e-5

typedef enum layer_kind { CONV, MAXPOOL, AVGPOOL, AMAX, AAVG, CONCAT, AVGCEIL } layer_kind;

typedef struct layer_case {
    layer_kind kind;
    int a, b, k, s, p; /* conv: in, out, kernel, stride, padding; pools: k, s, p or (a, b) out */
    bool bias;
    int n, c, h, w; /* input shape */
    float quant;    /* > 0: inputs rounded to multiples of quant (ties for the max pools) */
    float lo, hi;   /* input range */
} layer_case;

static cf_module *make_layer(const layer_case *lc) {
    switch (lc->kind) {
    case CONV:
        return cf_conv2d(lc->a, lc->b, lc->k, lc->s, lc->p, lc->bias);
    case MAXPOOL:
        return cf_maxpool2d(lc->k, lc->s, lc->p);
    case AVGPOOL:
        return cf_avgpool2d(lc->k, lc->s, lc->p);
    case AMAX:
        return cf_adaptive_maxpool2d(lc->a, lc->b);
    case AAVG:
        return cf_adaptive_avgpool2d(lc->a, lc->b);
    case CONCAT:
        return cf_adaptive_concat_pool2d();
    case AVGCEIL:
        return cf_nn_avgpool2d_ceil(lc->k, lc->s, lc->p);
    }
    return NULL;
}

static void spec(const layer_case *lc, char *buf, size_t size) {
    int s = lc->s ? lc->s : lc->k;
    switch (lc->kind) {
    case CONV:
        snprintf(buf, size, "conv:%d:%d:%d", lc->s, lc->p, lc->bias ? 1 : 0);
        break;
    case MAXPOOL:
        snprintf(buf, size, "maxpool:%d:%d:%d", lc->k, s, lc->p);
        break;
    case AVGPOOL:
        snprintf(buf, size, "avgpool:%d:%d:%d", lc->k, s, lc->p);
        break;
    case AMAX:
        snprintf(buf, size, "amax:%d:%d", lc->a, lc->b);
        break;
    case AAVG:
        snprintf(buf, size, "aavg:%d:%d", lc->a, lc->b);
        break;
    case CONCAT:
        snprintf(buf, size, "concat");
        break;
    case AVGCEIL:
        snprintf(buf, size, "avgceil:%d:%d:%d", lc->k, s, lc->p);
        break;
    }
}

/* One layer run: forward, then backward with dx, on a model built around the layer. */
typedef struct run_result {
    cf_shape xs, ys;
    float *x, *dy, *y, *dx;
    float *w, *dw, *b, *db; /* conv parameters and their gradients (NULL for pools) */
    size_t nw, nb;
} run_result;

static float *copy_floats(const float *src, size_t n) {
    float *d = malloc((n + 1) * sizeof(float));
    assert_non_null(d);
    memcpy(d, src, n * sizeof(float));
    return d;
}

static void run_layer(const layer_case *lc, uint64_t seed, run_result *r) {
    memset(r, 0, sizeof *r);
    cf_model *model = NULL;
    cf_module *layer = make_layer(lc);
    assert_non_null(layer);
    assert_int_equal(cf_model_new(&model, layer, seed), CF_OK);
    r->xs = cf_shape4(lc->n, lc->c, lc->h, lc->w);
    size_t nx = cf_shape_numel(&r->xs);
    r->x = malloc(nx * sizeof(float));
    fill_uniform(r->x, nx, seed + 1, lc->lo, lc->hi);
    if (lc->quant > 0)
        for (size_t i = 0; i < nx; i++) r->x[i] = lc->quant * roundf(r->x[i] / lc->quant);
    cf_tensor x = cf_tensor_view(r->x, r->xs);
    const cf_tensor *y = NULL;
    if (cf_model_forward(model, &x, &y) != CF_OK) fail_msg("forward: %s", cf_last_error());
    r->ys = y->shape;
    size_t ny = cf_shape_numel(&r->ys);
    r->y = copy_floats(y->data, ny);
    r->dy = malloc(ny * sizeof(float));
    fill_uniform(r->dy, ny, seed + 2, -1.0f, 1.0f);
    cf_tensor dy = cf_tensor_view(r->dy, r->ys);
    cf_model_zero_grad(model);
    /* cf_model_backward asks the root for no dx; drive the root directly to get dx as well. */
    const cf_tensor *dx = model->root->ops->backward(model->root, &dy, true);
    assert_non_null(dx);
    assert_true(cf_shape_equal(&dx->shape, &r->xs));
    r->dx = copy_floats(dx->data, nx);
    cf_param *w = cf_model_param(model, "weight"), *b = cf_model_param(model, "bias");
    if (w) {
        r->nw = w->numel;
        r->w = copy_floats(w->data, w->numel);
        r->dw = copy_floats(w->grad, w->numel);
        /* The path without dx (cf_model_backward) gives the same parameter gradients, and a
         * second backward accumulates (+=). */
        cf_model_zero_grad(model);
        assert_int_equal(cf_model_backward(model, &dy), CF_OK);
        assert_memory_equal(w->grad, r->dw, w->numel * sizeof(float));
        assert_int_equal(cf_model_backward(model, &dy), CF_OK);
        for (size_t i = 0; i < w->numel; i++)
            assert_true(fabsf(w->grad[i] - 2 * r->dw[i]) <= 1e-6f * (1 + fabsf(r->dw[i])));
    }
    if (b) {
        r->nb = b->numel;
        r->b = copy_floats(b->data, b->numel);
        cf_model_zero_grad(model);
        assert_int_equal(cf_model_backward(model, &dy), CF_OK);
        r->db = copy_floats(b->grad, b->numel);
    }
    cf_model_free(model);
}

static void free_result(run_result *r) {
    free(r->x);
    free(r->dy);
    free(r->y);
    free(r->dx);
    free(r->w);
    free(r->dw);
    free(r->b);
    free(r->db);
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

static void check_against(const char *what, const float *ours, cf_tensor ref, size_t n) {
    assert_int_equal(cf_tensor_numel(&ref), n);
    assert_close(what, ours, ref.data, n, RTOL, ATOL_SCALE * max_abs(ref.data, n));
    free(ref.data);
}

/* Runs every case in C, then all of them through PyTorch in one oracle call, and compares. */
static void check_cases(const layer_case *cases, int n_cases) {
    cf_set_num_threads(2);
    run_result *res = calloc((size_t)n_cases, sizeof *res);
    oracle o;
    oracle_init(&o);
    char args[4096] = "";
    for (int i = 0; i < n_cases; i++) {
        run_layer(&cases[i], 100 + (uint64_t)i, &res[i]);
        char name[32], sp[64];
        snprintf(name, sizeof name, "c%d_x", i);
        oracle_put(&o, name, res[i].x, res[i].xs);
        snprintf(name, sizeof name, "c%d_dy", i);
        oracle_put(&o, name, res[i].dy, res[i].ys);
        if (res[i].w) {
            snprintf(name, sizeof name, "c%d_w", i);
            const layer_case *lc = &cases[i];
            oracle_put(&o, name, res[i].w, cf_shape4(lc->b, lc->a, lc->k, lc->k));
        }
        if (res[i].b) {
            snprintf(name, sizeof name, "c%d_b", i);
            oracle_put(&o, name, res[i].b, cf_shape1((int)res[i].nb));
        }
        spec(&cases[i], sp, sizeof sp);
        strcat(args, sp);
        strcat(args, " ");
    }
    oracle_run(&o, "conv_pool.py", args);
    for (int i = 0; i < n_cases; i++) {
        run_result *r = &res[i];
        char name[32], what[256], sp[64], xs[64];
        spec(&cases[i], sp, sizeof sp);
        cf_shape_str(&r->xs, xs, sizeof xs);
        snprintf(name, sizeof name, "c%d_y", i);
        cf_tensor ry = oracle_get(&o, name);
        assert_true(cf_shape_equal(&ry.shape, &r->ys));
        snprintf(what, sizeof what, "%s on %s: y", sp, xs);
        check_against(what, r->y, ry, cf_shape_numel(&r->ys));
        snprintf(name, sizeof name, "c%d_dx", i);
        snprintf(what, sizeof what, "%s on %s: dx", sp, xs);
        check_against(what, r->dx, oracle_get(&o, name), cf_shape_numel(&r->xs));
        if (r->dw) {
            snprintf(name, sizeof name, "c%d_dw", i);
            snprintf(what, sizeof what, "%s on %s: dweight", sp, xs);
            check_against(what, r->dw, oracle_get(&o, name), r->nw);
        }
        if (r->db) {
            snprintf(name, sizeof name, "c%d_db", i);
            snprintf(what, sizeof what, "%s on %s: dbias", sp, xs);
            check_against(what, r->db, oracle_get(&o, name), r->nb);
        }
        free_result(r);
    }
    free(res);
    oracle_cleanup(&o);
}

static void test_conv2d_matches_pytorch(void **state) {
    (void)state;
    const layer_case cases[] = {
        {CONV, 3, 5, 3, 1, 1, true, 2, 3, 9, 7, 0, -1, 1},       /* odd, non-square */
        {CONV, 4, 6, 3, 2, 1, false, 1, 4, 8, 8, 0, -1, 1},      /* batch 1, stride 2 */
        {CONV, 6, 4, 1, 1, 0, true, 3, 6, 7, 5, 0, -1, 1},       /* 1x1: no im2col */
        {CONV, 4, 8, 1, 2, 0, false, 2, 4, 9, 9, 0, -1, 1},      /* 1x1 stride-2 shortcut */
        {CONV, 2, 3, 5, 2, 2, true, 3, 2, 10, 6, 0, -1, 1},      /* 5x5 */
        {CONV, 3, 4, 2, 3, 0, true, 2, 3, 11, 8, 0, -1, 1},      /* stride > kernel, leftovers */
        {CONV, 2, 3, 3, 2, 2, true, 2, 2, 5, 6, 0, -1, 1},       /* padding > kernel/2 */
        {CONV, 16, 32, 3, 2, 1, false, 5, 16, 14, 14, 0, -1, 1}, /* W1 block conv, odd batch */
        {CONV, 1, 16, 3, 1, 1, false, 3, 1, 28, 28, 0, -1, 1},   /* W1 stem */
        {CONV, 2, 2, 3, 1, 0, true, 2, 2, 3, 3, 0, -1, 1},       /* output 1x1 */
        /* without a patch matrix (cf_conv_implicit_*): stride 1 and 2, bias, odd rows */
        {CONV, 8, 12, 3, 1, 1, true, 3, 8, 9, 7, 0, -1, 1},
        {CONV, 8, 8, 3, 2, 1, true, 2, 8, 10, 12, 0, -1, 1},
        {CONV, 9, 4, 5, 1, 2, false, 2, 9, 6, 7, 0, -1, 1},
    };
    check_cases(cases, (int)(sizeof cases / sizeof cases[0]));
}

static void test_pools_match_pytorch(void **state) {
    (void)state;
    const layer_case cases[] = {
        {MAXPOOL, 0, 0, 3, 2, 1, false, 2, 3, 9, 7, 0, -1, 1},
        {MAXPOOL, 0, 0, 2, 2, 0, false, 1, 2, 8, 8, 0, -1, 1},
        {MAXPOOL, 0, 0, 3, 1, 1, false, 2, 2, 5, 6, 0, -3, -1},     /* negative: pad is -inf */
        {MAXPOOL, 0, 0, 2, 0, 0, false, 2, 2, 7, 7, 0, -1, 1},      /* stride 0 = kernel */
        {MAXPOOL, 0, 0, 3, 1, 0, false, 2, 3, 6, 5, 0.5f, -1, 1},   /* many ties: first max */
        {MAXPOOL, 0, 0, 2, 2, 0, false, 2, 2, 36, 37, 0.5f, -1, 1}, /* 2x2: whole vectors, ties */
        {MAXPOOL, 0, 0, 3, 2, 1, false, 2, 3, 16, 17, 0.5f, -1, 1}, /* 3x3 s2: unrolled, ties */
        /* 3x3 s2 over cf_max_pool_3x3_s2_row's vectors: 16 outputs and a tail (35 a row), and
         * padding 0 (34); ties */
        {MAXPOOL, 0, 0, 3, 2, 1, false, 2, 2, 12, 70, 0.5f, -1, 1},
        {MAXPOOL, 0, 0, 3, 2, 0, false, 2, 2, 11, 69, 0.5f, -1, 1},
        {MAXPOOL, 0, 0, 3, 2, 0, false, 1, 2, 9, 10, 0.5f, -1, 1},
        {AVGPOOL, 0, 0, 3, 2, 1, false, 2, 3, 9, 7, 0, -1, 1},
        {AVGPOOL, 0, 0, 2, 2, 0, false, 1, 2, 8, 8, 0, -1, 1},
        {AVGPOOL, 0, 0, 3, 1, 1, false, 2, 2, 5, 6, 0, -1, 1},
        {AVGPOOL, 0, 0, 4, 3, 2, false, 2, 2, 9, 10, 0, -1, 1},
        {AAVG, 3, 2, 0, 0, 0, false, 2, 3, 7, 5, 0, -1, 1},
        {AAVG, 1, 1, 0, 0, 0, false, 2, 4, 7, 7, 0, -1, 1},
        {AAVG, 4, 4, 0, 0, 0, false, 1, 2, 3, 5, 0, -1, 1}, /* output taller than input */
        {AMAX, 3, 2, 0, 0, 0, false, 2, 3, 7, 5, 0, -1, 1},
        {AMAX, 5, 5, 0, 0, 0, false, 1, 2, 4, 6, 0, -1, 1},
        {AMAX, 2, 3, 0, 0, 0, false, 2, 2, 6, 7, 0.5f, -1, 1}, /* ties */
        {CONCAT, 0, 0, 0, 0, 0, false, 2, 4, 7, 7, 0, -1, 1},
        {CONCAT, 0, 0, 0, 0, 0, false, 1, 3, 5, 6, 0, -1, 1},
        {CONCAT, 0, 0, 0, 0, 0, false, 3, 2, 4, 4, 0.5f, -1, 1}, /* ties */
    };
    check_cases(cases, (int)(sizeof cases / sizeof cases[0]));
}

/* AvgPool2d(ceil_mode=True, count_include_pad=True), xresnet's shortcut pool: a map smaller
 * than the kernel still pools (1x1 under AvgPool2d(2): the pixel itself, as PyTorch), a last
 * window overhanging the input divides by its part inside the padded input, and a window that
 * would start in the right padding is dropped. */
static void test_avgpool_ceil_mode_matches_pytorch(void **state) {
    (void)state;
    const layer_case cases[] = {
        {AVGCEIL, 0, 0, 2, 2, 0, false, 2, 3, 1, 1, 0, -1, 1}, /* xresnet's 1x1 maps */
        {AVGCEIL, 0, 0, 2, 2, 0, false, 2, 2, 1, 3, 0, -1, 1}, /* 1 row, odd width */
        {AVGCEIL, 0, 0, 2, 2, 0, false, 1, 2, 3, 5, 0, -1, 1}, /* odd: a half window */
        {AVGCEIL, 0, 0, 2, 2, 0, false, 2, 2, 4, 6, 0, -1, 1}, /* even: as floor mode */
        {AVGCEIL, 0, 0, 3, 2, 1, false, 2, 2, 1, 2, 0, -1, 1}, /* padding, tiny input */
        {AVGCEIL, 0, 0, 3, 2, 1, false, 2, 2, 6, 7, 0, -1, 1},
        {AVGCEIL, 0, 0, 2, 2, 1, false, 2, 2, 5, 4, 0, -1, 1}, /* rows: a start in the padding */
        {AVGCEIL, 0, 0, 4, 3, 2, false, 1, 2, 2, 5, 0, -1, 1},
        {AVGCEIL, 0, 0, 3, 3, 0, false, 2, 2, 4, 3, 0, -1, 1}, /* 4 rows: a 1-row window */
    };
    check_cases(cases, (int)(sizeof cases / sizeof cases[0]));
    /* too small even for ceil_mode (PyTorch: output size 0): refused, naming the input */
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, cf_nn_avgpool2d_ceil(3, 2, 0), 1), CF_OK);
    float x[2] = {1, 2};
    cf_tensor t = cf_tensor_view(x, cf_shape4(1, 1, 1, 2));
    const cf_tensor *y = NULL;
    assert_int_not_equal(cf_model_forward(model, &t, &y), CF_OK);
    const char *msg = cf_last_error();
    if (!strstr(msg, "(1, 1, 1, 2)") || !strstr(msg, "too small"))
        fail_msg("error \"%s\" names neither the input nor the cause", msg);
    cf_model_free(model);
}

/* ---- second oracle: central differences in double on a direct double-precision loop ------- */

/* L = sum(y * dy) for y = conv(x, w) + b (b may be NULL), all in double. */
static double conv_loss(const layer_case *lc, const double *x, const double *w, const double *b,
                        const float *dy) {
    int oh = (lc->h + 2 * lc->p - lc->k) / lc->s + 1, ow = (lc->w + 2 * lc->p - lc->k) / lc->s + 1;
    double loss = 0;
    for (int n = 0; n < lc->n; n++)
        for (int o = 0; o < lc->b; o++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double acc = b ? b[o] : 0;
                    for (int c = 0; c < lc->a; c++)
                        for (int i = 0; i < lc->k; i++)
                            for (int j = 0; j < lc->k; j++) {
                                int iy = oy * lc->s - lc->p + i, ix = ox * lc->s - lc->p + j;
                                if (iy < 0 || iy >= lc->h || ix < 0 || ix >= lc->w) continue;
                                acc += x[((size_t)(n * lc->a + c) * lc->h + iy) * lc->w + ix] *
                                       w[((size_t)(o * lc->a + c) * lc->k + i) * lc->k + j];
                            }
                    loss += acc * dy[((size_t)(n * lc->b + o) * oh + oy) * ow + ox];
                }
    return loss;
}

/* L = sum(y * dy) for y = avg_pool2d(x) with count_include_pad, in double. */
static double avgpool_loss(const layer_case *lc, const double *x, const float *dy) {
    int oh = (lc->h + 2 * lc->p - lc->k) / lc->s + 1, ow = (lc->w + 2 * lc->p - lc->k) / lc->s + 1;
    double loss = 0;
    for (int pl = 0; pl < lc->n * lc->c; pl++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                double acc = 0;
                for (int i = 0; i < lc->k; i++)
                    for (int j = 0; j < lc->k; j++) {
                        int iy = oy * lc->s - lc->p + i, ix = ox * lc->s - lc->p + j;
                        if (iy < 0 || iy >= lc->h || ix < 0 || ix >= lc->w) continue;
                        acc += x[((size_t)pl * lc->h + iy) * lc->w + ix];
                    }
                loss += acc / (lc->k * lc->k) * dy[((size_t)pl * oh + oy) * ow + ox];
            }
    return loss;
}

static double *to_double(const float *a, size_t n) {
    double *d = malloc((n + 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = a[i];
    return d;
}

/* Central difference of the loss in one element of v; the analytic value must agree. */
static void check_fd(const char *what, double *v, size_t i, double analytic,
                     double (*loss)(const layer_case *, double *, void *), const layer_case *lc,
                     void *ctx) {
    const double h = 1e-3;
    double keep = v[i];
    v[i] = keep + h;
    double lp = loss(lc, v, ctx);
    v[i] = keep - h;
    double lm = loss(lc, v, ctx);
    v[i] = keep;
    double fd = (lp - lm) / (2 * h);
    if (!(fabs(fd - analytic) <= 1e-4 * fabs(fd) + 1e-5))
        fail_msg("%s[%zu]: analytic %.9g vs finite difference %.9g", what, i, analytic, fd);
}

typedef struct conv_fd_ctx {
    double *x, *w, *b;
    const float *dy;
    int which; /* 0: v is x, 1: v is w, 2: v is b */
} conv_fd_ctx;

static double conv_loss_of(const layer_case *lc, double *v, void *p) {
    conv_fd_ctx *c = p;
    return conv_loss(lc, c->which == 0 ? v : c->x, c->which == 1 ? v : c->w,
                     c->which == 2 ? v : c->b, c->dy);
}

static double avgpool_loss_of(const layer_case *lc, double *v, void *p) {
    return avgpool_loss(lc, v, p);
}

static void test_finite_differences(void **state) {
    (void)state;
    cf_set_num_threads(2);
    const layer_case convs[] = {
        {CONV, 3, 4, 3, 2, 1, true, 3, 3, 9, 8, 0, -1, 1},
        {CONV, 4, 3, 1, 2, 0, true, 2, 4, 7, 7, 0, -1, 1},
        {CONV, 2, 5, 3, 1, 1, true, 2, 2, 6, 5, 0, -1, 1},
    };
    for (size_t t = 0; t < sizeof convs / sizeof convs[0]; t++) {
        const layer_case *lc = &convs[t];
        run_result r;
        run_layer(lc, 7 + t, &r);
        size_t nx = cf_shape_numel(&r.xs);
        conv_fd_ctx c = {to_double(r.x, nx), to_double(r.w, r.nw), to_double(r.b, r.nb), r.dy, 0};
        /* The loss is exactly sum(y*dy): check it first, then the gradients. */
        double l = conv_loss(lc, c.x, c.w, c.b, r.dy), l32 = 0;
        for (size_t i = 0; i < cf_shape_numel(&r.ys); i++) l32 += (double)r.y[i] * r.dy[i];
        assert_true(fabs(l - l32) <= 1e-4 * fabs(l) + 1e-4);
        for (int k = 0; k < 8; k++) {
            size_t ix = (size_t)(k * 7919) % nx, iw = (size_t)(k * 131) % r.nw,
                   ib = (size_t)k % r.nb;
            c.which = 0;
            check_fd("conv dx", c.x, ix, r.dx[ix], conv_loss_of, lc, &c);
            c.which = 1;
            check_fd("conv dweight", c.w, iw, r.dw[iw], conv_loss_of, lc, &c);
            c.which = 2;
            check_fd("conv dbias", c.b, ib, r.db[ib], conv_loss_of, lc, &c);
        }
        /* Include the corner and the last element (padding borders). */
        c.which = 0;
        check_fd("conv dx", c.x, 0, r.dx[0], conv_loss_of, lc, &c);
        check_fd("conv dx", c.x, nx - 1, r.dx[nx - 1], conv_loss_of, lc, &c);
        free(c.x);
        free(c.w);
        free(c.b);
        free_result(&r);
    }
    const layer_case pools[] = {
        {AVGPOOL, 0, 0, 3, 2, 1, false, 2, 3, 9, 7, 0, -1, 1},
        {AVGPOOL, 0, 0, 2, 1, 1, false, 1, 2, 5, 6, 0, -1, 1},
    };
    for (size_t t = 0; t < sizeof pools / sizeof pools[0]; t++) {
        const layer_case *lc = &pools[t];
        run_result r;
        run_layer(lc, 17 + t, &r);
        size_t nx = cf_shape_numel(&r.xs);
        double *x = to_double(r.x, nx);
        for (int k = 0; k < 10; k++) {
            size_t ix = (size_t)(k * 7919) % nx;
            check_fd("avgpool dx", x, ix, r.dx[ix], avgpool_loss_of, lc, r.dy);
        }
        check_fd("avgpool dx", x, 0, r.dx[0], avgpool_loss_of, lc, r.dy);
        check_fd("avgpool dx", x, nx - 1, r.dx[nx - 1], avgpool_loss_of, lc, r.dy);
        free(x);
        free_result(&r);
    }
}

/* ---- threads -------------------------------------------------------------------------------- */

static void test_thread_counts_agree(void **state) {
    (void)state;
    const layer_case cases[] = {
        {CONV, 16, 32, 3, 2, 1, false, 7, 16, 14, 14, 0, -1, 1},
        {CONV, 6, 8, 1, 1, 0, true, 5, 6, 9, 9, 0, -1, 1},
        {CONV, 3, 4, 3, 1, 1, true, 3, 3, 10, 9, 0, -1, 1},
        {CONV, 8, 12, 3, 1, 1, true, 5, 8, 9, 7, 0, -1, 1}, /* implicit, stride 1 */
        {MAXPOOL, 0, 0, 3, 2, 1, false, 5, 3, 9, 7, 0, -1, 1},
        {AVGPOOL, 0, 0, 3, 2, 1, false, 5, 3, 9, 7, 0, -1, 1},
        {CONCAT, 0, 0, 0, 0, 0, false, 5, 6, 7, 7, 0, -1, 1},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        run_result one, many;
        cf_set_num_threads(1);
        run_layer(&cases[t], 55, &one);
        for (int threads = 2; threads <= 3; threads++) {
            cf_set_num_threads(threads);
            run_layer(&cases[t], 55, &many);
            /* Each image is computed by one thread the same way whatever the split: forward
             * and dx are bitwise equal; parameter gradients are summed per thread, then across
             * threads in order, so they agree to rounding. */
            assert_memory_equal(one.y, many.y, cf_shape_numel(&one.ys) * sizeof(float));
            assert_memory_equal(one.dx, many.dx, cf_shape_numel(&one.xs) * sizeof(float));
            if (one.dw)
                assert_close("dweight 1 vs N threads", many.dw, one.dw, one.nw, 1e-5,
                             1e-6 * max_abs(one.dw, one.nw));
            if (one.db)
                assert_close("dbias 1 vs N threads", many.db, one.db, one.nb, 1e-5,
                             1e-6 * max_abs(one.db, one.nb));
            free_result(&many);
        }
        free_result(&one);
    }
    cf_set_num_threads(0);
}

/* ---- init, arguments and shape errors ----------------------------------------------------- */

static void test_conv_init_is_pytorch_default(void **state) {
    (void)state;
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, cf_conv2d(32, 64, 3, 1, 1, true), 3), CF_OK);
    cf_param *w = cf_model_param(model, "weight"), *b = cf_model_param(model, "bias");
    assert_non_null(w);
    assert_non_null(b);
    assert_int_equal(w->kind, CF_PARAM_WEIGHT);
    assert_int_equal(b->kind, CF_PARAM_BIAS);
    assert_true(w->shape.ndim == 4 && w->shape.dim[0] == 64 && w->shape.dim[1] == 32 &&
                w->shape.dim[2] == 3 && w->shape.dim[3] == 3);
    assert_true(b->shape.ndim == 1 && b->shape.dim[0] == 64);
    /* kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 32*3*3. */
    double bound = 1.0 / sqrt(288.0), sum = 0, sq = 0, top = 0;
    for (size_t i = 0; i < w->numel; i++) {
        assert_true(fabs(w->data[i]) <= bound);
        sum += w->data[i];
        sq += (double)w->data[i] * w->data[i];
        top = fmax(top, fabs(w->data[i]));
    }
    double mean = sum / w->numel, var = sq / w->numel - mean * mean;
    assert_true(fabs(mean) < 0.05 * bound);
    assert_true(fabs(var / (bound * bound / 3) - 1) < 0.05);
    assert_true(top > 0.99 * bound);
    double btop = 0;
    for (size_t i = 0; i < b->numel; i++) {
        assert_true(fabs(b->data[i]) <= bound);
        btop = fmax(btop, fabs(b->data[i]));
    }
    assert_true(btop > 0.5 * bound);
    cf_model_free(model);
    /* Without bias there is only the weight. */
    assert_int_equal(cf_model_new(&model, cf_conv2d(3, 4, 3, 1, 1, false), 3), CF_OK);
    assert_null(cf_model_param(model, "bias"));
    assert_int_equal(model->n_weights, 4 * 3 * 3 * 3);
    cf_model_free(model);
}

static void expect_shape_error(cf_module *layer, cf_shape in, const char *const *needles) {
    cf_model *model = NULL;
    assert_non_null(layer);
    assert_int_equal(cf_model_new(&model, layer, 1), CF_OK);
    size_t n = cf_shape_numel(&in);
    float *data = calloc(n, sizeof(float));
    cf_tensor x = cf_tensor_view(data, in);
    const cf_tensor *y = NULL;
    assert_int_equal(cf_model_forward(model, &x, &y), CF_ERR_INVALID);
    const char *msg = cf_last_error();
    for (int i = 0; needles[i]; i++)
        if (!strstr(msg, needles[i])) fail_msg("error \"%s\" lacks \"%s\"", msg, needles[i]);
    free(data);
    cf_model_free(model);
}

static void test_shape_errors_are_clear(void **state) {
    (void)state;
    expect_shape_error(cf_conv2d(16, 32, 3, 2, 1, false), cf_shape4(2, 3, 8, 8),
                       (const char *[]){"Conv2d(16, 32, kernel_size=3, stride=2, padding=1",
                                        "expects 16 input channels", "(2, 3, 8, 8)", NULL});
    expect_shape_error(cf_conv2d(3, 4, 5, 1, 0, true), cf_shape4(1, 3, 4, 9),
                       (const char *[]){"Conv2d(3, 4, kernel_size=5", "(1, 3, 4, 9)",
                                        "smaller than the kernel", NULL});
    expect_shape_error(cf_conv2d(3, 4, 3, 1, 1, true), cf_shape2(4, 3),
                       (const char *[]){"Conv2d", "4-D", "(4, 3)", NULL});
    expect_shape_error(cf_maxpool2d(3, 2, 0), cf_shape4(2, 3, 2, 5),
                       (const char *[]){"MaxPool2d(kernel_size=3, stride=2, padding=0)",
                                        "(2, 3, 2, 5)", "smaller than the kernel", NULL});
    expect_shape_error(cf_avgpool2d(4, 0, 1), cf_shape4(1, 1, 1, 1),
                       (const char *[]){"AvgPool2d(kernel_size=4, stride=4, padding=1)",
                                        "smaller than the kernel", NULL});
    expect_shape_error(cf_adaptive_concat_pool2d(), cf_shape2(4, 8),
                       (const char *[]){"AdaptiveConcatPool2d", "4-D", "(4, 8)", NULL});
    expect_shape_error(cf_adaptive_maxpool2d(2, 2), cf_shape1(5),
                       (const char *[]){"AdaptiveMaxPool2d(output_size=(2, 2))", NULL});
    /* Inside a Sequential the child is named too. */
    cf_module *seq = cf_sequential(
        2, (cf_module *[]){cf_conv2d(1, 8, 3, 1, 1, false), cf_conv2d(4, 8, 3, 1, 1, false)});
    expect_shape_error(seq, cf_shape4(2, 1, 6, 6),
                       (const char *[]){"child 1", "expects 4 input channels", NULL});
}

static void test_bad_arguments_rejected(void **state) {
    (void)state;
    assert_null(cf_conv2d(0, 4, 3, 1, 1, true));
    assert_non_null(strstr(cf_last_error(), "in_channels=0"));
    assert_null(cf_conv2d(3, 4, 3, 0, 1, true));
    assert_non_null(strstr(cf_last_error(), "stride=0"));
    assert_null(cf_conv2d(3, 4, 3, 1, -1, true));
    assert_null(cf_maxpool2d(3, 1, 2)); /* padding > kernel/2, as PyTorch refuses */
    assert_non_null(strstr(cf_last_error(), "padding=2"));
    assert_null(cf_avgpool2d(0, 1, 0));
    assert_null(cf_adaptive_avgpool2d(0, 1));
    assert_non_null(strstr(cf_last_error(), "(0, 1)"));
    assert_null(cf_adaptive_maxpool2d(2, -1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_matches_pytorch),
        cmocka_unit_test(test_pools_match_pytorch),
        cmocka_unit_test(test_avgpool_ceil_mode_matches_pytorch),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_thread_counts_agree),
        cmocka_unit_test(test_conv_init_is_pytorch_default),
        cmocka_unit_test(test_shape_errors_are_clear),
        cmocka_unit_test(test_bad_arguments_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
