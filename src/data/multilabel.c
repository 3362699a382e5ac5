/* fastai's other image targets read from a CSV (ImageDataLoaders.from_csv / from_df):
 * label lists split by label_delim into multi-hot targets (MultiCategoryBlock), and point
 * coordinates scaled to -1..1 (PointBlock with PointScaler). Single labels are image_csv.c's. */
#include "data_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- rows of an image CSV shared by both readers ----------------------------------------- */

typedef struct image_csv_rows {
    cf_csv_table *t;
    char base[PATH_MAX]; /* the folder the file names are relative to */
    int fn_col, valid_col;
    int8_t *is_valid; /* per row */
} image_csv_rows;

static void rows_free(image_csv_rows *r) {
    cf_csv_table_free(r->t);
    cf_free(r->is_valid);
    memset(r, 0, sizeof *r);
}

/* Reads the CSV, finds the file-name and validation columns and splits the rows as
 * image_csv.c does (valid_col, else RandomSplitter(valid_pct, seed), else all training). */
static cf_status rows_read(const char *csv_path, const char *folder, const char *fn_col,
                           const char *valid_col, const cf_image_folder_options *o,
                           image_csv_rows *r) {
    memset(r, 0, sizeof *r);
    cf_status st = cf_csv_read(csv_path, ',', &r->t);
    if (st) return st;
    r->fn_col = cf__image_csv_col(r->t, fn_col, 0);
    r->valid_col = valid_col ? cf__image_csv_col(r->t, valid_col, -1) : -1;
    if (r->fn_col < 0 || (valid_col && r->valid_col < 0)) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header", csv_path,
                     r->fn_col < 0 ? (fn_col ? fn_col : "(first)") : valid_col);
        goto fail;
    }
    const char *slash = strrchr(csv_path, '/');
    int dir_len = slash ? (int)(slash - csv_path) : 1;
    const char *dir = slash ? csv_path : ".";
    int k = folder && folder[0] == '/' ? snprintf(r->base, sizeof r->base, "%s", folder)
            : folder ? snprintf(r->base, sizeof r->base, "%.*s/%s", dir_len, dir, folder)
                     : snprintf(r->base, sizeof r->base, "%.*s", dir_len, dir);
    if (k < 0 || (size_t)k >= sizeof r->base) {
        st = cf_fail(CF_ERR_INVALID, "%s: folder path too long", csv_path);
        goto fail;
    }
    const int64_t n = r->t->n_rows;
    if (!(r->is_valid = cf_calloc((size_t)(n > 0 ? n : 1), 1))) {
        st = CF_ERR_NOMEM;
        goto fail;
    }
    if (r->valid_col >= 0) {
        for (int64_t i = 0; i < n; i++) {
            const char *v = r->t->cells[i * r->t->n_cols + r->valid_col];
            int b = cf__parse_bool(v);
            if (b < 0) {
                st = cf_fail(CF_ERR_FORMAT, "%s:%lld: column %s is '%s', not a boolean", csv_path,
                             (long long)r->t->row_line[i], valid_col, v);
                goto fail;
            }
            r->is_valid[i] = (int8_t)b;
        }
    } else if (o->valid_pct > 0) {
        int64_t *ti = NULL, *vi = NULL, nt = 0, nv = 0;
        if ((st = cf_random_split(n, o->valid_pct, o->seed, &ti, &nt, &vi, &nv))) goto fail;
        for (int64_t i = 0; i < nv; i++) r->is_valid[vi[i]] = 1;
        cf_free(ti);
        cf_free(vi);
    }
    return CF_OK;
fail:
    rows_free(r);
    return st;
}

/* Pushes row i's image to tr or va (label 0: the targets are set afterwards). */
static cf_status push_row(const image_csv_rows *r, const char *csv_path, int64_t i,
                          cf__image_items *tr, cf__image_items *va) {
    const char *fn = r->t->cells[i * r->t->n_cols + r->fn_col];
    if (fn[0] == '\0')
        return cf_fail(CF_ERR_FORMAT, "%s:%lld: empty file name", csv_path,
                       (long long)r->t->row_line[i]);
    char path[PATH_MAX];
    cf_status st = cf__path_join(path, sizeof path, r->base, fn);
    return st ? st : cf__image_items_push(r->is_valid[i] ? va : tr, path, 0);
}

/* Builds both sets from the items, then gives them targets y (per row, target_dim each, in row
 * order: training rows first in tr's order, validation rows in va's). */
