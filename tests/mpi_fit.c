/* The cf_par_ twins with start_method mpi, run under mpirun (see mpi_fit.cmake).
 *
 *   mpi_fit equiv   every rank trains (ranks build different models: rank 0's is broadcast),
 *                   then lr_find, get_preds and validate under MPI; every rank must end with the
 *                   same state, and rank 0 repeats the same calls with start_method fork and
 *                   the same world size and seed, and checks that everything agrees to 1e-6.
 *   mpi_fit hosts   the same, one rank per host (tests/netns_two_hosts.sh).
 *                   The callbacks' state (trackers, a user's counter) is rank 0's everywhere
 *                   and equals fork's; ShowGraph's figures are drawn once, by rank 0, from the
 *                   whole run, and their paths are in every rank's learner. With sync_bn and
 *                   split batches every rank's weights and BatchNorm buffers equal one
 *                   process's to 1e-5.
 *   mpi_fit fail R  rank R's callback fails mid-fit: every rank returns an error at once (the
 *                   others "rank R failed: ..."), every rank's learner is byte for byte its
 *                   state before the call (weights, optimizer, Recorder, callbacks' state),
 *                   then the group runs another fit normally;
 *                   ranks calling different collectives get an error, not a hang.
 *   mpi_fit hang    rank 1 stops answering: rank 0's collective passes its deadline and the
 *                   job ends (MPI_Abort) with a message; the ctest expects that message.
 *   mpi_fit crash   rank 1 kills itself: mpirun ends the job.
 *
 * Exits non-zero on any failed check, naming the rank and the check. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/learn.h"
#include "corefit/par.h"
#include "corefit/plot.h"
#include "mpi_check.h"
#include "tally_cb.h"

static int rank, world;

#define OK(call) CHECK((call) == CF_OK, "%s: %s", #call, cf_last_error())

/* ---- fixture: 4 features, 3 classes from a fixed linear rule -------------------------------- */

static cf_dataset *dataset(int64_t n, uint64_t seed) {
    float *x = malloc((size_t)n * 4 * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (int64_t i = 0; i < n * 4; i++) x[i] = (float)(2 * cf_rng_uniform(&rng) - 1);
    for (int64_t i = 0; i < n; i++) {
        const float *r = x + i * 4;
        float s0 = r[0] + 0.5f * r[1], s1 = r[2] - r[3], s2 = 0.3f * r[1] + r[3];
        y[i] = s0 > s1 ? (s0 > s2 ? 0 : 2) : (s1 > s2 ? 1 : 2);
    }
    cf_dataset *ds = NULL;
    if (cf_dataset_from_arrays(x, y, n, cf_shape1(4), 1, 3, &ds) != CF_OK) {
        fprintf(stderr, "rank %d: dataset: %s\n", rank, cf_last_error());
        exit(1);
    }
    free(x);
    free(y);
    return ds;
}

static cf_dls *make_dls(int64_t n_train, int64_t n_valid, int bs) {
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = bs, .seed = 7};
    if (cf_dls_new(dataset(n_train, 1), dataset(n_valid, 2), &o, &dls) != CF_OK) {
        fprintf(stderr, "rank %d: dls: %s\n", rank, cf_last_error());
        exit(1);
    }
    return dls;
}

/* Linear(4,16) -> BatchNorm1d(16) -> ReLU -> Linear(16,3), accuracy; the first Linear's bias
 * optional. */
static cf_learner *make_learner_ex(cf_dls *dls, uint64_t seed, bool bias) {
    cf_module *layers[] = {cf_linear(4, 16, bias), cf_batchnorm1d(16), cf_relu(),
                           cf_linear(16, 3, true)};
    cf_model *m = NULL;
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    if (cf_model_new(&m, cf_sequential(4, layers), seed) != CF_OK ||
        cf_learner_new(&learn, dls, m, .quiet = true, .metrics = metrics, .n_metrics = 1) !=
            CF_OK) {
        fprintf(stderr, "rank %d: learner: %s\n", rank, cf_last_error());
        exit(1);
    }
    return learn;
}

static cf_learner *make_learner(cf_dls *dls, uint64_t seed) {
    return make_learner_ex(dls, seed, true);
}

static bool close_to(double a, double b, double tol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return fabs(a - b) <= tol * (1 + fabs(b));
}

