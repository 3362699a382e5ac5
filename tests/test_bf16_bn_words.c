/* The forward link (src/nn/nn_internal.h): in mixed precision, a BatchNorm (with its fused ReLU,
 * or none) whose output goes straight to a bf16 Conv2d in the same Sequential writes that
 * convolution's bf16 input words instead of its fp32 output, and the convolution computes its
 * forward from the words (cf_conv_bf16_forward_from_kept) and its weight gradient from the same
 * words. Everything must stay bitwise what the unlinked layers compute.
 *
 * Each network runs the same training steps twice from the same seed, with the link (the
 * default) and without it (cf__nn_set_x_words_link(false)): the outputs, input gradients, every
 * parameter gradient, the running statistics and the updated weights of every step, then an eval
 * forward, must be equal (memcmp), with 1 and 2 threads (BatchNorm's channel blocks and its split
 * by images), and with synchronised BatchNorm statistics (cf_model_set_bn_reduce). The networks:
 * Sequentials conv-BN-ReLU-conv-BN on W1's 14 x 14 and 7 x 7 planes (the convolution's cols path),
 * conv-BN-conv (no ReLU), 48 x 48 planes (run_images' path, BatchNorm's planes longer than its
 * buffer), W1's residual block, and W1 itself. The link must be taken where the level has bf16
 * kernels (cf_nn_bn_wrote_words, cf_nn_conv_read_words), and not in eval, with a wrapped ReLU (a
 * hook that records the ReLU's output, which must be the same values as unlinked), with the
 * convolution in fp32, with an odd number of channels (no words path), or at a level without bf16
 * kernels (tests/bf16_bn_words.cmake runs this under every CF_ISA cap and over the amx tile
 * emulation). A backward at another level than its forward's fails rather than read the input the
 * BatchNorm did not write. */
#include "block_nets.h"
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"
#include "tensor/kernel_table.h"

#define STEPS 3

/* ---- a hook on ReLU: a copy of its ops whose forward records the output it returns ---------- */

static const cf_module_ops *hook_orig;
static cf_module_ops hook_ops;
static float *hook_seen; /* every recorded output, in call order */
static size_t hook_n, hook_cap;

static const cf_tensor *hook_forward(cf_module *m, const cf_tensor *x) {
    const cf_tensor *y = hook_orig->forward(m, x);
    const size_t n = cf_tensor_numel(y);
    if (hook_n + n > hook_cap) {
        hook_cap = 2 * (hook_n + n);
        hook_seen = realloc(hook_seen, hook_cap * sizeof(float));
        assert_non_null(hook_seen);
    }
    memcpy(hook_seen + hook_n, y->data, n * sizeof(float));
    hook_n += n;
    return y;
}

/* Hooks every ReLU under m (after the plan: the ReLU still passes the BatchNorm's output on). */
static void hook_relus(cf_module *m) {
    if (cf_nn_is_relu(m)) {
        hook_orig = m->ops;
        hook_ops = *m->ops;
        hook_ops.forward = hook_forward;
        m->ops = &hook_ops;
    }
    for (int i = 0; i < m->n_children; i++) hook_relus(m->children[i]);
}

static void unhook_relus(cf_module *m) {
    if (m->ops == &hook_ops) m->ops = hook_orig;
    for (int i = 0; i < m->n_children; i++) unhook_relus(m->children[i]);
}

/* A hook on W1's first residual block (installed after the plan): its forward records the input
 * it gets, the stem BatchNorm's output, which it must see as unlinked (no link through a wrapped
 * block). */
static const cf_module_ops *bhook_orig;
static cf_module_ops bhook_ops;

static const cf_tensor *bhook_forward(cf_module *m, const cf_tensor *x) {
    const size_t n = cf_tensor_numel(x);
    if (hook_n + n > hook_cap) {
        hook_cap = 2 * (hook_n + n);
        hook_seen = realloc(hook_seen, hook_cap * sizeof(float));
        assert_non_null(hook_seen);
    }
    memcpy(hook_seen + hook_n, x->data, n * sizeof(float));
    hook_n += n;
    return bhook_orig->forward(m, x);
}

