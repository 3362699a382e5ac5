/* Image folders: one subfolder per class (links that lead out of the root refused unless
 * followed on purpose); GrandparentSplitter (train/ and valid/) or RandomSplitter. */
#include "data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* Sorted names of the entries of dir (no "." entries, no hidden files). */
static cf_status list_dir(const char *dir, char ***names, int *count) {
    *names = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return cf_fail(CF_ERR_IO, "cannot open folder %s: %s", dir, strerror(errno));
    int n = 0, cap = 0;
    char **v = NULL;
    struct dirent *e;
    cf_status st = CF_OK;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            int ncap = cap ? cap * 2 : 32;
            char **nv = cf_malloc((size_t)ncap * sizeof *nv);
            if (!nv) {
                st = CF_ERR_NOMEM;
                break;
            }
            if (n) memcpy(nv, v, (size_t)n * sizeof *nv);
            cf_free(v);
            v = nv;
            cap = ncap;
        }
        if (!(v[n] = cf_strdup(e->d_name))) {
            st = CF_ERR_NOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (st) {
        cf__strv_free(v, n);
        return cf_fail_context(st, "listing %s", dir);
    }
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cf__cmp_str);
    *names = v;
    *count = n;
    return CF_OK;
}

/* Checks that path does not lead out of root_real (unless allowed); fills *st_out. */
static cf_status check_inside(const char *path, const char *root_real, bool follow,
                              struct stat *st_out) {
    if (stat(path, st_out) != 0)
        return cf_fail(CF_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    if (follow) return CF_OK;
    struct stat lst;
    if (lstat(path, &lst) != 0)
        return cf_fail(CF_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    if (!S_ISLNK(lst.st_mode)) return CF_OK;
    char *real = realpath(path, NULL);
    if (!real) return cf_fail(CF_ERR_IO, "cannot resolve %s: %s", path, strerror(errno));
    size_t rl = strlen(root_real);
    bool inside = strncmp(real, root_real, rl) == 0 && (real[rl] == '/' || real[rl] == '\0');
    if (!inside) {
        cf_status s = cf_fail(CF_ERR_IO,
                              "%s is a symbolic link leading out of the data root %s (to %s); "
                              "set follow_symlinks to allow it",
                              path, root_real, real);
        free(real);
        return s;
    }
    free(real);
    return CF_OK;
}

static bool is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return false;
    static const char *const ext[] = {".png", ".jpg", ".jpeg", ".bmp"};
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
        if (strcasecmp(dot, ext[i]) == 0) return true;
    return false;
}

/* Class folders of dir: their sorted names. */
static cf_status class_folders(const char *dir, const char *root_real, bool follow, char ***classes,
                               int *n_classes) {
    char **names;
    int n;
    cf_status st = list_dir(dir, &names, &n);
    if (st) return st;
    int k = 0;
    char path[PATH_MAX];
    for (int i = 0; i < n; i++) {
        struct stat sb;
        if ((st = cf__path_join(path, sizeof path, dir, names[i])) ||
            (st = check_inside(path, root_real, follow, &sb))) {
            cf__strv_free(names, n);
            return st;
        }
        if (S_ISDIR(sb.st_mode)) {
            char *keep = names[i];
            names[i] = NULL;
            names[k++] = keep;
        } else {
            cf_free(names[i]);
            names[i] = NULL;
        }
    }
    *classes = names;
    *n_classes = k;
    return CF_OK;
}

/* Adds the images of dir/<class>/ for every class folder, labelled by its index in vocab. */
static cf_status collect(const char *dir, const char *root_real, bool follow, char **vocab,
                         int n_vocab, cf__image_items *out) {
    char **classes;
    int n_classes;
    cf_status st = class_folders(dir, root_real, follow, &classes, &n_classes);
    if (st) return st;
    char cdir[PATH_MAX], path[PATH_MAX];
    for (int c = 0; c < n_classes && !st; c++) {
        int label = -1;
        for (int v = 0; v < n_vocab; v++)
            if (strcmp(vocab[v], classes[c]) == 0) label = v;
        if (label < 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s/%s: class '%s' is not among the training classes", dir,
                         classes[c], classes[c]);
            break;
        }
        if ((st = cf__path_join(cdir, sizeof cdir, dir, classes[c]))) break;
        char **files;
        int n_files;
        if ((st = list_dir(cdir, &files, &n_files))) break;
        int64_t before = out->n;
        for (int f = 0; f < n_files && !st; f++) {
            struct stat sb;
            if (!is_image_name(files[f])) continue;
            if ((st = cf__path_join(path, sizeof path, cdir, files[f]))) break;
            if ((st = check_inside(path, root_real, follow, &sb))) break;
            if (!S_ISREG(sb.st_mode)) continue;
            if ((st = cf__image_items_push(out, path, label)))
                cf_fail_context(st, "listing %s", cdir);
        }
        cf__strv_free(files, n_files);
        if (!st && out->n == before)
            st = cf_fail(CF_ERR_FORMAT, "class folder %s has no images (.png, .jpg, .jpeg, .bmp)",
                         cdir);
    }
    cf__strv_free(classes, n_classes);
    return st;
}

