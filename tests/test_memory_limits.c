/* Memory limits give clear errors within seconds, never a spin or a hang:
 * - fork workers under an address-space limit that leaves no room for OpenBLAS's work buffer
 *   (which OpenBLAS would otherwise retry to map for ever, at full CPU) fail with a message
 *   that says so, long before the hang deadline; with room they run as usual;
 * - `corefit train --cores 2` under `ulimit -v` (set in a child shell) too small for its workers
 *   ends with an out-of-memory message and exit status 1 within seconds, and trains under one
 *   that leaves room.
 * - `corefit train --cores 1` under limits too small for the fit, or for OpenBLAS's work buffers,
 *   ends with an out-of-memory message and exits within seconds (OpenBLAS's own threads once
 *   spun for the buffer and then blocked the exit); `--cores 2` trains under the limit that
 *   `--cores 1 --threads 1` needs, plus a little;
 * - cf_blas_reserve refuses clearly when there is no room for OpenBLAS's buffers, and once it has
 *   made room, BLAS calls on that many threads at once map nothing more (they run under a limit
 *   that leaves no room for another buffer);
 * - `corefit predict` on /dev/zero or a FIFO nobody writes to ends with a clear error.
 * Everything runs in child processes: the limits never touch the test process. Address-space
 * limits cannot be tested under AddressSanitizer or valgrind (they reserve or manage the address
 * space themselves), so the tests skip there. */
#include "oracle.h"

#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corefit/par.h"
#include "par_time.h"

#define COREFIT CF_BUILD_DIR "/corefit"
#ifndef CF_FASHION_MNIST_DEFAULT_DIR
#define CF_FASHION_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#endif

static bool can_limit_address_space(void) {
    const char *pre = getenv("LD_PRELOAD");
#if defined(__SANITIZE_ADDRESS__)
    return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return false;
#endif
#endif
    return !(pre && strstr(pre, "vgpreload"));
}

static long vm_size_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1;
    if (f && fscanf(f, "%ld", &pages) != 1) pages = -1;
    if (f) fclose(f);
    return pages * sysconf(_SC_PAGESIZE);
}

/* Workers that multiply matrices (OpenBLAS's first call maps its buffer). */
static cf_status gemm_worker(cf_comm *comm, void *ctx) {
    (void)ctx;
    enum { N = 256 };
    float *m = calloc(3 * N * N, sizeof(float));
    if (!m) return cf_fail(CF_ERR_NOMEM, "test matrices");
    for (int i = 0; i < N * N; i++) m[i] = m[N * N + i] = 1.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, m, N, m + N * N, N, 0.0f,
                m + 2 * N * N, N);
    cf_status st = m[2 * N * N] == (float)N ? CF_OK : cf_fail(CF_ERR_STATE, "wrong product");
    free(m);
    if (st == CF_OK) st = cf_comm_barrier(comm);
    return st;
}

typedef struct outcome {
    int status;
    double seconds;
    char msg[1024];
} outcome;

/* Runs a 2-worker launch in a child whose address space may grow by `extra` bytes; kills it
 * after `give_up` seconds (a spin). */
static outcome launch_under_limit(long extra, double give_up) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(NULL);
    double t0 = cf_now();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        struct rlimit rl = {(rlim_t)(vm_size_bytes() + extra), (rlim_t)(vm_size_bytes() + extra)};
        outcome o = {0};
        if (setrlimit(RLIMIT_AS, &rl) != 0) {
            o.status = -1;
        } else {
            cf_launch_options opt = {.num_workers = 2, .deadline_s = 120};
            o.status = cf_launch_fork(&opt, gemm_worker, NULL, NULL);
            snprintf(o.msg, sizeof o.msg, "%s", cf_last_error());
        }
        ssize_t w = write(p[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 1);
    }
    close(p[1]);
    outcome o = {.status = -2};
    int ws;
    pid_t w;
    while ((w = waitpid(pid, &ws, WNOHANG)) == 0 && cf_now() - t0 < give_up) usleep(10000);
    o.seconds = cf_now() - t0;
    if (w == 0) {
        kill(pid, SIGKILL); /* its workers die with it */
        waitpid(pid, &ws, 0);
        snprintf(o.msg, sizeof o.msg, "still running after %.0f s", give_up);
    } else if (read(p[0], &o, sizeof o) != (ssize_t)sizeof o) {
        snprintf(o.msg, sizeof o.msg, "the child wrote nothing (wait status 0x%x)", ws);
    }
    o.seconds = cf_now() - t0;
    close(p[0]);
    return o;
}

