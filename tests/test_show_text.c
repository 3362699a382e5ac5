/* show_batch for text as a figure (cf_plot_show_batch_text): the PNG has the size asked for,
 * or the table's height; each shown row of the batch is a band of the striped table with text
 * drawn in its text column and in its label column (category, or a language model's text_);
 * below the table a fixed-height figure is blank; texts are cut at 150 tokens by default;
 * UTF-8 texts draw; bad arguments are refused; a build without PLplot says so. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/data.h"
#include "corefit/plot.h"

typedef struct text_fixture {
    cf_text_raw *raw;
    cf_text_numericalizer *nz;
    cf_dls *dls;
    const cf_batch *b;
} text_fixture;

/* n_docs validation texts of words_per_doc words each (some of them accented or East Asian),
 * and as many training texts, as a CSV with an is_valid column; the first validation batch. */
static void make_texts(text_fixture *fx, int n_docs, int words_per_doc, bool lm) {
    static const char *words[] = {"alpha", "Beta",    "gamma", "café",       "naïve", "日本語",
                                  "delta", "epsilon", "zeta",  "\"quoted\"", "#hash", "<br />"};
    const int n_words = (int)(sizeof words / sizeof words[0]);
    size_t cap = (size_t)2 * n_docs * (words_per_doc * 12 + 32) + 64, len = 0;
    char *csv = malloc(cap);
    len += (size_t)snprintf(csv + len, cap - len, "text,label,is_valid\n");
    for (int d = 0; d < 2 * n_docs; d++) {
        len += (size_t)snprintf(csv + len, cap - len, "\"");
        for (int w = 0; w < words_per_doc; w++) {
            const char *word = words[(d * 7 + w * 3) % n_words];
            /* CSV doubles the quotes inside a quoted field */
            len += (size_t)snprintf(csv + len, cap - len, "%s", w ? " " : "");
            for (const char *c = word; *c; c++) {
                if (*c == '"') csv[len++] = '"';
                csv[len++] = *c;
            }
        }
        len += (size_t)snprintf(csv + len, cap - len, "\",%s,%s\n", d % 2 ? "pos" : "neg",
                                d < n_docs ? "true" : "false");
    }
    assert_true(len < cap);
    memset(fx, 0, sizeof *fx);
    const char *labels[1] = {"label"};
    cf_text_csv_options co = {
        .text_col = "text", .label_cols = labels, .n_label_cols = 1, .valid_col = "is_valid"};
    assert_int_equal(cf_text_read_csv_buffer(csv, len, "texts.csv", &co, &fx->raw), CF_OK);
    free(csv);
    assert_int_equal(
        cf_text_numericalizer_new(NULL, &(cf_text_vocab_options){.min_freq = 1}, NULL, &fx->nz),
        CF_OK);
    cf_text_dls_options o = {.bs = n_docs, .seq_len = lm ? 16 : 72, .is_lm = lm};
    assert_int_equal(cf_text_dls_from_raw(fx->raw, fx->nz, &o, &fx->dls), CF_OK);
    assert_int_equal(cf_dataloader_begin_epoch(fx->dls->valid, 0), CF_OK);
    assert_int_equal(cf_dataloader_next(fx->dls->valid, &fx->b), CF_OK);
}

static void free_texts(text_fixture *fx) {
    cf_dls_free(fx->dls);
    cf_text_numericalizer_free(fx->nz);
    cf_text_raw_free(fx->raw);
}

/* A numericalizer that names two of the vocabulary's words as a line break and a tab: raw
 * ("\n", "\t", as fastai's tokenizer keeps them) or as the two characters a reader sees
 * ("\\n", "\\t"). */
typedef struct break_nz {
    const cf_text_numericalizer *inner;
    int32_t brk_id, tab_id;
    bool raw;
} break_nz;

static const char *break_token(void *ctx, int32_t id) {
    const break_nz *z = ctx;
    if (id == z->brk_id) return z->raw ? "\n" : "\\n";
    if (id == z->tab_id) return z->raw ? "\t" : "\\t";
    return z->inner->token(z->inner->ctx, id);
}

