/* Conv2d (NCHW, square kernel, zero padding), the batch split over the thread pool.
 *
 * Two paths. ResNet-shaped layers (stride 1 with the output as large as the input, stride 2 on
 * even-sized images; at least 8 input channels and a kernel above 1x1) go through
 * cf_conv_implicit_* (src/tensor/conv_implicit.c): the GEMM kernel reads shifted image planes
 * in place, with no patch matrix, for the forward pass, dx and dW (partial sums per thread laid
 * out [tap][out][in]). Measured on W1 with bench_conv / bench_step, this took the step from 32 to
 * 28 ms on one core: the patch matrices (k*k times the input, written and read again for every
 * image, forward and backward) were a third of the convolutions' time. Everything else (stems on
 * few channels, 1x1 layers, other strides, reference mode) takes im2col + GEMM:
 *
 *   forward   y_n = W (O x K) . col(x_n) (K x P)           K = C*k*k, P = OH*OW
 *   backward  dW^T += col(x_n) (K x P) . dy_n^T (P x O)    per-thread buffers, reduced in order
 *             dx_n = col2im(W^T (K x O) . dy_n (O x P))
 *
 * The products go through cf_sgemm_strided, which reads W^T and the patch matrix in place (no
 * packing); the weight gradient is formed transposed (K x O), from dy transposed per group,
 * so that its kernel's rows are the patch rows, and it is transposed once when the threads'
 * partial sums are added into the gradient.
 *
 * Small images (P below GROUP_COLS) are lowered in fixed groups of G images side by side, so
 * that one GEMM has N = G*P columns: small GEMMs run far below the peak. The groups are a
 * function of the batch index alone, never of the thread split, so the forward pass and dx are
 * bitwise the same for any thread count. The patch matrix is rebuilt in backward rather than
 * kept from forward (it is k*k times the input and cheap to rebuild), so each thread needs only
 * one K x G*P scratch matrix, which stays in cache. A 1x1 stride-1 convolution without padding
 * reads the image directly. A 1x1 stride-2 layer without padding or bias (a residual shortcut)
 * takes its weight gradient through cf_conv_implicit_wgrad, so that a strided sibling in the
 * same residual block can compute it bitwise the same from its own blocks (nn_internal.h). */
#include "corefit/nn.h"

#include "nn_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* Target GEMM width when grouping the images of a batch. */
#define GROUP_COLS 256

typedef struct conv_impl {
    int in_c, out_c, k, stride, pad;
    bool has_bias;
    bool direct;       /* 1x1, stride 1, no padding: the image is its own patch matrix */
    cf_conv_geom g;    /* per-image geometry, set by plan */
    int group;         /* images per GEMM */
    int ld;            /* row stride of col and buf: G*P rounded up to 16 (aligned rows) */
    int n_threads;     /* copies of the per-thread scratch */
    size_t col_stride; /* floats per thread in col */
    size_t buf_stride; /* floats per thread in buf */
    size_t dyt_stride; /* floats per thread in dyt */
    size_t dw_stride;  /* floats per thread in dwt */
    size_t db_stride;  /* floats per thread in db */
    float *col;        /* n_threads x (K x G*P) patch matrices */
    float *buf;        /* n_threads x (O x G*P) grouped output / output gradient (G > 1) */
    float *dyt;        /* n_threads x (G*P x O) output gradient, transposed */
    float *dwt;        /* n_threads x (K x O) weight-gradient partial sums, transposed */
    float *db;         /* n_threads x O bias-gradient partial sums */
    bool implicit;     /* the geometry suits cf_conv_implicit_* (used unless in reference mode) */
    float *wpack;      /* the weights packed for cf_conv_implicit_forward */
    float *wpack_dx;   /* the weights packed for cf_conv_implicit_dx */
    bool winograd;     /* 3x3, stride 1, padding 1: cf_conv_winograd_* (unless in reference mode) */
    float *wino_u;     /* the weights transformed for cf_conv_winograd_forward */
    float *wino_u_dx;  /* ... and for cf_conv_winograd_dx */
    float *wino_du;    /* n_threads x transformed weight-gradient partial sums */
    size_t wino_du_stride;
    bool winograd_call; /* the call in progress goes through cf_conv_winograd_* */
    bool winograd_bf16; /* ... with its products in bf16 (cf_conv_winograd_*_bf16) */
    float *scratch;     /* n_threads x scratch of cf_conv_implicit_* or cf_conv_winograd_* */
    size_t scratch_stride;
    size_t wino_packed, implicit_packed; /* floats of the packed weights */
    cf_arena *arena;    /* whose transient pool lends each call its buffers (call_buffers) */
    unsigned char *ran; /* n_threads flags: thread t holds partial sums for this backward */
    bool add_dx;        /* this backward adds dx into c->dx (col2im without zeroing) */
    cf_tensor dx_sum;   /* the returned gradient when adding */
    cf_conv_shortcut shortcut_call; /* cf_nn_conv_forward_pair: the shortcut computed by the
                                       forward in progress (out_channels 0: none) */
    bool by_sibling;                /* the last forward's output was computed by a sibling */
    bool dx_by_sibling;             /* the last backward left its input gradient to a sibling */
    bool dw_by_sibling; /* ... and its weight gradient too, into this layer's partial sums */
    float *held;        /* meanwhile, its partial sums (from the arena's transient pool) */
    /* The weight gradient's partial sums ([tap][out][in]: the implicit and bf16 implicit paths)
     * are added into the gradient inside the backward's job, not after it (reduce_in_job): a
     * part that has written its partial sums adds its images to dw_images, and a part that ends
     * when every image's are written (the last one to end always does) takes slices of the
     * output channels (dw_next_slice; dw_slices of this layer's, then sc_slices of its paired
     * shortcut's) and adds them, each element over the threads in thread order as
     * reduce_partials does: the same sums, no serial pass between the jobs. */
    bool reduce_in_job;
    int dw_slices, sc_slices;
    _Atomic int64_t dw_images;
    _Atomic int dw_next_slice;
    cf_conv_shortcut shortcut_dx; /* a shortcut's output gradient, for the next backward's dx */
    cf_module *shortcut_dw;       /* ... and the shortcut whose weight gradient it computes */
    /* a 1x1 stride-2 layer without padding or bias: its weight gradient through
     * cf_conv_implicit_wgrad (so that a stride-2 sibling can compute it bitwise the same) */
    bool implicit_dw;
    /* mixed precision (cf_conv_set_bf16): where the kernel table computes in bf16, a call
     * takes the lowered path with its three products through cf_sgemm_bf16 */
    bool bf16;
    cf_conv_precision precision; /* ... and in which precision (cf_conv_bf16_precision; plan) */
    /* ... and of those, a stride-1 layer with the output as large as the input (k > 1, at least
     * 8 input channels) goes through cf_conv_bf16_* (no patch matrix), its weights packed by
     * the forward pass into bf16_packed (kept for the plan; none for a Winograd layer) and read
     * again by the backward */
    bool bf16_implicit;
    float *bf16_packed;
    bool bf16_fresh; /* bf16_packed holds the weights of the last forward pass */
    /* x's bf16 words kept by a training forward for the backward's weight gradient
     * (cf_conv_bf16_forward_keep; up to bf16_x_cap images), and whether the last forward
     * wrote them */
    uint16_t *bf16_x;
    int64_t bf16_x_cap;
    bool bf16_x_kept;
    /* the first failed cf_conv_bf16_* status of the call in progress (CF_OK: none) and its
     * message, noted by whichever thread made the call (bf16_note), reported by conv_report */
    atomic_int bf16_status;
    char bf16_error[512];
    /* the call in progress */
    const float *x, *dy;
    float *y, *dx;
    int64_t batch;
    bool need_dx, want_dw, want_db;
    /* The forward link (nn_internal.h, cf_nn_conv_words_target): words_for is the input whose
     * bf16 words the BatchNorm before wrote into bf16_x instead of its fp32 values (NULL: none;
     * the next forward consumes it), and whether the last forward read them (from_words). */
    const float *words_for;
    bool from_words;
    /* ... through a residual block (cf_nn_conv_words_pair): words_shortcut is the idpath's 1x1
     * stride-2 conv this one computes with (the pair's forward from the words), words_block the
     * block and words_block_ops its ops when linked (a wrapper's may read x: no link then).
     * words_src (the shortcut's): the sibling whose kept words hold the input the shortcut's
     * last forward (by_sibling) read, for a weight gradient of its own (words_restore). */
    cf_module *words_shortcut;
    const cf_module *words_block;
    const cf_module_ops *words_block_ops;
    const void *words_src;
    /* dy as bf16 words (cf_nn_conv_dy_words): a BatchNorm right after this layer in a Sequential
     * (linked when the model is planned, dyw_linked; never an idpath's first conv whose dx its
     * block adds into the convpath's alone, dyw_veto: that call reads dy in fp32) writes
     * bf16(dx) as n x c x h x w words at the start of its own dx buffer (dyw_for), in place of
     * its fp32 values, for the backward that gets that buffer as dy; that backward reads the
     * words alone (cf_conv_bf16_backward_words). The buffer is the gradients' (recycled, still
     * in cache), where one of the layer's own would come from memory. dyw_used: the last
     * backward read them (tests). */
    bool dyw_linked, dyw_veto;
    const float *dyw_for;
    bool dyw_call, dyw_used;
    /* a residual idpath's first conv paired with the convpath's (dyw_sibling): its dy words go
     * to the sibling with the handover (cf_nn_conv_shortcut_backward), whose backward reads them
     * as its shortcut's dy (shortcut_words, for the call in progress) */
    cf_module *dyw_sibling;
    const uint16_t *shortcut_words;
    /* the statistics link (nn_internal.h, cf_nn_conv_stats_bn): the BatchNorm right after this
     * layer (stats_bn) and whether it can take the sums (stats_want); from the plan, the sums'
     * block (stats_part, 2 out_c doubles an image), the shift per channel (stats_k) and a flag per
     * image (stats_done), for up to stats_cap images; for the forward in progress, whether it
     * takes them (stats_on) of the output stats_y, the shift set once image 0's output is written
     * (stats_k_ready); the output the last forward took them of (stats_for, stats_n images; NULL:
     * none, or taken by the BatchNorm) and whether it did (stats_wrote) */
    cf_module *stats_bn;
    bool stats_want;
    double *stats_part;
    float *stats_k;
    unsigned char *stats_done;
    int64_t stats_cap;
    bool stats_on;
    const float *stats_y;
    atomic_int stats_k_ready;
    const float *stats_for;
    int64_t stats_n;
    bool stats_wrote;
    struct conv_impl *shortcut_impl; /* the shortcut computed by the forward in progress */
    /* a 3x3 stride-1 layer on 1 to 4 channels whose images are not grouped (W1's stem): the
     * forward through cf_conv_stem_forward (no patch matrix, no GEMM; bitwise the lowered one at
     * the vector levels), with the statistics link's epilogue, and the weight gradient through
     * cf_conv_stem_wgrad only where it reproduces the lowered cf_sgemm_nt product
     * (use_stem_direct_dw, tensor.h); stem_call: the forward in progress takes it */
    bool stem, stem_call;
    /* dy made image by image by the BatchNorm after this layer (cf_nn_conv_dy_fill): the dx
     * buffer it left unwritten (dyf_for) and its fill; for the backward in progress, whether the
     * direct weight gradient takes each image's dy from the fill (dyf_call); dyf_used: the last
     * backward did (tests) */
    const float *dyf_for;
    cf_nn_dy_fill_fn dyf_fn;
    void *dyf_ctx;
    bool dyf_call, dyf_used;
} conv_impl;

static size_t round16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

static cf_status (*bf16_fault)(cf_status status, const char *call);
/* The two links' switches (cf__nn_set_x_words_link, cf__nn_set_dy_words_link: tests and
 * bench_bf16_links compare with and without them); on by default. */
static atomic_bool x_words_link_off, dy_words_link_off, x_pair_link_off;
/* tests: a shortcut's weight gradient never handed to its sibling; words_restore's conversions */
static atomic_bool shortcut_dw_lend_off;
static atomic_ulong words_restored;
/* The statistics link's switch (cf__nn_set_stats_link). */
static atomic_bool stats_link_off;
/* The direct stem's switch (cf__nn_set_stem_direct). */
static atomic_bool stem_direct_off;
/* The stem dx link's switch (cf__nn_set_stem_dx_link). */
static atomic_bool stem_dx_link_off;

void cf__conv_bf16_set_fault(cf_status (*fn)(cf_status status, const char *call)) {
    bf16_fault = fn;
}

/* Notes the status of a cf_conv_bf16_* call (call: its name), on any thread: they cannot fail
 * for the packs conv.c makes, but a failure would leave the output or gradient unwritten. The
 * first failure of the call in progress is kept, with the message its thread recorded. */
