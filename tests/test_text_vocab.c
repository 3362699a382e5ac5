/* fastai's vocabulary against tests/text_oracle.py (collections.Counter + make_vocab) on a
 * real corpus (Debian's fortunes), Numericalize and the JSON round trip; the corpus tokenized
 * on several threads and its cache of tokenized copies. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "corefit/data.h"
#include "oracle.h"

#define FORTUNES_DIR "/usr/share/games/fortunes"
static const char *const fortune_files[] = {"computers", "food", "love", "science", "people"};
#define N_FILES 5

static char tmpdir[512];
static char paths[N_FILES][600];

static int setup(void **state) {
    (void)state;
    for (int i = 0; i < N_FILES; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s", FORTUNES_DIR, fortune_files[i]);
        if (access(paths[i], R_OK) != 0) return 0; /* the tests needing fortunes skip */
    }
    return 0;
}

static bool have_fortunes(void) {
    return access(paths[N_FILES - 1], R_OK) == 0;
}

static const char *const *path_list(void) {
    static const char *list[N_FILES];
    for (int i = 0; i < N_FILES; i++) list[i] = paths[i];
    return list;
}

/* The oracle's vocabulary for the corpus's tokens. */
static cJSON *oracle_vocab(const cf_text_tok_files *c, int64_t min_freq, int64_t max_vocab) {
    char tokfile[700], out[720], cmd[2048];
    snprintf(tokfile, sizeof tokfile, "%s/corpus.tok", tmpdir);
    snprintf(out, sizeof out, "%s/vocab.json", tmpdir);
    FILE *f = fopen(tokfile, "wb");
    assert_non_null(f);
    cf_text_tokens toks = {0};
    for (int64_t i = 0; i < c->n; i++) {
        cf_text_tokens_clear(&toks);
        assert_int_equal(cf_text_tok_files_tokens(c, i, &toks), CF_OK);
        assert_int_equal(toks.n, c->lens[i]);
        for (int64_t k = 0; k < toks.n; k++)
            fwrite(cf_text_token(&toks, k), 1, strlen(cf_text_token(&toks, k)) + 1, f);
    }
    cf_text_tokens_free(&toks);
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/text_oracle.py vocab %s %lld %lld > %s",
             CF_SOURCE_DIR, tokfile, (long long)min_freq, (long long)max_vocab, out);
    assert_int_equal(system(cmd), 0);
    void *data;
    size_t size;
    assert_int_equal(cf_read_file(out, (size_t)1 << 28, &data, &size), CF_OK);
    cJSON *v = cJSON_Parse(data);
    cf_free(data);
    assert_true(cJSON_IsArray(v));
    return v;
}

static void assert_vocab_equals(const cf_text_vocab *v, const cJSON *want) {
    assert_int_equal(cf_text_vocab_len(v), cJSON_GetArraySize(want));
    int64_t i = 0;
    const cJSON *w;
    cJSON_ArrayForEach(w, want) {
        if (strcmp(cf_text_vocab_word(v, i), w->valuestring) != 0)
            fail_msg("vocab id %lld: got [%s], want [%s]", (long long)i, cf_text_vocab_word(v, i),
                     w->valuestring);
        i++;
    }
}

static void test_vocab_matches_make_vocab(void **state) {
    (void)state;
    if (!have_fortunes()) skip();
    test_tmpdir_make(tmpdir, sizeof tmpdir, "text_vocab");
    char cache[700];
    snprintf(cache, sizeof cache, "%s/fortunes_tok", tmpdir);
    cf_text_tok_files *c;
    assert_int_equal(cf_text_tokenize_files(path_list(), N_FILES,
                                            &(cf_text_tok_files_options){.cache_dir = cache}, &c),
                     CF_OK);
    /* min_freq / max_vocab: the defaults; everything (ties in first-seen order all the way
     * down); a max_vocab that cuts through a run of ties; one that is a multiple of 8 */
    const int64_t settings[][2] = {{3, 60000}, {1, 1000000}, {2, 777}, {1, 64}};
    for (size_t s = 0; s < sizeof settings / sizeof *settings; s++) {
        cJSON *want = oracle_vocab(c, settings[s][0], settings[s][1]);
        cf_text_vocab *v;
        assert_int_equal(cf_text_vocab_new(c->counts,
                                           &(cf_text_vocab_options){settings[s][0], settings[s][1]},
                                           &v),
                         CF_OK);
        assert_vocab_equals(v, want);
        assert_int_equal(cf_text_vocab_len(v) % 8, 0);
        assert_string_equal(cf_text_vocab_word(v, cf_text_vocab_len(v) - 1), "xxfake");
        for (int k = 0; k < CF_TEXT_N_SPECIAL; k++)
            assert_string_equal(cf_text_vocab_word(v, k), cf_text_special_tokens[k]);
        cJSON_Delete(want);
        cf_text_vocab_free(v);
    }
    cf_text_tok_files_free(c);
    test_tmpdir_remove(tmpdir);
}

