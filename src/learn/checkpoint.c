/* Checkpoints at batch boundaries and exact resume (corefit/learn.h, "checkpoints"): the
 * checkpoint callback, the stop request that signals raise, the "CFCK" file and the resume
 * steps the loop takes (cf__resume_*). */
#include "corefit/learn.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <zlib.h>

#include "corefit/io.h"
#include "learn/internal.h"

#define CKPT_MAGIC "CFCK"
#define CKPT_VERSION 1
#define CKPT_MAX_BYTES ((size_t)1 << 36)
#define CKPT_MAX_CBS 100000

/* ---- the stop request ------------------------------------------------------------------------
 * One flag, in a shared anonymous page once a checkpoint callback exists, so that a request
 * raised in the caller (a signal handler of the fork supervisor) reaches the workers it forks,
 * and a worker that acts on it clears it for everyone. */

static volatile sig_atomic_t local_request;
static volatile sig_atomic_t *shared_request;

static void map_request_flag(void) {
    if (shared_request) return;
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return; /* requests then stay in this process */
    shared_request = p;
    *shared_request = local_request;
    local_request = 0;
}

void cf_checkpoint_request(void) {
    if (shared_request)
        *shared_request = 1;
    else
        local_request = 1;
}

static bool request_pending(void) {
    return shared_request ? *shared_request != 0 : local_request != 0;
}

static void clear_request(void) {
    if (shared_request) *shared_request = 0;
    local_request = 0;
}

void cf__checkpoint_fit_ended(void) {
    clear_request();
}

static void on_stop_signal(int sig) {
    (void)sig;
    cf_checkpoint_request();
}

/* ---- the module streams -------------------------------------------------------------------- */

static int64_t count_modules(const cf_module *m) {
    int64_t n = 1;
    for (int i = 0; i < m->n_children; i++) n += count_modules(m->children[i]);
    return n;
}

static void put_streams(cf__writer *w, const cf_module *m) {
    cf__put(w, m->rng.s, sizeof m->rng.s);
    for (int i = 0; i < m->n_children; i++) put_streams(w, m->children[i]);
}

static const unsigned char *set_streams(cf_module *m, const unsigned char *p) {
    memcpy(m->rng.s, p, sizeof m->rng.s);
    p += sizeof m->rng.s;
    for (int i = 0; i < m->n_children; i++) p = set_streams(m->children[i], p);
    return p;
}

/* ---- the call's callbacks ------------------------------------------------------------------ */

/* Whether an active callback belongs to the call (not the learner's own lists, whose state the
 * learner's state carries) and has state to keep. */
static bool call_cb(const cf_learner *learn, const cf_callback *cb) {
    if (!cb->export_state) return false;
    for (int i = 0; i < learn->n_cbs; i++)
        if (learn->cbs[i] == cb) return false;
    for (int i = 0; i < learn->n_master_cbs; i++)
        if (learn->master_cbs[i] == cb) return false;
    return true;
}

/* Which occurrence of its name a callback is among the active ones (0 for the first). */
static int occurrence(const cf_learner *learn, int index) {
    const char *name = learn->active[index]->name ? learn->active[index]->name : "";
    int k = 0;
    for (int i = 0; i < index; i++)
        if (call_cb(learn, learn->active[i]) &&
            strcmp(learn->active[i]->name ? learn->active[i]->name : "", name) == 0)
            k++;
    return k;
}

static size_t export_learner(const void *learn, void *buf, size_t size) {
    return cf_learner_export_state(learn, buf, size);
}
static size_t export_cb(const void *cb, void *buf, size_t size) {
    const cf_callback *c = cb;
    return c->export_state(c, buf, size);
}

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct ckpt_src {
    const cf_learner *learn;
    const float *rank_buffers; /* world * n_buffers (world > 1) */
} ckpt_src;

