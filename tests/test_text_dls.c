/* TextDataLoaders.from_folder / from_csv with fastai's tokenizer and vocabulary on a slice of
 * Debian's fortunes (scripts/fortunes-folder): the vocabulary is make_vocab over every file's
 * tokens, the corpora's ids are what the numericalizer gives each raw text (so prediction
 * reproduces training's ids), the "<path>_tok" cache is made and reused, a given text_vocab is
 * used verbatim, is_lm makes language-model loaders; decode_spec_tokens. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "corefit/data.h"
#include "oracle.h"
#include "text_fixture.h"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    if (!have_fortunes()) return 0;
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_text_dls");
    strcat(g_dir, "/fortunes");
    return fortunes_folder(g_dir, 40) == 0 ? 0 : -1;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* Every document of the corpus equals the numericalizer's ids of its raw text. */
static void check_ids_match_raw(const cf_dls *dls, const cf_text_raw *raw, bool valid) {
    const cf_text_corpus *c = cf_text_loader_corpus(valid ? dls->valid : dls->train);
    assert_non_null(c);
    int64_t d = 0;
    for (int64_t i = 0; i < raw->n; i++) {
        if (raw->is_valid[i] != valid) continue;
        int32_t *ids = NULL;
        int64_t n = 0;
        assert_int_equal(dls->text_nz->encode(dls->text_nz->ctx, raw->texts[i], &ids, &n), CF_OK);
        assert_int_equal(n, c->offsets[d + 1] - c->offsets[d]);
        assert_int_equal(ids[0], CF_TEXT_BOS);
        assert_memory_equal(ids, c->ids + c->offsets[d], (size_t)n * sizeof(int32_t));
        if (c->target_dim == 1) assert_true(c->targets[d] == raw->targets[i]);
        cf_free(ids);
        d++;
    }
    assert_int_equal(d, c->n_docs);
}

static void test_from_folder(void **state) {
    (void)state;
    if (!have_fortunes()) skip();
    cf_dls *dls = NULL;
    cf_text_loaders_options o = {.dls = {.bs = 8}, .vocab = {.min_freq = 2}};
    assert_int_equal(cf_text_dls_from_folder(g_dir, NULL, &o, &dls), CF_OK);
    assert_non_null(dls->text_nz);
    const cf_text_vocab *v = cf_text_numericalizer_vocab(dls->text_nz);
    assert_non_null(v);
    int64_t V = cf_text_vocab_len(v);
    assert_int_equal(V % 8, 0);
    for (int i = 0; i < CF_TEXT_N_SPECIAL; i++)
        assert_string_equal(cf_text_vocab_word(v, i), cf_text_special_tokens[i]);
    assert_int_equal(dls->train_ds->n, 90);
    assert_int_equal(dls->valid_ds->n, 30);
    assert_int_equal(dls->train_ds->n_classes, 3);
    assert_false(cf_text_loader_is_lm(dls->train));

    /* the vocabulary is make_vocab over every file's tokens (validation included) */
    cf_text_raw *raw = NULL;
    assert_int_equal(cf_text_read_folder(g_dir, NULL, &raw), CF_OK);
    cf_text_counter *counts = cf_text_counter_new();
    cf_text_tokens toks = {0};
    for (int64_t i = 0; i < raw->n; i++) {
        cf_text_tokens_clear(&toks);
        assert_int_equal(
            cf_text_tokenize(raw->texts[i], strlen(raw->texts[i]), raw->where[i], NULL, &toks),
            CF_OK);
        assert_int_equal(cf_text_counter_add(counts, &toks), CF_OK);
    }
    cf_text_tokens_free(&toks);
    cf_text_vocab *want = NULL;
    assert_int_equal(cf_text_vocab_new(counts, &(cf_text_vocab_options){.min_freq = 2}, &want),
                     CF_OK);
    assert_int_equal(cf_text_vocab_len(want), V);
    for (int64_t i = 0; i < V; i++)
        assert_string_equal(cf_text_vocab_word(want, i), cf_text_vocab_word(v, i));
    cf_text_vocab_free(want);
    cf_text_counter_free(counts);
    check_ids_match_raw(dls, raw, false);
    check_ids_match_raw(dls, raw, true);

    /* the tokenized copies are in <path>_tok, one per file, and are reused */
    char cache[512];
    snprintf(cache, sizeof cache, "%s_tok", g_dir);
    assert_int_equal(count_files(cache), (int)raw->n);
    cf_dls_free(dls);
    assert_int_equal(cf_text_dls_from_folder(g_dir, NULL, &o, &dls), CF_OK);
    assert_int_equal(count_files(cache), (int)raw->n);
    check_ids_match_raw(dls, raw, false);

    /* show_batch names the tokens through the numericalizer */
    const cf_batch *b;
    assert_int_equal(cf_dataloader_begin_epoch(dls->valid, 0), CF_OK);
    assert_int_equal(cf_dataloader_next(dls->valid, &b), CF_OK);
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    assert_int_equal(cf_text_show_batch(dls->valid, b, dls->text_nz, 2, 30, f), CF_OK);
    fclose(f);
    assert_non_null(strstr(buf, "xxbos"));
    assert_null(strstr(buf, "<"));
    free(buf);
    cf_dls_free(dls);
    cf_text_raw_free(raw);
}

