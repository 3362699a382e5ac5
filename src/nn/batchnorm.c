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
 * Channel planes (BatchNorm2d, BatchNorm1d on (N, C, L)) go through the tensor layer's plane
 * kernels (cf_bn_plane_*: one-pass shifted sums in vector lanes, then double per plane); rows of
 * features (BatchNorm1d on (N, C)) take two passes in double here. Large inputs of planes are
 * split over the threads by images, as the convolutions split them (see "the image split"
 * below); each channel's sums are added in image order whatever the split, so results do not
 * depend on the thread count.
 *
 * Fused with a following ReLU (planned by Sequential, see nn_internal.h) the layer writes
 * max(y, 0) and, in backward, uses dy where y > 0 and 0 elsewhere in place of dy, in every path;
 * results are bitwise those of BatchNorm then ReLU. The planes path does not read y back: it
 * recomputes x * scale + shift with the forward's per-channel scale and shift (kept in the arena),
 * which gives y's sign exactly. As the last layer of a residual block's idpath (or of the convpath
 * of a block without idpath) it may also be asked to write the block's max(a + y, 0)
 * (cf_nn_bn_forward_add_relu; the backward is then the plain one: the block masks the gradient).
 * As that fold it may compute its a, the convpath's last BatchNorm's output, itself: that layer
 * then writes no output (nn_internal.h, cf_nn_bn_fold_addend).
 *
 * Synchronised (cf_model_set_bn_reduce): a training forward first takes this replica's sums per
 * channel, has the group reduce them, and normalises with the whole batch's statistics through
 * the same output path as eval; a backward takes this replica's sums (and its weight and bias
 * gradients), has them reduced, and forms dx with them and the total count. */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

enum { P_WEIGHT, P_BIAS, P_RMEAN, P_RVAR, P_COUNT };

typedef struct bn_impl {
    int features;
    bool spatial;
    float eps, momentum;
    bool fwd_training;     /* mode of the last forward */
    const cf_module *relu; /* the ReLU fused after this layer (planned by Sequential) */
    bool fwd_relu;         /* the last forward applied the ReLU */
    /* scratch from the arena, per channel */
    float *mean, *invstd; /* statistics the last forward used */
    float *coef;          /* 3C: backward coefficients (1d path) */
    double *acc;          /* 2C: sums */
    float *ss;            /* 2C: scale and shift of the last forward (planes paths) */
    cf_arena *arena;      /* for the image split's per-image sums (a transient block) */
    int part_n;           /* images the reserved block has room for */
    /* synchronised statistics (NULL: this replica's own) */
    cf_bn_reduce_fn reduce;
    void *reduce_ctx;
    double *sync;     /* 1 + 2C doubles for reduce (allocated when reduce is set) */
    double fwd_count; /* values per channel the last training forward normalised over */
    /* the forward link (nn_internal.h): the Conv2d planned right after this layer (and its
     * ReLU), and whether the last forward wrote that convolution's bf16 input words instead of
     * its output */
    cf_module *feed_conv;
    const cf_module_ops *feed_relu_ops; /* the fused ReLU's ops when linked (NULL: no ReLU) */
    bool fwd_words;
    /* a residual fold linked to the next block's pair (cf_nn_bn_fold_feed_conv): the fold's
     * block and its ops when linked */
    const cf_module *feed_block;
    const cf_module_ops *feed_block_ops;
    /* ... and the block's other mask taker, its convpath's last BatchNorm, with its ops then */
    const cf_module *feed_taker;
    const cf_module_ops *feed_taker_ops;
    /* the Conv2d before this layer in a Sequential, which may read this layer's dx as bf16
     * words (nn_internal.h, cf_nn_bn_link_conv), and whether the last backward wrote them */
    cf_module *dy_conv;
    bool dxw_wrote;
    /* the residual fold (nn_internal.h, cf_nn_bn_fold_addend): on the fold, the convpath's last
     * BatchNorm whose output it may compute itself (addend); on that BatchNorm, the fold that
     * armed its next forward (armed), and whether its last forward left its output to the fold
     * (deferred: statistics, scale and shift set, y not written) */
    cf_module *addend;
    cf_module *armed;
    bool deferred, pending; /* pending: deferred and not yet computed by the fold */
    /* a residual block's ReLU mask as bits (nn_internal.h, cf_nn_bn_forward_fold_mask): whether
     * the last forward wrote it; and the mask the next backward applies to its dy (dy_mask_for:
     * the block's gradient it was armed with) */
    bool fwd_mask;
    const uint16_t *dy_mask;
    const float *dy_mask_for;
    /* the statistics link (nn_internal.h, cf_nn_conv_stats_bn): the Conv2d planned right before
     * this layer, whose forward may take its per-image sums (NULL: none), and whether the last
     * forward took them */
    cf_module *stats_from;
    bool fwd_stats;
    /* the stem dx link (nn_internal.h, cf_nn_conv_dy_fill): the dy of the last backward, whose
     * dx it left to dy_conv's fill (dx_left) */
    const float *fill_dy;
    bool dx_left;
    const cf_module *held_by; /* cf_nn_bn_dy_held: the child run next, holding dy until then */
    bool paired; /* the last backward ran beside its block's other BatchNorm (backward_pair) */
} bn_impl;

/* The passes' test switch (cf__nn_set_bn_fused_passes): off, a linked forward writes its words
 * through an fp32 buffer and no output is left to a fold, as before both existed. */
static atomic_bool fused_passes_off;

/* The fold's words link's switch (cf__nn_set_fold_words_link). */
static atomic_bool fold_words_off;

void cf__nn_set_fold_words_link(bool on) {
    atomic_store(&fold_words_off, !on);
}

void cf__nn_set_bn_fused_passes(bool on) {
    atomic_store(&fused_passes_off, !on);
}

/* The pair's test switch (cf__nn_set_bn_pair_backward): off, cf_nn_bn_backward_pair declines. */
static atomic_bool pair_backward_off;

void cf__nn_set_bn_pair_backward(bool on) {
    atomic_store(&pair_backward_off, !on);
}

/* The upstream gradient at i in the rows path: dy, or, with a fused ReLU whose
 * output is y, dy where y > 0 and 0 elsewhere (ReLU's backward). */
#define DY_AT(i) (y && !(y[i] > 0.0f) ? 0.0f : dy[i])

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
    b->arena = arena;
    b->part_n = in->ndim > 2 ? in->dim[0] : 0; /* planes only */
    if (b->part_n) cf_arena_reserve_transient(arena, 2 * (size_t)b->part_n * c * sizeof(double));
}

void cf_nn_bn_stats_from(cf_module *bn, cf_module *conv) {
    if (cf_nn_is_batchnorm(bn)) ((bn_impl *)bn->impl)->stats_from = conv;
}

bool cf_nn_bn_took_stats(const cf_module *bn) {
    return cf_nn_is_batchnorm(bn) && ((const bn_impl *)bn->impl)->fwd_stats;
}

static const cf_module_ops bn1d_ops, bn2d_ops;

bool cf_nn_is_batchnorm(const cf_module *m) {
    return m && (m->ops == &bn1d_ops || m->ops == &bn2d_ops);
}

void cf_nn_bn_fuse_relu(cf_module *bn, const cf_module *relu) {
    ((bn_impl *)bn->impl)->relu = relu;
}

void cf_nn_bn_link_conv(cf_module *bn, cf_module *conv) {
    ((bn_impl *)bn->impl)->dy_conv = conv;
}

bool cf_nn_bn_wrote_dx_words(const cf_module *bn) {
    return cf_nn_is_batchnorm(bn) && ((const bn_impl *)bn->impl)->dxw_wrote;
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
    bool sums_ready;  /* backward: acc holds the (reduced) sums; count is their total */
    double count;
    uint16_t *words; /* forward: bf16(y) written here instead of y (the forward link) */
    bool defer;      /* forward: statistics, scale and shift only, y left to the fold */
    /* forward, the fold: the other term computed here as x2 * ss2[c] + ss2[C + c] (the deferred
     * BatchNorm's input, scale and shift) in place of add (NULL: add) */
    const float *x2, *ss2;
    uint16_t *dxh;         /* backward (NULL: none): dx as bf16 words instead (dx is not written) */
    uint16_t *omask;       /* forward, the fold: y > 0 as bits (CF_MASK_WORDS layout) */
    const uint16_t *gmask; /* backward: g = dy where these bits are set, +0 elsewhere */
} bn_ctx;