static void check_floats(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!close_to(a[i], b[i], 1e-6)) {
            CHECK(0, "%s[%zu]: mpi %.9g, fork %.9g", what, i, a[i], b[i]);
            return;
        }
}

static void check_doubles(const char *what, const double *a, const double *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!close_to(a[i], b[i], 1e-6)) {
            CHECK(0, "%s[%zu]: mpi %.12g, fork %.12g", what, i, a[i], b[i]);
            return;
        }
}

/* Trackers and a tally on the learner, a tally among its master callbacks. */
static void add_stateful_cbs(cf_learner *learn) {
    OK(cf_learner_add_cb(learn, cf_early_stopping_cb(.patience = 5)));
    OK(cf_learner_add_cb(learn, cf_reduce_lr_on_plateau_cb(.monitor = "accuracy", .patience = 1)));
    OK(cf_learner_add_cb(learn, tally_cb()));
    cf_callback *m[] = {tally_cb()};
    OK(cf_learner_add_master_cbs(learn, m, 1));
}

static size_t cb_state(const cf_callback *cb, unsigned char *buf, size_t size) {
    size_t n = cb->export_state(cb, buf, size);
    CHECK(n <= size, "%s: state of %zu bytes", cb->name, n);
    return n;
}

typedef struct outcome {
    cf_learner *learn;
    cf_lr_find_result lr;
    cf_preds preds;
    cf_preds tta; /* no augmentation on these tables: tta equals get_preds */
    double values[2];
} outcome;

static void run_all(outcome *o, cf_start_method method, int cores) {
    cf_par_opts par = {.start_method = method, .num_cores = cores};
    OK(cf_par_fit_one_cycle(o->learn, 2, .lr_max = CF_LR(1e-2), .par = par));
    OK(cf_par_lr_find(o->learn, &o->lr, .num_it = 12, .no_stop_div = true, .par = par));
    OK(cf_par_get_preds(o->learn, &o->preds, .with_decoded = true, .with_loss = true, .par = par));
    OK(cf_par_tta(o->learn, &o->tta, .n = 2, .par = par));
    OK(cf_par_validate(o->learn, o->values, .par = par));
}

static void free_outcome(outcome *o) {
    cf_lr_find_result_free(&o->lr);
    cf_preds_free(&o->preds);
    cf_preds_free(&o->tta);
    cf_learner_free(o->learn);
}

