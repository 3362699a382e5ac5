/* Losses with PyTorch's semantics (mean reduction): CrossEntropyLoss (with label_smoothing),
 * MSELoss, BCEWithLogitsLoss. Sums are taken in double.
 *
 * Shapes: cross-entropy takes pred (N, C) and target (N) or (N, 1) of class codes stored as
 * floats, or, as fastai's CrossEntropyLossFlat, pred (N, ..., C) and target (N, ...) (a language
 * model's (B, T, V) logits and (B, T) next-token ids): the mean over every row of C scores, and
 * per_item[i] the mean over sample i's rows, so that a validation loss weighted by samples is
 * fastai's (each batch's mean loss times its rows). MSE and BCE take a target of pred's shape, or
 * of the same batch size and number of values (compared flattened, as fastai's MSELossFlat /
 * BCEWithLogitsLossFlat, never broadcast). per_item[i] is sample i's loss (the mean over its values
 * for MSE and BCE). */
#include "corefit/nn.h"

#include <math.h>
#include <stdio.h>

static const char *loss_name(cf_loss_kind kind) {
    switch (kind) {
    case CF_LOSS_CROSS_ENTROPY:
        return "cross-entropy";
    case CF_LOSS_MSE:
        return "MSE";
    case CF_LOSS_BCE_LOGITS:
        return "BCE-with-logits";
    }
    return "loss";
}

/* The class code of a target value, or -1 when it is not an integer in [0, c). */
static inline int64_t class_code(float v, int c) {
    if (!(v >= 0.0f && v < (float)c) || v != floorf(v)) return -1;
    return (int64_t)v;
}

/* Where a cross-entropy's scores sit: `rows` rows of `c` class scores; row r's score j at
 * pred[base(r) + j * stride]. Class axis last: base r * c, stride 1. Class axis 1 (fastai's
 * CrossEntropyLossFlat(axis=1), pred (N, C, ...)): `spatial` positions a sample, base
 * (r / spatial) * c * spatial + r % spatial, stride spatial. Rows are in target order: sample
 * by sample, then position. */
typedef struct ce_layout {
    int c;
    size_t rows, rows_per_sample, spatial, stride;
    bool soft; /* target of pred's shape: class probabilities, not codes */
} ce_layout;

static inline size_t ce_base(const ce_layout *L, size_t r) {
    if (L->stride == 1) return r * (size_t)L->c;
    return (r / L->spatial) * (size_t)L->c * L->spatial + r % L->spatial;
}

/* The layout of pred for this loss; false when the class axis is out of pred's range. */
static bool ce_layout_of(const cf_loss *loss, const cf_tensor *pred, const cf_tensor *target,
                         ce_layout *L) {
    const cf_shape *s = &pred->shape;
    const int n = s->dim[0];
    const bool axis1 = loss->axis == 1 && s->ndim > 2;
    L->c = axis1 ? s->dim[1] : s->dim[s->ndim - 1];
    const size_t total = cf_tensor_numel(pred);
    L->rows = L->c > 0 ? total / (size_t)L->c : 0;
    L->rows_per_sample = n > 0 ? L->rows / (size_t)n : 0;
    L->spatial = axis1 ? L->rows_per_sample : 1;
    L->stride = axis1 ? L->spatial : 1;
    L->soft = false;
    if (target && target->shape.ndim == s->ndim && L->c > 1) {
        L->soft = true;
        for (int d = 0; d < s->ndim; d++) L->soft = L->soft && target->shape.dim[d] == s->dim[d];
    }
    return loss->axis == 0 || loss->axis == 1;
}

