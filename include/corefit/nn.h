/* corefit/nn.h — modules, containers, models, parameter groups, losses and initialisation.
 *
 * A module is a small vtable plus its parameters. Modules form a tree (Sequential, residual
 * blocks); a cf_model owns the tree and keeps every parameter in flat blocks:
 *   - weights: trainable values (weights, biases, BatchNorm affine), one contiguous block;
 *   - grads:   same layout as weights;
 *   - buffers: saved but not trained (BatchNorm running statistics and batch counter).
 * Each parameter has the name PyTorch's state_dict would give it ("0.weight",
 * "1.convpath.0.running_mean"). Activations and their gradients live in one arena sized on the
 * first batch (re-planned only when a batch is larger than any seen): no allocation in a
 * training step.
 *
 * Layout: images are NCHW, dense inputs (N, F), like PyTorch. */
#ifndef COREFIT_NN_H
#define COREFIT_NN_H

#include "corefit/core.h"
#include "corefit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cf_param_kind {
    CF_PARAM_WEIGHT,  /* trainable; weight decay applies */
    CF_PARAM_BIAS,    /* trainable bias; no weight decay unless wd_bn_bias */
    CF_PARAM_NORM,    /* trainable normalisation affine (BatchNorm weight/bias): no weight decay
                         unless wd_bn_bias, keeps training when frozen if train_bn */
    CF_PARAM_BUFFER,  /* saved, not trained (running_mean, running_var) */
    CF_PARAM_COUNTER, /* saved as int64, not trained (num_batches_tracked) */
} cf_param_kind;

#define CF_MODULE_MAX_PARAMS 6

typedef struct cf_param {
    const char *name; /* local name, e.g. "weight" (static string) */
    char *full_name;  /* state_dict name set by the model, e.g. "0.convpath.1.weight" */
    cf_param_kind kind;
    cf_shape shape;
    size_t numel;
    float *data;    /* into the model's weights or buffers block */
    float *grad;    /* into the model's grads block; NULL for buffers */
    size_t offset;  /* element offset in its block */
    int group;      /* parameter group (0 unless set) */
    bool trainable; /* false while frozen */
} cf_param;

typedef struct cf_module cf_module;

/* What the random draws of a training forward (dropout) are drawn from, so that they depend on
 * where a fit is (seed, epoch, sample) and not on how many forwards a process has run: a
 * restarted or resumed fit, and any sharding of the batch over processes, draws the same
 * numbers. Set for each batch by the learner (cf_model_set_draw_key). */
typedef struct cf_draw_key {
    uint64_t key;       /* the fit's position (the learner passes its epoch) */
    const int64_t *ids; /* the dataset index of each row of the batch; NULL: not set */
    int n;              /* rows in ids */
    /* The batch's position in the epoch (the learner sets it after cf_model_set_draw_key), for
     * draws shared by every row of a batch (the text layers' weight and embedding dropouts),
     * which are then the same on every process that holds some of the batch's rows. */
    int64_t step;
    /* Numbers the runs of a module within one forward (the SentenceEncoder's chunks), so that
     * each run draws afresh; 0 otherwise. */
    uint64_t sub;
} cf_draw_key;

typedef struct cf_module_ops {
    const char *kind; /* "Conv2d", "Linear", ... */
    /* The output shape for an input shape; CF_ERR_INVALID, naming the layer and both shapes,
     * when the input does not fit. Required. */
    cf_status (*out_shape)(cf_module *m, const cf_shape *in, cf_shape *out);
    /* Reserves activation memory for inputs of up to `in` (the batch capacity). Called twice
     * with the same input: first while the arena measures, then to hand out pointers. Optional:
     * by default m->out gets numel(out) floats and m->dx numel(in) floats. A layer that needs
     * more (masks, saved statistics, per-thread scratch) reserves it here; a layer that defines
     * plan must also reserve out/dx itself (cf_module_plan_default does that). */
    void (*plan)(cf_module *m, const cf_shape *in, cf_arena *arena);
    /* Initialises parameters and buffers (PyTorch's defaults). Optional. */
    void (*init)(cf_module *m, cf_rng *rng);
    /* y = f(x). x stays valid until backward; the result lives in this module's memory. */
    const cf_tensor *(*forward)(cf_module *m, const cf_tensor *x);
    /* Given dL/dy for the last forward: accumulates (+=) parameter gradients and returns
     * dL/dx (from cf_module_input_grad, or dy itself when the layer passes it through), or NULL
     * when need_dx is false. The result is valid until the caller gives it back
     * (cf_module_give_grad) or the next cf_model_backward. */
    const cf_tensor *(*backward)(cf_module *m, const cf_tensor *dy, bool need_dx);
    /* Frees what the layer allocated itself (not the struct, params or children). Optional. */
    void (*destroy)(cf_module *m);
} cf_module_ops;

struct cf_module {
    const cf_module_ops *ops;
    cf_param params[CF_MODULE_MAX_PARAMS];
    int n_params;
    cf_module **children;
    char **child_names; /* "0", "1", ... for Sequential; "convpath", "idpath" for residual */
    int n_children;
    bool training;
    cf_rng rng;                  /* per-module stream (dropout), seeded by the model */
    const cf_draw_key *draw_key; /* the model's key (set when the module joins a model) */
    const cf_tensor *in;         /* input of the last forward */
    cf_tensor out;               /* output memory (arena) */
    cf_tensor dx;                /* input-gradient memory (see cf_module_input_grad) */
    cf_arena *grad_arena;        /* the arena whose pool dx is taken from (NULL: dx is own) */
    void *impl;                  /* layer-specific state, owned by the layer */
};

/* ---- building modules ---------------------------------------------------------------------- */

