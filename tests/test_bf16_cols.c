/* The implicit bf16 forward over output positions (conv_bf16.c's cols path, the kernel table's
 * conv_cols): cf_conv_bf16_forward and cf_conv_bf16_forward_with give bitwise the outputs of the
 * path it replaced (conv_run over the padded rows, then copy_rows), which the same level runs when
 * its table has no conv_cols: each case runs once with the active table and once with a copy of it
 * without conv_cols, and compares every value. A counting wrapper around conv_cols checks that the
 * path is taken where it applies (17 to 64 output channels, planes of at most 256 positions at
 * least a tile wide: W1's layers and shortcuts) and nowhere else; the values are also checked
 * against a double-precision sum of the same bf16 operands. Cases: W1's four 3x3 layers and two
 * shortcuts, odd channel counts (a channel pair's high half zero), output channels that are not a
 * multiple of 16, a 5x5 kernel, image counts that end a call of several images early, the
 * shortcut paired with a stride-2 layer, and planes too narrow or too large for the path. The
 * input's pairs of that path (fwd_pairs_rows, fwd_deal_pairs: the conversion instructions, with
 * cf__bf16_round_lanes for a vector that holds a subnormal) are compared with pairs_rows' and
 * deal_pairs' words on subnormals, NaNs, infinities and ties.
 *
 * Stride 1's dx takes the same kernel over dy's pairs with the dx order's columns (dx_cols):
 * cf_conv_bf16_dx, and cf_conv_bf16_backward with the weight gradient (dy's pairs from its bf16
 * rows) and without, give bitwise the dx of the path it replaced (run_images), which the same
 * level runs without conv_cols, and each other's; the path is taken for 17 to 64 input channels
 * on planes it fits, and not for the 1x1 shortcut or planes it does not fit; values
 * against a double sum of the same bf16 operands. W1's two stride-1 layers also run as Conv2d
 * layers on 1, 2 and 3 threads with batches that do not divide among them, every dx bitwise the
 * same with and without conv_cols.
 *
 * Stride 2's dx takes it per phase of dx (dx2_cols: 17 to 64 input channels, phases at least 6
 * wide, with conv_cols' tiles of a row on phases narrower than its usual tile), with and
 * without a paired shortcut, and gives bitwise dx_stride2's dx (the same level without conv_cols)
 * three ways, and the double sums.
 *
 * A call's last tile reads past its last image, in the next image's slot: a bounding wrapper
 * works out every word conv_cols reads and checks that it lies in the forward's part of the
 * scratch, which the test allocates alone (so ASan sees an overrun too), on shapes whose input
 * slot is longer than the tiles' buffer after the call's slots (wide inputs, whole calls).
 *
 * Without bf16 kernels (CF_ISA below avx512_bf16) the layout is unsupported and the test has
 * nothing to compare; at the amx level (its tile conv_run is the forward's kernel) the table has
 * no conv_cols, and its dx (the pack now holds dx's columns too) is checked against the double
 * sums alone. */
#include "oracle.h"

#include "corefit/nn.h"
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static cf_kernel_table without_table; /* the active table, its bf16 kernels without conv_cols */
static cf_bf16_kernels without_bf16;
static cf_kernel_table counting_table; /* ... with conv_cols counted */
static cf_bf16_kernels counting_bf16;
static void (*real_cols)(int, const int *, int, int, const uint32_t *, const uint32_t *, size_t,
                         size_t, size_t, int, int, int, float *, size_t, size_t, float *,
                         const void *, size_t);
static atomic_int cols_calls; /* Conv2d's threads call it too */

static void counted_cols(int taps, const int *off, int pairs, int m, const uint32_t *w,
                         const uint32_t *x, size_t plane, size_t ldx, size_t ldimg, int h, int wd,
                         int n_images, float *out, size_t ldo, size_t ldoimg, float *tmp,
                         const void *next, size_t next_bytes) {
    cols_calls++;
    real_cols(taps, off, pairs, m, w, x, plane, ldx, ldimg, h, wd, n_images, out, ldo, ldoimg, tmp,
              next, next_bytes);
}

/* ---- where conv_cols reads ----------------------------------------------------------------
 * A call's last tile reads past its last image (kernel_table.h). The bounding wrapper works out
 * every word the kernel reads, as its tiles walk the positions (a tile's positions in at most two
 * rows, the rows of image b from x + b * ldimg), and checks that they lie in the scratch the test
 * handed the call: [bound_lo, bound_hi), the forward's part of the scratch alone
 * (cf__conv_bf16_run_scratch, malloc'd to that size, so that ASan sees a read past it too). */
size_t cf__conv_bf16_run_scratch(const cf_conv_geom *g, int out_channels);
static cf_kernel_table bounding_table;
static cf_bf16_kernels bounding_bf16;
static const uint32_t *bound_lo, *bound_hi;
static size_t bound_past;   /* the furthest word read in the slot after a call's last image */
static ptrdiff_t bound_gap; /* the fewest words left between a read and bound_hi */

static void bounded_cols(int taps, const int *off, int pairs, int m, const uint32_t *w,
                         const uint32_t *x, size_t plane, size_t ldx, size_t ldimg, int h, int wd,
                         int n_images, float *out, size_t ldo, size_t ldoimg, float *tmp,
                         const void *next, size_t next_bytes) {
    const int nv = (m + 15) / 16, np0 = 24 / nv, np = wd < np0 ? wd : np0, n = n_images * h * wd;
    int lo_off = off[0], hi_off = off[0];
    for (int t = 1; t < taps; t++) {
        if (off[t] < lo_off) lo_off = off[t];
        if (off[t] > hi_off) hi_off = off[t];
    }
    const uint32_t *first = NULL, *last = NULL;
    for (int q = 0; q < (n + np - 1) / np * np; q++) { /* every position of every tile */
        const int r = q / wd, j = q % wd;
        const uint32_t *at = x + (size_t)(r / h) * ldimg + (size_t)(r % h) * ldx + j;
        if (!first || at < first) first = at;
        if (!last || at > last) last = at;
    }
    const uint32_t *lo = first + lo_off, *end = last + hi_off + (size_t)(pairs - 1) * plane + 1;
    if (lo < bound_lo || end > bound_hi)
        fail_msg("conv_cols reads words [%td, %td) of a scratch of %td", lo - bound_lo,
                 end - bound_lo, bound_hi - bound_lo);
    const uint32_t *slot_end = x + (size_t)n_images * ldimg;
    if (end > slot_end && (size_t)(end - slot_end) > bound_past)
        bound_past = (size_t)(end - slot_end);
    if (bound_hi - end < bound_gap) bound_gap = bound_hi - end;
    real_cols(taps, off, pairs, m, w, x, plane, ldx, ldimg, h, wd, n_images, out, ldo, ldoimg, tmp,
              next, next_bytes);
}

