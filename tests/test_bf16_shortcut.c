/* The 1x1 stride-2 shortcut in bf16 (conv_bf16.c's subsampled layout): cf_conv_bf16_dx_add adds
 * exactly the input gradient cf_conv_bf16_dx writes (zero off the even rows' even columns) and
 * refuses any other geometry; the shortcut paired with a stride-2 layer on the same input
 * (cf_conv_bf16_*_with) gives its own calls' results; cf_conv_bf16_backward is bitwise the
 * separate weight-gradient and dx calls; and a residual block whose idpath is such a
 * shortcut (the input gradient added into the convpath's, the pairing of the two convolutions)
 * gives the output, input gradient and weight gradients of its two convolutions run alone. Its
 * values against PyTorch are test_bf16's (conv cases of the shortcut shapes). Without bf16 kernels
 * (CF_ISA below avx512_bf16) the layout is unsupported and the block runs fp32. */
#include "oracle.h"

#include "corefit/nn.h"

#include <stdio.h>
#include <string.h>

/* dx_add against dx on a shortcut of c -> o channels on h x w images (n of them). */
static void check_dx_add(int n, int c, int h, int w, int o) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, 1, 1, 2, 2, 0, 0));
    if (!cf_conv_bf16_supported(&g, o)) {
        assert_false(cf_bf16_compute()); /* only a table without bf16 kernels refuses it */
        return;
    }
    const size_t nw = (size_t)o * c, nx = (size_t)n * c * h * w, ny = (size_t)n * o * g.oh * g.ow;
    float *wt = malloc(nw * sizeof(float)), *dy = malloc(ny * sizeof(float));
    float *base = malloc(nx * sizeof(float)), *dx = malloc(nx * sizeof(float)),
          *sum = malloc(nx * sizeof(float));
    float *packed = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float));
    float *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float));
    fill_uniform(wt, nw, 1, -1, 1);
    fill_uniform(dy, ny, 2, -1, 1);
    fill_uniform(base, nx, 3, -1, 1);
    cf_conv_bf16_pack(&g, o, wt, packed);
    for (size_t i = 0; i < nx; i++) dx[i] = 1e30f; /* overwritten everywhere */
    cf_conv_bf16_dx(&g, o, packed, dy, n, dx, scratch);
    memcpy(sum, base, nx * sizeof(float));
    assert_true(cf_conv_bf16_dx_add(&g, o, packed, dy, n, sum, scratch));
    double largest = 0;
    for (int im = 0; im < n; im++)
        for (int ch = 0; ch < c; ch++)
            for (int i = 0; i < h; i++)
                for (int j = 0; j < w; j++) {
                    const size_t at = (((size_t)im * c + ch) * h + i) * w + j;
                    if (i % 2 || j % 2) {
                        if (dx[at] != 0.0f)
                            fail_msg("%dx%d: dx[%d][%d][%d][%d] = %g off the sampled positions", h,
                                     w, im, ch, i, j, (double)dx[at]);
                    } else if (fabs(dx[at]) > largest)
                        largest = fabs(dx[at]);
                    if (sum[at] != base[at] + dx[at])
                        fail_msg("%dx%d: dx_add at [%d][%d][%d][%d] gave %.9g, base + dx is %.9g",
                                 h, w, im, ch, i, j, (double)sum[at], (double)(base[at] + dx[at]));
                }
    assert_true(largest > 0.1); /* the sampled positions hold the product */
    /* any other geometry: false, dx untouched */
    cf_conv_geom g3;
    assert_true(cf_conv_geom_init(&g3, c, h, w, 3, 3, 2, 2, 1, 1));
    memcpy(sum, base, nx * sizeof(float));
    assert_false(cf_conv_bf16_dx_add(&g3, o, packed, dy, n, sum, scratch));
    assert_memory_equal(sum, base, nx * sizeof(float));
    free(wt), free(dy), free(base), free(dx), free(sum), free(packed), free(scratch);
}

static void test_dx_add(void **state) {
    (void)state;
    check_dx_add(3, 16, 28, 28, 32); /* W1's shortcuts */
    check_dx_add(2, 32, 14, 14, 64);
    check_dx_add(2, 9, 11, 13, 10); /* odd sizes, a half channel pair */
}

/* cf_conv_bf16_*_with: a k x k stride-2 layer (c -> o) and a 1x1 stride-2 shortcut (c -> os) on
 * the same n images, in the layer's scratch alone, against the two layers' own calls: the
 * outputs and the summed input gradient bitwise, the layer's weight gradient bitwise, the
 * shortcut's to fp32 rounding (its products summed in other blocks). */
