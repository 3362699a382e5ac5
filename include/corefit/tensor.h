/* corefit/tensor.h — float32 tensors (up to 4 dims, row-major, images NCHW) and the CPU kernels
 * the layers are built from. A cf_tensor is a view: it never owns its data. */
#ifndef COREFIT_TENSOR_H
#define COREFIT_TENSOR_H

#include "corefit/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CF_MAX_DIMS 4

/* A shape without data: ndim in 1..4, dim[i] > 0. */
typedef struct cf_shape {
    int ndim;
    int dim[CF_MAX_DIMS];
} cf_shape;

typedef struct cf_tensor {
    float *data;
    cf_shape shape;
} cf_tensor;

/* Prefetch hint for the bytes at p (write: for writing; near: into L1, else L2). Never faults,
 * so p need not be valid. */
static inline void cf_prefetch(const void *p, size_t bytes, bool write, bool near) {
    const char *c = (const char *)p;
    /* __builtin_prefetch takes its hints as constants: one loop per pair */
    if (write && near)
        for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 1, 3);
    else if (write)
        for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 1, 2);
    else if (near)
        for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
    else
        for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 2);
}

static inline size_t cf_shape_numel(const cf_shape *s) {
    size_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= (size_t)s->dim[i];
    return n;
}
static inline size_t cf_tensor_numel(const cf_tensor *t) {
    return cf_shape_numel(&t->shape);
}
/* Elements per sample (all dims but the first). */
static inline size_t cf_shape_sample_numel(const cf_shape *s) {
    size_t n = 1;
    for (int i = 1; i < s->ndim; i++) n *= (size_t)s->dim[i];
    return n;
}
cf_shape cf_shape_make(int ndim, const int *dims);
cf_shape cf_shape1(int a);
cf_shape cf_shape2(int a, int b);
cf_shape cf_shape4(int n, int c, int h, int w);
bool cf_shape_equal(const cf_shape *a, const cf_shape *b);
/* Writes "(64, 16, 28, 28)" into buf; returns buf. */
const char *cf_shape_str(const cf_shape *s, char *buf, size_t size);
cf_tensor cf_tensor_view(float *data, cf_shape shape);

/* ---- CPU kernels: GEMM and image lowering (src/tensor/kernels.c) -------------------------- */

/* Row-major single-precision GEMM through CBLAS: C (m x n) = alpha * op(A) * op(B) + beta * C;
 * lda, ldb, ldc are row strides as stored. Runs on the calling thread (BLAS held to one thread). */
void cf_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);

/* C (m x n) = A (m x k) . B, or C += A . B when accumulate; A's element (i, p) is
 * a[i * a_row + p * a_col] (row-major or transposed without a copy), B and C row-major. For the
 * skinny products of convolutions. The result does not depend on the calling thread. */
void cf_sgemm_strided(int m, int n, int k, const float *a, ptrdiff_t a_row, ptrdiff_t a_col,
                      const float *b, int ldb, float *c, int ldc, bool accumulate);

/* C (m x n) = A . B^T (or += with accumulate), A m x k and B n x k row-major: dot products along
 * k, as in a stem's weight gradient. Fixed summation order whatever the thread. */
void cf_sgemm_nt(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c,
                 int ldc, bool accumulate);

/* true: cf_sgemm_strided, cf_sgemm_nt, cf_im2col and cf_col2im take their plain reference paths
 * (CBLAS and scalar loops) instead of the vectorised ones, for tests that compare the two.
 * Process-wide; set it only while no kernel runs. */
void cf_kernels_set_reference(bool reference);
bool cf_kernels_reference(void);

/* ---- BatchNorm over one channel plane (src/tensor/kernels.c, the active kernel table) ------ */

/* The statistics take one pass: s1 = sum(x - k), s2 = sum((x - k)^2) over s values, with k the
 * channel's first value (the shifted-data algorithm; var = E[d^2] - E[d]^2). */
void cf_bn_plane_sums(const float *x, int64_t s, float k, double *s1, double *s2);
/* y = x * scale + shift; relu: max(y, 0); add (not NULL): max(add + y, 0). */
void cf_bn_plane_affine(const float *x, const float *add, float *y, int64_t s, float scale,
                        float shift, bool relu);
/* sdy += sum(g), sdyx += sum(g * (x - mean)), with g = dy, or with relu (a fused ReLU) dy where
 * x * scale + shift > 0, recomputed exactly as cf_bn_plane_affine computed it, and 0 elsewhere. */
void cf_bn_plane_dy_sums(const float *dy, const float *x, int64_t s, float mean, bool relu,
                         float scale, float shift, double *sdy, double *sdyx);
/* Up to CF_BN_PLANES planes of s values in one call, plane i from x[i] (and dy[i]): the same
 * sums as the one-plane calls above, bitwise (each plane's lanes add in the same order; the
 * planes only interleave, which hides the additions' latency on small planes).
 * cf_bn_planes_sums sets s1[i], s2[i] as cf_bn_plane_sums(x[i], s, k[i], &s1[i], &s2[i]) does;
 * cf_bn_planes_dy_sums adds to *sdy[i], *sdyx[i] as cf_bn_plane_dy_sums would, in the order
 * i = 0, 1, ... (pointers may repeat: a channel's planes of several images). */
#define CF_BN_PLANES 4
void cf_bn_planes_sums(int np, const float *const *x, int64_t s, const float *k, double *s1,
                       double *s2);
void cf_bn_planes_dy_sums(int np, const float *const *dy, const float *const *x, int64_t s,
                          const float *mean, bool relu, const float *scale, const float *shift,
                          double *const *sdy, double *const *sdyx);
/* One image's c consecutive planes of s values (x: plane i at i * s) in groups of CF_BN_PLANES
 * through cf_bn_planes_sums, plane i's shift k[i]: s1[i], s2[i] set for i < c. BatchNorm's
 * per-image statistics (src/nn/batchnorm.c), the same calls wherever they are taken. */
void cf_bn_image_sums(const float *x, int c, int64_t s, const float *k, double *s1, double *s2);
/* dx = k1 * g + k2 * (x - mean) + k3, g as in cf_bn_plane_dy_sums. */
void cf_bn_plane_dx(const float *dy, const float *x, float *dx, int64_t s, float mean, float k1,
                    float k2, float k3, bool relu, float scale, float shift);
/* cf_bn_plane_affine and cf_bn_plane_dx over nc consecutive planes of s values (plane i at
 * x + i * s, ...; its constants at scale[i], shift[i], mean[i], k1[i], ...), bitwise the
 * one-plane calls: a sample's block of channels in one call. ahead (0: none): before each
 * plane, the output's (and add's) plane `ahead` floats on is prefetched (the next sample's). */
void cf_bn_planes_affine(const float *x, const float *add, float *y, int64_t s, int nc,
                         const float *scale, const float *shift, bool relu, ptrdiff_t ahead);
