/* Numericalized text corpora: documents as offsets + int32 ids, in memory or in a memory-mapped
 * id file. A mapped corpus gives its pages back (madvise MADV_DONTNEED) after every
 * CF_TEXT_DROP_BYTES read, so the pages a long epoch touches do not pile up in the resident
 * set: they stay in the page cache and are mapped again when read again. */
#include "data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CF_TEXT_MAGIC "CFTEXTID"
#define CF_TEXT_HEADER 32
#define CF_TEXT_DROP_BYTES ((long long)8 << 20)

struct cf_text_store {
    atomic_int refs;
    int64_t *offsets; /* memory corpora */
    int32_t *ids;
    void *map; /* mapped corpora */
    size_t map_len;
    atomic_llong read_since_drop;
};

static uint64_t ids_end_aligned(uint64_t n_tokens) {
    return (CF_TEXT_HEADER + 4 * n_tokens + 7) / 8 * 8;
}

static cf_text_corpus *corpus_alloc(void) {
    cf_text_corpus *c = cf_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->store = cf_calloc(1, sizeof *c->store);
    if (!c->store) {
        cf_free(c);
        return NULL;
    }
    atomic_init(&c->store->refs, 1);
    atomic_init(&c->store->read_since_drop, 0);
    return c;
}

void cf__text_corpus_retain(cf_text_corpus *c) {
    if (c) atomic_fetch_add(&c->store->refs, 1);
}

void cf_text_corpus_free(cf_text_corpus *c) {
    if (!c) return;
    if (atomic_fetch_sub(&c->store->refs, 1) > 1) return;
    struct cf_text_store *s = c->store;
    if (s->map) munmap(s->map, s->map_len);
    cf_free(s->offsets);
    cf_free(s->ids);
    cf_free(s);
    cf_free(c->targets);
    cf__strv_free(c->classes, c->n_classes);
    cf_free(c->source);
    cf_free(c);
}

cf_status cf_text_corpus_from_docs(const int32_t *const *docs, const int64_t *lens, int64_t n_docs,
                                   int32_t vocab_size, cf_text_corpus **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_corpus_from_docs: out is NULL");
    *out = NULL;
    if (n_docs < 0 || (n_docs > 0 && (!docs || !lens)) || vocab_size <= 0)
        return cf_fail(CF_ERR_INVALID, "cf_text_corpus_from_docs: %lld documents, vocabulary of %d",
                       (long long)n_docs, (int)vocab_size);
    int64_t total = 0;
    for (int64_t d = 0; d < n_docs; d++) {
        if (lens[d] < 0 || (lens[d] > 0 && !docs[d]) || lens[d] > ((int64_t)1 << 40))
            return cf_fail(CF_ERR_INVALID,
                           "cf_text_corpus_from_docs: document %lld has length %lld", (long long)d,
                           (long long)lens[d]);
        total += lens[d];
    }
    cf_text_corpus *c = corpus_alloc();
    if (!c) return cf_fail(CF_ERR_NOMEM, "cf_text_corpus_from_docs");
    struct cf_text_store *s = c->store;
    s->offsets = cf_malloc((size_t)(n_docs + 1) * sizeof(int64_t));
    s->ids = cf_malloc((size_t)(total > 0 ? total : 1) * sizeof(int32_t));
    if (!s->offsets || !s->ids) {
        cf_text_corpus_free(c);
        return cf_fail(CF_ERR_NOMEM, "cf_text_corpus_from_docs: %lld tokens", (long long)total);
    }
    int64_t at = 0;
    for (int64_t d = 0; d < n_docs; d++) {
        s->offsets[d] = at;
        for (int64_t i = 0; i < lens[d]; i++) {
            int32_t id = docs[d][i];
            if (id < 0 || id >= vocab_size) {
                cf_text_corpus_free(c);
                return cf_fail(CF_ERR_INVALID,
                               "cf_text_corpus_from_docs: document %lld, token %lld: id %d "
                               "outside the vocabulary of %d",
                               (long long)d, (long long)i, (int)id, (int)vocab_size);
            }
            s->ids[at++] = id;
        }
    }
    s->offsets[n_docs] = at;
    c->n_docs = n_docs;
    c->n_tokens = total;
    c->offsets = s->offsets;
    c->ids = s->ids;
    c->vocab_size = vocab_size;
    *out = c;
    return CF_OK;
}

