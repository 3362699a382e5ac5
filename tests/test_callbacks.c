/* Built-in callbacks: CSVLogger (against Python's formatting of fastai's CSVLogger), the tracker
 * callbacks, TerminateOnNaN, GradientClip (against torch's clip_grad_norm_) and
 * GradientAccumulation, first on hand-filled learners, then in real fits on a small data set. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/learn.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return s;
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Captures what is printed on stdout between begin and end. */
typedef struct capture {
    int saved;
    FILE *tmp;
} capture;
static void capture_begin(capture *c) {
    fflush(stdout);
    c->tmp = tmpfile();
    c->saved = dup(1);
    dup2(fileno(c->tmp), 1);
}
static char *capture_end(capture *c) {
    fflush(stdout);
    dup2(c->saved, 1);
    close(c->saved);
    long n = ftell(c->tmp);
    if (n < 0) n = lseek(fileno(c->tmp), 0, SEEK_CUR);
    fseek(c->tmp, 0, SEEK_END);
    n = ftell(c->tmp);
    rewind(c->tmp);
    char *s = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(s, 1, (size_t)n, c->tmp), (size_t)n);
    fclose(c->tmp);
    return s;
}

static void put_doubles(oracle *o, const char *name, const double *x, int n) {
    oracle_put(o, name, (const float *)x, cf_shape1(2 * n));
}

/* A learner filled by hand, as the loop and the Recorder leave it at after_epoch. */
enum { FE = 5, FV = 3 };
static const char *fake_names[] = {"epoch", "train_loss", "valid_loss", "accuracy", "time"};

typedef struct fake {
    cf_learner learn;
    double values[FE * FV];
    double times[FE];
    cf_optimizer opt;
    cf_hypers hypers[2];
} fake;

static void fake_init(fake *f, const double *valid_loss, const double *accuracy) {
    memset(f, 0, sizeof *f);
    f->learn.replica.is_master = true;
    f->learn.logging = true;
    f->learn.quiet = false;
    f->learn.n_epoch = FE;
    f->learn.recorder.metric_names = (char **)fake_names;
    f->learn.recorder.n_names = 5;
    f->learn.recorder.n_values = FV;
    f->learn.recorder.values = f->values;
    f->learn.recorder.times = f->times;
    for (int e = 0; e < FE; e++) {
        f->values[e * FV + 0] = 2.0 / (e + 1) + 1e-3 * e;
        f->values[e * FV + 1] = valid_loss ? valid_loss[e] : 1.0 / (e + 3);
        f->values[e * FV + 2] = accuracy ? accuracy[e] : 0.5 + 0.01 * e;
        f->times[e] = 1.5 + 30.25 * e * e;
    }
    f->opt.n_groups = 2;
    f->opt.hypers = f->hypers;
    f->hypers[0].lr = 1e-3;
    f->hypers[1].lr = 1e-2;
    f->learn.opt = &f->opt;
}

/* Raises before_fit, then after_epoch for each epoch (the Recorder having added the row), and
 * stops at a fit cancellation as the loop does. Returns the number of epochs run. */
static int drive_epochs(cf_callback *cb, fake *f, cf_status *fit_status) {
    cf_learner *l = &f->learn;
    l->cancel = CF_CANCEL_NONE;
    cf_status st = cb->on[CF_EV_BEFORE_FIT] ? cb->on[CF_EV_BEFORE_FIT](cb, l) : CF_OK;
    if (fit_status) *fit_status = st;
    if (st != CF_OK) return 0;
    int e = 0;
    for (; e < FE && l->cancel == CF_CANCEL_NONE; e++) {
        l->epoch = e;
        l->recorder.n_epochs = e + 1;
        if (cb->on[CF_EV_AFTER_EPOCH]) assert_int_equal(cb->on[CF_EV_AFTER_EPOCH](cb, l), CF_OK);
    }
    if (cb->on[CF_EV_AFTER_FIT]) cb->on[CF_EV_AFTER_FIT](cb, l);
    return e;
}

/* ---- CSVLogger ----------------------------------------------------------------------------- */

