/* The figure engine (figure.h): PLplot's pngcairo driver drawing into files, and the helpers
 * the figures share.
 *
 * Every figure follows the same path (cf_plot__run_figure): the data are checked and prepared
 * into plain arrays first, the output is opened through the library's file writer (a locked
 * temporary file beside the target, removed on a fatal signal; a character device is written
 * through), then, under one process-wide mutex, a fresh PLplot stream is made (plmkstrm),
 * pointed at that file, drawn by a callback that only makes PLplot calls, and ended (plend1);
 * the previous stream is made current again. PLplot's fatal errors call the exit handler
 * installed here, which longjmps back instead of letting PLplot exit the process; its non-fatal
 * errors are collected through plsError/plsabort. The file is checked to be a PNG and committed
 * (fsync, rename over the target, directory fsync). */
#include "figure.h"

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "corefit/plot.h"
#include "plot_internal.h"

/* ---- the figure machinery ----------------------------------------------------------------- */

static const PLINT k_palette[CF_N_COLS][3] = {
    {255, 255, 255}, {38, 38, 38},    {31, 119, 180},  {255, 127, 14},
    {44, 160, 44},   {214, 39, 40},   {148, 103, 189}, {140, 86, 75},
    {227, 119, 194}, {127, 127, 127}, {188, 189, 34},  {23, 190, 207},
    {222, 222, 222}, {255, 255, 255}, {128, 128, 128}, {150, 150, 150},
};

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

/* The part of cf_plot__run_figure between setjmp and longjmp: nothing here may live in a register.
 */
