/* The text learners. Language model: parallel fits on 2 and 3 split-batch workers equal one
 * process, Perplexity = exp(valid loss), ModelResetter, save_encoder / load_encoder, generation.
 * Classifier: defaults, a tiny fit, gradual unfreezing, multi-label loss, the first batch's loss
 * and gradients against fastai's classifier in PyTorch (tests/oracle/lstm.py), load_encoder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "counting_corpus.h"
#include "nn/rnn_internal.h"
#include "oracle.h"
#include "text_fixture.h"

#define assert_near(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.10g, expected %.10g", #a, a_, b_);         \
    } while (0)

enum { VOCAB = 40 };

static cf_text_corpus *make_corpus_chunked(int n_docs, uint64_t seed, int whole_chunks) {
    cf_text_corpus *c = counting_corpus(n_docs, seed, whole_chunks, VOCAB);
    assert_non_null(c);
    return c;
}

static cf_text_corpus *make_corpus(int n_docs, uint64_t seed) {
    return make_corpus_chunked(n_docs, seed, 0);
}

static cf_dls *make_dls(void) {
    cf_text_corpus *train = make_corpus(24, 1), *valid = make_corpus(8, 2);
    cf_dls *dls = NULL;
    assert_int_equal(
        cf_text_dls_new(
            train, valid,
            &(cf_text_dls_options){.bs = 6, .seq_len = 7, .seed = 3, .is_lm = true, .prefetch = -1},
            &dls),
        CF_OK);
    cf_text_corpus_free(train);
    cf_text_corpus_free(valid);
    return dls;
}

/* Small sizes; dropouts off unless asked (the text layers' masks come from each module's own
 * stream, so only a fit without them can equal one process across workers). */
static cf_awd_lstm_config small_config(float p) {
    cf_awd_lstm_config c = cf_awd_lstm_lm_config();
    c.emb_sz = 12;
    c.n_hid = 20;
    c.n_layers = 2;
    c.output_p = c.hidden_p = c.input_p = c.embed_p = c.weight_p = p;
    return c;
}

static cf_learner *make_learner(cf_dls *dls, uint64_t seed, float p) {
    cf_awd_lstm_config config = small_config(p);
    cf_metric *metrics[] = {cf_accuracy(), cf_perplexity()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_language_model_learner(&learn, dls, .config = &config, .seed = seed,
                                               .quiet = true, .metrics = metrics, .n_metrics = 2),
                     CF_OK);
    return learn;
}

static double max_rel(const float *a, const float *b, size_t n, double floor) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), floor);
        if (d > worst) worst = d;
    }
    return worst;
}

static void test_learner_defaults(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *learn = make_learner(dls, 7, 0.1f);
    assert_near(learn->moms[0], 0.8, 0);
    assert_near(learn->moms[1], 0.7, 0);
    assert_near(learn->moms[2], 0.8, 0);
    assert_int_equal(learn->model->n_groups, 3); /* two LSTMs, then embedding + decoder */
    assert_int_equal(learn->loss.kind, CF_LOSS_CROSS_ENTROPY);
    assert_int_equal(cf_learner_create_opt(learn), CF_OK);
    /* weight decay skips the decoder's bias only */
    for (int i = 0; i < learn->model->n_params; i++) {
        const char *name = learn->model->params[i]->full_name;
        bool expect = strcmp(name, "1.decoder.bias") != 0;
        if (learn->opt->do_wd[i] != expect) fail_msg("do_wd of %s is %d", name, !expect);
    }
    /* a loader that is not a language model's is refused */
    cf_learner *bad = NULL;
    cf_dls none = {0};
    assert_int_equal(cf_language_model_learner(&bad, &none), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "language-model"));
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* fit_one_cycle on 1, 2 and 3 split-batch workers: the same weights, optimizer state and
 * Recorder to 1e-5; validate and lr_find too. */
