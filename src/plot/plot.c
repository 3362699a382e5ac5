/* Plot layer: fastai's Recorder and interpretation figures as PNG files through PLplot's
 * pngcairo driver (see corefit/plot.h).
 *
 * Every figure follows the same path (run_figure): the data are checked and prepared into plain
 * arrays first, a temporary file is created next to the target (mkstemp), then, under one
 * process-wide mutex, a fresh PLplot stream is made (plmkstrm), pointed at the temporary file,
 * drawn by a callback that only makes PLplot calls, and ended (plend1); the previous stream is
 * made current again. PLplot's fatal errors call the exit handler installed here, which
 * longjmps back to run_figure instead of letting PLplot exit the process; its non-fatal errors
 * are collected through plsError/plsabort. The temporary file is checked to be a PNG and
 * renamed over the target. */
#include "corefit/plot.h"

#include <errno.h>
#include <math.h>
#include <plplot.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plot_internal.h"

/* ---- the figure machinery ----------------------------------------------------------------- */

enum {
    COL_BG = 0,
    COL_FG = 1, /* text, axes, frame */
    COL_C0 = 2, /* matplotlib's default cycle: C0 blue, C1 orange, C2 green, C3 red, ... */
    COL_C1,
    COL_C2,
    COL_C3,
    COL_C4,
    COL_C5,
    COL_C6,
    COL_C7,
    COL_C8,
    COL_C9,
    COL_GRID = 12,
    COL_WHITE = 13,
    COL_SCRATCH = 14, /* re-defined while drawing (heat map cells, image pixels) */
    COL_EPOCH = 15,
    N_COLS = 16
};

static const PLINT k_palette[N_COLS][3] = {
    {255, 255, 255}, {38, 38, 38},    {31, 119, 180},  {255, 127, 14},
    {44, 160, 44},   {214, 39, 40},   {148, 103, 189}, {140, 86, 75},
    {227, 119, 194}, {127, 127, 127}, {188, 189, 34},  {23, 190, 207},
    {222, 222, 222}, {255, 255, 255}, {128, 128, 128}, {150, 150, 150},
};

typedef void (*draw_fn)(void *ctx);

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_available = -1; /* -1: not checked yet */
static int g_width = 800, g_height = 600;
static jmp_buf g_jmp;
static volatile int g_armed;
static char g_fatal[512];   /* message of PLplot's last fatal error (plexit) */
static char g_abort[512];   /* message of PLplot's last aborted operation (plabort) */
static char g_errmsg[1024]; /* plsError buffer */
static PLINT g_errcode;

static int on_plexit(PLCHAR_VECTOR msg) {
    snprintf(g_fatal, sizeof g_fatal, "%s", msg && *msg ? msg : "fatal error");
    if (g_armed) {
        g_armed = 0;
        longjmp(g_jmp, 1);
    }
    return 1; /* not ours: PLplot's own behaviour (exit) */
}

static void on_plabort(PLCHAR_VECTOR msg) {
    if (!g_armed) return;
    if (!g_abort[0]) snprintf(g_abort, sizeof g_abort, "%s", msg && *msg ? msg : "error");
}

/* plgDevs before any stream is started: is pngcairo there? (caller holds g_lock) */
static bool check_available_locked(void) {
    if (g_available < 0) {
        const char *menu[256], *names[256];
        const char **m = menu, **d = names;
        int n = 256;
        plgDevs(&m, &d, &n);
        g_available = 0;
        for (int i = 0; i < n && i < 256; i++)
            if (d[i] && strcmp(d[i], "pngcairo") == 0) g_available = 1;
        plsexit(on_plexit);
        plsabort(on_plabort);
    }
    return g_available == 1;
}

bool cf_plot_available(void) {
    pthread_mutex_lock(&g_lock);
    bool ok = check_available_locked();
    pthread_mutex_unlock(&g_lock);
    return ok;
}

cf_status cf_plot_set_size(int width, int height) {
    if (width == 0 && height == 0) width = 800, height = 600;
    if (width < 64 || width > 8192 || height < 64 || height > 8192)
        return cf_fail(CF_ERR_INVALID, "plot size %dx%d: each side must be in [64, 8192] pixels",
                       width, height);
    pthread_mutex_lock(&g_lock);
    g_width = width;
    g_height = height;
    pthread_mutex_unlock(&g_lock);
    return CF_OK;
}

/* Creates "<dir>/.<base>.XXXXXX" next to path. */
static cf_status make_temp(const char *what, const char *path, char *tmp, size_t size) {
    if (!path || !*path) return cf_fail(CF_ERR_INVALID, "%s: empty output path", what);
    size_t len = strlen(path);
    if (path[len - 1] == '/')
        return cf_fail(CF_ERR_INVALID, "%s: output path '%s' names a folder, not a file", what,
                       path);
    const char *slash = strrchr(path, '/');
    int n;
    if (slash)
        n = snprintf(tmp, size, "%.*s/.%s.XXXXXX", (int)(slash - path), path, slash + 1);
    else
        n = snprintf(tmp, size, ".%s.XXXXXX", path);
    if (n < 0 || (size_t)n >= size)
        return cf_fail(CF_ERR_INVALID, "%s: output path '%s' is too long", what, path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        if (slash)
            return cf_fail(CF_ERR_IO, "%s: cannot write '%s': cannot create a file in '%.*s': %s",
                           what, path, (int)(slash - path), path, strerror(e));
        return cf_fail(CF_ERR_IO, "%s: cannot write '%s': %s", what, path, strerror(e));
    }
    (void)fchmod(fd, 0644);
    close(fd);
    return CF_OK;
}

/* True when the file starts with the PNG signature. */
static bool is_png(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char sig[8] = {0};
    size_t got = fread(sig, 1, 8, f);
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fclose(f);
    static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    return got == 8 && memcmp(sig, png, 8) == 0;
}

/* The part of run_figure between setjmp and longjmp: nothing here may live in a register. */
static int draw_guarded(const char *tmp, int width, int height, draw_fn draw, void *ctx) {
    g_armed = 1;
    if (setjmp(g_jmp) != 0) return 1;
    plsdev("pngcairo");
    plsfnam(tmp);
    plspage(0, 0, width, height, 0, 0);
    PLINT r[N_COLS], g[N_COLS], b[N_COLS];
    for (int i = 0; i < N_COLS; i++)
        r[i] = k_palette[i][0], g[i] = k_palette[i][1], b[i] = k_palette[i][2];
    plscmap0n(N_COLS);
    plscmap0(r, g, b, N_COLS);
    plscolbg(255, 255, 255);
    plsError(&g_errcode, g_errmsg);
    plinit();
    plcol0(COL_FG);
    draw(ctx);
    g_armed = 0;
    return 0;
}

static int end_guarded(void) {
    g_armed = 1;
    if (setjmp(g_jmp) != 0) return 1;
    plend1();
    g_armed = 0;
    return 0;
}

