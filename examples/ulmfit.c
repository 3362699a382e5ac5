/* The ULMFiT recipe of fastai's text tutorial on Debian's fortunes corpus, on every core:
 *
 *   1. a language model (AWD-LSTM, accuracy and perplexity) trained on every quotation with
 *      cf_par_fit_one_cycle, a few words generated from it, its encoder saved;
 *   2. a topic classifier over the fortune files with the most quotations (picked by counting),
 *      reusing the language model's vocabulary, starting from its encoder, trained with gradual
 *      unfreezing (fit_one_cycle frozen, freeze_to(-2), freeze_to(-3), unfreeze) on every core;
 *   3. the classifier exported, loaded back (cf_load_learner, as another program would) and used
 *      to predict the topic of raw text.
 *
 *   scripts/fortunes-folder fortunes        # fortunes/{train,valid}/<topic>/<n>.txt
 *   example_ulmfit fortunes [OUT_DIR] [options]
 *
 * Options (defaults are fastai's sizes and the tutorial's recipe):
 *   --lm-epochs N       language model epochs [4]
 *   --epochs N          classifier epochs of the last, unfrozen stage [2]
 *   --lm-lr X           language model learning rate [1e-2]
 *   --lr X              classifier learning rate of the first stage [2e-2]
 *   --emb-sz N --n-hid N --n-layers N   AWD-LSTM sizes [400, 1152, 3]
 *   --bs N              batch size [64]
 *   --seq-len N         BPTT length and the classifier's chunk length [72]
 *   --min-per-topic N   a topic needs this many quotations [500]
 *   --max-topics N      at most this many topics, the largest first [all]
 *   --cores N           worker processes [every core]
 *
 * There are no pretrained WikiText-103 weights, so step 1 is where the language model learns
 * the corpus' English. OUT_DIR (default ulmfit_out) receives lm.safetensors (for `corefit
 * generate`), finetuned.safetensors (the encoder), topics.safetensors (for `corefit predict`),
 * and topics/, the chosen topics' folders linked from the corpus. */
#include <corefit.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cf_status st_ = (call);                                                                    \
        if (st_ != CF_OK) {                                                                        \
            fprintf(stderr, "error: %s\n", cf_last_error());                                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

typedef struct ulmfit_args {
    const char *corpus, *out;
    int lm_epochs, epochs, emb_sz, n_hid, n_layers, bs, seq_len, min_per_topic, max_topics, cores;
    double lm_lr, lr;
} ulmfit_args;

typedef struct topic {
    char name[256];
    int count;
} topic;

static int usage(const char *prog) {
    fprintf(stderr,
            "usage: %s FORTUNES_DIR [OUT_DIR] [--lm-epochs N] [--epochs N] [--lm-lr X] [--lr X]\n"
            "       [--emb-sz N] [--n-hid N] [--n-layers N] [--bs N] [--seq-len N]\n"
            "       [--min-per-topic N] [--max-topics N] [--cores N]\n"
            "FORTUNES_DIR: train/<topic>/*.txt and valid/<topic>/*.txt (scripts/fortunes-folder)\n",
            prog);
    return 2;
}

/* Parses argv into a; a bad option or value is reported by name. */
static int parse_args(int argc, char **argv, ulmfit_args *a) {
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (s[0] != '-') {
            if (n_pos == 0)
                a->corpus = s;
            else if (n_pos == 1)
                a->out = s;
            else {
                fprintf(stderr, "error: unexpected argument %d: \"%s\"\n", i, s);
                return 2;
            }
            n_pos++;
            continue;
        }
        struct {
            const char *name;
            int *i;
            double *d;
        } opts[] = {
            {"--lm-epochs", &a->lm_epochs, NULL},   {"--epochs", &a->epochs, NULL},
            {"--lm-lr", NULL, &a->lm_lr},           {"--lr", NULL, &a->lr},
            {"--emb-sz", &a->emb_sz, NULL},         {"--n-hid", &a->n_hid, NULL},
            {"--n-layers", &a->n_layers, NULL},     {"--bs", &a->bs, NULL},
            {"--seq-len", &a->seq_len, NULL},       {"--min-per-topic", &a->min_per_topic, NULL},
            {"--max-topics", &a->max_topics, NULL}, {"--cores", &a->cores, NULL}};
        size_t k = 0, n_opts = sizeof opts / sizeof opts[0];
        while (k < n_opts && strcmp(s, opts[k].name) != 0) k++;
        if (k == n_opts) {
            fprintf(stderr, "error: unknown option %s\n", s);
            return usage(argv[0]);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "error: %s needs a value\n", s);
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        errno = 0;
        if (opts[k].i) {
            long x = strtol(v, &end, 10);
            if (errno || *end || end == v || x < 0 || x > 1 << 20) {
                fprintf(stderr, "error: %s \"%s\": not a count in [0, %d]\n", s, v, 1 << 20);
                return 2;
            }
            *opts[k].i = (int)x;
        } else {
            double x = strtod(v, &end);
            if (errno || *end || end == v || !(x > 0 && x < 10)) {
                fprintf(stderr, "error: %s \"%s\": not a learning rate in (0, 10)\n", s, v);
                return 2;
            }
            *opts[k].d = x;
        }
    }
    if (!a->corpus) return usage(argv[0]);
    if (a->lm_epochs < 1 || a->epochs < 1 || a->emb_sz < 1 || a->n_hid < 1 || a->n_layers < 1 ||
        a->bs < 1 || a->seq_len < 2) {
        fprintf(stderr, "error: epochs, sizes and bs must be at least 1, --seq-len at least 2\n");
        return 2;
    }
    return 0;
}

