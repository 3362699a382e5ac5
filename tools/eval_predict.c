/* corefit eval and corefit predict: a saved model (rebuilt from its metadata) on a data set, or on
 * images and CSV rows. */
#include "corefit.h"
#include "photo.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int read_model_meta(const char *cmd, const char *path, cf_model_info *m) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return cli_error(CLI_FAIL, cmd, "model file %s: %s", path, strerror(errno));
    if (cf_model_info_read(path, m)) return cli_lib_error(cmd, "reading the model");
    return CLI_OK;
}

/* Maps an image folder's labels (its own vocab) onto the model's classes, by name. */
static cf_status remap_labels(cf_dataset *ds, const cf_model_info *m) {
    if (!ds->vocab) return CF_OK;
    for (int64_t i = 0; i < ds->n; i++) {
        int code = (int)ds->y[i], k = -1;
        for (int j = 0; j < m->n_vocab && k < 0; j++)
            if (strcmp(ds->vocab[code], m->vocab[j]) == 0) k = j;
        if (k < 0)
            return cf_fail(CF_ERR_FORMAT, "%s: class '%s' is not one of the model's %d classes",
                           ds->source ? ds->source : "images", ds->vocab[code], m->n_vocab);
        ds->y[i] = (float)k;
    }
    return CF_OK;
}

/* After remap_labels: the data set takes the model's class count and names, so that a folder
 * holding only some of the classes (labels already remapped) has a vocabulary as long as its
 * class count for everything that copies it. */
static cf_status adopt_model_classes(cf_dataset *ds, const cf_model_info *m) {
    if (ds->vocab)
        for (int i = 0; i < ds->n_classes; i++) cf_free(ds->vocab[i]);
    cf_free(ds->vocab);
    ds->vocab = NULL;
    ds->n_classes = m->recipe.n_out;
    if (m->n_vocab != m->recipe.n_out) return CF_OK; /* a model without class names */
    return cf_dataset_set_vocab(ds, (const char *const *)m->vocab, m->n_vocab);
}

static cf_status check_image_shape(const cf_dataset *ds, const cf_model_info *m) {
    const cf_shape *s = &ds->sample_shape;
    if (s->ndim != 3 || s->dim[0] != m->n_in || s->dim[1] != m->height || s->dim[2] != m->width)
        return cf_fail(CF_ERR_FORMAT,
                       "the data's samples are not %d x %d x %d images as the model expects",
                       m->n_in, m->height, m->width);
    return CF_OK;
}

/* Categorify maps values training never saw to #na#, as fastai does; say how many there were. */
static void warn_unseen(const char *cmd, int64_t unseen, const char *csv) {
    if (unseen > 0)
        fprintf(stderr,
                "corefit %s: warning: %lld categorical value%s in %s %s not seen in training "
                "(encoded as #na#)\n",
                cmd, (long long)unseen, unseen == 1 ? "" : "s", csv, unseen == 1 ? "was" : "were");
}

/* ---- eval ---------------------------------------------------------------------------------- */

static void eval_usage(FILE *f, const cli_opt *opts) {
    fprintf(f, "Usage: corefit eval [options] MODEL.safetensors\n\n"
               "Validation loss and metrics of a saved model on a data set: the t10k files of an\n"
               "IDX folder, the valid/ images of a folder (or every image when there is none), or\n"
               "every row of a CSV file (with the target column).\n\nOptions:\n");
    cli_print_options(f, opts);
}

