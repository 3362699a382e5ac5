/* The model zoo against the same models built in PyTorch as fastai builds them
 * (tests/oracle/models.py): state_dict names and order, parameter counts, outputs, every
 * parameter gradient of L = sum(out * r) and the BatchNorm running statistics after one
 * training batch; fastai's initialisation; parameter groups; errors. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"

#define RTOL 1e-4

/* ---- helpers ------------------------------------------------------------------------------- */

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* Compares a corefit tensor with PyTorch's float64 result: |a - b| <= RTOL * |b| + atol with
 * atol = max(RTOL * max|b|, 4 * PyTorch's own float32 error on this tensor). The floor makes
 * the check relative to the tensor's scale for elements near zero (sums of many terms that
 * cancel); the second term accepts the rounding PyTorch itself has where the computation is
 * ill-conditioned (train-mode BatchNorm over a few values), so only larger errors fail.
 * ZOO_DEBUG=1 in the environment prints every comparison (marking failures) instead. */
static void check_close(const char *what, const float *a, const float *b, size_t n,
                        double torch_err) {
    double atol = fmax(RTOL * max_abs(b, n), 4.0 * torch_err);
    if (getenv("ZOO_DEBUG")) {
        double e = 0;
        for (size_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i]));
        fprintf(stderr, "%-70s corefit %.3g torch32 %.3g (of max %.3g)%s\n", what, e, torch_err,
                max_abs(b, n), e > atol ? " <<<" : "");
        return;
    }
    assert_close(what, a, b, n, RTOL, atol);
}

/* Gives BatchNorm affine parameters and running statistics random values (fastai's init sets
 * some weights to 0, which would hide gradients). */
static void randomize_norm(cf_model *model, uint64_t seed) {
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (int i = 0; i < model->n_params; i++) {
        cf_param *p = model->params[i];
        const char *n = p->name;
        for (size_t j = 0; j < p->numel; j++) {
            double u = cf_rng_uniform(&rng);
            if (p->kind == CF_PARAM_NORM && strcmp(n, "weight") == 0)
                p->data[j] = (float)(0.5 + u);
            else if (p->kind == CF_PARAM_NORM)
                p->data[j] = (float)(0.4 * u - 0.2);
            else if (strcmp(n, "running_mean") == 0)
                p->data[j] = (float)(0.2 * u - 0.1);
            else if (strcmp(n, "running_var") == 0)
                p->data[j] = (float)(0.5 + u);
        }
    }
}

static float scalar(oracle *o, const char *name) {
    cf_tensor t = oracle_get(o, name);
    float v = t.data[0];
    free(t.data);
    return v;
}

typedef struct zoo_case {
    const char *args; /* models.py arguments (model and options) */
    cf_shape in;
    bool train;
    int n_cat; /* tabular: leading code columns */
    const int *cards;
} zoo_case;

