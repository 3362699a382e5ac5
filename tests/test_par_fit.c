/* The cf_par_ twins: equivalence with one process, determinism, everything coming home, master
 * callbacks, and faults (crash, abort, kill, error, hang, Ctrl-C) leaving the learner intact. */
#include "learn_fixture.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "corefit/par.h"
#include "corefit/plot.h"
#include "par_time.h"
#include "tally_cb.h"

static cf_learner *make_learner(cf_dls *dls, uint64_t seed) {
    cf_metric *metrics[] = {cf_accuracy()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(seed, false), .quiet = true,
                                    .metrics = metrics, .n_metrics = 1),
                     CF_OK);
    return learn;
}

static void assert_no_children(void) {
    errno = 0;
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
}

static void assert_weights_close(const cf_model *a, const cf_model *b, double rtol) {
    assert_int_equal(a->n_weights, b->n_weights);
    assert_rel_err_within("weights", a->weights, b->weights, a->n_weights, 1e-3, rtol);
}

/* ---- equivalence ---------------------------------------------------------------------------- */

static void test_split_batches_equal_one_process(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(96, 20, 12);
    cf_learner *single = make_learner(dls, 21);
    assert_int_equal(cf_fit_one_cycle(single, 2, .lr_max = CF_LR(3e-3)), CF_OK);
    double single_values[2];
    assert_int_equal(cf_validate(single, single_values), CF_OK);
    for (int world = 1; world <= 4; world++) {
        if (world == 1) continue;
        cf_learner *par = make_learner(dls, 21);
        cf_status st = cf_par_fit_one_cycle(par, 2, .lr_max = CF_LR(3e-3),
                                            .par = {.num_cores = world, .split_batch = true});
        if (st != CF_OK) fail_msg("world %d: %s", world, cf_last_error());
        assert_weights_close(par->model, single->model, 1e-5);
        /* the Recorder came home with the same structure and (nearly) the same values */
        const cf_recorder *a = &par->recorder, *b = &single->recorder;
        assert_int_equal(a->n_batches, b->n_batches);
        assert_int_equal(a->n_epochs, b->n_epochs);
        assert_int_equal(a->n_hps, b->n_hps);
        assert_int_equal(a->n_names, b->n_names);
        for (int i = 0; i < a->n_names; i++)
            assert_string_equal(a->metric_names[i], b->metric_names[i]);
        for (int64_t i = 0; i < a->n_batches; i++) {
            assert_true(a->lrs[i] == b->lrs[i]);
            assert_true(fabs(a->losses[i] - b->losses[i]) < 1e-5 * (1 + b->losses[i]));
        }
        for (int i = 0; i < a->n_epochs * a->n_values; i++)
            assert_true(fabs(a->values[i] - b->values[i]) < 1e-5 * (1 + fabs(b->values[i])));
        /* validation metrics of the run equal cf_validate on the trained model */
        double values[2];
        assert_int_equal(cf_validate(par, values), CF_OK);
        int last = (a->n_epochs - 1) * a->n_values;
        assert_true(fabs(a->values[last + 1] - values[0]) < 1e-6);
        assert_true(fabs(a->values[last + 2] - values[1]) < 1e-9);
        /* the optimizer state came home too */
        assert_non_null(par->opt);
        assert_rel_err_within("Adam's sqr_avg", par->opt->sqr_avg, single->opt->sqr_avg,
                              par->model->n_weights, 1e-9, 1e-4);
        cf_learner_free(par);
    }
    cf_learner_free(single);
    cf_dls_free(dls);
}

/* Per-core batches: W workers with batches of b equal one process whose batch k is the
 * concatenation of the workers' batches k. The single-process data set is rearranged so its
 * own shuffled order yields exactly those concatenations. */