static cf_text_counter *count_words(const char *const *words, int n) {
    cf_text_counter *c = cf_text_counter_new();
    cf_text_tokens t = {0};
    for (int i = 0; i < n; i++)
        assert_int_equal(cf_text_tokens_push(&t, words[i], strlen(words[i])), CF_OK);
    assert_int_equal(cf_text_counter_add(c, &t), CF_OK);
    cf_text_tokens_free(&t);
    return c;
}

static void test_vocab_rules(void **state) {
    (void)state;
    /* b and a tie at 3 (b seen first), c has 2, xxmaj 3 (a special: moved to id 8) */
    const char *words[] = {"b", "xxmaj", "a", "b", "a", "c", "xxmaj", "b", "a", "c", "xxmaj"};
    cf_text_counter *c = count_words(words, 11);
    assert_int_equal(cf_text_counter_len(c), 4);
    assert_string_equal(cf_text_counter_word(c, 0), "b");
    assert_int_equal(cf_text_counter_get(c, "a"), 3);
    assert_int_equal(cf_text_counter_get(c, "zzz"), 0);
    cf_text_vocab *v;
    assert_int_equal(cf_text_vocab_new(c, NULL, &v), CF_OK);
    /* 9 specials + b + a = 11 -> padded with 5 xxfake to 16 */
    assert_int_equal(cf_text_vocab_len(v), 16);
    assert_string_equal(cf_text_vocab_word(v, 9), "b");
    assert_string_equal(cf_text_vocab_word(v, 10), "a");
    assert_string_equal(cf_text_vocab_word(v, 11), "xxfake");
    assert_null(cf_text_vocab_word(v, 16));
    assert_int_equal(cf_text_vocab_id(v, "a"), 10);
    assert_int_equal(cf_text_vocab_id(v, "c"), CF_TEXT_UNK); /* below min_freq */
    assert_int_equal(cf_text_vocab_id(v, "xxfake"), CF_TEXT_UNK);
    assert_int_equal(cf_text_vocab_id(v, "xxpad"), CF_TEXT_PAD);
    cf_text_tokens t = {0};
    assert_int_equal(cf_text_tokenize("B and A, c!", 11, "x", NULL, &t), CF_OK);
    int64_t ids[16], unknown;
    cf_text_numericalize(v, &t, ids, &unknown);
    /* xxbos b and xxup a , c ! ("B" is one letter: no marker; "A," has no a-z: xxup) */
    const int64_t want[] = {2, 9, 0, 7, 10, 0, 0, 0};
    assert_int_equal(t.n, 8);
    for (int i = 0; i < 8; i++) assert_int_equal(ids[i], want[i]);
    assert_int_equal(unknown, 4);
    /* JSON round trip */
    char *json;
    assert_int_equal(cf_text_vocab_to_json(v, &json), CF_OK);
    cf_text_vocab *back;
    assert_int_equal(cf_text_vocab_from_json(json, strlen(json), "m", &back), CF_OK);
    assert_int_equal(cf_text_vocab_len(back), 16);
    for (int64_t i = 0; i < 16; i++)
        assert_string_equal(cf_text_vocab_word(back, i), cf_text_vocab_word(v, i));
    int64_t ids2[16];
    cf_text_numericalize(back, &t, ids2, NULL);
    assert_memory_equal(ids, ids2, sizeof(int64_t) * 8);
    cf_free(json);
    cf_text_vocab_free(back);
    /* max_vocab cuts after the specials are placed: 10 -> 10 words + 6 xxfake */
    cf_text_vocab_free(v);
    assert_int_equal(cf_text_vocab_new(c, &(cf_text_vocab_options){.max_vocab = 10}, &v), CF_OK);
    assert_int_equal(cf_text_vocab_len(v), 16);
    assert_string_equal(cf_text_vocab_word(v, 9), "b");
    assert_string_equal(cf_text_vocab_word(v, 10), "xxfake");
    cf_text_vocab_free(v);
    /* exactly a multiple of 8 still gets 8 xxfake (fastai: 8 - len % 8) */
    assert_int_equal(cf_text_vocab_new(c, &(cf_text_vocab_options){.max_vocab = 8}, &v), CF_OK);
    assert_int_equal(cf_text_vocab_len(v), 16);
    assert_string_equal(cf_text_vocab_word(v, 7), "xxup");
    assert_string_equal(cf_text_vocab_word(v, 8), "xxfake");
    cf_text_vocab_free(v);
    cf_text_counter_free(c);
    cf_text_tokens_free(&t);
    /* a given vocabulary is verbatim; a repeated word keeps its last id */
    const char *given[] = {"xxunk", "hello", "world", "hello"};
    assert_int_equal(cf_text_vocab_from_words(given, 4, &v), CF_OK);
    assert_int_equal(cf_text_vocab_len(v), 4);
    assert_int_equal(cf_text_vocab_id(v, "hello"), 3);
    cf_text_vocab_free(v);
    /* bad JSON */
    const char *bad[] = {"{\"a\":1}", "[\"a\", 2]", "[\"a\"", ""};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(cf_text_vocab_from_json(bad[i], strlen(bad[i]), "export.cf", &v),
                         CF_ERR_FORMAT);
        assert_non_null(strstr(cf_last_error(), "export.cf"));
        assert_null(v);
    }
    assert_non_null(strstr(
        (cf_text_vocab_from_json(bad[1], strlen(bad[1]), "e", &v), cf_last_error()), "element 1"));
}

