/* Layers against PyTorch: Linear, BatchNorm1d/2d, ReLU, LeakyReLU, Flatten, Embedding (outputs,
 * input and parameter gradients, BatchNorm buffers after two training forwards), Dropout
 * (mask statistics, scaling, reproducibility, eval identity), initialisation, finite-difference
 * checks of BatchNorm, and error messages.
 *
 * Tolerance: |corefit - torch| <= 1e-4 * |torch| + 1e-5 * max|torch| per element (rtol 1e-4 with
 * an absolute floor of 1e-5 of the tensor's scale, since sums are taken in different orders and
 * values near zero have no meaningful relative error). */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"

#define RTOL 1e-4
#define ATOL_SCALE 1e-5

static void check_floor(const char *what, const float *a, const float *b, size_t n, double floor) {
    double mx = 1e-30;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    assert_close(what, a, b, n, RTOL, fmax(ATOL_SCALE * mx, floor));
}

static void check(const char *what, const float *a, const float *b, size_t n) {
    check_floor(what, a, b, n, 0);
}

static float *rnd(size_t n, uint64_t seed, float lo, float hi) {
    float *x = malloc((n + 1) * sizeof(float));
    fill_uniform(x, n, seed, lo, hi);
    return x;
}

/* ---- one layer, one oracle case ------------------------------------------------------------ */

typedef struct lcase {
    cf_model *model;
    float *y, *dx;
    size_t ny, nx;
    bool has_dx;
    double dx_floor;
} lcase;

typedef void (*customise_fn)(cf_model *model, uint64_t seed);

typedef struct case_opts {
    cf_shape x;
    bool train, warm; /* warm: a first forward on another batch before the checked one */
    float lo, hi;     /* input range */
    int codes;        /* > 0: integer codes in [0, codes) instead of floats */
    customise_fn customise;
    double dx_floor; /* absolute tolerance floor for the input gradient (0: the default) */
} case_opts;

static void fill_input(float *x, size_t n, uint64_t seed, const case_opts *op) {
    fill_uniform(x, n, seed, op->lo, op->hi);
    if (op->codes > 0)
        for (size_t i = 0; i < n; i++) x[i] = floorf(x[i] * 0.999f * (float)op->codes);
}

/* Builds a model around `layer`, writes its parameters, runs forward (twice when warm) and
 * backward with a random upstream gradient, and records what corefit computed. */
static void run_case(oracle *o, lcase *c, int idx, cf_module *layer, case_opts op, char *args,
                     size_t args_size, const char *spec) {
    assert_non_null(layer);
    assert_int_equal(cf_model_new(&c->model, layer, 1000 + (uint64_t)idx), CF_OK);
    cf_model *model = c->model;
    if (op.customise) op.customise(model, 77 + (uint64_t)idx);
    char name[256];
    for (int j = 0; j < model->n_params; j++) {
        cf_param *p = model->params[j];
        snprintf(name, sizeof name, "c%d_p_%s", idx, p->full_name);
        oracle_put(o, name, p->data, p->shape);
    }
    cf_model_train(model, op.train);
    size_t nx = cf_shape_numel(&op.x);
    const cf_tensor *y;
    if (op.warm) {
        float *x0 = malloc(nx * sizeof(float));
        fill_input(x0, nx, 500 + (uint64_t)idx, &op);
        snprintf(name, sizeof name, "c%d_x0", idx);
        oracle_put(o, name, x0, op.x);
        cf_tensor t0 = cf_tensor_view(x0, op.x);
        assert_int_equal(cf_model_forward(model, &t0, &y), CF_OK);
        free(x0);
    }
    float *x = malloc(nx * sizeof(float));
    fill_input(x, nx, 600 + (uint64_t)idx, &op);
    snprintf(name, sizeof name, "c%d_x", idx);
    oracle_put(o, name, x, op.x);
    cf_tensor tx = cf_tensor_view(x, op.x);
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    c->ny = cf_tensor_numel(y);
    c->y = malloc(c->ny * sizeof(float));
    memcpy(c->y, y->data, c->ny * sizeof(float));
    float *dy = rnd(c->ny, 700 + (uint64_t)idx, -1, 1);
    snprintf(name, sizeof name, "c%d_dy", idx);
    oracle_put(o, name, dy, y->shape);
    cf_tensor tdy = cf_tensor_view(dy, y->shape);
    cf_model_zero_grad(model);
    c->has_dx = op.codes == 0;
    c->dx_floor = op.dx_floor;
    const cf_tensor *dx = model->root->ops->backward(model->root, &tdy, c->has_dx);
    if (c->has_dx) {
        assert_non_null(dx);
        assert_true(cf_shape_equal(&dx->shape, &op.x));
        c->nx = nx;
        c->dx = malloc(nx * sizeof(float));
        memcpy(c->dx, dx->data, nx * sizeof(float));
    }
    free(x);
    free(dy);
    size_t len = strlen(args);
    snprintf(args + len, args_size - len, " %d:%s:%s", idx, spec, op.train ? "train" : "eval");
}