static void bf16_note(conv_impl *c, cf_status st, const char *call) {
    if (bf16_fault) st = bf16_fault(st, call);
    if (st == CF_OK) return;
    int none = CF_OK;
    if (atomic_compare_exchange_strong(&c->bf16_status, &none, (int)st))
        snprintf(c->bf16_error, sizeof c->bf16_error, "%s", cf_last_error());
}

/* Whether this call is lowered with its products in bf16: the layer is set to mixed precision and
 * the active kernel table has bf16 kernels (asked per call: CF_ISA or cf_set_isa may change the
 * table after the plan). The fp32 implicit kernels are fp32 only, so such a call takes the bf16
 * implicit kernels or the lowered path, whose scratch every plan reserves; a Winograd layer takes
 * the bf16 Winograd (use_winograd). */
static bool use_bf16(const conv_impl *c) {
    /* The shape's precision (cf_conv_bf16_precision, tensor.h): a layer of fewer than 8 input
     * channels (a stem on gray or RGB images) stays in fp32 here. It has no implicit bf16
     * kernel (a channel-pair loop that short does not pay), and lowered its bf16 GEMM loses to
     * fp32's: the fast recipe's 1-channel stem (K = 9) took 2.7 ms a step against fp32's 1.6,
     * W3's 3-channel 7x7 stem (K = 147) 188 ms forward + backward for 64 images against 120
     * (bench_conv), its weight gradient's transposed bf16 packing 2.5x fp32's SGEMM; the RGB
     * stem's bf16 path is the bf16 stem (use_stem_bf16). */
    if (c->precision != CF_CONV_BF16) return false;
    /* A 1x1 stride-2 layer without padding or bias (a residual shortcut) is in bf16 only through
     * cf_conv_bf16_* (the subsampled image's 1x1 product); else it stays on its fp32 paths:
     * lowered in bf16, W1's first shortcut took 4.5 ms of a 27 ms step (bench_step), a few tiny
     * GEMMs per image that packing dominates; in fp32 its weight gradient reads the image in
     * place (cf_conv_implicit_wgrad) and the whole backward took 1.4 ms. */
    return c->bf16 && cf_bf16_compute() &&
           (!c->implicit_dw || (c->bf16_implicit && c->bf16_packed && !cf_kernels_reference() &&
                                cf_conv_bf16_supported(&c->g, c->out_c)));
}

/* Whether this call takes the bf16 stride-2 stem (cf_conv_stem_bf16_*, an RGB 7x7 stem: K = 147)
 * in the patch matrix's scratch, forward and weight gradient. Below K = 64 (a gray 3x3 stem) the
 * layer stays fp32 (use_bf16). bench_conv w3 cpu-bf16: bench/README.md (the bf16 stem). */
static bool use_stem_bf16(const conv_impl *c) {
    return c->bf16 && c->col && c->precision == CF_CONV_BF16_STEM && !cf_kernels_reference() &&
           cf_conv_stem_bf16_supported(&c->g, c->out_c) &&
           cf_conv_stem_bf16_scratch(&c->g, c->out_c) <= c->col_stride;
}

/* Whether this call takes the direct stem (cf_conv_stem_*) rather than the lowered product. */
static bool use_stem_direct(const conv_impl *c) {
    return c->stem && !cf_kernels_reference() && !use_bf16(c) && !use_stem_bf16(c) &&
           cf_conv_stem_pays(&c->g, c->out_c) &&
           !atomic_load_explicit(&stem_direct_off, memory_order_relaxed);
}

void cf__nn_set_stem_direct(bool on) {
    atomic_store(&stem_direct_off, !on);
}

/* Whether the lowered weight gradient is the few-row dot-product case (conv_backward_range). */
static bool bf16_dw_dots(const conv_impl *c) {
    return c->in_c * c->k * c->k < 16 && c->out_c <= 16;
}

/* Whether this backward's weight gradient takes cf_conv_stem_wgrad: only where the lowered one
 * is the cf_sgemm_nt product (bf16_dw_dots) of a shape the direct sums reproduce bit for bit
 * (cf_conv_stem_wgrad_as_nt); on other shapes the lowered product (transpose_dy and
 * cf_sgemm_strided, or cf_sgemm_nt's other edges) adds the positions in another order. */
static bool use_stem_direct_dw(const conv_impl *c) {
    return use_stem_direct(c) && bf16_dw_dots(c) && cf_conv_stem_wgrad_as_nt(&c->g, c->out_c);
}

/* Whether this call goes through cf_conv_bf16_* (the kernel table may have changed since the
 * plan; the plan reserved their scratch and packed weights where the geometry fits and the
 * layer was in bf16). */
static bool use_winograd(const conv_impl *c);

static bool use_bf16_implicit(const conv_impl *c) {
    return c->bf16_implicit && c->bf16_packed && use_bf16(c) && !cf_kernels_reference() &&
           cf_conv_bf16_supported(&c->g, c->out_c) && !use_winograd(c);
}

static const char *conv_repr(const conv_impl *c, char *buf, size_t size) {
    snprintf(buf, size, "Conv2d(%d, %d, kernel_size=%d, stride=%d, padding=%d, bias=%s)", c->in_c,
             c->out_c, c->k, c->stride, c->pad, c->has_bias ? "True" : "False");
    return buf;
}

/* On the thread that runs the pass, once the call's threads are done: a noted failure becomes
 * the pass's error (cf_module_fail), which cf_model_forward / cf_model_backward return. */
static void conv_report(conv_impl *c, const char *pass) {
    const cf_status st = (cf_status)atomic_exchange(&c->bf16_status, CF_OK);
    char r[128];
    if (st != CF_OK)
        cf_module_fail(st, "%s %s: %s", conv_repr(c, r, sizeof r), pass, c->bf16_error);
}

const float *cf__conv_bf16_packed(const cf_module *conv) {
    return cf_nn_is_conv(conv) ? ((const conv_impl *)conv->impl)->bf16_packed : NULL;
}

static cf_status conv_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    conv_impl *c = m->impl;
    char r[128], s[64];
    if (in->ndim != 4)
        return cf_fail(CF_ERR_INVALID, "%s: expects a 4-D input (N, %d, H, W), got %s",
                       conv_repr(c, r, sizeof r), c->in_c, cf_shape_str(in, s, sizeof s));
    if (in->dim[1] != c->in_c)
        return cf_fail(CF_ERR_INVALID, "%s: expects %d input channels, got input %s with %d",
                       conv_repr(c, r, sizeof r), c->in_c, cf_shape_str(in, s, sizeof s),
                       in->dim[1]);
    cf_conv_geom g;
    if (!cf_conv_geom_init(&g, c->in_c, in->dim[2], in->dim[3], c->k, c->k, c->stride, c->stride,
                           c->pad, c->pad))
        return cf_fail(CF_ERR_INVALID,
                       "%s: input %s is smaller than the kernel (padded %dx%d < %dx%d)",
                       conv_repr(c, r, sizeof r), cf_shape_str(in, s, sizeof s),
                       in->dim[2] + 2 * c->pad, in->dim[3] + 2 * c->pad, c->k, c->k);
    *out = cf_shape4(in->dim[0], c->out_c, g.oh, g.ow);
    return CF_OK;
}

/* The next `floats` of a call's memory from base (NULL when base is, or nothing is asked). */
static float *carve(float *base, size_t *at, size_t floats) {
    float *p = base && floats ? base + *at : NULL;
    *at += round16(floats);
    return p;
}

/* The buffers that one call writes and reads and no other call needs (patch matrices, the
 * per-thread scratch and partial sums, the packed weights, which every call packs anew) are lent
 * by the arena's transient pool for the call, so that all the layers share that memory. Lays
 * out the forward's (or the backward's) buffers from base and returns the floats they take. */
static size_t call_buffers(conv_impl *c, bool backward, float *base) {
    const size_t t = (size_t)c->n_threads;
    size_t at = 0;
    c->col = carve(base, &at, t * c->col_stride);
    c->buf = carve(base, &at, t * c->buf_stride);
    c->scratch = carve(base, &at, t * c->scratch_stride);
    if (!backward) {
        c->wino_u = carve(base, &at, c->wino_packed);
        c->wpack = carve(base, &at, c->implicit_packed);
    } else {
        c->dyt = carve(base, &at, t * c->dyt_stride);
        c->dwt = carve(base, &at, t * c->dw_stride);
        c->db = carve(base, &at, t * c->db_stride);
        c->wino_u_dx = carve(base, &at, c->wino_packed);
        c->wino_du = carve(base, &at, t * c->wino_du_stride);
        c->wpack_dx = carve(base, &at, c->implicit_packed);
    }
    return at;
}

/* Takes the call's buffers from the pool (give them back with call_end). */
static float *call_begin(conv_impl *c, bool backward) {
    const size_t floats = call_buffers(c, backward, NULL);
    float *mem = cf_arena_take(c->arena, floats * sizeof(float), c);
    call_buffers(c, backward, mem);
    return mem;
}

static void call_end(conv_impl *c, float *mem) {
    cf_arena_give(c->arena, mem, NULL);
}

static void conv_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    conv_impl *c = m->impl;
    cf_module_plan_default(m, in, arena);
    cf_conv_geom_init(&c->g, c->in_c, in->dim[2], in->dim[3], c->k, c->k, c->stride, c->stride,
                      c->pad, c->pad);
    c->precision = cf_conv_bf16_precision(&c->g, c->out_c);
    size_t K = (size_t)c->in_c * c->k * c->k, P = (size_t)c->g.oh * c->g.ow;
    c->group = c->direct || P >= GROUP_COLS ? 1 : (int)(GROUP_COLS / P);
    if (c->group > in->dim[0]) c->group = in->dim[0];
    size_t G = (size_t)c->group;
    c->n_threads = cf_get_num_threads();
    size_t t = (size_t)c->n_threads;
    c->ld = (int)round16(P * G);
    c->col_stride = c->direct ? 0 : K * (size_t)c->ld;
    c->buf_stride = G > 1 ? (size_t)c->out_c * c->ld : 0;
    c->dyt_stride = round16((size_t)c->out_c * P * G);
    c->dw_stride = round16((size_t)c->out_c * K);
    c->db_stride = c->has_bias ? round16((size_t)c->out_c) : 0;
    c->ran = cf_arena_bytes(arena, t);
    /* Layers of a few input channels (a stem on gray or RGB images) keep the patch matrix: the
     * implicit kernel's channel loop is too short to pay for its masks. So do 1x1 layers: their
     * patch matrix is the (strided) image itself, and one tap is too short a loop (measured with
     * bench_conv: W1's 1x1 stride-2 shortcuts were up to 20% slower through the phase split). */
    c->implicit = c->in_c >= 8 && c->k > 1 && cf_conv_implicit_supported(&c->g);
    /* 3x3 stride-1 layers on 16 channels or more take Winograd F(2x2, 3x3) where it pays: 2.25
     * times fewer multiplications than the implicit kernel, which already runs near the GEMM
     * peak (measured with bench_conv on W1's and W2's layers). In bf16 the same rule holds, as
     * measured against the bf16 implicit kernels (compact where compact_pays; bench_conv, 1
     * thread, cpu-bf16, Zen 4 at avx512_bf16, forward + backward CPU ms, loaded machine):
     * W3's 256 x 256 8x8 layer 45.1 through the bf16 Winograd against 76.9 implicit, 512 x 512
     * 4x4 67.6 against 85.8; W1's 32 x 32 14x14 and 64 x 64 7x7 layers (not Winograd) 4.08 and
     * 4.55 implicit against 4.70 and 4.80 forced through the bf16 Winograd. */
    c->winograd = c->in_c >= 16 && c->out_c >= 16 && cf_conv_winograd_pays(&c->g, c->out_c);
    c->scratch_stride = c->wino_packed = c->wino_du_stride = c->implicit_packed = 0;
    if (c->winograd) {
        c->implicit = false;
        c->wino_packed = c->bf16 ? cf_conv_winograd_packed_size_bf16(&c->g, c->out_c)
                                 : cf_conv_winograd_packed_size(&c->g, c->out_c);
        c->scratch_stride = round16(c->bf16 ? cf_conv_winograd_scratch_bf16(&c->g, c->out_c)
                                            : cf_conv_winograd_scratch(&c->g, c->out_c));
        c->wino_du_stride = round16(cf_conv_winograd_packed_size(&c->g, c->out_c));
    }
    if (c->implicit) {
        c->scratch_stride = round16(cf_conv_implicit_scratch(&c->g, c->out_c));
        c->implicit_packed = cf_conv_implicit_packed_size(&c->g, c->out_c);
    }
    c->stem = !c->direct && c->group == 1 && cf_conv_stem_supported(&c->g, c->out_c);
    c->stem_call = false;
    c->implicit_dw = !c->implicit && !c->winograd && c->k == 1 && c->stride == 2 && c->pad == 0 &&
                     !c->has_bias && cf_conv_implicit_supported(&c->g);
    if (c->implicit_dw) c->scratch_stride = round16(cf_conv_implicit_wgrad_scratch(&c->g));
    c->bf16_implicit = c->in_c >= 8 && c->k > 1 && c->k % 2 == 1 && c->k <= 7 &&
                       c->pad == (c->k - 1) / 2 &&
                       ((c->stride == 1 && c->g.oh == c->g.h && c->g.ow == c->g.w) ||
                        (c->stride == 2 && 2 * c->g.oh == c->g.h && 2 * c->g.ow == c->g.w &&
                         c->g.h % 2 == 0 && c->g.w % 2 == 0));
    /* and the 1x1 stride-2 shortcuts (the 1x1 product of the subsampled image) */
    if (c->implicit_dw && c->in_c >= 8) c->bf16_implicit = true;
    c->bf16_packed = NULL;
    c->bf16_fresh = false;
    /* Only a layer switched to bf16 pays for the pack, and not a Winograd one: its bf16 calls
     * take the bf16 Winograd (use_winograd holds wherever a level has bf16 kernels; without the
     * pack, use_bf16_implicit is false anyway). */
    if (c->bf16_implicit && c->bf16 && !c->winograd) {
        const size_t s = round16(cf_conv_bf16_scratch(&c->g, c->out_c));
        if (s > c->scratch_stride) c->scratch_stride = s;
        c->bf16_packed = cf_arena_floats(arena, cf_conv_bf16_packed_floats(&c->g, c->out_c));
    }
    c->bf16_x = NULL;
    c->bf16_x_cap = 0;
    c->bf16_x_kept = false;
    c->words_for = NULL;
    c->from_words = false;
    /* x's bf16 words for the weight gradient: half of x's bytes, where the layer reads them */
    if (c->bf16_implicit && c->bf16 && !c->winograd && cf_conv_bf16_keeps_input(&c->g, c->out_c)) {
        const size_t in_n = (size_t)c->in_c * c->g.h * c->g.w;
        c->bf16_x = (uint16_t *)cf_arena_floats(arena, ((size_t)in->dim[0] * in_n + 1) / 2);
        c->bf16_x_cap = in->dim[0];
    }
    c->dyw_for = NULL;
    /* the statistics link's sums, shift and image flags (the bf16 forwards and the direct stem,
     * where the level's kernels take it: cf_conv_stem_pays) */
    c->stats_part = NULL;
    c->stats_k = NULL;
    c->stats_done = NULL;
    c->stats_cap = 0;
    c->stats_on = c->stats_wrote = false;
    c->stats_for = NULL;
    if (c->stats_bn && ((c->bf16_implicit && c->bf16 && !c->winograd) ||
                        (c->stem && cf_conv_stem_pays(&c->g, c->out_c)))) {
        c->stats_cap = in->dim[0];
        c->stats_part = cf_arena_bytes(arena, 2 * (size_t)c->stats_cap * c->out_c * sizeof(double));
        c->stats_k = cf_arena_floats(arena, (size_t)c->out_c);
        c->stats_done = cf_arena_bytes(arena, (size_t)c->stats_cap);
    }
    c->arena = arena;
    cf_arena_reserve_transient(arena, call_buffers(c, false, NULL) * sizeof(float));
    cf_arena_reserve_transient(arena, call_buffers(c, true, NULL) * sizeof(float));
}