static void put_checkpoint(const void *obj, cf__writer *w) {
    const ckpt_src *src = obj;
    const cf_learner *learn = src->learn;
    const cf_model *m = learn->model;
    cf__put_header(w, CKPT_MAGIC, CKPT_VERSION);
    cf__put_str(w, learn->fit_params);
    /* the position: after training batch `iter` of `epoch` */
    cf__put_u64(w, (uint64_t)learn->epoch);
    cf__put_u64(w, (uint64_t)(learn->iter + 1));
    cf__put_u64(w, (uint64_t)learn->train_iter);
    cf__put_f64(w, learn->pct_train);
    cf__put_f64(w, learn->smooth_loss);
    cf__put_f64(w, (double)learn->loss_value);
    cf__put_blob(w, export_learner, learn);
    int n_call = 0;
    for (int i = 0; i < learn->n_active; i++) n_call += call_cb(learn, learn->active[i]);
    cf__put_u64(w, (uint64_t)n_call);
    for (int i = 0; i < learn->n_active; i++) {
        const cf_callback *cb = learn->active[i];
        if (!call_cb(learn, cb)) continue;
        cf__put_str(w, cb->name);
        cf__put_u64(w, (uint64_t)occurrence(learn, i));
        cf__put_blob(w, export_cb, cb);
    }
    cf__put_u64(w, (uint64_t)count_modules(m->root));
    put_streams(w, m->root);
    int world = learn->replica.world > 1 ? learn->replica.world : 1;
    cf__put_u64(w, (uint64_t)world);
    cf__put_array(w, src->rank_buffers, world > 1 ? (int64_t)(world * m->n_buffers) : 0,
                  sizeof(float));
}

/* Every replica calls it at the same batch; the master writes the file. */
static cf_status write_checkpoint(cf_learner *learn, const char *path) {
    const cf_model *m = learn->model;
    int world = learn->replica.world > 1 ? learn->replica.world : 1;
    float *all = NULL;
    cf_status st = CF_OK;
    if (world > 1 && m->n_buffers) {
        if (learn->replica.is_master) {
            all = cf_malloc((size_t)world * m->n_buffers * sizeof(float));
            if (!all) st = cf_fail(CF_ERR_NOMEM, "checkpoint: buffers of %d replicas", world);
        }
        /* a failed allocation on rank 0 must not leave the others waiting: gather anyway into
         * a scratch of one rank (rank 0 then fails below) */
        float scratch = 0;
        if (learn->replica.gather) {
            cf_status gs = learn->replica.gather(learn, m->buffers, m->n_buffers * sizeof(float),
                                                 all ? (void *)all : (void *)&scratch);
            if (st == CF_OK) st = gs;
        } else if (st == CF_OK) {
            st = cf_fail(CF_ERR_STATE, "checkpoint: a replica of %d without gather", world);
        }
        (void)scratch;
    }
    if (st == CF_OK && learn->replica.is_master) {
        ckpt_src src = {learn, all};
        size_t n = cf__export(put_checkpoint, &src, NULL, 0);
        unsigned char *bytes = cf_malloc(n + 4);
        if (!bytes) {
            st = cf_fail(CF_ERR_NOMEM, "checkpoint %s: %zu bytes", path, n);
        } else {
            cf__export(put_checkpoint, &src, bytes, n);
            uint32_t crc = (uint32_t)crc32(0L, bytes, (uInt)0);
            size_t done = 0;
            while (done < n) { /* crc32 takes uInt lengths */
                size_t part = n - done > (1u << 30) ? (1u << 30) : n - done;
                crc = (uint32_t)crc32(crc, bytes + done, (uInt)part);
                done += part;
            }
            memcpy(bytes + n, &crc, 4);
            st = cf_write_file_atomic(path, bytes, n + 4);
            cf_free(bytes);
        }
    }
    cf_free(all);
    /* every replica learns how the write went before going on: one that returns (to stop)
     * while rank 0 still writes would have the group torn down under it */
    if (world > 1 && learn->replica.broadcast) {
        int64_t outcome = st;
        cf_status bs = learn->replica.broadcast(learn, &outcome, sizeof outcome);
        if (bs != CF_OK) return bs;
        if (!learn->replica.is_master && outcome != CF_OK)
            return cf_fail((cf_status)outcome, "checkpoint %s: rank 0 could not write it", path);
    }
    return st;
}

/* ---- the callback -------------------------------------------------------------------------- */

