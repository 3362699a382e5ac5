/* x's bf16 words kept by the forward for the backward's weight gradient
 * (cf_conv_bf16_forward_keep, cf_conv_bf16_backward_kept; the level's rows_h and deal_h copy them
 * into the weight gradient's rows): bitwise the same results as the paths that read x in fp32.
 *
 * - the kernels: rows_h and deal_h of bf16(x) against rows and deal of x (the same words, nothing
 *   written outside the rows), the level's from_fp32 and keep_words (streaming stores) against
 *   PyTorch's rounding in scalar C, on special values (subnormals, NaNs, infinities, ties), every
 *   tail length and every offset in a line;
 * - whole layers (W1's, odd shapes, a paired shortcut, a compact layer and the 1x1 stride-2 one
 *   alone, which keep nothing): the kept forward's y (and the shortcut's) bitwise the forward's
 *   and its words bitwise bf16(x); the kept backward bitwise cf_conv_bf16_backward with x in
 *   fp32. Where the weight gradient reads the kept words (a counting table shows rows_h / deal_h
 *   ran), the kept backward is given an x of NaNs: a read of fp32 x would show in dW;
 * - Conv2d layers in bf16 on 1, 2 and 3 threads: the gradients bitwise those of a table without
 *   the copies (x read in fp32), the copies called in a training step and not after an eval
 *   forward.
 * At avx512_bf16 and over the amx emulation (which inherits the copies); below avx512_bf16 there
 * is no bf16 convolution and nothing to compare. */
#include "bf16_layer_fixture.h"
#include "oracle.h"

#include "corefit/nn.h"
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static const cf_kernel_table *active;
static cf_kernel_table plain, counting;
static cf_bf16_kernels plain_bf16, counting_bf16;
static atomic_int kept_calls;

static void count_rows_h(const uint16_t *x, int h, int w, uint16_t *y, size_t ldy) {
    atomic_fetch_add(&kept_calls, 1);
    active->bf16->rows_h(x, h, w, y, ldy);
}

static void count_deal_h(const uint16_t *x, size_t ldx, int h, int n, uint16_t *e, uint16_t *o,
                         size_t ld) {
    atomic_fetch_add(&kept_calls, 1);
    active->bf16->deal_h(x, ldx, h, n, e, o, ld);
}

static void count_deal2_kept(const uint16_t *x, int h, int w, uint16_t *e0, uint16_t *o0,
                             uint16_t *e1, uint16_t *o1, size_t ld) {
    atomic_fetch_add(&kept_calls, 1);
    active->bf16->deal2_h(x, h, w, e0, o0, e1, o1, ld);
}

/* The active table's copies: plain without the copies, counting with them wrapped. False where
 * the level has no bf16 convolution. */
static bool make_tables(void) {
    if (!bf16_tables_copy(&active, &plain, &counting, &plain_bf16, &counting_bf16)) return false;
    const cf_bf16_kernels *k = active->bf16;
    assert_non_null(k->rows_h);
    assert_non_null(k->deal_h);
    plain_bf16.rows_h = NULL;
    plain_bf16.deal_h = NULL;
    counting_bf16.rows_h = count_rows_h;
    counting_bf16.deal_h = count_deal_h;
    if (k->deal2_h) counting_bf16.deal2_h = count_deal2_kept; /* the kept words' stride-2 copy */
    return true;
}