cf_status cf_text_corpus_set_labels(cf_text_corpus *c, const float *targets, int target_dim,
                                    int n_classes, const char *const *classes) {
    if (!c || target_dim < 0 || n_classes < 0 || (target_dim > 0 && c->n_docs > 0 && !targets) ||
        (n_classes > 0 && !classes) || (target_dim > 1 && target_dim != n_classes))
        return cf_fail(CF_ERR_INVALID, "cf_text_corpus_set_labels: %d targets, %d classes",
                       target_dim, n_classes);
    for (int64_t i = 0; target_dim == 1 && n_classes > 0 && i < c->n_docs; i++)
        if (!(targets[i] >= 0 && targets[i] < n_classes) || targets[i] != (int)targets[i])
            return cf_fail(CF_ERR_INVALID,
                           "cf_text_corpus_set_labels: document %lld has class %g of %d",
                           (long long)i, (double)targets[i], n_classes);
    size_t nt = (size_t)c->n_docs * (size_t)target_dim;
    float *t = cf_malloc((nt ? nt : 1) * sizeof(float));
    char **names = n_classes ? cf__strv_dup(classes, n_classes) : NULL;
    if (!t || (n_classes && !names)) {
        cf_free(t);
        cf__strv_free(names, n_classes);
        return cf_fail(CF_ERR_NOMEM, "cf_text_corpus_set_labels");
    }
    if (nt) memcpy(t, targets, nt * sizeof(float));
    cf_free(c->targets);
    cf__strv_free(c->classes, c->n_classes);
    c->targets = t;
    c->target_dim = target_dim;
    c->classes = names;
    c->n_classes = n_classes;
    return CF_OK;
}

cf_status cf_text_corpus_subset(const cf_text_corpus *c, const int64_t *idx, int64_t n,
                                cf_text_corpus **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_corpus_subset: out is NULL");
    *out = NULL;
    if (!c || n < 0 || (n > 0 && !idx))
        return cf_fail(CF_ERR_INVALID, "cf_text_corpus_subset: %lld documents", (long long)n);
    const int32_t **docs = cf_malloc((size_t)(n ? n : 1) * sizeof *docs);
    int64_t *lens = cf_malloc((size_t)(n ? n : 1) * sizeof *lens);
    float *t = cf_malloc((size_t)(n ? n : 1) * (size_t)(c->target_dim ? c->target_dim : 1) *
                         sizeof(float));
    cf_status st = docs && lens && t ? CF_OK : cf_fail(CF_ERR_NOMEM, "cf_text_corpus_subset");
    for (int64_t i = 0; st == CF_OK && i < n; i++) {
        if (idx[i] < 0 || idx[i] >= c->n_docs) {
            st = cf_fail(CF_ERR_INVALID, "cf_text_corpus_subset: document %lld of %lld",
                         (long long)idx[i], (long long)c->n_docs);
            break;
        }
        docs[i] = c->ids + c->offsets[idx[i]];
        lens[i] = c->offsets[idx[i] + 1] - c->offsets[idx[i]];
        for (int k = 0; k < c->target_dim; k++)
            t[i * c->target_dim + k] = c->targets[idx[i] * c->target_dim + k];
    }
    cf_text_corpus *sub = NULL;
    if (st == CF_OK) st = cf_text_corpus_from_docs(docs, lens, n, c->vocab_size, &sub);
    if (st == CF_OK && c->target_dim)
        st = cf_text_corpus_set_labels(sub, t, c->target_dim, c->n_classes,
                                       (const char *const *)c->classes);
    if (st == CF_OK && c->source && !(sub->source = cf_strdup(c->source)))
        st = cf_fail(CF_ERR_NOMEM, "cf_text_corpus_subset");
    cf_free(docs);
    cf_free(lens);
    cf_free(t);
    if (st != CF_OK) {
        cf_text_corpus_free(sub);
        return st;
    }
    *out = sub;
    return CF_OK;
}

