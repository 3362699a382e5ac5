/* The Recorder's figures: the learning curve (plot_loss), the schedules (plot_sched), the
 * learning-rate finder (plot_lr_find) and the metrics by epoch (plot_metrics). */
#include "corefit/plot.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "figure.h"

/* ---- plot_loss ---------------------------------------------------------------------------- */

typedef struct loss_fig {
    double *tx, *ty;
    int64_t nt;
    double *vx, *vy;
    int64_t nv;
    double *ex; /* epoch ends (show_epochs) */
    int64_t ne;
    bool log;
} loss_fig;

static void draw_loss(void *ctx) {
    loss_fig *f = ctx;
    pladv(0);
    cf_plot__std_viewport();
    cf_plot_range x = cf_plot__range_empty(), y = cf_plot__range_empty();
    cf_plot__range_add(&x, f->tx, f->nt);
    cf_plot__range_add(&x, f->vx, f->nv);
    cf_plot__range_add(&y, f->ty, f->nt);
    cf_plot__range_add(&y, f->vy, f->nv);
    x = cf_plot__range_pad(x);
    y = cf_plot__range_pad(y);
    cf_plot__axes_ex(x, y, f->log, f->log, !f->log);
    if (f->ne > 0) {
        plcol0(CF_COL_EPOCH);
        pllsty(3);
        for (int64_t i = 0; i < f->ne; i++) {
            if (!isfinite(f->ex[i])) continue;
            pljoin(f->ex[i], y.lo, f->ex[i], y.hi);
        }
        pllsty(1);
    }
    cf_plot__series(f->tx, f->ty, f->nt, CF_COL_C0, 2.0);
    cf_plot_legend_entry e[2];
    int n = 0;
    e[n++] = (cf_plot_legend_entry){"train", CF_COL_C0, false};
    if (f->nv > 0) {
        cf_plot__series(f->vx, f->vy, f->nv, CF_COL_C1, 2.0);
        if (f->nv <= 50) cf_plot__markers(f->vx, f->vy, f->nv, CF_COL_C1, 0.7);
        e[n++] = (cf_plot_legend_entry){"valid", CF_COL_C1, false};
    }
    cf_plot__labels("steps", "loss", "learning curve");
    cf_plot_curve c[2] = {{f->tx, f->ty, f->nt}, {f->vx, f->vy, f->nv}};
    cf_plot__legend(e, n, cf_plot__best_corner(c, 2, x, y, e, n, 1.0), 1.0);
}

static int find_name(const cf_recorder *rec, const char *name) {
    if (!rec->metric_names) return -1;
    for (int i = 0; i < rec->n_names; i++)
        if (rec->metric_names[i] && strcmp(rec->metric_names[i], name) == 0) return i;
    return -1;
}

static double log10_or_nan(double v) {
    return v > 0 ? log10(v) : NAN;
}