/* Builds the model, sends its state to PyTorch, runs one batch in both and compares. */
static void run_case(cf_module *root, const zoo_case *c) {
    assert_non_null(root);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, root, 1234), CF_OK);
    randomize_norm(model, 99);
    oracle o;
    oracle_init(&o);

    char path[512];
    snprintf(path, sizeof path, "%s/names.txt", o.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < model->n_params; i++) {
        cf_param *p = model->params[i];
        fprintf(f, "%s\n", p->full_name);
        char name[32];
        snprintf(name, sizeof name, "s%d", i);
        oracle_put(&o, name, p->data, p->shape.ndim ? p->shape : cf_shape1(1));
    }
    fclose(f);

    size_t nx = cf_shape_numel(&c->in);
    float *x = malloc(nx * sizeof(float));
    fill_uniform(x, nx, 7, -1.0f, 1.0f);
    if (c->n_cat) {
        cf_rng rng;
        cf_rng_seed(&rng, 8);
        int f_cols = c->in.dim[1];
        for (int r = 0; r < c->in.dim[0]; r++)
            for (int j = 0; j < c->n_cat; j++)
                x[r * f_cols + j] = (float)cf_rng_below(&rng, (uint64_t)c->cards[j]);
    }
    oracle_put(&o, "x", x, c->in);
    cf_tensor xt = cf_tensor_view(x, c->in);

    cf_model_train(model, c->train);
    cf_model_zero_grad(model);
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
    size_t ny = cf_tensor_numel(y);
    float *r = malloc(ny * sizeof(float));
    fill_uniform(r, ny, 9, -1.0f, 1.0f);
    oracle_put(&o, "r", r, y->shape);
    cf_tensor rt = cf_tensor_view(r, y->shape);
    float *out = malloc(ny * sizeof(float));
    memcpy(out, y->data, ny * sizeof(float));
    assert_int_equal(cf_model_backward(model, &rt), CF_OK);

    char args[512];
    snprintf(args, sizeof args, "%s mode=%s", c->args, c->train ? "train" : "eval");
    oracle_run(&o, "models.py", args);

    /* names: exactly torch's state_dict keys, in the same order */
    oracle_assert_param_names(&o, model, c->args);
    assert_int_equal((int64_t)cf_model_num_weights(model), (int64_t)scalar(&o, "nweights"));
    assert_int_equal((int64_t)model->n_buffers, (int64_t)scalar(&o, "nbuffers"));

    cf_tensor terr = oracle_get(&o, "torch_err");
    assert_int_equal(cf_shape_numel(&terr.shape), model->n_params + 1);
    cf_tensor ref = oracle_get(&o, "out");
    assert_int_equal(cf_shape_numel(&ref.shape), ny);
    check_close("output", out, ref.data, ny, terr.data[model->n_params]);
    free(ref.data);

    for (int i = 0; i < model->n_params; i++) {
        cf_param *p = model->params[i];
        char name[32], what[300];
        bool buffer = p->grad == NULL;
        snprintf(name, sizeof name, "%s%d", buffer ? "b" : "g", i);
        snprintf(what, sizeof what, "%s %s of %s", buffer ? "buffer" : "gradient", p->full_name,
                 c->args);
        cf_tensor t = oracle_get(&o, name);
        assert_int_equal(cf_shape_numel(&t.shape) ? cf_shape_numel(&t.shape) : 1, p->numel);
        check_close(what, buffer ? p->data : p->grad, t.data, p->numel, terr.data[i]);
        free(t.data);
    }
    free(terr.data);
    free(x);
    free(r);
    free(out);
    oracle_cleanup(&o);
    cf_model_free(model);
}

static cf_head_opts no_dropout_head(void) {
    cf_head_opts h = cf_head_defaults();
    h.n_ps = 1;
    h.ps[0] = 0.0f;
    return h;
}

/* ---- W1 ------------------------------------------------------------------------------------ */

static void test_mini_resnet_train(void **state) {
    (void)state;
    cf_head_opts h = cf_head_defaults();
    h.n_lin_ftrs = 1;
    h.lin_ftrs[0] = 256;
    h.n_ps = 2;
    h.ps[0] = h.ps[1] = 0.0f;
    zoo_case c = {"w1 c_in=1 n_out=10 ps=0,0", cf_shape4(4, 1, 28, 28), true, 0, NULL};
    run_case(cf_mini_resnet_ex(1, 10, &h), &c);
}

static void test_mini_resnet_eval(void **state) {
    (void)state;
    /* the W1 model as specified (dropout 0.25 and 0.5 present): names and eval outputs */
    zoo_case c = {"w1 c_in=1 n_out=10", cf_shape4(3, 1, 28, 28), false, 0, NULL};
    run_case(cf_mini_resnet(1, 10), &c);
}

/* ---- xresnet ------------------------------------------------------------------------------- */

static void test_xresnet18_small_train(void **state) {
    (void)state;
    cf_xresnet_opts o = cf_xresnet_defaults();
    o.c_in = 1;
    o.small_images = true;
    o.head = no_dropout_head();
    zoo_case c = {"xresnet depth=18 c_in=1 small=1 n_out=10 ps=0", cf_shape4(8, 1, 28, 28), true, 0,
                  NULL};
    run_case(cf_xresnet(18, 10, &o), &c);
}

