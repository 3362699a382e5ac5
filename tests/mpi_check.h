/* The checks of the test programs run under mpirun (mpi_fit.c, mpi_par_comm.c, mpi_resume.c,
 * mpi_text.c; no cmocka there): a failed CHECK prints the rank (a `rank` in scope where it is
 * used), the line and the message, and is counted in `failures`; the program exits non-zero when
 * any failed. */
#ifndef CF_TEST_MPI_CHECK_H
#define CF_TEST_MPI_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/par.h"

static int failures;

__attribute__((format(printf, 3, 4))) static inline void check_failed(int rank, int line,
                                                                      const char *fmt, ...) {
    fprintf(stderr, "rank %d: line %d: ", rank, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    failures++;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) check_failed(rank, __LINE__, __VA_ARGS__);                                    \
    } while (0)

/* CHECKs that every rank holds the same bytes as rank 0 (rank 0's, broadcast); a failure names
 * the caller's line. */
#define check_same_everywhere(comm, what, data, bytes)                                             \
    check_same_everywhere_at(comm, __LINE__, what, data, bytes)

static inline void check_same_everywhere_at(cf_comm *comm, int line, const char *what,
                                            const void *data, size_t bytes) {
    const int me = cf_comm_rank(comm);
    unsigned char *mine = malloc(bytes + 1);
    memcpy(mine, data, bytes);
    if (cf_comm_broadcast(comm, mine, bytes, 0) != CF_OK)
        check_failed(me, line, "the broadcast of %s: %s", what, cf_last_error());
    if (memcmp(mine, data, bytes) != 0) check_failed(me, line, "%s differs from rank 0's", what);
    free(mine);
}

#endif
