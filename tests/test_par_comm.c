/* par layer: communicator collectives over the single and shared-memory backends.
 *
 * Workers run in forked children, where cmocka's asserts must not be used: they check what
 * they can and return cf_fail(...) with the details, which the supervisor reports as "worker r
 * failed: ..."; what crosses ranks (all-reduce results) comes home in the results area and is
 * checked here against the serial sum in rank order, recomputed from the same seeds. */
#include "oracle.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "corefit/par.h"
#include "par_time.h"

/* Small slots (256 floats) so that most sizes below take several chunks. */
#define SLOT_BYTES 1024
static const size_t sizes[] = {1, 3, 17, 255, 256, 257, 1000, 4099, 20000};
#define N_SIZES (sizeof sizes / sizeof sizes[0])
#define MAX_RANKS 4

static size_t total_elems(void) {
    size_t t = 0;
    for (size_t i = 0; i < N_SIZES; i++) t += sizes[i];
    return t;
}

/* Values with widely varying magnitudes, so that a different summation order would round
 * differently. */
static void make_f32(float *x, size_t n, int rank, size_t which, uint64_t seed) {
    cf_rng rng;
    cf_rng_seed(&rng, seed * 7919u + (uint64_t)rank * 104729u + which);
    for (size_t i = 0; i < n; i++) {
        double u = cf_rng_uniform(&rng) - 0.5;
        x[i] = (float)ldexp(u, (int)cf_rng_below(&rng, 24) - 12);
    }
}

static void make_f64(double *x, size_t n, int rank, size_t which, uint64_t seed) {
    cf_rng rng;
    cf_rng_seed(&rng, seed * 31u + (uint64_t)rank * 1000003u + which + 99);
    for (size_t i = 0; i < n; i++)
        x[i] = ldexp(cf_rng_uniform(&rng) - 0.5, (int)cf_rng_below(&rng, 40) - 20);
}

static unsigned char pattern(int rank, size_t i) {
    return (unsigned char)(rank * 37 + i * 13 + (i >> 8));
}

/* ---- the single communicator ---------------------------------------------------------------- */

static void test_single(void **state) {
    (void)state;
    cf_comm *c = cf_comm_single();
    assert_int_equal(cf_comm_rank(c), 0);
    assert_int_equal(cf_comm_size(c), 1);
    assert_int_equal(cf_comm_local_rank(c), 0);
    assert_string_equal(cf_comm_kind(c), "single");
    float x[3] = {1.5f, -2.0f, 3.25f};
    assert_int_equal(cf_comm_allreduce_sum_f32(c, x, 3), CF_OK);
    assert_int_equal(cf_comm_allreduce_mean_f32(c, x, 3), CF_OK);
    assert_true(x[0] == 1.5f && x[1] == -2.0f && x[2] == 3.25f);
    double d[2] = {1, 2};
    assert_int_equal(cf_comm_allreduce_sum_f64(c, d, 2), CF_OK);
    assert_true(d[0] == 1 && d[1] == 2);
    char send[5] = "abcd", recv[5] = {0};
    assert_int_equal(cf_comm_gather(c, send, 5, recv, 0), CF_OK);
    assert_string_equal(recv, "abcd");
    assert_int_equal(cf_comm_broadcast(c, send, 5, 0), CF_OK);
    assert_int_equal(cf_comm_broadcast(c, send, 5, 1), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "root 1"));
    bool any = true;
    assert_int_equal(cf_comm_any(c, false, &any), CF_OK);
    assert_false(any);
    assert_int_equal(cf_comm_any(c, true, &any), CF_OK);
    assert_true(any);
    assert_int_equal(cf_comm_barrier(c), CF_OK);
    /* Argument errors do not break a world of one. */
    assert_int_equal(cf_comm_allreduce_sum_f32(c, NULL, 3), CF_ERR_INVALID);
    assert_int_equal(cf_comm_barrier(c), CF_OK);
    size_t bytes = 7;
    assert_null(cf_comm_results(c, &bytes));
    assert_int_equal(bytes, 0);
    cf_comm_heartbeat(c);
    cf_comm_free(c); /* no-op */
    assert_int_equal(cf_comm_size(cf_comm_single()), 1);
}

/* ---- collectives over shared memory ------------------------------------------------------------
 */

typedef struct coll_ctx {
    uint64_t seed;
} coll_ctx;

/* Results layout per rank: sum_f32[total] mean_f32[total] sum_f64[total]; ranks one after
 * another. */
static size_t per_rank_bytes(void) {
    return total_elems() * (2 * sizeof(float) + sizeof(double));
}

