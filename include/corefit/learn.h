/* corefit/learn.h — the Learner: fastai's training loop, callbacks, schedules, fit methods,
 * lr_find, fine_tune, get_preds, metrics and the Recorder. Options are passed by name; a field
 * left at zero takes fastai's default:  cf_fit_one_cycle(learn, 5, .lr_max = CF_SLICE(2e-3));
 * Background and file formats: docs/api.md. */
#ifndef COREFIT_LEARN_H
#define COREFIT_LEARN_H

#include <stdio.h>

#include "corefit/core.h"
#include "corefit/data.h"
#include "corefit/nn.h"
#include "corefit/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cf_learner cf_learner;
typedef struct cf_callback cf_callback;
typedef struct cf_comm cf_comm;
typedef struct cf_lr_find_result cf_lr_find_result;

/* ---- learning rates: fastai's scalar, slice(stop) and slice(start, stop) ------------------- */

typedef enum cf_lr_kind { CF_LR_UNSET = 0, CF_LR_SCALAR, CF_LR_SLICE } cf_lr_kind;
/* stop comes first so that a plain number where an lr goes (`.lr_max = 1e-2`, which C reads as
 * {.stop = 1e-2}) means that number, as a scalar lr. */
typedef struct cf_lr {
    double stop;     /* the value, or the slice's stop */
    cf_lr_kind kind; /* CF_LR_UNSET with stop != 0: the scalar stop */
    double start;    /* slice start; 0 for slice(stop) */
} cf_lr;
#define CF_LR(x) ((cf_lr){.kind = CF_LR_SCALAR, .stop = (x)})
/* slice(stop): every group but the last at stop/10, the last at stop. */
#define CF_SLICE(stop_) ((cf_lr){.kind = CF_LR_SLICE, .stop = (stop_)})
/* slice(start, stop): geometric from start (first group) to stop (last group). */
#define CF_SLICE2(start_, stop_) ((cf_lr){.kind = CF_LR_SLICE, .start = (start_), .stop = (stop_)})
/* Per-group values of an lr for n groups (fastai's set_hyper with slices). */
void cf_lr_expand(cf_lr lr, int n_groups, double *out);

/* ---- events and callbacks ------------------------------------------------------------------ */

typedef enum cf_event {
    CF_EV_AFTER_CREATE,
    CF_EV_BEFORE_FIT,
    CF_EV_BEFORE_EPOCH,
    CF_EV_BEFORE_TRAIN,
    CF_EV_BEFORE_BATCH,
    CF_EV_AFTER_PRED,
    CF_EV_AFTER_LOSS,
    CF_EV_BEFORE_BACKWARD,
    CF_EV_AFTER_CANCEL_BACKWARD,
    CF_EV_AFTER_BACKWARD,
    CF_EV_BEFORE_STEP,
    CF_EV_AFTER_CANCEL_STEP,
    CF_EV_AFTER_STEP,
    CF_EV_AFTER_CANCEL_BATCH,
    CF_EV_AFTER_BATCH,
    CF_EV_AFTER_CANCEL_TRAIN,
    CF_EV_AFTER_TRAIN,
    CF_EV_BEFORE_VALIDATE,
    CF_EV_AFTER_CANCEL_VALIDATE,
    CF_EV_AFTER_VALIDATE,
    CF_EV_AFTER_CANCEL_EPOCH,
    CF_EV_AFTER_EPOCH,
    CF_EV_AFTER_CANCEL_FIT,
    CF_EV_AFTER_FIT,
    CF_EV_COUNT
} cf_event;

/* fastai's event name ("before_fit", ...). */
const char *cf_event_name(cf_event ev);

/* fastai's Cancel*Exception, requested with cf_learner_cancel from a callback. */
typedef enum cf_cancel {
    CF_CANCEL_NONE = 0,
    CF_CANCEL_BATCH,
    CF_CANCEL_TRAIN,
    CF_CANCEL_VALIDATE,
    CF_CANCEL_EPOCH,
    CF_CANCEL_STEP,
    CF_CANCEL_BACKWARD,
    CF_CANCEL_FIT,
} cf_cancel;

typedef cf_status (*cf_event_fn)(cf_callback *cb, cf_learner *learn);

/* A callback: a table of event functions plus its state. Events of the inner loop (before_batch
 * ... after_batch) run in training unless skip_train, in validation unless skip_valid. Callbacks
 * run sorted by order (stable). A failing event function stops the fit with its status. */
struct cf_callback {
    const char *name;
    int order;
    bool skip_train, skip_valid;
    cf_event_fn on[CF_EV_COUNT];
    void *state;
    /* Frees state and the callback itself; NULL for callbacks the caller owns (static). */
    void (*free)(cf_callback *cb);
    /* Optional (NULL: state does not outlive a fit): the callback's state as bytes, so it comes
     * home from a parallel fit. export_state returns the size needed (buf NULL to ask);
     * import_state returns CF_ERR_INVALID on bytes that are not its state, callback unchanged. */
    size_t (*export_state)(const cf_callback *cb, void *buf, size_t size);
    cf_status (*import_state)(cf_callback *cb, const void *buf, size_t size);
    bool running; /* internal: false after a callback asked to stop itself (fastai's run) */
};

/* fastai's orders for the built-in callbacks. */
enum {
    CF_ORDER_TRAIN_EVAL = -10,
    CF_ORDER_TERMINATE_ON_NAN = -9,
    CF_ORDER_GRAD_ACCUMULATION = 6,
    CF_ORDER_PARALLEL = 8, /* the par layer's callback: gradients are all-reduced at before_step,
                              after gradient accumulation and before gradient clipping */
    CF_ORDER_GRAD_CLIP = 11,
    CF_ORDER_DEFAULT = 0,
    CF_ORDER_RECORDER = 50,
    CF_ORDER_SCHEDULER = 60,
    CF_ORDER_PROGRESS = 60,
    CF_ORDER_SAVE_MODEL = 61,
    CF_ORDER_REDUCE_LR = 62,
    CF_ORDER_EARLY_STOPPING = 63,
};

/* Frees a callback through its free function (no-op for NULL or caller-owned callbacks). */
void cf_callback_free(cf_callback *cb);
/* A new callback: name (a string that outlives it), order, running, no event functions, and
 * state_size zeroed bytes of state (state NULL when 0). Its free releases the state and the
 * callback; a callback whose state owns more sets its own free. NULL when out of memory. */
cf_callback *cf_callback_new(const char *name, int order, size_t state_size);

/* ---- metrics ------------------------------------------------------------------------------- */

/* A metric accumulates additive statistics (sums, counts, confusion counts) in acc, so that
 * the sum of several processes' acc is the metric over their union (the par layer all-reduces
 * acc). value() turns acc into the metric. */
typedef struct cf_metric cf_metric;
struct cf_metric {
    char name[48];
    int n_acc;
    double *acc;
    /* Adds one batch; samples with pad[i] true (may be NULL) are left out. pred is the model's
     * raw output (before the loss activation); targ as in cf_batch.y. */
    void (*accumulate)(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ, const bool *pad);
    double (*value)(const cf_metric *m);
    void *state;
    void (*free)(cf_metric *m);
    bool lower_is_better; /* for trackers: error_rate, mse, ... */
};
/* fastai's metrics. Frees with cf_metric_free. */
cf_metric *cf_accuracy(void);
cf_metric *cf_error_rate(void);
cf_metric *cf_top_k_accuracy(int k);
/* Binary (pos_label 1) when n_classes == 2 and !macro; otherwise macro-averaged over classes. */
cf_metric *cf_precision(int n_classes, bool macro);
cf_metric *cf_recall(int n_classes, bool macro);
cf_metric *cf_f1_score(int n_classes, bool macro);
cf_metric *cf_mse_metric(void);
cf_metric *cf_mae(void);
cf_metric *cf_rmse(void);
/* A user metric averaged over samples as fastai's AvgMetric: fn returns the batch mean over
 * the n non-padding rows it is given. */
