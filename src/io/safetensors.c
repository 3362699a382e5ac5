/* safetensors reader and writer.
 *
 * Reader: every size, offset and field is checked against the file before it is used: the
 * header length (8 bytes little-endian, at most CF_ST_MAX_HEADER and within the file), the JSON
 * (cJSON, parsed from a NUL-terminated copy), each entry's dtype, shape and data_offsets, that no
 * name repeats, and that the entries tile the data area exactly (no gap, no overlap, nothing
 * left over), as the format requires. Errors name the file and the entry or byte at fault.
 *
 * Writer: the header is padded with spaces so the data starts at a multiple of 8 bytes, like the
 * reference implementation; the file is written the way every file of the library is
 * (src/core/file.c: a temporary file renamed over the target, a character device written
 * through, a FIFO refused). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkostemp */
#endif
#include "corefit/io.h"

#include "core/file.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CF_ST_MAX_HEADER ((uint64_t)100 << 20) /* 100 MiB of JSON is already absurd */
#define CF_ST_MAX_OFFSET 9007199254740992.0    /* 2^53: exact in a JSON double */
#define CF_ST_CHUNK 65536                      /* bytes converted at a time when writing */
#define CF_ST_MAX_FILE ((size_t)1 << 36)       /* 64 GiB: refused before reading */

static const char *dtype_name(cf_dtype d) {
    return d == CF_DTYPE_I64 ? "I64" : "F32";
}
static size_t dtype_size(cf_dtype d) {
    return d == CF_DTYPE_I64 ? 8 : 4;
}

/* dtypes of the format that corefit does not read. */
static const char *const other_dtypes[] = {"F64", "F16", "BF16", "F8_E4M3", "F8_E5M2",
                                           "I32", "I16", "I8",   "U64",     "U32",
                                           "U16", "U8",  "BOOL", NULL};

static uint64_t load_le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static void store_le64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static bool host_little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Fails with CF_ERR_FORMAT and "<file>: <message>". */
static cf_status bad(const char *file, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cf_status bad(const char *file, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cf_fail(CF_ERR_FORMAT, "%s: %s", file, msg);
}

void cf_st_free(cf_st_file *file) {
    if (!file) return;
    for (int i = 0; i < file->n_entries; i++) {
        cf_free(file->entries[i].name);
        cf_free(file->entries[i].data);
    }
    for (int i = 0; i < file->n_meta; i++) {
        cf_free(file->meta_keys[i]);
        cf_free(file->meta_values[i]);
    }
    cf_free(file->entries);
    cf_free(file->meta_keys);
    cf_free(file->meta_values);
    cf_free(file);
}

const cf_st_entry *cf_st_find(const cf_st_file *file, const char *name) {
    if (!file || !name) return NULL;
    for (int i = 0; i < file->n_entries; i++)
        if (strcmp(file->entries[i].name, name) == 0) return &file->entries[i];
    return NULL;
}

const char *cf_st_meta(const cf_st_file *file, const char *key) {
    if (!file || !key) return NULL;
    for (int i = 0; i < file->n_meta; i++)
        if (strcmp(file->meta_keys[i], key) == 0) return file->meta_values[i];
    return NULL;
}

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct range {
    uint64_t begin, end;
    int entry;
} range;

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->entry - y->entry;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A JSON number that must be a non-negative integer no larger than max. */
static bool json_uint(const cJSON *item, double max, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return false;
    double v = item->valuedouble;
    if (!isfinite(v) || v < 0.0 || v > max || floor(v) != v) return false;
    *out = (uint64_t)v;
    return true;
}

/* Describes a JSON value briefly for an error message. */
static const char *json_brief(const cJSON *item, char *buf, size_t size) {
    if (!item) return "nothing";
    if (cJSON_IsNumber(item)) {
        snprintf(buf, size, "%.17g", item->valuedouble);
        return buf;
    }
    if (cJSON_IsString(item)) {
        snprintf(buf, size, "\"%.40s\"", item->valuestring);
        return buf;
    }
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsObject(item)) return "an object";
    if (cJSON_IsBool(item)) return cJSON_IsTrue(item) ? "true" : "false";
    if (cJSON_IsNull(item)) return "null";
    return "an invalid value";
}

