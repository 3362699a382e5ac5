/* MaxPool2d(3, stride 2)'s kernels (cf_max_pool_3x3_s2_row, cf_max_pool_3x3_s2_backward;
 * src/tensor/isa_avx2.c, isa_avx512.c) at every instruction set this CPU runs, bitwise against
 * the generic table's scalar loops and against this file's own copy of the layer's loops:
 *
 * - the forward's values and indices over odd and even planes, padding 0 and 1, every output
 *   row (window rows clipped to 2 at the borders), output ranges of whole vectors, tails and
 *   single outputs, with ties (the first maximum wins; +0 and -0 tie, so the sign says which),
 *   NaNs of several payloads and both signs (the last NaN of a window wins), infinities and
 *   windows of -inf only; nothing outside the range is written;
 * - the backward over indices anywhere in each output's window (so that many outputs share a
 *   position and the order of their additions shows), gradients with -0, NaNs, infinities and
 *   values whose sum depends on the order, with and without the non-temporal stores, dx at every
 *   offset 0-15 floats from a 64-byte line; every value of dx is written and nothing outside it.
 *
 * ctest runs it again under each CF_ISA cap (tests/isa.cmake). */
#include "oracle.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/tensor.h"

/* The levels to check: those up to the active one that the CPU gives when asked. */
static int levels(cf_isa *out) {
    const cf_isa active = cf_isa_active();
    const cf_isa all[] = {CF_ISA_AVX2, CF_ISA_AVX512, CF_ISA_AVX512_BF16, CF_ISA_NEON};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        if (all[i] == CF_ISA_NEON ? active != CF_ISA_NEON : all[i] > active) continue;
        if (cf_set_isa(all[i]) == all[i]) out[n++] = all[i];
    }
    out[n++] = active; /* also the plain run's own */
    cf_set_isa(active);
    return n;
}

static float nan_with(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Values with many ties, zeros of both signs, NaNs of four payloads, infinities. */
static float draw(cf_rng *rng) {
    const double u = cf_rng_uniform(rng);
    if (u < 0.02) return nan_with(0x7fc00000u);
    if (u < 0.03) return nan_with(0xffc00001u);
    if (u < 0.04) return nan_with(0x7fc12345u);
    if (u < 0.05) return nan_with(0x7f800001u); /* signalling: each kernel quiets it alike */
    if (u < 0.10) return -INFINITY;
    if (u < 0.12) return INFINITY;
    if (u < 0.20) return -0.0f;
    if (u < 0.28) return 0.0f;
    return (float)(0.5 * floor(8 * cf_rng_uniform(rng) - 4));
}

static int out_size(int n, int pad) {
    return (n + 2 * pad - 3) / 2 + 1;
}

/* The layer's max_window (src/nn/pool.c), copied: taps row by row, the first maximum, the last
 * NaN. */
static void ref_window(const float *x, int w, int y0, int y1, int x0, int x1, float *y,
                       int32_t *idx) {
    float best = -INFINITY;
    int32_t arg = y0 * w + x0;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            const float v = x[(size_t)iy * w + ix];
            const bool take = v > best || v != v;
            best = take ? v : best;
            arg = take ? iy * w + ix : arg;
        }
    *y = best;
    *idx = arg;
}

static void clip(int o, int n, int pad, int *lo, int *hi) {
    const int s = 2 * o - pad, e = s + 3;
    *lo = s < 0 ? 0 : s;
    *hi = e > n ? n : e;
}