static void test_per_core_batches_equal_concatenated_batch(void **state) {
    (void)state;
    const int world = 2, bs = 8, n = 64;
    cf_dataset *ds = fixture_dataset(n, 31);
    cf_dl_options lo = {.bs = bs, .shuffle = true, .drop_last = true, .seed = 5};
    int64_t concat[64];
    int at = 0;
    const cf_batch *b;
    cf_dataloader *shards[2];
    for (int r = 0; r < world; r++) {
        assert_int_equal(cf_dataloader_new(ds, &lo, &shards[r]), CF_OK);
        assert_int_equal(cf_dataloader_set_shard(shards[r], r, world, CF_SHARD_PER_RANK), CF_OK);
        assert_int_equal(cf_dataloader_begin_epoch(shards[r], 0), CF_OK);
    }
    for (int k = 0; k < n / (bs * world); k++)
        for (int r = 0; r < world; r++) {
            assert_int_equal(cf_dataloader_next(shards[r], &b), CF_OK);
            for (int i = 0; i < b->size; i++) concat[at++] = b->idx[i];
        }
    for (int r = 0; r < world; r++) cf_dataloader_free(shards[r]);
    /* the order a single loader (bs * world, same seed) visits positions in */
    cf_dl_options big = lo;
    big.bs = bs * world;
    cf_dataloader *one;
    int64_t order[64];
    at = 0;
    assert_int_equal(cf_dataloader_new(ds, &big, &one), CF_OK);
    assert_int_equal(cf_dataloader_begin_epoch(one, 0), CF_OK);
    while (cf_dataloader_next(one, &b) == CF_OK && b)
        for (int i = 0; i < b->size; i++) order[at++] = b->idx[i];
    cf_dataloader_free(one);
    assert_int_equal(at, n);
    float x2[64 * 4], y2[64];
    for (int j = 0; j < n; j++) {
        memcpy(x2 + order[j] * 4, ds->x + concat[j] * 4, 4 * sizeof(float));
        y2[order[j]] = ds->y[concat[j]];
    }
    cf_dataset *ds2 = NULL;
    assert_int_equal(cf_dataset_from_arrays(x2, y2, n, cf_shape1(4), 1, 3, &ds2), CF_OK);

    cf_dls *dls_par = NULL, *dls_one = NULL;
    cf_dls_options po = {.bs = bs, .seed = 5}, oo = {.bs = bs * world, .seed = 5};
    assert_int_equal(cf_dls_new(ds, fixture_dataset(16, 2), &po, &dls_par), CF_OK);
    assert_int_equal(cf_dls_new(ds2, fixture_dataset(16, 2), &oo, &dls_one), CF_OK);
    cf_learner *par = make_learner(dls_par, 41), *single = make_learner(dls_one, 41);
    assert_int_equal(cf_fit(single, 1, .lr = CF_LR(1e-2)), CF_OK);
    assert_int_equal(cf_par_fit(par, 1, .lr = CF_LR(1e-2), .par.num_cores = world), CF_OK);
    assert_weights_close(par->model, single->model, 1e-5);
    cf_learner_free(par);
    cf_learner_free(single);
    cf_dls_free(dls_par);
    cf_dls_free(dls_one);
}

static void test_deterministic_and_one_core(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(96, 20, 8);
    cf_learner *a = make_learner(dls, 51), *b = make_learner(dls, 51), *one = make_learner(dls, 51),
               *single = make_learner(dls, 51);
    assert_int_equal(cf_par_fit_one_cycle(a, 2, .par.num_cores = 3), CF_OK);
    assert_int_equal(cf_par_fit_one_cycle(b, 2, .par.num_cores = 3), CF_OK);
    assert_memory_equal(a->model->weights, b->model->weights, a->model->n_weights * sizeof(float));
    assert_int_equal(cf_par_fit_one_cycle(one, 2, .par.num_cores = 1), CF_OK);
    assert_int_equal(cf_fit_one_cycle(single, 2), CF_OK);
    assert_weights_close(one->model, single->model, 1e-6);
    cf_learner_free(a);
    cf_learner_free(b);
    cf_learner_free(one);
    cf_learner_free(single);
    cf_dls_free(dls);
}

