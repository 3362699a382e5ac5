/* What the tests of W1's fused BatchNorm and residual passes and bf16 links share
 * (test_bf16_bn_words, test_bn_fused_passes, test_res_mask_bits, test_bn_pair_backward,
 * test_bn_stats_link, test_fold_words, test_words_restore, test_conv_stem): the small residual
 * networks they run, a growing record of every value a run produced (compared with memcmp
 * between a run with the fused path and one without), the reduce of a synchronised BatchNorm
 * over two identical replicas, and a training loop's model, step start and wrapped ops.
 * Static inline, so that a test that uses a part only compiles without warnings. */
#ifndef CF_TESTS_BLOCK_NETS_H
#define CF_TESTS_BLOCK_NETS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"
#include "oracle.h"

typedef enum { BNET_BLOCK, BNET_BLOCK_S1, BNET_BLOCK_BN_ID, BNET_W1 } block_net_kind;

typedef struct block_net {
    const char *name;
    block_net_kind kind;
    int n, c, h, w, o;
    int blocks; /* the blocks the path under test acts on, each training forward */
} block_net;

static inline cf_module *block_net_build(const block_net *k) {
    switch (k->kind) {
    case BNET_BLOCK: { /* W1's: 3x3 stride 2, BN, ReLU, 3x3, BN; shortcut 1x1 stride 2, BN */
        cf_module *cp[] = {cf_conv2d(k->c, k->o, 3, 2, 1, false), cf_batchnorm2d(k->o), cf_relu(),
                           cf_conv2d(k->o, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o)};
        cf_module *ip[] = {cf_conv2d(k->c, k->o, 1, 2, 0, false), cf_batchnorm2d(k->o)};
        return cf_residual(cf_sequential(5, cp), cf_sequential(2, ip), true);
    }
    case BNET_BLOCK_S1: { /* stride 1 throughout: no paired shortcut */
        cf_module *cp[] = {cf_conv2d(k->c, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o), cf_relu(),
                           cf_conv2d(k->o, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o)};
        cf_module *ip[] = {cf_conv2d(k->c, k->o, 1, 1, 0, false), cf_batchnorm2d(k->o)};
        return cf_residual(cf_sequential(5, cp), cf_sequential(2, ip), true);
    }
    case BNET_BLOCK_BN_ID: { /* a conv stem, then a block whose idpath is a lone BatchNorm */
        cf_module *cp[] = {cf_conv2d(k->o, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o), cf_relu(),
                           cf_conv2d(k->o, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o)};
        cf_module *ip[] = {cf_batchnorm2d(k->o)};
        cf_module *m[] = {cf_conv2d(k->c, k->o, 3, 1, 1, false),
                          cf_residual(cf_sequential(5, cp), cf_sequential(1, ip), true)};
        return cf_sequential(2, m);
    }
    case BNET_W1:
        return cf_mini_resnet(k->c, 10);
    }
    return NULL;
}

/* How many modules under m (m included) have is (a BatchNorm's per-pass state, say). */
static inline int count_modules(const cf_module *m, bool (*is)(const cf_module *)) {
    int n = is(m);
    for (int i = 0; i < m->n_children; i++) n += count_modules(m->children[i], is);
    return n;
}

/* The first residual block under m (NULL: none). */
static inline cf_module *first_block(cf_module *m) {
    if (cf_nn_is_residual(m)) return m;
    for (int i = 0; i < m->n_children; i++) {
        cf_module *b = first_block(m->children[i]);
        if (b) return b;
    }
    return NULL;
}

typedef struct record {
    float *v;
    size_t n, cap;
} record;

static inline void put(record *r, const float *x, size_t n) {
    if (r->n + n > r->cap) {
        r->cap = 2 * (r->n + n);
        r->v = realloc(r->v, r->cap * sizeof(float));
        assert_non_null(r->v);
    }
    memcpy(r->v + r->n, x, n * sizeof(float));
    r->n += n;
}

