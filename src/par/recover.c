/* In-place recovery of a fork group (.par.max_restarts): the commits each replica keeps in
 * shared memory, and how a fresh replica resumes from one.
 *
 * Every replica writes its own commit (its position in the fit and cf_learner_export_state of
 * its learner) at the end of every epoch, into the older of its two slots: the slot's sequence
 * number is cleared, the bytes written, then the number published. A replica killed while it
 * writes leaves that slot unpublished and the other one intact. Replicas run in lock step (a
 * collective at the end of every epoch), so when one writes commit c + 1 every other has
 * published c: the latest commit every replica holds always survives.
 *
 * Each replica's commit is its own (BatchNorm statistics and callback state may differ between
 * replicas), so a restarted replica r resumes from replica r's commit. The supervisor never
 * reads a commit: it only picks the latest sequence number every replica holds. */
#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "par/par_internal.h"
#include "par/twin.h"

#define COMMIT_MAGIC 0x4d434643u /* "CFCM" */
#define COMMIT_VERSION 1u

typedef struct commit_slot {
    _Atomic uint64_t seq; /* 0: empty or being written */
    int fd;               /* a memory file holding the commit's bytes */
} commit_slot;

typedef struct commit_rank {
    alignas(CF_SHM_LINE) _Atomic int64_t epoch; /* the training batch this replica works on */
    _Atomic int64_t batch;                      /* (-1: none yet) */
    commit_slot slot[2];
} commit_rank;

struct cf__commit_area {
    int nranks;
    size_t map_bytes;
    commit_rank ranks[];
};

/* The bytes of a commit: this header, then the learner's state. */
typedef struct commit_header {
    uint32_t magic, version;
    int64_t epoch;      /* the first epoch still to run */
    int64_t train_iter; /* training batches run before it */
    uint64_t seq;
    uint64_t state_bytes;
} commit_header;

static int memory_file(void) {
    int fd = memfd_create("corefit-commit", MFD_CLOEXEC);
    if (fd >= 0) return fd;
    FILE *f = tmpfile(); /* kernels without memfd */
    if (!f) return -1;
    fd = dup(fileno(f));
    fclose(f);
    return fd;
}

cf_status cf__commit_area_new(int nranks, cf__commit_area **out) {
    *out = NULL;
    size_t bytes = sizeof(cf__commit_area) + (size_t)nranks * sizeof(commit_rank);
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return cf_fail(CF_ERR_NOMEM, "recovery: cannot map %zu bytes of shared memory: %s", bytes,
                       strerror(errno));
    cf__commit_area *a = map;
    a->nranks = nranks;
    a->map_bytes = bytes;
    for (int r = 0; r < nranks; r++) {
        atomic_store(&a->ranks[r].epoch, -1);
        atomic_store(&a->ranks[r].batch, -1);
        for (int k = 0; k < 2; k++) a->ranks[r].slot[k].fd = -1;
    }
    for (int r = 0; r < nranks; r++)
        for (int k = 0; k < 2; k++)
            if ((a->ranks[r].slot[k].fd = memory_file()) < 0) {
                int err = errno;
                cf__commit_area_free(a);
                return cf_fail(CF_ERR_NOMEM, "recovery: cannot create a memory file: %s",
                               strerror(err));
            }
    *out = a;
    return CF_OK;
}

void cf__commit_area_free(cf__commit_area *a) {
    if (!a) return;
    for (int r = 0; r < a->nranks; r++)
        for (int k = 0; k < 2; k++)
            if (a->ranks[r].slot[k].fd >= 0) close(a->ranks[r].slot[k].fd);
    munmap(a, a->map_bytes);
}

static bool holds(const cf__commit_area *a, int r, uint64_t seq) {
    return atomic_load(&a->ranks[r].slot[seq % 2].seq) == seq;
}

uint64_t cf__commit_latest(const cf__commit_area *a) {
    if (!a || a->nranks < 1) return 0;
    uint64_t s0 = atomic_load(&a->ranks[0].slot[0].seq);
    uint64_t s1 = atomic_load(&a->ranks[0].slot[1].seq);
    uint64_t cand[2] = {s0 > s1 ? s0 : s1, s0 > s1 ? s1 : s0};
    for (int i = 0; i < 2; i++) {
        if (!cand[i]) continue;
        bool all = true;
        for (int r = 0; r < a->nranks && all; r++) all = holds(a, r, cand[i]);
        if (all) return cand[i];
    }
    return 0;
}

