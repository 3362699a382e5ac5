/* Internal interfaces of the learn layer (not installed). */
#ifndef CF_LEARN_INTERNAL_H
#define CF_LEARN_INTERNAL_H

#include "corefit/learn.h"

/* fastai's Learner.fit: the loop with every event, for n_epoch epochs, with extra callbacks for
 * this call (taken over). lr may be unset (learner's lr). */
cf_status cf__fit(cf_learner *learn, int n_epoch, cf_lr lr, double wd, cf_callback **extra,
                  int n_extra, bool reset_opt, int start_epoch);
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
/* Ensures scratch (dpred, per-item losses) fits a batch of `rows` x `cols`. */
cf_status cf__ensure_scratch(cf_learner *learn, const cf_shape *pred_shape);

#endif