static cf_status check_bytes(const unsigned char *got, int rank, size_t n, const char *what,
                             int root) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != pattern(rank, i))
            return cf_fail(CF_ERR_INVALID,
                           "%s (root %d): byte %zu of rank %d's data is %d, expected %d", what,
                           root, i, rank, got[i], pattern(rank, i));
    return CF_OK;
}

static cf_status collectives_worker(cf_comm *comm, void *vctx) {
    coll_ctx *ctx = vctx;
    int rank = cf_comm_rank(comm), size = cf_comm_size(comm);
    size_t total = total_elems(), res_bytes;
    char *res = cf_comm_results(comm, &res_bytes);
    if (!res || res_bytes < (size_t)size * per_rank_bytes())
        return cf_fail(CF_ERR_STATE, "results area too small: %zu", res_bytes);
    if (strcmp(cf_comm_kind(comm), "shm") != 0 || cf_comm_local_rank(comm) != rank)
        return cf_fail(CF_ERR_STATE, "unexpected comm kind %s", cf_comm_kind(comm));
    float *sum = (float *)(res + (size_t)rank * per_rank_bytes());
    float *mean = sum + total;
    double *sum64 = (double *)(mean + total);
    cf_status st;

    /* All-reduce (sum, mean, f64) of every size. */
    size_t at = 0;
    for (size_t k = 0; k < N_SIZES; k++) {
        make_f32(sum + at, sizes[k], rank, k, ctx->seed);
        if ((st = cf_comm_allreduce_sum_f32(comm, sum + at, sizes[k])) != CF_OK) return st;
        make_f32(mean + at, sizes[k], rank, k, ctx->seed);
        if ((st = cf_comm_allreduce_mean_f32(comm, mean + at, sizes[k])) != CF_OK) return st;
        make_f64(sum64 + at, sizes[k], rank, k, ctx->seed);
        if ((st = cf_comm_allreduce_sum_f64(comm, sum64 + at, sizes[k])) != CF_OK) return st;
        at += sizes[k];
    }

    /* Broadcast from every root, sizes around and beyond a slot. */
    static const size_t bsizes[] = {1, 1023, 1024, 1025, 9001};
    unsigned char *buf = malloc(9001 * MAX_RANKS);
    if (!buf) return cf_fail(CF_ERR_NOMEM, "test buffer");
    for (int root = 0; root < size; root++)
        for (size_t k = 0; k < sizeof bsizes / sizeof bsizes[0]; k++) {
            size_t n = bsizes[k];
            for (size_t i = 0; i < n; i++) buf[i] = rank == root ? pattern(root, i) : 0xEE;
            if ((st = cf_comm_broadcast(comm, buf, n, root)) != CF_OK) goto out;
            if ((st = check_bytes(buf, root, n, "broadcast", root)) != CF_OK) goto out;
        }

    /* Gather to every root. */
    for (int root = 0; root < size; root++)
        for (size_t k = 0; k < sizeof bsizes / sizeof bsizes[0]; k++) {
            size_t n = bsizes[k];
            unsigned char send[9001];
            for (size_t i = 0; i < n; i++) send[i] = pattern(rank, i);
            memset(buf, 0xEE, 9001 * MAX_RANKS);
            if ((st = cf_comm_gather(comm, send, n, rank == root ? buf : NULL, root)) != CF_OK)
                goto out;
            if (rank == root)
                for (int r = 0; r < size; r++)
                    if ((st = check_bytes(buf + (size_t)r * n, r, n, "gather", root)) != CF_OK)
                        goto out;
        }

    /* Any: nobody, then each rank alone, then everybody. */
    for (int who = -1; who <= size; who++) {
        bool flag = who == size || rank == who, any = !(who >= 0);
        if ((st = cf_comm_any(comm, flag, &any)) != CF_OK) goto out;
        if (any != (who >= 0)) {
            st = cf_fail(CF_ERR_INVALID, "any with flag on rank %d gave %d", who, any);
            goto out;
        }
    }

    /* Barrier: phase p's writes are visible to everybody after barrier p, whatever the order
     * of arrival. The counters sit after the per-rank blocks. */
    _Atomic int *phase = (_Atomic int *)(res + (size_t)size * per_rank_bytes());
    for (int p = 1; p <= 20; p++) {
        if ((p + rank) % 3 == 0) {
            struct timespec ts = {0, 300000};
            nanosleep(&ts, NULL);
        }
        atomic_store(&phase[rank], p);
        if ((st = cf_comm_barrier(comm)) != CF_OK) goto out;
        for (int r = 0; r < size; r++)
            if (atomic_load(&phase[r]) < p) {
                st = cf_fail(CF_ERR_INVALID, "after barrier %d rank %d is at phase %d", p, r,
                             atomic_load(&phase[r]));
                goto out;
            }
        if ((st = cf_comm_barrier(comm)) != CF_OK) goto out;
    }
    st = CF_OK;
out:
    free(buf);
    return st;
}

