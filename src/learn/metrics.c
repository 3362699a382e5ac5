/* fastai's metrics (metrics.py) as additive accumulators.
 *
 * Every metric keeps sums in m->acc (totals and counts, or a confusion matrix), so that adding
 * the acc vectors of several processes gives the metric over the union of their samples:
 *   - AvgMetric (accuracy, error_rate, top_k_accuracy, mse, mae, user metrics):
 *     acc = [total, count], total += batch_value * n, count += n (n = rows not padding),
 *     value = total / count, as fastai's AvgMetric (total += func(pred, targ) * bs);
 *   - _rmse (an AccumMetric in fastai: sqrt of the MSE over every element seen):
 *     acc = [sum of squared errors, number of elements];
 *   - precision_score / recall_score / f1_score (sklearn through skm_to_fastai, predictions
 *     argmax'd): acc = the C x C confusion matrix, conf[target * C + predicted].
 * Rows whose pad flag is true are left out everywhere. */
#include "corefit/learn.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef enum metric_kind {
    MK_ACCURACY,
    MK_ERROR_RATE,
    MK_TOP_K,
    MK_PRECISION,
    MK_RECALL,
    MK_F1,
    MK_MSE,
    MK_MAE,
    MK_RMSE,
    MK_USER,
    MK_ACCURACY_MULTI,
    MK_FBETA_MULTI,
    MK_FOREGROUND_ACC,
    MK_DICE,
    MK_JACCARD,
    MK_DICE_MULTI,
} metric_kind;

typedef struct metric_state {
    metric_kind kind;
    int k;         /* top-k */
    int n_classes; /* confusion metrics */
    bool binary;   /* pos_label 1 */
    cf_batch_metric_fn fn;
    /* multi-label: threshold, sigmoid first, F-beta's beta and average */
    float thresh;
    bool sigmoid;
    double beta;
    cf_multi_average average;
    int bkg_idx; /* foreground_acc */
} metric_state;

/* ---- shapes -------------------------------------------------------------------------------- */

/* Rows of the flattened prediction: pred (B, ..., C) has numel/C rows of C scores; each sample
 * owns rows_per_sample consecutive rows (1 for the usual (B, C)). */
typedef struct rows_view {
    int64_t n_rows, rows_per_sample;
    int64_t c;            /* scores per row */
    int64_t targ_per_row; /* 1 for class codes */
    bool ok;
} rows_view;

static rows_view class_rows(const cf_tensor *pred, const cf_tensor *targ) {
    rows_view v = {0};
    if (!pred || !targ || !pred->data || !targ->data || pred->shape.ndim < 1) return v;
    int64_t b = pred->shape.dim[0];
    v.c = pred->shape.ndim >= 2 ? pred->shape.dim[pred->shape.ndim - 1] : 1;
    int64_t numel = (int64_t)cf_tensor_numel(pred);
    v.n_rows = pred->shape.ndim >= 2 ? numel / v.c : b;
    if (pred->shape.ndim < 2) v.c = 1;
    int64_t tn = (int64_t)cf_tensor_numel(targ);
    if (b <= 0 || v.n_rows % b != 0 || tn != v.n_rows) return v;
    v.rows_per_sample = v.n_rows / b;
    v.targ_per_row = 1;
    v.ok = true;
    return v;
}

static int64_t argmax_row(const float *p, int64_t c) {
    if (c == 1) return p[0] > 0.0f ? 1 : 0; /* one logit: sigmoid(x) > 0.5 */
    int64_t best = 0;
    for (int64_t j = 1; j < c; j++)
        if (p[j] > p[best]) best = j;
    return best;
}

static bool padded(const bool *pad, int64_t row, int64_t rows_per_sample) {
    return pad && pad[row / rows_per_sample];
}

/* Reads a class code stored as a float; -1 when it is not a non-negative integer. */
static int64_t class_code(float t) {
    if (!(t >= 0.0f) || t != floorf(t) || t > 1e9f) return -1;
    return (int64_t)t;
}

/* ---- accumulate ---------------------------------------------------------------------------- */

