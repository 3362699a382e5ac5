/* BatchNorm1d / BatchNorm2d with PyTorch's semantics.
 *
 * Input (N, C) or (N, C, L) for BatchNorm1d, (N, C, H, W) for BatchNorm2d; statistics are taken
 * per channel over the other dims (M = N * L or N * H * W values). Training: normalise with the
 * batch mean and biased variance; running_mean/var move by `momentum` towards the batch mean and
 * the UNBIASED batch variance; num_batches_tracked counts forwards. Eval: the running statistics.
 * Training with M == 1 is refused when the layer is planned (PyTorch raises "Expected more than 1
 * value per channel"); should a smaller batch with M == 1 reach a planned layer anyway, the
 * output is beta and the running variance is updated with the biased (zero) variance.
 *
 * Sums are two-pass (mean, then centred squares) and accumulated in float lanes over blocks of
 * at most 4096 values, then in double. Channel planes are processed in parallel for large inputs;
 * each channel is computed by one thread in a fixed order, so results do not depend on the
 * thread count.
 *
 * Fused with a following ReLU (planned by Sequential, see nn_internal.h) the layer writes
 * max(y, 0) and, in backward, uses dy where y > 0 and 0 elsewhere in place of dy, in every path;
 * results are bitwise those of BatchNorm then ReLU. The AVX-512 planes path does not read y
 * back: it recomputes x * scale + shift with the forward's per-channel scale and shift (kept in
 * the arena), which gives y's sign exactly. As the last layer of a residual block's idpath it
 * may also be asked to write the block's max(a + y, 0) for one forward (the backward is then
 * the plain one: the block masks the gradient). */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <math.h>
#include <string.h>

enum { P_WEIGHT, P_BIAS, P_RMEAN, P_RVAR, P_COUNT };

typedef struct bn_impl {
    int features;
    bool spatial;
    float eps, momentum;
    bool fwd_training;     /* mode of the last forward */
    const cf_module *relu; /* the ReLU fused after this layer (planned by Sequential) */
    bool fwd_relu;         /* the last forward applied the ReLU */
    const float *add;      /* residual for the next forward only: y = max(bn(x) + add, 0) */
    /* scratch from the arena, per channel */
    float *mean, *invstd; /* statistics the last forward used */
    float *coef;          /* 3C: backward coefficients (1d path) */
    double *acc;          /* 2C: sums */
    float *ss;            /* 2C: scale and shift of the last forward (planes paths) */
} bn_impl;

#define LANES 16
#define BLOCK 4096

/* The upstream gradient at i in the portable and rows paths: dy, or, with a fused ReLU whose
 * output is y, dy where y > 0 and 0 elsewhere (ReLU's backward). */
#define DY_AT(i) (y && !(y[i] > 0.0f) ? 0.0f : dy[i])

#if !defined(__AVX512F__) /* the portable paths (the AVX-512 ones follow) */
static double sum_plane(const float *restrict x, int64_t n) {
    double total = 0;
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t e = b + BLOCK < n ? b + BLOCK : n, i = b;
        float lane[LANES] = {0};
        for (; i + LANES <= e; i += LANES)
            for (int k = 0; k < LANES; k++) lane[k] += x[i + k];
        for (; i < e; i++) total += x[i];
        for (int k = 0; k < LANES; k++) total += lane[k];
    }
    return total;
}

static double sqdev_plane(const float *restrict x, int64_t n, float mean) {
    double total = 0;
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t e = b + BLOCK < n ? b + BLOCK : n, i = b;
        float lane[LANES] = {0};
        for (; i + LANES <= e; i += LANES)
            for (int k = 0; k < LANES; k++) {
                float d = x[i + k] - mean;
                lane[k] += d * d;
            }
        for (; i < e; i++) total += (double)(x[i] - mean) * (x[i] - mean);
        for (int k = 0; k < LANES; k++) total += lane[k];
    }
    return total;
}

/* sum(dy) and sum(dy * (x - mean)) over a plane; y: the fused ReLU's output, or NULL. */
static void dy_sums_plane(const float *restrict dy, const float *restrict x,
                          const float *restrict y, int64_t n, float mean, double *sdy,
                          double *sdyx) {
    double t1 = 0, t2 = 0;
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t e = b + BLOCK < n ? b + BLOCK : n, i = b;
        float l1[LANES] = {0}, l2[LANES] = {0};
        for (; i + LANES <= e; i += LANES)
            for (int k = 0; k < LANES; k++) {
                const float g = DY_AT(i + k);
                l1[k] += g;
                l2[k] += g * (x[i + k] - mean);
            }
        for (; i < e; i++) {
            const float g = DY_AT(i);
            t1 += g;
            t2 += (double)g * (x[i] - mean);
        }
        for (int k = 0; k < LANES; k++) {
            t1 += l1[k];
            t2 += l2[k];
        }
    }
    *sdy += t1;
    *sdyx += t2;
}

