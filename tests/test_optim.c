/* Optimizers: fastai's SGD and Adam against torch.optim and against fastai's formulas computed
 * in float64 by tests/oracle/optim.py; groups, frozen parameters, state handling, errors. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "corefit/optim.h"

/* ---- a small test module: y = x W^T + b, with a BatchNorm-like affine and a buffer ---------- */

typedef struct toy_impl {
    int in, out;
} toy_impl;

static cf_status toy_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    toy_impl *t = m->impl;
    if (in->ndim != 2 || in->dim[1] != t->in) return cf_fail(CF_ERR_INVALID, "toy: bad input");
    *out = cf_shape2(in->dim[0], t->out);
    return CF_OK;
}

static const cf_tensor *toy_forward(cf_module *m, const cf_tensor *x) {
    toy_impl *t = m->impl;
    int n = x->shape.dim[0];
    cf_shape s = cf_shape2(n, t->out);
    cf_tensor *y = cf_module_output(m, &s);
    const float *w = m->params[0].data, *b = m->params[1].data, *g = m->params[2].data;
    for (int i = 0; i < n; i++)
        for (int o = 0; o < t->out; o++) {
            float acc = b[o];
            for (int k = 0; k < t->in; k++) acc += w[o * t->in + k] * x->data[i * t->in + k];
            y->data[i * t->out + o] = g[o] * acc;
        }
    return y;
}

static const cf_tensor *toy_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    (void)m;
    (void)dy;
    (void)need_dx;
    return NULL; /* not used by these tests */
}

static const cf_module_ops toy_ops = {
    .kind = "Toy",
    .out_shape = toy_out_shape,
    .forward = toy_forward,
    .backward = toy_backward,
};

static cf_module *toy(int in, int out) {
    toy_impl *t = cf_malloc(sizeof *t);
    t->in = in;
    t->out = out;
    cf_module *m = cf_module_new(&toy_ops, t);
    cf_module_add_param(m, "weight", CF_PARAM_WEIGHT, cf_shape2(out, in));
    cf_module_add_param(m, "bias", CF_PARAM_BIAS, cf_shape1(out));
    cf_module_add_param(m, "gamma", CF_PARAM_NORM, cf_shape1(out));
    cf_module_add_param(m, "running_mean", CF_PARAM_BUFFER, cf_shape1(out));
    return m;
}

/* Three toys in groups 0, 1, 2, with random weights and buffers. */
static cf_model *toy_model(int in, int out, uint64_t seed) {
    cf_module *c[3] = {toy(in, out), toy(out, out), toy(out, 2)};
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_sequential(3, c), seed), CF_OK);
    cf_module *root = model->root;
    for (int g = 0; g < 3; g++)
        assert_int_equal(cf_model_set_group(model, root->children[g], g), CF_OK);
    assert_int_equal(model->n_groups, 3);
    fill_uniform(model->weights, model->n_weights, seed + 1, -1.0f, 1.0f);
    fill_uniform(model->buffers, model->n_buffers, seed + 2, -1.0f, 1.0f);
    return model;
}

static float f32(double v) {
    return (float)v;
}

/* ---- one case against the oracle ------------------------------------------------------------ */

#define STEPS 20

typedef struct opt_case {
    cf_opt_kind kind;
    bool decouple, wd_bn_bias;
    double mom, wd;
} opt_case;

typedef struct case_run {
    cf_model *model;
    float *w0, *b0;
    char prefix[16];
} case_run;

/* Runs STEPS steps with scheduled discriminative lrs and moms and synthetic gradients, writing
 * everything the oracle needs. Group 0 is frozen except its NORM parameter (train_bn). */
