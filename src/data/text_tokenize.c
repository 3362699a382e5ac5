/* fastai's text rules and the spaCy-style word splitter (reference/fastai-text.md section 1).
 *
 * The text is decoded to code points once; each rule maps one code-point buffer to the next,
 * with Python's `re` semantics for fastai's regular expressions (tests/text_oracle.py holds the
 * same rules in Python and is the test oracle). Character classes and case mapping come from
 * libutf8proc, HTML entity names from libxml2 (loaded when first needed, below). */
#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <errno.h>
#include <iconv.h>
#include <libxml/HTMLparser.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "data/text_internal.h"

const char *const cf_text_special_tokens[CF_TEXT_N_SPECIAL] = {
    "xxunk", "xxpad", "xxbos", "xxeos", "xxfld", "xxrep", "xxwrep", "xxup", "xxmaj"};
const char *const cf_text_rule_names[CF_TEXT_N_RULES] = {
    "fix_html",          "replace_rep",      "replace_wrep", "spec_add_spaces",
    "rm_useless_spaces", "replace_all_caps", "replace_maj",  "lowercase"};

/* ---- code-point buffers ---------------------------------------------------------------- */

typedef struct cps {
    int32_t *p;
    int64_t n, cap;
} cps;

static bool cps_reserve(cps *b, int64_t extra) {
    if (b->n + extra <= b->cap) return true;
    int64_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    int32_t *p = realloc(b->p, (size_t)cap * sizeof *p);
    if (!p) {
        cf_fail(CF_ERR_NOMEM, "text: out of memory for %lld code points", (long long)cap);
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static inline bool cps_push(cps *b, int32_t c) {
    if (b->n == b->cap && !cps_reserve(b, 1)) return false;
    b->p[b->n++] = c;
    return true;
}

static bool cps_push_n(cps *b, const int32_t *c, int64_t n) {
    if (!cps_reserve(b, n)) return false;
    memcpy(b->p + b->n, c, (size_t)n * sizeof *c);
    b->n += n;
    return true;
}

static bool cps_push_ascii(cps *b, const char *s) {
    size_t n = strlen(s);
    if (!cps_reserve(b, (int64_t)n)) return false;
    for (size_t i = 0; i < n; i++) b->p[b->n++] = (unsigned char)s[i];
    return true;
}

static bool cps_push_int(cps *b, int64_t v) {
    char num[24];
    snprintf(num, sizeof num, "%lld", (long long)v);
    return cps_push_ascii(b, num);
}

static void cps_swap(cps *a, cps *b) {
    cps t = *a;
    *a = *b;
    *b = t;
}

/* ---- character classes with Python's semantics ----------------------------------------- */

/* str.isspace: category Zs or bidirectional class WS, B or S. */
static inline bool is_space(int32_t c) {
    if (c < 128) return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f);
    const utf8proc_property_t *p = utf8proc_get_property(c);
    return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

static inline bool category_is_letter(int cat) {
    return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
static inline bool category_is_number(int cat) {
    return cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO;
}

/* re's \w for str patterns: letters, numbers and '_'. */
static inline bool is_word(int32_t c) {
    if (c < 128)
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_';
    int cat = utf8proc_category(c);
    return category_is_letter(cat) || category_is_number(cat);
}

/* [^\W\d_]: letters and non-decimal numerals. */
static inline bool is_letterish(int32_t c) {
    if (c < 128) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    int cat = utf8proc_category(c);
    return category_is_letter(cat) || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

static inline bool is_ascii_upper(int32_t c) {
    return c >= 'A' && c <= 'Z';
}
static inline bool is_ascii_lower(int32_t c) {
    return c >= 'a' && c <= 'z';
}
static inline bool is_ascii_digit(int32_t c) {
    return c >= '0' && c <= '9';
}

/* Unicode's Cased and Case_Ignorable properties, for the final sigma of str.lower(). */
static bool is_cased(int32_t c) {
    return utf8proc_islower(c) || utf8proc_isupper(c) ||
           utf8proc_category(c) == UTF8PROC_CATEGORY_LT;
}
static bool is_case_ignorable(int32_t c) {
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
        return true;
    default:
        break;
    }
    /* Word_Break MidLetter, MidNumLet and Single_Quote (utf8proc has no word-break data) */
    switch (c) {
    case '\'':
    case '.':
    case ':':
    case 0xb7:
    case 0x387:
    case 0x5f4:
    case 0x2018:
    case 0x2019:
    case 0x2024:
    case 0x2027:
    case 0xfe13:
    case 0xfe52:
    case 0xfe55:
    case 0xff07:
    case 0xff0e:
    case 0xff1a:
        return true;
    default:
        return false;
    }
}

/* Appends str.lower() of a[begin, end), the context of a final sigma being that range. */
static bool lower_range(cps *out, const int32_t *a, int64_t begin, int64_t end) {
    if (!cps_reserve(out, 2 * (end - begin))) return false;
    for (int64_t i = begin; i < end; i++) {
        int32_t c = a[i];
        if (c < 128) {
            out->p[out->n++] = is_ascii_upper(c) ? c + 32 : c;
        } else if (c == 0x130) { /* İ: the one unconditional multi-character lowercase */
            out->p[out->n++] = 'i';
            out->p[out->n++] = 0x307;
        } else if (c == 0x3a3) { /* Σ: ς at the end of a word */
            int64_t j = i - 1;
            while (j >= begin && is_case_ignorable(a[j])) j--;
            bool final = j >= begin && is_cased(a[j]);
            if (final) {
                j = i + 1;
                while (j < end && is_case_ignorable(a[j])) j++;
                final = j == end || !is_cased(a[j]);
            }
            out->p[out->n++] = final ? 0x3c2 : 0x3c3;
        } else {
            out->p[out->n++] = utf8proc_tolower(c);
        }
    }
    return true;
}

/* ---- UTF-8 ----------------------------------------------------------------------------- */

static cf_status decode_utf8(const char *text, size_t len, const char *source, bool replace,
                             cps *out) {
    if (!cps_reserve(out, (int64_t)len + 1)) return CF_ERR_NOMEM;
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 128 && s[i] != 0) {
            out->p[out->n++] = s[i++];
            continue;
        }
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0 || c == 0) {
            if (!replace) {
                return cf_fail(CF_ERR_FORMAT,
                               "%s: byte offset %zu: %s (byte 0x%02x); pass replace_invalid to "
                               "replace such bytes with U+FFFD",
                               source ? source : "text", i,
                               s[i] == 0 ? "NUL byte (binary data?)" : "invalid UTF-8", s[i]);
            }
            out->p[out->n++] = 0xfffd;
            i++;
            continue;
        }
        out->p[out->n++] = c;
        i += (size_t)k;
    }
    return CF_OK;
}

