/* Internal interface of the corefit command-line tool (the tools folder). Not installed. */
#ifndef COREFIT_TOOL_H
#define COREFIT_TOOL_H

#include <corefit.h>

#include <stdio.h>

/* Exit statuses: 0 success, 1 a failure (a file, the data, a fit), 2 a usage error. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

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
    bool eval; /* an image folder may lack validation images */
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

#define CLI_MAX_NORM 4

/* What a corefit model file says about how to rebuild the model and feed it. Stored as
 * safetensors __metadata__ under "corefit.*" keys (see docs/cli.md). */
typedef struct cli_meta {
    char arch[32];  /* mini-resnet, simple-cnn, xresnet18/34/50, tabular */
    char input[16]; /* idx, images, csv */
    int n_in;       /* image channels, or tabular features (n_cat + n_cont) */
    int height, width;
    int n_out;
    char **vocab; /* n_vocab class names (classifiers) */
    int n_vocab;
    int n_norm; /* image normalisation */
    float mean[CLI_MAX_NORM], std[CLI_MAX_NORM];
    /* tabular */
    char *target;
    bool regression;
    int n_cat, n_cont;
    char **feature_names; /* n_cat + n_cont */
    char ***cat_vocab;    /* per categorical feature */
    int *cat_cardinality; /* per categorical feature */
    char **flag_of;       /* per categorical feature: the continuous column of a _na flag */
    float *cont_mean, *cont_std, *cont_fill;
    int n_layers;
    int layers[CF_TABULAR_MAX_LAYERS];
} cli_meta;

void cli_meta_free(cli_meta *m);
/* Fills meta from a training set (and the arch / normalisation used). */
cf_status cli_meta_from_dataset(cli_meta *m, const cf_dataset *ds, const char *arch,
                                const char *input, int n_out, int n_norm, const float *mean,
                                const float *std);
/* Writes the model with its metadata (the tensors are exactly cf_learner_export's). */
cf_status cli_model_write(const cf_model *model, const cli_meta *meta, const char *path);
/* Reads the metadata of a corefit model file. */
cf_status cli_meta_read(const char *path, cli_meta *m);
cf_status cli_meta_from_file(const cf_st_file *f, const char *path, cli_meta *m);

/* Encodes CSV rows with a saved tabular spec (Categorify, FillMissing, Normalize as trained).
 * With need_target the target column must be present (eval). */
cf_status cli_tabular_encode(const cli_meta *m, const cf_csv_table *t, bool need_target,
                             cf_dataset **out);
/* A learner for the model in `path` over a dls whose validation set is ds (taken over). */
cf_status cli_load_learner(const char *path, const cli_meta *m, cf_dataset *ds, int bs,
                           cf_learner **learn, cf_dls **dls);

/* ---- figures ------------------------------------------------------------------------------- */

/* Draws PNG files in the terminal as sixel (libsixel through dlopen). Prints why not on
 * stderr when it cannot. */
void cli_show_figures(const char *const *paths, int n);

/* Fashion-MNIST's class names (for an IDX folder named like it). */
extern const char *const cli_fmnist_classes[10];

/* ---- subcommands --------------------------------------------------------------------------- */

int cmd_train(int argc, char **argv);
int cmd_lr_find(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_info(int argc, char **argv);

#endif
