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
        /* (N, C) with (N) or (N, 1); flat: (N, ..., C) with (N, ...) */
        bool target_ok = target->shape.dim[0] == n;
        if (pred->shape.ndim == 2)
            target_ok = target_ok && (target->shape.ndim == 1 ||
                                      (target->shape.ndim == 2 && target->shape.dim[1] == 1));
        else {
            target_ok = target_ok && target->shape.ndim == pred->shape.ndim - 1;
            for (int d = 1; target_ok && d < target->shape.ndim; d++)
                target_ok = target->shape.dim[d] == pred->shape.dim[d];
        }
        if (!target_ok)
            return cf_fail(CF_ERR_INVALID,
                           "cross-entropy loss: target %s does not fit pred %s (expected (%d) "
                           "class codes, or pred's shape without its last dimension)",
                           st, sp, n);
        if (!(loss->label_smoothing >= 0.0f && loss->label_smoothing <= 1.0f))
            return cf_fail(CF_ERR_INVALID, "cross-entropy loss: label_smoothing %g not in [0, 1]",
                           (double)loss->label_smoothing);
        const int c = pred->shape.dim[pred->shape.ndim - 1];
        const size_t rows = cf_tensor_numel(pred) / (size_t)c;
        for (size_t i = 0; i < rows; i++)
            if (class_code(target->data[i], c) < 0)
                return cf_fail(CF_ERR_INVALID,
                               "cross-entropy loss: target[%zu] = %g is not a class code in [0, "
                               "%d)",
                               i, (double)target->data[i], c);
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
    }
    return CF_OK;
}

/* log(sum(exp(row))) with the max subtracted. */
static double log_sum_exp(const float *row, int c) {
    float mx = row[0];
    for (int j = 1; j < c; j++) mx = row[j] > mx ? row[j] : mx;
    double s = 0;
    for (int j = 0; j < c; j++) s += exp((double)row[j] - mx);
    return mx + log(s);
}

static inline double bce_logits(double x, double t) {
    return (x > 0 ? x : 0) - x * t + log1p(exp(-fabs(x)));
}

static inline float sigmoidf(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

cf_status cf_loss_forward(const cf_loss *loss, const cf_tensor *pred, const cf_tensor *target,
                          float *mean_loss, float *per_item) {
    if (!loss) return cf_fail(CF_ERR_INVALID, "cf_loss_forward: no loss");
    cf_status st = check(loss, pred, target);
    if (st != CF_OK) return st;
    const int n = pred->shape.dim[0];
    double total = 0;
    if (loss->kind == CF_LOSS_CROSS_ENTROPY) {
        const int c = pred->shape.dim[pred->shape.ndim - 1];
        const size_t k = cf_tensor_numel(pred) / (size_t)c / (size_t)n; /* rows a sample */
        const double eps = loss->label_smoothing;
        for (int i = 0; i < n; i++) {
            double sample = 0;
            for (size_t r = (size_t)i * k; r < (size_t)(i + 1) * k; r++) {
                const float *row = pred->data + r * c;
                double lse = log_sum_exp(row, c);
                double l = (1 - eps) * (lse - row[class_code(target->data[r], c)]);
                if (eps > 0) {
                    double s = 0;
                    for (int j = 0; j < c; j++) s += row[j];
                    l += eps * (lse - s / c);
                }
                sample += l;
            }
            total += sample;
            if (per_item) per_item[i] = (float)(k == 1 ? sample : sample / (double)k);
        }
        *mean_loss = (float)(total / ((double)n * (double)k));
        return CF_OK;
    }
    const size_t per = cf_tensor_numel(pred) / (size_t)n;
    for (int i = 0; i < n; i++) {
        const float *p = pred->data + (size_t)i * per, *t = target->data + (size_t)i * per;
        double s = 0;
        if (loss->kind == CF_LOSS_MSE)
            for (size_t j = 0; j < per; j++) {
                double d = (double)p[j] - t[j];
                s += d * d;
            }
        else
            for (size_t j = 0; j < per; j++) s += bce_logits(p[j], t[j]);
        total += s;
        if (per_item) per_item[i] = (float)(s / per);
    }
    *mean_loss = (float)(total / ((double)n * per));
    return CF_OK;
}

void cf_loss_backward(const cf_loss *loss, const cf_tensor *pred, const cf_tensor *target,
                      cf_tensor *dpred) {
    const size_t total = cf_tensor_numel(pred);
    dpred->shape = pred->shape;
    if (loss->kind == CF_LOSS_CROSS_ENTROPY) {
        const int c = pred->shape.dim[pred->shape.ndim - 1];
        const size_t rows = total / (size_t)c; /* n, or n times the rows of a sample (flat) */
        const float eps = loss->label_smoothing, inv_n = 1.0f / (float)rows;
        const float off = eps / (float)c * inv_n, on = (1.0f - eps) * inv_n;
        for (size_t i = 0; i < rows; i++) {
            const float *row = pred->data + i * c;
            float *restrict g = dpred->data + i * c;
            float mx = row[0];
            for (int j = 1; j < c; j++) mx = row[j] > mx ? row[j] : mx;
            double s = 0;
            for (int j = 0; j < c; j++) s += exp((double)row[j] - mx);
            const double scale = 1.0 / s;
            for (int j = 0; j < c; j++)
                g[j] = (float)(exp((double)row[j] - mx) * scale) * inv_n - off;
            int64_t t = class_code(target->data[i], c);
            if (t >= 0) g[t] -= on; /* invalid codes were refused by cf_loss_forward */
        }
        return;
    }
    const float inv = 1.0f / (float)total;
    const float *restrict p = pred->data, *restrict t = target->data;
    float *restrict g = dpred->data;
    if (loss->kind == CF_LOSS_MSE)
        for (size_t j = 0; j < total; j++) g[j] = 2.0f * (p[j] - t[j]) * inv;
    else
        for (size_t j = 0; j < total; j++) g[j] = (sigmoidf(p[j]) - t[j]) * inv;
}

void cf_loss_activation(const cf_loss *loss, const cf_tensor *pred, cf_tensor *out) {
    const size_t total = cf_tensor_numel(pred);
    out->shape = pred->shape;
    if (loss->kind == CF_LOSS_CROSS_ENTROPY) {
        const int c = pred->shape.dim[pred->shape.ndim - 1];
        for (size_t r = 0; r < total / (size_t)c; r++) {
            const float *row = pred->data + r * c;
            float *o = out->data + r * c;
            float mx = row[0];
            for (int j = 1; j < c; j++) mx = row[j] > mx ? row[j] : mx;
            double s = 0;
            for (int j = 0; j < c; j++) s += exp((double)row[j] - mx);
            const double scale = 1.0 / s;
            for (int j = 0; j < c; j++) o[j] = (float)(exp((double)row[j] - mx) * scale);
        }
    } else if (loss->kind == CF_LOSS_BCE_LOGITS) {
        for (size_t j = 0; j < total; j++) out->data[j] = sigmoidf(pred->data[j]);
    } else if (out->data != pred->data) {
        for (size_t j = 0; j < total; j++) out->data[j] = pred->data[j];
    }
}
