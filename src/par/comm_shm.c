/* The shared-memory communicator of forked workers.
 *
 * One anonymous MAP_SHARED region, mapped by the supervisor before fork (nothing named, so
 * nothing can be left behind): a header with the barrier and the abort flag, one control block
 * per rank (heartbeat, collective descriptor, outcome), nranks + 1 data slots, and the results
 * area.
 *
 * Data movement follows one rule that makes two barriers per chunk enough: a rank writes its
 * own slot before the first barrier; slots are read by others only between the two barriers;
 * the result slot is written only between them and read after the second, before the next
 * collective's first barrier. All-reduce: every rank copies its chunk into its slot; barrier;
 * rank r reduces its 64-byte-aligned slice over all slots in rank order 0, 1, 2, ... into the
 * result slot; barrier; every rank copies the result out. The sum is thus the serial sum in
 * rank order, bitwise the same every run and on every rank.
 *
 * The barrier is a counter and a generation word: wait by spinning briefly, then yielding, then
 * sleeping on a futex (10 ms at a time), so more workers than cores still progress. Every slow
 * wait checks the abort flag, that the supervisor is alive, and that no awaited peer has already
 * finished, and gives up after twice the deadline even if the supervisor never acts. */
#include "par_internal.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/pool.h"
#include "core/spin.h"

#define CF_SHM_MAGIC 0x63667368u /* "cfsh" */
#define REDUCE_BLOCK 2048        /* elements per reduction block (stays in L1) */

uint64_t cf_shm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

const char *cf_shm_op_name(uint32_t op) {
    switch (op) {
    case CF_OP_ALLREDUCE_SUM_F32:
        return "allreduce_sum_f32";
    case CF_OP_ALLREDUCE_MEAN_F32:
        return "allreduce_mean_f32";
    case CF_OP_ALLREDUCE_SUM_F64:
        return "allreduce_sum_f64";
    case CF_OP_BROADCAST:
        return "broadcast";
    case CF_OP_GATHER:
        return "gather";
    case CF_OP_BARRIER:
        return "barrier";
    case CF_OP_ANY:
        return "any";
    }
    return "none";
}

static size_t round_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

cf_status cf_shm_region_create(int nranks, size_t slot_bytes, size_t results_bytes,
                               double deadline_s, cf_shm_header **out) {
    *out = NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    slot_bytes = round_up(slot_bytes < CF_SHM_LINE ? CF_SHM_LINE : slot_bytes, CF_SHM_LINE);
    size_t ranks_offset = round_up(sizeof(cf_shm_header), CF_SHM_LINE);
    size_t slots_offset = round_up(ranks_offset + (size_t)nranks * sizeof(cf_shm_rank), page);
    if (slot_bytes > (SIZE_MAX / 4) / ((size_t)nranks + 1))
        return cf_fail(CF_ERR_NOMEM, "shared memory: %d slots of %zu bytes is too much", nranks + 1,
                       slot_bytes);
    size_t results_offset = round_up(slots_offset + ((size_t)nranks + 1) * slot_bytes, page);
    if (results_bytes > SIZE_MAX / 4)
        return cf_fail(CF_ERR_NOMEM, "shared memory: results area of %zu bytes is too large",
                       results_bytes);
    size_t total = results_offset + round_up(results_bytes, page);
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return cf_fail(CF_ERR_NOMEM, "shared memory: mmap of %zu bytes failed: %s", total,
                       strerror(errno));
    /* Fresh anonymous pages are zero: atomics start at 0, states at RUNNING. */
    cf_shm_header *h = p;
    h->magic = CF_SHM_MAGIC;
    h->nranks = nranks;
    h->supervisor_pid = (int32_t)getpid();
    h->cores = cf_available_cores();
    h->deadline_s = deadline_s;
    h->slot_bytes = slot_bytes;
    h->ranks_offset = ranks_offset;
    h->slots_offset = slots_offset;
    h->results_offset = results_offset;
    h->results_bytes = results_bytes;
    h->total_bytes = total;
    uint64_t now = cf_shm_now_ns();
    for (int r = 0; r < nranks; r++) atomic_store(&cf_shm_rank_at(h, r)->heartbeat_ns, now);
    *out = h;
    return CF_OK;
}

