/* Plot layer: PNG figures of synthetic recorders, lr_find results and predictions, decoded
 * back with stb_image and checked for size, content and colours; errors for bad paths and
 * empty inputs; confusion counts and top losses.
 *
 * Set CF_PLOT_TEST_DIR to an existing folder to keep the figures for a look. */
#include "oracle.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/plot.h"
#include "plot/plot_internal.h"

#ifdef CF_HAVE_STB
#include <stb_image.h>
#endif

static char g_dir[512];
static bool g_keep;

static int setup_dir(void **state) {
    (void)state;
    const char *keep = getenv("CF_PLOT_TEST_DIR");
    if (keep && *keep) {
        snprintf(g_dir, sizeof g_dir, "%s", keep);
        g_keep = true;
        mkdir(g_dir, 0755);
    } else {
        snprintf(g_dir, sizeof g_dir, "/tmp/cf_test_plot_XXXXXX");
        if (!mkdtemp(g_dir)) return -1;
    }
    return 0;
}

static int teardown_dir(void **state) {
    (void)state;
    if (g_keep) return 0;
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(g_dir);
    return 0;
}

static const char *path_in(const char *name) {
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 1024, "%s/%s", g_dir, name);
    return p;
}

#ifdef CF_HAVE_PLPLOT
/* No leftover temporary files ("<name>.tmp-XXXXXX", or any hidden file) in the folder. */
static void assert_no_temp_files(void) {
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if ((e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) ||
            strstr(e->d_name, ".tmp-"))
            fail_msg("temporary file left behind: %s", e->d_name);
    }
    closedir(d);
}
#endif

/* ---- synthetic data ----------------------------------------------------------------------- */

static char *dupstr(const char *s) {
    char *d = malloc(strlen(s) + 1);
    strcpy(d, s);
    return d;
}

/* A recorder of n_epochs epochs of bpe batches: a decaying smoothed loss, valid_loss slightly
 * above it, accuracy and error_rate rising/falling; the schedule of a one-cycle fit. */
static cf_recorder make_recorder(int n_epochs, int bpe) {
    cf_recorder r;
    memset(&r, 0, sizeof r);
    int64_t n = (int64_t)n_epochs * bpe;
    r.n_batches = r.batch_capacity = n;
    r.lrs = calloc((size_t)n + 1, sizeof(double));
    r.moms = calloc((size_t)n + 1, sizeof(double));
    r.losses = calloc((size_t)n + 1, sizeof(double));
    r.hp_lr = calloc((size_t)n + 1, sizeof(double));
    r.hp_mom = calloc((size_t)n + 1, sizeof(double));
    r.n_hps = n;
    cf_rng rng;
    cf_rng_seed(&rng, 7);
    for (int64_t i = 0; i < n; i++) {
        double pos = (double)i / (double)n;
        double lr = pos < 0.25 ? 4e-5 + (1e-3 - 4e-5) * (1 - cos(M_PI * pos / 0.25)) / 2
                               : 1e-8 + (1e-3 - 1e-8) * (1 + cos(M_PI * (pos - 0.25) / 0.75)) / 2;
        double mom = pos < 0.25 ? 0.95 - 0.1 * (1 - cos(M_PI * pos / 0.25)) / 2
                                : 0.85 + 0.1 * (1 - cos(M_PI * (pos - 0.25) / 0.75)) / 2;
        r.lrs[i] = r.hp_lr[i] = lr;
        r.moms[i] = r.hp_mom[i] = mom;
        r.losses[i] = 2.0 * exp(-3.0 * pos) + 0.3 + 0.05 * (cf_rng_uniform(&rng) - 0.5);
    }
    const char *names[] = {"epoch", "train_loss", "valid_loss", "accuracy", "error_rate", "time"};
    r.n_names = 6;
    r.metric_names = calloc(6, sizeof(char *));
    for (int i = 0; i < 6; i++) r.metric_names[i] = dupstr(names[i]);
    r.n_values = 4;
    r.n_epochs = r.epoch_capacity = n_epochs;
    r.values = calloc((size_t)n_epochs * 4 + 1, sizeof(double));
    r.iters = calloc((size_t)n_epochs + 1, sizeof(int64_t));
    r.times = calloc((size_t)n_epochs + 1, sizeof(double));
    for (int e = 0; e < n_epochs; e++) {
        r.iters[e] = (int64_t)(e + 1) * bpe;
        double tl = r.losses[r.iters[e] - 1];
        double acc = 0.6 + 0.3 * (1 - exp(-(double)(e + 1)));
        r.values[e * 4 + 0] = tl;
        r.values[e * 4 + 1] = tl + 0.1;
        r.values[e * 4 + 2] = acc;
        r.values[e * 4 + 3] = 1 - acc;
        r.times[e] = 1.5;
    }
    return r;
}