typedef double (*cf_batch_metric_fn)(const cf_tensor *pred, const cf_tensor *targ, const bool *pad,
                                     int *n_counted);
cf_metric *cf_avg_metric(const char *name, cf_batch_metric_fn fn);
void cf_metric_reset(cf_metric *m);
void cf_metric_free(cf_metric *m);
/* NaN when nothing was accumulated. */
double cf_metric_value(const cf_metric *m);

/* ---- metrics of multi-label and segmentation tasks (fastai's metrics.py) --------------------
 * pred is the model's raw output. Multi-label: pred and targ (B, C), targ 0/1. Segmentation:
 * pred (B, C, H, W) logits, targ (B, H, W) class codes (the argmax over axis 1). */

/* sklearn's averages for the multi-label scores: per-class scores' mean, global counts, by
 * support, per-sample scores' mean (undefined scores count 0). */
typedef enum cf_multi_average {
    CF_AVERAGE_MACRO = 0,
    CF_AVERAGE_MICRO,
    CF_AVERAGE_WEIGHTED,
    CF_AVERAGE_SAMPLES,
} cf_multi_average;
/* accuracy_multi(thresh, sigmoid): per batch the mean over B * C of (p > thresh) == targ, p the
 * sigmoid of pred unless no_sigmoid, averaged over batches by samples (thresh <= 0: 0.5). */
cf_metric *cf_accuracy_multi(float thresh, bool no_sigmoid);
/* FBetaMulti(beta, thresh, sigmoid, average) over the whole set: predicted where
 * p >= thresh (thresh <= 0: 0.5); F = (1 + b^2) TP / ((1 + b^2) TP + b^2 FN + FP). Named
 * "fbeta_score" ("f1_score" for beta 1). */
cf_metric *cf_fbeta_multi(double beta, int n_classes, cf_multi_average average, float thresh,
                          bool no_sigmoid);
/* F1ScoreMulti(): cf_fbeta_multi with beta 1, thresh 0.5, sigmoid. */
cf_metric *cf_f1_score_multi(int n_classes, cf_multi_average average);
/* foreground_acc(bkg_idx): per batch the accuracy over pixels whose target is not bkg_idx,
 * averaged over batches by samples (a batch with no such pixel is left out). */
cf_metric *cf_foreground_acc(int bkg_idx);
/* Dice (binary): 2 * sum(p * t) / sum(p + t) over the whole set, p the argmax class; NaN (fastai's
 * None) when the union is 0. JaccardCoeff: inter / (union - inter). */
cf_metric *cf_dice(void);
cf_metric *cf_jaccard_coeff(void);
/* DiceMulti: per class c (background included) 2 * #(p = c and t = c) / (#(p = c) + #(t = c)),
 * the mean over classes whose union is not 0. */
cf_metric *cf_dice_multi(int n_classes);

/* ---- the Recorder -------------------------------------------------------------------------- */

typedef struct cf_recorder {
    /* per training batch */
    double *lrs, *moms, *losses; /* lr and mom of the last group; smoothed (debiased) loss */
    int64_t n_batches, batch_capacity;
    /* per epoch: values[e * n_values + j], columns = metric_names[1 .. n_names-2]
     * (train_loss, valid_loss, metrics...) ; NaN for a column that was cancelled */
    double *values;
    int64_t *iters; /* cumulative number of training batches at the end of each epoch */
    double *times;  /* seconds per epoch */
    int n_epochs, epoch_capacity;
    int n_values;
    char **metric_names; /* "epoch", "train_loss", "valid_loss", metrics..., "time" */
    int n_names;
    /* the schedule: hps per training batch recorded by the ParamScheduler (lr and mom) */
    double *hp_lr, *hp_mom;
    int64_t n_hps;
    /* smoothed loss state (fastai AvgSmoothLoss, beta 0.98, reset per fit) */
    double smooth_val;
    int64_t smooth_count;
    /* validation loss of the current pass (fastai AvgLoss), padding excluded; the par layer
     * sums these over replicas before after_validate */
    double valid_loss_total, valid_loss_count;
    double epoch_start; /* cf_now() at before_epoch */
    bool cancel_train, cancel_valid;
} cf_recorder;

/* Writes the per-epoch table as CSV (fastai's CSVLogger format) or the whole recorder as JSON. */
cf_status cf_recorder_write_csv(const cf_recorder *rec, const char *path);
cf_status cf_recorder_write_json(const cf_recorder *rec, const char *path);
/* Deep copy (dst is cleared first). */
cf_status cf_recorder_copy(cf_recorder *dst, const cf_recorder *src);
void cf_recorder_clear(cf_recorder *rec);
/* The whole recorder as bytes (versioned format "CFRE" v1, host byte order: for moving state
 * between processes of one program). Export returns the bytes needed and writes them only when
 * size is at least that (buf may be NULL to ask). Import reads into a new recorder and replaces
 * *rec only when every length was checked against size and the limits (1e9 batches, 1e6
 * epochs, 1e4 columns); otherwise CF_ERR_INVALID naming the offset and value, *rec unchanged. */
size_t cf_recorder_export(const cf_recorder *rec, void *buf, size_t size);
cf_status cf_recorder_import(cf_recorder *rec, const void *buf, size_t size);

/* ---- the Learner --------------------------------------------------------------------------- */

/* The Learner's options (fastai's Learner arguments); shared by the learner factories. */
#define CF_LEARNER_FIELDS                                                                          \
    cf_loss loss;      /* default: cross-entropy for classes, MSE otherwise */                     \
    bool loss_set;     /* use .loss as given */                                                    \
    cf_opt_config opt; /* default: fastai's Adam (set .opt_set to use .opt) */                     \
    bool opt_set;                                                                                  \
    double lr;           /* 1e-3 */                                                                \
    double wd;           /* 0: the optimizer's default (Adam 0.01) */                              \
    bool wd_bn_bias;     /* false */                                                               \
    bool no_train_bn;    /* fastai's train_bn=False */                                             \
    double moms[3];      /* (0.95, 0.85, 0.95) */                                                  \
    cf_metric **metrics; /* taken over */                                                          \
    int n_metrics;                                                                                 \
    cf_callback **cbs; /* taken over */                                                            \
    int n_cbs;                                                                                     \
    const char *path;      /* "." ; model files go to path/model_dir */                            \
    const char *model_dir; /* "models" */                                                          \
    bool quiet;            /* no progress display */                                               \
    uint64_t seed

typedef struct cf_learner_opts {
    CF_LEARNER_FIELDS;
} cf_learner_opts;

/* What makes a learner one replica of a data-parallel group. A single-process learner has
 * comm NULL, is_master true, rank 0, world 1; the par layer sets the rest for a parallel call
 * and restores these afterwards. */