/* Validates one tensor entry of the header (not yet its data). */
static cf_status parse_entry(const char *file, const cJSON *item, uint64_t data_size,
                             cf_st_entry *e, range *r) {
    const char *name = item->string;
    char vb[64];
    if (!cJSON_IsObject(item))
        return bad(file,
                   "tensor '%s': expected an object with dtype, shape and data_offsets, got %s",
                   name, json_brief(item, vb, sizeof vb));
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype))
        return bad(file, "tensor '%s': \"dtype\" must be a string, got %s", name,
                   json_brief(dtype, vb, sizeof vb));
    if (strcmp(dtype->valuestring, "F32") == 0)
        e->dtype = CF_DTYPE_F32;
    else if (strcmp(dtype->valuestring, "I64") == 0)
        e->dtype = CF_DTYPE_I64;
    else {
        for (int i = 0; other_dtypes[i]; i++)
            if (strcmp(dtype->valuestring, other_dtypes[i]) == 0)
                return bad(file,
                           "tensor '%s': dtype %s is not supported (corefit reads F32 and I64)",
                           name, other_dtypes[i]);
        return bad(file, "tensor '%s': unknown dtype \"%.40s\"", name, dtype->valuestring);
    }
    if (!cJSON_IsArray(shape))
        return bad(file, "tensor '%s': \"shape\" must be an array, got %s", name,
                   json_brief(shape, vb, sizeof vb));
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > CF_MAX_DIMS)
        return bad(file, "tensor '%s': shape has %d dimensions (corefit supports at most %d)", name,
                   ndim, CF_MAX_DIMS);
    e->shape.ndim = ndim;
    uint64_t numel = 1;
    bool overflow = false;
    for (int d = 0; d < ndim; d++) {
        const cJSON *dim = cJSON_GetArrayItem(shape, d);
        uint64_t v;
        if (!json_uint(dim, (double)INT_MAX, &v))
            return bad(file, "tensor '%s': shape dimension %d is %s (must be an integer in 0..%d)",
                       name, d, json_brief(dim, vb, sizeof vb), INT_MAX);
        e->shape.dim[d] = (int)v;
        if (v != 0 && numel > UINT64_MAX / v)
            overflow = true;
        else
            numel *= v;
    }
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return bad(file, "tensor '%s': \"data_offsets\" must be an array [begin, end], got %s",
                   name,
                   offs && cJSON_IsArray(offs) ? "an array of another length"
                                               : json_brief(offs, vb, sizeof vb));
    uint64_t begin = 0, end = 0;
    for (int k = 0; k < 2; k++) {
        const cJSON *o = cJSON_GetArrayItem(offs, k);
        uint64_t v;
        if (!json_uint(o, CF_ST_MAX_OFFSET, &v))
            return bad(file, "tensor '%s': data_offsets[%d] is %s (must be a non-negative integer)",
                       name, k, json_brief(o, vb, sizeof vb));
        if (k == 0)
            begin = v;
        else
            end = v;
    }
    if (begin > end)
        return bad(file, "tensor '%s': data_offsets [%llu, %llu] begin after end", name,
                   (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return bad(file,
                   "tensor '%s': data_offsets [%llu, %llu] run past the data area of %llu bytes",
                   name, (unsigned long long)begin, (unsigned long long)end,
                   (unsigned long long)data_size);
    char sb[96];
    uint64_t esize = dtype_size(e->dtype);
    if (overflow || numel > UINT64_MAX / esize || numel * esize != end - begin)
        return bad(file,
                   "tensor '%s': shape %s of dtype %s needs %s%llu bytes but data_offsets [%llu, "
                   "%llu] hold %llu",
                   name, cf_shape_str(&e->shape, sb, sizeof sb), dtype_name(e->dtype),
                   overflow || numel > UINT64_MAX / esize ? "more than " : "",
                   overflow || numel > UINT64_MAX / esize ? (unsigned long long)UINT64_MAX
                                                          : (unsigned long long)(numel * esize),
                   (unsigned long long)begin, (unsigned long long)end,
                   (unsigned long long)(end - begin));
    e->numel = (size_t)numel;
    r->begin = begin;
    r->end = end;
    return CF_OK;
}

static void convert_in(cf_st_entry *e, const unsigned char *src) {
    if (e->dtype == CF_DTYPE_F32) {
        if (host_little_endian()) {
            memcpy(e->data, src, e->numel * 4);
        } else {
            for (size_t i = 0; i < e->numel; i++) {
                uint32_t u = (uint32_t)src[4 * i] | (uint32_t)src[4 * i + 1] << 8 |
                             (uint32_t)src[4 * i + 2] << 16 | (uint32_t)src[4 * i + 3] << 24;
                memcpy(&e->data[i], &u, 4);
            }
        }
    } else {
        for (size_t i = 0; i < e->numel; i++) {
            int64_t v = (int64_t)load_le64(src + 8 * i);
            e->data[i] = (float)v;
        }
    }
}

/* The header's tensors and metadata, checked; data not yet copied. */
static cf_status parse_header(const char *file, const cJSON *root, uint64_t data_size,
                              cf_st_file *f, range *ranges) {
    char vb[64];
    for (const cJSON *item = root->child; item; item = item->next) {
        const char *key = item->string ? item->string : "";
        if (strcmp(key, "__metadata__") == 0) {
            if (f->n_meta > 0 || f->meta_keys)
                return bad(file, "\"__metadata__\" appears twice in the header");
            if (!cJSON_IsObject(item))
                return bad(file, "\"__metadata__\" must be an object of strings, got %s",
                           json_brief(item, vb, sizeof vb));
            int n = cJSON_GetArraySize(item);
            f->meta_keys = cf_calloc((size_t)n + 1, sizeof *f->meta_keys);
            f->meta_values = cf_calloc((size_t)n + 1, sizeof *f->meta_values);
            if (!f->meta_keys || !f->meta_values) return CF_ERR_NOMEM;
            for (const cJSON *m = item->child; m; m = m->next) {
                if (!cJSON_IsString(m))
                    return bad(file, "metadata \"%.60s\" must be a string, got %s",
                               m->string ? m->string : "", json_brief(m, vb, sizeof vb));
                for (int j = 0; j < f->n_meta; j++)
                    if (strcmp(f->meta_keys[j], m->string) == 0)
                        return bad(file, "metadata \"%.60s\" appears twice", m->string);
                f->meta_keys[f->n_meta] = cf_strdup(m->string);
                f->meta_values[f->n_meta] = cf_strdup(m->valuestring);
                f->n_meta++;
                if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1])
                    return CF_ERR_NOMEM;
            }
            continue;
        }
        cf_st_entry *e = &f->entries[f->n_entries];
        range *r = &ranges[f->n_entries];
        cf_status st = parse_entry(file, item, data_size, e, r);
        if (st != CF_OK) return st;
        e->name = cf_strdup(key);
        if (!e->name) return CF_ERR_NOMEM;
        r->entry = f->n_entries;
        f->n_entries++;
    }
    return CF_OK;
}

