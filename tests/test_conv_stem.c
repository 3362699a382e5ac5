/* The direct stem (cf_conv_stem_*, tensor.h), which conv.c takes for a 3x3 stride-1 layer on 1 to
 * 4 channels (W1's gray stem) where the level's kernels pay (cf_conv_stem_pays: AVX-512 and up;
 * the AVX2 kernels are tested here but lose to the lowered product):
 *
 * - the kernels against the lowered product they replace (cf_im2col, then cf_sgemm_strided and
 *   cf_sgemm_nt) on W1's shape and the edges (1 to 4 channels, output counts off the kernels'
 *   blocks, odd and tiny planes, the largest plane): the forward bitwise wherever the level has
 *   the vector kernels, the weight gradient bitwise on the shapes of cf_conv_stem_wgrad_as_nt
 *   there (both accumulating and not) when OpenBLAS runs a SkylakeX-family core (the kernel the
 *   direct sums reproduce; under OPENBLAS_CORETYPE=Haswell or Zen only close), close elsewhere
 *   and at the generic level; the epilogue reports every image once, in order, with its output
 *   final; a shape the kernels do not take refused with nothing written;
 * - both against PyTorch in float64, to fp32's rounding bounds (from the sums of the absolute
 *   values);
 * - Conv2d -> BatchNorm2d -> ReLU, fp32 and bf16 (cf_conv_set_bf16), on 1, 2 and 3 threads:
 *   training steps and an eval forward with the direct stem and without (cf__nn_set_stem_direct),
 *   and with the BatchNorm's statistics link and without (cf__nn_set_stats_link), every output,
 *   gradient, buffer and weight bitwise the same on every shape (W1's on 12 and 7 images, other
 *   channel and output counts, thin planes; W1's weight gradient, the one shape of these that
 *   takes the direct one, only close where OpenBLAS's core is not of the SkylakeX family); the link
 * taken on each training forward exactly where the direct stem runs; the outputs, the weight
 * gradient and the running statistics against PyTorch;
 * - the stem dx link (cf__nn_set_stem_dx_link): cf_conv_stem_wgrad_each's prologue against
 *   cf_conv_stem_wgrad (bitwise, called once per image in order); the stem and W1 trained without
 *   the stem's dx (cf_model_backward), linked against unlinked, every gradient, buffer and weight
 *   memcmp-equal on 1 to 3 threads, fp32 and bf16, the link taken exactly where the direct weight
 *   gradient runs, and the BatchNorm's dx written after all when the input gradient is asked;
 *   PyTorch's weight gradient above comes from the linked path.
 *
 * tests/conv_stem.cmake runs this under every CF_ISA cap and over the amx tile emulation. */
#include "block_nets.h"
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"
#include "tensor/kernel_table.h"

static cf_conv_geom stem_geom(int c, int h, int w) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, 3, 3, 1, 1, 1, 1));
    return g;
}

/* ---- the kernels ----------------------------------------------------------------------------- */

typedef struct ep_check {
    int n, next;
    size_t out_n;
    const float *y, *ref;
} ep_check;

static void ep_fn(void *v, bool shortcut, int n0, int count) {
    ep_check *e = v;
    assert_false(shortcut);
    if (n0 != e->next || count != 1)
        fail_msg("epilogue: images [%d, %d) reported, image %d expected", n0, n0 + count, e->next);
    if (memcmp(e->y + (size_t)n0 * e->out_n, e->ref + (size_t)n0 * e->out_n,
               e->out_n * sizeof(float)) != 0)
        fail_msg("epilogue: image %d reported before its output was final", n0);
    e->next++;
}

typedef struct kcase {
    int n, c, o, h, w;
    bool dw_bitwise; /* the lowered weight gradient's kernel takes the shape (W1's) */
} kcase;

/* dw_bitwise: cf_conv_stem_wgrad_as_nt's answer, the shapes whose weight gradient conv.c takes
 * direct */