#endif

#if defined(__AVX512F__)
#include <immintrin.h>
/* AVX-512 paths for the channel planes of BatchNorm2d: planes are short (49 to 784 values in W1)
 * and rarely a multiple of 16, so the lane accumulators run across the planes of a channel and
 * each plane's tail is one masked load; the lanes are flushed into double every FLUSH values
 * (a float lane then holds the sum of at most FLUSH / 16 values). The statistics take one pass:
 * sums of d = x - k and d^2 with k the channel's first value (the shifted-data algorithm: exact
 * in exact arithmetic, and accurate while k lies within a few deviations of the mean, which the
 * first value of a channel does), var = E[d^2] - E[d]^2. */
#define BN_AVX512 1
#define FLUSH (1 << 14)

static inline double hsum_d(__m512 v) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

static inline __mmask16 tail_mask(int64_t s) {
    return (__mmask16)((1u << (s & 15)) - 1u);
}

/* sum(x - k) and sum((x - k)^2) over the n planes x + i*stride (s values each). */
static void shifted_sums_v(const float *x, int n, size_t stride, int64_t s, float k, double *s1,
                           double *s2) {
    const int64_t full = s & ~(int64_t)15;
    const __mmask16 tail = tail_mask(s);
    const __m512 kk = _mm512_set1_ps(k);
    __m512 a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps();
    double t1 = 0, t2 = 0;
    int64_t since = 0;
    for (int p = 0; p < n; p++) {
        const float *xp = x + (size_t)p * stride;
        for (int64_t i = 0; i < full; i += 16) {
            __m512 d = _mm512_sub_ps(_mm512_loadu_ps(xp + i), kk);
            a1 = _mm512_add_ps(a1, d);
            a2 = _mm512_fmadd_ps(d, d, a2);
        }
        if (tail) {
            __m512 d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, xp + full), kk);
            a1 = _mm512_add_ps(a1, d);
            a2 = _mm512_fmadd_ps(d, d, a2);
        }
        if ((since += s) >= FLUSH) {
            t1 += hsum_d(a1);
            t2 += hsum_d(a2);
            a1 = a2 = _mm512_setzero_ps();
            since = 0;
        }
    }
    *s1 = t1 + hsum_d(a1);
    *s2 = t2 + hsum_d(a2);
}

/* y = x * scale + shift over the n planes. */
static void affine_v(const float *x, float *y, int n, size_t stride, int64_t s, float scale,
                     float shift) {
    const int64_t full = s & ~(int64_t)15;
    const __mmask16 tail = tail_mask(s);
    const __m512 a = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift);
    for (int p = 0; p < n; p++) {
        const float *xp = x + (size_t)p * stride;
        float *yp = y + (size_t)p * stride;
        for (int64_t i = 0; i < full; i += 16)
            _mm512_storeu_ps(yp + i, _mm512_fmadd_ps(_mm512_loadu_ps(xp + i), a, b));
        if (tail)
            _mm512_mask_storeu_ps(yp + full, tail,
                                  _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, xp + full), a, b));
    }
}

/* y = max(x * scale + shift, 0) over the n planes. max_ps(z, 0) returns its second operand
 * unless z > 0, as ReLU's z > 0 ? z : 0 (NaN and -0 give +0). */
static void affine_relu_v(const float *x, float *y, int n, size_t stride, int64_t s, float scale,
                          float shift) {
    const int64_t full = s & ~(int64_t)15;
    const __mmask16 tail = tail_mask(s);
    const __m512 a = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift), z = _mm512_setzero_ps();
    for (int p = 0; p < n; p++) {
        const float *xp = x + (size_t)p * stride;
        float *yp = y + (size_t)p * stride;
        for (int64_t i = 0; i < full; i += 16)
            _mm512_storeu_ps(yp + i,
                             _mm512_max_ps(_mm512_fmadd_ps(_mm512_loadu_ps(xp + i), a, b), z));
        if (tail)
            _mm512_mask_storeu_ps(
                yp + full, tail,
                _mm512_max_ps(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, xp + full), a, b), z));
    }
}

