/* The optimizer's step and zero_grad on the calling thread against over the pool, by model size:
 * the threshold CF_OPT_PARALLEL_MIN's measurement (src/optim/optim.c).
 *
 *   bench_opt_split [--threads N] [--reps R]
 *
 * For each size (a Linear layer's weights, Adam with fastai's defaults, random gradients) it
 * alternates R rounds of 200 calls of step + zero_grad serial (A) and over the pool (B), A B B A,
 * and prints the median wall microseconds a call of each and B / A. The step alone: the caches
 * of a real step (the next forward reading the weights the other thread wrote) are bench_step
 * --ab opt's. */
#include <corefit.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_internal.h"

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int threads = 2, reps = 40;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 2 || reps < 2 || reps > 1000) {
        fprintf(stderr, "bench_opt_split: --threads >= 2, --reps 2..1000\n");
        return 2;
    }
    cf_set_num_threads(threads);
    static const int outs[] = {16, 64, 128, 256, 424, 1024, 2048};
    printf("step + zero_grad, Adam, %d threads, kernels %s: median wall us a call (A serial, B "
           "pool)\n",
           threads, cf_isa_name(cf_isa_active()));
    for (size_t s = 0; s < sizeof outs / sizeof outs[0]; s++) {
        cf_model *model;
        if (cf_model_new(&model, cf_linear(256, outs[s], false), 1) != CF_OK) return 1;
        cf_opt_config cfg = cf_opt_adam_defaults();
        cf_optimizer *opt;
        if (cf_optimizer_new(&opt, model, &cfg) != CF_OK) return 1;
        const size_t n = model->n_weights;
        double t[2][500];
        int nr[2] = {0, 0};
        for (int r = 0; r < reps; r++) {
            const int side = ((r + 1) / 2) % 2;
            cf__opt_set_parallel_min(side ? 0 : INT64_MAX);
            double t0 = cf_now();
            for (int k = 0; k < 200; k++) {
                for (size_t i = 0; i < n; i += 61) model->grads[i] = 1e-3f * (float)(i % 7);
                cf_optimizer_step(opt);
                cf_optimizer_zero_grad(opt);
            }
            t[side][nr[side]++] = (cf_now() - t0) / 200;
        }
        cf__opt_set_parallel_min(-1);
        const double a = median(t[0], nr[0]), b = median(t[1], nr[1]);
        printf("%8zu weights: A %8.2f us  B %8.2f us  B / A %.3f\n", n, a * 1e6, b * 1e6, b / a);
        cf_optimizer_free(opt);
        cf_model_free(model);
    }
    return 0;
}
