/* Losses against PyTorch: cross-entropy (with label smoothing), MSE, BCE with logits — mean
 * loss, per-item losses, gradient and activation; a finite-difference check of cross-entropy;
 * error messages for bad targets.
 *
 * Tolerance: rtol 1e-4 with an absolute floor of 1e-5 of the tensor's scale (see
 * test_layers.c); the losses sum in double. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"

static void check(const char *what, const float *a, const float *b, size_t n) {
    double mx = 1e-30;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    assert_close(what, a, b, n, 1e-4, 1e-5 * mx);
}

typedef struct lcase {
    cf_loss loss;
    cf_shape ps, ts;
    float *pred, *target;
    float mean;
    float *per, *grad, *act;
} lcase;

static const char *kind_name(cf_loss_kind k) {
    return k == CF_LOSS_CROSS_ENTROPY ? "ce" : k == CF_LOSS_MSE ? "mse" : "bce";
}

static void add_case(oracle *o, lcase *c, int idx, cf_loss loss, cf_shape ps, cf_shape ts, float lo,
                     float hi, char *args, size_t args_size) {
    c->loss = loss;
    c->ps = ps;
    c->ts = ts;
    size_t np = cf_shape_numel(&ps), nt = cf_shape_numel(&ts);
    int n = ps.dim[0];
    c->pred = malloc(np * sizeof(float));
    c->target = malloc(nt * sizeof(float));
    fill_uniform(c->pred, np, 100 + (uint64_t)idx, lo, hi);
    fill_uniform(c->target, nt, 200 + (uint64_t)idx, 0, 1);
    if (loss.kind == CF_LOSS_CROSS_ENTROPY)
        for (size_t i = 0; i < nt; i++)
            c->target[i] = floorf(c->target[i] * 0.999f * (float)ps.dim[1]);
    else if (loss.kind == CF_LOSS_MSE)
        for (size_t i = 0; i < nt; i++) c->target[i] = 4 * c->target[i] - 2;
    else if (idx % 2)
        for (size_t i = 0; i < nt; i++) c->target[i] = c->target[i] < 0.5f ? 0.0f : 1.0f;
    char name[64];
    snprintf(name, sizeof name, "c%d_pred", idx);
    oracle_put(o, name, c->pred, ps);
    snprintf(name, sizeof name, "c%d_target", idx);
    oracle_put(o, name, c->target, ts);
    cf_tensor tp = cf_tensor_view(c->pred, ps), tt = cf_tensor_view(c->target, ts);
    c->per = malloc(n * sizeof(float));
    c->grad = malloc(np * sizeof(float));
    c->act = malloc(np * sizeof(float));
    assert_int_equal(cf_loss_forward(&c->loss, &tp, &tt, &c->mean, c->per), CF_OK);
    float again;
    assert_int_equal(cf_loss_forward(&c->loss, &tp, &tt, &again, NULL), CF_OK);
    assert_true(again == c->mean);
    cf_tensor tg = cf_tensor_view(c->grad, ps);
    cf_loss_backward(&c->loss, &tp, &tt, &tg);
    /* the activation in place (out == pred) */
    memcpy(c->act, c->pred, np * sizeof(float));
    cf_tensor ta = cf_tensor_view(c->act, ps);
    cf_loss_activation(&c->loss, &ta, &ta);
    size_t len = strlen(args);
    snprintf(args + len, args_size - len, " %d:%s:%g", idx, kind_name(loss.kind),
             (double)loss.label_smoothing);
}

