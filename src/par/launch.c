/* The fork launcher and supervisor.
 *
 * The caller's process maps the shared region, forks the workers and then only watches them: it
 * sleeps until a worker ends (the worker's end of a pipe closes), SIGINT or a nap of a twentieth
 * of the deadline (10-200 ms), then reaps those that ended and checks the heartbeats. On the
 * first fault it sets the abort flag, SIGKILLs every other worker, reaps all of them, unmaps the
 * region, restores the signal dispositions it changed and returns an error naming the rank and
 * the cause. On success the results area stays mapped and is handed to the caller. */
#include "core/pool.h"
#include "par_internal.h"

#include "corefit/tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CF_MAX_WORKERS 256
#define CF_DEFAULT_DEADLINE_S 60.0
#define CF_DEFAULT_COMM_BYTES ((size_t)512 << 10) /* measured best for 1M floats on 2 cores */
/* The supervisor sleeps until a worker ends (its end of a pipe closes), SIGINT, or a nap of
 * deadline / NAP_PER_DEADLINE (between NAP_MIN_NS and NAP_MAX_NS) for the heartbeat checks. It
 * used to poll every 10 ms: a thousand wake-ups per 10 s, each preempting whichever worker's
 * core it woke on (bench/README.md, "The supervisor sleeps on its workers' pipes"). */
#define NAP_PER_DEADLINE 20
#define NAP_MIN_NS ((uint64_t)10 * 1000 * 1000)
#define NAP_MAX_NS ((uint64_t)200 * 1000 * 1000)
/* after a worker's pipe closed and before it can be reaped (it closes its files before it
 * becomes a zombie) */
#define REAP_NAP_NS ((uint64_t)1000 * 1000)
/* A supervisor nap that lasts this long (or half the deadline, if less) means this process was
 * not running: the whole group was stopped (SIGSTOP/SIGTSTP then SIGCONT, a cgroup freezer). */
#define PAUSE_GAP_NS ((uint64_t)1000 * 1000 * 1000)

static volatile sig_atomic_t sigint_seen;
static _Thread_local cf__launch_fault last_fault;

cf__launch_fault cf__launch_last_fault(void) {
    return last_fault;
}
static atomic_flag launch_busy = ATOMIC_FLAG_INIT;

static void on_sigint(int sig) {
    (void)sig;
    sigint_seen = 1;
}

void cf_results_release(cf_results *results) {
    if (!results) return;
    if (results->map_) munmap(results->map_, results->map_bytes_);
    memset(results, 0, sizeof *results);
}

/* ---- the worker side ----------------------------------------------------------------------- */

/* OpenBLAS maps a work buffer on its first call in a process (128 MiB on some builds) and, when
 * the mapping fails (an address-space limit, vm.overcommit_memory=2), retries for ever: a worker
 * would spin at full CPU until the deadline. So each worker makes that first call before the
 * job, under a CPU-time alarm that a real first call never reaches, and fails clearly if it
 * fires. The message is prepared beforehand: the handler only copies it. */
#define BLAS_WARM_UP_CPU_S 1
#define BLAS_WARM_UP_N 128
static cf_shm_rank *warm_up_slot;
static char warm_up_message[CF_SHM_MSG];

static void blas_stuck(int sig) {
    (void)sig;
    memcpy(warm_up_slot->message, warm_up_message, sizeof warm_up_message);
    warm_up_slot->status = (int32_t)CF_ERR_NOMEM;
    atomic_store(&warm_up_slot->state, CF_SHM_DONE_ERR);
    _exit(1);
}