void cf_shm_region_destroy(cf_shm_header *hdr) {
    if (hdr) munmap(hdr, hdr->total_bytes);
}

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts) {
    /* Not FUTEX_PRIVATE: the word is shared between processes. */
    return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

void cf_shm_abort(cf_shm_header *hdr) {
    atomic_store(&hdr->abort_flag, 1);
    atomic_fetch_add(&hdr->bar_gen, 0); /* order the flag before the wake */
    futex(&hdr->bar_gen, FUTEX_WAKE, INT_MAX, NULL);
}

static inline cf_shm_comm *shm(cf_comm *c) {
    return (cf_shm_comm *)c;
}
static inline cf_shm_rank *me(cf_shm_comm *c) {
    return &c->ranks[c->base.rank];
}
static inline char *slot(cf_shm_comm *c, int r) {
    return c->slots + (size_t)r * c->hdr->slot_bytes;
}
static inline char *result_slot(cf_shm_comm *c) {
    return slot(c, c->base.size);
}

static void shm_heartbeat(cf_comm *comm) {
    cf_shm_comm *c = shm(comm);
    atomic_store_explicit(&me(c)->heartbeat_ns, cf_shm_now_ns(), memory_order_relaxed);
}

/* Lists the ranks that have not yet arrived at barrier number `arrival` into buf. Returns how
 * many; sets *finished to one of them that has already left the group (or -1). */
static int missing_peers(cf_shm_comm *c, uint64_t arrival, char *buf, size_t cap, int *finished) {
    int count = 0;
    size_t at = 0;
    *finished = -1;
    if (cap) buf[0] = '\0';
    for (int r = 0; r < c->base.size; r++) {
        if (atomic_load(&c->ranks[r].arrived) >= arrival) continue;
        if (atomic_load(&c->ranks[r].state) != CF_SHM_RUNNING) *finished = r;
        if (at < cap) {
            int w = snprintf(buf + at, cap - at, "%s%d", count ? ", " : "", r);
            if (w > 0) at += (size_t)w;
        }
        count++;
    }
    return count;
}

/* The slow part of a barrier wait: yields, then futex sleeps with the checks. */
static cf_status wait_slow(cf_shm_comm *c, uint32_t gen, uint64_t arrival, const char *what) {
    cf_shm_header *h = c->hdr;
    cf_shm_rank *m = me(c);
    /* Waiting from here on, yields included: on a busy machine a yield can take a whole time
     * slice, and a rank that waits must not look silent outside a collective (the supervisor
     * would blame it instead of the peer it waits for). */
    uint64_t start = cf_shm_now_ns();
    atomic_store(&m->wait_since_ns, start);
    uint64_t give_up_ns = (uint64_t)(2.0 * h->deadline_s * 1e9) + 1000000000u;
    uint64_t last_look = start;
    for (int i = 0;; i++) {
        if (atomic_load_explicit(&h->bar_gen, memory_order_acquire) != gen) break;
        if (atomic_load_explicit(&h->abort_flag, memory_order_relaxed)) {
            atomic_store(&m->wait_since_ns, 0);
            return cf_fail(CF_ERR_WORKER, "%s: the group was aborted (another worker failed)",
                           what);
        }
        if (i < c->yields) {
            sched_yield();
            continue;
        }
        uint64_t now = cf_shm_now_ns();
        /* Naps are 10 ms: a look a second after the last means this process was stopped (the
         * group was paused); the pause is not waiting time. */
        if (now - last_look > 1000000000u) start += now - last_look;
        last_look = now;
        if (getppid() != h->supervisor_pid) {
            atomic_store(&m->wait_since_ns, 0);
            return cf_fail(CF_ERR_WORKER, "%s: the supervisor (pid %d) is gone", what,
                           (int)h->supervisor_pid);
        }
        char who[128];
        int finished;
        int missing = missing_peers(c, arrival, who, sizeof who, &finished);
        if (missing && finished >= 0) {
            atomic_store(&m->wait_since_ns, 0);
            m->blame = finished + 1;
            return cf_fail(CF_ERR_WORKER,
                           "%s: worker %d finished without joining this collective (#%llu)", what,
                           finished, (unsigned long long)c->seq);
        }
        if (now - start > give_up_ns) {
            atomic_store(&m->wait_since_ns, 0);
            return cf_fail(CF_ERR_WORKER, "%s: waited %.1f s for worker %s", what,
                           (double)(now - start) * 1e-9, who);
        }
        atomic_fetch_add(&h->bar_sleepers, 1);
        c->naps++;
        if (atomic_load(&h->bar_gen) == gen) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            futex(&h->bar_gen, FUTEX_WAIT, gen, &ts);
        }
        atomic_fetch_sub(&h->bar_sleepers, 1);
    }
    /* Progress first, then out of the wait: never silent-looking in between. */
    atomic_store(&m->heartbeat_ns, cf_shm_now_ns());
    atomic_store(&m->wait_since_ns, 0);
    return CF_OK;
}