/* y = max(a + (x * scale + shift), 0) over the n planes (a residual block's add and ReLU). */
static void affine_add_relu_v(const float *x, const float *add, float *y, int n, size_t stride,
                              int64_t s, float scale, float shift) {
    const int64_t full = s & ~(int64_t)15;
    const __mmask16 tail = tail_mask(s);
    const __m512 a = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift), z = _mm512_setzero_ps();
    for (int p = 0; p < n; p++) {
        const float *xp = x + (size_t)p * stride, *ap = add + (size_t)p * stride;
        float *yp = y + (size_t)p * stride;
        for (int64_t i = 0; i < full; i += 16) {
            __m512 t = _mm512_fmadd_ps(_mm512_loadu_ps(xp + i), a, b);
            _mm512_storeu_ps(yp + i, _mm512_max_ps(_mm512_add_ps(_mm512_loadu_ps(ap + i), t), z));
        }
        if (tail) {
            __m512 t = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, xp + full), a, b);
            __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(tail, ap + full), t);
            _mm512_mask_storeu_ps(yp + full, tail, _mm512_max_ps(v, z));
        }
    }
}

/* The lanes of m where the fused ReLU's output is positive: x * scale + shift > 0, computed as
 * the forward computed it (relu false: m itself). */
static inline __mmask16 relu_lanes(__mmask16 m, bool relu, __m512 x, __m512 a, __m512 b) {
    if (!relu) return m;
    return _mm512_mask_cmp_ps_mask(m, _mm512_fmadd_ps(x, a, b), _mm512_setzero_ps(), _CMP_GT_OQ);
}

/* sum(dy) and sum(dy * (x - mean)) over the n planes; relu: dy only where the fused ReLU's
 * output (x * scale + shift > 0) is positive. */
static void dy_sums_v(const float *dy, const float *x, int n, size_t stride, int64_t s, float mean,
                      bool relu, float scale, float shift, double *sdy, double *sdyx) {
    const int64_t full = s & ~(int64_t)15;
    const __mmask16 tail = tail_mask(s);
    const __m512 m = _mm512_set1_ps(mean), sa = _mm512_set1_ps(scale), sb = _mm512_set1_ps(shift);
    __m512 a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps();
    double t1 = 0, t2 = 0;
    int64_t since = 0;
    for (int p = 0; p < n; p++) {
        const float *gp = dy + (size_t)p * stride, *xp = x + (size_t)p * stride;
        for (int64_t i = 0; i < full; i += 16) {
            __m512 xv = _mm512_loadu_ps(xp + i);
            __m512 g = relu ? _mm512_maskz_loadu_ps(relu_lanes(0xffff, true, xv, sa, sb), gp + i)
                            : _mm512_loadu_ps(gp + i);
            a1 = _mm512_add_ps(a1, g);
            a2 = _mm512_fmadd_ps(g, _mm512_sub_ps(xv, m), a2);
        }
        if (tail) {
            __m512 xv = _mm512_maskz_loadu_ps(tail, xp + full);
            __m512 g = _mm512_maskz_loadu_ps(relu_lanes(tail, relu, xv, sa, sb), gp + full);
            a1 = _mm512_add_ps(a1, g);
            a2 = _mm512_fmadd_ps(g, _mm512_sub_ps(xv, m), a2);
        }
        if ((since += s) >= FLUSH) {
            t1 += hsum_d(a1);
            t2 += hsum_d(a2);
            a1 = a2 = _mm512_setzero_ps();
            since = 0;
        }
    }
    *sdy += t1 + hsum_d(a1);
    *sdyx += t2 + hsum_d(a2);
}

/* dx = k1 * dy + k2 * (x - mean) + k3 over the n planes (relu: as in dy_sums_v). */
static void dx_v(const float *dy, const float *x, float *dx, int n, size_t stride, int64_t s,
                 float mean, float k1, float k2, float k3, bool relu, float scale, float shift) {
    const int64_t full = s & ~(int64_t)15;
    const __mmask16 tail = tail_mask(s);
    const __m512 m = _mm512_set1_ps(mean), a = _mm512_set1_ps(k1), b = _mm512_set1_ps(k2),
                 c = _mm512_set1_ps(k3), sa = _mm512_set1_ps(scale), sb = _mm512_set1_ps(shift);
    for (int p = 0; p < n; p++) {
        const float *gp = dy + (size_t)p * stride, *xp = x + (size_t)p * stride;
        float *op = dx + (size_t)p * stride;
        for (int64_t i = 0; i < full; i += 16) {
            __m512 xv = _mm512_loadu_ps(xp + i);
            __m512 g = relu ? _mm512_maskz_loadu_ps(relu_lanes(0xffff, true, xv, sa, sb), gp + i)
                            : _mm512_loadu_ps(gp + i);
            __m512 t = _mm512_fmadd_ps(b, _mm512_sub_ps(xv, m), c);
            _mm512_storeu_ps(op + i, _mm512_fmadd_ps(a, g, t));
        }
        if (tail) {
            __m512 xv = _mm512_maskz_loadu_ps(tail, xp + full);
            __m512 g = _mm512_maskz_loadu_ps(relu_lanes(tail, relu, xv, sa, sb), gp + full);
            __m512 t = _mm512_fmadd_ps(b, _mm512_sub_ps(xv, m), c);
            _mm512_mask_storeu_ps(op + full, tail, _mm512_fmadd_ps(a, g, t));
        }
    }
}
#endif