static void conv_init(cf_module *m, cf_rng *rng) {
    conv_impl *c = m->impl;
    /* PyTorch's reset_parameters: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), ..), and
     * the bias is U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
    double bound = 1.0 / sqrt((double)c->in_c * c->k * c->k);
    for (int i = 0; i < m->n_params; i++) {
        cf_param *p = &m->params[i];
        for (size_t j = 0; j < p->numel; j++)
            p->data[j] = (float)((2.0 * cf_rng_uniform(rng) - 1.0) * bound);
    }
}

/* Runs fn over the batch on the pool, or inline when there are more threads than the plan
 * reserved scratch for (the thread count changed without a re-plan). */
static void run_batch(const conv_impl *c, int64_t n, cf_range_fn fn, void *ctx) {
    if (cf_get_num_threads() > c->n_threads)
        fn(ctx, 0, n, 0);
    else
        cf_parallel_for(n, fn, ctx);
}

/* Prefetches (into L2, while the current group computes: a layer's input was written by an
 * earlier layer and has left the caches, and the lowering of the next group would otherwise wait
 * for it) the input rows that images [n0, n1) are lowered from: every row, but for a 1x1
 * layer of stride s without padding, which reads only every s-th row (the others would take
 * half the memory bandwidth of W1's stride-2 shortcuts for nothing). */
static void prefetch_input(const conv_impl *c, int64_t n0, int64_t n1) {
    const cf_conv_geom *g = &c->g;
    const size_t row = (size_t)g->w, plane = (size_t)g->h * row, in_n = (size_t)g->c * plane;
    const float *x = c->x + (size_t)n0 * in_n;
    if (c->k != 1 || c->pad != 0 || c->stride == 1) {
        cf_prefetch(x, (size_t)(n1 - n0) * in_n * sizeof(float), false, false);
        return;
    }
    for (int64_t p = 0; p < (n1 - n0) * g->c; p++)
        for (int u = 0; u < g->oh; u++)
            cf_prefetch(x + (size_t)p * plane + (size_t)u * c->stride * row, row * sizeof(float),
                        false, false);
}

/* The images [*n0, *n1) of group gi. */
static void group_range(const conv_impl *c, int64_t gi, int64_t *n0, int64_t *n1) {
    *n0 = gi * c->group;
    *n1 = *n0 + c->group < c->batch ? *n0 + c->group : c->batch;
}

static void conv_forward_range(void *ctx, int64_t begin, int64_t end, int thread) {
    cf_module *m = ctx;
    conv_impl *c = m->impl;
    const cf_conv_geom *g = &c->g;
    const int O = c->out_c, K = c->in_c * c->k * c->k, P = g->oh * g->ow;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)O * P;
    const float *w = m->params[0].data;
    const float *b = c->has_bias ? m->params[1].data : NULL;
    float *col = c->col ? c->col + (size_t)thread * c->col_stride : NULL;
    float *buf = c->buf ? c->buf + (size_t)thread * c->buf_stride : NULL;
    const bool bf16 = use_bf16(c), stem = use_stem_bf16(c);
    if (stem && begin < end) { /* the thread's images in one call: its weights rounded once */
        int64_t n0, n1, last0;
        group_range(c, begin, &n0, &n1);
        group_range(c, end - 1, &last0, &n1);
        float *yg = c->y + (size_t)n0 * out_n;
        cf_conv_stem_bf16_forward(g, O, w, c->x + (size_t)n0 * in_n, (int)(n1 - n0), yg, col);
        for (size_t r = 0; b && r < (size_t)(n1 - n0) * O; r++)
            for (int p = 0; p < P; p++) yg[r * P + p] += b[r % O];
        return;
    }
    for (int64_t gi = begin; gi < end; gi++) {
        int64_t n0, n1;
        group_range(c, gi, &n0, &n1);
        const int cols = (int)(n1 - n0) * P;
        if (n1 < c->batch && gi + 1 < end) {
            int64_t m0, m1;
            group_range(c, gi + 1, &m0, &m1);
            prefetch_input(c, m0, m1);
        }
        const float *patches = c->x + (size_t)n0 * in_n; /* direct: the image itself */
        if (!c->direct) {
            for (int64_t n = n0; n < n1; n++)
                cf_im2col(g, c->x + (size_t)n * in_n, col + (size_t)(n - n0) * P, c->ld);
            patches = col;
        }
        const int ldp = c->direct ? P : c->ld;
        if (!buf) {
            float *yn = c->y + (size_t)n0 * out_n;
            if (bf16)
                cf_sgemm_bf16(false, false, O, P, K, w, K, patches, ldp, yn, P, false);
            else
                cf_sgemm_strided(O, P, K, w, K, 1, patches, ldp, yn, P, false);
            if (b)
                for (int o = 0; o < O; o++) {
                    float *row = yn + (size_t)o * P, bo = b[o];
                    for (int p = 0; p < P; p++) row[p] += bo;
                }
            continue;
        }
        if (bf16)
            cf_sgemm_bf16(false, false, O, cols, K, w, K, patches, ldp, buf, c->ld, false);
        else
            cf_sgemm_strided(O, cols, K, w, K, 1, patches, ldp, buf, c->ld, false);
        for (int64_t n = n0; n < n1; n++) {
            float *yn = c->y + (size_t)n * out_n;
            for (int o = 0; o < O; o++) {
                const float *src = buf + (size_t)o * c->ld + (size_t)(n - n0) * P;
                float *row = yn + (size_t)o * P, bo = b ? b[o] : 0.0f;
                for (int p = 0; p < P; p++) row[p] = src[p] + bo;
            }
        }
    }
}

/* Runs fn over the groups of the batch. */
static void run_groups(conv_impl *c, int64_t batch, cf_range_fn fn, void *ctx) {
    c->batch = batch;
    run_batch(c, (batch + c->group - 1) / c->group, fn, ctx);
}

/* Whether this call reads the images in place (cf_conv_implicit_*) rather than lowering them. */
static bool use_implicit(const conv_impl *c) {
    return c->implicit && !cf_kernels_reference() && !use_bf16(c);
}

/* Whether this call's weight gradient alone goes through cf_conv_implicit_wgrad. */
static bool use_implicit_dw(const conv_impl *c) {
    return c->implicit_dw && !cf_kernels_reference() && !use_bf16(c);
}

/* Whether this call goes through cf_conv_winograd_* (the kernel table may have changed since the
 * plan: then the patch matrix, which every non-direct plan keeps room for). In bf16 too, then with
 * its 16 per-point products in bf16 (cf_conv_winograd_*_bf16, winograd_bf16): the transformed
 * tiles are rounded rather than the layer's operands, an error per output of the same order as
 * rounding x and w (winograd.c's header; tests/test_bf16_winograd.c bounds it), and the 2.25x
 * fewer multiplications stack on the doubled bf16 rate, where the bf16 implicit kernel's doubled
 * rate only matched fp32's Winograd. */
static bool use_winograd(const conv_impl *c) {
    return c->winograd && !cf_kernels_reference() && cf_conv_winograd_supported(&c->g);
}

/* Adds the bias to the images [n0, n1) of y. */
static void add_bias(const conv_impl *c, const float *b, int64_t n0, int64_t n1) {
    const int O = c->out_c, P = c->g.oh * c->g.ow;
    for (int64_t n = n0; n < n1; n++)
        for (int o = 0; o < O; o++) {
            float *row = c->y + ((size_t)n * O + o) * P, bo = b[o];
            for (int p = 0; p < P; p++) row[p] += bo;
        }
}

/* ---- the statistics link (nn_internal.h) ---- */

/* Image n's sums into the BatchNorm's block, once the shift is known: image 0 sets it from its
 * own output (its planes' first values, as the BatchNorm takes them); an image whose thread gets
 * there before is left to stats_finish. */
static void stats_image(conv_impl *c, int64_t n) {
    const int O = c->out_c;
    const int64_t P = (int64_t)c->g.oh * c->g.ow;
    const float *yn = c->stats_y + (size_t)n * O * P;
    if (n == 0) {
        for (int o = 0; o < O; o++) c->stats_k[o] = yn[(size_t)o * P];
        atomic_store_explicit(&c->stats_k_ready, 1, memory_order_release);
    } else if (!atomic_load_explicit(&c->stats_k_ready, memory_order_acquire)) {
        return;
    }
    double *part = c->stats_part + (size_t)n * 2 * O;
    cf_bn_image_sums(yn, O, P, c->stats_k, part, part + O);
    c->stats_done[n] = 1;
}

typedef struct stats_call {
    conv_impl *c, *s; /* the layer and its paired shortcut (NULL: none) */
    int64_t begin;    /* the call's first image */
} stats_call;

/* cf_conv_bf16_forward_each's epilogue: the images' sums while their output is in cache. */
static void stats_epilogue(void *v, bool shortcut, int n0, int count) {
    const stats_call *sc = v;
    conv_impl *c = shortcut ? sc->s : sc->c;
    if (!c || !c->stats_on) return;
    for (int64_t n = sc->begin + n0; n < sc->begin + n0 + count; n++) stats_image(c, n);
}

/* Arms c's forward in progress (m's, output y) to take the sums where its BatchNorm can use them:
 * a training forward of the layer's own ops into a BatchNorm that trains (a frozen one keeps its
 * running statistics and never takes them), at most the planned batch, planes of more than one
 * value, no bias (added after the call, when the epilogue has run). */
