/* Internal interface of the corefit command-line tool (the tools folder). Not installed. */
#ifndef COREFIT_TOOL_H
#define COREFIT_TOOL_H

#include <corefit.h>

#include <signal.h>
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
/* A command's usage text (its options printed by cli_print_options). */
typedef void (*cli_usage_fn)(FILE *f, const cli_opt *opts);
/* cli_parse from argv[2]; for --help prints usage to stdout, sets *help and returns CLI_OK. */
int cli_parse_or_usage(const char *cmd, int argc, char **argv, cli_opt *opts, const char **pos,
                       int max_pos, int *n_pos, cli_usage_fn usage, bool *help);
/* "corefit <cmd>: <message>" on stderr (or cli_messages when set); returns code. */
extern FILE *cli_messages;
int cli_error(int code, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reports cf_last_error() for a failed library call; returns CLI_FAIL. */
int cli_lib_error(const char *cmd, const char *what);

/* ---- data (data.c) ------------------------------------------------------------------------ */

#ifndef CF_FASHION_MNIST_DEFAULT_DIR
#define CF_FASHION_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#endif

/* Images listed in a CSV and their targets (tasks.c). */
typedef struct cli_task_data {
    const char *label_delim, *x_col, *y_col;
    bool multi_label, points;
} cli_task_data;

/* Segmentation masks found from each image's name (seg.c). */
typedef struct cli_seg_data {
    bool masks;
    const char *mask_dir, *mask_suffix, *codes;
    bool self_attention, blur; /* DynamicUnet's options (train, lr-find) */
} cli_seg_data;

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
    bool quiet;       /* another process says what the data loading found (MPI ranks but 0) */
    /* photos (photo.c): images listed in a CSV, labels from file names, fastai's Resize */
    const char *images_csv, *fn_col, *label_col, *valid_col, *folder, *suffix, *label_re;
    const char *resize, *pad_mode;
    double rrc_min_scale;         /* --random-resized-crop MIN_SCALE (0: none) */
    const cf_item_tfm *model_tfm; /* eval: the model's recorded item transform (photo.c) */
    cli_task_data task;           /* --images-csv's targets: label sets, points (tasks.c) */
    cli_seg_data seg;             /* --masks: segmentation masks beside --images (seg.c) */
    bool flip;                    /* --flip: fastai's Flip(p=0.5) alone on the training images */
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
/* Usage errors of the data options (one source, the columns of --csv, --load, --skip-bad,
 * --aug, --channels, the photo and task options; metrics: --metrics or NULL). */
int cli_check_data_args(const char *cmd, const cli_data *d, const char *metrics);
/* Whether path names an existing file or folder. */
bool cli_exists(const char *path);
int strlist_split(const char *s, strlist *out); /* 0 on success */
void strlist_free(strlist *l);

/* ---- other vision tasks (tasks.c) --------------------------------------------------------- */

/* The entries of --images-csv and its columns (photo.c reads them; d: a cli_data). */
#define CLI_IMAGES_CSV_OPTIONS(d)                                                                  \
    {"--images-csv",                                                                               \
     OPT_STR,                                                                                      \
     &(d).images_csv,                                                                              \
     "FILE",                                                                                       \
     "images listed in a CSV with a header (fastai's from_csv): file and label columns",           \
     0,                                                                                            \
     0,                                                                                            \
     0},                                                                                           \
        {"--fn-col",                                                                               \
         OPT_STR,                                                                                  \
         &(d).fn_col,                                                                              \
         "NAME",                                                                                   \
         "--images-csv: the file-name column [the first]",                                         \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--label-col",                                                                            \
         OPT_STR,                                                                                  \
         &(d).label_col,                                                                           \
         "NAME",                                                                                   \
         "--images-csv: the label column [the second]",                                            \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--valid-col",                                                                            \
         OPT_STR,                                                                                  \
         &(d).valid_col,                                                                           \
         "NAME",                                                                                   \
         "--images-csv: a column of booleans marking validation rows, e.g. is_valid [none: "       \
         "--valid-pct at random]",                                                                 \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--folder",                                                                               \
         OPT_STR,                                                                                  \
         &(d).folder,                                                                              \
         "DIR",                                                                                    \
         "--images-csv: the folder the file names are in, relative to the CSV's [its own]",        \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
    {                                                                                              \
        "--suffix", OPT_STR, &(d).suffix, "EXT",                                                   \
            "--images-csv: appended to every file name, e.g. .jpg [none]", 0, 0, 0                 \
    }

/* The option-table entries of --images-csv's targets (d: a cli_data). */
#define CLI_TASK_OPTIONS(d)                                                                        \
    {"--multi-label",                                                                              \
     OPT_FLAG,                                                                                     \
     &(d).task.multi_label,                                                                        \
     NULL,                                                                                         \
     "--images-csv: label sets (BCE, accuracy_multi)",                                             \
     0,                                                                                            \
     0,                                                                                            \
     0},                                                                                           \
        {"--label-delim",                                                                          \
         OPT_STR,                                                                                  \
         &(d).task.label_delim,                                                                    \
         "STR",                                                                                    \
         "--multi-label: the labels' separator [' ']",                                             \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--points",                                                                               \
         OPT_FLAG,                                                                                 \
         &(d).task.points,                                                                         \
         NULL,                                                                                     \
         "--images-csv: one point per image, in pixels (MSE, y_range -1..1)",                      \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--x-col", OPT_STR, &(d).task.x_col, "NAME", "--points: x column [x]", 0, 0, 0}, {        \
        "--y-col", OPT_STR, &(d).task.y_col, "NAME", "--points: y column [y]", 0, 0, 0             \
    }
/* Usage errors of the task options (metrics: --metrics or NULL). */
int cli_task_check(const char *cmd, const cli_data *d, const char *metrics);
/* Whether d names an --images-csv of label sets, points or values (cli_task_load reads it). */
bool cli_task_data_set(const cli_data *d);
/* The training and validation sets of --images-csv with --multi-label, --points or
 * --regression (single labels: photo.c). */
cf_status cli_task_load(const cli_data *d, const char **input, cf_dataset **train,
                        cf_dataset **valid);
/* Multi-label metrics (accuracy_multi by default); false when the data are not multi-label. */
bool cli_task_metrics(const char *cmd, const cli_data *d, const char *list, int n_classes,
                      cf_metric ***out, int *n, int *rc);
/* The y_range of points (-1, 1) or of an image regression (the targets' range + 5%). */
bool cli_task_y_range(const cli_data *d, const cf_dataset *train, float *lo, float *hi);
/* eval: a multi-label set's columns put in the model's class order (by name; a class the model
 * lacks is an error) and the model's class names taken. */
cf_status cli_task_adopt_model(cf_dataset *ds, const cf_model_info *m);
/* Prints a multi-label or point model's prediction for one image (to a JSON array when
 * json_array is not NULL); false for other models. */
bool cli_task_print(const cf_learner *learn, const cf_model_info *m, const char *input,
                    const float *row, void *json_array);
/* One field of predict's tab-separated output, with \\, \t, \n and \r escaped so that every
 * input stays one line (eval_predict.c). */
void cli_print_tsv_field(const char *s);

/* ---- segmentation (seg.c) ------------------------------------------------------------------- */

/* The option-table entries of --masks (d: a cli_data). */
#define CLI_SEG_OPTIONS(d)                                                                         \
    {"--masks",                                                                                    \
     OPT_FLAG,                                                                                     \
     &(d).seg.masks,                                                                               \
     NULL,                                                                                         \
     "segmentation: --images is a folder of images, each with a mask (pixel = class id) found "    \
     "by --mask-dir and --mask-suffix (fastai's SegmentationDataLoaders.from_label_func); a "      \
     "U-Net (unet_learner) with CrossEntropyLossFlat over pixels",                                 \
     0,                                                                                            \
     0,                                                                                            \
     0},                                                                                           \
        {"--mask-dir",                                                                             \
         OPT_STR,                                                                                  \
         &(d).seg.mask_dir,                                                                        \
         "DIR",                                                                                    \
         "--masks: the masks' folder; a relative DIR is beside the --images folder (fastai's "     \
         "path/'labels') [labels]",                                                                \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
        {"--mask-suffix",                                                                          \
         OPT_STR,                                                                                  \
         &(d).seg.mask_suffix,                                                                     \
         "STR",                                                                                    \
         "--masks: an image's mask is DIR/<image stem>STR; without an extension in STR the "       \
         "image's own is appended (fastai's f'{o.stem}_P{o.suffix}') [_P]",                        \
         0,                                                                                        \
         0,                                                                                        \
         0},                                                                                       \
    {                                                                                              \
        "--codes", OPT_STR, &(d).seg.codes, "FILE",                                                \
            "--masks: the class names, one a line, class id = line (fastai's codes) [codes.txt "   \
            "beside the --images folder]",                                                         \
            0, 0, 0                                                                                \
    }
/* The option-table entries of the U-Net's own options (train, lr-find; d: a cli_data). */
#define CLI_SEG_MODEL_OPTIONS(d)                                                                   \
    {"--self-attention",                                                                           \
     OPT_FLAG,                                                                                     \
     &(d).seg.self_attention,                                                                      \
     NULL,                                                                                         \
     "--masks: fastai's self_attention=True, a SelfAttention layer in the U-Net's third "          \
     "decoder block from the end",                                                                 \
     0,                                                                                            \
     0,                                                                                            \
     0},                                                                                           \
    {                                                                                              \
        "--blur", OPT_FLAG, &(d).seg.blur, NULL,                                                   \
            "--masks: fastai's blur=True, each PixelShuffle_ICNR upsampling followed by a "        \
            "one-pixel replication pad and a 2x2 average pool (blur_final: the last one too)",     \
            0, 0, 0                                                                                \
    }
/* Usage errors of --masks and its options (arch: --arch or NULL; metrics: --metrics or NULL). */
int cli_seg_check(const char *cmd, const cli_data *d, const char *arch, const char *metrics);
/* The training and validation sets of --masks (--limit: the first N and N/5 of the split). */
cf_status cli_seg_load(const cli_data *d, const char **input, cf_dataset **train,
                       cf_dataset **valid);
/* Segmentation metrics by name (foreground_acc and dice_multi by default); false when the data
 * are not masks. */
bool cli_seg_metrics(const char *cmd, const cli_data *d, const char *list, int n_classes,
                     cf_metric ***out, int *n, int *rc);
/* fastai's unet_learner on arch (resnet18/34/50, xresnet18/34/50) with --pretrained: a corefit
 * U-Net's encoder, or torchvision's/timm's ResNet weights, then frozen; --self-attention and
 * --blur from seg. */
cf_status cli_seg_learner(cf_learner **out, cf_dls *dls, const char *arch, cf_metric **metrics,
                          int n_metrics, uint64_t seed, bool quiet, const char *pretrained,
                          const cli_seg_data *seg);
/* show_results with masks (DIR/show_results.png) from predictions with their inputs. */
struct cli_figures;
void cli_seg_figures(const char *cmd, const char *dir, const cf_preds *p, int n_codes,
                     struct cli_figures *figs);
/* eval: the masks' codes must be the model's (count and names), and the set takes them. */
cf_status cli_seg_adopt_model(cf_dataset *ds, const cf_model_info *m);
/* eval --plots on a U-Net: show_results with the masks (get_preds with the inputs). */
int cli_seg_eval_figures(const char *cmd, cf_learner *learn, const char *dir);
/* Prints a U-Net's prediction for one image: the classes' pixel shares, and with out_png the
 * decoded mask written as an 8-bit gray PNG (pixel = class id); false for other models. */
bool cli_seg_predict(const char *cmd, const cf_model_info *m, const char *input, const float *probs,
                     const char *out_png, void *json_array, int *rc);

/* ---- model files ---------------------------------------------------------------------------- */

/* A learner for the model in `path` over a dls whose validation set is ds (taken over). */
cf_status cli_load_learner(const char *path, const cf_model_info *m, cf_dataset *ds, int bs,
                           cf_learner **learn, cf_dls **dls);

/* ---- figures ------------------------------------------------------------------------------- */

/* Draws PNG files in the terminal as sixel (libsixel through dlopen). Prints why not on
 * stderr when it cannot. */
void cli_show_figures(const char *const *paths, int n);

/* The interpretation figures and TTA scores (figures.c). Each figure written (or not) is reported
 * to done with its status, path and name. */
typedef void (*cli_figure_fn)(void *ctx, cf_status st, const char *path, const char *what);
/* mkdir -p; 0 on success (errno set otherwise). */
int cli_mkdirs(const char *dir);
/* DIR without trailing slashes, in buf ("out/" -> "out"). */
const char *cli_folder_name(const char *dir, char *buf, size_t size);
/* The figures a command wrote (their paths, for --show). */
typedef struct cli_figures {
    char *paths[16];
    int n;
} cli_figures;
/* Prints "figure: PATH" and keeps the path, or says on stderr why the figure is missing. */
void cli_figure_done(const char *cmd, cli_figures *f, cf_status st, const char *path,
                     const char *what);
void cli_figures_free(cli_figures *f);
/* train --plots DIR: loss, schedule, metrics, show_batch and, from a classifier's validation
 * predictions (NULL: none), the interpretation figures and most_confused. */
void cli_train_figures(const char *dir, const cf_recorder *rec, const cf_dls *dls,
                       const cf_preds *preds, cli_figures *figs);
/* DIR/show_batch.png: the first training batch (augmented as in training), image sets only. */
void cli_show_batch_figure(const char *dir, const cf_dataloader *train, char *const *vocab,
                           cli_figure_fn done, void *ctx);
/* From a classifier's predictions p on the set valid (with_loss for the top losses):
 * DIR/show_results.png and DIR/top_losses.png (image sets), DIR/confusion.png; *counts receives
 * the confusion counts (cf_free) for most_confused. Fails only when the counts cannot be made. */
cf_status cli_interpretation(const char *dir, const cf_dataset *valid, const cf_preds *p,
                             int n_classes, char *const *vocab, cli_figure_fn done, void *ctx,
                             int64_t **counts);
/* fastai's most_confused(min_val=1) as Python prints its list: one (actual, predicted, count)
 * tuple a line under a header. Returns the number of pairs (-1 on failure). */
int64_t cli_print_most_confused(FILE *f, const int64_t *counts, int n_classes, char *const *vocab);
/* The cross-entropy (mean -log p[actual]) and accuracy of class probabilities (tta's). */
cf_status cli_tta_scores(const cf_preds *p, int n_classes, double *loss, double *accuracy);

/* What `corefit eval --tta/--plots` adds to the plain validation (figures.c). */
typedef struct cli_eval_extras {
    bool tta; /* asked: */
    int tta_n;
    double tta_beta;
    const cf_aug_opts *tta_aug; /* the model's recorded aug_transforms (NULL: the defaults) */
    const char *tta_aug_note;   /* why those augmentations, for the printed line */
    const char *plots;
    bool have_tta; /* results: */
    double tta_loss, tta_accuracy;
    char *figures[4];
    int n_figures;
    int64_t *counts; /* confusion counts (--plots on a classifier) */
    int n_classes;
} cli_eval_extras;
/* Runs them on the learner's validation set; CLI_FAIL with the message printed. */
int cli_eval_extras_run(const char *cmd, cf_learner *learn, cli_eval_extras *x);
/* Prints them after the plain results: text lines, or members of eval's JSON object. */
void cli_eval_extras_print(const cf_learner *learn, const cli_eval_extras *x);
struct cJSON;
void cli_eval_extras_json(struct cJSON *j, const cf_learner *learn, const cli_eval_extras *x);
void cli_eval_extras_free(cli_eval_extras *x);

/* ---- stopping a fit: Ctrl-C and SIGTERM (interrupt.c) ------------------------------------- */

/* The handlers a fit installed and the ones they replaced. */
typedef struct cli_signals {
    bool own_sigint, own_sigterm;
    struct sigaction old_sigint, old_sigterm;
} cli_signals;
/* SIGINT cancels an in-process fit at the next batch, through cli_interrupt_cb (fork workers
 * and MPI ranks are stopped by the par layer). */
void cli_catch_sigint(cli_signals *s);
/* SIGTERM asks every fit to write its checkpoint at the next batch boundary and stop. */
void cli_catch_sigterm(cli_signals *s);
/* Puts back the replaced handlers (SIGTERM's stays once one arrived). */
void cli_signals_restore(cli_signals *s);
cf_callback *cli_interrupt_cb(void);
bool cli_interrupted(void); /* a SIGINT arrived */
bool cli_terminated(void);  /* a SIGTERM arrived */

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
int cmd_eval_text(int argc, char **argv);
/* data sets for the other vision tasks from Fashion-MNIST (fmnist_tasks.c) */
int cmd_fmnist_tasks(int argc, char **argv);
/* Whether argv[2..) holds the option `name`; whether argv[2] is an exported text model. */
bool cli_argv_has(int argc, char **argv, const char *name);
bool cli_is_text_model(int argc, char **argv);

#endif