static void test_xresnet18_standard_eval(void **state) {
    (void)state;
    zoo_case c = {"xresnet depth=18 c_in=3 n_out=7", cf_shape4(2, 3, 28, 28), false, 0, NULL};
    run_case(cf_xresnet18(3, 7), &c);
}

/* The deeper ones in eval mode (BatchNorm with running statistics): train-mode BatchNorm over
 * the few values a small test batch leaves in the last stages is too ill-conditioned in float32
 * (PyTorch's own float32 result differs from float64 by percents there) to check anything. */
static void test_xresnet34_eval(void **state) {
    (void)state;
    zoo_case c = {"xresnet depth=34 c_in=3 n_out=5", cf_shape4(2, 3, 32, 32), false, 0, NULL};
    run_case(cf_xresnet34(3, 5), &c);
}

/* cf_xresnet50 (fastai's defaults, RGB; small_images is covered by xresnet18): names, parameter
 * and buffer counts, output size, outputs and gradients of PyTorch's build of fastai's xresnet50
 * with create_head(2048, 10). */
static void test_xresnet50_eval(void **state) {
    (void)state;
    zoo_case c = {"xresnet depth=50 c_in=3 n_out=10", cf_shape4(2, 3, 32, 32), false, 0, NULL};
    run_case(cf_xresnet50(3, 10), &c);
}

/* ---- heads --------------------------------------------------------------------------------- */

static void test_head_variants(void **state) {
    (void)state;
    /* lin_first, bn_final, y_range, two hidden layers, one p */
    cf_head_opts h = cf_head_defaults();
    h.n_lin_ftrs = 2;
    h.lin_ftrs[0] = 24;
    h.lin_ftrs[1] = 12;
    h.n_ps = 1;
    h.ps[0] = 0.0f;
    h.lin_first = true;
    h.bn_final = true;
    h.y_range = true;
    h.y_lo = -1.0f;
    h.y_hi = 3.0f;
    zoo_case c = {"head nf=8 n_out=3 lin_ftrs=24,12 ps=0 lin_first=1 bn_final=1 y_range=-1,3",
                  cf_shape4(5, 8, 3, 3), true, 0, NULL};
    run_case(cf_create_head(8, 3, &h), &c);

    /* average pool, no first BatchNorm (the first Linear gets a bias), no hidden layer */
    h = cf_head_defaults();
    h.n_lin_ftrs = 0;
    h.n_ps = 1;
    h.ps[0] = 0.0f;
    h.concat_pool = false;
    h.first_bn = false;
    zoo_case c2 = {"head nf=6 n_out=4 lin_ftrs= ps=0 concat_pool=0 first_bn=0",
                   cf_shape4(4, 6, 5, 5), true, 0, NULL};
    run_case(cf_create_head(6, 4, &h), &c2);

    /* fastai's defaults, eval (Dropout 0.25 and 0.5 present) */
    zoo_case c3 = {"head nf=16 n_out=2", cf_shape4(3, 16, 2, 2), false, 0, NULL};
    run_case(cf_create_head(16, 2, NULL), &c3);
}

/* ---- SimpleCNN ----------------------------------------------------------------------------- */

static void test_simple_cnn(void **state) {
    (void)state;
    const int filters[4] = {1, 8, 16, 10};
    zoo_case c = {"simple_cnn filters=1,8,16,10", cf_shape4(4, 1, 28, 28), true, 0, NULL};
    run_case(cf_simple_cnn(4, filters, NULL, NULL, true), &c);
    const int ks[2] = {5, 3}, st[2] = {1, 2}, f2[3] = {3, 6, 4};
    zoo_case c2 = {"simple_cnn filters=3,6,4 ks=5,3 strides=1,2 bn=0", cf_shape4(3, 3, 9, 9), true,
                   0, NULL};
    run_case(cf_simple_cnn(3, f2, ks, st, false), &c2);
}