typedef struct ckpt_state {
    char *fname;
    int every;
    bool signals;
    struct sigaction old_term, old_int;
    bool have_term, have_int;
} ckpt_state;

const char *cf_checkpoint_path(const cf_learner *learn, const char *fname, char *buf, size_t n) {
    if (!fname || !fname[0]) fname = "checkpoint";
    if (strchr(fname, '/'))
        snprintf(buf, n, "%s", fname);
    else
        snprintf(buf, n, "%s/%s/%s.ckpt", learn->path ? learn->path : ".",
                 learn->model_dir ? learn->model_dir : "models", fname);
    return buf;
}

static cf_status ck_before_fit(cf_callback *cb, cf_learner *learn) {
    ckpt_state *s = cb->state;
    if (!learn->replica.is_master) return CF_OK;
    if (!strchr(s->fname, '/')) {
        /* path/model_dir, as a model save makes it (a failure shows when the file is written) */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", learn->path ? learn->path : ".");
        mkdir(dir, 0755);
        snprintf(dir, sizeof dir, "%s/%s", learn->path ? learn->path : ".",
                 learn->model_dir ? learn->model_dir : "models");
        mkdir(dir, 0755);
    }
    /* a FIFO or a socket there is refused now, not at the first checkpoint */
    char path[4096];
    bool through;
    cf_checkpoint_path(learn, s->fname, path, sizeof path);
    if (cf_output_check(path, &through) != CF_OK) return cf_fail_context(CF_ERR_IO, "checkpoint");
    return CF_OK;
}

static cf_status ck_after_batch(cf_callback *cb, cf_learner *learn) {
    ckpt_state *s = cb->state;
    if (!learn->training || learn->validating || learn->in_lr_find || !learn->fit_params)
        return CF_OK;
    bool stop = request_pending();
    cf_status st = CF_OK;
    if (learn->replica.agree_any && (st = learn->replica.agree_any(learn, stop, &stop)) != CF_OK)
        return st;
    bool periodic = s->every > 0 && learn->train_iter % s->every == 0;
    if (!stop && !periodic) return CF_OK;
    char path[4096];
    cf_checkpoint_path(learn, s->fname, path, sizeof path);
    st = write_checkpoint(learn, path);
    if (st == CF_ERR_IO && !stop) {
        /* A periodic checkpoint that cannot be written (a full disk, a quota) costs only what
         * it would have saved: the previous one stays (the write is atomic), the fit goes on,
         * and the next one tries again. Every replica agreed on the outcome; rank 0 says why. */
        if (learn->replica.is_master) {
            fprintf(stderr,
                    "corefit: warning: checkpoint after iteration %lld not written (%s); the "
                    "previous checkpoint is kept and training goes on\n",
                    (long long)learn->train_iter, cf_last_error());
            fflush(stderr);
        }
        cf_clear_error();
        return CF_OK;
    }
    if (st != CF_OK) return st;
    if (!stop) return CF_OK;
    clear_request();
    return cf_fail(CF_ERR_INTERRUPTED,
                   "stopped on request after batch %lld of epoch %d (iteration %lld): checkpoint "
                   "%s written; continue with .resume = \"%s\" (corefit train --resume %s)",
                   (long long)learn->iter + 1, learn->epoch + 1, (long long)learn->train_iter, path,
                   path, path);
}

static void ck_free(cf_callback *cb) {
    ckpt_state *s = cb->state;
    if (s) {
        /* put back what is still ours */
        struct sigaction now;
        if (s->have_term && sigaction(SIGTERM, NULL, &now) == 0 && now.sa_handler == on_stop_signal)
            sigaction(SIGTERM, &s->old_term, NULL);
        if (s->have_int && sigaction(SIGINT, NULL, &now) == 0 && now.sa_handler == on_stop_signal)
            sigaction(SIGINT, &s->old_int, NULL);
        cf_free(s->fname);
    }
    cf_free(s);
    cf_free(cb);
}

