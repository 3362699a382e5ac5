/* The forward link through a residual block's stride-2 pair (cf_nn_conv_words_pair): a BatchNorm
 * right before the block writes the bf16 words of its output into the convpath's first conv,
 * which computes the idpath's 1x1 stride-2 shortcut from them too; the BatchNorm's fp32 output
 * (the shortcut's x) is never written. Where the shortcut then sums its own weight gradient (its
 * sibling did not take it over), it first makes x fp32 again from the sibling's kept words
 * (words_restore in src/nn/conv.c). Two ways get there:
 *  - no partial sums lent (cf__nn_set_shortcut_dw_lend(false), as when the transient pool has
 *    none): the sibling still sums its own weight gradient from the words;
 *  - the sibling's weights frozen between the forward and the backward (a callback's freeze):
 *    the sibling takes no weight gradient, so it lends none.
 * (A block right after a BatchNorm in its Sequential always gets need_dx, so the block's backward
 * without dx does not occur with the link.)
 *
 * Each case runs STEPS training steps and an eval forward of Sequential(BN, block) on W1's block
 * 0.3 shapes twice from the same seed, linked and with the pair's link off
 * (cf__nn_set_x_pair_link(false)): every output, input gradient, gradient (the shortcut's weight
 * gradient among them), buffer and updated weight must be memcmp-equal, at 1, 2 and 3 threads.
 * At a level with bf16 kernels the linked run must have read the words and restored x once a
 * training step (cf__nn_words_restored); at one without (tests/words_restore.cmake caps CF_ISA
 * at each level) the link is off: the test says it is skipped there and still checks that the
 * two runs agree and nothing was restored. Against PyTorch (tests/oracle/words_restore.py, the
 * model in fp32 from the same weights, x and dy) the restored shortcut's weight gradient is within
 * bf16 rounding of the products' magnitudes. Without words_restore's conversion the shortcut's
 * weight gradient is summed from the unwritten x and all three checks fail. */
#include "block_nets.h"
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"
#include "tensor/kernel_table.h"

#define STEPS 3
#define N 6
#define C 16
#define H 28
#define W 28
#define O 32

typedef enum { NO_LEND, FROZEN_SIBLING } restore_way;

/* BatchNorm, then W1's block 0.3: 3x3 stride 2, BN, ReLU, 3x3, BN; shortcut 1x1 stride 2, BN. */
static cf_module *build(void) {
    cf_module *cp[] = {cf_conv2d(C, O, 3, 2, 1, false), cf_batchnorm2d(O), cf_relu(),
                       cf_conv2d(O, O, 3, 1, 1, false), cf_batchnorm2d(O)};
    cf_module *ip[] = {cf_conv2d(C, O, 1, 2, 0, false), cf_batchnorm2d(O)};
    cf_module *m[] = {cf_batchnorm2d(C),
                      cf_residual(cf_sequential(5, cp), cf_sequential(2, ip), true)};
    return cf_sequential(2, m);
}

/* The block's convpath's first conv (the pair's) and the idpath's (the shortcut). */
static cf_module *sibling(cf_model *model) {
    return model->root->children[1]->children[0]->children[0];
}

static cf_module *shortcut(cf_model *model) {
    return model->root->children[1]->children[1]->children[0];
}

/* A training step's backward (cf_model_backward: the pass must succeed) and update, recorded: dy
 * uniform in [-1, 1) from the step's seed, the gradients and buffers, then w -= 0.05 grad. */
static void backward_step(record *r, cf_model *model, const cf_tensor *y, int step) {
    const size_t ny = cf_tensor_numel(y);
    float *dy = malloc(ny * sizeof(float));
    assert_non_null(dy);
    fill_uniform(dy, ny, 400 + (uint64_t)step, -1, 1);
    cf_tensor tdy = cf_tensor_view(dy, y->shape);
    const cf_status st = cf_model_backward(model, &tdy);
    if (st != CF_OK) fail_msg("backward: %s", cf_last_error());
    put(r, model->grads, model->n_weights);
    put(r, model->buffers, model->n_buffers);
    for (size_t i = 0; i < model->n_weights; i++) model->weights[i] -= 0.05f * model->grads[i];
    put(r, model->weights, model->n_weights);
    free(dy);
}

/* The model in bf16 (seed 33). */
static cf_model *new_bf16_model(void) {
    return block_model(build(), 33, true, false);
}

/* One run; *restored: how many times words_restore converted x, *read: the training forwards
 * whose sibling read the BatchNorm's words. */
