/* The data-parallel gradient reduction of a large model, as a fork fit does it before every
 * optimizer step: weight this replica's gradient by its rows, sum over replicas, divide by the
 * total. Default size: W4's AWD-LSTM language model (awd_lstm_lm_config over the fortunes
 * vocabulary of 11,904 words, the tied embedding counted once): 25,046,784 floats, 100 MB.
 *
 *   bench_grad_reduce [workers=2] [iters=20] [floats=25046784] [comm_bytes=0 (default slot)]
 *
 * Two ways, alternately, each call preceded by a barrier:
 *   passes  buf *= w; cf_comm_allreduce_sum_f32; buf *= 1 / total   (three trips over buf)
 *   fused   cf_comm_allreduce_scaled_f32(buf, w, 1 / total)          (the scaling rides on the
 *           copies into and out of shared memory)
 * Both give the same bits (checked on every call). Reported per call: the median wall time on
 * rank 0 and the median CPU time summed over the workers (getrusage around the call: spinning in
 * the barriers counts, sleeping does not). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "corefit/par.h"

#define MAX_ITERS 1000
#define N_WAYS 2
#define MAX_WORKERS 64

typedef struct bench_ctx {
    int iters;
    size_t n;
} bench_ctx;

/* What the workers write into the results area: [way][iter] wall and CPU seconds per rank. */
typedef struct bench_out {
    double wall[N_WAYS][MAX_ITERS];
    double cpu[MAX_WORKERS][N_WAYS][MAX_ITERS];
    int mismatch;
} bench_out;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double cpu_now(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static void fill(float *buf, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) buf[i] = (float)((i + (size_t)rank * 7) % 97) * 1e-3f - 0.04f;
}

static cf_status worker(cf_comm *comm, void *vctx) {
    bench_ctx *ctx = vctx;
    size_t bytes;
    bench_out *out = cf_comm_results(comm, &bytes);
    int rank = cf_comm_rank(comm), size = cf_comm_size(comm);
    float *a = cf_malloc(ctx->n * sizeof(float)), *b = cf_malloc(ctx->n * sizeof(float));
    if (!a || !b) {
        cf_free(a);
        cf_free(b);
        return cf_fail(CF_ERR_NOMEM, "bench_grad_reduce: %zu floats", ctx->n);
    }
    /* rows of a replica: uneven, as the last batch of a split fit */
    const float w = (float)(64 - rank),
                inv = (float)(1.0 / (64.0 * size - size * (size - 1) / 2.0));
    cf_status st = CF_OK;
    for (int it = -2; it < ctx->iters && st == CF_OK; it++) {
        fill(a, ctx->n, rank);
        memcpy(b, a, ctx->n * sizeof(float));
        for (int way = 0; way < N_WAYS && st == CF_OK; way++) {
            float *buf = way == 0 ? a : b;
            st = cf_comm_barrier(comm);
            if (st != CF_OK) break;
            double t0 = cf_now(), c0 = cpu_now();
            if (way == 0) {
                for (size_t i = 0; i < ctx->n; i++) buf[i] *= w;
                st = cf_comm_allreduce_sum_f32(comm, buf, ctx->n);
                for (size_t i = 0; i < ctx->n; i++) buf[i] *= inv;
            } else {
                st = cf_comm_allreduce_scaled_f32(comm, buf, ctx->n, w, inv);
            }
            double dt = cf_now() - t0, dc = cpu_now() - c0;
            if (it >= 0) {
                if (rank == 0) out->wall[way][it] = dt;
                out->cpu[rank][way][it] = dc;
            }
        }
        if (st == CF_OK && memcmp(a, b, ctx->n * sizeof(float)) != 0) out->mismatch = 1;
    }
    cf_free(a);
    cf_free(b);
    return st;
}

int main(int argc, char **argv) {
    int workers = argc > 1 ? atoi(argv[1]) : 2;
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    size_t n = argc > 3 ? (size_t)atoll(argv[3]) : 25046784;
    size_t comm_bytes = argc > 4 ? (size_t)atoll(argv[4]) : 0;
    if (workers < 2 || workers > MAX_WORKERS || iters < 1 || iters > MAX_ITERS || n < 1) {
        fprintf(stderr, "usage: bench_grad_reduce [workers>=2] [iters<=%d] [floats] [comm_bytes]\n",
                MAX_ITERS);
        return 2;
    }
    cf_set_num_threads(1);
    bench_ctx ctx = {.iters = iters, .n = n};
    cf_launch_options opt = {.num_workers = workers,
                             .pin_cores = true,
                             .deadline_s = 600,
                             .comm_bytes = comm_bytes,
                             .results_bytes = sizeof(bench_out)};
    cf_results res;
    if (cf_launch_fork(&opt, worker, &ctx, &res) != CF_OK) {
        fprintf(stderr, "bench_grad_reduce: %s\n", cf_last_error());
        return 1;
    }
    bench_out *out = res.data;
    static const char *names[N_WAYS] = {"passes", "fused"};
    printf("workers=%d iters=%d floats=%zu (%.1f MB) comm_bytes=%zu\n", workers, iters, n,
           (double)n * 4 / 1e6, comm_bytes);
    printf("  %-7s %14s %14s %16s\n", "way", "wall_ms_med", "wall_ms_best", "cpu_ms_med(sum)");
    for (int way = 0; way < N_WAYS; way++) {
        double *t = out->wall[way];
        static double cpu[MAX_ITERS];
        for (int it = 0; it < iters; it++) {
            cpu[it] = 0;
            for (int r = 0; r < workers; r++) cpu[it] += out->cpu[r][way][it];
        }
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        qsort(cpu, (size_t)iters, sizeof *cpu, cmp_double);
        printf("  %-7s %14.2f %14.2f %16.2f\n", names[way], t[iters / 2] * 1e3, t[0] * 1e3,
               cpu[iters / 2] * 1e3);
    }
    printf("  same bits: %s\n", out->mismatch ? "NO" : "yes");
    int rc = out->mismatch ? 1 : 0;
    cf_results_release(&res);
    return rc;
}
