/* The fit of corefit train and lr-find: the schedules, in this process or on every core
 * (cf_X or its twin cf_par_X), lr_find, the checkpoint, --resume, --save-every-epoch and
 * --max-restarts. */
#include "corefit.h"
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_run_lr_find(const char *cmd, train_args *a, session *s, cf_lr_find_result *r) {
    memset(r, 0, sizeof *r);
    int all = CF_SUGGEST_VALLEY | CF_SUGGEST_SLIDE | CF_SUGGEST_MINIMUM | CF_SUGGEST_STEEP;
    cf_status st;
    if (s->parallel)
        st = cf_par_lr_find(s->learn, r, .start_lr = a->start_lr, .end_lr = a->end_lr,
                            .num_it = a->num_it, .suggest = all, .par = s->par);
    else
        st = cf_lr_find(s->learn, r, .start_lr = a->start_lr, .end_lr = a->end_lr,
                        .num_it = a->num_it, .suggest = all);
    if (st) return cli_lib_error(cmd, "lr_find");
    return CLI_OK;
}

void cli_print_suggestions(const cf_lr_find_result *r) {
    printf("lr_find: valley %.3e, slide %.3e, minimum %.3e, steep %.3e\n", r->valley, r->slide,
           r->minimum, r->steep);
}

/* The checkpoint file: --checkpoint, else --out with .ckpt for .safetensors. */
const char *cli_checkpoint_file(const train_args *a, char *buf, size_t n) {
    /* a name with a '/' is a path to the library (without one it goes under models/) */
    const char *dot = strchr(a->checkpoint ? a->checkpoint : a->out, '/') ? "" : "./";
    if (a->checkpoint) {
        snprintf(buf, n, "%s%s", dot, a->checkpoint);
        return buf;
    }
    size_t len = strlen(a->out);
    const char *ext = ".safetensors";
    size_t el = strlen(ext);
    if (len > el && strcmp(a->out + len - el, ext) == 0) len -= el;
    snprintf(buf, n, "%s%.*s.ckpt", dot, (int)len, a->out);
    return buf;
}

/* How to continue: this command line with --resume FILE (any earlier --resume dropped). */
void cli_print_resume_hint(int argc, char **argv, const char *ckpt) {
    fprintf(stderr, "corefit train: to continue, run:\n  corefit");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--resume") == 0) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--resume=", 9) == 0) continue;
        fprintf(stderr, " %s", argv[i]);
    }
    fprintf(stderr, " --resume %s\n", ckpt);
}

/* --save-every-epoch: the model file (with its metadata) after every completed epoch (a master
 * callback: rank 0 writes it). */
static const char *epoch_model_path;
static int epochs_saved;

static cf_status save_epoch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_status st = cf_learner_export(learn, epoch_model_path);
    if (st == CF_OK) epochs_saved++;
    return st;
}

static cf_callback save_epoch_cb = {.name = "save_every_epoch",
                                    .order = CF_ORDER_SAVE_MODEL,
                                    .on = {[CF_EV_AFTER_EPOCH] = save_epoch}};

cf_callback *cli_save_epoch_cb(const char *path) {
    epoch_model_path = path;
    return &save_epoch_cb;
}

int cli_epochs_saved(void) {
    return epochs_saved;
}

/* Whether path exists and is not the file stat gave in *before (had: it existed then). */
bool cli_written_since(const char *path, bool had, const struct stat *before) {
    struct stat now;
    return stat(path, &now) == 0 &&
           (!had || now.st_mtim.tv_sec != before->st_mtim.tv_sec ||
            now.st_mtim.tv_nsec != before->st_mtim.tv_nsec || now.st_ino != before->st_ino);
}

/* After a fit that did not finish: no empty figures folder stays behind. (The CSV log is
 * written only from the first completed epoch on: a fit that failed before it left an existing
 * log as it was, and one with epochs in it keeps them.) */
void cli_clean_up_partial(const char *plots, bool made_plots) {
    if (plots && made_plots) rmdir(plots); /* only when empty */
}

/* --max-restarts and --commit-every: in-place recovery of fork workers (the library's
 * .par.max_restarts); an MPI job cannot lose a rank and go on, so there a wrapper reruns it. */
int cli_check_restarts(const char *cmd, const train_args *a) {
    bool mpi = a->start && strcmp(a->start, "mpi") == 0;
    if (a->commit_every > 0 && a->max_restarts == 0)
        return cli_error(CLI_USAGE, cmd,
                         "--commit-every is how often --max-restarts commits the fit; give "
                         "--max-restarts N too");
    if (a->max_restarts > 0 && mpi)
        return cli_error(CLI_USAGE, cmd,
                         "--max-restarts restarts fork workers; under mpirun run the job with "
                         "corefit-mpirun --max-restarts %d (docs/mpi.md)",
                         a->max_restarts);
    if (a->max_restarts > 0 && a->cores == 1)
        return cli_error(CLI_USAGE, cmd,
                         "--max-restarts restarts fork workers: give --cores 2 or more (--cores 1 "
                         "trains in this process)");
    return CLI_OK;
}