static void test_lr_find_get_preds_and_validate_come_home(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(128, 23, 8);
    cf_learner *learn = make_learner(dls, 61);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    size_t nw = learn->model->n_weights;
    float *w0 = malloc(nw * sizeof(float));
    memcpy(w0, learn->model->weights, nw * sizeof(float));

    cf_lr_find_result r;
    assert_int_equal(
        cf_par_lr_find(learn, &r, .num_it = 12, .no_stop_div = true, .par.num_cores = 2), CF_OK);
    assert_int_equal(r.n, 12);
    for (int i = 0; i < r.n; i++)
        assert_true(fabs(r.lrs[i] - cf_sched_exp(1e-7, 10, i / 12.0)) < 1e-12);
    assert_memory_equal(learn->model->weights, w0, nw * sizeof(float)); /* restored */
    assert_int_equal(learn->recorder.n_batches, 12); /* the caller's plot_lr_find can draw it */
    cf_lr_find_result_free(&r);

    cf_preds one, par;
    assert_int_equal(cf_get_preds(learn, &one, .with_decoded = true, .with_loss = true), CF_OK);
    assert_int_equal(
        cf_par_get_preds(learn, &par, .with_decoded = true, .with_loss = true, .par.num_cores = 3),
        CF_OK);
    assert_int_equal(par.n, one.n);
    assert_close("preds", par.preds.data, one.preds.data, cf_tensor_numel(&one.preds), 1e-6, 1e-7);
    assert_memory_equal(par.targs.data, one.targs.data, (size_t)one.n * sizeof(float));
    assert_memory_equal(par.decoded, one.decoded, (size_t)one.n * sizeof(int64_t));
    assert_close("losses", par.losses, one.losses, (size_t)one.n, 1e-6, 1e-7);
    cf_preds_free(&one);
    cf_preds_free(&par);

    double v1[2], v3[2];
    assert_int_equal(cf_validate(learn, v1), CF_OK);
    assert_int_equal(cf_par_validate(learn, v3, .par.num_cores = 3), CF_OK);
    assert_true(fabs(v1[0] - v3[0]) < 1e-6 && fabs(v1[1] - v3[1]) < 1e-12);
    free(w0);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* lr_find with split batches on N workers records the same points and suggests the same lrs as
 * one process (to float rounding), and restores the weights either way. */
static void test_parallel_lr_find_equals_one_process(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(192, 24, 12);
    cf_learner *single = make_learner(dls, 17);
    const int all = CF_SUGGEST_VALLEY | CF_SUGGEST_SLIDE | CF_SUGGEST_MINIMUM | CF_SUGGEST_STEEP;
    cf_lr_find_result one;
    assert_int_equal(cf_lr_find(single, &one, .num_it = 40, .suggest = all), CF_OK);
    assert_true(one.n > 20);
    for (int world = 2; world <= 3; world++) {
        cf_learner *par = make_learner(dls, 17);
        cf_lr_find_result r;
        cf_status st = cf_par_lr_find(par, &r, .num_it = 40, .suggest = all,
                                      .par = {.num_cores = world, .split_batch = true});
        if (st != CF_OK) fail_msg("world %d: %s", world, cf_last_error());
        if (r.n != one.n) fail_msg("world %d: %d points, one process %d", world, r.n, one.n);
        for (int i = 0; i < r.n; i++) {
            assert_true(r.lrs[i] == one.lrs[i]);
            if (!(fabs(r.losses[i] - one.losses[i]) <= 1e-5 * (1 + fabs(one.losses[i]))))
                fail_msg("world %d: loss %d is %.9g, one process %.9g", world, i, r.losses[i],
                         one.losses[i]);
        }
        assert_int_equal(r.suggest, one.suggest);
        const double a[] = {r.valley, r.slide, r.minimum, r.steep, r.minimum_lr_at},
                     b[] = {one.valley, one.slide, one.minimum, one.steep, one.minimum_lr_at};
        for (int k = 0; k < 5; k++)
            if (!(fabs(a[k] - b[k]) <= 1e-5 * fabs(b[k])))
                fail_msg("world %d: suggestion %d is %.9g, one process %.9g", world, k, a[k], b[k]);
        assert_true(isfinite(r.valley));
        assert_memory_equal(par->model->weights, single->model->weights,
                            par->model->n_weights * sizeof(float));
        cf_lr_find_result_free(&r);
        cf_learner_free(par);
    }
    cf_lr_find_result_free(&one);
    cf_learner_free(single);
    cf_dls_free(dls);
}

/* Every twin brings home a Recorder shaped as its single-process method's: same batches,
 * epochs, metric names and schedule (per batch, exactly, as the schedule is a formula). */
static void assert_same_structure(const cf_recorder *a, const cf_recorder *b) {
    assert_int_equal(a->n_batches, b->n_batches);
    assert_int_equal(a->n_hps, b->n_hps);
    assert_int_equal(a->n_epochs, b->n_epochs);
    assert_int_equal(a->n_names, b->n_names);
    for (int i = 0; i < a->n_names; i++)
        assert_string_equal(a->metric_names[i], b->metric_names[i]);
    for (int64_t i = 0; i < a->n_hps; i++) {
        assert_true(a->hp_lr[i] == b->hp_lr[i]);
        assert_true(a->hp_mom[i] == b->hp_mom[i]);
    }
    for (int e = 0; e < a->n_epochs; e++) assert_int_equal(a->iters[e], b->iters[e]);
}

static void test_every_twin_brings_the_recorder_home(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(96, 20, 8);
    for (int method = 0; method < 4; method++) {
        cf_learner *one = make_learner(dls, 101), *par = make_learner(dls, 101);
        assert_int_equal(cf_split_default(one->model), CF_OK);
        assert_int_equal(cf_split_default(par->model), CF_OK);
        cf_par_opts po = {.num_cores = 2, .split_batch = true};
        switch (method) {
        case 0:
            assert_int_equal(cf_fit_flat_cos(one, 2), CF_OK);
            assert_int_equal(cf_par_fit_flat_cos(par, 2, .par = po), CF_OK);
            break;
        case 1:
            assert_int_equal(cf_fit_sgdr(one, 2, 1), CF_OK);
            assert_int_equal(cf_par_fit_sgdr(par, 2, 1, .par = po), CF_OK);
            break;
        case 2:
            assert_int_equal(cf_fine_tune(one, 2, .freeze_epochs = 1), CF_OK);
            assert_int_equal(cf_par_fine_tune(par, 2, .freeze_epochs = 1, .par = po), CF_OK);
            /* unfrozen at the end, like the single-process learner */
            for (int i = 0; i < par->model->n_params; i++)
                assert_int_equal(par->model->params[i]->trainable,
                                 one->model->params[i]->trainable);
            break;
        case 3:
            assert_int_equal(cf_fit(one, 2, .lr = CF_SLICE(1e-2)), CF_OK);
            assert_int_equal(cf_par_fit(par, 2, .lr = CF_SLICE(1e-2), .par = po), CF_OK);
            break;
        }
        assert_same_structure(&par->recorder, &one->recorder);
        assert_weights_close(par->model, one->model, 1e-5);
        cf_learner_free(one);
        cf_learner_free(par);
    }
    cf_dls_free(dls);
}

/* Exactly one progress display: the fastai table's header appears once for 3 workers. */
static void test_one_progress_display(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(64, 16, 8);
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(7, false)), CF_OK);
    char path[] = "/tmp/cf-progress-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stdout);
    int saved = dup(1);
    dup2(fd, 1);
    cf_status st = cf_par_fit(learn, 2, .par.num_cores = 3);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(fd);
    assert_int_equal(st, CF_OK);
    FILE *f = fopen(path, "r");
    char line[512];
    int headers = 0, rows = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "epoch     train_loss", 20) == 0) headers++;
        if (line[0] == '0' || line[0] == '1') rows++;
    }
    fclose(f);
    unlink(path);
    assert_int_equal(headers, 1);
    assert_int_equal(rows, 2);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* A non-finite value on one worker stops every worker at the same step (TerminateOnNaN decides
 * alike on all replicas), and the last good state comes home with the error: the weights equal
 * those of one process that stopped at the same batch. */