static void assert_same_counts(const cf_text_counter *a, const cf_text_counter *b) {
    assert_int_equal(cf_text_counter_len(a), cf_text_counter_len(b));
    for (int64_t i = 0; i < cf_text_counter_len(a); i++) {
        assert_string_equal(cf_text_counter_word(a, i), cf_text_counter_word(b, i));
        assert_int_equal(cf_text_counter_count(a, i), cf_text_counter_count(b, i));
    }
}

static void test_corpus_cache_and_threads(void **state) {
    (void)state;
    if (!have_fortunes()) skip();
    test_tmpdir_make(tmpdir, sizeof tmpdir, "text_cache");
    /* copies of the sources, so that one can be touched */
    char src[N_FILES][700], cache[700], cmd[2048];
    const char *list[N_FILES];
    for (int i = 0; i < N_FILES; i++) {
        snprintf(src[i], sizeof src[i], "%s/%s.txt", tmpdir, fortune_files[i]);
        snprintf(cmd, sizeof cmd, "cp %.700s %.700s", paths[i], src[i]);
        assert_int_equal(system(cmd), 0);
        list[i] = src[i];
    }
    snprintf(cache, sizeof cache, "%s/tok", tmpdir);
    /* one thread without a cache: the reference */
    cf_text_tok_files *ref, *c;
    assert_int_equal(
        cf_text_tokenize_files(list, N_FILES, &(cf_text_tok_files_options){.num_workers = 1}, &ref),
        CF_OK);
    /* serial counts over the files in order equal the corpus's */
    cf_text_counter *serial = cf_text_counter_new();
    cf_text_tokens t = {0};
    for (int i = 0; i < N_FILES; i++) {
        cf_text_tokens_clear(&t);
        assert_int_equal(cf_text_tok_files_tokens(ref, i, &t), CF_OK);
        assert_int_equal(cf_text_counter_add(serial, &t), CF_OK);
    }
    assert_same_counts(serial, ref->counts);
    /* three threads, cache made */
    cf_text_tok_files_options o = {.cache_dir = cache, .num_workers = 3};
    assert_int_equal(cf_text_tokenize_files(list, N_FILES, &o, &c), CF_OK);
    assert_int_equal(c->n_reused, 0);
    assert_same_counts(ref->counts, c->counts);
    cf_text_tok_files_free(c);
    /* again: every copy reused, same counts and lengths */
    assert_int_equal(cf_text_tokenize_files(list, N_FILES, &o, &c), CF_OK);
    assert_int_equal(c->n_reused, N_FILES);
    assert_same_counts(ref->counts, c->counts);
    assert_memory_equal(ref->lens, c->lens, sizeof(int64_t) * N_FILES);
    cf_text_tok_files_free(c);
    /* a source changed (appended to: new size and mtime): that file only is tokenized again */
    FILE *f = fopen(src[1], "ab");
    fputs("%\nA BRAND NEW QUOTATION.\n", f);
    fclose(f);
    assert_int_equal(cf_text_tokenize_files(list, N_FILES, &o, &c), CF_OK);
    assert_int_equal(c->n_reused, N_FILES - 1);
    assert_int_equal(cf_text_counter_get(c->counts, "quotation"),
                     cf_text_counter_get(ref->counts, "quotation") + 1);
    {
        void *data;
        size_t size;
        cf_text_tokens direct = {0};
        assert_int_equal(cf_read_file(src[1], (size_t)1 << 26, &data, &size), CF_OK);
        assert_int_equal(cf_text_tokenize(data, size, src[1], NULL, &direct), CF_OK);
        assert_int_equal(c->lens[1], direct.n);
        assert_true(direct.n > ref->lens[1]);
        cf_free(data);
        cf_text_tokens_free(&direct);
    }
    cf_text_tok_files_free(c);
    /* other settings: nothing reused */
    o.tok.add_eos = true;
    assert_int_equal(cf_text_tokenize_files(list, N_FILES, &o, &c), CF_OK);
    assert_int_equal(c->n_reused, 0);
    assert_int_equal(cf_text_counter_get(c->counts, "xxeos"), N_FILES);
    cf_text_tok_files_free(c);
    o.tok.add_eos = false;
    /* a damaged copy is made again, and gives the same tokens */
    snprintf(cmd, sizeof cmd, "for f in %s/*.tok; do head -c 100 $f > $f.x && mv $f.x $f; done",
             cache);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(cf_text_tokenize_files(list, N_FILES, &o, &c), CF_OK);
    assert_int_equal(c->n_reused, 0);
    assert_int_equal(c->lens[0], ref->lens[0]);
    cf_text_tok_files_free(c);
    /* a missing file and a file that is not UTF-8: errors naming them */
    snprintf(src[2], sizeof src[2], "%s/missing.txt", tmpdir);
    assert_int_equal(cf_text_tokenize_files(list, N_FILES, &o, &c), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), "missing.txt"));
    assert_null(c);
    f = fopen(src[2], "wb");
    fputs("fine text \xfe more", f);
    fclose(f);
    assert_int_equal(cf_text_tokenize_files(list, N_FILES, &o, &c), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "missing.txt: byte offset 10"));
    cf_text_tokens_free(&t);
    cf_text_counter_free(serial);
    cf_text_tok_files_free(ref);
    test_tmpdir_remove(tmpdir);
}

