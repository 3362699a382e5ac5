/* Running things apart from the test process: a function in a forked child that reports an
 * outcome, and the corefit command line in a folder. */
#ifndef CF_TEST_CHILD_H
#define CF_TEST_CHILD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* What a child reports: status (the test's own meaning; -1 skipped by convention) and a
 * message. */
typedef struct test_outcome {
    int status;
    char msg[1024];
} test_outcome;

/* Runs fn(dir, &outcome) in a forked child (so that it may set resource limits, mount
 * namespaces or signal handlers of its own) and returns the outcome it reported; fails the test
 * when the child died without reporting. */
test_outcome test_in_child(void (*fn)(const char *dir, test_outcome *out), const char *dir);

/* Starts `corefit <args>` (the build's) in dir, stdout and stderr to out.txt and err.txt there,
 * stdin from /dev/null, in a process group of its own when own_group; returns its pid. */
pid_t test_cli_start(const char *dir, const char *args, bool own_group);
/* Waits for pid: its exit status, or 128 + the signal that ended it. */
int test_cli_wait(pid_t pid);
/* test_cli_start and test_cli_wait. */
int test_cli_run(const char *dir, const char *args);
/* Runs the shell command printf(fmt, ...) in dir, its stdout and stderr into out (size bytes,
 * NUL-terminated, cut when longer); returns its exit status (-1 when a signal ended it). */
int test_shell(const char *dir, char *out, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Writes text to dir/name (replacing it); fails the test when it cannot. */
void test_write_in(const char *dir, const char *name, const char *text);
/* The whole of dir/name (NULL when it cannot be read); *n its size when n. cf_free it. */
char *test_read_in(const char *dir, const char *name, size_t *n);

/* What this process writes to stderr between test_stderr_capture and test_stderr_release goes
 * to a temporary file instead; release restores stderr and returns the text (free it). */
void test_stderr_capture(void);
char *test_stderr_release(void);

/* The calling process's virtual memory size (VmSize of /proc/self/status) in bytes; -1024 when
 * unreadable. For address-space limits (RLIMIT_AS) a little above what is mapped already. */
long test_vm_size_bytes(void);

#endif