/* Draws one figure into path (see the file comment). `what` names the call in messages. */
static cf_status run_figure(const char *what, const char *path, int width, int height, draw_fn draw,
                            void *ctx) {
    char tmp[4096];
    pthread_mutex_lock(&g_lock);
    if (!check_available_locked()) {
        pthread_mutex_unlock(&g_lock);
        return cf_fail(CF_ERR_UNSUPPORTED,
                       "%s: PLplot's pngcairo device is not available (install "
                       "plplot-driver-cairo); no PNG figures can be written",
                       what);
    }
    if (width <= 0 || height <= 0) width = g_width, height = g_height;
    cf_status st = make_temp(what, path, tmp, sizeof tmp);
    if (st != CF_OK) {
        pthread_mutex_unlock(&g_lock);
        return st;
    }
    g_fatal[0] = g_abort[0] = g_errmsg[0] = 0;
    g_errcode = 0;
    PLINT prev = 0, strm = -1;
    plgstrm(&prev);
    plmkstrm(&strm);
    if (strm < 0) {
        unlink(tmp);
        pthread_mutex_unlock(&g_lock);
        return cf_fail(CF_ERR_STATE, "%s: PLplot has no free stream for '%s'", what, path);
    }
    int failed = draw_guarded(tmp, width, height, draw, ctx);
    int end_failed = end_guarded();
    g_armed = 0;
    if (end_failed) {
        /* The stream could not be ended twice over; make sure it is not left current. */
        failed = 1;
    }
    plsstrm(prev);

    long size = 0;
    if (!failed && !g_fatal[0] && !g_abort[0] && !g_errcode && is_png(tmp, &size) && size > 0) {
        if (rename(tmp, path) == 0) {
            pthread_mutex_unlock(&g_lock);
            return CF_OK;
        }
        int e = errno;
        unlink(tmp);
        pthread_mutex_unlock(&g_lock);
        return cf_fail(CF_ERR_IO, "%s: cannot move the figure into place as '%s': %s", what, path,
                       strerror(e));
    }
    unlink(tmp);
    char msg[1024];
    if (g_fatal[0])
        snprintf(msg, sizeof msg, "PLplot stopped with a fatal error: %s", g_fatal);
    else if (g_abort[0])
        snprintf(msg, sizeof msg, "PLplot aborted an operation: %s", g_abort);
    else if (g_errcode) {
        /* strip PLplot's banner and newlines */
        const char *m = g_errmsg;
        while (*m == '\n' || *m == '*' || *m == ' ') m++;
        snprintf(msg, sizeof msg, "PLplot error: %.900s", m);
        for (char *c = msg; *c; c++)
            if (*c == '\n') *c = ' ';
    } else
        snprintf(msg, sizeof msg, "PLplot wrote no PNG data");
    pthread_mutex_unlock(&g_lock);
    return cf_fail(CF_ERR_IO, "%s: writing '%s': %s", what, path, msg);
}

/* Test hook: a trivial figure drawn straight into path, without the temporary file, so that
 * PLplot itself meets an unwritable path (its fatal-error path). */
static void draw_trivial(void *ctx) {
    (void)ctx;
    plenv(0, 1, 0, 1, 0, 0);
}

cf_status cf_plot__raw_figure(const char *path) {
    pthread_mutex_lock(&g_lock);
    if (!check_available_locked()) {
        pthread_mutex_unlock(&g_lock);
        return cf_fail(CF_ERR_UNSUPPORTED, "plot: pngcairo not available");
    }
    g_fatal[0] = g_abort[0] = g_errmsg[0] = 0;
    g_errcode = 0;
    PLINT prev = 0, strm = -1;
    plgstrm(&prev);
    plmkstrm(&strm);
    int failed = draw_guarded(path, 200, 150, draw_trivial, NULL);
    failed |= end_guarded();
    g_armed = 0;
    plsstrm(prev);
    cf_status st = CF_OK;
    if (failed || g_fatal[0])
        st = cf_fail(CF_ERR_IO, "plot: writing '%s': PLplot stopped with a fatal error: %s", path,
                     g_fatal[0] ? g_fatal : "unknown");
    pthread_mutex_unlock(&g_lock);
    return st;
}

/* ---- drawing helpers (PLplot calls only; run inside a figure) ------------------------------ */

/* Copies user text for PLplot, doubling '#' (PLplot's escape character) so that names such
 * as fastai's "#na#" are drawn as written. */
static void plot_text(char *dst, size_t size, const char *src) {
    size_t o = 0;
    for (; src && *src && o + 2 < size; src++) {
        if (*src == '#') dst[o++] = '#';
        dst[o++] = *src;
    }
    dst[o] = 0;
}

typedef struct range {
    double lo, hi;
} range;

static range range_empty(void) {
    return (range){INFINITY, -INFINITY};
}
static void range_add(range *r, const double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (isfinite(v[i])) {
            if (v[i] < r->lo) r->lo = v[i];
            if (v[i] > r->hi) r->hi = v[i];
        }
}
/* matplotlib's 5% margins; a flat or empty range gets a unit span. */
static range range_pad(range r) {
    if (!(r.lo <= r.hi)) return (range){0, 1};
    double span = r.hi - r.lo;
    if (span <= 1e-12 * fmax(1.0, fabs(r.hi))) {
        double d = fabs(r.hi) > 0 ? 0.05 * fabs(r.hi) : 0.5;
        return (range){r.lo - d, r.hi + d};
    }
    return (range){r.lo - 0.05 * span, r.hi + 0.05 * span};
}

/* The current plot's viewport in millimetres and the character height (set by std_viewport,
 * read by draw_axes and legend placement; figures are drawn under g_lock). */
static struct { double w_mm, h_mm, ht_mm; } g_vp;

/* The viewport of a plot in the current subpage, with room for rotated y tick labels and the
 * y label on the left, x tick labels and the x label below and the title above. */
static void std_viewport(void) {
    PLFLT x0, x1, y0, y1, def, ht;
    plgspa(&x0, &x1, &y0, &y1);
    plgchr(&def, &ht);
    double w = x1 - x0, h = y1 - y0;
    double left = 6.8 * ht / w, right = 1.0 - 2.0 * ht / w;
    double bottom = 4.6 * ht / h, top = 1.0 - 4.4 * ht / h;
    if (left > 0.4) left = 0.4;
    if (right < 0.6) right = 0.6;
    if (bottom > 0.4) bottom = 0.4;
    if (top < 0.6) top = 0.6;
    plvpor(left, right, bottom, top);
    g_vp.w_mm = (right - left) * w;
    g_vp.h_mm = (top - bottom) * h;
    g_vp.ht_mm = ht;
}

/* A 1-2-5 tick step giving about `target` intervals over span (at least 1 when integer). */
static double nice_step(double span, double target, bool integer) {
    if (!(span > 0) || !(target >= 1)) return 0;
    double raw = span / target, mag = pow(10, floor(log10(raw))), norm = raw / mag;
    double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
    if (integer && step < 1) step = 1;
    return step;
}

typedef struct tick_steps {
    double x, y;
} tick_steps;

static void label_tick(PLINT axis, PLFLT value, char *label, PLINT length, PLPointer data) {
    const tick_steps *s = data;
    cf_plot__tick_label(value, axis == PL_X_AXIS ? s->x : s->y, label, (size_t)length);
}

/* Light grid, then the dark frame with ticks and numeric labels. x_integer: the x values are
 * counts (steps, epochs), so ticks fall on whole numbers. */