/* Runs the collectives on `n` workers; returns the results copy (caller frees). */
static char *run_collectives(int n, uint64_t seed) {
    coll_ctx ctx = {.seed = seed};
    cf_launch_options opt = {.num_workers = n,
                             .deadline_s = 20,
                             .comm_bytes = SLOT_BYTES,
                             .results_bytes = (size_t)n * per_rank_bytes() + 4096};
    cf_results res;
    cf_status st = cf_launch_fork(&opt, collectives_worker, &ctx, &res);
    if (st != CF_OK) fail_msg("%d workers: %s", n, cf_last_error());
    assert_non_null(res.data);
    assert_int_equal(res.bytes, opt.results_bytes);
    char *copy = malloc(res.bytes);
    memcpy(copy, res.data, res.bytes);
    cf_results_release(&res);
    assert_null(res.data);
    return copy;
}

static void check_sums(const char *res, int n, uint64_t seed) {
    size_t total = total_elems();
    float *x = malloc(sizeof(float) * 20000), *acc = malloc(sizeof(float) * 20000);
    double *xd = malloc(sizeof(double) * 20000), *accd = malloc(sizeof(double) * 20000);
    size_t at = 0;
    for (size_t k = 0; k < N_SIZES; k++) {
        size_t m = sizes[k];
        /* The serial sum in rank order. */
        make_f32(acc, m, 0, k, seed);
        make_f64(accd, m, 0, k, seed);
        for (int r = 1; r < n; r++) {
            make_f32(x, m, r, k, seed);
            make_f64(xd, m, r, k, seed);
            for (size_t i = 0; i < m; i++) acc[i] += x[i], accd[i] += xd[i];
        }
        for (int r = 0; r < n; r++) {
            const float *sum = (const float *)(res + (size_t)r * per_rank_bytes());
            const float *mean = sum + total;
            const double *sum64 = (const double *)(mean + total);
            for (size_t i = 0; i < m; i++) {
                float want_mean = acc[i] / (float)n;
                if (memcmp(&sum[at + i], &acc[i], sizeof(float)) != 0 ||
                    memcmp(&mean[at + i], &want_mean, sizeof(float)) != 0 ||
                    memcmp(&sum64[at + i], &accd[i], sizeof(double)) != 0)
                    fail_msg("%d workers, size %zu, rank %d, element %zu: sum %.9g (serial %.9g), "
                             "mean %.9g (serial %.9g), f64 %.17g (serial %.17g)",
                             n, m, r, i, sum[at + i], acc[i], mean[at + i], want_mean,
                             sum64[at + i], accd[i]);
            }
        }
        at += m;
    }
    free(x), free(acc), free(xd), free(accd);
}

static void test_collectives_1_to_4_workers(void **state) {
    (void)state;
    for (int n = 1; n <= MAX_RANKS; n++) {
        char *res = run_collectives(n, 1234);
        check_sums(res, n, 1234);
        free(res);
    }
}

/* Same seed, same workers: bitwise the same results, run after run (and the serial sum). */
static void test_allreduce_deterministic(void **state) {
    (void)state;
    int n = 3;
    size_t bytes = (size_t)n * per_rank_bytes();
    char *a = run_collectives(n, 77);
    for (int run = 0; run < 3; run++) {
        char *b = run_collectives(n, 77);
        assert_memory_equal(a, b, bytes);
        free(b);
    }
    check_sums(a, n, 77);
    /* A sum in another order differs somewhere for these values (so the check above means
     * something): reverse rank order over the largest size. */
    size_t m = 20000, at = total_elems() - m;
    float *x = malloc(sizeof(float) * m), *rev = malloc(sizeof(float) * m);
    make_f32(rev, m, n - 1, N_SIZES - 1, 77);
    for (int r = n - 2; r >= 0; r--) {
        make_f32(x, m, r, N_SIZES - 1, 77);
        for (size_t i = 0; i < m; i++) rev[i] += x[i];
    }
    assert_true(memcmp(rev, (const float *)a + at, sizeof(float) * m) != 0);
    free(x), free(rev), free(a);
}

/* ---- the weighted sum of the data-parallel gradient reduction ------------------------------ */

