/* The optimizers' internal controls (optim/optim.c), for tests and benchmarks. */
#ifndef COREFIT_OPTIM_INTERNAL_H
#define COREFIT_OPTIM_INTERNAL_H

#include <stdint.h>

/* Models with at least n weights are stepped over the thread pool (the update is element-wise,
 * so the split never changes a result); n < 0 restores the default. */
void cf__opt_set_parallel_min(int64_t n);

#endif
