/* fastai's ImageDataLoaders.from_csv: images listed in a CSV, one a row, with their labels and
 * an optional column marking the validation rows. */
#include "data_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cf__image_csv_col(const cf_csv_table *t, const char *name, int fallback) {
    if (!name) return fallback < t->n_cols ? fallback : -1;
    return cf_csv_column(t, name);
}

int cf__parse_bool(const char *v) {
    static const char *const yes[] = {"1", "true", "True", "TRUE"};
    static const char *const no[] = {"0", "false", "False", "FALSE"};
    for (size_t i = 0; i < 4; i++) {
        if (strcmp(v, yes[i]) == 0) return 1;
        if (strcmp(v, no[i]) == 0) return 0;
    }
    return -1;
}

cf_status cf_datasets_from_image_csv(const char *csv_path, const char *folder, const char *fn_col,
                                     const char *label_col, const char *valid_col,
                                     const cf_image_folder_options *opt, cf_dataset **train,
                                     cf_dataset **valid) {
    cf_image_csv_options c = {
        .folder = folder, .fn_col = fn_col, .label_col = label_col, .valid_col = valid_col};
    return cf_datasets_from_image_csv_opts(csv_path, &c, opt, train, valid);
}

cf_status cf_datasets_from_image_csv_opts(const char *csv_path, const cf_image_csv_options *csv,
                                          const cf_image_folder_options *opt, cf_dataset **train,
                                          cf_dataset **valid) {
    if (!train || !valid || !csv_path)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_image_csv: NULL argument");
    cf_image_csv_options co = csv ? *csv : (cf_image_csv_options){0};
    const char *folder = co.folder, *fn_col = co.fn_col, *label_col = co.label_col,
               *valid_col = co.valid_col, *suffix = co.suffix ? co.suffix : "";
    *train = *valid = NULL;
    cf_image_folder_options o = opt ? *opt : (cf_image_folder_options){0};
    cf_status st = cf__image_options_check(&o, csv_path, "image options");
    if (st) return st;
    cf_csv_table *t = NULL;
    st = cf_csv_read(csv_path, ',', &t);
    if (st) return st;
    int fc = cf__image_csv_col(t, fn_col, 0), lc = cf__image_csv_col(t, label_col, 1);
    int vc = valid_col ? cf__image_csv_col(t, valid_col, -1) : -1;
    char base[PATH_MAX], path[PATH_MAX], name[PATH_MAX];
    char **vocab = NULL;
    int n_vocab = 0;
    cf__image_items tr = {0}, va = {0};
    int64_t *ti = NULL, *vi = NULL, nt = 0, nv = 0;
    int8_t *is_valid = NULL;
    if (fc < 0 || lc < 0 || (valid_col && vc < 0)) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header", csv_path,
                     fc < 0   ? (fn_col ? fn_col : "(first)")
                     : lc < 0 ? (label_col ? label_col : "(second)")
                              : valid_col);
        goto done;
    }
    /* The folder the names are relative to. */
    {
        const char *slash = strrchr(csv_path, '/');
        int dir_len = slash ? (int)(slash - csv_path) : 1;
        const char *dir = slash ? csv_path : ".";
        int k = folder && folder[0] == '/' ? snprintf(base, sizeof base, "%s", folder)
                : folder ? snprintf(base, sizeof base, "%.*s/%s", dir_len, dir, folder)
                         : snprintf(base, sizeof base, "%.*s", dir_len, dir);
        if (k < 0 || (size_t)k >= sizeof base) {
            st = cf_fail(CF_ERR_INVALID, "%s: folder path too long", csv_path);
            goto done;
        }
    }
    if (!(is_valid = cf_calloc((size_t)(t->n_rows > 0 ? t->n_rows : 1), 1))) {
        st = CF_ERR_NOMEM;
        goto done;
    }
    if (vc >= 0) {
        for (int64_t r = 0; r < t->n_rows; r++) {
            const char *v = t->cells[r * t->n_cols + vc];
            int b = cf__parse_bool(v);
            if (b < 0) {
                st = cf_fail(CF_ERR_FORMAT, "%s:%lld: column %s is '%s', not a boolean", csv_path,
                             (long long)t->row_line[r], valid_col, v);
                goto done;
            }
            is_valid[r] = (int8_t)b;
        }
    } else if (o.valid_pct > 0) {
        if ((st = cf_random_split(t->n_rows, o.valid_pct, o.seed, &ti, &nt, &vi, &nv))) goto done;
        for (int64_t i = 0; i < nv; i++) is_valid[vi[i]] = 1;
    }
    /* The classes: the sorted labels of the training rows. (Multi-label, fastai's label_delim,
     * splits each label cell here into its classes.) */
    {
        const char **labels = cf_malloc((size_t)(t->n_rows > 0 ? t->n_rows : 1) * sizeof *labels);
        if (!labels) {
            st = CF_ERR_NOMEM;
            goto done;
        }
        int64_t m = 0;
        for (int64_t r = 0; r < t->n_rows; r++)
            if (!is_valid[r]) labels[m++] = t->cells[r * t->n_cols + lc];
        st = cf__sorted_vocab(labels, m, csv_path, " has no training rows", &vocab, &n_vocab);
        cf_free(labels);
        if (st) goto done;
    }
    for (int64_t r = 0; r < t->n_rows && !st; r++) {
        const char *fn = t->cells[r * t->n_cols + fc], *lab = t->cells[r * t->n_cols + lc];
        int label = -1, lo = 0, hi = n_vocab - 1;
        while (lo <= hi) { /* vocab is sorted */
            int mid = (lo + hi) / 2, c = strcmp(vocab[mid], lab);
            if (c == 0) {
                label = mid;
                break;
            }
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid - 1;
        }
        if (label < 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s:%lld: class '%s' is not among the training classes",
                         csv_path, (long long)t->row_line[r], lab);
            break;
        }
        if (fn[0] == '\0') {
            st = cf_fail(CF_ERR_FORMAT, "%s:%lld: empty file name", csv_path,
                         (long long)t->row_line[r]);
            break;
        }
        /* fastai's suffix: appended to every name ("" when none) */
        int k = snprintf(name, sizeof name, "%s%s", fn, suffix);
        if (k < 0 || (size_t)k >= sizeof name) {
            st = cf_fail(CF_ERR_FORMAT, "%s:%lld: file name too long", csv_path,
                         (long long)t->row_line[r]);
            break;
        }
        if ((st = cf__path_join(path, sizeof path, base, name))) break;
        st = cf__image_items_push(is_valid[r] ? &va : &tr, path, label);
    }
    if (st) goto done;
    st = cf__image_sets_build(&tr, &va, vocab, n_vocab, csv_path, csv_path, &o, train, valid);
done:
    cf_csv_table_free(t);
    cf__strv_free(vocab, n_vocab);
    cf__image_items_free(&tr);
    cf__image_items_free(&va);
    cf_free(ti);
    cf_free(vi);
    cf_free(is_valid);
    return st;
}