static void test_par_equals_one_process(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *one = make_learner(dls, 11, 0.0f);
    assert_int_equal(cf_fit_one_cycle(one, 2, .lr_max = CF_LR(3e-3)), CF_OK);
    assert_true(one->recorder.n_epochs == 2);
    double ref_values[3];
    assert_int_equal(cf_validate(one, ref_values), CF_OK);
    for (int world = 2; world <= 3; world++) {
        cf_learner *par = make_learner(dls, 11, 0.0f);
        assert_int_equal(cf_par_fit_one_cycle(par, 2, .lr_max = CF_LR(3e-3),
                                              .par = {.num_cores = world, .split_batch = true}),
                         CF_OK);
        double w = max_rel(par->model->weights, one->model->weights, one->model->n_weights, 1e-3);
        if (w > 1e-5) fail_msg("%d workers: weights differ by %.3g", world, w);
        double g = max_rel(par->opt->grad_avg, one->opt->grad_avg, one->model->n_weights, 1e-4);
        if (g > 1e-4) fail_msg("%d workers: optimizer state differs by %.3g", world, g);
        assert_int_equal(par->recorder.n_epochs, 2);
        assert_int_equal(par->recorder.n_batches, one->recorder.n_batches);
        for (int k = 0; k < 2 * one->recorder.n_values; k++) {
            double a = par->recorder.values[k], b = one->recorder.values[k];
            if (fabs(a - b) > 1e-5 * fmax(1, fabs(b)))
                fail_msg("%d workers: recorder value %d is %.8g, one process %.8g", world, k, a, b);
        }
        double values[3];
        assert_int_equal(
            cf_par_validate(par, values, .par = {.num_cores = world, .split_batch = true}), CF_OK);
        for (int k = 0; k < 3; k++)
            if (fabs(values[k] - ref_values[k]) > 1e-5 * fmax(1, fabs(ref_values[k])))
                fail_msg("%d workers: validate value %d is %.8g, one process %.8g", world, k,
                         values[k], ref_values[k]);
        cf_learner_free(par);
    }
    /* lr_find: the same curve on 2 workers */
    cf_learner *a = make_learner(dls, 5, 0.0f), *b = make_learner(dls, 5, 0.0f);
    cf_lr_find_result ra = {0}, rb = {0};
    assert_int_equal(cf_lr_find(a, &ra, .num_it = 6, .no_stop_div = true), CF_OK);
    assert_int_equal(cf_par_lr_find(b, &rb, .num_it = 6, .no_stop_div = true,
                                    .par = {.num_cores = 2, .split_batch = true}),
                     CF_OK);
    assert_int_equal(ra.n, rb.n);
    for (int i = 0; i < ra.n; i++) {
        assert_near(ra.lrs[i], rb.lrs[i], 1e-12);
        if (fabs(ra.losses[i] - rb.losses[i]) > 1e-5 * fmax(1, fabs(ra.losses[i])))
            fail_msg("lr_find loss %d: %.8g vs %.8g", i, rb.losses[i], ra.losses[i]);
    }
    cf_lr_find_result_free(&ra);
    cf_lr_find_result_free(&rb);
    cf_learner_free(a);
    cf_learner_free(b);
    cf_learner_free(one);
    cf_dls_free(dls);
}

/* ULMFiT's stages in a row: each continues the shuffle stream (cf_learner.data_epochs), on 2
 * split-batch workers as in one process. */
static void test_par_stages_equal_one_process(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *one = make_learner(dls, 13, 0.0f), *par = make_learner(dls, 13, 0.0f);
    const cf_par_opts po = {.num_cores = 2, .split_batch = true};
    assert_int_equal(cf_fit_one_cycle(one, 1, .lr_max = CF_LR(3e-3)), CF_OK);
    assert_int_equal(cf_par_fit_one_cycle(par, 1, .lr_max = CF_LR(3e-3), .par = po), CF_OK);
    assert_int_equal(cf_learner_freeze_to(one, -2), CF_OK);
    assert_int_equal(cf_learner_freeze_to(par, -2), CF_OK);
    assert_int_equal(cf_fit_one_cycle(one, 1, .lr_max = CF_SLICE2(1e-4, 2e-3)), CF_OK);
    assert_int_equal(cf_par_fit_one_cycle(par, 1, .lr_max = CF_SLICE2(1e-4, 2e-3), .par = po),
                     CF_OK);
    assert_int_equal(one->data_epochs, 2);
    assert_int_equal(par->data_epochs, 2);
    double w = max_rel(par->model->weights, one->model->weights, one->model->n_weights, 1e-3);
    if (w > 1e-5) fail_msg("2 workers, second stage: weights differ by %.3g", w);
    cf_learner_free(one);
    cf_learner_free(par);
    cf_dls_free(dls);
}

