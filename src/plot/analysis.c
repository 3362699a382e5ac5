/* Plot layer, the part that needs no PLplot: confusion counts, top losses, most_confused and
 * tick labels (see corefit/plot.h). */
#include "corefit/plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot_internal.h"

/* ---- always available: confusion counts and top losses ------------------------------------ */

int64_t cf_plot__row_argmax(const float *row, int n) {
    int64_t best = 0;
    for (int j = 1; j < n; j++)
        if (row[j] > row[best]) best = j;
    return best;
}

cf_status cf_confusion_from_preds(const cf_preds *p, int n_classes, int64_t *counts) {
    if (!p || !counts) return cf_fail(CF_ERR_INVALID, "confusion matrix: NULL preds or counts");
    if (n_classes < 1)
        return cf_fail(CF_ERR_INVALID, "confusion matrix: n_classes %d must be >= 1", n_classes);
    if (p->n < 0)
        return cf_fail(CF_ERR_INVALID, "confusion matrix: negative n %lld", (long long)p->n);
    if (!p->targs.data && p->n > 0)
        return cf_fail(CF_ERR_INVALID, "confusion matrix: predictions have no targets");
    if (p->n > 0 && (int64_t)cf_tensor_numel(&p->targs) != p->n) {
        char buf[64];
        return cf_fail(CF_ERR_INVALID,
                       "confusion matrix: targets %s must hold one class id per item (n = %lld)",
                       cf_shape_str(&p->targs.shape, buf, sizeof buf), (long long)p->n);
    }
    if (!p->decoded && p->n > 0) {
        if (!p->preds.data || p->preds.shape.ndim != 2 || p->preds.shape.dim[0] != p->n ||
            p->preds.shape.dim[1] != n_classes) {
            char buf[64];
            return cf_fail(CF_ERR_INVALID,
                           "confusion matrix: predictions %s do not match (n = %lld, "
                           "n_classes = %d) and no decoded classes were given",
                           cf_shape_str(&p->preds.shape, buf, sizeof buf), (long long)p->n,
                           n_classes);
        }
    }
    memset(counts, 0, sizeof(int64_t) * (size_t)n_classes * (size_t)n_classes);
    for (int64_t i = 0; i < p->n; i++) {
        float t = p->targs.data[i];
        if (!(t >= 0 && t < n_classes) || t != floorf(t))
            return cf_fail(CF_ERR_INVALID,
                           "confusion matrix: target %g of item %lld is not a class in [0, %d)",
                           (double)t, (long long)i, n_classes);
        int64_t pred = p->decoded
                           ? p->decoded[i]
                           : cf_plot__row_argmax(p->preds.data + i * (int64_t)n_classes, n_classes);
        if (pred < 0 || pred >= n_classes)
            return cf_fail(CF_ERR_INVALID,
                           "confusion matrix: decoded class %lld of item %lld is not in [0, %d)",
                           (long long)pred, (long long)i, n_classes);
        counts[(int64_t)t * n_classes + pred]++;
    }
    return CF_OK;
}

typedef struct loss_item {
    float loss;
    int64_t idx;
} loss_item;

static int cmp_loss_desc(const void *a, const void *b) {
    const loss_item *x = a, *y = b;
    /* NaN losses sort last; ties by index */
    bool xn = isnan(x->loss), yn = isnan(y->loss);
    if (xn != yn) return xn ? 1 : -1;
    if (!xn && x->loss != y->loss) return x->loss > y->loss ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

cf_status cf_top_losses(const cf_preds *p, int k, int64_t *idx_out) {
    if (!p || !idx_out) return cf_fail(CF_ERR_INVALID, "top_losses: NULL preds or output");
    if (!p->losses)
        return cf_fail(CF_ERR_INVALID,
                       "top_losses: predictions carry no per-item losses (get_preds with_loss)");
    if (k < 1 || k > p->n)
        return cf_fail(CF_ERR_INVALID, "top_losses: k = %d must be in [1, %lld]", k,
                       (long long)p->n);
    loss_item *items = cf_malloc(sizeof(loss_item) * (size_t)p->n);
    if (!items) return cf_fail_context(CF_ERR_NOMEM, "top_losses");
    for (int64_t i = 0; i < p->n; i++) items[i] = (loss_item){p->losses[i], i};
    qsort(items, (size_t)p->n, sizeof *items, cmp_loss_desc);
    for (int i = 0; i < k; i++) idx_out[i] = items[i].idx;
    cf_free(items);
    return CF_OK;
}

/* A tick label as matplotlib's ScalarFormatter writes it: every tick of an axis with the decimals
 * its step needs ("0.25", "0.30"; "2.0" for a step of 0.5; "20000"), never PLplot's shared
 * "(x10^-1)" factor; very large or small values in scientific notation ("2e-05"). */
void cf_plot__tick_label(double value, double step, char *buf, size_t n) {
    if (step > 0 && fabs(value) < step * 1e-9) value = 0; /* no "-0.0" */
    double mag = fabs(value) > 0 ? fabs(value) : step;
    if (!(step > 0) || mag >= 1e6 || step < 1e-4) {
        snprintf(buf, n, "%g", value);
        return;
    }
    int decimals = (int)ceil(-log10(step) - 1e-9);
    /* a step of 2.5 x 10^k needs one more digit than 10^k */
    double scaled = step * pow(10, decimals);
    if (fabs(scaled - round(scaled)) > 1e-6) decimals++;
    if (decimals < 0) decimals = 0;
    snprintf(buf, n, "%.*f", decimals, value);
}

int64_t cf_most_confused(const int64_t *counts, int n_classes, int64_t min_val,
                         cf_confused_pair *out, int64_t max_out) {
    if (!counts || n_classes < 1 || max_out < 0 || (max_out > 0 && !out)) {
        cf_fail(CF_ERR_INVALID, "most_confused: NULL counts or output, or n_classes %d", n_classes);
        return -1;
    }
    if (min_val < 1) min_val = 1;
    int64_t n = 0;
    /* insertion into the sorted prefix: stable, largest first */
    for (int a = 0; a < n_classes; a++)
        for (int b = 0; b < n_classes; b++) {
            int64_t k = counts[(int64_t)a * n_classes + b];
            if (a == b || k < min_val) continue;
            n++;
            if (max_out == 0) continue;
            int64_t at = n - 1 < max_out ? n - 1 : max_out;
            while (at > 0 && out[at - 1].count < k) at--;
            if (at >= max_out) continue;
            int64_t last = n - 1 < max_out ? n - 1 : max_out - 1;
            for (int64_t j = last; j > at; j--) out[j] = out[j - 1];
            out[at] = (cf_confused_pair){a, b, k};
        }
    return n;
}
