/* A persistent thread pool for cf_parallel_for, started lazily and forgotten after fork (the
 * child has none of the parent's threads; it starts its own pool when it first needs one). */
#include "corefit/core.h"

#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CF_MAX_THREADS 256

typedef struct pool {
    pthread_mutex_t lock;
    pthread_cond_t work_ready;
    pthread_cond_t work_done;
    pthread_t threads[CF_MAX_THREADS];
    int n_threads;               /* workers started (excluding the caller) */
    _Atomic uint64_t generation; /* bumped for each job (under lock) */
    _Atomic int pending;         /* workers still running the current job (under lock) */
    bool stopping;
    /* the current job */
    cf_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;
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
 * a millisecond: waking a thread blocked on a condition variable costs tens of microseconds each
 * time. So a worker that has finished a job, and the caller waiting for the workers, first spin
 * for a short while (SPIN_NS) on the atomic counters, then block. The spin is bounded, so idle
 * pools and machines shared with other work lose little CPU to it. */
#define SPIN_NS 50000

static double spin_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

/* Spins until *v != value (true) or SPIN_NS pass (false). */
static bool spin_until_changed_u64(_Atomic uint64_t *v, uint64_t value) {
    const double start = spin_clock();
    for (int i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) != value) return true;
        if ((i & 63) == 63 && spin_clock() - start > SPIN_NS) return false;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

static bool spin_until_zero(_Atomic int *v) {
    const double start = spin_clock();
    for (int i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) == 0) return true;
        if ((i & 63) == 63 && spin_clock() - start > SPIN_NS) return false;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

static void *worker_main(void *arg) {
    int id = (int)(intptr_t)arg; /* 1..n_threads */
    uint64_t seen = 0;
    pool *p = &the_pool;
    for (;;) {
        spin_until_changed_u64(&p->generation, seen);
        pthread_mutex_lock(&p->lock);
        while (!p->stopping && p->generation == seen) pthread_cond_wait(&p->work_ready, &p->lock);
        if (p->stopping) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        seen = p->generation;
        cf_range_fn fn = p->fn;
        void *ctx = p->ctx;
        int64_t n = p->n;
        int parts = p->parts;
        pthread_mutex_unlock(&p->lock);
        if (id < parts) {
            int64_t b, e;
            chunk(n, parts, id, &b, &e);
            if (b < e) fn(ctx, b, e, id);
        }
        pthread_mutex_lock(&p->lock);
        if (--p->pending == 0) pthread_cond_signal(&p->work_done);
        pthread_mutex_unlock(&p->lock);
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
    the_pool.stopping = false;
}

static void stop_pool(void) {
    pool *p = &the_pool;
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_cond_broadcast(&p->work_ready);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    p->n_threads = 0;
    p->stopping = false;
}

static void register_atfork(void) {
    pthread_atfork(NULL, NULL, after_fork_in_child);
    atexit(stop_pool);
}

static void ensure_workers(int wanted) {
    pool *p = &the_pool;
    while (p->n_threads < wanted) {
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
    pthread_mutex_lock(&p->lock);
    ensure_workers(parts - 1);
    if (parts - 1 > p->n_threads) parts = p->n_threads + 1;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->parts = parts;
    p->pending = p->n_threads;
    p->generation++;
    pthread_cond_broadcast(&p->work_ready);
    pthread_mutex_unlock(&p->lock);

    int64_t b, e;
    chunk(n, parts, 0, &b, &e);
    if (b < e) fn(ctx, b, e, 0);

    spin_until_zero(&p->pending);
    pthread_mutex_lock(&p->lock);
    while (p->pending > 0) pthread_cond_wait(&p->work_done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&dispatch_lock);
}

/* ---- BLAS kernels ----------------------------------------------------------------------------
 * Debian's OpenBLAS (0.3.21, a DYNAMIC_ARCH build) picks its kernels from the CPU model when it
 * loads. On CPUs newer than the release (some Xeons with AVX-512) it falls back to its generic
 * "Prescott" kernels and runs SGEMM at a fifth of the speed. When that happens, and the user has
 * not chosen a core with OPENBLAS_CORETYPE, corefit asks OpenBLAS to select again for the
 * instruction set the CPU reports, through OpenBLAS's own dynamic-arch entry points.
 * It lives here, beside the thread settings, so that every program using corefit's kernels
 * links it (and its constructor) in. */

/* Exported by DYNAMIC_ARCH builds of OpenBLAS; absent (NULL) elsewhere. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static const char *better_core(void) {
#if !defined(__x86_64__)
    return NULL; /* OpenBLAS's own choice stands on other architectures */
#else
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
#endif
}

static bool generic_core(const char *name) {
    static const char *const generic[] = {"Prescott",  "Core2",  "Nehalem", "Katmai",
                                          "Northwood", "Banias", "Generic"};
    for (size_t i = 0; i < sizeof generic / sizeof *generic; i++)
        if (name && strcmp(name, generic[i]) == 0) return true;
    return false;
}

/* Also holds OpenBLAS to one thread from load: corefit owns the threading of every kernel it
 * calls (its pool splits work over the batch; a BLAS call inside a pool job must not start threads
 * of its own), whatever the program does or does not call, in one process, fork workers and MPI. */
__attribute__((constructor)) static void select_blas_kernels(void) {
    openblas_set_num_threads(1);
    if (getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
    const char *core = better_core();
    if (!core || !generic_core(openblas_get_corename())) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE"); /* leave the environment as the user had it */
}

const char *cf_blas_core(void) {
    return openblas_get_corename();
}

double cf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
