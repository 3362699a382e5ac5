/* Text readers (fastai's TextDataLoaders.from_folder / from_csv) producing raw texts and labels,
 * the glue through the numericalizer seam into corpora and DataLoaders, and show_batch. */
#include "data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void cf_text_raw_free(cf_text_raw *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->n; i++) {
        cf_free(r->texts ? r->texts[i] : NULL);
        cf_free(r->where ? r->where[i] : NULL);
    }
    cf_free(r->texts);
    cf_free(r->where);
    cf_free(r->is_valid);
    cf_free(r->targets);
    cf__strv_free(r->classes, r->n_classes);
    cf_free(r);
}

/* The first byte offset where text is not UTF-8 (or holds a NUL), or -1. */
static int64_t bad_utf8_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == 0) return (int64_t)i;
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = c >= 0xc2 && c <= 0xdf   ? 1
                : c >= 0xe0 && c <= 0xef ? 2
                : c >= 0xf0 && c <= 0xf4 ? 3
                                         : -1;
        if (k < 0 || i + (size_t)k >= n) return (int64_t)i;
        for (int j = 1; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return (int64_t)i;
        /* overlong, surrogates and beyond U+10FFFF */
        if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0) ||
            (c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] >= 0x90))
            return (int64_t)i;
        i += (size_t)k + 1;
    }
    return -1;
}

/* Growing list of (text, where, label name, split). */
typedef struct item_list {
    int64_t n, cap;
    char **texts, **where, **labels;
    bool *valid;
} item_list;

static void items_free(item_list *l) {
    for (int64_t i = 0; i < l->n; i++) {
        cf_free(l->texts[i]);
        cf_free(l->where[i]);
        cf_free(l->labels[i]);
    }
    cf_free(l->texts);
    cf_free(l->where);
    cf_free(l->labels);
    cf_free(l->valid);
    memset(l, 0, sizeof *l);
}

static bool grow(void **p, int64_t n, int64_t cap, size_t el) {
    void *q = cf_malloc((size_t)cap * el);
    if (!q) return false;
    if (n) memcpy(q, *p, (size_t)n * el);
    cf_free(*p);
    *p = q;
    return true;
}

/* Takes text, where and label (owned) into the list. */
static cf_status items_add(item_list *l, char *text, char *where, char *label, bool valid) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 64;
        if (!grow((void **)&l->texts, l->n, cap, sizeof(char *)) ||
            !grow((void **)&l->where, l->n, cap, sizeof(char *)) ||
            !grow((void **)&l->labels, l->n, cap, sizeof(char *)) ||
            !grow((void **)&l->valid, l->n, cap, sizeof(bool))) {
            cf_free(text);
            cf_free(where);
            cf_free(label);
            return cf_fail(CF_ERR_NOMEM, "text reader: %lld texts", (long long)l->n);
        }
        l->cap = cap;
    }
    l->texts[l->n] = text;
    l->where[l->n] = where;
    l->labels[l->n] = label;
    l->valid[l->n] = valid;
    l->n++;
    return CF_OK;
}

