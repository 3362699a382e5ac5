/* BatchNorm + ReLU fusion (src/nn/nn_internal.h): a Sequential that plans a BatchNorm directly
 * followed by a ReLU runs them as one pass forward and one backward. The fused layers must give
 * bitwise the results of BatchNorm then ReLU: the output, the input gradient, every parameter
 * gradient and the running statistics, in training and eval mode, with 1 and 2 threads, on the
 * planes paths (BatchNorm2d with planes that are not a multiple of 16, BatchNorm1d on (N, C, L))
 * and the rows path (BatchNorm1d on (N, C)). Each case runs the same network three ways from the
 * same seed: fused (the default), with fusion switched off (cf_model.unfused), and with every
 * ReLU's ops wrapped (a wrapper is never fused), and compares with memcmp. Re-planning after
 * wrapping or unwrapping (as bench_step's timers do) must keep the results exact. The unfused
 * layers are checked against PyTorch in test_layers, and the fused ones through W1 in
 * test_w1_model. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"

/* ---- wrapping ops (a copy of the ops at another address, as a timer or hook installs) ------- */

#define MAX_WRAPPED 32

typedef struct wrapped {
    cf_module *m;
    const cf_module_ops *orig;
    cf_module_ops copy;
} wrapped;

static wrapped wraps[MAX_WRAPPED];
static int n_wraps;

static void wrap_kind(cf_module *m, const char *kind) {
    if (strcmp(m->ops->kind, kind) == 0) {
        assert_true(n_wraps < MAX_WRAPPED);
        wrapped *w = &wraps[n_wraps++];
        w->m = m;
        w->orig = m->ops;
        w->copy = *m->ops;
        m->ops = &w->copy;
    }
    for (int i = 0; i < m->n_children; i++) wrap_kind(m->children[i], kind);
}

static void unwrap_all(void) {
    for (int i = 0; i < n_wraps; i++) wraps[i].m->ops = wraps[i].orig;
    n_wraps = 0;
}

/* Pairs (BatchNorm, ReLU) in a Sequential whose ReLU passed the BatchNorm's output through in
 * the last forward, pairs whose BatchNorm is linked to its ReLU, residual blocks whose output
 * is their idpath's last BatchNorm's, or without idpath their convpath's (the add and ReLU
 * folded into it), strided 1x1
 * shortcuts whose output the convpath's first convolution computed, and those whose input
 * gradient (and weight gradient) it computed. */
static void count_fused(const cf_module *m, int *passing, int *linked, int *folds, int *shortcuts,
                        int *shortcut_dxs, int *shortcut_dws) {
    if (cf_nn_conv_computed_by_sibling(m)) (*shortcuts)++;
    if (cf_nn_conv_dx_by_sibling(m)) (*shortcut_dxs)++;
    if (cf_nn_conv_dw_by_sibling(m)) (*shortcut_dws)++;
    if (strcmp(m->ops->kind, "ResBlock") == 0) { /* the idpath's, or the only path's */
        const cf_module *last = m->children[m->n_children - 1];
        if (last->n_children) last = last->children[last->n_children - 1];
        if (m->out.data == last->out.data) (*folds)++;
    }
    for (int i = 0; i + 1 < m->n_children; i++) {
        const cf_module *a = m->children[i], *b = m->children[i + 1];
        if (strncmp(a->ops->kind, "BatchNorm", 9) != 0 || strcmp(b->ops->kind, "ReLU") != 0)
            continue;
        if (b->out.data == a->out.data) (*passing)++;
        if (cf_nn_bn_fused_with(a, b)) (*linked)++;
    }
    for (int i = 0; i < m->n_children; i++)
        count_fused(m->children[i], passing, linked, folds, shortcuts, shortcut_dxs, shortcut_dws);
}

/* ---- networks ------------------------------------------------------------------------------ */

static cf_module *net_conv(void) { /* (N, 3, H, W) */
    cf_module *c[] = {cf_conv2d(3, 4, 3, 1, 1, false), cf_batchnorm2d(4), cf_relu(),
                      cf_conv2d(4, 5, 3, 1, 1, true),  cf_batchnorm2d(5), cf_relu()};
    return cf_sequential(6, c);
}

