/* Residual block: act(convpath(x) + idpath(x)).
 *
 * The element-wise passes (sum and ReLU forward; ReLU's mask and the sum of the two input
 * gradients backward) are memory-bound over the block's activations; large ones are split over
 * the thread pool in contiguous chunks (results do not depend on the split). With ReLU after the
 * sum and an idpath that ends in a BatchNorm, that BatchNorm writes relu(a + bn(.)) itself
 * (nn_internal.h) and its output is the block's output; without an idpath, the convpath's last
 * BatchNorm writes relu(bn(.) + x) the same way; the idpath's fold also keeps the ReLU's mask as
 * bits, which both paths' last BatchNorms apply to dy in backward, so that the masked gradient is
 * never written (nn_internal.h). The fused calls the block makes are
 * decided when the model is planned (cf_nn_residual_set_fusion, from fuse.c). The input gradient is
 * summed into the convpath's input gradient in place (that buffer is dead once the convpath's
 * backward has returned, and writing it back where it was just read costs no extra read of a fresh
 * destination), unless that buffer is the upstream gradient itself (a convpath that passes its
 * gradient through, without ReLU after the sum) or the idpath's: then into the block's own
 * buffer. */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <stdatomic.h>
#include <string.h>

typedef struct residual_impl {
    bool relu_after;
    bool has_idpath;
    cf_nn_res_fusion fuse; /* the fused calls, planned (nn_internal.h) */
    cf_tensor dz;          /* gradient after the activation */
    cf_tensor gx;          /* the input gradient when summed into the convpath's */
    uint16_t *mask;        /* the fold's ReLU mask as bits (nn_internal.h), NULL: none */
    bool mask_valid;       /* the last forward wrote it */
} residual_impl;

/* The mask bits' test switch (cf__nn_set_res_mask_bits). */
static atomic_bool mask_bits_off;

void cf__nn_set_res_mask_bits(bool on) {
    atomic_store(&mask_bits_off, !on);
}

#define RES_PAR_MIN (1 << 16)

typedef enum { RES_ADD, RES_ADD_TO, RES_ADD_RELU, RES_MASK } res_op;

typedef struct res_ew {
    res_op op;
    const float *a, *b;
    float *out;
} res_ew;

static void res_ew_range(void *vctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const res_ew *c = vctx;
    const float *restrict a = c->a, *restrict b = c->b;
    float *restrict o = c->out; /* never a or b (but for RES_ADD_TO, where a is unused) */
    switch (c->op) {
    case RES_ADD:
        for (int64_t i = begin; i < end; i++) o[i] = a[i] + b[i];
        break;
    case RES_ADD_TO: /* out is a (a separate pointer to it would break restrict) */
        for (int64_t i = begin; i < end; i++) o[i] += b[i];
        break;
    case RES_ADD_RELU:
        for (int64_t i = begin; i < end; i++) {
            const float v = a[i] + b[i];
            o[i] = v > 0.0f ? v : 0.0f;
        }
        break;
    case RES_MASK: /* a: the ReLU's output, b: the gradient */
        for (int64_t i = begin; i < end; i++) {
            const float g = b[i]; /* loaded unconditionally so that the select vectorises */
            o[i] = a[i] > 0.0f ? g : 0.0f;
        }
        break;
    }
}

/* Over the values of a tensor of the given shape, split by whole images as the layers around it
 * split the batch (cf_nn_parallel_images). */
static void res_ew_run(res_op op, const float *a, const float *b, float *out,
                       const cf_shape *shape) {
    res_ew ctx = {op, a, b, out};
    const size_t n = cf_shape_numel(shape);
    const int64_t images = shape->ndim > 1 ? shape->dim[0] : 1;
    if (n >= RES_PAR_MIN && cf_get_num_threads() > 1 && images > 1)
        cf_nn_parallel_images(images, (int64_t)n / images, res_ew_range, &ctx);
    else if (n >= RES_PAR_MIN && cf_get_num_threads() > 1)
        cf_parallel_for((int64_t)n, res_ew_range, &ctx);
    else
        res_ew_range(&ctx, 0, (int64_t)n, 0);
}

static cf_status res_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    residual_impl *r = m->impl;
    cf_shape a, b = *in;
    cf_status st = cf_nn_module_out_shape(m->children[0], in, &a);
    if (st != CF_OK) return cf_fail_context(st, "in residual convpath");
    if (r->has_idpath && (st = cf_nn_module_out_shape(m->children[1], in, &b)) != CF_OK)
        return cf_fail_context(st, "in residual idpath");
    if (!cf_shape_equal(&a, &b)) {
        char sa[64], sb[64];
        return cf_fail(CF_ERR_INVALID, "residual block: convpath gives %s but idpath gives %s",
                       cf_shape_str(&a, sa, sizeof sa), cf_shape_str(&b, sb, sizeof sb));
    }
    *out = a;
    return CF_OK;
}

