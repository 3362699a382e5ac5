/* Core layer: errors, RNG, arena, thread pool. */
#include "oracle.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/strbuf.h"
#include "corefit/core.h"

static void test_error_messages(void **state) {
    (void)state;
    cf_clear_error();
    assert_string_equal(cf_last_error(), "");
    assert_int_equal(cf_fail(CF_ERR_FORMAT, "bad magic 0x%x", 0x1234), CF_ERR_FORMAT);
    assert_string_equal(cf_last_error(), "bad magic 0x1234");
    cf_fail_context(CF_ERR_FORMAT, "reading %s", "x.idx");
    assert_string_equal(cf_last_error(), "reading x.idx: bad magic 0x1234");
    assert_string_equal(cf_status_str(CF_ERR_NOMEM), "out of memory");
}

static void test_rng_reproducible_and_uniform(void **state) {
    (void)state;
    cf_rng a, b;
    cf_rng_seed(&a, 42);
    cf_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++) assert_true(cf_rng_next(&a) == cf_rng_next(&b));
    double sum = 0, sq = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double z = cf_rng_normal(&a);
        sum += z;
        sq += z * z;
    }
    assert_true(fabs(sum / n) < 0.01);
    assert_true(fabs(sq / n - 1.0) < 0.02);
    int64_t idx[50];
    for (int i = 0; i < 50; i++) idx[i] = i;
    cf_rng_shuffle(&a, idx, 50);
    int seen[50] = {0};
    for (int i = 0; i < 50; i++) seen[idx[i]]++;
    for (int i = 0; i < 50; i++) assert_int_equal(seen[i], 1);
}

static void test_arena_two_pass(void **state) {
    (void)state;
    cf_arena arena = {0};
    cf_arena_begin_measure(&arena);
    assert_null(cf_arena_floats(&arena, 10));
    assert_null(cf_arena_floats(&arena, 100));
    assert_int_equal(cf_arena_commit(&arena), CF_OK);
    float *a = cf_arena_floats(&arena, 10), *b = cf_arena_floats(&arena, 100);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(((uintptr_t)a & 63) == 0 && ((uintptr_t)b & 63) == 0);
    assert_true(b >= a + 10);
    assert_null(cf_arena_floats(&arena, 1)); /* beyond the measured size */
    cf_arena_release(&arena);
}

/* The transient pool: first fit from the bottom, blocks given back in any order are reused,
 * a view of a block keeps it, and what is not a block is ignored. */
static void test_arena_transient_pool(void **state) {
    (void)state;
    cf_arena arena = {0};
    int owner_a, owner_b;
    for (int pass = 0; pass < 2; pass++) { /* measure, then the same reservations again */
        if (pass == 0) cf_arena_begin_measure(&arena);
        cf_arena_floats(&arena, 4);
        cf_arena_reserve_transient(&arena, 1000);
        cf_arena_reserve_transient(&arena, 2000);
        cf_arena_reserve_transient(&arena, 1000);
        if (pass == 0) assert_int_equal(cf_arena_commit(&arena), CF_OK);
    }
    assert_int_equal(arena.pool_capacity, 1024 + 2048 + 1024);
    char *a = cf_arena_take(&arena, 1000, &owner_a);
    char *b = cf_arena_take(&arena, 2000, &owner_b);
    assert_non_null(a);
    assert_ptr_equal(b, a + 1024);
    assert_true(((uintptr_t)a & 63) == 0);
    assert_true(cf_arena_holds(&arena, a, &owner_a));
    assert_false(cf_arena_holds(&arena, a, &owner_b));
    assert_false(cf_arena_holds(&arena, a + 64, &owner_a));
    memset(a, 1, 1000);
    memset(b, 2, 2000);
    cf_arena_give(&arena, a, a + 10); /* a view into a: kept */
    assert_true(cf_arena_holds(&arena, a, &owner_a));
    cf_arena_give(&arena, a + 64, NULL);   /* not a block's start: ignored */
    cf_arena_give(&arena, &owner_a, NULL); /* not the pool's: ignored */
    assert_true(cf_arena_holds(&arena, a, &owner_a));
    cf_arena_give(&arena, a, b);
    assert_false(cf_arena_holds(&arena, a, &owner_a));
    assert_ptr_equal(cf_arena_take(&arena, 512, &owner_a), a); /* the lowest gap that fits */
    char *c = cf_arena_take(&arena, 1000, &owner_a);           /* a's rest is too short */
    assert_ptr_equal(c, b + 2048);
    assert_null(cf_arena_take(&arena, 64, &owner_a)); /* as many blocks as were reserved */
    assert_int_equal(arena.pool_high, 4096);
    for (int i = 0; i < 2000; i++) assert_int_equal(b[i], 2); /* b was never handed out again */
    cf_arena_give_all(&arena);
    assert_false(cf_arena_holds(&arena, b, &owner_b));
    assert_ptr_equal(cf_arena_take(&arena, 4096, &owner_b), a);
    char *d = cf_arena_take(&arena, 64, &owner_a); /* the pool is full: from the heap */
    assert_true(d && (d < arena.pool || d >= arena.pool + arena.pool_capacity));
    cf_arena_release(&arena);
}

