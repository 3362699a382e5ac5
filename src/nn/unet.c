/* fastai's DynamicUnet (fastai/vision/models/unet.py) over a cut ResNet body.
 *
 * The U-Net is one module whose forward runs the encoder's children itself and keeps the
 * outputs at the size changes (fastai's hooks, not detached); each UnetBlock reads its skip from
 * there, and the backward adds each block's skip gradient into the encoder's upstream gradient
 * at that child before running the child's backward. Children carry fastai's state_dict names:
 * "layers.0" the encoder, "layers.1" BatchNorm, "layers.2" ReLU, "layers.3" the middle convs,
 * "layers.4".. the UnetBlocks ("shuf", "bn", "conv1", "conv2"), then PixelShuffle_ICNR,
 * ResBlock and the final ConvLayer at the indices fastai's layer list gives them (ResizeToOrig
 * and MergeLayer have no parameters and are done inline). The arithmetic goes through the
 * existing layers; this file only concatenates, splits and resizes (nearest). */
#include "corefit/nn.h"
#include "nn_internal.h"
#include "zoo.h"

#include <stdio.h>
#include <string.h>

#define UNET_MAX_ENC 16

/* ---- nearest resize and channel concatenation (the only arithmetic of their own) ---------- */

/* F.interpolate(mode='nearest'): source index floor(dst * (in / out)) in float, as PyTorch. */
static int nearest_src(int dst, int in, int out) {
    const float scale = (float)in / (float)out;
    int s = (int)((float)dst * scale);
    return s < in - 1 ? s : in - 1;
}

/* src (N, C, h, w) -> dst (N, C, oh, ow); backward (accumulate): dst (h, w) += src (oh, ow). */
static void nearest_run(const float *src, float *dst, int planes, int h, int w, int oh, int ow,
                        bool backward) {
    if (backward) memset(dst, 0, (size_t)planes * h * w * sizeof(float));
    for (int p = 0; p < planes; p++) {
        const size_t in_base = (size_t)p * h * w, out_base = (size_t)p * oh * ow;
        for (int y = 0; y < oh; y++) {
            const int sy = nearest_src(y, h, oh);
            for (int x = 0; x < ow; x++) {
                const size_t i = in_base + (size_t)sy * w + nearest_src(x, w, ow);
                const size_t o = out_base + (size_t)y * ow + x;
                if (backward)
                    dst[i] += src[o];
                else
                    dst[o] = src[i];
            }
        }
    }
}

/* out (N, ca + cb, HW) = [a (N, ca, HW), b (N, cb, HW)], with ReLU when relu. */
static void concat_channels(const float *a, int ca, const float *b, int cb, float *out, int n,
                            size_t hw, bool relu) {
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * (ca + cb) * hw;
        memcpy(o, a + (size_t)i * ca * hw, (size_t)ca * hw * sizeof(float));
        memcpy(o + (size_t)ca * hw, b + (size_t)i * cb * hw, (size_t)cb * hw * sizeof(float));
        if (relu)
            for (size_t k = 0; k < (size_t)(ca + cb) * hw; k++) o[k] = o[k] > 0.0f ? o[k] : 0.0f;
    }
}

/* The inverse of concat_channels: g (N, ca + cb, HW) into ga and gb (either may be NULL); with
 * mask, only where mask > 0 (ReLU's gradient). */
static void split_channels(const float *g, const float *mask, float *ga, int ca, float *gb, int cb,
                           int n, size_t hw) {
    for (int i = 0; i < n; i++) {
        const size_t base = (size_t)i * (ca + cb) * hw;
        float *dst[2] = {ga ? ga + (size_t)i * ca * hw : NULL,
                         gb ? gb + (size_t)i * cb * hw : NULL};
        const size_t len[2] = {(size_t)ca * hw, (size_t)cb * hw}, off[2] = {0, (size_t)ca * hw};
        for (int part = 0; part < 2; part++) {
            if (!dst[part]) continue;
            const float *src = g + base + off[part];
            if (mask) {
                const float *mk = mask + base + off[part];
                for (size_t k = 0; k < len[part]; k++) dst[part][k] = mk[k] > 0.0f ? src[k] : 0.0f;
            } else {
                memcpy(dst[part], src, len[part] * sizeof(float));
            }
        }
    }
}

static cf_tensor buffer(cf_arena *arena, const cf_shape *s) {
    return (cf_tensor){.data = cf_arena_floats(arena, cf_shape_numel(s)), .shape = *s};
}