static void stats_begin(const cf_module *m, conv_impl *c, const cf_tensor *y) {
    c->stats_for = NULL;
    c->stats_wrote = false;
    c->stats_on = c->stats_part && c->stats_want && !c->has_bias && cf_nn_is_conv(m) &&
                  m->training && c->stats_bn && c->stats_bn->training &&
                  y->shape.dim[0] <= c->stats_cap && (int64_t)c->g.oh * c->g.ow > 1 &&
                  !atomic_load_explicit(&stats_link_off, memory_order_relaxed);
    if (!c->stats_on) return;
    c->stats_y = y->data;
    atomic_store_explicit(&c->stats_k_ready, 0, memory_order_relaxed);
    memset(c->stats_done, 0, (size_t)y->shape.dim[0]);
}

/* No sums this call. */
static void stats_clear(conv_impl *c) {
    c->stats_on = c->stats_wrote = false;
    c->stats_for = NULL;
}

/* After the call: the images left (their thread got there before image 0's output), then the
 * sums kept for y (none after a failed call). */
static void stats_finish(conv_impl *c, const cf_tensor *y, bool ok) {
    if (!c->stats_on) return;
    for (int64_t n = 0; ok && n < y->shape.dim[0]; n++)
        if (!c->stats_done[n]) stats_image(c, n);
    c->stats_for = ok ? y->data : NULL;
    c->stats_n = y->shape.dim[0];
    c->stats_wrote = ok;
    c->stats_on = false;
}

void cf_nn_conv_stats_bn(cf_module *conv, cf_module *bn) {
    if (!cf_nn_is_conv(conv)) return;
    conv_impl *c = conv->impl;
    c->stats_bn = bn;
    c->stats_want = true;
}

void cf_nn_conv_stats_want(cf_module *conv, bool want) {
    if (cf_nn_is_conv(conv)) ((conv_impl *)conv->impl)->stats_want = want;
}

const double *cf_nn_conv_stats_sums(cf_module *conv, const cf_tensor *y) {
    if (!cf_nn_is_conv(conv)) return NULL; /* a wrapper's ops may have changed y */
    conv_impl *c = conv->impl;
    const bool ok = c->stats_for && c->stats_for == y->data && y->shape.ndim == 4 &&
                    c->stats_n == y->shape.dim[0] && y->shape.dim[1] == c->out_c &&
                    y->shape.dim[2] == c->g.oh && y->shape.dim[3] == c->g.ow;
    c->stats_for = NULL; /* once */
    return ok ? c->stats_part : NULL;
}

void cf__nn_set_stats_link(bool on) {
    atomic_store(&stats_link_off, !on);
}

bool cf_nn_conv_wrote_stats(const cf_module *conv) {
    return cf_nn_is_conv(conv) && ((const conv_impl *)conv->impl)->stats_wrote;
}

/* The images [begin, end) through cf_conv_stem_forward, with the statistics link's epilogue. */
static void conv_forward_stem_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    cf_module *m = ctx;
    conv_impl *c = m->impl;
    const cf_conv_geom *g = &c->g;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)c->out_c * g->oh * g->ow;
    stats_call call = {c, NULL, begin};
    const cf_conv_epilogue ep = {stats_epilogue, &call};
    /* cannot fail: c->stem holds only where cf_conv_stem_supported takes the shape */
    (void)cf_conv_stem_forward(g, c->out_c, m->params[0].data, c->x + (size_t)begin * in_n,
                               (int)(end - begin), c->y + (size_t)begin * out_n,
                               c->stats_on ? &ep : NULL);
    if (c->has_bias) add_bias(c, m->params[1].data, begin, end);
}

/* The images [begin, end) through cf_conv_bf16_forward_each, with the statistics link's
 * epilogue. */
static void conv_forward_stats_range(conv_impl *c, int64_t begin, int64_t end, int thread) {
    const cf_conv_geom *g = &c->g;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)c->out_c * g->oh * g->ow;
    cf_conv_shortcut sc = c->shortcut_call;
    sc.y += (size_t)begin * sc.out_channels * g->oh * g->ow;
    stats_call call = {c, NULL, begin};
    if (sc.out_channels && c->shortcut_impl) call.s = c->shortcut_impl;
    const cf_conv_epilogue ep = {stats_epilogue, &call};
    bf16_note(c,
              cf_conv_bf16_forward_each(
                  g, c->out_c, c->bf16_packed, c->from_words ? NULL : c->x + (size_t)begin * in_n,
                  c->from_words ? c->bf16_x + (size_t)begin * in_n : NULL, (int)(end - begin),
                  c->y + (size_t)begin * out_n, c->scratch + (size_t)thread * c->scratch_stride,
                  sc.out_channels ? &sc : NULL,
                  !c->from_words && c->bf16_x_kept ? c->bf16_x + (size_t)begin * in_n : NULL, &ep),
              "cf_conv_bf16_forward_each");
}

/* The images [begin, end) through cf_conv_bf16_forward. */
static void conv_forward_bf16_range(void *ctx, int64_t begin, int64_t end, int thread) {
    cf_module *m = ctx;
    conv_impl *c = m->impl;
    const cf_conv_geom *g = &c->g;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)c->out_c * g->oh * g->ow;
    if (c->stats_on || (c->shortcut_impl && c->shortcut_impl->stats_on)) {
        conv_forward_stats_range(c, begin, end, thread);
    } else if (c->from_words) { /* from the words the BatchNorm before wrote (x was not written) */
        cf_conv_shortcut sc = c->shortcut_call;
        sc.y += (size_t)begin * sc.out_channels * g->oh * g->ow;
        bf16_note(c,
                  cf_conv_bf16_forward_from_kept_with(
                      g, c->out_c, c->bf16_packed, c->bf16_x + (size_t)begin * in_n,
                      (int)(end - begin), c->y + (size_t)begin * out_n,
                      c->scratch + (size_t)thread * c->scratch_stride,
                      sc.out_channels ? &sc : NULL),
                  "cf_conv_bf16_forward_from_kept");
    } else if (c->bf16_x_kept) { /* and x's bf16 words for the backward */
        cf_conv_shortcut sc = c->shortcut_call;
        sc.y += (size_t)begin * sc.out_channels * g->oh * g->ow;
        bf16_note(c,
                  cf_conv_bf16_forward_keep(
                      g, c->out_c, c->bf16_packed, c->x + (size_t)begin * in_n, (int)(end - begin),
                      c->y + (size_t)begin * out_n, c->scratch + (size_t)thread * c->scratch_stride,
                      sc.out_channels ? &sc : NULL, c->bf16_x + (size_t)begin * in_n),
                  "cf_conv_bf16_forward_keep");
    } else if (c->shortcut_call.out_channels) {
        cf_conv_shortcut sc = c->shortcut_call;
        sc.y += (size_t)begin * sc.out_channels * g->oh * g->ow;
        bf16_note(c,
                  cf_conv_bf16_forward_with(g, c->out_c, c->bf16_packed,
                                            c->x + (size_t)begin * in_n, (int)(end - begin),
                                            c->y + (size_t)begin * out_n,
                                            c->scratch + (size_t)thread * c->scratch_stride, &sc),
                  "cf_conv_bf16_forward_with");
    } else
        bf16_note(c,
                  cf_conv_bf16_forward(g, c->out_c, c->bf16_packed, c->x + (size_t)begin * in_n,
                                       (int)(end - begin), c->y + (size_t)begin * out_n,
                                       c->scratch + (size_t)thread * c->scratch_stride),
                  "cf_conv_bf16_forward");
    if (c->has_bias) add_bias(c, m->params[1].data, begin, end);
}

/* The images [begin, end) without a patch matrix: through Winograd or the implicit kernels. */
static void conv_forward_in_place_range(void *ctx, int64_t begin, int64_t end, int thread) {
    cf_module *m = ctx;
    conv_impl *c = m->impl;
    const cf_conv_geom *g = &c->g;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)c->out_c * g->oh * g->ow;
    const float *x = c->x + (size_t)begin * in_n;
    float *y = c->y + (size_t)begin * out_n,
          *scratch = c->scratch + (size_t)thread * c->scratch_stride;
    if (c->winograd_call && c->winograd_bf16)
        cf_conv_winograd_forward_bf16(g, c->out_c, c->wino_u, x, (int)(end - begin), y, scratch);
    else if (c->winograd_call)
        cf_conv_winograd_forward(g, c->out_c, c->wino_u, x, (int)(end - begin), y, scratch);
    else if (c->shortcut_call.out_channels) {
        cf_conv_shortcut sc = c->shortcut_call;
        sc.y += (size_t)begin * sc.out_channels * g->oh * g->ow;
        cf_conv_implicit_forward_with(g, c->out_c, c->wpack, x, (int)(end - begin), y, scratch,
                                      &sc);
    } else
        cf_conv_implicit_forward(g, c->out_c, c->wpack, x, (int)(end - begin), y, scratch);
    if (c->has_bias) add_bias(c, m->params[1].data, begin, end);
}

/* Whether shortcut (any module) is a 1x1 stride-2 layer without padding or bias whose output c
 * can compute from its phase split of x: the same channels and output plane. The plane is wider
 * than any vector so that cf_sgemm_strided takes the same kernel per image as over the
 * shortcut's grouped patch matrix (bitwise the same products). */
static bool shortcut_fits(const conv_impl *c, const cf_module *shortcut, const cf_tensor *x) {
    if (!cf_nn_is_conv(shortcut) || c->stride != 2 || c->winograd_call || !use_implicit(c))
        return false;
    const conv_impl *s = shortcut->impl;
    return !use_bf16(s) && s->k == 1 && s->stride == 2 && s->pad == 0 && !s->has_bias &&
           s->in_c == c->in_c && s->g.h == x->shape.dim[2] && s->g.w == x->shape.dim[3] &&
           s->g.oh == c->g.oh && s->g.ow == c->g.ow && c->g.oh * c->g.ow > 16;
}

/* The same in mixed precision: both layers through cf_conv_bf16_*, which shares x's phase planes
 * (cf_conv_bf16_pair_fits), the shortcut without bias. */
static bool shortcut_fits_bf16_shape(const conv_impl *c, const cf_module *shortcut,
                                     const cf_shape *in) {
    if (!cf_nn_is_conv(shortcut) || c->stride != 2 || !use_bf16_implicit(c)) return false;
    const conv_impl *s = shortcut->impl;
    return use_bf16_implicit(s) && !s->has_bias && s->g.h == in->dim[2] && s->g.w == in->dim[3] &&
           cf_conv_bf16_pair_fits(&c->g, c->out_c, &s->g, s->out_c);
}

static bool shortcut_fits_bf16(const conv_impl *c, const cf_module *shortcut, const cf_tensor *x) {
    return shortcut_fits_bf16_shape(c, shortcut, &x->shape);
}

/* Whether m's next forward on an input of shape `in` (alone, not paired) keeps x's bf16 words
 * and can compute from them alone, the backward reading them too (the forward link,
 * nn_internal.h): the conditions of conv_forward_call's bf16_x_kept, asked before the call. */
static bool words_fits(const cf_module *m, const cf_shape *in) {
    if (!cf_nn_is_conv(m)) return false; /* a wrapper's ops may read x */
    const conv_impl *c = m->impl;
    return !atomic_load(&x_words_link_off) && in->ndim == 4 && in->dim[1] == c->g.c &&
           in->dim[2] == c->g.h && in->dim[3] == c->g.w && use_bf16_implicit(c) && c->bf16_x &&
           in->dim[0] <= c->bf16_x_cap && m->training && m->params[0].trainable &&
           cf_conv_bf16_forward_from_kept_fits(&c->g, c->out_c);
}

/* Alone: stride 1 only (fuse.c: a size change is where a U-Net takes the output before). */
static bool words_link_fits(const cf_module *m, const cf_shape *in) {
    return words_fits(m, in) && ((const conv_impl *)m->impl)->stride == 1;
}

/* ... and paired with its block's shortcut (cf_nn_conv_words_pair): the block's forward pairs
 * the two (shortcut_fits_bf16, whose output this call computes from the same phase planes), the
 * block's ops its own (nothing else reads x: the idpath runs from the pair's output on). */
static bool words_pair_fits(const cf_module *m, const cf_shape *in) {
    if (!words_fits(m, in)) return false;
    const conv_impl *c = m->impl;
    return !atomic_load(&x_pair_link_off) && c->words_shortcut && c->words_block &&
           c->words_block->ops == c->words_block_ops && c->words_shortcut->training &&
           shortcut_fits_bf16_shape(c, c->words_shortcut, in);
}

