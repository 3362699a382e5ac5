/* Figures drawn during a fit (fastai's ShowGraphCallback, to files), a learner's Recorder figures,
 * and showing figures in a terminal (their paths, or sixel graphics through libsixel loaded at run
 * time). */
#include "corefit/plot.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

/* ---- ShowGraphCallback --------------------------------------------------------------------- */

typedef struct show_graph {
    char loss_path[4096], metrics_path[4096];
    char dir[4000], prefix[64];
    bool no_metrics, active;
} show_graph;

static cf_status sg_before_fit(cf_callback *cb, cf_learner *learn) {
    show_graph *g = cb->state;
    /* fastai runs it only in real fits (not under LRFinder or GatherPreds) */
    g->active = learn->replica.is_master && learn->logging && !learn->in_lr_find;
    if (!g->active) return CF_OK;
    if (!cf_plot_available())
        return cf_fail(CF_ERR_UNSUPPORTED,
                       "ShowGraphCallback: PNG figures cannot be written here (PLplot or its "
                       "pngcairo device is missing)");
    const char *dir = g->dir[0] ? g->dir : (learn->path ? learn->path : ".");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return cf_fail(CF_ERR_IO, "ShowGraphCallback: cannot create folder %s: %s", dir,
                       strerror(errno));
    int a = snprintf(g->loss_path, sizeof g->loss_path, "%s/%s_loss.png", dir, g->prefix);
    int b = snprintf(g->metrics_path, sizeof g->metrics_path, "%s/%s_metrics.png", dir, g->prefix);
    if (a < 0 || b < 0 || (size_t)a >= sizeof g->loss_path || (size_t)b >= sizeof g->metrics_path)
        return cf_fail(CF_ERR_INVALID, "ShowGraphCallback: folder name too long: %s", dir);
    return CF_OK;
}

static cf_status sg_after_epoch(cf_callback *cb, cf_learner *learn) {
    show_graph *g = cb->state;
    if (!g->active) return CF_OK;
    const cf_recorder *rec = &learn->recorder;
    cf_plot_loss_opts lo = {.skip_start = -1};
    cf_status st = rec->n_batches > 0 ? cf_plot_loss(rec, g->loss_path, &lo) : CF_OK;
    if (st == CF_OK && rec->n_batches > 0) st = cf_learner_note_figure(learn, g->loss_path);
    if (st == CF_OK && !g->no_metrics && learn->n_metrics > 0 && rec->n_epochs > 0) {
        st = cf_plot_metrics(rec, g->metrics_path);
        if (st == CF_OK) st = cf_learner_note_figure(learn, g->metrics_path);
    }
    return st == CF_OK ? CF_OK : cf_fail_context(st, "ShowGraphCallback at epoch %d", learn->epoch);
}

cf_callback *cf_show_graph_cb_(const cf_show_graph_opts *o) {
    cf_show_graph_opts none = {0};
    if (!o) o = &none;
    const char *prefix = o->prefix && *o->prefix ? o->prefix : "show_graph";
    if ((o->dir && strlen(o->dir) >= sizeof(((show_graph *)0)->dir)) ||
        strlen(prefix) >= sizeof(((show_graph *)0)->prefix) || strchr(prefix, '/')) {
        cf_fail(CF_ERR_INVALID, "ShowGraphCallback: dir too long, or prefix too long or with '/'");
        return NULL;
    }
    /* order 65, fastai's: after the Recorder (50) has the epoch's values */
    cf_callback *cb = cf_callback_new("ShowGraphCallback", 65, sizeof(show_graph));
    if (!cb) return NULL;
    show_graph *g = cb->state;
    snprintf(g->dir, sizeof g->dir, "%s", o->dir ? o->dir : "");
    snprintf(g->prefix, sizeof g->prefix, "%s", prefix);
    g->no_metrics = o->no_metrics;
    cb->skip_valid = true;
    cb->on[CF_EV_BEFORE_FIT] = sg_before_fit;
    cb->on[CF_EV_AFTER_EPOCH] = sg_after_epoch;
    return cb;
}

/* ---- showing figures ----------------------------------------------------------------------- */

/* Asks the terminal for its primary device attributes (ESC [ c); sixel terminals list 4. */
static bool terminal_has_sixel(void) {
    int fd = open("/dev/tty", O_RDWR | O_NOCTTY);
    if (fd < 0) return false;
    struct termios old, raw;
    if (tcgetattr(fd, &old) != 0) {
        close(fd);
        return false;
    }
    raw = old;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(fd, TCSANOW, &raw);
    bool sixel = false;
    if (write(fd, "\033[c", 3) == 3) {
        char buf[128];
        size_t n = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        while (n + 1 < sizeof buf && poll(&p, 1, 300) > 0) {
            ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
            if (k <= 0) break;
            n += (size_t)k;
            if (memchr(buf, 'c', n)) break;
        }
        buf[n] = '\0';
        /* ESC [ ? 62 ; 4 ; 6 c */
        char *q = strchr(buf, '?'), *save = NULL;
        for (char *t = q ? strtok_r(q + 1, ";c", &save) : NULL; t; t = strtok_r(NULL, ";c", &save))
            if (strcmp(t, "4") == 0) sixel = true;
    }
    tcsetattr(fd, TCSANOW, &old);
    close(fd);
    return sixel;
}