static cf_status read_text_file(const char *path, int64_t max_bytes, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return cf_fail(CF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return cf_fail(CF_ERR_FORMAT, "%s: not a regular file", path);
    }
    if (sb.st_size == 0) {
        fclose(f);
        return cf_fail(CF_ERR_FORMAT, "%s: empty text file", path);
    }
    if (sb.st_size > max_bytes) {
        fclose(f);
        return cf_fail(CF_ERR_FORMAT, "%s: %lld bytes, above the limit of %lld", path,
                       (long long)sb.st_size, (long long)max_bytes);
    }
    char *buf = cf_malloc((size_t)sb.st_size + 1);
    size_t n = buf ? fread(buf, 1, (size_t)sb.st_size, f) : 0;
    fclose(f);
    if (!buf) return cf_fail(CF_ERR_NOMEM, "%s", path);
    if (n != (size_t)sb.st_size) {
        cf_free(buf);
        return cf_fail(CF_ERR_IO, "%s: read %zu of %lld bytes", path, n, (long long)sb.st_size);
    }
    buf[n] = 0;
    int64_t bad = bad_utf8_at((const unsigned char *)buf, n);
    if (bad >= 0) {
        unsigned char v = (unsigned char)buf[bad];
        cf_free(buf);
        return cf_fail(CF_ERR_FORMAT, "%s: byte %lld (0x%02x): %s", path, (long long)bad, v,
                       v == 0 ? "a NUL byte: a binary file, not text" : "not UTF-8");
    }
    *out = buf;
    return CF_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of dir's entries that are folders (want_dirs) or .txt files. */
static cf_status list_dir(const char *dir, bool want_dirs, char ***names, int64_t *n) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return cf_fail(CF_ERR_IO, "%s: cannot open folder: %s", dir, strerror(errno));
    int64_t cap = 0;
    struct dirent *e;
    cf_status st = CF_OK;
    char path[8192];
    while (st == CF_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        size_t len = strlen(e->d_name);
        bool ok = want_dirs
                      ? S_ISDIR(sb.st_mode)
                      : !S_ISDIR(sb.st_mode) && len > 4 && strcmp(e->d_name + len - 4, ".txt") == 0;
        if (!ok) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 32;
            if (!grow((void **)names, *n, cap, sizeof(char *))) st = CF_ERR_NOMEM;
        }
        if (st == CF_OK && !((*names)[*n] = cf_strdup(e->d_name))) st = CF_ERR_NOMEM;
        if (st == CF_OK) (*n)++;
    }
    closedir(d);
    if (st != CF_OK) {
        cf__strv_free(*names, (int)*n);
        *names = NULL;
        *n = 0;
        return cf_fail(CF_ERR_NOMEM, "%s: listing", dir);
    }
    if (*n) qsort(*names, (size_t)*n, sizeof(char *), cmp_str);
    return CF_OK;
}

/* root/<label>/<name>.txt into l, split `valid`. */
static cf_status read_labelled(const char *root, bool valid, int64_t max_bytes, item_list *l) {
    char **labels = NULL;
    int64_t n_labels = 0;
    cf_status st = list_dir(root, true, &labels, &n_labels);
    for (int64_t k = 0; st == CF_OK && k < n_labels; k++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", root, labels[k]);
        char **files = NULL;
        int64_t n_files = 0;
        st = list_dir(dir, false, &files, &n_files);
        for (int64_t i = 0; st == CF_OK && i < n_files; i++) {
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            char *text = NULL, *where = NULL, *label = NULL;
            st = read_text_file(path, max_bytes, &text);
            if (st == CF_OK && (!(where = cf_strdup(path)) || !(label = cf_strdup(labels[k])))) {
                cf_free(text);
                cf_free(where);
                st = cf_fail(CF_ERR_NOMEM, "%s", path);
            }
            if (st == CF_OK) st = items_add(l, text, where, label, valid);
        }
        cf__strv_free(files, (int)n_files);
    }
    cf__strv_free(labels, (int)n_labels);
    return st;
}

/* Single labels of the list -> classes (sorted training labels) and codes; a validation label
 * the training set lacks is refused naming its text. */