uint16_t *cf_nn_conv_words_target(cf_module *conv, const cf_shape *in) {
    if (!cf_nn_is_conv(conv)) return NULL;
    const conv_impl *c = conv->impl;
    const bool fits = c->words_shortcut ? words_pair_fits(conv, in) : words_link_fits(conv, in);
    return fits ? c->bf16_x : NULL;
}

void cf_nn_conv_words_pair(cf_module *conv, cf_module *shortcut, const cf_module *block) {
    if (!cf_nn_is_conv(conv)) return;
    conv_impl *c = conv->impl;
    c->words_shortcut = shortcut && cf_nn_is_conv(shortcut) ? shortcut : NULL;
    c->words_block = c->words_shortcut ? block : NULL;
    c->words_block_ops = c->words_block ? block->ops : NULL;
}

void cf_nn_conv_words_written(cf_module *conv, const float *x) {
    if (cf_nn_is_conv(conv)) ((conv_impl *)conv->impl)->words_for = x;
}

bool cf_nn_conv_read_words(const cf_module *conv) {
    return cf_nn_is_conv(conv) && ((const conv_impl *)conv->impl)->from_words;
}

const uint16_t *cf__conv_bf16_kept(const cf_module *conv, size_t *n) {
    const conv_impl *c = cf_nn_is_conv(conv) ? conv->impl : NULL;
    *n = c && c->bf16_x_kept ? (size_t)c->batch * c->g.c * c->g.h * c->g.w : 0;
    return *n ? c->bf16_x : NULL;
}

void cf__nn_set_x_words_link(bool on) {
    atomic_store(&x_words_link_off, !on);
}

void cf__nn_set_x_pair_link(bool on) {
    atomic_store(&x_pair_link_off, !on);
}

/* The forward pass; with shortcut, also shortcut's output when the pair qualifies (returns
 * whether it did through *computed). */
static const cf_tensor *conv_forward_call(cf_module *m, const cf_tensor *x, cf_module *shortcut,
                                          bool *computed) {
    conv_impl *c = m->impl;
    m->in = x;
    c->words_src = NULL;
    const cf_conv_geom *g = &c->g;
    cf_tensor *y = cf_module_output(m, &(cf_shape){4, {x->shape.dim[0], c->out_c, g->oh, g->ow}});
    c->x = x->data; /* backward reads them */
    c->y = y->data;
    c->batch = x->shape.dim[0];
    c->by_sibling = false;
    c->dyw_for = NULL; /* words written for an earlier pass are stale */
    c->winograd_call = use_winograd(c);
    c->winograd_bf16 = c->winograd_call && use_bf16(c);
    c->shortcut_call.out_channels = 0;
    c->shortcut_impl = NULL;
    const bool pair_bf16 = shortcut && shortcut_fits_bf16(c, shortcut, x);
    if (shortcut && (pair_bf16 || shortcut_fits(c, shortcut, x))) {
        conv_impl *s = shortcut->impl;
        cf_tensor *ys = cf_module_output(
            shortcut, &(cf_shape){4, {x->shape.dim[0], s->out_c, s->g.oh, s->g.ow}});
        /* bf16: the shortcut's own pack, which its share of the backward reads too */
        if (pair_bf16) cf_conv_bf16_pack(&s->g, s->out_c, shortcut->params[0].data, s->bf16_packed);
        s->bf16_fresh = pair_bf16;
        c->shortcut_call =
            (cf_conv_shortcut){.out_channels = s->out_c,
                               .w = pair_bf16 ? s->bf16_packed : shortcut->params[0].data,
                               .y = ys->data};
        c->shortcut_impl = s;
    }
    float *mem = call_begin(c, false);
    c->bf16_fresh = use_bf16_implicit(c);
    /* a training forward whose weights learn keeps x's bf16 words (the backward reads them) */
    c->bf16_x_kept = c->bf16_fresh && c->bf16_x && c->batch <= c->bf16_x_cap && m->training &&
                     m->params[0].trainable;
    /* x's words written by the BatchNorm before in place of x (its fp32 values were not) */
    c->from_words = c->words_for && c->words_for == x->data;
    c->words_for = NULL;
    const bool words_ok =
        c->shortcut_call.out_channels
            ? pair_bf16 && shortcut == c->words_shortcut && words_pair_fits(m, &x->shape)
            : !c->words_shortcut && words_link_fits(m, &x->shape);
    if (c->from_words && !(words_ok && c->bf16_x_kept)) {
        /* the BatchNorm asked words_link_fits just before: this cannot happen */
        c->from_words = false;
        cf_module_fail(CF_ERR_STATE, "Conv2d forward: its input was written as bf16 words the "
                                     "layer cannot read");
    }
    /* the statistics link: the next BatchNorms' sums from the bf16 call's or the direct stem's
     * epilogue */
    conv_impl *sci = c->shortcut_impl;
    c->stem_call = !c->bf16_fresh && !c->winograd_call && !use_implicit(c) &&
                   !c->shortcut_call.out_channels && use_stem_direct(c);
    if (c->bf16_fresh || c->stem_call) {
        stats_begin(m, c, y);
        if (sci) stats_begin(shortcut, sci, &shortcut->out);
    } else {
        stats_clear(c);
        if (sci) stats_clear(sci);
    }
    if (c->bf16_fresh) {
        cf_conv_bf16_pack(g, c->out_c, m->params[0].data, c->bf16_packed);
        run_batch(c, c->batch, conv_forward_bf16_range, m);
        const bool ok = atomic_load(&c->bf16_status) == CF_OK;
        stats_finish(c, y, ok);
        if (sci) stats_finish(sci, &shortcut->out, ok);
    } else if (c->winograd_call || use_implicit(c)) {
        if (c->winograd_bf16)
            cf_conv_winograd_pack_bf16(g, c->out_c, m->params[0].data, c->wino_u);
        else if (c->winograd_call)
            cf_conv_winograd_pack(g, c->out_c, m->params[0].data, c->wino_u);
        else
            cf_conv_implicit_pack(g, c->out_c, m->params[0].data, c->wpack);
        run_batch(c, c->batch, conv_forward_in_place_range, m);
    } else if (c->stem_call) {
        run_batch(c, c->batch, conv_forward_stem_range, m);
        stats_finish(c, y, true);
    } else
        run_groups(c, c->batch, conv_forward_range, m);
    call_end(c, mem);
    conv_report(c, "forward");
    if (computed) *computed = c->shortcut_call.out_channels != 0;
    c->shortcut_call.out_channels = 0;
    return y;
}

static const cf_tensor *conv_forward(cf_module *m, const cf_tensor *x) {
    return conv_forward_call(m, x, NULL, NULL);
}

const cf_tensor *cf_nn_conv_forward_pair(cf_module *conv, cf_module *shortcut, const cf_tensor *x,
                                         const cf_tensor **shortcut_y) {
    bool computed = false;
    const cf_tensor *y = conv_forward_call(conv, x, shortcut, &computed);
    *shortcut_y = NULL;
    if (computed) { /* the shortcut's state as its own forward on x would leave it */
        conv_impl *s = shortcut->impl;
        shortcut->in = x;
        s->x = x->data;
        s->y = shortcut->out.data;
        s->batch = x->shape.dim[0];
        s->by_sibling = true;
        s->words_src = ((conv_impl *)conv->impl)->from_words ? conv->impl : NULL;
        *shortcut_y = &shortcut->out;
    }
    return y;
}

/* dyt (rows x O) = the group's output gradient transposed: row (n - n0)*P + p holds
 * dy[n, :, p]. */
static void transpose_dy(const conv_impl *c, int64_t n0, int64_t n1, float *dyt) {
    const int O = c->out_c, P = c->g.oh * c->g.ow;
    const size_t out_n = (size_t)O * P;
    for (int64_t n = n0; n < n1; n++)
        cf_transpose(O, P, c->dy + (size_t)n * out_n, P, dyt + (size_t)(n - n0) * P * O, O);
}

/* The group's output gradient as one O x cols matrix: dy itself for one image, else gathered
 * into buf (row stride c->ld). */
static const float *group_dy(const conv_impl *c, int64_t n0, int64_t n1, float *buf, int *ld) {
    const int O = c->out_c, P = c->g.oh * c->g.ow;
    const size_t out_n = (size_t)O * P;
    if (!buf) {
        *ld = P;
        return c->dy + (size_t)n0 * out_n;
    }
    for (int64_t n = n0; n < n1; n++)
        for (int o = 0; o < O; o++)
            memcpy(buf + (size_t)o * c->ld + (size_t)(n - n0) * P,
                   c->dy + (size_t)n * out_n + (size_t)o * P, (size_t)P * sizeof(float));
    *ld = c->ld;
    return buf;
}

/* The bias gradient of the images [n0, n1), into db (overwritten when first). */
static void bias_grad(const conv_impl *c, int64_t n0, int64_t n1, float *db, bool first) {
    const int O = c->out_c, P = c->g.oh * c->g.ow;
    for (int o = 0; o < O; o++) {
        float s = 0.0f;
        for (int64_t n = n0; n < n1; n++) {
            const float *row = c->dy + ((size_t)n * O + o) * P;
            for (int p = 0; p < P; p++) s += row[p];
        }
        db[o] = first ? s : db[o] + s;
    }
}

/* The direct weight gradient's prologue (cf_nn_conv_dy_fill): image n0 + i's dy into buf. */
typedef struct dy_fill_image_ctx {
    const conv_impl *c;
    int64_t n0;
    float *buf;
} dy_fill_image_ctx;

static const float *dy_fill_image(void *ctx, int i) {
    const dy_fill_image_ctx *f = ctx;
    f->c->dyf_fn(f->c->dyf_ctx, f->n0 + i, f->buf);
    return f->buf;
}

static void conv_backward_range(void *ctx, int64_t begin, int64_t end, int thread) {
    cf_module *m = ctx;
    conv_impl *c = m->impl;
    const cf_conv_geom *g = &c->g;
    const int O = c->out_c, K = c->in_c * c->k * c->k, P = g->oh * g->ow;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)O * P;
    const float *w = m->params[0].data;
    float *col = c->col ? c->col + (size_t)thread * c->col_stride : NULL;
    float *buf = c->buf ? c->buf + (size_t)thread * c->buf_stride : NULL;
    float *dyt = c->dyt + (size_t)thread * c->dyt_stride;
    float *dwt = c->dwt + (size_t)thread * c->dw_stride;
    float *db = c->db ? c->db + (size_t)thread * c->db_stride : NULL;
    /* A weight gradient with few rows and one vector of columns (a stem on a 1-channel image)
     * is col . dy^T, dot products along the positions (cf_sgemm_nt), dy read as it is. */
    const bool dw_dots = bf16_dw_dots(c);
    /* bf16: dx's product reads W transposed; dW = dy . col^T (O x K, the gradient's own layout:
     * K fills the kernel's 48-column tiles where O = 32 or 64 would leave a third of them
     * empty), both read in place (the kernel packs and rounds either layout). The few-row weight
     * gradient of dw_dots stays fp32: its bf16 tiles would be mostly padding. */
    const bool bf16 = use_bf16(c), dw_bf16 = bf16 && !dw_dots, stem = use_stem_bf16(c);
    const bool stem_direct = use_stem_direct_dw(c);
    c->ran[thread] = 1;
    for (int64_t gi = begin; gi < end; gi++) {
        int64_t n0, n1;
        group_range(c, gi, &n0, &n1);
        const int cols = (int)(n1 - n0) * P;
        const bool first = gi == begin; /* the first group overwrites the partial sums */
        if (n1 < c->batch && gi + 1 < end) {
            int64_t m0, m1;
            group_range(c, gi + 1, &m0, &m1);
            if (c->want_dw) prefetch_input(c, m0, m1);
            if (!c->dyf_call) /* else dy is made image by image */
                cf_prefetch(c->dy + (size_t)m0 * out_n, (size_t)(m1 - m0) * out_n * sizeof(float),
                            false, false);
        }
        const float *dyg = NULL;
        int ldg = 0;
        if (c->want_dw && stem_direct) { /* dW^T (K x O) of the range, at its first group */
            if (first) {
                int64_t m0, m1;
                group_range(c, end - 1, &m0, &m1);
                /* dy from the BatchNorm's fill, one image at a time into this thread's dyt */
                dy_fill_image_ctx fc = {c, n0, dyt};
                const cf_conv_prologue pro = {dy_fill_image, &fc};
                (void)cf_conv_stem_wgrad_each(g, O, c->dyf_call ? NULL : c->dy + (size_t)n0 * out_n,
                                              c->dyf_call ? &pro : NULL, c->x + (size_t)n0 * in_n,
                                              (int)(m1 - n0), dwt, false);
            }
        } else if (c->want_dw && stem) { /* dW^T (K x O), as the fp32 product's */
            cf_conv_stem_bf16_wgrad(g, O, c->dy + (size_t)n0 * out_n, c->x + (size_t)n0 * in_n,
                                    (int)(n1 - n0), dwt, !first, col);
        } else if (c->want_dw) {
            const float *patches = c->x + (size_t)n0 * in_n; /* direct: one image, K x P */
            int ldp = P;
            if (!c->direct) {
                for (int64_t n = n0; n < n1; n++)
                    cf_im2col(g, c->x + (size_t)n * in_n, col + (size_t)(n - n0) * P, c->ld);
                patches = col;
                ldp = c->ld;
            }
            if (dw_bf16) {
                dyg = group_dy(c, n0, n1, buf, &ldg);
                cf_sgemm_bf16(false, true, O, K, cols, dyg, ldg, patches, ldp, dwt, K, !first);
            } else if (dw_dots) {
                dyg = group_dy(c, n0, n1, buf, &ldg);
                cf_sgemm_nt(K, O, cols, patches, ldp, dyg, ldg, dwt, O, !first);
            } else {
                transpose_dy(c, n0, n1, dyt);
                cf_sgemm_strided(K, O, cols, patches, ldp, 1, dyt, O, dwt, O, !first);
            }
        }
        if (c->want_db) bias_grad(c, n0, n1, db, first);
        if (c->need_dx) {
            if (!dyg) dyg = group_dy(c, n0, n1, buf, &ldg);
            float *dxg = c->dx + (size_t)n0 * in_n;
            if (c->direct && bf16) {
                cf_sgemm_bf16(true, false, K, P, O, w, K, dyg, ldg, dxg, P, false);
            } else if (c->direct) {
                cf_sgemm_strided(K, P, O, w, 1, K, dyg, ldg, dxg, P, false);
            } else {
                if (bf16)
                    cf_sgemm_bf16(true, false, K, cols, O, w, K, dyg, ldg, col, c->ld, false);
                else
                    cf_sgemm_strided(K, cols, O, w, 1, K, dyg, ldg, col, c->ld, false);
                for (int64_t n = n0; n < n1; n++) {
                    float *dxn = c->dx + (size_t)n * in_n;
                    if (c->add_dx)
                        cf_col2im_add(g, col + (size_t)(n - n0) * P, c->ld, dxn);
                    else
                        cf_col2im(g, col + (size_t)(n - n0) * P, c->ld, dxn);
                }
            }
        }
    }
}

