/* corefit/nn.h — modules, containers, models, parameter groups, losses and initialisation.
 * A cf_model owns a module tree and keeps weights, grads and buffers in flat blocks, each
 * parameter named as PyTorch's state_dict would; activations live in one arena planned on the
 * first batch (no allocation in a training step). Images are NCHW, dense inputs (N, F).
 * Memory model, state-dict names and model details: docs/api.md. */
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

/* What a training forward's random draws (dropout) come from: (seed, epoch, sample), so that
 * resumed and sharded fits draw the same numbers. Set per batch by the learner. */
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
    /* Optional: reserves activation memory for inputs up to `in`; called twice (measure, then hand
     * out). Default: numel(out) floats for m->out, numel(in) for m->dx. A layer that defines plan
     * must reserve out/dx itself (cf_module_plan_default). */
    void (*plan)(cf_module *m, const cf_shape *in, cf_arena *arena);
    /* Initialises parameters and buffers (PyTorch's defaults). Optional. */
    void (*init)(cf_module *m, cf_rng *rng);
    /* y = f(x). x stays valid until backward; the result lives in this module's memory. */
    const cf_tensor *(*forward)(cf_module *m, const cf_tensor *x);
    /* Accumulates (+=) parameter gradients for dL/dy and returns dL/dx (cf_module_input_grad, or
     * dy passed through; NULL when !need_dx), valid until given back (cf_module_give_grad) or the
     * next cf_model_backward. */
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
    /* a root whose layers all run inputs shorter along dim 1 (time steps) than the model was
     * planned for, within that plan (a language model, a text classifier); set by its
     * constructor */
    bool seq_within_plan;
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
/* Sets m->dx's shape to m->in's and returns it, taking it from the arena's transient pool when
 * planned so. Call once in each backward, before writing to m->dx. */
cf_tensor *cf_module_input_grad(cf_module *m);
/* Gives the transient block at p back to m's arena unless keep points into it; for containers,
 * once a child's gradient is read. Non-block pointers are ignored; never give back your own dy. */
void cf_module_give_grad(const cf_module *m, const float *p, const float *keep);

/* For a layer's forward or backward that could not compute its result (they return no
 * status): records status and the printf-style message (cf_last_error) as the pass's error, the
 * first one of the pass kept. The pass runs on to its end (containers do not check), and
 * cf_model_forward / cf_model_backward then return that status with that message, so the
 * Learner's fit stops with it before the optimizer step. Per thread: call it on the thread that
 * runs the forward or backward (not from a cf_parallel_for range). Returns status. */
