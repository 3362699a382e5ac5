/* corefit train --small-epochs K: fastai's progressive resizing, within one fit: the first K
 * epochs train on the images at half size (each 2x2 block of pixels averaged, as PyTorch's
 * avg_pool2d(x, 2); an odd last row or column dropped), the rest and every validation at full
 * size. For a model that takes any image size (convolutions, then an adaptive pool, as the
 * fast-cnn): at half size the convolutions cost a quarter (a fast-cnn epoch on 2 cores about
 * half: batching, BatchNorm and the optimizer step do not shrink), so that the fit spends its
 * full-size epochs after the model has learnt the coarse shapes cheaply. Not for tables or
 * masks (train refuses both). A callback that
 * trains on its own copy of each batch (as MixUp does); every replica of a parallel fit does
 * the same. */
#include "train.h"

typedef struct small_state {
    int epochs;
    cf_batch batch; /* the half-size copy the loop trains on */
    float *x;
    size_t cap;
} small_state;

static cf_status small_before_batch(cf_callback *cb, cf_learner *learn) {
    small_state *s = cb->state;
    const cf_batch *b = learn->batch;
    if (!learn->training || !b || learn->epoch >= s->epochs || b->x.shape.ndim != 4) return CF_OK;
    const int n = b->x.shape.dim[0], c = b->x.shape.dim[1], h = b->x.shape.dim[2],
              w = b->x.shape.dim[3], h2 = h / 2, w2 = w / 2;
    if (h2 < 1 || w2 < 1) return CF_OK;
    const size_t need = (size_t)n * c * h2 * w2;
    if (need > s->cap) {
        float *p = cf_malloc(need * sizeof(float));
        if (!p) return cf_fail_context(CF_ERR_NOMEM, "--small-epochs batch");
        cf_free(s->x);
        s->x = p;
        s->cap = need;
    }
    for (int64_t p = 0; p < (int64_t)n * c; p++) {
        const float *in = b->x.data + p * h * w;
        float *o = s->x + p * h2 * w2;
        for (int i = 0; i < h2; i++) {
            const float *r0 = in + (size_t)(2 * i) * w, *r1 = r0 + w;
            for (int j = 0; j < w2; j++)
                o[i * w2 + j] = ((r0[2 * j] + r0[2 * j + 1]) + (r1[2 * j] + r1[2 * j + 1])) * 0.25f;
        }
    }
    s->batch = *b;
    s->batch.x = cf_tensor_view(s->x, cf_shape4(n, c, h2, w2));
    learn->batch = &s->batch;
    return CF_OK;
}

static void small_free(cf_callback *cb) {
    if (!cb) return;
    small_state *s = cb->state;
    if (s) cf_free(s->x);
    cf_free(cb->state);
    cf_free(cb);
}

cf_callback *cli_small_epochs_cb(int epochs) {
    cf_callback *cb = cf_callback_new("SmallEpochs", CF_ORDER_DEFAULT, sizeof(small_state));
    if (!cb) return NULL;
    ((small_state *)cb->state)->epochs = epochs;
    cb->on[CF_EV_BEFORE_BATCH] = small_before_batch;
    cb->free = small_free;
    return cb;
}
