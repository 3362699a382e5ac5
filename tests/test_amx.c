/* The amx level: its tile kernels (src/tensor/amx_tiles.h) and its place among the levels.
 *
 * The kernels are compiled twice from one source: over a scalar emulation of the tile
 * instructions (isa_amx_emul.c, Intel's pseudocode for TDPBF16PS), which runs here on every
 * x86-64 CPU, and on the real instructions (isa_amx.c), which run only where the CPU has AMX
 * (else those checks skip, saying so). Each kernel is checked against sums in double of the
 * same bf16 operands (conv_run over taps, pair blocks with and without a remainder, 8-row
 * blocks and 32/16 positions; conv_wgrad over row, channel and position-pair edges, accumulating
 * or not; the GEMM over every transpose and edge), against the AVX512_BF16 kernels where the CPU
 * has them, and for writes past what they own. Every buffer a kernel reads is allocated to its
 * exact size, so that AddressSanitizer sees a tile reading past it. Then the whole convolution
 * (cf_conv_bf16_pack, forward, dx, wgrad at stride 1 and 2, the subsampled shortcut) and
 * cf_sgemm_bf16 run with the emulated (and the real) amx kernels in the active table against the
 * avx512_bf16 level. No tile operation may be one the hardware refuses, nor reach a row outside
 * the part of its operand the kernel's contract allows (the emulation counts both; the second
 * finds reads past a plane or a row that stay inside one of the library's scratch buffers, where
 * no sanitizer sees them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "corefit/tensor.h"
#include "amx_emul.h"
#include "tensor/amx.h"
#include "tensor/kernel_table.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float uniform(void) { /* [-1, 1) */
    return (float)(next_u32() % 2000001u) / 1000000.0f - 1.0f;
}
static uint16_t bf16_bits(float x) {
    const float r = cf_bf16_round(x);
    uint32_t b;
    memcpy(&b, &r, sizeof b);
    return (uint16_t)(b >> 16);
}
static double bf16_value(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}
static uint32_t random_pair(void) {
    return (uint32_t)bf16_bits(uniform()) | (uint32_t)bf16_bits(uniform()) << 16;
}
/* the dot product of two pairs, and the sum of its terms' magnitudes */
static double dot(uint32_t a, uint32_t b, double *mag) {
    const double p0 = bf16_value((uint16_t)a) * bf16_value((uint16_t)b),
                 p1 = bf16_value((uint16_t)(a >> 16)) * bf16_value((uint16_t)(b >> 16));
    *mag += fabs(p0) + fabs(p1);
    return p0 + p1;
}
static size_t up(size_t n, size_t m) {
    return (n + m - 1) / m * m;
}

static bool has_avx512_bf16(void) {
    const cf_isa best = cf_isa_best();
    return best == CF_ISA_AVX512_BF16 || best == CF_ISA_AMX;
}
static bool has_amx(void) {
    return cf_isa_best() == CF_ISA_AMX;
}

/* The kernel sets under test: the emulated tiles always, the real ones where the CPU has AMX. */
typedef struct kernel_set {
    const char *name;
    cf_bf16_kernels k;
} kernel_set;

static int kernel_sets(kernel_set sets[2]) {
    int n = 0;
    memset(sets, 0, 2 * sizeof *sets);
    sets[n].name = "emulated";
    cf_amx_emul_kernels(&sets[n++].k);
    if (has_amx()) {
        sets[n].name = "amx";
        cf_amx_kernels(&sets[n++].k);
    }
    return n;
}

static void say_amx(void) {
    static bool said;
    if (said) return;
    said = true;
    if (!has_amx())
        print_message("no AMX on this CPU (best level %s): the real tile kernels are not run, "
                      "the emulated ones are\n",
                      cf_isa_name(cf_isa_best()));
}

/* No tile operation since `before` was one the hardware refuses, or reached outside the part of
 * its operand the kernel's contract allows (the emulation counts both). */
