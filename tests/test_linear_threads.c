/* Linear layers on 2 and 3 threads, where the backward runs dW and dx side by side on two of the
 * pool's threads (src/nn/linear.c: products of at least 2^20 multiply-adds each): the backward is
 * one pool job there (none on one thread, none below the threshold), and the output, dx, dW and
 * db are bitwise the one-thread results, in fp32 and in bf16 (cf_linear_set_bf16; fp32 below
 * avx512_bf16), with and without a bias; the one-thread results match a double-precision product
 * (fp32: 1e-5; bf16: the inputs rounded to bf16, 1e-2). W1's Linear(256, 10) is below the
 * threshold. Registered under every CF_ISA cap and over the AMX emulation
 * (tests/linear_threads.cmake). */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "corefit/nn.h"

typedef struct lcase {
    int n, in, out;
    bool bias;
} lcase;

typedef struct out {
    float *y, *dx, *dw, *db;
    uint64_t backward_jobs; /* pool jobs the backward dispatched */
} out;

static out passes(const lcase *lc, int threads, bool bf16, const float *x, const float *dy,
                  const float *w, const float *b) {
    cf_set_num_threads(threads);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_linear(lc->in, lc->out, lc->bias), 3), CF_OK);
    assert_int_equal(cf_linear_set_bf16(model->root, bf16), 1);
    memcpy(cf_model_param(model, "weight")->data, w, (size_t)lc->out * lc->in * 4);
    if (lc->bias) memcpy(cf_model_param(model, "bias")->data, b, (size_t)lc->out * 4);
    cf_model_train(model, true);
    cf_model_zero_grad(model);
    const cf_tensor tx = cf_tensor_view((float *)x, cf_shape2(lc->n, lc->in));
    const cf_tensor *ty;
    assert_int_equal(cf_model_forward(model, &tx, &ty), CF_OK);
    const size_t ny = (size_t)lc->n * lc->out, nx = (size_t)lc->n * lc->in,
                 nw = (size_t)lc->out * lc->in;
    out r = {malloc(ny * 4), malloc(nx * 4), malloc(nw * 4), calloc((size_t)lc->out, 4), 0};
    memcpy(r.y, ty->data, ny * 4);
    const cf_tensor tdy = cf_tensor_view((float *)dy, ty->shape);
    const uint64_t jobs = cf__pool_get_stats().jobs;
    const cf_tensor *tdx = model->root->ops->backward(model->root, &tdy, true);
    r.backward_jobs = cf__pool_get_stats().jobs - jobs;
    assert_non_null(tdx);
    memcpy(r.dx, tdx->data, nx * 4);
    memcpy(r.dw, cf_model_param(model, "weight")->grad, nw * 4);
    if (lc->bias) memcpy(r.db, cf_model_param(model, "bias")->grad, (size_t)lc->out * 4);
    cf_model_free(model);
    cf_set_num_threads(0);
    return r;
}

static void free_out(out *o) {
    free(o->y), free(o->dx), free(o->dw), free(o->db);
}