typedef struct geom {
    int n, c;
    int64_t s; /* values per sample and channel */
} geom;

static geom geometry(const cf_shape *in) {
    geom g = {in->dim[0], in->dim[1], 1};
    for (int i = 2; i < in->ndim; i++) g.s *= in->dim[i];
    return g;
}

static const char *bn_name(const cf_module *m) {
    return m->ops->kind;
}

static cf_status bn_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    bn_impl *b = m->impl;
    bool ok = b->spatial ? in->ndim == 4 : (in->ndim == 2 || in->ndim == 3);
    if (!ok || in->dim[1] != b->features) {
        char s[64];
        return cf_fail(CF_ERR_INVALID, "%s(%d): input %s does not fit (expected %s)", bn_name(m),
                       b->features, cf_shape_str(in, s, sizeof s),
                       b->spatial ? "(N, C, H, W)" : "(N, C) or (N, C, L)");
    }
    geom g = geometry(in);
    if (m->training && (int64_t)g.n * g.s < 2) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "%s(%d): expected more than 1 value per channel when training, got input %s",
                       bn_name(m), b->features, cf_shape_str(in, s, sizeof s));
    }
    *out = *in;
    return CF_OK;
}

static void bn_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    bn_impl *b = m->impl;
    size_t c = (size_t)b->features;
    cf_module_plan_default(m, in, arena);
    b->mean = cf_arena_floats(arena, c);
    b->invstd = cf_arena_floats(arena, c);
    b->coef = cf_arena_floats(arena, 3 * c);
    b->acc = cf_arena_bytes(arena, 2 * c * sizeof(double));
    b->ss = cf_arena_floats(arena, 2 * c);
}

static const cf_module_ops bn1d_ops, bn2d_ops;

bool cf_nn_is_batchnorm(const cf_module *m) {
    return m && (m->ops == &bn1d_ops || m->ops == &bn2d_ops);
}

void cf_nn_bn_fuse_relu(cf_module *bn, const cf_module *relu) {
    ((bn_impl *)bn->impl)->relu = relu;
}

void cf_nn_bn_add_relu_next(cf_module *bn, const float *add) {
    ((bn_impl *)bn->impl)->add = add;
}

bool cf_nn_bn_fused_with(const cf_module *bn, const cf_module *relu) {
    return relu && ((const bn_impl *)bn->impl)->relu == relu;
}

static void bn_init(cf_module *m, cf_rng *rng) {
    (void)rng;
    int c = ((bn_impl *)m->impl)->features;
    for (int i = 0; i < c; i++) {
        m->params[P_WEIGHT].data[i] = 1.0f;
        m->params[P_BIAS].data[i] = 0.0f;
        m->params[P_RMEAN].data[i] = 0.0f;
        m->params[P_RVAR].data[i] = 1.0f;
    }
    m->params[P_COUNT].data[0] = 0.0f;
}

/* ---- forward ------------------------------------------------------------------------------- */

typedef struct bn_ctx {
    cf_module *m;
    const float *x, *dy;
    float *y, *dx;
    geom g;
    bool training, need_dx, grads;
    bool relu;        /* fused ReLU (forward: apply it; backward: mask dy) */
    const float *add; /* forward: y = max(add + bn(x), 0) (a residual block's sum) */
} bn_ctx;