static void hook_block(cf_module *root) {
    cf_module *b = first_block(root);
    assert_non_null(b);
    bhook_orig = b->ops;
    bhook_ops = *b->ops;
    bhook_ops.forward = bhook_forward;
    b->ops = &bhook_ops;
}

static void unhook_block(cf_module *root) {
    cf_module *b = first_block(root);
    if (b && b->ops == &bhook_ops) b->ops = bhook_orig;
}

/* ---- networks ------------------------------------------------------------------------------- */

typedef enum { NET_SEQ, NET_SEQ_NORELU, NET_BLOCK, NET_W1, NET_UNET } net_kind;

typedef struct net_case {
    const char *name;
    net_kind kind;
    int n, c, h, w, o; /* batch, input channels and size, the first convolution's outputs */
    int links;         /* BatchNorm -> Conv2d links a training step takes at a bf16 level */
} net_case;

static cf_module *seq2(cf_module **mods, int n) {
    return cf_sequential(n, mods);
}

static cf_module *build(const net_case *k) {
    switch (k->kind) {
    case NET_SEQ: {
        cf_module *m[] = {cf_conv2d(k->c, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o), cf_relu(),
                          cf_conv2d(k->o, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o)};
        return seq2(m, 5);
    }
    case NET_SEQ_NORELU: {
        cf_module *m[] = {cf_conv2d(k->c, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o),
                          cf_conv2d(k->o, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o)};
        return seq2(m, 4);
    }
    case NET_BLOCK: { /* W1's: 3x3 stride 2, BN, ReLU, 3x3, BN; shortcut 1x1 stride 2, BN */
        cf_module *cp[] = {cf_conv2d(k->c, k->o, 3, 2, 1, false), cf_batchnorm2d(k->o), cf_relu(),
                           cf_conv2d(k->o, k->o, 3, 1, 1, false), cf_batchnorm2d(k->o)};
        cf_module *ip[] = {cf_conv2d(k->c, k->o, 1, 2, 0, false), cf_batchnorm2d(k->o)};
        return cf_residual(seq2(cp, 5), seq2(ip, 2), true);
    }
    case NET_W1:
        return cf_mini_resnet(k->c, 10);
    case NET_UNET: /* W1's body as a U-Net's encoder: the stem's output is a skip */
        return cf_dynamic_unet(cf_mini_resnet_body(k->c), k->c, 3, k->h, k->w, NULL);
    }
    return NULL;
}

/* Counts the BatchNorms that wrote words and the Conv2ds that read them in the last forward. */
static void count_links(const cf_module *m, int *wrote, int *read) {
    if (cf_nn_bn_wrote_words(m)) (*wrote)++;
    if (cf_nn_conv_read_words(m)) (*read)++;
    for (int i = 0; i < m->n_children; i++) count_links(m->children[i], wrote, read);
}

/* What a run leaves: every step's output, input gradient, gradients, buffers and weights, then
 * an eval output, end to end. */
/* Puts the words each Conv2d under m kept in its last forward (the link's, or forward_keep's)
 * into r, two to a float's bytes. */
static void put_kept(record *r, const cf_module *m) {
    size_t n;
    const uint16_t *kept = cf__conv_bf16_kept(m, &n);
    for (size_t i = 0; i < n; i += 2) {
        uint16_t two[2] = {kept[i], i + 1 < n ? kept[i + 1] : 0};
        float f;
        memcpy(&f, two, sizeof f);
        put(r, &f, 1);
    }
    for (int i = 0; i < m->n_children; i++) put_kept(r, m->children[i]);
}

typedef struct run_opts {
    bool link, bf16, hook;
    bool sync;   /* synchronised BatchNorm (two identical replicas: every sum doubled) */
    bool hblock; /* W1's first block hooked after the first step (its stem link dropped) */
    int threads;
} run_opts;

/* STEPS training steps (forward, backward, w -= 0.05 grad) and an eval forward of case k; the
 * links taken by each training forward must be `expect_links` (and none in eval). */
