/* grid_sample's bilinear taps and gathers (cf_grid_sample_taps and cf_grid_sample_gather in
 * corefit/tensor.h), written once in plain C and compiled into each kernel table with that
 * table's instruction set, as softmax_loops.h: the taps' element loops hold selects only (no
 * calls, no branches), so the compiler vectorises them, and every value takes the operations of the
 * scalar definition in the same order (no contraction: C11 mode), so the bits never depend on
 * the table. The one case a select cannot express (a reflected coordinate past the far edge,
 * which needs fmodf) is marked in the vector pass and finished by a scalar pass. */
#ifndef COREFIT_GRID_SAMPLE_LOOPS_H
#define COREFIT_GRID_SAMPLE_LOOPS_H

#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <math.h>
#include <stdint.h>

/* The reflection past the far edge (PyTorch's reflect_coordinates), then the clamp. */
static float grid_reflect_far(float x, int n) {
    const float span = (float)(n - 1);
    const float extra = fmodf(x, span);
    /* the parity of the flips; past int's range (or for an infinite x, whose extra is NaN)
     * even, as x86's conversion of such a value to INT_MIN made it */
    const float flips = floorf(x / span);
    x = !(flips < 2147483648.0f) || (int)flips % 2 == 0 ? extra : span - extra;
    return x < 0 ? 0.0f : x > span ? span : x;
}

/* The source coordinate of grid value g over n pixels, without the reflection's far case (*far
 * set instead): see cf_grid_sample_taps. pad is a constant where it is inlined. */
static inline float grid_coord(float g, int n, int pad, int *far) {
    const float x = (g + 1.0f) * 0.5f * (float)(n - 1);
    const float top = (float)(n - 1);
    if (pad == CF_GRID_ZEROS) {
        *far = 0;
        const float hi = x <= (float)n ? x : (float)n;
        return x >= -2.0f ? hi : -2.0f;
    }
    float r = x;
    if (pad == CF_GRID_REFLECTION) {
        const float a = fabsf(x);
        const int f = (n > 1) & !(a <= top);
        *far = f;
        r = (n == 1) | f ? 0.0f : a;
    } else {
        *far = 0;
    }
    const float lo = r > top ? top : r;
    return r < 0 ? 0.0f : lo;
}

/* The coordinates of n grid values under one padding mode (a constant: one loop each). */
static inline int grid_coords(const float *restrict g, int n, int len, int pad, float *restrict c,
                              int *restrict far) {
    int any = 0;
    for (int q = 0; q < len; q++) {
        c[q] = grid_coord(g[q], n, pad, &far[q]);
        any |= far[q];
    }
    return any;
}

