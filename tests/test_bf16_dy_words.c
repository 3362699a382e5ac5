/* Conv2d -> BatchNorm2d backward linked through bf16 words (nn_internal.h): where the
 * convolution's backward reads its dy only as bf16 words, the BatchNorm after it writes bf16(dx)
 * (cf_bn_planes_dx_bf16) in place of its fp32 dx, and the convolution builds its rows from them
 * (cf_conv_bf16_backward_words). Everything must stay bitwise what the unlinked layers compute.
 *
 * - the kernels: cf_bn_planes_dx_bf16 against cf_bn_planes_dx then PyTorch's rounding (scalar C)
 *   on special values (subnormals, NaNs, ties, infinities), with and without the fused ReLU,
 *   planes shorter and longer than its chunk; cf_conv_bf16_backward_words (dy in fp32 not given)
 *   against cf_conv_bf16_backward_kept on W1's layers (stride 2 with a paired shortcut, stride 1
 *   over conv_cols, the 1x1 stride-2 layer, dx asked or not), dy holding special values; its
 *   refusals (no weight gradient, a layer that does not take dy words);
 * - models in training over several steps on 1 and 2 threads: a Sequential conv-BN-ReLU-conv-BN
 *   (a stride-1 stem of 8 channels that does not take words, a stride-2 and a stride-1 layer that
 *   do), the same starting at a linked conv asked for no dx, and W1's body (the stem in fp32,
 *   two residual blocks as W1's): outputs, input gradients and every parameter gradient bitwise
 *   those with the link switched off, and the link taken exactly at the layers expected (each
 *   BatchNorm says it wrote words, each convolution that it read them) and nowhere else: not the
 *   idpath's first conv, not in eval mode, not with a wrapped convolution (before or after the
 *   plan), not where the convolutions are fp32;
 * - stride 2's dx stored straight into dx's rows (conv_spread) against the phase planes and their
 *   interleave, memcmp-equal, and against double sums of the rounded products.
 * Under every CF_ISA cap (avx2 and avx512 have no bf16 convolution: the link stays off, results
 * as the fp32 paths give them) and over the amx emulation. */
#include "oracle.h"

#include "corefit/nn.h"
#include "corefit/tensor.h"
#include "nn/nn_internal.h"
#include "tensor/kernel_table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* PyTorch's round_to_nearest_even (c10/util/BFloat16.h), a NaN made quiet. */
static uint16_t bf16_ref(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if (x != x) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static void same_bits(const float *a, const float *b, size_t n, const char *what, const char *of) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("%s: %s[%zu] linked %.9g, unlinked %.9g", what, of, i, (double)a[i],
                     (double)b[i]);
}

/* ---- the BatchNorm pass ------------------------------------------------------------------- */

static void test_bn_dx_words(void **state) {
    (void)state;
    static const int64_t sizes[] = {1, 7, 16, 49, 196, 511, 512, 513, 784, 1100};
    enum { NC = 3, MOST = 1100 * NC };
    static float dy[MOST], x[MOST], dx[MOST];
    static uint16_t words[MOST + 8];
    fill_bf16_specials(dy, MOST, 31);
    fill_uniform(x, MOST, 32, -3, 3);
    /* constants that put some dx among the subnormals, ties and overflows too */
    const float mean[NC] = {0.25f, -0.5f, 0.0f}, k1[NC] = {1.5f, -0.75f, 1e-38f},
                k2[NC] = {0.125f, 3e-39f, -2.0f}, k3[NC] = {-1e-3f, 0.5f, 1e-39f},
                scale[NC] = {1.0f, -2.0f, 0.5f}, shift[NC] = {0.1f, 0.3f, -0.2f};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int nc = 1; nc <= NC; nc++)
            for (int relu = 0; relu < 2; relu++) {
                const int64_t s = sizes[i];
                const size_t n = (size_t)s * nc;
                cf_bn_planes_dx(dy, x, dx, s, nc, mean, k1, k2, k3, relu, scale, shift, 0);
                memset(words, 0xa5, sizeof words);
                cf_bn_planes_dx_bf16(dy, x, words, s, nc, mean, k1, k2, k3, relu, scale, shift, 0);
                for (size_t j = 0; j < n; j++)
                    if (words[j] != bf16_ref(dx[j]))
                        fail_msg("planes of %lld x %d (relu %d): word %zu %04x, bf16(dx) %04x "
                                 "(dx %a)",
                                 (long long)s, nc, relu, j, words[j], bf16_ref(dx[j]),
                                 (double)dx[j]);
                if (words[n] != 0xa5a5)
                    fail_msg("planes of %lld x %d: a word written past them", (long long)s, nc);
            }
}

/* The larger of a and b, NaN if either is (fmax would drop it): a NaN fails the checks after. */
static double nan_max(double a, double b) {
    return a >= b || a != a ? a : b;
}

/* ---- the convolution's entry ---------------------------------------------------------------- */

/* A layer's data for the backward entries: x, the weights, dy (and its words), a paired
 * shortcut's weights and dy (so outputs; 1x1 stride 2), x's kept words, the packed weights and
 * the scratch. specials: dy holds subnormals and ties (no NaN, infinity or overflow); else
 * uniform. Seeds seed .. seed + 4. */
typedef struct layer_data {
    cf_conv_geom sg;
    size_t nx, ny, nw, nsy, nsw;
    float *x, *wt, *dy, *sw, *sdy, *pk, *spk, *scratch;
    uint16_t *dyh, *xk, *sdyh;
} layer_data;

