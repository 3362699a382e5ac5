/* All-reduce speed: cf_comm_allreduce_sum_f32 of 100k and 1M floats.
 *
 *   bench_allreduce [workers=2] [iters=300] [comm_bytes=0 (default slot)]
 *       shared memory, workers forked by cf_launch_fork
 *   mpirun --allow-run-as-root --oversubscribe -np 2 bench_allreduce mpi [iters]
 *       the same loop over the MPI communicator (Open MPI), for comparison
 *
 * Each timed call is preceded by a barrier so ranks start together; rank 0's times are
 * reported: median and best, algorithm bandwidth (bytes / time) and bus bandwidth
 * (2 (n-1) / n * bytes / time, the bytes each rank must move in a ring all-reduce). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/par.h"

#define MAX_ITERS 10000
static const size_t sizes[] = {100000, 1000000};

typedef struct bench_ctx {
    int iters;
} bench_ctx;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times `iters` all-reduces of each size; rank 0 writes the times into out. */
static cf_status bench_loop(cf_comm *comm, int iters, double *out) {
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *buf = cf_malloc(n * sizeof(float));
        if (!buf) return CF_ERR_NOMEM;
        for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 97) * 1e-3f;
        cf_status st = CF_OK;
        for (int it = -20; it < iters && st == CF_OK; it++) {
            st = cf_comm_barrier(comm);
            double t0 = cf_now();
            if (st == CF_OK) st = cf_comm_allreduce_sum_f32(comm, buf, n);
            double dt = cf_now() - t0;
            if (it >= 0 && cf_comm_rank(comm) == 0) out[k * MAX_ITERS + (size_t)it] = dt;
            /* Keep values bounded. */
            if ((it & 15) == 0)
                for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 97) * 1e-3f;
        }
        cf_free(buf);
        if (st != CF_OK) return st;
    }
    return CF_OK;
}

static cf_status worker(cf_comm *comm, void *vctx) {
    bench_ctx *ctx = vctx;
    size_t bytes;
    double *out = cf_comm_results(comm, &bytes);
    return bench_loop(comm, ctx->iters, out);
}

static void report(const char *kind, int world, int iters, double *times) {
    printf("%-4s workers=%d iters=%d\n", kind, world, iters);
    printf("  %10s %12s %12s %12s %12s\n", "floats", "median_ms", "best_ms", "algo_GB/s",
           "bus_GB/s");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        double *t = times + k * MAX_ITERS;
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        double med = t[iters / 2], best = t[0];
        double bytes = (double)sizes[k] * sizeof(float);
        double algo = bytes / med * 1e-9;
        double bus = world > 1 ? algo * 2.0 * (world - 1) / world : 0;
        printf("  %10zu %12.4f %12.4f %12.2f %12.2f\n", sizes[k], med * 1e3, best * 1e3, algo, bus);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "mpi") == 0) {
        int iters = argc > 2 ? atoi(argv[2]) : 300;
        if (iters < 1 || iters > MAX_ITERS) iters = 300;
        cf_comm *comm;
        if (cf_comm_mpi_new(&comm) != CF_OK) {
            fprintf(stderr, "%s\n", cf_last_error());
            return 1;
        }
        cf_set_num_threads(1);
        double *times = calloc(2 * MAX_ITERS, sizeof(double));
        cf_status st = bench_loop(comm, iters, times);
        if (st != CF_OK)
            fprintf(stderr, "rank %d: %s\n", cf_comm_rank(comm), cf_last_error());
        else if (cf_comm_rank(comm) == 0)
            report("mpi", cf_comm_size(comm), iters, times);
        free(times);
        cf_comm_free(comm);
        return st == CF_OK ? 0 : 1;
    }
    int workers = argc > 1 ? atoi(argv[1]) : 2;
    int iters = argc > 2 ? atoi(argv[2]) : 300;
    size_t comm_bytes = argc > 3 ? (size_t)atoll(argv[3]) : 0;
    if (workers < 1) workers = 2;
    if (iters < 1 || iters > MAX_ITERS) iters = 300;
    bench_ctx ctx = {.iters = iters};
    cf_launch_options opt = {.num_workers = workers,
                             .pin_cores = true,
                             .comm_bytes = comm_bytes,
                             .results_bytes = 2 * MAX_ITERS * sizeof(double)};
    cf_results res;
    if (cf_launch_fork(&opt, worker, &ctx, &res) != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        return 1;
    }
    report("shm", workers, iters, res.data);
    cf_results_release(&res);
    return 0;
}