static void test_forward_rows(void **state) {
    (void)state;
    cf_isa lv[8];
    const int nl = levels(lv);
    const cf_isa active = cf_isa_active();
    cf_rng rng;
    cf_rng_seed(&rng, 32);
    const int sizes[][2] = {{3, 3},  {4, 5},   {5, 7},  {7, 33},  {9, 34},
                            {3, 64}, {17, 64}, {6, 65}, {5, 100}, {64, 64}};
    int checked = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int pad = 0; pad <= 1; pad++)
            for (int rep = 0; rep < 3; rep++) {
                const int h = sizes[s][0], w = sizes[s][1];
                const int oh = out_size(h, pad), ow = out_size(w, pad);
                float *x = malloc((size_t)h * w * sizeof(float));
                for (int i = 0; i < h * w; i++) x[i] = draw(&rng);
                if (rep == 2) /* windows of -inf only */
                    for (int i = 0; i < h * w; i++)
                        if (x[i] != x[i] || x[i] > 0) x[i] = -INFINITY;
                /* the outputs whose three columns are inside */
                const int lo = (pad + 1) / 2, hi0 = (w + pad - 3) / 2 + 1;
                const int hi = hi0 > ow ? ow : hi0;
                for (int oy = 0; oy < oh; oy++) {
                    int y0, y1;
                    clip(oy, h, pad, &y0, &y1);
                    /* ranges: all, a tail, one output, and an odd start */
                    const int ranges[][2] = {
                        {lo, hi}, {lo, lo + (hi - lo) / 2}, {hi - 1, hi}, {lo + 1, hi}};
                    for (int r = 0; r < 4; r++) {
                        const int a = ranges[r][0], b = ranges[r][1];
                        if (a >= b || a < lo || b > hi) continue;
                        float want[200], got[200];
                        int32_t wi[200], gi[200];
                        for (int ox = a; ox < b; ox++) {
                            int x0, x1;
                            clip(ox, w, pad, &x0, &x1);
                            assert_int_equal(x1 - x0, 3);
                            ref_window(x, w, y0, y1, x0, x1, &want[ox], &wi[ox]);
                        }
                        for (int l = -1; l < nl; l++) {
                            cf_set_isa(l < 0 ? CF_ISA_GENERIC : lv[l]);
                            for (int i = 0; i < 200; i++) {
                                got[i] = 12345.0f;
                                gi[i] = -7;
                            }
                            cf_max_pool_3x3_s2_row(x, w, y0, y1 - y0, pad, a, b, got, gi);
                            for (int i = 0; i < 200; i++) {
                                const bool in = i >= a && i < b;
                                if (!in && (got[i] != 12345.0f || gi[i] != -7))
                                    fail_msg("3x3 s2 row at %s: %dx%d pad %d wrote output %d "
                                             "outside [%d, %d)",
                                             cf_isa_name(cf_isa_active()), h, w, pad, i, a, b);
                                if (in && (memcmp(&got[i], &want[i], sizeof(float)) != 0 ||
                                           gi[i] != wi[i]))
                                    fail_msg("3x3 s2 row at %s: %dx%d pad %d row %d output %d: "
                                             "%g at %d, want %g at %d",
                                             cf_isa_name(cf_isa_active()), h, w, pad, oy, i,
                                             (double)got[i], gi[i], (double)want[i], wi[i]);
                            }
                            checked++;
                        }
                    }
                }
                free(x);
            }
    cf_set_isa(active);
    assert_true(checked > 1000);
}

/* dx by the layer's former loop: zeros, then dx[idx[o]] += dy[o] in output order. */
static void ref_backward(const float *dy, const int32_t *idx, int h, int w, int pad, float *dx) {
    const int n = out_size(h, pad) * out_size(w, pad);
    memset(dx, 0, (size_t)h * w * sizeof(float));
    for (int o = 0; o < n; o++) dx[idx[o]] += dy[o];
}

