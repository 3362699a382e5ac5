/* The Recorder and TrainEval callbacks, and the recorder's files. */
#include "corefit/learn.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "learn/internal.h"

#define SMOOTH_BETA 0.98

/* ---- TrainEvalCallback --------------------------------------------------------------------- */

static cf_status te_before_fit(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->epoch = 0;
    learn->loss_value = 0;
    learn->train_iter = 0;
    learn->pct_train = 0;
    return CF_OK;
}

static cf_status te_before_train(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->pct_train = (double)learn->epoch / learn->n_epoch;
    cf_model_train(learn->model, true);
    learn->training = true;
    return CF_OK;
}

static cf_status te_after_batch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->pct_train += 1.0 / ((double)learn->n_iter * learn->n_epoch);
    learn->train_iter++;
    return CF_OK;
}

static cf_status te_before_validate(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_model_train(learn->model, false);
    learn->training = false;
    return CF_OK;
}

cf_callback *cf__train_eval_cb(void) {
    cf_callback *cb = cf_callback_new("TrainEvalCallback", CF_ORDER_TRAIN_EVAL, 0);
    if (!cb) return NULL;
    cb->skip_valid = true;
    cb->on[CF_EV_BEFORE_FIT] = te_before_fit;
    cb->on[CF_EV_BEFORE_TRAIN] = te_before_train;
    cb->on[CF_EV_AFTER_BATCH] = te_after_batch;
    cb->on[CF_EV_BEFORE_VALIDATE] = te_before_validate;
    return cb;
}

/* ---- Recorder ------------------------------------------------------------------------------ */

static cf_status grow_doubles(double **arr, int64_t n) {
    double *grown = cf_calloc((size_t)n + 1, sizeof *grown);
    if (!grown) return CF_ERR_NOMEM;
    cf_free(*arr);
    *arr = grown;
    return CF_OK;
}

static void free_names(cf_recorder *rec) {
    for (int i = 0; i < rec->n_names; i++) cf_free(rec->metric_names[i]);
    cf_free(rec->metric_names);
    rec->metric_names = NULL;
    rec->n_names = 0;
}

static cf_status set_names(cf_recorder *rec, const cf_learner *learn) {
    free_names(rec);
    int n = 4 + learn->n_metrics;
    rec->metric_names = cf_calloc((size_t)n, sizeof *rec->metric_names);
    if (!rec->metric_names) return CF_ERR_NOMEM;
    const char *fixed_head[] = {"epoch", "train_loss", "valid_loss"};
    for (int i = 0; i < 3; i++) rec->metric_names[rec->n_names++] = cf_strdup(fixed_head[i]);
    for (int i = 0; i < learn->n_metrics; i++)
        rec->metric_names[rec->n_names++] = cf_strdup(learn->metrics[i]->name);
    rec->metric_names[rec->n_names++] = cf_strdup("time");
    for (int i = 0; i < rec->n_names; i++)
        if (!rec->metric_names[i]) return CF_ERR_NOMEM;
    rec->n_values = rec->n_names - 2;
    return CF_OK;
}

/* Sizes the history for a whole fit up front, so nothing is allocated during batches. */
static cf_status reserve(cf_recorder *rec, const cf_learner *learn) {
    int64_t per_epoch = learn->dls->train ? cf_dataloader_len(learn->dls->train) : 0;
    int64_t batches = per_epoch * learn->n_epoch + 1;
    int epochs = learn->n_epoch + 1;
    cf_status st = CF_OK;
    if (batches > rec->batch_capacity) {
        if ((st = grow_doubles(&rec->lrs, batches)) || (st = grow_doubles(&rec->moms, batches)) ||
            (st = grow_doubles(&rec->losses, batches)) ||
            (st = grow_doubles(&rec->hp_lr, batches)) || (st = grow_doubles(&rec->hp_mom, batches)))
            return cf_fail_context(st, "recorder for %lld batches", (long long)batches);
        rec->batch_capacity = batches;
    }
    /* per-epoch rows: the number of columns may change between fits */
    int width = rec->n_values > 0 ? rec->n_values : 1;
    int64_t *iters = cf_calloc((size_t)epochs, sizeof *iters);
    if (!iters || (st = grow_doubles(&rec->values, (int64_t)epochs * width)) ||
        (st = grow_doubles(&rec->times, epochs))) {
        cf_free(iters);
        return cf_fail_context(CF_ERR_NOMEM, "recorder for %d epochs", epochs);
    }
    cf_free(rec->iters);
    rec->iters = iters;
    rec->epoch_capacity = epochs;
    return CF_OK;
}