static int equivalence(cf_comm *comm) {
    cf_dls *dls = make_dls(96, 22, 8);
    /* Ranks build different models: the fit starts from rank 0's. */
    outcome mpi = {.learn = make_learner(dls, 21 + 1000 * (uint64_t)rank)};
    double t0 = cf_now();
    run_all(&mpi, CF_START_MPI, 0);
    double t_mpi = cf_now() - t0;
    cf_model *m = mpi.learn->model;
    check_same_everywhere(comm, "weights", m->weights, m->n_weights * sizeof(float));
    check_same_everywhere(comm, "buffers", m->buffers, m->n_buffers * sizeof(float));
    check_same_everywhere(comm, "grad_avg", mpi.learn->opt->grad_avg, m->n_weights * sizeof(float));
    check_same_everywhere(comm, "preds", mpi.preds.preds.data,
                          cf_tensor_numel(&mpi.preds.preds) * sizeof(float));
    check_same_everywhere(comm, "decoded", mpi.preds.decoded,
                          (size_t)mpi.preds.n * sizeof(int64_t));
    check_same_everywhere(comm, "lr_find losses", mpi.lr.losses, (size_t)mpi.lr.n * sizeof(double));
    check_same_everywhere(comm, "validate", mpi.values, sizeof mpi.values);
    CHECK(mpi.preds.n == 22, "get_preds has %lld rows, want 22", (long long)mpi.preds.n);
    CHECK(mpi.tta.n == 22 && memcmp(mpi.tta.preds.data, mpi.preds.preds.data,
                                    cf_tensor_numel(&mpi.preds.preds) * sizeof(float)) == 0,
          "tta without augmentation differs from get_preds");
    /* MPI has left no threads limit behind */
    CHECK(cf_get_num_threads() >= 1, "threads %d", cf_get_num_threads());

    if (rank == 0) {
        outcome fork = {.learn = make_learner(dls, 21)};
        t0 = cf_now();
        run_all(&fork, CF_START_FORK, world);
        double t_fork = cf_now() - t0;
        cf_model *f = fork.learn->model;
        CHECK(f->n_weights == m->n_weights, "weight counts");
        check_floats("weights", m->weights, f->weights, m->n_weights);
        check_floats("bn buffers", m->buffers, f->buffers, m->n_buffers);
        check_floats("grad_avg", mpi.learn->opt->grad_avg, fork.learn->opt->grad_avg, m->n_weights);
        check_floats("sqr_avg", mpi.learn->opt->sqr_avg, fork.learn->opt->sqr_avg, m->n_weights);
        const cf_recorder *a = &mpi.learn->recorder, *b = &fork.learn->recorder;
        /* lr_find ran last: its recorder */
        CHECK(a->n_batches == b->n_batches && a->n_epochs == b->n_epochs &&
                  a->n_values == b->n_values && a->n_names == b->n_names,
              "recorder shapes: mpi %lld batches %d epochs, fork %lld %d", (long long)a->n_batches,
              a->n_epochs, (long long)b->n_batches, b->n_epochs);
        if (a->n_batches == b->n_batches) {
            check_doubles("recorder lrs", a->lrs, b->lrs, (size_t)a->n_batches);
            check_doubles("recorder losses", a->losses, b->losses, (size_t)a->n_batches);
        }
        CHECK(mpi.lr.n == fork.lr.n && mpi.lr.n == 12, "lr_find points %d vs %d", mpi.lr.n,
              fork.lr.n);
        if (mpi.lr.n == fork.lr.n) {
            check_doubles("lr_find lrs", mpi.lr.lrs, fork.lr.lrs, (size_t)mpi.lr.n);
            check_doubles("lr_find losses", mpi.lr.losses, fork.lr.losses, (size_t)mpi.lr.n);
        }
        double sa[] = {mpi.lr.valley, mpi.lr.slide, mpi.lr.minimum, mpi.lr.steep};
        double sb[] = {fork.lr.valley, fork.lr.slide, fork.lr.minimum, fork.lr.steep};
        check_doubles("lr_find suggestions", sa, sb, 4);
        CHECK(mpi.preds.n == fork.preds.n, "preds rows %lld vs %lld", (long long)mpi.preds.n,
              (long long)fork.preds.n);
        if (mpi.preds.n == fork.preds.n) {
            size_t n = (size_t)mpi.preds.n;
            check_floats("preds", mpi.preds.preds.data, fork.preds.preds.data,
                         cf_tensor_numel(&mpi.preds.preds));
            CHECK(memcmp(mpi.preds.targs.data, fork.preds.targs.data, n * sizeof(float)) == 0,
                  "targs differ");
            CHECK(memcmp(mpi.preds.decoded, fork.preds.decoded, n * sizeof(int64_t)) == 0,
                  "decoded differ");
            check_floats("losses", mpi.preds.losses, fork.preds.losses, n);
            check_floats("tta", mpi.tta.preds.data, fork.tta.preds.data,
                         cf_tensor_numel(&mpi.preds.preds));
        }
        check_doubles("validate", mpi.values, fork.values, 2);
        if (!failures)
            printf(
                "mpi fit: %d ranks equal fork to 1e-6 (weights, BN, optimizer, recorder, lr_find, "
                "get_preds, validate); mpi %.2f s, fork %.2f s\n",
                world, t_mpi, t_fork);
        free_outcome(&fork);
    }
    /* the Recorder of the fit (before lr_find replaced it) on a fresh run: epoch values */
    outcome again = {.learn = make_learner(dls, 21)};
    add_stateful_cbs(again.learn);
    /* figures: one folder for the job (rank 0's pid) */
    int64_t job = getpid();
    OK(cf_comm_broadcast(comm, &job, sizeof job, 0));
    char fig_dir[64], loss_png[128], metrics_png[128];
    snprintf(fig_dir, sizeof fig_dir, "/tmp/cf-mpi-figures-%lld", (long long)job);
    snprintf(loss_png, sizeof loss_png, "%s/show_graph_loss.png", fig_dir);
    snprintf(metrics_png, sizeof metrics_png, "%s/show_graph_metrics.png", fig_dir);
    bool plots = cf_plot_available();
    if (plots) OK(cf_learner_add_cb(again.learn, cf_show_graph_cb(.dir = fig_dir)));
    OK(cf_par_fit_one_cycle(again.learn, 2, .lr_max = CF_LR(1e-2),
                            .par.start_method = CF_START_AUTO));
    /* the callbacks' state is rank 0's on every rank */
    cf_callback *cbs[] = {again.learn->cbs[0], again.learn->cbs[1], again.learn->cbs[2],
                          again.learn->master_cbs[0]};
    unsigned char st_mpi[4][128];
    size_t n_mpi[4];
    for (int i = 0; i < 4; i++) {
        n_mpi[i] = cb_state(cbs[i], st_mpi[i], sizeof st_mpi[i]);
        check_same_everywhere(comm, cbs[i]->name, st_mpi[i], n_mpi[i]);
    }
    if (plots) {
        CHECK(again.learn->n_figures == 2 && strcmp(again.learn->figures[0], loss_png) == 0 &&
                  strcmp(again.learn->figures[1], metrics_png) == 0,
              "%d figures noted, want %s and %s", again.learn->n_figures, loss_png, metrics_png);
        if (rank == 0) {
            /* one file per figure, byte for byte what the Recorder that came home draws */
            const char *drawn[2] = {loss_png, metrics_png};
            char check[160];
            snprintf(check, sizeof check, "%s/check.png", fig_dir);
            for (int i = 0; i < 2; i++) {
                cf_status st = i == 0 ? cf_plot_loss(&again.learn->recorder, check,
                                                     &(cf_plot_loss_opts){.skip_start = -1})
                                      : cf_plot_metrics(&again.learn->recorder, check);
                CHECK(st == CF_OK, "drawing the check figure: %s", cf_last_error());
                FILE *a = fopen(drawn[i], "rb"), *b = fopen(check, "rb");
                CHECK(a && b, "%s missing", drawn[i]);
                int ca = 0, cb = 0;
                long at = 0;
                unsigned char head[8] = {0};
                while (a && b && (ca = fgetc(a)) == (cb = fgetc(b)) && ca != EOF)
                    if (at < 8) head[at++] = (unsigned char)ca;
                CHECK(a && b && ca == EOF && cb == EOF,
                      "%s differs from the figure drawn from "
                      "the Recorder that came home",
                      drawn[i]);
                CHECK(memcmp(head, "\x89PNG\r\n\x1a\n", 8) == 0, "%s is not a PNG", drawn[i]);
                if (a) fclose(a);
                if (b) fclose(b);
            }
            unlink(check);
        }
        OK(cf_comm_barrier(comm));
        if (rank == 0) {
            unlink(loss_png);
            unlink(metrics_png);
            CHECK(rmdir(fig_dir) == 0, "%s holds other files than the two figures", fig_dir);
        }
    }
    const tally *t = cbs[2]->state;
    CHECK(t->epochs == 2 && t->batches > 0, "tally: %lld epochs, %lld batches",
          (long long)t->epochs, (long long)t->batches);
    check_same_everywhere(comm, "epoch values", again.learn->recorder.values,
                          (size_t)again.learn->recorder.n_epochs * 3 * sizeof(double));
    CHECK(again.learn->recorder.n_epochs == 2 && again.learn->recorder.n_values == 3,
          "recorder: %d epochs of %d values", again.learn->recorder.n_epochs,
          again.learn->recorder.n_values);
    if (rank == 0) {
        cf_learner *f = make_learner(dls, 21);
        add_stateful_cbs(f);
        OK(cf_par_fit_one_cycle(f, 2, .lr_max = CF_LR(1e-2), .par.num_cores = world));
        /* and equal to what fork brings home: trackers' fields exactly, their best to 1e-6 */
        cf_callback *fc[] = {f->cbs[0], f->cbs[1], f->cbs[2], f->master_cbs[0]};
        for (int i = 0; i < 4; i++) {
            unsigned char st_fork[128];
            size_t n = cb_state(fc[i], st_fork, sizeof st_fork);
            CHECK(n == n_mpi[i], "%s: %zu bytes of state, fork %zu", fc[i]->name, n_mpi[i], n);
            size_t exact = i < 2 ? 64 : n; /* a tracker's best is its last 8 bytes */
            CHECK(n != n_mpi[i] || memcmp(st_fork, st_mpi[i], exact) == 0,
                  "%s: state differs from fork's", fc[i]->name);
            if (i < 2 && n == n_mpi[i]) {
                double a, b;
                memcpy(&a, st_mpi[i] + 64, 8);
                memcpy(&b, st_fork + 64, 8);
                CHECK(isfinite(a) && close_to(a, b, 1e-6), "%s: best %.9g, fork %.9g", fc[i]->name,
                      a, b);
            }
        }
        check_doubles("recorder epoch values", again.learn->recorder.values, f->recorder.values, 6);
        check_floats("weights (auto)", again.learn->model->weights, f->model->weights,
                     f->model->n_weights);
        cf_learner_free(f);
    }
    cf_learner_free(again.learn);

    /* synchronised BatchNorm with split batches: every rank equals one process. (A bias right
     * before BatchNorm has no gradient but rounding noise, which Adam turns into steps that
     * differ with the summation order: the layer goes without, as W1's convolutions do.) */
    cf_learner *sync = make_learner_ex(dls, 21, false);
    OK(cf_par_fit_one_cycle(
        sync, 2, .lr_max = CF_LR(3e-3),
        .par = {.start_method = CF_START_MPI, .split_batch = true, .sync_bn = true}));
    cf_learner *one = make_learner_ex(dls, 21, false);
    OK(cf_fit_one_cycle(one, 2, .lr_max = CF_LR(3e-3)));
    for (size_t i = 0; i < one->model->n_weights; i++)
        if (!close_to(sync->model->weights[i], one->model->weights[i], 1e-5)) {
            CHECK(0, "sync_bn: weight %zu is %.9g, one process %.9g", i, sync->model->weights[i],
                  one->model->weights[i]);
            break;
        }
    for (size_t i = 0; i < one->model->n_buffers; i++)
        if (!close_to(sync->model->buffers[i], one->model->buffers[i], 1e-5)) {
            CHECK(0, "sync_bn: buffer %zu is %.9g, one process %.9g", i, sync->model->buffers[i],
                  one->model->buffers[i]);
            break;
        }
    cf_learner_free(sync);
    cf_learner_free(one);
    free_outcome(&mpi);
    cf_dls_free(dls);
    return failures;
}

