/* The serial work of a training step moved onto the pool's threads, bitwise:
 *
 * - the optimizer's step and zero_grad (src/optim/optim.c): models of at least
 *   cf__opt_set_parallel_min's weights are stepped and zeroed over the pool, one job each; W1's
 *   108,528 weights are at the default threshold's side this asserts. Adam and SGD with momentum,
 *   a frozen parameter among them: the weights and both moments on 2 and 3 threads are bitwise
 *   the one-thread results, and the gradients are zero after;
 * - keyed Dropouts (a fit's draws, src/nn/activation.c): at least CF_DROPOUT_PARALLEL_MIN values
 *   split their forward's rows (the draws and the product) over the pool, one job; the backward
 *   stays on the caller. y and dx on 2 and 3 threads are bitwise the one-thread results; unkeyed
 *   draws (one stream), small layers, fewer rows than threads and one thread stay on the caller.
 *
 * - the keyed row kernel (cf_dropout_keyed_row, the tensor layer's, vectorised at AVX2 and
 *   AVX-512): the mask and product bitwise the scalar draws it replaced, at every level.
 *
 * Registered under every CF_ISA cap and over the AMX emulation (tests/serial_pool.cmake). */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "corefit/nn.h"
#include "corefit/optim.h"
#include "nn/nn_internal.h"
#include "optim/optim_internal.h"
#include "tensor/kernel_table.h"

#include <corefit.h>

static uint64_t jobs_now(void) {
    return cf__pool_get_stats().jobs;
}

/* ---- the optimizer ------------------------------------------------------------------------- */

typedef struct opt_out {
    float *w, *ga, *sa;
    uint64_t step_jobs, zero_jobs;
    bool zeroed;
} opt_out;

static opt_out opt_steps(cf_module *root, bool adam, int threads, int64_t parallel_min,
                         const float *grads) {
    cf_set_num_threads(threads);
    cf__opt_set_parallel_min(parallel_min);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, root, 5), CF_OK);
    if (model->n_params > 1) model->params[1]->trainable = false; /* a frozen one */
    cf_opt_config cfg = adam ? cf_opt_adam_defaults() : cf_opt_sgd_defaults();
    if (!adam) cfg.hypers.mom = 0.9;
    cfg.hypers.lr = 1e-2;
    cf_optimizer *opt;
    assert_int_equal(cf_optimizer_new(&opt, model, &cfg), CF_OK);
    const size_t n = model->n_weights;
    opt_out r = {malloc(n * 4), malloc(n * 4), malloc(n * 4), 0, 0, true};
    for (int s = 0; s < 3; s++) {
        for (size_t i = 0; i < n; i++) model->grads[i] = grads[i] * (float)(s + 1);
        uint64_t j0 = jobs_now();
        cf_optimizer_step(opt);
        uint64_t j1 = jobs_now();
        cf_optimizer_zero_grad(opt);
        r.step_jobs += j1 - j0;
        r.zero_jobs += jobs_now() - j1;
        for (size_t i = 0; i < n; i++) r.zeroed = r.zeroed && model->grads[i] == 0.0f;
    }
    memcpy(r.w, model->weights, n * 4);
    memcpy(r.ga, opt->grad_avg, n * 4);
    if (adam)
        memcpy(r.sa, opt->sqr_avg, n * 4);
    else
        memset(r.sa, 0, n * 4);
    cf_optimizer_free(opt);
    cf_model_free(model);
    cf__opt_set_parallel_min(-1);
    cf_set_num_threads(0);
    return r;
}

static void free_opt(opt_out *o) {
    free(o->w), free(o->ga), free(o->sa);
}

/* W1 (108,528 weights) or a 3-layer MLP of 1,287 */
static cf_module *net(int which) {
    if (which) return cf_mini_resnet(1, 10);
    cf_module *kids[3] = {cf_linear(17, 31, true), cf_relu(), cf_linear(31, 23, true)};
    return cf_sequential(3, kids);
}