cf_callback *cf_checkpoint_cb_(const cf_checkpoint_opts *o) {
    cf_checkpoint_opts d = {0};
    if (!o) o = &d;
    if (o->every_batches < 0) {
        cf_fail(CF_ERR_INVALID, "checkpoint callback: every_batches %d < 0", o->every_batches);
        return NULL;
    }
    char *fname = cf_strdup(o->fname && o->fname[0] ? o->fname : "checkpoint");
    cf_callback *cb =
        fname ? cf_callback_new("CheckpointCallback", CF_ORDER_CHECKPOINT, sizeof(ckpt_state))
              : NULL;
    if (!cb) {
        cf_free(fname);
        return NULL;
    }
    ckpt_state *s = cb->state;
    map_request_flag(); /* before any fork of the fit it joins */
    s->fname = fname;
    s->every = o->every_batches;
    s->signals = o->signals;
    if (o->signals) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        s->have_term = sigaction(SIGTERM, &sa, &s->old_term) == 0;
        s->have_int = sigaction(SIGINT, &sa, &s->old_int) == 0;
    }
    cb->skip_valid = true;
    cb->free = ck_free;
    cb->on[CF_EV_BEFORE_FIT] = ck_before_fit;
    cb->on[CF_EV_AFTER_BATCH] = ck_after_batch;
    return cb;
}

/* ---- the fit's parameters ------------------------------------------------------------------ */

typedef struct text {
    char *buf;
    size_t size, at;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->at, t->at < t->size ? t->size - t->at : 0, fmt, ap);
    va_end(ap);
    if (n > 0) t->at = t->at + (size_t)n < t->size ? t->at + (size_t)n : t->size - 1;
}

char *cf__fit_params(const cf_learner *learn, int n_epoch, cf_lr lr, double wd, bool reset_opt,
                     int start_epoch, const char *method_params) {
    size_t size = 1024 + (method_params ? strlen(method_params) : 0);
    text t = {cf_malloc(size), size, 0};
    if (!t.buf) return NULL;
    t.buf[0] = '\0';
    const cf_dataloader *train = learn->dls ? learn->dls->train : NULL;
    const cf_dataset *tds = learn->dls ? learn->dls->train_ds : NULL;
    const cf_dataset *vds = learn->dls ? learn->dls->valid_ds : NULL;
    add(&t, "%s n_epoch=%d lr=%d:%.17g:%.17g wd=%.17g reset_opt=%d start_epoch=%d",
        method_params ? method_params : "method=fit", n_epoch, (int)lr.kind, lr.start, lr.stop, wd,
        reset_opt, start_epoch);
    add(&t, " weights=%zu buffers=%zu metrics=%d", learn->model->n_weights, learn->model->n_buffers,
        learn->n_metrics);
    add(&t, " n_train=%lld n_valid=%lld", tds ? (long long)tds->n : 0LL,
        vds ? (long long)vds->n : 0LL);
    if (train) {
        const cf_dl_options *o = cf_dataloader_options(train);
        add(&t, " bs=%d data_seed=%llu batches=%lld", o->bs, (unsigned long long)o->seed,
            (long long)cf_dataloader_len(train));
    }
    add(&t, " world=%d shard=%d", learn->replica.world > 1 ? learn->replica.world : 1,
        learn->replica.world > 1 ? (int)learn->replica.shard_mode : 0);
    return t.buf;
}

/* The first key whose value differs (or that one side lacks): a message naming both values. */
static cf_status params_mismatch(const char *path, const char *theirs, const char *ours) {
    const char *p = theirs;
    while (*p) {
        while (*p == ' ') p++;
        const char *end = strchr(p, ' ');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t klen = eq ? (size_t)(eq - p) : len;
        /* find the key in ours */
        const char *q = ours, *found = NULL;
        size_t flen = 0;
        while (*q && !found) {
            while (*q == ' ') q++;
            const char *qe = strchr(q, ' ');
            size_t ql = qe ? (size_t)(qe - q) : strlen(q);
            if (ql > klen && q[klen] == '=' && strncmp(q, p, klen) == 0) found = q, flen = ql;
            q += ql;
        }
        if (!found || flen != len || strncmp(found, p, len) != 0)
            return cf_fail(CF_ERR_INVALID,
                           "checkpoint %s was written by a fit with %.*s, this call has %.*s: "
                           "resume with the parameters of the fit that wrote it",
                           path, (int)len, p, found ? (int)flen : 8, found ? found : "(absent)");
        p += len;
    }
    return cf_fail(CF_ERR_INVALID,
                   "checkpoint %s was written by a fit with other parameters (%s; this call: %s)",
                   path, theirs, ours);
}

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct cf__resume {
    void *bytes; /* the file */
    size_t size;
    char *path;
    int epoch;
    int64_t next_batch, train_iter;
    double pct_train, smooth_loss, loss_value;
    const void *learner_state;
    size_t learner_bytes;
    int n_cbs;
    char **cb_names;
    int *cb_occurrence;
    const void **cb_state;
    size_t *cb_bytes;
    int64_t n_modules;
    const unsigned char *streams;
    int world;
    const float *rank_buffers;
    int64_t n_rank_floats;
} cf__resume;