static record run_case(restore_way way, bool link, int threads, unsigned long *restored,
                       int *read) {
    cf_set_num_threads(threads);
    cf__nn_set_x_pair_link(link);
    cf__nn_set_shortcut_dw_lend(way != NO_LEND);
    cf_model *model = new_bf16_model();
    const size_t nx = (size_t)N * C * H * W;
    float *x = malloc(nx * sizeof(float));
    assert_non_null(x);
    record r = {0};
    const unsigned long before = cf__nn_words_restored();
    *read = 0;
    for (int step = 0; step <= STEPS; step++) {
        const bool training = step < STEPS;
        step_start(model, x, nx, 300 + (uint64_t)step, training);
        cf_tensor tx = cf_tensor_view(x, cf_shape4(N, C, H, W));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        if (cf_nn_conv_read_words(sibling(model))) (*read)++;
        put(&r, y->data, cf_tensor_numel(y));
        if (!training) break;
        cf_param *sw = &sibling(model)->params[0];
        if (way == FROZEN_SIBLING) sw->trainable = false;
        backward_step(&r, model, y, step);
        sw->trainable = true;
        /* the shortcut's weight gradient itself, summed (not zero) */
        const cf_param *scw = &shortcut(model)->params[0];
        double sum = 0;
        for (size_t i = 0; i < scw->numel; i++) sum += (double)scw->grad[i] * scw->grad[i];
        assert_true(sum > 0);
        put(&r, scw->grad, scw->numel);
    }
    *restored = cf__nn_words_restored() - before;
    free(x);
    cf_model_free(model);
    cf__nn_set_x_pair_link(true);
    cf__nn_set_shortcut_dw_lend(true);
    cf_set_num_threads(1);
    return r;
}

static void check(restore_way way, int threads) {
    const char *name = way == NO_LEND ? "no partial sums lent" : "sibling frozen";
    const bool bf16 = cf_bf16_compute();
    unsigned long restored_on, restored_off;
    int read_on, read_off;
    record a = run_case(way, true, threads, &restored_on, &read_on);
    record b = run_case(way, false, threads, &restored_off, &read_off);
    const int want = bf16 ? STEPS : 0;
    if (read_on != want || (int)restored_on != want)
        fail_msg("%s, %d threads: the sibling read the words %d times and the shortcut restored "
                 "x %lu times in %d training steps, expected %d",
                 name, threads, read_on, restored_on, STEPS, want);
    assert_int_equal(read_off, 0);
    assert_int_equal(restored_off, 0);
    char what[96];
    snprintf(what, sizeof what, "%s (%d threads)", name, threads);
    records_equal(a, b, what, "linked", "pair link off");
}

static void skip_note(void) {
    if (!cf_bf16_compute())
        printf("[  SKIPPED ] words_restore: no bf16 kernels at this level (the link is off); "
               "only the fp32 runs' agreement is checked\n");
}

static void test_no_lend(void **state) {
    (void)state;
    skip_note();
    for (int t = 1; t <= 3; t++) check(NO_LEND, t);
}

static void test_frozen_sibling(void **state) {
    (void)state;
    skip_note();
    for (int t = 1; t <= 3; t++) check(FROZEN_SIBLING, t);
}

/* A training forward of x (seed 300, N x C x H x W, which *x holds; *tx views it and must
 * outlive the backward). */
static void train_forward(cf_model *model, float **x, cf_tensor *tx, const cf_tensor **y) {
    const size_t nx = (size_t)N * C * H * W;
    *x = malloc(nx * sizeof(float));
    assert_non_null(*x);
    step_start(model, *x, nx, 300, true);
    *tx = cf_tensor_view(*x, cf_shape4(N, C, H, W));
    assert_int_equal(cf_model_forward(model, tx, y), CF_OK);
}

/* Lent partial sums (the default): the sibling takes the shortcut's weight gradient over and
 * nothing is restored, linked or not. */
static void test_lent_not_restored(void **state) {
    (void)state;
    cf__nn_set_shortcut_dw_lend(true);
    cf_model *model = new_bf16_model();
    float *x;
    cf_tensor tx;
    const cf_tensor *y;
    train_forward(model, &x, &tx, &y);
    const unsigned long before = cf__nn_words_restored();
    record r = {0};
    backward_step(&r, model, y, 0);
    assert_int_equal(cf__nn_words_restored(), before);
    assert_int_equal(cf_nn_conv_read_words(sibling(model)), cf_bf16_compute());
    if (cf_bf16_compute()) assert_true(cf_nn_conv_dw_by_sibling(shortcut(model)));
    free(r.v);
    free(x);
    cf_model_free(model);
}