static record run_case(const net_case *k, run_opts o, int expect_links) {
    cf_set_num_threads(o.threads);
    cf__nn_set_x_words_link(o.link);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, build(k), 21), CF_OK);
    cf_conv_set_bf16(model->root, o.bf16);
    if (o.sync) assert_int_equal(cf_model_set_bn_reduce(model, twin_reduce, NULL), CF_OK);
    if (k->kind == NET_SEQ || k->kind == NET_SEQ_NORELU) {
        /* channel 1 of the first BatchNorm's output subnormal (its words rounded as such) */
        cf_param *gamma = cf_model_param(model, "1.weight"),
                 *beta = cf_model_param(model, "1.bias");
        assert_non_null(gamma), assert_non_null(beta);
        gamma->data[1] = 3e-39f;
        beta->data[1] = 1e-39f;
    }
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    record r = {0};
    hook_n = 0;
    for (int step = 0; step <= STEPS; step++) {
        const bool training = step < STEPS;
        fill_uniform(x, nx, 100 + (uint64_t)step, -2, 2);
        cf_model_train(model, training);
        cf_model_zero_grad(model);
        /* the hook after the first step (a callback's, installed after the plan) */
        if (o.hook && step == 1) hook_relus(model->root);
        if (o.hblock && step == 1) hook_block(model->root);
        cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        int wrote = 0, read = 0;
        count_links(model->root, &wrote, &read);
        /* a hooked ReLU drops every link but W1's fold's into its second block (no ReLU module
         * between); a hooked first block drops the stem's into it and its fold's out of it */
        const int want = !training             ? 0
                         : o.hook && step >= 1 ? (expect_links && k->kind == NET_W1 ? 1 : 0)
                         : o.hblock && step >= 1 && expect_links ? expect_links - 2
                                                                 : expect_links;
        if (wrote != want || read != want)
            fail_msg("%s (link %d, bf16 %d, hook %d, %d threads) step %d: %d BatchNorms wrote "
                     "words and %d Conv2ds read them, expected %d",
                     k->name, o.link, o.bf16, o.hook, o.threads, step, wrote, read, want);
        const size_t ny = cf_tensor_numel(y);
        put(&r, y->data, ny);
        put_kept(&r, model->root);
        if (!training) break;
        record_backward_step(&r, model, y, nx, step);
    }
    if (o.hook || o.hblock) {
        put(&r, hook_seen, hook_n); /* what the hook saw: the ReLU's real outputs */
        unhook_relus(model->root);
        unhook_block(model->root);
    }
    free(x);
    cf_model_free(model);
    cf__nn_set_x_words_link(true);
    cf_set_num_threads(1);
    return r;
}

/* Case k with and without the link must agree bitwise; the link taken `links` times a step
 * where the level has bf16 kernels (and bf16 on), never otherwise (nor once a ReLU is hooked). */
static void check_case_sync(const net_case *k, bool bf16, bool hook, int threads, bool sync) {
    const int links = bf16 && cf_bf16_compute() ? k->links : 0;
    run_opts o = {.link = true, .bf16 = bf16, .hook = hook, .sync = sync, .threads = threads};
    record a = run_case(k, o, links);
    o.link = false;
    record b = run_case(k, o, 0);
    char name[160];
    snprintf(name, sizeof name, "%s (bf16 %d, hook %d, %d threads)", k->name, bf16, hook, threads);
    records_equal(a, b, name, "linked", "unlinked");
}

static void check_case(const net_case *k, bool bf16, bool hook, int threads) {
    check_case_sync(k, bf16, hook, threads, false);
}

static const net_case cases[] = {
    {"conv-BN-ReLU-conv-BN 32ch 14x14", NET_SEQ, 6, 16, 14, 14, 32, 1},
    {"conv-BN-ReLU-conv-BN 64ch 7x7", NET_SEQ, 5, 32, 7, 7, 64, 1},
    {"conv-BN-conv-BN 32ch 14x14", NET_SEQ_NORELU, 6, 16, 14, 14, 32, 1},
    {"conv-BN-ReLU-conv-BN 8ch 48x48", NET_SEQ, 2, 8, 48, 48, 8, 1},
    {"W1's first block", NET_BLOCK, 6, 16, 28, 28, 32, 1},
    {"W1", NET_W1, 4, 1, 28, 28, 0, 4},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static void test_linked_equals_unlinked(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++) check_case(&cases[i], true, false, 1);
}