/* The .txt files in dir (0 when it does not exist). */
static int count_txt(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        n += len > 4 && strcmp(e->d_name + len - 4, ".txt") == 0;
    }
    closedir(d);
    return n;
}

static int by_count_desc(const void *x, const void *y) {
    const topic *a = x, *b = y;
    return a->count != b->count ? (b->count > a->count ? 1 : -1) : strcmp(a->name, b->name);
}

/* Every topic of corpus/train with its quotations (train + valid), the largest first. */
static int count_topics(const char *corpus, topic **out, int *n_out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/train", corpus);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr,
                "error: %s: cannot open folder: %s (make it with scripts/fortunes-folder)\n", path,
                strerror(errno));
        return 1;
    }
    topic *t = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof t->name) continue;
        snprintf(path, sizeof path, "%s/train/%s", corpus, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            topic *grown = realloc(t, (size_t)cap * sizeof *t);
            if (!grown) {
                free(t);
                closedir(d);
                return 1;
            }
            t = grown;
        }
        snprintf(t[n].name, sizeof t[n].name, "%s", e->d_name);
        t[n].count = count_txt(path);
        snprintf(path, sizeof path, "%s/valid/%s", corpus, e->d_name);
        t[n].count += count_txt(path);
        n++;
    }
    closedir(d);
    if (n) qsort(t, (size_t)n, sizeof *t, by_count_desc);
    *out = t;
    *n_out = n;
    return 0;
}

static int make_dir(const char *path) {
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
    fprintf(stderr, "error: cannot create %s: %s\n", path, strerror(errno));
    return 1;
}

/* out/topics/{train,valid}/<topic>: links to the chosen topics' folders of the corpus, so that
 * TextDataLoaders.from_folder sees only them (links left by an earlier run are replaced). */
static int link_topics(const char *corpus, const char *root, const topic *t, int n) {
    char abs_corpus[4096], path[8192], target[8192];
    if (!realpath(corpus, abs_corpus)) {
        fprintf(stderr, "error: %s: %s\n", corpus, strerror(errno));
        return 1;
    }
    if (make_dir(root)) return 1;
    const char *splits[2] = {"train", "valid"};
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/%s", root, splits[s]);
        if (make_dir(path)) return 1;
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char old[8192];
            struct stat sb;
            if (e->d_name[0] == '.' ||
                snprintf(old, sizeof old, "%s/%s", path, e->d_name) >= (int)sizeof old)
                continue;
            if (lstat(old, &sb) == 0 && S_ISLNK(sb.st_mode)) unlink(old);
        }
        if (d) closedir(d);
        for (int k = 0; k < n; k++) {
            snprintf(target, sizeof target, "%s/%s/%s", abs_corpus, splits[s], t[k].name);
            snprintf(path, sizeof path, "%s/%s/%s", root, splits[s], t[k].name);
            struct stat sb;
            if (stat(target, &sb) != 0) continue; /* a topic without validation quotations */
            if (symlink(target, path) != 0) {
                fprintf(stderr, "error: cannot link %s to %s: %s\n", path, target, strerror(errno));
                return 1;
            }
        }
    }
    return 0;
}

/* The first quotation (file) of corpus/valid/<topic>, into a new string (NULL when none). */
static char *first_valid_quotation(const char *corpus, const char *topic_name) {
    char dir[4096], path[8192], best[256] = "";
    snprintf(dir, sizeof dir, "%s/valid/%s", corpus, topic_name);
    DIR *d = opendir(dir);
    if (!d) return NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && len < sizeof best && strcmp(e->d_name + len - 4, ".txt") == 0 &&
            (!best[0] || strcmp(e->d_name, best) < 0))
            snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    if (!best[0]) return NULL;
    snprintf(path, sizeof path, "%s/%s", dir, best);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = malloc(1 << 16);
    size_t n = s ? fread(s, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (s) s[n] = '\0';
    return s;
}

