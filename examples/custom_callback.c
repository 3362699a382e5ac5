/* A custom callback and a custom metric, fastai style.
 *
 * The callback (fastai's Callback with before_fit / after_batch / after_epoch) counts the
 * training batches, keeps the largest loss it saw, and prints a line after each epoch; it runs in
 * every replica of a parallel fit but prints on the master only. It exports and imports its
 * state, so that what rank 0's copy counted comes home to the caller's callback after a
 * parallel fit (and is restored when a fit under MPI fails). The metric ("true_prob", the mean
 * probability the model gives the true class) is an AvgMetric: a function of one batch, averaged
 * over samples, reduced across cores by the par layer.
 *
 *   example_custom_callback [EPOCHS]
 *
 * COREFIT_EXAMPLE_LIMIT=N trains on the first N training and N/5 validation images. */
#include <corefit.h>

#include <math.h>
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

/* ---- the metric: mean softmax probability of the true class ---- */
static double true_prob(const cf_tensor *pred, const cf_tensor *targ, const bool *pad,
                        int *n_counted) {
    int n = pred->shape.dim[0], c = pred->shape.dim[1];
    double sum = 0;
    int counted = 0;
    for (int i = 0; i < n; i++) {
        if (pad && pad[i]) continue; /* wrap-around padding of a sharded validation set */
        const float *row = pred->data + (size_t)i * c;
        float mx = row[0];
        for (int k = 1; k < c; k++) mx = row[k] > mx ? row[k] : mx;
        double z = 0;
        for (int k = 0; k < c; k++) z += exp(row[k] - mx);
        sum += exp(row[(int)targ->data[i]] - mx) / z;
        counted++;
    }
    *n_counted = counted;
    return counted ? sum / counted : 0;
}

/* ---- the callback ---- */
typedef struct batch_stats {
    long batches;
    double worst_loss;
} batch_stats;

static cf_status stats_before_fit(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    batch_stats *s = cb->state;
    s->batches = 0;
    s->worst_loss = 0;
    return CF_OK;
}

static cf_status stats_after_batch(cf_callback *cb, cf_learner *learn) {
    batch_stats *s = cb->state;
    s->batches++;
    if (learn->loss_value > s->worst_loss) s->worst_loss = learn->loss_value;
    return CF_OK;
}

static cf_status stats_after_epoch(cf_callback *cb, cf_learner *learn) {
    batch_stats *s = cb->state;
    if (learn->replica.is_master && learn->logging)
        fprintf(
            stderr,
            "callback: epoch %d done, %ld training batches on this core, worst batch loss %.4f\n",
            learn->epoch, s->batches, s->worst_loss);
    return CF_OK;
}

/* The state as bytes: a magic and version of its own, then the two fields. import_state checks
 * them, so bytes meant for another callback are refused instead of misread. */
#define STATS_MAGIC 0x31535442u /* "BTS1" */
typedef struct stats_bytes {
    unsigned magic;
    batch_stats stats;
} stats_bytes;

static size_t stats_export(const cf_callback *cb, void *buf, size_t size) {
    if (buf && size >= sizeof(stats_bytes)) {
        stats_bytes b = {STATS_MAGIC, *(const batch_stats *)cb->state};
        memcpy(buf, &b, sizeof b);
    }
    return sizeof(stats_bytes);
}

static cf_status stats_import(cf_callback *cb, const void *buf, size_t size) {
    stats_bytes b;
    if (size != sizeof b) return cf_fail(CF_ERR_INVALID, "BatchStats: %zu bytes of state", size);
    memcpy(&b, buf, sizeof b);
    if (b.magic != STATS_MAGIC)
        return cf_fail(CF_ERR_INVALID, "BatchStats: offset 0: magic 0x%08x", b.magic);
    *(batch_stats *)cb->state = b.stats;
    return CF_OK;
}

static void stats_free(cf_callback *cb) {
    free(cb->state);
    free(cb);
}

static cf_callback *batch_stats_cb(void) {
    cf_callback *cb = calloc(1, sizeof *cb);
    if (!cb) return NULL;
    cb->name = "BatchStats";
    cb->order = CF_ORDER_DEFAULT;
    cb->skip_valid = true; /* after_batch counts training batches only */
    cb->state = calloc(1, sizeof(batch_stats));
    cb->free = stats_free;
    cb->export_state = stats_export;
    cb->import_state = stats_import;
    cb->on[CF_EV_BEFORE_FIT] = stats_before_fit;
    cb->on[CF_EV_AFTER_BATCH] = stats_after_batch;
    cb->on[CF_EV_AFTER_EPOCH] = stats_after_epoch;
    return cb;
}

int main(int argc, char **argv) {
    int epochs = argc > 1 ? atoi(argv[1]) : 1;
    const char *limit = getenv("COREFIT_EXAMPLE_LIMIT");
    cf_dataset *train = NULL, *valid = NULL;
    const char *dir = "/usr/share/datasets/fashion-mnist";
    char ti[512], tl[512], vi[512], vl[512];
    snprintf(ti, sizeof ti, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(tl, sizeof tl, "%s/train-labels-idx1-ubyte.gz", dir);
    snprintf(vi, sizeof vi, "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(vl, sizeof vl, "%s/t10k-labels-idx1-ubyte.gz", dir);
    CHECK(cf_dataset_from_idx(ti, tl, &train));
    CHECK(cf_dataset_from_idx(vi, vl, &valid));
    if (limit && atoi(limit) > 0) { /* small-data mode: the first N and N/5 images */
        int64_t n[2] = {atoi(limit), atoi(limit) / 5 > 0 ? atoi(limit) / 5 : 1};
        cf_dataset **sets[2] = {&train, &valid};
        for (int k = 0; k < 2; k++) {
            int64_t *idx = malloc((size_t)n[k] * sizeof *idx);
            for (int64_t i = 0; i < n[k]; i++) idx[i] = i;
            cf_dataset *sub = NULL;
            CHECK(cf_dataset_subset(*sets[k], idx, n[k], &sub));
            free(idx);
            cf_dataset_free(*sets[k]);
            *sets[k] = sub;
        }
    }
    cf_dls *dls = NULL;
    CHECK(cf_dls_new(
        train, valid,
        &(cf_dls_options){.bs = 64, .seed = 42, .n_norm = 1, .mean = {0.2860f}, .std = {0.3530f}},
        &dls));

    /* metrics=[accuracy, AvgMetric(true_prob)], cbs=[BatchStats()] */
    cf_metric *metrics[] = {cf_accuracy(), cf_avg_metric("true_prob", true_prob)};
    cf_callback *cbs[] = {batch_stats_cb()};
    cf_learner *learn = NULL;
    CHECK(cf_vision_learner(&learn, dls, CF_ARCH_MINI_RESNET, .metrics = metrics, .n_metrics = 2,
                            .cbs = cbs, .n_cbs = 1, .seed = 42));

    /* The callback travels with the learner into every worker. */
    CHECK(cf_par_fit_one_cycle(learn, epochs, .lr_max = CF_LR(3e-3)));
    /* ... and its state came home from rank 0 */
    const batch_stats *s = learn->cbs[0]->state;
    printf("callback: %ld training batches on rank 0, worst batch loss %.4f\n", s->batches,
           s->worst_loss);
    const cf_recorder *rec = &learn->recorder;
    const double *last = rec->values + (size_t)(rec->n_epochs - 1) * rec->n_values;
    printf("final: accuracy %.4f, true_prob %.4f\n", last[2], last[3]);
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}