void cf__resume_free(cf__resume *r) {
    if (!r) return;
    for (int i = 0; r->cb_names && i < r->n_cbs; i++) cf_free(r->cb_names[i]);
    cf_free(r->cb_names);
    cf_free(r->cb_occurrence);
    cf_free(r->cb_state);
    cf_free(r->cb_bytes);
    cf_free(r->path);
    cf_free(r->bytes);
    cf_free(r);
}

/* Rank 0 reads; the others receive its bytes (or learn that it could not read). */
static cf_status read_bytes(cf_learner *learn, const char *path, void **data, size_t *size) {
    *data = NULL;
    *size = 0;
    bool group = learn->replica.broadcast && learn->replica.world > 1;
    cf_status st = CF_OK;
    if (!group || learn->replica.is_master) st = cf_read_file(path, CKPT_MAX_BYTES, data, size);
    if (!group) return st;
    uint64_t head[2] = {(uint64_t)(int64_t)st, *size};
    cf_status bs = learn->replica.broadcast(learn, head, sizeof head);
    if (bs != CF_OK) {
        cf_free(*data);
        *data = NULL;
        return bs;
    }
    if ((cf_status)(int64_t)head[0] != CF_OK) {
        if (learn->replica.is_master) return st;
        return cf_fail((cf_status)(int64_t)head[0], "checkpoint %s: rank 0 could not read it",
                       path);
    }
    if (!learn->replica.is_master) {
        *size = (size_t)head[1];
        *data = cf_malloc(*size + 1);
        if (!*data) return cf_fail(CF_ERR_NOMEM, "checkpoint %s: %zu bytes", path, *size);
    }
    /* every replica takes part even when it could not allocate (rank 0 then has the error
     * reported by the replica that failed) */
    bs = learn->replica.broadcast(learn, *data, *size);
    if (bs != CF_OK) {
        cf_free(*data);
        *data = NULL;
    }
    return bs;
}

/* The position and schedule a checkpoint records must be one this fit passes through: the
 * CRC only says the file is as written, not that it was written by this fit (a crafted or
 * edited file with a fresh CRC). The fit's first training iteration after `start_epoch`
 * skipped epochs is 0; pct_train is the fraction of the n_epoch epochs done. */
static void check_position(cf__reader *rr, const cf__resume *r, int n_epoch, int start_epoch,
                           int64_t batches) {
    if (rr->st != CF_OK) return;
    if (r->epoch < start_epoch || r->epoch >= n_epoch) {
        cf__reader_fail(rr, "epoch %d, this fit runs epochs %d to %d", r->epoch, start_epoch,
                        n_epoch - 1);
        return;
    }
    if (r->next_batch < 1 || r->next_batch > batches) {
        cf__reader_fail(rr, "batch %lld, an epoch of this fit has batches 1 to %lld",
                        (long long)r->next_batch, (long long)batches);
        return;
    }
    int64_t iter = (int64_t)(r->epoch - start_epoch) * batches + r->next_batch;
    if (r->train_iter != iter) {
        cf__reader_fail(rr, "iteration %lld, but epoch %d batch %lld is iteration %lld of this fit",
                        (long long)r->train_iter, r->epoch, (long long)r->next_batch,
                        (long long)iter);
        return;
    }
    double pct = ((double)r->epoch + (double)r->next_batch / (double)batches) / n_epoch;
    if (!(fabs(r->pct_train - pct) <= 1e-6))
        cf__reader_fail(rr, "pct_train %.17g, but epoch %d batch %lld of %d epochs is %.17g",
                        r->pct_train, r->epoch, (long long)r->next_batch, n_epoch, pct);
    else if (!isfinite(r->smooth_loss) || !isfinite(r->loss_value))
        cf__reader_fail(rr, "smoothed loss %g, last loss %g (not finite)", r->smooth_loss,
                        r->loss_value);
}

