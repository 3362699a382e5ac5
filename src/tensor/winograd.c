/* Winograd F(2x2, 3x3) convolutions for 3x3 layers with stride 1 and padding 1 (VGG's and
 * ResNets' stride-1 layers): each 2x2 output tile is computed from its 4x4 input patch with 16
 * multiplications per (input, output) channel pair instead of 36, so the GEMMs do 2.25 times
 * less work than the direct convolution (Lavin and Gray, "Fast Algorithms for Convolutional
 * Neural Networks", 2016).
 *
 *   forward  V = B^T d B per tile and input channel; M[xi] (K x T) = U[xi] (K x C) . V[xi] (C x T)
 *            for each of the 16 points xi, with U = G g G^T the transformed weights; Y = A^T M A
 *   dx       the same with the weights flipped and their channels swapped (the adjoint of a
 *            stride-1 "same" convolution is one)
 *   dW       the adjoint of the forward pass in the weights: dU[xi]^T (C x K) = sum over tiles
 *            of V[xi] (C x T) . Mg[xi]^T (T x K) with Mg = A dY A^T, then dW = G^T dU G
 *
 * In exact arithmetic these equal the direct convolution and its gradients; in float their
 * rounding differs from it by a few units in the last place of the tile's transformed values
 * (F(2x2, 3x3)'s coefficients are 0, +-1 and 1/2). The transforms are the active kernel table's
 * (winograd_loops.h); the GEMMs go through cf_sgemm_strided. Images are taken in
 * blocks whose size depends on the geometry alone, and every output value comes from its own
 * tile's column of the GEMMs, so the forward pass and dx do not depend on how a batch is split
 * over threads. */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <string.h>

#define POINTS 16 /* 4x4 transformed values per tile */

static size_t round16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* How a call is cut into blocks: the transformed input and output of a block (16 x (C + K) x
 * tiles floats) stay within about 1 MiB, so that the GEMMs read them from L2. A block is
 * `images` whole images, or, when one image has more tiles than that, a band of `rows` tile rows
 * of one image. It depends on the geometry alone. */
typedef struct blocking {
    int images, rows, th, tw;
    size_t ld; /* the tiles of a block, rounded up */
} blocking;

static blocking block_of(const cf_conv_geom *g, int out_channels) {
    blocking b = {.th = (g->h + 1) / 2, .tw = (g->w + 1) / 2};
    const int target = 16384 / (g->c + out_channels), tiles = b.th * b.tw;
    if (tiles <= target) {
        b.images = target / tiles;
        b.rows = b.th;
    } else {
        b.images = 1;
        b.rows = target / b.tw < 1 ? 1 : target / b.tw;
    }
    b.ld = round16((size_t)b.images * b.rows * b.tw);
    return b;
}

bool cf_conv_winograd_supported(const cf_conv_geom *g) {
    return cf_active_kernels->wino && g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 &&
           g->ph == 1 && g->pw == 1 && g->h >= 2 && g->w >= 2 && g->oh == g->h && g->ow == g->w;
}

#define LONG_ROW 14 /* tiles: a 27-28 pixel wide image */

bool cf_conv_winograd_pays(const cf_conv_geom *g, int out_channels) {
    if (!cf_conv_winograd_supported(g)) return false;
    /* The transforms' vectors run along image rows of (w + 1) / 2 tiles. Rows of LONG_ROW tiles
     * or more pay at every vector width measured; shorter rows waste lanes and per-row work,
     * which pays only when the GEMMs are large beside the transforms (they grow as C * K, the
     * transforms as C + K, the waste as 1 / row): C * K * row >= cost * (C + K), the cost
     * measured for each table. Measured with bench_conv (1 thread, Xeon, Sapphire Rapids),
     * Winograd's time against the implicit kernel's: at AVX-512, 0.81 on 32->32 28x28, 0.88 on
     * 64->64 14x14, 1.0 on 32->64 14x14, 1.2 on 32->32 14x14 and 64->64 7x7; at AVX2, 0.75 on
     * 32->32 28x28, 0.85 on 32->64 14x14 and on 64->128 and 128->128 7x7, 1.0 on 64->64 7x7 and
     * 1.03 on 32->32 14x14 (W1, whose 3x3 stride-1 layers are the last two, trained 3% faster
     * without it). */
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    const int row = (g->w + 1) / 2;
    const long C = g->c, K = out_channels;
    if (row >= LONG_ROW) return true;
    return C * K * row >= (long)wk->short_row_cost * (C + K);
}

