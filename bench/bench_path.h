/* Where the benchmarks find their data: the folders bench/run.py makes beside the build's
 * programs (BUILD/w3-images beside BUILD/bench_images, ...). */
#ifndef CF_BENCH_PATH_H
#define CF_BENCH_PATH_H

#include <libgen.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

/* out = the folder `name` beside this program (or in the working directory when /proc/self/exe
 * cannot be read). */
static inline void bench_beside_self(const char *name, char *out, size_t size) {
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    snprintf(out, size, "%s/%s", len > 0 ? dirname(self) : ".", name);
}

#endif
