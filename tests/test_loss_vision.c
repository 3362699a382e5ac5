/* The losses of fastai's other vision tasks against PyTorch: CrossEntropyLossFlat(axis=1) over
 * (N, C, H, W) logits (segmentation), fastai's LabelSmoothingCrossEntropy formula, cross-entropy
 * against class probabilities (what MixUp and CutMix train on), BCEWithLogitsLossFlat with and
 * without pos_weight; loss, per-item loss, gradient, activation and decodes. Then the errors. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"

typedef struct vcase {
    cf_loss loss;
    cf_shape ps, ts;
    float *pred, *target, pos_weight[8];
    float mean, *per, *grad, *act, *decoded;
    size_t n_decoded;
} vcase;

static cf_shape shape3(int a, int b, int c) {
    int d[3] = {a, b, c};
    return cf_shape_make(3, d);
}

static void check(const char *what, const float *a, const float *b, size_t n) {
    double mx = 1e-30;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    assert_close(what, a, b, n, 1e-4, 1e-5 * mx);
}

/* soft: targets are class probabilities along the class axis (a random mix of two one-hots) */
static void add_case(oracle *o, vcase *c, int idx, cf_loss loss, cf_shape ps, cf_shape ts,
                     bool soft, char *args, size_t args_size) {
    c->loss = loss;
    c->ps = ps;
    c->ts = ts;
    size_t np = cf_shape_numel(&ps), nt = cf_shape_numel(&ts);
    c->pred = malloc(np * sizeof(float));
    c->target = malloc(nt * sizeof(float));
    fill_uniform(c->pred, np, 300 + (uint64_t)idx, -3, 3);
    fill_uniform(c->target, nt, 400 + (uint64_t)idx, 0, 1);
    const int axis = loss.axis == 1 ? 1 : ps.ndim - 1, ncls = ps.dim[axis];
    if (loss.kind == CF_LOSS_CROSS_ENTROPY && soft) {
        /* along the class axis: lam at one class, 1 - lam at another (maybe the same) */
        size_t stride = 1;
        for (int d = axis + 1; d < ps.ndim; d++) stride *= (size_t)ps.dim[d];
        float *u = malloc(nt * sizeof(float));
        memcpy(u, c->target, nt * sizeof(float));
        memset(c->target, 0, nt * sizeof(float));
        for (size_t r = 0; r < nt / (size_t)ncls; r++) {
            size_t base = (r / stride) * (size_t)ncls * stride + r % stride;
            int a = (int)(u[base] * ncls), b = (int)(u[base + stride] * ncls);
            float lam = fmodf(u[base] * 7.3f + u[base + stride], 1.0f);
            c->target[base + (size_t)a * stride] += lam;
            c->target[base + (size_t)b * stride] += 1 - lam;
        }
        free(u);
    } else if (loss.kind == CF_LOSS_CROSS_ENTROPY) {
        for (size_t i = 0; i < nt; i++) c->target[i] = floorf(c->target[i] * 0.999f * ncls);
    } else {
        for (size_t i = 0; i < nt; i++) c->target[i] = c->target[i] < 0.5f ? 0.0f : 1.0f;
    }
    char name[64];
    snprintf(name, sizeof name, "c%d_pred", idx);
    oracle_put(o, name, c->pred, ps);
    snprintf(name, sizeof name, "c%d_target", idx);
    oracle_put(o, name, c->target, ts);
    if (loss.pos_weight) {
        memcpy(c->pos_weight, loss.pos_weight, (size_t)loss.n_pos_weight * sizeof(float));
        c->loss.pos_weight = c->pos_weight;
        snprintf(name, sizeof name, "c%d_pos_weight", idx);
        oracle_put(o, name, c->pos_weight, cf_shape1(loss.n_pos_weight));
    }
    cf_tensor tp = cf_tensor_view(c->pred, ps), tt = cf_tensor_view(c->target, ts);
    c->per = malloc((size_t)ps.dim[0] * sizeof(float));
    c->grad = malloc(np * sizeof(float));
    c->act = malloc(np * sizeof(float));
    c->decoded = malloc(np * sizeof(float));
    assert_int_equal(cf_loss_forward(&c->loss, &tp, &tt, &c->mean, c->per), CF_OK);
    cf_tensor tg = cf_tensor_view(c->grad, ps);
    cf_loss_backward(&c->loss, &tp, &tt, &tg);
    cf_tensor ta = cf_tensor_view(c->act, ps);
    cf_loss_activation(&c->loss, &tp, &ta);
    c->n_decoded = cf_loss_decodes(&c->loss, &ta, c->decoded);
    size_t len = strlen(args);
    snprintf(args + len, args_size - len, " %d:%s:%g:%d:%d:%d", idx,
             loss.kind == CF_LOSS_CROSS_ENTROPY ? "ce" : "bce", (double)loss.label_smoothing,
             loss.kind == CF_LOSS_CROSS_ENTROPY ? axis : -1, soft, loss.pos_weight != NULL);
}