static void free_recorder(cf_recorder *r) {
    free(r->lrs);
    free(r->moms);
    free(r->losses);
    free(r->hp_lr);
    free(r->hp_mom);
    free(r->values);
    free(r->iters);
    free(r->times);
    for (int i = 0; i < r->n_names; i++) free(r->metric_names[i]);
    free(r->metric_names);
    memset(r, 0, sizeof *r);
}

/* ---- PNG checks --------------------------------------------------------------------------- */

typedef struct png_stats {
    int w, h;
    double non_white;  /* fraction of pixels that are not (near) white */
    int distinct;      /* distinct colours (capped at 4096) */
    unsigned char *px; /* RGB */
} png_stats;

#if defined(CF_HAVE_STB) && defined(CF_HAVE_PLPLOT)
static png_stats load_png(const char *path) {
    png_stats s = {0};
    int comp = 0;
    s.px = stbi_load(path, &s.w, &s.h, &comp, 3);
    if (!s.px) fail_msg("cannot decode %s: %s", path, stbi_failure_reason());
    int64_t n = (int64_t)s.w * s.h, nw = 0;
    uint32_t *seen = calloc(4096, sizeof(uint32_t));
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *p = s.px + 3 * i;
        if (p[0] < 245 || p[1] < 245 || p[2] < 245) nw++;
        uint32_t key = ((uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2]) + 1;
        uint32_t h = (key * 2654435761u) & 4095;
        for (int probe = 0; probe < 4096; probe++) {
            uint32_t j = (h + (uint32_t)probe) & 4095;
            if (seen[j] == key) break;
            if (!seen[j]) {
                if (s.distinct < 4096) {
                    seen[j] = key;
                    s.distinct++;
                }
                break;
            }
        }
    }
    free(seen);
    s.non_white = (double)nw / (double)n;
    return s;
}

/* Pixels within tol of (r, g, b) in the column range [x0, x1); their mean row in *mean_y. */
static int64_t count_colour(const png_stats *s, int r, int g, int b, int tol, int x0, int x1,
                            double *mean_y) {
    int64_t count = 0;
    double sy = 0;
    for (int y = 0; y < s->h; y++)
        for (int x = x0; x < x1 && x < s->w; x++) {
            const unsigned char *p = s->px + 3 * ((int64_t)y * s->w + x);
            if (abs(p[0] - r) <= tol && abs(p[1] - g) <= tol && abs(p[2] - b) <= tol) {
                count++;
                sy += y;
            }
        }
    if (mean_y) *mean_y = count ? sy / (double)count : -1;
    return count;
}

static int64_t colour_pixels(const png_stats *s, int r, int g, int b) {
    return count_colour(s, r, g, b, 12, 0, s->w, NULL);
}

/* Size, a white background, dark text and axes, and several colours. */
static png_stats check_figure(const char *path, int w, int h) {
    png_stats s = load_png(path);
    assert_int_equal(s.w, w);
    assert_int_equal(s.h, h);
    /* the corner pixel is background: white, not PLplot's default black */
    assert_true(s.px[0] == 255 && s.px[1] == 255 && s.px[2] == 255);
    assert_true(s.non_white > 0.01);
    assert_true(s.non_white < 0.6);
    assert_true(s.distinct >= 8);
    assert_true(colour_pixels(&s, 38, 38, 38) > 200); /* text and frame */
    return s;
}
#define C0 31, 119, 180 /* blue: train / the curve */
#define C1 255, 127, 14 /* orange: valid / first suggestion */
#define C2 44, 160, 44
#define C3 214, 39, 40
#define C4 148, 103, 189
#endif

/* ---- tests -------------------------------------------------------------------------------- */

#ifdef CF_HAVE_PLPLOT

