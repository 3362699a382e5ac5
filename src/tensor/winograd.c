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
 * (winograd_loops.h); the fp32 GEMMs go through cf_sgemm_strided. Images are taken in
 * blocks whose size depends on the geometry alone, and every output value comes from its own
 * tile's column of the GEMMs, so the forward pass and dx do not depend on how a batch is split
 * over threads.
 *
 * Mixed precision (the _bf16 functions, where the kernel table computes in bf16): the transforms
 * stay fp32, and the 16 per-point GEMMs take bf16 operands with fp32 sums. Rounded to bf16 (round
 * to nearest even, cf_fp32_to_bf16's): V and U in the forward pass, the flipped weights' U and
 * the transformed output gradient in dx, V and Mg in dW; U once per pass (the bf16 pack), V and
 * Mg as the transforms compute them where the level has input_pairs, dy_pairs and gemm_paired
 * (AVX512_BF16: pairs in the GEMM's order, read in place; dW's V as bf16 rows of tiles, input_bf16,
 * read in place by gemm_rows), else as the GEMM packs them (the same values, bitwise the same
 * results). PyTorch's autocast rounds the layer's operands instead (x, w,
 * dy) and its products of rounded values are exact. Here each product of two rounded transformed
 * values is off by at most 2u + u^2 (u = 2^-8) of its magnitude, so an output is off by at most
 * that much of the same computation on absolute values, |A^T| (sum over channels of (|G| |g|
 * |G^T|) . (|B^T| |d| |B|)) |A|, plus fp32's rounding: the same order as rounding x and w, over
 * a sum that weighs each tap by up to 2.25 instead of 1. The errors add up as a random walk:
 * measured against float64 (tests/test_bf16_winograd.c, which checks that bound on every
 * output), 8e-6 to 8e-5 of that sum on average, a relative error per output comparable to
 * autocast's. Enough for training, whose gradient noise is far larger (a bf16 fit's accuracy is
 * in bench/README.md). bf16 blocks hold at least BF16_TILES tiles (block_of). */
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
enum { BF16_TILES = 128 };

typedef struct blocking {
    int images, rows, th, tw;
    size_t ld; /* the tiles of a block, rounded up */
} blocking;