cf_status cf_module_fail(cf_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends a named child (custom containers); takes ownership, also on failure. An empty name
 * makes the child transparent in state_dict names (its parameters keep the parent's prefix). */
cf_status cf_module_add_child(cf_module *parent, cf_module *child, const char *name);

/* Containers take ownership of their children, also on failure. */
cf_module *cf_sequential(int n, cf_module *const *children);
/* Appends a child to a Sequential (takes ownership). */
cf_status cf_sequential_append(cf_module *seq, cf_module *child);
/* relu_after: apply ReLU to convpath(x) + idpath(x). idpath NULL means identity. */
cf_module *cf_residual(cf_module *convpath, cf_module *idpath, bool relu_after);

/* Layers. Constructors return NULL (with cf_last_error) on bad arguments. */
cf_module *cf_linear(int in_features, int out_features, bool bias);
/* bf16 compute for every Linear under root (bf16 operands, fp32 sums; weights, gradients and
 * bias stay fp32; fp32 without bf16 kernels); off: fp32 again. Returns how many it set. */
int cf_linear_set_bf16(cf_module *root, bool on);
cf_module *cf_conv2d(int in_channels, int out_channels, int kernel, int stride, int padding,
                     bool bias);
/* bf16 compute for every Conv2d under root where the kernel table computes in bf16 (im2col +
 * cf_sgemm_bf16); weights, gradients and bias stay fp32; off: the fp32 paths. Returns how many
 * it set. Details: docs/api.md. */
int cf_conv_set_bf16(cf_module *root, bool on);
cf_module *cf_batchnorm1d(int features); /* eps 1e-5, momentum 0.1, affine */
cf_module *cf_batchnorm2d(int channels);
cf_module *cf_batchnorm_ex(int features, bool spatial, float eps, float momentum);

/* Synchronised BatchNorm (PyTorch's SyncBatchNorm) over the replicas of a data-parallel group:
 * every replica calls reduce(buf, n, backward, ctx) at the same point of each BatchNorm forward
 * and backward, and it must replace buf ([count, C sums, C sums]) with the sums over replicas.
 * Set on every layer or none (CF_ERR_NOMEM leaves it off); fn NULL turns it off. Details:
 * docs/api.md. */
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
    unsigned planned_bf16; /* cf__conv_bf16_generation when planned (a switch replans) */
} cf_model;

/* Takes ownership of root (also on failure), assigns names and flat storage, and initialises
 * every parameter from `seed`. */
cf_status cf_model_new(cf_model **out, cf_module *root, uint64_t seed);
void cf_model_free(cf_model *model);
/* Keys the next training forwards' draws: row b draws from (model seed, module, key, ids[b])
 * (ids: dataset indices, n rows, valid until the forward; NULL clears). Otherwise a module draws
 * from its own stream. */
void cf_model_set_draw_key(cf_model *model, uint64_t key, const int64_t *ids, int n);
/* Train (batch statistics, dropout) or eval mode for every module. */
void cf_model_train(cf_model *model, bool training);
/* Runs the forward pass; *y is valid until the next forward. Plans the arena on the first
 * batch (or a larger one) and checks the input shape. A layer's failure (cf_module_fail) is
 * returned once the pass is over; *y is then not valid. */
cf_status cf_model_forward(cf_model *model, const cf_tensor *x, const cf_tensor **y);
/* Backward from dL/dy of the last forward; accumulates into model->grads. A layer's failure
 * (cf_module_fail) is returned once the pass is over; the gradients are then not valid. */
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

/* Ready-made models with the parameter names PyTorch's state_dict gives the equivalent fastai
 * model, so weights copy both ways by name; NULL with cf_last_error on bad arguments. cf_model_new
 * runs fastai's initialisation through a hidden "InitHook" child (counted in n_children). Vision
 * models are Sequential(body "0.", head "1."); cf_split_default: body group 0, head group 1.
 * Architectures and names: docs/api.md. */

#define CF_HEAD_MAX_LAYERS 8

/* fastai's create_head(nf, n_out, lin_ftrs, ps, pool, concat_pool, first_bn, bn_final,
 * lin_first, y_range); cf_head_defaults() gives fastai's defaults (lin_ftrs [512], ps [0.5]). */
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

/* W1, the benchmark workload ("mini-resnet"): a 16-channel stem and two strided residual
 * blocks (16->32->64), then create_head(64, n_out, [256], [0.25, 0.5]). Layout: docs/api.md. */
cf_module *cf_mini_resnet(int c_in, int n_out);
/* The same with another head (e.g. ps 0 for deterministic training). */
cf_module *cf_mini_resnet_ex(int c_in, int n_out, const cf_head_opts *head);
cf_module *cf_mini_resnet_body(int c_in); /* 64 output channels */

/* "fast-cnn", the model of corefit train --recipe fast: three convolution groups (Conv2d 3x3,
 * MaxPool2d(2), BatchNorm2d, ReLU) of 24, 48 and 96 channels, then create_head(96, n_out) (head
 * NULL: cf_fast_cnn_head(), a BatchNorm1d and a Linear, no dropout). Layout: docs/api.md. */
cf_module *cf_fast_cnn(int c_in, int n_out);
cf_module *cf_fast_cnn_ex(int c_in, int n_out, const cf_head_opts *head);
cf_module *cf_fast_cnn_body(int c_in); /* cf_fast_cnn_nf() output channels */
int cf_fast_cnn_nf(void);
cf_head_opts cf_fast_cnn_head(void);

/* fastai's XResNet cut as vision_learner cuts it, followed by create_head(512 * expansion,
 * n_out); fastai's init_cnn. Layout and names: docs/api.md. */
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

/* torchvision's ResNet (18/34 BasicBlocks, 50/101/152 Bottlenecks) with torchvision's
 * state_dict names ("conv1.weight", "layer1.0.conv1.weight", ..., "fc.weight") and its
 * initialisation. c_in 3 for ImageNet weights. */
cf_module *cf_resnet(int depth, int c_in, int num_classes);
/* fastai's create_body(resnet, cut=-2): Sequential(conv1, bn1, relu, maxpool, layer1, ...,
 * layer4) as children "0".."7" (names "0.weight", "4.0.conv1.weight", "5.0.downsample.0.weight";
 * an InitHook follows at 8), as torchvision initialises it. Output (N, nf, H/32, W/32). */
cf_module *cf_resnet_body(int depth, int c_in);
/* The body's output channels: 512 for depth 18/34, 2048 for 50/101/152 (0 for another depth). */
int cf_resnet_nf(int depth);
/* fastai's vision_learner model for a torchvision resnet: Sequential(cf_resnet_body, create_head)
 * ("0.*" body, "1.*" head; head NULL: defaults). cf_split_resnet gives fastai's three groups. */
cf_module *cf_resnet_learner_model(int depth, int c_in, int n_out, const cf_head_opts *head);
/* A vision model by --arch name: "mini-resnet", "xresnet18/34/50" (and "-small"), "resnet18"
 * ... "resnet152", each with fastai's default head. NULL with a message listing the choices. */
cf_module *cf_vision_model(const char *arch, int c_in, int n_out);

/* ---- segmentation: fastai's DynamicUnet (fastai/vision/models/unet.py) ---- */

/* nn.PixelShuffle(scale): (N, C*s*s, H, W) -> (N, C, H*s, W*s). */
cf_module *cf_pixel_shuffle(int scale);
/* nn.ReplicationPad2d((left, right, top, bottom)): edge values repeated outward. */
cf_module *cf_replication_pad2d(int left, int right, int top, int bottom);
/* fastai's icnr_init on a conv weight (out, in, kh, kw): kaiming-normal base kernels repeated
 * per scale^2 outputs, so a following PixelShuffle starts as nearest upsampling. */
void cf_icnr_init(float *weight, int out_channels, int in_channels, int kh, int kw, int scale,
                  cf_rng *rng);
/* fastai's PixelShuffle_ICNR(ni, nf, scale, blur, norm_type=None): 1x1 conv with ICNR weights,
 * ReLU, PixelShuffle (blur: ReplicationPad2d + AvgPool2d). Output (N, nf, H*scale, W*scale). */
cf_module *cf_pixel_shuffle_icnr(int ni, int nf, int scale, bool blur);

/* fastai's SelfAttention(n_channels) (n_channels >= 8): out = gamma * h softmax(f^T g, dim 1)
 * + x over the H*W positions, f, g, h 1x1 convolutions (n/8, n/8, n outputs, no bias) under
 * spectral_norm (one power iteration per training forward), gamma starting at 0. State-dict
 * names: gamma, {query,key,value}.0.weight_orig/weight_u/weight_v. Details: docs/api.md. */
cf_module *cf_self_attention(int n_channels);

/* DynamicUnet's options; cf_unet_defaults() gives fastai's: blur false, blur_final true, no
 * self-attention, no y_range, last_cross true, bottle false (the decoder's norm_type is None,
 * its activation ReLU and its init kaiming_normal_, as fastai's unet_learner). */
typedef struct cf_unet_opts {
    bool blur, blur_final;
    bool self_attention; /* SelfAttention after conv2 of block n_skips - 3, as fastai */
    bool y_range;        /* SigmoidRange(y_lo, y_hi) on the output map */
    float y_lo, y_hi;
    bool last_cross;
    bool bottle; /* breaks in fastai (the ResBlock no longer fits the final conv): refused */
} cf_unet_opts;
cf_unet_opts cf_unet_defaults(void);
/* fastai's DynamicUnet(encoder, n_out, (img_h, img_w)) on a cut body (e.g. cf_resnet_body);
 * takes ownership of encoder, also on failure. Input (N, n_in, H, W), output (N, n_out, H, W);
 * state-dict names as fastai's ("layers.0.*" the encoder). Structure: docs/api.md. */
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

/* fastai's SimpleCNN(filters, kernel_szs, strides, bn): n_filters - 1 ConvLayers (kernel 3,
 * stride 2 by default; kernel_szs/strides may be NULL), then global average pool and flatten.
 * Output (N, filters[n_filters-1]); fastai's ConvLayer initialisation. */
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
/* fastai's TabularModel: n_cat embeddings (cardinalities include #na#; emb_dims NULL or <= 0:
 * emb_sz_rule) and n_cont continuous columns. Input (N, n_cat + n_cont), codes first as floats;
 * output (N, out_sz). Names and initialisation as fastai's (docs/api.md). */
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
 * Token ids arrive as floats (B, T); padding id 1 (xxpad). Recurrent layers are batch first and
 * carry their hidden state between forwards, detached (truncated BPTT); cf_rnn_reset zeroes it. */

/* nn.LSTM(input_size, hidden_size, batch_first=True): (B, T, I) -> (B, T, H), PyTorch's parameter
 * names, gate order and init. A batch of another size keeps or zero-pads the carried rows. */
cf_module *cf_lstm(int input_size, int hidden_size);
/* fastai's WeightDropout(lstm, weight_p) on weight_hh: takes ownership of the LSTM (child
 * "module"); holds "weight_hh_l0_raw", dropped (scaled) in training forwards. */
cf_module *cf_weight_dropout(cf_module *lstm, float weight_p);
/* Mixed precision for every LSTM and LinearDecoder under root (cf_learner_to_bf16): on, the
 * whole-sequence products (the input projection, dX, dW_ih, dW_hh and the decoder's three) take
 * bf16 operands with fp32 sums through cf_sgemm_bf16 (fp32 without bf16 kernels); the recurrent
 * step h W_hh^T and its dh, the gates, cell state, carried state, biases and every reduction stay
 * fp32. Off: fp32 again. Returns how many layers it set. */
int cf_lstm_set_bf16(cf_module *root, bool on);
/* Zeroes the hidden state of every LSTM under m. */
void cf_rnn_reset(cf_module *m);
/* fastai's RNNDropout(p): input (B, ..., F), one mask (B, 1, F) per forward, shared over time. */
cf_module *cf_rnn_dropout(float p);
/* An RNNDropout's p (-1 when m is not one): a training forward scales kept values by
 * 1 / (1 - p). */
float cf_rnn_dropout_p(const cf_module *m);
/* fastai's EmbeddingDropout over nn.Embedding(vocab_size, dim, padding_idx): (B, T) ids ->
 * (B, T, dim); training drops whole rows of the table; the padding row gets no gradient; an id
 * outside [0, vocab) gives a zero row. */
cf_module *cf_embedding_dropout(int vocab_size, int dim, float embed_p, int pad_idx);
/* fastai's LinearDecoder(n_out, n_hid, output_p, tie_encoder, bias): RNNDropout then logits
 * (B, T, n_out). With tied_encoder the weight is the encoder's table (no "decoder.weight"). */
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

/* fastai's AWD_LSTM with the config's dropouts times drop_mult: (B, T) ids -> (B, T, emb_sz).
 * Children named as fastai's state_dict ("encoder", "rnns.<l>", "input_dp", "hidden_dps.<l>"). */
cf_module *cf_awd_lstm(int vocab_size, const cf_awd_lstm_config *config, float drop_mult);
/* fastai's get_language_model(AWD_LSTM, vocab_sz, config, drop_mult): Sequential("0" AWD_LSTM,
 * "1" LinearDecoder(vocab, emb_sz, output_p, tied to the encoder when tie_weights, out_bias)).
 * Output: logits (B, T, vocab). NULL config: awd_lstm_lm_config. */
cf_module *cf_awd_lstm_lm(int vocab_size, const cf_awd_lstm_config *config, float drop_mult);
/* fastai's language-model splitter: groups [rnns.0], [rnns.1], ..., [encoder + decoder]
 * (n_layers + 1 groups). model->root must come from cf_awd_lstm_lm. */
cf_status cf_split_awd_lstm_lm(struct cf_model *model);

/* fastai's language model outputs for RNNRegularizer: raw_out (the AWD_LSTM's output) and out
 * (the decoder's input after dropout) of the last forward; NULL before one or for other models. */
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
 * "module"). Input (B, T) ids front-padded in bptt chunks; output (B, K, emb_sz) for the chunks
 * within the last max_len (< 0: all; must be >= bptt). Chunking, backward and sharding:
 * docs/api.md. */