static void warm_up_blas(cf_shm_rank *slot, int rank) {
    struct rlimit as;
    double limit_mb = getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY
                          ? (double)as.rlim_cur / 1e6
                          : -1;
    char limit[96] = "no address-space limit: vm.overcommit_memory=2 or the machine's memory";
    if (limit_mb > 0) snprintf(limit, sizeof limit, "address-space limit %.0f MB", limit_mb);
    snprintf(warm_up_message, sizeof warm_up_message,
             "out of memory: OpenBLAS could not map its work buffer in worker %d (%s; a worker "
             "needs room for it besides the model)",
             rank, limit);
    warm_up_slot = slot;
    float *m = malloc(3 * BLAS_WARM_UP_N * BLAS_WARM_UP_N * sizeof(float));
    if (!m) return; /* the job's own allocations will report it */
    memset(m, 0, 3 * BLAS_WARM_UP_N * BLAS_WARM_UP_N * sizeof(float));
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = blas_stuck;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPROF, &sa, &old);
    struct itimerval arm = {{0, 0}, {BLAS_WARM_UP_CPU_S, 0}}, off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &arm, NULL);
    int n = BLAS_WARM_UP_N;
    cf_sgemm(false, false, n, n, n, 1.0f, m, n, m + n * n, n, 0.0f, m + 2 * n * n, n);
    setitimer(ITIMER_PROF, &off, NULL);
    sigaction(SIGPROF, &old, NULL);
    free(m);
}

/* SIGTERM in a worker, when the caller handles it: pre-emption (Slurm, `timeout`, a container
 * runtime, `kill -TERM -PGID`) signals the whole process group, and whichever process gets it
 * first, the request is the supervisor's: the caller's handler runs there (a fit's checkpoint
 * request reaches the workers through shared memory), and the worker finishes its batch. */
static pid_t term_supervisor;

static void forward_term(int sig) {
    int saved = errno;
    if (getppid() == term_supervisor) kill(term_supervisor, sig);
    errno = saved;
}

/* CF_TIMING=1: where a worker's wall time went, on stderr (bench/scaling.py reads it): from its
 * start to the job (pinning, OpenBLAS's warm-up), the job, and the part of the job spent in
 * barriers (every collective passes one or more), with how many waits outlasted the spin and
 * how many futex naps they took; then the worker's CPU seconds (its own, from its fork) and its
 * involuntary context switches: a worker whose barriers wait less than its peer's while its CPU
 * seconds match was preempted more (its core shared), not given more work. */
static void report_timing(const cf_shm_comm *c, int rank, uint64_t t_start, uint64_t t_ready) {
    if (!cf__timing_requested()) return;
    uint64_t now = cf_shm_now_ns();
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    getrusage(RUSAGE_SELF, &ru);
    const double cpu = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                       (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
    fprintf(stderr,
            "timing: worker %d: start %.3f s, job %.3f s, of it %.3f s in %llu barriers (%llu "
            "waits past the spin, %llu futex naps); CPU %.3f s, %ld preemptions, peak resident "
            "%.1f MB\n",
            rank, (double)(t_ready - t_start) * 1e-9, (double)(now - t_ready) * 1e-9,
            (double)c->wait_ns * 1e-9, (unsigned long long)c->barriers,
            (unsigned long long)c->slow_waits, (unsigned long long)c->naps, cpu, ru.ru_nivcsw,
            (double)ru.ru_maxrss / 1024);
}

static _Noreturn void worker_main(cf_shm_header *hdr, int rank, const int *cpus, int ncpus,
                                  bool pin, cf_worker_fn fn, void *ctx) {
    /* Die with the supervisor; if it is already gone, leave now. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != hdr->supervisor_pid) _exit(125);
    atomic_flag_clear(&launch_busy); /* this process is not supervising (yet) */
    /* No handler of the caller's may run here: one that longjmps (a test framework's crash
     * handler, say) would carry on in the caller's code. A crash kills the worker, and the
     * supervisor reports the signal. (This drops a sanitizer's SEGV report too.) Ignored
     * signals stay ignored. */
    signal(SIGINT, SIG_IGN);
    struct sigaction term_old;
    bool caller_handles_term = sigaction(SIGTERM, NULL, &term_old) == 0 &&
                               ((term_old.sa_flags & SA_SIGINFO) ||
                                (term_old.sa_handler != SIG_DFL && term_old.sa_handler != SIG_IGN));
    if (caller_handles_term) {
        struct sigaction fwd;
        memset(&fwd, 0, sizeof fwd);
        fwd.sa_handler = forward_term;
        sigemptyset(&fwd.sa_mask);
        fwd.sa_flags = SA_RESTART;
        term_supervisor = hdr->supervisor_pid;
        sigaction(SIGTERM, &fwd, NULL);
    }
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction old;
        if (sig == SIGKILL || sig == SIGSTOP || (sig == SIGTERM && caller_handles_term) ||
            sigaction(sig, NULL, &old) != 0)
            continue;
        if ((old.sa_flags & SA_SIGINFO) || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN))
            signal(sig, SIG_DFL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (pin && ncpus > 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[rank % ncpus], &set);
        sched_setaffinity(0, sizeof set, &set); /* best effort */
    }
    cf_set_num_threads(1);
    cf_clear_error();

    uint64_t t_start = cf_shm_now_ns();
    cf_shm_comm comm;
    cf_shm_comm_init(&comm, hdr, rank);
    cf_shm_rank *slot = cf_shm_rank_at(hdr, rank);
    atomic_store(&slot->heartbeat_ns, cf_shm_now_ns());
    warm_up_blas(slot, rank);
    atomic_store(&slot->heartbeat_ns, cf_shm_now_ns());

    uint64_t t_ready = cf_shm_now_ns();
    cf_status st = fn(&comm.base, ctx);
    report_timing(&comm, rank, t_start, t_ready);
    const char *msg = cf_last_error();
    if (st == CF_OK && comm.base.broken != CF_OK) {
        /* A collective failed but fn carried on: the group is out of step. */
        st = comm.base.broken;
        msg = comm.base.broken_msg;
    }
    slot->status = (int32_t)st;
    if (st != CF_OK)
        snprintf(slot->message, sizeof slot->message, "%s", msg && *msg ? msg : cf_status_str(st));
    atomic_store(&slot->state, st == CF_OK ? CF_SHM_DONE_OK : CF_SHM_DONE_ERR);
    fflush(NULL);
    _exit(st == CF_OK ? 0 : 1);
}

