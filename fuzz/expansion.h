/* The expansion-ratio check of the fuzz targets: what a reader still holds after reading n input
 * bytes (its result) may not exceed ratio * n + slack bytes, so that a small hostile input can
 * never make a reader allocate out of proportion to it. The heap is measured with the
 * sanitizer's allocator (the targets are built with -fsanitize=address); a breach aborts, which
 * libFuzzer reports as a crash with the input that caused it. fuzz/run also runs every target
 * under -rss_limit_mb and -malloc_limit_mb, which catch a single huge allocation or a peak. */
#ifndef CF_FUZZ_EXPANSION_H
#define CF_FUZZ_EXPANSION_H

#include <sanitizer/allocator_interface.h>
#include <stdio.h>
#include <stdlib.h>

static size_t expansion_base;

static void expansion_begin(void) {
    expansion_base = __sanitizer_get_current_allocated_bytes();
}

static void expansion_check(const char *what, size_t n, double ratio, size_t slack) {
    size_t now = __sanitizer_get_current_allocated_bytes();
    size_t held = now > expansion_base ? now - expansion_base : 0;
    if ((double)held > ratio * (double)n + (double)slack) {
        fprintf(stderr, "expansion: %s holds %zu bytes after reading %zu (limit %g x + %zu)\n",
                what, held, n, ratio, slack);
        abort();
    }
}

#endif