static bool same_hw(const cf_shape *a, const cf_shape *b) {
    return a->dim[2] == b->dim[2] && a->dim[3] == b->dim[3];
}

/* Gives back a gradient block the module has read, unless it is the caller's dy or kept. */
static void give(const cf_module *m, const cf_tensor *t, const cf_tensor *dy, const float *keep) {
    if (t && t != dy && t->data != dy->data && t->data != keep)
        cf_module_give_grad(m, t->data, keep);
}

/* fastai's ConvLayer(ni, nf, ks, norm_type=None, act): conv with bias, ReLU when act. Marked for
 * ConvLayer's own init (kaiming_uniform_, bias N(0, 0.01)) when act. */
static cf_module *conv_layer(cf_module *hook, int ni, int nf, int ks, bool act) {
    bool ok = true;
    cf_module *seq = cf_sequential(0, NULL);
    cf_module *conv = cf_conv2d(ni, nf, ks, 1, (ks - 1) / 2, true);
    if (act && conv && !cf_zoo_hook_mark(hook, conv, CF_ZOO_MARK_CONV_RELU)) ok = false;
    cf_zoo_add(seq, &ok, conv);
    if (act) cf_zoo_add(seq, &ok, cf_relu());
    if (!ok) {
        cf_module_free(seq);
        return NULL;
    }
    return seq;
}

/* ---- UnetBlock ------------------------------------------------------------------------------ */

enum { UB_SHUF, UB_BN, UB_CONV1, UB_CONV2 };

typedef struct ublock_impl {
    cf_shape skip_shape;   /* the hooked output's shape (set by the U-Net before shapes/plans) */
    const cf_tensor *skip; /* the hooked output (set by the U-Net before each forward) */
    cf_tensor up_rs;       /* shuf's output resized to the skip's H, W */
    cf_tensor cat;         /* relu([up, bn(skip)]) */
    cf_tensor dup, dup_small, dbn, dskip;
    cf_shape up_shape; /* shuf's output shape at the last forward */
} ublock_impl;

static cf_status ublock_shapes(cf_module *m, const cf_shape *in, cf_shape *up, cf_shape *cat,
                               cf_shape *out) {
    ublock_impl *u = m->impl;
    cf_status st = cf_nn_module_out_shape(m->children[UB_SHUF], in, up);
    if (st != CF_OK) return cf_fail_context(st, "in UnetBlock shuf");
    const cf_shape *s = &u->skip_shape;
    *cat = cf_shape4(in->dim[0], up->dim[1] + s->dim[1], s->dim[2], s->dim[3]);
    cf_shape h;
    if ((st = cf_nn_module_out_shape(m->children[UB_CONV1], cat, &h)) != CF_OK ||
        (st = cf_nn_module_out_shape(m->children[UB_CONV2], &h, out)) != CF_OK)
        return cf_fail_context(st, "in UnetBlock convs");
    return CF_OK;
}

static cf_status ublock_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    cf_shape up, cat;
    return ublock_shapes(m, in, &up, &cat, out);
}

static void ublock_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    ublock_impl *u = m->impl;
    cf_shape up, cat, out, h;
    if (ublock_shapes(m, in, &up, &cat, &out) != CF_OK) return;
    m->grad_arena = arena;
    cf_nn_module_plan(m->children[UB_SHUF], in, arena);
    cf_nn_module_plan(m->children[UB_BN], &u->skip_shape, arena);
    cf_nn_module_plan(m->children[UB_CONV1], &cat, arena);
    cf_nn_module_out_shape(m->children[UB_CONV1], &cat, &h);
    cf_nn_module_plan(m->children[UB_CONV2], &h, arena);
    const cf_shape up_at_skip = cf_shape4(in->dim[0], up.dim[1], cat.dim[2], cat.dim[3]);
    const bool resize = !same_hw(&up, &cat);
    u->up_rs = resize ? buffer(arena, &up_at_skip) : (cf_tensor){0};
    u->dup_small = resize ? buffer(arena, &up) : (cf_tensor){0};
    u->cat = buffer(arena, &cat);
    u->dup = buffer(arena, &up_at_skip);
    u->dbn = buffer(arena, &u->skip_shape);
    u->dskip = buffer(arena, &u->skip_shape);
}

static const cf_tensor *run(cf_module *c, const cf_tensor *x) {
    c->in = x;
    return c->ops->forward(c, x);
}

