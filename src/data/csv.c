/* CSV tables (RFC 4180 quoting): parsing and column lookup. What the cells mean is for their
 * readers (tabular.c, image_csv.c). */
#include "data_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CF_CSV_MAX_BYTES ((int64_t)1 << 34)

void cf_csv_table_free(cf_csv_table *t) {
    if (!t) return;
    cf_free(t->header);
    cf_free(t->cells);
    cf_free(t->row_line);
    cf_free(t->source);
    cf_free(t->text);
    cf_free(t);
}

typedef struct ptrvec {
    char **v;
    int64_t n, cap;
} ptrvec;

static bool ptrvec_push(ptrvec *p, char *s) {
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 256;
        char **v = cf_malloc((size_t)cap * sizeof *v);
        if (!v) return false;
        if (p->n) memcpy(v, p->v, (size_t)p->n * sizeof *v);
        cf_free(p->v);
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = s;
    return true;
}

/* Parses text[0..size) into *out. With max_rows > 0, parsing stops after that many rows (the
 * rest of the text is not looked at). With more_follows, the text is a prefix of a longer one: a
 * row that reaches its end without a line break may be cut, so instead of a table *incomplete
 * is set (the caller reads more and parses again). */
static cf_status parse_rows(const char *text, size_t size, const char *name, char delimiter,
                            int64_t max_rows, bool more_follows, cf_csv_table **out,
                            bool *incomplete) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_csv_parse_buffer: out is NULL");
    *out = NULL;
    *incomplete = false;
    if (!name) name = "CSV";
    if (!delimiter) delimiter = ',';
    if (!text && size) return cf_fail(CF_ERR_INVALID, "%s: NULL text", name);
    if (delimiter == '"' || delimiter == '\n' || delimiter == '\r')
        return cf_fail(CF_ERR_INVALID, "%s: delimiter 0x%02x is not allowed", name,
                       (unsigned char)delimiter);
    cf_csv_table *t = cf_calloc(1, sizeof *t);
    if (!t) return CF_ERR_NOMEM;
    t->text = cf_malloc(size + 1);
    t->source = cf_strdup(name);
    ptrvec cells = {0};
    int64_t *lines = NULL, lines_cap = 0, n_rows = 0;
    cf_status st = CF_OK;
    if (!t->text || !t->source) {
        st = CF_ERR_NOMEM;
        goto fail;
    }
    if (size) memcpy(t->text, text, size);
    t->text[size] = '\0';
    char *buf = t->text;
    size_t r = 0, w = 0;
    const char *nul = size ? memchr(t->text, '\0', size) : NULL;
    size_t nul_at = nul ? (size_t)(nul - t->text) : 0;
    if (nul && max_rows > 0) {
        /* the rows wanted may all come before it: parse up to it, and say so if they do not */
        size = nul_at;
        more_follows = true;
    } else if (nul) {
        /* A field would silently end there: binary data, or a text in UTF-16. */
        size_t at = (size_t)(nul - t->text);
        int64_t nul_line = 1;
        for (size_t i = 0; i < at; i++) nul_line += t->text[i] == '\n';
        st = cf_fail(CF_ERR_FORMAT,
                     "%s: line %lld, byte offset %zu: a NUL byte (binary data or UTF-16, not a "
                     "CSV text)",
                     name, (long long)nul_line, at);
        goto fail;
    }
    if (size >= 3 && (unsigned char)buf[0] == 0xEF && (unsigned char)buf[1] == 0xBB &&
        (unsigned char)buf[2] == 0xBF)
        r = w = 3; /* UTF-8 byte order mark */
    int64_t line = 1;
    int n_cols = -1;
    while (r < size) {
        /* One row. Completely empty lines are skipped (as pandas does). */
        if (buf[r] == '\n' || (buf[r] == '\r' && r + 1 < size && buf[r + 1] == '\n')) {
            r += buf[r] == '\r' ? 2 : 1;
            line++;
            continue;
        }
        int64_t row_start_line = line, row_first_cell = cells.n;
        bool row_done = false;
        while (!row_done) {
            char *field = buf + w;
            if (r < size && buf[r] == '"') {
                int64_t quote_line = line;
                size_t r0 = r;
                r++;
                for (;;) {
                    if (r >= size && more_follows) {
                        st = CF_ERR_FORMAT;
                        goto incomplete;
                    }
                    if (r >= size) {
                        st = cf_fail(CF_ERR_FORMAT,
                                     "%s: line %lld: a quoted field opened at byte offset %zu is "
                                     "never closed",
                                     name, (long long)quote_line, r0);
                        goto fail;
                    }
                    if (buf[r] == '"') {
                        if (r + 1 < size && buf[r + 1] == '"') {
                            buf[w++] = '"';
                            r += 2;
                            continue;
                        }
                        r++;
                        break;
                    }
                    if (buf[r] == '\n') line++;
                    buf[w++] = buf[r++];
                }
                if (r < size && buf[r] != delimiter && buf[r] != '\n' &&
                    !(buf[r] == '\r' && r + 1 < size && buf[r + 1] == '\n') &&
                    !(buf[r] == '\r' && r + 1 == size)) {
                    st = cf_fail(CF_ERR_FORMAT,
                                 "%s: line %lld, byte offset %zu: unexpected character '%c' after "
                                 "a closing quote",
                                 name, (long long)line, r,
                                 isprint((unsigned char)buf[r]) ? buf[r] : '?');
                    goto fail;
                }
            } else {
                while (r < size && buf[r] != delimiter && buf[r] != '\n' &&
                       !(buf[r] == '\r' && (r + 1 == size || buf[r + 1] == '\n')))
                    buf[w++] = buf[r++];
            }
            /* End of field: delimiter, end of line or end of text. */
            if (r < size && buf[r] == delimiter) {
                r++;
            } else {
                if (r < size && buf[r] == '\r') r++;
                if (r < size && buf[r] == '\n') {
                    r++;
                    line++;
                } else if (more_follows) { /* the row may go on past the text read */
                    st = CF_ERR_FORMAT;
                    goto incomplete;
                }
                row_done = true;
            }
            buf[w++] = '\0'; /* w <= r here, except for a final field without newline */
            if (!ptrvec_push(&cells, field)) {
                st = CF_ERR_NOMEM;
                goto fail;
            }
        }
        int got = (int)(cells.n - row_first_cell);
        if (cells.n - row_first_cell > 1000000) {
            st = cf_fail(CF_ERR_FORMAT, "%s: line %lld has more than 10^6 fields", name,
                         (long long)row_start_line);
            goto fail;
        }
        if (n_cols < 0) {
            n_cols = got;
        } else if (got != n_cols) {
            st = cf_fail(CF_ERR_FORMAT, "%s: line %lld has %d fields, the header has %d", name,
                         (long long)row_start_line, got, n_cols);
            goto fail;
        } else {
            if (n_rows == lines_cap) {
                int64_t cap = lines_cap ? lines_cap * 2 : 256;
                int64_t *nl = cf_malloc((size_t)cap * sizeof *nl);
                if (!nl) {
                    st = CF_ERR_NOMEM;
                    goto fail;
                }
                if (n_rows) memcpy(nl, lines, (size_t)n_rows * sizeof *nl);
                cf_free(lines);
                lines = nl;
                lines_cap = cap;
            }
            lines[n_rows++] = row_start_line;
            if (max_rows > 0 && n_rows == max_rows) break;
        }
    }
    if (more_follows && (max_rows <= 0 || n_rows < max_rows)) {
        st = CF_ERR_FORMAT;
        goto incomplete;
    }
    if (n_cols < 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s: empty, no header row", name);
        goto fail;
    }
    /* The last field may have been terminated one byte past the copy: it has room (size + 1). */
    t->n_cols = n_cols;
    t->n_rows = n_rows;
    t->header = cf_malloc((size_t)n_cols * sizeof(char *));
    t->cells = cf_malloc((size_t)(n_rows * n_cols > 0 ? n_rows * n_cols : 1) * sizeof(char *));
    t->row_line = lines ? lines : cf_malloc(sizeof(int64_t));
    lines = NULL;
    if (!t->header || !t->cells || !t->row_line) {
        st = CF_ERR_NOMEM;
        goto fail;
    }
    memcpy(t->header, cells.v, (size_t)n_cols * sizeof(char *));
    if (n_rows) memcpy(t->cells, cells.v + n_cols, (size_t)(n_rows * n_cols) * sizeof(char *));
    cf_free(cells.v);
    *out = t;
    return CF_OK;