/* Allocates a module with `ops` and impl (taken over). Returns NULL on allocation failure. */
cf_module *cf_module_new(const cf_module_ops *ops, void *impl);
/* Declares a parameter (before the module joins a model); returns it. */
cf_param *cf_module_add_param(cf_module *m, const char *name, cf_param_kind kind, cf_shape shape);
/* Frees a module, its impl (through ops->destroy and cf_free) and its children. NULL is ok. */
void cf_module_free(cf_module *m);
/* Reserves m->out (numel(out_shape)) from the arena, and m->dx (numel(in)) from its transient
 * pool: cf_module_input_grad takes it when backward asks for it. */
void cf_module_plan_default(cf_module *m, const cf_shape *in, cf_arena *arena);
/* Sets m->out's shape for this batch and returns its storage (for use in forward). */
cf_tensor *cf_module_output(cf_module *m, const cf_shape *shape);
/* Sets m->dx's shape to m->in's shape and returns it (for use in backward). When m->dx comes
 * from the arena's transient pool (cf_module_plan_default), its memory is taken from the pool
 * here, and the container that receives the gradient gives it back once the layer before has
 * read it: an input gradient is valid until the caller of backward is done with it, so a chain
 * of layers holds a few gradients at once, not one per layer. Call it once in each backward,
 * before writing to m->dx. */
cf_tensor *cf_module_input_grad(cf_module *m);
/* Gives the transient block that starts at p back to m's arena, unless keep points into it (a
 * gradient that passed through as a view); for containers, once a child's gradient is read.
 * Pointers that are not a block (a layer's own memory) are ignored; a container must not give
 * back the dy it was called with (its caller's, which may be a block). */
void cf_module_give_grad(const cf_module *m, const float *p, const float *keep);

/* Appends a named child to any module (for custom containers); takes ownership of the child,
 * also on failure. An empty name makes the child transparent in state_dict names: its
 * parameters continue the parent's prefix (how torchvision's blocks, whose layers sit directly
 * under the block, run their main path through cf_residual). */
cf_status cf_module_add_child(cf_module *parent, cf_module *child, const char *name);

/* Containers take ownership of their children, also on failure. */
cf_module *cf_sequential(int n, cf_module *const *children);
/* Appends a child to a Sequential (takes ownership). */
cf_status cf_sequential_append(cf_module *seq, cf_module *child);
/* relu_after: apply ReLU to convpath(x) + idpath(x). idpath NULL means identity. */
cf_module *cf_residual(cf_module *convpath, cf_module *idpath, bool relu_after);

/* Layers. Constructors return NULL (with cf_last_error) on bad arguments. */
cf_module *cf_linear(int in_features, int out_features, bool bias);
/* Mixed precision for every Linear in the tree under root: on, its three products (forward,
 * input and weight gradients) take cf_sgemm_bf16 (bf16 operands, fp32 sums; fp32 where the CPU
 * has no bf16 kernels), while the weights, gradients and bias stay fp32; off, cf_sgemm again.
 * Returns how many Linear layers it set. */
int cf_linear_set_bf16(cf_module *root, bool on);
cf_module *cf_conv2d(int in_channels, int out_channels, int kernel, int stride, int padding,
                     bool bias);
/* Mixed precision for every Conv2d in the tree under root: on, where the active kernel table
 * computes in bf16 (cf_bf16_compute()), the forward, input-gradient and weight-gradient products
 * take bf16 operands with fp32 sums (im2col + cf_sgemm_bf16; the fp32 implicit and Winograd
 * kernels are not used), the weights, gradients and bias staying fp32 (a weight gradient of under
 * 16 rows by 16 columns, a stem on one channel, stays fp32 too); elsewhere, and off, the fp32
 * paths as before. Returns how many Conv2d layers it set. */
int cf_conv_set_bf16(cf_module *root, bool on);
cf_module *cf_batchnorm1d(int features); /* eps 1e-5, momentum 0.1, affine */
cf_module *cf_batchnorm2d(int channels);
cf_module *cf_batchnorm_ex(int features, bool spatial, float eps, float momentum);

/* Synchronised BatchNorm (PyTorch's SyncBatchNorm), for the replicas of a data-parallel group.
 * reduce(buf, n, backward, ctx) is called by every replica at the same point of every training
 * forward and backward of each BatchNorm layer, with buf = [count, C sums, C sums] of this
 * replica (forward: the values per channel, sum of x, sum of x^2; backward: sum of dy, sum of
 * dy * (x - mean)); it replaces buf with the sums to use: forward, the sums over the replicas
 * (every replica normalises with the whole batch's statistics, and the running statistics move
 * alike); backward, the sums over the replicas in this replica's gradient scale, count the
 * total. The weight and bias gradients stay this replica's own (the group reduces gradients).
 * A failed reduce leaves the layer with this replica's statistics; the caller's next collective
 * reports the failure. Set on every BatchNorm layer of the model (all or none: CF_ERR_NOMEM leaves
 * it off); fn NULL turns it off. */
struct cf_model;
typedef cf_status (*cf_bn_reduce_fn)(double *buf, size_t n, bool backward, void *ctx);
cf_status cf_model_set_bn_reduce(struct cf_model *model, cf_bn_reduce_fn fn, void *ctx);
cf_module *cf_relu(void);
cf_module *cf_leaky_relu(float negative_slope); /* PyTorch's default slope is 0.01 */
cf_module *cf_maxpool2d(int kernel, int stride, int padding);
cf_module *cf_avgpool2d(int kernel, int stride, int padding); /* count_include_pad = true */
cf_module *cf_adaptive_avgpool2d(int out_h, int out_w);
cf_module *cf_adaptive_maxpool2d(int out_h, int out_w);
cf_module *cf_adaptive_concat_pool2d(void); /* cat(max, avg) over 1x1: (N, 2C, 1, 1) */
cf_module *cf_flatten(void);                /* (N, ...) -> (N, prod) */
cf_module *cf_dropout(float p);             /* inverted dropout, identity in eval */
/* Input (N) or (N, k) of category codes stored as floats; output (N, dim) or (N, k*dim). */
cf_module *cf_embedding(int num_embeddings, int dim);
/* A code that is not an integer in [0, num_embeddings) gives a zero row and no gradient (the
 * forward pass cannot fail); this counts such codes seen by an Embedding module (-1 when m is
 * not one). */