static cf_status rec_before_fit(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_recorder *rec = &learn->recorder;
    cf_free(learn->final_record);
    learn->final_record = cf_calloc((size_t)learn->n_metrics + 1, sizeof(double));
    if (!learn->final_record) return CF_ERR_NOMEM;
    learn->n_final_record = 1 + learn->n_metrics;
    if (learn->validating) return CF_OK; /* validate/get_preds keep the history */
    cf_status st = set_names(rec, learn);
    if (st == CF_OK) st = reserve(rec, learn);
    if (st != CF_OK) return st;
    rec->n_batches = 0;
    rec->n_epochs = 0;
    rec->n_hps = 0;
    rec->smooth_val = 0;
    rec->smooth_count = 0;
    learn->smooth_loss = NAN;
    return CF_OK;
}

static cf_status rec_before_epoch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->recorder.epoch_start = cf_now();
    learn->recorder.cancel_train = learn->recorder.cancel_valid = false;
    return CF_OK;
}

static cf_status rec_before_validate(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->recorder.valid_loss_total = 0;
    learn->recorder.valid_loss_count = 0;
    for (int i = 0; i < learn->n_metrics; i++) cf_metric_reset(learn->metrics[i]);
    return CF_OK;
}

static cf_status rec_after_batch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_recorder *rec = &learn->recorder;
    const cf_batch *b = learn->batch;
    if (!learn->training) {
        double total = 0;
        for (int i = 0; i < b->size; i++)
            if (!b->pad || !b->pad[i]) total += learn->per_item_loss[i];
        rec->valid_loss_total += total;
        rec->valid_loss_count += b->n_real;
        for (int i = 0; i < learn->n_metrics; i++) {
            cf_metric *m = learn->metrics[i];
            m->accumulate(m, learn->pred, &b->y, b->pad);
        }
        return CF_OK;
    }
    /* fastai's AvgSmoothLoss: debiased exponential moving average, per fit. */
    rec->smooth_count++;
    rec->smooth_val = SMOOTH_BETA * rec->smooth_val + (1 - SMOOTH_BETA) * learn->loss_value;
    learn->smooth_loss = rec->smooth_val / (1 - pow(SMOOTH_BETA, (double)rec->smooth_count));
    if (learn->validating || rec->n_batches >= rec->batch_capacity) return CF_OK;
    const cf_hypers *h = &learn->opt->hypers[learn->opt->n_groups - 1];
    rec->lrs[rec->n_batches] = h->lr;
    rec->moms[rec->n_batches] = h->mom;
    rec->losses[rec->n_batches] = learn->smooth_loss;
    rec->n_batches++;
    return CF_OK;
}

static cf_status rec_after_cancel_train(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->recorder.cancel_train = true;
    return CF_OK;
}

static cf_status rec_after_cancel_validate(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    learn->recorder.cancel_valid = true;
    return CF_OK;
}

static cf_status rec_after_epoch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_recorder *rec = &learn->recorder;
    /* final_record = [valid_loss, metrics...] (NaN where cancelled or empty) */
    bool have_valid = !rec->cancel_valid && rec->valid_loss_count > 0;
    learn->final_record[0] = have_valid ? rec->valid_loss_total / rec->valid_loss_count : NAN;
    for (int i = 0; i < learn->n_metrics; i++)
        learn->final_record[1 + i] = have_valid ? cf_metric_value(learn->metrics[i]) : NAN;
    if (learn->validating || rec->n_epochs >= rec->epoch_capacity) return CF_OK;
    double *row = rec->values + (size_t)rec->n_epochs * rec->n_values;
    row[0] = rec->cancel_train || rec->smooth_count == 0 ? NAN : learn->smooth_loss;
    for (int i = 0; i < learn->n_final_record && 1 + i < rec->n_values; i++)
        row[1 + i] = learn->final_record[i];
    rec->iters[rec->n_epochs] = rec->smooth_count;
    rec->times[rec->n_epochs] = cf_now() - rec->epoch_start;
    rec->n_epochs++;
    return CF_OK;
}