static blocking block_of(const cf_conv_geom *g, int out_channels, bool bf16) {
    blocking b = {.th = (g->h + 1) / 2, .tw = (g->w + 1) / 2};
    int target = 16384 / (g->c + out_channels);
    /* In bf16, at least BF16_TILES tiles: many channels leave blocks of few tiles (16 for 512 x
     * 512 channels), and then the products stream more weights (forward, dx) and more of the
     * weight gradient's sums (16 x C x K floats, read and written per block) than they compute
     * on; the doubled multiply rate made the step bound by that traffic. */
    if (bf16 && target < BF16_TILES) target = BF16_TILES;
    const int tiles = b.th * b.tw;
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

/* The distance between two points' planes of n floats (or 4-byte words): n rounded up to an odd
 * number of 64-byte lines. The transforms read or write one vector of each of the 16 planes in
 * turn; planes a multiple of 4 KiB apart (64 channels x 128 tiles: 32 KiB) put those 16 lines in
 * one set of the 8-way L1, which then missed on every access (the output transform of a 64-channel
 * 32x32 block took 2.5 times as long). An odd number of lines apart, they fall in 16 sets. */
static size_t point_stride(size_t n) {
    n = round16(n);
    return n / 16 % 2 ? n : n + 16;
}

static size_t scratch_of(const cf_conv_geom *g, int out_channels, bool bf16) {
    /* the transformed input and output of a block, dy transposed (wgrad: the block's images),
     * the transforms' own */
    const blocking b = block_of(g, out_channels, bf16);
    return POINTS *
               (point_stride((size_t)g->c * b.ld) + point_stride((size_t)out_channels * b.ld)) +
           (size_t)b.images * out_channels * g->h * g->w + cf_wino_pad_floats(g->h, g->w);
}

size_t cf_conv_winograd_scratch(const cf_conv_geom *g, int out_channels) {
    return scratch_of(g, out_channels, false);
}

/* The _bf16 functions' scratch: the bf16 blocks' (the larger), then one point's fp32 weights
 * (C x K floats) where a pack made at another level is unpacked point by point. */
size_t cf_conv_winograd_scratch_bf16(const cf_conv_geom *g, int out_channels) {
    return scratch_of(g, out_channels, true) + round16((size_t)g->c * out_channels);
}

/* Where in a _bf16 function's scratch a point's weights are unpacked. */
static float *unpack_area(const cf_conv_geom *g, int out_channels, float *scratch) {
    return scratch + scratch_of(g, out_channels, true);
}

size_t cf_conv_winograd_packed_size(const cf_conv_geom *g, int out_channels) {
    return POINTS * (size_t)out_channels * g->c;
}

/* The weight transforms work on LANES kernels at once, with the lane index innermost so that
 * the compiler vectorises them, and write (or read) whole lines of the transformed planes: one
 * kernel at a time, the 16 planes (a megabyte apart for 512 x 512 channels) fall in the same
 * cache sets and every store missed. */
enum { LANES = 16 };

static int min_int(int a, int b) {
    return a < b ? a : b;
}

/* u[xi][l] = G g G^T of the n kernels g[t][l] (tap t = 3 * row + column of kernel l). */
static inline __attribute__((always_inline)) void weight_transform(const float g[9][LANES],
                                                                   float u[POINTS][LANES], int n) {
    float a[4][3][LANES]; /* G g: rows g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2 */
    for (int j = 0; j < 3; j++)
        for (int l = 0; l < n; l++) {
            const float g0 = g[j][l], g1 = g[3 + j][l], g2 = g[6 + j][l];
            a[0][j][l] = g0;
            a[1][j][l] = 0.5f * (g0 + g1 + g2);
            a[2][j][l] = 0.5f * (g0 - g1 + g2);
            a[3][j][l] = g2;
        }
    for (int i = 0; i < 4; i++) /* then G^T on the right, the same over the columns */
        for (int l = 0; l < n; l++) {
            u[4 * i][l] = a[i][0][l];
            u[4 * i + 1][l] = 0.5f * (a[i][0][l] + a[i][1][l] + a[i][2][l]);
            u[4 * i + 2][l] = 0.5f * (a[i][0][l] - a[i][1][l] + a[i][2][l]);
            u[4 * i + 3][l] = a[i][2][l];
        }
}

/* Transforms the n kernels that start at k + l * lstride (tap t at k[t], or at k[-t] when
 * flipped) into u + xi * plane + l. */
static inline __attribute__((always_inline)) void
transform_n(const float *k, size_t lstride, bool flip, int n, float *u, size_t plane) {
    float g[9][LANES], t[POINTS][LANES];
    for (int l = 0; l < n; l++)
        for (int tap = 0; tap < 9; tap++) g[tap][l] = k[l * lstride + (flip ? 8 - tap : tap)];
    weight_transform(g, t, n);
    for (int xi = 0; xi < POINTS; xi++) memcpy(u + xi * plane, t[xi], (size_t)n * sizeof(float));
}

/* Full blocks with a constant lane count (vectorised), the rest as it comes. */
static void transform_lanes(const float *k, size_t lstride, bool flip, int n, float *u,
                            size_t plane) {
    if (n == LANES)
        transform_n(k, lstride, flip, LANES, u, plane);
    else
        transform_n(k, lstride, flip, n, u, plane);
}

void cf_conv_winograd_pack(const cf_conv_geom *g, int out_channels, const float *w, float *u) {
    /* U[xi][k][c]: lanes over the input channels */
    const int C = g->c, K = out_channels;
    const size_t plane = (size_t)K * C;
    for (int k = 0; k < K; k++)
        for (int c = 0; c < C; c += LANES)
            transform_lanes(w + ((size_t)k * C + c) * 9, 9, false, min_int(LANES, C - c),
                            u + (size_t)k * C + c, plane);
}

void cf_conv_winograd_pack_dx(const cf_conv_geom *g, int out_channels, const float *w, float *u) {
    /* dx convolves dy (K channels) into C channels with w[k][c] flipped: U'[xi][c][k], lanes
     * over the output channels */
    const int C = g->c, K = out_channels;
    const size_t plane = (size_t)K * C;
    for (int c = 0; c < C; c++)
        for (int k = 0; k < K; k += LANES)
            transform_lanes(w + ((size_t)k * C + c) * 9, (size_t)C * 9, true, min_int(LANES, K - k),
                            u + (size_t)c * K + k, plane);
}

/* ---- bf16 products -------------------------------------------------------------------------
 *
 * A bf16 pack (cf_conv_winograd_pack_bf16, _pack_dx_bf16) holds each point's matrix
 * [rows][cols] in one of two forms, which a stamp at its end names:
 *   packed  where the active level's bf16 GEMM takes its A packed beforehand (avx512_bf16's
 *           gemm_pack_a and gemm_pack_a_rows): each point's matrix packed (rounded to bf16) for
 *           it, bound_words(rows, cols) words per point, and no fp32 planes: the words
 *           gemm_pack_a makes from the whole fp32 planes, without writing and reading those
 *           planes (16 x rows x cols floats, 16 MiB for 512 x 512 channels). The level's
 *           wino_pack_a transforms 16 rows of the 16 points at a time straight into their
 *           words; without it, the transform writes those rows into a staging area after the
 *           packed points (kept in L2), which gemm_pack_a_rows packs into place. On 512 x 512
 *           channels (Zen 4, one core) the pack and the dx pack took 4.5 and 5.1 ms with the
 *           planes, 1.65 and 1.4 ms straight into the packed words.
 *   planes  elsewhere, the fp32 transformed weights [xi][rows][cols] as the fp32 pack holds them
 *           (levels without bf16 products, which take them as they are; the amx level, whose
 *           tile GEMM rounds them as it packs its own A).
 * Either way the weights are transformed (and rounded) once per pass instead of once per block.
 * A packed pack read where its layout is not the active level's (cf_set_isa between the pack
 * and the call) is unpacked point by point, each point's bf16 values as fp32 (its packer's
 * gemm_unpack_a) into the unpack area at the end of the _bf16 functions' scratch (no
 * allocation, so no error to report): the products on them at a bf16 level are bitwise those
 * on the fp32 planes, which the GEMM rounds to the same values; at a level without bf16
 * products, the products take the weights rounded to bf16. */

/* Words reserved per point for the packed A of rows x cols (any level's row blocks up to 16). */
static size_t bound_words(int rows, int cols) {
    return (size_t)(rows + 15) / 16 * 16 * (size_t)((cols + 1) / 2);
}

static size_t max_size(size_t a, size_t b) {
    return a > b ? a : b;
}

/* Words of the packed A of all points, whichever way the channels run (the same for a pack and
 * a dx pack of one layer). */
static size_t points_words(int rows, int cols) {
    return POINTS * max_size(bound_words(rows, cols), bound_words(cols, rows));
}

enum { STAGE_ROWS = 16 }; /* rows of the 16 points transformed before they are packed */

/* The staging area after the packed points: STAGE_ROWS rows of each point's matrix, or one whole
 * point (as fp32), whichever way the channels run. */
static size_t stage_floats(int rows, int cols) {
    return max_size(round16((size_t)POINTS * STAGE_ROWS * (size_t)max_size(rows, cols)),
                    round16((size_t)rows * cols));
}

/* The stamp (the last STAMP_WORDS words): the form, the shape, and for a packed pack the packer
 * (the address of its level's gemm_pack_a, whose layout it holds) and its gemm_unpack_a. */
#define STAMP_MAGIC 0x57b16a5eu
enum { STAMP_WORDS = 8, FORM_PLANES = 1, FORM_PACKED = 2 };

typedef struct stamp {
    uint32_t magic, rows, cols, form;
    uint64_t packer;
    void (*unpack)(int m, int k, const uint32_t *ap, float *a, int lda);
} stamp;

_Static_assert(sizeof(stamp) <= STAMP_WORDS * sizeof(uint32_t), "the stamp fits its words");

/* Floats of a bf16 pack of rows x cols (symmetric: a pack and a dx pack of one layer). */
static size_t total_floats(int rows, int cols) {
    return max_size(round16(POINTS * (size_t)rows * cols),
                    points_words(rows, cols) + stage_floats(rows, cols)) +
           STAMP_WORDS;
}

size_t cf_conv_winograd_packed_size_bf16(const cf_conv_geom *g, int out_channels) {
    return total_floats(out_channels, g->c);
}

static stamp stamp_read(const float *u, int rows, int cols) {
    stamp s;
    memcpy(&s, u + total_floats(rows, cols) - STAMP_WORDS, sizeof s);
    return s;
}

static void stamp_write(float *u, int rows, int cols, int form, const cf_bf16_kernels *k) {
    stamp s = {.magic = STAMP_MAGIC,
               .rows = (uint32_t)rows,
               .cols = (uint32_t)cols,
               .form = (uint32_t)form};
    if (k) {
        s.packer = (uint64_t)(uintptr_t)k->gemm_pack_a;
        s.unpack = k->gemm_unpack_a;
    }
    memcpy(u + total_floats(rows, cols) - STAMP_WORDS, &s, sizeof s);
}

/* The active level's bf16 kernels when they take A (rows x cols) packed beforehand within the
 * room reserved for it, packed piece by piece, else NULL. */
static const cf_bf16_kernels *prepacked(int rows, int cols) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    return k && k->gemm && k->gemm_a_words && k->gemm_pack_a && k->gemm_packed &&
                   k->gemm_pack_a_rows && k->gemm_unpack_a &&
                   k->gemm_a_words(rows, cols) <= bound_words(rows, cols)
               ? k
               : NULL;
}

