/* show_batch for text as a figure: fastai's table of a batch (row number, text, and the
 * category or, for a language model, the shifted target text_) with each cell's tokens wrapped
 * to its column.
 *
 * The layout is made in pixels before PLplot starts, because the figure's height follows from
 * it: a character height in pixels, each character's advance estimated (the cairo driver gives
 * no string measurement through PLplot's API) from DejaVu Sans' widths for ASCII, over an em for
 * East Asian wide characters and none for combining marks (libutf8proc's character widths),
 * greedy wrapping at spaces and, for a word wider than its column, between code
 * points. Text goes to PLplot as UTF-8, which the cairo driver draws through Pango. */
#include "corefit/plot.h"

#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include "core/strbuf.h"
#include "figure.h"

enum { TEXT_COLS = 3 };

static const double k_char_px = 11.0;   /* character height at 800 pixels wide */
static const double k_em = 1.38;        /* the font's em in PLplot character heights (measured) */
static const double k_line = 1.75;      /* line pitch, in character heights */
static const double k_pad = 0.6;        /* space above and below a row's lines, in heights */
static const double k_min_shrink = 0.6; /* fixed height: characters shrink at most this much */

typedef struct text_cell {
    char *text;   /* the cell as shown, UTF-8 (not yet escaped for PLplot) */
    char **lines; /* wrapped and escaped for PLplot */
    int n_lines;
} text_cell;

typedef struct text_table_fig {
    int width, height; /* pixels */
    int n_rows;        /* data rows; row 0 of cells is the header */
    int n_cols;        /* 2 (no labels) or 3 */
    text_cell *cells;  /* (n_rows + 1) x TEXT_COLS */
    double char_px, line_px, pad_px, margin_px;
    double col_left[TEXT_COLS + 1]; /* the last is the table's right edge */
    double *row_top;                /* n_rows + 2: the top of each row, then the table's bottom */
} text_table_fig;

/* ---- the cells' text ------------------------------------------------------------------------ */

/* The first max_tokens tokens of a row of ids other than xxpad (fastai's decoding drops the
 * padding, the other special tokens stay visible), space-joined, with an ellipsis when cut. */
static char *row_tokens(const float *ids, int n, int max_tokens, const cf_text_numericalizer *nz) {
    cf__strbuf b = {0};
    int shown = 0;
    for (int t = 0; t < n; t++) {
        int32_t id = (int32_t)ids[t];
        if (id == CF_TEXT_PAD) continue;
        if (shown == max_tokens) {
            cf__strbuf_str(&b, " \u2026");
            break;
        }
        const char *tok = nz->token ? nz->token(nz->ctx, id) : NULL;
        char num[24];
        if (!tok) snprintf(num, sizeof num, "<%d>", (int)id);
        if (shown) cf__strbuf_str(&b, " ");
        /* line breaks and tabs are tokens of their own; drawn raw they would vanish (the
         * wrapper reads control characters as spaces), so they are written \n and \t */
        for (const char *ch = tok ? tok : num; *ch; ch++)
            if (*ch == '\n')
                cf__strbuf_str(&b, "\\n");
            else if (*ch == '\t')
                cf__strbuf_str(&b, "\\t");
            else if (*ch == '\r')
                cf__strbuf_str(&b, "\\r");
            else
                cf__strbuf_put(&b, ch, 1);
        shown++;
    }
    return cf__strbuf_take(&b);
}

/* Row i's category: the class name, or the classes of a multi-hot target joined with ';'. */
static char *row_category(const cf_text_corpus *c, const cf_batch *b, int i) {
    cf__strbuf s = {0};
    if (c->target_dim == 1) {
        int k = (int)b->y.data[i];
        cf__strbuf_str(&s, k >= 0 && k < c->n_classes && c->classes ? c->classes[k] : "?");
    } else {
        for (int k = 0, m = 0; k < c->target_dim && k < c->n_classes; k++)
            if (b->y.data[(size_t)i * c->target_dim + k] > 0.5f) {
                if (m++) cf__strbuf_str(&s, ";");
                cf__strbuf_str(&s, c->classes[k]);
            }
    }
    return cf__strbuf_take(&s);
}

