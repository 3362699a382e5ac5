/* Resource limits and non-finite values:
 * - out of memory (RLIMIT_AS, in a child process) while building a model, while training in one
 *   process and while training on several cores gives a clear error, not a crash;
 * - absurd sizes in files (an IDX header claiming 10^12 images, a safetensors header of 10^12
 *   bytes or a tensor of 10^12 elements, a PNG of 10^10 pixels) are refused by the readers'
 *   checks before any allocation: under an address-space limit that such an allocation would
 *   hit, the error is the format error and not out-of-memory;
 * - a diverging fit (the loss becomes infinite, then NaN) stops with TerminateOnNaN, a clear
 *   message and the last good weights, in one process and on several cores. */
#include "child.h"
#include "learn_fixture.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "corefit/io.h"
#include "corefit/par.h"

#if defined(__SANITIZE_ADDRESS__)
#define LIMITS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LIMITS_ASAN 1
#endif
#endif
#ifndef LIMITS_ASAN
#define LIMITS_ASAN 0
#endif

/* Address-space limits cannot be tested under AddressSanitizer (its shadow memory reserves
 * terabytes) or valgrind (which manages the client's address space itself). */
static bool can_limit_address_space(void) {
    const char *pre = getenv("LD_PRELOAD");
    return !LIMITS_ASAN && !(pre && strstr(pre, "vgpreload"));
}

static void limit_address_space(long extra_bytes) {
    struct rlimit rl = {(rlim_t)(test_vm_size_bytes() + extra_bytes),
                        (rlim_t)(test_vm_size_bytes() + extra_bytes)};
    assert_int_equal(setrlimit(RLIMIT_AS, &rl), 0);
}

/* Runs fn in a child process (whose limits do not touch the test process); fn returns 0 when
 * all went as expected, else writes why into msg. */
static void in_child(const char *what, int (*fn)(char *msg, size_t n)) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        char msg[1024] = "";
        int rc = fn(msg, sizeof msg);
        ssize_t w = write(p[1], msg, strlen(msg) + 1);
        (void)w;
        fflush(NULL);
        _exit(rc);
    }
    close(p[1]);
    char msg[1024] = "";
    ssize_t r = read(p[0], msg, sizeof msg - 1);
    msg[r > 0 ? r : 0] = '\0';
    close(p[0]);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (WIFSIGNALED(ws)) fail_msg("%s: the process was killed by signal %d", what, WTERMSIG(ws));
    if (WEXITSTATUS(ws) != 0) fail_msg("%s: %s", what, msg);
    printf("limits: %s: %s\n", what, msg);
}

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(msg, n, __VA_ARGS__);                                                         \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- out of memory --------------------------------------------------------------------------- */

static int oom_building(char *msg, size_t n) {
    limit_address_space(256L << 20);
    cf_module *layers[] = {cf_linear(8192, 32768, true), cf_relu(), cf_linear(32768, 10, true)};
    cf_model *m = NULL;
    cf_module *root = cf_sequential(3, layers);
    cf_status st = root ? cf_model_new(&m, root, 1) : CF_ERR_NOMEM;
    EXPECT(st == CF_ERR_NOMEM, "building a 1 GiB model under a 256 MiB limit: status %s (%s)",
           cf_status_str(st), cf_last_error());
    EXPECT(m == NULL, "a model came back");
    EXPECT(strstr(cf_last_error(), "bytes") != NULL, "unclear message: %s", cf_last_error());
    snprintf(msg, n, "cf_model_new: %s", cf_last_error());
    return 0;
}

/* A small model with huge activations: 256 rows x 2^21 features = 2 GiB per layer output. */
static cf_learner *wide_learner(cf_dls **dls, int64_t n_train) {
    *dls = fixture_dls(n_train, 32, 256);
    cf_module *layers[] = {cf_linear(4, 1 << 21, true), cf_relu(), cf_linear(1 << 21, 3, true)};
    cf_model *m = NULL;
    if (cf_model_new(&m, cf_sequential(3, layers), 1) != CF_OK) return NULL;
    cf_learner *learn = NULL;
    if (cf_learner_new(&learn, *dls, m, .quiet = true) != CF_OK) return NULL;
    if (cf_learner_create_opt(learn) != CF_OK) return NULL;
    return learn;
}