/* The packed A of each point of rows x cols, at the start of a packed pack. */
static uint32_t *packed_points(const float *u, int rows, int cols) {
    (void)rows, (void)cols;
    return (uint32_t *)u;
}

/* The active level's kernels when u is packed in their layout for rows x cols, else NULL. */
static const cf_bf16_kernels *prepacked_in(const float *u, int rows, int cols) {
    const cf_bf16_kernels *k = prepacked(rows, cols);
    if (!k) return NULL;
    const stamp s = stamp_read(u, rows, cols);
    return s.magic == STAMP_MAGIC && s.rows == (uint32_t)rows && s.cols == (uint32_t)cols &&
                   s.form == FORM_PACKED && s.packer == (uint64_t)(uintptr_t)k->gemm_pack_a
               ? k
               : NULL;
}

/* The packed form: the weights w (K x C x 3 x 3) transformed STAGE_ROWS rows at a time into the
 * staging area ([xi][row][cols]; dx: rows over the input channels, the kernels flipped, as
 * cf_conv_winograd_pack_dx), then those rows of each point packed into place. The same values as
 * the fp32 pack's planes, packed as gemm_pack_a packs the planes: bitwise the same words. */
static void pack_packed(const cf_bf16_kernels *k, bool dx, int C, int K, const float *w, float *u) {
    const int rows = dx ? C : K, cols = dx ? K : C;
    uint32_t *p = packed_points(u, rows, cols);
    float *stage = u + points_words(rows, cols);
    const size_t plane = (size_t)STAGE_ROWS * cols, bw = bound_words(rows, cols);
    const size_t js = (size_t)C * 9; /* dx: the next column's (output channel's) kernels */
    if (k->wino_pack_a) {
        for (int r0 = 0; r0 < rows; r0 += STAGE_ROWS) {
            const int nr = min_int(STAGE_ROWS, rows - r0);
            if (dx) { /* the rows' kernels side by side (input channels r0.. of one kernel row) */
                k->wino_pack_a(w + (size_t)r0 * 9, js, true, rows, cols, r0, p, bw);
                continue;
            }
            /* the rows' kernels (output channels) are C x 9 floats apart: copied side by side
             * per column into the staging area, [column][row][tap], so that the level reads each
             * column's 16 kernels in one run of 144 floats */
            for (int j = 0; j < cols; j++)
                for (int i = 0; i < nr; i++)
                    memcpy(stage + ((size_t)j * STAGE_ROWS + i) * 9,
                           w + ((size_t)(r0 + i) * C + j) * 9, 9 * sizeof(float));
            k->wino_pack_a(stage, (size_t)STAGE_ROWS * 9, false, rows, cols, r0, p, bw);
        }
        stamp_write(u, rows, cols, FORM_PACKED, k);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += STAGE_ROWS) {
        const int nr = min_int(STAGE_ROWS, rows - r0);
        for (int r = r0; r < r0 + nr; r++)
            for (int j = 0; j < cols; j += LANES) {
                float *at = stage + (size_t)(r - r0) * cols + j;
                if (dx) /* row r: input channel r, lanes over the output channels */
                    transform_lanes(w + ((size_t)j * C + r) * 9, (size_t)C * 9, true,
                                    min_int(LANES, cols - j), at, plane);
                else
                    transform_lanes(w + ((size_t)r * C + j) * 9, 9, false, min_int(LANES, cols - j),
                                    at, plane);
            }
        for (int xi = 0; xi < POINTS; xi++)
            k->gemm_pack_a_rows(rows, cols, r0, nr, stage + xi * plane, cols, p + xi * bw);
    }
    stamp_write(u, rows, cols, FORM_PACKED, k);
}