typedef int (*encoder_new_fn)(void **encoder, void *allocator);
typedef int (*encoder_setopt_fn)(void *encoder, int arg, const char *value);
typedef int (*encoder_encode_fn)(void *encoder, const char *filename);
typedef void (*encoder_unref_fn)(void *encoder);

/* libsixel's encoder, loaded at run time so that corefit neither needs it to build nor to run. */
typedef struct sixel_lib {
    void *handle;
    encoder_new_fn enc_new;
    encoder_setopt_fn enc_setopt;
    encoder_encode_fn enc_encode;
    encoder_unref_fn enc_unref;
} sixel_lib;

/* Loads libsixel and decides whether `out` can show sixel graphics. Returns NULL when it can
 * (lib is then open), or why not (lib closed). The terminal is asked at most once a process. */
static const char *sixel_open(FILE *out, sixel_lib *lib) {
    static int terminal_answer = -1; /* -1: not asked yet */
    memset(lib, 0, sizeof *lib);
    const char *env = getenv("COREFIT_SIXEL");
    if (env && strcmp(env, "0") == 0) return "COREFIT_SIXEL=0 turns it off";
    if (!isatty(fileno(out))) return "the output is not a terminal";
    lib->handle = dlopen("libsixel.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib->handle) lib->handle = dlopen("libsixel.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib->handle)
        return "figures are drawn with libsixel, which is not installed here (Debian: apt-get "
               "install libsixel1)";
    lib->enc_new = (encoder_new_fn)dlsym(lib->handle, "sixel_encoder_new");
    lib->enc_setopt = (encoder_setopt_fn)dlsym(lib->handle, "sixel_encoder_setopt");
    lib->enc_encode = (encoder_encode_fn)dlsym(lib->handle, "sixel_encoder_encode");
    lib->enc_unref = (encoder_unref_fn)dlsym(lib->handle, "sixel_encoder_unref");
    const char *why = NULL;
    if (!lib->enc_new || !lib->enc_encode || !lib->enc_unref) {
        why = "this libsixel lacks the encoder API";
    } else if (!(env && strcmp(env, "1") == 0)) {
        if (terminal_answer < 0) terminal_answer = terminal_has_sixel();
        if (!terminal_answer)
            why = "this terminal does not report sixel graphics (COREFIT_SIXEL=1 draws anyway)";
    }
    if (why) {
        dlclose(lib->handle);
        memset(lib, 0, sizeof *lib);
    }
    return why;
}

const char *cf_show_figures_unavailable(FILE *out) {
    sixel_lib lib;
    const char *why = sixel_open(out ? out : stdout, &lib);
    if (lib.handle) dlclose(lib.handle);
    return why;
}

int cf_show_figures(const char *const *paths, int n, FILE *out) {
    if (!out) out = stdout;
    sixel_lib lib;
    bool sixel = n > 0 && sixel_open(out, &lib) == NULL;
    int drawn = 0;
    for (int i = 0; i < n; i++) {
        fprintf(out, "%s\n", paths[i]);
        fflush(out);
        void *enc = NULL;
        if (!sixel || lib.enc_new(&enc, NULL) != 0 || !enc) continue;
        /* libsixel writes to stdout unless told a file (SIXEL_OPTFLAG_OUTFILE, 'o') */
        char out_path[32];
        snprintf(out_path, sizeof out_path, "/dev/fd/%d", fileno(out));
        if (out != stdout && lib.enc_setopt) lib.enc_setopt(enc, 'o', out_path);
        if (lib.enc_encode(enc, paths[i]) == 0) drawn++;
        lib.enc_unref(enc);
        fflush(out);
    }
    if (sixel) dlclose(lib.handle);
    return drawn;
}

int cf_learner_show_figures(const cf_learner *learn, FILE *out) {
    if (!learn) return 0;
    return cf_show_figures((const char *const *)learn->figures, learn->n_figures, out);
}

/* ---- a learner's Recorder figures ---------------------------------------------------------- */

cf_status cf_learner_plot_loss(const cf_learner *learn, const char *png_path,
                               const cf_plot_loss_opts *opts) {
    if (!learn) return cf_fail(CF_ERR_INVALID, "plot_loss: NULL learner");
    return cf_plot_loss(&learn->recorder, png_path, opts);
}

cf_status cf_learner_plot_sched(const cf_learner *learn, const char *png_path) {
    if (!learn) return cf_fail(CF_ERR_INVALID, "plot_sched: NULL learner");
    return cf_plot_sched(&learn->recorder, png_path);
}

cf_status cf_learner_plot_metrics(const cf_learner *learn, const char *png_path) {
    if (!learn) return cf_fail(CF_ERR_INVALID, "plot_metrics: NULL learner");
    return cf_plot_metrics(&learn->recorder, png_path);
}