/* ---- the supervisor -------------------------------------------------------------------------- */

typedef struct supervisor {
    cf_shm_header *hdr;
    int n;
    pid_t pids[CF_MAX_WORKERS];
    bool alive[CF_MAX_WORKERS];
    int n_alive;
    int ends[CF_MAX_WORKERS]; /* the read end of each worker's pipe (-1: none, or closed) */
    uint64_t wakes;           /* CF_TIMING: the supervisor's wake-ups */
    struct sigaction old_int, old_chld;
    bool int_changed, chld_changed;
    uint64_t awake_ns;      /* when the supervisor last checked (CLOCK_MONOTONIC) */
    uint64_t resumed_ns;    /* the end of its last pause: silence before it is not held against
                             * a worker, which gets a whole deadline from here to show progress */
    cf__launch_fault fault; /* what the returned error reports */
} supervisor;

static const char *signal_name(int sig, char *buf, size_t cap) {
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(buf, cap, "SIG%s", abbrev);
    else
        snprintf(buf, cap, "signal %d", sig);
    return buf;
}

/* Turns a reaped worker's wait status into CF_OK (finished cleanly) or a fault message.
 * *consequence is set when the worker failed only because another one left the group; its
 * message then names that other worker's own failure when there is one. */
static cf_status judge_exit(supervisor *s, int r, int wstatus, bool *consequence,
                            cf__launch_fault *fault) {
    cf_shm_rank *slot = cf_shm_rank_at(s->hdr, r);
    uint32_t state = atomic_load(&slot->state);
    *consequence = false;
    *fault = (cf__launch_fault){CF_FAULT_NONE, r, 0};
    if (WIFSIGNALED(wstatus)) {
        char name[32];
        int sig = WTERMSIG(wstatus);
        *fault = (cf__launch_fault){CF_FAULT_KILLED, r, sig};
        return cf_fail(CF_ERR_WORKER, "worker %d was killed by signal %d (%s)", r, sig,
                       signal_name(sig, name, sizeof name));
    }
    int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
    if (state == CF_SHM_DONE_ERR) {
        int b = slot->blame - 1;
        if (b >= 0 && b < s->n && b != r &&
            atomic_load(&cf_shm_rank_at(s->hdr, b)->state) == CF_SHM_DONE_ERR) {
            r = b; /* report the cause, not the consequence */
            slot = cf_shm_rank_at(s->hdr, b);
        } else if (b >= 0) {
            *consequence = true;
        }
        char msg[CF_SHM_MSG];
        memcpy(msg, slot->message, sizeof msg);
        msg[sizeof msg - 1] = '\0';
        /* a consequence: worker b left the group without an outcome (killed, or silent) */
        *fault = *consequence ? (cf__launch_fault){CF_FAULT_HUNG, b, 0}
                              : (cf__launch_fault){CF_FAULT_FAILED, r, 0};
        return cf_fail(CF_ERR_WORKER, "worker %d failed: %s", r, msg);
    }
    if (state == CF_SHM_DONE_OK && code == 0) return CF_OK;
    *fault = (cf__launch_fault){CF_FAULT_EXITED, r, 0};
    return cf_fail(CF_ERR_WORKER, "worker %d exited with code %d before finishing", r, code);
}

