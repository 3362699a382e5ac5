/* Fault soak of the fork launcher: cf_par_fit_one_cycle on small data, run over and over, with
 * one fault injected per run on a random rank at a random training batch (or at the end of the
 * fit) and event: a crash (invalid write), abort, SIGKILL, an error return, a hang, SIGINT sent
 * to the caller, a pause (the supervisor and every worker stopped with SIGSTOP for longer than
 * the deadline, then continued: the fit must complete), a memory-limited run (the fit in a
 * child under an address-space limit with little headroom: it must train or stop with an
 * out-of-memory error within the time limit), or a recovered one (.par.max_restarts with a
 * random commit interval: the worker SIGKILLs or SIGSTOPs itself once, and the fit must finish
 * after at least one restart), SIGTERM to every process of the fit, as pre-emption sends it (the
 * caller handles it as `corefit train` does; the fit must stop at a batch with a checkpoint, and
 * a resume from it must give the reference result), or a full disk under a checkpoint taken
 * every third batch (a tmpfs with no room left, or /dev/full where none can be mounted: each
 * checkpoint fails with a warning and the fit must finish as the reference); one run in twelve
 * has no fault.
 *
 * Every run must end with either the trained result (bitwise the same weights, BatchNorm
 * buffers, optimizer state and Recorder losses and values as a fault-free reference run with the
 * same number of workers) or the expected error naming the rank and the cause, and
 * after every run: the caller's learner bitwise as it was when the run failed, no child process,
 * no shared mapping and no new file descriptor in the caller, the caller's SIGINT and SIGCHLD
 * dispositions restored, nothing new in /dev/shm or in TMPDIR, and the caller's heap flat.
 *
 * Short by default (a few seconds, for `make test`); CF_SOAK_SECONDS=n runs for n seconds
 * (`make soak`), CF_SOAK_SEED=n repeats a sequence. The counts are printed at the end, with a
 * summary of runs, faults, restarts, hangs, leaks and stale files (each of the last three must
 * be 0). */
#include "learn_fixture.h"

#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corefit/par.h"

#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#endif
#endif
#ifndef SOAK_ASAN
#define SOAK_ASAN 0
#endif

enum { N_TRAIN = 192, N_VALID = 32, BS = 8, N_EPOCH = 2 };

typedef enum kind {
    K_NONE,
    K_CRASH,
    K_ABORT,
    K_KILL,
    K_ERROR,
    K_HANG,
    K_SIGINT,
    K_PAUSE,   /* the supervisor and every worker stopped past the deadline, then continued */
    K_MEMORY,  /* the whole fit in a child under an address-space limit (random headroom) */
    K_RECOVER, /* SIGKILL or SIGSTOP once, with .par.max_restarts: the fit must finish */
    K_TERM,    /* SIGTERM to the supervisor and every worker: a checkpoint, then a resume */
    K_DISK,    /* every checkpoint hits a full disk: warnings, the fit finishes */
    K_COUNT
} kind;
static const char *const kind_name[K_COUNT] = {"none",   "crash",   "abort",   "kill",
                                               "error",  "hang",    "sigint",  "pause",
                                               "memory", "recover", "sigterm", "full disk"};

/* Shared with the workers and the pausing process (one page). */
typedef struct shared {
    double fault_at; /* cf_now() when the fault struck */
    int pids[4];     /* the workers of the current run */
    int supervisor;
    _Atomic int stopped; /* the pausing process has stopped everyone */
    _Atomic int shots;   /* recover: faults still to cause (a restarted group replays the batch) */
    _Atomic int term_seen; /* sigterm: the caller's handler has run (the request is raised) */
} shared;
static shared *g_shared;
#define PAUSE_DEADLINE_S 1.0
#define PAUSE_S (2 * PAUSE_DEADLINE_S + 1.5) /* past the workers' own give-up as well */

/* Where the fault strikes; read by the forked workers (their copy of the caller's memory). */
typedef struct plan {
    kind k;
    int rank;
    int64_t batch;
    cf_event ev;
    int sig; /* recover: SIGKILL or SIGSTOP */
} plan;
static plan g_plan;
/* When the fault struck (cf_now(), a system-wide monotonic clock), written by the worker into a
 * page shared with the caller, so the caller measures how long the report took. */
static volatile double *g_fault_at; /* &g_shared->fault_at */
static int g_pipe[2] = {-1, -1};
static volatile uintptr_t g_bad_address = 8; /* not NULL: a plain invalid write, not UB checks */
static char g_term_ckpt[512]; /* K_TERM: the checkpoint (in TMPDIR, removed after the run) */
static char g_full_ckpt[512]; /* K_DISK: a checkpoint on a full file system */

/* The caller's SIGTERM handler during a K_TERM run, as `corefit train` has it. */
static void on_sigterm(int sig) {
    (void)sig;
    cf_checkpoint_request();
    atomic_store(&g_shared->term_seen, 1);
}

/* K_DISK: a tmpfs filled to the last byte in a mount namespace of this process's own (root);
 * else /dev/full, a device whose every write fails with ENOSPC. */