/* The ULMFiT recipe's step 3: one epoch with the encoder frozen, then the last two and three
 * parameter groups, then everything, with discriminative rates slice(lr / 2.6^4, lr) and lr
 * halved, halved again and divided by 5 (2e-2, 1e-2, 5e-3, 1e-3 in fastai's tutorial). Each
 * stage runs on every core with split batches (the result of one process). */
static cf_status gradual_unfreezing(cf_learner *clas, const ulmfit_args *a) {
    const double k = pow(2.6, 4), lr = a->lr;
    const int groups = clas->model->n_groups;
    const cf_par_opts par = {.num_cores = a->cores, .split_batch = true};
    printf("\nclassifier, frozen but for the head: fit_one_cycle(1, %g)\n", lr);
    cf_status st = cf_par_fit_one_cycle(clas, 1, .lr_max = CF_LR(lr), .par = par);
    if (st) return st;
    printf("\nfreeze_to(-2): fit_one_cycle(1, slice(%g, %g))\n", lr / 2 / k, lr / 2);
    if ((st = cf_learner_freeze_to(clas, groups - 2))) return st;
    st = cf_par_fit_one_cycle(clas, 1, .lr_max = CF_SLICE2(lr / 2 / k, lr / 2), .par = par);
    if (st) return st;
    printf("\nfreeze_to(-3): fit_one_cycle(1, slice(%g, %g))\n", lr / 4 / k, lr / 4);
    if ((st = cf_learner_freeze_to(clas, groups - 3))) return st;
    st = cf_par_fit_one_cycle(clas, 1, .lr_max = CF_SLICE2(lr / 4 / k, lr / 4), .par = par);
    if (st) return st;
    printf("\nunfreeze(): fit_one_cycle(%d, slice(%g, %g))\n", a->epochs, lr / 20 / k, lr / 20);
    if ((st = cf_learner_unfreeze(clas))) return st;
    return cf_par_fit_one_cycle(clas, a->epochs, .lr_max = CF_SLICE2(lr / 20 / k, lr / 20),
                                .par = par);
}

