/* IDX files (LeCun's MNIST format): magic 0x00 0x00 0x08 ndim, ndim big-endian uint32 dims, then
 * prod(dims) unsigned bytes. gzip'd or raw files are both read through zlib's gzread. */
#include "data_internal.h"

#include "core/memory.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

/* deflate cannot compress better than about 1032:1; a gz file whose header promises more data
 * than that ratio allows is refused before allocating. */
#define CF_DEFLATE_MAX_RATIO 1032

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Validates the 4-byte magic; fills ndim. */
static cf_status check_magic(const uint8_t *m, const char *name, int *ndim) {
    uint32_t magic = be32(m);
    if (m[0] != 0 || m[1] != 0 || m[2] != 0x08 || m[3] < 1 || m[3] > 4) {
        if (m[0] == 0 && m[1] == 0 && m[2] >= 0x09 && m[2] <= 0x0E && m[3] >= 1)
            return cf_fail(CF_ERR_FORMAT,
                           "%s: IDX data type 0x%02x at byte offset 2 is not supported (only "
                           "unsigned bytes, 0x08)",
                           name, m[2]);
        return cf_fail(CF_ERR_FORMAT,
                       "%s: bad magic number 0x%08x at byte offset 0 (expected 0x000008NN with "
                       "NN = 1..4 dimensions, e.g. 0x00000803 for images, 0x00000801 for labels)",
                       name, magic);
    }
    *ndim = m[3];
    return CF_OK;
}

/* Validates the dims; fills out->dim and *numel. The payload may not exceed max_bytes: for raw
 * data the bytes present, for gzip'd data what the compressed size can hold (`why`). */
static cf_status check_dims(const uint8_t *d, int ndim, const char *name, int64_t max_bytes,
                            const char *why, cf_idx *out, int64_t *numel) {
    double need = 1;
    char dims[96] = "";
    size_t at = 0;
    for (int i = 0; i < ndim; i++) {
        uint32_t v = be32(d + 4 * i);
        if (v == 0)
            return cf_fail(CF_ERR_FORMAT, "%s: dimension %d (byte offset %d) is 0", name, i,
                           4 + 4 * i);
        if (v > INT_MAX)
            return cf_fail(CF_ERR_FORMAT, "%s: dimension %d (byte offset %d) is %u, too large",
                           name, i, 4 + 4 * i, v);
        out->dim[i] = v;
        need *= v;
        at += (size_t)snprintf(dims + at, sizeof dims - at, i ? " x %u" : "%u", v);
    }
    if (need > (double)max_bytes) {
        if (!why)
            return cf_fail(CF_ERR_FORMAT,
                           "%s: truncated: the header's dimensions (%s) need %.0f bytes of data, "
                           "there are %lld after the header",
                           name, dims, need, (long long)max_bytes);
        return cf_fail(CF_ERR_FORMAT,
                       "%s: the header's dimensions (%s) need %.0f bytes of data, refused (%s: "
                       "at most %lld)",
                       name, dims, need, why, (long long)max_bytes);
    }
    out->ndim = ndim;
    *numel = (int64_t)need;
    return CF_OK;
}

void cf_idx_free(cf_idx *idx) {
    if (!idx) return;
    cf_free(idx->data);
    memset(idx, 0, sizeof *idx);
}

cf_status cf_idx_parse(const void *bytes, size_t size, const char *name, cf_idx *out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_idx_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!name) name = "IDX data";
    const uint8_t *b = bytes;
    if (!b || size < 4)
        return cf_fail(CF_ERR_FORMAT, "%s: truncated: %zu bytes, the magic number needs 4", name,
                       size);
    int ndim;
    cf_status st = check_magic(b, name, &ndim);
    if (st) return st;
    size_t hdr = 4 + 4 * (size_t)ndim;
    if (size < hdr)
        return cf_fail(CF_ERR_FORMAT, "%s: truncated header: %zu bytes, %d dimensions need %zu",
                       name, size, ndim, hdr);
    int64_t numel;
    cf_idx tmp = {0};
    st = check_dims(b + 4, ndim, name, (int64_t)(size - hdr), NULL, &tmp, &numel);
    if (st) return st;
    if ((size_t)numel != size - hdr)
        return cf_fail(CF_ERR_FORMAT, "%s: %zu bytes of data after the header, dimensions say %lld",
                       name, size - hdr, (long long)numel);
    tmp.data = cf_malloc((size_t)numel);
    if (!tmp.data) return cf_fail_context(CF_ERR_NOMEM, "%s", name);
    memcpy(tmp.data, b + hdr, (size_t)numel);
    *out = tmp;
    return CF_OK;
}

