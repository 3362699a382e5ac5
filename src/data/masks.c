/* Segmentation data (fastai's SegmentationDataLoaders.from_label_func): images in a folder, each
 * mask found from its image's name by a rule, the codes from a file or the caller. Masks are
 * 8-bit images whose pixel values are class ids, resized nearest-neighbour as fastai resizes a
 * TensorMask. */
#include "data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

void cf_codes_free(char **codes, int n_codes) {
    cf__strv_free(codes, n_codes);
}

cf_status cf_codes_read(const char *path, char ***codes, int *n_codes) {
    if (!codes || !n_codes || !path) return cf_fail(CF_ERR_INVALID, "cf_codes_read: NULL argument");
    *codes = NULL;
    *n_codes = 0;
    void *data;
    size_t size;
    cf_status st = cf_read_file(path, (size_t)1 << 24, &data, &size);
    if (st) return st;
    char *text = data;
    int n = 0, cap = 0;
    char **v = NULL;
    size_t pos = 0;
    for (int line = 1; pos < size && !st; line++) {
        size_t end = pos;
        while (end < size && text[end] != '\n') end++;
        size_t a = pos, b = end;
        while (a < b && (text[a] == ' ' || text[a] == '\t')) a++;
        while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\r')) b--;
        for (size_t i = a; i < b && !st; i++)
            if (text[i] == '\0')
                st = cf_fail(CF_ERR_FORMAT, "%s:%d: a NUL byte in a code", path, line);
        if (!st && b > a) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                char **w = cf_malloc((size_t)cap * sizeof *w);
                if (!w) {
                    st = CF_ERR_NOMEM;
                    break;
                }
                if (n) memcpy(w, v, (size_t)n * sizeof *w);
                cf_free(v);
                v = w;
            }
            if (!(v[n] = cf_malloc(b - a + 1))) {
                st = CF_ERR_NOMEM;
                break;
            }
            memcpy(v[n], text + a, b - a);
            v[n][b - a] = '\0';
            n++;
        }
        pos = end + 1;
    }
    cf_free(data);
    if (!st && n < 1) st = cf_fail(CF_ERR_FORMAT, "%s: no codes (one class name a line)", path);
    if (!st && n > 255)
        st = cf_fail(CF_ERR_FORMAT, "%s: %d codes; 8-bit masks hold at most 256 classes", path, n);
    if (st) {
        for (int i = 0; i < n; i++) cf_free(v[i]);
        cf_free(v);
        return st;
    }
    *codes = v;
    *n_codes = n;
    return CF_OK;
}

static bool is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    static const char *const ext[] = {".png", ".jpg", ".jpeg", ".bmp"};
    for (size_t i = 0; dot && i < sizeof ext / sizeof *ext; i++)
        if (strcasecmp(dot, ext[i]) == 0) return true;
    return false;
}

/* The image files directly in dir (not in subfolders: fastai's examples keep masks in a sibling
 * folder), sorted. */
static cf_status list_images(const char *dir, char ***names, int64_t *n) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return cf_fail(CF_ERR_IO, "cannot open folder %s: %s", dir, strerror(errno));
    int64_t cap = 0;
    char **v = NULL;
    cf_status st = CF_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !is_image_name(e->d_name)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **w = cf_malloc((size_t)cap * sizeof *w);
            if (!w) {
                st = CF_ERR_NOMEM;
                break;
            }
            if (*n) memcpy(w, v, (size_t)*n * sizeof *w);
            cf_free(v);
            v = w;
        }
        if (!(v[*n] = cf_strdup(e->d_name)))
            st = CF_ERR_NOMEM;
        else
            (*n)++;
    }
    closedir(d);
    if (*n > 1) qsort(v, (size_t)*n, sizeof *v, cf__cmp_str);
    *names = v;
    if (!st && *n == 0) st = cf_fail(CF_ERR_FORMAT, "%s: no image files (.png, .jpg, .bmp)", dir);
    return st;
}

/* rule->dir/<stem of name><suffix><ext or name's extension>. */
static cf_status mask_path(const cf_mask_rule *rule, const char *name, char *buf, size_t size) {
    const char *dot = strrchr(name, '.');
    int stem = dot ? (int)(dot - name) : (int)strlen(name);
    int k = snprintf(buf, size, "%s/%.*s%s%s", rule->dir, stem, name,
                     rule->suffix ? rule->suffix : "", rule->ext ? rule->ext : (dot ? dot : ""));
    if (k < 0 || (size_t)k >= size)
        return cf_fail(CF_ERR_INVALID, "mask path too long for %s in %s", name, rule->dir);
    return CF_OK;
}

/* Reads one mask (8-bit, class ids) into out (oh x ow ids, nearest-neighbour from its own
 * size, which must be the image's iw x ih), checking every pixel against n_codes. */