/* Whether the active level has conv_cols; then both table copies made. */
static bool tables_make(void) {
    const cf_kernel_table *active = cf_active_kernels;
    if (!active->bf16 || !active->bf16->conv_cols) return false;
    without_bf16 = *active->bf16;
    without_bf16.conv_cols = NULL;
    without_table = *active;
    without_table.bf16 = &without_bf16;
    counting_bf16 = *active->bf16;
    real_cols = counting_bf16.conv_cols;
    counting_bf16.conv_cols = counted_cols;
    counting_table = *active;
    counting_table.bf16 = &counting_bf16;
    bounding_bf16 = *active->bf16;
    bounding_bf16.conv_cols = bounded_cols;
    bounding_table = *active;
    bounding_table.bf16 = &bounding_bf16;
    return true;
}

/* The bf16 values of x (as fp32, exact). */
static float *bf16_values(const float *x, size_t n) {
    uint16_t *b = malloc((n + 1) * sizeof(uint16_t));
    float *v = malloc((n + 1) * sizeof(float));
    cf_fp32_to_bf16(x, b, n);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)b[i] << 16;
        memcpy(&v[i], &u, sizeof(float));
    }
    free(b);
    return v;
}

/* |y - the double sum of the bf16 operands| within a bound of the sum of the terms' magnitudes,
 * on the first two images (the others are compared bitwise only). */
static void check_values(const cf_conv_geom *g, int o, const float *w32, const float *x32, int n,
                         const float *y, const char *what) {
    const size_t nw = (size_t)o * g->c * g->kh * g->kw, nx = (size_t)n * g->c * g->h * g->w;
    float *w = bf16_values(w32, nw), *x = bf16_values(x32, nx);
    for (int im = 0; im < n && im < 2; im++)
        for (int r = 0; r < o; r++)
            for (int i = 0; i < g->oh; i++)
                for (int j = 0; j < g->ow; j++) {
                    double sum = 0, mag = 0;
                    for (int c = 0; c < g->c; c++)
                        for (int ki = 0; ki < g->kh; ki++)
                            for (int kj = 0; kj < g->kw; kj++) {
                                const int u = i * g->sh + ki - g->ph, v = j * g->sw + kj - g->pw;
                                if (u < 0 || v < 0 || u >= g->h || v >= g->w) continue;
                                const double t =
                                    (double)w[(((size_t)r * g->c + c) * g->kh + ki) * g->kw + kj] *
                                    x[(((size_t)im * g->c + c) * g->h + u) * g->w + v];
                                sum += t;
                                mag += fabs(t);
                            }
                    const double got = y[(((size_t)im * o + r) * g->oh + i) * g->ow + j];
                    if (!(fabs(got - sum) <= 1e-5 * mag + 1e-6))
                        fail_msg("%s: image %d channel %d (%d, %d): %.9g, the sum is %.9g", what,
                                 im, r, i, j, got, sum);
                }
    free(w);
    free(x);
}

static void same_bits(const float *a, const float *b, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: value %zu is %.9g through conv_cols, %.9g through conv_run", what, i,
                     (double)a[i], (double)b[i]);
}

/* A forward of n images of c -> o channels, k x k kernel, stride s (k = 1: the 1x1 stride-2
 * shortcut), on h x h images; cols: whether the path must be taken. With so > 0, the layer is a
 * stride-2 one paired with a shortcut of so channels (cf_conv_bf16_forward_with); cols then says
 * whether the pair takes it. */
static void check_case(int n, int c, int o, int h, int k, int s, int so, bool cols) {
    cf_conv_geom g, sg;
    const int pad = k == 1 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, s, s, pad, pad));
    assert_true(cf_conv_geom_init(&sg, c, h, h, 1, 1, 2, 2, 0, 0));
    char what[96];
    snprintf(what, sizeof what, "%d images %d -> %d %dx%d stride %d %dx%d, shortcut %d", n, c, o, k,
             k, s, h, h, so);
    assert_true(cf_conv_bf16_supported(&g, o));
    if (so) assert_true(cf_conv_bf16_pair_fits(&g, o, &sg, so));
    const size_t nw = (size_t)o * c * k * k, nx = (size_t)n * c * h * h,
                 ny = (size_t)n * o * g.oh * g.ow, nsy = (size_t)n * so * g.oh * g.ow;
    float *w = malloc(nw * sizeof(float)), *x = malloc(nx * sizeof(float));
    float *sw = malloc(((size_t)so * c + 1) * sizeof(float));
    float *y0 = malloc(ny * sizeof(float)), *y1 = malloc(ny * sizeof(float));
    float *sy0 = malloc((nsy + 1) * sizeof(float)), *sy1 = malloc((nsy + 1) * sizeof(float));
    float *packed = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float));
    float *spacked = malloc(cf_conv_bf16_packed_floats(&sg, so ? so : 1) * sizeof(float));
    float *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float));
    fill_uniform(w, nw, 11, -1, 1);
    fill_uniform(x, nx, 12, -1, 1);
    fill_uniform(sw, (size_t)so * c, 13, -1, 1);
    const cf_kernel_table *active = cf_active_kernels;
    for (int pass = 0; pass < 2; pass++) { /* counting conv_cols, then without it */
        cf_active_kernels = pass == 0 ? &counting_table : &without_table;
        float *y = pass == 0 ? y0 : y1, *sy = pass == 0 ? sy0 : sy1;
        for (size_t i = 0; i < ny; i++) y[i] = 1e30f; /* every value written */
        for (size_t i = 0; i < nsy; i++) sy[i] = 1e30f;
        cf_conv_bf16_pack(&g, o, w, packed);
        cols_calls = 0;
        if (so) {
            cf_conv_bf16_pack(&sg, so, sw, spacked);
            const cf_conv_shortcut sc = {.out_channels = so, .w = spacked, .y = sy};
            assert_int_equal(cf_conv_bf16_forward_with(&g, o, packed, x, n, y, scratch, &sc),
                             CF_OK);
        } else
            assert_int_equal(cf_conv_bf16_forward(&g, o, packed, x, n, y, scratch), CF_OK);
        if (pass == 0 && cols != (cols_calls > 0))
            fail_msg("%s: conv_cols called %d times, expected %s", what, atomic_load(&cols_calls),
                     cols ? "some" : "none");
    }
    cf_active_kernels = active;
    same_bits(y0, y1, ny, what);
    same_bits(sy0, sy1, nsy, what);
    check_values(&g, o, w, x, n, y0, what);
    if (so) check_values(&sg, so, sw, x, n, sy0, what);
    free(w);
    free(x);
    free(sw);
    free(y0);
    free(y1);
    free(sy0);
    free(sy1);
    free(packed);
    free(spacked);
    free(scratch);
}

