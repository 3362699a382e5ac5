/* par layer: the fork launcher and supervisor — results coming home, and every kind of fault
 * (crash, abort, kill, error return, hang outside and inside a collective, early exit, Ctrl-C,
 * a dead supervisor) returning the right status and message quickly, with no child left and
 * the caller's signal dispositions restored; a supervisor that sleeps until its workers end.
 *
 * Workers run in forked children: no cmocka asserts there. A fault's moment is written by the
 * faulting worker into a shared page the test maps itself (the launcher's region is gone after
 * a fault), so the reaction time is measured from the fault, not from the launch. */
#include "oracle.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corefit/par.h"
#include "par_time.h"

/* Shared with the workers (mapped before launching). */
typedef struct shared_page {
    _Atomic double fault_at; /* cf_now() when the fault was injected */
    _Atomic int started;
    _Atomic int release; /* the pause test lets its workers finish */
    int pids[16];
    char msg[1024];
} shared_page;

static shared_page *page;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* ---- success ------------------------------------------------------------------------------ */

static int parent_value = 1;

static cf_status results_worker(cf_comm *comm, void *ctx) {
    (void)ctx;
    size_t bytes;
    int *res = cf_comm_results(comm, &bytes);
    int rank = cf_comm_rank(comm), size = cf_comm_size(comm);
    if (!res || bytes != 1 << 20)
        return cf_fail(CF_ERR_STATE, "results area %p, %zu bytes", (void *)res, bytes);
    for (int i = 0; i < 1000; i++)
        if (res[rank * 1000 + i] != 0) return cf_fail(CF_ERR_STATE, "results area not zeroed");
    for (int i = 0; i < 1000; i++) res[rank * 1000 + i] = rank * 100000 + i;
    parent_value = 2; /* stays in this child */
    /* One thread, pinned to one core. */
    if (cf_get_num_threads() != 1) return cf_fail(CF_ERR_STATE, "%d threads", cf_get_num_threads());
    if (cf_available_cores() != 1) return cf_fail(CF_ERR_STATE, "%d cores", cf_available_cores());
    res[size * 1000 + rank] = (int)getpid();
    return cf_comm_barrier(comm);
}

static void test_results_come_home(void **state) {
    (void)state;
    cf_launch_options opt = {.num_workers = 3, .results_bytes = 1 << 20, .pin_cores = true};
    cf_results res;
    cf_status st = cf_launch_fork(&opt, results_worker, NULL, &res);
    if (st != CF_OK) fail_msg("%s", cf_last_error());
    assert_int_equal(res.bytes, 1 << 20);
    const int *r = res.data;
    for (int rank = 0; rank < 3; rank++)
        for (int i = 0; i < 1000; i++) assert_int_equal(r[rank * 1000 + i], rank * 100000 + i);
    for (int rank = 0; rank < 3; rank++) {
        assert_true(r[3000 + rank] > 0);
        assert_int_not_equal(r[3000 + rank], getpid());
    }
    assert_int_equal(parent_value, 1);
    cf_results_release(&res);
    assert_null(res.data);
    cf_results_release(&res); /* twice is fine */
    errno = 0;
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
}

static cf_status noop_worker(cf_comm *comm, void *ctx) {
    (void)comm, (void)ctx;
    return CF_OK;
}

static void test_defaults_and_bad_options(void **state) {
    (void)state;
    cf_launch_options opt = {0}; /* one worker per core, no results */
    cf_results res = {.data = (void *)1};
    assert_int_equal(cf_launch_fork(&opt, noop_worker, NULL, &res), CF_OK);
    assert_null(res.data);
    opt.num_workers = -1;
    assert_int_equal(cf_launch_fork(&opt, noop_worker, NULL, NULL), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "num_workers = -1"));
    opt.num_workers = 2;
    assert_int_equal(cf_launch_fork(&opt, NULL, NULL, NULL), CF_ERR_INVALID);
    opt.deadline_s = -1;
    assert_int_equal(cf_launch_fork(&opt, noop_worker, NULL, NULL), CF_ERR_INVALID);
    assert_int_equal(cf_launch_fork(NULL, noop_worker, NULL, NULL), CF_ERR_INVALID);
}

