/* corefit train and corefit lr-find: data, learner, the fit (in-process or on every core),
 * the model file, the CSV log and the figures. */
#include "corefit.h"
#include "photo.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef CF_FASHION_MNIST_DEFAULT_DIR
#define CF_FASHION_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#endif

/* ---- data ---------------------------------------------------------------------------------- */

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static cf_status idx_file(const char *dir, const char *prefix, const char *kind, int d, char *path,
                          size_t size) {
    snprintf(path, size, "%s/%s-%s-idx%d-ubyte.gz", dir, prefix, kind, d);
    if (exists(path)) return CF_OK;
    snprintf(path, size, "%s/%s-%s-idx%d-ubyte", dir, prefix, kind, d);
    if (exists(path)) return CF_OK;
    return cf_fail(CF_ERR_IO, "no %s-%s-idx%d-ubyte(.gz) in %s", prefix, kind, d, dir);
}

/* The first n samples of *ds (n < ds->n), replacing it. */
static cf_status take_first(cf_dataset **ds, int64_t n) {
    if (n <= 0 || n >= (*ds)->n) return CF_OK;
    int64_t *idx = cf_malloc((size_t)n * sizeof *idx);
    if (!idx) return CF_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    cf_dataset *sub = NULL;
    cf_status st = cf_dataset_subset(*ds, idx, n, &sub);
    cf_free(idx);
    if (st) return st;
    cf_dataset_free(*ds);
    *ds = sub;
    return CF_OK;
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
    if (d->images_csv && (d->task.multi_label || d->task.points || d->regression))
        return cli_task_load(d, input, train, valid); /* label sets, points, values */
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
                                     .valid_pct = exists(tdir) ? 0 : d->valid_pct,
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
        if (d->eval && !exists(tdir)) {
            /* eval: a folder with only valid/, or class folders directly, is read whole (the
             * name below is one no folder has, so nothing is taken twice) */
            char vdir[4096];
            snprintf(vdir, sizeof vdir, "%s/valid", d->images);
            o.train = exists(vdir) ? "valid" : ".";
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
            if ((st = take_first(train, d->limit)) || (st = take_first(valid, nv))) goto fail;
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

/* ---- shared options of train and lr-find ---------------------------------------------------- */

typedef struct train_args {
    cli_data data;
    const char *arch, *pretrained, *lr, *schedule, *start, *out, *plots, *csv_log, *metrics,
        *layers, *plot;
    int epochs, freeze_epochs, cores, threads, cycle_len, num_it;
    double wd, start_lr, end_lr, deadline;
    double label_smoothing, mixup, cutmix; /* --label-smoothing EPS, --mixup/--cutmix ALPHA */
    bool show, quiet, split_batch, save_every_epoch;
    bool bf16; /* --bf16: cf_learner_to_bf16 */
    const char *y_range;
    const char *resume, *checkpoint; /* --resume FILE, --checkpoint FILE */
    int checkpoint_every;            /* --checkpoint-every N (batches) */
    int max_restarts, commit_every;  /* --max-restarts N, --commit-every K (fork workers) */
} train_args;

#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)

/* The fork launcher's limit on worker processes (src/par/launch.c). */
#define CLI_MAX_CORES 256

static const char *const schedules[] = {"one-cycle", "flat-cos", "sgdr", "fine-tune"};

static int check_metric_names(const char *cmd, const char *list, bool regression);

static int check_args(const char *cmd, train_args *a, bool train) {
    cli_data *d = &a->data;
    int sources = (d->idx != NULL) + (d->images != NULL) + (d->csv != NULL);
    if (sources > 1)
        return cli_error(CLI_USAGE, cmd, "give one data source: --idx, --images or --csv");
    int photo_rc = cli_check_photo_args(cmd, d);
    if (photo_rc) return photo_rc;
    if (d->csv && !d->target)
        return cli_error(CLI_USAGE, cmd, "--csv needs --target NAME (and --cat and/or --cont)");
    if (d->csv && !d->cat && !d->cont)
        return cli_error(CLI_USAGE, cmd, "--csv needs --cat and/or --cont column lists");
    int task_rc = cli_task_check(cmd, d, a->metrics);
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
    if (a->arch) {
        bool tab = strcmp(a->arch, "tabular") == 0;
        if (!tab && cf_arch_from_name(a->arch) < 0)
            return cli_error(CLI_USAGE, cmd,
                             "unknown --arch '%s' (choose mini-resnet, simple-cnn, xresnet18, "
                             "xresnet34, xresnet50, resnet18, resnet34, resnet50 or tabular)",
                             a->arch);
        if (tab != (d->csv != NULL))
            return cli_error(CLI_USAGE, cmd,
                             tab ? "--arch tabular needs --csv data"
                                 : "--csv data needs --arch tabular");
    }
    if (a->metrics) {
        int rc = d->task.multi_label
                     ? CLI_OK
                     : check_metric_names(cmd, a->metrics, d->regression || d->task.points);
        if (rc) return rc;
    }
    if (a->y_range && !d->regression && !d->task.points)
        return cli_error(CLI_USAGE, cmd, "--y-range is for --regression");
    if (a->y_range && strcmp(a->y_range, "auto") != 0 && strcmp(a->y_range, "none") != 0) {
        double lo, hi;
        char tail;
        if (sscanf(a->y_range, "%lf,%lf%c", &lo, &hi, &tail) != 2 || !isfinite(lo) ||
            !isfinite(hi) || !(lo < hi))
            return cli_error(CLI_USAGE, cmd,
                             "--y-range expects LOW,HIGH with LOW < HIGH, auto or none, got '%s'",
                             a->y_range);
    }
    if (a->cores > 1 && (!a->start || strcmp(a->start, "mpi") != 0) &&
        a->cores > cf_available_cores())
        fprintf(stderr,
                "corefit %s: warning: --cores %d runs more worker processes than the %d core%s "
                "this process may use; they will share them and each step will wait for the "
                "slowest\n",
                cmd, a->cores, cf_available_cores(), cf_available_cores() == 1 ? "" : "s");
    if (a->start && strcmp(a->start, "fork") != 0 && strcmp(a->start, "mpi") != 0)
        return cli_error(CLI_USAGE, cmd, "--start must be fork or mpi, got '%s'", a->start);
    if (train) {
        bool ok = false;
        for (size_t i = 0; i < sizeof schedules / sizeof *schedules; i++)
            ok |= strcmp(a->schedule, schedules[i]) == 0;
        if (!ok)
            return cli_error(CLI_USAGE, cmd,
                             "unknown --schedule '%s' (choose one-cycle, flat-cos, sgdr or "
                             "fine-tune)",
                             a->schedule);
        if (a->lr && strcmp(a->lr, "auto") != 0) {
            char *end;
            double v = strtod(a->lr, &end);
            if (end == a->lr || *end || !(v > 0) || !isfinite(v))
                return cli_error(CLI_USAGE, cmd,
                                 "--lr expects a positive number or 'auto', got '%s'", a->lr);
        }
        if (a->pretrained && d->csv)
            return cli_error(CLI_USAGE, cmd, "--pretrained is for image models");
    }
    if (a->pretrained && !exists(a->pretrained))
        return cli_error(CLI_FAIL, cmd, "--pretrained %s: %s", a->pretrained, strerror(ENOENT));
    if (d->csv && !exists(d->csv))
        return cli_error(CLI_FAIL, cmd, "--csv %s: %s", d->csv, strerror(ENOENT));
    if (d->images && !exists(d->images))
        return cli_error(CLI_FAIL, cmd, "--images %s: %s", d->images, strerror(ENOENT));
    if (d->images_csv && !exists(d->images_csv))
        return cli_error(CLI_FAIL, cmd, "--images-csv %s: %s", d->images_csv, strerror(ENOENT));
    if (d->idx && !exists(d->idx))
        return cli_error(CLI_FAIL, cmd, "--idx %s: %s", d->idx, strerror(ENOENT));
    return CLI_OK;
}

static const char *const class_metrics[] = {"accuracy",  "error_rate", "top_5_accuracy",
                                            "precision", "recall",     "f1_score"};
static const char *const regression_metrics[] = {"mse", "mae", "rmse"};

/* Checks --metrics names before any data is read (a regression is known from --regression). */
static int check_metric_names(const char *cmd, const char *list, bool regression) {
    strlist names = {0};
    if (strlist_split(list, &names)) return cli_error(CLI_FAIL, cmd, "out of memory");
    int rc = CLI_OK;
    for (int i = 0; i < names.n && rc == CLI_OK; i++) {
        bool ok = false;
        const char *const *known = regression ? regression_metrics : class_metrics;
        size_t n = regression ? 3 : 6;
        for (size_t k = 0; k < n; k++) ok |= strcmp(names.v[i], known[k]) == 0;
        if (!ok)
            rc = cli_error(CLI_USAGE, cmd,
                           "unknown --metrics name '%s' for a %s (classifiers: accuracy, "
                           "error_rate, top_5_accuracy, precision, recall, f1_score; regression: "
                           "mse, mae, rmse)",
                           names.v[i], regression ? "regression" : "classifier");
    }
    strlist_free(&names);
    return rc;
}

/* Metrics by name for a classifier or a regression. */
static int make_metrics(const char *cmd, const char *list, int n_classes, cf_metric ***out,
                        int *n) {
    *out = NULL;
    *n = 0;
    strlist names = {0};
    const char *def = n_classes > 0 ? "accuracy" : "mae";
    if (strlist_split(list ? list : def, &names)) return cli_error(CLI_FAIL, cmd, "out of memory");
    cf_metric **m = cf_calloc((size_t)names.n + 1, sizeof *m);
    int k = 0, rc = CLI_OK;
    for (int i = 0; i < names.n && rc == CLI_OK; i++) {
        const char *s = names.v[i];
        bool cls = n_classes > 0;
        cf_metric *x = NULL;
        if (!strcmp(s, "accuracy") && cls)
            x = cf_accuracy();
        else if (!strcmp(s, "error_rate") && cls)
            x = cf_error_rate();
        else if (!strcmp(s, "top_5_accuracy") && cls)
            x = cf_top_k_accuracy(5);
        else if (!strcmp(s, "precision") && cls)
            x = cf_precision(n_classes, n_classes != 2);
        else if (!strcmp(s, "recall") && cls)
            x = cf_recall(n_classes, n_classes != 2);
        else if (!strcmp(s, "f1_score") && cls)
            x = cf_f1_score(n_classes, n_classes != 2);
        else if (!strcmp(s, "mse") && !cls)
            x = cf_mse_metric();
        else if (!strcmp(s, "mae") && !cls)
            x = cf_mae();
        else if (!strcmp(s, "rmse") && !cls)
            x = cf_rmse();
        else
            rc = cli_error(CLI_USAGE, cmd,
                           "unknown --metrics name '%s' for a %s (classifiers: accuracy, "
                           "error_rate, top_5_accuracy, precision, recall, f1_score; regression: "
                           "mse, mae, rmse)",
                           s, cls ? "classifier" : "regression");
        if (x) m[k++] = x;
    }
    strlist_free(&names);
    if (rc != CLI_OK) {
        for (int i = 0; i < k; i++) cf_metric_free(m[i]);
        cf_free(m);
        return rc;
    }
    *out = m;
    *n = k;
    return CLI_OK;
}

typedef struct session {
    cf_dls *dls;
    cf_learner *learn;
    const char *input;
    cf_comm *mpi;
    bool master;
    cf_par_opts par;
    bool parallel;
} session;

static void session_free(session *s) {
    cf_learner_free(s->learn);
    cf_dls_free(s->dls);
    /* s->mpi belongs to the par layer (kept for the process) */
}

/* Data, model and learner for train and lr-find. */
static int setup(const char *cmd, train_args *a, session *s) {
    memset(s, 0, sizeof *s);
    s->master = true;
    cli_data *d = &a->data;
    if (a->start && strcmp(a->start, "mpi") == 0) {
        if (cf_par_mpi_comm(&s->mpi)) return cli_lib_error(cmd, "--start mpi");
        s->master = cf_comm_rank(s->mpi) == 0;
        s->parallel = true;
        s->par.start_method = CF_START_MPI;
    } else {
        s->par.num_cores = a->cores > 0 ? a->cores : cf_available_cores();
        s->parallel = s->par.num_cores > 1;
    }
    /* before the data is read; under MPI only rank 0 reads the checkpoint (and sends it on),
     * so only its machine needs the file, and every rank stops alike when it is missing (a
     * rank that left alone would leave the others waiting for it until the deadline) */
    if (a->resume) {
        int missing = s->master && access(a->resume, R_OK) != 0 ? errno : 0;
        if (s->mpi && cf_comm_broadcast(s->mpi, &missing, sizeof missing, 0))
            return cli_lib_error(cmd, "--start mpi");
        if (missing)
            return s->master
                       ? cli_error(CLI_FAIL, cmd, "--resume %s: %s", a->resume, strerror(missing))
                       : CLI_FAIL;
    }
    s->par.split_batch = a->split_batch;
    s->par.deadline_s = a->deadline;
    s->par.max_restarts = a->max_restarts;
    s->par.commit_every = a->commit_every;
    if (a->threads > 0) cf_set_num_threads(a->threads);
    /* An in-process fit (and each MPI rank) runs BLAS on this process's threads: room for
     * OpenBLAS's work buffers first, or a clear error (fork workers see to their own). */
    if ((!s->parallel || s->par.start_method == CF_START_MPI) &&
        cf_blas_reserve(cf_get_num_threads()))
        return cli_lib_error(cmd, "BLAS");
    /* a pretrained model says which arch, channels and size the body expects */
    cf_model_info pre = {0};
    int tv_depth = 0; /* torchvision's or timm's ResNet weights (photo.c) */
    if (a->pretrained) {
        int rc = cli_pretrained_kind(cmd, a->pretrained, a->arch, &tv_depth);
        if (rc) return rc;
    }
    if (tv_depth > 0) {
        /* fastai's vision_learner(resnetN, pretrained=True): RGB, ImageNet's statistics */
        static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f},
                           imagenet_std[3] = {0.229f, 0.224f, 0.225f};
        if (d->channels && d->channels != 3)
            return cli_error(CLI_USAGE, cmd, "--pretrained %s holds RGB weights: --channels 3",
                             a->pretrained);
        snprintf(pre.recipe.arch, sizeof pre.recipe.arch, "resnet%d", tv_depth);
        pre.n_norm = 3;
        memcpy(pre.mean, imagenet_mean, sizeof imagenet_mean);
        memcpy(pre.std, imagenet_std, sizeof imagenet_std);
        d->channels = 3;
    } else if (a->pretrained) {
        if (cf_model_info_read(a->pretrained, &pre)) return cli_lib_error(cmd, "--pretrained");
        if (strcmp(pre.recipe.arch, "tabular") == 0) {
            cf_model_info_free(&pre);
            return cli_error(CLI_USAGE, cmd, "--pretrained %s is a tabular model", a->pretrained);
        }
        if (a->arch && strcmp(a->arch, pre.recipe.arch) != 0) {
            int rc = cli_error(CLI_USAGE, cmd, "--arch %s differs from the pretrained model's %s",
                               a->arch, pre.recipe.arch);
            cf_model_info_free(&pre);
            return rc;
        }
        if (!d->channels) d->channels = pre.n_in;
        if (!d->size) d->size = pre.height;
    }
    if ((d->images || d->images_csv) && !d->size) d->size = 64;
    if (tv_depth > 0 && !d->quiet) cli_photo_imagenet_size_note(cmd, d->size);
    cf_dataset *train = NULL, *valid = NULL;
    double t0 = cf_now();
    d->quiet = !s->master; /* every MPI rank reads the data; rank 0 tells what it found */
    if (cli_load_data(d, &s->input, &train, &valid)) {
        cf_model_info_free(&pre);
        return cli_lib_error(cmd, "loading the data");
    }
    if (!a->quiet && s->master) {
        char resize[128] = ""; /* how the images are sized (photo.c) */
        if (d->images || d->images_csv) cli_photo_describe(d, d->size, resize, sizeof resize);
        fprintf(stderr, "data: %lld training and %lld validation samples%s%s (%.1f s)\n",
                (long long)train->n, (long long)valid->n,
                !d->images && !d->images_csv    ? ""
                : cf_dataset_is_streamed(train) ? ", streamed from their files"
                                                : ", decoded into memory",
                resize, cf_now() - t0);
    }
    if (!a->quiet && s->master && d->limit > 0 && d->csv)
        fprintf(stderr,
                "limit: the first %lld rows of %s (the file is read no further), split at random "
                "(--seed %llu) into %lld training and %lld validation rows; categories, "
                "statistics and classes are fitted on those training rows\n",
                (long long)(train->n + valid->n), d->csv, (unsigned long long)d->seed,
                (long long)train->n, (long long)valid->n);
    if (!a->quiet && s->master && d->limit > 0 && (d->images || d->images_csv)) {
        fprintf(stderr,
                "limit: a random sample of %lld training and %lld validation samples%s "
                "(--seed %llu)",
                (long long)train->n, (long long)valid->n,
                train->n_classes > 0 ? ", stratified by class" : "", (unsigned long long)d->seed);
        /* the training samples of each class (up to 20 classes) */
        for (int c = 0; train->vocab && c < train->n_classes && c < 20; c++) {
            int64_t k = 0;
            for (int64_t i = 0; i < train->n; i++) k += (int)train->y[i] == c;
            fprintf(stderr, "%s%s %lld", c ? ", " : ": ", train->vocab[c], (long long)k);
        }
        fprintf(stderr, "\n");
    }
    if (valid->n_unseen > 0 && s->master) /* Categorify's #na#, as fastai, but said */
        fprintf(stderr,
                "corefit %s: warning: %lld categorical value%s of the validation set %s not seen "
                "in training (encoded as #na#)\n",
                cmd, (long long)valid->n_unseen, valid->n_unseen == 1 ? "" : "s",
                valid->n_unseen == 1 ? "was" : "were");
    int world = s->par.start_method == CF_START_MPI ? cf_comm_size(s->mpi)
                : s->parallel                       ? s->par.num_cores
                                                    : 1;
    int bs = d->bs ? d->bs : 64;
    int64_t per_rank = a->split_batch ? train->n : train->n / world;
    if (per_rank < bs) {
        int rc = cli_error(CLI_FAIL, cmd,
                           "the training set has %lld samples: no full batch of %d%s for %d "
                           "process%s (drop_last); lower --bs%s",
                           (long long)train->n, bs, a->split_batch ? "" : " per process", world,
                           world == 1 ? "" : "es", world > 1 ? " or --cores" : "");
        cf_dataset_free(train);
        cf_dataset_free(valid);
        return rc;
    }
    bool tabular = d->csv != NULL;
    char arch[32];
    if (pre.recipe.arch[0])
        snprintf(arch, sizeof arch, "%s", pre.recipe.arch);
    else if (a->arch)
        snprintf(arch, sizeof arch, "%s", a->arch);
    else
        snprintf(arch, sizeof arch, "%s",
                 tabular                            ? "tabular"
                 : train->sample_shape.dim[1] <= 64 ? "mini-resnet"
                                                    : "xresnet18");
    int n_norm = 0;
    float mean[4] = {0}, std[4] = {0};
    if (!tabular && pre.n_norm > 0 && pre.n_norm == train->sample_shape.dim[0]) {
        /* fastai's vision_learner keeps the pretrained model's statistics (ImageNet's for
         * torchvision weights): the body was trained on inputs normalised that way */
        n_norm = pre.n_norm;
        memcpy(mean, pre.mean, (size_t)n_norm * sizeof *mean);
        memcpy(std, pre.std, (size_t)n_norm * sizeof *std);
        if (!a->quiet && s->master) {
            fprintf(stderr, "normalize: the pretrained %s statistics, mean",
                    tv_depth > 0 ? "weights' (ImageNet's)" : "model's");
            for (int i = 0; i < n_norm; i++) fprintf(stderr, " %.4g", mean[i]);
            fprintf(stderr, ", std");
            for (int i = 0; i < n_norm; i++) fprintf(stderr, " %.4g", std[i]);
            fprintf(stderr, "\n");
        }
    }
    cf_model_info_free(&pre);
    if (!tabular && n_norm == 0) {
        n_norm = train->sample_shape.dim[0];
        if (n_norm > 4 || cf_dataset_channel_stats(train, mean, std)) {
            cf_dataset_free(train);
            cf_dataset_free(valid);
            return cli_lib_error(cmd, "normalisation statistics");
        }
    }
    cf_metric **metrics = NULL;
    int n_metrics = 0;
    int rc = CLI_OK;
    if (!cli_task_metrics(cmd, d, a->metrics, train->n_classes, &metrics, &n_metrics, &rc))
        rc = make_metrics(cmd, a->metrics, train->n_classes, &metrics, &n_metrics);
    if (rc != CLI_OK) {
        cf_dataset_free(train);
        cf_dataset_free(valid);
        return rc;
    }
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_dls_options o = {
        .bs = d->bs, .seed = d->seed, .n_norm = n_norm, .aug = d->aug && !tabular ? &aug : NULL};
    memcpy(o.mean, mean, sizeof o.mean);
    memcpy(o.std, std, sizeof o.std);
    if (cf_dls_new(train, valid, &o, &s->dls)) {
        for (int i = 0; i < n_metrics; i++) cf_metric_free(metrics[i]);
        cf_free(metrics);
        return cli_lib_error(cmd, "DataLoaders");
    }
    cf_status st;
    bool quiet = a->quiet || !s->master;
    if (tabular) {
        strlist layers = {0};
        cf_tabular_learner_opts to = {
            .metrics = metrics, .n_metrics = n_metrics, .seed = d->seed, .quiet = quiet};
        if (d->regression && (!a->y_range || strcmp(a->y_range, "none") != 0)) {
            /* fastai's y_range: a sigmoid squashes the output into [low, high], so the model
             * starts near the targets' scale instead of near 0 */
            double lo, hi;
            if (a->y_range && strcmp(a->y_range, "auto") != 0) {
                sscanf(a->y_range, "%lf,%lf", &lo, &hi);
            } else { /* auto: the training targets' range, widened by 5% of it each side */
                lo = INFINITY, hi = -INFINITY;
                for (int64_t i = 0; i < train->n; i++) {
                    lo = fmin(lo, train->y[i * train->target_dim]);
                    hi = fmax(hi, train->y[i * train->target_dim]);
                }
                double pad = hi > lo ? 0.05 * (hi - lo) : fabs(hi) * 0.05 + 1;
                lo -= pad;
                hi += pad;
            }
            to.y_range = true;
            to.y_lo = (float)lo;
            to.y_hi = (float)hi;
            if (!a->quiet && s->master)
                fprintf(stderr, "y_range: [%g, %g]%s\n", lo, hi,
                        a->y_range && strcmp(a->y_range, "auto") != 0
                            ? ""
                            : " (the training targets' range + 5%; --y-range to change)");
        }
        if (a->layers) {
            if (strlist_split(a->layers, &layers)) return cli_error(CLI_FAIL, cmd, "out of memory");
            for (int i = 0; i < layers.n; i++) {
                char *end;
                long v = strtol(layers.v[i], &end, 10);
                if (i >= CF_TABULAR_MAX_LAYERS || end == layers.v[i] || *end || v < 1 ||
                    v > 1 << 20) {
                    strlist_free(&layers);
                    for (int k = 0; k < n_metrics; k++) cf_metric_free(metrics[k]);
                    cf_free(metrics);
                    return cli_error(CLI_USAGE, cmd,
                                     "--layers expects up to %d sizes like 200,100, got '%s'",
                                     CF_TABULAR_MAX_LAYERS, a->layers);
                }
                to.layers[to.n_layers++] = (int)v;
            }
            strlist_free(&layers);
        }
        st = cf_tabular_learner_(&s->learn, s->dls, &to);
    } else {
        float lo = 0, hi = 0;
        bool y_range = (!a->y_range || strcmp(a->y_range, "none") != 0) &&
                       cli_task_y_range(d, train, &lo, &hi);
        if (y_range && a->y_range && strcmp(a->y_range, "auto") != 0) {
            double l, h;
            sscanf(a->y_range, "%lf,%lf", &l, &h);
            lo = (float)l, hi = (float)h;
        }
        if (y_range && !a->quiet && s->master) fprintf(stderr, "y_range: [%g, %g]\n", lo, hi);
        st = cf_vision_learner(&s->learn, s->dls, (cf_arch)cf_arch_from_name(arch),
                               .metrics = metrics, .n_metrics = n_metrics, .seed = d->seed,
                               .quiet = quiet, .pretrained = a->pretrained, .y_range = y_range,
                               .y_lo = lo, .y_hi = hi);
    }
    cf_free(metrics);
    if (st) return cli_lib_error(cmd, "building the learner");
    if (a->wd > 0) s->learn->wd = a->wd;
    if (a->label_smoothing > 0) s->learn->loss.label_smoothing = (float)a->label_smoothing;
    if (a->bf16 && cf_learner_to_bf16(s->learn)) return cli_lib_error(cmd, "--bf16");
    if ((a->mixup > 0 || a->cutmix > 0) &&
        ((a->mixup > 0 && a->cutmix > 0) ||
         cf_learner_add_cb(s->learn,
                           a->mixup > 0 ? cf_mixup_cb(a->mixup) : cf_cutmix_cb(a->cutmix))))
        return cli_lib_error(cmd, a->mixup > 0 && a->cutmix > 0 ? "--mixup with --cutmix"
                                                                : "--mixup/--cutmix");
    if (!a->quiet && s->master)
        fprintf(stderr, "model: %s, %zu parameters; %s\n", arch,
                cf_model_num_weights(s->learn->model),
                s->par.start_method == CF_START_MPI
                    ? "MPI ranks (--start mpi)"
                    : (s->parallel ? "worker processes (fork)" : "in-process"));
    if (!a->quiet && s->master && s->par.start_method != CF_START_MPI && s->parallel) {
        int w = s->par.num_cores;
        if (a->split_batch) /* the loader gives worker r samples [r*bs/w, (r+1)*bs/w) */
            fprintf(stderr,
                    "cores: %d worker processes, each batch of %d split across them (%d%s each)\n",
                    w, bs, bs / w, bs % w ? " or 1 more" : "");
        else
            fprintf(stderr, "cores: %d worker processes, batch size %d each\n", w, bs);
    }
    int64_t steps = (a->split_batch ? train->n : train->n / world) / bs;
    int epochs = a->epochs + (strcmp(a->schedule, "fine-tune") == 0 ? a->freeze_epochs : 0);
    if (!a->quiet && s->master && strcmp(cmd, "train") == 0 && steps * epochs < 100)
        /* fit_one_cycle warms up over a quarter of the steps and anneals over the rest: a handful
         * of steps ends where it began */
        fprintf(stderr,
                "note: only %lld optimizer step%s (%lld samples, %d per step); that is too few to "
                "learn much: raise --epochs or --limit, or lower --bs\n",
                (long long)(steps * epochs), steps * epochs == 1 ? "" : "s", (long long)train->n,
                a->split_batch ? bs : bs * world);
    return CLI_OK;
}

/* DIR without trailing slashes ("out/" -> "out"), so that paths print as out/loss.png. */
static const char *folder_name(const char *dir, char *buf, size_t size) {
    snprintf(buf, size, "%s", dir);
    for (size_t n = strlen(buf); n > 1 && buf[n - 1] == '/'; n--) buf[n - 1] = '\0';
    return buf;
}

static int mkdirs(const char *dir);

/* The folder --out goes into, created before the data is read so that a fit never ends unable
 * to save (as --plots is). */
static int make_out_folder(const char *cmd, const char *out) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return CLI_OK;
    *slash = '\0';
    if (mkdirs(dir))
        return cli_error(CLI_FAIL, cmd, "cannot create the folder of --out %s: %s", out,
                         strerror(errno));
    return CLI_OK;
}

