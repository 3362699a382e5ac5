/* The image split of the elementwise and pooling layers (nn_internal.h). */
#include "corefit/nn.h"
#include "nn_internal.h"

typedef struct images_job {
    cf_range_fn fn;
    void *ctx;
    int64_t per_image;
} images_job;

static void images_range(void *v, int64_t i0, int64_t i1, int thread) {
    const images_job *j = v;
    j->fn(j->ctx, i0 * j->per_image, i1 * j->per_image, thread);
}

void cf_nn_parallel_images(int64_t n_images, int64_t per_image, cf_range_fn fn, void *ctx) {
    if (n_images <= 0 || per_image <= 0) return;
    if (n_images < cf_get_num_threads()) { /* fewer images than threads: split the values */
        cf_parallel_for(n_images * per_image, fn, ctx);
        return;
    }
    images_job j = {fn, ctx, per_image};
    cf_parallel_for(n_images, images_range, &j);
}
