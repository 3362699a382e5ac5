/* fastai's MixUp and CutMix (callback/mixup.py) as callbacks of the ordinary fit loop.
 *
 * Every training batch is replaced (before_batch) by a mixed copy owned by the callback, so the
 * loader's batch is never written. Draws come from a stream keyed by (learner seed, epoch,
 * batch index), not from how many batches ran: a resumed fit and every rank of a parallel fit
 * draw the same lam and permutation for the same batch, and a fit gives the same result in one
 * process and in one worker of cf_par_fit.
 *
 * The mixed loss: with a cross-entropy (fastai's y_int losses, CrossEntropyLossFlat and
 * LabelSmoothingCrossEntropy), fastai trains on lerp(loss(pred, y[perm]), loss(pred, y), lam)
 * per sample. Cross-entropy, smoothed or not, is linear in its target distribution, so that is
 * the cross-entropy against lam * onehot(y) + (1 - lam) * onehot(y[perm]): the callback writes
 * those class probabilities as the batch's target once the prediction's shape is known
 * (after_pred), and cf_loss_forward computes fastai's mixed loss. Other losses (BCE, MSE) get
 * fastai's mixed targets, lerp(y[perm], y, lam). Validation is left alone (fastai's
 * run_valid=False). */
#include <math.h>
#include <string.h>

#include "corefit/learn.h"
#include "learn/internal.h"

/* ---- Beta(alpha, alpha) -------------------------------------------------------------------- */

/* Gamma(a, 1) by Marsaglia and Tsang; a < 1 through Gamma(a + 1) * U^(1/a). */
static double gamma_draw(cf_rng *rng, double a) {
    if (a < 1.0) {
        double u = cf_rng_uniform(rng);
        return gamma_draw(rng, a + 1.0) * pow(u > 0 ? u : 1e-300, 1.0 / a);
    }
    const double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = cf_rng_normal(rng);
            v = 1.0 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = cf_rng_uniform(rng);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
        if (u > 0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
    }
}

static double beta_draw(cf_rng *rng, double alpha) {
    double x = gamma_draw(rng, alpha), y = gamma_draw(rng, alpha);
    return x + y > 0 ? x / (x + y) : 0.5;
}

/* splitmix64's finaliser, to key a stream by several numbers */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

cf_status cf_mix_draw(cf_mix_kind kind, double alpha, uint64_t seed, int epoch, int64_t batch,
                      int bs, int height, int width, cf_mix_draws *out) {
    if (!out || bs < 1 || bs > CF_MIX_MAX_BS)
        return cf_fail(CF_ERR_INVALID, "mix draw: batch size %d not in [1, %d]", bs, CF_MIX_MAX_BS);
    if (kind != CF_MIX_MIXUP && kind != CF_MIX_CUTMIX)
        return cf_fail(CF_ERR_INVALID, "mix draw: unknown kind %d", (int)kind);
    if (kind == CF_MIX_CUTMIX && (height < 1 || width < 1))
        return cf_fail(CF_ERR_INVALID, "CutMix: image size %dx%d has no pixels", height, width);
    if (!(alpha > 0) || !isfinite(alpha))
        return cf_fail(CF_ERR_INVALID, "%s: alpha %g must be positive",
                       kind == CF_MIX_MIXUP ? "MixUp" : "CutMix", alpha);
    cf_rng rng;
    cf_rng_seed(&rng, mix64(mix64(seed ^ 0x6d69787570ULL) + (uint64_t)epoch) + (uint64_t)batch);
    memset(out, 0, sizeof *out);
    out->bs = bs;
    if (kind == CF_MIX_MIXUP) {
        /* lam per sample, then max(lam, 1 - lam) (fastai's MixUp) */
        for (int i = 0; i < bs; i++) {
            float lam = (float)beta_draw(&rng, alpha);
            out->lam[i] = lam > 1.0f - lam ? lam : 1.0f - lam;
        }
    }
    for (int i = 0; i < bs; i++) out->perm[i] = i;
    cf_rng_shuffle(&rng, out->perm, bs);
    if (kind == CF_MIX_CUTMIX) {
        /* one lam a batch, no max; fastai's rand_bbox in float32 with torch.round (half to
         * even); lam recomputed from the box's area */
        const float lam = (float)beta_draw(&rng, alpha);
        const float cut_rat = sqrtf(1.0f - lam);
        const int cut_w = (int)rintf((float)width * cut_rat);
        const int cut_h = (int)rintf((float)height * cut_rat);
        const int cx = (int)cf_rng_below(&rng, (uint64_t)width);
        const int cy = (int)cf_rng_below(&rng, (uint64_t)height);
#define CLAMP(v, hi) ((v) < 0 ? 0 : (v) > (hi) ? (hi) : (v))
        out->x1 = CLAMP(cx - cut_w / 2, width);
        out->y1 = CLAMP(cy - cut_h / 2, height);
        out->x2 = CLAMP(cx + cut_w / 2, width);
        out->y2 = CLAMP(cy + cut_h / 2, height);
#undef CLAMP
        out->drawn_lam = lam;
        const float area =
            (float)((out->x2 - out->x1) * (out->y2 - out->y1)) / (float)(width * height);
        for (int i = 0; i < bs; i++) out->lam[i] = 1.0f - area;
    }
    return CF_OK;
}