static void check_pair(int n, int c, int h, int w, int o, int os, int k) {
    cf_conv_geom g, gs;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, 2, 2, (k - 1) / 2, (k - 1) / 2));
    assert_true(cf_conv_geom_init(&gs, c, h, w, 1, 1, 2, 2, 0, 0));
    if (!cf_conv_bf16_pair_fits(&g, o, &gs, os)) {
        assert_false(cf_bf16_compute()); /* only a table without bf16 kernels refuses it */
        return;
    }
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * o * g.oh * g.ow,
                 nys = (size_t)n * os * g.oh * g.ow, nw = (size_t)o * c * k * k,
                 nws = (size_t)os * c;
    float *x = malloc(nx * sizeof(float)), *wt = malloc(nw * sizeof(float)),
          *ws = malloc(nws * sizeof(float)), *dy = malloc(ny * sizeof(float)),
          *dys = malloc(nys * sizeof(float));
    fill_uniform(x, nx, 21, -2, 2);
    fill_uniform(wt, nw, 22, -1, 1);
    fill_uniform(ws, nws, 23, -1, 1);
    fill_uniform(dy, ny, 24, -1, 1);
    fill_uniform(dys, nys, 25, -1, 1);
    float *pk = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float)),
          *pks = malloc(cf_conv_bf16_packed_floats(&gs, os) * sizeof(float));
    cf_conv_bf16_pack(&g, o, wt, pk);
    cf_conv_bf16_pack(&gs, os, ws, pks);
    const size_t sl = cf_conv_bf16_scratch(&g, o), ss = cf_conv_bf16_scratch(&gs, os);
    float *scratch = malloc(sl * sizeof(float)), *scratch_s = malloc(ss * sizeof(float));
    /* alone */
    float *y = malloc(ny * sizeof(float)), *ys = malloc(nys * sizeof(float)),
          *dx = malloc(nx * sizeof(float)), *dw = malloc(nw * sizeof(float)),
          *dws = malloc(nws * sizeof(float));
    cf_conv_bf16_forward(&g, o, pk, x, n, y, scratch);
    cf_conv_bf16_forward(&gs, os, pks, x, n, ys, scratch_s);
    cf_conv_bf16_dx(&g, o, pk, dy, n, dx, scratch);
    assert_true(cf_conv_bf16_dx_add(&gs, os, pks, dys, n, dx, scratch_s));
    cf_conv_bf16_wgrad(&g, o, dy, x, n, dw, scratch);
    cf_conv_bf16_wgrad(&gs, os, dys, x, n, dws, scratch_s);
    /* paired */
    float *y2 = malloc(ny * sizeof(float)), *ys2 = malloc(nys * sizeof(float)),
          *dx2 = malloc(nx * sizeof(float)), *dw2 = malloc(nw * sizeof(float)),
          *dws2 = malloc(nws * sizeof(float));
    for (size_t i = 0; i < nx; i++) dx2[i] = 1e30f; /* overwritten everywhere */
    for (size_t i = 0; i < nws; i++) dws2[i] = 1e30f;
    cf_conv_shortcut sc = {.out_channels = os, .w = pks, .y = ys2};
    cf_conv_bf16_forward_with(&g, o, pk, x, n, y2, scratch, &sc);
    sc = (cf_conv_shortcut){.out_channels = os, .w = pks, .dy = dys};
    cf_conv_bf16_dx_with(&g, o, pk, dy, n, dx2, scratch, &sc);
    sc = (cf_conv_shortcut){.out_channels = os, .dy = dys, .dw = dws2};
    cf_conv_bf16_wgrad_with(&g, o, dy, x, n, dw2, scratch, &sc);
    char what[96];
    snprintf(what, sizeof what, "pair %dx%d %d->%d, %d on %dx%d", k, k, c, o, os, h, w);
    if (memcmp(y, y2, ny * sizeof(float))) fail_msg("%s: y differs", what);
    if (memcmp(ys, ys2, nys * sizeof(float))) fail_msg("%s: shortcut y differs", what);
    if (memcmp(dx, dx2, nx * sizeof(float))) fail_msg("%s: dx differs", what);
    if (memcmp(dw, dw2, nw * sizeof(float))) fail_msg("%s: dW differs", what);
    assert_close(what, dws2, dws, nws, 1e-5, 1e-5);
    /* the backward in one call: bitwise the paired calls */
    float *dx3 = malloc(nx * sizeof(float)), *dw3 = malloc(nw * sizeof(float)),
          *dws3 = malloc(nws * sizeof(float));
    const cf_conv_shortcut sdw = {.out_channels = os, .dy = dys, .dw = dws3},
                           sdx = {.out_channels = os, .w = pks, .dy = dys};
    cf_conv_bf16_backward(&g, o, pk, dy, x, n, dw3, dx3, scratch, &sdw, &sdx);
    if (memcmp(dx3, dx2, nx * sizeof(float))) fail_msg("%s: backward's dx differs", what);
    if (memcmp(dw3, dw2, nw * sizeof(float))) fail_msg("%s: backward's dW differs", what);
    if (memcmp(dws3, dws2, nws * sizeof(float)))
        fail_msg("%s: backward's shortcut dW differs", what);
    free(dx3), free(dw3), free(dws3);
    free(x), free(wt), free(ws), free(dy), free(dys), free(pk), free(pks), free(scratch);
    free(scratch_s), free(y), free(ys), free(dx), free(dw), free(dws), free(y2), free(ys2);
    free(dx2), free(dw2), free(dws2);
}