static int mkdirs(const char *dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) && errno != EEXIST) return -1;
    return 0;
}

typedef struct figures {
    char *paths[16];
    int n;
} figures;

static void figure_done(const char *cmd, figures *f, cf_status st, const char *path,
                        const char *what) {
    if (st == CF_OK) {
        printf("figure: %s\n", path);
        f->paths[f->n++] = cf_strdup(path);
    } else {
        fprintf(stderr, "corefit %s: %s figure not written: %s\n", cmd, what, cf_last_error());
    }
}

static void note_figure(void *ctx, cf_status st, const char *path, const char *what) {
    figure_done("train", ctx, st, path, what);
}

static int run_lr_find(const char *cmd, train_args *a, session *s, cf_lr_find_result *r) {
    memset(r, 0, sizeof *r);
    int all = CF_SUGGEST_VALLEY | CF_SUGGEST_SLIDE | CF_SUGGEST_MINIMUM | CF_SUGGEST_STEEP;
    cf_status st;
    if (s->parallel)
        st = cf_par_lr_find(s->learn, r, .start_lr = a->start_lr, .end_lr = a->end_lr,
                            .num_it = a->num_it, .suggest = all, .par = s->par);
    else
        st = cf_lr_find(s->learn, r, .start_lr = a->start_lr, .end_lr = a->end_lr,
                        .num_it = a->num_it, .suggest = all);
    if (st) return cli_lib_error(cmd, "lr_find");
    return CLI_OK;
}