/* cf_bn_planes_affine with y's aligned whole vectors written by non-temporal stores where the
 * instruction set has them (AVX2, AVX-512), so that a large output's lines are not read in from
 * memory before they are overwritten; y is then not prefetched. The values are bitwise
 * cf_bn_planes_affine's; the stores are fenced before the call returns. For outputs much larger
 * than the caches, which the next layer reads from memory anyway. */
void cf_bn_planes_affine_stream(const float *x, const float *add, float *y, int64_t s, int nc,
                                const float *scale, const float *shift, bool relu, ptrdiff_t ahead);
void cf_bn_planes_dx(const float *dy, const float *x, float *dx, int64_t s, int nc,
                     const float *mean, const float *k1, const float *k2, const float *k3,
                     bool relu, const float *scale, const float *shift, ptrdiff_t ahead);
/* cf_bn_planes_dx writing bf16 words instead: dxh[i] = the words cf_fp32_to_bf16 makes of the
 * dx cf_bn_planes_dx computes (bitwise; nc x s halves, ahead in values as there), rounded in
 * registers where the level has it (avx512, avx512_bf16, amx), else a chunk at a time through a
 * buffer on the stack: no fp32 dx is written (for a bf16 convolution that reads its dy only as
 * bf16 words, conv.c). */
void cf_bn_planes_dx_bf16(const float *dy, const float *x, uint16_t *dxh, int64_t s, int nc,
                          const float *mean, const float *k1, const float *k2, const float *k3,
                          bool relu, const float *scale, const float *shift, ptrdiff_t ahead);

/* cf_bn_planes_affine without add writing bf16 words instead: yh[i] = the words cf_fp32_to_bf16
 * makes of the y cf_bn_planes_affine computes (bitwise; nc x s halves, ahead in values), rounded
 * in registers where the level has it (avx512, avx512_bf16, amx), else a chunk at a time through
 * a buffer on the stack: no fp32 y is written (a BatchNorm writing the next bf16 convolution's
 * input words, nn_internal.h). */
void cf_bn_planes_affine_bf16(const float *x, uint16_t *yh, int64_t s, int nc, const float *scale,
                              const float *shift, bool relu, ptrdiff_t ahead);
/* y = max((x2 * scale2[i] + shift2[i]) + (x * scale[i] + shift[i]), 0) over nc planes: bitwise
 * cf_bn_planes_affine of x2 (no add, no ReLU) into a buffer, then cf_bn_planes_affine of x with
 * that buffer as add (a residual block's relu(bn_a(x2) + bn_b(x)) without bn_a's output written:
 * its statistics' scale and shift applied here). ahead as cf_bn_planes_affine's, for y and x2. */
void cf_bn_planes_affine_add2(const float *x, const float *x2, float *y, int64_t s, int nc,
                              const float *scale, const float *shift, const float *scale2,
                              const float *shift2, ptrdiff_t ahead);

/* A residual block's ReLU mask kept as bits, one a value, for planes of s values: plane p's value
 * j is bit j % 16 of word p * CF_MASK_WORDS(s) + j / 16 (the bits past s are zero). Written by
 * the block's fold as it writes the block's output, read by the BatchNorms whose backward takes
 * the block's gradient, so that the masked gradient (dy where the output is > 0, +0 elsewhere)
 * is never written. */
#define CF_MASK_WORDS(s) (((s) + 15) / 16)
/* y = max(add + (x * scale[i] + shift[i]), 0) (x2 NULL: cf_bn_planes_affine's add branch) or
 * cf_bn_planes_affine_add2's y (x2 not NULL; add unused), bitwise, and mask's bits y > 0 for
 * the nc planes (plane i's words at mask + i * CF_MASK_WORDS(s)). ahead as there. */
void cf_bn_planes_fold_mask(const float *x, const float *add, const float *x2, float *y, int64_t s,
                            int nc, const float *scale, const float *shift, const float *scale2,
                            const float *shift2, uint16_t *mask, ptrdiff_t ahead);
/* cf_bn_planes_fold_mask writing bf16 words instead of y: yh[i] = the words cf_fp32_to_bf16
 * makes of its y (bitwise), the same mask bits, no fp32 y written (a residual block's fold
 * writing the next block's bf16 convolution's input words, nn_internal.h); rounded in registers
 * where the level has it, else a chunk at a time through a buffer on the stack. */
void cf_bn_planes_fold_mask_bf16(const float *x, const float *add, const float *x2, uint16_t *yh,
                                 int64_t s, int nc, const float *scale, const float *shift,
                                 const float *scale2, const float *shift2, uint16_t *mask,
                                 ptrdiff_t ahead);
/* cf_bn_planes_dy_sums, cf_bn_planes_dx and cf_bn_planes_dx_bf16 without a fused ReLU, given dy
 * masked by bits: g = dy where the value's bit is set and +0 elsewhere, bitwise those kernels
 * given that masked gradient. mask[i] (dy_sums): plane i's words; mask (dx): the first plane's,
 * plane i's at mask + i * CF_MASK_WORDS(s). */
void cf_bn_planes_dy_sums_mask(int np, const float *const *dy, const float *const *x, int64_t s,
                               const float *mean, const uint16_t *const *mask, double *const *sdy,
                               double *const *sdyx);
void cf_bn_planes_dx_mask(const float *dy, const float *x, float *dx, int64_t s, int nc,
                          const float *mean, const float *k1, const float *k2, const float *k3,
                          const uint16_t *mask, ptrdiff_t ahead);
void cf_bn_planes_dx_bf16_mask(const float *dy, const float *x, uint16_t *dxh, int64_t s, int nc,
                               const float *mean, const float *k1, const float *k2, const float *k3,
                               const uint16_t *mask, ptrdiff_t ahead);

/* ---- dropout (src/tensor/kernels.c) ------------------------------------------------------- */

/* One row of a keyed Dropout (nn's cf_dropout inside a fit): the mask of `per` values from the
 * row's key, pair j (values 2j and 2j + 1) from the 64-bit word splitmix64_finaliser(row + (j +
 * 1) * 0x9e3779b97f4a7c15), its low and high 32 bits each kept (mask 1) when >= threshold
 * (p * 2^32); then y = mask ? x * scale : +0. Every kernel level gives the same bytes and bits. */
void cf_dropout_keyed_row(uint64_t row, size_t per, uint64_t threshold, float scale, const float *x,
                          uint8_t *mask, float *y);

/* ---- pooling (src/tensor/kernels.c) ------------------------------------------------------- */

/* The maximum of x[0..n) and its first position (a NaN wins, at its first position), and the
 * sum (AdaptiveConcatPool2d's two halves on one plane). n > 0. */
void cf_max_sum_plane(const float *x, size_t n, float *best, int32_t *arg, float *sum);
/* MaxPool2d(2) (kernel 2, stride 2, no padding) over one h x w plane: y (h/2 x w/2) and the
 * position in the plane of each maximum (the window in row order, a value taken when greater
 * than the best so far or NaN: PyTorch's choice). */
