/* corefit train and corefit lr-find: their options and checks, and the steps of a fit. The steps
 * live beside it: the data (data.c), the learner (build.c), the fit (fit.c), the report
 * (report.c), the figures (figures.c) and Ctrl-C/SIGTERM (interrupt.c). */
#include "corefit.h"
#include "photo.h"
#include "train.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const schedules[] = {"one-cycle", "flat-cos", "sgdr", "fine-tune"};

static int check_metric_names(const char *cmd, const char *list, bool regression);

static int check_args(const char *cmd, train_args *a, bool train) {
    cli_data *d = &a->data;
    int data_rc = cli_check_data_args(cmd, d, a->metrics);
    if (!data_rc) data_rc = cli_seg_check(cmd, d, a->arch, a->metrics); /* --masks (seg.c) */
    if (data_rc) return data_rc;
    if (d->flip && (d->csv || d->aug))
        return cli_error(CLI_USAGE, cmd,
                         d->csv ? "--flip is for images, not --csv"
                                : "--flip with --aug: aug_transforms() flips already");
    if (a->small_epochs > 0 && (d->csv || d->seg.masks))
        return cli_error(CLI_USAGE, cmd,
                         d->csv ? "--small-epochs is for images, not --csv"
                                : "--small-epochs with --masks: the masks would keep their size");
    if (a->arch) {
        bool tab = strcmp(a->arch, "tabular") == 0;
        if (!tab && cf_arch_from_name(a->arch) < 0)
            return cli_error(CLI_USAGE, cmd,
                             "unknown --arch '%s' (choose mini-resnet, simple-cnn, xresnet18, "
                             "xresnet34, xresnet50, resnet18, resnet34, resnet50, fast-cnn or "
                             "tabular)",
                             a->arch);
        if (tab != (d->csv != NULL))
            return cli_error(CLI_USAGE, cmd,
                             tab ? "--arch tabular needs --csv data"
                                 : "--csv data needs --arch tabular");
    }
    if (a->metrics) {
        int rc = d->task.multi_label || d->seg.masks
                     ? CLI_OK
                     : check_metric_names(cmd, a->metrics, d->regression || d->task.points);
        if (rc) return rc;
    }
    if (a->y_range && !d->regression && !d->task.points)
        return cli_error(CLI_USAGE, cmd, "--y-range is for --regression");
    if (a->y_range && strcmp(a->y_range, "auto") != 0 && strcmp(a->y_range, "none") != 0) {
        double lo, hi;
        char tail;
        if (sscanf(a->y_range, "%lf,%lf%c", &lo, &hi, &tail) != 2 || !isfinite(lo) ||
            !isfinite(hi) || !(lo < hi))
            return cli_error(CLI_USAGE, cmd,
                             "--y-range expects LOW,HIGH with LOW < HIGH, auto or none, got '%s'",
                             a->y_range);
    }
    if (a->cores > 1 && (!a->start || strcmp(a->start, "mpi") != 0) &&
        a->cores > cf_available_cores())
        fprintf(stderr,
                "corefit %s: warning: --cores %d runs more worker processes than the %d core%s "
                "this process may use; they will share them and each step will wait for the "
                "slowest\n",
                cmd, a->cores, cf_available_cores(), cf_available_cores() == 1 ? "" : "s");
    if (a->start && strcmp(a->start, "fork") != 0 && strcmp(a->start, "mpi") != 0)
        return cli_error(CLI_USAGE, cmd, "--start must be fork or mpi, got '%s'", a->start);
    if (train) {
        bool ok = false;
        for (size_t i = 0; i < sizeof schedules / sizeof *schedules; i++)
            ok |= strcmp(a->schedule, schedules[i]) == 0;
        if (!ok)
            return cli_error(CLI_USAGE, cmd,
                             "unknown --schedule '%s' (choose one-cycle, flat-cos, sgdr or "
                             "fine-tune)",
                             a->schedule);
        if (a->lr && strcmp(a->lr, "auto") != 0) {
            char *end;
            double v = strtod(a->lr, &end);
            if (end == a->lr || *end || !(v > 0) || !isfinite(v))
                return cli_error(CLI_USAGE, cmd,
                                 "--lr expects a positive number or 'auto', got '%s'", a->lr);
        }
        if (a->pretrained && d->csv)
            return cli_error(CLI_USAGE, cmd, "--pretrained is for image models");
    }
    if (a->pretrained && !cli_exists(a->pretrained))
        return cli_error(CLI_FAIL, cmd, "--pretrained %s: %s", a->pretrained, strerror(ENOENT));
    if (d->csv && !cli_exists(d->csv))
        return cli_error(CLI_FAIL, cmd, "--csv %s: %s", d->csv, strerror(ENOENT));
    if (d->images && !cli_exists(d->images))
        return cli_error(CLI_FAIL, cmd, "--images %s: %s", d->images, strerror(ENOENT));
    if (d->images_csv && !cli_exists(d->images_csv))
        return cli_error(CLI_FAIL, cmd, "--images-csv %s: %s", d->images_csv, strerror(ENOENT));
    if (d->idx && !cli_exists(d->idx))
        return cli_error(CLI_FAIL, cmd, "--idx %s: %s", d->idx, strerror(ENOENT));
    return CLI_OK;
}