static void draw_axes_ex(range x, range y, bool logx, bool logy, bool x_integer) {
    plwind(x.lo, x.hi, y.lo, y.hi);
    double tx_target = g_vp.ht_mm > 0 ? g_vp.w_mm / (7.0 * g_vp.ht_mm) : 5;
    double ty_target = g_vp.ht_mm > 0 ? g_vp.h_mm / (7.5 * g_vp.ht_mm) : 5;
    if (tx_target > 8) tx_target = 8;
    if (ty_target > 8) ty_target = 8;
    if (tx_target < 1) tx_target = 1;
    if (ty_target < 1) ty_target = 1;
    double xt = logx ? 0 : nice_step(x.hi - x.lo, tx_target, x_integer);
    double yt = logy ? 0 : nice_step(y.hi - y.lo, ty_target, false);
    plcol0(COL_GRID);
    plwidth(1.0);
    pllsty(1);
    plbox(logx ? "gl" : "g", xt, 0, logy ? "gl" : "g", yt, 0);
    plcol0(COL_FG);
    /* linear axes: our labels ("o"); log axes keep PLplot's 10^k, as matplotlib's */
    static tick_steps steps;
    steps = (tick_steps){xt, yt};
    plslabelfunc(label_tick, &steps);
    plbox(logx ? "bcnstl" : "bcnsto", xt, 0, logy ? "bcnstl" : "bcnsto", yt, 0);
    plslabelfunc(NULL, NULL);
}

static void draw_axes(range x, range y, bool logx, bool logy) {
    draw_axes_ex(x, y, logx, logy, false);
}

static void labels(const char *xlabel, const char *ylabel, const char *title) {
    plcol0(COL_FG);
    pllab(xlabel ? xlabel : "", ylabel ? ylabel : "", title ? title : "");
}

/* Draws y against x, breaking the line at non-finite points. */
static void series(const double *x, const double *y, int64_t n, int col, double width) {
    plcol0(col);
    plwidth(width);
    pllsty(1);
    int64_t i = 0;
    while (i < n) {
        while (i < n && !(isfinite(x[i]) && isfinite(y[i]))) i++;
        int64_t j = i;
        while (j < n && isfinite(x[j]) && isfinite(y[j])) j++;
        if (j - i >= 2) plline((PLINT)(j - i), x + i, y + i);
        i = j;
    }
    plwidth(1.0);
}

#define DOT "#[0x25cf]" /* a filled circle (●) as the marker glyph */

static void markers(const double *x, const double *y, int64_t n, int col, double scale) {
    plcol0(col);
    PLFLT def, ht;
    plgchr(&def, &ht);
    plschr(0, scale);
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && isfinite(y[i])) plptex(x[i], y[i], 1, 0, 0.5, DOT);
    plschr(0, 1.0);
}

typedef struct legend_entry {
    const char *text;
    int col;
    bool symbol; /* a marker instead of a line */
} legend_entry;

static void legend(const legend_entry *e, int n, PLINT position, double text_scale) {
    if (n <= 0) return;
    PLINT opt_array[8], text_colors[8], line_colors[8], line_styles[8], symbol_colors[8],
        symbol_numbers[8];
    PLFLT line_widths[8], symbol_scales[8];
    const char *text[8], *symbols[8];
    if (n > 8) n = 8;
    for (int i = 0; i < n; i++) {
        opt_array[i] = e[i].symbol ? PL_LEGEND_SYMBOL : PL_LEGEND_LINE;
        text_colors[i] = COL_FG;
        text[i] = e[i].text;
        line_colors[i] = e[i].col;
        line_styles[i] = 1;
        line_widths[i] = 2.0;
        symbol_colors[i] = e[i].col;
        symbol_scales[i] = 1.0;
        symbol_numbers[i] = 1;
        symbols[i] = DOT;
    }
    PLFLT w, h;
    /* the line sample: about three characters wide whatever the viewport */
    double sample = g_vp.w_mm > 0 ? 3.0 * g_vp.ht_mm / g_vp.w_mm : 0.05;
    plwidth(1.0);
    pllegend(&w, &h, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX, position, 0.02, 0.02, sample,
             COL_BG, COL_GRID, 1, 0, 0, n, opt_array, 0.6, text_scale, 1.8, 0.0, text_colors, text,
             NULL, NULL, NULL, NULL, line_colors, line_styles, line_widths, symbol_colors,
             symbol_scales, symbol_numbers, symbols);
}

typedef struct curve {
    const double *x, *y;
    int64_t n;
} curve;

/* matplotlib's loc="best" among the four inside corners: the corner whose legend box (size
 * estimated from the entries) covers the fewest samples of the curves. */
static PLINT best_corner(const curve *c, int nc, range x, range y, const legend_entry *e, int ne,
                         double text_scale) {
    static const PLINT corners[4] = {
        PL_POSITION_TOP | PL_POSITION_RIGHT, PL_POSITION_TOP | PL_POSITION_LEFT,
        PL_POSITION_BOTTOM | PL_POSITION_LEFT, PL_POSITION_BOTTOM | PL_POSITION_RIGHT};
    size_t maxlen = 1;
    for (int i = 0; i < ne; i++)
        if (strlen(e[i].text) > maxlen) maxlen = strlen(e[i].text);
    double ht = g_vp.ht_mm * text_scale;
    double lw = g_vp.w_mm > 0 ? ((double)maxlen * 0.62 * ht + 6.0 * ht) / g_vp.w_mm + 0.03 : 0.3;
    double lh = g_vp.h_mm > 0 ? ((double)ne * 1.8 * ht + 1.2 * ht) / g_vp.h_mm + 0.03 : 0.2;
    double sx = x.hi > x.lo ? 1.0 / (x.hi - x.lo) : 0, sy = y.hi > y.lo ? 1.0 / (y.hi - y.lo) : 0;
    int64_t hits[4] = {0, 0, 0, 0};
    for (int k = 0; k < nc; k++)
        for (int64_t i = 0; i < c[k].n; i++) {
            if (!isfinite(c[k].x[i]) || !isfinite(c[k].y[i])) continue;
            bool seg = i + 1 < c[k].n && isfinite(c[k].x[i + 1]) && isfinite(c[k].y[i + 1]);
            int samples = seg ? 8 : 1;
            for (int t = 0; t < samples; t++) {
                double a = (double)t / samples;
                double px = seg ? c[k].x[i] + a * (c[k].x[i + 1] - c[k].x[i]) : c[k].x[i];
                double py = seg ? c[k].y[i] + a * (c[k].y[i + 1] - c[k].y[i]) : c[k].y[i];
                double u = (px - x.lo) * sx, v = (py - y.lo) * sy;
                bool right = u > 1 - lw, left = u<lw, top = v> 1 - lh, bottom = v < lh;
                hits[0] += top && right;
                hits[1] += top && left;
                hits[2] += bottom && left;
                hits[3] += bottom && right;
            }
        }
    int best = 0;
    for (int i = 1; i < 4; i++)
        if (hits[i] < hits[best]) best = i;
    return corners[best] | PL_POSITION_INSIDE;
}

static double *alloc_doubles(int64_t n) {
    return cf_malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
}

/* ---- plot_loss ---------------------------------------------------------------------------- */

typedef struct loss_fig {
    double *tx, *ty;
    int64_t nt;
    double *vx, *vy;
    int64_t nv;
    double *ex; /* epoch ends (show_epochs) */
    int64_t ne;
    bool log;
} loss_fig;