/* Adds the threads' implicit-layout partial sums ([tap][out][in]) of output channels [o0, o1)
 * into m's weight gradient, each element over the threads in thread order. */
static void reduce_implicit_rows(cf_module *m, int o0, int o1) {
    conv_impl *c = m->impl;
    cf_param *wp = &m->params[0];
    const int O = c->out_c, T = c->k * c->k, I = c->in_c;
    for (int t = 0; t < c->n_threads; t++) {
        if (!c->ran[t]) continue;
        const float *part = c->dwt + (size_t)t * c->dw_stride;
        for (int o = o0; o < o1; o++)
            for (int i = 0; i < I; i++) {
                float *gr = wp->grad + ((size_t)o * I + i) * T;
                for (int tap = 0; tap < T; tap++) gr[tap] += part[((size_t)tap * O + o) * I + i];
            }
    }
}

/* In a backward job (reduce_in_job): the images [begin, end) have their weight-gradient partial
 * sums written (this layer's and its paired shortcut's). */
static void dw_written(conv_impl *c, int64_t begin, int64_t end) {
    if (c->reduce_in_job) atomic_fetch_add(&c->dw_images, end - begin);
}

/* At the end of a part of a backward job (reduce_in_job): once every image's partial sums are
 * written, adds slices of them into the gradients until none is left. A part that ends earlier
 * leaves them to the others: the part whose check comes last sees every image's (each part
 * counts its images before its check), so every slice is added before the job ends. */
static void dw_reduce_slices(cf_module *m) {
    conv_impl *c = m->impl;
    if (!c->reduce_in_job || atomic_load(&c->dw_images) < c->batch) return;
    const int total = c->dw_slices + c->sc_slices;
    for (;;) {
        const int s = atomic_fetch_add(&c->dw_next_slice, 1);
        if (s >= total) return;
        cf_module *r = s < c->dw_slices ? m : c->shortcut_dw;
        const int slices = s < c->dw_slices ? c->dw_slices : c->sc_slices,
                  k = s < c->dw_slices ? s : s - c->dw_slices, O = ((conv_impl *)r->impl)->out_c;
        reduce_implicit_rows(r, (int)((int64_t)O * k / slices),
                             (int)((int64_t)O * (k + 1) / slices));
    }
}

/* The paired 1x1 shortcut's weight-gradient part for the images from `begin` on, into this
 * thread's partial sums (the shortcut marked as run on this thread); none (0 outputs) without one.
 */
static cf_conv_shortcut shortcut_dw_part(const conv_impl *c, int64_t begin, int thread) {
    if (!c->shortcut_dw) return (cf_conv_shortcut){0};
    conv_impl *s = c->shortcut_dw->impl;
    s->ran[thread] = 1;
    return (cf_conv_shortcut){
        .out_channels = s->out_c,
        .dy = s->dy + (size_t)begin * s->out_c * c->g.oh * c->g.ow,
        .dw = s->dwt + (size_t)thread * s->dw_stride,
    };
}

/* The images [begin, end) without a patch matrix: the weight gradient into this thread's partial
 * sums (Winograd: transformed, [16][in][out]; implicit: [tap][out][in]), dx in one call. */
static void conv_backward_in_place_range(void *ctx, int64_t begin, int64_t end, int thread) {
    cf_module *m = ctx;
    conv_impl *c = m->impl;
    const cf_conv_geom *g = &c->g;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)c->out_c * g->oh * g->ow;
    const int count = (int)(end - begin);
    const float *x = c->x + (size_t)begin * in_n, *dy = c->dy + (size_t)begin * out_n;
    float *scratch = c->scratch + (size_t)thread * c->scratch_stride;
    c->ran[thread] = 1;
    if (c->want_dw && c->need_dx && c->winograd_call) { /* both, block by block */
        float *du = c->wino_du + (size_t)thread * c->wino_du_stride,
              *dx = c->dx + (size_t)begin * in_n;
        if (c->winograd_bf16)
            cf_conv_winograd_backward_bf16(g, c->out_c, c->wino_u_dx, dy, x, count, du, false, dx,
                                           scratch);
        else
            cf_conv_winograd_backward(g, c->out_c, c->wino_u_dx, dy, x, count, du, false, dx,
                                      scratch);
        if (c->want_db) bias_grad(c, begin, end, c->db + (size_t)thread * c->db_stride, true);
        return;
    }
    if (c->want_dw && c->winograd_call && c->winograd_bf16)
        cf_conv_winograd_wgrad_bf16(g, c->out_c, dy, x, count,
                                    c->wino_du + (size_t)thread * c->wino_du_stride, false,
                                    scratch);
    else if (c->want_dw && c->winograd_call)
        cf_conv_winograd_wgrad(g, c->out_c, dy, x, count,
                               c->wino_du + (size_t)thread * c->wino_du_stride, false, scratch);
    else if (c->want_dw && c->shortcut_dw) { /* and the shortcut's, from the same blocks */
        const cf_conv_shortcut sc = shortcut_dw_part(c, begin, thread);
        cf_conv_implicit_wgrad_with(g, c->out_c, dy, x, count,
                                    c->dwt + (size_t)thread * c->dw_stride, false, scratch, &sc);
    } else if (c->want_dw)
        cf_conv_implicit_wgrad(g, c->out_c, dy, x, count, c->dwt + (size_t)thread * c->dw_stride,
                               false, scratch);
    dw_written(c, begin, end);
    if (c->want_db) bias_grad(c, begin, end, c->db + (size_t)thread * c->db_stride, true);
    if (c->need_dx && c->winograd_call && c->winograd_bf16)
        cf_conv_winograd_dx_bf16(g, c->out_c, c->wino_u_dx, dy, count, c->dx + (size_t)begin * in_n,
                                 scratch);
    else if (c->need_dx && c->winograd_call)
        cf_conv_winograd_dx(g, c->out_c, c->wino_u_dx, dy, count, c->dx + (size_t)begin * in_n,
                            scratch);
    else if (c->need_dx) {
        cf_conv_shortcut sc = c->shortcut_dx;
        sc.dy += (size_t)begin * sc.out_channels * g->oh * g->ow;
        cf_conv_implicit_dx_with(g, c->out_c, c->wpack_dx, dy, count, c->dx + (size_t)begin * in_n,
                                 scratch, sc.out_channels ? &sc : NULL);
    }
    dw_reduce_slices(m);
}

/* Before the threads read the pack: one made at another level (cf_set_isa or CF_ISA changed
 * between forward and backward; the amx order read by the avx512_bf16 kernels, or the reverse,
 * gives wrong sums) is reordered for the active one, and where the forward did not pack (it ran
 * at a level without bf16 kernels) the pack is made from the weights, which the forward read. */
static void bf16_pack_for_level(conv_impl *c, const float *w) {
    if (!c->bf16_fresh)
        cf_conv_bf16_pack(&c->g, c->out_c, w, c->bf16_packed);
    else if (!cf_conv_bf16_pack_current(&c->g, c->out_c, c->bf16_packed))
        bf16_note(c, cf_conv_bf16_repack(&c->g, c->out_c, c->bf16_packed), "cf_conv_bf16_repack");
    c->bf16_fresh = true;
}

/* The images [begin, end) through cf_conv_bf16_wgrad (into this thread's partial sums,
 * [tap][out][in]) and cf_conv_bf16_dx, with the weights the forward pass packed. */
static void conv_backward_bf16_range(void *ctx, int64_t begin, int64_t end, int thread) {
    cf_module *m = ctx;
    conv_impl *c = m->impl;
    const cf_conv_geom *g = &c->g;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)c->out_c * g->oh * g->ow;
    const int count = (int)(end - begin);
    const float *x = c->x + (size_t)begin * in_n, *dy = c->dy + (size_t)begin * out_n;
    float *scratch = c->scratch + (size_t)thread * c->scratch_stride;
    c->ran[thread] = 1;
    if (c->dyw_call || c->shortcut_words) { /* dy (or the shortcut's) as bf16 words */
        cf_conv_shortcut sdw = shortcut_dw_part(c, begin, thread), sdx = c->shortcut_dx;
        const size_t so_n = (size_t)sdx.out_channels * g->oh * g->ow;
        if (sdx.out_channels) sdx.dy += (size_t)begin * so_n;
        bf16_note(c,
                  cf_conv_bf16_backward_words(
                      g, c->out_c, c->bf16_packed, dy,
                      c->dyw_call ? (const uint16_t *)c->dy + (size_t)begin * out_n : NULL, x,
                      c->bf16_x_kept ? c->bf16_x + (size_t)begin * in_n : NULL, count,
                      c->dwt + (size_t)thread * c->dw_stride,
                      c->need_dx ? c->dx + (size_t)begin * in_n : NULL, scratch,
                      sdw.out_channels ? &sdw : NULL, c->need_dx && sdx.out_channels ? &sdx : NULL,
                      c->shortcut_words ? c->shortcut_words + (size_t)begin * so_n : NULL),
                  "cf_conv_bf16_backward_words");
        dw_written(c, begin, end);
        /* only with the shortcut's words: dy itself is then fp32 (dy_words_call never takes
         * words for a layer with a bias gradient), as backward_kept's branch sums it */
        if (c->want_db) bias_grad(c, begin, end, c->db + (size_t)thread * c->db_stride, true);
        dw_reduce_slices(m);
        return;
    }
    if (c->want_dw && c->need_dx && !c->add_dx) { /* both in one pass over the blocks */
        cf_conv_shortcut sdw = shortcut_dw_part(c, begin, thread), sdx = c->shortcut_dx;
        if (sdx.out_channels) sdx.dy += (size_t)begin * sdx.out_channels * g->oh * g->ow;
        bf16_note(c,
                  cf_conv_bf16_backward_kept(
                      g, c->out_c, c->bf16_packed, dy, x,
                      c->bf16_x_kept ? c->bf16_x + (size_t)begin * in_n : NULL, count,
                      c->dwt + (size_t)thread * c->dw_stride, c->dx + (size_t)begin * in_n, scratch,
                      sdw.out_channels ? &sdw : NULL, sdx.out_channels ? &sdx : NULL),
                  "cf_conv_bf16_backward_kept");
        dw_written(c, begin, end);
        if (c->want_db) bias_grad(c, begin, end, c->db + (size_t)thread * c->db_stride, true);
        dw_reduce_slices(m);
        return;
    }
    if (c->want_dw && c->shortcut_dw) { /* and the shortcut's, from the same blocks */
        const cf_conv_shortcut sc = shortcut_dw_part(c, begin, thread);
        cf_conv_bf16_wgrad_with(g, c->out_c, dy, x, count, c->dwt + (size_t)thread * c->dw_stride,
                                scratch, &sc);
    } else if (c->want_dw)
        cf_conv_bf16_wgrad(g, c->out_c, dy, x, count, c->dwt + (size_t)thread * c->dw_stride,
                           scratch);
    dw_written(c, begin, end);
    if (c->want_db) bias_grad(c, begin, end, c->db + (size_t)thread * c->db_stride, true);
    if (c->need_dx && c->add_dx)
        bf16_note(c,
                  cf_conv_bf16_dx_add(g, c->out_c, c->bf16_packed, dy, count,
                                      c->dx + (size_t)begin * in_n, scratch)
                      ? CF_OK
                      : CF_ERR_STATE, /* its message recorded (cf_last_error) */
                  "cf_conv_bf16_dx_add");
    else if (c->need_dx && c->shortcut_dx.out_channels) {
        cf_conv_shortcut sc = c->shortcut_dx;
        sc.dy += (size_t)begin * sc.out_channels * g->oh * g->ow;
        bf16_note(c,
                  cf_conv_bf16_dx_with(g, c->out_c, c->bf16_packed, dy, count,
                                       c->dx + (size_t)begin * in_n, scratch, &sc),
                  "cf_conv_bf16_dx_with");
    } else if (c->need_dx)
        bf16_note(c,
                  cf_conv_bf16_dx(g, c->out_c, c->bf16_packed, dy, count,
                                  c->dx + (size_t)begin * in_n, scratch),
                  "cf_conv_bf16_dx");
    dw_reduce_slices(m);
}

