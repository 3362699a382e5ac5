/* The bf16 Winograd's weight packs and the level that reads them (src/tensor/winograd.c).
 *
 * cf_conv_winograd_pack_bf16 (and _pack_dx_bf16) write, where the active level's bf16 GEMM takes
 * a pre-packed A (avx512_bf16's gemm_pack_a, gemm_pack_a_rows), each point's matrix packed for
 * it and no fp32 planes; elsewhere (the amx level, whose tile GEMM packs its own A; levels
 * without bf16 kernels) the fp32 planes. A stamp names the form. Checked here, forward and dx:
 *   - a pack of the planes (made at amx or avx512), read at avx512_bf16, gives the pass of a
 *     fresh pack made there, bitwise (the packed words are gemm_pack_a's of those planes, and
 *     gemm_packed is bitwise the GEMM on them): a planes pack was once read as a packed one
 *     (NaN or garbage, no error);
 *   - a packed pack (made at avx512_bf16), read at amx, gives the pass of a fresh amx pack,
 *     bitwise (its bf16 values unpacked, which the tile GEMM would round the planes to);
 *   - the same read at avx512 (no bf16 products) gives the fp32 pass on the transformed weights
 *     rounded to bf16, bitwise (the only values the pack holds).
 * The backward (cf_conv_winograd_backward_bf16, block by block and the two calls in turn) reads
 * a pack of another level as dx does (test_backward_of_another_level), and where gemm_packed
 * refuses, the point unpacked into the scratch gives the same bits (test_gemm_packed_refused).
 * And the words themselves (test_pack_words): gemm_pack_a's of the fp32 planes, bitwise, from the
 * level's wino_pack_a and from the staging path without it, with kernels that show the
 * transform's order of sums.
 * Shapes with rows of 16 and with a last part of a staging block (21, 24 rows), odd channel
 * counts (an odd k, padded). The amx level is the scalar emulation of its tiles
 * (isa_amx_emul.c), so this runs on any CPU with AVX512_BF16 (skipped without). */
#include "oracle.h"

#include "amx_emul.h"
#include "tensor/amx.h"
#include "tensor/kernel_table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
static cf_kernel_table emul_table;
static cf_bf16_kernels emul_bf16;

/* The emulated amx table (as amx_emul_main.c), built from the avx512_bf16 one. */
static const cf_kernel_table *emulated_amx(void) {
    assert_true(cf_test_emulated_amx(&emul_table, &emul_bf16));
    return &emul_table;
}

enum { AT_AMX, AT_AVX512, AT_AVX512_BF16 };

static const char *level_name(int at) {
    return at == AT_AMX ? "amx" : at == AT_AVX512 ? "avx512" : "avx512_bf16";
}

static void set_level(int at) {
    if (at == AT_AMX)
        cf_active_kernels = emulated_amx();
    else if (at == AT_AVX512)
        assert_int_equal(cf_set_isa(CF_ISA_AVX512), CF_ISA_AVX512);
    else
        assert_int_equal(cf_set_isa(CF_ISA_AVX512_BF16), CF_ISA_AVX512_BF16);
}

/* The forward pass (dx: false) or dx of n images at level `to`, with weights packed at `from`,
 * against what `to` gives on its own pack (at avx512, which has no bf16 products, with the fp32
 * planes rounded to bf16 when `from` makes packed packs): the same bits. */