/* A pool too fragmented for a take lends a block from the heap instead, and frees it when it is
 * given back; a reservation of nothing is a take of nothing. */
static void test_arena_transient_spill(void **state) {
    (void)state;
    cf_arena arena = {0};
    int a, b, c, z;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) cf_arena_begin_measure(&arena);
        cf_arena_reserve_transient(&arena, 128);
        cf_arena_reserve_transient(&arena, 64);
        cf_arena_reserve_transient(&arena, 64);
        cf_arena_reserve_transient(&arena, 0);
        if (pass == 0) assert_int_equal(cf_arena_commit(&arena), CF_OK);
    }
    char *pa = cf_arena_take(&arena, 64, &a), *pb = cf_arena_take(&arena, 64, &b);
    char *pc = cf_arena_take(&arena, 64, &c);
    assert_non_null(cf_arena_take(&arena, 0, &z)); /* the last 64 bytes */
    assert_ptr_equal(pc, pa + 128);
    cf_arena_give(&arena, pa, NULL);
    cf_arena_give(&arena, pb, NULL);
    assert_ptr_equal(cf_arena_take(&arena, 64, &b), pa);
    char *big = cf_arena_take(&arena, 128, &a); /* two gaps of 64: none fits */
    assert_non_null(big);
    assert_true(big < arena.pool || big >= arena.pool + arena.pool_capacity);
    assert_int_equal(arena.spills, 1);
    assert_true(cf_arena_holds(&arena, big, &a));
    memset(big, 3, 128);
    cf_arena_give(&arena, big, big + 5); /* a view into it: kept */
    assert_true(cf_arena_holds(&arena, big, &a));
    cf_arena_give(&arena, big, NULL);
    assert_false(cf_arena_holds(&arena, big, &a));
    assert_int_equal(arena.n_spilled, 0);
    assert_non_null(cf_arena_take(&arena, 128, &a)); /* spilled again, freed by the release */
    cf_arena_release(&arena);
}

typedef struct sum_ctx {
    atomic_long total;
    int hits[1000];
} sum_ctx;

static void add_range(void *ctx, int64_t b, int64_t e, int thread) {
    sum_ctx *s = ctx;
    (void)thread;
    for (int64_t i = b; i < e; i++) {
        s->hits[i]++;
        atomic_fetch_add(&s->total, (long)i);
    }
}

static void test_parallel_for_covers_range_and_survives_fork(void **state) {
    (void)state;
    cf_set_num_threads(2);
    static sum_ctx s;
    memset(&s, 0, sizeof s);
    cf_parallel_for(1000, add_range, &s);
    assert_int_equal(atomic_load(&s.total), 999 * 1000 / 2);
    for (int i = 0; i < 1000; i++) assert_int_equal(s.hits[i], 1);
    pid_t pid = fork();
    if (pid == 0) {
        memset(&s, 0, sizeof s);
        cf_parallel_for(1000, add_range, &s); /* the pool must be re-created in the child */
        _exit(atomic_load(&s.total) == 999 * 1000 / 2 ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cf_set_num_threads(0);
}

/* The string builder: appends across several growths, an empty builder gives "", a failed one
 * NULL, and taking leaves the builder empty for the next string. */
static void test_strbuf(void **state) {
    (void)state;
    cf__strbuf b = {0};
    char *empty = cf__strbuf_take(&b);
    assert_string_equal(empty, "");
    cf_free(empty);
    char expect[1001];
    for (int i = 0; i < 1000; i++) expect[i] = (char)('a' + i % 26);
    expect[1000] = 0;
    for (int i = 0; i < 1000; i += 10) cf__strbuf_put(&b, expect + i, 10); /* past 64 bytes */
    assert_int_equal(b.n, 1000);
    char *built = cf__strbuf_take(&b);
    assert_string_equal(built, expect);
    cf_free(built);
    assert_null(b.s);
    assert_int_equal(b.n, 0);
    cf__strbuf_str(&b, "x");
    cf__strbuf_put(&b, "yz", 1); /* n bytes, not the whole string */
    assert_string_equal(b.s, "xy");
    b.failed = true; /* as after an allocation that failed: later puts do nothing */
    cf__strbuf_str(&b, "more");
    assert_string_equal(b.s, "xy");
    assert_null(cf__strbuf_take(&b));
    assert_null(b.s);
    assert_false(b.failed);
    cf__strbuf_str(&b, "again");
    cf__strbuf_free(&b);
    assert_null(b.s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_strbuf),
        cmocka_unit_test(test_rng_reproducible_and_uniform),
        cmocka_unit_test(test_arena_two_pass),
        cmocka_unit_test(test_arena_transient_pool),
        cmocka_unit_test(test_arena_transient_spill),
        cmocka_unit_test(test_parallel_for_covers_range_and_survives_fork),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