static void layer_data_make(layer_data *d, const cf_conv_geom *g, int n, int c, int h, int o, int k,
                            int so, uint64_t seed, bool specials) {
    if (so) assert_true(cf_conv_geom_init(&d->sg, c, h, h, 1, 1, 2, 2, 0, 0));
    d->nx = (size_t)n * c * h * h, d->ny = (size_t)n * o * g->oh * g->ow;
    d->nw = (size_t)o * c * k * k, d->nsy = (size_t)n * so * g->oh * g->ow;
    d->nsw = (size_t)so * c + 1;
    d->x = malloc(d->nx * 4), d->wt = malloc(d->nw * 4), d->dy = malloc(d->ny * 4);
    d->sw = malloc(d->nsw * 4), d->sdy = malloc((d->nsy + 1) * 4);
    d->dyh = malloc(d->ny * 2), d->xk = malloc(d->nx * 2), d->sdyh = malloc((d->nsy + 1) * 2);
    fill_uniform(d->x, d->nx, seed, -2, 2);
    fill_uniform(d->wt, d->nw, seed + 1, -1, 1);
    if (specials) {
        fill_bf16_specials(d->dy, d->ny, seed + 2);
        for (size_t i = 0; i < d->ny; i++)
            if (!(fabsf(d->dy[i]) < 1e4f)) d->dy[i] = i % 2 ? 3.0e-39f : -1.5f;
    } else {
        fill_uniform(d->dy, d->ny, seed + 2, -1, 1);
    }
    fill_uniform(d->sw, d->nsw, seed + 3, -1, 1);
    fill_uniform(d->sdy, d->nsy + 1, seed + 4, -1, 1);
    for (size_t i = 0; i < d->ny; i++) d->dyh[i] = bf16_ref(d->dy[i]);
    for (size_t i = 0; i < d->nsy; i++) d->sdyh[i] = bf16_ref(d->sdy[i]);
    cf_fp32_to_bf16(d->x, d->xk, d->nx);
    d->pk = malloc(cf_conv_bf16_packed_floats(g, o) * 4);
    d->spk = so ? malloc(cf_conv_bf16_packed_floats(&d->sg, so) * 4) : NULL;
    d->scratch = malloc(cf_conv_bf16_scratch(g, o) * 4);
    cf_conv_bf16_pack(g, o, d->wt, d->pk);
    if (so) cf_conv_bf16_pack(&d->sg, so, d->sw, d->spk);
}

static void layer_data_free(layer_data *d) {
    free(d->x), free(d->wt), free(d->dy), free(d->sw), free(d->sdy), free(d->dyh), free(d->sdyh);
    free(d->xk), free(d->pk), free(d->spk), free(d->scratch);
}

/* A layer (k x k, stride s, pad (k - 1) / 2; k = 1: the 1x1 stride-2 one) of c -> o channels on
 * h x h, n images, a paired shortcut of so outputs: cf_conv_bf16_backward_words from bf16(dy)
 * bitwise cf_conv_bf16_backward_kept from dy, with dx and without. */
static void check_layer(int n, int c, int h, int o, int k, int stride, int so) {
    cf_conv_geom g;
    const int pad = k == 1 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, stride, stride, pad, pad));
    char what[96];
    snprintf(what, sizeof what, "%dx%d/%d %d->%d (shortcut %d) on %dx%d, %d images", k, k, stride,
             c, o, so, h, h, n);
    if (!cf_conv_bf16_supported(&g, o)) {
        assert_false(cf_bf16_compute());
        assert_false(cf_conv_bf16_takes_dy_words(&g, o));
        return;
    }
    if (!cf_conv_bf16_takes_dy_words(&g, o)) { /* stride 1 where the level has no conv_cols */
        assert_true(stride == 1 && !cf_active_kernels->bf16->conv_cols);
        printf("%s: no dy words at level %s (no conv_cols)\n", what,
               cf_isa_name(cf_active_kernels->isa));
        return;
    }
    layer_data d;
    layer_data_make(&d, &g, n, c, h, o, k, so, 41, true);
    float *const x = d.x, *const dy = d.dy, *const sdy = d.sdy, *const pk = d.pk,
                 *const spk = d.spk, *const scratch = d.scratch;
    uint16_t *const dyh = d.dyh, *const xk = d.xk, *const sdyh = d.sdyh;
    const size_t nx = d.nx, nw = d.nw, nsw = d.nsw;
    const bool keeps = cf_conv_bf16_keeps_input(&g, o);
    /* words: dy's (own), the shortcut's, or both; with dx and without */
    for (int words = 1; words <= (so ? 3 : 1); words++)
        for (int with_dx = 1; with_dx >= 0; with_dx--) {
            const bool own = words & 1, shortcut = words & 2;
            char of[64];
            snprintf(of, sizeof of, "%s%s%s", own ? "dy words" : "dy fp32",
                     shortcut ? ", shortcut words" : "", with_dx ? "" : ", no dx");
            float *dw[2], *dx[2], *sdw[2];
            for (int i = 0; i < 2; i++) {
                dw[i] = malloc(nw * 4), dx[i] = malloc(nx * 4), sdw[i] = malloc(nsw * 4);
                for (size_t j = 0; j < nw; j++) dw[i][j] = 1e30f; /* overwritten */
                for (size_t j = 0; j < nx; j++) dx[i][j] = 7.0f;
                memset(sdw[i], 0, nsw * 4);
                /* the words' fp32 pointers NULL: never read */
                cf_conv_shortcut sdw_sc = {.out_channels = so,
                                           .w = spk,
                                           .dy = i == 0 && shortcut ? NULL : sdy,
                                           .dw = sdw[i]},
                                 sdx_sc = sdw_sc;
                const cf_conv_shortcut *a = so ? &sdw_sc : NULL,
                                       *b = so && with_dx ? &sdx_sc : NULL;
                if (i == 0)
                    assert_int_equal(cf_conv_bf16_backward_words(
                                         &g, o, pk, own ? NULL : dy, own ? dyh : NULL, x,
                                         keeps ? xk : NULL, n, dw[i], with_dx ? dx[i] : NULL,
                                         scratch, a, b, shortcut ? sdyh : NULL),
                                     CF_OK);
                else
                    assert_int_equal(cf_conv_bf16_backward_kept(&g, o, pk, dy, x, keeps ? xk : NULL,
                                                                n, dw[i], with_dx ? dx[i] : NULL,
                                                                scratch, a, b),
                                     CF_OK);
            }
            char w2[256];
            snprintf(w2, sizeof w2, "%s, %s", what, of);
            same_bits(dw[0], dw[1], nw, w2, "dW");
            same_bits(dx[0], dx[1], nx, w2, "dx");
            same_bits(sdw[0], sdw[1], nsw, w2, "the shortcut's dW");
            double largest = 0, slargest = 0;
            for (size_t j = 0; j < nw; j++) largest = nan_max(largest, fabs(dw[0][j]));
            for (size_t j = 0; j + 1 < nsw; j++) slargest = nan_max(slargest, fabs(sdw[0][j]));
            assert_true(largest > 0.1); /* the sums are there */
            assert_true(!so || slargest > 0.1);
            for (int i = 0; i < 2; i++) free(dw[i]), free(dx[i]), free(sdw[i]);
        }
    /* refused: no weight gradient, no dy, the shortcut's words without its weight gradient */
    float *dxr = malloc(nx * 4);
    assert_int_equal(cf_conv_bf16_backward_words(&g, o, pk, NULL, dyh, x, NULL, n, NULL, dxr,
                                                 scratch, NULL, NULL, NULL),
                     CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "weight gradient"));
    assert_int_equal(cf_conv_bf16_backward_words(&g, o, pk, NULL, NULL, x, NULL, n, dxr, dxr,
                                                 scratch, NULL, NULL, NULL),
                     CF_ERR_INVALID);
    assert_int_equal(cf_conv_bf16_backward_words(&g, o, pk, NULL, dyh, x, NULL, n, dxr, dxr,
                                                 scratch, NULL, NULL, sdyh),
                     CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "dw_shortcut"));
    free(dxr);
    layer_data_free(&d);
}