int64_t cf_embedding_invalid_codes(const cf_module *m);

/* ---- initialisation ------------------------------------------------------------------------ */

/* kaiming_normal_(fan_in, relu gain) on every weight under m with bias set to 0, skipping
 * BatchNorm (as fastai's apply_init on heads). Must be called after the model is built. */
void cf_init_kaiming_normal(cf_module *m, cf_rng *rng);

/* ---- models -------------------------------------------------------------------------------- */

typedef struct cf_model {
    cf_module *root;
    cf_param **params; /* every parameter and buffer, in state_dict order */
    int n_params;
    float *weights, *grads;
    size_t n_weights;
    float *buffers;
    size_t n_buffers;
    int n_groups;
    bool training;
    uint64_t seed;
    cf_draw_key draw_key; /* cf_model_set_draw_key */
    /* activation memory */
    cf_arena arena;
    cf_shape planned; /* input shape the arena was sized for (ndim 0: none yet) */
    int planned_threads;
    bool unfused; /* plan without layer fusion (for tests that compare the two; the next plan) */
    int n_plans;  /* how many times the activation memory was planned */
} cf_model;

/* Takes ownership of root (also on failure), assigns names and flat storage, and initialises
 * every parameter from `seed`. */
cf_status cf_model_new(cf_model **out, cf_module *root, uint64_t seed);
void cf_model_free(cf_model *model);
/* Keys the random draws of the next training forwards: row b of the batch draws from (the
 * model's seed, the module, key, ids[b]) alone (ids: the dataset index of each row, n rows; the
 * array must stay valid until the forward; NULL clears it). Without ids, or when a forward's
 * batch does not have n rows, a module draws from its own stream (cf_module.rng), which depends
 * on how many forwards it has run. */
void cf_model_set_draw_key(cf_model *model, uint64_t key, const int64_t *ids, int n);
/* Train (batch statistics, dropout) or eval mode for every module. */
void cf_model_train(cf_model *model, bool training);
/* Runs the forward pass; *y is valid until the next forward. Plans the arena on the first
 * batch (or a larger one) and checks the input shape. */
cf_status cf_model_forward(cf_model *model, const cf_tensor *x, const cf_tensor **y);
/* Backward from dL/dy of the last forward; accumulates into model->grads. */
cf_status cf_model_backward(cf_model *model, const cf_tensor *dy);
void cf_model_zero_grad(cf_model *model);
/* Looks up a parameter by state_dict name; NULL when absent. */
cf_param *cf_model_param(const cf_model *model, const char *full_name);
/* Parameter groups: every parameter under `sub` joins `group` (n_groups grows to fit). */
cf_status cf_model_set_group(cf_model *model, const cf_module *sub, int group);
/* fastai's freeze_to(n): groups before n stop training (BatchNorm affine keeps training when
 * train_bn); n < 0 counts from the end; freeze_to(0) unfreezes. */
void cf_model_freeze_to(cf_model *model, int n, bool train_bn);
/* Copies weights and buffers from src to dst (same architecture). */
cf_status cf_model_copy_state(cf_model *dst, const cf_model *src);
/* Total trainable parameters. */
size_t cf_model_num_weights(const cf_model *model);

/* ---- losses -------------------------------------------------------------------------------- */

typedef enum cf_loss_kind {
    CF_LOSS_CROSS_ENTROPY, /* pred (N, C) logits, target (N) class codes as floats; or, as
                              fastai's CrossEntropyLossFlat, pred (N, ..., C) and target (N, ...):
                              the mean over every row of C (a language model's (B, T, V)); with
                              axis 1, pred (N, C, H, W) and target (N, H, W) (segmentation: the
                              mean over every pixel). A target of pred's shape holds class
                              probabilities along the class axis (PyTorch's soft targets; MixUp
                              and CutMix mix one-hot targets into these) */
    CF_LOSS_MSE,           /* pred and target of the same shape (fastai's MSELossFlat) */
    CF_LOSS_BCE_LOGITS,    /* pred and target of the same shape, targets in [0, 1] (fastai's
                              BCEWithLogitsLossFlat: the mean over every value) */
} cf_loss_kind;

typedef struct cf_loss {
    cf_loss_kind kind;
    /* cross-entropy: PyTorch's label_smoothing, which is fastai's LabelSmoothingCrossEntropy(eps)
     * (eps/C * sum_c(-log p_c) + (1 - eps) * NLL, mean over the batch) */
    float label_smoothing;
    /* cross-entropy: the class axis, 0 for the last (fastai's axis=-1), 1 for the dimension after
     * the batch (fastai's CrossEntropyLossFlat(axis=1) over (N, C, H, W) logits) */
    int axis;
    /* BCE: decoding threshold on probabilities, p > thresh (0: fastai's 0.5) */
    float thresh;
    /* BCE: PyTorch's pos_weight, one weight per value of pred's last dimension (borrowed: it
     * must outlive the loss; NULL: none) */
    const float *pos_weight;
    int n_pos_weight;
} cf_loss;