static void test_perplexity_and_resetter(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *learn = make_learner(dls, 3, 0.2f);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(3e-3)), CF_OK);
    double v1[3], v2[3];
    assert_int_equal(cf_validate(learn, v1), CF_OK);
    assert_true(v1[0] > 0 && isfinite(v1[0]));
    /* Perplexity = exp(valid loss) */
    if (fabs(v1[2] - exp(v1[0])) > 1e-5 * exp(v1[0]))
        fail_msg("perplexity %.8g, exp(valid loss) %.8g", v1[2], exp(v1[0]));
    assert_true(v1[1] >= 0 && v1[1] <= 1);
    /* the Recorder's row: train_loss, valid_loss, accuracy, perplexity */
    assert_near(learn->recorder.values[3], exp(learn->recorder.values[1]),
                1e-5 * learn->recorder.values[3]);
    /* the resetter starts validation from a zero state: two passes agree */
    assert_int_equal(cf_validate(learn, v2), CF_OK);
    assert_near(v1[0], v2[0], 0);
    /* without it the second pass starts from the state the first left */
    assert_int_equal(cf_learner_remove_cb(learn, "ModelResetter"), 1);
    assert_int_equal(cf_validate(learn, v1), CF_OK);
    assert_int_equal(cf_validate(learn, v2), CF_OK);
    assert_true(v1[0] != v2[0]);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_encoder_round_trip(void **state) {
    (void)state;
    char dir[256];
    test_tmpdir_make(dir, sizeof dir, "cf_textlearn");
    cf_dls *dls = make_dls();
    cf_learner *a = make_learner(dls, 1, 0.1f), *b = make_learner(dls, 2, 0.1f);
    assert_int_equal(cf_fit(a, 1, .lr = CF_LR(1e-2)), CF_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/enc.safetensors", dir);
    assert_int_equal(cf_learner_save_encoder(a, path), CF_OK);
    float bias_before = cf_model_param(b->model, "1.decoder.bias")->data[0];
    assert_int_equal(cf_learner_load_encoder(b, path), CF_OK);
    for (int i = 0; i < a->model->n_params; i++) {
        const cf_param *pa = a->model->params[i], *pb = b->model->params[i];
        if (strncmp(pa->full_name, "0.", 2) != 0) continue;
        if (memcmp(pa->data, pb->data, pa->numel * sizeof(float)) != 0)
            fail_msg("%s not loaded", pa->full_name);
    }
    assert_true(cf_model_param(b->model, "1.decoder.bias")->data[0] == bias_before);
    /* frozen: only the last group (embedding + decoder) trains */
    assert_false(cf_model_param(b->model, "0.rnns.0.weight_hh_l0_raw")->trainable);
    assert_true(cf_model_param(b->model, "0.encoder.weight")->trainable);
    /* another vocabulary is refused, naming the tensor; the learner is unchanged */
    cf_text_corpus *big = make_corpus(8, 9);
    cf_text_corpus *other = NULL;
    int32_t ids[] = {2, 50, 51};
    const int32_t *docs[] = {ids};
    int64_t lens[] = {3};
    assert_int_equal(cf_text_corpus_from_docs(docs, lens, 1, 64, &other), CF_OK);
    cf_dls *dls2 = NULL;
    assert_int_equal(
        cf_text_dls_new(
            other, big,
            &(cf_text_dls_options){.bs = 1, .seq_len = 2, .is_lm = true, .prefetch = -1}, &dls2),
        CF_OK);
    cf_learner *c = make_learner(dls2, 4, 0.1f);
    float w0 = c->model->weights[0];
    assert_int_equal(cf_learner_load_encoder(c, path), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "encoder.weight"));
    assert_true(c->model->weights[0] == w0);
    cf_learner_free(c);
    cf_dls_free(dls2);
    cf_text_corpus_free(other);
    cf_text_corpus_free(big);
    cf_learner_free(a);
    cf_learner_free(b);
    cf_dls_free(dls);
    test_tmpdir_remove(dir);
}

static void test_generate(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *learn = make_learner(dls, 8, 0.0f);
    assert_int_equal(cf_fit_one_cycle(learn, 3, .lr_max = CF_LR(3e-2)), CF_OK);
    int32_t prompt[] = {CF_TEXT_BOS, 10, 11};
    int32_t *a = NULL, *b = NULL, *g = NULL;
    int64_t na = 0, nb = 0, ng = 0;
    assert_int_equal(cf_lm_generate(learn, prompt, 3, &a, &na, .n_words = 8, .seed = 1), CF_OK);
    assert_int_equal(cf_lm_generate(learn, prompt, 3, &b, &nb, .n_words = 8, .seed = 1), CF_OK);
    assert_int_equal(na, 11);
    assert_int_equal(nb, 11);
    assert_memory_equal(a, b, (size_t)na * sizeof(int32_t));
    assert_memory_equal(a, prompt, sizeof prompt);
    for (int64_t i = 3; i < na; i++) assert_true(a[i] != CF_TEXT_UNK && a[i] < VOCAB);
    /* a very low temperature picks the most probable word */
    assert_int_equal(cf_lm_generate(learn, prompt, 3, &g, &ng, .n_words = 1, .temperature = 0.01),
                     CF_OK);
    cf_rnn_reset(learn->model->root);
    float x[] = {CF_TEXT_BOS, 10, 11};
    cf_tensor in = cf_tensor_view(x, cf_shape2(1, 3));
    const cf_tensor *y = NULL;
    assert_int_equal(cf_model_forward(learn->model, &in, &y), CF_OK);
    const float *last = y->data + 2 * VOCAB;
    int best = 1;
    for (int j = 2; j < VOCAB; j++)
        if (last[j] > last[best]) best = j;
    assert_int_equal(g[3], best);
    cf_free(a);
    cf_free(b);
    cf_free(g);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* ---- text_classifier_learner ---------------------------------------------------------------- */

enum { CLAS_E = 8, CLAS_NH = 12, CLAS_L = 3, CLAS_BPTT = 4, CLAS_MAX_LEN = 8 };

/* Labelled documents: the class is the third of the vocabulary the document starts in. */
static cf_text_corpus *make_clas_corpus(int n_docs, uint64_t seed, int whole_chunks) {
    cf_text_corpus *c = make_corpus_chunked(n_docs, seed, whole_chunks);
    assert_int_equal(counting_corpus_label(c, VOCAB), CF_OK);
    return c;
}

static cf_dls *make_clas_dls_(int bs, int whole_chunks) {
    cf_text_corpus *train = make_clas_corpus(24, 21, whole_chunks),
                   *valid = make_clas_corpus(8, 22, whole_chunks);
    cf_dls *dls = NULL;
    assert_int_equal(cf_text_dls_new(train, valid,
                                     &(cf_text_dls_options){
                                         .bs = bs, .seq_len = CLAS_BPTT, .seed = 5, .prefetch = -1},
                                     &dls),
                     CF_OK);
    cf_text_corpus_free(train);
    cf_text_corpus_free(valid);
    return dls;
}

static cf_dls *make_clas_dls(int bs) {
    return make_clas_dls_(bs, 0);
}

static cf_awd_lstm_config clas_config(void) {
    cf_awd_lstm_config c = cf_awd_lstm_clas_config();
    c.emb_sz = CLAS_E;
    c.n_hid = CLAS_NH;
    c.n_layers = CLAS_L;
    return c;
}

static cf_learner *make_clas_learner(cf_dls *dls, uint64_t seed) {
    cf_awd_lstm_config config = clas_config();
    const int lin_ftrs[] = {6};
    cf_metric *metrics[] = {cf_accuracy()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_text_classifier_learner(&learn, dls, .config = &config, .seed = seed,
                                                .seq_len = CLAS_BPTT, .max_len = CLAS_MAX_LEN,
                                                .lin_ftrs = lin_ftrs, .n_lin_ftrs = 1,
                                                .quiet = true, .metrics = metrics, .n_metrics = 1),
                     CF_OK);
    return learn;
}

static void test_clas_learner_defaults_and_fit(void **state) {
    (void)state;
    cf_dls *dls = make_clas_dls(4);
    cf_learner *learn = make_clas_learner(dls, 3);
    assert_near(learn->moms[1], 0.7, 0);
    assert_int_equal(learn->loss.kind, CF_LOSS_CROSS_ENTROPY);
    assert_int_equal(learn->model->n_groups, 5);
    /* the head's first block has its dropout (output_p * drop_mult) */
    const cf_module *head = learn->model->root->children[1];
    const cf_module *drop0 = head->children[0]->children[0]->children[1];
    assert_string_equal(drop0->ops->kind, "Dropout");
    double before[2], after[2];
    assert_int_equal(cf_validate(learn, before), CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 6, .lr_max = CF_LR(3e-2)), CF_OK);
    assert_int_equal(cf_validate(learn, after), CF_OK);
    if (!(after[0] < before[0] - 0.05))
        fail_msg("valid loss %.5g after the fit, %.5g before", after[0], before[0]);
    /* gradual unfreezing: freeze_to(-2) trains the last LSTM and the head */
    assert_int_equal(cf_learner_freeze_to(learn, -2), CF_OK);
    assert_false(cf_model_param(learn->model, "0.module.rnns.1.weight_hh_l0_raw")->trainable);
    assert_true(cf_model_param(learn->model, "0.module.rnns.2.weight_hh_l0_raw")->trainable);
    assert_false(cf_model_param(learn->model, "0.module.encoder.weight")->trainable);
    assert_int_equal(cf_fit_one_cycle(learn, 1, .lr_max = CF_LR(1e-2)), CF_OK);
    cf_learner_free(learn);
    /* a language-model loader is refused */
    cf_dls *lm = make_dls();
    cf_learner *bad = NULL;
    assert_int_equal(cf_text_classifier_learner(&bad, lm), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "classifier text loader"));
    cf_dls_free(lm);
    cf_dls_free(dls);
}

