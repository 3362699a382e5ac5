/* W4: the AWD-LSTM language model (awd_lstm_lm_config: emb 400, hidden 1152, 3 layers, tied
 * decoder) trained on Debian's fortunes corpus, bs 64 per process, seq_len 72, fastai's Adam;
 * bench/w4_torch.py is the same model and recipe in PyTorch.
 *
 * Throughput (bench_common.h: options, timing, memory, the JSON line; "images" are rows of
 * seq_len tokens, so tokens/s = images_per_s * seq_len, which run.py reports):
 *   bench_w4 [--threads N | --cores N | --mpi] [--batches B] [--data DIR] [--seed S]
 *   fit_one_cycle(lr_max 1e-2, moms (0.8, 0.7, 0.8)), wd 0.1, AR 2 and TAR 1 (fastai's
 *   language_model_learner and the ULMFiT tutorial).
 *
 * Data shared with PyTorch (the same vocabulary and ids on both sides):
 *   bench_w4 --export DIR [--data DIR] [--topics DIR]
 *   writes DIR/lm_{train,valid}.ids (the language model's documents, corefit id files),
 *   DIR/clas_{train,valid}.ids and .labels (the topic classifier's documents and class codes,
 *   one a line) and DIR/vocab.txt (one word a line).
 *
 * The recipe (perplexity and accuracy, one JSON line):
 *   bench_w4 --recipe [--threads N | --cores N] [--seed S] [--lm-epochs E] [--clas-epochs E]
 *            [--data DIR] [--topics DIR] [--emb-sz N] [--n-hid N] [--n-layers N] [--bs N]
 *            [--bf16]
 *   1. the language model: fit_one_cycle(lm_epochs, 1e-2), wd 0.1; validation loss, accuracy
 *      and perplexity; its encoder saved;
 *   2. the topic classifier (awd_lstm_clas_config, drop_mult 0.5, --topics: the six largest
 *      fortune files) from that encoder, ULMFiT's gradual unfreezing, one epoch per stage:
 *      fit_one_cycle(1, 2e-2) frozen, freeze_to(-2) slice(1e-2 / 2.6^4, 1e-2), freeze_to(-3)
 *      slice(5e-3 / 2.6^4, 5e-3), unfreeze() clas_epochs of slice(1e-3 / 2.6^4, 1e-3);
 *      validation accuracy.
 *   --cores N runs every fit as its cf_par_ twin with split batches (one process's result);
 *   --emb-sz, --n-hid and --n-layers change both configs' sizes (dropouts as fastai's) and --bs
 *   both learners' batch size (64), for the
 *   short parity recipe of bench/README.md ("W4 recipe"); --bf16 runs both learners in mixed
 *   precision (cf_learner_to_bf16, as the throughput mode's --bf16). Each fit's epoch table
 * (train_loss, valid_loss, metrics) goes to stdout before the JSON line.
 *
 * FLOPs per row of 72 tokens per training step: 2 per multiply-add of the three LSTMs (input
 * and recurrent products) and the decoder (400 x vocabulary), times 3 (forward, input gradient,
 * weight gradient; the embedding's lookup is not a product). Gates, dropouts, the softmax and
 * Adam are not counted. */
#include "bench_common.h"
#include "bench_path.h"

#include <sys/stat.h>

#define W4_SEQ_LEN 72
#define W4_LM_LR 1e-2
#define W4_WD 0.1
#define W4_CLAS_LR 2e-2

static bench_workload w4;
static char w4_topics[4096];

/* FLOPs per row of W4_SEQ_LEN tokens per training step (header comment). */
static double w4_train_flop_per_row(int64_t vocab) {
    const cf_awd_lstm_config c = cf_awd_lstm_lm_config();
    double per_token = 0;
    for (int l = 0; l < c.n_layers; l++) {
        const int in = l == 0 ? c.emb_sz : c.n_hid, hid = l == c.n_layers - 1 ? c.emb_sz : c.n_hid;
        per_token += 2.0 * 4 * hid * (in + hid);
    }
    per_token += 2.0 * c.emb_sz * (double)vocab;
    return 3 * per_token * W4_SEQ_LEN;
}

static cf_status w4_lm_dls(cf_dls **out, const char *data, int bs, uint64_t seed) {
    cf_status st = cf_text_dls_from_folder(
        data, NULL,
        &(cf_text_loaders_options){
            .dls = {.bs = bs, .seq_len = W4_SEQ_LEN, .seed = seed, .is_lm = true}},
        out);
    if (st != CF_OK) {
        if (access(data, F_OK) != 0)
            fprintf(stderr, "bench_w4: make the corpus with scripts/fortunes-folder %s\n", data);
        return st;
    }
    w4.train_flop_per_image =
        w4_train_flop_per_row(cf_text_vocab_len(cf_text_numericalizer_vocab((*out)->text_nz)));
    return CF_OK;
}