static void test_plot_loss_png(void **state) {
    (void)state;
    assert_true(cf_plot_available());
    cf_recorder r = make_recorder(4, 50);
    const char *p = path_in("loss.png");
    assert_int_equal(cf_plot_loss(&r, p, NULL), CF_OK);
    assert_no_temp_files();
#ifdef CF_HAVE_STB
    png_stats s = check_figure(p, 800, 600);
    /* the train curve falls: its blue pixels sit higher (smaller row) on the left than on
     * the right */
    double y_left, y_right;
    assert_true(count_colour(&s, C0, 12, 0, s.w / 3, &y_left) > 50);
    assert_true(count_colour(&s, C0, 12, 2 * s.w / 3, s.w, &y_right) > 50);
    assert_true(y_left < y_right - 50);
    assert_true(colour_pixels(&s, C1) > 50); /* valid */
    stbi_image_free(s.px);
#endif
    /* without valid; log axes; another size; overwriting the existing file */
    cf_plot_loss_opts o = {
        .no_valid = true, .log = true, .show_epochs = true, .width = 640, .height = 480};
    assert_int_equal(cf_plot_loss(&r, p, &o), CF_OK);
#ifdef CF_HAVE_STB
    s = check_figure(p, 640, 480);
    assert_true(colour_pixels(&s, C0) > 50);
    assert_int_equal(colour_pixels(&s, C1), 0);
    stbi_image_free(s.px);
#endif
    /* one epoch: the single valid point still shows */
    cf_recorder one = make_recorder(1, 20);
    assert_int_equal(cf_plot_loss(&one, path_in("loss_one_epoch.png"), NULL), CF_OK);
#ifdef CF_HAVE_STB
    s = check_figure(path_in("loss_one_epoch.png"), 800, 600);
    assert_true(colour_pixels(&s, C1) > 20);
    stbi_image_free(s.px);
#endif
    free_recorder(&one);
    free_recorder(&r);
}

static void test_plot_errors(void **state) {
    (void)state;
    cf_recorder r = make_recorder(2, 10);
    cf_recorder empty;
    memset(&empty, 0, sizeof empty);

    assert_int_equal(cf_plot_loss(&empty, path_in("empty.png"), NULL), CF_ERR_STATE);
    assert_non_null(strstr(cf_last_error(), "nothing to plot"));
    assert_int_equal(cf_plot_sched(&empty, path_in("empty.png")), CF_ERR_STATE);
    assert_int_equal(cf_plot_metrics(&empty, path_in("empty.png")), CF_ERR_STATE);
    assert_int_equal(cf_plot_loss(NULL, path_in("empty.png"), NULL), CF_ERR_INVALID);
    /* fewer batches than skip_start: nothing left to plot */
    cf_recorder short_rec = make_recorder(1, 4);
    assert_int_equal(cf_plot_loss(&short_rec, path_in("short.png"), NULL), CF_ERR_STATE);
    cf_plot_loss_opts all = {.skip_start = -1};
    assert_int_equal(cf_plot_loss(&short_rec, path_in("short.png"), &all), CF_OK);
    free_recorder(&short_rec);
    assert_true(access(path_in("empty.png"), F_OK) != 0);

    /* unwritable path: a folder that does not exist */
    assert_int_equal(cf_plot_loss(&r, "/nonexistent-corefit-dir/loss.png", NULL), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), "/nonexistent-corefit-dir"));
    assert_int_equal(cf_plot_sched(&r, "/nonexistent-corefit-dir/s.png"), CF_ERR_IO);
    /* a path naming a folder */
    assert_int_equal(cf_plot_loss(&r, g_dir, NULL), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), g_dir));
    char slash[600];
    snprintf(slash, sizeof slash, "%s/", g_dir);
    assert_int_equal(cf_plot_loss(&r, slash, NULL), CF_ERR_INVALID);
    assert_int_equal(cf_plot_loss(&r, "", NULL), CF_ERR_INVALID);
    assert_int_equal(cf_plot_loss(&r, NULL, NULL), CF_ERR_INVALID);
    assert_no_temp_files();

    assert_int_equal(cf_plot_set_size(10, 10), CF_ERR_INVALID);
    free_recorder(&r);
}

/* PLplot's fatal errors (here: its own open of an unwritable file gives up with "Too many
 * tries") are reported, not turned into an exit, and later figures still work. */
static void test_plplot_fatal_error_is_caught(void **state) {
    (void)state;
    assert_int_equal(cf_plot__raw_figure("/nonexistent-corefit-dir/raw.png"), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), "fatal"));
    cf_recorder r = make_recorder(2, 10);
    assert_int_equal(cf_plot_loss(&r, path_in("after_fatal.png"), NULL), CF_OK);
