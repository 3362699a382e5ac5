/* In-place recovery of a fork group (.par.max_restarts): the commit the group keeps, and how a
 * fresh group resumes from it.
 *
 * A commit is the learn layer's checkpoint (cf_checkpoint_cb: everything the rest of the fit
 * depends on, every replica's own BatchNorm buffers included, written by rank 0 at a training
 * batch boundary, atomically) in a private directory on a memory file system (/dev/shm), every
 * `commit_every` training batches. A fresh group resumes from it with the fit's own .resume, so
 * the fit ends bitwise as if it had never been stopped. A rank 0 killed while it writes leaves
 * the previous commit in place (the write goes to a temporary file, then a rename).
 *
 * Besides the file, a small shared area says where each replica is (the training batch it last
 * started, for the supervisor's report) and where the last commit stands. */
#include <dirent.h>
#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "par/par_internal.h"
#include "par/twin.h"

typedef struct commit_rank {
    alignas(CF_SHM_LINE) _Atomic int64_t epoch; /* the training batch this replica last began */
    _Atomic int64_t batch;                      /* (-1: none yet) */
} commit_rank;

struct cf__commit_area {
    int nranks;
    int every;
    size_t map_bytes;
    char dir[4096], path[4200];
    /* where the last commit stands: the batch a resumed fit begins with (committed: 0 none) */
    alignas(CF_SHM_LINE) _Atomic int64_t committed, commit_epoch, commit_batch;
    commit_rank ranks[];
};

/* Removes a commit directory with whatever is in it (the commit, a temporary file that a
 * killed rank 0 left half written). */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4400];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(dir);
}

/* Commit directories whose owner process is gone (a supervisor killed by SIGKILL, or by a
 * signal it does not handle, cannot remove its own): `corefit-commit-<pid>-XXXXXX` of this
 * user in base, for a pid that no longer exists. A live pid keeps its directory, whoever it
 * is (another fit's, or a process in another PID namespace that reuses the number). */
static void sweep_stale_dirs(const char *base) {
    DIR *d = opendir(base);
    if (!d) return;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d))) {
        long pid = 0;
        int end = 0;
        if (sscanf(e->d_name, "corefit-commit-%ld-%n", &pid, &end) != 1 || end == 0 ||
            strlen(e->d_name + end) != 6 || pid <= 0 || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours) */
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", base, e->d_name);
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == geteuid())
            remove_dir(path);
    }
    closedir(d);
}

/* A memory file system when there is one (the commit is shared memory), else the temporary
 * directory. */
static cf_status make_dir(char *dir, size_t cap) {
    struct stat sb;
    const char *tmp = getenv("TMPDIR");
    const char *base =
        stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK | X_OK) == 0
            ? "/dev/shm"
            : (tmp && *tmp ? tmp : "/tmp");
    sweep_stale_dirs(base);
    snprintf(dir, cap, "%s/corefit-commit-%ld-XXXXXX", base, (long)getpid());
    if (!mkdtemp(dir))
        return cf_fail(CF_ERR_IO, "recovery: cannot make a directory for commits in %s: %s", base,
                       strerror(errno));
    return CF_OK;
}

cf_status cf__commit_area_new(int nranks, int every, cf__commit_area **out) {
    *out = NULL;
    size_t bytes = sizeof(cf__commit_area) + (size_t)nranks * sizeof(commit_rank);
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return cf_fail(CF_ERR_NOMEM, "recovery: cannot map %zu bytes of shared memory: %s", bytes,
                       strerror(errno));
    cf__commit_area *a = map;
    a->nranks = nranks;
    a->every = every;
    a->map_bytes = bytes;
    cf__commit_forget_positions(a);
    cf_status st = make_dir(a->dir, sizeof a->dir);
    if (st != CF_OK) {
        munmap(map, bytes);
        return st;
    }
    snprintf(a->path, sizeof a->path, "%s/commit.ckpt", a->dir);
    *out = a;
    return CF_OK;
}

void cf__commit_area_free(cf__commit_area *a) {
    if (!a) return;
    remove_dir(a->dir);
    munmap(a, a->map_bytes);
}

bool cf__commit_latest(const cf__commit_area *a, int64_t *epoch, int64_t *batch) {
    if (!a || !atomic_load(&a->committed) || access(a->path, R_OK) != 0) return false;
    *epoch = atomic_load(&a->commit_epoch);
    *batch = atomic_load(&a->commit_batch);
    return true;
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

/* ---- the replica's side -------------------------------------------------------------------- */

typedef struct position_state {
    cf__commit_area *area;
    int rank;
} position_state;

static bool training_batch(const cf_learner *learn) {
    return learn->training && !learn->validating && !learn->in_lr_find;
}

/* First of all at every training batch: where this replica is, for the supervisor's report. */
static cf_status position_before_batch(cf_callback *cb, cf_learner *learn) {
    position_state *s = cb->state;
    if (!training_batch(learn)) return CF_OK;
    commit_rank *me = &s->area->ranks[s->rank];
    atomic_store_explicit(&me->batch, learn->iter, memory_order_relaxed);
    atomic_store_explicit(&me->epoch, learn->epoch, memory_order_relaxed);
    return CF_OK;
}

/* After the checkpoint callback wrote a commit (rank 0): where it stands. */
static cf_status note_after_batch(cf_callback *cb, cf_learner *learn) {
    position_state *s = cb->state;
    cf__commit_area *a = s->area;
    if (!training_batch(learn) || !learn->fit_params || learn->train_iter % a->every) return CF_OK;
    atomic_store(&a->commit_epoch, learn->epoch);
    atomic_store(&a->commit_batch, learn->iter + 1);
    atomic_store(&a->committed, 1);
    return CF_OK;
}

static cf_callback *position_cb(const char *name, int order, cf_event ev, cf_event_fn fn,
                                cf__commit_area *area, int rank) {
    cf_callback *cb = cf_callback_new(name, order, sizeof(position_state));
    if (!cb) return NULL;
    *(position_state *)cb->state = (position_state){area, rank};
    cb->on[ev] = fn;
    return cb;
}

cf_status cf__recovery_join(const cf__par_recovery *rec, int rank, cf_fit_common *common,
                            cf_callback **extra, int *n_extra) {
    if (!rec || !rec->area || !rec->resumable) return CF_OK;
    cf__commit_area *a = rec->area;
    cf_callback *cbs[3] = {
        position_cb("RecoveryPosition", CF_ORDER_TRAIN_EVAL - 10, CF_EV_BEFORE_BATCH,
                    position_before_batch, a, rank),
        cf_checkpoint_cb(.fname = a->path, .every_batches = a->every),
        rank == 0 ? position_cb("RecoveryCommitted", CF_ORDER_CHECKPOINT + 1, CF_EV_AFTER_BATCH,
                                note_after_batch, a, rank)
                  : NULL,
    };
    bool ok = cbs[0] && cbs[1] && (rank != 0 || cbs[2]);
    for (int i = 0; i < 3; i++) {
        if (ok && cbs[i])
            extra[(*n_extra)++] = cbs[i];
        else
            cf_callback_free(cbs[i]);
    }
    if (!ok) return cf_fail(CF_ERR_NOMEM, "recovery: callbacks");
    if (rec->resume) common->resume = a->path;
    return CF_OK;
}
