/* Keyed Dropout (inside a fit) through the tensor layer's row kernel, cf_dropout_keyed_row,
 * vectorised at AVX2 and AVX-512 (src/tensor/dropout_loops.h): the head's serial draws of W1's
 * two-thread step cut, every byte and bit as before:
 *
 * - the kernel: the mask and product of rows of 1 to 1000 values at p 0 to 1 bitwise the scalar
 *   draws it replaced (one 64-bit word a pair), negative zeros and subnormals kept, nothing
 *   written past a row; the vector levels take their own compiled loop;
 * - the module: a keyed Dropout's y and dx through a model, W1's (64, 256) and (64, 128) and odd
 *   shapes, against the draws composed from the module's stream, the key and the ids as
 *   activation.c composed them before, on 1 and 2 threads.
 *
 * Registered under every CF_ISA cap and over the AMX emulation (tests/dropout_rows.cmake). */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"
#include "tensor/kernel_table.h"

#include <corefit.h>

/* ---- the keyed row kernel ------------------------------------------------------------------ */

/* The draws as activation.c made them before the kernel (one 64-bit word a pair, scalar), and
 * the product as dropout_apply makes it. */
static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void reference_row(uint64_t row, size_t per, uint64_t threshold, float scale, const float *x,
                          uint8_t *mask, float *y) {
    for (size_t i = 0; i < per; i += 2) {
        uint64_t r = mix(row + (uint64_t)(i / 2 + 1) * 0x9e3779b97f4a7c15ULL);
        mask[i] = (r & 0xffffffffu) >= threshold;
        if (i + 1 < per) mask[i + 1] = (r >> 32) >= threshold;
    }
    for (size_t i = 0; i < per; i++) y[i] = mask[i] ? x[i] * scale : 0.0f;
}

static void test_keyed_row(void **state) {
    (void)state;
    const cf_isa isa = cf_isa_active();
    /* the vector levels take their own compiled loop; generic and NEON the baseline one */
    if (isa == CF_ISA_AVX2 || isa == CF_ISA_AVX512 || isa == CF_ISA_AVX512_BF16 ||
        isa == CF_ISA_AMX)
        assert_non_null(cf_active_kernels->dropout_keyed_row);
    static const size_t pers[] = {1, 2, 3, 7, 16, 31, 128, 255, 256, 1000};
    static const double ps[] = {0.0, 0.1, 0.25, 0.5, 0.9, 1.0};
    float x[1001], y[1001], yr[1001];
    uint8_t mask[1001], mr[1001];
    fill_uniform(x, 1001, 99, -3, 3);
    x[5] = -0.0f, x[6] = 1e-40f; /* a negative zero and a subnormal keep their bits */
    x[7] = NAN, x[8] = -NAN, x[9] = INFINITY, x[10] = -INFINITY; /* dropped: +0; kept: as x * s */
    for (size_t a = 0; a < sizeof pers / sizeof pers[0]; a++)
        for (size_t b = 0; b < sizeof ps / sizeof ps[0]; b++) {
            const uint64_t threshold = (uint64_t)llround(ps[b] * 4294967296.0);
            const float scale = ps[b] < 1.0 ? (float)(1.0 / (1.0 - ps[b])) : 0.0f;
            const uint64_t row = mix(0x1234 + a * 77 + b);
            memset(mask, 7, sizeof mask), memset(y, 0x55, sizeof y);
            cf_dropout_keyed_row(row, pers[a], threshold, scale, x, mask, y);
            reference_row(row, pers[a], threshold, scale, x, mr, yr);
            if (memcmp(mask, mr, pers[a]) || memcmp(y, yr, pers[a] * 4))
                fail_msg("%s: keyed row of %zu at p = %g differs from the scalar draws",
                         cf_isa_name(isa), pers[a], ps[b]);
            const uint32_t untouched = 0x55555555u;
            if (mask[pers[a]] != 7 || memcmp(&y[pers[a]], &untouched, 4))
                fail_msg("row of %zu: wrote past its end", pers[a]);
        }
}

/* ---- keyed Dropout through a model ---------------------------------------------------------- */

static void test_keyed_module(void **state) {
    (void)state;
    static const int shapes[][2] = {{64, 256}, {64, 128}, {37, 333}, {3, 1}, {5, 2}};
    static const float ps[] = {0.25f, 0.5f};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        for (size_t q = 0; q < 2; q++)
            for (int threads = 1; threads <= 2; threads++) {
                const int rows = shapes[c][0], cols = shapes[c][1];
                const size_t n = (size_t)rows * cols;
                float *x = malloc(n * 4), *dy = malloc(n * 4), *yr = malloc(n * 4);
                uint8_t *mr = malloc(n);
                int64_t *ids = malloc((size_t)rows * sizeof *ids);
                fill_uniform(x, n, 5 + c, -2, 2);
                fill_uniform(dy, n, 6 + c, -1, 1);
                for (int i = 0; i < rows; i++) ids[i] = 1000 + 7 * i;
                cf_set_num_threads(threads);
                cf_model *model;
                assert_int_equal(cf_model_new(&model, cf_dropout(ps[q]), 9), CF_OK);
                cf_model_train(model, true);
                cf_model_set_draw_key(model, 3, ids, rows);
                /* the draws as activation.c composed them: the module's seed, the key, the ids */
                const cf_rng *g = &model->root->rng;
                const uint64_t seed = mix(g->s[0] ^ mix(g->s[1]));
                const uint64_t base = mix(seed ^ mix(3 + 0x9e3779b97f4a7c15ULL));
                const uint64_t threshold = (uint64_t)llround((double)ps[q] * 4294967296.0);
                const float scale = 1.0f / (1.0f - ps[q]);
                for (int b = 0; b < rows; b++)
                    reference_row(mix(base ^ mix((uint64_t)ids[b] + 0x632be59bd9b4e019ULL)),
                                  (size_t)cols, threshold, scale, x + (size_t)b * cols,
                                  mr + (size_t)b * cols, yr + (size_t)b * cols);
                const cf_tensor tx = cf_tensor_view(x, cf_shape2(rows, cols));
                const cf_tensor *ty;
                assert_int_equal(cf_model_forward(model, &tx, &ty), CF_OK);
                if (memcmp(ty->data, yr, n * 4))
                    fail_msg("%s, %d thread(s): Dropout(%g) on (%d, %d): y differs from the "
                             "scalar draws",
                             cf_isa_name(cf_isa_active()), threads, (double)ps[q], rows, cols);
                const cf_tensor tdy = cf_tensor_view(dy, ty->shape);
                const cf_tensor *tdx = model->root->ops->backward(model->root, &tdy, true);
                assert_non_null(tdx);
                for (size_t i = 0; i < n; i++) {
                    const float want = mr[i] ? dy[i] * scale : 0.0f;
                    if (memcmp(&tdx->data[i], &want, 4))
                        fail_msg("Dropout(%g) on (%d, %d): dx[%zu] %g, not %g", (double)ps[q], rows,
                                 cols, i, (double)tdx->data[i], (double)want);
                }
                cf_model_free(model);
                cf_set_num_threads(0);
                free(x), free(dy), free(yr), free(mr), free(ids);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyed_row),
        cmocka_unit_test(test_keyed_module),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