static void test_optimizer(void **state) {
    (void)state;
    printf("kernels %s\n", cf_isa_name(cf_isa_active()));
    for (int adam = 0; adam < 2; adam++)
        for (int which = 0; which < 2; which++) {
            cf_model *probe;
            assert_int_equal(cf_model_new(&probe, net(which), 5), CF_OK);
            const size_t n = probe->n_weights;
            cf_model_free(probe);
            float *g = malloc(n * 4);
            fill_uniform(g, n, 77 + (uint64_t)which, -1, 1);
            const char *what = which ? "W1" : "MLP";
            opt_out one = opt_steps(net(which), adam, 1, -1, g);
            assert_int_equal(one.step_jobs + one.zero_jobs, 0);
            assert_true(one.zeroed);
            for (int t = 2; t <= 3; t++) {
                /* over the pool at every size, then at the default threshold */
                for (int dflt = 0; dflt < 2; dflt++) {
                    opt_out many = opt_steps(net(which), adam, t, dflt ? -1 : 0, g);
                    /* W1 is stepped over the pool at the default threshold, the MLP is not */
                    const uint64_t want = dflt && !which ? 0 : 3;
                    if (many.step_jobs != want || many.zero_jobs != want)
                        fail_msg("%s %s on %d threads (%s threshold): %llu step and %llu "
                                 "zero_grad pool jobs in 3 steps, not %llu each",
                                 adam ? "Adam" : "SGD", what, t, dflt ? "default" : "zero",
                                 (unsigned long long)many.step_jobs,
                                 (unsigned long long)many.zero_jobs, (unsigned long long)want);
                    if (!many.zeroed) fail_msg("%s: gradients not zeroed on %d threads", what, t);
                    if (memcmp(one.w, many.w, n * 4))
                        fail_msg("%s: weights differ on %d threads", what, t);
                    if (memcmp(one.ga, many.ga, n * 4))
                        fail_msg("%s: grad_avg differs on %d threads", what, t);
                    if (memcmp(one.sa, many.sa, n * 4))
                        fail_msg("%s: sqr_avg differs on %d threads", what, t);
                    free_opt(&many);
                }
            }
            free_opt(&one);
            free(g);
        }
}

/* ---- keyed Dropout ------------------------------------------------------------------------- */

typedef struct drop_out {
    float *y, *dx;
    uint64_t fwd_jobs, bwd_jobs;
} drop_out;

static drop_out drop_pass(int rows, int cols, bool keyed, int threads, const float *x,
                          const float *dy) {
    cf_set_num_threads(threads);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_dropout(0.5f), 9), CF_OK);
    cf_model_train(model, true);
    int64_t *ids = malloc((size_t)rows * sizeof *ids);
    for (int i = 0; i < rows; i++) ids[i] = 1000 + 7 * i;
    if (keyed) cf_model_set_draw_key(model, 3, ids, rows);
    const size_t n = (size_t)rows * cols;
    const cf_tensor tx = cf_tensor_view((float *)x, cf_shape2(rows, cols));
    const cf_tensor *ty;
    drop_out r = {malloc(n * 4), malloc(n * 4), 0, 0};
    uint64_t j0 = jobs_now();
    assert_int_equal(cf_model_forward(model, &tx, &ty), CF_OK);
    r.fwd_jobs = jobs_now() - j0;
    memcpy(r.y, ty->data, n * 4);
    const cf_tensor tdy = cf_tensor_view((float *)dy, ty->shape);
    j0 = jobs_now();
    const cf_tensor *tdx = model->root->ops->backward(model->root, &tdy, true);
    r.bwd_jobs = jobs_now() - j0;
    assert_non_null(tdx);
    memcpy(r.dx, tdx->data, n * 4);
    cf_model_free(model);
    free(ids);
    cf_set_num_threads(0);
    return r;
}