/* fastai's losses by name, with fastai's defaults. */
static inline cf_loss cf_cross_entropy_loss_flat(int axis) {
    return (cf_loss){.kind = CF_LOSS_CROSS_ENTROPY, .axis = axis};
}
/* LabelSmoothingCrossEntropy(eps) (eps <= 0: fastai's 0.1). */
static inline cf_loss cf_label_smoothing_ce(float eps) {
    return (cf_loss){.kind = CF_LOSS_CROSS_ENTROPY, .label_smoothing = eps > 0 ? eps : 0.1f};
}
/* BCEWithLogitsLossFlat(thresh) (thresh <= 0: fastai's 0.5). */
static inline cf_loss cf_bce_with_logits_loss_flat(float thresh) {
    return (cf_loss){.kind = CF_LOSS_BCE_LOGITS, .thresh = thresh > 0 ? thresh : 0.5f};
}
static inline cf_loss cf_mse_loss_flat(void) {
    return (cf_loss){.kind = CF_LOSS_MSE};
}

/* Mean loss over the batch; per_item (N floats) receives each sample's loss when not NULL (the
 * mean over the sample's values, or over its rows for a flat cross-entropy). */
cf_status cf_loss_forward(const cf_loss *loss, const cf_tensor *pred, const cf_tensor *target,
                          float *mean_loss, float *per_item);
/* dL/dpred of the mean loss, written into dpred (same shape as pred). */
void cf_loss_backward(const cf_loss *loss, const cf_tensor *pred, const cf_tensor *target,
                      cf_tensor *dpred);
/* The loss's activation (fastai's loss_func.activation): softmax over the class axis for
 * cross-entropy, sigmoid for BCE, identity for MSE. out may equal pred. */
void cf_loss_activation(const cf_loss *loss, const cf_tensor *pred, cf_tensor *out);
/* fastai's loss_func.decodes on activations: cross-entropy's argmax over the class axis (one
 * class code per row: (N) for (N, C), (N, H, W) for axis 1 over (N, C, H, W)); BCE's
 * p > thresh as 0/1 (act's shape); MSE copies. Returns the values written to out. */
size_t cf_loss_decodes(const cf_loss *loss, const cf_tensor *act, float *out);

/* ---- model zoo ----------------------------------------------------------------------------- */

/* Ready-made models built from the layers above, with the parameter names PyTorch's state_dict
 * gives the equivalent fastai model, so weights copy both ways by name. Each constructor returns
 * a module tree (NULL with cf_last_error on bad arguments) for cf_model_new, which also runs
 * fastai's initialisation for the model: through a parameterless "InitHook" child appended to
 * the Sequential it initialises (the head's, the xresnet body's, SimpleCNN's, TabularModel's
 * "init"); it never appears in the names and costs nothing in forward or backward, but it is
 * counted in n_children (e.g. the xresnet body has children 0-7 and the hook at 8).
 *
 * Vision models are Sequential(body, head) like fastai's vision_learner: names start with "0."
 * for the body and "1." for the head; cf_split_default makes the body group 0 and the head
 * group 1 (fastai's default_split). */

#define CF_HEAD_MAX_LAYERS 8

/* fastai's create_head(nf, n_out, lin_ftrs, ps, pool, concat_pool, first_bn, bn_final,
 * lin_first, y_range). cf_head_defaults() gives fastai's defaults: lin_ftrs [512], ps [0.5]
 * (one p means p/2 for the hidden layers and p for the last), pool, concat_pool, first_bn, no
 * bn_final, no lin_first, no y_range, and vision_learner's apply_init(head, kaiming_normal_). */
typedef struct cf_head_opts {
    int n_lin_ftrs;                   /* number of hidden layers (0: a single Linear block) */
    int lin_ftrs[CF_HEAD_MAX_LAYERS]; /* hidden sizes */
    int n_ps;                         /* 1, or n_lin_ftrs + 1 */
    float ps[CF_HEAD_MAX_LAYERS + 1]; /* dropout per block; p == 0 leaves the Dropout out */
    bool pool;                        /* start with pooling + Flatten (else input is (N, nf)) */
    bool concat_pool;                 /* AdaptiveConcatPool2d (2*nf features), else avg pool */
    bool first_bn;                    /* BatchNorm1d in the first block */
    bool bn_final;                    /* BatchNorm1d(n_out, momentum 0.01) at the end */
    bool lin_first;                   /* LinBnDrop order Linear, ReLU, BN, Dropout */
    bool y_range;                     /* end with SigmoidRange(y_lo, y_hi) */
    float y_lo, y_hi;
    bool init; /* kaiming_normal_ Linear weights, biases 0 */
} cf_head_opts;

cf_head_opts cf_head_defaults(void);
/* The head for a body with nf output channels (NULL opts: defaults). Names "0", "1", ... as
 * fastai's flat Sequential: [pool, Flatten, (BatchNorm1d, Dropout, Linear, ReLU)..., ...].
 * The BatchNorm1d layers start with weight 1 and bias 1e-3 (fastai's BatchNorm helper). */
cf_module *cf_create_head(int nf, int n_out, const cf_head_opts *opts);

/* W1, the benchmark workload ("mini-resnet"): body = Sequential(Conv2d(c_in,16,3,p1,no bias),
 * BN(16), ReLU, block(16->32, stride 2), block(32->64, stride 2)) where a block is
 * cf_residual(convpath = [Conv3x3 s2, BN, ReLU, Conv3x3, BN], idpath = [Conv1x1 s2, BN],
 * relu_after); head = create_head(64, n_out, lin_ftrs [256], ps [0.25, 0.5]).
 * Names: "0.0.weight" (stem conv), "0.1.*" (stem BN), "0.3.convpath.0.weight",
 * "0.3.idpath.1.running_mean", ..., "1.2.weight" (head BatchNorm1d(128)), "1.8.weight" (last
 * Linear). Body: PyTorch's default initialisation; head: as cf_create_head. */
cf_module *cf_mini_resnet(int c_in, int n_out);
/* The same with another head (e.g. ps 0 for deterministic training). */
cf_module *cf_mini_resnet_ex(int c_in, int n_out, const cf_head_opts *head);
cf_module *cf_mini_resnet_body(int c_in); /* 64 output channels */

