/* corefit's other vision tasks on the command line: images listed in a CSV (--images-csv) with
 * one class, a label set (--multi-label, fastai's MultiCategoryBlock with label_delim) or a
 * point (--points, fastai's PointBlock); train, then predict printing label sets and points.
 * train.c and eval_predict.c call in here through the cli_task_* hooks. */
#include "corefit.h"

#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef CF_HAVE_STB
#include <stb_image.h>
#endif

int cli_task_check(const char *cmd, const cli_data *d, const char *metrics) {
    const cli_task_data *t = &d->task;
    if (!d->images_csv) {
        if (t->multi_label || t->points || t->label_delim || d->fn_col || d->label_col ||
            d->valid_col || t->x_col || t->y_col)
            return cli_error(CLI_USAGE, cmd,
                             "--multi-label, --points, --label-delim and the --*-col options "
                             "need --images-csv");
        return CLI_OK;
    }
    if (d->idx || d->images || d->csv)
        return cli_error(CLI_USAGE, cmd,
                         "give one data source: --idx, --images, --csv or "
                         "--images-csv");
    if (d->limit > 0)
        return cli_error(CLI_USAGE, cmd,
                         "--limit is not available with --images-csv (write a "
                         "shorter CSV, e.g. fmnist-tasks --n)");
    if (t->multi_label + t->points + d->regression > 1)
        return cli_error(CLI_USAGE, cmd, "give one of --multi-label, --points and --regression");
    if (t->label_delim && !t->multi_label)
        return cli_error(CLI_USAGE, cmd, "--label-delim is for --multi-label");
    if ((t->x_col || t->y_col) && !t->points)
        return cli_error(CLI_USAGE, cmd, "--x-col and --y-col are for --points");
    if (t->points && d->label_col)
        return cli_error(CLI_USAGE, cmd, "--points reads --x-col and --y-col, not --label-col");
    if (metrics && t->multi_label) {
        strlist names = {0};
        if (strlist_split(metrics, &names)) return cli_error(CLI_FAIL, cmd, "out of memory");
        int rc = CLI_OK;
        for (int i = 0; i < names.n && rc == CLI_OK; i++)
            if (strcmp(names.v[i], "accuracy_multi") != 0 && strcmp(names.v[i], "f1_multi") != 0)
                rc = cli_error(CLI_USAGE, cmd,
                               "unknown --metrics name '%s' for --multi-label (accuracy_multi, "
                               "f1_multi)",
                               names.v[i]);
        strlist_free(&names);
        return rc;
    }
    return CLI_OK;
}

bool cli_task_data_set(const cli_data *d) {
    return d->images_csv && (d->task.multi_label || d->task.points || d->regression);
}

cf_status cli_task_load(const cli_data *d, const char **input, cf_dataset **train,
                        cf_dataset **valid) {
    const cli_task_data *t = &d->task;
    *input = "images-csv";
    cf_image_folder_options o = {.size = d->size,
                                 .channels = d->channels,
                                 .valid_pct = d->valid_col ? 0 : d->valid_pct,
                                 .seed = d->seed,
                                 .load = CF_IMAGE_LOAD_MEMORY};
    if (d->load && strcmp(d->load, "stream") == 0) o.load = CF_IMAGE_LOAD_STREAM;
    if (t->multi_label)
        return cf_datasets_from_image_csv_multi(d->images_csv, d->folder, d->fn_col, d->label_col,
                                                d->valid_col, t->label_delim ? t->label_delim : " ",
                                                &o, train, valid);
    if (t->points)
        return cf_datasets_from_image_points_csv(d->images_csv, d->folder, d->fn_col, t->x_col,
                                                 t->y_col, d->valid_col, &o, train, valid);
    if (d->regression)
        return cf_datasets_from_image_csv_values(d->images_csv, d->folder, d->fn_col, d->label_col,
                                                 d->valid_col, &o, train, valid);
    return cf_fail(CF_ERR_INVALID,
                   "--images-csv %s: give --multi-label, --points or --regression (single "
                   "labels load with the image options)",
                   d->images_csv);
}

bool cli_task_metrics(const char *cmd, const cli_data *d, const char *list, int n_classes,
                      cf_metric ***out, int *n, int *rc) {
    if (!d->images_csv || !d->task.multi_label) return false;
    *out = NULL;
    *n = 0;
    *rc = CLI_OK;
    strlist names = {0};
    cf_metric **m = NULL;
    if (strlist_split(list ? list : "accuracy_multi", &names) ||
        !(m = cf_calloc((size_t)names.n + 1, sizeof *m))) {
        strlist_free(&names);
        *rc = cli_error(CLI_FAIL, cmd, "out of memory");
        return true;
    }
    for (int i = 0; i < names.n; i++) /* names were checked by cli_task_check */
        m[(*n)++] = strcmp(names.v[i], "f1_multi") == 0
                        ? cf_f1_score_multi(n_classes, CF_AVERAGE_MACRO)
                        : cf_accuracy_multi(0.5f, false); /* fastai's thresh 0.5, sigmoid */
    strlist_free(&names);
    *out = m;
    return true;
}

