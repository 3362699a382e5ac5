/* corefit — the command-line tool: train, lr-find, eval, predict, info. */
#include "corefit.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* OpenBLAS starts its own thread pool when the library loads, before any constructor of ours can
 * hold it to one thread, and each of those threads maps a work buffer (128 MiB in Debian's build)
 * at once: under an address-space limit too small for it the thread retries the mapping for
 * ever, at full CPU, and the process then never exits (OpenBLAS joins its threads at exit).
 * corefit never uses those threads (every BLAS call runs on one thread), so the tool runs with
 * OPENBLAS_NUM_THREADS=1. Set in the environment OpenBLAS reads when it loads: an entry in
 * .preinit_array runs before any shared library is initialised, but setenv there is undone when
 * the C library initialises its environment from the original array. So a value the user set is
 * replaced in that array, and when there is none the tool starts itself again with one (one
 * exec, before anything else has run). main puts the user's environment back, so that the
 * processes corefit starts see it as it was. */
#define CF_OPENBLAS_ONE "OPENBLAS_NUM_THREADS=1"
#define CF_OPENBLAS_ADDED "COREFIT_ADDED_OPENBLAS_NUM_THREADS=1"
static char *user_openblas_threads; /* the user's "OPENBLAS_NUM_THREADS=..." entry, if replaced */

static void hold_openblas_to_one_thread(int argc, char **argv, char **envp) {
    (void)argc;
    static const char name[] = "OPENBLAS_NUM_THREADS=";
    size_t n = 0;
    for (; envp && envp[n]; n++) {
        if (strncmp(envp[n], name, sizeof name - 1) != 0) continue;
        if (strcmp(envp[n], CF_OPENBLAS_ONE) != 0) {
            user_openblas_threads = envp[n];
            envp[n] = CF_OPENBLAS_ONE;
        }
        return;
    }
    /* valgrind would run the new image without its instrumentation */
    for (size_t i = 0; i < n; i++)
        if (strncmp(envp[i], "LD_PRELOAD=", 11) == 0 && strstr(envp[i], "vgpreload")) return;
    /* the program's own path, not /proc/self/exe, which would rename the process "exe" */
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || len >= (ssize_t)sizeof self - 1) return; /* no /proc: OpenBLAS's threads */
    self[len] = '\0';
    char *env[n + 3];
    memcpy(env, envp, n * sizeof *env);
    env[n] = CF_OPENBLAS_ONE;
    env[n + 1] = CF_OPENBLAS_ADDED;
    env[n + 2] = NULL;
    execve(self, argv, env); /* returns only on failure (the file replaced or removed: run on) */
}
__attribute__((section(".preinit_array"), used)) static void (*const cf_preinit_openblas)(
    int, char **, char **) = hold_openblas_to_one_thread;

static void restore_openblas_threads(void) {
    if (user_openblas_threads) {
        putenv(user_openblas_threads);
    } else if (getenv("COREFIT_ADDED_OPENBLAS_NUM_THREADS")) {
        unsetenv("OPENBLAS_NUM_THREADS");
        unsetenv("COREFIT_ADDED_OPENBLAS_NUM_THREADS");
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "Usage: corefit <command> [options]\n"
            "\n"
            "Train neural networks the fastai way, on every core.\n"
            "\n"
            "Commands:\n"
            "  train      fit a model on a data set and save it (with figures and a CSV log)\n"
            "  lr-find    run the learning-rate finder, print its suggestions, plot it\n"
            "  eval       loss and metrics of a saved model on a data set\n"
            "  predict    classes and probabilities of a saved model for images, CSV rows or text\n"
            "  generate   text from a language model (train --text --lm) and a prompt\n"
            "  info       what a model file holds\n"
            "  fmnist-tasks  multi-label or point data sets made from Fashion-MNIST\n"
            "\n"
            "Run 'corefit <command> --help' for a command's options. Exit status: 0 success,\n"
            "1 failure, 2 usage error, 130 stopped by Ctrl-C. See corefit(1).\n");
}

int main(int argc, char **argv) {
    restore_openblas_threads();
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
    if (strcmp(cmd, "generate") == 0) return cmd_generate(argc, argv);
    if (strcmp(cmd, "fmnist-tasks") == 0) return cmd_fmnist_tasks(argc, argv);
    cli_error(CLI_USAGE, NULL, "unknown command '%s'", cmd);
    fprintf(stderr,
            "Commands: train, lr-find, eval, predict, generate, info (see corefit --help)\n");
    return CLI_USAGE;
}