static void compare_case(oracle *o, lcase *c, int idx) {
    char name[256], what[300];
    snprintf(name, sizeof name, "c%d_y", idx);
    cf_tensor ref = oracle_get(o, name);
    assert_int_equal(cf_tensor_numel(&ref), c->ny);
    snprintf(what, sizeof what, "case %d output", idx);
    check(what, c->y, ref.data, c->ny);
    free(ref.data);
    if (c->has_dx) {
        snprintf(name, sizeof name, "c%d_dx", idx);
        ref = oracle_get(o, name);
        assert_int_equal(cf_tensor_numel(&ref), c->nx);
        snprintf(what, sizeof what, "case %d input gradient", idx);
        check_floor(what, c->dx, ref.data, c->nx, c->dx_floor);
        free(ref.data);
    }
    for (int j = 0; j < c->model->n_params; j++) {
        cf_param *p = c->model->params[j];
        bool buffer = p->grad == NULL;
        snprintf(name, sizeof name, "c%d_%s_%s", idx, buffer ? "s" : "g", p->full_name);
        ref = oracle_get(o, name);
        assert_int_equal(cf_tensor_numel(&ref), p->numel);
        snprintf(what, sizeof what, "case %d %s %s", idx, buffer ? "buffer" : "gradient of",
                 p->full_name);
        check(what, buffer ? p->data : p->grad, ref.data, p->numel);
        free(ref.data);
    }
    cf_model_free(c->model);
    free(c->y);
    free(c->dx);
    memset(c, 0, sizeof *c);
}

typedef struct suite {
    oracle o;
    lcase cases[24];
    int n;
    char args[1024];
} suite;

static void suite_add(suite *s, cf_module *layer, case_opts op, const char *spec) {
    assert_true(s->n < 24);
    run_case(&s->o, &s->cases[s->n], s->n, layer, op, s->args, sizeof s->args, spec);
    s->n++;
}

static void suite_run(suite *s, const char *script) {
    oracle_run(&s->o, script, s->args);
    for (int i = 0; i < s->n; i++) compare_case(&s->o, &s->cases[i], i);
    oracle_cleanup(&s->o);
}

/* ---- Linear -------------------------------------------------------------------------------- */

static void test_linear_matches_pytorch(void **state) {
    (void)state;
    static suite s;
    memset(&s, 0, sizeof s);
    oracle_init(&s.o);
    case_opts op = {.train = true, .lo = -2, .hi = 2};
    op.x = cf_shape2(1, 7);
    suite_add(&s, cf_linear(7, 5, true), op, "linear:7,5,1");
    op.x = cf_shape2(13, 7);
    suite_add(&s, cf_linear(7, 5, true), op, "linear:7,5,1");
    op.x = cf_shape2(64, 128);
    suite_add(&s, cf_linear(128, 256, false), op, "linear:128,256,0");
    op.x = cf_shape2(64, 256);
    suite_add(&s, cf_linear(256, 10, false), op, "linear:256,10,0");
    op.x = cf_shape2(5, 3);
    suite_add(&s, cf_linear(3, 1, true), op, "linear:3,1,1");
    op.x = cf_shape2(9, 31);
    op.train = false;
    suite_add(&s, cf_linear(31, 17, true), op, "linear:31,17,1");
    suite_run(&s, "layers.py");
}

