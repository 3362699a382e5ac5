/* Tokenizing a corpus on every core, with fastai's cache of tokenized copies
 * (Tokenizer.from_folder / from_df, reference/fastai-text.md section 1).
 *
 * Texts are handed out one at a time from an atomic counter to the threads of the library's
 * pool (cf_parallel_for: started lazily in the process that uses it, re-created after fork, so
 * the library stays fork-safe). Each thread counts its texts' tokens in a counter of its own and
 * records where it first saw each word (text, position); as a thread takes texts in increasing
 * order, the smallest record over the threads is the corpus's first sighting, so the merged
 * counts come out in the first-seen order of a serial pass over the texts in order, whatever
 * the thread count or timing. (fastai counts in the order its workers finish.)
 *
 * Cache file (one per source, <cache_dir>/<FNV-1a of the path, hex>.tok):
 *   corefit-tok 1 <settings fingerprint, 16 hex> <size> <mtime s> <mtime ns> <n tokens>\n
 *   <source path>\n
 *   <the tokens joined by ' '>\n
 * Tokens hold no U+0020 (the splitter writes spaces as U+2581), so the body splits back on ' '.
 * A copy whose header disagrees with the source or the settings is made again. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/text_internal.h"

#define CACHE_MAGIC "corefit-tok 1 "
#define DEFAULT_MAX_FILE_BYTES ((size_t)64 << 20)

typedef struct first_seen {
    int64_t text, pos;
} first_seen;

/* A thread's counts, with the first sighting of each word. */
typedef struct keyed_counter {
    cf_text_counter *counts;
    first_seen *first;
    int64_t cap;
} keyed_counter;

static cf_status keyed_add(keyed_counter *k, const cf_text_tokens *toks, int64_t text) {
    for (int64_t i = 0; i < toks->n; i++) {
        const char *w = cf_text_token(toks, i);
        bool added;
        int64_t idx = cf_text_counter_add_word(k->counts, w, strlen(w), 1, &added);
        if (idx < 0) return CF_ERR_NOMEM;
        if (!added) continue;
        if (idx >= k->cap) {
            int64_t cap = k->cap ? 2 * k->cap : 1024;
            first_seen *f = realloc(k->first, (size_t)cap * sizeof *f);
            if (!f) return cf_fail(CF_ERR_NOMEM, "text: out of memory counting words");
            k->first = f;
            k->cap = cap;
        }
        k->first[idx] = (first_seen){text, i};
    }
    return CF_OK;
}

typedef struct ranked_word {
    first_seen first;
    int64_t idx;
} ranked_word;

static int by_first_seen(const void *pa, const void *pb) {
    const ranked_word *a = pa, *b = pb;
    if (a->first.text != b->first.text) return a->first.text < b->first.text ? -1 : 1;
    return (a->first.pos > b->first.pos) - (a->first.pos < b->first.pos);
}

/* Merges the threads' counts into one counter in first-seen order. */
static cf_status merge_keyed(keyed_counter *k, int n, cf_text_counter **out) {
    cf_text_counter *all = cf_text_counter_new(), *ordered = cf_text_counter_new();
    ranked_word *rank = NULL;
    int64_t cap = 0;
    cf_status st = all && ordered ? CF_OK : CF_ERR_NOMEM;
    for (int t = 0; t < n && st == CF_OK; t++) {
        for (int64_t i = 0; i < cf_text_counter_len(k[t].counts) && st == CF_OK; i++) {
            const char *w = cf_text_counter_word(k[t].counts, i);
            bool added;
            int64_t idx = cf_text_counter_add_word(all, w, strlen(w),
                                                   cf_text_counter_count(k[t].counts, i), &added);
            if (idx < 0) {
                st = CF_ERR_NOMEM;
                break;
            }
            if (idx >= cap) {
                cap = cap ? 2 * cap : 1024;
                ranked_word *r = realloc(rank, (size_t)cap * sizeof *r);
                if (!r) {
                    st = cf_fail(CF_ERR_NOMEM, "text: out of memory merging counts");
                    break;
                }
                rank = r;
            }
            first_seen s = k[t].first[i];
            if (added || s.text < rank[idx].first.text ||
                (s.text == rank[idx].first.text && s.pos < rank[idx].first.pos))
                rank[idx] = (ranked_word){s, idx};
        }
    }
    int64_t m = st == CF_OK ? cf_text_counter_len(all) : 0;
    if (m) qsort(rank, (size_t)m, sizeof *rank, by_first_seen);
    for (int64_t i = 0; i < m && st == CF_OK; i++) {
        const char *w = cf_text_counter_word(all, rank[i].idx);
        if (cf_text_counter_add_word(ordered, w, strlen(w), cf_text_counter_count(all, rank[i].idx),
                                     NULL) < 0)
            st = CF_ERR_NOMEM;
    }
    free(rank);
    cf_text_counter_free(all);
    if (st != CF_OK) {
        cf_text_counter_free(ordered);
        return st;
    }
    *out = ordered;
    return CF_OK;
}