static void test_conv_words(void **state) {
    (void)state;
    check_layer(5, 16, 28, 32, 3, 2, 32); /* W1's layers, the blocks' pairs, partial blocks */
    check_layer(9, 32, 14, 32, 3, 1, 0);
    check_layer(5, 32, 14, 64, 3, 2, 64);
    check_layer(17, 64, 7, 64, 3, 1, 0);
    check_layer(5, 16, 28, 32, 1, 2, 0); /* the 1x1 stride-2 layer alone */
    check_layer(3, 8, 10, 12, 3, 2, 11); /* odd channels and shortcut */
    check_layer(3, 24, 14, 40, 3, 1, 0); /* stride 1 over conv_cols, 17..64 input channels */
    /* layers that do not take words: a compact one, stride 1 outside conv_cols */
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, 128, 4, 4, 3, 3, 1, 1, 1, 1));
    assert_false(cf_conv_bf16_takes_dy_words(&g, 128));
    assert_true(cf_conv_geom_init(&g, 8, 12, 12, 3, 3, 1, 1, 1, 1));
    assert_false(cf_conv_bf16_takes_dy_words(&g, 16));
    if (cf_conv_bf16_supported(&g, 16)) {
        const size_t nx = 2 * 8 * 144, ny = 2 * 16 * 144;
        float *buf = calloc(nx + ny + cf_conv_bf16_scratch(&g, 16) + 16 * 8 * 9 * 4, 4);
        uint16_t *words = calloc(ny, 2);
        float *pk = malloc(cf_conv_bf16_packed_floats(&g, 16) * 4);
        cf_conv_bf16_pack(&g, 16, buf, pk);
        assert_int_equal(cf_conv_bf16_backward_words(&g, 16, pk, NULL, words, buf, NULL, 2,
                                                     buf + nx, NULL, buf + nx + ny, NULL, NULL,
                                                     NULL),
                         CF_ERR_INVALID);
        assert_non_null(strstr(cf_last_error(), "cf_conv_bf16_takes_dy_words"));
        free(buf), free(words), free(pk);
    }
}

/* The weight gradient with and without its fetch of the next image's words
 * (cf__conv_bf16_set_wgrad_prefetch), and with the fetch but not across the backward's blocks
 * (cf__conv_bf16_set_wgrad_fetch_next): dW, dx and the shortcut's dW memcmp-equal, through the
 * words (x kept, dy and the shortcut's dy as words) where the layer takes them, else through
 * cf_conv_bf16_backward_kept (x kept, dy in fp32). across 1: the shape spans several of the
 * weight gradient's blocks, so the fetch across them must have run (and only when on); 0: one
 * block, it must not; -1: not asserted. */
static void check_fetch_across(int n, int c, int h, int o, int k, int stride, int so, int across) {
    cf_conv_geom g;
    const int pad = k == 1 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, stride, stride, pad, pad));
    if (!cf_conv_bf16_supported(&g, o)) return;
    const bool words = cf_conv_bf16_takes_dy_words(&g, o);
    layer_data d;
    layer_data_make(&d, &g, n, c, h, o, k, so, 51, false);
    float *const x = d.x, *const dy = d.dy, *const sdy = d.sdy, *const pk = d.pk,
                 *const spk = d.spk, *const scratch = d.scratch;
    uint16_t *const dyh = d.dyh, *const xk = d.xk, *const sdyh = d.sdyh;
    const size_t nx = d.nx, nw = d.nw, nsw = d.nsw;
    const uint16_t *kept = cf_conv_bf16_keeps_input(&g, o) ? xk : NULL;
    char what[128];
    snprintf(what, sizeof what, "%dx%d/%d %d->%d (shortcut %d) on %dx%d, %d images, %s", k, k,
             stride, c, o, so, h, h, n, words ? "dy words" : "dy fp32");
    float *dw[3], *dx[3], *sdw[3];
    for (int i = 0; i < 3; i++) { /* on, off, on but not across the blocks */
        cf__conv_bf16_set_wgrad_prefetch(i != 1);
        cf__conv_bf16_set_wgrad_fetch_next(i != 2);
        const unsigned long next_before = cf__conv_bf16_wgrad_next_fetches();
        dw[i] = malloc(nw * 4), dx[i] = malloc(nx * 4), sdw[i] = malloc(nsw * 4);
        memset(sdw[i], 0, nsw * 4);
        cf_conv_shortcut sdw_sc = {.out_channels = so, .w = spk, .dy = sdy, .dw = sdw[i]},
                         sdx_sc = sdw_sc;
        const cf_conv_shortcut *a = so ? &sdw_sc : NULL, *b = so ? &sdx_sc : NULL;
        if (words)
            assert_int_equal(cf_conv_bf16_backward_words(&g, o, pk, NULL, dyh, x, kept, n, dw[i],
                                                         dx[i], scratch, a, b, so ? sdyh : NULL),
                             CF_OK);
        else
            assert_int_equal(
                cf_conv_bf16_backward_kept(&g, o, pk, dy, x, kept, n, dw[i], dx[i], scratch, a, b),
                CF_OK);
        const bool ran = cf__conv_bf16_wgrad_next_fetches() != next_before;
        if (across >= 0 && ran != (across == 1 && i == 0))
            fail_msg("%s: fetch across the blocks ran %d in mode %d", what, ran, i);
    }
    cf__conv_bf16_set_wgrad_prefetch(true);
    cf__conv_bf16_set_wgrad_fetch_next(true);
    for (int i = 1; i < 3; i++) {
        const char *how = i == 1 ? "on / off" : "on / not across the blocks";
        char of[80];
        snprintf(of, sizeof of, "dW (fetch %s)", how);
        same_bits(dw[0], dw[i], nw, what, of);
        snprintf(of, sizeof of, "dx (fetch %s)", how);
        same_bits(dx[0], dx[i], nx, what, of);
        snprintf(of, sizeof of, "the shortcut's dW (fetch %s)", how);
        same_bits(sdw[0], sdw[i], nsw, what, of);
    }
    double largest = 0;
    for (size_t j = 0; j < nw; j++) largest = nan_max(largest, fabs(dw[0][j]));
    assert_true(largest > 0.01); /* the sums are there */
    for (int i = 0; i < 3; i++) free(dw[i]), free(dx[i]), free(sdw[i]);
    layer_data_free(&d);
}

