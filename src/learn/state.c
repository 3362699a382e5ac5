/* The learner's state as bytes: everything a fit changes, so that a parallel fit can bring it
 * home and a failed fit under MPI can be rolled back. Each part is written by the type that
 * owns it (the optimizer, the Recorder, each callback) as a nested blob. */
#include "corefit/learn.h"

#include <string.h>

#include "learn/internal.h"

#define FIGURES_MAX 100000

static size_t export_opt(const void *opt, void *buf, size_t size) {
    return cf_optimizer_export(opt, buf, size);
}
static size_t export_recorder(const void *rec, void *buf, size_t size) {
    return cf_recorder_export(rec, buf, size);
}
static size_t export_cb(const void *cb, void *buf, size_t size) {
    const cf_callback *c = cb;
    return c->export_state ? c->export_state(c, buf, size) : 0;
}

static void put_cbs(cf__writer *w, cf_callback *const *cbs, int n) {
    cf__put_u64(w, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        cf__put_str(w, cbs[i]->name);
        cf__put_blob(w, export_cb, cbs[i]);
    }
}

static void put_learner_state(const void *obj, cf__writer *w) {
    const cf_learner *learn = obj;
    const cf_model *m = learn->model;
    cf__put_header(w, "CFLS", 2);
    cf__put_array(w, m->weights, (int64_t)m->n_weights, sizeof(float));
    cf__put_array(w, m->buffers, (int64_t)m->n_buffers, sizeof(float));
    cf__put_u64(w, (uint64_t)m->n_params);
    for (int i = 0; i < m->n_params; i++) {
        unsigned char t = m->params[i]->trainable;
        cf__put(w, &t, 1);
    }
    cf__put_u64(w, learn->opt != NULL);
    if (learn->opt) cf__put_blob(w, export_opt, learn->opt);
    cf__put_blob(w, export_recorder, &learn->recorder);
    cf__put_array(w, learn->final_record, learn->final_record ? learn->n_final_record : 0,
                  sizeof(double));
    cf__put_u64(w, (uint64_t)learn->n_figures);
    for (int i = 0; i < learn->n_figures; i++) cf__put_str(w, learn->figures[i]);
    put_cbs(w, learn->cbs, learn->n_cbs);
    put_cbs(w, learn->master_cbs, learn->n_master_cbs);
    cf__put_u64(w, (uint64_t)learn->data_epochs);
}

size_t cf_learner_export_state(const cf_learner *learn, void *buf, size_t size) {
    return cf__export(put_learner_state, learn, buf, size);
}

/* Where each callback's state lies in the buffer (read and checked before anything changes). */
typedef struct cb_state {
    const void *bytes;
    size_t n;
} cb_state;

/* "a, b, c" of a callback list, for messages. */
static void cb_names(cf_callback *const *cbs, int n, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < cap; i++) {
        int w = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "",
                         cbs[i]->name ? cbs[i]->name : "(unnamed)");
        if (w > 0) at += (size_t)w;
    }
    if (n == 0) snprintf(buf, cap, "none");
}

/* The learner's callbacks run on every replica and may change the result: the lists must
 * match, and a mismatch names both. */
static void get_cbs(cf__reader *r, const char *list, cf_callback *const *cbs, int n,
                    cb_state *states) {
    int64_t count = cf__get_count(r, list, 100000, 16);
    if (r->st == CF_OK && count != n) {
        char ours[512];
        cb_names(cbs, n, ours, sizeof ours);
        cf__reader_fail(r,
                        "%lld %s, this learner has %d (%s): the state was taken with other "
                        "callbacks",
                        (long long)count, list, n, ours);
        return;
    }
    for (int i = 0; r->st == CF_OK && i < n; i++) {
        char *name = cf__get_str(r, "callback name");
        if (name && strcmp(name, cbs[i]->name ? cbs[i]->name : "") != 0)
            cf__reader_fail(r, "%s %d is %s, this learner's is %s", list, i, name,
                            cbs[i]->name ? cbs[i]->name : "(unnamed)");
        cf_free(name);
        states[i].bytes = cf__get_blob(r, "callback state", &states[i].n);
        if (r->st == CF_OK && states[i].n && !cbs[i]->import_state)
            cf__reader_fail(r, "%s %d (%s) carries state but cannot import it", list, i,
                            cbs[i]->name);
    }
}