static void run_case(oracle *o, const opt_case *c, int index, case_run *r) {
    snprintf(r->prefix, sizeof r->prefix, "c%d", index);
    cf_model *model = toy_model(4, 3, 100 + (uint64_t)index);
    cf_model_freeze_to(model, 1, true);
    cf_opt_config cfg = c->kind == CF_OPT_ADAM ? cf_opt_adam_defaults() : cf_opt_sgd_defaults();
    cfg.decouple_wd = c->decouple;
    cfg.wd_bn_bias = c->wd_bn_bias;
    cfg.hypers.mom = f32(c->mom);
    cfg.hypers.wd = f32(c->wd);
    cfg.hypers.sqr_mom = f32(0.99);
    cfg.hypers.eps = f32(1e-5);
    cf_optimizer *opt;
    assert_int_equal(cf_optimizer_new(&opt, model, &cfg), CF_OK);

    size_t nw = model->n_weights;
    r->model = model;
    r->w0 = malloc(nw * sizeof(float));
    r->b0 = malloc(model->n_buffers * sizeof(float));
    memcpy(r->w0, model->weights, nw * sizeof(float));
    memcpy(r->b0, model->buffers, model->n_buffers * sizeof(float));
    float *grads = malloc(STEPS * nw * sizeof(float));
    fill_uniform(grads, STEPS * nw, 7 + (uint64_t)index, -1.0f, 1.0f);
    float *hyp = calloc(STEPS * 3 * 5, sizeof(float));

    for (int s = 0; s < STEPS; s++) {
        double base = 0.05 * (0.5 + 0.5 * cos(3.14159 * s / STEPS)); /* a cosine-ish schedule */
        double lrs[3];
        cf_hyper_slice(base / 100, base, 3, lrs);
        for (int g = 0; g < 3; g++) lrs[g] = f32(lrs[g]);
        double mom = c->mom == 0 ? 0.0 : f32(0.95 - 0.1 * s / STEPS);
        assert_int_equal(cf_optimizer_set_hyper(opt, "lr", lrs, 3), CF_OK);
        assert_int_equal(cf_optimizer_set_hyper(opt, "mom", &mom, 1), CF_OK);
        for (int g = 0; g < 3; g++) {
            float *h = hyp + (s * 3 + g) * 5;
            h[0] = (float)lrs[g];
            h[1] = (float)mom;
            h[2] = (float)opt->hypers[g].sqr_mom;
            h[3] = (float)opt->hypers[g].eps;
            h[4] = (float)opt->hypers[g].wd;
            assert_true(opt->hypers[g].lr == lrs[g] && opt->hypers[g].mom == mom);
        }
        memcpy(model->grads, grads + s * nw, nw * sizeof(float));
        cf_optimizer_step(opt);
    }

    float *meta = calloc((size_t)model->n_params * 5, sizeof(float));
    int n = 0;
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (p->kind == CF_PARAM_BUFFER || p->kind == CF_PARAM_COUNTER) continue;
        float *m = meta + n * 5;
        m[0] = (float)p->offset;
        m[1] = (float)p->numel;
        m[2] = (float)p->group;
        m[3] = opt->do_wd[i];
        m[4] = p->trainable;
        n++;
        /* frozen parameters: no state, no step */
        if (!p->trainable) {
            assert_true(opt->steps[i] == 0.0f);
            for (size_t k = 0; opt->grad_avg && k < p->numel; k++)
                assert_true(opt->grad_avg[p->offset + k] == 0.0f);
        } else {
            assert_true(opt->steps[i] == (float)STEPS);
        }
        /* do_wd follows the kind */
        assert_int_equal(opt->do_wd[i], p->kind == CF_PARAM_WEIGHT || c->wd_bn_bias);
    }
    char name[64];
    snprintf(name, sizeof name, "%s_w0", r->prefix);
    oracle_put(o, name, r->w0, cf_shape1((int)nw));
    snprintf(name, sizeof name, "%s_grads", r->prefix);
    oracle_put(o, name, grads, cf_shape2(STEPS, (int)nw));
    snprintf(name, sizeof name, "%s_meta", r->prefix);
    oracle_put(o, name, meta, cf_shape2(n, 5));
    snprintf(name, sizeof name, "%s_cfg", r->prefix);
    oracle_put_values(o, name, 4, (double)(c->kind == CF_OPT_ADAM), (double)c->decouple,
                      (double)STEPS, 3.0);
    snprintf(name, sizeof name, "%s_hyp", r->prefix);
    oracle_put(o, name, hyp, cf_shape2(STEPS * 3, 5));
    free(meta);
    free(grads);
    free(hyp);
    cf_optimizer_free(opt);
}

