/* The bf16 weight gradient's runs of position pairs (cf_bf16_kernels.conv_wgrad_runs: only the
 * pairs of dy's rows that hold values, three taps per register tile) and its conversions (the
 * 1x1 stride-2 layer's even values, even_rows; rows and deals on the conversion instruction,
 * short rows two at a time, rows_short and deal_short) against the paths they replaced, which
 * conv_bf16.c keeps for a level without them (conv_wgrad over every pair of every image, rows,
 * deal): bitwise, kernel against kernel on operands whose pairs outside the runs are zero, and
 * whole layers (cf_conv_bf16_wgrad, _wgrad_with, _backward with and without a paired shortcut) run
 * with the active table and with a copy of it without those entries. A copy whose entries count
 * their calls shows that the new ones ran. At avx512_bf16 all four must be there; the amx level
 * (its tiles sum every pair in their own order) has no runs entry and keeps the conversions; below
 * avx512_bf16 there is no bf16 convolution and nothing to compare (test_bf16 runs the fp32 fallback
 * there). */
#include "bf16_layer_fixture.h"
#include "oracle.h"

#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <stdio.h>
#include <string.h>

static const cf_kernel_table *active;
static cf_kernel_table plain, counting;
static cf_bf16_kernels plain_bf16, counting_bf16;
static int runs_calls, even_calls, short_calls;

static void count_runs(int taps, const int *half, const unsigned char *odd, int m, int ch,
                       int images, int istep, int runs, const int *run_at, const int *run_len,
                       const uint32_t *a, size_t lda, const uint32_t *b0, const uint32_t *b1,
                       size_t ldb, float *out, size_t ldo, size_t tapo, bool accumulate) {
    runs_calls++;
    active->bf16->conv_wgrad_runs(taps, half, odd, m, ch, images, istep, runs, run_at, run_len, a,
                                  lda, b0, b1, ldb, out, ldo, tapo, accumulate);
}

static void count_even(const float *x, size_t ldx, int h, int n, uint16_t *y, size_t ldy) {
    even_calls++;
    active->bf16->even_rows(x, ldx, h, n, y, ldy);
}

static void count_rows_short(const float *x, int h, int w, uint16_t *y, size_t ldy) {
    short_calls++;
    active->bf16->rows_short(x, h, w, y, ldy);
}

static void count_deal_short(const float *x, size_t ldx, int h, int n, uint16_t *e, uint16_t *o,
                             size_t ld) {
    short_calls++;
    active->bf16->deal_short(x, ldx, h, n, e, o, ld);
}

/* The active table's copies: plain without the two entries, counting with them wrapped. False
 * where the level has no bf16 convolution; fails where an entry is missing or present against
 * the level's rule. */
static bool make_tables(void) {
    if (!bf16_tables_copy(&active, &plain, &counting, &plain_bf16, &counting_bf16)) return false;
    const cf_bf16_kernels *k = active->bf16;
    if (active->isa == CF_ISA_AMX)
        assert_null(k->conv_wgrad_runs);
    else
        assert_non_null(k->conv_wgrad_runs);
    assert_non_null(k->even_rows);
    assert_non_null(k->rows_short);
    assert_non_null(k->deal_short);
    plain_bf16.conv_wgrad_runs = NULL;
    plain_bf16.even_rows = NULL;
    plain_bf16.rows_short = NULL;
    plain_bf16.deal_short = NULL;
    counting_bf16.conv_wgrad_runs = k->conv_wgrad_runs ? count_runs : NULL;
    counting_bf16.even_rows = count_even;
    counting_bf16.rows_short = count_rows_short;
    counting_bf16.deal_short = count_deal_short;
    return true;
}

static uint32_t pair_word(float lo, float hi) {
    uint16_t b[2];
    const float f[2] = {lo, hi};
    cf_fp32_to_bf16(f, b, 2);
    return (uint32_t)b[0] | (uint32_t)b[1] << 16;
}

/* The kernel: conv_wgrad_runs against conv_wgrad over images * istep pairs, a zero outside the
 * runs (b is not: the pairs left out would change every sum if they were read), both with and
 * without accumulate. */
