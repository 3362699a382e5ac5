/* A persistent thread pool for cf_parallel_for, started lazily and forgotten after fork (the
 * child has none of the parent's threads; it starts its own pool when it first needs one). */
#include "corefit/core.h"

#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/pool.h"
#include "core/spin.h"

#define CF_MAX_THREADS 256

typedef struct fn_stat fn_stat;

typedef struct pool {
    pthread_mutex_t lock;
    pthread_cond_t work_ready;
    pthread_cond_t work_done;
    pthread_t threads[CF_MAX_THREADS];
    int n_threads;               /* workers started (excluding the caller) */
    _Atomic uint64_t generation; /* bumped for each job, after the job's fields are written */
    _Atomic int pending;         /* the workers' parts of the current job not yet done */
    _Atomic int sleepers;        /* workers blocked, or about to block, on work_ready */
    _Atomic bool caller_asleep;  /* the caller blocked, or about to block, on work_done */
    bool stopping;               /* under lock */
    /* the generation of the job whose part i (1..n_threads) was last claimed: a part is run by
     * the thread that moves it to the job's generation, its worker or a caller whose own part
     * is done while the worker has not started (asleep or descheduled) */
    _Atomic uint64_t part_generation[CF_MAX_THREADS + 1];
    uint64_t start_generation[CF_MAX_THREADS + 1]; /* the generation a new worker starts from */
    /* the current job: written by the caller before it bumps the generation, read by the
     * workers after they see the new generation, unchanged until pending is back to 0 */
    cf_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;
    fn_stat *stat; /* CF_TIMING: the job function's counters */
} pool;

static pool the_pool = {.lock = PTHREAD_MUTEX_INITIALIZER,
                        .work_ready = PTHREAD_COND_INITIALIZER,
                        .work_done = PTHREAD_COND_INITIALIZER};
static int requested_threads; /* 0: not set, use the available cores */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t dispatch_lock = PTHREAD_MUTEX_INITIALIZER;

int cf_available_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    return 1;
}

int cf_get_num_threads(void) {
    int n = requested_threads > 0 ? requested_threads : cf_available_cores();
    return n > CF_MAX_THREADS ? CF_MAX_THREADS : n;
}

void cf_set_num_threads(int n) {
    requested_threads = n < 1 ? 0 : n;
    /* Kernels split work over the batch themselves; BLAS runs single-threaded inside them (set
     * when the library loads, select_blas_kernels below; again here in case a program changed
     * it). */
    openblas_set_num_threads(1);
}

static void chunk(int64_t n, int parts, int part, int64_t *begin, int64_t *end) {
    int64_t base = n / parts, extra = n % parts;
    *begin = part * base + (part < extra ? part : extra);
    *end = *begin + base + (part < extra ? 1 : 0);
}

/* A training step dispatches a job per layer and pass, tens of them per step, each a fraction of
 * a millisecond to a few: waking a thread blocked on a condition variable costs tens of
 * microseconds on an idle core, and up to milliseconds on a busy one, each time, and the job
 * waits for it. So a worker that has finished a job, and the caller waiting for the workers,
 * first spin on the atomic counters, then block. The spin is adaptive, per thread:
 *
 * - its budget starts at SPIN_MIN_NS, doubles (up to SPIN_MAX_NS) each time the awaited change
 *   came during the spin, and halves each time the spin ran out: between the jobs of a step (the
 *   two threads' parts end tens to hundreds of microseconds apart, and the caller's serial work
 *   between jobs adds some) the threads keep spinning and never sleep, while a pool left idle
 *   sleeps after at most SPIN_MAX_NS and soon after SPIN_MIN_NS;
 * - it backs off when the machine is oversubscribed: a spin that finds it was descheduled (the
 *   clock jumped by more than SPIN_PREEMPT_NS between two of its checks, tens of pause
 *   instructions apart) drops its budget to SPIN_MIN_NS and keeps it there for the next
 *   SPIN_COOLDOWN spins, so that threads which cannot have a core to themselves do not take CPU
 *   time from the other work on the machine by spinning.
 *
 * Only the waiting changes: the chunks each thread runs are the same, and so are the results. */
#define SPIN_MIN_NS 50000.0
#define SPIN_MAX_NS 1000000.0
#define SPIN_PREEMPT_NS 200000.0
#define SPIN_COOLDOWN 64

