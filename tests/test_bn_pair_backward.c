/* A residual block's two last BatchNorms backward in one (cf_nn_bn_backward_pair, src/nn/
 * batchnorm.c, called from src/nn/residual.c): where both are armed with the block's mask bits
 * for the same dy, one sums pass reads dy and the bits for both layers' planes and their dx
 * passes follow, channel block by channel block (one thread; with more the pair declines).
 * Bitwise each layer's own backward.
 *
 * The networks of test_res_mask_bits (W1's first block, W1, a stride-1 block, a block whose
 * idpath is a lone BatchNorm) run training steps and an eval forward with the pair
 * (cf__nn_set_bn_pair_backward(true), the default) and without: every output, input gradient,
 * gradient, buffer and weight equal (memcmp), in fp32 and bf16, on 1, 2 and 3 threads; the
 * BatchNorms that ran paired are counted at every backward (both of each block with a paired
 * shortcut at one thread, none elsewhere or on more threads, none with synchronised statistics,
 * without the mask bits, or with a hook on a path's last BatchNorm; at the generic level, whose
 * convolutions take no stride-2 pair, none). The arena's pool serves every block (no heap spill).
 * tests/bn_pair_backward.cmake runs this under every CF_ISA cap and over the amx emulation. */
#include "block_nets.h"
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "nn/nn_internal.h"

#define STEPS 3

typedef struct run_opts {
    bool pair, bf16, sync, no_bits;
    int hook; /* a wrapper on the first block's 1: convpath's, 2: idpath's last BatchNorm */
    int threads;
    int want; /* BatchNorms paired at each backward with the pair on */
} run_opts;

static const cf_module_ops *hook_orig;
static cf_module_ops hook_ops;
static const cf_tensor *hook_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    return hook_orig->backward(m, dy, need_dx);
}

static record run_case(const block_net *k, run_opts o) {
    cf_set_num_threads(o.threads);
    cf__nn_set_bn_pair_backward(o.pair);
    cf__nn_set_res_mask_bits(!o.no_bits);
    cf_model *model = block_model(block_net_build(k), 21, o.bf16, o.sync);
    const size_t nx = (size_t)k->n * k->c * k->h * k->w;
    float *x = malloc(nx * sizeof(float));
    record r = {0};
    cf_module *hooked = NULL;
    for (int step = 0; step <= STEPS; step++) {
        const bool training = step < STEPS;
        step_start(model, x, nx, 100 + (uint64_t)step, training);
        if (o.hook && step == 1) /* after the plan */
            hooked = hook_path_end(model->root, o.hook - 1, &hook_orig, &hook_ops, hook_backward);
        cf_tensor tx = cf_tensor_view(x, cf_shape4(k->n, k->c, k->h, k->w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        put(&r, y->data, cf_tensor_numel(y));
        if (!training) break;
        record_backward_step(&r, model, y, nx, step);
        const int got = count_modules(model->root, cf_nn_bn_paired);
        /* the portable level's convolutions take no stride-2 pair, whose branch of the block's
         * backward is the one that pairs the BatchNorms (residual.c): none paired there */
        const bool portable = !strcmp(cf_isa_name(cf_isa_active()), "generic");
        const int want =
            o.pair && !(hooked && step >= 1) && !portable && o.threads == 1 ? o.want : 0;
        if (got != want)
            fail_msg("%s (pair %d, bf16 %d, %d threads, sync %d, bits %d, hook %d) step %d: %d "
                     "BatchNorms ran paired, expected %d",
                     k->name, o.pair, o.bf16, o.threads, o.sync, !o.no_bits, o.hook, step, got,
                     want);
    }
    if (hooked) hooked->ops = hook_orig;
    assert_int_equal(model->arena.spills, 0);
    free(x);
    cf_model_free(model);
    cf__nn_set_bn_pair_backward(true);
    cf__nn_set_res_mask_bits(true);
    cf_set_num_threads(1);
    return r;
}

static void check_case(const block_net *k, run_opts o) {
    o.pair = true;
    record a = run_case(k, o);
    o.pair = false;
    record b = run_case(k, o);
    char name[160];
    snprintf(name, sizeof name, "%s (bf16 %d, hook %d, sync %d, bits %d, %d threads)", k->name,
             o.bf16, o.hook, o.sync, !o.no_bits, o.threads);
    records_equal(a, b, name, "paired", "each alone");
}

/* the last field: BatchNorms paired at each backward */
static const struct {
    block_net net;
    int paired;
} cases[] = {
    {{"W1's first block", BNET_BLOCK, 6, 16, 28, 28, 32, 1}, 2},
    {{"W1", BNET_W1, 4, 1, 28, 28, 0, 2}, 4},
    {{"W1's first block, 40 images 17 channels", BNET_BLOCK, 40, 16, 14, 14, 17, 1}, 2},
    {{"a stride-1 block 16ch 7x7", BNET_BLOCK_S1, 5, 16, 7, 7, 16, 1}, 0},
    {{"a block with a BatchNorm idpath 8ch 48x48", BNET_BLOCK_BN_ID, 2, 3, 48, 48, 8, 1}, 0},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static void test_pair_equal(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int t = 1; t <= 3; t++)
                check_case(&cases[i].net,
                           (run_opts){.bf16 = bf16, .threads = t, .want = cases[i].paired});
}

/* Where the pair declines: synchronised statistics, no mask bits, a hooked last BatchNorm. */
static void test_pair_declines(void **state) {
    (void)state;
    check_case(&cases[0].net, (run_opts){.bf16 = true, .sync = true, .threads = 1});
    check_case(&cases[1].net, (run_opts){.bf16 = true, .sync = true, .threads = 2});
    check_case(&cases[0].net, (run_opts){.bf16 = true, .no_bits = true, .threads = 1});
    check_case(&cases[1].net, (run_opts){.no_bits = true, .threads = 2});
    check_case(&cases[0].net, (run_opts){.bf16 = true, .hook = 1, .threads = 1, .want = 2});
    check_case(&cases[0].net, (run_opts){.hook = 2, .threads = 2, .want = 2});
}

int main(void) {
    printf("level %s, bf16 compute %d\n", cf_isa_name(cf_isa_active()), cf_bf16_compute());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pair_equal),
        cmocka_unit_test(test_pair_declines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
