/* The thread pool's internal controls (core/threads.c), for tests and benchmarks: how its
 * threads wait between jobs, and its counters. */
#ifndef COREFIT_CORE_POOL_H
#define COREFIT_CORE_POOL_H

#include <stdbool.h>
#include <stdint.h>

/* Whether the machine has more runnable threads than CPUs right now (/proc/loadavg's instant
 * count, read at most every 20 ms; false where it cannot be read): spinning waits then take CPU
 * time from the threads they wait for, so they should back off. */
bool cf__machine_crowded(void);

/* How long a pool thread spins before it blocks, waiting for the next job or for the other
 * threads' parts: ns < 0 restores the adaptive default, 0 blocks at once (no spin), ns > 0 spins
 * a fixed ns nanoseconds. Only the waiting changes, never the work split or the results. */
void cf__pool_set_spin(double ns);

typedef struct cf__pool_stats {
    uint64_t jobs;            /* jobs dispatched to the pool since the process started */
    uint64_t worker_sleeps;   /* times a worker blocked after its spin ran out */
    uint64_t caller_sleeps;   /* times the caller blocked waiting for the workers */
    uint64_t preempted_spins; /* spins that found their thread descheduled (they back off) */
} cf__pool_stats;

/* CF_TIMING=1 in the environment: the pool, the fork workers and their supervisor report on
 * stderr where time went (bench/scaling.py reads it). */
bool cf__timing_requested(void);

/* The counters (process-wide, monotonic; CF_TIMING=1 prints them at exit). */
cf__pool_stats cf__pool_get_stats(void);

#endif
