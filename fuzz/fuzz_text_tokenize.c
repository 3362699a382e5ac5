/* libFuzzer target for the text tokenizer (fastai's rules and the word splitter), the cached
 * copies' reader and the vocabulary's JSON reader. The first byte picks the options (invalid
 * UTF-8 replaced or refused, rules skipped, splitter); the rest is the text. */
#include <stdint.h>
#include <string.h>

#include "corefit/data.h"
#include "data/text_internal.h"
#include "expansion.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    cf_text_tok_options o = {.replace_invalid = mode & 1,
                             .skip_rules = (mode >> 1) & 1 ? 0x55u : 0,
                             .no_bos = (mode >> 2) & 1,
                             .add_eos = (mode >> 3) & 1,
                             .splitter =
                                 (mode >> 4) & 1 ? CF_TEXT_SPLIT_SPACES : CF_TEXT_SPLIT_SPACY};
    cf_text_tokens toks = {0};
    expansion_begin();
    if (cf_text_tokenize(text, len, "fuzz.txt", &o, &toks) == CF_OK) {
        /* rules grow a text by a bounded factor (a character -> " xxrep N c ", a '/' -> " / ")
         * and every token costs its bytes, a NUL and an offset */
        expansion_check("cf_text_tokenize", len, 256, 1 << 16);
        for (int64_t i = 0; i < toks.n; i++) {
            const char *t = cf_text_token(&toks, i);
            /* tokens are never empty with the spaCy splitter, and hold no U+0020 */
            if (o.splitter == CF_TEXT_SPLIT_SPACY && !*t) __builtin_trap();
            if (strchr(t, ' ')) __builtin_trap();
        }
        cf_text_counter *c = cf_text_counter_new();
        cf_text_vocab *v = NULL;
        if (c && cf_text_counter_add(c, &toks) == CF_OK &&
            cf_text_vocab_new(c, &(cf_text_vocab_options){.min_freq = 1}, &v) == CF_OK) {
            int64_t *ids = malloc((size_t)(toks.n + 1) * sizeof *ids);
            if (ids) {
                cf_text_numericalize(v, &toks, ids, NULL);
                /* every token of the text is in its own vocabulary (but "xxfake", which
                 * lookups ignore, as fastai's do) */
                for (int64_t i = 0; i < toks.n; i++)
                    if (strcmp(cf_text_vocab_word(v, ids[i]), cf_text_token(&toks, i)) != 0 &&
                        !(ids[i] == CF_TEXT_UNK && !strcmp(cf_text_token(&toks, i), "xxfake")))
                        __builtin_trap();
                free(ids);
            }
        }
        cf_text_vocab_free(v);
        cf_text_counter_free(c);
    }
    /* the same bytes as a cached copy and as a vocabulary */
    cf_text_tokens_clear(&toks);
    cf_text_cache_parse(text, len, "src.txt", 0x1234, 10, 20, 30, &toks);
    cf_text_vocab *v = NULL;
    if (cf_text_vocab_from_json(text, len, "fuzz.json", &v) == CF_OK) cf_text_vocab_free(v);
    cf_text_tok_options back;
    cf_text_tok_options_from_json(text, len, "fuzz.json", &back);
    cf_text_tokens_free(&toks);
    return 0;
}
