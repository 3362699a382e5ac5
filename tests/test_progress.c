/* The progress display and the number formatting it shares with the CSV logger: the table
 * against a Python implementation of fastprogress's console table (tests/oracle/metrics.py),
 * floats against Python's repr, and plain output (no carriage returns or escape codes) when
 * there is no terminal. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/learn.h"

static char *read_all(FILE *f) {
    fflush(f);
    long n = ftell(f);
    assert_true(n >= 0);
    char *s = calloc((size_t)n + 1, 1);
    rewind(f);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    return s;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    char *s = read_all(f);
    fclose(f);
    return s;
}

/* Doubles travel to the oracle as pairs of float32 bit patterns. */
static void put_doubles(oracle *o, const char *name, const double *x, int n) {
    oracle_put(o, name, (const float *)x, cf_shape1(2 * n));
}

static void test_format_float_matches_python_repr(void **state) {
    (void)state;
    enum { N = 400 };
    static double x[N];
    int n = 0;
    const double special[] = {0.0,        -0.0,
                              1.0,        123.0,
                              0.1,        0.1 + 0.2,
                              1.0 / 3,    1e-4,
                              1e-5,       1.5e-7,
                              1e15,       1e16,
                              1e22,       1e100,
                              5e-324,     1.7976931348623157e308,
                              -2.5,       0.39175450801849365,
                              12345678.9, 9.999999999999999e-5,
                              1e-3 / 10,  2e-3,
                              1e-7,       10.0,
                              0.00012,    123456789012345678.0};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) x[n++] = special[i];
    cf_rng rng;
    cf_rng_seed(&rng, 5);
    while (n < N) {
        /* random mantissas over a wide range of exponents, some short decimals */
        double m = cf_rng_uniform(&rng) * 10 - 5;
        int e = (int)cf_rng_below(&rng, 50) - 25;
        double v = m * pow(10.0, e);
        if (n % 3 == 0) v = round(v * 1000) / 1000;
        if (n % 7 == 0) v = (float)v; /* a float32 value as Python sees it after .item() */
        x[n++] = v;
    }
    oracle o;
    oracle_init(&o);
    put_doubles(&o, "x", x, N);
    oracle_run(&o, "metrics.py", "pyfloat");
    char path[512];
    snprintf(path, sizeof path, "%s/pyfloat.txt", o.dir);
    char *want = read_file(path);
    char *line = want;
    for (int i = 0; i < N; i++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        char got[40];
        cf_format_float(x[i], got, sizeof got);
        if (strcmp(got, line) != 0)
            fail_msg("cf_format_float(%.17g) = \"%s\", Python repr \"%s\"", x[i], got, line);
        line = nl + 1;
    }
    free(want);
    oracle_cleanup(&o);
    char b[40];
    assert_string_equal(cf_format_float(NAN, b, sizeof b), "nan");
    assert_string_equal(cf_format_float(-INFINITY, b, sizeof b), "-inf");
}

static void test_format_time(void **state) {
    (void)state;
    char b[32];
    assert_string_equal(cf_format_time(0, b, sizeof b), "00:00");
    assert_string_equal(cf_format_time(59.99, b, sizeof b), "00:59");
    assert_string_equal(cf_format_time(61, b, sizeof b), "01:01");
    assert_string_equal(cf_format_time(3599.9, b, sizeof b), "59:59");
    assert_string_equal(cf_format_time(3600, b, sizeof b), "1:00:00");
    assert_string_equal(cf_format_time(36000 + 62.5, b, sizeof b), "10:01:02");
    assert_string_equal(cf_format_time(NAN, b, sizeof b), "00:00");
}

/* A learner filled by hand with a Recorder of E epochs, as the Recorder leaves it. */
enum { E = 4, V = 5 };
static const char *names[] = {"epoch",    "train_loss", "valid_loss",
                              "accuracy", "f1_score",   "a_rather_long_metric_name",
                              "time"};

typedef struct fake {
    cf_learner learn;
    double values[E * V];
    double times[E];
} fake;

static void fake_init(fake *f) {
    memset(f, 0, sizeof *f);
    f->learn.replica.is_master = true;
    f->learn.logging = true;
    f->learn.n_epoch = E;
    f->learn.recorder.metric_names = (char **)names;
    f->learn.recorder.n_names = 7;
    f->learn.recorder.n_values = V;
    f->learn.recorder.values = f->values;
    f->learn.recorder.times = f->times;
    cf_rng rng;
    cf_rng_seed(&rng, 77);
    for (int i = 0; i < E * V; i++) f->values[i] = cf_rng_uniform(&rng) * (i % 3 ? 1 : 2000);
    f->values[2 * V + 3] = NAN;       /* a metric with nothing accumulated */
    f->values[1 * V + 0] = 1234567.5; /* wider than its column */
    const double t[E] = {3.7, 61.2, 3725.9, 0.2};
    memcpy(f->times, t, sizeof t);
}

