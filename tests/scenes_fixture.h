/* Segmentation scenes for the U-Net learner tests: small, learnable in a few steps. */
#ifndef CF_TEST_SCENES_FIXTURE_H
#define CF_TEST_SCENES_FIXTURE_H

#include <stdlib.h>

#include "corefit.h"
#include "oracle.h"

enum { S = 24, N_CODES = 3 };

/* n scenes of S x S: a bright 6x6 square (class 1) and a dim 8x3 bar (class 2) at random places
 * on a dark background (class 0); the image's pixels say the class with noise. */
static inline cf_dataset *scenes(int n, uint64_t seed) {
    float *x = malloc(sizeof(float) * n * S * S), *y = calloc((size_t)n * S * S, sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) {
        float *m = y + (size_t)i * S * S;
        const int l = (int)cf_rng_below(&rng, S - 6), t = (int)cf_rng_below(&rng, S - 6);
        for (int r = t; r < t + 6; r++)
            for (int c = l; c < l + 6; c++) m[r * S + c] = 1;
        const int bl = (int)cf_rng_below(&rng, S - 8), bt = (int)cf_rng_below(&rng, S - 3);
        for (int r = bt; r < bt + 3; r++)
            for (int c = bl; c < bl + 8; c++) m[r * S + c] = 2;
        for (int p = 0; p < S * S; p++)
            x[(size_t)i * S * S + p] = (m[p] == 1   ? 0.9f
                                        : m[p] == 2 ? 0.5f
                                                    : 0.1f) +
                                       0.1f * (float)cf_rng_uniform(&rng);
    }
    cf_dataset *ds = NULL;
    assert_int_equal(
        cf_dataset_from_arrays(x, y, n, cf_shape_make(3, (int[]){1, S, S}), S * S, N_CODES, &ds),
        CF_OK);
    ds->masks = true;
    free(x);
    free(y);
    return ds;
}

#endif