static void compare_case(oracle *o, lcase *c, int idx) {
    char name[64], what[96];
    size_t np = cf_shape_numel(&c->ps);
    const char *k = kind_name(c->loss.kind);
    snprintf(name, sizeof name, "c%d_loss", idx);
    cf_tensor ref = oracle_get(o, name);
    snprintf(what, sizeof what, "case %d (%s) mean loss", idx, k);
    check(what, &c->mean, ref.data, 1);
    free(ref.data);
    snprintf(name, sizeof name, "c%d_per_item", idx);
    ref = oracle_get(o, name);
    assert_int_equal(cf_tensor_numel(&ref), c->ps.dim[0]);
    snprintf(what, sizeof what, "case %d (%s) per-item loss", idx, k);
    check(what, c->per, ref.data, (size_t)c->ps.dim[0]);
    free(ref.data);
    snprintf(name, sizeof name, "c%d_grad", idx);
    ref = oracle_get(o, name);
    assert_int_equal(cf_tensor_numel(&ref), np);
    snprintf(what, sizeof what, "case %d (%s) gradient", idx, k);
    check(what, c->grad, ref.data, np);
    free(ref.data);
    snprintf(name, sizeof name, "c%d_act", idx);
    ref = oracle_get(o, name);
    snprintf(what, sizeof what, "case %d (%s) activation", idx, k);
    check(what, c->act, ref.data, np);
    free(ref.data);
    free(c->pred);
    free(c->target);
    free(c->per);
    free(c->grad);
    free(c->act);
}

static void test_losses_match_pytorch(void **state) {
    (void)state;
    static oracle o;
    static lcase cases[16];
    static char args[1024];
    args[0] = 0;
    oracle_init(&o);
    int n = 0;
    const cf_loss ce = {.kind = CF_LOSS_CROSS_ENTROPY, .label_smoothing = 0.0f},
                  mse = {.kind = CF_LOSS_MSE, .label_smoothing = 0.0f},
                  bce = {.kind = CF_LOSS_BCE_LOGITS, .label_smoothing = 0.0f};
    cf_loss ce_ls1 = {.kind = CF_LOSS_CROSS_ENTROPY, .label_smoothing = 0.1f},
            ce_ls3 = {.kind = CF_LOSS_CROSS_ENTROPY, .label_smoothing = 0.3f};
#define ADD(loss, ps, ts, lo, hi)                                                                  \
    do {                                                                                           \
        add_case(&o, &cases[n], n, loss, ps, ts, lo, hi, args, sizeof args);                       \
        n++;                                                                                       \
    } while (0)
    ADD(ce, cf_shape2(1, 3), cf_shape1(1), -3, 3);
    ADD(ce, cf_shape2(7, 5), cf_shape1(7), -3, 3);
    ADD(ce_ls1, cf_shape2(64, 10), cf_shape1(64), -3, 3);
    ADD(ce_ls3, cf_shape2(13, 4), cf_shape2(13, 1), -3, 3);
    ADD(ce, cf_shape2(6, 10), cf_shape1(6), -60, 60); /* large logits */
    ADD(ce_ls1, cf_shape2(3, 1), cf_shape1(3), -3, 3);
    ADD(mse, cf_shape1(7), cf_shape1(7), -2, 2);
    ADD(mse, cf_shape2(5, 3), cf_shape2(5, 3), -2, 2);
    ADD(mse, cf_shape4(4, 2, 3, 3), cf_shape4(4, 2, 3, 3), -2, 2);
    ADD(mse, cf_shape2(6, 1), cf_shape1(6), -2, 2); /* flattened, not broadcast */
    ADD(bce, cf_shape2(8, 4), cf_shape2(8, 4), -4, 4);
    ADD(bce, cf_shape1(10), cf_shape1(10), -4, 4);
    ADD(bce, cf_shape2(6, 5), cf_shape2(6, 5), -40, 40); /* large logits */
    ADD(bce, cf_shape2(1, 1), cf_shape2(1, 1), -2, 2);
    /* a language model's rows: past the softmax's lanes and blocks (cf_exp_shift_sum) */
    ADD(ce, cf_shape2(5, 1337), cf_shape1(5), -8, 8);
    ADD(ce_ls1, cf_shape2(3, 2100), cf_shape1(3), -30, 30);
#undef ADD
    oracle_run(&o, "loss.py", args);
    for (int i = 0; i < n; i++) compare_case(&o, &cases[i], i);
    oracle_cleanup(&o);
}