static cf_module *net_bn_first(void) { /* (N, 16, H, W): the first BatchNorm's dx is the input's */
    cf_module *c[] = {cf_batchnorm2d(16), cf_relu(), cf_conv2d(16, 8, 3, 1, 1, false),
                      cf_batchnorm2d(8), cf_relu()};
    return cf_sequential(5, c);
}

static cf_module *net_rows(void) { /* (N, 6): BatchNorm1d rows path */
    cf_module *c[] = {cf_batchnorm1d(6), cf_relu(),         cf_linear(6, 8, true),
                      cf_batchnorm1d(8), cf_relu(),         cf_linear(8, 5, false),
                      cf_batchnorm1d(5), cf_dropout(0.25f), cf_relu()};
    return cf_sequential(9, c);
}

static cf_module *net_1d_planes(void) { /* (N, 4, L): BatchNorm1d planes path */
    cf_module *c[] = {cf_batchnorm1d(4),         cf_relu(),         cf_flatten(),
                      cf_linear(4 * 5, 3, true), cf_batchnorm1d(3), cf_relu()};
    return cf_sequential(6, c);
}

static cf_shape shape3(int n, int c, int l) {
    return cf_shape_make(3, (const int[]){n, c, l});
}

static cf_module *net_residual(void) { /* (N, 4, H, W): fusion inside a block's convpath */
    cf_module *cp[] = {cf_conv2d(4, 6, 3, 1, 1, false), cf_batchnorm2d(6), cf_relu(),
                       cf_conv2d(6, 6, 3, 1, 1, false), cf_batchnorm2d(6)};
    cf_module *ip[] = {cf_conv2d(4, 6, 1, 1, 0, false), cf_batchnorm2d(6)};
    cf_module *c[] = {cf_batchnorm2d(4), cf_relu(),
                      cf_residual(cf_sequential(5, cp), cf_sequential(2, ip), true)};
    return cf_sequential(3, c);
}

static cf_module *net_dense_residual(void) { /* (N, 6): the fold on the rows path */
    cf_module *cp[] = {cf_linear(6, 6, false), cf_batchnorm1d(6), cf_relu(), cf_linear(6, 6, false),
                       cf_batchnorm1d(6)};
    cf_module *ip[] = {cf_linear(6, 6, true), cf_batchnorm1d(6)};
    cf_module *c[] = {cf_linear(6, 6, true), cf_batchnorm1d(6), cf_relu(),
                      cf_residual(cf_sequential(5, cp), cf_sequential(2, ip), true)};
    return cf_sequential(4, c);
}

/* (N, 4, H, W): a block without ReLU after the sum (no fold), then torchvision's BasicBlock
 * without downsample (W3's identity blocks) and a block whose convpath is a bare BatchNorm */
static cf_module *net_identity(void) {
    cf_module *cp[] = {cf_conv2d(4, 4, 3, 1, 1, false), cf_batchnorm2d(4), cf_relu(),
                       cf_conv2d(4, 4, 3, 1, 1, false), cf_batchnorm2d(4)};
    cf_module *cp2[] = {cf_conv2d(4, 4, 3, 1, 1, false), cf_batchnorm2d(4)};
    cf_module *c[] = {cf_batchnorm2d(4), cf_relu(), cf_residual(cf_sequential(2, cp2), NULL, false),
                      cf_residual(cf_sequential(5, cp), NULL, true),
                      cf_residual(cf_batchnorm2d(4), NULL, true)};
    return cf_sequential(5, c);
}

static cf_module *net_dense_identity(void) { /* (N, 6): the identity fold on the rows path */
    cf_module *cp[] = {cf_linear(6, 6, false), cf_batchnorm1d(6), cf_relu(), cf_linear(6, 6, false),
                       cf_batchnorm1d(6)};
    cf_module *c[] = {cf_linear(6, 6, true), cf_residual(cf_sequential(5, cp), NULL, true)};
    return cf_sequential(2, c);
}

static cf_module *net_resnet18_body(void) { /* (N, 3, H, W): W3's body, torchvision's resnet18 */
    return cf_resnet_body(18, 3);
}

static cf_module *net_w1_body(void) { /* (N, 1, 28, 28): W1's body */
    return cf_mini_resnet_body(1);
}

