/* The figures a fastai user looks at after a fit or on a saved model (show_batch, show_results,
 * plot_top_losses, the confusion matrix, most_confused), and the test-time-augmented loss and
 * accuracy of `corefit eval --tta`. */
#include "corefit.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

int cli_mkdirs(const char *dir) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) && errno != EEXIST) return -1;
    return 0;
}

/* DIR without trailing slashes ("out/" -> "out"), so that paths print as out/loss.png. */
const char *cli_folder_name(const char *dir, char *buf, size_t size) {
    snprintf(buf, size, "%s", dir);
    for (size_t n = strlen(buf); n > 1 && buf[n - 1] == '/'; n--) buf[n - 1] = '\0';
    return buf;
}

void cli_figure_done(const char *cmd, cli_figures *f, cf_status st, const char *path,
                     const char *what) {
    if (st == CF_OK) {
        printf("figure: %s\n", path);
        f->paths[f->n++] = cf_strdup(path);
    } else {
        fprintf(stderr, "corefit %s: %s figure not written: %s\n", cmd, what, cf_last_error());
    }
}

void cli_figures_free(cli_figures *f) {
    for (int i = 0; i < f->n; i++) cf_free(f->paths[i]);
    f->n = 0;
}

static void note_train_figure(void *ctx, cf_status st, const char *path, const char *what) {
    cli_figure_done("train", ctx, st, path, what);
}

void cli_train_figures(const char *dir, const cf_recorder *rec, const cf_dls *dls,
                       const cf_preds *preds, cli_figures *figs) {
    if (!cf_plot_available()) {
        fprintf(stderr, "corefit train: figures need PLplot with its pngcairo driver "
                        "(plot-driver-cairo); none written\n");
        return;
    }
    const char *cmd = "train";
    char path[4096];
    snprintf(path, sizeof path, "%s/loss.png", dir);
    cli_figure_done(cmd, figs, cf_plot_loss(rec, path, NULL), path, "loss");
    snprintf(path, sizeof path, "%s/schedule.png", dir);
    cli_figure_done(cmd, figs, cf_plot_sched(rec, path), path, "schedule");
    snprintf(path, sizeof path, "%s/metrics.png", dir);
    cli_figure_done(cmd, figs, cf_plot_metrics(rec, path), path, "metrics");
    cli_show_batch_figure(dir, dls->train, dls->train_ds->vocab, note_train_figure, figs);
    int64_t *counts = NULL;
    /* the class figures are for one class per item (not label sets or points) */
    int nc = dls->train_ds->target_dim == 1 ? dls->train_ds->n_classes : 0;
    if (preds && nc > 1 &&
        cli_interpretation(dir, dls->valid_ds, preds, nc, dls->train_ds->vocab, note_train_figure,
                           figs, &counts) == CF_OK)
        cli_print_most_confused(stdout, counts, nc, dls->train_ds->vocab);
    else if (preds && nc > 1)
        fprintf(stderr, "corefit train: confusion matrix not made: %s\n", cf_last_error());
    cf_free(counts);
}

/* How many items fastai's show_batch, show_results and plot_top_losses show (max_n 9). */
enum { SHOWN = 9 };

static bool is_image_set(const cf_dataset *ds) {
    const cf_shape *s = &ds->sample_shape;
    return s->ndim == 3 && (s->dim[0] == 1 || s->dim[0] == 3);
}

/* Rows idx[0..k) of p, with their input images read from ds as a validation loader reads them
 * (before normalisation: the figures rescale each image to its own range anyway). */
