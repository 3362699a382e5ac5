/* corefit's quick start: ordinary fastai-style setup, then the same fit on every core, with a
 * master callback, and the Recorder's plots drawn in the caller.
 *
 *   example_quickstart [OUT_DIR] [EPOCHS]
 *
 * COREFIT_EXAMPLE_LIMIT=N trains on the first N training and N/5 validation images (a quick run).
 */
#include <corefit.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cf_status st_ = (call);                                                                    \
        if (st_ != CF_OK) {                                                                        \
            fprintf(stderr, "error: %s\n", cf_last_error());                                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    const char *out = argc > 1 ? argv[1] : ".";
    int epochs = argc > 2 ? atoi(argv[2]) : 1;
    const char *limit = getenv("COREFIT_EXAMPLE_LIMIT");
    char path[1024];
    mkdir(out, 0777); /* the figures and the model go here */

    /* DataLoaders: Fashion-MNIST as Debian installs it, normalised, bs 64 per core. */
    cf_dls *dls = NULL;
    cf_dls_options dopt = {.bs = 64, .seed = 42, .n_norm = 1, .mean = {0.2860f}, .std = {0.3530f}};
    if (limit && atoi(limit) > 0) { /* fastai's dls.train.n and dls.valid.n */
        dopt.n_train = atoi(limit);
        dopt.n_valid = dopt.n_train / 5 > 0 ? dopt.n_train / 5 : 1;
    }
    CHECK(cf_dls_from_idx_dir("/usr/share/datasets/fashion-mnist", &dopt, &dls));

    /* A vision learner with the W1 model and accuracy, as in fastai. */
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    CHECK(cf_vision_learner(&learn, dls, CF_ARCH_MINI_RESNET, .metrics = metrics, .n_metrics = 1,
                            .path = out, .seed = 42));

    /* A master callback: only rank 0 saves the best model. */
    cf_callback *save[] = {cf_save_model_cb(.monitor = "accuracy")};
    CHECK(cf_learner_add_master_cbs(learn, save, 1));

    /* lr_find on every core, then fit_one_cycle on every core. */
    cf_lr_find_result lr;
    /* (small-data mode sweeps 30 batches instead of fastai's 100) */
    CHECK(cf_par_lr_find(learn, &lr, .num_it = limit && atoi(limit) > 0 ? 30 : 0));
    printf("lr_find: valley %.2e\n", lr.valley);
    snprintf(path, sizeof path, "%s/lr_find.png", out);
    if (cf_plot_lr_find(&lr, path) == CF_OK) printf("wrote %s\n", path);
    cf_lr_find_result_free(&lr);

    CHECK(cf_par_fit_one_cycle(learn, epochs, .lr_max = CF_LR(3e-3)));

    /* The Recorder came home: plot it here. */
    snprintf(path, sizeof path, "%s/loss.png", out);
    if (cf_plot_loss(&learn->recorder, path, NULL) == CF_OK) printf("wrote %s\n", path);
    snprintf(path, sizeof path, "%s/schedule.png", out);
    if (cf_plot_sched(&learn->recorder, path) == CF_OK) printf("wrote %s\n", path);

    /* So did the weights. */
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    CHECK(cf_learner_export(learn, path));
    printf("wrote %s\n", path);

    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}