cf_status cf_text_corpus_read(const cf_text_corpus *c, int64_t doc, int64_t from, int64_t n,
                              int32_t *out) {
    if (!c || doc < 0 || doc >= c->n_docs || from < 0 || n < 0 ||
        from + n > c->offsets[doc + 1] - c->offsets[doc] || (n > 0 && !out))
        return cf_fail(CF_ERR_INVALID,
                       "cf_text_corpus_read: document %lld, tokens [%lld, %lld) out of range",
                       (long long)doc, (long long)from, (long long)(from + n));
    memcpy(out, c->ids + c->offsets[doc] + from, (size_t)n * sizeof(int32_t));
    struct cf_text_store *s = c->store;
    if (s->map) {
        long long read = atomic_fetch_add(&s->read_since_drop, (long long)n * 4) + n * 4;
        if (read >= CF_TEXT_DROP_BYTES) {
            atomic_store(&s->read_since_drop, 0);
            madvise(s->map, s->map_len, MADV_DONTNEED);
        }
    }
    return CF_OK;
}

/* ---- id files ---------------------------------------------------------------------------- */

struct cf_text_idfile_writer {
    FILE *f;
    char *path, *tmp;
    int32_t vocab_size;
    int64_t *offsets;
    int64_t n_docs, cap, n_tokens;
    cf_status st;
};

cf_status cf_text_idfile_open(const char *path, int32_t vocab_size, cf_text_idfile_writer **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_idfile_open: out is NULL");
    *out = NULL;
    if (!path || vocab_size <= 0)
        return cf_fail(CF_ERR_INVALID, "cf_text_idfile_open: vocabulary of %d", (int)vocab_size);
    cf_text_idfile_writer *w = cf_calloc(1, sizeof *w);
    size_t len = strlen(path);
    if (!w || !(w->path = cf_strdup(path)) || !(w->tmp = cf_malloc(len + 16)) ||
        !(w->offsets = cf_malloc(1024 * sizeof(int64_t)))) {
        if (w) {
            cf_free(w->path);
            cf_free(w->tmp);
            cf_free(w);
        }
        return cf_fail(CF_ERR_NOMEM, "cf_text_idfile_open: %s", path);
    }
    snprintf(w->tmp, len + 16, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(w->tmp, O_CLOEXEC);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(w->tmp);
        }
        cf_free(w->offsets);
        cf_free(w->path);
        cf_free(w->tmp);
        cf_free(w);
        return cf_fail(CF_ERR_IO, "writing %s: cannot create a temporary file: %s", path,
                       strerror(e));
    }
    w->cap = 1024;
    w->offsets[0] = 0;
    w->vocab_size = vocab_size;
    static const char zeros[CF_TEXT_HEADER];
    if (fwrite(zeros, 1, CF_TEXT_HEADER, w->f) != CF_TEXT_HEADER)
        w->st = cf_fail(CF_ERR_IO, "writing %s: %s", path, strerror(errno));
    *out = w;
    return w->st;
}

