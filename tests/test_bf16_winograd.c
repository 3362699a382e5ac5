/* Winograd F(2x2, 3x3) with bf16 products (cf_conv_winograd_*_bf16, src/tensor/winograd.c): the
 * transforms in fp32, the transformed input, weights and output gradient rounded to bf16, fp32
 * sums. Forward, dx and dW against conv2d in float64 (PyTorch oracle) within a bound derived from
 * bf16's unit roundoff, on W1- and W3-like shapes, odd sizes, one image, channel counts that are
 * not multiples of 16, images in row bands; the layer's dispatch in bf16 (bitwise the direct
 * calls), forward and dx independent of the threads and of the batch split (bitwise), dW
 * deterministic; below avx512_bf16 (CF_ISA=avx512, avx2), bitwise the fp32 Winograd; the backward
 * block by block (cf_conv_winograd_backward, _bf16) bitwise the two calls.
 *
 * The bound: an output sums products of transformed values, each rounded to bf16 (relative error
 * at most u = 2^-8 per operand), so a product is off by at most (2u + u^2) times its magnitude, and
 * the error of an output is at most (2u + u^2) times the same transforms run on the absolute
 * values (|A^T| ((|G| |g| |G^T|) . (|B^T| |d| |B|)) |A|, summed over the channels), plus fp32's
 * rounding of the transforms and sums (terms x 2^-24 of the same). That sum of absolute values is
 * computed here in float64 through the 1-D kernels kt[a][r][p] = sum over i of |A^T[a][i]|
 * |G[i][r]| |B^T[i][p]| (output a of a tile, tap r, patch position p); dW's is the same form in x
 * and dy. A wrong transform (a wrong coefficient, point or tile) is off by the size of the output
 * itself, far outside it. */
#include "corefit/nn.h"
#include "oracle.h"
#include "tensor/kernel_table.h"

#include <stdio.h>
#include <string.h>

typedef struct wcase {
    int n, c, h, w, k;
} wcase;

static const wcase cases[] = {
    {2, 16, 28, 28, 24}, /* W1-like: 28x28, rows of 14 tiles (Winograd at every level) */
    {1, 19, 27, 29, 21}, /* odd sizes, one image, odd channel counts */
    {3, 40, 7, 7, 48},   /* short rows, several images per block */
    {4, 96, 4, 4, 80},   /* many channels on a tiny image (a block of few tiles) */
    {2, 33, 9, 5, 17},   /* odd channels and sizes, narrow image */
    {1, 16, 70, 66, 16}, /* one image in bands of tile rows */
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

static const double AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
static const double BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};

static double kt[2][3][4];

static void make_kt(void) {
    for (int a = 0; a < 2; a++)
        for (int r = 0; r < 3; r++)
            for (int p = 0; p < 4; p++) {
                double s = 0;
                for (int i = 0; i < 4; i++) s += fabs(AT[a][i]) * fabs(G[i][r]) * fabs(BT[i][p]);
                kt[a][r][p] = s;
            }
}

/* x[n][c][y][x] (0 outside the image) */
static double at(const float *x, int c_n, int h, int w, int n, int c, int y, int xx) {
    if (y < 0 || y >= h || xx < 0 || xx >= w) return 0;
    return x[(((size_t)n * c_n + c) * h + y) * w + xx];
}

/* S[n][k][oy][ox]: the forward's sum of absolute values for out channels K from in channels C,
 * weights wt[k][c][3][3] (see the header). */
static void bound_forward(const float *x, const float *wt, int N, int C, int K, int h, int w,
                          double *S) {
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int oy = 0; oy < h; oy++)
                for (int ox = 0; ox < w; ox++) {
                    const int ty = oy / 2, a = oy % 2, tx = ox / 2, b = ox % 2;
                    double s = 0;
                    for (int c = 0; c < C; c++) {
                        const float *g = wt + ((size_t)k * C + c) * 9;
                        for (int p = 0; p < 4; p++)
                            for (int q = 0; q < 4; q++) {
                                const double d =
                                    fabs(at(x, C, h, w, n, c, 2 * ty - 1 + p, 2 * tx - 1 + q));
                                if (d == 0) continue;
                                double t = 0;
                                for (int r = 0; r < 3; r++)
                                    for (int u = 0; u < 3; u++)
                                        t += fabs(g[3 * r + u]) * kt[a][r][p] * kt[b][u][q];
                                s += d * t;
                            }
                    }
                    S[(((size_t)n * K + k) * h + oy) * w + ox] = s;
                }
}