static void test_linear_init_and_errors(void **state) {
    (void)state;
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_linear(128, 256, true), 3), CF_OK);
    cf_param *w = cf_model_param(model, "weight"), *b = cf_model_param(model, "bias");
    assert_non_null(w);
    assert_non_null(b);
    assert_int_equal(w->kind, CF_PARAM_WEIGHT);
    assert_int_equal(b->kind, CF_PARAM_BIAS);
    assert_int_equal(w->shape.dim[0], 256);
    assert_int_equal(w->shape.dim[1], 128);
    double bound = 1.0 / sqrt(128.0), sq = 0;
    for (size_t i = 0; i < w->numel; i++) {
        assert_true(fabs(w->data[i]) <= bound);
        sq += (double)w->data[i] * w->data[i];
    }
    assert_true(fabs(sq / w->numel / (bound * bound / 3) - 1) < 0.05); /* U(-b, b) variance */
    for (size_t i = 0; i < b->numel; i++) assert_true(fabs(b->data[i]) <= bound);
    /* wrong input width */
    float x[3 * 100] = {0};
    cf_tensor t = cf_tensor_view(x, cf_shape2(3, 100));
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &t, &y), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "Linear(128, 256)"));
    assert_non_null(strstr(cf_last_error(), "(3, 100)"));
    cf_model_free(model);
    assert_null(cf_linear(0, 4, true));
    assert_non_null(strstr(cf_last_error(), "in_features 0"));
}

/* ---- BatchNorm ----------------------------------------------------------------------------- */

/* Random affine parameters and running statistics, and a counter that is not zero. */
static void randomise_bn(cf_model *model, uint64_t seed) {
    for (int j = 0; j < model->n_params; j++) {
        cf_param *p = model->params[j];
        const char *n = p->name;
        if (!strcmp(n, "weight")) fill_uniform(p->data, p->numel, seed, 0.5f, 1.5f);
        if (!strcmp(n, "bias")) fill_uniform(p->data, p->numel, seed + 1, -0.5f, 0.5f);
        if (!strcmp(n, "running_mean")) fill_uniform(p->data, p->numel, seed + 2, -0.5f, 0.5f);
        if (!strcmp(n, "running_var")) fill_uniform(p->data, p->numel, seed + 3, 0.5f, 2.0f);
        if (!strcmp(n, "num_batches_tracked")) p->data[0] = 3;
    }
}

static void test_batchnorm_matches_pytorch(void **state) {
    (void)state;
    static suite s;
    memset(&s, 0, sizeof s);
    oracle_init(&s.o);
    case_opts op = {.train = true, .warm = true, .lo = -1, .hi = 3, .customise = randomise_bn};
    /* BatchNorm1d, training: two forwards, then backward through the batch statistics. With a
     * batch of 2 the normalised output is +-1 whatever x is, so the input gradient is a
     * cancellation to nearly 0: it is compared with an absolute floor of 1e-5 of the upstream
     * gradient's scale (|dy| <= 1) instead. */
    op.x = cf_shape2(2, 5);
    op.dx_floor = 1e-5;
    suite_add(&s, cf_batchnorm1d(5), op, "bn1d:5,1e-5,0.1");
    op.dx_floor = 0;
    op.x = cf_shape2(17, 33);
    suite_add(&s, cf_batchnorm1d(33), op, "bn1d:33,1e-5,0.1");
    op.x = cf_shape2(64, 128);
    suite_add(&s, cf_batchnorm1d(128), op, "bn1d:128,1e-5,0.1");
    op.x = (cf_shape){.ndim = 3, .dim = {3, 4, 7}}; /* (N, C, L) */
    suite_add(&s, cf_batchnorm1d(4), op, "bn1d:4,1e-5,0.1");
    op.x = cf_shape2(6, 9);
    suite_add(&s, cf_batchnorm_ex(9, false, 1e-3f, 0.3f), op, "bn1d:9,1e-3,0.3");
    /* BatchNorm2d, training */
    op.x = cf_shape4(2, 3, 5, 7);
    suite_add(&s, cf_batchnorm2d(3), op, "bn2d:3,1e-5,0.1");
    op.x = cf_shape4(3, 5, 1, 1);
    suite_add(&s, cf_batchnorm2d(5), op, "bn2d:5,1e-5,0.1");
    op.x = cf_shape4(1, 2, 3, 3); /* batch 1 is valid with spatial dims */
    suite_add(&s, cf_batchnorm2d(2), op, "bn2d:2,1e-5,0.1");
    op.x = cf_shape4(4, 16, 28, 28); /* large enough for the threaded path */
    suite_add(&s, cf_batchnorm2d(16), op, "bn2d:16,1e-5,0.1");
    op.x = cf_shape4(2, 3, 70, 70); /* planes longer than one summation block */
    suite_add(&s, cf_batchnorm_ex(3, true, 1e-4f, 0.05f), op, "bn2d:3,1e-4,0.05");
    /* eval: running statistics, backward through the fixed affine; batch 1 is valid */
    op.train = false;
    op.x = cf_shape2(1, 5);
    suite_add(&s, cf_batchnorm1d(5), op, "bn1d:5,1e-5,0.1");
    op.x = cf_shape2(11, 6);
    suite_add(&s, cf_batchnorm1d(6), op, "bn1d:6,1e-5,0.1");
    op.x = cf_shape4(2, 3, 4, 5);
    suite_add(&s, cf_batchnorm2d(3), op, "bn2d:3,1e-5,0.1");
    op.x = cf_shape4(4, 16, 28, 28);
    suite_add(&s, cf_batchnorm2d(16), op, "bn2d:16,1e-5,0.1");
    suite_run(&s, "layers.py");
}