/* Aborts the group: flag, SIGKILL, reap everything. Keeps the current error message. */
static void stop_all(supervisor *s) {
    if (s->hdr) cf_shm_abort(s->hdr);
    for (int r = 0; r < s->n; r++)
        if (s->alive[r]) kill(s->pids[r], SIGKILL);
    for (int r = 0; r < s->n; r++) {
        if (!s->alive[r]) continue;
        int ws;
        while (waitpid(s->pids[r], &ws, 0) < 0 && errno == EINTR) {
        }
        s->alive[r] = false;
    }
    s->n_alive = 0;
}

static void restore_signals(supervisor *s) {
    if (s->int_changed) sigaction(SIGINT, &s->old_int, NULL);
    if (s->chld_changed) sigaction(SIGCHLD, &s->old_chld, NULL);
    s->int_changed = s->chld_changed = false;
}

/* Describes what rank r waits for in its current collective (for the hung message). */
static void describe_wait(supervisor *s, int r, char *buf, size_t cap) {
    cf_shm_rank *slot = cf_shm_rank_at(s->hdr, r);
    uint64_t arrival = atomic_load(&slot->arrived);
    const char *op = cf_shm_op_name(atomic_load(&slot->op));
    unsigned long long seq = (unsigned long long)atomic_load(&slot->op_seq);
    char peers[160] = "";
    size_t at = 0;
    int count = 0;
    for (int p = 0; p < s->n && at < sizeof peers; p++) {
        if (p == r || atomic_load(&cf_shm_rank_at(s->hdr, p)->arrived) >= arrival) continue;
        int w = snprintf(peers + at, sizeof peers - at, "%s%d", count ? ", " : "", p);
        if (w > 0) at += (size_t)w;
        count++;
    }
    if (count)
        snprintf(buf, cap, " (waiting in %s #%llu for worker %s)", op, seq, peers);
    else /* every peer got there: this worker itself stopped running inside the collective */
        snprintf(buf, cap, " (stopped inside %s #%llu, which every worker reached)", op, seq);
}

/* Notes a pause of the supervisor itself. Its naps are at most NAP_MAX_NS long (at most a
 * twentieth of the deadline, and the gap below is half of it or 1 s); one that took far longer
 * means the process did not run, and when the whole group is stopped the workers did not run
 * either: their heartbeats are old because they were stopped, not because they hang. CLOCK_
 * MONOTONIC keeps counting while stopped (a system suspend stops it, so needs no care). */
static void note_pause(supervisor *s, uint64_t now) {
    uint64_t gap = (uint64_t)(s->hdr->deadline_s * 0.5e9);
    if (gap > PAUSE_GAP_NS) gap = PAUSE_GAP_NS;
    if (s->awake_ns && now > s->awake_ns && now - s->awake_ns > gap) s->resumed_ns = now;
    s->awake_ns = now;
}

/* How long a rank may wait in a collective before it is named: the deadline and an eighth of it.
 * A peer that hangs outside the collective right after its last heartbeat, which it gave a little
 * after this rank began to wait (the two race under load), then crosses its own deadline first
 * and is named as the cause; the supervisor wakes on the first deadline due, so without the grace
 * the waiting rank would be named whenever the peer's heartbeat came later. */
static uint64_t wait_limit(uint64_t limit) {
    return limit + limit / 8;
}

/* Checks the deadline. Ranks silent outside a collective are blamed before ranks that wait in
 * one (a wait is usually the consequence of another rank's silence). */