/* Names are unique; the entries tile [0, data_size) exactly. */
static cf_status check_layout(const char *file, cf_st_file *f, range *ranges, uint64_t data_start,
                              uint64_t data_size) {
    int n = f->n_entries;
    const char **names = cf_calloc((size_t)n + 1, sizeof *names);
    if (!names) return CF_ERR_NOMEM;
    for (int i = 0; i < n; i++) names[i] = f->entries[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i], names[i - 1]) == 0) {
            cf_status st = bad(file, "tensor '%s' appears twice in the header", names[i]);
            cf_free(names);
            return st;
        }
    cf_free(names);
    qsort(ranges, (size_t)n, sizeof *ranges, cmp_range);
    uint64_t cursor = 0;
    const char *prev = NULL;
    for (int i = 0; i < n; i++) {
        const range *r = &ranges[i];
        const char *name = f->entries[r->entry].name;
        if (r->begin < cursor)
            return bad(file,
                       "tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' (which ends "
                       "at %llu)",
                       name, (unsigned long long)r->begin, (unsigned long long)r->end,
                       prev ? prev : "", (unsigned long long)cursor);
        if (r->begin > cursor)
            return bad(file,
                       "bytes %llu..%llu of the data area (file bytes %llu..%llu) belong to no "
                       "tensor (the next is '%s' at data_offsets [%llu, %llu])",
                       (unsigned long long)cursor, (unsigned long long)r->begin,
                       (unsigned long long)(data_start + cursor),
                       (unsigned long long)(data_start + r->begin), name,
                       (unsigned long long)r->begin, (unsigned long long)r->end);
        cursor = r->end;
        prev = name;
    }
    if (cursor != data_size)
        return bad(file,
                   "bytes %llu..%llu of the data area (file bytes %llu..%llu) belong to no tensor",
                   (unsigned long long)cursor, (unsigned long long)data_size,
                   (unsigned long long)(data_start + cursor),
                   (unsigned long long)(data_start + data_size));
    return CF_OK;
}

