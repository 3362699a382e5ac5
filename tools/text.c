/* corefit's text commands: `train --text` (a language model with --lm, or a ULMFiT classifier,
 * optionally from a language model's encoder and with gradual unfreezing), `predict --text`
 * and `generate`. */
#include "corefit.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool cli_argv_has(int argc, char **argv, const char *name) {
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return true;
    return false;
}

bool cli_is_text_model(int argc, char **argv) {
    if (argc < 3 || argv[2][0] == '-') return false;
    cf_model_info m;
    if (cf_model_info_read(argv[2], &m)) return false; /* the command reports it */
    const bool text = strcmp(m.input, "text") == 0;
    cf_model_info_free(&m);
    return text;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

/* ---- train --text --------------------------------------------------------------------------- */

typedef struct text_train_args {
    const char *text, *text_col, *label_col, *valid_col, *encoder, *schedule, *out, *plots;
    bool lm, bf16;
    int epochs, bs, seq_len, cores, min_freq, max_vocab, emb_sz, n_hid, n_layers;
    double lr, valid_pct, drop_mult, wd;
    uint64_t seed;
} text_train_args;

static void text_train_usage(FILE *f, const cli_opt *opts) {
    fprintf(f, "Usage: corefit train --text DIR|FILE.csv [options]\n"
               "\n"
               "fastai's text application: a language model (--lm) or a ULMFiT classifier on a\n"
               "folder (DIR/train/<label>/*.txt, DIR/valid/<label>/*.txt) or a CSV file, with\n"
               "fastai's tokenizer (tokenized copies cached in DIR_tok) and vocabulary. The model\n"
               "file carries the vocabulary and tokenizer: `corefit predict MODEL --text ...` and\n"
               "`corefit generate MODEL PROMPT` read it.\n\nOptions:\n");
    cli_print_options(f, opts);
}

/* The classifier starts from the language model exported to path: its vocabulary (so the ids
 * mean the same words), its sizes, and its encoder's weights. */
static int load_lm_info(const char *cmd, const char *path, cf_model_info *lm) {
    if (cf_model_info_read(path, lm)) return cli_lib_error(cmd, "reading --encoder");
    if (strcmp(lm->recipe.arch, "awd_lstm_lm") != 0) {
        cf_model_info_free(lm);
        return cli_error(CLI_USAGE, cmd,
                         "--encoder %s: not a language model (arch %s); give the model file "
                         "`corefit train --text DIR --lm` wrote",
                         path, lm->recipe.arch);
    }
    return CLI_OK;
}

/* The language model's encoder into the classifier (save_encoder / load_encoder through a
 * temporary file beside the output), which freezes the classifier. */
static int transfer_encoder(const char *cmd, const char *lm_path, const char *out,
                            cf_learner *clas) {
    cf_learner *lm = NULL;
    if (cf_load_learner(lm_path, &lm)) return cli_lib_error(cmd, "loading --encoder");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.encoder-%ld.safetensors", out, (long)getpid());
    int rc = CLI_OK;
    if (cf_learner_save_encoder(lm, tmp))
        rc = cli_lib_error(cmd, "writing the encoder");
    else if (cf_learner_load_encoder(clas, tmp))
        rc = cli_lib_error(cmd, "loading the encoder");
    unlink(tmp);
    cf_learner_free(lm);
    return rc;
}

static int fit_stage(const char *cmd, cf_learner *learn, const text_train_args *a, int epochs,
                     cf_lr lr) {
    cf_status st = cf_par_fit_one_cycle(learn, epochs, .lr_max = lr, .par.num_cores = a->cores,
                                        .par.split_batch = true);
    if (st == CF_ERR_INTERRUPTED) return cli_error(CLI_INTERRUPTED, cmd, "stopped");
    return st ? cli_lib_error(cmd, "fit") : CLI_OK;
}

/* fastai's ULMFiT recipe, step 3: one epoch frozen, then the last two and three parameter groups,
 * then everything, each with discriminative rates slice(lr / 2.6^4, lr) and lr halved, halved
 * and divided by 5 (2e-2, 1e-2, 5e-3, 1e-3 in the tutorial). */
static int ulmfit_schedule(const char *cmd, cf_learner *learn, const text_train_args *a) {
    const double k = pow(2.6, 4);
    const int groups = learn->model->n_groups;
    int rc = fit_stage(cmd, learn, a, 1, CF_LR(a->lr));
    if (!rc && cf_learner_freeze_to(learn, groups - 2)) rc = cli_lib_error(cmd, "freeze_to(-2)");
    if (!rc) rc = fit_stage(cmd, learn, a, 1, CF_SLICE2(a->lr / 2 / k, a->lr / 2));
    if (!rc && cf_learner_freeze_to(learn, groups - 3)) rc = cli_lib_error(cmd, "freeze_to(-3)");
    if (!rc) rc = fit_stage(cmd, learn, a, 1, CF_SLICE2(a->lr / 4 / k, a->lr / 4));
    if (!rc && cf_learner_unfreeze(learn)) rc = cli_lib_error(cmd, "unfreeze");
    if (!rc) rc = fit_stage(cmd, learn, a, a->epochs, CF_SLICE2(a->lr / 20 / k, a->lr / 20));
    return rc;
}

/* --plots DIR: fastai's show_batch of the first training batch as DIR/show_batch.png. */
static int write_show_batch(const char *cmd, cf_dls *dls, const char *dir) {
    if (mkdir(dir, 0777) && errno != EEXIST)
        return cli_error(CLI_FAIL, cmd, "cannot create --plots folder %s: %s", dir,
                         strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/show_batch.png", dir);
    const cf_batch *b = NULL;
    if (cf_dataloader_begin_epoch(dls->train, 0) || cf_dataloader_next(dls->train, &b) ||
        cf_plot_show_batch_text(dls->train, b, dls->text_nz, path, NULL))
        return cli_lib_error(cmd, "--plots");
    printf("wrote %s\n", path);
    return CLI_OK;
}

/* A table of the learner's (show_results, top losses) into dir/name. */
static int write_table(const char *cmd, cf_learner *learn, const char *dir, const char *name,
                       cf_status (*table)(cf_learner *, int, int, FILE *)) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return cli_error(CLI_FAIL, cmd, "--plots: cannot write %s: %s", path, strerror(errno));
    cf_status st = table(learn, 9, 0, f);
    if (fclose(f) && st == CF_OK) st = cf_fail(CF_ERR_IO, "%s: %s", path, strerror(errno));
    if (st) return cli_lib_error(cmd, "--plots");
    printf("wrote %s\n", path);
    return CLI_OK;
}

/* --plots DIR after the fit: the loss and the schedule; for a classifier the confusion matrix
 * of the validation texts, fastai's show_results and its top losses with the texts. */
static int write_fit_figures(const char *cmd, cf_learner *learn, const char *dir, bool lm) {
    char path[4096];
    snprintf(path, sizeof path, "%s/loss.png", dir);
    if (cf_learner_plot_loss(learn, path, &(cf_plot_loss_opts){.skip_start = -1}))
        return cli_lib_error(cmd, "--plots");
    printf("wrote %s\n", path);
    snprintf(path, sizeof path, "%s/schedule.png", dir);
    if (cf_learner_plot_sched(learn, path)) return cli_lib_error(cmd, "--plots");
    printf("wrote %s\n", path);
    if (lm) return CLI_OK;
    cf_preds p = {0};
    const int k = learn->recipe.n_out;
    int64_t *counts = cf_calloc((size_t)k * k, sizeof *counts);
    snprintf(path, sizeof path, "%s/confusion_matrix.png", dir);
    cf_status st = counts ? cf_get_preds(learn, &p, .with_decoded = true) : CF_ERR_NOMEM;
    if (st == CF_OK) st = cf_confusion_from_preds(&p, k, counts);
    if (st == CF_OK)
        st = cf_plot_confusion_matrix(counts, k, learn->dls->train_ds->vocab, path, false);
    cf_preds_free(&p);
    cf_free(counts);
    if (st) return cli_lib_error(cmd, "--plots");
    printf("wrote %s\n", path);
    int rc = write_table(cmd, learn, dir, "show_results.txt", cf_text_show_results);
    if (!rc) rc = write_table(cmd, learn, dir, "top_losses.txt", cf_text_top_losses);
    return rc;
}

int cmd_train_text(int argc, char **argv) {
    const char *cmd = "train";
    text_train_args a = {.text_col = "text",
                         .label_col = "label",
                         .schedule = "one-cycle",
                         .out = "model.safetensors",
                         .epochs = 0,
                         .bs = 64,
                         .seq_len = 72,
                         .min_freq = 3,
                         .max_vocab = 60000,
                         .lr = 0,
                         .valid_pct = 0.2,
                         .drop_mult = 0,
                         .seed = 42};
    cli_opt opts[] = {
        {"--text", OPT_STR, &a.text, "DIR|FILE.csv",
         "texts: a folder train/<label>/*.txt, valid/<label>/*.txt, or a CSV file", 0, 0, 0},
        {"--lm", OPT_FLAG, &a.lm, NULL, "train a language model (labels are not needed)", 0, 0, 0},
        {"--text-col", OPT_STR, &a.text_col, "NAME", "CSV: the text column [text]", 0, 0, 0},
        {"--label-col", OPT_STR, &a.label_col, "NAME", "CSV: the label column [label]", 0, 0, 0},
        {"--valid-col", OPT_STR, &a.valid_col, "NAME",
         "CSV: a boolean column marking validation rows [random --valid-pct]", 0, 0, 0},
        {"--valid-pct", OPT_DOUBLE, &a.valid_pct, "X", "CSV: validation share [0.2]", 0, 0.99, 0},
        {"--encoder", OPT_STR, &a.encoder, "FILE",
         "classifier: start from this language model (a `train --text --lm` model file): its "
         "vocabulary, sizes and encoder; the classifier starts frozen",
         0, 0, 0},
        {"--schedule", OPT_STR, &a.schedule, "NAME",
         "one-cycle, or ulmfit (classifier: gradual unfreezing, fastai's recipe; --epochs is the "
         "last, unfrozen stage) [one-cycle]",
         0, 0, 0},
        {"--epochs", OPT_INT, &a.epochs, "N", "epochs [1; ulmfit: 2 unfrozen]", 1, 100000, 0},
        {"--lr", OPT_DOUBLE, &a.lr, "X", "learning rate [LM 1e-2, classifier 2e-2]", 1e-9, 10, 0},
        {"--wd", OPT_DOUBLE, &a.wd, "X", "weight decay [0.01]", 0, 10, 0},
        {"--bs", OPT_INT, &a.bs, "N", "batch size [64]", 1, 1 << 20, 0},
        {"--seq-len", OPT_INT, &a.seq_len, "N", "sequence length (BPTT) [72]", 2, 1 << 16, 0},
        {"--drop-mult", OPT_DOUBLE, &a.drop_mult, "X",
         "scales every dropout [LM 1, classifier 0.5]", 0, 10, 0},
        {"--min-freq", OPT_INT, &a.min_freq, "N", "vocabulary: least count of a word [3]", 1,
         1 << 30, 0},
        {"--max-vocab", OPT_INT, &a.max_vocab, "N", "vocabulary: most words [60000]", 9, 1 << 24,
         0},
        {"--emb-sz", OPT_INT, &a.emb_sz, "N", "AWD-LSTM embedding size [400]", 1, 1 << 16, 0},
        {"--n-hid", OPT_INT, &a.n_hid, "N", "AWD-LSTM hidden size [1152]", 1, 1 << 16, 0},
        {"--n-layers", OPT_INT, &a.n_layers, "N", "AWD-LSTM layers [3]", 1, 64, 0},
        {"--cores", OPT_INT, &a.cores, "N", "worker processes [every core]", 1, 4096, 0},
        {"--seed", OPT_U64, &a.seed, "N", "random seed [42]", 0, -1, 0},
        {"--out", OPT_STR, &a.out, "FILE", "the model file [model.safetensors]", 0, 0, 0},
        {"--plots", OPT_STR, &a.plots, "DIR",
         "write DIR/show_batch.png (the first training batch as fastai's show_batch) and, after "
         "the fit, DIR/loss.png and schedule.png; a classifier also DIR/confusion_matrix.png, "
         "show_results.txt and top_losses.txt (the validation texts with target and prediction)",
         0, 0, 0},
        {"--bf16", OPT_FLAG, &a.bf16, NULL,
         "fastai's to_fp16 in bfloat16: the LSTMs' sequence products and the decoder/head in bf16 "
         "with fp32 sums, weights fp32 (where the CPU has bf16 kernels; elsewhere fp32, said "
         "once); the saved model is fp32",
         0, 0, 0},
        {0},
    };
    const char *pos[1];
    int n_pos;
    bool help;
    int rc = cli_parse_or_usage(cmd, argc, argv, opts, pos, 0, &n_pos, text_train_usage, &help);
    if (rc || help) return rc;
    const bool ulmfit = strcmp(a.schedule, "ulmfit") == 0;
    if (!ulmfit && strcmp(a.schedule, "one-cycle") != 0)
        return cli_error(CLI_USAGE, cmd, "--schedule %s: text models take one-cycle or ulmfit",
                         a.schedule);
    if (a.lm && (ulmfit || a.encoder))
        return cli_error(CLI_USAGE, cmd,
                         "--lm trains a language model: --schedule ulmfit and "
                         "--encoder are for classifiers");
    if (!a.epochs) a.epochs = ulmfit ? 2 : 1;
    if (!a.lr) a.lr = a.lm ? 1e-2 : 2e-2;

    cf_model_info lm_info = {0};
    if (a.encoder && (rc = load_lm_info(cmd, a.encoder, &lm_info))) return rc;
    cf_text_vocab *given = NULL;
    if (a.encoder && cf_text_vocab_from_words((const char *const *)lm_info.text_vocab,
                                              lm_info.n_text_vocab, &given)) {
        cf_model_info_free(&lm_info);
        return cli_lib_error(cmd, "the language model's vocabulary");
    }
    cf_text_loaders_options lo = {
        .dls = {.bs = a.bs, .seq_len = a.seq_len, .seed = a.seed, .is_lm = a.lm},
        .tok = a.encoder ? lm_info.tok : (cf_text_tok_options){0},
        .vocab = {.min_freq = a.min_freq, .max_vocab = a.max_vocab},
        .text_vocab = given};
    cf_dls *dls = NULL;
    cf_status st;
    if (ends_with(a.text, ".csv")) {
        const char *labels[1] = {a.label_col};
        cf_text_csv_options co = {.text_col = a.text_col,
                                  .label_cols = labels,
                                  .n_label_cols = 1,
                                  .valid_col = a.valid_col,
                                  .valid_pct = a.valid_pct,
                                  .seed = a.seed};
        st = cf_text_dls_from_csv(a.text, &co, &lo, &dls);
    } else {
        st = cf_text_dls_from_folder(a.text, NULL, &lo, &dls);
    }
    cf_text_vocab_free(given);
    if (st) {
        cf_model_info_free(&lm_info);
        return cli_lib_error(cmd, "reading the texts");
    }
    if (!dls->valid) {
        cf_dls_free(dls);
        cf_model_info_free(&lm_info);
        return cli_error(CLI_FAIL, cmd,
                         "%s: no validation texts (a valid/ folder, --valid-col or "
                         "--valid-pct)",
                         a.text);
    }
    if (a.plots && (rc = write_show_batch(cmd, dls, a.plots))) {
        cf_dls_free(dls);
        cf_model_info_free(&lm_info);
        return rc;
    }
    cf_awd_lstm_config cfg = a.lm ? cf_awd_lstm_lm_config() : cf_awd_lstm_clas_config();
    if (a.encoder) { /* the encoder's sizes */
        cfg.emb_sz = lm_info.emb_sz;
        cfg.n_hid = lm_info.n_hid;
        cfg.n_layers = lm_info.n_layers;
    } else {
        if (a.emb_sz) cfg.emb_sz = a.emb_sz;
        if (a.n_hid) cfg.n_hid = a.n_hid;
        if (a.n_layers) cfg.n_layers = a.n_layers;
    }
    cf_model_info_free(&lm_info);
    cf_metric *metrics[2] = {cf_accuracy(), a.lm ? cf_perplexity() : NULL};
    cf_learner *learn = NULL;
    if (a.lm)
        st = cf_language_model_learner(&learn, dls, .config = &cfg, .drop_mult = (float)a.drop_mult,
                                       .metrics = metrics, .n_metrics = 2, .seed = a.seed,
                                       .wd = a.wd);
    else
        st = cf_text_classifier_learner(
            &learn, dls, .config = &cfg, .drop_mult = (float)a.drop_mult, .seq_len = a.seq_len,
            .metrics = metrics, .n_metrics = 1, .seed = a.seed, .wd = a.wd);
    if (st) {
        cf_dls_free(dls);
        return cli_lib_error(cmd, "making the learner");
    }
    if (a.bf16 && cf_learner_to_bf16(learn)) rc = cli_lib_error(cmd, "--bf16");
    if (!rc && a.encoder) rc = transfer_encoder(cmd, a.encoder, a.out, learn);
    if (!rc)
        rc = ulmfit ? ulmfit_schedule(cmd, learn, &a)
                    : fit_stage(cmd, learn, &a, a.epochs, CF_LR(a.lr));
    if (!rc && cf_learner_export(learn, a.out)) rc = cli_lib_error(cmd, "saving the model");
    if (!rc && a.plots) rc = write_fit_figures(cmd, learn, a.plots, a.lm);
    if (!rc) {
        printf("saved %s (%s, %lld words", a.out, a.lm ? "language model" : "text classifier",
               (long long)cf_text_vocab_len(cf_text_numericalizer_vocab(dls->text_nz)));
        if (!a.lm) printf(", %d classes", dls->train_ds->n_classes);
        printf(")\n");
    }
    cf_learner_free(learn);
    cf_dls_free(dls);
    return rc;
}

/* ---- predict --text ------------------------------------------------------------------------ */

static char *read_text_file(const char *cmd, const char *path) {
    void *buf = NULL;
    size_t len = 0;
    if (cf_read_file(path, (size_t)64 << 20, &buf, &len)) {
        cli_lib_error(cmd, path);
        return NULL;
    }
    char *s = cf_malloc(len + 1);
    if (s) {
        memcpy(s, buf, len);
        s[len] = 0;
    }
    cf_free(buf);
    return s;
}

static void text_predict_usage(FILE *f, const cli_opt *opts) {
    fprintf(f, "Usage: corefit predict MODEL --text \"TEXT\" | MODEL FILE.txt...\n"
               "\nA text classifier's class and probabilities for raw text, tokenized as its\n"
               "training texts were. Positional files after MODEL are read as texts.\n\n");
    cli_print_options(f, opts);
}

int cmd_predict_text(int argc, char **argv) {
    const char *cmd = "predict";
    const char *text = NULL;
    bool json = false;
    int top = 1;
    cli_opt opts[] = {
        {"--text", OPT_STR, &text, "TEXT", "a text to classify", 0, 0, 0},
        {"--json", OPT_FLAG, &json, NULL, "print JSON with every probability", 0, 0, 0},
        {"--top", OPT_INT, &top, "K", "the K most likely classes [1]", 1, 1000, 0},
        {0},
    };
    enum { MAX_POS = 1 << 12 };
    const char *pos[MAX_POS];
    int n_pos;
    bool help;
    int rc =
        cli_parse_or_usage(cmd, argc, argv, opts, pos, MAX_POS, &n_pos, text_predict_usage, &help);
    if (rc || help) return rc;
    if (n_pos < 1 || (!text && n_pos < 2))
        return cli_error(CLI_USAGE, cmd, "expects MODEL --text \"...\" or MODEL FILE.txt...");
    cf_learner *learn = NULL;
    if (cf_load_learner(pos[0], &learn)) return cli_lib_error(cmd, "loading the model");
    if (strcmp(learn->recipe.arch, "awd_lstm_clas") != 0) {
        char arch[sizeof learn->recipe.arch];
        snprintf(arch, sizeof arch, "%s", learn->recipe.arch); /* the learner is freed first */
        cf_learner_free(learn);
        return cli_error(CLI_USAGE, cmd,
                         "%s is not a text classifier (arch %s); a language model generates: "
                         "corefit generate %s \"prompt\"",
                         pos[0], arch, pos[0]);
    }
    const int k = learn->recipe.n_out;
    char *const *classes = learn->dls->train_ds->vocab;
    float *probs = cf_malloc((size_t)k * sizeof(float));
    int n_texts = text ? 1 : n_pos - 1;
    if (json) printf("[");
    for (int t = 0; t < n_texts && !rc && probs; t++) {
        const char *name = text ? "--text" : pos[1 + t];
        char *owned = text ? NULL : read_text_file(cmd, name);
        const char *s = text ? text : owned;
        if (!s) {
            rc = CLI_FAIL;
            break;
        }
        int best = 0;
        int64_t unknown = 0;
        if (cf_predict_text(learn, s, probs, &best, &unknown)) {
            rc = cli_lib_error(cmd, name);
        } else if (json) {
            printf(
                "%s{\"input\": \"%s\", \"class\": \"%s\", \"index\": %d, \"unknown_tokens\": %lld, "
                "\"probs\": [",
                t ? ", " : "", text ? "--text" : name, classes[best], best, (long long)unknown);
            for (int j = 0; j < k; j++) printf("%s%.6g", j ? ", " : "", probs[j]);
            printf("]}");
        } else {
            printf("%s: %s (%.4f)", name, classes[best], probs[best]);
            for (int r = 1; r < top && r < k; r++) { /* the next most likely */
                int next = -1;
                for (int j = 0; j < k; j++) {
                    int rank = 0;
                    for (int i = 0; i < k; i++) rank += probs[i] > probs[j];
                    if (rank == r) next = j;
                }
                if (next >= 0) printf(", %s (%.4f)", classes[next], probs[next]);
            }
            printf("\n");
            if (unknown > 0)
                fprintf(stderr, "corefit %s: %s: %lld token%s not in the vocabulary (xxunk)\n", cmd,
                        name, (long long)unknown, unknown == 1 ? "" : "s");
        }
        cf_free(owned);
    }
    if (json) printf("]\n");
    if (!probs) rc = cli_error(CLI_FAIL, cmd, "out of memory");
    cf_free(probs);
    cf_learner_free(learn);
    return rc;
}

/* ---- generate ------------------------------------------------------------------------------- */

static void generate_usage(FILE *f, const cli_opt *opts) {
    fprintf(f, "Usage: corefit generate MODEL \"PROMPT\" [options]\n"
               "\nfastai's LMLearner.predict: the prompt tokenized as the language model's\n"
               "texts were, N words drawn one at a time, the whole text printed with the\n"
               "special tokens decoded (xxmaj, xxup, xxrep, xxwrep).\n\n");
    cli_print_options(f, opts);
}

int cmd_generate(int argc, char **argv) {
    const char *cmd = "generate";
    int words = 20;
    double temperature = 1.0, min_p = 0;
    uint64_t seed = 0;
    bool allow_unk = false;
    cli_opt opts[] = {
        {"--words", OPT_INT, &words, "N", "words to generate [20]", 1, 1 << 20, 0},
        {"--temperature", OPT_DOUBLE, &temperature, "T",
         "sampling temperature (low: likelier words) [1]", 1e-6, 1e6, 0},
        {"--min-p", OPT_DOUBLE, &min_p, "P", "leave out words below this probability [none]", 0, 1,
         0},
        {"--allow-unk", OPT_FLAG, &allow_unk, NULL, "let xxunk be drawn (fastai's no_unk=False)", 0,
         0, 0},
        {"--seed", OPT_U64, &seed, "N", "random seed of the draws [0]", 0, -1, 0},
        {0},
    };
    const char *pos[2];
    int n_pos;
    bool help;
    int rc = cli_parse_or_usage(cmd, argc, argv, opts, pos, 2, &n_pos, generate_usage, &help);
    if (rc || help) return rc;
    if (n_pos != 2) return cli_error(CLI_USAGE, cmd, "expects MODEL \"PROMPT\"");
    cf_learner *learn = NULL;
    if (cf_load_learner(pos[0], &learn)) return cli_lib_error(cmd, "loading the model");
    if (strcmp(learn->recipe.arch, "awd_lstm_lm") != 0) {
        char arch[sizeof learn->recipe.arch];
        snprintf(arch, sizeof arch, "%s", learn->recipe.arch); /* the learner is freed first */
        cf_learner_free(learn);
        return cli_error(CLI_USAGE, cmd, "%s is not a language model (arch %s)", pos[0], arch);
    }
    char *out = NULL;
    cf_lm_generate_opts go = {.n_words = words,
                              .temperature = temperature,
                              .allow_unk = allow_unk,
                              .min_p = min_p,
                              .seed = seed};
    if (cf_lm_predict_text(learn, pos[1], &go, &out))
        rc = cli_lib_error(cmd, "generating");
    else
        printf("%s\n", out);
    cf_free(out);
    cf_learner_free(learn);
    return rc;
}

/* ---- eval --text ---------------------------------------------------------------------------- */

/* The texts to evaluate: a folder's valid/ texts (else its train/ texts, else its own label
 * folders), or a CSV file's rows marked by --valid-col (else every row). Only the evaluated texts
 * are left marked is_valid. */
static cf_status read_eval_texts(const char *path, bool lm, const char *text_col,
                                 const char *label_col, cf_text_raw **raw) {
    cf_status st;
    if (ends_with(path, ".csv")) {
        const char *labels[1] = {label_col};
        cf_text_csv_options co = {.text_col = text_col, .label_cols = labels, .n_label_cols = 1};
        st = cf_text_read_csv(path, &co, raw);
    } else {
        char dir[4096];
        struct stat sb;
        cf_text_folder_options fo = {.unlabelled = lm, .valid = ".corefit-no-such-folder"};
        snprintf(dir, sizeof dir, "%s/valid", path);
        if (stat(dir, &sb) == 0) {
            fo.train = "valid";
        } else {
            snprintf(dir, sizeof dir, "%s/train", path);
            fo.train = stat(dir, &sb) == 0 ? "train" : ".";
        }
        st = cf_text_read_folder(path, &fo, raw);
    }
    if (st) return st;
    bool any = false;
    for (int64_t i = 0; i < (*raw)->n; i++) any |= (*raw)->is_valid[i];
    if (!any)
        for (int64_t i = 0; i < (*raw)->n; i++) (*raw)->is_valid[i] = true;
    return CF_OK;
}

/* The texts' labels as the model's class indices; a label the model lacks is refused, naming
 * the text and the label. */
static cf_status model_targets(const cf_text_raw *raw, const cf_model_info *m, float *targets) {
    if (raw->target_dim != 1)
        return cf_fail(CF_ERR_FORMAT, "eval --text: one label per text is needed (%d columns)",
                       raw->target_dim);
    int64_t k = 0;
    for (int64_t i = 0; i < raw->n; i++) {
        if (!raw->is_valid[i]) continue;
        const char *label = raw->classes[(int)raw->targets[i]];
        int c = 0;
        while (c < m->n_vocab && strcmp(m->vocab[c], label) != 0) c++;
        if (c == m->n_vocab)
            return cf_fail(CF_ERR_FORMAT, "%s: label '%s' is not one of the model's %d classes",
                           raw->where[i], label, m->n_vocab);
        targets[k++] = (float)c;
    }
    return CF_OK;
}

/* A learner over the texts, numericalized with the model's tokenizer and vocabulary, with the
 * model's weights and fastai's metrics (accuracy; a language model also perplexity). */
static cf_status eval_learner(const char *model_path, const cf_model_info *m,
                              const cf_text_raw *raw, int bs, int seq_len, cf_learner **out) {
    const bool lm = strcmp(m->recipe.arch, "awd_lstm_lm") == 0;
    cf_text_vocab *v = NULL;
    cf_text_numericalizer *nz = NULL;
    cf_text_corpus *c = NULL;
    cf_dls *dls = NULL;
    int64_t n = 0;
    for (int64_t i = 0; i < raw->n; i++) n += raw->is_valid[i];
    float *targets = cf_malloc((size_t)(n ? n : 1) * sizeof(float));
    cf_status st = targets ? CF_OK : CF_ERR_NOMEM;
    if (st == CF_OK && !lm) st = model_targets(raw, m, targets);
    if (st == CF_OK)
        st = cf_text_vocab_from_words((const char *const *)m->text_vocab, m->n_text_vocab, &v);
    if (st == CF_OK) st = cf_text_numericalizer_new(&m->tok, NULL, v, &nz);
    if (st == CF_OK) st = cf_text_corpus_from_raw(raw, true, nz, &c);
    if (st == CF_OK && !lm)
        st = cf_text_corpus_set_labels(c, targets, 1, m->n_vocab, (const char *const *)m->vocab);
    if (st == CF_OK)
        st = cf_text_dls_new(
            c, c, &(cf_text_dls_options){.bs = bs, .seq_len = seq_len, .is_lm = lm, .seed = 42},
            &dls);
    cf_text_corpus_free(c);
    cf_text_vocab_free(v);
    cf_free(targets);
    if (st == CF_OK) {
        dls->text_nz = nz;
        dls->free_text_nz = cf_text_numericalizer_free;
        nz = NULL;
        cf_metric *metrics[2] = {cf_accuracy(), lm ? cf_perplexity() : NULL};
        st = cf_learner_from_info(m, dls, metrics, lm ? 2 : 1, out);
    }
    cf_text_numericalizer_free(nz);
    if (st == CF_OK) {
        (*out)->owned_dls = dls;
        dls = NULL;
        st = cf_model_load((*out)->model, NULL, model_path);
    }
    cf_dls_free(dls);
    if (st && *out) {
        cf_learner_free(*out);
        *out = NULL;
    }
    return st;
}

static void text_eval_usage(FILE *f, const cli_opt *opts) {
    fprintf(f, "Usage: corefit eval MODEL --text DIR|FILE.csv [options]\n"
               "\nA text model's validation loss and metrics on texts tokenized as its training\n"
               "texts were: a classifier's accuracy; a language model's accuracy and perplexity\n"
               "(next-token prediction over the texts' stream).\n\n");
    cli_print_options(f, opts);
}

int cmd_eval_text(int argc, char **argv) {
    const char *cmd = "eval";
    const char *text = NULL, *text_col = "text", *label_col = "label";
    int bs = 64, seq_len = 0, cores = 0;
    bool json = false;
    cli_opt opts[] = {
        {"--text", OPT_STR, &text, "DIR|FILE.csv",
         "texts: a folder (its valid/ texts, else train/, else its label folders) or a CSV file", 0,
         0, 0},
        {"--text-col", OPT_STR, &text_col, "NAME", "CSV: the text column [text]", 0, 0, 0},
        {"--label-col", OPT_STR, &label_col, "NAME", "CSV: the label column [label]", 0, 0, 0},
        {"--bs", OPT_INT, &bs, "N", "batch size [64]", 1, 1 << 20, 0},
        {"--seq-len", OPT_INT, &seq_len, "N",
         "language model: sequence length (BPTT) [72; a classifier uses its own]", 2, 1 << 16, 0},
        {"--cores", OPT_INT, &cores, "N", "worker processes [every core]", 1, 4096, 0},
        {"--json", OPT_FLAG, &json, NULL, "print the results as JSON", 0, 0, 0},
        {0},
    };
    const char *pos[1];
    int n_pos;
    bool help;
    int rc = cli_parse_or_usage(cmd, argc, argv, opts, pos, 1, &n_pos, text_eval_usage, &help);
    if (rc || help) return rc;
    if (n_pos != 1 || !text) return cli_error(CLI_USAGE, cmd, "expects MODEL --text DIR|FILE.csv");
    cf_model_info m;
    if (cf_model_info_read(pos[0], &m)) return cli_lib_error(cmd, "reading the model");
    const bool lm = strcmp(m.recipe.arch, "awd_lstm_lm") == 0;
    if (!lm && strcmp(m.recipe.arch, "awd_lstm_clas") != 0) {
        rc =
            cli_error(CLI_USAGE, cmd, "%s is not a text model (arch %s); --text is for text models",
                      pos[0], m.recipe.arch);
        cf_model_info_free(&m);
        return rc;
    }
    if (!seq_len) seq_len = lm || m.recipe.text_seq_len <= 0 ? 72 : m.recipe.text_seq_len;
    cf_text_raw *raw = NULL;
    cf_learner *learn = NULL;
    if (read_eval_texts(text, lm, text_col, label_col, &raw))
        rc = cli_lib_error(cmd, "reading the texts");
    else if (eval_learner(pos[0], &m, raw, bs, seq_len, &learn))
        rc = cli_lib_error(cmd, "loading the model");
    int64_t n = 0;
    for (int64_t i = 0; raw && i < raw->n; i++) n += raw->is_valid[i];
    cf_text_raw_free(raw);
    cf_model_info_free(&m);
    if (rc) return rc;
    double values[4];
    cf_status st = cf_par_validate(learn, values, .par.num_cores = cores, .par.split_batch = true);
    if (st) {
        cf_learner_free(learn);
        return cli_lib_error(cmd, "validation");
    }
    char b[32];
    if (json)
        printf("{\"model\": \"%s\", \"texts\": %lld", pos[0], (long long)n);
    else
        printf("texts: %lld\n", (long long)n);
    const char *names[4] = {"valid_loss", NULL, NULL, NULL};
    for (int i = 0; i < learn->n_metrics; i++) names[1 + i] = learn->metrics[i]->name;
    for (int i = 0; i <= learn->n_metrics; i++) {
        if (json)
            printf(", \"%s\": %.9g", names[i], values[i]);
        else
            printf("%s: %s\n", names[i], cf_format_float(values[i], b, sizeof b));
    }
    if (json) printf("}\n");
    cf_learner_free(learn);
    return CLI_OK;
}
