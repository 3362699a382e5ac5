/* The checks of the test programs run under mpirun (mpi_fit.c, mpi_par_comm.c, mpi_resume.c; no
 * cmocka there): a failed CHECK prints the rank (a `rank` in scope where it is used), the line
 * and the message, and is counted in `failures`; the program exits non-zero when any failed. */
#ifndef CF_TEST_MPI_CHECK_H
#define CF_TEST_MPI_CHECK_H

#include <stdarg.h>
#include <stdio.h>

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

#endif
