/* Internal to src/nn: the layer fusions a model plans, and the zoo's own layers.
 *
 * Fusion is decided once, when a model is planned (cf_nn_fuse, fuse.c): BatchNorm + ReLU pairs
 * in a Sequential are linked, and each residual block is told which fused calls it makes
 * (cf_nn_res_fusion). The block then calls them explicitly: a strided convpath convolution that
 * computes the idpath's strided 1x1 shortcut from its phase split (forward, and its input and
 * weight gradients backward), a shortcut that adds its input gradient into the convpath's, and
 * an idpath BatchNorm that writes relu(convpath(x) + bn(.)) as the block's output (in a block
 * without idpath, the convpath's last BatchNorm writes relu(x + bn(.))). Every fused
 * call is bitwise what the unfused layers compute; a module whose ops are not the layer's own (a
 * wrapper's: timers, hooks) when the model is planned is never fused. */
#ifndef COREFIT_NN_INTERNAL_H
#define COREFIT_NN_INTERNAL_H

#include "corefit/nn.h"
#include "corefit/tensor.h"

/* Layers of fastai's models that PyTorch has no constructor for (the model zoo's). */
/* Counts cf_conv_set_bf16 calls (conv.c): a model planned before a switch plans again, so
 * that only layers in bf16 keep the bf16 convolution's packed weights. */
unsigned cf__conv_bf16_generation(void);

/* AvgPool2d(kernel, stride, padding, ceil_mode=True, count_include_pad=True) (pool.c). */
cf_module *cf_nn_avgpool2d_ceil(int kernel, int stride, int padding);
/* fastai's SigmoidRange(lo, hi): lo + (hi - lo) * sigmoid(x) (activation.c). */
cf_module *cf_nn_sigmoid_range(float lo, float hi);

/* True when m's ops are BatchNorm1d's or BatchNorm2d's (not a wrapper's). */
bool cf_nn_is_batchnorm(const cf_module *m);
/* True when m's ops are ReLU's (not a wrapper's). */
bool cf_nn_is_relu(const cf_module *m);
/* True when m's ops are Conv2d's (not a wrapper's). */
bool cf_nn_is_conv(const cf_module *m);
/* True when m's ops are Sequential's, or a residual block's (not a wrapper's). */
bool cf_nn_is_sequential(const cf_module *m);
bool cf_nn_is_residual(const cf_module *m);

/* ---- planning (fuse.c) ---- */

/* Decides every fusion of the tree under root, before it is planned (cf_model's plan): links
 * each BatchNorm child of a Sequential to a ReLU child right after it, and gives each residual
 * block the fused calls it makes (cf_nn_res_fusion). Links from an earlier plan are dropped
 * first; enabled false (cf_model.unfused) plans none. */
void cf_nn_fuse(cf_module *root, bool enabled);

/* A residual block's fused calls; the modules are the block's own (not owned). */
typedef struct cf_nn_res_fusion {
    cf_module *fold;     /* the idpath's last BatchNorm, which writes relu(a + bn(.)) */
    cf_module *fold_a;   /* in a block without idpath, the convpath's last BatchNorm, which
                            writes relu(x + bn(.)) (x: the block's input) */
    cf_module *pair_a;   /* the convpath's first Conv2d, which may compute ... */
    cf_module *pair_b;   /* ... the idpath's first Conv2d (a strided 1x1 shortcut) */
    cf_module *add_into; /* the idpath's first Conv2d, which may add its input gradient into the
                            convpath's */
    /* whether each path was a Sequential when planned: the fused calls run its children as its
     * steps (a wrapper installed since, a timer, still sees each child's call) */
    bool convpath_seq, idpath_seq;
} cf_nn_res_fusion;
void cf_nn_residual_set_fusion(cf_module *block, const cf_nn_res_fusion *f);
/* Whether a residual block applies ReLU after the sum. */
bool cf_nn_residual_relu_after(const cf_module *block);

/* A model's pass (module.c): begin forgets the errors of an earlier pass on this thread; end
 * returns the first cf_module_fail of the pass (CF_OK when none), with its message. */
void cf__nn_pass_begin(void);
cf_status cf__nn_pass_end(void);