static void test_backward(void **state) {
    (void)state;
    cf_isa lv[8];
    const int nl = levels(lv);
    const cf_isa active = cf_isa_active();
    cf_rng rng;
    cf_rng_seed(&rng, 33);
    const int sizes[][2] = {{3, 3},  {4, 5},   {5, 7},  {7, 33},  {9, 34},  {3, 64},
                            {6, 65}, {17, 64}, {8, 96}, {5, 100}, {64, 64}, {4, 31}};
    int checked = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int pad = 0; pad <= 1; pad++)
            for (int rep = 0; rep < 3; rep++) {
                const int h = sizes[s][0], w = sizes[s][1];
                const int oh = out_size(h, pad), ow = out_size(w, pad), n = oh * ow;
                const size_t plane = (size_t)h * w, guard = 32;
                float *dy = malloc((size_t)n * sizeof(float));
                int32_t *idx = malloc((size_t)n * sizeof(int32_t));
                float *want = malloc(plane * sizeof(float));
                const size_t bytes = ((plane + 2 * guard + 16) * sizeof(float) + 63) / 64 * 64;
                float *buf = aligned_alloc(64, bytes);
                for (int oy = 0; oy < oh; oy++)
                    for (int ox = 0; ox < ow; ox++) {
                        int y0, y1, x0, x1;
                        clip(oy, h, pad, &y0, &y1);
                        clip(ox, w, pad, &x0, &x1);
                        /* rep 0: any position of the window; 1: one of its corners, which
                         * it shares with up to three neighbours (up to four additions, whose
                         * order shows); 2: the first tap */
                        int iy = y0 + (int)(cf_rng_uniform(&rng) * (y1 - y0)),
                            ix = x0 + (int)(cf_rng_uniform(&rng) * (x1 - x0));
                        if (rep == 1) {
                            iy = cf_rng_uniform(&rng) < 0.5 ? y0 : y1 - 1;
                            ix = cf_rng_uniform(&rng) < 0.5 ? x0 : x1 - 1;
                        }
                        if (rep == 2) {
                            iy = y0;
                            ix = x0;
                        }
                        idx[oy * ow + ox] = iy * w + ix;
                        /* magnitudes far apart: sums that depend on their order */
                        const double u = cf_rng_uniform(&rng);
                        dy[oy * ow + ox] = u < 0.3 ? draw(&rng)
                                           : u < 0.6
                                               ? (float)ldexp(cf_rng_uniform(&rng) - 0.5,
                                                              (int)(cf_rng_uniform(&rng) * 60) - 30)
                                               : (float)(cf_rng_uniform(&rng) - 0.5);
                    }
                ref_backward(dy, idx, h, w, pad, want);
                for (int l = -1; l < nl; l++)
                    for (int stream = 0; stream <= 1; stream++)
                        for (int off = 0; off < 16; off += (plane > 2000 ? 5 : 1)) {
                            cf_set_isa(l < 0 ? CF_ISA_GENERIC : lv[l]);
                            const size_t total = plane + 2 * guard + 16;
                            for (size_t i = 0; i < total; i++) buf[i] = nan_with(0x7fbadbadu);
                            float *dx = buf + guard + off;
                            cf_max_pool_3x3_s2_backward(dy, idx, h, w, pad, dx, stream);
                            for (size_t i = 0; i < total; i++) {
                                const bool in = buf + i >= dx && buf + i < dx + plane;
                                uint32_t bits;
                                memcpy(&bits, &buf[i], sizeof bits);
                                if (!in && bits != 0x7fbadbadu)
                                    fail_msg("3x3 s2 backward at %s: %dx%d pad %d wrote outside "
                                             "dx",
                                             cf_isa_name(cf_isa_active()), h, w, pad);
                                if (in && memcmp(&buf[i], &want[buf + i - dx], sizeof(float)))
                                    fail_msg("3x3 s2 backward at %s: %dx%d pad %d rep %d stream "
                                             "%d: dx[%td] %a, want %a",
                                             cf_isa_name(cf_isa_active()), h, w, pad, rep, stream,
                                             buf + i - dx, (double)buf[i],
                                             (double)want[buf + i - dx]);
                            }
                            checked++;
                        }
                free(dy);
                free(idx);
                free(want);
                free(buf);
            }
    cf_set_isa(active);
    assert_true(checked > 500);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_rows),
        cmocka_unit_test(test_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
