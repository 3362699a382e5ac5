/* The bf16 convolution's pair planes and rows on the conversion instructions in every path of
 * conv_bf16.c (src/tensor/conv_bf16.c: pairs_rows_of, deal_pairs_of, rows_of): the small planes'
 * forward, dx and weight gradient (W3's 3x3 stride-2 layers, run_compact, dx_compact2,
 * wgrad_compact), the padded-stride forward of stride 1, stride 2 and the 1x1 stride-2 layer
 * (run_images), stride 2's and the 1x1 stride-2 layer's dx (dx_stride2, dx_subsampled), with and
 * without a paired shortcut. Each layer runs through a copy of the active table whose
 * fwd_pairs_rows, fwd_deal_pairs and rows_short count their calls, and through one without them
 * (the plain pairs_rows, deal_pairs and rows, cf__bf16_round_lanes' integer rounding): y, dx, dW
 * and the shortcut's y, dx and dW bitwise the same, and the counted entries called. The input
 * holds subnormals and ties in some planes (fill_bf16_specials, made finite), so the
 * instructions' own path and the fallback for a vector that holds a subnormal both run. At the
 * amx level (the tile emulation) the same; below avx512_bf16 there is no bf16 convolution and
 * nothing to compare. */
#include "bf16_layer_fixture.h"
#include "oracle.h"

#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const cf_kernel_table *active;
static cf_kernel_table plain, counting;
static cf_bf16_kernels plain_bf16, counting_bf16;
static int pairs_calls, deal_calls, rows_calls;

static void count_pairs_rows(const float *lo, const float *hi, int h, int w, uint32_t *out,
                             size_t ldo) {
    pairs_calls++;
    active->bf16->fwd_pairs_rows(lo, hi, h, w, out, ldo);
}

static void count_deal_pairs(const float *lo, const float *hi, size_t ldx, int h, int n,
                             uint32_t *e, uint32_t *o, size_t ld) {
    deal_calls++;
    active->bf16->fwd_deal_pairs(lo, hi, ldx, h, n, e, o, ld);
}

static void count_rows_short(const float *x, int h, int w, uint16_t *y, size_t ldy) {
    rows_calls++;
    active->bf16->rows_short(x, h, w, y, ldy);
}

static bool make_tables(void) {
    if (!bf16_tables_copy(&active, &plain, &counting, &plain_bf16, &counting_bf16)) return false;
    const cf_bf16_kernels *k = active->bf16;
    assert_non_null(k->fwd_pairs_rows);
    assert_non_null(k->fwd_deal_pairs);
    assert_non_null(k->rows_short);
    plain_bf16.fwd_pairs_rows = NULL;
    plain_bf16.fwd_deal_pairs = NULL;
    plain_bf16.rows_short = NULL;
    counting_bf16.fwd_pairs_rows = count_pairs_rows;
    counting_bf16.fwd_deal_pairs = count_deal_pairs;
    counting_bf16.rows_short = count_rows_short;
    return true;
}

static void same(const float *a, const float *b, size_t n, const char *what, const char *part) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: %s[%zu] is %.9g, the plain conversions' %.9g", what, part, i,
                     (double)a[i], (double)b[i]);
}

/* One layer (k x k, stride s, pad (k - 1) / 2; k = 1: the 1x1 stride-2 shortcut alone), with a
 * paired shortcut of so outputs where so > 0: the forward, the backward (dW and dx) and dx alone,
 * through both tables. want_pairs, want_deal, want_rows: which counted entries the layer must call.
 */