cf_callback *cf__recorder_cb(void) {
    cf_callback *cb = cf_callback_new("Recorder", CF_ORDER_RECORDER, 0);
    if (!cb) return NULL;
    cb->on[CF_EV_BEFORE_FIT] = rec_before_fit;
    cb->on[CF_EV_BEFORE_EPOCH] = rec_before_epoch;
    cb->on[CF_EV_BEFORE_VALIDATE] = rec_before_validate;
    cb->on[CF_EV_AFTER_BATCH] = rec_after_batch;
    cb->on[CF_EV_AFTER_CANCEL_TRAIN] = rec_after_cancel_train;
    cb->on[CF_EV_AFTER_CANCEL_VALIDATE] = rec_after_cancel_validate;
    cb->on[CF_EV_AFTER_EPOCH] = rec_after_epoch;
    return cb;
}

/* ---- recorder utilities -------------------------------------------------------------------- */

void cf_recorder_clear(cf_recorder *rec) {
    free_names(rec);
    cf_free(rec->lrs);
    cf_free(rec->moms);
    cf_free(rec->losses);
    cf_free(rec->hp_lr);
    cf_free(rec->hp_mom);
    cf_free(rec->values);
    cf_free(rec->iters);
    cf_free(rec->times);
    memset(rec, 0, sizeof *rec);
}

static double *dup_doubles(const double *src, int64_t n) {
    double *d = cf_calloc((size_t)n + 1, sizeof *d);
    if (d && n) memcpy(d, src, (size_t)n * sizeof *d);
    return d;
}

cf_status cf_recorder_copy(cf_recorder *dst, const cf_recorder *src) {
    cf_recorder r = *src;
    int64_t nb = src->n_batches > src->n_hps ? src->n_batches : src->n_hps;
    r.lrs = dup_doubles(src->lrs, src->n_batches);
    r.moms = dup_doubles(src->moms, src->n_batches);
    r.losses = dup_doubles(src->losses, src->n_batches);
    r.hp_lr = dup_doubles(src->hp_lr, src->n_hps);
    r.hp_mom = dup_doubles(src->hp_mom, src->n_hps);
    r.batch_capacity = nb;
    r.values = dup_doubles(src->values, (int64_t)src->n_epochs * src->n_values);
    r.times = dup_doubles(src->times, src->n_epochs);
    r.iters = cf_calloc((size_t)src->n_epochs + 1, sizeof *r.iters);
    r.epoch_capacity = src->n_epochs;
    r.metric_names = cf_calloc((size_t)src->n_names + 1, sizeof *r.metric_names);
    bool ok = r.lrs && r.moms && r.losses && r.hp_lr && r.hp_mom && r.values && r.times &&
              r.iters && r.metric_names;
    if (r.iters && src->n_epochs)
        memcpy(r.iters, src->iters, (size_t)src->n_epochs * sizeof *r.iters);
    for (int i = 0; ok && i < src->n_names; i++)
        ok = (r.metric_names[i] = cf_strdup(src->metric_names[i])) != NULL;
    if (!ok) {
        cf_recorder_clear(&r);
        return cf_fail(CF_ERR_NOMEM, "copying the recorder");
    }
    cf_recorder_clear(dst);
    *dst = r;
    return CF_OK;
}