/* ---- faults -------------------------------------------------------------------------------- */

typedef enum fault_kind {
    F_SEGV,
    F_ABORT,
    F_KILL,
    F_ERROR,
    F_EXIT,
    F_HANG_OUTSIDE, /* stops making progress outside a collective */
    F_HANG_IN_COLL, /* waits in a collective the others never join (they stay alive) */
    F_FINISH_EARLY, /* returns OK while the others still wait in a collective */
    F_NONE,         /* nobody faults: the test interrupts */
} fault_kind;

typedef struct fault_ctx {
    fault_kind kind;
    int rank;
} fault_ctx;

static void no_core_dumps(void) {
    struct rlimit rl = {0, 0};
    setrlimit(RLIMIT_CORE, &rl);
}

static void mark_fault(void) {
    atomic_store(&page->fault_at, cf_now());
}

static cf_status fault_worker(cf_comm *comm, void *vctx) {
    fault_ctx *ctx = vctx;
    int rank = cf_comm_rank(comm);
    page->pids[rank] = (int)getpid();
    atomic_fetch_add(&page->started, 1);
    float v[1000];
    /* Some real collectives first, then the fault on the chosen rank while the others carry
     * on calling collectives. */
    for (int it = 0; it < 5; it++) {
        for (int i = 0; i < 1000; i++) v[i] = (float)i;
        cf_status st = cf_comm_allreduce_mean_f32(comm, v, 1000);
        if (st != CF_OK) return st;
    }
    if (rank == ctx->rank) {
        switch (ctx->kind) {
        case F_SEGV:
            /* cmocka's SIGSEGV handler (inherited from this test process) would longjmp back
             * into the test runner: the launcher must have reset it. */
            no_core_dumps();
            mark_fault();
            raise(SIGSEGV);
            break;
        case F_ABORT:
            no_core_dumps();
            mark_fault();
            abort();
        case F_KILL:
            mark_fault();
            raise(SIGKILL);
            break;
        case F_ERROR:
            mark_fault();
            return cf_fail(CF_ERR_FORMAT, "bad magic 0x1234 in %s", "train.idx");
        case F_EXIT:
            mark_fault();
            _exit(3);
        case F_HANG_OUTSIDE:
            mark_fault();
            for (;;) sleep_s(1);
        case F_HANG_IN_COLL:
            mark_fault();
            return cf_comm_barrier(comm);
        case F_FINISH_EARLY:
            mark_fault();
            return CF_OK;
        case F_NONE:
            break;
        }
    }
    if (ctx->kind == F_HANG_IN_COLL) {
        for (;;) { /* alive and reporting progress, but never joining */
            cf_comm_heartbeat(comm);
            sleep_s(0.01);
        }
    }
    for (;;) {
        cf_status st = cf_comm_allreduce_sum_f32(comm, v, 1000);
        if (st != CF_OK) return st;
    }
}

static int test_sigint_calls;
static void test_sigint_handler(int sig) {
    (void)sig;
    test_sigint_calls++;
}

typedef struct fault_result {
    cf_status st;
    char msg[1100];
    double reaction; /* seconds from the fault to the return */
} fault_result;

static void *send_sigint_later(void *arg) {
    (void)arg;
    while (atomic_load(&page->started) < 2) sleep_s(0.005);
    sleep_s(0.2);
    mark_fault();
    kill(getpid(), SIGINT);
    return NULL;
}

/* Runs a launch with one fault; checks no child is left and the caller's SIGINT and SIGCHLD
 * dispositions are the ones it had. */
