/* fastai's interpretation views: most_confused against fastai's definition (off-diagonal cells
 * >= min_val, largest first, ties in row-major order); show_batch and show_results as PNGs:
 * the images appear in a grid in batch order with their colours, show_results' titles are green for
 * right and red for wrong predictions, and bad arguments are refused. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/data.h"
#include "corefit/plot.h"

static void test_most_confused(void **state) {
    (void)state;
    /* actual x predicted */
    const int64_t counts[16] = {9, 3, 0, 5, /* */
                                3, 7, 1, 0, /* */
                                0, 5, 8, 2, /* */
                                1, 0, 0, 4};
    cf_confused_pair out[8];
    int64_t n = cf_most_confused(counts, 4, 1, out, 8);
    assert_int_equal(n, 7);
    const int expect[7][3] = {{0, 3, 5}, {2, 1, 5}, {0, 1, 3}, {1, 0, 3},
                              {2, 3, 2}, {1, 2, 1}, {3, 0, 1}};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(out[i].actual, expect[i][0]);
        assert_int_equal(out[i].predicted, expect[i][1]);
        assert_int_equal(out[i].count, expect[i][2]);
    }
    /* min_val, and a short output keeps the largest */
    assert_int_equal(cf_most_confused(counts, 4, 3, out, 2), 4);
    assert_int_equal(out[0].count, 5);
    assert_int_equal(out[0].actual, 0);
    assert_int_equal(out[1].actual, 2);
    assert_int_equal(cf_most_confused(counts, 4, 6, NULL, 0), 0);
    assert_int_equal(cf_most_confused(NULL, 4, 1, out, 8), -1);
    assert_non_null(strstr(cf_last_error(), "most_confused"));
}

#if defined(CF_HAVE_PLPLOT)

static char dir[256];

static const char *path_in(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

/* Pixels whose colour is clearly green (titles of right predictions) or red (wrong ones). */
static void count_title_colours(const char *path, int64_t *green, int64_t *red) {
    int w, h;
    unsigned char *px = test_png_load_rgb(path, &w, &h);
    *green = *red = 0;
    for (int64_t i = 0; i < (int64_t)w * h; i++) {
        const unsigned char *p = px + 3 * i;
        if (p[1] > 90 && p[0] < 60 && p[2] < 60) ++*green;
        if (p[0] > 150 && p[1] < 60 && p[2] < 60) ++*red;
    }
    free(px);
}

static bool is_png_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char sig[8] = {0};
    size_t n = fread(sig, 1, 8, f);
    fclose(f);
    return n == 8 && memcmp(sig, "\x89PNG\r\n\x1a\n", 8) == 0;
}

/* Pixels of one pure colour (each channel either <= 30 or >= 225) in each quadrant of the
 * figure: counts[quadrant][colour], colour = r + 2 g + 4 b of the channels that are on. */
static void count_pure_colours(const char *path, int64_t counts[4][8]) {
    int w, h;
    unsigned char *px = test_png_load_rgb(path, &w, &h);
    memset(counts, 0, 4 * sizeof counts[0]);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            const unsigned char *p = px + 3 * ((int64_t)y * w + x);
            int colour = 0;
            bool pure = true;
            for (int c = 0; c < 3; c++) {
                if (p[c] >= 225)
                    colour |= 1 << c;
                else if (p[c] > 30)
                    pure = false;
            }
            if (pure) counts[(y >= h / 2) * 2 + (x >= w / 2)][colour]++;
        }
    free(px);
}

/* Four images of one colour each in values a normalised batch has (-2 and 2, rescaled per image
 * to 0..1): red, green, blue, and the channels mixed (yellow). They must appear in a 2 x 2 grid
 * in batch order, filling a good part of their quadrant, and in no other. */