/* ---- mixing a batch ------------------------------------------------------------------------ */

cf_status cf_mix_inputs(cf_mix_kind kind, const cf_mix_draws *d, const cf_tensor *x, float *out) {
    const int bs = d->bs;
    if (!x || x->shape.ndim < 1 || x->shape.dim[0] != bs)
        return cf_fail(CF_ERR_INVALID, "mix: input batch does not hold the %d drawn samples", bs);
    const size_t per = cf_tensor_numel(x) / (size_t)bs;
    if (kind == CF_MIX_MIXUP) {
        /* torch.lerp(x[perm], x, lam) */
        for (int i = 0; i < bs; i++) {
            const float *a = x->data + (size_t)i * per, *b = x->data + (size_t)d->perm[i] * per;
            float *o = out + (size_t)i * per;
            const float lam = d->lam[i];
            for (size_t j = 0; j < per; j++) o[j] = b[j] + lam * (a[j] - b[j]);
        }
        return CF_OK;
    }
    if (x->shape.ndim < 3)
        return cf_fail(CF_ERR_INVALID, "CutMix: input of %d dimensions is not (N, ..., H, W)",
                       x->shape.ndim);
    const int h = x->shape.dim[x->shape.ndim - 2], w = x->shape.dim[x->shape.ndim - 1];
    if (d->x2 > w || d->y2 > h)
        return cf_fail(CF_ERR_INVALID, "CutMix: box (%d, %d)-(%d, %d) outside a %dx%d image", d->x1,
                       d->y1, d->x2, d->y2, h, w);
    if (out != x->data) memcpy(out, x->data, cf_tensor_numel(x) * sizeof(float));
    const size_t planes = per / ((size_t)h * (size_t)w);
    for (int i = 0; i < bs; i++)
        for (size_t p = 0; p < planes; p++) {
            const float *src = x->data + (size_t)d->perm[i] * per + p * (size_t)h * w;
            float *dst = out + (size_t)i * per + p * (size_t)h * w;
            for (int yy = d->y1; yy < d->y2; yy++)
                memcpy(dst + (size_t)yy * w + d->x1, src + (size_t)yy * w + d->x1,
                       (size_t)(d->x2 - d->x1) * sizeof(float));
        }
    return CF_OK;
}

void cf_mix_targets(const cf_mix_draws *d, const cf_tensor *y, float *out) {
    const size_t per = cf_tensor_numel(y) / (size_t)d->bs;
    for (int i = 0; i < d->bs; i++) {
        const float *a = y->data + (size_t)i * per, *b = y->data + (size_t)d->perm[i] * per;
        float *o = out + (size_t)i * per;
        for (size_t j = 0; j < per; j++) o[j] = b[j] + d->lam[i] * (a[j] - b[j]);
    }
}

cf_status cf_mix_class_targets(const cf_mix_draws *d, const cf_loss *loss, const cf_shape *pred,
                               const cf_tensor *y, float *out) {
    const int bs = d->bs;
    if (pred->ndim < 2 || pred->dim[0] != bs)
        return cf_fail(CF_ERR_INVALID, "mix: prediction does not hold the %d drawn samples", bs);
    const bool axis1 = loss->axis == 1 && pred->ndim > 2;
    const int c = axis1 ? pred->dim[1] : pred->dim[pred->ndim - 1];
    const size_t rows = cf_shape_numel(pred) / (size_t)c, k = rows / (size_t)bs;
    if (cf_tensor_numel(y) != rows)
        return cf_fail(CF_ERR_INVALID,
                       "mix: %zu targets for a prediction of %zu rows of %d class scores",
                       cf_tensor_numel(y), rows, c);
    memset(out, 0, cf_shape_numel(pred) * sizeof(float));
    const size_t stride = axis1 ? k : 1;
    for (int i = 0; i < bs; i++)
        for (size_t s = 0; s < k; s++) {
            const size_t r = (size_t)i * k + s, r2 = (size_t)d->perm[i] * k + s;
            const size_t base = axis1 ? (size_t)i * c * k + s : r * (size_t)c;
            const float ta = y->data[r], tb = y->data[r2];
            if (!(ta >= 0 && ta < (float)c && tb >= 0 && tb < (float)c))
                return cf_fail(CF_ERR_INVALID, "mix: target[%zu] = %g is not a class in [0, %d)",
                               ta >= 0 && ta < (float)c ? r2 : r,
                               (double)(ta >= 0 && ta < (float)c ? tb : ta), c);
            out[base + (size_t)ta * stride] += d->lam[i];
            out[base + (size_t)tb * stride] += 1.0f - d->lam[i];
        }
    return CF_OK;
}