static cf_status check(const cf_loss *loss, const cf_tensor *pred, const cf_tensor *target) {
    const char *name = loss_name(loss->kind);
    char sp[64], st[64];
    if (!pred || !target || !pred->data || !target->data)
        return cf_fail(CF_ERR_INVALID, "%s loss: missing pred or target", name);
    cf_shape_str(&pred->shape, sp, sizeof sp);
    cf_shape_str(&target->shape, st, sizeof st);
    if (pred->shape.ndim < 1 || target->shape.ndim < 1)
        return cf_fail(CF_ERR_INVALID, "%s loss: empty pred %s or target %s", name, sp, st);
    const int n = pred->shape.dim[0];
    if (loss->kind == CF_LOSS_CROSS_ENTROPY) {
        if (pred->shape.ndim < 2)
            return cf_fail(CF_ERR_INVALID, "cross-entropy loss: pred %s must be (N, C) logits", sp);
        ce_layout L;
        if (!ce_layout_of(loss, pred, target, &L))
            return cf_fail(CF_ERR_INVALID, "cross-entropy loss: class axis %d is not 0 (last) or 1",
                           loss->axis);
        /* codes: (N, C) with (N) or (N, 1); flat: pred without its class axis; soft: pred's
         * shape */
        const int ax = loss->axis == 1 ? 1 : pred->shape.ndim - 1;
        bool target_ok = target->shape.dim[0] == n;
        if (L.soft)
            target_ok = true;
        else if (pred->shape.ndim == 2)
            target_ok = target_ok && (target->shape.ndim == 1 ||
                                      (target->shape.ndim == 2 && target->shape.dim[1] == 1));
        else {
            target_ok = target_ok && target->shape.ndim == pred->shape.ndim - 1;
            for (int d = 1, e = 1; target_ok && d < pred->shape.ndim; d++)
                if (d != ax) target_ok = target->shape.dim[e++] == pred->shape.dim[d];
        }
        if (!target_ok)
            return cf_fail(CF_ERR_INVALID,
                           "cross-entropy loss: target %s does not fit pred %s (expected (%d) "
                           "class codes, pred's shape without its class axis %d, or pred's shape "
                           "of class probabilities)",
                           st, sp, n, ax);
        if (!(loss->label_smoothing >= 0.0f && loss->label_smoothing <= 1.0f))
            return cf_fail(CF_ERR_INVALID, "cross-entropy loss: label_smoothing %g not in [0, 1]",
                           (double)loss->label_smoothing);
        if (L.soft) {
            const size_t total = cf_tensor_numel(target);
            for (size_t i = 0; i < total; i++)
                if (!(target->data[i] >= 0.0f && target->data[i] <= 1.0f))
                    return cf_fail(CF_ERR_INVALID,
                                   "cross-entropy loss: target[%zu] = %g is not a probability in "
                                   "[0, 1]",
                                   i, (double)target->data[i]);
            return CF_OK;
        }
        for (size_t i = 0; i < L.rows; i++)
            if (class_code(target->data[i], L.c) < 0)
                return cf_fail(CF_ERR_INVALID,
                               "cross-entropy loss: target[%zu] = %g is not a class code in [0, "
                               "%d)",
                               i, (double)target->data[i], L.c);
        return CF_OK;
    }
    if (loss->kind != CF_LOSS_MSE && loss->kind != CF_LOSS_BCE_LOGITS)
        return cf_fail(CF_ERR_INVALID, "unknown loss kind %d", (int)loss->kind);
    if (target->shape.dim[0] != n || cf_tensor_numel(target) != cf_tensor_numel(pred))
        return cf_fail(CF_ERR_INVALID,
                       "%s loss: target %s does not fit pred %s (expected the same shape)", name,
                       st, sp);
    if (loss->kind == CF_LOSS_BCE_LOGITS) {
        size_t total = cf_tensor_numel(target);
        for (size_t i = 0; i < total; i++)
            if (!(target->data[i] >= 0.0f && target->data[i] <= 1.0f))
                return cf_fail(CF_ERR_INVALID,
                               "BCE-with-logits loss: target[%zu] = %g is not in [0, 1]", i,
                               (double)target->data[i]);
        if (loss->pos_weight) {
            const int last = pred->shape.dim[pred->shape.ndim - 1];
            if (loss->n_pos_weight != last)
                return cf_fail(CF_ERR_INVALID,
                               "BCE-with-logits loss: %d pos_weight values for pred %s (expected "
                               "%d, one per value of the last dimension)",
                               loss->n_pos_weight, sp, last);
            for (int j = 0; j < last; j++)
                if (!(loss->pos_weight[j] >= 0.0f && isfinite(loss->pos_weight[j])))
                    return cf_fail(CF_ERR_INVALID,
                                   "BCE-with-logits loss: pos_weight[%d] = %g is not a finite "
                                   "non-negative weight",
                                   j, (double)loss->pos_weight[j]);
        }
    }
    return CF_OK;
}

/* log(sum(exp(row))) with the max subtracted, over a row of c scores `stride` apart. A
 * contiguous row (the class axis last) goes through the kernel table's float exp and lane sums
 * (cf_exp_shift_sum, within 1e-6 relative); a strided one through libm's double exp. */