cf_status cf_plot_loss(const cf_recorder *rec, const char *png_path,
                       const cf_plot_loss_opts *opts) {
    static const cf_plot_loss_opts none = {0};
    if (!opts) opts = &none;
    if (!rec) return cf_fail(CF_ERR_INVALID, "plot_loss: NULL recorder");
    int64_t skip = opts->skip_start == 0 ? 5 : opts->skip_start < 0 ? 0 : opts->skip_start;
    if (rec->n_batches <= skip || !rec->losses)
        return cf_fail(CF_ERR_STATE,
                       "plot_loss: the recorder holds %lld training batch(es), nothing to plot "
                       "after skip_start = %lld",
                       (long long)rec->n_batches, (long long)skip);
    loss_fig f = {.log = opts->log};
    f.nt = rec->n_batches - skip;
    int valid_col = find_name(rec, "valid_loss") - 1;
    bool with_valid = !opts->no_valid && valid_col >= 0 && valid_col < rec->n_values &&
                      rec->values && rec->iters && rec->n_epochs > 0;
    f.tx = cf_plot__alloc_doubles(f.nt);
    f.ty = cf_plot__alloc_doubles(f.nt);
    f.vx = cf_plot__alloc_doubles(rec->n_epochs);
    f.vy = cf_plot__alloc_doubles(rec->n_epochs);
    f.ex = cf_plot__alloc_doubles(rec->n_epochs);
    cf_status st = CF_OK;
    if (!f.tx || !f.ty || !f.vx || !f.vy || !f.ex) {
        st = cf_fail_context(CF_ERR_NOMEM, "plot_loss");
        goto done;
    }
    for (int64_t i = 0; i < f.nt; i++) {
        double x = (double)(skip + i), y = rec->losses[skip + i];
        f.tx[i] = f.log ? log10_or_nan(x) : x;
        f.ty[i] = f.log ? log10_or_nan(y) : y;
    }
    if (with_valid) {
        for (int e = 0; e < rec->n_epochs; e++) {
            if (rec->iters[e] < skip) continue;
            double x = (double)rec->iters[e],
                   y = rec->values[(int64_t)e * rec->n_values + valid_col];
            f.vx[f.nv] = f.log ? log10_or_nan(x) : x;
            f.vy[f.nv] = f.log ? log10_or_nan(y) : y;
            f.nv++;
        }
    }
    if (opts->show_epochs && rec->iters)
        for (int e = 0; e < rec->n_epochs; e++) {
            double x = (double)rec->iters[e];
            f.ex[f.ne++] = f.log ? log10_or_nan(x) : x;
        }
    st = cf_plot__run_figure("plot_loss", png_path, opts->width, opts->height, draw_loss, &f);
done:
    cf_free(f.tx);
    cf_free(f.ty);
    cf_free(f.vx);
    cf_free(f.vy);
    cf_free(f.ex);
    return st;
}

/* ---- plot_sched --------------------------------------------------------------------------- */

typedef struct sched_fig {
    const double *lr, *mom;
    double *x;
    int64_t n;
} sched_fig;

static void draw_sched_panel(const double *x, const double *y, int64_t n, const char *name) {
    pladv(0);
    cf_plot__std_viewport();
    cf_plot_range rx = cf_plot__range_empty(), ry = cf_plot__range_empty();
    cf_plot__range_add(&rx, x, n);
    cf_plot__range_add(&ry, y, n);
    cf_plot__axes_ex(cf_plot__range_pad(rx), cf_plot__range_pad(ry), false, false, true);
    cf_plot__series(x, y, n, CF_COL_C0, 2.0);
    if (n == 1) cf_plot__markers(x, y, n, CF_COL_C0, 0.7);
    cf_plot__labels("iterations", name, "");
}

static void draw_sched(void *ctx) {
    sched_fig *f = ctx;
    plssub(2, 1);
    draw_sched_panel(f->x, f->lr, f->n, "lr");
    draw_sched_panel(f->x, f->mom, f->n, "mom");
}

cf_status cf_plot_sched(const cf_recorder *rec, const char *png_path) {
    if (!rec) return cf_fail(CF_ERR_INVALID, "plot_sched: NULL recorder");
    sched_fig f = {0};
    if (rec->n_hps > 0 && rec->hp_lr && rec->hp_mom) {
        f.lr = rec->hp_lr;
        f.mom = rec->hp_mom;
        f.n = rec->n_hps;
    } else if (rec->n_batches > 0 && rec->lrs && rec->moms) {
        f.lr = rec->lrs;
        f.mom = rec->moms;
        f.n = rec->n_batches;
    } else
        return cf_fail(CF_ERR_STATE,
                       "plot_sched: the recorder holds no schedule (no training batch was "
                       "recorded)");
    f.x = cf_plot__alloc_doubles(f.n);
    if (!f.x) return cf_fail_context(CF_ERR_NOMEM, "plot_sched");
    for (int64_t i = 0; i < f.n; i++) f.x[i] = (double)i;
    cf_status st = cf_plot__run_figure("plot_sched", png_path, 0, 0, draw_sched, &f);
    cf_free(f.x);
    return st;
}

/* ---- plot_lr_find ------------------------------------------------------------------------- */

typedef struct lr_find_fig {
    double *x, *y;
    int64_t n;
    double px[4], py[4];
    int pcol[4];
    char ptext[4][64];
    int np;
} lr_find_fig;