void cf_conv_winograd_pack_bf16(const cf_conv_geom *g, int out_channels, const float *w, float *u) {
    const cf_bf16_kernels *k = prepacked(out_channels, g->c);
    if (k) {
        pack_packed(k, false, g->c, out_channels, w, u);
        return;
    }
    cf_conv_winograd_pack(g, out_channels, w, u);
    stamp_write(u, out_channels, g->c, FORM_PLANES, NULL);
}

void cf_conv_winograd_pack_dx_bf16(const cf_conv_geom *g, int out_channels, const float *w,
                                   float *u) {
    const cf_bf16_kernels *k = prepacked(g->c, out_channels);
    if (k) {
        pack_packed(k, true, g->c, out_channels, w, u);
        return;
    }
    cf_conv_winograd_pack_dx(g, out_channels, w, u);
    stamp_write(u, g->c, out_channels, FORM_PLANES, NULL);
}

/* Whether u (rows x cols) holds a packed form that the active level does not read as it is (a
 * pack made at another level: cf_set_isa between the pack and the call), whose points are then
 * unpacked one at a time (point_planes). A pack without a stamp of this shape is taken as
 * planes (an fp32 pack, as before stamps). */
static bool foreign(const float *u, int rows, int cols, bool bf16) {
    const stamp s = stamp_read(u, rows, cols);
    return s.magic == STAMP_MAGIC && s.rows == (uint32_t)rows && s.cols == (uint32_t)cols &&
           s.form == FORM_PACKED && !(bf16 && prepacked_in(u, rows, cols));
}

/* Point xi's fp32 weights (rows x cols, row stride cols) of a pack: in place in the planes form,
 * else (foreign) its packer's bf16 values unpacked into area (rows x cols floats). */
static const float *point_planes(const float *u, int rows, int cols, int xi, bool unpack,
                                 float *area) {
    if (!unpack) return u + (size_t)xi * rows * cols;
    const stamp s = stamp_read(u, rows, cols);
    s.unpack(rows, cols, packed_points(u, rows, cols) + (size_t)xi * bound_words(rows, cols), area,
             cols);
    return area;
}