/* S[k][c][r][u]: dW's, from x (C channels) and dy (K channels). */
static void bound_wgrad(const float *x, const float *dy, int N, int C, int K, int h, int w,
                        double *S) {
    const int th = (h + 1) / 2, tw = (w + 1) / 2;
    for (int k = 0; k < K; k++)
        for (int c = 0; c < C; c++)
            for (int r = 0; r < 3; r++)
                for (int u = 0; u < 3; u++) {
                    double s = 0;
                    for (int n = 0; n < N; n++)
                        for (int ty = 0; ty < th; ty++)
                            for (int tx = 0; tx < tw; tx++)
                                for (int a = 0; a < 2; a++)
                                    for (int b = 0; b < 2; b++) {
                                        const double e =
                                            fabs(at(dy, K, h, w, n, k, 2 * ty + a, 2 * tx + b));
                                        if (e == 0) continue;
                                        double t = 0;
                                        for (int p = 0; p < 4; p++)
                                            for (int q = 0; q < 4; q++)
                                                t += fabs(at(x, C, h, w, n, c, 2 * ty - 1 + p,
                                                             2 * tx - 1 + q)) *
                                                     kt[a][r][p] * kt[b][u][q];
                                        s += e * t;
                                    }
                    S[(((size_t)k * C + c) * 3 + r) * 3 + u] = s;
                }
}

/* Every |got - want| within e * S + 2^-22 |want| (the float64 reference stored in float32), and
 * returns the mean of |got - want| / S over the elements with S > 0. */
static double check_bound(const char *what, const float *got, const float *want, const double *S,
                          size_t n, double e) {
    double sum = 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - want[i]);
        const double tol = e * S[i] + ldexp(fabs(want[i]), -22) + 1e-30;
        if (!(err <= tol))
            fail_msg("%s: element %zu: %.9g against float64 %.9g (error %.3g, bound %.3g)", what, i,
                     got[i], want[i], err, tol);
        if (S[i] > 0) {
            sum += err / S[i];
            count++;
        }
    }
    return count ? sum / count : 0;
}

static double bound_factor(int terms) {
    return ldexp(1, -7) + ldexp(1, -16) + (terms + 32) * ldexp(1, -23);
}

typedef struct run_out {
    float *y, *dx, *dw;
} run_out;

/* The three passes through the direct calls (bf16: the _bf16 functions), dW summed as a layer
 * does (cf_conv_winograd_wgrad_add into zeros). */
static run_out run_direct(const wcase *wc, const float *x, const float *wt, const float *dy,
                          bool bf16) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, wc->c, wc->h, wc->w, 3, 3, 1, 1, 1, 1));
    const size_t plane = (size_t)wc->h * wc->w;
    run_out o = {malloc((size_t)wc->n * wc->k * plane * sizeof(float)),
                 malloc((size_t)wc->n * wc->c * plane * sizeof(float)),
                 calloc((size_t)wc->k * wc->c * 9, sizeof(float))};
    const size_t packed = bf16 ? cf_conv_winograd_packed_size_bf16(&g, wc->k)
                               : cf_conv_winograd_packed_size(&g, wc->k);
    float *u = malloc(packed * sizeof(float)), *du = malloc(16 * (size_t)wc->k * wc->c * 4);
    float *scratch = malloc(
        (bf16 ? cf_conv_winograd_scratch_bf16(&g, wc->k) : cf_conv_winograd_scratch(&g, wc->k)) *
        sizeof(float));
    if (bf16) {
        cf_conv_winograd_pack_bf16(&g, wc->k, wt, u);
        cf_conv_winograd_forward_bf16(&g, wc->k, u, x, wc->n, o.y, scratch);
        cf_conv_winograd_pack_dx_bf16(&g, wc->k, wt, u);
        cf_conv_winograd_dx_bf16(&g, wc->k, u, dy, wc->n, o.dx, scratch);
        cf_conv_winograd_wgrad_bf16(&g, wc->k, dy, x, wc->n, du, false, scratch);
    } else {
        cf_conv_winograd_pack(&g, wc->k, wt, u);
        cf_conv_winograd_forward(&g, wc->k, u, x, wc->n, o.y, scratch);
        cf_conv_winograd_pack_dx(&g, wc->k, wt, u);
        cf_conv_winograd_dx(&g, wc->k, u, dy, wc->n, o.dx, scratch);
        cf_conv_winograd_wgrad(&g, wc->k, dy, x, wc->n, du, false, scratch);
    }
    cf_conv_winograd_wgrad_add(&g, wc->k, du, o.dw);
    free(u), free(du), free(scratch);
    return o;
}

