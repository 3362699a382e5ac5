/* The Learner's loop against fastai: event order with every cancellation, schedules of every fit
 * method (all groups, every batch), lr_find's points, suggestions and restoration, get_preds
 * order and validate. */
#include "learn_fixture.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- events -------------------------------------------------------------------------------- */

typedef struct event_log {
    char names[4096][32];
    int n;
    /* cancellation to raise once */
    cf_cancel kind;
    cf_event at;
    int epoch, iter;
    bool training;
    bool armed;
} event_log;

static cf_status record_event(cf_callback *cb, cf_learner *learn, cf_event ev) {
    event_log *log = cb->state;
    if (log->n < 4096) snprintf(log->names[log->n++], 32, "%s", cf_event_name(ev));
    bool inner = ev >= CF_EV_BEFORE_BATCH && ev <= CF_EV_AFTER_BATCH;
    if (log->armed && ev == log->at && learn->epoch == log->epoch &&
        (!inner || learn->iter == log->iter) && learn->training == log->training) {
        log->armed = false;
        cf_learner_cancel(learn, log->kind);
    }
    return CF_OK;
}

#define EVENT_FN(ev)                                                                               \
    static cf_status on_##ev(cf_callback *cb, cf_learner *l) {                                     \
        return record_event(cb, l, ev);                                                            \
    }
EVENT_FN(CF_EV_BEFORE_FIT)
EVENT_FN(CF_EV_BEFORE_EPOCH)
EVENT_FN(CF_EV_BEFORE_TRAIN)
EVENT_FN(CF_EV_BEFORE_BATCH)
EVENT_FN(CF_EV_AFTER_PRED)
EVENT_FN(CF_EV_AFTER_LOSS)
EVENT_FN(CF_EV_BEFORE_BACKWARD)
EVENT_FN(CF_EV_AFTER_CANCEL_BACKWARD)
EVENT_FN(CF_EV_AFTER_BACKWARD)
EVENT_FN(CF_EV_BEFORE_STEP)
EVENT_FN(CF_EV_AFTER_CANCEL_STEP)
EVENT_FN(CF_EV_AFTER_STEP)
EVENT_FN(CF_EV_AFTER_CANCEL_BATCH)
EVENT_FN(CF_EV_AFTER_BATCH)
EVENT_FN(CF_EV_AFTER_CANCEL_TRAIN)
EVENT_FN(CF_EV_AFTER_TRAIN)
EVENT_FN(CF_EV_BEFORE_VALIDATE)
EVENT_FN(CF_EV_AFTER_CANCEL_VALIDATE)
EVENT_FN(CF_EV_AFTER_VALIDATE)
EVENT_FN(CF_EV_AFTER_CANCEL_EPOCH)
EVENT_FN(CF_EV_AFTER_EPOCH)
EVENT_FN(CF_EV_AFTER_CANCEL_FIT)
EVENT_FN(CF_EV_AFTER_FIT)

static void init_logger(cf_callback *cb, event_log *log) {
    memset(cb, 0, sizeof *cb);
    cb->name = "EventLog";
    cb->state = log;
    cf_event_fn fns[CF_EV_COUNT] = {
        [CF_EV_BEFORE_FIT] = on_CF_EV_BEFORE_FIT,
        [CF_EV_BEFORE_EPOCH] = on_CF_EV_BEFORE_EPOCH,
        [CF_EV_BEFORE_TRAIN] = on_CF_EV_BEFORE_TRAIN,
        [CF_EV_BEFORE_BATCH] = on_CF_EV_BEFORE_BATCH,
        [CF_EV_AFTER_PRED] = on_CF_EV_AFTER_PRED,
        [CF_EV_AFTER_LOSS] = on_CF_EV_AFTER_LOSS,
        [CF_EV_BEFORE_BACKWARD] = on_CF_EV_BEFORE_BACKWARD,
        [CF_EV_AFTER_CANCEL_BACKWARD] = on_CF_EV_AFTER_CANCEL_BACKWARD,
        [CF_EV_AFTER_BACKWARD] = on_CF_EV_AFTER_BACKWARD,
        [CF_EV_BEFORE_STEP] = on_CF_EV_BEFORE_STEP,
        [CF_EV_AFTER_CANCEL_STEP] = on_CF_EV_AFTER_CANCEL_STEP,
        [CF_EV_AFTER_STEP] = on_CF_EV_AFTER_STEP,
        [CF_EV_AFTER_CANCEL_BATCH] = on_CF_EV_AFTER_CANCEL_BATCH,
        [CF_EV_AFTER_BATCH] = on_CF_EV_AFTER_BATCH,
        [CF_EV_AFTER_CANCEL_TRAIN] = on_CF_EV_AFTER_CANCEL_TRAIN,
        [CF_EV_AFTER_TRAIN] = on_CF_EV_AFTER_TRAIN,
        [CF_EV_BEFORE_VALIDATE] = on_CF_EV_BEFORE_VALIDATE,
        [CF_EV_AFTER_CANCEL_VALIDATE] = on_CF_EV_AFTER_CANCEL_VALIDATE,
        [CF_EV_AFTER_VALIDATE] = on_CF_EV_AFTER_VALIDATE,
        [CF_EV_AFTER_CANCEL_EPOCH] = on_CF_EV_AFTER_CANCEL_EPOCH,
        [CF_EV_AFTER_EPOCH] = on_CF_EV_AFTER_EPOCH,
        [CF_EV_AFTER_CANCEL_FIT] = on_CF_EV_AFTER_CANCEL_FIT,
        [CF_EV_AFTER_FIT] = on_CF_EV_AFTER_FIT,
    };
    memcpy(cb->on, fns, sizeof fns);
}