static fault_result run_fault(int workers, fault_kind kind, int rank, double deadline,
                              bool send_sigint) {
    memset(page, 0, sizeof *page);
    /* The caller's own dispositions, which must survive the call. */
    struct sigaction mine, before_int, before_chld, after_int, after_chld;
    memset(&mine, 0, sizeof mine);
    mine.sa_handler = test_sigint_handler;
    sigemptyset(&mine.sa_mask);
    mine.sa_flags = SA_RESTART;
    sigaction(SIGINT, &mine, NULL);
    sigaction(SIGINT, NULL, &before_int);
    sigaction(SIGCHLD, NULL, &before_chld);
    test_sigint_calls = 0;

    pthread_t helper;
    if (send_sigint) assert_int_equal(pthread_create(&helper, NULL, send_sigint_later, NULL), 0);
    fault_ctx ctx = {.kind = kind, .rank = rank};
    cf_launch_options opt = {.num_workers = workers, .deadline_s = deadline, .pin_cores = true};
    fault_result out;
    cf_results res;
    out.st = cf_launch_fork(&opt, fault_worker, &ctx, &res);
    double done = cf_now();
    snprintf(out.msg, sizeof out.msg, "%s", cf_last_error());
    out.reaction = done - atomic_load(&page->fault_at);
    if (send_sigint) pthread_join(helper, NULL);
    assert_null(res.data);

    /* No child left behind, not even a zombie. */
    errno = 0;
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
    for (int r = 0; r < workers; r++)
        if (page->pids[r] > 0) assert_int_equal(kill(page->pids[r], 0), -1);

    sigaction(SIGINT, NULL, &after_int);
    sigaction(SIGCHLD, NULL, &after_chld);
    assert_ptr_equal(after_int.sa_handler, test_sigint_handler);
    assert_int_equal(after_int.sa_flags, before_int.sa_flags);
    assert_ptr_equal(after_chld.sa_handler, before_chld.sa_handler);
    assert_int_equal(test_sigint_calls, 0); /* the launcher took the SIGINT, not our handler */
    signal(SIGINT, SIG_DFL);
    print_message("%-14s -> %s (%.3f s after the fault)\n",
                  kind == F_NONE
                      ? "SIGINT"
                      : (const char *[]){"SIGSEGV", "abort", "SIGKILL", "error", "exit(3)",
                                         "hang outside", "hang in coll", "finish early"}[kind],
                  out.msg, out.reaction);
    return out;
}

static void expect(fault_result r, cf_status st, const char *text, double within) {
    if (r.st != st) fail_msg("status %d (%s), expected %d", r.st, r.msg, st);
    if (!strstr(r.msg, text)) fail_msg("message \"%s\" lacks \"%s\"", r.msg, text);
    within *= par_time_scale(); /* a liveness bound: stretched on a busy machine */
    if (!(r.reaction >= 0 && r.reaction < within))
        fail_msg("took %.3f s after the fault (limit %.1f s)", r.reaction, within);
}

static void test_fault_segv(void **state) {
    (void)state;
    expect(run_fault(3, F_SEGV, 1, 0, false), CF_ERR_WORKER,
           "worker 1 was killed by signal 11 (SIGSEGV)", 2.0);
}

static void test_fault_abort(void **state) {
    (void)state;
    expect(run_fault(2, F_ABORT, 0, 0, false), CF_ERR_WORKER,
           "worker 0 was killed by signal 6 (SIGABRT)", 2.0);
}

static void test_fault_sigkill(void **state) {
    (void)state;
    expect(run_fault(4, F_KILL, 3, 0, false), CF_ERR_WORKER,
           "worker 3 was killed by signal 9 (SIGKILL)", 2.0);
}

static void test_fault_error_return(void **state) {
    (void)state;
    expect(run_fault(3, F_ERROR, 2, 0, false), CF_ERR_WORKER,
           "worker 2 failed: bad magic 0x1234 in train.idx", 2.0);
}

