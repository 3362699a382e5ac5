/* Pooling layers on NCHW images: MaxPool2d, AvgPool2d (count_include_pad), the adaptive
 * average and max pools (PyTorch's windows start = floor(i*H/oh), end = ceil((i+1)*H/oh)), and
 * fastai's AdaptiveConcatPool2d (max then average over the whole image). Every (n, c) plane is
 * independent, so the planes are split over the thread pool. Max pools keep the argmax of each
 * window (first maximum, like PyTorch; NaN wins) to route the gradient in backward. */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef enum pool_kind {
    POOL_MAX,
    POOL_AVG,
    POOL_ADAPTIVE_MAX,
    POOL_ADAPTIVE_AVG,
    POOL_CONCAT, /* (N, C, H, W) -> (N, 2C, 1, 1): [max | mean] */
} pool_kind;

typedef struct pool_impl {
    pool_kind kind;
    int k, stride, pad; /* fixed windows */
    int out_h, out_w;   /* adaptive output size */
    int32_t *idx;       /* argmax (offset in its plane) of every max output, from the arena */
    /* the call in progress */
    int C, H, W, OH, OW;
    const float *x, *dy;
    float *y, *dx;
    bool stream; /* the backward's dx written with non-temporal stores (POOL_STREAM_BYTES) */
} pool_impl;

/* The 3x3 stride 2 backward writes dx with non-temporal stores from this many bytes of dx (W3's
 * stem pool: 64 MiB): each plane's dx is written once, in whole lines, and is far larger than the
 * caches, so plain stores would first read every line from memory. As BatchNorm's
 * BN_STREAM_BYTES (src/nn/batchnorm.c). */
#define POOL_STREAM_BYTES ((size_t)32 << 20)

static bool is_max(pool_kind k) {
    return k == POOL_MAX || k == POOL_ADAPTIVE_MAX || k == POOL_CONCAT;
}

static const char *pool_repr(const cf_module *m, char *buf, size_t size) {
    const pool_impl *p = m->impl;
    if (p->kind == POOL_MAX || p->kind == POOL_AVG)
        snprintf(buf, size, "%s(kernel_size=%d, stride=%d, padding=%d)", m->ops->kind, p->k,
                 p->stride, p->pad);
    else if (p->kind == POOL_CONCAT)
        snprintf(buf, size, "%s()", m->ops->kind);
    else
        snprintf(buf, size, "%s(output_size=(%d, %d))", m->ops->kind, p->out_h, p->out_w);
    return buf;
}

static cf_status pool_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    pool_impl *p = m->impl;
    char r[96], s[64];
    if (in->ndim != 4)
        return cf_fail(CF_ERR_INVALID, "%s: expects a 4-D input (N, C, H, W), got %s",
                       pool_repr(m, r, sizeof r), cf_shape_str(in, s, sizeof s));
    const int n = in->dim[0], c = in->dim[1], h = in->dim[2], w = in->dim[3];
    switch (p->kind) {
    case POOL_MAX:
    case POOL_AVG: {
        cf_conv_geom g;
        if (!cf_conv_geom_init(&g, c, h, w, p->k, p->k, p->stride, p->stride, p->pad, p->pad))
            return cf_fail(CF_ERR_INVALID,
                           "%s: input %s is smaller than the kernel (padded %dx%d < %dx%d)",
                           pool_repr(m, r, sizeof r), cf_shape_str(in, s, sizeof s), h + 2 * p->pad,
                           w + 2 * p->pad, p->k, p->k);
        *out = cf_shape4(n, c, g.oh, g.ow);
        break;
    }
    case POOL_ADAPTIVE_MAX:
    case POOL_ADAPTIVE_AVG:
        *out = cf_shape4(n, c, p->out_h, p->out_w);
        break;
    case POOL_CONCAT:
        *out = cf_shape4(n, 2 * c, 1, 1);
        break;
    }
    return CF_OK;
}

static void pool_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    pool_impl *p = m->impl;
    cf_module_plan_default(m, in, arena);
    if (is_max(p->kind)) {
        size_t n = (size_t)in->dim[0] * in->dim[1];
        if (p->kind != POOL_CONCAT) n = cf_shape_numel(&m->out.shape);
        p->idx = cf_arena_bytes(arena, n * sizeof(int32_t));
    }
}

