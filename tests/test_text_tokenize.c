/* The text rules and word splitter against tests/text_oracle.py (the same regular expressions
 * in Python's re), on awkward strings and on real text (Debian's fortunes); bad input; the
 * settings' JSON round trip. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "corefit/data.h"
#include "oracle.h"

#define FORTUNES_DIR "/usr/share/games/fortunes"

static const char *const awkward[] = {
    "I LOVED it...  Don't miss!!!<br />",
    "This movie was GREAT!!! I'M SHOUTING. I think so.",
    "&lt;b&gt;bold&lt;/b&gt; &amp;amp; &quot;quoted&quot; &#39;single&#39; &nbsp;x &#36;5",
    "&eacute;t&eacute; &copy;2024 &#233; &#x263A; &#150; &#0; &#13; &#1; &#xD800; &#99999999;",
    "&ampx &ltfoo &bogus; &AMP; &COPY; &; &# &#x; caf&eacute",
    "Line one<br /><br />Line two\\nLine three \\\"quoted\\\" <unk> a @.@ b @-@ c",
    "cooool sooo goooood 1000000 !!!??? ...... ---- ____",
    "ah ah ah ah, ok. ha ha ha! no no no no no yes yes yes",
    "ah ah ahi the the the the-end is is is isn't so so so",
    "word word\nword word\tword word",
    "  Leading and trailing spaces   and    runs  ",
    "don't can't won't isn't ain't I'm you're they've we'd she'll it's Bob's let's",
    "I’m don’t it’s rock’n’roll gonna gotta wanna cannot Cannot",
    "Mr. Smith met Dr. Jones at 10 a.m. on Jan. 5th, i.e. early; e.g. the U.S. and L.A.P.D.",
    "It costs $3,000.50 or 1.5 million (approx.) -- 2+2=4, 3*4, 10-20 and 5^2; 50% off!",
    "http://www.example.com/path?q=1&r=2 and https://x.org/a/b#frag, mail bob@example.com.",
    "feel-good well—known self~made a,b,c x:y 12:30 a<b c>d e=f well… then",
    "(parenthetical) [brackets] {braces} <angles> \"double\" 'single' `back` «guillemets»",
    "Emoji 😀😀😀 great😀 👍👍 ❤️ ™ © °C 2°",
    "Café naïve résumé Ångström ÉCOLE École SOPHIE Sophie",
    "ΣΟΦΟΣ ΟΔΟΣ Σ ΑΣ Ὀδυσσεύς Москва МОСКВА Straße İstanbul",
    "日本語のテキスト。中文文本，还有标点！ 한국어 텍스트 عربى עברית",
    "Windows line\r\nends\r\nhere\ttabs\t\tdouble\vvertical\fform",
    "NBSP\xc2\xa0here and\xe2\x80\x83"
    "em space and\xe2\x80\xa8"
    "line sep",
    "ALL CAPS WITH-DASH AND DIGITS123 A1 B2B X.Y. O'NEIL McDonald iPhone",
    "/slashes/ #hashtag back\\slash C# C++ 1/2",
    "\"Hello,\" she said. \"Goodbye!\" (Really?) 'Yes.' [sic]",
    "a \n b \n\n c  \t d",
    "repeated words WORDS WORDS WORDS and Words Words Words end",
    "x x x",
    "",
    "   ",
    "...",
    "A",
    "xxbos xxmaj already tokenized xxunk",
};

/* Writes the texts to path, separated by "\n\x1e\n" as text_oracle.py reads them. */
static void write_texts(const char *path, const char *const *texts, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        if (i) fputs("\n\x1e\n", f);
        fputs(texts[i], f);
    }
    fclose(f);
}

/* Runs text_oracle.py mode on path; returns its output, one JSON value a line. */
static char *run_oracle(const char *mode, const char *path) {
    char cmd[2048], out[1024];
    snprintf(out, sizeof out, "%s.%s.out", path, mode);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/text_oracle.py %s %s > %s", CF_SOURCE_DIR,
             mode, path, out);
    assert_int_equal(system(cmd), 0);
    void *data;
    size_t size;
    assert_int_equal(cf_read_file(out, (size_t)1 << 30, &data, &size), CF_OK);
    return data;
}