static void free_out(run_out *o) {
    free(o->y), free(o->dx), free(o->dw);
}

static void expect_bitwise(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu: %.9g against %.9g", what, i, a[i], b[i]);
}

static void case_inputs(int i, const wcase *wc, float **x, float **wt, float **dy) {
    const size_t plane = (size_t)wc->h * wc->w;
    *x = malloc((size_t)wc->n * wc->c * plane * sizeof(float));
    *wt = malloc((size_t)wc->k * wc->c * 9 * sizeof(float));
    *dy = malloc((size_t)wc->n * wc->k * plane * sizeof(float));
    fill_uniform(*x, (size_t)wc->n * wc->c * plane, 100 + i, -2, 2);
    const float s = 1.0f / sqrtf(9.0f * wc->c);
    fill_uniform(*wt, (size_t)wc->k * wc->c * 9, 200 + i, -s, s);
    fill_uniform(*dy, (size_t)wc->n * wc->k * plane, 300 + i, -1, 1);
}

/* Whether the active kernel table has Winograd transforms (the generic one has none: its layers
 * take the implicit or lowered convolution, and the direct Winograd calls must not be made). */
static bool winograd_here(void) {
    cf_conv_geom g;
    return cf_conv_geom_init(&g, 16, 8, 8, 3, 3, 1, 1, 1, 1) && cf_conv_winograd_supported(&g);
}

/* Forward, dx and dW against float64 within the bound; with bf16 compute, visibly not the fp32
 * Winograd; without, bitwise it. */