void cf_max_pool_2x2_plane(const float *x, int h, int w, float *y, int32_t *idx);
/* MaxPool2d(3, stride 2, padding pad) (resnet's stem pool), outputs ox in [ox0, ox1) of one
 * output row whose window rows are [y0, y0 + rows) (1 to 3 rows, clipped to the plane) and whose
 * three window columns 2 ox - pad .. 2 ox - pad + 2 lie inside the row: y[ox] is the window's
 * maximum and idx[ox] its position in the plane x (row length w). The taps are taken row by row,
 * a value replacing the best when greater or NaN (the first maximum; the last NaN), as the
 * layer's general loop, so the results are bitwise those of that loop. */
void cf_max_pool_3x3_s2_row(const float *x, int w, int y0, int rows, int pad, int ox0, int ox1,
                            float *y, int32_t *idx);
/* The backward of MaxPool2d(3, stride 2, padding pad) over one h x w plane: dx (h x w, every
 * value written) is +0 plus the gradients dy of the outputs whose index idx points at it, added
 * in output order (bitwise a zeroed dx with dx[idx[o]] += dy[o] for o = 0, 1, ...). The output
 * plane is ((h + 2 pad - 3) / 2 + 1) x ((w + 2 pad - 3) / 2 + 1); h + 2 pad >= 3, the same for
 * w, and pad <= 1. stream: dx may be written with non-temporal stores (for a batch's dx far
 * larger than the caches; the values are the same). */
void cf_max_pool_3x3_s2_backward(const float *dy, const int32_t *idx, int h, int w, int pad,
                                 float *dx, bool stream);

/* ---- optimizer updates over a segment of a flat weight block (src/tensor/kernels.c) -------- */

/* One parameter's coefficients for a step (fastai's SGD and Adam; see src/optim/optim.c). */
typedef struct cf_opt_update {
    bool decoupled;     /* decoupled weight decay: p *= decay first */
    bool l2;            /* L2 weight decay: g += wd * p */
    float decay;        /* 1 - lr * wd */
    float wd, lr;       /* weight decay, learning rate */
    float mom, mom_w;   /* grad_avg = mom * grad_avg + mom_w * g (mom_w: 1 for SGD, 1 - mom Adam) */
    float sqr_mom;      /* Adam: sqr_avg = sqr_mom * sqr_avg + sqr_w * g^2 */
    float sqr_w;        /* 1 - sqr_mom */
    float step_size;    /* Adam: lr / (1 - mom^step) */
    float debias2_sqrt; /* Adam: sqrt(1 - sqr_mom^step) */
    float eps;
} cf_opt_update;

/* SGD over n values: w -= lr * (momentum-averaged) g; grad_avg NULL: no momentum. */
void cf_sgd_update(const cf_opt_update *u, float *w, const float *g, float *grad_avg, size_t n);
/* Adam over n values: w = p - step_size * m / (sqrt(v) / debias2_sqrt + eps). */
void cf_adam_update(const cf_opt_update *u, float *w, const float *g, float *grad_avg,
                    float *sqr_avg, size_t n);

/* ---- instruction sets (src/tensor/isa.c) --------------------------------------------------- */

/* The hot kernels are compiled for several instruction sets and the best the CPU reports is
 * chosen at load. CF_ISA (generic, avx2, avx512, avx512_bf16, amx, neon) caps the choice.
 * Results agree across sets to float rounding, not bitwise. The x86-64 sets rank generic < avx2
 * < avx512 < avx512_bf16 < amx; a cap of neon on x86-64 (amx on arm64) caps nothing. */
typedef enum cf_isa {
    CF_ISA_GENERIC = 0,     /* portable C (and OpenBLAS's own kernels) */
    CF_ISA_AVX2 = 1,        /* x86-64 AVX2 + FMA */
    CF_ISA_AVX512 = 2,      /* x86-64 AVX-512 F/BW/DQ/VL + BMI2 */
    CF_ISA_AVX512_BF16 = 3, /* the AVX-512 kernels plus bfloat16 dot products (vdpbf16ps) */
    CF_ISA_NEON = 4,        /* arm64 Advanced SIMD (every arm64 CPU has it) */
    CF_ISA_AMX = 5,         /* avx512_bf16 plus Intel AMX tiles (TDPBF16PS) for bf16 products;
                             * needs the OS to grant the tile state (else avx512_bf16) */
} cf_isa;

/* The instruction set of the kernels in use. */
cf_isa cf_isa_active(void);
/* The best instruction set this CPU supports (and this build contains), ignoring any cap. */
cf_isa cf_isa_best(void);
/* "generic", "avx2", "avx512", "avx512_bf16", "neon", "amx". */
const char *cf_isa_name(cf_isa isa);
/* Parses a name as CF_ISA takes it; false (and *isa untouched) for an unknown name. */
bool cf_isa_parse(const char *name, cf_isa *isa);
/* Caps the kernels at `cap` (the best supported set not above it) and returns the one chosen.
 * Process-wide: call only while no kernel or BLAS call runs, and re-plan layers afterwards. */
cf_isa cf_set_isa(cf_isa cap);

/* ---- bfloat16 (src/tensor/bf16.c; kernels in src/tensor/isa_avx512_bf16.c) ---------------- */

/* fp32 <-> bfloat16 (fp32's upper 16 bits), rounding to nearest even exactly as PyTorch's
 * x.to(torch.bfloat16): subnormals kept, infinities and NaN (quiet) preserved. */
void cf_fp32_to_bf16(const float *x, uint16_t *y, size_t n);
/* y = x exactly (bf16 -> fp32 widens with zeros). */
void cf_bf16_to_fp32(const uint16_t *x, float *y, size_t n);
/* The value of bf16(x) as fp32 (x rounded as cf_fp32_to_bf16). */
float cf_bf16_round(float x);

/* true when the active kernel table computes in bfloat16 (avx512_bf16 and amx; capping CF_ISA
 * below avx512_bf16 turns it off). */
bool cf_bf16_compute(void);

/* cf_sgemm's product (or += with accumulate) with A and B rounded to bfloat16 and fp32 sums: the
 * GEMM of mixed-precision training. Falls back to fp32 cf_sgemm without bf16 kernels, and where
 * the level's kernel cannot allocate its packing scratch (out of memory), which it then says once
 * per process on stderr. Runs on the calling thread. */
void cf_sgemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                   const float *b, int ldb, float *c, int ldc, bool accumulate);

/* The geometry of a 2-D sliding window over one (C, H, W) image: kernel kh x kw, stride sh x sw,
 * zero padding ph x pw, output oh x ow = floor((H + 2p - k) / s) + 1. */
typedef struct cf_conv_geom {
    int c, h, w;
    int kh, kw, sh, sw, ph, pw;
    int oh, ow;
} cf_conv_geom;