size_t cf_conv_winograd_scratch(const cf_conv_geom *g, int out_channels) {
    /* the transformed input and output of a block, dy transposed (wgrad: the block's images),
     * the transforms' own */
    const blocking b = block_of(g, out_channels);
    return POINTS * (size_t)(g->c + out_channels) * b.ld +
           (size_t)b.images * out_channels * g->h * g->w + cf_wino_pad_floats(g->h, g->w);
}

size_t cf_conv_winograd_packed_size(const cf_conv_geom *g, int out_channels) {
    return POINTS * (size_t)out_channels * g->c;
}

/* u[xi][r][s] (plane stride `plane`) = G g G^T of one 3x3 kernel g, read as
 * g[i][j] = k[i * ri + j * rj] (ri, rj negative to read it flipped). */
static void weight_transform(const float *k, ptrdiff_t ri, ptrdiff_t rj, float *u, size_t plane) {
    float a[4][3]; /* G g: rows g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2 */
    for (int j = 0; j < 3; j++) {
        const float g0 = k[j * rj], g1 = k[ri + j * rj], g2 = k[2 * ri + j * rj];
        a[0][j] = g0;
        a[1][j] = 0.5f * (g0 + g1 + g2);
        a[2][j] = 0.5f * (g0 - g1 + g2);
        a[3][j] = g2;
    }
    for (int i = 0; i < 4; i++) { /* then G^T on the right, the same over the columns */
        u[(4 * i) * plane] = a[i][0];
        u[(4 * i + 1) * plane] = 0.5f * (a[i][0] + a[i][1] + a[i][2]);
        u[(4 * i + 2) * plane] = 0.5f * (a[i][0] - a[i][1] + a[i][2]);
        u[(4 * i + 3) * plane] = a[i][2];
    }
}

void cf_conv_winograd_pack(const cf_conv_geom *g, int out_channels, const float *w, float *u) {
    const int C = g->c, K = out_channels;
    const size_t plane = (size_t)K * C;
    for (int k = 0; k < K; k++)
        for (int c = 0; c < C; c++)
            weight_transform(w + ((size_t)k * C + c) * 9, 3, 1, u + (size_t)k * C + c, plane);
}

void cf_conv_winograd_pack_dx(const cf_conv_geom *g, int out_channels, const float *w, float *u) {
    /* dx convolves dy (K channels) into C channels with w[k][c] flipped: U'[xi][c][k] */
    const int C = g->c, K = out_channels;
    const size_t plane = (size_t)K * C;
    for (int c = 0; c < C; c++)
        for (int k = 0; k < K; k++)
            weight_transform(w + ((size_t)k * C + c) * 9 + 8, -3, -1, u + (size_t)c * K + k, plane);
}

static int min_int(int a, int b) {
    return a < b ? a : b;
}

/* y (n_images x cout x h x w) = the 3x3 "same" convolution of x (cin channels) with the
 * transformed weights u ([xi][cout][cin]), block by block (b: the forward pass's blocking,
 * whichever way the channels run). */
static void run(const cf_conv_geom *g, int cin, int cout, const blocking *b, const float *u,
                const float *x, int n_images, float *y, float *scratch) {
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    const int h = g->h, w = g->w;
    const size_t plane = (size_t)h * w, ld = b->ld;
    float *v = scratch, *m = v + POINTS * (size_t)cin * ld, *pad = m + POINTS * (size_t)cout * ld;
    for (int n0 = 0; n0 < n_images; n0 += b->images) {
        const int count = min_int(b->images, n_images - n0);
        const float *xb = x + (size_t)n0 * cin * plane;
        float *yb = y + (size_t)n0 * cout * plane;
        for (int ty0 = 0; ty0 < b->th; ty0 += b->rows) {
            const int rows = min_int(b->rows, b->th - ty0), cols = count * rows * b->tw;
            wk->input(xb, cin, h, w, count, cin * plane, ty0, rows, v, cin * ld, (int)ld, pad);
            for (int xi = 0; xi < POINTS; xi++)
                cf_sgemm_strided(cout, cols, cin, u + (size_t)xi * cout * cin, cin, 1,
                                 v + (size_t)xi * cin * ld, (int)ld, m + (size_t)xi * cout * ld,
                                 (int)ld, false);
            wk->output(m, cout * ld, (int)ld, cout, h, w, count, ty0, rows, yb, cout * plane);
        }
    }
}