static cf_status finish_single(item_list *l, bool unlabelled, cf_text_raw **out) {
    cf_text_raw *r = cf_calloc(1, sizeof *r);
    if (!r) return cf_fail(CF_ERR_NOMEM, "text reader");
    r->n = l->n;
    r->texts = l->texts;
    r->where = l->where;
    r->is_valid = l->valid;
    char **labels = l->labels;
    int64_t n = l->n;
    memset(l, 0, sizeof *l);
    cf_status st = CF_OK;
    if (!unlabelled) {
        char **names = cf_malloc((size_t)(n ? n : 1) * sizeof(char *));
        int k = 0;
        if (!names) st = cf_fail(CF_ERR_NOMEM, "text reader");
        for (int64_t i = 0; st == CF_OK && i < n; i++)
            if (!r->is_valid[i]) names[k++] = labels[i];
        if (st == CF_OK && k) {
            qsort(names, (size_t)k, sizeof(char *), cmp_str);
            int u = 0;
            for (int i = 0; i < k; i++)
                if (!u || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
            r->classes = cf__strv_dup((const char *const *)names, u);
            r->n_classes = r->classes ? u : 0;
            if (!r->classes) st = cf_fail(CF_ERR_NOMEM, "text reader");
        }
        r->target_dim = 1;
        if (st == CF_OK && !(r->targets = cf_malloc((size_t)(n ? n : 1) * sizeof(float))))
            st = cf_fail(CF_ERR_NOMEM, "text reader");
        for (int64_t i = 0; st == CF_OK && i < n; i++) {
            char **hit = r->n_classes ? bsearch(&labels[i], r->classes, (size_t)r->n_classes,
                                                sizeof(char *), cmp_str)
                                      : NULL;
            if (!hit)
                st = cf_fail(CF_ERR_FORMAT,
                             "%s: label \"%s\" is not one of the %d labels of the training set",
                             r->where[i], labels[i], r->n_classes);
            else
                r->targets[i] = (float)(hit - r->classes);
        }
        cf_free(names);
    }
    for (int64_t i = 0; i < n; i++) cf_free(labels[i]);
    cf_free(labels);
    if (st != CF_OK) {
        cf_text_raw_free(r);
        return st;
    }
    *out = r;
    return CF_OK;
}

cf_status cf_text_read_folder(const char *root, const cf_text_folder_options *opt,
                              cf_text_raw **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_read_folder: out is NULL");
    *out = NULL;
    if (!root) return cf_fail(CF_ERR_INVALID, "cf_text_read_folder: root is NULL");
    cf_text_folder_options o = opt ? *opt : (cf_text_folder_options){0};
    if (!o.train) o.train = "train";
    if (!o.valid) o.valid = "valid";
    if (o.max_bytes <= 0) o.max_bytes = (int64_t)64 << 20;
    if (o.valid_pct < 0 || o.valid_pct >= 1)
        return cf_fail(CF_ERR_INVALID, "cf_text_read_folder: valid_pct %g outside [0, 1)",
                       o.valid_pct);
    item_list l = {0};
    cf_status st;
    char dir[4096];
    if (o.valid_pct > 0) {
        st = read_labelled(root, false, o.max_bytes, &l);
        int64_t *tr = NULL, *va = NULL, ntr = 0, nva = 0;
        if (st == CF_OK) st = cf_random_split(l.n, o.valid_pct, o.seed, &tr, &ntr, &va, &nva);
        for (int64_t i = 0; st == CF_OK && i < nva; i++) l.valid[va[i]] = true;
        cf_free(tr);
        cf_free(va);
    } else {
        snprintf(dir, sizeof dir, "%s/%s", root, o.train);
        st = read_labelled(dir, false, o.max_bytes, &l);
        snprintf(dir, sizeof dir, "%s/%s", root, o.valid);
        struct stat sb;
        if (st == CF_OK && stat(dir, &sb) == 0) st = read_labelled(dir, true, o.max_bytes, &l);
    }
    if (st == CF_OK && l.n == 0)
        st = cf_fail(CF_ERR_FORMAT, "%s: no .txt files in <label> folders", root);
    if (st != CF_OK) {
        items_free(&l);
        return st;
    }
    return finish_single(&l, o.unlabelled, out);
}

static int find_col(const cf_csv_table *t, const char *name) {
    for (int c = 0; c < t->n_cols; c++)
        if (strcmp(t->header[c], name) == 0) return c;
    return -1;
}

static cf_status missing_col(const cf_csv_table *t, const char *what, const char *name) {
    char cols[512] = "";
    size_t at = 0;
    for (int c = 0; c < t->n_cols && at + 4 < sizeof cols; c++)
        at += (size_t)snprintf(cols + at, sizeof cols - at, "%s%s", c ? ", " : "", t->header[c]);
    return cf_fail(CF_ERR_FORMAT, "%s: line 1: no %s column \"%s\" (columns: %s)", t->source, what,
                   name, cols);
}

static cf_status parse_bool(const char *s, bool *v) {
    if (!strcmp(s, "1") || !strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))
        *v = true;
    else if (!strcmp(s, "0") || !strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))
        *v = false;
    else
        return CF_ERR_FORMAT;
    return CF_OK;
}