/* What a file that is not safetensors is, from its first bytes (files users give in place of a
 * model: images, PyTorch's zip and pickle checkpoints, compressed files), or NULL. */
static const char *other_format(const unsigned char *b, size_t n) {
    static const struct {
        const char *magic;
        size_t len;
        const char *what;
    } known[] = {
        {"\xff\xd8\xff", 3, "a JPEG image"},
        {"\x89PNG\r\n\x1a\n", 8, "a PNG image"},
        {"GIF8", 4, "a GIF image"},
        {"BM", 2, "a BMP image"},
        {"PK\x03\x04", 4,
         "a zip archive (a PyTorch .pth checkpoint? convert it with corefit-convert-pth, "
         "tools/convert_pth.py)"},
        {"\x80", 1,
         "a Python pickle (a PyTorch checkpoint? convert it with corefit-convert-pth, "
         "tools/convert_pth.py)"},
        {"\x1f\x8b", 2, "a gzip-compressed file"},
        {"\x89HDF", 4, "an HDF5 file (Keras weights?)"},
    };
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (n >= known[i].len && memcmp(b, known[i].magic, known[i].len) == 0) return known[i].what;
    return NULL;
}

cf_status cf_st_parse(const unsigned char *bytes, size_t size, const char *name, cf_st_file **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_st_parse: NULL out");
    *out = NULL;
    const char *file = name ? name : "<memory>";
    if (!bytes && size) return cf_fail(CF_ERR_INVALID, "cf_st_parse: NULL bytes");
    if (size < 8)
        return bad(file,
                   "%zu bytes is too short for a safetensors file (the 8-byte header length "
                   "is missing)",
                   size);
    uint64_t hlen = load_le64(bytes);
    const char *other = other_format(bytes, size);
    if (other && (hlen > size - 8 || size < 9 || bytes[8] != '{'))
        return bad(file, "not a safetensors file: it is %s", other);
    if (hlen > CF_ST_MAX_HEADER)
        return bad(file,
                   "not a safetensors file: header length %llu (bytes 0..7) is absurd (the limit "
                   "is %llu bytes)",
                   (unsigned long long)hlen, (unsigned long long)CF_ST_MAX_HEADER);
    if (hlen > size - 8)
        return bad(file,
                   "header length %llu (bytes 0..7) runs past the end of the file (%zu bytes, so "
                   "at most %zu)",
                   (unsigned long long)hlen, size, size - 8);
    if (hlen < 2)
        return bad(file, "header length %llu (bytes 0..7) is too short for a JSON object",
                   (unsigned long long)hlen);
    if (bytes[8] != '{')
        return bad(file,
                   "not a safetensors file: the header at byte 8 must start with '{', found byte "
                   "0x%02x",
                   bytes[8]);

    char *text = cf_malloc((size_t)hlen + 1);
    if (!text)
        return cf_fail_context(CF_ERR_NOMEM, "%s: header of %llu bytes", file,
                               (unsigned long long)hlen);
    memcpy(text, bytes + 8, (size_t)hlen);
    text[hlen] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
    cf_status st = CF_OK;
    cf_st_file *f = NULL;
    range *ranges = NULL;
    if (!root) {
        size_t at = end ? (size_t)(end - text) : 0;
        st = bad(file,
                 "the header is not valid JSON: error at byte %zu (header offset %zu, byte "
                 "0x%02x)",
                 8 + at, at, at < hlen ? (unsigned char)text[at] : 0);
        goto done;
    }
    for (const char *p = end; p < text + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = bad(file, "unexpected byte 0x%02x at byte %zu after the header's JSON object",
                     (unsigned char)*p, 8 + (size_t)(p - text));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        st = bad(file, "the header must be a JSON object");
        goto done;
    }
    int n_items = cJSON_GetArraySize(root);
    f = cf_calloc(1, sizeof *f);
    ranges = cf_calloc((size_t)n_items + 1, sizeof *ranges);
    if (f) f->entries = cf_calloc((size_t)n_items + 1, sizeof *f->entries);
    if (!f || !ranges || !f->entries) {
        st = cf_fail_context(CF_ERR_NOMEM, "%s: header with %d entries", file, n_items);
        goto done;
    }
    uint64_t data_start = 8 + hlen, data_size = size - data_start;
    if ((st = parse_header(file, root, data_size, f, ranges)) != CF_OK) goto done;
    if ((st = check_layout(file, f, ranges, data_start, data_size)) != CF_OK) goto done;
    /* ranges are now sorted; each names its entry */
    for (int i = 0; i < f->n_entries; i++) {
        cf_st_entry *e = &f->entries[ranges[i].entry];
        e->data = cf_malloc((e->numel ? e->numel : 1) * sizeof(float));
        if (!e->data) {
            st = cf_fail_context(CF_ERR_NOMEM, "%s: tensor '%s' of %zu elements", file, e->name,
                                 e->numel);
            goto done;
        }
        convert_in(e, bytes + data_start + ranges[i].begin);
    }
done:
    if (st == CF_ERR_NOMEM && cf_last_error()[0] == '\0')
        cf_fail(CF_ERR_NOMEM, "%s: out of memory while reading", file);
    cJSON_Delete(root);
    cf_free(text);
    cf_free(ranges);
    if (st != CF_OK) {
        cf_st_free(f);
        return st;
    }
    *out = f;
    return CF_OK;
}

