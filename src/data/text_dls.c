/* fastai's TextDataLoaders.from_folder / from_csv with fastai's tokenizer and vocabulary: the
 * numericalizer made of cf_text_tok_options + make_vocab (or a given vocabulary), corpora
 * tokenized on every core (files cached in "<path>_tok" as Tokenizer.from_folder does), and the
 * decoding of the special tokens (decode_spec_tokens) for generated text. */
#include "core/strbuf.h"
#include "data_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- the numericalizer ------------------------------------------------------------------- */

typedef struct fastai_nz {
    cf_text_numericalizer nz; /* first: the public face, ctx points back here */
    cf_text_tok_options tok;
    cf_text_vocab_options vopt;
    cf_text_vocab *vocab; /* NULL until fit (or given) */
} fastai_nz;

static cf_status copy_vocab(const cf_text_vocab *v, cf_text_vocab **out) {
    const int64_t n = cf_text_vocab_len(v);
    const char **words = cf_malloc((size_t)(n ? n : 1) * sizeof(char *));
    if (!words) return cf_fail(CF_ERR_NOMEM, "text vocabulary of %lld words", (long long)n);
    for (int64_t i = 0; i < n; i++) words[i] = cf_text_vocab_word(v, i);
    cf_status st = cf_text_vocab_from_words(words, n, out);
    cf_free(words);
    return st;
}

static cf_status fz_fit(void *ctx, const char *const *texts, int64_t n) {
    fastai_nz *f = ctx;
    if (f->vocab) return CF_OK; /* a given vocabulary is used verbatim */
    size_t *lens = cf_malloc((size_t)(n ? n : 1) * sizeof *lens);
    if (!lens) return cf_fail(CF_ERR_NOMEM, "numericalizer: %lld texts", (long long)n);
    for (int64_t i = 0; i < n; i++) lens[i] = strlen(texts[i]);
    cf_text_tokens *per = NULL;
    cf_text_counter *counts = NULL;
    cf_status st = cf_text_tokenize_texts(texts, lens, NULL, n, &f->tok, &per, &counts);
    if (st == CF_OK) st = cf_text_vocab_new(counts, &f->vopt, &f->vocab);
    for (int64_t i = 0; per && i < n; i++) cf_text_tokens_free(&per[i]);
    cf_free(per);
    cf_text_counter_free(counts);
    cf_free(lens);
    return st;
}

/* ids of toks (int32, cf_malloc'd). */
static cf_status ids_of(const cf_text_vocab *v, const cf_text_tokens *toks, int32_t **ids) {
    int64_t *wide = cf_malloc((size_t)(toks->n ? toks->n : 1) * sizeof *wide);
    int32_t *out = cf_malloc((size_t)(toks->n ? toks->n : 1) * sizeof *out);
    if (!wide || !out) {
        cf_free(wide);
        cf_free(out);
        return cf_fail(CF_ERR_NOMEM, "numericalize: %lld tokens", (long long)toks->n);
    }
    cf_text_numericalize(v, toks, wide, NULL);
    for (int64_t i = 0; i < toks->n; i++) out[i] = (int32_t)wide[i];
    cf_free(wide);
    *ids = out;
    return CF_OK;
}

static cf_status fz_encode(void *ctx, const char *text, int32_t **ids, int64_t *n_ids) {
    fastai_nz *f = ctx;
    *ids = NULL;
    *n_ids = 0;
    if (!f->vocab)
        return cf_fail(CF_ERR_STATE, "numericalizer: no vocabulary yet (fit it on the texts)");
    cf_text_tokens toks = {0};
    cf_status st = cf_text_tokenize(text, strlen(text), "text", &f->tok, &toks);
    if (st == CF_OK) st = ids_of(f->vocab, &toks, ids);
    if (st == CF_OK) *n_ids = toks.n;
    cf_text_tokens_free(&toks);
    return st;
}

static const char *fz_token(void *ctx, int32_t id) {
    const fastai_nz *f = ctx;
    return f->vocab ? cf_text_vocab_word(f->vocab, id) : NULL;
}

static int32_t fz_vocab_size(void *ctx) {
    const fastai_nz *f = ctx;
    return f->vocab ? (int32_t)cf_text_vocab_len(f->vocab) : 0;
}

