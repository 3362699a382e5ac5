/* Text corpora and loaders: fastai's language-model stream and sorted classifier batches against
 * a Python implementation of fastai's formulas (tests/oracle/text_batches.py), for several bs,
 * seq_len and corpus sizes, shuffled epochs, seeking, and 1, 2 and 3 ranks in both shard
 * modes; id files (round trip, memory bound, bad files); get_preds' ordered loader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "corefit/data.h"
#include "oracle.h"

typedef struct corpus_case {
    int n_docs, max_len, vocab;
    uint64_t seed;
} corpus_case;

/* Documents of random lengths in [1, max_len], xxbos first, labels 0..2. */
static cf_text_corpus *make_corpus(const corpus_case *cc, const char *dump_path) {
    cf_rng rng;
    cf_rng_seed(&rng, cc->seed);
    int32_t **docs = calloc((size_t)cc->n_docs, sizeof *docs);
    int64_t *lens = calloc((size_t)cc->n_docs, sizeof *lens);
    float *labels = calloc((size_t)cc->n_docs, sizeof *labels);
    FILE *f = dump_path ? fopen(dump_path, "w") : NULL;
    for (int d = 0; d < cc->n_docs; d++) {
        /* some equal lengths, so that ties are exercised */
        lens[d] = 1 + (int64_t)cf_rng_below(&rng, (uint64_t)cc->max_len);
        if (d % 7 == 3) lens[d] = lens[d - 1];
        docs[d] = malloc((size_t)lens[d] * sizeof(int32_t));
        docs[d][0] = CF_TEXT_BOS;
        for (int64_t i = 1; i < lens[d]; i++)
            docs[d][i] = 3 + (int32_t)cf_rng_below(&rng, (uint64_t)(cc->vocab - 3));
        labels[d] = (float)cf_rng_below(&rng, 3);
        if (f) {
            fprintf(f, "%d", (int)labels[d]);
            for (int64_t i = 0; i < lens[d]; i++) fprintf(f, " %d", docs[d][i]);
            fprintf(f, "\n");
        }
    }
    if (f) fclose(f);
    cf_text_corpus *c = NULL;
    assert_int_equal(
        cf_text_corpus_from_docs((const int32_t *const *)docs, lens, cc->n_docs, cc->vocab, &c),
        CF_OK);
    const char *names[] = {"a", "b", "c"};
    assert_int_equal(cf_text_corpus_set_labels(c, labels, 1, 3, names), CF_OK);
    for (int d = 0; d < cc->n_docs; d++) free(docs[d]);
    free(docs);
    free(lens);
    free(labels);
    return c;
}

typedef struct run_cfg {
    bool lm;
    int bs, seq_len;
    bool shuffle, drop_last;
    uint64_t seed;
    int epoch, world, rank;
    cf_shard_mode mode;
    bool pad_last;
    int64_t start; /* seek */
} run_cfg;

/* Runs one epoch of a loader and writes its batches in the oracle's format. */
static void render(FILE *f, cf_text_corpus *c, const run_cfg *r) {
    cf_dl_options o = {
        .bs = r->bs, .shuffle = r->shuffle, .drop_last = r->drop_last, .seed = r->seed};
    cf_text_dl_options to = {
        .seq_len = r->seq_len, .pad_idx = CF_TEXT_PAD, .pad_last = r->pad_last};
    cf_dataloader *dl = NULL;
    assert_int_equal(r->lm ? cf_text_lm_loader_new(c, &o, &to, &dl)
                           : cf_text_clas_loader_new(c, &o, &to, &dl),
                     CF_OK);
    assert_true(cf_text_loader_corpus(dl) == c);
    assert_int_equal(cf_text_loader_is_lm(dl), r->lm);
    assert_int_equal(cf_dataloader_set_shard(dl, r->rank, r->world, r->mode), CF_OK);
    fprintf(f,
            "cfg kind %s bs %d seq_len %d shuffle %d drop_last %d seed %llu epoch %d world %d "
            "rank %d mode %s pad_last %d start %lld\n",
            r->lm ? "lm" : "clas", r->bs, r->seq_len, r->shuffle, r->drop_last,
            (unsigned long long)r->seed, r->epoch, r->world, r->rank,
            r->mode == CF_SHARD_PER_RANK ? "per_rank" : "split", r->pad_last, (long long)r->start);
    assert_int_equal(cf_dataloader_begin_epoch(dl, r->epoch), CF_OK);
    if (r->start) assert_int_equal(cf_dataloader_seek(dl, r->start), CF_OK);
    int64_t n = 0;
    const cf_batch *b;
    while (cf_dataloader_next(dl, &b) == CF_OK && b) {
        int T = b->x.shape.dim[1];
        fprintf(f, "batch %lld size %d T %d n_real %d global %d\n", (long long)(r->start + n),
                b->size, T, b->n_real, b->global_size);
        int yc = b->y.shape.ndim == 2 ? b->y.shape.dim[1] : 1;
        for (int i = 0; i < b->size; i++) {
            fprintf(f, "x");
            for (int t = 0; t < T; t++) fprintf(f, " %d", (int)b->x.data[i * T + t]);
            fprintf(f, " | y");
            for (int t = 0; t < yc; t++) fprintf(f, " %d", (int)b->y.data[i * yc + t]);
            fprintf(f, "\n");
        }
        fprintf(f, "idx");
        for (int i = 0; i < b->size; i++) fprintf(f, " %lld", (long long)b->idx[i]);
        fprintf(f, " pad");
        for (int i = 0; i < b->size; i++) fprintf(f, " %d", b->pad[i]);
        fprintf(f, "\n");
        n++;
    }
    assert_int_equal(n + r->start, cf_dataloader_len(dl));
    cf_dataloader_free(dl);
}