/* Fills in oh and ow; false when the padded input is smaller than the kernel (or any size
 * is not positive). */
bool cf_conv_geom_init(cf_conv_geom *g, int c, int h, int w, int kh, int kw, int sh, int sw, int ph,
                       int pw);

/* Lowers one NCHW image (C, H, W) into the patch matrix col (C*kh*kw rows, oh*ow columns, row
 * stride ldcol >= oh*ow), zero outside the image. */
void cf_im2col(const cf_conv_geom *g, const float *x, float *col, int ldcol);
/* The adjoint of cf_im2col: x (C, H, W) = sum of the patch entries of col (row stride ldcol)
 * that read each pixel (x is overwritten, not accumulated into). */
void cf_col2im(const cf_conv_geom *g, const float *col, int ldcol, float *x);
/* The same added into x: x += the sum of the patch entries that read each pixel; where each
 * pixel gets at most one entry (a 1x1 kernel), x + entry exactly. */
void cf_col2im_add(const cf_conv_geom *g, const float *col, int ldcol, float *x);

/* ---- convolutions without a patch matrix ("implicit GEMM"): src/tensor/conv_implicit.c ---- */

/* Implicit convolution (no patch matrix) for stride 1 "same" and stride 2 "half" geometries:
 * forward y = conv(x, w), dx the adjoint at dy (overwritten), wgrad tap-major dwt[t][o][c] (+)=.
 * w is (out_channels, g->c, kh, kw). Forward and dx do not depend on how a batch is split;
 * cf_conv_implicit_supported says whether a geometry can use them. Details: docs/api.md. */
#define CF_IMPLICIT_MAX_TAPS 49
#define CF_IMPLICIT_MAX_PLANE 4096
bool cf_conv_implicit_supported(const cf_conv_geom *g);
/* Floats of scratch per calling thread for the three calls below (any n_images). */
size_t cf_conv_implicit_scratch(const cf_conv_geom *g, int out_channels);
/* ... of cf_conv_implicit_wgrad alone. */
size_t cf_conv_implicit_wgrad_scratch(const cf_conv_geom *g);
/* Floats of a packed weight copy (either kind). */
size_t cf_conv_implicit_packed_size(const cf_conv_geom *g, int out_channels);
/* The weights in the kernel's order for the forward pass, and for dx. */
void cf_conv_implicit_pack(const cf_conv_geom *g, int out_channels, const float *w, float *packed);
void cf_conv_implicit_pack_dx(const cf_conv_geom *g, int out_channels, const float *w,
                              float *packed);
void cf_conv_implicit_forward(const cf_conv_geom *g, int out_channels, const float *packed,
                              const float *x, int n_images, float *y, float *scratch);
/* A 1x1 stride-2 shortcut computed alongside a stride-2 layer on the same input (read once);
 * bitwise the shortcut run on its own through im2col. */
typedef struct cf_conv_shortcut {
    int out_channels;
    const float *w;  /* out_channels x channels, row-major (the layer's own weights) */
    float *y;        /* forward: its output for the call's images */
    const float *dy; /* dx, dW: its output gradient for the call's images */
    float *dw;       /* dW: its weight gradient, out_channels x channels */
} cf_conv_shortcut;
/* cf_conv_implicit_forward of a stride-2 layer, and the shortcut's output (NULL: none). */
void cf_conv_implicit_forward_with(const cf_conv_geom *g, int out_channels, const float *packed,
                                   const float *x, int n_images, float *y, float *scratch,
                                   const cf_conv_shortcut *shortcut);
void cf_conv_implicit_dx(const cf_conv_geom *g, int out_channels, const float *packed_dx,
                         const float *dy, int n_images, float *dx, float *scratch);
/* cf_conv_implicit_dx plus the shortcut's input gradient (NULL: none), dx written once; bitwise
 * this layer's dx plus the shortcut's col2im. */
void cf_conv_implicit_dx_with(const cf_conv_geom *g, int out_channels, const float *packed_dx,
                              const float *dy, int n_images, float *dx, float *scratch,
                              const cf_conv_shortcut *shortcut);
void cf_conv_implicit_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                            const float *x, int n_images, float *dwt, bool accumulate,
                            float *scratch);
/* cf_conv_implicit_wgrad plus the shortcut's weight gradient into shortcut->dw (overwritten
 * unless accumulate; NULL: none); bitwise the shortcut's own wgrad. */
void cf_conv_implicit_wgrad_with(const cf_conv_geom *g, int out_channels, const float *dy,
                                 const float *x, int n_images, float *dwt, bool accumulate,
                                 float *scratch, const cf_conv_shortcut *shortcut);

/* ---- Winograd F(2x2, 3x3) convolutions: src/tensor/winograd.c ----------------------------- */

/* Winograd F(2x2, 3x3) for 3x3 stride-1 padding-1 convolutions: forward, dx (overwritten) and
 * wgrad in the transformed domain (du [16][in][out]; cf_conv_winograd_wgrad_add adds it into
 * dw). Equal to direct convolution within a few ulps. cf_conv_winograd_supported says whether a
 * geometry and the active kernel table can use it. */
bool cf_conv_winograd_supported(const cf_conv_geom *g);
/* Supported, and faster than the implicit kernels with the active table for this geometry and
 * channel count (short image rows with few channels are not, on the wider vectors). */
bool cf_conv_winograd_pays(const cf_conv_geom *g, int out_channels);
/* Floats of scratch per calling thread for forward, dx and wgrad. */
size_t cf_conv_winograd_scratch(const cf_conv_geom *g, int out_channels);
/* Floats of transformed weights (either kind) and of a wgrad accumulator: 16 * out * in. */
size_t cf_conv_winograd_packed_size(const cf_conv_geom *g, int out_channels);
void cf_conv_winograd_pack(const cf_conv_geom *g, int out_channels, const float *w, float *u);
void cf_conv_winograd_pack_dx(const cf_conv_geom *g, int out_channels, const float *w, float *u);
void cf_conv_winograd_forward(const cf_conv_geom *g, int out_channels, const float *u,
                              const float *x, int n_images, float *y, float *scratch);
void cf_conv_winograd_dx(const cf_conv_geom *g, int out_channels, const float *u_dx,
                         const float *dy, int n_images, float *dx, float *scratch);
void cf_conv_winograd_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                            const float *x, int n_images, float *du, bool accumulate,
                            float *scratch);
void cf_conv_winograd_wgrad_add(const cf_conv_geom *g, int out_channels, const float *du,
                                float *dw);