/* PyTorch's round_to_nearest_even (c10/util/BFloat16.h), a NaN made quiet. */
static uint16_t bf16_ref(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if (x != x) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* from_fp32 on every length up to 100 from every offset up to 3, on special values: PyTorch's
 * words, and none written past n. */
static void test_from_fp32(void **state) {
    (void)state;
    if (!make_tables()) return;
    enum { N = 104 };
    static float x[N];
    static uint16_t y[N + 8];
    fill_bf16_specials(x, N, 71);
    for (int off = 0; off < 4; off++)
        for (int n = 1; off + n <= 100; n++) {
            memset(y, 0xa5, sizeof y);
            active->bf16->from_fp32(x + off, y, (size_t)n);
            for (int i = 0; i < n; i++)
                if (y[i] != bf16_ref(x[off + i]))
                    fail_msg("from_fp32 of %d from %d: [%d] = %04x, PyTorch's %04x (x %a)", n, off,
                             i, y[i], bf16_ref(x[off + i]), (double)x[off + i]);
            for (int i = n; i < N + 8; i++)
                if (y[i] != 0xa5a5) fail_msg("from_fp32 of %d from %d wrote [%d]", n, off, i);
        }
}

/* keep_words (where the level has it: streaming stores of whole lines) writes from_fp32's
 * words for every length up to 130 into every 2-byte offset of a line (a head before the first
 * whole line, whole lines, a tail), and none outside them. */
static void test_keep_words(void **state) {
    (void)state;
    if (!make_tables()) return;
    const cf_bf16_kernels *k = active->bf16;
    if (!k->keep_words) {
        printf("level %s: no keep_words (from_fp32 keeps the words)\n", cf_isa_name(active->isa));
        return;
    }
    enum { N = 136 };
    static float x[N];
    _Alignas(64) static uint16_t y[N + 64];
    fill_bf16_specials(x, N, 73);
    for (int at = 0; at < 32; at++)
        for (int n = 1; n <= 130; n++) {
            memset(y, 0xa5, sizeof y);
            k->keep_words(x + 1, y + at, (size_t)n);
            for (int i = 0; i < N + 64; i++) {
                const bool in = i >= at && i < at + n;
                const uint16_t want = in ? bf16_ref(x[1 + i - at]) : 0xa5a5;
                if (y[i] != want)
                    fail_msg("keep_words of %d at offset %d: [%d] = %04x, want %04x", n, at, i,
                             y[i], want);
            }
        }
}

/* rows_h and deal_h of bf16(x) write rows' and deal's words of x (bitwise; no word outside the
 * rows: the rest keeps its fill) for rows of every width up to 70 (rows_h's own loop for rows of
 * at most 32 on and off), 1 to 5 rows, deal with and without o, on rows with special values and
 * rows of ordinary ones. */
static void test_copies(void **state) {
    (void)state;
    if (!make_tables()) return;
    const cf_bf16_kernels *k = active->bf16;
    enum { H = 5, W = 70, LD = 80, LDX = 2 * W + 3 };
    static float x[H * LDX];
    static uint16_t xh[H * LDX], a[H * LD], b[H * LD], ao[H * LD], bo[H * LD];
    fill_bf16_specials(x, H * LDX, 61);
    for (int i = 1; i < H; i += 2) fill_uniform(x + i * LDX, LDX, 62 + (unsigned)i, -1, 1);
    for (size_t i = 0; i < H * LDX; i++) xh[i] = bf16_ref(x[i]);
    for (int h = 1; h <= H; h++)
        for (int w = 1; w <= W; w++) {
            memset(a, 0xa5, sizeof a);
            k->rows(x, h, w, a, LD);
            for (int own = 0; own < 2; own++) { /* short rows' own loop off and on */
                cf__bf16_set_words_loops(own == 1);
                memset(b, 0xa5, sizeof b);
                const unsigned long before = cf__bf16_words_loops_calls();
                k->rows_h(xh, h, w, b, LD);
                const bool took = cf__bf16_words_loops_calls() != before;
                if (took != (own == 1 && w <= 32))
                    fail_msg("rows_h: %d rows of %d took the short rows' loop %d (on %d)", h, w,
                             took, own);
                if (memcmp(a, b, sizeof a) != 0)
                    fail_msg("rows_h: %d rows of %d differ from rows' (short rows' loop %d)", h, w,
                             own);
            }
            for (int with_o = 0; with_o < 2; with_o++) {
                memset(a, 0xa5, sizeof a);
                memset(b, 0xa5, sizeof b);
                memset(ao, 0x5a, sizeof ao);
                memset(bo, 0x5a, sizeof bo);
                k->deal(x + 1, LDX, h, w, a, with_o ? ao : NULL, LD);
                k->deal_h(xh + 1, LDX, h, w, b, with_o ? bo : NULL, LD);
                if (memcmp(a, b, sizeof a) != 0 || memcmp(ao, bo, sizeof ao) != 0)
                    fail_msg("deal_h: %d rows of %d (o %d) differ from deal's", h, w, with_o);
            }
        }
}

static void same_bits(const float *a, const float *b, size_t n, const char *what, const char *of) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("%s: %s[%zu] %.9g, from fp32 x %.9g", what, of, i, (double)a[i], (double)b[i]);
}

/* One layer (k x k, stride s, pad (k - 1) / 2, or the 1x1 stride-2 one alone: k = 1; a paired
 * shortcut of so outputs where so > 0), n images: forward and forward_keep, backward with x and
 * backward_kept with the kept words (and x all NaN where the copies run). */
