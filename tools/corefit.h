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
    /* photos (photo.c): images listed in a CSV, labels from file names, fastai's Resize */
    const char *images_csv, *fn_col, *label_col, *valid_col, *folder, *suffix, *label_re;
    const char *resize, *pad_mode;
    double rrc_min_scale; /* --random-resized-crop MIN_SCALE (0: none) */
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

/* ---- photos (photo.c) ------------------------------------------------------------------------ */

/* The image-source and resize options of train and lr-find, for an opts table over a struct
 * holding a cli_data `data`. */
#define PHOTO_OPTIONS(a)                                                                           \
    {"--images-csv",                                                                               \
     OPT_STR,                                                                                      \
     &(a).data.images_csv,                                                                         \
     "FILE",                                                                                       \
     "images listed in a CSV with a header (fastai's from_csv): file and label columns",           \
     0,                                                                                            \
     0,                                                                                            \
     0},                                                                                           \
        {"--fn-col",                                                                               \
         OPT_STR,                                                                                  \
         &(a).data.fn_col,                                                                         \
         "NAME",                                                                                   \
         "--images-csv: the file-name column [the first]",                                         \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--label-col",                                                                            \
         OPT_STR,                                                                                  \
         &(a).data.label_col,                                                                      \
         "NAME",                                                                                   \
         "--images-csv: the label column [the second]",                                            \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--valid-col",                                                                            \
         OPT_STR,                                                                                  \
         &(a).data.valid_col,                                                                      \
         "NAME",                                                                                   \
         "--images-csv: a column of booleans marking validation rows, e.g. is_valid [none: "       \
         "--valid-pct at random]",                                                                 \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--folder",                                                                               \
         OPT_STR,                                                                                  \
         &(a).data.folder,                                                                         \
         "DIR",                                                                                    \
         "--images-csv: the folder the file names are in, relative to the CSV's [its own]",        \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--suffix",                                                                               \
         OPT_STR,                                                                                  \
         &(a).data.suffix,                                                                         \
         "EXT",                                                                                    \
         "--images-csv: appended to every file name, e.g. .jpg [none]",                            \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--label-re",                                                                             \
         OPT_STR,                                                                                  \
         &(a).data.label_re,                                                                       \
         "REGEX",                                                                                  \
         "--images DIR: label each image file under DIR by the first group of this POSIX "         \
         "extended regular expression on its name (fastai's from_name_re), split by --valid-pct",  \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--resize",                                                                               \
         OPT_STR,                                                                                  \
         &(a).data.resize,                                                                         \
         "METHOD",                                                                                 \
         "fastai's Resize(--size, METHOD): crop (fastai's default; random in training, centred "   \
         "in validation), pad or squish [none: every image squished to --size, as eval and "       \
         "predict do]",                                                                            \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--pad-mode",                                                                             \
         OPT_STR,                                                                                  \
         &(a).data.pad_mode,                                                                       \
         "MODE",                                                                                   \
         "--resize pad: reflection, zeros or border [reflection]",                                 \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
    {                                                                                              \
        "--random-resized-crop", OPT_DOUBLE, &(a).data.rrc_min_scale, "MIN_SCALE",                 \
            "fastai's RandomResizedCrop(--size, min_scale) instead of --resize (fastai's "         \
            "min_scale: 0.08)",                                                                    \
            0.01, 1, 0                                                                             \
    }

/* Checks the photo options against the rest (a usage error printed and returned). */
int cli_check_photo_args(const char *cmd, const cli_data *d);
/* The item transform the options ask for (false: none). */
bool cli_photo_item_tfm(const cli_data *d, int size, cf_item_tfm *out);
/* ", Resize(64, crop)", ", RandomResizedCrop(64, min_scale 0.35)" or ", squished to 64 x 64":
 * how the options size the images, for the data line. */
void cli_photo_describe(const cli_data *d, int size, char *buf, size_t n);
/* The training and validation sets of --images-csv, or of --images with --label-re. */
cf_status cli_load_photos(const cli_data *d, const cf_image_folder_options *o, cf_dataset **train,
                          cf_dataset **valid);
/* --pretrained FILE: 0 in *resnet_depth for a corefit model, else the depth of the torchvision
 * or timm ResNet it holds; a usage error saying what to do for any other file. */
int cli_pretrained_kind(const char *cmd, const char *path, const char *arch, int *resnet_depth);

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
/* Whether argv[2..) holds the option `name`; whether argv[2] is an exported text model. */
bool cli_argv_has(int argc, char **argv, const char *name);
bool cli_is_text_model(int argc, char **argv);

#endif
