/* The image split (src/nn/batchnorm.c, src/nn/split.c): with more than one thread, BatchNorm2d
 * and the elementwise and pooling layers split the batch by whole images, in the chunks
 * cf_parallel_for gives the convolutions, so that no activation crosses between cores. Checked
 * here:
 *
 * - cf_nn_parallel_images hands each thread whole images, the same ones cf_parallel_for over the
 *   images gives it, for several thread counts and batch sizes (odd ones too);
 * - BatchNorm2d's results (output, input gradient, weight and bias gradients, running
 *   statistics) are bitwise the same with 1, 2, 3 and 4 threads, in training and eval mode,
 *   alone, fused with a following ReLU, as a residual block's last layer that writes the block's
 *   max(a + y, 0), and synchronised (cf_model_set_bn_reduce, a group of one);
 * - the training forward takes the statistics job then the output job (two pool jobs where the
 *   channel split took one), so the split is the one that runs. */
#include "oracle.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "corefit/nn.h"
#include "nn/nn_internal.h"

/* ---- cf_nn_parallel_images ----------------------------------------------------------------- */

#define MAX_VALUES 4096

typedef struct record {
    _Atomic int owner[MAX_VALUES]; /* the thread that got each value, -1: none */
    _Atomic int calls;
} record;

static void record_values(void *v, int64_t b, int64_t e, int thread) {
    record *r = v;
    atomic_fetch_add(&r->calls, 1);
    for (int64_t i = b; i < e; i++) atomic_store(&r->owner[i], thread);
}

static void record_images(void *v, int64_t b, int64_t e, int thread) {
    record_values(v, b, e, thread);
}

static void test_parallel_images_follows_image_chunks(void **state) {
    (void)state;
    static record by_values, by_images;
    const int per_image = 5;
    for (int t = 1; t <= 4; t++) {
        cf_set_num_threads(t);
        for (int n = 1; n <= 13; n++) {
            for (int i = 0; i < MAX_VALUES; i++) by_values.owner[i] = by_images.owner[i] = -1;
            cf_nn_parallel_images(n, per_image, record_values, &by_values);
            cf_parallel_for(n, record_images, &by_images);
            for (int64_t i = 0; i < (int64_t)n * per_image; i++)
                if (by_values.owner[i] < 0)
                    fail_msg("%d threads, %d images: value %d not run", t, n, (int)i);
            if (n < t) continue; /* fewer images than threads: the values are split */
            for (int64_t i = 0; i < (int64_t)n * per_image; i++)
                if (by_values.owner[i] != by_images.owner[i / per_image])
                    fail_msg("%d threads, %d images: value %d (image %d) ran on thread %d, the "
                             "image on thread %d",
                             t, n, (int)i, (int)(i / per_image), by_values.owner[i],
                             by_images.owner[i / per_image]);
        }
    }
    cf_set_num_threads(2);
}

/* ---- BatchNorm2d across thread counts ------------------------------------------------------- */

enum { ALONE, RELU, RESIDUAL, BN1D };

typedef struct result {
    float *y, *dx, *grads, *buffers;
    size_t ny, nx, ng, nb;
} result;

static float *dup(const float *a, size_t n) {
    float *c = malloc((n ? n : 1) * sizeof(float));
    memcpy(c, a, n * sizeof(float));
    return c;
}

static void free_result(result *r) {
    free(r->y);
    free(r->dx);
    free(r->grads);
    free(r->buffers);
}

/* A group of one: the sums stay as they are. */
static cf_status reduce_alone(double *buf, size_t n, bool backward, void *ctx) {
    (void)buf, (void)n, (void)backward;
    (*(int *)ctx)++;
    return CF_OK;
}

static cf_module *build(int kind, int c) {
    if (kind == ALONE) return cf_batchnorm2d(c);
    if (kind == BN1D) return cf_batchnorm1d(c);
    if (kind == RELU) {
        cf_module *m[] = {cf_batchnorm2d(c), cf_relu()};
        return cf_sequential(2, m);
    }
    /* relu(convpath(x) + bn(x)): the idpath's BatchNorm writes the block's output */
    cf_module *cp[] = {cf_batchnorm2d(c), cf_relu()};
    cf_module *ip[] = {cf_batchnorm2d(c)};
    return cf_residual(cf_sequential(2, cp), cf_sequential(1, ip), true);
}