static cf_status check_progress(supervisor *s, uint64_t now) {
    const uint64_t limit = (uint64_t)(s->hdr->deadline_s * 1e9), waited = wait_limit(limit);
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < s->n; r++) {
            if (!s->alive[r]) continue;
            cf_shm_rank *slot = cf_shm_rank_at(s->hdr, r);
            if (atomic_load(&slot->state) != CF_SHM_RUNNING) continue;
            uint64_t since = atomic_load(&slot->wait_since_ns);
            uint64_t hb = atomic_load(&slot->heartbeat_ns);
            if (hb < s->resumed_ns) hb = s->resumed_ns;
            if (since != 0 && since < s->resumed_ns) since = s->resumed_ns;
            if ((pass == 0 && since == 0 && now > hb && now - hb > limit) ||
                (pass == 1 && since != 0 && now > since && now - since > waited))
                s->fault = (cf__launch_fault){CF_FAULT_HUNG, r, 0};
            if (pass == 0 && since == 0 && now > hb && now - hb > limit)
                return cf_fail(CF_ERR_WORKER, "worker %d made no progress for %.1f s", r,
                               (double)(now - hb) * 1e-9);
            if (pass == 1 && since != 0 && now > since && now - since > waited) {
                char what[256];
                describe_wait(s, r, what, sizeof what);
                return cf_fail(CF_ERR_WORKER, "worker %d made no progress for %.1f s%s", r,
                               (double)(now - since) * 1e-9, what);
            }
        }
    }
    return CF_OK;
}

/* Sleeps until a worker's pipe closes (it ended: reaped on the next pass), SIGINT (blocked
 * outside this sleep, so that a SIGINT after the check of sigint_seen still cuts it short), or
 * the nap's end. A worker whose pipe closed but which is not yet a zombie is looked at again
 * after REAP_NAP_NS. */
static void nap(supervisor *s, const sigset_t *unblocked) {
    uint64_t ns = (uint64_t)(s->hdr->deadline_s * 1e9 / NAP_PER_DEADLINE);
    if (ns < NAP_MIN_NS) ns = NAP_MIN_NS;
    if (ns > NAP_MAX_NS) ns = NAP_MAX_NS;
    /* and no later than the first moment a worker's silence would outlast the deadline, so that
     * a hung worker is named after the deadline, not after the deadline and a nap */
    const uint64_t now = cf_shm_now_ns(), limit = (uint64_t)(s->hdr->deadline_s * 1e9);
    for (int r = 0; r < s->n; r++) {
        cf_shm_rank *slot = cf_shm_rank_at(s->hdr, r);
        if (!s->alive[r] || atomic_load(&slot->state) != CF_SHM_RUNNING) continue;
        uint64_t since = atomic_load(&slot->wait_since_ns);
        const uint64_t allowed = since ? wait_limit(limit) : limit;
        if (since == 0) since = atomic_load(&slot->heartbeat_ns);
        if (since < s->resumed_ns) since = s->resumed_ns;
        const uint64_t due = since + allowed + REAP_NAP_NS; /* just past it */
        if (due > now && due - now < ns) ns = due - now;
    }
    struct pollfd fds[CF_MAX_WORKERS];
    int nfds = 0;
    for (int r = 0; r < s->n; r++) {
        if (!s->alive[r]) continue;
        if (s->ends[r] < 0) {
            ns = REAP_NAP_NS; /* its pipe closed: it is about to become a zombie */
            continue;
        }
        fds[nfds++] = (struct pollfd){.fd = s->ends[r], .events = POLLIN};
    }
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    s->wakes++;
    if (ppoll(fds, (nfds_t)nfds, &ts, unblocked) <= 0) return; /* the nap's end, or SIGINT */
    for (int i = 0; i < nfds; i++) {
        if (!fds[i].revents) continue;
        for (int r = 0; r < s->n; r++)
            if (s->ends[r] == fds[i].fd) {
                close(s->ends[r]); /* nothing is ever written: it closed */
                s->ends[r] = -1;
            }
    }
}