static void compare(oracle *o, int idx, const char *part, const float *got, size_t n) {
    char name[64], what[96];
    snprintf(name, sizeof name, "c%d_%s", idx, part);
    cf_tensor ref = oracle_get(o, name);
    assert_int_equal(cf_tensor_numel(&ref), n);
    snprintf(what, sizeof what, "case %d %s", idx, part);
    check(what, got, ref.data, n);
    free(ref.data);
}

static void test_vision_losses_match_pytorch(void **state) {
    (void)state;
    static oracle o;
    static vcase cases[8];
    static char args[1024];
    args[0] = 0;
    oracle_init(&o);
    const float pw[4] = {0.5f, 2.0f, 3.0f, 1.0f};
    int n = 0;
    /* segmentation: (N, C, H, W) logits against (N, H, W) codes, plain and label-smoothed */
    add_case(&o, &cases[n], n, cf_cross_entropy_loss_flat(1), cf_shape4(2, 3, 4, 5),
             shape3(2, 4, 5), false, args, sizeof args),
        n++;
    cf_loss seg_ls = cf_cross_entropy_loss_flat(1);
    seg_ls.label_smoothing = 0.1f;
    add_case(&o, &cases[n], n, seg_ls, cf_shape4(3, 4, 3, 2), shape3(3, 3, 2), false, args,
             sizeof args),
        n++;
    /* LabelSmoothingCrossEntropy() (eps 0.1) on (N, C) */
    add_case(&o, &cases[n], n, cf_label_smoothing_ce(0), cf_shape2(7, 5), cf_shape1(7), false, args,
             sizeof args),
        n++;
    /* class probabilities: (N, C), smoothed (N, C), and per pixel on axis 1 */
    add_case(&o, &cases[n], n, cf_cross_entropy_loss_flat(0), cf_shape2(6, 4), cf_shape2(6, 4),
             true, args, sizeof args),
        n++;
    add_case(&o, &cases[n], n, cf_label_smoothing_ce(0.2f), cf_shape2(5, 6), cf_shape2(5, 6), true,
             args, sizeof args),
        n++;
    add_case(&o, &cases[n], n, cf_cross_entropy_loss_flat(1), cf_shape4(2, 3, 2, 3),
             cf_shape4(2, 3, 2, 3), true, args, sizeof args),
        n++;
    /* multi-label: BCEWithLogitsLossFlat, and with pos_weight */
    add_case(&o, &cases[n], n, cf_bce_with_logits_loss_flat(0), cf_shape2(6, 4), cf_shape2(6, 4),
             false, args, sizeof args),
        n++;
    cf_loss weighted = cf_bce_with_logits_loss_flat(0);
    weighted.pos_weight = pw;
    weighted.n_pos_weight = 4;
    add_case(&o, &cases[n], n, weighted, cf_shape2(5, 4), cf_shape2(5, 4), false, args,
             sizeof args),
        n++;
    oracle_run(&o, "loss_vision.py", args);
    for (int i = 0; i < n; i++) {
        vcase *c = &cases[i];
        size_t np = cf_shape_numel(&c->ps);
        compare(&o, i, "loss", &c->mean, 1);
        compare(&o, i, "per_item", c->per, (size_t)c->ps.dim[0]);
        compare(&o, i, "grad", c->grad, np);
        compare(&o, i, "act", c->act, np);
        compare(&o, i, "decoded", c->decoded, c->n_decoded);
        free(c->pred), free(c->target), free(c->per), free(c->grad), free(c->act);
        free(c->decoded);
    }
    oracle_cleanup(&o);
}