#ifdef CF_HAVE_STB
    png_stats s = check_figure(path_in("after_fatal.png"), 800, 600);
    stbi_image_free(s.px);
#endif
    free_recorder(&r);
}

static void test_plot_sched_png(void **state) {
    (void)state;
    cf_recorder r = make_recorder(3, 40);
    assert_int_equal(cf_plot_sched(&r, path_in("sched.png")), CF_OK);
#ifdef CF_HAVE_STB
    png_stats s = check_figure(path_in("sched.png"), 800, 600);
    /* one curve in each half of the figure */
    assert_true(count_colour(&s, C0, 12, 0, s.w / 2, NULL) > 50);
    assert_true(count_colour(&s, C0, 12, s.w / 2, s.w, NULL) > 50);
    stbi_image_free(s.px);
#endif
    /* no scheduler record: falls back to the recorder's lrs and moms */
    free(r.hp_lr);
    free(r.hp_mom);
    r.hp_lr = r.hp_mom = NULL;
    r.n_hps = 0;
    assert_int_equal(cf_plot_sched(&r, path_in("sched_fallback.png")), CF_OK);
#ifdef CF_HAVE_STB
    s = check_figure(path_in("sched_fallback.png"), 800, 600);
    assert_true(count_colour(&s, C0, 12, s.w / 2, s.w, NULL) > 50);
    stbi_image_free(s.px);
#endif
    free_recorder(&r);
}

static cf_lr_find_result make_lr_find(int n, int suggest) {
    cf_lr_find_result r;
    memset(&r, 0, sizeof r);
    r.n = n;
    r.lrs = calloc((size_t)n, sizeof(double));
    r.losses = calloc((size_t)n, sizeof(double));
    int imin = 0;
    for (int i = 0; i < n; i++) {
        double pos = (double)i / 100.0;
        r.lrs[i] = 1e-7 * pow(10 / 1e-7, pos);
        double l = log10(r.lrs[i]);
        /* flat, falls between 1e-4 and 1e-2, blows up after 1e-1 */
        r.losses[i] = 2.3 - 1.5 / (1 + exp(-3 * (l + 3))) + (l > -1 ? 2 * (l + 1) * (l + 1) : 0);
        if (r.losses[i] < r.losses[imin]) imin = i;
    }
    r.suggest = suggest;
    r.valley = r.lrs[55];
    r.valley_loss = r.losses[55];
    r.slide = r.lrs[60];
    r.slide_loss = r.losses[60];
    r.minimum = r.lrs[imin] / 10;
    r.minimum_lr_at = r.lrs[imin];
    r.minimum_loss = r.losses[imin];
    r.steep = r.lrs[45];
    r.steep_loss = r.losses[45];
    return r;
}

static void test_plot_lr_find_png(void **state) {
    (void)state;
    cf_lr_find_result r = make_lr_find(90, CF_SUGGEST_VALLEY | CF_SUGGEST_SLIDE |
                                               CF_SUGGEST_MINIMUM | CF_SUGGEST_STEEP);
    assert_int_equal(cf_plot_lr_find(&r, path_in("lr_find.png")), CF_OK);
#ifdef CF_HAVE_STB
    png_stats s = check_figure(path_in("lr_find.png"), 800, 600);
    assert_true(colour_pixels(&s, C0) > 50);
    assert_true(colour_pixels(&s, C1) > 20); /* valley */
    assert_true(colour_pixels(&s, C2) > 20); /* slide */
    assert_true(colour_pixels(&s, C3) > 20); /* minimum */
    assert_true(colour_pixels(&s, C4) > 20); /* steep */
    stbi_image_free(s.px);
#endif
    /* only valley computed: one marker colour */
    r.suggest = CF_SUGGEST_VALLEY;
    assert_int_equal(cf_plot_lr_find(&r, path_in("lr_find_valley.png")), CF_OK);
#ifdef CF_HAVE_STB
    s = check_figure(path_in("lr_find_valley.png"), 800, 600);
    assert_true(colour_pixels(&s, C1) > 20);
    assert_int_equal(colour_pixels(&s, C2), 0);
    assert_int_equal(colour_pixels(&s, C3), 0);
    stbi_image_free(s.px);
#endif
    r.n = 6; /* one point left after skip_end */
    assert_int_equal(cf_plot_lr_find(&r, path_in("lr_find_short.png")), CF_ERR_STATE);
    assert_int_equal(cf_plot_lr_find(NULL, path_in("lr_find_short.png")), CF_ERR_INVALID);
    free(r.lrs);
    free(r.losses);
}