static void loops_grid_taps(const float mat[2][3], const double *warp, int pad, int h, int w, int i,
                            int j0, int n, int32_t *restrict idx, float *restrict wt) {
    float gxs[CF_GRID_CHUNK], gys[CF_GRID_CHUNK], ixs[CF_GRID_CHUNK], iys[CF_GRID_CHUNK];
    int fx[CF_GRID_CHUNK], fy[CF_GRID_CHUNK];
    const float yn = h > 1 ? -1.0f + 2.0f * (float)i / (float)(h - 1) : -1.0f;
    /* the row's products, as the scalar sum a xn + b yn + c forms them */
    const float ry = mat[0][1] * yn, ryy = mat[1][1] * yn;
    const float den = (float)(w - 1);
    for (int q = 0; q < n; q++) {
        const float xn = w > 1 ? -1.0f + 2.0f * (float)(j0 + q) / den : -1.0f;
        gxs[q] = mat[0][0] * xn + ry + mat[0][2];
        gys[q] = mat[1][0] * xn + ryy + mat[1][2];
    }
    if (warp) {
        const double k0 = warp[0], k1 = warp[1], k2 = warp[2], k3 = warp[3], k4 = warp[4],
                     k5 = warp[5], k6 = warp[6], k7 = warp[7];
        for (int q = 0; q < n; q++) {
            const double gx = gxs[q], gy = gys[q];
            const double X = k0 * gx + k1 * gy + k2, Y = k3 * gx + k4 * gy + k5;
            const double Z = k6 * gx + k7 * gy + 1.0;
            /* a zero divisor leaves the point: gx / (0 + 1), exactly gx, so that every lane
             * divides and the loop has no branch */
            const int z = Z == 0.0;
            const double Xs = z ? gx : X, Ys = z ? gy : Y, Zs = Z + (double)z;
            gxs[q] = (float)(Xs / Zs);
            gys[q] = (float)(Ys / Zs);
        }
    }
    int any_far = 0;
    if (pad == CF_GRID_ZEROS) {
        grid_coords(gxs, w, n, CF_GRID_ZEROS, ixs, fx);
        grid_coords(gys, h, n, CF_GRID_ZEROS, iys, fy);
    } else if (pad == CF_GRID_BORDER) {
        grid_coords(gxs, w, n, CF_GRID_BORDER, ixs, fx);
        grid_coords(gys, h, n, CF_GRID_BORDER, iys, fy);
    } else {
        any_far = grid_coords(gxs, w, n, CF_GRID_REFLECTION, ixs, fx);
        any_far |= grid_coords(gys, h, n, CF_GRID_REFLECTION, iys, fy);
    }
    if (any_far)
        for (int q = 0; q < n; q++) {
            if (fx[q]) ixs[q] = grid_reflect_far(fabsf((gxs[q] + 1.0f) * 0.5f * (float)(w - 1)), w);
            if (fy[q]) iys[q] = grid_reflect_far(fabsf((gys[q] + 1.0f) * 0.5f * (float)(h - 1)), h);
        }
    int32_t *i0 = idx, *i1 = idx + n, *i2 = idx + 2 * n, *i3 = idx + 3 * n;
    float *w0 = wt, *w1 = wt + n, *w2 = wt + 2 * n, *w3 = wt + 3 * n;
    for (int q = 0; q < n; q++) {
        /* a NaN coordinate (the reflection of an infinite one) has every tap outside: -2 */
        const float ix = ixs[q] == ixs[q] ? ixs[q] : -2.0f, iy = iys[q] == iys[q] ? iys[q] : -2.0f;
        /* floor: the truncation, less one where it rounded up (a negative fraction) */
        const int32_t tx = (int32_t)ix, ty = (int32_t)iy;
        const int32_t x0 = tx - ((float)tx > ix), y0 = ty - ((float)ty > iy);
        const float ax = ix - (float)x0, ay = iy - (float)y0;
        w0[q] = (1 - ax) * (1 - ay);
        w1[q] = ax * (1 - ay);
        w2[q] = (1 - ax) * ay;
        w3[q] = ax * ay;
        i0[q] = x0;
        i1[q] = y0;
    }
    for (int q = 0; q < n; q++) {
        const int32_t x0 = i0[q], y0 = i1[q];
        const int32_t vx0 = (x0 >= 0) & (x0 < w), vx1 = (x0 >= -1) & (x0 < w - 1);
        const int32_t vy0 = (y0 >= 0) & (y0 < h), vy1 = (y0 >= -1) & (y0 < h - 1);
        /* unsigned: a lane whose taps are all outside may overflow (its offsets go unused) */
        const uint32_t base = (uint32_t)y0 * (uint32_t)w + (uint32_t)x0, uw = (uint32_t)w;
        i0[q] = vx0 & vy0 ? (int32_t)base : -1;
        i1[q] = vx1 & vy0 ? (int32_t)(base + 1u) : -1;
        i2[q] = vx0 & vy1 ? (int32_t)(base + uw) : -1;
        i3[q] = vx1 & vy1 ? (int32_t)(base + uw + 1u) : -1;
    }
}

/* The gathers stay scalar, with a branch for the pixels whose four taps are inside: on the Zen 4
 * this measured 0.88-0.91 of the CPU time of the same loop as branch-free selects vectorised into
 * 16-lane vgatherdps (and of 64-bit pair gathers), which GCC does not vectorise. */
static void loops_grid_gather(int n, const int32_t *restrict idx, const float *restrict wt,
                              const float *restrict src, float *restrict out) {
    const int32_t *i0 = idx, *i1 = idx + n, *i2 = idx + 2 * n, *i3 = idx + 3 * n;
    const float *w0 = wt, *w1 = wt + n, *w2 = wt + 2 * n, *w3 = wt + 3 * n;
    for (int q = 0; q < n; q++) {
        const int32_t k0 = i0[q], k1 = i1[q], k2 = i2[q], k3 = i3[q];
        float v = 0.0f;
        if ((k0 | k1 | k2 | k3) >= 0) {
            v += src[k0] * w0[q];
            v += src[k1] * w1[q];
            v += src[k2] * w2[q];
            v += src[k3] * w3[q];
        } else {
            if (k0 >= 0) v += src[k0] * w0[q];
            if (k1 >= 0) v += src[k1] * w1[q];
            if (k2 >= 0) v += src[k2] * w2[q];
            if (k3 >= 0) v += src[k3] * w3[q];
        }
        out[q] = v;
    }
}

static const cf_grid_sample_kernels loops_grid_sample = {
    .taps = loops_grid_taps,
    .gather = loops_grid_gather,
};

#endif