/* Channel planes (s > 1): statistics (training) and output for channels [c0, c1). */
static void bn_forward_planes(void *vctx, int64_t c0, int64_t c1, int thread) {
    (void)thread;
    bn_ctx *ctx = vctx;
    bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    const double count = (double)g.n * (double)g.s;
    const float *gamma = ctx->m->params[P_WEIGHT].data, *beta = ctx->m->params[P_BIAS].data;
#ifdef BN_AVX512
    /* Sample-major: the planes of channels [c0, c1) of one sample are contiguous, so memory is
     * read in order (a channel-major walk jumps a whole sample per plane and defeats the
     * prefetchers). Each plane's sums go into double per channel; the order of the additions
     * per channel is fixed (sample 0, 1, ...), whatever the channel split. */
    const size_t cs = (size_t)g.s;
    if (ctx->training) {
        double *s1 = b->acc, *s2 = b->acc + g.c;
        for (int64_t c = c0; c < c1; c++) s1[c] = s2[c] = 0;
        for (int n = 0; n < g.n; n++) {
            const float *xn = ctx->x + (size_t)n * g.c * cs;
            for (int64_t c = c0; c < c1; c++) {
                double a1, a2;
                shifted_sums_v(xn + c * cs, 1, 0, g.s, ctx->x[c * cs], &a1, &a2);
                s1[c] += a1;
                s2[c] += a2;
            }
        }
        for (int64_t c = c0; c < c1; c++) {
            const double d = s1[c] / count;
            double v = s2[c] / count - d * d;
            if (v < 0) v = 0;
            b->mean[c] = (float)(ctx->x[c * cs] + d);
            b->acc[c] = v; /* the biased variance, for the running statistics */
            b->invstd[c] = (float)(1.0 / sqrt(v + b->eps));
        }
    }
    float *scale = b->ss, *shift = b->ss + g.c;
    for (int64_t c = c0; c < c1; c++) {
        scale[c] = gamma[c] * b->invstd[c];
        shift[c] = beta[c] - b->mean[c] * scale[c];
    }
    for (int n = 0; n < g.n; n++) {
        const size_t at = (size_t)n * g.c * cs;
        if (ctx->add)
            for (int64_t c = c0; c < c1; c++)
                affine_add_relu_v(ctx->x + at + c * cs, ctx->add + at + c * cs,
                                  ctx->y + at + c * cs, 1, 0, g.s, scale[c], shift[c]);
        else if (ctx->relu)
            for (int64_t c = c0; c < c1; c++)
                affine_relu_v(ctx->x + at + c * cs, ctx->y + at + c * cs, 1, 0, g.s, scale[c],
                              shift[c]);
        else
            for (int64_t c = c0; c < c1; c++)
                affine_v(ctx->x + at + c * cs, ctx->y + at + c * cs, 1, 0, g.s, scale[c], shift[c]);
    }
#else
    for (int64_t c = c0; c < c1; c++) {
        const float *xc = ctx->x + (size_t)c * g.s;
        float *yc = ctx->y + (size_t)c * g.s;
        const size_t stride = (size_t)g.c * g.s; /* from one sample's plane to the next */
        if (ctx->training) {
            double s = 0;
            for (int n = 0; n < g.n; n++) s += sum_plane(xc + n * stride, g.s);
            float mean = (float)(s / count);
            double v = 0;
            for (int n = 0; n < g.n; n++) v += sqdev_plane(xc + n * stride, g.s, mean);
            v /= count;
            b->mean[c] = mean;
            b->acc[c] = v;
            b->invstd[c] = (float)(1.0 / sqrt(v + b->eps));
        }
        const float scale = gamma[c] * b->invstd[c], shift = beta[c] - b->mean[c] * scale;
        b->ss[c] = scale;
        b->ss[g.c + c] = shift;
        for (int n = 0; n < g.n; n++) {
            const float *restrict xp = xc + n * stride;
            float *restrict yp = yc + n * stride;
            if (ctx->add) {
                const float *restrict ap = ctx->add + (size_t)c * g.s + n * stride;
                for (int64_t i = 0; i < g.s; i++) {
                    const float t = xp[i] * scale + shift, v = ap[i] + t;
                    yp[i] = v > 0.0f ? v : 0.0f;
                }
            } else if (ctx->relu)
                for (int64_t i = 0; i < g.s; i++) {
                    const float v = xp[i] * scale + shift;
                    yp[i] = v > 0.0f ? v : 0.0f;
                }
            else
                for (int64_t i = 0; i < g.s; i++) yp[i] = xp[i] * scale + shift;
        }
    }
#endif
}