static void print_suggestions(const cf_lr_find_result *r) {
    printf("lr_find: valley %.3e, slide %.3e, minimum %.3e, steep %.3e\n", r->valley, r->slide,
           r->minimum, r->steep);
}

/* ---- the command line ---------------------------------------------------------------------- */

#define DATA_OPTIONS(a)                                                                              \
    {"--idx",                                                                                        \
     OPT_STR,                                                                                        \
     &(a).data.idx,                                                                                  \
     "DIR",                                                                                          \
     "IDX folder (train-* and t10k-* files; t10k is validation) [" CF_FASHION_MNIST_DEFAULT_DIR      \
     "]",                                                                                            \
     0,                                                                                              \
     0,                                                                                              \
     0},                                                                                             \
        {"--images",                                                                                 \
         OPT_STR,                                                                                    \
         &(a).data.images,                                                                           \
         "DIR",                                                                                      \
         "class-per-folder images (train/ and valid/, or one folder split by --valid-pct)",          \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--size",                                                                                   \
         OPT_INT,                                                                                    \
         &(a).data.size,                                                                             \
         "N",                                                                                        \
         "resize images to N x N [64; a corefit --pretrained model: its size] (torchvision's "       \
         "ImageNet weights were trained at 224)",                                                    \
         1,                                                                                          \
         4096,                                                                                       \
         0},                                                                                         \
        {"--channels",                                                                               \
         OPT_INT,                                                                                    \
         &(a).data.channels,                                                                         \
         "N",                                                                                        \
         "image channels, 1 or 3 [3; pretrained: its]",                                              \
         1,                                                                                          \
         3,                                                                                          \
         0},                                                                                         \
        {"--csv", OPT_STR, &(a).data.csv, "FILE", "a table: one row per sample, a header row", 0,    \
         0,       0},                                                                                \
        {"--cat", OPT_STR, &(a).data.cat, "LIST", "categorical columns (comma-separated)", 0, 0, 0}, \
        {"--cont", OPT_STR, &(a).data.cont, "LIST", "continuous columns (comma-separated)", 0,       \
         0,        0},                                                                               \
        {"--target", OPT_STR, &(a).data.target, "NAME", "the column to predict", 0, 0, 0},           \
        {"--regression",                                                                             \
         OPT_FLAG,                                                                                   \
         &(a).data.regression,                                                                       \
         NULL,                                                                                       \
         "the target is a number (default: a class)",                                                \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--valid-pct",                                                                              \
         OPT_DOUBLE,                                                                                 \
         &(a).data.valid_pct,                                                                        \
         "F",                                                                                        \
         "validation share of a random split (CSV, flat image folder) [0.2]",                        \
         0.01,                                                                                       \
         0.99,                                                                                       \
         0},                                                                                         \
        {"--limit",                                                                                  \
         OPT_INT,                                                                                    \
         &(a).data.limit,                                                                            \
         "N",                                                                                        \
         "use N training and N/5 validation samples: the first ones of IDX files, a seeded "         \
         "random sample stratified by class of images, the first N + N/5 rows of a CSV table "       \
         "split at random",                                                                          \
         1,                                                                                          \
         1e9,                                                                                        \
         0},                                                                                         \
        {"--load",                                                                                   \
         OPT_STR,                                                                                    \
         &(a).data.load,                                                                             \
         "HOW",                                                                                      \
         "images: auto (stream: each batch decoded from the files, measured faster than memory), "   \
         "memory (decode every image up front) or stream [auto]",                                    \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--skip-bad",                                                                               \
         OPT_FLAG,                                                                                   \
         &(a).data.skip_bad,                                                                         \
         NULL,                                                                                       \
         "streamed images: leave out and count files that cannot be read (default: stop, naming "    \
         "the file)",                                                                                \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--aug",                                                                                    \
         OPT_FLAG,                                                                                   \
         &(a).data.aug,                                                                              \
         NULL,                                                                                       \
         "fastai's aug_transforms() on the training images (flip, rotate, zoom, warp, lighting)",    \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--bs", OPT_INT, &(a).data.bs, "N", "batch size (per core) [64]", 1, 1 << 20, 0}, {         \
        "--seed", OPT_U64, &(a).data.seed, "N", "random seed [42]", 0, 0, 0                          \
    }

#define MODEL_OPTIONS(a)                                                                             \
    {"--arch",                                                                                       \
     OPT_STR,                                                                                        \
     &(a).arch,                                                                                      \
     "NAME",                                                                                         \
     "mini-resnet, simple-cnn, xresnet18, xresnet34, xresnet50, resnet18, resnet34, resnet50 "       \
     "(torchvision's), tabular [mini-resnet for images up to 64 px, else xresnet18; tabular for "    \
     "--csv; --pretrained: its]",                                                                    \
     0,                                                                                              \
     0,                                                                                              \
     0},                                                                                             \
        {"--pretrained",                                                                             \
         OPT_STR,                                                                                    \
         &(a).pretrained,                                                                            \
         "FILE",                                                                                     \
         "start from the body of a corefit model or of torchvision's/timm's ResNet weights "         \
         "(safetensors; a .pth converted by corefit-convert-pth), frozen, as fastai's "              \
         "pretrained; the weights keep their normalisation (ImageNet's for torchvision/timm)",       \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--layers", OPT_STR, &(a).layers, "LIST", "tabular hidden layer sizes [200,100]", 0, 0, 0}, \
        {"--cores",                                                                                  \
         OPT_INT,                                                                                    \
         &(a).cores,                                                                                 \
         "N",                                                                                        \
         "worker processes, up to 256 (1: in-process) [all cores this process may use]",             \
         1,                                                                                          \
         CLI_MAX_CORES,                                                                              \
         0},                                                                                         \
        {"--start", OPT_STR, &(a).start, "METHOD", "fork (default) or mpi (under mpirun)", 0, 0, 0}, \
        {"--threads", OPT_INT, &(a).threads, "N", "threads of an in-process fit [all]", 1, 4096, 0}, \
        {"--deadline",                                                                               \
         OPT_DOUBLE,                                                                                 \
         &(a).deadline,                                                                              \
         "SECONDS",                                                                                  \
         "a worker silent this long is declared hung and the fit fails [120]",                       \
         0.1,                                                                                        \
         1e7,                                                                                        \
         0},                                                                                         \
        {"--split-batch",                                                                            \
         OPT_FLAG,                                                                                   \
         &(a).split_batch,                                                                           \
         NULL,                                                                                       \
         "cut each batch across the cores (default: --bs per core)",                                 \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--quiet",                                                                                  \
         OPT_FLAG,                                                                                   \
         &(a).quiet,                                                                                 \
         NULL,                                                                                       \
         "no progress bar or messages (the table and results stay)",                                 \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
    {                                                                                                \
        "--show", OPT_FLAG, &(a).show, NULL,                                                         \
            "draw the figures in the terminal (sixel, needs libsixel)", 0, 0, 0                      \
    }

/* ---- stopping early: NaN, Ctrl-C --------------------------------------------------------------
 */

/* Set by SIGINT during an in-process fit; the callback below turns it into fastai's
 * CancelFitException at the next batch, so both modes stop the same way. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static cf_status stop_on_interrupt(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (interrupted) cf_learner_cancel(learn, CF_CANCEL_FIT);
    return CF_OK;
}

static cf_callback interrupt_cb = {
    .name = "interrupt", .order = -20, .on = {[CF_EV_AFTER_BATCH] = stop_on_interrupt}};

/* SIGTERM (a pre-empted machine, a batch system's time limit): every fit writes its checkpoint
 * at the next batch boundary and stops (cf_checkpoint_request reaches fork workers too). */
static volatile sig_atomic_t terminated;

static void on_sigterm(int sig) {
    (void)sig;
    terminated = 1;
    cf_checkpoint_request();
}

/* The checkpoint file: --checkpoint, else --out with .ckpt for .safetensors. */
static const char *checkpoint_file(const train_args *a, char *buf, size_t n) {
    /* a name with a '/' is a path to the library (without one it goes under models/) */
    const char *dot = strchr(a->checkpoint ? a->checkpoint : a->out, '/') ? "" : "./";
    if (a->checkpoint) {
        snprintf(buf, n, "%s%s", dot, a->checkpoint);
        return buf;
    }
    size_t len = strlen(a->out);
    const char *ext = ".safetensors";
    size_t el = strlen(ext);
    if (len > el && strcmp(a->out + len - el, ext) == 0) len -= el;
    snprintf(buf, n, "%s%.*s.ckpt", dot, (int)len, a->out);
    return buf;
}

/* How to continue: this command line with --resume FILE (any earlier --resume dropped). */
static void print_resume_hint(int argc, char **argv, const char *ckpt) {
    fprintf(stderr, "corefit train: to continue, run:\n  corefit");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--resume") == 0) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--resume=", 9) == 0) continue;
        fprintf(stderr, " %s", argv[i]);
    }
    fprintf(stderr, " --resume %s\n", ckpt);
}