static void check_layer(int n, int c, int h, int o, int k, int s, int so, bool want_pairs,
                        bool want_deal, bool want_rows) {
    bf16_layer_case t;
    bf16_layer_case_init(&t, n, c, h, h, o, k, s, so, 91);
    const cf_conv_geom g = t.g;
    const size_t nx = t.nx, ny = t.ny, nw = t.nw, nsy = t.nsy, nsw = t.nsw;
    float *x = t.x, *dy = t.dy, *sdy = t.sdy, *pk = t.pk, *spk = t.spk, *scratch = t.scratch;
    /* special values in the first image's first planes of x and dy (and the shortcut's dy):
     * subnormals take the integer rounding inside the new entries too */
    fill_bf16_specials(x, (size_t)h * h * (c < 3 ? c : 3), 96);
    fill_bf16_specials(dy, (size_t)g.oh * g.ow * (o < 3 ? o : 3), 97);
    if (so) fill_bf16_specials(sdy, (size_t)g.oh * g.ow * (so < 3 ? so : 3), 98);
    /* no infinities or NaNs in dy's or x's planes that the products multiply by zero weights or
     * sum against each other: keep the special values finite */
    for (size_t i = 0; i < nx; i++)
        if (!isfinite(x[i])) x[i] = 1.5f;
    for (size_t i = 0; i < ny; i++)
        if (!isfinite(dy[i])) dy[i] = -0.75f;
    for (size_t i = 0; i < nsy; i++)
        if (!isfinite(sdy[i])) sdy[i] = 0.25f;
    float *y[2], *sy[2], *dx[2], *dx1[2], *dw[2], *sdw[2];
    for (int i = 0; i < 2; i++) {
        y[i] = malloc(ny * sizeof(float));
        sy[i] = malloc((nsy + 1) * sizeof(float));
        dx[i] = malloc(nx * sizeof(float));
        dx1[i] = malloc(nx * sizeof(float));
        dw[i] = malloc(nw * sizeof(float));
        sdw[i] = malloc((nsw + 1) * sizeof(float));
    }
    char what[112];
    snprintf(what, sizeof what, "%dx%d/%d %d->%d (shortcut %d) on %dx%d, %d images", k, k, s, c, o,
             so, h, h, n);
    for (int i = 0; i < 2; i++) { /* [0]: the counting table, [1]: the plain one */
        cf_active_kernels = i == 0 ? &counting : &plain;
        pairs_calls = deal_calls = rows_calls = 0;
        memset(y[i], 0, ny * sizeof(float));
        memset(sy[i], 0, (nsy + 1) * sizeof(float));
        memset(dx[i], 0, nx * sizeof(float));
        memset(dx1[i], 0, nx * sizeof(float));
        memset(dw[i], 0, nw * sizeof(float));
        memset(sdw[i], 0, (nsw + 1) * sizeof(float));
        cf_conv_shortcut fsc = {.out_channels = so, .w = spk, .y = sy[i]},
                         bsc = {.out_channels = so, .w = spk, .dy = sdy, .dw = sdw[i]};
        if (so)
            assert_int_equal(cf_conv_bf16_forward_with(&g, o, pk, x, n, y[i], scratch, &fsc),
                             CF_OK);
        else
            assert_int_equal(cf_conv_bf16_forward(&g, o, pk, x, n, y[i], scratch), CF_OK);
        assert_int_equal(cf_conv_bf16_backward(&g, o, pk, dy, x, n, dw[i], dx[i], scratch,
                                               so ? &bsc : NULL, so ? &bsc : NULL),
                         CF_OK);
        /* dx alone: from dy in fp32 (the backward pairs the weight gradient's bf16 rows of dy
         * at stride 2 instead) */
        if (so)
            assert_int_equal(cf_conv_bf16_dx_with(&g, o, pk, dy, n, dx1[i], scratch, &bsc), CF_OK);
        else
            assert_int_equal(cf_conv_bf16_dx(&g, o, pk, dy, n, dx1[i], scratch), CF_OK);
        if (i == 0 && want_pairs && pairs_calls == 0)
            fail_msg("%s: fwd_pairs_rows was not called", what);
        if (i == 0 && want_deal && deal_calls == 0)
            fail_msg("%s: fwd_deal_pairs was not called", what);
        if (i == 0 && want_rows && rows_calls == 0) fail_msg("%s: rows_short was not called", what);
        if (i == 1 && (pairs_calls || deal_calls || rows_calls))
            fail_msg("%s: the plain table called a counting entry", what);
    }
    cf_active_kernels = active;
    same(y[0], y[1], ny, what, "y");
    same(dx[0], dx[1], nx, what, "dx");
    same(dx1[0], dx1[1], nx, what, "dx alone");
    same(dx[0], dx1[0], nx, what, "dx alone against the backward's");
    same(dw[0], dw[1], nw, what, "dW");
    if (so) {
        same(sy[0], sy[1], nsy, what, "the shortcut's y");
        same(sdw[0], sdw[1], nsw, what, "the shortcut's dW");
    }
    double largest = 0;
    for (size_t j = 0; j < nw; j++) largest = fmax(largest, fabs(dw[0][j]));
    assert_true(largest > 0.5); /* the sums are there */
    for (int i = 0; i < 2; i++)
        free(y[i]), free(sy[i]), free(dx[i]), free(dx1[i]), free(dw[i]), free(sdw[i]);
    bf16_layer_case_free(&t);
}

/* W3's stride-2 layers on small planes (compact: at least 128 channels each way, at most 64
 * output positions) with their shortcuts, and one without; an odd channel count. */
static void test_small_planes(void **state) {
    (void)state;
    if (!make_tables()) return;
    check_layer(3, 128, 16, 256, 3, 2, 256, true, false, true); /* l3 */
    check_layer(5, 256, 8, 512, 3, 2, 512, true, false, true);  /* l4, a partial block */
    check_layer(2, 130, 8, 129, 3, 2, 0, true, false, true);
}

/* The padded-stride paths: stride 2 (phase planes: deal pairs) with and without a shortcut,
 * stride 1, and the 1x1 stride-2 layer alone (its forward deals the even columns, its dx pairs
 * dy). */
static void test_padded_planes(void **state) {
    (void)state;
    if (!make_tables()) return;
    check_layer(3, 64, 32, 128, 3, 2, 128, true, true, false); /* W3's l2 */
    check_layer(3, 16, 28, 32, 3, 2, 0, true, true, false);
    check_layer(3, 9, 13, 10, 3, 1, 0, true, false, false);
    check_layer(3, 128, 16, 256, 1, 2, 0, true, true, false); /* l3's downsample alone */
    check_layer(3, 7, 15, 12, 1, 2, 0, true, true, false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_planes),
        cmocka_unit_test(test_padded_planes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
