/* CF_TIMING=1: corefit train reports its phases, each fit its loop's phases (each fork worker
 * its own, with its rank), each fork worker its time in barriers, and an in-process fit on two
 * threads its thread pool's jobs and sleeps, both sides' parts and the serial gaps between jobs;
 * without it none of that is printed. On the first 256 samples of
 * Fashion-MNIST, one epoch. */
#include <stdlib.h>

#define CLI_FIXTURE_PREFIX "cf_cli_timing_"
#include "cli_fixture.h"

#define FIT COREFIT " train --limit 256 --epochs 1 --bs 32 --seed 3 --quiet --out m.st"

/* The fit's phase lines (who: "" or " (rank R)"): its wall and CPU seconds, the training
 * batches' forward, backward and steps counted (train_batches each) and timed, the validation
 * batches' forwards counted, no backward there. */
static void check_fit_phases(const char *who, int train_batches) {
    char key[96];
    double wall, cpu;
    snprintf(key, sizeof key, "timing: fit%s: wall ", who);
    const char *at = strstr(out, key);
    assert_non_null(at);
    assert_int_equal(sscanf(at + strlen(key), "%lf s, CPU %lf s", &wall, &cpu), 2);
    assert_true(wall > 0 && cpu > 0);
    snprintf(key, sizeof key, "timing: fit%s train (wall/CPU s, calls): ", who);
    at = strstr(out, key);
    assert_non_null(at);
    double fw, fc, bw, bc;
    long fn, bn;
    const char *f = strstr(at, " forward ");
    const char *b = strstr(at, " backward ");
    assert_non_null(f);
    assert_non_null(b);
    assert_int_equal(sscanf(f, " forward %lf/%lf %ld,", &fw, &fc, &fn), 3);
    assert_int_equal(sscanf(b, " backward %lf/%lf %ld,", &bw, &bc, &bn), 3);
    assert_int_equal(fn, train_batches);
    assert_int_equal(bn, train_batches);
    assert_true(fw > 0 && bw > 0 && fw <= wall && bw <= wall);
    const char *st = strstr(at, " step ");
    long sn;
    assert_non_null(st);
    assert_int_equal(sscanf(st, " step %*f/%*f %ld,", &sn), 1);
    assert_int_equal(sn, 2 * train_batches); /* the step and zero_grad */
    snprintf(key, sizeof key, "timing: fit%s valid (wall/CPU s, calls): ", who);
    at = strstr(out, key);
    assert_non_null(at);
    f = strstr(at, " forward ");
    b = strstr(at, " backward ");
    assert_int_equal(sscanf(f, " forward %lf/%lf %ld,", &fw, &fc, &fn), 3);
    assert_true(fn > 0 && fw > 0);
    assert_int_equal(sscanf(b, " backward %lf/%lf %ld,", &bw, &bc, &bn), 3);
    assert_int_equal(bn, 0);
}

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
    /* 256 training images on 2 workers, 32 a batch each: 4 batches a worker */
    check_fit_phases(" (rank 0)", 4);
    check_fit_phases(" (rank 1)", 4);
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
    double caller, caller_cpu, workers, workers_cpu, gaps, gaps_cpu;
    const char *parts = strstr(at, "parts: the caller's ");
    assert_non_null(parts);
    assert_int_equal(
        sscanf(parts,
               "parts: the caller's %lf s (CPU %lf s), the workers' %lf s (CPU %lf s); "
               "the caller's serial gaps between jobs (each under 5 ms) %lf s (CPU, each under "
               "as much CPU time: %lf s)",
               &caller, &caller_cpu, &workers, &workers_cpu, &gaps, &gaps_cpu),
        6);
    assert_true(caller > 0 && caller_cpu > 0 && workers > 0 && workers_cpu > 0 && gaps >= 0);
    /* the serial work between jobs takes CPU time (the head's layers, the loss, Adam) */
    assert_true(gaps_cpu > 0);
    assert_null(strstr(out, "timing: worker"));
    check_fit_phases("", 8);
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
