/* What comes home from a parallel call: the learner's state and the method's output, in an
 * envelope that the fork runner passes through its results file and the MPI runner broadcasts
 * from rank 0. Every part is serialised by the type that owns it; this file only frames them.
 *
 * Envelope "CFHM" v1 (host byte order): u32 magic, u32 version, i64 outcome, u64 message
 * length and bytes, u64 learner-state length and bytes, u64 output length and bytes. */
#include <stdint.h>
#include <string.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "par/twin.h"

typedef struct frame {
    unsigned char *buf;
    size_t size, at;
} frame;

static void put(frame *f, const void *data, size_t n) {
    if (f->buf && f->at <= f->size && n <= f->size - f->at && n) memcpy(f->buf + f->at, data, n);
    f->at += n;
}
static void put_u64(frame *f, uint64_t v) {
    put(f, &v, sizeof v);
}
/* Reserves a length, lets fill write after it, and stores the length written. */
static void put_part(frame *f, size_t (*fill)(const void *, const void *, void *, size_t),
                     const void *a, const void *b) {
    size_t len_at = f->at;
    put_u64(f, 0);
    bool room = f->buf && f->at <= f->size;
    size_t n = fill(a, b, room ? f->buf + f->at : NULL, room ? f->size - f->at : 0);
    if (room && n <= f->size - f->at) {
        uint64_t len = n;
        memcpy(f->buf + len_at, &len, sizeof len);
    }
    f->at += n;
}

static size_t fill_learner(const void *learn, const void *unused, void *buf, size_t size) {
    (void)unused;
    return cf_learner_export_state(learn, buf, size);
}
static size_t fill_output(const void *learn, const void *method, void *buf, size_t size) {
    const cf__par_method *m = method;
    return m->output ? m->output->export_fn(learn, cf__par_out(m), buf, size) : 0;
}

#define HOME_MAGIC 0x4d484643u /* "CFHM" */
#define HOME_VERSION 1u

size_t cf__par_home_write(const cf_learner *learn, const cf__par_method *method, cf_status outcome,
                          const char *outcome_msg, void *buf, size_t size) {
    frame f = {buf, buf ? size : 0, 0};
    uint32_t head[2] = {HOME_MAGIC, HOME_VERSION};
    put(&f, head, sizeof head);
    put_u64(&f, (uint64_t)(int64_t)outcome);
    size_t msg_len = outcome_msg ? strlen(outcome_msg) : 0;
    put_u64(&f, msg_len);
    put(&f, outcome_msg, msg_len);
    put_part(&f, fill_learner, learn, NULL);
    put_part(&f, fill_output, learn, method);
    return f.at;
}

/* A length-prefixed part: a pointer to its bytes, or NULL when the envelope is too short. */
static const unsigned char *get_part(const unsigned char *buf, size_t size, size_t *at,
                                     size_t *len) {
    uint64_t n;
    if (size - *at < sizeof n) return NULL;
    memcpy(&n, buf + *at, sizeof n);
    *at += sizeof n;
    if (n > size - *at) return NULL;
    *len = (size_t)n;
    const unsigned char *p = buf + *at;
    *at += (size_t)n;
    return p;
}

cf_status cf__par_home_read(cf_learner *learn, const cf__par_method *method, const void *vbuf,
                            size_t size) {
    const unsigned char *buf = vbuf;
    uint32_t head[2] = {0};
    int64_t outcome = 0;
    if (!buf || size < sizeof head + sizeof outcome)
        return cf_fail(CF_ERR_WORKER, "no results came home (%zu bytes)", size);
    memcpy(head, buf, sizeof head);
    if (head[0] != HOME_MAGIC || head[1] != HOME_VERSION)
        return cf_fail(CF_ERR_WORKER,
                       "results: offset 0: magic 0x%08x version %u (expected 0x%08x version %u)",
                       head[0], head[1], HOME_MAGIC, HOME_VERSION);
    size_t at = sizeof head;
    memcpy(&outcome, buf + at, sizeof outcome);
    at += sizeof outcome;
    size_t msg_len = 0, state_len = 0, out_len = 0;
    const unsigned char *msg = get_part(buf, size, &at, &msg_len);
    const unsigned char *state = msg ? get_part(buf, size, &at, &state_len) : NULL;
    const unsigned char *out = state ? get_part(buf, size, &at, &out_len) : NULL;
    if (!out || at != size)
        return cf_fail(CF_ERR_WORKER,
                       "results: %zu bytes, truncated or with bytes left over at "
                       "offset %zu",
                       size, at);
    char outcome_msg[1024];
    snprintf(outcome_msg, sizeof outcome_msg, "%.*s", (int)(msg_len < 1000 ? msg_len : 1000),
             (const char *)msg);
    /* The output first (its import replaces the caller's output only when it reads back),
     * then the learner (all or nothing); a learner that does not read back takes the output
     * away again, so a malformed envelope changes neither. */
    void *dest = cf__par_out(method);
    cf_status st = CF_OK;
    if (method->output && (st = method->output->import_fn(learn, dest, out, out_len)) != CF_OK)
        return cf_fail_context(st, "results");
    if ((st = cf_learner_import_state(learn, state, state_len)) != CF_OK) {
        if (method->output && method->output->release) method->output->release(dest);
        return cf_fail_context(st, "results");
    }
    if (outcome != CF_OK) return cf_fail((cf_status)outcome, "%s", outcome_msg);
    return CF_OK;
}