cf_status cf__resume_load(cf_learner *learn, const char *path, const char *params, int n_epoch,
                          int start_epoch, cf__resume **out) {
    *out = NULL;
    cf__resume *r = cf_calloc(1, sizeof *r);
    if (!r || !(r->path = cf_strdup(path))) {
        cf_free(r);
        return cf_fail(CF_ERR_NOMEM, "checkpoint %s", path);
    }
    cf_status st = read_bytes(learn, path, &r->bytes, &r->size);
    if (st != CF_OK) {
        cf__resume_free(r);
        return cf_fail_context(st, "resuming from checkpoint");
    }
    if (r->size < 4 + 8) {
        const size_t size = r->size;
        cf__resume_free(r);
        return cf_fail(CF_ERR_INVALID, "checkpoint %s: %zu bytes is too short to be one", path,
                       size);
    }
    size_t n = r->size - 4;
    const unsigned char *b = r->bytes;
    uint32_t crc_file, crc = (uint32_t)crc32(0L, b, 0);
    memcpy(&crc_file, b + n, 4);
    for (size_t done = 0; done < n;) {
        size_t part = n - done > (1u << 30) ? (1u << 30) : n - done;
        crc = (uint32_t)crc32(crc, b + done, (uInt)part);
        done += part;
    }
    char what[4200];
    snprintf(what, sizeof what, "checkpoint %s", path);
    cf__reader rd = cf__reader_make(b, n, what);
    cf__reader *rr = &rd;
    cf__get_header(rr, CKPT_MAGIC, CKPT_VERSION);
    if (rd.st == CF_OK && crc != crc_file)
        cf__reader_fail(rr, "CRC-32 0x%08x of the contents, the file records 0x%08x (damaged)", crc,
                        crc_file);
    char *theirs = cf__get_str(rr, "fit parameters");
    if (rd.st == CF_OK && strcmp(theirs, params) != 0) {
        cf__resume_free(r);
        st = params_mismatch(path, theirs, params);
        cf_free(theirs);
        return st;
    }
    cf_free(theirs);
    uint64_t epoch = cf__get_u64(rr);
    r->epoch = epoch > INT32_MAX ? -1 : (int)epoch;
    r->next_batch = (int64_t)cf__get_u64(rr);
    r->train_iter = (int64_t)cf__get_u64(rr);
    r->pct_train = cf__get_f64(rr);
    r->smooth_loss = cf__get_f64(rr);
    r->loss_value = cf__get_f64(rr);
    int64_t batches = learn->dls && learn->dls->train ? cf_dataloader_len(learn->dls->train) : 0;
    check_position(rr, r, n_epoch, start_epoch, batches);
    r->learner_state = cf__get_blob(rr, "learner state", &r->learner_bytes);
    int64_t n_cbs = cf__get_count(rr, "call callbacks", CKPT_MAX_CBS, 16);
    if (rd.st == CF_OK) {
        r->cb_names = cf_calloc((size_t)n_cbs + 1, sizeof *r->cb_names);
        r->cb_occurrence = cf_calloc((size_t)n_cbs + 1, sizeof *r->cb_occurrence);
        r->cb_state = cf_calloc((size_t)n_cbs + 1, sizeof *r->cb_state);
        r->cb_bytes = cf_calloc((size_t)n_cbs + 1, sizeof *r->cb_bytes);
        if (!r->cb_names || !r->cb_occurrence || !r->cb_state || !r->cb_bytes)
            rd.st = cf_fail(CF_ERR_NOMEM, "checkpoint %s", path);
    }
    for (int64_t i = 0; rd.st == CF_OK && i < n_cbs; i++) {
        r->cb_names[i] = cf__get_str(rr, "callback name");
        if (r->cb_names[i]) r->n_cbs++;
        r->cb_occurrence[i] = (int)cf__get_u64(rr);
        r->cb_state[i] = cf__get_blob(rr, "callback state", &r->cb_bytes[i]);
    }
    r->n_modules = (int64_t)cf__get_u64(rr);
    if (rd.st == CF_OK && r->n_modules != count_modules(learn->model->root))
        cf__reader_fail(rr, "%lld modules, this model has %lld", (long long)r->n_modules,
                        (long long)count_modules(learn->model->root));
    r->streams = cf__get_view(rr, r->n_modules, sizeof(uint64_t) * 4);
    r->world = (int)cf__get_u64(rr);
    int world = learn->replica.world > 1 ? learn->replica.world : 1;
    if (rd.st == CF_OK && r->world != world)
        cf__reader_fail(rr, "written by %d replicas, this fit has %d", r->world, world);
    r->n_rank_floats = cf__get_count(rr, "replica buffers", INT64_MAX / 8, sizeof(float));
    if (rd.st == CF_OK &&
        r->n_rank_floats != (world > 1 ? (int64_t)(world * learn->model->n_buffers) : 0))
        cf__reader_fail(rr, "%lld replica buffer values for %d replicas of %zu",
                        (long long)r->n_rank_floats, world, learn->model->n_buffers);
    r->rank_buffers = cf__get_view(rr, r->n_rank_floats, sizeof(float));
    cf__get_end(rr);
    if (rd.st != CF_OK) {
        cf__resume_free(r);
        return rd.st;
    }
    *out = r;
    return CF_OK;
}

