/* The fixture of the command-line tests that run their commands in one temporary folder (one
 * per cmocka group): g_dir, made by setup and removed by teardown (the group's fixture); out,
 * the last command's stdout and stderr; run(fmt, ...), a shell command in g_dir (its exit
 * status); and COREFIT, the tool's path. The including file defines CLI_FIXTURE_PREFIX, the
 * folder's name prefix, first. */
#ifndef CF_TEST_CLI_FIXTURE_H
#define CF_TEST_CLI_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "child.h"
#include "oracle.h"

#ifndef CLI_FIXTURE_PREFIX
#error "define CLI_FIXTURE_PREFIX (the temporary folder's name prefix) before cli_fixture.h"
#endif

#define COREFIT CF_BUILD_DIR "/corefit"

static char g_dir[256];
static char out[1 << 16];

/* Runs a shell command in g_dir; its output (stdout and stderr) into out; the exit status. */
#define run(...) test_shell(g_dir, out, sizeof out, __VA_ARGS__)

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(g_dir, sizeof g_dir, CLI_FIXTURE_PREFIX);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(g_dir);
}

/* Runs cmd, a `corefit fmnist-tasks` command line: on failure prints its output and skips the
 * test where the tool cannot write images (built without stb_image_write) or has no
 * Fashion-MNIST, and fails it otherwise. */
static inline void run_fmnist_tasks(const char *cmd) {
    if (run("%s", cmd) != 0) {
        print_message("%s", out);
        if (strstr(out, "stb_image_write") || strstr(out, "Fashion-MNIST")) skip();
        fail();
    }
}

#endif