typedef cf_module *(*build_fn)(void);

/* ---- running a network --------------------------------------------------------------------- */

typedef enum variant { FUSED, SWITCHED_OFF, WRAPPED } variant;

typedef struct result {
    float *y, *dx, *grads, *buffers;
    size_t ny, nx, ng, nb;
    int passing, linked, folds, shortcuts, shortcut_dxs, shortcut_dws;
} result;

typedef struct spec {
    build_fn build;
    cf_shape x;
    int pairs;           /* fusable pairs in the network */
    int folds;           /* residual blocks whose add and ReLU fold into a BatchNorm */
    int shortcuts;       /* strided 1x1 shortcuts computed beside the convpath (implicit kernels) */
    const char *frozen;  /* a weight frozen in every variant (NULL: none) */
    int frozen_siblings; /* shortcuts that keep their weight gradient because of it */
    int threads;
    bool train;
    int steps;
    bool nan_input; /* one channel of the input is NaN in the last step */
} spec;

static float *dup(const float *a, size_t n) {
    float *c = malloc((n + 1) * sizeof(float));
    memcpy(c, a, n * sizeof(float));
    return c;
}

static void free_result(result *r) {
    free(r->y);
    free(r->dx);
    free(r->grads);
    free(r->buffers);
}

/* Non-trivial affine parameters: gamma in [0.5, 1.5) with channel 0 zero (beta -0: every output
 * of that channel is a signed zero, so ReLU's mask is empty) and channel 1 negative (the mask
 * flips against x), beta in [-0.5, 0.5). */
static void set_affine(cf_module *m, uint64_t *seed) {
    if (strncmp(m->ops->kind, "BatchNorm", 9) == 0) {
        cf_param *w = &m->params[0], *b = &m->params[1];
        fill_uniform(w->data, w->numel, (*seed)++, 0.5f, 1.5f);
        fill_uniform(b->data, b->numel, (*seed)++, -0.5f, 0.5f);
        w->data[0] = 0.0f;
        b->data[0] = -0.0f;
        if (w->numel > 1) w->data[1] = -w->data[1];
    }
    for (int i = 0; i < m->n_children; i++) set_affine(m->children[i], seed);
}

/* One step: forward on batch `seed`, backward from a random dy, the input gradient kept. */
static const cf_tensor *step(cf_model *model, cf_shape shape, uint64_t seed, bool nan_input,
                             const cf_tensor **y) {
    size_t n = cf_shape_numel(&shape);
    cf_tensor x = cf_tensor_view(malloc(n * sizeof(float)), shape);
    fill_uniform(x.data, n, seed, -2.0f, 2.0f);
    if (nan_input) /* channel 2 of sample 0 (or its feature 2) */
        for (size_t i = 0; i < cf_shape_sample_numel(&shape) / (size_t)shape.dim[1]; i++)
            x.data[2 * (cf_shape_sample_numel(&shape) / (size_t)shape.dim[1]) + i] = NAN;
    assert_int_equal(cf_model_forward(model, &x, y), CF_OK);
    size_t ny = cf_tensor_numel(*y);
    cf_tensor dy = cf_tensor_view(malloc(ny * sizeof(float)), (*y)->shape);
    fill_uniform(dy.data, ny, seed + 1000, -1.0f, 1.0f);
    const cf_tensor *dx = model->root->ops->backward(model->root, &dy, true);
    free(dy.data);
    /* x must stay alive until the next forward for backward; it is not needed after it */
    free(x.data);
    return dx;
}

static void snapshot(cf_model *model, const cf_tensor *y, const cf_tensor *dx, result *r) {
    free_result(r);
    r->ny = cf_tensor_numel(y);
    r->y = dup(y->data, r->ny);
    r->nx = cf_tensor_numel(dx);
    r->dx = dup(dx->data, r->nx);
    r->ng = model->n_weights;
    r->grads = dup(model->grads, r->ng);
    r->nb = model->n_buffers;
    r->buffers = dup(model->buffers, r->nb);
    r->passing = r->linked = r->folds = r->shortcuts = r->shortcut_dxs = r->shortcut_dws = 0;
    count_fused(model->root, &r->passing, &r->linked, &r->folds, &r->shortcuts, &r->shortcut_dxs,
                &r->shortcut_dws);
}

