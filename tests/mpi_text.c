/* The cf_par_ twins with start_method mpi on text learners, run under mpirun (mpi_fit.cmake).
 *
 *   mpi_text lm     an AWD-LSTM language model with fastai's dropouts: fit_one_cycle, fit,
 *                   fine_tune, validate, get_preds and lr_find with split batches, each rank
 *                   carrying the hidden state of its own loader rows; every rank ends with
 *                   rank 0's state (the ranks start from different models: rank 0's is
 *                   broadcast) and equals one process running the same calls to 1e-5: weights,
 *                   optimizer state, Recorder, a tracker's and a user's callback state, the
 *                   validation values, the predictions and the lr_find curve.
 *   mpi_text clas   a ULMFiT classifier (synchronised BatchNorm in the head) the same way;
 *                   get_preds of the length-sorted validation loader comes back in document
 *                   order.
 *
 * Exits non-zero on any failed check, naming the rank and the check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "counting_corpus.h"
#include "mpi_check.h"
#include "tally_cb.h"

static int rank, world;

#define OK(call) CHECK((call) == CF_OK, "%s: %s", #call, cf_last_error())

static void die(const char *what) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, cf_last_error());
    exit(1);
}

enum { VOCAB = 40, CLAS_BPTT = 4, CLAS_MAX_LEN = 8 };

/* The counting corpus (counting_corpus.h); whole_chunks > 0: every length a multiple of it. With
 * labels: the third of the vocabulary the document starts in. */
static cf_text_corpus *make_corpus(int n_docs, uint64_t seed, int whole_chunks, bool labels) {
    cf_text_corpus *c = counting_corpus(n_docs, seed, whole_chunks, VOCAB);
    if (!c) die("corpus");
    if (labels && counting_corpus_label(c, VOCAB) != CF_OK) die("labels");
    return c;
}

static cf_dls *make_dls(bool lm) {
    cf_text_corpus *train = make_corpus(24, lm ? 1 : 21, lm ? 0 : CLAS_BPTT, !lm),
                   *valid = make_corpus(8, lm ? 2 : 22, lm ? 0 : CLAS_BPTT, !lm);
    cf_dls *dls = NULL;
    cf_text_dls_options o = {
        .bs = 6, .seq_len = lm ? 7 : CLAS_BPTT, .seed = 3, .is_lm = lm, .prefetch = -1};
    if (cf_text_dls_new(train, valid, &o, &dls) != CF_OK) die("dls");
    cf_text_corpus_free(train);
    cf_text_corpus_free(valid);
    return dls;
}

/* Small sizes, fastai's dropouts (their masks are keyed to the fit's position, so the same
 * across ranks), an early-stopping tracker and a tally. */
static cf_learner *make_learner(cf_dls *dls, bool lm, uint64_t seed) {
    cf_awd_lstm_config c = lm ? cf_awd_lstm_lm_config() : cf_awd_lstm_clas_config();
    c.emb_sz = lm ? 12 : 8;
    c.n_hid = lm ? 20 : 12;
    c.n_layers = lm ? 2 : 3;
    cf_learner *learn = NULL;
    cf_status st;
    if (lm) {
        cf_metric *metrics[] = {cf_accuracy(), cf_perplexity()};
        st = cf_language_model_learner(&learn, dls, .config = &c, .seed = seed, .quiet = true,
                                       .metrics = metrics, .n_metrics = 2);
    } else {
        const int lin_ftrs[] = {6};
        cf_metric *metrics[] = {cf_accuracy()};
        st = cf_text_classifier_learner(&learn, dls, .config = &c, .seed = seed,
                                        .seq_len = CLAS_BPTT, .max_len = CLAS_MAX_LEN,
                                        .lin_ftrs = lin_ftrs, .n_lin_ftrs = 1, .quiet = true,
                                        .metrics = metrics, .n_metrics = 1);
    }
    if (st != CF_OK) die("learner");
    if (cf_learner_add_cb(learn, cf_early_stopping_cb(.patience = 5)) != CF_OK ||
        cf_learner_add_cb(learn, tally_cb()) != CF_OK)
        die("callbacks");
    return learn;
}