/* ---- wrapping ------------------------------------------------------------------------------- */

/* Advance widths of printable ASCII (' ' .. '~') in em, DejaVu Sans' (the sans font Debian's
 * cairo driver draws with), so that narrow and wide letters wrap where they end. */
static const unsigned char k_ascii_em100[95] = {
    32,  40, 46, 84, 64, 95, 78, 28, 39, 39, 50, 84, 32, 36, 32, 34, /*  !"#$%&'()*+,-./ */
    64,  64, 64, 64, 64, 64, 64, 64, 64, 64, 34, 34, 84, 84, 84, 53, /* 0-9 :;<=>? */
    100, 68, 69, 70, 77, 63, 58, 78, 75, 29, 29, 66, 56, 86, 75, 79, /* @A-O */
    60,  79, 70, 64, 61, 73, 68, 99, 69, 61, 69, 39, 34, 39, 84, 50, /* P-Z [\]^_ */
    50,  61, 64, 55, 64, 62, 35, 64, 63, 28, 28, 58, 28, 97, 63, 61, /* `a-o */
    64,  64, 41, 52, 39, 63, 59, 82, 59, 59, 53, 64, 34, 64, 84};    /* p-z {|}~ */

/* The advance of code point cp in em: ASCII from the table, a combining mark none, anything
 * else a broad letter's width; an East Asian wide character a little over one em, the width of
 * the box drawn where no installed font has the glyph. */
static double cp_em(utf8proc_int32_t cp, int cells) {
    if (cp >= ' ' && cp <= '~') return k_ascii_em100[cp - ' '] / 100.0;
    return cells == 2 ? 1.35 : cells == 0 ? 0.0 : 0.7;
}

/* The next code point of s (advancing *pos), U+FFFD for bytes that are not UTF-8 and a space
 * for control characters; *cells is its width in character cells (0, 1 or 2). */
static utf8proc_int32_t next_cp_cells(const char *s, size_t *pos, int *cells) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s + *pos, -1, &cp);
    if (n <= 0) {
        cp = 0xFFFD;
        n = 1;
    }
    *pos += (size_t)n;
    if (cp < 0x20 || cp == 0x7F) cp = ' ';
    *cells = utf8proc_charwidth(cp);
    if (*cells < 0) *cells = 1;
    return cp;
}

/* The next code point of s and its advance in em (*em). */
static utf8proc_int32_t next_cp(const char *s, size_t *pos, double *em) {
    int cells = 1;
    utf8proc_int32_t cp = next_cp_cells(s, pos, &cells);
    *em = cp_em(cp, cells);
    return cp;
}

typedef struct wrapper {
    text_cell *cell;
    cf__strbuf line;
    double line_em, max_em;
    bool failed;
} wrapper;

static void wrap_flush(wrapper *w) {
    if (w->line.failed) w->failed = true;
    if (w->failed) return;
    /* a cell holds a few dozen lines at most: the array is simply copied as it grows */
    char **lines = cf_malloc(sizeof(char *) * (size_t)(w->cell->n_lines + 1));
    if (!lines) {
        w->failed = true;
        return;
    }
    if (w->cell->n_lines) memcpy(lines, w->cell->lines, sizeof(char *) * (size_t)w->cell->n_lines);
    cf_free(w->cell->lines);
    w->cell->lines = lines;
    lines[w->cell->n_lines++] = cf__strbuf_take(&w->line); /* "" for an empty line */
    if (!lines[w->cell->n_lines - 1]) w->failed = true;
    w->line_em = 0;
}

/* Appends code point cp to the line, escaped for PLplot ('#' is its escape character). */
static void wrap_put_cp(wrapper *w, utf8proc_int32_t cp, double em) {
    utf8proc_uint8_t enc[4];
    utf8proc_ssize_t n = utf8proc_encode_char(cp, enc);
    if (cp == '#') cf__strbuf_put(&w->line, "#", 1);
    cf__strbuf_put(&w->line, (const char *)enc, (size_t)n);
    w->line_em += em;
}