/* ---- the tokenized copies -------------------------------------------------------------- */

typedef struct source_stamp {
    int64_t size, mtime_s, mtime_ns;
} source_stamp;

static cf_status stamp_of(const char *path, source_stamp *s) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return cf_fail(CF_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return cf_fail(CF_ERR_IO, "%s: not a regular file", path);
    *s = (source_stamp){(int64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec,
                        (int64_t)sb.st_mtim.tv_nsec};
    return CF_OK;
}

/* The settings' fingerprint: FNV-1a of their JSON. */
static uint64_t fingerprint(const cf_text_tok_options *o) {
    char *json = NULL;
    if (cf_text_tok_options_to_json(o, &json) != CF_OK) return 0;
    uint64_t h = cf_text_fnv1a(json, strlen(json), CF_TEXT_FNV_SEED);
    cf_free(json);
    return h;
}

static char *cache_path(const char *dir, const char *source) {
    uint64_t h = cf_text_fnv1a(source, strlen(source), CF_TEXT_FNV_SEED);
    size_t n = strlen(dir) + 32;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%016" PRIx64 ".tok", dir, h);
    return p;
}

/* Parses a cached copy; true (tokens appended) when it is whole and matches source, stamp and
 * settings, false otherwise (toks left as it was). Reads only within data[0, size). */
bool cf_text_cache_parse(const char *data, size_t size, const char *source, uint64_t settings,
                         int64_t size_stamp, int64_t mtime_s, int64_t mtime_ns,
                         cf_text_tokens *toks) {
    size_t magic = strlen(CACHE_MAGIC);
    if (size < magic || memcmp(data, CACHE_MAGIC, magic) != 0) return false;
    const char *nl = memchr(data, '\n', size);
    if (!nl) return false;
    char header[160];
    size_t hl = (size_t)(nl - data);
    if (hl >= sizeof header) return false;
    memcpy(header, data, hl);
    header[hl] = 0;
    uint64_t fp;
    long long sz, ms, mns, n;
    int used = 0;
    if (sscanf(header + magic, "%16" SCNx64 " %lld %lld %lld %lld%n", &fp, &sz, &ms, &mns, &n,
               &used) != 5 ||
        header[magic + (size_t)used] != 0)
        return false;
    if (fp != settings || sz != size_stamp || ms != mtime_s || mns != mtime_ns || n < 0)
        return false;
    const char *p = nl + 1, *end = data + size;
    size_t sl = strlen(source);
    if ((size_t)(end - p) < sl + 1 || memcmp(p, source, sl) != 0 || p[sl] != '\n') return false;
    p += sl + 1;
    if (p == end || end[-1] != '\n') return false;
    end--; /* the body, without its final newline */
    /* a body of n tokens has n - 1 separators (n = 0: empty) */
    int64_t spaces = 0;
    for (const char *q = p; q < end; q++) spaces += *q == ' ' || *q == 0;
    if (n == 0 ? end != p : spaces != n - 1) return false;
    if (memchr(p, 0, (size_t)(end - p))) return false;
    int64_t n0 = toks->n;
    size_t len0 = toks->len;
    for (int64_t i = 0; i < n; i++) {
        const char *sp = memchr(p, ' ', (size_t)(end - p));
        const char *e = sp ? sp : end;
        if (cf_text_tokens_push(toks, p, (size_t)(e - p)) != CF_OK) {
            toks->n = n0;
            toks->len = len0;
            return false;
        }
        p = e + 1;
    }
    return true;
}

static cf_status mkdirs(const char *dir) {
    char *p = strdup(dir);
    if (!p) return cf_fail(CF_ERR_NOMEM, "text: out of memory");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                cf_status st =
                    cf_fail(CF_ERR_IO, "%s: cannot make the folder: %s", p, strerror(errno));
                free(p);
                return st;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    return CF_OK;
}

/* Writes the copy atomically (a temporary file, then rename). */
static cf_status write_cache(const char *path, const char *source, uint64_t settings,
                             const source_stamp *stamp, const cf_text_tokens *toks) {
    size_t n = strlen(path) + 48;
    char *tmp = malloc(n);
    if (!tmp) return cf_fail(CF_ERR_NOMEM, "text: out of memory");
    static atomic_uint_fast64_t serial;
    snprintf(tmp, n, "%s.tmp.%ld.%" PRIuFAST64, path, (long)getpid(), atomic_fetch_add(&serial, 1));
    FILE *f = fopen(tmp, "wb");
    cf_status st = CF_OK;
    if (!f) {
        st = cf_fail(CF_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    fprintf(f, CACHE_MAGIC "%016" PRIx64 " %lld %lld %lld %lld\n%s\n", settings,
            (long long)stamp->size, (long long)stamp->mtime_s, (long long)stamp->mtime_ns,
            (long long)toks->n, source);
    for (int64_t i = 0; i < toks->n; i++) {
        if (i) fputc(' ', f);
        fputs(cf_text_token(toks, i), f);
    }
    fputc('\n', f);
    if (ferror(f) | (fclose(f) != 0)) {
        st = cf_fail(CF_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
        unlink(tmp);
    } else if (rename(tmp, path) != 0) {
        st = cf_fail(CF_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return st;
}

/* Tokens of one source file: from its valid copy (*reused), else tokenized (and the copy
 * written when cache_dir is set). */
static cf_status file_tokens(const char *source, const char *cache_dir,
                             const cf_text_tok_options *o, uint64_t settings, size_t max_bytes,
                             cf_text_tokens *toks, bool *reused) {
    *reused = false;
    source_stamp stamp = {0};
    cf_status st = stamp_of(source, &stamp);
    if (st != CF_OK) return st;
    char *cpath = NULL;
    if (cache_dir) {
        if (!(cpath = cache_path(cache_dir, source)))
            return cf_fail(CF_ERR_NOMEM, "text: out of memory");
        void *data;
        size_t size;
        struct stat sb;
        if (stat(cpath, &sb) == 0 && S_ISREG(sb.st_mode) &&
            cf_read_file(cpath, (size_t)sb.st_size + 1, &data, &size) == CF_OK) {
            *reused = cf_text_cache_parse(data, size, source, settings, stamp.size, stamp.mtime_s,
                                          stamp.mtime_ns, toks);
            cf_free(data);
        }
        cf_clear_error();
        if (*reused) {
            free(cpath);
            return CF_OK;
        }
    }
    void *text;
    size_t len;
    st = cf_read_file(source, max_bytes, &text, &len);
    if (st == CF_OK) {
        int64_t n0 = toks->n;
        size_t len0 = toks->len;
        st = cf_text_tokenize(text, len, source, o, toks);
        cf_free(text);
        if (st == CF_OK && cpath) {
            cf_text_tokens mine = *toks; /* this file's tokens only */
            mine.start += n0;
            mine.n -= n0;
            for (int64_t i = 0; i < mine.n; i++) mine.start[i] -= (int64_t)len0;
            mine.data += len0;
            st = write_cache(cpath, source, settings, &stamp, &mine);
            for (int64_t i = 0; i < mine.n; i++) mine.start[i] += (int64_t)len0;
        }
    }
    free(cpath);
    return st;
}

/* ---- parallel jobs --------------------------------------------------------------------- */

typedef struct job {
    int64_t n;
    /* files */
    const char *const *paths;
    const char *cache_dir;
    size_t max_bytes;
    int64_t *lens;
    atomic_int_fast64_t reused;
    /* in-memory texts */
    const char *const *texts;
    const size_t *text_lens;
    const char *const *sources;
    cf_text_tokens *per_text;
    const cf_text_tok_options *o;
    uint64_t settings;
    bool count;
    atomic_int_fast64_t next;
    keyed_counter *counters; /* one per worker */
    atomic_int next_worker;
    cf_status *status; /* per text */
    char **errors;     /* per text, when it failed */
} job;

static void run_worker(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    job *j = ctx;
    for (int64_t w = begin; w < end; w++) {
        keyed_counter *kc = &j->counters[w];
        cf_text_tokens local = {0};
        for (;;) {
            int64_t i = atomic_fetch_add(&j->next, 1);
            if (i >= j->n) break;
            cf_status st;
            cf_text_tokens *toks = j->per_text ? &j->per_text[i] : &local;
            cf_text_tokens_clear(toks);
            if (j->paths) {
                bool reused = false;
                st = file_tokens(j->paths[i], j->cache_dir, j->o, j->settings, j->max_bytes, toks,
                                 &reused);
                if (reused) atomic_fetch_add(&j->reused, 1);
                if (st == CF_OK) j->lens[i] = toks->n;
            } else {
                char name[48];
                const char *src = j->sources && j->sources[i] ? j->sources[i] : name;
                if (src == name) snprintf(name, sizeof name, "text %lld", (long long)i);
                st = cf_text_tokenize(j->texts[i], j->text_lens[i], src, j->o, toks);
            }
            if (st == CF_OK && j->count) st = keyed_add(kc, toks, i);
            j->status[i] = st;
            if (st != CF_OK) j->errors[i] = strdup(cf_last_error());
        }
        cf_text_tokens_free(&local);
    }
}

/* Runs the job on `workers` threads and merges the counts; on failure, the first failing
 * text's error. */
static cf_status run_job(job *j, int workers, cf_text_counter **counts) {
    cf_status st = CF_OK;
    j->status = calloc((size_t)(j->n ? j->n : 1), sizeof *j->status);
    j->errors = calloc((size_t)(j->n ? j->n : 1), sizeof *j->errors);
    j->counters = calloc((size_t)workers, sizeof *j->counters);
    if (!j->status || !j->errors || !j->counters)
        st = cf_fail(CF_ERR_NOMEM, "text: out of memory for %lld texts", (long long)j->n);
    for (int w = 0; w < workers && st == CF_OK; w++)
        if (!(j->counters[w].counts = cf_text_counter_new())) st = CF_ERR_NOMEM;
    if (st == CF_OK) {
        atomic_init(&j->next, 0);
        cf_parallel_for(workers, run_worker, j);
        for (int64_t i = 0; i < j->n; i++) {
            if (j->status[i] == CF_OK) continue;
            st = cf_fail(j->status[i], "%s", j->errors[i] ? j->errors[i] : "text: failed");
            break;
        }
    }
    if (st == CF_OK && counts) st = merge_keyed(j->counters, workers, counts);
    for (int64_t i = 0; j->errors && i < j->n; i++) free(j->errors[i]);
    for (int w = 0; j->counters && w < workers; w++) {
        cf_text_counter_free(j->counters[w].counts);
        free(j->counters[w].first);
    }
    free(j->errors);
    free(j->status);
    free(j->counters);
    return st;
}

static int worker_count(int asked, int64_t n) {
    int w = asked > 0 ? asked : cf_get_num_threads();
    if (w < 1) w = 1;
    if (n < w) w = n > 0 ? (int)n : 1;
    return w;
}

cf_status cf_text_tokenize_texts(const char *const *texts, const size_t *lens,
                                 const char *const *sources, int64_t n,
                                 const cf_text_tok_options *opt, cf_text_tokens **per_text,
                                 cf_text_counter **counts) {
    if (!per_text || n < 0 || (n && (!texts || !lens)))
        return cf_fail(CF_ERR_INVALID, "cf_text_tokenize_texts: NULL argument or n < 0");
    *per_text = NULL;
    if (counts) *counts = NULL;
    static const cf_text_tok_options defaults;
    job j = {.n = n,
             .texts = texts,
             .text_lens = lens,
             .sources = sources,
             .o = opt ? opt : &defaults,
             .count = counts != NULL};
    for (int64_t i = 0; i < n; i++)
        if (!texts[i] && lens[i])
            return cf_fail(CF_ERR_INVALID, "cf_text_tokenize_texts: text %lld is NULL",
                           (long long)i);
    j.per_text = cf_calloc((size_t)(n ? n : 1), sizeof *j.per_text);
    if (!j.per_text) return CF_ERR_NOMEM;
    cf_status st = run_job(&j, worker_count(0, n), counts);
    if (st != CF_OK) {
        for (int64_t i = 0; i < n; i++) cf_text_tokens_free(&j.per_text[i]);
        cf_free(j.per_text);
        return st;
    }
    *per_text = j.per_text;
    return CF_OK;
}

void cf_text_tok_files_free(cf_text_tok_files *c) {
    if (!c) return;
    for (int64_t i = 0; c->paths && i < c->n; i++) free(c->paths[i]);
    free(c->paths);
    free(c->lens);
    cf_text_counter_free(c->counts);
    free(c->cache_dir);
    free(c);
}

cf_status cf_text_tokenize_files(const char *const *paths, int64_t n,
                                 const cf_text_tok_files_options *opt, cf_text_tok_files **out) {
    if (!out || n < 0 || (n && !paths))
        return cf_fail(CF_ERR_INVALID, "cf_text_tokenize_files: NULL argument or n < 0");
    *out = NULL;
    static const cf_text_tok_files_options defaults;
    const cf_text_tok_files_options *o = opt ? opt : &defaults;
    cf_text_tok_files *c = calloc(1, sizeof *c);
    if (!c) return cf_fail(CF_ERR_NOMEM, "text: out of memory");
    c->n = n;
    c->tok = o->tok;
    c->paths = calloc((size_t)(n ? n : 1), sizeof *c->paths);
    c->lens = calloc((size_t)(n ? n : 1), sizeof *c->lens);
    cf_status st = c->paths && c->lens ? CF_OK : cf_fail(CF_ERR_NOMEM, "text: out of memory");
    for (int64_t i = 0; i < n && st == CF_OK; i++) {
        if (!paths[i])
            st = cf_fail(CF_ERR_INVALID, "cf_text_tokenize_files: path %lld is NULL", (long long)i);
        else if (!(c->paths[i] = strdup(paths[i])))
            st = cf_fail(CF_ERR_NOMEM, "text: out of memory");
    }
    if (st == CF_OK && o->cache_dir) {
        if (!(c->cache_dir = strdup(o->cache_dir)))
            st = cf_fail(CF_ERR_NOMEM, "text: out of memory");
        else
            st = mkdirs(o->cache_dir);
    }
    if (st == CF_OK) {
        job j = {.n = n,
                 .paths = (const char *const *)c->paths,
                 .cache_dir = c->cache_dir,
                 .max_bytes = o->max_file_bytes ? o->max_file_bytes : DEFAULT_MAX_FILE_BYTES,
                 .lens = c->lens,
                 .o = &c->tok,
                 .settings = fingerprint(&c->tok),
                 .count = true};
        atomic_init(&j.reused, 0);
        st = run_job(&j, worker_count(o->num_workers, n), &c->counts);
        c->n_reused = (int64_t)atomic_load(&j.reused);
    }
    if (st != CF_OK) {
        cf_text_tok_files_free(c);
        return st;
    }
    *out = c;
    return CF_OK;
}

cf_status cf_text_tok_files_tokens(const cf_text_tok_files *corpus, int64_t i,
                                   cf_text_tokens *toks) {
    if (!corpus || !toks) return cf_fail(CF_ERR_INVALID, "cf_text_tok_files_tokens: NULL argument");
    if (i < 0 || i >= corpus->n)
        return cf_fail(CF_ERR_INVALID, "cf_text_tok_files_tokens: text %lld of %lld", (long long)i,
                       (long long)corpus->n);
    bool reused;
    return file_tokens(corpus->paths[i], corpus->cache_dir, &corpus->tok, fingerprint(&corpus->tok),
                       DEFAULT_MAX_FILE_BYTES, toks, &reused);
}
