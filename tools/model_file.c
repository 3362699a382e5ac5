/* Model files (cf_learner_export's, with the metadata documented with cf_model_info in
 * corefit/learn.h and in docs/cli.md): rebuilding a learner from one, and `corefit info`.
 */
#include "corefit.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- rebuilding a learner ------------------------------------------------------------------ */

cf_status cli_load_learner(const char *path, const cf_model_info *m, cf_dataset *ds, int bs,
                           cf_learner **learn, cf_dls **dls) {
    *learn = NULL;
    *dls = NULL;
    cf_dataset *first = NULL;
    int64_t zero = 0;
    cf_status st = cf_dataset_subset(ds, &zero, 1, &first);
    if (st) {
        cf_dataset_free(ds);
        return st;
    }
    cf_dls_options o = {.bs = bs > 0 ? bs : 64, .prefetch = -1, .n_norm = m->n_norm};
    memcpy(o.mean, m->mean, sizeof o.mean);
    memcpy(o.std, m->std, sizeof o.std);
    if ((st = cf_dls_new(first, ds, &o, dls))) return st;
    cf_metric *metrics[2] = {NULL};
    int n_metrics = 0;
    const bool values = m->regression || m->recipe.n_points > 0 ||
                        (m->n_vocab == 0 && strcmp(m->recipe.arch, "tabular") != 0 &&
                         strcmp(m->input, "images-csv") == 0);
    if (strncmp(m->recipe.arch, "unet-", 5) == 0) { /* train --masks' metrics */
        metrics[n_metrics++] = cf_foreground_acc(0);
        metrics[n_metrics++] = cf_dice_multi(m->recipe.n_out);
    } else if (m->recipe.multi_label)
        metrics[n_metrics++] = cf_accuracy_multi(0.5f, false);
    else if (!values && m->recipe.n_out > 1)
        metrics[n_metrics++] = cf_accuracy();
    if (values) { /* valid_loss is the MSE; these are in the target's own units */
        metrics[n_metrics++] = cf_mae();
        metrics[n_metrics++] = cf_rmse();
    }
    st = cf_learner_from_info(m, *dls, metrics, n_metrics, learn);
    if (st == CF_OK) st = cf_model_load((*learn)->model, NULL, path);
    if (st) {
        cf_learner_free(*learn);
        cf_dls_free(*dls);
        *learn = NULL;
        *dls = NULL;
    }
    return st;
}

/* ---- corefit info -------------------------------------------------------------------------- */

static void info_usage(FILE *f, const cli_opt *opts) {
    fprintf(f, "Usage: corefit info [options] MODEL.safetensors\n\n"
               "Shows what a model file holds: architecture, inputs, classes, normalisation,\n"
               "tabular columns, tensors and parameter count.\n\nOptions:\n");
    cli_print_options(f, opts);
}