/* The training batches' distinct lengths (up to 64). */
typedef struct batch_lengths {
    int n, len[64];
} batch_lengths;

static cf_status note_length(cf_callback *cb, cf_learner *learn) {
    batch_lengths *l = *(batch_lengths **)cb->state;
    if (!learn->training || !learn->batch) return CF_OK;
    const int T = learn->batch->x.shape.dim[1];
    for (int i = 0; i < l->n; i++)
        if (l->len[i] == T) return CF_OK;
    if (l->n < 64) l->len[l->n++] = T;
    return CF_OK;
}

/* A classifier's batches have as many lengths as their longest texts (SortedDL); they run
 * within the plan of the first (the longest) instead of planning the model again each batch:
 * one plan for training and one for the larger validation batches, whatever the lengths. */
static void test_clas_plans_once(void **state) {
    (void)state;
    cf_dls *dls = make_clas_dls(4);
    cf_learner *learn = make_clas_learner(dls, 3);
    static batch_lengths lengths;
    memset(&lengths, 0, sizeof lengths);
    cf_callback *cb = cf_callback_new("NoteLength", 0, sizeof(batch_lengths *));
    assert_non_null(cb);
    *(batch_lengths **)cb->state = &lengths;
    cb->on[CF_EV_BEFORE_BATCH] = note_length;
    cf_callback *cbs[] = {cb};
    assert_int_equal(cf_fit_one_cycle(learn, 2, .lr_max = CF_LR(1e-2), .cbs = cbs, .n_cbs = 1),
                     CF_OK);
    if (lengths.n < 4) fail_msg("only %d batch lengths: the test needs more", lengths.n);
    if (learn->model->n_plans > 2)
        fail_msg("%d plans for batches of %d lengths", learn->model->n_plans, lengths.n);
    assert_true(isfinite(learn->recorder.losses[learn->recorder.n_batches - 1]));
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* a multi-hot corpus takes BCEWithLogitsLossFlat */
static void test_clas_learner_multi_label(void **state) {
    (void)state;
    cf_text_corpus *train = make_corpus(12, 31), *valid = make_corpus(4, 32);
    float tt[12 * 2], tv[4 * 2];
    for (int i = 0; i < 24; i++) tt[i] = (float)(i % 3 == 0);
    for (int i = 0; i < 8; i++) tv[i] = (float)(i % 2);
    const char *classes[] = {"a", "b"};
    assert_int_equal(cf_text_corpus_set_labels(train, tt, 2, 2, classes), CF_OK);
    assert_int_equal(cf_text_corpus_set_labels(valid, tv, 2, 2, classes), CF_OK);
    cf_dls *dls = NULL;
    assert_int_equal(
        cf_text_dls_new(
            train, valid,
            &(cf_text_dls_options){.bs = 4, .seq_len = CLAS_BPTT, .seed = 1, .prefetch = -1}, &dls),
        CF_OK);
    cf_awd_lstm_config config = clas_config();
    cf_learner *learn = NULL;
    assert_int_equal(cf_text_classifier_learner(&learn, dls, .config = &config,
                                                .seq_len = CLAS_BPTT, .quiet = true),
                     CF_OK);
    assert_int_equal(learn->loss.kind, CF_LOSS_BCE_LOGITS);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    assert_true(isfinite(learn->recorder.values[0]));
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_text_corpus_free(train);
    cf_text_corpus_free(valid);
}

/* What the first training batch left: its ids, targets and loss, every chunk's masks and the
 * head's (in the oracle), and the gradients. */
typedef struct first_batch {
    oracle *o;
    bool done;
    int B, T;
    float x[64 * 64], y[64], loss;
    float *grads;
} first_batch;
static first_batch g_first;

static void record_chunk_masks(void *ctx, int chunk, const cf_module *awd) {
    first_batch *f = ctx;
    if (f->done) return;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "b0c%d", chunk);
    oracle_put_awd_masks(f->o, prefix, awd, awd->in->shape.dim[0], VOCAB, CLAS_E, CLAS_NH, CLAS_L);
}