incomplete:
    if (nul) { /* the rows wanted do not all come before the NUL byte */
        int64_t nul_line = 1;
        for (size_t i = 0; i < nul_at; i++) nul_line += text[i] == '\n';
        st = cf_fail(CF_ERR_FORMAT,
                     "%s: line %lld, byte offset %zu: a NUL byte (binary data or UTF-16, not a "
                     "CSV text)",
                     name, (long long)nul_line, nul_at);
    } else {
        *incomplete = true;
        st = CF_OK;
    }
fail:
    cf_free(cells.v);
    cf_free(lines);
    cf_csv_table_free(t);
    return st == CF_ERR_NOMEM ? cf_fail(CF_ERR_NOMEM, "%s: out of memory parsing CSV", name) : st;
}

cf_status cf_csv_parse_buffer(const char *text, size_t size, const char *name, char delimiter,
                              cf_csv_table **out) {
    bool incomplete;
    return parse_rows(text, size, name, delimiter, 0, false, out, &incomplete);
}

cf_status cf_csv_read(const char *path, char delimiter, cf_csv_table **out) {
    if (!out || !path) return cf_fail(CF_ERR_INVALID, "cf_csv_read: NULL argument");
    *out = NULL;
    char *buf;
    size_t got;
    cf_status rd = cf_read_file(path, (size_t)CF_CSV_MAX_BYTES, (void **)&buf, &got);
    if (rd != CF_OK) return rd;
    cf_status st = cf_csv_parse_buffer(buf, got, path, delimiter, out);
    cf_free(buf);
    return st;
}