typedef struct cancel_case {
    const char *kind_name;
    cf_cancel kind;
    cf_event at;
    int epoch, iter;
    bool training;
} cancel_case;

static void check_events(const cancel_case *c) {
    /* 10 training samples at bs 4 with drop_last: 2 batches; 5 validation samples: 2 batches */
    cf_dls *dls = fixture_dls(10, 5, 4);
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(3, false), .quiet = true), CF_OK);
    static event_log log;
    memset(&log, 0, sizeof log);
    cf_callback logger;
    init_logger(&logger, &log);
    if (c) {
        log.kind = c->kind;
        log.at = c->at;
        log.epoch = c->epoch;
        log.iter = c->iter;
        log.training = c->training;
        log.armed = true;
    }
    cf_callback *cbs[] = {&logger};
    assert_int_equal(cf_fit(learn, 2, .lr = CF_LR(0.01), .cbs = cbs, .n_cbs = 1), CF_OK);

    oracle o;
    oracle_init(&o);
    char args[256] = "2 2 2";
    if (c)
        snprintf(args, sizeof args, "2 2 2 %s %s %d %d %d", c->kind_name, cf_event_name(c->at),
                 c->epoch, c->iter, c->training);
    oracle_run(&o, "fastai_loop.py", args);
    char path[512], line[64];
    snprintf(path, sizeof path, "%s/events.txt", o.dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int i = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) continue;
        if (i >= log.n) fail_msg("event %d: corefit stopped, fastai has %s", i, line);
        if (strcmp(line, log.names[i]) != 0)
            fail_msg("case %s at %s: event %d is %s, fastai's is %s", c ? c->kind_name : "none",
                     c ? cf_event_name(c->at) : "-", i, log.names[i], line);
        i++;
    }
    fclose(f);
    assert_int_equal(i, log.n);
    oracle_cleanup(&o);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_events_without_cancellation(void **state) {
    (void)state;
    check_events(NULL);
}