static char g_full_mount[64];
static void make_full_disk(void) {
    snprintf(g_full_ckpt, sizeof g_full_ckpt, "/dev/full");
    snprintf(g_full_mount, sizeof g_full_mount, "/tmp/cf_soak_full_XXXXXX");
    if (!mkdtemp(g_full_mount)) {
        g_full_mount[0] = '\0';
        return;
    }
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", g_full_mount, "tmpfs", 0, "size=64k") != 0) {
        rmdir(g_full_mount);
        g_full_mount[0] = '\0';
        return;
    }
    char filler[128];
    snprintf(filler, sizeof filler, "%s/filler", g_full_mount);
    FILE *f = fopen(filler, "w");
    char block[4096] = {0};
    while (f && fwrite(block, 1, sizeof block, f) == sizeof block && fflush(f) == 0) {
    }
    while (f && fwrite(block, 1, 1, f) == 1 && fflush(f) == 0) {
    }
    if (f) fclose(f);
    snprintf(g_full_ckpt, sizeof g_full_ckpt, "%s/fit.ckpt", g_full_mount);
}

/* The pausing process (a grandchild of the striking worker, outside the fit): stops the
 * supervisor and every worker, waits past the deadline, continues them. Only kill(2) and
 * nanosleep: nothing of the fit's state is touched. */
