/* The language-model learner: parallel fits on 2 and 3 split-batch workers equal one process,
 * Perplexity = exp(valid loss), ModelResetter, save_encoder / load_encoder, generation. */
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
#include "oracle.h"

#define assert_near(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.10g, expected %.10g", #a, a_, b_);         \
    } while (0)

enum { VOCAB = 40 };

/* A corpus with structure to learn: each document counts up from a random start (mod the
 * vocabulary above the special ids), with xxbos first. */
static cf_text_corpus *make_corpus(int n_docs, uint64_t seed) {
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    int32_t *docs[64];
    int64_t lens[64];
    for (int d = 0; d < n_docs; d++) {
        lens[d] = 6 + (int64_t)(cf_rng_next(&rng) % 12);
        docs[d] = malloc((size_t)lens[d] * sizeof(int32_t));
        docs[d][0] = CF_TEXT_BOS;
        int32_t v = 3 + (int32_t)(cf_rng_next(&rng) % (VOCAB - 3));
        for (int64_t i = 1; i < lens[d]; i++) {
            docs[d][i] = v;
            v = 3 + (v - 3 + 1 + (int32_t)(cf_rng_next(&rng) % 2)) % (VOCAB - 3);
        }
    }
    cf_text_corpus *c = NULL;
    assert_int_equal(
        cf_text_corpus_from_docs((const int32_t *const *)docs, lens, n_docs, VOCAB, &c), CF_OK);
    for (int d = 0; d < n_docs; d++) free(docs[d]);
    return c;
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_learner_defaults),
        cmocka_unit_test(test_par_equals_one_process),
        cmocka_unit_test(test_perplexity_and_resetter),
        cmocka_unit_test(test_encoder_round_trip),
        cmocka_unit_test(test_generate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