/* For tests (conv.c): fn (NULL: none) sees the status of every cf_conv_bf16_* call a Conv2d
 * makes (call: the function's name) and returns the one the layer acts on, so that a test can
 * make one fail as a future kernel might. Set only while no pass runs. */
void cf__conv_bf16_set_fault(cf_status (*fn)(cf_status status, const char *call));
/* The bf16 convolution's packed weights a Conv2d's plan reserved (NULL: none). */
const float *cf__conv_bf16_packed(const cf_module *conv);

/* cf_module's out_shape and plan (the default plan when a layer has none) (module.c). */
cf_status cf_nn_module_out_shape(cf_module *m, const cf_shape *in, cf_shape *out);
void cf_nn_module_plan(cf_module *m, const cf_shape *in, cf_arena *arena);

/* ---- Sequential's passes over part of its children (sequential.c) ---- */

/* Children [lo, hi) forward from x, as Sequential's forward runs them (seq->in is the caller's
 * to set). */
const cf_tensor *cf_nn_seq_forward_range(cf_module *seq, const cf_tensor *x, int lo, int hi);
/* Children [lo, hi) backward from dy (children hi-1 .. lo), as Sequential's backward runs them:
 * each gradient a child returned is given back once the child before has read it; the last one
 * (child lo's, asked only when need_dx) is returned, not given back. */
const cf_tensor *cf_nn_seq_backward_range(cf_module *seq, const cf_tensor *dy, int lo, int hi,
                                          bool need_dx);

/* ---- the fused calls ---- */

/* BatchNorm + ReLU: a BatchNorm linked to the ReLU after it writes max(bn(x), 0) and masks the
 * upstream gradient itself, and the ReLU passes its input and the upstream gradient through. The
 * ReLU passes through only while the link is mutual (the BatchNorm points at it and it points at
 * the BatchNorm), so a re-plan that can no longer see one of the two (a wrapper replaced its
 * ops) falls back to ReLU's own pass; a BatchNorm that stays fused in front of a ReLU of its own
 * is still exact (ReLU is idempotent, and its mask is the BatchNorm's). Bitwise identical to the
 * unfused layers. */
/* Links a BatchNorm to the ReLU that follows it (NULL: unlinks). bn must pass
 * cf_nn_is_batchnorm. */
void cf_nn_bn_fuse_relu(cf_module *bn, const cf_module *relu);
/* True when bn, a module that was a BatchNorm when it was linked (its ops may have been wrapped
 * since), is linked to relu. */
bool cf_nn_bn_fused_with(const cf_module *bn, const cf_module *relu);
/* Links a ReLU to the BatchNorm before it (NULL: unlinks). relu must pass cf_nn_is_relu. */
void cf_nn_relu_follow_bn(cf_module *relu, const cf_module *bn);

/* Residual add + ReLU: bn's forward (a BatchNorm not linked to a ReLU) writing max(add + bn(x),
 * 0), add of the output's shape: bitwise a residual block's relu(a + b). The backward is bn's
 * plain one (the block masks the gradient). */
const cf_tensor *cf_nn_bn_forward_add_relu(cf_module *bn, const cf_tensor *x, const float *add);

/* Residual shortcut, forward: conv's forward (a stride-2 Conv2d on the implicit path), which
 * also computes the output of shortcut (a 1x1 stride-2 Conv2d without padding or bias on the
 * same input) from its own phase split (cf_conv_implicit_forward_with), bitwise what shortcut
 * computes alone, and leaves shortcut as its own forward on x would. *shortcut_y: shortcut's
 * output, or NULL when the pair does not qualify (then run shortcut's forward). */
const cf_tensor *cf_nn_conv_forward_pair(cf_module *conv, cf_module *shortcut, const cf_tensor *x,
                                         const cf_tensor **shortcut_y);
/* True when conv's last forward returned the output its stride-2 sibling computed (tests). */
bool cf_nn_conv_computed_by_sibling(const cf_module *conv);

