/* The bf16 convolution pack's dx words (src/tensor/conv_bf16.c, dx_words: per block of 8 input
 * channels and output pair, in the order the weights lie) against the loop they replaced
 * (dx_plain, per tap and input channel over the output pairs), bitwise, before the level orders
 * them: stride 1 (every tap reversed), stride 2 (each phase's taps), the 1x1 stride-2 layer, odd
 * channel counts each way (a last input block with channels past C, an output pair without its
 * second row), 1x1 to 7x7, W3's l3 and l4 stride-2 shapes; on random 16-bit words (the words are
 * moved, never computed, so any bits, NaN patterns included, must arrive as they are). And whole
 * layers: cf_conv_bf16_pack's dx order read by cf_conv_bf16_dx (test_bf16, test_bf16_cols and
 * the other bf16 convolution tests run on the pack as it is now). No level dependence: the words
 * are the same at every level (the level's conv_order runs after). */
#include "oracle.h"

#include "corefit/tensor.h"

#include <stdio.h>
#include <string.h>

size_t cf__conv_bf16_dx_words_size(const cf_conv_geom *g, int out_channels);
void cf__conv_bf16_dx_words(const cf_conv_geom *g, int out_channels, const uint16_t *wb,
                            uint32_t *dx, bool plain);

static void check(int c, int o, int h, int k, int s) {
    cf_conv_geom g;
    const int pad = k == 1 && s == 2 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, s, s, pad, pad));
    const size_t nw = (size_t)o * c * k * k, words = cf__conv_bf16_dx_words_size(&g, o);
    uint16_t *wb = malloc(nw * sizeof(uint16_t));
    uint32_t *got = malloc(words * sizeof(uint32_t)), *want = malloc(words * sizeof(uint32_t));
    uint64_t st = 0x9e3779b97f4a7c15ull ^ (uint64_t)(c * 131 + o * 7 + k);
    for (size_t i = 0; i < nw; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        wb[i] = (uint16_t)(st >> 40);
    }
    memset(got, 0xa5, words * sizeof(uint32_t));
    memset(want, 0x5a, words * sizeof(uint32_t));
    cf__conv_bf16_dx_words(&g, o, wb, got, false);
    cf__conv_bf16_dx_words(&g, o, wb, want, true);
    for (size_t i = 0; i < words; i++)
        if (got[i] != want[i]) {
            const uint32_t a = got[i], b = want[i];
            free(wb), free(got), free(want);
            fail_msg("%dx%d/%d %d -> %d: dx word %zu of %zu is %08x, the plain loop's %08x", k, k,
                     s, c, o, i, words, a, b);
        }
    free(wb), free(got), free(want);
}

static void test_dx_words(void **state) {
    (void)state;
    check(16, 32, 14, 3, 1);
    check(64, 64, 7, 3, 1);
    check(9, 10, 11, 3, 1);
    check(7, 12, 9, 5, 1);
    check(3, 5, 6, 1, 1);
    check(16, 32, 28, 3, 2);
    check(32, 64, 14, 3, 2);
    check(128, 256, 16, 3, 2); /* W3's l3 */
    check(256, 512, 8, 3, 2);  /* and l4 */
    check(9, 11, 10, 3, 2);
    check(24, 40, 14, 7, 2);
    check(13, 7, 9, 5, 2);
    check(128, 256, 16, 1, 2); /* the 1x1 stride-2 layer */
    check(7, 12, 15, 1, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dx_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