/* The first bytes of a file read for cf_csv_read_first; doubled until the rows are in. */
#define CF_CSV_FIRST_CHUNK ((size_t)1 << 20)

cf_status cf_csv_read_first(const char *path, char delimiter, int64_t max_rows, cf_csv_table **out,
                            bool *rest_unread) {
    if (!out || !path) return cf_fail(CF_ERR_INVALID, "cf_csv_read_first: NULL argument");
    *out = NULL;
    if (rest_unread) *rest_unread = false;
    if (max_rows <= 0) return cf_csv_read(path, delimiter, out);
    struct stat sb;
    FILE *f = NULL;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) f = fopen(path, "rb");
    if (!f) {
        /* not a regular file (a pipe, a FIFO): read whole, but keep only the rows wanted */
        char *buf;
        size_t got;
        cf_status rd = cf_read_file(path, (size_t)CF_CSV_MAX_BYTES, (void **)&buf, &got);
        if (rd != CF_OK) return rd;
        bool incomplete;
        cf_status st = parse_rows(buf, got, path, delimiter, max_rows, false, out, &incomplete);
        if (st == CF_OK && rest_unread) *rest_unread = (*out)->n_rows == max_rows;
        cf_free(buf);
        return st;
    }
    char *buf = NULL;
    size_t len = 0, cap = CF_CSV_FIRST_CHUNK;
    bool at_end = false;
    cf_status st = CF_OK;
    for (;;) {
        char *grown = cf_malloc(cap);
        if (!grown) {
            st = cf_fail(CF_ERR_NOMEM, "reading %s: out of memory at %zu bytes", path, cap);
            break;
        }
        if (len) memcpy(grown, buf, len);
        cf_free(buf);
        buf = grown;
        len += fread(buf + len, 1, cap - len, f);
        if (ferror(f)) {
            st = cf_fail(CF_ERR_IO, "reading %s: %s", path, strerror(errno));
            break;
        }
        at_end = len < cap;
        bool incomplete;
        st = parse_rows(buf, len, path, delimiter, max_rows, !at_end, out, &incomplete);
        if (st || !incomplete) break;
        if ((int64_t)cap >= CF_CSV_MAX_BYTES) {
            st = cf_fail(CF_ERR_FORMAT, "%s: the first %lld rows are longer than %lld bytes", path,
                         (long long)max_rows, (long long)CF_CSV_MAX_BYTES);
            break;
        }
        cap *= 2;
    }
    /* rows left unread: the file goes on past the bytes read, or past the last row kept */
    if (st == CF_OK && rest_unread) *rest_unread = !at_end || (*out)->n_rows == max_rows;
    fclose(f);
    cf_free(buf);
    return st;
}

int cf_csv_column(const cf_csv_table *t, const char *name) {
    for (int c = 0; t && name && c < t->n_cols; c++)
        if (strcmp(t->header[c], name) == 0) return c;
    return -1;
}