static cf_status read_mask(const char *path, int iw, int ih, int ow, int oh, int n_codes,
                           float *out) {
    int w = 0, h = 0;
    void *data;
    size_t size;
    cf_status st = cf_read_file(path, CF_IMAGE_MAX_FILE, &data, &size);
    if (st) return st;
    st = cf__image_size(data, size, path, &w, &h);
    if (!st && (w != iw || h != ih))
        st = cf_fail(CF_ERR_FORMAT, "%s: mask is %dx%d, its image %dx%d", path, w, h, iw, ih);
    float *px = st ? NULL : cf_malloc((size_t)w * h * sizeof(float));
    if (!st && !px) st = CF_ERR_NOMEM;
    if (!st) st = cf_image_decode(data, size, path, 1, 0, px, &w, &h);
    cf_free(data);
    /* PIL's NEAREST: source pixel floor((o + 0.5) * in / out) */
    for (int y = 0; y < oh && !st; y++) {
        int sy = (int)(((double)y + 0.5) * h / oh);
        for (int x = 0; x < ow && !st; x++) {
            int sx = (int)(((double)x + 0.5) * w / ow);
            float v = roundf(px[(size_t)sy * w + sx] * 255.0f);
            if (v >= (float)n_codes)
                st = cf_fail(CF_ERR_FORMAT,
                             "%s: pixel x=%d y=%d is %d, not a class id (%d codes: 0..%d)", path,
                             sx, sy, (int)v, n_codes, n_codes - 1);
            else
                out[(size_t)y * ow + x] = v;
        }
    }
    cf_free(px);
    return st;
}

static void names_free(char **v, int64_t n) {
    for (int64_t i = 0; i < n; i++) cf_free(v[i]);
    cf_free(v);
}

cf_status cf_datasets_from_masks(const char *images_dir, const cf_mask_rule *rule,
                                 const char *const *codes, int n_codes,
                                 const cf_image_folder_options *opt, cf_dataset **train,
                                 cf_dataset **valid) {
    if (!train || !valid) return cf_fail(CF_ERR_INVALID, "cf_datasets_from_masks: out is NULL");
    *train = *valid = NULL;
    if (!images_dir || !rule || !rule->dir || !codes)
        return cf_fail(CF_ERR_INVALID,
                       "cf_datasets_from_masks: images, mask rule and codes needed");
    if (n_codes < 1 || n_codes > 256)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_masks: %d codes outside [1, 256]",
                       n_codes);
    cf_image_folder_options o = opt ? *opt : (cf_image_folder_options){0};
    if (o.channels == 0) o.channels = 3;
    if (o.channels != 1 && o.channels != 3)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_masks: %d channels (1 or 3)", o.channels);
    if (o.item_tfm || o.load == CF_IMAGE_LOAD_STREAM)
        return cf_fail(CF_ERR_UNSUPPORTED,
                       "cf_datasets_from_masks: masks are decoded up front and resized with "
                       "`size` (no item transform, no streaming)");
    if (o.size < 0 || o.size > 4096)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_masks: size %d outside [0, 4096]", o.size);
    char **names;
    int64_t n;
    cf_status st = list_images(images_dir, &names, &n);
    if (st) {
        names_free(names, n);
        return st;
    }
    char path[PATH_MAX], mpath[PATH_MAX];
    /* the set's size: `size`, or the first image's (all must then share it) */
    int w0 = 0, h0 = 0;
    if ((st = cf__path_join(path, sizeof path, images_dir, names[0]))) goto done_names;
    {
        void *data;
        size_t size;
        if ((st = cf_read_file(path, CF_IMAGE_MAX_FILE, &data, &size))) goto done_names;
        st = cf__image_size(data, size, path, &w0, &h0);
        cf_free(data);
        if (st) goto done_names;
    }
    const int ow = o.size ? o.size : w0, oh = o.size ? o.size : h0;
    const int C = o.channels;
    cf_dataset *all = cf__dataset_alloc(n, cf_shape_make(3, (int[]){C, oh, ow}), oh * ow);
    if (!all) {
        st = CF_ERR_NOMEM;
        goto done_names;
    }
    all->n_classes = n_codes;
    all->masks = true;
    if (!cf__dataset_set_source(all, images_dir) || !(all->vocab = cf__strv_dup(codes, n_codes))) {
        st = CF_ERR_NOMEM;
        goto done_all;
    }
    for (int64_t i = 0; i < n && !st; i++) {
        int w = o.size ? 0 : ow, h = o.size ? 0 : oh;
        if ((st = cf__path_join(path, sizeof path, images_dir, names[i])) ||
            (st = mask_path(rule, names[i], mpath, sizeof mpath)))
            break;
        st = cf_image_read(path, C, o.size, all->x + (size_t)i * C * oh * ow, &w, &h);
        if (!st) st = read_mask(mpath, w, h, ow, oh, n_codes, all->y + (size_t)i * oh * ow);
    }
    if (st) goto done_all;
    int64_t *ti = NULL, *vi = NULL, nt = 0, nv = 0;
    if ((st = cf_random_split(n, o.valid_pct, o.seed, &ti, &nt, &vi, &nv))) goto done_all;
    st = cf_dataset_subset(all, ti, nt, train);
    if (!st) st = cf_dataset_subset(all, vi, nv, valid);
    if (st) {
        cf_dataset_free(*train);
        *train = NULL;
    }
    cf_free(ti);
    cf_free(vi);
done_all:
    cf_dataset_free(all);
done_names:
    names_free(names, n);
    return st;
}
