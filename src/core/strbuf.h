/* Private to the library: a growing NUL-terminated string (src/core/strbuf.c). An allocation
 * failure is remembered rather than returned, so a string is built straight through and checked
 * once, when it is taken. */
#ifndef CF_CORE_STRBUF_H
#define CF_CORE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

/* Zero-initialised ({0}) it is empty. */
typedef struct cf__strbuf {
    char *s; /* NUL-terminated once anything was put; NULL before */
    size_t n, cap;
    bool failed; /* an allocation failed: later puts do nothing */
} cf__strbuf;

/* Appends n bytes of s. */
void cf__strbuf_put(cf__strbuf *b, const char *s, size_t n);
/* Appends the string s. */
void cf__strbuf_str(cf__strbuf *b, const char *s);
/* The string built (an empty one when nothing was put), for the caller to cf_free, and b empty
 * again; NULL when an allocation failed (the string is freed). */
char *cf__strbuf_take(cf__strbuf *b);
/* Frees the string and empties b. */
void cf__strbuf_free(cf__strbuf *b);

#endif