static _Noreturn void pause_everyone(int world) {
    int pids[5];
    pids[0] = g_shared->supervisor;
    for (int r = 0; r < world; r++) pids[r + 1] = g_shared->pids[r];
    for (int i = 0; i <= world; i++) kill(pids[i], SIGSTOP);
    atomic_store(&g_shared->stopped, 1);
    struct timespec ts = {(time_t)PAUSE_S, (long)((PAUSE_S - (double)(time_t)PAUSE_S) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
    for (int i = 0; i <= world; i++) kill(pids[i], SIGCONT);
    _exit(0);
}

static cf_status strike(cf_learner *learn) {
    if (g_plan.k == K_RECOVER) {
        int one = 1;
        if (!atomic_compare_exchange_strong(&g_shared->shots, &one, 0)) return CF_OK;
    }
    *g_fault_at = cf_now();
    switch (g_plan.k) {
    case K_NONE:
    case K_MEMORY:
        break;
    case K_PAUSE: {
        /* Double fork: the pausing process belongs to nobody in the fit. */
        int world = cf_comm_size(learn->replica.comm);
        atomic_store(&g_shared->stopped, 0);
        pid_t p = fork();
        if (p < 0) return cf_fail(CF_ERR_IO, "fork: %s", strerror(errno));
        if (p == 0) {
            if (fork() == 0) pause_everyone(world);
            _exit(0);
        }
        waitpid(p, NULL, 0);
        /* Carry on only once stopped and continued (this worker is stopped too). */
        while (!atomic_load(&g_shared->stopped)) usleep(1000);
        break;
    }
    case K_CRASH:
        *(volatile int *)g_bad_address = 1;
        break;
    case K_ABORT:
        abort();
    case K_KILL:
        raise(SIGKILL);
        break;
    case K_RECOVER:
        raise(g_plan.sig); /* a stopped worker stays stopped until the supervisor kills it */
        break;
    case K_TERM: {
        /* every process of the fit (not the process group: that holds the test runner),
         * workers first, three times over as pre-emption may */
        int world = cf_comm_size(learn->replica.comm);
        for (int shot = 0; shot < 3; shot++) {
            for (int r = world - 1; r >= 0; r--)
                if (g_shared->pids[r] > 0) kill(g_shared->pids[r], SIGTERM);
            if (g_shared->supervisor > 0) kill(g_shared->supervisor, SIGTERM);
        }
        /* until the caller's handler has run (however busy the machine), so that the request
         * stands at this batch's end: the fit stops there, even at its last batch */
        for (int i = 0; i < 20000 && !atomic_load(&g_shared->term_seen); i++) {
            cf_comm_heartbeat(learn->replica.comm);
            usleep(1000);
        }
        break;
    }
    case K_DISK:
        break; /* the fault is the disk */
    case K_ERROR:
        return cf_fail(CF_ERR_IO, "injected failure at batch %lld", (long long)g_plan.batch);
    case K_HANG:
        for (;;) pause();
    case K_SIGINT:
        /* Ask the caller's helper thread to send SIGINT, then keep beating until killed, so the
         * interruption always lands while the supervisor waits. */
        if (write(g_pipe[1], "i", 1) != 1) return cf_fail(CF_ERR_IO, "pipe");
        for (int i = 0; i < 3000; i++) {
            cf_comm_heartbeat(learn->replica.comm);
            usleep(5000);
        }
        return cf_fail(CF_ERR_STATE, "SIGINT did not stop the group");
    case K_COUNT:
        break;
    }
    return CF_OK;
}

static cf_status maybe_strike(cf_learner *learn, cf_event ev) {
    if (learn->replica.comm && ev == CF_EV_BEFORE_BATCH) {
        g_shared->pids[cf_comm_rank(learn->replica.comm)] = (int)getpid();
        g_shared->supervisor = (int)getppid();
    }
    if (g_plan.k == K_NONE || !learn->replica.comm ||
        cf_comm_rank(learn->replica.comm) != g_plan.rank || ev != g_plan.ev)
        return CF_OK;
    if (ev != CF_EV_AFTER_FIT && (!learn->training || learn->train_iter != g_plan.batch))
        return CF_OK;
    return strike(learn);
}

static cf_status on_before_batch(cf_callback *cb, cf_learner *l) {
    (void)cb;
    return maybe_strike(l, CF_EV_BEFORE_BATCH);
}
static cf_status on_after_backward(cf_callback *cb, cf_learner *l) {
    (void)cb;
    return maybe_strike(l, CF_EV_AFTER_BACKWARD);
}
static cf_status on_before_step(cf_callback *cb, cf_learner *l) {
    (void)cb;
    return maybe_strike(l, CF_EV_BEFORE_STEP);
}
static cf_status on_after_step(cf_callback *cb, cf_learner *l) {
    (void)cb;
    return maybe_strike(l, CF_EV_AFTER_STEP);
}
static cf_status on_after_fit(cf_callback *cb, cf_learner *l) {
    (void)cb;
    return maybe_strike(l, CF_EV_AFTER_FIT);
}
static const cf_event strike_events[] = {CF_EV_BEFORE_BATCH, CF_EV_AFTER_BACKWARD,
                                         CF_EV_BEFORE_STEP, CF_EV_AFTER_STEP, CF_EV_AFTER_FIT};

/* The caller's helper thread: one SIGINT per byte a worker writes; 'q' ends it. */
static void *sigint_sender(void *arg) {
    (void)arg;
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, NULL); /* delivered to the supervising thread */
    for (;;) {
        char c;
        ssize_t r = read(g_pipe[0], &c, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r != 1 || c == 'q') return NULL;
        kill(getpid(), SIGINT);
    }
}

/* ---- the caller's state ---------------------------------------------------------------------- */

typedef struct snapshot {
    float *weights, *buffers, *grad_avg, *sqr_avg, *steps;
    cf_hypers *hypers;
    bool *trainable;
    const cf_optimizer *opt;
    int64_t n_batches, data_epochs;
    int n_epochs;
} snapshot;

static void *dup_mem(const void *p, size_t n) {
    if (!p) return NULL;
    void *q = malloc(n ? n : 1);
    memcpy(q, p, n);
    return q;
}

static void take(snapshot *s, const cf_learner *learn) {
    const cf_model *m = learn->model;
    const cf_optimizer *o = learn->opt;
    size_t nw = m->n_weights * sizeof(float);
    s->weights = dup_mem(m->weights, nw);
    s->buffers = dup_mem(m->buffers, m->n_buffers * sizeof(float));
    s->grad_avg = dup_mem(o->grad_avg, nw);
    s->sqr_avg = dup_mem(o->sqr_avg, nw);
    s->steps = dup_mem(o->steps, (size_t)m->n_params * sizeof(float));
    s->hypers = dup_mem(o->hypers, (size_t)o->n_groups * sizeof *o->hypers);
    s->trainable = malloc((size_t)m->n_params * sizeof(bool));
    for (int i = 0; i < m->n_params; i++) s->trainable[i] = m->params[i]->trainable;
    s->opt = o;
    s->n_batches = learn->recorder.n_batches;
    s->n_epochs = learn->recorder.n_epochs;
    s->data_epochs = learn->data_epochs;
}

static void drop(snapshot *s) {
    free(s->weights), free(s->buffers), free(s->grad_avg), free(s->sqr_avg), free(s->steps);
    free(s->hypers), free(s->trainable);
    memset(s, 0, sizeof *s);
}

/* Puts the snapshot back into the learner (after a run that succeeded). */
static void restore(cf_learner *learn, const snapshot *s) {
    cf_model *m = learn->model;
    cf_optimizer *o = learn->opt;
    size_t nw = m->n_weights * sizeof(float);
    memcpy(m->weights, s->weights, nw);
    memcpy(m->buffers, s->buffers, m->n_buffers * sizeof(float));
    if (o->grad_avg) memcpy(o->grad_avg, s->grad_avg, nw);
    if (o->sqr_avg) memcpy(o->sqr_avg, s->sqr_avg, nw);
    memcpy(o->steps, s->steps, (size_t)m->n_params * sizeof(float));
    memcpy(o->hypers, s->hypers, (size_t)o->n_groups * sizeof *o->hypers);
    learn->data_epochs = s->data_epochs; /* each run starts the same data stream */
}

static void assert_unchanged(const cf_learner *learn, const snapshot *s, int run) {
    const cf_model *m = learn->model;
    const cf_optimizer *o = learn->opt;
    size_t nw = m->n_weights * sizeof(float);
    if (o != s->opt) fail_msg("run %d: the optimizer was replaced after a failure", run);
    if (memcmp(m->weights, s->weights, nw) ||
        memcmp(m->buffers, s->buffers, m->n_buffers * sizeof(float)))
        fail_msg("run %d: weights or buffers changed after a failure", run);
    if ((o->grad_avg && memcmp(o->grad_avg, s->grad_avg, nw)) ||
        (o->sqr_avg && memcmp(o->sqr_avg, s->sqr_avg, nw)) ||
        memcmp(o->steps, s->steps, (size_t)m->n_params * sizeof(float)) ||
        memcmp(o->hypers, s->hypers, (size_t)o->n_groups * sizeof *o->hypers))
        fail_msg("run %d: optimizer state changed after a failure", run);
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i]->trainable != s->trainable[i])
            fail_msg("run %d: freezing changed after a failure", run);
    if (learn->recorder.n_batches != s->n_batches || learn->recorder.n_epochs != s->n_epochs)
        fail_msg("run %d: the Recorder changed after a failure", run);
    if (learn->data_epochs != s->data_epochs)
        fail_msg("run %d: the data epoch count changed after a failure", run);
}