static const kcase kcases[] = {
    {4, 1, 16, 28, 28, true}, /* W1's stem */
    {3, 1, 5, 28, 28, false},  {2, 2, 16, 17, 13, false}, {3, 3, 33, 20, 20, false},
    {2, 4, 8, 9, 31, false},   {3, 1, 3, 5, 3, false},  /* 15 positions: less than a vector */
    {2, 2, 17, 64, 64, false},                          /* the largest plane */
    {2, 1, 8, 4, 8, true},     {2, 1, 12, 1, 32, true}, /* 32 positions: the fewest it takes */
    {2, 1, 16, 3, 10, false},                           /* 30 */
};

/* Whether OpenBLAS runs a SkylakeX-family core, the one whose small-matrix kernel the direct
 * weight gradient's lanes reproduce (tensor.h). */
static bool blas_skylakex(void) {
    const char *core = cf_blas_core();
    return core && (strcmp(core, "SkylakeX") == 0 || strcmp(core, "Cooperlake") == 0 ||
                    strcmp(core, "SapphireRapids") == 0);
}
#define N_KCASES (int)(sizeof kcases / sizeof kcases[0])

static bool same(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* |got - want| <= rel * bound + tiny, element by element. */
static void within(const char *what, const float *got, const float *want, const float *bound,
                   size_t n, double rel) {
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - (double)want[i]);
        if (!(err <= rel * bound[i] + 1e-30))
            fail_msg("%s: element %zu is %.9g, PyTorch %.9g (bound %.3g)", what, i, (double)got[i],
                     (double)want[i], rel * bound[i]);
    }
}