int cmd_info(int argc, char **argv) {
    bool json = false, tensors = false;
    cli_opt opts[] = {
        {"--json", OPT_FLAG, &json, NULL, "print the metadata and tensors as JSON", 0, 0, 0},
        {"--tensors", OPT_FLAG, &tensors, NULL, "list every tensor with its shape", 0, 0, 0},
        {0},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse("info", argc, argv, 2, opts, pos, 1, &n_pos);
    if (rc < 0) {
        info_usage(stdout, opts);
        return CLI_OK;
    }
    if (rc) return rc;
    if (n_pos != 1)
        return cli_error(CLI_USAGE, "info", "expects one model file (see corefit info --help)");
    cf_st_file *f = NULL;
    if (cf_st_read(pos[0], &f)) return cli_lib_error("info", "reading the model");
    size_t n_params = 0, n_floats = 0;
    for (int i = 0; i < f->n_entries; i++) {
        n_floats += f->entries[i].numel;
        if (!strstr(f->entries[i].name, "running_") && !strstr(f->entries[i].name, "num_batches") &&
            strncmp(f->entries[i].name, "opt.", 4) != 0)
            n_params += f->entries[i].numel;
    }
    cf_model_info m;
    cf_status mst = cf_model_info_from_file(f, pos[0], &m);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "file", pos[0]);
        cJSON_AddNumberToObject(j, "tensors", f->n_entries);
        cJSON_AddNumberToObject(j, "parameters", (double)n_params);
        cJSON *meta = cJSON_AddObjectToObject(j, "metadata");
        for (int i = 0; i < f->n_meta; i++)
            cJSON_AddStringToObject(meta, f->meta_keys[i], f->meta_values[i]);
        if (tensors) {
            cJSON *t = cJSON_AddObjectToObject(j, "shapes");
            for (int i = 0; i < f->n_entries; i++) {
                const cf_st_entry *e = &f->entries[i];
                cJSON *s = cJSON_CreateArray();
                for (int d = 0; d < e->shape.ndim; d++)
                    cJSON_AddItemToArray(s, cJSON_CreateNumber(e->shape.dim[d]));
                cJSON_AddItemToObject(t, e->name, s);
            }
        }
        char *s = cJSON_Print(j);
        if (s) printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(j);
    } else {
        printf("file:        %s\n", pos[0]);
        if (mst == CF_OK) {
            printf("arch:        %s\n", m.recipe.arch);
            printf("trained on:  %s\n", m.input[0] ? m.input : "?");
            if (m.height > 0)
                printf("input:       %d x %d x %d (channels x height x width)\n", m.n_in, m.height,
                       m.width);
            else if (m.text_vocab) {
                printf("input:       text, a vocabulary of %d tokens (", m.n_text_vocab);
                for (int i = 9; i < m.n_text_vocab && i < 19; i++)
                    printf("%s%s", i > 9 ? " " : "", m.text_vocab[i]);
                printf("%s)\n", m.n_text_vocab > 19 ? " ..." : "");
                printf("AWD-LSTM:    emb_sz %d, n_hid %d, %d layers\n", m.emb_sz, m.n_hid,
                       m.n_layers);
                if (strcmp(m.recipe.arch, "awd_lstm_clas") == 0) {
                    printf("classifier:  seq_len %d, max_len %d, head", m.recipe.text_seq_len,
                           m.recipe.text_max_len);
                    for (int i = 0; i < m.recipe.n_lin_ftrs; i++)
                        printf(" %d", m.recipe.lin_ftrs[i]);
                    printf("\n");
                }
                char *tok = NULL;
                if (cf_text_tok_options_to_json(&m.tok, &tok) == CF_OK)
                    printf("tokenizer:   %s\n", tok);
                cf_free(tok);
            } else
                printf("input:       %d features (%d categorical, %d continuous)\n", m.n_in,
                       m.n_cat, m.n_cont);
            printf("outputs:     %d\n", m.recipe.n_out);
            if (m.recipe.multi_label)
                printf("targets:     label sets (multi-label; BCE, threshold 0.5)\n");
            if (strncmp(m.recipe.arch, "unet-", 5) == 0) /* train --masks */
                printf("targets:     masks of %d x %d class ids (segmentation: a U-Net on %s, "
                       "CrossEntropyLossFlat over pixels; the classes are its codes)\n",
                       m.height, m.width, m.recipe.arch + 5);
            if (strncmp(m.recipe.arch, "unet-", 5) == 0) { /* DynamicUnet's options */
                const cf_unet_opts *u = &m.recipe.unet;
                char yr[64] = "None";
                if (u->y_range)
                    snprintf(yr, sizeof yr, "(%g, %g)", (double)u->y_lo, (double)u->y_hi);
                printf("unet:        blur=%s, blur_final=%s, self_attention=%s, y_range=%s, "
                       "last_cross=%s, bottle=%s, norm_type=None, act_cls=ReLU\n",
                       u->blur ? "True" : "False", u->blur_final ? "True" : "False",
                       u->self_attention ? "True" : "False", yr, u->last_cross ? "True" : "False",
                       u->bottle ? "True" : "False");
            }
            if (m.recipe.n_points > 0)
                printf("targets:     %d point%s (x, y scaled to -1..1)\n", m.recipe.n_points,
                       m.recipe.n_points == 1 ? "" : "s");
            if (m.recipe.y_range)
                printf("y_range:     [%g, %g]\n", (double)m.recipe.y_lo, (double)m.recipe.y_hi);
            if (m.n_vocab) {
                printf("classes:    ");
                for (int i = 0; i < m.n_vocab; i++)
                    printf(" %s%s", m.vocab[i], i + 1 < m.n_vocab ? "," : "");
                printf("\n");
            }
            if (m.n_norm) {
                printf("normalize:   mean");
                for (int i = 0; i < m.n_norm; i++) printf(" %.6g", m.mean[i]);
                printf(", std");
                for (int i = 0; i < m.n_norm; i++) printf(" %.6g", m.std[i]);
                printf("\n");
            }
            if (m.feature_names) {
                printf("target:      %s (%s)\n", m.target, m.regression ? "regression" : "classes");
                for (int i = 0; i < m.n_cat; i++)
                    printf("categorical: %s (%d categories%s%s)\n", m.feature_names[i],
                           m.cat_cardinality[i], m.flag_of[i] ? ", missing-value flag of " : "",
                           m.flag_of[i] ? m.flag_of[i] : "");
                for (int j = 0; j < m.n_cont; j++)
                    printf("continuous:  %s (mean %.6g, std %.6g, fill %.6g)\n",
                           m.feature_names[m.n_cat + j], m.cont_mean[j], m.cont_std[j],
                           m.cont_fill[j]);
            }
        } else {
            printf("metadata:    not a corefit train file (%s)\n", cf_last_error());
        }
        printf("tensors:     %d (%zu values)\n", f->n_entries, n_floats);
        printf("parameters:  %zu trainable\n", n_params);
        if (tensors)
            for (int i = 0; i < f->n_entries; i++) {
                char b[96];
                printf("  %-40s %s\n", f->entries[i].name,
                       f->entries[i].shape.ndim ? cf_shape_str(&f->entries[i].shape, b, sizeof b)
                                                : "()");
            }
    }
    if (mst == CF_OK) cf_model_info_free(&m);
    cf_st_free(f);
    return CLI_OK;
}
