/* What corefit train prints after a fit, below fastai's table: the last epoch's results, the
 * time, the model file and the CSV log. */
#include "corefit.h"
#include "train.h"

#include <string.h>

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