static void test_csv_logger_matches_fastai(void **state) {
    (void)state;
    static fake f;
    fake_init(&f, NULL, NULL);
    f.values[2 * FV + 2] = NAN; /* a metric with nothing to average */
    oracle o;
    oracle_init(&o);
    f.learn.path = o.dir;
    cf_callback *cb = cf_csv_logger_cb("history_c.csv", false);
    assert_non_null(cb);
    assert_int_equal(drive_epochs(cb, &f, NULL), FE);
    /* fastai's CSVLogger over the same log lines */
    char path[512];
    snprintf(path, sizeof path, "%s/names.txt", o.dir);
    FILE *nf = fopen(path, "w");
    for (int j = 0; j < 5; j++) fprintf(nf, "%s\n", fake_names[j]);
    fclose(nf);
    put_doubles(&o, "values", f.values, FE * FV);
    put_doubles(&o, "times", f.times, FE);
    float epochs[FE];
    for (int e = 0; e < FE; e++) epochs[e] = (float)e;
    oracle_put(&o, "epochs", epochs, cf_shape1(FE));
    oracle_run(&o, "metrics.py", "table");
    snprintf(path, sizeof path, "%s/history.csv", o.dir);
    char *want = read_file(path);
    snprintf(path, sizeof path, "%s/history_c.csv", o.dir);
    char *got = read_file(path);
    if (strcmp(got, want) != 0) fail_msg("CSV differs:\n%s\nfastai:\n%s", got, want);
    free(got);
    /* append: a second fit adds its header and rows after the first */
    cf_callback *cb2 = cf_csv_logger_cb("history_c.csv", true);
    drive_epochs(cb2, &f, NULL);
    got = read_file(path);
    size_t n = strlen(want);
    assert_int_equal(strlen(got), 2 * n);
    assert_int_equal(strncmp(got, want, n), 0);
    assert_string_equal(got + n, want);
    free(got);
    /* not logging (validate, lr_find): nothing is written */
    f.learn.logging = false;
    cf_callback *cb3 = cf_csv_logger_cb("quiet.csv", false);
    drive_epochs(cb3, &f, NULL);
    snprintf(path, sizeof path, "%s/quiet.csv", o.dir);
    assert_false(file_exists(path));
    free(want);
    cf_callback_free(cb);
    cf_callback_free(cb2);
    cf_callback_free(cb3);
    oracle_cleanup(&o);
}

/* ---- trackers on a hand-filled learner ----------------------------------------------------- */

static void test_early_stopping_rules(void **state) {
    (void)state;
    static fake f;
    const double vl[FE] = {1.0, 0.8, 0.85, 0.9, 0.7};
    fake_init(&f, vl, NULL);
    capture c;
    /* patience 2: epochs 2 and 3 do not improve on epoch 1 -> stop after epoch 3 */
    cf_callback *cb = cf_early_stopping_cb(.patience = 2);
    assert_int_equal(cb->order, CF_ORDER_EARLY_STOPPING);
    capture_begin(&c);
    int ran = drive_epochs(cb, &f, NULL);
    char *out = capture_end(&c);
    assert_int_equal(ran, 4);
    assert_string_equal(out, "No improvement since epoch 1: early stopping\n");
    free(out);
    cf_callback_free(cb);
    /* min_delta: 0.8 improves on 1.0 by more than 0.1, 0.85 does not -> stop after epoch 2 */
    cb = cf_early_stopping_cb(.min_delta = 0.1);
    capture_begin(&c);
    assert_int_equal(drive_epochs(cb, &f, NULL), 3);
    free(capture_end(&c));
    cf_callback_free(cb);
    cb = cf_early_stopping_cb(.min_delta = 0.25); /* nothing improves by 0.25 after epoch 0 */
    capture_begin(&c);
    assert_int_equal(drive_epochs(cb, &f, NULL), 2);
    free(capture_end(&c));
    cf_callback_free(cb);
    /* a metric: higher is better (0.5, 0.6, 0.55 ...) */
    const double acc[FE] = {0.5, 0.6, 0.55, 0.7, 0.8};
    fake_init(&f, vl, acc);
    cb = cf_early_stopping_cb(.monitor = "accuracy");
    capture_begin(&c);
    assert_int_equal(drive_epochs(cb, &f, NULL), 3);
    free(capture_end(&c));
    cf_callback_free(cb);
    /* comp given: lower accuracy counts as better -> 0.6 does not improve on 0.5 */
    cb = cf_early_stopping_cb(.monitor = "accuracy", .comp = -1);
    capture_begin(&c);
    assert_int_equal(drive_epochs(cb, &f, NULL), 2);
    free(capture_end(&c));
    cf_callback_free(cb);
    /* quiet learners and other ranks print nothing */
    f.learn.quiet = true;
    cb = cf_early_stopping_cb(.monitor = "accuracy");
    capture_begin(&c);
    assert_int_equal(drive_epochs(cb, &f, NULL), 3);
    out = capture_end(&c);
    assert_string_equal(out, "");
    free(out);
    /* inside lr_find the trackers sit out */
    f.learn.in_lr_find = true;
    assert_int_equal(drive_epochs(cb, &f, NULL), FE);
    f.learn.in_lr_find = false;
    cf_callback_free(cb);
    /* an unknown monitor fails at before_fit with the recorded names */
    cb = cf_early_stopping_cb(.monitor = "acuracy");
    cf_status st;
    assert_int_equal(drive_epochs(cb, &f, &st), 0);
    assert_int_equal(st, CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "'acuracy'"));
    assert_non_null(strstr(cf_last_error(), "train_loss, valid_loss, accuracy"));
    cf_callback_free(cb);
}