static result run(const spec *s, variant v) {
    cf_set_num_threads(s->threads);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, s->build(), 11), CF_OK);
    model->unfused = v == SWITCHED_OFF;
    if (v == WRAPPED) wrap_kind(model->root, "ReLU");
    if (s->frozen) {
        cf_param *p = cf_model_param(model, s->frozen);
        assert_non_null(p);
        p->trainable = false;
    }
    uint64_t seed = 500;
    set_affine(model->root, &seed);
    cf_model_train(model, s->train);
    cf_model_zero_grad(model);
    result r = {0};
    for (int i = 0; i < s->steps; i++) {
        const cf_tensor *y;
        const cf_tensor *dx =
            step(model, s->x, 77 + 10 * (uint64_t)i, s->nan_input && i == s->steps - 1, &y);
        if (i == s->steps - 1) snapshot(model, y, dx, &r);
    }
    unwrap_all();
    cf_model_free(model);
    return r;
}

static void expect_same(const char *what, const result *a, const result *b) {
    char msg[160];
    snprintf(msg, sizeof msg, "%s", what);
    assert_int_equal(a->ny, b->ny);
    assert_int_equal(a->nx, b->nx);
    assert_int_equal(a->ng, b->ng);
    assert_int_equal(a->nb, b->nb);
    if (memcmp(a->y, b->y, a->ny * sizeof(float)) != 0) fail_msg("%s: outputs differ", msg);
    if (memcmp(a->dx, b->dx, a->nx * sizeof(float)) != 0)
        fail_msg("%s: input gradients differ", msg);
    if (memcmp(a->grads, b->grads, a->ng * sizeof(float)) != 0)
        fail_msg("%s: parameter gradients differ", msg);
    if (memcmp(a->buffers, b->buffers, a->nb * sizeof(float)) != 0)
        fail_msg("%s: buffers differ", msg);
}

/* Fused, switched off and wrapped agree bitwise; only the fused run fuses every pair. */
static void check_spec(const char *name, spec s) {
    for (int t = 1; t <= 2; t++) {
        s.threads = t;
        for (int mode = 0; mode < 2; mode++) {
            s.train = mode == 0;
            char what[128];
            snprintf(what, sizeof what, "%s, %d thread(s), %s", name, t,
                     s.train ? "train" : "eval");
            result f = run(&s, FUSED), o = run(&s, SWITCHED_OFF), w = run(&s, WRAPPED);
            if (f.passing != s.pairs || f.linked != s.pairs)
                fail_msg("%s: %d of %d pairs fused (%d linked)", what, f.passing, s.pairs,
                         f.linked);
            if (f.folds != s.folds || w.folds != s.folds)
                fail_msg("%s: %d and %d of %d residual sums folded", what, f.folds, w.folds,
                         s.folds);
            const int shortcuts = cf_isa_active() != CF_ISA_GENERIC ? s.shortcuts : 0;
            if (f.shortcuts != shortcuts || w.shortcuts != shortcuts || o.shortcuts)
                fail_msg("%s: %d, %d and %d of %d shortcuts computed beside the convpath "
                         "(fused, wrapped, switched off)",
                         what, f.shortcuts, w.shortcuts, o.shortcuts, shortcuts);
            if (f.shortcut_dxs != shortcuts || w.shortcut_dxs != shortcuts || o.shortcut_dxs)
                fail_msg("%s: %d, %d and %d of %d shortcuts' input gradients computed beside the "
                         "convpath's (fused, wrapped, switched off)",
                         what, f.shortcut_dxs, w.shortcut_dxs, o.shortcut_dxs, shortcuts);
            const int dws = shortcuts ? shortcuts - s.frozen_siblings : 0;
            if (f.shortcut_dws != dws || w.shortcut_dws != dws || o.shortcut_dws)
                fail_msg("%s: %d, %d and %d of %d shortcuts' weight gradients computed beside the "
                         "convpath's (fused, wrapped, switched off)",
                         what, f.shortcut_dws, w.shortcut_dws, o.shortcut_dws, dws);
            if (o.passing || o.linked || o.folds || w.passing || w.linked)
                fail_msg("%s: fused although switched off (%d) or wrapped (%d)", what,
                         o.passing + o.linked + o.folds, w.passing + w.linked);
            expect_same(what, &f, &o);
            expect_same(what, &f, &w);
            /* the ReLU really applied: some outputs are zero, none negative, gradients flow */
            size_t zeros = 0, neg = 0;
            for (size_t i = 0; i < f.ny; i++) {
                zeros += f.y[i] == 0.0f;
                neg += f.y[i] < 0.0f || signbit(f.y[i]);
            }
            if (!s.nan_input) assert_true(zeros > 0 && zeros < f.ny);
            assert_int_equal(neg, 0);
            free_result(&f);
            free_result(&o);
            free_result(&w);
        }
    }
}