static void test_kernels(void **state) {
    (void)state;
    oracle orc;
    oracle_init(&orc);
    float *gy[N_KCASES], *gdw[N_KCASES];
    for (int i = 0; i < N_KCASES; i++) {
        const kcase *k = &kcases[i];
        const cf_conv_geom g = stem_geom(k->c, k->h, k->w);
        assert_true(cf_conv_stem_supported(&g, k->o));
        assert_int_equal(cf_conv_stem_wgrad_as_nt(&g, k->o), k->dw_bitwise);
        const int K = 9 * k->c, P = k->h * k->w, O = k->o, n = k->n;
        const size_t nx = (size_t)n * k->c * P, ny = (size_t)n * O * P, nw = (size_t)O * K;
        float *x = malloc(nx * 4), *w = malloc(nw * 4), *dy = malloc(ny * 4);
        float *y = malloc(ny * 4), *yl = malloc(ny * 4), *col = malloc((size_t)K * P * 4);
        float *dw = malloc(nw * 4), *dwl = malloc(nw * 4), *dwa = malloc(nw * 4),
              *dwla = malloc(nw * 4);
        fill_uniform(x, nx, 10 + i, -2, 2);
        fill_uniform(w, nw, 20 + i, -1, 1);
        fill_uniform(dy, ny, 30 + i, -1, 1);
        /* the lowered product, the weight gradient through cf_sgemm_nt: conv.c's lowered one
         * where K < 16 and O <= 16 (the one cf_conv_stem_wgrad_as_nt's shapes replace; others
         * take cf_sgemm_strided on dy transposed there, close to this) */
        fill_uniform(dwla, nw, 40 + i, -1, 1);
        memcpy(dwa, dwla, nw * 4);
        for (int j = 0; j < n; j++) {
            cf_im2col(&g, x + (size_t)j * k->c * P, col, P);
            cf_sgemm_strided(O, P, K, w, K, 1, col, P, yl + (size_t)j * O * P, P, false);
            cf_sgemm_nt(K, O, P, col, P, dy + (size_t)j * O * P, P, dwl, O, j > 0);
            cf_sgemm_nt(K, O, P, col, P, dy + (size_t)j * O * P, P, dwla, O, true);
        }
        /* the epilogue against the same call's output without one */
        float *yref = malloc(ny * 4);
        assert_int_equal(cf_conv_stem_forward(&g, O, w, x, n, yref, NULL), CF_OK);
        for (size_t j = 0; j < ny; j++) y[j] = -7.0f; /* every value must be written */
        ep_check e = {.n = n, .out_n = (size_t)O * P, .y = y, .ref = yref};
        const cf_conv_epilogue ep = {ep_fn, &e};
        assert_int_equal(cf_conv_stem_forward(&g, O, w, x, n, y, &ep), CF_OK);
        assert_int_equal(e.next, n);
        free(yref);
        assert_int_equal(cf_conv_stem_wgrad(&g, O, dy, x, n, dw, false), CF_OK);
        assert_int_equal(cf_conv_stem_wgrad(&g, O, dy, x, n, dwa, true), CF_OK);
        const bool pays = cf_active_kernels->stem_forward != NULL; /* vector kernels */
        printf("%d x %d -> %d on %dx%d (%d images): %s; y %s, dW %s, accumulated %s\n", k->c, 3, O,
               k->h, k->w, n, pays ? "vector kernels" : "portable loops",
               same(y, yl, ny) ? "bitwise" : "differs", same(dw, dwl, nw) ? "bitwise" : "differs",
               same(dwa, dwla, nw) ? "bitwise" : "differs");
        if (pays && !same(y, yl, ny))
            fail_msg("case %d: the forward is not bitwise the lowered product's", i);
        if (pays && k->dw_bitwise && blas_skylakex() &&
            (!same(dw, dwl, nw) || !same(dwa, dwla, nw)))
            fail_msg("case %d: the weight gradient is not bitwise the lowered product's", i);
        assert_rel_err_within("y against the lowered product", y, yl, ny, 1.0, 1e-5);
        assert_rel_err_within("dW against the lowered product", dw, dwl, nw, 10.0, 1e-4);
        assert_rel_err_within("accumulated dW against the lowered product", dwa, dwla, nw, 10.0,
                              1e-4);
        char name[16];
        snprintf(name, sizeof name, "x%d", i);
        oracle_put(&orc, name, x, cf_shape4(n, k->c, k->h, k->w));
        snprintf(name, sizeof name, "w%d", i);
        oracle_put(&orc, name, w, cf_shape4(O, k->c, 3, 3));
        snprintf(name, sizeof name, "dy%d", i);
        oracle_put(&orc, name, dy, cf_shape4(n, O, k->h, k->w));
        gy[i] = y;
        gdw[i] = dw;
        free(x), free(w), free(dy), free(yl), free(col), free(dwl), free(dwa), free(dwla);
    }
    char args[16];
    snprintf(args, sizeof args, "%d", N_KCASES);
    oracle_run(&orc, "conv_stem.py", args);
    for (int i = 0; i < N_KCASES; i++) {
        const kcase *k = &kcases[i];
        const int K = 9 * k->c, O = k->o;
        char name[16];
        snprintf(name, sizeof name, "y%d", i);
        cf_tensor ry = oracle_get(&orc, name);
        snprintf(name, sizeof name, "ya%d", i);
        cf_tensor ra = oracle_get(&orc, name);
        within("y against PyTorch", gy[i], ry.data, ra.data, cf_tensor_numel(&ry), 1e-5);
        snprintf(name, sizeof name, "gw%d", i);
        cf_tensor rg = oracle_get(&orc, name);
        snprintf(name, sizeof name, "gwa%d", i);
        cf_tensor rga = oracle_get(&orc, name);
        float *dw = malloc((size_t)O * K * 4); /* dwt (K x O) -> O x K */
        for (int o = 0; o < O; o++)
            for (int j = 0; j < K; j++) dw[o * K + j] = gdw[i][j * O + o];
        within("dW against PyTorch", dw, rg.data, rga.data, (size_t)O * K, 1e-4);
        free(dw), free(ry.data), free(ra.data), free(rg.data), free(rga.data);
        free(gy[i]), free(gdw[i]);
    }
    oracle_cleanup(&orc);
}

/* A shape the kernels do not take: CF_ERR_INVALID, nothing written (a plane over
 * CF_STEM_MAX_PLANE positions overflowed the kernels' lane masks, a row over it the portable
 * loops' sums). */