static cf_status barrier_wait(cf_shm_comm *c, const char *what);

/* A barrier, counted and timed for CF_TIMING's report (a clock read on each side: tens of ns). */
static cf_status shm_barrier_wait(cf_shm_comm *c, const char *what) {
    uint64_t t0 = cf_shm_now_ns();
    cf_status st = barrier_wait(c, what);
    c->wait_ns += cf_shm_now_ns() - t0;
    c->barriers++;
    return st;
}

static cf_status barrier_wait(cf_shm_comm *c, const char *what) {
    cf_shm_header *h = c->hdr;
    cf_shm_rank *m = me(c);
    /* Read the generation before arriving: it cannot move until every rank (this one too) has
     * arrived. */
    uint32_t gen = atomic_load_explicit(&h->bar_gen, memory_order_acquire);
    uint64_t arrival = atomic_load_explicit(&m->arrived, memory_order_relaxed) + 1;
    atomic_store_explicit(&m->arrived, arrival, memory_order_relaxed);
    uint32_t pos = atomic_fetch_add_explicit(&h->bar_count, 1, memory_order_acq_rel);
    if (pos + 1 == (uint32_t)c->base.size) {
        atomic_store_explicit(&h->bar_count, 0, memory_order_relaxed);
        atomic_store(&h->bar_gen, gen + 1); /* seq_cst: pairs with the sleepers count */
        if (atomic_load(&h->bar_sleepers)) futex(&h->bar_gen, FUTEX_WAKE, INT_MAX, NULL);
        return CF_OK;
    }
    if (c->spin_ns > 0 && !cf__machine_crowded()) {
        /* every worker has a core and the machine is not crowded: spin long enough to cover
         * the usual difference between the workers' compute before a collective */
        const uint64_t start = cf_shm_now_ns();
        for (int i = 0;; i++) {
            if (atomic_load_explicit(&h->bar_gen, memory_order_acquire) != gen) return CF_OK;
            if (atomic_load_explicit(&h->abort_flag, memory_order_relaxed)) break;
            if ((i & 63) == 63 && (double)(cf_shm_now_ns() - start) > c->spin_ns) break;
            cf_spin_pause();
        }
    } else {
        for (int i = 0; i < c->spin; i++) {
            if (atomic_load_explicit(&h->bar_gen, memory_order_acquire) != gen) return CF_OK;
            if (atomic_load_explicit(&h->abort_flag, memory_order_relaxed)) break;
            cf_spin_pause();
        }
    }
    c->slow_waits++;
    return wait_slow(c, gen, arrival, what);
}

/* Publishes this rank's collective and marks progress. */
static void begin_op(cf_shm_comm *c, uint32_t op, size_t count, int root) {
    cf_shm_rank *m = me(c);
    atomic_store_explicit(&m->op_seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&m->op, op, memory_order_relaxed);
    atomic_store_explicit(&m->op_count, (uint64_t)count, memory_order_relaxed);
    atomic_store_explicit(&m->root, root, memory_order_relaxed);
    atomic_store_explicit(&m->op_seq, ++c->seq, memory_order_release);
    atomic_store_explicit(&m->heartbeat_ns, cf_shm_now_ns(), memory_order_relaxed);
}