static void test_events_with_each_cancellation(void **state) {
    (void)state;
    const cancel_case cases[] = {
        {"batch", CF_CANCEL_BATCH, CF_EV_BEFORE_BATCH, 0, 1, true},
        {"batch", CF_CANCEL_BATCH, CF_EV_AFTER_PRED, 1, 0, false},
        {"batch", CF_CANCEL_BATCH, CF_EV_AFTER_LOSS, 0, 0, true},
        {"backward", CF_CANCEL_BACKWARD, CF_EV_BEFORE_BACKWARD, 0, 1, true},
        {"step", CF_CANCEL_STEP, CF_EV_BEFORE_STEP, 1, 0, true},
        {"train", CF_CANCEL_TRAIN, CF_EV_AFTER_BATCH, 0, 0, true},
        {"train", CF_CANCEL_TRAIN, CF_EV_BEFORE_TRAIN, 1, 0, true},
        {"validate", CF_CANCEL_VALIDATE, CF_EV_BEFORE_VALIDATE, 0, 0, false},
        {"validate", CF_CANCEL_VALIDATE, CF_EV_AFTER_BATCH, 1, 0, false},
        {"epoch", CF_CANCEL_EPOCH, CF_EV_BEFORE_TRAIN, 1, 0, true},
        {"epoch", CF_CANCEL_EPOCH, CF_EV_AFTER_STEP, 0, 1, true},
        {"fit", CF_CANCEL_FIT, CF_EV_AFTER_STEP, 0, 1, true},
        {"fit", CF_CANCEL_FIT, CF_EV_AFTER_EPOCH, 0, 0, false},
        {"fit", CF_CANCEL_FIT, CF_EV_BEFORE_VALIDATE, 1, 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_events(&cases[i]);
}

/* ---- schedules ----------------------------------------------------------------------------- */

typedef struct hp_log {
    double lr[4096][2];
    double mom[4096];
    int n;
} hp_log;

static cf_status log_hypers(cf_callback *cb, cf_learner *learn) {
    hp_log *h = cb->state;
    if (h->n < 4096) {
        for (int g = 0; g < learn->opt->n_groups && g < 2; g++)
            h->lr[h->n][g] = learn->opt->hypers[g].lr;
        h->mom[h->n] = learn->opt->hypers[learn->opt->n_groups - 1].mom;
        h->n++;
    }
    return CF_OK;
}

static void check_schedule(const hp_log *h, int from, const char *kind, int n_epoch, int n_iter,
                           const char *params, bool check_mom) {
    oracle o;
    oracle_init(&o);
    char args[512];
    snprintf(args, sizeof args, "%s %d %d 2 %s", kind, n_epoch, n_iter, params);
    oracle_run(&o, "schedules.py", args);
    cf_tensor lr = oracle_get(&o, "lr");
    assert_int_equal(lr.shape.dim[0], n_epoch * n_iter);
    assert_true(h->n - from >= n_epoch * n_iter);
    for (int i = 0; i < n_epoch * n_iter; i++)
        for (int g = 0; g < 2; g++) {
            double want = lr.data[i * 2 + g], got = h->lr[from + i][g];
            if (fabs(got - want) > 1e-6 * fabs(want) + 1e-12)
                fail_msg("%s: batch %d group %d lr %.9g, fastai %.9g", kind, i, g, got, want);
        }
    if (check_mom) {
        cf_tensor mom = oracle_get(&o, "mom");
        for (int i = 0; i < n_epoch * n_iter; i++)
            if (fabs(h->mom[from + i] - mom.data[i]) > 1e-6)
                fail_msg("%s: batch %d mom %.9g, fastai %.9g", kind, i, h->mom[from + i],
                         mom.data[i]);
        free(mom.data);
    }
    free(lr.data);
    oracle_cleanup(&o);
}

static cf_learner *schedule_learner(cf_dls *dls, hp_log *h, cf_callback *cb) {
    memset(cb, 0, sizeof *cb);
    cb->name = "HpLog";
    cb->state = h;
    cb->skip_valid = true;
    cb->on[CF_EV_BEFORE_STEP] = log_hypers;
    cf_learner *learn = NULL;
    cf_callback *cbs[] = {cb};
    assert_int_equal(
        cf_learner_new(&learn, dls, fixture_model(5, true), .quiet = true, .cbs = cbs, .n_cbs = 1),
        CF_OK);
    return learn;
}

static void test_schedules_equal_fastai_formulas(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(40, 8, 8); /* 5 batches per epoch */
    static hp_log h;
    cf_callback cb;

    memset(&h, 0, sizeof h);
    cf_learner *learn = schedule_learner(dls, &h, &cb);
    assert_int_equal(cf_fit_one_cycle(learn, 3, .lr_max = CF_SLICE2(1e-4, 1e-2)), CF_OK);
    check_schedule(&h, 0, "one_cycle", 3, 5, "1e-4 1e-2 0.25 25 1e5 0.95 0.85 0.95", true);
    /* the Recorder keeps the last group's lr and mom per batch, as fastai's hps */
    assert_int_equal(learn->recorder.n_hps, 15);
    for (int i = 0; i < 15; i++) {
        assert_true(learn->recorder.hp_lr[i] == h.lr[i][1]);
        assert_true(learn->recorder.hp_mom[i] == h.mom[i]);
        assert_true(learn->recorder.lrs[i] == h.lr[i][1]);
    }
    cf_learner_free(learn);

    memset(&h, 0, sizeof h);
    learn = schedule_learner(dls, &h, &cb);
    assert_int_equal(cf_fit_one_cycle(learn, 2, .lr_max = CF_SLICE(3e-3), .pct_start = 0.4,
                                      .div = 10, .div_final = 1e4),
                     CF_OK);
    check_schedule(&h, 0, "one_cycle", 2, 5, "0 3e-3 0.4 10 1e4 0.95 0.85 0.95", true);
    cf_learner_free(learn);

    memset(&h, 0, sizeof h);
    learn = schedule_learner(dls, &h, &cb);
    assert_int_equal(cf_fit_flat_cos(learn, 2, .lr = CF_SLICE(1e-3)), CF_OK);
    check_schedule(&h, 0, "flat_cos", 2, 5, "0 1e-3 0.75 1e5", false);
    cf_learner_free(learn);

    memset(&h, 0, sizeof h);
    learn = schedule_learner(dls, &h, &cb);
    assert_int_equal(cf_fit_sgdr(learn, 3, 1, .lr_max = CF_SLICE2(1e-3, 1e-2)), CF_OK);
    check_schedule(&h, 0, "sgdr", 7, 5, "1e-3 1e-2 3 1 2", false);
    cf_learner_free(learn);

    /* fine_tune: frozen one-cycle (pct 0.99, div 25, slice(base_lr)), then unfrozen one-cycle
     * with slice(base_lr/2/lr_mult, base_lr/2), pct 0.3, div 5 */
    memset(&h, 0, sizeof h);
    learn = schedule_learner(dls, &h, &cb);
    assert_int_equal(cf_fine_tune(learn, 2, .base_lr = 2e-3, .freeze_epochs = 1), CF_OK);
    check_schedule(&h, 0, "one_cycle", 1, 5, "0 2e-3 0.99 25 1e5 0.95 0.85 0.95", true);
    check_schedule(&h, 5, "one_cycle", 2, 5, "1e-5 1e-3 0.3 5 1e5 0.95 0.85 0.95", true);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* The schedule functions alone (cf_sched_lin and cf_sched_no are not used by the fit methods; a
 * custom cf_param_scheduler_cb may use them) against fastai's formulas, rising and falling. */
static void test_schedule_functions_equal_fastai(void **state) {
    (void)state;
    enum { N = 11 };
    float pos[N];
    for (int i = 0; i < N; i++) pos[i] = (float)i / (N - 1);
    pos[N - 2] = 0.37f; /* one position off the grid */
    typedef double (*sched)(double, double, double);
    const sched fns[4] = {cf_sched_lin, cf_sched_cos, cf_sched_no, cf_sched_exp};
    const char *names[4] = {"sched_lin", "sched_cos", "sched_no", "sched_exp"};
    const double ends[2][2] = {{1e-4, 3e-2}, {0.95, 0.85}};
    for (int e = 0; e < 2; e++) {
        oracle o;
        oracle_init(&o);
        oracle_put(&o, "pos", pos, cf_shape1(N));
        char args[96];
        snprintf(args, sizeof args, "formulas %.17g %.17g", ends[e][0], ends[e][1]);
        oracle_run(&o, "schedules.py", args);
        for (int k = 0; k < 4; k++) {
            cf_tensor ref = oracle_get(&o, names[k]);
            float ours[N];
            for (int i = 0; i < N; i++) ours[i] = (float)fns[k](ends[e][0], ends[e][1], pos[i]);
            assert_close(names[k], ours, ref.data, N, 1e-6, 0);
            free(ref.data);
        }
        oracle_cleanup(&o);
    }
}

/* cf_recorder_copy: a deep copy of a fit's Recorder into one that held another (cleared first). */
static void test_recorder_copy_is_deep(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(40, 8, 8);
    cf_learner *learn = NULL, *other = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(5, false), .quiet = true,
                                    .metrics = metrics, .n_metrics = 1),
                     CF_OK);
    assert_int_equal(cf_learner_new(&other, dls, fixture_model(6, false), .quiet = true), CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 2), CF_OK);
    assert_int_equal(cf_fit(other, 1, .lr = CF_LR(1e-3)), CF_OK);
    const cf_recorder *src = &learn->recorder;
    cf_recorder dst = other->recorder; /* holds a 1-epoch fit: its arrays must be freed */
    memset(&other->recorder, 0, sizeof other->recorder);
    assert_int_equal(cf_recorder_copy(&dst, src), CF_OK);
    assert_int_equal(dst.n_batches, src->n_batches);
    assert_int_equal(dst.n_hps, src->n_hps);
    assert_int_equal(dst.n_epochs, 2);
    assert_int_equal(dst.n_values, src->n_values);
    assert_int_equal(dst.n_names, src->n_names);
    assert_true(dst.lrs != src->lrs && dst.values != src->values && dst.iters != src->iters);
    size_t nb = (size_t)src->n_batches * sizeof(double), nh = (size_t)src->n_hps * sizeof(double);
    assert_memory_equal(dst.lrs, src->lrs, nb);
    assert_memory_equal(dst.moms, src->moms, nb);
    assert_memory_equal(dst.losses, src->losses, nb);
    assert_memory_equal(dst.hp_lr, src->hp_lr, nh);
    assert_memory_equal(dst.hp_mom, src->hp_mom, nh);
    assert_memory_equal(dst.values, src->values,
                        (size_t)src->n_epochs * src->n_values * sizeof(double));
    assert_memory_equal(dst.times, src->times, (size_t)src->n_epochs * sizeof(double));
    assert_memory_equal(dst.iters, src->iters, (size_t)src->n_epochs * sizeof(int64_t));
    for (int i = 0; i < src->n_names; i++) {
        assert_ptr_not_equal(dst.metric_names[i], src->metric_names[i]);
        assert_string_equal(dst.metric_names[i], src->metric_names[i]);
    }
    assert_true(dst.smooth_val == src->smooth_val && dst.smooth_count == src->smooth_count);
    /* deep: the copy outlives the learner it came from */
    double first_lr = src->lrs[0], last_value = src->values[src->n_epochs * src->n_values - 1];
    char *name1 = cf_strdup(src->metric_names[1]);
    cf_learner_free(learn);
    assert_true(dst.lrs[0] == first_lr);
    assert_true(dst.values[dst.n_epochs * dst.n_values - 1] == last_value);
    assert_string_equal(dst.metric_names[1], name1);
    cf_free(name1);
    cf_recorder_clear(&dst);
    cf_learner_free(other);
    cf_dls_free(dls);
}