static void check_layer(int n, int c, int h, int w, int o, int k, int stride, int so) {
    cf_conv_geom g, sg;
    const int pad = k == 1 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, stride, stride, pad, pad));
    assert_true(cf_conv_bf16_supported(&g, o));
    if (so) {
        assert_true(cf_conv_geom_init(&sg, c, h, w, 1, 1, 2, 2, 0, 0));
        assert_true(cf_conv_bf16_pair_fits(&g, o, &sg, so));
    }
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * o * g.oh * g.ow,
                 nw = (size_t)o * c * k * k, nsy = (size_t)n * so * g.oh * g.ow,
                 nsw = (size_t)so * c + 1;
    float *x = malloc(nx * 4), *xnan = malloc(nx * 4), *wt = malloc(nw * 4), *dy = malloc(ny * 4),
          *sw = malloc(nsw * 4), *sdy = malloc((nsy + 1) * 4);
    uint16_t *xk = malloc((nx + 1) * 2);
    fill_uniform(x, nx, 91, -2, 2);
    for (size_t i = 0; i < nx; i++) xnan[i] = NAN;
    fill_uniform(wt, nw, 92, -1, 1);
    fill_uniform(dy, ny, 93, -1, 1);
    fill_uniform(sw, nsw, 94, -1, 1);
    fill_uniform(sdy, nsy + 1, 95, -1, 1);
    float *pk = malloc(cf_conv_bf16_packed_floats(&g, o) * 4),
          *spk = so ? malloc(cf_conv_bf16_packed_floats(&sg, so) * 4) : NULL,
          *scratch = malloc(cf_conv_bf16_scratch(&g, o) * 4);
    cf_active_kernels = &counting;
    cf_conv_bf16_pack(&g, o, wt, pk);
    if (so) cf_conv_bf16_pack(&sg, so, sw, spk);
    char what[112];
    snprintf(what, sizeof what, "%dx%d/%d %d->%d (shortcut %d) on %dx%d, %d images", k, k, stride,
             c, o, so, h, w, n);
    /* forward: [0] kept, [1] not */
    float *y[2], *sy[2];
    for (int i = 0; i < 2; i++) {
        y[i] = malloc(ny * 4);
        sy[i] = malloc((nsy + 1) * 4);
        for (size_t j = 0; j < ny; j++) y[i][j] = NAN;
        memset(sy[i], 0, (nsy + 1) * 4);
        cf_conv_shortcut sc = {.out_channels = so, .w = spk, .y = sy[i]};
        if (i == 0) memset(xk, 0xa5, (nx + 1) * 2);
        if (i == 0)
            assert_int_equal(
                cf_conv_bf16_forward_keep(&g, o, pk, x, n, y[i], scratch, so ? &sc : NULL, xk),
                CF_OK);
        else if (so)
            assert_int_equal(cf_conv_bf16_forward_with(&g, o, pk, x, n, y[i], scratch, &sc), CF_OK);
        else
            assert_int_equal(cf_conv_bf16_forward(&g, o, pk, x, n, y[i], scratch), CF_OK);
        if (i == 0) {
            for (size_t j = 0; j < nx; j++)
                if (xk[j] != bf16_ref(x[j]))
                    fail_msg("%s: kept word %zu %04x, bf16(x) %04x", what, j, xk[j],
                             bf16_ref(x[j]));
            if (xk[nx] != 0xa5a5) fail_msg("%s: a word written past the kept ones", what);
        }
    }
    same_bits(y[0], y[1], ny, what, "the kept forward's y");
    same_bits(sy[0], sy[1], nsy + 1, what, "the kept forward's shortcut y");
    /* backward: [0] kept, [1] from fp32 x */
    float *dw[2], *dx[2], *sdw[2];
    for (int i = 0; i < 2; i++) {
        dw[i] = malloc(nw * 4);
        dx[i] = malloc(nx * 4);
        sdw[i] = malloc(nsw * 4);
    }
    atomic_store(&kept_calls, 0);
    const bool reads = cf_conv_bf16_keeps_input(&g, o);
    for (int i = 0; i < 2; i++) {
        for (size_t j = 0; j < nw; j++) dw[i][j] = 1e30f; /* overwritten */
        memset(dx[i], 0, nx * 4);
        memset(sdw[i], 0, nsw * 4);
        cf_conv_shortcut sdw_sc = {.out_channels = so, .w = spk, .dy = sdy, .dw = sdw[i]},
                         sdx_sc = sdw_sc;
        if (i == 0)
            assert_int_equal(cf_conv_bf16_backward_kept(&g, o, pk, dy, reads ? xnan : x, xk, n,
                                                        dw[i], dx[i], scratch, so ? &sdw_sc : NULL,
                                                        so ? &sdx_sc : NULL),
                             CF_OK);
        else
            assert_int_equal(cf_conv_bf16_backward(&g, o, pk, dy, x, n, dw[i], dx[i], scratch,
                                                   so ? &sdw_sc : NULL, so ? &sdx_sc : NULL),
                             CF_OK);
        if (i == 0 && reads != (atomic_load(&kept_calls) > 0))
            fail_msg("%s: the copies %s called where keeps_input is %d", what,
                     reads ? "were not" : "were", reads);
    }
    cf_active_kernels = active;
    same_bits(dw[0], dw[1], nw, what, "the kept backward's dW");
    same_bits(dx[0], dx[1], nx, what, "the kept backward's dx");
    same_bits(sdw[0], sdw[1], nsw, what, "the kept backward's shortcut dW");
    double largest = 0;
    for (size_t j = 0; j < nw; j++) largest = fmax(largest, fabs(dw[0][j]));
    assert_true(largest > 0.5); /* the sums are there */
    for (int i = 0; i < 2; i++) free(y[i]), free(sy[i]), free(dw[i]), free(dx[i]), free(sdw[i]);
    free(x), free(xnan), free(xk), free(wt), free(dy), free(sw), free(sdy), free(pk), free(spk),
        free(scratch);
}