/* The first two distinct words (not special tokens) of the batch's first row. */
static void two_words(const cf_text_numericalizer *nz, const cf_batch *b, int32_t id[2]) {
    int n = 0;
    for (int t = 0; t < b->x.shape.dim[1] && n < 2; t++) {
        int32_t w = (int32_t)b->x.data[t];
        if (strncmp(nz->token(nz->ctx, w), "xx", 2) != 0 && (n == 0 || w != id[0])) id[n++] = w;
    }
    assert_int_equal(n, 2);
}

static cf_text_numericalizer break_numericalizer(break_nz *z, const cf_text_numericalizer *inner,
                                                 const cf_batch *b, bool raw) {
    int32_t id[2];
    two_words(inner, b, id);
    *z = (break_nz){.inner = inner, .brk_id = id[0], .tab_id = id[1], .raw = raw};
    return (cf_text_numericalizer){.ctx = z, .token = break_token, .vocab_size = inner->vocab_size};
}

/* The terminal's show_batch writes line-break and tab tokens as \n and \t: one line a row,
 * text and category apart by the one tab, the same text as the escaped words give. */
static void test_terminal_escapes_breaks(void **state) {
    (void)state;
    text_fixture fx;
    make_texts(&fx, 4, 30, false);
    char *out[2] = {NULL, NULL};
    for (int raw = 0; raw < 2; raw++) {
        break_nz z;
        cf_text_numericalizer nz = break_numericalizer(&z, fx.nz, fx.b, raw);
        size_t size = 0;
        FILE *f = open_memstream(&out[raw], &size);
        assert_int_equal(cf_text_show_batch(fx.dls->valid, fx.b, &nz, 3, 0, f), CF_OK);
        fclose(f);
    }
    assert_string_equal(out[1], out[0]);
    assert_non_null(strstr(out[1], "\\n"));
    assert_non_null(strstr(out[1], "\\t"));
    int lines = 0, tabs = 0;
    for (const char *c = out[1]; *c; c++) {
        lines += *c == '\n';
        tabs += *c == '\t';
    }
    assert_int_equal(lines, 4); /* the header and 3 rows */
    assert_int_equal(tabs, 4);  /* one between text and category on each */
    free(out[0]);
    free(out[1]);
    free_texts(&fx);
}

#if defined(CF_HAVE_PLPLOT)

static char dir[256];

static const char *path_in(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static int luminance(const unsigned char *p) {
    return (p[0] * 299 + p[1] * 587 + p[2] * 114) / 1000;
}

typedef struct band {
    int y0, y1; /* [y0, y1) */
} band;

/* The table's rows as bands of pixel rows: the striped rows (0, 2, 4, ...) are the runs of
 * light grey down a column near the left edge; the rows between them (1, 3, ...) lie between
 * two grey runs. Returns the number of row bands found (at most max). */
static int find_row_bands(const unsigned char *px, int w, int h, band *out, int max) {
    const int x = w / 40;
    band grey[32];
    int n_grey = 0;
    for (int y = 0; y < h && n_grey < 32;) {
        int l = luminance(px + 3 * ((int64_t)y * w + x));
        if (l >= 240 && l <= 250) {
            int y0 = y;
            while (y < h && luminance(px + 3 * ((int64_t)y * w + x)) >= 240 &&
                   luminance(px + 3 * ((int64_t)y * w + x)) <= 250)
                y++;
            if (y - y0 >= 4) grey[n_grey++] = (band){y0, y};
        } else {
            y++;
        }
    }
    int n = 0;
    for (int i = 0; i < n_grey && n < max; i++) {
        out[n++] = grey[i];
        if (i + 1 < n_grey && n < max) out[n++] = (band){grey[i].y1 + 2, grey[i + 1].y0 - 2};
    }
    return n;
}

/* Dark (text) pixels in rows [y0, y1) and columns [x0, x1). */
static int64_t dark_pixels(const unsigned char *px, int w, int y0, int y1, int x0, int x1) {
    int64_t n = 0;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) n += luminance(px + 3 * ((int64_t)y * w + x)) < 110;
    return n;
}