static void end_op(cf_shm_comm *c) {
    atomic_store_explicit(&me(c)->heartbeat_ns, cf_shm_now_ns(), memory_order_relaxed);
}

/* After the first barrier of a collective: every rank still on the same collective must have
 * called the same thing. (A rank already past it has checked against the same data.) */
static cf_status check_op(cf_shm_comm *c) {
    cf_shm_rank *m = me(c);
    uint32_t my_op = atomic_load_explicit(&m->op, memory_order_relaxed);
    uint64_t my_count = atomic_load_explicit(&m->op_count, memory_order_relaxed);
    int32_t my_root = atomic_load_explicit(&m->root, memory_order_relaxed);
    for (int r = 0; r < c->base.size; r++) {
        cf_shm_rank *p = &c->ranks[r];
        if (r == c->base.rank || atomic_load_explicit(&p->op_seq, memory_order_acquire) != c->seq)
            continue;
        uint32_t op = atomic_load_explicit(&p->op, memory_order_relaxed);
        uint64_t count = atomic_load_explicit(&p->op_count, memory_order_relaxed);
        int32_t root = atomic_load_explicit(&p->root, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->op_seq, memory_order_relaxed) != c->seq)
            continue; /* it moved on meanwhile: it passed this check */
        if (op != my_op || count != my_count || root != my_root)
            return cf_fail(CF_ERR_WORKER,
                           "collective mismatch at #%llu: worker %d called %s(count %llu, root "
                           "%d) but worker %d called %s(count %llu, root %d)",
                           (unsigned long long)c->seq, c->base.rank, cf_shm_op_name(my_op),
                           (unsigned long long)my_count, (int)my_root, r, cf_shm_op_name(op),
                           (unsigned long long)count, (int)root);
    }
    return CF_OK;
}

/* The first barrier of a collective, with the mismatch check on its first chunk. */
static cf_status first_barrier(cf_shm_comm *c, const char *what, bool check) {
    cf_status st = shm_barrier_wait(c, what);
    if (st == CF_OK && check) st = check_op(c);
    return st;
}

/* Rank r's share [lo, hi) of n elements of esz bytes, cut at 64-byte boundaries. */
static void my_slice(size_t n, size_t esz, int rank, int size, size_t *lo, size_t *hi) {
    size_t per_line = CF_SHM_LINE / esz;
    size_t lines = (n + per_line - 1) / per_line;
    size_t base = lines / (size_t)size, extra = lines % (size_t)size, r = (size_t)rank;
    size_t first = r * base + (r < extra ? r : extra);
    size_t count = base + (r < extra ? 1 : 0);
    *lo = first * per_line < n ? first * per_line : n;
    *hi = (first + count) * per_line < n ? (first + count) * per_line : n;
}

static void reduce_f32(float *restrict out, float *const *src, int nsrc, size_t lo, size_t hi,
                       bool mean) {
    float div = (float)nsrc;
    for (size_t b = lo; b < hi; b += REDUCE_BLOCK) {
        size_t e = b + REDUCE_BLOCK < hi ? b + REDUCE_BLOCK : hi;
        const float *restrict s0 = src[0], *restrict s1 = nsrc > 1 ? src[1] : NULL;
        if (s1)
            for (size_t i = b; i < e; i++) out[i] = s0[i] + s1[i];
        else
            for (size_t i = b; i < e; i++) out[i] = s0[i];
        for (int r = 2; r < nsrc; r++) {
            const float *restrict s = src[r];
            for (size_t i = b; i < e; i++) out[i] += s[i];
        }
        if (mean)
            for (size_t i = b; i < e; i++) out[i] /= div;
    }
}