static void draw_loss(void *ctx) {
    loss_fig *f = ctx;
    pladv(0);
    std_viewport();
    range x = range_empty(), y = range_empty();
    range_add(&x, f->tx, f->nt);
    range_add(&x, f->vx, f->nv);
    range_add(&y, f->ty, f->nt);
    range_add(&y, f->vy, f->nv);
    x = range_pad(x);
    y = range_pad(y);
    draw_axes_ex(x, y, f->log, f->log, !f->log);
    if (f->ne > 0) {
        plcol0(COL_EPOCH);
        pllsty(3);
        for (int64_t i = 0; i < f->ne; i++) {
            if (!isfinite(f->ex[i])) continue;
            pljoin(f->ex[i], y.lo, f->ex[i], y.hi);
        }
        pllsty(1);
    }
    series(f->tx, f->ty, f->nt, COL_C0, 2.0);
    legend_entry e[2];
    int n = 0;
    e[n++] = (legend_entry){"train", COL_C0, false};
    if (f->nv > 0) {
        series(f->vx, f->vy, f->nv, COL_C1, 2.0);
        if (f->nv <= 50) markers(f->vx, f->vy, f->nv, COL_C1, 0.7);
        e[n++] = (legend_entry){"valid", COL_C1, false};
    }
    labels("steps", "loss", "learning curve");
    curve c[2] = {{f->tx, f->ty, f->nt}, {f->vx, f->vy, f->nv}};
    legend(e, n, best_corner(c, 2, x, y, e, n, 1.0), 1.0);
}

static int find_name(const cf_recorder *rec, const char *name) {
    if (!rec->metric_names) return -1;
    for (int i = 0; i < rec->n_names; i++)
        if (rec->metric_names[i] && strcmp(rec->metric_names[i], name) == 0) return i;
    return -1;
}

static double log10_or_nan(double v) {
    return v > 0 ? log10(v) : NAN;
}

cf_status cf_plot_loss(const cf_recorder *rec, const char *png_path,
                       const cf_plot_loss_opts *opts) {
    static const cf_plot_loss_opts none = {0};
    if (!opts) opts = &none;
    if (!rec) return cf_fail(CF_ERR_INVALID, "plot_loss: NULL recorder");
    int64_t skip = opts->skip_start == 0 ? 5 : opts->skip_start < 0 ? 0 : opts->skip_start;
    if (rec->n_batches <= skip || !rec->losses)
        return cf_fail(CF_ERR_STATE,
                       "plot_loss: the recorder holds %lld training batch(es), nothing to plot "
                       "after skip_start = %lld",
                       (long long)rec->n_batches, (long long)skip);
    loss_fig f = {.log = opts->log};
    f.nt = rec->n_batches - skip;
    int valid_col = find_name(rec, "valid_loss") - 1;
    bool with_valid = !opts->no_valid && valid_col >= 0 && valid_col < rec->n_values &&
                      rec->values && rec->iters && rec->n_epochs > 0;
    f.tx = alloc_doubles(f.nt);
    f.ty = alloc_doubles(f.nt);
    f.vx = alloc_doubles(rec->n_epochs);
    f.vy = alloc_doubles(rec->n_epochs);
    f.ex = alloc_doubles(rec->n_epochs);
    cf_status st = CF_OK;
    if (!f.tx || !f.ty || !f.vx || !f.vy || !f.ex) {
        st = cf_fail_context(CF_ERR_NOMEM, "plot_loss");
        goto done;
    }
    for (int64_t i = 0; i < f.nt; i++) {
        double x = (double)(skip + i), y = rec->losses[skip + i];
        f.tx[i] = f.log ? log10_or_nan(x) : x;
        f.ty[i] = f.log ? log10_or_nan(y) : y;
    }
    if (with_valid) {
        for (int e = 0; e < rec->n_epochs; e++) {
            if (rec->iters[e] < skip) continue;
            double x = (double)rec->iters[e],
                   y = rec->values[(int64_t)e * rec->n_values + valid_col];
            f.vx[f.nv] = f.log ? log10_or_nan(x) : x;
            f.vy[f.nv] = f.log ? log10_or_nan(y) : y;
            f.nv++;
        }
    }
    if (opts->show_epochs && rec->iters)
        for (int e = 0; e < rec->n_epochs; e++) {
            double x = (double)rec->iters[e];
            f.ex[f.ne++] = f.log ? log10_or_nan(x) : x;
        }
    st = run_figure("plot_loss", png_path, opts->width, opts->height, draw_loss, &f);
done:
    cf_free(f.tx);
    cf_free(f.ty);
    cf_free(f.vx);
    cf_free(f.vy);
    cf_free(f.ex);
    return st;
}

/* ---- plot_sched --------------------------------------------------------------------------- */

typedef struct sched_fig {
    const double *lr, *mom;
    double *x;
    int64_t n;
} sched_fig;

static void draw_sched_panel(const double *x, const double *y, int64_t n, const char *name) {
    pladv(0);
    std_viewport();
    range rx = range_empty(), ry = range_empty();
    range_add(&rx, x, n);
    range_add(&ry, y, n);
    draw_axes_ex(range_pad(rx), range_pad(ry), false, false, true);
    series(x, y, n, COL_C0, 2.0);
    if (n == 1) markers(x, y, n, COL_C0, 0.7);
    labels("iterations", name, "");
}

static void draw_sched(void *ctx) {
    sched_fig *f = ctx;
    plssub(2, 1);
    draw_sched_panel(f->x, f->lr, f->n, "lr");
    draw_sched_panel(f->x, f->mom, f->n, "mom");
}

cf_status cf_plot_sched(const cf_recorder *rec, const char *png_path) {
    if (!rec) return cf_fail(CF_ERR_INVALID, "plot_sched: NULL recorder");
    sched_fig f = {0};
    if (rec->n_hps > 0 && rec->hp_lr && rec->hp_mom) {
        f.lr = rec->hp_lr;
        f.mom = rec->hp_mom;
        f.n = rec->n_hps;
    } else if (rec->n_batches > 0 && rec->lrs && rec->moms) {
        f.lr = rec->lrs;
        f.mom = rec->moms;
        f.n = rec->n_batches;
    } else
        return cf_fail(CF_ERR_STATE,
                       "plot_sched: the recorder holds no schedule (no training batch was "
                       "recorded)");
    f.x = alloc_doubles(f.n);
    if (!f.x) return cf_fail_context(CF_ERR_NOMEM, "plot_sched");
    for (int64_t i = 0; i < f.n; i++) f.x[i] = (double)i;
    cf_status st = run_figure("plot_sched", png_path, 0, 0, draw_sched, &f);
    cf_free(f.x);
    return st;
}

/* ---- plot_lr_find ------------------------------------------------------------------------- */

typedef struct lr_find_fig {
    double *x, *y;
    int64_t n;
    double px[4], py[4];
    int pcol[4];
    char ptext[4][64];
    int np;
} lr_find_fig;

static void draw_lr_find(void *ctx) {
    lr_find_fig *f = ctx;
    pladv(0);
    std_viewport();
    range x = range_empty(), y = range_empty();
    range_add(&x, f->x, f->n);
    range_add(&y, f->y, f->n);
    range_add(&x, f->px, f->np);
    range_add(&y, f->py, f->np);
    x = range_pad(x);
    y = range_pad(y);
    draw_axes(x, y, true, false);
    series(f->x, f->y, f->n, COL_C0, 2.0);
    legend_entry e[4];
    for (int i = 0; i < f->np; i++) {
        markers(&f->px[i], &f->py[i], 1, f->pcol[i], 1.3);
        e[i] = (legend_entry){f->ptext[i], f->pcol[i], true};
    }
    labels("Learning Rate", "Loss", "");
    curve c[2] = {{f->x, f->y, f->n}, {f->px, f->py, f->np}};
    legend(e, f->np, best_corner(c, 2, x, y, e, f->np, 1.0), 1.0);
}