/* The same three in mixed precision: the transforms in fp32 as above, the 16 per-point products
 * in bf16 with fp32 sums (the transformed input, weights and output gradient rounded to bf16;
 * numerics in winograd.c's header and docs/api.md) where cf_bf16_compute(), else exactly the
 * fp32 functions. The weights come from cf_conv_winograd_pack_bf16 (_pack_dx_bf16), which also
 * round them for the level's GEMM once per pass, into cf_conv_winograd_packed_size_bf16 floats;
 * du as the fp32 functions'. A pack is for the level active when it is made (where that level's
 * GEMM takes its weights pre-packed it holds them only in bf16); read at another level (the
 * forward, dx and backward functions alike) each point is unpacked into the scratch first, no
 * allocation (at a level without bf16 products, the fp32 products then take the weights rounded
 * to bf16). */
size_t cf_conv_winograd_packed_size_bf16(const cf_conv_geom *g, int out_channels);
/* Floats of scratch per calling thread for the _bf16 functions (at least the fp32 ones': their
 * blocks of images are larger in bf16; and room for one point's weights, in_c x out_c floats,
 * unpacked from a pack made at another level). */
size_t cf_conv_winograd_scratch_bf16(const cf_conv_geom *g, int out_channels);
void cf_conv_winograd_pack_bf16(const cf_conv_geom *g, int out_channels, const float *w, float *u);
void cf_conv_winograd_pack_dx_bf16(const cf_conv_geom *g, int out_channels, const float *w,
                                   float *u);
void cf_conv_winograd_forward_bf16(const cf_conv_geom *g, int out_channels, const float *u,
                                   const float *x, int n_images, float *y, float *scratch);
void cf_conv_winograd_dx_bf16(const cf_conv_geom *g, int out_channels, const float *u_dx,
                              const float *dy, int n_images, float *dx, float *scratch);
void cf_conv_winograd_wgrad_bf16(const cf_conv_geom *g, int out_channels, const float *dy,
                                 const float *x, int n_images, float *du, bool accumulate,
                                 float *scratch);
/* wgrad then dx of the same images (bitwise the two calls, the same scratch), block of images by
 * block, so that dx reads each block of dy again while it is in the caches; _bf16: the _bf16
 * functions'. */
void cf_conv_winograd_backward(const cf_conv_geom *g, int out_channels, const float *u_dx,
                               const float *dy, const float *x, int n_images, float *du,
                               bool accumulate, float *dx, float *scratch);
void cf_conv_winograd_backward_bf16(const cf_conv_geom *g, int out_channels, const float *u_dx,
                                    const float *dy, const float *x, int n_images, float *du,
                                    bool accumulate, float *dx, float *scratch);

/* dst[j*ldd + i] = src[i*lds + j] for i < rows, j < cols (16 x 16 blocks in registers with
 * AVX-512). */
void cf_transpose(int rows, int cols, const float *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd);

/* ---- the LSTM cell (src/tensor/lstm_cell.c, the active kernel table) ----------------------- */

/* One step of n cells of PyTorch's LSTM: gates [i | f | g | o] (4n pre-activations) are replaced
 * by their activations; c = f * c_prev + i * g, h = o * tanh(c). Equal across instruction sets to
 * float rounding. */
void cf_lstm_cell_forward(int n, float *gates, const float *c_prev, float *c, float *h);
/* The backward of that step. gates holds the activations the forward left and receives dL/d(the
 * pre-activations); dL/dh = dh_out + dh_rec (dh_rec NULL: dh_out alone); dc holds dL/dc from the
 * step after (0 after the last) and receives dL/dc_prev. c_prev and c are the step's states. */
void cf_lstm_cell_backward(int n, float *gates, const float *c_prev, const float *c,
                           const float *dh_out, const float *dh_rec, float *dc);

/* ---- bf16 convolutions without a patch matrix: src/tensor/conv_bf16.c ---------------------- */

/* Mixed-precision Conv2d of stride 1 whose output is as large as its input, or of stride 2 on an
 * even-sized image (an odd square kernel above 1x1, padding (k - 1) / 2): bf16 operands, fp32 sums,
 * through the kernel table's bf16 kernels (vdpbf16ps at avx512_bf16, TDPBF16PS tiles at amx).
 * Supported only where the active table has them (those two levels). Weights are packed by
 * cf_conv_bf16_pack (both products' orders) into cf_conv_bf16_packed_floats floats, for the level
 * active when it ran (amx orders the blocks for its tiles); every call takes cf_conv_bf16_scratch
 * floats of scratch. forward: y (n, out, h, w) = conv(x); dx: dx (n, c, h, w) = the input gradient
 * of dy, both overwritten; wgrad: dw [tap][out][in] = the weight gradient summed over the n images
 * (overwritten). Layouts: docs/api.md.
 * A pack records the level and the layer it was made for: the calls that read it (forward, dx,
 * dx_add, the _with calls, backward with dx) return CF_ERR_STATE, computing nothing, for a pack
 * made at another level (cf_set_isa or CF_ISA changed between the pack and the call) or for
 * another layer; cf_conv_bf16_pack_current says whether it fits, and cf_conv_bf16_repack reorders
 * it for the active level from the bf16 weights it keeps (bitwise what cf_conv_bf16_pack of the
 * same weights gives there; CF_ERR_STATE for a pack of another layer, CF_ERR_UNSUPPORTED where the
 * active level has no bf16 convolution). */
bool cf_conv_bf16_supported(const cf_conv_geom *g, int out_channels);
size_t cf_conv_bf16_packed_floats(const cf_conv_geom *g, int out_channels);
size_t cf_conv_bf16_scratch(const cf_conv_geom *g, int out_channels);
void cf_conv_bf16_pack(const cf_conv_geom *g, int out_channels, const float *w, float *packed);
bool cf_conv_bf16_pack_current(const cf_conv_geom *g, int out_channels, const float *packed);
cf_status cf_conv_bf16_repack(const cf_conv_geom *g, int out_channels, float *packed);
cf_status cf_conv_bf16_forward(const cf_conv_geom *g, int out_channels, const float *packed,
                               const float *x, int n_images, float *y, float *scratch);
cf_status cf_conv_bf16_dx(const cf_conv_geom *g, int out_channels, const float *packed,
                          const float *dy, int n_images, float *dx, float *scratch);
void cf_conv_bf16_wgrad(const cf_conv_geom *g, int out_channels, const float *dy, const float *x,
                        int n_images, float *dw, float *scratch);
/* A 1x1 stride-2 layer without padding (a residual shortcut; out (h + 1) / 2 x (w + 1) / 2) is
 * supported too, as the 1x1 convolution of x[:, 2i, 2j]. For it, cf_conv_bf16_dx_add adds the
 * input gradient into dx (each value receives at most one term); false, and dx untouched, for
 * any other geometry (or a pack of another level or layer, with cf_last_error set). */
bool cf_conv_bf16_dx_add(const cf_conv_geom *g, int out_channels, const float *packed,
                         const float *dy, int n_images, float *dx, float *scratch);