/* The input rows [*lo, *hi) of output row i, and for the fixed windows the padded extent that
 * AvgPool2d divides by (count_include_pad). */
static void window(const pool_impl *p, bool rows, int i, int *lo, int *hi, int *span) {
    int size = rows ? p->H : p->W, out = rows ? p->OH : p->OW;
    if (p->kind == POOL_MAX || p->kind == POOL_AVG) {
        int start = i * p->stride - p->pad;
        int end = start + p->k < size + p->pad ? start + p->k : size + p->pad;
        *span = end - start;
        *lo = start < 0 ? 0 : start;
        *hi = end < size ? end : size;
    } else {
        *lo = (int)((int64_t)i * size / out);
        *hi = (int)(((int64_t)(i + 1) * size + out - 1) / out);
        *span = *hi - *lo;
    }
}

/* One output of MaxPool2d over the window rows [y0, y1) and columns [x0, x1): the taps row by
 * row, the first maximum kept, a NaN taken (the index of the last NaN), as PyTorch. */
static inline void max_window(const float *x, int w, int y0, int y1, int x0, int x1, float *y,
                              int32_t *idx) {
    /* branch-free: on real data which tap wins is a coin toss, and a mispredicted branch per tap
     * cost more than the comparisons */
    float best = -INFINITY;
    int32_t arg = y0 * w + x0;
    for (int iy = y0; iy < y1; iy++) {
        const float *row = x + (size_t)iy * w;
        for (int ix = x0; ix < x1; ix++) {
            const float v = row[ix];
            const bool take = v > best || v != v; /* NaN wins */
            best = take ? v : best;
            arg = take ? iy * w + ix : arg;
        }
    }
    *y = best;
    *idx = arg;
}

/* MaxPool2d 3x3, stride 2 (resnet's stem pool, padding 1): the outputs whose three window columns
 * lie inside the image through cf_max_pool_3x3_s2_row (vectors where the level has them; the
 * scalar loop unrolled the nine taps before: bench_images' W3 profile spent 4.7% of a bf16 step
 * in the general loop's window bounds), the others through the general bounds; the same taps in
 * the same order, so bitwise the same values and indices. */
static void max_3x3_s2_plane(const pool_impl *p, const float *x, float *y, int32_t *idx) {
    const int W = p->W, OW = p->OW, pad = p->pad;
    /* outputs [lo, hi) have all three columns inside: 2 ox - pad >= 0, 2 ox - pad + 3 <= W */
    int lo = (pad + 1) / 2, hi = W + pad >= 3 ? (W + pad - 3) / 2 + 1 : 0;
    if (hi > OW) hi = OW;
    if (hi < lo) hi = lo;
    for (int oy = 0; oy < p->OH; oy++) {
        int y0, y1, sy;
        window(p, true, oy, &y0, &y1, &sy);
        float *yr = y + (size_t)oy * OW;
        int32_t *ir = idx + (size_t)oy * OW;
        for (int ox = 0; ox < OW; ox++) {
            if (ox == lo && hi > lo) {
                cf_max_pool_3x3_s2_row(x, W, y0, y1 - y0, pad, lo, hi, yr, ir);
                ox = hi;
                if (ox >= OW) break;
            }
            int x0, x1, sx;
            window(p, false, ox, &x0, &x1, &sx);
            max_window(x, W, y0, y1, x0, x1, yr + ox, ir + ox);
        }
    }
}