static void test_refuses(void **state) {
    (void)state;
    static const struct {
        int c, h, w, k, s, p, o, n;
    } bad[] = {
        {1, 80, 80, 3, 1, 1, 16, 2}, /* 6400 positions */
        {1, 1, 5000, 3, 1, 1, 4, 1}, /* a row of 5000 */
        {5, 8, 8, 3, 1, 1, 16, 1},   /* 5 channels */
        {1, 8, 8, 3, 2, 1, 16, 1},   /* stride 2 */
        {1, 8, 8, 5, 1, 2, 16, 1},   /* 5x5 */
        {1, 8, 8, 3, 1, 0, 16, 1},   /* no padding */
        {1, 8, 8, 3, 1, 1, 0, 1},    /* no outputs */
        {1, 8, 8, 3, 1, 1, 16, -1},  /* a negative image count */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cf_conv_geom g;
        assert_true(cf_conv_geom_init(&g, bad[i].c, bad[i].h, bad[i].w, bad[i].k, bad[i].k,
                                      bad[i].s, bad[i].s, bad[i].p, bad[i].p));
        const int n = bad[i].n > 0 ? bad[i].n : 1, O = bad[i].o > 0 ? bad[i].o : 1;
        const size_t nx = (size_t)n * g.c * g.h * g.w, ny = (size_t)n * O * g.oh * g.ow,
                     nw = (size_t)O * g.c * g.kh * g.kw;
        float *x = calloc(nx, 4), *w = calloc(nw, 4), *y = malloc(ny * 4), *dw = malloc(nw * 4);
        for (size_t j = 0; j < ny; j++) y[j] = -7.0f;
        for (size_t j = 0; j < nw; j++) dw[j] = -7.0f;
        assert_int_equal(cf_conv_stem_forward(&g, bad[i].o, w, x, bad[i].n, y, NULL),
                         CF_ERR_INVALID);
        assert_non_null(strstr(cf_last_error(), "cf_conv_stem_forward"));
        assert_int_equal(cf_conv_stem_wgrad(&g, bad[i].o, y, x, bad[i].n, dw, false),
                         CF_ERR_INVALID);
        assert_non_null(strstr(cf_last_error(), "cf_conv_stem_wgrad"));
        for (size_t j = 0; j < ny; j++) assert_true(y[j] == -7.0f);
        for (size_t j = 0; j < nw; j++) assert_true(dw[j] == -7.0f);
        free(x), free(w), free(y), free(dw);
    }
}

/* cf_conv_stem_wgrad_each's prologue: image i's dy copied into a buffer (the rest poisoned), the
 * images asked once each, in order. */
typedef struct pro_check {
    const float *dy;
    float *buf;
    size_t per;
    int next;
} pro_check;

static const float *pro_fn(void *v, int i) {
    pro_check *p = v;
    if (i != p->next) fail_msg("prologue: image %d asked, image %d expected", i, p->next);
    p->next++;
    memcpy(p->buf, p->dy + (size_t)i * p->per, p->per * sizeof(float));
    return p->buf;
}