int main(int argc, char **argv) {
    ulmfit_args a = {.out = "ulmfit_out",
                     .lm_epochs = 4,
                     .epochs = 2,
                     .emb_sz = 400,
                     .n_hid = 1152,
                     .n_layers = 3,
                     .bs = 64,
                     .seq_len = 72,
                     .min_per_topic = 500,
                     .lm_lr = 1e-2,
                     .lr = 2e-2};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    if (make_dir(a.out)) return 1;
    char lm_path[4096], encoder_path[4096], topics_dir[4096], model_path[4096];
    snprintf(lm_path, sizeof lm_path, "%s/lm.safetensors", a.out);
    snprintf(encoder_path, sizeof encoder_path, "%s/finetuned.safetensors", a.out);
    snprintf(topics_dir, sizeof topics_dir, "%s/topics", a.out);
    snprintf(model_path, sizeof model_path, "%s/topics.safetensors", a.out);

    /* 1. The language model on every quotation of every topic (labels are not needed):
     * TextDataLoaders.from_folder(is_lm=True), tokenized on every core, the tokenized copies
     * cached beside the corpus (CORPUS_tok) for the next run. */
    cf_dls *dls_lm = NULL;
    CHECK(cf_text_dls_from_folder(
        a.corpus, NULL,
        &(cf_text_loaders_options){
            .dls = {.bs = a.bs, .seq_len = a.seq_len, .seed = 42, .is_lm = true}},
        &dls_lm));
    const cf_text_vocab *vocab = cf_text_numericalizer_vocab(dls_lm->text_nz);
    printf("language model: %lld training and %lld validation quotations, %lld words\n",
           (long long)dls_lm->train_ds->n, (long long)dls_lm->valid_ds->n,
           (long long)cf_text_vocab_len(vocab));

    cf_awd_lstm_config lm_cfg = cf_awd_lstm_lm_config();
    lm_cfg.emb_sz = a.emb_sz;
    lm_cfg.n_hid = a.n_hid;
    lm_cfg.n_layers = a.n_layers;
    cf_learner *lm = NULL;
    cf_metric *lm_metrics[] = {cf_accuracy(), cf_perplexity()};
    CHECK(cf_language_model_learner(&lm, dls_lm, .config = &lm_cfg, .metrics = lm_metrics,
                                    .n_metrics = 2, .wd = 0.1, .seed = 42));
    printf("fit_one_cycle(%d, %g) on every core\n", a.lm_epochs, a.lm_lr);
    CHECK(cf_par_fit_one_cycle(lm, a.lm_epochs, .lr_max = CF_LR(a.lm_lr),
                               .par = {.num_cores = a.cores, .split_batch = true}));
    printf("language model: valid_loss %.4f, accuracy %.4f, perplexity %.2f\n", lm->final_record[0],
           lm->final_record[1], lm->final_record[2]);
    char *words = NULL;
    CHECK(cf_lm_predict_text(lm, "The computer",
                             &(cf_lm_generate_opts){.n_words = 12, .temperature = 0.75, .seed = 1},
                             &words));
    /* the corpus's line breaks and tabs are tokens too: shown as spaces, the words stay on one line
     */
    for (char *c = words; *c; c++)
        if (*c == '\n' || *c == '\t' || *c == '\r') *c = ' ';
    printf("generated: %s\n", words);
    cf_free(words);
    CHECK(cf_learner_export(lm, lm_path));            /* for `corefit generate` */
    CHECK(cf_learner_save_encoder(lm, encoder_path)); /* save_encoder('finetuned') */
    printf("wrote %s and %s\n", lm_path, encoder_path);

    /* 2. The topics: the fortune files with at least min_per_topic quotations, by count. */
    topic *topics = NULL;
    int n_topics = 0;
    if (count_topics(a.corpus, &topics, &n_topics)) return 1;
    int n_chosen = 0;
    while (n_chosen < n_topics && topics[n_chosen].count >= a.min_per_topic &&
           (!a.max_topics || n_chosen < a.max_topics))
        n_chosen++;
    if (n_chosen < 2) {
        fprintf(stderr, "error: %s: %d topics have at least %d quotations; a classifier needs 2\n",
                a.corpus, n_chosen, a.min_per_topic);
        return 1;
    }
    printf("\n%d topics with at least %d quotations:", n_chosen, a.min_per_topic);
    for (int k = 0; k < n_chosen; k++) printf(" %s (%d)", topics[k].name, topics[k].count);
    printf("\n");
    if (link_topics(a.corpus, topics_dir, topics, n_chosen)) return 1;

    /* TextDataLoaders.from_folder(text_vocab=dls_lm.vocab): the same ids for the same words. */
    cf_dls *dls = NULL;
    CHECK(cf_text_dls_from_folder(
        topics_dir, NULL,
        &(cf_text_loaders_options){.dls = {.bs = a.bs, .seq_len = a.seq_len, .seed = 42},
                                   .text_vocab = vocab},
        &dls));
    printf("classifier: %lld training and %lld validation quotations of %d topics\n",
           (long long)dls->train_ds->n, (long long)dls->valid_ds->n, dls->train_ds->n_classes);

    cf_awd_lstm_config clas_cfg = cf_awd_lstm_clas_config();
    clas_cfg.emb_sz = a.emb_sz;
    clas_cfg.n_hid = a.n_hid;
    clas_cfg.n_layers = a.n_layers;
    cf_learner *clas = NULL;
    cf_metric *clas_metrics[] = {cf_accuracy()};
    CHECK(cf_text_classifier_learner(&clas, dls, .config = &clas_cfg, .seq_len = a.seq_len,
                                     .metrics = clas_metrics, .n_metrics = 1, .seed = 42));
    CHECK(cf_learner_load_encoder(clas, encoder_path)); /* load_encoder('finetuned'): frozen */
    cf_learner_free(lm);
    cf_dls_free(dls_lm);
    CHECK(gradual_unfreezing(clas, &a));
    printf("classifier: valid_loss %.4f, accuracy %.4f\n", clas->final_record[0],
           clas->final_record[1]);

    /* 3. Export, then load it back as another program would, and predict on raw text. */
    CHECK(cf_learner_export(clas, model_path));
    printf("wrote %s\n", model_path);
    cf_learner_free(clas);
    cf_dls_free(dls);

    cf_learner *loaded = NULL;
    CHECK(cf_load_learner(model_path, &loaded));
    const int n_out = loaded->recipe.n_out;
    char *const *classes = loaded->dls->train_ds->vocab;
    float *probs = malloc((size_t)n_out * sizeof *probs);
    if (!probs) return 1;
    for (int k = 0; k < n_chosen && k < 6; k++) {
        char *text = first_valid_quotation(a.corpus, topics[k].name);
        if (!text) continue;
        int best = 0;
        CHECK(cf_predict_text(loaded, text, probs, &best, NULL));
        char *nl = strchr(text, '\n');
        if (nl && nl - text > 60) nl = text + 60;
        printf("%-14s predicted %-14s (%.3f): %.*s...\n", topics[k].name, classes[best],
               probs[best], (int)(nl ? nl - text : 60), text);
        free(text);
    }
    int best = 0;
    int64_t unknown = 0;
    const char *mine = "The compiler crashed again, so I rebooted the computer and lost my work.";
    CHECK(cf_predict_text(loaded, mine, probs, &best, &unknown));
    printf("\"%s\": %s (%.3f), %lld unknown words\n", mine, classes[best], probs[best],
           (long long)unknown);
    free(probs);
    free(topics);
    cf_learner_free(loaded);
    return 0;
}
