/* IDX files read into a data set: cf_dataset_from_idx inflates gzip'd images straight into the
 * data set's floats (no whole-file buffer; src/data/idx.c), and large data sets come from mapped,
 * unzeroed memory with huge pages asked for (src/core/memory.c). Checked here:
 * - the floats and labels of gzip'd, raw, several-member and --limit files equal a direct decode
 *   of the bytes written (byte / 255 rounded from double), bit for bit, across several chunks;
 * - damaged files (cut short, extra data, a corrupt byte, a trailer that lies) give the same
 *   error, naming file and position, as cf_idx_read on the same file;
 * - cf_calloc's memory is zero and cf_free gives back mapped and heap blocks alike.
 * ctest runs it twice: as is, and with CF_MAP_MIN_BYTES=0 (tests/idx_fill.cmake), where every
 * cf_calloc and every data set is mapped; there it also checks that they were (as is, a cf_calloc
 * of 32 MiB or more and a data set of 4 MiB or more are; not under AddressSanitizer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "corefit/core.h"
#include "corefit/data.h"

/* 3000 images of 28 x 28: 2,352,000 bytes, 8 chunks of 256 KiB and a part of one; 9.4 MB of
 * floats, several huge pages, and enough for a helper thread to fault them in (8 MiB). */
enum { N = 3000, ROWS = 28, COLS = 28, PER = ROWS * COLS };

/* Under AddressSanitizer nothing is mapped unless CF_MAP_MIN_BYTES says so. */
#if defined(__SANITIZE_ADDRESS__)
#define MAPS_BY_DEFAULT 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MAPS_BY_DEFAULT 0
#endif
#endif
#ifndef MAPS_BY_DEFAULT
#define MAPS_BY_DEFAULT 1
#endif

static char dir[64];
static uint8_t *pixels, labels[N];

/* Whether this run maps every cf_calloc and data set (CF_MAP_MIN_BYTES=0). */
static bool mapped_run(void) {
    const char *e = getenv("CF_MAP_MIN_BYTES");
    return e && strcmp(e, "0") == 0;
}

static void be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

/* The IDX bytes of n_declared items of `per` bytes (header) followed by n_written items' data. */
static uint8_t *idx_bytes(int ndim, uint32_t n_declared, uint32_t n_written, const uint8_t *data,
                          size_t *size) {
    size_t hdr = 4 + 4 * (size_t)ndim, per = ndim == 3 ? PER : 1;
    *size = hdr + n_written * per;
    uint8_t *b = malloc(*size);
    assert_non_null(b);
    b[0] = b[1] = 0, b[2] = 8, b[3] = (uint8_t)ndim;
    be32(b + 4, n_declared);
    if (ndim == 3) be32(b + 8, ROWS), be32(b + 12, COLS);
    memcpy(b + hdr, data, n_written * per);
    return b;
}

static void write_raw(const char *path, const uint8_t *b, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_true(fwrite(b, 1, size, f) == size);
    assert_int_equal(fclose(f), 0);
}

/* Writes b gzip'd, in `members` gzip members one after another. */
static void write_gz(const char *path, const uint8_t *b, size_t size, int members) {
    size_t at = 0;
    for (int m = 0; m < members; m++) {
        size_t end = m == members - 1 ? size : size / (size_t)members * (size_t)(m + 1);
        gzFile gz = gzopen(path, m ? "ab6" : "wb6");
        assert_non_null(gz);
        assert_true(gzwrite(gz, b + at, (unsigned)(end - at)) == (int)(end - at));
        assert_int_equal(gzclose(gz), Z_OK);
        at = end;
    }
}

static char *file(const char *name) {
    static char paths[8][160];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", dir, name);
    return p;
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/cf_idx_fill_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    pixels = malloc((size_t)N * PER);
    if (!pixels) return -1;
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < (size_t)N * PER; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        pixels[i] = (uint8_t)(r >> 40);
    }
    for (int i = 0; i < N; i++) labels[i] = (uint8_t)((i * 7) % 10);
    size_t size;
    uint8_t *im = idx_bytes(3, N, N, pixels, &size);
    write_gz(file("images.gz"), im, size, 1);
    write_gz(file("images2.gz"), im, size, 2);
    write_raw(file("images.raw"), im, size);
    free(im);
    uint8_t *lb = idx_bytes(1, N, N, labels, &size);
    write_gz(file("labels.gz"), lb, size, 1);
    free(lb);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    free(pixels);
    return system(cmd) == 0 ? 0 : -1;
}