static cf_status read_csv_table(const cf_csv_table *t, const cf_text_csv_options *opt,
                                cf_text_raw **out) {
    cf_text_csv_options o = *opt;
    const char *label_default = "label";
    if (!o.text_col) o.text_col = "text";
    if (o.n_label_cols == 0) {
        o.label_cols = &label_default;
        o.n_label_cols = 1;
    }
    int tc = find_col(t, o.text_col);
    if (tc < 0) return missing_col(t, "text", o.text_col);
    int *lc = cf_malloc((size_t)o.n_label_cols * sizeof(int));
    if (!lc) return CF_ERR_NOMEM;
    for (int k = 0; k < o.n_label_cols; k++)
        if ((lc[k] = find_col(t, o.label_cols[k])) < 0) {
            cf_free(lc);
            return missing_col(t, "label", o.label_cols[k]);
        }
    int vc = o.valid_col ? find_col(t, o.valid_col) : -1;
    if (o.valid_col && vc < 0) {
        cf_free(lc);
        return missing_col(t, "validation", o.valid_col);
    }
    item_list l = {0};
    cf_status st = CF_OK;
    bool multi = o.n_label_cols > 1 || o.label_delim;
    for (int64_t r = 0; st == CF_OK && r < t->n_rows; r++) {
        const char *const *row = (const char *const *)t->cells + r * t->n_cols;
        char where[1024];
        snprintf(where, sizeof where, "%s:%lld", t->source, (long long)t->row_line[r]);
        bool valid = false;
        if (vc >= 0 && parse_bool(row[vc], &valid) != CF_OK) {
            st = cf_fail(CF_ERR_FORMAT, "%s: %s is \"%s\", not a boolean", where, o.valid_col,
                         row[vc]);
            break;
        }
        if (!row[tc][0] || bad_utf8_at((const unsigned char *)row[tc], strlen(row[tc])) >= 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s: the text in column %s is %s", where, o.text_col,
                         row[tc][0] ? "not UTF-8" : "empty");
            break;
        }
        /* multi-label: the label names joined by '\n' (split below) */
        char label[4096] = "";
        size_t at = 0;
        if (o.n_label_cols > 1) {
            for (int k = 0; k < o.n_label_cols; k++) {
                bool on;
                if (parse_bool(row[lc[k]], &on) != CF_OK) {
                    st = cf_fail(CF_ERR_FORMAT, "%s: %s is \"%s\", not 0 or 1", where,
                                 o.label_cols[k], row[lc[k]]);
                    break;
                }
                if (on)
                    at += (size_t)snprintf(label + at, sizeof label - at, "%s%s", at ? "\n" : "",
                                           o.label_cols[k]);
            }
        } else {
            snprintf(label, sizeof label, "%s", row[lc[0]]);
            if (o.label_delim && o.label_delim[0])
                for (char *p = label; (p = strstr(p, o.label_delim));) {
                    *p = '\n';
                    memmove(p + 1, p + strlen(o.label_delim),
                            strlen(p + strlen(o.label_delim)) + 1);
                }
            if (!multi && !label[0]) {
                st = cf_fail(CF_ERR_FORMAT, "%s: empty label in column %s", where, o.label_cols[0]);
                break;
            }
        }
        if (st != CF_OK) break;
        char *a = cf_strdup(row[tc]), *b = cf_strdup(where), *c = cf_strdup(label);
        if (!a || !b || !c) {
            cf_free(a);
            cf_free(b);
            cf_free(c);
            st = cf_fail(CF_ERR_NOMEM, "%s", where);
        } else {
            st = items_add(&l, a, b, c, valid);
        }
    }
    cf_free(lc);
    if (st == CF_OK && !o.valid_col && o.valid_pct > 0) {
        int64_t *tr = NULL, *va = NULL, ntr = 0, nva = 0;
        st = cf_random_split(l.n, o.valid_pct, o.seed, &tr, &ntr, &va, &nva);
        for (int64_t i = 0; st == CF_OK && i < nva; i++) l.valid[va[i]] = true;
        cf_free(tr);
        cf_free(va);
    }
    if (st != CF_OK) {
        items_free(&l);
        return st;
    }
    if (!multi) return finish_single(&l, false, out);
    /* Multi-label: classes = sorted distinct names over the training rows; multi-hot targets. */
    cf_text_raw *r = NULL;
    int n_classes = 0;
    char **classes = NULL;
    {
        item_list names = {0}; /* every name of the training rows, then sorted and unique */
        for (int64_t i = 0; st == CF_OK && i < l.n; i++) {
            if (l.valid[i]) continue;
            for (char *p = l.labels[i], *e; st == CF_OK && *p; p = *e ? e + 1 : e) {
                e = strchr(p, '\n');
                if (!e) e = p + strlen(p);
                char *name = cf_malloc((size_t)(e - p) + 1);
                if (!name) {
                    st = CF_ERR_NOMEM;
                    break;
                }
                memcpy(name, p, (size_t)(e - p));
                name[e - p] = 0;
                char *w = cf_strdup(""), *lb = cf_strdup("");
                st = items_add(&names, name, w, lb, false);
            }
        }
        if (st == CF_OK && names.n) {
            qsort(names.texts, (size_t)names.n, sizeof(char *), cmp_str);
            char **u = cf_malloc((size_t)names.n * sizeof(char *));
            for (int64_t i = 0; u && i < names.n; i++)
                if (!n_classes || strcmp(u[n_classes - 1], names.texts[i]) != 0)
                    u[n_classes++] = names.texts[i];
            classes = u ? cf__strv_dup((const char *const *)u, n_classes) : NULL;
            cf_free(u);
            if (!classes) st = CF_ERR_NOMEM;
        }
        items_free(&names);
    }
    if (st == CF_OK && !(r = cf_calloc(1, sizeof *r))) st = CF_ERR_NOMEM;
    if (st == CF_OK) {
        r->n = l.n;
        r->texts = l.texts;
        r->where = l.where;
        r->is_valid = l.valid;
        r->n_classes = n_classes;
        r->classes = classes;
        classes = NULL;
        r->target_dim = n_classes;
        r->targets =
            cf_calloc((size_t)(l.n ? l.n : 1) * (size_t)(n_classes ? n_classes : 1), sizeof(float));
        if (!r->targets) st = CF_ERR_NOMEM;
        for (int64_t i = 0; st == CF_OK && i < l.n; i++)
            for (char *p = l.labels[i], *e; st == CF_OK && *p; p = *e ? e + 1 : e) {
                e = strchr(p, '\n');
                if (!e) e = p + strlen(p);
                char save = *e;
                *e = 0;
                char **hit =
                    n_classes ? bsearch(&p, r->classes, (size_t)n_classes, sizeof(char *), cmp_str)
                              : NULL;
                if (!hit)
                    st = cf_fail(CF_ERR_FORMAT,
                                 "%s: label \"%s\" is not one of the %d labels of the training "
                                 "set",
                                 r->where[i], p, n_classes);
                else
                    r->targets[i * n_classes + (hit - r->classes)] = 1.0f;
                *e = save;
            }
        for (int64_t i = 0; i < l.n; i++) cf_free(l.labels[i]);
        l.texts = l.where = NULL;
        l.valid = NULL;
        l.n = 0;
    }
    if (classes) cf__strv_free(classes, n_classes);
    items_free(&l); /* what is left: the label strings (or everything on failure) */
    if (st != CF_OK) {
        cf_text_raw_free(r);
        return st == CF_ERR_NOMEM ? cf_fail(CF_ERR_NOMEM, "text reader") : st;
    }
    *out = r;
    return CF_OK;
}

