/* The direct stem: a 3x3 stride-1 convolution with padding 1 on 1 to CF_STEM_MAX_CHANNELS input
 * channels (W1's gray stem), per image, from the image itself (tensor.h). The vector levels'
 * kernels are in the kernel table (simd_kernels.h); the portable loops below serve the others
 * (the generic level), without FMAs and with the weight gradient's sums in their own order. */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

bool cf_conv_stem_supported(const cf_conv_geom *g, int out_channels) {
    return g->c >= 1 && g->c <= CF_STEM_MAX_CHANNELS && g->kh == 3 && g->kw == 3 && g->sh == 1 &&
           g->sw == 1 && g->ph == 1 && g->pw == 1 && g->oh == g->h && g->ow == g->w &&
           (int64_t)g->h * g->w <= CF_STEM_MAX_PLANE && out_channels >= 1;
}

bool cf_conv_stem_wgrad_as_nt(const cf_conv_geom *g, int out_channels) {
    /* found by comparing every plane up to 64x64 with 1 to 16 outputs (OpenBLAS 0.3.21, SkylakeX):
     * below 32 positions, or with an output count off the multiples of 4, the small-matrix
     * kernel's edge sums its lanes otherwise */
    return cf_conv_stem_supported(g, out_channels) && g->c == 1 && out_channels <= 16 &&
           out_channels % 4 == 0 && g->h * g->w >= 32;
}

bool cf_conv_stem_pays(const cf_conv_geom *g, int out_channels) {
    /* the generic loops took 1.5 ms forward and 1.3 ms dW for W1's 64 images, the lowered
     * product 0.26 and 0.25 (its GEMM is OpenBLAS's at any level); the AVX2 kernels: isa_avx2.c */
    return cf_conv_stem_supported(g, out_channels) && cf_active_kernels->stem_forward &&
           cf_active_kernels->stem_wgrad && cf_active_kernels->stem_pays;
}

/* The output rows [*y0, *y1) and columns [*x0, *x1) whose tap t reads inside the image. */
static void tap_rect(const cf_conv_geom *g, int t, int *y0, int *y1, int *x0, int *x1) {
    const int dy = t / 3 - 1, dx = t % 3 - 1;
    *y0 = dy < 0 ? 1 : 0, *y1 = dy > 0 ? g->h - 1 : g->h;
    *x0 = dx < 0 ? 1 : 0, *x1 = dx > 0 ? g->w - 1 : g->w;
}

/* Tap by tap over the plane: each position still sums its taps in order from zero (a tap
 * outside the image adds nothing); the rows' loops vectorise. */
static void loops_forward(const cf_conv_geom *g, int O, const float *w, const float *x,
                          int n_images, float *y, const cf_conv_epilogue *ep) {
    const int C = g->c, K = 9 * C, W = g->w, P = g->h * W;
    for (int i = 0; i < n_images; i++) {
        const float *xi = x + (size_t)i * C * P;
        for (int o = 0; o < O; o++) {
            float *yo = y + ((size_t)i * O + o) * P;
            for (int p = 0; p < P; p++) yo[p] = 0.0f;
            for (int c = 0; c < C; c++)
                for (int t = 0; t < 9; t++) {
                    const float wt = w[(size_t)o * K + c * 9 + t];
                    const float *xs = xi + (size_t)c * P + (t / 3 - 1) * W + t % 3 - 1;
                    int y0, y1, x0, x1;
                    tap_rect(g, t, &y0, &y1, &x0, &x1);
                    for (int oy = y0; oy < y1; oy++) {
                        float *restrict yr = yo + (size_t)oy * W;
                        const float *restrict xr = xs + (size_t)oy * W;
                        for (int ox = x0; ox < x1; ox++) yr[ox] += wt * xr[ox];
                    }
                }
        }
        if (ep && ep->fn) ep->fn(ep->ctx, false, i, 1);
    }
}

/* Each (output, tap) summed per column over the rows (a vectorised loop), then over the
 * columns. */