static void test_workers_without_room_for_blas_fail_clearly(void **state) {
    (void)state;
    if (!can_limit_address_space()) skip();
    /* 48 MB more: the workers' stacks and matrices fit, OpenBLAS's buffer does not. */
    outcome o = launch_under_limit(48L << 20, 60 * test_time_scale());
    print_message("48 MB of room: status %d after %.2f s: %s\n", o.status, o.seconds, o.msg);
    assert_int_equal(o.status, CF_ERR_WORKER);
    assert_non_null(strstr(o.msg, "out of memory"));
    assert_non_null(strstr(o.msg, "OpenBLAS could not map its work buffer"));
    assert_non_null(strstr(o.msg, "address-space limit"));
    assert_true(o.seconds < 20 * test_time_scale()); /* liveness: not the 120 s deadline */
    /* With room, the same workers run. */
    o = launch_under_limit(1L << 30, 60 * test_time_scale());
    print_message("1 GB of room: status %d after %.2f s: %s\n", o.status, o.seconds, o.msg);
    if (o.status != CF_OK) fail_msg("with room: %s", o.msg);
}

/* Two threads that multiply matrices at the same time: each BLAS call in flight needs a buffer. */
static pthread_barrier_t both_ready;

static void *concurrent_gemm(void *arg) {
    float *m = arg;
    enum { N = 64 };
    pthread_barrier_wait(&both_ready);
    for (int i = 0; i < 200; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, m, N, m + N * N, N,
                    0.0f, m + 2 * N * N, N);
    return NULL;
}

/* In a child: the outcome of cf_blas_reserve(2) with `extra` bytes of room and, when it made room,
 * of two concurrent BLAS threads under a limit that leaves 48 MB (their stacks, not a buffer). */
static outcome reserve_under_limit(long extra, double give_up) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(NULL);
    double t0 = cf_now();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        outcome o = {0};
        struct rlimit rl = {(rlim_t)(vm_size_bytes() + extra), (rlim_t)(vm_size_bytes() + extra)};
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(2);
        long before = vm_size_bytes();
        o.status = cf_blas_reserve(2);
        long reserved = vm_size_bytes() - before;
        if (o.status != CF_OK) {
            snprintf(o.msg, sizeof o.msg, "%s", cf_last_error());
        } else {
            static float m[2][3 * 64 * 64];
            rl.rlim_cur = rl.rlim_max = (rlim_t)(vm_size_bytes() + (48L << 20));
            if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(2);
            pthread_barrier_init(&both_ready, NULL, 2);
            pthread_t t[2];
            for (int i = 0; i < 2; i++)
                if (pthread_create(&t[i], NULL, concurrent_gemm, m[i]) != 0) _exit(3);
            for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
            snprintf(o.msg, sizeof o.msg, "reserved %ld MB", reserved >> 20);
            o.seconds = (double)reserved; /* the parent's clock replaces it */
        }
        ssize_t w = write(p[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 1);
    }
    close(p[1]);
    outcome o = {.status = -2};
    int ws;
    pid_t w;
    while ((w = waitpid(pid, &ws, WNOHANG)) == 0 && cf_now() - t0 < give_up) usleep(10000);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &ws, 0);
        snprintf(o.msg, sizeof o.msg, "still running after %.0f s (a spin)", give_up);
    } else if (read(p[0], &o, sizeof o) != (ssize_t)sizeof o) {
        snprintf(o.msg, sizeof o.msg, "the child wrote nothing (wait status 0x%x)", ws);
    }
    o.seconds = cf_now() - t0;
    close(p[0]);
    return o;
}

