/* Single-thread SGEMM rate of the BLAS corefit uses (OpenBLAS, with the kernels corefit selects
 * for its instruction set: CF_ISA caps both), the yardstick of `make bench`. Prints one JSON
 * line, naming the OpenBLAS kernels and corefit's instruction set.
 *
 *   sgemm [seconds per shape]      (default 1)
 *
 * Shapes: 1024^3, and the largest W1 GEMM (block 2's 64->64 3x3 convolution over a batch of
 * 64 7x7 images: M 64, K 576, N 3136). For each shape the GEMM is repeated for the given time;
 * gflops is from the best repetition's wall time, gflops_cpu from the calling thread's CPU time
 * over all repetitions, which other processes on a shared machine disturb much less. */
#include <corefit.h>

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* CPU time of the calling thread: OpenBLAS's own worker threads, started when the library loads
 * and idle here (one BLAS thread), spin in sched_yield for a while, and counting them would
 * lower the yardstick by up to a third from run to run. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void rate(int m, int n, int k, double seconds, double *best_gflops, double *cpu_gflops) {
    float *a = cf_malloc((size_t)m * k * sizeof(float));
    float *b = cf_malloc((size_t)k * n * sizeof(float));
    float *c = cf_malloc((size_t)m * n * sizeof(float));
    if (!a || !b || !c) {
        *best_gflops = *cpu_gflops = 0;
        cf_free(a), cf_free(b), cf_free(c);
        return;
    }
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = 0.001f * (float)(i % 1000);
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = 0.002f * (float)(i % 500);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
    double flop = 2.0 * m * n * k, best = 1e30, start = cf_now(), cpu0 = cpu_now();
    int reps = 0;
    do {
        double t = cf_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
        t = cf_now() - t;
        if (t < best) best = t;
        reps++;
    } while (cf_now() - start < seconds || reps < 3);
    double cpu = cpu_now() - cpu0;
    *best_gflops = flop / best / 1e9;
    *cpu_gflops = cpu > 0 ? flop * reps / cpu / 1e9 : 0;
    cf_free(a), cf_free(b), cf_free(c);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    cf_set_num_threads(1); /* also one BLAS thread */
    double g1, c1, g2, c2;
    rate(1024, 1024, 1024, seconds, &g1, &c1);
    rate(64, 3136, 576, seconds, &g2, &c2);
    printf(
        "{\"sgemm_gflops\": %.3f, \"sgemm_gflops_cpu\": %.3f, \"w1_gemm_gflops\": %.3f, "
        "\"w1_gemm_gflops_cpu\": %.3f, \"threads\": 1, \"blas_core\": \"%s\", \"isa\": \"%s\"}\n",
        g1, c1, g2, c2, cf_blas_core(), cf_isa_name(cf_isa_active()));
    return 0;
}
