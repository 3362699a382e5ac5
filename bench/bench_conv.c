/* Times Conv2d forward + backward on the convolutions of workload W1 (mini-resnet on
 * Fashion-MNIST, batch 64), or of W2 (the VGG-style CNN) with `vgg`, or of W5 (the U-Net on
 * resnet18 at 64 x 64, batch 16: every distinct shape, each once) with `unet`, and prints the
 * achieved GFLOP/s per shape, beside the single-thread SGEMM rate measured in the same run.
 *
 *   bench_conv [threads] [seconds per shape] [w1|vgg|unet|w3] [cpu|bf16|cpu-bf16]
 *   (default: 1 thread, 0.5 s, w1)
 *
 * w3: resnet18's convolutions at 128 px (W3, batch 64). bf16: the layers in mixed precision
 * (cf_conv_set_bf16; where the kernel table has bf16 kernels, else fp32 as the level says).
 *
 * cpu: time by the process's CPU time instead of the wall clock (on a machine busy with other
 * work, where a process gets a share of a core; with one thread it is the thread's own time).
 *
 * Times are the best repetition per shape (the median of the totals is printed too): on a shared
 * machine the memory bandwidth of neighbours makes single repetitions vary by 2x. OpenBLAS picks
 * its kernels from the CPU model at load time; the line above the table names the one in use
 * (OPENBLAS_CORETYPE overrides it when OpenBLAS does not know the CPU).
 * The stem's backward computes no input gradient (nothing before it needs one), as in training. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "corefit/nn.h"

typedef struct conv_shape {
    const char *name;
    int in, out, k, stride, pad, hw;
    bool need_dx;
} conv_shape;

static const conv_shape shapes[] = {
    {"stem 1->16 3x3 28x28", 1, 16, 3, 1, 1, 28, false},
    {"b1 16->32 3x3 s2 28x28", 16, 32, 3, 2, 1, 28, true},
    {"b1 32->32 3x3 14x14", 32, 32, 3, 1, 1, 14, true},
    {"b1 short 16->32 1x1 s2", 16, 32, 1, 2, 0, 28, true},
    {"b2 32->64 3x3 s2 14x14", 32, 64, 3, 2, 1, 14, true},
    {"b2 64->64 3x3 7x7", 64, 64, 3, 1, 1, 7, true},
    {"b2 short 32->64 1x1 s2", 32, 64, 1, 2, 0, 14, true},
};

static const conv_shape vgg_shapes[] = {
    {"vgg0 1->32 3x3 28x28", 1, 32, 3, 1, 1, 28, false},
    {"vgg0 32->32 3x3 28x28", 32, 32, 3, 1, 1, 28, true},
    {"vgg1 32->64 3x3 14x14", 32, 64, 3, 1, 1, 14, true},
    {"vgg1 64->64 3x3 14x14", 64, 64, 3, 1, 1, 14, true},
    {"vgg2 64->128 3x3 7x7", 64, 128, 3, 1, 1, 7, true},
    {"vgg2 128->128 3x3 7x7", 128, 128, 3, 1, 1, 7, true},
};

/* W5 (bench_unet.c): resnet18's encoder, the middle, the UnetBlocks' PixelShuffle_ICNR 1x1 and
 * 3x3 convolutions, the final PixelShuffle_ICNR, ResBlock and output convolution. */