/* Non-trivial affine parameters on every BatchNorm. */
static void set_affine(cf_module *m, uint64_t *seed) {
    if (strcmp(m->ops->kind, "BatchNorm2d") == 0 || strcmp(m->ops->kind, "BatchNorm1d") == 0) {
        fill_uniform(m->params[0].data, m->params[0].numel, (*seed)++, 0.5f, 1.5f);
        fill_uniform(m->params[1].data, m->params[1].numel, (*seed)++, -0.5f, 0.5f);
    }
    for (int i = 0; i < m->n_children; i++) set_affine(m->children[i], seed);
}

/* Two steps (forward, backward from a random dy) of a fresh model; the second one kept. */
static result run(int kind, bool train, bool sync, int threads, cf_shape xs, int *reduces,
                  uint64_t *jobs) {
    cf_set_num_threads(threads);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, build(kind, xs.dim[1]), 5), CF_OK);
    if (sync) assert_int_equal(cf_model_set_bn_reduce(model, reduce_alone, reduces), CF_OK);
    uint64_t seed = 900;
    set_affine(model->root, &seed);
    cf_model_train(model, train);
    cf_model_zero_grad(model);
    const size_t n = cf_shape_numel(&xs);
    float *x = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
    result r = {0};
    for (int s = 0; s < 2; s++) {
        fill_uniform(x, n, 31 + (uint64_t)s, 3.0f, 5.0f); /* a mean away from 0 */
        fill_uniform(dy, n, 41 + (uint64_t)s, -1.0f, 1.0f);
        cf_tensor tx = cf_tensor_view(x, xs), tdy = cf_tensor_view(dy, xs);
        const cf_tensor *y;
        const uint64_t jobs0 = cf__pool_get_stats().jobs;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        if (jobs) *jobs = cf__pool_get_stats().jobs - jobs0;
        const cf_tensor *dx = model->root->ops->backward(model->root, &tdy, true);
        if (s == 1) {
            r.ny = cf_tensor_numel(y);
            r.y = dup(y->data, r.ny);
            r.nx = cf_tensor_numel(dx);
            r.dx = dup(dx->data, r.nx);
            r.ng = model->n_weights;
            r.grads = dup(model->grads, r.ng);
            r.nb = model->n_buffers;
            r.buffers = dup(model->buffers, r.nb);
        }
    }
    free(x);
    free(dy);
    cf_model_free(model);
    return r;
}

static void expect_same(const char *what, const result *a, const result *b) {
    assert_int_equal(a->ny, b->ny);
    assert_int_equal(a->nx, b->nx);
    assert_int_equal(a->ng, b->ng);
    assert_int_equal(a->nb, b->nb);
    if (memcmp(a->y, b->y, a->ny * sizeof(float))) fail_msg("%s: outputs differ", what);
    if (memcmp(a->dx, b->dx, a->nx * sizeof(float))) fail_msg("%s: input gradients differ", what);
    if (memcmp(a->grads, b->grads, a->ng * sizeof(float)))
        fail_msg("%s: parameter gradients differ", what);
    if (memcmp(a->buffers, b->buffers, a->nb * sizeof(float)))
        fail_msg("%s: running statistics differ", what);
}

static void check_threads(int kind, const char *name, cf_shape xs) {
    for (int sync = 0; sync < 2; sync++)
        for (int train = 1; train >= 0; train--) {
            int reduces = 0;
            result one = run(kind, train, sync, 1, xs, &reduces, NULL);
            if (sync && train) assert_true(reduces > 0);
            for (int t = 2; t <= 4; t++) {
                char what[128];
                snprintf(what, sizeof what, "%s (%d, %d, %d, %d), %s%s, %d threads against 1", name,
                         xs.dim[0], xs.dim[1], xs.dim[2], xs.dim[3], train ? "train" : "eval",
                         sync ? ", synchronised" : "", t);
                result r = run(kind, train, sync, t, xs, &reduces, NULL);
                expect_same(what, &one, &r);
                free_result(&r);
            }
            free_result(&one);
        }
}