static cf_status supervise_loop(supervisor *s, char *fault, size_t fault_cap,
                                const sigset_t *unblocked) {
    for (;;) {
        /* Reap whoever ended. Of several faults seen together, report a cause before a
         * consequence, then the lowest rank. */
        bool have_fault = false, fault_is_consequence = true;
        for (int r = 0; r < s->n; r++) {
            if (!s->alive[r]) continue;
            int ws;
            pid_t w = waitpid(s->pids[r], &ws, WNOHANG);
            if (w == 0 || (w < 0 && errno == EINTR)) continue;
            s->alive[r] = false;
            s->n_alive--;
            bool consequence = false;
            cf__launch_fault what = {CF_FAULT_OTHER, r, 0};
            cf_status st = w < 0 ? cf_fail(CF_ERR_WORKER, "worker %d could not be waited for: %s",
                                           r, strerror(errno))
                                 : judge_exit(s, r, ws, &consequence, &what);
            if (st == CF_OK) continue;
            if (!have_fault || (fault_is_consequence && !consequence)) {
                snprintf(fault, fault_cap, "%s", cf_last_error());
                s->fault = what;
                fault_is_consequence = consequence;
                have_fault = true;
            }
        }
        if (have_fault) return cf_fail(CF_ERR_WORKER, "%s", fault);
        if (s->n_alive == 0) return CF_OK;
        if (sigint_seen) return cf_fail(CF_ERR_INTERRUPTED, "interrupted");
        uint64_t now = cf_shm_now_ns();
        note_pause(s, now);
        cf_status st = check_progress(s, now);
        if (st != CF_OK) return st;
        nap(s, unblocked);
    }
}

static cf_status supervise(supervisor *s) {
    char fault[CF_SHM_MSG + 64];
    /* SIGINT reaches the supervisor only inside its sleep (ppoll's mask) */
    sigset_t int_only, old_mask;
    sigemptyset(&int_only);
    sigaddset(&int_only, SIGINT);
    pthread_sigmask(SIG_BLOCK, &int_only, &old_mask);
    sigset_t unblocked_set = old_mask;
    sigdelset(&unblocked_set, SIGINT);
    const sigset_t *unblocked = &unblocked_set;
    cf_status result = supervise_loop(s, fault, sizeof fault, unblocked);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    return result;
}

static cf_status check_options(const cf_launch_options *opt, cf_worker_fn fn) {
    if (!opt) return cf_fail(CF_ERR_INVALID, "cf_launch_fork: options are NULL");
    if (!fn) return cf_fail(CF_ERR_INVALID, "cf_launch_fork: worker function is NULL");
    if (opt->num_workers < 0 || opt->num_workers > CF_MAX_WORKERS)
        return cf_fail(CF_ERR_INVALID, "cf_launch_fork: num_workers = %d (allowed 0..%d)",
                       opt->num_workers, CF_MAX_WORKERS);
    if (!(opt->deadline_s >= 0) || opt->deadline_s > 1e7)
        return cf_fail(CF_ERR_INVALID, "cf_launch_fork: deadline_s = %g (must be >= 0)",
                       opt->deadline_s);
    if (opt->comm_bytes > ((size_t)1 << 32))
        return cf_fail(CF_ERR_INVALID, "cf_launch_fork: comm_bytes = %zu (at most 4 GiB)",
                       opt->comm_bytes);
    return CF_OK;
}

cf_status cf_launch_fork(const cf_launch_options *opt, cf_worker_fn fn, void *ctx,
                         cf_results *results_out) {
    return cf__launch_fork_hooked(opt, fn, ctx, results_out, NULL, NULL);
}