static int oom_training(char *msg, size_t n) {
    cf_dls *dls;
    cf_learner *learn = wide_learner(&dls, 256);
    EXPECT(learn, "could not build the learner: %s", cf_last_error());
    size_t nw = learn->model->n_weights;
    float *w0 = malloc(nw * sizeof(float));
    memcpy(w0, learn->model->weights, nw * sizeof(float));
    limit_address_space(1536L << 20);
    cf_status st = cf_fit_one_cycle(learn, 1);
    EXPECT(st == CF_ERR_NOMEM, "training with 2 GiB activations under a 1.5 GiB limit: %s (%s)",
           cf_status_str(st), cf_last_error());
    EXPECT(strstr(cf_last_error(), "bytes") != NULL, "unclear message: %s", cf_last_error());
    EXPECT(!memcmp(w0, learn->model->weights, nw * sizeof(float)), "the weights changed");
    snprintf(msg, n, "cf_fit_one_cycle: %s", cf_last_error());
    /* The learner is still usable: the limit lifted, nothing of the failure is left. */
    cf_learner_free(learn);
    cf_dls_free(dls);
    free(w0);
    return 0;
}

static int oom_training_parallel(char *msg, size_t n) {
    cf_dls *dls;
    /* 512 rows: each of the 2 workers has a full batch of 256 (2 GiB of activations) */
    cf_learner *learn = wide_learner(&dls, 512);
    EXPECT(learn, "could not build the learner: %s", cf_last_error());
    size_t nw = learn->model->n_weights;
    float *w0 = malloc(nw * sizeof(float));
    memcpy(w0, learn->model->weights, nw * sizeof(float));
    /* room for the shared region but not for the activations */
    limit_address_space(1536L << 20);
    cf_status st = cf_par_fit_one_cycle(learn, 1, .par.num_cores = 2);
    const char *e = cf_last_error();
    EXPECT(st == CF_ERR_WORKER || st == CF_ERR_NOMEM, "parallel fit out of memory: %s (%s)",
           cf_status_str(st), e);
    EXPECT(strstr(e, "bytes") && (st == CF_ERR_NOMEM || strstr(e, "worker")), "unclear message: %s",
           e);
    EXPECT(!memcmp(w0, learn->model->weights, nw * sizeof(float)), "the weights changed");
    snprintf(msg, n, "cf_par_fit_one_cycle: %s", e);
    errno = 0;
    EXPECT(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD, "a worker is left");
    /* Too little for the shared region itself. */
    cf_status st2 = cf_par_fit_one_cycle(learn, 1, .par.num_cores = 2);
    (void)st2;
    cf_learner_free(learn);
    cf_dls_free(dls);
    free(w0);
    return 0;
}

static int oom_shared_region(char *msg, size_t n) {
    cf_dls *dls = fixture_dls(64, 16, 8);
    cf_learner *learn = NULL;
    EXPECT(cf_learner_new(&learn, dls, fixture_model(1, false), .quiet = true) == CF_OK, "learner");
    /* Nothing is reserved for what comes home (rank 0 sizes its results file to what it
     * writes): a small parallel fit runs within 512 MiB more than the caller already maps (the 1
     * GiB once reserved for results alone would not fit). */
    size_t nw = learn->model->n_weights;
    float *w0 = malloc(nw * sizeof(float));
    memcpy(w0, learn->model->weights, nw * sizeof(float));
    limit_address_space(512L << 20);
    cf_status st = cf_par_fit_one_cycle(learn, 1, .par.num_cores = 2);
    EXPECT(st == CF_OK, "a small parallel fit within 512 MiB: %s (%s)", cf_status_str(st),
           cf_last_error());
    EXPECT(memcmp(w0, learn->model->weights, nw * sizeof(float)), "the weights did not come home");
    free(w0);
    /* and without room for the shared memory itself, a clear error */
    limit_address_space(0);
    st = cf_par_fit_one_cycle(learn, 1, .par.num_cores = 2);
    EXPECT(st == CF_ERR_NOMEM, "parallel fit without room for shared memory: %s (%s)",
           cf_status_str(st), cf_last_error());
    EXPECT(strstr(cf_last_error(), "shared memory") != NULL, "unclear message: %s",
           cf_last_error());
    snprintf(msg, n, "within 512 MiB: trained; with none: %s", cf_last_error());
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}