int cmd_eval(int argc, char **argv) {
    if (cli_argv_has(argc, argv, "--text")) return cmd_eval_text(argc, argv);
    const char *cmd = "eval";
    cli_data d = {.seed = 42};
    bool json = false, tta = false;
    int threads = 0, tta_n = 4;
    double tta_beta = 0.25;
    const char *plots = NULL;
    cli_opt opts[] = {
        {"--idx", OPT_STR, &d.idx, "DIR", "IDX folder (its t10k files) [Fashion-MNIST]", 0, 0, 0},
        {"--images", OPT_STR, &d.images, "DIR", "class-per-folder images", 0, 0, 0},
        {"--csv", OPT_STR, &d.csv, "FILE", "a table with the model's columns and target", 0, 0, 0},
        {"--limit", OPT_INT, &d.limit, "N", "IDX: the first N/5 validation images (as train)", 1,
         1e9, 0},
        {"--bs", OPT_INT, &d.bs, "N", "batch size [64]", 1, 1 << 20, 0},
        {"--threads", OPT_INT, &threads, "N", "threads [all]", 1, 4096, 0},
        {"--json", OPT_FLAG, &json, NULL, "print the results as JSON", 0, 0, 0},
        {"--tta", OPT_FLAG, &tta, NULL,
         "images: also the loss and accuracy with test-time augmentation (fastai's tta with "
         "the model's recorded aug_transforms; aug_transforms() for a model trained without)",
         0, 0, 0},
        {"--tta-n", OPT_INT, &tta_n, "N", "augmented passes of --tta [4]", 1, 1000, 0},
        {"--tta-beta", OPT_DOUBLE, &tta_beta, "B",
         "weight of the plain predictions in --tta's blend [0.25]", 0, 1, 0},
        {"--plots", OPT_STR, &plots, "DIR",
         "write show_results, top_losses and confusion PNGs to DIR; print most_confused", 0, 0, 0},
        CLI_IMAGES_CSV_OPTIONS(d),
        CLI_TASK_OPTIONS(d),
        CLI_SEG_OPTIONS(d),
        {0},
    };
    const char *pos[1];
    int n_pos;
    bool help;
    int rc = cli_parse_or_usage(cmd, argc, argv, opts, pos, 1, &n_pos, eval_usage, &help);
    if (rc || help) return rc;
    for (const cli_opt *o = opts; o->name; o++) /* --tta-n and --tta-beta imply --tta */
        if (o->seen && strncmp(o->name, "--tta-", 6) == 0) tta = true;
    if (n_pos != 1)
        return cli_error(CLI_USAGE, cmd, "expects one model file (see corefit eval --help)");
    if ((d.idx != NULL) + (d.images != NULL) + (d.csv != NULL) > 1)
        return cli_error(CLI_USAGE, cmd, "give one data source: --idx, --images or --csv");
    if ((rc = cli_task_check(cmd, &d, NULL)) || (rc = cli_seg_check(cmd, &d, NULL, NULL)))
        return rc;
    if (threads > 0) cf_set_num_threads(threads);
    if (cf_blas_reserve(cf_get_num_threads())) return cli_lib_error(cmd, "BLAS");
    cf_model_info m;
    if ((rc = read_model_meta(cmd, pos[0], &m))) return rc;
    bool tabular = strcmp(m.recipe.arch, "tabular") == 0;
    if (tabular != (d.csv != NULL)) {
        cf_model_info_free(&m);
        return cli_error(CLI_USAGE, cmd,
                         tabular ? "a tabular model needs --csv data"
                                 : "an image model needs --idx or --images data");
    }
    const bool unet = strncmp(m.recipe.arch, "unet-", 5) == 0; /* --masks (seg.c) */
    if (unet != d.seg.masks || (unet && tta)) {
        cf_model_info_free(&m);
        return cli_error(CLI_USAGE, cmd,
                         unet && tta ? "--tta is for image classifiers, not a U-Net"
                         : unet      ? "a U-Net model needs --images DIR --masks (its masks)"
                                     : "--masks is for a U-Net model (trained with --masks)");
    }
    if (tta && (tabular || m.recipe.n_out < 2)) {
        cf_model_info_free(&m);
        return cli_error(CLI_USAGE, cmd, "--tta is for image classifiers (%s)",
                         tabular ? "a table has no augmentation" : "this model has one output");
    }
    if (plots && cli_mkdirs(plots)) {
        cf_model_info_free(&m);
        return cli_error(CLI_FAIL, cmd, "cannot create --plots folder %s: %s", plots,
                         strerror(errno));
    }
    cf_dataset *ds = NULL;
    cf_status st = CF_OK;
    int64_t unseen = 0;
    if (tabular) {
        cf_csv_table *t = NULL;
        st = cf_csv_read(d.csv, ',', &t);
        if (st == CF_OK) st = cf_tabular_encode(&m, t, true, &ds, &unseen);
        warn_unseen(cmd, unseen, d.csv);
        cf_csv_table_free(t);
    } else {
        d.size = m.height;
        d.channels = m.n_in;
        cli_photo_adopt_model(&d, &m); /* the item transform the model was trained with */
        d.valid_pct = 0;
        const char *input;
        cf_dataset *train = NULL, *valid = NULL;
        d.eval = true; /* a flat class folder: every image is evaluated */
        st = cli_load_data(&d, &input, &train, &valid);
        if (st == CF_OK) {
            if (valid->n > 0) {
                ds = valid;
                cf_dataset_free(train);
            } else {
                ds = train;
                cf_dataset_free(valid);
            }
            if (unet)
                st = cli_seg_adopt_model(ds, &m);
            else if (d.images)
                st = remap_labels(ds, &m);
            if (st == CF_OK) st = check_image_shape(ds, &m);
            /* label sets, points and values keep their own targets (tasks.c) */
            const bool task = cli_task_data_set(&d) || unet;
            if (st == CF_OK && task && !unet)
                st = cli_task_adopt_model(ds, &m);
            else if (st == CF_OK && ds->n_classes > m.recipe.n_out)
                st = cf_fail(CF_ERR_FORMAT, "the data has %d classes, the model %d", ds->n_classes,
                             m.recipe.n_out);
            if (st == CF_OK && !task) st = adopt_model_classes(ds, &m);
        }
    }
    if (st) {
        cf_dataset_free(ds);
        cf_model_info_free(&m);
        return cli_lib_error(cmd, "loading the data");
    }
    int64_t n = ds->n;
    cf_learner *learn = NULL;
    cf_dls *dls = NULL;
    if (cli_load_learner(pos[0], &m, ds, d.bs, &learn, &dls)) {
        cf_model_info_free(&m);
        return cli_lib_error(cmd, "loading the model");
    }
    double values[8];
    if (cf_validate(learn, values)) {
        cf_learner_free(learn);
        cf_dls_free(dls);
        cf_model_info_free(&m);
        return cli_lib_error(cmd, "validation");
    }
    if (unet && plots && (rc = cli_seg_eval_figures(cmd, learn, plots))) {
        cf_learner_free(learn);
        cf_dls_free(dls);
        cf_model_info_free(&m);
        return rc;
    }
    cli_eval_extras x = {
        .tta = tta, .tta_n = tta_n, .tta_beta = tta_beta, .plots = unet ? NULL : plots};
    cli_photo_tta_aug(&m, &x.tta_aug, &x.tta_aug_note);
    if (cli_eval_extras_run(cmd, learn, &x)) {
        cli_eval_extras_free(&x);
        cf_learner_free(learn);
        cf_dls_free(dls);
        cf_model_info_free(&m);
        return CLI_FAIL;
    }
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", pos[0]);
        cJSON_AddNumberToObject(j, "n", (double)n);
        cJSON_AddNumberToObject(j, "valid_loss", values[0]);
        for (int i = 0; i < learn->n_metrics; i++)
            cJSON_AddNumberToObject(j, learn->metrics[i]->name, values[1 + i]);
        cli_eval_extras_json(j, learn, &x);
        char *s = cJSON_Print(j);
        if (s) printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(j);
    } else {
        char b[32];
        printf("samples: %lld\n", (long long)n);
        printf("valid_loss: %s\n", cf_format_float(values[0], b, sizeof b));
        for (int i = 0; i < learn->n_metrics; i++)
            printf("%s: %s\n", learn->metrics[i]->name,
                   cf_format_float(values[1 + i], b, sizeof b));
        cli_eval_extras_print(learn, &x);
    }
    cli_eval_extras_free(&x);
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_model_info_free(&m);
    return CLI_OK;
}