static cf_status build_sets(const cf__image_items *tr, const cf__image_items *va,
                            const char *csv_path, const cf_image_folder_options *o, char **vocab,
                            int n_vocab, int target_dim, float *train_y, float *valid_y,
                            cf_dataset **train, cf_dataset **valid) {
    cf_status st =
        cf__image_sets_build(tr, va, vocab, n_vocab, csv_path, csv_path, o, train, valid);
    if (st) {
        cf_free(train_y);
        cf_free(valid_y);
        return st;
    }
    /* the builders made one class code per image; the targets replace them */
    cf_free((*train)->y);
    (*train)->y = train_y;
    (*train)->target_dim = target_dim;
    cf_free((*valid)->y);
    (*valid)->y = valid_y;
    (*valid)->target_dim = target_dim;
    return CF_OK;
}

/* ---- label lists: multi-hot targets ----------------------------------------------------- */

/* Calls fn(label, len, ctx) for each non-empty label of cell split by delim (NULL or "": the
 * whole cell is one label). Returns fn's first non-zero result. */
static int each_label(const char *cell, const char *delim, int (*fn)(const char *, size_t, void *),
                      void *ctx) {
    const size_t dl = delim ? strlen(delim) : 0;
    const char *p = cell;
    for (;;) {
        const char *e = dl ? strstr(p, delim) : NULL;
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0) {
            int rc = fn(p, n, ctx);
            if (rc) return rc;
        }
        if (!e) return 0;
        p = e + dl;
    }
}

typedef struct label_pool {
    char **v;
    int64_t n, cap;
} label_pool;

static int pool_add(const char *s, size_t n, void *ctx) {
    label_pool *p = ctx;
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 64;
        char **v = cf_malloc((size_t)cap * sizeof *v);
        if (!v) return 1;
        if (p->n) memcpy(v, p->v, (size_t)p->n * sizeof *v);
        cf_free(p->v);
        p->v = v;
        p->cap = cap;
    }
    char *c = cf_malloc(n + 1);
    if (!c) return 1;
    memcpy(c, s, n);
    c[n] = '\0';
    p->v[p->n++] = c;
    return 0;
}

typedef struct encode_ctx {
    char **vocab;
    int n_vocab;
    float *row;
    const char *bad; /* the label not in the vocabulary */
    size_t bad_len;
} encode_ctx;

static int encode_label(const char *s, size_t n, void *vctx) {
    encode_ctx *c = vctx;
    int lo = 0, hi = c->n_vocab - 1;
    while (lo <= hi) { /* vocab is sorted */
        int mid = (lo + hi) / 2, cmp = strncmp(c->vocab[mid], s, n);
        if (cmp == 0 && c->vocab[mid][n] != '\0') cmp = 1;
        if (cmp == 0) {
            c->row[mid] = 1.0f;
            return 0;
        }
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    c->bad = s;
    c->bad_len = n;
    return 1;
}

cf_status cf_datasets_from_image_csv_multi(const char *csv_path, const char *folder,
                                           const char *fn_col, const char *label_col,
                                           const char *valid_col, const char *label_delim,
                                           const cf_image_folder_options *opt, cf_dataset **train,
                                           cf_dataset **valid) {
    if (!train || !valid || !csv_path)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_image_csv_multi: NULL argument");
    *train = *valid = NULL;
    cf_image_folder_options o = opt ? *opt : (cf_image_folder_options){0};
    cf_status st = cf__image_options_check(&o, csv_path, "image options");
    if (st) return st;
    image_csv_rows r;
    if ((st = rows_read(csv_path, folder, fn_col, valid_col, &o, &r))) return st;
    label_pool pool = {0};
    char **vocab = NULL;
    int n_vocab = 0;
    float *ty = NULL, *vy = NULL;
    cf__image_items tr = {0}, va = {0};
    const cf_csv_table *t = r.t;
    const int lc = cf__image_csv_col(t, label_col, 1);
    if (lc < 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header", csv_path,
                     label_col ? label_col : "(second)");
        goto done;
    }
    /* MultiCategorize's vocabulary: the sorted union of the training rows' labels */
    for (int64_t i = 0; i < t->n_rows; i++)
        if (!r.is_valid[i] &&
            each_label(t->cells[i * t->n_cols + lc], label_delim, pool_add, &pool)) {
            st = CF_ERR_NOMEM;
            goto done;
        }
    if (pool.n > 1) qsort(pool.v, (size_t)pool.n, sizeof *pool.v, cf__cmp_str);
    int64_t u = 0;
    for (int64_t i = 0; i < pool.n; i++)
        if (u == 0 || strcmp(pool.v[u - 1], pool.v[i]) != 0)
            pool.v[u++] = pool.v[i];
        else
            cf_free(pool.v[i]);
    pool.n = u;
    if (u == 0 || u > 100000) {
        st = cf_fail(CF_ERR_FORMAT, "%s: the training rows have %lld distinct labels (1 to 100000)",
                     csv_path, (long long)u);
        goto done;
    }
    vocab = pool.v;
    n_vocab = (int)u;
    pool.v = NULL;
    for (int64_t i = 0; i < t->n_rows && !st; i++) st = push_row(&r, csv_path, i, &tr, &va);
    if (st) goto done;
    ty = cf_calloc((size_t)(tr.n > 0 ? tr.n : 1) * (size_t)n_vocab, sizeof(float));
    vy = cf_calloc((size_t)(va.n > 0 ? va.n : 1) * (size_t)n_vocab, sizeof(float));
    if (!ty || !vy) {
        st = CF_ERR_NOMEM;
        goto done;
    }
    for (int64_t i = 0, a = 0, b = 0; i < t->n_rows; i++) {
        encode_ctx c = {.vocab = vocab, .n_vocab = n_vocab};
        c.row = r.is_valid[i] ? vy + (size_t)b++ * n_vocab : ty + (size_t)a++ * n_vocab;
        if (each_label(t->cells[i * t->n_cols + lc], label_delim, encode_label, &c)) {
            st = cf_fail(CF_ERR_FORMAT, "%s:%lld: label '%.*s' is not among the training labels",
                         csv_path, (long long)t->row_line[i],
                         (int)(c.bad_len < 200 ? c.bad_len : 200), c.bad);
            goto done;
        }
    }
    st = build_sets(&tr, &va, csv_path, &o, vocab, n_vocab, n_vocab, ty, vy, train, valid);
    ty = vy = NULL; /* taken over (or freed) */
done:
    for (int64_t i = 0; i < pool.n && pool.v; i++) cf_free(pool.v[i]);
    cf_free(pool.v);
    cf__strv_free(vocab, n_vocab);
    cf_free(ty);
    cf_free(vy);
    cf__image_items_free(&tr);
    cf__image_items_free(&va);
    rows_free(&r);
    return st;
}

