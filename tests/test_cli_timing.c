/* CF_TIMING=1: corefit train reports its phases, each fork worker its time in barriers, and an
 * in-process fit on two threads its thread pool's jobs and sleeps, both sides' parts and the
 * serial gaps between jobs; without it none of that is printed. On the first 256 samples of
 * Fashion-MNIST, one epoch. */
#include <stdlib.h>

#define CLI_FIXTURE_PREFIX "cf_cli_timing_"
#include "cli_fixture.h"

#define FIT COREFIT " train --limit 256 --epochs 1 --bs 32 --seed 3 --quiet --out m.st"

static void test_fork_workers(void **state) {
    (void)state;
    if (run("CF_TIMING=1 " FIT " --cores 2") != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    assert_non_null(strstr(out, "timing: data and model ready at "));
    assert_non_null(strstr(out, "timing: fit done (results home) at "));
    assert_non_null(strstr(out, "timing: model saved at "));
    /* both workers, with a positive number of barriers (8 steps, each passes several) */
    for (int r = 0; r < 2; r++) {
        char key[32];
        snprintf(key, sizeof key, "timing: worker %d: start ", r);
        const char *at = strstr(out, key);
        assert_non_null(at);
        const char *in = strstr(at, " s in ");
        assert_non_null(in);
        assert_true(atoi(in + 6) >= 8);
    }
    /* no pool: the workers run one thread each */
    assert_null(strstr(out, "timing: thread pool"));
}

static void test_thread_pool(void **state) {
    (void)state;
    if (run("CF_TIMING=1 " FIT " --cores 1 --threads 2") != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    const char *at = strstr(out, "timing: thread pool (2 threads): ");
    assert_non_null(at);
    assert_true(atoi(at + strlen("timing: thread pool (2 threads): ")) > 0); /* jobs */
    /* both sides' parts took time, in wall and in thread CPU seconds; the gaps are reported */
    double caller, caller_cpu, workers, workers_cpu, gaps;
    const char *parts = strstr(at, "parts: the caller's ");
    assert_non_null(parts);
    assert_int_equal(
        sscanf(parts,
               "parts: the caller's %lf s (CPU %lf s), the workers' %lf s (CPU %lf s); "
               "the caller's serial gaps between jobs (each under 5 ms) %lf s",
               &caller, &caller_cpu, &workers, &workers_cpu, &gaps),
        5);
    assert_true(caller > 0 && caller_cpu > 0 && workers > 0 && workers_cpu > 0 && gaps >= 0);
    assert_null(strstr(out, "timing: worker"));
}

static void test_off_by_default(void **state) {
    (void)state;
    if (run("env -u CF_TIMING " FIT " --cores 1 --threads 2") != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    assert_null(strstr(out, "timing:"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_workers),
        cmocka_unit_test(test_thread_pool),
        cmocka_unit_test(test_off_by_default),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