/* fastai's XResNet (vision/models/xresnet.py) cut as vision_learner cuts it (the last four
 * children dropped), followed by create_head(512 * expansion, n_out). Body children: 0-2 the
 * stem ConvLayers (c_in->32 stride 2, 32->32, 32->64; each Sequential(Conv2d no bias,
 * BatchNorm2d, ReLU)), 3 MaxPool2d(3, 2, 1), 4-7 the stages of ResBlocks ("convpath" of
 * ConvLayers, the last without ReLU and with its BatchNorm weight 0; "idpath" = [AvgPool2d(2,
 * ceil_mode) if stride 2] + [ConvLayer 1x1 without ReLU if channels change], ReLU after the
 * add). E.g. "0.0.0.weight", "0.4.0.convpath.1.1.weight", "0.5.0.idpath.1.0.weight".
 * Initialisation as fastai's init_cnn: conv weights kaiming_normal_, every bias 0 (BatchNorm
 * too), BatchNorm weight 1 except the zeroed ones. */
typedef struct cf_xresnet_opts {
    int c_in;          /* input channels (3) */
    bool small_images; /* for 28x28-class inputs: the first stem conv has stride 1 (the max
                          pool stays), so 28x28 reaches the stages at 14, 7, 4 and 2 pixels
                          instead of 7, 4, 2 and 1; names and parameters are unchanged (false) */
    cf_head_opts head; /* cf_head_defaults() */
} cf_xresnet_opts;

cf_xresnet_opts cf_xresnet_defaults(void);
/* depth 18 ([2,2,2,2], basic blocks), 34 ([3,4,6,3]) or 50 ([3,4,6,3], bottlenecks). */
cf_module *cf_xresnet(int depth, int n_out, const cf_xresnet_opts *opts);
cf_module *cf_xresnet_body(int depth, const cf_xresnet_opts *opts);
/* The body's output channels: 512 for depth 18/34, 2048 for 50 (0 for another depth). */
int cf_xresnet_nf(int depth);
cf_module *cf_xresnet18(int c_in, int n_out);
cf_module *cf_xresnet34(int c_in, int n_out);
cf_module *cf_xresnet50(int c_in, int n_out);

/* torchvision's ResNet (resnet18/34 with BasicBlocks, 50/101/152 with Bottlenecks, the stride
 * on the 3x3 conv) with torchvision's state_dict names: "conv1.weight", "bn1.running_mean",
 * "layer1.0.conv1.weight", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight", ...,
 * "fc.weight", "fc.bias", in the same order. Initialisation as torchvision: conv weights
 * kaiming_normal_(mode fan_out, relu), BatchNorm weight 1 and bias 0, fc as nn.Linear. c_in 3
 * for ImageNet weights. */
cf_module *cf_resnet(int depth, int c_in, int num_classes);
/* fastai's create_body(resnet, cut=-2): Sequential(conv1, bn1, relu, maxpool, layer1, ...,
 * layer4) as children "0".."7" (names "0.weight", "4.0.conv1.weight", "5.0.downsample.0.weight";
 * an InitHook follows at 8), as torchvision initialises it. Output (N, nf, H/32, W/32). */
cf_module *cf_resnet_body(int depth, int c_in);
/* The body's output channels: 512 for depth 18/34, 2048 for 50/101/152 (0 for another depth). */
int cf_resnet_nf(int depth);
/* fastai's vision_learner model for a torchvision resnet: Sequential(cf_resnet_body,
 * cf_create_head(nf, n_out, head)) with names "0.0.weight" (conv1), "0.4.0.conv1.weight"
 * (layer1.0.conv1), ..., "1.*" (the head). head NULL: fastai's defaults. Use cf_split_resnet for
 * fastai's three parameter groups. */
cf_module *cf_resnet_learner_model(int depth, int c_in, int n_out, const cf_head_opts *head);
/* A vision model by architecture name (the command line's --arch): "mini-resnet" (W1),
 * "xresnet18", "xresnet34", "xresnet50", and "xresnet18-small" etc. (small_images),
 * "resnet18", "resnet34", "resnet50", "resnet101", "resnet152" (cf_resnet_learner_model), each
 * with fastai's default head (mini-resnet: its own). NULL with a message naming the choices for
 * another name. */
cf_module *cf_vision_model(const char *arch, int c_in, int n_out);

/* ---- segmentation: fastai's DynamicUnet (fastai/vision/models/unet.py) ---- */

/* nn.PixelShuffle(scale): (N, C*s*s, H, W) -> (N, C, H*s, W*s). */
cf_module *cf_pixel_shuffle(int scale);
/* nn.ReplicationPad2d((left, right, top, bottom)): edge values repeated outward. */
cf_module *cf_replication_pad2d(int left, int right, int top, int bottom);
/* fastai's icnr_init on a conv weight (out_channels, in_channels, kh, kw): out_channels/scale^2
 * base kernels drawn kaiming_normal_ (N(0, 2 / (in_channels*kh*kw))), output channel o takes
 * base kernel o / scale^2, so a PixelShuffle after the conv starts as nearest upsampling (no
 * checkerboard). */
void cf_icnr_init(float *weight, int out_channels, int in_channels, int kh, int kw, int scale,
                  cf_rng *rng);
/* fastai's PixelShuffle_ICNR(ni, nf, scale, blur, norm_type=None): Sequential("0" ConvLayer =
 * ("0" Conv2d(ni, nf*scale^2, 1) with bias 0 and ICNR weights, "1" ReLU), "1" PixelShuffle,
 * with blur "2" ReplicationPad2d((1, 0, 1, 0)), "3" AvgPool2d(2, stride 1)). Output
 * (N, nf, H*scale, W*scale). */
cf_module *cf_pixel_shuffle_icnr(int ni, int nf, int scale, bool blur);