/* Each rank's own weight (rows of its batch: uneven, as in a split fit's last batch) and the
 * common post-factor one over their total; case 1 is the plain sum (both factors 1). */
static float scaled_pre(int rank, int c) {
    return c == 1 ? 1.0f : (float)(64 - 5 * rank) * (c == 2 ? 0.37f : 1.0f);
}
static float scaled_post(int size, int c) {
    if (c == 1) return 1.0f;
    double total = 0;
    for (int r = 0; r < size; r++) total += scaled_pre(r, c);
    return (float)(1.0 / total);
}
#define SCALED_CASES 3

static cf_status scaled_worker(cf_comm *comm, void *vctx) {
    const uint64_t *seed = vctx;
    int rank = cf_comm_rank(comm), size = cf_comm_size(comm);
    size_t total = total_elems(), res_bytes;
    float *res = cf_comm_results(comm, &res_bytes);
    if (!res || res_bytes < (size_t)size * SCALED_CASES * total * sizeof(float))
        return cf_fail(CF_ERR_STATE, "results area too small: %zu", res_bytes);
    float *out = res + (size_t)rank * SCALED_CASES * total;
    for (int c = 0; c < SCALED_CASES; c++)
        for (size_t k = 0, at = 0; k < N_SIZES; at += sizes[k], k++) {
            float *buf = out + (size_t)c * total + at;
            make_f32(buf, sizes[k], rank, k, *seed);
            cf_status st = cf_comm_allreduce_scaled_f32(comm, buf, sizes[k], scaled_pre(rank, c),
                                                        scaled_post(size, c));
            if (st != CF_OK) return st;
        }
    return CF_OK;
}

/* buf = post * sum_r (pre_r * x_r): bitwise the three float passes (scale, the serial sum in
 * rank order, scale), on every rank, at 1 to 4 workers and over several chunks; and the same
 * through the single communicator. */
static void test_allreduce_scaled(void **state) {
    (void)state;
    uint64_t seed = 4242;
    size_t total = total_elems();
    float *x = malloc(sizeof(float) * total), *want = malloc(sizeof(float) * total);
    for (int n = 1; n <= MAX_RANKS; n++) {
        cf_launch_options opt = {.num_workers = n,
                                 .deadline_s = 20,
                                 .comm_bytes = SLOT_BYTES,
                                 .results_bytes = (size_t)n * SCALED_CASES * total * sizeof(float)};
        cf_results res;
        if (cf_launch_fork(&opt, scaled_worker, &seed, &res) != CF_OK)
            fail_msg("%d workers: %s", n, cf_last_error());
        const float *got = res.data;
        for (int c = 0; c < SCALED_CASES; c++) {
            for (size_t k = 0, at = 0; k < N_SIZES; at += sizes[k], k++)
                for (int r = 0; r < n; r++) {
                    make_f32(x + at, sizes[k], r, k, seed);
                    for (size_t i = 0; i < sizes[k]; i++) {
                        float v = x[at + i] * scaled_pre(r, c);
                        want[at + i] = r == 0 ? v : want[at + i] + v;
                    }
                }
            for (size_t i = 0; i < total; i++) want[i] *= scaled_post(n, c);
            for (int r = 0; r < n; r++)
                if (memcmp(got + ((size_t)r * SCALED_CASES + (size_t)c) * total, want,
                           sizeof(float) * total) != 0)
                    fail_msg("%d workers, case %d: rank %d's weighted sum is not the serial one", n,
                             c, r);
        }
        cf_results_release(&res);
    }
    /* a world of one: (x * pre) * post */
    make_f32(x, 1000, 0, 0, seed);
    memcpy(want, x, sizeof(float) * 1000);
    assert_int_equal(cf_comm_allreduce_scaled_f32(cf_comm_single(), x, 1000, 3.0f, 0.1f), CF_OK);
    for (size_t i = 0; i < 1000; i++) assert_true(x[i] == want[i] * 3.0f * 0.1f);
    assert_int_equal(cf_comm_allreduce_scaled_f32(cf_comm_single(), NULL, 4, 1.0f, 1.0f),
                     CF_ERR_INVALID);
    free(x), free(want);
}

/* More workers than cores (4 on this 2-core machine): many small collectives still finish
 * quickly (no livelock from spinning waiters). */
typedef struct many_ctx {
    int iters;
} many_ctx;