static void check_fetch(int n, int c, int h, int o, int k, int stride, int so) {
    check_fetch_across(n, c, h, o, k, stride, so, -1);
}

static void test_wgrad_fetch(void **state) {
    (void)state;
    /* W1's first stride-2 layer with its shortcut (2 images a block) and its 7 x 7 stride-1
     * layer (7 a block) over several blocks: the words of the next block's first image fetched
     * while the block's last is copied; one image: no next block */
    check_fetch_across(9, 16, 28, 32, 3, 2, 32, 1);
    check_fetch_across(17, 64, 7, 64, 3, 1, 0, 1);
    check_fetch_across(1, 16, 28, 32, 3, 2, 32, 0);
    check_fetch(5, 16, 28, 32, 3, 2, 32); /* W1's layers, partial blocks */
    check_fetch(9, 32, 14, 32, 3, 1, 0);
    check_fetch(5, 32, 14, 64, 3, 2, 64);
    check_fetch(17, 64, 7, 64, 3, 1, 0);
    check_fetch(3, 16, 28, 32, 1, 2, 0);  /* the 1x1 stride-2 layer */
    check_fetch(1, 8, 9, 12, 3, 2, 11);   /* an odd plane, one image, odd channels */
    check_fetch(3, 24, 13, 40, 3, 1, 0);  /* odd planes, 3 images, m not a multiple of 16 */
    check_fetch(3, 18, 15, 23, 3, 2, 21); /* the same at stride 2 */
    check_fetch(1, 32, 11, 17, 3, 1, 0);
}

/* The float that bf16_ref's word stands for. */
static float bf16_value(float x) {
    const uint32_t bits = (uint32_t)bf16_ref(x) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Stride 2's dx stored straight into dx's rows (conv_spread, cf__conv_bf16_set_dx_spread) and
 * through phase planes and interleave2_rows: dx memcmp-equal (prefilled differently, so a place
 * that either leaves unwritten fails), through cf_conv_bf16_dx_with / cf_conv_bf16_dx, the
 * backward's words (dy and the shortcut's dy as words, x kept) and its fp32 dy; dx2_cols off, so
 * that every stride-2 shape takes dx_stride2 (and on, as the layers run). And dx against a double
 * sum of the same bf16-rounded products (PyTorch's bf16 convolution with fp32 sums), to fp32
 * summation's bound. */
static void check_spread_as(bool d2s, int n, int c, int h, int o, int k, int so) {
    cf_conv_geom g;
    const int pad = (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, 2, 2, pad, pad));
    if (!cf_conv_bf16_supported(&g, o)) return;
    const bool words = cf_conv_bf16_takes_dy_words(&g, o);
    layer_data d;
    layer_data_make(&d, &g, n, c, h, o, k, so, 61, false);
    const size_t nx = d.nx, nw = d.nw, nsw = d.nsw;
    const uint16_t *kept = cf_conv_bf16_keeps_input(&g, o) ? d.xk : NULL;
    char what[128];
    snprintf(what, sizeof what, "%dx%d/2 %d->%d (shortcut %d) on %dx%d, %d images%s", k, k, c, o,
             so, h, h, n, d2s ? " (dx2_cols' cols_spread)" : "");
    float *dx[2], *dw = malloc(nw * 4), *sdw = malloc(nsw * 4);
    for (int i = 0; i < 2; i++) dx[i] = malloc(nx * 4);
    for (int entry = 0; entry < 3; entry++)
        for (int d2 = 0; d2 < 2; d2++) {
            if ((entry == 1 && !words) || (d2s && !d2)) continue;
            cf__conv_bf16_set_dx2_cols(d2 == 1);
            for (int i = 0; i < 2; i++) { /* i = 1: conv_spread (d2s: cols_spread) */
                if (d2s)
                    cf__conv_bf16_set_dx2_spread(i == 1);
                else
                    cf__conv_bf16_set_dx_spread(i == 1);
                for (size_t j = 0; j < nx; j++) dx[i][j] = i ? 7.0f : -3.0f;
                const unsigned long spread_before = cf__conv_bf16_spread_calls();
                memset(sdw, 0, nsw * 4);
                cf_conv_shortcut sw_sc = {.out_channels = so, .w = d.spk, .dy = d.sdy, .dw = sdw},
                                 sx_sc = sw_sc;
                const cf_conv_shortcut *a = so ? &sw_sc : NULL, *b = so ? &sx_sc : NULL;
                if (entry == 0 && so)
                    assert_int_equal(
                        cf_conv_bf16_dx_with(&g, o, d.pk, d.dy, n, dx[i], d.scratch, b), CF_OK);
                else if (entry == 0)
                    assert_int_equal(cf_conv_bf16_dx(&g, o, d.pk, d.dy, n, dx[i], d.scratch),
                                     CF_OK);
                else if (entry == 1)
                    assert_int_equal(cf_conv_bf16_backward_words(&g, o, d.pk, NULL, d.dyh, d.x,
                                                                 kept, n, dw, dx[i], d.scratch, a,
                                                                 b, so ? d.sdyh : NULL),
                                     CF_OK);
                else
                    assert_int_equal(cf_conv_bf16_backward_kept(&g, o, d.pk, d.dy, d.x, kept, n, dw,
                                                                dx[i], d.scratch, a, b),
                                     CF_OK);
                /* the way under test ran where the level has its kernel (each shape here fits
                 * it), and not when switched off: dx2_cols off takes dx_stride2 (conv_spread),
                 * d2s's shapes dx2_cols (cols_spread); with dx2_cols on and conv_spread under
                 * test, a shape may take either, so nothing is asserted there */
                const cf_bf16_kernels *bk = cf_active_kernels->bf16;
                const bool has = bk && (d2s ? bk->cols_spread != NULL : bk->conv_spread != NULL);
                const bool ran = cf__conv_bf16_spread_calls() != spread_before;
                if ((d2s || d2 == 0) && ran != (i == 1 && has))
                    fail_msg("%s: entry %d, dx2_cols %d, way %d: spread ran %d", what, entry, d2, i,
                             ran);
            }
            char of[96];
            snprintf(of, sizeof of, "dx (%s, dx2_cols %s; spread / planes)",
                     entry == 0   ? "dx entry"
                     : entry == 1 ? "dy words"
                                  : "dy fp32",
                     d2 ? "on" : "off");
            same_bits(dx[1], dx[0], nx, what, of);
        }
    cf__conv_bf16_set_dx2_cols(true);
    cf__conv_bf16_set_dx_spread(true);
    cf__conv_bf16_set_dx2_spread(true);
    /* dx[1] (the last: fp32 dy, spread) against the double sums of the rounded products */
    const int oh = g.oh, ow = g.ow;
    double worst = 0;
    for (int b = 0; b < n; b++)
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < h; y++)
                for (int x = 0; x < h; x++) {
                    double sum = 0, mag = 0;
                    for (int oc = 0; oc < o; oc++)
                        for (int ki = 0; ki < k; ki++)
                            for (int kj = 0; kj < k; kj++) {
                                const int ty = y + pad - ki, tx = x + pad - kj;
                                if (ty < 0 || tx < 0 || ty % 2 || tx % 2 || ty / 2 >= oh ||
                                    tx / 2 >= ow)
                                    continue;
                                const double t =
                                    (double)bf16_value(
                                        d.wt[((size_t)oc * c + ch) * k * k + ki * k + kj]) *
                                    bf16_value(
                                        d.dy[(((size_t)b * o + oc) * oh + ty / 2) * ow + tx / 2]);
                                sum += t, mag += fabs(t);
                            }
                    for (int oc = 0; oc < so && y % 2 == 0 && x % 2 == 0; oc++) {
                        const double t =
                            (double)bf16_value(d.sw[(size_t)oc * c + ch]) *
                            bf16_value(d.sdy[(((size_t)b * so + oc) * oh + y / 2) * ow + x / 2]);
                        sum += t, mag += fabs(t);
                    }
                    const double got = dx[1][(((size_t)b * c + ch) * h + y) * h + x];
                    const double err = fabs(got - sum), bound = 4e-5 * mag + 1e-30;
                    if (!(err <= bound))
                        fail_msg("%s: dx[%d][%d][%d][%d] %.9g, double sum %.9g (bound %.3g)", what,
                                 b, ch, y, x, got, sum, bound);
                    worst = nan_max(worst, err / (mag + 1e-30));
                }
    printf("%s: dx within %.2g of the sums' magnitude\n", what, worst);
    for (int i = 0; i < 2; i++) free(dx[i]);
    free(dw), free(sdw);
    layer_data_free(&d);
}