static void compare_with_oracle(const char *const *texts, size_t n, const char *tag) {
    char dir[512], path[600];
    test_tmpdir_make(dir, sizeof dir, "text_tok");
    snprintf(path, sizeof path, "%s/%s.txt", dir, tag);
    write_texts(path, texts, n);
    char *rules = run_oracle("rules", path), *tokens = run_oracle("tokens", path);
    char *rl = rules, *tl = tokens;
    size_t mismatches = 0;
    cf_text_tokens toks = {0};
    for (size_t i = 0; i < n; i++) {
        char *rn = strchr(rl, '\n'), *tn = strchr(tl, '\n');
        assert_non_null(rn);
        assert_non_null(tn);
        *rn = 0;
        *tn = 0;
        cJSON *want_rules = cJSON_Parse(rl), *want_toks = cJSON_Parse(tl);
        assert_true(cJSON_IsString(want_rules));
        assert_true(cJSON_IsArray(want_toks));
        char *got;
        size_t got_len;
        assert_int_equal(cf_text_apply_rules(texts[i], strlen(texts[i]), tag, NULL, &got, &got_len),
                         CF_OK);
        if (strcmp(got, want_rules->valuestring) != 0 && mismatches++ < 5)
            print_error("%s text %zu rules:\n  got  %s\n  want %s\n", tag, i, got,
                        want_rules->valuestring);
        cf_free(got);
        cf_text_tokens_clear(&toks);
        assert_int_equal(cf_text_tokenize(texts[i], strlen(texts[i]), tag, NULL, &toks), CF_OK);
        bool same = toks.n == cJSON_GetArraySize(want_toks);
        for (int64_t k = 0; same && k < toks.n; k++)
            same = strcmp(cf_text_token(&toks, k),
                          cJSON_GetArrayItem(want_toks, (int)k)->valuestring) == 0;
        if (!same && mismatches++ < 5) {
            char *w = cJSON_PrintUnformatted(want_toks);
            print_error("%s text %zu tokens:\n  want %s\n  got ", tag, i, w);
            for (int64_t k = 0; k < toks.n; k++) print_error("[%s] ", cf_text_token(&toks, k));
            print_error("\n");
            free(w);
        }
        cJSON_Delete(want_rules);
        cJSON_Delete(want_toks);
        rl = rn + 1;
        tl = tn + 1;
    }
    cf_text_tokens_free(&toks);
    cf_free(rules);
    cf_free(tokens);
    test_tmpdir_remove(dir);
    if (mismatches) print_error("%zu mismatches in %zu texts\n", mismatches, n);
    assert_int_equal(mismatches, 0);
}

static void test_awkward_strings(void **state) {
    (void)state;
    compare_with_oracle(awkward, sizeof awkward / sizeof *awkward, "awkward");
}

/* The quotations of a fortune file (separated by lines holding only '%'). */
static size_t read_fortunes(const char *name, char ***texts) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", FORTUNES_DIR, name);
    void *data;
    size_t size;
    if (cf_read_file(path, (size_t)1 << 26, &data, &size) != CF_OK) return 0;
    size_t n = 0, cap = 64;
    *texts = malloc(cap * sizeof **texts);
    char *s = data;
    while (*s) {
        char *end = strstr(s, "\n%\n");
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (n == cap) *texts = realloc(*texts, (cap *= 2) * sizeof **texts);
        (*texts)[n++] = strndup(s, len);
        s += len + (end ? 3 : 0);
    }
    cf_free(data);
    return n;
}

static void test_fortunes_match_oracle(void **state) {
    (void)state;
    const char *files[] = {"computers", "people", "literature"};
    int used = 0;
    for (size_t f = 0; f < 3; f++) {
        char **texts;
        size_t n = read_fortunes(files[f], &texts);
        if (!n) continue;
        used++;
        compare_with_oracle((const char *const *)texts, n, files[f]);
        for (size_t i = 0; i < n; i++) free(texts[i]);
        free(texts);
    }
    if (!used) skip(); /* fortunes not installed (scripts/install-deps installs it) */
}

static void test_reference_example(void **state) {
    (void)state;
    const char *text = "I LOVED it...  Don't miss!!!<br />";
    const char *want[] = {"xxbos", "i",    "xxup",  "loved", "it", "\xe2\x80\xa6", "xxmaj", "do",
                          "n't",   "miss", "xxrep", "3",     "!"};
    cf_text_tokens toks = {0};
    assert_int_equal(cf_text_tokenize(text, strlen(text), "example", NULL, &toks), CF_OK);
    assert_int_equal(toks.n, sizeof want / sizeof *want);
    for (int64_t i = 0; i < toks.n; i++) assert_string_equal(cf_text_token(&toks, i), want[i]);
    /* tokenizing appends */
    assert_int_equal(cf_text_tokenize("Hi", 2, "x", NULL, &toks), CF_OK);
    assert_int_equal(toks.n, sizeof want / sizeof *want + 3); /* xxbos xxmaj hi */
    assert_string_equal(cf_text_token(&toks, toks.n - 1), "hi");
    cf_text_tokens_free(&toks);
}