/* Pixels that are not white in rows [y0, y1). */
static int64_t ink_pixels(const unsigned char *px, int w, int y0, int y1) {
    int64_t n = 0;
    for (int64_t i = (int64_t)y0 * w; i < (int64_t)y1 * w; i++) n += luminance(px + 3 * i) < 250;
    return n;
}

static void png_size(const char *path, int *w, int *h) {
    free(test_png_load_rgb(path, w, h));
}

/* A classifier's batch of 5 texts in an 800 x 700 figure: five striped row bands under the
 * header, each with text in the text column and its category at the right, blank below. */
static void test_classifier_table(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    text_fixture fx;
    make_texts(&fx, 5, 30, false);
    assert_int_equal(fx.b->size, 5);
    cf_show_text_opts o = {.width = 800, .height = 700};
    assert_int_equal(cf_plot_show_batch_text(fx.dls->valid, fx.b, fx.nz, path_in("clas.png"), &o),
                     CF_OK);
    int w, h;
    unsigned char *px = test_png_load_rgb(path_in("clas.png"), &w, &h);
    assert_int_equal(w, 800);
    assert_int_equal(h, 700);
    band rows[16];
    int n = find_row_bands(px, w, h, rows, 16);
    assert_int_equal(n, 5);
    for (int r = 0; r < n; r++) {
        int64_t text = dark_pixels(px, w, rows[r].y0, rows[r].y1, w / 10, w * 6 / 10);
        int64_t label = dark_pixels(px, w, rows[r].y0, rows[r].y1, w * 84 / 100, w);
        if (text < 100 || label < 10)
            fail_msg("row %d (y %d..%d): %lld dark pixels of text, %lld of its category", r,
                     rows[r].y0, rows[r].y1, (long long)text, (long long)label);
    }
    /* the header above the first row holds "text" and "category" */
    assert_true(dark_pixels(px, w, 0, rows[0].y0, w / 10, w * 6 / 10) > 10);
    assert_true(dark_pixels(px, w, 0, rows[0].y0, w * 8 / 10, w) > 10);
    /* nothing below the last row but its rule */
    assert_true(rows[n - 1].y1 + 8 < h);
    assert_int_equal(ink_pixels(px, w, rows[n - 1].y1 + 4, h), 0);
    free(px);
    free_texts(&fx);
}

/* A language model's batch: both text and text_ are drawn in every row. */
static void test_language_model_table(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    text_fixture fx;
    make_texts(&fx, 3, 40, true);
    assert_true(fx.b->size >= 3);
    cf_show_text_opts o = {.width = 700, .height = 500, .max_rows = 3};
    assert_int_equal(cf_plot_show_batch_text(fx.dls->valid, fx.b, fx.nz, path_in("lm.png"), &o),
                     CF_OK);
    int w, h;
    unsigned char *px = test_png_load_rgb(path_in("lm.png"), &w, &h);
    assert_int_equal(w, 700);
    assert_int_equal(h, 500);
    band rows[16];
    int n = find_row_bands(px, w, h, rows, 16);
    assert_int_equal(n, 3);
    for (int r = 0; r < n; r++) {
        assert_true(dark_pixels(px, w, rows[r].y0, rows[r].y1, w / 10, w / 2 - 10) > 100);
        assert_true(dark_pixels(px, w, rows[r].y0, rows[r].y1, w / 2 + 40, w) > 100);
    }
    assert_int_equal(ink_pixels(px, w, rows[n - 1].y1 + 4, h), 0);
    free(px);
    free_texts(&fx);
}

/* Without a height the figure is as tall as the table: texts of 400 tokens are cut at 150 by
 * default (the same height as max_tokens 150, less than max_tokens 400), and fewer rows or
 * tokens make a shorter figure. */