static void test_out_of_memory(void **state) {
    (void)state;
    if (!can_limit_address_space()) {
        printf("limits: address-space limits not testable under a sanitizer or valgrind\n");
        return;
    }
    in_child("building", oom_building);
    in_child("training", oom_training);
    in_child("training on 2 cores", oom_training_parallel);
    in_child("a small parallel fit, and no room for shared memory", oom_shared_region);
}

/* ---- absurd sizes in files ----------------------------------------------------------------- */

static void be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static void put_chunk(unsigned char *out, size_t *at, const char *type, const unsigned char *data,
                      uint32_t len) {
    be32(out + *at, len);
    memcpy(out + *at + 4, type, 4);
    if (len) memcpy(out + *at + 8, data, len);
    uLong crc = crc32(0, out + *at + 4, len + 4);
    be32(out + *at + 8 + len, (uint32_t)crc);
    *at += 12 + len;
}

static int absurd_sizes(char *msg, size_t n) {
    char dir[] = "/tmp/cf_limits_XXXXXX";
    EXPECT(mkdtemp(dir), "mkdtemp");
    if (can_limit_address_space()) limit_address_space(512L << 20);
    cf_status st;

    /* IDX: 10^6 x 10^3 x 10^3 = 10^12 images' worth of bytes, in memory, raw and gzip'd. */
    unsigned char idx[16 + 64] = {0, 0, 8, 3};
    be32(idx + 4, 1000000), be32(idx + 8, 1000), be32(idx + 12, 1000);
    cf_idx out;
    st = cf_idx_parse(idx, sizeof idx, "huge.idx", &out);
    EXPECT(st == CF_ERR_FORMAT, "IDX in memory: %s (%s)", cf_status_str(st), cf_last_error());
    char path[256];
    snprintf(path, sizeof path, "%s/huge-images-idx3-ubyte.gz", dir);
    gzFile gz = gzopen(path, "wb");
    EXPECT(gz && gzwrite(gz, idx, sizeof idx) == (int)sizeof idx && gzclose(gz) == Z_OK, "gz");
    st = cf_idx_read(path, &out);
    EXPECT(st == CF_ERR_FORMAT && strstr(cf_last_error(), "refused"), "IDX gz: %s (%s)",
           cf_status_str(st), cf_last_error());
    unsigned char labels[8 + 4] = {0, 0, 8, 1};
    be32(labels + 4, 4);
    cf_dataset *ds = NULL;
    st = cf_dataset_from_idx_memory(idx, sizeof idx, labels, sizeof labels, "huge", &ds);
    EXPECT(st == CF_ERR_FORMAT && !ds, "IDX dataset: %s (%s)", cf_status_str(st), cf_last_error());

    /* safetensors: a 10^12-byte header, and a 10^12-element tensor in a small file. */
    unsigned char st1[64] = {0};
    uint64_t hl = 1000000000000ull;
    for (int i = 0; i < 8; i++) st1[i] = (unsigned char)(hl >> (8 * i));
    memcpy(st1 + 8, "{}", 2);
    cf_st_file *f = NULL;
    st = cf_st_parse(st1, sizeof st1, "huge-header.safetensors", &f);
    EXPECT(st == CF_ERR_FORMAT && !f, "safetensors header: %s (%s)", cf_status_str(st),
           cf_last_error());
    const char *json = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1000000,1000000],"
                       "\"data_offsets\":[0,4000000000000]}}";
    size_t jl = strlen(json);
    unsigned char st2[256] = {0};
    for (int i = 0; i < 8; i++) st2[i] = (unsigned char)((uint64_t)jl >> (8 * i));
    memcpy(st2 + 8, json, jl);
    st = cf_st_parse(st2, 8 + jl + 16, "huge-tensor.safetensors", &f);
    EXPECT(st == CF_ERR_FORMAT && !f, "safetensors tensor: %s (%s)", cf_status_str(st),
           cf_last_error());
    /* the same file as a checkpoint: refused, the model untouched */
    snprintf(path, sizeof path, "%s/huge.safetensors", dir);
    FILE *fp = fopen(path, "wb");
    EXPECT(fp && fwrite(st2, 1, 8 + jl + 16, fp) == 8 + jl + 16 && fclose(fp) == 0, "write");
    cf_model *m = fixture_model(1, false);
    float w0 = m->weights[0];
    st = cf_model_load(m, NULL, path);
    EXPECT(st == CF_ERR_FORMAT && m->weights[0] == w0, "checkpoint: %s (%s)", cf_status_str(st),
           cf_last_error());
    cf_model_free(m);

    /* PNG headers: 10^10 pixels (stb_image itself refuses), and 10^8 pixels (refused by the
     * library's pixel limit, naming the size). */
    static const uint32_t sides[] = {100000, 10000};
    for (int k = 0; k < 2; k++) {
        unsigned char png[256];
        size_t at = 8;
        memcpy(png, "\x89PNG\r\n\x1a\n", 8);
        unsigned char ihdr[13] = {0};
        be32(ihdr, sides[k]), be32(ihdr + 4, sides[k]);
        ihdr[8] = 8, ihdr[9] = 2;
        put_chunk(png, &at, "IHDR", ihdr, 13);
        unsigned char idat[16] = {0x78, 0x9c, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01};
        put_chunk(png, &at, "IDAT", idat, 9);
        put_chunk(png, &at, "IEND", NULL, 0);
        float pix[3 * 8 * 8];
        int w = 0, h = 0;
        st = cf_image_decode(png, at, "huge.png", 3, 8, pix, &w, &h);
        EXPECT(st != CF_OK && st != CF_ERR_NOMEM, "PNG %u x %u: %s (%s)", sides[k], sides[k],
               cf_status_str(st), cf_last_error());
        EXPECT(strstr(cf_last_error(), k == 0 ? "100000 x 100000" : "10000 x 10000"),
               "PNG: unclear message: %s", cf_last_error());
    }

    /* A loader whose batch buffers do not fit (4 x 200000 samples of 1000 values, 3.2 GB, under
     * the 512 MB limit): the message says how many buffers of what, and the size. (Without the
     * limit, under a sanitizer or valgrind, they may fit.) */
    if (can_limit_address_space()) {
        static float x[4 * 1000], y[4];
        cf_dataset *small = NULL;
        EXPECT(cf_dataset_from_arrays(x, y, 4, cf_shape1(1000), 1, 0, &small) == CF_OK, "dataset");
        cf_dataloader *dl = NULL;
        cf_dl_options o = {.bs = 200000, .prefetch = 3};
        st = cf_dataloader_new(small, &o, &dl);
        EXPECT(st == CF_ERR_NOMEM && !dl, "loader: %s (%s)", cf_status_str(st), cf_last_error());
        EXPECT(strstr(cf_last_error(), "4 batch buffers of 200000 samples of 1000 values") &&
                   strstr(cf_last_error(), "MB)") && !strstr(cf_last_error(), "-1"),
               "loader: unclear message: %s", cf_last_error());
        cf_dataset_free(small);
    }

    snprintf(msg, n, "IDX, safetensors, checkpoint and PNG headers refused (last: %s)",
             cf_last_error());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 0;
}