static const char *const class_metrics[] = {"accuracy",  "error_rate", "top_5_accuracy",
                                            "precision", "recall",     "f1_score"};
static const char *const regression_metrics[] = {"mse", "mae", "rmse"};

/* Checks --metrics names before any data is read (a regression is known from --regression). */
static int check_metric_names(const char *cmd, const char *list, bool regression) {
    strlist names = {0};
    if (strlist_split(list, &names)) return cli_error(CLI_FAIL, cmd, "out of memory");
    int rc = CLI_OK;
    for (int i = 0; i < names.n && rc == CLI_OK; i++) {
        bool ok = false;
        const char *const *known = regression ? regression_metrics : class_metrics;
        size_t n = regression ? 3 : 6;
        for (size_t k = 0; k < n; k++) ok |= strcmp(names.v[i], known[k]) == 0;
        if (!ok)
            rc = cli_error(CLI_USAGE, cmd,
                           "unknown --metrics name '%s' for a %s (classifiers: accuracy, "
                           "error_rate, top_5_accuracy, precision, recall, f1_score; regression: "
                           "mse, mae, rmse)",
                           names.v[i], regression ? "regression" : "classifier");
    }
    strlist_free(&names);
    return rc;
}

void cli_session_free(session *s) {
    cf_learner_free(s->learn);
    cf_dls_free(s->dls);
    /* s->mpi belongs to the par layer (kept for the process) */
}

/* The folder --out goes into, created before the data is read so that a fit never ends unable
 * to save (as --plots is). */
static int make_out_folder(const char *cmd, const char *out) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return CLI_OK;
    *slash = '\0';
    if (cli_mkdirs(dir))
        return cli_error(CLI_FAIL, cmd, "cannot create the folder of --out %s: %s", out,
                         strerror(errno));
    return CLI_OK;
}

/* ---- the command line ---------------------------------------------------------------------- */