static const cf_module_ops residual_ops;

bool cf_nn_is_residual(const cf_module *m) {
    return m && m->ops == &residual_ops;
}

void cf_nn_residual_set_fusion(cf_module *block, const cf_nn_res_fusion *f) {
    ((residual_impl *)block->impl)->fuse = *f;
}

bool cf_nn_residual_relu_after(const cf_module *block) {
    return ((const residual_impl *)block->impl)->relu_after;
}

static void res_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    residual_impl *r = m->impl;
    for (int i = 0; i < m->n_children; i++) cf_nn_module_plan(m->children[i], in, arena);
    cf_shape out;
    if (res_out_shape(m, in, &out) != CF_OK) return; /* checked before planning */
    m->out.data =
        r->fuse.fold || r->fuse.fold_a ? NULL : cf_arena_floats(arena, cf_shape_numel(&out));
    m->out.shape = out;
    m->dx.data = NULL;
    m->dx.shape = *in;
    cf_arena_reserve_transient(arena, cf_shape_numel(in) * sizeof(float));
    m->grad_arena = arena;
    r->dz.data = NULL;
    if (r->relu_after) cf_arena_reserve_transient(arena, cf_shape_numel(&out) * sizeof(float));
    r->mask = NULL;
    r->mask_valid = false;
    if (r->fuse.fold && r->relu_after && out.ndim > 2) {
        size_t s = 1;
        for (int i = 2; i < out.ndim; i++) s *= (size_t)out.dim[i];
        const size_t words = (size_t)out.dim[0] * (size_t)out.dim[1] * CF_MASK_WORDS(s);
        r->mask = cf_arena_bytes(arena, words * sizeof(uint16_t));
    }
}

/* The steps of a path: its children when it was a Sequential at the plan (seq), else the path
 * itself. */
static int path_len(const cf_module *path, bool seq) {
    return seq ? path->n_children : 1;
}

/* Steps [lo, hi) of a path forward (path->in is the caller's to set). */
static const cf_tensor *path_forward(cf_module *path, bool seq, const cf_tensor *x, int lo,
                                     int hi) {
    if (seq) return cf_nn_seq_forward_range(path, x, lo, hi);
    if (lo >= hi) return x;
    path->in = x;
    return path->ops->forward(path, x);
}

/* Steps [lo, hi) of a path backward, as the path's own backward runs them. */
static const cf_tensor *path_backward(cf_module *path, bool seq, const cf_tensor *dy, int lo,
                                      int hi, bool need_dx) {
    if (seq) return cf_nn_seq_backward_range(path, dy, lo, hi, need_dx);
    if (lo >= hi) return dy;
    return path->ops->backward(path, dy, need_dx);
}

cf_module *cf_nn_residual_fold(const cf_module *block) {
    if (!cf_nn_is_residual(block)) return NULL;
    const residual_impl *r = block->impl;
    return r->fuse.fold;
}

static const cf_tensor *res_forward(cf_module *m, const cf_tensor *x) {
    residual_impl *r = m->impl;
    const cf_nn_res_fusion *f = &r->fuse;
    m->in = x;
    r->mask_valid = false;
    cf_module *cp = m->children[0];
    cp->in = x;
    if (f->fold) cf_nn_bn_fold_arm(f->fold); /* the convpath's last BatchNorm's output to it */
    /* a strided convpath conv may compute the idpath's strided 1x1 conv from its phase split */
    const cf_tensor *a, *shortcut_y = NULL;
    if (f->pair_a) {
        f->pair_a->in = x;
        a = cf_nn_conv_forward_pair(f->pair_a, f->pair_b, x, &shortcut_y);
        a = path_forward(cp, f->convpath_seq, a, 1, path_len(cp, f->convpath_seq));
    } else if (f->fold_a) { /* relu(convpath(x) + x), written by the convpath's last BatchNorm */
        a = path_forward(cp, f->convpath_seq, x, 0, path_len(cp, f->convpath_seq) - 1);
        a = cf_nn_bn_forward_add_relu(f->fold_a, a, x->data);
        m->out = *a;
        return &m->out;
    } else {
        a = cp->ops->forward(cp, x);
    }
    const cf_tensor *b = x;
    if (r->has_idpath) {
        cf_module *ip = m->children[1];
        ip->in = x;
        const int n = path_len(ip, f->idpath_seq), end = f->fold ? n - 1 : n;
        if (shortcut_y)
            b = path_forward(ip, f->idpath_seq, shortcut_y, 1, end);
        else if (f->fold)
            b = path_forward(ip, f->idpath_seq, x, 0, end);
        else
            b = ip->ops->forward(ip, x);
        if (f->fold) { /* relu(a + idpath(x)), written by its last BatchNorm (and the mask) */
            const bool bits =
                r->mask && !atomic_load_explicit(&mask_bits_off, memory_order_relaxed);
            b = bits ? cf_nn_bn_forward_fold_mask(f->fold, b, a->data, r->mask)
                     : cf_nn_bn_forward_add_relu(f->fold, b, a->data);
            r->mask_valid = bits && cf_nn_bn_wrote_mask(f->fold);
            m->out = *b;
            return &m->out;
        }
    }
    cf_tensor *y = cf_module_output(m, &a->shape);
    res_ew_run(r->relu_after ? RES_ADD_RELU : RES_ADD, a->data, b->data, y->data, &y->shape);
    return y;
}