static cf_status w4_lm_learner(cf_learner **out, cf_dls *dls, uint64_t seed) {
    cf_metric *metrics[] = {cf_accuracy(), cf_perplexity()};
    return cf_language_model_learner(out, dls, .metrics = metrics, .n_metrics = 2, .wd = W4_WD,
                                     .quiet = true, .seed = seed, .path = "/tmp");
}

/* fit_one_cycle(lr_max, the learner's moms); a parallel fit waits up to 30 minutes for a worker:
 * one W4 step is minutes of wall time on a loaded machine, past the 120 s default. */
static cf_status w4_fit(cf_learner *learn, int epochs, bool timing, cf_callback **cbs, int n_cbs,
                        const cf_par_opts *par) {
    (void)timing;
    if (!par)
        return cf_fit_one_cycle(learn, epochs, .lr_max = CF_LR(W4_LM_LR), .cbs = cbs,
                                .n_cbs = n_cbs);
    cf_par_opts p = *par;
    p.deadline_s = 1800;
    return cf_par_fit_one_cycle(learn, epochs, .lr_max = CF_LR(W4_LM_LR), .cbs = cbs,
                                .n_cbs = n_cbs, .par = p);
}

static int w4_parse_opt(const char *name, const char *value) {
    if (strcmp(name, "--topics") != 0) return 0;
    snprintf(w4_topics, sizeof w4_topics, "%s", value);
    return 1;
}

static void w4_json(FILE *f, const cf_dls *dls) {
    fprintf(f,
            "\"seq_len\": %d, \"tokens_per_row\": %d, \"vocab\": %lld, \"n_train_docs\": %lld, "
            "\"acc_set\": \"valid\", ",
            W4_SEQ_LEN, W4_SEQ_LEN,
            (long long)cf_text_vocab_len(cf_text_numericalizer_vocab(dls->text_nz)),
            (long long)dls->train_ds->n);
}

/* ---- --export: the ids PyTorch trains on ---------------------------------------------------- */

static int w4_write_labels(const cf_text_corpus *c, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_w4: %s: %s\n", path, strerror(errno));
        return 1;
    }
    for (int64_t d = 0; d < c->n_docs; d++) fprintf(f, "%d\n", (int)c->targets[d]);
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_w4: %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

static cf_status w4_clas_dls(cf_dls **out, const char *topics, const cf_text_vocab *vocab, int bs,
                             uint64_t seed) {
    return cf_text_dls_from_folder(
        topics, NULL,
        &(cf_text_loaders_options){.dls = {.bs = bs, .seq_len = W4_SEQ_LEN, .seed = seed},
                                   .text_vocab = vocab},
        out);
}

static int w4_export(const char *data, const char *topics, const char *dir) {
    cf_dls *lm = NULL, *clas = NULL;
    char path[8192];
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_w4: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    BENCH_CHECK("bench_w4", w4_lm_dls(&lm, data, 64, 42));
    const cf_text_vocab *vocab = cf_text_numericalizer_vocab(lm->text_nz);
    BENCH_CHECK("bench_w4", w4_clas_dls(&clas, topics, vocab, 64, 42));
    const char *names[4] = {"lm_train", "lm_valid", "clas_train", "clas_valid"};
    const cf_dataloader *loaders[4] = {lm->train, lm->valid, clas->train, clas->valid};
    for (int k = 0; k < 4; k++) {
        const cf_text_corpus *c = cf_text_loader_corpus(loaders[k]);
        snprintf(path, sizeof path, "%s/%s.ids", dir, names[k]);
        BENCH_CHECK("bench_w4", cf_text_corpus_write(c, path));
        snprintf(path, sizeof path, "%s/%s.labels", dir, names[k]);
        if (k >= 2 && w4_write_labels(c, path)) return 1;
    }
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_w4: %s: %s\n", path, strerror(errno));
        return 1;
    }
    for (int64_t i = 0; i < cf_text_vocab_len(vocab); i++)
        fprintf(f, "%s\n", cf_text_vocab_word(vocab, i));
    fclose(f);
    printf("{\"vocab\": %lld, \"lm_train_docs\": %lld, \"clas_train_docs\": %lld, "
           "\"classes\": %d}\n",
           (long long)cf_text_vocab_len(vocab), (long long)lm->train_ds->n,
           (long long)clas->train_ds->n, clas->train_ds->n_classes);
    cf_dls_free(clas);
    cf_dls_free(lm);
    return 0;
}

/* ---- --recipe: perplexity and the classifier's accuracy ------------------------------------- */