static void test_layers(void **state) {
    (void)state;
    if (!make_tables()) return;
    /* W1's layers (several blocks and calls, the last partial) and its pairs */
    check_layer(5, 16, 28, 28, 32, 3, 2, 32);
    check_layer(9, 32, 14, 14, 32, 3, 1, 0);
    check_layer(5, 32, 14, 14, 64, 3, 2, 64);
    check_layer(17, 64, 7, 7, 64, 3, 1, 0);
    check_layer(5, 16, 28, 28, 32, 3, 2, 0);
    /* the 1x1 stride-2 layer alone and a compact one keep nothing (x read as before) */
    check_layer(5, 16, 28, 28, 32, 1, 2, 0);
    check_layer(3, 128, 4, 4, 128, 3, 1, 0);
    /* odd sizes and channels, 5x5, 7x7 at stride 2 (pad 3), rows past 32 values, an odd
     * shortcut, more than 64 rows, a 1 x 1 plane */
    check_layer(3, 9, 11, 13, 10, 5, 1, 0);
    check_layer(4, 5, 10, 12, 7, 3, 2, 0);
    check_layer(3, 24, 14, 14, 40, 7, 2, 0);
    check_layer(3, 8, 10, 10, 12, 3, 2, 11);
    check_layer(2, 8, 70, 70, 8, 3, 1, 0);
    check_layer(2, 8, 68, 66, 8, 3, 2, 0);
    check_layer(3, 4, 1, 1, 5, 3, 1, 0);
}

/* A Conv2d layer in bf16 (forward in training or eval mode, then backward with dx) on `threads`
 * threads with table: its weight gradient and dx; the copies' calls in the backward. */
static int layer_grads(int n, int c, int o, int h, int stride, int threads, bool training,
                       const cf_kernel_table *table, const float *x, const float *dy, float *dw,
                       float *dx) {
    cf_active_kernels = table;
    cf_set_num_threads(threads);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_conv2d(c, o, 3, stride, 1, false), 3), CF_OK);
    assert_int_equal(cf_conv_set_bf16(model->root, true), 1);
    cf_model_train(model, training);
    cf_model_zero_grad(model);
    const cf_tensor tx = cf_tensor_view((float *)x, cf_shape4(n, c, h, h));
    const cf_tensor *ty;
    assert_int_equal(cf_model_forward(model, &tx, &ty), CF_OK);
    const cf_tensor tdy = cf_tensor_view((float *)dy, ty->shape);
    atomic_store(&kept_calls, 0);
    const cf_tensor *tdx = model->root->ops->backward(model->root, &tdy, true);
    const int calls = atomic_load(&kept_calls);
    assert_non_null(tdx);
    memcpy(dx, tdx->data, cf_tensor_numel(&tx) * 4);
    memcpy(dw, cf_model_param(model, "weight")->grad, (size_t)o * c * 9 * 4);
    cf_model_free(model);
    cf_set_num_threads(0);
    cf_active_kernels = active;
    return calls;
}