bool cf__commit_position(const cf__commit_area *a, int rank, int64_t *epoch, int64_t *batch) {
    if (!a || rank < 0 || rank >= a->nranks) return false;
    *epoch = atomic_load(&a->ranks[rank].epoch);
    *batch = atomic_load(&a->ranks[rank].batch);
    return *epoch >= 0;
}

void cf__commit_forget_positions(cf__commit_area *a) {
    for (int r = 0; a && r < a->nranks; r++) {
        atomic_store(&a->ranks[r].epoch, -1);
        atomic_store(&a->ranks[r].batch, -1);
    }
}

/* Maps rank r's commit seq read-only; NULL (error set) when it is not there or malformed. */
static const commit_header *map_commit(const cf__commit_area *a, int r, uint64_t seq,
                                       size_t *bytes) {
    if (!holds(a, r, seq)) {
        cf_fail(CF_ERR_STATE, "recovery: worker %d holds no commit %llu", r,
                (unsigned long long)seq);
        return NULL;
    }
    int fd = a->ranks[r].slot[seq % 2].fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < sizeof(commit_header)) {
        cf_fail(CF_ERR_STATE, "recovery: commit %llu of worker %d is %lld bytes",
                (unsigned long long)seq, r, (long long)sb.st_size);
        return NULL;
    }
    *bytes = (size_t)sb.st_size;
    void *map = mmap(NULL, *bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        cf_fail(CF_ERR_NOMEM, "recovery: cannot map a commit of %zu bytes: %s", *bytes,
                strerror(errno));
        return NULL;
    }
    const commit_header *h = map;
    if (h->magic != COMMIT_MAGIC || h->version != COMMIT_VERSION || h->seq != seq ||
        h->state_bytes != *bytes - sizeof *h) {
        cf_fail(CF_ERR_STATE,
                "recovery: commit %llu of worker %d: magic 0x%08x version %u seq %llu",
                (unsigned long long)seq, r, h->magic, h->version, (unsigned long long)h->seq);
        munmap(map, *bytes);
        return NULL;
    }
    return h;
}

int64_t cf__commit_epoch(const cf__commit_area *a, uint64_t seq) {
    size_t bytes = 0;
    const commit_header *h = seq ? map_commit(a, 0, seq, &bytes) : NULL;
    if (!h) return 0;
    int64_t e = h->epoch;
    munmap((void *)h, bytes);
    return e;
}

/* ---- the replica's side -------------------------------------------------------------------- */

typedef struct commit_cb_state {
    cf__commit_area *area;
    int rank;
    uint64_t seq;    /* the last commit written (or resumed from) */
    int start_epoch; /* epochs before it are skipped: they commit nothing */
} commit_cb_state;

/* First of all at every training batch: where this replica is, for the supervisor's report. */
static cf_status position_before_batch(cf_callback *cb, cf_learner *learn) {
    commit_cb_state *s = cb->state;
    if (!learn->training || learn->validating || learn->in_lr_find) return CF_OK;
    commit_rank *me = &s->area->ranks[s->rank];
    atomic_store_explicit(&me->batch, learn->iter, memory_order_relaxed);
    atomic_store_explicit(&me->epoch, learn->epoch, memory_order_relaxed);
    return CF_OK;
}

static cf_status write_commit(commit_cb_state *s, cf_learner *learn, int64_t next_epoch) {
    commit_slot *slot = &s->area->ranks[s->rank].slot[(s->seq + 1) % 2];
    size_t state = cf_learner_export_state(learn, NULL, 0);
    size_t need = sizeof(commit_header) + state;
    atomic_store(&slot->seq, 0);
    if (ftruncate(slot->fd, (off_t)need) != 0)
        return cf_fail(CF_ERR_NOMEM, "recovery: cannot size a commit to %zu bytes: %s", need,
                       strerror(errno));
    void *map = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, slot->fd, 0);
    if (map == MAP_FAILED)
        return cf_fail(CF_ERR_NOMEM, "recovery: cannot map a commit of %zu bytes: %s", need,
                       strerror(errno));
    commit_header h = {COMMIT_MAGIC,      COMMIT_VERSION, next_epoch,
                       learn->train_iter, s->seq + 1,     state};
    memcpy(map, &h, sizeof h);
    size_t wrote = cf_learner_export_state(learn, (char *)map + sizeof h, state);
    munmap(map, need);
    if (wrote != state)
        return cf_fail(CF_ERR_STATE, "recovery: commit: %zu bytes written, %zu measured", wrote,
                       state);
    s->seq++;
    atomic_store_explicit(&slot->seq, s->seq, memory_order_release);
    return CF_OK;
}