static void test_fault_exit(void **state) {
    (void)state;
    expect(run_fault(2, F_EXIT, 1, 0, false), CF_ERR_WORKER,
           "worker 1 exited with code 3 before finishing", 2.0);
}

/* 1 s on an idle machine, in whole tenths (the message prints one decimal) */
static double hang_deadline(void) {
    return round(10 * par_time_scale()) / 10;
}

/* The silence a hang message reports ("made no progress for T s", T to a tenth of a second): at
 * least the limit the supervisor applies (less half a tenth, the rounding), and within the
 * liveness bound. The supervisor reports the silence it saw when it woke, which on a busy machine
 * is later than the limit, so the exact tenth is not fixed. */
static void expect_silence(const char *msg, double at_least, double within) {
    const char *at = strstr(msg, "made no progress for ");
    assert_non_null(at);
    char *end;
    double silence = strtod(at + strlen("made no progress for "), &end);
    if (end == at + strlen("made no progress for ") || strncmp(end, " s", 2) != 0)
        fail_msg("no silence in \"%s\"", msg);
    if (!(silence >= at_least - 0.05 && silence < within * par_time_scale()))
        fail_msg("\"%s\": silence %.1f s, expected from %.2f s to %.1f s", msg, silence, at_least,
                 within * par_time_scale());
}

static void test_fault_hang_outside_collective(void **state) {
    (void)state;
    /* the deadline itself stretches on a busy machine: there a worker that is merely slow to
     * start could otherwise be the first without progress */
    double deadline = hang_deadline();
    /* worker 2 hangs right after the heartbeat of its last collective, which under load can
     * come after worker 1 began to wait in the next one: worker 2 must still be named */
    fault_result r = run_fault(3, F_HANG_OUTSIDE, 2, deadline, false);
    expect(r, CF_ERR_WORKER, "worker 2 made no progress for ", deadline + 2.0);
    expect_silence(r.msg, deadline, deadline + 2.0);
    assert_true(r.reaction >= deadline);
}

static void test_fault_hang_in_collective(void **state) {
    (void)state;
    double deadline = hang_deadline();
    /* a wait in a collective is named after the deadline and an eighth of it (launch.c) */
    const double waited = deadline + deadline / 8;
    fault_result r = run_fault(3, F_HANG_IN_COLL, 1, deadline, false);
    expect(r, CF_ERR_WORKER, "worker 1 made no progress for ", waited + 2.0);
    expect_silence(r.msg, waited, waited + 2.0);
    assert_non_null(strstr(r.msg, " s (waiting in barrier"));
    assert_non_null(strstr(r.msg, "for worker 0, 2)"));
    assert_true(r.reaction >= waited);
}

static void test_fault_finish_early(void **state) {
    (void)state;
    expect(run_fault(2, F_FINISH_EARLY, 0, 0, false), CF_ERR_WORKER,
           "worker 1 failed: allreduce_sum_f32: worker 0 finished without joining", 2.0);
}

static void test_sigint(void **state) {
    (void)state;
    expect(run_fault(3, F_NONE, -1, 0, true), CF_ERR_INTERRUPTED, "interrupted", 2.0);
}

/* A caller that ignores SIGINT keeps ignoring it. */
static void test_ignored_sigint_stays_ignored(void **state) {
    (void)state;
    signal(SIGINT, SIG_IGN);
    cf_launch_options opt = {.num_workers = 2};
    assert_int_equal(cf_launch_fork(&opt, noop_worker, NULL, NULL), CF_OK);
    struct sigaction now;
    sigaction(SIGINT, NULL, &now);
    assert_ptr_equal(now.sa_handler, SIG_IGN);
    signal(SIGINT, SIG_DFL);
}

/* If the supervisor dies, its workers die with it (they are left to this test, which makes
 * itself their subreaper for the occasion). */