static void check(int from, int to, bool dx, int n, int c, int h, int w, int k) {
    emulated_amx();
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, 3, 3, 1, 1, 1, 1));
    assert_true(cf_conv_winograd_supported(&g));
    const int cin = dx ? k : c, cout = dx ? c : k;
    const size_t np = cf_conv_winograd_packed_size_bf16(&g, k), nin = (size_t)n * cin * h * w,
                 nout = (size_t)n * cout * h * w, nw = (size_t)k * c * 9;
    float *wt = malloc(nw * sizeof(float)), *in = malloc(nin * sizeof(float)),
          *stale = malloc(np * sizeof(float)), *fresh = malloc(np * sizeof(float)),
          *scratch = malloc(cf_conv_winograd_scratch_bf16(&g, k) * sizeof(float)),
          *got = malloc(nout * sizeof(float)), *want = malloc(nout * sizeof(float));
    fill_uniform(wt, nw, 61, -0.2f, 0.2f);
    fill_uniform(in, nin, 62, -1.0f, 1.0f);
    /* what a pack's unwritten part may hold (an arena block is not zeroed) */
    memset(stale, 0xff, np * sizeof(float));
    memset(fresh, 0xff, np * sizeof(float));
    set_level(from);
    if (dx)
        cf_conv_winograd_pack_dx_bf16(&g, k, wt, stale);
    else
        cf_conv_winograd_pack_bf16(&g, k, wt, stale);
    set_level(to);
    if (dx)
        cf_conv_winograd_dx_bf16(&g, k, stale, in, n, got, scratch);
    else
        cf_conv_winograd_forward_bf16(&g, k, stale, in, n, got, scratch);
    if (to == AT_AVX512 && from == AT_AVX512_BF16) {
        /* the fp32 pass on the fp32 pack's planes rounded */
        const size_t planes = cf_conv_winograd_packed_size(&g, k);
        if (dx)
            cf_conv_winograd_pack_dx(&g, k, wt, fresh);
        else
            cf_conv_winograd_pack(&g, k, wt, fresh);
        for (size_t i = 0; i < planes; i++) fresh[i] = cf_bf16_round(fresh[i]);
        if (dx)
            cf_conv_winograd_dx(&g, k, fresh, in, n, want, scratch);
        else
            cf_conv_winograd_forward(&g, k, fresh, in, n, want, scratch);
    } else if (dx) {
        cf_conv_winograd_pack_dx_bf16(&g, k, wt, fresh);
        cf_conv_winograd_dx_bf16(&g, k, fresh, in, n, want, scratch);
    } else {
        cf_conv_winograd_pack_bf16(&g, k, wt, fresh);
        cf_conv_winograd_forward_bf16(&g, k, fresh, in, n, want, scratch);
    }
    size_t bad = nout; /* the first value that differs (freed before the test fails) */
    bool finite = true;
    for (size_t i = 0; i < nout; i++) {
        if (bad == nout && memcmp(&got[i], &want[i], sizeof(float)) != 0) bad = i;
        if (!isfinite(want[i])) finite = false;
    }
    const double g0 = bad < nout ? got[bad] : 0, w0 = bad < nout ? want[bad] : 0;
    free(wt), free(in), free(stale), free(fresh), free(scratch), free(got), free(want);
    if (!finite) fail_msg("%s: a value of the fresh pass is not finite", dx ? "dx" : "forward");
    if (bad < nout)
        fail_msg("%s of %d -> %d channels, %dx%d: packed at %s, run at %s: value %zu is %.9g, "
                 "its own pack gives %.9g",
                 dx ? "dx" : "forward", c, k, h, w, level_name(from), level_name(to), bad, g0, w0);
}

static void test_pack_of_another_level(void **state) {
    (void)state;
    const cf_isa best = cf_isa_best();
    if (best != CF_ISA_AVX512_BF16 && best != CF_ISA_AMX) skip();
    const cf_isa before = cf_isa_active();
    static const struct {
        int from, to;
    } pairs[] = {{AT_AMX, AT_AVX512_BF16},
                 {AT_AVX512, AT_AVX512_BF16},
                 {AT_AVX512_BF16, AT_AMX},
                 {AT_AVX512_BF16, AT_AVX512}};
    static const int shapes[][5] = {{2, 32, 28, 28, 24}, {1, 19, 9, 11, 21}, {1, 40, 6, 6, 33}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int dx = 0; dx < 2; dx++)
                check(pairs[p].from, pairs[p].to, dx, shapes[s][0], shapes[s][1], shapes[s][2],
                      shapes[s][3], shapes[s][4]);
    cf_set_isa(before);
}
/* cf_conv_winograd_backward_bf16 at level `to` with the dx pack made at `from`: its dx and du
 * against cf_conv_winograd_dx_bf16 and _wgrad_bf16 at `to` on the same pack (which check()
 * holds to the pack made at `to`), bitwise. n images of c -> k channels; c k above 128 x 128
 * takes the two calls in turn, below it block by block. The backward once read another level's
 * packed words as fp32 planes. */