static void check_kernel(int taps, int m, int ch, int images, int istep, int runs,
                         const int *run_at, const int *run_len) {
    const cf_bf16_kernels *k = active->bf16;
    const int mr = (m + 7) / 8 * 8, nq2 = images * istep;
    const size_t lda = (size_t)nq2 + 3, ldb = ((size_t)ch + 15) / 16 * 16;
    int half[9];
    unsigned char odd[9];
    int reach = 0;
    for (int t = 0; t < taps; t++) { /* offsets as dW's taps: some odd, some far */
        half[t] = (t * 7) % 11;
        odd[t] = (unsigned char)(t % 2);
        if (half[t] > reach) reach = half[t];
    }
    const size_t brows = (size_t)nq2 + reach + 1;
    uint32_t *a = calloc((size_t)mr * lda, sizeof(uint32_t)),
             *b0 = calloc(brows * ldb, sizeof(uint32_t)),
             *b1 = calloc(brows * ldb, sizeof(uint32_t));
    float *v = malloc(4 * brows * ldb * sizeof(float)),
          *va = malloc(2 * (size_t)mr * lda * sizeof(float));
    fill_uniform(v, 4 * brows * ldb, 71, -2, 2);
    fill_uniform(va, 2 * (size_t)mr * lda, 73, -2, 2);
    bool *in_run = calloc((size_t)nq2, sizeof(bool));
    for (int n = 0; n < images; n++)
        for (int j = 0; j < runs; j++)
            for (int i = 0; i < run_len[j]; i++) in_run[n * istep + run_at[j] + i] = true;
    for (int r = 0; r < m; r++)
        for (int q = 0; q < nq2; q++)
            if (in_run[q])
                a[r * lda + q] = pair_word(va[2 * (r * lda + q)], va[2 * (r * lda + q) + 1]);
    for (size_t q = 0; q < brows; q++)
        for (int c = 0; c < ch; c++) {
            const size_t at = q * ldb + c;
            b0[at] = pair_word(v[2 * at], v[2 * at + 1]);
            b1[at] = pair_word(v[2 * at + 1], v[2 * at + 2 * ldb]);
        }
    const size_t nout = (size_t)taps * m * ch;
    float *want = malloc(nout * sizeof(float)), *got = malloc(nout * sizeof(float));
    for (int acc = 0; acc < 2; acc++) {
        fill_uniform(want, nout, 72, -1, 1);
        memcpy(got, want, nout * sizeof(float));
        k->conv_wgrad(taps, half, odd, m, ch, nq2, a, lda, b0, b1, ldb, want, (size_t)ch,
                      (size_t)m * ch, acc);
        k->conv_wgrad_runs(taps, half, odd, m, ch, images, istep, runs, run_at, run_len, a, lda, b0,
                           b1, ldb, got, (size_t)ch, (size_t)m * ch, acc);
        for (size_t i = 0; i < nout; i++)
            if (memcmp(&want[i], &got[i], sizeof(float)))
                fail_msg("conv_wgrad_runs, %d taps, %d x %d, %d images of %d pairs, %s: out[%zu] "
                         "%.9g, conv_wgrad %.9g",
                         taps, m, ch, images, istep, acc ? "accumulated" : "overwritten", i,
                         (double)got[i], (double)want[i]);
    }
    free(a), free(b0), free(b1), free(v), free(va), free(in_run), free(want), free(got);
}

static void test_kernel(void **state) {
    (void)state;
    if (!make_tables() || !active->bf16->conv_wgrad_runs) return;
    const int at1[] = {0}, len1[] = {20}, at3[] = {1, 8, 12}, len3[] = {5, 3, 7};
    const int taps[] = {1, 2, 3, 4, 9}, ms[] = {8, 12, 32, 64, 5},
              chs[] = {16, 20, 32, 40, 48, 64, 80, 7};
    for (int t = 0; t < 5; t++)
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 8; j++) {
                check_kernel(taps[t], ms[i], chs[j], 3, 20, 3, at3, len3);
                check_kernel(taps[t], ms[i], chs[j], 2, 20, 1, at1, len1); /* every pair */
            }
}