static void test_absurd_sizes_refused_before_allocation(void **state) {
    (void)state;
    in_child("absurd sizes", absurd_sizes);
}

/* ---- bounded readers ------------------------------------------------------------------------- */

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes an IDX image file (gzip'd): n x 28 x 28 bytes, image i filled with the byte i % 251
 * (noisy: pseudo-random bytes, which do not compress). */
static bool write_idx_gz(const char *path, uint32_t n_declared, uint32_t n_written, int ndim,
                         bool noisy) {
    gzFile gz = gzopen(path, "wb1");
    if (!gz) return false;
    unsigned char hdr[16] = {0, 0, 8, (unsigned char)ndim};
    be32(hdr + 4, n_declared);
    be32(hdr + 8, 28), be32(hdr + 12, 28);
    bool ok = gzwrite(gz, hdr, 4 + 4 * ndim) == 4 + 4 * ndim;
    unsigned char img[28 * 28];
    uint64_t rng = 88172645463325252ull;
    for (uint32_t i = 0; ok && i < n_written; i++) {
        memset(img, (int)(i % 251), sizeof img);
        for (size_t k = 0; noisy && k < sizeof img; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            img[k] = (unsigned char)(rng >> 32);
        }
        ok = gzwrite(gz, img, ndim == 1 ? 1 : sizeof img) > 0;
    }
    return gzclose(gz) == Z_OK && ok;
}

/* Every reader under an address-space limit: endless devices, FIFOs, directories, a gzip'd IDX
 * file whose header promises far more than it holds, a --limit that reads only what it keeps,
 * and a data set too large for the limit: each a clear error within seconds. */
static int bounded_readers(char *msg, size_t n) {
    char dir[] = "/tmp/cf_bounded_XXXXXX";
    EXPECT(mkdtemp(dir), "mkdtemp");
    char path[300], labels[300];
    /* Written before the limit: 60000 images, 47 MB as bytes, 188 MB as float32. */
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte.gz", dir);
    EXPECT(write_idx_gz(path, 60000, 60000, 3, false) &&
               write_idx_gz(labels, 60000, 60000, 1, false),
           "writing the IDX files");
    bool limited = can_limit_address_space();
    if (limited) limit_address_space(600L << 20);
    double t0 = seconds_now();
    float pix[3 * 8 * 8];
    int w = 0, h = 0;
    cf_status st;

    /* /dev/zero never ends: each reader stops at its limit. */
    st = cf_image_read("/dev/zero", 3, 8, pix, &w, &h);
    EXPECT(st == CF_ERR_FORMAT && strstr(cf_last_error(), "/dev/zero") &&
               strstr(cf_last_error(), "limit"),
           "image from /dev/zero: %s (%s)", cf_status_str(st), cf_last_error());
    cf_csv_table *t = NULL;
    st = cf_csv_read("/dev/zero", ',', &t);
    EXPECT(st != CF_OK && !t && strstr(cf_last_error(), "/dev/zero"), "CSV from /dev/zero: %s (%s)",
           cf_status_str(st), cf_last_error());
    cf_st_file *sf = NULL;
    st = cf_st_read("/dev/zero", &sf);
    EXPECT(st != CF_OK && !sf && strstr(cf_last_error(), "/dev/zero"),
           "safetensors from /dev/zero: %s (%s)", cf_status_str(st), cf_last_error());
    /* A directory. */
    st = cf_image_read(dir, 3, 8, pix, &w, &h);
    EXPECT(st == CF_ERR_IO && strstr(cf_last_error(), "directory"), "directory: %s (%s)",
           cf_status_str(st), cf_last_error());
    /* A FIFO with a writer is read; one without is refused after a while instead of never. */
    char fifo[320];
    snprintf(fifo, sizeof fifo, "%s/table.csv", dir);
    EXPECT(mkfifo(fifo, 0600) == 0, "mkfifo");
    pid_t writer = fork();
    if (writer == 0) {
        FILE *f = fopen(fifo, "w");
        if (f) fputs("a,b\n1,2\n3,4\n", f);
        _exit(f && fclose(f) == 0 ? 0 : 1);
    }
    st = cf_csv_read(fifo, ',', &t);
    waitpid(writer, NULL, 0);
    EXPECT(st == CF_OK && t && t->n_rows == 2, "CSV from a FIFO with a writer: %s (%s)",
           cf_status_str(st), cf_last_error());
    cf_csv_table_free(t);
    t = NULL;
    double f0 = seconds_now();
    st = cf_csv_read(fifo, ',', &t);
    double waited = seconds_now() - f0;
    EXPECT(st == CF_ERR_IO && strstr(cf_last_error(), "FIFO") && waited < 30,
           "CSV from a FIFO nobody writes to: %s (%s) after %.1f s", cf_status_str(st),
           cf_last_error(), waited);

    /* A gzip'd IDX header that promises 10^6 images (784 MB) in a file that holds 1000 (of
     * noise, so that the file is large enough for gzip to hold that much): the error is that it
     * is truncated, not out of memory (the buffer grows with the data). */
    char lie[320];
    snprintf(lie, sizeof lie, "%s/lie-images-idx3-ubyte.gz", dir);
    EXPECT(write_idx_gz(lie, 1000000, 1000, 3, true), "writing the lying file");
    cf_idx idx;
    st = cf_idx_read(lie, &idx);
    EXPECT(st == CF_ERR_FORMAT && strstr(cf_last_error(), "truncated"),
           "IDX promising more than it holds: %s (%s)", cf_status_str(st), cf_last_error());

    /* The whole set needs 235 MB as float32 besides its bytes: fine. Its first 500 images
     * (--limit) read only those. */
    cf_dataset *ds = NULL;
    st = cf_dataset_from_idx_first(path, labels, 500, &ds);
    EXPECT(st == CF_OK && ds && ds->n == 500, "first 500: %s (%s)", cf_status_str(st),
           cf_last_error());
    size_t per = 28 * 28;
    for (int64_t i = 0; i < ds->n; i++)
        EXPECT(ds->x[i * per] == (float)((i % 251) / 255.0) && ds->y[i] == (float)(i % 251),
               "first 500: sample %lld differs", (long long)i);
    cf_dataset_free(ds);
    ds = NULL;
    if (limited) {
        /* Under a limit that leaves less than the whole set needs: a clear error up front. */
        limit_address_space(100L << 20);
        st = cf_dataset_from_idx(path, labels, &ds);
        EXPECT(st == CF_ERR_NOMEM && !ds && strstr(cf_last_error(), "MB") &&
                   strstr(cf_last_error(), "ulimit -v"),
               "a data set larger than the limit: %s (%s)", cf_status_str(st), cf_last_error());
        st = cf_dataset_from_idx_first(path, labels, 500, &ds);
        EXPECT(st == CF_OK && ds && ds->n == 500, "first 500 under 100 MB: %s (%s)",
               cf_status_str(st), cf_last_error());
        cf_dataset_free(ds);
    }
    /* A sample shape from a file that asks for more memory than the machine has (a model's
     * image size of 10^5 x 10^5): refused before allocating, saying how much. */
    if (limited) {
        ds = NULL;
        float one = 0;
        st = cf_dataset_from_arrays(&one, &one, 1, cf_shape_make(3, (int[]){3, 100000, 100000}), 1,
                                    0, &ds);
        EXPECT(st == CF_ERR_NOMEM && !ds && strstr(cf_last_error(), "needs 120000.0 MB"),
               "a dataset of 120 GB: %s (%s)", cf_status_str(st), cf_last_error());
    }
    double took = seconds_now() - t0 - waited;
    EXPECT(took < 20 * test_time_scale(), "the readers took %.1f s", took);
    snprintf(msg, n, "devices, FIFOs, a directory, a lying IDX header and --limit (last: %s)",
             cf_last_error());
    char cmd[340];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 0;
}

static void test_bounded_readers(void **state) {
    (void)state;
    in_child("bounded readers", bounded_readers);
}

/* ---- non-finite values ----------------------------------------------------------------------- */

/* A regression whose SGD step is far too large: the loss grows to infinity, then NaN. */
static cf_dls *regression_dls(void) {
    enum { N = 64 };
    float x[N * 4], y[N];
    fill_uniform(x, N * 4, 3, -1, 1);
    for (int i = 0; i < N; i++) y[i] = 100 * x[4 * i] - 50 * x[4 * i + 3];
    cf_dataset *tr = NULL, *va = NULL;
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape1(4), 1, 0, &tr), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(x, y, 16, cf_shape1(4), 1, 0, &va), CF_OK);
    cf_dls *dls = NULL;
    assert_int_equal(cf_dls_new(tr, va, &(cf_dls_options){.bs = 8, .seed = 1}, &dls), CF_OK);
    return dls;
}

