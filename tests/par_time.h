/* Wall-clock bounds in the par tests. A bound is a liveness check ("the fault was reported, not
 * hung on"), so it is stretched by how slow this machine is right now: CF_TEST_TIME_SCALE (set
 * under valgrind) times the load per core (ctest -j, other jobs on a shared machine), so that a
 * bound that holds on an idle machine also holds on a busy one. */
#ifndef CF_TEST_PAR_TIME_H
#define CF_TEST_PAR_TIME_H

#include <stdlib.h>

#include "corefit/core.h"
#include "oracle.h"

static inline double par_time_scale(void) {
    double load = 0;
    int cores = cf_available_cores();
    double per_core = getloadavg(&load, 1) == 1 && cores > 0 ? load / cores : 1.0;
    return test_time_scale() * (per_core > 1.0 ? per_core : 1.0);
}

#endif