static void expect_no_faults(unsigned long before, const char *what) {
    const unsigned long now = cf_amx_emul_faults();
    if (now != before)
        fail_msg("%s: %lu emulated tile operations refused by the hardware or outside their "
                 "operand's span",
                 what, now - before);
}

/* a - b within the bound of fp32 sums of n terms of total magnitude mag (and a little) */
static bool close_to(double a, double b, int n, double mag) {
    return fabs(a - b) <= (n + 2) * 6e-8 * mag + 1e-30;
}

/* ---- conv_run ---------------------------------------------------------------------------------
 */

static void check_conv_run(const cf_bf16_kernels *k, const char *name, int taps, int pairs, int m,
                           int nq) {
    const int mb = (int)up((size_t)m, 8);
    const size_t plane = up((size_t)nq + 40, 16), ldo = (size_t)nq + 3;
    int off[9];
    for (int t = 0; t < taps; t++) off[t] = (int)(next_u32() % 41u);
    /* the 8-row pack of conv_bf16.c: [block][tap][pair][8 rows], rows past m zero */
    const size_t words = (size_t)mb * taps * pairs;
    uint32_t *w8 = calloc(words, sizeof *w8), *packed = malloc(words * sizeof *packed),
             *tmp = malloc((size_t)16 * taps * pairs * sizeof *tmp),
             *x = malloc((size_t)pairs * plane * sizeof *x);
    float *out = malloc((size_t)mb * ldo * sizeof *out);
    double *ref = calloc((size_t)mb * nq, sizeof *ref), *mag = calloc((size_t)mb * nq, sizeof *mag);
    assert_non_null(w8), assert_non_null(packed), assert_non_null(tmp), assert_non_null(x);
    assert_non_null(out), assert_non_null(ref), assert_non_null(mag);
    for (int r = 0; r < m; r++)
        for (int t = 0; t < taps; t++)
            for (int p = 0; p < pairs; p++)
                w8[(((size_t)(r / 8) * taps + t) * pairs + p) * 8 + r % 8] = random_pair();
    for (size_t i = 0; i < (size_t)pairs * plane; i++) x[i] = random_pair();
    for (int r = 0; r < mb; r++)
        for (int q = 0; q < nq; q++)
            for (int t = 0; t < taps; t++)
                for (int p = 0; p < pairs; p++)
                    ref[(size_t)r * nq + q] +=
                        dot(w8[(((size_t)(r / 8) * taps + t) * pairs + p) * 8 + r % 8],
                            x[(size_t)p * plane + q + off[t]], &mag[(size_t)r * nq + q]);
    memcpy(packed, w8, words * sizeof *packed);
    if (k->conv_order) k->conv_order(packed, taps, pairs, m, tmp);
    for (size_t i = 0; i < (size_t)mb * ldo; i++) out[i] = NAN;
    k->conv_run(taps, off, pairs, m, packed, x, plane, nq, out, ldo);
    for (int r = 0; r < mb; r++) {
        for (int q = 0; q < nq; q++) {
            const double got = out[(size_t)r * ldo + q], want = ref[(size_t)r * nq + q];
            if (!close_to(got, want, 2 * taps * pairs, mag[(size_t)r * nq + q]))
                fail_msg("%s conv_run taps %d pairs %d m %d nq %d: out[%d][%d] = %.9g, want %.9g",
                         name, taps, pairs, m, nq, r, q, got, want);
        }
        for (size_t q = (size_t)nq; q < ldo; q++)
            if (!isnan(out[(size_t)r * ldo + q]))
                fail_msg("%s conv_run: wrote out[%d][%zu] past nq %d", name, r, q, nq);
    }
    if (has_avx512_bf16()) { /* the AVX512_BF16 kernel on the 8-row pack agrees */
        float *o2 = malloc((size_t)mb * ldo * sizeof *o2);
        assert_non_null(o2);
        cf_bf16_kernels_avx512.conv_run(taps, off, pairs, m, w8, x, plane, nq, o2, ldo);
        for (int r = 0; r < mb; r++)
            for (int q = 0; q < nq; q++)
                if (!close_to(out[(size_t)r * ldo + q], o2[(size_t)r * ldo + q], 4 * taps * pairs,
                              mag[(size_t)r * nq + q]))
                    fail_msg("%s conv_run against avx512_bf16: [%d][%d] %.9g and %.9g", name, r, q,
                             (double)out[(size_t)r * ldo + q], (double)o2[(size_t)r * ldo + q]);
        free(o2);
    }
    free(w8), free(packed), free(tmp), free(x), free(out), free(ref), free(mag);
}