/* DynamicUnet's options; cf_unet_defaults() gives fastai's: blur false, blur_final true, no
 * self-attention, no y_range, last_cross true, bottle false (the decoder's norm_type is None,
 * its activation ReLU and its init kaiming_normal_, as fastai's unet_learner). */
typedef struct cf_unet_opts {
    bool blur, blur_final;
    bool self_attention; /* not supported: true is refused */
    bool y_range;        /* SigmoidRange(y_lo, y_hi) on the output map */
    float y_lo, y_hi;
    bool last_cross;
    bool bottle; /* breaks in fastai (the ResBlock's width no longer fits the final conv): refused */
} cf_unet_opts;
cf_unet_opts cf_unet_defaults(void);
/* fastai's DynamicUnet(encoder, n_out, (img_h, img_w)) on a cut body (a Sequential whose
 * children are the encoder's layers, e.g. cf_resnet_body or cf_xresnet_body; a trailing init
 * hook is ignored); takes ownership of encoder, also on failure. The skips are the encoder
 * children after which the width changes at img_size, deepest first; UnetBlocks upsample with
 * PixelShuffle_ICNR, concatenate the BatchNorm'd skip, and run two ConvLayers; a final
 * PixelShuffle_ICNR when the first encoder layer halves the size, nearest resizing wherever
 * sizes differ, the input concatenated back (last_cross) into ResBlock(1, ni, ni), and a 1x1
 * ConvLayer to n_out. Input (N, n_in, H, W) (any H, W the encoder takes), output
 * (N, n_out, H, W). State-dict names as fastai's: "layers.0.4.0.conv1.weight" (the encoder),
 * "layers.1.weight", "layers.3.0.0.weight", "layers.4.shuf.0.0.weight", "layers.4.bn.weight",
 * "layers.4.conv1.0.weight", ..., "layers.<k>.convpath.0.0.weight" (ResBlock), "layers.<k+1>.0.*"
 * (final conv). */
cf_module *cf_dynamic_unet(cf_module *encoder, int n_in, int n_out, int img_h, int img_w,
                           const cf_unet_opts *opts);
/* cf_dynamic_unet on the body of arch: "resnet18/34/50/101/152" (torchvision, cf_resnet_body)
 * or "xresnet18/34/50" (cf_xresnet_body). opts NULL: the defaults. */
cf_module *cf_unet_model(const char *arch, int n_in, int n_out, int img_h, int img_w,
                         const cf_unet_opts *opts);
/* True when m is a cf_dynamic_unet. */
bool cf_is_dynamic_unet(const cf_module *m);
/* fastai's unet splitter through the body's meta: encoder children [0, body_cut) group 0 (6 for
 * a torchvision resnet, 3 for an xresnet), the rest of the encoder group 1, the decoder group 2.
 * n_groups 3. */
struct cf_model;
cf_status cf_split_unet(struct cf_model *model, int body_cut);

/* fastai's SimpleCNN(filters, kernel_szs, strides, bn): n_filters - 1 ConvLayers
 * filters[i] -> filters[i+1] (kernel kernel_szs[i] (default 3), stride strides[i] (default 2),
 * padding (k-1)/2; Conv2d, BatchNorm2d (when bn, except the last layer), ReLU; a conv without
 * BatchNorm has a bias), then Sequential(AdaptiveAvgPool2d(1), Flatten()). Output
 * (N, filters[n_filters-1]). Initialisation as fastai's ConvLayer: kaiming_uniform_ weights,
 * biases N(0, 0.01), BatchNorm bias 1e-3. kernel_szs/strides may be NULL. */
cf_module *cf_simple_cnn(int n_filters, const int *filters, const int *kernel_szs,
                         const int *strides, bool bn);

#define CF_TABULAR_MAX_LAYERS 16

/* fastai's TabularModel options; cf_tabular_defaults(): layers [200, 100], ps 0, embed_p 0,
 * use_bn, no bn_final, bn_cont, lin_first, no y_range. */
typedef struct cf_tabular_opts {
    int n_layers;
    int layers[CF_TABULAR_MAX_LAYERS];
    int n_ps; /* 0: all 0; 1: the same p for every hidden layer;
                 n_layers: one each */
    float ps[CF_TABULAR_MAX_LAYERS];
    float embed_p; /* dropout after the embeddings */
    bool use_bn, bn_final, bn_cont, lin_first;
    bool y_range;
    float y_lo, y_hi;
} cf_tabular_opts;

cf_tabular_opts cf_tabular_defaults(void);
/* fastai's emb_sz_rule: min(600, round(1.6 * n_cat^0.56)) (round half to even, as Python). */
int cf_emb_sz_rule(int n_cat);
/* fastai's TabularModel for n_cat categorical columns (cardinalities[i] classes, #na#
 * included; emb_dims[i] > 0 or, when emb_dims is NULL or emb_dims[i] <= 0, emb_sz_rule) and
 * n_cont continuous columns. Input (N, n_cat + n_cont): the category codes first (as floats),
 * then the continuous values; output (N, out_sz). Names as fastai: "embeds.0.weight",
 * "bn_cont.weight", ..., "layers.0.0.weight" (Linear), "layers.0.2.weight" (BatchNorm1d),
 * "layers.2.0.weight", "layers.2.0.bias" (final Linear). bn_cont is left out when n_cont is
 * 0. Embeddings start as fastai's trunc_normal_(std 0.01) (normal, fmod 2, times 0.01);
 * LinBnDrop BatchNorms with bias 1e-3; Linear layers as PyTorch. The input gradient of the
 * code columns is 0. */
cf_module *cf_tabular_model(int n_cat, const int *cardinalities, const int *emb_dims, int n_cont,
                            int out_sz, const cf_tabular_opts *opts);

/* ---- parameter groups for the zoo ---- */