static void test_batchnorm_params_and_errors(void **state) {
    (void)state;
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_batchnorm2d(4), 1), CF_OK);
    const char *names[] = {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"};
    const cf_param_kind kinds[] = {CF_PARAM_NORM, CF_PARAM_NORM, CF_PARAM_BUFFER, CF_PARAM_BUFFER,
                                   CF_PARAM_COUNTER};
    const float init[] = {1, 0, 0, 1, 0};
    assert_int_equal(model->n_params, 5);
    for (int i = 0; i < 5; i++) {
        assert_string_equal(model->params[i]->full_name, names[i]);
        assert_int_equal(model->params[i]->kind, kinds[i]);
        for (size_t k = 0; k < model->params[i]->numel; k++)
            assert_true(model->params[i]->data[k] == init[i]);
    }
    assert_int_equal(model->params[4]->numel, 1);
    float x[2 * 3 * 4 * 4] = {0};
    const cf_tensor *y;
    cf_tensor t = cf_tensor_view(x, cf_shape4(2, 3, 4, 4));
    assert_int_equal(cf_model_forward(model, &t, &y), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "BatchNorm2d(4)"));
    assert_non_null(strstr(cf_last_error(), "(2, 3, 4, 4)"));
    cf_model_free(model);

    /* one value per channel in training is refused, as PyTorch does */
    assert_int_equal(cf_model_new(&model, cf_batchnorm1d(5), 1), CF_OK);
    t = cf_tensor_view(x, cf_shape2(1, 5));
    assert_int_equal(cf_model_forward(model, &t, &y), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "more than 1 value per channel"));
    cf_model_train(model, false);
    assert_int_equal(cf_model_forward(model, &t, &y), CF_OK);
    cf_model_free(model);

    assert_null(cf_batchnorm_ex(4, false, 0.0f, 0.1f));
    assert_non_null(strstr(cf_last_error(), "eps"));
    assert_null(cf_batchnorm_ex(4, true, 1e-5f, 1.5f));
    assert_null(cf_batchnorm1d(0));
}

/* L = sum(y * dy) in double. */
static double weighted_sum(cf_model *model, const cf_tensor *x, const float *dy) {
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, x, &y), CF_OK);
    double s = 0;
    for (size_t i = 0; i < cf_tensor_numel(y); i++) s += (double)y->data[i] * dy[i];
    return s;
}

/* Central differences against backward, in train and eval mode, for inputs and affine. */
static void fd_check_bn(cf_module *layer, cf_shape xs, bool train) {
    cf_model *model;
    assert_int_equal(cf_model_new(&model, layer, 5), CF_OK);
    randomise_bn(model, 9);
    cf_model_train(model, train);
    size_t n = cf_shape_numel(&xs);
    float *x = rnd(n, 11, -1, 2), *dy = rnd(n, 12, -1, 1);
    cf_tensor tx = cf_tensor_view(x, xs), tdy = cf_tensor_view(dy, xs);
    weighted_sum(model, &tx, dy);
    cf_model_zero_grad(model);
    const cf_tensor *dxt = model->root->ops->backward(model->root, &tdy, true);
    float *dx = malloc(n * sizeof(float));
    memcpy(dx, dxt->data, n * sizeof(float));
    const double h = 1e-2, tol_abs = 2e-3, tol_rel = 1e-2;
    for (size_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + (float)h;
        double lp = weighted_sum(model, &tx, dy);
        x[i] = keep - (float)h;
        double lm = weighted_sum(model, &tx, dy);
        x[i] = keep;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - dx[i]) > tol_abs + tol_rel * fabs(fd))
            fail_msg("BN %s d/dx[%zu]: backward %.6g, finite difference %.6g",
                     train ? "train" : "eval", i, dx[i], fd);
    }
    for (int j = 0; j < 2; j++) { /* weight, bias */
        cf_param *p = model->params[j];
        for (size_t k = 0; k < p->numel; k++) {
            float keep = p->data[k];
            p->data[k] = keep + (float)h;
            double lp = weighted_sum(model, &tx, dy);
            p->data[k] = keep - (float)h;
            double lm = weighted_sum(model, &tx, dy);
            p->data[k] = keep;
            double fd = (lp - lm) / (2 * h);
            if (fabs(fd - p->grad[k]) > tol_abs + tol_rel * fabs(fd))
                fail_msg("BN d/d%s[%zu]: backward %.6g, finite difference %.6g", p->name, k,
                         p->grad[k], fd);
        }
    }
    free(x);
    free(dy);
    free(dx);
    cf_model_free(model);
}

