/* The LSTM cell's element-wise step (cf_lstm_cell_forward and cf_lstm_cell_backward in
 * corefit/tensor.h), written once in plain C and compiled into each kernel table with that
 * table's instruction set: the loops have no calls and no branches (selects only), so the
 * compiler vectorises them. tanh is a rational approximation (the odd 13/even 6 minimax fit
 * Eigen uses, within a few units in the last place over [-7.9, 7.9], and +-1 to float precision
 * beyond), and sigmoid(x) = (1 + tanh(x / 2)) / 2, so every table computes the same function. */
#ifndef COREFIT_LSTM_LOOPS_H
#define COREFIT_LSTM_LOOPS_H

#include "tensor/kernel_table.h"

static inline float lstm_tanh(float v) {
    const float clamp = 7.90531110763549805f;
    const float x = v > clamp ? clamp : (v < -clamp ? -clamp : v);
    const float x2 = x * x;
    float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = x2 * p + -8.60467152213735e-11f;
    p = x2 * p + 5.12229709037114e-08f;
    p = x2 * p + 1.48572235717979e-05f;
    p = x2 * p + 6.37261928875436e-04f;
    p = x2 * p + 4.89352455891786e-03f;
    p = x * p;
    float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = x2 * q + 2.26843463243900e-03f;
    q = x2 * q + 4.89352518554385e-03f;
    return p / q;
}

static inline float lstm_sigmoid(float v) {
    return 0.5f + 0.5f * lstm_tanh(0.5f * v);
}

static void loops_lstm_cell(int n, float *restrict gates, const float *restrict c_prev,
                            float *restrict c, float *restrict h) {
    float *restrict gi = gates, *restrict gf = gates + n, *restrict gg = gates + 2 * n,
                    *restrict go = gates + 3 * n;
    for (int j = 0; j < n; j++) {
        const float i = lstm_sigmoid(gi[j]), f = lstm_sigmoid(gf[j]), g = lstm_tanh(gg[j]),
                    o = lstm_sigmoid(go[j]);
        const float cj = f * c_prev[j] + i * g;
        gi[j] = i;
        gf[j] = f;
        gg[j] = g;
        go[j] = o;
        c[j] = cj;
        h[j] = o * lstm_tanh(cj);
    }
}

static void loops_lstm_cell_backward(int n, float *restrict gates, const float *restrict c_prev,
                                     const float *restrict c, const float *restrict dh_out,
                                     const float *restrict dh_rec, float *restrict dc) {
    float *restrict gi = gates, *restrict gf = gates + n, *restrict gg = gates + 2 * n,
                    *restrict go = gates + 3 * n;
    for (int j = 0; j < n; j++) {
        const float dh = dh_out[j] + dh_rec[j];
        const float i = gi[j], f = gf[j], g = gg[j], o = go[j];
        const float tc = lstm_tanh(c[j]);
        const float dct = dc[j] + dh * o * (1.0f - tc * tc);
        gi[j] = dct * g * i * (1.0f - i);
        gf[j] = dct * c_prev[j] * f * (1.0f - f);
        gg[j] = dct * i * (1.0f - g * g);
        go[j] = dh * tc * o * (1.0f - o);
        dc[j] = dct * f;
    }
}

static const cf_lstm_kernels loops_lstm = {
    .cell = loops_lstm_cell,
    .cell_backward = loops_lstm_cell_backward,
};

#endif