static double log_sum_exp(const float *row, int c, size_t stride) {
    if (stride == 1) {
        enum { CHUNK = 2048 };
        float buf[CHUNK];
        const float mx = cf_row_max((size_t)c, row);
        double s = 0;
        for (int j0 = 0; j0 < c; j0 += CHUNK)
            s += cf_exp_shift_sum((size_t)(c - j0 < CHUNK ? c - j0 : CHUNK), row + j0, mx, buf);
        return mx + log(s);
    }
    float mx = row[0];
    for (int j = 1; j < c; j++) mx = row[j * stride] > mx ? row[j * stride] : mx;
    double s = 0;
    for (int j = 0; j < c; j++) s += exp((double)row[j * stride] - mx);
    return mx + log(s);
}

/* PyTorch's binary_cross_entropy_with_logits for one value; pos_weight pw scales the positive
 * term: (1 - t) x + (1 + (pw - 1) t) (log(1 + exp(-|x|)) + max(-x, 0)). */
static inline double bce_logits(double x, double t, double pw) {
    return (1 - t) * x + (1 + (pw - 1) * t) * (log1p(exp(-fabs(x))) + (x < 0 ? -x : 0));
}

static inline float sigmoidf(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* One row's cross-entropy against codes (t >= 0) or probabilities (soft, t < 0), smoothed as
 * CE against (1 - eps) target + eps / C. */
static double ce_row(const ce_layout *L, const float *row, const float *soft, int64_t code,
                     double eps) {
    const int c = L->c;
    const size_t stride = L->stride;
    const double lse = log_sum_exp(row, c, stride);
    double l = 0;
    if (soft)
        for (int j = 0; j < c; j++) l += (1 - eps) * soft[j * stride] * (lse - row[j * stride]);
    else
        l = (1 - eps) * (lse - row[code * stride]);
    if (eps > 0) {
        double s = 0;
        for (int j = 0; j < c; j++) s += row[j * stride];
        l += eps * (lse - s / c);
    }
    return l;
}

cf_status cf_loss_forward(const cf_loss *loss, const cf_tensor *pred, const cf_tensor *target,
                          float *mean_loss, float *per_item) {
    if (!loss) return cf_fail(CF_ERR_INVALID, "cf_loss_forward: no loss");
    cf_status st = check(loss, pred, target);
    if (st != CF_OK) return st;
    const int n = pred->shape.dim[0];
    double total = 0;
    if (loss->kind == CF_LOSS_CROSS_ENTROPY) {
        ce_layout L;
        ce_layout_of(loss, pred, target, &L);
        const size_t k = L.rows_per_sample;
        const double eps = loss->label_smoothing;
        for (int i = 0; i < n; i++) {
            double sample = 0;
            for (size_t r = (size_t)i * k; r < (size_t)(i + 1) * k; r++) {
                const size_t base = ce_base(&L, r);
                sample += L.soft ? ce_row(&L, pred->data + base, target->data + base, 0, eps)
                                 : ce_row(&L, pred->data + base, NULL,
                                          class_code(target->data[r], L.c), eps);
            }
            total += sample;
            if (per_item) per_item[i] = (float)(k == 1 ? sample : sample / (double)k);
        }
        *mean_loss = (float)(total / ((double)n * (double)k));
        return CF_OK;
    }
    const size_t per = cf_tensor_numel(pred) / (size_t)n;
    const int last = pred->shape.dim[pred->shape.ndim - 1];
    for (int i = 0; i < n; i++) {
        const float *p = pred->data + (size_t)i * per, *t = target->data + (size_t)i * per;
        double s = 0;
        if (loss->kind == CF_LOSS_MSE)
            for (size_t j = 0; j < per; j++) {
                double d = (double)p[j] - t[j];
                s += d * d;
            }
        else
            for (size_t j = 0; j < per; j++)
                s += bce_logits(p[j], t[j], loss->pos_weight ? loss->pos_weight[j % last] : 1.0);
        total += s;
        if (per_item) per_item[i] = (float)(s / per);
    }
    *mean_loss = (float)(total / ((double)n * per));
    return CF_OK;
}

/* Softmax of one row (stride apart) into out (same stride). A contiguous row takes the kernel
 * table's float exp (see log_sum_exp). */
static void softmax_row(const float *row, float *out, int c, size_t stride) {
    if (stride == 1) {
        const float mx = cf_row_max((size_t)c, row);
        const double s = cf_exp_shift_sum((size_t)c, row, mx, out);
        const float scale = (float)(1.0 / s);
        for (int j = 0; j < c; j++) out[j] *= scale;
        return;
    }
    float mx = row[0];
    for (int j = 1; j < c; j++) mx = row[j * stride] > mx ? row[j * stride] : mx;
    double s = 0;
    for (int j = 0; j < c; j++) s += exp((double)row[j * stride] - mx);
    const double scale = 1.0 / s;
    for (int j = 0; j < c; j++)
        out[j * stride] = (float)(exp((double)row[j * stride] - mx) * scale);
}

void cf_loss_backward(const cf_loss *loss, const cf_tensor *pred, const cf_tensor *target,
                      cf_tensor *dpred) {
    const size_t total = cf_tensor_numel(pred);
    dpred->shape = pred->shape;
    if (loss->kind == CF_LOSS_CROSS_ENTROPY) {
        ce_layout L;
        ce_layout_of(loss, pred, target, &L);
        const int c = L.c;
        const size_t stride = L.stride;
        const float eps = loss->label_smoothing, inv_n = 1.0f / (float)L.rows;
        const float off = eps / (float)c * inv_n, on = (1.0f - eps) * inv_n;
        for (size_t r = 0; r < L.rows; r++) {
            const size_t base = ce_base(&L, r);
            float *g = dpred->data + base;
            /* the softmax first, then the scale: a split batch's workers differ from one
             * process by a factor on the whole gradient, not by each value's rounding */
            softmax_row(pred->data + base, g, c, stride);
            if (L.soft) {
                const float *t = target->data + base;
                for (int j = 0; j < c; j++)
                    g[j * stride] = g[j * stride] * inv_n - off - on * t[j * stride];
            } else {
                for (int j = 0; j < c; j++) g[j * stride] = g[j * stride] * inv_n - off;
                int64_t t = class_code(target->data[r], c);
                if (t >= 0) g[t * stride] -= on; /* invalid codes were refused by cf_loss_forward */
            }
        }
        return;
    }
    const float inv = 1.0f / (float)total;
    const float *restrict p = pred->data, *restrict t = target->data;
    float *restrict g = dpred->data;
    if (loss->kind == CF_LOSS_MSE)
        for (size_t j = 0; j < total; j++) g[j] = 2.0f * (p[j] - t[j]) * inv;
    else if (loss->pos_weight) {
        const int last = pred->shape.dim[pred->shape.ndim - 1];
        for (size_t j = 0; j < total; j++) {
            const float lw = 1.0f + (loss->pos_weight[j % last] - 1.0f) * t[j];
            g[j] = ((1.0f - t[j]) + lw * (sigmoidf(p[j]) - 1.0f)) * inv;
        }
    } else
        for (size_t j = 0; j < total; j++) g[j] = (sigmoidf(p[j]) - t[j]) * inv;
}

void cf_loss_activation(const cf_loss *loss, const cf_tensor *pred, cf_tensor *out) {
    const size_t total = cf_tensor_numel(pred);
    out->shape = pred->shape;
    if (loss->kind == CF_LOSS_CROSS_ENTROPY) {
        ce_layout L;
        ce_layout_of(loss, pred, NULL, &L);
        for (size_t r = 0; r < L.rows; r++) {
            const size_t base = ce_base(&L, r);
            softmax_row(pred->data + base, out->data + base, L.c, L.stride);
        }
    } else if (loss->kind == CF_LOSS_BCE_LOGITS) {
        for (size_t j = 0; j < total; j++) out->data[j] = sigmoidf(pred->data[j]);
    } else if (out->data != pred->data) {
        for (size_t j = 0; j < total; j++) out->data[j] = pred->data[j];
    }
}

size_t cf_loss_decodes(const cf_loss *loss, const cf_tensor *act, float *out) {
    const size_t total = cf_tensor_numel(act);
    if (loss->kind == CF_LOSS_CROSS_ENTROPY && act->shape.ndim >= 2) {
        ce_layout L;
        ce_layout_of(loss, act, NULL, &L);
        for (size_t r = 0; r < L.rows; r++) {
            const float *row = act->data + ce_base(&L, r);
            int best = 0;
            for (int j = 1; j < L.c; j++)
                if (row[j * L.stride] > row[best * L.stride]) best = j;
            out[r] = (float)best;
        }
        return L.rows;
    }
    if (loss->kind == CF_LOSS_BCE_LOGITS) {
        const float thresh = loss->thresh > 0.0f ? loss->thresh : 0.5f;
        for (size_t j = 0; j < total; j++) out[j] = act->data[j] > thresh ? 1.0f : 0.0f;
        return total;
    }
    if (out != act->data)
        for (size_t j = 0; j < total; j++) out[j] = act->data[j];
    return total;
}