static void test_bn_threads_bitwise(void **state) {
    (void)state;
    /* 7 images: chunks of unequal sizes; planes of 15x14 (not a multiple of the vector width);
     * 35,280 values, above the 32,768 where BatchNorm starts to use the threads */
    check_threads(ALONE, "BatchNorm2d", cf_shape4(7, 24, 15, 14));
    check_threads(RELU, "BatchNorm2d + ReLU", cf_shape4(7, 24, 15, 14));
    check_threads(RESIDUAL, "residual block folded into its BatchNorm", cf_shape4(7, 24, 15, 14));
    /* more images than channels, W1's stage sizes */
    check_threads(RELU, "BatchNorm2d + ReLU", cf_shape4(64, 8, 14, 14));
    /* 2 images: fewer than 3 and 4 threads (some threads get none) */
    check_threads(ALONE, "BatchNorm2d", cf_shape4(2, 40, 21, 20));
    /* BatchNorm1d on (N, C, L) takes the planes paths too (L = 211: an odd plane) */
    check_threads(BN1D, "BatchNorm1d", (cf_shape){3, {7, 24, 211}});
    cf_set_num_threads(2);
}

/* The training forward with 2 threads runs the statistics job and the output job by images. */
static void test_bn_forward_jobs(void **state) {
    (void)state;
    uint64_t jobs_train = 0, jobs_eval = 0;
    result a = run(ALONE, true, false, 2, cf_shape4(8, 16, 16, 16), NULL, &jobs_train);
    result b = run(ALONE, false, false, 2, cf_shape4(8, 16, 16, 16), NULL, &jobs_eval);
    assert_int_equal(jobs_train, 2);
    assert_int_equal(jobs_eval, 1);
    free_result(&a);
    free_result(&b);
    cf_set_num_threads(2);
}

/* ---- a synchronised reduce that fails ------------------------------------------------------ */

typedef struct failing {
    int fail_forward, fail_backward; /* the call (1-based) of each kind that fails, 0: none */
    bool zero_count;                 /* fail by returning CF_OK with a count of 0 */
    int forwards, backwards;
} failing;

/* Scribbles over buf before it fails, as a collective that broke part way might. */
static cf_status reduce_failing(double *buf, size_t n, bool backward, void *ctx) {
    failing *f = ctx;
    const int call = backward ? ++f->backwards : ++f->forwards;
    if (call != (backward ? f->fail_backward : f->fail_forward)) return CF_OK;
    for (size_t i = 0; i < n; i++) buf[i] = f->zero_count ? 0.0 : 1e30;
    if (f->zero_count) return CF_OK;
    return cf_fail(CF_ERR_WORKER, "peer 1 went away");
}

/* A 1x1 Conv2d (its weight gradient is a function of BatchNorm's dx, which the pass gives back
 * to the arena), then BatchNorm2d(5) and ReLU. */
static cf_module *bn_between(void) {
    cf_module *m[] = {cf_conv2d(5, 5, 1, 1, 0, false), cf_batchnorm2d(5), cf_relu()};
    return cf_sequential(3, m);
}

/* One training forward and backward through cf_model_forward and cf_model_backward; returns
 * their statuses and copies out y and the gradients (zeroed first). */
static void sync_step(cf_model *model, const float *x, const float *dy, cf_shape xs, float *y,
                      float *grads, cf_status *fwd, cf_status *bwd, char *msg, size_t msg_size) {
    cf_tensor tx = cf_tensor_view((float *)x, xs), tdy = cf_tensor_view((float *)dy, xs);
    const cf_tensor *out = NULL;
    msg[0] = 0;
    cf_model_zero_grad(model);
    *fwd = cf_model_forward(model, &tx, &out);
    if (*fwd != CF_OK) snprintf(msg, msg_size, "%s", cf_last_error());
    memcpy(y, out->data, cf_shape_numel(&xs) * sizeof(float));
    *bwd = cf_model_backward(model, &tdy);
    if (*bwd != CF_OK) snprintf(msg, msg_size, "%s", cf_last_error());
    memcpy(grads, model->grads, model->n_weights * sizeof(float));
}