/* Reads exactly n bytes; returns the count read (short on EOF or error). */
static int64_t gz_read_all(gzFile f, uint8_t *dst, int64_t n) {
    int64_t done = 0;
    while (done < n) {
        int64_t want = n - done;
        if (want > (1 << 30)) want = 1 << 30;
        int got = gzread(f, dst + done, (unsigned)want);
        if (got <= 0) break;
        done += got;
    }
    return done;
}

static const char *gz_why(gzFile f) {
    int err = 0;
    const char *msg = gzerror(f, &err);
    if (err == Z_OK || !msg || !*msg) return "end of file";
    return msg;
}

/* When a short read was zlib finding damage rather than the end of the file, records that
 * error and returns true: a gzip trailer whose CRC-32 or length does not match the data (zlib
 * checks it as soon as it has inflated the last block, which for a small file is during the
 * first read), or corrupt compressed data. */
static bool gz_corrupt(gzFile f, const char *path, long long file_size, cf_status *st) {
    int err = 0;
    const char *msg = gzerror(f, &err);
    if (err != Z_DATA_ERROR) return false;
    size_t plen = strlen(path);
    if (msg && strncmp(msg, path, plen) == 0 && strncmp(msg + plen, ": ", 2) == 0)
        msg += plen + 2; /* zlib's message starts with the path */
    if (msg && strstr(msg, "check"))
        *st = cf_fail(CF_ERR_FORMAT,
                      "%s: corrupt gzip file: %s (the trailer at byte offset %lld does not match "
                      "the data)",
                      path, msg, file_size - 8);
    else
        *st = cf_fail(CF_ERR_FORMAT, "%s: corrupt gzip data: %s (near compressed byte offset %lld)",
                      path, msg ? msg : "?", (long long)gzoffset(f));
    return true;
}

/* Reads into a buffer that grows with the data actually decompressed (doubling from 1 MiB up
 * to n): a header that promises more than the file holds costs only what the file holds.
 * Returns the bytes read, or -1 with the error recorded. */
static int64_t gz_read_growing(gzFile f, const char *path, uint8_t **buf, int64_t n) {
    int64_t cap = 0, done = 0;
    *buf = NULL;
    while (done < n) {
        if (done == cap) {
            int64_t next = cap ? cap * 2 : (int64_t)1 << 20;
            if (next > n) next = n;
            if (cf_memory_check((uint64_t)next, path) != CF_OK) return -1;
            uint8_t *g = realloc(*buf, (size_t)next);
            if (!g) {
                cf_fail(CF_ERR_NOMEM, "%s: out of memory decompressing %lld bytes", path,
                        (long long)next);
                return -1;
            }
            *buf = g;
            cap = next;
        }
        int64_t got = gz_read_all(f, *buf + done, cap - done);
        done += got;
        if (done < cap) break;
    }
    return done;
}

/* An IDX file opened and its header checked, before its data is read. */
typedef struct idx_file {
    gzFile f;
    const char *path;
    long long fsize;  /* of the file as stored */
    bool raw;         /* not gzip'd */
    int64_t hdr_size; /* bytes of header */
    int64_t numel;    /* data bytes the header promises */
    int64_t keep;     /* of which the first max_items items are read */
    cf_idx dims;      /* the header's dimensions, dim[0] cut to max_items; no data */
} idx_file;