/* Gives back a gradient the block has read (not dy, the caller's, nor keep, what it returns). */
static void res_give(const cf_module *m, const cf_tensor *t, const cf_tensor *dy,
                     const float *keep) {
    if (t && t->data != dy->data && t->data != keep) cf_module_give_grad(m, t->data, keep);
}

/* Steps [lo, hi) of a Sequential path backward from t, the gradient of step hi's output that
 * the path took itself (given back once read, as the Sequential gives its steps' back). */
static const cf_tensor *path_backward_rest(cf_module *path, const cf_tensor *t, int lo, int hi) {
    for (int i = hi - 1; i >= lo; i--) {
        const cf_tensor *d = cf_nn_seq_backward_range(path, t, i, i + 1, true);
        cf_module_give_grad(path, t->data, d ? d->data : NULL);
        t = d;
        if (!t) break; /* a failed step (the pass's error, as the Sequential's) */
    }
    return t;
}

/* The idpath's backward with its first conv's input gradient added into target (in place when
 * exact): the steps after it as the path runs them, then that conv. */
static const cf_tensor *idpath_backward_add(cf_module *ip, bool seq, cf_module *conv,
                                            const cf_tensor *dz, float *target) {
    const cf_tensor *t = path_backward(ip, seq, dz, 1, path_len(ip, seq), true);
    const cf_tensor *db = cf_nn_conv_backward_add(conv, t, target);
    if (t->data != dz->data) cf_module_give_grad(ip, t->data, db->data);
    return db;
}

/* The module of a path that takes the block's gradient first: the last child of a Sequential
 * whose ops are its own, else the path itself. */
static cf_module *path_taker(cf_module *path) {
    return cf_nn_is_sequential(path) && path->n_children ? path->children[path->n_children - 1]
                                                         : path;
}

/* Arms both paths' last BatchNorms with the forward's mask bits for dy; false (neither armed)
 * where either cannot take it (nn_internal.h). */
static bool res_arm_mask(cf_module *m, const cf_tensor *dy) {
    residual_impl *r = m->impl;
    if (!r->mask_valid || !r->has_idpath) return false;
    cf_module *ta = path_taker(m->children[0]), *tb = path_taker(m->children[1]);
    const bool fits = ta != tb && cf_nn_is_batchnorm(ta) && cf_nn_is_batchnorm(tb) && ta->in &&
                      tb->in && cf_shape_equal(&ta->in->shape, &dy->shape) &&
                      cf_shape_equal(&tb->in->shape, &dy->shape);
    if (fits && cf_nn_bn_mask_dy(ta, r->mask, dy->data) && cf_nn_bn_mask_dy(tb, r->mask, dy->data))
        return true;
    if (cf_nn_is_batchnorm(ta)) cf_nn_bn_mask_dy(ta, NULL, NULL);
    if (cf_nn_is_batchnorm(tb)) cf_nn_bn_mask_dy(tb, NULL, NULL);
    return false;
}

bool cf_nn_residual_masks_itself(const cf_module *block) {
    if (!cf_nn_is_residual(block)) return false;
    const residual_impl *r = block->impl;
    if (!r->relu_after || !r->has_idpath) return false;
    const cf_module *ta = path_taker(block->children[0]), *tb = path_taker(block->children[1]);
    return ta != tb && cf_nn_is_batchnorm(ta) && cf_nn_is_batchnorm(tb);
}