/* A failed reduce (an error status, or a count that is not positive) is the pass's error, named
 * after the layer and the pass, and the layer goes on with this replica's own statistics, so
 * the outputs are those of the layer without synchronisation (not the scribbled sums). The next
 * pass whose reduces succeed returns CF_OK again. */
static void test_bn_reduce_failure_reported(void **state) {
    (void)state;
    cf_set_num_threads(1);
    const cf_shape xs = cf_shape4(3, 5, 6, 7);
    const size_t n = cf_shape_numel(&xs);
    float *x = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
    float *y0 = malloc(n * sizeof(float)), *g0 = malloc(64 * sizeof(float));
    float *y = malloc(n * sizeof(float)), *g = malloc(64 * sizeof(float));
    fill_uniform(x, n, 77, 2.0f, 4.0f);
    fill_uniform(dy, n, 78, -1.0f, 1.0f);
    char msg[1024];
    cf_status fwd, bwd;

    /* the reference: no synchronisation */
    cf_model *plain;
    assert_int_equal(cf_model_new(&plain, bn_between(), 5), CF_OK);
    cf_model_train(plain, true);
    assert_true(plain->n_weights <= 64);
    sync_step(plain, x, dy, xs, y0, g0, &fwd, &bwd, msg, sizeof msg);
    assert_int_equal(fwd, CF_OK);
    assert_int_equal(bwd, CF_OK);
    cf_model_free(plain);

    const struct {
        failing f;
        cf_status fwd, bwd;
        const char *says;
    } cases[] = {
        {{.fail_forward = 1},
         CF_ERR_WORKER,
         CF_OK,
         "BatchNorm2d(5) forward: the synchronised reduce failed"},
        {{.fail_backward = 1},
         CF_OK,
         CF_ERR_WORKER,
         "BatchNorm2d(5) backward: the synchronised reduce failed"},
        {{.fail_forward = 1, .zero_count = true},
         CF_ERR_STATE,
         CF_OK,
         "BatchNorm2d(5) forward: the synchronised reduce gave a count of 0"},
        {{.fail_backward = 1, .zero_count = true},
         CF_OK,
         CF_ERR_STATE,
         "BatchNorm2d(5) backward: the synchronised reduce gave a count of 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        failing f = cases[k].f;
        cf_model *model;
        assert_int_equal(cf_model_new(&model, bn_between(), 5), CF_OK);
        assert_int_equal(cf_model_set_bn_reduce(model, reduce_failing, &f), CF_OK);
        cf_model_train(model, true);
        sync_step(model, x, dy, xs, y, g, &fwd, &bwd, msg, sizeof msg);
        if (fwd != cases[k].fwd || bwd != cases[k].bwd)
            fail_msg("case %zu: forward %s, backward %s; expected %s, %s", k, cf_status_str(fwd),
                     cf_status_str(bwd), cf_status_str(cases[k].fwd), cf_status_str(cases[k].bwd));
        if (!strstr(msg, cases[k].says)) fail_msg("case %zu: message \"%s\"", k, msg);
        if (!cases[k].f.zero_count && !strstr(msg, "peer 1 went away"))
            fail_msg("case %zu: the reduce's own message is missing: \"%s\"", k, msg);
        /* a group of one with this replica's sums: the unsynchronised layer's values */
        if (memcmp(y, y0, n * sizeof(float))) fail_msg("case %zu: y is not the local one", k);
        if (memcmp(g, g0, model->n_weights * sizeof(float)))
            fail_msg("case %zu: the gradients (the conv's from BatchNorm's dx) are not the local "
                     "ones",
                     k);
        assert_int_equal(f.forwards, 1);
        assert_int_equal(f.backwards, 1);
        /* the next step's reduces succeed: no error left over */
        sync_step(model, x, dy, xs, y, g, &fwd, &bwd, msg, sizeof msg);
        assert_int_equal(fwd, CF_OK);
        assert_int_equal(bwd, CF_OK);
        cf_model_free(model);
    }
    free(x), free(dy), free(y0), free(g0), free(y), free(g);
    cf_set_num_threads(2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_images_follows_image_chunks),
        cmocka_unit_test(test_bn_threads_bitwise),
        cmocka_unit_test(test_bn_forward_jobs),
        cmocka_unit_test(test_bn_reduce_failure_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