/* Master callbacks (fastai's rank-0-only ones: logging, progress, saving) only show or record
 * what the fit does, so they are matched by name and order of occurrence: one the state has
 * and this learner lacks is dropped with its state, one this learner adds starts fresh (a
 * resumed fit may add --quiet or a CSV log). */
static void get_master_cbs(cf__reader *r, cf_callback *const *cbs, int n, cb_state *states) {
    int64_t count = cf__get_count(r, "master callbacks", 100000, 16);
    bool *taken = cf_calloc((size_t)n + 1, sizeof *taken);
    if (r->st == CF_OK && !taken) r->st = cf_fail(CF_ERR_NOMEM, "learner state");
    for (int64_t i = 0; r->st == CF_OK && i < count; i++) {
        char *name = cf__get_str(r, "callback name");
        size_t bytes = 0;
        const void *blob = cf__get_blob(r, "callback state", &bytes);
        int match = -1;
        for (int k = 0; name && k < n && match < 0; k++)
            if (!taken[k] && strcmp(name, cbs[k]->name ? cbs[k]->name : "") == 0) match = k;
        if (r->st == CF_OK && match >= 0) {
            taken[match] = true;
            states[match].bytes = blob;
            states[match].n = bytes;
            if (bytes && !cbs[match]->import_state)
                cf__reader_fail(r, "master callback %s carries state but cannot import it",
                                cbs[match]->name);
        }
        cf_free(name);
    }
    cf_free(taken);
}

/* Imports callback states; on failure puts back the ones already imported. */
static cf_status import_cbs(cf_callback *const *cbs, int n, const cb_state *states) {
    int done = 0;
    void **saved = cf_calloc((size_t)n + 1, sizeof *saved);
    size_t *saved_n = cf_calloc((size_t)n + 1, sizeof *saved_n);
    cf_status st = saved && saved_n ? CF_OK : CF_ERR_NOMEM;
    for (; st == CF_OK && done < n; done++) {
        cf_callback *cb = cbs[done];
        if (!states[done].n) continue;
        saved_n[done] = cb->export_state ? cb->export_state(cb, NULL, 0) : 0;
        saved[done] = cf_malloc(saved_n[done] + 1);
        if (!saved[done]) {
            st = CF_ERR_NOMEM;
            break;
        }
        if (saved_n[done]) cb->export_state(cb, saved[done], saved_n[done]);
        st = cb->import_state(cb, states[done].bytes, states[done].n);
        if (st != CF_OK) break;
    }
    if (st != CF_OK)
        for (int i = 0; i < done; i++)
            if (saved[i] && saved_n[i]) cbs[i]->import_state(cbs[i], saved[i], saved_n[i]);
    for (int i = 0; saved && i < n; i++) cf_free(saved[i]);
    cf_free(saved);
    cf_free(saved_n);
    return st;
}

cf_status cf_learner_import_state(cf_learner *learn, const void *buf, size_t size) {
    return cf__learner_import_state_consuming(learn, buf, size, NULL, NULL);
}