/* ---- faults --------------------------------------------------------------------------------- */

typedef struct fault {
    int rank, batch;
    char kind; /* 'e' error, 'h' hang, 'k' SIGKILL */
} fault;

static cf_status inject(cf_callback *cb, cf_learner *learn) {
    const fault *f = cb->state;
    if (rank != f->rank || learn->train_iter != f->batch) return CF_OK;
    if (f->kind == 'k') raise(SIGKILL);
    if (f->kind == 'h')
        for (;;) pause();
    return cf_fail(CF_ERR_IO, "injected failure at batch %d", f->batch);
}

static int faults(cf_comm *comm, int bad_rank, char kind) {
    cf_dls *dls = make_dls(256, 16, 8);
    cf_learner *learn = make_learner(dls, 81);
    add_stateful_cbs(learn);
    /* a learner with history: optimizer state, a Recorder, trackers' and tallies' state */
    OK(cf_par_fit(learn, 1, .par.start_method = CF_START_MPI));
    OK(cf_learner_note_figure(learn, "before.png"));
    size_t n_before = cf_learner_export_state(learn, NULL, 0);
    unsigned char *before = malloc(n_before);
    CHECK(cf_learner_export_state(learn, before, n_before) == n_before, "export");
    static fault spec;
    spec = (fault){bad_rank, 3, kind};
    cf_callback cb = {.name = "Fault", .state = &spec};
    cb.on[CF_EV_BEFORE_BATCH] = inject;
    cf_callback *cbs[] = {&cb};
    double t0 = cf_now();
    cf_status st = cf_par_fit(learn, 20, .cbs = cbs, .n_cbs = 1,
                              .par = {.start_method = CF_START_MPI, .deadline_s = 2});
    double elapsed = cf_now() - t0;
    const char *msg = cf_last_error();
    if (rank == bad_rank) {
        CHECK(st == CF_ERR_IO && strstr(msg, "injected failure at batch 3"),
              "failing rank: status %d, \"%s\"", st, msg);
    } else {
        char want[64];
        snprintf(want, sizeof want, "rank %d failed: ", bad_rank);
        CHECK(st == CF_ERR_WORKER && strstr(msg, want) && strstr(msg, "injected failure"),
              "status %d, \"%s\" (want \"%s...injected failure\")", st, msg, want);
    }
    if (rank == 0 || (bad_rank == 0 && rank == 1))
        printf("rank %d: cf_par_fit returned after %.2f s: %s\n", rank, elapsed, msg);
    CHECK(elapsed < 10, "the failure took %.1f s to reach every rank", elapsed);
    /* every rank's learner is as the call found it, byte for byte */
    size_t n_after = cf_learner_export_state(learn, NULL, 0);
    unsigned char *after = malloc(n_after);
    cf_learner_export_state(learn, after, n_after);
    CHECK(n_after == n_before && memcmp(after, before, n_before) == 0,
          "the learner was not rolled back (%zu bytes of state, %zu before)", n_after, n_before);
    CHECK(learn->recorder.n_epochs == 1 && learn->n_figures == 1, "recorder %d epochs, %d figures",
          learn->recorder.n_epochs, learn->n_figures);
    free(after);
    free(before);

    /* The group is still in step: the next fit runs, and every rank ends equal. */
    OK(cf_par_fit(learn, 1, .par.start_method = CF_START_MPI));
    check_same_everywhere(comm, "weights after recovery", learn->model->weights,
                          learn->model->n_weights * sizeof(float));

    /* Different collectives on different ranks: an error everywhere, not a hang. */
    if (world > 1) {
        float x = 1;
        st = rank == 0 ? cf_comm_barrier(comm) : cf_comm_broadcast(comm, &x, sizeof x, 0);
        CHECK(st == CF_ERR_STATE && strstr(cf_last_error(), "different collectives"),
              "mismatch: status %d \"%s\"", st, cf_last_error());
        /* the next job resets the communicator */
        OK(cf_par_validate(learn, (double[2]){0}, .par.start_method = CF_START_MPI));
    }
    cf_learner_free(learn);
    cf_dls_free(dls);
    if (rank == 0 && !failures)
        printf("mpi faults: rank %d's failure reached all %d ranks\n", bad_rank, world);
    return failures;
}

