/* ClassificationInterpretation's figures: the confusion matrix and the top losses. */
#include "corefit/plot.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "figure.h"
#include "plot_internal.h"

/* ---- confusion matrix --------------------------------------------------------------------- */

typedef struct confusion_fig {
    int n;
    const int64_t *counts;
    double *v; /* displayed values */
    char *const *vocab;
    bool normalize;
    double vmin, vmax;
} confusion_fig;

/* matplotlib's "Blues" colour map at t in [0, 1]. */
static void blues(double t, PLINT rgb[3]) {
    static const int stops[9][3] = {{247, 251, 255}, {222, 235, 247}, {198, 219, 239},
                                    {158, 202, 225}, {107, 174, 214}, {66, 146, 198},
                                    {33, 113, 181},  {8, 81, 156},    {8, 48, 107}};
    if (!(t > 0)) t = 0;
    if (t > 1) t = 1;
    double s = t * 8;
    int i = (int)s;
    if (i >= 8) i = 7;
    double u = s - i;
    for (int c = 0; c < 3; c++)
        rgb[c] = (PLINT)lround(stops[i][c] + u * (stops[i + 1][c] - stops[i][c]));
}

static void draw_confusion(void *ctx) {
    confusion_fig *f = ctx;
    int n = f->n;
    pladv(0);
    /* margins from the longest class name, in page millimetres */
    PLFLT xmin_mm, xmax_mm, ymin_mm, ymax_mm, def, ht;
    plgspa(&xmin_mm, &xmax_mm, &ymin_mm, &ymax_mm);
    double pw = xmax_mm - xmin_mm, ph = ymax_mm - ymin_mm;
    double label_scale = n > 20 ? 0.7 : 1.0;
    plschr(0, label_scale);
    plgchr(&def, &ht);
    size_t maxlen = 1;
    char name[128];
    for (int i = 0; i < n; i++) {
        cf_plot__class_name(f->vocab, i, name, sizeof name);
        size_t l = strlen(name);
        if (l > maxlen) maxlen = l;
    }
    double name_mm = 0.62 * ht * (double)maxlen; /* average glyph width ~0.6 of the height */
    double left = (name_mm + 4.0 * ht) / pw, top = 1.0 - 3.0 * ht / ph, right = 0.97;
    if (left > 0.45) left = 0.45;
    /* x labels: horizontal when they fit in a cell, vertical otherwise */
    double cell_mm_guess = (right - left) * pw / n;
    bool vertical = name_mm > 0.9 * cell_mm_guess;
    double bottom = ((vertical ? name_mm : ht) + 4.0 * ht) / ph;
    if (bottom > 0.45) bottom = 0.45;
    plvpas(left, right, bottom, top, 1.0);
    plwind(0, n, 0, n);
    /* cells: row r (actual) from the top, column c (predicted) from the left */
    double span = f->vmax - f->vmin;
    double thresh = f->vmax / 2;
    double cell_scale = n <= 6 ? 1.2 : n <= 12 ? 0.9 : n <= 20 ? 0.6 : 0.0;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++) {
            double v = f->v[(int64_t)r * n + c];
            PLINT rgb[3];
            blues(span > 0 ? (v - f->vmin) / span : 0, rgb);
            plscol0(CF_COL_SCRATCH, rgb[0], rgb[1], rgb[2]);
            plcol0(CF_COL_SCRATCH);
            PLFLT x[4] = {c, c + 1, c + 1, c}, y[4] = {n - r - 1, n - r - 1, n - r, n - r};
            plfill(4, x, y);
        }
    if (cell_scale > 0) {
        plschr(0, cell_scale);
        char text[32];
        for (int r = 0; r < n; r++)
            for (int c = 0; c < n; c++) {
                double v = f->v[(int64_t)r * n + c];
                if (f->normalize)
                    snprintf(text, sizeof text, "%.2f", v);
                else
                    snprintf(text, sizeof text, "%lld", (long long)f->counts[(int64_t)r * n + c]);
                plcol0(v > thresh ? CF_COL_WHITE : CF_COL_FG);
                plptex(c + 0.5, n - r - 0.5, 1, 0, 0.5, text);
            }
    }
    plcol0(CF_COL_FG);
    plschr(0, 1.0);
    plbox("bc", 0, 0, "bc", 0, 0);
    plschr(0, label_scale);
    for (int i = 0; i < n; i++) {
        cf_plot__class_name(f->vocab, i, name, sizeof name);
        double pos = (i + 0.5) / n;
        if (vertical)
            plmtex("bv", 0.7, pos, 1.0, name);
        else
            plmtex("b", 1.4, pos, 0.5, name);
        plmtex("lv", 0.7, 1.0 - pos, 1.0, name);
    }
    plschr(0, 1.0);
    double name_chars = name_mm / ht;
    plmtex("b", (vertical ? name_chars * label_scale : 1.4) + 1.8, 0.5, 0.5, "Predicted");
    plmtex("l", name_chars * label_scale + 2.2, 0.5, 0.5, "Actual");
    plmtex("t", 1.2, 0.5, 0.5, "Confusion matrix");
}