static void acc_accuracy(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ,
                         const bool *pad) {
    const metric_state *s = m->state;
    rows_view v = class_rows(pred, targ);
    if (!v.ok) return;
    /* fastai's AvgMetric weighs each batch's value by its samples: a sample of k rows (a
     * language model's tokens) counts 1, each of its rows 1/k */
    const double w = v.rows_per_sample == 1 ? 1.0 : 1.0 / (double)v.rows_per_sample;
    double correct = 0, count = 0;
    for (int64_t r = 0; r < v.n_rows; r++) {
        if (padded(pad, r, v.rows_per_sample)) continue;
        const float *p = pred->data + r * v.c;
        int64_t t = class_code(targ->data[r]);
        count += w;
        if (s->kind == MK_TOP_K) {
            if (t < 0 || t >= v.c) continue;
            /* rank of the target among the scores (ties: lower index first, as topk) */
            int64_t rank = 0;
            for (int64_t j = 0; j < v.c; j++)
                if (p[j] > p[t] || (p[j] == p[t] && j < t)) rank++;
            if (rank < s->k) correct += w;
        } else if (argmax_row(p, v.c) == t) {
            correct += w;
        }
    }
    if (s->kind == MK_ERROR_RATE) correct = count - correct;
    m->acc[0] += correct;
    m->acc[1] += count;
}

static void acc_confusion(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ,
                          const bool *pad) {
    const metric_state *s = m->state;
    rows_view v = class_rows(pred, targ);
    if (!v.ok) return;
    int64_t n = s->n_classes;
    for (int64_t r = 0; r < v.n_rows; r++) {
        if (padded(pad, r, v.rows_per_sample)) continue;
        int64_t t = class_code(targ->data[r]);
        int64_t p = argmax_row(pred->data + r * v.c, v.c);
        if (t < 0 || t >= n || p >= n) continue;
        m->acc[t * n + p] += 1;
    }
}

/* Regression: pred and targ hold the same number of elements per sample. */
static void acc_regression(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ,
                           const bool *pad) {
    const metric_state *s = m->state;
    if (!pred || !targ || pred->shape.ndim < 1) return;
    int64_t b = pred->shape.dim[0];
    int64_t numel = (int64_t)cf_tensor_numel(pred);
    if (b <= 0 || (int64_t)cf_tensor_numel(targ) != numel || numel % b) return;
    int64_t per = numel / b;
    double total = 0, count = 0;
    for (int64_t i = 0; i < b; i++) {
        if (pad && pad[i]) continue;
        double row = 0;
        for (int64_t j = 0; j < per; j++) {
            double d = (double)pred->data[i * per + j] - (double)targ->data[i * per + j];
            row += s->kind == MK_MAE ? fabs(d) : d * d;
        }
        if (s->kind == MK_RMSE) {
            total += row;
            count += (double)per;
        } else {
            total += row / (double)per; /* the sample's mean, weighted by 1 sample */
            count += 1;
        }
    }
    m->acc[0] += total;
    m->acc[1] += count;
}

static void acc_user(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ, const bool *pad) {
    const metric_state *s = m->state;
    int n = 0;
    double v = s->fn(pred, targ, pad, &n);
    if (n <= 0) return;
    m->acc[0] += v * n;
    m->acc[1] += n;
}

/* ---- values -------------------------------------------------------------------------------- */

static double value_avg(const cf_metric *m) {
    if (!(m->acc[1] > 0)) return NAN;
    return m->acc[0] / m->acc[1];
}

static double value_rmse(const cf_metric *m) {
    if (!(m->acc[1] > 0)) return NAN;
    return sqrt(m->acc[0] / m->acc[1]);
}

static double safe_div(double a, double b) {
    return b > 0 ? a / b : 0.0;
}

/* sklearn's precision/recall/f1 with zero_division 0: binary (pos_label 1) or macro over the
 * labels that occur in the targets or the predictions (sklearn's unique_labels). */
