/* Memory of language-model batches from a corpus larger than memory should be: writes an id file
 * of SIZE_MB megabytes (default 1024) of documents of 200..4000 ids, maps it and runs one
 * shuffled epoch of LMDataLoader batches (bs 64, seq_len 72), printing the resident set (now and
 * peak, /proc/self/statm and getrusage) as it goes.
 *   bench_text_lm_rss [SIZE_MB] [DIR] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "corefit/data.h"

static long rss_mb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f && fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    if (f) fclose(f);
    return res * (sysconf(_SC_PAGESIZE) / 1024) / 1024;
}

/* The anonymous part of the resident set (the rest is the mapped file's pages). */
static long anon_mb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Anonymous: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb / 1024;
}

static long peak_mb(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_maxrss / 1024;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long size_mb = argc > 1 ? atol(argv[1]) : 1024;
    const char *dir = argc > 2 ? argv[2] : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_text_lm_rss.%d.ids", dir, (int)getpid());
    cf_text_idfile_writer *w = NULL;
    if (cf_text_idfile_open(path, 60008, &w) != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        return 1;
    }
    static int32_t doc[4000];
    cf_rng rng;
    cf_rng_seed(&rng, 1);
    int64_t tokens = 0, target = (int64_t)size_mb << 18; /* 4-byte ids */
    double t0 = now();
    while (tokens < target) {
        int64_t n = 200 + (int64_t)cf_rng_below(&rng, 3800);
        doc[0] = CF_TEXT_BOS;
        for (int64_t i = 1; i < n; i++) doc[i] = 9 + (int32_t)cf_rng_below(&rng, 59999);
        if (cf_text_idfile_add(w, doc, n) != CF_OK) break;
        tokens += n;
    }
    if (cf_text_idfile_close(w, false) != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        unlink(path);
        return 1;
    }
    printf("wrote %lld ids (%.0f MB) in %.1f s; rss %ld MB, peak %ld MB\n", (long long)tokens,
           tokens * 4.0 / 1e6, now() - t0, rss_mb(), peak_mb());
    cf_text_corpus *c = NULL;
    t0 = now();
    cf_status st = cf_text_corpus_map(path, &c);
    unlink(path); /* the mapping keeps the file until it is unmapped */
    if (st != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        return 1;
    }
    printf("mapped and checked %lld documents in %.1f s; rss %ld MB, peak %ld MB\n",
           (long long)c->n_docs, now() - t0, rss_mb(), peak_mb());
    cf_dataloader *dl = NULL;
    if (cf_text_lm_loader_new(c, &(cf_dl_options){.bs = 64, .shuffle = true}, NULL, &dl) != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        return 1;
    }
    cf_text_corpus_free(c);
    t0 = now();
    cf_dataloader_begin_epoch(dl, 0);
    const cf_batch *b;
    int64_t n = 0, len = cf_dataloader_len(dl);
    double sum = 0;
    while (cf_dataloader_next(dl, &b) == CF_OK && b) {
        sum += b->x.data[0];
        if (++n % (len / 4 + 1) == 0)
            printf("batch %lld of %lld: rss %ld MB (anonymous %ld MB), peak %ld MB\n", (long long)n,
                   (long long)len, rss_mb(), anon_mb(), peak_mb());
    }
    printf("epoch of %lld batches (64 x 72) in %.1f s (checksum %.0f); peak RSS %ld MB\n",
           (long long)n, now() - t0, sum, peak_mb());
    cf_dataloader_free(dl);
    return 0;
}
