/* Plot layer internals shared with the tests. */
#ifndef COREFIT_PLOT_INTERNAL_H
#define COREFIT_PLOT_INTERNAL_H

#include "corefit/core.h"

/* Draws a trivial figure straight to path through PLplot, without the temporary file and its
 * checks, so that a test can drive PLplot into its fatal-error path (an unwritable path makes
 * PLplot give up with "Too many tries") and see the error reported instead of an exit. */
cf_status cf_plot__raw_figure(const char *path);

/* The label of a tick at value on a linear axis with ticks every step (matplotlib's style). */
void cf_plot__tick_label(double value, double step, char *buf, size_t n);

/* The index of the largest of row[0..n) (the first of equal ones). */
int64_t cf_plot__row_argmax(const float *row, int n);

/* The colour (rgb in [0, 1]) fastai's TensorMask.show gives class id of n_codes: matplotlib's
 * tab20 after Normalize(vmin 0, vmax n_codes), so index floor(id / n_codes * 20), clipped. */
void cf_plot__mask_colour(int id, int n_codes, float rgb[3]);
/* Blends an (mh, mw) mask of class ids over an (h, w, 3) tile at alpha 0.5, the mask sampled at
 * each tile pixel's centre (nearest). */
void cf_plot__mask_overlay(float *rgb, int h, int w, const float *mask, int mh, int mw,
                           int n_codes);

#endif