static void reduce_f64(double *restrict out, double *const *src, int nsrc, size_t lo, size_t hi) {
    for (size_t b = lo; b < hi; b += REDUCE_BLOCK) {
        size_t e = b + REDUCE_BLOCK < hi ? b + REDUCE_BLOCK : hi;
        const double *restrict s0 = src[0], *restrict s1 = nsrc > 1 ? src[1] : NULL;
        if (s1)
            for (size_t i = b; i < e; i++) out[i] = s0[i] + s1[i];
        else
            for (size_t i = b; i < e; i++) out[i] = s0[i];
        for (int r = 2; r < nsrc; r++) {
            const double *restrict s = src[r];
            for (size_t i = b; i < e; i++) out[i] += s[i];
        }
    }
}

#define CF_SHM_MAX_STACK_RANKS 256

/* dst = src * by over n floats (a plain copy when by is 1). */
static void copy_scaled_f32(float *restrict dst, const float *restrict src, size_t n, float by) {
    if (by == 1.0f) {
        memcpy(dst, src, n * sizeof *dst);
        return;
    }
    for (size_t i = 0; i < n; i++) dst[i] = src[i] * by;
}

/* pre and post (float sums only; 1 otherwise) scale this rank's values on their way into its
 * slot and the result on its way out: the same products as separate passes over buf, without
 * the two extra trips through memory. */
static cf_status shm_allreduce(cf_shm_comm *c, void *buf, size_t n, size_t esz, uint32_t op,
                               float pre, float post) {
    const char *what = cf_shm_op_name(op);
    int size = c->base.size, rank = c->base.rank;
    begin_op(c, op, n, 0);
    size_t chunk = c->hdr->slot_bytes / esz;
    void *srcs[CF_SHM_MAX_STACK_RANKS];
    for (int r = 0; r < size; r++) srcs[r] = slot(c, r);
    char *res = result_slot(c);
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        if (esz == sizeof(float))
            copy_scaled_f32((float *)slot(c, rank), (const float *)buf + off, m, pre);
        else
            memcpy(slot(c, rank), (char *)buf + off * esz, m * esz);
        cf_status st = first_barrier(c, what, off == 0);
        if (st != CF_OK) return st;
        size_t lo, hi;
        my_slice(m, esz, rank, size, &lo, &hi);
        if (lo < hi) {
            if (esz == sizeof(float))
                reduce_f32((float *)res, (float *const *)srcs, size, lo, hi,
                           op == CF_OP_ALLREDUCE_MEAN_F32);
            else
                reduce_f64((double *)res, (double *const *)srcs, size, lo, hi);
        }
        st = shm_barrier_wait(c, what);
        if (st != CF_OK) return st;
        if (esz == sizeof(float))
            copy_scaled_f32((float *)buf + off, (const float *)res, m, post);
        else
            memcpy((char *)buf + off * esz, res, m * esz);
    }
    end_op(c);
    return CF_OK;
}

static cf_status shm_allreduce_f32(cf_comm *comm, float *buf, size_t n, bool mean) {
    return shm_allreduce(shm(comm), buf, n, sizeof(float),
                         mean ? CF_OP_ALLREDUCE_MEAN_F32 : CF_OP_ALLREDUCE_SUM_F32, 1.0f, 1.0f);
}

/* A scaled sum is a sum to the other ranks (the mismatch check compares the operation). */
static cf_status shm_allreduce_scaled_f32(cf_comm *comm, float *buf, size_t n, float pre,
                                          float post) {
    return shm_allreduce(shm(comm), buf, n, sizeof(float), CF_OP_ALLREDUCE_SUM_F32, pre, post);
}

static cf_status shm_allreduce_f64(cf_comm *comm, double *buf, size_t n) {
    return shm_allreduce(shm(comm), buf, n, sizeof(double), CF_OP_ALLREDUCE_SUM_F64, 1.0f, 1.0f);
}

