/* corefit — the command-line tool: train, lr-find, eval, predict, info. */
#include "corefit.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "Usage: corefit <command> [options]\n"
               "\n"
               "Train neural networks the fastai way, on every core.\n"
               "\n"
               "Commands:\n"
               "  train      fit a model on a data set and save it (with figures and a CSV log)\n"
               "  lr-find    run the learning-rate finder, print its suggestions, plot it\n"
               "  eval       loss and metrics of a saved model on a data set\n"
               "  predict    classes and probabilities of a saved model for images or CSV rows\n"
               "  info       what a model file holds\n"
               "\n"
               "Run 'corefit <command> --help' for a command's options. Exit status: 0 success,\n"
               "1 failure, 2 usage error, 130 stopped by Ctrl-C. See corefit(1).\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return CLI_OK;
    }
    if (strcmp(cmd, "--version") == 0 || (strcmp(cmd, "info") == 0 && argc == 2)) {
        /* with no model file, `info` describes this machine as corefit sees it */
        printf("corefit 0.1.0\nkernels: %s (best on this CPU: %s; cap with CF_ISA)\n"
               "BLAS: OpenBLAS, %s kernels\ncores: %d\n",
               cf_isa_name(cf_isa_active()), cf_isa_name(cf_isa_best()), cf_blas_core(),
               cf_available_cores());
        return CLI_OK;
    }
    if (strcmp(cmd, "train") == 0) return cmd_train(argc, argv);
    if (strcmp(cmd, "lr-find") == 0 || strcmp(cmd, "lr_find") == 0) return cmd_lr_find(argc, argv);
    if (strcmp(cmd, "eval") == 0) return cmd_eval(argc, argv);
    if (strcmp(cmd, "predict") == 0) return cmd_predict(argc, argv);
    if (strcmp(cmd, "info") == 0) return cmd_info(argc, argv);
    cli_error(CLI_USAGE, NULL, "unknown command '%s'", cmd);
    fprintf(stderr, "Commands: train, lr-find, eval, predict, info (see corefit --help)\n");
    return CLI_USAGE;
}