cf_status cf__launch_fork_hooked(const cf_launch_options *opt, cf_worker_fn fn, void *ctx,
                                 cf_results *results_out, void (*forked)(void *),
                                 void *forked_ctx) {
    if (results_out) memset(results_out, 0, sizeof *results_out);
    last_fault = (cf__launch_fault){CF_FAULT_OTHER, -1, 0};
    cf_status st = check_options(opt, fn);
    if (st != CF_OK) return st;
    if (atomic_flag_test_and_set(&launch_busy))
        return cf_fail(CF_ERR_STATE, "cf_launch_fork: another launch is running in this process");

    int n = opt->num_workers ? opt->num_workers : cf_available_cores();
    if (n > CF_MAX_WORKERS) n = CF_MAX_WORKERS;
    double deadline = opt->deadline_s > 0 ? opt->deadline_s : CF_DEFAULT_DEADLINE_S;
    size_t comm_bytes = opt->comm_bytes ? opt->comm_bytes : CF_DEFAULT_COMM_BYTES;

    /* The cores we may use, for pinning. */
    int cpus[CPU_SETSIZE], ncpus = 0;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &allowed)) cpus[ncpus++] = c;

    supervisor s;
    memset(&s, 0, sizeof s);
    s.n = n;
    s.fault = (cf__launch_fault){CF_FAULT_OTHER, -1, 0};
    st = cf_shm_region_create(n, comm_bytes, opt->results_bytes, deadline, &s.hdr);
    if (st != CF_OK) {
        atomic_flag_clear(&launch_busy);
        return cf_fail_context(st, "cf_launch_fork");
    }

    /* Catch SIGINT (unless the caller ignores it) and make sure our children can be waited
     * for. Installed before fork: a worker inherits a handler that only sets a flag, until it
     * ignores SIGINT itself. */
    sigint_seen = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, NULL, &s.old_int);
    if (s.old_int.sa_handler != SIG_IGN || (s.old_int.sa_flags & SA_SIGINFO)) {
        sa.sa_handler = on_sigint;
        if (sigaction(SIGINT, &sa, NULL) == 0) s.int_changed = true;
    }
    sa.sa_handler = SIG_DFL;
    if (sigaction(SIGCHLD, &sa, &s.old_chld) == 0) s.chld_changed = true;

    fflush(NULL); /* so workers do not inherit and repeat buffered output */
    for (int r = 0; r < n; r++) s.ends[r] = -1;
    for (int r = 0; r < n; r++) {
        /* Each worker holds the write end of a pipe of its own until it ends, so the supervisor
         * sleeps until one ends instead of polling (without one it naps and polls). */
        int ends[2] = {-1, -1};
        if (pipe2(ends, O_CLOEXEC) != 0) ends[0] = ends[1] = -1;
        pid_t pid = fork();
        if (pid == 0) {
            for (int q = 0; q < r; q++)
                if (s.ends[q] >= 0) close(s.ends[q]); /* the earlier workers' read ends */
            if (ends[0] >= 0) close(ends[0]);
            worker_main(s.hdr, r, cpus, ncpus, opt->pin_cores, fn, ctx);
        }
        if (ends[1] >= 0) close(ends[1]);
        if (pid < 0) {
            if (ends[0] >= 0) close(ends[0]);
            st = cf_fail(CF_ERR_WORKER, "cf_launch_fork: fork of worker %d of %d failed: %s", r, n,
                         strerror(errno));
            break;
        }
        s.ends[r] = ends[0];
        s.pids[r] = pid;
        s.alive[r] = true;
        s.n_alive++;
    }
    /* Every worker has its copy of this process now: the caller may release what it will not
     * read before the workers end (its pages stay the workers' until they write them). */
    if (st == CF_OK && forked) forked(forked_ctx);
    const uint64_t t_supervise = cf_shm_now_ns();
    if (st == CF_OK) st = supervise(&s);
    if (st != CF_OK) stop_all(&s);
    for (int r = 0; r < n; r++)
        if (s.ends[r] >= 0) close(s.ends[r]);
    if (cf__timing_requested())
        fprintf(stderr, "timing: supervisor: %llu wake-ups in %.3f s\n",
                (unsigned long long)s.wakes, (double)(cf_shm_now_ns() - t_supervise) * 1e-9);
    last_fault = st == CF_OK ? (cf__launch_fault){CF_FAULT_NONE, -1, 0} : s.fault;
    restore_signals(&s);

    if (st != CF_OK) {
        cf_shm_region_destroy(s.hdr);
    } else {
        /* Hand the results area over and drop the rest of the region. */
        cf_shm_header *h = s.hdr;
        size_t off = h->results_offset, total = h->total_bytes, rbytes = h->results_bytes;
        char *base = (char *)h;
        if (results_out && rbytes) {
            results_out->data = base + off;
            results_out->bytes = rbytes;
            results_out->map_ = base + off;
            results_out->map_bytes_ = total - off;
            munmap(base, off);
        } else {
            munmap(base, total);
        }
    }
    atomic_flag_clear(&launch_busy);
    return st;
}