/* cf__pool_set_spin's override of the budget: < 0: adaptive (the default), 0: no spin (block at
 * once), > 0: a fixed budget in nanoseconds. */
static _Atomic double spin_fixed_ns = -1;

typedef struct spinner {
    double budget_ns; /* the next spin's bound */
    int cooldown;     /* spins left before the budget may grow again after a preemption */
} spinner;

static double spin_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

/* CF_TIMING=1's report at exit (stop_pool): jobs dispatched, how often a worker blocked on the
 * condition variable after its spin (its next job then waits for it to be woken), how often the
 * caller's spin ran out waiting for the workers, its seconds waiting after its own part, and how
 * many spins found themselves descheduled (an oversubscribed machine; they back off). */
static _Atomic uint64_t stat_jobs, stat_worker_sleeps, stat_caller_sleeps, stat_caller_wait_ns,
    stat_preempted, stat_crowd_checks, stat_crowded, stat_taken_over;
/* With CF_TIMING=1 only (timing_on), where the threads' time went: the caller's own parts and
 * the workers' parts (summed), in wall and in thread CPU time (a part's wall above its CPU time
 * is time its thread was descheduled), and the caller's time between one job's end and the next
 * one's dispatch when under GAP_NS (its serial work inside a step, which the workers spend
 * waiting). */
#define GAP_NS 5e6
static bool timing_on;
static bool take_over_off; /* CF_POOL_TAKE_OVER=0 */
static _Atomic uint64_t stat_caller_part_ns, stat_worker_part_ns, stat_caller_part_cpu_ns,
    stat_worker_part_cpu_ns, stat_gap_ns, stat_gap_cpu_ns;

/* With CF_TIMING=1, the same per job function (the first FN_SLOTS functions seen; the rest are
 * counted together): jobs, the two sides' parts, the caller's wait after its own part, and the
 * serial gap before the job (under GAP_NS), so that the report names the layers and passes whose
 * serial work or imbalance costs the most. Written by the caller, which holds dispatch_lock,
 * except the workers' parts (atomic). */
#define FN_SLOTS 96
struct fn_stat {
    cf_range_fn fn; /* NULL: free */
    uint64_t jobs, caller_part_ns, wait_ns, gap_ns, gap_cpu_ns;
    _Atomic uint64_t worker_part_ns;
};
static fn_stat fn_stats[FN_SLOTS + 1]; /* the last one: every other function */

static fn_stat *fn_stat_for(cf_range_fn fn) {
    size_t h = ((uintptr_t)fn >> 4) % FN_SLOTS;
    for (size_t i = 0; i < FN_SLOTS; i++) {
        fn_stat *f = &fn_stats[(h + i) % FN_SLOTS];
        if (f->fn == fn) return f;
        if (!f->fn) {
            f->fn = fn;
            return f;
        }
    }
    return &fn_stats[FN_SLOTS];
}

static double thread_cpu_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

/* Runs fn over [b, e) as thread id's part, timed into *wall_ns and *cpu_ns when timing_on;
 * returns the part's wall nanoseconds (0 without timing). */
static uint64_t run_part(cf_range_fn fn, void *ctx, int64_t b, int64_t e, int id,
                         _Atomic uint64_t *wall_ns, _Atomic uint64_t *cpu_ns) {
    if (!timing_on) {
        if (b < e) fn(ctx, b, e, id);
        return 0;
    }
    const double w0 = spin_clock(), c0 = thread_cpu_clock();
    if (b < e) fn(ctx, b, e, id);
    const uint64_t wall = (uint64_t)(spin_clock() - w0);
    atomic_fetch_add_explicit(cpu_ns, (uint64_t)(thread_cpu_clock() - c0), memory_order_relaxed);
    atomic_fetch_add_explicit(wall_ns, wall, memory_order_relaxed);
    return wall;
}

/* The change awaited: *u64 != u64_value (a worker waiting for the next job), or *i32 == 0 (the
 * caller waiting for the workers). */
typedef struct awaited {
    _Atomic uint64_t *u64;
    uint64_t u64_value;
    _Atomic int *i32;
} awaited;

static bool arrived(const awaited *w) {
    if (w->u64) return atomic_load_explicit(w->u64, memory_order_acquire) != w->u64_value;
    return atomic_load_explicit(w->i32, memory_order_acquire) == 0;
}