static bool level_ready(void) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, 32, 14, 14, 3, 3, 1, 1, 1, 1));
    if (!cf_conv_bf16_supported(&g, 32)) {
        assert_false(cf_bf16_compute()); /* only a table without bf16 kernels refuses it */
        printf("level %s: no bf16 convolution, nothing to compare\n", cf_isa_name(cf_isa_active()));
        return false;
    }
    if (!tables_make()) {
        /* a level with bf16 convolutions and no conv_cols: the amx tiles */
        assert_int_equal(cf_isa_active(), CF_ISA_AMX);
        printf("level amx: no conv_cols (its tile conv_run is the forward's kernel)\n");
        return false;
    }
    return true;
}

/* W1's layers and shortcuts, 64 images as a batch and 11 (a call of 8 7x7 images, then 3). */
static void test_w1_layers(void **state) {
    (void)state;
    if (!level_ready()) return;
    const int counts[] = {64, 11, 1};
    for (int i = 0; i < 3; i++) {
        const int n = counts[i];
        check_case(n, 16, 32, 28, 3, 2, 0, true);
        check_case(n, 32, 32, 14, 3, 1, 0, true);
        check_case(n, 32, 64, 14, 3, 2, 0, true);
        check_case(n, 64, 64, 7, 3, 1, 0, true);
        check_case(n, 16, 32, 28, 1, 2, 0, true);
        check_case(n, 32, 64, 14, 1, 2, 0, true);
        check_case(n, 16, 32, 28, 3, 2, 32, true); /* the paired forward of each block */
        check_case(n, 32, 64, 14, 3, 2, 64, true);
    }
}

/* Odd channels, 3 vectors of channels (tiles of 8), 17 channels (2 vectors, the second one
 * channel), a 5x5 kernel, odd plane sizes, paired shortcuts of other widths. */
static void test_other_shapes(void **state) {
    (void)state;
    if (!level_ready()) return;
    check_case(5, 15, 33, 16, 3, 1, 0, true);
    check_case(3, 24, 17, 12, 3, 1, 0, true);
    check_case(4, 8, 48, 10, 5, 1, 0, true);
    check_case(7, 9, 40, 16, 3, 2, 0, true);
    check_case(3, 20, 24, 26, 1, 2, 0, true); /* 13 x 13 outputs */
    check_case(9, 17, 64, 13, 3, 1, 0, true);
    check_case(6, 15, 33, 16, 3, 2, 33, true);
    check_case(2, 24, 64, 24, 3, 2, 48, true);
}

/* Where the path does not apply: 16 or 65 channels and more, planes narrower than a tile or of
 * more than 256 positions, and a pair whose shortcut's plane is too narrow for its tile. */
static void test_elsewhere(void **state) {
    (void)state;
    if (!level_ready()) return;
    check_case(3, 16, 16, 14, 3, 1, 0, false);
    check_case(2, 16, 80, 14, 3, 1, 0, false);
    check_case(3, 9, 40, 12, 3, 2, 0, false);   /* 6 x 6 outputs, tiles of 8 */
    check_case(2, 16, 32, 20, 3, 1, 0, false);  /* 400 positions */
    check_case(3, 15, 33, 16, 3, 2, 20, false); /* the shortcut's tiles of 12 on 8 x 8 */
    check_case(2, 16, 32, 32, 3, 2, 32, true);  /* 256 positions: still */
}

/* n images of a forward (so > 0: paired with a shortcut of so channels) with the forward's
 * part of the scratch alone, its reads bounded; returns the most words a call's last tile read
 * past its last image's slot, and checks the outputs against a run with the whole scratch. */
static size_t bounded_forward(int n, int c, int o, int h, int k, int s, int so) {
    cf_conv_geom g, sg;
    const int pad = k == 1 ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, s, s, pad, pad));
    assert_true(cf_conv_geom_init(&sg, c, h, h, 1, 1, 2, 2, 0, 0));
    assert_true(cf_conv_bf16_supported(&g, o));
    const size_t nw = (size_t)o * c * k * k, nx = (size_t)n * c * h * h,
                 ny = (size_t)n * o * g.oh * g.ow, nsy = (size_t)n * so * g.oh * g.ow,
                 words = cf__conv_bf16_run_scratch(&g, o);
    assert_true(words <= cf_conv_bf16_scratch(&g, o));
    float *w = malloc(nw * sizeof(float)), *x = malloc(nx * sizeof(float));
    float *sw = malloc(((size_t)so * c + 1) * sizeof(float));
    float *y0 = malloc(ny * sizeof(float)), *y1 = malloc(ny * sizeof(float));
    float *sy0 = malloc((nsy + 1) * sizeof(float)), *sy1 = malloc((nsy + 1) * sizeof(float));
    float *packed = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float));
    float *spacked = malloc(cf_conv_bf16_packed_floats(&sg, so ? so : 1) * sizeof(float));
    float *part = malloc(words * sizeof(float));
    float *whole = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float));
    fill_uniform(w, nw, 21, -1, 1);
    fill_uniform(x, nx, 22, -1, 1);
    fill_uniform(sw, (size_t)so * c, 23, -1, 1);
    const cf_kernel_table *active = cf_active_kernels;
    cf_conv_bf16_pack(&g, o, w, packed);
    if (so) cf_conv_bf16_pack(&sg, so, sw, spacked);
    const cf_conv_shortcut sc0 = {.out_channels = so, .w = spacked, .y = sy0},
                           sc1 = {.out_channels = so, .w = spacked, .y = sy1};
    bound_lo = (const uint32_t *)part;
    bound_hi = bound_lo + words;
    bound_past = 0;
    bound_gap = (ptrdiff_t)words;
    cf_active_kernels = &bounding_table;
    assert_int_equal(so ? cf_conv_bf16_forward_with(&g, o, packed, x, n, y0, part, &sc0)
                        : cf_conv_bf16_forward(&g, o, packed, x, n, y0, part),
                     CF_OK);
    cf_active_kernels = active;
    assert_int_equal(so ? cf_conv_bf16_forward_with(&g, o, packed, x, n, y1, whole, &sc1)
                        : cf_conv_bf16_forward(&g, o, packed, x, n, y1, whole),
                     CF_OK);
    same_bits(y0, y1, ny, "the forward's part of the scratch alone");
    same_bits(sy0, sy1, nsy, "the forward's part of the scratch alone (shortcut)");
    printf("%d images %d -> %d %dx%d stride %d %dx%d, shortcut %d: the last tiles read up to word "
           "%zu of the next slot, "
           "past the last image, %td words before the end of the forward's %zu\n",
           n, c, o, k, k, s, h, h, so, bound_past, bound_gap, words);
    free(w), free(x), free(sw), free(y0), free(y1), free(sy0), free(sy1);
    free(packed), free(spacked), free(part), free(whole);
    return bound_past;
}