static void check_backward(int from, int to, int n, int c, int h, int w, int k) {
    emulated_amx();
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, 3, 3, 1, 1, 1, 1));
    const size_t np = cf_conv_winograd_packed_size_bf16(&g, k), nx = (size_t)n * c * h * w,
                 ny = (size_t)n * k * h * w, nw = (size_t)k * c * 9, ndu = (size_t)16 * c * k;
    float *wt = malloc(nw * sizeof(float)), *x = malloc(nx * sizeof(float)),
          *dy = malloc(ny * sizeof(float)), *u = malloc(np * sizeof(float)),
          *scratch = malloc(cf_conv_winograd_scratch_bf16(&g, k) * sizeof(float)),
          *dx = malloc(nx * sizeof(float)), *dx_want = malloc(nx * sizeof(float)),
          *du = malloc(ndu * sizeof(float)), *du_want = malloc(ndu * sizeof(float));
    fill_uniform(wt, nw, 71, -0.2f, 0.2f);
    fill_uniform(x, nx, 72, -1.0f, 1.0f);
    fill_uniform(dy, ny, 73, -1.0f, 1.0f);
    memset(u, 0xff, np * sizeof(float));
    set_level(from);
    cf_conv_winograd_pack_dx_bf16(&g, k, wt, u);
    set_level(to);
    cf_conv_winograd_backward_bf16(&g, k, u, dy, x, n, du, false, dx, scratch);
    cf_conv_winograd_wgrad_bf16(&g, k, dy, x, n, du_want, false, scratch);
    cf_conv_winograd_dx_bf16(&g, k, u, dy, n, dx_want, scratch);
    size_t bad_dx = nx, bad_du = ndu;
    for (size_t i = 0; i < nx && bad_dx == nx; i++)
        if (memcmp(&dx[i], &dx_want[i], sizeof(float)) != 0 || !isfinite(dx_want[i])) bad_dx = i;
    for (size_t i = 0; i < ndu && bad_du == ndu; i++)
        if (memcmp(&du[i], &du_want[i], sizeof(float)) != 0) bad_du = i;
    const double gx = bad_dx < nx ? dx[bad_dx] : 0, wx = bad_dx < nx ? dx_want[bad_dx] : 0;
    free(wt), free(x), free(dy), free(u), free(scratch), free(dx), free(dx_want), free(du),
        free(du_want);
    if (bad_dx < nx)
        fail_msg("backward of %d -> %d channels, %dx%d, %d images: packed at %s, run at %s: dx "
                 "value %zu is %.9g, cf_conv_winograd_dx_bf16 gives %.9g",
                 c, k, h, w, n, level_name(from), level_name(to), bad_dx, gx, wx);
    if (bad_du < ndu)
        fail_msg("backward of %d -> %d channels: packed at %s, run at %s: du value %zu differs "
                 "from cf_conv_winograd_wgrad_bf16's",
                 c, k, level_name(from), level_name(to), bad_du);
}

