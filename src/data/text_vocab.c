/* Token counts and fastai's vocabulary: make_vocab, Numericalize, and the vocabulary as JSON
 * (reference/fastai-text.md section 2). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "data/text_internal.h"

/* ---- string set ------------------------------------------------------------------------ */

static uint64_t slot_of(const cf_text_strset *set, const char *word, size_t len) {
    return cf_text_fnv1a(word, len, CF_TEXT_FNV_SEED) & (set->n_slots - 1);
}

int64_t cf_text_strset_find(const cf_text_strset *set, const char *word, size_t len) {
    if (!set->n_slots) return -1;
    for (uint64_t s = slot_of(set, word, len);; s = (s + 1) & (set->n_slots - 1)) {
        int64_t k = set->slots[s];
        if (!k) return -1;
        const char *w = set->words[k - 1];
        if (strncmp(w, word, len) == 0 && w[len] == 0) return k - 1;
    }
}

static bool rehash(cf_text_strset *set, uint64_t n_slots) {
    int64_t *slots = calloc(n_slots, sizeof *slots);
    if (!slots) {
        cf_fail(CF_ERR_NOMEM, "text: out of memory for a table of %llu words",
                (unsigned long long)n_slots);
        return false;
    }
    free(set->slots);
    set->slots = slots;
    set->n_slots = n_slots;
    for (int64_t i = 0; i < set->n; i++) {
        uint64_t s = slot_of(set, set->words[i], strlen(set->words[i]));
        while (slots[s]) s = (s + 1) & (n_slots - 1);
        slots[s] = i + 1;
    }
    return true;
}

int64_t cf_text_strset_add(cf_text_strset *set, const char *word, size_t len, bool *added) {
    if (added) *added = false;
    int64_t found = cf_text_strset_find(set, word, len);
    if (found >= 0) return found;
    if ((uint64_t)(set->n + 1) * 2 > set->n_slots &&
        !rehash(set, set->n_slots ? set->n_slots * 2 : 1024))
        return -1;
    if (set->n == set->cap) {
        int64_t cap = set->cap ? set->cap * 2 : 512;
        char **w = realloc(set->words, (size_t)cap * sizeof *w);
        if (!w) {
            cf_fail(CF_ERR_NOMEM, "text: out of memory for %lld words", (long long)cap);
            return -1;
        }
        set->words = w;
        set->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        cf_fail(CF_ERR_NOMEM, "text: out of memory for a word of %zu bytes", len);
        return -1;
    }
    memcpy(copy, word, len);
    copy[len] = 0;
    set->words[set->n] = copy;
    uint64_t s = slot_of(set, word, len);
    while (set->slots[s]) s = (s + 1) & (set->n_slots - 1);
    set->slots[s] = ++set->n;
    if (added) *added = true;
    return set->n - 1;
}

void cf_text_strset_clear(cf_text_strset *set) {
    for (int64_t i = 0; i < set->n; i++) free(set->words[i]);
    free(set->words);
    free(set->slots);
    memset(set, 0, sizeof *set);
}

/* ---- counter --------------------------------------------------------------------------- */

cf_text_counter *cf_text_counter_new(void) {
    cf_text_counter *c = calloc(1, sizeof *c);
    if (!c) cf_fail(CF_ERR_NOMEM, "text: out of memory for a counter");
    return c;
}

void cf_text_counter_free(cf_text_counter *counter) {
    if (!counter) return;
    cf_text_strset_clear(&counter->words);
    free(counter->counts);
    free(counter);
}

int64_t cf_text_counter_add_word(cf_text_counter *c, const char *word, size_t len, int64_t times,
                                 bool *added) {
    int64_t i = cf_text_strset_add(&c->words, word, len, added);
    if (i < 0) return -1;
    if (i >= c->counts_cap) {
        int64_t cap = c->counts_cap ? c->counts_cap * 2 : 512;
        while (cap <= i) cap *= 2;
        int64_t *n = realloc(c->counts, (size_t)cap * sizeof *n);
        if (!n) {
            cf_fail(CF_ERR_NOMEM, "text: out of memory for %lld counts", (long long)cap);
            return -1;
        }
        memset(n + c->counts_cap, 0, (size_t)(cap - c->counts_cap) * sizeof *n);
        c->counts = n;
        c->counts_cap = cap;
    }
    c->counts[i] += times;
    return i;
}

static cf_status count_word(cf_text_counter *c, const char *word, size_t len, int64_t times) {
    return cf_text_counter_add_word(c, word, len, times, NULL) < 0 ? CF_ERR_NOMEM : CF_OK;
}

cf_status cf_text_counter_add(cf_text_counter *counter, const cf_text_tokens *toks) {
    if (!counter || !toks) return cf_fail(CF_ERR_INVALID, "cf_text_counter_add: NULL argument");
    for (int64_t i = 0; i < toks->n; i++) {
        const char *w = cf_text_token(toks, i);
        cf_status st = count_word(counter, w, strlen(w), 1);
        if (st != CF_OK) return st;
    }
    return CF_OK;
}