/* What one run of the twins leaves behind. */
typedef struct outcome {
    cf_learner *learn;
    cf_recorder fit_rec; /* the Recorder of the last fit (lr_find replaces it) */
    unsigned char cb_state[2][128];
    size_t cb_bytes[2];
    double values[3];
    cf_preds preds;
    cf_lr_find_result lr;
} outcome;

/* par NULL: one process (cf_fit_...); otherwise the cf_par_ twins with those options. */
static void run_all(outcome *o, bool lm, const cf_par_opts *par) {
    cf_learner *l = o->learn;
    if (par) {
        OK(cf_par_fit_one_cycle(l, 1, .lr_max = CF_LR(3e-3), .par = *par));
        OK(cf_par_fit(l, 1, .lr = CF_LR(1e-3), .par = *par));
        if (lm) OK(cf_par_fine_tune(l, 1, .base_lr = 2e-3, .freeze_epochs = 1, .par = *par));
    } else {
        OK(cf_fit_one_cycle(l, 1, .lr_max = CF_LR(3e-3)));
        OK(cf_fit(l, 1, .lr = CF_LR(1e-3)));
        if (lm) OK(cf_fine_tune(l, 1, .base_lr = 2e-3, .freeze_epochs = 1));
    }
    OK(cf_recorder_copy(&o->fit_rec, &l->recorder));
    for (int i = 0; i < 2; i++)
        o->cb_bytes[i] =
            l->cbs[l->n_cbs - 2 + i]->export_state(l->cbs[l->n_cbs - 2 + i], o->cb_state[i], 128);
    if (par) {
        OK(cf_par_validate(l, o->values, .par = *par));
        OK(cf_par_get_preds(l, &o->preds, .with_decoded = true, .with_loss = true, .par = *par));
        OK(cf_par_lr_find(l, &o->lr, .num_it = 6, .no_stop_div = true, .par = *par));
    } else {
        OK(cf_validate(l, o->values));
        OK(cf_get_preds(l, &o->preds, .with_decoded = true, .with_loss = true));
        OK(cf_lr_find(l, &o->lr, .num_it = 6, .no_stop_div = true));
    }
}

static void free_outcome(outcome *o) {
    cf_recorder_clear(&o->fit_rec);
    cf_preds_free(&o->preds);
    cf_lr_find_result_free(&o->lr);
    cf_learner_free(o->learn);
}

/* Largest |a - b| / max(|b|, floor). */
static double max_rel(const float *a, const float *b, size_t n, double floor) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), floor);
        if (!(d <= worst)) worst = d; /* NaN counts as the worst */
    }
    return worst;
}

static void check_doubles(const char *what, const double *a, const double *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(a[i] - b[i]) <= 1e-5 * fmax(1, fabs(b[i])))) {
            CHECK(0, "%s[%lld]: mpi %.10g, one process %.10g", what, (long long)i, a[i], b[i]);
            return;
        }
}