/* Residual shortcut, backward. When the pair qualifies (conv's last forward and its backward
 * on the implicit path, both layers' last forwards on the same input:
 * cf_nn_conv_pair_backward_fits), cf_nn_conv_shortcut_backward runs shortcut's backward without
 * its input gradient, handing its output gradient (and, when both weights are trainable, its
 * weight gradient) over in *h, and cf_nn_conv_backward_with_shortcut then runs conv's backward
 * with dx, adding the shortcut's input gradient into its own (cf_conv_implicit_dx_with) and
 * computing the shortcut's weight gradient from its own transposed blocks of the input
 * (cf_conv_implicit_wgrad_with): bitwise the sum a residual block forms and what the shortcut
 * computes alone (a 1x1 stride-2 layer takes its weight gradient through the implicit kernel
 * wherever that runs). The shortcut's output gradient must stay alive until conv's backward. */
typedef struct cf_nn_conv_handover {
    cf_conv_shortcut sc;      /* the shortcut's weights and output gradient */
    cf_module *dw;            /* the shortcut, when conv computes its weight gradient; else NULL */
    const uint16_t *sc_words; /* the output gradient as the bf16 words its BatchNorm wrote (with
                                 dw only; NULL: sc.dy in fp32) */
} cf_nn_conv_handover;
bool cf_nn_conv_pair_backward_fits(const cf_module *conv, const cf_module *shortcut);
void cf_nn_conv_shortcut_backward(cf_module *shortcut, const cf_tensor *dy, const cf_module *conv,
                                  cf_nn_conv_handover *h);
const cf_tensor *cf_nn_conv_backward_with_shortcut(cf_module *conv, const cf_tensor *dy,
                                                   const cf_nn_conv_handover *h);
/* True when conv's last backward left its input gradient (its weight gradient) to its sibling
 * (tests). */
bool cf_nn_conv_dx_by_sibling(const cf_module *conv);
bool cf_nn_conv_dw_by_sibling(const cf_module *conv);

/* Residual input gradient: conv's backward with dx (a Conv2d, ops its own) adding its input
 * gradient into target (the input's shape) and returning a tensor over target when that is exact
 * (a 1x1 layer with stride above 1: each input value receives at most one term, so target + term
 * is bitwise the sum a residual block forms); otherwise its own gradient as usual. */
const cf_tensor *cf_nn_conv_backward_add(cf_module *conv, const cf_tensor *dy, float *target);

/* Conv2d -> BatchNorm2d, backward: the BatchNorm's input gradient as the bf16 words the
 * convolution reads. A BatchNorm right after a Conv2d in a Sequential (both layers' own ops when
 * planned) is linked to it (cf_nn_bn_link_conv, cf_nn_conv_link_dy_words); the first conv of a
 * residual block's idpath is linked only when paired with the convpath's (its words then go to
 * that sibling), never when its dx is added into the convpath's alone (cf_nn_conv_veto_dy_words:
 * that call reads its dy in fp32). At each backward the BatchNorm (a training forward, the
 * planes path) asks cf_nn_conv_dy_words, which holds only where the convolution's next backward
 * reads dy only as bf16 words (cf_conv_bf16_backward_words: bf16 at this level, the weight
 * gradient, no bias, a layer that takes dy words, the batch within the plan's); the BatchNorm
 * then writes bf16(dx) there (cf_bn_planes_dx_bf16) and leaves its fp32 dx unwritten, and the
 * convolution's backward on that dx reads the words. Bitwise what the unlinked layers compute:
 * the convolution rounded the same fp32 dx with the same rounding. */
void cf_nn_bn_link_conv(cf_module *bn, cf_module *conv);
void cf_nn_conv_link_dy_words(cf_module *conv, bool linked);
void cf_nn_conv_veto_dy_words(cf_module *conv, bool veto);
/* The first conv of a residual idpath paired with the convpath's first (sibling; NULL: none):
 * its dy words are linked where the block pairs the two, and go to the sibling with the
 * handover (cf_nn_conv_handover.sc_words). */
void cf_nn_conv_dy_words_sibling(cf_module *conv, cf_module *sibling);
bool cf_nn_conv_dy_words_vetoed(const cf_module *conv);
/* Where to write dy's words (the start of dy's own buffer: the BatchNorm's dx tensor, the
 * convolution's next dy, then holds n x c x h x w bf16 words and no fp32 value), or NULL: then
 * the BatchNorm writes dy in fp32. want false (or NULL returned) disarms the convolution. */