static void test_reduce_lr_rules(void **state) {
    (void)state;
    static fake f;
    const double vl[FE] = {1.0, 0.8, 0.85, 0.9, 0.7};
    fake_init(&f, vl, NULL);
    cf_callback *cb = cf_reduce_lr_on_plateau_cb(.min_lr = 1e-4);
    assert_int_equal(cb->order, CF_ORDER_REDUCE_LR);
    capture c;
    capture_begin(&c);
    assert_int_equal(drive_epochs(cb, &f, NULL), FE);
    char *out = capture_end(&c);
    /* epoch 2: (1e-3, 1e-2) / 10; epoch 3: / 10 again, held at min_lr */
    assert_true(f.hypers[0].lr == 1e-4);
    assert_true(f.hypers[1].lr == 1e-4);
    assert_string_equal(out, "Epoch 2: reducing lr to 0.001\nEpoch 3: reducing lr to 0.0001\n");
    free(out);
    cf_callback_free(cb);
    /* patience 2, factor 2: one reduction (epochs 2 and 3 without improvement) */
    fake_init(&f, vl, NULL);
    cb = cf_reduce_lr_on_plateau_cb(.patience = 2, .factor = 2);
    capture_begin(&c);
    drive_epochs(cb, &f, NULL);
    out = capture_end(&c);
    assert_true(f.hypers[0].lr == 1e-3 / 2 && f.hypers[1].lr == 1e-2 / 2);
    assert_string_equal(out, "Epoch 3: reducing lr to 0.005\n");
    free(out);
    cf_callback_free(cb);
}

/* ---- a small classification problem for real fits ------------------------------------------ */

enum { F_IN = 6, N_CLS = 3, N_TRAIN = 64, N_VALID = 40, HIDDEN = 16 };

static cf_dataset *make_ds(int n, uint64_t seed, int nan_row) {
    float *x = calloc((size_t)n * F_IN, sizeof(float)), *y = calloc((size_t)n, sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (int i = 0; i < n * F_IN; i++) x[i] = (float)cf_rng_normal(&rng);
    for (int i = 0; i < n; i++) {
        /* class = argmax of three fixed projections */
        float s[N_CLS] = {x[i * F_IN] + x[i * F_IN + 1], x[i * F_IN + 2] - x[i * F_IN],
                          x[i * F_IN + 3] + 0.5f * x[i * F_IN + 4]};
        int best = 0;
        for (int c = 1; c < N_CLS; c++)
            if (s[c] > s[best]) best = c;
        y[i] = (float)best;
    }
    if (nan_row >= 0) x[nan_row * F_IN + 2] = NAN;
    cf_dataset *ds = NULL;
    assert_int_equal(cf_dataset_from_arrays(x, y, n, cf_shape1(F_IN), 1, N_CLS, &ds), CF_OK);
    free(x);
    free(y);
    return ds;
}

static cf_dls *make_dls(int bs, int nan_row) {
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = bs, .seed = 3, .prefetch = -1};
    assert_int_equal(cf_dls_new(make_ds(N_TRAIN, 1, nan_row), make_ds(N_VALID, 2, -1), &o, &dls),
                     CF_OK);
    return dls;
}