static void test_nonfinite_brings_last_good_weights_home(void **state) {
    (void)state;
    cf_dataset *train = fixture_dataset(96, 1);
    train->x[37 * 4 + 2] = NAN; /* one poisoned sample */
    cf_dataset *train2 = NULL;
    assert_int_equal(cf_dataset_from_arrays(train->x, train->y, 96, cf_shape1(4), 1, 3, &train2),
                     CF_OK);
    cf_dls *dls = NULL, *dls2 = NULL;
    cf_dls_options o = {.bs = 8, .seed = 7};
    assert_int_equal(cf_dls_new(train, fixture_dataset(16, 2), &o, &dls), CF_OK);
    assert_int_equal(cf_dls_new(train2, fixture_dataset(16, 2), &o, &dls2), CF_OK);
    cf_learner *one = make_learner(dls, 111), *par = make_learner(dls2, 111);
    assert_int_equal(cf_learner_add_cb(one, cf_terminate_on_nan_cb()), CF_OK);
    assert_int_equal(cf_learner_add_cb(par, cf_terminate_on_nan_cb()), CF_OK);
    size_t nw = par->model->n_weights;
    float *w0 = malloc(nw * sizeof(float));
    memcpy(w0, par->model->weights, nw * sizeof(float));
    assert_int_equal(cf_fit(one, 2, .lr = CF_LR(1e-2)), CF_ERR_NONFINITE);
    cf_status st =
        cf_par_fit(par, 2, .lr = CF_LR(1e-2), .par = {.num_cores = 2, .split_batch = true});
    assert_int_equal(st, CF_ERR_NONFINITE);
    assert_non_null(strstr(cf_last_error(), "TerminateOnNaN"));
    for (size_t i = 0; i < nw; i++) assert_true(isfinite(par->model->weights[i]));
    assert_weights_close(par->model, one->model, 1e-5);
    assert_int_equal(par->recorder.n_batches, one->recorder.n_batches);
    if (one->recorder.n_batches > 0) /* it trained before stopping: that progress came home */
        assert_memory_not_equal(par->model->weights, w0, nw * sizeof(float));
    free(w0);
    cf_learner_free(one);
    cf_learner_free(par);
    cf_dls_free(dls);
    cf_dls_free(dls2);
}

/* ---- master callbacks ----------------------------------------------------------------------- */

static char count_file[256];

static cf_status count_fit(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    FILE *f = fopen(count_file, "a");
    if (!f) return cf_fail(CF_ERR_IO, "cannot open %s", count_file);
    fprintf(f, "%s %d\n", cb->name, (int)getpid());
    fclose(f);
    return CF_OK;
}

static void free_counter(cf_callback *cb) {
    free(cb);
}

static cf_callback *counter(const char *name) {
    cf_callback *cb = calloc(1, sizeof *cb);
    cb->name = name;
    cb->free = free_counter;
    cb->on[CF_EV_BEFORE_FIT] = count_fit;
    return cb;
}

static int count_lines(const char *name) {
    FILE *f = fopen(count_file, "r");
    if (!f) return 0;
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, name, strlen(name)) == 0 && line[strlen(name)] == ' ') n++;
    fclose(f);
    return n;
}

