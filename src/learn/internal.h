/* Internal interfaces of the learn layer (not installed). */
#ifndef CF_LEARN_INTERNAL_H
#define CF_LEARN_INTERNAL_H

#include "corefit/learn.h"

/* fastai's Learner.fit: the loop with every event, for n_epoch epochs, with extra callbacks for
 * this call (taken over). lr may be unset (learner's lr). */
cf_status cf__fit(cf_learner *learn, int n_epoch, cf_lr lr, double wd, cf_callback **extra,
                  int n_extra, bool reset_opt, int start_epoch, const char *resume,
                  const char *method_params);

/* ---- checkpoints (checkpoint.c) ------------------------------------------------------------ */

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
/* Ensures scratch (dpred, per-item losses) fits a batch of `rows` x `cols`. */
cf_status cf__ensure_scratch(cf_learner *learn, const cf_shape *pred_shape);

/* ---- state as bytes: the writer and reader every state format of this layer uses ---------- */

/* A writer measures when buf is NULL or too small: `at` counts every byte put, and bytes are
 * stored only while they fit, so one pass both sizes and (given room) writes. */
typedef struct cf__writer {
    unsigned char *buf;
    size_t size, at;
} cf__writer;
void cf__put(cf__writer *w, const void *data, size_t n);
void cf__put_u64(cf__writer *w, uint64_t v);
void cf__put_f64(cf__writer *w, double v);
/* A count, then n items of elem bytes. */
void cf__put_array(cf__writer *w, const void *data, int64_t n, size_t elem);
void cf__put_str(cf__writer *w, const char *s); /* NULL writes as "" */
/* A nested blob: its length, then what export(ctx, buf, size) writes. */
void cf__put_blob(cf__writer *w, size_t (*export_fn)(const void *ctx, void *buf, size_t size),
                  const void *ctx);
/* magic (4 characters) and version */
void cf__put_header(cf__writer *w, const char magic[4], uint32_t version);

/* Runs put(obj, w) once to measure and, when buf holds that many bytes, once more to write:
 * the convention of every export function (returns the bytes needed; writes all or nothing). */
size_t cf__export(void (*put)(const void *obj, cf__writer *w), const void *obj, void *buf,
                  size_t size);

/* A reader fails once, with a message naming what it reads (`what`), the offset and the value;
 * every later read fails too, so a format reads straight through and checks r->st at the end. */
typedef struct cf__reader {
    const unsigned char *buf;
    size_t size, at;
    const char *what; /* "recorder state", ... */
    cf_status st;
} cf__reader;
cf__reader cf__reader_make(const void *buf, size_t size, const char *what);
bool cf__get(cf__reader *r, void *data, size_t n);
uint64_t cf__get_u64(cf__reader *r);
double cf__get_f64(cf__reader *r);
/* A count written by cf__put_array, checked against max and the bytes left. */
int64_t cf__get_count(cf__reader *r, const char *field, int64_t max, size_t elem);
/* The items after a count: a pointer into the buffer (not copied), NULL on failure. */
const void *cf__get_view(cf__reader *r, int64_t n, size_t elem);
/* A count and its items, copied into a new array (n + 1 items allocated); NULL on failure. */
void *cf__get_array(cf__reader *r, const char *field, int64_t max, size_t elem, int64_t *n);
char *cf__get_str(cf__reader *r, const char *field); /* allocated; NULL on failure */
/* A nested blob: returns a pointer to its bytes and sets *n. */
const void *cf__get_blob(cf__reader *r, const char *field, size_t *n);
bool cf__get_header(cf__reader *r, const char magic[4], uint32_t version);
/* Fails the reader (once) with a message about the current offset. */
bool cf__reader_fail(cf__reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fails the reader unless every byte was read. */
bool cf__get_end(cf__reader *r);

#endif
