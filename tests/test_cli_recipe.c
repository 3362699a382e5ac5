/* corefit train --recipe: `fast` trains the very model its options spelled out train (byte for
 * byte), an option given on the command line wins over the recipe's (and --bs rescales the
 * recipe's learning rate), and an unknown name is a usage error naming it. On the first
 * samples of Fashion-MNIST (--limit), one thread, so that each fit takes a second or two. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "child.h"
#include "oracle.h"

#define COREFIT CF_BUILD_DIR "/corefit"
#define FIT COREFIT " train --limit 256 --cores 1 --threads 1 --seed 3 --quiet"

static char g_dir[256];
static char out[1 << 16];

#define run(...) test_shell(g_dir, out, sizeof out, __VA_ARGS__)

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_cli_recipe_");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(g_dir);
}

/* Rows of a CSV log after its header. */
static int log_rows(const char *file) {
    if (run("tail -n +2 %s | wc -l", file) != 0) return -1;
    return atoi(out);
}

static void test_fast_is_its_options(void **state) {
    (void)state;
    if (run(FIT " --recipe fast --out fast.st --csv-log fast.csv") != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    assert_int_equal(log_rows("fast.csv"), 4);
    assert_int_equal(run(FIT " --epochs 4 --bs 128 --lr 6e-3 --label-smoothing 0.1 "
                             "--checkpoint-every 0 --out spelled.st"),
                     0);
    assert_int_equal(run("cmp fast.st spelled.st"), 0);
    /* the recipe changes the fit: without label smoothing the model differs */
    assert_int_equal(run(FIT " --epochs 4 --bs 128 --lr 6e-3 --out plain.st"), 0);
    assert_int_not_equal(run("cmp -s fast.st plain.st"), 0);
}

static void test_command_line_wins(void **state) {
    (void)state;
    if (run(FIT " --recipe fast --epochs 1 --out one.st --csv-log one.csv") != 0) {
        print_message("%s", out);
        if (strstr(out, "fashion-mnist") || strstr(out, "No such file")) skip();
        fail();
    }
    assert_int_equal(log_rows("one.csv"), 1);
    assert_int_equal(run(FIT " --epochs 1 --bs 128 --lr 6e-3 --label-smoothing 0.1 --out o.st"), 0);
    assert_int_equal(run("cmp one.st o.st"), 0);
    /* --bs 64: the recipe's learning rate scales with it (3e-3) */
    assert_int_equal(run(FIT " --recipe fast --epochs 1 --bs 64 --out b64.st"), 0);
    assert_int_equal(run(FIT " --epochs 1 --bs 64 --lr 3e-3 --label-smoothing 0.1 --out s64.st"),
                     0);
    assert_int_equal(run("cmp b64.st s64.st"), 0);
    /* an explicit --label-smoothing 0 is kept */
    assert_int_equal(run(FIT " --recipe fast --epochs 1 --label-smoothing 0 --out ls0.st"), 0);
    assert_int_equal(run(FIT " --epochs 1 --bs 128 --lr 6e-3 --out p0.st"), 0);
    assert_int_equal(run("cmp ls0.st p0.st"), 0);
}

static void test_unknown_recipe(void **state) {
    (void)state;
    assert_int_equal(run(COREFIT " train --recipe slow --epochs 1"), 2);
    assert_non_null(strstr(out, "unknown --recipe 'slow'"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_is_its_options),
        cmocka_unit_test(test_command_line_wins),
        cmocka_unit_test(test_unknown_recipe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