/* ---- rule 1: fix_html ------------------------------------------------------------------ */

/* str.replace(from, to) with ASCII `from` (to may be any code points). */
static bool replace_all(cps *out, const cps *in, const char *from, const int32_t *to,
                        int64_t to_n) {
    int64_t fn = (int64_t)strlen(from);
    out->n = 0;
    if (!cps_reserve(out, in->n)) return false;
    for (int64_t i = 0; i < in->n;) {
        if (in->p[i] == (unsigned char)from[0] && i + fn <= in->n) {
            int64_t k = 1;
            while (k < fn && in->p[i + k] == (unsigned char)from[k]) k++;
            if (k == fn) {
                if (!cps_push_n(out, to, to_n)) return false;
                i += fn;
                continue;
            }
        }
        if (!cps_push(out, in->p[i++])) return false;
    }
    return true;
}

/* Python's html._invalid_charrefs: 0x80-0x9f are read as windows-1252 (glibc's iconv does
 * the decoding; the five bytes it leaves undefined keep their value). */
static int32_t windows_1252(int32_t c) {
    iconv_t cd = iconv_open("UTF-32LE", "CP1252");
    if (cd == (iconv_t)-1) return c;
    char in = (char)c;
    unsigned char out[4];
    char *ip = &in, *op = (char *)out;
    size_t il = 1, ol = 4;
    int32_t r = c;
    if (iconv(cd, &ip, &il, &op, &ol) != (size_t)-1 && ol == 0)
        r = (int32_t)(out[0] | out[1] << 8 | out[2] << 16 | (uint32_t)out[3] << 24);
    iconv_close(cd);
    return r;
}

/* libxml2's entity table, loaded the first time an entity name is looked up rather than linked:
 * Debian's libxml2 brings ICU, whose 31 MB data file would be mapped into every corefit process
 * at start-up (a fit under `ulimit -v` that never reads text would pay for it). Without
 * libxml2 (the Debian package libxml2, which libxml2-dev installs) named entities stay as
 * written; numeric references are decoded all the same. */
typedef const htmlEntityDesc *(*entity_lookup_fn)(const xmlChar *name);
static entity_lookup_fn entity_lookup_impl;
static pthread_once_t entity_lookup_once = PTHREAD_ONCE_INIT;