cf_status cf_plot_confusion_matrix(const int64_t *counts, int n_classes, char *const *vocab,
                                   const char *png_path, bool normalize) {
    if (!counts) return cf_fail(CF_ERR_INVALID, "plot_confusion_matrix: NULL counts");
    if (n_classes < 1 || n_classes > 100)
        return cf_fail(CF_ERR_INVALID, "plot_confusion_matrix: n_classes %d must be in [1, 100]",
                       n_classes);
    int64_t nn = (int64_t)n_classes * n_classes;
    confusion_fig f = {.n = n_classes, .counts = counts, .vocab = vocab, .normalize = normalize};
    f.v = cf_plot__alloc_doubles(nn);
    if (!f.v) return cf_fail_context(CF_ERR_NOMEM, "plot_confusion_matrix");
    f.vmin = INFINITY;
    f.vmax = -INFINITY;
    for (int r = 0; r < n_classes; r++) {
        int64_t sum = 0;
        for (int c = 0; c < n_classes; c++) {
            int64_t k = counts[(int64_t)r * n_classes + c];
            if (k < 0) {
                cf_free(f.v);
                return cf_fail(CF_ERR_INVALID,
                               "plot_confusion_matrix: negative count %lld at (%d, %d)",
                               (long long)k, r, c);
            }
            sum += k;
        }
        for (int c = 0; c < n_classes; c++) {
            int64_t k = counts[(int64_t)r * n_classes + c];
            double v = normalize ? (sum > 0 ? (double)k / (double)sum : 0.0) : (double)k;
            f.v[(int64_t)r * n_classes + c] = v;
            if (v < f.vmin) f.vmin = v;
            if (v > f.vmax) f.vmax = v;
        }
    }
    cf_status st = cf_plot__run_figure("plot_confusion_matrix", png_path, 0, 0, draw_confusion, &f);
    cf_free(f.v);
    return st;
}

/* ---- top losses --------------------------------------------------------------------------- */

typedef struct top_losses_fig {
    int k, h, w; /* images are drawn at (h, w) after box downsampling */
    float *pix;  /* k images, (h, w, 3) in [0, 1] */
    char (*titles)[96];
} top_losses_fig;

static void draw_top_losses(void *ctx) {
    top_losses_fig *f = ctx;
    pladv(0);
    int ncols = (int)ceil(sqrt((double)f->k));
    int nrows = (f->k + ncols - 1) / ncols;
    double title_h = 0.07;
    plschr(0, 1.1);
    plvpor(0, 1, 0, 1);
    plwind(0, 1, 0, 1);
    plcol0(CF_COL_FG);
    plptex(0.5, 1.0 - title_h / 2, 1, 0, 0.5, "Prediction/Actual/Loss/Probability");
    double tscale = ncols <= 3 ? 0.9 : ncols <= 5 ? 0.7 : 0.55;
    for (int i = 0; i < f->k; i++) {
        int r = i / ncols, c = i % ncols;
        double cw = 1.0 / ncols, chh = (1.0 - title_h) / nrows;
        double x0 = c * cw, y1 = 1.0 - title_h - r * chh;
        /* leave room for the item's title above the image */
        plvpas(x0 + 0.02 * cw, x0 + 0.98 * cw, y1 - chh + 0.03 * chh, y1 - 0.16 * chh,
               (double)f->h / f->w);
        cf_plot__rgb_image(f->pix + (int64_t)i * f->h * f->w * 3, f->h, f->w);
        plcol0(CF_COL_FG);
        plschr(0, tscale);
        plmtex("t", 0.9, 0.5, 0.5, f->titles[i]);
    }
    plschr(0, 1.0);
}

