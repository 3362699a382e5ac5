/* fastai's upsampling layers: PyTorch's PixelShuffle, ReplicationPad2d (for the blur), ICNR
 * initialisation and PixelShuffle_ICNR. The shuffles and pads only move values; the arithmetic
 * (the 1x1 convolution, the blur's average pool) goes through the existing layers; icnr_init is
 * with the zoo's other initialisations (zoo.c). */
#include "corefit/nn.h"
#include "nn_internal.h"
#include "zoo.h"

#include <string.h>

/* ---- PixelShuffle(scale) -------------------------------------------------------------------- *
 * (N, C*s*s, H, W) -> (N, C, H*s, W*s): out[n][c][h*s + i][w*s + j] = in[n][c*s*s + i*s + j][h][w].
 * Planes of the output are independent, so large tensors are split over the thread pool by
 * (n, c) plane. */

typedef struct shuffle_impl {
    int scale;
} shuffle_impl;

typedef struct shuffle_ctx {
    const float *src;
    float *dst;
    int s, h, w; /* input plane size */
    bool backward;
} shuffle_ctx;

static void shuffle_planes(void *vctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const shuffle_ctx *c = vctx;
    const int s = c->s, h = c->h, w = c->w, ow = w * s;
    const size_t plane = (size_t)h * w;
    for (int64_t p = begin; p < end; p++) { /* p = n * C + c: one output plane */
        const size_t base = (size_t)p * plane * s * s;
        for (int i = 0; i < s; i++)
            for (int j = 0; j < s; j++) {
                const size_t in_plane = base + (size_t)(i * s + j) * plane;
                for (int y = 0; y < h; y++) {
                    const size_t in_row = in_plane + (size_t)y * w;
                    const size_t out_row = base + (size_t)(y * s + i) * ow + j;
                    if (c->backward)
                        for (int x = 0; x < w; x++)
                            c->dst[in_row + x] = c->src[out_row + (size_t)x * s];
                    else
                        for (int x = 0; x < w; x++)
                            c->dst[out_row + (size_t)x * s] = c->src[in_row + x];
                }
            }
    }
}

static void shuffle_run(const float *src, float *dst, const cf_shape *in, int s, bool backward) {
    const int64_t planes = (int64_t)in->dim[0] * (in->dim[1] / (s * s));
    shuffle_ctx ctx = {src, dst, s, in->dim[2], in->dim[3], backward};
    if (cf_shape_numel(in) >= (1 << 16) && cf_get_num_threads() > 1)
        cf_parallel_for(planes, shuffle_planes, &ctx);
    else
        shuffle_planes(&ctx, 0, planes, 0);
}

static cf_status shuffle_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    const int s = ((shuffle_impl *)m->impl)->scale;
    if (in->ndim != 4 || in->dim[1] % (s * s) != 0) {
        char b[64];
        return cf_fail(CF_ERR_INVALID,
                       "PixelShuffle(%d): input %s needs 4 dims and channels divisible by %d", s,
                       cf_shape_str(in, b, sizeof b), s * s);
    }
    *out = cf_shape4(in->dim[0], in->dim[1] / (s * s), in->dim[2] * s, in->dim[3] * s);
    return CF_OK;
}

static const cf_tensor *shuffle_forward(cf_module *m, const cf_tensor *x) {
    const int s = ((shuffle_impl *)m->impl)->scale;
    m->in = x;
    cf_shape os;
    shuffle_out_shape(m, &x->shape, &os);
    cf_tensor *y = cf_module_output(m, &os);
    shuffle_run(x->data, y->data, &x->shape, s, false);
    return y;
}

static const cf_tensor *shuffle_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    if (!need_dx) return NULL;
    const int s = ((shuffle_impl *)m->impl)->scale;
    cf_tensor *dx = cf_module_input_grad(m);
    shuffle_run(dy->data, dx->data, &dx->shape, s, true);
    return dx;
}

static const cf_module_ops shuffle_ops = {
    .kind = "PixelShuffle",
    .out_shape = shuffle_out_shape,
    .forward = shuffle_forward,
    .backward = shuffle_backward,
};

cf_module *cf_pixel_shuffle(int scale) {
    if (scale < 1) return cf_fail(CF_ERR_INVALID, "PixelShuffle: scale %d", scale), NULL;
    shuffle_impl *s = cf_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->scale = scale;
    return cf_module_new(&shuffle_ops, s);
}

/* ---- ReplicationPad2d(left, right, top, bottom) -------------------------------------------- */

typedef struct pad_impl {
    int left, right, top, bottom;
} pad_impl;