static void test_prologue(void **state) {
    (void)state;
    for (int i = 0; i < N_KCASES; i++) {
        const kcase *k = &kcases[i];
        const cf_conv_geom g = stem_geom(k->c, k->h, k->w);
        const int K = 9 * k->c, P = k->h * k->w, O = k->o, n = k->n;
        const size_t nx = (size_t)n * k->c * P, ny = (size_t)n * O * P, nw = (size_t)O * K;
        float *x = malloc(nx * 4), *dy = malloc(ny * 4), *buf = malloc((size_t)O * P * 4);
        float *dw = malloc(nw * 4), *dwp = malloc(nw * 4);
        fill_uniform(x, nx, 50 + i, -2, 2);
        fill_uniform(dy, ny, 60 + i, -1, 1);
        for (int acc = 0; acc <= 1; acc++) {
            fill_uniform(dw, nw, 70 + i, -1, 1);
            memcpy(dwp, dw, nw * 4);
            assert_int_equal(cf_conv_stem_wgrad(&g, O, dy, x, n, dw, acc), CF_OK);
            pro_check pc = {dy, buf, (size_t)O * P, 0};
            const cf_conv_prologue pro = {pro_fn, &pc};
            assert_int_equal(cf_conv_stem_wgrad_each(&g, O, NULL, &pro, x, n, dwp, acc), CF_OK);
            assert_int_equal(pc.next, n);
            if (memcmp(dw, dwp, nw * 4) != 0)
                fail_msg("case %d (accumulate %d): the prologue's dW differs from dy's", i, acc);
        }
        /* without fn: dy read in place */
        const cf_conv_prologue none = {NULL, NULL};
        assert_int_equal(cf_conv_stem_wgrad_each(&g, O, dy, &none, x, n, dwp, false), CF_OK);
        assert_int_equal(cf_conv_stem_wgrad(&g, O, dy, x, n, dw, false), CF_OK);
        assert_memory_equal(dw, dwp, nw * 4);
        free(x), free(dy), free(buf), free(dw), free(dwp);
    }
    cf_conv_geom bad;
    assert_true(cf_conv_geom_init(&bad, 1, 8, 8, 3, 3, 2, 2, 1, 1));
    float dw[16 * 9];
    assert_int_equal(cf_conv_stem_wgrad_each(&bad, 16, NULL, NULL, dw, 1, dw, false),
                     CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "cf_conv_stem_wgrad_each"));
}

/* ---- Conv2d -> BatchNorm2d -> ReLU ------------------------------------------------------------
 */

#define STEPS 2

typedef struct run_opts {
    bool bf16, direct, link;
    int threads;
} run_opts;

static cf_module *stem_net(int c, int o) {
    cf_module *m[] = {cf_conv2d(c, o, 3, 1, 1, false), cf_batchnorm2d(o), cf_relu()};
    return cf_sequential(3, m);
}

/* A U-Net whose encoder starts with the stem (c -> o) and halves the size twice. */
static cf_module *unet_on_stem(int c, int o, int h, int w) {
    cf_module *m[] = {cf_conv2d(c, o, 3, 1, 1, false),   cf_batchnorm2d(o),  cf_relu(),
                      cf_conv2d(o, o, 3, 1, 1, false),   cf_batchnorm2d(o),  cf_relu(),
                      cf_conv2d(o, 32, 3, 2, 1, false),  cf_batchnorm2d(32), cf_relu(),
                      cf_conv2d(32, 64, 3, 2, 1, false), cf_batchnorm2d(64), cf_relu()};
    return cf_dynamic_unet(cf_sequential(12, m), c, 3, h, w, NULL);
}

