/* The softmax's reductions through the active kernel table (the loops are
 * tensor/softmax_loops.h), in pieces of at most INT_MAX floats. */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <limits.h>

float cf_row_max(size_t n, const float *x) {
    float m = x[0];
    for (size_t j0 = 0; j0 < n; j0 += INT_MAX) {
        const size_t len = n - j0 < (size_t)INT_MAX ? n - j0 : (size_t)INT_MAX;
        const float v = cf_active_kernels->softmax->row_max((int)len, x + j0);
        m = v > m ? v : m;
    }
    return m;
}

double cf_exp_shift_sum(size_t n, const float *x, float shift, float *y) {
    double s = 0;
    for (size_t j0 = 0; j0 < n; j0 += INT_MAX) {
        const size_t len = n - j0 < (size_t)INT_MAX ? n - j0 : (size_t)INT_MAX;
        s += cf_active_kernels->softmax->exp_shift_sum((int)len, x + j0, shift, y + j0);
    }
    return s;
}