static void test_conv_bn_relu(void **state) {
    (void)state;
    check_spec("conv 7x7",
               (spec){.build = net_conv, .x = cf_shape4(3, 3, 7, 7), .pairs = 2, .steps = 2});
    check_spec("conv 5x3",
               (spec){.build = net_conv, .x = cf_shape4(2, 3, 5, 3), .pairs = 2, .steps = 2});
    check_spec("conv 4x4",
               (spec){.build = net_conv, .x = cf_shape4(2, 3, 4, 4), .pairs = 2, .steps = 1});
}

static void test_threaded_planes(void **state) {
    (void)state;
    /* 8 * 16 * 17 * 17 values: large enough for the channel split over threads */
    check_spec(
        "bn first 17x17",
        (spec){.build = net_bn_first, .x = cf_shape4(8, 16, 17, 17), .pairs = 2, .steps = 2});
}

static void test_batchnorm1d(void **state) {
    (void)state;
    check_spec("rows", (spec){.build = net_rows, .x = cf_shape2(7, 6), .pairs = 2, .steps = 2});
    check_spec("1d planes",
               (spec){.build = net_1d_planes, .x = shape3(3, 4, 5), .pairs = 2, .steps = 2});
}

static void test_residual_and_nan(void **state) {
    (void)state;
    check_spec(
        "residual",
        (spec){
            .build = net_residual, .x = cf_shape4(3, 4, 6, 5), .pairs = 2, .folds = 1, .steps = 2});
    /* 8 * 6 * 40 * 40 values: the residual passes split over threads */
    check_spec("residual 40x40", (spec){.build = net_residual,
                                        .x = cf_shape4(8, 4, 40, 40),
                                        .pairs = 2,
                                        .folds = 1,
                                        .steps = 1});
    check_spec(
        "dense residual",
        (spec){
            .build = net_dense_residual, .x = cf_shape2(5, 6), .pairs = 2, .folds = 1, .steps = 2});
    check_spec("W1 body", (spec){.build = net_w1_body,
                                 .x = cf_shape4(2, 1, 28, 28),
                                 .pairs = 3,
                                 .folds = 2,
                                 .shortcuts = 2,
                                 .steps = 2});
    /* block 1's strided conv frozen: its shortcut computes its own weight gradient */
    check_spec("W1 body, a sibling frozen", (spec){.build = net_w1_body,
                                                   .x = cf_shape4(2, 1, 28, 28),
                                                   .pairs = 3,
                                                   .folds = 2,
                                                   .shortcuts = 2,
                                                   .frozen = "3.convpath.0.weight",
                                                   .frozen_siblings = 1,
                                                   .steps = 2});
    check_spec(
        "identity blocks",
        (spec){
            .build = net_identity, .x = cf_shape4(3, 4, 6, 5), .pairs = 2, .folds = 2, .steps = 2});
    /* 8 * 4 * 40 * 40 values: split over threads; NaN in one channel's inputs */
    check_spec("identity blocks 40x40", (spec){.build = net_identity,
                                               .x = cf_shape4(8, 4, 40, 40),
                                               .pairs = 2,
                                               .folds = 2,
                                               .steps = 1});
    check_spec("identity blocks, nan input", (spec){.build = net_identity,
                                                    .x = cf_shape4(2, 4, 7, 3),
                                                    .pairs = 2,
                                                    .folds = 2,
                                                    .steps = 1,
                                                    .nan_input = true});
    check_spec(
        "dense identity",
        (spec){
            .build = net_dense_identity, .x = cf_shape2(5, 6), .pairs = 1, .folds = 1, .steps = 2});
    /* stem, 8 blocks: 5 identity folds and 3 idpath folds (at 64+ channels the shortcuts are
     * not computed beside their convpath) */
    check_spec("resnet18 body", (spec){.build = net_resnet18_body,
                                       .x = cf_shape4(2, 3, 16, 16),
                                       .pairs = 9,
                                       .folds = 8,
                                       .steps = 1});
    check_spec("nan input", (spec){.build = net_conv,
                                   .x = cf_shape4(2, 3, 5, 5),
                                   .pairs = 2,
                                   .steps = 1,
                                   .nan_input = true});
    check_spec(
        "nan rows",
        (spec){.build = net_rows, .x = cf_shape2(5, 6), .pairs = 2, .nan_input = true, .steps = 1});
}