static void test_blas_reserve(void **state) {
    (void)state;
    if (!can_limit_address_space()) skip();
    /* 64 MB of room: not one 128 MiB buffer. */
    outcome o = reserve_under_limit(64L << 20, 30 * par_time_scale());
    print_message("reserve with 64 MB of room: status %d after %.2f s: %s\n", o.status, o.seconds,
                  o.msg);
    assert_int_equal(o.status, CF_ERR_NOMEM);
    assert_non_null(strstr(o.msg, "out of memory"));
    assert_non_null(strstr(o.msg, "OpenBLAS's work buffers"));
    assert_non_null(strstr(o.msg, "address-space limit"));
    /* 1 GB of room: the reserve maps two buffers, and then two threads multiplying at once under
     * a limit with no room for another one finish (without the reserve, OpenBLAS would spin). */
    o = reserve_under_limit(1L << 30, 30 * par_time_scale());
    print_message("reserve with 1 GB of room: status %d after %.2f s: %s\n", o.status, o.seconds,
                  o.msg);
    if (o.status != CF_OK) fail_msg("with room: %s", o.msg);
    long mb = 0;
    assert_int_equal(sscanf(o.msg, "reserved %ld MB", &mb), 1);
    assert_true(mb >= 2 * 128);
}

/* Runs `corefit train` in a shell with `ulimit -v kib`; returns the exit status, fills err. */
static int train_under_ulimit(long kib, const char *cores, char *err, size_t cap, double *secs,
                              double give_up) {
    char dir[256];
    test_tmpdir_make(dir, sizeof dir, "cf_ulimit_");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && ulimit -v %ld && exec timeout -s KILL %d '%s' train --limit 640 --bs 32 "
             "--epochs 1 --cores %s --quiet --out m.safetensors >out.txt 2>err.txt </dev/null",
             dir, kib, (int)give_up + 1, COREFIT, cores);
    double t0 = cf_now();
    int ws = system(cmd);
    *secs = cf_now() - t0;
    char path[400];
    snprintf(path, sizeof path, "%s/err.txt", dir);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(err, 1, cap - 1, f) : 0;
    err[n] = '\0';
    if (f) fclose(f);
    test_tmpdir_remove(dir);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* --cores 1: under a limit too small for the fit, and under one where the fit fits but OpenBLAS's
 * buffers for its threads do not: an out-of-memory error and the exit, within seconds. */
static void test_cli_in_process_under_ulimit(void **state) {
    (void)state;
    struct stat sb;
    if (!can_limit_address_space() || stat(CF_FASHION_MNIST_DEFAULT_DIR, &sb) != 0) skip();
    char err[4096];
    double secs;
    const double bound = 30 * par_time_scale();
    int rc = train_under_ulimit(80000, "1", err, sizeof err, &secs, bound);
    print_message("--cores 1 under ulimit -v 80000: exit %d after %.1f s: %s", rc, secs, err);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "out of memory"));
    assert_true(secs < bound);
    /* Two threads: room for the fit with one buffer, not for two. */
    rc = train_under_ulimit(260000, "1 --threads 2", err, sizeof err, &secs, bound);
    print_message("--cores 1 --threads 2 under ulimit -v 260000: exit %d after %.1f s: %s", rc,
                  secs, err);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "out of memory: no room for OpenBLAS's work buffers"));
    assert_true(secs < bound);
}

/* The smallest limit (in steps of 10 MB) under which `--cores 1 --threads 1` trains; `--cores 2`
 * trains under it plus 20 MB (ulimit -v holds each process, and a worker needs what one process
 * fitting alone does). */
static void test_cli_cores_2_needs_what_cores_1_does(void **state) {
    (void)state;
    struct stat sb;
    if (!can_limit_address_space() || stat(CF_FASHION_MNIST_DEFAULT_DIR, &sb) != 0) skip();
    char err[4096];
    double secs;
    const double bound = 60 * par_time_scale();
    long need = 0;
    for (long kib = 150000; kib <= 600000 && !need; kib += 10000) {
        int rc = train_under_ulimit(kib, "1 --threads 1", err, sizeof err, &secs, bound);
        if (rc == 0)
            need = kib;
        else if (rc != 1 || !strstr(err, "out of memory"))
            fail_msg("--cores 1 under ulimit -v %ld: exit %d: %s", kib, rc, err);
        assert_true(secs < bound);
    }
    print_message("--cores 1 --threads 1 trains under ulimit -v %ld\n", need);
    assert_true(need > 0);
    int rc = train_under_ulimit(need + 20000, "2", err, sizeof err, &secs, bound);
    print_message("--cores 2 under ulimit -v %ld: exit %d after %.1f s%s%s", need + 20000, rc, secs,
                  rc ? ": " : "\n", rc ? err : "");
    assert_int_equal(rc, 0);
}