/* Channels per block of the two passes over planes (statistics, then output; or the gradient
 * sums, then dx): a block's planes of every sample, BN_BLOCK_BYTES for each array read, stay in
 * L2 between its two passes, so the second pass reads from L2 rather than from L3 or memory.
 * Sums still run over the samples in order per channel, so results do not depend on it. */
#define BN_BLOCK_BYTES (256 * 1024)

static int64_t bn_block_channels(const geom *g) {
    const size_t per_channel = (size_t)g->n * (size_t)g->s * sizeof(float);
    const size_t cb = BN_BLOCK_BYTES / (per_channel ? per_channel : 1);
    return cb > 1 ? (int64_t)cb : 1;
}

/* A pair's blocks (cf_nn_bn_backward_pair) read three arrays (dy and both inputs): the same
 * 2 BN_BLOCK_BYTES in L2 between the passes, a third of it each. */
static int64_t bn_pair_block_channels(const geom *g) {
    const size_t per_channel = (size_t)g->n * (size_t)g->s * sizeof(float);
    const size_t cb = 2 * BN_BLOCK_BYTES / 3 / (per_channel ? per_channel : 1);
    return cb > 1 ? (int64_t)cb : 1;
}

/* The one-thread forward writes its output with non-temporal stores (cf_bn_planes_affine_stream)
 * from BN_STREAM_BYTES of output: the output buffer was last touched a step ago, so a plain store
 * first reads each of its lines from memory, and a perf profile of W3 in bf16 put most of the
 * output pass's samples on its stores. Only an output far larger than the caches gains: W3's stem
 * BatchNorm (64 MiB) does; streaming layer1-3's too (16, 8, 4 MiB) made the next convolution's
 * input transforms, which read them, slower by about what it saved (bench/README.md, "W3's
 * BatchNorm and residual passes"). W1's outputs, at most 3.2 MB, keep plain stores. The values
 * are the same either way. */
#define BN_STREAM_BYTES ((size_t)32 << 20)

static bool bn_stream(const geom *g) {
    return (size_t)g->n * (size_t)g->c * (size_t)g->s * sizeof(float) >= BN_STREAM_BYTES;
}

/* BatchNorm's passes ask for the next sample's plane (cf_prefetch, into L1) while they process
 * the current one: a pass jumps a whole sample between chunks of a few KB, and the hardware
 * prefetchers, which follow a stream only after a few misses, start each chunk cold. One plane
 * at a time, beside the work: a chunk's worth at once held the fill buffers. */
static void bn_prefetch_plane(const float *p, size_t s, bool write) {
    cf_prefetch(p, s * sizeof(float), write, true);
}

/* The one-thread passes' planes, CF_BN_PLANES at a time in one kernel call (see
 * cf_bn_planes_sums): consecutive planes in the order of the pass, sample-major, whether they
 * are channels of one sample or, where a block holds fewer channels, one channel of several
 * samples. Each plane's sums are added to its channel's in that order, as one call per plane
 * added them. */
typedef struct plane_queue {
    int np;
    int64_t s;
    const float *x[CF_BN_PLANES], *dy[CF_BN_PLANES];
    const uint16_t *mask[CF_BN_PLANES]; /* backward with a block's mask */
    float k[CF_BN_PLANES], scale[CF_BN_PLANES], shift[CF_BN_PLANES];
    double *s1[CF_BN_PLANES], *s2[CF_BN_PLANES];
} plane_queue;

/* Forward: shifted sums (k: the shift), added to *s1[i], *s2[i] in order. */
static void queue_sums(plane_queue *q) {
    if (!q->np) return;
    double a1[CF_BN_PLANES], a2[CF_BN_PLANES];
    cf_bn_planes_sums(q->np, q->x, q->s, q->k, a1, a2);
    for (int i = 0; i < q->np; i++) {
        *q->s1[i] += a1[i];
        *q->s2[i] += a2[i];
    }
    q->np = 0;
}

/* Backward: gradient sums (k: the mean), added to *s1[i], *s2[i] in order. */
static void queue_dy_sums(plane_queue *q, bool relu, bool masked) {
    if (!q->np) return;
    if (masked)
        cf_bn_planes_dy_sums_mask(q->np, q->dy, q->x, q->s, q->k, q->mask, q->s1, q->s2);
    else
        cf_bn_planes_dy_sums(q->np, q->dy, q->x, q->s, q->k, relu, q->scale, q->shift, q->s1,
                             q->s2);
    q->np = 0;
}

/* The statistics of channels [c0, c1) from the shifted sums in acc (s1 in acc[0, C), s2 in
 * acc[C, 2C)): the mean, 1/std, and the biased variance in acc[0, C) for the running statistics. */
static void bn_finish_stats(bn_ctx *ctx, int64_t c0, int64_t c1) {
    bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    const double count = (double)g.n * (double)g.s;
    const size_t cs = (size_t)g.s;
    const double *s1 = b->acc, *s2 = b->acc + g.c;
    for (int64_t c = c0; c < c1; c++) {
        const double d = s1[c] / count;
        double v = s2[c] / count - d * d;
        if (v < 0) v = 0;
        b->mean[c] = (float)(ctx->x[c * cs] + d);
        b->acc[c] = v; /* the biased variance, for the running statistics */
        b->invstd[c] = (float)(1.0 / sqrt(v + b->eps));
    }
}

/* The forward's per-channel scale and shift (ss) of channels [c0, c1). */
static void bn_scale_shift(bn_ctx *ctx, int64_t c0, int64_t c1) {
    bn_impl *b = ctx->m->impl;
    const float *gamma = ctx->m->params[P_WEIGHT].data, *beta = ctx->m->params[P_BIAS].data;
    float *scale = b->ss, *shift = b->ss + ctx->g.c;
    for (int64_t c = c0; c < c1; c++) {
        scale[c] = gamma[c] * b->invstd[c];
        shift[c] = beta[c] - b->mean[c] * scale[c];
    }
}

/* Planes of the forward link's output written through an L1 buffer, BN_WORDS_CHUNK floats. */
#define BN_WORDS_CHUNK 2048

/* The forward link's output (nn_internal.h): the nc planes of s values from offset at, as bf16
 * words at ctx->words + at in place of y: the words the convolution would have rounded y to, and
 * the cold fp32 output is neither read for ownership nor written. cf_bn_planes_affine_bf16 rounds
 * each vector as it computes it; with the passes' test switch off, cf_bn_planes_affine computes
 * them into a buffer in L1 (a few planes, or part of a plane, at a time: the values do not depend
 * on the grouping, each is its own x * scale + shift) and cf_fp32_to_bf16 rounds them. */
static void bn_affine_words(const bn_ctx *ctx, size_t at, int nc, const float *scale,
                            const float *shift, ptrdiff_t ahead) {
    const int64_t s = ctx->g.s;
    if (!atomic_load_explicit(&fused_passes_off, memory_order_relaxed)) {
        /* each vector rounded in registers where the level has it (no buffer) */
        cf_bn_planes_affine_bf16(ctx->x + at, ctx->words + at, s, nc, scale, shift, ctx->relu,
                                 ahead);
        return;
    }
    float buf[BN_WORDS_CHUNK];
    if (s > BN_WORDS_CHUNK) {
        for (int i = 0; i < nc; i++)
            for (int64_t j = 0; j < s; j += BN_WORDS_CHUNK) {
                const int64_t len = s - j < BN_WORDS_CHUNK ? s - j : BN_WORDS_CHUNK;
                const size_t p = at + (size_t)i * (size_t)s + (size_t)j;
                cf_bn_planes_affine(ctx->x + p, NULL, buf, len, 1, scale + i, shift + i, ctx->relu,
                                    0);
                cf_fp32_to_bf16(buf, ctx->words + p, (size_t)len);
            }
        return;
    }
    const int per = (int)(BN_WORDS_CHUNK / s);
    for (int i = 0; i < nc; i += per) {
        const int np = nc - i < per ? nc - i : per;
        const size_t p = at + (size_t)i * (size_t)s;
        cf_bn_planes_affine(ctx->x + p, NULL, buf, s, np, scale + i, shift + i, ctx->relu, 0);
        cf_fp32_to_bf16(buf, ctx->words + p, (size_t)np * (size_t)s);
    }
}

