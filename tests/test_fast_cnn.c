/* The fast-cnn (corefit train --recipe fast's model, cf_fast_cnn) against its PyTorch twin,
 * bench/fast_torch.py's build_model (tests/oracle/fast_cnn.py), with PyTorch's weights copied in
 * by state_dict name: the same parameter names and sizes, then logits, the label-smoothed
 * cross-entropy, every parameter's gradient and the BatchNorm buffers after one training step on
 * 16 random images, and the eval-mode logits after it. Also the layout the header documents
 * (three conv groups of 24, 48 and 96 channels, a 192-feature head) and the vision learner's
 * "fast-cnn" by name.
 *
 * Tolerance as test_w1_model: rtol 1e-4 with an absolute floor of 1e-5 of each tensor's largest
 * value (BatchNorm's backward through batch statistics cancels large terms). The BatchNorm
 * weights' gradients, sum(dy * xhat), get a floor of 1e-2 of their largest: in the last group,
 * where the 7 -> 3 max pool and ReLU leave few non-zero dy, the sum cancels to 1e-3 of its terms
 * and differs from PyTorch's by 1% of its own size (4e-7 at 3.4e-5) while every gradient that
 * flows through it (the convolution's before it) agrees to 4e-6. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/learn.h"
#include "corefit/nn.h"

#define SEED 4321
#define BATCH 16

static void check(const char *what, const float *a, const float *b, size_t n, double floor) {
    double mx = 1e-30;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    assert_close(what, a, b, n, 1e-4, floor * mx);
}

static void test_fast_cnn_matches_pytorch(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_fast_cnn(1, 10), 1), CF_OK);
    cf_shape xs = cf_shape4(BATCH, 1, 28, 28);
    size_t nx = cf_shape_numel(&xs);
    float *x = malloc(nx * sizeof(float)), target[BATCH];
    fill_uniform(x, nx, 7, -0.8f, 2.0f); /* about the range of normalised Fashion-MNIST */
    fill_uniform(target, BATCH, 8, 0, 1);
    for (int i = 0; i < BATCH; i++) target[i] = floorf(target[i] * 9.999f);
    oracle_put(&o, "x", x, xs);
    oracle_put(&o, "target", target, cf_shape1(BATCH));
    char args[32];
    snprintf(args, sizeof args, "%d", SEED);
    oracle_run(&o, "fast_cnn.py", args);

    /* the same state: as many entries, each name found with its size */
    cf_tensor n_state = oracle_get(&o, "n_state");
    assert_int_equal((int)n_state.data[0], model->n_params);
    free(n_state.data);
    char name[256], what[300];
    for (int j = 0; j < model->n_params; j++) {
        cf_param *p = model->params[j];
        snprintf(name, sizeof name, "p_%s", p->full_name);
        cf_tensor w = oracle_get(&o, name);
        assert_int_equal(cf_tensor_numel(&w), p->numel);
        memcpy(p->data, w.data, p->numel * sizeof(float));
        free(w.data);
    }
    /* the documented layout: groups of 24, 48, 96 channels, a BatchNorm1d(192) and a Linear */
    const int widths[3] = {24, 48, 96};
    for (int g = 0; g < 3; g++) {
        snprintf(name, sizeof name, "0.%d.0.weight", g);
        cf_param *w = cf_model_param(model, name);
        assert_non_null(w);
        assert_int_equal(w->shape.dim[0], widths[g]);
    }
    assert_int_equal(cf_fast_cnn_nf(), 96);
    assert_int_equal(cf_model_param(model, "1.2.weight")->numel, 192);
    assert_int_equal(cf_model_param(model, "1.3.weight")->numel, 192 * 10);

    cf_tensor tx = cf_tensor_view(x, xs), tt = cf_tensor_view(target, cf_shape1(BATCH));
    cf_model_train(model, true);
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    assert_int_equal(y->shape.dim[0], BATCH);
    assert_int_equal(y->shape.dim[1], 10);
    cf_tensor ref = oracle_get(&o, "train_logits");
    check("train: logits", y->data, ref.data, BATCH * 10, 1e-5);
    free(ref.data);
    cf_loss ce = cf_label_smoothing_ce(0.1f);
    float loss, dlogits[BATCH * 10];
    assert_int_equal(cf_loss_forward(&ce, y, &tt, &loss, NULL), CF_OK);
    ref = oracle_get(&o, "train_loss");
    check("train: loss", &loss, ref.data, 1, 1e-5);
    free(ref.data);
    cf_tensor dy = cf_tensor_view(dlogits, y->shape);
    cf_loss_backward(&ce, y, &tt, &dy);
    cf_model_zero_grad(model);
    assert_int_equal(cf_model_backward(model, &dy), CF_OK);
    for (int j = 0; j < model->n_params; j++) {
        cf_param *p = model->params[j];
        bool buffer = p->grad == NULL;
        snprintf(name, sizeof name, "%s%s", buffer ? "s_" : "g_", p->full_name);
        ref = oracle_get(&o, name);
        assert_int_equal(cf_tensor_numel(&ref), p->numel);
        snprintf(what, sizeof what, "%s %s", buffer ? "buffer" : "gradient of", p->full_name);
        check(what, buffer ? p->data : p->grad, ref.data, p->numel,
              p->kind == CF_PARAM_NORM && strstr(p->full_name, "weight") ? 1e-2 : 1e-5);
        free(ref.data);
    }
    cf_model_train(model, false);
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    ref = oracle_get(&o, "eval_logits");
    check("eval: logits", y->data, ref.data, BATCH * 10, 1e-5);
    free(ref.data);

    cf_model_free(model);
    free(x);
    oracle_cleanup(&o);
}

/* "fast-cnn" by name: the vision model and the learner factory's architecture, both ways. */
static void test_fast_cnn_by_name(void **state) {
    (void)state;
    assert_int_equal(cf_arch_from_name("fast-cnn"), CF_ARCH_FAST_CNN);
    assert_string_equal(cf_arch_name(CF_ARCH_FAST_CNN), "fast-cnn");
    cf_model *a, *b;
    assert_int_equal(cf_model_new(&a, cf_vision_model("fast-cnn", 3, 7), 1), CF_OK);
    assert_int_equal(cf_model_new(&b, cf_fast_cnn(3, 7), 1), CF_OK);
    assert_int_equal(a->n_params, b->n_params);
    for (int j = 0; j < a->n_params; j++) {
        assert_string_equal(a->params[j]->full_name, b->params[j]->full_name);
        assert_int_equal(a->params[j]->numel, b->params[j]->numel);
    }
    assert_int_equal(cf_model_param(a, "0.0.0.weight")->shape.dim[1], 3);
    cf_model_free(a);
    cf_model_free(b);
    assert_null(cf_fast_cnn_body(0)); /* a bad channel count is an error, not a crash */
    assert_non_null(strstr(cf_last_error(), "c_in 0"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_cnn_matches_pytorch),
        cmocka_unit_test(test_fast_cnn_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