/* Wrapping after the plan (bench_step's timers), then re-planning with wrapped BatchNorms (the
 * BatchNorm keeps its link, its ReLU runs again), with nothing wrapped, with wrapped ReLUs (a
 * ReLU that was linked must stop passing through) and with nothing wrapped again: every step
 * stays bitwise the unfused one. */
static void test_replan_with_wrappers(void **state) {
    (void)state;
    cf_set_num_threads(1);
    cf_model *fused, *plain;
    assert_int_equal(cf_model_new(&fused, net_conv(), 5), CF_OK);
    assert_int_equal(cf_model_new(&plain, net_conv(), 5), CF_OK);
    plain->unfused = true;
    uint64_t seed = 1;
    set_affine(fused->root, &seed);
    seed = 1;
    set_affine(plain->root, &seed);
    struct {
        const char *what;
        const char *wrap; /* kind to wrap before the step */
        int n;            /* batch (a larger one re-plans) */
        int passing, linked;
    } steps[] = {
        {"planned fused", NULL, 2, 2, 2},
        {"BatchNorm wrapped after the plan", "BatchNorm2d", 2, 2, 2},
        {"re-planned with BatchNorm wrapped", "BatchNorm2d", 3, 0, 2},
        {"re-planned unwrapped", NULL, 4, 2, 2},
        {"re-planned with ReLU wrapped", "ReLU", 5, 0, 0},
        {"re-planned unwrapped again", NULL, 6, 2, 2},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        result rf = {0}, rp = {0};
        const cf_tensor *y, *dx;
        cf_shape shape = cf_shape4(steps[i].n, 3, 6, 5);
        if (steps[i].wrap) wrap_kind(fused->root, steps[i].wrap);
        cf_model_zero_grad(fused);
        dx = step(fused, shape, 40 + i, false, &y);
        snapshot(fused, y, dx, &rf);
        unwrap_all();
        cf_model_zero_grad(plain);
        dx = step(plain, shape, 40 + i, false, &y);
        snapshot(plain, y, dx, &rp);
        if (rf.passing != steps[i].passing || rf.linked != steps[i].linked)
            fail_msg("%s: %d passing, %d linked (expected %d, %d)", steps[i].what, rf.passing,
                     rf.linked, steps[i].passing, steps[i].linked);
        assert_int_equal(rp.passing + rp.linked + rp.folds, 0);
        expect_same(steps[i].what, &rf, &rp);
        free_result(&rf);
        free_result(&rp);
    }
    cf_model_free(fused);
    cf_model_free(plain);
}

/* Fusion is decided when the model is planned: wrapping every module of W1's body after the plan
 * (bench_step's timers do, without a re-plan) leaves the residual blocks' fused calls planned,
 * and each step, fused and wrapped, must stay bitwise the unfused one: every layer of both paths
 * still runs (a wrapped path is not mistaken for a single layer). */