/* Rows of features (s == 1): statistics across the batch, feature-vectorised. */
static void bn_forward_rows(bn_ctx *ctx) {
    bn_impl *b = ctx->m->impl;
    const int n = ctx->g.n, c = ctx->g.c;
    const float *gamma = ctx->m->params[P_WEIGHT].data, *beta = ctx->m->params[P_BIAS].data;
    float *restrict mean = b->mean, *restrict invstd = b->invstd;
    float *restrict scale = b->coef, *restrict shift = b->coef + c;
    if (ctx->training) {
        double *restrict s = b->acc, *restrict v = b->acc + c;
        for (int f = 0; f < c; f++) s[f] = v[f] = 0;
        for (int i = 0; i < n; i++) {
            const float *xr = ctx->x + (size_t)i * c;
            for (int f = 0; f < c; f++) s[f] += xr[f];
        }
        for (int f = 0; f < c; f++) mean[f] = (float)(s[f] / n);
        for (int i = 0; i < n; i++) {
            const float *xr = ctx->x + (size_t)i * c;
            for (int f = 0; f < c; f++) {
                double d = xr[f] - mean[f];
                v[f] += d * d;
            }
        }
        for (int f = 0; f < c; f++) {
            s[f] = v[f] / n; /* biased variance, kept in acc[0..c) as the planes path does */
            invstd[f] = (float)(1.0 / sqrt(s[f] + b->eps));
        }
    }
    for (int f = 0; f < c; f++) {
        scale[f] = gamma[f] * invstd[f];
        shift[f] = beta[f] - mean[f] * scale[f];
    }
    for (int i = 0; i < n; i++) {
        const float *restrict xr = ctx->x + (size_t)i * c;
        float *restrict yr = ctx->y + (size_t)i * c;
        if (ctx->add) {
            const float *restrict ar = ctx->add + (size_t)i * c;
            for (int f = 0; f < c; f++) {
                const float t = xr[f] * scale[f] + shift[f], v = ar[f] + t;
                yr[f] = v > 0.0f ? v : 0.0f;
            }
        } else if (ctx->relu)
            for (int f = 0; f < c; f++) {
                const float v = xr[f] * scale[f] + shift[f];
                yr[f] = v > 0.0f ? v : 0.0f;
            }
        else
            for (int f = 0; f < c; f++) yr[f] = xr[f] * scale[f] + shift[f];
    }
}

static bool worth_threads(const geom *g) {
    return g->c > 1 && (int64_t)g->n * g->c * g->s >= (1 << 15) && cf_get_num_threads() > 1;
}

static const cf_tensor *bn_forward(cf_module *m, const cf_tensor *x) {
    bn_impl *b = m->impl;
    m->in = x;
    cf_tensor *y = cf_module_output(m, &x->shape);
    bn_ctx ctx = {.m = m,
                  .x = x->data,
                  .y = y->data,
                  .g = geometry(&x->shape),
                  .training = m->training,
                  .relu = b->relu != NULL,
                  .add = b->add};
    const int c = ctx.g.c;
    b->add = NULL;
    b->fwd_training = m->training;
    b->fwd_relu = ctx.relu;
    if (!m->training) {
        const float *rm = m->params[P_RMEAN].data, *rv = m->params[P_RVAR].data;
        for (int f = 0; f < c; f++) {
            b->mean[f] = rm[f];
            b->invstd[f] = (float)(1.0 / sqrt((double)rv[f] + b->eps));
        }
    }
    if (ctx.g.s == 1)
        bn_forward_rows(&ctx);
    else if (worth_threads(&ctx.g))
        cf_parallel_for(c, bn_forward_planes, &ctx);
    else
        bn_forward_planes(&ctx, 0, c, 0);
    if (m->training) {
        const double count = (double)ctx.g.n * (double)ctx.g.s;
        const double unbias = count > 1 ? count / (count - 1) : 1.0, mom = b->momentum;
        float *rm = m->params[P_RMEAN].data, *rv = m->params[P_RVAR].data;
        for (int f = 0; f < c; f++) {
            rm[f] = (float)((1 - mom) * rm[f] + mom * b->mean[f]);
            rv[f] = (float)((1 - mom) * rv[f] + mom * b->acc[f] * unbias);
        }
        m->params[P_COUNT].data[0] += 1.0f;
    }
    return y;
}

/* ---- backward ------------------------------------------------------------------------------ */

