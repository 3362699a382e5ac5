/* The colours of segmentation masks as fastai draws them (matplotlib's tab20 over vmin 0, vmax
 * len(codes), alpha 0.5). No PLplot needed: the figures in mask_overlay.c and the tests use it. */
#include "plot_internal.h"

/* matplotlib's tab20 colours. */
static const unsigned char tab20[20][3] = {
    {31, 119, 180},  {174, 199, 232}, {255, 127, 14},  {255, 187, 120}, {44, 160, 44},
    {152, 223, 138}, {214, 39, 40},   {255, 152, 150}, {148, 103, 189}, {197, 176, 213},
    {140, 86, 75},   {196, 156, 148}, {227, 119, 194}, {247, 182, 210}, {127, 127, 127},
    {199, 199, 199}, {188, 189, 34},  {219, 219, 141}, {23, 190, 207},  {158, 218, 229}};

void cf_plot__mask_colour(int id, int n_codes, float rgb[3]) {
    /* Normalize(0, n_codes) then the 20-entry ListedColormap: index floor(x * 20), the top
     * value (x = 1) in the last entry, values outside clipped to the ends */
    double x = n_codes > 0 ? (double)id / n_codes : 0;
    int k = x <= 0 ? 0 : x >= 1 ? 19 : (int)(x * 20);
    if (k > 19) k = 19;
    for (int c = 0; c < 3; c++) rgb[c] = tab20[k][c] / 255.0f;
}

void cf_plot__mask_overlay(float *rgb, int h, int w, const float *mask, int mh, int mw,
                           int n_codes) {
    for (int y = 0; y < h; y++) {
        const int sy = (int)(((double)y + 0.5) * mh / h);
        for (int x = 0; x < w; x++) {
            const int sx = (int)(((double)x + 0.5) * mw / w);
            float col[3];
            cf_plot__mask_colour((int)mask[(size_t)sy * mw + sx], n_codes, col);
            float *px = rgb + ((size_t)y * w + x) * 3;
            for (int c = 0; c < 3; c++) px[c] = 0.5f * px[c] + 0.5f * col[c]; /* alpha 0.5 */
        }
    }
}