static void test_conv_run(void **state) {
    (void)state;
    say_amx();
    const unsigned long faults = cf_amx_emul_faults();
    kernel_set sets[2];
    const int n = kernel_sets(sets);
    static const int taps[] = {1, 9}, pairs[] = {1, 3, 16, 21, 40}, rows[] = {5, 8, 16, 24, 33},
                     nqs[] = {16, 32, 48, 80};
    int checked = 0;
    for (int s = 0; s < n; s++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 5; b++)
                for (int c = 0; c < 5; c++)
                    for (int d = 0; d < 4; d++, checked++)
                        check_conv_run(&sets[s].k, sets[s].name, taps[a], pairs[b], rows[c],
                                       nqs[d]);
    assert_int_equal(checked, n * 200);
    expect_no_faults(faults, __func__);
}

/* ---- conv_wgrad -------------------------------------------------------------------------------
 */

static void check_conv_wgrad(const cf_bf16_kernels *k, const char *name, int taps, int m, int ch,
                             int nq2, bool accumulate) {
    int half[9];
    unsigned char odd[9];
    int maxhalf = 0;
    for (int t = 0; t < taps; t++) {
        half[t] = (int)(next_u32() % 11u);
        odd[t] = (unsigned char)(next_u32() & 1u);
        if (half[t] > maxhalf) maxhalf = half[t];
    }
    const int mb = (int)up((size_t)m, 8), brows = nq2 + maxhalf;
    const size_t lda = (size_t)nq2 + 2, ldb = up((size_t)ch, 16), ldo = (size_t)ch + 2,
                 tapo = (size_t)m * ldo + 5, outn = (size_t)taps * tapo;
    uint32_t *a = malloc((size_t)mb * lda * sizeof *a), *b0 = calloc((size_t)brows * ldb, 4),
             *b1 = calloc((size_t)brows * ldb, 4);
    float *out = malloc(outn * sizeof *out), *before = malloc(outn * sizeof *before);
    assert_non_null(a), assert_non_null(b0), assert_non_null(b1), assert_non_null(out);
    assert_non_null(before);
    for (size_t i = 0; i < (size_t)mb * lda; i++) a[i] = random_pair();
    for (int r = 0; r < brows; r++)
        for (int c = 0; c < ch; c++) {
            b0[(size_t)r * ldb + c] = random_pair();
            b1[(size_t)r * ldb + c] = random_pair();
        }
    for (size_t i = 0; i < outn; i++) before[i] = out[i] = uniform();
    k->conv_wgrad(taps, half, odd, m, ch, nq2, a, lda, b0, b1, ldb, out, ldo, tapo, accumulate);
    for (int t = 0; t < taps; t++) {
        const uint32_t *b = (odd[t] ? b1 : b0) + (size_t)half[t] * ldb;
        for (int r = 0; r < m; r++)
            for (int c = 0; c < (int)ldo; c++) {
                const size_t i = (size_t)t * tapo + (size_t)r * ldo + c;
                if (c >= ch) {
                    if (out[i] != before[i])
                        fail_msg("%s conv_wgrad: wrote column %d past ch %d", name, c, ch);
                    continue;
                }
                double want = accumulate ? before[i] : 0, mag = fabs(want);
                for (int q = 0; q < nq2; q++)
                    want += dot(a[(size_t)r * lda + q], b[(size_t)q * ldb + c], &mag);
                if (!close_to(out[i], want, 2 * nq2 + 1, mag))
                    fail_msg("%s conv_wgrad taps %d m %d ch %d nq2 %d acc %d: [%d][%d][%d] = %.9g, "
                             "want %.9g",
                             name, taps, m, ch, nq2, accumulate, t, r, c, (double)out[i], want);
            }
    }
    for (int t = 0; t < taps; t++) /* the gaps between taps' blocks */
        for (size_t i = (size_t)t * tapo + (size_t)m * ldo; i < (size_t)(t + 1) * tapo; i++)
            if (out[i] != before[i]) fail_msg("%s conv_wgrad: wrote past row %d", name, m);
    free(a), free(b0), free(b1), free(out), free(before);
}

