/* fastai's text application end to end on a slice of Debian's fortunes: a language model and a
 * classifier (sharing the language model's vocabulary) exported, loaded back with
 * cf_load_learner, and used on raw text: the loaded learner gives training's ids and the same
 * predictions and generated text as the learner in memory; a text of unknown words; a model
 * whose DataLoaders lack a vocabulary is refused at export. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "corefit/learn.h"
#include "oracle.h"
#include "text_fixture.h"

static char g_dir[256], g_data[300];

static int setup(void **state) {
    (void)state;
    if (!have_fortunes()) return 0;
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_text_app");
    snprintf(g_data, sizeof g_data, "%s/fortunes", g_dir);
    return fortunes_folder(g_data, 30) == 0 ? 0 : -1;
}

static cf_awd_lstm_config small(bool lm) {
    cf_awd_lstm_config c = lm ? cf_awd_lstm_lm_config() : cf_awd_lstm_clas_config();
    c.emb_sz = 16;
    c.n_hid = 24;
    c.n_layers = 2;
    return c;
}

static const char *const texts[] = {
    "The food was GREAT, and I don't know why!!!",
    "Love is a science; science is love.",
    "xyzzyq plughqq", /* unknown words only */
    "",
};

static void same_ids(const cf_text_numericalizer *a, const cf_text_numericalizer *b,
                     const char *text) {
    int32_t *x = NULL, *y = NULL;
    int64_t nx = 0, ny = 0;
    assert_int_equal(a->encode(a->ctx, text, &x, &nx), CF_OK);
    assert_int_equal(b->encode(b->ctx, text, &y, &ny), CF_OK);
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, (size_t)nx * sizeof(int32_t));
    cf_free(x);
    cf_free(y);
}