static cf_status select_rows(const cf_preds *p, const cf_dataset *ds, const int64_t *idx, int k,
                             cf_preds *out) {
    memset(out, 0, sizeof *out);
    const int nc = p->preds.shape.ndim == 2 ? p->preds.shape.dim[1] : 1;
    const size_t numel = cf_shape_numel(&ds->sample_shape);
    int dims[CF_MAX_DIMS] = {k};
    for (int i = 0; i < ds->sample_shape.ndim && i + 1 < CF_MAX_DIMS; i++)
        dims[i + 1] = ds->sample_shape.dim[i];
    out->n = k;
    out->preds = cf_tensor_view(cf_malloc((size_t)k * nc * sizeof(float)), cf_shape2(k, nc));
    out->targs = cf_tensor_view(cf_malloc((size_t)k * sizeof(float)), cf_shape1(k));
    out->inputs = cf_tensor_view(cf_malloc((size_t)k * numel * sizeof(float)),
                                 cf_shape_make(ds->sample_shape.ndim + 1, dims));
    out->losses = p->losses ? cf_malloc((size_t)k * sizeof(float)) : NULL;
    cf_status st =
        out->preds.data && out->targs.data && out->inputs.data && (!p->losses || out->losses)
            ? CF_OK
            : cf_fail(CF_ERR_NOMEM, "figures: %d images", k);
    for (int i = 0; i < k && st == CF_OK; i++) {
        const int64_t r = idx[i];
        memcpy(out->preds.data + (size_t)i * nc, p->preds.data + r * nc, nc * sizeof(float));
        out->targs.data[i] = p->targs.data[r];
        if (out->losses) out->losses[i] = p->losses[r];
        st = cf_dataset_get(ds, r, 0, out->inputs.data + (size_t)i * numel);
    }
    if (st != CF_OK) cf_preds_free(out);
    return st;
}

static void figure_path(char *buf, size_t n, const char *dir, const char *name) {
    snprintf(buf, n, "%s/%s", dir, name);
}

void cli_show_batch_figure(const char *dir, const cf_dataloader *train, char *const *vocab,
                           cli_figure_fn done, void *ctx) {
    char path[4096];
    figure_path(path, sizeof path, dir, "show_batch.png");
    if (!is_image_set(cf_dataloader_dataset(train))) return;
    /* a loader of its own (no prefetch thread), so that the learner's keeps its state */
    cf_dl_options opt = *cf_dataloader_options(train);
    opt.prefetch = -1;
    cf_dataloader *dl = NULL;
    const cf_batch *b = NULL;
    cf_status st = cf_dataloader_new_like(train, &opt, &dl);
    if (st == CF_OK) st = cf_dataloader_begin_epoch(dl, 0);
    if (st == CF_OK) st = cf_dataloader_next(dl, &b);
    if (st == CF_OK && !b)
        st = cf_fail(CF_ERR_STATE, "show_batch: the training set gives no batch");
    const cf_dataset *ds = cf_dataloader_dataset(train);
    if (st == CF_OK && ds->masks) /* segmentation: the masks over the images */
        st = cf_show_batch_masks(b, b->size < SHOWN ? b->size : SHOWN, ds->n_classes, path);
    else if (st == CF_OK)
        st = cf_show_batch(b, b->size < SHOWN ? b->size : SHOWN, vocab, path);
    cf_dataloader_free(dl);
    done(ctx, st, path, "show_batch");
}

/* Python's repr of a str, as fastai's list of tuples prints it: single quotes unless the text
 * holds one and no double quote; backslashes, the quote and control characters escaped. */
static void print_repr(FILE *f, const char *s) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    fputc(q, f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\' || *p == (unsigned char)q)
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p == '\r')
            fputs("\\r", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
    fputc(q, f);
}

static void print_class(FILE *f, int k, char *const *vocab) {
    if (vocab) {
        print_repr(f, vocab[k]);
    } else {
        char b[16];
        snprintf(b, sizeof b, "%d", k);
        print_repr(f, b);
    }
}

int64_t cli_print_most_confused(FILE *f, const int64_t *counts, int n_classes, char *const *vocab) {
    int64_t total = cf_most_confused(counts, n_classes, 1, NULL, 0);
    if (total < 0) return -1;
    cf_confused_pair *pairs = cf_calloc((size_t)total + 1, sizeof *pairs);
    if (!pairs) return -1;
    cf_most_confused(counts, n_classes, 1, pairs, total);
    fprintf(f, "most_confused (actual, predicted, count):%s\n", total ? "" : " none");
    for (int64_t i = 0; i < total; i++) {
        fputs("  (", f);
        print_class(f, pairs[i].actual, vocab);
        fputs(", ", f);
        print_class(f, pairs[i].predicted, vocab);
        fprintf(f, ", %lld)\n", (long long)pairs[i].count);
    }
    cf_free(pairs);
    return total;
}