/* The fold's output with the block's mask bits: nc planes from offset at (plane index p), the
 * channels' constants from c0. */
static void bn_fold_mask_out(const bn_ctx *ctx, size_t at, size_t p, int nc, int64_t c0,
                             ptrdiff_t ahead) {
    const bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    if (ctx->words) { /* the next block's words in place of y (cf_nn_bn_fold_feed_conv) */
        cf_bn_planes_fold_mask_bf16(ctx->x + at, ctx->x2 ? NULL : ctx->add + at,
                                    ctx->x2 ? ctx->x2 + at : NULL, ctx->words + at, g.s, nc,
                                    b->ss + c0, b->ss + g.c + c0, ctx->x2 ? ctx->ss2 + c0 : NULL,
                                    ctx->x2 ? ctx->ss2 + g.c + c0 : NULL,
                                    ctx->omask + p * CF_MASK_WORDS((size_t)g.s), ahead);
        return;
    }
    cf_bn_planes_fold_mask(
        ctx->x + at, ctx->x2 ? NULL : ctx->add + at, ctx->x2 ? ctx->x2 + at : NULL, ctx->y + at,
        g.s, nc, b->ss + c0, b->ss + g.c + c0, ctx->x2 ? ctx->ss2 + c0 : NULL,
        ctx->x2 ? ctx->ss2 + g.c + c0 : NULL, ctx->omask + p * CF_MASK_WORDS((size_t)g.s), ahead);
}

static void bn_forward_block(bn_ctx *ctx, int64_t c0, int64_t c1) {
    bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    /* Sample-major: the planes of channels [c0, c1) of one sample are contiguous, so memory is
     * read in order (a channel-major walk jumps a whole sample per plane and defeats the
     * prefetchers). Each plane's sums go into double per channel; the order of the additions
     * per channel is fixed (sample 0, 1, ...), whatever the channel split. */
    const size_t cs = (size_t)g.s;
    if (ctx->training) {
        double *s1 = b->acc, *s2 = b->acc + g.c;
        for (int64_t c = c0; c < c1; c++) s1[c] = s2[c] = 0;
        plane_queue q = {.s = g.s};
        for (int n = 0; n < g.n; n++) {
            const float *xn = ctx->x + (size_t)n * g.c * cs;
            const bool ahead = n + 1 < g.n;
            for (int64_t c = c0; c < c1; c++) {
                if (ahead) bn_prefetch_plane(xn + ((size_t)g.c + c) * cs, cs, false);
                q.x[q.np] = xn + c * cs;
                q.k[q.np] = ctx->x[c * cs];
                q.s1[q.np] = &s1[c];
                q.s2[q.np] = &s2[c];
                if (++q.np == CF_BN_PLANES) queue_sums(&q);
            }
        }
        queue_sums(&q);
        bn_finish_stats(ctx, c0, c1);
    }
    bn_scale_shift(ctx, c0, c1);
    if (ctx->defer) return; /* the fold writes the output */
    const float *scale = b->ss, *shift = b->ss + g.c;
    const int nc = (int)(c1 - c0);
    const bool stream = bn_stream(&g);
    for (int n = 0; n < g.n; n++) {
        const size_t at = (size_t)n * g.c * cs + (size_t)c0 * cs;
        const ptrdiff_t ahead = n + 1 < g.n ? (ptrdiff_t)(g.c * cs) : 0; /* the next sample's */
        if (ctx->omask) { /* never streamed either (bn_forward_with); the fold's words too */
            bn_fold_mask_out(ctx, at, (size_t)n * g.c + (size_t)c0, nc, c0, ahead);
            continue;
        }
        if (ctx->words) {
            bn_affine_words(ctx, at, nc, scale + c0, shift + c0, ahead);
            continue;
        }
        if (ctx->x2) { /* never streamed: a deferring layer's output is not (bn_defer) */
            cf_bn_planes_affine_add2(ctx->x + at, ctx->x2 + at, ctx->y + at, g.s, nc, scale + c0,
                                     shift + c0, ctx->ss2 + c0, ctx->ss2 + g.c + c0, ahead);
            continue;
        }
        (stream ? cf_bn_planes_affine_stream
                : cf_bn_planes_affine)(ctx->x + at, ctx->add ? ctx->add + at : NULL, ctx->y + at,
                                       g.s, nc, scale + c0, shift + c0, ctx->relu, ahead);
    }
}