static void test_plot_metrics_png(void **state) {
    (void)state;
    cf_recorder r = make_recorder(6, 10);
    r.values[2 * 4 + 1] = NAN; /* a cancelled validation leaves a gap */
    assert_int_equal(cf_plot_metrics(&r, path_in("metrics.png")), CF_OK);
#ifdef CF_HAVE_STB
    png_stats s = check_figure(path_in("metrics.png"), 800, 600);
    assert_true(colour_pixels(&s, C0) > 30);
    assert_true(colour_pixels(&s, C1) > 30);
    stbi_image_free(s.px);
#endif
    /* names and values that disagree */
    r.n_names = 3;
    assert_int_equal(cf_plot_metrics(&r, path_in("metrics_bad.png")), CF_ERR_INVALID);
    r.n_names = 6;
    free_recorder(&r);
}

#endif /* CF_HAVE_PLPLOT */

/* Predictions of a 3-class classifier: item i has target i % 3 and a prediction that is
 * right except for every 4th item (shifted by one class). */
static cf_preds make_preds(int n, int nc) {
    cf_preds p;
    memset(&p, 0, sizeof p);
    p.n = n;
    p.preds = cf_tensor_view(calloc((size_t)n * nc, sizeof(float)), cf_shape2(n, nc));
    p.targs = cf_tensor_view(calloc((size_t)n, sizeof(float)), cf_shape1(n));
    p.losses = calloc((size_t)n, sizeof(float));
    for (int i = 0; i < n; i++) {
        int t = i % nc, pr = i % 4 == 0 ? (t + 1) % nc : t;
        for (int c = 0; c < nc; c++) p.preds.data[i * nc + c] = c == pr ? 0.7f : 0.3f / (nc - 1);
        p.targs.data[i] = (float)t;
        p.losses[i] = -logf(p.preds.data[i * nc + t]);
    }
    return p;
}

static void free_test_preds(cf_preds *p) {
    free(p->preds.data);
    free(p->targs.data);
    free(p->inputs.data);
    free(p->losses);
    free(p->decoded);
}

static void test_confusion_counts(void **state) {
    (void)state;
    int n = 40, nc = 3;
    cf_preds p = make_preds(n, nc);
    int64_t counts[9], expect[9] = {0};
    for (int i = 0; i < n; i++) {
        int t = i % nc, pr = i % 4 == 0 ? (t + 1) % nc : t;
        expect[t * nc + pr]++;
    }
    assert_int_equal(cf_confusion_from_preds(&p, nc, counts), CF_OK);
    for (int i = 0; i < 9; i++) assert_int_equal(counts[i], expect[i]);
    /* decoded classes take precedence over the argmax */
    p.decoded = calloc((size_t)n, sizeof(int64_t)); /* everything predicted as class 0 */
    assert_int_equal(cf_confusion_from_preds(&p, nc, counts), CF_OK);
    for (int t = 0; t < nc; t++) {
        int64_t row = 0;
        for (int i = 0; i < n; i++) row += i % nc == t;
        assert_int_equal(counts[t * nc + 0], row);
        assert_int_equal(counts[t * nc + 1], 0);
    }
    free(p.decoded);
    p.decoded = NULL;
    /* a target outside the classes, or a class count that does not match */
    p.targs.data[5] = 3;
    assert_int_equal(cf_confusion_from_preds(&p, nc, counts), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "item 5"));
    p.targs.data[5] = 2;
    assert_int_equal(cf_confusion_from_preds(&p, 4, counts), CF_ERR_INVALID);
    free_test_preds(&p);
}