/* A training step's backward and update, recorded: dy uniform in [-1, 1) from the step's seed,
 * the model's backward (nx input gradient values), its gradients and buffers, then
 * w -= 0.05 grad and the weights. */
static inline void record_backward_step(record *r, cf_model *model, const cf_tensor *y, size_t nx,
                                        int step) {
    const size_t ny = cf_tensor_numel(y);
    float *dy = malloc(ny * sizeof(float));
    assert_non_null(dy);
    fill_uniform(dy, ny, 200 + (uint64_t)step, -1, 1);
    cf_tensor tdy = cf_tensor_view(dy, y->shape);
    const cf_tensor *dx = model->root->ops->backward(model->root, &tdy, true);
    assert_non_null(dx);
    put(r, dx->data, nx);
    put(r, model->grads, model->n_weights);
    put(r, model->buffers, model->n_buffers);
    for (size_t i = 0; i < model->n_weights; i++) model->weights[i] -= 0.05f * model->grads[i];
    put(r, model->weights, model->n_weights);
    free(dy);
}

/* The two runs' records must be equal value for value (memcmp: a NaN equals only itself, bit for
 * bit); case_name names the run, on and off the two sides. Frees both. */
static inline void records_equal(record a, record b, const char *case_name, const char *on,
                                 const char *off) {
    assert_int_equal(a.n, b.n);
    for (size_t i = 0; i < a.n; i++)
        if (memcmp(&a.v[i], &b.v[i], sizeof(float)) != 0)
            fail_msg("%s: value %zu of %zu is %.9g %s, %.9g %s", case_name, i, a.n, (double)a.v[i],
                     on, (double)b.v[i], off);
    free(a.v), free(b.v);
}

/* The group's reduce of two replicas that saw the same batch: every sum doubled. */
static inline cf_status twin_reduce(double *buf, size_t n, bool backward, void *ctx) {
    (void)backward, (void)ctx;
    for (size_t i = 0; i < n; i++) buf[i] *= 2;
    return CF_OK;
}

/* A model of net (seed: its weights' draw), its convolutions in bf16 where bf16 and its
 * BatchNorms synchronised over two identical replicas (twin_reduce) where sync. */
static inline cf_model *block_model(cf_module *net, uint64_t seed, bool bf16, bool sync) {
    cf_model *model;
    assert_int_equal(cf_model_new(&model, net, seed), CF_OK);
    cf_conv_set_bf16(model->root, bf16);
    if (sync) assert_int_equal(cf_model_set_bn_reduce(model, twin_reduce, NULL), CF_OK);
    return model;
}

/* A step's start: x's nx values uniform in [-2, 2) from seed, the model training or in eval,
 * its gradients zeroed. */
static inline void step_start(cf_model *model, float *x, size_t nx, uint64_t seed, bool training) {
    fill_uniform(x, nx, seed, -2, 2);
    cf_model_train(model, training);
    cf_model_zero_grad(model);
}

/* m runs a copy of its ops (*copy), its own kept at *orig: the test then changes an entry of
 * the copy to wrap that call. */
static inline void wrap_ops(cf_module *m, const cf_module_ops **orig, cf_module_ops *copy) {
    *orig = m->ops;
    *copy = *m->ops;
    m->ops = copy;
}

/* The last child of the first residual block's child `path` under root (0: its convpath), its
 * backward wrapped by `backward` (wrap_ops: the module's own ops kept at *orig). */
static inline cf_module *
hook_path_end(cf_module *root, int path, const cf_module_ops **orig, cf_module_ops *copy,
              const cf_tensor *(*backward)(cf_module *, const cf_tensor *, bool)) {
    cf_module *p = first_block(root)->children[path];
    cf_module *end = p->children[p->n_children - 1];
    wrap_ops(end, orig, copy);
    copy->backward = backward;
    return end;
}

#endif