/* Shapes whose input's pair planes (a slot of the call) are longer than the tiles' buffer that
 * follows the call's slots: wide inputs into 17-64 channels, whole calls (the last one's over-read
 * goes past the slots). Before conv_bf16.c sized that buffer as at least one slot, these reads ran
 * past the forward's part of the scratch (into the weight gradient's; ASan flags it here, where the
 * part is its own allocation). Each must read past its last image, or it tests nothing. */
static void test_cols_scratch_bounds(void **state) {
    (void)state;
    if (!level_ready()) return;
    assert_true(bounded_forward(4, 64, 17, 28, 3, 2, 0) > 0);  /* 2 images a call */
    assert_true(bounded_forward(2, 256, 33, 13, 3, 1, 0) > 0); /* tiles of 8 */
    assert_true(bounded_forward(4, 64, 64, 20, 7, 2, 0) > 0);  /* 10 x 10: 4 a call, pad 3 */
    assert_true(bounded_forward(8, 256, 64, 7, 3, 1, 0) > 0);  /* 7 x 7: 8 a call */
    assert_true(bounded_forward(2, 256, 32, 28, 1, 2, 0) > 0); /* the 1x1 stride-2 shortcut */
    assert_true(bounded_forward(4, 96, 48, 28, 3, 2, 32) > 0); /* paired with a shortcut */
    /* W1's own layers: the same bound */
    assert_true(bounded_forward(2, 16, 32, 28, 3, 2, 32) > 0);
    assert_true(bounded_forward(8, 64, 64, 7, 3, 1, 0) > 0);
}

/* dx against the double sum of the bf16 operands of a stride-1 layer (dx[c][u][v] = the sum over o
 * and taps of w[o][c][ki][kj] dy[o][u + pad - ki][v + pad - kj]), on the first two images. */
static void check_dx_values(const cf_conv_geom *g, int o, const float *w32, const float *dy32,
                            int n, const float *dx, const char *what) {
    const size_t nw = (size_t)o * g->c * g->kh * g->kw, ndy = (size_t)n * o * g->oh * g->ow;
    float *w = bf16_values(w32, nw), *dy = bf16_values(dy32, ndy);
    for (int im = 0; im < n && im < 2; im++)
        for (int c = 0; c < g->c; c++)
            for (int u = 0; u < g->h; u++)
                for (int v = 0; v < g->w; v++) {
                    double sum = 0, mag = 0;
                    for (int r = 0; r < o; r++)
                        for (int ki = 0; ki < g->kh; ki++)
                            for (int kj = 0; kj < g->kw; kj++) {
                                const int i = u + g->ph - ki, j = v + g->pw - kj;
                                if (i < 0 || j < 0 || i >= g->oh || j >= g->ow) continue;
                                const double t =
                                    (double)w[(((size_t)r * g->c + c) * g->kh + ki) * g->kw + kj] *
                                    dy[(((size_t)im * o + r) * g->oh + i) * g->ow + j];
                                sum += t;
                                mag += fabs(t);
                            }
                    const double got = dx[(((size_t)im * g->c + c) * g->h + u) * g->w + v];
                    if (!(fabs(got - sum) <= 1e-5 * mag + 1e-6))
                        fail_msg("%s: dx of image %d channel %d (%d, %d): %.9g, the sum is %.9g",
                                 what, im, c, u, v, got, sum);
                }
    free(w);
    free(dy);
}

/* dx of n images of a stride-1 layer c -> o, k x k, on h x h images (or of the 1x1 stride-2
 * shortcut, k = 1), three ways: cf_conv_bf16_dx (dy rounded from fp32), cf_conv_bf16_backward
 * with dW (dy's pairs from dW's bf16 rows) and without; each with the active table, then without
 * conv_cols, every dx (and dW) compared bitwise. cols: whether dx must take conv_cols (counted
 * over dx's calls alone: no forward runs here). tables: false at a level without conv_cols
 * (amx), which checks the values alone. */
static void check_dx_case(int n, int c, int o, int h, int k, bool cols, bool tables) {
    cf_conv_geom g;
    const bool sub = k == 1;
    const int pad = sub ? 0 : (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, sub ? 2 : 1, sub ? 2 : 1, pad, pad));
    char what[96];
    snprintf(what, sizeof what, "dx of %d images %d -> %d %dx%d %s %dx%d", n, c, o, k, k,
             sub ? "stride 2" : "stride 1", h, h);
    assert_true(cf_conv_bf16_supported(&g, o));
    const size_t nw = (size_t)o * c * k * k, nx = (size_t)n * c * h * h,
                 ndy = (size_t)n * o * g.oh * g.ow;
    float *w = malloc(nw * sizeof(float)), *x = malloc(nx * sizeof(float)),
          *dy = malloc(ndy * sizeof(float));
    float *packed = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float));
    float *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float));
    float *dx[2][3], *dw[2];
    fill_uniform(w, nw, 41, -1, 1);
    fill_uniform(x, nx, 42, -1, 1);
    fill_uniform(dy, ndy, 43, -1, 1);
    const cf_kernel_table *active = cf_active_kernels;
    for (int pass = 0; pass < (tables ? 2 : 1); pass++) { /* counting conv_cols, then without */
        if (tables) cf_active_kernels = pass == 0 ? &counting_table : &without_table;
        dw[pass] = malloc(nw * sizeof(float));
        cf_conv_bf16_pack(&g, o, w, packed);
        for (int way = 0; way < 3; way++) {
            float *d = dx[pass][way] = malloc(nx * sizeof(float));
            for (size_t i = 0; i < nx; i++) d[i] = 1e30f; /* every value written */
            atomic_store(&cols_calls, 0);
            if (way == 0)
                assert_int_equal(cf_conv_bf16_dx(&g, o, packed, dy, n, d, scratch), CF_OK);
            else
                assert_int_equal(cf_conv_bf16_backward(&g, o, packed, dy, x, n,
                                                       way == 1 ? dw[pass] : NULL, d, scratch, NULL,
                                                       NULL),
                                 CF_OK);
            if (tables && pass == 0 && cols != (atomic_load(&cols_calls) > 0))
                fail_msg("%s (way %d): conv_cols called %d times, expected %s", what, way,
                         atomic_load(&cols_calls), cols ? "some" : "none");
        }
    }
    cf_active_kernels = active;
    for (int way = 0; way < 3; way++) {
        if (tables) same_bits(dx[0][way], dx[1][way], nx, what);
        if (way) same_bits(dx[0][way], dx[0][0], nx, what); /* the three ways agree */
    }
    if (tables) same_bits(dw[0], dw[1], nw, what);
    if (!sub) check_dx_values(&g, o, w, dy, n, dx[0][1], what);
    for (int pass = 0; pass < (tables ? 2 : 1); pass++) {
        for (int way = 0; way < 3; way++) free(dx[pass][way]);
        free(dw[pass]);
    }
    free(w);
    free(x);
    free(dy);
    free(packed);
    free(scratch);
}