static void run_case(const corpus_case *cc, bool mapped, const int *bss, int n_bs, const int *sls,
                     int n_sl) {
    oracle o;
    oracle_init(&o);
    char path[512];
    snprintf(path, sizeof path, "%s/corpus.txt", o.dir);
    cf_text_corpus *c = make_corpus(cc, path);
    if (mapped) { /* the same documents through an id file */
        char ids[512];
        snprintf(ids, sizeof ids, "%s/corpus.ids", o.dir);
        assert_int_equal(cf_text_corpus_write(c, ids), CF_OK);
        cf_text_corpus *m = NULL;
        assert_int_equal(cf_text_corpus_map(ids, &m), CF_OK);
        assert_int_equal(m->n_docs, c->n_docs);
        assert_int_equal(m->n_tokens, c->n_tokens);
        assert_int_equal(cf_text_corpus_set_labels(m, c->targets, 1, c->n_classes,
                                                   (const char *const *)c->classes),
                         CF_OK);
        cf_text_corpus_free(c);
        c = m;
    }
    snprintf(path, sizeof path, "%s/got.txt", o.dir);
    FILE *f = fopen(path, "w");
    for (int ib = 0; ib < n_bs; ib++)
        for (int is = 0; is < n_sl; is++)
            for (int lm = 0; lm < 2; lm++)
                for (int world = 1; world <= 3; world++)
                    for (int mode = 0; mode < (world > 1 ? 2 : 1); mode++)
                        for (int rank = 0; rank < world; rank++)
                            for (int shuffle = 0; shuffle < 2; shuffle++) {
                                run_cfg r = {.lm = lm,
                                             .bs = bss[ib],
                                             .seq_len = sls[is],
                                             .shuffle = shuffle,
                                             .drop_last = shuffle,
                                             .seed = cc->seed + 11,
                                             .epoch = 1 + shuffle,
                                             .world = world,
                                             .rank = rank,
                                             .mode = (cf_shard_mode)mode};
                                render(f, c, &r);
                            }
    /* the other padding side, and seeking into an epoch */
    render(f, c,
           &(run_cfg){.bs = bss[0],
                      .seq_len = sls[0],
                      .shuffle = true,
                      .seed = 5,
                      .world = 1,
                      .pad_last = true});
    render(f, c,
           &(run_cfg){.lm = true,
                      .bs = bss[0],
                      .seq_len = sls[0],
                      .shuffle = true,
                      .seed = 5,
                      .epoch = 3,
                      .world = 1,
                      .start = 1});
    render(f, c,
           &(run_cfg){.bs = bss[0],
                      .seq_len = sls[0],
                      .shuffle = true,
                      .seed = 5,
                      .epoch = 3,
                      .world = 1,
                      .start = 1});
    fclose(f);
    oracle_run(&o, "text_batches.py", "");
    cf_text_corpus_free(c);
    oracle_cleanup(&o);
}

static void test_batches_small(void **state) {
    (void)state;
    run_case(&(corpus_case){.n_docs = 23, .max_len = 30, .vocab = 40, .seed = 1}, false,
             (int[]){4, 5}, 2, (int[]){7, 72}, 2);
}

static void test_batches_many_chunks(void **state) {
    (void)state;
    /* more than bs * 50 texts: several sorted chunks and many shuffled middle batches */
    run_case(&(corpus_case){.n_docs = 431, .max_len = 90, .vocab = 300, .seed = 2}, false,
             (int[]){3}, 1, (int[]){72}, 1);
}

static void test_batches_mapped(void **state) {
    (void)state;
    run_case(&(corpus_case){.n_docs = 57, .max_len = 50, .vocab = 64, .seed = 3}, true, (int[]){6},
             1, (int[]){10}, 1);
}

