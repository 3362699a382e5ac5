/* A persistent thread pool for cf_parallel_for, started lazily and forgotten after fork (the
 * child has none of the parent's threads; it starts its own pool when it first needs one). */
#include "corefit/core.h"

#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "core/spin.h"

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
        cf_spin_pause();
    }
}

static bool spin_until_zero(_Atomic int *v) {
    const double start = spin_clock();
    for (int i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) == 0) return true;
        if ((i & 63) == 63 && spin_clock() - start > SPIN_NS) return false;
        cf_spin_pause();
    }
}

/* CF_TIMING=1's report at exit (stop_pool): jobs dispatched, how often a worker blocked on the
 * condition variable after its spin (its next job then waits for it to be woken), how often the
 * caller's spin ran out waiting for the workers, and its seconds waiting after its own part. */
static _Atomic uint64_t stat_jobs, stat_worker_sleeps, stat_caller_sleeps, stat_caller_wait_ns;

static void *worker_main(void *arg) {
    int id = (int)(intptr_t)arg; /* 1..n_threads */
    uint64_t seen = 0;
    pool *p = &the_pool;
    for (;;) {
        spin_until_changed_u64(&p->generation, seen);
        pthread_mutex_lock(&p->lock);
        if (!p->stopping && p->generation == seen)
            atomic_fetch_add_explicit(&stat_worker_sleeps, 1, memory_order_relaxed);
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
    const char *timing = getenv("CF_TIMING");
    if (timing && strcmp(timing, "1") == 0 && atomic_load(&stat_jobs))
        fprintf(stderr,
                "timing: thread pool (%d threads): %llu jobs, %llu worker sleeps, %llu caller "
                "waits past the spin, the caller waited %.3f s after its own part\n",
                p->n_threads + 1, (unsigned long long)atomic_load(&stat_jobs),
                (unsigned long long)atomic_load(&stat_worker_sleeps),
                (unsigned long long)atomic_load(&stat_caller_sleeps),
                (double)atomic_load(&stat_caller_wait_ns) * 1e-9);
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

    const double t_wait = spin_clock();
    bool quick = spin_until_zero(&p->pending);
    pthread_mutex_lock(&p->lock);
    while (p->pending > 0) pthread_cond_wait(&p->work_done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    atomic_fetch_add_explicit(&stat_jobs, 1, memory_order_relaxed);
    if (!quick) atomic_fetch_add_explicit(&stat_caller_sleeps, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&stat_caller_wait_ns, (uint64_t)(spin_clock() - t_wait),
                              memory_order_relaxed);
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
