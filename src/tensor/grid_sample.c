/* grid_sample's bilinear taps and gathers through the active kernel table (the loops are
 * tensor/grid_sample_loops.h). */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

void cf_grid_sample_taps(const float mat[2][3], const double *warp, cf_grid_pad pad, int h, int w,
                         int i, int j0, int n, int32_t *idx, float *wt) {
    cf_active_kernels->grid_sample->taps(mat, warp, (int)pad, h, w, i, j0, n, idx, wt);
}

void cf_grid_sample_gather(int n, const int32_t *idx, const float *wt, const float *src,
                           float *out) {
    cf_active_kernels->grid_sample->gather(n, idx, wt, src, out);
}
