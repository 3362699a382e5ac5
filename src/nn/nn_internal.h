/* Internal to src/nn: the layer fusions a Sequential plans.
 *
 * BatchNorm + ReLU: when a Sequential is planned, each child that is a BatchNorm (its ops are
 * BatchNorm's own, not a wrapper's) directly followed by a ReLU (ReLU's own ops) is linked to
 * it: the BatchNorm then writes max(bn(x), 0) and masks the upstream gradient itself, and the
 * ReLU passes its input and the upstream gradient through untouched. The ReLU passes through
 * only while the link is mutual (the BatchNorm points at it and it points at the BatchNorm), so
 * a re-plan that can no longer see one of the two (a wrapper replaced its ops) falls back to
 * ReLU's own pass; a BatchNorm that stays fused in front of a ReLU of its own is still exact
 * (ReLU is idempotent, and its mask is the BatchNorm's). Results are bitwise identical to the
 * unfused layers.
 *
 * Residual add: a residual block with ReLU after the sum whose idpath ends in a BatchNorm (ops
 * its own) has that BatchNorm write relu(convpath(x) + bn(...)) straight into its output, which
 * becomes the block's output: one pass less over the block's output. Backward, an idpath that
 * starts with a strided 1x1 convolution adds its input gradient into the convpath's
 * (cf_nn_conv_add_dx_next) instead of the block summing the two. Forward, such a shortcut beside
 * a strided convpath convolution on the implicit kernels is computed by that convolution from
 * its phase split (cf_nn_conv_shortcut_next), so the block's input is read once; backward, the
 * idpath runs first and that convolution adds the shortcut's input gradient into its phase
 * split before the merge (cf_nn_conv_shortcut_dx_next), so the block's input gradient is written
 * once. */
#ifndef COREFIT_NN_INTERNAL_H
#define COREFIT_NN_INTERNAL_H

#include "corefit/nn.h"

/* Layers of fastai's models that PyTorch has no constructor for (the model zoo's). */
/* AvgPool2d(kernel, stride, padding, ceil_mode=True, count_include_pad=True) (pool.c). */
cf_module *cf_nn_avgpool2d_ceil(int kernel, int stride, int padding);
/* fastai's SigmoidRange(lo, hi): lo + (hi - lo) * sigmoid(x) (activation.c). */
cf_module *cf_nn_sigmoid_range(float lo, float hi);

/* True when m's ops are BatchNorm1d's or BatchNorm2d's (not a wrapper's). */
bool cf_nn_is_batchnorm(const cf_module *m);
/* True when m's ops are ReLU's (not a wrapper's). */
bool cf_nn_is_relu(const cf_module *m);
/* Links a BatchNorm to the ReLU that follows it (NULL: unlinks). bn must pass
 * cf_nn_is_batchnorm. */
void cf_nn_bn_fuse_relu(cf_module *bn, const cf_module *relu);
/* True when bn, a module that was a BatchNorm when it was linked (its ops may have been wrapped
 * since), is linked to relu. */
bool cf_nn_bn_fused_with(const cf_module *bn, const cf_module *relu);
/* Links a ReLU to the BatchNorm before it (NULL: unlinks). relu must pass cf_nn_is_relu. */
void cf_nn_relu_follow_bn(cf_module *relu, const cf_module *bn);

/* Residual add + ReLU: the next forward of bn (a BatchNorm when the residual block was planned;
 * not linked to a ReLU) writes max(add + bn(x), 0), with add of the output's shape, bitwise a
 * residual block's relu(a + b). Consumed by that forward. */
void cf_nn_bn_add_relu_next(cf_module *bn, const float *add);

/* Residual input gradient: the next backward of conv (a Conv2d, ops its own) with need_dx adds
 * its input gradient into target (the input's shape) instead of writing its own, and returns a
 * tensor over target, when it can do so exactly (a 1x1 layer with stride above 1: each input
 * value receives at most one term, so target + term is bitwise the sum a residual block forms);
 * otherwise it returns its own gradient as usual. Consumed by that backward. */
bool cf_nn_is_conv(const cf_module *m);
void cf_nn_conv_add_dx_next(cf_module *conv, float *target);
/* Residual shortcut: the next forward of conv (a stride-2 Conv2d on the implicit path) also
 * computes the output of shortcut (a 1x1 stride-2 Conv2d without padding or bias on the same
 * input) from its own phase split (cf_conv_implicit_forward_with), and shortcut's next forward
 * on that input returns it without reading the input again; bitwise what shortcut computes
 * alone. Either conv ignores it when the pair does not qualify; NULL unlinks. Consumed by the
 * forwards; cf_nn_conv_shortcut_done drops what a forward did not consume. */
void cf_nn_conv_shortcut_next(cf_module *conv, cf_module *shortcut);
void cf_nn_conv_shortcut_done(cf_module *conv, cf_module *shortcut);
/* True when conv's last forward returned the output its stride-2 sibling computed (tests). */
bool cf_nn_conv_computed_by_sibling(const cf_module *conv);
/* Residual shortcut, backward: when shortcut and conv qualify as above (conv's last forward
 * and its next backward on the implicit path, both on the same input), links them and returns
 * true. shortcut's next backward with need_dx then computes its weight gradient only, hands its
 * output gradient to conv and returns that gradient (not an input gradient: the caller keeps it
 * alive until conv's backward); conv's next backward, with need_dx, adds the shortcut's input
 * gradient into its own (cf_conv_implicit_dx_with), bitwise the sum a residual block forms.
 * When both weights are trainable, conv also computes the shortcut's weight gradient from its
 * own transposed blocks of the input (cf_conv_implicit_wgrad_with), bitwise what the shortcut
 * computes alone (a 1x1 stride-2 layer takes its weight gradient through the implicit kernel
 * wherever that runs). Run shortcut's backward first. */
bool cf_nn_conv_shortcut_dx_next(cf_module *conv, cf_module *shortcut);
/* True when conv's last backward left its input gradient (its weight gradient) to its sibling
 * (tests). */
bool cf_nn_conv_dx_by_sibling(const cf_module *conv);
bool cf_nn_conv_dw_by_sibling(const cf_module *conv);

/* Whether Sequential plans BatchNorm + ReLU fusion (default true). Takes effect the next time a
 * model is planned; for tests that compare the fused and unfused paths. Not thread-safe. */
void cf_nn_set_fusion(bool enabled);
bool cf_nn_fusion_enabled(void);

#endif
