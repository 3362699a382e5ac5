/* A token corpus with structure to learn, for the text learner tests (test_text_learner.c, and
 * mpi_text.c under mpirun, without cmocka): each document counts up from a random start, by one
 * or two ids a token, modulo the vocabulary above the special ids, xxbos first. */
#ifndef CF_TEST_COUNTING_CORPUS_H
#define CF_TEST_COUNTING_CORPUS_H

#include <stdint.h>
#include <stdlib.h>

#include "corefit/core.h"
#include "corefit/data.h"

/* n_docs (<= 64) documents of a vocab-word vocabulary, drawn from seed; lengths 6 to 17, or with
 * whole_chunks > 0, 2 to 4 times whole_chunks. NULL (cf_last_error says why) when the library
 * refuses them. */
static inline cf_text_corpus *counting_corpus(int n_docs, uint64_t seed, int whole_chunks,
                                              int vocab) {
    if (n_docs > 64) return NULL;
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    int32_t *docs[64];
    int64_t lens[64];
    for (int d = 0; d < n_docs; d++) {
        const int64_t r = (int64_t)(cf_rng_next(&rng) % 12);
        lens[d] = whole_chunks ? whole_chunks * (2 + r % 3) : 6 + r;
        docs[d] = malloc((size_t)lens[d] * sizeof(int32_t));
        docs[d][0] = CF_TEXT_BOS;
        int32_t v = 3 + (int32_t)(cf_rng_next(&rng) % (uint64_t)(vocab - 3));
        for (int64_t i = 1; i < lens[d]; i++) {
            docs[d][i] = v;
            v = 3 + (v - 3 + 1 + (int32_t)(cf_rng_next(&rng) % 2)) % (vocab - 3);
        }
    }
    cf_text_corpus *c = NULL;
    if (cf_text_corpus_from_docs((const int32_t *const *)docs, lens, n_docs, vocab, &c) != CF_OK)
        c = NULL;
    for (int d = 0; d < n_docs; d++) free(docs[d]);
    return c;
}

/* Labels c's documents (<= 64) by the third of the vocabulary each starts in after xxbos:
 * classes low, mid and high. */
static inline cf_status counting_corpus_label(cf_text_corpus *c, int vocab) {
    if (c->n_docs > 64) return CF_ERR_INVALID;
    float targets[64];
    for (int64_t d = 0; d < c->n_docs; d++)
        targets[d] = (float)((c->ids[c->offsets[d] + 1] - 3) * 3 / (vocab - 3));
    const char *classes[] = {"low", "mid", "high"};
    return cf_text_corpus_set_labels(c, targets, 1, 3, classes);
}

#endif