/* A stride-2 layer and a 1x1 stride-2 shortcut on the same input (cf_conv_bf16_pair_fits: the
 * same channels and output size, the shortcut's outputs at most max(channels, out_channels))
 * share the conversions of x and of the phase planes: _forward_with also writes the shortcut's
 * output, _dx_with adds the shortcut's input gradient into dx (written once), _wgrad_with also
 * writes the shortcut's weight gradient [out][in] (overwritten). shortcut->w is the shortcut's
 * own cf_conv_bf16_pack; y, dy, dw as in cf_conv_shortcut. The forward and dx are bitwise the
 * shortcut's own calls; the shortcut's weight gradient sums the same products in the layer's
 * blocks of images. Same scratch as the layer alone. */
bool cf_conv_bf16_pair_fits(const cf_conv_geom *g, int out_channels, const cf_conv_geom *shortcut_g,
                            int shortcut_out);
cf_status cf_conv_bf16_forward_with(const cf_conv_geom *g, int out_channels, const float *packed,
                                    const float *x, int n_images, float *y, float *scratch,
                                    const cf_conv_shortcut *shortcut);
cf_status cf_conv_bf16_dx_with(const cf_conv_geom *g, int out_channels, const float *packed,
                               const float *dy, int n_images, float *dx, float *scratch,
                               const cf_conv_shortcut *shortcut);
void cf_conv_bf16_wgrad_with(const cf_conv_geom *g, int out_channels, const float *dy,
                             const float *x, int n_images, float *dw, float *scratch,
                             const cf_conv_shortcut *shortcut);
/* The backward pass in one call: cf_conv_bf16_wgrad into dw (NULL: none) and cf_conv_bf16_dx
 * into dx (NULL: none), a block of images at a time (each block's dy read twice while it is in
 * cache), bitwise the two calls'. A paired shortcut (cf_conv_bf16_pair_fits) as in
 * _wgrad_with (dw_shortcut) and _dx_with (dx_shortcut); NULL: none. */
cf_status cf_conv_bf16_backward(const cf_conv_geom *g, int out_channels, const float *packed,
                                const float *dy, const float *x, int n_images, float *dw, float *dx,
                                float *scratch, const cf_conv_shortcut *dw_shortcut,
                                const cf_conv_shortcut *dx_shortcut);
/* x's bf16 words kept from the forward pass for the backward's weight gradient (mixed
 * precision's activations stored for backward in bf16): cf_conv_bf16_forward_keep is
 * cf_conv_bf16_forward (shortcut NULL) or _forward_with, bitwise, that also writes x_kept = bf16(x)
 * (cf_fp32_to_bf16 of the n_images images, n x c x h x w halves; NULL: none), converted call by
 * call while x is in cache. cf_conv_bf16_backward_kept is cf_conv_bf16_backward, bitwise, whose
 * weight gradient copies x's words from x_kept (those of the same x; NULL: none) instead of
 * reading x in fp32 and rounding it again: half the bytes, from memory by then. It reads x_kept
 * where cf_conv_bf16_keeps_input holds (not a compact small-plane layer, nor the 1x1 stride-2
 * one alone) and the active level has the copies (avx512_bf16, amx); else x, as
 * cf_conv_bf16_backward. */
bool cf_conv_bf16_keeps_input(const cf_conv_geom *g, int out_channels);
cf_status cf_conv_bf16_forward_keep(const cf_conv_geom *g, int out_channels, const float *packed,
                                    const float *x, int n_images, float *y, float *scratch,
                                    const cf_conv_shortcut *shortcut, uint16_t *x_kept);
cf_status cf_conv_bf16_backward_kept(const cf_conv_geom *g, int out_channels, const float *packed,
                                     const float *dy, const float *x, const uint16_t *x_kept,
                                     int n_images, float *dw, float *dx, float *scratch,
                                     const cf_conv_shortcut *dw_shortcut,
                                     const cf_conv_shortcut *dx_shortcut);
/* The forward pass from x's bf16 words alone (mixed precision's activations written in bf16 by
 * the layer before: a BatchNorm whose output only this convolution reads, src/nn/batchnorm.c):
 * x_kept holds bf16(x) of the n_images images (cf_fp32_to_bf16's words, n x c x h x w halves, as
 * cf_conv_bf16_forward_keep writes them), and y is bitwise cf_conv_bf16_forward_keep's on that x
 * (its pair planes are the same words, paired here rather than rounded from fp32). x itself is
 * never read, so neither may the backward: cf_conv_bf16_backward_kept with the same x_kept reads
 * no fp32 x where this fits. cf_conv_bf16_forward_from_kept_fits: whether it runs this layer at
 * the active level (a stride-1 or stride-2 layer of an even number of input channels that keeps
 * its input, cf_conv_bf16_keeps_input, at a level whose weight gradient copies the kept words and,
 * at stride 2, that deals bf16 words into its phase planes: avx512_bf16 and amx); elsewhere the
 * call fails (CF_ERR_INVALID) and writes nothing. cf_conv_bf16_forward_from_kept_with: the same
 * with a paired 1x1 stride-2 shortcut (cf_conv_bf16_forward_with's, from the same phase planes),
 * bitwise cf_conv_bf16_forward_keep's y and shortcut->y on that x. */
bool cf_conv_bf16_forward_from_kept_fits(const cf_conv_geom *g, int out_channels);
cf_status cf_conv_bf16_forward_from_kept(const cf_conv_geom *g, int out_channels,
                                         const float *packed, const uint16_t *x_kept, int n_images,
                                         float *y, float *scratch);
cf_status cf_conv_bf16_forward_from_kept_with(const cf_conv_geom *g, int out_channels,
                                              const float *packed, const uint16_t *x_kept,
                                              int n_images, float *y, float *scratch,
                                              const cf_conv_shortcut *shortcut);
/* A per-image epilogue of cf_conv_bf16_forward_each: fn(ctx, shortcut, n0, count) runs on the
 * calling thread as soon as images [n0, n0 + count) of the call (counted from its first image)
 * have their whole output written, the layer's (shortcut false) or the paired shortcut's (true),
 * while those values are still in cache (a few images at a time: W1's 14 x 14 planes two, its
 * 7 x 7 ones eight). It reads them and must not write them (the statistics link: a BatchNorm's
 * per-image sums, src/nn/batchnorm.c). */
typedef struct cf_conv_epilogue {
    void (*fn)(void *ctx, bool shortcut, int n0, int count);
    void *ctx;
} cf_conv_epilogue;
/* The bf16 forward with an epilogue (ep; NULL or no fn: none): x in fp32 (x_words NULL) as
 * cf_conv_bf16_forward_keep (x_kept: its words, NULL: none), or x's bf16 words alone (x_words;
 * x and x_kept NULL) as cf_conv_bf16_forward_from_kept_with; shortcut: a paired 1x1 stride-2
 * layer as there (NULL: none). y and shortcut->y are bitwise those calls'; they fail as those do
 * (CF_ERR_INVALID), and on x and x_words both given or neither. */