cf_status cf_text_read_csv_buffer(const char *text, size_t size, const char *name,
                                  const cf_text_csv_options *o, cf_text_raw **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_read_csv: out is NULL");
    *out = NULL;
    cf_text_csv_options opt = o ? *o : (cf_text_csv_options){0};
    cf_csv_table *t = NULL;
    cf_status st = cf_csv_parse_buffer(text, size, name ? name : "buffer",
                                       opt.delimiter ? opt.delimiter : ',', &t);
    if (st != CF_OK) return st;
    st = read_csv_table(t, &opt, out);
    cf_csv_table_free(t);
    return st;
}

cf_status cf_text_read_csv(const char *path, const cf_text_csv_options *o, cf_text_raw **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_read_csv: out is NULL");
    *out = NULL;
    cf_text_csv_options opt = o ? *o : (cf_text_csv_options){0};
    cf_csv_table *t = NULL;
    cf_status st = cf_csv_read(path, opt.delimiter ? opt.delimiter : ',', &t);
    if (st != CF_OK) return st;
    st = read_csv_table(t, &opt, out);
    cf_csv_table_free(t);
    return st;
}

/* ---- through the numericalizer ------------------------------------------------------------ */

cf_status cf_text_corpus_from_raw(const cf_text_raw *raw, bool valid,
                                  const cf_text_numericalizer *nz, cf_text_corpus **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_corpus_from_raw: out is NULL");
    *out = NULL;
    if (!raw || !nz || !nz->encode || !nz->vocab_size)
        return cf_fail(CF_ERR_INVALID, "cf_text_corpus_from_raw: no texts or no numericalizer");
    int64_t n = 0;
    for (int64_t i = 0; i < raw->n; i++) n += raw->is_valid[i] == valid;
    int32_t **docs = cf_calloc((size_t)(n ? n : 1), sizeof *docs);
    int64_t *lens = cf_calloc((size_t)(n ? n : 1), sizeof *lens);
    int td = raw->target_dim;
    float *t = cf_malloc((size_t)(n ? n : 1) * (size_t)(td ? td : 1) * sizeof(float));
    cf_status st = docs && lens && t ? CF_OK : cf_fail(CF_ERR_NOMEM, "cf_text_corpus_from_raw");
    int64_t k = 0;
    for (int64_t i = 0; st == CF_OK && i < raw->n; i++) {
        if (raw->is_valid[i] != valid) continue;
        st = nz->encode(nz->ctx, raw->texts[i], &docs[k], &lens[k]);
        if (st != CF_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cf_last_error());
            st = cf_fail(st, "%s: %s", raw->where[i], msg);
        }
        for (int c = 0; c < td; c++) t[k * td + c] = raw->targets[i * td + c];
        k++;
    }
    cf_text_corpus *c = NULL;
    if (st == CF_OK)
        st = cf_text_corpus_from_docs((const int32_t *const *)docs, lens, n,
                                      nz->vocab_size(nz->ctx), &c);
    if (st == CF_OK && td)
        st = cf_text_corpus_set_labels(c, t, td, raw->n_classes, (const char *const *)raw->classes);
    for (int64_t i = 0; docs && i < n; i++) cf_free(docs[i]);
    cf_free(docs);
    cf_free(lens);
    cf_free(t);
    if (st != CF_OK) {
        cf_text_corpus_free(c);
        return st;
    }
    *out = c;
    return CF_OK;
}