static void test_pair_kernels(void **state) {
    (void)state;
    check_pair(3, 16, 28, 28, 32, 32, 3);  /* W1's blocks */
    check_pair(5, 32, 14, 14, 64, 64, 3);  /* several blocks of images in the weight gradient */
    check_pair(3, 24, 10, 8, 16, 20, 3);   /* the shortcut wider than the layer, half pairs */
    check_pair(7, 128, 8, 8, 128, 128, 3); /* compact: the shortcut from the gathered taps */
    check_pair(3, 130, 6, 6, 136, 128, 3);
    check_pair(2, 9, 12, 14, 10, 7, 5); /* padding 2: the shortcut's phase and shift move */
    check_pair(3, 11, 10, 6, 13, 9, 3); /* odd layer and shortcut: both last pairs half zero */
    /* what does not pair: a stride-1 layer, other input sizes, a shortcut too wide */
    cf_conv_geom g1, g2, gs, gs2;
    assert_true(cf_conv_geom_init(&g1, 16, 28, 28, 3, 3, 1, 1, 1, 1));
    assert_true(cf_conv_geom_init(&g2, 16, 28, 28, 3, 3, 2, 2, 1, 1));
    assert_true(cf_conv_geom_init(&gs, 16, 28, 28, 1, 1, 2, 2, 0, 0));
    assert_true(cf_conv_geom_init(&gs2, 16, 26, 26, 1, 1, 2, 2, 0, 0));
    assert_false(cf_conv_bf16_pair_fits(&g1, 32, &gs, 32));
    assert_false(cf_conv_bf16_pair_fits(&g2, 32, &gs2, 32));
    assert_false(cf_conv_bf16_pair_fits(&g2, 32, &gs, 33));
    assert_false(cf_conv_bf16_pair_fits(&gs, 32, &gs, 32));
}

/* cf_conv_bf16_backward of one layer (k x k, stride s, or the 1x1 stride-2 shortcut: k = 1)
 * against cf_conv_bf16_wgrad and cf_conv_bf16_dx: bitwise; and dW alone, dx alone. */