static void test_master_callbacks_run_on_rank_zero_only(void **state) {
    (void)state;
    snprintf(count_file, sizeof count_file, "/tmp/cf-count-%d", (int)getpid());
    unlink(count_file);
    cf_dls *dls = fixture_dls(64, 16, 8);
    cf_learner *learn = make_learner(dls, 71);
    assert_int_equal(cf_learner_add_cb(learn, counter("everywhere")), CF_OK);
    cf_callback *m[] = {counter("learner_master")};
    assert_int_equal(cf_learner_add_master_cbs(learn, m, 1), CF_OK);
    cf_callback *call_master[] = {counter("call_master")};
    cf_callback *call_cbs[] = {counter("call")};
    assert_int_equal(
        cf_par_fit(learn, 1, .cbs = call_cbs, .n_cbs = 1,
                   .par = {.num_cores = 3, .master_cbs = call_master, .n_master_cbs = 1}),
        CF_OK);
    assert_int_equal(count_lines("everywhere"), 3);
    assert_int_equal(count_lines("call"), 3);
    assert_int_equal(count_lines("learner_master"), 1);
    assert_int_equal(count_lines("call_master"), 1);
    assert_int_equal(cf_learner_remove_master_cbs(learn, "learner_master"), 1);
    unlink(count_file);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* ---- callback state comes home ------------------------------------------------------------- */

/* A tracker's state as its export writes it ("CFTR" v1: kind, active, lower, new_best, saved,
 * idx, wait as u64, then best). */
typedef struct tracker_view {
    uint64_t u[7];
    double best;
} tracker_view;

static tracker_view view_tracker(const cf_callback *cb) {
    unsigned char buf[128];
    assert_non_null(cb->export_state);
    size_t n = cb->export_state(cb, buf, sizeof buf);
    assert_int_equal(n, 8 + 7 * 8 + 8);
    assert_memory_equal(buf, "CFTR", 4);
    tracker_view v;
    memcpy(v.u, buf + 8, sizeof v.u);
    memcpy(&v.best, buf + 64, sizeof v.best);
    return v;
}

static char save_dir[64];

/* The trackers (learner callbacks), a user's callback (learner and master callbacks) */
static cf_learner *stateful_learner(cf_dls *dls) {
    cf_learner *learn = make_learner(dls, 33);
    char fname[128];
    snprintf(fname, sizeof fname, "%s/best", save_dir);
    assert_int_equal(cf_learner_add_cb(learn, cf_early_stopping_cb(.patience = 2)), CF_OK);
    assert_int_equal(
        cf_learner_add_cb(learn, cf_reduce_lr_on_plateau_cb(.monitor = "accuracy", .patience = 1)),
        CF_OK);
    assert_int_equal(cf_learner_add_cb(learn, cf_save_model_cb(.fname = fname)), CF_OK);
    assert_int_equal(cf_learner_add_cb(learn, tally_cb()), CF_OK);
    cf_callback *m[] = {tally_cb()};
    assert_int_equal(cf_learner_add_master_cbs(learn, m, 1), CF_OK);
    return learn;
}

/* After a parallel fit the caller's callbacks hold what the same single-process fit leaves
 * them: each tracker's best, patience used and whether it saved; a user's counts. */
static void test_callback_state_comes_home(void **state) {
    (void)state;
    snprintf(save_dir, sizeof save_dir, "/tmp/cf-cbstate-%d", (int)getpid());
    mkdir(save_dir, 0755);
    cf_dls *dls = fixture_dls(96, 20, 12);
    cf_learner *single = stateful_learner(dls);
    assert_int_equal(cf_fit_one_cycle(single, 4, .lr_max = CF_LR(1e-2)), CF_OK);
    const tally *t1 = single->cbs[3]->state;
    assert_int_equal(t1->epochs, 4);
    assert_int_equal(t1->batches, 4 * 8);
    for (int world = 2; world <= 3; world++) {
        cf_learner *par = stateful_learner(dls);
        cf_status st = cf_par_fit_one_cycle(par, 4, .lr_max = CF_LR(1e-2),
                                            .par = {.num_cores = world, .split_batch = true});
        if (st != CF_OK) fail_msg("world %d: %s", world, cf_last_error());
        for (int i = 0; i < 3; i++) {
            tracker_view a = view_tracker(par->cbs[i]), b = view_tracker(single->cbs[i]);
            for (int k = 0; k < 7; k++)
                if (a.u[k] != b.u[k])
                    fail_msg("world %d, %s: field %d is %llu, one process %llu", world,
                             par->cbs[i]->name, k, (unsigned long long)a.u[k],
                             (unsigned long long)b.u[k]);
            if (!(fabs(a.best - b.best) <= 1e-5 * (1 + fabs(b.best))))
                fail_msg("world %d, %s: best %.9g, one process %.9g", world, par->cbs[i]->name,
                         a.best, b.best);
        }
        assert_true(isfinite(view_tracker(par->cbs[0]).best));
        assert_int_equal(view_tracker(par->cbs[2]).u[4], 1); /* SaveModel saved */
        const tally *t = par->cbs[3]->state, *tm = par->master_cbs[0]->state;
        assert_int_equal(t->batches, t1->batches);
        assert_int_equal(t->epochs, t1->epochs);
        assert_int_equal(tm->batches, t1->batches);
        assert_int_equal(tm->epochs, t1->epochs);
        cf_learner_free(par);
    }
    cf_learner_free(single);
    cf_dls_free(dls);
    char path[128];
    snprintf(path, sizeof path, "%s/best.safetensors", save_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/best", save_dir);
    unlink(path);
    rmdir(save_dir);
}

/* ---- figures drawn during a fit ------------------------------------------------------------ */

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size + 1);
    *n = fread(buf, 1, (size_t)size, f);
    fclose(f);
    return buf;
}