static void load_entity_lookup(void) {
    void *lib = dlopen("libxml2.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib) *(void **)&entity_lookup_impl = dlsym(lib, "htmlEntityLookup");
}

static const htmlEntityDesc *html_entity_lookup(const char *name) {
    pthread_once(&entity_lookup_once, load_entity_lookup);
    return entity_lookup_impl ? entity_lookup_impl((const xmlChar *)name) : NULL;
}

/* html5 entity lookup for an ASCII name: with the semicolon, any HTML 4 name (libxml2's table;
 * the upper-case AMP, COPY, GT, LT, QUOT and REG as their lower-case); without it, only the
 * legacy names HTML5 accepts bare (the Latin-1 ones and amp, lt, gt, quot). -1: none. */
static int32_t entity_value(const int32_t *name, int64_t n, bool semicolon) {
    char buf[40];
    if (n <= 0 || n >= (int64_t)sizeof buf) return -1;
    for (int64_t i = 0; i < n; i++) {
        if (name[i] <= 0 || name[i] >= 128) return -1;
        buf[i] = (char)name[i];
    }
    buf[n] = 0;
    const htmlEntityDesc *e = html_entity_lookup(buf);
    if (!e) {
        static const char *const upper[] = {"AMP", "COPY", "GT", "LT", "QUOT", "REG"};
        for (size_t k = 0; k < sizeof upper / sizeof *upper && !e; k++) {
            if (strcmp(buf, upper[k]) == 0) {
                for (int64_t i = 0; i < n; i++) buf[i] = (char)(buf[i] + 32);
                e = html_entity_lookup(buf);
            }
        }
    }
    if (!e) return -1;
    int32_t v = (int32_t)e->value;
    if (!semicolon && !(v == '"' || v == '&' || v == '<' || v == '>' || (v >= 160 && v <= 255)))
        return -1;
    return v;
}

static bool is_hex(int32_t c) {
    return is_ascii_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* html.unescape. */
static bool html_unescape(cps *out, const cps *in) {
    const int32_t *a = in->p;
    int64_t n = in->n;
    out->n = 0;
    if (!cps_reserve(out, n)) return false;
    for (int64_t i = 0; i < n;) {
        if (a[i] != '&' || i + 1 >= n) {
            if (!cps_push(out, a[i++])) return false;
            continue;
        }
        int64_t j = i + 1;
        if (a[j] == '#') { /* &#[0-9]+;? or &#[xX][0-9a-fA-F]+;? */
            bool hex = j + 1 < n && (a[j + 1] == 'x' || a[j + 1] == 'X');
            int64_t k = j + 1 + hex, d = k;
            uint64_t num = 0;
            while (d < n && (hex ? is_hex(a[d]) : is_ascii_digit(a[d]))) {
                int v = is_ascii_digit(a[d]) ? a[d] - '0' : (a[d] | 32) - 'a' + 10;
                if (num <= 0x10ffff) num = num * (hex ? 16 : 10) + (uint64_t)v;
                d++;
            }
            if (d == k) { /* no digits: '&' stays */
                if (!cps_push(out, a[i++])) return false;
                continue;
            }
            if (d < n && a[d] == ';') d++;
            int32_t c;
            if (num == 0)
                c = 0xfffd;
            else if (num == 0x0d)
                c = '\r';
            else if (num >= 0x80 && num <= 0x9f)
                c = windows_1252((int32_t)num);
            else if ((num >= 0xd800 && num <= 0xdfff) || num > 0x10ffff)
                c = 0xfffd;
            else if ((num >= 1 && num <= 8) || num == 0xb || (num >= 0xe && num <= 0x1f) ||
                     num == 0x7f || (num >= 0xfdd0 && num <= 0xfdef) || (num & 0xfffe) == 0xfffe)
                c = -1; /* Python's _invalid_codepoints: removed */
            else
                c = (int32_t)num;
            if (c >= 0 && !cps_push(out, c)) return false;
            i = d;
            continue;
        }
        /* [^\t\n\f <&#;]{1,32};? */
        int64_t k = j;
        while (k < n && k - j < 32 && a[k] != '\t' && a[k] != '\n' && a[k] != '\f' && a[k] != ' ' &&
               a[k] != '<' && a[k] != '&' && a[k] != '#' && a[k] != ';')
            k++;
        if (k == j) {
            if (!cps_push(out, a[i++])) return false;
            continue;
        }
        bool semi = k < n && a[k] == ';';
        int64_t end = k + semi;
        int32_t v = entity_value(a + j, k - j, semi);
        if (v >= 0) {
            if (!cps_push(out, v)) return false;
            i = end;
            continue;
        }
        /* the longest bare legacy name that is a prefix of s = a[j, end), at least 2 long
         * (Python: for x in range(len(s)-1, 1, -1): if s[:x] in html5) */
        bool done = false;
        for (int64_t x = end - j - 1; x > 1 && !done; x--) {
            int64_t xl = x;
            bool with_semi = false;
            if (j + xl - 1 < end && a[j + xl - 1] == ';') {
                with_semi = true;
                xl--;
            }
            int32_t w = entity_value(a + j, xl, with_semi);
            if (w >= 0) {
                if (!cps_push(out, w) || !cps_push_n(out, a + j + x, end - j - x)) return false;
                done = true;
            }
        }
        if (!done && !cps_push_n(out, a + i, end - i)) return false;
        i = end;
    }
    return true;
}

static bool fix_html(cps *a, cps *b) {
    static const int32_t apos[] = {'\''}, amp[] = {'&'}, space[] = {' '}, dollar[] = {'$'},
                         nl[] = {'\n'}, quote[] = {'"'}, unk[] = {'x', 'x', 'u', 'n', 'k'},
                         dot[] = {'.'}, dash[] = {'-'}, ellipsis[] = {' ', 0x2026};
    static const struct {
        const char *from;
        const int32_t *to;
        int64_t n;
    } steps[] = {{"#39;", apos, 1},   {"amp;", amp, 1},  {"#146;", apos, 1}, {"nbsp;", space, 1},
                 {"#36;", dollar, 1}, {"\\n", nl, 1},    {"quot;", apos, 1}, {"<br />", nl, 1},
                 {"\\\"", quote, 1},  {"<unk>", unk, 5}, {" @.@ ", dot, 1},  {" @-@ ", dash, 1},
                 {"...", ellipsis, 2}};
    for (size_t s = 0; s < sizeof steps / sizeof *steps; s++) {
        if (!replace_all(b, a, steps[s].from, steps[s].to, steps[s].n)) return false;
        cps_swap(a, b);
    }
    if (!html_unescape(b, a)) return false;
    cps_swap(a, b);
    return true;
}

/* ---- rules 2-8 ------------------------------------------------------------------------- */

/* (\S)(\1{2,}) -> ' xxrep N c ' */
static bool replace_rep(cps *out, const cps *in) {
    const int32_t *a = in->p;
    out->n = 0;
    for (int64_t i = 0; i < in->n;) {
        int64_t r = 1;
        if (!is_space(a[i]))
            while (i + r < in->n && a[i + r] == a[i]) r++;
        if (r >= 3) {
            if (!cps_push_ascii(out, " xxrep ") || !cps_push_int(out, r) || !cps_push(out, ' ') ||
                !cps_push(out, a[i]) || !cps_push(out, ' '))
                return false;
            i += r;
        } else {
            if (!cps_push(out, a[i++])) return false;
        }
    }
    return true;
}

static bool same_word(const int32_t *a, int64_t n, int64_t at, const int32_t *w, int64_t wl) {
    return at + wl <= n && memcmp(a + at, w, (size_t)wl * sizeof *w) == 0;
}

/* (?:\s|^)(\w+)\s+((?:\1\s+)+)\1(\s|\W|$) -> ' xxwrep N w ' + terminator. The word runs to
 * the whitespace that must follow it, so backtracking reduces to: take every repetition
 * followed by whitespace, then the last copy must be followed by a non-word character or the
 * end; if it is not, the last repetition becomes the final copy. */
static bool replace_wrep(cps *out, const cps *in) {
    const int32_t *a = in->p;
    int64_t n = in->n;
    out->n = 0;
    for (int64_t p = 0; p < n;) {
        int64_t s = -1;
        if (is_space(a[p]))
            s = p + 1;
        else if (p == 0)
            s = 0;
        int64_t wl = 0, reps = 0, term = 0, term_len = 0;
        if (s >= 0) {
            while (s + wl < n && is_word(a[s + wl])) wl++;
        }
        if (wl > 0 && s + wl < n && is_space(a[s + wl])) {
            const int32_t *w = a + s;
            int64_t pos = s + wl, last_rep = -1, k = 0;
            while (pos < n && is_space(a[pos])) pos++;
            while (same_word(a, n, pos, w, wl) && pos + wl < n && is_space(a[pos + wl])) {
                last_rep = pos;
                k++;
                pos += wl;
                while (pos < n && is_space(a[pos])) pos++;
            }
            if (k >= 1 && same_word(a, n, pos, w, wl) && (pos + wl == n || !is_word(a[pos + wl]))) {
                reps = k;
                term = pos + wl;
                term_len = pos + wl < n;
            } else if (k >= 2) {
                reps = k - 1;
                term = last_rep + wl;
                term_len = 1;
            }
        }
        if (reps == 0) {
            if (!cps_push(out, a[p++])) return false;
            continue;
        }
        if (!cps_push_ascii(out, " xxwrep ") || !cps_push_int(out, reps + 2) ||
            !cps_push(out, ' ') || !cps_push_n(out, a + s, wl) || !cps_push(out, ' ') ||
            !cps_push_n(out, a + term, term_len))
            return false;
        p = term + term_len;
    }
    return true;
}

/* ([/#\\]) -> ' \1 ' */
static bool spec_add_spaces(cps *out, const cps *in) {
    out->n = 0;
    for (int64_t i = 0; i < in->n; i++) {
        int32_t c = in->p[i];
        bool ok = (c == '/' || c == '#' || c == '\\')
                      ? cps_push(out, ' ') && cps_push(out, c) && cps_push(out, ' ')
                      : cps_push(out, c);
        if (!ok) return false;
    }
    return true;
}

/* ' {2,}' -> ' ' */
static bool rm_useless_spaces(cps *out, const cps *in) {
    out->n = 0;
    for (int64_t i = 0; i < in->n; i++) {
        if (in->p[i] == ' ' && i > 0 && in->p[i - 1] == ' ') continue;
        if (!cps_push(out, in->p[i])) return false;
    }
    return true;
}

/* replace_all_caps (all_caps true): (\s|^)([A-Z]+[^a-z\s]*)(?=(\s|$)), and replace_maj:
 * (\s|^)([A-Z][^A-Z\s]*)(?=(\s|$)). Either way the word is a whole whitespace-delimited run:
 * lowercased, prefixed with the marker when longer than one character. */
static bool replace_case(cps *out, const cps *in, bool all_caps) {
    const int32_t *a = in->p;
    int64_t n = in->n;
    out->n = 0;
    for (int64_t p = 0; p < n;) {
        int64_t s = is_space(a[p]) ? p + 1 : (p == 0 ? 0 : -1);
        int64_t e = s;
        bool match = s >= 0 && s < n && is_ascii_upper(a[s]);
        if (match) {
            for (e = s + 1; e < n && !is_space(a[e]); e++) {
                if (all_caps ? is_ascii_lower(a[e]) : is_ascii_upper(a[e])) {
                    match = false;
                    break;
                }
            }
        }
        if (!match) {
            if (!cps_push(out, a[p++])) return false;
            continue;
        }
        if (s > p && !cps_push(out, a[p])) return false;
        if (e - s > 1 && !cps_push_ascii(out, all_caps ? "xxup " : "xxmaj ")) return false;
        if (!lower_range(out, a, s, e)) return false;
        p = e;
    }
    return true;
}

/* "xxbos " + t.lower().strip() (+ " xxeos") */
static bool lowercase(cps *out, const cps *in, bool bos, bool eos) {
    int64_t b = 0, e = in->n;
    while (b < e && is_space(in->p[b])) b++;
    while (e > b && is_space(in->p[e - 1])) e--;
    out->n = 0;
    if (bos && !cps_push_ascii(out, "xxbos ")) return false;
    if (!lower_range(out, in->p, b, e)) return false;
    if (eos && !cps_push_ascii(out, " xxeos")) return false;
    return true;
}

static cf_status run_rules(const char *text, size_t len, const char *source,
                           const cf_text_tok_options *o, cps *a, cps *b) {
    a->n = b->n = 0;
    cf_status st = decode_utf8(text, len, source, o->replace_invalid, a);
    if (st != CF_OK) return st;
    for (int r = 0; r < CF_TEXT_N_RULES; r++) {
        if (o->skip_rules & (1u << r)) continue;
        bool ok = true;
        switch ((cf_text_rule)r) {
        case CF_TEXT_FIX_HTML:
            ok = fix_html(a, b);
            continue; /* leaves its result in a */
        case CF_TEXT_REPLACE_REP:
            ok = replace_rep(b, a);
            break;
        case CF_TEXT_REPLACE_WREP:
            ok = replace_wrep(b, a);
            break;
        case CF_TEXT_SPEC_ADD_SPACES:
            ok = spec_add_spaces(b, a);
            break;
        case CF_TEXT_RM_USELESS_SPACES:
            ok = rm_useless_spaces(b, a);
            break;
        case CF_TEXT_REPLACE_ALL_CAPS:
            ok = replace_case(b, a, true);
            break;
        case CF_TEXT_REPLACE_MAJ:
            ok = replace_case(b, a, false);
            break;
        case CF_TEXT_LOWERCASE:
            ok = lowercase(b, a, !o->no_bos, o->add_eos);
            break;
        default:
            break;
        }
        if (!ok) return CF_ERR_NOMEM;
        cps_swap(a, b);
    }
    return CF_OK;
}

/* ---- tokens ---------------------------------------------------------------------------- */

cf_status cf_text_tokens_push(cf_text_tokens *t, const char *token, size_t len) {
    if (t->n == t->start_cap) {
        int64_t cap = t->start_cap ? 2 * t->start_cap : 32;
        int64_t *s = realloc(t->start, (size_t)cap * sizeof *s);
        if (!s) return cf_fail(CF_ERR_NOMEM, "text: out of memory for %lld tokens", (long long)cap);
        t->start = s;
        t->start_cap = cap;
    }
    if (t->len + len + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + len + 1) cap *= 2;
        char *d = realloc(t->data, cap);
        if (!d) return cf_fail(CF_ERR_NOMEM, "text: out of memory for %zu bytes of tokens", cap);
        t->data = d;
        t->cap = cap;
    }
    memcpy(t->data + t->len, token, len);
    t->data[t->len + len] = 0;
    t->start[t->n++] = (int64_t)t->len;
    t->len += len + 1;
    return CF_OK;
}

void cf_text_tokens_clear(cf_text_tokens *toks) {
    if (!toks) return;
    toks->n = 0;
    toks->len = 0;
}

void cf_text_tokens_free(cf_text_tokens *toks) {
    if (!toks) return;
    free(toks->data);
    free(toks->start);
    memset(toks, 0, sizeof *toks);
}

/* Encodes a[b, e) as one token (spaces as U+2581, fastai's replace_space). */
static cf_status emit(cf_text_tokens *t, const int32_t *a, int64_t b, int64_t e) {
    unsigned char buf[256] = {0};
    unsigned char *p = buf;
    size_t need = (size_t)(e - b) * 4;
    if (need > sizeof buf) {
        p = calloc(need, 1);
        if (!p) return cf_fail(CF_ERR_NOMEM, "text: out of memory for a token of %zu bytes", need);
    }
    size_t len = 0;
    for (int64_t i = b; i < e; i++)
        len += (size_t)utf8proc_encode_char(a[i] == ' ' ? 0x2581 : a[i], p + len);
    cf_status st = cf_text_tokens_push(t, (const char *)p, len);
    if (p != buf) free(p);
    return st;
}

static bool range_is(const int32_t *a, int64_t b, int64_t e, const char *s) {
    int64_t n = (int64_t)strlen(s);
    if (e - b != n) return false;
    for (int64_t i = 0; i < n; i++)
        if (a[b + i] != (unsigned char)s[i]) return false;
    return true;
}

static inline bool is_apos(int32_t c) {
    return c == '\'' || c == 0x2019;
}

static bool is_prefix_char(int32_t c) {
    if (c < 128) return c && strchr("([{<\"'`$#*&", (int)c) != NULL;
    switch (c) {
    case 0xa3:   /* £ */
    case 0x20ac: /* € */
    case 0x2026: /* … */
    case 0x2018: /* ‘ */
    case 0x201c: /* “ */
    case 0xab:   /* « */
    case 0xbf:   /* ¿ */
    case 0xa1:   /* ¡ */
        return true;
    default:
        return false;
    }
}

static bool is_suffix_char(int32_t c) {
    if (c < 128) return c && strchr(")]}>\"',;:!?%.", (int)c) != NULL;
    return c == 0x2026 || c == 0x2019 || c == 0x201d || c == 0xbb; /* … ’ ” » */
}

/* spaCy splits "other symbols" (emoji, ©, ...) like punctuation, except the degree sign. */
static bool is_symbol(int32_t c) {
    return c >= 128 && c != 0xb0 && utf8proc_category(c) == UTF8PROC_CATEGORY_SO;
}

static const char *const abbreviations[] = {
    "mr.",  "mrs.",  "ms.",  "dr.",  "prof.", "st.",  "jr.",   "sr.",  "vs.",  "etc.",  "inc.",
    "ltd.", "corp.", "vol.", "mt.",  "ft.",   "gov.", "sen.",  "lt.",  "sgt.", "capt.", "jan.",
    "feb.", "apr.",  "jun.", "jul.", "aug.",  "sep.", "sept.", "oct.", "nov.", "dec."};
static const char *const pronouns[] = {"i",     "you",    "he",    "she",   "it",   "we",
                                       "they",  "who",    "what",  "there", "that", "could",
                                       "would", "should", "might", "must"};

/* Never split: special tokens, clitics, abbreviations, (?:[a-z]\.)+ */
static bool is_exception(const int32_t *a, int64_t b, int64_t e) {
    int64_t n = e - b;
    if (n >= 2 && n <= 6 && a[b] == 'x' && a[b + 1] == 'x')
        for (int i = 0; i < CF_TEXT_N_SPECIAL; i++)
            if (range_is(a, b, e, cf_text_special_tokens[i])) return true;
    if (n >= 2 && n <= 3 && is_apos(a[b])) {
        static const char *const cl[] = {"s", "m", "re", "ve", "d", "ll"};
        for (size_t i = 0; i < sizeof cl / sizeof *cl; i++)
            if (range_is(a, b + 1, e, cl[i])) return true;
    }
    if (n == 3 && a[b] == 'n' && is_apos(a[b + 1]) && a[b + 2] == 't') return true;
    if (n >= 2 && a[e - 1] == '.') {
        for (size_t i = 0; i < sizeof abbreviations / sizeof *abbreviations; i++)
            if (range_is(a, b, e, abbreviations[i])) return true;
        if (n % 2 == 0) {
            bool dots = true;
            for (int64_t i = b; i < e && dots; i += 2)
                dots = is_ascii_lower(a[i]) && a[i + 1] == '.';
            if (dots) return true;
        }
    }
    return false;
}

/* Infix splits of a[b, e): the regex alternatives of text_oracle.py's _re_infix, each one
 * character long. */
static cf_status split_infixes(cf_text_tokens *t, const int32_t *a, int64_t b, int64_t e) {
    int64_t start = b;
    for (int64_t i = b; i < e; i++) {
        int32_t c = a[i];
        bool has_prev = i > b, has_next = i + 1 < e;
        int32_t prev = has_prev ? a[i - 1] : 0, next = has_next ? a[i + 1] : 0;
        bool m = false;
        if (c == 0x2026)
            m = true;
        else if (!has_prev || !has_next)
            m = false;
        else if (c == '-' || c == 0x2013 || c == 0x2014 || c == '~' || c == ',')
            m = is_letterish(prev) && is_letterish(next);
        if (!m && has_prev && has_next && (c == '-' || c == '+' || c == '*' || c == '^'))
            m = is_ascii_digit(prev) && is_ascii_digit(next);
        if (!m && has_prev && has_next && (c == ':' || c == '<' || c == '>' || c == '='))
            m = is_word(prev) && prev != '_' && is_letterish(next);
        if (!m) continue;
        cf_status st;
        if (i > start && (st = emit(t, a, start, i)) != CF_OK) return st;
        if ((st = emit(t, a, i, i + 1)) != CF_OK) return st;
        start = i + 1;
    }
    return start < e ? emit(t, a, start, e) : CF_OK;
}

static cf_status split_clitics(cf_text_tokens *t, const int32_t *a, int64_t b, int64_t e) {
    static const struct {
        const char *word, *first;
    } words[] = {{"gonna", "gon"}, {"gotta", "got"}, {"wanna", "wan"}, {"cannot", "can"}};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        if (range_is(a, b, e, words[i].word)) {
            int64_t cut = b + (int64_t)strlen(words[i].first);
            cf_status st = emit(t, a, b, cut);
            return st != CF_OK ? st : emit(t, a, cut, e);
        }
    }
    int64_t n = e - b, cut = -1;
    if (n > 3 && a[e - 3] == 'n' && is_apos(a[e - 2]) && a[e - 1] == 't')
        cut = e - 3;
    else if (n > 2 && is_apos(a[e - 2]) && a[e - 1] == 's')
        cut = e - 2;
    else {
        static const char *const cl[] = {"m", "re", "ve", "d", "ll"};
        for (size_t i = 0; i < sizeof cl / sizeof *cl && cut < 0; i++) {
            int64_t k = (int64_t)strlen(cl[i]) + 1;
            if (n <= k || !is_apos(a[e - k]) || !range_is(a, e - k + 1, e, cl[i])) continue;
            if (i == 0) {
                if (range_is(a, b, e - k, "i")) cut = e - k;
            } else {
                for (size_t j = 0; j < sizeof pronouns / sizeof *pronouns; j++)
                    if (range_is(a, b, e - k, pronouns[j])) cut = e - k;
            }
        }
    }
    if (cut < 0) return split_infixes(t, a, b, e);
    cf_status st = split_infixes(t, a, b, cut);
    return st != CF_OK ? st : split_infixes(t, a, cut, e);
}