/* One layer (k x k, stride s, pad (k - 1) / 2, or the 1x1 stride-2 shortcut: k = 1; with a
 * paired shortcut of so outputs where so > 0) through the counting table and the plain one:
 * cf_conv_bf16_wgrad, _wgrad_with, _backward; bitwise, and the new entries called. */
static void check_layer(int n, int c, int h, int w, int o, int k, int stride, int so) {
    bf16_layer_case t;
    bf16_layer_case_init(&t, n, c, h, w, o, k, stride, so, 81);
    const cf_conv_geom g = t.g;
    const bool sub = k == 1;
    const size_t nx = t.nx, nw = t.nw, nsw = t.nsw;
    const float *x = t.x, *dy = t.dy, *sdy = t.sdy, *pk = t.pk, *spk = t.spk;
    float *scratch = t.scratch;
    /* [0]: the new path (counting table), [1]: the old one (plain) */
    float *dw[2], *dx[2], *sdw[2];
    for (int i = 0; i < 2; i++) {
        dw[i] = malloc(nw * sizeof(float));
        dx[i] = malloc(nx * sizeof(float));
        sdw[i] = malloc((nsw + 1) * sizeof(float));
    }
    char what[112];
    snprintf(what, sizeof what, "%dx%d/%d %d->%d (shortcut %d) on %dx%d, %d images", k, k, stride,
             c, o, so, h, w, n);
    for (int call = 0; call < 3; call++) {
        if (call == 1 && !so) continue;
        for (int i = 0; i < 2; i++) {
            cf_active_kernels = i == 0 ? &counting : &plain;
            runs_calls = even_calls = short_calls = 0;
            for (size_t j = 0; j < nw; j++) dw[i][j] = 1e30f; /* overwritten */
            memset(dx[i], 0, nx * sizeof(float));
            memset(sdw[i], 0, (nsw + 1) * sizeof(float));
            cf_conv_shortcut sdw_sc = {.out_channels = so, .w = spk, .dy = sdy, .dw = sdw[i]},
                             sdx_sc = sdw_sc;
            if (call == 0)
                cf_conv_bf16_wgrad(&g, o, dy, x, n, dw[i], scratch);
            else if (call == 1)
                cf_conv_bf16_wgrad_with(&g, o, dy, x, n, dw[i], scratch, &sdw_sc);
            else
                assert_int_equal(cf_conv_bf16_backward(&g, o, pk, dy, x, n, dw[i], dx[i], scratch,
                                                       so ? &sdw_sc : NULL, so ? &sdx_sc : NULL),
                                 CF_OK);
            if (i == 0 && runs_calls == 0 && active->bf16->conv_wgrad_runs)
                fail_msg("%s, call %d: conv_wgrad_runs was not called", what, call);
            if (i == 0 && sub && even_calls == 0)
                fail_msg("%s, call %d: even_rows was not called", what, call);
            if (i == 0 && !sub && short_calls == 0)
                fail_msg("%s, call %d: rows_short / deal_short were not called", what, call);
            if (i == 1 && (runs_calls || even_calls || short_calls))
                fail_msg("%s, call %d: the plain table called a counting entry", what, call);
        }
        cf_active_kernels = active;
        for (size_t j = 0; j < nw; j++)
            if (memcmp(&dw[0][j], &dw[1][j], sizeof(float)))
                fail_msg("%s, call %d: dW[%zu] %.9g, every pair's %.9g", what, call, j,
                         (double)dw[0][j], (double)dw[1][j]);
        if (memcmp(dx[0], dx[1], nx * sizeof(float))) fail_msg("%s, call %d: dx", what, call);
        if (memcmp(sdw[0], sdw[1], (nsw + 1) * sizeof(float)))
            fail_msg("%s, call %d: the shortcut's dW", what, call);
        double largest = 0;
        for (size_t j = 0; j < nw; j++) largest = fmax(largest, fabs(dw[0][j]));
        assert_true(largest > 0.5); /* the sums are there */
    }
    for (int i = 0; i < 2; i++) free(dw[i]), free(dx[i]), free(sdw[i]);
    bf16_layer_case_free(&t);
}