static void test_conv_wgrad(void **state) {
    (void)state;
    say_amx();
    const unsigned long faults = cf_amx_emul_faults();
    kernel_set sets[2];
    const int n = kernel_sets(sets);
    static const int taps[] = {1, 4}, rows[] = {3, 8, 16, 21, 35}, chs[] = {1, 7, 16, 17, 40},
                     nq2s[] = {1, 15, 16, 40, 77};
    int checked = 0;
    for (int s = 0; s < n; s++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 5; b++)
                for (int c = 0; c < 5; c++)
                    for (int d = 0; d < 5; d++, checked++)
                        check_conv_wgrad(&sets[s].k, sets[s].name, taps[a], rows[b], chs[c],
                                         nq2s[d], (b + c + d) % 2 == 1);
    assert_int_equal(checked, n * 250);
    expect_no_faults(faults, __func__);
}

/* ---- the GEMM ---------------------------------------------------------------------------------
 */

static void check_gemm(const cf_bf16_kernels *k, const char *name, int m, int n, int kk, bool ta,
                       bool tb, bool accumulate) {
    const int lda = (ta ? m : kk) + 1, ldb = (tb ? kk : n) + 2, ldc = n + 3;
    const size_t an = (size_t)(ta ? kk : m) * lda, bn = (size_t)(tb ? n : kk) * ldb,
                 cn = (size_t)m * ldc;
    float *a = malloc(an * sizeof *a), *b = malloc(bn * sizeof *b), *c = malloc(cn * sizeof *c),
          *c0 = malloc(cn * sizeof *c0);
    assert_non_null(a), assert_non_null(b), assert_non_null(c), assert_non_null(c0);
    for (size_t i = 0; i < an; i++) a[i] = uniform();
    for (size_t i = 0; i < bn; i++) b[i] = uniform();
    for (size_t i = 0; i < cn; i++) c0[i] = c[i] = uniform();
    assert_true(k->gemm(ta, tb, m, n, kk, a, lda, b, ldb, c, ldc, accumulate));
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            const size_t at = (size_t)i * ldc + j;
            if (j >= n) {
                if (c[at] != c0[at]) fail_msg("%s gemm: wrote C[%d][%d] past n %d", name, i, j, n);
                continue;
            }
            double want = accumulate ? c0[at] : 0, mag = fabs(want);
            for (int p = 0; p < kk; p++) {
                const double av = cf_bf16_round(ta ? a[(size_t)p * lda + i]
                                                   : a[(size_t)i * lda + p]),
                             bv = cf_bf16_round(tb ? b[(size_t)j * ldb + p]
                                                   : b[(size_t)p * ldb + j]);
                want += av * bv;
                mag += fabs(av * bv);
            }
            if (!close_to(c[at], want, kk + 1, mag))
                fail_msg("%s gemm %dx%dx%d ta %d tb %d acc %d: C[%d][%d] = %.9g, want %.9g", name,
                         m, n, kk, ta, tb, accumulate, i, j, (double)c[at], want);
        }
    free(a), free(b), free(c), free(c0);
}

/* An element's value does not depend on the shape around it: the first rows and columns of a
 * product, accumulating, bitwise those of a larger one (edges fall elsewhere, as a batch's size
 * moves them). */