static void test_wrapped_after_plan(void **state) {
    (void)state;
    cf_set_num_threads(1);
    cf_model *fused, *plain;
    assert_int_equal(cf_model_new(&fused, cf_mini_resnet_body(3), 5), CF_OK);
    assert_int_equal(cf_model_new(&plain, cf_mini_resnet_body(3), 5), CF_OK);
    plain->unfused = true;
    uint64_t seed = 1;
    set_affine(fused->root, &seed);
    seed = 1;
    set_affine(plain->root, &seed);
    static const char *const kinds[] = {"Sequential", "ResBlock", "Conv2d", "BatchNorm2d", "ReLU"};
    const cf_shape shape = cf_shape4(2, 3, 28, 28);
    for (int i = 0; i < 2; i++) {
        result rf = {0}, rp = {0};
        const cf_tensor *y, *dx;
        if (i == 1)
            for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
                wrap_kind(fused->root, kinds[k]);
        cf_model_zero_grad(fused);
        dx = step(fused, shape, 60 + (uint64_t)i, false, &y);
        snapshot(fused, y, dx, &rf);
        unwrap_all();
        cf_model_zero_grad(plain);
        dx = step(plain, shape, 60 + (uint64_t)i, false, &y);
        snapshot(plain, y, dx, &rp);
        const int pairs = cf_isa_active() != CF_ISA_GENERIC ? 2 : 0; /* implicit kernels */
        if (i == 0 && (rf.folds != 2 || rf.shortcuts != pairs || rf.shortcut_dxs != pairs))
            fail_msg("planned fused: %d folds, %d shortcuts, %d shortcut dx (expected 2, %d, %d)",
                     rf.folds, rf.shortcuts, rf.shortcut_dxs, pairs, pairs);
        assert_int_equal(rp.passing + rp.linked + rp.folds + rp.shortcuts + rp.shortcut_dxs, 0);
        expect_same(i == 0 ? "W1 body fused" : "W1 body fused, wrapped after the plan", &rf, &rp);
        free_result(&rf);
        free_result(&rp);
    }
    cf_model_free(fused);
    cf_model_free(plain);
}

/* The residual block sums the input gradient into the convpath's buffer, never into the
 * upstream gradient it received: with a convpath that passes its gradient through (Flatten on
 * (N, F)) the upstream gradient stays untouched, and dx and y are exact, for every idpath
 * (identity, pass-through Flatten, ReLU) with and without ReLU after the sum. */
static void test_residual_gradient_buffers(void **state) {
    (void)state;
    cf_set_num_threads(1);
    for (int variant = 0; variant < 6; variant++) {
        bool relu = variant & 1;
        int idpath = variant / 2; /* 0: none, 1: Flatten, 2: ReLU */
        cf_module *ip = idpath == 1 ? cf_flatten() : idpath == 2 ? cf_relu() : NULL;
        cf_model *model;
        assert_int_equal(cf_model_new(&model, cf_residual(cf_flatten(), ip, relu), 3), CF_OK);
        cf_shape shape = cf_shape2(4, 5);
        float xs[20], dys[20], keep[20];
        fill_uniform(xs, 20, 9, -1.0f, 1.0f);
        fill_uniform(dys, 20, 10, -1.0f, 1.0f);
        memcpy(keep, dys, sizeof keep);
        cf_tensor x = cf_tensor_view(xs, shape), dy = cf_tensor_view(dys, shape);
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &x, &y), CF_OK);
        const cf_tensor *dx = model->root->ops->backward(model->root, &dy, true);
        if (memcmp(dys, keep, sizeof keep) != 0)
            fail_msg("variant %d: the upstream gradient was overwritten", variant);
        for (int i = 0; i < 20; i++) {
            float b = idpath == 2 ? (xs[i] > 0.0f ? xs[i] : 0.0f) : xs[i], v = xs[i] + b;
            float g = relu && !(v > 0.0f) ? 0.0f : keep[i];
            float gb = idpath == 2 && !(xs[i] > 0.0f) ? 0.0f : g;
            if (y->data[i] != (relu && !(v > 0.0f) ? 0.0f : v) || dx->data[i] != g + gb)
                fail_msg("variant %d, element %d: y %g dx %g", variant, i, (double)y->data[i],
                         (double)dx->data[i]);
        }
        cf_model_free(model);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_bn_relu),
        cmocka_unit_test(test_threaded_planes),
        cmocka_unit_test(test_batchnorm1d),
        cmocka_unit_test(test_residual_and_nan),
        cmocka_unit_test(test_replan_with_wrappers),
        cmocka_unit_test(test_wrapped_after_plan),
        cmocka_unit_test(test_residual_gradient_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