typedef struct last_good {
    float *weights; /* the weights at the start of the current training batch */
    size_t n;
    int batches;
} last_good;

static cf_status keep_last_good(cf_callback *cb, cf_learner *learn) {
    last_good *g = cb->state;
    if (learn->training) {
        memcpy(g->weights, learn->model->weights, g->n * sizeof(float));
        g->batches++;
    }
    return CF_OK;
}

static cf_learner *diverging_learner(cf_dls *dls) {
    cf_module *layers[] = {cf_linear(4, 32, true), cf_relu(), cf_linear(32, 1, true)};
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(3, layers), 4), CF_OK);
    cf_learner *learn = NULL;
    cf_callback *cbs[] = {cf_terminate_on_nan_cb()};
    assert_int_equal(cf_learner_new(&learn, dls, m, .quiet = true, .cbs = cbs, .n_cbs = 1,
                                    .opt_set = true, .opt = {.kind = CF_OPT_SGD}),
                     CF_OK);
    return learn;
}

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

static void test_divergence_stops_with_last_good_weights(void **state) {
    (void)state;
    cf_dls *dls = regression_dls();
    cf_learner *learn = diverging_learner(dls);
    size_t nw = learn->model->n_weights;
    last_good g = {malloc(nw * sizeof(float)), nw, 0};
    cf_callback spy = {.name = "LastGood", .order = -20, .state = &g};
    spy.on[CF_EV_BEFORE_BATCH] = keep_last_good;
    cf_callback *cbs[] = {&spy};
    cf_status st = cf_fit(learn, 20, .lr = CF_LR(5.0), .cbs = cbs, .n_cbs = 1);
    assert_int_equal(st, CF_ERR_NONFINITE);
    const char *e = cf_last_error();
    if (!strstr(e, "TerminateOnNaNCallback") || !strstr(e, "epoch") || !strstr(e, "batch") ||
        !(strstr(e, "loss is inf") || strstr(e, "loss is nan") || strstr(e, "not finite")))
        fail_msg("unclear message: %s", e);
    assert_true(g.batches > 1); /* it trained a while before diverging */
    assert_true(all_finite(learn->model->weights, nw));
    assert_memory_equal(learn->model->weights, g.weights, nw * sizeof(float));
    printf("limits: diverged after %d batches: %s\n", g.batches, e);

    /* On two cores: every worker stops at the same step (TerminateOnNaN decides alike on all
     * replicas) and the last good state comes home with the error: finite weights that moved
     * away from the ones before the call. */
    cf_learner *par = diverging_learner(dls);
    memcpy(g.weights, par->model->weights, nw * sizeof(float));
    st = cf_par_fit(par, 20, .lr = CF_LR(5.0), .par.num_cores = 2);
    e = cf_last_error();
    assert_int_equal(st, CF_ERR_NONFINITE);
    if (!strstr(e, "TerminateOnNaNCallback")) fail_msg("unclear: %s", e);
    assert_true(all_finite(par->model->weights, nw));
    assert_memory_not_equal(par->model->weights, g.weights, nw * sizeof(float));
    assert_true(par->recorder.n_batches > 1);
    printf("limits: on 2 cores: %s\n", e);
    cf_learner_free(par);
    free(g.weights);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_absurd_sizes_refused_before_allocation),
        cmocka_unit_test(test_bounded_readers),
        cmocka_unit_test(test_divergence_stops_with_last_good_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
