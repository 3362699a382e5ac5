/* The data of train, lr-find and eval: IDX files, image folders and lists, CSV tables; --limit
 * and --skip-bad applied. */
#include "corefit.h"
#include "photo.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- data ---------------------------------------------------------------------------------- */

bool cli_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static cf_status idx_file(const char *dir, const char *prefix, const char *kind, int d, char *path,
                          size_t size) {
    snprintf(path, size, "%s/%s-%s-idx%d-ubyte.gz", dir, prefix, kind, d);
    if (cli_exists(path)) return CF_OK;
    snprintf(path, size, "%s/%s-%s-idx%d-ubyte", dir, prefix, kind, d);
    if (cli_exists(path)) return CF_OK;
    return cf_fail(CF_ERR_IO, "no %s-%s-idx%d-ubyte(.gz) in %s", prefix, kind, d, dir);
}

static int cmp_index(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* n samples of *ds (n < ds->n) drawn at random from seed, replacing it: for classes, a
 * stratified sample (each class keeps its share of the set, rounded by largest remainder, and
 * classes that rounding left without a sample go first), so that a folder listed class
 * by class does not lose whole classes. The kept samples stay in the set's order. */
static cf_status take_sample(cf_dataset **ds, int64_t n, uint64_t seed) {
    const cf_dataset *d = *ds;
    if (n <= 0 || n >= d->n) return CF_OK;
    int k = d->n_classes > 0 && d->target_dim == 1 ? d->n_classes : 1;
    int64_t *count = cf_calloc((size_t)k, sizeof *count),
            *quota = cf_calloc((size_t)k, sizeof *quota);
    int64_t *order = cf_malloc((size_t)d->n * sizeof *order),
            *keep = cf_malloc((size_t)n * sizeof *keep);
    double *rest = cf_calloc((size_t)k, sizeof *rest);
    cf_status st = count && quota && order && keep && rest ? CF_OK : CF_ERR_NOMEM;
    int64_t kept = 0;
    if (st == CF_OK) {
        int64_t got = 0;
        for (int64_t i = 0; i < d->n; i++) {
            int c = k > 1 ? (int)d->y[i] : 0;
            count[c < 0 || c >= k ? 0 : c]++;
        }
        for (int c = 0; c < k; c++) {
            double share = (double)n * (double)count[c] / (double)d->n;
            quota[c] = (int64_t)share;
            rest[c] = share - (double)quota[c];
            got += quota[c];
        }
        /* largest remainders first; a class with none yet goes before any remainder */
        while (got < n) {
            int best = -1;
            for (int c = 0; c < k; c++) {
                if (quota[c] >= count[c]) continue;
                double r = rest[c] + (quota[c] == 0 ? 2.0 : 0.0);
                if (best < 0 || r > rest[best] + (quota[best] == 0 ? 2.0 : 0.0)) best = c;
            }
            quota[best]++;
            rest[best] = -1.0;
            got++;
        }
        for (int64_t i = 0; i < d->n; i++) order[i] = i;
        cf_rng rng;
        cf_rng_seed(&rng, seed);
        cf_rng_shuffle(&rng, order, d->n);
        for (int64_t i = 0; i < d->n && kept < n; i++) {
            int c = k > 1 ? (int)d->y[order[i]] : 0;
            c = c < 0 || c >= k ? 0 : c;
            if (quota[c] > 0) {
                quota[c]--;
                keep[kept++] = order[i];
            }
        }
        qsort(keep, (size_t)kept, sizeof *keep, cmp_index);
    }
    cf_dataset *sub = NULL;
    if (st == CF_OK) st = cf_dataset_subset(d, keep, kept, &sub);
    cf_free(count);
    cf_free(quota);
    cf_free(order);
    cf_free(keep);
    cf_free(rest);
    if (st) return st;
    cf_dataset_free(*ds);
    *ds = sub;
    return CF_OK;
}

/* --skip-bad: fastai's verify_images over a streamed set, on every thread: each file is decoded
 * once and those that cannot be (with their error) are left out before the fit, so that every
 * epoch and every worker sees the same samples and the count is known. */
typedef struct verify_job {
    const cf_dataset *ds;
    char **why; /* per sample: the error of a bad file, else NULL */
    size_t per;
} verify_job;

static void verify_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    verify_job *j = ctx;
    float *buf = cf_malloc(j->per * sizeof(float));
    for (int64_t i = begin; i < end; i++) {
        cf_status st = buf ? cf_dataset_get(j->ds, i, 0, buf) : CF_ERR_NOMEM;
        if (st) j->why[i] = cf_strdup(buf ? cf_last_error() : "out of memory");
    }
    cf_free(buf);
}