static const cf_tensor *ublock_forward(cf_module *m, const cf_tensor *x) {
    ublock_impl *u = m->impl;
    m->in = x;
    const cf_tensor *s = u->skip;
    const cf_tensor *up = run(m->children[UB_SHUF], x);
    u->up_shape = up->shape;
    const int n = x->shape.dim[0], sh = s->shape.dim[2], sw = s->shape.dim[3];
    if (!same_hw(&up->shape, &s->shape)) {
        u->up_rs.shape = cf_shape4(n, up->shape.dim[1], sh, sw);
        nearest_run(up->data, u->up_rs.data, n * up->shape.dim[1], up->shape.dim[2],
                    up->shape.dim[3], sh, sw, false);
        up = &u->up_rs;
    }
    const cf_tensor *b = run(m->children[UB_BN], s);
    u->cat.shape = cf_shape4(n, up->shape.dim[1] + s->shape.dim[1], sh, sw);
    concat_channels(up->data, up->shape.dim[1], b->data, b->shape.dim[1], u->cat.data, n,
                    (size_t)sh * sw, true);
    return run(m->children[UB_CONV2], run(m->children[UB_CONV1], &u->cat));
}

static const cf_tensor *ublock_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    ublock_impl *u = m->impl;
    cf_module *c1 = m->children[UB_CONV1], *c2 = m->children[UB_CONV2];
    const cf_tensor *g2 = c2->ops->backward(c2, dy, true);
    const cf_tensor *gcat = c1->ops->backward(c1, g2, true);
    give(m, g2, dy, gcat->data);
    const cf_shape *up_s = &u->up_shape;
    const int n = dy->shape.dim[0], cu = up_s->dim[1], cs = u->skip->shape.dim[1];
    const size_t hw = (size_t)u->cat.shape.dim[2] * u->cat.shape.dim[3];
    u->dup.shape = cf_shape4(n, cu, u->cat.shape.dim[2], u->cat.shape.dim[3]);
    u->dbn.shape = u->skip->shape;
    split_channels(gcat->data, u->cat.data, u->dup.data, cu, u->dbn.data, cs, n, hw);
    give(m, gcat, dy, NULL);
    /* the skip's gradient, kept for the U-Net to add into the encoder's */
    cf_module *bn = m->children[UB_BN];
    const cf_tensor *gs = bn->ops->backward(bn, &u->dbn, true);
    u->dskip.shape = gs->shape;
    memcpy(u->dskip.data, gs->data, cf_tensor_numel(gs) * sizeof(float));
    give(m, gs, &u->dbn, NULL);
    const cf_tensor *gup = &u->dup;
    if (!same_hw(up_s, &u->dup.shape)) {
        u->dup_small.shape = *up_s;
        nearest_run(u->dup.data, u->dup_small.data, n * cu, up_s->dim[2], up_s->dim[3],
                    u->dup.shape.dim[2], u->dup.shape.dim[3], true);
        gup = &u->dup_small;
    }
    cf_module *shuf = m->children[UB_SHUF];
    return shuf->ops->backward(shuf, gup, need_dx);
}

static const cf_module_ops ublock_ops = {
    .kind = "UnetBlock",
    .out_shape = ublock_out_shape,
    .plan = ublock_plan,
    .forward = ublock_forward,
    .backward = ublock_backward,
};

/* fastai's UnetBlock(up_in_c, x_in_c, final_div, blur, self_attention) with norm_type None;
 * self_attention appends SelfAttention(nf) to conv2 (ConvLayer's xtra: "conv2.2"). */
static cf_module *unet_block(int up_in_c, int x_in_c, bool final_div, bool blur, bool sa) {
    ublock_impl *u = cf_calloc(1, sizeof *u);
    cf_module *m = u ? cf_module_new(&ublock_ops, u) : NULL;
    cf_module *hook = cf_zoo_hook_new(CF_ZOO_PASS_NONE);
    const int ni = up_in_c / 2 + x_in_c, nf = final_div ? ni : ni / 2;
    cf_module *shuf = cf_pixel_shuffle_icnr(up_in_c, up_in_c / 2, 2, blur);
    cf_module *bn = cf_batchnorm2d(x_in_c);
    cf_module *conv1 = hook ? conv_layer(hook, ni, nf, 3, true) : NULL;
    cf_module *conv2 = hook ? conv_layer(hook, nf, nf, 3, true) : NULL;
    if (conv2 && sa && cf_sequential_append(conv2, cf_self_attention(nf)) != CF_OK) {
        cf_module_free(conv2);
        conv2 = NULL;
    }
    bool ok = m && hook && shuf && bn && conv1 && conv2 &&
              cf_zoo_hook_mark(hook, bn, CF_ZOO_MARK_BN) &&
              cf_zoo_hook_mark(hook, conv1, CF_ZOO_MARK_APPLY_INIT) &&
              cf_zoo_hook_mark(hook, conv2, CF_ZOO_MARK_APPLY_INIT);
    cf_module *parts[] = {shuf, bn, conv1, conv2, hook};
    const char *names[] = {"shuf", "bn", "conv1", "conv2", "init"};
    for (int i = 0; i < 5; i++) {
        if (ok && cf_module_add_child(m, parts[i], names[i]) == CF_OK) continue;
        if (ok)
            ok = false; /* add_child freed parts[i] */
        else
            cf_module_free(parts[i]);
    }
    if (!ok) {
        cf_module_free(m);
        return cf_fail_context(CF_ERR_NOMEM, "UnetBlock(%d, %d)", up_in_c, x_in_c), NULL;
    }
    return m;
}