static void test_linked_equals_unlinked_threads(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++) check_case(&cases[i], true, false, 2);
}

/* Synchronised BatchNorm (cf_model_set_bn_reduce: the group's statistics, then the same output
 * pass), linked as the plain one. */
static void test_linked_sync(void **state) {
    (void)state;
    check_case_sync(&cases[0], true, false, 1, true);
    check_case_sync(&cases[3], true, false, 2, true);
    check_case_sync(&cases[5], true, false, 2, true);
}

/* A hook on the ReLU installed after the plan (as a callback would, after the first step) must
 * see the real outputs: no link from then on; and the convolutions in fp32 take none. */
static void test_not_taken(void **state) {
    (void)state;
    check_case(&cases[0], true, true, 1);
    check_case(&cases[4], true, true, 2);
    check_case(&cases[0], false, false, 1);
    check_case(&cases[5], false, false, 2);
    /* an odd number of channels between: no words path */
    const net_case odd = {"conv-BN-ReLU-conv-BN 31ch 14x14", NET_SEQ, 4, 16, 14, 14, 31, 0};
    check_case(&odd, true, false, 1);
    /* W1's body in a U-Net: the blocks' own links only, never the stem's through block 0.3
     * (the U-Net keeps the stem's output as a skip) */
    const net_case unet = {"U-Net on W1's body", NET_UNET, 2, 1, 28, 28, 0, 2};
    check_case(&unet, true, false, 1);
}

/* W1's stem BatchNorm into its first block (a stride-2 pair): a hook on the block (installed
 * after the plan) sees the BatchNorm's real output, unlinked from then on, and so is the block's
 * fold into the second block (the hook could read the block's output); a hooked ReLU drops the
 * stem's as well. */
static void test_block_not_taken(void **state) {
    (void)state;
    const net_case *k = &cases[5];
    const int links = cf_bf16_compute() ? k->links : 0;
    for (int threads = 1; threads <= 2; threads++) {
        run_opts o = {.link = true, .bf16 = true, .hblock = true, .threads = threads};
        record a = run_case(k, o, links);
        o.link = false;
        record b = run_case(k, o, 0);
        assert_int_equal(a.n, b.n);
        if (memcmp(a.v, b.v, a.n * sizeof(float)) != 0)
            fail_msg("W1 with its first block hooked (%d threads): linked is not unlinked",
                     threads);
        free(a.v), free(b.v);
    }
    check_case(k, true, true, 1);
}

/* A backward after a linked forward at a level without bf16 kernels (the table changed in
 * between, which cf_set_isa forbids) cannot read the words: the pass fails, it does not read the
 * unwritten fp32 input. */
static void test_level_changed(void **state) {
    (void)state;
#if defined(__x86_64__)
    if (!cf_bf16_compute()) return;
    cf_model *model;
    const net_case *k = &cases[0];
    assert_int_equal(cf_model_new(&model, build(k), 21), CF_OK);
    cf_conv_set_bf16(model->root, true);
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    fill_uniform(x, nx, 5, -2, 2);
    cf_model_train(model, true);
    cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
    const cf_tensor *y;
    /* an unlinked forward first: the BatchNorm's fp32 output then holds values (a backward that
     * read them would sum a weight gradient from them) */
    cf__nn_set_x_words_link(false);
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    cf__nn_set_x_words_link(true);
    cf_model_zero_grad(model);
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    cf_module *conv = model->root->children[3];
    assert_true(cf_nn_conv_read_words(conv));
    const size_t ny = cf_tensor_numel(y);
    float *dy = malloc(ny * sizeof(float));
    fill_uniform(dy, ny, 6, -1, 1); /* nonzero: a weight gradient summed from x would show */
    cf_tensor tdy = cf_tensor_view(dy, y->shape);
    const cf_kernel_table *level = cf_active_kernels; /* the amx emulation's too */
    cf_active_kernels = &cf_kernels_avx512;
    const cf_status st = cf_model_backward(model, &tdy);
    cf_active_kernels = level;
    assert_int_equal(st, CF_ERR_STATE);
    assert_non_null(strstr(cf_last_error(), "bf16 words"));
    /* the failed pass left that convolution's weight gradient as it was (zero), not summed from
     * the input the BatchNorm did not write */
    for (size_t i = 0; i < conv->params[0].numel; i++)
        if (conv->params[0].grad[i] != 0.0f)
            fail_msg("the weight gradient [%zu] = %g after the failed pass", i,
                     (double)conv->params[0].grad[i]);
    free(x), free(dy);
    cf_model_free(model);
#endif
}