/* The weight gradient alone of the images [begin, end) of an implicit_dw layer, into this
 * thread's partial sums [out][in]. */
static void conv_wgrad_range(void *ctx, int64_t begin, int64_t end, int thread) {
    cf_module *m = ctx;
    conv_impl *c = m->impl;
    const cf_conv_geom *g = &c->g;
    const size_t in_n = (size_t)g->c * g->h * g->w, out_n = (size_t)c->out_c * g->oh * g->ow;
    c->ran[thread] = 1;
    cf_conv_implicit_wgrad(g, c->out_c, c->dy + (size_t)begin * out_n, c->x + (size_t)begin * in_n,
                           (int)(end - begin), c->dwt + (size_t)thread * c->dw_stride, false,
                           c->scratch + (size_t)thread * c->scratch_stride);
    dw_written(c, begin, end);
    dw_reduce_slices(m);
}

/* Adds the threads' partial sums of m's last backward into its gradients, in thread order
 * (deterministic for a given thread count). The weight gradient's partial sums are
 * [16][in][out] (winograd), [tap][out][in] (implicit), O x K (out_major: the lowered bf16
 * product) or K x O (the gradient is O x K). */
static void reduce_partials(cf_module *m, bool want_dw, bool want_db, bool winograd, bool implicit,
                            bool out_major) {
    conv_impl *c = m->impl;
    cf_param *wp = &m->params[0], *bp = c->has_bias ? &m->params[1] : NULL;
    const int O = c->out_c, K = c->in_c * c->k * c->k;
    for (int t = 0; t < c->n_threads; t++) {
        if (!c->ran[t]) continue;
        if (want_dw && winograd) {
            cf_conv_winograd_wgrad_add(&c->g, O, c->wino_du + (size_t)t * c->wino_du_stride,
                                       wp->grad);
        } else if (want_dw && implicit) {
            /* after this loop, over every thread (reduce_implicit_rows) */
        } else if (want_dw && out_major) {
            const float *part = c->dwt + (size_t)t * c->dw_stride;
            for (size_t i = 0; i < (size_t)O * K; i++) wp->grad[i] += part[i];
        } else if (want_dw) {
            const float *part = c->dwt + (size_t)t * c->dw_stride;
            for (int o = 0; o < O; o++) {
                float *gr = wp->grad + (size_t)o * K;
                for (int kk = 0; kk < K; kk++) gr[kk] += part[(size_t)kk * O + o];
            }
        }
        if (want_db && bp) {
            const float *part = c->db + (size_t)t * c->db_stride;
            for (size_t i = 0; i < bp->numel; i++) bp->grad[i] += part[i];
        }
    }
    if (want_dw && implicit && !winograd) reduce_implicit_rows(m, 0, O);
}

/* Adds the weight gradient of the shortcut whose partial sums c's backward wrote (the threads
 * that ran mark them) into its gradient and gives its partial sums back. */
static void finish_shortcut_dw(conv_impl *c, bool reduced) {
    if (!c->shortcut_dw) return;
    conv_impl *s = c->shortcut_dw->impl;
    if (!reduced) reduce_partials(c->shortcut_dw, true, false, false, true, false);
    cf_arena_give(s->arena, s->held, NULL);
    s->held = NULL;
    c->shortcut_dw = NULL;
}

/* Whether this backward reads dy as the bf16 words a linked BatchNorm wrote for it (sets
 * c->dyw_call). Words written for this dy (c->dyw_for) that this call cannot read (its
 * conditions are cf_nn_conv_dy_words', which the BatchNorm asked just before) would leave it
 * reading an fp32 dy that nobody wrote: the pass fails instead (false). */
static bool dy_words_call(cf_module *m, const cf_tensor *dy, bool bf16_implicit) {
    conv_impl *c = m->impl;
    const bool armed = c->dyw_for && c->dyw_for == dy->data;
    c->dyw_for = NULL;
    c->dyw_call = armed && bf16_implicit && c->want_dw && !c->add_dx && !c->want_db &&
                  cf_conv_bf16_takes_dy_words(&c->g, c->out_c);
    c->dyw_used = c->dyw_call;
    if (armed && !c->dyw_call) {
        char r[128];
        cf_module_fail(CF_ERR_STATE,
                       "%s backward: its output gradient was left as bf16 words by the "
                       "BatchNorm after it, but this call cannot read them (internal error)",
                       conv_repr(c, r, sizeof r));
        return false;
    }
    return true;
}

/* Whether this backward takes dy image by image from the BatchNorm's fill (sets c->dyf_call):
 * the direct weight gradient alone (no dx, no bias gradient, conv_backward_range's direct
 * branch). A fill armed for this dy that this call cannot take writes the whole dy first, every
 * image as the BatchNorm would have: never a dy that nobody wrote. */
static void dy_fill_call(cf_module *m, const cf_tensor *dy, bool need_dx, bool other_path) {
    conv_impl *c = m->impl;
    const bool armed = c->dyf_for && c->dyf_for == dy->data;
    c->dyf_for = NULL;
    c->dyf_call = armed && !need_dx && c->want_dw && !c->want_db && !other_path &&
                  !use_implicit_dw(c) && use_stem_direct_dw(c);
    c->dyf_used = c->dyf_call;
    if (armed && !c->dyf_call) {
        const int64_t n = dy->shape.dim[0];
        const size_t per = (size_t)c->out_c * c->g.oh * c->g.ow;
        for (int64_t i = 0; i < n; i++) c->dyf_fn(c->dyf_ctx, i, dy->data + (size_t)i * per);
    }
}

/* The backward pass. add_into: add the input gradient into it when that is exact (a 1x1 layer
 * with stride above 1: each input value receives at most one term) and return a tensor over it.
 * hand_dw: the weight gradient was handed to a sibling (cf_nn_conv_shortcut_backward). A
 * sibling's shortcut (c->shortcut_dx, c->shortcut_dw) is the caller's to set. */
/* A shortcut computed by its sibling from the words a BatchNorm wrote (x itself unwritten) whose
 * weight gradient it sums itself (the sibling did not take it over: the block's backward without
 * dx, or no partial sums lent): x made fp32 again from the sibling's kept words, in x's own
 * buffer (the BatchNorm's output, which nothing reads in fp32 when linked), exactly the values
 * the words hold, which the weight gradient rounds to the same words. */
static void words_restore(conv_impl *c) {
    const conv_impl *src = c->words_src;
    c->words_src = NULL;
    if (!src || !c->want_dw || !src->from_words || src->x != c->x) return;
    cf_bf16_to_fp32(src->bf16_x, (float *)c->x, (size_t)c->batch * c->g.c * c->g.h * c->g.w);
    atomic_fetch_add_explicit(&words_restored, 1, memory_order_relaxed);
}

unsigned long cf__nn_words_restored(void) {
    return atomic_load(&words_restored);
}

void cf__nn_set_shortcut_dw_lend(bool on) {
    atomic_store(&shortcut_dw_lend_off, !on);
}

static const cf_tensor *conv_backward_call(cf_module *m, const cf_tensor *dy, bool need_dx,
                                           float *add_into, bool hand_dw) {
    conv_impl *c = m->impl;
    const int64_t N = dy->shape.dim[0];
    cf_param *wp = &m->params[0], *bp = c->has_bias ? &m->params[1] : NULL;
    c->dx_by_sibling = false;
    c->dw_by_sibling = hand_dw;
    c->dy = dy->data;
    c->need_dx = need_dx;
    c->want_dw = wp->trainable && !hand_dw;
    c->want_db = bp && bp->trainable;
    cf_tensor *dx = NULL;
    const bool winograd = use_winograd(c), implicit = !winograd && use_implicit(c);
    c->winograd_call = winograd;
    c->winograd_bf16 = winograd && use_bf16(c);
    c->add_dx = need_dx && add_into && c->k == 1 && c->stride > 1; /* never implicit */
    if (c->add_dx) {
        c->dx_sum = (cf_tensor){.data = add_into, .shape = m->in->shape};
        dx = &c->dx_sum;
        c->dx = dx->data;
    } else if (need_dx) {
        dx = cf_module_input_grad(m);
        c->dx = dx->data;
    }
    if (!need_dx && !c->want_dw && !c->want_db) {
        c->dyw_for = NULL;
        c->dyw_used = false;
        c->dyf_for = NULL; /* nothing reads dy */
        c->dyf_used = false;
        c->shortcut_words = NULL;
        c->shortcut_dx.out_channels = 0;
        finish_shortcut_dw(c, false);
        conv_report(c, "backward"); /* a repack for a sibling (cf_nn_conv_shortcut_backward) */
        return NULL;
    }
    words_restore(c);
    float *mem = call_begin(c, true);
    /* Each thread that gets a chunk of the batch sets its flag and starts its partial sums from
     * its first image; threads without a chunk keep their flag clear. */
    memset(c->ran, 0, (size_t)c->n_threads);
    const bool bf16_implicit = use_bf16_implicit(c);
    /* after a forward from a BatchNorm's words (x itself unwritten), only the bf16 pass that
     * copies them may take the weight gradient: the table or the precision changed since */
    if (c->from_words && c->want_dw && !(bf16_implicit && need_dx && !c->add_dx)) {
        cf_module_fail(CF_ERR_STATE, "Conv2d backward: the forward read its input as bf16 words, "
                                     "which this backward (its level or precision changed since) "
                                     "cannot read");
        /* the pass fails; the weight gradient is left as it was rather than summed from the
         * unwritten x (dx, from the weights and dy, is still made for the layers before) */
        c->want_dw = false;
    }
    /* a shortcut's dy handed as words is read by the combined bf16 call alone */
    const bool sc_words_ok = !c->shortcut_words || (bf16_implicit && c->want_dw && need_dx &&
                                                    !c->add_dx && c->shortcut_dw);
    if (!sc_words_ok) {
        char r[128];
        cf_module_fail(CF_ERR_STATE,
                       "%s backward: its shortcut's output gradient was handed as bf16 words, but "
                       "this call cannot read them (internal error)",
                       conv_repr(c, r, sizeof r));
    }
    dy_fill_call(m, dy, need_dx, winograd || implicit || bf16_implicit);
    if (!dy_words_call(m, dy, bf16_implicit) || !sc_words_ok) { /* dy unwritten: nothing to do */
        call_end(c, mem);
        conv_report(c, "backward");
        c->shortcut_dx.out_channels = 0;
        c->shortcut_words = NULL;
        finish_shortcut_dw(c, false);
        return dx;
    }
    /* the implicit layouts' weight gradient is reduced by the job itself (reduce_in_job); the
     * two-pass implicit_dw path's second job only */
    const bool dw_implicit = c->want_dw && !winograd && (bf16_implicit || implicit);
    const bool dw_second_pass = c->want_dw && !dw_implicit && !winograd && use_implicit_dw(c);
    c->reduce_in_job = false;
    if (dw_implicit || dw_second_pass) {
        const int per = 4 * c->n_threads;
        c->dw_slices = c->out_c < per ? c->out_c : per;
        c->sc_slices = 0;
        if (c->shortcut_dw) {
            const int so = ((conv_impl *)c->shortcut_dw->impl)->out_c;
            c->sc_slices = so < per ? so : per;
        }
        atomic_store(&c->dw_images, 0);
        atomic_store(&c->dw_next_slice, 0);
        c->reduce_in_job = dw_implicit; /* the two-pass path sets it before its second job */
    }
    if (bf16_implicit) {
        bf16_pack_for_level(c, wp->data);
        c->batch = N;
        run_batch(c, N, conv_backward_bf16_range, m);
    } else if (winograd || implicit) {
        if (need_dx && c->winograd_bf16)
            cf_conv_winograd_pack_dx_bf16(&c->g, c->out_c, wp->data, c->wino_u_dx);
        else if (need_dx && winograd)
            cf_conv_winograd_pack_dx(&c->g, c->out_c, wp->data, c->wino_u_dx);
        if (need_dx && implicit) cf_conv_implicit_pack_dx(&c->g, c->out_c, wp->data, c->wpack_dx);
        c->batch = N;
        run_batch(c, N, conv_backward_in_place_range, m);
    } else if (c->want_dw && use_implicit_dw(c)) {
        /* dx (no bias) over the groups, then the weight gradient image by image: the flags
         * are those of the second pass, whose partial sums they mark */
        const bool want_dw = c->want_dw;
        c->want_dw = false;
        if (need_dx) run_groups(c, N, conv_backward_range, m);
        c->want_dw = want_dw;
        memset(c->ran, 0, (size_t)c->n_threads);
        c->batch = N;
        c->reduce_in_job = true;
        run_batch(c, N, conv_wgrad_range, m);
    } else {
        run_groups(c, N, conv_backward_range, m);
    }
    const bool reduced = c->reduce_in_job;
    c->reduce_in_job = false;
    reduce_partials(m, c->want_dw && !reduced, c->want_db, winograd,
                    implicit || use_implicit_dw(c) || bf16_implicit,
                    use_bf16(c) && !bf16_dw_dots(c));
    finish_shortcut_dw(c, reduced);
    call_end(c, mem);
    conv_report(c, "backward");
    c->shortcut_dx.out_channels = 0;
    c->shortcut_words = NULL;
    return dx;
}