static cf_model *make_model(bool bn) {
    cf_module *layers[4];
    int n = 0;
    layers[n++] = cf_linear(F_IN, HIDDEN, true);
    if (bn) layers[n++] = cf_batchnorm1d(HIDDEN);
    layers[n++] = cf_relu();
    layers[n++] = cf_linear(HIDDEN, N_CLS, true);
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(n, layers), 17), CF_OK);
    return m;
}

/* Scripted metric: its value at epoch e is g_script[e] (the spy callback sets g_epoch). */
static double g_script[16];
static int g_epoch;
static double scripted(const cf_tensor *pred, const cf_tensor *targ, const bool *pad, int *n) {
    (void)targ;
    *n = 0;
    for (int i = 0; i < pred->shape.dim[0]; i++) *n += !(pad && pad[i]);
    return g_script[g_epoch];
}

/* Spy: records the epoch, and copies of the weights at each epoch's end and before each
 * training batch. */
typedef struct spy {
    float *at_epoch[16];
    float *before_batch;
    size_t n;
    int epochs;
} spy;

static cf_status spy_before_epoch(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    g_epoch = learn->epoch;
    return CF_OK;
}
static cf_status spy_before_batch(cf_callback *cb, cf_learner *learn) {
    spy *s = cb->state;
    memcpy(s->before_batch, learn->model->weights, s->n * sizeof(float));
    return CF_OK;
}
static cf_status spy_after_epoch(cf_callback *cb, cf_learner *learn) {
    spy *s = cb->state;
    if (learn->epoch < 16) {
        free(s->at_epoch[learn->epoch]); /* from an earlier fit */
        s->at_epoch[learn->epoch] = malloc(s->n * sizeof(float));
        memcpy(s->at_epoch[learn->epoch], learn->model->weights, s->n * sizeof(float));
        s->epochs = learn->epoch + 1;
    }
    return CF_OK;
}
static void spy_free(cf_callback *cb) {
    spy *s = cb->state;
    for (int i = 0; i < 16; i++) free(s->at_epoch[i]);
    free(s->before_batch);
    free(s);
    free(cb);
}
/* order 70: after the trackers (SaveModel at 61) have seen the epoch */
static cf_callback *spy_new(size_t n_weights, spy **out) {
    cf_callback *cb = calloc(1, sizeof *cb);
    spy *s = calloc(1, sizeof *s);
    s->n = n_weights;
    s->before_batch = calloc(n_weights, sizeof(float));
    cb->name = "spy";
    cb->order = 70;
    cb->state = s;
    cb->free = spy_free;
    cb->running = true;
    cb->skip_valid = true;
    cb->on[CF_EV_BEFORE_EPOCH] = spy_before_epoch;
    cb->on[CF_EV_BEFORE_BATCH] = spy_before_batch;
    cb->on[CF_EV_AFTER_EPOCH] = spy_after_epoch;
    *out = s;
    return cb;
}

static cf_learner *make_learner(cf_dls *dls, bool bn, bool quiet, const char *path,
                                cf_callback *extra, spy **sp) {
    cf_model *model = make_model(bn);
    cf_metric *ms[2] = {cf_accuracy(), cf_avg_metric("scripted", scripted)};
    cf_callback *cbs[1] = {spy_new(model->n_weights, sp)};
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, model, .metrics = ms, .n_metrics = 2, .cbs = cbs,
                                    .n_cbs = 1, .quiet = quiet, .path = path, .lr = 3e-2,
                                    .seed = 5),
                     CF_OK);
    if (extra) assert_int_equal(cf_learner_add_cb(learn, extra), CF_OK);
    return learn;
}