cf_status cf__learner_import_state_consuming(cf_learner *learn, const void *buf, size_t size,
                                             void (*consumed)(const void *p, size_t n, void *ctx),
                                             void *ctx) {
    cf_model *m = learn->model;
    cf__reader rd = cf__reader_make(buf, size, "learner state");
    cf__reader *r = &rd;
    /* version 1 had no data_epochs (its fits all began at data epoch 0) */
    const uint32_t version = cf__get_header_versions(r, "CFLS", 1, 2);
    int64_t n = cf__get_count(r, "weights", INT64_MAX / 8, sizeof(float));
    if (rd.st == CF_OK && (size_t)n != m->n_weights)
        cf__reader_fail(r, "%lld weights, this model has %zu", (long long)n, m->n_weights);
    const float *weights = cf__get_view(r, n, sizeof(float));
    n = cf__get_count(r, "buffers", INT64_MAX / 8, sizeof(float));
    if (rd.st == CF_OK && (size_t)n != m->n_buffers)
        cf__reader_fail(r, "%lld buffers, this model has %zu", (long long)n, m->n_buffers);
    const float *buffers = cf__get_view(r, n, sizeof(float));
    n = (int64_t)cf__get_u64(r);
    if (rd.st == CF_OK && n != m->n_params)
        cf__reader_fail(r, "%lld parameters, this model has %d", (long long)n, m->n_params);
    const unsigned char *trainable = cf__get_view(r, m->n_params, 1);
    cf_optimizer *opt = NULL;
    if (cf__get_u64(r) && rd.st == CF_OK) {
        size_t bytes = 0;
        const void *blob = cf__get_blob(r, "optimizer state", &bytes);
        cf_opt_config config = learn->opt_config;
        config.wd_bn_bias = learn->wd_bn_bias;
        config.hypers.lr = learn->lr;
        if (rd.st == CF_OK) {
            cf_status st = cf_optimizer_new(&opt, m, &config);
            if (st == CF_OK) st = cf_optimizer_import(opt, blob, bytes);
            if (st != CF_OK) rd.st = cf_fail_context(st, "learner state");
            if (st == CF_OK && consumed) consumed(blob, bytes, ctx);
        }
    }
    size_t rec_bytes = 0;
    const void *rec_blob = cf__get_blob(r, "recorder state", &rec_bytes);
    cf_recorder rec = {0};
    if (rd.st == CF_OK) {
        cf_status st = cf_recorder_import(&rec, rec_blob, rec_bytes);
        if (st != CF_OK) rd.st = cf_fail_context(st, "learner state");
    }
    int64_t n_final = 0;
    double *final = cf__get_array(r, "final_record", 100000, sizeof(double), &n_final);
    int64_t n_fig = cf__get_count(r, "figures", FIGURES_MAX, 8);
    char **figs = rd.st == CF_OK ? cf_calloc((size_t)n_fig + 1, sizeof *figs) : NULL;
    if (rd.st == CF_OK && !figs) rd.st = cf_fail(CF_ERR_NOMEM, "learner state: figures");
    for (int64_t i = 0; rd.st == CF_OK && i < n_fig; i++) figs[i] = cf__get_str(r, "figure path");
    /* the learner's callbacks, then its master callbacks, as one list */
    int n_all = learn->n_cbs + learn->n_master_cbs;
    cb_state *states = cf_calloc((size_t)n_all + 1, sizeof *states);
    cf_callback **all = cf_calloc((size_t)n_all + 1, sizeof *all);
    if (rd.st == CF_OK && (!states || !all)) rd.st = cf_fail(CF_ERR_NOMEM, "learner state");
    if (all) {
        for (int i = 0; i < learn->n_cbs; i++) all[i] = learn->cbs[i];
        for (int i = 0; i < learn->n_master_cbs; i++) all[learn->n_cbs + i] = learn->master_cbs[i];
    }
    if (rd.st == CF_OK) {
        get_cbs(r, "callbacks", learn->cbs, learn->n_cbs, states);
        get_master_cbs(r, learn->master_cbs, learn->n_master_cbs, states + learn->n_cbs);
    }
    int64_t data_epochs = version >= 2 ? (int64_t)cf__get_u64(r) : 0;
    if (rd.st == CF_OK && (data_epochs < 0 || data_epochs > INT32_MAX / 2))
        cf__reader_fail(r, "%lld data epochs (at most %d)", (long long)data_epochs, INT32_MAX / 2);
    cf__get_end(r);
    cf_status st = rd.st;
    if (st == CF_OK) st = import_cbs(all, n_all, states);
    cf_free(states);
    cf_free(all);
    if (st != CF_OK) {
        cf_optimizer_free(opt);
        cf_recorder_clear(&rec);
        cf_free(final);
        for (int64_t i = 0; figs && i < n_fig; i++) cf_free(figs[i]);
        cf_free(figs);
        return st;
    }
    /* commit: nothing below can fail */
    memcpy(m->weights, weights, m->n_weights * sizeof(float));
    if (m->n_buffers) memcpy(m->buffers, buffers, m->n_buffers * sizeof(float));
    for (int i = 0; i < m->n_params; i++) m->params[i]->trainable = trainable[i] != 0;
    cf_optimizer_free(learn->opt);
    learn->opt = opt;
    cf_recorder_clear(&learn->recorder);
    learn->recorder = rec;
    cf_free(learn->final_record);
    learn->final_record = n_final ? final : NULL;
    learn->n_final_record = (int)n_final;
    if (!n_final) cf_free(final);
    for (int i = 0; i < learn->n_figures; i++) cf_free(learn->figures[i]);
    cf_free(learn->figures);
    learn->figures = figs;
    learn->n_figures = (int)n_fig;
    learn->data_epochs = data_epochs;
    return CF_OK;
}
