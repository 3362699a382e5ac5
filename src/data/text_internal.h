/* Internals shared by the text files of the data layer (text_tokenize.c, text_tokenize_files.c,
 * text_vocab.c). */
#ifndef CF_TEXT_INTERNAL_H
#define CF_TEXT_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "corefit/data.h"

/* FNV-1a, 64 bits: hash-table keys and the cache's fingerprints (not for security). */
static inline uint64_t cf_text_fnv1a(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
#define CF_TEXT_FNV_SEED 0xcbf29ce484222325ull

/* A set of strings, each given an index in insertion order (open addressing, power-of-two
 * table of indices into `words`). */
typedef struct cf_text_strset {
    char **words;     /* owned copies, in insertion order */
    int64_t n, cap;   /* words held and allocated */
    int64_t *slots;   /* index + 1 of the word in each slot, 0 = empty */
    uint64_t n_slots; /* a power of two, at least twice n */
} cf_text_strset;

/* The index of word (len bytes) in set, or -1. */
int64_t cf_text_strset_find(const cf_text_strset *set, const char *word, size_t len);
/* The index of word, inserting a copy at the end when absent (*added says which); -1 when out
 * of memory (cf_last_error set). */
int64_t cf_text_strset_add(cf_text_strset *set, const char *word, size_t len, bool *added);
void cf_text_strset_clear(cf_text_strset *set);

struct cf_text_counter {
    cf_text_strset words;
    int64_t *counts; /* one per word */
    int64_t counts_cap;
};

/* Adds `times` to word's count (inserting it last when new: *added); its index, or -1 when out
 * of memory. */
int64_t cf_text_counter_add_word(cf_text_counter *c, const char *word, size_t len, int64_t times,
                                 bool *added);

/* Parses a cached tokenized copy (text_tokenize_files.c's format); true, with the tokens appended,
 * when it is whole and matches source, settings fingerprint and the source's size and mtime. */
bool cf_text_cache_parse(const char *data, size_t size, const char *source, uint64_t settings,
                         int64_t size_stamp, int64_t mtime_s, int64_t mtime_ns,
                         cf_text_tokens *toks);

#endif