static void test_batchnorm_finite_differences(void **state) {
    (void)state;
    fd_check_bn(cf_batchnorm2d(2), cf_shape4(3, 2, 3, 3), true);
    fd_check_bn(cf_batchnorm1d(4), cf_shape2(6, 4), true);
    fd_check_bn(cf_batchnorm2d(3), cf_shape4(2, 3, 2, 2), false);
}

/* Results do not depend on the thread count, and large-batch statistics are accurate. */
static void test_batchnorm_threads_deterministic(void **state) {
    (void)state;
    cf_shape xs = cf_shape4(8, 16, 28, 28);
    size_t n = cf_shape_numel(&xs);
    float *x = rnd(n, 21, 99.0f, 101.0f), *dy = rnd(n, 22, -1, 1); /* large mean, small spread */
    float *out[2], *grad[2];
    for (int t = 0; t < 2; t++) {
        cf_set_num_threads(t == 0 ? 1 : 2);
        cf_model *model;
        assert_int_equal(cf_model_new(&model, cf_batchnorm2d(16), 1), CF_OK);
        const cf_tensor *y;
        cf_tensor tx = cf_tensor_view(x, xs), tdy = cf_tensor_view(dy, xs);
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        out[t] = malloc(n * sizeof(float));
        memcpy(out[t], y->data, n * sizeof(float));
        const cf_tensor *dx = model->root->ops->backward(model->root, &tdy, true);
        grad[t] = malloc(n * sizeof(float));
        memcpy(grad[t], dx->data, n * sizeof(float));
        /* normalised output: mean 0, variance 1 per channel (to float accuracy) */
        for (int c = 0; c < 16; c++) {
            double s = 0, sq = 0;
            for (int b = 0; b < 8; b++)
                for (int i = 0; i < 784; i++) {
                    double v = y->data[((size_t)b * 16 + c) * 784 + i];
                    s += v;
                    sq += v * v;
                }
            double mean = s / (8 * 784), var = sq / (8 * 784) - mean * mean;
            assert_true(fabs(mean) < 1e-4);
            assert_true(fabs(var - 1) < 1e-3);
        }
        cf_model_free(model);
    }
    cf_set_num_threads(2);
    assert_memory_equal(out[0], out[1], n * sizeof(float));
    assert_memory_equal(grad[0], grad[1], n * sizeof(float));
    for (int t = 0; t < 2; t++) {
        free(out[t]);
        free(grad[t]);
    }
    free(x);
    free(dy);
}

/* ---- ReLU, LeakyReLU, Flatten, Embedding --------------------------------------------------- */