static void test_matches_float64(void **state) {
    (void)state;
    if (!winograd_here()) {
        printf("kernels %s: no Winograd transforms\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    make_kt();
    const bool bf16 = cf_bf16_compute();
    printf("kernels %s, bf16 compute %s\n", cf_isa_name(cf_isa_active()), bf16 ? "yes" : "no");
    oracle o;
    oracle_init(&o);
    float *xs[N_CASES], *ws[N_CASES], *dys[N_CASES];
    for (int i = 0; i < N_CASES; i++) {
        const wcase *wc = &cases[i];
        case_inputs(i, wc, &xs[i], &ws[i], &dys[i]);
        char name[16];
        snprintf(name, sizeof name, "x%d", i);
        oracle_put(&o, name, xs[i], cf_shape4(wc->n, wc->c, wc->h, wc->w));
        snprintf(name, sizeof name, "w%d", i);
        oracle_put(&o, name, ws[i], cf_shape4(wc->k, wc->c, 3, 3));
        snprintf(name, sizeof name, "dy%d", i);
        oracle_put(&o, name, dys[i], cf_shape4(wc->n, wc->k, wc->h, wc->w));
    }
    char args[16];
    snprintf(args, sizeof args, "%d", N_CASES);
    oracle_run(&o, "bf16_winograd.py", args);
    for (int i = 0; i < N_CASES; i++) {
        const wcase *wc = &cases[i];
        const size_t plane = (size_t)wc->h * wc->w, ny = (size_t)wc->n * wc->k * plane,
                     nx = (size_t)wc->n * wc->c * plane, nw = (size_t)wc->k * wc->c * 9;
        run_out got = run_direct(wc, xs[i], ws[i], dys[i], true);
        run_out f32 = run_direct(wc, xs[i], ws[i], dys[i], false);
        /* dx is the forward of dy with the weights flipped and their channels swapped */
        float *flipped = malloc(nw * sizeof(float));
        for (int k = 0; k < wc->k; k++)
            for (int c = 0; c < wc->c; c++)
                for (int t = 0; t < 9; t++)
                    flipped[((size_t)c * wc->k + k) * 9 + t] =
                        ws[i][((size_t)k * wc->c + c) * 9 + 8 - t];
        double *sy = malloc(ny * sizeof(double)), *sx = malloc(nx * sizeof(double)),
               *sw = malloc(nw * sizeof(double));
        bound_forward(xs[i], ws[i], wc->n, wc->c, wc->k, wc->h, wc->w, sy);
        bound_forward(dys[i], flipped, wc->n, wc->k, wc->c, wc->h, wc->w, sx);
        bound_wgrad(xs[i], dys[i], wc->n, wc->c, wc->k, wc->h, wc->w, sw);
        const int tiles = wc->n * ((wc->h + 1) / 2) * ((wc->w + 1) / 2);
        const struct {
            const char *name;
            const float *got, *fp32;
            const double *S;
            size_t n;
            int terms; /* the GEMM's sum */
        } outs[] = {{"y", got.y, f32.y, sy, ny, wc->c},
                    {"dx", got.dx, f32.dx, sx, nx, wc->k},
                    {"gw", got.dw, f32.dw, sw, nw, tiles}};
        for (size_t j = 0; j < 3; j++) {
            char name[16], what[96];
            snprintf(what, sizeof what, "case %d (%d x %d->%d, %dx%d) %s", i, wc->n, wc->c, wc->k,
                     wc->h, wc->w, outs[j].name);
            snprintf(name, sizeof name, "%s%d", outs[j].name, i);
            cf_tensor want = oracle_get(&o, name);
            assert_int_equal(cf_tensor_numel(&want), outs[j].n);
            const double e = bound_factor(outs[j].terms);
            const double mean = check_bound(what, outs[j].got, want.data, outs[j].S, outs[j].n, e);
            const double mean32 =
                check_bound(what, outs[j].fp32, want.data, outs[j].S, outs[j].n, e);
            printf("%s: mean error / bound sum %.3g (fp32 Winograd %.3g; bf16 u = %.3g)\n", what,
                   mean, mean32, ldexp(1, -8));
            if (bf16) {
                /* The roundings add up as a random walk: an output's error is about u /
                 * sqrt(terms) of its bound sum, 8e-6 to 8e-5 on these cases, fp32's ~2e-9.
                 * Above u / 4 (2^-10) the products were rounded more than once; under 2^-20
                 * (500 times fp32's) they were not rounded to bf16. */
                if (mean > ldexp(1, -10))
                    fail_msg("%s: mean error %.3g of the bound sum, above 2^-10", what, mean);
                if (mean < ldexp(1, -20))
                    fail_msg("%s: mean error %.3g of the bound sum: not computed in bf16", what,
                             mean);
            } else {
                expect_bitwise(what, outs[j].got, outs[j].fp32, outs[j].n);
            }
            free(want.data);
        }
        free_out(&got), free_out(&f32);
        free(flipped), free(sy), free(sx), free(sw);
        free(xs[i]), free(ws[i]), free(dys[i]);
    }
    oracle_cleanup(&o);
}

/* A conv layer's passes (bf16 or not) on images [n0, n1) of x, on `threads` threads: y and dx
 * into those images of y and dx, dW into dw (NULL: not kept). */
static void layer_passes(const wcase *wc, bool bf16, int threads, const float *x, const float *dy,
                         int n0, int n1, float *y, float *dx, float *dw) {
    cf_set_num_threads(threads);
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_conv2d(wc->c, wc->k, 3, 1, 1, false), 7), CF_OK);
    assert_int_equal(cf_conv_set_bf16(model->root, bf16), 1);
    cf_model_train(model, true);
    cf_model_zero_grad(model);
    const size_t plane = (size_t)wc->h * wc->w;
    const cf_tensor tx = cf_tensor_view((float *)x + (size_t)n0 * wc->c * plane,
                                        cf_shape4(n1 - n0, wc->c, wc->h, wc->w));
    const cf_tensor *ty;
    assert_int_equal(cf_model_forward(model, &tx, &ty), CF_OK);
    memcpy(y + (size_t)n0 * wc->k * plane, ty->data, (size_t)(n1 - n0) * wc->k * plane * 4);
    const cf_tensor tdy = cf_tensor_view((float *)dy + (size_t)n0 * wc->k * plane, ty->shape);
    const cf_tensor *tdx = model->root->ops->backward(model->root, &tdy, true);
    assert_non_null(tdx);
    memcpy(dx + (size_t)n0 * wc->c * plane, tdx->data, (size_t)(n1 - n0) * wc->c * plane * 4);
    if (dw) memcpy(dw, cf_model_param(model, "weight")->grad, (size_t)wc->k * wc->c * 9 * 4);
    cf_model_free(model);
    cf_set_num_threads(0);
}

