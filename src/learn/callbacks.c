/* fastai's CSVLogger (callback/progress.py), GradientClip and GradientAccumulation
 * (callback/training.py). */
#include "corefit/learn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"

/* ---- CSVLogger ----------------------------------------------------------------------------- */

/* The log is written as the fit goes (flushed every epoch, as fastai's fsync'd lines), from the
 * first completed epoch on: a fit that fails before it leaves an existing log as it was (before
 * the fit, the folder is only checked to take a new file). Then, without append, the header and
 * the first row go to a temporary file beside the log (`<log>.tmp-XXXXXX`, flushed), renamed over
 * the log at once, and later rows to the same file under the log's name: the rename replaces a
 * symbolic link, never the file it points to. With append (fastai's append=True), the log is
 * opened for appending at that moment instead. A fit without epochs that ends well (not
 * cancelled) writes the header alone, as fastai's. */
typedef struct csv_logger {
    char *fname;
    bool append;
    bool due;     /* a logging fit is on and the log not opened yet */
    bool through; /* the log is a character device (/dev/null): written through, not replaced */
    FILE *f;      /* the log, from the first row on */
    char path[4096];
} csv_logger;

static void csv_close(csv_logger *c) {
    if (c->f) fclose(c->f);
    c->f = NULL;
    c->due = false;
}

static void csv_write_header(FILE *f, const cf_learner *learn) {
    const cf_recorder *rec = &learn->recorder;
    for (int j = 0; j < rec->n_names; j++)
        fprintf(f, "%s%s", j ? "," : "", rec->metric_names[j] ? rec->metric_names[j] : "");
    fputc('\n', f);
}

static void csv_write_row(FILE *f, const cf_learner *learn) {
    const cf_recorder *rec = &learn->recorder;
    int e = rec->n_epochs - 1;
    char t[48];
    fprintf(f, "%d", learn->epoch);
    for (int j = 0; j < rec->n_values; j++)
        fprintf(f, ",%s",
                cf_format_float(rec->values[(size_t)e * (size_t)rec->n_values + (size_t)j], t,
                                sizeof t));
    fprintf(f, ",%s\n", cf_format_time(rec->times ? rec->times[e] : 0, t, sizeof t));
}

/* Opens the log with its header and, when `row`, the last epoch's row in it. */
static cf_status csv_open(csv_logger *c, const cf_learner *learn, bool row) {
    c->due = false;
    if (c->append || c->through) {
        c->f = fopen(c->path, "a");
        if (!c->f)
            return cf_fail(CF_ERR_IO, "CSVLogger: cannot open %s: %s", c->path, strerror(errno));
        csv_write_header(c->f, learn);
        if (row) csv_write_row(c->f, learn);
        if (fflush(c->f) != 0)
            return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s: %s", c->path, strerror(errno));
        return CF_OK;
    }
    char tmp[sizeof c->path + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", c->path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s: %s", c->path, strerror(errno));
    flock(fd, LOCK_EX | LOCK_NB); /* in use: not stale (cf__remove_stale_temporaries) */
    /* the mode the log had, or the one fopen would give a new one (mkostemp makes it 0600) */
    struct stat sb;
    fchmod(fd, stat(c->path, &sb) == 0 && S_ISREG(sb.st_mode) ? sb.st_mode & 07777
                                                              : cf__new_file_mode());
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(tmp);
        return cf_fail(CF_ERR_NOMEM, "CSVLogger: %s", strerror(errno));
    }
    csv_write_header(f, learn);
    if (row) csv_write_row(f, learn);
    if (fflush(f) != 0 || rename(tmp, c->path) != 0) {
        int err = errno;
        fclose(f);
        unlink(tmp);
        return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s: %s", c->path, strerror(err));
    }
    c->f = f;
    return CF_OK;
}