/* M[xi] (cout x cols, row stride ld) = U[xi] (cout x cin) . V[xi] (cin x cols) in bf16: through
 * the packed A of a packed pack made for the active level, else cf_sgemm_bf16 on the planes
 * (unpack: a foreign pack's point unpacked into area first; bitwise the same). Where
 * gemm_packed refuses (its panel scratch out of memory), the point unpacked into area and
 * cf_sgemm_bf16 (which takes fp32 products where it has no scratch either): no allocation here. */
static void point_bf16(const float *u, int cout, int cin, int xi, const float *v, int cols, int ld,
                       float *m, bool unpack, float *area) {
    const cf_bf16_kernels *k = unpack ? NULL : prepacked_in(u, cout, cin);
    if (k) {
        const uint32_t *a = packed_points(u, cout, cin) + (size_t)xi * bound_words(cout, cin);
        if (k->gemm_packed(cout, cols, cin, a, false, v, ld, m, ld, false)) return;
        k->gemm_unpack_a(cout, cin, a, area, cin);
        cf_sgemm_bf16(false, false, cout, cols, cin, area, cin, v, ld, m, ld, false);
        return;
    }
    cf_sgemm_bf16(false, false, cout, cols, cin, point_planes(u, cout, cin, xi, unpack, area), cin,
                  v, ld, m, ld, false);
}

static bool fused = true; /* cf__winograd_set_fused */

void cf__winograd_set_fused(bool on) {
    fused = on;
}

/* The row stride, in words, of the bf16 pairs of the transformed input (input_pairs): the block's
 * tiles rounded up to an odd number of 64-byte lines, so that the rows of pairs a GEMM panel
 * reads (48 columns, 128 pairs) spread over all the L1 sets instead of falling into a few (rows
 * 512 bytes apart use 24 sets of 64). */
static size_t pairs_ld(size_t ld) {
    return ld / 16 % 2 ? ld : ld + 16;
}

/* y (n_images x cout x h x w) = the 3x3 "same" convolution of x (cin channels) with the
 * transformed weights u ([xi][cout][cin]), block by block (b: the forward pass's blocking,
 * whichever way the channels run). In bf16, where the level has input_pairs and gemm_paired (and
 * the pairs fit where V would be), V is rounded and paired as the transform computes it and the
 * GEMM reads it in place: bitwise the same as V in fp32 rounded by the GEMM's packing, without
 * writing and reading V in fp32. */
static void run(const cf_conv_geom *g, int cin, int cout, const blocking *b, const float *u,
                const float *x, int n_images, float *y, float *scratch, bool bf16, float *area) {
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    const int h = g->h, w = g->w;
    const size_t plane = (size_t)h * w, ld = b->ld;
    const size_t v_xi = point_stride((size_t)cin * ld), m_xi = point_stride((size_t)cout * ld);
    float *v = scratch, *m = v + POINTS * v_xi, *pad = m + POINTS * m_xi;
    const cf_bf16_kernels *bk =
        bf16 && fused && wk->input_pairs ? prepacked_in(u, cout, cin) : NULL;
    const size_t ldp = pairs_ld(ld), vp_xi = point_stride((size_t)(cin + 1) / 2 * ldp);
    if (bk && (!bk->gemm_paired || vp_xi > v_xi)) bk = NULL;
    uint32_t *vp = (uint32_t *)v;
    /* area: a _bf16 function's (a pack with a stamp; NULL: an fp32 pack) */
    const bool unpack = area && foreign(u, cout, cin, bf16);
    for (int n0 = 0; n0 < n_images; n0 += b->images) {
        const int count = min_int(b->images, n_images - n0);
        const float *xb = x + (size_t)n0 * cin * plane;
        float *yb = y + (size_t)n0 * cout * plane;
        for (int ty0 = 0; ty0 < b->th; ty0 += b->rows) {
            const int rows = min_int(b->rows, b->th - ty0), cols = count * rows * b->tw;
            if (bk) {
                wk->input_pairs(xb, cin, h, w, count, cin * plane, ty0, rows, vp, vp_xi, (int)ldp,
                                pad);
                for (int xi = 0; xi < POINTS; xi++)
                    bk->gemm_paired(cout, cols, cin,
                                    packed_points(u, cout, cin) +
                                        (size_t)xi * bound_words(cout, cin),
                                    vp + (size_t)xi * vp_xi, ldp, m + xi * m_xi, (int)ld, false);
                wk->output(m, m_xi, (int)ld, cout, h, w, count, ty0, rows, yb, cout * plane);
                continue;
            }
            wk->input(xb, cin, h, w, count, cin * plane, ty0, rows, v, v_xi, (int)ld, pad);
            for (int xi = 0; xi < POINTS; xi++)
                if (bf16)
                    point_bf16(u, cout, cin, xi, v + xi * v_xi, cols, (int)ld, m + xi * m_xi,
                               unpack, area);
                else
                    cf_sgemm_strided(cout, cols, cin, point_planes(u, cout, cin, xi, unpack, area),
                                     cin, 1, v + xi * v_xi, (int)ld, m + xi * m_xi, (int)ld, false);
            wk->output(m, m_xi, (int)ld, cout, h, w, count, ty0, rows, yb, cout * plane);
        }
    }
}

