/* corefit train --recipe NAME: a named set of options, each taken only where the command line
 * does not give that option itself.
 *
 * fast: the shortest time to 92% mean test accuracy on Fashion-MNIST, the airbench habit
 * (docs/cli.md and bench/README.md, "Time to accuracy"): a model that learns more per
 * CPU-second than the mini-resnet, the fast-cnn (three groups conv-maxpool-BatchNorm-ReLU of 24,
 * 48 and 96 channels, pooled early so the costly convolutions run at 14 and 7 px);
 * fit_one_cycle for 4 epochs of which the first, the warm-up, trains on the images at half size
 * (--small-epochs 1, fastai's progressive resizing: about half an epoch's CPU time; not for
 * tables or masks); batches of
 * 64 per core with a high learning rate, 1e-2 (scaled with --bs: 1e-2 * bs / 64); fastai's
 * LabelSmoothingCrossEntropy(0.1); bf16 (--bf16, fastai's to_fp16: the convolutions' products in
 * bfloat16 where the CPU has it, a fifth less CPU time a step at the same accuracy; fp32
 * elsewhere); validation only after the last epoch (--valid-every 4) and no periodic checkpoint
 * (the run is short; SIGTERM still writes one). No flips: in so short a fit flip augmentation
 * costs more accuracy than flip TTA wins back. Measured on 2 cores of a Zen 4: about half the
 * CPU time of the former recipe (4 full fp32 epochs with flips and flip TTA) for the same
 * accuracy; the figures are in bench/README.md. The flag it sets (--bf16) cannot be taken back
 * on the command line: spell the options out instead. */
#include "train.h"

#include <stdio.h>
#include <string.h>

/* Was option `name` given on the command line? */
static bool given(const cli_opt *opts, const char *name) {
    for (const cli_opt *o = opts; o->name; o++)
        if (strcmp(o->name, name) == 0) return o->seen;
    return false;
}

int cli_apply_recipe(const char *cmd, train_args *a, const cli_opt *opts) {
    if (!a->recipe) return CLI_OK;
    if (strcmp(a->recipe, "fast") != 0)
        return cli_error(CLI_USAGE, cmd, "unknown --recipe '%s' (choose fast)", a->recipe);
    if (!given(opts, "--arch")) a->arch = "fast-cnn";
    if (!given(opts, "--epochs")) a->epochs = 4;
    if (!given(opts, "--small-epochs") && !a->data.csv && !a->data.seg.masks) a->small_epochs = 1;
    if (!given(opts, "--bs")) a->data.bs = 64;
    /* the learning rate scales with the batch per core (1e-2 at 64) */
    static char lr[32];
    if (!given(opts, "--lr")) {
        snprintf(lr, sizeof lr, "%g", 1e-2 * a->data.bs / 64);
        a->lr = lr;
    }
    if (!given(opts, "--label-smoothing")) a->label_smoothing = 0.1;
    if (!given(opts, "--checkpoint-every")) a->checkpoint_every = 0;
    if (!given(opts, "--valid-every")) a->valid_every = a->tta ? 0 : a->epochs; /* at the end */
    a->bf16 = true;
    return CLI_OK;
}