static cf_status pad_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    const pad_impl *p = m->impl;
    if (in->ndim != 4 || in->dim[2] < 1 || in->dim[3] < 1) {
        char b[64];
        return cf_fail(CF_ERR_INVALID, "ReplicationPad2d: input %s needs 4 dims",
                       cf_shape_str(in, b, sizeof b));
    }
    *out = cf_shape4(in->dim[0], in->dim[1], in->dim[2] + p->top + p->bottom,
                     in->dim[3] + p->left + p->right);
    return CF_OK;
}

static int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

static const cf_tensor *pad_forward(cf_module *m, const cf_tensor *x) {
    const pad_impl *p = m->impl;
    m->in = x;
    cf_shape os;
    pad_out_shape(m, &x->shape, &os);
    cf_tensor *y = cf_module_output(m, &os);
    const int h = x->shape.dim[2], w = x->shape.dim[3], oh = os.dim[2], ow = os.dim[3];
    const int64_t planes = (int64_t)x->shape.dim[0] * x->shape.dim[1];
    for (int64_t c = 0; c < planes; c++) {
        const float *src = x->data + c * h * w;
        float *dst = y->data + c * oh * ow;
        for (int oy = 0; oy < oh; oy++) {
            const float *row = src + (size_t)clampi(oy - p->top, 0, h - 1) * w;
            for (int ox = 0; ox < ow; ox++)
                dst[(size_t)oy * ow + ox] = row[clampi(ox - p->left, 0, w - 1)];
        }
    }
    return y;
}

static const cf_tensor *pad_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    if (!need_dx) return NULL;
    const pad_impl *p = m->impl;
    cf_tensor *dx = cf_module_input_grad(m);
    const int h = dx->shape.dim[2], w = dx->shape.dim[3], oh = dy->shape.dim[2],
              ow = dy->shape.dim[3];
    const int64_t planes = (int64_t)dx->shape.dim[0] * dx->shape.dim[1];
    memset(dx->data, 0, cf_tensor_numel(dx) * sizeof(float));
    for (int64_t c = 0; c < planes; c++) {
        const float *src = dy->data + c * oh * ow;
        float *dst = dx->data + c * h * w;
        for (int oy = 0; oy < oh; oy++) {
            float *row = dst + (size_t)clampi(oy - p->top, 0, h - 1) * w;
            for (int ox = 0; ox < ow; ox++)
                row[clampi(ox - p->left, 0, w - 1)] += src[(size_t)oy * ow + ox];
        }
    }
    return dx;
}

static const cf_module_ops pad_ops = {
    .kind = "ReplicationPad2d",
    .out_shape = pad_out_shape,
    .forward = pad_forward,
    .backward = pad_backward,
};

cf_module *cf_replication_pad2d(int left, int right, int top, int bottom) {
    if (left < 0 || right < 0 || top < 0 || bottom < 0)
        return cf_fail(CF_ERR_INVALID, "ReplicationPad2d: padding (%d, %d, %d, %d)", left, right,
                       top, bottom),
               NULL;
    pad_impl *p = cf_calloc(1, sizeof *p);
    if (!p) return NULL;
    *p = (pad_impl){left, right, top, bottom};
    return cf_module_new(&pad_ops, p);
}

/* ---- PixelShuffle_ICNR ---------------------------------------------------------------------- */

cf_module *cf_pixel_shuffle_icnr(int ni, int nf, int scale, bool blur) {
    if (ni < 1 || nf < 1 || scale < 1)
        return cf_fail(CF_ERR_INVALID, "PixelShuffle_ICNR(%d, %d, scale %d)", ni, nf, scale), NULL;
    bool ok = true;
    cf_module *seq = cf_sequential(0, NULL);
    cf_module *conv_layer = cf_sequential(0, NULL); /* fastai's ConvLayer(ks 1, no norm) */
    cf_module *conv = cf_conv2d(ni, nf * scale * scale, 1, 1, 0, true);
    cf_module *hook = cf_zoo_hook_new(CF_ZOO_PASS_NONE);
    if (!hook || !conv || !cf_zoo_hook_mark_arg(hook, conv, CF_ZOO_MARK_ICNR, scale)) ok = false;
    cf_zoo_add(conv_layer, &ok, conv);
    cf_zoo_add(conv_layer, &ok, cf_relu());
    if (!ok) {
        cf_module_free(conv_layer);
        conv_layer = NULL;
    }
    cf_zoo_add(seq, &ok, conv_layer);
    cf_zoo_add(seq, &ok, cf_pixel_shuffle(scale));
    if (blur) {
        cf_zoo_add(seq, &ok, cf_replication_pad2d(1, 0, 1, 0));
        cf_zoo_add(seq, &ok, cf_avgpool2d(2, 1, 0));
    }
    if (!cf_zoo_finish(seq, hook, ok)) {
        cf_module_free(seq);
        cf_fail_context(CF_ERR_NOMEM, "PixelShuffle_ICNR(%d, %d)", ni, nf);
        return NULL;
    }
    return seq;
}