void cf_conv_winograd_forward(const cf_conv_geom *g, int out_channels, const float *u,
                              const float *x, int n_images, float *y, float *scratch) {
    const blocking b = block_of(g, out_channels, false);
    run(g, g->c, out_channels, &b, u, x, n_images, y, scratch, false, NULL);
}

void cf_conv_winograd_dx(const cf_conv_geom *g, int out_channels, const float *u_dx,
                         const float *dy, int n_images, float *dx, float *scratch) {
    const blocking b = block_of(g, out_channels, false);
    run(g, out_channels, g->c, &b, u_dx, dy, n_images, dx, scratch, false, NULL);
}

/* A bf16 pass (dx: the dx pass, out_channels -> g->c channels) through the pack u (another
 * level's packed form unpacked point by point into the scratch's unpack area). */
static void run_bf16(const cf_conv_geom *g, int out_channels, bool dx, const float *u,
                     const float *x, int n_images, float *y, float *scratch) {
    const bool bf16 = cf_bf16_compute();
    const blocking b = block_of(g, out_channels, bf16);
    const int cin = dx ? out_channels : g->c, cout = dx ? g->c : out_channels;
    run(g, cin, cout, &b, u, x, n_images, y, scratch, bf16, unpack_area(g, out_channels, scratch));
}

void cf_conv_winograd_forward_bf16(const cf_conv_geom *g, int out_channels, const float *u,
                                   const float *x, int n_images, float *y, float *scratch) {
    run_bf16(g, out_channels, false, u, x, n_images, y, scratch);
}

void cf_conv_winograd_dx_bf16(const cf_conv_geom *g, int out_channels, const float *u_dx,
                              const float *dy, int n_images, float *dx, float *scratch) {
    run_bf16(g, out_channels, true, u_dx, dy, n_images, dx, scratch);
}

/* Mg^T's tile pairs for the images [0, count) of dy's block dyb, rows [ty0, ty0 + rows): from
 * dy as it is where nchw (dy_pairs_nchw), else from its pixel-major copy dyt (dy_pairs). */
static void mg_pairs(const cf_wino_kernels *wk, bool nchw, const float *dyb, const float *dyt,
                     int K, int h, int w, int count, int ty0, int rows, uint32_t *mgp,
                     size_t mgp_xi, int ldm) {
    if (nchw)
        wk->dy_pairs_nchw(dyb, (size_t)K * h * w, K, h, w, count, ty0, rows, mgp, mgp_xi, ldm);
    else
        wk->dy_pairs(dyt, K, h, w, count, ty0, rows, mgp, mgp_xi, ldm);
}