static void check_spread(int n, int c, int h, int o, int k, int so) {
    check_spread_as(false, n, c, h, o, k, so);
}

static void test_dx_spread(void **state) {
    (void)state;
    check_spread(5, 16, 28, 32, 3, 32); /* W1's stride-2 layers with their shortcuts */
    check_spread(5, 32, 14, 64, 3, 64);
    check_spread(3, 16, 28, 32, 3, 0);  /* without */
    check_spread(1, 8, 10, 12, 3, 11);  /* 5 x 5 phases, one image, odd channels */
    check_spread(3, 18, 30, 23, 3, 21); /* 18 channels (a last block of 2 rows), 15 x 15 phases */
    check_spread(2, 12, 40, 16, 3, 0);  /* phase rows of 20: two vectors a row */
    check_spread(2, 8, 12, 10, 5, 0);   /* 5x5, pad 2 */
    check_spread(2, 6, 20, 8, 7, 5);    /* 7x7, pad 3 */
    check_spread(2, 40, 8, 24, 3, 24);  /* 40 channels, 4 x 4 phases */
}

/* Stride 2's dx through conv_cols (dx2_cols) with each row parity's two phases stored
 * interleaved into dx's rows (cols_spread, cf__conv_bf16_set_dx2_spread) and through dense
 * phase planes and interleave2_rows: dx memcmp-equal, each entry (as check_spread), and against
 * the double sums. Shapes that take dx2_cols (17 to 64 input channels, phases 6 to 16 wide). */
static void test_dx2_spread(void **state) {
    (void)state;
    check_spread_as(true, 5, 32, 14, 64, 3, 64);  /* W1's second block, a part of a call */
    check_spread_as(true, 17, 32, 14, 64, 3, 64); /* two whole calls of 8 and one image */
    check_spread_as(true, 3, 32, 14, 64, 3, 0);   /* without the shortcut */
    check_spread_as(true, 3, 18, 30, 23, 3, 21);  /* 18 channels, rows of 30: two blocks */
    check_spread_as(true, 2, 40, 12, 24, 3, 24);  /* 40 channels (tiles of 8), 6 x 6 phases */
    check_spread_as(true, 3, 17, 24, 20, 5, 9);   /* 5x5, pad 2: the phases' columns swapped */
    check_spread_as(true, 2, 64, 20, 16, 7, 16);  /* 7x7, pad 3, 64 channels, rows of 20 */
    check_spread_as(true, 9, 24, 12, 8, 3, 0);    /* 24 channels, 6 x 6 phases, 9 images */
}

/* ---- models ---------------------------------------------------------------------------------- */

/* A convolution whose ops are wrapped as bench_step's timers wrap them (the original ops
 * restored during its own call): never linked. */