static const conv_shape unet_shapes[] = {
    {"stem 3->64 7x7 s2 64x64", 3, 64, 7, 2, 3, 64, false},
    {"l1 64->64 3x3 16x16", 64, 64, 3, 1, 1, 16, true},
    {"l2 64->128 3x3 s2 16x16", 64, 128, 3, 2, 1, 16, true},
    {"l2 128->128 3x3 8x8", 128, 128, 3, 1, 1, 8, true},
    {"l2 down 64->128 1x1 s2", 64, 128, 1, 2, 0, 16, true},
    {"l3 128->256 3x3 s2 8x8", 128, 256, 3, 2, 1, 8, true},
    {"l3 256->256 3x3 4x4", 256, 256, 3, 1, 1, 4, true},
    {"l3 down 128->256 1x1 s2", 128, 256, 1, 2, 0, 8, true},
    {"l4 256->512 3x3 s2 4x4", 256, 512, 3, 2, 1, 4, true},
    {"l4 512->512 3x3 2x2", 512, 512, 3, 1, 1, 2, true},
    {"l4 down 256->512 1x1 s2", 256, 512, 1, 2, 0, 4, true},
    {"mid 512->1024 3x3 2x2", 512, 1024, 3, 1, 1, 2, true},
    {"mid 1024->512 3x3 2x2", 1024, 512, 3, 1, 1, 2, true},
    {"up0 512->1024 1x1 2x2", 512, 1024, 1, 1, 0, 2, true},
    {"ub0 512->512 3x3 4x4", 512, 512, 3, 1, 1, 4, true},
    {"up1 512->1024 1x1 4x4", 512, 1024, 1, 1, 0, 4, true},
    {"ub1 384->384 3x3 8x8", 384, 384, 3, 1, 1, 8, true},
    {"up2 384->768 1x1 8x8", 384, 768, 1, 1, 0, 8, true},
    {"ub2 256->256 3x3 16x16", 256, 256, 3, 1, 1, 16, true},
    {"up3 256->512 1x1 16x16", 256, 512, 1, 1, 0, 16, true},
    {"ub3 192->96 3x3 32x32", 192, 96, 3, 1, 1, 32, true},
    {"ub3 96->96 3x3 32x32", 96, 96, 3, 1, 1, 32, true},
    {"up4 96->384 1x1 32x32", 96, 384, 1, 1, 0, 32, true},
    {"res 99->99 3x3 64x64", 99, 99, 3, 1, 1, 64, true},
    {"out 99->11 1x1 64x64", 99, 11, 1, 1, 0, 64, true},
};

/* W3 (bench_images.c): resnet18 at 128 px, every distinct shape once. */
static const conv_shape w3_shapes[] = {
    {"stem 3->64 7x7 s2 128x128", 3, 64, 7, 2, 3, 128, false},
    {"l1 64->64 3x3 32x32", 64, 64, 3, 1, 1, 32, true},
    {"l2 64->128 3x3 s2 32x32", 64, 128, 3, 2, 1, 32, true},
    {"l2 128->128 3x3 16x16", 128, 128, 3, 1, 1, 16, true},
    {"l2 down 64->128 1x1 s2", 64, 128, 1, 2, 0, 32, true},
    {"l3 128->256 3x3 s2 16x16", 128, 256, 3, 2, 1, 16, true},
    {"l3 256->256 3x3 8x8", 256, 256, 3, 1, 1, 8, true},
    {"l3 down 128->256 1x1 s2", 128, 256, 1, 2, 0, 16, true},
    {"l4 256->512 3x3 s2 8x8", 256, 512, 3, 2, 1, 8, true},
    {"l4 512->512 3x3 4x4", 512, 512, 3, 1, 1, 4, true},
    {"l4 down 256->512 1x1 s2", 256, 512, 1, 2, 0, 8, true},
};

static bool cpu_clock; /* the cpu argument */