static void test_dropout(void **state) {
    (void)state;
    static const struct {
        int rows, cols;
        bool keyed, split; /* split: the forward is one pool job on 2 and 3 threads */
    } cases[] = {
        {64, 256, true, true},   /* W1's Dropout(0.5) */
        {64, 128, true, true},   /* W1's Dropout(0.25), at the threshold's side */
        {37, 333, true, true},   /* odd rows and an odd row length */
        {64, 32, true, false},   /* 2,048 values: below the threshold */
        {2, 4096, true, false},  /* fewer rows than 3 threads (and 2 on 2: split there) */
        {64, 256, false, false}, /* unkeyed: one stream, in order */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int rows = cases[c].rows, cols = cases[c].cols;
        const size_t n = (size_t)rows * cols;
        float *x = malloc(n * 4), *dy = malloc(n * 4);
        fill_uniform(x, n, 5 + c, -2, 2);
        fill_uniform(dy, n, 6 + c, -1, 1);
        drop_out one = drop_pass(rows, cols, cases[c].keyed, 1, x, dy);
        assert_int_equal(one.fwd_jobs + one.bwd_jobs, 0);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            if (one.y[i] != 0.0f) {
                kept++;
                if (one.y[i] != x[i] * 2.0f) fail_msg("case %zu: y[%zu] is not 2x", c, i);
                if (one.dx[i] != dy[i] * 2.0f) fail_msg("case %zu: dx[%zu] is not 2dy", c, i);
            } else if (one.dx[i] != 0.0f)
                fail_msg("case %zu: dx[%zu] kept where y was dropped", c, i);
        }
        if (kept < n * 4 / 10 || kept > n * 6 / 10)
            fail_msg("case %zu: %zu of %zu kept at p = 0.5", c, kept, n);
        for (int t = 2; t <= 3; t++) {
            drop_out many = drop_pass(rows, cols, cases[c].keyed, t, x, dy);
            const bool split = cases[c].split || (c == 4 && t == 2);
            const uint64_t want_f = split ? 1 : 0, want_b = 0;
            if (many.fwd_jobs != want_f || many.bwd_jobs != want_b)
                fail_msg("Dropout (%d, %d)%s on %d threads: %llu forward and %llu backward pool "
                         "jobs, not %llu and %llu",
                         rows, cols, cases[c].keyed ? "" : " unkeyed", t,
                         (unsigned long long)many.fwd_jobs, (unsigned long long)many.bwd_jobs,
                         (unsigned long long)want_f, (unsigned long long)want_b);
            if (memcmp(one.y, many.y, n * 4))
                fail_msg("Dropout (%d, %d): y differs on %d threads", rows, cols, t);
            if (memcmp(one.dx, many.dx, n * 4))
                fail_msg("Dropout (%d, %d): dx differs on %d threads", rows, cols, t);
            free(many.y), free(many.dx);
        }
        /* forced onto the pool at every size: still the same bits */
        cf__nn_set_dropout_min(0);
        drop_out forced = drop_pass(rows, cols, cases[c].keyed, 2, x, dy);
        cf__nn_set_dropout_min(-1);
        if (memcmp(one.y, forced.y, n * 4) || memcmp(one.dx, forced.dx, n * 4))
            fail_msg("Dropout (%d, %d): differs on 2 threads at threshold 0", rows, cols);
        free(forced.y), free(forced.dx);
        free(one.y), free(one.dx);
        free(x), free(dy);
    }
}

/* ---- the keyed row kernel ------------------------------------------------------------------ */

/* The draws as activation.c made them before the kernel (one 64-bit word a pair, scalar), and
 * the product as dropout_apply makes it. */
static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void reference_row(uint64_t row, size_t per, uint64_t threshold, float scale, const float *x,
                          uint8_t *mask, float *y) {
    for (size_t i = 0; i < per; i += 2) {
        uint64_t r = mix(row + (uint64_t)(i / 2 + 1) * 0x9e3779b97f4a7c15ULL);
        mask[i] = (r & 0xffffffffu) >= threshold;
        if (i + 1 < per) mask[i + 1] = (r >> 32) >= threshold;
    }
    for (size_t i = 0; i < per; i++) y[i] = mask[i] ? x[i] * scale : 0.0f;
}

static void test_keyed_row(void **state) {
    (void)state;
    const cf_isa isa = cf_isa_active();
    /* the vector levels take their own compiled loop; generic and NEON the baseline one */
    if (isa == CF_ISA_AVX2 || isa == CF_ISA_AVX512 || isa == CF_ISA_AVX512_BF16 ||
        isa == CF_ISA_AMX)
        assert_non_null(cf_active_kernels->dropout_keyed_row);
    static const size_t pers[] = {1, 2, 3, 7, 16, 31, 128, 255, 256, 1000};
    static const double ps[] = {0.0, 0.1, 0.25, 0.5, 0.9, 1.0};
    float x[1001], y[1001], yr[1001];
    uint8_t mask[1001], mr[1001];
    fill_uniform(x, 1001, 99, -3, 3);
    x[5] = -0.0f, x[6] = 1e-40f; /* a negative zero and a subnormal keep their bits */
    for (size_t a = 0; a < sizeof pers / sizeof pers[0]; a++)
        for (size_t b = 0; b < sizeof ps / sizeof ps[0]; b++) {
            const uint64_t threshold = (uint64_t)llround(ps[b] * 4294967296.0);
            const float scale = ps[b] < 1.0 ? (float)(1.0 / (1.0 - ps[b])) : 0.0f;
            const uint64_t row = mix(0x1234 + a * 77 + b);
            memset(mask, 7, sizeof mask), memset(y, 0x55, sizeof y);
            cf_dropout_keyed_row(row, pers[a], threshold, scale, x, mask, y);
            reference_row(row, pers[a], threshold, scale, x, mr, yr);
            if (memcmp(mask, mr, pers[a]) || memcmp(y, yr, pers[a] * 4))
                fail_msg("%s: keyed row of %zu at p = %g differs from the scalar draws",
                         cf_isa_name(isa), pers[a], ps[b]);
            if (mask[pers[a]] != 7) fail_msg("row of %zu: wrote past its end", pers[a]);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyed_row),
        cmocka_unit_test(test_optimizer),
        cmocka_unit_test(test_dropout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