/* PyTorch (tests/oracle/words_restore.py): the same model in fp32 from the same weights, x and dy;
 * the restored shortcut's weight gradient (and its sibling's) to bf16 tolerance, no partial sums
 * lent, 2 threads (fp32 at a level without bf16 kernels, to fp32 rounding). */
static void put_param(oracle *o, const char *name, const cf_param *p) {
    oracle_put(o, name, p->data, p->shape);
}

static void test_oracle(void **state) {
    (void)state;
    cf_set_num_threads(2);
    cf__nn_set_shortcut_dw_lend(false);
    cf_model *model = new_bf16_model();
    cf_module *root = model->root, *cp = root->children[1]->children[0],
              *ip = root->children[1]->children[1];
    /* BatchNorms' affine parameters away from 1 and 0 */
    const cf_module *bns[] = {root->children[0], cp->children[1], cp->children[4], ip->children[1]};
    for (int b = 0; b < 4; b++) {
        fill_uniform(bns[b]->params[0].data, bns[b]->params[0].numel, 50 + (uint64_t)b, 0.5f, 1.5f);
        fill_uniform(bns[b]->params[1].data, bns[b]->params[1].numel, 60 + (uint64_t)b, -0.5f,
                     0.5f);
    }
    oracle o;
    oracle_init(&o);
    const char *bn_names[] = {"bn0", "bna", "bnb", "bns"};
    for (int b = 0; b < 4; b++) {
        char w[16], bi[16];
        snprintf(w, sizeof w, "%s_w", bn_names[b]);
        snprintf(bi, sizeof bi, "%s_b", bn_names[b]);
        put_param(&o, w, &bns[b]->params[0]);
        put_param(&o, bi, &bns[b]->params[1]);
    }
    put_param(&o, "ca", &cp->children[0]->params[0]);
    put_param(&o, "cb", &cp->children[3]->params[0]);
    put_param(&o, "cs", &ip->children[0]->params[0]);
    float *x;
    cf_tensor tx;
    const cf_tensor *y;
    train_forward(model, &x, &tx, &y);
    const size_t ny = cf_tensor_numel(y);
    float *dy = malloc(ny * sizeof(float)), *yc = malloc(ny * sizeof(float));
    assert_non_null(dy), assert_non_null(yc);
    memcpy(yc, y->data, ny * sizeof(float));
    fill_uniform(dy, ny, 400, -1, 1);
    cf_tensor tdy = cf_tensor_view(dy, y->shape);
    const unsigned long before = cf__nn_words_restored();
    assert_int_equal(cf_model_backward(model, &tdy), CF_OK);
    assert_int_equal(cf__nn_words_restored() - before, cf_bf16_compute() ? 1 : 0);
    oracle_put(&o, "x", x, tx.shape);
    oracle_put(&o, "dy", dy, tdy.shape);
    oracle_run(&o, "words_restore.py", "");
    cf_tensor ry = oracle_get(&o, "y"), gcs = oracle_get(&o, "gcs");
    const cf_param *scw = &ip->children[0]->params[0];
    assert_int_equal(cf_tensor_numel(&gcs), scw->numel);
    /* bf16 operands (8 significant bits) and a dy that went through bf16 layers: the error
     * against the sum of the products' magnitudes (the weight gradient cancels itself: the
     * BatchNorm after makes the output blind to the weights' scale) */
    cf_tensor gabs = oracle_get(&o, "gcs_abs");
    assert_int_equal(cf_tensor_numel(&gabs), scw->numel);
    double worst = 0;
    for (size_t i = 0; i < scw->numel; i++) {
        const double e = fabs(scw->grad[i] - gcs.data[i]) / gabs.data[i];
        if (!(worst >= e) && worst == worst) worst = e; /* a NaN stays, and fails the bound */
    }
    printf("the shortcut's weight gradient: worst error %.3g of its products' magnitudes\n", worst);
    assert_true(worst < (cf_bf16_compute() ? 1.0 / 64 : 1e-5));
    assert_close("y", yc, ry.data, ny, 3e-2, 3e-2);
    free(gabs.data);
    free(ry.data), free(gcs.data);
    oracle_cleanup(&o);
    free(x), free(dy), free(yc);
    cf_model_free(model);
    cf__nn_set_shortcut_dw_lend(true);
    cf_set_num_threads(1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_lend),
        cmocka_unit_test(test_frozen_sibling),
        cmocka_unit_test(test_lent_not_restored),
        cmocka_unit_test(test_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
