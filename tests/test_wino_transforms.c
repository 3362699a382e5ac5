/* The Winograd F(2x2, 3x3) kernels of the active table (cf_wino_kernels, winograd_loops.h, and
 * the bf16 GEMM's gemm_rows) against scalar references that do the same operations in the same
 * order, bitwise:
 *
 *   input       V = B^T d B of every tile (the plane split first), rows shorter than a vector
 *               (several rows a load), as long and longer, odd planes, bands of tile rows
 *   output      Y = A^T M A of every tile, on planes whose rows of tiles fill a vector and on
 *               those shorter than one (2x2 to 16x16 planes, the band of tile rows vectorised
 *               whole; at AVX512_BF16 a channel's tiles of all the images), odd planes, bands of
 *               tile rows, several images, a band whose tiles end inside a vector, images that
 *               change inside a vector
 *   input_bf16  V = B^T d B rounded to bf16 (cf_fp32_to_bf16) against `input` rounded after
 *   bf16 stores input_pairs, dy_pairs and input_bf16 on values that round apart (subnormals, NaNs,
 *               infinities, ties) against `input` and dy_nhwc rounded after
 *   direct      input_pairs and input_bf16 on planes of 32k columns and of 4, 8 and 16 columns
 *               (the AVX512_BF16 level's transforms from the image's rows, no split; the short
 *               planes' vectors across tile rows and images, their stores without the subnormal
 *               test where the inputs allow) against `input` rounded after
 *   dy_pairs_nchw  dy_pairs from dy as the layer holds it against dy_pairs on a pixel-major copy
 *               (its stores without the subnormal test where a window's inputs allow)
 *   gemm_rows   A as rows of pairs against the same A packed (gemm_pack_a, gemm_paired): partial
 *               row blocks, partial panels, odd k, several k-blocks
 *
 * Run at every level (tests/wino_transforms.cmake); a level without the kernel skips that part. */
#include "oracle.h"
#include "tensor/kernel_table.h"

#include <stdio.h>
#include <string.h>

static void expect_bitwise(const char *what, const void *a, const void *b, size_t n, size_t size) {
    const unsigned char *pa = a, *pb = b;
    for (size_t i = 0; i < n; i++)
        if (memcmp(pa + i * size, pb + i * size, size) != 0)
            fail_msg("%s: element %zu differs (%#x against %#x)", what, i,
                     size == 4 ? *(const unsigned *)(pa + i * size)
                               : *(const unsigned short *)(pa + i * size),
                     size == 4 ? *(const unsigned *)(pb + i * size)
                               : *(const unsigned short *)(pb + i * size));
}

/* Y of one tile from its 16 values m[xi], the sums in loops_wino_output's order. */
static void output_tile(const float m[16], float y[2][2]) {
    float a[4], b[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (m[4 * i] + m[4 * i + 1]) + m[4 * i + 2];
        b[i] = (m[4 * i + 1] - m[4 * i + 2]) - m[4 * i + 3];
    }
    y[0][0] = (a[0] + a[1]) + a[2];
    y[0][1] = (b[0] + b[1]) + b[2];
    y[1][0] = (a[1] - a[2]) - a[3];
    y[1][1] = (b[1] - b[2]) - b[3];
}

