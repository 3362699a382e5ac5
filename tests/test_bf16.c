/* bfloat16: the conversion against PyTorch's x.to(torch.bfloat16) bit for bit, cf_sgemm_bf16
 * against torch.matmul of bf16-rounded operands over every tile edge, a Linear layer in mixed
 * precision against torch.autocast("cpu", torch.bfloat16), Conv2d in mixed precision against
 * conv2d of bf16-rounded operands and autocast, and the instruction-set cap. ctest
 * runs it at the best level and capped below avx512_bf16 (tests/isa.cmake), where the same calls
 * must give fp32 results. */
#include "learn_fixture.h"
#include "oracle.h"

#include "corefit/nn.h"

#include <stdio.h>
#include <string.h>

static uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}
static float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* Special values, ties either way, subnormals, overflow to infinity, and random bit patterns
 * (NaNs among them); the length is not a multiple of a vector so the tail is converted too. */
static void test_convert_matches_torch(void **state) {
    (void)state;
    static const uint32_t special[] = {
        0x00000000, 0x80000000, 0x3f800000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
        0x7f800001, /* signalling NaN: the carry must not make it infinite */
        0x7f7fffff, /* rounds up to infinity */
        0x00800000, 0x00000001, 0x00007fff, 0x00008000, 0x00018000, 0x807fffff, 0x3f808000,
        0x3f818000, 0x3f808001, 0x3f817fff, 0xbf808000, 0xbf818000, 0x4049fdb0, 0x7f7f8000};
    enum { N_SPECIAL = sizeof special / sizeof special[0], N = N_SPECIAL + 4099 };
    static float x[N], y[N];
    static uint16_t h[N];
    for (int i = 0; i < N_SPECIAL; i++) x[i] = float_of(special[i]);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = N_SPECIAL; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = float_of((uint32_t)(s >> 32));
    }
    oracle o;
    oracle_init(&o);
    oracle_put(&o, "x", x, cf_shape1(N));
    oracle_run(&o, "bf16.py", "convert");
    cf_tensor ref = oracle_get(&o, "y");
    cf_fp32_to_bf16(x, h, N);
    cf_bf16_to_fp32(h, y, N);
    int nans = 0;
    for (int i = 0; i < N; i++) {
        const float want = ref.data[i];
        if (want != want) { /* the payload of a NaN is not specified; NaN it must stay */
            nans++;
            if (y[i] == y[i]) fail_msg("x[%d] = 0x%08x: 0x%04x is not NaN", i, bits_of(x[i]), h[i]);
            continue;
        }
        if (bits_of(y[i]) >> 16 != bits_of(want) >> 16 || (bits_of(want) & 0xffff))
            fail_msg("x[%d] = 0x%08x: 0x%04x, torch 0x%08x", i, bits_of(x[i]), h[i], bits_of(want));
        assert_true(bits_of(cf_bf16_round(x[i])) == bits_of(want));
    }
    assert_true(nans > 3); /* random patterns include NaNs */
    /* every tail length, against the one-value rounding */
    for (int n = 0; n <= 40; n++) {
        uint16_t out[41];
        memset(out, 0xab, sizeof out);
        cf_fp32_to_bf16(x + 5, out, (size_t)n);
        for (int i = 0; i < n; i++)
            if (x[5 + i] == x[5 + i])
                assert_int_equal(out[i], bits_of(cf_bf16_round(x[5 + i])) >> 16);
        assert_int_equal(out[n], 0xabab); /* nothing past the end */
    }
    free(ref.data);
    oracle_cleanup(&o);
}

typedef struct gemm_case {
    int m, n, k;
    bool ta, tb, accumulate;
} gemm_case;

/* Every edge of the 8 x 48 register tile and of the 256-long k blocks, odd k (a pair half
 * empty), the four transpositions, accumulation. The products of bf16 values are exact in fp32,
 * so cf_sgemm_bf16 may differ from torch only by the order of fp32 sums (atol 1e-6 per term of
 * k, values in [-1, 1)); rounding by truncation instead of to nearest even, or a dropped tail
 * element, misses by orders of magnitude more (checked below against the fp32 product). */