/* Whether the machine has more runnable threads than CPUs, from the fourth field of
 * /proc/loadavg ("runnable/existing", an instant count that includes this process's running
 * threads), read at most every CROWD_CHECK_NS by whichever pool thread asks; false where it
 * cannot be read. */
#define CROWD_CHECK_NS 20e6
static _Atomic double crowd_checked_at = -1e18;
static _Atomic bool crowd;

static bool machine_crowded(double now) {
    if (now - atomic_load_explicit(&crowd_checked_at, memory_order_relaxed) < CROWD_CHECK_NS)
        return atomic_load_explicit(&crowd, memory_order_relaxed);
    atomic_store_explicit(&crowd_checked_at, now, memory_order_relaxed);
    bool crowded = false;
    const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char text[128];
        const ssize_t got = read(fd, text, sizeof text - 1);
        close(fd);
        if (got > 0) {
            text[got] = 0;
            long runnable = 0;
            if (sscanf(text, "%*s %*s %*s %ld/", &runnable) == 1) {
                const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
                crowded = cpus > 0 && runnable > cpus;
            }
        }
    }
    atomic_store_explicit(&crowd, crowded, memory_order_relaxed);
    atomic_fetch_add_explicit(&stat_crowd_checks, 1, memory_order_relaxed);
    if (crowded) atomic_fetch_add_explicit(&stat_crowded, 1, memory_order_relaxed);
    return crowded;
}

/* Spins until the awaited change (true) or the spinner's budget runs out (false), and adapts the
 * budget (see above). */
static bool spin_wait(spinner *s, const awaited *w) {
    const double fixed = atomic_load_explicit(&spin_fixed_ns, memory_order_relaxed);
    const double start = spin_clock();
    double budget = fixed >= 0 ? fixed : machine_crowded(start) ? SPIN_MIN_NS : s->budget_ns;
    if (budget <= 0) return arrived(w);
    double last = start;
    bool preempted = false, got = false;
    for (int i = 0;; i++) {
        if (arrived(w)) {
            got = true;
            break;
        }
        if ((i & 63) == 63) {
            const double now = spin_clock();
            if (now - last > SPIN_PREEMPT_NS) preempted = true;
            last = now;
            if (now - start > budget) break;
        }
        cf_spin_pause();
    }
    if (fixed >= 0) return got;
    if (preempted) {
        atomic_fetch_add_explicit(&stat_preempted, 1, memory_order_relaxed);
        s->budget_ns = SPIN_MIN_NS;
        s->cooldown = SPIN_COOLDOWN;
    } else if (got) {
        if (s->cooldown > 0)
            s->cooldown--;
        else if ((s->budget_ns *= 2) > SPIN_MAX_NS)
            s->budget_ns = SPIN_MAX_NS;
    } else {
        if (s->cooldown > 0) s->cooldown--;
        if ((s->budget_ns *= 0.5) < SPIN_MIN_NS) s->budget_ns = SPIN_MIN_NS;
    }
    return got;
}

bool cf__timing_requested(void) {
    const char *e = getenv("CF_TIMING");
    return e && strcmp(e, "1") == 0;
}

bool cf__machine_crowded(void) {
    return machine_crowded(spin_clock());
}

void cf__pool_set_spin(double ns) {
    atomic_store(&spin_fixed_ns, ns < 0 ? -1.0 : ns);
}

cf__pool_stats cf__pool_get_stats(void) {
    return (cf__pool_stats){.jobs = atomic_load(&stat_jobs),
                            .worker_sleeps = atomic_load(&stat_worker_sleeps),
                            .caller_sleeps = atomic_load(&stat_caller_sleeps),
                            .preempted_spins = atomic_load(&stat_preempted)};
}

/* Part id (1..n_threads) of the job of generation gen: true if this thread now owns it (nobody
 * had claimed it for gen; part_generation only grows, and a job ends only when every part was
 * claimed for its generation, so a thread that saw an older job cannot claim a newer one's). */
static bool claim_part(pool *p, int id, uint64_t gen) {
    uint64_t old = atomic_load(&p->part_generation[id]);
    return old < gen && atomic_compare_exchange_strong(&p->part_generation[id], &old, gen);
}