/* ---- TabularModel -------------------------------------------------------------------------- */

static void test_tabular(void **state) {
    (void)state;
    const int cards[3] = {5, 12, 3};
    /* default options (layers [200, 100], no dropout), embedding sizes by emb_sz_rule */
    zoo_case c = {"tabular cards=5,12,3 n_cont=4 n_out=3", cf_shape2(6, 7), true, 3, cards};
    run_case(cf_tabular_model(3, cards, NULL, 4, 3, NULL), &c);

    /* lin_first false, bn_final, y_range, explicit sizes */
    cf_tabular_opts t = cf_tabular_defaults();
    t.n_layers = 2;
    t.layers[0] = 16;
    t.layers[1] = 8;
    t.lin_first = false;
    t.bn_final = true;
    t.y_range = true;
    t.y_lo = 0.0f;
    t.y_hi = 5.0f;
    const int dims[3] = {2, 0, 4};
    zoo_case c2 = {"tabular cards=5,12,3 dims=2,6,4 n_cont=2 n_out=1 layers=16,8 lin_first=0 "
                   "bn_final=1 y_range=0,5",
                   cf_shape2(5, 5), true, 3, cards};
    assert_int_equal(cf_emb_sz_rule(12), 6); /* round(1.6 * 12^0.56) = round(6.43) */
    run_case(cf_tabular_model(3, cards, dims, 2, 1, &t), &c2);

    /* dropout everywhere, compared in eval mode (names include the Dropout positions) */
    t = cf_tabular_defaults();
    t.n_ps = 2;
    t.ps[0] = 0.1f;
    t.ps[1] = 0.2f;
    t.embed_p = 0.3f;
    zoo_case c3 = {"tabular cards=5,12,3 n_cont=3 n_out=2 ps=0.1,0.2 embed_p=0.3", cf_shape2(4, 6),
                   false, 3, cards};
    run_case(cf_tabular_model(3, cards, NULL, 3, 2, &t), &c3);

    /* categories only; continuous only */
    zoo_case c4 = {"tabular cards=5,12 n_cont=0 n_out=2 layers=8", cf_shape2(4, 2), true, 2, cards};
    t = cf_tabular_defaults();
    t.n_layers = 1;
    t.layers[0] = 8;
    run_case(cf_tabular_model(2, cards, NULL, 0, 2, &t), &c4);
    zoo_case c5 = {"tabular cards= n_cont=3 n_out=2 layers=8", cf_shape2(4, 3), true, 0, NULL};
    run_case(cf_tabular_model(0, NULL, NULL, 3, 2, &t), &c5);
}

static void test_emb_sz_rule(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    oracle_run(&o, "models.py", "emb_sz_rule n=3000");
    cf_tensor r = oracle_get(&o, "rule");
    for (int i = 1; i <= 3000; i++)
        if (cf_emb_sz_rule(i) != (int)r.data[i - 1])
            fail_msg("emb_sz_rule(%d) = %d, fastai %d", i, cf_emb_sz_rule(i), (int)r.data[i - 1]);
    free(r.data);
    oracle_cleanup(&o);
}

/* ---- initialisation ------------------------------------------------------------------------ */

static void moments(const cf_param *p, double *mean, double *std) {
    double s = 0, q = 0;
    for (size_t i = 0; i < p->numel; i++) {
        s += p->data[i];
        q += (double)p->data[i] * p->data[i];
    }
    *mean = s / (double)p->numel;
    *std = sqrt(q / (double)p->numel - *mean * *mean);
}

static cf_param *param(cf_model *m, const char *name) {
    cf_param *p = cf_model_param(m, name);
    if (!p) fail_msg("no parameter %s", name);
    return p;
}

static void assert_all(const cf_param *p, float v) {
    for (size_t i = 0; i < p->numel; i++)
        if (p->data[i] != v) fail_msg("%s[%zu] = %g, expected %g", p->full_name, i, p->data[i], v);
}

