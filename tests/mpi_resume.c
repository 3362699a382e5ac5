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
#include "mpi_check.h"
#include "resume_fixture.h"

static int rank;

enum { N_EPOCH = RESUME_N_EPOCH };

static cf_learner *learner(cf_dls *dls, uint64_t seed, const char *path) {
    cf_learner *learn = resume_learner(dls, seed, path);
    if (!learn) {
        fprintf(stderr, "rank %d: learner: %s\n", rank, cf_last_error());
        exit(1);
    }
    return learn;
}

static cf_status fit(cf_learner *learn, int64_t stop_at, const char *ckpt, const char *resume) {
    cf_callback *cbs[] = {resume_request_cb(stop_at), cf_checkpoint_cb(.fname = ckpt)};
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
    cf_aug_opts aug;
    cf_dls *dls = resume_dls(&aug);
    if (!dls) {
        fprintf(stderr, "rank %d: data: %s\n", rank, cf_last_error());
        return 1;
    }

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