static int hang_or_crash(char kind) {
    cf_dls *dls = make_dls(256, 16, 8);
    cf_learner *learn = make_learner(dls, 81);
    static fault spec;
    spec = (fault){1, 3, kind};
    cf_callback cb = {.name = "Fault", .state = &spec};
    cb.on[CF_EV_BEFORE_BATCH] = inject;
    cf_callback *cbs[] = {&cb};
    cf_status st = cf_par_fit(learn, 20, .cbs = cbs, .n_cbs = 1,
                              .par = {.start_method = CF_START_MPI, .deadline_s = 2});
    /* Not reached on a healthy rank: the job ends inside the fit. */
    fprintf(stderr, "rank %d: the fit returned (%d: %s) instead of ending the job\n", rank, st,
            cf_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "equiv";
    cf_comm *comm = NULL;
    if (cf_par_mpi_comm(&comm) != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        return 1;
    }
    rank = cf_comm_rank(comm);
    world = cf_comm_size(comm);
    if (strcmp(mode, "equiv") == 0) {
        /* one machine: the local rank is the rank */
        CHECK(cf_comm_local_rank(comm) == rank && cf_comm_local_size(comm) == world,
              "local rank %d of %d", cf_comm_local_rank(comm), cf_comm_local_size(comm));
        return equivalence(comm) ? 1 : 0;
    }
    if (strcmp(mode, "hosts") == 0) {
        /* one rank per host */
        CHECK(cf_comm_local_rank(comm) == 0 && cf_comm_local_size(comm) == 1,
              "local rank %d of %d on a host of its own", cf_comm_local_rank(comm),
              cf_comm_local_size(comm));
        char host[256] = "?";
        gethostname(host, sizeof host);
        printf("rank %d of %d on host %s\n", rank, world, host);
        fflush(stdout);
        return equivalence(comm) ? 1 : 0;
    }
    if (strcmp(mode, "fail") == 0) return faults(comm, argc > 2 ? atoi(argv[2]) : 1, 'e') ? 1 : 0;
    if (strcmp(mode, "hang") == 0) return hang_or_crash('h');
    if (strcmp(mode, "crash") == 0) return hang_or_crash('k');
    fprintf(stderr, "usage: mpi_fit equiv | hosts | fail RANK | hang | crash\n");
    return 2;
}