static void test_show_batch(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    enum { B = 6, C = 3, H = 24, W = 20 };
    float *x = malloc(B * C * H * W * sizeof(float)), y[B];
    fill_uniform(x, B * C * H * W, 3, -2.0f, 2.0f); /* images 4 and 5 stay noise */
    static const int on[4] = {1, 2, 4, 3}; /* channel bits: red, green, blue, red + green */
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < C; c++)
            for (int j = 0; j < H * W; j++) x[((i * C) + c) * H * W + j] = on[i] >> c & 1 ? 2 : -2;
    for (int i = 0; i < B; i++) y[i] = (float)(i % 3);
    cf_batch b = {.x = cf_tensor_view(x, cf_shape4(B, C, H, W)),
                  .y = cf_tensor_view(y, cf_shape1(B)),
                  .size = B,
                  .n_real = B};
    char *vocab[3] = {"cat", "dog", "#na#"};
    assert_int_equal(cf_show_batch(&b, 4, vocab, path_in("batch.png")), CF_OK);
    assert_true(is_png_file(path_in("batch.png")));
    int w, h;
    free(test_png_load_rgb(path_in("batch.png"), &w, &h));
    int64_t counts[4][8];
    count_pure_colours(path_in("batch.png"), counts);
    int64_t quadrant = (int64_t)(w / 2) * (h / 2);
    for (int q = 0; q < 4; q++)
        for (int colour = 1; colour < 7; colour++) {
            int64_t n = counts[q][colour];
            if (colour == on[q] && n < quadrant / 10)
                fail_msg("image %d: only %lld of %lld pixels in its quadrant have its colour %d", q,
                         (long long)n, (long long)quadrant, colour);
            if (colour != on[q] && n > 0)
                fail_msg("quadrant %d has %lld pixels of colour %d, which is image %d's", q,
                         (long long)n, colour, colour);
        }
    assert_int_equal(cf_show_batch(&b, 7, vocab, path_in("x.png")), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "n = 7"));
    cf_batch flat = b;
    flat.x.shape = cf_shape2(B, C * H * W);
    assert_int_equal(cf_show_batch(&flat, 2, vocab, path_in("x.png")), CF_ERR_INVALID);
    free(x);
}

static void results_png(bool right, const char *name, int64_t *green, int64_t *red) {
    enum { N = 4, H = 16, W = 16, K = 3 };
    float *x = malloc(N * H * W * sizeof(float)), preds[N * K], targs[N];
    fill_uniform(x, N * H * W, 4, 0.0f, 1.0f); /* grey images: no coloured pixels */
    for (int i = 0; i < N; i++) {
        int pred = i % K;
        for (int k = 0; k < K; k++) preds[i * K + k] = k == pred ? 0.8f : 0.1f;
        targs[i] = (float)(right ? pred : (pred + 1) % K);
    }
    cf_preds p = {.n = N,
                  .preds = cf_tensor_view(preds, cf_shape2(N, K)),
                  .targs = cf_tensor_view(targs, cf_shape1(N)),
                  .inputs = cf_tensor_view(x, cf_shape4(N, 1, H, W))};
    assert_int_equal(cf_show_results(&p, N, NULL, path_in(name)), CF_OK);
    count_title_colours(path_in(name), green, red);
    p.inputs.data = NULL;
    assert_int_equal(cf_show_results(&p, N, NULL, path_in("x.png")), CF_ERR_INVALID);
    free(x);
}

static void test_show_results_colours(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    int64_t g_right, r_right, g_wrong, r_wrong;
    results_png(true, "right.png", &g_right, &r_right);
    results_png(false, "wrong.png", &g_wrong, &r_wrong);
    assert_true(g_right > 20 && r_right == 0);
    assert_true(r_wrong > 20 && g_wrong == 0);
}

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(dir, sizeof dir, "cf-show-");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(dir);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_most_confused),
#if defined(CF_HAVE_PLPLOT)
        cmocka_unit_test(test_show_batch),
        cmocka_unit_test(test_show_results_colours),
#endif
    };
#if defined(CF_HAVE_PLPLOT)
    return cmocka_run_group_tests(tests, setup, teardown);
#else
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