/* ---- predict ------------------------------------------------------------------------------- */

static void predict_usage(FILE *f, const cli_opt *opts) {
    fprintf(f, "Usage: corefit predict [options] MODEL.safetensors IMAGE...\n"
               "       corefit predict [options] MODEL.safetensors --csv FILE\n\n"
               "Classes and probabilities (or predicted values) of a saved model for image files\n"
               "(decoded and resized as in training) or the rows of a CSV file (encoded with the\n"
               "training vocabularies and statistics; the target column may be absent). One line\n"
               "per input: the input, the predicted class and its probability; --json gives every\n"
               "probability.\n\nOptions:\n");
    cli_print_options(f, opts);
}

/* One field of the tab-separated output: a backslash, tab, newline or carriage return in it (a
 * class folder's name may hold them) is written as \\, \t, \n or \r, so that every input stays
 * one line of tab-separated fields. */
void cli_print_tsv_field(const char *s) {
    for (; *s; s++) switch (*s) {
        case '\\':
            fputs("\\\\", stdout);
            break;
        case '\t':
            fputs("\\t", stdout);
            break;
        case '\n':
            fputs("\\n", stdout);
            break;
        case '\r':
            fputs("\\r", stdout);
            break;
        default:
            putchar(*s);
        }
}

int cmd_predict(int argc, char **argv) {
    if (cli_argv_has(argc, argv, "--text") || cli_is_text_model(argc, argv))
        return cmd_predict_text(argc, argv);
    const char *cmd = "predict";
    const char *csv = NULL, *out = NULL;
    bool json = false;
    int top = 1, bs = 64, threads = 0;
    cli_opt opts[] = {
        {"--csv", OPT_STR, &csv, "FILE", "predict every row of this table", 0, 0, 0},
        {"--json", OPT_FLAG, &json, NULL, "print a JSON array with every probability", 0, 0, 0},
        {"--top", OPT_INT, &top, "K", "text output: the K most likely classes [1]", 1, 1000, 0},
        {"--bs", OPT_INT, &bs, "N", "batch size of --csv rows [64]", 1, 1 << 20, 0},
        {"--threads", OPT_INT, &threads, "N", "threads [all]", 1, 4096, 0},
        {"--out", OPT_STR, &out, "PATH",
         "a U-Net: write the decoded mask (8-bit gray PNG, pixel = class id) to PATH; with "
         "several images PATH is a folder (made) that gets <image stem>.png each",
         0, 0, 0},
        {0},
    };
    enum { MAX_POS = 1 << 16 };
    const char **pos = cf_calloc(MAX_POS, sizeof *pos);
    if (!pos) return cli_error(CLI_FAIL, cmd, "out of memory");
    int n_pos;
    int rc = cli_parse(cmd, argc, argv, 2, opts, pos, MAX_POS, &n_pos);
    if (rc < 0) {
        predict_usage(stdout, opts);
        cf_free(pos);
        return CLI_OK;
    }
    if (rc == CLI_OK && n_pos < 1)
        rc = cli_error(CLI_USAGE, cmd, "expects a model file (see corefit predict --help)");
    if (rc == CLI_OK && csv && n_pos > 1)
        rc = cli_error(CLI_USAGE, cmd, "give image files or --csv, not both");
    if (rc == CLI_OK && !csv && n_pos < 2)
        rc = cli_error(CLI_USAGE, cmd, "expects image files after the model, or --csv FILE");
    if (rc) {
        cf_free(pos);
        return rc;
    }
    if (threads > 0) cf_set_num_threads(threads);
    if (cf_blas_reserve(cf_get_num_threads())) {
        cf_free(pos);
        return cli_lib_error(cmd, "BLAS");
    }
    cf_model_info m;
    if ((rc = read_model_meta(cmd, pos[0], &m))) {
        cf_free(pos);
        return rc;
    }
    bool tabular = strcmp(m.recipe.arch, "tabular") == 0;
    const bool unet = strncmp(m.recipe.arch, "unet-", 5) == 0; /* masks (seg.c) */
    if (tabular != (csv != NULL) || (out && !unet)) {
        cf_model_info_free(&m);
        cf_free(pos);
        return cli_error(CLI_USAGE, cmd,
                         out && !unet ? "--out writes the mask of a U-Net (trained with --masks)"
                         : tabular    ? "a tabular model predicts --csv rows"
                                      : "an image model predicts image files");
    }
    if (out && n_pos > 2 && cli_mkdirs(out)) {
        cf_model_info_free(&m);
        cf_free(pos);
        return cli_error(CLI_FAIL, cmd, "cannot create the --out folder %s: %s", out,
                         strerror(errno));
    }
    cf_dataset *ds = NULL;
    cf_status st = CF_OK;
    int64_t unseen = 0;
    int64_t *lines = NULL;
    if (tabular) {
        cf_csv_table *t = NULL;
        st = cf_csv_read(csv, ',', &t);
        if (st == CF_OK) st = cf_tabular_encode(&m, t, false, &ds, &unseen);
        warn_unseen(cmd, unseen, csv);
        if (st == CF_OK && (lines = cf_malloc((size_t)t->n_rows * sizeof *lines)))
            memcpy(lines, t->row_line, (size_t)t->n_rows * sizeof *lines);
        cf_csv_table_free(t);
    }
    if (st) {
        cf_model_info_free(&m);
        cf_free(pos);
        cf_free(lines);
        return cli_lib_error(cmd, "reading the inputs");
    }
    cf_learner *learn = NULL;
    cf_dls *dls = NULL;
    cf_preds p = {0};
    bool *failed = NULL; /* image files that could not be predicted (reported, left out) */
    int n_failed = 0;
    if (!tabular) {
        /* fastai's load_learner + predict, one image file at a time; a file that cannot be
         * read is reported and the others are still predicted */
        /* a U-Net's output: a probability for every class at every pixel */
        int n = n_pos - 1, c = m.recipe.n_out * (unet ? m.height * m.width : 1);
        st = cf_load_learner(pos[0], &learn);
        if (st == CF_OK && (!(p.preds.data = cf_malloc((size_t)n * c * sizeof(float))) ||
                            !(failed = cf_calloc((size_t)n, sizeof *failed))))
            st = CF_ERR_NOMEM;
        for (int i = 0; i < n && st == CF_OK; i++) {
            cf_status fst =
                cf_predict_image_file(learn, pos[1 + i], p.preds.data + (size_t)i * c, NULL);
            if (fst == CF_ERR_NOMEM)
                st = fst;
            else if (fst) {
                cli_error(CLI_FAIL, cmd, "%s", cf_last_error());
                failed[i] = true;
                n_failed++;
            }
        }
        p.n = n;
        p.preds.shape = cf_shape2(n, c);
    } else {
        st = cli_load_learner(pos[0], &m, ds, bs, &learn, &dls);
        if (st == CF_OK) st = cf_get_preds(learn, &p);
    }
    if (st) {
        cf_free(failed);
        cf_preds_free(&p);
        cf_learner_free(learn);
        cf_dls_free(dls);
        cf_model_info_free(&m);
        cf_free(pos);
        cf_free(lines);
        return cli_lib_error(cmd, "predicting");
    }
    int c = p.preds.shape.ndim > 1 ? p.preds.shape.dim[1] : 1;
    bool classes = !m.regression && m.n_vocab == c;
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    for (int64_t i = 0; i < p.n; i++) {
        if (failed && failed[i]) continue;
        const float *row = p.preds.data + i * c;
        char name[64];
        const char *input = name;
        if (tabular)
            snprintf(name, sizeof name, "row %lld (line %lld)", (long long)i + 1,
                     (long long)(lines ? lines[i] : i + 2));
        else
            input = pos[1 + i];
        int best = 0;
        for (int k = 1; k < c; k++)
            if (row[k] > row[best]) best = k;
        if (unet) {
            char mask_path[4200];
            const char *name = strrchr(input, '/') ? strrchr(input, '/') + 1 : input;
            const char *dot = strrchr(name, '.');
            snprintf(mask_path, sizeof mask_path, "%s/%.*s.png", out ? out : ".",
                     dot ? (int)(dot - name) : (int)strlen(name), name);
            int seg_rc = CLI_OK;
            cli_seg_predict(cmd, &m, input, row,
                            !out        ? NULL
                            : n_pos > 2 ? mask_path
                                        : out,
                            arr, &seg_rc);
            if (seg_rc) n_failed++;
            continue;
        }
        if (!tabular && cli_task_print(learn, &m, input, row, arr)) continue;
        if (json) {
            cJSON *o = cJSON_CreateObject();
            if (tabular)
                cJSON_AddNumberToObject(o, "row", (double)i);
            else
                cJSON_AddStringToObject(o, "input", input);
            if (classes) {
                cJSON_AddStringToObject(o, "class", m.vocab[best]);
                cJSON_AddNumberToObject(o, "index", best);
                cJSON_AddNumberToObject(o, "probability", row[best]);
                cJSON *pr = cJSON_AddObjectToObject(o, "probabilities");
                for (int k = 0; k < c; k++) cJSON_AddNumberToObject(pr, m.vocab[k], row[k]);
            } else {
                cJSON *v = cJSON_AddArrayToObject(o, "prediction");
                for (int k = 0; k < c; k++) cJSON_AddItemToArray(v, cJSON_CreateNumber(row[k]));
            }
            cJSON_AddItemToArray(arr, o);
        } else if (classes) {
            cli_print_tsv_field(input);
            putchar('\t');
            cli_print_tsv_field(m.vocab[best]);
            printf("\t%.6f", row[best]);
            /* the next most likely classes */
            bool *used = cf_calloc((size_t)c, sizeof(bool));
            if (used) used[best] = true;
            for (int t = 1; used && t < top && t < c; t++) {
                int b = -1;
                for (int k = 0; k < c; k++)
                    if (!used[k] && (b < 0 || row[k] > row[b])) b = k;
                used[b] = true;
                putchar('\t');
                cli_print_tsv_field(m.vocab[b]);
                printf("\t%.6f", row[b]);
            }
            cf_free(used);
            printf("\n");
        } else {
            cli_print_tsv_field(input);
            for (int k = 0; k < c; k++) printf("\t%.6g", row[k]);
            printf("\n");
        }
    }
    if (json) {
        char *s = cJSON_Print(arr);
        if (s) printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(arr);
    }
    cf_preds_free(&p);
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_model_info_free(&m);
    cf_free(pos);
    cf_free(lines);
    cf_free(failed);
    if (n_failed > 0) {
        fflush(stdout);
        return cli_error(CLI_FAIL, cmd, "%d of %d image files could not be predicted (above)",
                         n_failed, n_pos - 1);
    }
    return CLI_OK;
}
