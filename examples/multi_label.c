/* Multi-label classification the fastai way: ImageDataLoaders.from_csv with label_delim (each
 * image has a set of labels), vision_learner with BCEWithLogitsLossFlat and accuracy_multi,
 * fit_one_cycle on every core, then the label sets it predicts.
 *
 *   example_multi_label DATA_DIR [OUT_DIR] [EPOCHS]
 *
 * DATA_DIR holds labels.csv (fname, labels separated by spaces, is_valid) and the images it
 * names, e.g. as written by `corefit fmnist-tasks multi-label DATA_DIR`.
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
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR [OUT_DIR] [EPOCHS]\n", argv[0]);
        return 2;
    }
    const char *data = argv[1], *out = argc > 2 ? argv[2] : ".";
    int epochs = argc > 3 ? atoi(argv[3]) : 1;
    char path[1024];
    mkdir(out, 0777);

    /* ImageDataLoaders.from_csv(path, 'labels.csv', fn_col='fname', label_col='labels',
     * label_delim=' ', valid_col='is_valid') */
    snprintf(path, sizeof path, "%s/labels.csv", data);
    cf_image_folder_options io = {.channels = 1, .size = 56};
    cf_dataset *train = NULL, *valid = NULL;
    CHECK(cf_datasets_from_image_csv_multi(path, NULL, "fname", "labels", "is_valid", " ", &io,
                                           &train, &valid));
    printf("%lld training and %lld validation images, %d labels\n", (long long)train->n,
           (long long)valid->n, train->n_classes);

    cf_dls_options dopt = {.bs = 16, .seed = 42, .n_norm = 1};
    CHECK(cf_dataset_channel_stats(train, dopt.mean, dopt.std));
    cf_dls *dls = NULL;
    CHECK(cf_dls_new(train, valid, &dopt, &dls));

    /* vision_learner(dls, simple_cnn, metrics=[accuracy_multi, F1ScoreMulti()]): multi-hot
     * targets give BCEWithLogitsLossFlat, as fastai's MultiCategoryBlock does */
    cf_metric *metrics[] = {cf_accuracy_multi(0.5f, false),
                            cf_f1_score_multi(train->n_classes, CF_AVERAGE_MACRO)};
    cf_learner *learn = NULL;
    CHECK(cf_vision_learner(&learn, dls, CF_ARCH_SIMPLE_CNN, .metrics = metrics, .n_metrics = 2,
                            .seed = 42));
    CHECK(cf_par_fit_one_cycle(learn, epochs, .lr_max = CF_LR(1e-2)));
    printf("valid_loss %.4f, accuracy_multi %.4f, f1_score %.4f\n", learn->final_record[0],
           learn->final_record[1], learn->final_record[2]);

    /* learn.get_preds(): sigmoid probabilities; decodes: the labels with p > 0.5 */
    cf_preds p = {0};
    CHECK(cf_par_get_preds(learn, &p));
    const int c = train->n_classes;
    float *sets = malloc(sizeof(float) * (size_t)(p.n * c));
    if (!sets || cf_learner_decodes(learn, p.preds.data, p.n, 0, 0, sets) == 0) {
        fprintf(stderr, "error: decoding the predictions\n");
        return 1;
    }
    for (int64_t i = 0; i < p.n && i < 3; i++) {
        char want[256], got[256];
        cf_label_set_str(p.targs.data + i * c, c, dls->train_ds->vocab, ";", want, sizeof want);
        cf_label_set_str(sets + i * c, c, dls->train_ds->vocab, ";", got, sizeof got);
        printf("image %lld: labels %s, predicted %s\n", (long long)i, want, got[0] ? got : "-");
    }
    free(sets);
    cf_preds_free(&p);

    snprintf(path, sizeof path, "%s/multi_label.safetensors", out);
    CHECK(cf_learner_export(learn, path));
    printf("wrote %s\n", path);
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}