/* The layer in bf16: bitwise the direct bf16 calls (it takes the bf16 Winograd where fp32 takes
 * Winograd), forward and dx the same on 1 and 2 threads and for the batch in two parts, dW the
 * same on every run; capped below avx512_bf16, bitwise the fp32 layer. */
static void test_layer(void **state) {
    (void)state;
    static const wcase layer_cases[] = {{5, 16, 28, 28, 24}, {3, 19, 27, 29, 21}};
    for (int i = 0; i < 2; i++) {
        const wcase *wc = &layer_cases[i];
        cf_conv_geom g;
        assert_true(cf_conv_geom_init(&g, wc->c, wc->h, wc->w, 3, 3, 1, 1, 1, 1));
        if (!cf_conv_winograd_pays(&g, wc->k)) {
            printf("case %d: no Winograd at this level\n", i);
            continue;
        }
        const size_t plane = (size_t)wc->h * wc->w, ny = (size_t)wc->n * wc->k * plane,
                     nx = (size_t)wc->n * wc->c * plane, nw = (size_t)wc->k * wc->c * 9;
        float *x = malloc(nx * 4), *dy = malloc(ny * 4);
        fill_uniform(x, nx, 400 + i, -2, 2);
        fill_uniform(dy, ny, 500 + i, -1, 1);
        float *y1 = malloc(ny * 4), *dx1 = malloc(nx * 4), *dw1 = malloc(nw * 4);
        float *y2 = malloc(ny * 4), *dx2 = malloc(nx * 4), *dw2 = malloc(nw * 4);
        layer_passes(wc, true, 1, x, dy, 0, wc->n, y1, dx1, dw1);
        char what[64];
        snprintf(what, sizeof what, "layer case %d", i);
        if (cf_bf16_compute()) {
            /* the direct calls with the layer's weights (the same seed) */
            cf_model *model;
            assert_int_equal(cf_model_new(&model, cf_conv2d(wc->c, wc->k, 3, 1, 1, false), 7),
                             CF_OK);
            run_out d = run_direct(wc, x, cf_model_param(model, "weight")->data, dy, true);
            cf_model_free(model);
            expect_bitwise("layer y against the direct bf16 call", y1, d.y, ny);
            expect_bitwise("layer dx against the direct bf16 call", dx1, d.dx, nx);
            expect_bitwise("layer dW against the direct bf16 call", dw1, d.dw, nw);
            free_out(&d);
            layer_passes(wc, true, 2, x, dy, 0, wc->n, y2, dx2, dw2);
            expect_bitwise("y: 2 threads against 1", y2, y1, ny);
            expect_bitwise("dx: 2 threads against 1", dx2, dx1, nx);
            layer_passes(wc, true, 2, x, dy, 0, wc->n, y2, dx2, dw1);
            expect_bitwise("dW: 2 threads, twice", dw1, dw2, nw);
            /* 3 threads: a batch split unevenly (5 and 3 images), the backward block by block */
            layer_passes(wc, true, 3, x, dy, 0, wc->n, y2, dx2, dw2);
            expect_bitwise("y: 3 threads against 1", y2, y1, ny);
            expect_bitwise("dx: 3 threads against 1", dx2, dx1, nx);
            const int half = wc->n / 2 + 1;
            layer_passes(wc, true, 2, x, dy, 0, half, y2, dx2, NULL);
            layer_passes(wc, true, 1, x, dy, half, wc->n, y2, dx2, NULL);
            layer_passes(wc, true, 1, x, dy, 0, wc->n, y1, dx1, NULL);
            expect_bitwise("y: the batch in two parts against whole", y2, y1, ny);
            expect_bitwise("dx: the batch in two parts against whole", dx2, dx1, nx);
        } else { /* no bf16 compute: the fp32 layer, bitwise */
            layer_passes(wc, false, 1, x, dy, 0, wc->n, y2, dx2, dw2);
            expect_bitwise("y: bf16 layer without bf16 compute against fp32", y1, y2, ny);
            expect_bitwise("dx: bf16 layer without bf16 compute against fp32", dx1, dx2, nx);
            expect_bitwise("dW: bf16 layer without bf16 compute against fp32", dw1, dw2, nw);
        }
        free(x), free(dy), free(y1), free(dx1), free(dw1), free(y2), free(dx2), free(dw2);
    }
}