uint16_t *cf_nn_conv_dy_words(cf_module *conv, const cf_tensor *dy, bool want);
/* Tests: whether conv's last backward read its dy as words; whether bn's last backward wrote
 * its dx as words. */
bool cf_nn_conv_read_dy_words(const cf_module *conv);
bool cf_nn_bn_wrote_dx_words(const cf_module *bn);
/* Tests: off, no BatchNorm writes words (the unlinked layers, to compare with); on by default. */
void cf__nn_set_dy_words_link(bool on);

/* Runs fn over the values [0, n_images * per_image) of a batch (per_image values an image) in the
 * chunks of cf_parallel_for(n_images, ...) scaled to values: each thread gets whole images, the
 * same ones the convolutions and BatchNorm give it (both split their batch with
 * cf_parallel_for over the images), so the layers between them read what the same thread wrote
 * and no activation crosses between cores (src/nn/split.c). With fewer images than threads, the
 * values are split as cf_parallel_for(n_images * per_image, ...) would. */
void cf_nn_parallel_images(int64_t n_images, int64_t per_image, cf_range_fn fn, void *ctx);

/* ---- the forward link: a BatchNorm writing the next convolution's bf16 input words ----
 *
 * In a Sequential, a BatchNorm (with its fused ReLU, or none) followed right away by a Conv2d is
 * linked to it when the model is planned (cf_nn_bn_feed_conv, fuse.c). At each forward the
 * BatchNorm asks the convolution (cf_nn_conv_words_target) whether that call will read its
 * input only as bf16 words: a training forward of a layer in mixed precision at a level with bf16
 * kernels, whose weights learn, on at most the planned batch, whose forward runs from the words
 * and whose weight gradient copies them (cf_conv_bf16_forward_from_kept_fits), the ops of the
 * BatchNorm, the ReLU and the convolution their layers' own (no wrapper that could read the
 * output). Then it writes bf16(y) there, round to nearest even as cf_fp32_to_bf16 (the words
 * the convolution would have rounded y to), and not y itself; the convolution's forward pairs
 * those words into its planes and its backward copies them. Results are bitwise the unlinked
 * layers'. Elsewhere (eval, a hook, fp32, a level without bf16 kernels, a layer or batch the
 * words path does not take) the BatchNorm writes y as before. The BatchNorm's own backward never
 * reads y on its planes path (it recomputes the ReLU's mask from x), which is the only path a
 * convolution's input takes (more than one value per channel and image). */
/* Links bn (a BatchNorm, after cf_nn_bn_fuse_relu) to conv (NULL: unlinks); a ReLU bn is fused
 * with must have ReLU's own ops then. */
void cf_nn_bn_feed_conv(cf_module *bn, cf_module *conv);
/* Where conv's next forward on an input of shape `in` reads its input's bf16 words from (NULL:
 * it reads x in fp32 this time); cf_nn_conv_words_written then tells it they were written for
 * the input tensor x (its data, which was not), consumed by that next forward. */
uint16_t *cf_nn_conv_words_target(cf_module *conv, const cf_shape *in);
void cf_nn_conv_words_written(cf_module *conv, const float *x);
/* Through a residual block (fuse.c): a BatchNorm whose output is the input of block, whose
 * convpath's first conv (a stride-2 bf16 layer) computes its idpath's first (shortcut, a 1x1
 * stride-2 conv) from the same phase planes, is linked to conv; conv then takes the words only
 * where the block pairs the two at that call (its ops its own), computing both outputs from the
 * words; its weight gradient and the shortcut's (taken over by conv) copy them, and a shortcut
 * that sums its own reads x made fp32 again from them (the same words). NULL: unlinked. */
void cf_nn_conv_words_pair(cf_module *conv, cf_module *shortcut, const cf_module *block);
/* Tests: whether conv's last forward read the words a BatchNorm wrote; whether bn's last forward
 * wrote words instead of its output; and the link's switch (on by default, read at each call:
 * off, every BatchNorm writes its fp32 output). */