static void test_lm_export_generate(void **state) {
    (void)state;
    if (!have_fortunes()) skip();
    cf_dls *dls = NULL;
    assert_int_equal(cf_text_dls_from_folder(
                         g_data, NULL,
                         &(cf_text_loaders_options){.dls = {.bs = 4, .seq_len = 16, .is_lm = true}},
                         &dls),
                     CF_OK);
    cf_awd_lstm_config cfg = small(true);
    cf_learner *learn = NULL;
    assert_int_equal(
        cf_language_model_learner(&learn, dls, .config = &cfg, .seed = 7, .quiet = true), CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 1, .lr_max = CF_LR(1e-2)), CF_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/lm.safetensors", g_dir);
    assert_int_equal(cf_learner_export(learn, path), CF_OK);

    cf_model_info info;
    assert_int_equal(cf_model_info_read(path, &info), CF_OK);
    assert_string_equal(info.recipe.arch, "awd_lstm_lm");
    assert_string_equal(info.input, "text");
    assert_int_equal(info.emb_sz, 16);
    assert_int_equal(info.n_hid, 24);
    assert_int_equal(info.n_layers, 2);
    assert_int_equal(info.n_text_vocab,
                     cf_text_vocab_len(cf_text_numericalizer_vocab(dls->text_nz)));
    cf_model_info_free(&info);

    cf_learner *loaded = NULL;
    assert_int_equal(cf_load_learner(path, &loaded), CF_OK);
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        same_ids(dls->text_nz, loaded->dls->text_nz, texts[i]);
    for (int i = 0; i < learn->model->n_params; i++)
        assert_memory_equal(learn->model->params[i]->data, loaded->model->params[i]->data,
                            learn->model->params[i]->numel * sizeof(float));
    cf_lm_generate_opts go = {.n_words = 12, .temperature = 0.75, .seed = 5};
    char *a = NULL, *b = NULL;
    assert_int_equal(cf_lm_predict_text(learn, "The food", &go, &a), CF_OK);
    assert_int_equal(cf_lm_predict_text(loaded, "The food", &go, &b), CF_OK);
    assert_string_equal(a, b);
    /* the prompt comes back decoded (xxmaj -> capital), xxbos left out */
    assert_true(strncmp(a, "The food ", 9) == 0);
    assert_null(strstr(a, "xxbos"));
    assert_null(strstr(a, "xxunk"));
    print_message("generated: %s\n", a);
    cf_free(a);
    cf_free(b);
    /* a classifier's predict on a language model is refused */
    float p[4];
    assert_int_equal(cf_predict_text(loaded, "food", p, NULL, NULL), CF_ERR_STATE);
    cf_learner_free(loaded);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_classifier_export_predict(void **state) {
    (void)state;
    if (!have_fortunes()) skip();
    cf_dls *lm = NULL, *dls = NULL;
    assert_int_equal(
        cf_text_dls_from_folder(g_data, NULL,
                                &(cf_text_loaders_options){.dls = {.bs = 4, .is_lm = true}}, &lm),
        CF_OK);
    cf_text_loaders_options o = {.dls = {.bs = 8, .seq_len = 16},
                                 .text_vocab = cf_text_numericalizer_vocab(lm->text_nz)};
    assert_int_equal(cf_text_dls_from_folder(g_data, NULL, &o, &dls), CF_OK);
    cf_awd_lstm_config cfg = small(false);
    const int lin[] = {20};
    cf_learner *learn = NULL;
    assert_int_equal(cf_text_classifier_learner(&learn, dls, .config = &cfg, .seq_len = 16,
                                                .max_len = 64, .lin_ftrs = lin, .n_lin_ftrs = 1,
                                                .seed = 3, .quiet = true),
                     CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 1, .lr_max = CF_LR(1e-2)), CF_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/clas.safetensors", g_dir);
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    cf_learner *loaded = NULL;
    assert_int_equal(cf_load_learner(path, &loaded), CF_OK);
    assert_string_equal(loaded->recipe.arch, "awd_lstm_clas");
    assert_int_equal(loaded->recipe.text_seq_len, 16);
    assert_int_equal(loaded->recipe.text_max_len, 64);
    assert_int_equal(loaded->dls->train_ds->n_classes, 3);
    assert_string_equal(loaded->dls->train_ds->vocab[1], "love");
    /* the classifier's vocabulary is the language model's, and it travels */
    assert_int_equal(cf_text_vocab_len(cf_text_numericalizer_vocab(loaded->dls->text_nz)),
                     cf_text_vocab_len(cf_text_numericalizer_vocab(lm->text_nz)));
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        same_ids(dls->text_nz, loaded->dls->text_nz, texts[i]);
        float pa[3], pb[3];
        int da = -1, db = -2;
        int64_t ua = -1, ub = -2;
        assert_int_equal(cf_predict_text(learn, texts[i], pa, &da, &ua), CF_OK);
        assert_int_equal(cf_predict_text(loaded, texts[i], pb, &db, &ub), CF_OK);
        assert_int_equal(da, db);
        assert_int_equal(ua, ub);
        double sum = 0;
        for (int k = 0; k < 3; k++) {
            assert_true(fabsf(pa[k] - pb[k]) <= 1e-6f);
            sum += pa[k];
        }
        assert_true(fabs(sum - 1) < 1e-5);
        print_message("%-45s -> %s (%.3f), %lld unknown\n", texts[i],
                      loaded->dls->train_ds->vocab[db], pb[db], (long long)ub);
    }
    /* the text of unknown words: two xxunk after xxbos, a prediction all the same */
    float p[3];
    int64_t unknown = 0;
    assert_int_equal(cf_predict_text(loaded, texts[2], p, NULL, &unknown), CF_OK);
    assert_int_equal(unknown, 2);
    cf_learner_free(loaded);
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_dls_free(lm);
}

/* DataLoaders made from ids alone have no vocabulary to export. */
static void test_export_needs_vocab(void **state) {
    (void)state;
    int32_t doc[40];
    for (int i = 0; i < 40; i++) doc[i] = i % 16;
    const int32_t *docs[2] = {doc, doc};
    const int64_t lens[2] = {40, 30};
    cf_text_corpus *c = NULL;
    assert_int_equal(cf_text_corpus_from_docs(docs, lens, 2, 16, &c), CF_OK);
    cf_dls *dls = NULL;
    assert_int_equal(
        cf_text_dls_new(c, c, &(cf_text_dls_options){.bs = 2, .seq_len = 8, .is_lm = true}, &dls),
        CF_OK);
    cf_awd_lstm_config cfg = small(true);
    cf_learner *learn = NULL;
    assert_int_equal(cf_language_model_learner(&learn, dls, .config = &cfg, .quiet = true), CF_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/novocab.safetensors", g_dir[0] ? g_dir : "/tmp");
    assert_int_equal(cf_learner_export(learn, path), CF_ERR_STATE);
    assert_non_null(strstr(cf_last_error(), "vocabulary"));
    char *s = NULL;
    assert_int_equal(cf_lm_predict_text(learn, "hello", NULL, &s), CF_ERR_STATE);
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_text_corpus_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lm_export_generate),
        cmocka_unit_test(test_classifier_export_predict),
        cmocka_unit_test(test_export_needs_vocab),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