cf_status cf_plot_lr_find(const cf_lr_find_result *r, const char *png_path) {
    if (!r) return cf_fail(CF_ERR_INVALID, "plot_lr_find: NULL result");
    int64_t n = (int64_t)r->n - 5;
    if (n < 2 || !r->lrs || !r->losses)
        return cf_fail(CF_ERR_STATE,
                       "plot_lr_find: the result holds %d point(s); at least 7 are needed (the "
                       "last 5 are not plotted)",
                       r->n);
    lr_find_fig f = {.n = n};
    f.x = alloc_doubles(n);
    f.y = alloc_doubles(n);
    if (!f.x || !f.y) {
        cf_free(f.x);
        cf_free(f.y);
        return cf_fail_context(CF_ERR_NOMEM, "plot_lr_find");
    }
    for (int64_t i = 0; i < n; i++) {
        f.x[i] = log10_or_nan(r->lrs[i]);
        f.y[i] = r->losses[i];
    }
    struct {
        int bit;
        const char *name;
        double value, at, loss;
    } sug[4] = {
        {CF_SUGGEST_VALLEY, "valley", r->valley, r->valley, r->valley_loss},
        {CF_SUGGEST_SLIDE, "slide", r->slide, r->slide, r->slide_loss},
        {CF_SUGGEST_MINIMUM, "minimum", r->minimum, r->minimum_lr_at, r->minimum_loss},
        {CF_SUGGEST_STEEP, "steep", r->steep, r->steep, r->steep_loss},
    };
    /* colours from the cycle starting at index 1, in the order the suggestions are listed */
    for (int i = 0; i < 4; i++) {
        if (!(r->suggest & sug[i].bit)) continue;
        if (!isfinite(sug[i].value) || !(sug[i].at > 0) || !isfinite(sug[i].loss)) continue;
        f.px[f.np] = log10(sug[i].at);
        f.py[f.np] = sug[i].loss;
        f.pcol[f.np] = COL_C1 + f.np;
        snprintf(f.ptext[f.np], sizeof f.ptext[0], "%s = %.2e", sug[i].name, sug[i].value);
        f.np++;
    }
    cf_status st = run_figure("plot_lr_find", png_path, 0, 0, draw_lr_find, &f);
    cf_free(f.x);
    cf_free(f.y);
    return st;
}

/* ---- plot_metrics ------------------------------------------------------------------------- */

typedef struct metrics_fig {
    const cf_recorder *rec;
    double *x;    /* epochs */
    double *cols; /* column j at cols + j * n_epochs */
    int n_panels, nrows, ncols;
} metrics_fig;

static void draw_metrics(void *ctx) {
    metrics_fig *f = ctx;
    const cf_recorder *rec = f->rec;
    int ne = rec->n_epochs;
    plssub(f->ncols, f->nrows);
    double text_scale = f->n_panels > 4 ? 0.8 : 1.0;
    plschr(0, text_scale);
    for (int p = 0; p < f->n_panels; p++) {
        /* panel 0: columns 0 (train) and 1 (valid); panel p > 0: column p + 1 */
        int c0 = p == 0 ? 0 : p + 1, c1 = p == 0 && rec->n_values > 1 ? 1 : c0;
        pladv(0);
        std_viewport();
        range x = range_empty(), y = range_empty();
        range_add(&x, f->x, ne);
        for (int c = c0; c <= c1; c++) range_add(&y, f->cols + (int64_t)c * ne, ne);
        x = range_pad(x);
        y = range_pad(y);
        draw_axes_ex(x, y, false, false, true);
        legend_entry e[2];
        int n = 0;
        for (int c = c0; c <= c1; c++) {
            int col = c == 0 ? COL_C0 : COL_C1;
            series(f->x, f->cols + (int64_t)c * ne, ne, col, 2.0);
            if (ne <= 30) markers(f->x, f->cols + (int64_t)c * ne, ne, col, 0.6);
            e[n++] = (legend_entry){c == 0 ? "train" : "valid", col, false};
        }
        char title[96];
        plot_text(title, sizeof title, p == 0 ? "losses" : rec->metric_names[c0 + 1]);
        labels("epoch", "", title);
        curve c[2] = {{f->x, f->cols + (int64_t)c0 * ne, ne},
                      {f->x, f->cols + (int64_t)c1 * ne, ne}};
        legend(e, n, best_corner(c, 2, x, y, e, n, 0.9), 0.9);
    }
}

cf_status cf_plot_metrics(const cf_recorder *rec, const char *png_path) {
    if (!rec) return cf_fail(CF_ERR_INVALID, "plot_metrics: NULL recorder");
    if (rec->n_epochs < 1 || !rec->values || rec->n_values < 1)
        return cf_fail(CF_ERR_STATE, "plot_metrics: the recorder holds no epoch to plot");
    if (!rec->metric_names || rec->n_names < rec->n_values + 1)
        return cf_fail(CF_ERR_INVALID,
                       "plot_metrics: the recorder has %d value column(s) but %d metric name(s)",
                       rec->n_values, rec->n_names);
    metrics_fig f = {.rec = rec};
    f.n_panels = rec->n_values > 1 ? rec->n_values - 1 : 1;
    /* fastai's grid is int(sqrt(n)) rows; on a fixed-size figure the grid whose panels come
     * closest to the figure's own shape (with few empty cells) reads better */
    pthread_mutex_lock(&g_lock);
    int fw = g_width, fh = g_height;
    pthread_mutex_unlock(&g_lock);
    double best = INFINITY;
    for (int rows = 1; rows <= f.n_panels; rows++) {
        int cols = (f.n_panels + rows - 1) / rows;
        if ((rows - 1) * cols >= f.n_panels) continue;
        double aspect = ((double)fw / cols) / ((double)fh / rows);
        double score = fabs(log(aspect / ((double)fw / fh))) + 0.3 * (rows * cols - f.n_panels);
        if (score < best - 1e-9) {
            best = score;
            f.nrows = rows;
            f.ncols = cols;
        }
    }
    f.x = alloc_doubles(rec->n_epochs);
    f.cols = alloc_doubles((int64_t)rec->n_epochs * rec->n_values);
    cf_status st;
    if (!f.x || !f.cols) {
        st = cf_fail_context(CF_ERR_NOMEM, "plot_metrics");
    } else {
        for (int e = 0; e < rec->n_epochs; e++) {
            f.x[e] = e;
            for (int j = 0; j < rec->n_values; j++)
                f.cols[(int64_t)j * rec->n_epochs + e] =
                    rec->values[(int64_t)e * rec->n_values + j];
        }
        st = run_figure("plot_metrics", png_path, 0, 0, draw_metrics, &f);
    }
    cf_free(f.x);
    cf_free(f.cols);
    return st;
}

/* ---- confusion matrix --------------------------------------------------------------------- */

typedef struct confusion_fig {
    int n;
    const int64_t *counts;
    double *v; /* displayed values */
    char *const *vocab;
    bool normalize;
    double vmin, vmax;
} confusion_fig;