/* Fails unless ds holds the first n images and labels, decoded directly. */
static void expect_decoded(const cf_dataset *ds, int64_t n, const char *what) {
    if (!ds) fail_msg("%s: no data set (%s)", what, cf_last_error());
    int classes = 0;
    for (int64_t i = 0; i < n; i++)
        if (labels[i] + 1 > classes) classes = labels[i] + 1;
    if (ds->n != n || ds->n_classes != classes || ds->sample_shape.ndim != 3 ||
        ds->sample_shape.dim[1] != ROWS || ds->sample_shape.dim[2] != COLS)
        fail_msg("%s: %lld samples, %d classes", what, (long long)ds->n, ds->n_classes);
    for (int64_t i = 0; i < n * PER; i++) {
        float want = (float)(pixels[i] / 255.0);
        if (memcmp(&ds->x[i], &want, sizeof want) != 0)
            fail_msg("%s: x[%lld] is %.9g, the byte %d gives %.9g", what, (long long)i,
                     (double)ds->x[i], pixels[i], (double)want);
    }
    for (int64_t i = 0; i < n; i++)
        if (ds->y[i] != (float)labels[i])
            fail_msg("%s: y[%lld] is %g, not %d", what, (long long)i, (double)ds->y[i], labels[i]);
    if (mapped_run() && n * PER * sizeof(float) >= (2u << 20) &&
        ((uintptr_t)ds->x & ((2u << 20) - 1)))
        fail_msg("%s: CF_MAP_MIN_BYTES=0 but x (%p) is not on a 2 MiB boundary", what,
                 (void *)ds->x);
}

static void test_files_decode_exactly(void **state) {
    (void)state;
    const char *images[] = {"images.gz", "images2.gz", "images.raw"};
    /* one thread reads alone; two fault the pages in on a helper thread meanwhile */
    for (int t = 1; t <= 2; t++)
        for (int k = 0; k < 3; k++) {
            cf_set_num_threads(t);
            cf_dataset *ds = NULL;
            cf_status st = cf_dataset_from_idx(file(images[k]), file("labels.gz"), &ds);
            if (st) fail_msg("%s: %s", images[k], cf_last_error());
            expect_decoded(ds, N, images[k]);
            cf_dataset_free(ds);
            /* --limit: the first items only, ending inside a chunk and at one */
            int64_t firsts[] = {1, 7, 334, 669, 2700, N - 1};
            for (int j = 0; j < 6; j++) {
                ds = NULL;
                st = cf_dataset_from_idx_first(file(images[k]), file("labels.gz"), firsts[j], &ds);
                if (st)
                    fail_msg("%s, first %lld: %s", images[k], (long long)firsts[j],
                             cf_last_error());
                char what[64];
                snprintf(what, sizeof what, "%s, first %lld, %d thread(s)", images[k],
                         (long long)firsts[j], t);
                expect_decoded(ds, firsts[j], what);
                cf_dataset_free(ds);
            }
        }
    /* the same bytes from memory (cf_idx_parse, then the conversion) */
    size_t isz, lsz;
    uint8_t *im = idx_bytes(3, N, N, pixels, &isz), *lb = idx_bytes(1, N, N, labels, &lsz);
    cf_dataset *ds = NULL;
    cf_status st = cf_dataset_from_idx_memory(im, isz, lb, lsz, "fixture", &ds);
    if (st) fail_msg("memory: %s", cf_last_error());
    expect_decoded(ds, N, "memory");
    cf_dataset_free(ds);
    free(im);
    free(lb);
}

/* The error cf_dataset_from_idx gives for the images file `name` equals cf_idx_read's and
 * contains `part`. */
static void expect_same_error(const char *name, const char *part) {
    char want[1024];
    cf_idx idx;
    cf_status st1 = cf_idx_read(file(name), &idx);
    if (st1 == CF_OK) fail_msg("%s: cf_idx_read read it", name);
    snprintf(want, sizeof want, "%s", cf_last_error());
    cf_dataset *ds = NULL;
    cf_status st2 = cf_dataset_from_idx(file(name), file("labels.gz"), &ds);
    if (st2 != st1 || ds || strcmp(cf_last_error(), want) != 0)
        fail_msg("%s: cf_dataset_from_idx says %s (%s), cf_idx_read %s (%s)", name,
                 cf_status_str(st2), cf_last_error(), cf_status_str(st1), want);
    if (!strstr(want, part) || !strstr(want, name))
        fail_msg("%s: the error (%s) does not name the file and '%s'", name, want, part);
}