cf_status cf_text_idfile_add(cf_text_idfile_writer *w, const int32_t *ids, int64_t n) {
    if (!w || n < 0 || (n > 0 && !ids))
        return cf_fail(CF_ERR_INVALID, "cf_text_idfile_add: %lld ids", (long long)n);
    if (w->st != CF_OK) return w->st;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->vocab_size)
            return w->st = cf_fail(CF_ERR_INVALID,
                                   "writing %s: document %lld, token %lld: id %d outside the "
                                   "vocabulary of %d",
                                   w->path, (long long)w->n_docs, (long long)i, (int)ids[i],
                                   (int)w->vocab_size);
    if (w->n_docs + 2 > w->cap) {
        int64_t *o = cf_malloc((size_t)w->cap * 2 * sizeof(int64_t));
        if (!o) return w->st = cf_fail(CF_ERR_NOMEM, "writing %s", w->path);
        memcpy(o, w->offsets, (size_t)(w->n_docs + 1) * sizeof(int64_t));
        cf_free(w->offsets);
        w->offsets = o;
        w->cap *= 2;
    }
    if (n > 0 && fwrite(ids, sizeof(int32_t), (size_t)n, w->f) != (size_t)n)
        return w->st = cf_fail(CF_ERR_IO, "writing %s: %s", w->path, strerror(errno));
    w->n_tokens += n;
    w->offsets[++w->n_docs] = w->n_tokens;
    return CF_OK;
}

cf_status cf_text_idfile_close(cf_text_idfile_writer *w, bool abandon) {
    if (!w) return CF_OK;
    cf_status st = w->st;
    if (st == CF_OK && !abandon) {
        uint64_t pad =
            ids_end_aligned((uint64_t)w->n_tokens) - CF_TEXT_HEADER - 4 * (uint64_t)w->n_tokens;
        static const char zeros[8];
        unsigned char h[CF_TEXT_HEADER] = {0};
        uint32_t version = 1;
        int32_t vocab = w->vocab_size;
        uint64_t nd = (uint64_t)w->n_docs, nt = (uint64_t)w->n_tokens;
        memcpy(h, CF_TEXT_MAGIC, 8);
        memcpy(h + 8, &version, 4);
        memcpy(h + 12, &vocab, 4);
        memcpy(h + 16, &nd, 8);
        memcpy(h + 24, &nt, 8);
        if (fwrite(zeros, 1, pad, w->f) != pad ||
            fwrite(w->offsets, sizeof(int64_t), (size_t)w->n_docs + 1, w->f) !=
                (size_t)w->n_docs + 1 ||
            fseek(w->f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, w->f) != sizeof h ||
            fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)
            st = cf_fail(CF_ERR_IO, "writing %s: %s", w->path, strerror(errno));
    }
    if (fclose(w->f) != 0 && st == CF_OK && !abandon)
        st = cf_fail(CF_ERR_IO, "writing %s: %s", w->path, strerror(errno));
    if (st == CF_OK && !abandon && rename(w->tmp, w->path) != 0)
        st = cf_fail(CF_ERR_IO, "writing %s: cannot rename %s over it: %s", w->path, w->tmp,
                     strerror(errno));
    if (st != CF_OK || abandon) unlink(w->tmp);
    cf_free(w->offsets);
    cf_free(w->path);
    cf_free(w->tmp);
    cf_free(w);
    return st;
}

cf_status cf_text_corpus_write(const cf_text_corpus *c, const char *path) {
    if (!c) return cf_fail(CF_ERR_INVALID, "cf_text_corpus_write: corpus is NULL");
    cf_text_idfile_writer *w = NULL;
    cf_status st = cf_text_idfile_open(path, c->vocab_size, &w);
    for (int64_t d = 0; st == CF_OK && d < c->n_docs; d++)
        st = cf_text_idfile_add(w, c->ids + c->offsets[d], c->offsets[d + 1] - c->offsets[d]);
    cf_status cst = cf_text_idfile_close(w, st != CF_OK);
    return st != CF_OK ? st : cst;
}