static void test_xresnet_init(void **state) {
    (void)state;
    cf_model *m;
    assert_int_equal(cf_model_new(&m, cf_xresnet(18, 10, NULL), 5), CF_OK);
    /* init_cnn: BatchZero weights 0, every other BatchNorm weight 1, every bias 0 */
    assert_all(param(m, "0.4.0.convpath.1.1.weight"), 0.0f);
    assert_all(param(m, "0.7.1.convpath.1.1.weight"), 0.0f);
    assert_all(param(m, "0.4.0.convpath.0.1.weight"), 1.0f);
    assert_all(param(m, "0.5.0.idpath.1.1.weight"), 1.0f);
    assert_all(param(m, "0.0.1.bias"), 0.0f);
    assert_all(param(m, "0.5.0.convpath.1.1.bias"), 0.0f);
    /* kaiming_normal_: std sqrt(2 / fan_in) */
    double mean, std;
    cf_param *w = param(m, "0.6.0.convpath.0.0.weight"); /* 256 x 128 x 3 x 3 */
    moments(w, &mean, &std);
    assert_true(fabs(mean) < 0.01 * sqrt(2.0 / (128 * 9)) * 10);
    assert_true(fabs(std / sqrt(2.0 / (128 * 9)) - 1.0) < 0.02);
    /* head: apply_init(kaiming_normal_) on Linear, fastai's BatchNorm helper bias 1e-3 */
    w = param(m, "1.4.weight"); /* Linear(1024, 512) */
    moments(w, &mean, &std);
    assert_true(fabs(std / sqrt(2.0 / 1024) - 1.0) < 0.02);
    assert_all(param(m, "1.2.bias"), 1e-3f);
    assert_all(param(m, "1.6.weight"), 1.0f);
    assert_all(param(m, "1.6.bias"), 1e-3f);
    /* same seed, same weights; another seed, others */
    cf_model *m2, *m3;
    assert_int_equal(cf_model_new(&m2, cf_xresnet(18, 10, NULL), 5), CF_OK);
    assert_int_equal(cf_model_new(&m3, cf_xresnet(18, 10, NULL), 6), CF_OK);
    assert_memory_equal(m->weights, m2->weights, m->n_weights * sizeof(float));
    assert_true(memcmp(m->weights, m3->weights, m->n_weights * sizeof(float)) != 0);
    cf_model_free(m);
    cf_model_free(m2);
    cf_model_free(m3);
}

static void test_other_inits(void **state) {
    (void)state;
    cf_model *m;
    const int cards[2] = {40, 7};
    assert_int_equal(cf_model_new(&m, cf_tabular_model(2, cards, NULL, 3, 2, NULL), 3), CF_OK);
    /* trunc_normal_(std 0.01) by fmod 2: |w| < 0.02, std about 0.0088 */
    cf_param *e = param(m, "embeds.0.weight");
    assert_int_equal(e->shape.dim[0], 40);
    assert_int_equal(e->shape.dim[1], cf_emb_sz_rule(40));
    double mean, std;
    moments(e, &mean, &std);
    for (size_t i = 0; i < e->numel; i++) assert_true(fabs(e->data[i]) < 0.02f);
    assert_true(std > 0.005 && std < 0.012);
    assert_all(param(m, "layers.0.2.bias"), 1e-3f); /* LinBnDrop: BatchNorm helper */
    assert_all(param(m, "layers.0.2.weight"), 1.0f);
    assert_all(param(m, "bn_cont.bias"), 0.0f); /* plain nn.BatchNorm1d */
    assert_non_null(cf_model_param(m, "layers.2.0.bias"));
    assert_null(cf_model_param(m, "layers.0.0.bias"));
    cf_model_free(m);

    /* SimpleCNN: ConvLayer init, kaiming_uniform_ (|w| <= sqrt(6 / fan_in)), bias N(0, 0.01) */
    const int filters[3] = {3, 32, 64};
    assert_int_equal(cf_model_new(&m, cf_simple_cnn(3, filters, NULL, NULL, true), 3), CF_OK);
    cf_param *w = param(m, "1.0.weight");
    double bound = sqrt(6.0 / (32 * 9));
    moments(w, &mean, &std);
    for (size_t i = 0; i < w->numel; i++) assert_true(fabs(w->data[i]) <= bound);
    assert_true(fabs(std / (bound / sqrt(3.0)) - 1.0) < 0.05);
    cf_param *b = param(m, "1.0.bias");
    moments(b, &mean, &std);
    assert_true(std > 0.004 && std < 0.02);
    assert_all(param(m, "0.1.bias"), 1e-3f);
    assert_null(cf_model_param(m, "0.0.bias"));
    cf_model_free(m);
}