/* A PNG of 800x600 (signature and IHDR), byte for byte the figure the caller draws from what
 * came home (so it was drawn from the whole run, not from one replica's part). */
static void assert_png_equal(const char *path, const char *expected) {
    size_t n = 0, m = 0;
    unsigned char *a = read_all(path, &n), *b = read_all(expected, &m);
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n < 24 || memcmp(a, sig, 8) != 0 || memcmp(a + 12, "IHDR", 4) != 0)
        fail_msg("%s is not a PNG", path);
    unsigned w = (unsigned)a[16] << 24 | a[17] << 16 | a[18] << 8 | a[19];
    unsigned h = (unsigned)a[20] << 24 | a[21] << 16 | a[22] << 8 | a[23];
    if (w != 800 || h != 600) fail_msg("%s is %ux%u", path, w, h);
    if (n != m || memcmp(a, b, n) != 0)
        fail_msg("%s (%zu bytes) differs from %s drawn from the learner (%zu bytes)", path, n,
                 expected, m);
    free(a);
    free(b);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    if (d) closedir(d);
    return n;
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    char path[512];
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* ShowGraph in a fit on 1 process and on 1, 2 and 3 workers, and lr_find's plot on 2: one file
 * per figure (rank 0 draws), drawn from the whole run, its path in the caller's learner. */
static void test_figures_drawn_during_a_fit_come_home(void **state) {
    (void)state;
    if (!cf_plot_available()) {
        print_message("figures: PLplot's pngcairo is not available here; skipped\n");
        return;
    }
    cf_dls *dls = fixture_dls(96, 20, 12);
    char root[64];
    snprintf(root, sizeof root, "/tmp/cf-figures-%d", (int)getpid());
    mkdir(root, 0755);
    for (int world = 0; world <= 3; world++) { /* 0: a single-process fit */
        char dir[128], loss[192], metrics[192], check[192];
        snprintf(dir, sizeof dir, "%s/w%d", root, world);
        cf_learner *learn = make_learner(dls, 44);
        assert_int_equal(cf_learner_note_figure(learn, "earlier.png"), CF_OK);
        assert_int_equal(cf_learner_add_cb(learn, cf_show_graph_cb(.dir = dir)), CF_OK);
        cf_status st = world ? cf_par_fit_one_cycle(learn, 3, .par.num_cores = world)
                             : cf_fit_one_cycle(learn, 3);
        if (st != CF_OK) fail_msg("world %d: %s", world, cf_last_error());
        snprintf(loss, sizeof loss, "%s/show_graph_loss.png", dir);
        snprintf(metrics, sizeof metrics, "%s/show_graph_metrics.png", dir);
        if (learn->n_figures != 3) fail_msg("world %d: %d figures", world, learn->n_figures);
        assert_string_equal(learn->figures[0], "earlier.png");
        assert_string_equal(learn->figures[1], loss);
        assert_string_equal(learn->figures[2], metrics);
        assert_int_equal(count_files(dir), 2);
        snprintf(check, sizeof check, "%s/check.png", root);
        assert_int_equal(
            cf_plot_loss(&learn->recorder, check, &(cf_plot_loss_opts){.skip_start = -1}), CF_OK);
        assert_png_equal(loss, check);
        assert_int_equal(cf_plot_metrics(&learn->recorder, check), CF_OK);
        assert_png_equal(metrics, check);
        if (world == 2) {
            /* lr_find draws its plot where it runs */
            char lr_path[192];
            snprintf(lr_path, sizeof lr_path, "%s/lr_find.png", dir);
            cf_lr_find_result r;
            st = cf_par_lr_find(learn, &r, .num_it = 20, CF_LR_FIND_PLOT(lr_path),
                                .par.num_cores = 2);
            if (st != CF_OK) fail_msg("lr_find: %s", cf_last_error());
            assert_int_equal(learn->n_figures, 4);
            assert_string_equal(learn->figures[3], lr_path);
            assert_int_equal(count_files(dir), 3);
            assert_int_equal(cf_plot_lr_find(&r, check), CF_OK);
            assert_png_equal(lr_path, check);
            cf_lr_find_result_free(&r);
        }
        /* the library's show call lists them (not a terminal: paths only) */
        FILE *out = tmpfile();
        assert_int_equal(cf_learner_show_figures(learn, out), 0);
        char line[256];
        rewind(out);
        assert_non_null(fgets(line, sizeof line, out));
        assert_string_equal(line, "earlier.png\n");
        assert_non_null(fgets(line, sizeof line, out));
        assert_non_null(strstr(line, "show_graph_loss.png"));
        fclose(out);
        unlink(check);
        remove_dir(dir);
        cf_learner_free(learn);
    }
    rmdir(root);
    cf_dls_free(dls);
}

/* ---- synchronised BatchNorm ----------------------------------------------------------------- */

static double max_diff(const float *a, const float *b, size_t n) {
    return max_rel_err(a, b, n, 1e-3);
}