static void test_tokenize_texts(void **state) {
    (void)state;
    const char *texts[] = {"Hello there!", "I DON'T know.", "", "x y z", "ok ok ok ok"};
    size_t lens[5];
    for (int i = 0; i < 5; i++) lens[i] = strlen(texts[i]);
    cf_text_tokens *per;
    cf_text_counter *counts;
    assert_int_equal(cf_text_tokenize_texts(texts, lens, NULL, 5, NULL, &per, &counts), CF_OK);
    cf_text_counter *serial = cf_text_counter_new();
    for (int i = 0; i < 5; i++) {
        cf_text_tokens one = {0};
        assert_int_equal(cf_text_tokenize(texts[i], lens[i], "t", NULL, &one), CF_OK);
        assert_int_equal(per[i].n, one.n);
        for (int64_t k = 0; k < one.n; k++)
            assert_string_equal(cf_text_token(&per[i], k), cf_text_token(&one, k));
        cf_text_counter_add(serial, &one);
        cf_text_tokens_free(&one);
        cf_text_tokens_free(&per[i]);
    }
    assert_same_counts(serial, counts);
    assert_int_equal(cf_text_counter_get(counts, "xxbos"), 5);
    cf_free(per);
    cf_text_counter_free(counts);
    cf_text_counter_free(serial);
    /* an invalid text is named */
    texts[3] = "bad \xc0 byte";
    lens[3] = strlen(texts[3]);
    const char *sources[] = {"r0", "r1", "r2", "row 3 of reviews.csv", "r4"};
    assert_int_equal(cf_text_tokenize_texts(texts, lens, sources, 5, NULL, &per, NULL),
                     CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "row 3 of reviews.csv: byte offset 4"));
    assert_null(per);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_rules),
        cmocka_unit_test(test_tokenize_texts),
        cmocka_unit_test(test_vocab_matches_make_vocab),
        cmocka_unit_test(test_corpus_cache_and_threads),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