/* fastai's default_split: the root's first child (the body) is group 0, the rest group 1.
 * The root must have at least two children. Sets n_groups to 2. */
cf_status cf_split_default(cf_model *model);
/* fastai's _resnet_split for a Sequential(body, head): body children [0, 6) group 0, body
 * children [6, ...) group 1, the head group 2. Sets n_groups to 3. */
cf_status cf_split_resnet(cf_model *model);
/* Every parameter in group 0 (fastai's trainable_params splitter); n_groups 1. */
void cf_split_none(cf_model *model);

/* ---- recurrent layers and fastai's AWD-LSTM text models ------------------------------------ *
 * Token ids arrive as a float tensor (B, T); the padding id is 1 (xxpad). Recurrent layers are
 * batch first and carry their hidden state from one forward to the next, detached (truncated
 * BPTT: no gradient flows into the previous batch); cf_rnn_reset zeroes it (fastai's reset(),
 * which the learner calls at the start of each epoch and of validation). Dropout masks are
 * redrawn at every training forward from each module's random stream (seeded by the model). */

/* One LSTM layer as nn.LSTM(input_size, hidden_size, batch_first=True): input (B, T, I), output
 * (B, T, H). Parameters "weight_ih_l0" (4H, I), "weight_hh_l0" (4H, H), "bias_ih_l0",
 * "bias_hh_l0" (4H), gates in PyTorch's order i, f, g, o, each U(-1/sqrt(H), 1/sqrt(H)). A batch
 * of another size keeps the first rows of the carried state or zero-pads new ones (fastai's
 * AWD_LSTM). */
cf_module *cf_lstm(int input_size, int hidden_size);
/* fastai's WeightDropout(lstm, weight_p) on the hidden-to-hidden weight: takes ownership of the
 * LSTM (child "module", which then has weight_ih_l0, bias_ih_l0, bias_hh_l0) and holds the
 * weight as "weight_hh_l0_raw"; a training forward runs the LSTM on raw * mask (element-wise,
 * kept with probability 1 - weight_p, scaled by 1 / (1 - weight_p)), eval on raw. */
cf_module *cf_weight_dropout(cf_module *lstm, float weight_p);
/* Zeroes the hidden state of every LSTM under m. */
void cf_rnn_reset(cf_module *m);
/* fastai's RNNDropout(p): input (B, ..., F), one mask (B, 1, F) per forward, shared over time. */
cf_module *cf_rnn_dropout(float p);
/* An RNNDropout's p (-1 when m is not one): a training forward scales kept values by
 * 1 / (1 - p). */
float cf_rnn_dropout_p(const cf_module *m);
/* fastai's EmbeddingDropout around an nn.Embedding(vocab_size, dim, padding_idx=pad_idx): input
 * (B, T) ids, output (B, T, dim); a training forward drops whole rows of the table (mask
 * (vocab, 1), scaled); the padding row is looked up but gets no gradient. Parameter "weight",
 * U(-0.1, 0.1) (fastai's AWD_LSTM init). An id outside [0, vocab) gives a zero row. */
cf_module *cf_embedding_dropout(int vocab_size, int dim, float embed_p, int pad_idx);
/* fastai's LinearDecoder(n_out, n_hid, output_p, tie_encoder, bias): RNNDropout(output_p)
 * (child "output_dp"), then logits (B, T, n_out) = x W^T + b. With tied_encoder (a
 * cf_embedding_dropout of (n_out, n_hid)) W is the encoder's table itself (its gradient goes
 * there, and the decoder has no "decoder.weight"); else "decoder.weight" U(-0.1, 0.1).
 * "decoder.bias" starts at 0. */
cf_module *cf_linear_decoder(int n_out, int n_hid, float output_p, const cf_module *tied_encoder,
                             bool bias);

/* fastai's awd_lstm_lm_config / awd_lstm_clas_config (every *_p is scaled by drop_mult). */
typedef struct cf_awd_lstm_config {
    int emb_sz, n_hid, n_layers, pad_token;
    float output_p, hidden_p, input_p, embed_p, weight_p;
    bool tie_weights, out_bias; /* language model only */
} cf_awd_lstm_config;

/* emb 400, n_hid 1152, 3 layers, pad 1, output_p 0.1, hidden_p 0.15, input_p 0.25, embed_p 0.02,
 * weight_p 0.2, tie_weights, out_bias. */
cf_awd_lstm_config cf_awd_lstm_lm_config(void);
/* The same sizes with output_p 0.4, hidden_p 0.3, input_p 0.4, embed_p 0.05, weight_p 0.5. */
cf_awd_lstm_config cf_awd_lstm_clas_config(void);

/* fastai's AWD_LSTM(vocab_sz, emb_sz, n_hid, n_layers, pad_token, hidden_p, input_p, embed_p,
 * weight_p) with the config's *_p times drop_mult: input (B, T) ids, output (B, T, emb_sz), the
 * last layer's output. Children as fastai's state_dict: "encoder" (cf_embedding_dropout),
 * "rnns.<l>" (cf_weight_dropout of cf_lstm: "rnns.0.weight_hh_l0_raw",
 * "rnns.0.module.weight_ih_l0", ...), "input_dp", "hidden_dps.<l>" (RNNDropout). fastai's
 * encoder_dp.emb.weight is the same tensor as encoder.weight and is not repeated. */
cf_module *cf_awd_lstm(int vocab_size, const cf_awd_lstm_config *config, float drop_mult);
/* fastai's get_language_model(AWD_LSTM, vocab_sz, config, drop_mult): Sequential("0" AWD_LSTM,
 * "1" LinearDecoder(vocab, emb_sz, output_p, tied to the encoder when tie_weights, out_bias)).
 * Output: logits (B, T, vocab). NULL config: awd_lstm_lm_config. */