static void test_gemm_matches_torch(void **state) {
    (void)state;
    static const int ms[] = {1, 7, 8, 9, 17}, ns[] = {1, 15, 16, 17, 48, 49, 97},
                     ks[] = {1, 2, 3, 33, 256, 257, 300};
    enum { MAX_CASES = 5 * 7 * 7 + 4 };
    static gemm_case cases[MAX_CASES];
    int n_cases = 0;
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 7; b++)
            for (size_t c = 0; c < 7; c++, n_cases++)
                cases[n_cases] = (gemm_case){ms[a],       ns[b],           ks[c],
                                             n_cases % 2, n_cases / 2 % 2, n_cases % 3 == 0};
    for (int t = 0; t < 4; t++, n_cases++) /* a W1-sized shape in every transposition */
        cases[n_cases] = (gemm_case){64, 128, 256, t & 1, t >> 1, false};
    oracle o;
    oracle_init(&o);
    float *as[MAX_CASES], *bs[MAX_CASES];
    for (int i = 0; i < n_cases; i++) {
        const gemm_case *g = &cases[i];
        as[i] = malloc(sizeof(float) * g->m * g->k);
        bs[i] = malloc(sizeof(float) * g->k * g->n);
        fill_uniform(as[i], (size_t)g->m * g->k, 100 + i, -1, 1);
        fill_uniform(bs[i], (size_t)g->k * g->n, 200 + i, -1, 1);
        char name[32];
        snprintf(name, sizeof name, "a%d", i);
        oracle_put(&o, name, as[i], g->ta ? cf_shape2(g->k, g->m) : cf_shape2(g->m, g->k));
        snprintf(name, sizeof name, "b%d", i);
        oracle_put(&o, name, bs[i], g->tb ? cf_shape2(g->n, g->k) : cf_shape2(g->k, g->n));
        snprintf(name, sizeof name, "t%d", i);
        oracle_put_values(&o, name, 2, (double)g->ta, (double)g->tb);
    }
    char args[32];
    snprintf(args, sizeof args, "gemm %d", n_cases);
    oracle_run(&o, "bf16.py", args);
    const bool bf16 = cf_bf16_compute();
    double worst_vs_fp32 = 0;
    for (int i = 0; i < n_cases; i++) {
        const gemm_case *g = &cases[i];
        char name[32];
        snprintf(name, sizeof name, bf16 ? "c%d" : "f%d", i);
        cf_tensor want = oracle_get(&o, name);
        snprintf(name, sizeof name, "f%d", i);
        cf_tensor fp32 = oracle_get(&o, name);
        const size_t mn = (size_t)g->m * g->n;
        const int ldc = g->n + 3; /* C with a row stride wider than n: nothing past n written */
        float *c = malloc(sizeof(float) * (size_t)g->m * ldc);
        for (size_t j = 0; j < (size_t)g->m * ldc; j++) c[j] = 0.5f;
        const int lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
        cf_sgemm_bf16(g->ta, g->tb, g->m, g->n, g->k, as[i], lda, bs[i], ldb, c, ldc,
                      g->accumulate);
        float *got = malloc(sizeof(float) * mn);
        for (int r = 0; r < g->m; r++)
            for (int j = 0; j < ldc; j++) {
                const float v = c[(size_t)r * ldc + j];
                if (j >= g->n) {
                    assert_true(v == 0.5f);
                    continue;
                }
                got[(size_t)r * g->n + j] = g->accumulate ? v - 0.5f : v;
            }
        char what[96];
        snprintf(what, sizeof what, "gemm %dx%dx%d ta %d tb %d acc %d", g->m, g->n, g->k, g->ta,
                 g->tb, g->accumulate);
        assert_close(what, got, want.data, mn, 1e-5, 1e-6 * g->k + 1e-6);
        for (size_t j = 0; j < mn; j++) {
            const double d = fabs((double)got[j] - fp32.data[j]);
            if (d > worst_vs_fp32) worst_vs_fp32 = d;
        }
        free(c), free(got), free(want.data), free(fp32.data), free(as[i]), free(bs[i]);
    }
    /* bf16 operands (8 significant bits) must show against the fp32 product; fp32 must not */
    print_message("%s: largest difference from the fp32 product %.3g\n",
                  bf16 ? "bf16 compute" : "fp32 fallback", worst_vs_fp32);
    if (bf16)
        assert_true(worst_vs_fp32 > 1e-2);
    else
        assert_true(worst_vs_fp32 < 1e-3);
    oracle_cleanup(&o);
}