static void test_freeze_keeps_body_fixed(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(40, 8, 8);
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(5, true), .quiet = true), CF_OK);
    assert_int_equal(cf_learner_freeze(learn), CF_OK);
    cf_param *body = cf_model_param(learn->model, "0.weight");
    cf_param *head = cf_model_param(learn->model, "2.weight");
    float body0[32], head0[24];
    memcpy(body0, body->data, sizeof body0);
    memcpy(head0, head->data, sizeof head0);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    assert_memory_equal(body->data, body0, sizeof body0);
    assert_memory_not_equal(head->data, head0, sizeof head0);
    assert_int_equal(cf_learner_unfreeze(learn), CF_OK);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    assert_memory_not_equal(body->data, body0, sizeof body0);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* ---- lr_find ------------------------------------------------------------------------------- */

/* One recorded curve's four suggestions against fastai's functions (tests/oracle/lr_suggest.py).
 * noisy: losses drawn at random (short decreasing runs, one from the first point), which is where
 * the longest-run bookkeeping and Python's negative indices show. */
static void check_suggestions(int n, int num_it, int trial, bool noisy) {
    cf_lr_find_result r = {.n = n};
    r.lrs = calloc(n, sizeof(double));
    r.losses = calloc(n, sizeof(double));
    float *lrs_f = malloc(n * sizeof(float)), *losses_f = malloc(n * sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, 100 + trial);
    for (int i = 0; i < n; i++) {
        double lr = cf_sched_exp(1e-7, 10, (double)i / n);
        double x = log10(lr);
        double loss = noisy ? 2 + cf_rng_normal(&rng)
                            : 2.3 - 1.5 / (1 + exp(-(x + 4 + trial))) + 0.02 * cf_rng_normal(&rng) +
                                  (x > -1 ? 3 * (x + 1) * (x + 1) : 0);
        lrs_f[i] = (float)lr;
        losses_f[i] = (float)loss;
        r.lrs[i] = lrs_f[i];
        r.losses[i] = losses_f[i];
    }
    cf_lr_find_suggest(
        &r, num_it, CF_SUGGEST_VALLEY | CF_SUGGEST_SLIDE | CF_SUGGEST_MINIMUM | CF_SUGGEST_STEEP);
    oracle o;
    oracle_init(&o);
    oracle_put(&o, "lrs", lrs_f, cf_shape1(n));
    oracle_put(&o, "losses", losses_f, cf_shape1(n));
    char arg[16];
    snprintf(arg, sizeof arg, "%d", num_it);
    oracle_run(&o, "lr_suggest.py", arg);
    cf_tensor s = oracle_get(&o, "suggest");
    double got[4] = {r.valley, r.slide, r.minimum, r.steep};
    const char *names[4] = {"valley", "slide", "minimum", "steep"};
    for (int k = 0; k < 4; k++)
        if (!(k == 1 && isnan(s.data[k])) && /* fastai's slide has no answer on a short curve */
            !(fabs(got[k] - s.data[k]) <= 1e-5 * fabs(s.data[k])))
            fail_msg("n %d trial %d %s: %.9g, fastai %.9g", n, trial, names[k], got[k], s.data[k]);
    free(s.data);
    oracle_cleanup(&o);
    cf_lr_find_result_free(&r);
    free(lrs_f);
    free(losses_f);
}