static void check_backward(int n, int c, int h, int w, int o, int k, int stride) {
    cf_conv_geom g;
    const int pad = k == 1 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, stride, stride, pad, pad));
    if (!cf_conv_bf16_supported(&g, o)) {
        assert_false(cf_bf16_compute());
        return;
    }
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * o * g.oh * g.ow,
                 nw = (size_t)o * c * k * k;
    float *x = malloc(nx * sizeof(float)), *wt = malloc(nw * sizeof(float)),
          *dy = malloc(ny * sizeof(float));
    fill_uniform(x, nx, 31, -2, 2);
    fill_uniform(wt, nw, 32, -1, 1);
    fill_uniform(dy, ny, 33, -1, 1);
    float *pk = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float)),
          *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float));
    cf_conv_bf16_pack(&g, o, wt, pk);
    float *dx = malloc(nx * sizeof(float)), *dw = malloc(nw * sizeof(float)),
          *dx2 = malloc(nx * sizeof(float)), *dw2 = malloc(nw * sizeof(float));
    cf_conv_bf16_wgrad(&g, o, dy, x, n, dw, scratch);
    cf_conv_bf16_dx(&g, o, pk, dy, n, dx, scratch);
    char what[96];
    snprintf(what, sizeof what, "backward %dx%d/%d %d->%d on %dx%d, %d images", k, k, stride, c, o,
             h, w, n);
    cf_conv_bf16_backward(&g, o, pk, dy, x, n, dw2, dx2, scratch, NULL, NULL);
    if (memcmp(dx, dx2, nx * sizeof(float))) fail_msg("%s: dx differs", what);
    if (memcmp(dw, dw2, nw * sizeof(float))) fail_msg("%s: dW differs", what);
    memset(dx2, 0, nx * sizeof(float));
    cf_conv_bf16_backward(&g, o, pk, dy, x, n, NULL, dx2, scratch, NULL, NULL);
    if (memcmp(dx, dx2, nx * sizeof(float))) fail_msg("%s: dx alone differs", what);
    memset(dw2, 0, nw * sizeof(float));
    cf_conv_bf16_backward(&g, o, pk, dy, x, n, dw2, NULL, scratch, NULL, NULL);
    if (memcmp(dw, dw2, nw * sizeof(float))) fail_msg("%s: dW alone differs", what);
    free(x), free(wt), free(dy), free(pk), free(scratch), free(dx), free(dw), free(dx2), free(dw2);
}

static void test_backward(void **state) {
    (void)state;
    check_backward(9, 32, 14, 14, 32, 3, 1); /* W1's 3x3 layers: several blocks, one partial */
    check_backward(17, 64, 7, 7, 64, 3, 1);
    check_backward(5, 16, 28, 28, 32, 3, 2);
    check_backward(5, 16, 28, 28, 32, 1, 2); /* a shortcut alone */
    check_backward(3, 9, 11, 13, 10, 5, 1);  /* 5x5, odd sizes, half pairs */
    check_backward(11, 10, 9, 9, 11, 3, 1);  /* odd outputs: dx's last pair from a zero row */
    check_backward(9, 128, 4, 4, 136, 3, 1); /* small planes (compact): partial blocks */
    check_backward(7, 130, 8, 8, 128, 3, 2);
    check_backward(3, 128, 6, 6, 129, 3, 2); /* odd output planes */
    /* edge shapes of the weight gradient's dy rows taken for dx: odd channels at stride 2
     * (the last pair's high half from the zero row past the channels), one-pixel and 2 x 2
     * images, 5x5 on planes smaller than the kernel */
    check_backward(4, 5, 10, 12, 7, 3, 2);
    check_backward(3, 4, 1, 1, 5, 3, 1);
    check_backward(3, 3, 2, 2, 5, 3, 2);
    check_backward(70, 3, 1, 1, 3, 3, 1); /* many blocks of one-pixel images, one partial */
    check_backward(2, 5, 3, 2, 3, 5, 1);
}

/* The forward and backward of model on x (n, c, h, w) with dy of its output's shape. */
static const cf_tensor *run(cf_model *model, float *x, int n, int c, int h, int w, const float *dy,
                            float **y_out) {
    cf_model_train(model, true);
    cf_model_zero_grad(model);
    cf_tensor tx = cf_tensor_view(x, cf_shape4(n, c, h, w));
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    *y_out = malloc(cf_shape_numel(&y->shape) * sizeof(float));
    memcpy(*y_out, y->data, cf_shape_numel(&y->shape) * sizeof(float));
    cf_tensor tdy = cf_tensor_view((float *)dy, y->shape);
    const cf_tensor *dx = model->root->ops->backward(model->root, &tdy, true);
    assert_non_null(dx);
    return dx;
}

