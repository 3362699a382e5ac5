/* corefit — fastai-style neural network training in C, on every core.
 *
 * The umbrella header: include this and use the cf_ API. Each layer has its own header under
 * corefit/, documented in place:
 *   core    status codes, errors, RNG, arenas, threads
 *   tensor  tensors and CPU kernels
 *   nn      modules, layers, containers, models, losses, the model zoo
 *   optim   SGD and fastai's Adam over flat parameter blocks
 *   io      safetensors model files
 *   data    datasets, DataLoaders, transforms, sharding
 *   learn   the Learner, callbacks, schedules, fit methods, metrics, the Recorder
 *   par     the cf_par_ twins: every core (fork) or many machines (MPI)
 *   plot    PNG figures of the Recorder, lr_find and predictions */
#ifndef COREFIT_H
#define COREFIT_H

#include "corefit/core.h"
#include "corefit/tensor.h"
#include "corefit/nn.h"
#include "corefit/optim.h"
#include "corefit/io.h"
#include "corefit/data.h"
#include "corefit/learn.h"
#include "corefit/par.h"
#include "corefit/plot.h"

#endif