static cf_status first_after_loss(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    first_batch *f = &g_first;
    if (f->done || !learn->training) return CF_OK;
    const cf_batch *b = learn->batch;
    f->B = b->x.shape.dim[0];
    f->T = b->x.shape.dim[1];
    assert_true(f->B * f->T <= 64 * 64 && f->B <= 64);
    memcpy(f->x, b->x.data, (size_t)f->B * f->T * sizeof(float));
    memcpy(f->y, b->y.data, (size_t)f->B * sizeof(float));
    f->loss = learn->loss_value;
    /* the head's dropout masks: its dropouts' outputs over their inputs (the BatchNorms') */
    const cf_module *layers = learn->model->root->children[1]->children[0];
    for (int i = 0; i < 2; i++) {
        const cf_module *drop = layers->children[i]->children[1];
        const cf_module *bn = layers->children[i]->children[0];
        const size_t nf = cf_tensor_numel(&drop->out);
        float *mask = malloc(nf * sizeof(float));
        for (size_t j = 0; j < nf; j++)
            mask[j] = drop->out.data[j] == 0.0f ? 0.0f : drop->out.data[j] / bn->out.data[j];
        char name[32];
        snprintf(name, sizeof name, "b0_hd%d", i);
        oracle_put(f->o, name, mask, drop->out.shape);
        free(mask);
    }
    oracle_put(f->o, "x0", f->x, cf_shape2(f->B, f->T));
    oracle_put(f->o, "t0", f->y, cf_shape1(f->B));
    return CF_OK;
}

static cf_status first_after_backward(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    first_batch *f = &g_first;
    if (f->done) return CF_OK;
    f->done = true;
    const cf_model *m = learn->model;
    size_t at = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i]->grad) {
            memcpy(f->grads + at, m->params[i]->grad, m->params[i]->numel * sizeof(float));
            at += m->params[i]->numel;
        }
    return CF_OK;
}

/* The learner's first training batch (fastai's default dropouts on) against fastai's classifier
 * in PyTorch with the same weights and masks: the loss and every gradient. */
static void test_clas_learner_batch_oracle(void **state) {
    (void)state;
    cf_dls *dls = make_clas_dls(6);
    cf_learner *learn = make_clas_learner(dls, 9);
    oracle o;
    oracle_init(&o);
    memset(&g_first, 0, sizeof g_first);
    g_first.o = &o;
    g_first.grads = malloc(learn->model->n_weights * sizeof(float));
    const cf_model *m = learn->model;
    oracle_put_params(&o, m);
    cf_module *enc = learn->model->root->children[0];
    cf_nn_sentence_encoder_on_chunk(enc, record_chunk_masks, &g_first);
    cf_callback *cb = cf_callback_new("FirstBatch", CF_ORDER_DEFAULT, 0);
    cb->on[CF_EV_AFTER_LOSS] = first_after_loss;
    cb->on[CF_EV_AFTER_BACKWARD] = first_after_backward;
    assert_int_equal(cf_learner_add_cb(learn, cb), CF_OK);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-3)), CF_OK);
    cf_nn_sentence_encoder_on_chunk(enc, NULL, NULL);
    assert_true(g_first.done);
    char args[96];
    snprintf(args, sizeof args, "clas %d %d %d %d %d %d 1 6 3", VOCAB, CLAS_E, CLAS_NH, CLAS_L,
             CLAS_BPTT, CLAS_MAX_LEN);
    oracle_run(&o, "lstm.py", args);
    cf_tensor r = oracle_get(&o, "loss0");
    assert_close("loss", &g_first.loss, r.data, 1, 1e-4, 1e-6);
    free(r.data);
    assert_grads_match_oracle(&o, m, g_first.grads);
    oracle_cleanup(&o);
    free(g_first.grads);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* load_encoder: a language model's encoder of the same vocabulary and sizes goes into the
 * classifier, which is then frozen to its head */