static void draw_lr_find(void *ctx) {
    lr_find_fig *f = ctx;
    pladv(0);
    cf_plot__std_viewport();
    cf_plot_range x = cf_plot__range_empty(), y = cf_plot__range_empty();
    cf_plot__range_add(&x, f->x, f->n);
    cf_plot__range_add(&y, f->y, f->n);
    cf_plot__range_add(&x, f->px, f->np);
    cf_plot__range_add(&y, f->py, f->np);
    x = cf_plot__range_pad(x);
    y = cf_plot__range_pad(y);
    cf_plot__axes(x, y, true, false);
    cf_plot__series(f->x, f->y, f->n, CF_COL_C0, 2.0);
    cf_plot_legend_entry e[4];
    for (int i = 0; i < f->np; i++) {
        cf_plot__markers(&f->px[i], &f->py[i], 1, f->pcol[i], 1.3);
        e[i] = (cf_plot_legend_entry){f->ptext[i], f->pcol[i], true};
    }
    cf_plot__labels("Learning Rate", "Loss", "");
    cf_plot_curve c[2] = {{f->x, f->y, f->n}, {f->px, f->py, f->np}};
    cf_plot__legend(e, f->np, cf_plot__best_corner(c, 2, x, y, e, f->np, 1.0), 1.0);
}

cf_status cf_plot_lr_find(const cf_lr_find_result *r, const char *png_path) {
    if (!r) return cf_fail(CF_ERR_INVALID, "plot_lr_find: NULL result");
    int64_t n = (int64_t)r->n - 5;
    if (n < 2 || !r->lrs || !r->losses)
        return cf_fail(CF_ERR_STATE,
                       "plot_lr_find: the result holds %d point(s); at least 7 are needed (the "
                       "last 5 are not plotted)",
                       r->n);
    lr_find_fig f = {.n = n};
    f.x = cf_plot__alloc_doubles(n);
    f.y = cf_plot__alloc_doubles(n);
    if (!f.x || !f.y) {
        cf_free(f.x);
        cf_free(f.y);
        return cf_fail_context(CF_ERR_NOMEM, "plot_lr_find");
    }
    for (int64_t i = 0; i < n; i++) {
        f.x[i] = log10_or_nan(r->lrs[i]);
        f.y[i] = r->losses[i];
    }
    struct {
        int bit;
        const char *name;
        double value, at, loss;
    } sug[4] = {
        {CF_SUGGEST_VALLEY, "valley", r->valley, r->valley, r->valley_loss},
        {CF_SUGGEST_SLIDE, "slide", r->slide, r->slide, r->slide_loss},
        {CF_SUGGEST_MINIMUM, "minimum", r->minimum, r->minimum_lr_at, r->minimum_loss},
        {CF_SUGGEST_STEEP, "steep", r->steep, r->steep, r->steep_loss},
    };
    /* colours from the cycle starting at index 1, in the order the suggestions are listed */
    for (int i = 0; i < 4; i++) {
        if (!(r->suggest & sug[i].bit)) continue;
        if (!isfinite(sug[i].value) || !(sug[i].at > 0) || !isfinite(sug[i].loss)) continue;
        f.px[f.np] = log10(sug[i].at);
        f.py[f.np] = sug[i].loss;
        f.pcol[f.np] = CF_COL_C1 + f.np;
        snprintf(f.ptext[f.np], sizeof f.ptext[0], "%s = %.2e", sug[i].name, sug[i].value);
        f.np++;
    }
    cf_status st = cf_plot__run_figure("plot_lr_find", png_path, 0, 0, draw_lr_find, &f);
    cf_free(f.x);
    cf_free(f.y);
    return st;
}

/* ---- plot_metrics ------------------------------------------------------------------------- */

typedef struct metrics_fig {
    const cf_recorder *rec;
    double *x;    /* epochs */
    double *cols; /* column j at cols + j * n_epochs */
    int n_panels, nrows, ncols;
} metrics_fig;