typedef struct wrapped {
    cf_module_ops ops;
    const cf_module_ops *orig;
    cf_module *m;
} wrapped;
static wrapped wraps[4];
static int n_wraps;

static wrapped *wrap_of(cf_module *m) {
    for (int i = 0; i < n_wraps; i++)
        if (wraps[i].m == m) return &wraps[i];
    fail_msg("no wrapper");
    return NULL;
}

static const cf_tensor *wrapped_forward(cf_module *m, const cf_tensor *x) {
    wrapped *w = wrap_of(m);
    m->ops = w->orig;
    const cf_tensor *y = w->orig->forward(m, x);
    m->ops = &w->ops;
    return y;
}

static const cf_tensor *wrapped_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    wrapped *w = wrap_of(m);
    m->ops = w->orig;
    const cf_tensor *dx = w->orig->backward(m, dy, need_dx);
    m->ops = &w->ops;
    return dx;
}

static void wrap(cf_module *m) {
    assert_true(n_wraps < 4);
    wrapped *w = &wraps[n_wraps++];
    w->m = m;
    w->orig = m->ops;
    w->ops = *m->ops;
    w->ops.forward = wrapped_forward;
    w->ops.backward = wrapped_backward;
    m->ops = &w->ops;
}

static void unwrap_all(void) {
    for (int i = 0; i < n_wraps; i++) wraps[i].m->ops = wraps[i].orig;
    n_wraps = 0;
}

enum { SEQ, SEQ_NO_DX, BODY, RES_ADD, BLOCK, BLOCK_NO_DX, BLOCK_BIAS };
enum { MAX_PAIRS = 8 };

/* A model of kind and its (conv, BatchNorm) pairs, with whether each takes the link at a level
 * with bf16 convolutions. */
typedef struct model_case {
    cf_model *model;
    int n_pairs;
    cf_module *conv[MAX_PAIRS], *bn[MAX_PAIRS];
    bool takes[MAX_PAIRS];
    cf_conv_geom g[MAX_PAIRS]; /* the conv's geometry and outputs */
    int o[MAX_PAIRS];
    int kind;
    int c, h;
} model_case;

static cf_module *seq_of(int n, cf_module *const *mods) {
    cf_module *s = cf_sequential(n, mods);
    assert_non_null(s);
    return s;
}

/* A pair whose conv (c -> o, k x k, stride s, on h x h) takes the link where takes, the level
 * has bf16 convolutions and the layer takes dy words at it. */
static void pair(model_case *mc, cf_module *conv, cf_module *bn, bool takes, int c, int h, int o,
                 int k, int s) {
    assert_true(mc->n_pairs < MAX_PAIRS);
    assert_true(
        cf_conv_geom_init(&mc->g[mc->n_pairs], c, h, h, k, k, s, s, (k - 1) / 2, (k - 1) / 2));
    mc->o[mc->n_pairs] = o;
    assert_true(cf_nn_is_conv(conv) || conv->ops->backward == wrapped_backward);
    assert_true(cf_nn_is_batchnorm(bn));
    mc->conv[mc->n_pairs] = conv;
    mc->bn[mc->n_pairs] = bn;
    mc->takes[mc->n_pairs++] = takes;
}

static void model_make(model_case *mc, int kind) {
    memset(mc, 0, sizeof *mc);
    cf_module *root;
    if (kind == SEQ) { /* stem 8 -> 16 (no words), 16 -> 32 stride 2, 32 -> 32 */
        mc->c = 8, mc->h = 28;
        root = seq_of(8, (cf_module *[]){cf_conv2d(8, 16, 3, 1, 1, false), cf_batchnorm2d(16),
                                         cf_relu(), cf_conv2d(16, 32, 3, 2, 1, false),
                                         cf_batchnorm2d(32), cf_relu(),
                                         cf_conv2d(32, 32, 3, 1, 1, false), cf_batchnorm2d(32)});
    } else if (kind == SEQ_NO_DX) { /* a linked conv first, asked for no dx */
        mc->c = 16, mc->h = 28;
        root = seq_of(5, (cf_module *[]){cf_conv2d(16, 32, 3, 2, 1, false), cf_batchnorm2d(32),
                                         cf_relu(), cf_conv2d(32, 64, 3, 1, 1, false),
                                         cf_batchnorm2d(64)});
    } else if (kind == BLOCK || kind == BLOCK_NO_DX) { /* W1's first block alone */
        mc->c = 16, mc->h = 28;
        root = cf_residual(
            seq_of(5,
                   (cf_module *[]){cf_conv2d(16, 32, 3, 2, 1, false), cf_batchnorm2d(32), cf_relu(),
                                   cf_conv2d(32, 32, 3, 1, 1, false), cf_batchnorm2d(32)}),
            seq_of(2, (cf_module *[]){cf_conv2d(16, 32, 1, 2, 0, false), cf_batchnorm2d(32)}),
            true);
    } else if (kind == BLOCK_BIAS) { /* W1's first block, the convpath's first conv biased */
        mc->c = 16, mc->h = 28;
        root = cf_residual(
            seq_of(5,
                   (cf_module *[]){cf_conv2d(16, 32, 3, 2, 1, true), cf_batchnorm2d(32), cf_relu(),
                                   cf_conv2d(32, 32, 3, 1, 1, false), cf_batchnorm2d(32)}),
            seq_of(2, (cf_module *[]){cf_conv2d(16, 32, 1, 2, 0, false), cf_batchnorm2d(32)}),
            true);
    } else if (kind == RES_ADD) { /* an idpath conv whose dx is added into the convpath's */
        mc->c = 16, mc->h = 28;
        root = cf_residual(
            seq_of(3, (cf_module *[]){cf_relu(), cf_conv2d(16, 32, 3, 2, 1, false),
                                      cf_batchnorm2d(32)}),
            seq_of(2, (cf_module *[]){cf_conv2d(16, 32, 1, 2, 0, false), cf_batchnorm2d(32)}),
            true);
    } else {
        mc->c = 1, mc->h = 28;
        root = cf_mini_resnet_body(1);
    }
    assert_int_equal(cf_model_new(&mc->model, root, 17), CF_OK);
    cf_module *r = mc->model->root;
    if (kind == SEQ) {
        pair(mc, r->children[0], r->children[1], false, 8, 28, 16, 3, 1);
        pair(mc, r->children[3], r->children[4], true, 16, 28, 32, 3, 2);
        pair(mc, r->children[6], r->children[7], true, 32, 14, 32, 3, 1);
    } else if (kind == SEQ_NO_DX) {
        pair(mc, r->children[0], r->children[1], true, 16, 28, 32, 3, 2);
        pair(mc, r->children[3], r->children[4], true, 32, 14, 64, 3, 1);
    } else if (kind == BLOCK || kind == BLOCK_NO_DX) {
        /* without the block's input gradient the pair is not taken: the idpath's conv reads
         * its words in its own backward */
        cf_module *cp = r->children[0], *ip = r->children[1];
        pair(mc, cp->children[0], cp->children[1], true, 16, 28, 32, 3, 2);
        pair(mc, cp->children[3], cp->children[4], true, 32, 14, 32, 3, 1);
        pair(mc, ip->children[0], ip->children[1], true, 16, 28, 32, 1, 2);
    } else if (kind == BLOCK_BIAS) {
        /* the biased conv reads its own dy in fp32 (its bias gradient sums it); the idpath's
         * words still go to it with the handover, and its bias gradient must not be lost */
        cf_module *cp = r->children[0], *ip = r->children[1];
        pair(mc, cp->children[0], cp->children[1], false, 16, 28, 32, 3, 2);
        pair(mc, cp->children[3], cp->children[4], true, 32, 14, 32, 3, 1);
        pair(mc, ip->children[0], ip->children[1], true, 16, 28, 32, 1, 2);
    } else if (kind == RES_ADD) {
        cf_module *cp = r->children[0], *ip = r->children[1];
        pair(mc, cp->children[1], cp->children[2], true, 16, 28, 32, 3, 2);
        pair(mc, ip->children[0], ip->children[1], false, 16, 28, 32, 1, 2); /* vetoed */
    } else {
        pair(mc, r->children[0], r->children[1], false, 1, 28, 16, 3, 1); /* the stem: fp32 */
        for (int b = 3; b <= 4; b++) {
            const int c = 16 << (b - 3), h = 28 >> (b - 3);
            cf_module *cp = r->children[b]->children[0], *ip = r->children[b]->children[1];
            pair(mc, cp->children[0], cp->children[1], true, c, h, 2 * c, 3, 2);
            pair(mc, cp->children[3], cp->children[4], true, 2 * c, h / 2, 2 * c, 3, 1);
            /* its words go to the convpath's first conv with the handover */
            pair(mc, ip->children[0], ip->children[1], true, c, h, 2 * c, 1, 2);
        }
    }
    assert_int_equal(cf_conv_set_bf16(r, true),
                     kind == BODY ? 7
                     : kind == SEQ || kind == BLOCK || kind == BLOCK_NO_DX || kind == BLOCK_BIAS
                         ? 3
                         : 2);
    mc->kind = kind;
}