cf_status cf_st_read(const char *path, cf_st_file **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_st_read: NULL out");
    *out = NULL;
    if (!path) return cf_fail(CF_ERR_INVALID, "cf_st_read: NULL path");
    void *buf;
    size_t size;
    cf_status rd = cf_read_file(path, CF_ST_MAX_FILE, &buf, &size);
    if (rd != CF_OK) return rd;
    cf_status st = cf_st_parse(buf, size, path, out);
    cf_free(buf);
    return st;
}

/* ---- writing ------------------------------------------------------------------------------- */

static cf_status write_entry(cf__out_file *w, const cf_st_entry *e, unsigned char *chunk) {
    if (e->dtype == CF_DTYPE_F32 && host_little_endian())
        return cf__out_write(w, e->data, e->numel * sizeof(float));
    size_t esize = dtype_size(e->dtype), per = CF_ST_CHUNK / esize;
    for (size_t i = 0; i < e->numel; i += per) {
        size_t n = e->numel - i < per ? e->numel - i : per;
        for (size_t j = 0; j < n; j++) {
            float v = e->data[i + j];
            if (e->dtype == CF_DTYPE_I64) {
                int64_t x = isfinite(v) && fabsf(v) < 9.2e18f ? (int64_t)llrintf(v) : 0;
                store_le64(chunk + 8 * j, (uint64_t)x);
            } else {
                uint32_t u;
                memcpy(&u, &v, 4);
                for (int k = 0; k < 4; k++) chunk[4 * j + k] = (unsigned char)(u >> (8 * k));
            }
        }
        cf_status st = cf__out_write(w, chunk, n * esize);
        if (st != CF_OK) return st;
    }
    return CF_OK;
}