/* The value as the bf16 products see it (round to nearest even), or itself in fp32. */
static double in_prec(float v, bool bf16) {
    if (!bf16) return v;
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

/* y = x W^T + b, dx = dy W, dW = dy^T x, db = column sums of dy, in double. */
static void reference(const lcase *lc, bool bf16, const float *x, const float *dy, const float *w,
                      const float *b, out *ref) {
    for (int i = 0; i < lc->n; i++)
        for (int o = 0; o < lc->out; o++) {
            double s = lc->bias ? b[o] : 0;
            for (int k = 0; k < lc->in; k++)
                s += in_prec(x[(size_t)i * lc->in + k], bf16) *
                     in_prec(w[(size_t)o * lc->in + k], bf16);
            ref->y[(size_t)i * lc->out + o] = (float)s;
        }
    for (int i = 0; i < lc->n; i++)
        for (int k = 0; k < lc->in; k++) {
            double s = 0;
            for (int o = 0; o < lc->out; o++)
                s += in_prec(dy[(size_t)i * lc->out + o], bf16) *
                     in_prec(w[(size_t)o * lc->in + k], bf16);
            ref->dx[(size_t)i * lc->in + k] = (float)s;
        }
    for (int o = 0; o < lc->out; o++) {
        double sb = 0;
        for (int k = 0; k < lc->in; k++) {
            double s = 0;
            for (int i = 0; i < lc->n; i++)
                s += in_prec(dy[(size_t)i * lc->out + o], bf16) *
                     in_prec(x[(size_t)i * lc->in + k], bf16);
            ref->dw[(size_t)o * lc->in + k] = (float)s;
        }
        for (int i = 0; i < lc->n; i++) sb += dy[(size_t)i * lc->out + o];
        ref->db[o] = (float)sb;
    }
}

static void test_threads(void **state) {
    (void)state;
    static const lcase cases[] = {
        {64, 128, 256, false}, /* W1's Linear(128, 256): 2.1 M multiply-adds a product, paired */
        {67, 131, 257, true},  /* odd rows and columns, a bias */
        {2, 700, 800, true},   /* fewer rows than threads: 1.1 M, paired */
        {64, 256, 10, false},  /* W1's Linear(256, 10): 164 k, below the threshold */
    };
    printf("kernels %s, bf16 compute %s\n", cf_isa_name(cf_isa_active()),
           cf_bf16_compute() ? "yes" : "no");
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const lcase *lc = &cases[i];
            const size_t nx = (size_t)lc->n * lc->in, ny = (size_t)lc->n * lc->out,
                         nw = (size_t)lc->out * lc->in;
            float *x = malloc(nx * 4), *dy = malloc(ny * 4), *w = malloc(nw * 4),
                  *b = malloc((size_t)lc->out * 4);
            fill_uniform(x, nx, 10 + i, -2, 2);
            fill_uniform(dy, ny, 20 + i, -1, 1);
            fill_uniform(w, nw, 30 + i, -0.5f, 0.5f);
            fill_uniform(b, (size_t)lc->out, 40 + i, -1, 1);
            out one = passes(lc, 1, bf16, x, dy, w, b);
            const bool computes_bf16 = bf16 && cf_bf16_compute();
            char what[128];
            snprintf(what, sizeof what, "%s Linear(%d, %d), %d rows%s", bf16 ? "bf16" : "fp32",
                     lc->in, lc->out, lc->n, lc->bias ? ", bias" : "");
            out ref = {malloc(ny * 4), malloc(nx * 4), malloc(nw * 4), malloc((size_t)lc->out * 4),
                       0};
            const bool paired = (double)lc->n * lc->in * lc->out >= 1 << 20;
            assert_int_equal(one.backward_jobs, 0);
            reference(lc, computes_bf16, x, dy, w, b, &ref);
            const double tol = computes_bf16 ? 1e-2 : 1e-5;
            assert_close(what, one.y, ref.y, ny, tol, tol);
            assert_close(what, one.dx, ref.dx, nx, tol, tol);
            assert_close(what, one.dw, ref.dw, nw, tol, tol);
            if (lc->bias) assert_close(what, one.db, ref.db, (size_t)lc->out, 1e-5, 1e-5);
            for (int t = 2; t <= 3; t++) {
                out many = passes(lc, t, bf16, x, dy, w, b);
                if (many.backward_jobs != (paired ? 1u : 0u))
                    fail_msg("%s: the backward on %d threads dispatched %llu pool jobs, not %d",
                             what, t, (unsigned long long)many.backward_jobs, paired ? 1 : 0);
                if (memcmp(one.y, many.y, ny * 4)) fail_msg("%s: y differs on %d threads", what, t);
                if (memcmp(one.dx, many.dx, nx * 4))
                    fail_msg("%s: dx differs on %d threads", what, t);
                if (memcmp(one.dw, many.dw, nw * 4))
                    fail_msg("%s: dW differs on %d threads", what, t);
                if (memcmp(one.db, many.db, (size_t)lc->out * 4))
                    fail_msg("%s: db differs on %d threads", what, t);
                free_out(&many);
            }
            free_out(&one);
            free_out(&ref);
            free(x), free(dy), free(w), free(b);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
