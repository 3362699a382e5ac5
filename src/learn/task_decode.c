/* Decoding predictions of the other vision tasks (fastai's loss_func.decodes followed by the
 * target block's decodes): multi-label rows to label sets, points back to pixels. */
#include "internal.h"

#include <string.h>

size_t cf_learner_decodes(const cf_learner *learn, const float *act, int64_t n, int width,
                          int height, float *out) {
    if (!learn || !act || !out || n < 1) return 0;
    const cf_dataset *ds = learn->dls ? learn->dls->train_ds : NULL;
    if (!ds) return 0;
    const int cols = learn->recipe.n_out > 0 ? learn->recipe.n_out
                     : ds->n_classes > 0     ? ds->n_classes
                                             : ds->target_dim;
    cf_tensor t = cf_tensor_view((float *)act, cf_shape2((int)n, cols));
    if (ds->n_points > 0 && ds->sample_shape.ndim == 3) {
        /* PointScaler.decodes: (p + 1) * size / 2, the size of the image the points belong to */
        const int w = width > 0 ? width : ds->sample_shape.dim[2];
        const int h = height > 0 ? height : ds->sample_shape.dim[1];
        memcpy(out, act, (size_t)n * (size_t)cols * sizeof(float));
        for (int64_t i = 0; i < n; i++) cf_points_unscale(out + (size_t)i * cols, cols / 2, w, h);
        return (size_t)n * (size_t)cols;
    }
    return cf_loss_decodes(&learn->loss, &t, out);
}
