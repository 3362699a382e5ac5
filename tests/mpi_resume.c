/* Exact resume under mpirun (see mpi_resume.cmake): every rank runs the same fit_one_cycle as
 * an MPI twin (dropout, a random crop, flips and fastai's batch transforms on; BatchNorm
 * statistics per rank), once uninterrupted, once stopped on request after a batch (mid-epoch,
 * and after the last training batch of an epoch) — rank 0 writes the checkpoint, every rank
 * stops at the same batch — and once resumed from that checkpoint by a learner with other
 * initial weights. The resumed fit's weights, BatchNorm buffers, optimizer state and Recorder
 * must be bitwise the uninterrupted fit's on every rank.
 *
 *   mpi_resume DIR   DIR: a folder every rank can reach (rank 0 writes the checkpoint there)
 *
 * Exits non-zero on any failed check, naming the rank and the check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "corefit/learn.h"
#include "corefit/par.h"

static int rank, failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: line %d: ", rank, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

enum { N_EPOCH = 2, SIDE = 8 };

static cf_dataset *image_dataset(int64_t n, uint64_t seed) {
    size_t per = SIDE * SIDE;
    float *x = malloc((size_t)n * per * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (size_t i = 0; i < (size_t)n * per; i++) x[i] = (float)cf_rng_uniform(&rng);
    for (int64_t i = 0; i < n; i++) {
        const float *r = x + i * per;
        float a = r[0] + r[9] - r[18] - r[27], b = r[36] - r[45];
        y[i] = a > 0 ? 0 : (b > 0 ? 1 : 2);
    }
    cf_dataset *ds = NULL;
    if (cf_dataset_from_arrays(x, y, n, (cf_shape){3, {1, SIDE, SIDE}}, 1, 3, &ds) != CF_OK) {
        fprintf(stderr, "rank %d: dataset: %s\n", rank, cf_last_error());
        exit(1);
    }
    free(x);
    free(y);
    return ds;
}

static cf_aug_opts aug;

static cf_learner *learner(cf_dls *dls, uint64_t seed, const char *path) {
    cf_module *layers[] = {cf_conv2d(1, 4, 3, 1, 1, false),
                           cf_batchnorm2d(4),
                           cf_relu(),
                           cf_flatten(),
                           cf_dropout(0.3f),
                           cf_linear(4 * SIDE * SIDE, 3, true)};
    cf_model *m = NULL;
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    if (cf_model_new(&m, cf_sequential(6, layers), seed) != CF_OK ||
        cf_learner_new(&learn, dls, m, .quiet = true, .path = path, .metrics = metrics,
                       .n_metrics = 1, .wd = 0.05) != CF_OK) {
        fprintf(stderr, "rank %d: learner: %s\n", rank, cf_last_error());
        exit(1);
    }
    return learn;
}

static cf_status request_at(cf_callback *cb, cf_learner *learn) {
    if (learn->training && learn->train_iter == *(int64_t *)cb->state) cf_checkpoint_request();
    return CF_OK;
}
static void free_request(cf_callback *cb) {
    free(cb->state);
    free(cb);
}
static cf_callback *request_cb(int64_t at) {
    cf_callback *cb = calloc(1, sizeof *cb);
    int64_t *s = calloc(1, sizeof *s);
    *s = at;
    cb->name = "RequestStop";
    cb->state = s;
    cb->free = free_request;
    cb->on[CF_EV_AFTER_BATCH] = request_at;
    return cb;
}

static cf_status fit(cf_learner *learn, int64_t stop_at, const char *ckpt, const char *resume) {
    cf_callback *cbs[] = {request_cb(stop_at), cf_checkpoint_cb(.fname = ckpt)};
    return cf_par_fit_one_cycle(learn, N_EPOCH, .lr_max = CF_LR(2e-2), .cbs = cbs, .n_cbs = 2,
                                .resume = resume, .par.start_method = CF_START_MPI);
}

static void same(const cf_learner *a, const cf_learner *b, const char *what) {
    const cf_model *ma = a->model, *mb = b->model;
    size_t nw = ma->n_weights * sizeof(float);
    CHECK(!memcmp(ma->weights, mb->weights, nw), "%s: weights differ", what);
    CHECK(!memcmp(ma->buffers, mb->buffers, ma->n_buffers * sizeof(float)),
          "%s: BatchNorm buffers differ", what);
    CHECK(!memcmp(a->opt->grad_avg, b->opt->grad_avg, nw) &&
              !memcmp(a->opt->sqr_avg, b->opt->sqr_avg, nw) &&
              !memcmp(a->opt->steps, b->opt->steps, (size_t)ma->n_params * sizeof(float)),
          "%s: optimizer state differs", what);
    const cf_recorder *ra = &a->recorder, *rb = &b->recorder;
    bool rec =
        ra->n_batches == rb->n_batches && ra->n_epochs == rb->n_epochs && ra->n_hps == rb->n_hps;
    if (rec) {
        size_t nb = (size_t)ra->n_batches * sizeof(double);
        rec = !memcmp(ra->lrs, rb->lrs, nb) && !memcmp(ra->moms, rb->moms, nb) &&
              !memcmp(ra->losses, rb->losses, nb) &&
              !memcmp(ra->hp_lr, rb->hp_lr, (size_t)ra->n_hps * sizeof(double)) &&
              !memcmp(ra->values, rb->values,
                      (size_t)ra->n_epochs * (size_t)ra->n_values * sizeof(double)) &&
              !memcmp(ra->iters, rb->iters, (size_t)ra->n_epochs * sizeof(int64_t));
    }
    CHECK(rec, "%s: the Recorder differs", what);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: mpi_resume DIR\n");
        return 2;
    }
    cf_comm *comm = NULL;
    if (cf_par_mpi_comm(&comm) != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        return 1;
    }
    rank = cf_comm_rank(comm);
    cf_set_num_threads(1);
    const char *dir = argv[1];
    if (rank == 0) mkdir(dir, 0755);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/mpi.ckpt", dir);
    aug = cf_aug_transforms_defaults(1.0f);
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 8, .seed = 11, .crop_pad = 1, .flip = true, .aug = &aug};
    if (cf_dls_new(image_dataset(96, 1), image_dataset(24, 2), &o, &dls) != CF_OK) return 1;

    cf_learner *full = learner(dls, 3, dir);
    CHECK(fit(full, -1, ckpt, NULL) == CF_OK, "uninterrupted fit: %s", cf_last_error());
    int64_t per_epoch = full->recorder.n_batches / N_EPOCH;
    int64_t stops[] = {per_epoch / 2 + 1, per_epoch};
    for (int k = 0; k < 2 && !failures; k++) {
        char what[64];
        snprintf(what, sizeof what, "stopped after batch %lld", (long long)stops[k]);
        cf_learner *stopped = learner(dls, 3, dir);
        cf_status st = fit(stopped, stops[k], ckpt, NULL);
        CHECK(st != CF_OK && strstr(cf_last_error(), "resume"), "%s: status %d: %s", what, st,
              cf_last_error());
        cf_learner_free(stopped);
        cf_learner *resumed = learner(dls, 100 + (uint64_t)k, dir);
        st = fit(resumed, -1, ckpt, ckpt);
        CHECK(st == CF_OK, "%s: resume: %s", what, cf_last_error());
        if (st == CF_OK) same(full, resumed, what);
        cf_learner_free(resumed);
    }
    cf_learner_free(full);
    cf_dls_free(dls);
    if (!failures) printf("rank %d: resumed fits equal the uninterrupted fit\n", rank);
    return failures ? 1 : 0;
}