/* --save-every-epoch: the model file (with its metadata) after every completed epoch (a master
 * callback: rank 0 writes it). */
static const char *epoch_model_path;
static int epochs_saved;

static cf_status save_epoch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_status st = cf_learner_export(learn, epoch_model_path);
    if (st == CF_OK) epochs_saved++;
    return st;
}

static cf_callback save_epoch_cb = {.name = "save_every_epoch",
                                    .order = CF_ORDER_SAVE_MODEL,
                                    .on = {[CF_EV_AFTER_EPOCH] = save_epoch}};

/* Whether path exists and is not the file stat gave in *before (had: it existed then). */
static bool written_since(const char *path, bool had, const struct stat *before) {
    struct stat now;
    return stat(path, &now) == 0 &&
           (!had || now.st_mtim.tv_sec != before->st_mtim.tv_sec ||
            now.st_mtim.tv_nsec != before->st_mtim.tv_nsec || now.st_ino != before->st_ino);
}

/* After a fit that did not finish: no empty figures folder stays behind. (The CSV log is
 * written only from the first completed epoch on: a fit that failed before it left an existing
 * log as it was, and one with epochs in it keeps them.) */
static void clean_up_partial(const char *plots, bool made_plots) {
    if (plots && made_plots) rmdir(plots); /* only when empty */
}