typedef struct w4_recipe_args {
    const char *data, *topics;
    int threads, cores, lm_epochs, clas_epochs;
    int emb_sz, n_hid, n_layers; /* 0: awd_lstm_lm_config's (400, 1152, 3) */
    int bs;                      /* both learners' batch size (W4's 64) */
    bool bf16;                   /* --bf16: both learners in mixed precision */
    uint64_t seed;
} w4_recipe_args;

/* The config with the recipe's sizes (--emb-sz, --n-hid, --n-layers); dropouts unchanged. */
static cf_awd_lstm_config w4_config(cf_awd_lstm_config c, const w4_recipe_args *a) {
    if (a->emb_sz > 0) c.emb_sz = a->emb_sz;
    if (a->n_hid > 0) c.n_hid = a->n_hid;
    if (a->n_layers > 0) c.n_layers = a->n_layers;
    return c;
}

static cf_status w4_cycle(cf_learner *learn, int epochs, cf_lr lr, const w4_recipe_args *a) {
    if (a->cores > 0)
        return cf_par_fit_one_cycle(
            learn, epochs, .lr_max = lr,
            .par = {.num_cores = a->cores, .split_batch = true, .deadline_s = 1800});
    return cf_fit_one_cycle(learn, epochs, .lr_max = lr);
}

static int w4_recipe(const w4_recipe_args *a) {
    const char *prog = "bench_w4";
    cf_set_num_threads(a->cores > 0 ? 1 : a->threads);
    double t0 = cf_now();
    cf_dls *dls_lm = NULL, *dls = NULL;
    BENCH_CHECK(prog, w4_lm_dls(&dls_lm, a->data, a->bs, a->seed));
    cf_learner *lm = NULL;
    const cf_awd_lstm_config lm_cfg = w4_config(cf_awd_lstm_lm_config(), a),
                             clas_cfg = w4_config(cf_awd_lstm_clas_config(), a);
    cf_metric *lm_metrics[] = {cf_accuracy(), cf_perplexity()};
    BENCH_CHECK(prog, cf_language_model_learner(&lm, dls_lm, .metrics = lm_metrics, .n_metrics = 2,
                                                .wd = W4_WD, .seed = a->seed, .path = "/tmp",
                                                .config = &lm_cfg));
    if (a->bf16) BENCH_CHECK(prog, cf_learner_to_bf16(lm));
    BENCH_CHECK(prog, w4_cycle(lm, a->lm_epochs, CF_LR(W4_LM_LR), a));
    const double lm_loss = lm->final_record[0], lm_acc = lm->final_record[1],
                 lm_ppl = lm->final_record[2];
    char encoder[64];
    snprintf(encoder, sizeof encoder, "/tmp/bench_w4-%ld-encoder", (long)getpid());
    BENCH_CHECK(prog, cf_learner_save_encoder(lm, encoder));
    const double t_lm = cf_now() - t0;

    const cf_text_vocab *vocab = cf_text_numericalizer_vocab(dls_lm->text_nz);
    BENCH_CHECK(prog, w4_clas_dls(&dls, a->topics, vocab, a->bs, a->seed));
    cf_learner *clas = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    BENCH_CHECK(prog, cf_text_classifier_learner(
                          &clas, dls, .seq_len = W4_SEQ_LEN, .metrics = metrics, .n_metrics = 1,
                          .seed = a->seed, .path = "/tmp", .config = &clas_cfg));
    /* a name with a '/' is the file itself */
    cf_status st = cf_learner_load_encoder(clas, encoder);
    unlink(encoder);
    BENCH_CHECK(prog, st);
    if (a->bf16) BENCH_CHECK(prog, cf_learner_to_bf16(clas));
    const double k = pow(2.6, 4), lr = W4_CLAS_LR;
    const int groups = clas->model->n_groups;
    BENCH_CHECK(prog, w4_cycle(clas, 1, CF_LR(lr), a));
    BENCH_CHECK(prog, cf_learner_freeze_to(clas, groups - 2));
    BENCH_CHECK(prog, w4_cycle(clas, 1, CF_SLICE2(lr / 2 / k, lr / 2), a));
    BENCH_CHECK(prog, cf_learner_freeze_to(clas, groups - 3));
    BENCH_CHECK(prog, w4_cycle(clas, 1, CF_SLICE2(lr / 4 / k, lr / 4), a));
    BENCH_CHECK(prog, cf_learner_unfreeze(clas));
    BENCH_CHECK(prog, w4_cycle(clas, a->clas_epochs, CF_SLICE2(lr / 20 / k, lr / 20), a));
    printf("{\"impl\": \"corefit\", \"mode\": \"recipe\", \"seed\": %llu, \"threads\": %d, "
           "\"cores\": %d, \"lm_epochs\": %d, \"clas_epochs\": %d, \"vocab\": %lld, "
           "\"lm_valid_loss\": %.5f, \"lm_accuracy\": %.5f, \"perplexity\": %.4f, "
           "\"clas_valid_loss\": %.5f, \"clas_accuracy\": %.5f, \"classes\": %d, "
           "\"lm_s\": %.1f, \"total_s\": %.1f, \"isa\": \"%s\", \"emb_sz\": %d, "
           "\"n_hid\": %d, \"n_layers\": %d, \"lm_train_docs\": %lld, \"clas_train_docs\": %lld, "
           "\"clas_valid_docs\": %lld, \"bs\": %d, \"bf16\": %s, \"bf16_compute\": %s}\n",
           (unsigned long long)a->seed, a->threads, a->cores, a->lm_epochs, a->clas_epochs,
           (long long)cf_text_vocab_len(vocab), lm_loss, lm_acc, lm_ppl, clas->final_record[0],
           clas->final_record[1], dls->train_ds->n_classes, t_lm, cf_now() - t0,
           cf_isa_name(cf_isa_active()), lm_cfg.emb_sz, lm_cfg.n_hid, lm_cfg.n_layers,
           (long long)dls_lm->train_ds->n, (long long)dls->train_ds->n, (long long)dls->valid_ds->n,
           a->bs, a->bf16 ? "true" : "false", a->bf16 && cf_bf16_compute() ? "true" : "false");
    cf_learner_free(clas);
    cf_learner_free(lm);
    cf_dls_free(dls);
    cf_dls_free(dls_lm);
    return 0;
}

