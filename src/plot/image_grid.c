/* show_batch and show_results: a grid of images with coloured titles. */
#include "corefit/plot.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "figure.h"
#include "plot_internal.h"

/* ---- show_batch and show_results: a grid of images with coloured titles --------------------- */

typedef struct image_grid_fig {
    int k, h, w;
    float *pix; /* k images, (h, w, 3) in [0, 1] */
    char (*titles)[96];
    int *colour; /* per image: 0 the foreground, 1 green, 2 red */
    /* per image: a target and a predicted point in PointScaler's -1..1 (NAN: none), drawn as a
     * green '+' and a red 'x' */
    float (*points)[4];
} image_grid_fig;

/* A cross centred on the point (-1..1 across the tile); diagonal: an 'x', else a '+'. */
static void draw_cross(float px, float py, int h, int w, bool diagonal) {
    if (!(px == px) || !(py == py)) return; /* NAN: no point */
    const double x = (px + 1.0) / 2.0 * w, y = h - (py + 1.0) / 2.0 * h, r = 0.08 * (w > h ? w : h);
    plwidth(2);
    if (diagonal) {
        pljoin(x - r, y - r, x + r, y + r);
        pljoin(x - r, y + r, x + r, y - r);
    } else {
        pljoin(x - r, y, x + r, y);
        pljoin(x, y - r, x, y + r);
    }
    plwidth(1);
}

static void draw_image_grid(void *ctx) {
    image_grid_fig *f = ctx;
    pladv(0);
    int ncols = (int)ceil(sqrt((double)f->k));
    int nrows = (f->k + ncols - 1) / ncols;
    double tscale = ncols <= 3 ? 0.9 : ncols <= 5 ? 0.7 : 0.55;
    static const PLINT rgb[3][3] = {{0, 0, 0}, {0, 128, 0}, {200, 0, 0}};
    for (int i = 0; i < f->k; i++) {
        int r = i / ncols, c = i % ncols;
        double cw = 1.0 / ncols, chh = 1.0 / nrows;
        double x0 = c * cw, y1 = 1.0 - r * chh;
        plvpas(x0 + 0.02 * cw, x0 + 0.98 * cw, y1 - chh + 0.03 * chh, y1 - 0.16 * chh,
               (double)f->h / f->w);
        cf_plot__rgb_image(f->pix + (int64_t)i * f->h * f->w * 3, f->h, f->w);
        if (f->points) {
            plscol0(CF_COL_SCRATCH, 0, 200, 0);
            plcol0(CF_COL_SCRATCH);
            draw_cross(f->points[i][0], f->points[i][1], f->h, f->w, false);
            plscol0(CF_COL_SCRATCH, 230, 0, 0);
            plcol0(CF_COL_SCRATCH);
            draw_cross(f->points[i][2], f->points[i][3], f->h, f->w, true);
        }
        const PLINT *col = rgb[f->colour ? f->colour[i] : 0];
        plscol0(CF_COL_SCRATCH, col[0], col[1], col[2]);
        plcol0(CF_COL_SCRATCH);
        plschr(0, tscale);
        plmtex("t", 0.9, 0.5, 0.5, f->titles[i]);
        plcol0(CF_COL_FG);
    }
    plschr(0, 1.0);
}

static cf_status grid_alloc(image_grid_fig *f, const cf_tensor *x, int k, const char *what) {
    f->k = k;
    cf_plot__tile_size(x->shape.dim[2], x->shape.dim[3], &f->h, &f->w);
    f->pix = cf_malloc(sizeof(float) * (size_t)k * f->h * f->w * 3);
    f->titles = cf_calloc((size_t)k, sizeof(*f->titles));
    f->colour = cf_calloc((size_t)k, sizeof(int));
    if (!f->pix || !f->titles || !f->colour) return cf_fail_context(CF_ERR_NOMEM, "%s", what);
    return CF_OK;
}

static void grid_free(image_grid_fig *f) {
    cf_free(f->pix);
    cf_free(f->titles);
    cf_free(f->colour);
    cf_free(f->points);
}

/* Whether a batch's (B, td) targets are multi-hot rows (every value 0 or 1) of a vocabulary. */
static bool multi_hot_rows(const float *y, int64_t n, int td, char *const *vocab) {
    if (!vocab || td < 2) return false;
    for (int64_t i = 0; i < n * td; i++)
        if (y[i] != 0.0f && y[i] != 1.0f) return false;
    return true;
}

/* Room for the marks of k images, all NAN. */
static cf_status points_alloc(image_grid_fig *f, int k) {
    f->points = cf_malloc((size_t)k * sizeof *f->points);
    if (!f->points) return CF_ERR_NOMEM;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < 4; j++) f->points[i][j] = NAN;
    return CF_OK;
}

static bool is_image_batch(const cf_tensor *x) {
    return x->data && x->shape.ndim == 4 && (x->shape.dim[1] == 1 || x->shape.dim[1] == 3);
}

/* The class name of a target value, or the value itself when it is not a class id. */
static void target_name(char *const *vocab, int n_classes, double t, char *buf, size_t size) {
    if (t >= 0 && t == floor(t) && (n_classes <= 0 || t < n_classes))
        cf_plot__class_name(vocab, (int)t, buf, size);
    else
        snprintf(buf, size, "%g", t);
}