/* Greedy wrapping of the cell's text into lines at most max_em wide. */
static cf_status wrap_cell(text_cell *cell, double max_em) {
    for (int i = 0; i < cell->n_lines; i++) cf_free(cell->lines[i]);
    cf_free(cell->lines);
    cell->lines = NULL;
    cell->n_lines = 0;
    if (max_em < 1) max_em = 1; /* at least a character a line */
    wrapper w = {.cell = cell, .max_em = max_em};
    const char *s = cell->text;
    size_t pos = 0, len = strlen(s);
    while (pos < len && !w.failed) {
        double cells;
        size_t start = pos;
        if (next_cp(s, &pos, &cells) == ' ') continue;
        /* one word: [start, end) */
        size_t end = pos;
        double word_em = cells;
        while (end < len) {
            size_t p = end;
            double c;
            if (next_cp(s, &p, &c) == ' ') break;
            word_em += c;
            end = p;
        }
        const double space = cp_em(' ', 1);
        if (w.line_em > 0 && w.line_em + space + word_em > max_em) wrap_flush(&w);
        if (w.line_em > 0) wrap_put_cp(&w, ' ', space);
        for (size_t p = start; p < end && !w.failed;) {
            double c;
            utf8proc_int32_t cp = next_cp(s, &p, &c);
            /* a word wider than the column breaks between code points */
            if (w.line_em > 0 && w.line_em + c > max_em) wrap_flush(&w);
            wrap_put_cp(&w, cp, c);
        }
        pos = end;
    }
    if (!w.failed && (w.line_em > 0 || cell->n_lines == 0)) wrap_flush(&w);
    cf__strbuf_free(&w.line);
    return w.failed ? cf_fail(CF_ERR_NOMEM, "show_batch (text): wrapping") : CF_OK;
}

/* The width of a text in em, unwrapped. */
static double text_em(const char *s) {
    double n = 0;
    for (size_t pos = 0, len = strlen(s); pos < len;) {
        double c;
        next_cp(s, &pos, &c);
        n += c;
    }
    return n;
}

/* ---- layout and drawing --------------------------------------------------------------------- */

/* Columns and rows at character height char_px; returns the table's height in pixels. */
static cf_status layout(text_table_fig *f, double char_px, double *table_height) {
    f->char_px = char_px;
    f->line_px = k_line * char_px;
    f->pad_px = k_pad * char_px;
    f->margin_px = 1.2 * char_px;
    const double adv = k_em * char_px, cell_pad = 0.8 * char_px;
    const double inner = f->width - 2 * f->margin_px;
    /* the row-number column fits its widest number; the rest is shared: a language model's two
     * texts equally, a classifier's category as wide as its widest label up to a third */
    double idx_w = (text_em(f->cells[f->n_rows * TEXT_COLS].text) + 1) * adv + 2 * cell_pad;
    double label_w = 0;
    if (f->n_cols == 3) {
        bool lm = strcmp(f->cells[2].text, "text_") == 0;
        if (lm) {
            label_w = (inner - idx_w) / 2;
        } else {
            double widest = 0;
            for (int r = 0; r <= f->n_rows; r++) {
                double c = text_em(f->cells[r * TEXT_COLS + 2].text);
                if (c > widest) widest = c;
            }
            label_w = (widest + 1) * adv + 2 * cell_pad;
            if (label_w > inner / 3) label_w = inner / 3;
        }
    }
    f->col_left[0] = f->margin_px;
    f->col_left[1] = f->col_left[0] + idx_w;
    f->col_left[2] = f->margin_px + inner - label_w;
    f->col_left[3] = f->margin_px + inner;
    double y = f->margin_px;
    for (int r = 0; r <= f->n_rows; r++) {
        int lines = 1;
        for (int c = 0; c < f->n_cols; c++) {
            text_cell *cell = &f->cells[r * TEXT_COLS + c];
            double w = f->col_left[c + 1] - f->col_left[c] - 2 * cell_pad;
            cf_status st = wrap_cell(cell, w / adv);
            if (st != CF_OK) return st;
            if (cell->n_lines > lines) lines = cell->n_lines;
        }
        f->row_top[r] = y;
        y += lines * f->line_px + 2 * f->pad_px;
    }
    f->row_top[f->n_rows + 1] = y;
    *table_height = y + f->margin_px;
    return CF_OK;
}