/* ---- DynamicUnet ---------------------------------------------------------------------------- */

typedef struct unet_impl {
    int n_in, n_enc, n_skips;
    int skip_idx[UNET_MAX_ENC]; /* encoder children hooked, deepest first */
    /* child indices in the root (-1: absent) */
    int c_enc, c_bn, c_relu, c_middle, c_block0, c_shuf, c_res, c_final, c_range;
    bool last_cross;
    const cf_tensor *enc_out[UNET_MAX_ENC];
    cf_tensor resized, cross, dfeat, dfeat_small, dxin;
    cf_shape feat_shape; /* the decoder's output shape before ResizeToOrig, last forward */
    cf_tensor gsum[UNET_MAX_ENC];
} unet_impl;

/* Every shape of a forward from `in`; sets the blocks' skip shapes. */
typedef struct unet_shapes {
    cf_shape enc[UNET_MAX_ENC], mid, feat, resized, cross, out;
} unet_shapes;

static cf_status unet_walk_shapes(cf_module *m, const cf_shape *in, unet_shapes *s) {
    unet_impl *u = m->impl;
    char b[64];
    if (in->ndim != 4 || in->dim[1] != u->n_in || in->dim[2] < 1 || in->dim[3] < 1)
        return cf_fail(CF_ERR_INVALID, "DynamicUnet: input %s, expected (N, %d, H, W)",
                       cf_shape_str(in, b, sizeof b), u->n_in);
    cf_module *enc = m->children[u->c_enc];
    cf_shape cur = *in;
    cf_status st;
    for (int i = 0; i < u->n_enc; i++) {
        if ((st = cf_nn_module_out_shape(enc->children[i], &cur, &s->enc[i])) != CF_OK)
            return cf_fail_context(st, "in DynamicUnet encoder child %d", i);
        cur = s->enc[i];
    }
    const int mid_chain[3] = {u->c_bn, u->c_relu, u->c_middle};
    for (int k = 0; k < 3; k++) {
        cf_shape next;
        if ((st = cf_nn_module_out_shape(m->children[mid_chain[k]], &cur, &next)) != CF_OK)
            return cf_fail_context(st, "in DynamicUnet middle");
        cur = next;
    }
    s->mid = cur;
    for (int k = 0; k < u->n_skips; k++) {
        cf_module *blk = m->children[u->c_block0 + k];
        ((ublock_impl *)blk->impl)->skip_shape = s->enc[u->skip_idx[k]];
        cf_shape next;
        if ((st = cf_nn_module_out_shape(blk, &cur, &next)) != CF_OK)
            return cf_fail_context(st, "in DynamicUnet block %d", k);
        cur = next;
    }
    if (u->c_shuf >= 0) {
        cf_shape next;
        if ((st = cf_nn_module_out_shape(m->children[u->c_shuf], &cur, &next)) != CF_OK) return st;
        cur = next;
    }
    s->feat = cur;
    s->resized = cf_shape4(cur.dim[0], cur.dim[1], in->dim[2], in->dim[3]);
    cur = s->resized;
    if (u->last_cross) cur = cf_shape4(cur.dim[0], cur.dim[1] + u->n_in, cur.dim[2], cur.dim[3]);
    s->cross = cur;
    const int tail[3] = {u->c_res, u->c_final, u->c_range};
    for (int k = 0; k < 3; k++) {
        if (tail[k] < 0) continue;
        cf_shape next;
        if ((st = cf_nn_module_out_shape(m->children[tail[k]], &cur, &next)) != CF_OK)
            return cf_fail_context(st, "in DynamicUnet head");
        cur = next;
    }
    s->out = cur;
    return CF_OK;
}

