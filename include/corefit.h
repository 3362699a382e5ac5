/* corefit — fastai-style neural network training in C, on every core.
 *
 * The umbrella header: include this and use the cf_ API. Each layer has its own header under
 * corefit/, documented in place. */
#ifndef COREFIT_H
#define COREFIT_H

#include "corefit/core.h"
#include "corefit/tensor.h"
#include "corefit/nn.h"

#endif