/* --max-restarts and --commit-every: in-place recovery of fork workers (the library's
 * .par.max_restarts); an MPI job cannot lose a rank and go on, so there a wrapper reruns it. */
static int check_restarts(const char *cmd, const train_args *a) {
    bool mpi = a->start && strcmp(a->start, "mpi") == 0;
    if (a->commit_every > 0 && a->max_restarts == 0)
        return cli_error(CLI_USAGE, cmd,
                         "--commit-every is how often --max-restarts commits the fit; give "
                         "--max-restarts N too");
    if (a->max_restarts > 0 && mpi)
        return cli_error(CLI_USAGE, cmd,
                         "--max-restarts restarts fork workers; under mpirun run the job with "
                         "corefit-mpirun --max-restarts %d (docs/mpi.md)",
                         a->max_restarts);
    if (a->max_restarts > 0 && a->cores == 1)
        return cli_error(CLI_USAGE, cmd,
                         "--max-restarts restarts fork workers: give --cores 2 or more (--cores 1 "
                         "trains in this process)");
    return CLI_OK;
}

static void train_usage(FILE *f, const cli_opt *opts) {
    fprintf(f,
            "Usage: corefit train [options]\n\n"
            "Trains a model the fastai way (Adam, cross-entropy for classes, MSE for numbers) on\n"
            "every core, prints fastai's table, and writes the model, a CSV log and figures.\n"
            "Default: the mini-resnet on Fashion-MNIST with fit_one_cycle for 1 epoch.\n\n"
            "Options:\n");
    cli_print_options(f, opts);
}