/* STEPS training steps and an eval forward of the stem (c -> co) on n images of c x h x w. */
static record run_net(int n, int c, int co, int h, int w, run_opts o) {
    cf_set_num_threads(o.threads);
    cf__nn_set_stem_direct(o.direct);
    cf__nn_set_stats_link(o.link);
    cf_model *model = block_model(stem_net(c, co), 7, o.bf16, false);
    const cf_conv_geom g = stem_geom(c, h, w);
    /* the link where the direct stem runs (the lowered fp32 path has no epilogue) */
    const bool linked = o.direct && o.link && cf_conv_stem_pays(&g, co) && !cf_kernels_reference();
    const size_t nx = (size_t)n * c * h * w;
    float *x = malloc(nx * sizeof(float));
    record r = {0};
    for (int step = 0; step <= STEPS; step++) {
        const bool training = step < STEPS;
        step_start(model, x, nx, 300 + (uint64_t)step, training);
        cf_tensor tx = cf_tensor_view(x, cf_shape4(n, c, h, w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        const bool took = cf_nn_bn_took_stats(model->root->children[1]);
        if (took != (training && linked))
            fail_msg("%d -> %d on %dx%d (bf16 %d, direct %d, link %d, %d threads) step %d: the "
                     "BatchNorm took the linked sums %d",
                     c, co, h, w, o.bf16, o.direct, o.link, o.threads, step, took);
        put(&r, y->data, cf_tensor_numel(y));
        if (!training) break;
        record_backward_step(&r, model, y, nx, step);
    }
    free(x);
    cf_model_free(model);
    cf__nn_set_stem_direct(true);
    cf__nn_set_stats_link(true);
    cf_set_num_threads(1);
    return r;
}

static void test_direct_equals_lowered(void **state) {
    (void)state;
    /* W1's (12 images: even splits over 2 and 3 threads; 7: uneven), then shapes whose weight
     * gradient stays lowered: more than one channel, more than 16 outputs, output counts off
     * the multiples of 4, thin planes of single images (never grouped) */
    static const struct {
        int n, c, o, h, w;
    } shapes[] = {
        {12, 1, 16, 28, 28}, {7, 1, 16, 28, 28}, {5, 3, 16, 32, 32}, {3, 1, 32, 28, 28},
        {2, 4, 16, 23, 25},  {1, 2, 5, 3, 7},    {1, 4, 9, 2, 17},   {1, 3, 7, 1, 300},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int bf16 = 0; bf16 <= 1; bf16++)
            for (int t = 1; t <= 3; t++) {
                const int n = shapes[s].n, c = shapes[s].c, co = shapes[s].o, h = shapes[s].h,
                          w = shapes[s].w;
                const record base = run_net(n, c, co, h, w, (run_opts){bf16, false, false, t});
                char name[160];
                snprintf(name, sizeof name, "%d -> %d on %dx%d, %d images (bf16 %d, %d threads)", c,
                         co, h, w, n, bf16, t);
                const cf_conv_geom g = stem_geom(c, h, w);
                /* the direct weight gradient is the lowered one's bits only with the kernel it
                 * reproduces (test_kernels); the rest is the lowered path's everywhere */
                const bool bitwise = !cf_conv_stem_wgrad_as_nt(&g, co) || blas_skylakex();
                for (int v = 0; v < 3; v++) { /* direct and linked, direct alone, linked alone */
                    const run_opts o = {bf16, v != 2, v != 1, t};
                    record copy = {0};
                    put(&copy, base.v, base.n);
                    if (bitwise)
                        records_equal(run_net(n, c, co, h, w, o), copy, name,
                                      v == 2 ? "linked" : "direct", "lowered");
                    else {
                        record got = run_net(n, c, co, h, w, o);
                        assert_int_equal(got.n, copy.n);
                        assert_rel_err_within(name, got.v, copy.v, got.n, 1.0, 1e-4);
                        free(got.v), free(copy.v);
                    }
                }
                free(base.v);
            }
}

/* STEPS training steps of root (its first child, or its first child's, a Conv2d on c x h x w, the
 * next the BatchNorm)
 * through cf_model_backward (no input gradient), the link on or off; every gradient, buffer and
 * weight recorded. The link must be taken each step exactly where `expect`. */
static record run_unasked(cf_module *root, int n, int c, int h, int w, int out, bool bf16,
                          bool link, int threads, bool expect, const char *name) {
    cf_set_num_threads(threads);
    cf__nn_set_stem_dx_link(link);
    cf_model *model = block_model(root, 7, bf16, false);
    cf_model_train(model, true);
    cf_module *stem = model->root; /* W1: its body's first children */
    while (!cf_nn_is_conv(stem->children[0])) stem = stem->children[0];
    cf_module *conv = stem->children[0], *bn = stem->children[1];
    const size_t nx = (size_t)n * c * h * w;
    float *x = malloc(nx * sizeof(float));
    record r = {0};
    for (int step = 0; step < STEPS; step++) {
        fill_uniform(x, nx, 400 + (uint64_t)step, -2, 2);
        cf_model_zero_grad(model);
        cf_tensor tx = cf_tensor_view(x, cf_shape4(n, c, h, w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        const size_t ny = cf_tensor_numel(y);
        float *dy = malloc(ny * sizeof(float));
        fill_uniform(dy, ny, 500 + (uint64_t)step, -1, 1);
        cf_tensor tdy = cf_tensor_view(dy, y->shape);
        assert_int_equal(cf_model_backward(model, &tdy), CF_OK);
        free(dy);
        const bool took = cf_nn_conv_filled_dy(conv), left = cf_nn_bn_left_dx(bn);
        if (took != (link && expect) || left != took)
            fail_msg("%s (link %d, %d threads) step %d: the convolution filled its dy %d, the "
                     "BatchNorm left its dx %d, %d expected",
                     name, link, threads, step, took, left, link && expect);
        put(&r, model->grads, model->n_weights);
        put(&r, model->buffers, model->n_buffers);
        for (size_t i = 0; i < model->n_weights; i++) model->weights[i] -= 0.05f * model->grads[i];
        put(&r, model->weights, model->n_weights);
    }
    (void)out;
    free(x);
    cf_model_free(model);
    cf__nn_set_stem_dx_link(true);
    cf_set_num_threads(1);
    return r;
}

static void test_dx_link(void **state) {
    (void)state;
    /* W1's stem (12 images: even splits, 7: uneven), W1 itself, a stride-1 residual block whose
     * convpath starts with W1's stem shape (its Sequential inside the block), a U-Net whose
     * encoder starts with the stem (its encoder's backward runs span by span between the skip
     * joins, so the stem's span holds the BatchNorm's gradient for the convolution), and stems
     * whose weight gradient stays lowered (no link) */
    enum { STEM, W1, BLOCK, UNET };
    static const struct {
        int n, c, o, h, w, kind;
    } cases[] = {
        {12, 1, 16, 28, 28, STEM}, {7, 1, 16, 28, 28, STEM}, {6, 1, 16, 28, 28, W1},
        {5, 1, 16, 28, 28, BLOCK}, {3, 1, 32, 28, 28, STEM}, {2, 3, 16, 12, 12, STEM},
        {2, 1, 8, 5, 5, STEM},     {4, 1, 16, 28, 28, UNET}, {8, 1, 16, 28, 28, UNET},
    };
    static const char *kinds[] = {"stem", "W1,", "a block on", "a U-Net on"};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++)
        for (int bf16 = 0; bf16 <= 1; bf16++)
            for (int t = 1; t <= 3; t++) {
                const int n = cases[s].n, c = cases[s].c, co = cases[s].o, h = cases[s].h,
                          w = cases[s].w;
                const cf_conv_geom g = stem_geom(c, h, w);
                /* the direct weight gradient: conv.c's use_stem_direct_dw */
                const bool expect = cf_conv_stem_pays(&g, co) && !cf_kernels_reference() &&
                                    cf_conv_stem_wgrad_as_nt(&g, co);
                char name[160];
                snprintf(name, sizeof name, "%s %d -> %d on %dx%d, %d images (bf16 %d)",
                         kinds[cases[s].kind], c, co, h, w, n, bf16);
                const block_net bk = {"block", BNET_BLOCK_S1, n, c, h, w, co, 1};
                cf_module *nets[2];
                for (int i = 0; i < 2; i++)
                    nets[i] = cases[s].kind == W1      ? cf_mini_resnet(c, 10)
                              : cases[s].kind == BLOCK ? block_net_build(&bk)
                              : cases[s].kind == UNET  ? unet_on_stem(c, co, h, w)
                                                       : stem_net(c, co);
                record on = run_unasked(nets[0], n, c, h, w, co, bf16, true, t, expect, name);
                record off = run_unasked(nets[1], n, c, h, w, co, bf16, false, t, expect, name);
                records_equal(on, off, name, "linked", "unlinked");
            }
    /* the input gradient asked after all: the BatchNorm's dx written by the fill before the
     * convolution's backward, every value as unlinked */
    for (int t = 1; t <= 2; t++) {
        cf_set_num_threads(t);
        record r[2];
        for (int link = 0; link <= 1; link++) {
            cf__nn_set_stem_dx_link(link);
            cf_model *model;
            assert_int_equal(cf_model_new(&model, stem_net(1, 16), 7), CF_OK);
            cf_model_train(model, true);
            const size_t nx = 5 * 28 * 28;
            float *x = malloc(nx * 4);
            fill_uniform(x, nx, 77, -2, 2);
            cf_tensor tx = cf_tensor_view(x, cf_shape4(5, 1, 28, 28));
            const cf_tensor *y;
            assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
            r[link] = (record){0};
            record_backward_step(&r[link], model, y, nx, 0);
            const cf_conv_geom g = stem_geom(1, 28, 28);
            const bool armed = link && cf_conv_stem_pays(&g, 16) && !cf_kernels_reference();
            assert_false(cf_nn_conv_filled_dy(model->root->children[0]));
            assert_int_equal(cf_nn_bn_left_dx(model->root->children[1]), armed);
            free(x);
            cf_model_free(model);
        }
        records_equal(r[1], r[0], "the stem with its input gradient", "linked", "unlinked");
    }
    cf__nn_set_stem_dx_link(true);
    cf_set_num_threads(1);
}

/* One training forward and backward of W1's stem against PyTorch: the ReLU's output, the
 * convolution's weight gradient, the BatchNorm's running statistics. */
static void test_net_oracle(void **state) {
    (void)state;
    const int n = 16, hw = 28;
    for (int t = 1; t <= 3; t += 2) {
        cf_set_num_threads(t);
        cf_model *model;
        assert_int_equal(cf_model_new(&model, stem_net(1, 16), 9), CF_OK);
        cf_model_train(model, true);
        cf_model_zero_grad(model);
        const size_t nx = (size_t)n * hw * hw, ny = (size_t)n * 16 * hw * hw;
        float *x = malloc(nx * 4), *dy = malloc(ny * 4);
        fill_uniform(x, nx, 61, -1, 3);
        fill_uniform(dy, ny, 62, -1, 1);
        cf_tensor tx = cf_tensor_view(x, cf_shape4(n, 1, hw, hw));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        cf_tensor tdy = cf_tensor_view(dy, y->shape);
        model->root->ops->backward(model->root, &tdy, false);
        cf_module *conv = model->root->children[0], *bn = model->root->children[1];
        /* the weight gradient below through the stem dx link where the direct one runs */
        const cf_conv_geom g = stem_geom(1, hw, hw);
        assert_int_equal(cf_nn_conv_filled_dy(conv),
                         cf_conv_stem_pays(&g, 16) && !cf_kernels_reference());
        oracle orc;
        oracle_init(&orc);
        oracle_put(&orc, "net_x", x, tx.shape);
        oracle_put(&orc, "net_w", conv->params[0].data, cf_shape4(16, 1, 3, 3));
        oracle_put(&orc, "net_dy", dy, y->shape);
        oracle_run(&orc, "conv_stem.py", "0");
        cf_tensor out = oracle_get(&orc, "net_out"), gw = oracle_get(&orc, "net_gw"),
                  rm = oracle_get(&orc, "net_rmean"), rv = oracle_get(&orc, "net_rvar");
        assert_close("the ReLU's output", y->data, out.data, ny, 1e-4, 1e-5);
        assert_close("the weight gradient", conv->params[0].grad, gw.data, 16 * 9, 1e-3, 1e-3);
        assert_close("running_mean", bn->params[2].data, rm.data, 16, 1e-5, 1e-6);
        assert_close("running_var", bn->params[3].data, rv.data, 16, 1e-5, 1e-6);
        free(out.data), free(gw.data), free(rm.data), free(rv.data);
        oracle_cleanup(&orc);
        free(x), free(dy);
        cf_model_free(model);
    }
    cf_set_num_threads(1);
}

int main(void) {
    printf("level %s\n", cf_isa_name(cf_isa_active()));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_refuses),
        cmocka_unit_test(test_direct_equals_lowered),
        cmocka_unit_test(test_net_oracle),
        cmocka_unit_test(test_prologue),
        cmocka_unit_test(test_dx_link),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