/* ---- resuming ------------------------------------------------------------------------------ */

cf_status cf__resume_apply_state(cf_learner *learn, int *epoch) {
    cf__resume *r = learn->resume;
    cf_status st = cf_learner_import_state(learn, r->learner_state, r->learner_bytes);
    if (st != CF_OK) return cf_fail_context(st, "checkpoint %s", r->path);
    int64_t per_epoch = cf_dataloader_len(learn->dls->train);
    st = cf__recorder_reserve_keep(&learn->recorder, per_epoch * learn->n_epoch + 1,
                                   learn->n_epoch + 1);
    if (st != CF_OK) return st;
    for (int i = 0; i < learn->n_active; i++) {
        cf_callback *cb = learn->active[i];
        if (!call_cb(learn, cb)) continue;
        int k = occurrence(learn, i);
        int found = -1;
        for (int j = 0; j < r->n_cbs && found < 0; j++)
            if (r->cb_occurrence[j] == k && strcmp(r->cb_names[j], cb->name ? cb->name : "") == 0)
                found = j;
        if (found < 0)
            return cf_fail(CF_ERR_INVALID, "checkpoint %s holds no state for callback %s", r->path,
                           cb->name ? cb->name : "(unnamed)");
        if (!cb->import_state && r->cb_bytes[found])
            return cf_fail(CF_ERR_INVALID, "checkpoint %s: callback %s cannot import its state",
                           r->path, cb->name);
        if (r->cb_bytes[found] &&
            (st = cb->import_state(cb, r->cb_state[found], r->cb_bytes[found])) != CF_OK)
            return cf_fail_context(st, "checkpoint %s", r->path);
    }
    set_streams(learn->model->root, r->streams);
    if (r->world > 1 && learn->model->n_buffers)
        memcpy(learn->model->buffers,
               r->rank_buffers + (size_t)learn->replica.rank * learn->model->n_buffers,
               learn->model->n_buffers * sizeof(float));
    *epoch = r->epoch;
    return CF_OK;
}

int64_t cf__resume_apply_position(cf_learner *learn) {
    cf__resume *r = learn->resume;
    int64_t next = r->next_batch;
    learn->train_iter = r->train_iter;
    learn->pct_train = r->pct_train;
    learn->smooth_loss = r->smooth_loss;
    learn->loss_value = (float)r->loss_value;
    cf__resume_free(r);
    learn->resume = NULL;
    return next;
}
