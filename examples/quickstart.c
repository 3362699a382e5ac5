/* The seed's exemplar in C: ordinary fastai-style setup, then the same fit on every core, with
 * a master callback, and the Recorder's plots drawn in the caller.
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

/* Keeps the first n training and n/5 validation samples of dls (small-data mode). */
static cf_status limit_dls(cf_dls **dls, int64_t n, const cf_dls_options *opt) {
    cf_dataset *part[2] = {NULL, NULL};
    int64_t count[2] = {n, n / 5 > 0 ? n / 5 : 1};
    const cf_dataset *from[2] = {(*dls)->train_ds, (*dls)->valid_ds};
    for (int k = 0; k < 2; k++) {
        if (count[k] > from[k]->n) count[k] = from[k]->n;
        int64_t *idx = malloc((size_t)count[k] * sizeof *idx);
        for (int64_t i = 0; idx && i < count[k]; i++) idx[i] = i;
        cf_status st = idx ? cf_dataset_subset(from[k], idx, count[k], &part[k]) : CF_ERR_NOMEM;
        free(idx);
        if (st != CF_OK) {
            cf_dataset_free(part[0]);
            return st;
        }
    }
    cf_dls_free(*dls);
    return cf_dls_new(part[0], part[1], opt, dls);
}

int main(int argc, char **argv) {
    const char *out = argc > 1 ? argv[1] : ".";
    int epochs = argc > 2 ? atoi(argv[2]) : 1;
    const char *limit = getenv("COREFIT_EXAMPLE_LIMIT");
    char path[1024];
    mkdir(out, 0777); /* the figures and the model go here */

    /* DataLoaders: Fashion-MNIST as Debian installs it, normalised, bs 64 per core. */
    cf_dls *dls = NULL;
    cf_dls_options dopt = {.bs = 64, .seed = 42, .n_norm = 1, .mean = {0.2860f}, .std = {0.3530f}};
    CHECK(cf_dls_from_idx_dir("/usr/share/datasets/fashion-mnist", &dopt, &dls));
    if (limit && atoi(limit) > 0) CHECK(limit_dls(&dls, atoi(limit), &dopt));

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