/* cf_conv_bf16_forward_from_kept(_with) against cf_conv_bf16_forward_keep on the same x: bitwise
 * the same output (and a paired shortcut's, so > 0: stride 2 with a 1x1 stride-2 shortcut of so
 * channels), and the words forward_keep kept are the ones from_kept read (cf_fp32_to_bf16's);
 * with the level's conv_cols (the cols path where the layer takes it) and without it (run_images'
 * path, as at amx). A layer the words path does not take is refused with nothing written. */
static void check_from_kept_pair(int n, int c, int h, int w, int o, int k, int s, int pad, int so) {
    cf_conv_geom g, sg;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, s, s, pad, pad));
    assert_true(cf_conv_geom_init(&sg, c, h, w, 1, 1, 2, 2, 0, 0));
    if (!cf_conv_bf16_forward_from_kept_fits(&g, o)) {
        if (cf_conv_bf16_supported(&g, o) && c % 2 == 0 && cf_conv_bf16_keeps_input(&g, o))
            fail_msg("from_kept %d -> %d %dx%d stride %d pad %d on %dx%d: refused", c, o, k, k, s,
                     pad, h, w);
        return;
    }
    if (so) assert_true(cf_conv_bf16_pair_fits(&g, o, &sg, so));
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * o * g.oh * g.ow,
                 nw = (size_t)o * c * k * k, nsy = (size_t)n * so * g.oh * g.ow;
    float *x = malloc(nx * sizeof(float)), *wt = malloc(nw * sizeof(float));
    float *sw = malloc(((size_t)so * c + 1) * sizeof(float));
    float *y1 = malloc(ny * sizeof(float)), *y2 = malloc(ny * sizeof(float));
    float *sy1 = malloc((nsy + 1) * sizeof(float)), *sy2 = malloc((nsy + 1) * sizeof(float));
    uint16_t *kept = malloc(nx * sizeof(uint16_t)), *words = malloc(nx * sizeof(uint16_t));
    float *packed = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float));
    float *spacked = malloc(cf_conv_bf16_packed_floats(&sg, so ? so : 1) * sizeof(float));
    float *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float));
    fill_bf16_specials(x, nx, 7);
    fill_uniform(wt, nw, 8, -1, 1);
    fill_uniform(sw, (size_t)so * c, 9, -1, 1);
    const cf_kernel_table *level = cf_active_kernels;
    cf_kernel_table without = *level; /* run_images' path: no conv_cols */
    cf_bf16_kernels without_bf16 = *level->bf16;
    without_bf16.conv_cols = NULL;
    without.bf16 = &without_bf16;
    for (int pass = 0; pass < 2; pass++) {
        cf_active_kernels = pass ? &without : level;
        cf_conv_bf16_pack(&g, o, wt, packed);
        if (so) cf_conv_bf16_pack(&sg, so, sw, spacked);
        const cf_conv_shortcut sc1 = {.out_channels = so, .w = spacked, .y = sy1},
                               sc2 = {.out_channels = so, .w = spacked, .y = sy2};
        for (size_t i = 0; i < nsy; i++) sy2[i] = 1e30f;
        assert_int_equal(
            cf_conv_bf16_forward_keep(&g, o, packed, x, n, y1, scratch, so ? &sc1 : NULL, kept),
            CF_OK);
        cf_fp32_to_bf16(x, words, nx);
        assert_memory_equal(kept, words, nx * sizeof(uint16_t));
        for (size_t i = 0; i < ny; i++) y2[i] = 1e30f;
        if (so)
            assert_int_equal(
                cf_conv_bf16_forward_from_kept_with(&g, o, packed, words, n, y2, scratch, &sc2),
                CF_OK);
        else
            assert_int_equal(cf_conv_bf16_forward_from_kept(&g, o, packed, words, n, y2, scratch),
                             CF_OK);
        if (memcmp(y1, y2, ny * sizeof(float)) != 0 || memcmp(sy1, sy2, nsy * sizeof(float)) != 0)
            fail_msg("from_kept %d -> %d %dx%d stride %d pad %d on %dx%d, shortcut %d (%s): not "
                     "bitwise forward_keep's",
                     c, o, k, k, s, pad, h, w, so, pass ? "without conv_cols" : "the level's");
    }
    cf_active_kernels = level;
    free(x), free(wt), free(sw), free(y1), free(y2), free(sy1), free(sy2), free(kept), free(words),
        free(packed), free(spacked), free(scratch);
}