static cf_status open_for_write(const char *path, FILE **f) {
    *f = fopen(path, "w");
    if (!*f) return cf_fail(CF_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return CF_OK;
}

cf_status cf_recorder_write_csv(const cf_recorder *rec, const char *path) {
    FILE *f;
    cf_status st = open_for_write(path, &f);
    if (st != CF_OK) return st;
    for (int i = 0; i < rec->n_names; i++) fprintf(f, "%s%s", i ? "," : "", rec->metric_names[i]);
    fputc('\n', f);
    for (int e = 0; e < rec->n_epochs; e++) {
        fprintf(f, "%d", e);
        for (int j = 0; j < rec->n_values; j++) {
            char num[64];
            cf_format_float(rec->values[(size_t)e * rec->n_values + j], num, sizeof num);
            fprintf(f, ",%s", num);
        }
        char t[32];
        cf_format_time(rec->times[e], t, sizeof t);
        fprintf(f, ",%s\n", t);
    }
    if (fclose(f) != 0) return cf_fail(CF_ERR_IO, "writing %s failed", path);
    return CF_OK;
}

static void json_array(FILE *f, const char *name, const double *v, int64_t n, bool last) {
    fprintf(f, "  \"%s\": [", name);
    for (int64_t i = 0; i < n; i++) {
        char num[64];
        if (isfinite(v[i]))
            cf_format_float(v[i], num, sizeof num);
        else
            snprintf(num, sizeof num, "null");
        fprintf(f, "%s%s", i ? ", " : "", num);
    }
    fprintf(f, "]%s\n", last ? "" : ",");
}

cf_status cf_recorder_write_json(const cf_recorder *rec, const char *path) {
    FILE *f;
    cf_status st = open_for_write(path, &f);
    if (st != CF_OK) return st;
    fprintf(f, "{\n  \"metric_names\": [");
    for (int i = 0; i < rec->n_names; i++)
        fprintf(f, "%s\"%s\"", i ? ", " : "", rec->metric_names[i]);
    fprintf(f, "],\n");
    json_array(f, "lrs", rec->lrs, rec->n_batches, false);
    json_array(f, "moms", rec->moms, rec->n_batches, false);
    json_array(f, "losses", rec->losses, rec->n_batches, false);
    json_array(f, "hp_lr", rec->hp_lr, rec->n_hps, false);
    json_array(f, "hp_mom", rec->hp_mom, rec->n_hps, false);
    fprintf(f, "  \"iters\": [");
    for (int e = 0; e < rec->n_epochs; e++)
        fprintf(f, "%s%lld", e ? ", " : "", (long long)rec->iters[e]);
    fprintf(f, "],\n");
    json_array(f, "times", rec->times, rec->n_epochs, false);
    fprintf(f, "  \"values\": [");
    for (int e = 0; e < rec->n_epochs; e++) {
        fprintf(f, "%s[", e ? ", " : "");
        for (int j = 0; j < rec->n_values; j++) {
            double v = rec->values[(size_t)e * rec->n_values + j];
            char num[64];
            if (isfinite(v))
                cf_format_float(v, num, sizeof num);
            else
                snprintf(num, sizeof num, "null");
            fprintf(f, "%s%s", j ? ", " : "", num);
        }
        fprintf(f, "]");
    }
    fprintf(f, "]\n}\n");
    if (fclose(f) != 0) return cf_fail(CF_ERR_IO, "writing %s failed", path);
    return CF_OK;
}

/* ---- the recorder as bytes ----------------------------------------------------------------- */

#define REC_MAX_BATCHES ((int64_t)1000000000)
#define REC_MAX_EPOCHS ((int64_t)1000000)
#define REC_MAX_COLUMNS ((int64_t)10000)

static void put_recorder(const void *obj, cf__writer *w) {
    const cf_recorder *r = obj;
    cf__put_header(w, "CFRE", 1);
    cf__put_array(w, r->lrs, r->n_batches, sizeof(double));
    cf__put_array(w, r->moms, r->n_batches, sizeof(double));
    cf__put_array(w, r->losses, r->n_batches, sizeof(double));
    cf__put_array(w, r->hp_lr, r->n_hps, sizeof(double));
    cf__put_array(w, r->hp_mom, r->n_hps, sizeof(double));
    cf__put_u64(w, (uint64_t)r->n_values);
    cf__put_array(w, r->values, (int64_t)r->n_epochs * r->n_values, sizeof(double));
    cf__put_array(w, r->iters, r->n_epochs, sizeof(int64_t));
    cf__put_array(w, r->times, r->n_epochs, sizeof(double));
    cf__put_u64(w, (uint64_t)r->n_names);
    for (int i = 0; i < r->n_names; i++) cf__put_str(w, r->metric_names[i]);
    cf__put_f64(w, r->smooth_val);
    cf__put_u64(w, (uint64_t)r->smooth_count);
}

size_t cf_recorder_export(const cf_recorder *r, void *buf, size_t size) {
    return cf__export(put_recorder, r, buf, size);
}

cf_status cf_recorder_import(cf_recorder *rec, const void *buf, size_t size) {
    cf__reader rd = cf__reader_make(buf, size, "recorder state");
    cf__reader *r = &rd;
    cf_recorder t = {0};
    int64_t n[5] = {0};
    cf__get_header(r, "CFRE", 1);
    t.lrs = cf__get_array(r, "lrs", REC_MAX_BATCHES, sizeof(double), &n[0]);
    t.moms = cf__get_array(r, "moms", REC_MAX_BATCHES, sizeof(double), &n[1]);
    t.losses = cf__get_array(r, "losses", REC_MAX_BATCHES, sizeof(double), &n[2]);
    if (rd.st == CF_OK && (n[1] != n[0] || n[2] != n[0]))
        cf__reader_fail(r, "%lld lrs, %lld moms and %lld losses differ", (long long)n[0],
                        (long long)n[1], (long long)n[2]);
    t.n_batches = n[0];
    t.hp_lr = cf__get_array(r, "hp_lr", REC_MAX_BATCHES, sizeof(double), &n[3]);
    t.hp_mom = cf__get_array(r, "hp_mom", REC_MAX_BATCHES, sizeof(double), &n[4]);
    if (rd.st == CF_OK && n[4] != n[3])
        cf__reader_fail(r, "%lld hp_lr and %lld hp_mom differ", (long long)n[3], (long long)n[4]);
    t.n_hps = n[3];
    t.batch_capacity = t.n_batches > t.n_hps ? t.n_batches : t.n_hps;
    uint64_t n_values = cf__get_u64(r);
    if (rd.st == CF_OK && n_values > (uint64_t)REC_MAX_COLUMNS)
        cf__reader_fail(r, "%llu columns exceed the %lld allowed", (unsigned long long)n_values,
                        (long long)REC_MAX_COLUMNS);
    t.n_values = (int)n_values;
    int64_t n_cells = 0, n_iters = 0, n_times = 0;
    t.values =
        cf__get_array(r, "values", REC_MAX_EPOCHS * REC_MAX_COLUMNS, sizeof(double), &n_cells);
    t.iters = cf__get_array(r, "iters", REC_MAX_EPOCHS, sizeof(int64_t), &n_iters);
    t.times = cf__get_array(r, "times", REC_MAX_EPOCHS, sizeof(double), &n_times);
    if (rd.st == CF_OK && (n_times != n_iters || n_cells != n_iters * t.n_values))
        cf__reader_fail(r,
                        "%lld epochs of times, %lld of iters and %lld values for %d columns "
                        "do not agree",
                        (long long)n_times, (long long)n_iters, (long long)n_cells, t.n_values);
    t.n_epochs = t.epoch_capacity = (int)n_iters;
    int64_t n_names = cf__get_count(r, "metric names", REC_MAX_COLUMNS + 2, 8);
    if (rd.st == CF_OK) {
        t.metric_names = cf_calloc((size_t)n_names + 1, sizeof *t.metric_names);
        if (!t.metric_names) rd.st = cf_fail(CF_ERR_NOMEM, "recorder state: metric names");
    }
    for (int64_t i = 0; rd.st == CF_OK && i < n_names; i++) {
        t.metric_names[i] = cf__get_str(r, "metric name");
        if (t.metric_names[i]) t.n_names++;
    }
    t.smooth_val = cf__get_f64(r);
    t.smooth_count = (int64_t)cf__get_u64(r);
    cf__get_end(r);
    if (rd.st != CF_OK) {
        cf_recorder_clear(&t);
        return rd.st;
    }
    cf_recorder_clear(rec);
    *rec = t;
    return CF_OK;
}

/* Grows an array of n items of elem bytes to cap items, keeping its content. */
static cf_status grow_keep(void **arr, int64_t n, int64_t cap, size_t elem) {
    unsigned char *grown = cf_calloc((size_t)cap + 1, elem);
    if (!grown) return CF_ERR_NOMEM;
    if (*arr && n > 0) memcpy(grown, *arr, (size_t)n * elem);
    cf_free(*arr);
    *arr = grown;
    return CF_OK;
}

cf_status cf__recorder_reserve_keep(cf_recorder *rec, int64_t batches, int epochs) {
    cf_status st = CF_OK;
    if (batches > rec->batch_capacity) {
        if ((st = grow_keep((void **)&rec->lrs, rec->n_batches, batches, sizeof(double))) ||
            (st = grow_keep((void **)&rec->moms, rec->n_batches, batches, sizeof(double))) ||
            (st = grow_keep((void **)&rec->losses, rec->n_batches, batches, sizeof(double))) ||
            (st = grow_keep((void **)&rec->hp_lr, rec->n_hps, batches, sizeof(double))) ||
            (st = grow_keep((void **)&rec->hp_mom, rec->n_hps, batches, sizeof(double))))
            return cf_fail_context(st, "recorder for %lld batches", (long long)batches);
        rec->batch_capacity = batches;
    }
    if (epochs > rec->epoch_capacity) {
        int width = rec->n_values > 0 ? rec->n_values : 1;
        if ((st = grow_keep((void **)&rec->values, (int64_t)rec->n_epochs * width,
                            (int64_t)epochs * width, sizeof(double))) ||
            (st = grow_keep((void **)&rec->iters, rec->n_epochs, epochs, sizeof(int64_t))) ||
            (st = grow_keep((void **)&rec->times, rec->n_epochs, epochs, sizeof(double))))
            return cf_fail_context(st, "recorder for %d epochs", epochs);
        rec->epoch_capacity = epochs;
    }
    return CF_OK;
}