/* nn.Linear under torch.autocast("cpu", torch.bfloat16): its output and input gradient are bf16
 * tensors (rounded once more than corefit's fp32 results), so they agree within 2^-7 relative
 * to the largest value; against the same products of bf16 operands summed in float64, corefit
 * is within fp32 summation error (1e-5). The bias gradient is corefit's fp32 sum of dy (torch
 * sums the bf16 dy: within 2^-7 of the largest). */
static void test_linear_matches_autocast(void **state) {
    (void)state;
    enum { N = 37, IN = 70, OUT = 53 };
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_linear(IN, OUT, true), 5), CF_OK);
    assert_int_equal(cf_linear_set_bf16(model->root, true), 1);
    cf_param *w = cf_model_param(model, "weight"), *b = cf_model_param(model, "bias");
    static float x[N * IN], dy[N * OUT];
    fill_uniform(x, N * IN, 1, -2, 2);
    fill_uniform(dy, N * OUT, 2, -1, 1);
    oracle o;
    oracle_init(&o);
    oracle_put(&o, "x", x, cf_shape2(N, IN));
    oracle_put(&o, "w", w->data, cf_shape2(OUT, IN));
    oracle_put(&o, "b", b->data, cf_shape1(OUT));
    oracle_put(&o, "dy", dy, cf_shape2(N, OUT));
    oracle_run(&o, "bf16.py", "linear");
    cf_model_train(model, true);
    cf_model_zero_grad(model);
    cf_tensor tx = cf_tensor_view(x, cf_shape2(N, IN)), tdy = cf_tensor_view(dy, cf_shape2(N, OUT));
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
    const cf_tensor *dx = model->root->ops->backward(model->root, &tdy, true);
    assert_non_null(dx);
    const struct {
        const char *autocast, *exact;
        const float *got;
        size_t n;
    } outs[] = {{"y", "ye", y->data, N * OUT},
                {"dx", "dxe", dx->data, N * IN},
                {"gw", "gwe", w->grad, OUT * IN}};
    const bool bf16 = cf_bf16_compute();
    for (size_t i = 0; i < 3; i++) {
        cf_tensor ac = oracle_get(&o, outs[i].autocast), ex = oracle_get(&o, outs[i].exact);
        double scale = 0;
        for (size_t j = 0; j < outs[i].n; j++)
            if (fabs(ac.data[j]) > scale) scale = fabs(ac.data[j]);
        assert_close(outs[i].autocast, outs[i].got, ac.data, outs[i].n, 0, scale / 128);
        if (bf16) assert_close(outs[i].exact, outs[i].got, ex.data, outs[i].n, 1e-5, 1e-5);
        free(ac.data), free(ex.data);
    }
    cf_tensor gb = oracle_get(&o, "gb");
    double gb_scale = 0;
    for (int j = 0; j < OUT; j++) {
        double sum = 0;
        for (int r = 0; r < N; r++) sum += dy[r * OUT + j];
        assert_float_equal(b->grad[j], sum, 1e-4);
        if (fabs(gb.data[j]) > gb_scale) gb_scale = fabs(gb.data[j]);
    }
    assert_close("gb", b->grad, gb.data, OUT, 0, gb_scale / 128);
    free(gb.data);
    /* off again: fp32, as before */
    assert_int_equal(cf_linear_set_bf16(model->root, false), 1);
    oracle_cleanup(&o);
    cf_model_free(model);
}