/* Runs part id of the current job (empty where id >= parts) on this thread, with the part's own
 * chunk and id: the same call, whichever thread makes it. */
static void run_claimed_part(pool *p, int id, _Atomic uint64_t *wall_ns, _Atomic uint64_t *cpu_ns) {
    if (id >= p->parts) return;
    int64_t b, e;
    chunk(p->n, p->parts, id, &b, &e);
    const uint64_t ns = run_part(p->fn, p->ctx, b, e, id, wall_ns, cpu_ns);
    if (ns && p->stat && wall_ns == &stat_worker_part_ns)
        atomic_fetch_add_explicit(&p->stat->worker_part_ns, ns, memory_order_relaxed);
}

/* The hand-over of a job takes no lock while the threads spin: the caller writes the job's
 * fields and bumps the generation (seq_cst), a worker that sees the new generation claims its
 * part (claim_part: the caller may have run it already), reads them and, done, decrements
 * pending (seq_cst), and the caller sees pending reach 0. The mutex and
 * the condition variables serve only threads that block, and each side announces that it blocks
 * (sleepers, caller_asleep) before its last look at what it waits for, while the other side
 * looks at that announcement after its own change: of two seq_cst stores each followed by a load
 * of the other's variable, at least one load sees the other's store, so either the blocking
 * thread sees the change or the other side takes the mutex and signals (which cannot come
 * between the blocking thread's last look and its wait, both under the mutex). Measured with
 * the mutex on every job: a thread that saw its change while spinning found the mutex still held
 * at about 1.5% of the jobs and slept on it (bench/README.md, "Two-core scaling"). */