static cf_status many_worker(cf_comm *comm, void *vctx) {
    many_ctx *ctx = vctx;
    float v[64];
    for (int it = 0; it < ctx->iters; it++) {
        for (int i = 0; i < 64; i++) v[i] = (float)(cf_comm_rank(comm) + it + i);
        /* A barrier right before a collective of another kind: a rank that leaves the barrier
         * early rewrites its call descriptor while the others may still be checking it. */
        cf_status st = cf_comm_barrier(comm);
        if (st == CF_OK) st = cf_comm_allreduce_sum_f32(comm, v, 64);
        if (st != CF_OK) return st;
        int n = cf_comm_size(comm);
        float want = (float)(n * (n - 1) / 2 + n * (it + 5));
        if (v[5] != want)
            return cf_fail(CF_ERR_INVALID, "iteration %d: sum %g, expected %g", it, v[5], want);
        bool any;
        if ((st = cf_comm_any(comm, it == ctx->iters - 1 && cf_comm_rank(comm) == 1, &any)) !=
            CF_OK)
            return st;
        if (any != (it == ctx->iters - 1))
            return cf_fail(CF_ERR_INVALID, "iteration %d: any = %d", it, any);
    }
    return CF_OK;
}

static void test_oversubscribed(void **state) {
    (void)state;
    int workers = 2 * cf_available_cores();
    if (workers < 4) workers = 4;
    many_ctx ctx = {.iters = 500};
    cf_launch_options opt = {.num_workers = workers, .deadline_s = 30, .pin_cores = true};
    double t0 = cf_now();
    cf_status st = cf_launch_fork(&opt, many_worker, &ctx, NULL);
    double dt = cf_now() - t0;
    if (st != CF_OK) fail_msg("%s", cf_last_error());
    print_message(
        "%d workers on %d cores: %d x (barrier + allreduce 64 + any) in %.3f s (%.1f us each)\n",
        workers, cf_available_cores(), ctx.iters, dt, dt / ctx.iters * 1e6);
    /* a liveness bound, not a speed test: spinning workers that starve each other would take
     * minutes; yielding ones take well under a second even on a loaded machine */
    assert_true(dt < 60.0 * par_time_scale());
}

/* A mismatched collective is reported, not silently paired with another one. */
static cf_status mismatch_worker(cf_comm *comm, void *ctx) {
    (void)ctx;
    if (cf_comm_rank(comm) == 0) return cf_comm_barrier(comm);
    float v[10] = {0};
    return cf_comm_allreduce_sum_f32(comm, v, 10);
}

static void test_collective_mismatch(void **state) {
    (void)state;
    cf_launch_options opt = {.num_workers = 2, .deadline_s = 5};
    double t0 = cf_now();
    cf_status st = cf_launch_fork(&opt, mismatch_worker, NULL, NULL);
    assert_int_equal(st, CF_ERR_WORKER);
    print_message("mismatch: %s\n", cf_last_error());
    assert_non_null(strstr(cf_last_error(), "collective mismatch"));
    assert_non_null(strstr(cf_last_error(), "barrier"));
    assert_non_null(strstr(cf_last_error(), "allreduce_sum_f32"));
    assert_true(cf_now() - t0 < 2.0 * par_time_scale());
}

/* After a failed collective the communicator stays broken: a worker that ignores the error
 * still fails (with the first cause), and further collectives fail at once. */
static cf_status sticky_worker(cf_comm *comm, void *ctx) {
    (void)ctx;
    if (cf_comm_rank(comm) == 1) {
        float v[4];
        (void)cf_comm_broadcast(comm, v, sizeof v, 7); /* bad root: ignored by this worker */
        cf_status st = cf_comm_barrier(comm);
        if (st == CF_OK || !strstr(cf_last_error(), "unusable after an earlier failure"))
            return cf_fail(CF_ERR_STATE, "barrier after a failure returned %d: %s", st,
                           cf_last_error());
        return CF_OK; /* ignores it; the launcher must still report the failure */
    }
    return cf_comm_barrier(comm);
}

static void test_broken_comm_is_sticky(void **state) {
    (void)state;
    cf_launch_options opt = {.num_workers = 2, .deadline_s = 5};
    cf_status st = cf_launch_fork(&opt, sticky_worker, NULL, NULL);
    assert_int_equal(st, CF_ERR_WORKER);
    print_message("sticky: %s\n", cf_last_error());
    assert_non_null(strstr(cf_last_error(), "root 7"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single),
        cmocka_unit_test(test_collectives_1_to_4_workers),
        cmocka_unit_test(test_allreduce_deterministic),
        cmocka_unit_test(test_allreduce_scaled),
        cmocka_unit_test(test_oversubscribed),
        cmocka_unit_test(test_collective_mismatch),
        cmocka_unit_test(test_broken_comm_is_sticky),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