/* ---- parameter groups and errors ----------------------------------------------------------- */

static void test_splits(void **state) {
    (void)state;
    cf_model *m;
    assert_int_equal(cf_model_new(&m, cf_mini_resnet(1, 10), 1), CF_OK);
    assert_int_equal(cf_split_default(m), CF_OK);
    assert_int_equal(m->n_groups, 2);
    assert_int_equal(param(m, "0.0.weight")->group, 0);
    assert_int_equal(param(m, "0.4.idpath.1.running_var")->group, 0);
    assert_int_equal(param(m, "1.8.weight")->group, 1);
    cf_split_none(m);
    assert_int_equal(m->n_groups, 1);
    assert_int_equal(param(m, "1.8.weight")->group, 0);
    cf_model_free(m);

    assert_int_equal(cf_model_new(&m, cf_xresnet(18, 10, NULL), 1), CF_OK);
    assert_int_equal(cf_split_resnet(m), CF_OK);
    assert_int_equal(m->n_groups, 3);
    assert_int_equal(param(m, "0.0.0.weight")->group, 0);
    assert_int_equal(param(m, "0.5.1.convpath.0.0.weight")->group, 0);
    assert_int_equal(param(m, "0.6.0.convpath.0.0.weight")->group, 1);
    assert_int_equal(param(m, "0.7.1.convpath.1.1.bias")->group, 1);
    assert_int_equal(param(m, "1.2.weight")->group, 2);
    /* freezing through the groups: only the head trains (BatchNorm too when train_bn) */
    cf_model_freeze_to(m, -1, true);
    assert_false(param(m, "0.6.0.convpath.0.0.weight")->trainable);
    assert_true(param(m, "0.6.0.convpath.0.1.weight")->trainable);
    assert_true(param(m, "1.4.weight")->trainable);
    cf_model_free(m);

    const int cards[1] = {4};
    assert_int_equal(cf_model_new(&m, cf_tabular_model(1, cards, NULL, 0, 2, NULL), 1), CF_OK);
    assert_int_equal(cf_split_resnet(m), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "resnet split"));
    cf_model_free(m);
    cf_module *lin = cf_linear(3, 2, true);
    assert_int_equal(cf_model_new(&m, lin, 1), CF_OK);
    assert_int_equal(cf_split_default(m), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "Linear"));
    cf_model_free(m);
}