/* What a fault-free fit on some number of workers ends with: every trained run must match it
 * bitwise. */
typedef struct result {
    float *weights, *buffers, *grad_avg, *sqr_avg;
    double *losses, *values;
    size_t n_weights, n_buffers, n_losses, n_values;
} result;

static void keep_result(result *r, const cf_learner *learn) {
    const cf_model *m = learn->model;
    const cf_recorder *rec = &learn->recorder;
    r->n_weights = m->n_weights;
    r->n_buffers = m->n_buffers;
    r->n_losses = (size_t)rec->n_batches;
    r->n_values = (size_t)rec->n_epochs * (size_t)rec->n_values;
    r->weights = dup_mem(m->weights, r->n_weights * sizeof(float));
    r->buffers = dup_mem(m->buffers, r->n_buffers * sizeof(float));
    r->grad_avg = dup_mem(learn->opt->grad_avg, r->n_weights * sizeof(float));
    r->sqr_avg = dup_mem(learn->opt->sqr_avg, r->n_weights * sizeof(float));
    r->losses = dup_mem(rec->losses, r->n_losses * sizeof(double));
    r->values = dup_mem(rec->values, r->n_values * sizeof(double));
}

static bool same_mem(const void *a, const void *b, size_t n) {
    return n == 0 || (a && b && memcmp(a, b, n) == 0);
}

/* The part of the learner that differs from r, or NULL. */
static const char *differs(const result *r, const cf_learner *learn) {
    const cf_model *m = learn->model;
    const cf_recorder *rec = &learn->recorder;
    size_t nw = r->n_weights * sizeof(float);
    if (m->n_weights != r->n_weights || !same_mem(m->weights, r->weights, nw)) return "weights";
    if (m->n_buffers != r->n_buffers ||
        !same_mem(m->buffers, r->buffers, r->n_buffers * sizeof(float)))
        return "BatchNorm buffers";
    if (!same_mem(learn->opt->grad_avg, r->grad_avg, r->grad_avg ? nw : 0) ||
        !same_mem(learn->opt->sqr_avg, r->sqr_avg, r->sqr_avg ? nw : 0))
        return "optimizer state";
    if ((size_t)rec->n_batches != r->n_losses ||
        !same_mem(rec->losses, r->losses, r->n_losses * sizeof(double)))
        return "Recorder losses";
    if ((size_t)rec->n_epochs * (size_t)rec->n_values != r->n_values ||
        !same_mem(rec->values, r->values, r->n_values * sizeof(double)))
        return "Recorder values";
    return NULL;
}

static void drop_result(result *r) {
    free(r->weights), free(r->buffers), free(r->grad_avg), free(r->sqr_avg);
    free(r->losses), free(r->values);
    memset(r, 0, sizeof *r);
}

/* ---- the process's resources --------------------------------------------------------------- */

static void assert_no_children(int run) {
    errno = 0;
    pid_t p = waitpid(-1, NULL, WNOHANG);
    if (p != -1 || errno != ECHILD) fail_msg("run %d: a child process is left (%d)", run, (int)p);
}

/* Shared mappings (MAP_SHARED, shm, memfd) in this process. */
static int count_shared_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char perms[8] = "";
        if (sscanf(line, "%*s %7s", perms) == 1 && perms[3] == 's') n++;
    }
    fclose(f);
    return n;
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* Names in a folder, as one string list; `skip` leaves out names other programs make there. */
typedef struct names {
    char **v;
    int n;
} names;

static bool foreign_shm_name(const char *name) {
    /* Open MPI and PMIx segments of MPI jobs that may run next to this test. */
    static const char *const prefixes[] = {"vader_segment", "sm_segment", "ompi",    "pmix",
                                           "opal",          "psm",        "sem.ompi"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return true;
    /* The commit directory of a recovering fit in another test running beside this one (ctest
     * -j): named after the fitting process, which for this test's own fits is this process. */
    static const char commit[] = "corefit-commit-";
    if (strncmp(name, commit, sizeof commit - 1) == 0)
        return strtol(name + sizeof commit - 1, NULL, 10) != (long)getpid();
    return false;
}

static names list_dir(const char *dir, bool skip_foreign) {
    names out = {0};
    DIR *d = opendir(dir);
    if (!d) return out;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (skip_foreign && foreign_shm_name(e->d_name)) continue;
        out.v = realloc(out.v, (size_t)(out.n + 1) * sizeof *out.v);
        out.v[out.n++] = strdup(e->d_name);
    }
    closedir(d);
    return out;
}

static void free_names(names *n) {
    for (int i = 0; i < n->n; i++) free(n->v[i]);
    free(n->v);
    memset(n, 0, sizeof *n);
}

/* Fails on a name in `now` that was not in `before`. */
static void assert_nothing_new(const names *before, const names *now, const char *dir) {
    for (int i = 0; i < now->n; i++) {
        bool seen = false;
        for (int j = 0; j < before->n && !seen; j++) seen = !strcmp(now->v[i], before->v[j]);
        if (!seen) fail_msg("%s/%s appeared during the soak", dir, now->v[i]);
    }
}

static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

static bool same_disposition(const struct sigaction *a, const struct sigaction *b) {
    return a->sa_handler == b->sa_handler &&
           (a->sa_flags & SA_SIGINFO) == (b->sa_flags & SA_SIGINFO);
}

/* ---- the soak ------------------------------------------------------------------------------- */