static void test_lr_find_suggestions_equal_fastai(void **state) {
    (void)state;
    for (int trial = 0; trial < 3; trial++) check_suggestions(100, 100, trial, false);
    /* a short run (num_it 8 leaves 3 points) and noisy curves */
    for (int trial = 0; trial < 4; trial++) check_suggestions(8, 8, trial, true);
    for (int trial = 0; trial < 4; trial++) check_suggestions(40, 40, trial, true);
}

/* A plain number where an lr goes (`.lr = 5e-2`, which C reads as the struct's first member, with
 * a missing-braces warning) is that scalar lr, not the learner's default. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-braces"
static void test_plain_number_lr_is_scalar(void **state) {
    (void)state;
    float *w[3];
    for (int k = 0; k < 3; k++) {
        cf_dls *dls = fixture_dls(64, 16, 8);
        cf_learner *learn = NULL;
        assert_int_equal(cf_learner_new(&learn, dls, fixture_model(9, false), .quiet = true),
                         CF_OK);
        cf_status st = k == 0   ? cf_fit(learn, 1, .lr = 5e-2)
                       : k == 1 ? cf_fit(learn, 1, .lr = CF_LR(5e-2))
                                : cf_fit(learn, 1);
        assert_int_equal(st, CF_OK);
        size_t n = learn->model->n_weights;
        w[k] = malloc(n * sizeof(float));
        memcpy(w[k], learn->model->weights, n * sizeof(float));
        if (k == 2) {
            assert_memory_equal(w[0], w[1], n * sizeof(float));
            assert_memory_not_equal(w[0], w[2], n * sizeof(float));
        }
        cf_learner_free(learn);
        cf_dls_free(dls);
    }
    for (int k = 0; k < 3; k++) free(w[k]);
}
#pragma GCC diagnostic pop

static void test_lr_find_points_and_restoration(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(64, 16, 8); /* 8 batches per epoch */
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(9, false), .quiet = true), CF_OK);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK); /* non-trivial optimizer state */
    size_t nw = learn->model->n_weights;
    float *w0 = malloc(nw * sizeof(float)), *m0 = malloc(nw * sizeof(float)),
          *v0 = malloc(nw * sizeof(float));
    memcpy(w0, learn->model->weights, nw * sizeof(float));
    memcpy(m0, learn->opt->grad_avg, nw * sizeof(float));
    memcpy(v0, learn->opt->sqr_avg, nw * sizeof(float));
    float steps0[16];
    memcpy(steps0, learn->opt->steps, learn->model->n_params * sizeof(float));

    cf_lr_find_result r;
    assert_int_equal(cf_lr_find(learn, &r, .num_it = 20, .no_stop_div = true), CF_OK);
    assert_int_equal(r.n, 20);
    for (int i = 0; i < r.n; i++) {
        double want = cf_sched_exp(1e-7, 10, i / 20.0);
        assert_true(fabs(r.lrs[i] - want) <= 1e-12 * want);
    }
    assert_memory_equal(learn->model->weights, w0, nw * sizeof(float));
    assert_memory_equal(learn->opt->grad_avg, m0, nw * sizeof(float));
    assert_memory_equal(learn->opt->sqr_avg, v0, nw * sizeof(float));
    assert_memory_equal(learn->opt->steps, steps0, learn->model->n_params * sizeof(float));
    /* as fastai: the optimizer is saved after fit() set lr to the learner's lr */
    assert_true(learn->opt->hypers[0].lr == learn->lr);
    cf_lr_find_result_free(&r);

    /* stop_div: a loss that explodes stops the sweep early */
    assert_int_equal(cf_lr_find(learn, &r, .num_it = 100, .end_lr = 1e6), CF_OK);
    assert_true(r.n < 100);
    assert_false(isnan(r.valley));
    cf_lr_find_result_free(&r);
    free(w0);
    free(m0);
    free(v0);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* ---- get_preds and validate ---------------------------------------------------------------- */

static int freed_call_cbs;
static void count_free(cf_callback *cb) {
    freed_call_cbs++;
    free(cb);
}