static cf_status check_entries(const char *path, const cf_st_entry *entries, int n,
                               const char *const *meta_keys, const char *const *meta_values,
                               int n_meta) {
    if (n < 0 || n_meta < 0 || (n > 0 && !entries) || (n_meta > 0 && (!meta_keys || !meta_values)))
        return cf_fail(CF_ERR_INVALID, "writing %s: bad entry or metadata list", path);
    for (int i = 0; i < n; i++) {
        const cf_st_entry *e = &entries[i];
        if (!e->name || !e->name[0] || strcmp(e->name, "__metadata__") == 0)
            return cf_fail(CF_ERR_INVALID, "writing %s: entry %d has the name \"%s\"", path, i,
                           e->name ? e->name : "(null)");
        if (e->dtype != CF_DTYPE_F32 && e->dtype != CF_DTYPE_I64)
            return cf_fail(CF_ERR_INVALID, "writing %s: tensor '%s' has unknown dtype %d", path,
                           e->name, (int)e->dtype);
        if (e->shape.ndim < 0 || e->shape.ndim > CF_MAX_DIMS)
            return cf_fail(CF_ERR_INVALID, "writing %s: tensor '%s' has %d dimensions", path,
                           e->name, e->shape.ndim);
        size_t numel = 1;
        for (int d = 0; d < e->shape.ndim; d++) {
            if (e->shape.dim[d] < 0)
                return cf_fail(CF_ERR_INVALID, "writing %s: tensor '%s' has dimension %d = %d",
                               path, e->name, d, e->shape.dim[d]);
            numel *= (size_t)e->shape.dim[d];
        }
        char sb[96];
        if (numel != e->numel)
            return cf_fail(CF_ERR_INVALID,
                           "writing %s: tensor '%s' has shape %s (%zu elements) but numel %zu",
                           path, e->name, cf_shape_str(&e->shape, sb, sizeof sb), numel, e->numel);
        if (numel && !e->data)
            return cf_fail(CF_ERR_INVALID, "writing %s: tensor '%s' has no data", path, e->name);
        for (int j = 0; j < i; j++)
            if (strcmp(entries[j].name, e->name) == 0)
                return cf_fail(CF_ERR_INVALID, "writing %s: tensor '%s' appears twice", path,
                               e->name);
    }
    for (int i = 0; i < n_meta; i++)
        if (!meta_keys[i] || !meta_values[i])
            return cf_fail(CF_ERR_INVALID, "writing %s: metadata pair %d is NULL", path, i);
    return CF_OK;
}

static char *build_header(const cf_st_entry *entries, int n, const char *const *meta_keys,
                          const char *const *meta_values, int n_meta, uint64_t *data_size) {
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && n_meta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (int i = 0; ok && i < n_meta; i++)
            ok = cJSON_AddStringToObject(meta, meta_keys[i], meta_values[i]) != NULL;
    }
    uint64_t offset = 0;
    for (int i = 0; ok && i < n; i++) {
        const cf_st_entry *e = &entries[i];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON *shape = t ? cJSON_CreateArray() : NULL;
        ok = t && shape && cJSON_AddStringToObject(t, "dtype", dtype_name(e->dtype));
        if (shape) cJSON_AddItemToObject(t, "shape", shape);
        for (int d = 0; ok && d < e->shape.ndim; d++) {
            cJSON *v = cJSON_CreateNumber((double)e->shape.dim[d]);
            ok = v && cJSON_AddItemToArray(shape, v);
        }
        uint64_t bytes = (uint64_t)e->numel * dtype_size(e->dtype);
        cJSON *offs = ok ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        cJSON *b = offs ? cJSON_CreateNumber((double)offset) : NULL;
        if (b) cJSON_AddItemToArray(offs, b);
        cJSON *en = b ? cJSON_CreateNumber((double)(offset + bytes)) : NULL;
        if (en) cJSON_AddItemToArray(offs, en);
        ok = en != NULL;
        offset += bytes;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    *data_size = offset;
    return text;
}