cf_status cf_text_dls_from_raw(const cf_text_raw *raw, const cf_text_numericalizer *nz,
                               const cf_text_dls_options *o, cf_dls **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_dls_from_raw: out is NULL");
    *out = NULL;
    if (!raw || !nz) return cf_fail(CF_ERR_INVALID, "cf_text_dls_from_raw: no texts");
    cf_status st = CF_OK;
    if (nz->fit) { /* fastai counts the tokens of the training texts */
        const char **texts = cf_malloc((size_t)(raw->n ? raw->n : 1) * sizeof(char *));
        int64_t n = 0;
        if (!texts) return cf_fail(CF_ERR_NOMEM, "cf_text_dls_from_raw");
        for (int64_t i = 0; i < raw->n; i++)
            if (!raw->is_valid[i]) texts[n++] = raw->texts[i];
        st = nz->fit(nz->ctx, texts, n);
        cf_free(texts);
    }
    cf_text_corpus *train = NULL, *valid = NULL;
    if (st == CF_OK) st = cf_text_corpus_from_raw(raw, false, nz, &train);
    if (st == CF_OK) st = cf_text_corpus_from_raw(raw, true, nz, &valid);
    if (st == CF_OK) st = cf_text_dls_new(train, valid, o, out);
    cf_text_corpus_free(train);
    cf_text_corpus_free(valid);
    return st;
}