/* validate and get_preds own the callbacks of the call, also when they stop before the loop. */
static void test_inference_frees_call_cbs_on_early_error(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(40, 13, 4);
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(11, false), .quiet = true), CF_OK);
    cf_dataloader *valid = dls->valid;
    dls->valid = NULL; /* as a learner built without a validation set */
    freed_call_cbs = 0;
    cf_callback *cb = calloc(1, sizeof *cb);
    cb->name = "counted";
    cb->free = count_free;
    assert_int_equal(cf_validate(learn, NULL, .cbs = (cf_callback *[]){cb}, .n_cbs = 1),
                     CF_ERR_INVALID);
    assert_int_equal(freed_call_cbs, 1);
    cb = calloc(1, sizeof *cb);
    cb->name = "counted";
    cb->free = count_free;
    cf_preds p;
    assert_int_equal(cf_get_preds(learn, &p, .cbs = (cf_callback *[]){cb}, .n_cbs = 1),
                     CF_ERR_INVALID);
    assert_int_equal(freed_call_cbs, 2);
    dls->valid = valid;
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_get_preds_in_dataset_order(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(40, 13, 4);
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(11, false), .quiet = true), CF_OK);
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    cf_preds p;
    assert_int_equal(
        cf_get_preds(learn, &p, .with_decoded = true, .with_loss = true, .with_input = true),
        CF_OK);
    const cf_dataset *ds = dls->valid_ds;
    assert_int_equal(p.n, 13);
    double loss_sum = 0;
    for (int64_t i = 0; i < p.n; i++) {
        float probs[3];
        int decoded;
        assert_int_equal(cf_predict(learn, ds->x + i * 4, probs, &decoded), CF_OK);
        assert_close("preds", p.preds.data + i * 3, probs, 3, 1e-6, 1e-7);
        assert_true(p.targs.data[i] == ds->y[i]);
        assert_memory_equal(p.inputs.data + i * 4, ds->x + i * 4, 4 * sizeof(float));
        assert_int_equal(p.decoded[i], decoded);
        double ce = -log(probs[(int)ds->y[i]]);
        assert_true(fabs(p.losses[i] - ce) < 1e-5 * (1 + ce));
        loss_sum += p.losses[i];
    }
    double values[1];
    assert_int_equal(cf_validate(learn, values), CF_OK);
    assert_true(fabs(values[0] - loss_sum / 13) < 1e-6 * (1 + values[0]));
    cf_preds_free(&p);

    /* the training set, in order and undropped */
    assert_int_equal(cf_get_preds(learn, &p, .train_set = true), CF_OK);
    assert_int_equal(p.n, 40);
    for (int64_t i = 0; i < p.n; i++) assert_true(p.targs.data[i] == dls->train_ds->y[i]);
    cf_preds_free(&p);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_training_reduces_loss_and_records_history(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(256, 64, 16);
    cf_metric *metrics[] = {cf_accuracy()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(13, false), .quiet = true,
                                    .metrics = metrics, .n_metrics = 1),
                     CF_OK);
    double before[2], after[2];
    assert_int_equal(cf_validate(learn, before), CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 4, .lr_max = CF_LR(2e-2)), CF_OK);
    assert_int_equal(cf_validate(learn, after), CF_OK);
    assert_true(after[0] < before[0] * 0.7);
    assert_true(after[1] > 0.8);
    const cf_recorder *rec = &learn->recorder;
    assert_int_equal(rec->n_epochs, 4);
    assert_int_equal(rec->n_batches, 4 * 16);
    assert_int_equal(rec->n_names, 5);
    assert_string_equal(rec->metric_names[0], "epoch");
    assert_string_equal(rec->metric_names[3], "accuracy");
    assert_string_equal(rec->metric_names[4], "time");
    for (int e = 0; e < 4; e++) assert_int_equal(rec->iters[e], 16 * (e + 1));
    /* the last epoch's valid_loss and accuracy are what validate says afterwards */
    if (fabs(rec->values[3 * 3 + 1] - after[0]) >= 1e-9)
        fail_msg("valid_loss %.9g in the recorder, %.9g from validate", rec->values[3 * 3 + 1],
                 after[0]);
    assert_true(fabs(rec->values[3 * 3 + 2] - after[1]) < 1e-9);
    /* train_loss is the debiased smoothed loss of the last batch */
    assert_true(rec->values[3 * 3 + 0] == rec->losses[rec->n_batches - 1]);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* The Recorder's files: CSV as fastai's CSVLogger (values read back exactly), JSON with every
 * per-batch and per-epoch series. */
static void test_recorder_files(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(64, 16, 8);
    cf_metric *metrics[] = {cf_accuracy()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(17, false), .quiet = true,
                                    .metrics = metrics, .n_metrics = 1),
                     CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 2), CF_OK);
    const cf_recorder *rec = &learn->recorder;
    char dir[256], csv[300], json[300], line[512];
    test_tmpdir_make(dir, sizeof dir, "cf-recorder-");
    snprintf(csv, sizeof csv, "%s/log.csv", dir);
    snprintf(json, sizeof json, "%s/rec.json", dir);
    assert_int_equal(cf_recorder_write_csv(rec, csv), CF_OK);
    assert_int_equal(cf_recorder_write_json(rec, json), CF_OK);

    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "epoch,train_loss,valid_loss,accuracy,time\n");
    for (int e = 0; e < rec->n_epochs; e++) {
        assert_non_null(fgets(line, sizeof line, f));
        char *at = line;
        assert_int_equal(strtol(at, &at, 10), e);
        for (int j = 0; j < rec->n_values; j++) {
            assert_true(*at == ',');
            double v = strtod(at + 1, &at);
            assert_true(v == rec->values[e * rec->n_values + j]); /* shortest repr round-trips */
        }
        assert_true(*at == ',' && at[3] == ':'); /* time as mm:ss */
    }
    assert_null(fgets(line, sizeof line, f));
    fclose(f);

    f = fopen(json, "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const char *series[] = {"lrs", "moms", "losses"};
    const double *want[] = {rec->lrs, rec->moms, rec->losses};
    for (int k = 0; k < 3; k++) {
        cJSON *a = cJSON_GetObjectItem(root, series[k]);
        assert_int_equal(cJSON_GetArraySize(a), rec->n_batches);
        for (int i = 0; i < rec->n_batches; i++)
            assert_true(cJSON_GetArrayItem(a, i)->valuedouble == want[k][i]);
    }
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(root, "values")), rec->n_epochs);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(root, "metric_names")), rec->n_names);
    cJSON_Delete(root);
    assert_int_equal(test_tmpdir_remove(dir), 0);
    /* an unwritable path is an error naming it, not a crash */
    assert_int_not_equal(cf_recorder_write_csv(rec, "/nonexistent-dir/log.csv"), CF_OK);
    assert_non_null(strstr(cf_last_error(), "/nonexistent-dir/log.csv"));
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* ---- the learner's state as bytes ---------------------------------------------------------- */

