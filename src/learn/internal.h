/* Internal interfaces of the learn layer (not installed). */
#ifndef CF_LEARN_INTERNAL_H
#define CF_LEARN_INTERNAL_H

#include "corefit/learn.h"
#include "core/bytes.h"

/* fastai's Learner.fit: the loop with every event, for n_epoch epochs, with extra callbacks for
 * this call (taken over). lr may be unset (learner's lr). */
cf_status cf__fit(cf_learner *learn, int n_epoch, cf_lr lr, double wd, cf_callback **extra,
                  int n_extra, bool reset_opt, int start_epoch, const char *resume,
                  const char *method_params);

/* The epoch a training epoch's data draws use: learn->data_epochs + learn->epoch (corefit/learn.h,
 * cf_learner.data_epochs). */
static inline int cf__data_epoch(const cf_learner *learn) {
    return (int)(learn->data_epochs + learn->epoch);
}

/* The file of a model named `name`: path/model_dir/name.safetensors (the folders made when
 * make_dir), or name itself when it holds a '/'. */
cf_status cf__model_file(const cf_learner *learn, const char *name, bool make_dir, char *buf,
                         size_t size);

/* The learner options shared by the factories. */
#define COPY_LEARNER_FIELDS(dst, src)                                                              \
    do {                                                                                           \
        (dst).loss = (src)->loss;                                                                  \
        (dst).loss_set = (src)->loss_set;                                                          \
        (dst).opt = (src)->opt;                                                                    \
        (dst).opt_set = (src)->opt_set;                                                            \
        (dst).lr = (src)->lr;                                                                      \
        (dst).wd = (src)->wd;                                                                      \
        (dst).wd_bn_bias = (src)->wd_bn_bias;                                                      \
        (dst).no_train_bn = (src)->no_train_bn;                                                    \
        memcpy((dst).moms, (src)->moms, sizeof(dst).moms);                                         \
        (dst).metrics = (src)->metrics;                                                            \
        (dst).n_metrics = (src)->n_metrics;                                                        \
        (dst).cbs = (src)->cbs;                                                                    \
        (dst).n_cbs = (src)->n_cbs;                                                                \
        (dst).path = (src)->path;                                                                  \
        (dst).model_dir = (src)->model_dir;                                                        \
        (dst).quiet = (src)->quiet;                                                                \
        (dst).seed = (src)->seed;                                                                  \
    } while (0)

/* ---- checkpoints (checkpoint.c) ------------------------------------------------------------ */

/* A fit has ended (however): a stop request raised while it ran and not acted on (it came after
 * the last training batch, or the fit had no checkpoint callback) is dropped, so that it does not
 * stop a later fit of the same process. A request made while no fit runs is still kept. */
void cf__checkpoint_fit_ended(void);

/* The fit's parameters as text ("key=value" separated by spaces): the method's (method_params)
 * and the data's, the model's and the group's. Allocated (cf_free). */
char *cf__fit_params(const cf_learner *learn, int n_epoch, cf_lr lr, double wd, bool reset_opt,
                     int start_epoch, const char *method_params);
/* Reads a checkpoint (rank 0 reads and broadcasts), checks it and its parameters against
 * params, and its position and schedule against a fit of n_epoch epochs from start_epoch; on
 * success *out holds it (cf__resume_free). Changes nothing in the learner. */
cf_status cf__resume_load(cf_learner *learn, const char *path, const char *params, int n_epoch,
                          int start_epoch, struct cf__resume **out);
/* After before_fit: puts the learner's state, the call's callback states, the module streams
 * and this replica's buffers back; returns the epoch to continue at. */
cf_status cf__resume_apply_state(cf_learner *learn, int *epoch);
/* At the start of the resumed training epoch: the batch to continue at, with the position
 * (train_iter, pct_train, smoothed loss) put back. Frees learn->resume. */
int64_t cf__resume_apply_position(cf_learner *learn);
void cf__resume_free(struct cf__resume *r);
/* Grows the recorder's arrays to hold a whole fit, keeping what they hold. */
cf_status cf__recorder_reserve_keep(cf_recorder *rec, int64_t batches, int epochs);
/* Raises one event on the active callbacks. */
cf_status cf__event(cf_learner *learn, cf_event ev);
/* Per-group lr of the optimizer after setting it from an lr spec (creating the optimizer). */
cf_status cf__set_lr(cf_learner *learn, cf_lr lr);
/* The Recorder's, TrainEval's and other default callbacks, created for one fit. */
cf_callback *cf__recorder_cb(void);
cf_callback *cf__train_eval_cb(void);
/* Validation pass over a loader with the learner's metrics (used by validate and get_preds);
 * rows of every batch are handed to `sink` when not NULL. */
typedef void (*cf__batch_sink)(cf_learner *learn, const cf_batch *b, const cf_tensor *pred,
                               const float *per_item_loss, void *ctx);
cf_status cf__run_inference(cf_learner *learn, cf_dataloader *dl, cf_callback **cbs, int n_cbs,
                            cf__batch_sink sink, void *ctx);
/* The augmentations of a get_preds pass (tta's augmented passes): the loader runs these
 * instead of none, drawing from seed (cf_dl_options' meaning). */
typedef struct cf__preds_tfms {
    int crop_pad;
    bool flip;
    bool mirror; /* every image mirrored (cf_tta's flip_pass) */
    const cf_aug_opts *aug;
    uint64_t seed;
} cf__preds_tfms;
/* get_preds with the loader augmenting as tfms says (NULL: cf_get_preds_ itself). */
cf_status cf__get_preds_tfms(cf_learner *learn, cf_preds *out, const cf_get_preds_opts *opts,
                             const cf__preds_tfms *tfms);
/* Ensures scratch (dpred, per-item losses) fits a batch of `rows` x `cols`. */
cf_status cf__ensure_scratch(cf_learner *learn, const cf_shape *pred_shape);

/* ---- state as bytes: the writer and reader (core/bytes.h) ---------------------------------- */

/* ---- exported models (model_info.c) -------------------------------------------------------- */

/* The tabular state an exported model's info carries (copied; free with cf_tabular_state_free). */
cf_status cf__tabular_state_of_info(const cf_model_info *info, cf_tabular_state *state);
/* Text models (text_app.c): whether corefit.arch names one; the text part of cf_learner_info
 * (vocabulary, tokenizer, AWD-LSTM sizes); the learner of an exported text model over dls; the
 * placeholder DataLoaders of cf_load_learner (one short text, the model's tokenizer and
 * vocabulary). */
bool cf__is_text_arch(const char *arch);
cf_status cf__text_learner_info(const cf_learner *learn, cf_model_info *info);
cf_status cf__text_learner_from_info(const cf_model_info *info, cf_dls *dls, cf_metric **metrics,
                                     int n_metrics, cf_learner **out);
cf_status cf__text_placeholder_dls(const cf_model_info *info, cf_dls **out);
/* A U-Net's options as the corefit.unet metadata (unet_meta.c): the JSON text (NULL when out of
 * memory), and the options read back from it (text NULL: a file written before they were
 * recorded, fastai's defaults), refusing a missing or unknown key and a value corefit does not
 * build, naming the file, the key and the value. */
char *cf__unet_opts_json(const cf_unet_opts *opts);
cf_status cf__unet_opts_read(const char *path, const char *text, cf_unet_opts *out);

#endif