static void bn_backward_planes(void *vctx, int64_t c0, int64_t c1, int thread) {
    (void)thread;
    bn_ctx *ctx = vctx;
    cf_module *m = ctx->m;
    bn_impl *b = m->impl;
    const geom g = ctx->g;
    const double count = (double)g.n * (double)g.s;
    const float *gamma = m->params[P_WEIGHT].data;
#ifdef BN_AVX512
    /* sample-major, as the forward pass */
    const size_t cs = (size_t)g.s;
    {
        double *sdy = b->acc, *sdyx = b->acc + g.c;
        for (int64_t c = c0; c < c1; c++) sdy[c] = sdyx[c] = 0;
        for (int n = 0; n < g.n; n++) {
            const size_t at = (size_t)n * g.c * cs;
            for (int64_t c = c0; c < c1; c++)
                dy_sums_v(ctx->dy + at + c * cs, ctx->x + at + c * cs, 1, 0, g.s, b->mean[c],
                          ctx->relu, b->ss[c], b->ss[g.c + c], &sdy[c], &sdyx[c]);
        }
        float *k = b->coef; /* k1, k2, k3 per channel */
        for (int64_t c = c0; c < c1; c++) {
            const float invstd = b->invstd[c];
            if (ctx->grads) {
                if (m->params[P_WEIGHT].trainable)
                    m->params[P_WEIGHT].grad[c] += (float)(sdyx[c] * invstd);
                if (m->params[P_BIAS].trainable) m->params[P_BIAS].grad[c] += (float)sdy[c];
            }
            const float k1 = gamma[c] * invstd;
            k[c] = k1;
            k[g.c + c] =
                ctx->training ? (float)(-(double)k1 * invstd * invstd * sdyx[c] / count) : 0;
            k[2 * g.c + c] = ctx->training ? (float)(-(double)k1 * sdy[c] / count) : 0;
        }
        if (!ctx->need_dx) return;
        for (int n = 0; n < g.n; n++) {
            const size_t at = (size_t)n * g.c * cs;
            for (int64_t c = c0; c < c1; c++)
                dx_v(ctx->dy + at + c * cs, ctx->x + at + c * cs, ctx->dx + at + c * cs, 1, 0, g.s,
                     b->mean[c], k[c], k[g.c + c], k[2 * g.c + c], ctx->relu, b->ss[c],
                     b->ss[g.c + c]);
        }
    }
#else
    for (int64_t c = c0; c < c1; c++) {
        const float mean = b->mean[c], invstd = b->invstd[c];
        const size_t stride = (size_t)g.c * g.s;
        const float *dyc = ctx->dy + (size_t)c * g.s, *xc = ctx->x + (size_t)c * g.s;
        const float *yc = ctx->relu ? ctx->y + (size_t)c * g.s : NULL;
        double sdy = 0, sdyx = 0;
        for (int n = 0; n < g.n; n++)
            dy_sums_plane(dyc + n * stride, xc + n * stride, yc ? yc + n * stride : NULL, g.s, mean,
                          &sdy, &sdyx);
        if (ctx->grads) {
            if (m->params[P_WEIGHT].trainable)
                m->params[P_WEIGHT].grad[c] += (float)(sdyx * invstd);
            if (m->params[P_BIAS].trainable) m->params[P_BIAS].grad[c] += (float)sdy;
        }
        if (!ctx->need_dx) continue;
        /* dx = k1 * dy + k2 * (x - mean) + k3 */
        const float k1 = gamma[c] * invstd;
        float k2 = 0, k3 = 0;
        if (ctx->training) {
            k2 = (float)(-(double)k1 * invstd * invstd * sdyx / count);
            k3 = (float)(-(double)k1 * sdy / count);
        }
        float *dxc = ctx->dx + (size_t)c * g.s;
        for (int n = 0; n < g.n; n++) {
            const float *restrict dy = dyc + n * stride, *restrict xp = xc + n * stride;
            const float *restrict y = yc ? yc + n * stride : NULL;
            float *restrict dxp = dxc + n * stride;
            for (int64_t i = 0; i < g.s; i++) dxp[i] = k1 * DY_AT(i) + k2 * (xp[i] - mean) + k3;
        }
    }
#endif
}