cf_status cli_interpretation(const char *dir, const cf_dataset *valid, const cf_preds *p,
                             int n_classes, char *const *vocab, cli_figure_fn done, void *ctx,
                             int64_t **counts_out) {
    char path[4096];
    *counts_out = NULL;
    int64_t *counts = cf_calloc((size_t)n_classes * n_classes + 1, sizeof *counts);
    if (!counts) return cf_fail(CF_ERR_NOMEM, "the confusion matrix of %d classes", n_classes);
    cf_status st = cf_confusion_from_preds(p, n_classes, counts);
    if (st != CF_OK) {
        cf_free(counts);
        return st;
    }
    int k = p->n < SHOWN ? (int)p->n : SHOWN;
    if (is_image_set(valid) && k > 0) {
        cf_preds sel = {0};
        int64_t idx[SHOWN];
        for (int i = 0; i < k; i++) idx[i] = i; /* show_results: the first items */
        figure_path(path, sizeof path, dir, "show_results.png");
        cf_status fst = select_rows(p, valid, idx, k, &sel);
        if (fst == CF_OK) fst = cf_show_results(&sel, k, vocab, path);
        cf_preds_free(&sel);
        done(ctx, fst, path, "show_results");
        figure_path(path, sizeof path, dir, "top_losses.png");
        fst = p->losses ? cf_top_losses(p, k, idx)
                        : cf_fail(CF_ERR_STATE, "plot_top_losses: no per-item losses");
        if (fst == CF_OK) fst = select_rows(p, valid, idx, k, &sel);
        if (fst == CF_OK) fst = cf_plot_top_losses(&sel, k, vocab, path);
        cf_preds_free(&sel);
        done(ctx, fst, path, "plot_top_losses");
    }
    figure_path(path, sizeof path, dir, "confusion.png");
    done(ctx, cf_plot_confusion_matrix(counts, n_classes, vocab, path, false), path,
         "confusion matrix");
    *counts_out = counts;
    return CF_OK;
}

cf_status cli_tta_scores(const cf_preds *p, int n_classes, double *loss, double *accuracy) {
    if (p->preds.shape.ndim != 2 || p->preds.shape.dim[1] != n_classes || n_classes < 2)
        return cf_fail(CF_ERR_INVALID, "tta: predictions are not (n, %d) class probabilities",
                       n_classes);
    double nll = 0;
    int64_t right = 0;
    for (int64_t i = 0; i < p->n; i++) {
        const float *row = p->preds.data + i * n_classes;
        const int t = (int)p->targs.data[i];
        if (t < 0 || t >= n_classes)
            return cf_fail(CF_ERR_INVALID, "tta: item %lld has class %d of %d", (long long)i, t,
                           n_classes);
        int best = 0;
        for (int c = 1; c < n_classes; c++)
            if (row[c] > row[best]) best = c;
        right += best == t;
        nll -= log((double)row[t]);
    }
    *loss = p->n ? nll / (double)p->n : NAN;
    *accuracy = p->n ? (double)right / (double)p->n : NAN;
    return CF_OK;
}

/* ---- corefit eval --tta / --plots ---------------------------------------------------------- */

static void eval_figure_done(void *ctx, cf_status st, const char *path, const char *what) {
    cli_eval_extras *x = ctx;
    if (st == CF_OK && x->n_figures < (int)(sizeof x->figures / sizeof *x->figures))
        x->figures[x->n_figures++] = cf_strdup(path);
    else if (st != CF_OK)
        fprintf(stderr, "corefit eval: %s figure not written: %s\n", what, cf_last_error());
}