typedef struct step_out {
    float *y, *dx, *grads;
    size_t ny, nx;
} step_out;

/* One training (or eval) step of n images from seed: forward, backward from a fixed dy (the
 * input gradient when need_dx); y, dx and every gradient copied into out. */
static void step(model_case *mc, int n, uint64_t seed, bool need_dx, step_out *out) {
    cf_model *m = mc->model;
    const size_t nx = (size_t)n * mc->c * mc->h * mc->h;
    float *x = malloc(nx * 4);
    fill_uniform(x, nx, seed, -2, 2);
    cf_model_zero_grad(m);
    const cf_tensor tx = cf_tensor_view(x, cf_shape4(n, mc->c, mc->h, mc->h));
    const cf_tensor *ty;
    assert_int_equal(cf_model_forward(m, &tx, &ty), CF_OK);
    out->ny = cf_tensor_numel(ty);
    out->nx = nx;
    out->y = malloc(out->ny * 4);
    memcpy(out->y, ty->data, out->ny * 4);
    float *dy = malloc(out->ny * 4);
    fill_uniform(dy, out->ny, seed + 1, -1, 1);
    const cf_tensor tdy = cf_tensor_view(dy, ty->shape);
    cf__nn_pass_begin();
    const cf_tensor *tdx = m->root->ops->backward(m->root, &tdy, need_dx);
    assert_int_equal(cf__nn_pass_end(), CF_OK);
    out->dx = NULL;
    if (need_dx) {
        assert_non_null(tdx);
        out->dx = malloc(nx * 4);
        memcpy(out->dx, tdx->data, nx * 4);
    }
    out->grads = malloc(m->n_weights * 4);
    memcpy(out->grads, m->grads, m->n_weights * 4);
    free(x), free(dy);
}

static void step_free(step_out *o) {
    free(o->y), free(o->dx), free(o->grads);
}

/* Which pairs took the link in the last backward; fails where a BatchNorm and its convolution
 * disagree (words written and not read, or read and not written). */
static unsigned taken(const model_case *mc, const char *what) {
    unsigned mask = 0;
    for (int i = 0; i < mc->n_pairs; i++) {
        const bool wrote = cf_nn_bn_wrote_dx_words(mc->bn[i]),
                   read = cf_nn_is_conv(mc->conv[i]) && cf_nn_conv_read_dy_words(mc->conv[i]);
        if (wrote != read)
            fail_msg("%s: pair %d: the BatchNorm %s words, the conv %s them", what, i,
                     wrote ? "wrote" : "did not write", read ? "read" : "did not read");
        if (wrote) mask |= 1u << i;
    }
    return mask;
}

static unsigned expected(const model_case *mc) {
    unsigned mask = 0;
    for (int i = 0; i < mc->n_pairs; i++)
        if (mc->takes[i] && cf_bf16_compute() && cf_conv_bf16_takes_dy_words(&mc->g[i], mc->o[i]))
            mask |= 1u << i;
    return mask;
}

/* `steps` steps of a linked and an unlinked model of kind (the same seed, the same SGD steps
 * between), n images on `threads` threads: bitwise the same outputs and gradients; the link
 * taken where want (a mask of pairs; ~0u: the model's own expectation) says. setup (may be
 * NULL) edits both models before their first step, after their first (after_plan). */
