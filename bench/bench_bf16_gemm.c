/* The bf16 GEMM (cf_sgemm_bf16: operands rounded to bfloat16, fp32 sums) against fp32 SGEMM
 * (OpenBLAS, cf_sgemm) on one thread, on W1-like shapes. Prints one JSON line per shape and
 * names the CPU, corefit's kernel level (bf16 compute only at avx512_bf16; below it
 * cf_sgemm_bf16 is the fp32 SGEMM) and OpenBLAS's kernels.
 *
 *   bench_bf16_gemm [seconds per shape and kernel]      (default 0.5)
 *
 * GFLOP/s counts 2 FLOPs per multiply-add, from the best repetition's wall time. The bf16
 * time includes rounding and packing both operands, as a layer pays it on every call. */
#include <corefit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cpu_name(char *out, size_t size) {
    snprintf(out, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            if (v) {
                v += 1 + (v[1] == ' ');
                snprintf(out, size, "%.*s", (int)strcspn(v, "\n"), v);
            }
            break;
        }
    fclose(f);
}

static double best_seconds(bool bf16, bool ta, bool tb, int m, int n, int k, const float *a,
                           const float *b, float *c, double seconds) {
    const int lda = ta ? m : k, ldb = tb ? k : n;
    double best = 1e30, start = cf_now();
    int reps = 0;
    do {
        double t = cf_now();
        if (bf16)
            cf_sgemm_bf16(ta, tb, m, n, k, a, lda, b, ldb, c, n, false);
        else
            cf_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
        t = cf_now() - t;
        if (t < best) best = t;
        reps++;
    } while (cf_now() - start < seconds || reps < 3);
    return best;
}

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 0.5;
    cf_set_num_threads(1); /* also one BLAS thread */
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    /* name, m, n, k, trans_a, trans_b: W1's largest convolution GEMM (64->64 3x3 over a batch of
     * 64 7x7 images), its 32->32 block, the head's Linear(128, 256) forward, input and weight
     * gradients at batch 64, and a square one */
    static const struct {
        const char *name;
        int m, n, k;
        bool ta, tb;
    } shapes[] = {{"conv64_7x7", 64, 3136, 576, false, false},
                  {"conv32_14x14", 32, 12544, 288, false, false},
                  {"linear_fwd", 64, 256, 128, false, true},
                  {"linear_dx", 64, 128, 256, false, false},
                  {"linear_dw", 256, 128, 64, true, false},
                  {"square1024", 1024, 1024, 1024, false, false}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int m = shapes[s].m, n = shapes[s].n, k = shapes[s].k;
        float *a = cf_malloc((size_t)m * k * sizeof(float));
        float *b = cf_malloc((size_t)k * n * sizeof(float));
        float *c = cf_malloc((size_t)m * n * sizeof(float));
        if (!a || !b || !c) {
            fprintf(stderr, "bench_bf16_gemm: out of memory at %s\n", shapes[s].name);
            return 1;
        }
        for (size_t i = 0; i < (size_t)m * k; i++) a[i] = 0.001f * (float)(i % 1000) - 0.5f;
        for (size_t i = 0; i < (size_t)k * n; i++) b[i] = 0.002f * (float)(i % 500) - 0.5f;
        const double flop = 2.0 * m * n * k;
        const double t32 =
            best_seconds(false, shapes[s].ta, shapes[s].tb, m, n, k, a, b, c, seconds);
        const double t16 =
            best_seconds(true, shapes[s].ta, shapes[s].tb, m, n, k, a, b, c, seconds);
        printf("{\"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"sgemm_gflops\": %.2f, "
               "\"bf16_gflops\": %.2f, \"speedup\": %.2f, \"threads\": 1, \"cpu\": \"%s\", "
               "\"isa\": \"%s\", \"bf16_compute\": %s, \"blas_core\": \"%s\"}\n",
               shapes[s].name, m, n, k, flop / t32 / 1e9, flop / t16 / 1e9, t32 / t16, cpu,
               cf_isa_name(cf_isa_active()), cf_bf16_compute() ? "true" : "false", cf_blas_core());
        cf_free(a), cf_free(b), cf_free(c);
    }
    return 0;
}