static cf_status unet_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    unet_shapes s;
    cf_status st = unet_walk_shapes(m, in, &s);
    if (st == CF_OK) *out = s.out;
    return st;
}

static void unet_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    unet_impl *u = m->impl;
    unet_shapes s;
    if (unet_walk_shapes(m, in, &s) != CF_OK) return; /* checked before planning */
    m->grad_arena = arena;
    cf_module *enc = m->children[u->c_enc];
    enc->grad_arena = arena;
    cf_shape cur = *in;
    for (int i = 0; i < u->n_enc; i++) {
        cf_nn_module_plan(enc->children[i], &cur, arena);
        cur = s.enc[i];
    }
    const int chain[3] = {u->c_bn, u->c_relu, u->c_middle};
    for (int k = 0; k < 3; k++) {
        cf_shape next;
        cf_nn_module_plan(m->children[chain[k]], &cur, arena);
        cf_nn_module_out_shape(m->children[chain[k]], &cur, &next);
        cur = next;
    }
    for (int k = 0; k < u->n_skips; k++) {
        cf_module *blk = m->children[u->c_block0 + k];
        cf_shape next;
        cf_nn_module_plan(blk, &cur, arena);
        cf_nn_module_out_shape(blk, &cur, &next);
        cur = next;
        u->gsum[k] = buffer(arena, &s.enc[u->skip_idx[k]]);
    }
    if (u->c_shuf >= 0) cf_nn_module_plan(m->children[u->c_shuf], &cur, arena);
    const bool resize = !same_hw(&s.feat, in);
    u->resized = resize ? buffer(arena, &s.resized) : (cf_tensor){0};
    u->dfeat_small = resize ? buffer(arena, &s.feat) : (cf_tensor){0};
    u->cross = u->last_cross ? buffer(arena, &s.cross) : (cf_tensor){0};
    u->dfeat = u->last_cross ? buffer(arena, &s.resized) : (cf_tensor){0};
    u->dxin = u->last_cross ? buffer(arena, in) : (cf_tensor){0};
    cur = s.cross;
    const int tail[3] = {u->c_res, u->c_final, u->c_range};
    for (int k = 0; k < 3; k++) {
        if (tail[k] < 0) continue;
        cf_shape next;
        cf_nn_module_plan(m->children[tail[k]], &cur, arena);
        cf_nn_module_out_shape(m->children[tail[k]], &cur, &next);
        cur = next;
    }
    m->out.shape = s.out;
    m->dx.data = NULL;
    m->dx.shape = *in;
    cf_arena_reserve_transient(arena, cf_shape_numel(in) * sizeof(float));
}

static const cf_tensor *unet_forward(cf_module *m, const cf_tensor *x) {
    unet_impl *u = m->impl;
    m->in = x;
    cf_module *enc = m->children[u->c_enc];
    enc->in = x;
    const cf_tensor *h = x;
    for (int i = 0; i < u->n_enc; i++) h = u->enc_out[i] = run(enc->children[i], h);
    h = run(m->children[u->c_middle], run(m->children[u->c_relu], run(m->children[u->c_bn], h)));
    for (int k = 0; k < u->n_skips; k++) {
        cf_module *blk = m->children[u->c_block0 + k];
        ((ublock_impl *)blk->impl)->skip = u->enc_out[u->skip_idx[k]];
        h = run(blk, h);
    }
    if (u->c_shuf >= 0) h = run(m->children[u->c_shuf], h);
    const int n = x->shape.dim[0], c = h->shape.dim[1], H = x->shape.dim[2], W = x->shape.dim[3];
    u->feat_shape = h->shape;
    if (!same_hw(&h->shape, &x->shape)) { /* ResizeToOrig */
        u->resized.shape = cf_shape4(n, c, H, W);
        nearest_run(h->data, u->resized.data, n * c, h->shape.dim[2], h->shape.dim[3], H, W, false);
        h = &u->resized;
    }
    if (u->last_cross) { /* MergeLayer(dense=True): cat([x, x.orig], dim=1) */
        u->cross.shape = cf_shape4(n, c + u->n_in, H, W);
        concat_channels(h->data, c, x->data, u->n_in, u->cross.data, n, (size_t)H * W, false);
        h = &u->cross;
    }
    const int tail[3] = {u->c_res, u->c_final, u->c_range};
    for (int k = 0; k < 3; k++)
        if (tail[k] >= 0) h = run(m->children[tail[k]], h);
    return h;
}