/* Last of all at the end of every epoch (after the Recorder and the trackers): a commit. An
 * epoch that a callback cancelled the fit at is not committed (the callbacks after it did not
 * run), so a restart redoes it and decides the same. */
static cf_status commit_after_epoch(cf_callback *cb, cf_learner *learn) {
    commit_cb_state *s = cb->state;
    if (learn->validating || learn->in_lr_find || learn->epoch < s->start_epoch) return CF_OK;
    return write_commit(cb->state, learn, learn->epoch + 1);
}

static void free_with_state(cf_callback *cb) {
    cf_free(cb->state);
    cf_free(cb);
}

/* ---- resuming ------------------------------------------------------------------------------ */

/* The Recorder of the commit goes back in after the Recorder's own before_fit cleared it, and
 * the epochs before the commit (skipped, fastai's SkipToEpoch) add no rows and print none. */
typedef struct resume_cb_state {
    cf_recorder saved;
    double *final_record;
    int n_final_record;
    int64_t train_iter;
    int start_epoch;
    bool logging;
} resume_cb_state;

static void copy_run(double *dst, const double *src, int64_t n) {
    if (n > 0) memcpy(dst, src, (size_t)n * sizeof *dst);
}

static cf_status resume_before_fit(cf_callback *cb, cf_learner *learn) {
    resume_cb_state *s = cb->state;
    cf_recorder *rec = &learn->recorder, *old = &s->saved;
    s->logging = learn->logging;
    if (old->n_batches > rec->batch_capacity || old->n_hps > rec->batch_capacity ||
        old->n_epochs > rec->epoch_capacity || old->n_values != rec->n_values)
        return cf_fail(CF_ERR_STATE,
                       "recovery: the committed Recorder (%lld batches, %d epochs of %d values) "
                       "does not fit this fit's (%lld, %d, %d)",
                       (long long)old->n_batches, old->n_epochs, old->n_values,
                       (long long)rec->batch_capacity, rec->epoch_capacity, rec->n_values);
    copy_run(rec->lrs, old->lrs, old->n_batches);
    copy_run(rec->moms, old->moms, old->n_batches);
    copy_run(rec->losses, old->losses, old->n_batches);
    copy_run(rec->hp_lr, old->hp_lr, old->n_hps);
    copy_run(rec->hp_mom, old->hp_mom, old->n_hps);
    copy_run(rec->values, old->values, (int64_t)old->n_epochs * old->n_values);
    copy_run(rec->times, old->times, old->n_epochs);
    if (old->n_epochs) memcpy(rec->iters, old->iters, (size_t)old->n_epochs * sizeof *rec->iters);
    rec->n_batches = old->n_batches;
    rec->n_hps = old->n_hps;
    rec->n_epochs = old->n_epochs;
    rec->smooth_val = old->smooth_val;
    rec->smooth_count = old->smooth_count;
    learn->train_iter = s->train_iter;
    return CF_OK;
}

static cf_status resume_before_epoch(cf_callback *cb, cf_learner *learn) {
    resume_cb_state *s = cb->state;
    learn->logging = learn->epoch < s->start_epoch ? false : s->logging;
    return CF_OK;
}

/* After the Recorder added a row for a skipped epoch, before the progress display. */
static cf_status resume_after_epoch(cf_callback *cb, cf_learner *learn) {
    resume_cb_state *s = cb->state;
    if (learn->epoch >= s->start_epoch) return CF_OK;
    if (learn->recorder.n_epochs > s->saved.n_epochs) learn->recorder.n_epochs--;
    if (learn->final_record && s->final_record && learn->n_final_record == s->n_final_record)
        memcpy(learn->final_record, s->final_record,
               (size_t)s->n_final_record * sizeof *s->final_record);
    return CF_OK;
}

static cf_status resume_after_fit(cf_callback *cb, cf_learner *learn) {
    resume_cb_state *s = cb->state;
    learn->logging = s->logging;
    return CF_OK;
}