typedef struct conv_case {
    int n, c, h, w, o, k, stride, pad;
    bool bias;
} conv_case;

/* The largest |v| of n values. */
static double largest(const float *v, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(v[i]) > m) m = fabs(v[i]);
    return m;
}

/* Conv2d in mixed precision, forward, input and weight gradients, on the layer shapes of W1 (the
 * 1-channel stem, the stride-2 3x3 layers and 1x1 shortcuts, the 3x3 layers on 14x14 and 7x7
 * images that fp32 takes through Winograd, grouped small images) and of W3 (a 7x7 stride-2 stem
 * on RGB), a 1x1 layer read in place, bias and no padding, and stride-1 layers of the implicit
 * bf16 kernels (odd channel counts, a 5x5 kernel, partial blocks of images and of rows) and the
 * 1x1 stride-2 shortcuts they take as the subsampled image's 1x1 product. With bf16
 * compute: within fp32 summation error (1e-6 per term) of conv2d on bf16-rounded x, w and dy summed
 * in float64, and within 2^-7 of the largest value of torch.autocast("cpu", torch.bfloat16) (whose
 * results are rounded to bf16 once more); and visibly not the fp32 result. Capped below
 * avx512_bf16, and for layers of fewer than 8 input channels (the stems, which stay fp32 under
 * to_bf16, but for the RGB 7x7 stem's forward pass and weight gradient where the level has the
 * bf16 stem): the fp32 result. */