#define DATA_OPTIONS(a)                                                                              \
    {"--idx",                                                                                        \
     OPT_STR,                                                                                        \
     &(a).data.idx,                                                                                  \
     "DIR",                                                                                          \
     "IDX folder (train-* and t10k-* files; t10k is validation) [" CF_FASHION_MNIST_DEFAULT_DIR      \
     "]",                                                                                            \
     0,                                                                                              \
     0,                                                                                              \
     0},                                                                                             \
        {"--images",                                                                                 \
         OPT_STR,                                                                                    \
         &(a).data.images,                                                                           \
         "DIR",                                                                                      \
         "class-per-folder images (train/ and valid/, or one folder split by --valid-pct)",          \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--size",                                                                                   \
         OPT_INT,                                                                                    \
         &(a).data.size,                                                                             \
         "N",                                                                                        \
         "resize images to N x N [64; a corefit --pretrained model: its size] (torchvision's "       \
         "ImageNet weights were trained at 224)",                                                    \
         1,                                                                                          \
         4096,                                                                                       \
         0},                                                                                         \
        {"--channels",                                                                               \
         OPT_INT,                                                                                    \
         &(a).data.channels,                                                                         \
         "N",                                                                                        \
         "image channels, 1 or 3 [3; pretrained: its]",                                              \
         1,                                                                                          \
         3,                                                                                          \
         0},                                                                                         \
        {"--csv", OPT_STR, &(a).data.csv, "FILE", "a table: one row per sample, a header row", 0,    \
         0,       0},                                                                                \
        {"--cat", OPT_STR, &(a).data.cat, "LIST", "categorical columns (comma-separated)", 0, 0, 0}, \
        {"--cont", OPT_STR, &(a).data.cont, "LIST", "continuous columns (comma-separated)", 0,       \
         0,        0},                                                                               \
        {"--target", OPT_STR, &(a).data.target, "NAME", "the column to predict", 0, 0, 0},           \
        {"--regression",                                                                             \
         OPT_FLAG,                                                                                   \
         &(a).data.regression,                                                                       \
         NULL,                                                                                       \
         "the target is a number (default: a class)",                                                \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--valid-pct",                                                                              \
         OPT_DOUBLE,                                                                                 \
         &(a).data.valid_pct,                                                                        \
         "F",                                                                                        \
         "validation share of a random split (CSV, flat image folder) [0.2]",                        \
         0.01,                                                                                       \
         0.99,                                                                                       \
         0},                                                                                         \
        {"--limit",                                                                                  \
         OPT_INT,                                                                                    \
         &(a).data.limit,                                                                            \
         "N",                                                                                        \
         "use N training and N/5 validation samples: the first ones of IDX files, a seeded "         \
         "random sample stratified by class of images, the first N + N/5 rows of a CSV table "       \
         "split at random",                                                                          \
         1,                                                                                          \
         1e9,                                                                                        \
         0},                                                                                         \
        {"--load",                                                                                   \
         OPT_STR,                                                                                    \
         &(a).data.load,                                                                             \
         "HOW",                                                                                      \
         "images: auto (stream: each batch decoded from the files, measured faster than memory), "   \
         "memory (decode every image up front) or stream [auto]",                                    \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--skip-bad",                                                                               \
         OPT_FLAG,                                                                                   \
         &(a).data.skip_bad,                                                                         \
         NULL,                                                                                       \
         "streamed images: leave out and count files that cannot be read (default: stop, naming "    \
         "the file)",                                                                                \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--aug",                                                                                    \
         OPT_FLAG,                                                                                   \
         &(a).data.aug,                                                                              \
         NULL,                                                                                       \
         "fastai's aug_transforms() on the training images (flip, rotate, zoom, warp, lighting)",    \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--flip",                                                                                   \
         OPT_FLAG,                                                                                   \
         &(a).data.flip,                                                                             \
         NULL,                                                                                       \
         "images: a horizontal flip (p 0.5) of each training image, drawn from the seed",            \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--bs", OPT_INT, &(a).data.bs, "N", "batch size (per core) [64]", 1, 1 << 20, 0}, {         \
        "--seed", OPT_U64, &(a).data.seed, "N", "random seed [42]", 0, 0, 0                          \
    }

#define MODEL_OPTIONS(a)                                                                             \
    {"--arch",                                                                                       \
     OPT_STR,                                                                                        \
     &(a).arch,                                                                                      \
     "NAME",                                                                                         \
     "mini-resnet, simple-cnn, xresnet18, xresnet34, xresnet50, resnet18, resnet34, resnet50 "       \
     "(torchvision's), fast-cnn (--recipe fast's), tabular [mini-resnet for images up to 64 px, "    \
     "else xresnet18; tabular for --csv; --pretrained: its]",                                        \
     0,                                                                                              \
     0,                                                                                              \
     0},                                                                                             \
        {"--pretrained",                                                                             \
         OPT_STR,                                                                                    \
         &(a).pretrained,                                                                            \
         "FILE",                                                                                     \
         "start from the body of a corefit model or of torchvision's/timm's ResNet weights "         \
         "(safetensors; a .pth converted by corefit-convert-pth), frozen, as fastai's "              \
         "pretrained; the weights keep their normalisation (ImageNet's for torchvision/timm)",       \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--layers", OPT_STR, &(a).layers, "LIST", "tabular hidden layer sizes [200,100]", 0, 0, 0}, \
        {"--cores",                                                                                  \
         OPT_INT,                                                                                    \
         &(a).cores,                                                                                 \
         "N",                                                                                        \
         "worker processes, up to 256 (1: in-process) [all cores this process may use]",             \
         1,                                                                                          \
         CLI_MAX_CORES,                                                                              \
         0},                                                                                         \
        {"--start", OPT_STR, &(a).start, "METHOD", "fork (default) or mpi (under mpirun)", 0, 0, 0}, \
        {"--threads", OPT_INT, &(a).threads, "N", "threads of an in-process fit [all]", 1, 4096, 0}, \
        {"--deadline",                                                                               \
         OPT_DOUBLE,                                                                                 \
         &(a).deadline,                                                                              \
         "SECONDS",                                                                                  \
         "a worker silent this long is declared hung and the fit fails [120]",                       \
         0.1,                                                                                        \
         1e7,                                                                                        \
         0},                                                                                         \
        {"--split-batch",                                                                            \
         OPT_FLAG,                                                                                   \
         &(a).split_batch,                                                                           \
         NULL,                                                                                       \
         "cut each batch across the cores (default: --bs per core)",                                 \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
        {"--quiet",                                                                                  \
         OPT_FLAG,                                                                                   \
         &(a).quiet,                                                                                 \
         NULL,                                                                                       \
         "no progress bar or messages (the table and results stay)",                                 \
         0,                                                                                          \
         0,                                                                                          \
         0},                                                                                         \
    {                                                                                                \
        "--show", OPT_FLAG, &(a).show, NULL,                                                         \
            "draw the figures in the terminal (sixel, needs libsixel)", 0, 0, 0                      \
    }

/* Before the fit: --out, --csv-log and the --plots folder can be written (*made_plots: the
 * folder is new). */
static int check_outputs(const char *cmd, const train_args *a, const session *s, bool *made_plots) {
    /* a read-only or missing output folder fails now, not after the fit */
    if (s->master && cf_st_check_writable(a->out)) {
        return cli_lib_error(cmd, "--out");
    }
    bool through;
    if (s->master && a->csv_log && cf_output_check(a->csv_log, &through)) {
        return cli_lib_error(cmd, "--csv-log");
    }
    struct stat plots_sb;
    *made_plots = a->plots && s->master && stat(a->plots, &plots_sb) != 0;
    if (a->plots && s->master && cli_mkdirs(a->plots)) {
        return cli_error(CLI_FAIL, cmd, "cannot create --plots folder %s: %s", a->plots,
                         strerror(errno));
    }
    return CLI_OK;
}

static void train_usage(FILE *f, const cli_opt *opts) {
    fprintf(f,
            "Usage: corefit train [options]\n\n"
            "Trains a model the fastai way (Adam, cross-entropy for classes, MSE for numbers) on\n"
            "every core, prints fastai's table, and writes the model, a CSV log and figures.\n"
            "Default: the mini-resnet on Fashion-MNIST with fit_one_cycle for 1 epoch.\n\n"
            "Options:\n");
    cli_print_options(f, opts);
}

static void defaults(train_args *a) {
    memset(a, 0, sizeof *a);
    a->data.seed = 42;
    a->data.valid_pct = 0.2;
    a->epochs = 1;
    a->freeze_epochs = 1;
    a->schedule = "one-cycle";
    a->out = "model.safetensors";
    a->cycle_len = 1;
    a->checkpoint_every = 100; /* about 0.5% of a W1 epoch's time (bench_w1 --checkpoint-every) */
    a->valid_every = 1;
}

int cmd_train(int argc, char **argv) {
    if (cli_argv_has(argc, argv, "--text")) return cmd_train_text(argc, argv);
    const char *cmd = "train";
    train_args a;
    defaults(&a);
    cli_opt opts[] = {
        DATA_OPTIONS(a),
        PHOTO_OPTIONS(a),
        CLI_TASK_OPTIONS(a.data),
        CLI_SEG_OPTIONS(a.data),
        CLI_SEG_MODEL_OPTIONS(a.data),
        MODEL_OPTIONS(a),
        {"--epochs", OPT_INT, &a.epochs, "N", "epochs (sgdr: cycles) [1]", 1, 100000, 0},
        {"--lr", OPT_STR, &a.lr, "X|auto",
         "learning rate, or auto for lr_find's valley [3e-3; fine-tune 2e-3]", 0, 0, 0},
        {"--schedule", OPT_STR, &a.schedule, "NAME",
         "one-cycle, flat-cos, sgdr or fine-tune [one-cycle]", 0, 0, 0},
        {"--freeze-epochs", OPT_INT, &a.freeze_epochs, "N", "fine-tune: epochs frozen first [1]", 0,
         100000, 0},
        {"--cycle-len", OPT_INT, &a.cycle_len, "N", "sgdr: epochs of the first cycle [1]", 1,
         100000, 0},
        {"--wd", OPT_DOUBLE, &a.wd, "X", "weight decay [0.01]", 0, 10, 0},
        {"--label-smoothing", OPT_DOUBLE, &a.label_smoothing, "EPS",
         "classes: fastai's LabelSmoothingCrossEntropy(eps) (fastai's eps: 0.1)", 0, 1, 0},
        {"--mixup", OPT_DOUBLE, &a.mixup, "ALPHA", "fastai's MixUp(alpha) (fastai's alpha: 0.4)", 0,
         100, 0},
        {"--cutmix", OPT_DOUBLE, &a.cutmix, "ALPHA", "fastai's CutMix(alpha) (fastai's alpha: 1.0)",
         0, 100, 0},
        {"--bf16", OPT_FLAG, &a.bf16, NULL,
         "fastai's to_fp16 in bfloat16: products in bf16 with fp32 sums, weights fp32 (where the "
         "CPU has bf16 kernels; elsewhere fp32, said once); the saved model is fp32",
         0, 0, 0},
        {"--metrics", OPT_STR, &a.metrics, "LIST", "metrics to report [accuracy for classes]", 0, 0,
         0},
        {"--out", OPT_STR, &a.out, "FILE", "the model file (safetensors) [model.safetensors]", 0, 0,
         0},
        {"--plots", OPT_STR, &a.plots, "DIR",
         "write loss, schedule, metrics, lr_find PNGs here; classifiers: show_batch, "
         "show_results, top_losses, confusion matrix, and print most_confused",
         0, 0, 0},
        {"--csv-log", OPT_STR, &a.csv_log, "FILE",
         "fastai's CSVLogger: epoch,train_loss,valid_loss,<metrics>,time", 0, 0, 0},
        {"--save-every-epoch", OPT_FLAG, &a.save_every_epoch, NULL,
         "write --out after every epoch, so that a fit stopped by Ctrl-C or a NaN keeps the last "
         "completed epoch's model (default: only a finished fit writes it)",
         0, 0, 0},
        {"--checkpoint-every", OPT_INT, &a.checkpoint_every, "N",
         "write a checkpoint (everything the rest of the fit needs) every N batches (0: only on "
         "SIGTERM, which always writes one at the next batch and stops); a finished fit removes "
         "it unless --checkpoint names it [100]",
         0, 1 << 30, 0},
        {"--checkpoint", OPT_STR, &a.checkpoint, "FILE", "the checkpoint file [OUT.ckpt]", 0, 0, 0},
        {"--resume", OPT_STR, &a.resume, "FILE",
         "continue the fit a checkpoint was taken from (the same options): the result is the "
         "same model, bit for bit, as a fit never stopped",
         0, 0, 0},
        {"--max-restarts", OPT_INT, &a.max_restarts, "N",
         "fork workers: a killed, crashed or hung worker restarts the workers from the last "
         "commit, up to N times, with the same result as an undisturbed fit (under mpirun: "
         "corefit-mpirun --max-restarts N) [0]",
         0, 1000000, 0},
        {"--commit-every", OPT_INT, &a.commit_every, "K",
         "with --max-restarts: training batches between the commits a restart resumes from "
         "(kept in memory, /dev/shm) [" CLI_STR(CF_PAR_COMMIT_EVERY) "]",
         1, 1 << 30, 0},
        {"--y-range", OPT_STR, &a.y_range, "LOW,HIGH",
         "regression: squash outputs into [LOW, HIGH] (fastai's y_range); auto: the training "
         "targets' range + 5%; none [auto]",
         0, 0, 0},
        {"--recipe", OPT_STR, &a.recipe, "NAME",
         "fast: Fashion-MNIST's 92% in the least time (--arch fast-cnn --epochs 4 --small-epochs "
         "1 --bs 64 --lr 1e-2 --label-smoothing 0.1 --bf16 --valid-every 4 --checkpoint-every "
         "0); options given on the command line win",
         0, 0, 0},
        {"--tta", OPT_FLAG, &a.tta, NULL,
         "image classifiers: after the fit, also the validation accuracy with each image "
         "predicted plain and mirrored (probabilities averaged)",
         0, 0, 0},
        {"--valid-every", OPT_INT, &a.valid_every, "N",
         "validate after every N-th epoch and the last; 0: no validation during the fit (nan in "
         "the table; --tta still measures after it) [1]",
         0, 1 << 30, 0},
        {"--small-epochs", OPT_INT, &a.small_epochs, "K",
         "images: progressive resizing, the first K epochs on the training images at half size "
         "(2x2 averages), the rest at full size [0]",
         0, 100000, 0},
        {0},
    };
    const char *pos[1];
    int n_pos;
    bool help;
    int rc = cli_parse_or_usage(cmd, argc, argv, opts, pos, 0, &n_pos, train_usage, &help);
    if (rc || help) return rc;
    if ((rc = cli_apply_recipe(cmd, &a, opts))) return rc;
    if ((rc = check_args(cmd, &a, true))) return rc;
    if ((rc = cli_check_restarts(cmd, &a))) return rc;
    bool fine_tune = strcmp(a.schedule, "fine-tune") == 0;
    if (a.show && !a.plots) a.plots = ".";
    char plots_dir[4096];
    if (a.plots) a.plots = cli_folder_name(a.plots, plots_dir, sizeof plots_dir);
    if ((rc = make_out_folder(cmd, a.out))) return rc;
    session s;
    if ((rc = cli_setup(cmd, &a, &s))) {
        cli_session_free(&s);
        return rc;
    }
    cli_timing("data and model ready");
    cf_learner *learn = s.learn;
    if (a.max_restarts > 0 && !s.parallel && s.master)
        fprintf(stderr,
                "corefit %s: warning: --max-restarts has no effect: the fit runs in this process "
                "(one core)\n",
                cmd);
    if ((rc = cli_add_train_callbacks(cmd, &a, learn))) {
        cli_session_free(&s);
        return rc;
    }
    bool made_plots = false;
    if ((rc = check_outputs(cmd, &a, &s, &made_plots))) {
        cli_session_free(&s);
        return rc;
    }
    cli_figures figs = {0};
    double lr = fine_tune ? 2e-3 : 3e-3;
    double t0 = cf_now();
    /* Ctrl-C: fork workers and MPI are stopped by the par layer (CF_ERR_INTERRUPTED); in this
     * process the interrupt callback cancels the fit at the next batch */
    struct stat out_before;
    bool had_out = stat(a.out, &out_before) == 0;
    cli_signals sig = {0};
    if (!s.parallel) cli_catch_sigint(&sig);
    if ((rc = cli_choose_lr(cmd, &a, &s, &figs, &lr))) {
        cli_session_free(&s);
        return rc;
    }
    cf_status st;
    const cf_par_opts par = s.par;
    /* the checkpoint callback runs in every replica (they agree on a stop; rank 0 writes) */
    char ckpt_buf[4096];
    const char *ckpt = cli_checkpoint_file(&a, ckpt_buf, sizeof ckpt_buf);
    struct stat ckpt_before;
    bool had_ckpt = stat(ckpt, &ckpt_before) == 0;
    bool through;
    if (s.master && cf_output_check(ckpt, &through)) {
        cli_session_free(&s);
        return cli_lib_error(cmd, a.checkpoint ? "--checkpoint" : "the checkpoint of --out");
    }
    cf_callback *ckpt_cb = cf_checkpoint_cb(.fname = ckpt, .every_batches = a.checkpoint_every);
    if (!ckpt_cb) {
        cli_session_free(&s);
        return cli_lib_error(cmd, "checkpoint callback");
    }
    cf_callback *valid_cb = a.valid_every != 1 ? cli_valid_every_cb(a.valid_every) : NULL;
    if (a.valid_every != 1 && !valid_cb) {
        cf_callback_free(ckpt_cb);
        cli_session_free(&s);
        return cli_lib_error(cmd, "--valid-every callback");
    }
    cf_callback *small_cb = a.small_epochs > 0 ? cli_small_epochs_cb(a.small_epochs) : NULL;
    if (a.small_epochs > 0 && !small_cb) {
        cf_callback_free(ckpt_cb);
        cf_callback_free(valid_cb);
        cli_session_free(&s);
        return cli_lib_error(cmd, "--small-epochs callback");
    }
    cf_callback *call_cbs[3] = {ckpt_cb};
    int n_call_cbs = 1;
    if (valid_cb) call_cbs[n_call_cbs++] = valid_cb;
    if (small_cb) call_cbs[n_call_cbs++] = small_cb;
    cli_catch_sigterm(&sig);
    cli_timing("fit starts");
    st = cli_fit(&a, learn, s.parallel, &par, lr, call_cbs, n_call_cbs);
    cli_timing("fit done (results home)");
    double seconds = cf_now() - t0;
    int restarts = s.parallel && s.par.start_method != CF_START_MPI ? cf_par_last_restarts() : 0;
    cli_signals_restore(&sig);
    if (st || cli_interrupted()) {
        cli_fit_files files = {.ckpt = ckpt,
                               .had_out = had_out,
                               .had_ckpt = had_ckpt,
                               .made_plots = made_plots,
                               .out_before = out_before,
                               .ckpt_before = ckpt_before};
        rc = cli_report_stopped_fit(cmd, argc, argv, &a, &s, st, restarts, &files);
        cli_session_free(&s);
        return rc;
    }
    /* the model file supersedes the checkpoint of a finished fit (kept when named) */
    struct stat ckpt_sb;
    if (s.master && !a.checkpoint && lstat(ckpt, &ckpt_sb) == 0 && S_ISREG(ckpt_sb.st_mode))
        unlink(ckpt);
    /* predictions for the confusion matrix (every rank takes part under MPI) */
    cf_preds preds = {0};
    bool classes = s.dls->train_ds->n_classes > 0;
    const bool masks = s.dls->train_ds->masks; /* show_results with the masks (seg.c) */
    bool have_preds = false;
    if (a.plots && classes) {
        st = s.parallel ? cf_par_get_preds(learn, &preds, .with_loss = !masks, .with_input = masks,
                                           .par = par)
                        : cf_get_preds(learn, &preds, .with_loss = !masks, .with_input = masks);
        if (st) {
            cli_session_free(&s);
            return cli_lib_error(cmd, "predictions for the confusion matrix");
        }
        have_preds = true;
    }
    double tta_acc = -1;
    if (a.tta && s.master && (rc = cli_tta_flip(cmd, learn, &tta_acc))) {
        cf_preds_free(&preds);
        cli_session_free(&s);
        return rc;
    }
    if (s.master) {
        if (cf_learner_export(learn, a.out)) {
            cf_preds_free(&preds);
            cli_session_free(&s);
            return cli_lib_error(cmd, "saving the model");
        }
        cli_timing("model saved");
        const cf_recorder *rec = &learn->recorder;
        cli_print_summary(&a, &s, rec, seconds, restarts);
        if (tta_acc >= 0)
            printf("tta: accuracy %.4f (each validation image plain and mirrored)\n", tta_acc);
        if (a.plots)
            cli_train_figures(a.plots, rec, s.dls, have_preds && !masks ? &preds : NULL, &figs);
        if (a.plots && have_preds && masks && cf_plot_available())
            cli_seg_figures(cmd, a.plots, &preds, s.dls->train_ds->n_classes, &figs);
        fflush(stdout);
        if (a.show && figs.n) cli_show_figures((const char *const *)figs.paths, figs.n);
    }
    cli_figures_free(&figs);
    cf_preds_free(&preds);
    cli_session_free(&s);
    if (s.master) cli_timing("session freed");
    return CLI_OK;
}

static void lr_find_usage(FILE *f, const cli_opt *opts) {
    fprintf(f,
            "Usage: corefit lr-find [options]\n\n"
            "Runs fastai's learning-rate finder (an exponential sweep from --start-lr to --end-lr\n"
            "over --num-it batches) on every core, prints the valley, slide, minimum and steep\n"
            "suggestions and plots loss against learning rate.\n\nOptions:\n");
    cli_print_options(f, opts);
}

int cmd_lr_find(int argc, char **argv) {
    const char *cmd = "lr-find";
    train_args a;
    defaults(&a);
    a.plot = "lr_find.png";
    cli_opt opts[] = {
        DATA_OPTIONS(a),
        PHOTO_OPTIONS(a),
        CLI_TASK_OPTIONS(a.data),
        CLI_SEG_OPTIONS(a.data),
        CLI_SEG_MODEL_OPTIONS(a.data),
        MODEL_OPTIONS(a),
        {"--start-lr", OPT_DOUBLE, &a.start_lr, "X", "first learning rate [1e-7]", 1e-12, 1e3, 0},
        {"--end-lr", OPT_DOUBLE, &a.end_lr, "X", "last learning rate [10]", 1e-12, 1e6, 0},
        {"--num-it", OPT_INT, &a.num_it, "N", "batches in the sweep [100]", 6, 1000000, 0},
        {"--plot", OPT_STR, &a.plot, "FILE", "the figure [lr_find.png]", 0, 0, 0},
        {"--plots", OPT_STR, &a.plots, "DIR", "write the figure as DIR/lr_find.png (as train)", 0,
         0, 0},
        {0},
    };
    const char *pos[1];
    int n_pos;
    bool help;
    int rc = cli_parse_or_usage(cmd, argc, argv, opts, pos, 0, &n_pos, lr_find_usage, &help);
    if (rc || help) return rc;
    if ((rc = check_args(cmd, &a, false))) return rc;
    if (a.start_lr > 0 && a.end_lr > 0 && a.end_lr <= a.start_lr)
        return cli_error(CLI_USAGE, cmd, "--end-lr %g must exceed --start-lr %g", a.end_lr,
                         a.start_lr);
    char plot_path[4096], plots_dir[4096];
    if (a.plots) {
        a.plots = cli_folder_name(a.plots, plots_dir, sizeof plots_dir);
        for (const cli_opt *o = opts; o->name; o++)
            if (o->dest == (void *)&a.plot && o->seen)
                return cli_error(CLI_USAGE, cmd, "give --plot FILE or --plots DIR, not both");
        if (cli_mkdirs(a.plots))
            return cli_error(CLI_FAIL, cmd, "cannot create --plots folder %s: %s", a.plots,
                             strerror(errno));
        snprintf(plot_path, sizeof plot_path, "%s/lr_find.png", a.plots);
        a.plot = plot_path;
    }
    session s;
    if ((rc = cli_setup(cmd, &a, &s))) {
        cli_session_free(&s);
        return rc;
    }
    cf_lr_find_result r;
    if ((rc = cli_run_lr_find(cmd, &a, &s, &r))) {
        cli_session_free(&s);
        return rc;
    }
    if (s.master) {
        cli_print_suggestions(&r);
        printf("valley: %.6e\nslide: %.6e\nminimum: %.6e\nsteep: %.6e\n", r.valley, r.slide,
               r.minimum, r.steep);
        cli_figures figs = {0};
        if (!cf_plot_available())
            fprintf(stderr,
                    "corefit lr-find: figures need PLplot's pngcairo driver; none written\n");
        else
            cli_figure_done(cmd, &figs, cf_plot_lr_find(&r, a.plot), a.plot, "lr_find");
        fflush(stdout);
        if (a.show && figs.n) cli_show_figures((const char *const *)figs.paths, figs.n);
        cli_figures_free(&figs);
    }
    cf_lr_find_result_free(&r);
    cli_session_free(&s);
    return CLI_OK;
}