/* One child's backward inside the U-Net: gives back the gradient it read. */
static const cf_tensor *back(cf_module *m, cf_module *c, const cf_tensor *g, const cf_tensor *dy,
                             bool need_dx) {
    const cf_tensor *ng = c->ops->backward(c, g, need_dx);
    give(m, g, dy, ng ? ng->data : NULL);
    return ng;
}

static const cf_tensor *unet_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    unet_impl *u = m->impl;
    const cf_tensor *x = m->in, *g = dy;
    const int tail[3] = {u->c_range, u->c_final, u->c_res};
    for (int k = 0; k < 3; k++)
        if (tail[k] >= 0) g = back(m, m->children[tail[k]], g, dy, true);
    const int n = x->shape.dim[0], H = x->shape.dim[2], W = x->shape.dim[3];
    if (u->last_cross) {
        const int c = g->shape.dim[1] - u->n_in;
        u->dfeat.shape = cf_shape4(n, c, H, W);
        u->dxin.shape = x->shape;
        split_channels(g->data, NULL, u->dfeat.data, c, need_dx ? u->dxin.data : NULL, u->n_in, n,
                       (size_t)H * W);
        give(m, g, dy, NULL);
        g = &u->dfeat;
    }
    const cf_shape *fs = &u->feat_shape;
    if (!same_hw(fs, &x->shape)) {
        u->dfeat_small.shape = *fs;
        nearest_run(g->data, u->dfeat_small.data, fs->dim[0] * fs->dim[1], fs->dim[2], fs->dim[3],
                    H, W, true);
        give(m, g, dy, NULL);
        g = &u->dfeat_small;
    }
    if (u->c_shuf >= 0) g = back(m, m->children[u->c_shuf], g, dy, true);
    for (int k = u->n_skips - 1; k >= 0; k--)
        g = back(m, m->children[u->c_block0 + k], g, dy, true);
    g = back(m, m->children[u->c_middle], g, dy, true);
    g = back(m, m->children[u->c_relu], g, dy, true);
    g = back(m, m->children[u->c_bn], g, dy, true);
    /* The encoder backward one span at a time between the children whose output a skip
     * gradient joins, each span through cf_nn_seq_backward_range: it holds a BatchNorm's
     * upstream gradient until the convolution before it has run (the stem dx link). */
    cf_module *enc = m->children[u->c_enc];
    int hi = u->n_enc;
    for (int i = u->n_enc - 1; i >= -1; i--) {
        bool joins = false;
        for (int k = 0; k < u->n_skips && i >= 0; k++) joins |= u->skip_idx[k] == i;
        if (!joins && i >= 0) continue;
        if (i + 1 < hi) { /* children i + 1 .. hi - 1 */
            const bool want = i + 1 > 0 || need_dx;
            const cf_tensor *ng = cf_nn_seq_backward_range(enc, g, i + 1, hi, want);
            give(m, g, dy, ng ? ng->data : NULL);
            g = ng;
        }
        hi = i + 1;
        for (int k = 0; k < u->n_skips && i >= 0; k++) { /* the hooked output's gradient */
            if (u->skip_idx[k] != i) continue;
            const cf_tensor *ds = &((ublock_impl *)m->children[u->c_block0 + k]->impl)->dskip;
            cf_tensor *sum = &u->gsum[k];
            sum->shape = ds->shape;
            const size_t len = cf_tensor_numel(ds);
            for (size_t j = 0; j < len; j++) sum->data[j] = g->data[j] + ds->data[j];
            give(m, g, dy, NULL);
            g = sum;
        }
    }
    if (!need_dx) return NULL;
    if (!u->last_cross) return g;
    cf_tensor *dx = cf_module_input_grad(m);
    const size_t len = cf_tensor_numel(dx);
    for (size_t j = 0; j < len; j++) dx->data[j] = g->data[j] + u->dxin.data[j];
    give(m, g, dy, dx->data);
    return dx;
}

static const cf_module_ops unet_ops = {
    .kind = "DynamicUnet",
    .out_shape = unet_out_shape,
    .plan = unet_plan,
    .forward = unet_forward,
    .backward = unet_backward,
};

cf_unet_opts cf_unet_defaults(void) {
    return (cf_unet_opts){.blur = false,
                          .blur_final = true,
                          .self_attention = false,
                          .y_range = false,
                          .last_cross = true,
                          .bottle = false};
}

