/* The bf16 Winograd's weight packs and the level that reads them (src/tensor/winograd.c).
 *
 * cf_conv_winograd_pack_bf16 (and _pack_dx_bf16) write the fp32 transformed weights, then, only
 * where the active level's bf16 GEMM takes a pre-packed A (avx512_bf16's gemm_pack_a), each
 * point's matrix packed for it. The products (point_bf16) read that pre-packed A whenever the
 * level running them has one, without knowing whether the pack holds it: a pack made at the amx
 * level (whose tile GEMM packs its own A) or at a level without bf16 kernels (avx512), then read
 * at avx512_bf16, gave NaN or garbage with no error, the failure cf_conv_bf16_*'s stamped packs
 * refuse (test_bf16_level). Checked here: such a pack, read at avx512_bf16, gives the forward
 * pass and dx of a fresh pack made there (bitwise: the fp32 planes the pack always holds are the
 * same, and gemm_packed is bitwise the GEMM on them). The amx level is the scalar emulation of
 * its tiles (isa_amx_emul.c), so this runs on any CPU with AVX512_BF16 (skipped without). */
#include "oracle.h"

#include "amx_emul.h"
#include "tensor/amx.h"
#include "tensor/kernel_table.h"

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

enum { PACK_AMX, PACK_AVX512 };

/* Forward (dx: false) or dx (true) of n images at avx512_bf16, with weights packed at `from`
 * and with a fresh pack: the same bits. */
static void check(int from, bool dx, int n, int c, int h, int w, int k) {
    const cf_kernel_table *amx = emulated_amx();
    assert_int_equal(cf_set_isa(CF_ISA_AVX512_BF16), CF_ISA_AVX512_BF16);
    const cf_kernel_table *bf16 = cf_active_kernels;
    assert_non_null(bf16->bf16->gemm_pack_a); /* the level that reads a pre-packed A */
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
    if (from == PACK_AMX)
        cf_active_kernels = amx;
    else
        assert_int_equal(cf_set_isa(CF_ISA_AVX512), CF_ISA_AVX512);
    if (dx)
        cf_conv_winograd_pack_dx_bf16(&g, k, wt, stale);
    else
        cf_conv_winograd_pack_bf16(&g, k, wt, stale);
    assert_int_equal(cf_set_isa(CF_ISA_AVX512_BF16), CF_ISA_AVX512_BF16);
    if (dx) {
        cf_conv_winograd_pack_dx_bf16(&g, k, wt, fresh);
        cf_conv_winograd_dx_bf16(&g, k, stale, in, n, got, scratch);
        cf_conv_winograd_dx_bf16(&g, k, fresh, in, n, want, scratch);
    } else {
        cf_conv_winograd_pack_bf16(&g, k, wt, fresh);
        cf_conv_winograd_forward_bf16(&g, k, stale, in, n, got, scratch);
        cf_conv_winograd_forward_bf16(&g, k, fresh, in, n, want, scratch);
    }
    size_t bad = nout; /* the first value that differs (freed before the test fails) */
    for (size_t i = 0; i < nout && bad == nout; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) bad = i;
    const double g0 = bad < nout ? got[bad] : 0, w0 = bad < nout ? want[bad] : 0;
    free(wt), free(in), free(stale), free(fresh), free(scratch), free(got), free(want);
    if (bad < nout)
        fail_msg("%s of %d -> %d channels, %dx%d: packed at %s, run at avx512_bf16: value %zu is "
                 "%.9g, a fresh pack gives %.9g",
                 dx ? "dx" : "forward", c, k, h, w, from == PACK_AMX ? "amx" : "avx512", bad, g0,
                 w0);
}

static void test_pack_of_another_level(void **state) {
    (void)state;
    const cf_isa best = cf_isa_best();
    if (best != CF_ISA_AVX512_BF16 && best != CF_ISA_AMX) skip();
    const cf_isa before = cf_isa_active();
    for (int from = PACK_AMX; from <= PACK_AVX512; from++) {
        check(from, false, 2, 32, 28, 28, 24);
        check(from, true, 2, 32, 28, 28, 24);
    }
    cf_set_isa(before);
}
#else
static void test_pack_of_another_level(void **state) {
    (void)state;
    skip();
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_of_another_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
