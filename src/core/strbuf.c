/* The library's one string builder (src/core/strbuf.h). */
#include "core/strbuf.h"

#include <string.h>

#include "corefit/core.h"

void cf__strbuf_put(cf__strbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *grown = cf_malloc(cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        if (b->s) memcpy(grown, b->s, b->n);
        cf_free(b->s);
        b->s = grown;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void cf__strbuf_str(cf__strbuf *b, const char *s) {
    cf__strbuf_put(b, s, strlen(s));
}

char *cf__strbuf_take(cf__strbuf *b) {
    if (!b->failed && !b->s) cf__strbuf_put(b, "", 0);
    char *s = b->failed ? NULL : b->s;
    if (!s) cf_free(b->s);
    *b = (cf__strbuf){0};
    return s;
}

void cf__strbuf_free(cf__strbuf *b) {
    cf_free(b->s);
    *b = (cf__strbuf){0};
}