/* BCE decodes with another threshold: p > thresh, strictly. */
static void test_bce_threshold(void **state) {
    (void)state;
    float act[4] = {0.2f, 0.3f, 0.5f, 0.9f}, out[4];
    cf_loss l = cf_bce_with_logits_loss_flat(0.3f);
    cf_tensor t = cf_tensor_view(act, cf_shape2(1, 4));
    assert_int_equal(cf_loss_decodes(&l, &t, out), 4);
    const float want[4] = {0, 0, 1, 1};
    assert_memory_equal(out, want, sizeof want);
    l = cf_bce_with_logits_loss_flat(0); /* 0.5: 0.5 itself is not above */
    cf_loss_decodes(&l, &t, out);
    const float want5[4] = {0, 0, 0, 1};
    assert_memory_equal(out, want5, sizeof want5);
}

static void expect_error(cf_loss loss, cf_shape ps, cf_shape ts, const float *t, const char *a,
                         const char *b) {
    float p[64] = {0}, mean;
    cf_tensor tp = cf_tensor_view(p, ps), tt = cf_tensor_view((float *)t, ts);
    assert_int_equal(cf_loss_forward(&loss, &tp, &tt, &mean, NULL), CF_ERR_INVALID);
    const char *msg = cf_last_error();
    if (!strstr(msg, a) || (b && !strstr(msg, b))) fail_msg("unexpected message: %s", msg);
}

static void test_vision_loss_errors(void **state) {
    (void)state;
    float t[64] = {0};
    /* axis 1: the target must be pred without its class axis */
    expect_error(cf_cross_entropy_loss_flat(1), cf_shape4(2, 3, 2, 2), shape3(2, 3, 2), t,
                 "target (2, 3, 2) does not fit pred (2, 3, 2, 2)", "class axis 1");
    t[5] = 3;
    expect_error(cf_cross_entropy_loss_flat(1), cf_shape4(2, 3, 2, 2), shape3(2, 2, 2), t,
                 "target[5] = 3 is not a class code in [0, 3)", NULL);
    t[5] = 1.5f;
    expect_error(cf_cross_entropy_loss_flat(0), cf_shape2(2, 4), cf_shape2(2, 4), t,
                 "target[5] = 1.5 is not a probability", NULL);
    cf_loss bad_axis = cf_cross_entropy_loss_flat(2);
    expect_error(bad_axis, cf_shape4(2, 3, 2, 2), shape3(2, 2, 2), t, "class axis 2", NULL);
    t[5] = 0;
    const float pw[2] = {1, -1};
    cf_loss weighted = cf_bce_with_logits_loss_flat(0);
    weighted.pos_weight = pw;
    weighted.n_pos_weight = 2;
    expect_error(weighted, cf_shape2(2, 2), cf_shape2(2, 2), t, "pos_weight[1] = -1", NULL);
    weighted.n_pos_weight = 1;
    expect_error(weighted, cf_shape2(2, 2), cf_shape2(2, 2), t, "1 pos_weight values",
                 "expected 2");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vision_losses_match_pytorch),
        cmocka_unit_test(test_bce_threshold),
        cmocka_unit_test(test_vision_loss_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