static void test_errors(void **state) {
    (void)state;
    assert_null(cf_xresnet(20, 10, NULL));
    assert_non_null(strstr(cf_last_error(), "depth 20"));
    assert_int_equal(cf_xresnet_nf(50), 2048);
    assert_int_equal(cf_xresnet_nf(19), 0);
    cf_head_opts h = cf_head_defaults();
    h.n_ps = 3; /* 2 blocks */
    assert_null(cf_create_head(64, 10, &h));
    assert_non_null(strstr(cf_last_error(), "3 dropout values"));
    h = cf_head_defaults();
    h.ps[0] = 1.5f;
    assert_null(cf_create_head(64, 10, &h));
    assert_null(cf_create_head(0, 10, NULL));
    assert_null(cf_mini_resnet(0, 10));
    const int bad[2] = {4, 0};
    assert_null(cf_tabular_model(2, bad, NULL, 1, 2, NULL));
    assert_non_null(strstr(cf_last_error(), "category 1 has 0 classes"));
    assert_null(cf_tabular_model(0, NULL, NULL, 0, 2, NULL));
    const int one[1] = {1};
    assert_null(cf_simple_cnn(1, one, NULL, NULL, true));
    const int f3[3] = {3, 8, 4}, ks_bad[2] = {3, 0}; /* fails after the first layer is built */
    assert_null(cf_simple_cnn(3, f3, ks_bad, NULL, true));
    assert_non_null(strstr(cf_last_error(), "kernel 0"));

    assert_null(cf_vision_model("resnet19", 3, 10));
    assert_non_null(strstr(cf_last_error(), "unknown architecture 'resnet19'"));
    cf_module *v = cf_vision_model("xresnet18-small", 1, 10);
    assert_non_null(v);
    cf_module_free(v);

    /* wrong input shapes are reported by the forward pass, naming the layer */
    cf_model *m;
    const int cards[2] = {4, 5};
    assert_int_equal(cf_model_new(&m, cf_tabular_model(2, cards, NULL, 3, 2, NULL), 1), CF_OK);
    float x[12] = {0};
    cf_tensor xt = cf_tensor_view(x, cf_shape2(3, 4));
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "TabularModel"));
    cf_model_free(m);
    assert_int_equal(cf_model_new(&m, cf_xresnet(18, 10, NULL), 1), CF_OK);
    float img[2 * 3 * 4 * 4] = {0};
    xt = cf_tensor_view(img, cf_shape4(2, 1, 4, 4)); /* 1 channel for a 3-channel stem */
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_ERR_INVALID);
    cf_model_free(m);
}

/* The batch shrinks and grows after planning (last batch of an epoch), and eval follows train:
 * the model keeps giving PyTorch's numbers. */
static void test_batch_sizes(void **state) {
    (void)state;
    const int cards[2] = {6, 3};
    cf_module *root = cf_tabular_model(2, cards, NULL, 2, 3, NULL);
    cf_model *m;
    assert_int_equal(cf_model_new(&m, root, 2), CF_OK);
    float x[8 * 4];
    fill_uniform(x, 32, 3, -1, 1);
    for (int r = 0; r < 8; r++) {
        x[r * 4] = (float)(r % 6);
        x[r * 4 + 1] = (float)(r % 3);
    }
    const cf_tensor *y;
    cf_tensor xt = cf_tensor_view(x, cf_shape2(8, 4));
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_OK);
    float full[8 * 3];
    cf_model_train(m, false);
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_OK);
    memcpy(full, y->data, sizeof full);
    xt = cf_tensor_view(x, cf_shape2(3, 4)); /* smaller batch: the same rows in eval */
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_OK);
    assert_int_equal(y->shape.dim[0], 3);
    assert_close("first rows", y->data, full, 9, 1e-6, 1e-7); /* GEMM blocking may differ */
    xt = cf_tensor_view(x, cf_shape2(8, 4));
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_OK);
    assert_memory_equal(y->data, full, sizeof full);
    cf_model_free(m);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* e.g. "test_xresnet*" */
    cf_set_num_threads(2);                         /* exercise the threaded paths on any machine */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mini_resnet_train),
        cmocka_unit_test(test_mini_resnet_eval),
        cmocka_unit_test(test_xresnet18_small_train),
        cmocka_unit_test(test_xresnet18_standard_eval),
        cmocka_unit_test(test_xresnet34_eval),
        cmocka_unit_test(test_xresnet50_eval),
        cmocka_unit_test(test_head_variants),
        cmocka_unit_test(test_simple_cnn),
        cmocka_unit_test(test_tabular),
        cmocka_unit_test(test_emb_sz_rule),
        cmocka_unit_test(test_xresnet_init),
        cmocka_unit_test(test_other_inits),
        cmocka_unit_test(test_splits),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_batch_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