/* Runs a fit's events on cb the way the loop raises them (n_iter batches per phase). */
static void drive(cf_callback *cb, fake *f, int n_iter) {
    cf_learner *l = &f->learn;
    cb->on[CF_EV_BEFORE_FIT](cb, l);
    for (int e = 0; e < E; e++) {
        l->epoch = e;
        for (int phase = 0; phase < 2; phase++) {
            l->training = phase == 0;
            l->n_iter = n_iter;
            cf_event before = phase ? CF_EV_BEFORE_VALIDATE : CF_EV_BEFORE_TRAIN;
            cf_event after = phase ? CF_EV_AFTER_VALIDATE : CF_EV_AFTER_TRAIN;
            if (cb->on[before]) cb->on[before](cb, l);
            for (int i = 0; i < n_iter; i++) {
                l->iter = i;
                l->smooth_loss = 1.0 / (1 + i);
                if (cb->on[CF_EV_AFTER_BATCH]) cb->on[CF_EV_AFTER_BATCH](cb, l);
            }
            if (cb->on[after]) cb->on[after](cb, l);
        }
        l->recorder.n_epochs = e + 1; /* the Recorder's after_epoch ran first (order 50) */
        cb->on[CF_EV_AFTER_EPOCH](cb, l);
    }
    if (cb->on[CF_EV_AFTER_FIT]) cb->on[CF_EV_AFTER_FIT](cb, l);
}

static void put_table_inputs(oracle *o, fake *f) {
    char path[512];
    snprintf(path, sizeof path, "%s/names.txt", o->dir);
    FILE *nf = fopen(path, "w");
    for (int j = 0; j < 7; j++) fprintf(nf, "%s\n", names[j]);
    fclose(nf);
    put_doubles(o, "values", f->values, E * V);
    put_doubles(o, "times", f->times, E);
    float epochs[E];
    for (int e = 0; e < E; e++) epochs[e] = (float)e;
    oracle_put(o, "epochs", epochs, cf_shape1(E));
}

static bool has_control(const char *s) {
    return strchr(s, '\r') || strchr(s, '\033');
}

static void test_table_matches_fastprogress(void **state) {
    (void)state;
    static fake f;
    fake_init(&f);
    FILE *table = tmpfile(), *bar = tmpfile();
    cf_callback *cb = cf_progress_cb_to(table, bar, 0);
    assert_non_null(cb);
    assert_int_equal(cb->order, CF_ORDER_PROGRESS);
    drive(cb, &f, 7);
    char *got = read_all(table), *bars = read_all(bar);

    oracle o;
    oracle_init(&o);
    put_table_inputs(&o, &f);
    oracle_run(&o, "metrics.py", "table");
    char path[512];
    snprintf(path, sizeof path, "%s/table.txt", o.dir);
    char *want = read_file(path);
    if (strcmp(got, want) != 0) fail_msg("table differs:\n%s\nfastprogress:\n%s", got, want);
    assert_false(has_control(got));
    assert_string_equal(bars, ""); /* no terminal: no bars at all */
    free(want);
    oracle_cleanup(&o);
    free(got);
    free(bars);
    cf_callback_free(cb);
    fclose(table);
    fclose(bar);
}

static void test_live_bar_on_terminal(void **state) {
    (void)state;
    static fake f;
    fake_init(&f);
    FILE *table = tmpfile(), *bar = tmpfile();
    cf_callback *cb = cf_progress_cb_to(table, bar, 1);
    drive(cb, &f, 3);
    char *got = read_all(table), *bars = read_all(bar);
    /* the table never carries bar output */
    assert_false(has_control(got));
    assert_int_equal(strncmp(got, "epoch     train_loss  valid_loss  accuracy  f1_score", 52), 0);
    /* bars: both phases, every epoch, the final state, the smoothed loss, and erased at the end */
    assert_non_null(strstr(bars, "epoch 1/4  train ["));
    assert_non_null(strstr(bars, "epoch 4/4  valid ["));
    assert_non_null(strstr(bars, "] 3/3  "));
    assert_non_null(strstr(bars, "loss 0.3333"));
    size_t n = strlen(bars);
    assert_true(n > 6 && strcmp(bars + n - 4, "\r\033[K") == 0);
    free(got);
    free(bars);
    cf_callback_free(cb);
    fclose(table);
    fclose(bar);
}

static void test_quiet_cases(void **state) {
    (void)state;
    static fake f;
    fake_init(&f);
    /* not logging (validate, lr_find): no table; not master: nothing */
    for (int c = 0; c < 2; c++) {
        FILE *table = tmpfile(), *bar = tmpfile();
        cf_callback *cb = cf_progress_cb_to(table, bar, c == 0 ? 1 : 0);
        f.learn.logging = c != 0;
        f.learn.replica.is_master = c == 0;
        drive(cb, &f, 2);
        char *got = read_all(table), *bars = read_all(bar);
        assert_string_equal(got, "");
        if (c == 0) assert_non_null(strstr(bars, "train ["));
        if (c == 1) assert_string_equal(bars, "");
        free(got);
        free(bars);
        cf_callback_free(cb);
        fclose(table);
        fclose(bar);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_float_matches_python_repr),
        cmocka_unit_test(test_format_time),
        cmocka_unit_test(test_table_matches_fastprogress),
        cmocka_unit_test(test_live_bar_on_terminal),
        cmocka_unit_test(test_quiet_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