static void test_top_losses(void **state) {
    (void)state;
    cf_preds p = make_preds(12, 3);
    float l[12] = {0.1f, 2.0f, 0.5f, 3.0f, 0.5f, 0.0f, 1.0f, 2.0f, 0.2f, 0.3f, 4.0f, 0.4f};
    memcpy(p.losses, l, sizeof l);
    int64_t idx[12];
    assert_int_equal(cf_top_losses(&p, 5, idx), CF_OK);
    int64_t expect[5] = {10, 3, 1, 7, 6}; /* 4.0, 3.0, 2.0 (lower index first), 2.0, 1.0 */
    for (int i = 0; i < 5; i++) assert_int_equal(idx[i], expect[i]);
    assert_int_equal(cf_top_losses(&p, 12, idx), CF_OK);
    for (int i = 1; i < 12; i++) assert_true(l[idx[i - 1]] >= l[idx[i]]);
    assert_int_equal(cf_top_losses(&p, 0, idx), CF_ERR_INVALID);
    assert_int_equal(cf_top_losses(&p, 13, idx), CF_ERR_INVALID);
    free(p.losses);
    p.losses = NULL;
    assert_int_equal(cf_top_losses(&p, 3, idx), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "with_loss"));
    free_test_preds(&p);
}

#ifdef CF_HAVE_PLPLOT

static void test_plot_confusion_png(void **state) {
    (void)state;
    int nc = 10;
    cf_preds p = make_preds(500, nc);
    int64_t counts[100];
    assert_int_equal(cf_confusion_from_preds(&p, nc, counts), CF_OK);
    char *vocab[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                       "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    assert_int_equal(cf_plot_confusion_matrix(counts, nc, vocab, path_in("confusion.png"), false),
                     CF_OK);
#ifdef CF_HAVE_STB
    png_stats s = check_figure(path_in("confusion.png"), 800, 600);
    assert_true(colour_pixels(&s, 8, 48, 107) > 500);    /* darkest blue: the largest cells */
    assert_true(colour_pixels(&s, 247, 251, 255) > 500); /* lightest: the empty cells */
    stbi_image_free(s.px);
#endif
    assert_int_equal(
        cf_plot_confusion_matrix(counts, nc, NULL, path_in("confusion_norm.png"), true), CF_OK);
#ifdef CF_HAVE_STB
    s = check_figure(path_in("confusion_norm.png"), 800, 600);
    assert_true(colour_pixels(&s, 8, 48, 107) > 500);
    stbi_image_free(s.px);
#endif
    int64_t three[9] = {5, 1, 0, 2, 7, 1, 0, 0, 9};
    char *abc[3] = {"cat", "dog", "#na#"};
    assert_int_equal(cf_plot_confusion_matrix(three, 3, abc, path_in("confusion3.png"), false),
                     CF_OK);
    three[4] = -1;
    assert_int_equal(cf_plot_confusion_matrix(three, 3, abc, path_in("bad.png"), false),
                     CF_ERR_INVALID);
    assert_int_equal(cf_plot_confusion_matrix(three, 0, abc, path_in("bad.png"), false),
                     CF_ERR_INVALID);
    free_test_preds(&p);
}

static void test_plot_top_losses_png(void **state) {
    (void)state;
    /* grey 28x28 digits-like images: a bright square whose place depends on the item */
    int n = 20, nc = 3;
    cf_preds p = make_preds(n, nc);
    p.inputs = cf_tensor_view(calloc((size_t)n * 28 * 28, sizeof(float)), cf_shape4(n, 1, 28, 28));
    for (int i = 0; i < n; i++)
        for (int y = 0; y < 28; y++)
            for (int x = 0; x < 28; x++)
                p.inputs.data[(i * 28 + y) * 28 + x] =
                    (y >= i % 10 && y < i % 10 + 12 && x >= 8 && x < 20) ? 1.0f : -0.5f;
    char *vocab[3] = {"cat", "dog", "bird"};
    assert_int_equal(cf_plot_top_losses(&p, 9, vocab, path_in("top_losses_grey.png")), CF_OK);
#ifdef CF_HAVE_STB
    png_stats s = check_figure(path_in("top_losses_grey.png"), 800, 600);
    assert_true(count_colour(&s, 0, 0, 0, 4, 0, s.w, NULL) > 2000); /* image backgrounds */
    stbi_image_free(s.px);
#endif
    free(p.inputs.data);
    /* RGB 32x32: a red disc on blue */
    p.inputs =
        cf_tensor_view(calloc((size_t)n * 3 * 32 * 32, sizeof(float)), cf_shape4(n, 3, 32, 32));
    for (int i = 0; i < n; i++)
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++) {
                bool in = (x - 16) * (x - 16) + (y - 16) * (y - 16) < 100;
                float *img = p.inputs.data + (int64_t)i * 3 * 32 * 32;
                img[(0 * 32 + y) * 32 + x] = in ? 1.0f : 0.0f;
                img[(1 * 32 + y) * 32 + x] = 0.0f;
                img[(2 * 32 + y) * 32 + x] = in ? 0.0f : 1.0f;
            }
    assert_int_equal(cf_plot_top_losses(&p, 4, NULL, path_in("top_losses_rgb.png")), CF_OK);