cf_module *cf_sentence_encoder(int bptt, cf_module *awd_lstm, int pad_idx, int max_len);
/* fastai's PoolingLinearClassifier(dims, ps, bptt) after `encoder` (a cf_sentence_encoder):
 * masked concat pool (B, 3E), then LinBnDrop layers over dims (dims[0] must be 3E). Output
 * (B, dims[n_dims - 1]) logits. */
cf_module *cf_pooling_linear_classifier(const cf_module *encoder, const int *dims, int n_dims,
                                        const float *ps);

typedef struct cf_text_classifier_opts {
    int seq_len;         /* bptt of the SentenceEncoder; 0: 72 */
    int max_len;         /* 0: 72 * 20 = 1440; < 0: no limit */
    const int *lin_ftrs; /* hidden sizes of the head; NULL: {50} */
    int n_lin_ftrs;
    const float *ps; /* n_lin_ftrs dropouts after the first block's; NULL: 0.1 each */
} cf_text_classifier_opts;

/* fastai's get_text_classifier: Sequential("0" cf_sentence_encoder over cf_awd_lstm, "1"
 * cf_pooling_linear_classifier [3 emb_sz, *lin_ftrs, n_class]); fastai's state_dict names.
 * NULL config: awd_lstm_clas_config; NULL opts: the defaults. */
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
