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
#include "core/bytes.h"
#include "par/twin.h"

/* What the parts are written from. */
typedef struct home_src {
    const cf_learner *learn;
    const cf__par_method *method;
} home_src;

static size_t fill_learner(const void *src, void *buf, size_t size) {
    return cf_learner_export_state(((const home_src *)src)->learn, buf, size);
}
static size_t fill_output(const void *src, void *buf, size_t size) {
    const home_src *h = src;
    const cf__par_method *m = h->method;
    return m->output ? m->output->export_fn(h->learn, cf__par_out(m), buf, size) : 0;
}

#define HOME_MAGIC 0x4d484643u /* "CFHM" */
#define HOME_VERSION 1u

size_t cf__par_home_write(const cf_learner *learn, const cf__par_method *method, cf_status outcome,
                          const char *outcome_msg, void *buf, size_t size) {
    cf__writer w = {buf, buf ? size : 0, 0};
    home_src src = {learn, method};
    uint32_t head[2] = {HOME_MAGIC, HOME_VERSION};
    cf__put(&w, head, sizeof head);
    cf__put_u64(&w, (uint64_t)(int64_t)outcome);
    cf__put_array(&w, outcome_msg, outcome_msg ? (int64_t)strlen(outcome_msg) : 0, 1);
    cf__put_blob(&w, fill_learner, &src);
    cf__put_blob(&w, fill_output, &src);
    return w.at;
}

cf_status cf__par_home_read(cf_learner *learn, const cf__par_method *method, const void *vbuf,
                            size_t size) {
    return cf__par_home_read_consuming(learn, method, vbuf, size, NULL, NULL);
}

cf_status cf__par_home_read_consuming(cf_learner *learn, const cf__par_method *method,
                                      const void *vbuf, size_t size,
                                      void (*consumed)(const void *p, size_t n, void *ctx),
                                      void *ctx) {
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
    cf__reader rd = cf__reader_make(buf, size, "results");
    cf__get(&rd, head, sizeof head);
    cf__get(&rd, &outcome, sizeof outcome);
    size_t msg_len = 0, state_len = 0, out_len = 0;
    const unsigned char *msg = cf__get_blob(&rd, "message", &msg_len);
    const unsigned char *state = cf__get_blob(&rd, "learner state", &state_len);
    const unsigned char *out = cf__get_blob(&rd, "output", &out_len);
    if (rd.st != CF_OK || rd.at != size)
        return cf_fail(CF_ERR_WORKER,
                       "results: %zu bytes, truncated or with bytes left over at "
                       "offset %zu",
                       size, rd.at);
    char outcome_msg[1024];
    snprintf(outcome_msg, sizeof outcome_msg, "%.*s", (int)(msg_len < 1000 ? msg_len : 1000),
             msg ? (const char *)msg : "");
    /* The output first (its import replaces the caller's output only when it reads back),
     * then the learner (all or nothing); a learner that does not read back takes the output
     * away again, so a malformed envelope changes neither. */
    void *dest = cf__par_out(method);
    cf_status st = CF_OK;
    if (method->output && (st = method->output->import_fn(learn, dest, out, out_len)) != CF_OK)
        return cf_fail_context(st, "results");
    if ((st = cf__learner_import_state_consuming(learn, state, state_len, consumed, ctx)) !=
        CF_OK) {
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