static cf_status split_chunk(cf_text_tokens *t, const int32_t *a, int64_t b, int64_t e) {
    int64_t b0 = b, e0 = e;
    while (e - b > 1 && !is_exception(a, b, e)) {
        if (is_prefix_char(a[b]) || is_symbol(a[b]))
            b++;
        else if (is_suffix_char(a[e - 1]) || is_symbol(a[e - 1]))
            e--;
        else
            break;
    }
    cf_status st;
    for (int64_t i = b0; i < b; i++)
        if ((st = emit(t, a, i, i + 1)) != CF_OK) return st;
    st = is_exception(a, b, e) ? emit(t, a, b, e) : split_clitics(t, a, b, e);
    if (st != CF_OK) return st;
    for (int64_t i = e; i < e0; i++)
        if ((st = emit(t, a, i, i + 1)) != CF_OK) return st;
    return CF_OK;
}

static cf_status split_words(const cps *in, cf_text_splitter splitter, cf_text_tokens *t) {
    const int32_t *a = in->p;
    int64_t n = in->n;
    cf_status st = CF_OK;
    if (splitter == CF_TEXT_SPLIT_SPACES) { /* str.split(' ') */
        int64_t s = 0;
        for (int64_t i = 0; i <= n && st == CF_OK; i++) {
            if (i == n || a[i] == ' ') {
                st = emit(t, a, s, i);
                s = i + 1;
            }
        }
        return st;
    }
    for (int64_t i = 0; i < n && st == CF_OK;) {
        int64_t j = i;
        bool space = is_space(a[i]);
        while (j < n && is_space(a[j]) == space) j++;
        if (space) {
            int64_t s = a[i] == ' ' ? i + 1 : i;
            if (s < j) st = emit(t, a, s, j);
        } else {
            st = split_chunk(t, a, i, j);
        }
        i = j;
    }
    return st;
}