bool cf_dataset_is_multi_label(const cf_dataset *ds) {
    return ds && ds->n_classes > 1 && ds->target_dim == ds->n_classes && ds->n_points == 0;
}

size_t cf_label_set_str(const float *multi_hot, int n_classes, char *const *vocab, const char *sep,
                        char *buf, size_t size) {
    size_t k = 0;
    if (size) buf[0] = '\0';
    if (!sep) sep = ";";
    for (int c = 0; c < n_classes; c++) {
        if (!(multi_hot[c] > 0.5f)) continue;
        char id[16];
        const char *name = vocab ? vocab[c] : (snprintf(id, sizeof id, "%d", c), id);
        int w = snprintf(k < size ? buf + k : NULL, k < size ? size - k : 0, "%s%s", k ? sep : "",
                         name);
        if (w > 0) k += (size_t)w;
    }
    return k;
}

/* ---- points: PointBlock and PointScaler ------------------------------------------------- */

void cf_points_scale(float *xy, int n_points, int width, int height) {
    for (int i = 0; i < n_points; i++) {
        xy[2 * i] = xy[2 * i] * 2.0f / (float)width - 1.0f;
        xy[2 * i + 1] = xy[2 * i + 1] * 2.0f / (float)height - 1.0f;
    }
}

void cf_points_unscale(float *xy, int n_points, int width, int height) {
    for (int i = 0; i < n_points; i++) {
        xy[2 * i] = (xy[2 * i] + 1.0f) * (float)width / 2.0f;
        xy[2 * i + 1] = (xy[2 * i + 1] + 1.0f) * (float)height / 2.0f;
    }
}

void cf_points_flip_lr(float *xy, int n_points) {
    for (int i = 0; i < n_points; i++) xy[2 * i] = -xy[2 * i];
}

/* A number from a cell, or an error naming the file, line, column and value. */
static cf_status cell_number(const cf_csv_table *t, const char *csv_path, int64_t i, int col,
                             float *out) {
    const char *v = t->cells[i * t->n_cols + col];
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end != '\0' || !isfinite(d))
        return cf_fail(CF_ERR_FORMAT, "%s:%lld: column %s is '%s', not a number", csv_path,
                       (long long)t->row_line[i], t->header[col], v);
    *out = (float)d;
    return CF_OK;
}

/* Numeric targets from columns x_col (and, for points, y_col) of an image CSV: points are
 * scaled by each image's own size (PointScaler), values kept as they are. */