/* With .par.sync_bn and split batches, W1 on 2, 3 and 4 workers equals one process to 1e-5:
 * weights, BatchNorm running statistics, the Recorder. Without sync_bn it does not (each replica
 * normalises with its slice's statistics), which shows the comparison can fail. W1's recipe
 * (one-cycle, lr_max 3e-3, Adam): at lr 1e-2 on random labels Adam turns float rounding into
 * weight differences of 1e-4 on some weights (plain SGD stays within 1e-6 there). */
static void test_sync_batchnorm_equals_one_process(void **state) {
    (void)state;
    cf_dls *dls = NULL;
    cf_learner *single = fixture_w1_learner(&dls);
    assert_true(single->model->n_buffers > 0);
    assert_int_equal(cf_fit_one_cycle(single, 2, .lr_max = CF_LR(3e-3)), CF_OK);
    for (int world = 2; world <= 4; world++) {
        cf_learner *par = fixture_w1_learner(&(cf_dls *){NULL});
        double t0 = cf_now();
        cf_status st =
            cf_par_fit_one_cycle(par, 2, .lr_max = CF_LR(3e-3),
                                 .par = {.num_cores = world, .split_batch = true, .sync_bn = true});
        double took = cf_now() - t0;
        if (st != CF_OK) fail_msg("world %d: %s", world, cf_last_error());
        const cf_model *a = par->model, *b = single->model;
        double ew = max_diff(a->weights, b->weights, a->n_weights);
        double eb = max_diff(a->buffers, b->buffers, a->n_buffers);
        if (!(ew <= 1e-5 && eb <= 1e-5))
            fail_msg("world %d: weights differ by %.3g, BatchNorm buffers by %.3g", world, ew, eb);
        const cf_recorder *ra = &par->recorder, *rb = &single->recorder;
        assert_int_equal(ra->n_batches, rb->n_batches);
        for (int64_t i = 0; i < ra->n_batches; i++)
            if (!(fabs(ra->losses[i] - rb->losses[i]) <= 1e-5 * (1 + rb->losses[i])))
                fail_msg("world %d: smoothed loss %lld is %.9g, one process %.9g", world,
                         (long long)i, ra->losses[i], rb->losses[i]);
        for (int i = 0; i < ra->n_epochs * ra->n_values; i++)
            assert_true(fabs(ra->values[i] - rb->values[i]) <= 1e-5 * (1 + fabs(rb->values[i])));
        print_message("sync BatchNorm, %d workers: weights within %.2g, buffers within %.2g (%.2f "
                      "s)\n",
                      world, ew, eb, took);
        cf_dls *pd = par->dls;
        cf_learner_free(par);
        cf_dls_free(pd);
    }
    /* the control: no synchronisation, no equality */
    cf_learner *plain = fixture_w1_learner(&(cf_dls *){NULL});
    assert_int_equal(cf_par_fit_one_cycle(plain, 2, .lr_max = CF_LR(3e-3),
                                          .par = {.num_cores = 2, .split_batch = true}),
                     CF_OK);
    double e = max_diff(plain->model->weights, single->model->weights, plain->model->n_weights);
    if (!(e > 1e-4 && isfinite(e))) fail_msg("without sync_bn the weights differ by only %.3g", e);
    cf_dls *pd = plain->dls;
    cf_learner_free(plain);
    cf_dls_free(pd);
    cf_learner_free(single);
    cf_dls_free(dls);
}

/* ---- faults --------------------------------------------------------------------------------- */

typedef enum fault { FAULT_CRASH, FAULT_ABORT, FAULT_KILL, FAULT_ERROR, FAULT_HANG } fault;

typedef struct fault_spec {
    fault kind;
    int rank, batch;
} fault_spec;

static cf_status inject(cf_callback *cb, cf_learner *learn) {
    const fault_spec *f = cb->state;
    if (!learn->replica.comm || cf_comm_rank(learn->replica.comm) != f->rank ||
        learn->train_iter != f->batch)
        return CF_OK;
    switch (f->kind) {
    case FAULT_CRASH:
        raise(SIGSEGV);
        break;
    case FAULT_ABORT:
        abort();
    case FAULT_KILL:
        raise(SIGKILL);
        break;
    case FAULT_ERROR:
        return cf_fail(CF_ERR_IO, "injected failure at batch %d", f->batch);
    case FAULT_HANG:
        for (;;) pause();
    }
    return CF_OK;
}