static const cf_text_tok_options default_options;

/* Each thread keeps its two code-point buffers between texts (up to SCRATCH_KEEP code points
 * each), so that a corpus of short texts does not allocate twice per text. They hang on a
 * thread-specific key whose destructor frees them when the thread ends (the pool's workers
 * included); a thread without them (no memory for the pair) just allocates per text. */
#define SCRATCH_KEEP ((int64_t)1 << 18)
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_ok;

static void free_scratch(void *p) {
    cps *pair = p;
    free(pair[0].p);
    free(pair[1].p);
    free(pair);
}

static void make_scratch_key(void) {
    scratch_key_ok = pthread_key_create(&scratch_key, free_scratch) == 0;
}

static cps *thread_scratch(void) {
    pthread_once(&scratch_once, make_scratch_key);
    if (!scratch_key_ok) return NULL;
    cps *pair = pthread_getspecific(scratch_key);
    if (!pair && (pair = calloc(2, sizeof *pair)) && pthread_setspecific(scratch_key, pair) != 0) {
        free(pair);
        pair = NULL;
    }
    return pair;
}

static void take_scratch(cps *a, cps *b) {
    cps *scratch = thread_scratch();
    *a = scratch ? scratch[0] : (cps){0};
    *b = scratch ? scratch[1] : (cps){0};
    if (scratch) memset(scratch, 0, 2 * sizeof *scratch);
}

