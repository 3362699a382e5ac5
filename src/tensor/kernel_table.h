/* The kernel table: the hot kernels of the tensor layer, one table per instruction set
 * (isa_generic.c, isa_avx2.c, isa_avx512.c, isa_neon.c), the best one the CPU supports chosen
 * once when the library is loaded (capped by CF_ISA or cf_set_isa). Entries a table leaves
 * NULL, and entries that return false for a shape, fall back to the portable code in kernels.c
 * and conv_implicit.c. Private to the tensor layer: layers above call the cf_ functions of
 * corefit/tensor.h, which read the table, and never test an instruction set themselves. */
#ifndef COREFIT_KERNEL_TABLE_H
#define COREFIT_KERNEL_TABLE_H

#include "corefit/tensor.h"

#include <stdint.h>

/* ---- sliding-window geometry shared by the tables ------------------------------------------ */

/* The output columns [lo, hi) whose input column ox*sw - pw + j lies inside [0, w). */
static inline void cf_conv_valid_cols(const cf_conv_geom *g, int j, int *lo, int *hi) {
    int first = g->pw - j; /* ox*sw >= first */
    int l = first > 0 ? (first + g->sw - 1) / g->sw : 0;
    int last = g->w - 1 + g->pw - j; /* ox*sw <= last */
    int h = last < 0 ? 0 : last / g->sw + 1;
    if (h > g->ow) h = g->ow;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* The output rows [lo, hi) whose input row oy*sh - ph + i lies inside [0, h). */
static inline void cf_conv_valid_rows(const cf_conv_geom *g, int i, int *lo, int *hi) {
    int first = g->ph - i;
    int l = first > 0 ? (first + g->sh - 1) / g->sh : 0;
    int last = g->h - 1 + g->ph - i;
    int h = last < 0 ? 0 : last / g->sh + 1;
    if (h > g->oh) h = g->oh;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* ---- the direct stem's lane masks (cf_conv_stem_*) ----------------------------------------- */

/* masks[v * 9 + t]: bit l set when flat position p = v * vl + l (< h * w) reads inside the image
 * at tap t = ky * 3 + kx of a 3x3 stride-1 layer with padding 1, for v < ceil(h * w / vl). */
static inline void cf_stem_masks(const cf_conv_geom *g, int vl, unsigned *masks) {
    const int P = g->h * g->w, nv = (P + vl - 1) / vl;
    for (int v = 0, oy = 0, ox = 0; v < nv; v++) {         /* (oy, ox): position v * vl + l */
        unsigned rows[3] = {0, 0, 0}, cols[3] = {0, 0, 0}; /* lanes whose row (column) ky is in */
        for (int l = 0; l < vl && v * vl + l < P; l++) {
            const unsigned bit = 1u << l;
            rows[0] |= oy > 0 ? bit : 0u, rows[1] |= bit, rows[2] |= oy < g->h - 1 ? bit : 0u;
            cols[0] |= ox > 0 ? bit : 0u, cols[1] |= bit, cols[2] |= ox < g->w - 1 ? bit : 0u;
            if (++ox == g->w) ox = 0, oy++;
        }
        for (int t = 0; t < 9; t++) masks[v * 9 + t] = rows[t / 3] & cols[t % 3];
    }
}

/* ---- the implicit convolutions' tap lists (ISA-independent, built by conv_implicit.c) ----- */

#define CF_TAPS_ROW_BYTES ((CF_IMPLICIT_MAX_PLANE + 16) / 8 + 8)
#define CF_PACK_ROWS 8 /* output rows per packed weight block; every table's tile divides it */

/* The taps of one kernel call: per tap, the offset of its shifted plane from an image's start
 * and the validity bits (bit p set when output position p reads inside the plane; rows padded
 * with zero bytes so that 32 bits can be read at any p < plane). */
typedef struct cf_implicit_taps {
    int n, plane;
    ptrdiff_t offset[CF_IMPLICIT_MAX_TAPS];
    unsigned char valid[CF_IMPLICIT_MAX_TAPS][CF_TAPS_ROW_BYTES];
} cf_implicit_taps;

/* BatchNorm over one channel plane of s values. The statistics take one pass: sums of d = x - k
 * and d^2 with k the channel's first value (the shifted-data algorithm: exact in exact
 * arithmetic, and accurate while k lies within a few deviations of the mean, which the first
 * value of a channel does), var = E[d^2] - E[d]^2; lanes are summed into double at the end of
 * the plane. A fused ReLU's mask is recomputed in backward from x * scale + shift exactly as the
 * forward computed it, so results are bitwise those of BatchNorm then ReLU. */
typedef struct cf_bn_kernels {
    /* s1 = sum(x - k), s2 = sum((x - k)^2) */
    void (*shifted_sums)(const float *x, int64_t s, float k, double *s1, double *s2);
    /* y = x * scale + shift; relu: max(y, 0); add (not NULL): max(add + y, 0) */
    void (*affine)(const float *x, const float *add, float *y, int64_t s, float scale, float shift,
                   bool relu);
    /* sdy += sum(g), sdyx += sum(g * (x - mean)), g = dy, or with relu dy where
     * x * scale + shift > 0 and 0 elsewhere */
    void (*dy_sums)(const float *dy, const float *x, int64_t s, float mean, bool relu, float scale,
                    float shift, double *sdy, double *sdyx);
    /* dx = k1 * g + k2 * (x - mean) + k3 (g as in dy_sums) */
    void (*dx)(const float *dy, const float *x, float *dx, int64_t s, float mean, float k1,
               float k2, float k3, bool relu, float scale, float shift);
    /* Up to CF_BN_PLANES planes at once, each exactly as its one-plane kernel above (the same
     * lanes and order), into s1[i], s2[i] / sdy[i], sdyx[i] (set: sdy[i] is what dy_sums adds
     * to *sdy): the planes' sums are independent chains of additions, so interleaving them hides
     * the adds' latency, which bounds one plane. NULL: the one-plane kernels, one at a time. */
    void (*shifted_sums_n)(int np, const float *const *x, int64_t s, const float *k, double *s1,
                           double *s2);
    void (*dy_sums_n)(int np, const float *const *dy, const float *const *x, int64_t s,
                      const float *mean, bool relu, const float *scale, const float *shift,
                      double *sdy, double *sdyx);
    /* affine and dx over nc consecutive planes of s values (x + i * s, ...), plane i with its
     * channel's scale[i], shift[i] (and mean[i], k1[i], k2[i], k3[i]): one call for a sample's
     * block of channels, where one call per plane costs as much as a small plane's work.
     * Element-wise, so bitwise the one-plane kernels'. ahead (not 0): before each plane, its
     * plane `ahead` floats on in y / dx (for writing) and add is prefetched into L1, the next
     * sample's as the one-plane passes did beside each call. stream (affine_n): y's whole
     * vectors are written with non-temporal stores where the set has them (the values are the
     * same; y's lines are not read in before they are written), fenced before the call returns;
     * y is then not prefetched. NULL: the one-plane kernels. */
    void (*affine_n)(const float *x, const float *add, float *y, int64_t s, int nc,
                     const float *scale, const float *shift, bool relu, ptrdiff_t ahead,
                     bool stream);
    void (*dx_n)(const float *dy, const float *x, float *dx, int64_t s, int nc, const float *mean,
                 const float *k1, const float *k2, const float *k3, bool relu, const float *scale,
                 const float *shift, ptrdiff_t ahead);
    /* NULL: dx a chunk at a time, then cf_fp32_to_bf16 (cf_bn_planes_dx_bf16). dx_n writing the
     * bf16 words of its values instead (dxh, ahead in values as there): each vector rounded as it
     * is computed (round to nearest even, subnormals kept, a NaN quiet: cf_fp32_to_bf16's
     * words), no fp32 written. */
    void (*dx_bf16_n)(const float *dy, const float *x, uint16_t *dxh, int64_t s, int nc,
                      const float *mean, const float *k1, const float *k2, const float *k3,
                      bool relu, const float *scale, const float *shift, ptrdiff_t ahead);
    /* NULL: x2's plane through affine into a buffer, then affine with it as add. y =
     * max((x2 * scale2 + shift2) + (x * scale + shift), 0) over nc planes (the residual fold
     * computing the other BatchNorm's output in registers), bitwise those two affine calls;
     * ahead as affine_n's, for y and x2. */
    void (*affine_add2_n)(const float *x, const float *x2, float *y, int64_t s, int nc,
                          const float *scale, const float *shift, const float *scale2,
                          const float *shift2, ptrdiff_t ahead);
    /* NULL: affine a chunk at a time, then cf_fp32_to_bf16. affine_n without add writing the
     * bf16 words of its values (yh, ahead in values), each vector rounded as it is computed
     * (cf_fp32_to_bf16's words), no fp32 written. */
    void (*affine_bf16_n)(const float *x, uint16_t *yh, int64_t s, int nc, const float *scale,
                          const float *shift, bool relu, ptrdiff_t ahead);
    /* A residual block's ReLU mask as bits (CF_MASK_WORDS layout, tensor.h). Required in a table
     * with BatchNorm kernels. fold_mask_n: affine_n's add branch (x2 NULL) or affine_add2_n (x2
     * not NULL, add unused), bitwise, and each value's bit y > 0 into mask (plane i's words at
     * mask + i * CF_MASK_WORDS(s), the bits past s zero). dy_sums_mask_n and dx_mask_n:
     * dy_sums_n (setting sdy[i], sdyx[i]) and dx_n without relu with g = dy where the plane's bit
     * is set and +0 elsewhere (bitwise those kernels given that masked gradient). dx_mask_bf16_n
     * as dx_bf16_n (NULL: through fp32 a chunk at a time). */
    void (*fold_mask_n)(const float *x, const float *add, const float *x2, float *y, int64_t s,
                        int nc, const float *scale, const float *shift, const float *scale2,
                        const float *shift2, uint16_t *mask, ptrdiff_t ahead);
    void (*dy_sums_mask_n)(int np, const float *const *dy, const float *const *x, int64_t s,
                           const float *mean, const uint16_t *const *mask, double *sdy,
                           double *sdyx);
    void (*dx_mask_n)(const float *dy, const float *x, float *dx, int64_t s, int nc,
                      const float *mean, const float *k1, const float *k2, const float *k3,
                      const uint16_t *mask, ptrdiff_t ahead);
    void (*dx_mask_bf16_n)(const float *dy, const float *x, uint16_t *dxh, int64_t s, int nc,
                           const float *mean, const float *k1, const float *k2, const float *k3,
                           const uint16_t *mask, ptrdiff_t ahead);
    /* NULL: fold_mask_n a chunk at a time, then cf_fp32_to_bf16. fold_mask_n writing the bf16
     * words of its values (yh, ahead in values), each vector rounded as it is computed
     * (cf_fp32_to_bf16's words), and the same mask bits; no fp32 written. */
    void (*fold_mask_bf16_n)(const float *x, const float *add, const float *x2, uint16_t *yh,
                             int64_t s, int nc, const float *scale, const float *shift,
                             const float *scale2, const float *shift2, uint16_t *mask,
                             ptrdiff_t ahead);
} cf_bn_kernels;

typedef struct cf_optim_kernels {
    void (*sgd)(const cf_opt_update *u, float *w, const float *g, float *grad_avg, size_t n);
    void (*adam)(const cf_opt_update *u, float *w, const float *g, float *grad_avg, float *sqr_avg,
                 size_t n);
} cf_optim_kernels;

/* The transforms of the Winograd F(2x2, 3x3) convolutions (winograd.c; layouts in
 * winograd_loops.h). pad: cf_wino_pad_floats(h, w) floats of scratch. */
typedef struct cf_wino_kernels {
    /* Winograd pays on image rows of fewer than 14 tiles only when
     * C * K * row >= short_row_cost * (C + K) (cf_conv_winograd_pays; measured per table) */
    int short_row_cost;
    /* V = B^T d B of the 4x4 input patches of the tile rows [ty0, ty0 + th) of n_images images
     * of `channels` planes */
    void (*input)(const float *x, int channels, int h, int w, int n_images, size_t x_image, int ty0,
                  int th, float *v, size_t v_xi, int ldv, float *pad);
    /* Y = A^T M A into those tile rows of n_images images of `channels` planes */
    void (*output)(const float *m, size_t m_xi, int ldm, int channels, int h, int w, int n_images,
                   int ty0, int th, float *y, size_t y_image);
    /* Mg^T = (A dY A^T)^T of those tile rows, tile-major (element (xi, t, k) at m + xi * m_xi +
     * t * channels + k), from the output gradient in pixel-major order (pixel p of image n,
     * channel k at dyt + (n*h*w + p) * channels + k) */
    void (*dy_nhwc)(const float *dyt, int channels, int h, int w, int n_images, int ty0, int th,
                    float *m, size_t m_xi);
    /* NULL where the table has none: V as `input` computes it, rounded to bf16 (as
     * cf_fp32_to_bf16) and paired over the channels for cf_bf16_kernels.gemm_paired: the word of
     * point xi, channel pair p, tile t at v + xi * v_xi + p * ldv + t is bf16(V(xi, 2p, t)) |
     * bf16(V(xi, 2p + 1, t)) << 16, 0 in the high half past `channels` */
    void (*input_pairs)(const float *x, int channels, int h, int w, int n_images, size_t x_image,
                        int ty0, int th, uint32_t *v, size_t v_xi, int ldv, float *pad);
    /* NULL where the table has none: Mg^T as dy_nhwc computes it, rounded the same way and paired
     * over the tiles: the word of point xi, tile pair q, channel k at m + xi * m_xi + q * ldm + k
     * is bf16(Mg(xi, 2q, k)) | bf16(Mg(xi, 2q + 1, k)) << 16, 0 in the high half past the call's
     * tiles */
    void (*dy_pairs)(const float *dyt, int channels, int h, int w, int n_images, int ty0, int th,
                     uint32_t *m, size_t m_xi, int ldm);
    /* NULL where the table has none: V as `input` computes it, rounded the same way and stored as
     * bf16 in input's layout (element (xi, c, t) at v + xi * v_xi + c * ldv + t, 16-bit): with
     * v_xi and ldv even, row c's tiles 2q and 2q + 1 form the word q of a row of pairs over the
     * tiles, the A of cf_bf16_kernels.gemm_rows (the weight gradient's products) */
    void (*input_bf16)(const float *x, int channels, int h, int w, int n_images, size_t x_image,
                       int ty0, int th, uint16_t *v, size_t v_xi, int ldv, float *pad);
    /* NULL where the table has none: dy_pairs's words from the output gradient as the layer
     * holds it (image n, channel k at dy + n * dy_image + k * h * w) instead of a pixel-major
     * copy; only for rows of an even number of tiles ((w + 1) / 2 even), so that no tile pair
     * crosses a tile row */
    void (*dy_pairs_nchw)(const float *dy, size_t dy_image, int channels, int h, int w,
                          int n_images, int ty0, int th, uint32_t *m, size_t m_xi, int ldm);
} cf_wino_kernels;

/* One LSTM step over the n cells of one row (cf_lstm_cell_forward and cf_lstm_cell_backward in
 * corefit/tensor.h). dh_rec is never NULL here. */
typedef struct cf_lstm_kernels {
    void (*cell)(int n, float *gates, const float *c_prev, float *c, float *h);
    void (*cell_backward)(int n, float *gates, const float *c_prev, const float *c,
                          const float *dh_out, const float *dh_rec, float *dc);
} cf_lstm_kernels;

/* The softmax's reductions over n >= 1 contiguous floats (cf_row_max and cf_exp_shift_sum in
 * corefit/tensor.h; the loops are tensor/softmax_loops.h). */
typedef struct cf_softmax_kernels {
    float (*row_max)(int n, const float *x);
    double (*exp_shift_sum)(int n, const float *x, float shift, float *y);
} cf_softmax_kernels;

/* grid_sample's bilinear taps and gathers (cf_grid_sample_taps and cf_grid_sample_gather in
 * corefit/tensor.h; the loops are tensor/grid_sample_loops.h). */
typedef struct cf_grid_sample_kernels {
    void (*taps)(const float mat[2][3], const double *warp, int pad, int h, int w, int i, int j0,
                 int n, int32_t *idx, float *wt);
    void (*gather)(int n, const int32_t *idx, const float *wt, const float *src, float *out);
} cf_grid_sample_kernels;

/* Products on a packed B operand (cf_sgemm_packed in corefit/tensor.h; the loops are
 * tensor/lstm_gemm_loops.h): run is C (+)= A op(B) with op(B) packed in panels of nr columns. */
typedef struct cf_packed_gemm_kernels {
    int nr;
    void (*run)(int m, int n, int k, const float *a, int lda, const float *packed, float *c,
                int ldc, bool accumulate);
} cf_packed_gemm_kernels;

static inline size_t cf_wino_pad_floats(int h, int w) {
    /* two split planes: eight arrays of (th + 1) * tw floats and a vector of slack (any
     * table's vector length up to 16), and the slack of the last row's vector */
    const size_t th = (size_t)(h + 1) / 2, tw = (size_t)(w + 1) / 2;
    return 2 * (8 * ((th + 1) * tw + 16) + 16);
}

/* The bfloat16 kernels of a level that has them (isa_avx512_bf16.c); see bf16.c. */
typedef struct cf_bf16_kernels {
    /* y = bf16(x), round to nearest even as cf_fp32_to_bf16 */
    void (*from_fp32)(const float *x, uint16_t *y, size_t n);
    /* as cf_sgemm_bf16 (m, n, k > 0); false (out of memory): left to fp32 */
    bool (*gemm)(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                 const float *b, int ldb, float *c, int ldc, bool accumulate);
    /* The GEMM with op(A) packed once for several products (the Winograd convolutions' weights;
     * NULL: none, cf_sgemm_bf16 per product): gemm_a_words(m, k) words for gemm_pack_a;
     * gemm_packed(m, n, k, packed_a, ...) is gemm with that A, bitwise (m, n, k > 0); false: out
     * of memory. */
    size_t (*gemm_a_words)(int m, int k);
    void (*gemm_pack_a)(bool trans_a, int m, int k, const float *a, int lda, uint32_t *packed);
    bool (*gemm_packed)(int m, int n, int k, const uint32_t *packed_a, bool trans_b, const float *b,
                        int ldb, float *c, int ldc, bool accumulate);
    /* NULL: none. gemm_packed with B (k x n) given already rounded and paired over k: the word
     * of pair q, column j at b[q * ldb + j] is bf16(B(2q, j)) | bf16(B(2q + 1, j)) << 16 (0 in
     * the high half past k), readable up to the next multiple of 16 columns (the values there are
     * never stored). Bitwise gemm_packed on the same values; no scratch. */
    void (*gemm_paired)(int m, int n, int k, const uint32_t *packed_a, const uint32_t *b,
                        size_t ldb, float *c, int ldc, bool accumulate);
    /* The implicit bf16 convolution's kernels (conv_bf16.c; NULL: none). pairs: out[i] =
     * bf16(lo[i]) | bf16(hi[i]) << 16, i < n (hi NULL: zero). conv_run: out[r * ldo + q] = sum
     * over taps t < taps and channel pairs p < pairs of dot(weight pair (r, t, p), x[p * plane +
     * q + off[t]]), r in whole blocks of 8 rows (packed [block][tap][pair][8]), q < nq (a
     * multiple of 16). conv_wgrad: out[t * tapo + r * ldo + c] (+)= sum over q < nq2 of
     * dot(a[r * lda + q], (odd[t] ? b1 : b0)[(q + half[t]) * ldb + c]), r < m (a in whole
     * blocks of 8 rows), c < ch (ldb a multiple of 16, zero past ch). */
    void (*pairs)(const float *lo, const float *hi, uint32_t *out, int n);
    void (*conv_run)(int taps, const int *off, int pairs, int m, const uint32_t *packed,
                     const uint32_t *x, size_t plane, int nq, float *out, size_t ldo);
    void (*conv_wgrad)(int taps, const int *half, const unsigned char *odd, int m, int ch, int nq2,
                       const uint32_t *a, size_t lda, const uint32_t *b0, const uint32_t *b1,
                       size_t ldb, float *out, size_t ldo, size_t tapo, bool accumulate);
    /* The convolution's layouts, converting as they copy (rows: a plane's h rows of w into rows
     * ldy apart; pairs_rows: the same of pairs; deal and deal_pairs: h rows' even and odd
     * values to two row sets; interleave: the inverse of deal, in fp32; position_pairs: dW's X0 and
     * X1 from bf16 rows, see isa_avx512_bf16.c). */
    void (*rows)(const float *x, int h, int w, uint16_t *y, size_t ldy);
    void (*pairs_rows)(const float *lo, const float *hi, int h, int w, uint32_t *out, size_t ldo);
    void (*deal)(const float *x, size_t ldx, int h, int n, uint16_t *e, uint16_t *o, size_t ld);
    void (*deal_pairs)(const float *lo, const float *hi, size_t ldx, int h, int n, uint32_t *e,
                       uint32_t *o, size_t ld);
    void (*interleave)(const float *a, const float *b, int n, float *out);
    void (*position_pairs)(const uint16_t *x, size_t lx, int ch, int rows, uint32_t *x0,
                           uint32_t *x1, size_t ldb);
    void (*add_even)(const float *a, int n, float *out);
    void (*copy_rows)(const float *src, size_t lds, int h, int w, float *dst);
    /* NULL: conv_run reads the packed weights as written ([block of 8 rows][tap][pair][8]).
     * Else cf_conv_bf16_pack calls it on each block of weights it packs (taps, pairs, m rows;
     * tmp: 16 * taps * pairs words) to put the words in this level's own order, the same size
     * (the AMX level's tile rows, amx_tiles.h): a pack is for the level active when it is made. */
    void (*conv_order)(uint32_t *packed, int taps, int pairs, int m, uint32_t *tmp);
    /* out[i * ldo + j] = lo[i * ldi + j] | hi[i * ldi + j] << 16, i < h, j < w: two channels' bf16
     * rows paired, already rounded (the convolution's dx from the weight gradient's rows of dy;
     * NULL: no implicit bf16 convolution, as for the kernels above). */
    void (*halves_rows)(const uint16_t *lo, const uint16_t *hi, size_t ldi, int h, int w,
                        uint32_t *out, size_t ldo);
    /* NULL: none. gemm_paired with A (m x k) given as rows of pairs over k instead of packed: the
     * word of row r, pair q at a[r * lda + q] is bf16(A(r, 2q)) | bf16(A(r, 2q + 1)) << 16 (0 in
     * the high half past k). Bitwise gemm_paired on the same values; no scratch. */
    void (*gemm_rows)(int m, int n, int k, const uint32_t *a, size_t lda, const uint32_t *b,
                      size_t ldb, float *c, int ldc, bool accumulate);
    /* The stride-2 stem's kernels (conv_stem_bf16.c; NULL: none). conv_rows: conv_run over h rows
     * of w positions, row i's positions ldx words apart in x, stored as dense rows: out[r * ldo +
     * i * w + j] = the sum over taps t and pairs p of dot(weight pair (r, t, p), x[p * plane + i *
     * ldx + j + off[t]]) for r < m (packed as conv_run writes them, whatever conv_order), i < h,
     * j < w, each sum in conv_run's order (bitwise conv_run's value); reads x at j < up(w, 16).
     * Rows of whole lines (w and ldo multiples of 16, out on a 64-byte line) are written with
     * streaming stores, fenced before it returns. stem_pairs: dW's position pairs of one output
     * row, b[q * ldb + t * k + kx] = x[off[t] + 4 q + kx] | x[off[t] + 4 q + kx + 2] << 16 for
     * q < nq, t < taps, kx < k <= 14 (16-bit x: the padded rows of a tap at the row's first
     * position). */
    void (*conv_rows)(int taps, const int *off, int pairs, int m, const uint32_t *packed,
                      const uint32_t *x, size_t plane, size_t ldx, int h, int w, float *out,
                      size_t ldo);
    void (*stem_pairs)(const uint16_t *x, const int *off, int taps, int k, int nq, uint32_t *b,
                       size_t ldb);
    /* NULL: none (then gemm_pack_a only). A packed piece by piece, and back (the Winograd
     * weights, packed without a whole fp32 copy). gemm_pack_a_rows: rows [r0, r0 + nr) of A (m x
     * k; row r at a + (r - r0) * lda) into the packed A ap of the whole matrix, the words
     * gemm_pack_a(false, m, k, ...) writes for those rows (bitwise); r0 a multiple of 16, nr too
     * unless r0 + nr = m. gemm_unpack_a: A (m x k) from ap packed by this level, as fp32 (its bf16
     * values, exact), row r at a + r * lda. */
    void (*gemm_pack_a_rows)(int m, int k, int r0, int nr, const float *a, int lda, uint32_t *ap);
    void (*gemm_unpack_a)(int m, int k, const uint32_t *ap, float *a, int lda);
    /* NULL: none. The Winograd F(2x2, 3x3) weight transform straight into the 16 points' packed
     * A (winograd.c's bf16 packs): rows [r0, r0 + 16) of each point's matrix (m x k; r0 a
     * multiple of 16), the kernel of row r0 + i, column j at w + 9 i + j js (each column's 16
     * kernels side by side), its tap t at [t], or [8 - t] when flipped; point xi packed at ap +
     * xi * point_words, the words gemm_pack_a(false, m, k, ...) makes from the fp32 matrices
     * (bitwise: the same operations in the same order as winograd.c's transform). */
    void (*wino_pack_a)(const float *w, size_t js, bool flip, int m, int k, int r0, uint32_t *ap,
                        size_t point_words);
    /* NULL: no bf16 implicit convolutions (cf_conv_bf16_supported requires it: stride 2's dx
     * has no row-by-row fallback). h rows of interleave: out[i * ldo + j] = (j even ? a : b)[i *
     * lds + j / 2] for i < h, j < n (b NULL: zero; stride 2's dx, a row parity of a channel). */
    void (*interleave_rows)(const float *a, const float *b, size_t lds, int h, int n, float *out,
                            size_t ldo);
    /* NULL: none (conv_run, then copy_rows). The forward over output positions, into planes,
     * of n_images images (image b's pair planes from x + b * ldimg, its output planes from out +
     * b * ldoimg): out[r * ldo + i * w + j] = the sum over taps t and pairs p of dot(weight pair
     * (r, t, p), x[p * plane + i * ldx + j + off[t]]) for r < m (17 to 64), i < h, j < w, each
     * sum in conv_run's order (bitwise conv_run's value); the weights as columns, pair (r, t, p)
     * at w[(t * pairs + p) * up(m, 16) + r], zero past m. Positions go in tiles of np = 12, 8 or
     * 6 (m up to 32, 48, 64), or of w (a row) where w is below that np (w >= 6), in row-major order
     * over the images, so the last tile may read up to np - 1 positions past the last image: in the
     * next image's slot (x + n_images * ldimg, its first row and taps), which the caller keeps
     * readable; tmp: up(n_images * h * w, np) * up(m, 16) floats. next (NULL: none): next_bytes
     * that the caller reads next (the next images' input), prefetched towards L2 as the tiles
     * compute (a hint); out's lines of each tile's positions are fetched for writing as the tile
     * starts (cf__conv_bf16_set_cols_prefetch). out NULL (at a level with cols_spread): nothing
     * stored, the sums left in tmp, position q of the call (q = (b * h + i) * w + j) at
     * tmp[q * up(m, 16) + r]. */
    void (*conv_cols)(int taps, const int *off, int pairs, int m, const uint32_t *w,
                      const uint32_t *x, size_t plane, size_t ldx, size_t ldimg, int h, int wd,
                      int n_images, float *out, size_t ldo, size_t ldoimg, float *tmp,
                      const void *next, size_t next_bytes);
    /* NULL: none (then pairs_rows and deal_pairs). The same words as pairs_rows and deal_pairs
     * (bitwise), faster where the level has conversion instructions: wherever conv_bf16.c makes
     * pair planes (the forward's input pairs, dx's dy pairs). */
    void (*fwd_pairs_rows)(const float *lo, const float *hi, int h, int w, uint32_t *out,
                           size_t ldo);
    void (*fwd_deal_pairs)(const float *lo, const float *hi, size_t ldx, int h, int n, uint32_t *e,
                           uint32_t *o, size_t ld);
    /* NULL: none (conv_wgrad over every pair). conv_wgrad with the sum over q restricted to
     * the runs q = n * istep + run_at[j] + i, i < run_len[j], n < images, j < runs (increasing,
     * within istep), each sum's products added in q's order: bitwise conv_wgrad over images *
     * istep pairs where the pairs left out have zero words of a (the weight gradient's dy
     * pairs that lie wholly in pad rows or dropped columns), for finite b (zero times an
     * infinity would have made the sum NaN). A level with its own conv_wgrad (amx) sets it NULL. */
    void (*conv_wgrad_runs)(int taps, const int *half, const unsigned char *odd, int m, int ch,
                            int images, int istep, int runs, const int *run_at, const int *run_len,
                            const uint32_t *a, size_t lda, const uint32_t *b0, const uint32_t *b1,
                            size_t ldb, float *out, size_t ldo, size_t tapo, bool accumulate);
    /* NULL: none (deal's even values). y[i * ldy + j] = bf16(x[i * ldx + 2 j]), i < h, j < n
     * (bitwise deal's e). */
    void (*even_rows)(const float *x, size_t ldx, int h, int n, uint16_t *y, size_t ldy);
    /* NULL: none. rows and deal (bitwise), faster: on the conversion instructions where the
     * level has them, two rows per vector where they are short (rows_short: at most 16 values,
     * deal_short: at most 16; the weight gradient's rows of x and dy). */
    void (*rows_short)(const float *x, int h, int w, uint16_t *y, size_t ldy);
    void (*deal_short)(const float *x, size_t ldx, int h, int n, uint16_t *e, uint16_t *o,
                       size_t ld);
    /* NULL: none (the weight gradient rounds x from fp32). rows and deal of x already in bf16
     * (the forward's kept copy of its input, cf_conv_bf16_forward_keep): the same places, the
     * words copied, so bitwise rows' and deal's of the fp32 values they were rounded from. */
    void (*rows_h)(const uint16_t *x, int h, int w, uint16_t *y, size_t ldy);
    void (*deal_h)(const uint16_t *x, size_t ldx, int h, int n, uint16_t *e, uint16_t *o,
                   size_t ld);
    /* NULL: from_fp32. from_fp32's words (bitwise) written past the caches where the level
     * can (streaming stores): the forward's kept words of x, which the backward reads long
     * after (a plain store would first bring each line in from memory). */
    void (*keep_words)(const float *x, uint16_t *y, size_t n);
    /* NULL: none (deal_h twice, interleave_rows twice). Stride 2's layouts of a whole plane in
     * one pass, its rows in order, two rows per vector where they are short (w, n <= 16):
     * deal2_h: deal_h of the even rows (x's rows 0, 2, ... to e0 and o0) and of the odd rows
     * (rows 1, 3, ... to e1 and o1), row r's values to (e or o)[r % 2] + (r / 2) * ld, of an
     * h x w plane of bf16 words (bitwise the two deal_h calls; o0 and o1 not NULL).
     * interleave2_rows: interleave_rows of dx's even rows (from a0 and b0) and odd rows (a1,
     * b1), row r of the h x n plane out (rows n apart) from (a, b)[r % 2] + (r / 2) * lds
     * (bitwise the two interleave_rows calls; b0 and b1 not NULL). */
    void (*deal2_h)(const uint16_t *x, int h, int w, uint16_t *e0, uint16_t *o0, uint16_t *e1,
                    uint16_t *o1, size_t ld);
    void (*interleave2_rows)(const float *a0, const float *b0, const float *a1, const float *b1,
                             size_t lds, int h, int n, float *out);
    /* NULL: none (stride 2's forward does not run from bf16 words). deal_pairs of two channels'
     * rows already in bf16 (hi not NULL): e[i * ld + j] = lo[i * ldx + 2 j] | hi[i * ldx + 2 j]
     * << 16 and o[i * ld + j] the same of the odd values (o NULL: the even ones alone), i < h,
     * 2 j (+ 1) < n: the words copied, so bitwise deal_pairs of the values they were rounded
     * from (the forward link's words into a stride-2 layer's phase planes). */
    void (*deal_pairs_h)(const uint16_t *lo, const uint16_t *hi, size_t ldx, int h, int n,
                         uint32_t *e, uint32_t *o, size_t ld);
    /* NULL: none (conv_run into phase planes, then interleave2_rows). Two phases of stride 2's
     * dx straight into dx's rows: phase f (0: the even places, 1: the odd ones) has taps[f]
     * offsets off[f] and weights packed[f] (conv_run's packing); its value at row r < m, phase
     * row i < h, column j is conv_rows' sum (bitwise conv_run's) over x[p * plane + i * ldx + j +
     * off[f][t]], plus add[f][r * lda + i * ldx + j] where add[f] is not NULL, stored at
     * out[r * ldo + i * ldr + 2 j + f] for 2 j + f < n (out's lines fetched for writing as
     * each tile starts, a hint). Reads x at j < up((n + 1) / 2, 16). A level whose conv_run sums
     * otherwise (amx) sets it NULL. */
    void (*conv_spread)(const int taps[2], const int *const off[2], const uint32_t *packed[2],
                        int pairs, int m, const uint32_t *x, size_t plane, size_t ldx, int h, int n,
                        const float *const add[2], size_t lda, float *out, size_t ldo, size_t ldr);
    /* NULL: none (conv_cols into dense phase planes, then interleave2_rows). Two phases of stride
     * 2's dx as conv_cols leaves their sums in tmp (out NULL) straight into dx's rows: phase f's
     * value at row r < m, image b, phase row i < h, column j is t[f][q * ldt + r] (q = (b * h +
     * i) * up(n, 2) / 2 + j), plus add[f] at the same place where add[f] is not NULL, stored at
     * out[b * ldoimg + r * ldo + i * ldr + 2 j + f] for 2 j + f < n: bitwise conv_cols' planes
     * interleaved (the same fp32 add). Reads up(m, 16) values at each place. */
    void (*cols_spread)(const float *const t[2], const float *const add[2], size_t ldt, int m,
                        int h, int n, int n_images, float *out, size_t ldo, size_t ldr,
                        size_t ldoimg);
} cf_bf16_kernels;

/* Whether the bf16 Winograd convolutions convert their transformed input as they compute it
 * (cf_wino_kernels.input_pairs and cf_bf16_kernels.gemm_paired, where the level has both; on by
 * default) rather than in the GEMM's packing: for tests, which compare the two bitwise. */
void cf__winograd_set_fused(bool on);

/* Whether stride 2's bf16 dx runs over its phases' own positions through conv_cols where the
 * level and the layer allow (conv_bf16.c's dx2_cols; on by default) rather than conv_run over
 * dy's padded rows (dx_stride2): bitwise the same, for benchmarks that switch the two in one
 * process. */
void cf__conv_bf16_set_dx2_cols(bool on);

/* Whether stride 2's bf16 dx over dy's padded rows (dx_stride2) stores each phase's values
 * straight into dx's rows through conv_spread where the level has it (on by default) rather than
 * into phase planes that interleave2_rows then interleaves: bitwise the same, for tests and
 * benchmarks that switch the two in one process. */
void cf__conv_bf16_set_dx_spread(bool on);

/* Whether stride 2's bf16 dx through conv_cols (dx2_cols) stores each row parity's two phases
 * interleaved straight into dx's rows through cols_spread where the level has it (on by default)
 * rather than into dense phase planes that interleave2_rows then interleaves: bitwise the same,
 * for tests and benchmarks that switch the two in one process. */
void cf__conv_bf16_set_dx2_spread(bool on);

/* Tests: how many stride-2 dx calls (dx_stride2 or dx2_cols) have stored through conv_spread or
 * cols_spread in this process, so that a test comparing the two ways can tell the new one ran. */
unsigned long cf__conv_bf16_spread_calls(void);

/* Whether the bf16 weight gradient fetches the next image's bf16 words of x and dy (to L2)
 * while it copies this image's into its rows (conv_bf16.c's wgrad; on by default): bitwise the
 * same, for tests and benchmarks that switch the two in one process. */
void cf__conv_bf16_set_wgrad_prefetch(bool on);

/* Whether that fetch also runs across the backward's blocks (on by default): the block's last
 * image fetches the next block's first, which would otherwise be copied cold after the block's
 * dx. Bitwise the same; cf__conv_bf16_wgrad_next_fetches counts the blocks that fetched their
 * successor's image in this process, so that a test can tell the way ran. */
void cf__conv_bf16_set_wgrad_fetch_next(bool on);
unsigned long cf__conv_bf16_wgrad_next_fetches(void);

/* Whether the avx512_bf16 level's copies of bf16 words into the weight gradient's rows take
 * short rows in their own loops (on by default): rows_h rows of at most 32 words (W1's 14 x 14
 * and 7 x 7 planes) and deal2_h rows of 17 to 32 (its 28 x 28 ones), a row pair a step with the
 * masks made once, rather than a row at a time making them again for each: the same words.
 * cf__bf16_words_loops_take says whether it is on and counts the calls that took a loop
 * (cf__bf16_words_loops_calls, in this process, from its first call on: the first read starts
 * the count, which the kernels skip until then), so that a test can tell the loops ran. */
void cf__bf16_set_words_loops(bool on);
bool cf__bf16_words_loops_take(void);
unsigned long cf__bf16_words_loops_calls(void);

/* Whether conv_cols fetches the lines of each tile's output planes for writing before the tile
 * computes (on by default): bitwise the same, for tests and benchmarks that switch the two in one
 * process. conv_cols reads it through cf__conv_bf16_cols_prefetch. */
void cf__conv_bf16_set_cols_prefetch(bool on);
bool cf__conv_bf16_cols_prefetch(void);

/* At least `words` words of the calling thread's packing scratch for the bf16 GEMMs
 * (isa_avx512_bf16.c; x86-64), kept between calls; NULL when out of memory. */
uint32_t *cf__bf16_pack_scratch(size_t words);

typedef struct cf_kernel_table {
    cf_isa isa;
    /* C (+)= A . B as cf_sgemm_strided; false: this shape is left to the reference path */
    bool (*sgemm_strided)(int m, int n, int k, const float *a, ptrdiff_t a_row, ptrdiff_t a_col,
                          const float *b, int ldb, float *c, int ldc, bool accumulate);
    /* C (+)= A . B^T as cf_sgemm_nt (NULL, or false for a shape: cf_sgemm) */
    bool (*sgemm_nt)(int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                     float *c, int ldc, bool accumulate);
    void (*transpose)(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                      ptrdiff_t ldd);
    /* false: left to the portable loops */
    bool (*im2col)(const cf_conv_geom *g, const float *x, float *col, int ldcol);
    bool (*col2im)(const cf_conv_geom *g, const float *col, int ldcol, float *x, bool add);
    /* Implicit convolutions (NULL: not supported, layers lower with im2col).
     * y[n][r][p] (row r at y + n*y_image + r*y_row + p) = sum over taps t and channels c of
     * A(r, c, t) * x[n][c][p + offset(t)] (channel c at c*x_plane), n < n_images, r < m, with A
     * packed in blocks of CF_PACK_ROWS rows (conv_implicit.c's pack). */
    void (*implicit_run)(const cf_implicit_taps *tp, int channels, int m, const float *packed,
                         const float *x, size_t x_plane, size_t x_image, int n_images, float *y,
                         size_t y_row, size_t y_image);
    /* One tap's weight gradient over n_images images: out[o][c] (+)= sum over the images n and
     * the oh x ow positions p = y*ow + x of a[n*a_image + o*a_row + p] *
     * b[n*b_image + y*row_step + x*pos_step + c], o < m, c < channels (out's row stride). */
    void (*implicit_wgrad)(int m, int channels, int oh, int ow, int n_images, const float *a,
                           ptrdiff_t a_row, size_t a_image, const float *b, ptrdiff_t row_step,
                           ptrdiff_t pos_step, size_t b_image, float *out, bool accumulate);
    /* Stride 2's phase planes (NULL: the portable loops); see conv_implicit.c. */
    void (*split_phases)(const cf_conv_geom *g, const float *x, float *xs, unsigned used);
    void (*merge_phases)(const cf_conv_geom *g, const float *xs, float *x);
    /* cf_conv_stem_forward and cf_conv_stem_wgrad_each on a supported shape (NULL: the portable
     * loops of conv_stem.c); pro: NULL or with fn (the caller's check) */
    void (*stem_forward)(const cf_conv_geom *g, int out_channels, const float *w, const float *x,
                         int n_images, float *y, const cf_conv_epilogue *ep);
    void (*stem_wgrad)(const cf_conv_geom *g, int out_channels, const float *dy,
                       const cf_conv_prologue *pro, const float *x, int n_images, float *dwt,
                       bool accumulate);
    /* whether Conv2d layers take them (cf_conv_stem_pays): where they measured faster than the
     * lowered product */
    bool stem_pays;
    const cf_bn_kernels *bn; /* never NULL */
    /* cf_max_sum_plane (NULL, or false for a plane holding a NaN: the scalar loop) */
    bool (*max_sum_plane)(const float *x, size_t n, float *best, int32_t *arg, float *sum);
    /* cf_max_pool_2x2_plane (NULL: the scalar loop) */
    void (*max_pool_2x2)(const float *x, int h, int w, float *y, int32_t *idx);
    /* cf_max_pool_3x3_s2_row (NULL: the scalar loop) */
    void (*max_pool_3x3_s2_row)(const float *x, int w, int y0, int rows, int pad, int ox0, int ox1,
                                float *y, int32_t *idx);
    /* cf_max_pool_3x3_s2_backward (NULL: zeros, then each output's gradient added at its
     * index, in output order) */
    void (*max_pool_3x3_s2_backward)(const float *dy, const int32_t *idx, int h, int w, int pad,
                                     float *dx, bool stream);
    /* cf_dropout_keyed_row (NULL: the baseline loop of dropout_loops.h) */
    void (*dropout_keyed_row)(uint64_t row, size_t per, uint64_t threshold, float scale,
                              const float *x, uint8_t *mask, float *y);
    const cf_optim_kernels *optim; /* never NULL */
    const cf_wino_kernels *wino;   /* NULL: 3x3 layers stay on the implicit or im2col path */
    const cf_lstm_kernels *lstm;   /* never NULL */
    const cf_bf16_kernels *bf16;   /* NULL: no bf16 compute (cf_sgemm_bf16 runs fp32) */

    /* never NULL */
    const cf_softmax_kernels *softmax;
    /* NULL: the portable loops of lstm_gemm.c */
    const cf_packed_gemm_kernels *packed_gemm;
    /* never NULL */
    const cf_grid_sample_kernels *grid_sample;
} cf_kernel_table;

extern const cf_kernel_table cf_kernels_generic;
#if defined(__x86_64__)
extern const cf_kernel_table cf_kernels_avx2;
extern const cf_kernel_table cf_kernels_avx512;
extern const cf_bf16_kernels cf_bf16_kernels_avx512; /* the AVX512_BF16 level's additions */
/* the AVX512_BF16 level's transforms (isa_avx512_bf16_wino.c) */
extern const cf_wino_kernels *const cf_wino_avx512_bf16;
#endif
#if defined(__aarch64__)
extern const cf_kernel_table cf_kernels_neon;
#endif

/* The active table (never NULL once the library is loaded). */
extern const cf_kernel_table *cf_active_kernels;

#endif