static void test_conv_matches_torch(void **state) {
    (void)state;
    static const conv_case cases[] = {
        {3, 1, 28, 28, 16, 3, 1, 1, false},  /* W1 stem */
        {3, 16, 28, 28, 32, 3, 2, 1, false}, /* W1 block 1, stride 2 (implicit in fp32) */
        {2, 32, 14, 14, 32, 3, 1, 1, false}, /* W1 block 1's second (Winograd in fp32) */
        {3, 16, 28, 28, 32, 1, 2, 0, false}, /* W1 shortcut (the subsampled image's 1x1) */
        {7, 64, 7, 7, 64, 3, 1, 1, false},   /* W1 block 2: groups of 5 images, one partial */
        {2, 3, 20, 20, 8, 7, 2, 3, false},   /* W3 stem */
        {4, 24, 9, 9, 40, 1, 1, 0, true},    /* 1x1 read in place, bias */
        {5, 9, 9, 11, 7, 3, 1, 0, true},     /* no padding, odd sizes, bias (lowered) */
        /* stride 1, output as large as the input: the implicit bf16 kernels (conv_bf16.c) */
        {3, 12, 14, 14, 20, 3, 1, 1, true},  /* blocks of 2 images for dW, one partial; 20 rows */
        {2, 9, 10, 13, 11, 5, 1, 2, true},   /* odd channels (a half pair), 5x5, odd sizes */
        {2, 16, 28, 28, 24, 3, 1, 1, false}, /* one image per dW block, many position tiles */
        {3, 10, 12, 16, 9, 5, 2, 2, true},   /* stride 2 through the phase planes, 5x5, bias */
        {3, 9, 11, 13, 10, 1, 2, 0, false},  /* a shortcut on odd sizes, a half channel pair */
        {2, 32, 14, 14, 64, 1, 2, 0, false}, /* W1 block 2's shortcut */
        /* small planes on wide layers: the taps gathered to the output positions (compact) */
        {7, 128, 4, 4, 130, 3, 1, 1, false}, /* W3's 4x4 stage: a partial call and dW block */
        {3, 128, 8, 8, 136, 3, 2, 1, true},  /* its 8 -> 4 stride-2 layer, bias */
        {3, 129, 6, 6, 128, 3, 2, 1, false}, /* 3x3 outputs (odd: a zero position per image) */
        {2, 128, 8, 8, 128, 3, 1, 1, false}, /* W3's 8x8 stage */
        /* case 10's dW blocks in the implicit bf16 kernel (15 channels: no Winograd) */
        {2, 15, 28, 28, 24, 3, 1, 1, false},
        /* stride 2's dx phases, each computed from its first value: W1 block 2's (7 x 7 phases,
         * pad 1) and a 7x7 kernel (pad 3: the phases start at rows and columns 1 and 2) */
        {2, 32, 14, 14, 64, 3, 2, 1, false},
        {2, 10, 14, 18, 12, 7, 2, 3, true},
        /* one image, the fewest channels bf16 takes (8 in) and 1 out, rows of dx wider than
         * interleave_rows' 32 values (34: a tail of 2; 66: two whole vectors and a tail) */
        {1, 8, 36, 34, 1, 3, 2, 1, false},
        {1, 8, 10, 66, 3, 5, 2, 2, true},
    };
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    const bool bf16 = cf_bf16_compute();
    oracle o;
    oracle_init(&o);
    cf_model *models[N_CASES];
    float *xs[N_CASES], *dys[N_CASES];
    for (int i = 0; i < N_CASES; i++) {
        const conv_case *cc = &cases[i];
        assert_int_equal(cf_model_new(&models[i],
                                      cf_conv2d(cc->c, cc->o, cc->k, cc->stride, cc->pad, cc->bias),
                                      20 + i),
                         CF_OK);
        assert_int_equal(cf_conv_set_bf16(models[i]->root, true), 1);
        const int oh = (cc->h + 2 * cc->pad - cc->k) / cc->stride + 1,
                  ow = (cc->w + 2 * cc->pad - cc->k) / cc->stride + 1;
        const size_t nx = (size_t)cc->n * cc->c * cc->h * cc->w,
                     ny = (size_t)cc->n * cc->o * oh * ow;
        xs[i] = malloc(nx * sizeof(float));
        dys[i] = malloc(ny * sizeof(float));
        fill_uniform(xs[i], nx, 40 + i, -2, 2);
        fill_uniform(dys[i], ny, 60 + i, -1, 1);
        cf_param *w = cf_model_param(models[i], "weight"), *b = cf_model_param(models[i], "bias");
        static const float no_bias[1] = {0};
        char name[32];
        snprintf(name, sizeof name, "x%d", i);
        oracle_put(&o, name, xs[i], cf_shape4(cc->n, cc->c, cc->h, cc->w));
        snprintf(name, sizeof name, "w%d", i);
        oracle_put(&o, name, w->data, cf_shape4(cc->o, cc->c, cc->k, cc->k));
        snprintf(name, sizeof name, "b%d", i);
        oracle_put(&o, name, b ? b->data : no_bias, cf_shape1(b ? cc->o : 1));
        snprintf(name, sizeof name, "dy%d", i);
        oracle_put(&o, name, dys[i], cf_shape4(cc->n, cc->o, oh, ow));
        snprintf(name, sizeof name, "g%d", i);
        oracle_put_values(&o, name, 3, (double)cc->stride, (double)cc->pad, (double)cc->bias);
    }
    char args[32];
    snprintf(args, sizeof args, "conv %d", N_CASES);
    oracle_run(&o, "bf16.py", args);
    for (int i = 0; i < N_CASES; i++) {
        const conv_case *cc = &cases[i];
        cf_model *model = models[i];
        cf_model_train(model, true);
        cf_model_zero_grad(model);
        cf_tensor tx = cf_tensor_view(xs[i], cf_shape4(cc->n, cc->c, cc->h, cc->w));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &tx, &y), CF_OK);
        cf_tensor tdy = cf_tensor_view(dys[i], y->shape);
        const cf_tensor *dx = model->root->ops->backward(model->root, &tdy, true);
        assert_non_null(dx);
        const cf_param *w = cf_model_param(model, "weight");
        const int oh = y->shape.dim[2], ow = y->shape.dim[3];
        cf_conv_geom g;
        assert_true(cf_conv_geom_init(&g, cc->c, cc->h, cc->w, cc->k, cc->k, cc->stride, cc->stride,
                                      cc->pad, cc->pad));
        const bool winograd = cc->c >= 16 && cc->o >= 16 && cf_conv_winograd_pays(&g, cc->o);
        const struct {
            const char *name;
            const float *got;
            size_t n;
            int terms; /* products summed per value */
        } outs[] = {
            {"y", y->data, cf_shape_numel(&y->shape), cc->c * cc->k * cc->k},
            {"dx", dx->data, cf_shape_numel(&dx->shape), cc->o * cc->k * cc->k},
            {"gw", w->grad, w->numel, cc->n * oh * ow},
        };
        for (size_t j = 0; j < 3; j++) {
            char name[32], what[96];
            snprintf(what, sizeof what, "conv case %d (%d->%d, k %d, stride %d, pad %d) %s", i,
                     cc->c, cc->o, cc->k, cc->stride, cc->pad, outs[j].name);
            snprintf(name, sizeof name, "%sf%d", outs[j].name, i);
            cf_tensor fp32 = oracle_get(&o, name);
            snprintf(name, sizeof name, "%se%d", outs[j].name, i);
            cf_tensor exact = oracle_get(&o, name);
            snprintf(name, sizeof name, "%s%d", outs[j].name, i);
            cf_tensor autocast = oracle_get(&o, name);
            const double atol = 1e-6 * outs[j].terms + 1e-6;
            /* a weight gradient of fewer than 16 rows and at most 16 columns (the stem) stays
             * fp32: its bf16 tiles would be mostly padding */
            /* a stem (fewer than 8 input channels) stays fp32, but for the forward pass and
             * weight gradient of a stride-2 one of K >= 64 where the level has the bf16 stem
             * (cf_conv_stem_bf16_*: the RGB 7x7) */
            const bool bf16_stem =
                cc->c * cc->k * cc->k >= 64 && j != 1 && cf_conv_stem_bf16_supported(&g, cc->o);
            const bool few_rows = j == 2 && cc->c * cc->k * cc->k < 16 && cc->o <= 16,
                       stem = cc->c < 8 && !bf16_stem;
            if (bf16 && !few_rows && !stem) {
                /* a layer that fp32 takes through Winograd rounds the transformed operands
                 * instead (test_bf16_winograd bounds it against float64) */
                if (!winograd) assert_close(what, outs[j].got, exact.data, outs[j].n, 1e-5, atol);
                assert_close(what, outs[j].got, autocast.data, outs[j].n, 0,
                             largest(autocast.data, outs[j].n) / 128);
                double worst = 0; /* bf16 operands show against fp32's 24-bit ones */
                for (size_t v = 0; v < outs[j].n; v++)
                    if (fabs(outs[j].got[v] - fp32.data[v]) > worst)
                        worst = fabs(outs[j].got[v] - fp32.data[v]);
                if (worst < 1e-3 * largest(fp32.data, outs[j].n))
                    fail_msg("%s: within %.3g of fp32: not computed in bf16", what, worst);
            } else {
                assert_close(what, outs[j].got, fp32.data, outs[j].n, 1e-4, 10 * atol);
            }
            free(fp32.data), free(exact.data), free(autocast.data);
        }
        if (cc->bias) { /* the bias gradient: dy's fp32 sum per channel */
            const cf_param *b = cf_model_param(model, "bias");
            for (int ch = 0; ch < cc->o; ch++) {
                double sum = 0;
                for (int n = 0; n < cc->n; n++)
                    for (int p = 0; p < oh * ow; p++)
                        sum += dys[i][((size_t)n * cc->o + ch) * oh * ow + p];
                assert_float_equal(b->grad[ch], sum, 1e-4);
            }
        }
        assert_int_equal(cf_conv_set_bf16(model->root, false), 1);
        cf_model_free(model);
        free(xs[i]), free(dys[i]);
    }
    oracle_cleanup(&o);
}