bool cf_nn_conv_read_words(const cf_module *conv);
/* Tests: the bf16 words of x conv's last forward kept for its backward (NULL: none), *n of them. */
const uint16_t *cf__conv_bf16_kept(const cf_module *conv, size_t *n);
bool cf_nn_bn_wrote_words(const cf_module *bn);
void cf__nn_set_x_words_link(bool on);
/* Tests and benchmarks: the link through a residual block's pair alone (cf_nn_conv_words_pair;
 * on by default, read at each call; the x link off turns it off too). */
void cf__nn_set_x_pair_link(bool on);
/* From one residual block to the next (fuse.c): the fold of block (its idpath's last BatchNorm,
 * writing relu(a + bn(.)) and the mask bits, cf_nn_residual_fold) whose output is the input of
 * the next block whose pair conv computes its shortcut (cf_nn_conv_words_pair) is linked to conv
 * (NULL: unlinked). It writes that conv's words (the same rounding) and the mask bits in place of
 * its fp32 output where the call writes the mask and conv takes the words (the ops of the fold
 * and of block their own: a wrapper could read the output); the block's backward reads the mask
 * alone (a backward that cannot apply it fails with an error instead of reading the output). */
void cf_nn_bn_fold_feed_conv(cf_module *fold, cf_module *conv, const cf_module *block,
                             const cf_module *taker);
/* The fold block's forward makes (NULL: none). */
cf_module *cf_nn_residual_fold(const cf_module *block);
/* Whether block's backward can take the forward's mask bits in place of its output: a ReLU after
 * the sum, an idpath, each path's last module a distinct BatchNorm with its own ops. fuse.c links
 * a fold only then (taker: the convpath's last BatchNorm, whose ops the fold checks again at each
 * forward): a convpath ending in a Conv, a ReLU, a Dropout or a wrapped BatchNorm needs the
 * output. A wrapper installed between a forward and its backward still reaches the backward's
 * error above, which then runs to the pass's end from a zero gradient. */
bool cf_nn_residual_masks_itself(const cf_module *block);
/* Tests and benchmarks: the fold's link alone (on by default, read at each call; the x link and
 * the pair link off turn it off too). */
void cf__nn_set_fold_words_link(bool on);
/* Tests: how many times a shortcut summing its own weight gradient made its input fp32 again from
 * its sibling's kept words (words_restore in conv.c) since the start; and the switch that makes
 * every shortcut sum its own (on by default: off, cf_nn_conv_shortcut_backward lends no partial
 * sums to the sibling, as when the transient pool has none). */
unsigned long cf__nn_words_restored(void);
void cf__nn_set_shortcut_dw_lend(bool on);

/* ---- the statistics link: a convolution taking the next BatchNorm's per-image sums ---------
 *
 * In a Sequential, a Conv2d followed right away by a BatchNorm is linked to it when the model is
 * planned (cf_nn_conv_stats_bn and cf_nn_bn_stats_from, fuse.c). A training forward of the
 * convolution that goes through cf_conv_bf16_forward_each (a layer in mixed precision at a level
 * with bf16 kernels) or through the fp32 direct stem (cf_conv_stem_forward, where
 * cf_conv_stem_pays), its ops its own, at most the planned batch, then computes each image's
 * shifted sums per channel in its epilogue (cf_bn_image_sums: the BatchNorm's own kernel calls,
 * with the same shift, the channel's first value of image 0) while the image's output is in
 * cache, into a block of its own. The BatchNorm's next training forward on exactly that output
 * (cf_nn_conv_stats_sums: the same tensor data and batch, the convolution's ops its own: no
 * wrapper that could change y in between) adds them per channel in image order and skips its
 * own statistics pass: bitwise the same statistics, output and running statistics for every
 * thread count. So does a residual idpath's 1x1 shortcut computed by its sibling (the pair):
 * its own link, its output's sums from the pair's epilogue. Elsewhere (eval, hooks, the lowered
 * fp32 paths, a level or layer without the bf16 path or the direct stem, synchronised
 * statistics) the BatchNorm takes its sums itself as before; one that cannot take them tells the
 * convolution not to compute them (cf_nn_conv_stats_want) from its next forward on. */
