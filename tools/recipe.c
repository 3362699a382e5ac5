/* corefit train --recipe NAME: a named set of options, each taken only where the command line
 * does not give that option itself.
 *
 * fast: the shortest time to 92% on Fashion-MNIST's test set with the mini-resnet, the airbench
 * habit (docs/cli.md and bench/README.md, "Time to accuracy"): fit_one_cycle for 4 epochs,
 * batches of 128 per core with the learning rate scaled with them (3e-3 at 64 -> 6e-3),
 * fastai's LabelSmoothingCrossEntropy(0.1), and no periodic checkpoint (the run is short; SIGTERM
 * still writes one). fp32: on W1, --bf16 is not yet faster than fp32 (its convolutions take
 * im2col and a bf16 GEMM where fp32 has implicit and Winograd kernels), so the recipe leaves it
 * to the command line until it is. */
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
    if (!given(opts, "--epochs")) a->epochs = 4;
    if (!given(opts, "--bs")) a->data.bs = 128;
    /* the learning rate scales with the batch per core (3e-3 at 64, W1's recipe) */
    static char lr[32];
    if (!given(opts, "--lr")) {
        snprintf(lr, sizeof lr, "%g", 3e-3 * a->data.bs / 64);
        a->lr = lr;
    }
    if (!given(opts, "--label-smoothing")) a->label_smoothing = 0.1;
    if (!given(opts, "--checkpoint-every")) a->checkpoint_every = 0;
    return CLI_OK;
}
