/* bf16 packs and levels, and the layers kept in fp32 under mixed precision.
 *
 * A bf16 convolution's packed weights are in the order of the level that packed them (amx's tile
 * rows, avx512_bf16's blocks of 8 rows). Made at one level and read at the other they gave wrong
 * sums without any sign. Here: cf_conv_bf16_* refuse a pack of another level (CF_ERR_STATE naming
 * both levels) or of another layer, cf_conv_bf16_repack reorders it (bitwise a fresh pack's
 * results), and a model whose level changes between forward and backward (cf_set_isa from the
 * emulated amx level to avx512_bf16 and back) gives the input gradient and weight gradients a
 * backward at that level gives. The amx level is the scalar emulation of its tiles
 * (isa_amx_emul.c), so this runs on any CPU with AVX512_BF16 (skipped without).
 *
 * Then the stems: a Conv2d of fewer than 8 input channels stays fp32 under cf_conv_set_bf16
 * (bitwise the fp32 layer's output and gradients: W1's 1-channel 3x3 stem, W3's 3-channel 7x7
 * stride-2 one), one of 8 does not, and a bf16 fit of a small CNN with such a stem still trains. */
#include "oracle.h"

#include "corefit/nn.h"
#include "amx_emul.h"
#include "tensor/amx.h"
#include "tensor/kernel_table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
static cf_kernel_table emul_table;
static cf_bf16_kernels emul_bf16;

static bool has_avx512_bf16(void) {
    const cf_isa best = cf_isa_best();
    return best == CF_ISA_AVX512_BF16 || best == CF_ISA_AMX;
}

/* The emulated amx level (as amx_emul_main.c), made active. */
static void use_emulated_amx(void) {
    assert_true(cf_test_emulated_amx(&emul_table, &emul_bf16));
    cf_active_kernels = &emul_table;
    assert_non_null(cf_active_kernels->bf16->conv_order);
}

/* One layer's pack made at level `from` (0: emulated amx, 1: avx512_bf16) and read at the other:
 * refused, then repacked; dx then bitwise a fresh pack's at the reading level. */
static void check_stale_pack(int from, int n, int c, int h, int o, int k, int stride) {
    cf_conv_geom g;
    const int pad = k == 1 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, stride, stride, pad, pad));
    const size_t nx = (size_t)n * c * h * h, ny = (size_t)n * o * g.oh * g.ow,
                 nw = (size_t)o * c * k * k, np = cf_conv_bf16_packed_floats(&g, o);
    float *x = malloc(nx * sizeof(float)), *w = malloc(nw * sizeof(float)),
          *dy = malloc(ny * sizeof(float)), *pk = malloc(np * sizeof(float)),
          *fresh = malloc(np * sizeof(float)),
          *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float)),
          *dx = malloc(nx * sizeof(float)), *want = malloc(nx * sizeof(float)),
          *y = malloc(ny * sizeof(float)), *ywant = malloc(ny * sizeof(float));
    fill_uniform(x, nx, 41, -2, 2);
    fill_uniform(w, nw, 42, -1, 1);
    fill_uniform(dy, ny, 43, -1, 1);
    if (from == 0)
        use_emulated_amx();
    else
        cf_set_isa(CF_ISA_AVX512_BF16);
    cf_conv_bf16_pack(&g, o, w, pk);
    assert_true(cf_conv_bf16_pack_current(&g, o, pk));
    if (from == 0)
        cf_set_isa(CF_ISA_AVX512_BF16);
    else
        use_emulated_amx();
    const char *made = from == 0 ? "amx" : "avx512_bf16", *now = from == 0 ? "avx512_bf16" : "amx";
    assert_false(cf_conv_bf16_pack_current(&g, o, pk));
    for (size_t i = 0; i < nx; i++) dx[i] = 7.0f;
    assert_int_equal(cf_conv_bf16_dx(&g, o, pk, dy, n, dx, scratch), CF_ERR_STATE);
    char made_for[64], active[64];
    snprintf(made_for, sizeof made_for, "packed for the %s kernels", made);
    snprintf(active, sizeof active, "the active level is %s", now);
    if (!strstr(cf_last_error(), made_for) || !strstr(cf_last_error(), active))
        fail_msg("the error does not name both levels: %s", cf_last_error());
    for (size_t i = 0; i < nx; i++) assert_true(dx[i] == 7.0f); /* nothing computed */
    assert_int_equal(cf_conv_bf16_forward(&g, o, pk, x, n, y, scratch), CF_ERR_STATE);
    assert_int_equal(cf_conv_bf16_backward(&g, o, pk, dy, x, n, NULL, dx, scratch, NULL, NULL),
                     CF_ERR_STATE);
    /* repacked for the reading level: bitwise a pack made there */
    assert_int_equal(cf_conv_bf16_repack(&g, o, pk), CF_OK);
    assert_true(cf_conv_bf16_pack_current(&g, o, pk));
    cf_conv_bf16_pack(&g, o, w, fresh);
    assert_int_equal(cf_conv_bf16_dx(&g, o, pk, dy, n, dx, scratch), CF_OK);
    assert_int_equal(cf_conv_bf16_dx(&g, o, fresh, dy, n, want, scratch), CF_OK);
    assert_memory_equal(dx, want, nx * sizeof(float));
    assert_int_equal(cf_conv_bf16_forward(&g, o, pk, x, n, y, scratch), CF_OK);
    assert_int_equal(cf_conv_bf16_forward(&g, o, fresh, x, n, ywant, scratch), CF_OK);
    assert_memory_equal(y, ywant, ny * sizeof(float));
    /* a pack of another layer is refused, and not repacked */
    cf_conv_geom g2;
    assert_true(cf_conv_geom_init(&g2, c, h, h, k, k, stride, stride, pad, pad));
    const size_t nw2 = (size_t)(o + 2) * c * k * k;
    float *other = malloc(cf_conv_bf16_packed_floats(&g2, o + 2) * sizeof(float)),
          *w2 = malloc(nw2 * sizeof(float));
    fill_uniform(w2, nw2, 44, -1, 1);
    cf_conv_bf16_pack(&g2, o + 2, w2, other);
    assert_int_equal(cf_conv_bf16_dx(&g, o, other, dy, n, dx, scratch), CF_ERR_STATE);
    if (!strstr(cf_last_error(), "not made by cf_conv_bf16_pack for this layer"))
        fail_msg("another layer's pack: %s", cf_last_error());
    assert_int_equal(cf_conv_bf16_repack(&g, o, other), CF_ERR_STATE);
    free(other), free(w2);
    cf_set_isa(CF_ISA_AVX512_BF16);
    free(x), free(w), free(dy), free(pk), free(fresh), free(scratch), free(dx), free(want);
    free(y), free(ywant);
}

