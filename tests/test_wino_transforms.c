/* The Winograd F(2x2, 3x3) kernels of the active table (cf_wino_kernels, winograd_loops.h, and
 * the bf16 GEMM's gemm_rows) against scalar references that do the same operations in the same
 * order, bitwise:
 *
 *   input       V = B^T d B of every tile (the plane split first), rows shorter than a vector
 *               (several rows a load), as long and longer, odd planes, bands of tile rows
 *   output      Y = A^T M A of every tile, on planes whose rows of tiles fill a vector and on
 *               those shorter than one (2x2 to 16x16 planes, the band of tile rows vectorised
 *               whole), odd planes, bands of tile rows, several images, a band whose tiles end
 *               inside a vector
 *   input_bf16  V = B^T d B rounded to bf16 (cf_fp32_to_bf16) against `input` rounded after
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
            fail_msg("%s: element %zu differs", what, i);
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
    /* images, channels, h, w, ty0, th (0: to the last tile row) */
    static const int cases[][6] = {{3, 5, 4, 4, 0, 0},   {2, 3, 2, 2, 0, 0},   {2, 4, 8, 8, 0, 0},
                                   {2, 3, 16, 16, 0, 0}, {1, 2, 32, 32, 0, 0}, {3, 2, 8, 8, 1, 3},
                                   {2, 3, 4, 8, 0, 0},   {2, 2, 6, 4, 0, 0},   {2, 3, 12, 8, 0, 0},
                                   {2, 2, 5, 7, 0, 0},   {1, 2, 7, 4, 0, 0},   {2, 2, 16, 16, 2, 5},
                                   {1, 2, 40, 40, 3, 4}, {2, 3, 4, 2, 0, 0},   {5, 2, 2, 4, 0, 0}};
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
        cmocka_unit_test(test_output),
        cmocka_unit_test(test_input),
        cmocka_unit_test(test_input_bf16),
        cmocka_unit_test(test_gemm_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