static void pool_forward_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    pool_impl *p = ctx;
    const size_t plane = (size_t)p->H * p->W, oplane = (size_t)p->OH * p->OW;
    const bool max_2x2 = p->kind == POOL_MAX && p->k == 2 && p->stride == 2 && p->pad == 0;
    for (int64_t pl = begin; pl < end; pl++) {
        const float *x = p->x + (size_t)pl * plane;
        if (max_2x2) {
            cf_max_pool_2x2_plane(x, p->H, p->W, p->y + (size_t)pl * oplane,
                                  p->idx + (size_t)pl * oplane);
            continue;
        }
        if (p->kind == POOL_CONCAT) {
            float best, sum;
            int32_t arg;
            cf_max_sum_plane(x, plane, &best, &arg, &sum);
            int64_t n = pl / p->C, c = pl % p->C;
            p->y[n * 2 * p->C + c] = best;
            p->y[n * 2 * p->C + p->C + c] = sum / (float)plane;
            p->idx[pl] = arg;
            continue;
        }
        float *y = p->y + (size_t)pl * oplane;
        int32_t *idx = is_max(p->kind) ? p->idx + (size_t)pl * oplane : NULL;
        if (p->kind == POOL_MAX && p->k == 3 && p->stride == 2) {
            max_3x3_s2_plane(p, x, y, idx);
            continue;
        }
        for (int oy = 0; oy < p->OH; oy++) {
            int y0, y1, sy;
            window(p, true, oy, &y0, &y1, &sy);
            for (int ox = 0; ox < p->OW; ox++) {
                int x0, x1, sx;
                window(p, false, ox, &x0, &x1, &sx);
                size_t o = (size_t)oy * p->OW + ox;
                if (idx) {
                    max_window(x, p->W, y0, y1, x0, x1, y + o, idx + o);
                } else {
                    float sum = 0.0f;
                    for (int iy = y0; iy < y1; iy++)
                        for (int ix = x0; ix < x1; ix++) sum += x[(size_t)iy * p->W + ix];
                    y[o] = sum / (float)(sy * sx);
                }
            }
        }
    }
}

static void pool_backward_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    pool_impl *p = ctx;
    const size_t plane = (size_t)p->H * p->W, oplane = (size_t)p->OH * p->OW;
    for (int64_t pl = begin; pl < end; pl++) {
        float *dx = p->dx + (size_t)pl * plane;
        if (p->kind == POOL_CONCAT) {
            int64_t n = pl / p->C, c = pl % p->C;
            float g = p->dy[n * 2 * p->C + p->C + c] / (float)plane;
            for (size_t i = 0; i < plane; i++) dx[i] = g;
            dx[p->idx[pl]] += p->dy[n * 2 * p->C + c];
            continue;
        }
        const float *dy = p->dy + (size_t)pl * oplane;
        if (p->kind == POOL_MAX && p->k == 3 && p->stride == 2) {
            cf_max_pool_3x3_s2_backward(dy, p->idx + (size_t)pl * oplane, p->H, p->W, p->pad, dx,
                                        p->stream);
            continue;
        }
        memset(dx, 0, plane * sizeof(float));
        if (is_max(p->kind)) {
            const int32_t *idx = p->idx + (size_t)pl * oplane;
            for (size_t o = 0; o < oplane; o++) dx[idx[o]] += dy[o];
            continue;
        }
        for (int oy = 0; oy < p->OH; oy++) {
            int y0, y1, sy;
            window(p, true, oy, &y0, &y1, &sy);
            for (int ox = 0; ox < p->OW; ox++) {
                int x0, x1, sx;
                window(p, false, ox, &x0, &x1, &sx);
                float g = dy[(size_t)oy * p->OW + ox] / (float)(sy * sx);
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) dx[(size_t)iy * p->W + ix] += g;
            }
        }
    }
}

static const cf_tensor *pool_forward(cf_module *m, const cf_tensor *x) {
    pool_impl *p = m->impl;
    m->in = x;
    cf_shape os;
    pool_out_shape(m, &x->shape, &os); /* checked when the model planned */
    cf_tensor *y = cf_module_output(m, &os);
    p->C = x->shape.dim[1];
    p->H = x->shape.dim[2];
    p->W = x->shape.dim[3];
    p->OH = os.dim[2];
    p->OW = os.dim[3];
    p->x = x->data;
    p->y = y->data;
    cf_nn_parallel_images(x->shape.dim[0], p->C, pool_forward_range, p);
    return y;
}

static const cf_tensor *pool_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    pool_impl *p = m->impl;
    if (!need_dx) return NULL; /* no parameters */
    cf_tensor *dx = cf_module_input_grad(m);
    p->dy = dy->data;
    p->dx = dx->data;
    p->stream = cf_shape_numel(&dx->shape) * sizeof(float) >= POOL_STREAM_BYTES;
    cf_nn_parallel_images(dx->shape.dim[0], p->C, pool_backward_range, p);
    return dx;
}

#define POOL_OPS(name, str)                                                                        \
    static const cf_module_ops name = {                                                            \
        .kind = str,                                                                               \
        .out_shape = pool_out_shape,                                                               \
        .plan = pool_plan,                                                                         \
        .forward = pool_forward,                                                                   \
        .backward = pool_backward,                                                                 \
    }