static void check_gemm_shape_independent(const cf_bf16_kernels *k, const char *name, bool ta,
                                         bool tb) {
    enum { M = 45, N = 50, K = 37, M2 = 13, N2 = 20 };
    static float a[M * K], b[K * N], c[M * N], c2[M * N], c0[M * N];
    for (int i = 0; i < M * K; i++) a[i] = uniform();
    for (int i = 0; i < K * N; i++) b[i] = uniform();
    for (int i = 0; i < M * N; i++) c0[i] = c[i] = c2[i] = uniform();
    /* A as M x K (or K x M transposed), B as K x N (or N x K), C with row stride N */
    assert_true(k->gemm(ta, tb, M, N, K, a, ta ? M : K, b, tb ? K : N, c, N, true));
    assert_true(k->gemm(ta, tb, M2, N2, K, a, ta ? M : K, b, tb ? K : N, c2, N, true));
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const float want = i < M2 && j < N2 ? c[i * N + j] : c0[i * N + j];
            if (memcmp(&c2[i * N + j], &want, sizeof want) != 0)
                fail_msg("%s gemm ta %d tb %d: C[%d][%d] of %dx%d = %.9g, of %dx%d %.9g", name, ta,
                         tb, i, j, M2, N2, (double)c2[i * N + j], M, N, (double)want);
        }
}

static void test_gemm(void **state) {
    (void)state;
    say_amx();
    const unsigned long faults = cf_amx_emul_faults();
    kernel_set sets[2];
    const int n = kernel_sets(sets);
    static const int shapes[][3] = {{1, 1, 1},    {16, 16, 32}, {32, 32, 32},
                                    {17, 33, 5},  {40, 70, 99}, {64, 32, 33},
                                    {5, 100, 64}, {33, 17, 31}, {48, 40, 200}};
    for (int s = 0; s < n; s++)
        for (int i = 0; i < 9; i++)
            for (int v = 0; v < 8; v++)
                check_gemm(&sets[s].k, sets[s].name, shapes[i][0], shapes[i][1], shapes[i][2],
                           v & 1, v & 2, v & 4);
    for (int s = 0; s < n; s++)
        for (int v = 0; v < 4; v++)
            check_gemm_shape_independent(&sets[s].k, sets[s].name, v & 1, v & 2);
    expect_no_faults(faults, __func__);
}

/* ---- the whole convolution and cf_sgemm_bf16 with the amx kernels in the active table ----------
 */

static cf_kernel_table emul_table;
static cf_bf16_kernels emul_bf16;

typedef struct conv_case {
    int c, o, h, w, k, s, pad;
} conv_case;

typedef struct conv_result {
    float *y, *dx, *dw;
} conv_result;

static void conv_run_all(const conv_case *cc, const float *w, const float *x, const float *dy,
                         int n, conv_result *r) {
    cf_conv_geom g;
    assert_true(
        cf_conv_geom_init(&g, cc->c, cc->h, cc->w, cc->k, cc->k, cc->s, cc->s, cc->pad, cc->pad));
    assert_true(cf_conv_bf16_supported(&g, cc->o));
    const size_t pn = cf_conv_bf16_packed_floats(&g, cc->o), sn = cf_conv_bf16_scratch(&g, cc->o);
    float *packed = malloc(pn * sizeof *packed), *scratch = malloc(sn * sizeof *scratch);
    assert_non_null(packed), assert_non_null(scratch);
    const size_t yn = (size_t)n * cc->o * g.oh * g.ow, xn = (size_t)n * cc->c * cc->h * cc->w,
                 wn = (size_t)cc->o * cc->c * cc->k * cc->k;
    r->y = malloc(yn * sizeof(float));
    r->dx = malloc(xn * sizeof(float));
    r->dw = malloc(wn * sizeof(float));
    assert_non_null(r->y), assert_non_null(r->dx), assert_non_null(r->dw);
    cf_conv_bf16_pack(&g, cc->o, w, packed);
    cf_conv_bf16_forward(&g, cc->o, packed, x, n, r->y, scratch);
    cf_conv_bf16_dx(&g, cc->o, packed, dy, n, r->dx, scratch);
    cf_conv_bf16_wgrad(&g, cc->o, dy, x, n, r->dw, scratch);
    free(packed), free(scratch);
}