static void test_clas_load_encoder(void **state) {
    (void)state;
    char dir[256], path[512];
    test_tmpdir_make(dir, sizeof dir, "cf_textclas");
    snprintf(path, sizeof path, "%s/enc.safetensors", dir);
    cf_dls *lm_dls = make_dls(), *dls = make_clas_dls(4);
    cf_awd_lstm_config config = clas_config();
    cf_learner *lm = NULL;
    assert_int_equal(
        cf_language_model_learner(&lm, lm_dls, .config = &config, .seed = 2, .quiet = true), CF_OK);
    assert_int_equal(cf_fit(lm, 1, .lr = CF_LR(1e-2)), CF_OK);
    assert_int_equal(cf_learner_save_encoder(lm, path), CF_OK);
    cf_learner *clas = make_clas_learner(dls, 4);
    assert_int_equal(cf_learner_load_encoder(clas, path), CF_OK);
    for (int i = 0; i < lm->model->n_params; i++) {
        const cf_param *p = lm->model->params[i];
        if (strncmp(p->full_name, "0.", 2) != 0) continue;
        char name[300];
        snprintf(name, sizeof name, "0.module.%s", p->full_name + 2);
        const cf_param *q = cf_model_param(clas->model, name);
        if (!q) fail_msg("%s missing", name);
        if (memcmp(p->data, q->data, p->numel * sizeof(float)) != 0)
            fail_msg("%s not loaded", name);
        assert_false(q->trainable);
    }
    assert_true(cf_model_param(clas->model, "1.layers.0.2.weight")->trainable);
    assert_int_equal(cf_fit(clas, 1, .lr = CF_LR(1e-2)), CF_OK);
    /* the frozen encoder did not move */
    const cf_param *e = cf_model_param(clas->model, "0.module.encoder.weight");
    assert_memory_equal(e->data, cf_model_param(lm->model, "0.encoder.weight")->data,
                        e->numel * sizeof(float));
    assert_int_equal(cf_learner_unfreeze(clas), CF_OK);
    assert_true(e->trainable);
    cf_learner_free(clas);
    cf_learner_free(lm);
    cf_dls_free(dls);
    cf_dls_free(lm_dls);
    test_tmpdir_remove(dir);
}

/* Dropouts on (fastai's defaults): the masks are keyed to (epoch, batch, sample), so 2 and 3
 * split-batch workers (synchronised BatchNorm for the classifier's head) still equal one
 * process to 1e-5. */
static void check_par_dropout(cf_learner *(*make)(cf_dls *, uint64_t), cf_dls *dls,
                              const char *what, double floor) {
    cf_learner *one = make(dls, 13);
    assert_int_equal(cf_fit_one_cycle(one, 1, .lr_max = CF_LR(3e-3)), CF_OK);
    cf_learner *again = make(dls, 13); /* keyed masks: the same fit again is the same */
    assert_int_equal(cf_fit_one_cycle(again, 1, .lr_max = CF_LR(3e-3)), CF_OK);
    assert_memory_equal(again->model->weights, one->model->weights,
                        one->model->n_weights * sizeof(float));
    cf_learner_free(again);
    for (int world = 2; world <= 3; world++) {
        cf_learner *par = make(dls, 13);
        assert_int_equal(
            cf_par_fit_one_cycle(par, 1, .lr_max = CF_LR(3e-3),
                                 .par = {.num_cores = world, .split_batch = true, .sync_bn = true}),
            CF_OK);
        double w = max_rel(par->model->weights, one->model->weights, one->model->n_weights, floor);
        if (w > 1e-5) {
            const char *worst = "";
            double wmax = 0;
            for (int i = 0; i < one->model->n_params; i++) {
                const cf_param *pa = one->model->params[i], *pb = par->model->params[i];
                const double d = max_rel(pb->data, pa->data, pa->numel, floor);
                if (d > wmax) {
                    wmax = d;
                    worst = pa->full_name;
                }
            }
            fail_msg("%s, %d workers: weights differ by %.3g (most in %s)", what, world, w, worst);
        }
        for (int k = 0; k < one->recorder.n_epochs * one->recorder.n_values; k++) {
            double a = par->recorder.values[k], b = one->recorder.values[k];
            if (fabs(a - b) > 1e-5 * fmax(1, fabs(b)))
                fail_msg("%s, %d workers: recorder value %d is %.8g, one process %.8g", what, world,
                         k, a, b);
        }
        cf_learner_free(par);
    }
    cf_learner_free(one);
}

static cf_learner *make_lm_default_dropout(cf_dls *dls, uint64_t seed) {
    cf_awd_lstm_config config = cf_awd_lstm_lm_config(); /* fastai's dropouts */
    config.emb_sz = 12;
    config.n_hid = 20;
    config.n_layers = 2;
    cf_learner *learn = NULL;
    assert_int_equal(
        cf_language_model_learner(&learn, dls, .config = &config, .seed = seed, .quiet = true),
        CF_OK);
    return learn;
}

static cf_learner *make_clas_default_dropout(cf_dls *dls, uint64_t seed) {
    return make_clas_learner(dls, seed);
}

static void test_par_dropout_lm(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    check_par_dropout(make_lm_default_dropout, dls, "language model", 1e-3);
    cf_dls_free(dls);
}