/* Opens path and reads and checks its header: on success x->f is open, on failure closed. */
static cf_status idx_open(const char *path, int64_t max_items, idx_file *x) {
    memset(x, 0, sizeof *x);
    x->path = path;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return cf_fail(CF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return cf_fail(CF_ERR_IO, "%s is not a regular file", path);
    gzFile f = gzopen(path, "rb");
    if (!f) return cf_fail(CF_ERR_IO, "cannot open %s: %s", path, strerror(errno ? errno : ENOMEM));
    gzbuffer(f, 1 << 17);
    cf_status st = CF_OK;
    uint8_t hdr[20];
    long long fsize = (long long)sb.st_size;
    int64_t got = gz_read_all(f, hdr, 4);
    if (got < 4 && !gz_corrupt(f, path, fsize, &st)) {
        st = cf_fail(CF_ERR_FORMAT, "%s: truncated: %lld bytes, the magic number needs 4 (%s)",
                     path, (long long)got, gz_why(f));
        goto fail;
    }
    if (st) goto fail;
    int ndim;
    if ((st = check_magic(hdr, path, &ndim))) goto fail;
    int64_t hdr_size = 4 + 4 * (int64_t)ndim;
    got = gz_read_all(f, hdr + 4, hdr_size - 4);
    if (got < hdr_size - 4) {
        if (!gz_corrupt(f, path, fsize, &st))
            st = cf_fail(CF_ERR_FORMAT, "%s: truncated header at byte offset %lld (%s)", path,
                         (long long)(4 + got), gz_why(f));
        goto fail;
    }
    int64_t max_bytes;
    const char *why;
    bool raw = gzdirect(f) == 1;
    if (raw) {
        max_bytes = (int64_t)sb.st_size - hdr_size;
        why = NULL;
    } else {
        int64_t by_ratio = (int64_t)sb.st_size * CF_DEFLATE_MAX_RATIO;
        max_bytes = by_ratio < CF_IDX_MAX_BYTES ? by_ratio : CF_IDX_MAX_BYTES;
        why = by_ratio < CF_IDX_MAX_BYTES ? "more than gzip can hold in this file"
                                          : "above the limit for gzip'd files";
    }
    int64_t numel;
    if ((st = check_dims(hdr + 4, ndim, path, max_bytes, why, &x->dims, &numel))) goto fail;
    if (raw && numel != max_bytes) {
        st = cf_fail(CF_ERR_FORMAT,
                     "%s: the file has %lld bytes of data after the header, its "
                     "dimensions say %lld",
                     path, (long long)max_bytes, (long long)numel);
        goto fail;
    }
    int64_t keep = numel;
    if (max_items > 0 && max_items < x->dims.dim[0]) {
        keep = numel / x->dims.dim[0] * max_items;
        x->dims.dim[0] = max_items;
    }
    x->f = f;
    x->fsize = fsize;
    x->raw = raw;
    x->hdr_size = hdr_size;
    x->numel = numel;
    x->keep = keep;
    return CF_OK;
fail:
    gzclose(f);
    return st;
}

/* The error for data that ended after `got` of the x->keep bytes read. */
static cf_status idx_short(idx_file *x, int64_t got) {
    cf_status st = CF_OK;
    if (!gz_corrupt(x->f, x->path, x->fsize, &st))
        st = cf_fail(CF_ERR_FORMAT,
                     "%s: truncated: data ends at byte offset %lld%s, the header promises "
                     "%lld (%s)",
                     x->path, (long long)(x->hdr_size + got), x->raw ? "" : " (uncompressed)",
                     (long long)(x->hdr_size + x->numel), gz_why(x->f));
    return st;
}

/* Closes an opened file whose data was not read to its end (an error on the way). */
static void idx_abandon(idx_file *x) {
    gzclose(x->f);
    x->f = NULL;
}

/* After the kept data was read: when that was all of it, that nothing follows (and, in a gzip
 * file, that its trailer matches). Closes the file. */
static cf_status idx_close(idx_file *x) {
    cf_status st = CF_OK;
    if (x->keep == x->numel) { /* else the rest is neither read nor checked */
        uint8_t extra;
        int more = gzread(x->f, &extra, 1);
        if (more == 1)
            st = cf_fail(CF_ERR_FORMAT,
                         "%s: unexpected data after byte offset %lld (the end of the "
                         "data its header describes)",
                         x->path, (long long)(x->hdr_size + x->numel));
        else if (more < 0)
            gz_corrupt(x->f, x->path, x->fsize, &st);
    }
    gzclose(x->f);
    x->f = NULL;
    return st;
}

/* Reads the kept data of an opened file into a new buffer (out->data), and closes it. */
static cf_status idx_read_bytes(idx_file *x, cf_idx *out) {
    cf_idx tmp = x->dims;
    cf_status st = CF_OK;
    int64_t got;
    if (x->raw) {
        if ((st = cf_memory_check((uint64_t)x->keep, x->path))) goto done;
        tmp.data = cf_malloc((size_t)x->keep);
        if (!tmp.data) {
            st = cf_fail_context(CF_ERR_NOMEM, "%s", x->path);
            goto done;
        }
        got = gz_read_all(x->f, tmp.data, x->keep);
    } else {
        got = gz_read_growing(x->f, x->path, &tmp.data, x->keep);
        if (got < 0) {
            st = CF_ERR_NOMEM;
            goto done;
        }
    }
    if (got < x->keep) st = idx_short(x, got);
done:
    if (st)
        idx_abandon(x);
    else
        st = idx_close(x);
    if (st) {
        cf_idx_free(&tmp);
        return st;
    }
    *out = tmp;
    return CF_OK;
}

/* Reads the file's header and the data of its first max_items items (all when max_items is 0).
 * Only what is kept is decompressed and allocated. */
static cf_status idx_read(const char *path, int64_t max_items, cf_idx *out) {
    memset(out, 0, sizeof *out);
    idx_file x;
    cf_status st = idx_open(path, max_items, &x);
    return st ? st : idx_read_bytes(&x, out);
}

/* byte / 255 rounded once from double, as numpy's uint8 / 255.0 */
static void byte_lut(float lut[256]) {
    for (int v = 0; v < 256; v++) lut[v] = (float)(v / 255.0);
}

/* Bytes of data inflated at a time into floats: at least twice gzbuffer's size, so that zlib
 * inflates straight into the buffer, and small enough to stay in the cache while converted. */
#define STREAM_CHUNK ((int64_t)1 << 18)

/* Reads the kept data of an opened file straight into floats (byte / 255), a chunk at a time,
 * without a buffer for the whole file; closes it. */
static cf_status idx_read_floats(idx_file *x, float *dst) {
    uint8_t *buf = cf_malloc((size_t)STREAM_CHUNK);
    if (!buf) {
        idx_abandon(x);
        return cf_fail_context(CF_ERR_NOMEM, "%s", x->path);
    }
    float lut[256];
    byte_lut(lut);
    int64_t done = 0;
    while (done < x->keep) {
        int64_t want = x->keep - done < STREAM_CHUNK ? x->keep - done : STREAM_CHUNK;
        int64_t got = gz_read_all(x->f, buf, want);
        float *d = dst + done;
        for (int64_t i = 0; i < got; i++) d[i] = lut[buf[i]];
        done += got;
        if (got < want) break;
    }
    cf_free(buf);
    cf_status st = done < x->keep ? idx_short(x, done) : CF_OK;
    if (st) {
        idx_abandon(x);
        return st;
    }
    return idx_close(x);
}

/* Whether a gzip file's trailer (ISIZE, the last 4 bytes: the uncompressed size modulo 2^32)
 * agrees with `size`: then the header's promise is believed and the data set allocated up
 * front. A file whose trailer disagrees (a lying header, several gzip members) is read through
 * the growing buffer instead, which costs only what the file holds. */
static bool gz_size_agrees(const char *path, int64_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    uint8_t t[4];
    bool ok = fseek(f, -4, SEEK_END) == 0 && fread(t, 1, 4, f) == 4;
    fclose(f);
    uint32_t isize =
        (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
    return ok && isize == (uint32_t)size;
}

cf_status cf_idx_read(const char *path, cf_idx *out) {
    if (!out || !path) return cf_fail(CF_ERR_INVALID, "cf_idx_read: NULL argument");
    return idx_read(path, 0, out);
}

cf_status cf_idx_read_first(const char *path, int64_t max_items, cf_idx *out) {
    if (!out || !path) return cf_fail(CF_ERR_INVALID, "cf_idx_read_first: NULL argument");
    if (max_items < 0)
        return cf_fail(CF_ERR_INVALID, "cf_idx_read_first: max_items = %lld (must be >= 0)",
                       (long long)max_items);
    return idx_read(path, max_items, out);
}

/* The sample shape of images with the header `im` (2 or 3 dimensions). */
static cf_status image_shape(const cf_idx *im, const char *im_name, cf_shape *shape) {
    if (im->ndim == 3)
        *shape = cf_shape_make(3, (int[]){1, (int)im->dim[1], (int)im->dim[2]});
    else if (im->ndim == 2)
        *shape = cf_shape1((int)im->dim[1]);
    else
        return cf_fail(CF_ERR_FORMAT, "%s: expected idx3 images (n, rows, cols), got %d dimensions",
                       im_name, im->ndim);
    return CF_OK;
}

/* A dataset (x and y not yet written) for the images with the header `im`. */
static cf_status alloc_for_images(const cf_idx *im, const char *im_name, cf_dataset **out) {
    cf_shape shape;
    cf_status st = image_shape(im, im_name, &shape);
    if (st != CF_OK) return st;
    int64_t n = im->dim[0];
    st = cf_memory_check(((uint64_t)n * cf_shape_numel(&shape) + (uint64_t)n) * sizeof(float),
                         im_name);
    if (st != CF_OK) return st;
    *out = cf__dataset_alloc_unset(n, shape, 1); /* every value is written */
    return *out ? CF_OK : cf_fail_context(CF_ERR_NOMEM, "%s", im_name);
}

/* Builds a dataset from parsed image and label files. `ds`, when given, is the dataset that
 * alloc_for_images made for im, its x filled already (im has no data then); it is freed on
 * failure. */
static cf_status dataset_from_parsed(const cf_idx *im, const cf_idx *lb, const char *im_name,
                                     const char *lb_name, cf_dataset *ds, cf_dataset **out) {
    cf_shape shape = {0};
    cf_status st = image_shape(im, im_name, &shape);
    if (st == CF_OK && lb->ndim != 1)
        st = cf_fail(CF_ERR_FORMAT, "%s: expected idx1 labels (n), got %d dimensions", lb_name,
                     lb->ndim);
    if (st == CF_OK && im->dim[0] != lb->dim[0])
        st = cf_fail(CF_ERR_FORMAT, "%s has %lld images but %s has %lld labels", im_name,
                     (long long)im->dim[0], lb_name, (long long)lb->dim[0]);
    if (st == CF_OK && !ds) {
        st = alloc_for_images(im, im_name, &ds);
        if (st == CF_OK) {
            size_t numel = (size_t)im->dim[0] * cf_shape_numel(&shape);
            float lut[256];
            byte_lut(lut);
            for (size_t i = 0; i < numel; i++) ds->x[i] = lut[im->data[i]];
        }
    }
    if (st != CF_OK) {
        cf_dataset_free(ds);
        return st;
    }
    int64_t n = im->dim[0];
    int max_label = 0, n_seen = 0;
    bool seen[256] = {false};
    for (int64_t i = 0; i < n; i++) {
        ds->y[i] = (float)lb->data[i];
        if (lb->data[i] > max_label) max_label = lb->data[i];
        n_seen += !seen[lb->data[i]];
        seen[lb->data[i]] = true;
    }
    ds->n_classes = max_label + 1;
    /* The classes are 0..largest label. A stray large label (255 as a "none" mark) makes a model
     * of mostly empty classes that still trains: say so rather than refuse. */
    int unused = ds->n_classes - n_seen;
    if (unused >= 16 && unused > n_seen)
        fprintf(stderr,
                "corefit: warning: %s: the labels run to %d, so the data set has %d classes, but "
                "only %d distinct labels occur in its %lld items; a label such as %d may be a "
                "mark rather than a class\n",
                lb_name, max_label, ds->n_classes, n_seen, (long long)n, max_label);
    ds->vocab = cf_calloc((size_t)ds->n_classes, sizeof(char *));
    bool ok = ds->vocab != NULL;
    for (int c = 0; ok && c < ds->n_classes; c++) {
        char buf[16];
        snprintf(buf, sizeof buf, "%d", c);
        ok = (ds->vocab[c] = cf_strdup(buf)) != NULL;
    }
    if (!ok || !cf__dataset_set_source(ds, im_name)) {
        cf_dataset_free(ds);
        return cf_fail_context(CF_ERR_NOMEM, "%s", im_name);
    }
    *out = ds;
    return CF_OK;
}

cf_status cf_dataset_from_idx_first(const char *images_path, const char *labels_path,
                                    int64_t max_items, cf_dataset **out) {
    if (!out || !images_path || !labels_path)
        return cf_fail(CF_ERR_INVALID, "cf_dataset_from_idx: NULL argument");
    *out = NULL;
    if (max_items < 0)
        return cf_fail(CF_ERR_INVALID, "cf_dataset_from_idx_first: max_items = %lld (must be >= 0)",
                       (long long)max_items);
    cf_idx im = {0}, lb = {0};
    cf_dataset *ds = NULL;
    idx_file x;
    cf_status st = idx_open(images_path, max_items, &x);
    /* Images whose size is known (a raw file, a gzip trailer that agrees, or the first
     * max_items) are inflated straight into the dataset's floats: no buffer of bytes. */
    if (!st && (x.dims.ndim == 2 || x.dims.ndim == 3) &&
        (x.raw || x.keep < x.numel || gz_size_agrees(images_path, x.hdr_size + x.numel))) {
        im = x.dims;
        st = alloc_for_images(&im, images_path, &ds);
        if (st) {
            idx_abandon(&x);
        } else {
            /* where this run has a second core, its page faults are taken there meanwhile */
            cf__prefault *pf = cf__prefault_start(ds->x, (size_t)x.keep * sizeof(float));
            st = idx_read_floats(&x, ds->x);
            cf__prefault_stop(pf);
        }
        if (st) {
            cf_dataset_free(ds);
            ds = NULL;
        }
    } else if (!st) {
        st = idx_read_bytes(&x, &im);
    }
    if (!st) st = idx_read(labels_path, max_items, &lb);
    if (!st)
        st = dataset_from_parsed(&im, &lb, images_path, labels_path, ds, out);
    else
        cf_dataset_free(ds);
    cf_idx_free(&im);
    cf_idx_free(&lb);
    return st;
}

cf_status cf_dataset_from_idx(const char *images_path, const char *labels_path, cf_dataset **out) {
    return cf_dataset_from_idx_first(images_path, labels_path, 0, out);
}

cf_status cf_dataset_from_idx_memory(const void *images, size_t images_size, const void *labels,
                                     size_t labels_size, const char *name, cf_dataset **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_dataset_from_idx_memory: out is NULL");
    *out = NULL;
    char im_name[256], lb_name[256];
    snprintf(im_name, sizeof im_name, "%s (images)", name ? name : "memory");
    snprintf(lb_name, sizeof lb_name, "%s (labels)", name ? name : "memory");
    cf_idx im = {0}, lb = {0};
    cf_status st = cf_idx_parse(images, images_size, im_name, &im);
    if (!st) st = cf_idx_parse(labels, labels_size, lb_name, &lb);
    if (!st) st = dataset_from_parsed(&im, &lb, im_name, lb_name, NULL, out);
    cf_idx_free(&im);
    cf_idx_free(&lb);
    return st;
}