static double env_double(const char *name, double dflt) {
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

/* ---- memory-limited runs ------------------------------------------------------------------- */

static long vm_size_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1;
    if (f && fscanf(f, "%ld", &pages) != 1) pages = -1;
    if (f) fclose(f);
    return pages * sysconf(_SC_PAGESIZE);
}

/* The fit in a child process under an address-space limit with random headroom (0 to 2 MB:
 * the small fixture trains in about 1 MB): it must either train or stop with an out-of-memory
 * error, within the time limit (no spin, no hang, at exit either). Address-space limits are
 * meaningless under ASan and valgrind: there the run is an unlimited one. Returns false with why in
 * msg. */
static bool memory_limited_run(cf_learner *learn, cf_callback **cbs, int world, cf_rng *rng,
                               char *msg, size_t cap, int *hangs) {
    const char *pre = getenv("LD_PRELOAD");
    bool limit = !SOAK_ASAN && !(pre && strstr(pre, "vgpreload"));
    long headroom = (long)cf_rng_below(rng, 2048) * 1024;
    int p[2];
    if (pipe(p) != 0) return snprintf(msg, cap, "pipe"), false;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return snprintf(msg, cap, "fork"), false;
    if (pid == 0) {
        close(p[0]);
        signal(SIGINT, SIG_IGN); /* the SIGINT runs are the caller's */
        struct rlimit rl = {(rlim_t)(vm_size_bytes() + headroom),
                            (rlim_t)(vm_size_bytes() + headroom)};
        char out[1024];
        if (limit && setrlimit(RLIMIT_AS, &rl) != 0) {
            snprintf(out, sizeof out, "setrlimit failed");
        } else {
            cf_status st =
                cf_par_fit_one_cycle(learn, N_EPOCH, .lr_max = CF_LR(1e-2), .cbs = cbs, .n_cbs = 1,
                                     .par = {.num_cores = world, .deadline_s = 30});
            snprintf(out, sizeof out, "%s: %s", st == CF_OK ? "trained" : cf_status_str(st),
                     st == CF_OK ? "" : cf_last_error());
        }
        ssize_t w = write(p[1], out, strlen(out) + 1);
        (void)w;
        _exit(0); /* no exit handlers: the caller's own state is not this child's to tear down */
    }
    close(p[1]);
    double t0 = cf_now(), limit_s = 60;
    int ws;
    pid_t w;
    while ((w = waitpid(pid, &ws, WNOHANG)) == 0 && cf_now() - t0 < limit_s) usleep(5000);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &ws, 0);
        close(p[0]);
        (*hangs)++;
        return snprintf(msg, cap, "headroom %ld KB: still running after %.0f s", headroom >> 10,
                        limit_s),
               false;
    }
    ssize_t r = read(p[0], msg, cap - 1);
    msg[r > 0 ? r : 0] = '\0';
    close(p[0]);
    if (WIFSIGNALED(ws))
        return snprintf(msg, cap, "headroom %ld KB: the child died of signal %d", headroom >> 10,
                        WTERMSIG(ws)),
               false;
    /* Trained, or out of memory said clearly (a worker's or the caller's). */
    if (strncmp(msg, "trained", 7) == 0) return true;
    if (strstr(msg, "out of memory") || strstr(msg, "memory")) return true;
    char why[1024];
    snprintf(why, sizeof why, "headroom %ld KB: %s", headroom >> 10, msg);
    snprintf(msg, cap, "%s", why);
    return false;
}

