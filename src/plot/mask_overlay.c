/* show_batch and show_results for segmentation: each image with its mask drawn over it as fastai
 * shows a TensorMask (matplotlib's imshow with cmap tab20, alpha 0.5, vmin 0, vmax len(codes)). */
#include "corefit/plot.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "figure.h"
#include "plot_internal.h"

typedef struct mask_grid_fig {
    int k, rows, cols, h, w;
    float *pix; /* k tiles (h, w, 3) in [0, 1], row-major over the grid */
    char (*titles)[48];
} mask_grid_fig;

static void draw_mask_grid(void *ctx) {
    mask_grid_fig *f = ctx;
    pladv(0);
    const double tscale = f->cols <= 3 ? 0.9 : 0.7;
    for (int i = 0; i < f->k; i++) {
        const int r = i / f->cols, c = i % f->cols;
        const double cw = 1.0 / f->cols, chh = 1.0 / f->rows, x0 = c * cw, y1 = 1.0 - r * chh;
        plvpas(x0 + 0.02 * cw, x0 + 0.98 * cw, y1 - chh + 0.03 * chh, y1 - 0.16 * chh,
               (double)f->h / f->w);
        cf_plot__rgb_image(f->pix + (int64_t)i * f->h * f->w * 3, f->h, f->w);
        if (f->titles[i][0]) {
            plcol0(CF_COL_FG);
            plschr(0, tscale);
            plmtex("t", 0.9, 0.5, 0.5, f->titles[i]);
        }
    }
    plschr(0, 1.0);
}

static cf_status grid_alloc(mask_grid_fig *f, const cf_tensor *x, int k, const char *what) {
    f->k = k;
    cf_plot__tile_size(x->shape.dim[2], x->shape.dim[3], &f->h, &f->w);
    f->pix = cf_malloc(sizeof(float) * (size_t)k * f->h * f->w * 3);
    f->titles = cf_calloc((size_t)k, sizeof *f->titles);
    if (!f->pix || !f->titles) return cf_fail_context(CF_ERR_NOMEM, "%s", what);
    return CF_OK;
}

static void grid_free(mask_grid_fig *f) {
    cf_free(f->pix);
    cf_free(f->titles);
}

static bool is_image_tensor(const cf_tensor *x) {
    return x->data && x->shape.ndim == 4 && (x->shape.dim[1] == 1 || x->shape.dim[1] == 3);
}

cf_status cf_show_batch_masks(const cf_batch *batch, int n, int n_codes, const char *png_path) {
    if (!batch || !is_image_tensor(&batch->x))
        return cf_fail(CF_ERR_INVALID, "show_batch (masks): the batch must hold images (B, 1 or "
                                       "3, H, W)");
    const int b = batch->x.shape.dim[0], H = batch->x.shape.dim[2], W = batch->x.shape.dim[3];
    if (!batch->y.data || (int64_t)cf_tensor_numel(&batch->y) != (int64_t)b * H * W)
        return cf_fail(CF_ERR_INVALID,
                       "show_batch (masks): the targets must be one %d x %d mask an image", H, W);
    if (n < 1 || n > b || n > 64)
        return cf_fail(CF_ERR_INVALID, "show_batch (masks): n = %d must be in [1, %d]", n,
                       b < 64 ? b : 64);
    if (n_codes < 1) return cf_fail(CF_ERR_INVALID, "show_batch (masks): %d codes", n_codes);
    mask_grid_fig f = {0};
    cf_status st = grid_alloc(&f, &batch->x, n, "show_batch");
    f.rows = (int)sqrt((double)n); /* fastai's get_grid: int(sqrt(n)) rows */
    f.cols = (n + f.rows - 1) / f.rows;
    for (int i = 0; i < n && st == CF_OK; i++) {
        float *tile = f.pix + (int64_t)i * f.h * f.w * 3;
        cf_plot__image_tile(tile, f.h, f.w, &batch->x, i);
        cf_plot__mask_overlay(tile, f.h, f.w, batch->y.data + (size_t)i * H * W, H, W, n_codes);
    }
    if (st == CF_OK) st = cf_plot__run_figure("show_batch", png_path, 0, 0, draw_mask_grid, &f);
    grid_free(&f);
    return st;
}

cf_status cf_show_results_masks(const cf_preds *p, int n, int n_codes, const char *png_path) {
    if (!p || !is_image_tensor(&p->inputs) || p->inputs.shape.dim[0] != p->n)
        return cf_fail(CF_ERR_INVALID, "show_results (masks): the predictions carry no input "
                                       "images (get_preds with_input)");
    const int H = p->inputs.shape.dim[2], W = p->inputs.shape.dim[3];
    const int64_t hw = (int64_t)H * W;
    if (n_codes < 1 || !p->preds.data || (int64_t)cf_tensor_numel(&p->preds) != p->n * n_codes * hw)
        return cf_fail(CF_ERR_INVALID,
                       "show_results (masks): predictions must be (n, %d, %d, %d) probabilities",
                       n_codes, H, W);
    if (!p->targs.data || (int64_t)cf_tensor_numel(&p->targs) != p->n * hw)
        return cf_fail(CF_ERR_INVALID, "show_results (masks): targets must be (n, %d, %d) masks", H,
                       W);
    if (n < 1 || n > p->n || n > 32)
        return cf_fail(CF_ERR_INVALID, "show_results (masks): n = %d must be in [1, %lld]", n,
                       (long long)(p->n < 32 ? p->n : 32));
    mask_grid_fig f = {0};
    cf_status st = grid_alloc(&f, &p->inputs, 2 * n, "show_results");
    float *pred = cf_malloc((size_t)hw * sizeof(float));
    if (st == CF_OK && !pred) st = cf_fail_context(CF_ERR_NOMEM, "show_results");
    f.rows = n; /* fastai: n rows, Target | Prediction */
    f.cols = 2;
    for (int i = 0; i < n && st == CF_OK; i++) {
        const float *probs = p->preds.data + (size_t)i * n_codes * hw;
        for (int64_t q = 0; q < hw; q++) { /* decodes: argmax over the classes */
            int best = 0;
            for (int c = 1; c < n_codes; c++)
                if (probs[c * hw + q] > probs[best * hw + q]) best = c;
            pred[q] = (float)best;
        }
        float *t = f.pix + (int64_t)(2 * i) * f.h * f.w * 3, *u = t + (int64_t)f.h * f.w * 3;
        cf_plot__image_tile(t, f.h, f.w, &p->inputs, i);
        memcpy(u, t, sizeof(float) * (size_t)f.h * f.w * 3);
        cf_plot__mask_overlay(t, f.h, f.w, p->targs.data + (size_t)i * hw, H, W, n_codes);
        cf_plot__mask_overlay(u, f.h, f.w, pred, H, W, n_codes);
    }
    if (st == CF_OK) {
        snprintf(f.titles[0], sizeof f.titles[0], "Target");
        snprintf(f.titles[1], sizeof f.titles[1], "Prediction");
        int fw, fh;
        cf_plot__figure_size(&fw, &fh);
        /* two columns of square tiles: as tall as the rows need, within PLplot's limits */
        const int width = fw < 400 ? fw : 400;
        int height = (int)(width / 2.0 * n * (double)f.h / f.w * 1.1);
        if (height < 200) height = 200;
        if (height > 8192) height = 8192;
        st = cf_plot__run_figure("show_results", png_path, width, height, draw_mask_grid, &f);
    }
    cf_free(pred);
    grid_free(&f);
    return st;
}