static void test_height_follows_table(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    text_fixture fx;
    make_texts(&fx, 4, 400, false);
    int w, h_default, h_150, h_400, h_rows;
    const cf_dataloader *dl = fx.dls->valid;
    assert_int_equal(cf_plot_show_batch_text(dl, fx.b, fx.nz, path_in("d.png"), NULL), CF_OK);
    png_size(path_in("d.png"), &w, &h_default);
    assert_int_equal(w, 800); /* cf_plot_set_size's width */
    assert_int_equal(cf_plot_show_batch_text(dl, fx.b, fx.nz, path_in("t150.png"),
                                             &(cf_show_text_opts){.max_tokens = 150}),
                     CF_OK);
    png_size(path_in("t150.png"), &w, &h_150);
    assert_int_equal(cf_plot_show_batch_text(dl, fx.b, fx.nz, path_in("t400.png"),
                                             &(cf_show_text_opts){.max_tokens = 400}),
                     CF_OK);
    png_size(path_in("t400.png"), &w, &h_400);
    assert_int_equal(cf_plot_show_batch_text(dl, fx.b, fx.nz, path_in("r2.png"),
                                             &(cf_show_text_opts){.max_rows = 2, .width = 600}),
                     CF_OK);
    png_size(path_in("r2.png"), &w, &h_rows);
    assert_int_equal(w, 600);
    assert_int_equal(h_default, h_150);
    assert_true(h_400 > h_150 * 2); /* 400 tokens wrap to more than twice the lines */
    assert_true(h_rows < h_default);
    free_texts(&fx);
}

/* The figure draws line-break and tab tokens as \n and \t: the same pixels as the escaped
 * words (drawn raw, they vanished). */
static void test_figure_escapes_breaks(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    text_fixture fx;
    make_texts(&fx, 4, 30, false);
    const char *names[2] = {"escaped.png", "raw.png"};
    unsigned char *px[2];
    int w[2], h[2];
    for (int raw = 0; raw < 2; raw++) {
        break_nz z;
        cf_text_numericalizer nz = break_numericalizer(&z, fx.nz, fx.b, raw);
        assert_int_equal(cf_plot_show_batch_text(fx.dls->valid, fx.b, &nz, path_in(names[raw]),
                                                 &(cf_show_text_opts){.width = 700}),
                         CF_OK);
        px[raw] = test_png_load_rgb(path_in(names[raw]), &w[raw], &h[raw]);
    }
    assert_int_equal(w[0], w[1]);
    assert_int_equal(h[0], h[1]);
    assert_memory_equal(px[0], px[1], (size_t)3 * w[0] * h[0]);
    free(px[0]);
    free(px[1]);
    free_texts(&fx);
}

static void test_bad_arguments(void **state) {
    (void)state;
    text_fixture fx;
    make_texts(&fx, 2, 5, false);
    const cf_dataloader *dl = fx.dls->valid;
    assert_int_equal(cf_plot_show_batch_text(dl, fx.b, NULL, path_in("x.png"), NULL),
                     CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "numericalizer"));
    assert_int_equal(cf_plot_show_batch_text(dl, fx.b, fx.nz, path_in("x.png"),
                                             &(cf_show_text_opts){.width = 20}),
                     CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "20x0"));
    cf_batch flat = *fx.b;
    flat.x.shape = cf_shape1(fx.b->x.shape.dim[0] * fx.b->x.shape.dim[1]);
    assert_int_equal(cf_plot_show_batch_text(dl, &flat, fx.nz, path_in("x.png"), NULL),
                     CF_ERR_INVALID);
    free_texts(&fx);
}

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(dir, sizeof dir, "cf-show-text-");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(dir);
}

#else

/* Without PLplot the figure is refused with a message that says what is missing. */
static void test_without_plplot(void **state) {
    (void)state;
    text_fixture fx;
    make_texts(&fx, 2, 5, false);
    assert_int_equal(cf_plot_show_batch_text(fx.dls->valid, fx.b, fx.nz, "x.png", NULL),
                     CF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cf_last_error(), "PLplot"));
    free_texts(&fx);
}

#endif

int main(void) {
    const struct CMUnitTest tests[] = {
#if defined(CF_HAVE_PLPLOT)
        cmocka_unit_test(test_classifier_table),
        cmocka_unit_test(test_language_model_table),
        cmocka_unit_test(test_height_follows_table),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_figure_escapes_breaks),
        cmocka_unit_test(test_terminal_escapes_breaks),
#else
        cmocka_unit_test(test_without_plplot),
        cmocka_unit_test(test_terminal_escapes_breaks),
#endif
    };
#if defined(CF_HAVE_PLPLOT)
    return cmocka_run_group_tests(tests, setup, teardown);
#else
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