static void test_damaged_files_same_errors(void **state) {
    (void)state;
    size_t size;
    uint8_t *im = idx_bytes(3, N, N, pixels, &size);
    /* data cut short: raw, and gzip'd (a complete gzip stream of less data) */
    write_raw(file("short.raw"), im, size - 100);
    char part[128];
    snprintf(part, sizeof part, "need %d bytes of data, there are %d", N * PER, N * PER - 100);
    expect_same_error("short.raw", part);
    write_gz(file("short.gz"), im, size - 100, 1);
    snprintf(part, sizeof part, "truncated: data ends at byte offset %d", 16 + N * PER - 100);
    expect_same_error("short.gz", part);
    /* a gzip file cut in the middle of its compressed data */
    FILE *f = fopen(file("images.gz"), "rb");
    assert_non_null(f);
    uint8_t *gz = malloc(8 << 20);
    assert_non_null(gz);
    size_t gz_size = fread(gz, 1, 8 << 20, f);
    fclose(f);
    write_raw(file("cut.gz"), gz, gz_size / 2);
    expect_same_error("cut.gz", "truncated");
    /* a corrupt byte in the compressed data */
    gz[gz_size / 2] ^= 0x55;
    write_raw(file("corrupt.gz"), gz, gz_size);
    expect_same_error("corrupt.gz", "corrupt gzip");
    gz[gz_size / 2] ^= 0x55;
    /* a trailer whose length says the header's size but whose data is shorter: the data set is
     * allocated up front, and the read stops with the trailer's error */
    write_gz(file("lie.gz"), im, size - PER, 1);
    f = fopen(file("lie.gz"), "r+b");
    assert_non_null(f);
    uint8_t len[4] = {(uint8_t)size, (uint8_t)(size >> 8), (uint8_t)(size >> 16),
                      (uint8_t)(size >> 24)};
    assert_int_equal(fseek(f, -4, SEEK_END), 0);
    assert_int_equal(fwrite(len, 1, 4, f), 4);
    assert_int_equal(fclose(f), 0);
    expect_same_error("lie.gz", "trailer");
    /* data after what the header describes */
    uint8_t *more = malloc(size + 5);
    assert_non_null(more);
    memcpy(more, im, size);
    memset(more + size, 7, 5);
    write_gz(file("extra.gz"), more, size + 5, 1);
    snprintf(part, sizeof part, "unexpected data after byte offset %d", 16 + N * PER);
    expect_same_error("extra.gz", part);
    write_raw(file("extra.raw"), more, size + 5);
    expect_same_error("extra.raw", "dimensions say");
    free(more);
    free(gz);
    free(im);
}

static void test_calloc_is_zero(void **state) {
    (void)state;
    /* 40 MiB: mapped by default too (from 32 MiB) */
    size_t sizes[] = {1, 4096, 100000, (size_t)5 << 20, (size_t)9 << 20, (size_t)40 << 20};
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 6; k++) {
            unsigned char *p = cf_calloc(sizes[k], 1);
            assert_non_null(p);
            if (((uintptr_t)p & 63) != 0)
                fail_msg("cf_calloc(%zu) is not 64-byte aligned", sizes[k]);
            bool mapped = mapped_run() || (MAPS_BY_DEFAULT && sizes[k] >= ((size_t)32 << 20));
            if (mapped && ((uintptr_t)p & 4095) != 0)
                fail_msg("cf_calloc(%zu) is not a mapped block", sizes[k]);
            for (size_t i = 0; i < sizes[k]; i++)
                if (p[i]) fail_msg("cf_calloc(%zu)[%zu] = %d (round %d)", sizes[k], i, p[i], round);
            memset(p, 0xA5, sizes[k]); /* what a reused block would hold */
            cf_free(p);
        }
    }
    /* a heap block that lands on a page boundary is still freed as one */
    void *blocks[64];
    for (int i = 0; i < 64; i++) assert_non_null(blocks[i] = cf_malloc(4096 * (size_t)(i + 1)));
    for (int i = 0; i < 64; i++) cf_free(blocks[i]);
    cf_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_files_decode_exactly),
        cmocka_unit_test(test_damaged_files_same_errors),
        cmocka_unit_test(test_calloc_is_zero),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