static void expect_close(const char *what, const char *name, const conv_case *cc, const float *got,
                         const float *want, size_t n) {
    double scale = 1;
    for (size_t i = 0; i < n; i++)
        if (fabs(want[i]) > scale) scale = fabs(want[i]);
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= 1e-4 * scale))
            fail_msg("%s %s (c %d o %d %dx%d k %d s %d): [%zu] = %.9g, avx512_bf16 %.9g", name,
                     what, cc->c, cc->o, cc->h, cc->w, cc->k, cc->s, i, (double)got[i],
                     (double)want[i]);
}

/* The amx table under test against the avx512_bf16 level's results. */
static void compare_levels(const cf_kernel_table *amx, const char *name) {
    static const conv_case cases[] = {{3, 8, 8, 8, 3, 1, 1},
                                      {16, 16, 7, 7, 3, 1, 1},
                                      {33, 20, 6, 5, 3, 1, 1},
                                      {40, 35, 4, 4, 3, 1, 1},
                                      {8, 16, 8, 8, 3, 2, 1},
                                      {17, 24, 6, 6, 3, 2, 1},
                                      {16, 32, 8, 8, 1, 2, 0},
                                      {9, 13, 7, 7, 1, 2, 0},
                                      {6, 10, 9, 9, 5, 1, 2},
                                      {34, 18, 10, 10, 5, 2, 2},
                                      /* small planes on wide layers: the gathered taps */
                                      {128, 136, 4, 4, 3, 1, 1},
                                      {130, 128, 6, 6, 3, 2, 1}};
    const int n = 3;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const conv_case *cc = &cases[ci];
        cf_conv_geom g;
        assert_true(cf_conv_geom_init(&g, cc->c, cc->h, cc->w, cc->k, cc->k, cc->s, cc->s, cc->pad,
                                      cc->pad));
        const size_t yn = (size_t)n * cc->o * g.oh * g.ow, xn = (size_t)n * cc->c * cc->h * cc->w,
                     wn = (size_t)cc->o * cc->c * cc->k * cc->k;
        float *w = malloc(wn * sizeof *w), *x = malloc(xn * sizeof *x), *dy = malloc(yn * 4);
        assert_non_null(w), assert_non_null(x), assert_non_null(dy);
        for (size_t i = 0; i < wn; i++) w[i] = uniform();
        for (size_t i = 0; i < xn; i++) x[i] = uniform();
        for (size_t i = 0; i < yn; i++) dy[i] = uniform();
        conv_result want, got;
        assert_int_equal(cf_set_isa(CF_ISA_AVX512_BF16), CF_ISA_AVX512_BF16);
        conv_run_all(cc, w, x, dy, n, &want);
        cf_active_kernels = amx;
        conv_run_all(cc, w, x, dy, n, &got);
        cf_set_isa(CF_ISA_AVX512_BF16);
        expect_close("forward", name, cc, got.y, want.y, yn);
        expect_close("dx", name, cc, got.dx, want.dx, xn);
        expect_close("wgrad", name, cc, got.dw, want.dw, wn);
        free(want.y), free(want.dx), free(want.dw), free(got.y), free(got.dx), free(got.dw);
        free(w), free(x), free(dy);
    }
    /* cf_sgemm_bf16 through the table */
    static const int shapes[][3] = {{64, 48, 100}, {20, 70, 33}, {8, 40, 16}};
    for (int i = 0; i < 3; i++)
        for (int v = 0; v < 4; v++) {
            const int m = shapes[i][0], nn = shapes[i][1], k = shapes[i][2];
            const bool ta = v & 1, tb = v & 2;
            float *a = malloc((size_t)m * k * 4), *b = malloc((size_t)k * nn * 4),
                  *c1 = malloc((size_t)m * nn * 4), *c2 = malloc((size_t)m * nn * 4);
            assert_non_null(a), assert_non_null(b), assert_non_null(c1), assert_non_null(c2);
            for (int j = 0; j < m * k; j++) a[j] = uniform();
            for (int j = 0; j < k * nn; j++) b[j] = uniform();
            cf_sgemm_bf16(ta, tb, m, nn, k, a, ta ? m : k, b, tb ? k : nn, c1, nn, false);
            cf_active_kernels = amx;
            cf_sgemm_bf16(ta, tb, m, nn, k, a, ta ? m : k, b, tb ? k : nn, c2, nn, false);
            cf_set_isa(CF_ISA_AVX512_BF16);
            const conv_case none = {0, 0, m, nn, k, 0, 0};
            expect_close("cf_sgemm_bf16", name, &none, c2, c1, (size_t)m * nn);
            free(a), free(b), free(c1), free(c2);
        }
}