cf_status cf_plot_top_losses(const cf_preds *p, int k, char *const *vocab, const char *png_path) {
    if (!p) return cf_fail(CF_ERR_INVALID, "plot_top_losses: NULL preds");
    const cf_tensor *in = &p->inputs;
    if (!in->data || in->shape.ndim != 4 || in->shape.dim[0] != p->n ||
        (in->shape.dim[1] != 1 && in->shape.dim[1] != 3)) {
        char buf[64];
        return cf_fail(CF_ERR_INVALID,
                       "plot_top_losses: inputs %s must be images (n = %lld, 1 or 3 channels, "
                       "H, W); get_preds with_input",
                       in->data ? cf_shape_str(&in->shape, buf, sizeof buf) : "(none)",
                       (long long)p->n);
    }
    if (!p->preds.data || p->preds.shape.ndim != 2 || p->preds.shape.dim[0] != p->n)
        return cf_fail(CF_ERR_INVALID, "plot_top_losses: predictions must be (n, n_classes)");
    if (k > 64) return cf_fail(CF_ERR_INVALID, "plot_top_losses: k = %d is more than 64 images", k);
    int64_t *idx = cf_malloc(sizeof(int64_t) * (size_t)(k > 0 ? k : 1));
    if (!idx) return cf_fail_context(CF_ERR_NOMEM, "plot_top_losses");
    cf_status st = cf_top_losses(p, k, idx);
    if (st != CF_OK) {
        cf_free(idx);
        return cf_fail_context(st, "plot_top_losses");
    }
    top_losses_fig f = {.k = k};
    cf_plot__tile_size(in->shape.dim[2], in->shape.dim[3], &f.h, &f.w);
    f.pix = cf_malloc(sizeof(float) * (size_t)k * f.h * f.w * 3);
    f.titles = cf_malloc(sizeof(*f.titles) * (size_t)k);
    if (!f.pix || !f.titles) {
        st = cf_fail_context(CF_ERR_NOMEM, "plot_top_losses");
        goto done;
    }
    int nc = p->preds.shape.dim[1];
    for (int i = 0; i < k; i++) {
        int64_t item = idx[i];
        cf_plot__image_tile(f.pix + (int64_t)i * f.h * f.w * 3, f.h, f.w, in, item);
        const float *row = p->preds.data + item * nc;
        int64_t pred = p->decoded ? p->decoded[item] : cf_plot__row_argmax(row, nc);
        double prob = row[cf_plot__row_argmax(row, nc)];
        char pn[40], an[40];
        if (pred >= 0 && pred < nc)
            cf_plot__class_name(vocab, (int)pred, pn, sizeof pn);
        else
            snprintf(pn, sizeof pn, "%lld", (long long)pred);
        double t = p->targs.data && (int64_t)cf_tensor_numel(&p->targs) == p->n
                       ? p->targs.data[item]
                       : NAN;
        if (t >= 0 && t < nc && t == floor(t))
            cf_plot__class_name(vocab, (int)t, an, sizeof an);
        else
            snprintf(an, sizeof an, "%g", t);
        snprintf(f.titles[i], sizeof f.titles[0], "%s/%s / %.2f / %.2f", pn, an,
                 (double)p->losses[item], prob);
    }
    st = cf_plot__run_figure("plot_top_losses", png_path, 0, 0, draw_top_losses, &f);
done:
    cf_free(idx);
    cf_free(f.pix);
    cf_free(f.titles);
    return st;
}