/* Adds child under fastai's layer index; frees it (and fails) when !*ok. */
static void add_layer(cf_module *m, bool *ok, int index, cf_module *child) {
    if (!*ok || !child) {
        cf_module_free(child);
        *ok = false;
        return;
    }
    char name[24];
    snprintf(name, sizeof name, "layers.%d", index);
    if (cf_module_add_child(m, child, name) != CF_OK) *ok = false;
}

cf_module *cf_dynamic_unet(cf_module *encoder, int n_in, int n_out, int img_h, int img_w,
                           const cf_unet_opts *opts) {
    const cf_unet_opts o = opts ? *opts : cf_unet_defaults();
    if (!encoder) return cf_fail(CF_ERR_INVALID, "DynamicUnet: no encoder"), NULL;
    const char *bad = o.bottle ? "bottle (fastai's ResBlock then mismatches the final "
                                 "conv's input)"
                      : n_in < 1 || n_out < 1 || img_h < 8 || img_w < 8 ? "sizes"
                                                                        : NULL;
    if (bad) {
        cf_module_free(encoder);
        return cf_fail(CF_ERR_INVALID, "DynamicUnet: %s (n_in %d, n_out %d, image %dx%d)", bad,
                       n_in, n_out, img_h, img_w),
               NULL;
    }
    unet_impl *u = cf_calloc(1, sizeof *u);
    cf_module *m = u ? cf_module_new(&unet_ops, u) : NULL;
    if (!m) {
        cf_module_free(encoder);
        return NULL;
    }
    u->n_in = n_in;
    u->last_cross = o.last_cross;
    /* the encoder's own children (a trailing init hook is not a layer) */
    int n_enc = encoder->n_children;
    while (n_enc > 0 && strcmp(encoder->children[n_enc - 1]->ops->kind, "InitHook") == 0) n_enc--;
    if (n_enc < 2 || n_enc > UNET_MAX_ENC) {
        cf_module_free(encoder);
        cf_module_free(m);
        return cf_fail(CF_ERR_INVALID, "DynamicUnet: an encoder of %d layers (2 to %d)", n_enc,
                       UNET_MAX_ENC),
               NULL;
    }
    u->n_enc = n_enc;
    /* model_sizes on a dummy (2, n_in, img_size) batch: shapes only, no forward needed */
    cf_shape sizes[UNET_MAX_ENC], cur = cf_shape4(2, n_in, img_h, img_w); /* 2: a training
                                                                         BatchNorm needs it */
    for (int i = 0; i < n_enc; i++) {
        if (cf_nn_module_out_shape(encoder->children[i], &cur, &sizes[i]) != CF_OK) {
            cf_module_free(encoder);
            cf_module_free(m);
            cf_fail_context(CF_ERR_INVALID, "DynamicUnet: encoder child %d on %dx%d", i, img_h,
                            img_w);
            return NULL;
        }
        cur = sizes[i];
    }
    /* _get_sz_change_idxs: i where the width changes after child i, reversed */
    for (int i = n_enc - 2; i >= 0; i--)
        if (sizes[i].dim[3] != sizes[i + 1].dim[3]) u->skip_idx[u->n_skips++] = i;
    bool ok = true;
    cf_module *hook = cf_zoo_hook_new(CF_ZOO_PASS_NONE);
    if (!hook) ok = false;
    int ni = sizes[n_enc - 1].dim[1];
    int idx = 0;
    u->c_enc = 0;
    add_layer(m, &ok, idx++, encoder);
    cf_module *bn = cf_batchnorm2d(ni);
    if (ok && !cf_zoo_hook_mark(hook, bn, CF_ZOO_MARK_BN)) ok = false;
    u->c_bn = m->n_children;
    add_layer(m, &ok, idx++, bn);
    u->c_relu = m->n_children;
    add_layer(m, &ok, idx++, cf_relu());
    cf_module *middle = cf_sequential(0, NULL);
    if (ok) cf_zoo_add(middle, &ok, conv_layer(hook, ni, 2 * ni, 3, true));
    if (ok) cf_zoo_add(middle, &ok, conv_layer(hook, 2 * ni, ni, 3, true));
    if (ok && !cf_zoo_hook_mark(hook, middle, CF_ZOO_MARK_APPLY_INIT)) ok = false;
    u->c_middle = m->n_children;
    add_layer(m, &ok, idx++, middle);
    u->c_block0 = m->n_children;
    int c = ni;
    for (int k = 0; k < u->n_skips && ok; k++) {
        const bool not_final = k != u->n_skips - 1;
        const int x_in_c = sizes[u->skip_idx[k]].dim[1];
        add_layer(m, &ok, idx++,
                  unet_block(c, x_in_c, not_final, o.blur && (not_final || o.blur_final),
                             o.self_attention && k == u->n_skips - 3));
        const int cat = c / 2 + x_in_c;
        c = not_final ? cat : cat / 2;
    }
    u->c_shuf = -1;
    if (sizes[0].dim[2] != img_h || sizes[0].dim[3] != img_w) {
        u->c_shuf = m->n_children;
        add_layer(m, &ok, idx++, cf_pixel_shuffle_icnr(c, c, 2, false));
    }
    idx++; /* ResizeToOrig */
    u->c_res = -1;
    if (o.last_cross) {
        idx++; /* MergeLayer */
        c += n_in;
        cf_module *cp = cf_sequential(0, NULL);
        if (ok) cf_zoo_add(cp, &ok, conv_layer(hook, c, c, 3, true));
        if (ok) cf_zoo_add(cp, &ok, conv_layer(hook, c, c, 3, false));
        if (!ok) cf_module_free(cp), cp = NULL;
        cf_module *res = cp ? cf_residual(cp, NULL, true) : NULL;
        if (ok && res && !cf_zoo_hook_mark(hook, res, CF_ZOO_MARK_APPLY_INIT)) ok = false;
        u->c_res = m->n_children;
        add_layer(m, &ok, idx++, res);
    }
    u->c_final = m->n_children;
    add_layer(m, &ok, idx++, conv_layer(hook, c, n_out, 1, false));
    u->c_range = -1;
    if (o.y_range) {
        u->c_range = m->n_children;
        add_layer(m, &ok, idx++, cf_nn_sigmoid_range(o.y_lo, o.y_hi));
    }
    if (ok && cf_module_add_child(m, hook, "init") != CF_OK)
        ok = false;
    else if (!ok)
        cf_module_free(hook);
    if (!ok) {
        cf_module_free(m);
        cf_fail_context(CF_ERR_NOMEM, "DynamicUnet");
        return NULL;
    }
    return m;
}