static void check_case(oracle *o, const opt_case *c, case_run *r) {
    cf_model *model = r->model;
    size_t nw = model->n_weights;
    char name[64], what[128];
    /* frozen parameters and buffers are untouched, bit for bit */
    int frozen = 0;
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (p->kind == CF_PARAM_BUFFER || p->kind == CF_PARAM_COUNTER) {
            assert_memory_equal(p->data, r->b0 + p->offset, p->numel * sizeof(float));
        } else if (!p->trainable) {
            assert_memory_equal(p->data, r->w0 + p->offset, p->numel * sizeof(float));
            frozen++;
        } else {
            assert_memory_not_equal(p->data, r->w0 + p->offset, p->numel * sizeof(float));
        }
    }
    assert_int_equal(frozen, 2); /* group 0's weight and bias; its NORM keeps training */

    snprintf(name, sizeof name, "%s_formula", r->prefix);
    cf_tensor ref = oracle_get(o, name);
    snprintf(what, sizeof what, "%s (%s, %s wd, mom %g) vs formula", r->prefix,
             c->kind == CF_OPT_ADAM ? "Adam" : "SGD", c->decouple ? "decoupled" : "L2", c->mom);
    if (getenv("CF_TEST_VERBOSE"))
        printf("%s: max err %.3g\n", what, max_rel_err(model->weights, ref.data, nw, 1.0));
    assert_close(what, model->weights, ref.data, nw, 1e-5, 1e-5);
    free(ref.data);
    bool twin = c->kind == CF_OPT_ADAM || !c->decouple;
    if (twin) {
        snprintf(name, sizeof name, "%s_torch", r->prefix);
        ref = oracle_get(o, name);
        snprintf(what, sizeof what, "%s (%s, %s wd, mom %g) vs torch.optim", r->prefix,
                 c->kind == CF_OPT_ADAM ? "Adam" : "SGD", c->decouple ? "decoupled" : "L2", c->mom);
        if (getenv("CF_TEST_VERBOSE"))
            printf("%s: max err %.3g\n", what, max_rel_err(model->weights, ref.data, nw, 1.0));
        assert_close(what, model->weights, ref.data, nw, 1e-5, 1e-5);
        free(ref.data);
    }
    free(r->w0);
    free(r->b0);
    cf_model_free(model);
}