void cf_conv_winograd_forward(const cf_conv_geom *g, int out_channels, const float *u,
                              const float *x, int n_images, float *y, float *scratch) {
    const blocking b = block_of(g, out_channels);
    run(g, g->c, out_channels, &b, u, x, n_images, y, scratch);
}

void cf_conv_winograd_dx(const cf_conv_geom *g, int out_channels, const float *u_dx,
                         const float *dy, int n_images, float *dx, float *scratch) {
    const blocking b = block_of(g, out_channels);
    run(g, out_channels, g->c, &b, u_dx, dy, n_images, dx, scratch);
}

void cf_conv_winograd_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                            const float *x, int n_images, float *du, bool accumulate,
                            float *scratch) {
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    const int C = g->c, K = out_channels, h = g->h, w = g->w;
    const blocking b = block_of(g, K);
    const size_t ld = b.ld, plane = (size_t)h * w;
    /* V as in the forward pass, [xi][c][t]; Mg^T [xi][t][k] from dy transposed image by image
     * (pixel-major), so that dU^T[xi] (C x K) = V[xi] (C x T) . Mg^T[xi] (T x K) reads both in
     * place, with the long sum over the tiles inside the register tiles */
    float *v = scratch, *mgt = v + POINTS * (size_t)C * ld, *dyt = mgt + POINTS * (size_t)K * ld;
    float *pad = dyt + (size_t)b.images * K * plane;
    if (n_images <= 0 && !accumulate) memset(du, 0, POINTS * (size_t)K * C * sizeof(float));
    bool add = accumulate;
    for (int n0 = 0; n0 < n_images; n0 += b.images) {
        const int count = min_int(b.images, n_images - n0);
        for (int n = 0; n < count; n++)
            cf_transpose(K, (int)plane, dy + (size_t)(n0 + n) * K * plane, (ptrdiff_t)plane,
                         dyt + (size_t)n * K * plane, K);
        for (int ty0 = 0; ty0 < b.th; ty0 += b.rows) {
            const int rows = min_int(b.rows, b.th - ty0), cols = count * rows * b.tw;
            wk->input(x + (size_t)n0 * C * plane, C, h, w, count, C * plane, ty0, rows, v, C * ld,
                      (int)ld, pad);
            wk->dy_nhwc(dyt, K, h, w, count, ty0, rows, mgt, ld * K);
            for (int xi = 0; xi < POINTS; xi++)
                cf_sgemm_strided(C, K, cols, v + (size_t)xi * C * ld, (ptrdiff_t)ld, 1,
                                 mgt + (size_t)xi * K * ld, K, du + (size_t)xi * K * C, K, add);
            add = true;
        }
    }
}

void cf_conv_winograd_wgrad_add(const cf_conv_geom *g, int out_channels, const float *du,
                                float *dw) {
    const int C = g->c, K = out_channels;
    const size_t plane = (size_t)K * C;
    for (int k = 0; k < K; k++)
        for (int c = 0; c < C; c++) {
            const size_t ck = (size_t)c * K + k; /* du is [xi][c][k] */
            float d[4][4], b[3][4];
            for (int xi = 0; xi < POINTS; xi++) d[xi / 4][xi % 4] = du[xi * plane + ck];
            for (int j = 0; j < 4;
                 j++) { /* G^T dU: rows d0 + (d1 + d2)/2, (d1 - d2)/2, (d1 + d2)/2 + d3 */
                b[0][j] = d[0][j] + 0.5f * (d[1][j] + d[2][j]);
                b[1][j] = 0.5f * (d[1][j] - d[2][j]);
                b[2][j] = 0.5f * (d[1][j] + d[2][j]) + d[3][j];
            }
            float *out = dw + ((size_t)k * C + c) * 9; /* (K, C, 3, 3) */
            for (int r = 0; r < 3; r++) { /* then G on the right, the same over the columns */
                out[3 * r] += b[r][0] + 0.5f * (b[r][1] + b[r][2]);
                out[3 * r + 1] += 0.5f * (b[r][1] - b[r][2]);
                out[3 * r + 2] += 0.5f * (b[r][1] + b[r][2]) + b[r][3];
            }
        }
}
