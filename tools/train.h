/* What corefit train and lr-find share between their files (train.c, fit.c). Internal. */
#ifndef COREFIT_TRAIN_H
#define COREFIT_TRAIN_H

#include "corefit.h"

#include <sys/stat.h>

/* ---- shared options of train and lr-find ---------------------------------------------------- */

typedef struct train_args {
    cli_data data;
    const char *arch, *pretrained, *lr, *schedule, *start, *out, *plots, *csv_log, *metrics,
        *layers, *plot;
    int epochs, freeze_epochs, cores, threads, cycle_len, num_it;
    double wd, start_lr, end_lr, deadline;
    double label_smoothing, mixup, cutmix; /* --label-smoothing EPS, --mixup/--cutmix ALPHA */
    bool show, quiet, split_batch, save_every_epoch;
    bool bf16; /* --bf16: cf_learner_to_bf16 */
    const char *y_range;
    const char *resume, *checkpoint; /* --resume FILE, --checkpoint FILE */
    int checkpoint_every;            /* --checkpoint-every N (batches) */
    int max_restarts, commit_every;  /* --max-restarts N, --commit-every K (fork workers) */
    const char *recipe;              /* --recipe NAME (recipe.c) */
    bool tta;                        /* --tta: flip test-time augmentation after the fit */
    int valid_every;                 /* --valid-every N (epochs; 0: no validation in the fit) */
    int small_epochs;                /* --small-epochs K: the first K epochs at half size */
} train_args;

#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)

/* The fork launcher's limit on worker processes (src/par/launch.c). */
#define CLI_MAX_CORES 256

typedef struct session {
    cf_dls *dls;
    cf_learner *learn;
    const char *input;
    cf_comm *mpi;
    bool master;
    cf_par_opts par;
    bool parallel;
} session;

void cli_session_free(session *s);

/* Data, model and learner for train and lr-find (build.c); CLI_OK or the exit status, with the
 * message printed. */
int cli_setup(const char *cmd, train_args *a, session *s);

/* ---- the fit (fit.c) ----------------------------------------------------------------------- */

/* lr_find on the session's learner (every core when parallel), all four suggestions. */
int cli_run_lr_find(const char *cmd, train_args *a, session *s, cf_lr_find_result *r);
void cli_print_suggestions(const cf_lr_find_result *r);
/* --lr: a number, or auto (lr_find's valley, printed, with DIR/lr_find.png for --plots); *lr
 * keeps the schedule's default without --lr. */
int cli_choose_lr(const char *cmd, train_args *a, session *s, cli_figures *figs, double *lr);
/* --schedule's fit at lr, with the call's callbacks and --resume. */
cf_status cli_fit(const train_args *a, cf_learner *learn, bool parallel, const cf_par_opts *par,
                  double lr, cf_callback **cbs, int n_cbs);
/* train's callbacks: --csv-log, TerminateOnNaN, Ctrl-C, --save-every-epoch, --quiet's table. */
int cli_add_train_callbacks(const char *cmd, const train_args *a, cf_learner *learn);
/* The checkpoint file: --checkpoint, else --out with .ckpt for .safetensors. */
const char *cli_checkpoint_file(const train_args *a, char *buf, size_t n);
/* How to continue: this command line with --resume FILE. */
void cli_print_resume_hint(int argc, char **argv, const char *ckpt);
/* --save-every-epoch's master callback writing path; how many epochs it saved. */
cf_callback *cli_save_epoch_cb(const char *path);
int cli_epochs_saved(void);
/* Whether path exists and is not the file stat gave in *before (had: it existed then). */
bool cli_written_since(const char *path, bool had, const struct stat *before);
/* After a fit that did not finish: no empty figures folder stays behind. */
void cli_clean_up_partial(const char *plots, bool made_plots);
/* Usage errors of --max-restarts and --commit-every. */
int cli_check_restarts(const char *cmd, const train_args *a);

/* ---- the report (report.c) ----------------------------------------------------------------- */

/* The lines after the table: result (the last epoch's values), time, model and log. */
void cli_print_summary(const train_args *a, const session *s, const cf_recorder *rec,
                       double seconds, int restarts);
/* The files a fit may leave behind, as they were before it. */
typedef struct cli_fit_files {
    const char *ckpt;
    bool had_out, had_ckpt, made_plots; /* --out and the checkpoint existed; --plots was made */
    struct stat out_before, ckpt_before;
} cli_fit_files;
/* After a fit that failed, was interrupted or pre-empted: the message, what became of the model
 * file, how to continue from the checkpoint; the exit status. */
int cli_report_stopped_fit(const char *cmd, int argc, char **argv, const train_args *a,
                           const session *s, cf_status st, int restarts, const cli_fit_files *f);

/* --recipe NAME: sets the recipe's options that opts (parsed) did not see; CLI_USAGE for an
 * unknown name (recipe.c). */
int cli_apply_recipe(const char *cmd, train_args *a, const cli_opt *opts);
/* --tta: the validation accuracy of the learner with each image predicted plain and mirrored,
 * the probabilities averaged (tta_flip.c); CLI_OK or the exit status, with the message printed. */
int cli_tta_flip(const char *cmd, cf_learner *learn, double *accuracy);

/* --valid-every N: a callback that lets validation run only after every N-th epoch and the
 * last (N = 0: none) (valid_every.c); NULL without memory. */
cf_callback *cli_valid_every_cb(int every);

/* --small-epochs K: a callback that trains the first K epochs of a fit on its images at half
 * size, 2x2 averages (small_epochs.c); NULL without memory. */
cf_callback *cli_small_epochs_cb(int epochs);
/* CF_TIMING=1: "timing: WHAT at S s since the start, this process's CPU C s" on stderr
 * (timing.c). */
void cli_timing(const char *what);

#endif