static cf_status numeric_targets(const char *csv_path, const char *folder, const char *fn_col,
                                 const char *x_col, const char *y_col, const char *valid_col,
                                 bool points, const cf_image_folder_options *opt,
                                 cf_dataset **train, cf_dataset **valid) {
    if (!train || !valid || !csv_path)
        return cf_fail(CF_ERR_INVALID, "image CSV with %s: NULL argument",
                       points ? "points" : "values");
    *train = *valid = NULL;
    cf_image_folder_options o = opt ? *opt : (cf_image_folder_options){0};
    cf_status st = cf__image_options_check(&o, csv_path, "image options");
    if (st) return st;
    /* PointScaler scales by the image's own size, which a squashing resize keeps; a crop would
     * move the points, and that is not supported here. */
    if (points && o.item_tfm &&
        !(o.item_tfm->kind == CF_ITEM_TFM_RESIZE && o.item_tfm->method == CF_RESIZE_SQUISH))
        return cf_fail(CF_ERR_UNSUPPORTED,
                       "%s: point targets take a squashing resize only (no crop item transform)",
                       csv_path);
    image_csv_rows r;
    if ((st = rows_read(csv_path, folder, fn_col, valid_col, &o, &r))) return st;
    const cf_csv_table *t = r.t;
    cf__image_items tr = {0}, va = {0};
    float *ty = NULL, *vy = NULL;
    const int td = points ? 2 : 1;
    const char *xn = x_col ? x_col : points ? "x" : NULL, *yn = y_col ? y_col : "y";
    const int xc = cf__image_csv_col(t, xn, 1), yc = points ? cf__image_csv_col(t, yn, -1) : 0;
    if (xc < 0 || yc < 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header", csv_path,
                     xc < 0 ? (xn ? xn : "(second)") : yn);
        goto done;
    }
    for (int64_t i = 0; i < t->n_rows && !st; i++) st = push_row(&r, csv_path, i, &tr, &va);
    if (st) goto done;
    ty = cf_calloc((size_t)(tr.n > 0 ? tr.n : 1) * td, sizeof(float));
    vy = cf_calloc((size_t)(va.n > 0 ? va.n : 1) * td, sizeof(float));
    if (!ty || !vy) {
        st = CF_ERR_NOMEM;
        goto done;
    }
    for (int64_t i = 0, a = 0, b = 0; i < t->n_rows && !st; i++) {
        const bool is_valid = r.is_valid[i];
        float *p = is_valid ? vy + td * b++ : ty + td * a++;
        if ((st = cell_number(t, csv_path, i, xc, &p[0])) ||
            (points && (st = cell_number(t, csv_path, i, yc, &p[1]))))
            break;
        if (!points) continue;
        /* the image's own size, from its header */
        const char *path = is_valid ? va.v[b - 1].path : tr.v[a - 1].path;
        void *data = NULL;
        size_t n = 0;
        int w = 0, h = 0;
        if ((st = cf_read_file(path, CF_IMAGE_MAX_FILE, &data, &n)) == CF_OK)
            st = cf__image_size(data, n, path, &w, &h);
        cf_free(data);
        if (st) break;
        cf_points_scale(p, 1, w, h);
    }
    if (st) goto done;
    st = build_sets(&tr, &va, csv_path, &o, NULL, 0, td, ty, vy, train, valid);
    ty = vy = NULL;
    if (st == CF_OK)
        for (int k = 0; k < 2; k++) { /* regression targets: no classes */
            cf_dataset *ds = k ? *valid : *train;
            ds->n_points = points ? 1 : 0;
            cf__strv_free(ds->vocab, 0);
            ds->vocab = NULL;
        }
done:
    cf_free(ty);
    cf_free(vy);
    cf__image_items_free(&tr);
    cf__image_items_free(&va);
    rows_free(&r);
    return st;
}

cf_status cf_datasets_from_image_points_csv(const char *csv_path, const char *folder,
                                            const char *fn_col, const char *x_col,
                                            const char *y_col, const char *valid_col,
                                            const cf_image_folder_options *opt, cf_dataset **train,
                                            cf_dataset **valid) {
    return numeric_targets(csv_path, folder, fn_col, x_col, y_col, valid_col, true, opt, train,
                           valid);
}

cf_status cf_datasets_from_image_csv_values(const char *csv_path, const char *folder,
                                            const char *fn_col, const char *value_col,
                                            const char *valid_col,
                                            const cf_image_folder_options *opt, cf_dataset **train,
                                            cf_dataset **valid) {
    return numeric_targets(csv_path, folder, fn_col, value_col, NULL, valid_col, false, opt, train,
                           valid);
}