bool cli_task_y_range(const cli_data *d, const cf_dataset *train, float *lo, float *hi) {
    if (!d->images_csv) return false;
    if (d->task.points) { /* PointScaler's range, fastai's y_range=(-1, 1) for keypoints */
        *lo = -1;
        *hi = 1;
        return true;
    }
    if (!d->regression || train->n < 1) return false;
    /* as for tables: the training targets' range widened by 5% of it each side */
    double l = INFINITY, h = -INFINITY;
    for (int64_t i = 0; i < train->n * train->target_dim; i++) {
        l = fmin(l, train->y[i]);
        h = fmax(h, train->y[i]);
    }
    double pad = h > l ? 0.05 * (h - l) : fabs(h) * 0.05 + 1;
    *lo = (float)(l - pad);
    *hi = (float)(h + pad);
    return true;
}

cf_status cli_task_adopt_model(cf_dataset *ds, const cf_model_info *m) {
    if (!cf_dataset_is_multi_label(ds)) return CF_OK; /* points and values need nothing */
    if (!m->recipe.multi_label || m->n_vocab != m->recipe.n_out)
        return cf_fail(CF_ERR_FORMAT, "the model is not a multi-label model");
    const int c = ds->n_classes, mc = m->recipe.n_out;
    int *to = cf_malloc((size_t)c * sizeof *to);
    float *y = cf_calloc((size_t)(ds->n > 0 ? ds->n : 1) * (size_t)mc, sizeof *y);
    cf_status st = to && y ? CF_OK : CF_ERR_NOMEM;
    for (int k = 0; k < c && st == CF_OK; k++) {
        to[k] = -1;
        for (int j = 0; j < mc && to[k] < 0; j++)
            if (strcmp(ds->vocab[k], m->vocab[j]) == 0) to[k] = j;
        if (to[k] < 0)
            st = cf_fail(CF_ERR_FORMAT, "%s: label '%s' is not one of the model's %d classes",
                         ds->source ? ds->source : "images", ds->vocab[k], mc);
    }
    for (int64_t i = 0; i < ds->n && st == CF_OK; i++)
        for (int k = 0; k < c; k++) y[i * mc + to[k]] = ds->y[i * c + k];
    if (st == CF_OK) {
        for (int k = 0; k < c; k++) cf_free(ds->vocab[k]);
        cf_free(ds->vocab);
        ds->vocab = NULL;
        cf_free(ds->y);
        ds->y = y;
        y = NULL;
        ds->target_dim = ds->n_classes = mc;
        st = cf_dataset_set_vocab(ds, (const char *const *)m->vocab, mc);
    }
    cf_free(to);
    cf_free(y);
    return st;
}

/* The pixel size of an image file (0 x 0 when its header cannot be read). */
static void image_size(const char *path, int *w, int *h) {
    *w = *h = 0;
#ifdef CF_HAVE_STB
    int comp;
    if (!stbi_info(path, w, h, &comp)) *w = *h = 0;
#else
    (void)path;
#endif
}

bool cli_task_print(const cf_learner *learn, const cf_model_info *m, const char *input,
                    const float *row, void *json_array) {
    cJSON *arr = json_array;
    const int c = m->recipe.n_out;
    if (m->recipe.multi_label) {
        /* fastai's predict: the decoded label set, then every probability */
        float *set = cf_malloc((size_t)c * sizeof(float));
        if (!set) return false;
        cf_learner_decodes(learn, row, 1, 0, 0, set);
        if (arr) {
            cJSON *o = cJSON_CreateObject(), *labels = cJSON_AddArrayToObject(o, "labels");
            cJSON_AddStringToObject(o, "input", input);
            for (int k = 0; k < c; k++)
                if (set[k] > 0.5f) cJSON_AddItemToArray(labels, cJSON_CreateString(m->vocab[k]));
            cJSON *pr = cJSON_AddObjectToObject(o, "probabilities");
            for (int k = 0; k < c; k++) cJSON_AddNumberToObject(pr, m->vocab[k], row[k]);
            cJSON_AddItemToArray(arr, o);
        } else {
            size_t need = cf_label_set_str(set, c, m->vocab, ";", NULL, 0) + 1;
            char *s = cf_malloc(need);
            if (s) cf_label_set_str(set, c, m->vocab, ";", s, need);
            cli_print_tsv_field(input);
            putchar('\t');
            cli_print_tsv_field(s ? s : "");
            for (int k = 0; k < c; k++) {
                putchar('\t');
                cli_print_tsv_field(m->vocab[k]);
                printf("=%.6f", row[k]);
            }
            putchar('\n');
            cf_free(s);
        }
        cf_free(set);
        return true;
    }
    if (m->recipe.n_points > 0) {
        /* the points in pixels of the image file (PointScaler decoded by its size) */
        int w, h;
        image_size(input, &w, &h);
        float *px = cf_malloc((size_t)c * sizeof(float));
        if (!px) return false;
        cf_learner_decodes(learn, row, 1, w, h, px);
        if (arr) {
            cJSON *o = cJSON_CreateObject(), *pts = cJSON_AddArrayToObject(o, "points");
            cJSON_AddStringToObject(o, "input", input);
            for (int k = 0; k + 1 < c; k += 2) {
                cJSON *p = cJSON_CreateArray();
                cJSON_AddItemToArray(p, cJSON_CreateNumber(px[k]));
                cJSON_AddItemToArray(p, cJSON_CreateNumber(px[k + 1]));
                cJSON_AddItemToArray(pts, p);
            }
            cJSON_AddItemToArray(arr, o);
        } else {
            cli_print_tsv_field(input);
            for (int k = 0; k + 1 < c; k += 2) printf("\t%.2f\t%.2f", px[k], px[k + 1]);
            putchar('\n');
        }
        cf_free(px);
        return true;
    }
    return false;
}