/* The level's name, its place in the order of caps, and CF_ISA turning bf16 compute off. */
static void test_cap(void **state) {
    (void)state;
    cf_isa parsed;
    assert_true(cf_isa_parse("avx512_bf16", &parsed));
    assert_int_equal(parsed, CF_ISA_AVX512_BF16);
    assert_string_equal(cf_isa_name(CF_ISA_AVX512_BF16), "avx512_bf16");
    const cf_isa before = cf_isa_active(), best = cf_isa_best();
    assert_int_equal(cf_bf16_compute(), before == CF_ISA_AVX512_BF16 || before == CF_ISA_AMX);
    const char *env = getenv("CF_ISA");
    print_message("CF_ISA=%s: kernels %s, best %s, bf16 compute %s\n", env ? env : "",
                  cf_isa_name(before), cf_isa_name(best), cf_bf16_compute() ? "yes" : "no");
    if (env && *env && strcmp(env, "avx512_bf16") != 0 && strcmp(env, "amx") != 0)
        assert_false(cf_bf16_compute());
    cf_set_isa(CF_ISA_AVX512);
    assert_false(cf_bf16_compute());
    float a[6] = {1.001f, 2, 3, 4, 5, 6}, b[6] = {1.003f, 1, 1, 1, 1, 1}, c[4];
    cf_sgemm_bf16(false, false, 2, 2, 3, a, 3, b, 2, c, 2, false);
    assert_true(c[0] == 1.001f * 1.003f + 2 + 3); /* fp32: nothing rounded to bf16 */
    if (best == CF_ISA_AVX512_BF16 || best == CF_ISA_AMX) {
        assert_int_equal(cf_set_isa(CF_ISA_NEON), best);
        assert_true(cf_bf16_compute());
        cf_sgemm_bf16(false, false, 2, 2, 3, a, 3, b, 2, c, 2, false);
        assert_true(c[0] == 1.0f * 1.0f + 2 + 3); /* 1.001 and 1.003 round to 1 in bf16 */
    }
    cf_set_isa(before);
    assert_int_equal(cf_isa_active(), before);
}

