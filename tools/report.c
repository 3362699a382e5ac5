/* What corefit train prints after a fit, below fastai's table: the last epoch's results, the
 * time, the model file and the CSV log. */
#include "corefit.h"
#include "train.h"

#include <string.h>
#include <sys/stat.h>

void cli_print_summary(const train_args *a, const session *s, const cf_recorder *rec,
                       double seconds, int restarts) {
    if (rec->n_epochs > 0) {
        const double *last = rec->values + (size_t)(rec->n_epochs - 1) * rec->n_values;
        printf("result:");
        for (int j = 0; j < rec->n_values; j++) {
            char b[32];
            printf(" %s %s", rec->metric_names[j + 1], cf_format_float(last[j], b, sizeof b));
        }
        printf("\n");
    }
    char restarted[64] = "";
    if (restarts > 0) /* the workers were restarted in place (--max-restarts) */
        snprintf(restarted, sizeof restarted, ", %d restart%s", restarts, restarts == 1 ? "" : "s");
    /* the Recorder holds the last fit only: fine_tune's unfrozen one */
    int frozen = strcmp(a->schedule, "fine-tune") == 0 ? a->freeze_epochs : 0,
        epochs = frozen + rec->n_epochs;
    char phases[64] = "";
    if (frozen > 0)
        snprintf(phases, sizeof phases, ": %d frozen, %d unfrozen", frozen, rec->n_epochs);
    printf("time: %.1f s (%d epoch%s%s, %s%s)\n", seconds, epochs, epochs == 1 ? "" : "s", phases,
           s->par.start_method == CF_START_MPI ? "MPI"
           : s->parallel                       ? "fork workers"
                                               : "in-process",
           restarted);
    printf("model: %s\n", a->out);
    if (a->csv_log) printf("log: %s\n", a->csv_log);
}

int cli_report_stopped_fit(const char *cmd, int argc, char **argv, const train_args *a,
                           const session *s, cf_status st, int restarts, const cli_fit_files *f) {
    if (st && cli_terminated()) {
        /* pre-empted: the checkpoint holds the fit; say how to continue */
        int rc = cli_lib_error(cmd, "stopped by SIGTERM");
        if (s->master) {
            struct stat cs;
            if (stat(f->ckpt, &cs) == 0) cli_print_resume_hint(argc, argv, f->ckpt);
            cli_clean_up_partial(a->plots, f->made_plots);
        }
        return rc == CLI_OK ? CLI_FAIL : rc;
    }
    bool stopped = cli_interrupted() || st == CF_ERR_INTERRUPTED;
    int rc;
    if (stopped)
        rc = cli_error(CLI_INTERRUPTED, cmd, "interrupted (Ctrl-C)");
    else if (restarts > 0)
        rc = cli_error(CLI_FAIL, cmd, "training: %s (after %d restart%s, --max-restarts %d)",
                       cf_last_error(), restarts, restarts == 1 ? "" : "s", a->max_restarts);
    else
        rc = cli_lib_error(cmd, "training");
    if (s->master) {
        /* a worker process wrote it (its count stays there): look at the file */
        bool rewritten = cli_written_since(a->out, f->had_out, &f->out_before);
        if (a->save_every_epoch && (cli_epochs_saved() > 0 || rewritten))
            fprintf(stderr, "corefit %s: %s holds the model of the last completed epoch\n", cmd,
                    a->out);
        else
            fprintf(stderr, "corefit %s: no model written%s\n", cmd,
                    a->save_every_epoch ? " (no epoch completed)"
                                        : " (--save-every-epoch keeps each completed epoch's)");
        /* a lost worker (or a failed one) leaves this run's last checkpoint: say how to
         * go on from it (--max-restarts does that by itself) */
        if (!stopped && st == CF_ERR_WORKER &&
            cli_written_since(f->ckpt, f->had_ckpt, &f->ckpt_before)) {
            fprintf(stderr,
                    "corefit %s: checkpoint %s holds the fit up to its last batch "
                    "checkpoint\n",
                    cmd, f->ckpt);
            cli_print_resume_hint(argc, argv, f->ckpt);
        }
        cli_clean_up_partial(a->plots, f->made_plots);
    }
    return rc;
}