/* W1's stride-1 layers (32 -> 32 on 14 x 14: calls of 2 images, blocks of 2; 64 -> 64 on 7 x 7:
 * calls of up to 8, blocks of 7), batches of 64 and counts that end calls and blocks early; odd
 * channels both ways (a pair's high half zero), 3 vectors of input channels (tiles of 8), 17
 * (the second vector one channel), 5x5 and 7x7 kernels, odd planes; and where dx does not take
 * it: 16 or 65 input channels and more (whatever o), planes narrower than a tile or of more than
 * 256 positions, stride 2 and the 1x1 shortcut (their own dx). */
static void test_dx_shapes(void **state) {
    (void)state;
    if (!level_ready()) return;
    const int counts[] = {64, 11, 1};
    for (int i = 0; i < 3; i++) {
        check_dx_case(counts[i], 32, 32, 14, 3, true, true);
        check_dx_case(counts[i], 64, 64, 7, 3, true, true);
    }
    check_dx_case(5, 33, 15, 16, 3, true, true);
    check_dx_case(3, 17, 24, 12, 3, true, true);
    check_dx_case(4, 48, 8, 10, 5, true, true);
    check_dx_case(9, 64, 17, 13, 3, true, true);
    check_dx_case(3, 41, 9, 9, 3, true, true);
    check_dx_case(2, 24, 30, 15, 7, true, true);
    check_dx_case(3, 16, 32, 14, 3, false, true);
    check_dx_case(2, 80, 16, 14, 3, false, true);
    check_dx_case(3, 40, 9, 6, 3, false, true);   /* 6 wide, tiles of 8 */
    check_dx_case(2, 32, 16, 20, 3, false, true); /* 400 positions */
    /* the shortcut alone: dx_subsampled, with or without conv_cols */
    check_dx_case(3, 32, 64, 14, 1, false, true);
}

/* dx against the double sum of the bf16 operands of a stride-2 layer (dx[c][u][v] = the sum over o
 * and the taps with u + pad - ki = 2i, v + pad - kj = 2j of w[o][c][ki][kj] dy[o][i][j]), plus a
 * paired shortcut's (so > 0: its sw[r][c] sdy[r][u / 2][v / 2] where u and v are even), on the
 * first two images. */
static void check_dx2_values(const cf_conv_geom *g, int o, const float *w32, const float *dy32,
                             int so, const float *sw32, const float *sdy32, int n, const float *dx,
                             const char *what) {
    const size_t nw = (size_t)o * g->c * g->kh * g->kw, ndy = (size_t)n * o * g->oh * g->ow,
                 nsw = (size_t)so * g->c, nsdy = (size_t)n * so * g->oh * g->ow;
    float *w = bf16_values(w32, nw), *dy = bf16_values(dy32, ndy);
    float *sw = so ? bf16_values(sw32, nsw) : NULL, *sdy = so ? bf16_values(sdy32, nsdy) : NULL;
    for (int im = 0; im < n && im < 2; im++)
        for (int c = 0; c < g->c; c++)
            for (int u = 0; u < g->h; u++)
                for (int v = 0; v < g->w; v++) {
                    double sum = 0, mag = 0;
                    for (int r = 0; r < o; r++)
                        for (int ki = 0; ki < g->kh; ki++)
                            for (int kj = 0; kj < g->kw; kj++) {
                                const int a = u + g->ph - ki, b = v + g->pw - kj;
                                if (a < 0 || b < 0 || a % 2 || b % 2 || a / 2 >= g->oh ||
                                    b / 2 >= g->ow)
                                    continue;
                                const double t =
                                    (double)w[(((size_t)r * g->c + c) * g->kh + ki) * g->kw + kj] *
                                    dy[(((size_t)im * o + r) * g->oh + a / 2) * g->ow + b / 2];
                                sum += t;
                                mag += fabs(t);
                            }
                    for (int r = 0; r < so && u % 2 == 0 && v % 2 == 0; r++) {
                        const double t =
                            (double)sw[(size_t)r * g->c + c] *
                            sdy[(((size_t)im * so + r) * g->oh + u / 2) * g->ow + v / 2];
                        sum += t;
                        mag += fabs(t);
                    }
                    const double got = dx[(((size_t)im * g->c + c) * g->h + u) * g->w + v];
                    if (!(fabs(got - sum) <= 1e-5 * mag + 1e-6))
                        fail_msg("%s: dx of image %d channel %d (%d, %d): %.9g, the sum is %.9g",
                                 what, im, c, u, v, got, sum);
                }
    free(w);
    free(dy);
    free(sw);
    free(sdy);
}

/* Stride 2's dx of n images of a k x k layer c -> o (pad (k - 1) / 2) on h x h images, with a
 * paired 1x1 shortcut of so channels (0: none), three ways: cf_conv_bf16_dx (or _dx_with),
 * cf_conv_bf16_backward with dW and the shortcut's dW (dy's pairs, and the shortcut's, from dW's
 * bf16 rows) and without either (from fp32); each with the active table, then without conv_cols,
 * every dx and dW compared bitwise, and the three ways with each other. cols: whether dx must
 * take conv_cols (dx2_cols: 17 to 64 input channels, phases at least 6 wide, at most 256
 * positions; no forward runs here). Without a shortcut, one more cf_conv_bf16_dx goes through
 * the bounding wrapper with the forward's and dx's part of the scratch alone, allocated to its
 * size. */