static void test_cli_under_ulimit(void **state) {
    (void)state;
    struct stat sb;
    if (!can_limit_address_space() || stat(CF_FASHION_MNIST_DEFAULT_DIR, &sb) != 0) skip();
    char err[4096];
    double secs;
    /* A sweep of limits from where the workers cannot get OpenBLAS's buffer (without the
     * warm-up they spun until the 120 s deadline) to where the fit has room: each run trains or
     * stops with an out-of-memory message, within seconds; at least one of each. */
    static const long kib[] = {150000, 200000, 250000, 300000, 3000000};
    const double bound = 60 * par_time_scale();
    int trained = 0, refused = 0;
    for (size_t i = 0; i < sizeof kib / sizeof kib[0]; i++) {
        int rc = train_under_ulimit(kib[i], "2", err, sizeof err, &secs, bound);
        print_message("--cores 2 under ulimit -v %ld: exit %d after %.1f s%s%s", kib[i], rc, secs,
                      rc ? ": " : "\n", rc ? err : "");
        if (rc == 0) {
            trained++;
        } else {
            if (rc != 1 || !strstr(err, "out of memory"))
                fail_msg("ulimit -v %ld: exit %d: %s", kib[i], rc, err);
            refused++;
        }
        assert_true(secs < bound);
    }
    assert_true(trained > 0);
    assert_true(refused > 0);
}

/* `corefit predict MODEL /dev/zero` and a FIFO nobody writes to: clear errors, not a process
 * that grows without end or waits for ever. */
static void test_predict_bounded_inputs(void **state) {
    (void)state;
    struct stat sb;
    if (stat(CF_FASHION_MNIST_DEFAULT_DIR, &sb) != 0) skip();
    char dir[256], cmd[2048], path[400];
    test_tmpdir_make(dir, sizeof dir, "cf_predict_");
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' train --limit 640 --epochs 1 --cores 1 --quiet --out m.safetensors "
             ">/dev/null 2>&1 && mkfifo fifo.png",
             dir, COREFIT);
    assert_int_equal(system(cmd), 0);
    const char *inputs[] = {"/dev/zero", "fifo.png"}, *want[] = {"the limit", "no writer"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && exec timeout -s KILL 60 '%s' predict m.safetensors %s >/dev/null "
                 "2>err.txt </dev/null",
                 dir, COREFIT, inputs[i]);
        double t0 = cf_now();
        int ws = system(cmd);
        double secs = cf_now() - t0;
        snprintf(path, sizeof path, "%s/err.txt", dir);
        FILE *f = fopen(path, "r");
        char err[2048] = "";
        size_t n = f ? fread(err, 1, sizeof err - 1, f) : 0;
        err[n] = '\0';
        if (f) fclose(f);
        print_message("predict %s: wait status 0x%x after %.1f s: %s", inputs[i], ws, secs, err);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 1);
        assert_non_null(strstr(err, inputs[i]));
        assert_non_null(strstr(err, want[i]));
    }
    test_tmpdir_remove(dir);
}

int main(int argc, char **argv) {
    (void)argc;
    /* As the corefit tool does: no OpenBLAS threads of its own (each maps a buffer when it
     * starts, which would leave free buffers in the pool and hide what the tests look at). */
    const char *threads = getenv("OPENBLAS_NUM_THREADS");
    if (!threads || strcmp(threads, "1") != 0) {
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        execv("/proc/self/exe", argv);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workers_without_room_for_blas_fail_clearly),
        cmocka_unit_test(test_blas_reserve),
        cmocka_unit_test(test_cli_in_process_under_ulimit),
        cmocka_unit_test(test_cli_cores_2_needs_what_cores_1_does),
        cmocka_unit_test(test_cli_under_ulimit),
        cmocka_unit_test(test_predict_bounded_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