cf_status cf_text_numericalizer_new(const cf_text_tok_options *tok,
                                    const cf_text_vocab_options *vocab_opt,
                                    const cf_text_vocab *text_vocab, cf_text_numericalizer **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_numericalizer_new: out is NULL");
    *out = NULL;
    fastai_nz *f = cf_calloc(1, sizeof *f);
    if (!f) return cf_fail(CF_ERR_NOMEM, "cf_text_numericalizer_new");
    if (tok) f->tok = *tok;
    if (vocab_opt) f->vopt = *vocab_opt;
    if (text_vocab) {
        cf_status st = copy_vocab(text_vocab, &f->vocab);
        if (st != CF_OK) {
            cf_free(f);
            return st;
        }
    }
    f->nz = (cf_text_numericalizer){f, fz_fit, fz_encode, fz_token, fz_vocab_size};
    *out = &f->nz;
    return CF_OK;
}

static fastai_nz *as_fastai(const cf_text_numericalizer *nz) {
    return nz && nz->encode == fz_encode ? (fastai_nz *)nz->ctx : NULL;
}

void cf_text_numericalizer_free(cf_text_numericalizer *nz) {
    fastai_nz *f = as_fastai(nz);
    if (!f) return;
    cf_text_vocab_free(f->vocab);
    cf_free(f);
}

const cf_text_vocab *cf_text_numericalizer_vocab(const cf_text_numericalizer *nz) {
    const fastai_nz *f = as_fastai(nz);
    return f ? f->vocab : NULL;
}

const cf_text_tok_options *cf_text_numericalizer_tok(const cf_text_numericalizer *nz) {
    const fastai_nz *f = as_fastai(nz);
    return f ? &f->tok : NULL;
}

/* ---- TextDataLoaders --------------------------------------------------------------------- */

/* Docs (ids per text of raw, in raw's order) split by raw->is_valid into corpora with labels,
 * then the DataLoaders, which take nz. Frees docs. */
static cf_status dls_of_docs(const cf_text_raw *raw, int32_t **docs, int64_t *lens,
                             cf_text_numericalizer *nz, const cf_text_dls_options *o,
                             cf_dls **out) {
    const int td = raw->target_dim;
    const int32_t V = nz->vocab_size(nz->ctx);
    cf_text_corpus *split[2] = {NULL, NULL};
    cf_status st = CF_OK;
    const int32_t **d = cf_malloc((size_t)(raw->n ? raw->n : 1) * sizeof *d);
    int64_t *l = cf_malloc((size_t)(raw->n ? raw->n : 1) * sizeof *l);
    float *t = cf_malloc((size_t)(raw->n ? raw->n : 1) * (size_t)(td ? td : 1) * sizeof(float));
    if (!d || !l || !t)
        st = cf_fail(CF_ERR_NOMEM, "text DataLoaders: %lld texts", (long long)raw->n);
    for (int s = 0; s < 2 && st == CF_OK; s++) {
        int64_t k = 0;
        for (int64_t i = 0; i < raw->n; i++) {
            if (raw->is_valid[i] != (s == 1)) continue;
            d[k] = docs[i];
            l[k] = lens[i];
            for (int c = 0; c < td; c++) t[k * td + c] = raw->targets[i * td + c];
            k++;
        }
        if (k == 0 && s == 1) break; /* no validation set */
        if (k == 0) {
            st = cf_fail(CF_ERR_FORMAT, "text DataLoaders: no training texts");
            break;
        }
        st = cf_text_corpus_from_docs(d, l, k, V, &split[s]);
        if (st == CF_OK && td && !o->is_lm)
            st = cf_text_corpus_set_labels(split[s], t, td, raw->n_classes,
                                           (const char *const *)raw->classes);
    }
    for (int64_t i = 0; i < raw->n; i++) cf_free(docs[i]);
    cf_free(docs);
    cf_free(lens);
    cf_free(d);
    cf_free(l);
    cf_free(t);
    if (st == CF_OK) st = cf_text_dls_new(split[0], split[1], o, out);
    cf_text_corpus_free(split[0]);
    cf_text_corpus_free(split[1]);
    if (st == CF_OK) {
        (*out)->text_nz = nz;
        (*out)->free_text_nz = cf_text_numericalizer_free;
    } else
        cf_text_numericalizer_free(nz);
    return st;
}

/* The vocabulary: o->text_vocab verbatim, else make_vocab over counts (every text, validation
 * included, as fastai's Tokenizer counts). */