static void check_from_kept(int n, int c, int h, int w, int o) {
    check_from_kept_pair(n, c, h, w, o, 3, 1, 1, 0);
}

static void test_from_kept(void **state) {
    (void)state;
    check_from_kept(9, 32, 14, 14, 32); /* cols */
    check_from_kept(9, 64, 7, 7, 64);
    check_from_kept(3, 16, 20, 20, 24); /* run_images */
    check_from_kept(2, 24, 9, 13, 40);  /* odd sizes */
    /* stride 2: W1's block 0.3 (28 x 28, 16 -> 32, its 1x1 shortcut) and block 1's, alone and
     * paired; 5 x 5 (pad 2: the phase planes' other
     * parities), wide rows (more than a vector of words) */
    check_from_kept_pair(6, 16, 28, 28, 32, 3, 2, 1, 0);
    check_from_kept_pair(6, 16, 28, 28, 32, 3, 2, 1, 32);
    check_from_kept_pair(5, 32, 14, 14, 64, 3, 2, 1, 64);
    check_from_kept_pair(3, 8, 26, 24, 16, 3, 2, 1, 16);
    check_from_kept_pair(3, 8, 12, 10, 16, 3, 2, 1, 16); /* compact: refused */
    check_from_kept_pair(2, 6, 18, 16, 10, 5, 2, 2, 0);
    check_from_kept_pair(2, 6, 18, 16, 10, 5, 2, 2, 8);
    check_from_kept_pair(2, 4, 10, 70, 8, 3, 2, 1, 8);
    /* refused: an odd number of channels */
    cf_conv_geom g;
    float y = 1.0f;
    assert_true(cf_conv_geom_init(&g, 15, 14, 14, 3, 3, 1, 1, 1, 1));
    assert_false(cf_conv_bf16_forward_from_kept_fits(&g, 32));
    assert_int_equal(cf_conv_bf16_forward_from_kept(&g, 32, NULL, NULL, 1, &y, NULL),
                     CF_ERR_INVALID);
    assert_true(cf_conv_geom_init(&g, 15, 14, 14, 3, 3, 2, 2, 1, 1));
    assert_false(cf_conv_bf16_forward_from_kept_fits(&g, 32));
    assert_int_equal(cf_conv_bf16_forward_from_kept_with(&g, 32, NULL, NULL, 1, &y, NULL, NULL),
                     CF_ERR_INVALID);
    assert_true(y == 1.0f);
}

int main(void) {
    printf("level %s, bf16 compute %d\n", cf_isa_name(cf_isa_active()), cf_bf16_compute());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_kept),
        cmocka_unit_test(test_linked_equals_unlinked),
        cmocka_unit_test(test_linked_equals_unlinked_threads),
        cmocka_unit_test(test_linked_sync),
        cmocka_unit_test(test_not_taken),
        cmocka_unit_test(test_block_not_taken),
        cmocka_unit_test(test_level_changed),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(hook_seen);
    return rc;
}