static void test_stale_pack(void **state) {
    (void)state;
    if (!has_avx512_bf16()) {
        print_message("no AVX512_BF16 on this CPU: the emulated amx level extends it\n");
        skip();
    }
    const cf_isa before = cf_isa_active();
    for (int from = 0; from < 2; from++) {
        check_stale_pack(from, 3, 16, 8, 24, 3, 1);
        check_stale_pack(from, 2, 12, 10, 20, 3, 2);
        check_stale_pack(from, 2, 16, 8, 32, 1, 2); /* the subsampled shortcut */
    }
    cf_set_isa(before);
}

/* A conv (8 -> 16) then a residual block whose convpath is a 3x3 stride-2 conv and idpath a 1x1
 * stride-2 one (the pair that shares x's conversions), no ReLU after: the block's input gradient
 * reads only dy and the packs, so the first conv's weight gradient and the model's input gradient
 * are bitwise those of a model run wholly at the backward's level; the block's own weight
 * gradients read the first conv's output, computed at the forward's level (close). */
typedef struct grads {
    float *dx, *dw[3];
    size_t nx, nw[3];
} grads;

static cf_model *level_model(void) {
    cf_module *conv = cf_conv2d(8, 16, 3, 1, 1, false);
    cf_module *block =
        cf_residual(cf_conv2d(16, 32, 3, 2, 1, false), cf_conv2d(16, 32, 1, 2, 0, false), false);
    cf_module *kids[] = {conv, block};
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(2, kids), 7), CF_OK);
    assert_int_equal(cf_conv_set_bf16(m->root, true), 3);
    return m;
}

/* Forward at level f, backward at level b (0: emulated amx, 1: avx512_bf16). */
static void run_levels(int f, int b, const float *x, const float *dy, grads *out) {
    cf_model *m = level_model();
    const int n = 4;
    cf_tensor xt = cf_tensor_view((float *)x, cf_shape4(n, 8, 12, 12));
    if (f == 0)
        use_emulated_amx();
    else
        cf_set_isa(CF_ISA_AVX512_BF16);
    const cf_tensor *y = NULL;
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_OK);
    assert_int_equal((int)cf_tensor_numel(y), n * 32 * 6 * 6);
    if (b == 0)
        use_emulated_amx();
    else
        cf_set_isa(CF_ISA_AVX512_BF16);
    cf_tensor dyt = cf_tensor_view((float *)dy, y->shape);
    const cf_tensor *dx = m->root->ops->backward(m->root, &dyt, true);
    assert_non_null(dx);
    out->nx = cf_tensor_numel(dx);
    out->dx = malloc(out->nx * sizeof(float));
    memcpy(out->dx, dx->data, out->nx * sizeof(float));
    int k = 0;
    for (int i = 0; i < m->n_params && k < 3; i++) {
        const cf_param *p = m->params[i];
        if (!p->grad) continue;
        out->nw[k] = p->numel;
        out->dw[k] = malloc(p->numel * sizeof(float));
        memcpy(out->dw[k], p->grad, p->numel * sizeof(float));
        k++;
    }
    assert_int_equal(k, 3);
    cf_set_isa(CF_ISA_AVX512_BF16);
    cf_model_free(m);
}