/* Seconds of the wall clock, or of the process's CPU time with the cpu argument. */
static double now(void) {
    if (!cpu_clock) return cf_now();
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double sgemm_rate(int n, double seconds) {
    float *a = cf_malloc((size_t)n * n * sizeof(float)), *b = cf_malloc((size_t)n * n * 4),
          *c = cf_malloc((size_t)n * n * 4);
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = 0.001f * (float)(i % 1000);
    cf_sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n);
    double best = 1e30, start = now();
    while (now() - start < seconds) {
        double t = now();
        cf_sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n);
        t = now() - t;
        if (t < best) best = t;
    }
    cf_free(a);
    cf_free(b);
    cf_free(c);
    return 2.0 * n * n * n / best * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    double seconds = argc > 2 ? atof(argv[2]) : 0.5;
    const bool vgg = argc > 3 && !strcmp(argv[3], "vgg");
    const bool unet = argc > 3 && !strcmp(argv[3], "unet");
    const bool w3 = argc > 3 && !strcmp(argv[3], "w3");
    const conv_shape *list = vgg ? vgg_shapes : unet ? unet_shapes : w3 ? w3_shapes : shapes;
    const size_t n_shapes = vgg    ? sizeof vgg_shapes / sizeof vgg_shapes[0]
                            : unet ? sizeof unet_shapes / sizeof unet_shapes[0]
                            : w3   ? sizeof w3_shapes / sizeof w3_shapes[0]
                                   : sizeof shapes / sizeof shapes[0];
    const char *what = vgg ? "W2" : unet ? "W5" : w3 ? "W3" : "W1";
    const int batch = unet ? 16 : 64;
    cpu_clock = argc > 4 && strncmp(argv[4], "cpu", 3) == 0;
    const bool bf16 = argc > 4 && strstr(argv[4], "bf16") != NULL;
    cf_set_num_threads(threads);
    printf("corefit Conv2d%s, batch %d, %d thread(s); kernels %s; OpenBLAS core %s; single-thread "
           "SGEMM 512^3: %.1f GFLOP/s\n",
           bf16 ? " (bf16)" : "", batch, threads, cf_isa_name(cf_isa_active()),
           openblas_get_corename(), sgemm_rate(512, 0.3));
    printf("%-28s %9s %9s %9s %9s %9s\n", "shape", "fwd ms", "bwd ms", "fwd GF/s", "bwd GF/s",
           "all GF/s");
    double total_flops = 0, total_time = 0, total_median = 0;
    for (size_t s = 0; s < n_shapes; s++) {
        const conv_shape *c = &list[s];
        /* CF_BENCH_ONLY=text: only the shapes whose name contains text (for profiling one) */
        const char *only = getenv("CF_BENCH_ONLY");
        if (only && !strstr(c->name, only)) continue;
        cf_model *model = NULL;
        if (cf_model_new(&model, cf_conv2d(c->in, c->out, c->k, c->stride, c->pad, false), 1) !=
            CF_OK) {
            fprintf(stderr, "%s\n", cf_last_error());
            return 1;
        }
        if (bf16) cf_conv_set_bf16(model->root, true);
        cf_shape xs = cf_shape4(batch, c->in, c->hw, c->hw);
        float *x = cf_malloc(cf_shape_numel(&xs) * sizeof(float));
        cf_rng rng;
        cf_rng_seed(&rng, 5);
        for (size_t i = 0; i < cf_shape_numel(&xs); i++) x[i] = (float)cf_rng_normal(&rng);
        cf_tensor xt = cf_tensor_view(x, xs);
        const cf_tensor *y = NULL;
        cf_model_forward(model, &xt, &y);
        float *dy = cf_malloc(cf_tensor_numel(y) * sizeof(float));
        for (size_t i = 0; i < cf_tensor_numel(y); i++) dy[i] = (float)cf_rng_normal(&rng);
        cf_tensor dyt = cf_tensor_view(dy, y->shape);
        double K = (double)c->in * c->k * c->k, P = (double)y->shape.dim[2] * y->shape.dim[3];
        double gemm = 2.0 * batch * c->out * K * P; /* one of the three products */
        double fwd_flops = gemm, bwd_flops = gemm * (c->need_dx ? 2 : 1);
        enum { MAX_REPS = 2000 };
        static double tf[MAX_REPS], tb[MAX_REPS];
        int reps = 0;
        double start = now();
        for (int warm = 0; warm < 2; warm++) {
            cf_model_forward(model, &xt, &y);
            model->root->ops->backward(model->root, &dyt, c->need_dx);
        }
        while (reps < MAX_REPS && (reps < 5 || now() - start < seconds)) {
            double t0 = now();
            cf_model_forward(model, &xt, &y);
            double t1 = now();
            model->root->ops->backward(model->root, &dyt, c->need_dx);
            double t2 = now();
            tf[reps] = t1 - t0;
            tb[reps] = t2 - t1;
            reps++;
        }
        qsort(tf, (size_t)reps, sizeof(double), cmp_double);
        qsort(tb, (size_t)reps, sizeof(double), cmp_double);
        double f = tf[0], b = tb[0];
        total_median += tf[reps / 2] + tb[reps / 2];
        printf("%-28s %9.3f %9.3f %9.1f %9.1f %9.1f\n", c->name, 1e3 * f, 1e3 * b,
               fwd_flops / f * 1e-9, bwd_flops / b * 1e-9,
               (fwd_flops + bwd_flops) / (f + b) * 1e-9);
        total_flops += fwd_flops + bwd_flops;
        total_time += f + b;
        cf_free(x);
        cf_free(dy);
        cf_model_free(model);
    }
    printf("all %s convs (best)%7s %19.3f ms %29.1f\n", what, "", 1e3 * total_time,
           total_flops / total_time * 1e-9);
    printf("all %s convs (median)%5s %19.3f ms %29.1f\n", what, "", 1e3 * total_median,
           total_flops / total_median * 1e-9);
    return 0;
}