static void test_lm_then_classifier_vocab(void **state) {
    (void)state;
    if (!have_fortunes()) skip();
    cf_dls *lm = NULL, *clas = NULL;
    assert_int_equal(cf_text_dls_from_folder(
                         g_dir, NULL,
                         &(cf_text_loaders_options){.dls = {.bs = 4, .seq_len = 16, .is_lm = true}},
                         &lm),
                     CF_OK);
    assert_true(cf_text_loader_is_lm(lm->train));
    const cf_text_vocab *v = cf_text_numericalizer_vocab(lm->text_nz);
    /* the classifier takes the language model's vocabulary verbatim, even with another min_freq */
    cf_text_loaders_options co = {.dls = {.bs = 8}, .text_vocab = v, .vocab = {.min_freq = 1}};
    assert_int_equal(cf_text_dls_from_folder(g_dir, NULL, &co, &clas), CF_OK);
    const cf_text_vocab *w = cf_text_numericalizer_vocab(clas->text_nz);
    assert_int_equal(cf_text_vocab_len(w), cf_text_vocab_len(v));
    for (int64_t i = 0; i < cf_text_vocab_len(v); i++)
        assert_string_equal(cf_text_vocab_word(w, i), cf_text_vocab_word(v, i));
    assert_int_equal(cf_text_loader_corpus(clas->train)->vocab_size, cf_text_vocab_len(v));
    cf_dls_free(lm);
    cf_dls_free(clas);
}

static void test_from_csv(void **state) {
    (void)state;
    char dir[256], path[512];
    test_tmpdir_make(dir, sizeof dir, "cf_text_csv");
    snprintf(path, sizeof path, "%s/texts.csv", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "label,text,is_valid\n");
    for (int i = 0; i < 24; i++)
        fprintf(f, "%s,\"%s %d, isn't it? I LOVE it!!!\",%d\n", i % 2 ? "pos" : "neg",
                i % 2 ? "A good movie" : "A bad film", i, i % 4 == 0);
    fclose(f);
    cf_dls *dls = NULL;
    cf_text_csv_options c = {.text_col = "text", .valid_col = "is_valid"};
    assert_int_equal(
        cf_text_dls_from_csv(path, &c, &(cf_text_loaders_options){.dls = {.bs = 4}}, &dls), CF_OK);
    assert_int_equal(dls->train_ds->n, 18);
    assert_int_equal(dls->valid_ds->n, 6);
    assert_int_equal(dls->train_ds->n_classes, 2);
    const cf_text_vocab *v = cf_text_numericalizer_vocab(dls->text_nz);
    /* "isn't" is "is n't", "I LOVE" is "i xxup love", "!!!" is "xxrep 3 !" */
    assert_true(cf_text_vocab_id(v, "n't") > 0);
    assert_true(cf_text_vocab_id(v, "love") > 0);
    assert_true(cf_text_vocab_id(v, "good") > 0);
    assert_int_equal(cf_text_vocab_id(v, "LOVE"), CF_TEXT_UNK);
    cf_text_raw *raw = NULL;
    assert_int_equal(cf_text_read_csv(path, &c, &raw), CF_OK);
    check_ids_match_raw(dls, raw, false);
    check_ids_match_raw(dls, raw, true);
    cf_text_raw_free(raw);
    cf_dls_free(dls);
    /* a missing column names the file and the column */
    c.text_col = "review";
    assert_int_equal(cf_text_dls_from_csv(path, &c, NULL, &dls), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "review"));
    assert_non_null(strstr(cf_last_error(), "texts.csv"));
}

static void test_decode_spec_tokens(void **state) {
    (void)state;
    const char *toks[] = {"xxbos",  "xxmaj", "hello", "xxup",  "world", "xxrep", "3",    "!",
                          "xxwrep", "2",     "so",    "xxmaj", "élan",  "end",   "xxpad"};
    char *out = NULL;
    assert_int_equal(cf_text_decode_spec_tokens(toks, 15, &out), CF_OK);
    assert_string_equal(out, "Hello WORLD !!! so so Élan end");
    cf_free(out);
    const char *bad[] = {"xxrep", "x", "word"};
    assert_int_equal(cf_text_decode_spec_tokens(bad, 3, &out), CF_OK);
    assert_string_equal(out, "word");
    cf_free(out);
    assert_int_equal(cf_text_decode_spec_tokens(NULL, 0, &out), CF_OK);
    assert_string_equal(out, "");
    cf_free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_folder),
        cmocka_unit_test(test_lm_then_classifier_vocab),
        cmocka_unit_test(test_from_csv),
        cmocka_unit_test(test_decode_spec_tokens),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