int cli_eval_extras_run(const char *cmd, cf_learner *learn, cli_eval_extras *x) {
    const cf_dataset *valid = learn->dls->valid_ds;
    /* the class figures and TTA's accuracy are for one class per item */
    x->n_classes = valid->target_dim == 1 ? valid->n_classes : 0;
    if (x->tta && x->n_classes < 2)
        return cli_error(CLI_USAGE, cmd, "--tta is for single-label image classifiers (%s)",
                         cf_dataset_is_multi_label(valid) ? "this model predicts label sets"
                                                          : "this model predicts numbers");
    if (x->tta) {
        /* the augmentations recorded in the model; a model trained without them (or written
         * before they were recorded) gets fastai's aug_transforms() */
        cf_aug_opts aug = x->tta_aug ? *x->tta_aug : cf_aug_transforms_defaults(1.0f);
        cf_preds p = {0};
        cf_status st = cf_tta(learn, &p, .n = x->tta_n, .beta = x->tta_beta,
                              .aug_only = x->tta_beta == 0, .aug = &aug);
        if (st == CF_OK) st = cli_tta_scores(&p, x->n_classes, &x->tta_loss, &x->tta_accuracy);
        cf_preds_free(&p);
        if (st != CF_OK) return cli_lib_error(cmd, "test-time augmentation");
        x->have_tta = true;
    }
    if (x->plots && x->n_classes > 1) {
        cf_preds p = {0};
        if (cf_get_preds(learn, &p, .with_loss = true))
            return cli_lib_error(cmd, "predictions for the figures");
        if (!cf_plot_available())
            fprintf(stderr,
                    "corefit %s: figures need PLplot with its pngcairo driver "
                    "(plot-driver-cairo); none written\n",
                    cmd);
        cf_status st = cf_plot_available()
                           ? cli_interpretation(x->plots, valid, &p, x->n_classes, valid->vocab,
                                                eval_figure_done, x, &x->counts)
                           : CF_OK;
        if (st == CF_OK && !x->counts) {
            x->counts = cf_calloc((size_t)x->n_classes * x->n_classes + 1, sizeof *x->counts);
            st = x->counts ? cf_confusion_from_preds(&p, x->n_classes, x->counts) : CF_ERR_NOMEM;
        }
        cf_preds_free(&p);
        if (st != CF_OK) return cli_lib_error(cmd, "the confusion matrix");
    } else if (x->plots) {
        fprintf(stderr, "corefit %s: --plots: the class figures are for single-label models\n",
                cmd);
    }
    return CLI_OK;
}

void cli_eval_extras_print(const cf_learner *learn, const cli_eval_extras *x) {
    char b[32];
    if (x->have_tta) {
        printf("tta_valid_loss: %s\n", cf_format_float(x->tta_loss, b, sizeof b));
        printf("tta_accuracy: %s\n", cf_format_float(x->tta_accuracy, b, sizeof b));
        printf("tta: %d augmented passes (%s), beta %g\n", x->tta_n,
               x->tta_aug_note ? x->tta_aug_note : "aug_transforms()", x->tta_beta);
    }
    for (int i = 0; i < x->n_figures; i++) printf("figure: %s\n", x->figures[i]);
    if (x->counts)
        cli_print_most_confused(stdout, x->counts, x->n_classes, learn->dls->valid_ds->vocab);
}

void cli_eval_extras_json(cJSON *j, const cf_learner *learn, const cli_eval_extras *x) {
    if (x->have_tta) {
        cJSON_AddNumberToObject(j, "tta_valid_loss", x->tta_loss);
        cJSON_AddNumberToObject(j, "tta_accuracy", x->tta_accuracy);
        cJSON_AddNumberToObject(j, "tta_n", x->tta_n);
        cJSON_AddNumberToObject(j, "tta_beta", x->tta_beta);
    }
    if (x->n_figures) {
        cJSON *f = cJSON_AddArrayToObject(j, "figures");
        for (int i = 0; i < x->n_figures; i++)
            cJSON_AddItemToArray(f, cJSON_CreateString(x->figures[i]));
    }
    if (!x->counts) return;
    char *const *vocab = learn->dls->valid_ds->vocab;
    int64_t total = cf_most_confused(x->counts, x->n_classes, 1, NULL, 0);
    cf_confused_pair *pairs = total > 0 ? cf_calloc((size_t)total, sizeof *pairs) : NULL;
    if (pairs) cf_most_confused(x->counts, x->n_classes, 1, pairs, total);
    cJSON *mc = cJSON_AddArrayToObject(j, "most_confused");
    for (int64_t i = 0; pairs && i < total; i++) {
        cJSON *row = cJSON_CreateArray();
        char a[16], p[16];
        snprintf(a, sizeof a, "%d", pairs[i].actual);
        snprintf(p, sizeof p, "%d", pairs[i].predicted);
        cJSON_AddItemToArray(row, cJSON_CreateString(vocab ? vocab[pairs[i].actual] : a));
        cJSON_AddItemToArray(row, cJSON_CreateString(vocab ? vocab[pairs[i].predicted] : p));
        cJSON_AddItemToArray(row, cJSON_CreateNumber((double)pairs[i].count));
        cJSON_AddItemToArray(mc, row);
    }
    cf_free(pairs);
}

void cli_eval_extras_free(cli_eval_extras *x) {
    for (int i = 0; i < x->n_figures; i++) cf_free(x->figures[i]);
    cf_free(x->counts);
    x->n_figures = 0;
    x->counts = NULL;
}