static void *worker_main(void *arg) {
    int id = (int)(intptr_t)arg; /* 1..n_threads */
    pool *p = &the_pool;
    uint64_t seen = p->start_generation[id]; /* written before this thread was created */
    spinner sp = {.budget_ns = SPIN_MIN_NS};
    for (;;) {
        if (!spin_wait(&sp, &(awaited){.u64 = &p->generation, .u64_value = seen})) {
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->sleepers, 1);
            if (!p->stopping && atomic_load(&p->generation) == seen)
                atomic_fetch_add_explicit(&stat_worker_sleeps, 1, memory_order_relaxed);
            while (!p->stopping && atomic_load(&p->generation) == seen)
                pthread_cond_wait(&p->work_ready, &p->lock);
            atomic_fetch_sub(&p->sleepers, 1);
            const bool stopping = p->stopping;
            pthread_mutex_unlock(&p->lock);
            if (stopping) return NULL;
        }
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        /* The job's fields are read only once this thread owns its part: the job cannot end,
         * and the caller cannot write the next one, before the part is done. */
        if (!claim_part(p, id, seen)) continue; /* the caller ran it */
        run_claimed_part(p, id, &stat_worker_part_ns, &stat_worker_part_cpu_ns);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->work_done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

static void after_fork_in_child(void) {
    /* The child has no pool threads: forget them and reset the synchronisation objects. */
    pthread_mutex_init(&the_pool.lock, NULL);
    pthread_cond_init(&the_pool.work_ready, NULL);
    pthread_cond_init(&the_pool.work_done, NULL);
    pthread_mutex_init(&dispatch_lock, NULL);
    the_pool.n_threads = 0;
    the_pool.pending = 0;
    the_pool.sleepers = 0;
    the_pool.caller_asleep = false;
    the_pool.stopping = false;
}

/* The job functions whose serial gap before them plus the caller's wait after its part cost the
 * most, named by their symbol where the dynamic symbol table has it, else as object+offset (for
 * addr2line -f -e object). */
static void report_fn_stats(void) {
    enum { TOP = 12 };
    fn_stat *top[TOP] = {0};
    for (int i = 0; i <= FN_SLOTS; i++) {
        fn_stat *f = &fn_stats[i];
        if (!f->jobs) continue;
        const uint64_t cost = f->gap_ns + f->wait_ns;
        for (int k = 0; k < TOP; k++) {
            if (!top[k] || cost > top[k]->gap_ns + top[k]->wait_ns) {
                memmove(top + k + 1, top + k, (size_t)(TOP - 1 - k) * sizeof *top);
                top[k] = f;
                break;
            }
        }
    }
    fprintf(stderr, "timing: pool jobs by function (serial gap before + caller's wait after, "
                    "jobs, the caller's and the workers' parts, the gap's caller CPU, seconds):\n");
    for (int k = 0; k < TOP && top[k]; k++) {
        fn_stat *f = top[k];
        char name[160] = "(others)";
        Dl_info info;
        if (f != &fn_stats[FN_SLOTS] && dladdr((void *)(uintptr_t)f->fn, &info)) {
            if (info.dli_sname && info.dli_saddr == (void *)(uintptr_t)f->fn)
                snprintf(name, sizeof name, "%s", info.dli_sname);
            else
                snprintf(name, sizeof name, "%s+0x%lx", info.dli_fname ? info.dli_fname : "?",
                         (unsigned long)((uintptr_t)f->fn - (uintptr_t)info.dli_fbase));
        }
        fprintf(stderr,
                "timing:   %-40s gap %.3f wait %.3f jobs %llu parts %.3f %.3f gap-cpu %.3f\n", name,
                (double)f->gap_ns * 1e-9, (double)f->wait_ns * 1e-9, (unsigned long long)f->jobs,
                (double)f->caller_part_ns * 1e-9, (double)atomic_load(&f->worker_part_ns) * 1e-9,
                (double)f->gap_cpu_ns * 1e-9);
    }
}

static void stop_pool(void) {
    pool *p = &the_pool;
    if (timing_on && atomic_load(&stat_jobs))
        fprintf(
            stderr,
            "timing: thread pool (%d threads): %llu jobs, %llu worker sleeps, %llu parts the "
            "caller ran for a worker not yet started, %llu caller "
            "waits past the spin, the caller waited %.3f s after its own part, %llu spins "
            "descheduled, %llu of %llu checks found the machine crowded; parts: the caller's "
            "%.3f s (CPU %.3f s), the workers' %.3f s (CPU %.3f s); the caller's serial gaps "
            "between jobs (each under %.0f ms) %.3f s (CPU, each under as much CPU time: %.3f s)\n",
            p->n_threads + 1, (unsigned long long)atomic_load(&stat_jobs),
            (unsigned long long)atomic_load(&stat_worker_sleeps),
            (unsigned long long)atomic_load(&stat_taken_over),
            (unsigned long long)atomic_load(&stat_caller_sleeps),
            (double)atomic_load(&stat_caller_wait_ns) * 1e-9,
            (unsigned long long)atomic_load(&stat_preempted),
            (unsigned long long)atomic_load(&stat_crowded),
            (unsigned long long)atomic_load(&stat_crowd_checks),
            (double)atomic_load(&stat_caller_part_ns) * 1e-9,
            (double)atomic_load(&stat_caller_part_cpu_ns) * 1e-9,
            (double)atomic_load(&stat_worker_part_ns) * 1e-9,
            (double)atomic_load(&stat_worker_part_cpu_ns) * 1e-9, GAP_NS * 1e-6,
            (double)atomic_load(&stat_gap_ns) * 1e-9, (double)atomic_load(&stat_gap_cpu_ns) * 1e-9);
    if (timing_on && atomic_load(&stat_jobs)) report_fn_stats();
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_cond_broadcast(&p->work_ready);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    p->n_threads = 0;
    p->stopping = false;
}

static void register_atfork(void) {
    /* CF_POOL_SPIN_US=n: a fixed spin of n microseconds (0: none), for measuring the adaptive
     * spin against fixed ones; unset or anything else: adaptive. */
    const char *fixed = getenv("CF_POOL_SPIN_US");
    if (fixed && *fixed) {
        char *end;
        const double us = strtod(fixed, &end);
        if (*end == 0 && us >= 0) cf__pool_set_spin(us * 1e3);
    }
    timing_on = cf__timing_requested();
    /* CF_POOL_TAKE_OVER=0: the caller waits for every worker's part (as before), for measuring */
    const char *take_over = getenv("CF_POOL_TAKE_OVER");
    take_over_off = take_over && strcmp(take_over, "0") == 0;
    pthread_atfork(NULL, NULL, after_fork_in_child);
    atexit(stop_pool);
}

static void ensure_workers(int wanted) {
    pool *p = &the_pool;
    while (p->n_threads < wanted) {
        p->start_generation[p->n_threads + 1] = atomic_load(&p->generation);
        if (pthread_create(&p->threads[p->n_threads], NULL, worker_main,
                           (void *)(intptr_t)(p->n_threads + 1)) != 0)
            break; /* run with the threads we have */
        p->n_threads++;
    }
}

void cf_parallel_for(int64_t n, cf_range_fn fn, void *ctx) {
    if (n <= 0) return;
    int parts = cf_get_num_threads();
    if (parts > n) parts = (int)n;
    if (parts <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_once(&atfork_once, register_atfork);
    /* Nested or concurrent calls run inline rather than deadlock on the pool. */
    if (pthread_mutex_trylock(&dispatch_lock) != 0) {
        fn(ctx, 0, n, 0);
        return;
    }
    pool *p = &the_pool;
    if (p->n_threads < parts - 1) {
        pthread_mutex_lock(&p->lock);
        ensure_workers(parts - 1);
        pthread_mutex_unlock(&p->lock);
    }
    if (parts - 1 > p->n_threads) parts = p->n_threads + 1;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->parts = parts;
    fn_stat *fs = timing_on ? fn_stat_for(fn) : NULL;
    p->stat = fs;
    atomic_store_explicit(&p->pending, p->n_threads, memory_order_relaxed);
    /* publishes the fields and pending */
    const uint64_t gen = atomic_fetch_add(&p->generation, 1) + 1;
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->work_ready);
        pthread_mutex_unlock(&p->lock);
    }

    static double last_done = -1e18; /* callers hold dispatch_lock */
    /* the caller's thread CPU clock then, and which thread of which process read it: another
     * thread's clock (a second caller, a fork child's restarted one) is not comparable */
    static double last_done_cpu;
    static pthread_t last_cpu_thread;
    static pid_t last_cpu_pid;
    if (timing_on) {
        const double t_start = spin_clock();
        if (t_start - last_done < GAP_NS) {
            atomic_fetch_add_explicit(&stat_gap_ns, (uint64_t)(t_start - last_done),
                                      memory_order_relaxed);
            fs->gap_ns += (uint64_t)(t_start - last_done);
        }
        /* in CPU time too: the serial work itself, whatever the machine's load (a gap whose
         * wall passed GAP_NS while its thread was descheduled still counts) */
        const double gap_cpu = thread_cpu_clock() - last_done_cpu;
        const bool same_caller =
            last_cpu_pid == getpid() && pthread_equal(last_cpu_thread, pthread_self());
        if (same_caller && gap_cpu >= 0 && gap_cpu < GAP_NS) {
            atomic_fetch_add_explicit(&stat_gap_cpu_ns, (uint64_t)gap_cpu, memory_order_relaxed);
            fs->gap_cpu_ns += (uint64_t)gap_cpu;
        }
    }
    int64_t b, e;
    chunk(n, parts, 0, &b, &e);
    const uint64_t own_ns =
        run_part(fn, ctx, b, e, 0, &stat_caller_part_ns, &stat_caller_part_cpu_ns);
    /* A worker that has not started its part by now is asleep (its wake-up is on its way) or
     * descheduled: the caller runs that part itself, which ends the job no later than waiting
     * would (the worker would still have the whole part to run). The chunk and the id are the
     * part's own, so every result is the same. */
    for (int id = 1; id <= p->n_threads && !take_over_off; id++) {
        if (!claim_part(p, id, gen)) continue;
        if (id < parts) atomic_fetch_add_explicit(&stat_taken_over, 1, memory_order_relaxed);
        run_claimed_part(p, id, &stat_caller_part_ns, &stat_caller_part_cpu_ns);
        atomic_fetch_sub(&p->pending, 1);
    }

    static spinner caller_spin = {.budget_ns = SPIN_MIN_NS}; /* callers hold dispatch_lock */
    const double t_wait = spin_clock();
    bool quick = spin_wait(&caller_spin, &(awaited){.i32 = &p->pending});
    if (!quick) {
        pthread_mutex_lock(&p->lock);
        atomic_store(&p->caller_asleep, true);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->work_done, &p->lock);
        atomic_store(&p->caller_asleep, false);
        pthread_mutex_unlock(&p->lock);
    }
    atomic_fetch_add_explicit(&stat_jobs, 1, memory_order_relaxed);
    if (!quick) atomic_fetch_add_explicit(&stat_caller_sleeps, 1, memory_order_relaxed);
    last_done = spin_clock();
    if (timing_on) {
        last_done_cpu = thread_cpu_clock();
        last_cpu_thread = pthread_self();
        last_cpu_pid = getpid();
    }
    atomic_fetch_add_explicit(&stat_caller_wait_ns, (uint64_t)(last_done - t_wait),
                              memory_order_relaxed);
    if (fs) {
        fs->jobs++;
        fs->caller_part_ns += own_ns;
        fs->wait_ns += (uint64_t)(last_done - t_wait);
    }
    pthread_mutex_unlock(&dispatch_lock);
}

