/* The writer and reader behind the library's state formats (the optimizer's; the recorder,
 * lr_find result, predictions, trackers and learner state of the learn layer; the parallel
 * runtime's envelope): bounds-checked, and every failure names what was
 * read, where, and the value. Formats are in host byte order: they move state between processes
 * of one program (parallel fits, MPI ranks, roll-backs), not files between machines. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/bytes.h"

void cf__put(cf__writer *w, const void *data, size_t n) {
    if (w->buf && w->at <= w->size && n <= w->size - w->at && n) memcpy(w->buf + w->at, data, n);
    w->at += n;
}
void cf__put_u64(cf__writer *w, uint64_t v) {
    cf__put(w, &v, sizeof v);
}
void cf__put_f64(cf__writer *w, double v) {
    cf__put(w, &v, sizeof v);
}
void cf__put_array(cf__writer *w, const void *data, int64_t n, size_t elem) {
    if (n < 0 || !data) n = 0;
    cf__put_u64(w, (uint64_t)n);
    cf__put(w, data, (size_t)n * elem);
}
void cf__put_str(cf__writer *w, const char *s) {
    if (!s) s = "";
    cf__put_array(w, s, (int64_t)strlen(s), 1);
}
void cf__put_blob(cf__writer *w, size_t (*export_fn)(const void *ctx, void *buf, size_t size),
                  const void *ctx) {
    size_t len_at = w->at;
    cf__put_u64(w, 0);
    bool room = w->buf && w->at <= w->size;
    size_t n = export_fn(ctx, room ? w->buf + w->at : NULL, room ? w->size - w->at : 0);
    if (room && n <= w->size - w->at) {
        uint64_t len = n;
        memcpy(w->buf + len_at, &len, sizeof len);
    }
    w->at += n;
}
void cf__put_header(cf__writer *w, const char magic[4], uint32_t version) {
    cf__put(w, magic, 4);
    cf__put(w, &version, sizeof version);
}

size_t cf__export(void (*put)(const void *obj, cf__writer *w), const void *obj, void *buf,
                  size_t size) {
    cf__writer w = {NULL, 0, 0};
    put(obj, &w);
    if (!buf || size < w.at) return w.at;
    cf__writer out = {buf, size, 0};
    put(obj, &out);
    return out.at;
}

cf__reader cf__reader_make(const void *buf, size_t size, const char *what) {
    cf__reader r = {buf, buf ? size : 0, 0, what, CF_OK};
    return r;
}

bool cf__reader_fail(cf__reader *r, const char *fmt, ...) {
    if (r->st != CF_OK) return false;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->st = cf_fail(CF_ERR_INVALID, "%s: offset %zu: %s", r->what, r->at, msg);
    return false;
}

bool cf__get(cf__reader *r, void *data, size_t n) {
    if (r->st != CF_OK) return false;
    if (n > r->size - r->at)
        return cf__reader_fail(r, "needs %zu bytes, %zu left of %zu", n, r->size - r->at, r->size);
    if (n) memcpy(data, r->buf + r->at, n);
    r->at += n;
    return true;
}
uint64_t cf__get_u64(cf__reader *r) {
    uint64_t v = 0;
    cf__get(r, &v, sizeof v);
    return v;
}
double cf__get_f64(cf__reader *r) {
    double v = 0;
    cf__get(r, &v, sizeof v);
    return v;
}

int64_t cf__get_count(cf__reader *r, const char *field, int64_t max, size_t elem) {
    size_t at = r->at;
    uint64_t n = cf__get_u64(r);
    if (r->st != CF_OK) return 0;
    if (n > (uint64_t)max) {
        r->at = at;
        cf__reader_fail(r, "%s count %llu exceeds the %lld allowed", field, (unsigned long long)n,
                        (long long)max);
        return 0;
    }
    if (elem && n > (r->size - r->at) / elem) {
        r->at = at;
        cf__reader_fail(r, "%s count %llu needs %llu bytes, %zu left", field, (unsigned long long)n,
                        (unsigned long long)(n * elem), r->size - r->at - 8);
        return 0;
    }
    return (int64_t)n;
}

const void *cf__get_view(cf__reader *r, int64_t n, size_t elem) {
    if (r->st != CF_OK || n < 0) return NULL;
    size_t bytes = (size_t)n * elem;
    if (bytes > r->size - r->at) {
        cf__reader_fail(r, "needs %zu bytes, %zu left", bytes, r->size - r->at);
        return NULL;
    }
    const void *p = r->buf + r->at;
    r->at += bytes;
    return p;
}

void *cf__get_array(cf__reader *r, const char *field, int64_t max, size_t elem, int64_t *n) {
    *n = cf__get_count(r, field, max, elem);
    if (r->st != CF_OK) return NULL;
    void *a = cf_calloc((size_t)*n + 1, elem);
    if (!a) {
        r->st = cf_fail(CF_ERR_NOMEM, "%s: %s of %lld items", r->what, field, (long long)*n);
        return NULL;
    }
    cf__get(r, a, (size_t)*n * elem);
    return a;
}

char *cf__get_str(cf__reader *r, const char *field) {
    int64_t n = 0;
    char *s = cf__get_array(r, field, (int64_t)1 << 20, 1, &n);
    if (s && memchr(s, 0, (size_t)n)) {
        cf__reader_fail(r, "%s holds a NUL byte", field);
        cf_free(s);
        return NULL;
    }
    if (r->st != CF_OK) {
        cf_free(s);
        return NULL;
    }
    return s;
}

const void *cf__get_blob(cf__reader *r, const char *field, size_t *n) {
    *n = (size_t)cf__get_count(r, field, INT64_MAX, 1);
    const void *p = cf__get_view(r, (int64_t)*n, 1);
    if (!p) *n = 0;
    return p;
}

bool cf__get_header(cf__reader *r, const char magic[4], uint32_t version) {
    return cf__get_header_versions(r, magic, version, version) != 0;
}

uint32_t cf__get_header_versions(cf__reader *r, const char magic[4], uint32_t oldest,
                                 uint32_t newest) {
    char m[4] = {0};
    uint32_t v = 0;
    if (!cf__get(r, m, 4)) return 0;
    if (memcmp(m, magic, 4) != 0) {
        r->at = 0;
        cf__reader_fail(r, "magic \"%.4s\" is not \"%.4s\"",
                        (m[0] >= 32 && m[0] < 127) ? m : "????", magic);
        return 0;
    }
    if (!cf__get(r, &v, sizeof v)) return 0;
    if (v < oldest || v > newest) {
        r->at = 4;
        if (oldest == newest)
            cf__reader_fail(r, "version %u (this build reads %u)", v, newest);
        else
            cf__reader_fail(r, "version %u (this build reads %u to %u)", v, oldest, newest);
        return 0;
    }
    return v;
}

bool cf__get_end(cf__reader *r) {
    if (r->st != CF_OK) return false;
    if (r->at != r->size)
        return cf__reader_fail(r, "%zu bytes left over after the end of the state",
                               r->size - r->at);
    return true;
}