#ifdef CF_HAVE_STB
    s = check_figure(path_in("top_losses_rgb.png"), 800, 600);
    assert_true(count_colour(&s, 255, 0, 0, 4, 0, s.w, NULL) > 1000);
    assert_true(count_colour(&s, 0, 0, 255, 4, 0, s.w, NULL) > 1000);
    stbi_image_free(s.px);
#endif
    assert_int_equal(cf_plot_top_losses(&p, 0, NULL, path_in("bad.png")), CF_ERR_INVALID);
    free(p.inputs.data);
    p.inputs.data = NULL;
    assert_int_equal(cf_plot_top_losses(&p, 3, NULL, path_in("bad.png")), CF_ERR_INVALID);
    free_test_preds(&p);
}

/* Figures drawn from several threads at once come out whole (the calls are serialised). */
typedef struct thread_job {
    cf_recorder *rec;
    char path[1024];
    cf_status st;
} thread_job;

static void *plot_thread(void *arg) {
    thread_job *j = arg;
    for (int k = 0; k < 3 && j->st == CF_OK; k++) j->st = cf_plot_loss(j->rec, j->path, NULL);
    return NULL;
}

static void test_plot_from_threads(void **state) {
    (void)state;
    cf_recorder r = make_recorder(2, 30);
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].rec = &r;
        jobs[i].st = CF_OK;
        snprintf(jobs[i].path, sizeof jobs[i].path, "%s/thread%d.png", g_dir, i);
        assert_int_equal(pthread_create(&th[i], NULL, plot_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].st, CF_OK);
#ifdef CF_HAVE_STB
        png_stats s = check_figure(jobs[i].path, 800, 600);
        stbi_image_free(s.px);
#endif
    }
    assert_no_temp_files();
    free_recorder(&r);
}

#else

static void test_plot_unsupported(void **state) {
    (void)state;
    cf_recorder r = make_recorder(2, 10);
    assert_false(cf_plot_available());
    assert_int_equal(cf_plot_loss(&r, path_in("x.png"), NULL), CF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cf_last_error(), "PLplot"));
    assert_int_equal(cf_plot_sched(&r, path_in("x.png")), CF_ERR_UNSUPPORTED);
    free_recorder(&r);
}

#endif /* CF_HAVE_PLPLOT */

/* Tick labels as matplotlib writes them, not PLplot's "(x10^-1)" factor. */
static void test_tick_labels(void **state) {
    (void)state;
    static const struct {
        double value, step;
        const char *want;
    } cases[] = {
        {0.1, 0.1, "0.1"},
        {0.3, 0.05, "0.30"},
        {0.25, 0.05, "0.25"},
        {2, 0.5, "2.0"},
        {2, 1, "2"},
        {40000, 20000, "40000"},
        {0.75, 0.25, "0.75"},
        {1e-16, 0.2, "0.0"},
        {-0.4, 0.2, "-0.4"},
        {3e-5, 1e-5, "3e-05"},
        {2.5e6, 5e5, "2.5e+06"},
        {0.002, 0.002, "0.002"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char b[64];
        cf_plot__tick_label(cases[i].value, cases[i].step, b, sizeof b);
        if (strcmp(b, cases[i].want) != 0)
            fail_msg("tick %g (step %g): '%s', expected '%s'", cases[i].value, cases[i].step, b,
                     cases[i].want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tick_labels),
        cmocka_unit_test(test_confusion_counts),
        cmocka_unit_test(test_top_losses),
#ifdef CF_HAVE_PLPLOT
        cmocka_unit_test(test_plot_loss_png),
        cmocka_unit_test(test_plot_errors),
        cmocka_unit_test(test_plplot_fatal_error_is_caught),
        cmocka_unit_test(test_plot_sched_png),
        cmocka_unit_test(test_plot_lr_find_png),
        cmocka_unit_test(test_plot_metrics_png),
        cmocka_unit_test(test_plot_confusion_png),
        cmocka_unit_test(test_plot_top_losses_png),
        cmocka_unit_test(test_plot_from_threads),
#else
        cmocka_unit_test(test_plot_unsupported),
#endif
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