/* ---- BLAS threads ----------------------------------------------------------------------------
 * OpenBLAS's kernels follow corefit's instruction set (src/tensor/isa.c). Its threads are held
 * to one from load: corefit owns the threading of every kernel it calls (its pool splits work
 * over the batch; a BLAS call inside a pool job must not start threads of its own), whatever the
 * program does or does not call, in one process, fork workers and MPI. It lives here, beside the
 * thread settings, so that every program using corefit's kernels links it (and its constructor)
 * in. */
__attribute__((constructor)) static void hold_blas_to_one_thread(void) {
    openblas_set_num_threads(1);
}

/* ---- room for OpenBLAS's work buffers -----------------------------------------------------
 * OpenBLAS (0.3.21 as Debian builds it) takes a work buffer from a pool of its own for each BLAS
 * call in flight, and maps a new one (128 MiB and a page) when every buffer is in use; when that
 * mapping fails (an address-space limit, vm.overcommit_memory=2) it retries for ever, at full
 * CPU, holding its lock. The buffers stay in the pool for the life of the process (and of its
 * forks). cf_blas_reserve checks the room with a mapping of the same kind, released at once, and
 * only then has OpenBLAS fill its pool: afterwards BLAS calls on that many threads map nothing. */
extern void *blas_memory_alloc(int procpos) __attribute__((weak));
extern void blas_memory_free(void *buffer) __attribute__((weak));