static void check_dx2_case(int n, int c, int o, int h, int k, int so, bool cols) {
    cf_conv_geom g, sg;
    const int pad = (k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, c, h, h, k, k, 2, 2, pad, pad));
    assert_true(cf_conv_geom_init(&sg, c, h, h, 1, 1, 2, 2, 0, 0));
    char what[112];
    snprintf(what, sizeof what, "stride 2's dx of %d images %d -> %d %dx%d %dx%d, shortcut %d", n,
             c, o, k, k, h, h, so);
    assert_true(cf_conv_bf16_supported(&g, o));
    if (so) assert_true(cf_conv_bf16_pair_fits(&g, o, &sg, so));
    const size_t nw = (size_t)o * c * k * k, nx = (size_t)n * c * h * h,
                 ndy = (size_t)n * o * g.oh * g.ow, nsw = (size_t)so * c + 1,
                 nsdy = (size_t)n * so * g.oh * g.ow + 1;
    float *w = malloc(nw * sizeof(float)), *x = malloc(nx * sizeof(float)),
          *dy = malloc(ndy * sizeof(float)), *sw = malloc(nsw * sizeof(float)),
          *sdy = malloc(nsdy * sizeof(float));
    float *packed = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float));
    float *spacked = malloc(cf_conv_bf16_packed_floats(&sg, so ? so : 1) * sizeof(float));
    float *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float));
    float *dx[2][3], *dw[2], *sdw[2];
    fill_uniform(w, nw, 81, -1, 1);
    fill_uniform(x, nx, 82, -1, 1);
    fill_uniform(dy, ndy, 83, -1, 1);
    fill_uniform(sw, nsw, 84, -1, 1);
    fill_uniform(sdy, nsdy, 85, -1, 1);
    const cf_kernel_table *active = cf_active_kernels;
    for (int pass = 0; pass < 2; pass++) { /* counting conv_cols, then without */
        cf_active_kernels = pass == 0 ? &counting_table : &without_table;
        dw[pass] = malloc(nw * sizeof(float));
        sdw[pass] = malloc(nsw * sizeof(float));
        cf_conv_bf16_pack(&g, o, w, packed);
        if (so) cf_conv_bf16_pack(&sg, so, sw, spacked);
        const cf_conv_shortcut sc = {.out_channels = so, .w = spacked, .dy = sdy, .dw = sdw[pass]};
        for (int way = 0; way < 3; way++) {
            float *d = dx[pass][way] = malloc(nx * sizeof(float));
            for (size_t i = 0; i < nx; i++) d[i] = 1e30f; /* every value written */
            atomic_store(&cols_calls, 0);
            if (way == 0 && so)
                assert_int_equal(cf_conv_bf16_dx_with(&g, o, packed, dy, n, d, scratch, &sc),
                                 CF_OK);
            else if (way == 0)
                assert_int_equal(cf_conv_bf16_dx(&g, o, packed, dy, n, d, scratch), CF_OK);
            else
                assert_int_equal(
                    cf_conv_bf16_backward(&g, o, packed, dy, x, n, way == 1 ? dw[pass] : NULL, d,
                                          scratch, way == 1 && so ? &sc : NULL, so ? &sc : NULL),
                    CF_OK);
            if (pass == 0 && cols != (atomic_load(&cols_calls) > 0)) {
                cf_active_kernels = active;
                fail_msg("%s (way %d): conv_cols called %d times, expected %s", what, way,
                         atomic_load(&cols_calls), cols ? "some" : "none");
            }
        }
    }
    if (!so) { /* conv_cols' reads within the forward's and dx's part of the scratch */
        const size_t part = cf__conv_bf16_run_scratch(&g, o);
        float *alone = malloc(part * sizeof(float)), *d = malloc(nx * sizeof(float));
        cf_active_kernels = &bounding_table;
        bound_lo = (const uint32_t *)alone;
        bound_hi = bound_lo + part;
        cf_conv_bf16_pack(&g, o, w, packed);
        const cf_status st = cf_conv_bf16_dx(&g, o, packed, dy, n, d, alone);
        cf_active_kernels = active;
        assert_int_equal(st, CF_OK);
        same_bits(d, dx[0][0], nx, what);
        free(alone);
        free(d);
    }
    cf_active_kernels = active;
    for (int way = 0; way < 3; way++) {
        same_bits(dx[0][way], dx[1][way], nx, what);
        if (way) same_bits(dx[0][way], dx[0][0], nx, what); /* the three ways agree */
    }
    same_bits(dw[0], dw[1], nw, what);
    if (so) same_bits(sdw[0], sdw[1], (size_t)so * c, what);
    check_dx2_values(&g, o, w, dy, so, sw, sdy, n, dx[0][1], what);
    for (int pass = 0; pass < 2; pass++) {
        for (int way = 0; way < 3; way++) free(dx[pass][way]);
        free(dw[pass]);
        free(sdw[pass]);
    }
    free(w), free(x), free(dy), free(sw), free(sdy), free(packed), free(spacked), free(scratch);
}

/* Stride 2's dx over its phases' own positions (dx2_cols): W1's second block (32 -> 64 on 14 x 14,
 * 7 x 7 phases: conv_cols' tiles of a row, 7; calls and blocks of 8 images, batches that end them
 * early) alone and paired with its shortcut; phases 14 wide (tiles of 12), 3 and 4 vectors of
 * channels, 17 channels, odd channels both ways, a shortcut of odd channels, 5x5 and 7x7 kernels;
 * and where it does not apply: W1's first block (16 input channels), more than 64, phases 5 wide or
 * of more than 256 positions. */
static void test_dx_stride2(void **state) {
    (void)state;
    if (!level_ready()) return;
    const int counts[] = {64, 11, 1};
    for (int i = 0; i < 3; i++) {
        check_dx2_case(counts[i], 32, 64, 14, 3, 0, true);
        check_dx2_case(counts[i], 32, 64, 14, 3, 64, true);
    }
    check_dx2_case(5, 24, 16, 28, 3, 24, true); /* 14 wide: tiles of 12 */
    check_dx2_case(3, 40, 24, 14, 3, 40, true); /* 3 vectors, 7 wide: tiles of 7 */
    check_dx2_case(4, 48, 7, 16, 3, 9, true);   /* 3 vectors, 8 wide: tiles of 8; odd o */
    check_dx2_case(3, 64, 64, 14, 3, 64, true); /* 4 vectors: tiles of 6 */
    check_dx2_case(3, 17, 33, 22, 3, 17, true); /* 11 wide: tiles of 11 */
    check_dx2_case(2, 36, 20, 12, 3, 0, true);  /* 3 vectors, 6 wide: tiles of 6 */
    check_dx2_case(3, 30, 12, 16, 3, 0, true);  /* 8 wide: tiles of 8 */
    check_dx2_case(2, 33, 10, 24, 5, 0, true);
    check_dx2_case(2, 20, 12, 28, 7, 5, true);
    check_dx2_case(3, 16, 32, 28, 3, 32, false); /* W1's first block */
    check_dx2_case(2, 80, 16, 14, 3, 0, false);
    check_dx2_case(2, 32, 16, 10, 3, 0, false); /* 5 wide */
    check_dx2_case(2, 32, 16, 34, 3, 0, false); /* 289 positions */
}