static void draw_metrics(void *ctx) {
    metrics_fig *f = ctx;
    const cf_recorder *rec = f->rec;
    int ne = rec->n_epochs;
    plssub(f->ncols, f->nrows);
    double text_scale = f->n_panels > 4 ? 0.8 : 1.0;
    plschr(0, text_scale);
    for (int p = 0; p < f->n_panels; p++) {
        /* panel 0: columns 0 (train) and 1 (valid); panel p > 0: column p + 1 */
        int c0 = p == 0 ? 0 : p + 1, c1 = p == 0 && rec->n_values > 1 ? 1 : c0;
        pladv(0);
        cf_plot__std_viewport();
        cf_plot_range x = cf_plot__range_empty(), y = cf_plot__range_empty();
        cf_plot__range_add(&x, f->x, ne);
        for (int c = c0; c <= c1; c++) cf_plot__range_add(&y, f->cols + (int64_t)c * ne, ne);
        x = cf_plot__range_pad(x);
        y = cf_plot__range_pad(y);
        cf_plot__axes_ex(x, y, false, false, true);
        cf_plot_legend_entry e[2];
        int n = 0;
        for (int c = c0; c <= c1; c++) {
            int col = c == 0 ? CF_COL_C0 : CF_COL_C1;
            cf_plot__series(f->x, f->cols + (int64_t)c * ne, ne, col, 2.0);
            if (ne <= 30) cf_plot__markers(f->x, f->cols + (int64_t)c * ne, ne, col, 0.6);
            e[n++] = (cf_plot_legend_entry){c == 0 ? "train" : "valid", col, false};
        }
        char title[96];
        cf_plot__text(title, sizeof title, p == 0 ? "losses" : rec->metric_names[c0 + 1]);
        cf_plot__labels("epoch", "", title);
        cf_plot_curve c[2] = {{f->x, f->cols + (int64_t)c0 * ne, ne},
                              {f->x, f->cols + (int64_t)c1 * ne, ne}};
        cf_plot__legend(e, n, cf_plot__best_corner(c, 2, x, y, e, n, 0.9), 0.9);
    }
}

cf_status cf_plot_metrics(const cf_recorder *rec, const char *png_path) {
    if (!rec) return cf_fail(CF_ERR_INVALID, "plot_metrics: NULL recorder");
    if (rec->n_epochs < 1 || !rec->values || rec->n_values < 1)
        return cf_fail(CF_ERR_STATE, "plot_metrics: the recorder holds no epoch to plot");
    if (!rec->metric_names || rec->n_names < rec->n_values + 1)
        return cf_fail(CF_ERR_INVALID,
                       "plot_metrics: the recorder has %d value column(s) but %d metric name(s)",
                       rec->n_values, rec->n_names);
    metrics_fig f = {.rec = rec};
    f.n_panels = rec->n_values > 1 ? rec->n_values - 1 : 1;
    /* fastai's grid is int(sqrt(n)) rows; on a fixed-size figure the grid whose panels come
     * closest to the figure's own shape (with few empty cells) reads better */
    int fw, fh;
    cf_plot__figure_size(&fw, &fh);
    double best = INFINITY;
    for (int rows = 1; rows <= f.n_panels; rows++) {
        int cols = (f.n_panels + rows - 1) / rows;
        if ((rows - 1) * cols >= f.n_panels) continue;
        double aspect = ((double)fw / cols) / ((double)fh / rows);
        double score = fabs(log(aspect / ((double)fw / fh))) + 0.3 * (rows * cols - f.n_panels);
        if (score < best - 1e-9) {
            best = score;
            f.nrows = rows;
            f.ncols = cols;
        }
    }
    f.x = cf_plot__alloc_doubles(rec->n_epochs);
    f.cols = cf_plot__alloc_doubles((int64_t)rec->n_epochs * rec->n_values);
    cf_status st;
    if (!f.x || !f.cols) {
        st = cf_fail_context(CF_ERR_NOMEM, "plot_metrics");
    } else {
        for (int e = 0; e < rec->n_epochs; e++) {
            f.x[e] = e;
            for (int j = 0; j < rec->n_values; j++)
                f.cols[(int64_t)j * rec->n_epochs + e] =
                    rec->values[(int64_t)e * rec->n_values + j];
        }
        st = cf_plot__run_figure("plot_metrics", png_path, 0, 0, draw_metrics, &f);
    }
    cf_free(f.x);
    cf_free(f.cols);
    return st;
}