/* Links conv to bn, the BatchNorm right after it, and bn to conv (NULL: unlinks). */
void cf_nn_conv_stats_bn(cf_module *conv, cf_module *bn);
void cf_nn_bn_stats_from(cf_module *bn, cf_module *conv);
/* The sums conv's last forward took of its output y (2 C doubles an image: image n's channel c
 * at 2 C n + c, its squares' at 2 C n + C + c), once: NULL when that forward took none, y is not
 * that output, or conv is no longer a Conv2d's own ops. */
const double *cf_nn_conv_stats_sums(cf_module *conv, const cf_tensor *y);
/* Whether conv's next forwards compute the sums (the BatchNorm could take them; true at first). */
void cf_nn_conv_stats_want(cf_module *conv, bool want);
/* Tests: whether bn's last forward took the linked sums; whether conv's last forward computed
 * them (its own output's; a paired shortcut's are the shortcut's); the link's switch (on by
 * default, read at each forward: off, every BatchNorm takes its own sums). */
bool cf_nn_bn_took_stats(const cf_module *bn);
bool cf_nn_conv_wrote_stats(const cf_module *conv);
void cf__nn_set_stats_link(bool on);
/* The direct stem's switch (conv.c, cf_conv_stem_*: on by default, read at each call; off, such
 * a layer takes the lowered product): tests and bench_bf16_links compare the two. */
void cf__nn_set_stem_direct(bool on);

/* ---- the stem dx link: a BatchNorm's input gradient made image by image for the direct stem --
 *
 * A BatchNorm right after a Conv2d in a Sequential (cf_nn_bn_link_conv, fuse.c) whose backward
 * is the direct stem's weight gradient alone (W1's stem: its input is the data, so no dx; no
 * bias) does not write its dx. At each backward that its Sequential runs with the convolution next
 * in the same call (cf_nn_bn_dy_held below) the BatchNorm (a training forward of planes, its ops
 * its own, no block mask, no synchronised statistics, dx not taken as bf16 words) takes its
 * gradient sums and coefficients, then asks cf_nn_conv_dy_fill; where that holds, the convolution's
 * next backward on that dx calls fn(ctx, n, buf) for each image n on the thread that sums it, into
 * a buffer of its own that stays in cache, just before the image's weight gradient
 * (cf_conv_stem_wgrad_each), and fn writes there the values the BatchNorm's dx pass would have
 * written (cf_bn_planes_dx over that image's planes): bitwise the unlinked layers. A backward that
 * cannot take them (dx or a bias gradient asked after all, another path) has fn write the whole dx
 * first. want false (or false returned) disarms the convolution. */
typedef void (*cf_nn_dy_fill_fn)(void *ctx, int64_t image, float *dy);
bool cf_nn_conv_dy_fill(cf_module *conv, const cf_tensor *dy, bool want, cf_nn_dy_fill_fn fn,
                        void *ctx);
/* The link's lifetime promise: the BatchNorm's upstream gradient must outlive the convolution's
 * backward, which reads it through fn. Only cf_nn_seq_backward_range keeps that promise (it
 * holds the gradient until the child before the BatchNorm, run next in the same call, has
 * returned), and says so before each child's backward: prev is the child it runs next, NULL
 * when the range ends there (the caller may give the gradient back at once: a residual path's
 * single-child ranges, the first child of a U-Net encoder's span between skip joins). A
 * BatchNorm leaves its dx
 * only when prev is its linked convolution; the promise lasts one backward. A no-op on other
 * modules. */
void cf_nn_bn_dy_held(cf_module *bn, const cf_module *prev);
/* Tests: whether conv's last backward took its dy from the fill; whether bn's last backward left
 * its dx to it; the link's switch (on by default, read at each backward: off, the BatchNorm
 * writes its dx). */
bool cf_nn_conv_filled_dy(const cf_module *conv);
bool cf_nn_bn_left_dx(const cf_module *bn);
void cf__nn_set_stem_dx_link(bool on);

