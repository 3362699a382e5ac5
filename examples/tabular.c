/* A tabular classifier from a CSV file, as fastai's TabularDataLoaders.from_csv and
 * tabular_learner: Categorify, FillMissing and Normalize, embeddings for the categorical
 * columns, fit_one_cycle, then predictions for a few rows.
 *
 *   example_tabular FILE.csv TARGET CAT_COLUMNS CONT_COLUMNS [EPOCHS]
 *
 * Column lists are comma-separated ("" for none), e.g.
 *   example_tabular adult.csv salary workclass,education age,fnlwgt 5 */
#include <corefit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cf_status st_ = (call);                                                                    \
        if (st_ != CF_OK) {                                                                        \
            fprintf(stderr, "error: %s\n", cf_last_error());                                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Splits "a,b,c" in place into names[]; returns the count. */
static int split(char *s, const char **names, int max) {
    int n = 0;
    for (char *t = strtok(s, ","); t && n < max; t = strtok(NULL, ",")) names[n++] = t;
    return n;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s FILE.csv TARGET CAT_COLUMNS CONT_COLUMNS [EPOCHS]\n", argv[0]);
        return 2;
    }
    const char *cat[32], *cont[32];
    int n_cat = split(argv[3], cat, 32), n_cont = split(argv[4], cont, 32);
    int epochs = argc > 5 ? atoi(argv[5]) : 3;

    /* TabularDataLoaders.from_csv(path, y_names=TARGET, cat_names, cont_names,
     * procs=[Categorify, FillMissing, Normalize]) with a random 20% validation split. */
    cf_dls *dls = NULL;
    cf_tabular_options topt = {.cat_names = cat,
                               .n_cat = n_cat,
                               .cont_names = cont,
                               .n_cont = n_cont,
                               .y_name = argv[2],
                               .valid_pct = 0.2,
                               .seed = 42};
    CHECK(cf_dls_from_csv(argv[1], &topt, &(cf_dls_options){.bs = 64, .seed = 42}, &dls));
    const cf_dataset *train = dls->train_ds;
    printf("%lld training and %lld validation rows, %d categorical columns (with _na flags), "
           "%d continuous, %d classes\n",
           (long long)train->n, (long long)dls->valid_ds->n, train->n_cat, train->n_cont,
           train->n_classes);

    /* tabular_learner(dls, layers=[200, 100], metrics=accuracy); one process, all threads. */
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    CHECK(cf_tabular_learner(&learn, dls, .metrics = metrics, .n_metrics = 1, .seed = 42));
    CHECK(cf_fit_one_cycle(learn, epochs, .lr_max = CF_LR(1e-2)));

    /* learn.predict on the first validation rows (already processed by the procs). */
    const cf_dataset *valid = dls->valid_ds;
    int n_feat = valid->sample_shape.dim[0];
    float probs[256];
    for (int64_t i = 0; i < valid->n && i < 5; i++) {
        int cls = 0;
        CHECK(cf_predict(learn, valid->x + i * n_feat, probs, &cls));
        printf("row %lld: predicted %s (%.3f), actual %s\n", (long long)i, valid->vocab[cls],
               probs[cls], valid->vocab[(int)valid->y[i]]);
    }
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}