/* get_preds' loader: same data, in order, every document once. */
static void test_new_like_in_order(void **state) {
    (void)state;
    cf_text_corpus *c =
        make_corpus(&(corpus_case){.n_docs = 37, .max_len = 20, .vocab = 30, .seed = 4}, NULL);
    cf_dataloader *dl = NULL, *ord = NULL;
    assert_int_equal(
        cf_text_clas_loader_new(c, &(cf_dl_options){.bs = 8, .shuffle = true, .drop_last = true},
                                NULL, &dl),
        CF_OK);
    assert_int_equal(cf_dataloader_len(dl), 4);
    assert_int_equal(cf_dataloader_new_like(dl, &(cf_dl_options){.bs = 8}, &ord), CF_OK);
    cf_text_corpus_free(c); /* the loaders keep it */
    assert_int_equal(cf_dataloader_len(ord), 5);
    assert_int_equal(cf_dataloader_dataset(ord)->n, 37);
    assert_int_equal(cf_dataloader_dataset(ord)->n_classes, 3);
    for (int world = 1; world <= 3; world++) {
        int seen[37] = {0};
        for (int rank = 0; rank < world; rank++) {
            assert_int_equal(cf_dataloader_set_shard(ord, rank, world, CF_SHARD_PER_RANK), CF_OK);
            assert_int_equal(cf_dataloader_begin_epoch(ord, 0), CF_OK);
            const cf_batch *b;
            while (cf_dataloader_next(ord, &b) == CF_OK && b)
                for (int i = 0; i < b->size; i++)
                    if (!b->pad[i]) seen[b->idx[i]]++;
        }
        for (int d = 0; d < 37; d++) assert_int_equal(seen[d], 1);
    }
    cf_dataloader_free(dl);
    cf_dataloader_free(ord);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* Damaged id files are refused with the file, the byte offset and the value. */
static void test_bad_id_files(void **state) {
    (void)state;
    char dir[256], path[512], bad[512];
    test_tmpdir_make(dir, sizeof dir, "cf_textids");
    snprintf(path, sizeof path, "%s/ok.ids", dir);
    snprintf(bad, sizeof bad, "%s/bad.ids", dir);
    int32_t d0[] = {2, 5, 6}, d1[] = {2, 7};
    const int32_t *docs[] = {d0, d1};
    int64_t lens[] = {3, 2};
    cf_text_corpus *c = NULL;
    assert_int_equal(cf_text_corpus_from_docs(docs, lens, 2, 8, &c), CF_OK);
    assert_int_equal(cf_text_corpus_write(c, path), CF_OK);
    cf_text_corpus_free(c);
    FILE *f = fopen(path, "rb");
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_int_equal(n, 32 + 5 * 4 + 4 + 3 * 8);
    cf_text_corpus *m = NULL;
    assert_int_equal(cf_text_corpus_map(path, &m), CF_OK);
    int32_t got[3];
    assert_int_equal(cf_text_corpus_read(m, 0, 1, 2, got), CF_OK);
    assert_int_equal(got[0], 5);
    assert_int_equal(got[1], 6);
    assert_int_not_equal(cf_text_corpus_read(m, 1, 1, 2, got), CF_OK);
    cf_text_corpus_free(m);

    unsigned char b2[256];
    memcpy(b2, buf, n);
    b2[0] = 'X';
    write_bytes(bad, b2, n);
    assert_int_equal(cf_text_corpus_map(bad, &m), CF_ERR_FORMAT);
    assert_null(m);
    assert_non_null(strstr(cf_last_error(), "byte 0"));

    write_bytes(bad, buf, n - 3); /* truncated */
    assert_int_equal(cf_text_corpus_map(bad, &m), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "bad.ids"));

    memcpy(b2, buf, n);
    int32_t big = 9; /* token 4 (byte 48) outside the vocabulary of 8 */
    memcpy(b2 + 32 + 16, &big, 4);
    write_bytes(bad, b2, n);
    assert_int_equal(cf_text_corpus_map(bad, &m), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "byte 48"));
    assert_non_null(strstr(cf_last_error(), "id 9"));

    memcpy(b2, buf, n);
    int64_t off = 4; /* offsets 0, 4 (not 3), 5: still monotonic; then 6 > 5 tokens */
    memcpy(b2 + 56 + 8, &off, 8);
    off = 6;
    memcpy(b2 + 56 + 16, &off, 8);
    write_bytes(bad, b2, n);
    assert_int_equal(cf_text_corpus_map(bad, &m), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "offset of document 2 is 6"));

    write_bytes(bad, "", 0);
    assert_int_equal(cf_text_corpus_map(bad, &m), CF_ERR_FORMAT);
    assert_int_equal(test_tmpdir_remove(dir), 0);
}