cf_status cf_conv_bf16_forward_each(const cf_conv_geom *g, int out_channels, const float *packed,
                                    const float *x, const uint16_t *x_words, int n_images, float *y,
                                    float *scratch, const cf_conv_shortcut *shortcut,
                                    uint16_t *x_kept, const cf_conv_epilogue *ep);
/* dy given as its bf16 words (n x out x oh x ow halves, cf_fp32_to_bf16 of dy: what a BatchNorm
 * linked to this layer writes in place of its fp32 input gradient): cf_conv_bf16_backward_words
 * is cf_conv_bf16_backward_kept, bitwise, whose weight gradient copies dy's words into its rows
 * instead of rounding dy (dy_words; NULL: dy in fp32), and the paired shortcut's likewise
 * (shortcut_dy_words, the shortcut's dy as words; NULL: dw_shortcut->dy in fp32), dx pairing those
 * rows as it does anyway; what is given as words is never read in fp32 (its fp32 pointer may be
 * NULL). The weight gradient is required (dx is made from its rows; dw NULL is an error); the
 * shortcut's words need dw_shortcut, and with dx a dx_shortcut with the same dy; and the layer must
 * take dy as words at the active level (cf_conv_bf16_takes_dy_words: the level has the rows' copy,
 * and dx reads dy only through those rows: stride 2, the 1x1 stride-2 layer, or stride 1 over
 * conv_cols; not a compact small-plane layer, whose dx gathers dy from fp32); else
 * CF_ERR_INVALID. */
bool cf_conv_bf16_takes_dy_words(const cf_conv_geom *g, int out_channels);
cf_status cf_conv_bf16_backward_words(const cf_conv_geom *g, int out_channels, const float *packed,
                                      const float *dy, const uint16_t *dy_words, const float *x,
                                      const uint16_t *x_kept, int n_images, float *dw, float *dx,
                                      float *scratch, const cf_conv_shortcut *dw_shortcut,
                                      const cf_conv_shortcut *dx_shortcut,
                                      const uint16_t *shortcut_dy_words);

/* ---- a bf16 stride-2 stem on a few channels: src/tensor/conv_stem_bf16.c --------------------- */

/* Mixed-precision Conv2d of stride 2 on 1 to 7 input channels (an RGB image's 7x7 stem), an odd
 * square kernel from 3 to 11, padding (k - 1) / 2, an even-sized image whose output width is even:
 * bf16(x) and bf16(w) (forward), bf16(x) and bf16(dy) (weight gradient), fp32 sums, through the
 * level's implicit bf16 kernel and bf16 GEMM (no fp32 patch matrix; layouts in the file's header).
 * Supported where cf_bf16_compute() and the active level has those kernels (avx512_bf16; amx
 * keeps the fp32 path: its table has no gemm_rows). forward: y (n, out, oh, ow) overwritten, w
 * the fp32 weights (out, c, k, k), no bias; wgrad: dwt (c * k * k rows x out, the weight gradient
 * transposed) overwritten or accumulated into. Each call takes cf_conv_stem_bf16_scratch floats. */
bool cf_conv_stem_bf16_supported(const cf_conv_geom *g, int out_channels);
size_t cf_conv_stem_bf16_scratch(const cf_conv_geom *g, int out_channels);
void cf_conv_stem_bf16_forward(const cf_conv_geom *g, int out_channels, const float *w,
                               const float *x, int n_images, float *y, float *scratch);
void cf_conv_stem_bf16_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                             const float *x, int n_images, float *dwt, bool accumulate,
                             float *scratch);

/* ---- which Conv2d computes in bf16 under mixed precision (to_bf16) ------------------------- */

/* The precision a Conv2d switched to bf16 (cf_conv_set_bf16, cf_learner_to_bf16) computes in,
 * decided by its shape alone, never by a timing at run time, as autocast keeps some ops in fp32:
 *   CF_CONV_BF16       8 or more input channels: every layer of W1 and W3 past the stem,
 *                      the 1x1 stride-2 shortcuts included (with their stride-2 sibling they
 *                      share its bf16 phase planes; alone they are even with fp32).
 *   CF_CONV_BF16_STEM  1 to 7 input channels with at least 64 weights per output (an RGB 7x7
 *                      stride-2 stem, K = 147) where the bf16 stem takes the shape
 *                      (cf_conv_stem_bf16_*).
 *   CF_CONV_FP32       the other layers of 1 to 7 input channels (W1's gray 3x3 stem, K = 9):
 *                      bf16 cannot win there (half of each bf16 pair of channels would be zero,
 *                      and lowered the bf16 GEMM of K = 9 lost to fp32's), and their input is
 *                      the data itself, where fp32 costs no accuracy either.
 * A layer computes in bf16 only where the active level has bf16 kernels (cf_bf16_compute());
 * the rule is the same on every level. bench/README.md has the measurements. */
typedef enum cf_conv_precision { CF_CONV_FP32, CF_CONV_BF16, CF_CONV_BF16_STEM } cf_conv_precision;
cf_conv_precision cf_conv_bf16_precision(const cf_conv_geom *g, int out_channels);

/* ---- the direct stem: 3x3 stride-1 convolutions on few channels (src/tensor/conv_stem.c) ---- */

/* A Conv2d of 1 to CF_STEM_MAX_CHANNELS input channels, 3x3, stride 1, padding 1 (W1's gray
 * stem), computed per image from the image itself: no patch matrix, no GEMM. Each output vector
 * of positions sums its K = 9 C taps with FMAs from zero in tap order (channel, ky, kx) over the
 * flat positions p = oy * w + ox, a tap outside the image reading zero: at the vector levels,
 * bitwise the lowered product (cf_im2col, then cf_sgemm_strided). The weight gradient sums each
 * (output, tap) over the image's positions in lanes (position p in lane p mod VL), then the lanes
 * as OpenBLAS 0.3.21's SkylakeX small-matrix kernel does at AVX-512 (AVX2: as simd_sgemm_nt's
 * dot kernel), and adds the images in order: its result is fixed by the shape alone, whatever
 * OpenBLAS core is loaded, and it is bitwise cf_sgemm_nt over the lowered patches, image by
 * image, only where cf_conv_stem_wgrad_as_nt says so and cf_sgemm_nt runs that kernel (a
 * SkylakeX-family core: SkylakeX, Cooperlake, SapphireRapids; OPENBLAS_CORETYPE=Haswell or Zen
 * gives other roundings). Elsewhere it differs from the lowered weight gradient in the last
 * bits. The portable loops (the generic level) sum in the same order without FMAs. */
#define CF_STEM_MAX_CHANNELS 4
#define CF_STEM_MAX_PLANE 4096
/* Whether the direct stem takes the shape: 1 to CF_STEM_MAX_CHANNELS channels, 3x3, stride 1,
 * padding 1, planes of at most CF_STEM_MAX_PLANE positions, at least one output. */
