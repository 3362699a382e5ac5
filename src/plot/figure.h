/* The figure engine shared by the figure files (curves.c, interpretation.c, image_grid.c), all
 * in figure.c: PLplot streams drawn into a file, the palette, axes, ranges, legends and the
 * pieces every figure of classes or images uses. Built only with PLplot; plot_internal.h (shared
 * with the tests and the PLplot-free analysis.c) does not include it. */
#ifndef COREFIT_PLOT_FIGURE_H
#define COREFIT_PLOT_FIGURE_H

#include <plplot.h>
#include <stdbool.h>
#include <stdint.h>

#include "corefit/core.h"
#include "corefit/tensor.h"

/* PLplot's colour map 0 as the figures use it. */
enum {
    CF_COL_BG = 0,
    CF_COL_FG = 1, /* text, axes, frame */
    CF_COL_C0 = 2, /* matplotlib's default cycle: C0 blue, C1 orange, C2 green, C3 red, ... */
    CF_COL_C1,
    CF_COL_C2,
    CF_COL_C3,
    CF_COL_C4,
    CF_COL_C5,
    CF_COL_C6,
    CF_COL_C7,
    CF_COL_C8,
    CF_COL_C9,
    CF_COL_GRID = 12,
    CF_COL_WHITE = 13,
    CF_COL_SCRATCH = 14, /* re-defined while drawing (heat map cells, image pixels) */
    CF_COL_EPOCH = 15,
    CF_N_COLS = 16
};

/* Draws a whole figure with PLplot calls only; ctx is the figure's prepared data. */
typedef void (*cf_plot_draw_fn)(void *ctx);

/* Draws one figure into path through the library's file writer (a temporary file beside path,
 * renamed over it once PLplot has written a PNG; a character device is written through).
 * `what` names the call in messages; width/height 0 take cf_plot_set_size's size. PLplot's
 * fatal errors come back as CF_ERR_IO instead of an exit. */
cf_status cf_plot__run_figure(const char *what, const char *path, int width, int height,
                              cf_plot_draw_fn draw, void *ctx);
/* The figure size cf_plot_set_size set. */
void cf_plot__figure_size(int *width, int *height);

/* ---- drawing helpers: PLplot calls, only inside a cf_plot_draw_fn ---- */

typedef struct cf_plot_range {
    double lo, hi;
} cf_plot_range;

cf_plot_range cf_plot__range_empty(void);
/* Widens r to the finite values of v[0..n). */
void cf_plot__range_add(cf_plot_range *r, const double *v, int64_t n);
/* matplotlib's 5% margins; a flat or empty range gets a unit span. */
cf_plot_range cf_plot__range_pad(cf_plot_range r);

/* The viewport of a plot in the current subpage, with room for the tick labels, axis labels
 * and title. */
void cf_plot__std_viewport(void);
/* Light grid, then the dark frame with ticks and numeric labels; x_integer: the x values are
 * counts (steps, epochs), so ticks fall on whole numbers. */
void cf_plot__axes_ex(cf_plot_range x, cf_plot_range y, bool logx, bool logy, bool x_integer);
void cf_plot__axes(cf_plot_range x, cf_plot_range y, bool logx, bool logy);
void cf_plot__labels(const char *xlabel, const char *ylabel, const char *title);
/* y against x as a line, broken at non-finite points. */
void cf_plot__series(const double *x, const double *y, int64_t n, int col, double width);
/* A filled circle at each finite point. */
void cf_plot__markers(const double *x, const double *y, int64_t n, int col, double scale);

typedef struct cf_plot_legend_entry {
    const char *text;
    int col;
    bool symbol; /* a marker instead of a line */
} cf_plot_legend_entry;

void cf_plot__legend(const cf_plot_legend_entry *e, int n, PLINT position, double text_scale);

typedef struct cf_plot_curve {
    const double *x, *y;
    int64_t n;
} cf_plot_curve;

/* matplotlib's loc="best" among the four inside corners. */
PLINT cf_plot__best_corner(const cf_plot_curve *c, int nc, cf_plot_range x, cf_plot_range y,
                           const cf_plot_legend_entry *e, int ne, double text_scale);

/* ---- prepared data and shared pieces ---- */

/* At least one double (cf_malloc: NULL with CF_ERR_NOMEM recorded). */
double *cf_plot__alloc_doubles(int64_t n);
/* Copies user text for PLplot, doubling '#' (PLplot's escape character). */
void cf_plot__text(char *dst, size_t size, const char *src);
/* Class i's name from vocab (escaped for PLplot), or its number without a vocabulary. */
void cf_plot__class_name(char *const *vocab, int i, char *buf, size_t size);
/* An (h, w, 3) image in [0, 1] drawn into the current viewport, one filled cell a pixel. */
void cf_plot__rgb_image(const float *img, int h, int w);
/* The size of a drawn image tile for an image of sh x sw pixels: box-downsampled by the
 * smallest whole factor that brings each side to at most 64 pixels (at least 1). */
void cf_plot__tile_size(int64_t sh, int64_t sw, int *h, int *w);
/* Image `item` of an (n, 1 or 3, H, W) tensor, box-downsampled to (h, w) (cf_plot__tile_size)
 * and rescaled to its own finite min..max, as (h, w, 3) floats in [0, 1] into dst. */
void cf_plot__image_tile(float *dst, int h, int w, const cf_tensor *x, int64_t item);

#endif