static void grads_free(grads *g) {
    free(g->dx);
    for (int i = 0; i < 3; i++) free(g->dw[i]);
}

static void test_level_between_passes(void **state) {
    (void)state;
    if (!has_avx512_bf16()) {
        print_message("no AVX512_BF16 on this CPU: the emulated amx level extends it\n");
        skip();
    }
    const cf_isa before = cf_isa_active();
    const size_t nx = 4 * 8 * 12 * 12, ny = 4 * 32 * 6 * 6;
    float *x = malloc(nx * sizeof(float)), *dy = malloc(ny * sizeof(float));
    fill_uniform(x, nx, 51, -2, 2);
    fill_uniform(dy, ny, 52, -1, 1);
    for (int b = 0; b < 2; b++) {
        grads want, got;
        run_levels(b, b, x, dy, &want);    /* both passes at the backward's level */
        run_levels(1 - b, b, x, dy, &got); /* the forward at the other */
        const char *name =
            b ? "amx forward, avx512_bf16 backward" : "avx512_bf16 forward, amx backward";
        char what[128];
        snprintf(what, sizeof what, "%s: input gradient", name);
        if (memcmp(got.dx, want.dx, nx * sizeof(float))) fail_msg("%s differs", what);
        /* the first conv's weight gradient reads the block's input gradient */
        snprintf(what, sizeof what, "%s: first conv's weight gradient", name);
        if (memcmp(got.dw[0], want.dw[0], want.nw[0] * sizeof(float))) fail_msg("%s differs", what);
        for (int i = 1; i < 3; i++) {
            snprintf(what, sizeof what, "%s: block weight gradient %d", name, i);
            assert_close(what, got.dw[i], want.dw[i], want.nw[i], 2e-2, 2e-2);
        }
        grads_free(&want), grads_free(&got);
    }
    free(x), free(dy);
    cf_set_isa(before);
}
#else
static void test_stale_pack(void **state) {
    (void)state;
    skip();
}
static void test_level_between_passes(void **state) {
    (void)state;
    skip();
}
#endif

/* A lone Conv2d (c -> o, k x k, stride s, padding k / 2) in bf16 mode against the same layer in
 * fp32: output, input gradient and weight gradient bitwise (or, with `same` false, not). */
static void check_stem(int c, int o, int k, int s, int hw, bool same) {
    const int n = 3;
    cf_model *m32 = NULL, *m16 = NULL;
    assert_int_equal(cf_model_new(&m32, cf_conv2d(c, o, k, s, k / 2, true), 3), CF_OK);
    assert_int_equal(cf_model_new(&m16, cf_conv2d(c, o, k, s, k / 2, true), 3), CF_OK);
    assert_int_equal(cf_conv_set_bf16(m16->root, true), 1);
    const size_t nx = (size_t)n * c * hw * hw;
    float *x = malloc(nx * sizeof(float));
    fill_uniform(x, nx, 61, -2, 2);
    cf_tensor xt = cf_tensor_view(x, cf_shape4(n, c, hw, hw));
    const cf_tensor *y32 = NULL, *y16 = NULL;
    assert_int_equal(cf_model_forward(m32, &xt, &y32), CF_OK);
    assert_int_equal(cf_model_forward(m16, &xt, &y16), CF_OK);
    const size_t ny = cf_tensor_numel(y32);
    float *dy = malloc(ny * sizeof(float));
    fill_uniform(dy, ny, 62, -1, 1);
    cf_tensor dyt = cf_tensor_view(dy, y32->shape);
    const cf_tensor *dx32 = m32->root->ops->backward(m32->root, &dyt, true);
    const cf_tensor *dx16 = m16->root->ops->backward(m16->root, &dyt, true);
    const cf_param *w32 = &m32->root->params[0], *w16 = &m16->root->params[0];
    const bool equal = memcmp(y32->data, y16->data, ny * sizeof(float)) == 0 &&
                       memcmp(dx32->data, dx16->data, nx * sizeof(float)) == 0 &&
                       memcmp(w32->grad, w16->grad, w32->numel * sizeof(float)) == 0 &&
                       memcmp(m32->root->params[1].grad, m16->root->params[1].grad,
                              (size_t)o * sizeof(float)) == 0;
    if (same && !equal)
        fail_msg("Conv2d(%d, %d, %d, stride %d) in bf16 mode is not bitwise fp32's", c, o, k, s);
    if (!same && equal && cf_bf16_compute())
        fail_msg("Conv2d(%d, %d, %d, stride %d) in bf16 mode gave fp32's results bitwise", c, o, k,
                 s);
    free(x), free(dy);
    cf_model_free(m32), cf_model_free(m16);
}