static double value_confusion(const cf_metric *m) {
    const metric_state *s = m->state;
    int n = s->n_classes;
    double total = 0;
    for (int i = 0; i < n * n; i++) total += m->acc[i];
    if (!(total > 0)) return NAN;
    double sum = 0;
    int used = 0;
    for (int c = 0; c < n; c++) {
        if (s->binary && c != 1) continue;
        double tp = m->acc[c * n + c], row = 0, col = 0;
        for (int j = 0; j < n; j++) {
            row += m->acc[c * n + j]; /* targets equal to c: tp + fn */
            col += m->acc[j * n + c]; /* predictions equal to c: tp + fp */
        }
        if (!s->binary && row == 0 && col == 0) continue;
        double v = s->kind == MK_PRECISION ? safe_div(tp, col)
                   : s->kind == MK_RECALL  ? safe_div(tp, row)
                                           : safe_div(2 * tp, row + col);
        sum += v;
        used++;
    }
    return used ? sum / used : 0.0;
}

/* ---- multi-label and segmentation ------------------------------------------------------- */

static inline float sigmoid_of(float x) {
    return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

/* Samples and values per sample of a multi-label batch (pred and targ of the same numel). */
static bool multi_view(const cf_tensor *pred, const cf_tensor *targ, int64_t *b, int64_t *per) {
    if (!pred || !targ || !pred->data || !targ->data || pred->shape.ndim < 1) return false;
    *b = pred->shape.dim[0];
    int64_t numel = (int64_t)cf_tensor_numel(pred);
    if (*b <= 0 || numel % *b || (int64_t)cf_tensor_numel(targ) != numel) return false;
    *per = numel / *b;
    return true;
}

/* accuracy_multi: fastai's AvgMetric of the batch mean of (p > thresh) == targ over B * C. */
static void acc_accuracy_multi(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ,
                               const bool *pad) {
    const metric_state *s = m->state;
    int64_t b, per;
    if (!multi_view(pred, targ, &b, &per)) return;
    for (int64_t i = 0; i < b; i++) {
        if (pad && pad[i]) continue;
        int64_t right = 0;
        for (int64_t j = 0; j < per; j++) {
            float p = pred->data[i * per + j];
            if (s->sigmoid) p = sigmoid_of(p);
            right += (float)(p > s->thresh) == targ->data[i * per + j];
        }
        m->acc[0] += (double)right / (double)per;
        m->acc[1] += 1;
    }
}

static double fbeta_of(double tp, double fp, double fn, double beta) {
    const double b2 = beta * beta, den = (1 + b2) * tp + b2 * fn + fp;
    return den > 0 ? (1 + b2) * tp / den : 0.0;
}

/* FBetaMulti: acc = [tp, fp, fn] per class, then the sum of per-sample scores and the samples
 * (sklearn's average='samples'). Predictions: p >= thresh, as skm_to_fastai's. */
static void acc_fbeta_multi(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ,
                            const bool *pad) {
    const metric_state *s = m->state;
    int64_t b, per;
    if (!multi_view(pred, targ, &b, &per) || per != s->n_classes) return;
    const int c = s->n_classes;
    for (int64_t i = 0; i < b; i++) {
        if (pad && pad[i]) continue;
        double tp = 0, fp = 0, fn = 0;
        for (int j = 0; j < c; j++) {
            float p = pred->data[i * per + j];
            if (s->sigmoid) p = sigmoid_of(p);
            const bool yp = p >= s->thresh, yt = targ->data[i * per + j] > 0.5f;
            m->acc[3 * j + 0] += yp && yt;
            m->acc[3 * j + 1] += yp && !yt;
            m->acc[3 * j + 2] += !yp && yt;
            tp += yp && yt, fp += yp && !yt, fn += !yp && yt;
        }
        m->acc[3 * c] += fbeta_of(tp, fp, fn, s->beta);
        m->acc[3 * c + 1] += 1;
    }
}

static double value_fbeta_multi(const cf_metric *m) {
    const metric_state *s = m->state;
    const int c = s->n_classes;
    if (!(m->acc[3 * c + 1] > 0)) return NAN;
    switch (s->average) {
    case CF_AVERAGE_MICRO: {
        double tp = 0, fp = 0, fn = 0;
        for (int j = 0; j < c; j++)
            tp += m->acc[3 * j], fp += m->acc[3 * j + 1], fn += m->acc[3 * j + 2];
        return fbeta_of(tp, fp, fn, s->beta);
    }
    case CF_AVERAGE_WEIGHTED: {
        double sum = 0, support = 0;
        for (int j = 0; j < c; j++) {
            const double sup = m->acc[3 * j] + m->acc[3 * j + 2];
            sum += sup * fbeta_of(m->acc[3 * j], m->acc[3 * j + 1], m->acc[3 * j + 2], s->beta);
            support += sup;
        }
        return support > 0 ? sum / support : 0.0;
    }
    case CF_AVERAGE_SAMPLES:
        return m->acc[3 * c] / m->acc[3 * c + 1];
    case CF_AVERAGE_MACRO:
    default: {
        double sum = 0;
        for (int j = 0; j < c; j++)
            sum += fbeta_of(m->acc[3 * j], m->acc[3 * j + 1], m->acc[3 * j + 2], s->beta);
        return sum / c;
    }
    }
}

/* Segmentation: pred (B, C, ...) logits, targ (B, ...) class codes; the argmax over axis 1 of
 * pixel `s` of sample i. */
static bool seg_view(const cf_tensor *pred, const cf_tensor *targ, int64_t *b, int64_t *c,
                     int64_t *spatial) {
    if (!pred || !targ || !pred->data || !targ->data || pred->shape.ndim < 2) return false;
    *b = pred->shape.dim[0];
    *c = pred->shape.dim[1];
    int64_t numel = (int64_t)cf_tensor_numel(pred);
    if (*b <= 0 || *c <= 0) return false;
    *spatial = numel / (*b * *c);
    return (int64_t)cf_tensor_numel(targ) == *b * *spatial;
}

static int64_t seg_argmax(const float *p, int64_t c, int64_t spatial) {
    int64_t best = 0;
    for (int64_t j = 1; j < c; j++)
        if (p[j * spatial] > p[best * spatial]) best = j;
    return best;
}

/* foreground_acc: fastai's AvgMetric of the batch's accuracy over pixels whose target is not
 * bkg_idx; a batch without such pixels adds nothing (fastai's mean would be NaN). */
static void acc_foreground(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ,
                           const bool *pad) {
    const metric_state *s = m->state;
    int64_t b, c, sp;
    if (!seg_view(pred, targ, &b, &c, &sp)) return;
    double right = 0, pixels = 0, samples = 0;
    for (int64_t i = 0; i < b; i++) {
        if (pad && pad[i]) continue;
        samples++;
        for (int64_t k = 0; k < sp; k++) {
            const float t = targ->data[i * sp + k];
            if (t == (float)s->bkg_idx) continue;
            pixels++;
            right += (float)seg_argmax(pred->data + i * c * sp + k, c, sp) == t;
        }
    }
    if (!(pixels > 0)) return;
    m->acc[0] += right / pixels * samples;
    m->acc[1] += samples;
}

/* Dice / JaccardCoeff (binary): acc = [sum(pred * targ), sum(pred + targ)] with pred the argmax
 * class; DiceMulti: acc = [inter_c, union_c] per class. */
static void acc_dice(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ, const bool *pad) {
    const metric_state *s = m->state;
    int64_t b, c, sp;
    if (!seg_view(pred, targ, &b, &c, &sp)) return;
    for (int64_t i = 0; i < b; i++) {
        if (pad && pad[i]) continue;
        for (int64_t k = 0; k < sp; k++) {
            const int64_t p = seg_argmax(pred->data + i * c * sp + k, c, sp);
            const float t = targ->data[i * sp + k];
            if (s->kind != MK_DICE_MULTI) {
                m->acc[0] += (double)p * t;
                m->acc[1] += (double)p + t;
                continue;
            }
            const int64_t tc = class_code(t);
            if (tc == p && p < s->n_classes) m->acc[2 * p] += 1;
            if (p < s->n_classes) m->acc[2 * p + 1] += 1;
            if (tc >= 0 && tc < s->n_classes) m->acc[2 * tc + 1] += 1;
        }
    }
}

static double value_dice(const cf_metric *m) {
    const metric_state *s = m->state;
    if (s->kind == MK_DICE_MULTI) {
        double sum = 0;
        int used = 0;
        for (int j = 0; j < s->n_classes; j++)
            if (m->acc[2 * j + 1] > 0) sum += 2 * m->acc[2 * j] / m->acc[2 * j + 1], used++;
        return used ? sum / used : NAN;
    }
    if (!(m->acc[1] > 0)) return NAN; /* fastai's None */
    return s->kind == MK_DICE ? 2 * m->acc[0] / m->acc[1] : m->acc[0] / (m->acc[1] - m->acc[0]);
}

/* ---- construction -------------------------------------------------------------------------- */

static void metric_free_default(cf_metric *m) {
    if (!m) return;
    cf_free(m->acc);
    cf_free(m->state);
    cf_free(m);
}

static cf_metric *metric_new(const char *name, metric_kind kind, int n_acc, bool lower) {
    cf_metric *m = cf_calloc(1, sizeof *m);
    metric_state *s = cf_calloc(1, sizeof *s);
    double *acc = cf_calloc((size_t)n_acc, sizeof *acc);
    if (!m || !s || !acc) {
        cf_free(m);
        cf_free(s);
        cf_free(acc);
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    s->kind = kind;
    m->state = s;
    m->acc = acc;
    m->n_acc = n_acc;
    m->free = metric_free_default;
    m->lower_is_better = lower;
    switch (kind) {
    case MK_ACCURACY:
    case MK_ERROR_RATE:
    case MK_TOP_K:
        m->accumulate = acc_accuracy;
        m->value = value_avg;
        break;
    case MK_PRECISION:
    case MK_RECALL:
    case MK_F1:
        m->accumulate = acc_confusion;
        m->value = value_confusion;
        break;
    case MK_MSE:
    case MK_MAE:
        m->accumulate = acc_regression;
        m->value = value_avg;
        break;
    case MK_RMSE:
        m->accumulate = acc_regression;
        m->value = value_rmse;
        break;
    case MK_USER:
        m->accumulate = acc_user;
        m->value = value_avg;
        break;
    case MK_ACCURACY_MULTI:
        m->accumulate = acc_accuracy_multi;
        m->value = value_avg;
        break;
    case MK_FBETA_MULTI:
        m->accumulate = acc_fbeta_multi;
        m->value = value_fbeta_multi;
        break;
    case MK_FOREGROUND_ACC:
        m->accumulate = acc_foreground;
        m->value = value_avg;
        break;
    case MK_DICE:
    case MK_JACCARD:
    case MK_DICE_MULTI:
        m->accumulate = acc_dice;
        m->value = value_dice;
        break;
    }
    return m;
}

cf_metric *cf_accuracy(void) {
    return metric_new("accuracy", MK_ACCURACY, 2, false);
}
cf_metric *cf_error_rate(void) {
    return metric_new("error_rate", MK_ERROR_RATE, 2, true);
}

cf_metric *cf_top_k_accuracy(int k) {
    if (k < 1) {
        cf_fail(CF_ERR_INVALID, "cf_top_k_accuracy: k must be at least 1 (got %d)", k);
        return NULL;
    }
    cf_metric *m = metric_new("top_k_accuracy", MK_TOP_K, 2, false);
    if (m) ((metric_state *)m->state)->k = k;
    return m;
}

static cf_metric *confusion_metric(const char *name, metric_kind kind, int n_classes, bool macro) {
    if (n_classes < 2 || n_classes > 4096) {
        cf_fail(CF_ERR_INVALID, "%s: n_classes must be in [2, 4096] (got %d)", name, n_classes);
        return NULL;
    }
    cf_metric *m = metric_new(name, kind, n_classes * n_classes, false);
    if (!m) return NULL;
    metric_state *s = m->state;
    s->n_classes = n_classes;
    s->binary = n_classes == 2 && !macro;
    return m;
}

cf_metric *cf_precision(int n_classes, bool macro) {
    return confusion_metric("precision_score", MK_PRECISION, n_classes, macro);
}
cf_metric *cf_recall(int n_classes, bool macro) {
    return confusion_metric("recall_score", MK_RECALL, n_classes, macro);
}
cf_metric *cf_f1_score(int n_classes, bool macro) {
    return confusion_metric("f1_score", MK_F1, n_classes, macro);
}

cf_metric *cf_mse_metric(void) {
    return metric_new("mse", MK_MSE, 2, true);
}
cf_metric *cf_mae(void) {
    return metric_new("mae", MK_MAE, 2, true);
}
/* fastai names the column after the function AccumMetric wraps: "_rmse". */
cf_metric *cf_rmse(void) {
    return metric_new("_rmse", MK_RMSE, 2, true);
}

cf_metric *cf_accuracy_multi(float thresh, bool no_sigmoid) {
    cf_metric *m = metric_new("accuracy_multi", MK_ACCURACY_MULTI, 2, false);
    if (!m) return NULL;
    metric_state *s = m->state;
    s->thresh = thresh > 0 ? thresh : 0.5f;
    s->sigmoid = !no_sigmoid;
    return m;
}

cf_metric *cf_fbeta_multi(double beta, int n_classes, cf_multi_average average, float thresh,
                          bool no_sigmoid) {
    if (n_classes < 1 || n_classes > 4096) {
        cf_fail(CF_ERR_INVALID, "fbeta_multi: n_classes must be in [1, 4096] (got %d)", n_classes);
        return NULL;
    }
    if (!(beta > 0) || !isfinite(beta)) {
        cf_fail(CF_ERR_INVALID, "fbeta_multi: beta %g must be positive", beta);
        return NULL;
    }
    if ((int)average < 0 || average > CF_AVERAGE_SAMPLES) {
        cf_fail(CF_ERR_INVALID, "fbeta_multi: unknown average %d", (int)average);
        return NULL;
    }
    /* fastai names the column after the sklearn function: f1_score / fbeta_score */
    cf_metric *m = metric_new(beta == 1.0 ? "f1_score" : "fbeta_score", MK_FBETA_MULTI,
                              3 * n_classes + 2, false);
    if (!m) return NULL;
    metric_state *s = m->state;
    s->n_classes = n_classes;
    s->beta = beta;
    s->average = average;
    s->thresh = thresh > 0 ? thresh : 0.5f;
    s->sigmoid = !no_sigmoid;
    return m;
}

cf_metric *cf_f1_score_multi(int n_classes, cf_multi_average average) {
    return cf_fbeta_multi(1.0, n_classes, average, 0.5f, false);
}

cf_metric *cf_foreground_acc(int bkg_idx) {
    cf_metric *m = metric_new("foreground_acc", MK_FOREGROUND_ACC, 2, false);
    if (m) ((metric_state *)m->state)->bkg_idx = bkg_idx;
    return m;
}

cf_metric *cf_dice(void) {
    return metric_new("dice", MK_DICE, 2, false);
}

cf_metric *cf_jaccard_coeff(void) {
    return metric_new("jaccard_coeff", MK_JACCARD, 2, false);
}

cf_metric *cf_dice_multi(int n_classes) {
    if (n_classes < 1 || n_classes > 4096) {
        cf_fail(CF_ERR_INVALID, "dice_multi: n_classes must be in [1, 4096] (got %d)", n_classes);
        return NULL;
    }
    cf_metric *m = metric_new("dice_multi", MK_DICE_MULTI, 2 * n_classes, false);
    if (m) ((metric_state *)m->state)->n_classes = n_classes;
    return m;
}

cf_metric *cf_avg_metric(const char *name, cf_batch_metric_fn fn) {
    if (!name || !*name || !fn) {
        cf_fail(CF_ERR_INVALID, "cf_avg_metric: a name and a function are required");
        return NULL;
    }
    if (strlen(name) >= sizeof(((cf_metric *)0)->name)) {
        cf_fail(CF_ERR_INVALID, "cf_avg_metric: name '%s' is longer than %zu characters", name,
                sizeof(((cf_metric *)0)->name) - 1);
        return NULL;
    }
    cf_metric *m = metric_new(name, MK_USER, 2, false);
    if (!m) return NULL;
    ((metric_state *)m->state)->fn = fn;
    m->lower_is_better = strstr(name, "loss") || strstr(name, "error");
    return m;
}

void cf_metric_reset(cf_metric *m) {
    if (m && m->acc && m->n_acc > 0) memset(m->acc, 0, (size_t)m->n_acc * sizeof *m->acc);
}

void cf_metric_free(cf_metric *m) {
    if (!m) return;
    if (m->free)
        m->free(m);
    else
        metric_free_default(m);
}

double cf_metric_value(const cf_metric *m) {
    if (!m || !m->value) return NAN;
    return m->value(m);
}