static void test_fault_soak(void **state) {
    (void)state;
    /* Under valgrind everything is some 30 times slower: only the first two blocks of runs,
     * with deadlines and time limits to match. */
    const char *preload = getenv("LD_PRELOAD");
    double slow = preload && strstr(preload, "vgpreload") ? 30 : 1;
    double seconds = env_double("CF_SOAK_SECONDS", slow > 1 ? 0 : 8);
    g_shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(g_shared != MAP_FAILED);
    g_fault_at = &g_shared->fault_at;
    uint64_t seed = (uint64_t)env_double("CF_SOAK_SEED", (double)(uint64_t)time(NULL));
    cf_rng rng;
    cf_rng_seed(&rng, seed);

    /* A private TMPDIR: anything the library might put there shows. */
    char tmpdir[] = "/tmp/cf_soak_XXXXXX";
    assert_non_null(mkdtemp(tmpdir));
    setenv("TMPDIR", tmpdir, 1);
    snprintf(g_term_ckpt, sizeof g_term_ckpt, "%s/term.ckpt", tmpdir);
    make_full_disk(); /* before any thread: a mount namespace of this process's own */
    names shm_before = list_dir("/dev/shm", true);

    assert_int_equal(pipe(g_pipe), 0);
    pthread_t sender;
    assert_int_equal(pthread_create(&sender, NULL, sigint_sender, NULL), 0);

    cf_dls *dls = fixture_dls(N_TRAIN, N_VALID, BS);
    cf_metric *metrics[] = {cf_accuracy()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(5, false), .quiet = true,
                                    .metrics = metrics, .n_metrics = 1),
                     CF_OK);
    /* Start from a trained learner, so that the optimizer state is part of what must survive. */
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    snapshot s0 = {0};
    take(&s0, learn);
    result reference[4] = {0}; /* per number of workers (2, 3) */

    cf_callback inject = {.name = "FaultInjection"};
    inject.on[CF_EV_BEFORE_BATCH] = on_before_batch;
    inject.on[CF_EV_AFTER_BACKWARD] = on_after_backward;
    inject.on[CF_EV_BEFORE_STEP] = on_before_step;
    inject.on[CF_EV_AFTER_STEP] = on_after_step;
    inject.on[CF_EV_AFTER_FIT] = on_after_fit;
    cf_callback *cbs[] = {&inject};

    /* The SIGINT runs need SIGINT to reach the launcher: a caller that ignores it (a process
     * started in the background by a shell) keeps ignoring it during the call. */
    signal(SIGINT, SIG_DFL);
    struct sigaction int0, chld0;
    sigaction(SIGINT, NULL, &int0);
    sigaction(SIGCHLD, NULL, &chld0);
    /* the checkpoint request's shared page is mapped once per process, by the first checkpoint
     * callback: before the count */
    cf_callback_free(cf_checkpoint_cb(.fname = g_term_ckpt));
    int fds0 = count_fds(), maps0 = count_shared_mappings();

    int runs = 0, failures = 0, per_kind[K_COUNT] = {0}, per_event[CF_EV_COUNT] = {0};
    int faults = 0, restarts = 0, hangs = 0, leaks = 0, stale = 0, per_memory_outcome[2] = {0};
    int per_recover_signal[2] = {0}; /* SIGKILL, SIGSTOP */
    char last_oom[512] = "none";
    size_t heap0 = 0, heap_max_growth = 0;
    long rss0 = 0, rss_growth = 0;
    double t_start = cf_now(), worst_latency[K_COUNT] = {0};
    kind order[K_COUNT];
    /* Blocks of one run of each kind in random order; reference runs first. */
    for (int block = 0; cf_now() - t_start < seconds || block < 2; block++) {
        for (int i = 0; i < K_COUNT; i++) order[i] = (kind)i;
        for (int i = K_COUNT - 1; i > 0; i--) {
            int j = (int)cf_rng_below(&rng, (uint64_t)i + 1);
            kind t = order[i];
            order[i] = order[j], order[j] = t;
        }
        for (int i = 0; i < K_COUNT; i++) {
            int world = 2 + (int)cf_rng_below(&rng, 2);
            int64_t batches = (int64_t)((N_TRAIN + world - 1) / world / BS) * N_EPOCH;
            kind k = order[i];
            if (!reference[world].weights) k = K_NONE; /* the fault-free reference comes first */
            if (k == K_PAUSE && slow > 1) k = K_NONE;  /* stopped processes confuse valgrind */
            g_plan = (plan){k, (int)cf_rng_below(&rng, (uint64_t)world),
                            (int64_t)cf_rng_below(&rng, (uint64_t)batches),
                            strike_events[cf_rng_below(&rng, 5)], SIGKILL};
            /* recover: SIGKILL or SIGSTOP (found by the deadline; not under valgrind), a commit
             * every 1 to 6 training batches */
            int commit_every = 1 + (int)cf_rng_below(&rng, 6);
            if (k == K_RECOVER && slow == 1 && cf_rng_below(&rng, 2)) g_plan.sig = SIGSTOP;
            atomic_store(&g_shared->shots, 1);
            atomic_store(&g_shared->term_seen, 0);
            if (k == K_TERM && g_plan.ev == CF_EV_AFTER_FIT)
                g_plan.ev = CF_EV_AFTER_STEP; /* in the fit: a stop with a checkpoint */
            if (k == K_PAUSE) { /* from the second batch on: every worker's pid is known */
                g_plan.ev = CF_EV_BEFORE_BATCH;
                if (g_plan.batch == 0) g_plan.batch = 1;
            }
            double deadline = (k == K_HANG                               ? 0.5
                               : k == K_PAUSE                            ? PAUSE_DEADLINE_S
                               : k == K_RECOVER && g_plan.sig == SIGSTOP ? 1.0
                                                                         : 60) *
                              slow;
            *g_fault_at = 0;
            memset(g_shared->pids, 0, sizeof g_shared->pids);
            cf_clear_error();
            double t0 = cf_now();
            cf_status st;
            char child_msg[1024] = "";
            bool term_stopped = false;
            if (k == K_MEMORY) {
                if (!memory_limited_run(learn, cbs, world, &rng, child_msg, sizeof child_msg,
                                        &hangs)) {
                    failures++;
                    fail_msg("run %d (memory, %d workers, seed %llu): %s", runs + 1, world,
                             (unsigned long long)seed, child_msg);
                }
                st = CF_OK;
            } else {
                /* recover: up to 3 restarts, so that a busy worker that a loaded machine makes
                 * look hung costs another restart, not the run */
                /* sigterm, full disk: a checkpoint callback (only on SIGTERM; every third batch) */
                cf_callback *run_cbs[2] = {cbs[0], NULL};
                int n_run = 1;
                if (k == K_TERM || k == K_DISK)
                    run_cbs[n_run++] =
                        cf_checkpoint_cb(.fname = k == K_TERM ? g_term_ckpt : g_full_ckpt,
                                         .every_batches = k == K_DISK ? 3 : 0);
                struct sigaction term_sa = {.sa_handler = on_sigterm}, term_old;
                sigemptyset(&term_sa.sa_mask);
                term_sa.sa_flags = SA_RESTART;
                if (k == K_TERM) sigaction(SIGTERM, &term_sa, &term_old);
                st = cf_par_fit_one_cycle(
                    learn, N_EPOCH, .lr_max = CF_LR(1e-2), .cbs = run_cbs, .n_cbs = n_run,
                    .par = {.num_cores = world,
                            .deadline_s = deadline,
                            .max_restarts = k == K_RECOVER ? 3 : 0,
                            .commit_every = k == K_RECOVER ? commit_every : 0});
                if (k == K_TERM && st == CF_ERR_WORKER &&
                    strstr(cf_last_error(), "stopped on request")) {
                    /* stopped as asked, the caller's learner as it was: resume from the
                     * checkpoint (again, if a late TERM of the same shot stops it once more) */
                    assert_unchanged(learn, &s0, runs + 1);
                    term_stopped = true;
                    g_plan.k = K_NONE;
                    for (int again = 0; again < 3; again++) {
                        cf_callback *resume_cbs[] = {
                            cbs[0], cf_checkpoint_cb(.fname = g_term_ckpt, .every_batches = 0)};
                        st = cf_par_fit_one_cycle(
                            learn, N_EPOCH, .lr_max = CF_LR(1e-2), .cbs = resume_cbs, .n_cbs = 2,
                            .resume = g_term_ckpt,
                            .par = {.num_cores = world, .deadline_s = deadline});
                        if (st != CF_ERR_WORKER || !strstr(cf_last_error(), "stopped on request"))
                            break;
                    }
                    g_plan.k = K_TERM;
                }
                if (k == K_TERM) sigaction(SIGTERM, &term_old, NULL);
                if (k == K_TERM) unlink(g_term_ckpt);
            }
            int restarted = k == K_MEMORY ? 0 : cf_par_last_restarts();
            restarts += restarted;
            if (k == K_RECOVER) per_recover_signal[g_plan.sig == SIGSTOP]++;
            double took = cf_now() - t0;
            const char *msg = cf_last_error();
            runs++;
            per_kind[k]++;
            if (k != K_NONE && k != K_MEMORY) per_event[g_plan.ev]++;
            if (k != K_NONE) faults++;

            char want_rank[32];
            snprintf(want_rank, sizeof want_rank, "worker %d", g_plan.rank);
            static const char *const cause[K_COUNT] = {"",
                                                       "SIGSEGV",
                                                       "SIGABRT",
                                                       "SIGKILL",
                                                       "injected failure",
                                                       "made no progress",
                                                       "interrupted",
                                                       "",
                                                       "memory",
                                                       "",
                                                       "",
                                                       ""};
            bool ok;
            if (k == K_NONE || k == K_PAUSE || k == K_MEMORY || k == K_DISK) {
                ok = st == CF_OK && restarted == 0;
            } else if (k == K_TERM) {
                /* stopped with a checkpoint, resumed to the end (the result is checked below) */
                ok = st == CF_OK && term_stopped && restarted == 0;
            } else if (k == K_RECOVER) {
                /* struck, restarted, finished (the result is checked below) */
                ok = st == CF_OK && restarted >= 1 && *g_fault_at > 0 &&
                     atomic_load(&g_shared->shots) == 0;
            } else if (k == K_SIGINT) {
                ok = st == CF_ERR_INTERRUPTED && strstr(msg, cause[k]);
            } else {
                ok = st == CF_ERR_WORKER && strstr(msg, cause[k]) && strstr(msg, want_rank);
            }
            if (!ok) {
                failures++;
                fail_msg(
                    "run %d (%s%s on rank %d of %d at batch %lld, %s, seed %llu): status %s, "
                    "%d restarts, \"%s\"",
                    runs, kind_name[k],
                    k == K_RECOVER ? (g_plan.sig == SIGSTOP ? " by SIGSTOP" : " by SIGKILL") : "",
                    g_plan.rank, world, (long long)g_plan.batch, cf_event_name(g_plan.ev),
                    (unsigned long long)seed, cf_status_str(st), restarted, st == CF_OK ? "" : msg);
            }
            /* The report comes within seconds of the fault (of the deadline for a hang). */
            double latency = *g_fault_at > 0 ? cf_now() - *g_fault_at : 0;
            if (k != K_NONE && *g_fault_at == 0 && st != CF_OK)
                fail_msg("run %d (%s): failed before the fault struck", runs, kind_name[k]);
            if (latency > worst_latency[k]) worst_latency[k] = latency;
            /* (recover: from the fault to the finished fit, a restart and the rest of the fit) */
            if (k != K_PAUSE && k != K_MEMORY && k != K_RECOVER && k != K_TERM &&
                latency > (k == K_HANG ? deadline : 0) + 5 * slow)
                fail_msg("run %d (%s): reported %.1f s after the fault", runs, kind_name[k],
                         latency);
            if (took > 120 * slow) {
                hangs++;
                fail_msg("run %d (%s): took %.1f s", runs, kind_name[k], took);
            }

            if (k == K_MEMORY) {
                bool trained = strncmp(child_msg, "trained", 7) == 0;
                per_memory_outcome[trained ? 0 : 1]++;
                if (!trained) /* kept for the summary; a long message is cut */
                    snprintf(last_oom, sizeof last_oom, "%.500s", child_msg);
                assert_unchanged(learn, &s0, runs); /* the fit ran in a child */
            } else if (st == CF_OK) {
                /* The trained result: the same as every other fault-free run on this many
                 * workers, and a full Recorder. */
                const char *part = NULL;
                if (!reference[world].weights)
                    keep_result(&reference[world], learn);
                else if ((part = differs(&reference[world], learn)))
                    fail_msg("run %d (%s, %d workers, seed %llu): the trained %s differ from the "
                             "reference",
                             runs, kind_name[k], world, (unsigned long long)seed, part);
                assert_int_equal(learn->recorder.n_epochs, N_EPOCH);
                if (learn->opt == s0.opt) fail_msg("run %d: no optimizer came home", runs);
                restore(learn, &s0);
                s0.opt = learn->opt;
                s0.n_batches = learn->recorder.n_batches;
                s0.n_epochs = learn->recorder.n_epochs;
            } else {
                assert_unchanged(learn, &s0, runs);
            }
            assert_no_children(runs);
            struct sigaction now;
            sigaction(SIGINT, NULL, &now);
            if (!same_disposition(&now, &int0)) fail_msg("run %d: SIGINT not restored", runs);
            sigaction(SIGCHLD, NULL, &now);
            if (!same_disposition(&now, &chld0)) fail_msg("run %d: SIGCHLD not restored", runs);
            if (count_fds() != fds0)
                fail_msg("run %d: %d file descriptors, %d before", runs, count_fds(), fds0);
            if (count_shared_mappings() != maps0)
                fail_msg("run %d: %d shared mappings, %d before", runs, count_shared_mappings(),
                         maps0);
            /* Memory: flat once the first runs have sized every buffer. */
            if (runs == 2 * K_COUNT) {
                heap0 = heap_in_use();
                rss0 = rss_kib();
            } else if (runs > 2 * K_COUNT) {
                size_t h = heap_in_use();
                if (h > heap0 && h - heap0 > heap_max_growth) heap_max_growth = h - heap0;
                long r = rss_kib() - rss0;
                if (r > rss_growth) rss_growth = r;
            }
        }
    }
    double total = cf_now() - t_start;

    names shm_after = list_dir("/dev/shm", true);
    names tmp_after = list_dir(tmpdir, false);
    stale = tmp_after.n + (shm_after.n > shm_before.n ? shm_after.n - shm_before.n : 0);
    if (!SOAK_ASAN) leaks = (heap_max_growth > 256 * 1024) + (rss_growth > 16 * 1024);
    printf("soak: summary: runs %d, faults %d, restarts %d, hangs %d, leaks %d, stale files %d\n",
           runs, faults, restarts, hangs, leaks, stale);
    printf("soak: memory-limited runs: %d trained, %d stopped with an out-of-memory error (last: "
           "%s)\n",
           per_memory_outcome[0], per_memory_outcome[1], last_oom);
    fflush(stdout);
    assert_nothing_new(&shm_before, &shm_after, "/dev/shm");
    if (tmp_after.n) fail_msg("%s/%s was left behind", tmpdir, tmp_after.v[0]);
    rmdir(tmpdir);
    unsetenv("TMPDIR");
    if (g_full_mount[0]) { /* only the filler: no checkpoint or temporary file got in */
        names full = list_dir(g_full_mount, false);
        if (full.n != 1) fail_msg("%d files on the full disk (the filler only expected)", full.n);
        free_names(&full);
        umount(g_full_mount);
        rmdir(g_full_mount);
    }

    if (!SOAK_ASAN) {
        /* No leak per run: the heap in use may wobble by a few allocations, not grow with
         * the number of runs. */
        if (heap_max_growth > 256 * 1024)
            fail_msg("the caller's heap grew by %zu bytes over %d runs", heap_max_growth, runs);
        if (rss_growth > 16 * 1024)
            fail_msg("the caller's resident memory grew by %ld KiB over %d runs", rss_growth, runs);
    }

    printf("soak: %d runs in %.1f s (seed %llu), failures %d\n", runs, total,
           (unsigned long long)seed, failures);
    printf("soak: runs per kind:");
    for (int k = 0; k < K_COUNT; k++) printf(" %s %d", kind_name[k], per_kind[k]);
    printf("\nsoak: faults per event:");
    for (size_t e = 0; e < sizeof strike_events / sizeof *strike_events; e++)
        printf(" %s %d", cf_event_name(strike_events[e]), per_event[strike_events[e]]);
    printf("\nsoak: slowest report after the fault (s):");
    for (int k = 1; k < K_COUNT; k++)
        if (k != K_RECOVER) printf(" %s %.2f", kind_name[k], worst_latency[k]);
    printf(" (hang: deadline %.1f s)\n", 0.5 * slow);
    printf("soak: recovered runs: %d by SIGKILL, %d by SIGSTOP; slowest from the fault to the "
           "finished fit %.2f s\n",
           per_recover_signal[0], per_recover_signal[1], worst_latency[K_RECOVER]);
    printf("soak: caller heap growth %zu bytes, RSS growth %ld KiB%s\n", heap_max_growth,
           rss_growth, SOAK_ASAN ? " (not measured under ASan)" : "");
    fflush(stdout);

    assert_int_equal(write(g_pipe[1], "q", 1), 1);
    pthread_join(sender, NULL);
    close(g_pipe[0]);
    close(g_pipe[1]);
    free_names(&shm_before);
    free_names(&shm_after);
    free_names(&tmp_after);
    for (int i = 0; i < 4; i++) drop_result(&reference[i]);
    drop(&s0);
    munmap(g_shared, 4096);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_soak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