static cf_status make_nz(const cf_text_loaders_options *o, const cf_text_counter *counts,
                         cf_text_numericalizer **nz) {
    cf_status st = cf_text_numericalizer_new(&o->tok, &o->vocab, o->text_vocab, nz);
    if (st != CF_OK || o->text_vocab) return st;
    fastai_nz *f = as_fastai(*nz);
    if ((st = cf_text_vocab_new(counts, &f->vopt, &f->vocab)) != CF_OK) {
        cf_text_numericalizer_free(*nz);
        *nz = NULL;
    }
    return st;
}

cf_status cf_text_dls_from_folder(const char *path, const cf_text_folder_options *fo,
                                  const cf_text_loaders_options *opt, cf_dls **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_dls_from_folder: out is NULL");
    *out = NULL;
    if (!path) return cf_fail(CF_ERR_INVALID, "cf_text_dls_from_folder: path is NULL");
    const cf_text_loaders_options o = opt ? *opt : (cf_text_loaders_options){0};
    cf_text_folder_options f = fo ? *fo : (cf_text_folder_options){0};
    if (o.dls.is_lm) f.unlabelled = true;
    cf_text_raw *raw = NULL;
    cf_status st = cf_text_read_folder(path, &f, &raw);
    if (st != CF_OK) return st;
    /* fastai's Tokenizer.from_folder: every file tokenized once, into <path>_tok */
    char cache[4096];
    size_t plen = strlen(path);
    while (plen > 1 && path[plen - 1] == '/') plen--;
    snprintf(cache, sizeof cache, "%.*s_tok", (int)plen, path);
    cf_text_tok_files_options to = {.tok = o.tok, .num_workers = o.num_workers};
    to.cache_dir = o.cache_dir ? (o.cache_dir[0] ? o.cache_dir : NULL) : cache;
    if (f.max_bytes > 0) to.max_file_bytes = (size_t)f.max_bytes;
    cf_text_tok_files *tf = NULL;
    st = cf_text_tokenize_files((const char *const *)raw->where, raw->n, &to, &tf);
    cf_text_numericalizer *nz = NULL;
    if (st == CF_OK) st = make_nz(&o, tf->counts, &nz);
    int32_t **docs = cf_calloc((size_t)(raw->n ? raw->n : 1), sizeof *docs);
    int64_t *lens = cf_calloc((size_t)(raw->n ? raw->n : 1), sizeof *lens);
    if (st == CF_OK && (!docs || !lens)) st = cf_fail(CF_ERR_NOMEM, "%s", path);
    cf_text_tokens toks = {0};
    for (int64_t i = 0; st == CF_OK && i < raw->n; i++) {
        cf_text_tokens_clear(&toks);
        st = cf_text_tok_files_tokens(tf, i, &toks);
        if (st == CF_OK) st = ids_of(cf_text_numericalizer_vocab(nz), &toks, &docs[i]);
        lens[i] = toks.n;
    }
    cf_text_tokens_free(&toks);
    cf_text_tok_files_free(tf);
    if (st == CF_OK) {
        st = dls_of_docs(raw, docs, lens, nz, &o.dls, out);
    } else {
        for (int64_t i = 0; docs && i < raw->n; i++) cf_free(docs[i]);
        cf_free(docs);
        cf_free(lens);
        cf_text_numericalizer_free(nz);
    }
    cf_text_raw_free(raw);
    return st;
}

static cf_status dls_of_raw_texts(cf_text_raw *raw, const cf_text_loaders_options *o,
                                  cf_dls **out) {
    size_t *tl = cf_malloc((size_t)(raw->n ? raw->n : 1) * sizeof *tl);
    if (!tl) return cf_fail(CF_ERR_NOMEM, "text DataLoaders: %lld texts", (long long)raw->n);
    for (int64_t i = 0; i < raw->n; i++) tl[i] = strlen(raw->texts[i]);
    /* fastai's Tokenizer.from_df: every row tokenized (on every core) and counted */
    cf_text_tokens *per = NULL;
    cf_text_counter *counts = NULL;
    cf_status st =
        cf_text_tokenize_texts((const char *const *)raw->texts, tl, (const char *const *)raw->where,
                               raw->n, &o->tok, &per, &counts);
    cf_free(tl);
    cf_text_numericalizer *nz = NULL;
    if (st == CF_OK) st = make_nz(o, counts, &nz);
    cf_text_counter_free(counts);
    int32_t **docs = cf_calloc((size_t)(raw->n ? raw->n : 1), sizeof *docs);
    int64_t *lens = cf_calloc((size_t)(raw->n ? raw->n : 1), sizeof *lens);
    if (st == CF_OK && (!docs || !lens)) st = cf_fail(CF_ERR_NOMEM, "text DataLoaders");
    for (int64_t i = 0; st == CF_OK && i < raw->n; i++) {
        st = ids_of(cf_text_numericalizer_vocab(nz), &per[i], &docs[i]);
        lens[i] = per[i].n;
    }
    for (int64_t i = 0; per && i < raw->n; i++) cf_text_tokens_free(&per[i]);
    cf_free(per);
    if (st == CF_OK) return dls_of_docs(raw, docs, lens, nz, &o->dls, out);
    for (int64_t i = 0; docs && i < raw->n; i++) cf_free(docs[i]);
    cf_free(docs);
    cf_free(lens);
    cf_text_numericalizer_free(nz);
    return st;
}