static cf_learner *state_learner(cf_dls *dls, uint64_t seed, int n_trackers) {
    cf_metric *metrics[] = {cf_accuracy()};
    cf_callback *cbs[2] = {cf_early_stopping_cb(.patience = 3),
                           cf_reduce_lr_on_plateau_cb(.monitor = "accuracy", .patience = 5)};
    for (int i = n_trackers; i < 2; i++) cf_callback_free(cbs[i]);
    cf_learner *learn = NULL;
    assert_int_equal(cf_learner_new(&learn, dls, fixture_model(seed, true), .quiet = true,
                                    .metrics = metrics, .n_metrics = 1, .cbs = cbs,
                                    .n_cbs = n_trackers),
                     CF_OK);
    return learn;
}

static void *export_all(const cf_learner *learn, size_t *n) {
    *n = cf_learner_export_state(learn, NULL, 0);
    void *buf = malloc(*n);
    assert_int_equal(cf_learner_export_state(learn, buf, *n), *n);
    return buf;
}

/* Everything a fit changed reads back into another learner of the same shape, and bytes that
 * are not such a state (truncated, another magic or version, another learner's callbacks, an
 * absurd count) are refused with the offset, leaving the learner as it was. */
static void test_learner_state_round_trip_and_refusals(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(128, 64, 16);
    cf_learner *a = state_learner(dls, 13, 2);
    assert_int_equal(cf_fit_one_cycle(a, 2, .lr_max = CF_LR(1e-2)), CF_OK);
    assert_int_equal(cf_learner_note_figure(a, "figures/loss.png"), CF_OK);
    size_t n = 0;
    unsigned char *bytes = export_all(a, &n);
    /* too small a buffer is not written */
    unsigned char probe[16] = {0};
    assert_int_equal(cf_learner_export_state(a, probe, sizeof probe), n);
    for (size_t i = 0; i < sizeof probe; i++) assert_int_equal(probe[i], 0);

    cf_learner *b = state_learner(dls, 99, 2);
    assert_int_equal(cf_learner_import_state(b, bytes, n), CF_OK);
    assert_memory_equal(b->model->weights, a->model->weights, a->model->n_weights * 4);
    assert_non_null(b->opt);
    assert_memory_equal(b->opt->grad_avg, a->opt->grad_avg, a->model->n_weights * 4);
    assert_memory_equal(b->opt->sqr_avg, a->opt->sqr_avg, a->model->n_weights * 4);
    assert_memory_equal(b->opt->hypers, a->opt->hypers,
                        (size_t)a->opt->n_groups * sizeof(cf_hypers));
    assert_int_equal(b->recorder.n_batches, a->recorder.n_batches);
    assert_int_equal(b->recorder.n_epochs, 2);
    assert_memory_equal(b->recorder.losses, a->recorder.losses, (size_t)a->recorder.n_batches * 8);
    assert_memory_equal(b->recorder.values, a->recorder.values,
                        (size_t)(a->recorder.n_epochs * a->recorder.n_values) * 8);
    assert_string_equal(b->recorder.metric_names[3], "accuracy");
    assert_int_equal(b->n_final_record, a->n_final_record);
    assert_memory_equal(b->final_record, a->final_record, (size_t)a->n_final_record * 8);
    assert_int_equal(b->n_figures, 1);
    assert_string_equal(b->figures[0], "figures/loss.png");
    /* the trackers' state came along: b exports exactly what a did */
    size_t nb = 0;
    unsigned char *again = export_all(b, &nb);
    assert_int_equal(nb, n);
    assert_memory_equal(again, bytes, n);
    free(again);

    /* refusals: c stays a fresh learner */
    cf_learner *c = state_learner(dls, 5, 2);
    float *w0 = malloc(c->model->n_weights * 4);
    memcpy(w0, c->model->weights, c->model->n_weights * 4);
    size_t cuts[] = {0, 3, 8, 40, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        assert_int_equal(cf_learner_import_state(c, bytes, cuts[i]), CF_ERR_INVALID);
        assert_non_null(strstr(cf_last_error(), "offset"));
    }
    unsigned char *bad = malloc(n);
    memcpy(bad, bytes, n);
    bad[0] = 'X';
    assert_int_equal(cf_learner_import_state(c, bad, n), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "magic"));
    memcpy(bad, bytes, n);
    bad[4] = 9; /* version */
    assert_int_equal(cf_learner_import_state(c, bad, n), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "version 9"));
    memcpy(bad, bytes, n);
    uint64_t huge = (uint64_t)1 << 40; /* the weight count */
    memcpy(bad + 8, &huge, sizeof huge);
    assert_int_equal(cf_learner_import_state(c, bad, n), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "offset 8"));
    /* one byte more than the state */
    unsigned char *longer = calloc(1, n + 1);
    memcpy(longer, bytes, n);
    assert_int_equal(cf_learner_import_state(c, longer, n + 1), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "left over"));
    free(longer);
    assert_memory_equal(c->model->weights, w0, c->model->n_weights * 4);
    assert_null(c->opt);
    assert_int_equal(c->recorder.n_epochs, 0);
    assert_int_equal(c->n_figures, 0);
    /* a learner with other callbacks does not take this state */
    cf_learner *d = state_learner(dls, 5, 1);
    assert_int_equal(cf_learner_import_state(d, bytes, n), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "2 callbacks, this learner has 1"));
    assert_null(d->opt);
    free(bad);
    free(w0);
    free(bytes);
    cf_learner_free(a);
    cf_learner_free(b);
    cf_learner_free(c);
    cf_learner_free(d);
    cf_dls_free(dls);
}