static const cf_tensor *res_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    residual_impl *r = m->impl;
    const cf_nn_res_fusion *f = &r->fuse;
    const cf_tensor *dz = dy;
    /* with the mask's bits the last BatchNorms mask dy themselves: dz is dy, never written */
    const bool masked = r->relu_after && res_arm_mask(m, dy);
    if (r->relu_after && !masked && f->fold && cf_nn_bn_wrote_words(f->fold)) {
        /* the fold wrote the next block's words in place of the output (nn_internal.h) */
        cf_module_fail(CF_ERR_STATE, "residual block backward: the forward kept only the mask, "
                                     "which this backward cannot apply");
    }
    if (r->relu_after && !masked) {
        r->dz.shape = dy->shape;
        r->dz.data = cf_arena_take(m->grad_arena, cf_tensor_numel(dy) * sizeof(float), &r->dz);
        if (f->fold && cf_nn_bn_wrote_words(f->fold)) /* failed above: the pass runs to its end */
            memset(r->dz.data, 0, cf_tensor_numel(dy) * sizeof(float));
        else
            res_ew_run(RES_MASK, m->out.data, dy->data, r->dz.data, &dy->shape);
        dz = &r->dz;
    }
    cf_module *cp = m->children[0];
    /* a shortcut whose output the convpath's first conv computed may leave its input gradient
     * to that conv as well: the idpath runs first and hands over the shortcut's output gradient,
     * dead once the convpath has run */
    if (f->pair_a && need_dx && cf_nn_conv_pair_backward_fits(f->pair_a, f->pair_b)) {
        cf_module *ip = m->children[1];
        const int ni = path_len(ip, f->idpath_seq), nc = path_len(cp, f->convpath_seq);
        /* both paths' last BatchNorms, masked alike, in one backward (dy read once) */
        const cf_tensor *ta = NULL, *tb = NULL;
        const bool pair =
            masked && f->idpath_seq && f->convpath_seq && ni > 1 && nc > 1 &&
            cf_nn_bn_backward_pair(cp->children[nc - 1], ip->children[ni - 1], dz, &ta, &tb);
        const cf_tensor *handed = pair ? path_backward_rest(ip, tb, 1, ni - 1)
                                       : path_backward(ip, f->idpath_seq, dz, 1, ni, true);
        cf_nn_conv_handover h;
        cf_nn_conv_shortcut_backward(f->pair_b, handed, f->pair_a, &h);
        const cf_tensor *da = pair ? path_backward_rest(cp, ta, 1, nc - 1)
                                   : path_backward(cp, f->convpath_seq, dz, 1, nc, true);
        const cf_tensor *dx = cf_nn_conv_backward_with_shortcut(f->pair_a, da, &h);
        if (da->data != dz->data) cf_module_give_grad(cp, da->data, dx->data);
        res_give(m, handed, dy, dx->data);
        if (dz != dy) res_give(m, dz, dy, dx->data);
        return dx;
    }
    const cf_tensor *da = cp->ops->backward(cp, dz, need_dx);
    const cf_tensor *db = dz;
    const cf_tensor *dx = NULL;
    if (r->has_idpath) {
        cf_module *ip = m->children[1];
        /* an idpath that starts with a convolution may add its gradient into the convpath's
         * (a buffer of the convpath's own, dead once read here) */
        if (f->add_into && need_dx && da->data != dy->data && da->data != dz->data) {
            db = idpath_backward_add(ip, f->idpath_seq, f->add_into, dz, da->data);
            if (db->data == da->data) dx = db; /* added in place */
        } else {
            db = ip->ops->backward(ip, dz, need_dx);
        }
    }
    if (need_dx && !dx) {
        if (da->data != dy->data && da->data != db->data && da->data != dz->data) {
            r->gx = (cf_tensor){.data = da->data, .shape = m->in->shape};
            res_ew_run(RES_ADD_TO, NULL, db->data, r->gx.data, &r->gx.shape);
            dx = &r->gx;
        } else {
            cf_tensor *sum = cf_module_input_grad(m);
            res_ew_run(RES_ADD, da->data, db->data, sum->data, &sum->shape);
            dx = sum;
        }
    }
    /* what the paths returned and the masked gradient are dead now, unless returned */
    const float *keep = dx ? dx->data : NULL;
    res_give(m, da, dy, keep);
    if (db != dz) res_give(m, db, dy, keep);
    if (dz != dy) res_give(m, dz, dy, keep);
    return dx;
}

static const cf_module_ops residual_ops = {
    .kind = "ResBlock",
    .out_shape = res_out_shape,
    .plan = res_plan,
    .forward = res_forward,
    .backward = res_backward,
};

cf_module *cf_residual(cf_module *convpath, cf_module *idpath, bool relu_after) {
    residual_impl *r = cf_calloc(1, sizeof *r);
    cf_module *m = r ? cf_module_new(&residual_ops, r) : NULL;
    if (!m || !convpath) {
        cf_module_free(m);
        cf_module_free(convpath);
        cf_module_free(idpath);
        if (!convpath) cf_fail(CF_ERR_INVALID, "cf_residual: NULL convpath");
        return NULL;
    }
    r->relu_after = relu_after;
    r->has_idpath = idpath != NULL;
    if (cf_module_add_child(m, convpath, "convpath") != CF_OK ||
        (idpath && cf_module_add_child(m, idpath, "idpath") != CF_OK)) {
        if (m->n_children == 1 && idpath) cf_module_free(idpath);
        cf_module_free(m);
        return NULL;
    }
    return m;
}