/* One short fit of the fixture's problem (a 64-wide hidden layer): the final accuracy, and the
 * first weight of the last layer. */
static double fit_accuracy(bool bf16, float *first_weight) {
    cf_dls *dls = fixture_dls(1024, 512, 32);
    cf_module *layers[] = {cf_linear(4, 64, true), cf_relu(), cf_linear(64, 3, true)};
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, cf_sequential(3, layers), 11), CF_OK);
    cf_metric *metrics[] = {cf_accuracy()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, model, .quiet = true, .metrics = metrics,
                                    .n_metrics = 1, .seed = 3),
                     CF_OK);
    if (bf16) assert_int_equal(cf_learner_to_bf16(learn), CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 4, .lr_max = CF_SLICE(1e-2)), CF_OK);
    const cf_recorder *r = &learn->recorder;
    const double acc = r->values[(r->n_epochs - 1) * r->n_values + 2];
    *first_weight = cf_model_param(learn->model, "2.weight")->data[0];
    assert_int_equal(cf_learner_to_fp32(learn), CF_OK);
    cf_learner_free(learn);
    cf_dls_free(dls);
    return acc;
}

/* A fit in bf16 reaches the fp32 fit's accuracy within noise (a few of the 512 validation
 * samples); where bf16 compute runs, the weights show it, and where it does not, to_bf16
 * changes nothing at all. */
static void test_fit_bf16_matches_fp32(void **state) {
    (void)state;
    float w32, w16;
    const double acc32 = fit_accuracy(false, &w32), acc16 = fit_accuracy(true, &w16);
    print_message("accuracy fp32 %.4f, bf16 %.4f (%s)\n", acc32, acc16,
                  cf_bf16_compute() ? "bf16 compute" : "no bf16 kernels: fp32");
    assert_true(acc32 > 0.9);
    assert_true(fabs(acc16 - acc32) <= 0.02);
    if (cf_bf16_compute())
        assert_true(w16 != w32);
    else
        assert_true(w16 == w32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_matches_torch),
        cmocka_unit_test(test_gemm_matches_torch),
        cmocka_unit_test(test_linear_matches_autocast),
        cmocka_unit_test(test_conv_matches_torch),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_fit_bf16_matches_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