/* The optimizer's, the recorder's, lr_find's and the predictions' formats check what they read. */
static void test_part_states_refuse_what_is_not_theirs(void **state) {
    (void)state;
    cf_dls *dls = fixture_dls(64, 32, 16);
    cf_learner *a = state_learner(dls, 1, 0);
    assert_int_equal(cf_learner_create_opt(a), CF_OK);
    cf_model *other = fixture_model(2, false);
    cf_optimizer *o2 = NULL;
    cf_opt_config sgd = cf_opt_sgd_defaults();
    assert_int_equal(cf_optimizer_new(&o2, other, &sgd), CF_OK);
    size_t n = cf_optimizer_export(a->opt, NULL, 0);
    unsigned char *buf = malloc(n);
    assert_int_equal(cf_optimizer_export(a->opt, buf, n), n);
    assert_int_equal(cf_optimizer_import(o2, buf, n), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "kind 1, 2 groups"));
    assert_int_equal(cf_optimizer_import(a->opt, buf, n - 4), CF_ERR_INVALID);
    assert_int_equal(cf_optimizer_import(a->opt, buf, n), CF_OK);
    free(buf);
    cf_optimizer_free(o2);
    cf_model_free(other);

    /* a recorder whose lrs count claims more than the bytes hold */
    assert_int_equal(cf_fit(a, 1), CF_OK);
    n = cf_recorder_export(&a->recorder, NULL, 0);
    buf = malloc(n);
    cf_recorder_export(&a->recorder, buf, n);
    uint64_t lie = 1000000;
    memcpy(buf + 8, &lie, sizeof lie);
    cf_recorder r = {0};
    assert_int_equal(cf_recorder_import(&r, buf, n), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "recorder state: offset 8: lrs count 1000000"));
    assert_null(r.lrs);
    free(buf);

    cf_lr_find_result lr = {.n = 2,
                            .lrs = (double[]){1e-3, 1e-2},
                            .losses = (double[]){2, 1},
                            .suggest = CF_SUGGEST_VALLEY,
                            .valley = 3e-3};
    n = cf_lr_find_result_export(&lr, NULL, 0);
    buf = malloc(n);
    cf_lr_find_result_export(&lr, buf, n);
    cf_lr_find_result back = {0};
    assert_int_equal(cf_lr_find_result_import(&back, buf, n), CF_OK);
    assert_int_equal(back.n, 2);
    assert_true(back.losses[1] == 1 && back.valley == 3e-3);
    assert_int_equal(cf_lr_find_result_import(&back, buf, n - 1), CF_ERR_INVALID);
    assert_int_equal(back.n, 2); /* unchanged */
    cf_lr_find_result_free(&back);
    free(buf);

    cf_preds p = {0};
    assert_int_equal(cf_get_preds(a, &p, .with_decoded = true, .with_loss = true), CF_OK);
    n = cf_preds_export(&p, NULL, 0);
    buf = malloc(n);
    cf_preds_export(&p, buf, n);
    cf_preds q = {0};
    assert_int_equal(cf_preds_import(&q, buf, n), CF_OK);
    assert_int_equal(q.n, p.n);
    assert_memory_equal(q.preds.data, p.preds.data, cf_tensor_numel(&p.preds) * 4);
    assert_memory_equal(q.decoded, p.decoded, (size_t)p.n * 8);
    assert_memory_equal(q.losses, p.losses, (size_t)p.n * 4);
    assert_int_equal(cf_preds_import(&q, buf, 20), CF_ERR_INVALID);
    assert_int_equal(q.n, p.n);
    cf_preds_free(&q);
    cf_preds_free(&p);
    free(buf);
    cf_learner_free(a);
    cf_dls_free(dls);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_without_cancellation),
        cmocka_unit_test(test_events_with_each_cancellation),
        cmocka_unit_test(test_schedules_equal_fastai_formulas),
        cmocka_unit_test(test_schedule_functions_equal_fastai),
        cmocka_unit_test(test_recorder_copy_is_deep),
        cmocka_unit_test(test_freeze_keeps_body_fixed),
        cmocka_unit_test(test_lr_find_suggestions_equal_fastai),
        cmocka_unit_test(test_plain_number_lr_is_scalar),
        cmocka_unit_test(test_lr_find_points_and_restoration),
        cmocka_unit_test(test_get_preds_in_dataset_order),
        cmocka_unit_test(test_inference_frees_call_cbs_on_early_error),
        cmocka_unit_test(test_training_reduces_loss_and_records_history),
        cmocka_unit_test(test_recorder_files),
        cmocka_unit_test(test_learner_state_round_trip_and_refusals),
        cmocka_unit_test(test_part_states_refuse_what_is_not_theirs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