typedef struct cf_replica {
    cf_comm *comm;            /* the group (NULL: single process) */
    bool is_master;           /* rank 0 (or single process): prints, plots, runs master callbacks */
    int rank, world;          /* this replica's shard of the data (world 1: the whole set), also */
    cf_shard_mode shard_mode; /* applied to loaders made on the fly (get_preds) */
    /* called by the loop at the end of every batch and epoch so that every replica agrees on a
     * pending cancellation requested on any of them (NULL: single process) */
    cf_status (*sync_cancel)(cf_learner *learn);
    /* the OR of a flag over every replica, a collective: every replica must call it at the
     * same point. Callbacks that must decide alike everywhere use it (NULL: single process) */
    cf_status (*agree_any)(cf_learner *learn, bool flag, bool *any);
    /* collectives for checkpoints (NULL: single process): rank 0's `bytes` of buf copied into
     * every replica's buf; every replica's `bytes` of send concatenated in rank order into recv
     * on rank 0 (recv ignored elsewhere) */
    cf_status (*broadcast)(cf_learner *learn, void *buf, size_t bytes);
    cf_status (*gather)(cf_learner *learn, const void *send, size_t bytes, void *recv);
} cf_replica;

/* The state a fit exposes to callbacks (fastai's Learner attributes). */
/* How a learner factory built the model: what cf_learner_export writes so that
 * cf_load_learner (and the corefit command) can build it again. All zero for a learner made
 * with cf_learner_new from a hand-made model. */
typedef struct cf_learner_recipe {
    char arch[32]; /* cf_arch_name(arch), "tabular", or "" when not made by a factory */
    int n_out;
    /* vision_learner's head, as asked (0 / false: the arch's default) */
    int n_lin_ftrs;
    int lin_ftrs[CF_HEAD_MAX_LAYERS];
    int n_ps;
    float ps[CF_HEAD_MAX_LAYERS + 1];
    bool no_concat_pool, no_first_bn, bn_final;
    /* tabular_learner */
    int n_layers;
    int layers[CF_TABULAR_MAX_LAYERS];
    float tab_ps, embed_p;
    bool y_range;
    float y_lo, y_hi;
    /* text classifier: the SentenceEncoder's seq_len and max_len (0: fastai's 72 and 1440) */
    int text_seq_len, text_max_len;
    /* vision targets other than one class: multi-hot label sets, or n_points (x, y) points
     * (regression otherwise when the training set has no classes) */
    bool multi_label;
    int n_points;
    /* unet_learner ("unet-<body>"): DynamicUnet's options as built (exported as corefit.unet) */
    cf_unet_opts unet;
} cf_learner_recipe;

struct cf_learner {
    cf_dls *dls;     /* borrowed (owned when made by cf_load_learner) */
    cf_model *model; /* owned */
    cf_loss loss;
    cf_opt_config opt_config;
    cf_optimizer *opt; /* created lazily (create_opt) */
    cf_metric **metrics;
    int n_metrics;
    cf_callback **cbs; /* the learner's callbacks, default ones included */
    int n_cbs;
    cf_callback **master_cbs; /* run on rank 0 only in parallel fits */
    int n_master_cbs;
    double lr, wd;
    bool wd_bn_bias, train_bn;
    double moms[3];
    char *path, *model_dir;
    bool quiet;
    uint64_t seed;
    cf_recorder recorder;

    /* during a fit */
    int n_epoch, epoch;
    int64_t iter, n_iter, train_iter;
    double pct_train;
    bool training;
    cf_dataloader *dl;
    const cf_batch *batch;
    const cf_tensor *pred;
    float loss_value; /* this batch's mean loss */
    /* fastai's loss_grad scaling: the loop sets it to 1 before after_loss of each batch and
     * multiplies dL/dpred by it before backward (0 counts as 1); GradientAccumulation sets it. */
    float loss_grad_scale;
    double smooth_loss;
    cf_cancel cancel; /* set by cf_learner_cancel */
    bool logging;     /* false inside lr_find / validate / get_preds (no_logging) */
    bool in_lr_find;
    double *final_record; /* [valid_loss, metrics...] of the last validation */
    int n_final_record;
    /* per-call callbacks sorted with the learner's, rebuilt for each fit */
    cf_callback **active;
    int n_active;
    /* memory reused across batches */
    cf_tensor dpred;
    float *per_item_loss;
    int64_t scratch_rows;
    bool validating; /* inside validate/get_preds: the Recorder keeps its history */
    /* the data-parallel group this learner is one replica of (set by the par layer) */
    cf_replica replica;
    /* figures written during fits (paths), oldest first: they come home from parallel fits */
    char **figures;
    int n_figures;
    cf_learner_recipe recipe;
    cf_dls *owned_dls; /* freed with the learner (cf_load_learner's placeholder data) */
    /* internal, during a fit: the fit's parameters as a checkpoint records them, and the
     * checkpoint a resumed fit continues from until its position is reached */
    char *fit_params;
    struct cf__resume *resume;
    /* the training epochs earlier fits began (lr_find's included): epoch e of a fit shuffles,
     * augments, mixes and draws dropout as epoch data_epochs + e, so consecutive fits (fine_tune,
     * ULMFiT's gradual unfreezing) continue one stream as fastai's DataLoader RNG does; part of
     * the learner's state (it comes home from cf_par_ twins and is kept in checkpoints) */
    int64_t data_epochs;
};

#define cf_learner_new(...) CF_CALL3_(cf_learner_new_, cf_learner_opts, __VA_ARGS__, )
/* Takes ownership of model, metrics and callbacks (also on failure). dls is borrowed and must
 * outlive the learner. */
cf_status cf_learner_new_(cf_learner **out, cf_dls *dls, cf_model *model,
                          const cf_learner_opts *opts);
void cf_learner_free(cf_learner *learn);
cf_status cf_learner_add_cb(cf_learner *learn, cf_callback *cb);
/* Removes (and frees) the learner's callbacks with this name; returns how many. */
int cf_learner_remove_cb(cf_learner *learn, const char *name);
cf_status cf_learner_add_master_cbs(cf_learner *learn, cf_callback **cbs, int n);
int cf_learner_remove_master_cbs(cf_learner *learn, const char *name);
/* Requests a cancellation (from a callback). */
void cf_learner_cancel(cf_learner *learn, cf_cancel what);
cf_status cf_learner_create_opt(cf_learner *learn);
/* fastai's freeze_to / freeze / unfreeze (creates the optimizer if needed, clears its state). */
cf_status cf_learner_freeze_to(cf_learner *learn, int n);
cf_status cf_learner_freeze(cf_learner *learn);
cf_status cf_learner_unfreeze(cf_learner *learn);
/* fastai's learn.to_fp16(), in bfloat16: Linear and Conv2d compute with bf16 operands and fp32
 * sums; weights, gradients and optimizer state stay fp32; no loss scaling. Without bf16 kernels
 * it changes nothing (says so once on stderr) and returns CF_OK. Details: docs/api.md. */
cf_status cf_learner_to_bf16(cf_learner *learn);
/* fastai's to_fp32(): every layer back to fp32 compute. */
cf_status cf_learner_to_fp32(cf_learner *learn);
/* Weights, buffers and (with_opt) optimizer state, atomically (path/model_dir/name.safetensors
 * when name has no '/'). */
cf_status cf_learner_save(cf_learner *learn, const char *name, bool with_opt);
cf_status cf_learner_load(cf_learner *learn, const char *name, bool with_opt);
/* fastai's export: weights and buffers (a plain safetensors state_dict) plus, as metadata, what
 * rebuilds the model and prepares its input (cf_model_info; keys in docs/api.md). The model file
 * `corefit train` writes and cf_load_learner reads. */
cf_status cf_learner_export(cf_learner *learn, const char *path);

