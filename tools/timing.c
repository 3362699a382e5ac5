/* CF_TIMING=1: corefit train prints on stderr, at each step of the command, the seconds since
 * the process started (the kernel's start time, so loading the program counts) and the CPU
 * seconds of the process so far (its threads; fork workers report their own at their end,
 * src/par/launch.c). bench/scaling.py passes it on with --env CF_TIMING=1. */
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Seconds since this process started, or -1 where /proc is not there. */
static double since_start(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* fields after the command name (which may hold spaces) begin after the last ')' */
    char *p = strrchr(buf, ')');
    if (!p) return -1;
    unsigned long long start = 0;
    /* field 22 (starttime) is the 20th after the name: state is field 3 */
    if (sscanf(p + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
               &start) != 1)
        return -1;
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9 - (double)start / (double)sysconf(_SC_CLK_TCK);
}

void cli_timing(const char *what) {
    const char *e = getenv("CF_TIMING");
    if (!e || strcmp(e, "1") != 0) return;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
                 (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
    fprintf(stderr, "timing: %s at %.3f s since the start, this process's CPU %.3f s\n", what,
            since_start(), cpu);
}