static bool same_weights(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static void test_fit_early_stopping(void **state) {
    (void)state;
    for (int i = 0; i < 16; i++) g_script[i] = 0.5; /* never improves after epoch 0 */
    cf_dls *dls = make_dls(16, -1);
    spy *s;
    cf_learner *learn = make_learner(
        dls, false, true, NULL, cf_early_stopping_cb(.monitor = "scripted", .patience = 2), &s);
    assert_int_equal(cf_fit(learn, 10), CF_OK);
    assert_int_equal(learn->recorder.n_epochs, 3);
    assert_int_equal(s->epochs, 2); /* the spy (order 70) never saw the cancelled epoch's end */
    /* a second fit starts afresh (reset_on_fit) */
    assert_int_equal(cf_fit(learn, 10), CF_OK);
    assert_int_equal(learn->recorder.n_epochs, 3);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_fit_save_model_reloads_best(void **state) {
    (void)state;
    const double script[4] = {0.5, 0.9, 0.7, 0.8};
    memcpy(g_script, script, sizeof script);
    oracle dir;
    oracle_init(&dir);
    cf_dls *dls = make_dls(16, -1);
    spy *s;
    cf_learner *learn =
        make_learner(dls, true, false, dir.dir, cf_save_model_cb(.monitor = "scripted"), &s);
    capture c;
    capture_begin(&c);
    cf_status st = cf_fit(learn, 4);
    char *out = capture_end(&c);
    assert_int_equal(st, CF_OK);
    assert_non_null(strstr(out, "Better model found at epoch 0 with scripted value: 0.5.\n"));
    assert_non_null(strstr(out, "Better model found at epoch 1 with scripted value: 0.9.\n"));
    assert_null(strstr(out, "at epoch 2"));
    assert_null(strstr(out, "at epoch 3"));
    free(out);
    char path[600];
    snprintf(path, sizeof path, "%s/models/model.safetensors", dir.dir);
    assert_true(file_exists(path));
    /* the best epoch's weights are back; the last epoch's were different */
    size_t n = learn->model->n_weights;
    assert_true(same_weights(learn->model->weights, s->at_epoch[1], n));
    assert_false(same_weights(s->at_epoch[3], s->at_epoch[1], n));
    cf_learner_free(learn);

    /* every_epoch: one file per epoch, nothing reloaded */
    learn = make_learner(
        dls, true, true, dir.dir,
        cf_save_model_cb(.monitor = "scripted", .every_epoch = true, .fname = "snap"), &s);
    assert_int_equal(cf_fit(learn, 3), CF_OK);
    for (int e = 0; e < 3; e++) {
        snprintf(path, sizeof path, "%s/models/snap_%d.safetensors", dir.dir, e);
        assert_true(file_exists(path));
    }
    assert_true(same_weights(learn->model->weights, s->at_epoch[2], n));
    /* loading snap_0 gives epoch 0's weights */
    assert_int_equal(cf_learner_load(learn, "snap_0", false), CF_OK);
    assert_true(same_weights(learn->model->weights, s->at_epoch[0], n));
    cf_learner_free(learn);
    cf_dls_free(dls);
    oracle_cleanup(&dir);
}

static void test_fit_reduce_lr_on_plateau(void **state) {
    (void)state;
    const double script[4] = {0.5, 0.4, 0.3, 0.6};
    memcpy(g_script, script, sizeof script);
    cf_dls *dls = make_dls(16, -1);
    spy *s;
    cf_learner *learn =
        make_learner(dls, false, true, NULL, cf_reduce_lr_on_plateau_cb(.monitor = "scripted"), &s);
    assert_int_equal(cf_fit(learn, 4), CF_OK);
    const cf_recorder *rec = &learn->recorder;
    assert_int_equal(rec->n_epochs, 4);
    /* reduced after epochs 1 and 2: the batches of epoch 3 ran at lr / 100 */
    int64_t per_epoch = rec->iters[0];
    assert_true(per_epoch > 0 && rec->n_batches == 4 * per_epoch);
    assert_true(fabs(rec->lrs[0] - 3e-2) < 1e-15);
    assert_true(fabs(rec->lrs[2 * per_epoch] - 3e-3) < 1e-15);
    assert_true(fabs(rec->lrs[3 * per_epoch] - 3e-4) < 1e-15);
    assert_true(fabs(learn->opt->hypers[learn->opt->n_groups - 1].lr - 3e-4) < 1e-15);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

static void test_fit_nan_terminates_with_weights_intact(void **state) {
    (void)state;
    for (int i = 0; i < 16; i++) g_script[i] = i;
    /* without the callback the NaN sample reaches the weights and the BatchNorm statistics */
    cf_dls *dls = make_dls(16, 21);
    spy *s;
    cf_learner *learn = make_learner(dls, true, true, NULL, NULL, &s);
    cf_fit(learn, 2);
    assert_false(all_finite(learn->model->weights, learn->model->n_weights));
    cf_learner_free(learn);

    learn = make_learner(dls, true, true, NULL, cf_terminate_on_nan_cb(), &s);
    cf_status st = cf_fit(learn, 2);
    assert_int_equal(st, CF_ERR_NONFINITE);
    /* (cf_relu maps NaN to 0, so here the NaN shows in the gradients before the loss) */
    const char *msg = cf_last_error();
    if (!strstr(msg, "TerminateOnNaNCallback: the") ||
        !(strstr(msg, "loss is nan") || strstr(msg, "is not finite at epoch 0")))
        fail_msg("message: %s", msg);
    assert_true(all_finite(learn->model->weights, learn->model->n_weights));
    assert_true(all_finite(learn->model->buffers, learn->model->n_buffers));
    /* no step after the bad batch began: the weights are those it started with */
    assert_true(same_weights(learn->model->weights, s->before_batch, learn->model->n_weights));
    /* and the learner can go on (e.g. after fixing the data): validate still works */
    double vals[3];
    assert_int_equal(cf_validate(learn, vals), CF_OK);
    assert_true(isfinite(vals[0]));
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_fit_csv_matches_recorder(void **state) {
    (void)state;
    for (int i = 0; i < 16; i++) g_script[i] = 1.0 / (i + 3);
    oracle dir;
    oracle_init(&dir);
    cf_dls *dls = make_dls(16, -1);
    spy *s;
    cf_learner *learn =
        make_learner(dls, false, true, dir.dir, cf_csv_logger_cb("history.csv", false), &s);
    assert_int_equal(cf_fit(learn, 3), CF_OK);
    char path[600];
    snprintf(path, sizeof path, "%s/history.csv", dir.dir);
    char *text = read_file(path);
    const cf_recorder *rec = &learn->recorder;
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    assert_string_equal(line, "epoch,train_loss,valid_loss,accuracy,scripted,time");
    int rows = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *cs = NULL, *cell = strtok_r(line, ",", &cs);
        assert_int_equal(atoi(cell), rows);
        for (int j = 0; j < rec->n_values; j++) {
            cell = strtok_r(NULL, ",", &cs);
            assert_non_null(cell);
            double v = strtod(cell, NULL), want = rec->values[rows * rec->n_values + j];
            if (!(v == want || (isnan(v) && isnan(want))))
                fail_msg("row %d column %d: %s in the CSV, %.17g recorded", rows, j, cell, want);
        }
        cell = strtok_r(NULL, ",", &cs);
        char t[32];
        assert_string_equal(cell, cf_format_time(rec->times[rows], t, sizeof t));
        assert_null(strtok_r(NULL, ",", &cs));
        rows++;
    }
    assert_int_equal(rows, rec->n_epochs);
    assert_int_equal(rows, 3);
    free(text);
    cf_learner_free(learn);
    cf_dls_free(dls);
    oracle_cleanup(&dir);
}

/* GradientAccumulation(16) over batches of 8 takes the same SGD steps as batches of 16. */
static void test_fit_gradient_accumulation_equals_big_batch(void **state) {
    (void)state;
    float *w[2];
    size_t n = 0;
    for (int run = 0; run < 2; run++) {
        cf_dls *dls = make_dls(run == 0 ? 16 : 8, -1);
        cf_model *model = make_model(false);
        n = model->n_weights;
        cf_callback *cbs[1] = {cf_gradient_accumulation_cb(16)};
        cf_learner *learn = NULL;
        assert_int_equal(cf_learner_new(&learn, dls, model, .opt = cf_opt_sgd_defaults(),
                                        .opt_set = true, .lr = 0.1, .quiet = true, .cbs = cbs,
                                        .n_cbs = run == 1),
                         CF_OK);
        if (run == 0) cf_callback_free(cbs[0]);
        assert_int_equal(cf_fit(learn, 2), CF_OK);
        w[run] = malloc(n * sizeof(float));
        memcpy(w[run], learn->model->weights, n * sizeof(float));
        /* the recorded loss is the plain batch loss */
        assert_true(learn->recorder.n_batches == (run == 0 ? 8 : 16));
        cf_learner_free(learn);
        cf_dls_free(dls);
    }
    assert_close("weights after accumulation", w[1], w[0], n, 1e-4, 1e-6);
    double moved = 0;
    cf_model *fresh = make_model(false);
    for (size_t i = 0; i < n; i++) moved = fmax(moved, fabs(w[0][i] - fresh->weights[i]));
    assert_true(moved > 1e-3); /* the fits did train */
    cf_model_free(fresh);
    free(w[0]);
    free(w[1]);
}

/* ---- GradientClip, GradientAccumulation, TerminateOnNaN on a hand-filled learner ----------- */

static void test_gradient_clip_vs_torch(void **state) {
    (void)state;
    cf_model *model = make_model(false);
    cf_learner learn;
    memset(&learn, 0, sizeof learn);
    learn.model = model;
    learn.training = true;
    cf_callback *cb = cf_gradient_clip_cb(0.75);
    for (int round = 0; round < 2; round++) {
        fill_uniform(model->grads, model->n_weights, 60 + round, -1, 1);
        if (round == 1)
            for (size_t i = 0; i < model->n_weights; i++) model->grads[i] *= 1e-3; /* small */
        /* the last layer's weight is frozen: neither counted nor changed */
        cf_param *frozen = cf_model_param(model, "2.weight");
        assert_non_null(frozen);
        frozen->trainable = false;
        float *before = malloc(model->n_weights * sizeof(float));
        memcpy(before, model->grads, model->n_weights * sizeof(float));
        float *g = malloc(model->n_weights * sizeof(float));
        size_t n = 0;
        for (int i = 0; i < model->n_params; i++) {
            cf_param *p = model->params[i];
            if (p->grad && p->trainable) {
                memcpy(g + n, p->grad, p->numel * sizeof(float));
                n += p->numel;
            }
        }
        assert_int_equal(cb->on[CF_EV_BEFORE_STEP](cb, &learn), CF_OK);
        oracle o;
        oracle_init(&o);
        oracle_put(&o, "g", g, cf_shape1((int)n));
        oracle_put_values(&o, "max_norm", 1, 0.75);
        oracle_run(&o, "metrics.py", "clip");
        cf_tensor want = oracle_get(&o, "out");
        size_t k = 0;
        for (int i = 0; i < model->n_params; i++) {
            cf_param *p = model->params[i];
            if (!p->grad) continue;
            if (p->trainable) {
                assert_close(p->full_name, p->grad, want.data + k, p->numel, 1e-5, 1e-8);
                k += p->numel;
            } else {
                assert_memory_equal(p->grad, before + (p->grad - model->grads),
                                    p->numel * sizeof(float));
            }
        }
        if (round == 1) /* below max_norm: untouched */
            assert_memory_equal(model->grads, before, model->n_weights * sizeof(float));
        free(want.data);
        oracle_cleanup(&o);
        free(before);
        free(g);
        frozen->trainable = true;
    }
    cf_callback_free(cb);
    cf_model_free(model);
}

static void test_gradient_accumulation_counts(void **state) {
    (void)state;
    cf_learner learn;
    memset(&learn, 0, sizeof learn);
    learn.training = true;
    cf_batch b = {.size = 8};
    learn.batch = &b;
    cf_callback *cb = cf_gradient_accumulation_cb(20);
    assert_true(cb->skip_valid);
    cb->on[CF_EV_BEFORE_FIT](cb, &learn);
    /* 8, 16 -> cancelled; 24 -> step (count reset); 8, 16 -> cancelled; 24 -> step */
    const bool cancelled[6] = {true, true, false, true, true, false};
    for (int i = 0; i < 6; i++) {
        learn.cancel = CF_CANCEL_NONE;
        learn.loss_grad_scale = 1;
        cb->on[CF_EV_AFTER_LOSS](cb, &learn);
        assert_true(fabsf(learn.loss_grad_scale - 0.4f) < 1e-7f);
        cb->on[CF_EV_BEFORE_STEP](cb, &learn);
        assert_int_equal(learn.cancel, cancelled[i] ? CF_CANCEL_BATCH : CF_CANCEL_NONE);
    }
    cb->on[CF_EV_AFTER_FIT](cb, &learn);
    assert_true(learn.loss_grad_scale == 1.0f);
    cf_callback_free(cb);
}

static void test_terminate_on_nan_rules(void **state) {
    (void)state;
    cf_model *model = make_model(true);
    assert_true(model->n_buffers > 0);
    cf_learner learn;
    memset(&learn, 0, sizeof learn);
    learn.model = model;
    learn.training = true;
    learn.logging = true;
    learn.epoch = 2;
    learn.iter = 5;
    cf_callback *cb = cf_terminate_on_nan_cb();
    assert_int_equal(cb->order, CF_ORDER_TERMINATE_ON_NAN);
    assert_int_equal(cb->on[CF_EV_BEFORE_FIT](cb, &learn), CF_OK);
    float *good = malloc(model->n_buffers * sizeof(float));
    memcpy(good, model->buffers, model->n_buffers * sizeof(float));
    /* a finite loss passes */
    cb->on[CF_EV_BEFORE_BATCH](cb, &learn);
    learn.loss_value = 0.5f;
    assert_int_equal(cb->on[CF_EV_AFTER_LOSS](cb, &learn), CF_OK);
    assert_int_equal(learn.cancel, CF_CANCEL_NONE);
    /* the forward pass poisoned the running statistics, then the loss is NaN */
    for (size_t i = 0; i < model->n_buffers; i++) model->buffers[i] = NAN;
    learn.loss_value = NAN;
    assert_int_equal(cb->on[CF_EV_AFTER_LOSS](cb, &learn), CF_ERR_NONFINITE);
    assert_non_null(strstr(cf_last_error(), "the loss is nan at epoch 2, training batch 5"));
    assert_int_equal(learn.cancel, CF_CANCEL_FIT);
    assert_memory_equal(model->buffers, good, model->n_buffers * sizeof(float));
    /* infinite loss in lr_find: the search just ends */
    learn.cancel = CF_CANCEL_NONE;
    learn.in_lr_find = true;
    learn.logging = false;
    learn.loss_value = INFINITY;
    assert_int_equal(cb->on[CF_EV_AFTER_LOSS](cb, &learn), CF_OK);
    assert_int_equal(learn.cancel, CF_CANCEL_FIT);
    /* get_preds / validate: left alone */
    learn.cancel = CF_CANCEL_NONE;
    learn.in_lr_find = false;
    learn.training = false;
    assert_int_equal(cb->on[CF_EV_AFTER_LOSS](cb, &learn), CF_OK);
    assert_int_equal(learn.cancel, CF_CANCEL_NONE);
    /* a non-finite gradient stops before the step, naming the parameter */
    learn.logging = true;
    learn.training = true;
    memset(model->grads, 0, model->n_weights * sizeof(float));
    assert_int_equal(cb->on[CF_EV_BEFORE_STEP](cb, &learn), CF_OK);
    cf_model_param(model, "1.bias")->grad[3] = INFINITY;
    assert_int_equal(cb->on[CF_EV_BEFORE_STEP](cb, &learn), CF_ERR_NONFINITE);
    assert_non_null(strstr(cf_last_error(), "the gradient of 1.bias is not finite"));
    free(good);
    cf_callback_free(cb);
    cf_model_free(model);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_csv_logger_matches_fastai),
        cmocka_unit_test(test_early_stopping_rules),
        cmocka_unit_test(test_reduce_lr_rules),
        cmocka_unit_test(test_gradient_clip_vs_torch),
        cmocka_unit_test(test_gradient_accumulation_counts),
        cmocka_unit_test(test_terminate_on_nan_rules),
        cmocka_unit_test(test_fit_early_stopping),
        cmocka_unit_test(test_fit_save_model_reloads_best),
        cmocka_unit_test(test_fit_reduce_lr_on_plateau),
        cmocka_unit_test(test_fit_nan_terminates_with_weights_intact),
        cmocka_unit_test(test_fit_csv_matches_recorder),
        cmocka_unit_test(test_fit_gradient_accumulation_equals_big_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