/* ---- the residual fold computing the convpath's last BatchNorm's output ----
 *
 * In a block whose idpath's last BatchNorm writes relu(a + bn(.)) (the fold), a is the
 * convpath's output; where the convpath ends in a BatchNorm, that layer's output is read by the
 * fold only. The block links the two when the model is planned (cf_nn_bn_fold_addend, fuse.c)
 * and arms the link at each forward before its convpath runs (cf_nn_bn_fold_arm); that
 * BatchNorm's next forward then takes its statistics, scale and shift and writes no output
 * (planes not streamed, no ReLU, both layers' ops their own), and the fold computes a from that
 * layer's input, scale and shift as it writes its own output (cf_bn_planes_affine_add2: bitwise
 * the two passes). A fold given some other add writes the deferred output first. The deferring
 * layer's backward never reads its output (planes, no ReLU). */
/* Links fold (a BatchNorm) to bn, the BatchNorm whose output is its add (NULL, or a module that
 * is not a BatchNorm: unlinks). */
void cf_nn_bn_fold_addend(cf_module *fold, cf_module *bn);
/* Arms fold's link for its addend's next forward (nothing when either is no longer a BatchNorm's
 * own ops). */
void cf_nn_bn_fold_arm(cf_module *fold);
/* Tests: whether bn's last forward left its output to the fold; the passes' switch (on by
 * default, read at each call: off, no output is deferred and the forward link's words go through
 * an fp32 buffer, as before cf_bn_planes_affine_bf16). */
bool cf_nn_bn_deferred(const cf_module *bn);
void cf__nn_set_bn_fused_passes(bool on);

/* ---- a residual block's ReLU mask as bits ----
 *
 * The fold also writes the block's mask, y > 0 as one bit a value (CF_MASK_WORDS layout,
 * tensor.h), as it writes the block's output (cf_nn_bn_forward_fold_mask: planes whose output is
 * not streamed; cf_nn_bn_wrote_mask says whether it did). In backward the block then gives its
 * gradient dy unmasked to both paths' last BatchNorms, each armed with the bits for that dy
 * (cf_nn_bn_mask_dy), whose gradient sums and dx passes take g = dy where the bit is set and +0
 * elsewhere: the masked gradient, bitwise, is never written and the block's output is not read
 * back. Only where each path's last module is a BatchNorm that takes dy straight from the block
 * (a Sequential of its own ops, or the path itself); otherwise the block masks as before. */
/* cf_nn_bn_forward_add_relu, also writing the mask where the call allows. */
const cf_tensor *cf_nn_bn_forward_fold_mask(cf_module *bn, const cf_tensor *x, const float *add,
                                            uint16_t *mask);
bool cf_nn_bn_wrote_mask(const cf_module *bn);
/* Arms bn's next backward to mask dy (the tensor data it will be given) with mask (NULL:
 * disarms). Returns whether it will (a BatchNorm's own ops, planes, no fused ReLU). */
bool cf_nn_bn_mask_dy(cf_module *bn, const uint16_t *mask, const float *dy);
/* Tests: the blocks' mask bits (on by default, read at each forward: off, the block masks its
 * gradient in a pass of its own, as before). */
void cf__nn_set_res_mask_bits(bool on);
/* Both paths' last BatchNorms of a block whose mask they were armed with (a, the convpath's, and
 * b, the idpath's, for the same dy) backward in one: their sums passes read dy and the bits once
 * for both, each channel block's dx passes following while it is in L2 (batchnorm.c). Each
 * layer's gradients, dx and dx words are bitwise those of its own backward (need_dx true).
 * False, nothing done (each then runs its own backward): switched off, more than one thread,
 * either layer not a training BatchNorm of planes armed for dy, their inputs' shapes not dy's,
 * synchronised statistics. cf_nn_bn_paired: whether bn's last backward ran in a pair (tests). */
bool cf_nn_bn_backward_pair(cf_module *a, cf_module *b, const cf_tensor *dy, const cf_tensor **dxa,
                            const cf_tensor **dxb);
bool cf_nn_bn_paired(const cf_module *bn);
/* Tests and benchmarks: the pair (on by default, read at each backward). */
void cf__nn_set_bn_pair_backward(bool on);

#endif