static void test_against_torch_and_formula(void **state) {
    (void)state;
    const opt_case cases[] = {
        {CF_OPT_SGD, true, false, 0.9, 0.1},  {CF_OPT_SGD, false, false, 0.9, 0.1},
        {CF_OPT_SGD, true, false, 0.0, 0.1},  {CF_OPT_SGD, false, false, 0.0, 0.1},
        {CF_OPT_ADAM, true, false, 0.9, 0.1}, {CF_OPT_ADAM, false, false, 0.9, 0.1},
        {CF_OPT_ADAM, true, true, 0.9, 0.1},  {CF_OPT_SGD, false, true, 0.9, 0.05},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    oracle o;
    oracle_init(&o);
    case_run runs[8];
    char args[256] = "";
    for (int i = 0; i < n; i++) {
        run_case(&o, &cases[i], i, &runs[i]);
        strcat(args, runs[i].prefix);
        strcat(args, " ");
    }
    oracle_run(&o, "optim.py", args);
    for (int i = 0; i < n; i++) check_case(&o, &cases[i], &runs[i]);
    oracle_cleanup(&o);
}

/* ---- state handling ----------------------------------------------------------------------- */

static void fill_grads(cf_model *m, uint64_t seed) {
    fill_uniform(m->grads, m->n_weights, seed, -1.0f, 1.0f);
}

static void test_clear_state_and_copy(void **state) {
    (void)state;
    cf_model *a = toy_model(4, 3, 1), *b = toy_model(4, 3, 2);
    cf_opt_config cfg = cf_opt_adam_defaults();
    cf_optimizer *oa, *ob;
    assert_int_equal(cf_optimizer_new(&oa, a, &cfg), CF_OK);
    assert_int_equal(cf_optimizer_new(&ob, b, &cfg), CF_OK);
    assert_int_equal(cf_optimizer_state_floats(oa), 2 * a->n_weights + (size_t)a->n_params);
    for (int s = 0; s < 5; s++) {
        fill_grads(a, 10 + (uint64_t)s);
        cf_optimizer_step(oa);
    }
    /* copy_state: b continues exactly like a */
    assert_int_equal(cf_model_copy_state(b, a), CF_OK);
    assert_int_equal(cf_optimizer_copy_state(ob, oa), CF_OK);
    fill_grads(a, 99);
    fill_grads(b, 99);
    cf_optimizer_step(oa);
    cf_optimizer_step(ob);
    assert_memory_equal(a->weights, b->weights, a->n_weights * sizeof(float));

    /* clear_state: the next step is the first step of a fresh optimizer */
    cf_optimizer_clear_state(oa);
    for (size_t i = 0; i < a->n_weights; i++)
        assert_true(oa->grad_avg[i] == 0.0f && oa->sqr_avg[i] == 0.0f);
    for (int i = 0; i < a->n_params; i++) assert_true(oa->steps[i] == 0.0f);
    cf_optimizer_free(ob);
    assert_int_equal(cf_optimizer_new(&ob, b, &cfg), CF_OK);
    assert_int_equal(cf_model_copy_state(b, a), CF_OK);
    fill_grads(a, 123);
    fill_grads(b, 123);
    cf_optimizer_step(oa);
    cf_optimizer_step(ob);
    assert_memory_equal(a->weights, b->weights, a->n_weights * sizeof(float));

    /* zero_grad */
    cf_optimizer_zero_grad(oa);
    for (size_t i = 0; i < a->n_weights; i++) assert_true(a->grads[i] == 0.0f);

    /* copy_state refuses a different optimizer kind */
    cf_opt_config sgd = cf_opt_sgd_defaults();
    cf_optimizer *os;
    assert_int_equal(cf_optimizer_new(&os, b, &sgd), CF_OK);
    assert_null(os->grad_avg); /* SGD without momentum keeps no average */
    assert_int_equal(cf_optimizer_state_floats(os), (size_t)b->n_params);
    assert_int_equal(cf_optimizer_copy_state(os, oa), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "different kinds"));
    cf_optimizer_free(os);
    cf_optimizer_free(oa);
    cf_optimizer_free(ob);
    cf_model_free(a);
    cf_model_free(b);
}

static void test_set_hyper_errors(void **state) {
    (void)state;
    cf_model *m = toy_model(4, 3, 3);
    cf_opt_config cfg = cf_opt_sgd_defaults();
    cf_optimizer *opt;
    assert_int_equal(cf_optimizer_new(&opt, m, &cfg), CF_OK);
    double v[3] = {0.1, 0.2, 0.3};
    assert_int_equal(cf_optimizer_set_hyper(opt, "beta", v, 1), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "\"beta\""));
    assert_int_equal(cf_optimizer_set_hyper(opt, "lr", v, 2), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "2 values for 3 parameter groups"));
    assert_int_equal(cf_optimizer_set_hyper(opt, "lr", v, 0), CF_ERR_INVALID);
    assert_int_equal(cf_optimizer_set_hyper(opt, "lr", NULL, 1), CF_ERR_INVALID);
    double bad[3] = {0.1, NAN, 0.3};
    assert_int_equal(cf_optimizer_set_hyper(opt, "wd", bad, 3), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "value 1 is nan"));
    /* a failed call changes nothing */
    for (int g = 0; g < 3; g++) assert_true(opt->hypers[g].lr == 1e-3 && opt->hypers[g].wd == 0.0);
    assert_int_equal(cf_optimizer_set_hyper(opt, "wd", v, 3), CF_OK);
    for (int g = 0; g < 3; g++) assert_true(opt->hypers[g].wd == v[g]);
    assert_int_equal(cf_optimizer_set_hyper(opt, "eps", v + 2, 1), CF_OK);
    for (int g = 0; g < 3; g++) assert_true(opt->hypers[g].eps == 0.3);
    cf_optimizer_free(opt);
    cf_opt_config badcfg = cf_opt_adam_defaults();
    badcfg.hypers.lr = INFINITY;
    assert_int_equal(cf_optimizer_new(&opt, m, &badcfg), CF_ERR_INVALID);
    assert_null(opt);
    assert_non_null(strstr(cf_last_error(), "lr is inf"));
    cf_model_free(m);
}