/* Workers that finish 0.7 s after their start, noting when. */
static cf_status late_worker(cf_comm *comm, void *ctx) {
    (void)ctx;
    sleep_s(0.7);
    if (cf_comm_rank(comm) == 0) atomic_store(&page->fault_at, cf_now());
    return CF_OK;
}

/* The supervisor sleeps until a worker ends rather than polling: over a 0.7 s launch its thread
 * makes a few voluntary context switches (naps of a twentieth of the deadline, at most 200 ms;
 * polling every 10 ms made about 70), and it hands back within a fraction of a nap after the
 * last worker's end (0.7 s is half-way between two 200 ms naps). */
static void test_supervisor_sleeps_until_a_worker_ends(void **state) {
    (void)state;
    for (int round = 0; round < 3; round++) {
        memset(page, 0, sizeof *page);
        cf_launch_options opt = {.num_workers = 2, .deadline_s = 60};
        struct rusage before, after;
        getrusage(RUSAGE_THREAD, &before);
        cf_status st = cf_launch_fork(&opt, late_worker, NULL, NULL);
        const double done = cf_now();
        getrusage(RUSAGE_THREAD, &after);
        if (st != CF_OK) fail_msg("%s", cf_last_error());
        const long switches = after.ru_nvcsw - before.ru_nvcsw;
        const double latency = done - atomic_load(&page->fault_at);
        print_message("round %d: %ld voluntary context switches, back %.4f s after rank 0's "
                      "end\n",
                      round, switches, latency);
        if (switches > 25) fail_msg("the supervisor woke %ld times in 0.7 s", switches);
        if (!(latency >= 0 && latency < 0.05 * par_time_scale()))
            fail_msg("the launch returned %.3f s after the workers' end", latency);
    }
}

static void test_supervisor_death_kills_workers(void **state) {
    (void)state;
    memset(page, 0, sizeof *page);
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    pid_t sup = fork();
    assert_true(sup >= 0);
    if (sup == 0) {
        fault_ctx ctx = {.kind = F_NONE, .rank = -1};
        cf_launch_options opt = {.num_workers = 2, .deadline_s = 30};
        cf_launch_fork(&opt, fault_worker, &ctx, NULL);
        _exit(0);
    }
    double t0 = cf_now();
    while (atomic_load(&page->started) < 2 && cf_now() - t0 < 10) sleep_s(0.005);
    assert_int_equal(atomic_load(&page->started), 2);
    sleep_s(0.05);
    double killed = cf_now();
    kill(sup, SIGKILL);
    assert_int_equal(waitpid(sup, NULL, 0), sup);
    /* Reap the orphaned workers as they die. */
    int reaped = 0;
    while (cf_now() - killed < 5 * par_time_scale()) {
        pid_t w = waitpid(-1, NULL, WNOHANG);
        if (w > 0)
            reaped++;
        else if (w < 0 && errno == ECHILD)
            break;
        else
            sleep_s(0.005);
    }
    double took = cf_now() - killed;
    prctl(PR_SET_CHILD_SUBREAPER, 0);
    print_message("supervisor killed: %d workers gone %.3f s later\n", reaped, took);
    assert_int_equal(reaped, 2);
    assert_true(took < 2.0 * par_time_scale());
}

/* ---- a pause of the whole group ----------------------------------------------------------- */