/* ---- show_batch ---------------------------------------------------------------------------- */

/* Line breaks and tabs are tokens of their own: written escaped, so a row stays a line and its
 * columns stay apart. */
void cf_text_put_token(FILE *out, const char *tok) {
    for (const char *ch = tok; *ch; ch++)
        if (*ch == '\n')
            fputs("\\n", out);
        else if (*ch == '\t')
            fputs("\\t", out);
        else if (*ch == '\r')
            fputs("\\r", out);
        else
            fputc(*ch, out);
}

/* The first max_tokens tokens of a row other than xxpad (fastai's Numericalize.decodes drops
 * padding); line breaks, tabs and carriage returns as \n, \t and \r. */
static void put_tokens(FILE *out, const float *ids, int n, int max_tokens,
                       const cf_text_numericalizer *nz) {
    for (int t = 0, shown = 0; t < n && shown < max_tokens; t++) {
        int32_t id = (int32_t)ids[t];
        if (id == CF_TEXT_PAD) continue;
        const char *tok = nz->token ? nz->token(nz->ctx, id) : NULL;
        if (shown) fputc(' ', out);
        if (!tok) fprintf(out, "<%d>", (int)id);
        if (tok) cf_text_put_token(out, tok);
        shown++;
    }
}

cf_status cf_text_show_batch(const cf_dataloader *dl, const cf_batch *b,
                             const cf_text_numericalizer *nz, int max_rows, int max_tokens,
                             FILE *out) {
    const cf_text_corpus *c = cf_text_loader_corpus(dl);
    if (!c || !b || !nz || !out)
        return cf_fail(CF_ERR_INVALID, "cf_text_show_batch: a text loader, a batch, a "
                                       "numericalizer and a stream are needed");
    if (max_rows <= 0) max_rows = 9;
    if (max_tokens <= 0) max_tokens = 150;
    bool lm = cf_text_loader_is_lm(dl);
    int T = b->x.shape.ndim == 2 ? b->x.shape.dim[1] : 0;
    fprintf(out, "%-4s %s\t%s\n", "", "text", lm ? "text_" : "category");
    for (int i = 0; i < b->size && i < max_rows; i++) {
        fprintf(out, "%-4d ", i);
        put_tokens(out, b->x.data + (size_t)i * T, T, max_tokens, nz);
        fprintf(out, "\t");
        if (lm) {
            put_tokens(out, b->y.data + (size_t)i * T, T, max_tokens, nz);
        } else if (c->target_dim == 1) {
            int k = (int)b->y.data[i];
            fprintf(out, "%s", k >= 0 && k < c->n_classes ? c->classes[k] : "?");
        } else {
            int m = 0;
            for (int k = 0; k < c->target_dim; k++)
                if (b->y.data[(size_t)i * c->target_dim + k] > 0.5f)
                    fprintf(out, "%s%s", m++ ? ";" : "", c->classes[k]);
        }
        fprintf(out, "\n");
    }
    return ferror(out) ? cf_fail(CF_ERR_IO, "cf_text_show_batch: write error") : CF_OK;
}