/* ---- the metadata of an exported model (safetensors __metadata__ keys: docs/api.md) ------- */
#define CF_MODEL_MAX_NORM 4
typedef struct cf_model_info {
    cf_learner_recipe recipe; /* arch, n_out, head or tabular layers */
    char input[16];
    int n_in; /* image channels, or tabular features (n_cat + n_cont) */
    int height, width;
    char **vocab; /* n_vocab class names (classifiers) */
    int n_vocab;
    int n_norm; /* image normalisation */
    float mean[CF_MODEL_MAX_NORM], std[CF_MODEL_MAX_NORM];
    /* images: the item transform of training (kind CF_ITEM_TFM_NONE: squished to the size),
     * used again by eval, predict and load_learner (validation choice), and the batch
     * augmentations of training (has_batch_tfms false: not recorded; has_aug false: none) */
    cf_item_tfm item_tfm;
    bool has_batch_tfms, has_aug;
    cf_aug_opts aug;
    /* tabular */
    char *target;
    bool regression;
    int n_cat, n_cont;
    char **feature_names; /* n_cat + n_cont */
    char ***cat_vocab;    /* per categorical feature ([0] = "#na#") */
    int *cat_cardinality; /* per categorical feature */
    char **flag_of;       /* per categorical feature: the continuous column of a _na flag */
    float *cont_mean, *cont_std, *cont_fill;
    /* text: the token vocabulary, the tokenizer's settings, the AWD-LSTM's sizes (emb_sz, n_hid,
     * n_layers; dropouts are the config's) and, for a classifier, seq_len and max_len in
     * recipe.text_seq_len / text_max_len and the head's hidden sizes in recipe.lin_ftrs */
    char **text_vocab;
    int n_text_vocab;
    cf_text_tok_options tok;
    int emb_sz, n_hid, n_layers;
} cf_model_info;

void cf_model_info_free(cf_model_info *info);
/* What cf_learner_export would write for this learner (its recipe, its training set, its
 * training loader's normalisation). */
cf_status cf_learner_info(const cf_learner *learn, cf_model_info *info);
/* Writes model with info as metadata (the tensors are exactly cf_learner_export's). */
cf_status cf_model_export(const cf_model *model, const cf_model_info *info, const char *path);
/* Reads an exported file's metadata; a file without corefit.arch is refused with a message
 * saying that the model cannot be rebuilt from it. */
cf_status cf_model_info_read(const char *path, cf_model_info *info);
struct cf_st_file;
cf_status cf_model_info_from_file(const struct cf_st_file *file, const char *path,
                                  cf_model_info *info);
/* Encodes a table's rows as the exported tabular model was trained (Categorify with its
 * vocabularies, FillMissing, Normalize with its statistics). With need_target the target column
 * must be present. Values a vocabulary has not seen become #na# (code 0); *n_unseen (may be
 * NULL) receives how many cells did. */
cf_status cf_tabular_encode(const cf_model_info *info, const cf_csv_table *table, bool need_target,
                            cf_dataset **out, int64_t *n_unseen);

/* A learner of an exported model's architecture and head over dls (borrowed), quiet, with the
 * metrics taken over; the weights are not loaded (cf_model_load does that). */
cf_status cf_learner_from_info(const cf_model_info *info, cf_dls *dls, cf_metric **metrics,
                               int n_metrics, cf_learner **out);
/* fastai's load_learner: the learner exported to path, ready to predict (its data is a
 * placeholder that carries the classes, image size, normalisation and tabular columns). */
cf_status cf_load_learner(const char *path, cf_learner **out);
/* fastai's learn.predict on an image (PNG, JPEG, BMP), decoded and resized as the training
 * images were (the training set's item_tfm in its validation choice, e.g. Resize crop's centre
 * crop; without one squished to the size) and normalised as the training loader did: probabilities
 * (n_out) into probs and the class index into decoded (may be NULL). From memory (name for
 * messages) or from a file. */
cf_status cf_predict_image(cf_learner *learn, const void *bytes, size_t size, const char *name,
                           float *probs, int *decoded);
cf_status cf_predict_image_file(cf_learner *learn, const char *path, float *probs, int *decoded);
/* Records a figure written during a fit (used by plotting callbacks); a path already recorded is
 * not added again (a figure redrawn every epoch is one figure). */
cf_status cf_learner_note_figure(cf_learner *learn, const char *path);

/* Everything a fit changes in a learner (weights, buffers, freezing, optimizer and state,
 * Recorder, figures, callback states) as bytes ("CFLS" v1, host byte order). Export returns the
 * size needed (buf NULL to ask); import replaces the state only when all of it checks, else
 * CF_ERR_INVALID naming part, offset and value, learner unchanged. */
size_t cf_learner_export_state(const cf_learner *learn, void *buf, size_t size);
cf_status cf_learner_import_state(cf_learner *learn, const void *buf, size_t size);
/* Internal (the par layer's fork runner): import_state, calling consumed(p, n, ctx) on the part
 * of buf that the import has copied and will not read again (the optimizer state, once it is
 * in the new optimizer), so that the caller can give those pages back before the rest is
 * copied. consumed may be NULL. */
cf_status cf__learner_import_state_consuming(cf_learner *learn, const void *buf, size_t size,
                                             void (*consumed)(const void *p, size_t n, void *ctx),
                                             void *ctx);

/* ---- fit methods --------------------------------------------------------------------------- */

/* How the replicas of a parallel twin start. CF_START_AUTO: mpi when the program was started by
 * mpirun, else fork. */
typedef enum cf_start_method { CF_START_FORK = 0, CF_START_MPI, CF_START_AUTO } cf_start_method;

/* The options of the parallel twins (corefit/par.h): the .par member of every fit method's
 * options (cf_fit_common below), ignored by the single-process methods. Declared here, below
 * the par layer, because it travels in those options. */
typedef struct cf_par_opts {
    int num_cores; /* worker processes (0: the cores this process may run on) */
    cf_start_method start_method;
    cf_callback **master_cbs; /* run on rank 0 only for this call (taken over) */
    int n_master_cbs;
    bool split_batch;  /* cut each global batch across cores (results = 1 process) */
    double deadline_s; /* a worker silent this long is declared hung (0: 120 s) */
    bool sync_bn;      /* BatchNorm statistics over the whole batch of every replica */
    int max_restarts;  /* fork: a lost worker restarts the group from the last commit, at most
                          this many times (0: a lost worker ends the call) */
    int commit_every;  /* fork with max_restarts: training batches between commits (0: the
                          default, CF_PAR_COMMIT_EVERY) */
} cf_par_opts;

/* The default of .par.commit_every: a commit every 50 training batches costs about 1% of a W1
 * epoch on fork workers (bench/bench_w1.c --commit-every). */
#define CF_PAR_COMMIT_EVERY 50

/* Options shared by every fit method (validate and get_preds use cbs and par only). */
#define CF_FIT_COMMON_FIELDS                                                                       \
    double wd;         /* 0: learner's wd, else the optimizer's default */                         \
    cf_callback **cbs; /* for this call only (taken over) */                                       \
    int n_cbs;                                                                                     \
    bool reset_opt;                                                                                \
    int start_epoch;                                                                               \
    const char *resume; /* a checkpoint (cf_checkpoint_cb) to continue from; see below */          \
    cf_par_opts par     /* the parallel twins' options (corefit/par.h); ignored by cf_X */