int main(int argc, char **argv) {
    /* the folders run.py makes: BUILD/w4-fortunes and BUILD/w4-topics beside BUILD/bench_w4 */
    static char data[4096];
    bench_beside_self("w4-fortunes", data, sizeof data);
    bench_beside_self("w4-topics", w4_topics, sizeof w4_topics);
    w4 = (bench_workload){.prog = "bench_w4",
                          .lr_max = W4_LM_LR,
                          .make_learner = w4_lm_learner,
                          .default_data = data,
                          .make_dls = w4_lm_dls,
                          .fit = w4_fit,
                          .parse_opt = w4_parse_opt,
                          .usage_extra = "[--topics DIR] | --export DIR | --recipe [--lm-epochs E] "
                                         "[--clas-epochs E] [--emb-sz N] [--n-hid N] "
                                         "[--n-layers N] [--bs N]",
                          .json_extra = w4_json};
    const char *export_dir = NULL;
    bool recipe = false;
    w4_recipe_args ra = {.threads = 1, .lm_epochs = 1, .clas_epochs = 1, .seed = 42, .bs = 64};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--recipe")) {
            recipe = true;
            continue;
        }
        if (!strcmp(argv[i], "--bf16")) ra.bf16 = true;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--export") && v) export_dir = v;
        if (!strcmp(argv[i], "--data") && v) snprintf(data, sizeof data, "%s", v);
        if (!strcmp(argv[i], "--topics") && v) snprintf(w4_topics, sizeof w4_topics, "%s", v);
        if (!strcmp(argv[i], "--threads") && v) ra.threads = atoi(v);
        if (!strcmp(argv[i], "--cores") && v) ra.cores = atoi(v);
        if (!strcmp(argv[i], "--seed") && v) ra.seed = strtoull(v, NULL, 10);
        if (!strcmp(argv[i], "--lm-epochs") && v) ra.lm_epochs = atoi(v);
        if (!strcmp(argv[i], "--clas-epochs") && v) ra.clas_epochs = atoi(v);
        if (!strcmp(argv[i], "--emb-sz") && v) ra.emb_sz = atoi(v);
        if (!strcmp(argv[i], "--n-hid") && v) ra.n_hid = atoi(v);
        if (!strcmp(argv[i], "--n-layers") && v) ra.n_layers = atoi(v);
        if (!strcmp(argv[i], "--bs") && v) ra.bs = atoi(v);
    }
    if (export_dir) return w4_export(data, w4_topics, export_dir);
    if (recipe) {
        if (ra.threads < 1 || ra.cores < 0 || ra.lm_epochs < 1 || ra.clas_epochs < 1 ||
            ra.emb_sz < 0 || ra.n_hid < 0 || ra.n_layers < 0 || ra.bs < 1) {
            fprintf(stderr, "bench_w4: --recipe needs N >= 1, E >= 1 and sizes >= 1\n");
            return 2;
        }
        ra.data = data;
        ra.topics = w4_topics;
        return w4_recipe(&ra);
    }
    return bench_main(argc, argv, &w4);
}