static void bn_backward_rows(bn_ctx *ctx) {
    cf_module *m = ctx->m;
    bn_impl *b = m->impl;
    const int n = ctx->g.n, c = ctx->g.c;
    const float *gamma = m->params[P_WEIGHT].data, *mean = b->mean, *invstd = b->invstd;
    double *restrict sdy = b->acc, *restrict sdyx = b->acc + c;
    for (int f = 0; f < c; f++) sdy[f] = sdyx[f] = 0;
    for (int i = 0; i < n; i++) {
        const float *dy = ctx->dy + (size_t)i * c, *xr = ctx->x + (size_t)i * c;
        const float *y = ctx->relu ? ctx->y + (size_t)i * c : NULL;
        for (int f = 0; f < c; f++) {
            const float g = DY_AT(f);
            sdy[f] += g;
            sdyx[f] += (double)g * (xr[f] - mean[f]);
        }
    }
    if (ctx->grads && m->params[P_WEIGHT].trainable)
        for (int f = 0; f < c; f++) m->params[P_WEIGHT].grad[f] += (float)(sdyx[f] * invstd[f]);
    if (ctx->grads && m->params[P_BIAS].trainable)
        for (int f = 0; f < c; f++) m->params[P_BIAS].grad[f] += (float)sdy[f];
    if (!ctx->need_dx) return;
    float *restrict k1 = b->coef, *restrict k2 = b->coef + c, *restrict k3 = b->coef + 2 * c;
    for (int f = 0; f < c; f++) {
        k1[f] = gamma[f] * invstd[f];
        k2[f] = ctx->training ? (float)(-(double)k1[f] * invstd[f] * invstd[f] * sdyx[f] / n) : 0;
        k3[f] = ctx->training ? (float)(-(double)k1[f] * sdy[f] / n) : 0;
    }
    for (int i = 0; i < n; i++) {
        const float *restrict dy = ctx->dy + (size_t)i * c, *restrict xr = ctx->x + (size_t)i * c;
        const float *restrict y = ctx->relu ? ctx->y + (size_t)i * c : NULL;
        float *restrict dxr = ctx->dx + (size_t)i * c;
        for (int f = 0; f < c; f++) dxr[f] = k1[f] * DY_AT(f) + k2[f] * (xr[f] - mean[f]) + k3[f];
    }
}

static const cf_tensor *bn_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    bn_impl *b = m->impl;
    bool grads = m->params[P_WEIGHT].trainable || m->params[P_BIAS].trainable;
    if (!grads && !need_dx) return NULL;
    cf_tensor *dx = need_dx ? cf_module_input_grad(m) : NULL;
    bn_ctx ctx = {.m = m,
                  .x = m->in->data,
                  .dy = dy->data,
                  .dx = dx ? dx->data : NULL,
                  .g = geometry(&m->in->shape),
                  .training = b->fwd_training,
                  .need_dx = need_dx,
                  .grads = grads,
                  .relu = b->fwd_relu,
                  .y = b->fwd_relu ? m->out.data : NULL};
    if (ctx.g.s == 1)
        bn_backward_rows(&ctx);
    else if (worth_threads(&ctx.g))
        cf_parallel_for(ctx.g.c, bn_backward_planes, &ctx);
    else
        bn_backward_planes(&ctx, 0, ctx.g.c, 0);
    return dx;
}

static const cf_module_ops bn1d_ops = {
    .kind = "BatchNorm1d",
    .out_shape = bn_out_shape,
    .plan = bn_plan,
    .init = bn_init,
    .forward = bn_forward,
    .backward = bn_backward,
};
static const cf_module_ops bn2d_ops = {
    .kind = "BatchNorm2d",
    .out_shape = bn_out_shape,
    .plan = bn_plan,
    .init = bn_init,
    .forward = bn_forward,
    .backward = bn_backward,
};

cf_module *cf_batchnorm_ex(int features, bool spatial, float eps, float momentum) {
    if (features < 1 || !(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f)) {
        cf_fail(CF_ERR_INVALID,
                "cf_batchnorm: features %d must be >= 1, eps %g > 0, momentum %g in [0, 1]",
                features, (double)eps, (double)momentum);
        return NULL;
    }
    bn_impl *b = cf_calloc(1, sizeof *b);
    if (!b) return NULL;
    b->features = features;
    b->spatial = spatial;
    b->eps = eps;
    b->momentum = momentum;
    cf_module *m = cf_module_new(spatial ? &bn2d_ops : &bn1d_ops, b);
    if (!m) return NULL;
    cf_module_add_param(m, "weight", CF_PARAM_NORM, cf_shape1(features));
    cf_module_add_param(m, "bias", CF_PARAM_NORM, cf_shape1(features));
    cf_module_add_param(m, "running_mean", CF_PARAM_BUFFER, cf_shape1(features));
    cf_module_add_param(m, "running_var", CF_PARAM_BUFFER, cf_shape1(features));
    cf_module_add_param(m, "num_batches_tracked", CF_PARAM_COUNTER, cf_shape1(1));
    return m;
}

cf_module *cf_batchnorm1d(int features) {
    return cf_batchnorm_ex(features, false, 1e-5f, 0.1f);
}
cf_module *cf_batchnorm2d(int channels) {
    return cf_batchnorm_ex(channels, true, 1e-5f, 0.1f);
}