/* The weight gradient in the transformed domain, its per-point products in bf16 or fp32. */
static void wgrad(const cf_conv_geom *g, int out_channels, const float *dy, const float *x,
                  int n_images, float *du, bool accumulate, float *scratch, bool bf16) {
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    const int C = g->c, K = out_channels, h = g->h, w = g->w;
    const blocking b = block_of(g, K, bf16);
    const size_t ld = b.ld, plane = (size_t)h * w;
    /* V as in the forward pass, [xi][c][t]; Mg^T [xi][t][k] from dy transposed image by image
     * (pixel-major), so that dU^T[xi] (C x K) = V[xi] (C x T) . Mg^T[xi] (T x K) reads both in
     * place, with the long sum over the tiles inside the register tiles */
    const size_t v_xi = point_stride((size_t)C * ld), mg_xi = point_stride((size_t)K * ld);
    float *v = scratch, *mgt = v + POINTS * v_xi, *dyt = mgt + POINTS * mg_xi;
    float *pad = dyt + (size_t)b.images * K * plane;
    /* In bf16, where the level has dy_pairs and gemm_paired: Mg^T rounded and paired over the
     * tiles as it is computed, read in place by the GEMM (V packed as its A per point, as
     * cf_sgemm_bf16 does): bitwise the same products in the same order, without Mg^T in fp32 */
    const cf_bf16_kernels *bk = cf_active_kernels->bf16;
    const size_t ldm = pairs_ld(round16((size_t)K)), mgp_xi = point_stride(ld / 2 * ldm);
    uint32_t *ap = NULL, *mgp = (uint32_t *)mgt;
#if defined(__x86_64__) /* the GEMMs' packing scratch: isa_avx512_bf16.c */
    if (bf16 && fused && wk->dy_pairs && bk && bk->gemm_paired && bk->gemm_pack_a &&
        bk->gemm_a_words && mgp_xi <= mg_xi)
        ap = cf__bf16_pack_scratch(bk->gemm_a_words(C, (int)ld));
#endif
    /* Where the level also has input_bf16 and gemm_rows: V rounded to bf16 as the transform
     * computes it, its rows of tiles read in place as rows of pairs by the GEMM instead of packed
     * per point (the same words: bitwise the same products). ldh: the row stride in bf16 values,
     * rows an odd number of cache lines apart. */
    const size_t ldh = (ld + 31) / 32 % 2 ? (ld + 31) / 32 * 32 : (ld + 31) / 32 * 32 + 32;
    /* vh_xi: the planes of bf16 values an odd number of lines apart, as point_stride's */
    const size_t vh_xi = 2 * point_stride(((size_t)C * ldh + 1) / 2);
    uint16_t *vh =
        ap && wk->input_bf16 && bk->gemm_rows && vh_xi <= 2 * v_xi ? (uint16_t *)v : NULL;
    /* Where the level has dy_pairs_nchw (rows of an even number of tiles): Mg^T's pairs from dy
     * as it is, transposed in L1-sized windows, instead of each image of dy copied pixel-major
     * (K x h w floats written, then read back) for dy_pairs: the same words */
    const bool nchw = ap && wk->dy_pairs_nchw && (w + 1) / 2 % 2 == 0;
    if (n_images <= 0 && !accumulate) memset(du, 0, POINTS * (size_t)K * C * sizeof(float));
    bool add = accumulate;
    for (int n0 = 0; n0 < n_images; n0 += b.images) {
        const int count = min_int(b.images, n_images - n0);
        const float *dyb = dy + (size_t)n0 * K * plane;
        for (int n = 0; n < count && !nchw; n++)
            cf_transpose(K, (int)plane, dyb + (size_t)n * K * plane, (ptrdiff_t)plane,
                         dyt + (size_t)n * K * plane, K);
        for (int ty0 = 0; ty0 < b.th; ty0 += b.rows) {
            const int rows = min_int(b.rows, b.th - ty0), cols = count * rows * b.tw;
            if (vh) {
                wk->input_bf16(x + (size_t)n0 * C * plane, C, h, w, count, C * plane, ty0, rows, vh,
                               vh_xi, (int)ldh, pad);
                if (cols % 2) /* the last pair's high half */
                    for (int xi = 0; xi < POINTS; xi++)
                        for (int c = 0; c < C; c++) vh[xi * vh_xi + (size_t)c * ldh + cols] = 0;
                mg_pairs(wk, nchw, dyb, dyt, K, h, w, count, ty0, rows, mgp, mgp_xi, (int)ldm);
                for (int xi = 0; xi < POINTS; xi++)
                    bk->gemm_rows(C, K, cols, (const uint32_t *)(vh + xi * vh_xi), ldh / 2,
                                  mgp + (size_t)xi * mgp_xi, ldm, du + (size_t)xi * K * C, K, add);
                add = true;
                continue;
            }
            wk->input(x + (size_t)n0 * C * plane, C, h, w, count, C * plane, ty0, rows, v, v_xi,
                      (int)ld, pad);
            if (ap) {
                mg_pairs(wk, nchw, dyb, dyt, K, h, w, count, ty0, rows, mgp, mgp_xi, (int)ldm);
                for (int xi = 0; xi < POINTS; xi++) {
                    bk->gemm_pack_a(false, C, cols, v + xi * v_xi, (int)ld, ap);
                    bk->gemm_paired(C, K, cols, ap, mgp + (size_t)xi * mgp_xi, ldm,
                                    du + (size_t)xi * K * C, K, add);
                }
                add = true;
                continue;
            }
            wk->dy_nhwc(dyt, K, h, w, count, ty0, rows, mgt, mg_xi);
            for (int xi = 0; xi < POINTS; xi++)
                if (bf16)
                    cf_sgemm_bf16(false, false, C, K, cols, v + xi * v_xi, (int)ld,
                                  mgt + xi * mg_xi, K, du + (size_t)xi * K * C, K, add);
                else
                    cf_sgemm_strided(C, K, cols, v + xi * v_xi, (ptrdiff_t)ld, 1, mgt + xi * mg_xi,
                                     K, du + (size_t)xi * K * C, K, add);
            add = true;
        }
    }
}

void cf_conv_winograd_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                            const float *x, int n_images, float *du, bool accumulate,
                            float *scratch) {
    wgrad(g, out_channels, dy, x, n_images, du, accumulate, scratch, false);
}

void cf_conv_winograd_wgrad_bf16(const cf_conv_geom *g, int out_channels, const float *dy,
                                 const float *x, int n_images, float *du, bool accumulate,
                                 float *scratch) {
    wgrad(g, out_channels, dy, x, n_images, du, accumulate, scratch, cf_bf16_compute());
}

/* wgrad, then dx, block of images by block (the blocks both take): dx's input transform reads the
 * block of dy that wgrad's transposition has just read, from the caches, instead of all of dy again
 * after the whole weight gradient. Bitwise the two calls: the same blocks, and the weight
 * gradient's sums in the same order. */
enum { BACKWARD_BLOCKS_MAX = 128 * 128 }; /* C K: 1 MiB of du in fp32 */