POOL_OPS(maxpool_ops, "MaxPool2d");
POOL_OPS(avgpool_ops, "AvgPool2d");
POOL_OPS(adaptive_max_ops, "AdaptiveMaxPool2d");
POOL_OPS(adaptive_avg_ops, "AdaptiveAvgPool2d");
POOL_OPS(concat_ops, "AdaptiveConcatPool2d");

static cf_module *pool_new(const cf_module_ops *ops, pool_impl init) {
    pool_impl *p = cf_calloc(1, sizeof *p);
    if (!p) return NULL;
    *p = init;
    return cf_module_new(ops, p);
}

static cf_module *fixed_pool(const cf_module_ops *ops, pool_kind kind, int kernel, int stride,
                             int padding) {
    if (stride == 0) stride = kernel; /* PyTorch's stride=None */
    if (kernel < 1 || stride < 1 || padding < 0 || padding > kernel / 2) {
        cf_fail(CF_ERR_INVALID,
                "cf_%s: invalid arguments kernel=%d stride=%d padding=%d (need kernel >= 1, "
                "stride >= 1 or 0 for the kernel size, 0 <= padding <= kernel/2)",
                kind == POOL_MAX ? "maxpool2d" : "avgpool2d", kernel, stride, padding);
        return NULL;
    }
    return pool_new(ops, (pool_impl){.kind = kind, .k = kernel, .stride = stride, .pad = padding});
}

cf_module *cf_maxpool2d(int kernel, int stride, int padding) {
    return fixed_pool(&maxpool_ops, POOL_MAX, kernel, stride, padding);
}

cf_module *cf_avgpool2d(int kernel, int stride, int padding) {
    return fixed_pool(&avgpool_ops, POOL_AVG, kernel, stride, padding);
}

static cf_module *adaptive_pool(const cf_module_ops *ops, pool_kind kind, int out_h, int out_w) {
    if (out_h < 1 || out_w < 1) {
        cf_fail(CF_ERR_INVALID, "cf_adaptive_%spool2d: output size (%d, %d) must be positive",
                kind == POOL_ADAPTIVE_MAX ? "max" : "avg", out_h, out_w);
        return NULL;
    }
    return pool_new(ops, (pool_impl){.kind = kind, .out_h = out_h, .out_w = out_w});
}

cf_module *cf_adaptive_avgpool2d(int out_h, int out_w) {
    return adaptive_pool(&adaptive_avg_ops, POOL_ADAPTIVE_AVG, out_h, out_w);
}

cf_module *cf_adaptive_maxpool2d(int out_h, int out_w) {
    return adaptive_pool(&adaptive_max_ops, POOL_ADAPTIVE_MAX, out_h, out_w);
}

cf_module *cf_adaptive_concat_pool2d(void) {
    return pool_new(&concat_ops, (pool_impl){.kind = POOL_CONCAT, .out_h = 1, .out_w = 1});
}

/* ---- AvgPool2d(k, s, p, ceil_mode=True, count_include_pad=True) ----------------------------- */

typedef struct avgpool_impl {
    int k, s, p;
} avgpool_impl;

/* PyTorch's pooling_output_shape with ceil_mode: ceil((n + 2p - k) / s) + 1 (rounded toward
 * minus infinity, as its div_rtn), less one when the last window would start in the right
 * padding. An input smaller than the kernel still has one window when that window starts
 * inside it (H = 1 under AvgPool2d(2, ceil_mode=True) gives one output, the pixel itself);
 * below 1 the input is too small. */
static int ceil_out(int n, int k, int s, int p) {
    const int num = n + 2 * p - k + s - 1;
    int o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (o > 0 && (o - 1) * s >= n + p) o--;
    return o;
}

static cf_status avgpool_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    avgpool_impl *a = m->impl;
    char s[64];
    if (in->ndim != 4)
        return cf_fail(CF_ERR_INVALID,
                       "AvgPool2d(kernel %d, stride %d, padding %d, ceil_mode): expects a 4-D "
                       "input (N, C, H, W), got %s",
                       a->k, a->s, a->p, cf_shape_str(in, s, sizeof s));
    const int oh = ceil_out(in->dim[2], a->k, a->s, a->p);
    const int ow = ceil_out(in->dim[3], a->k, a->s, a->p);
    if (oh < 1 || ow < 1)
        return cf_fail(CF_ERR_INVALID,
                       "AvgPool2d(kernel %d, stride %d, padding %d, ceil_mode): input %s is too "
                       "small (output %dx%d)",
                       a->k, a->s, a->p, cf_shape_str(in, s, sizeof s), oh, ow);
    *out = cf_shape4(in->dim[0], in->dim[1], oh, ow);
    return CF_OK;
}