static void test_cross_entropy_finite_differences(void **state) {
    (void)state;
    for (int ls = 0; ls < 2; ls++) {
        cf_loss loss = {.kind = CF_LOSS_CROSS_ENTROPY, .label_smoothing = ls ? 0.2f : 0.0f};
        float pred[5 * 7], target[5] = {0, 6, 3, 3, 1}, grad[5 * 7];
        fill_uniform(pred, 35, 9, -2, 2);
        cf_tensor tp = cf_tensor_view(pred, cf_shape2(5, 7)),
                  tt = cf_tensor_view(target, cf_shape1(5));
        cf_tensor tg = cf_tensor_view(grad, cf_shape2(5, 7));
        cf_loss_backward(&loss, &tp, &tt, &tg);
        const float h = 1e-2f;
        for (int i = 0; i < 35; i++) {
            float keep = pred[i], lp, lm;
            pred[i] = keep + h;
            assert_int_equal(cf_loss_forward(&loss, &tp, &tt, &lp, NULL), CF_OK);
            pred[i] = keep - h;
            assert_int_equal(cf_loss_forward(&loss, &tp, &tt, &lm, NULL), CF_OK);
            pred[i] = keep;
            double fd = ((double)lp - lm) / (2.0 * h);
            if (fabs(fd - grad[i]) > 2e-4 + 1e-2 * fabs(fd))
                fail_msg("cross-entropy (smoothing %g) d/dpred[%d]: backward %.6g, finite "
                         "difference %.6g",
                         (double)loss.label_smoothing, i, grad[i], fd);
        }
    }
}

static cf_status try_loss(cf_loss_kind kind, cf_shape ps, float *p, cf_shape ts, float *t) {
    cf_loss loss = {.kind = kind, .label_smoothing = 0.0f};
    cf_tensor tp = cf_tensor_view(p, ps), tt = cf_tensor_view(t, ts);
    float mean = -1;
    cf_status st = cf_loss_forward(&loss, &tp, &tt, &mean, NULL);
    if (st != CF_OK) assert_true(mean == -1); /* nothing written on failure */
    return st;
}

static void expect_error(cf_status st, const char *a, const char *b) {
    assert_int_equal(st, CF_ERR_INVALID);
    if (!strstr(cf_last_error(), a) || (b && !strstr(cf_last_error(), b)))
        fail_msg("message \"%s\" lacks \"%s\"%s%s", cf_last_error(), a, b ? " or " : "",
                 b ? b : "");
}

/* cf_row_max and cf_exp_shift_sum against libm's double exp of the float x - shift: every value
 * within 2e-7 relative (0 where exp is under FLT_MIN), the sum within 1e-6, lengths around the
 * lanes and blocks, out of place and in place, a NaN carried to the sum. Runs at every instruction
 * set. */
static void test_exp_shift_sum(void **state) {
    (void)state;
    const int lens[] = {1, 7, 15, 16, 17, 511, 512, 513, 1100, 11904};
    enum { MAXN = 11904 };
    static float x[MAXN], y[MAXN];
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int n = lens[li];
        fill_uniform(x, (size_t)n, 300 + li, -100.0f, 20.0f);
        x[n / 2] = 88.0f; /* the largest, somewhere in the middle */
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = fmaxf(mx, x[j]);
        assert_true(cf_row_max((size_t)n, x) == mx);
        for (int pass = 0; pass < 2; pass++) {
            const float shift = pass ? mx : 40.0f; /* with 40: arguments up to 48 */
            const double s = cf_exp_shift_sum((size_t)n, x, shift, y);
            double ref = 0;
            for (int j = 0; j < n; j++) {
                const float arg = x[j] - shift; /* rounded to float, as PyTorch's softmax */
                const double e = exp((double)arg);
                ref += e;
                if (e < 1.2e-38) {
                    assert_true(y[j] >= 0.0f && y[j] <= 1.2e-38f);
                    continue;
                }
                if (fabs(y[j] - e) > 2e-7 * e)
                    fail_msg("n %d: exp(%.9g - %.9g) = %.9g, expected %.9g", n, (double)x[j],
                             (double)shift, (double)y[j], e);
            }
            if (fabs(s - ref) > 1e-6 * ref) fail_msg("n %d: sum %.12g, expected %.12g", n, s, ref);
        }
        /* in place */
        const double s = cf_exp_shift_sum((size_t)n, x, mx, x);
        double ref = 0;
        for (int j = 0; j < n; j++) ref += y[j];
        assert_true(fabs(s - ref) <= 1e-6 * ref);
        for (int j = 0; j < n; j++) assert_true(x[j] == y[j]);
    }
    for (int j = 0; j < 100; j++) x[j] = (float)j / 50.0f;
    x[37] = NAN;
    assert_true(isnan(cf_exp_shift_sum(100, x, 2.0f, y)));
    assert_true(isnan(y[37]));
}