static int equivalence(cf_comm *comm, bool lm) {
    const char *what = lm ? "language model" : "classifier";
    /* Adam turns the rounding noise of near-zero gradients (the replicas' sums add in another
     * order) into steps of ~1e-7: weights are compared relative to at least this */
    const double floor = lm ? 1e-3 : 1e-2;
    cf_dls *dls = make_dls(lm);
    outcome one = {.learn = make_learner(dls, lm, 13)};
    run_all(&one, lm, NULL);
    /* ranks build different models: the fits start from rank 0's */
    outcome mpi = {.learn = make_learner(dls, lm, 13 + 1000 * (uint64_t)rank)};
    cf_par_opts par = {.start_method = CF_START_MPI, .split_batch = true, .sync_bn = !lm};
    run_all(&mpi, lm, &par);

    cf_model *m = mpi.learn->model, *r = one.learn->model;
    check_same_everywhere(comm, "weights", m->weights, m->n_weights * sizeof(float));
    check_same_everywhere(comm, "grad_avg", mpi.learn->opt->grad_avg, m->n_weights * sizeof(float));
    check_same_everywhere(comm, "validate", mpi.values, sizeof mpi.values);
    check_same_everywhere(comm, "preds", mpi.preds.preds.data,
                          cf_tensor_numel(&mpi.preds.preds) * sizeof(float));
    check_same_everywhere(comm, "lr_find losses", mpi.lr.losses, (size_t)mpi.lr.n * sizeof(double));
    for (int i = 0; i < 2; i++) check_same_everywhere(comm, "callback state", mpi.cb_state[i], 128);

    /* lr_find put the weights back: those of the fits */
    double w = max_rel(m->weights, r->weights, r->n_weights, floor);
    CHECK(w <= 1e-5, "%s, %d ranks: weights differ from one process's by %.3g", what, world, w);
    /* the classifier's head has gradients near 0 whose rounding (~1e-7 absolute) differs with the
     * order of the replicas' sums: its moving averages are compared relative to at least 1e-2,
     * as its weights are */
    const double gfloor = lm ? 1e-4 : 1e-2;
    double g = max_rel(mpi.learn->opt->grad_avg, one.learn->opt->grad_avg, r->n_weights, gfloor);
    if (!(g <= 1e-4)) {
        const char *worst = "";
        double gmax = 0;
        for (int i = 0; i < r->n_params; i++) {
            const cf_param *p = r->params[i];
            if (p->kind == CF_PARAM_BUFFER || p->kind == CF_PARAM_COUNTER) continue;
            double d = max_rel(mpi.learn->opt->grad_avg + p->offset,
                               one.learn->opt->grad_avg + p->offset, p->numel, gfloor);
            if (d > gmax) gmax = d, worst = p->full_name;
        }
        CHECK(0, "%s, %d ranks: optimizer state differs by %.3g (most in %s)", what, world, g,
              worst);
    }
    const cf_recorder *a = &mpi.fit_rec, *b = &one.fit_rec;
    CHECK(a->n_epochs == b->n_epochs && a->n_batches == b->n_batches && a->n_values == b->n_values,
          "%s: recorder of %d epochs, %lld batches; one process %d, %lld", what, a->n_epochs,
          (long long)a->n_batches, b->n_epochs, (long long)b->n_batches);
    if (a->n_epochs == b->n_epochs && a->n_values == b->n_values) {
        check_doubles("recorder values", a->values, b->values, (int64_t)a->n_epochs * a->n_values);
        check_doubles("recorder losses", a->losses, b->losses, a->n_batches);
        check_doubles("recorder lrs", a->lrs, b->lrs, a->n_batches);
    }
    for (int i = 0; i < 2; i++) {
        CHECK(mpi.cb_bytes[i] == one.cb_bytes[i], "callback %d: %zu bytes, one process %zu", i,
              mpi.cb_bytes[i], one.cb_bytes[i]);
        /* the tracker's best value is its last 8 bytes, compared to 1e-5 */
        const size_t exact = i == 0 ? one.cb_bytes[0] - 8 : one.cb_bytes[i];
        CHECK(memcmp(mpi.cb_state[i], one.cb_state[i], exact) == 0,
              "%s: callback %d's state differs from one process's", what, i);
    }
    {
        double ba, bb;
        memcpy(&ba, mpi.cb_state[0] + one.cb_bytes[0] - 8, 8);
        memcpy(&bb, one.cb_state[0] + one.cb_bytes[0] - 8, 8);
        check_doubles("tracker best", &ba, &bb, 1);
    }
    const tally *t = (const tally *)mpi.cb_state[1];
    CHECK(t->epochs == (lm ? 4 : 2) && t->batches > 0, "tally: %lld epochs, %lld batches",
          (long long)t->epochs, (long long)t->batches);
    check_doubles("validate", mpi.values, one.values, lm ? 3 : 2);

    CHECK(mpi.preds.n == one.preds.n, "preds: %lld rows, one process %lld", (long long)mpi.preds.n,
          (long long)one.preds.n);
    if (mpi.preds.n == one.preds.n) {
        const size_t n = (size_t)one.preds.n;
        double p = max_rel(mpi.preds.preds.data, one.preds.preds.data,
                           cf_tensor_numel(&one.preds.preds), 1e-2);
        CHECK(p <= 1e-5, "%s: predictions differ by %.3g", what, p);
        CHECK(memcmp(mpi.preds.targs.data, one.preds.targs.data, n * sizeof(float)) == 0,
              "%s: targets differ", what);
        CHECK(memcmp(mpi.preds.decoded, one.preds.decoded, n * sizeof(int64_t)) == 0,
              "%s: decoded differ", what);
        double l = max_rel(mpi.preds.losses, one.preds.losses, n, 1e-2);
        CHECK(l <= 1e-5, "%s: losses differ by %.3g", what, l);
    }
    if (!lm) {
        /* the validation loader is sorted by length; the predictions are in document order */
        const cf_text_corpus *c = cf_text_loader_corpus(dls->valid);
        CHECK(mpi.preds.n == c->n_docs, "classifier: %lld predictions for %lld documents",
              (long long)mpi.preds.n, (long long)c->n_docs);
        for (int64_t d = 0; d < c->n_docs && d < mpi.preds.n; d++)
            CHECK(mpi.preds.targs.data[d] == c->targets[d],
                  "classifier: prediction %lld has target %g, document %lld's is %g", (long long)d,
                  mpi.preds.targs.data[d], (long long)d, c->targets[d]);
        int64_t lens_sorted = 1;
        for (int64_t d = 1; d < c->n_docs; d++)
            if (c->offsets[d + 1] - c->offsets[d] > c->offsets[d] - c->offsets[d - 1])
                lens_sorted = 0;
        CHECK(!lens_sorted, "the documents are already sorted by length: the check shows nothing");
    } else {
        /* the language model's rows: row k predicts stream token k + 1 */
        const cf_text_corpus *c = cf_text_loader_corpus(dls->valid);
        for (int64_t k = 0; k < mpi.preds.n; k++)
            if (mpi.preds.targs.data[k] != (float)c->ids[k + 1]) {
                CHECK(0, "language model: prediction %lld's target is not stream token %lld",
                      (long long)k, (long long)k + 1);
                break;
            }
    }
    CHECK(mpi.lr.n == one.lr.n && one.lr.n == 6, "lr_find: %d points, one process %d", mpi.lr.n,
          one.lr.n);
    if (mpi.lr.n == one.lr.n) {
        check_doubles("lr_find lrs", mpi.lr.lrs, one.lr.lrs, one.lr.n);
        check_doubles("lr_find losses", mpi.lr.losses, one.lr.losses, one.lr.n);
    }
    if (rank == 0 && !failures)
        printf("mpi text (%s): %d ranks equal one process to 1e-5 (weights, optimizer, recorder, "
               "callbacks, validate, get_preds, lr_find)\n",
               what, world);
    free_outcome(&mpi);
    free_outcome(&one);
    cf_dls_free(dls);
    return failures;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "lm";
    cf_comm *comm = NULL;
    if (cf_par_mpi_comm(&comm) != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        return 1;
    }
    rank = cf_comm_rank(comm);
    world = cf_comm_size(comm);
    if (strcmp(mode, "lm") == 0) return equivalence(comm, true) ? 1 : 0;
    if (strcmp(mode, "clas") == 0) return equivalence(comm, false) ? 1 : 0;
    fprintf(stderr, "usage: mpi_text lm | clas\n");
    return 2;
}