cf_module *cf_awd_lstm_lm(int vocab_size, const cf_awd_lstm_config *config, float drop_mult);
/* fastai's language-model splitter: groups [rnns.0], [rnns.1], ..., [encoder + decoder]
 * (n_layers + 1 groups). model->root must come from cf_awd_lstm_lm. */
cf_status cf_split_awd_lstm_lm(struct cf_model *model);

/* fastai's RNNRegularizer (AR and TAR) on a cf_awd_lstm_lm. fastai's language model returns
 * (logits, raw_out, out): raw_out is the AWD_LSTM's output (B, T, emb_sz), out the decoder's
 * input after its output dropout. Both are of the last forward and valid until the next one;
 * NULL before a forward or when lm is not a cf_awd_lstm_lm. */
const cf_tensor *cf_awd_lstm_lm_raw_out(const cf_module *lm);
const cf_tensor *cf_awd_lstm_lm_out(const cf_module *lm);
/* alpha * mean(out^2) + beta * mean((raw_out[:, 1:] - raw_out[:, :-1])^2) of the last forward
 * (the TAR term is 0 when T is 1); fastai adds it to the loss it back-propagates, not to the
 * loss it logs. */
double cf_rnn_regularizer_loss(const cf_module *lm, float alpha, float beta);
/* From now on every training backward of lm adds the gradient of that term (fastai's
 * TextLearner: alpha 2, beta 1); eval backwards and alpha = beta = 0 (the default) add nothing.
 * CF_ERR_INVALID when lm is not a cf_awd_lstm_lm or alpha, beta are negative or not finite. */
cf_status cf_rnn_regularizer_set(cf_module *lm, float alpha, float beta);

/* ---- fastai's ULMFiT text classifier (fastai/text/models/core.py) ---- */

/* fastai's SentenceEncoder(bptt, AWD_LSTM, pad_idx, max_len): takes ownership of awd_lstm (child
 * "module"). Input (B, T) ids padded in front in bptt chunks (fastai's Pad_Chunk, rows sorted
 * longest first); output (B, K, emb_sz), K the columns of the chunks within the last max_len
 * (a chunk starting at column i is kept when T - i <= max_len; max_len < 0: all). Each forward
 * resets the state, then runs chunk i = 0, bptt, 2 bptt, ... on its first real_bs rows (real_bs:
 * the rows whose column i is not pad_idx), the state carried and detached between chunks; rows
 * past real_bs are zero in the output. Earlier chunks only warm the state (no output, no
 * gradient). Backward recomputes each kept chunk but the last (same masks and state) instead of
 * holding all of them. max_len must be >= bptt (or < 0). Inside a fit each chunk's dropouts
 * draw from the model's draw key numbered by the chunk (cf_draw_key.sub). Split over ranks, a
 * rank counts real_bs over its own rows, which equals one process's run of the batch when the
 * active rows form a prefix of it; fastai's count does not check that, and a row padded at the
 * end inside the last chunk while a shorter row is not breaks it (documents of whole chunks
 * never do). */
cf_module *cf_sentence_encoder(int bptt, cf_module *awd_lstm, int pad_idx, int max_len);
/* fastai's PoolingLinearClassifier(dims, ps, bptt) after `encoder` (a cf_sentence_encoder, whose
 * input gives the padding): masked_concat_pool of the encoder's output (B, K, E) into (B, 3E) =
 * [the output at the last non-pad column (index -(pads in the last bptt columns) - 1), max over
 * non-pad columns, mean over non-pad columns], then child "layers": for each i < n_dims - 1 a
 * LinBnDrop "layers.<i>" = BatchNorm1d(dims[i]) (weight 1, bias 1e-3), Dropout(ps[i]) when
 * ps[i] > 0, Linear(dims[i], dims[i + 1], no bias, PyTorch init), ReLU except after the last.
 * dims[0] must be 3E. Output (B, dims[n_dims - 1]) logits. */
cf_module *cf_pooling_linear_classifier(const cf_module *encoder, const int *dims, int n_dims,
                                        const float *ps);

typedef struct cf_text_classifier_opts {
    int seq_len;         /* bptt of the SentenceEncoder; 0: 72 */
    int max_len;         /* 0: 72 * 20 = 1440; < 0: no limit */
    const int *lin_ftrs; /* hidden sizes of the head; NULL: {50} */
    int n_lin_ftrs;
    const float *ps; /* n_lin_ftrs dropouts after the first block's; NULL: 0.1 each */
} cf_text_classifier_opts;

/* fastai's get_text_classifier(AWD_LSTM, vocab_sz, n_class, seq_len, config, drop_mult,
 * lin_ftrs, ps, max_len): Sequential("0" cf_sentence_encoder(seq_len, cf_awd_lstm(vocab, config,
 * drop_mult), config->pad_token, max_len), "1" cf_pooling_linear_classifier with dims
 * [3 emb_sz, *lin_ftrs, n_class] and ps [output_p * drop_mult, *ps]). Names as fastai's
 * state_dict: "0.module.encoder.weight", "0.module.rnns.0.weight_hh_l0_raw", ...,
 * "1.layers.0.0.weight" (BatchNorm1d), "1.layers.0.2.weight" (Linear). NULL config:
 * awd_lstm_clas_config; NULL opts: the defaults. */
cf_module *cf_text_classifier(int vocab_size, int n_class, const cf_awd_lstm_config *config,
                              float drop_mult, const cf_text_classifier_opts *opts);
/* fastai's awd_lstm_clas_split: [encoder], [rnns.0], ..., [rnns.n-1], [head] (n_layers + 2
 * groups; 5 for the configs, so slice(lr / 2.6^4, lr) spreads over all of them). model->root
 * must come from cf_text_classifier. */
cf_status cf_split_text_classifier(struct cf_model *model);

#ifdef __cplusplus
}
#endif
#endif