static cf_status drop_bad_images(cf_dataset **ds, const char *what, bool quiet) {
    const cf_dataset *d = *ds;
    if (!cf_dataset_is_streamed(d) || d->n == 0) return CF_OK;
    verify_job j = {.ds = d,
                    .why = cf_calloc((size_t)d->n, sizeof(char *)),
                    .per = cf_shape_numel(&d->sample_shape)};
    int64_t *keep = cf_malloc((size_t)d->n * sizeof *keep);
    if (!j.why || !keep) {
        cf_free(j.why);
        cf_free(keep);
        return CF_ERR_NOMEM;
    }
    cf_parallel_for(d->n, verify_range, &j);
    int64_t kept = 0, bad = 0;
    for (int64_t i = 0; i < d->n; i++) {
        if (!j.why[i]) {
            keep[kept++] = i;
            continue;
        }
        if (bad++ < 5 && !quiet) fprintf(stderr, "skip-bad: %s\n", j.why[i]);
        cf_free(j.why[i]);
    }
    cf_free(j.why);
    cf_status st = CF_OK;
    if (bad > 0) {
        if (!quiet)
            fprintf(stderr, "skip-bad: left out %lld of %lld %s images that cannot be read%s\n",
                    (long long)bad, (long long)d->n, what, bad > 5 ? " (the first 5 above)" : "");
        cf_dataset *sub = NULL;
        if (kept == 0)
            st = cf_fail(CF_ERR_FORMAT, "%s: none of the %s images can be read",
                         d->source ? d->source : "images", what);
        else if ((st = cf_dataset_subset(d, keep, kept, &sub)) == CF_OK) {
            cf_dataset_free(*ds);
            *ds = sub;
        }
    }
    cf_free(keep);
    return st;
}

static bool looks_like_fmnist(const char *dir) {
    for (const char *p = dir; *p; p++)
        if (strncasecmp(p, "fashion", 7) == 0) return true;
    return false;
}