typedef struct cf_fit_common {
    CF_FIT_COMMON_FIELDS;
} cf_fit_common;
/* Every options struct begins with this member: its fields read directly (o->cbs, .par.num_cores
 * = 8 in a call), and o->common is the same memory as a cf_fit_common, which is how the par layer
 * handles every method alike (a union of structs with a common initial sequence). */
#define CF_FIT_COMMON                                                                              \
    union {                                                                                        \
        cf_fit_common common;                                                                      \
        struct {                                                                                   \
            CF_FIT_COMMON_FIELDS;                                                                  \
        };                                                                                         \
    }

typedef struct cf_fit_opts {
    CF_FIT_COMMON;
    cf_lr lr; /* unset: learner's lr */
} cf_fit_opts;

typedef struct cf_one_cycle_opts {
    CF_FIT_COMMON;
    cf_lr lr_max;       /* unset: learner's lr */
    double div;         /* 25 */
    double div_final;   /* 1e5 */
    double pct_start;   /* 0.25 */
    const double *moms; /* 3 values; NULL: learner's moms */
} cf_one_cycle_opts;

typedef struct cf_flat_cos_opts {
    CF_FIT_COMMON;
    cf_lr lr;         /* unset: learner's lr */
    double div_final; /* 1e5 */
    double pct_start; /* 0.75 */
} cf_flat_cos_opts;

typedef struct cf_sgdr_opts {
    CF_FIT_COMMON;
    cf_lr lr_max;   /* unset: learner's lr */
    int cycle_mult; /* 2 */
} cf_sgdr_opts;

typedef struct cf_fine_tune_opts {
    CF_FIT_COMMON;
    double base_lr;    /* 2e-3 */
    int freeze_epochs; /* 1 (-1 for none) */
    double lr_mult;    /* 100 */
    double pct_start;  /* 0.3 */
    double div;        /* 5 */
} cf_fine_tune_opts;

/* lr_find suggestions (fastai's SuggestionMethod): a bit set. */
enum { CF_SUGGEST_VALLEY = 1, CF_SUGGEST_SLIDE = 2, CF_SUGGEST_MINIMUM = 4, CF_SUGGEST_STEEP = 8 };

typedef struct cf_lr_find_opts {
    CF_FIT_COMMON;
    double start_lr;  /* 1e-7 */
    double end_lr;    /* 10 */
    int num_it;       /* 100 */
    bool no_stop_div; /* fastai's stop_div=False */
    int suggest;      /* bit set; 0: valley */
    /* Draws the result where lr_find runs (rank 0 of a parallel call) and notes the path on the
     * learner (cf_learner_note_figure), e.g. CF_LR_FIND_PLOT("lr_find.png") from corefit/plot.h,
     * which sets plot = cf_plot_lr_find. A relative path is taken under learn->path. A failed
     * drawing fails the call. NULL: no figure. */
    cf_status (*plot)(const cf_lr_find_result *r, const char *png_path);
    const char *plot_path;
} cf_lr_find_opts;

struct cf_lr_find_result {
    double *lrs, *losses; /* the recorded points */
    int n;
    int suggest;                          /* which suggestions were computed */
    double valley, slide, minimum, steep; /* suggested lrs (NaN: none) */
    double valley_loss, slide_loss, minimum_lr_at, minimum_loss, steep_loss; /* plot points */
};
void cf_lr_find_result_free(cf_lr_find_result *r);
/* The result as bytes ("CFLF" v1) and back; conventions as cf_recorder_export/import (import
 * replaces *r, freeing what it held, only when the bytes read back). */
size_t cf_lr_find_result_export(const cf_lr_find_result *r, void *buf, size_t size);
cf_status cf_lr_find_result_import(cf_lr_find_result *r, const void *buf, size_t size);

cf_status cf_fit_(cf_learner *learn, int n_epoch, const cf_fit_opts *opts);
cf_status cf_fit_one_cycle_(cf_learner *learn, int n_epoch, const cf_one_cycle_opts *opts);
cf_status cf_fit_flat_cos_(cf_learner *learn, int n_epoch, const cf_flat_cos_opts *opts);
cf_status cf_fit_sgdr_(cf_learner *learn, int n_cycles, int cycle_len, const cf_sgdr_opts *opts);
cf_status cf_fine_tune_(cf_learner *learn, int epochs, const cf_fine_tune_opts *opts);
cf_status cf_lr_find_(cf_learner *learn, cf_lr_find_result *result, const cf_lr_find_opts *opts);

#define cf_fit(...) CF_CALL2_(cf_fit_, cf_fit_opts, __VA_ARGS__, )
#define cf_fit_one_cycle(...) CF_CALL2_(cf_fit_one_cycle_, cf_one_cycle_opts, __VA_ARGS__, )
#define cf_fit_flat_cos(...) CF_CALL2_(cf_fit_flat_cos_, cf_flat_cos_opts, __VA_ARGS__, )
#define cf_fit_sgdr(...) CF_CALL3_(cf_fit_sgdr_, cf_sgdr_opts, __VA_ARGS__, )
#define cf_fine_tune(...) CF_CALL2_(cf_fine_tune_, cf_fine_tune_opts, __VA_ARGS__, )
#define cf_lr_find(...) CF_CALL2_(cf_lr_find_, cf_lr_find_opts, __VA_ARGS__, )

/* ---- checkpoints: exact resume ----------------------------------------------------------------
 * A fit with .resume = path continues at the checkpoint's position and ends bitwise as the fit
 * that never stopped. It must be the same call (method, epochs, lrs, data, world size), else
 * CF_ERR_INVALID names the first difference. What is saved and the "CFCK" format: docs/resume.md
 * and docs/api.md. */

/* fastai's SaveModelCallback at batch granularity: a checkpoint every `every_batches` batches and
 * on request (cf_checkpoint_request, or SIGTERM/SIGINT with .signals), after which the fit stops
 * with CF_ERR_INTERRUPTED naming the file. In a parallel fit give it in .cbs (every replica runs
 * it; rank 0 writes). */
typedef struct cf_checkpoint_opts {
    const char *fname; /* "checkpoint": path/model_dir/fname.ckpt when it has no '/', else the
                          path as given */
    int every_batches; /* 0: only on request */
    bool signals;      /* while the callback exists, SIGTERM and SIGINT request a checkpoint
                          (handlers installed at creation, the previous ones put back when it is
                          freed; under fork workers SIGINT stays the launcher's, which stops the
                          call without a checkpoint) */
} cf_checkpoint_opts;
enum { CF_ORDER_CHECKPOINT = 90 };
cf_callback *cf_checkpoint_cb_(const cf_checkpoint_opts *o);
#define cf_checkpoint_cb(...) cf_checkpoint_cb_(CF_OPTS0_(cf_checkpoint_opts, __VA_ARGS__))
/* Asks running fits (and their fork workers) to checkpoint at the next batch boundary and stop.
 * Async-signal-safe. Kept for the next fit when none runs; dropped when a fit ends unserved. */
void cf_checkpoint_request(void);
/* The path a checkpoint callback with this fname writes for this learner (buf of n bytes). */
const char *cf_checkpoint_path(const cf_learner *learn, const char *fname, char *buf, size_t n);

/* lr_find's suggestion functions on recorded curves (fastai's valley, slide, minimum, steep),
 * applied to lrs[num_it/10 : n-5] as fastai does. */
void cf_lr_find_suggest(cf_lr_find_result *r, int num_it, int which);

/* ---- validation and predictions ------------------------------------------------------------ */

typedef struct cf_validate_opts {
    CF_FIT_COMMON;
    bool train_set; /* fastai's ds_idx=0: the training set (default: validation) */
} cf_validate_opts;