/* matplotlib's "Blues" colour map at t in [0, 1]. */
static void blues(double t, PLINT rgb[3]) {
    static const int stops[9][3] = {{247, 251, 255}, {222, 235, 247}, {198, 219, 239},
                                    {158, 202, 225}, {107, 174, 214}, {66, 146, 198},
                                    {33, 113, 181},  {8, 81, 156},    {8, 48, 107}};
    if (!(t > 0)) t = 0;
    if (t > 1) t = 1;
    double s = t * 8;
    int i = (int)s;
    if (i >= 8) i = 7;
    double u = s - i;
    for (int c = 0; c < 3; c++)
        rgb[c] = (PLINT)lround(stops[i][c] + u * (stops[i + 1][c] - stops[i][c]));
}

static void class_name(char *const *vocab, int i, char *buf, size_t size) {
    if (vocab && vocab[i])
        plot_text(buf, size, vocab[i]);
    else
        snprintf(buf, size, "%d", i);
}

static void draw_confusion(void *ctx) {
    confusion_fig *f = ctx;
    int n = f->n;
    pladv(0);
    /* margins from the longest class name, in page millimetres */
    PLFLT xmin_mm, xmax_mm, ymin_mm, ymax_mm, def, ht;
    plgspa(&xmin_mm, &xmax_mm, &ymin_mm, &ymax_mm);
    double pw = xmax_mm - xmin_mm, ph = ymax_mm - ymin_mm;
    double label_scale = n > 20 ? 0.7 : 1.0;
    plschr(0, label_scale);
    plgchr(&def, &ht);
    size_t maxlen = 1;
    char name[128];
    for (int i = 0; i < n; i++) {
        class_name(f->vocab, i, name, sizeof name);
        size_t l = strlen(name);
        if (l > maxlen) maxlen = l;
    }
    double name_mm = 0.62 * ht * (double)maxlen; /* average glyph width ~0.6 of the height */
    double left = (name_mm + 4.0 * ht) / pw, top = 1.0 - 3.0 * ht / ph, right = 0.97;
    if (left > 0.45) left = 0.45;
    /* x labels: horizontal when they fit in a cell, vertical otherwise */
    double cell_mm_guess = (right - left) * pw / n;
    bool vertical = name_mm > 0.9 * cell_mm_guess;
    double bottom = ((vertical ? name_mm : ht) + 4.0 * ht) / ph;
    if (bottom > 0.45) bottom = 0.45;
    plvpas(left, right, bottom, top, 1.0);
    plwind(0, n, 0, n);
    /* cells: row r (actual) from the top, column c (predicted) from the left */
    double span = f->vmax - f->vmin;
    double thresh = f->vmax / 2;
    double cell_scale = n <= 6 ? 1.2 : n <= 12 ? 0.9 : n <= 20 ? 0.6 : 0.0;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++) {
            double v = f->v[(int64_t)r * n + c];
            PLINT rgb[3];
            blues(span > 0 ? (v - f->vmin) / span : 0, rgb);
            plscol0(COL_SCRATCH, rgb[0], rgb[1], rgb[2]);
            plcol0(COL_SCRATCH);
            PLFLT x[4] = {c, c + 1, c + 1, c}, y[4] = {n - r - 1, n - r - 1, n - r, n - r};
            plfill(4, x, y);
        }
    if (cell_scale > 0) {
        plschr(0, cell_scale);
        char text[32];
        for (int r = 0; r < n; r++)
            for (int c = 0; c < n; c++) {
                double v = f->v[(int64_t)r * n + c];
                if (f->normalize)
                    snprintf(text, sizeof text, "%.2f", v);
                else
                    snprintf(text, sizeof text, "%lld", (long long)f->counts[(int64_t)r * n + c]);
                plcol0(v > thresh ? COL_WHITE : COL_FG);
                plptex(c + 0.5, n - r - 0.5, 1, 0, 0.5, text);
            }
    }
    plcol0(COL_FG);
    plschr(0, 1.0);
    plbox("bc", 0, 0, "bc", 0, 0);
    plschr(0, label_scale);
    for (int i = 0; i < n; i++) {
        class_name(f->vocab, i, name, sizeof name);
        double pos = (i + 0.5) / n;
        if (vertical)
            plmtex("bv", 0.7, pos, 1.0, name);
        else
            plmtex("b", 1.4, pos, 0.5, name);
        plmtex("lv", 0.7, 1.0 - pos, 1.0, name);
    }
    plschr(0, 1.0);
    double name_chars = name_mm / ht;
    plmtex("b", (vertical ? name_chars * label_scale : 1.4) + 1.8, 0.5, 0.5, "Predicted");
    plmtex("l", name_chars * label_scale + 2.2, 0.5, 0.5, "Actual");
    plmtex("t", 1.2, 0.5, 0.5, "Confusion matrix");
}

cf_status cf_plot_confusion_matrix(const int64_t *counts, int n_classes, char *const *vocab,
                                   const char *png_path, bool normalize) {
    if (!counts) return cf_fail(CF_ERR_INVALID, "plot_confusion_matrix: NULL counts");
    if (n_classes < 1 || n_classes > 100)
        return cf_fail(CF_ERR_INVALID, "plot_confusion_matrix: n_classes %d must be in [1, 100]",
                       n_classes);
    int64_t nn = (int64_t)n_classes * n_classes;
    confusion_fig f = {.n = n_classes, .counts = counts, .vocab = vocab, .normalize = normalize};
    f.v = alloc_doubles(nn);
    if (!f.v) return cf_fail_context(CF_ERR_NOMEM, "plot_confusion_matrix");
    f.vmin = INFINITY;
    f.vmax = -INFINITY;
    for (int r = 0; r < n_classes; r++) {
        int64_t sum = 0;
        for (int c = 0; c < n_classes; c++) {
            int64_t k = counts[(int64_t)r * n_classes + c];
            if (k < 0) {
                cf_free(f.v);
                return cf_fail(CF_ERR_INVALID,
                               "plot_confusion_matrix: negative count %lld at (%d, %d)",
                               (long long)k, r, c);
            }
            sum += k;
        }
        for (int c = 0; c < n_classes; c++) {
            int64_t k = counts[(int64_t)r * n_classes + c];
            double v = normalize ? (sum > 0 ? (double)k / (double)sum : 0.0) : (double)k;
            f.v[(int64_t)r * n_classes + c] = v;
            if (v < f.vmin) f.vmin = v;
            if (v > f.vmax) f.vmax = v;
        }
    }
    cf_status st = run_figure("plot_confusion_matrix", png_path, 0, 0, draw_confusion, &f);
    cf_free(f.v);
    return st;
}

/* ---- top losses --------------------------------------------------------------------------- */

typedef struct top_losses_fig {
    int k, c, h, w; /* images are drawn at (h, w) after box downsampling */
    int64_t src_h, src_w;
    float *pix; /* k images, (h, w, 3) in [0, 1] */
    char (*titles)[96];
} top_losses_fig;

