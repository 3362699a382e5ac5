/* corefit train --recipe NAME: a named set of options, each taken only where the command line
 * does not give that option itself.
 *
 * fast: the shortest time to 92% mean test accuracy on Fashion-MNIST, the airbench habit
 * (docs/cli.md and bench/README.md, "Time to accuracy"): a model that learns more per
 * CPU-second than the mini-resnet, the fast-cnn (three conv-BatchNorm-ReLU-maxpool groups of
 * 24, 48 and 96 channels, pooled early so the costly convolutions run at 14 and 7 px),
 * fit_one_cycle for 4 epochs, batches of 64 per core with a high learning rate, 1e-2 (scaled
 * with --bs: 1e-2 * bs / 64), fastai's LabelSmoothingCrossEntropy(0.1), horizontal flips of the
 * training images (--flip, unless --aug) and flip test-time augmentation of the validation
 * images (--tta, for IDX data), and no periodic checkpoint (the run is short; SIGTERM still
 * writes one). Measured on 2 cores: 0.9216 mean flip-TTA test accuracy over seeds 1-5
 * (0.9200-0.9227); 3 epochs without flips, the variant nearest 30 s, reach 0.9190. fp32: --bf16
 * is not faster on these small convolutions (im2col and a bf16 GEMM where fp32 has implicit and
 * Winograd kernels), so the recipe leaves it to the command line. The flags it sets (--flip,
 * --tta) cannot be taken back on the command line: spell the options out instead. */
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
    if (!given(opts, "--bs")) a->data.bs = 64;
    /* the learning rate scales with the batch per core (1e-2 at 64) */
    static char lr[32];
    if (!given(opts, "--lr")) {
        snprintf(lr, sizeof lr, "%g", 1e-2 * a->data.bs / 64);
        a->lr = lr;
    }
    if (!given(opts, "--label-smoothing")) a->label_smoothing = 0.1;
    if (!given(opts, "--checkpoint-every")) a->checkpoint_every = 0;
    if (!a->data.aug && !a->data.csv) a->data.flip = true;
    if (a->data.idx || (!a->data.images && !a->data.images_csv && !a->data.csv)) a->tta = true;
    return CLI_OK;
}