static void loops_wgrad(const cf_conv_geom *g, int O, const float *dy, const cf_conv_prologue *pro,
                        const float *x, int n_images, float *dwt, bool accumulate) {
    const int C = g->c, W = g->w, P = g->h * W;
    float cols[CF_STEM_MAX_PLANE];
    for (int i = 0; i < n_images; i++) {
        const float *dyi = pro ? pro->fn(pro->ctx, i) : dy + (size_t)i * O * P;
        for (int c = 0; c < C; c++) {
            const float *xc = x + ((size_t)i * C + c) * P;
            for (int o = 0; o < O; o++) {
                const float *dyo = dyi + (size_t)o * P;
                for (int t = 0; t < 9; t++) {
                    const float *xs = xc + (t / 3 - 1) * W + t % 3 - 1;
                    int y0, y1, x0, x1;
                    tap_rect(g, t, &y0, &y1, &x0, &x1);
                    for (int ox = 0; ox < W; ox++) cols[ox] = 0.0f;
                    for (int oy = y0; oy < y1; oy++) {
                        const float *restrict dr = dyo + (size_t)oy * W;
                        const float *restrict xr = xs + (size_t)oy * W;
                        for (int ox = x0; ox < x1; ox++) cols[ox] += dr[ox] * xr[ox];
                    }
                    float s = 0.0f;
                    for (int ox = 0; ox < W; ox++) s += cols[ox];
                    float *d = dwt + (size_t)(c * 9 + t) * O + o;
                    *d = accumulate || i > 0 ? *d + s : s;
                }
            }
        }
    }
}

/* The refusal of a shape or image count the kernels do not take (their lane masks and the
 * portable loops' sums are sized by CF_STEM_MAX_PLANE). */
static cf_status check_call(const char *fn, const cf_conv_geom *g, int out_channels, int n_images) {
    if (cf_conv_stem_supported(g, out_channels) && n_images >= 0) return CF_OK;
    return cf_fail(CF_ERR_INVALID,
                   "%s: %d images of %d channels, %dx%d, kernel %dx%d, stride %dx%d, padding "
                   "%dx%d, %d outputs: the direct stem takes 1 to %d channels, 3x3, stride 1, "
                   "padding 1, planes of at most %d positions",
                   fn, n_images, g->c, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                   out_channels, CF_STEM_MAX_CHANNELS, CF_STEM_MAX_PLANE);
}

cf_status cf_conv_stem_forward(const cf_conv_geom *g, int out_channels, const float *w,
                               const float *x, int n_images, float *y, const cf_conv_epilogue *ep) {
    const cf_status st = check_call("cf_conv_stem_forward", g, out_channels, n_images);
    if (st != CF_OK) return st;
    if (cf_active_kernels->stem_forward)
        cf_active_kernels->stem_forward(g, out_channels, w, x, n_images, y, ep);
    else
        loops_forward(g, out_channels, w, x, n_images, y, ep);
    return CF_OK;
}

static cf_status wgrad_call(const char *fn, const cf_conv_geom *g, int out_channels,
                            const float *dy, const cf_conv_prologue *pro, const float *x,
                            int n_images, float *dwt, bool accumulate) {
    const cf_status st = check_call(fn, g, out_channels, n_images);
    if (st != CF_OK) return st;
    if (pro && !pro->fn) pro = NULL;
    if (cf_active_kernels->stem_wgrad)
        cf_active_kernels->stem_wgrad(g, out_channels, dy, pro, x, n_images, dwt, accumulate);
    else
        loops_wgrad(g, out_channels, dy, pro, x, n_images, dwt, accumulate);
    return CF_OK;
}

cf_status cf_conv_stem_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                             const float *x, int n_images, float *dwt, bool accumulate) {
    return wgrad_call("cf_conv_stem_wgrad", g, out_channels, dy, NULL, x, n_images, dwt,
                      accumulate);
}

cf_status cf_conv_stem_wgrad_each(const cf_conv_geom *g, int out_channels, const float *dy,
                                  const cf_conv_prologue *pro, const float *x, int n_images,
                                  float *dwt, bool accumulate) {
    return wgrad_call("cf_conv_stem_wgrad_each", g, out_channels, dy, pro, x, n_images, dwt,
                      accumulate);
}