/* ---- the outputs of the methods that return something ------------------------------------- */

static size_t lr_find_export(const cf_learner *learn, const void *out, void *buf, size_t size) {
    (void)learn;
    return cf_lr_find_result_export(out, buf, size);
}
static cf_status lr_find_import(const cf_learner *learn, void *out, const void *buf, size_t size) {
    (void)learn;
    return cf_lr_find_result_import(out, buf, size);
}
static void lr_find_release(void *out) {
    cf_lr_find_result_free(out);
}
const cf__par_output cf__par_lr_find_output = {lr_find_export, lr_find_import, NULL,
                                               lr_find_release, sizeof(cf_lr_find_result)};

/* validate's values: [valid_loss, metrics...], 1 + n_metrics doubles. */
static size_t values_export(const cf_learner *learn, const void *out, void *buf, size_t size) {
    size_t need = ((size_t)learn->n_metrics + 1) * sizeof(double);
    if (buf && size >= need) memcpy(buf, out ? out : learn->final_record, need);
    return need;
}
static cf_status values_import(const cf_learner *learn, void *out, const void *buf, size_t size) {
    size_t need = ((size_t)learn->n_metrics + 1) * sizeof(double);
    if (size != need)
        return cf_fail(CF_ERR_INVALID, "validate's values: %zu bytes for %d metrics", size,
                       learn->n_metrics);
    if (out) memcpy(out, buf, need);
    return CF_OK;
}
const cf__par_output cf__par_values_output = {values_export, values_import, NULL, NULL, 0};

static size_t preds_export(const cf_learner *learn, const void *out, void *buf, size_t size) {
    (void)learn;
    return cf_preds_export(out, buf, size);
}
static cf_status preds_import(const cf_learner *learn, void *out, const void *buf, size_t size) {
    (void)learn;
    return cf_preds_import(out, buf, size);
}
static void preds_release(void *out) {
    cf_preds_free(out);
}
/* Each replica filled its own rows (padding excluded) and left the others zero: sums over the
 * replicas give every row. */
static cf_status preds_combine(cf_comm *comm, void *out) {
    cf_preds *p = out;
    cf_status st = cf_comm_allreduce_sum_f32(comm, p->preds.data, cf_tensor_numel(&p->preds));
    if (st == CF_OK)
        st = cf_comm_allreduce_sum_f32(comm, p->targs.data, cf_tensor_numel(&p->targs));
    if (st == CF_OK && p->inputs.data)
        st = cf_comm_allreduce_sum_f32(comm, p->inputs.data, cf_tensor_numel(&p->inputs));
    if (st == CF_OK && p->losses) st = cf_comm_allreduce_sum_f32(comm, p->losses, (size_t)p->n);
    if (st == CF_OK && p->decoded) {
        double *d = cf_calloc((size_t)p->n + 1, sizeof *d);
        if (!d) st = CF_ERR_NOMEM;
        for (int64_t i = 0; st == CF_OK && i < p->n; i++) d[i] = (double)p->decoded[i];
        if (st == CF_OK) st = cf_comm_allreduce_sum_f64(comm, d, (size_t)p->n);
        for (int64_t i = 0; st == CF_OK && i < p->n; i++) p->decoded[i] = (int64_t)d[i];
        cf_free(d);
    }
    return st;
}
const cf__par_output cf__par_preds_output = {preds_export, preds_import, preds_combine,
                                             preds_release, sizeof(cf_preds)};