typedef struct cf_get_preds_opts {
    CF_FIT_COMMON;
    bool train_set; /* fastai's ds_idx=0: the training set, in order, undropped (default:
                       the validation set) */
    bool with_input;
    bool with_decoded;
    bool with_loss;
    bool raw; /* true: no loss activation (fastai act=noop) */
} cf_get_preds_opts;

/* get_preds' result, in dataset order; owned arrays, free with cf_preds_free. Text: a
 * classifier's rows are its documents; a language model's are the stream's next tokens
 * (docs/api.md); with_input is refused for text. */
typedef struct cf_preds {
    int64_t n;
    cf_tensor preds;  /* (n, C): after the loss activation unless raw */
    cf_tensor targs;  /* (n) or (n, T) */
    cf_tensor inputs; /* with_input */
    int64_t *decoded; /* with_decoded: argmax (classifiers) */
    float *losses;    /* with_loss: per-item loss */
} cf_preds;
void cf_preds_free(cf_preds *p);
/* Predictions as bytes ("CFPR" v1) and back; conventions as cf_recorder_export/import (import
 * replaces *p, freeing what it held, only when the bytes read back). */
size_t cf_preds_export(const cf_preds *p, void *buf, size_t size);
cf_status cf_preds_import(cf_preds *p, const void *buf, size_t size);

/* Returns [valid_loss, metrics...] (n_values = 1 + n_metrics) in values (caller's array). */
cf_status cf_validate_(cf_learner *learn, double *values, const cf_validate_opts *opts);
cf_status cf_get_preds_(cf_learner *learn, cf_preds *out, const cf_get_preds_opts *opts);
#define cf_validate(...) CF_CALL2_(cf_validate_, cf_validate_opts, __VA_ARGS__, )
#define cf_get_preds(...) CF_CALL2_(cf_get_preds_, cf_get_preds_opts, __VA_ARGS__, )
/* fastai's Learner.tta: n augmented get_preds passes (the training loader's augmentations, or
 * .aug) and one plain pass; result lerp(mean (or max) of the augmented, plain, beta). Only preds
 * and targs are filled. Pass i draws as a loader seeded cf_tta_seed(seed, i), so the cf_par_tta
 * twin gives the same result at any core count. Details: docs/api.md. */
typedef struct cf_tta_opts {
    CF_FIT_COMMON;
    bool train_set; /* fastai's ds_idx=0 */
    int n;          /* augmented passes: 4 */
    double beta;    /* the plain predictions' weight, in [0, 1]: 0.25 when 0 (see aug_only) */
    bool aug_only;  /* beta 0: the augmented passes alone */
    bool use_max;
    const cf_aug_opts *aug; /* batch transforms instead of the training loader's (NULL: its
                               crop_pad, flip and aug) */
    bool flip_pass;         /* the airbench habit: one pass with every image mirrored left to right
                               instead of n augmented ones (with beta 0.5: plain and mirrored averaged) */
} cf_tta_opts;
cf_status cf_tta_(cf_learner *learn, cf_preds *out, const cf_tta_opts *opts);
#define cf_tta(...) CF_CALL2_(cf_tta_, cf_tta_opts, __VA_ARGS__, )
/* The loader seed of tta's augmented pass `pass` (0-based) for a training loader seed. */
uint64_t cf_tta_seed(uint64_t seed, int pass);

/* One item (sample_shape floats): class probabilities (or outputs) into probs (n_out), and the
 * decoded class. */
cf_status cf_predict(cf_learner *learn, const float *item, float *probs, int *decoded);
/* fastai's decodes of n rows of predictions after the loss activation (get_preds' preds,
 * predict's probs) into out: for a multi-label learner (BCE) each row's label set as 0/1
 * (p > thresh; names with cf_label_set_str), for a point learner (training set with n_points)
 * the points in pixels of a width x height image (PointScaler's (p + 1) * size / 2; 0: the
 * model's input size), otherwise cf_loss_decodes (argmax class codes, values). Returns the
 * values written (0 for bad arguments). get_preds' `decoded` stays the argmax. */
size_t cf_learner_decodes(const cf_learner *learn, const float *act, int64_t n, int width,
                          int height, float *out);

/* ---- learner factories (fastai's vision_learner and tabular_learner) ---------------------- */

typedef enum cf_arch {
    CF_ARCH_MINI_RESNET, /* W1, the benchmark workload: the default for small images */
    CF_ARCH_SIMPLE_CNN,
    CF_ARCH_XRESNET18,
    CF_ARCH_XRESNET34,
    CF_ARCH_XRESNET50,
    CF_ARCH_RESNET18, /* torchvision's ResNets (cf_resnet_learner_model), fastai's 3 groups */
    CF_ARCH_RESNET34,
    CF_ARCH_RESNET50,
    CF_ARCH_FAST_CNN, /* cf_fast_cnn: corefit train --recipe fast's model for 28 px images */
} cf_arch;

/* "mini-resnet", "simple-cnn", "xresnet18", ..., "resnet50", "fast-cnn"; and back (-1 when
 * unknown). */
const char *cf_arch_name(cf_arch arch);
int cf_arch_from_name(const char *name);

typedef struct cf_vision_opts {
    CF_LEARNER_FIELDS;
    int n_out;              /* 0: the data set's number of classes */
    const char *pretrained; /* a corefit model file of the same arch, or for resnet18/34/50
                               torchvision's or timm's ImageNet weights as safetensors
                               (cf_resnet_load_pretrained): the body is loaded and the learner
                               frozen (fastai's pretrained=True); a resnet's loaders then get
                               ImageNet's normalisation when they have none (fastai's
                               Normalize.from_stats(*imagenet_stats)) */
    bool no_concat_pool;    /* fastai's concat_pool=False */
    int n_lin_ftrs;         /* hidden head layers (0: the arch's default) */
    int lin_ftrs[CF_HEAD_MAX_LAYERS];
    int n_ps; /* 0: the arch's default */
    float ps[CF_HEAD_MAX_LAYERS + 1];
    bool no_first_bn, bn_final;
    bool y_range; /* regression and points: end with SigmoidRange(y_lo, y_hi) (points: -1, 1) */
    float y_lo, y_hi;
} cf_vision_opts;

/* fastai's vision_learner: body + create_head for dls (images (C, H, W); xresnets use their
 * small-image stem when H < 64; n_out: the classes, or for a set without classes its
 * target_dim, fastai's RegressionBlock/PointBlock outputs), body and head parameter groups
 * (resnets: fastai's _resnet_split, body[:6], body[6:], head), kaiming-normal head. */
#define cf_vision_learner(...) CF_CALL3_(cf_vision_learner_, cf_vision_opts, __VA_ARGS__, )
cf_status cf_vision_learner_(cf_learner **out, cf_dls *dls, cf_arch arch,
                             const cf_vision_opts *opts);

/* fastai's unet_learner: cf_unet_model(arch) with n_out the data set's classes (its codes),
 * CrossEntropyLossFlat(axis=1) unless .loss is set, cf_split_unet's three groups (body stem,
 * rest of the encoder, decoder). pretrained: a corefit model file of a U-Net on the same body,
 * whose encoder ("layers.0.*") is copied by name and shape, or torchvision's/timm's ResNet
 * weights of the same depth (cf_resnet_load_pretrained; the caller normalises the images with
 * ImageNet's statistics, as fastai adds Normalize); the learner is then frozen (fastai's
 * pretrained=True). Metrics are the caller's (fastai gives none; the CLI uses foreground_acc
 * and DiceMulti). arch: "resnet18/34/50" or "xresnet18/34/50". */