/* An (h, w, 3) image in [0, 1] drawn into the current viewport, one filled cell a pixel. */
static void draw_rgb_image(const float *img, int h, int w) {
    plwind(0, w, 0, h);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            const float *p = img + ((int64_t)y * w + x) * 3;
            plscol0(COL_SCRATCH, (PLINT)lround(p[0] * 255), (PLINT)lround(p[1] * 255),
                    (PLINT)lround(p[2] * 255));
            plcol0(COL_SCRATCH);
            /* slightly oversized cells hide the anti-aliased seams between pixels */
            double xa = x > 0 ? x - 0.02 : 0, xb = x + 1 < w ? x + 1.02 : w;
            double ya = y + 1 < h ? h - y - 1.02 : 0, yb = y > 0 ? h - y + 0.02 : h;
            PLFLT px[4] = {xa, xb, xb, xa}, py[4] = {ya, ya, yb, yb};
            plfill(4, px, py);
        }
}

static void draw_top_losses(void *ctx) {
    top_losses_fig *f = ctx;
    pladv(0);
    int ncols = (int)ceil(sqrt((double)f->k));
    int nrows = (f->k + ncols - 1) / ncols;
    double title_h = 0.07;
    plschr(0, 1.1);
    plvpor(0, 1, 0, 1);
    plwind(0, 1, 0, 1);
    plcol0(COL_FG);
    plptex(0.5, 1.0 - title_h / 2, 1, 0, 0.5, "Prediction/Actual/Loss/Probability");
    double tscale = ncols <= 3 ? 0.9 : ncols <= 5 ? 0.7 : 0.55;
    for (int i = 0; i < f->k; i++) {
        int r = i / ncols, c = i % ncols;
        double cw = 1.0 / ncols, chh = (1.0 - title_h) / nrows;
        double x0 = c * cw, y1 = 1.0 - title_h - r * chh;
        /* leave room for the item's title above the image */
        plvpas(x0 + 0.02 * cw, x0 + 0.98 * cw, y1 - chh + 0.03 * chh, y1 - 0.16 * chh,
               (double)f->h / f->w);
        draw_rgb_image(f->pix + (int64_t)i * f->h * f->w * 3, f->h, f->w);
        plcol0(COL_FG);
        plschr(0, tscale);
        plmtex("t", 0.9, 0.5, 0.5, f->titles[i]);
    }
    plschr(0, 1.0);
}

cf_status cf_plot_top_losses(const cf_preds *p, int k, char *const *vocab, const char *png_path) {
    if (!p) return cf_fail(CF_ERR_INVALID, "plot_top_losses: NULL preds");
    const cf_tensor *in = &p->inputs;
    if (!in->data || in->shape.ndim != 4 || in->shape.dim[0] != p->n ||
        (in->shape.dim[1] != 1 && in->shape.dim[1] != 3)) {
        char buf[64];
        return cf_fail(CF_ERR_INVALID,
                       "plot_top_losses: inputs %s must be images (n = %lld, 1 or 3 channels, "
                       "H, W); get_preds with_input",
                       in->data ? cf_shape_str(&in->shape, buf, sizeof buf) : "(none)",
                       (long long)p->n);
    }
    if (!p->preds.data || p->preds.shape.ndim != 2 || p->preds.shape.dim[0] != p->n)
        return cf_fail(CF_ERR_INVALID, "plot_top_losses: predictions must be (n, n_classes)");
    if (k > 64) return cf_fail(CF_ERR_INVALID, "plot_top_losses: k = %d is more than 64 images", k);
    int64_t *idx = cf_malloc(sizeof(int64_t) * (size_t)(k > 0 ? k : 1));
    if (!idx) return cf_fail_context(CF_ERR_NOMEM, "plot_top_losses");
    cf_status st = cf_top_losses(p, k, idx);
    if (st != CF_OK) {
        cf_free(idx);
        return cf_fail_context(st, "plot_top_losses");
    }
    top_losses_fig f = {.k = k, .c = in->shape.dim[1]};
    f.src_h = in->shape.dim[2];
    f.src_w = in->shape.dim[3];
    int factor = 1;
    while (f.src_h / factor > 64 || f.src_w / factor > 64) factor++;
    f.h = (int)(f.src_h / factor);
    f.w = (int)(f.src_w / factor);
    if (f.h < 1) f.h = 1;
    if (f.w < 1) f.w = 1;
    f.pix = cf_malloc(sizeof(float) * (size_t)k * f.h * f.w * 3);
    f.titles = cf_malloc(sizeof(*f.titles) * (size_t)k);
    if (!f.pix || !f.titles) {
        st = cf_fail_context(CF_ERR_NOMEM, "plot_top_losses");
        goto done;
    }
    int nc = p->preds.shape.dim[1];
    for (int i = 0; i < k; i++) {
        int64_t item = idx[i];
        const float *src = in->data + item * (int64_t)f.c * f.src_h * f.src_w;
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t j = 0; j < (int64_t)f.c * f.src_h * f.src_w; j++)
            if (isfinite(src[j])) {
                if (src[j] < lo) lo = src[j];
                if (src[j] > hi) hi = src[j];
            }
        float scale = hi > lo ? 1.0f / (hi - lo) : 0.0f;
        float *dst = f.pix + (int64_t)i * f.h * f.w * 3;
        for (int y = 0; y < f.h; y++)
            for (int x = 0; x < f.w; x++)
                for (int ch = 0; ch < 3; ch++) {
                    int sc = f.c == 1 ? 0 : ch;
                    double acc = 0;
                    for (int dy = 0; dy < factor; dy++)
                        for (int dx = 0; dx < factor; dx++) {
                            float v =
                                src[((int64_t)sc * f.src_h + (int64_t)y * factor + dy) * f.src_w +
                                    (int64_t)x * factor + dx];
                            acc += isfinite(v) ? (v - lo) * scale : 0;
                        }
                    double v = acc / (factor * factor);
                    dst[((int64_t)y * f.w + x) * 3 + ch] = (float)(v < 0 ? 0 : v > 1 ? 1 : v);
                }
        const float *row = p->preds.data + item * nc;
        int64_t pred = p->decoded ? p->decoded[item] : cf_plot__row_argmax(row, nc);
        double prob = row[cf_plot__row_argmax(row, nc)];
        char pn[40], an[40];
        if (pred >= 0 && pred < nc)
            class_name(vocab, (int)pred, pn, sizeof pn);
        else
            snprintf(pn, sizeof pn, "%lld", (long long)pred);
        double t = p->targs.data && (int64_t)cf_tensor_numel(&p->targs) == p->n
                       ? p->targs.data[item]
                       : NAN;
        if (t >= 0 && t < nc && t == floor(t))
            class_name(vocab, (int)t, an, sizeof an);
        else
            snprintf(an, sizeof an, "%g", t);
        snprintf(f.titles[i], sizeof f.titles[0], "%s/%s / %.2f / %.2f", pn, an,
                 (double)p->losses[item], prob);
    }
    st = run_figure("plot_top_losses", png_path, 0, 0, draw_top_losses, &f);
done:
    cf_free(idx);
    cf_free(f.pix);
    cf_free(f.titles);
    return st;
}

/* ---- show_batch and show_results: a grid of images with coloured titles --------------------- */

typedef struct image_grid_fig {
    int k, h, w;
    float *pix; /* k images, (h, w, 3) in [0, 1] */
    char (*titles)[96];
    int *colour; /* per image: 0 the foreground, 1 green, 2 red */
} image_grid_fig;