cf_status cf_st_check_writable(const char *path) {
    if (!path || !path[0]) return cf_fail(CF_ERR_INVALID, "cf_st_check_writable: empty path");
    size_t plen = strlen(path);
    char *tmp = cf_malloc(plen + 16);
    if (!tmp) return cf_fail_context(CF_ERR_NOMEM, "checking %s", path);
    bool through = false;
    struct stat sb;
    cf_status st = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)
                       ? cf_fail(CF_ERR_IO, "cannot write %s: it is a directory", path)
                       : cf_output_check(path, &through);
    if (st == CF_OK && through) {
        int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
            st = cf_fail(CF_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        else
            close(fd);
    } else if (st == CF_OK) {
        snprintf(tmp, plen + 16, "%s.tmp-XXXXXX", path);
        int fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0) {
            st = cf_fail(CF_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        } else {
            close(fd);
            unlink(tmp);
        }
    }
    cf_free(tmp);
    return st;
}

cf_status cf_st_write(const char *path, const cf_st_entry *entries, int n_entries,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta) {
    if (!path || !path[0]) return cf_fail(CF_ERR_INVALID, "cf_st_write: empty path");
    cf_status st = check_entries(path, entries, n_entries, meta_keys, meta_values, n_meta);
    if (st != CF_OK) return st;
    uint64_t data_size = 0;
    char *json = build_header(entries, n_entries, meta_keys, meta_values, n_meta, &data_size);
    if (!json) return cf_fail(CF_ERR_NOMEM, "writing %s: out of memory building the header", path);
    size_t len = strlen(json), pad = (8 - len % 8) % 8;
    if ((uint64_t)(len + pad) > CF_ST_MAX_HEADER) {
        /* The reader refuses such a header: never write a file that cannot be read back. */
        cJSON_free(json);
        int big = -1;
        size_t big_len = 0;
        for (int i = 0; i < n_meta; i++)
            if (strlen(meta_values[i]) > big_len) big_len = strlen(meta_values[i]), big = i;
        if (big >= 0)
            return cf_fail(CF_ERR_INVALID,
                           "writing %s: the header would be %zu bytes, over the limit of %llu "
                           "that readers accept (the largest metadata value, '%s', is %zu bytes)",
                           path, len + pad, (unsigned long long)CF_ST_MAX_HEADER, meta_keys[big],
                           big_len);
        return cf_fail(CF_ERR_INVALID,
                       "writing %s: the header would be %zu bytes, over the limit of %llu that "
                       "readers accept",
                       path, len + pad, (unsigned long long)CF_ST_MAX_HEADER);
    }
    unsigned char *head = cf_malloc(8 + len + pad);
    unsigned char *chunk = cf_malloc(CF_ST_CHUNK);
    if (!head || !chunk) {
        cJSON_free(json);
        cf_free(head);
        cf_free(chunk);
        return cf_fail_context(CF_ERR_NOMEM, "writing %s", path);
    }
    store_le64(head, (uint64_t)(len + pad));
    memcpy(head + 8, json, len);
    memset(head + 8 + len, ' ', pad);
    cJSON_free(json);

    cf__out_file w;
    st = cf__out_open(&w, path, 8 + len + pad + data_size);
    if (st == CF_OK) st = cf__out_write(&w, head, 8 + len + pad);
    for (int i = 0; st == CF_OK && i < n_entries; i++) st = write_entry(&w, &entries[i], chunk);
    if (st == CF_OK)
        st = cf__out_commit(&w);
    else
        cf__out_abort(&w); /* (a no-op when the open failed) */
    cf_free(head);
    cf_free(chunk);
    return st;
}