typedef struct cf_unet_learner_opts {
    CF_LEARNER_FIELDS;
    const char *pretrained;
    const cf_unet_opts *unet; /* NULL: cf_unet_defaults() */
} cf_unet_learner_opts;
#define cf_unet_learner(...) CF_CALL3_(cf_unet_learner_, cf_unet_learner_opts, __VA_ARGS__, )
cf_status cf_unet_learner_(cf_learner **out, cf_dls *dls, const char *arch,
                           const cf_unet_learner_opts *opts);

typedef struct cf_tabular_learner_opts {
    CF_LEARNER_FIELDS;
    int n_layers; /* 0: [200, 100] */
    int layers[CF_TABULAR_MAX_LAYERS];
    float ps; /* dropout of hidden layers */
    float embed_p;
    int n_out;    /* 0: classes, or target_dim for regression */
    bool y_range; /* regression output squashed into [y_lo, y_hi] */
    float y_lo, y_hi;
} cf_tabular_learner_opts;

/* fastai's tabular_learner over a tabular data set (cf_dataset.n_cat, n_cont,
 * cat_cardinality), embedding sizes by fastai's rule. */
#define cf_tabular_learner(...)                                                                    \
    CF_CALL2_(cf_tabular_learner_, cf_tabular_learner_opts, __VA_ARGS__, )
cf_status cf_tabular_learner_(cf_learner **out, cf_dls *dls, const cf_tabular_learner_opts *opts);

/* ---- built-in callbacks -------------------------------------------------------------------- */

/* fastai's tracker callbacks: monitor "valid_loss" (default) or a metric name; comparison
 * chosen as fastai (lower is better for names containing "loss" or "error"). */
typedef struct cf_tracker_opts {
    const char *monitor; /* "valid_loss" */
    double min_delta;
    int patience;      /* EarlyStopping / ReduceLROnPlateau: 1 */
    double factor;     /* ReduceLROnPlateau: 10 */
    double min_lr;     /* ReduceLROnPlateau: 0 */
    const char *fname; /* SaveModel: "model" */
    bool every_epoch;  /* SaveModel */
    bool with_opt;     /* SaveModel */
    bool at_end;       /* SaveModel: save at the end of the fit instead of loading the best */
    int comp;          /* 0: lower is better when the name holds "loss" or "error" (fastai)
                          or the metric says lower_is_better (mse, mae, _rmse); -1: lower is
                          better; 1: higher is better */
} cf_tracker_opts;
cf_callback *cf_save_model_cb_(const cf_tracker_opts *o);
cf_callback *cf_early_stopping_cb_(const cf_tracker_opts *o);
cf_callback *cf_reduce_lr_on_plateau_cb_(const cf_tracker_opts *o);
#define cf_save_model_cb(...) cf_save_model_cb_(CF_OPTS0_(cf_tracker_opts, __VA_ARGS__))
#define cf_early_stopping_cb(...) cf_early_stopping_cb_(CF_OPTS0_(cf_tracker_opts, __VA_ARGS__))
#define cf_reduce_lr_on_plateau_cb(...)                                                            \
    cf_reduce_lr_on_plateau_cb_(CF_OPTS0_(cf_tracker_opts, __VA_ARGS__))
/* fastai's TerminateOnNaNCallback (order -9): a non-finite loss or gradient stops the fit with
 * CF_ERR_NONFINITE naming epoch and batch, before any step; the learner keeps the last good
 * weights and buffers. */
cf_callback *cf_terminate_on_nan_cb(void);
/* fastai's CSVLogger (order 60, master only): "epoch,train_loss,valid_loss,<metrics>,time", a row
 * per epoch. Relative path under learn->path (NULL: "history.csv"). A failed or cancelled fit
 * leaves an existing log as it was; without append the log is replaced atomically. */
cf_callback *cf_csv_logger_cb(const char *path, bool append);
/* fastai's GradientClip (before_step): clip_grad_norm_(trainable params, max_norm) with the
 * 2-norm (max_norm <= 0: 1). */
cf_callback *cf_gradient_clip_cb(double max_norm);
/* fastai's GradientAccumulation (order 6, training only): scales the loss gradient by
 * bs / n_acc (through learn->loss_grad_scale) and cancels the batch before the step (skipping
 * step and zero_grad) until n_acc samples have been seen (n_acc <= 0: 32). */
cf_callback *cf_gradient_accumulation_cb(int n_acc);
/* The progress display (fastai's ProgressCallback, order 60, master only, added unless quiet):
 * live bars on a terminal (stderr), fastprogress's epoch table on stdout while logging. */
cf_callback *cf_progress_cb(void);
/* The same writing the table to `table` and the bars to `bar` (NULL: stdout, stderr); tty 1
 * draws live bars, 0 never, -1 when isatty(bar). */
cf_callback *cf_progress_cb_to(FILE *table, FILE *bar, int tty);
/* fastprogress's format_time: whole seconds (truncated) as "mm:ss", or "h:mm:ss" from an hour.
 * Returns buf. */
const char *cf_format_time(double seconds, char *buf, size_t n);
/* Python's str(float): the shortest repr that reads back exactly ("0.1", "1e-05", "3.0",
 * "nan", "inf"). Returns buf (n >= 32 is always enough). */
const char *cf_format_float(double x, char *buf, size_t n);
/* A parameter scheduler: fn(pos in [0,1), group, ctx) for "lr" and/or "mom" (NULL: not
 * scheduled). Used by the fit methods; public for custom schedules. */
typedef double (*cf_sched_fn)(double pos, int group, const void *ctx);
cf_callback *cf_param_scheduler_cb(cf_sched_fn lr, cf_sched_fn mom, const void *ctx,
                                   size_t ctx_size);

/* fastai's schedule functions (callback/schedule.py). */
double cf_sched_lin(double start, double end, double pos);
double cf_sched_cos(double start, double end, double pos);
double cf_sched_exp(double start, double end, double pos);
double cf_sched_no(double start, double end, double pos);
double cf_combined_cos(double pct, double start, double middle, double end, double pos);

/* ---- MixUp and CutMix (fastai's callback/mixup.py) ------------------------------------------
 * Training batches only; draws keyed by (seed, epoch, batch), so resumed and parallel fits draw
 * alike. Cross-entropy gets fastai's mixed loss, BCE and MSE mixed targets (docs/api.md). */

typedef enum cf_mix_kind { CF_MIX_MIXUP, CF_MIX_CUTMIX } cf_mix_kind;

#define CF_MIX_MAX_BS 4096
/* One batch's draws (fastai's): MixUp lam[i] ~ Beta(alpha, alpha), max(lam, 1 - lam); CutMix
 * one box [x1, x2) x [y1, y2) from rand_bbox and lam = 1 - box/image. perm: the partners. */
typedef struct cf_mix_draws {
    int bs;
    float lam[CF_MIX_MAX_BS];
    int64_t perm[CF_MIX_MAX_BS];
    int x1, y1, x2, y2;
    float drawn_lam;
} cf_mix_draws;

/* The draws for batch `batch` of `epoch` under `seed` (height and width: the images', CutMix
 * only). CF_ERR_INVALID for alpha <= 0, bs outside [1, CF_MIX_MAX_BS] or an empty image. */
cf_status cf_mix_draw(cf_mix_kind kind, double alpha, uint64_t seed, int epoch, int64_t batch,
                      int bs, int height, int width, cf_mix_draws *out);