/* dx of a Conv2d layer in bf16 (forward, then backward with dx) on `threads` threads with the
 * given table; the number of conv_cols calls in its backward. */
static int layer_dx(int n, int c, int h, int threads, const cf_kernel_table *table, const float *x,
                    const float *dy, float *dx) {
    const cf_kernel_table *active = cf_active_kernels;
    cf_active_kernels = table;
    cf_set_num_threads(threads);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_conv2d(c, c, 3, 1, 1, false), 3), CF_OK);
    assert_int_equal(cf_conv_set_bf16(model->root, true), 1);
    cf_model_train(model, true);
    cf_model_zero_grad(model);
    const cf_tensor tx = cf_tensor_view((float *)x, cf_shape4(n, c, h, h));
    const cf_tensor *ty;
    assert_int_equal(cf_model_forward(model, &tx, &ty), CF_OK);
    const cf_tensor tdy = cf_tensor_view((float *)dy, ty->shape);
    atomic_store(&cols_calls, 0);
    const cf_tensor *tdx = model->root->ops->backward(model->root, &tdy, true);
    const int calls = atomic_load(&cols_calls);
    assert_non_null(tdx);
    memcpy(dx, tdx->data, cf_tensor_numel(&tx) * sizeof(float));
    cf_model_free(model);
    cf_set_num_threads(0);
    cf_active_kernels = active;
    return calls;
}

/* W1's two stride-1 layers as Conv2d layers on 1, 2 and 3 threads, batches that split unevenly
 * (blocks and calls ending early): dx bitwise the same on every thread count, with conv_cols
 * (which its backward must call) and without. */
static void test_dx_threads(void **state) {
    (void)state;
    if (!level_ready()) return;
    static const int cases[][3] = {{11, 32, 14}, {13, 64, 7}, {2, 32, 14}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int n = cases[i][0], c = cases[i][1], h = cases[i][2];
        const size_t nx = (size_t)n * c * h * h;
        float *x = malloc(nx * 4), *dy = malloc(nx * 4), *ref = malloc(nx * 4),
              *dx = malloc(nx * 4);
        fill_uniform(x, nx, 60 + i, -2, 2);
        fill_uniform(dy, nx, 70 + i, -1, 1);
        layer_dx(n, c, h, 1, &without_table, x, dy, ref);
        for (int threads = 1; threads <= 3; threads++)
            for (int pass = 0; pass < 2; pass++) {
                char what[96];
                snprintf(what, sizeof what, "Conv2d %d -> %d %dx%d, %d images, %d threads%s", c, c,
                         h, h, n, threads, pass ? ", without conv_cols" : "");
                const int calls =
                    layer_dx(n, c, h, threads, pass ? &without_table : &counting_table, x, dy, dx);
                if (pass == 0 && calls == 0)
                    fail_msg("%s: its backward did not call conv_cols", what);
                same_bits(dx, ref, nx, what);
            }
        free(x), free(dy), free(ref), free(dx);
    }
}

/* At a level with bf16 convolutions and no conv_cols (amx), stride 1's dx of W1's layers and of
 * odd shapes through conv_run, with the pack that now holds dx's columns: the three ways agree
 * and the values are the double sums'. */
static void test_dx_without_cols(void **state) {
    (void)state;
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, 32, 14, 14, 3, 3, 1, 1, 1, 1));
    if (!cf_conv_bf16_supported(&g, 32) || cf_active_kernels->bf16->conv_cols) return;
    check_dx_case(11, 32, 32, 14, 3, false, false);
    check_dx_case(9, 64, 64, 7, 3, false, false);
    check_dx_case(5, 33, 15, 16, 3, false, false);
}

/* fwd_pairs_rows and fwd_deal_pairs write pairs_rows' and deal_pairs' words, on rows of every
 * width up to 70 (vector tails), with and without hi and o, vectors with and without a subnormal
 * (the odd rows hold only ordinary values: the conversion instruction's own path). */
static void test_input_pairs(void **state) {
    (void)state;
    if (!level_ready()) return;
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    assert_non_null(k->fwd_pairs_rows);
    assert_non_null(k->fwd_deal_pairs);
    enum { H = 5, W = 70, LD = 80 };
    float lo[H * W], hi[H * W];
    uint32_t a[H * LD], b[H * LD], ao[H * LD], bo[H * LD];
    fill_bf16_specials(lo, H * W, 21);
    fill_bf16_specials(hi, H * W, 22);
    for (int i = 1; i < H; i += 2) { /* rows without special values */
        fill_uniform(lo + i * W, W, 23 + i, -1, 1);
        fill_uniform(hi + i * W, W, 33 + i, -1, 1);
    }
    for (int w = 1; w <= W; w++)
        for (int with_hi = 0; with_hi < 2; with_hi++) {
            const float *h = with_hi ? hi : NULL;
            memset(a, 0xa5, sizeof a);
            memset(b, 0xa5, sizeof b);
            k->pairs_rows(lo, h, H, w, a, LD);
            k->fwd_pairs_rows(lo, h, H, w, b, LD);
            if (memcmp(a, b, sizeof a) != 0)
                fail_msg("fwd_pairs_rows: rows of %d (hi %d) differ from pairs_rows'", w, with_hi);
            for (int with_o = 0; with_o < 2; with_o++) {
                memset(a, 0xa5, sizeof a);
                memset(b, 0xa5, sizeof b);
                memset(ao, 0x5a, sizeof ao);
                memset(bo, 0x5a, sizeof bo);
                k->deal_pairs(lo, h, W, H, w, a, with_o ? ao : NULL, LD);
                k->fwd_deal_pairs(lo, h, W, H, w, b, with_o ? bo : NULL, LD);
                if (memcmp(a, b, sizeof a) != 0 || memcmp(ao, bo, sizeof ao) != 0)
                    fail_msg("fwd_deal_pairs: rows of %d (hi %d, o %d) differ from deal_pairs'", w,
                             with_hi, with_o);
            }
        }
}