static void compare(int kind, int n, int threads, int steps, bool training,
                    void (*setup)(model_case *, bool after_plan), unsigned want) {
    cf_set_num_threads(threads);
    model_case mc[2];
    model_make(&mc[0], kind);
    model_make(&mc[1], kind);
    const bool need_dx = kind != SEQ_NO_DX && kind != BLOCK_NO_DX;
    for (int i = 0; i < 2; i++) {
        cf_model_train(mc[i].model, training);
        if (setup) setup(&mc[i], false);
    }
    char what[128];
    for (int s = 0; s < steps; s++) {
        const unsigned wanted = want == ~0u ? expected(&mc[0]) : want;
        snprintf(what, sizeof what, "model %d, %d images, %d threads, %s, step %d", kind, n,
                 threads, training ? "training" : "eval", s);
        step_out o[2];
        cf__nn_set_dy_words_link(true);
        step(&mc[0], n, 100 + (uint64_t)s, need_dx, &o[0]);
        const unsigned got = taken(&mc[0], what);
        cf__nn_set_dy_words_link(false);
        step(&mc[1], n, 100 + (uint64_t)s, need_dx, &o[1]);
        if (taken(&mc[1], what)) fail_msg("%s: the link was taken while switched off", what);
        cf__nn_set_dy_words_link(true);
        if (got != wanted)
            fail_msg("%s: the link taken at pairs %#x, expected %#x", what, got, wanted);
        same_bits(o[0].y, o[1].y, o[0].ny, what, "y");
        if (need_dx) same_bits(o[0].dx, o[1].dx, o[0].nx, what, "dx");
        same_bits(o[0].grads, o[1].grads, mc[0].model->n_weights, what, "the gradients");
        double largest = 0;
        for (size_t j = 0; j < mc[0].model->n_weights; j++)
            largest = nan_max(largest, fabs(o[0].grads[j]));
        assert_true(largest > 1e-3);
        for (int i = 0; i < 2; i++) { /* the same SGD step on both */
            cf_model *m = mc[i].model;
            for (size_t j = 0; j < m->n_weights; j++) m->weights[j] -= 0.05f * m->grads[j];
            step_free(&o[i]);
            if (s == 0 && setup) setup(&mc[i], true);
        }
    }
    unwrap_all();
    for (int i = 0; i < 2; i++) cf_model_free(mc[i].model);
    cf_set_num_threads(0);
}

static void test_models(void **state) {
    (void)state;
    for (int threads = 1; threads <= 2; threads++) {
        compare(SEQ, 5, threads, 3, true, NULL, ~0u);
        compare(SEQ_NO_DX, 6, threads, 3, true, NULL, ~0u);
        compare(BODY, 7, threads, 3, true, NULL, ~0u);
        compare(RES_ADD, 5, threads, 3, true, NULL, ~0u);
        compare(BLOCK, 5, threads, 2, true, NULL, ~0u);
        compare(BLOCK_NO_DX, 5, threads, 2, true, NULL, ~0u);
        compare(BLOCK_BIAS, 5, threads, 2, true, NULL, ~0u);
    }
}

/* W1's body with the convpath's first convs frozen: no words for their own dy (no weight
 * gradient), and the idpath's words no longer handed with the weight gradient: the shortcut's own
 * weight gradient reads them, and they are made fp32 again for the sibling's dx. */
static void freeze_siblings(model_case *mc, bool after_plan) {
    if (after_plan) return;
    for (int i = 0; i < mc->n_pairs; i++)
        if (mc->g[i].sh == 2 && mc->g[i].kh == 3) {
            mc->conv[i]->params[0].trainable = false;
            mc->takes[i] = false;
        }
}

static void test_frozen_sibling(void **state) {
    (void)state;
    compare(BODY, 5, 1, 3, true, freeze_siblings, ~0u);
    compare(BODY, 6, 2, 2, true, freeze_siblings, ~0u);
}

/* In eval mode (a backward after an eval forward) the link is not taken. */
static void test_eval(void **state) {
    (void)state;
    compare(SEQ, 4, 1, 2, false, NULL, 0);
    compare(BODY, 4, 2, 2, false, NULL, 0);
}

/* Convolutions in fp32 (switched back): the link is not taken. */
static void to_fp32(model_case *mc, bool after_plan) {
    if (!after_plan) cf_conv_set_bf16(mc->model->root, false);
}

static void test_fp32(void **state) {
    (void)state;
    compare(SEQ, 4, 1, 2, true, to_fp32, 0);
    compare(BODY, 4, 2, 2, true, to_fp32, 0);
}

/* A wrapped convolution: pair 2 wrapped before the plan (never linked), pair 1 after it (its ops
 * are a wrapper's when the BatchNorm asks): from the second step on, the link is taken at
 * neither. */
static void wrap_pairs(model_case *mc, bool after_plan) {
    wrap(mc->conv[after_plan ? 1 : 2]);
    mc->takes[after_plan ? 1 : 2] = false;
}

static void test_wrapped(void **state) {
    (void)state;
    /* step 0: pair 1 taken (pair 2 wrapped before the plan); then neither */
    cf_set_num_threads(1);
    model_case mc;
    model_make(&mc, SEQ);
    cf_model_train(mc.model, true);
    wrap(mc.conv[2]);
    step_out o;
    step(&mc, 3, 7, true, &o);
    step_free(&o);
    assert_int_equal(taken(&mc, "wrapped before the plan"), expected(&mc) & 1u << 1);
    assert_true(!cf_bf16_compute() || expected(&mc) & 1u << 1); /* stride 2: at every bf16 level */
    wrap(mc.conv[1]);
    step(&mc, 3, 8, true, &o);
    step_free(&o);
    assert_int_equal(taken(&mc, "wrapped after the plan"), 0u);
    unwrap_all();
    cf_model_free(mc.model);
    cf_set_num_threads(0);
    /* and the results bitwise the unlinked model's, both wrapped alike */
    compare(SEQ, 4, 2, 3, true, wrap_pairs, ~0u);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bn_dx_words),    cmocka_unit_test(test_conv_words),
        cmocka_unit_test(test_models),         cmocka_unit_test(test_eval),
        cmocka_unit_test(test_fp32),           cmocka_unit_test(test_wrapped),
        cmocka_unit_test(test_frozen_sibling), cmocka_unit_test(test_wgrad_fetch),
        cmocka_unit_test(test_dx_spread),      cmocka_unit_test(test_dx2_spread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