/* Documents of whole chunks: fastai's SentenceEncoder runs the first real_bs rows of a chunk,
 * real_bs counting the rows not padded at its start, which is a prefix of the batch unless a
 * row ends in padding inside the last chunk while a shorter one does not; a rank can only count
 * its own rows, so split batches equal one process where that prefix holds (cf_sentence_encoder).
 */
static void test_par_dropout_clas(void **state) {
    (void)state;
    cf_dls *dls = make_clas_dls_(6, CLAS_BPTT);
    /* the head's first BatchNorm bias starts at 1e-3 with gradients near 0, whose rounding
     * (the replicas' sums add in another order) Adam scales up to steps of ~1e-7: compared
     * against 1e-2 at least (with SGD every weight agrees to 1e-5 relative at 1e-3) */
    check_par_dropout(make_clas_default_dropout, dls, "classifier", 1e-2);
    cf_dls_free(dls);
}

/* get_preds of a language model: one row per predicted token in stream order (row k predicts
 * stream token k + 1), each as a run over its loader row from a reset state; on 2 split-batch
 * workers the same */
static void test_get_preds_lm(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *learn = make_learner(dls, 6, 0.1f);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    cf_preds p = {0}, q = {0};
    assert_int_equal(cf_get_preds(learn, &p, .with_decoded = true, .with_loss = true), CF_OK);
    const cf_text_corpus *c = cf_text_loader_corpus(dls->valid);
    const int64_t bs = 6, bl = (c->n_tokens - 1) / bs;
    assert_int_equal(p.n, bs * bl);
    assert_int_equal(p.preds.shape.dim[1], VOCAB);
    for (int64_t k = 0; k < p.n; k++) assert_true(p.targs.data[k] == (float)c->ids[k + 1]);
    /* loader row 1 run alone from a reset state */
    float *x = malloc((size_t)bl * sizeof(float));
    for (int64_t t = 0; t < bl; t++) x[t] = (float)c->ids[bl + t];
    cf_model_train(learn->model, false);
    cf_rnn_reset(learn->model->root);
    cf_tensor in = cf_tensor_view(x, cf_shape2(1, (int)bl));
    const cf_tensor *y = NULL;
    assert_int_equal(cf_model_forward(learn->model, &in, &y), CF_OK);
    float *probs = malloc((size_t)bl * VOCAB * sizeof(float));
    cf_tensor pt = cf_tensor_view(probs, y->shape);
    cf_loss_activation(&learn->loss, y, &pt);
    assert_close("row 1", p.preds.data + bl * VOCAB, probs, (size_t)bl * VOCAB, 1e-4, 1e-6);
    for (int64_t t = 0; t < bl; t++) {
        const float *r = probs + t * VOCAB;
        int64_t best = 0;
        for (int v = 1; v < VOCAB; v++)
            if (r[v] > r[best]) best = v;
        assert_int_equal(p.decoded[bl + t], best);
        assert_near(p.losses[bl + t], -log(r[(int)c->ids[bl + t + 1]]), 1e-4);
    }
    assert_int_equal(cf_par_get_preds(learn, &q, .par = {.num_cores = 2, .split_batch = true}),
                     CF_OK);
    assert_int_equal(q.n, p.n);
    assert_close("2 workers", q.preds.data, p.preds.data, (size_t)p.n * VOCAB, 1e-5, 1e-7);
    /* inputs of varying length are refused */
    cf_preds r = {0};
    assert_int_equal(cf_get_preds(learn, &r, .with_input = true), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "with_input"));
    free(x);
    free(probs);
    cf_preds_free(&p);
    cf_preds_free(&q);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* get_preds of a classifier: document order, each as the document classified alone; on 2
 * split-batch workers the same */
static void test_get_preds_clas(void **state) {
    (void)state;
    cf_dls *dls = make_clas_dls(4);
    cf_learner *learn = make_clas_learner(dls, 8);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    cf_preds p = {0}, q = {0};
    assert_int_equal(cf_get_preds(learn, &p, .with_decoded = true), CF_OK);
    const cf_text_corpus *c = cf_text_loader_corpus(dls->valid);
    assert_int_equal(p.n, c->n_docs);
    assert_int_equal(p.preds.shape.dim[1], 3);
    cf_model_train(learn->model, false);
    for (int64_t d = 0; d < c->n_docs; d++) {
        assert_true(p.targs.data[d] == c->targets[d]);
        const int64_t len = c->offsets[d + 1] - c->offsets[d];
        float x[64], probs[3];
        for (int64_t t = 0; t < len; t++) x[t] = (float)c->ids[c->offsets[d] + t];
        cf_tensor in = cf_tensor_view(x, cf_shape2(1, (int)len));
        const cf_tensor *y = NULL;
        assert_int_equal(cf_model_forward(learn->model, &in, &y), CF_OK);
        cf_tensor pt = cf_tensor_view(probs, y->shape);
        cf_loss_activation(&learn->loss, y, &pt);
        assert_close("document", p.preds.data + d * 3, probs, 3, 1e-4, 1e-6);
    }
    assert_int_equal(cf_par_get_preds(learn, &q, .with_decoded = true,
                                      .par = {.num_cores = 2, .split_batch = true}),
                     CF_OK);
    assert_close("2 workers", q.preds.data, p.preds.data, (size_t)p.n * 3, 1e-5, 1e-7);
    assert_memory_equal(q.decoded, p.decoded, (size_t)p.n * sizeof(int64_t));
    cf_preds_free(&p);
    cf_preds_free(&q);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* The RNNRegularizer callback adds the language model's own AR/TAR gradient (the one checked
 * against PyTorch in test_lstm) to the first training batch, and reports its terms. */