/* The transformed input and output gradient rounded and paired as the transforms compute them
 * (where the level has cf_wino_kernels.input_pairs and dy_pairs and cf_bf16_kernels.gemm_paired)
 * against rounded by the GEMM's packing: bitwise on every case (odd channel counts: the last
 * pair's high half 0; odd tile counts: the last tile pair's; bands of tile rows; blocks of
 * several images), forward, dx and dW. */
static void test_fused_input(void **state) {
    (void)state;
    if (!winograd_here()) {
        printf("kernels %s: no Winograd transforms\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    const cf_kernel_table *kt_now = cf_active_kernels;
    if (!cf_bf16_compute() || !kt_now->wino || !kt_now->wino->input_pairs ||
        !kt_now->wino->dy_pairs || !kt_now->bf16 || !kt_now->bf16->gemm_paired)
        printf("no fused input transform at this level: both runs take the packing path\n");
    static const wcase extra[] = {
        {2, 3, 6, 6, 5}, {3, 256, 8, 8, 64}, {2, 64, 32, 32, 32}, {1, 24, 5, 5, 33}};
    for (int i = 0; i < N_CASES + 4; i++) {
        const wcase *wc = i < N_CASES ? &cases[i] : &extra[i - N_CASES];
        float *x, *wt, *dy;
        case_inputs(i, wc, &x, &wt, &dy);
        cf__winograd_set_fused(false);
        run_out a = run_direct(wc, x, wt, dy, true);
        cf__winograd_set_fused(true);
        run_out b = run_direct(wc, x, wt, dy, true);
        const size_t plane = (size_t)wc->h * wc->w;
        char what[80];
        snprintf(what, sizeof what, "case %d y: fused against packed", i);
        expect_bitwise(what, b.y, a.y, (size_t)wc->n * wc->k * plane);
        snprintf(what, sizeof what, "case %d dx: fused against packed", i);
        expect_bitwise(what, b.dx, a.dx, (size_t)wc->n * wc->c * plane);
        snprintf(what, sizeof what, "case %d dW: fused against packed", i);
        expect_bitwise(what, b.dw, a.dw, (size_t)wc->k * wc->c * 9);
        free_out(&a), free_out(&b);
        free(x), free(wt), free(dy);
    }
}

/* cf_conv_winograd_backward (_bf16): wgrad then dx block by block, against the two calls, bitwise:
 * du overwritten and accumulated, dx, on every case (blocks of several images, bands of tile
 * rows, one image), in fp32 and bf16, and no images (du zeroed). */
static void test_backward_fused(void **state) {
    (void)state;
    if (!winograd_here()) {
        printf("kernels %s: no Winograd transforms\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    /* the last: C K over BACKWARD_BLOCKS_MAX, the two calls in turn */
    static const wcase extra[] = {{9, 40, 7, 7, 48}, {5, 24, 12, 10, 20}, {3, 129, 2, 2, 128}};
    for (int i = 0; i < N_CASES + 3; i++) {
        const wcase *wc = i < N_CASES ? &cases[i] : &extra[i - N_CASES];
        float *x, *wt, *dy;
        case_inputs(i, wc, &x, &wt, &dy);
        cf_conv_geom g;
        assert_true(cf_conv_geom_init(&g, wc->c, wc->h, wc->w, 3, 3, 1, 1, 1, 1));
        const size_t plane = (size_t)wc->h * wc->w, nx = (size_t)wc->n * wc->c * plane;
        const size_t ndu = cf_conv_winograd_packed_size(&g, wc->k);
        for (int bf16 = 0; bf16 < 2; bf16++) {
            float *u = malloc((bf16 ? cf_conv_winograd_packed_size_bf16(&g, wc->k) : ndu) * 4);
            float *scratch = malloc((bf16 ? cf_conv_winograd_scratch_bf16(&g, wc->k)
                                          : cf_conv_winograd_scratch(&g, wc->k)) *
                                    sizeof(float));
            float *du1 = malloc(ndu * 4), *du2 = malloc(ndu * 4);
            float *dx1 = malloc(nx * 4), *dx2 = malloc(nx * 4);
            if (bf16)
                cf_conv_winograd_pack_dx_bf16(&g, wc->k, wt, u);
            else
                cf_conv_winograd_pack_dx(&g, wc->k, wt, u);
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                fill_uniform(du1, ndu, 600 + i, -1, 1);
                memcpy(du2, du1, ndu * 4);
                if (bf16) {
                    cf_conv_winograd_wgrad_bf16(&g, wc->k, dy, x, wc->n, du1, accumulate, scratch);
                    cf_conv_winograd_dx_bf16(&g, wc->k, u, dy, wc->n, dx1, scratch);
                    cf_conv_winograd_backward_bf16(&g, wc->k, u, dy, x, wc->n, du2, accumulate, dx2,
                                                   scratch);
                } else {
                    cf_conv_winograd_wgrad(&g, wc->k, dy, x, wc->n, du1, accumulate, scratch);
                    cf_conv_winograd_dx(&g, wc->k, u, dy, wc->n, dx1, scratch);
                    cf_conv_winograd_backward(&g, wc->k, u, dy, x, wc->n, du2, accumulate, dx2,
                                              scratch);
                }
                char what[80];
                snprintf(what, sizeof what, "case %d %s%s du: block by block against the calls", i,
                         bf16 ? "bf16" : "fp32", accumulate ? " accumulate" : "");
                expect_bitwise(what, du2, du1, ndu);
                snprintf(what, sizeof what, "case %d %s dx: block by block against the calls", i,
                         bf16 ? "bf16" : "fp32");
                expect_bitwise(what, dx2, dx1, nx);
            }
            fill_uniform(du2, ndu, 700 + i, -1, 1);
            if (bf16)
                cf_conv_winograd_backward_bf16(&g, wc->k, u, dy, x, 0, du2, false, dx2, scratch);
            else
                cf_conv_winograd_backward(&g, wc->k, u, dy, x, 0, du2, false, dx2, scratch);
            for (size_t j = 0; j < ndu; j++)
                if (du2[j] != 0.0f) fail_msg("case %d: no images, du[%zu] = %g", i, j, du2[j]);
            free(u), free(scratch), free(du1), free(du2), free(dx1), free(dx2);
        }
        free(x), free(wt), free(dy);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_float64),
        cmocka_unit_test(test_fused_input),
        cmocka_unit_test(test_layer),
        cmocka_unit_test(test_backward_fused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