static void draw_image_grid(void *ctx) {
    image_grid_fig *f = ctx;
    pladv(0);
    int ncols = (int)ceil(sqrt((double)f->k));
    int nrows = (f->k + ncols - 1) / ncols;
    double tscale = ncols <= 3 ? 0.9 : ncols <= 5 ? 0.7 : 0.55;
    static const PLINT rgb[3][3] = {{0, 0, 0}, {0, 128, 0}, {200, 0, 0}};
    for (int i = 0; i < f->k; i++) {
        int r = i / ncols, c = i % ncols;
        double cw = 1.0 / ncols, chh = 1.0 / nrows;
        double x0 = c * cw, y1 = 1.0 - r * chh;
        plvpas(x0 + 0.02 * cw, x0 + 0.98 * cw, y1 - chh + 0.03 * chh, y1 - 0.16 * chh,
               (double)f->h / f->w);
        draw_rgb_image(f->pix + (int64_t)i * f->h * f->w * 3, f->h, f->w);
        const PLINT *col = rgb[f->colour ? f->colour[i] : 0];
        plscol0(COL_SCRATCH, col[0], col[1], col[2]);
        plcol0(COL_SCRATCH);
        plschr(0, tscale);
        plmtex("t", 0.9, 0.5, 0.5, f->titles[i]);
        plcol0(COL_FG);
    }
    plschr(0, 1.0);
}

/* Image `item` of an (n, c, h, w) tensor, box-downsampled to at most 64 pixels a side and
 * rescaled to its own min..max, as (f->h, f->w, 3) into tile i of f (sizes set on i 0). */
static void grid_tile(image_grid_fig *f, int i, const cf_tensor *x, int64_t item) {
    int c = x->shape.dim[1];
    int64_t sh = x->shape.dim[2], sw = x->shape.dim[3];
    int factor = 1;
    while (sh / factor > 64 || sw / factor > 64) factor++;
    const float *src = x->data + item * (int64_t)c * sh * sw;
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t j = 0; j < (int64_t)c * sh * sw; j++)
        if (isfinite(src[j])) {
            if (src[j] < lo) lo = src[j];
            if (src[j] > hi) hi = src[j];
        }
    float scale = hi > lo ? 1.0f / (hi - lo) : 0.0f;
    float *dst = f->pix + (int64_t)i * f->h * f->w * 3;
    for (int y = 0; y < f->h; y++)
        for (int xx = 0; xx < f->w; xx++)
            for (int ch = 0; ch < 3; ch++) {
                int sc = c == 1 ? 0 : ch;
                double acc = 0;
                for (int dy = 0; dy < factor; dy++)
                    for (int dx = 0; dx < factor; dx++) {
                        float v = src[((int64_t)sc * sh + (int64_t)y * factor + dy) * sw +
                                      (int64_t)xx * factor + dx];
                        acc += isfinite(v) ? (v - lo) * scale : 0;
                    }
                double v = acc / (factor * factor);
                dst[((int64_t)y * f->w + xx) * 3 + ch] = (float)(v < 0 ? 0 : v > 1 ? 1 : v);
            }
}

static cf_status grid_alloc(image_grid_fig *f, const cf_tensor *x, int k, const char *what) {
    int64_t sh = x->shape.dim[2], sw = x->shape.dim[3];
    int factor = 1;
    while (sh / factor > 64 || sw / factor > 64) factor++;
    f->k = k;
    f->h = (int)(sh / factor);
    f->w = (int)(sw / factor);
    f->pix = cf_malloc(sizeof(float) * (size_t)k * f->h * f->w * 3);
    f->titles = cf_calloc((size_t)k, sizeof(*f->titles));
    f->colour = cf_calloc((size_t)k, sizeof(int));
    if (!f->pix || !f->titles || !f->colour) return cf_fail_context(CF_ERR_NOMEM, "%s", what);
    return CF_OK;
}

static void grid_free(image_grid_fig *f) {
    cf_free(f->pix);
    cf_free(f->titles);
    cf_free(f->colour);
}

static bool is_image_batch(const cf_tensor *x) {
    return x->data && x->shape.ndim == 4 && (x->shape.dim[1] == 1 || x->shape.dim[1] == 3);
}

/* The class name of a target value, or the value itself when it is not a class id. */
static void target_name(char *const *vocab, int n_classes, double t, char *buf, size_t size) {
    if (t >= 0 && t == floor(t) && (n_classes <= 0 || t < n_classes))
        class_name(vocab, (int)t, buf, size);
    else
        snprintf(buf, size, "%g", t);
}

cf_status cf_show_batch(const cf_batch *batch, int n, char *const *vocab, const char *png_path) {
    if (!batch || !is_image_batch(&batch->x)) {
        char buf[64];
        return cf_fail(
            CF_ERR_INVALID, "show_batch: the batch %s must hold images (B, 1 or 3, H, W)",
            batch && batch->x.data ? cf_shape_str(&batch->x.shape, buf, sizeof buf) : "(none)");
    }
    int b = batch->x.shape.dim[0];
    if (n < 1 || n > b || n > 64)
        return cf_fail(CF_ERR_INVALID, "show_batch: n = %d must be in [1, %d]", n, b < 64 ? b : 64);
    image_grid_fig f = {0};
    cf_status st = grid_alloc(&f, &batch->x, n, "show_batch");
    for (int i = 0; i < n && st == CF_OK; i++) {
        grid_tile(&f, i, &batch->x, i);
        int td = batch->y.shape.ndim == 2 ? batch->y.shape.dim[1] : 1;
        if (batch->y.data && td == 1)
            target_name(vocab, 0, batch->y.data[i], f.titles[i], sizeof f.titles[0]);
    }
    if (st == CF_OK) st = run_figure("show_batch", png_path, 0, 0, draw_image_grid, &f);
    grid_free(&f);
    return st;
}

cf_status cf_show_results(const cf_preds *p, int n, char *const *vocab, const char *png_path) {
    if (!p || !is_image_batch(&p->inputs) || p->inputs.shape.dim[0] != p->n)
        return cf_fail(CF_ERR_INVALID, "show_results: the predictions carry no input images "
                                       "(get_preds with_input)");
    if (!p->preds.data || p->preds.shape.ndim != 2 || p->preds.shape.dim[0] != p->n)
        return cf_fail(CF_ERR_INVALID, "show_results: predictions must be (n, n_classes)");
    if (n < 1 || n > p->n || n > 64)
        return cf_fail(CF_ERR_INVALID, "show_results: n = %d must be in [1, %lld]", n,
                       (long long)(p->n < 64 ? p->n : 64));
    image_grid_fig f = {0};
    cf_status st = grid_alloc(&f, &p->inputs, n, "show_results");
    int nc = p->preds.shape.dim[1];
    bool have_targs = p->targs.data && (int64_t)cf_tensor_numel(&p->targs) == p->n;
    for (int i = 0; i < n && st == CF_OK; i++) {
        grid_tile(&f, i, &p->inputs, i);
        int64_t pred =
            p->decoded ? p->decoded[i] : cf_plot__row_argmax(p->preds.data + (int64_t)i * nc, nc);
        char pn[40], an[40] = "?";
        target_name(vocab, nc, (double)pred, pn, sizeof pn);
        if (have_targs) target_name(vocab, nc, p->targs.data[i], an, sizeof an);
        snprintf(f.titles[i], sizeof f.titles[0], "%s/%s", an, pn);
        f.colour[i] = have_targs ? ((double)pred == p->targs.data[i] ? 1 : 2) : 0;
    }
    if (st == CF_OK) st = run_figure("show_results", png_path, 0, 0, draw_image_grid, &f);
    grid_free(&f);
    return st;
}