cf_status cf_text_dls_from_csv(const char *path, const cf_text_csv_options *co,
                               const cf_text_loaders_options *opt, cf_dls **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_dls_from_csv: out is NULL");
    *out = NULL;
    const cf_text_loaders_options o = opt ? *opt : (cf_text_loaders_options){0};
    cf_text_csv_options c = co ? *co : (cf_text_csv_options){0};
    if (!c.valid_col && c.valid_pct == 0) c.valid_pct = 0.2; /* fastai's from_df default */
    cf_text_raw *raw = NULL;
    cf_status st = cf_text_read_csv(path, &c, &raw);
    if (st != CF_OK) return st;
    st = dls_of_raw_texts(raw, &o, out);
    cf_text_raw_free(raw);
    return st;
}

/* ---- decode_spec_tokens ------------------------------------------------------------------ */

/* Appends t with each code point mapped by f (upper) from the first_only-th on: fastai's
 * t.upper(), or t[:1].upper() + t[1:].lower(). */
static void put_cased(cf__strbuf *b, const char *t, bool capitalize) {
    const utf8proc_uint8_t *s = (const utf8proc_uint8_t *)t;
    utf8proc_ssize_t len = (utf8proc_ssize_t)strlen(t);
    bool first = true;
    while (len > 0) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(s, len, &c);
        if (k <= 0) { /* not UTF-8: kept as it is */
            cf__strbuf_put(b, (const char *)s, (size_t)len);
            return;
        }
        c = capitalize && !first ? utf8proc_tolower(c) : utf8proc_toupper(c);
        utf8proc_uint8_t enc[4];
        cf__strbuf_put(b, (const char *)enc, (size_t)utf8proc_encode_char(c, enc));
        first = false;
        s += k;
        len -= k;
    }
}

cf_status cf_text_decode_spec_tokens(const char *const *tokens, int64_t n, char **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_decode_spec_tokens: out is NULL");
    *out = NULL;
    cf__strbuf b = {0};
    enum { NONE, MAJ, UP, REP, WREP } rule = NONE;
    long arg = -1;
    int64_t words = 0;
#define SEP() (words++ ? cf__strbuf_put(&b, " ", 1) : (void)0)
    for (int64_t i = 0; i < n; i++) {
        const char *t = tokens[i];
        if (!strcmp(t, "xxbos") || !strcmp(t, "xxpad")) continue; /* LMLearner.predict drops them */
        if (!strcmp(t, "xxmaj")) {
            rule = MAJ;
        } else if (!strcmp(t, "xxup")) {
            rule = UP;
        } else if (!strcmp(t, "xxrep") || !strcmp(t, "xxwrep")) {
            rule = t[2] == 'w' ? WREP : REP;
            arg = -1;
        } else if (rule == NONE) {
            SEP();
            cf__strbuf_put(&b, t, strlen(t));
        } else if (rule == MAJ || rule == UP) {
            SEP();
            put_cased(&b, t, rule == MAJ);
            rule = NONE;
        } else if (arg < 0) {
            char *end;
            long v = strtol(t, &end, 10);
            if (*t && !*end && v >= 0 && v <= 10000)
                arg = v;
            else
                rule = NONE; /* fastai: not a count, the marker is dropped */
        } else {
            SEP();
            for (long r = 0; r < arg; r++) {
                if (rule == WREP && r) cf__strbuf_put(&b, " ", 1);
                cf__strbuf_put(&b, t, strlen(t));
            }
            rule = NONE; /* fastai keeps repeating the tokens that follow; one is meant */
            arg = -1;
        }
    }
#undef SEP
    *out = cf__strbuf_take(&b);
    return *out ? CF_OK : cf_fail(CF_ERR_NOMEM, "cf_text_decode_spec_tokens");
}