static void give_scratch(cps *a, cps *b) {
    cps *scratch = thread_scratch();
    cps *both[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if (!scratch || both[i]->cap > SCRATCH_KEEP) {
            free(both[i]->p);
            *both[i] = (cps){0};
        }
        if (!scratch) continue;
        free(scratch[i].p); /* a nested call's buffers, if any */
        scratch[i] = *both[i];
        scratch[i].n = 0;
    }
}

static cf_status check_options(const cf_text_tok_options *o) {
    if (o->skip_rules >> CF_TEXT_N_RULES)
        return cf_fail(CF_ERR_INVALID, "text: skip_rules 0x%x names rules beyond the eight",
                       o->skip_rules);
    if ((unsigned)o->splitter > CF_TEXT_SPLIT_SPACES)
        return cf_fail(CF_ERR_INVALID, "text: unknown splitter %d", (int)o->splitter);
    return CF_OK;
}

cf_status cf_text_apply_rules(const char *text, size_t len, const char *source,
                              const cf_text_tok_options *opt, char **out, size_t *out_len) {
    if (!out || (!text && len))
        return cf_fail(CF_ERR_INVALID, "cf_text_apply_rules: NULL argument");
    *out = NULL;
    const cf_text_tok_options *o = opt ? opt : &default_options;
    cf_status st = check_options(o);
    if (st != CF_OK) return st;
    cps a = {0}, b = {0};
    take_scratch(&a, &b);
    st = run_rules(text, len, source, o, &a, &b);
    char *s = NULL;
    if (st == CF_OK && (s = cf_malloc((size_t)a.n * 4 + 1)) == NULL) st = CF_ERR_NOMEM;
    if (st == CF_OK) {
        size_t n = 0;
        for (int64_t i = 0; i < a.n; i++)
            n += (size_t)utf8proc_encode_char(a.p[i], (unsigned char *)s + n);
        s[n] = 0;
        *out = s;
        if (out_len) *out_len = n;
    }
    give_scratch(&a, &b);
    return st;
}