static void test_backward_of_another_level(void **state) {
    (void)state;
    const cf_isa best = cf_isa_best();
    if (best != CF_ISA_AVX512_BF16 && best != CF_ISA_AMX) skip();
    const cf_isa before = cf_isa_active();
    static const int pairs[][2] = {{AT_AVX512_BF16, AT_AMX},
                                   {AT_AVX512_BF16, AT_AVX512},
                                   {AT_AMX, AT_AVX512_BF16},
                                   {AT_AVX512_BF16, AT_AVX512_BF16}};
    /* several blocks of images (3 x 16x16), odd channels and sizes, 1 image, c k > 128 x 128 */
    static const int shapes[][5] = {
        {3, 24, 16, 16, 16}, {1, 19, 9, 11, 21}, {2, 17, 5, 7, 16}, {1, 129, 4, 4, 128}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_backward(pairs[p][0], pairs[p][1], shapes[s][0], shapes[s][1], shapes[s][2],
                           shapes[s][3], shapes[s][4]);
    cf_set_isa(before);
}

static int refusals;

/* gemm_packed as when its panel scratch cannot be had (out of memory) */
static bool gemm_packed_refused(int m, int n, int k, const uint32_t *packed_a, bool trans_b,
                                const float *b, int ldb, float *c, int ldc, bool accumulate) {
    (void)m, (void)n, (void)k, (void)packed_a, (void)trans_b, (void)b, (void)ldb, (void)c,
        (void)ldc, (void)accumulate;
    refusals++;
    return false;
}

/* Where gemm_packed refuses, the forward pass and dx unpack the point into the scratch and take
 * cf_sgemm_bf16: bitwise the pass through gemm_packed (the products once went NaN when a
 * further allocation failed; now nothing is allocated). The fused path (input_pairs) does not
 * call gemm_packed, so it is turned off here. */
static void test_gemm_packed_refused(void **state) {
    (void)state;
    const cf_isa best = cf_isa_best();
    if (best != CF_ISA_AVX512_BF16 && best != CF_ISA_AMX) skip();
    const cf_isa before = cf_isa_active();
    static const int shapes[][5] = {{2, 24, 12, 12, 16}, {1, 19, 9, 11, 21}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int dx = 0; dx < 2; dx++) {
            const int n = shapes[s][0], c = shapes[s][1], h = shapes[s][2], w = shapes[s][3],
                      k = shapes[s][4];
            assert_int_equal(cf_set_isa(CF_ISA_AVX512_BF16), CF_ISA_AVX512_BF16);
            cf__winograd_set_fused(false);
            cf_conv_geom g;
            assert_true(cf_conv_geom_init(&g, c, h, w, 3, 3, 1, 1, 1, 1));
            const int cin = dx ? k : c, cout = dx ? c : k;
            const size_t np = cf_conv_winograd_packed_size_bf16(&g, k),
                         nin = (size_t)n * cin * h * w, nout = (size_t)n * cout * h * w,
                         nw = (size_t)k * c * 9;
            float *wt = malloc(nw * sizeof(float)), *in = malloc(nin * sizeof(float)),
                  *u = malloc(np * sizeof(float)),
                  *scratch = malloc(cf_conv_winograd_scratch_bf16(&g, k) * sizeof(float)),
                  *got = malloc(nout * sizeof(float)), *want = malloc(nout * sizeof(float));
            fill_uniform(wt, nw, 81, -0.2f, 0.2f);
            fill_uniform(in, nin, 82, -1.0f, 1.0f);
            if (dx) {
                cf_conv_winograd_pack_dx_bf16(&g, k, wt, u);
                cf_conv_winograd_dx_bf16(&g, k, u, in, n, want, scratch);
            } else {
                cf_conv_winograd_pack_bf16(&g, k, wt, u);
                cf_conv_winograd_forward_bf16(&g, k, u, in, n, want, scratch);
            }
            static cf_kernel_table table;
            static cf_bf16_kernels refusing;
            table = *cf_active_kernels;
            refusing = *table.bf16;
            refusing.gemm_packed = gemm_packed_refused;
            table.bf16 = &refusing;
            cf_active_kernels = &table;
            refusals = 0;
            if (dx)
                cf_conv_winograd_dx_bf16(&g, k, u, in, n, got, scratch);
            else
                cf_conv_winograd_forward_bf16(&g, k, u, in, n, got, scratch);
            cf__winograd_set_fused(true);
            cf_set_isa(before);
            size_t bad = nout;
            for (size_t i = 0; i < nout && bad == nout; i++)
                if (memcmp(&got[i], &want[i], sizeof(float)) != 0 || !isfinite(want[i])) bad = i;
            const double g0 = bad < nout ? got[bad] : 0, w0 = bad < nout ? want[bad] : 0;
            free(wt), free(in), free(u), free(scratch), free(got), free(want);
            if (refusals == 0) fail_msg("gemm_packed was not called: the path is not covered");
            if (bad < nout)
                fail_msg("%s of %d -> %d channels with gemm_packed refusing: value %zu is %.9g, "
                         "against %.9g",
                         dx ? "dx" : "forward", c, k, bad, g0, w0);
        }
    cf_set_isa(before);
}

/* The words of a bf16 pack made at avx512_bf16 (the transform straight into the packed A)
 * against gemm_pack_a on the fp32 pack's planes, point by point (the pack's first words, each
 * point's bound of 16-row blocks apart: winograd.c's layout), forward and dx. Some kernels
 * cancel so that the transform's order of sums shows in bf16: taps B, 1, -B (B = 2^24) down a
 * column give (B + 1) - B = 0 against (B - B) + 1 = 1, and along a row the same. */
static void check_words(int c, int k, bool staged) {
    assert_int_equal(cf_set_isa(CF_ISA_AVX512_BF16), CF_ISA_AVX512_BF16);
    /* staged: the level without wino_pack_a (the transform through the staging area and
     * gemm_pack_a_rows) */
    static cf_kernel_table table;
    static cf_bf16_kernels staged_bf16;
    if (staged) {
        table = *cf_active_kernels;
        staged_bf16 = *table.bf16;
        staged_bf16.wino_pack_a = NULL;
        table.bf16 = &staged_bf16;
        cf_active_kernels = &table;
    }
    const cf_bf16_kernels *bk = cf_active_kernels->bf16;
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, 8, 8, 3, 3, 1, 1, 1, 1));
    const size_t nw = (size_t)k * c * 9, np = cf_conv_winograd_packed_size_bf16(&g, k),
                 planes = cf_conv_winograd_packed_size(&g, k);
    float *wt = malloc(nw * sizeof(float)), *u = malloc(np * sizeof(float)),
          *f = malloc(planes * sizeof(float));
    fill_uniform(wt, nw, 63, -0.3f, 0.3f);
    static const float cancel[3] = {16777216.0f, 1.0f, -16777216.0f};
    for (size_t kernel = 0; kernel < (size_t)k * c; kernel += 5)
        for (int t = 0; t < 9; t++) wt[kernel * 9 + t] = kernel % 2 ? cancel[t / 3] : cancel[t % 3];
    /* values the rounding treats apart (wino_pack_a rounds on vcvtne2ps2bf16, which reads a
     * subnormal as zero, and takes cf__bf16_round_lanes where a vector holds one): kernels of
     * subnormals (their transforms subnormal too), one NaN tap, one infinite tap (one special
     * a kernel, so that no two NaNs meet and the payload cannot depend on the order of operands) */
    for (size_t kernel = 3; kernel < (size_t)k * c; kernel += 11) {
        float *kt = wt + kernel * 9;
        switch (kernel % 4) {
        case 0:
            for (int t = 0; t < 9; t++) kt[t] = (float)(t - 4) * 1e-39f;
            break;
        case 1:
            kt[kernel % 9] = NAN;
            break;
        case 2:
            kt[kernel % 9] = kernel % 8 < 4 ? INFINITY : -INFINITY;
            break;
        default:
            kt[kernel % 9] = 3e-39f;
            break; /* one subnormal among normal taps */
        }
    }
    for (int dx = 0; dx < 2; dx++) {
        const int rows = dx ? c : k, cols = dx ? k : c;
        const size_t bound = (size_t)(rows + 15) / 16 * 16 * (size_t)((cols + 1) / 2),
                     words = bk->gemm_a_words(rows, cols);
        memset(u, 0xff, np * sizeof(float));
        if (dx) {
            cf_conv_winograd_pack_dx_bf16(&g, k, wt, u);
            cf_conv_winograd_pack_dx(&g, k, wt, f);
        } else {
            cf_conv_winograd_pack_bf16(&g, k, wt, u);
            cf_conv_winograd_pack(&g, k, wt, f);
        }
        uint32_t *want = malloc(words * sizeof(uint32_t));
        for (int xi = 0; xi < 16; xi++) {
            bk->gemm_pack_a(false, rows, cols, f + (size_t)xi * rows * cols, cols, want);
            const uint32_t *got = (const uint32_t *)u + (size_t)xi * bound;
            size_t bad = words;
            for (size_t i = 0; i < words && bad == words; i++)
                if (got[i] != want[i]) bad = i;
            const uint32_t gb = bad < words ? got[bad] : 0, wb = bad < words ? want[bad] : 0;
            if (bad < words) {
                free(want), free(wt), free(u), free(f);
                fail_msg("%s pack of %d -> %d channels%s, point %d: word %zu is %08x, "
                         "gemm_pack_a of the planes gives %08x",
                         dx ? "dx" : "forward", c, k, staged ? " (staged)" : "", xi, bad, gb, wb);
            }
        }
        free(want);
    }
    free(wt), free(u), free(f);
}

static void test_pack_words(void **state) {
    (void)state;
    const cf_isa best = cf_isa_best();
    if (best != CF_ISA_AVX512_BF16 && best != CF_ISA_AMX) skip();
    const cf_isa before = cf_isa_active();
    for (int staged = 0; staged < 2; staged++) {
        check_words(32, 24, staged);
        check_words(19, 21, staged);
        check_words(300, 40, staged); /* several k-blocks of pairs */
    }
    cf_set_isa(before);
}
#else
static void test_pack_of_another_level(void **state) {
    (void)state;
    skip();
}

static void test_backward_of_another_level(void **state) {
    (void)state;
    skip();
}

static void test_gemm_packed_refused(void **state) {
    (void)state;
    skip();
}

static void test_pack_words(void **state) {
    (void)state;
    skip();
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_of_another_level),
        cmocka_unit_test(test_pack_words),
        cmocka_unit_test(test_backward_of_another_level),
        cmocka_unit_test(test_gemm_packed_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