static cf_status shm_broadcast(cf_comm *comm, void *buf, size_t bytes, int root) {
    cf_shm_comm *c = shm(comm);
    const char *what = "broadcast";
    begin_op(c, CF_OP_BROADCAST, bytes, root);
    size_t chunk = c->hdr->slot_bytes;
    bool is_root = c->base.rank == root;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t m = bytes - off < chunk ? bytes - off : chunk;
        if (is_root) memcpy(slot(c, root), (char *)buf + off, m);
        cf_status st = first_barrier(c, what, off == 0);
        if (st != CF_OK) return st;
        if (!is_root) memcpy((char *)buf + off, slot(c, root), m);
        st = shm_barrier_wait(c, what);
        if (st != CF_OK) return st;
    }
    end_op(c);
    return CF_OK;
}

static cf_status shm_gather(cf_comm *comm, const void *send, size_t bytes, void *recv, int root) {
    cf_shm_comm *c = shm(comm);
    const char *what = "gather";
    int size = c->base.size, rank = c->base.rank;
    begin_op(c, CF_OP_GATHER, bytes, root);
    size_t chunk = c->hdr->slot_bytes;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t m = bytes - off < chunk ? bytes - off : chunk;
        memcpy(slot(c, rank), (const char *)send + off, m);
        cf_status st = first_barrier(c, what, off == 0);
        if (st != CF_OK) return st;
        if (rank == root)
            for (int r = 0; r < size; r++)
                memcpy((char *)recv + (size_t)r * bytes + off, slot(c, r), m);
        st = shm_barrier_wait(c, what);
        if (st != CF_OK) return st;
    }
    end_op(c);
    return CF_OK;
}

static cf_status shm_barrier(cf_comm *comm) {
    cf_shm_comm *c = shm(comm);
    begin_op(c, CF_OP_BARRIER, 0, 0);
    cf_status st = first_barrier(c, "barrier", true);
    if (st == CF_OK) end_op(c);
    return st;
}

static cf_status shm_any(cf_comm *comm, bool flag, bool *any) {
    cf_shm_comm *c = shm(comm);
    const char *what = "any";
    begin_op(c, CF_OP_ANY, 1, 0);
    *(volatile char *)slot(c, c->base.rank) = flag ? 1 : 0;
    cf_status st = first_barrier(c, what, true);
    if (st != CF_OK) return st;
    bool result = false;
    for (int r = 0; r < c->base.size; r++) result |= *(volatile char *)slot(c, r) != 0;
    st = shm_barrier_wait(c, what);
    if (st != CF_OK) return st;
    *any = result;
    end_op(c);
    return CF_OK;
}

static void *shm_results(cf_comm *comm, size_t *bytes) {
    cf_shm_header *h = shm(comm)->hdr;
    if (bytes) *bytes = h->results_bytes;
    return h->results_bytes ? (char *)h + h->results_offset : NULL;
}

static const cf_comm_ops shm_ops = {
    .name = "shm",
    .allreduce_f32 = shm_allreduce_f32,
    .allreduce_sum_f64 = shm_allreduce_f64,
    .broadcast = shm_broadcast,
    .gather = shm_gather,
    .barrier = shm_barrier,
    .any = shm_any,
    .heartbeat = shm_heartbeat,
    .results = shm_results,
    .free = NULL, /* owned by the launcher */
    .allreduce_scaled_f32 = shm_allreduce_scaled_f32,
};

void cf_shm_comm_init(cf_shm_comm *c, cf_shm_header *hdr, int rank) {
    memset(c, 0, sizeof *c);
    c->base.ops = &shm_ops;
    c->base.rank = c->base.local_rank = rank;
    c->base.size = c->base.local_size = hdr->nranks;
    c->hdr = hdr;
    c->ranks = cf_shm_rank_at(hdr, 0);
    c->slots = (char *)hdr + hdr->slots_offset;
    /* Spin only when every worker can have a core and the machine is not crowded with other
     * work (checked at each wait, core/pool.h); otherwise a spinning waiter steals the time
     * slice of the rank it waits for. The 500 us cover the difference between the workers'
     * compute before the gradients' all-reduce on an idle machine (a few percent of a step). */
    bool roomy = hdr->nranks <= hdr->cores;
    c->spin = 50;
    c->spin_ns = roomy ? 500e3 : 0;
    c->yields = roomy ? 50 : 200;
}