static void defaults(train_args *a) {
    memset(a, 0, sizeof *a);
    a->data.seed = 42;
    a->data.valid_pct = 0.2;
    a->epochs = 1;
    a->freeze_epochs = 1;
    a->schedule = "one-cycle";
    a->out = "model.safetensors";
    a->cycle_len = 1;
    a->checkpoint_every = 100; /* about 0.5% of a W1 epoch's time (bench_w1 --checkpoint-every) */
}

int cmd_train(int argc, char **argv) {
    if (cli_argv_has(argc, argv, "--text")) return cmd_train_text(argc, argv);
    const char *cmd = "train";
    train_args a;
    defaults(&a);
    cli_opt opts[] = {
        DATA_OPTIONS(a),
        PHOTO_OPTIONS(a),
        CLI_TASK_OPTIONS(a.data),
        MODEL_OPTIONS(a),
        {"--epochs", OPT_INT, &a.epochs, "N", "epochs (sgdr: cycles) [1]", 1, 100000, 0},
        {"--lr", OPT_STR, &a.lr, "X|auto",
         "learning rate, or auto for lr_find's valley [3e-3; fine-tune 2e-3]", 0, 0, 0},
        {"--schedule", OPT_STR, &a.schedule, "NAME",
         "one-cycle, flat-cos, sgdr or fine-tune [one-cycle]", 0, 0, 0},
        {"--freeze-epochs", OPT_INT, &a.freeze_epochs, "N", "fine-tune: epochs frozen first [1]", 0,
         100000, 0},
        {"--cycle-len", OPT_INT, &a.cycle_len, "N", "sgdr: epochs of the first cycle [1]", 1,
         100000, 0},
        {"--wd", OPT_DOUBLE, &a.wd, "X", "weight decay [0.01]", 0, 10, 0},
        {"--label-smoothing", OPT_DOUBLE, &a.label_smoothing, "EPS",
         "classes: fastai's LabelSmoothingCrossEntropy(eps) (fastai's eps: 0.1)", 0, 1, 0},
        {"--mixup", OPT_DOUBLE, &a.mixup, "ALPHA", "fastai's MixUp(alpha) (fastai's alpha: 0.4)", 0,
         100, 0},
        {"--cutmix", OPT_DOUBLE, &a.cutmix, "ALPHA", "fastai's CutMix(alpha) (fastai's alpha: 1.0)",
         0, 100, 0},
        {"--bf16", OPT_FLAG, &a.bf16, NULL,
         "fastai's to_fp16 in bfloat16: products in bf16 with fp32 sums, weights fp32 (where the "
         "CPU has bf16 kernels; elsewhere fp32, said once); the saved model is fp32",
         0, 0, 0},
        {"--metrics", OPT_STR, &a.metrics, "LIST", "metrics to report [accuracy for classes]", 0, 0,
         0},
        {"--out", OPT_STR, &a.out, "FILE", "the model file (safetensors) [model.safetensors]", 0, 0,
         0},
        {"--plots", OPT_STR, &a.plots, "DIR",
         "write loss, schedule, metrics, lr_find PNGs here; classifiers: show_batch, "
         "show_results, top_losses, confusion matrix, and print most_confused",
         0, 0, 0},
        {"--csv-log", OPT_STR, &a.csv_log, "FILE",
         "fastai's CSVLogger: epoch,train_loss,valid_loss,<metrics>,time", 0, 0, 0},
        {"--save-every-epoch", OPT_FLAG, &a.save_every_epoch, NULL,
         "write --out after every epoch, so that a fit stopped by Ctrl-C or a NaN keeps the last "
         "completed epoch's model (default: only a finished fit writes it)",
         0, 0, 0},
        {"--checkpoint-every", OPT_INT, &a.checkpoint_every, "N",
         "write a checkpoint (everything the rest of the fit needs) every N batches (0: only on "
         "SIGTERM, which always writes one at the next batch and stops); a finished fit removes "
         "it unless --checkpoint names it [100]",
         0, 1 << 30, 0},
        {"--checkpoint", OPT_STR, &a.checkpoint, "FILE", "the checkpoint file [OUT.ckpt]", 0, 0, 0},
        {"--resume", OPT_STR, &a.resume, "FILE",
         "continue the fit a checkpoint was taken from (the same options): the result is the "
         "same model, bit for bit, as a fit never stopped",
         0, 0, 0},
        {"--max-restarts", OPT_INT, &a.max_restarts, "N",
         "fork workers: a killed, crashed or hung worker restarts the workers from the last "
         "commit, up to N times, with the same result as an undisturbed fit (under mpirun: "
         "corefit-mpirun --max-restarts N) [0]",
         0, 1000000, 0},
        {"--commit-every", OPT_INT, &a.commit_every, "K",
         "with --max-restarts: training batches between the commits a restart resumes from "
         "(kept in memory, /dev/shm) [" CLI_STR(CF_PAR_COMMIT_EVERY) "]",
         1, 1 << 30, 0},
        {"--y-range", OPT_STR, &a.y_range, "LOW,HIGH",
         "regression: squash outputs into [LOW, HIGH] (fastai's y_range); auto: the training "
         "targets' range + 5%; none [auto]",
         0, 0, 0},
        {0},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(cmd, argc, argv, 2, opts, pos, 0, &n_pos);
    if (rc < 0) {
        train_usage(stdout, opts);
        return CLI_OK;
    }
    if (rc) return rc;
    if ((rc = check_args(cmd, &a, true))) return rc;
    if ((rc = check_restarts(cmd, &a))) return rc;
    bool fine_tune = strcmp(a.schedule, "fine-tune") == 0;
    if (a.show && !a.plots) a.plots = ".";
    char plots_dir[4096];
    if (a.plots) a.plots = folder_name(a.plots, plots_dir, sizeof plots_dir);
    if ((rc = make_out_folder(cmd, a.out))) return rc;
    session s;
    if ((rc = setup(cmd, &a, &s))) {
        session_free(&s);
        return rc;
    }
    cf_learner *learn = s.learn;
    if (a.max_restarts > 0 && !s.parallel && s.master)
        fprintf(stderr,
                "corefit %s: warning: --max-restarts has no effect: the fit runs in this process "
                "(one core)\n",
                cmd);
    /* master callbacks: the CSV log (rank 0 writes it) */
    if (a.csv_log) {
        cf_callback *cb = cf_csv_logger_cb(a.csv_log, false);
        if (!cb || cf_learner_add_master_cbs(learn, &cb, 1)) {
            session_free(&s);
            return cli_lib_error(cmd, "CSV logger");
        }
    }
    /* fastai's TerminateOnNaN: a diverged fit stops and fails instead of saving NaN weights */
    cf_callback *nan_cb = cf_terminate_on_nan_cb();
    cf_callback *icb = &interrupt_cb;
    if (!nan_cb || cf_learner_add_cb(learn, nan_cb) || cf_learner_add_cb(learn, icb)) {
        session_free(&s);
        return cli_lib_error(cmd, "callbacks");
    }
    if (a.save_every_epoch) {
        cf_callback *cb = &save_epoch_cb;
        epoch_model_path = a.out;
        if (cf_learner_add_master_cbs(learn, &cb, 1)) {
            session_free(&s);
            return cli_lib_error(cmd, "--save-every-epoch");
        }
    }
    /* no bars or messages, but the table; on every rank, as the other master callbacks: MPI
     * ranks must hold the same ones to take rank 0's learner state at the end */
    if (a.quiet) {
        cf_callback *cb = cf_progress_cb_to(NULL, NULL, 0);
        if (!cb || cf_learner_add_master_cbs(learn, &cb, 1)) {
            session_free(&s);
            return cli_lib_error(cmd, "progress table");
        }
    }
    /* a read-only or missing output folder fails now, not after the fit */
    if (s.master && cf_st_check_writable(a.out)) {
        session_free(&s);
        return cli_lib_error(cmd, "--out");
    }
    bool through;
    if (s.master && a.csv_log && cf_output_check(a.csv_log, &through)) {
        session_free(&s);
        return cli_lib_error(cmd, "--csv-log");
    }
    struct stat plots_sb;
    bool made_plots = a.plots && s.master && stat(a.plots, &plots_sb) != 0;
    if (a.plots && s.master && mkdirs(a.plots)) {
        rc = cli_error(CLI_FAIL, cmd, "cannot create --plots folder %s: %s", a.plots,
                       strerror(errno));
        session_free(&s);
        return rc;
    }
    figures figs = {0};
    char path[4096];
    double lr = fine_tune ? 2e-3 : 3e-3;
    double t0 = cf_now();
    /* Ctrl-C: fork workers and MPI are stopped by the par layer (CF_ERR_INTERRUPTED); in this
     * process the interrupt callback cancels the fit at the next batch */
    struct stat out_before;
    bool had_out = stat(a.out, &out_before) == 0;
    struct sigaction sa = {.sa_handler = on_sigint}, old_sa;
    sigemptyset(&sa.sa_mask);
    bool own_sigint = !s.parallel && sigaction(SIGINT, &sa, &old_sa) == 0;
    if (a.lr && strcmp(a.lr, "auto") == 0) {
        cf_lr_find_result r;
        if ((rc = run_lr_find(cmd, &a, &s, &r))) {
            session_free(&s);
            return rc;
        }
        if (s.master) print_suggestions(&r);
        if (!isfinite(r.valley) || !(r.valley > 0)) {
            cf_lr_find_result_free(&r);
            session_free(&s);
            return cli_error(CLI_FAIL, cmd, "lr_find gave no valley suggestion; pass --lr");
        }
        lr = r.valley;
        if (s.master) printf("lr: %.3e (lr_find's valley)\n", lr);
        if (a.plots && s.master) {
            snprintf(path, sizeof path, "%s/lr_find.png", a.plots);
            figure_done(cmd, &figs, cf_plot_lr_find(&r, path), path, "lr_find");
        }
        cf_lr_find_result_free(&r);
    } else if (a.lr) {
        lr = strtod(a.lr, NULL);
    }
    cf_status st;
    const cf_par_opts par = s.par;
    /* the checkpoint callback runs in every replica (they agree on a stop; rank 0 writes) */
    char ckpt_buf[4096];
    const char *ckpt = checkpoint_file(&a, ckpt_buf, sizeof ckpt_buf);
    struct stat ckpt_before;
    bool had_ckpt = stat(ckpt, &ckpt_before) == 0;
    if (s.master && cf_output_check(ckpt, &through)) {
        session_free(&s);
        return cli_lib_error(cmd, a.checkpoint ? "--checkpoint" : "the checkpoint of --out");
    }
    cf_callback *ckpt_cb = cf_checkpoint_cb(.fname = ckpt, .every_batches = a.checkpoint_every);
    if (!ckpt_cb) {
        session_free(&s);
        return cli_lib_error(cmd, "checkpoint callback");
    }
    cf_callback *call_cbs[] = {ckpt_cb};
    struct sigaction term_sa = {.sa_handler = on_sigterm}, old_term;
    sigemptyset(&term_sa.sa_mask);
    term_sa.sa_flags = SA_RESTART;
    bool own_sigterm = sigaction(SIGTERM, &term_sa, &old_term) == 0;
    const char *resume = a.resume;
    if (!strcmp(a.schedule, "one-cycle"))
        st = s.parallel ? cf_par_fit_one_cycle(learn, a.epochs, .lr_max = CF_LR(lr), .par = par,
                                               .cbs = call_cbs, .n_cbs = 1, .resume = resume)
                        : cf_fit_one_cycle(learn, a.epochs, .lr_max = CF_LR(lr), .cbs = call_cbs,
                                           .n_cbs = 1, .resume = resume);
    else if (!strcmp(a.schedule, "flat-cos"))
        st = s.parallel ? cf_par_fit_flat_cos(learn, a.epochs, .lr = CF_LR(lr), .par = par,
                                              .cbs = call_cbs, .n_cbs = 1, .resume = resume)
                        : cf_fit_flat_cos(learn, a.epochs, .lr = CF_LR(lr), .cbs = call_cbs,
                                          .n_cbs = 1, .resume = resume);
    else if (!strcmp(a.schedule, "sgdr"))
        st = s.parallel ? cf_par_fit_sgdr(learn, a.epochs, a.cycle_len, .lr_max = CF_LR(lr),
                                          .par = par, .cbs = call_cbs, .n_cbs = 1, .resume = resume)
                        : cf_fit_sgdr(learn, a.epochs, a.cycle_len, .lr_max = CF_LR(lr),
                                      .cbs = call_cbs, .n_cbs = 1, .resume = resume);
    else
        st = s.parallel
                 ? cf_par_fine_tune(learn, a.epochs, .base_lr = lr,
                                    .freeze_epochs = a.freeze_epochs ? a.freeze_epochs : -1,
                                    .par = par, .cbs = call_cbs, .n_cbs = 1, .resume = resume)
                 : cf_fine_tune(learn, a.epochs, .base_lr = lr,
                                .freeze_epochs = a.freeze_epochs ? a.freeze_epochs : -1,
                                .cbs = call_cbs, .n_cbs = 1, .resume = resume);
    double seconds = cf_now() - t0;
    int restarts = s.parallel && s.par.start_method != CF_START_MPI ? cf_par_last_restarts() : 0;
    if (own_sigint) sigaction(SIGINT, &old_sa, NULL);
    /* after a SIGTERM, more of them (pre-emption repeats it) only stop what is already
     * stopping: the handler stays until exit */
    if (own_sigterm && !terminated) sigaction(SIGTERM, &old_term, NULL);
    if (st && terminated) {
        /* pre-empted: the checkpoint holds the fit; say how to continue */
        rc = cli_lib_error(cmd, "stopped by SIGTERM");
        if (s.master) {
            struct stat cs;
            if (stat(ckpt, &cs) == 0) print_resume_hint(argc, argv, ckpt);
            clean_up_partial(a.plots, made_plots);
        }
        session_free(&s);
        return rc == CLI_OK ? CLI_FAIL : rc;
    }
    if (st || interrupted) {
        bool stopped = interrupted || st == CF_ERR_INTERRUPTED;
        if (stopped)
            rc = cli_error(CLI_INTERRUPTED, cmd, "interrupted (Ctrl-C)");
        else if (restarts > 0)
            rc = cli_error(CLI_FAIL, cmd, "training: %s (after %d restart%s, --max-restarts %d)",
                           cf_last_error(), restarts, restarts == 1 ? "" : "s", a.max_restarts);
        else
            rc = cli_lib_error(cmd, "training");
        if (s.master) {
            /* a worker process wrote it (its count stays there): look at the file */
            bool rewritten = written_since(a.out, had_out, &out_before);
            if (a.save_every_epoch && (epochs_saved > 0 || rewritten))
                fprintf(stderr, "corefit %s: %s holds the model of the last completed epoch\n", cmd,
                        a.out);
            else
                fprintf(stderr, "corefit %s: no model written%s\n", cmd,
                        a.save_every_epoch ? " (no epoch completed)"
                                           : " (--save-every-epoch keeps each completed epoch's)");
            /* a lost worker (or a failed one) leaves this run's last checkpoint: say how to
             * go on from it (--max-restarts does that by itself) */
            if (!stopped && st == CF_ERR_WORKER && written_since(ckpt, had_ckpt, &ckpt_before)) {
                fprintf(stderr,
                        "corefit %s: checkpoint %s holds the fit up to its last batch "
                        "checkpoint\n",
                        cmd, ckpt);
                print_resume_hint(argc, argv, ckpt);
            }
            clean_up_partial(a.plots, made_plots);
        }
        session_free(&s);
        return rc;
    }
    /* the model file supersedes the checkpoint of a finished fit (kept when named) */
    struct stat ckpt_sb;
    if (s.master && !a.checkpoint && lstat(ckpt, &ckpt_sb) == 0 && S_ISREG(ckpt_sb.st_mode))
        unlink(ckpt);
    /* predictions for the confusion matrix (every rank takes part under MPI) */
    cf_preds preds = {0};
    bool classes = s.dls->train_ds->n_classes > 0;
    bool have_preds = false;
    if (a.plots && classes) {
        st = s.parallel ? cf_par_get_preds(learn, &preds, .with_loss = true, .par = par)
                        : cf_get_preds(learn, &preds, .with_loss = true);
        if (st) {
            session_free(&s);
            return cli_lib_error(cmd, "predictions for the confusion matrix");
        }
        have_preds = true;
    }
    if (s.master) {
        if (cf_learner_export(learn, a.out)) {
            cf_preds_free(&preds);
            session_free(&s);
            return cli_lib_error(cmd, "saving the model");
        }
        const cf_recorder *rec = &learn->recorder;
        if (rec->n_epochs > 0) {
            const double *last = rec->values + (size_t)(rec->n_epochs - 1) * rec->n_values;
            printf("result:");
            for (int j = 0; j < rec->n_values; j++) {
                char b[32];
                printf(" %s %s", rec->metric_names[j + 1], cf_format_float(last[j], b, sizeof b));
            }
            printf("\n");
        }
        char restarted[64] = "";
        if (restarts > 0) /* the workers were restarted in place (--max-restarts) */
            snprintf(restarted, sizeof restarted, ", %d restart%s", restarts,
                     restarts == 1 ? "" : "s");
        /* the Recorder holds the last fit only: fine_tune's unfrozen one */
        int frozen = fine_tune ? a.freeze_epochs : 0, epochs = frozen + rec->n_epochs;
        char phases[64] = "";
        if (frozen > 0)
            snprintf(phases, sizeof phases, ": %d frozen, %d unfrozen", frozen, rec->n_epochs);
        printf("time: %.1f s (%d epoch%s%s, %s%s)\n", seconds, epochs, epochs == 1 ? "" : "s",
               phases,
               s.par.start_method == CF_START_MPI ? "MPI"
               : s.parallel                       ? "fork workers"
                                                  : "in-process",
               restarted);
        printf("model: %s\n", a.out);
        if (a.csv_log) printf("log: %s\n", a.csv_log);
        if (a.plots) {
            if (!cf_plot_available()) {
                fprintf(stderr, "corefit train: figures need PLplot with its pngcairo driver "
                                "(plot-driver-cairo); none written\n");
            } else {
                snprintf(path, sizeof path, "%s/loss.png", a.plots);
                figure_done(cmd, &figs, cf_plot_loss(rec, path, NULL), path, "loss");
                snprintf(path, sizeof path, "%s/schedule.png", a.plots);
                figure_done(cmd, &figs, cf_plot_sched(rec, path), path, "schedule");
                snprintf(path, sizeof path, "%s/metrics.png", a.plots);
                figure_done(cmd, &figs, cf_plot_metrics(rec, path), path, "metrics");
                cli_show_batch_figure(a.plots, s.dls->train, s.dls->train_ds->vocab, note_figure,
                                      &figs);
                int64_t *counts = NULL;
                /* the class figures are for one class per item (not label sets or points) */
                int nc = s.dls->train_ds->target_dim == 1 ? s.dls->train_ds->n_classes : 0;
                if (have_preds && nc > 1 &&
                    cli_interpretation(a.plots, s.dls->valid_ds, &preds, nc, s.dls->train_ds->vocab,
                                       note_figure, &figs, &counts) == CF_OK)
                    cli_print_most_confused(stdout, counts, nc, s.dls->train_ds->vocab);
                else if (have_preds && nc > 1)
                    fprintf(stderr, "corefit train: confusion matrix not made: %s\n",
                            cf_last_error());
                cf_free(counts);
            }
        }
        fflush(stdout);
        if (a.show && figs.n) cli_show_figures((const char *const *)figs.paths, figs.n);
    }
    for (int i = 0; i < figs.n; i++) cf_free(figs.paths[i]);
    cf_preds_free(&preds);
    session_free(&s);
    return CLI_OK;
}

static void lr_find_usage(FILE *f, const cli_opt *opts) {
    fprintf(f,
            "Usage: corefit lr-find [options]\n\n"
            "Runs fastai's learning-rate finder (an exponential sweep from --start-lr to --end-lr\n"
            "over --num-it batches) on every core, prints the valley, slide, minimum and steep\n"
            "suggestions and plots loss against learning rate.\n\nOptions:\n");
    cli_print_options(f, opts);
}

int cmd_lr_find(int argc, char **argv) {
    const char *cmd = "lr-find";
    train_args a;
    defaults(&a);
    a.plot = "lr_find.png";
    cli_opt opts[] = {
        DATA_OPTIONS(a),
        PHOTO_OPTIONS(a),
        CLI_TASK_OPTIONS(a.data),
        MODEL_OPTIONS(a),
        {"--start-lr", OPT_DOUBLE, &a.start_lr, "X", "first learning rate [1e-7]", 1e-12, 1e3, 0},
        {"--end-lr", OPT_DOUBLE, &a.end_lr, "X", "last learning rate [10]", 1e-12, 1e6, 0},
        {"--num-it", OPT_INT, &a.num_it, "N", "batches in the sweep [100]", 6, 1000000, 0},
        {"--plot", OPT_STR, &a.plot, "FILE", "the figure [lr_find.png]", 0, 0, 0},
        {"--plots", OPT_STR, &a.plots, "DIR", "write the figure as DIR/lr_find.png (as train)", 0,
         0, 0},
        {0},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(cmd, argc, argv, 2, opts, pos, 0, &n_pos);
    if (rc < 0) {
        lr_find_usage(stdout, opts);
        return CLI_OK;
    }
    if (rc) return rc;
    if ((rc = check_args(cmd, &a, false))) return rc;
    if (a.start_lr > 0 && a.end_lr > 0 && a.end_lr <= a.start_lr)
        return cli_error(CLI_USAGE, cmd, "--end-lr %g must exceed --start-lr %g", a.end_lr,
                         a.start_lr);
    char plot_path[4096], plots_dir[4096];
    if (a.plots) {
        a.plots = folder_name(a.plots, plots_dir, sizeof plots_dir);
        for (const cli_opt *o = opts; o->name; o++)
            if (o->dest == (void *)&a.plot && o->seen)
                return cli_error(CLI_USAGE, cmd, "give --plot FILE or --plots DIR, not both");
        if (mkdirs(a.plots))
            return cli_error(CLI_FAIL, cmd, "cannot create --plots folder %s: %s", a.plots,
                             strerror(errno));
        snprintf(plot_path, sizeof plot_path, "%s/lr_find.png", a.plots);
        a.plot = plot_path;
    }
    session s;
    if ((rc = setup(cmd, &a, &s))) {
        session_free(&s);
        return rc;
    }
    cf_lr_find_result r;
    if ((rc = run_lr_find(cmd, &a, &s, &r))) {
        session_free(&s);
        return rc;
    }
    if (s.master) {
        print_suggestions(&r);
        printf("valley: %.6e\nslide: %.6e\nminimum: %.6e\nsteep: %.6e\n", r.valley, r.slide,
               r.minimum, r.steep);
        figures figs = {0};
        if (!cf_plot_available())
            fprintf(stderr,
                    "corefit lr-find: figures need PLplot's pngcairo driver; none written\n");
        else
            figure_done(cmd, &figs, cf_plot_lr_find(&r, a.plot), a.plot, "lr_find");
        fflush(stdout);
        if (a.show && figs.n) cli_show_figures((const char *const *)figs.paths, figs.n);
        for (int i = 0; i < figs.n; i++) cf_free(figs.paths[i]);
    }
    cf_lr_find_result_free(&r);
    session_free(&s);
    return CLI_OK;
}