static void resume_free(cf_callback *cb) {
    resume_cb_state *s = cb->state;
    if (s) {
        cf_recorder_clear(&s->saved);
        cf_free(s->final_record);
    }
    free_with_state(cb);
}

/* Imports replica rank's commit seq into the learner and makes the callback that finishes the
 * job at before_fit. */
static cf_status resume_from(cf_learner *learn, const cf__commit_area *a, int rank, uint64_t seq,
                             cf_fit_common *common, cf_callback **out) {
    size_t bytes = 0;
    const commit_header *h = map_commit(a, rank, seq, &bytes);
    if (!h) return CF_ERR_STATE;
    cf_status st = cf_learner_import_state(learn, h + 1, h->state_bytes);
    int64_t epoch = h->epoch, train_iter = h->train_iter;
    munmap((void *)h, bytes);
    if (st != CF_OK) return cf_fail_context(st, "recovery: commit %llu", (unsigned long long)seq);
    cf_callback *cb = cf_calloc(1, sizeof *cb);
    resume_cb_state *s = cf_calloc(1, sizeof *s);
    if (!cb || !s) {
        cf_free(cb);
        cf_free(s);
        return CF_ERR_NOMEM;
    }
    cb->name = "RecoveryResume";
    cb->order = CF_ORDER_RECORDER + 5; /* after the Recorder, before the progress display */
    cb->state = s;
    cb->free = resume_free;
    cb->on[CF_EV_BEFORE_FIT] = resume_before_fit;
    cb->on[CF_EV_BEFORE_EPOCH] = resume_before_epoch;
    cb->on[CF_EV_AFTER_EPOCH] = resume_after_epoch;
    cb->on[CF_EV_AFTER_FIT] = resume_after_fit;
    cb->on[CF_EV_AFTER_CANCEL_FIT] = resume_after_fit;
    st = cf_recorder_copy(&s->saved, &learn->recorder);
    if (st == CF_OK && learn->final_record && learn->n_final_record > 0) {
        s->final_record = cf_calloc((size_t)learn->n_final_record, sizeof(double));
        if (!s->final_record)
            st = CF_ERR_NOMEM;
        else
            memcpy(s->final_record, learn->final_record,
                   (size_t)learn->n_final_record * sizeof(double));
        s->n_final_record = learn->n_final_record;
    }
    s->train_iter = train_iter;
    s->start_epoch = (int)epoch;
    if (st != CF_OK) {
        resume_free(cb);
        return st;
    }
    common->start_epoch = (int)epoch;
    *out = cb;
    return CF_OK;
}

cf_status cf__recovery_join(cf_learner *learn, const cf__par_recovery *rec, int rank,
                            cf_fit_common *common, cf_callback **extra, int *n_extra) {
    if (!rec || !rec->area || !rec->resumable) return CF_OK;
    cf_callback *position = cf_calloc(1, sizeof *position);
    cf_callback *commit = cf_calloc(1, sizeof *commit);
    commit_cb_state *ps = cf_calloc(1, sizeof *ps), *cs = cf_calloc(1, sizeof *cs);
    if (!position || !commit || !ps || !cs) {
        cf_free(position);
        cf_free(commit);
        cf_free(ps);
        cf_free(cs);
        return CF_ERR_NOMEM;
    }
    *ps = (commit_cb_state){rec->area, rank, rec->resume_seq, 0};
    *cs = *ps;
    position->name = "RecoveryPosition";
    position->order = CF_ORDER_TRAIN_EVAL - 10; /* first */
    position->state = ps;
    position->free = free_with_state;
    position->on[CF_EV_BEFORE_BATCH] = position_before_batch;
    commit->name = "RecoveryCommit";
    commit->order = 1000; /* last: after the trackers */
    commit->state = cs;
    commit->free = free_with_state;
    commit->on[CF_EV_AFTER_EPOCH] = commit_after_epoch;
    extra[(*n_extra)++] = position;
    extra[(*n_extra)++] = commit;
    cf_callback *resume = NULL;
    cf_status st = CF_OK;
    if (rec->resume_seq) st = resume_from(learn, rec->area, rank, rec->resume_seq, common, &resume);
    if (resume) extra[(*n_extra)++] = resume;
    cs->start_epoch = common->start_epoch;
    return st;
}