cf_status cf_text_counter_merge(cf_text_counter *dst, const cf_text_counter *src) {
    if (!dst || !src) return cf_fail(CF_ERR_INVALID, "cf_text_counter_merge: NULL argument");
    for (int64_t i = 0; i < src->words.n; i++) {
        const char *w = src->words.words[i];
        cf_status st = count_word(dst, w, strlen(w), src->counts[i]);
        if (st != CF_OK) return st;
    }
    return CF_OK;
}

int64_t cf_text_counter_len(const cf_text_counter *counter) {
    return counter ? counter->words.n : 0;
}
const char *cf_text_counter_word(const cf_text_counter *counter, int64_t i) {
    return counter && i >= 0 && i < counter->words.n ? counter->words.words[i] : NULL;
}
int64_t cf_text_counter_count(const cf_text_counter *counter, int64_t i) {
    return counter && i >= 0 && i < counter->words.n ? counter->counts[i] : 0;
}
int64_t cf_text_counter_get(const cf_text_counter *counter, const char *word) {
    if (!counter || !word) return 0;
    int64_t i = cf_text_strset_find(&counter->words, word, strlen(word));
    return i < 0 ? 0 : counter->counts[i];
}

/* ---- vocabulary ------------------------------------------------------------------------ */

struct cf_text_vocab {
    char **words; /* owned, id order (xxfake included) */
    int64_t n;
    cf_text_strset lookup; /* word -> index into ids */
    int64_t *ids;          /* id of lookup word i: the last id holding it */
};

void cf_text_vocab_free(cf_text_vocab *v) {
    if (!v) return;
    for (int64_t i = 0; i < v->n; i++) free(v->words[i]);
    free(v->words);
    cf_text_strset_clear(&v->lookup);
    free(v->ids);
    free(v);
}

/* Builds the lookup (fastai's o2i: every word but xxfake, a repeated word keeps its last id). */
static cf_status vocab_index(cf_text_vocab *v) {
    v->ids = malloc((size_t)(v->n ? v->n : 1) * sizeof *v->ids);
    if (!v->ids) return cf_fail(CF_ERR_NOMEM, "text: out of memory for a vocabulary's index");
    for (int64_t id = 0; id < v->n; id++) {
        if (strcmp(v->words[id], "xxfake") == 0) continue;
        int64_t k = cf_text_strset_add(&v->lookup, v->words[id], strlen(v->words[id]), NULL);
        if (k < 0) return CF_ERR_NOMEM;
        v->ids[k] = id;
    }
    return CF_OK;
}

