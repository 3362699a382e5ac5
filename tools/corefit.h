/* Internal interface of the corefit command-line tool (the tools folder). Not installed. */
#ifndef COREFIT_TOOL_H
#define COREFIT_TOOL_H

#include <corefit.h>

#include <stdio.h>

/* Exit statuses: 0 success, 1 a failure (a file, the data, a fit), 2 a usage error, 130 stopped
 * by Ctrl-C (the shell's 128 + SIGINT, with a message, in every mode). */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2, CLI_INTERRUPTED = 130 };

/* ---- options ------------------------------------------------------------------------------- */

typedef enum opt_kind { OPT_FLAG, OPT_STR, OPT_INT, OPT_DOUBLE, OPT_U64 } opt_kind;

typedef struct cli_opt {
    const char *name; /* "--epochs" */
    opt_kind kind;
    void *dest;          /* bool*, const char**, int*, double*, uint64_t* */
    const char *metavar; /* "N" */
    const char *help;
    double min, max; /* inclusive range for numbers (min > max: no check) */
    bool seen;
} cli_opt;

/* Parses argv[first..argc) against opts (NULL-name terminated). Positional arguments go to
 * pos (up to max_pos). Returns CLI_OK, CLI_USAGE (message printed) or -1 for --help (usage
 * printed to stdout by the caller's usage function). */
int cli_parse(const char *cmd, int argc, char **argv, int first, cli_opt *opts, const char **pos,
              int max_pos, int *n_pos);
void cli_print_options(FILE *f, const cli_opt *opts);
/* "corefit <cmd>: <message>" on stderr (or cli_messages when set); returns code. */
extern FILE *cli_messages;
int cli_error(int code, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reports cf_last_error() for a failed library call; returns CLI_FAIL. */
int cli_lib_error(const char *cmd, const char *what);

/* ---- data ---------------------------------------------------------------------------------- */

typedef struct cli_data {
    const char *idx, *images, *csv;
    int size, channels, limit, bs;
    const char *cat, *cont, *target;
    bool regression;
    double valid_pct;
    uint64_t seed;
    bool eval;        /* an image folder may lack validation images */
    const char *load; /* --load auto|memory|stream (image folders) */
    bool skip_bad;    /* --skip-bad: streamed images that cannot be read are left out, counted */
    bool aug;         /* --aug: fastai's aug_transforms() on the training images */
} cli_data;

/* Column names parsed from a comma list (owned). */
typedef struct strlist {
    char **v;
    int n;
} strlist;
/* The training and validation sets named by d (IDX, image folder or CSV), --limit applied. *input
 * receives "idx", "images" or "csv". */
cf_status cli_load_data(const cli_data *d, const char **input, cf_dataset **train,
                        cf_dataset **valid);
int strlist_split(const char *s, strlist *out); /* 0 on success */
void strlist_free(strlist *l);

/* ---- model files ---------------------------------------------------------------------------- */

/* A learner for the model in `path` over a dls whose validation set is ds (taken over). */
cf_status cli_load_learner(const char *path, const cf_model_info *m, cf_dataset *ds, int bs,
                           cf_learner **learn, cf_dls **dls);

/* ---- figures ------------------------------------------------------------------------------- */

/* Draws PNG files in the terminal as sixel (libsixel through dlopen). Prints why not on
 * stderr when it cannot. */
void cli_show_figures(const char *const *paths, int n);

/* ---- subcommands --------------------------------------------------------------------------- */

int cmd_train(int argc, char **argv);
int cmd_lr_find(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_info(int argc, char **argv);
/* text models (text.c) */
int cmd_train_text(int argc, char **argv);
int cmd_predict_text(int argc, char **argv);
int cmd_generate(int argc, char **argv);
/* data sets for the other vision tasks from Fashion-MNIST (fmnist_tasks.c) */
int cmd_fmnist_tasks(int argc, char **argv);
/* Whether argv[2..) holds the option `name`; whether argv[2] is an exported text model. */
bool cli_argv_has(int argc, char **argv, const char *name);
bool cli_is_text_model(int argc, char **argv);

#endif