static void test_activations_match_pytorch(void **state) {
    (void)state;
    static suite s;
    memset(&s, 0, sizeof s);
    oracle_init(&s.o);
    case_opts op = {.train = true, .lo = -2, .hi = 2};
    op.x = cf_shape4(3, 4, 5, 6);
    suite_add(&s, cf_relu(), op, "relu:");
    op.x = cf_shape2(1, 1);
    suite_add(&s, cf_relu(), op, "relu:");
    op.x = cf_shape4(3, 16, 40, 40); /* threaded path */
    suite_add(&s, cf_relu(), op, "relu:");
    op.x = cf_shape2(7, 13);
    suite_add(&s, cf_leaky_relu(0.01f), op, "leaky:0.01");
    op.x = cf_shape4(3, 16, 40, 40);
    suite_add(&s, cf_leaky_relu(0.3f), op, "leaky:0.3");
    op.x = cf_shape4(2, 3, 4, 5);
    suite_add(&s, cf_flatten(), op, "flatten:");
    op.x = cf_shape4(1, 7, 1, 1);
    suite_add(&s, cf_flatten(), op, "flatten:");
    /* Embedding: codes, repeated so that backward must accumulate rows */
    op.codes = 10;
    op.lo = 0;
    op.hi = 1;
    op.x = cf_shape1(7);
    suite_add(&s, cf_embedding(10, 4), op, "embedding:10,4");
    op.codes = 5;
    op.x = cf_shape2(6, 3);
    suite_add(&s, cf_embedding(5, 3), op, "embedding:5,3");
    op.codes = 3;
    op.x = cf_shape1(1);
    suite_add(&s, cf_embedding(3, 8), op, "embedding:3,8");
    suite_run(&s, "layers.py");
}

static void test_embedding_init_and_bad_codes(void **state) {
    (void)state;
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_embedding(1000, 32), 4), CF_OK);
    cf_param *w = cf_model_param(model, "weight");
    assert_int_equal(w->shape.dim[0], 1000);
    assert_int_equal(w->shape.dim[1], 32);
    double s = 0, sq = 0;
    for (size_t i = 0; i < w->numel; i++) {
        s += w->data[i];
        sq += (double)w->data[i] * w->data[i];
    }
    assert_true(fabs(s / w->numel) < 0.02);
    assert_true(fabs(sq / w->numel - 1) < 0.03);
    /* out-of-range, negative, fractional and NaN codes: zero rows, no gradient, counted */
    float codes[6] = {3, 1000, -1, 2.5f, NAN, 999};
    cf_tensor t = cf_tensor_view(codes, cf_shape1(6));
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &t, &y), CF_OK);
    assert_int_equal(cf_embedding_invalid_codes(model->root), 4);
    assert_memory_equal(y->data, w->data + 3 * 32, 32 * sizeof(float));
    assert_memory_equal(y->data + 5 * 32, w->data + 999 * 32, 32 * sizeof(float));
    for (int r = 1; r <= 4; r++)
        for (int j = 0; j < 32; j++) assert_true(y->data[r * 32 + j] == 0.0f);
    float dy[6 * 32];
    for (int i = 0; i < 6 * 32; i++) dy[i] = 1.0f;
    cf_tensor tdy = cf_tensor_view(dy, cf_shape2(6, 32));
    cf_model_zero_grad(model);
    assert_int_equal(cf_model_backward(model, &tdy), CF_OK);
    double total = 0;
    for (size_t i = 0; i < w->numel; i++) total += w->grad[i];
    assert_true(total == 2 * 32); /* only the two valid rows */
    assert_int_equal(cf_embedding_invalid_codes(NULL), -1);
    cf_model_free(model);
    assert_null(cf_embedding(0, 3));
}

/* ---- Dropout ------------------------------------------------------------------------------- */

/* x must stay valid until backward (the model keeps a pointer to it). */
static void dropout_forward(cf_model *model, const cf_tensor *x, float *out) {
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, x, &y), CF_OK);
    memcpy(out, y->data, cf_tensor_numel(x) * sizeof(float));
}