typedef struct avgpool_job {
    const avgpool_impl *a;
    int h, w, oh, ow;
    const float *src; /* forward: x; backward: dy */
    float *dst;       /* forward: y; backward: dx */
} avgpool_job;

/* Window [start, end) along one axis and PyTorch's divisor length (window clipped to the
 * padded input). */
static void ceil_window(int o, const avgpool_impl *a, int n, int *start, int *end, int *len) {
    int s0 = o * a->s - a->p;
    int e0 = s0 + a->k;
    if (e0 > n + a->p) e0 = n + a->p;
    *len = e0 - s0;
    *start = s0 < 0 ? 0 : s0;
    *end = e0 > n ? n : e0;
}

static void avgpool_fwd_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const avgpool_job *j = ctx;
    for (int64_t plane = begin; plane < end; plane++) {
        const float *x = j->src + plane * j->h * j->w;
        float *y = j->dst + plane * j->oh * j->ow;
        for (int oy = 0; oy < j->oh; oy++) {
            int y0, y1, ly;
            ceil_window(oy, j->a, j->h, &y0, &y1, &ly);
            for (int ox = 0; ox < j->ow; ox++) {
                int x0, x1, lx;
                ceil_window(ox, j->a, j->w, &x0, &x1, &lx);
                float sum = 0.0f;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) sum += x[iy * j->w + ix];
                y[oy * j->ow + ox] = sum / (float)(ly * lx);
            }
        }
    }
}

static void avgpool_bwd_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const avgpool_job *j = ctx;
    for (int64_t plane = begin; plane < end; plane++) {
        const float *dy = j->src + plane * j->oh * j->ow;
        float *dx = j->dst + plane * j->h * j->w;
        memset(dx, 0, (size_t)j->h * (size_t)j->w * sizeof(float));
        for (int oy = 0; oy < j->oh; oy++) {
            int y0, y1, ly;
            ceil_window(oy, j->a, j->h, &y0, &y1, &ly);
            for (int ox = 0; ox < j->ow; ox++) {
                int x0, x1, lx;
                ceil_window(ox, j->a, j->w, &x0, &x1, &lx);
                float g = dy[oy * j->ow + ox] / (float)(ly * lx);
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) dx[iy * j->w + ix] += g;
            }
        }
    }
}

static const cf_tensor *avgpool_forward(cf_module *m, const cf_tensor *x) {
    m->in = x;
    cf_shape os;
    avgpool_out_shape(m, &x->shape, &os); /* checked when the model was planned */
    cf_tensor *y = cf_module_output(m, &os);
    avgpool_job j = {m->impl,   x->shape.dim[2], x->shape.dim[3], os.dim[2],
                     os.dim[3], x->data,         y->data};
    cf_nn_parallel_images(x->shape.dim[0], x->shape.dim[1], avgpool_fwd_range, &j);
    return y;
}

static const cf_tensor *avgpool_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m);
    avgpool_job j = {m->impl,          dx->shape.dim[2], dx->shape.dim[3], dy->shape.dim[2],
                     dy->shape.dim[3], dy->data,         dx->data};
    cf_nn_parallel_images(dx->shape.dim[0], dx->shape.dim[1], avgpool_bwd_range, &j);
    return dx;
}

static const cf_module_ops avgpool_ceil_ops = {
    .kind = "AvgPool2d",
    .out_shape = avgpool_out_shape,
    .forward = avgpool_forward,
    .backward = avgpool_backward,
};

cf_module *cf_nn_avgpool2d_ceil(int kernel, int stride, int padding) {
    if (kernel < 1 || stride < 1 || padding < 0 || 2 * padding > kernel) {
        cf_fail(CF_ERR_INVALID, "AvgPool2d: kernel %d, stride %d, padding %d", kernel, stride,
                padding);
        return NULL;
    }
    avgpool_impl *a = cf_calloc(1, sizeof *a);
    if (!a) return NULL;
    *a = (avgpool_impl){kernel, stride, padding};
    return cf_module_new(&avgpool_ceil_ops, a);
}
