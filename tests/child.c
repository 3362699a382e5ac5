#include "child.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "corefit/core.h"

test_outcome test_in_child(void (*fn)(const char *dir, test_outcome *out), const char *dir) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        test_outcome o = {0};
        fn(dir, &o);
        ssize_t w = write(p[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 1);
    }
    close(p[1]);
    test_outcome o = {0};
    ssize_t r = read(p[0], &o, sizeof o);
    close(p[0]);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (r != (ssize_t)sizeof o || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        fail_msg("the child died (status 0x%x)", ws);
    return o;
}

pid_t test_cli_start(const char *dir, const char *args, bool own_group) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && exec '%s/corefit' %s >out.txt 2>err.txt </dev/null", dir,
             CF_BUILD_DIR, args);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (own_group) setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    if (own_group) setpgid(pid, pid); /* either side may win the race */
    return pid;
}

int test_cli_wait(pid_t pid) {
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int test_cli_run(const char *dir, const char *args) {
    return test_cli_wait(test_cli_start(dir, args, false));
}

char *test_read_in(const char *dir, const char *name, size_t *n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    void *data = NULL;
    size_t size = 0;
    if (cf_read_file(path, (size_t)1 << 30, &data, &size) != CF_OK) return NULL;
    if (n) *n = size;
    return data;
}

static int saved_stderr = -1;
static FILE *captured;

void test_stderr_capture(void) {
    fflush(stderr);
    captured = tmpfile();
    assert_non_null(captured);
    saved_stderr = dup(2);
    assert_true(saved_stderr >= 0);
    assert_true(dup2(fileno(captured), 2) >= 0);
}

char *test_stderr_release(void) {
    fflush(stderr);
    assert_true(dup2(saved_stderr, 2) >= 0);
    close(saved_stderr);
    saved_stderr = -1;
    long n = ftell(captured);
    char *text = calloc((size_t)(n > 0 ? n : 0) + 1, 1);
    assert_non_null(text);
    rewind(captured);
    if (n > 0) assert_int_equal(fread(text, 1, (size_t)n, captured), (size_t)n);
    fclose(captured);
    captured = NULL;
    return text;
}

int test_shell(const char *dir, char *out, size_t size, const char *fmt, ...) {
    char cmd[8192], full[8600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "cd %s && %s 2>&1", dir, cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void test_write_in(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

long test_vm_size_bytes(void) {

    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld", &kib) == 1) break;
    if (f) fclose(f);
    return kib * 1024;
}