static void fill_rect(double x0, double x1, double y0, double y1, int height) {
    PLFLT xs[4] = {x0, x1, x1, x0}, ys[4] = {height - y0, height - y0, height - y1, height - y1};
    plfill(4, xs, ys);
}

static void hline(double x0, double x1, double y, int height) {
    PLFLT xs[2] = {x0, x1}, ys[2] = {height - y, height - y};
    plline(2, xs, ys);
}

static void draw_text_table(void *ctx) {
    text_table_fig *f = ctx;
    const int H = f->height;
    pladv(0);
    plvpor(0, 1, 0, 1);
    plwind(0, f->width, 0, H);
    /* the character height in PLplot's millimetres from the pixels the layout used */
    PLFLT x0, x1, y0, y1, def, ht;
    plgspa(&x0, &x1, &y0, &y1);
    plgchr(&def, &ht);
    const double px_per_mm = f->width / (x1 - x0);
    plschr(0, f->char_px / px_per_mm / def);
    const double cell_pad = 0.8 * f->char_px;
    const double left = f->col_left[0], right = f->col_left[3];
    /* pandas' striped rows: every other data row on light grey */
    plscol0(CF_COL_SCRATCH, 245, 245, 245);
    for (int r = 1; r <= f->n_rows; r += 2) {
        plcol0(CF_COL_SCRATCH);
        fill_rect(left, right, f->row_top[r], f->row_top[r + 1], H);
    }
    for (int r = 0; r <= f->n_rows; r++) {
        double top = f->row_top[r], bottom = f->row_top[r + 1];
        if (top >= H) break;
        for (int c = 0; c < f->n_cols; c++) {
            text_cell *cell = &f->cells[r * TEXT_COLS + c];
            /* the row number right-aligned, headers and texts left-aligned */
            double just = c == 0 ? 1.0 : 0.0;
            double x = c == 0 ? f->col_left[1] - cell_pad : f->col_left[c] + cell_pad;
            plcol0(CF_COL_FG);
            for (int l = 0; l < cell->n_lines; l++) {
                double mid = top + f->pad_px + (l + 0.5) * f->line_px;
                if (mid + 0.5 * f->char_px > H) break; /* a fixed height cut the table */
                plptex(x, H - mid, 1, 0, just, cell->lines[l]);
            }
        }
        /* a dark rule under the header, light ones between rows */
        plwidth(r == 0 ? 1.5 : 1.0);
        plcol0(r == 0 ? CF_COL_FG : CF_COL_GRID);
        if (bottom <= H) hline(left, right, bottom, H);
    }
    plwidth(1.0);
    plschr(0, 1.0);
}

static void free_cells(text_table_fig *f) {
    if (!f->cells) return;
    for (int i = 0; i < (f->n_rows + 1) * TEXT_COLS; i++) {
        cf_free(f->cells[i].text);
        for (int l = 0; l < f->cells[i].n_lines; l++) cf_free(f->cells[i].lines[l]);
        cf_free(f->cells[i].lines);
    }
    cf_free(f->cells);
    cf_free(f->row_top);
}