/* ---- the callbacks ------------------------------------------------------------------------- */

typedef struct mixer {
    cf_mix_kind kind;
    double alpha;
    cf_mix_draws draws;
    cf_batch batch; /* the mixed copy the loop trains on */
    float *x, *y;
    size_t x_cap, y_cap;
} mixer;

static bool grow(float **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    float *p = cf_malloc(need * sizeof(float));
    if (!p) return false;
    cf_free(*buf);
    *buf = p;
    *cap = need;
    return true;
}

static cf_status mix_before_batch(cf_callback *cb, cf_learner *learn) {
    mixer *m = cb->state;
    const cf_batch *b = learn->batch;
    if (!learn->training || !b || b->size < 1) return CF_OK;
    const cf_shape *xs = &b->x.shape;
    const int h = xs->ndim >= 3 ? xs->dim[xs->ndim - 2] : 0;
    const int w = xs->ndim >= 3 ? xs->dim[xs->ndim - 1] : 0;
    cf_status st = cf_mix_draw(m->kind, m->alpha, learn->seed, cf__data_epoch(learn), learn->iter,
                               b->size, h, w, &m->draws);
    if (st != CF_OK) return st;
    if (!grow(&m->x, &m->x_cap, cf_tensor_numel(&b->x)) ||
        !grow(&m->y, &m->y_cap, cf_tensor_numel(&b->y)))
        return cf_fail_context(CF_ERR_NOMEM, "mix batch");
    if ((st = cf_mix_inputs(m->kind, &m->draws, &b->x, m->x)) != CF_OK) return st;
    m->batch = *b;
    m->batch.x = cf_tensor_view(m->x, b->x.shape);
    if (learn->loss.kind == CF_LOSS_CROSS_ENTROPY) {
        m->batch.y = b->y; /* class codes until after_pred knows the classes */
    } else {
        cf_mix_targets(&m->draws, &b->y, m->y);
        m->batch.y = cf_tensor_view(m->y, b->y.shape);
    }
    learn->batch = &m->batch;
    return CF_OK;
}

static cf_status mix_after_pred(cf_callback *cb, cf_learner *learn) {
    mixer *m = cb->state;
    if (!learn->training || learn->batch != &m->batch ||
        learn->loss.kind != CF_LOSS_CROSS_ENTROPY || !learn->pred)
        return CF_OK;
    const cf_shape *ps = &learn->pred->shape;
    if (!grow(&m->y, &m->y_cap, cf_shape_numel(ps)))
        return cf_fail_context(CF_ERR_NOMEM, "mix targets");
    cf_status st = cf_mix_class_targets(&m->draws, &learn->loss, ps, &m->batch.y, m->y);
    if (st != CF_OK) return st;
    m->batch.y = cf_tensor_view(m->y, *ps);
    return CF_OK;
}

static void mixer_free(cf_callback *cb) {
    if (!cb) return;
    mixer *m = cb->state;
    if (m) {
        cf_free(m->x);
        cf_free(m->y);
    }
    cf_free(cb->state);
    cf_free(cb);
}

static cf_callback *mixer_new(const char *name, cf_mix_kind kind, double alpha) {
    if (!(alpha > 0) || !isfinite(alpha)) {
        cf_fail(CF_ERR_INVALID, "%s: alpha %g must be positive", name, alpha);
        return NULL;
    }
    cf_callback *cb = cf_callback_new(name, CF_ORDER_DEFAULT, sizeof(mixer));
    if (!cb) return NULL;
    mixer *m = cb->state;
    m->kind = kind;
    m->alpha = alpha;
    cb->skip_valid = true;
    cb->free = mixer_free;
    cb->on[CF_EV_BEFORE_BATCH] = mix_before_batch;
    cb->on[CF_EV_AFTER_PRED] = mix_after_pred;
    return cb;
}

cf_callback *cf_mixup_cb(double alpha) {
    return mixer_new("MixUp", CF_MIX_MIXUP, alpha == 0 ? 0.4 : alpha);
}

cf_callback *cf_cutmix_cb(double alpha) {
    return mixer_new("CutMix", CF_MIX_CUTMIX, alpha == 0 ? 1.0 : alpha);
}
