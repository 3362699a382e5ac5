/* Dropout's keyed rows (cf_dropout_keyed_row in corefit/tensor.h), written once in plain C and
 * compiled into each vector kernel table with its instruction set (kernels.c's copy, at the
 * baseline, serves the tables without one). The draws are integer arithmetic and the product is
 * one multiply a value, so every table gives the same bytes and bits. */
#ifndef COREFIT_DROPOUT_LOOPS_H
#define COREFIT_DROPOUT_LOOPS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The mask first, then the product, in two loops over the row: each vectorises on its own (the
 * 64-bit hash 8 lanes wide at AVX-512, where vpmullq multiplies them), and the row is in L1 for
 * the second. */
static void loops_dropout_keyed_row(uint64_t row, size_t per, uint64_t threshold, float scale,
                                    const float *restrict x, uint8_t *restrict mask,
                                    float *restrict y) {
    const size_t pairs = per / 2;
    for (size_t j = 0; j < pairs; j++) {
        uint64_t z = row + (uint64_t)(j + 1) * 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        mask[2 * j] = (z & 0xffffffffu) >= threshold;
        mask[2 * j + 1] = (z >> 32) >= threshold;
    }
    if (per & 1) {
        uint64_t z = row + (uint64_t)(pairs + 1) * 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        mask[per - 1] = (z & 0xffffffffu) >= threshold;
    }
    for (size_t i = 0; i < per; i++) { /* mask ? x * scale : +0, by the product's bits */
        const float v = x[i] * scale;
        uint32_t b;
        memcpy(&b, &v, sizeof b);
        b &= 0u - (uint32_t)mask[i];
        memcpy(&y[i], &b, sizeof b);
    }
}

#endif