static void check_block(int n, int c, int h, int w, int o) {
    cf_model *block, *conv3, *conv1;
    assert_int_equal(cf_model_new(&block,
                                  cf_residual(cf_conv2d(c, o, 3, 2, 1, false),
                                              cf_conv2d(c, o, 1, 2, 0, false), false),
                                  5),
                     CF_OK);
    assert_int_equal(cf_model_new(&conv3, cf_conv2d(c, o, 3, 2, 1, false), 6), CF_OK);
    assert_int_equal(cf_model_new(&conv1, cf_conv2d(c, o, 1, 2, 0, false), 7), CF_OK);
    cf_param *bw3 = cf_model_param(block, "convpath.weight"),
             *bw1 = cf_model_param(block, "idpath.weight");
    cf_param *w3 = cf_model_param(conv3, "weight"), *w1 = cf_model_param(conv1, "weight");
    assert_non_null(bw3), assert_non_null(bw1), assert_non_null(w3), assert_non_null(w1);
    memcpy(w3->data, bw3->data, w3->numel * sizeof(float));
    memcpy(w1->data, bw1->data, w1->numel * sizeof(float));
    assert_int_equal(cf_conv_set_bf16(block->root, true), 2);
    assert_int_equal(cf_conv_set_bf16(conv3->root, true), 1);
    assert_int_equal(cf_conv_set_bf16(conv1->root, true), 1);
    const int oh = (h - 1) / 2 + 1, ow = (w - 1) / 2 + 1;
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * o * oh * ow;
    float *x = malloc(nx * sizeof(float)), *dy = malloc(ny * sizeof(float));
    fill_uniform(x, nx, 11, -2, 2);
    fill_uniform(dy, ny, 12, -1, 1);
    float *yb, *y3, *y1;
    const cf_tensor *dxb = run(block, x, n, c, h, w, dy, &yb);
    const cf_tensor *dx3 = run(conv3, x, n, c, h, w, dy, &y3);
    const cf_tensor *dx1 = run(conv1, x, n, c, h, w, dy, &y1);
    float *ys = malloc(ny * sizeof(float)), *dxs = malloc(nx * sizeof(float));
    for (size_t i = 0; i < ny; i++) ys[i] = y3[i] + y1[i];
    for (size_t i = 0; i < nx; i++) dxs[i] = dx3->data[i] + dx1->data[i];
    char what[64];
    snprintf(what, sizeof what, "block %d->%d on %dx%d: y", c, o, h, w);
    assert_close(what, yb, ys, ny, 1e-6, 1e-6);
    snprintf(what, sizeof what, "block %d->%d on %dx%d: dx", c, o, h, w);
    assert_close(what, dxb->data, dxs, nx, 1e-6, 1e-6);
    snprintf(what, sizeof what, "block %d->%d on %dx%d: convpath dW", c, o, h, w);
    assert_close(what, bw3->grad, w3->grad, w3->numel, 1e-5, 1e-5);
    snprintf(what, sizeof what, "block %d->%d on %dx%d: shortcut dW", c, o, h, w);
    assert_close(what, bw1->grad, w1->grad, w1->numel, 1e-5, 1e-5);
    if (cf_bf16_compute()) { /* the shortcut alone, in bf16: not its fp32 weight gradient */
        cf_model *fp32;
        assert_int_equal(cf_model_new(&fp32, cf_conv2d(c, o, 1, 2, 0, false), 7), CF_OK);
        cf_param *wf = cf_model_param(fp32, "weight");
        memcpy(wf->data, w1->data, wf->numel * sizeof(float));
        float *yf;
        run(fp32, x, n, c, h, w, dy, &yf);
        double worst = 0, largest = 0;
        for (size_t i = 0; i < wf->numel; i++) {
            worst = fmax(worst, fabs(wf->grad[i] - w1->grad[i]));
            largest = fmax(largest, fabs(wf->grad[i]));
        }
        if (worst < 1e-4 * largest)
            fail_msg("shortcut %d->%d: dW within %.3g of fp32's: not computed in bf16", c, o,
                     worst);
        free(yf);
        cf_model_free(fp32);
    }
    free(x), free(dy), free(yb), free(y3), free(y1), free(ys), free(dxs);
    cf_model_free(block), cf_model_free(conv3), cf_model_free(conv1);
}

static void test_block(void **state) {
    (void)state;
    check_block(3, 16, 28, 28, 32); /* W1's first block */
    check_block(2, 32, 14, 14, 64); /* and its second */
    check_block(3, 24, 10, 8, 20);  /* small images, channels not a multiple of 16 */
    check_block(3, 24, 6, 10, 23);  /* odd channels: the shortcut's last pair from a zero row */
    check_block(2, 16, 2, 2, 17);   /* 2 x 2 images to one pixel */
}

/* The same on two threads (each takes part of the batch: its images' input gradient added by
 * that thread, its weight gradient summed into its partial sums). */
static void test_block_threads(void **state) {
    (void)state;
    cf_set_num_threads(2);
    check_block(5, 16, 28, 28, 32);
    check_block(3, 32, 14, 14, 64);
    cf_set_num_threads(1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dx_add),        cmocka_unit_test(test_pair_kernels),
        cmocka_unit_test(test_backward),      cmocka_unit_test(test_block),
        cmocka_unit_test(test_block_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