static void test_output(void **state) {
    (void)state;
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    if (!wk) {
        printf("kernels %s: no Winograd transforms\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    /* images, channels, h, w, ty0, th (0: to the last tile row); from {7, 3, 4, 4}: the
     * AVX512_BF16 level's vectors over the images of 4, 8 and 16 column planes (a tail of 12
     * tiles, bands of odd tile rows whose images change inside a vector and inside a 128-bit
     * lane pair of 4-column planes) */
    static const int cases[][6] = {
        {3, 5, 4, 4, 0, 0},   {2, 3, 2, 2, 0, 0}, {2, 4, 8, 8, 0, 0},  {2, 3, 16, 16, 0, 0},
        {1, 2, 32, 32, 0, 0}, {3, 2, 8, 8, 1, 3}, {2, 3, 4, 8, 0, 0},  {2, 2, 6, 4, 0, 0},
        {2, 3, 12, 8, 0, 0},  {2, 2, 5, 7, 0, 0}, {1, 2, 7, 4, 0, 0},  {2, 2, 16, 16, 2, 5},
        {1, 2, 40, 40, 3, 4}, {2, 3, 4, 2, 0, 0}, {5, 2, 2, 4, 0, 0},  {7, 3, 4, 4, 0, 0},
        {9, 2, 6, 4, 0, 0},   {3, 2, 6, 4, 1, 2}, {5, 2, 10, 8, 1, 3}, {3, 2, 10, 16, 2, 3},
        {3, 2, 14, 4, 1, 5},  {6, 1, 8, 4, 0, 0}, {4, 2, 2, 16, 0, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int n_images = cases[ci][0], ch = cases[ci][1], h = cases[ci][2], w = cases[ci][3];
        const int th_all = (h + 1) / 2, tw = (w + 1) / 2, ty0 = cases[ci][4];
        const int th = cases[ci][5] ? cases[ci][5] : th_all - ty0;
        const int ldm = n_images * th * tw + 5;
        const size_t m_xi = (size_t)ch * ldm + 3, plane = (size_t)h * w;
        float *m = malloc(16 * m_xi * sizeof(float));
        float *y = malloc((size_t)n_images * ch * plane * sizeof(float));
        float *want = malloc((size_t)n_images * ch * plane * sizeof(float));
        fill_uniform(m, 16 * m_xi, 7 + ci, -3, 3);
        fill_uniform(y, (size_t)n_images * ch * plane, 9 + ci, -1, 1);
        memcpy(want, y, (size_t)n_images * ch * plane * sizeof(float));
        for (int n = 0; n < n_images; n++)
            for (int k = 0; k < ch; k++)
                for (int ty = ty0; ty < ty0 + th; ty++)
                    for (int tx = 0; tx < tw; tx++) {
                        const size_t t = ((size_t)n * th + ty - ty0) * tw + tx;
                        float v[16], o[2][2];
                        for (int xi = 0; xi < 16; xi++) v[xi] = m[xi * m_xi + k * ldm + t];
                        output_tile(v, o);
                        for (int i = 0; i < 2; i++)
                            for (int j = 0; j < 2; j++)
                                if (2 * ty + i < h && 2 * tx + j < w)
                                    want[((size_t)n * ch + k) * plane + (size_t)(2 * ty + i) * w +
                                         2 * tx + j] = o[i][j];
                    }
        wk->output(m, m_xi, ldm, ch, h, w, n_images, ty0, th, y, (size_t)ch * plane);
        char what[96];
        snprintf(what, sizeof what, "output %dx%d, %d images, tile rows %d..%d", h, w, n_images,
                 ty0, ty0 + th - 1);
        expect_bitwise(what, y, want, (size_t)n_images * ch * plane, sizeof(float));
        free(m), free(y), free(want);
    }
}

/* V = B^T d B of one tile's patch d[row][column], the sums in loops_wino_input's order. */
static void input_tile(const float d[4][4], float v[16]) {
    for (int i = 0; i < 4; i++) {
        float t[4];
        for (int k = 0; k < 4; k++)
            t[k] = i == 0   ? d[0][k] - d[2][k]
                   : i == 1 ? d[1][k] + d[2][k]
                   : i == 2 ? d[2][k] - d[1][k]
                            : d[1][k] - d[3][k];
        v[4 * i] = t[0] - t[2];
        v[4 * i + 1] = t[1] + t[2];
        v[4 * i + 2] = t[2] - t[1];
        v[4 * i + 3] = t[1] - t[3];
    }
}

static void test_input(void **state) {
    (void)state;
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    if (!wk) {
        printf("kernels %s: no Winograd transforms\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    /* images, channels, h, w, ty0, th (0: to the last tile row): rows shorter than a vector
     * (several rows per load), as long as one and longer, odd sizes, bands */
    static const int cases[][6] = {{3, 2, 4, 4, 0, 0},   {2, 3, 2, 2, 0, 0},   {2, 2, 8, 8, 0, 0},
                                   {2, 2, 16, 16, 0, 0}, {1, 2, 32, 32, 0, 0}, {2, 2, 6, 4, 0, 0},
                                   {2, 2, 5, 7, 0, 0},   {1, 2, 16, 16, 2, 3}, {2, 3, 8, 8, 1, 2},
                                   {2, 2, 12, 8, 0, 0},  {1, 1, 40, 40, 3, 4}, {2, 2, 4, 2, 0, 0},
                                   {5, 2, 2, 4, 0, 0},   {2, 2, 3, 4, 0, 0},   {2, 2, 7, 8, 1, 3},
                                   {1, 2, 9, 16, 0, 0},  {1, 1, 34, 30, 0, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int n_images = cases[ci][0], ch = cases[ci][1], h = cases[ci][2], w = cases[ci][3];
        const int tw = (w + 1) / 2, ty0 = cases[ci][4];
        const int th = cases[ci][5] ? cases[ci][5] : (h + 1) / 2 - ty0, tiles = th * tw;
        const int ldv = n_images * tiles + 3;
        const size_t v_xi = (size_t)ch * ldv + 5, plane = (size_t)h * w;
        float *x = malloc((size_t)n_images * ch * plane * sizeof(float));
        float *v = calloc(16 * v_xi, sizeof(float)), *want = calloc(16 * v_xi, sizeof(float));
        float *pad = malloc(cf_wino_pad_floats(h, w) * sizeof(float));
        fill_uniform(x, (size_t)n_images * ch * plane, 60 + ci, -2, 2);
        for (int n = 0; n < n_images; n++)
            for (int c = 0; c < ch; c++)
                for (int ty = ty0; ty < ty0 + th; ty++)
                    for (int tx = 0; tx < tw; tx++) {
                        float d[4][4], o[16];
                        for (int i = 0; i < 4; i++)
                            for (int j = 0; j < 4; j++) {
                                const int row = 2 * ty - 1 + i, col = 2 * tx - 1 + j;
                                d[i][j] =
                                    row >= 0 && row < h && col >= 0 && col < w
                                        ? x[((size_t)n * ch + c) * plane + (size_t)row * w + col]
                                        : 0.0f;
                            }
                        input_tile(d, o);
                        const size_t t = (size_t)n * tiles + (size_t)(ty - ty0) * tw + tx;
                        for (int xi = 0; xi < 16; xi++)
                            want[xi * v_xi + (size_t)c * ldv + t] = o[xi];
                    }
        wk->input(x, ch, h, w, n_images, ch * plane, ty0, th, v, v_xi, ldv, pad);
        char what[96];
        snprintf(what, sizeof what, "input %dx%d, %d images, tile rows %d..%d", h, w, n_images, ty0,
                 ty0 + th - 1);
        expect_bitwise(what, v, want, 16 * v_xi, sizeof(float));
        free(x), free(v), free(want), free(pad);
    }
}

static void test_input_bf16(void **state) {
    (void)state;
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    if (!wk || !wk->input_bf16) {
        printf("kernels %s: no input_bf16\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    static const int cases[][4] = {{2, 3, 8, 8}, {3, 4, 4, 4}, {1, 2, 32, 32},
                                   {2, 3, 7, 5}, {1, 2, 2, 2}, {2, 5, 16, 16}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int n_images = cases[ci][0], ch = cases[ci][1], h = cases[ci][2], w = cases[ci][3];
        const int th = (h + 1) / 2, tw = (w + 1) / 2, tiles = n_images * th * tw;
        const int ldv = (tiles + 15) / 16 * 16 + 2; /* even: the rows of pairs */
        const size_t v_xi = (size_t)ch * ldv, plane = (size_t)h * w;
        float *x = malloc((size_t)n_images * ch * plane * sizeof(float));
        float *v = calloc(16 * v_xi, sizeof(float));
        uint16_t *want = calloc(16 * v_xi, sizeof(uint16_t));
        uint16_t *got = calloc(16 * v_xi, sizeof(uint16_t));
        float *pad = malloc(cf_wino_pad_floats(h, w) * sizeof(float));
        fill_uniform(x, (size_t)n_images * ch * plane, 40 + ci, -2, 2);
        wk->input(x, ch, h, w, n_images, ch * plane, 0, th, v, v_xi, ldv, pad);
        cf_fp32_to_bf16(v, want, 16 * v_xi);
        wk->input_bf16(x, ch, h, w, n_images, ch * plane, 0, th, got, v_xi, ldv, pad);
        char what[64];
        snprintf(what, sizeof what, "input_bf16 %dx%d, %d images", h, w, n_images);
        expect_bitwise(what, got, want, 16 * v_xi, sizeof(uint16_t));
        free(x), free(v), free(want), free(got), free(pad);
    }
}

/* x (n floats) drawn from: 0 (more than half: patches of zeros keep a special value whole in the
 * transformed values), uniform values, and the values bf16 rounding treats apart: subnormals of
 * both signs (which the AVX512_BF16 level's conversion instructions would flush to zero), ties (to
 * even, both ways), the largest float (rounds to infinity), -0, and either infinities of both
 * signs (nan 0) or one NaN, `nan`: the transforms' sums pick one of two NaN operands as the
 * compiler orders them, so a case never holds two different NaNs (infinities make the default
 * one). */
static void fill_specials(float *x, size_t n, unsigned seed, uint32_t nan) {
    uint32_t specials[] = {0x00000001u, 0x007fffffu, 0x80400000u, 0x00008000u, 0x0000c000u,
                           0x80018000u, 0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x80000000u,
                           0x00800000u, 0x0080ffffu, 0x7f800000u, 0xff800000u};
    enum { N_SPECIALS = sizeof specials / sizeof specials[0] };
    if (nan) specials[N_SPECIALS - 2] = specials[N_SPECIALS - 1] = nan;
    fill_uniform(x, n, seed, -2, 2);
    uint32_t r = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        const uint32_t pick = r >> 24;
        if (pick < 150)
            x[i] = 0.0f;
        else if (pick < 215)
            memcpy(&x[i], &specials[(r >> 8) % N_SPECIALS], 4);
    }
}

/* x (n floats) for the AVX512_BF16 level's stores without a subnormal test (where no input of
 * a window or vector is 0 < |x| < 2^-100): uniform values, zeros, the values of fill_specials
 * that are neither subnormal nor under 2^-100 (ties, the largest float, -0, infinities or the
 * NaN `nan`), values at the limit (2^-100 itself and just above, whose differences are normal:
 * 2^-123), and in the first `tiny_upto` values only, every third value a normal under 2^-100
 * (2^-126 and a few last places above it, of both signs, and just under 2^-100): their
 * differences are subnormal, which the conversion instruction would flush to zero. Windows
 * without those take the plain stores, windows with them the tested ones. */
static void fill_rare_tiny(float *x, size_t n, unsigned seed, uint32_t nan, size_t tiny_upto) {
    uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x80000000u, 0x0d800000u,
                           0x0d800001u, 0x8d800003u, 0x7f800000u, 0xff800000u};
    static const uint32_t tiny[] = {0x00800000u, 0x00800003u, 0x80800001u, 0x0080ffffu,
                                    0x0d7fffffu};
    enum { N_SPECIALS = sizeof specials / sizeof specials[0], N_TINY = sizeof tiny / 4 };
    if (nan) specials[N_SPECIALS - 2] = specials[N_SPECIALS - 1] = nan;
    fill_uniform(x, n, seed, -2, 2);
    uint32_t r = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        const uint32_t pick = r >> 24;
        if (i < tiny_upto && i % 3 == 0)
            memcpy(&x[i], &tiny[(r >> 8) % N_TINY], 4);
        else if (pick < 100)
            x[i] = 0.0f;
        else if (pick < 140)
            memcpy(&x[i], &specials[(r >> 8) % N_SPECIALS], 4);
    }
}

/* Keeps fill_rare_tiny's values under 2^-100 in image 0 (ch planes of `plane` values at x) only
 * in channels [c_lo, c_hi) and from value p_lo of each plane on; the others become 1. Tiny
 * values alone in a pair's second channel, a later block of 16 channels or a later window: a
 * check that looked only at the first channel, block or window would miss them. */
static void tiny_only_in(float *x, int ch, size_t plane, int c_lo, int c_hi, size_t p_lo) {
    for (int c = 0; c < ch; c++)
        for (size_t p = 0; p < plane; p++) {
            float *v = &x[(size_t)c * plane + p];
            const float a = fabsf(*v);
            if (a > 0 && a < 0x1p-100f && (c < c_lo || c >= c_hi || p < p_lo)) *v = 1.0f;
        }
}

/* bf16(lo) | bf16(hi) << 16 as cf_fp32_to_bf16 rounds (hi NULL: 0) */
static uint32_t pair_word(const float *lo, const float *hi) {
    uint16_t a, b = 0;
    cf_fp32_to_bf16(lo, &a, 1);
    if (hi) cf_fp32_to_bf16(hi, &b, 1);
    return (uint32_t)a | (uint32_t)b << 16;
}

/* One input transform's bf16 stores against the fp32 transform v (16 points, v_xi apart, ldv
 * words a channel) rounded by cf_fp32_to_bf16: input_pairs (channel pairs) and input_bf16, over
 * images n_images of x, tile rows ty0..ty0+th, bitwise and nothing written outside the call's
 * tiles and channels. `what` names the case in a failure. */
typedef struct {
    const float *x, *v;
    int ch, h, w, n_images, ty0, th, tiles, ldv;
    float *pad;
    const char *what;
} stores_case;

static void check_input_pairs(const cf_wino_kernels *wk, const stores_case *c) {
    const int pairs = (c->ch + 1) / 2;
    const size_t v_xi = (size_t)c->ch * c->ldv + 6, p_xi = (size_t)pairs * c->ldv + 6;
    const size_t plane = (size_t)c->h * c->w;
    uint32_t *got = malloc(16 * p_xi * sizeof(uint32_t));
    uint32_t *want = malloc(16 * p_xi * sizeof(uint32_t));
    memset(got, 0x5a, 16 * p_xi * sizeof(uint32_t));
    memset(want, 0x5a, 16 * p_xi * sizeof(uint32_t));
    for (int xi = 0; xi < 16; xi++)
        for (int p = 0; p < pairs; p++)
            for (int t = 0; t < c->tiles; t++) {
                const float *lo = c->v + xi * v_xi + (size_t)(2 * p) * c->ldv + t;
                want[xi * p_xi + (size_t)p * c->ldv + t] =
                    pair_word(lo, 2 * p + 1 < c->ch ? lo + c->ldv : NULL);
            }
    wk->input_pairs(c->x, c->ch, c->h, c->w, c->n_images, c->ch * plane, c->ty0, c->th, got, p_xi,
                    c->ldv, c->pad);
    char what[128];
    snprintf(what, sizeof what, "input_pairs %s", c->what);
    expect_bitwise(what, got, want, 16 * p_xi, sizeof(uint32_t));
    free(got), free(want);
}

static void check_input_bf16(const cf_wino_kernels *wk, const stores_case *c) {
    const size_t v_xi = (size_t)c->ch * c->ldv + 6, plane = (size_t)c->h * c->w;
    uint16_t *got = malloc(16 * v_xi * sizeof(uint16_t));
    uint16_t *want = malloc(16 * v_xi * sizeof(uint16_t));
    memset(got, 0x5a, 16 * v_xi * sizeof(uint16_t));
    memset(want, 0x5a, 16 * v_xi * sizeof(uint16_t));
    for (int xi = 0; xi < 16; xi++)
        for (int ch = 0; ch < c->ch; ch++)
            cf_fp32_to_bf16(c->v + xi * v_xi + (size_t)ch * c->ldv,
                            want + xi * v_xi + (size_t)ch * c->ldv, (size_t)c->tiles);
    wk->input_bf16(c->x, c->ch, c->h, c->w, c->n_images, c->ch * plane, c->ty0, c->th, got, v_xi,
                   c->ldv, c->pad);
    char what[128];
    snprintf(what, sizeof what, "input_bf16 %s", c->what);
    expect_bitwise(what, got, want, 16 * v_xi, sizeof(uint16_t));
    free(got), free(want);
}

/* input_pairs, dy_pairs and input_bf16 (the level's bf16 stores) against the fp32 transforms
 * (input, dy_nhwc) rounded by cf_fp32_to_bf16, on values that round apart (fill_specials):
 * bitwise, and nothing written outside the call's tiles and channels. */
static void test_bf16_stores(void **state) {
    (void)state;
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    if (!wk || (!wk->input_pairs && !wk->dy_pairs && !wk->input_bf16)) {
        printf("kernels %s: no bf16 transforms\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    /* images, channels, h, w */
    static const int cases[][4] = {{2, 3, 8, 8}, {1, 5, 32, 32}, {2, 4, 7, 9}, {3, 17, 4, 4}};
    /* infinities, a quiet NaN with a payload, a signalling one (negative), another signalling */
    static const uint32_t nans[] = {0, 0x7fc00001u, 0xffa00000u, 0x7f800001u};
    for (size_t vi = 0; vi < 4 * sizeof cases / sizeof cases[0]; vi++) {
        const size_t ci = vi / 4;
        const uint32_t nan = nans[vi % 4];
        const int n_images = cases[ci][0], ch = cases[ci][1], h = cases[ci][2], w = cases[ci][3];
        const int th = (h + 1) / 2, tw = (w + 1) / 2, tiles = n_images * th * tw;
        const int ldv = (tiles + 15) / 16 * 16 + 2;
        const size_t v_xi = (size_t)ch * ldv + 6;
        const size_t plane = (size_t)h * w, nx = (size_t)n_images * ch * plane;
        float *x = malloc(nx * sizeof(float)), *v = calloc(16 * v_xi, sizeof(float));
        float *pad = malloc(cf_wino_pad_floats(h, w) * sizeof(float));
        fill_specials(x, nx, 300 + (unsigned)vi, nan);
        wk->input(x, ch, h, w, n_images, ch * plane, 0, th, v, v_xi, ldv, pad);
        char what[80];
        snprintf(what, sizeof what, "%dx%d, %d channels, NaN %#x", h, w, ch, nan);
        const stores_case sc = {x, v, ch, h, w, n_images, 0, th, tiles, ldv, pad, what};
        if (wk->input_pairs) check_input_pairs(wk, &sc);
        if (wk->input_bf16) check_input_bf16(wk, &sc);
        if (wk->dy_pairs) { /* x as dy, pixel-major: K = ch channels */
            const int K = ch, ldm = (K + 15) / 16 * 16 + 3, tpairs = (tiles + 1) / 2;
            const size_t m_xi = (size_t)tiles * K + 5, q_xi = (size_t)tpairs * ldm + 7;
            float *mg = malloc(16 * m_xi * sizeof(float));
            uint32_t *got = malloc(16 * q_xi * sizeof(uint32_t));
            uint32_t *want = malloc(16 * q_xi * sizeof(uint32_t));
            memset(got, 0x5a, 16 * q_xi * sizeof(uint32_t));
            memset(want, 0x5a, 16 * q_xi * sizeof(uint32_t));
            wk->dy_nhwc(x, K, h, w, n_images, 0, th, mg, m_xi);
            for (int xi = 0; xi < 16; xi++)
                for (int q = 0; q < tpairs; q++)
                    for (int k = 0; k < K; k++) {
                        const float *lo = mg + xi * m_xi + (size_t)(2 * q) * K + k;
                        want[xi * q_xi + (size_t)q * ldm + k] =
                            pair_word(lo, 2 * q + 1 < tiles ? lo + K : NULL);
                    }
            wk->dy_pairs(x, K, h, w, n_images, 0, th, got, q_xi, ldm);
            snprintf(what, sizeof what, "dy_pairs %dx%d, %d channels, NaN %#x", h, w, K, nan);
            expect_bitwise(what, got, want, 16 * q_xi, sizeof(uint32_t));
            free(mg), free(got), free(want);
        }
        free(x), free(v), free(pad);
    }
}

/* dy_pairs_nchw (the AVX512_BF16 level's dy_pairs from dy as the layer holds it, transposed in
 * windows) against dy_pairs on a pixel-major copy: bitwise, on values that round apart, with
 * channel counts off the vector's 16 (the last block's lanes), images wider than a window (its
 * 128-column pieces) and odd widths whose rows still have an even number of tiles, odd heights
 * (no second row in the last tile row), bands of tile rows, several images a gap apart, and
 * nothing written past the call's tile pairs and channels. */
static void test_dy_pairs_nchw(void **state) {
    (void)state;
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    if (!wk || !wk->dy_pairs_nchw || !wk->dy_pairs) {
        printf("kernels %s: no dy_pairs_nchw\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    /* images, channels, h, w, ty0, th (0: to the last tile row) */
    static const int cases[][6] = {
        {2, 16, 32, 32, 0, 0}, {1, 64, 32, 32, 0, 8}, {2, 17, 16, 16, 0, 0}, {3, 35, 8, 8, 0, 0},
        {5, 20, 4, 4, 0, 0},   {2, 9, 7, 7, 0, 0},    {1, 33, 15, 15, 1, 3}, {2, 18, 9, 260, 1, 3},
        {1, 5, 3, 132, 0, 0},  {2, 31, 12, 24, 2, 3}, {3, 1, 4, 8, 0, 0},    {1, 48, 64, 64, 5, 6}};
    static const uint32_t nans[] = {0, 0x7fc00001u, 0xffa00000u};
    for (size_t vi = 0; vi < 4 * sizeof cases / sizeof cases[0]; vi++) {
        const size_t ci = vi / 4;
        const int n_images = cases[ci][0], K = cases[ci][1], h = cases[ci][2], w = cases[ci][3];
        const int tw = (w + 1) / 2, ty0 = cases[ci][4];
        const int th = cases[ci][5] ? cases[ci][5] : (h + 1) / 2 - ty0, tiles = n_images * th * tw;
        const size_t plane = (size_t)h * w, dy_image = (size_t)K * plane + 7;
        const int ldm = (K + 15) / 16 * 16 + 3, tpairs = tiles / 2;
        const size_t q_xi = (size_t)tpairs * ldm + 7, nx = (size_t)n_images * dy_image;
        float *dy = malloc(nx * sizeof(float)), *dyt = malloc(n_images * plane * K * sizeof(float));
        uint32_t *got = malloc(16 * q_xi * sizeof(uint32_t));
        uint32_t *want = malloc(16 * q_xi * sizeof(uint32_t));
        /* the last variant: values under 2^-100 in image 0 only (or in none) */
        if (vi % 4 == 3)
            fill_rare_tiny(dy, nx, 500 + (unsigned)vi, 0x7fc00001u, ci % 2 ? dy_image : 0);
        else
            fill_specials(dy, nx, 500 + (unsigned)vi, nans[vi % 4]);
        /* the 48 channels of 64 x 64: tiny values only in the second block of 16 channels, in
         * a later window */
        if (vi % 4 == 3 && K == 48) tiny_only_in(dy, K, plane, 16, 32, (size_t)2 * (ty0 + 3) * w);
        for (int n = 0; n < n_images; n++)
            for (int k = 0; k < K; k++)
                for (size_t p = 0; p < plane; p++)
                    dyt[((size_t)n * plane + p) * K + k] = dy[n * dy_image + k * plane + p];
        memset(got, 0x5a, 16 * q_xi * sizeof(uint32_t));
        memset(want, 0x5a, 16 * q_xi * sizeof(uint32_t));
        wk->dy_pairs(dyt, K, h, w, n_images, ty0, th, want, q_xi, ldm);
        wk->dy_pairs_nchw(dy, dy_image, K, h, w, n_images, ty0, th, got, q_xi, ldm);
        char what[96];
        snprintf(what, sizeof what, "dy_pairs_nchw %dx%d, %d channels, %d images, tile rows %d..%d",
                 h, w, K, n_images, ty0, ty0 + th - 1);
        expect_bitwise(what, got, want, 16 * q_xi, sizeof(uint32_t));
        free(dy), free(dyt), free(got), free(want);
    }
}

/* input_pairs and input_bf16 on planes of 32k columns and of 16, 8 and 4 columns, which the
 * AVX512_BF16 level (and AMX, which shares its transforms) computes from the image's rows without
 * the split (the short planes with vectors over several tile rows, across images), and on other
 * widths, which keep the split, beside them: against `input` rounded after, bitwise, on values
 * that round apart, with bands of tile rows (odd ones, so that images change inside a vector),
 * odd heights, rows of one to three vectors of tiles, odd channel counts, several images, tails
 * of a vector, and nothing written past the call's tiles. There the calls get no pad (NULL): the
 * split's path would write to it, so the case fails if the direct path is not taken. */
static void test_bf16_direct(void **state) {
    (void)state;
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    if (!wk || (!wk->input_pairs && !wk->input_bf16)) {
        printf("kernels %s: no bf16 transforms\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    const bool direct = cf_isa_active() == CF_ISA_AVX512_BF16 || cf_isa_active() == CF_ISA_AMX;
    /* images, channels, h, w, ty0, th (0: to the last tile row) */
    static const int cases[][6] = {{2, 3, 32, 32, 0, 0},
                                   {1, 4, 33, 32, 0, 0},
                                   {1, 3, 32, 64, 0, 0},
                                   {1, 3, 32, 32, 3, 5},
                                   {3, 1, 31, 96, 2, 0},
                                   {2, 2, 2, 32, 0, 0},
                                   {1, 5, 7, 64, 1, 2},
                                   {1, 2, 1, 32, 0, 0},
                                   /* rows of 8, 4 and 2 tiles */
                                   {2, 3, 16, 16, 0, 0},
                                   {1, 3, 15, 16, 0, 0},
                                   {2, 2, 16, 16, 2, 3},
                                   {3, 5, 8, 8, 0, 0},
                                   {2, 2, 7, 8, 1, 2},
                                   {1, 3, 8, 8, 1, 0},
                                   {5, 3, 4, 4, 0, 0},
                                   {3, 2, 3, 4, 0, 0},
                                   {2, 1, 12, 4, 1, 3},
                                   {1, 2, 10, 8, 0, 0},
                                   {3, 2, 16, 16, 2, 3},
                                   {5, 3, 8, 8, 1, 3},
                                   {7, 3, 9, 4, 2, 1},
                                   {9, 5, 4, 4, 0, 0},
                                   {4, 1, 5, 16, 0, 0},
                                   {3, 4, 11, 8, 0, 0},
                                   /* rows of 5 and 6 tiles, 1 tile (the split's path) */
                                   {2, 3, 10, 10, 0, 0},
                                   {2, 2, 6, 12, 1, 2},
                                   {3, 3, 4, 2, 0, 0}};
    static const uint32_t nans[] = {0, 0x7fc00001u};
    for (size_t vi = 0; vi < 3 * sizeof cases / sizeof cases[0]; vi++) {
        const size_t ci = vi / 3;
        const int n_images = cases[ci][0], ch = cases[ci][1], h = cases[ci][2], w = cases[ci][3];
        const int tw = (w + 1) / 2, ty0 = cases[ci][4];
        const int th = cases[ci][5] ? cases[ci][5] : (h + 1) / 2 - ty0;
        const int tiles = n_images * th * tw;
        const int ldv = (tiles + 15) / 16 * 16 + 2;
        const size_t v_xi = (size_t)ch * ldv + 6;
        const size_t plane = (size_t)h * w, nx = (size_t)n_images * ch * plane;
        float *x = malloc(nx * sizeof(float)), *v = calloc(16 * v_xi, sizeof(float));
        float *pad = malloc(cf_wino_pad_floats(h, w) * sizeof(float));
        /* the third variant: normals under 2^-100 (whose differences are subnormal) in image 0
         * only, or none (the AVX512_BF16 level's short planes store the vectors of tiles whose
         * patch rows hold none without the subnormal test) */
        if (vi % 3 == 2)
            fill_rare_tiny(x, nx, 500 + (unsigned)vi, 0x7fc00001u, ci % 2 ? (size_t)ch * plane : 0);
        else
            fill_specials(x, nx, 500 + (unsigned)vi, nans[vi % 3]);
        /* every other such case: tiny values only in channel 1, a pair's second */
        if (vi % 3 == 2 && ci % 4 == 1 && ch >= 2) tiny_only_in(x, ch, plane, 1, 2, 0);
        if (vi % 6 == 0) fill_uniform(x, nx, 500 + (unsigned)vi, -2, 2);
        wk->input(x, ch, h, w, n_images, ch * plane, ty0, th, v, v_xi, ldv, pad);
        /* the planes the level takes directly: rows of 16k tiles, and of 8, 4 and 2 */
        const bool taken = direct && (tw % 16 == 0 || w == 16 || w == 8 || w == 4);
        float *call_pad = taken ? NULL : pad;
        char what[96];
        snprintf(what, sizeof what, "%dx%d, %d images, %d channels, rows %d+%d", h, w, n_images, ch,
                 ty0, th);
        const stores_case sc = {x, v, ch, h, w, n_images, ty0, th, tiles, ldv, call_pad, what};
        if (wk->input_pairs) check_input_pairs(wk, &sc);
        if (wk->input_bf16) check_input_bf16(wk, &sc);
        free(x), free(v), free(pad);
    }
}

/* input_pairs and input_bf16 on planes of 64 and 96 columns whose only values under 2^-100
 * are in one column (31, 32, 63 or 64: the last or first column of a vector of 16 tiles), on
 * every row of every channel or of channel 1 only (a pair's second), alternately 2^-126 and 1.5
 * 2^-126, so that row sums there are 2^-127 (subnormal, and not 0 in bf16): the vector of tiles
 * beside the column reads it through its lane before or after, which its own check must cover (the
 * AVX512_BF16 level's stores without the subnormal test), against `input` rounded after, bitwise.
 */
static void test_bf16_tiny_column(void **state) {
    (void)state;
    const cf_wino_kernels *wk = cf_active_kernels->wino;
    if (!wk || (!wk->input_pairs && !wk->input_bf16)) {
        printf("kernels %s: no bf16 transforms\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    static const int cases[][2] = {{64, 31}, {64, 32}, {96, 63}, {96, 64}, {96, 32}};
    for (size_t vi = 0; vi < 2 * sizeof cases / sizeof cases[0]; vi++) {
        const size_t ci = vi / 2;
        const bool second_only = vi % 2; /* the column in channel 1 only, a pair's second */
        const int n_images = 2, ch = 3, h = 6, w = cases[ci][0], col = cases[ci][1];
        const int th = h / 2, tiles = n_images * th * (w / 2), ldv = (tiles + 15) / 16 * 16 + 2;
        const size_t v_xi = (size_t)ch * ldv + 6, plane = (size_t)h * w;
        const size_t nx = (size_t)n_images * ch * plane;
        float *x = malloc(nx * sizeof(float)), *v = calloc(16 * v_xi, sizeof(float));
        float *pad = malloc(cf_wino_pad_floats(h, w) * sizeof(float));
        fill_rare_tiny(x, nx, 900 + (unsigned)ci, 0, 0);
        for (size_t r = 0; r < nx / w; r++) {
            if (second_only && (r / h) % ch != 1) continue;
            const uint32_t bits = r % 2 ? 0x00c00000u : 0x00800000u;
            memcpy(&x[r * w + col], &bits, 4);
        }
        wk->input(x, ch, h, w, n_images, ch * plane, 0, th, v, v_xi, ldv, pad);
        char what[64];
        snprintf(what, sizeof what, "%dx%d, tiny column %d%s", h, w, col,
                 second_only ? " in channel 1" : "");
        const stores_case sc = {x, v, ch, h, w, n_images, 0, th, tiles, ldv, pad, what};
        if (wk->input_pairs) check_input_pairs(wk, &sc);
        if (wk->input_bf16) check_input_bf16(wk, &sc);
        free(x), free(v), free(pad);
    }
}

static void test_gemm_rows(void **state) {
    (void)state;
    const cf_bf16_kernels *bk = cf_active_kernels->bf16;
    if (!bk || !bk->gemm_rows || !bk->gemm_paired || !bk->gemm_pack_a || !bk->gemm_a_words) {
        printf("kernels %s: no gemm_rows\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    /* m, n, k: rows off the 8-row blocks, columns off the 48-column panels, odd k, k over the
     * 256-value blocks */
    static const int cases[][3] = {{64, 64, 256}, {19, 50, 37},  {8, 16, 2},
                                   {33, 97, 601}, {5, 130, 513}, {128, 48, 300}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int m = cases[ci][0], n = cases[ci][1], k = cases[ci][2], pairs = (k + 1) / 2;
        const size_t lda = (size_t)pairs + 3, ldb = (size_t)(n + 15) / 16 * 16 + 16;
        float *a = malloc((size_t)m * 2 * pairs * sizeof(float));
        float *bv = malloc((size_t)2 * pairs * n * sizeof(float));
        fill_uniform(a, (size_t)m * 2 * pairs, 70 + ci, -1, 1);
        fill_uniform(bv, (size_t)2 * pairs * n, 80 + ci, -1, 1);
        /* A as rows of pairs (k past its end 0), B paired over k */
        uint16_t *ah = calloc((size_t)m * 2 * lda, sizeof(uint16_t));
        for (int r = 0; r < m; r++) cf_fp32_to_bf16(a + (size_t)r * 2 * pairs, ah + r * 2 * lda, k);
        uint32_t *b = calloc((size_t)pairs * ldb, sizeof(uint32_t));
        uint16_t lo, hi;
        for (int q = 0; q < pairs; q++)
            for (int j = 0; j < n; j++) {
                cf_fp32_to_bf16(&bv[(size_t)2 * q * n + j], &lo, 1);
                hi = 0;
                if (2 * q + 1 < k) cf_fp32_to_bf16(&bv[(size_t)(2 * q + 1) * n + j], &hi, 1);
                b[(size_t)q * ldb + j] = (uint32_t)lo | (uint32_t)hi << 16;
            }
        uint32_t *ap = malloc(bk->gemm_a_words(m, k) * sizeof(uint32_t));
        bk->gemm_pack_a(false, m, k, a, 2 * pairs, ap);
        float *want = malloc((size_t)m * n * sizeof(float));
        float *got = malloc((size_t)m * n * sizeof(float));
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            fill_uniform(want, (size_t)m * n, 90 + ci, -1, 1);
            memcpy(got, want, (size_t)m * n * sizeof(float));
            bk->gemm_paired(m, n, k, ap, b, ldb, want, n, accumulate);
            bk->gemm_rows(m, n, k, (const uint32_t *)ah, lda, b, ldb, got, n, accumulate);
            char what[64];
            snprintf(what, sizeof what, "gemm_rows %dx%dx%d%s", m, n, k,
                     accumulate ? " accumulate" : "");
            expect_bitwise(what, got, want, (size_t)m * n, sizeof(float));
        }
        free(a), free(bv), free(ah), free(b), free(ap), free(want), free(got);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_output),        cmocka_unit_test(test_input),
        cmocka_unit_test(test_input_bf16),    cmocka_unit_test(test_bf16_stores),
        cmocka_unit_test(test_gemm_rows),     cmocka_unit_test(test_bf16_direct),
        cmocka_unit_test(test_dy_pairs_nchw), cmocka_unit_test(test_bf16_tiny_column),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