cf_status cf_text_corpus_map(const char *path, cf_text_corpus **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_corpus_map: out is NULL");
    *out = NULL;
    if (!path) return cf_fail(CF_ERR_INVALID, "cf_text_corpus_map: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cf_fail(CF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return cf_fail(CF_ERR_FORMAT, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < CF_TEXT_HEADER) {
        close(fd);
        return cf_fail(CF_ERR_FORMAT, "%s: %llu bytes, shorter than the %d-byte header", path,
                       (unsigned long long)size, CF_TEXT_HEADER);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return cf_fail(CF_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    const unsigned char *b = map;
    uint32_t version;
    int32_t vocab;
    uint64_t nd, nt;
    memcpy(&version, b + 8, 4);
    memcpy(&vocab, b + 12, 4);
    memcpy(&nd, b + 16, 8);
    memcpy(&nt, b + 24, 8);
    cf_status st = CF_OK;
    if (memcmp(b, CF_TEXT_MAGIC, 8) != 0)
        st = cf_fail(CF_ERR_FORMAT, "%s: byte 0: not a corefit id file (magic \"%.8s\")", path,
                     (const char *)b);
    else if (version != 1)
        st = cf_fail(CF_ERR_FORMAT, "%s: byte 8: version %u (this build reads 1)", path, version);
    else if (vocab <= 0)
        st = cf_fail(CF_ERR_FORMAT, "%s: byte 12: vocabulary size %d", path, (int)vocab);
    else if (nt > size / 4 || nd > size / 8 || ids_end_aligned(nt) + 8 * (nd + 1) != size)
        st = cf_fail(CF_ERR_FORMAT,
                     "%s: byte 16: %llu documents and %llu tokens need %llu bytes, the file has "
                     "%llu",
                     path, (unsigned long long)nd, (unsigned long long)nt,
                     (unsigned long long)(nt > size / 4 || nd > size / 8
                                              ? 0
                                              : ids_end_aligned(nt) + 8 * (nd + 1)),
                     (unsigned long long)size);
    const int32_t *ids = (const int32_t *)(b + CF_TEXT_HEADER);
    const int64_t *offsets = st == CF_OK ? (const int64_t *)(b + ids_end_aligned(nt)) : NULL;
    for (uint64_t d = 0; st == CF_OK && d <= nd; d++) {
        int64_t o = offsets[d], prev = d ? offsets[d - 1] : 0;
        if ((d == 0 && o != 0) || o < prev || (uint64_t)o > nt || (d == nd && (uint64_t)o != nt))
            st = cf_fail(CF_ERR_FORMAT, "%s: byte %llu: offset of document %llu is %lld", path,
                         (unsigned long long)(ids_end_aligned(nt) + 8 * d), (unsigned long long)d,
                         (long long)o);
    }
    /* Every id is checked once, the pages given back as the check moves on. */
    const uint64_t chunk = (uint64_t)CF_TEXT_DROP_BYTES / 4;
    for (uint64_t i = 0; st == CF_OK && i < nt; i++) {
        if (ids[i] < 0 || ids[i] >= vocab)
            st = cf_fail(CF_ERR_FORMAT, "%s: byte %llu: token id %d outside the vocabulary of %d",
                         path, (unsigned long long)(CF_TEXT_HEADER + 4 * i), (int)ids[i],
                         (int)vocab);
        if ((i + 1) % chunk == 0) madvise(map, (size_t)size, MADV_DONTNEED);
    }
    madvise(map, (size_t)size, MADV_DONTNEED);
    cf_text_corpus *c = st == CF_OK ? corpus_alloc() : NULL;
    if (st == CF_OK && (!c || !(c->source = cf_strdup(path)))) {
        cf_text_corpus_free(c);
        c = NULL;
        st = cf_fail(CF_ERR_NOMEM, "%s", path);
    }
    if (st != CF_OK) {
        munmap(map, (size_t)size);
        return st;
    }
    /* Readahead would fill the page cache with large folios that a fault then maps whole
     * (64 rows reading a few hundred bytes each mapped some 100 MB between drops). */
    madvise(map, (size_t)size, MADV_RANDOM);
    c->store->map = map;
    c->store->map_len = (size_t)size;
    c->n_docs = (int64_t)nd;
    c->n_tokens = (int64_t)nt;
    c->ids = ids;
    c->offsets = offsets;
    c->vocab_size = vocab;
    *out = c;
    return CF_OK;
}