static void test_stem_fp32(void **state) {
    (void)state;
    print_message("kernels %s, bf16 compute %s\n", cf_isa_name(cf_isa_active()),
                  cf_bf16_compute() ? "yes" : "no");
    check_stem(1, 16, 3, 1, 28, true);  /* W1's stem */
    check_stem(3, 64, 7, 2, 32, true);  /* W3's */
    check_stem(7, 16, 3, 1, 12, true);  /* the last below the rule's 8 */
    check_stem(8, 16, 3, 1, 12, false); /* the first in bf16 */
}

/* A bf16 fit of a small CNN with a 1-channel stem on a learnable task (the class is the
 * brighter half of the image) still trains: the loss falls well below its start. */
static void test_bf16_fit_trains(void **state) {
    (void)state;
    const int n = 64, hw = 12;
    cf_module *kids[] = {
        cf_conv2d(1, 8, 3, 1, 1, false),  cf_batchnorm2d(8),  cf_relu(),
        cf_conv2d(8, 16, 3, 2, 1, false), cf_batchnorm2d(16), cf_relu(),
        cf_adaptive_avgpool2d(1, 1),      cf_flatten(),       cf_linear(16, 2, true)};
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(9, kids), 11), CF_OK);
    assert_int_equal(cf_conv_set_bf16(m->root, true), 2);
    cf_model_train(m, true);
    float *x = malloc((size_t)n * hw * hw * sizeof(float));
    int32_t *labels = malloc((size_t)n * sizeof(int32_t));
    fill_uniform(x, (size_t)n * hw * hw, 71, 0, 1);
    for (int i = 0; i < n; i++) {
        labels[i] = i % 2;
        for (int r = 0; r < hw; r++)
            for (int col = 0; col < hw; col++)
                if ((r < hw / 2) == (labels[i] == 1)) x[((size_t)i * hw + r) * hw + col] += 1.0f;
    }
    cf_tensor xt = cf_tensor_view(x, cf_shape4(n, 1, hw, hw));
    double first = 0, last = 0;
    const float lr = 0.2f;
    for (int step = 0; step < 30; step++) {
        const cf_tensor *y = NULL;
        assert_int_equal(cf_model_forward(m, &xt, &y), CF_OK);
        float dy[64 * 2];
        double loss = 0;
        for (int i = 0; i < n; i++) { /* softmax cross-entropy, mean over the batch */
            const float *z = y->data + 2 * i;
            const double mx = z[0] > z[1] ? z[0] : z[1], e0 = exp(z[0] - mx), e1 = exp(z[1] - mx),
                         p1 = e1 / (e0 + e1);
            loss -= log(labels[i] ? p1 : 1 - p1) / n;
            dy[2 * i] = (float)((1 - p1 - (labels[i] == 0)) / n);
            dy[2 * i + 1] = (float)((p1 - (labels[i] == 1)) / n);
        }
        if (step == 0) first = loss;
        last = loss;
        cf_tensor dyt = cf_tensor_view(dy, y->shape);
        cf_model_zero_grad(m);
        assert_int_equal(cf_model_backward(m, &dyt), CF_OK);
        for (int i = 0; i < m->n_params; i++) {
            cf_param *p = m->params[i];
            if (p->grad)
                for (size_t j = 0; j < p->numel; j++) p->data[j] -= lr * p->grad[j];
        }
    }
    print_message("bf16 fit: loss %.7f -> %.7f\n", first, last);
    if (!(last < 0.5 * first)) fail_msg("the bf16 fit did not train: loss %g -> %g", first, last);
    free(x), free(labels);
    cf_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_pack),
        cmocka_unit_test(test_level_between_passes),
        cmocka_unit_test(test_stem_fp32),
        cmocka_unit_test(test_bf16_fit_trains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