static void test_options(void **state) {
    (void)state;
    cf_text_tokens toks = {0};
    cf_text_tok_options o = {.no_bos = true, .add_eos = true};
    assert_int_equal(cf_text_tokenize("Hello World", 11, "x", &o, &toks), CF_OK);
    assert_int_equal(toks.n, 5);
    assert_string_equal(cf_text_token(&toks, 0), "xxmaj");
    assert_string_equal(cf_text_token(&toks, 4), "xxeos");
    /* skipping every rule leaves the text as it is; the spaces splitter splits on ' ' only */
    cf_text_tokens_clear(&toks);
    o = (cf_text_tok_options){.skip_rules = (1u << CF_TEXT_N_RULES) - 1,
                              .splitter = CF_TEXT_SPLIT_SPACES};
    assert_int_equal(cf_text_tokenize("Don't  STOP", 11, "x", &o, &toks), CF_OK);
    assert_int_equal(toks.n, 3);
    assert_string_equal(cf_text_token(&toks, 0), "Don't");
    assert_string_equal(cf_text_token(&toks, 1), "");
    assert_string_equal(cf_text_token(&toks, 2), "STOP");
    cf_text_tokens_free(&toks);
    o = (cf_text_tok_options){.skip_rules = 1u << 9};
    assert_int_equal(cf_text_tokenize("x", 1, "x", &o, &toks), CF_ERR_INVALID);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    cf_text_tokens toks = {0};
    const char bad[] = "caf\xc3 ok \xff";
    assert_int_equal(cf_text_tokenize(bad, sizeof bad - 1, "reviews/12.txt", NULL, &toks),
                     CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "reviews/12.txt"));
    assert_non_null(strstr(cf_last_error(), "byte offset 3"));
    assert_non_null(strstr(cf_last_error(), "0xc3"));
    const char nul[] = "bin\0ary";
    assert_int_equal(cf_text_tokenize(nul, sizeof nul - 1, "blob", NULL, &toks), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "byte offset 3"));
    assert_non_null(strstr(cf_last_error(), "NUL"));
    /* overlong encodings and surrogates are not UTF-8 either */
    const char overlong[] = "\xc0\xaf", surrogate[] = "\xed\xa0\x80";
    assert_int_equal(cf_text_tokenize(overlong, 2, "o", NULL, &toks), CF_ERR_FORMAT);
    assert_int_equal(cf_text_tokenize(surrogate, 3, "s", NULL, &toks), CF_ERR_FORMAT);
    /* asked for: replaced by U+FFFD */
    cf_text_tok_options o = {.replace_invalid = true};
    assert_int_equal(cf_text_tokenize(bad, sizeof bad - 1, "r", &o, &toks), CF_OK);
    /* U+FFFD is a symbol (So), split off like an emoji */
    assert_int_equal(toks.n, 5);
    assert_string_equal(cf_text_token(&toks, 1), "caf");
    assert_string_equal(cf_text_token(&toks, 2), "\xef\xbf\xbd");
    assert_string_equal(cf_text_token(&toks, 4), "\xef\xbf\xbd");
    cf_text_tokens_free(&toks);
}

static void assert_same_options(const cf_text_tok_options *a, const cf_text_tok_options *b) {
    assert_int_equal(a->skip_rules, b->skip_rules);
    assert_int_equal(a->no_bos, b->no_bos);
    assert_int_equal(a->add_eos, b->add_eos);
    assert_int_equal(a->replace_invalid, b->replace_invalid);
    assert_int_equal(a->splitter, b->splitter);
}

static void test_settings_json(void **state) {
    (void)state;
    cf_text_tok_options o = {.skip_rules = 1u << CF_TEXT_REPLACE_WREP,
                             .add_eos = true,
                             .replace_invalid = true,
                             .splitter = CF_TEXT_SPLIT_SPACES},
                        back;
    char *json;
    assert_int_equal(cf_text_tok_options_to_json(&o, &json), CF_OK);
    assert_non_null(strstr(json, "\"fix_html\""));
    assert_null(strstr(json, "replace_wrep"));
    assert_int_equal(cf_text_tok_options_from_json(json, strlen(json), "m", &back), CF_OK);
    assert_same_options(&o, &back);
    cf_free(json);
    assert_int_equal(cf_text_tok_options_to_json(NULL, &json), CF_OK);
    assert_int_equal(cf_text_tok_options_from_json(json, strlen(json), "m", &back), CF_OK);
    cf_text_tok_options zero = {0};
    assert_same_options(&zero, &back);
    cf_free(json);
    const char *bad[] = {
        "[1]",
        "{\"tokenizer\":\"other\",\"version\":1}",
        "{\"tokenizer\":\"corefit-spacy-en\",\"version\":1,\"splitter\":\"spacy\","
        "\"rules\":[\"lowercase\",\"fix_html\"],\"add_bos\":true,\"add_eos\":false,"
        "\"replace_invalid\":false}",
        "{\"tokenizer\":\"corefit-spacy-en\",\"version\":1,\"splitter\":\"spacy\","
        "\"rules\":[],\"add_bos\":1,\"add_eos\":false,\"replace_invalid\":false}",
        "{not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(cf_text_tok_options_from_json(bad[i], strlen(bad[i]), "model.cf", &back),
                         CF_ERR_FORMAT);
        assert_non_null(strstr(cf_last_error(), "model.cf"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_example),     cmocka_unit_test(test_awkward_strings),
        cmocka_unit_test(test_fortunes_match_oracle), cmocka_unit_test(test_options),
        cmocka_unit_test(test_invalid_utf8),          cmocka_unit_test(test_settings_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