static struct {
    bool done;
    int B, T;
    float x[64 * 64], y[64 * 64];
    float *grads;
    double ar, tar;
} g_reg;

static cf_status reg_capture_loss(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (g_reg.done || !learn->training) return CF_OK;
    g_reg.B = learn->batch->x.shape.dim[0];
    g_reg.T = learn->batch->x.shape.dim[1];
    memcpy(g_reg.x, learn->batch->x.data, (size_t)g_reg.B * g_reg.T * sizeof(float));
    memcpy(g_reg.y, learn->batch->y.data, (size_t)g_reg.B * g_reg.T * sizeof(float));
    return CF_OK;
}

static cf_status reg_capture_backward(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (g_reg.done) return CF_OK;
    g_reg.done = true;
    memcpy(g_reg.grads, learn->model->grads, learn->model->n_weights * sizeof(float));
    for (int i = 0; i < learn->n_cbs; i++)
        if (strcmp(learn->cbs[i]->name, "RNNRegularizer") == 0)
            assert_int_equal(cf_rnn_regularizer_terms(learn->cbs[i], &g_reg.ar, &g_reg.tar), CF_OK);
    return CF_OK;
}

static void test_rnn_regularizer_cb(void **state) {
    (void)state;
    cf_dls *dls = make_dls();
    cf_learner *a = make_learner(dls, 12, 0.0f), *b = make_learner(dls, 12, 0.0f);
    memset(&g_reg, 0, sizeof g_reg);
    g_reg.grads = malloc(a->model->n_weights * sizeof(float));
    cf_callback *cb = cf_callback_new("Capture", CF_ORDER_RECORDER, 0);
    cb->on[CF_EV_AFTER_LOSS] = reg_capture_loss;
    cb->on[CF_EV_AFTER_BACKWARD] = reg_capture_backward;
    assert_int_equal(cf_learner_add_cb(a, cb), CF_OK);
    assert_int_equal(cf_fit(a, 1, .lr = CF_LR(1e-3)), CF_OK);
    assert_true(g_reg.done);
    /* the same batch through b's model with the regularizer set by hand */
    cf_model *m = b->model;
    cf_model_train(m, true);
    cf_rnn_reset(m->root);
    cf_model_zero_grad(m);
    cf_tensor x = cf_tensor_view(g_reg.x, cf_shape2(g_reg.B, g_reg.T));
    cf_tensor t = cf_tensor_view(g_reg.y, cf_shape2(g_reg.B, g_reg.T));
    const cf_tensor *y = NULL;
    assert_int_equal(cf_model_forward(m, &x, &y), CF_OK);
    assert_near(g_reg.ar, cf_rnn_regularizer_loss(m->root, 1, 0), 1e-6);
    assert_near(g_reg.tar, cf_rnn_regularizer_loss(m->root, 0, 1), 1e-6);
    assert_true(g_reg.ar > 0 && g_reg.tar > 0);
    float *dl = malloc(cf_tensor_numel(y) * sizeof(float));
    cf_tensor dpred = cf_tensor_view(dl, y->shape);
    cf_loss_backward(&b->loss, y, &t, &dpred);
    assert_int_equal(cf_rnn_regularizer_set(m->root, 2.0f, 1.0f), CF_OK);
    assert_int_equal(cf_model_backward(m, &dpred), CF_OK);
    assert_close("grads", g_reg.grads, m->grads, m->n_weights, 1e-5, 1e-7);
    /* and without it the gradients differ */
    cf_model_zero_grad(m);
    cf_rnn_reset(m->root);
    assert_int_equal(cf_model_forward(m, &x, &y), CF_OK);
    assert_int_equal(cf_rnn_regularizer_set(m->root, 0.0f, 0.0f), CF_OK);
    assert_int_equal(cf_model_backward(m, &dpred), CF_OK);
    assert_true(max_rel(g_reg.grads, m->grads, m->n_weights, 1e-3) > 1e-3);
    free(dl);
    free(g_reg.grads);
    cf_learner_free(a);
    cf_learner_free(b);
    cf_dls_free(dls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_learner_defaults),
        cmocka_unit_test(test_par_equals_one_process),
        cmocka_unit_test(test_par_stages_equal_one_process),
        cmocka_unit_test(test_perplexity_and_resetter),
        cmocka_unit_test(test_encoder_round_trip),
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_clas_learner_defaults_and_fit),
        cmocka_unit_test(test_clas_plans_once),
        cmocka_unit_test(test_clas_learner_multi_label),
        cmocka_unit_test(test_clas_learner_batch_oracle),
        cmocka_unit_test(test_clas_load_encoder),
        cmocka_unit_test(test_par_dropout_lm),
        cmocka_unit_test(test_par_dropout_clas),
        cmocka_unit_test(test_get_preds_lm),
        cmocka_unit_test(test_get_preds_clas),
        cmocka_unit_test(test_rnn_regularizer_cb),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