cf_module *cf_unet_model(const char *arch, int n_in, int n_out, int img_h, int img_w,
                         const cf_unet_opts *opts) {
    static const struct {
        const char *name;
        int depth;
        bool xresnet;
    } archs[] = {{"resnet18", 18, false},   {"resnet34", 34, false},   {"resnet50", 50, false},
                 {"resnet101", 101, false}, {"resnet152", 152, false}, {"xresnet18", 18, true},
                 {"xresnet34", 34, true},   {"xresnet50", 50, true}};
    for (size_t i = 0; arch && i < sizeof archs / sizeof *archs; i++) {
        if (strcmp(arch, archs[i].name) != 0) continue;
        cf_module *body;
        if (archs[i].xresnet) {
            cf_xresnet_opts xo = cf_xresnet_defaults();
            xo.c_in = n_in;
            body = cf_xresnet_body(archs[i].depth, &xo);
        } else {
            body = cf_resnet_body(archs[i].depth, n_in);
        }
        return cf_dynamic_unet(body, n_in, n_out, img_h, img_w, opts);
    }
    return cf_fail(CF_ERR_INVALID,
                   "unet: arch '%s' (resnet18, resnet34, resnet50, resnet101, resnet152, "
                   "xresnet18, xresnet34, xresnet50)",
                   arch ? arch : "(null)"),
           NULL;
}

static void group_all(cf_module *m, int group) {
    for (int i = 0; i < m->n_params; i++) m->params[i].group = group;
    for (int i = 0; i < m->n_children; i++) group_all(m->children[i], group);
}

cf_status cf_split_unet(cf_model *model, int body_cut) {
    cf_module *root = model->root;
    if (!root || root->ops != &unet_ops)
        return cf_fail(CF_ERR_INVALID, "unet split: the model is not a DynamicUnet");
    cf_module *enc = root->children[((unet_impl *)root->impl)->c_enc];
    if (body_cut < 1 || body_cut >= enc->n_children)
        return cf_fail(CF_ERR_INVALID, "unet split: cut %d of an encoder of %d children", body_cut,
                       enc->n_children);
    group_all(root, 2);
    for (int i = 0; i < enc->n_children; i++) group_all(enc->children[i], i < body_cut ? 0 : 1);
    model->n_groups = 3;
    return CF_OK;
}

bool cf_is_dynamic_unet(const cf_module *m) {
    return m && m->ops == &unet_ops;
}