/* Channel planes (s > 1): statistics (training) and output for channels [c0, c1). */
static void bn_forward_planes(void *vctx, int64_t c0, int64_t c1, int thread) {
    (void)thread;
    bn_ctx *ctx = vctx;
    const int64_t cb = bn_block_channels(&ctx->g);
    for (int64_t b0 = c0; b0 < c1; b0 += cb) bn_forward_block(ctx, b0, b0 + cb < c1 ? b0 + cb : c1);
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

/* ---- the image split ------------------------------------------------------------------------
 * With more than one thread the planes paths split the batch by images, in the contiguous ranges
 * cf_parallel_for gives the convolutions (conv.c splits its batch the same way, and the pooling
 * and elementwise layers follow image boundaries: nn_internal.h, cf_nn_parallel_images), so
 * each thread reads the images it wrote itself in the layer before and writes the ones it will
 * read in the layer after: no activation crosses between cores at a BatchNorm. A split by
 * channels would move the whole tensor between the cores twice per pass.
 *
 * The statistics then take two jobs: the first takes each image's sums per channel (the plane
 * kernels' sums, one image at a time, into a transient block of 2 C doubles per image), the
 * caller adds them per channel in image order, and the second job writes the output (forward)
 * or dx (backward). The additions and their order are those of the one-thread path (which adds
 * each image's plane sums in image order too), so results are bitwise the same for every thread
 * count. One thread keeps the channel-blocked passes above: a block's planes stay in L2 between
 * the two passes, which a pass over the whole batch cannot do. */

static bool split_images(const geom *g) {
    return g->n > 1 && (int64_t)g->n * g->c * g->s >= (1 << 15) && cf_get_num_threads() > 1;
}

typedef struct bn_split {
    bn_ctx *ctx;
    double *part; /* per image n: part[2 C n + c] and part[2 C n + C + c], channel c's sums */
} bn_split;

/* A block for 2 C sums per image, or NULL (the channel-split path is then taken). */
static double *split_take(const bn_ctx *ctx) {
    bn_impl *b = ctx->m->impl;
    if (!b->arena || ctx->g.n > b->part_n) return NULL;
    return cf_arena_take(b->arena, 2 * (size_t)ctx->g.n * ctx->g.c * sizeof(double), b);
}

/* Adds each image's sums into acc per channel, in image order. */
static void split_combine(const bn_ctx *ctx, const double *part) {
    bn_impl *b = ctx->m->impl;
    const int nc = 2 * ctx->g.c;
    double *restrict acc = b->acc;
    for (int c = 0; c < nc; c++) acc[c] = 0;
    for (int n = 0; n < ctx->g.n; n++) {
        const double *restrict p = part + (size_t)n * nc;
        for (int c = 0; c < nc; c++) acc[c] += p[c];
    }
}

/* Forward: the shifted sums of each image's planes (k: the channel's first value, image 0's). */
static void split_forward_sums(void *v, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const bn_split *sp = v;
    const bn_ctx *ctx = sp->ctx;
    const geom g = ctx->g;
    const size_t cs = (size_t)g.s;
    for (int64_t n = n0; n < n1; n++) {
        const float *xn = ctx->x + (size_t)n * g.c * cs;
        double *p = sp->part + (size_t)n * 2 * g.c;
        for (int c = 0; c < g.c; c += CF_BN_PLANES) {
            const int np = g.c - c < CF_BN_PLANES ? g.c - c : CF_BN_PLANES;
            const float *xs[CF_BN_PLANES];
            float ks[CF_BN_PLANES];
            for (int i = 0; i < np; i++) {
                xs[i] = xn + (c + i) * cs;
                ks[i] = ctx->x[(c + i) * cs];
            }
            cf_bn_planes_sums(np, xs, g.s, ks, &p[c], &p[g.c + c]);
        }
    }
}

static void split_forward_out(void *v, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const bn_ctx *ctx = v;
    const bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    const size_t cs = (size_t)g.s;
    const float *scale = b->ss, *shift = b->ss + g.c;
    for (int64_t n = n0; n < n1; n++) {
        const size_t at = (size_t)n * g.c * cs;
        if (ctx->omask)
            bn_fold_mask_out(ctx, at, (size_t)n * g.c, g.c, 0, 0);
        else if (ctx->words)
            bn_affine_words(ctx, at, g.c, scale, shift, 0);
        else if (ctx->x2)
            cf_bn_planes_affine_add2(ctx->x + at, ctx->x2 + at, ctx->y + at, g.s, g.c, scale, shift,
                                     ctx->ss2, ctx->ss2 + g.c, 0);
        else
            cf_bn_planes_affine(ctx->x + at, ctx->add ? ctx->add + at : NULL, ctx->y + at, g.s, g.c,
                                scale, shift, ctx->relu, 0);
    }
}

/* The planes forward split by images; false when it cannot take its block (nothing done). */
static bool bn_forward_split(bn_ctx *ctx) {
    bn_impl *b = ctx->m->impl;
    if (ctx->training) {
        double *part = split_take(ctx);
        if (!part) return false;
        bn_split sp = {ctx, part};
        cf_parallel_for(ctx->g.n, split_forward_sums, &sp);
        split_combine(ctx, part);
        cf_arena_give(b->arena, part, NULL);
        bn_finish_stats(ctx, 0, ctx->g.c);
    }
    bn_scale_shift(ctx, 0, ctx->g.c);
    if (!ctx->defer) cf_parallel_for(ctx->g.n, split_forward_out, ctx);
    return true;
}

/* Calls the synchronised reduce on buf (n doubles, buf[0] the count). A failed reduce, or one
 * that leaves no positive count, is the pass's error (cf_module_fail, which cf_model_forward /
 * cf_model_backward return): the layer then goes on with this replica's own sums so that its
 * outputs stay finite, but they are not the group's. Returns whether the reduce succeeded. */
static bool bn_reduce_checked(cf_module *m, double *buf, size_t n, bool backward,
                              const char *pass) {
    bn_impl *b = m->impl;
    const double own = buf[0];
    const cf_status st = b->reduce(buf, n, backward, b->reduce_ctx);
    if (st != CF_OK) {
        cf_module_fail(st, "%s(%d) %s: the synchronised reduce failed (%s): %s", bn_name(m),
                       b->features, pass, cf_status_str(st), cf_last_error());
        return false;
    }
    if (!(buf[0] > 0)) {
        cf_module_fail(CF_ERR_STATE,
                       "%s(%d) %s: the synchronised reduce gave a count of %g values per channel "
                       "(this replica's %g); it must be > 0",
                       bn_name(m), b->features, pass, buf[0], own);
        return false;
    }
    return true;
}

/* Synchronised training forward: this replica's count and sums of x and x^2 per channel,
 * reduced over the group, become the batch statistics (b->mean, b->invstd, the biased variance
 * in b->acc). Returns the total count; a failed reduce is the pass's error, and this replica's
 * count and statistics are used then. */
static double bn_sync_stats(cf_module *m, const bn_ctx *ctx) {
    bn_impl *b = m->impl;
    const geom g = ctx->g;
    const size_t cs = (size_t)g.s;
    double *buf = b->sync, *sx = buf + 1, *sxx = buf + 1 + g.c;
    const double count = (double)g.n * (double)g.s;
    buf[0] = count;
    /* the planes' sums split by images where that runs (the same sums, see the image split) */
    double *part = g.s > 1 && split_images(&g) ? split_take(ctx) : NULL;
    if (part) {
        bn_split sp = {(bn_ctx *)ctx, part};
        cf_parallel_for(g.n, split_forward_sums, &sp);
    }
    for (int c = 0; c < g.c; c++) {
        double a1 = 0, a2 = 0;
        const float k = g.s > 1 ? ctx->x[c * cs] : 0.0f;
        for (int n = 0; n < g.n && part; n++) {
            a1 += part[(size_t)n * 2 * g.c + c];
            a2 += part[(size_t)n * 2 * g.c + g.c + c];
        }
        for (int n = 0; n < g.n && !part; n++) {
            const float *p = ctx->x + ((size_t)n * g.c + c) * cs;
            if (g.s > 1) {
                double p1, p2;
                cf_bn_plane_sums(p, g.s, k, &p1, &p2);
                a1 += p1, a2 += p2;
            } else {
                a1 += p[0], a2 += (double)p[0] * p[0];
            }
        }
        /* unshifted: sum x = count k + a1, sum x^2 = a2 + 2 k a1 + count k^2 */
        sx[c] = count * k + a1;
        sxx[c] = a2 + 2.0 * k * a1 + count * (double)k * k;
    }
    if (part) cf_arena_give(b->arena, part, NULL);
    /* this replica's sums, kept in acc (2C doubles) in case the reduce fails part way */
    memcpy(b->acc, sx, 2 * (size_t)g.c * sizeof(double));
    const bool ok = bn_reduce_checked(m, buf, 1 + 2 * (size_t)g.c, false, "forward");
    if (!ok) memcpy(sx, b->acc, 2 * (size_t)g.c * sizeof(double));
    const double total = ok ? buf[0] : count;
    for (int c = 0; c < g.c; c++) {
        const double mean = sx[c] / total;
        double v = sxx[c] / total - mean * mean;
        if (v < 0) v = 0;
        b->mean[c] = (float)mean;
        b->acc[c] = v;
        b->invstd[c] = (float)(1.0 / sqrt(v + b->eps));
    }
    return total;
}

void cf_nn_bn_feed_conv(cf_module *bn, cf_module *conv) {
    bn_impl *b = bn->impl;
    b->feed_conv = conv;
    b->feed_relu_ops = conv && b->relu ? b->relu->ops : NULL;
    b->feed_block = NULL;
    b->feed_block_ops = NULL;
    b->feed_taker = NULL;
    b->feed_taker_ops = NULL;
}

void cf_nn_bn_fold_feed_conv(cf_module *fold, cf_module *conv, const cf_module *block,
                             const cf_module *taker) {
    if (!cf_nn_is_batchnorm(fold)) return;
    bn_impl *b = fold->impl;
    cf_nn_bn_feed_conv(fold, conv && block && cf_nn_is_batchnorm(taker) && !b->relu ? conv : NULL);
    b->feed_block = b->feed_conv ? block : NULL;
    b->feed_block_ops = b->feed_block ? block->ops : NULL;
    b->feed_taker = b->feed_conv ? taker : NULL;
    b->feed_taker_ops = b->feed_taker ? taker->ops : NULL;
}

bool cf_nn_bn_wrote_words(const cf_module *bn) {
    return cf_nn_is_batchnorm(bn) && ((const bn_impl *)bn->impl)->fwd_words;
}

/* Where this forward writes its output as the linked convolution's bf16 input words (NULL:
 * y in fp32, as always): a training forward of planes (the rows path reads y back in backward)
 * without a residual sum (but a fold linked to the next block, writing the mask bits, its
 * block's ops its own), whose own ops and ReLU's (when fused: the ReLU passes y through) are
 * their layers' (a wrapper could read y; the ReLU's are those it had when linked, ReLU's own),
 * when the convolution's next forward reads its input
 * as words only (cf_nn_conv_words_target). Otherwise the convolution is told that no words were
 * written, so that it never takes stale ones. */
static uint16_t *bn_words_target(cf_module *m, const cf_tensor *x, const float *add,
                                 const uint16_t *mask) {
    bn_impl *b = m->impl;
    if (!b->feed_conv) return NULL;
    const geom g = geometry(&x->shape);
    const bool own =
        cf_nn_is_batchnorm(m) && (b->relu ? b->relu->ops == b->feed_relu_ops : !b->feed_relu_ops);
    /* a fold (cf_nn_bn_fold_feed_conv): only with the mask bits (bn_forward_with's omask) */
    const bool fold = b->feed_block && b->feed_block->ops == b->feed_block_ops && add && mask &&
                      b->feed_taker->ops == b->feed_taker_ops && !b->relu && !bn_stream(&g) &&
                      !atomic_load_explicit(&fold_words_off, memory_order_relaxed);
    uint16_t *words = own && m->training && (b->feed_block ? fold : !add) && g.s > 1 && g.n > 0
                          ? cf_nn_conv_words_target(b->feed_conv, &x->shape)
                          : NULL;
    cf_nn_conv_words_written(b->feed_conv, NULL);
    return words;
}

void cf_nn_bn_fold_addend(cf_module *fold, cf_module *bn) {
    bn_impl *f = fold->impl;
    f->addend = bn && cf_nn_is_batchnorm(bn) ? bn : NULL;
    f->armed = NULL;
}

void cf_nn_bn_fold_arm(cf_module *fold) {
    if (!cf_nn_is_batchnorm(fold)) return; /* wrapped since the plan: no deferral */
    cf_module *a = ((bn_impl *)fold->impl)->addend;
    if (a && cf_nn_is_batchnorm(a)) ((bn_impl *)a->impl)->armed = fold;
}

bool cf_nn_bn_deferred(const cf_module *bn) {
    return cf_nn_is_batchnorm(bn) && ((const bn_impl *)bn->impl)->deferred;
}

/* Whether this forward leaves its output to the fold that armed it (cf_nn_bn_fold_arm, once):
 * planes whose output would not be streamed, no fused ReLU, no residual sum of its own, no words,
 * both layers' ops their own (a wrapper could read y), and the fold still linked to this layer. */
static bool bn_defer(cf_module *m, const cf_tensor *x, const float *add, const uint16_t *words) {
    bn_impl *b = m->impl;
    cf_module *fold = b->armed;
    b->armed = NULL;
    if (!fold || atomic_load_explicit(&fused_passes_off, memory_order_relaxed)) return false;
    const geom g = geometry(&x->shape);
    return cf_nn_is_batchnorm(m) && cf_nn_is_batchnorm(fold) &&
           ((const bn_impl *)fold->impl)->addend == m && !b->relu && !add && !words && g.s > 1 &&
           g.n > 0 && !bn_stream(&g);
}

/* A deferred layer's output written after all (the fold's add was not its output). */
static void bn_write_deferred(cf_module *a) {
    const bn_impl *ab = a->impl;
    const geom g = geometry(&a->in->shape);
    const size_t per = (size_t)g.c * (size_t)g.s;
    for (int n = 0; n < g.n; n++)
        cf_bn_planes_affine(a->in->data + n * per, NULL, a->out.data + n * per, g.s, g.c, ab->ss,
                            ab->ss + g.c, false, 0);
}

/* The fold (add: the convpath's output) computes its addend's output itself where that layer
 * deferred it and add is that output: ctx's x2 and ss2. */
static void bn_fold_take(cf_module *m, const cf_tensor *x, const float *add, bn_ctx *ctx) {
    bn_impl *b = m->impl;
    cf_module *a = b->addend;
    if (!a) return;
    ((bn_impl *)a->impl)->armed = NULL;
    bn_impl *ab = a->impl;
    if (!ab->pending) return;
    ab->pending = false;
    if (add && add == a->out.data && cf_shape_equal(&a->in->shape, &x->shape) &&
        x->shape.ndim > 2) {
        ctx->x2 = a->in->data;
        ctx->ss2 = ab->ss;
    } else {
        bn_write_deferred(a);
    }
}

/* add: NULL, or a residual block's other path: y = max(add + bn(x), 0). */
static const cf_tensor *bn_forward_with(cf_module *m, const cf_tensor *x, const float *add,
                                        uint16_t *mask) {
    bn_impl *b = m->impl;
    m->in = x;
    cf_tensor *y = cf_module_output(m, &x->shape);
    bn_ctx ctx = {.m = m,
                  .x = x->data,
                  .y = y->data,
                  .g = geometry(&x->shape),
                  .training = m->training,
                  .relu = b->relu != NULL,
                  .add = add};
    const int c = ctx.g.c;
    b->fwd_training = m->training;
    b->fwd_relu = ctx.relu;
    ctx.words = bn_words_target(m, x, add, mask);
    b->fwd_words = ctx.words != NULL;
    ctx.defer = bn_defer(m, x, add, ctx.words);
    b->deferred = b->pending = ctx.defer;
    bn_fold_take(m, x, add, &ctx);
    /* the block's mask: planes whose output is not streamed (the masked kernel stores plainly) */
    ctx.omask = mask && add && ctx.g.s > 1 && ctx.g.n > 0 && !bn_stream(&ctx.g) ? mask : NULL;
    b->fwd_mask = ctx.omask != NULL;
    if (!m->training) {
        const float *rm = m->params[P_RMEAN].data, *rv = m->params[P_RVAR].data;
        for (int f = 0; f < c; f++) {
            b->mean[f] = rm[f];
            b->invstd[f] = (float)(1.0 / sqrt((double)rv[f] + b->eps));
        }
    }
    double count = (double)ctx.g.n * (double)ctx.g.s;
    if (m->training && b->reduce) {
        count = bn_sync_stats(m, &ctx);
        ctx.training = false; /* normalise with the statistics just set, as eval does */
    }
    b->fwd_count = count;
    /* the sums the linked convolution's forward took of x (the statistics link): only the
     * output pass is left, as eval's. Whether this layer could take them, for its next forward. */
    const bool can_take = !b->reduce && cf_nn_is_batchnorm(m) && ctx.g.s > 1 &&
                          x->shape.ndim == 4 && ctx.g.n <= b->part_n;
    const double *part = b->stats_from ? cf_nn_conv_stats_sums(b->stats_from, x) : NULL;
    b->fwd_stats = ctx.training && can_take && part;
    if (b->stats_from) cf_nn_conv_stats_want(b->stats_from, can_take || !m->training);
    if (b->fwd_stats) {
        split_combine(&ctx, part);
        bn_finish_stats(&ctx, 0, c);
        ctx.training = false;
    }
    if (ctx.g.s == 1)
        bn_forward_rows(&ctx);
    else if (split_images(&ctx.g) && bn_forward_split(&ctx))
        ;
    else if (worth_threads(&ctx.g))
        cf_parallel_for(c, bn_forward_planes, &ctx);
    else
        bn_forward_planes(&ctx, 0, c, 0);
    if (ctx.words) cf_nn_conv_words_written(b->feed_conv, y->data);
    if (m->training) {
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

/* From the gradient sums in acc (sum dy in acc[0, C), sum dy (x - mean) in acc[C, 2C)) of
 * channels [c0, c1): the weight and bias gradients (ctx->grads) and dx's coefficients k1, k2, k3
 * (coef). */
static void bn_backward_coefs(bn_ctx *ctx, int64_t c0, int64_t c1) {
    cf_module *m = ctx->m;
    bn_impl *b = m->impl;
    const geom g = ctx->g;
    const double count = ctx->sums_ready ? ctx->count : (double)g.n * (double)g.s;
    const float *gamma = m->params[P_WEIGHT].data;
    const double *sdy = b->acc, *sdyx = b->acc + g.c;
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
        k[g.c + c] = ctx->training ? (float)(-(double)k1 * invstd * invstd * sdyx[c] / count) : 0;
        k[2 * g.c + c] = ctx->training ? (float)(-(double)k1 * sdy[c] / count) : 0;
    }
}

/* dx of sample n's channels [c0, c1) from the coefficients (coef); the next sample's planes are
 * fetched beside the work. */
static void bn_dx_sample(const bn_ctx *ctx, int n, int64_t c0, int64_t c1) {
    const bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    const size_t cs = (size_t)g.s, mw = CF_MASK_WORDS(cs);
    const float *k = b->coef;
    const int nc = (int)(c1 - c0);
    const size_t at = (size_t)n * g.c * cs + (size_t)c0 * cs;
    const ptrdiff_t ahead = n + 1 < g.n ? (ptrdiff_t)(g.c * cs) : 0;
    const uint16_t *gm = ctx->gmask ? ctx->gmask + ((size_t)n * g.c + c0) * mw : NULL;
    if (gm && ctx->dxh)
        cf_bn_planes_dx_bf16_mask(ctx->dy + at, ctx->x + at, ctx->dxh + at, g.s, nc, b->mean + c0,
                                  k + c0, k + g.c + c0, k + 2 * g.c + c0, gm, ahead);
    else if (gm)
        cf_bn_planes_dx_mask(ctx->dy + at, ctx->x + at, ctx->dx + at, g.s, nc, b->mean + c0, k + c0,
                             k + g.c + c0, k + 2 * g.c + c0, gm, ahead);
    else if (ctx->dxh)
        cf_bn_planes_dx_bf16(ctx->dy + at, ctx->x + at, ctx->dxh + at, g.s, nc, b->mean + c0,
                             k + c0, k + g.c + c0, k + 2 * g.c + c0, ctx->relu, b->ss + c0,
                             b->ss + g.c + c0, ahead);
    else
        cf_bn_planes_dx(ctx->dy + at, ctx->x + at, ctx->dx + at, g.s, nc, b->mean + c0, k + c0,
                        k + g.c + c0, k + 2 * g.c + c0, ctx->relu, b->ss + c0, b->ss + g.c + c0,
                        ahead);
}

static void bn_backward_block(bn_ctx *ctx, int64_t c0, int64_t c1) {
    bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    /* sample-major, as the forward pass */
    const size_t cs = (size_t)g.s, mw = CF_MASK_WORDS(cs);
    {
        double *sdy = b->acc, *sdyx = b->acc + g.c;
        if (!ctx->sums_ready)
            for (int64_t c = c0; c < c1; c++) sdy[c] = sdyx[c] = 0;
        plane_queue q = {.s = g.s};
        for (int n = 0; n < g.n && !ctx->sums_ready; n++) {
            const size_t at = (size_t)n * g.c * cs;
            const bool ahead = n + 1 < g.n;
            for (int64_t c = c0; c < c1; c++) {
                if (ahead) {
                    bn_prefetch_plane(ctx->dy + at + ((size_t)g.c + c) * cs, cs, false);
                    bn_prefetch_plane(ctx->x + at + ((size_t)g.c + c) * cs, cs, false);
                }
                q.dy[q.np] = ctx->dy + at + c * cs;
                q.x[q.np] = ctx->x + at + c * cs;
                if (ctx->gmask) q.mask[q.np] = ctx->gmask + ((size_t)n * g.c + c) * mw;
                q.k[q.np] = b->mean[c];
                q.scale[q.np] = b->ss[c];
                q.shift[q.np] = b->ss[g.c + c];
                q.s1[q.np] = &sdy[c];
                q.s2[q.np] = &sdyx[c];
                if (++q.np == CF_BN_PLANES) queue_dy_sums(&q, ctx->relu, ctx->gmask);
            }
        }
        queue_dy_sums(&q, ctx->relu, ctx->gmask);
        bn_backward_coefs(ctx, c0, c1);
        if (!ctx->need_dx) return;
        for (int n = 0; n < g.n; n++) bn_dx_sample(ctx, n, c0, c1);
    }
}

static void bn_backward_planes(void *vctx, int64_t c0, int64_t c1, int thread) {
    (void)thread;
    bn_ctx *ctx = vctx;
    const int64_t cb = bn_block_channels(&ctx->g);
    for (int64_t b0 = c0; b0 < c1; b0 += cb)
        bn_backward_block(ctx, b0, b0 + cb < c1 ? b0 + cb : c1);
}

/* Backward: each image's gradient sums (see cf_bn_plane_dy_sums). */
static void split_backward_sums(void *v, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const bn_split *sp = v;
    const bn_ctx *ctx = sp->ctx;
    const bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    const size_t cs = (size_t)g.s;
    for (int64_t n = n0; n < n1; n++) {
        const size_t at = (size_t)n * g.c * cs;
        double *p = sp->part + (size_t)n * 2 * g.c;
        for (int c = 0; c < g.c; c++) p[c] = p[g.c + c] = 0;
        for (int c = 0; c < g.c; c += CF_BN_PLANES) {
            const int np = g.c - c < CF_BN_PLANES ? g.c - c : CF_BN_PLANES;
            const float *dys[CF_BN_PLANES], *xs[CF_BN_PLANES];
            const uint16_t *ms[CF_BN_PLANES];
            double *s1[CF_BN_PLANES], *s2[CF_BN_PLANES];
            for (int i = 0; i < np; i++) {
                dys[i] = ctx->dy + at + (c + i) * cs;
                xs[i] = ctx->x + at + (c + i) * cs;
                ms[i] =
                    ctx->gmask ? ctx->gmask + ((size_t)n * g.c + c + i) * CF_MASK_WORDS(cs) : NULL;
                s1[i] = &p[c + i];
                s2[i] = &p[g.c + c + i];
            }
            if (ctx->gmask)
                cf_bn_planes_dy_sums_mask(np, dys, xs, g.s, b->mean + c, ms, s1, s2);
            else
                cf_bn_planes_dy_sums(np, dys, xs, g.s, b->mean + c, ctx->relu, b->ss + c,
                                     b->ss + g.c + c, s1, s2);
        }
    }
}

static void split_backward_dx(void *v, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const bn_ctx *ctx = v;
    const bn_impl *b = ctx->m->impl;
    const geom g = ctx->g;
    const size_t cs = (size_t)g.s;
    const float *k = b->coef;
    for (int64_t n = n0; n < n1; n++) {
        const size_t at = (size_t)n * g.c * cs;
        const uint16_t *gm = ctx->gmask ? ctx->gmask + (size_t)n * g.c * CF_MASK_WORDS(cs) : NULL;
        if (gm && ctx->dxh)
            cf_bn_planes_dx_bf16_mask(ctx->dy + at, ctx->x + at, ctx->dxh + at, g.s, g.c, b->mean,
                                      k, k + g.c, k + 2 * g.c, gm, 0);
        else if (gm)
            cf_bn_planes_dx_mask(ctx->dy + at, ctx->x + at, ctx->dx + at, g.s, g.c, b->mean, k,
                                 k + g.c, k + 2 * g.c, gm, 0);
        else if (ctx->dxh)
            cf_bn_planes_dx_bf16(ctx->dy + at, ctx->x + at, ctx->dxh + at, g.s, g.c, b->mean, k,
                                 k + g.c, k + 2 * g.c, ctx->relu, b->ss, b->ss + g.c, 0);
        else
            cf_bn_planes_dx(ctx->dy + at, ctx->x + at, ctx->dx + at, g.s, g.c, b->mean, k, k + g.c,
                            k + 2 * g.c, ctx->relu, b->ss, b->ss + g.c, 0);
    }
}

/* The planes backward split by images; false when it cannot take its block (nothing done). */
static bool bn_backward_split(bn_ctx *ctx) {
    bn_impl *b = ctx->m->impl;
    if (!ctx->sums_ready) {
        double *part = split_take(ctx);
        if (!part) return false;
        bn_split sp = {ctx, part};
        cf_parallel_for(ctx->g.n, split_backward_sums, &sp);
        split_combine(ctx, part);
        cf_arena_give(b->arena, part, NULL);
    }
    bn_backward_coefs(ctx, 0, ctx->g.c);
    if (ctx->need_dx) cf_parallel_for(ctx->g.n, split_backward_dx, ctx);
    return true;
}

/* The planes backward: split by images, or by channels when that cannot run. */
static void bn_backward_planes_run(bn_ctx *ctx) {
    if (split_images(&ctx->g) && bn_backward_split(ctx)) return;
    if (worth_threads(&ctx->g))
        cf_parallel_for(ctx->g.c, bn_backward_planes, ctx);
    else
        bn_backward_planes(ctx, 0, ctx->g.c, 0);
}

static void bn_backward_rows(bn_ctx *ctx) {
    cf_module *m = ctx->m;
    bn_impl *b = m->impl;
    const int n = ctx->g.n, c = ctx->g.c;
    const float *gamma = m->params[P_WEIGHT].data, *mean = b->mean, *invstd = b->invstd;
    double *restrict sdy = b->acc, *restrict sdyx = b->acc + c;
    const double count = ctx->sums_ready ? ctx->count : (double)n;
    if (!ctx->sums_ready)
        for (int f = 0; f < c; f++) sdy[f] = sdyx[f] = 0;
    for (int i = 0; i < n && !ctx->sums_ready; i++) {
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
        k2[f] =
            ctx->training ? (float)(-(double)k1[f] * invstd[f] * invstd[f] * sdyx[f] / count) : 0;
        k3[f] = ctx->training ? (float)(-(double)k1[f] * sdy[f] / count) : 0;
    }
    for (int i = 0; i < n; i++) {
        const float *restrict dy = ctx->dy + (size_t)i * c, *restrict xr = ctx->x + (size_t)i * c;
        const float *restrict y = ctx->relu ? ctx->y + (size_t)i * c : NULL;
        float *restrict dxr = ctx->dx + (size_t)i * c;
        for (int f = 0; f < c; f++) dxr[f] = k1[f] * DY_AT(f) + k2[f] * (xr[f] - mean[f]) + k3[f];
    }
}

/* Synchronised backward sums: this replica's (its weight and bias gradients come from these),
 * then reduced into acc for dx. Returns the total count, or 0 when the reduce failed (the pass's
 * error; dx is then formed from this replica's sums). */
static double bn_sync_backward_sums(bn_ctx *ctx) {
    bn_impl *b = ctx->m->impl;
    const int c = ctx->g.c;
    bn_ctx local = *ctx;
    local.need_dx = false; /* sums and parameter gradients only */
    if (local.g.s == 1)
        bn_backward_rows(&local);
    else
        bn_backward_planes_run(&local);
    double *buf = b->sync;
    buf[0] = (double)ctx->g.n * (double)ctx->g.s;
    memcpy(buf + 1, b->acc, 2 * (size_t)c * sizeof(double));
    if (!bn_reduce_checked(ctx->m, buf, 1 + 2 * (size_t)c, true, "backward")) return 0;
    memcpy(b->acc, buf + 1, 2 * (size_t)c * sizeof(double));
    return buf[0];
}

static const cf_tensor *bn_forward(cf_module *m, const cf_tensor *x) {
    return bn_forward_with(m, x, NULL, NULL);
}

const cf_tensor *cf_nn_bn_forward_add_relu(cf_module *bn, const cf_tensor *x, const float *add) {
    bn->in = x;
    return bn_forward_with(bn, x, add, NULL);
}

const cf_tensor *cf_nn_bn_forward_fold_mask(cf_module *bn, const cf_tensor *x, const float *add,
                                            uint16_t *mask) {
    bn->in = x;
    return bn_forward_with(bn, x, add, mask);
}

/* The stem dx link's fill (cf_nn_conv_dy_fill): image n's dx planes into dst, the dx pass's
 * values (cf_bn_planes_dx with the last backward's coefficients, as bn_backward_block and
 * split_backward_dx call it; each value depends on its own position's alone). */
static void bn_fill_dx(void *ctx, int64_t n, float *dst) {
    const cf_module *m = ctx;
    const bn_impl *b = m->impl;
    const geom g = geometry(&m->in->shape);
    const size_t at = (size_t)n * g.c * (size_t)g.s;
    const float *k = b->coef;
    cf_bn_planes_dx(b->fill_dy + at, m->in->data + at, dst, g.s, g.c, b->mean, k, k + g.c,
                    k + 2 * g.c, b->fwd_relu, b->ss, b->ss + g.c, 0);
}

void cf_nn_bn_dy_held(cf_module *bn, const cf_module *prev) {
    if (cf_nn_is_batchnorm(bn)) ((bn_impl *)bn->impl)->held_by = prev;
}

bool cf_nn_bn_left_dx(const cf_module *bn) {
    return cf_nn_is_batchnorm(bn) && ((const bn_impl *)bn->impl)->dx_left;
}

bool cf_nn_bn_wrote_mask(const cf_module *bn) {
    return cf_nn_is_batchnorm(bn) && ((const bn_impl *)bn->impl)->fwd_mask;
}

bool cf_nn_bn_mask_dy(cf_module *bn, const uint16_t *mask, const float *dy) {
    if (!cf_nn_is_batchnorm(bn) || !bn->in) return false;
    bn_impl *b = bn->impl;
    const geom g = geometry(&bn->in->shape);
    const bool ok = mask && dy && !b->fwd_relu && bn->in->shape.ndim > 2 && g.s > 1;
    b->dy_mask = ok ? mask : NULL;
    b->dy_mask_for = ok ? dy : NULL;
    return ok;
}

/* The backward's set-up: the block's mask taken (once), dx and its words asked for, ctx filled.
 * *dxp: dx (NULL without need_dx). False: nothing to compute (no gradients, no dx). */
static bool bn_backward_begin(cf_module *m, const cf_tensor *dy, bool need_dx, bn_ctx *ctx,
                              cf_tensor **dxp) {
    bn_impl *b = m->impl;
    bool grads = m->params[P_WEIGHT].trainable || m->params[P_BIAS].trainable;
    b->dxw_wrote = false;
    b->paired = false;
    /* the block's mask, armed for the gradient its block was given (once) */
    const uint16_t *gmask = b->dy_mask && dy->data == b->dy_mask_for ? b->dy_mask : NULL;
    if (b->dy_mask && !gmask)
        cf_module_fail(CF_ERR_STATE,
                       "%s(%d) backward: the block's mask was armed for another "
                       "gradient (internal)",
                       bn_name(m), b->features);
    b->dy_mask = NULL;
    b->dy_mask_for = NULL;
    b->dx_left = false;
    /* dy outlives the linked convolution's backward only where the caller said so */
    const bool held = b->held_by && b->held_by == b->dy_conv;
    b->held_by = NULL;
    if (!need_dx && b->dy_conv) { /* no dx to link */
        cf_nn_conv_dy_words(b->dy_conv, NULL, false);
        cf_nn_conv_dy_fill(b->dy_conv, NULL, false, NULL, NULL);
    }
    *dxp = NULL;
    if (!grads && !need_dx) return false;
    cf_tensor *dx = need_dx ? cf_module_input_grad(m) : NULL;
    *dxp = dx;
    /* dx as the linked convolution's bf16 words where its next backward reads only those (a
     * training forward's planes; the convolution decides the rest, cf_nn_conv_dy_words) */
    uint16_t *dxh = NULL;
    if (dx && b->dy_conv)
        dxh = cf_nn_conv_dy_words(b->dy_conv, dx,
                                  b->fwd_training && m->training && cf_nn_is_batchnorm(m) &&
                                      geometry(&m->in->shape).s > 1);
    b->dxw_wrote = dxh != NULL;
    /* dx left to the convolution's fill, image by image (the stem dx link), where its next
     * backward takes it: the sums and coefficients here, no dx pass */
    if (dx && b->dy_conv) {
        const bool want = held && !dxh && !gmask && !b->reduce && b->fwd_training && m->training &&
                          cf_nn_is_batchnorm(m) && m->in->shape.ndim == 4 &&
                          geometry(&m->in->shape).s > 1;
        b->fill_dy = dy->data;
        b->dx_left = cf_nn_conv_dy_fill(b->dy_conv, dx, want, bn_fill_dx, m);
    }
    *ctx = (bn_ctx){.m = m,
                    .x = m->in->data,
                    .dy = dy->data,
                    .dx = dx ? dx->data : NULL,
                    .g = geometry(&m->in->shape),
                    .training = b->fwd_training,
                    .need_dx = need_dx && !b->dx_left,
                    .grads = grads,
                    .relu = b->fwd_relu,
                    .y = b->fwd_relu ? m->out.data : NULL,
                    .dxh = dxh,
                    .gmask = gmask};
    return true;
}

static const cf_tensor *bn_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    bn_impl *b = m->impl;
    bn_ctx ctx;
    cf_tensor *dx;
    if (!bn_backward_begin(m, dy, need_dx, &ctx, &dx)) return NULL;
    if (b->reduce && ctx.training) {
        double total = bn_sync_backward_sums(&ctx);
        if (!need_dx) return dx;
        ctx.grads = false; /* accumulated from this replica's sums above */
        ctx.sums_ready = total > 0;
        ctx.count = total;
    }
    if (ctx.g.s == 1)
        bn_backward_rows(&ctx);
    else
        bn_backward_planes_run(&ctx);
    return dx;
}

/* ---- a residual block's two last BatchNorms (cf_nn_bn_backward_pair) ----------------------
 * Both take the block's gradient dy, masked by the same bits, with inputs of the same shape:
 * on one thread each channel block's sums pass reads dy (and the bits) once for both layers'
 * planes, and their dx passes follow while the block is in L2, where two layers each read dy
 * from L3 or memory. Every plane's sums and every value are those of each layer's own backward.
 * With more threads (the image split) the same pairing per image measured neutral
 * (bench/README.md), so the pair declines there and each layer runs its own passes. */

/* Channels [c0, c1) of both layers on one thread: the sums of their planes through one queue,
 * each channel's planes of a and b side by side (the same dy and bits), then both layers' dx. */
static void pair_block(bn_ctx *ca, bn_ctx *cb, int64_t c0, int64_t c1) {
    const geom g = ca->g;
    const size_t cs = (size_t)g.s, mw = CF_MASK_WORDS(cs);
    bn_ctx *both[2] = {ca, cb};
    for (int k = 0; k < 2; k++) {
        bn_impl *b = both[k]->m->impl;
        for (int64_t c = c0; c < c1; c++) b->acc[c] = b->acc[g.c + c] = 0;
    }
    plane_queue q = {.s = g.s};
    for (int n = 0; n < g.n; n++) {
        const size_t at = (size_t)n * g.c * cs;
        const bool ahead = n + 1 < g.n;
        for (int64_t c = c0; c < c1; c++) {
            if (ahead) {
                const size_t next = at + ((size_t)g.c + c) * cs;
                bn_prefetch_plane(ca->dy + next, cs, false);
                bn_prefetch_plane(ca->x + next, cs, false);
                bn_prefetch_plane(cb->x + next, cs, false);
            }
            for (int k = 0; k < 2; k++) {
                bn_impl *b = both[k]->m->impl;
                q.dy[q.np] = both[k]->dy + at + c * cs;
                q.x[q.np] = both[k]->x + at + c * cs;
                q.mask[q.np] = both[k]->gmask + ((size_t)n * g.c + c) * mw;
                q.k[q.np] = b->mean[c];
                q.s1[q.np] = &b->acc[c];
                q.s2[q.np] = &b->acc[g.c + c];
                if (++q.np == CF_BN_PLANES) queue_dy_sums(&q, false, true);
            }
        }
    }
    queue_dy_sums(&q, false, true);
    bn_backward_coefs(ca, c0, c1);
    bn_backward_coefs(cb, c0, c1);
    for (int n = 0; n < g.n; n++) {
        bn_dx_sample(ca, n, c0, c1);
        bn_dx_sample(cb, n, c0, c1);
    }
}

/* Whether bn's next backward can run in a pair for dy: a BatchNorm's own ops after a training
 * forward of planes, armed with the block's mask for this dy, its statistics its own. */
static bool pair_fits(const cf_module *bn, const cf_tensor *dy) {
    if (!cf_nn_is_batchnorm(bn) || !bn->in || !bn->training) return false;
    const bn_impl *b = bn->impl;
    return b->fwd_training && !b->fwd_relu && !b->reduce && b->dy_mask &&
           b->dy_mask_for == dy->data && bn->in->shape.ndim == 4 &&
           cf_shape_equal(&bn->in->shape, &dy->shape) && geometry(&bn->in->shape).s > 1;
}

bool cf_nn_bn_backward_pair(cf_module *a, cf_module *b, const cf_tensor *dy, const cf_tensor **dxa,
                            const cf_tensor **dxb) {
    if (atomic_load_explicit(&pair_backward_off, memory_order_relaxed) || a == b ||
        cf_get_num_threads() > 1 || !pair_fits(a, dy) || !pair_fits(b, dy) ||
        ((bn_impl *)a->impl)->dy_mask != ((bn_impl *)b->impl)->dy_mask)
        return false;
    bn_ctx ca, cb;
    cf_tensor *ta, *tb;
    bn_backward_begin(a, dy, true, &ca, &ta);
    bn_backward_begin(b, dy, true, &cb, &tb);
    *dxa = ta;
    *dxb = tb;
    ((bn_impl *)a->impl)->paired = ((bn_impl *)b->impl)->paired = true;
    const geom g = ca.g;
    const int64_t cbk = bn_pair_block_channels(&g);
    for (int64_t c0 = 0; c0 < g.c; c0 += cbk)
        pair_block(&ca, &cb, c0, c0 + cbk < g.c ? c0 + cbk : g.c);
    return true;
}

bool cf_nn_bn_paired(const cf_module *bn) {
    return cf_nn_is_batchnorm(bn) && ((const bn_impl *)bn->impl)->paired;
}

static void bn_destroy(cf_module *m);
static const cf_module_ops bn1d_ops = {
    .destroy = bn_destroy,
    .kind = "BatchNorm1d",
    .out_shape = bn_out_shape,
    .plan = bn_plan,
    .init = bn_init,
    .forward = bn_forward,
    .backward = bn_backward,
};
static const cf_module_ops bn2d_ops = {
    .destroy = bn_destroy,
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

static void bn_destroy(cf_module *m) {
    bn_impl *b = m->impl;
    if (b) cf_free(b->sync);
}

static void set_reduce(cf_module *m, cf_bn_reduce_fn fn, void *ctx, cf_status *st) {
    if (m->ops == &bn1d_ops || m->ops == &bn2d_ops) {
        bn_impl *b = m->impl;
        if (fn && !b->sync) {
            b->sync = cf_calloc(1 + 2 * (size_t)b->features, sizeof(double));
            if (!b->sync) *st = CF_ERR_NOMEM;
        }
        b->reduce = b->sync ? fn : NULL;
        b->reduce_ctx = ctx;
    }
    for (int i = 0; i < m->n_children; i++) set_reduce(m->children[i], fn, ctx, st);
}

cf_status cf_model_set_bn_reduce(cf_model *model, cf_bn_reduce_fn fn, void *ctx) {
    cf_status st = CF_OK;
    if (model && model->root) set_reduce(model->root, fn, ctx, &st);
    if (st != CF_OK) {
        set_reduce(model->root, NULL, NULL, &st); /* all or none */
        return cf_fail(CF_ERR_NOMEM, "synchronised BatchNorm: scratch");
    }
    return CF_OK;
}

cf_module *cf_batchnorm1d(int features) {
    return cf_batchnorm_ex(features, false, 1e-5f, 0.1f);
}
cf_module *cf_batchnorm2d(int channels) {
    return cf_batchnorm_ex(channels, true, 1e-5f, 0.1f);
}