cf_status cf_text_tokenize(const char *text, size_t len, const char *source,
                           const cf_text_tok_options *opt, cf_text_tokens *toks) {
    if (!toks || (!text && len)) return cf_fail(CF_ERR_INVALID, "cf_text_tokenize: NULL argument");
    const cf_text_tok_options *o = opt ? opt : &default_options;
    cf_status st = check_options(o);
    if (st != CF_OK) return st;
    cps a = {0}, b = {0};
    take_scratch(&a, &b);
    st = run_rules(text, len, source, o, &a, &b);
    if (st == CF_OK) st = split_words(&a, o->splitter, toks);
    give_scratch(&a, &b);
    return st;
}

/* ---- settings as JSON ------------------------------------------------------------------ */

#define TOKENIZER_NAME "corefit-spacy-en"
#define TOKENIZER_VERSION 1

cf_status cf_text_tok_options_to_json(const cf_text_tok_options *opt, char **json) {
    if (!json) return cf_fail(CF_ERR_INVALID, "cf_text_tok_options_to_json: NULL argument");
    *json = NULL;
    const cf_text_tok_options *o = opt ? opt : &default_options;
    cf_status st = check_options(o);
    if (st != CF_OK) return st;
    cJSON *root = cJSON_CreateObject(), *rules = cJSON_CreateArray();
    if (!root || !rules) {
        cJSON_Delete(root);
        cJSON_Delete(rules);
        return cf_fail(CF_ERR_NOMEM, "text: out of memory writing the tokenizer's settings");
    }
    cJSON_AddItemToObject(root, "rules", rules);
    for (int r = 0; r < CF_TEXT_N_RULES; r++)
        if (!(o->skip_rules & (1u << r)))
            cJSON_AddItemToArray(rules, cJSON_CreateString(cf_text_rule_names[r]));
    cJSON_AddStringToObject(root, "tokenizer", TOKENIZER_NAME);
    cJSON_AddNumberToObject(root, "version", TOKENIZER_VERSION);
    cJSON_AddStringToObject(root, "splitter",
                            o->splitter == CF_TEXT_SPLIT_SPACES ? "spaces" : "spacy");
    cJSON_AddBoolToObject(root, "add_bos", !o->no_bos);
    cJSON_AddBoolToObject(root, "add_eos", o->add_eos);
    cJSON_AddBoolToObject(root, "replace_invalid", o->replace_invalid);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return cf_fail(CF_ERR_NOMEM, "text: out of memory writing the tokenizer's settings");
    *json = cf_strdup(text);
    cJSON_free(text);
    return *json ? CF_OK : CF_ERR_NOMEM;
}

