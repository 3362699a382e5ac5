/* CF_TIMING=1's serial gaps in thread CPU time (core/threads.c) count only between jobs that one
 * thread of one process dispatched: a job dispatched from a second thread, or from a fork child
 * (whose thread CPU clock restarts at zero), right after a caller that had used a lot of CPU
 * must not add a negative gap (which would wrap to 1.8e10 seconds in the report). The scenario
 * runs in a child process of this test with CF_TIMING=1; the test reads its report. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corefit/core.h"

static void no_work(void *ctx, int64_t begin, int64_t end, int part) {
    (void)ctx, (void)begin, (void)end, (void)part;
}

static void *dispatch_once(void *arg) {
    (void)arg;
    cf_parallel_for(4, no_work, NULL);
    return NULL;
}

/* 0.2 s of this thread's CPU, then a job (the pool's last caller CPU clock about 2e8 ns), then a
 * job from a new thread (its clock near zero) or a fork child's. */
static int scenario(bool fork_child) {
    cf_set_num_threads(2);
    struct timespec t;
    do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    while (t.tv_sec == 0 && t.tv_nsec < 200000000);
    cf_parallel_for(4, no_work, NULL);
    if (fork_child) {
        const pid_t pid = fork();
        if (pid == 0) {
            cf_parallel_for(4, no_work, NULL);
            return 0;
        }
        int status;
        waitpid(pid, &status, 0);
        return 0;
    }
    pthread_t other;
    pthread_create(&other, NULL, dispatch_once, NULL);
    pthread_join(other, NULL);
    return 0;
}

/* Runs the scenario in a child with CF_TIMING=1; every reported CPU gap total must be small. */
static void check_gaps(const char *mode) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "CF_TIMING=1 /proc/%d/exe %s 2>&1", (int)getpid(), mode);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[4096];
    int reports = 0;
    while (fgets(line, sizeof line, p)) {
        /* the pool's total, and each job function's "gap-cpu" */
        const char *at = strstr(line, "as much CPU time: "), *fn = strstr(line, " gap-cpu ");
        if (!at && !fn) continue;
        const double gap_cpu =
            at ? atof(at + strlen("as much CPU time: ")) : atof(fn + strlen(" gap-cpu "));
        if (!(gap_cpu >= 0 && gap_cpu <= 1.0)) /* NaN fails too */
            fail_msg("%s: the serial gaps' CPU time is %.3f s in a run of 0.2 s: %s", mode, gap_cpu,
                     line);
        reports++;
    }
    assert_int_equal(pclose(p), 0);
    assert_true(reports >= 2); /* the report and a job function's line, parsed */
}

static void test_second_thread(void **state) {
    (void)state;
    check_gaps("thread");
}

static void test_fork_child(void **state) {
    (void)state;
    check_gaps("fork");
}

int main(int argc, char **argv) {
    if (argc > 1) return scenario(strcmp(argv[1], "fork") == 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_thread),
        cmocka_unit_test(test_fork_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
