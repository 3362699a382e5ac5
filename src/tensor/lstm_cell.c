/* The LSTM cell through the active kernel table (the loops are tensor/lstm_loops.h). */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <string.h>

void cf_lstm_cell_forward(int n, float *gates, const float *c_prev, float *c, float *h) {
    cf_active_kernels->lstm->cell(n, gates, c_prev, c, h);
}

void cf_lstm_cell_backward(int n, float *gates, const float *c_prev, const float *c,
                           const float *dh_out, const float *dh_rec, float *dc) {
    if (dh_rec) {
        cf_active_kernels->lstm->cell_backward(n, gates, c_prev, c, dh_out, dh_rec, dc);
        return;
    }
    /* the kernels always add a recurrent term: give them zeros, a chunk at a time */
    enum { CHUNK = 256 };
    static const float zeros[CHUNK];
    float tmp_gates[4 * CHUNK];
    for (int j0 = 0; j0 < n; j0 += CHUNK) {
        const int len = n - j0 < CHUNK ? n - j0 : CHUNK;
        for (int q = 0; q < 4; q++)
            memcpy(tmp_gates + q * len, gates + (size_t)q * n + j0, (size_t)len * sizeof(float));
        cf_active_kernels->lstm->cell_backward(len, tmp_gates, c_prev + j0, c + j0, dh_out + j0,
                                               zeros, dc + j0);
        for (int q = 0; q < 4; q++)
            memcpy(gates + (size_t)q * n + j0, tmp_gates + q * len, (size_t)len * sizeof(float));
    }
}