cf_status cf_datasets_from_image_folder(const char *root, const cf_image_folder_options *opt,
                                        cf_dataset **train, cf_dataset **valid) {
    if (!train || !valid || !root)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_image_folder: NULL argument");
    *train = *valid = NULL;
    cf_image_folder_options o = opt ? *opt : (cf_image_folder_options){0};
    if (!o.train) o.train = "train";
    if (!o.valid) o.valid = "valid";
    if (o.item_tfm &&
        (o.item_tfm->kind == CF_ITEM_TFM_NONE || o.item_tfm->width < 1 || o.item_tfm->height < 1 ||
         o.item_tfm->width > 65536 || o.item_tfm->height > 65536))
        return cf_fail(CF_ERR_INVALID, "%s: image folder options: item transform %d, size %d x %d",
                       root, o.item_tfm ? (int)o.item_tfm->kind : 0, o.item_tfm->width,
                       o.item_tfm->height);
    cf_status st = cf__image_options_check(&o, root, "image folder options");
    if (st) return st;
#ifndef CF_HAVE_STB
    return cf_fail(CF_ERR_UNSUPPORTED, "%s: corefit was built without stb (libstb-dev)", root);
#endif
    char *root_real = realpath(root, NULL);
    if (!root_real) return cf_fail(CF_ERR_IO, "cannot open folder %s: %s", root, strerror(errno));
    char tdir[PATH_MAX], vdir[PATH_MAX];
    char **vocab = NULL;
    int n_vocab = 0;
    cf__image_items tr = {0}, va = {0}, all = {0};
    int64_t *ti = NULL, *vi = NULL;
    if (o.valid_pct > 0) {
        snprintf(tdir, sizeof tdir, "%s", root);
        if ((st = class_folders(tdir, root_real, o.follow_symlinks, &vocab, &n_vocab))) goto done;
        if (n_vocab == 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s has no class folders", tdir);
            goto done;
        }
        if ((st = collect(tdir, root_real, o.follow_symlinks, vocab, n_vocab, &all))) goto done;
        int64_t nt, nv;
        if ((st = cf_random_split(all.n, o.valid_pct, o.seed, &ti, &nt, &vi, &nv))) goto done;
        for (int64_t i = 0; i < nt && !st; i++)
            st = cf__image_items_push(&tr, all.v[ti[i]].path, all.v[ti[i]].label);
        for (int64_t i = 0; i < nv && !st; i++)
            st = cf__image_items_push(&va, all.v[vi[i]].path, all.v[vi[i]].label);
        if (st) goto done;
    } else {
        if ((st = cf__path_join(tdir, sizeof tdir, root, o.train)) ||
            (st = cf__path_join(vdir, sizeof vdir, root, o.valid)))
            goto done;
        if ((st = class_folders(tdir, root_real, o.follow_symlinks, &vocab, &n_vocab))) goto done;
        if (n_vocab == 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s has no class folders", tdir);
            goto done;
        }
        if ((st = collect(tdir, root_real, o.follow_symlinks, vocab, n_vocab, &tr))) goto done;
        struct stat sb;
        if (stat(vdir, &sb) == 0 &&
            (st = collect(vdir, root_real, o.follow_symlinks, vocab, n_vocab, &va)))
            goto done;
    }
    st = cf__image_sets_build(&tr, &va, vocab, n_vocab, tdir, o.valid_pct > 0 ? tdir : vdir, &o,
                              train, valid);
done:
    if (st) {
        cf_dataset_free(*train);
        cf_dataset_free(*valid);
        *train = *valid = NULL;
    }
    free(root_real);
    cf__strv_free(vocab, n_vocab);
    cf__image_items_free(&tr);
    cf__image_items_free(&va);
    cf__image_items_free(&all);
    cf_free(ti);
    cf_free(vi);
    return st;
}