static long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* A 160 MB id file read through whole language-model epochs: the resident set grows by far less
 * than the corpus (pages are given back as reading moves on). bench/bench_text_lm_rss does the
 * same with 1 GB. */
static void test_mapped_memory_bound(void **state) {
    (void)state;
    char dir[256], path[512];
    test_tmpdir_make(dir, sizeof dir, "cf_textrss");
    snprintf(path, sizeof path, "%s/big.ids", dir);
    cf_text_idfile_writer *w = NULL;
    assert_int_equal(cf_text_idfile_open(path, 1000, &w), CF_OK);
    int32_t doc[4000];
    cf_rng rng;
    cf_rng_seed(&rng, 9);
    int64_t tokens = 0, target = (int64_t)40 << 20; /* 40 M ids, 160 MB */
    while (tokens < target) {
        int64_t n = 200 + (int64_t)cf_rng_below(&rng, 3800);
        doc[0] = CF_TEXT_BOS;
        for (int64_t i = 1; i < n; i++) doc[i] = 3 + (int32_t)(i % 997);
        assert_int_equal(cf_text_idfile_add(w, doc, n), CF_OK);
        tokens += n;
    }
    assert_int_equal(cf_text_idfile_close(w, false), CF_OK);
    long before = peak_rss_kb();
    cf_text_corpus *c = NULL;
    assert_int_equal(cf_text_corpus_map(path, &c), CF_OK);
    cf_dataloader *dl = NULL;
    assert_int_equal(
        cf_text_lm_loader_new(c, &(cf_dl_options){.bs = 64, .shuffle = true}, NULL, &dl), CF_OK);
    cf_text_corpus_free(c);
    assert_int_equal(cf_dataloader_begin_epoch(dl, 0), CF_OK);
    const cf_batch *b;
    int64_t n = 0;
    double sum = 0;
    while (cf_dataloader_next(dl, &b) == CF_OK && b) {
        sum += b->x.data[0];
        n++;
    }
    assert_int_equal(n, cf_dataloader_len(dl));
    assert_true(sum > 0);
    long grown_mb = (peak_rss_kb() - before) / 1024;
    print_message("160 MB id file, one epoch of %lld batches: peak RSS grew by %ld MB\n",
                  (long long)n, grown_mb);
    assert_true(grown_mb < 100);
    cf_dataloader_free(dl);
    assert_int_equal(test_tmpdir_remove(dir), 0);
}

static void test_bad_options(void **state) {
    (void)state;
    int32_t d0[] = {2, 5, 6};
    const int32_t *docs[] = {d0};
    int64_t lens[] = {3};
    cf_text_corpus *c = NULL;
    assert_int_equal(cf_text_corpus_from_docs(docs, lens, 1, 7, &c), CF_OK);
    cf_dataloader *dl = NULL;
    /* no labels */
    assert_int_equal(cf_text_clas_loader_new(c, NULL, NULL, &dl), CF_ERR_INVALID);
    assert_null(dl);
    assert_int_equal(cf_text_lm_loader_new(c, NULL, &(cf_text_dl_options){.seq_len = -1}, &dl),
                     CF_ERR_INVALID);
    assert_int_equal(cf_text_lm_loader_new(c, NULL, &(cf_text_dl_options){.pad_idx = 7}, &dl),
                     CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "pad_idx 7"));
    /* an id outside the vocabulary */
    int32_t d1[] = {2, 9};
    const int32_t *docs1[] = {d1};
    int64_t lens1[] = {2};
    cf_text_corpus *bad = NULL;
    assert_int_equal(cf_text_corpus_from_docs(docs1, lens1, 1, 7, &bad), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "id 9"));
    /* too short a corpus for one row per batch: no batches, no crash */
    assert_int_equal(cf_text_lm_loader_new(c, &(cf_dl_options){.bs = 64}, NULL, &dl), CF_OK);
    assert_int_equal(cf_dataloader_len(dl), 0);
    assert_int_equal(cf_dataloader_begin_epoch(dl, 0), CF_OK);
    const cf_batch *b = (const cf_batch *)1;
    assert_int_equal(cf_dataloader_next(dl, &b), CF_OK);
    assert_null(b);
    cf_dataloader_free(dl);
    cf_text_corpus_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batches_small),  cmocka_unit_test(test_batches_many_chunks),
        cmocka_unit_test(test_batches_mapped), cmocka_unit_test(test_new_like_in_order),
        cmocka_unit_test(test_bad_id_files),   cmocka_unit_test(test_mapped_memory_bound),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