static void backward(const cf_conv_geom *g, int out_channels, const float *u_dx, const float *dy,
                     const float *x, int n_images, float *du, bool accumulate, float *dx,
                     float *scratch, bool bf16, float *area) {
    const blocking b = block_of(g, out_channels, bf16);
    const size_t x_image = (size_t)g->c * g->h * g->w, y_image = (size_t)out_channels * g->h * g->w;
    if (n_images <= 0) wgrad(g, out_channels, dy, x, n_images, du, accumulate, scratch, bf16);
    /* Many channels: each block's products stream all of du (16 C K floats) in wgrad and all of
     * the transformed weights in dx, 32 MiB in fp32 for 512 x 512 channels; taken in turns they
     * evicted each other from the caches (bench_conv's 512->512 4x4 fp32 backward 65-74 -> 86-91
     * ms, 256->256 8x8 bf16 26.8 -> 28.8), and there the calls one after the other. */
    if ((size_t)g->c * out_channels > BACKWARD_BLOCKS_MAX) {
        wgrad(g, out_channels, dy, x, n_images, du, accumulate, scratch, bf16);
        run(g, out_channels, g->c, &b, u_dx, dy, n_images, dx, scratch, bf16, area);
        return;
    }
    for (int n0 = 0; n0 < n_images; n0 += b.images) {
        const int count = min_int(b.images, n_images - n0);
        wgrad(g, out_channels, dy + n0 * y_image, x + n0 * x_image, count, du, accumulate || n0 > 0,
              scratch, bf16);
        run(g, out_channels, g->c, &b, u_dx, dy + n0 * y_image, count, dx + n0 * x_image, scratch,
            bf16, area);
    }
}

void cf_conv_winograd_backward(const cf_conv_geom *g, int out_channels, const float *u_dx,
                               const float *dy, const float *x, int n_images, float *du,
                               bool accumulate, float *dx, float *scratch) {
    backward(g, out_channels, u_dx, dy, x, n_images, du, accumulate, dx, scratch, false, NULL);
}

void cf_conv_winograd_backward_bf16(const cf_conv_geom *g, int out_channels, const float *u_dx,
                                    const float *dy, const float *x, int n_images, float *du,
                                    bool accumulate, float *dx, float *scratch) {
    /* the pack through the unpack area as cf_conv_winograd_dx_bf16 reads it (one made at another
     * level: its points unpacked) */
    backward(g, out_channels, u_dx, dy, x, n_images, du, accumulate, dx, scratch, cf_bf16_compute(),
             unpack_area(g, out_channels, scratch));
}

/* dw[k0 + l][c] += G^T dU G for the n lanes of output channels from k0 (du is [xi][c][k]). */
static inline __attribute__((always_inline)) void
wgrad_add_n(const float *du, size_t plane, int C, int K, int k0, int c, int n, float *dw) {
    float d[POINTS][LANES], b[3][4][LANES], o[9][LANES];
    for (int xi = 0; xi < POINTS; xi++)
        memcpy(d[xi], du + xi * plane + (size_t)c * K + k0, (size_t)n * sizeof(float));
    /* G^T dU: rows d0 + (d1 + d2)/2, (d1 - d2)/2, (d1 + d2)/2 + d3 */
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < n; l++) {
            b[0][j][l] = d[j][l] + 0.5f * (d[4 + j][l] + d[8 + j][l]);
            b[1][j][l] = 0.5f * (d[4 + j][l] - d[8 + j][l]);
            b[2][j][l] = 0.5f * (d[4 + j][l] + d[8 + j][l]) + d[12 + j][l];
        }
    for (int r = 0; r < 3; r++) /* then G on the right, the same over the columns */
        for (int l = 0; l < n; l++) {
            o[3 * r][l] = b[r][0][l] + 0.5f * (b[r][1][l] + b[r][2][l]);
            o[3 * r + 1][l] = 0.5f * (b[r][1][l] - b[r][2][l]);
            o[3 * r + 2][l] = 0.5f * (b[r][1][l] + b[r][2][l]) + b[r][3][l];
        }
    for (int l = 0; l < n; l++) { /* (K, C, 3, 3) */
        float *out = dw + ((size_t)(k0 + l) * C + c) * 9;
        for (int t = 0; t < 9; t++) out[t] += o[t][l];
    }
}

void cf_conv_winograd_wgrad_add(const cf_conv_geom *g, int out_channels, const float *du,
                                float *dw) {
    /* lanes over the output channels, the input channels outside: each plane's row of a channel
     * is read from start to end (16 sequential streams). With the output channels outside, the
     * planes were read a line at a time 4 C bytes apart (16 strided streams): 6.3 ms a call on 512
     * x 512 channels, from DRAM, against 0.53 on 256 x 256. The same sums, each value of dw added
     * once: bitwise either way. */
    const int C = g->c, K = out_channels;
    const size_t plane = (size_t)K * C;
    for (int c = 0; c < C; c++)
        for (int k0 = 0; k0 < K; k0 += LANES) {
            const int n = min_int(LANES, K - k0);
            if (n == LANES)
                wgrad_add_n(du, plane, C, K, k0, c, LANES, dw);
            else
                wgrad_add_n(du, plane, C, K, k0, c, n, dw);
        }
}
