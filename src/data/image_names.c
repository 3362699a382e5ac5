/* fastai's ImageDataLoaders.from_name_re (and from_name_func written as a regular expression):
 * the images under a folder, each labelled by a POSIX extended regular expression applied to its
 * file name. */
#include "data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* A growing list of owned strings. */
typedef struct name_list {
    char **v;
    int64_t n, cap;
} name_list;

static cf_status name_list_push(name_list *l, const char *s) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 64;
        char **v = cf_malloc((size_t)cap * sizeof *v);
        if (!v) return CF_ERR_NOMEM;
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        cf_free(l->v);
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = cf_strdup(s))) return CF_ERR_NOMEM;
    l->n++;
    return CF_OK;
}

static void name_list_free(name_list *l) {
    for (int64_t i = 0; i < l->n; i++) cf_free(l->v[i]);
    cf_free(l->v);
    memset(l, 0, sizeof *l);
}

static bool is_image_file_name(const char *name) {
    const char *dot = strrchr(name, '.');
    static const char *const ext[] = {".png", ".jpg", ".jpeg", ".bmp"};
    for (size_t i = 0; dot && i < sizeof ext / sizeof *ext; i++)
        if (strcasecmp(dot, ext[i]) == 0) return true;
    return false;
}

/* fastai's get_image_files: the image files under dir, in every subfolder (hidden entries and
 * links to folders skipped, so that a link cannot loop), in sorted order at each level. */
static cf_status find_images(const char *dir, int depth, name_list *out) {
    if (depth > 32) return cf_fail(CF_ERR_FORMAT, "%s: folders nested more than 32 deep", dir);
    DIR *d = opendir(dir);
    if (!d) return cf_fail(CF_ERR_IO, "cannot open folder %s: %s", dir, strerror(errno));
    name_list names = {0};
    cf_status st = CF_OK;
    struct dirent *e;
    while (!st && (e = readdir(d)))
        if (e->d_name[0] != '.') st = name_list_push(&names, e->d_name);
    closedir(d);
    if (names.n > 1) qsort(names.v, (size_t)names.n, sizeof *names.v, cf__cmp_str);
    char path[PATH_MAX];
    for (int64_t i = 0; i < names.n && !st; i++) {
        struct stat sb, lsb;
        if ((st = cf__path_join(path, sizeof path, dir, names.v[i]))) break;
        if (lstat(path, &lsb) != 0 || stat(path, &sb) != 0) continue; /* a dangling link */
        if (S_ISDIR(sb.st_mode)) {
            if (!S_ISLNK(lsb.st_mode)) st = find_images(path, depth + 1, out);
        } else if (is_image_file_name(names.v[i])) {
            st = name_list_push(out, path);
        }
    }
    name_list_free(&names);
    return st;
}

/* The label of one file name: the first group of the pattern's first match (fastai's
 * RegexLabeller), or the whole match when the pattern has no group. */
static cf_status label_of(const regex_t *re, const char *pattern, const char *path, char *label,
                          size_t size) {
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    regmatch_t m[2];
    if (regexec(re, name, 2, m, 0) != 0)
        return cf_fail(CF_ERR_FORMAT, "%s: the file name '%s' does not match the pattern '%s'",
                       path, name, pattern);
    regmatch_t g = re->re_nsub >= 1 && m[1].rm_so >= 0 ? m[1] : m[0];
    size_t len = (size_t)(g.rm_eo - g.rm_so);
    if (len == 0)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: the pattern '%s' gives the file name '%s' an empty label", path,
                       pattern, name);
    if (len >= size)
        return cf_fail(CF_ERR_FORMAT, "%s: the label taken from '%s' is over %zu bytes", path, name,
                       size - 1);
    memcpy(label, name + g.rm_so, len);
    label[len] = '\0';
    return CF_OK;
}

static int label_index(char *const *vocab, int n, const char *label) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(vocab[mid], label);
        if (c == 0) return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

cf_status cf_datasets_from_image_names(const char *dir, const char *pattern,
                                       const cf_image_folder_options *opt, cf_dataset **train,
                                       cf_dataset **valid) {
    if (!train || !valid || !dir || !pattern)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_image_names: NULL argument");
    *train = *valid = NULL;
    cf_image_folder_options o = opt ? *opt : (cf_image_folder_options){0};
    cf_status st = cf__image_options_check(&o, dir, "image options");
    if (st) return st;
    regex_t re;
    int rc = regcomp(&re, pattern, REG_EXTENDED);
    if (rc != 0) {
        char why[256];
        regerror(rc, &re, why, sizeof why);
        return cf_fail(CF_ERR_INVALID, "the pattern '%s' is not a regular expression: %s", pattern,
                       why);
    }
    name_list files = {0}, labels = {0};
    char **vocab = NULL;
    int n_vocab = 0;
    int64_t *ti = NULL, *vi = NULL, nt = 0, nv = 0;
    int8_t *is_valid = NULL;
    cf__image_items tr = {0}, va = {0};
    char label[1024];
    st = find_images(dir, 0, &files);
    if (!st && files.n == 0)
        st = cf_fail(CF_ERR_FORMAT, "%s: no image files (.png, .jpg, .jpeg, .bmp) found", dir);
    for (int64_t i = 0; i < files.n && !st; i++)
        if (!(st = label_of(&re, pattern, files.v[i], label, sizeof label)))
            st = name_list_push(&labels, label);
    if (st) goto done;
    if (!(is_valid = cf_calloc((size_t)files.n, 1))) {
        st = CF_ERR_NOMEM;
        goto done;
    }
    if (o.valid_pct > 0) { /* fastai's RandomSplitter(valid_pct, seed) over the files */
        if ((st = cf_random_split(files.n, o.valid_pct, o.seed, &ti, &nt, &vi, &nv))) goto done;
        for (int64_t i = 0; i < nv; i++) is_valid[vi[i]] = 1;
    }
    /* the classes: the sorted labels of the training files */
    {
        const char **v = cf_malloc((size_t)(files.n > 0 ? files.n : 1) * sizeof *v);
        if (!v) {
            st = CF_ERR_NOMEM;
            goto done;
        }
        int64_t m = 0;
        for (int64_t i = 0; i < files.n; i++)
            if (!is_valid[i]) v[m++] = labels.v[i];
        st = cf__sorted_vocab(v, m, dir, ": no training images", &vocab, &n_vocab);
        cf_free(v);
        if (st) goto done;
    }
    for (int64_t i = 0; i < files.n && !st; i++) {
        int k = label_index(vocab, n_vocab, labels.v[i]);
        if (k < 0)
            st = cf_fail(CF_ERR_FORMAT,
                         "%s: class '%s' (a validation image) is not among the %d training classes",
                         files.v[i], labels.v[i], n_vocab);
        else
            st = cf__image_items_push(is_valid[i] ? &va : &tr, files.v[i], k);
    }
    if (st) goto done;
    st = cf__image_sets_build(&tr, &va, vocab, n_vocab, dir, dir, &o, train, valid);
done:
    regfree(&re);
    name_list_free(&files);
    name_list_free(&labels);
    cf__strv_free(vocab, n_vocab);
    cf__image_items_free(&tr);
    cf__image_items_free(&va);
    cf_free(ti);
    cf_free(vi);
    cf_free(is_valid);
    return st;
}