cf_status cf_show_batch(const cf_batch *batch, int n, char *const *vocab, const char *png_path) {
    if (!batch || !is_image_batch(&batch->x)) {
        char buf[64];
        return cf_fail(
            CF_ERR_INVALID, "show_batch: the batch %s must hold images (B, 1 or 3, H, W)",
            batch && batch->x.data ? cf_shape_str(&batch->x.shape, buf, sizeof buf) : "(none)");
    }
    int b = batch->x.shape.dim[0];
    if (n < 1 || n > b || n > 64)
        return cf_fail(CF_ERR_INVALID, "show_batch: n = %d must be in [1, %d]", n, b < 64 ? b : 64);
    image_grid_fig f = {0};
    cf_status st = grid_alloc(&f, &batch->x, n, "show_batch");
    for (int i = 0; i < n && st == CF_OK; i++) {
        cf_plot__image_tile(f.pix + (int64_t)i * f.h * f.w * 3, f.h, f.w, &batch->x, i);
        int td = batch->y.shape.ndim == 2 ? batch->y.shape.dim[1] : 1;
        const float *yi = batch->y.data ? batch->y.data + (size_t)i * td : NULL;
        if (yi && td == 1)
            target_name(vocab, 0, yi[0], f.titles[i], sizeof f.titles[0]);
        else if (yi && multi_hot_rows(batch->y.data, n, td, vocab)) /* fastai: joined by ';' */
            cf_label_set_str(yi, td, vocab, ";", f.titles[i], sizeof f.titles[0]);
        else if (yi && td == 2 && !vocab) { /* a point: fastai's red mark */
            if (!f.points && (st = points_alloc(&f, n))) break;
            f.points[i][0] = yi[0];
            f.points[i][1] = yi[1];
        }
    }
    if (st == CF_OK) st = cf_plot__run_figure("show_batch", png_path, 0, 0, draw_image_grid, &f);
    grid_free(&f);
    return st;
}

cf_status cf_show_results(const cf_preds *p, int n, char *const *vocab, const char *png_path) {
    if (!p || !is_image_batch(&p->inputs) || p->inputs.shape.dim[0] != p->n)
        return cf_fail(CF_ERR_INVALID, "show_results: the predictions carry no input images "
                                       "(get_preds with_input)");
    if (!p->preds.data || p->preds.shape.ndim != 2 || p->preds.shape.dim[0] != p->n)
        return cf_fail(CF_ERR_INVALID, "show_results: predictions must be (n, n_classes)");
    if (n < 1 || n > p->n || n > 64)
        return cf_fail(CF_ERR_INVALID, "show_results: n = %d must be in [1, %lld]", n,
                       (long long)(p->n < 64 ? p->n : 64));
    image_grid_fig f = {0};
    cf_status st = grid_alloc(&f, &p->inputs, n, "show_results");
    int nc = p->preds.shape.dim[1];
    bool have_targs = p->targs.data && (int64_t)cf_tensor_numel(&p->targs) == p->n;
    const bool row_targs = p->targs.data && (int64_t)cf_tensor_numel(&p->targs) == p->n * nc;
    if (row_targs && nc == 2 && !vocab) { /* points: target '+' and prediction 'x' */
        st = st ? st : points_alloc(&f, n);
        for (int i = 0; i < n && st == CF_OK; i++) {
            cf_plot__image_tile(f.pix + (int64_t)i * f.h * f.w * 3, f.h, f.w, &p->inputs, i);
            memcpy(f.points[i], p->targs.data + (size_t)i * 2, 2 * sizeof(float));
            memcpy(f.points[i] + 2, p->preds.data + (size_t)i * 2, 2 * sizeof(float));
            snprintf(f.titles[i], sizeof f.titles[0], "target +, predicted x");
        }
        if (st == CF_OK)
            st = cf_plot__run_figure("show_results", png_path, 0, 0, draw_image_grid, &f);
        grid_free(&f);
        return st;
    }
    if (row_targs && vocab && nc > 1) { /* label sets: "targets/predicted", green when equal */
        for (int i = 0; i < n && st == CF_OK; i++) {
            cf_plot__image_tile(f.pix + (int64_t)i * f.h * f.w * 3, f.h, f.w, &p->inputs, i);
            float pred[256];
            const int c = nc < 256 ? nc : 256;
            bool same = true;
            for (int k = 0; k < c; k++) {
                pred[k] = p->preds.data[(size_t)i * nc + k] > 0.5f; /* sigmoid probabilities */
                same &= pred[k] == (p->targs.data[(size_t)i * nc + k] > 0.5f);
            }
            char a[48], b[48];
            cf_label_set_str(p->targs.data + (size_t)i * nc, c, vocab, ";", a, sizeof a);
            cf_label_set_str(pred, c, vocab, ";", b, sizeof b);
            snprintf(f.titles[i], sizeof f.titles[0], "%s/%s", a, b);
            f.colour[i] = same ? 1 : 2;
        }
        if (st == CF_OK)
            st = cf_plot__run_figure("show_results", png_path, 0, 0, draw_image_grid, &f);
        grid_free(&f);
        return st;
    }
    for (int i = 0; i < n && st == CF_OK; i++) {
        cf_plot__image_tile(f.pix + (int64_t)i * f.h * f.w * 3, f.h, f.w, &p->inputs, i);
        int64_t pred =
            p->decoded ? p->decoded[i] : cf_plot__row_argmax(p->preds.data + (int64_t)i * nc, nc);
        char pn[40], an[40] = "?";
        target_name(vocab, nc, (double)pred, pn, sizeof pn);
        if (have_targs) target_name(vocab, nc, p->targs.data[i], an, sizeof an);
        snprintf(f.titles[i], sizeof f.titles[0], "%s/%s", an, pn);
        f.colour[i] = have_targs ? ((double)pred == p->targs.data[i] ? 1 : 2) : 0;
    }
    if (st == CF_OK) st = cf_plot__run_figure("show_results", png_path, 0, 0, draw_image_grid, &f);
    grid_free(&f);
    return st;
}