static cf_status csv_before_fit(cf_callback *cb, cf_learner *learn) {
    csv_logger *c = cb->state;
    csv_close(c); /* a fit that failed before after_fit left it open */
    if (!learn->replica.is_master || !learn->logging || learn->in_lr_find) return CF_OK;
    const char *base = learn->path && *learn->path ? learn->path : ".";
    int n = c->fname[0] == '/' ? snprintf(c->path, sizeof c->path, "%s", c->fname)
                               : snprintf(c->path, sizeof c->path, "%s/%s", base, c->fname);
    if (n < 0 || (size_t)n >= sizeof c->path)
        return cf_fail(CF_ERR_INVALID, "CSVLogger: path too long: %s/%s", base, c->fname);
    if (c->fname[0] != '/' && mkdir(base, 0755) != 0 && errno != EEXIST)
        return cf_fail(CF_ERR_IO, "CSVLogger: cannot create folder %s: %s", base, strerror(errno));
    /* whether the log can be written is checked now, not after the first epoch */
    struct stat sb;
    if (stat(c->path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s: it is a directory", c->path);
    if (cf_output_check(c->path, &c->through) != CF_OK)
        return cf_fail_context(CF_ERR_IO, "CSVLogger");
    if (c->through) {
        c->due = true;
        return CF_OK;
    }
    if (c->append && access(c->path, F_OK) == 0 && access(c->path, W_OK) != 0)
        return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s: %s", c->path, strerror(errno));
    cf__remove_stale_temporaries(c->path); /* a killed logger's (a logger locks its own) */
    char tmp[sizeof c->path + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", c->path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s: %s", c->path, strerror(errno));
    close(fd);
    unlink(tmp);
    c->due = true;
    return CF_OK;
}

static cf_status csv_after_epoch(cf_callback *cb, cf_learner *learn) {
    csv_logger *c = cb->state;
    const cf_recorder *rec = &learn->recorder;
    if ((!c->f && !c->due) || !learn->logging || rec->n_epochs < 1) return CF_OK;
    if (!c->f) return csv_open(c, learn, true);
    csv_write_row(c->f, learn);
    if (fflush(c->f) != 0) return cf_fail(CF_ERR_IO, "CSVLogger: cannot write %s", c->path);
    return CF_OK;
}

/* A fit cancelled before its first epoch (Ctrl-C) writes no header-only log. */
static cf_status csv_after_cancel_fit(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    ((csv_logger *)cb->state)->due = false;
    return CF_OK;
}

static cf_status csv_after_fit(cf_callback *cb, cf_learner *learn) {
    csv_logger *c = cb->state;
    cf_status st = c->due ? csv_open(c, learn, false) : CF_OK;
    csv_close(c);
    return st;
}

static void csv_free(cf_callback *cb) {
    if (!cb) return;
    csv_logger *c = cb->state;
    if (c) {
        csv_close(c);
        cf_free(c->fname);
    }
    cf_free(c);
    cf_free(cb);
}

cf_callback *cf_csv_logger_cb(const char *path, bool append) {
    cf_callback *cb = cf_callback_new("CSVLogger", 60, sizeof(csv_logger));
    if (!cb) return NULL;
    csv_logger *c = cb->state;
    c->fname = cf_strdup(path && *path ? path : "history.csv");
    c->append = append;
    cb->free = csv_free;
    if (!c->fname) {
        cf_callback_free(cb);
        return NULL;
    }
    cb->on[CF_EV_BEFORE_FIT] = csv_before_fit;
    cb->on[CF_EV_AFTER_EPOCH] = csv_after_epoch;
    cb->on[CF_EV_AFTER_CANCEL_FIT] = csv_after_cancel_fit;
    cb->on[CF_EV_AFTER_FIT] = csv_after_fit;
    return cb;
}

/* ---- GradientClip -------------------------------------------------------------------------- */

/* torch.nn.utils.clip_grad_norm_(params, max_norm, 2): total = ||all grads||_2, and every
 * gradient is multiplied by min(1, max_norm / (total + 1e-6)). */
static cf_status clip_before_step(cf_callback *cb, cf_learner *learn) {
    double max_norm = *(double *)cb->state;
    const cf_model *model = learn->model;
    double sq = 0;
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (!p->grad || !p->trainable) continue;
        double s = 0;
        for (size_t k = 0; k < p->numel; k++) s += (double)p->grad[k] * p->grad[k];
        sq += s;
    }
    double coef = max_norm / (sqrt(sq) + 1e-6);
    if (!(coef < 1.0)) return CF_OK; /* also leaves NaN norms alone for TerminateOnNaN */
    float c = (float)coef;
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (!p->grad || !p->trainable) continue;
        for (size_t k = 0; k < p->numel; k++) p->grad[k] *= c;
    }
    return CF_OK;
}

cf_callback *cf_gradient_clip_cb(double max_norm) {
    /* fastai: MixedPrecision.order + 1 */
    cf_callback *cb = cf_callback_new("GradientClip", CF_ORDER_GRAD_CLIP, sizeof(double));
    if (!cb) return NULL;
    *(double *)cb->state = max_norm > 0 ? max_norm : 1.0;
    cb->skip_valid = true;
    cb->on[CF_EV_BEFORE_STEP] = clip_before_step;
    return cb;
}

/* ---- GradientAccumulation ------------------------------------------------------------------ */

/* Current fastai: after_loss divides loss_grad by n_acc / bs, so the accumulated gradient is
 * the sum over the accumulated batches of bs/n_acc times each batch's mean-loss gradient (the
 * gradient of the mean loss over n_acc samples when batches are full); before_step counts the
 * samples and raises CancelBatchException (no step, no zero_grad) until n_acc were seen. The
 * recorded loss is not scaled. Batch sizes are the rows of this process's batch (fastai's
 * find_bs). */
typedef struct grad_acc {
    int n_acc;
    int64_t count;
} grad_acc;

static cf_status acc_before_fit(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    ((grad_acc *)cb->state)->count = 0;
    return CF_OK;
}

static cf_status acc_after_loss(cf_callback *cb, cf_learner *learn) {
    grad_acc *a = cb->state;
    int bs = learn->batch ? learn->batch->size : 0;
    learn->loss_grad_scale = (float)((double)bs / (double)a->n_acc);
    return CF_OK;
}

static cf_status acc_before_step(cf_callback *cb, cf_learner *learn) {
    grad_acc *a = cb->state;
    a->count += learn->batch ? learn->batch->size : 0;
    if (a->count < a->n_acc)
        cf_learner_cancel(learn, CF_CANCEL_BATCH); /* skip step and zero_grad */
    else
        a->count = 0;
    return CF_OK;
}

static cf_status acc_after_fit(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->loss_grad_scale = 1.0f;
    return CF_OK;
}

cf_callback *cf_gradient_accumulation_cb(int n_acc) {
    /* fastai: MixedPrecision.order - 4 */
    cf_callback *cb =
        cf_callback_new("GradientAccumulation", CF_ORDER_GRAD_ACCUMULATION, sizeof(grad_acc));
    if (!cb) return NULL;
    grad_acc *a = cb->state;
    a->n_acc = n_acc > 0 ? n_acc : 32;
    cb->skip_valid = true;
    cb->on[CF_EV_BEFORE_FIT] = acc_before_fit;
    cb->on[CF_EV_AFTER_LOSS] = acc_after_loss;
    cb->on[CF_EV_BEFORE_STEP] = acc_before_step;
    cb->on[CF_EV_AFTER_FIT] = acc_after_fit;
    cb->on[CF_EV_AFTER_CANCEL_FIT] = acc_after_fit;
    return cb;
}