static const cf_tensor *conv_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    return conv_backward_call(m, dy, need_dx, NULL, false);
}

const cf_tensor *cf_nn_conv_backward_add(cf_module *conv, const cf_tensor *dy, float *target) {
    return conv_backward_call(conv, dy, true, target, false);
}

bool cf_nn_conv_pair_backward_fits(const cf_module *conv, const cf_module *shortcut) {
    const conv_impl *c = conv->impl;
    /* the conditions of conv's backward taking the implicit path with dx, and of the forward
     * pair; both inputs the same */
    return conv->in &&
           ((shortcut_fits(c, shortcut, conv->in) && !use_winograd(c)) ||
            shortcut_fits_bf16(c, shortcut, conv->in)) &&
           ((const conv_impl *)shortcut->impl)->x == c->x;
}

/* dy's n values made fp32 again from the bf16 words at its start, in place (from the last:
 * value i's bytes hold words 2i and 2i + 1, already read): exactly the values the words hold,
 * which a reader that rounds them to bf16 again turns into the same words. */
static void words_to_fp32(const cf_tensor *dy) {
    const uint16_t *w = (const uint16_t *)dy->data;
    for (size_t i = cf_tensor_numel(dy); i-- > 0;) {
        const uint32_t bits = (uint32_t)w[i] << 16;
        memcpy(&dy->data[i], &bits, sizeof bits);
    }
}

void cf_nn_conv_shortcut_backward(cf_module *shortcut, const cf_tensor *dy, const cf_module *conv,
                                  cf_nn_conv_handover *h) {
    conv_impl *c = shortcut->impl;
    const conv_impl *sib = conv->impl;
    /* dy as the words its BatchNorm wrote (cf_nn_conv_dy_words), for the sibling */
    const bool words = c->dyw_for && c->dyw_for == dy->data;
    cf_param *wp = &shortcut->params[0];
    /* in bf16 (both through cf_conv_bf16_*), the sibling reads this layer's pack */
    const bool bf16 = use_bf16_implicit(c) && use_bf16_implicit(sib);
    if (bf16) bf16_pack_for_level(c, wp->data);
    *h = (cf_nn_conv_handover){
        .sc = {.out_channels = c->out_c, .w = bf16 ? c->bf16_packed : wp->data, .dy = dy->data}};
    /* the weight gradient too, when both go through the implicit kernel: the sibling writes this
     * layer's partial sums, in buffers held until it reduces them */
    bool hand_dw = false;
    if (!atomic_load(&shortcut_dw_lend_off) && wp->trainable && (use_implicit_dw(c) || bf16) &&
        conv->params[0].trainable && sib->pad < sib->k) {
        c->held = cf_arena_take(c->arena, (size_t)c->n_threads * c->dw_stride * sizeof(float), c);
        hand_dw = c->held != NULL;
    }
    if (hand_dw) {
        c->dwt = c->held;
        memset(c->ran, 0, (size_t)c->n_threads);
        h->dw = shortcut;
    }
    conv_backward_call(shortcut, dy, false, NULL, hand_dw);
    c->dx_by_sibling = true;
    /* handed with the weight gradient, the sibling makes the rows from the words; else this
     * layer's own weight gradient read them (dy_words_call) and the sibling's dx reads dy in
     * fp32: the words' values, exact (a fallback: the weight gradient is handed wherever the
     * transient pool lends its partial sums and the sibling's weights learn) */
    if (words && hand_dw)
        h->sc_words = (const uint16_t *)dy->data;
    else if (words)
        words_to_fp32(dy);
    c->dyw_used = words;
}

const cf_tensor *cf_nn_conv_backward_with_shortcut(cf_module *conv, const cf_tensor *dy,
                                                   const cf_nn_conv_handover *h) {
    conv_impl *c = conv->impl;
    c->shortcut_dx = h->sc;
    c->shortcut_dw = h->dw;
    c->shortcut_words = h->sc_words;
    return conv_backward_call(conv, dy, true, NULL, false);
}

static const cf_module_ops conv_ops;

bool cf_nn_is_conv(const cf_module *m) {
    return m && m->ops == &conv_ops;
}

bool cf_nn_conv_computed_by_sibling(const cf_module *conv) {
    return cf_nn_is_conv(conv) && ((const conv_impl *)conv->impl)->by_sibling;
}

bool cf_nn_conv_dx_by_sibling(const cf_module *conv) {
    return cf_nn_is_conv(conv) && ((const conv_impl *)conv->impl)->dx_by_sibling;
}

bool cf_nn_conv_dw_by_sibling(const cf_module *conv) {
    return cf_nn_is_conv(conv) && ((const conv_impl *)conv->impl)->dw_by_sibling;
}

void cf_nn_conv_link_dy_words(cf_module *conv, bool linked) {
    ((conv_impl *)conv->impl)->dyw_linked = linked;
}

void cf_nn_conv_veto_dy_words(cf_module *conv, bool veto) {
    ((conv_impl *)conv->impl)->dyw_veto = veto;
}

void cf_nn_conv_dy_words_sibling(cf_module *conv, cf_module *sibling) {
    ((conv_impl *)conv->impl)->dyw_sibling = sibling;
}

bool cf_nn_conv_dy_words_vetoed(const cf_module *conv) {
    return ((const conv_impl *)conv->impl)->dyw_veto;
}

void cf__nn_set_dy_words_link(bool on) {
    atomic_store(&dy_words_link_off, !on);
}

uint16_t *cf_nn_conv_dy_words(cf_module *conv, const cf_tensor *dy, bool want) {
    if (!cf_nn_is_conv(conv)) return NULL; /* wrapped since the plan: never linked */
    conv_impl *c = conv->impl;
    c->dyw_for = NULL;
    if (atomic_load(&dy_words_link_off)) return NULL;
    /* what conv_backward_call will check (dy_words_call), as far as it is known here: the
     * backward goes through cf_conv_bf16_* at this level with the weight gradient and no bias
     * gradient, the layer takes dy as words, dy has its output's shape */
    if (!want || !dy || !c->dyw_linked || c->dyw_veto || !conv->training ||
        !conv->params[0].trainable || c->has_bias || !use_bf16_implicit(c) ||
        !cf_conv_bf16_takes_dy_words(&c->g, c->out_c) || dy->shape.ndim != 4 ||
        dy->shape.dim[1] != c->out_c || dy->shape.dim[2] != c->g.oh || dy->shape.dim[3] != c->g.ow)
        return NULL;
    /* a paired shortcut: only where its block pairs the two (cf_nn_conv_pair_backward_fits, as
     * the block asks before the idpath's backward; else the block adds this layer's dx into the
     * convpath's, reading dy in fp32). The sibling then reads the words through its stride-2
     * rows; a block whose input gradient was not asked calls this layer's own backward (the
     * words path without dx) */
    cf_module *sib = c->dyw_sibling;
    if (sib) {
        if (!cf_nn_is_conv(sib) || !sib->training || !cf_nn_conv_pair_backward_fits(sib, conv))
            return NULL;
        const conv_impl *s = sib->impl;
        if (!use_bf16_implicit(s) || !cf_conv_bf16_takes_dy_words(&s->g, s->out_c)) return NULL;
    }
    c->dyw_for = dy->data;
    return (uint16_t *)dy->data; /* the words in dy's own buffer (half its bytes) */
}

void cf__nn_set_stem_dx_link(bool on) {
    atomic_store(&stem_dx_link_off, !on);
}

bool cf_nn_conv_dy_fill(cf_module *conv, const cf_tensor *dy, bool want, cf_nn_dy_fill_fn fn,
                        void *ctx) {
    if (!cf_nn_is_conv(conv)) return false; /* wrapped since the plan: never linked */
    conv_impl *c = conv->impl;
    c->dyf_for = NULL;
    /* what dy_fill_call will check, as far as it is known here: the direct weight gradient
     * (W1's stem), its weights learning, no bias, dy of its output's shape, the call's need_dx
     * (known there: a layer whose input is the data needs none) */
    if (!want || !fn || !dy || atomic_load(&stem_dx_link_off) || !conv->training ||
        !conv->params[0].trainable || c->has_bias || !use_stem_direct_dw(c) ||
        dy->shape.ndim != 4 || dy->shape.dim[1] != c->out_c || dy->shape.dim[2] != c->g.oh ||
        dy->shape.dim[3] != c->g.ow)
        return false;
    c->dyf_for = dy->data;
    c->dyf_fn = fn;
    c->dyf_ctx = ctx;
    return true;
}

bool cf_nn_conv_filled_dy(const cf_module *conv) {
    return cf_nn_is_conv(conv) && ((const conv_impl *)conv->impl)->dyf_used;
}

bool cf_nn_conv_read_dy_words(const cf_module *conv) {
    return cf_nn_is_conv(conv) && ((const conv_impl *)conv->impl)->dyw_used;
}

static const cf_module_ops conv_ops = {
    .kind = "Conv2d",
    .out_shape = conv_out_shape,
    .plan = conv_plan,
    .init = conv_init,
    .forward = conv_forward,
    .backward = conv_backward,
};

cf_module *cf_conv2d(int in_channels, int out_channels, int kernel, int stride, int padding,
                     bool bias) {
    if (in_channels < 1 || out_channels < 1 || kernel < 1 || stride < 1 || padding < 0) {
        cf_fail(CF_ERR_INVALID,
                "cf_conv2d: invalid arguments in_channels=%d out_channels=%d kernel=%d "
                "stride=%d padding=%d (need channels, kernel and stride >= 1, padding >= 0)",
                in_channels, out_channels, kernel, stride, padding);
        return NULL;
    }
    conv_impl *c = cf_calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = (conv_impl){.in_c = in_channels,
                     .out_c = out_channels,
                     .k = kernel,
                     .stride = stride,
                     .pad = padding,
                     .has_bias = bias,
                     .direct = kernel == 1 && stride == 1 && padding == 0};
    cf_module *m = cf_module_new(&conv_ops, c);
    if (!m) return NULL;
    cf_module_add_param(m, "weight", CF_PARAM_WEIGHT,
                        cf_shape4(out_channels, in_channels, kernel, kernel));
    if (bias) cf_module_add_param(m, "bias", CF_PARAM_BIAS, cf_shape1(out_channels));
    return m;
}

static atomic_uint bf16_generation;

unsigned cf__conv_bf16_generation(void) {
    return atomic_load(&bf16_generation);
}

int cf_conv_set_bf16(cf_module *root, bool on) {
    if (!root) return 0;
    atomic_fetch_add(&bf16_generation, 1);
    int count = 0;
    if (cf_nn_is_conv(root)) {
        ((conv_impl *)root->impl)->bf16 = on;
        count++;
    }
    for (int i = 0; i < root->n_children; i++) count += cf_conv_set_bf16(root->children[i], on);
    return count;
}