static int cmp_int64(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

/* --limit N of a CSV table: as pandas' read_csv(nrows=...), only the first N + N/5 rows are read
 * (a file of millions of rows is not parsed past them), split at random from --seed into N
 * training and N/5 validation rows; the procs (categories, statistics, classes) are fitted on
 * those N training rows alone. A shorter file is split in the same proportion. */
static cf_status tabular_first_rows(const cli_data *d, cf_tabular_options *o, cf_dataset **train,
                                    cf_dataset **valid) {
    int64_t want_valid = d->limit / 5 > 0 ? d->limit / 5 : 1, want = d->limit + want_valid;
    cf_csv_table *t = NULL;
    cf_status st = cf_csv_read_first(d->csv, ',', want, &t, NULL);
    if (st) return st;
    int64_t n = t->n_rows, n_valid = n == want ? want_valid : n * want_valid / want;
    if (n_valid < 1 && n > 1) n_valid = 1;
    int64_t *perm = cf_malloc((size_t)(n > 0 ? n : 1) * sizeof *perm);
    if (!perm) {
        cf_csv_table_free(t);
        return cf_fail(CF_ERR_NOMEM, "%s: out of memory", d->csv);
    }
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    cf_rng rng;
    cf_rng_seed(&rng, d->seed);
    cf_rng_shuffle(&rng, perm, n);
    qsort(perm, (size_t)n_valid, sizeof *perm, cmp_int64); /* validation rows in file order */
    o->valid_idx = perm;
    o->n_valid_idx = n_valid;
    st = cf_tabular_from_table(t, o, train, valid);
    o->valid_idx = NULL;
    o->n_valid_idx = 0;
    cf_free(perm);
    cf_csv_table_free(t);
    return st;
}

cf_status cli_load_data(const cli_data *d, const char **input, cf_dataset **train,
                        cf_dataset **valid) {
    *train = *valid = NULL;
    if (cli_task_data_set(d))
        return cli_task_load(d, input, train, valid);              /* label sets, points, values */
    if (d->seg.masks) return cli_seg_load(d, input, train, valid); /* masks (seg.c) */
    cf_status st = CF_OK;
    if (d->csv) {
        *input = "csv";
        strlist cat = {0}, cont = {0};
        if (strlist_split(d->cat, &cat) || strlist_split(d->cont, &cont)) {
            strlist_free(&cat);
            strlist_free(&cont);
            return CF_ERR_NOMEM;
        }
        cf_tabular_options o = {.cat_names = (const char *const *)cat.v,
                                .n_cat = cat.n,
                                .cont_names = (const char *const *)cont.v,
                                .n_cont = cont.n,
                                .y_name = d->target,
                                .y_regression = d->regression,
                                .valid_pct = d->valid_pct,
                                .seed = d->seed};
        if (d->limit > 0) {
            st = tabular_first_rows(d, &o, train, valid);
        } else {
            st = cf_tabular_from_csv(d->csv, &o, train, valid);
        }
        strlist_free(&cat);
        strlist_free(&cont);
    } else if (d->images || d->images_csv) {
        *input = "images";
        char tdir[4096];
        snprintf(tdir, sizeof tdir, "%s/train", d->images ? d->images : "");
        cf_image_folder_options o = {.size = d->size,
                                     .channels = d->channels,
                                     .valid_pct = cli_exists(tdir) ? 0 : d->valid_pct,
                                     .seed = d->seed,
                                     .skip_bad = d->skip_bad};
        /* --load auto (the default) streams: measured faster than decoding up front, even for
         * a set that fits in memory (the loaders decode on their own threads while the model
         * computes; docs/cli.md has the numbers), and it takes a fraction of the memory */
        o.load = CF_IMAGE_LOAD_STREAM;
        if (d->load && strcmp(d->load, "memory") == 0) o.load = CF_IMAGE_LOAD_MEMORY;
        /* an up-front set fails on its first bad file: --skip-bad streams (and checks each file
         * first, below) */
        if (d->skip_bad) o.load = CF_IMAGE_LOAD_STREAM;
        cf_item_tfm tfm; /* --resize, --random-resized-crop (photo.c) */
        if (cli_photo_item_tfm(d, d->size, &tfm)) o.item_tfm = &tfm;
        if (d->eval && !cli_exists(tdir)) {
            /* eval: a folder with only valid/, or class folders directly, is read whole (the
             * name below is one no folder has, so nothing is taken twice) */
            char vdir[4096];
            snprintf(vdir, sizeof vdir, "%s/valid", d->images);
            o.train = cli_exists(vdir) ? "valid" : ".";
            o.valid = ".corefit-no-validation-folder";
            o.valid_pct = 0;
        }
        if (d->images_csv || d->label_re) {
            o.valid_pct = d->valid_pct;
            st = cli_load_photos(d, &o, train, valid);
        } else {
            st = cf_datasets_from_image_folder(d->images, &o, train, valid);
        }
        if (st == CF_OK && d->skip_bad &&
            ((st = drop_bad_images(train, "training", d->quiet)) ||
             (st = drop_bad_images(valid, "validation", d->quiet))))
            goto fail;
        if (st == CF_OK && (*valid)->n == 0 && !d->eval)
            st = cf_fail(CF_ERR_FORMAT, "%s: no validation images (%s)",
                         d->images ? d->images : d->images_csv,
                         d->images_csv ? "mark some with --valid-col, or give --valid-pct"
                                       : "add a valid/ folder beside train/");
    } else {
        *input = "idx";
        const char *dir = d->idx ? d->idx : CF_FASHION_MNIST_DEFAULT_DIR;
        char ti[4096], tl[4096], vi[4096], vl[4096];
        if ((st = idx_file(dir, "train", "images", 3, ti, sizeof ti)) ||
            (st = idx_file(dir, "train", "labels", 1, tl, sizeof tl)) ||
            (st = idx_file(dir, "t10k", "images", 3, vi, sizeof vi)) ||
            (st = idx_file(dir, "t10k", "labels", 1, vl, sizeof vl)))
            return st;
        /* --limit reads only the samples it keeps */
        int64_t keep = d->limit > 0 ? d->limit : 0,
                keep_valid = keep ? (keep / 5 ? keep / 5 : 1) : 0;
        if ((st = cf_dataset_from_idx_first(ti, tl, keep, train)) ||
            (st = cf_dataset_from_idx_first(vi, vl, keep_valid, valid)))
            goto fail;
        int nc =
            (*train)->n_classes > (*valid)->n_classes ? (*train)->n_classes : (*valid)->n_classes;
        const char *const *names = NULL;
        char **digits = NULL;
        if (nc == 10 && looks_like_fmnist(dir)) {
            names = cf_fashion_mnist_classes;
        } else {
            digits = cf_calloc((size_t)nc, sizeof(char *));
            for (int i = 0; digits && i < nc; i++) {
                char b[16];
                snprintf(b, sizeof b, "%d", i);
                digits[i] = cf_strdup(b);
            }
            names = (const char *const *)digits;
        }
        for (int k = 0; k < 2 && st == CF_OK; k++) {
            cf_dataset *ds = k ? *valid : *train;
            /* both sets get the same class count and names */
            if (ds->vocab)
                for (int i = 0; i < ds->n_classes; i++) cf_free(ds->vocab[i]);
            cf_free(ds->vocab);
            ds->vocab = NULL;
            ds->n_classes = nc;
            st = names ? cf_dataset_set_vocab(ds, names, nc) : CF_ERR_NOMEM;
        }
        if (digits)
            for (int i = 0; i < nc; i++) cf_free(digits[i]);
        cf_free(digits);
    }
    if (st) goto fail;
    if (d->limit > 0 && !d->csv) { /* a CSV table: only the rows kept were read */
        int64_t nv = d->limit / 5 > 0 ? d->limit / 5 : 1;
        /* an IDX file: only the first N were read */
        if (d->idx || (!d->images && !d->csv && !d->images_csv)) {
            if ((st = cf_dataset_keep_first(train, d->limit)) ||
                (st = cf_dataset_keep_first(valid, nv)))
                goto fail;
        } else if ((st = take_sample(train, d->limit, d->seed)) ||
                   (st = take_sample(valid, nv, d->seed + 1))) {
            goto fail;
        }
    }
    return CF_OK;
fail:
    cf_dataset_free(*train);
    cf_dataset_free(*valid);
    *train = *valid = NULL;
    return st;
}

int cli_check_data_args(const char *cmd, const cli_data *d, const char *metrics) {
    int sources = (d->idx != NULL) + (d->images != NULL) + (d->csv != NULL);
    if (sources > 1)
        return cli_error(CLI_USAGE, cmd, "give one data source: --idx, --images or --csv");
    int photo_rc = cli_check_photo_args(cmd, d);
    if (photo_rc) return photo_rc;
    if (d->csv && !d->target)
        return cli_error(CLI_USAGE, cmd, "--csv needs --target NAME (and --cat and/or --cont)");
    if (d->csv && !d->cat && !d->cont)
        return cli_error(CLI_USAGE, cmd, "--csv needs --cat and/or --cont column lists");
    int task_rc = cli_task_check(cmd, d, metrics);
    if (task_rc) return task_rc;
    if (!d->csv && (d->cat || d->cont || d->target || (d->regression && !d->images_csv)))
        return cli_error(CLI_USAGE, cmd, "--cat, --cont, --target and --regression need --csv");
    if (d->load && strcmp(d->load, "auto") != 0 && strcmp(d->load, "memory") != 0 &&
        strcmp(d->load, "stream") != 0)
        return cli_error(CLI_USAGE, cmd, "--load must be auto, memory or stream, got '%s'",
                         d->load);
    if ((d->load || d->skip_bad) && !d->images && !d->images_csv)
        return cli_error(CLI_USAGE, cmd, "--load and --skip-bad are for --images or --images-csv");
    if (d->skip_bad && d->load && strcmp(d->load, "memory") == 0)
        return cli_error(CLI_USAGE, cmd,
                         "--skip-bad streams the images (a set decoded up front stops at its first "
                         "bad file): give --load stream or auto with it");
    if (d->aug && d->csv) return cli_error(CLI_USAGE, cmd, "--aug is for images, not --csv");
    if (d->channels != 0 && d->channels != 1 && d->channels != 3)
        return cli_error(CLI_USAGE, cmd, "--channels must be 1 or 3, got %d", d->channels);
    return CLI_OK;
}