static void run_fault(fault kind, const char *expect, cf_status expect_status) {
    cf_dls *dls = fixture_dls(256, 16, 8);
    cf_learner *learn = make_learner(dls, 81);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-3)), CF_OK);
    size_t nw = learn->model->n_weights;
    float *w0 = malloc(nw * sizeof(float)), *m0 = malloc(nw * sizeof(float));
    memcpy(w0, learn->model->weights, nw * sizeof(float));
    memcpy(m0, learn->opt->grad_avg, nw * sizeof(float));
    int64_t batches0 = learn->recorder.n_batches;

    static fault_spec spec;
    spec = (fault_spec){kind, 1, 5};
    cf_callback cb = {.name = "Fault", .state = &spec};
    cb.on[CF_EV_BEFORE_BATCH] = inject;
    cf_callback *cbs[] = {&cb};
    double t0 = cf_now();
    cf_status st = cf_fit(learn, 50, .cbs = cbs, .n_cbs = 1); /* single process: no fault */
    assert_int_equal(st, CF_OK);
    memcpy(w0, learn->model->weights, nw * sizeof(float));
    memcpy(m0, learn->opt->grad_avg, nw * sizeof(float));
    batches0 = learn->recorder.n_batches;
    t0 = cf_now();
    st = cf_par_fit(learn, 50, .cbs = cbs, .n_cbs = 1,
                    .par = {.num_cores = 2, .deadline_s = kind == FAULT_HANG ? 1.0 : 0});
    double elapsed = cf_now() - t0;
    assert_int_equal(st, expect_status);
    if (!strstr(cf_last_error(), expect))
        fail_msg("error \"%s\" does not mention \"%s\"", cf_last_error(), expect);
    if (!strstr(cf_last_error(), "worker 1"))
        fail_msg("error \"%s\" names no rank", cf_last_error());
    assert_true(elapsed < (kind == FAULT_HANG ? 4.0 : 2.5) * par_time_scale());
    assert_memory_equal(learn->model->weights, w0, nw * sizeof(float));
    assert_memory_equal(learn->opt->grad_avg, m0, nw * sizeof(float));
    assert_int_equal(learn->recorder.n_batches, batches0);
    assert_no_children();
    free(w0);
    free(m0);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_worker_crash(void **s) {
    (void)s, run_fault(FAULT_CRASH, "SIGSEGV", CF_ERR_WORKER);
}
static void test_worker_abort(void **s) {
    (void)s, run_fault(FAULT_ABORT, "SIGABRT", CF_ERR_WORKER);
}
static void test_worker_killed(void **s) {
    (void)s, run_fault(FAULT_KILL, "SIGKILL", CF_ERR_WORKER);
}
static void test_worker_error(void **s) {
    (void)s, run_fault(FAULT_ERROR, "injected failure at batch 5", CF_ERR_WORKER);
}
static void test_worker_hang(void **s) {
    (void)s, run_fault(FAULT_HANG, "no progress", CF_ERR_WORKER);
}

/* The workers say when they train (a byte down a pipe), so SIGINT arrives mid-fit, once the
 * supervisor is surely waiting. */
static int started_pipe[2];

static cf_status say_started(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (learn->train_iter == 2 && write(started_pipe[1], "x", 1) != 1)
        return cf_fail(CF_ERR_IO, "pipe");
    return CF_OK;
}

static void *send_sigint(void *arg) {
    (void)arg;
    char c;
    if (read(started_pipe[0], &c, 1) == 1) kill(getpid(), SIGINT);
    return NULL;
}

static void test_ctrl_c_stops_every_worker(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(4096, 16, 8);
    cf_learner *learn = make_learner(dls, 91);
    size_t nw = learn->model->n_weights;
    float *w0 = malloc(nw * sizeof(float));
    memcpy(w0, learn->model->weights, nw * sizeof(float));
    assert_int_equal(pipe(started_pipe), 0);
    cf_callback started = {.name = "Started"};
    started.on[CF_EV_BEFORE_BATCH] = say_started;
    cf_callback *cbs[] = {&started};
    pthread_t t;
    pthread_create(&t, NULL, send_sigint, NULL);
    double t0 = cf_now();
    cf_status st = cf_par_fit(learn, 100, .cbs = cbs, .n_cbs = 1, .par.num_cores = 2);
    double elapsed = cf_now() - t0;
    pthread_join(t, NULL);
    close(started_pipe[0]);
    close(started_pipe[1]);
    assert_int_equal(st, CF_ERR_INTERRUPTED);
    assert_true(elapsed < 2.5 * par_time_scale());
    assert_memory_equal(learn->model->weights, w0, nw * sizeof(float));
    assert_null(learn->opt);
    assert_no_children();
    free(w0);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_batches_equal_one_process),
        cmocka_unit_test(test_per_core_batches_equal_concatenated_batch),
        cmocka_unit_test(test_deterministic_and_one_core),
        cmocka_unit_test(test_lr_find_get_preds_and_validate_come_home),
        cmocka_unit_test(test_parallel_lr_find_equals_one_process),
        cmocka_unit_test(test_every_twin_brings_the_recorder_home),
        cmocka_unit_test(test_one_progress_display),
        cmocka_unit_test(test_nonfinite_brings_last_good_weights_home),
        cmocka_unit_test(test_master_callbacks_run_on_rank_zero_only),
        cmocka_unit_test(test_callback_state_comes_home),
        cmocka_unit_test(test_figures_drawn_during_a_fit_come_home),
        cmocka_unit_test(test_sync_batchnorm_equals_one_process),
        cmocka_unit_test(test_worker_crash),
        cmocka_unit_test(test_worker_abort),
        cmocka_unit_test(test_worker_killed),
        cmocka_unit_test(test_worker_error),
        cmocka_unit_test(test_worker_hang),
        cmocka_unit_test(test_ctrl_c_stops_every_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