/* The mixed inputs (x's shape) into out (may be x->data): MixUp lerp(x[perm], x, lam) per
 * sample, CutMix x with the box pasted from x[perm] on every channel. */
cf_status cf_mix_inputs(cf_mix_kind kind, const cf_mix_draws *d, const cf_tensor *x, float *out);
/* Mixed targets lerp(y[perm], y, lam) (y's shape) into out, for BCE and MSE. */
void cf_mix_targets(const cf_mix_draws *d, const cf_tensor *y, float *out);
/* Cross-entropy's mixed targets: class probabilities of pred's shape (class axis as the loss's)
 * with lam at y's class and 1 - lam at y[perm]'s, into out. */
cf_status cf_mix_class_targets(const cf_mix_draws *d, const cf_loss *loss, const cf_shape *pred,
                               const cf_tensor *y, float *out);
/* fastai's MixUp(alpha) (0: 0.4) and CutMix(alpha) (0: 1.0); NULL with cf_last_error for a
 * negative or non-finite alpha. Use as any callback, in a fit's .cbs or the learner's. */
cf_callback *cf_mixup_cb(double alpha);
cf_callback *cf_cutmix_cb(double alpha);

/* ---- text: language models (fastai's text/learner.py, callback/rnn.py) ---------------------
 * Text batches hold x (B, T) token ids (T varies) and, for a language model, y (B, T) next ids.
 * With CF_SHARD_SPLIT_BATCH N workers reproduce one process, dropouts included. */

typedef struct cf_lm_learner_opts {
    CF_LEARNER_FIELDS;
    const cf_awd_lstm_config *config; /* NULL: cf_awd_lstm_lm_config() */
    float drop_mult;                  /* 0: 1 (scales every dropout of the config) */
    double alpha, beta; /* AR and TAR (0: fastai's 2 and 1; negative: that term off) */
} cf_lm_learner_opts;

/* fastai's language_model_learner(dls, AWD_LSTM, config, drop_mult) without pretrained weights:
 * cf_awd_lstm_lm, CrossEntropyLossFlat, moms (0.8, 0.7, 0.8), fastai's splitter, ModelResetter
 * and RNNRegularizer. Other options as cf_learner_new. */
#define cf_language_model_learner(...)                                                             \
    CF_CALL2_(cf_language_model_learner_, cf_lm_learner_opts, __VA_ARGS__, )
cf_status cf_language_model_learner_(cf_learner **out, cf_dls *dls, const cf_lm_learner_opts *opts);

typedef struct cf_text_clas_learner_opts {
    CF_LEARNER_FIELDS;
    const cf_awd_lstm_config *config; /* NULL: cf_awd_lstm_clas_config() */
    float drop_mult;                  /* 0: fastai's 0.5 */
    int n_out;                        /* 0: the training corpus's classes */
    int seq_len;                      /* the SentenceEncoder's bptt; 0: 72 */
    int max_len;                      /* 0: 72 * 20; < 0: no limit */
    const int *lin_ftrs;              /* the head's hidden sizes; NULL: {50} */
    int n_lin_ftrs;
    const float *ps; /* n_lin_ftrs dropouts after the first block's; NULL: 0.1 each */
} cf_text_clas_learner_opts;

/* fastai's text_classifier_learner without pretrained weights: cf_text_classifier, 5-group
 * splitter, CrossEntropyLossFlat (BCE for multi-hot labels), moms (0.8, 0.7, 0.8), ModelResetter.
 * Load a language model's encoder with cf_learner_load_encoder (which freezes). */
#define cf_text_classifier_learner(...)                                                            \
    CF_CALL2_(cf_text_classifier_learner_, cf_text_clas_learner_opts, __VA_ARGS__, )
cf_status cf_text_classifier_learner_(cf_learner **out, cf_dls *dls,
                                      const cf_text_clas_learner_opts *opts);

/* fastai's Perplexity: exp of the validation loss weighted as fastai's (each batch's mean
 * cross-entropy times its rows), so exp(valid_loss) for a language model. Lower is better. */
cf_metric *cf_perplexity(void);

/* fastai's ModelResetter: cf_rnn_reset on the model at before_train, before_validate and
 * after_fit (every language model learner has one). */
cf_callback *cf_model_resetter_cb(void);
/* fastai's RNNRegularizer (training only): adds alpha * AR + beta * TAR to the differentiated
 * loss; the logged loss stays the plain cross-entropy. TAR applies when T > 1. */
cf_callback *cf_rnn_regularizer_cb(double alpha, double beta);
/* The AR and TAR terms (before alpha and beta) of the last training batch. */
cf_status cf_rnn_regularizer_terms(const cf_callback *cb, double *ar, double *tar);

/* fastai's save_encoder / load_encoder: the AWD-LSTM's parameters (its own state_dict names) as
 * safetensors (path/model_dir/name.safetensors unless name holds a '/'). load_encoder checks every
 * name and shape before copying, then resets and freezes; on error the learner is unchanged. */
cf_status cf_learner_save_encoder(cf_learner *learn, const char *name);
cf_status cf_learner_load_encoder(cf_learner *learn, const char *name);

/* fastai's LMLearner.predict on ids: n_words draws from the last position's softmax (xxunk
 * zeroed unless allow_unk, min_p floor, 1 / temperature), seeded with seed. */
typedef struct cf_lm_generate_opts {
    int n_words;        /* 1 */
    double temperature; /* 1 */
    bool allow_unk;     /* fastai's no_unk=False */
    double min_p;       /* 0: none */
    uint64_t seed;
} cf_lm_generate_opts;
/* *out (cf_malloc'd, *n_out ids): the input ids followed by the generated ones. */
cf_status cf_lm_generate_(cf_learner *learn, const int32_t *ids, int64_t n_ids, int32_t **out,
                          int64_t *n_out, const cf_lm_generate_opts *opts);
#define cf_lm_generate(learn, ids, n_ids, out, n_out, ...)                                         \
    cf_lm_generate_((learn), (ids), (n_ids), (out), (n_out),                                       \
                    CF_OPTS0_(cf_lm_generate_opts, __VA_ARGS__))

/* ---- text: classifiers, export and prediction on raw text ---------------------------------- */

/* fastai's learn.predict(text) for a text classifier: tokenized as training's texts, one row in
 * eval mode: probabilities into probs, class index into *decoded and unknown-token count into
 * *n_unknown (both may be NULL). All-unknown text is not an error. */
cf_status cf_predict_text(cf_learner *learn, const char *text, float *probs, int *decoded,
                          int64_t *n_unknown);
/* fastai's LMLearner.predict(text, ...): n_words generated (cf_lm_generate) and the whole
 * sequence decoded into *out (free with cf_free). */
cf_status cf_lm_predict_text(cf_learner *learn, const char *text, const cf_lm_generate_opts *opts,
                             char **out);
/* fastai's show_results for a single-label text classifier: the first max_n (0: 9) validation
 * texts (first max_tokens (0: 150) tokens), target and prediction, tab-separated, to out.
 * CF_ERR_STATE when the learner is not a text classifier with validation texts. */
cf_status cf_text_show_results(cf_learner *learn, int max_n, int max_tokens, FILE *out);
/* ClassificationInterpretation.plot_top_losses for text: the k (0: 9) validation texts with the
 * largest loss, largest first (ties: the earlier text), with target, prediction, the predicted
 * class's probability and the loss; a table as cf_text_show_results writes. */
cf_status cf_text_top_losses(cf_learner *learn, int k, int max_tokens, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