static void test_dropout(void **state) {
    (void)state;
    const float p = 0.3f, scale = 1.0f / (1.0f - p);
    cf_shape xs = cf_shape2(200, 501);
    size_t n = cf_shape_numel(&xs);
    float *x = rnd(n, 31, 0.5f, 1.5f), *dy = rnd(n, 32, -1, 1);
    float *y1 = malloc(n * sizeof(float)), *y2 = malloc(n * sizeof(float));
    float *y3 = malloc(n * sizeof(float));
    cf_tensor tx = cf_tensor_view(x, xs);
    cf_model *a, *b, *c;
    assert_int_equal(cf_model_new(&a, cf_dropout(p), 42), CF_OK);
    assert_int_equal(cf_model_new(&b, cf_dropout(p), 42), CF_OK);
    assert_int_equal(cf_model_new(&c, cf_dropout(p), 43), CF_OK);
    dropout_forward(a, &tx, y1);
    /* statistics and scaling */
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) {
        if (y1[i] == 0.0f)
            dropped++;
        else
            assert_true(y1[i] == x[i] * scale);
    }
    double frac = (double)dropped / n; /* std of the estimate is 0.002 */
    assert_true(fabs(frac - p) < 0.01);
    /* backward uses the same mask */
    cf_tensor tdy = cf_tensor_view(dy, xs);
    const cf_tensor *dx = a->root->ops->backward(a->root, &tdy, true);
    for (size_t i = 0; i < n; i++) assert_true(dx->data[i] == (y1[i] != 0.0f ? dy[i] * scale : 0));
    /* same seed, same mask; another seed or the next batch, another mask */
    dropout_forward(b, &tx, y2);
    assert_memory_equal(y1, y2, n * sizeof(float));
    dropout_forward(c, &tx, y3);
    assert_true(memcmp(y1, y3, n * sizeof(float)) != 0);
    dropout_forward(a, &tx, y2);
    assert_true(memcmp(y1, y2, n * sizeof(float)) != 0);
    /* eval: identity, forward and backward */
    cf_model_train(a, false);
    dropout_forward(a, &tx, y2);
    assert_memory_equal(y2, x, n * sizeof(float));
    dx = a->root->ops->backward(a->root, &tdy, true);
    assert_memory_equal(dx->data, dy, n * sizeof(float));
    cf_model_free(a);
    cf_model_free(b);
    cf_model_free(c);
    /* p = 0: identity in training; p = 1: everything dropped */
    assert_int_equal(cf_model_new(&a, cf_dropout(0.0f), 1), CF_OK);
    dropout_forward(a, &tx, y2);
    assert_memory_equal(y2, x, n * sizeof(float));
    cf_model_free(a);
    assert_int_equal(cf_model_new(&a, cf_dropout(1.0f), 1), CF_OK);
    dropout_forward(a, &tx, y2);
    for (size_t i = 0; i < n; i++) assert_true(y2[i] == 0.0f);
    cf_model_free(a);
    assert_null(cf_dropout(1.5f));
    assert_non_null(strstr(cf_last_error(), "1.5"));
    free(x);
    free(dy);
    free(y1);
    free(y2);
    free(y3);
}

/* ---- kaiming init -------------------------------------------------------------------------- */

static void test_kaiming_normal_init(void **state) {
    (void)state;
    cf_module *layers[] = {cf_linear(128, 256, true), cf_batchnorm1d(256),
                           cf_linear(256, 300, false), cf_embedding(50, 40)};
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_sequential(4, layers), 8), CF_OK);
    cf_param *bnw = cf_model_param(model, "1.weight"), *bnb = cf_model_param(model, "1.bias");
    for (size_t i = 0; i < bnw->numel; i++) bnw->data[i] = 5, bnb->data[i] = 7;
    cf_param *b0 = cf_model_param(model, "0.bias");
    cf_rng rng;
    cf_rng_seed(&rng, 123);
    cf_init_kaiming_normal(model->root, &rng);
    const char *names[] = {"0.weight", "2.weight", "3.weight"};
    const double fan_in[] = {128, 256, 40};
    for (int k = 0; k < 3; k++) {
        cf_param *w = cf_model_param(model, names[k]);
        double s = 0, sq = 0;
        for (size_t i = 0; i < w->numel; i++) {
            s += w->data[i];
            sq += (double)w->data[i] * w->data[i];
        }
        double var = sq / w->numel, expect = 2.0 / fan_in[k];
        assert_true(fabs(s / w->numel) < 4 * sqrt(expect / w->numel));
        if (fabs(var / expect - 1) > 0.06)
            fail_msg("%s: variance %g, expected %g", names[k], var, expect);
    }
    for (size_t i = 0; i < b0->numel; i++) assert_true(b0->data[i] == 0.0f);
    for (size_t i = 0; i < bnw->numel; i++) assert_true(bnw->data[i] == 5 && bnb->data[i] == 7);
    cf_model_free(model);
}

int main(void) {
    cf_set_num_threads(2); /* exercise the threaded paths on any machine */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_matches_pytorch),
        cmocka_unit_test(test_linear_init_and_errors),
        cmocka_unit_test(test_batchnorm_matches_pytorch),
        cmocka_unit_test(test_batchnorm_params_and_errors),
        cmocka_unit_test(test_batchnorm_finite_differences),
        cmocka_unit_test(test_batchnorm_threads_deterministic),
        cmocka_unit_test(test_activations_match_pytorch),
        cmocka_unit_test(test_embedding_init_and_bad_codes),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_kaiming_normal_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