static void test_defaults_and_slices(void **state) {
    (void)state;
    cf_opt_config a = cf_opt_adam_defaults(), s = cf_opt_sgd_defaults();
    assert_int_equal(a.kind, CF_OPT_ADAM);
    assert_true(a.hypers.mom == 0.9 && a.hypers.sqr_mom == 0.99 && a.hypers.eps == 1e-5 &&
                a.hypers.wd == 0.01 && a.hypers.lr == 1e-3 && a.decouple_wd && !a.wd_bn_bias);
    assert_int_equal(s.kind, CF_OPT_SGD);
    assert_true(s.hypers.mom == 0.0 && s.hypers.wd == 0.0 && s.decouple_wd);
    /* fastai's even_mults(start, stop, n) = start * (stop/start)**(i/(n-1)) */
    double out[4];
    cf_hyper_slice(1e-5, 1e-3, 3, out);
    for (int i = 0; i < 3; i++)
        assert_true(fabs(out[i] - 1e-5 * pow(100.0, i / 2.0)) < 1e-18 + 1e-12 * out[i]);
    cf_hyper_slice(1e-5, 1e-3, 1, out);
    assert_true(out[0] == 1e-3);
    /* slice(None, stop): stop/10 for the body, stop for the head */
    cf_hyper_slice(0, 2e-3, 4, out);
    assert_true(out[0] == 2e-4 && out[1] == 2e-4 && out[2] == 2e-4 && out[3] == 2e-3);
}

/* The element-wise pass split over threads gives the same bits as one thread. */
static void test_threads_bitwise(void **state) {
    (void)state;
    /* above the size from which the step is split over the threads (optim.c) */
    cf_model *a = toy_model(520, 520, 5), *b = toy_model(520, 520, 6);
    assert_true(a->n_weights > (1 << 19));
    assert_int_equal(cf_model_copy_state(b, a), CF_OK);
    cf_opt_config cfg = cf_opt_adam_defaults();
    cf_optimizer *oa, *ob;
    assert_int_equal(cf_optimizer_new(&oa, a, &cfg), CF_OK);
    assert_int_equal(cf_optimizer_new(&ob, b, &cfg), CF_OK);
    int saved = cf_get_num_threads();
    for (int s = 0; s < 3; s++) {
        fill_grads(a, 40 + (uint64_t)s);
        fill_grads(b, 40 + (uint64_t)s);
        cf_set_num_threads(1);
        cf_optimizer_step(oa);
        cf_set_num_threads(4);
        cf_optimizer_step(ob);
    }
    cf_set_num_threads(saved);
    assert_memory_equal(a->weights, b->weights, a->n_weights * sizeof(float));
    assert_memory_not_equal(a->weights, a->grads, a->n_weights * sizeof(float));
    cf_optimizer_free(oa);
    cf_optimizer_free(ob);
    cf_model_free(a);
    cf_model_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch_and_formula),
        cmocka_unit_test(test_clear_state_and_copy),
        cmocka_unit_test(test_set_hyper_errors),
        cmocka_unit_test(test_defaults_and_slices),
        cmocka_unit_test(test_threads_bitwise),
    };
    if (getenv("CF_TEST_FILTER")) cmocka_set_test_filter(getenv("CF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