/* Spins until this thread has used `seconds` of CPU time (which a stopped process does not). */
static void spin_cpu(double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    double until = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + seconds;
    do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    while ((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 < until);
}

/* Collectives until released; rank 1 computes for a quarter of the deadline (at most 0.1 s)
 * between them (silent outside a collective), so rank 0 waits in one most of the time. A pause
 * lands in that work almost always, and after it both stay silent until rank 1 has finished. */
static cf_status pause_worker(cf_comm *comm, void *ctx) {
    double nap = *(const double *)ctx * 0.25;
    if (nap > 0.1) nap = 0.1; /* CPU time: on a loaded machine it takes longer in wall time */
    int rank = cf_comm_rank(comm);
    page->pids[rank] = (int)getpid();
    atomic_fetch_add(&page->started, 1);
    float v[256] = {0};
    while (!atomic_load(&page->release)) {
        if (rank == 1) spin_cpu(nap);
        cf_status st = cf_comm_allreduce_sum_f32(comm, v, 256);
        if (st != CF_OK) return st;
    }
    return cf_comm_barrier(comm);
}

/* Stopping the whole process group (Ctrl-Z, kill -STOP, a freezer) for longer than the deadline
 * and then continuing it is not a hang: the fit carries on and completes. Both the supervisor's
 * deadline and a waiting worker's own give-up (twice the deadline plus 1 s) are passed. */
static void test_pause_of_the_group_is_not_a_hang(void **state) {
    (void)state;
    memset(page, 0, sizeof *page);
    double deadline = 0.5 * par_time_scale();
    pid_t sup = fork();
    assert_true(sup >= 0);
    if (sup == 0) {
        setpgid(0, 0);
        cf_launch_options opt = {.num_workers = 2, .deadline_s = deadline};
        cf_status st = cf_launch_fork(&opt, pause_worker, &deadline, NULL);
        snprintf(page->msg, sizeof page->msg, "%s", st == CF_OK ? "ok" : cf_last_error());
        _exit(st == CF_OK ? 0 : 1);
    }
    setpgid(sup, sup); /* whichever of the two runs first */
    double t0 = cf_now();
    while (atomic_load(&page->started) < 2 && cf_now() - t0 < 10 * par_time_scale()) sleep_s(0.005);
    assert_int_equal(atomic_load(&page->started), 2);
    sleep_s(0.1);
    assert_int_equal(kill(-sup, SIGSTOP), 0);
    int ws;
    assert_int_equal(waitpid(sup, &ws, WUNTRACED), sup);
    assert_true(WIFSTOPPED(ws));
    sleep_s(2 * deadline + 2.0);
    assert_int_equal(kill(-sup, SIGCONT), 0);
    sleep_s(2 * deadline); /* the fit goes on past a deadline after the pause */
    atomic_store(&page->release, 1);
    pid_t w;
    t0 = cf_now();
    while ((w = waitpid(sup, &ws, WNOHANG)) == 0 && cf_now() - t0 < 20 * par_time_scale())
        sleep_s(0.01);
    if (w == 0) {
        kill(-sup, SIGKILL);
        waitpid(sup, &ws, 0);
        fail_msg("the fit did not end after the pause");
    }
    print_message("after a %.1f s pause (deadline %.1f s): %s\n", 2 * deadline + 2.0, deadline,
                  page->msg);
    assert_true(WIFEXITED(ws));
    assert_string_equal(page->msg, "ok");
    assert_int_equal(WEXITSTATUS(ws), 0);
}

static int setup(void **state) {
    (void)state;
    page = mmap(NULL, sizeof *page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return page == MAP_FAILED ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    munmap(page, sizeof *page);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_results_come_home),
        cmocka_unit_test(test_defaults_and_bad_options),
        cmocka_unit_test(test_fault_segv),
        cmocka_unit_test(test_fault_abort),
        cmocka_unit_test(test_fault_sigkill),
        cmocka_unit_test(test_fault_error_return),
        cmocka_unit_test(test_fault_exit),
        cmocka_unit_test(test_fault_hang_outside_collective),
        cmocka_unit_test(test_fault_hang_in_collective),
        cmocka_unit_test(test_fault_finish_early),
        cmocka_unit_test(test_sigint),
        cmocka_unit_test(test_ignored_sigint_stays_ignored),
        cmocka_unit_test(test_supervisor_death_kills_workers),
        cmocka_unit_test(test_supervisor_sleeps_until_a_worker_ends),
        cmocka_unit_test(test_pause_of_the_group_is_not_a_hang),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
