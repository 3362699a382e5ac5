/* For the tests that run bf16 convolution layers through two copies of the kernel table and
 * compare bit for bit (test_bf16_kept, test_bf16_ne_paths, test_bf16_wgrad_runs): the copies
 * (bf16_tables_copy), and one layer's case (bf16_layer_case): the geometry (k x k, stride s, pad
 * (k - 1) / 2; k = 1 is the 1x1 stride-2 shortcut alone, unpadded), with a paired 1x1 stride-2
 * shortcut of so outputs where so > 0; x, the weights, dy and the shortcut's weights and dy
 * filled from seeds seed .. seed + 4; both packs and the scratch. */
#ifndef CF_TESTS_BF16_LAYER_FIXTURE_H
#define CF_TESTS_BF16_LAYER_FIXTURE_H

#include "oracle.h"

#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <stdio.h>
#include <stdlib.h>

/* Two copies of the active kernel table for comparing a level's bf16 entries with what runs
 * without them: *plain and *counting, each pointing at its own copy of the bf16 part, which the
 * caller then edits (entries taken out of plain_bf16, wrapped to count their calls in
 * counting_bf16). False, and says so, where the level has no bf16 convolution. */
static inline bool bf16_tables_copy(const cf_kernel_table **active, cf_kernel_table *plain,
                                    cf_kernel_table *counting, cf_bf16_kernels *plain_bf16,
                                    cf_bf16_kernels *counting_bf16) {
    *active = cf_active_kernels;
    const cf_bf16_kernels *k = (*active)->bf16;
    if (!k || !k->conv_run) {
        printf("level %s: no bf16 convolution, nothing to compare\n", cf_isa_name((*active)->isa));
        return false;
    }
    *plain = *counting = **active;
    *plain_bf16 = *counting_bf16 = *k;
    plain->bf16 = plain_bf16;
    counting->bf16 = counting_bf16;
    return true;
}

typedef struct bf16_layer_case {
    cf_conv_geom g, sg; /* the layer's and its shortcut's (sg only where so > 0) */
    int n, o, so;
    size_t nx, ny, nw, nsy, nsw;
    float *x, *wt, *dy, *sw, *sdy; /* sw and sdy: nsw + 1 and nsy + 1 values (none may be 0) */
    float *pk, *spk, *scratch;     /* spk: NULL without a shortcut */
} bf16_layer_case;

static inline void bf16_layer_case_init(bf16_layer_case *t, int n, int c, int h, int w, int o,
                                        int k, int stride, int so, uint64_t seed) {
    const int pad = k == 1 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&t->g, c, h, w, k, k, stride, stride, pad, pad));
    assert_true(cf_conv_bf16_supported(&t->g, o));
    if (so) {
        assert_true(cf_conv_geom_init(&t->sg, c, h, w, 1, 1, 2, 2, 0, 0));
        assert_true(cf_conv_bf16_pair_fits(&t->g, o, &t->sg, so));
    }
    t->n = n, t->o = o, t->so = so;
    t->nx = (size_t)n * c * h * w, t->ny = (size_t)n * o * t->g.oh * t->g.ow;
    t->nw = (size_t)o * c * k * k, t->nsy = (size_t)n * so * t->g.oh * t->g.ow;
    t->nsw = (size_t)so * c;
    t->x = malloc(t->nx * sizeof(float)), t->wt = malloc(t->nw * sizeof(float));
    t->dy = malloc(t->ny * sizeof(float)), t->sw = malloc((t->nsw + 1) * sizeof(float));
    t->sdy = malloc((t->nsy + 1) * sizeof(float));
    fill_uniform(t->x, t->nx, seed, -2, 2);
    fill_uniform(t->wt, t->nw, seed + 1, -1, 1);
    fill_uniform(t->dy, t->ny, seed + 2, -1, 1);
    fill_uniform(t->sw, t->nsw + 1, seed + 3, -1, 1);
    fill_uniform(t->sdy, t->nsy + 1, seed + 4, -1, 1);
    t->pk = malloc(cf_conv_bf16_packed_floats(&t->g, o) * sizeof(float));
    t->spk = so ? malloc(cf_conv_bf16_packed_floats(&t->sg, so) * sizeof(float)) : NULL;
    t->scratch = malloc(cf_conv_bf16_scratch(&t->g, o) * sizeof(float));
    cf_conv_bf16_pack(&t->g, o, t->wt, t->pk);
    if (so) cf_conv_bf16_pack(&t->sg, so, t->sw, t->spk);
}

static inline void bf16_layer_case_free(bf16_layer_case *t) {
    free(t->x), free(t->wt), free(t->dy), free(t->sw), free(t->sdy);
    free(t->pk), free(t->spk), free(t->scratch);
}

#endif