#define CF_BLAS_BUFFER_BYTES (((size_t)128 << 20) + 4096)
#define CF_BLAS_MAX_RESERVED 64 /* below the pool's own size (NUM_BUFFERS) */

static pthread_mutex_t reserve_lock = PTHREAD_MUTEX_INITIALIZER;
static int blas_reserved; /* buffers known to be in OpenBLAS's pool */

cf_status cf_blas_reserve(int concurrent) {
    if (concurrent < 1) concurrent = 1;
    if (concurrent > CF_BLAS_MAX_RESERVED) concurrent = CF_BLAS_MAX_RESERVED;
    if (!blas_memory_alloc || !blas_memory_free) return CF_OK; /* not OpenBLAS's pool */
    pthread_mutex_lock(&reserve_lock);
    if (concurrent <= blas_reserved) {
        pthread_mutex_unlock(&reserve_lock);
        return CF_OK;
    }
    const size_t bytes = (size_t)(concurrent - blas_reserved) * CF_BLAS_BUFFER_BYTES;
    void *room = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (room == MAP_FAILED) {
        const int err = errno;
        pthread_mutex_unlock(&reserve_lock);
        struct rlimit as;
        char limit[96] = "no address-space limit: vm.overcommit_memory=2 or the machine's memory";
        if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
            snprintf(limit, sizeof limit, "the address-space limit (ulimit -v) is %.0f MB",
                     (double)as.rlim_cur / 1e6);
        return cf_fail(CF_ERR_NOMEM,
                       "out of memory: no room for OpenBLAS's work buffers (%.0f MB for %d "
                       "thread%s: %s; %s; fewer --threads need less)",
                       (double)bytes / 1e6, concurrent - blas_reserved,
                       concurrent - blas_reserved == 1 ? "" : "s", strerror(err), limit);
    }
    munmap(room, bytes);
    void *held[CF_BLAS_MAX_RESERVED];
    for (int i = 0; i < concurrent; i++) held[i] = blas_memory_alloc(0);
    for (int i = 0; i < concurrent; i++) blas_memory_free(held[i]);
    blas_reserved = concurrent;
    pthread_mutex_unlock(&reserve_lock);
    return CF_OK;
}

const char *cf_blas_core(void) {
    return openblas_get_corename();
}

double cf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