cf_status cf_plot_show_batch_text(const cf_dataloader *dl, const cf_batch *b,
                                  const cf_text_numericalizer *nz, const char *png_path,
                                  const cf_show_text_opts *opts) {
    const char *what = "show_batch (text)";
    const cf_text_corpus *c = dl ? cf_text_loader_corpus(dl) : NULL;
    if (!c || !b || !nz)
        return cf_fail(CF_ERR_INVALID,
                       "%s: a text loader, one of its batches and its numericalizer are needed",
                       what);
    if (!b->x.data || b->x.shape.ndim != 2 || b->size < 1 || b->x.shape.dim[0] < b->size) {
        char buf[64];
        return cf_fail(CF_ERR_INVALID, "%s: the batch %s must hold token ids (B, seq_len)", what,
                       b->x.data ? cf_shape_str(&b->x.shape, buf, sizeof buf) : "(none)");
    }
    cf_show_text_opts o = opts ? *opts : (cf_show_text_opts){0};
    if (o.max_rows < 0 || o.max_tokens < 0 || o.width < 0 || o.height < 0)
        return cf_fail(CF_ERR_INVALID,
                       "%s: max_rows %d, max_tokens %d, width %d, height %d: none may be "
                       "negative",
                       what, o.max_rows, o.max_tokens, o.width, o.height);
    if ((o.width && (o.width < 64 || o.width > 8192)) ||
        (o.height && (o.height < 64 || o.height > 8192)))
        return cf_fail(CF_ERR_INVALID, "%s: size %dx%d: each side given must be in [64, 8192]",
                       what, o.width, o.height);
    if (!o.max_rows) o.max_rows = 9;
    if (!o.max_tokens) o.max_tokens = 150;
    const bool lm = cf_text_loader_is_lm(dl);
    const int T = b->x.shape.dim[1];
    if (lm && (!b->y.data || cf_tensor_numel(&b->y) != cf_tensor_numel(&b->x)))
        return cf_fail(CF_ERR_INVALID, "%s: a language model's batch needs targets shaped as x",
                       what);
    const bool labels = lm || (c->target_dim > 0 && b->y.data &&
                               (int64_t)cf_tensor_numel(&b->y) >= (int64_t)b->size * c->target_dim);

    text_table_fig f = {.n_rows = b->size < o.max_rows ? b->size : o.max_rows,
                        .n_cols = labels ? 3 : 2};
    int set_w, set_h;
    cf_plot__figure_size(&set_w, &set_h);
    f.width = o.width ? o.width : set_w;
    f.cells = cf_calloc((size_t)(f.n_rows + 1) * TEXT_COLS, sizeof(text_cell));
    f.row_top = cf_calloc((size_t)f.n_rows + 2, sizeof(double));
    cf_status st = f.cells && f.row_top ? CF_OK : cf_fail(CF_ERR_NOMEM, "%s", what);
    if (st == CF_OK) {
        f.cells[0].text = cf_strdup("");
        f.cells[1].text = cf_strdup("text");
        f.cells[2].text = cf_strdup(labels ? (lm ? "text_" : "category") : "");
        for (int i = 0; i < f.n_rows; i++) {
            text_cell *row = &f.cells[(i + 1) * TEXT_COLS];
            char num[16];
            snprintf(num, sizeof num, "%d", i);
            row[0].text = cf_strdup(num);
            row[1].text = row_tokens(b->x.data + (size_t)i * T, T, o.max_tokens, nz);
            row[2].text = !labels ? cf_strdup("")
                          : lm    ? row_tokens(b->y.data + (size_t)i * T, T, o.max_tokens, nz)
                                  : row_category(c, b, i);
        }
        for (int i = 0; i < (f.n_rows + 1) * TEXT_COLS && st == CF_OK; i++)
            if (!f.cells[i].text) st = cf_fail(CF_ERR_NOMEM, "%s", what);
    }
    /* characters scale with the width; a fixed height shrinks them (down to k_min_shrink) to
     * hold the table, and cuts what still does not fit */
    const double base_px = k_char_px * f.width / 800.0;
    double table_h = 0;
    if (st == CF_OK) st = layout(&f, base_px, &table_h);
    if (o.height) {
        for (double s = 0.9; st == CF_OK && table_h > o.height && s >= k_min_shrink - 1e-9;
             s -= 0.1)
            st = layout(&f, base_px * s, &table_h);
        f.height = o.height;
    } else {
        f.height = (int)(table_h + 0.5);
        if (f.height < 64) f.height = 64;
        if (f.height > 8192) f.height = 8192;
    }
    if (st == CF_OK)
        st = cf_plot__run_figure(what, png_path, f.width, f.height, draw_text_table, &f);
    free_cells(&f);
    return st;
}
