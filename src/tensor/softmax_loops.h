/* The softmax's reductions (cf_row_max and cf_exp_shift_sum in corefit/tensor.h), written once
 * in plain C and compiled into each kernel table with that table's instruction set, as
 * lstm_loops.h: no calls and no branches in the element loops (selects only), and sums kept in
 * LANES separate accumulators, so the compiler vectorises them without reassociating anything.
 *
 * exp is Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 split in two parts, n rounded
 * with the 1.5 * 2^23 trick), a degree-6 polynomial in r (within 2 units in the last place), and
 * 2^n put into the exponent bits. Below -87.33 (under FLT_MIN) it gives 0, above 88.72 the
 * largest power it can build (the softmax's arguments are <= 0); a NaN stays a NaN. */
#ifndef COREFIT_SOFTMAX_LOOPS_H
#define COREFIT_SOFTMAX_LOOPS_H

#include "tensor/kernel_table.h"

#include <stdint.h>
#include <string.h>

enum { SOFTMAX_LANES = 16, SOFTMAX_BLOCK = 512 };

static inline float softmax_exp(float v) {
    const float hi = 88.7228317f, lo = -87.3365479f;
    const float xh = v > hi ? hi : v, x = xh < lo ? lo : xh; /* a NaN stays */
    /* n = round(x / ln 2): the add and subtract of 1.5 * 2^23 rounds to nearest */
    const float shifter = 12582912.0f;
    const float fn = (x * 1.44269504088896341f + shifter) - shifter;
    const float r = (x - fn * 0.693359375f) - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = p * (r * r) + r + 1.0f;
    /* 2^n in two halves, so that n = 128 (x up to 88.72) stays finite */
    /* n in [-126, 128]; a NaN's (whose result is NaN anyway) converted as -126 */
    const float fc = fn > -126.0f ? fn : -126.0f;
    const int32_t n = (int32_t)(fc < 128.0f ? fc : 128.0f);
    const int32_t n1 = n / 2, n2 = n - n1;
    const int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    const float y = e * s1 * s2;
    return v < lo ? 0.0f : y;
}

static float loops_row_max(int n, const float *restrict x) {
    float m = x[0];
    int j = 0;
    if (n >= SOFTMAX_LANES) {
        float acc[SOFTMAX_LANES];
        for (int l = 0; l < SOFTMAX_LANES; l++) acc[l] = x[l];
        for (j = SOFTMAX_LANES; j + SOFTMAX_LANES <= n; j += SOFTMAX_LANES)
            for (int l = 0; l < SOFTMAX_LANES; l++) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
        for (int l = 0; l < SOFTMAX_LANES; l++) m = acc[l] > m ? acc[l] : m;
    }
    for (; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* y may be x: no restrict (the compiler checks the overlap once a block) */
static double loops_exp_shift_sum(int n, const float *x, float shift, float *y) {
    double total = 0;
    for (int j0 = 0; j0 < n; j0 += SOFTMAX_BLOCK) {
        const int len = n - j0 < SOFTMAX_BLOCK ? n - j0 : SOFTMAX_BLOCK;
        const float *xb = x + j0;
        float *yb = y + j0;
        for (int j = 0; j < len; j++) yb[j] = softmax_exp(xb[j] - shift);
        float acc[SOFTMAX_LANES] = {0};
        int j = 0;
        for (; j + SOFTMAX_LANES <= len; j += SOFTMAX_LANES)
            for (int l = 0; l < SOFTMAX_LANES; l++) acc[l] += yb[j + l];
        double s = 0;
        for (; j < len; j++) s += yb[j];
        for (int l = 0; l < SOFTMAX_LANES; l++) s += acc[l];
        total += s;
    }
    return total;
}

static const cf_softmax_kernels loops_softmax = {
    .row_max = loops_row_max,
    .exp_shift_sum = loops_exp_shift_sum,
};

#endif