/* ---- conv_cols' output prefetch ------------------------------------------------------------
 * The level's conv_cols called directly, with its prefetch of the output planes' lines for
 * writing (cf__conv_bf16_set_cols_prefetch) and without: the planes memcmp-equal, gaps
 * included, and each value against a double sum of the same bf16 words. out's rows lie ldo =
 * h w + 3 apart and its images m ldo + 5 apart, the gaps filled with a pattern that must stay (a
 * prefetch for writing must not write). 3 x 3 taps over 3 channel pairs; planes 28 x 28, 14 x 14
 * and 7 x 7, and rows 6 to 11 wide (tiles of a row where the row is narrower than the usual tile:
 * 17 to 32 channels below 12, 33 to 48 below 8), m = 17, 32, 33, 48 and 64 (conv_cols' range:
 * 16 channels or fewer never take it), 1 and 3 images (an image's end inside a tile). */
static uint32_t random_pair(uint32_t *state) {
    uint32_t word = 0;
    for (int half = 0; half < 2; half++) {
        *state = *state * 1664525u + 1013904223u;
        const float v = ((float)(*state >> 8) / 16777216.0f) * 2.0f - 1.0f;
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        word |= (bits >> 16) << (16 * half);
    }
    return word;
}

static double pair_dot(uint32_t a, uint32_t b) {
    double sum = 0;
    for (int half = 0; half < 2; half++) {
        const uint32_t ab = (a >> (16 * half) & 0xffffu) << 16, bb = (b >> (16 * half) & 0xffffu)
                                                                     << 16;
        float av, bv;
        memcpy(&av, &ab, sizeof av);
        memcpy(&bv, &bb, sizeof bv);
        sum += (double)av * bv;
    }
    return sum;
}

static void check_out_prefetch(int m, int h, int wd, int n_images) {
    enum { PAIRS = 3, TAPS = 9 };
    const int nv = (m + 15) / 16, np0 = 24 / nv, np = wd < np0 ? wd : np0, hw = h * wd;
    const size_t ldx = (size_t)wd + 2, plane = (h + 2) * ldx + 16, ldimg = PAIRS * plane,
                 ldw = (size_t)16 * nv, ldo = (size_t)hw + 3, ldoimg = (size_t)m * ldo + 5,
                 nout = (size_t)n_images * ldoimg,
                 ntmp = (size_t)((n_images * hw + np - 1) / np * np) * ldw;
    uint32_t *x = malloc((size_t)(n_images + 1) * ldimg * sizeof(uint32_t));
    uint32_t *w = calloc((size_t)TAPS * PAIRS * ldw, sizeof(uint32_t));
    float *out[2] = {malloc(nout * sizeof(float)), malloc(nout * sizeof(float))};
    float *tmp = malloc(ntmp * sizeof(float));
    uint32_t state = (uint32_t)(m * 1000 + h * 37 + wd * 7 + n_images);
    for (size_t i = 0; i < (size_t)(n_images + 1) * ldimg; i++) x[i] = random_pair(&state);
    for (int tp = 0; tp < TAPS * PAIRS; tp++)
        for (int r = 0; r < m; r++) w[(size_t)tp * ldw + r] = random_pair(&state);
    int off[TAPS];
    for (int t = 0; t < TAPS; t++) off[t] = (int)((size_t)(t / 3) * ldx) + t % 3;
    char what[96];
    snprintf(what, sizeof what, "conv_cols of %d images, %d channels, %d x %d", n_images, m, h, wd);
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    for (int pass = 0; pass < 2; pass++) { /* without the prefetch, then with it */
        for (size_t i = 0; i < nout; i++) out[pass][i] = -7.5e29f;
        cf__conv_bf16_set_cols_prefetch(pass == 1);
        k->conv_cols(TAPS, off, PAIRS, m, w, x, plane, ldx, ldimg, h, wd, n_images, out[pass], ldo,
                     ldoimg, tmp, pass ? x : NULL, pass ? ldimg * sizeof(uint32_t) : 0);
    }
    cf__conv_bf16_set_cols_prefetch(true);
    if (memcmp(out[0], out[1], nout * sizeof(float)) != 0) same_bits(out[1], out[0], nout, what);
    for (int b = 0; b < n_images; b++)
        for (int r = 0; r < m; r++) {
            const float *o = out[1] + (size_t)b * ldoimg + (size_t)r * ldo;
            for (size_t q = (size_t)hw; q < (r + 1 < m ? ldo : ldo + 5); q++)
                if (o[q] != -7.5e29f)
                    fail_msg("%s: a gap after image %d row %d written", what, b, r);
            for (int q = 0; q < hw; q++) {
                const uint32_t *xq = x + (size_t)b * ldimg + (size_t)(q / wd) * ldx + q % wd;
                double sum = 0, mag = 0;
                for (int t = 0; t < TAPS; t++)
                    for (int p = 0; p < PAIRS; p++) {
                        const double d = pair_dot(w[(size_t)(t * PAIRS + p) * ldw + r],
                                                  xq[(size_t)p * plane + off[t]]);
                        sum += d;
                        mag += fabs(d);
                    }
                if (!(fabs(o[q] - sum) <= 1e-5 * mag + 1e-6))
                    fail_msg("%s: image %d channel %d position %d: %.9g, the sum is %.9g", what, b,
                             r, q, (double)o[q], sum);
            }
        }
    free(x);
    free(w);
    free(out[0]);
    free(out[1]);
    free(tmp);
}

static void test_out_prefetch(void **state) {
    (void)state;
    if (!level_ready()) return;
    static const int ms[] = {17, 32, 33, 48, 64};
    static const int sizes[][2] = {{28, 28}, {14, 14}, {7, 7},  {5, 6}, {4, 7},
                                   {3, 8},   {5, 9},   {4, 10}, {3, 11}};
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 9; j++)
            for (int n = 1; n <= 3; n += 2) check_out_prefetch(ms[i], sizes[j][0], sizes[j][1], n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_w1_layers),           cmocka_unit_test(test_other_shapes),
        cmocka_unit_test(test_elsewhere),           cmocka_unit_test(test_input_pairs),
        cmocka_unit_test(test_dx_shapes),           cmocka_unit_test(test_dx_stride2),
        cmocka_unit_test(test_dx_threads),          cmocka_unit_test(test_dx_without_cols),
        cmocka_unit_test(test_cols_scratch_bounds), cmocka_unit_test(test_out_prefetch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