cf_status cli_fit(const train_args *a, cf_learner *learn, bool parallel, const cf_par_opts *par,
                  double lr, cf_callback **cbs, int n_cbs) {
    cf_status st;
    if (!strcmp(a->schedule, "one-cycle"))
        st = parallel ? cf_par_fit_one_cycle(learn, a->epochs, .lr_max = CF_LR(lr), .par = *par,
                                             .cbs = cbs, .n_cbs = n_cbs, .resume = a->resume)
                      : cf_fit_one_cycle(learn, a->epochs, .lr_max = CF_LR(lr), .cbs = cbs,
                                         .n_cbs = n_cbs, .resume = a->resume);
    else if (!strcmp(a->schedule, "flat-cos"))
        st = parallel ? cf_par_fit_flat_cos(learn, a->epochs, .lr = CF_LR(lr), .par = *par,
                                            .cbs = cbs, .n_cbs = n_cbs, .resume = a->resume)
                      : cf_fit_flat_cos(learn, a->epochs, .lr = CF_LR(lr), .cbs = cbs,
                                        .n_cbs = n_cbs, .resume = a->resume);
    else if (!strcmp(a->schedule, "sgdr"))
        st = parallel
                 ? cf_par_fit_sgdr(learn, a->epochs, a->cycle_len, .lr_max = CF_LR(lr), .par = *par,
                                   .cbs = cbs, .n_cbs = n_cbs, .resume = a->resume)
                 : cf_fit_sgdr(learn, a->epochs, a->cycle_len, .lr_max = CF_LR(lr), .cbs = cbs,
                               .n_cbs = n_cbs, .resume = a->resume);
    else
        st = parallel
                 ? cf_par_fine_tune(learn, a->epochs, .base_lr = lr,
                                    .freeze_epochs = a->freeze_epochs ? a->freeze_epochs : -1,
                                    .par = *par, .cbs = cbs, .n_cbs = n_cbs, .resume = a->resume)
                 : cf_fine_tune(learn, a->epochs, .base_lr = lr,
                                .freeze_epochs = a->freeze_epochs ? a->freeze_epochs : -1,
                                .cbs = cbs, .n_cbs = n_cbs, .resume = a->resume);
    return st;
}

int cli_add_train_callbacks(const char *cmd, const train_args *a, cf_learner *learn) {
    /* master callbacks: the CSV log (rank 0 writes it) */
    if (a->csv_log) {
        cf_callback *cb = cf_csv_logger_cb(a->csv_log, false);
        if (!cb || cf_learner_add_master_cbs(learn, &cb, 1)) {
            return cli_lib_error(cmd, "CSV logger");
        }
    }
    /* fastai's TerminateOnNaN: a diverged fit stops and fails instead of saving NaN weights */
    cf_callback *nan_cb = cf_terminate_on_nan_cb();
    cf_callback *icb = cli_interrupt_cb();
    if (!nan_cb || cf_learner_add_cb(learn, nan_cb) || cf_learner_add_cb(learn, icb))
        return cli_lib_error(cmd, "callbacks");
    if (a->save_every_epoch) {
        cf_callback *cb = cli_save_epoch_cb(a->out);
        if (cf_learner_add_master_cbs(learn, &cb, 1)) {
            return cli_lib_error(cmd, "--save-every-epoch");
        }
    }
    /* no bars or messages, but the table; on every rank, as the other master callbacks: MPI
     * ranks must hold the same ones to take rank 0's learner state at the end */
    if (a->quiet) {
        cf_callback *cb = cf_progress_cb_to(NULL, NULL, 0);
        if (!cb || cf_learner_add_master_cbs(learn, &cb, 1)) {
            return cli_lib_error(cmd, "progress table");
        }
    }
    return CLI_OK;
}

int cli_choose_lr(const char *cmd, train_args *a, session *s, cli_figures *figs, double *lr) {
    char path[4096];
    if (a->lr && strcmp(a->lr, "auto") == 0) {
        cf_lr_find_result r;
        int rc = cli_run_lr_find(cmd, a, s, &r);
        if (rc) return rc;
        if (s->master) cli_print_suggestions(&r);
        if (!isfinite(r.valley) || !(r.valley > 0)) {
            cf_lr_find_result_free(&r);
            return cli_error(CLI_FAIL, cmd, "lr_find gave no valley suggestion; pass --lr");
        }
        *lr = r.valley;
        if (s->master) printf("lr: %.3e (lr_find's valley)\n", *lr);
        if (a->plots && s->master) {
            snprintf(path, sizeof path, "%s/lr_find.png", a->plots);
            cli_figure_done(cmd, figs, cf_plot_lr_find(&r, path), path, "lr_find");
        }
        cf_lr_find_result_free(&r);
    } else if (a->lr) {
        *lr = strtod(a->lr, NULL);
    }
    return CLI_OK;
}