cf_status cf_text_vocab_from_words(const char *const *words, int64_t n, cf_text_vocab **out) {
    if (!out || (!words && n) || n < 0)
        return cf_fail(CF_ERR_INVALID, "cf_text_vocab_from_words: NULL argument or n < 0");
    *out = NULL;
    cf_text_vocab *v = calloc(1, sizeof *v);
    if (!v || !(v->words = calloc((size_t)(n ? n : 1), sizeof *v->words))) {
        free(v);
        return cf_fail(CF_ERR_NOMEM, "text: out of memory for a vocabulary of %lld words",
                       (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        if (!words[i]) {
            cf_text_vocab_free(v);
            return cf_fail(CF_ERR_INVALID, "cf_text_vocab_from_words: word %lld is NULL",
                           (long long)i);
        }
        if (!(v->words[i] = strdup(words[i]))) {
            cf_text_vocab_free(v);
            return cf_fail(CF_ERR_NOMEM, "text: out of memory copying word %lld", (long long)i);
        }
        v->n = i + 1;
    }
    cf_status st = vocab_index(v);
    if (st != CF_OK) {
        cf_text_vocab_free(v);
        return st;
    }
    *out = v;
    return CF_OK;
}

typedef struct ranked {
    int64_t count, first_seen;
} ranked;

static int by_count_then_first_seen(const void *pa, const void *pb) {
    const ranked *a = pa, *b = pb;
    if (a->count != b->count) return a->count > b->count ? -1 : 1;
    return (a->first_seen > b->first_seen) - (a->first_seen < b->first_seen);
}

cf_status cf_text_vocab_new(const cf_text_counter *counts, const cf_text_vocab_options *opt,
                            cf_text_vocab **out) {
    if (!out || !counts) return cf_fail(CF_ERR_INVALID, "cf_text_vocab_new: NULL argument");
    *out = NULL;
    int64_t min_freq = opt && opt->min_freq ? opt->min_freq : 3;
    int64_t max_vocab = opt && opt->max_vocab ? opt->max_vocab : 60000;
    if (min_freq < 0 || max_vocab < 0)
        return cf_fail(CF_ERR_INVALID, "cf_text_vocab_new: min_freq %lld or max_vocab %lld < 0",
                       (long long)min_freq, (long long)max_vocab);
    int64_t n = counts->words.n;
    ranked *r = malloc((size_t)(n ? n : 1) * sizeof *r);
    /* the words, then at most max_vocab + 8 ids after the specials are placed, then xxfake */
    int64_t cap = (n < max_vocab ? n : max_vocab) + CF_TEXT_N_SPECIAL + 8;
    const char **list = malloc((size_t)cap * sizeof *list);
    if (!r || !list) {
        free(r);
        free(list);
        return cf_fail(CF_ERR_NOMEM, "text: out of memory ranking %lld words", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) r[i] = (ranked){counts->counts[i], i};
    /* most_common(max_vocab): count descending, ties in first-seen order (a stable sort) */
    qsort(r, (size_t)n, sizeof *r, by_count_then_first_seen);
    int64_t m = 0;
    for (int i = 0; i < CF_TEXT_N_SPECIAL; i++) list[m++] = cf_text_special_tokens[i];
    for (int64_t i = 0; i < n && i < max_vocab; i++) {
        if (r[i].count < min_freq) continue;
        const char *w = counts->words.words[r[i].first_seen];
        bool special = false;
        for (int k = 0; k < CF_TEXT_N_SPECIAL && !special; k++)
            special = strcmp(w, cf_text_special_tokens[k]) == 0;
        if (!special) list[m++] = w;
    }
    if (m > max_vocab) m = max_vocab; /* vocab[:max_vocab] */
    int64_t fake = 8 - m % 8;
    for (int64_t i = 0; i < fake; i++) list[m++] = "xxfake";
    cf_status st = cf_text_vocab_from_words(list, m, out);
    free(r);
    free(list);
    return st;
}

int64_t cf_text_vocab_len(const cf_text_vocab *vocab) {
    return vocab ? vocab->n : 0;
}

const char *cf_text_vocab_word(const cf_text_vocab *vocab, int64_t id) {
    return vocab && id >= 0 && id < vocab->n ? vocab->words[id] : NULL;
}

int64_t cf_text_vocab_id(const cf_text_vocab *vocab, const char *word) {
    if (!vocab || !word) return CF_TEXT_UNK;
    int64_t k = cf_text_strset_find(&vocab->lookup, word, strlen(word));
    return k < 0 ? CF_TEXT_UNK : vocab->ids[k];
}

void cf_text_numericalize(const cf_text_vocab *vocab, const cf_text_tokens *toks, int64_t *ids,
                          int64_t *n_unknown) {
    int64_t unknown = 0;
    for (int64_t i = 0; toks && i < toks->n; i++) {
        const char *w = cf_text_token(toks, i);
        int64_t k = vocab ? cf_text_strset_find(&vocab->lookup, w, strlen(w)) : -1;
        ids[i] = k < 0 ? CF_TEXT_UNK : vocab->ids[k];
        unknown += k < 0;
    }
    if (n_unknown) *n_unknown = unknown;
}

cf_status cf_text_vocab_to_json(const cf_text_vocab *vocab, char **json) {
    if (!vocab || !json) return cf_fail(CF_ERR_INVALID, "cf_text_vocab_to_json: NULL argument");
    *json = NULL;
    cJSON *arr = cJSON_CreateArray();
    bool ok = arr != NULL;
    for (int64_t i = 0; ok && i < vocab->n; i++) {
        cJSON *s = cJSON_CreateString(vocab->words[i]);
        ok = s && cJSON_AddItemToArray(arr, s);
    }
    char *text = ok ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    if (!text) return cf_fail(CF_ERR_NOMEM, "text: out of memory writing a vocabulary as JSON");
    *json = cf_strdup(text);
    cJSON_free(text);
    return *json ? CF_OK : CF_ERR_NOMEM;
}

cf_status cf_text_vocab_from_json(const char *json, size_t len, const char *source,
                                  cf_text_vocab **out) {
    const char *src = source ? source : "vocabulary";
    if (!json || !out) return cf_fail(CF_ERR_INVALID, "cf_text_vocab_from_json: NULL argument");
    *out = NULL;
    cJSON *arr = cJSON_ParseWithLength(json, len);
    if (!arr) return cf_fail(CF_ERR_FORMAT, "%s: the vocabulary is not JSON", src);
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(arr);
        return cf_fail(CF_ERR_FORMAT, "%s: the vocabulary is not a JSON array", src);
    }
    int64_t n = cJSON_GetArraySize(arr), i = 0;
    const char **words = malloc((size_t)(n ? n : 1) * sizeof *words);
    if (!words) {
        cJSON_Delete(arr);
        return cf_fail(CF_ERR_NOMEM, "text: out of memory for %lld words", (long long)n);
    }
    cf_status st = CF_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!cJSON_IsString(e)) {
            st = cf_fail(CF_ERR_FORMAT, "%s: vocabulary element %lld is not a string", src,
                         (long long)i);
            break;
        }
        words[i++] = e->valuestring;
    }
    if (st == CF_OK) st = cf_text_vocab_from_words(words, n, out);
    free(words);
    cJSON_Delete(arr);
    return st;
}