static int draw_guarded(const char *tmp, int width, int height, cf_plot_draw_fn draw, void *ctx) {
    g_armed = 1;
    if (setjmp(g_jmp) != 0) return 1;
    plsdev("pngcairo");
    plsfnam(tmp);
    plspage(0, 0, width, height, 0, 0);
    PLINT r[CF_N_COLS], g[CF_N_COLS], b[CF_N_COLS];
    for (int i = 0; i < CF_N_COLS; i++)
        r[i] = k_palette[i][0], g[i] = k_palette[i][1], b[i] = k_palette[i][2];
    plscmap0n(CF_N_COLS);
    plscmap0(r, g, b, CF_N_COLS);
    plscolbg(255, 255, 255);
    plsError(&g_errcode, g_errmsg);
    plinit();
    plcol0(CF_COL_FG);
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

/* The message for a figure PLplot did not finish (the g_ error state after a draw). */
static void plplot_failure(char *msg, size_t size) {
    if (g_fatal[0])
        snprintf(msg, size, "PLplot stopped with a fatal error: %s", g_fatal);
    else if (g_abort[0])
        snprintf(msg, size, "PLplot aborted an operation: %s", g_abort);
    else if (g_errcode) {
        /* strip PLplot's banner and newlines */
        const char *m = g_errmsg;
        while (*m == '\n' || *m == '*' || *m == ' ') m++;
        snprintf(msg, size, "PLplot error: %.900s", m);
        for (char *c = msg; *c; c++)
            if (*c == '\n') *c = ' ';
    } else
        snprintf(msg, size, "PLplot wrote no PNG data");
}

/* Draws one figure into path (see the file comment). `what` names the call in messages. */
cf_status cf_plot__run_figure(const char *what, const char *path, int width, int height,
                              cf_plot_draw_fn draw, void *ctx) {
    if (!path || !*path) return cf_fail(CF_ERR_INVALID, "%s: empty output path", what);
    if (path[strlen(path) - 1] == '/')
        return cf_fail(CF_ERR_INVALID, "%s: output path '%s' names a folder, not a file", what,
                       path);
    pthread_mutex_lock(&g_lock);
    if (!check_available_locked()) {
        pthread_mutex_unlock(&g_lock);
        return cf_fail(CF_ERR_UNSUPPORTED,
                       "%s: PLplot's pngcairo device is not available (install "
                       "plplot-driver-cairo); no PNG figures can be written",
                       what);
    }
    if (width <= 0 || height <= 0) width = g_width, height = g_height;
    /* PLplot opens the file by name: the writer's temporary file, or a character device
     * itself (written through, so it cannot be read back and checked) */
    cf__out_file out;
    cf_status st = cf__out_open(&out, path, 0);
    if (st != CF_OK) {
        pthread_mutex_unlock(&g_lock);
        return cf_fail_context(st, "%s", what);
    }
    const char *drawn = out.through ? path : out.tmp;
    g_fatal[0] = g_abort[0] = g_errmsg[0] = 0;
    g_errcode = 0;
    PLINT prev = 0, strm = -1;
    plgstrm(&prev);
    plmkstrm(&strm);
    if (strm < 0) {
        cf__out_abort(&out);
        pthread_mutex_unlock(&g_lock);
        return cf_fail(CF_ERR_STATE, "%s: PLplot has no free stream for '%s'", what, path);
    }
    int failed = draw_guarded(drawn, width, height, draw, ctx);
    /* a stream that could not be ended is a failure too; it is not left current either way */
    failed |= end_guarded();
    g_armed = 0;
    plsstrm(prev);

    long size = 0;
    if (!failed && !g_fatal[0] && !g_abort[0] && !g_errcode &&
        (out.through || (is_png(drawn, &size) && size > 0))) {
        st = cf__out_commit(&out);
        pthread_mutex_unlock(&g_lock);
        return st == CF_OK ? CF_OK : cf_fail_context(st, "%s", what);
    }
    cf__out_abort(&out);
    char msg[1024];
    plplot_failure(msg, sizeof msg);
    pthread_mutex_unlock(&g_lock);
    return cf_fail(CF_ERR_IO, "%s: writing '%s': %s", what, path, msg);
}

void cf_plot__figure_size(int *width, int *height) {
    pthread_mutex_lock(&g_lock);
    *width = g_width;
    *height = g_height;
    pthread_mutex_unlock(&g_lock);
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
void cf_plot__text(char *dst, size_t size, const char *src) {
    size_t o = 0;
    for (; src && *src && o + 2 < size; src++) {
        if (*src == '#') dst[o++] = '#';
        dst[o++] = *src;
    }
    dst[o] = 0;
}

cf_plot_range cf_plot__range_empty(void) {
    return (cf_plot_range){INFINITY, -INFINITY};
}
void cf_plot__range_add(cf_plot_range *r, const double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (isfinite(v[i])) {
            if (v[i] < r->lo) r->lo = v[i];
            if (v[i] > r->hi) r->hi = v[i];
        }
}
/* matplotlib's 5% margins; a flat or empty range gets a unit span. */
cf_plot_range cf_plot__range_pad(cf_plot_range r) {
    if (!(r.lo <= r.hi)) return (cf_plot_range){0, 1};
    double span = r.hi - r.lo;
    if (span <= 1e-12 * fmax(1.0, fabs(r.hi))) {
        double d = fabs(r.hi) > 0 ? 0.05 * fabs(r.hi) : 0.5;
        return (cf_plot_range){r.lo - d, r.hi + d};
    }
    return (cf_plot_range){r.lo - 0.05 * span, r.hi + 0.05 * span};
}

/* The current plot's viewport in millimetres and the character height (set by
 * cf_plot__std_viewport, read by cf_plot__axes and legend placement; figures are drawn under
 * g_lock). */
static struct { double w_mm, h_mm, ht_mm; } g_vp;

/* The viewport of a plot in the current subpage, with room for rotated y tick labels and the
 * y label on the left, x tick labels and the x label below and the title above. */
void cf_plot__std_viewport(void) {
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
void cf_plot__axes_ex(cf_plot_range x, cf_plot_range y, bool logx, bool logy, bool x_integer) {
    plwind(x.lo, x.hi, y.lo, y.hi);
    double tx_target = g_vp.ht_mm > 0 ? g_vp.w_mm / (7.0 * g_vp.ht_mm) : 5;
    double ty_target = g_vp.ht_mm > 0 ? g_vp.h_mm / (7.5 * g_vp.ht_mm) : 5;
    if (tx_target > 8) tx_target = 8;
    if (ty_target > 8) ty_target = 8;
    if (tx_target < 1) tx_target = 1;
    if (ty_target < 1) ty_target = 1;
    double xt = logx ? 0 : nice_step(x.hi - x.lo, tx_target, x_integer);
    double yt = logy ? 0 : nice_step(y.hi - y.lo, ty_target, false);
    plcol0(CF_COL_GRID);
    plwidth(1.0);
    pllsty(1);
    plbox(logx ? "gl" : "g", xt, 0, logy ? "gl" : "g", yt, 0);
    plcol0(CF_COL_FG);
    /* linear axes: our labels ("o"); log axes keep PLplot's 10^k, as matplotlib's */
    static tick_steps steps;
    steps = (tick_steps){xt, yt};
    plslabelfunc(label_tick, &steps);
    plbox(logx ? "bcnstl" : "bcnsto", xt, 0, logy ? "bcnstl" : "bcnsto", yt, 0);
    plslabelfunc(NULL, NULL);
}

void cf_plot__axes(cf_plot_range x, cf_plot_range y, bool logx, bool logy) {
    cf_plot__axes_ex(x, y, logx, logy, false);
}

void cf_plot__labels(const char *xlabel, const char *ylabel, const char *title) {
    plcol0(CF_COL_FG);
    pllab(xlabel ? xlabel : "", ylabel ? ylabel : "", title ? title : "");
}

/* Draws y against x, breaking the line at non-finite points. */
void cf_plot__series(const double *x, const double *y, int64_t n, int col, double width) {
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

void cf_plot__markers(const double *x, const double *y, int64_t n, int col, double scale) {
    plcol0(col);
    PLFLT def, ht;
    plgchr(&def, &ht);
    plschr(0, scale);
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && isfinite(y[i])) plptex(x[i], y[i], 1, 0, 0.5, DOT);
    plschr(0, 1.0);
}

void cf_plot__legend(const cf_plot_legend_entry *e, int n, PLINT position, double text_scale) {
    if (n <= 0) return;
    PLINT opt_array[8], text_colors[8], line_colors[8], line_styles[8], symbol_colors[8],
        symbol_numbers[8];
    PLFLT line_widths[8], symbol_scales[8];
    const char *text[8], *symbols[8];
    if (n > 8) n = 8;
    for (int i = 0; i < n; i++) {
        opt_array[i] = e[i].symbol ? PL_LEGEND_SYMBOL : PL_LEGEND_LINE;
        text_colors[i] = CF_COL_FG;
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
             CF_COL_BG, CF_COL_GRID, 1, 0, 0, n, opt_array, 0.6, text_scale, 1.8, 0.0, text_colors,
             text, NULL, NULL, NULL, NULL, line_colors, line_styles, line_widths, symbol_colors,
             symbol_scales, symbol_numbers, symbols);
}

/* matplotlib's loc="best" among the four inside corners: the corner whose legend box (size
 * estimated from the entries) covers the fewest samples of the curves. */
PLINT cf_plot__best_corner(const cf_plot_curve *c, int nc, cf_plot_range x, cf_plot_range y,
                           const cf_plot_legend_entry *e, int ne, double text_scale) {
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

double *cf_plot__alloc_doubles(int64_t n) {
    return cf_malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
}

/* ---- shared by the figures of classes and images ----------------------------------------- */

void cf_plot__class_name(char *const *vocab, int i, char *buf, size_t size) {
    if (vocab && vocab[i])
        cf_plot__text(buf, size, vocab[i]);
    else
        snprintf(buf, size, "%d", i);
}

/* An (h, w, 3) image in [0, 1] drawn into the current viewport, one filled cell a pixel. */
void cf_plot__rgb_image(const float *img, int h, int w) {
    plwind(0, w, 0, h);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            const float *p = img + ((int64_t)y * w + x) * 3;
            plscol0(CF_COL_SCRATCH, (PLINT)lround(p[0] * 255), (PLINT)lround(p[1] * 255),
                    (PLINT)lround(p[2] * 255));
            plcol0(CF_COL_SCRATCH);
            /* slightly oversized cells hide the anti-aliased seams between pixels */
            double xa = x > 0 ? x - 0.02 : 0, xb = x + 1 < w ? x + 1.02 : w;
            double ya = y + 1 < h ? h - y - 1.02 : 0, yb = y > 0 ? h - y + 0.02 : h;
            PLFLT px[4] = {xa, xb, xb, xa}, py[4] = {ya, ya, yb, yb};
            plfill(4, px, py);
        }
}

void cf_plot__tile_size(int64_t sh, int64_t sw, int *h, int *w) {
    int factor = 1;
    while (sh / factor > 64 || sw / factor > 64) factor++;
    *h = (int)(sh / factor);
    *w = (int)(sw / factor);
    if (*h < 1) *h = 1;
    if (*w < 1) *w = 1;
}

void cf_plot__image_tile(float *dst, int h, int w, const cf_tensor *x, int64_t item) {
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
    for (int y = 0; y < h; y++)
        for (int xx = 0; xx < w; xx++)
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
                dst[((int64_t)y * w + xx) * 3 + ch] = (float)(v < 0 ? 0 : v > 1 ? 1 : v);
            }
}