/* W1's four 3x3 layers as Conv2d layers on 1, 2 and 3 threads, batches that split unevenly: the
 * gradients bitwise those of the table without the copies (x read in fp32), the copies called
 * in a training step and not after an eval forward (which keeps nothing). */
static void test_conv2d_threads(void **state) {
    (void)state;
    if (!make_tables()) return;
    static const int cases[][5] = {
        {11, 16, 32, 28, 2}, {13, 32, 32, 14, 1}, {7, 32, 64, 14, 2}, {13, 64, 64, 7, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int n = cases[i][0], c = cases[i][1], o = cases[i][2], h = cases[i][3],
                  s = cases[i][4], oh = h / s;
        const size_t nx = (size_t)n * c * h * h, ny = (size_t)n * o * oh * oh,
                     nw = (size_t)o * c * 9;
        float *x = malloc(nx * 4), *dy = malloc(ny * 4), *dx0 = malloc(nx * 4),
              *dx1 = malloc(nx * 4), *dw0 = malloc(nw * 4), *dw1 = malloc(nw * 4);
        fill_uniform(x, nx, 100 + i, -2, 2);
        fill_uniform(dy, ny, 110 + i, -1, 1);
        for (int threads = 1; threads <= 3; threads++)
            for (int training = 1; training >= 0; training--) {
                char what[96];
                snprintf(what, sizeof what, "Conv2d %d->%d s%d on %dx%d, %d images, %d threads%s",
                         c, o, s, h, h, n, threads, training ? "" : ", eval forward");
                const int calls =
                    layer_grads(n, c, o, h, s, threads, training, &counting, x, dy, dw0, dx0);
                layer_grads(n, c, o, h, s, threads, training, &plain, x, dy, dw1, dx1);
                if (training && calls == 0) fail_msg("%s: the copies were not called", what);
                if (!training && calls) fail_msg("%s: the copies were called", what);
                same_bits(dw0, dw1, nw, what, "dW");
                same_bits(dx0, dx1, nx, what, "dx");
            }
        free(x), free(dy), free(dx0), free(dx1), free(dw0), free(dw1);
    }
}

/* deal2_h and interleave2_rows (stride 2's layouts of a whole plane in one pass) against
 * deal_h and interleave_rows twice: the same words, nothing written outside the rows; every
 * width from 1 to 40 (two rows per vector up to 16, its own loop from 17 to 32 and deal_h's
 * with that loop switched off: cf__bf16_set_words_loops, chunks of 32 past it), 1 to 7 rows. */
static void test_plane_kernels(void **state) {
    (void)state;
    if (!make_tables()) return;
    const cf_bf16_kernels *k = active->bf16;
    assert_non_null(k->deal2_h);
    assert_non_null(k->interleave2_rows);
    enum { H = 7, W = 40, LD = 48, Q = 4 * H * LD };
    static float x[H * W], src[Q], out0[H * W + 64], out1[H * W + 64];
    static uint16_t xh[H * W], a[Q], b[Q];
    fill_bf16_specials(x, H * W, 71);
    for (size_t i = 0; i < H * W; i++) xh[i] = bf16_ref(x[i]);
    fill_uniform(src, Q, 72, -3, 3);
    for (int h = 1; h <= H; h++)
        for (int w = 1; w <= W; w++) {
            /* four destinations LD * H words apart, rows ld = LD apart */
            const size_t q = (size_t)H * LD;
            memset(a, 0xa5, sizeof a);
            memset(b, 0xa5, sizeof b);
            k->deal_h(xh, (size_t)2 * w, (h + 1) / 2, w, a, a + q, LD);
            if (h > 1) k->deal_h(xh + w, (size_t)2 * w, h / 2, w, a + 2 * q, a + 3 * q, LD);
            for (int own = 0; own < 2; own++) {
                cf__bf16_set_words_loops(own == 1);
                memset(b, 0xa5, sizeof b);
                const unsigned long before = cf__bf16_words_loops_calls();
                k->deal2_h(xh, h, w, b, b + q, b + 2 * q, b + 3 * q, LD);
                const bool took = cf__bf16_words_loops_calls() != before;
                if (took != (own == 1 && w > 16 && w <= 32))
                    fail_msg("deal2_h: %d rows of %d took the 17-32 loop %d (on %d)", h, w, took,
                             own);
                if (memcmp(a, b, sizeof a) != 0)
                    fail_msg("deal2_h: %d rows of %d differ from deal_h's (17-32 loop %d)", h, w,
                             own);
            }
            for (size_t i = 0; i < H * W + 64; i++) out0[i] = out1[i] = -7.0f;
            k->interleave_rows(src, src + q, LD, (h + 1) / 2, w, out0, (size_t)2 * w);
            if (h > 1)
                k->interleave_rows(src + 2 * q, src + 3 * q, LD, h / 2, w, out0 + w, (size_t)2 * w);
            k->interleave2_rows(src, src + q, src + 2 * q, src + 3 * q, LD, h, w, out1);
            if (memcmp(out0, out1, sizeof out0) != 0)
                fail_msg("interleave2_rows: %d rows of %d differ from interleave_rows'", h, w);
        }
}

static atomic_int plane_calls;

static void count_deal2_h(const uint16_t *x, int h, int w, uint16_t *e0, uint16_t *o0, uint16_t *e1,
                          uint16_t *o1, size_t ld) {
    atomic_fetch_add(&plane_calls, 1);
    active->bf16->deal2_h(x, h, w, e0, o0, e1, o1, ld);
}

static void count_interleave2_rows(const float *a0, const float *b0, const float *a1,
                                   const float *b1, size_t lds, int h, int n, float *out) {
    atomic_fetch_add(&plane_calls, 1 << 16);
    active->bf16->interleave2_rows(a0, b0, a1, b1, lds, h, n, out);
}

/* Stride-2 Conv2d layers in bf16 (W1's two, short rows, rows of more than 32 values, 1 and 2
 * threads): the gradients with the one-pass layouts bitwise those without (deal_h and
 * interleave_rows twice), both layouts called. */
static void test_plane_layers(void **state) {
    (void)state;
    if (!make_tables()) return;
    static cf_kernel_table with, without;
    static cf_bf16_kernels with_bf16, without_bf16;
    with = without = *active;
    with_bf16 = without_bf16 = *active->bf16;
    with_bf16.deal2_h = count_deal2_h;
    with_bf16.interleave2_rows = count_interleave2_rows;
    without_bf16.deal2_h = NULL;
    without_bf16.interleave2_rows = NULL;
    /* dx stored straight into its rows (conv_spread, cols_spread) takes no interleave pass: off
     * in both tables here (test_bf16_dy_words compares them with the planes) */
    with_bf16.conv_spread = without_bf16.conv_spread = NULL;
    with_bf16.cols_spread = without_bf16.cols_spread = NULL;
    with.bf16 = &with_bf16;
    without.bf16 = &without_bf16;
    static const int cases[][4] = {
        {11, 16, 32, 28}, {7, 32, 64, 14}, {5, 8, 12, 10}, {3, 8, 8, 36}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int n = cases[i][0], c = cases[i][1], o = cases[i][2], h = cases[i][3], oh = h / 2;
        const size_t nx = (size_t)n * c * h * h, ny = (size_t)n * o * oh * oh,
                     nw = (size_t)o * c * 9;
        float *x = malloc(nx * 4), *dy = malloc(ny * 4), *dx0 = malloc(nx * 4),
              *dx1 = malloc(nx * 4), *dw0 = malloc(nw * 4), *dw1 = malloc(nw * 4);
        fill_uniform(x, nx, 200 + i, -2, 2);
        fill_uniform(dy, ny, 210 + i, -1, 1);
        for (int threads = 1; threads <= 2; threads++) {
            char what[96];
            snprintf(what, sizeof what, "Conv2d %d->%d s2 on %dx%d, %d images, %d threads", c, o, h,
                     h, n, threads);
            atomic_store(&plane_calls, 0);
            layer_grads(n, c, o, h, 2, threads, true, &with, x, dy, dw0, dx0);
            const int calls = atomic_load(&plane_calls);
            layer_grads(n, c, o, h, 2, threads, true, &without, x, dy, dw1, dx1);
            if ((calls & 0xffff) == 0) fail_msg("%s: deal2_h was not called", what);
            if ((calls >> 16) == 0) fail_msg("%s: interleave2_rows was not called", what);
            same_bits(dw0, dw1, nw, what, "dW");
            same_bits(dx0, dx1, nx, what, "dx");
        }
        free(x), free(dy), free(dx0), free(dx1), free(dw0), free(dw1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_fp32),      cmocka_unit_test(test_keep_words),
        cmocka_unit_test(test_copies),         cmocka_unit_test(test_layers),
        cmocka_unit_test(test_conv2d_threads), cmocka_unit_test(test_plane_kernels),
        cmocka_unit_test(test_plane_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