bool cf_conv_stem_supported(const cf_conv_geom *g, int out_channels);
/* Whether the shape's weight gradient is one that the direct stem reproduces bit for bit from
 * the lowered cf_sgemm_nt product with a SkylakeX-family OpenBLAS (above): one channel, 4, 8, 12
 * or 16 outputs, planes of at least 32 positions (W1's 1 -> 16 on 28x28). Conv2d takes the
 * direct weight gradient only there, so that its fp32 results stay the lowered ones. */
bool cf_conv_stem_wgrad_as_nt(const cf_conv_geom *g, int out_channels);
/* Whether the active level's kernels for the shape measured faster than the lowered product
 * (AVX-512 and up; at AVX2 and with the portable loops they lose to it, its GEMM being
 * OpenBLAS's at any level): where a Conv2d takes the direct stem. */
bool cf_conv_stem_pays(const cf_conv_geom *g, int out_channels);
/* y (n x O x h x w) of x (n x C x h x w) and w (O x C x 3 x 3); ep (NULL or no fn: none) is
 * called after each image's output is written, with (ctx, false, image, 1). CF_ERR_INVALID,
 * nothing written, where cf_conv_stem_supported refuses the shape or n_images < 0. */
cf_status cf_conv_stem_forward(const cf_conv_geom *g, int out_channels, const float *w,
                               const float *x, int n_images, float *y, const cf_conv_epilogue *ep);
/* dwt (K x O: dwt[k * O + o], the lowered weight gradient's transposed layout) = (accumulate:
 * dwt +) the sum over the n images, each image's sums added in image order, of dy (n x O x h x w)
 * times x's taps. CF_ERR_INVALID, nothing written, as cf_conv_stem_forward. */
cf_status cf_conv_stem_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                             const float *x, int n_images, float *dwt, bool accumulate);
/* Where each image's output gradient comes from: fn(ctx, i) returns image i's O planes of h x w
 * (O h w floats, read until the next call), called once per image in order just before its sums
 * are taken, on the calling thread: a layer after the convolution can write one image's dy into
 * a buffer that stays in cache instead of the whole batch's into memory. */
typedef struct cf_conv_prologue {
    const float *(*fn)(void *ctx, int image);
    void *ctx;
} cf_conv_prologue;
/* cf_conv_stem_wgrad with dy from pro (pro NULL or without fn: dy as there; with one, dy is not
 * read and may be NULL): bitwise cf_conv_stem_wgrad over the same values. Fails as it does. */
cf_status cf_conv_stem_wgrad_each(const cf_conv_geom *g, int out_channels, const float *dy,
                                  const cf_conv_prologue *pro, const float *x, int n_images,
                                  float *dwt, bool accumulate);

/* ---- grid_sample's bilinear sampling (src/tensor/grid_sample.c, the active kernel table) ---- */

/* Padding of the sampled source: zeros outside, the edge pixel repeated, or mirrored without
 * repeating the edge (PyTorch's grid_sample padding_mode with align_corners=True). */
typedef enum cf_grid_pad { CF_GRID_ZEROS, CF_GRID_BORDER, CF_GRID_REFLECTION } cf_grid_pad;

/* The most pixels one cf_grid_sample_taps call takes. */
enum { CF_GRID_CHUNK = 256 };

/* The bilinear taps of pixels j0 .. j0 + n - 1 (1 <= n <= CF_GRID_CHUNK, j0 + n <= w) of row i
 * of an h x w output sampling an h x w source through the affine grid mat (gx = mat[0][0] xn +
 * mat[0][1] yn + mat[0][2], gy likewise from mat[1], with xn, yn the
 * pixel's position in [-1, 1]) and, where warp is not NULL, the perspective warp[0..8) in double
 * ((k0 gx + k1 gy + k2) / (k6 gx + k7 gy + 1), likewise for y; a zero divisor leaves the point),
 * then grid_sample's source coordinate (align_corners) under pad; zeros hold it at -2 or n past
 * one pixel outside. idx[k n + q] is the source offset y w + x of pixel q's tap k, in the order
 * (x0, y0), (x0 + 1, y0), (x0, y0 + 1), (x0 + 1, y0 + 1), or -1 for a tap outside the source;
 * wt[k n + q] its weight. Float arithmetic in the order of that definition, without fused
 * multiply-adds: the same bits on every instruction set. */
void cf_grid_sample_taps(const float mat[2][3], const double *warp, cf_grid_pad pad, int h, int w,
                         int i, int j0, int n, int32_t *idx, float *wt);
/* out[q] = 0 + the taps' src[idx] * wt in tap order for q < n (cf_grid_sample_taps' layout; a
 * tap of index -1 adds nothing), one plane of the source at a time. */
void cf_grid_sample_gather(int n, const int32_t *idx, const float *wt, const float *src,
                           float *out);

/* ---- the softmax's reductions (src/tensor/softmax.c, the active kernel table) --------------- */

/* The largest of x[0..n) (n >= 1). */
float cf_row_max(size_t n, const float *x);
/* y[j] = exp(x[j] - shift) for j < n, the difference rounded to float as PyTorch's softmax
 * rounds it (y may be x); returns the sum of the y[j]. exp is a float approximation within 2
 * units in the last place (0 below -87.33, where float's normal range ends); the sum is taken
 * in float lanes over blocks of 512 and in double across blocks (relative error under 1e-6). A
 * NaN in x gives a NaN sum. The same function on every instruction set to float rounding. */
double cf_exp_shift_sum(size_t n, const float *x, float shift, float *y);

/* ---- GEMM on a packed B operand (src/tensor/lstm_gemm.c, the active kernel table) ---------- */

/* A B operand packed once and used for many products (the LSTM's recurrent weight, fixed over
 * the timesteps of a batch): op(B) (k x n) in panels of cf_sgemm_packed_nr() columns, panel q
 * at packed + q * k * nr, element (p, j) at p * nr + j - q * nr, zero past column n. The panels
 * of columns [j0, n) with j0 a multiple of nr are those of the sub-matrix from column j0, so a
 * caller may pack column ranges in parallel. Pack and run under the same instruction set. */
int cf_sgemm_packed_nr(void);
/* Floats cf_sgemm_pack_b writes for op(B) of k x n. */
size_t cf_sgemm_packed_floats(int n, int k);
/* Packs op(B): B (k x n, row stride ldb) or, trans_b, B^T with B (n x k, row stride ldb). */
void cf_sgemm_pack_b(bool trans_b, int n, int k, const float *b, int ldb, float *packed);
/* C (+)= A op(B), A m x k (row stride lda), C m x n (row stride ldc), op(B) packed. Each row of
 * C is summed in the same order whatever m and the row's place, so splitting the rows over
 * threads or processes gives the same values. */
void cf_sgemm_packed(int m, int n, int k, const float *a, int lda, const float *packed, float *c,
                     int ldc, bool accumulate);

#ifdef __cplusplus
}
#endif
#endif
