/* Private to the library: the writer and reader behind every state format (the optimizer's,
 * the learn layer's, the parallel runtime's envelope; src/core/bytes.c). */
#ifndef CF_CORE_BYTES_H
#define CF_CORE_BYTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "corefit/core.h"

/* A writer measures when buf is NULL or too small: `at` counts every byte put, and bytes are
 * stored only while they fit, so one pass both sizes and (given room) writes. */
typedef struct cf__writer {
    unsigned char *buf;
    size_t size, at;
} cf__writer;
void cf__put(cf__writer *w, const void *data, size_t n);
void cf__put_u64(cf__writer *w, uint64_t v);
void cf__put_f64(cf__writer *w, double v);
/* A count, then n items of elem bytes. */
void cf__put_array(cf__writer *w, const void *data, int64_t n, size_t elem);
void cf__put_str(cf__writer *w, const char *s); /* NULL writes as "" */
/* A nested blob: its length, then what export(ctx, buf, size) writes. */
void cf__put_blob(cf__writer *w, size_t (*export_fn)(const void *ctx, void *buf, size_t size),
                  const void *ctx);
/* magic (4 characters) and version */
void cf__put_header(cf__writer *w, const char magic[4], uint32_t version);

/* Runs put(obj, w) once to measure and, when buf holds that many bytes, once more to write:
 * the convention of every export function (returns the bytes needed; writes all or nothing). */
size_t cf__export(void (*put)(const void *obj, cf__writer *w), const void *obj, void *buf,
                  size_t size);

/* A reader fails once, with a message naming what it reads (`what`), the offset and the value;
 * every later read fails too, so a format reads straight through and checks r->st at the end. */
typedef struct cf__reader {
    const unsigned char *buf;
    size_t size, at;
    const char *what; /* "recorder state", ... */
    cf_status st;
} cf__reader;
cf__reader cf__reader_make(const void *buf, size_t size, const char *what);
bool cf__get(cf__reader *r, void *data, size_t n);
uint64_t cf__get_u64(cf__reader *r);
double cf__get_f64(cf__reader *r);
/* A count written by cf__put_array, checked against max and the bytes left. */
int64_t cf__get_count(cf__reader *r, const char *field, int64_t max, size_t elem);
/* The items after a count: a pointer into the buffer (not copied), NULL on failure. */
const void *cf__get_view(cf__reader *r, int64_t n, size_t elem);
/* A count and its items, copied into a new array (n + 1 items allocated); NULL on failure. */
void *cf__get_array(cf__reader *r, const char *field, int64_t max, size_t elem, int64_t *n);
char *cf__get_str(cf__reader *r, const char *field); /* allocated; NULL on failure */
/* A nested blob: returns a pointer to its bytes and sets *n. */
const void *cf__get_blob(cf__reader *r, const char *field, size_t *n);
bool cf__get_header(cf__reader *r, const char magic[4], uint32_t version);
/* A header whose version is oldest..newest (a format that still reads its older layouts): the
 * version read, or 0 on failure. */
uint32_t cf__get_header_versions(cf__reader *r, const char magic[4], uint32_t oldest,
                                 uint32_t newest);
/* Fails the reader (once) with a message about the current offset. */
bool cf__reader_fail(cf__reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fails the reader unless every byte was read. */
bool cf__get_end(cf__reader *r);

#endif