static cf_status bool_field(const cJSON *root, const char *name, const char *src, bool *v) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!f) return cf_fail(CF_ERR_FORMAT, "%s: tokenizer settings: no \"%s\"", src, name);
    if (!cJSON_IsBool(f))
        return cf_fail(CF_ERR_FORMAT, "%s: tokenizer settings: \"%s\" is not true or false", src,
                       name);
    *v = cJSON_IsTrue(f);
    return CF_OK;
}

cf_status cf_text_tok_options_from_json(const char *json, size_t len, const char *source,
                                        cf_text_tok_options *opt) {
    const char *src = source ? source : "tokenizer settings";
    if (!json || !opt)
        return cf_fail(CF_ERR_INVALID, "cf_text_tok_options_from_json: NULL argument");
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return cf_fail(CF_ERR_FORMAT, "%s: tokenizer settings are not JSON", src);
    cf_text_tok_options o = {0};
    cf_status st = CF_OK;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *splitter = cJSON_GetObjectItemCaseSensitive(root, "splitter");
    const cJSON *rules = cJSON_GetObjectItemCaseSensitive(root, "rules");
    if (!cJSON_IsObject(root))
        st = cf_fail(CF_ERR_FORMAT, "%s: tokenizer settings: not an object", src);
    else if (!cJSON_IsString(name) || strcmp(name->valuestring, TOKENIZER_NAME) != 0)
        st = cf_fail(CF_ERR_FORMAT, "%s: tokenizer settings: tokenizer is not \"%s\"", src,
                     TOKENIZER_NAME);
    else if (!cJSON_IsNumber(version) || version->valuedouble != TOKENIZER_VERSION)
        st = cf_fail(CF_ERR_FORMAT, "%s: tokenizer settings: version is not %d", src,
                     TOKENIZER_VERSION);
    else if (!cJSON_IsString(splitter) || (strcmp(splitter->valuestring, "spacy") != 0 &&
                                           strcmp(splitter->valuestring, "spaces") != 0))
        st = cf_fail(CF_ERR_FORMAT,
                     "%s: tokenizer settings: splitter is not \"spacy\" or "
                     "\"spaces\"",
                     src);
    else if (!cJSON_IsArray(rules))
        st = cf_fail(CF_ERR_FORMAT, "%s: tokenizer settings: \"rules\" is not an array", src);
    if (st == CF_OK) {
        o.splitter = strcmp(splitter->valuestring, "spaces") == 0 ? CF_TEXT_SPLIT_SPACES
                                                                  : CF_TEXT_SPLIT_SPACY;
        unsigned seen = 0;
        int last = -1, i = 0;
        const cJSON *r;
        cJSON_ArrayForEach(r, rules) {
            int k = -1;
            for (int j = 0; j < CF_TEXT_N_RULES && cJSON_IsString(r); j++)
                if (strcmp(r->valuestring, cf_text_rule_names[j]) == 0) k = j;
            if (k < 0 || k <= last) {
                st = cf_fail(CF_ERR_FORMAT,
                             "%s: tokenizer settings: rule %d is not one of fastai's rules in "
                             "fastai's order",
                             src, i);
                break;
            }
            seen |= 1u << k;
            last = k;
            i++;
        }
        o.skip_rules = ~seen & ((1u << CF_TEXT_N_RULES) - 1);
    }
    bool bos = true;
    if (st == CF_OK) st = bool_field(root, "add_bos", src, &bos);
    if (st == CF_OK) st = bool_field(root, "add_eos", src, &o.add_eos);
    if (st == CF_OK) st = bool_field(root, "replace_invalid", src, &o.replace_invalid);
    o.no_bos = !bos;
    cJSON_Delete(root);
    if (st == CF_OK) *opt = o;
    return st;
}