static void test_layers(void **state) {
    (void)state;
    if (!make_tables()) return;
    /* W1's layers (several blocks of images, the last partial), its pairs */
    check_layer(5, 16, 28, 28, 32, 3, 2, 32);
    check_layer(9, 32, 14, 14, 32, 3, 1, 0);
    check_layer(5, 32, 14, 14, 64, 3, 2, 64);
    check_layer(17, 64, 7, 7, 64, 3, 1, 0);
    check_layer(5, 16, 28, 28, 32, 1, 2, 0);
    check_layer(5, 32, 14, 14, 64, 1, 2, 0);
    /* odd sizes and channels: rows that straddle pairs, channels past a vector, 5x5, 7x7 at
     * stride 2 (pad 3), an odd shortcut, planes of more than 64 rows (one run over the image) */
    check_layer(3, 9, 11, 13, 10, 5, 1, 0);
    check_layer(4, 5, 10, 12, 7, 3, 2, 0);
    check_layer(3, 20, 9, 9, 12, 3, 1, 0);
    check_layer(3, 24, 14, 14, 40, 7, 2, 0);
    check_layer(3, 8, 10, 10, 12, 3, 2, 11);
    check_layer(3, 12, 13, 11, 20, 1, 2, 0);
    check_layer(2, 8, 70, 70, 8, 3, 1, 0);
    check_layer(3, 4, 1, 1, 5, 3, 1, 0);
}

/* rows_short and deal_short write rows' and deal's words, and even_rows deal's even ones
 * (bitwise, and no word outside the rows: the rest keeps its fill) for rows of every width up to 70
 * (two short rows a vector, vector tails, 32 values at a time), 1 to 5 rows (an odd last row), deal
 * with and without o, on rows with special values and rows of ordinary ones (the conversion
 * instruction's own path). */
static void test_short_conversions(void **state) {
    (void)state;
    if (!make_tables()) return;
    const cf_bf16_kernels *k = active->bf16;
    enum { H = 5, W = 70, LD = 80, LDX = 2 * W + 3 };
    static float x[H * LDX];
    static uint16_t a[H * LD], b[H * LD], ao[H * LD], bo[H * LD];
    fill_bf16_specials(x, H * LDX, 51);
    for (int i = 1; i < H; i += 2) fill_uniform(x + i * LDX, LDX, 52 + (unsigned)i, -1, 1);
    for (int h = 1; h <= H; h++)
        for (int w = 1; w <= W; w++) {
            for (int from = 0; from < 2;
                 from++) { /* rows from a plane with special values, or not */
                const float *src = x + from * LDX;
                memset(a, 0xa5, sizeof a);
                memset(b, 0xa5, sizeof b);
                k->rows(src, h, w, a, LD);
                k->rows_short(src, h, w, b, LD);
                if (memcmp(a, b, sizeof a) != 0)
                    fail_msg("rows_short: %d rows of %d (plane %d) differ from rows'", h, w, from);
            }
            /* even_rows: deal's even values of rows of 2 w - 1 (h of them, two a vector where
             * w <= 16), both planes */
            for (int from = 0; from < 2 && from + h <= H; from++) {
                const float *src = x + from * LDX;
                memset(a, 0xa5, sizeof a);
                memset(b, 0xa5, sizeof b);
                k->deal(src, LDX, h, 2 * w - 1, a, NULL, LD);
                k->even_rows(src, LDX, h, w, b, LD);
                if (memcmp(a, b, sizeof a) != 0)
                    fail_msg("even_rows: %d rows of %d (plane %d) differ from deal's", h, w, from);
            }
            for (int with_o = 0; with_o < 2; with_o++) {
                memset(a, 0xa5, sizeof a);
                memset(b, 0xa5, sizeof b);
                memset(ao, 0x5a, sizeof ao);
                memset(bo, 0x5a, sizeof bo);
                k->deal(x, LDX, h, w, a, with_o ? ao : NULL, LD);
                k->deal_short(x, LDX, h, w, b, with_o ? bo : NULL, LD);
                if (memcmp(a, b, sizeof a) != 0 || memcmp(ao, bo, sizeof ao) != 0)
                    fail_msg("deal_short: %d rows of %d (o %d) differ from deal's", h, w, with_o);
            }
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_layers),
        cmocka_unit_test(test_short_conversions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