static void test_whole_convolution(void **state) {
    (void)state;
    if (!has_avx512_bf16()) {
        print_message("no AVX512_BF16 on this CPU: the whole-convolution comparison needs it\n");
        skip();
    }
    const cf_isa before = cf_isa_active();
    const unsigned long faults = cf_amx_emul_faults();
    assert_true(cf_test_emulated_amx(&emul_table, &emul_bf16));
    compare_levels(&emul_table, "emulated");
    if (has_amx()) {
        assert_int_equal(cf_set_isa(CF_ISA_AMX), CF_ISA_AMX);
        const cf_kernel_table *real = cf_active_kernels;
        assert_non_null(real->bf16->conv_order);
        compare_levels(real, "amx");
    } else
        say_amx();
    cf_set_isa(before);
    assert_int_equal(cf_isa_active(), before);
    expect_no_faults(faults, __func__);
}

/* ---- the level --------------------------------------------------------------------------------
 */

static void test_level(void **state) {
    (void)state;
    cf_isa parsed = CF_ISA_GENERIC;
    assert_true(cf_isa_parse("amx", &parsed));
    assert_int_equal(parsed, CF_ISA_AMX);
    assert_int_equal(CF_ISA_AMX, 5);
    assert_int_equal(CF_ISA_NEON, 4);
    assert_string_equal(cf_isa_name(CF_ISA_AMX), "amx");
    const cf_isa before = cf_isa_active(), best = cf_isa_best();
    const char *env = getenv("CF_ISA");
    print_message("CF_ISA=%s: kernels %s, best %s\n", env ? env : "", cf_isa_name(before),
                  cf_isa_name(best));
    /* CF_ISA=amx on a CPU without AMX: the best level it has */
    if (env && strcmp(env, "amx") == 0) assert_int_equal(before, best);
    /* a cap of amx, or of neon on x86-64, is the best the CPU has; avx512_bf16 caps amx */
    assert_int_equal(cf_set_isa(CF_ISA_AMX), best);
    assert_int_equal(cf_set_isa(CF_ISA_NEON), best);
    const cf_isa capped = cf_set_isa(CF_ISA_AVX512_BF16);
    assert_int_equal(capped, best == CF_ISA_AMX ? CF_ISA_AVX512_BF16 : best);
    if (best == CF_ISA_AMX) {
        cf_set_isa(CF_ISA_AMX);
        assert_true(cf_bf16_compute());
        assert_ptr_not_equal(cf_active_kernels->bf16->conv_run, cf_bf16_kernels_avx512.conv_run);
        assert_non_null(cf_active_kernels->bf16->conv_order);
        cf_set_isa(CF_ISA_AVX512_BF16);
        assert_null(cf_active_kernels->bf16->conv_order); /* the avx512 pack unchanged */
    }
    cf_set_isa(before);
    assert_int_equal(cf_isa_active(), before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_level),
        cmocka_unit_test(test_conv_run),
        cmocka_unit_test(test_conv_wgrad),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_whole_convolution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else
static void test_not_x86(void **state) {
    (void)state;
    print_message("the amx level is x86-64's\n");
    skip();
}
int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_not_x86)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
