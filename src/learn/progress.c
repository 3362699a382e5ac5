/* The progress display: fastai's ProgressCallback drawing fastprogress's console bars and
 * table, plus the number formatting shared with the CSV logger and the trackers. */
#include "corefit/learn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- formatting ---------------------------------------------------------------------------- */

const char *cf_format_time(double seconds, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    long long t = isfinite(seconds) && seconds > 0 ? (long long)seconds : 0; /* int(t) */
    long long h = t / 3600, m = (t / 60) % 60, s = t % 60;
    if (h != 0)
        snprintf(buf, n, "%lld:%02lld:%02lld", h, m, s);
    else
        snprintf(buf, n, "%02lld:%02lld", m, s);
    return buf;
}

const char *cf_format_float(double x, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    if (isnan(x)) {
        snprintf(buf, n, "nan");
        return buf;
    }
    if (isinf(x)) {
        snprintf(buf, n, x < 0 ? "-inf" : "inf");
        return buf;
    }
    /* The fewest significant digits that read back as x (what Python's repr finds). */
    char sci[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, x);
        if (strtod(sci, NULL) == x) break;
    }
    /* sci = [-]d[.ddd]e(+|-)XX: split into sign, digits and decimal exponent. */
    const char *s = sci;
    bool neg = *s == '-';
    if (neg) s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9' && nd < 20) digits[nd++] = *s;
    int exp10 = *s == 'e' ? atoi(s + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int decpt = exp10 + 1; /* digits d1 d2 ... represent 0.d1d2... x 10^decpt */
    char out[64];
    size_t k = 0;
    if (neg) out[k++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -decpt; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
            for (int i = nd; i < decpt; i++) out[k++] = '0';
            out[k++] = '.';
            out[k++] = '0';
        } else {
            for (int i = 0; i < decpt; i++) out[k++] = digits[i];
            out[k++] = '.';
            for (int i = decpt; i < nd; i++) out[k++] = digits[i];
        }
        out[k] = '\0';
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        int e = decpt - 1;
        snprintf(out + k, sizeof out - k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    snprintf(buf, n, "%s", out);
    return buf;
}

/* Python's f'{v:.6f}' (glibc prints "-nan" for some NaNs; Python never does). */
static void format_fixed6(double v, char *buf, size_t n) {
    if (isnan(v))
        snprintf(buf, n, "nan");
    else if (isinf(v))
        snprintf(buf, n, v < 0 ? "-inf" : "inf");
    else
        snprintf(buf, n, "%.6f", v);
}

/* ---- the callback -------------------------------------------------------------------------- */

#define MAX_COLS 64
#define BAR_SLOTS 24
#define REFRESH_S 0.1

typedef struct progress_state {
    FILE *table_out, *bar_out; /* NULL: stdout / stderr at the time of writing */
    int tty_mode;              /* 1, 0, -1: detect */
    bool tty;                  /* this fit draws live bars */
    bool table;                /* this fit writes the table */
    int n_cols;
    int width[MAX_COLS]; /* padded header widths */
    double phase_start, last_draw;
    bool bar_shown;
} progress_state;

static FILE *table_file(const progress_state *s) {
    return s->table_out ? s->table_out : stdout;
}
static FILE *bar_file(const progress_state *s) {
    return s->bar_out ? s->bar_out : stderr;
}

static void erase_bar(progress_state *s) {
    if (!s->bar_shown) return;
    fputs("\r\033[K", bar_file(s));
    fflush(bar_file(s));
    s->bar_shown = false;
}

static void draw_bar(progress_state *s, cf_learner *learn, int64_t done, double now) {
    int64_t total = learn->n_iter;
    if (total < 0) total = 0;
    if (done > total) done = total;
    double elapsed = now - s->phase_start;
    char el[32], rem[32] = "?";
    cf_format_time(elapsed, el, sizeof el);
    if (done > 0) cf_format_time(elapsed / (double)done * (double)total - elapsed, rem, sizeof rem);
    char bar[BAR_SLOTS + 1];
    int filled = total > 0 ? (int)(BAR_SLOTS * done / total) : 0;
    for (int i = 0; i < BAR_SLOTS; i++) bar[i] = i < filled ? '#' : '.';
    bar[BAR_SLOTS] = '\0';
    char loss[48] = "";
    if (learn->training && done > 0 && isfinite(learn->smooth_loss))
        snprintf(loss, sizeof loss, "  loss %.4f", learn->smooth_loss);
    FILE *f = bar_file(s);
    fprintf(f, "\r\033[Kepoch %d/%d  %s [%s] %lld/%lld  %s<%s%s", learn->epoch + 1, learn->n_epoch,
            learn->training ? "train" : "valid", bar, (long long)done, (long long)total, el, rem,
            loss);
    fflush(f);
    s->bar_shown = true;
    s->last_draw = now;
}

/* fastprogress ConsoleMasterBar.write(table=True). */
static void write_header(progress_state *s, const cf_recorder *rec) {
    FILE *f = table_file(s);
    s->n_cols = rec->n_names < MAX_COLS ? rec->n_names : MAX_COLS;
    for (int j = 0; j < s->n_cols; j++) {
        const char *name = rec->metric_names[j] ? rec->metric_names[j] : "";
        int len = (int)strlen(name);
        s->width[j] = len < 8 ? 8 : len;
        if (j) fputs("  ", f);
        fprintf(f, "%s%*s", name, s->width[j] - len, "");
    }
    fputc('\n', f);
    fflush(f);
}

static void write_cell(FILE *f, const char *t, int width) {
    int pad = 2 + width - (int)strlen(t);
    /* a value wider than its column still gets a space (fastprogress would run it into the
     * next one) */
    fprintf(f, "%s%*s", t, pad > 0 ? pad : 1, "");
}

static void write_row(progress_state *s, cf_learner *learn) {
    const cf_recorder *rec = &learn->recorder;
    if (rec->n_epochs < 1 || s->n_cols < 2) return;
    int e = rec->n_epochs - 1;
    FILE *f = table_file(s);
    char t[64];
    snprintf(t, sizeof t, "%d", learn->epoch);
    write_cell(f, t, s->width[0]);
    for (int j = 1; j < s->n_cols - 1 && j - 1 < rec->n_values; j++) {
        format_fixed6(rec->values[(size_t)e * (size_t)rec->n_values + (size_t)(j - 1)], t,
                      sizeof t);
        write_cell(f, t, s->width[j]);
    }
    cf_format_time(rec->times ? rec->times[e] : 0, t, sizeof t);
    write_cell(f, t, s->width[s->n_cols - 1]);
    fputc('\n', f);
    fflush(f);
}

static cf_status pg_before_fit(cf_callback *cb, cf_learner *learn) {
    progress_state *s = cb->state;
    s->bar_shown = false;
    s->tty = false;
    s->table = false;
    if (!learn->replica.is_master) return CF_OK;
    s->tty = s->tty_mode > 0 || (s->tty_mode < 0 && isatty(fileno(bar_file(s))));
    s->table = learn->logging && learn->recorder.n_names > 0;
    if (s->table) write_header(s, &learn->recorder);
    return CF_OK;
}

static cf_status pg_before_phase(cf_callback *cb, cf_learner *learn) {
    progress_state *s = cb->state;
    if (!s->tty) return CF_OK;
    s->phase_start = cf_now();
    draw_bar(s, learn, 0, s->phase_start);
    return CF_OK;
}

static cf_status pg_after_batch(cf_callback *cb, cf_learner *learn) {
    progress_state *s = cb->state;
    if (!s->tty) return CF_OK;
    double now = cf_now();
    int64_t done = learn->iter + 1;
    if (now - s->last_draw >= REFRESH_S || done >= learn->n_iter) draw_bar(s, learn, done, now);
    return CF_OK;
}

static cf_status pg_end_phase(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    erase_bar(cb->state);
    return CF_OK;
}

static cf_status pg_after_epoch(cf_callback *cb, cf_learner *learn) {
    progress_state *s = cb->state;
    erase_bar(s);
    if (s->table && learn->logging) write_row(s, learn);
    return CF_OK;
}

static void pg_free(cf_callback *cb) {
    if (!cb) return;
    if (cb->state) erase_bar(cb->state);
    cf_free(cb->state);
    cf_free(cb);
}

cf_callback *cf_progress_cb_to(FILE *table, FILE *bar, int tty) {
    cf_callback *cb =
        cf_callback_new("ProgressCallback", CF_ORDER_PROGRESS, sizeof(progress_state));
    if (!cb) return NULL;
    progress_state *s = cb->state;
    s->table_out = table;
    s->bar_out = bar;
    s->tty_mode = tty;
    cb->free = pg_free;
    cb->on[CF_EV_BEFORE_FIT] = pg_before_fit;
    cb->on[CF_EV_BEFORE_TRAIN] = cb->on[CF_EV_BEFORE_VALIDATE] = pg_before_phase;
    cb->on[CF_EV_AFTER_BATCH] = pg_after_batch;
    cb->on[CF_EV_AFTER_EPOCH] = pg_after_epoch;
    /* the bar goes wherever a phase or the fit ends, cancelled or not */
    static const cf_event phase_ends[] = {CF_EV_AFTER_TRAIN,    CF_EV_AFTER_CANCEL_TRAIN,
                                          CF_EV_AFTER_VALIDATE, CF_EV_AFTER_CANCEL_VALIDATE,
                                          CF_EV_AFTER_FIT,      CF_EV_AFTER_CANCEL_FIT};
    for (size_t i = 0; i < sizeof phase_ends / sizeof *phase_ends; i++)
        cb->on[phase_ends[i]] = pg_end_phase;
    return cb;
}

cf_callback *cf_progress_cb(void) {
    return cf_progress_cb_to(NULL, NULL, -1);
}
