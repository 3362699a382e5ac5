/* The MPI communicator under a real MPI job (see par_mpi.cmake: mpirun -np 2 and 3). Every rank
 * checks every collective against values it can compute itself; integer-valued floats make the
 * sums exact whatever order MPI adds in. Exits non-zero on any failure, naming rank and check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/par.h"
#include "mpi_check.h"

static unsigned char pattern(int r, size_t i) {
    return (unsigned char)(r * 37 + i * 13 + (i >> 8));
}

int main(void) {
    cf_comm *comm = NULL;
    cf_status st = cf_comm_mpi_new(&comm);
    if (st != CF_OK) {
        fprintf(stderr, "cf_comm_mpi_new: %s\n", cf_last_error());
        return 1;
    }
    int rank = cf_comm_rank(comm), size = cf_comm_size(comm);
    CHECK(strcmp(cf_comm_kind(comm), "mpi") == 0, "kind %s", cf_comm_kind(comm));
    CHECK(size >= 1 && rank >= 0 && rank < size, "rank %d of %d", rank, size);
    /* One machine: the local rank is the rank. */
    CHECK(cf_comm_local_rank(comm) == rank && cf_comm_local_size(comm) == size,
          "local rank %d of %d", cf_comm_local_rank(comm), cf_comm_local_size(comm));
    size_t rbytes = 1;
    CHECK(cf_comm_results(comm, &rbytes) == NULL && rbytes == 0, "results area");

    static const size_t sizes[] = {1, 7, 1000, 100003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *x = malloc(n * sizeof *x), *m = malloc(n * sizeof *m);
        double *d = malloc(n * sizeof *d);
        for (size_t i = 0; i < n; i++) {
            x[i] = m[i] = (float)((i % 1000) + 1000 * rank);
            d[i] = (double)i * 0.5 + rank;
        }
        CHECK(cf_comm_allreduce_sum_f32(comm, x, n) == CF_OK, "%s", cf_last_error());
        CHECK(cf_comm_allreduce_mean_f32(comm, m, n) == CF_OK, "%s", cf_last_error());
        CHECK(cf_comm_allreduce_sum_f64(comm, d, n) == CF_OK, "%s", cf_last_error());
        double ranks_sum = (double)size * (size - 1) / 2;
        for (size_t i = 0; i < n; i++) {
            float want = (float)((double)(i % 1000) * size + 1000 * ranks_sum);
            if (x[i] != want || m[i] != want / (float)size ||
                d[i] != (double)i * 0.5 * size + ranks_sum) {
                CHECK(0, "n %zu element %zu: sum %g (want %g) mean %g f64 %g", n, i, x[i], want,
                      m[i], d[i]);
                break;
            }
        }
        free(x), free(m), free(d);
    }

    static const size_t bsizes[] = {1, 1025, 70001};
    unsigned char *buf = malloc(70001 * (size_t)size), *send = malloc(70001);
    for (int root = 0; root < size; root++)
        for (size_t k = 0; k < sizeof bsizes / sizeof bsizes[0]; k++) {
            size_t n = bsizes[k];
            for (size_t i = 0; i < n; i++) buf[i] = rank == root ? pattern(root, i) : 0xEE;
            CHECK(cf_comm_broadcast(comm, buf, n, root) == CF_OK, "%s", cf_last_error());
            for (size_t i = 0; i < n; i++)
                if (buf[i] != pattern(root, i)) {
                    CHECK(0, "broadcast from %d, %zu bytes: byte %zu", root, n, i);
                    break;
                }
            for (size_t i = 0; i < n; i++) send[i] = pattern(rank, i);
            memset(buf, 0xEE, n * (size_t)size);
            CHECK(cf_comm_gather(comm, send, n, rank == root ? buf : NULL, root) == CF_OK, "%s",
                  cf_last_error());
            if (rank == root)
                for (int r = 0; r < size; r++)
                    for (size_t i = 0; i < n; i++)
                        if (buf[(size_t)r * n + i] != pattern(r, i)) {
                            CHECK(0, "gather to %d, %zu bytes: rank %d byte %zu", root, n, r, i);
                            i = n, r = size;
                        }
        }
    free(buf), free(send);

    for (int who = -1; who < size; who++) {
        bool any = who < 0;
        CHECK(cf_comm_any(comm, rank == who, &any) == CF_OK, "%s", cf_last_error());
        CHECK(any == (who >= 0), "any with flag on rank %d gave %d", who, any);
    }
    CHECK(cf_comm_barrier(comm) == CF_OK, "%s", cf_last_error());
    /* A bad root fails on every rank and breaks the communicator. */
    float v = 0;
    CHECK(cf_comm_broadcast(comm, &v, sizeof v, size) == CF_ERR_INVALID, "bad root accepted");
    if (size > 1)
        CHECK(cf_comm_barrier(comm) != CF_OK && strstr(cf_last_error(), "earlier failure"),
              "communicator not broken after a failure");

    cf_comm_free(comm);
    if (rank == 0 && !failures) printf("mpi communicator: %d ranks ok\n", size);
    return failures ? 1 : 0;
}