static void test_loss_errors(void **state) {
    (void)state;
    float p[4 * 10] = {0}, t[5] = {1, 2, 10, 0, 0};
    cf_shape ps = cf_shape2(4, 10);
    expect_error(try_loss(CF_LOSS_CROSS_ENTROPY, ps, p, cf_shape1(4), t), "target[2] = 10",
                 "[0, 10)");
    t[2] = -1;
    expect_error(try_loss(CF_LOSS_CROSS_ENTROPY, ps, p, cf_shape1(4), t), "target[2] = -1",
                 "cross-entropy");
    t[2] = 2.5f;
    expect_error(try_loss(CF_LOSS_CROSS_ENTROPY, ps, p, cf_shape1(4), t), "target[2] = 2.5", NULL);
    t[2] = NAN;
    expect_error(try_loss(CF_LOSS_CROSS_ENTROPY, ps, p, cf_shape1(4), t), "target[2] = nan", NULL);
    t[2] = 3;
    assert_int_equal(try_loss(CF_LOSS_CROSS_ENTROPY, ps, p, cf_shape1(4), t), CF_OK);
    expect_error(try_loss(CF_LOSS_CROSS_ENTROPY, ps, p, cf_shape1(5), t), "target (5)",
                 "pred (4, 10)");
    expect_error(try_loss(CF_LOSS_CROSS_ENTROPY, ps, p, cf_shape2(4, 2), t), "target (4, 2)", NULL);
    expect_error(try_loss(CF_LOSS_CROSS_ENTROPY, cf_shape1(40), p, cf_shape1(40), p),
                 "pred (40) must be (N, C)", NULL);
    cf_loss bad = {.kind = CF_LOSS_CROSS_ENTROPY, .label_smoothing = 1.5f};
    cf_tensor tp = cf_tensor_view(p, ps), tt = cf_tensor_view(t, cf_shape1(4));
    float mean;
    expect_error(cf_loss_forward(&bad, &tp, &tt, &mean, NULL), "label_smoothing 1.5", NULL);
    expect_error(try_loss(CF_LOSS_MSE, cf_shape2(4, 3), p, cf_shape2(4, 2), p), "MSE",
                 "target (4, 2) does not fit pred (4, 3)");
    expect_error(try_loss(CF_LOSS_MSE, cf_shape2(4, 3), p, cf_shape2(3, 4), p), "MSE",
                 "target (3, 4)");
    float bt[4] = {0, 1, 1.5f, 0};
    expect_error(try_loss(CF_LOSS_BCE_LOGITS, cf_shape1(4), p, cf_shape1(4), bt), "target[2] = 1.5",
                 "[0, 1]");
    expect_error(try_loss(CF_LOSS_BCE_LOGITS, cf_shape1(4), p, cf_shape1(3), bt), "BCE", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_losses_match_pytorch),
        cmocka_unit_test(test_cross_entropy_finite_differences),
        cmocka_unit_test(test_exp_shift_sum),
        cmocka_unit_test(test_loss_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
