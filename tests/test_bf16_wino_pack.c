/* The bf16 Winograd weight packs made in parts (src/tensor/winograd.c pack_fused): at
 * avx512_bf16, cf_conv_winograd_pack_bf16 and _pack_dx_bf16 transform 16 x 16 kernels at a time
 * and pack the GEMM's A from that block (cf_bf16_kernels.gemm_pack_a_part) instead of packing
 * the fp32 planes afterwards (gemm_pack_a). Checked here: the whole pack (fp32 planes, packed
 * points, stamp) is bitwise the one made by the same level with gemm_pack_a_part removed, on
 * shapes with partial row blocks, odd channel counts (a last pair with a zero half) and more than
 * one k-block of packed pairs (over 256 columns). Skipped without AVX512_BF16. */
#include "oracle.h"

#include "tensor/kernel_table.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
static void check(bool dx, int c, int k) {
    assert_int_equal(cf_set_isa(CF_ISA_AVX512_BF16), CF_ISA_AVX512_BF16);
    const cf_kernel_table *parts = cf_active_kernels;
    assert_non_null(parts->bf16->gemm_pack_a_part);
    cf_kernel_table whole = *parts;
    cf_bf16_kernels whole_bf16 = *parts->bf16;
    whole_bf16.gemm_pack_a_part = NULL; /* the planes, then gemm_pack_a on each */
    whole.bf16 = &whole_bf16;
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, 6, 6, 3, 3, 1, 1, 1, 1));
    const size_t np = cf_conv_winograd_packed_size_bf16(&g, k), nw = (size_t)k * c * 9;
    float *wt = malloc(nw * sizeof(float)), *got = malloc(np * sizeof(float)),
          *want = malloc(np * sizeof(float));
    fill_uniform(wt, nw, 71 + c + k, -0.3f, 0.3f);
    memset(got, 0x5a, np * sizeof(float)); /* the words neither writes stay equal */
    memset(want, 0x5a, np * sizeof(float));
    if (dx)
        cf_conv_winograd_pack_dx_bf16(&g, k, wt, got);
    else
        cf_conv_winograd_pack_bf16(&g, k, wt, got);
    cf_active_kernels = &whole;
    if (dx)
        cf_conv_winograd_pack_dx_bf16(&g, k, wt, want);
    else
        cf_conv_winograd_pack_bf16(&g, k, wt, want);
    assert_int_equal(cf_set_isa(CF_ISA_AVX512_BF16), CF_ISA_AVX512_BF16);
    size_t bad = np;
    for (size_t i = 0; i < np && bad == np; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) bad = i;
    uint32_t g0 = 0, w0 = 0;
    if (bad < np) memcpy(&g0, &got[bad], 4), memcpy(&w0, &want[bad], 4);
    free(wt), free(got), free(want);
    if (bad < np)
        fail_msg("%s pack of %d -> %d channels: word %zu of %zu is 0x%08x packed in parts, 0x%08x "
                 "packed whole",
                 dx ? "dx" : "forward", c, k, bad, np, g0, w0);
}

static void test_pack_in_parts(void **state) {
    (void)state;
    const cf_isa best = cf_isa_best();
    if (best != CF_ISA_AVX512_BF16 && best != CF_ISA_AMX) skip();
    const cf_isa before = cf_isa_active();
    static const int shapes[][2] = {{32, 24},  {300, 37}, {3, 16},  {1, 1},
                                    {17, 520}, {257, 33}, {64, 64}, {513, 18}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        check(false, shapes[s][0], shapes[s][1]);
        check(true, shapes[s][0], shapes[s][1]);
    }
    cf_set_isa(before);
}
#else
static void test_pack_in_parts(void **state) {
    (void)state;
    skip();
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_in_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
