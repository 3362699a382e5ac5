/* Streamed image sets (cf_image_load CF_IMAGE_LOAD_STREAM): the same batches as the up-front
 * path for the same seed, at 1 and several decoding threads, sharded as in parallel fits; images
 * listed in a CSV; a bad file named in the error or skipped and counted; and a fit on a folder
 * whose decoded images take 5x the address space a child process is allowed (ulimit -v). */
#include "oracle.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "corefit/data.h"
#include "corefit/learn.h"

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#endif

static char tmp[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/cf-stream-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *at(const char *fmt, ...) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8], name[240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(p, 512, "%s/%s", tmp, name);
    return p;
}

static void mkdirs(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    assert_int_equal(system(cmd), 0);
}

/* An RGB image of w x h with a smooth pattern and noise drawn from seed, written as JPEG (or
 * PNG when png). */
static void write_image(const char *path, int w, int h, uint64_t seed, bool png) {
#ifdef CF_HAVE_STB
    unsigned char *p = malloc((size_t)w * h * 3);
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    double a = cf_rng_uniform(&rng) * 6, b = cf_rng_uniform(&rng) * 6, c = cf_rng_uniform(&rng);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < 3; ch++) {
                double v = 0.5 + 0.4 * sin(a * x / w + b * y / h + c * 6 + ch) +
                           0.08 * (cf_rng_uniform(&rng) - 0.5);
                p[((size_t)y * w + x) * 3 + ch] = (unsigned char)(v < 0   ? 0
                                                                  : v > 1 ? 255
                                                                          : v * 255);
            }
    assert_true(png ? stbi_write_png(path, w, h, 3, p, w * 3)
                    : stbi_write_jpg(path, w, h, 3, p, 90));
    free(p);
#else
    (void)path, (void)w, (void)h, (void)seed, (void)png;
#endif
}

/* root/<class>/<i>.jpg (every fifth a PNG) for 3 classes, sizes 20..47 x 18..41. */
static void make_folder(const char *root, int per_class) {
    static const char *const classes[] = {"cat", "dog", "emu"};
    for (int c = 0; c < 3; c++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", root, classes[c]);
        mkdirs(dir);
        for (int i = 0; i < per_class; i++) {
            char path[600];
            bool png = i % 5 == 4;
            snprintf(path, sizeof path, "%s/%03d.%s", dir, i, png ? "png" : "jpg");
            uint64_t seed = (uint64_t)c * 1000 + (uint64_t)i;
            write_image(path, 20 + (int)(seed * 7 % 28), 18 + (int)(seed * 5 % 24), seed, png);
        }
    }
}

static cf_dls *make_dls(const char *root, const cf_item_tfm *tfm, cf_image_load load, int threads,
                        const cf_aug_opts *aug, int prefetch) {
    cf_image_folder_options io = {
        .valid_pct = 0.25, .seed = 3, .item_tfm = tfm, .load = load, .decode_threads = threads};
    cf_dls_options o = {.bs = 7,
                        .seed = 11,
                        .n_norm = 3,
                        .mean = {0.4f, 0.5f, 0.6f},
                        .std = {0.2f, 0.25f, 0.3f},
                        .aug = aug,
                        .prefetch = prefetch};
    cf_dls *dls = NULL;
    cf_status st = cf_dls_from_image_folder(root, &io, &o, &dls);
    if (st) fprintf(stderr, "%s\n", cf_last_error());
    assert_int_equal(st, CF_OK);
    assert_int_equal(cf_dataset_is_streamed(dls->train_ds), load == CF_IMAGE_LOAD_STREAM);
    return dls;
}

/* Every batch of one epoch of a and b is the same: samples, targets, indices, flags. */
static void assert_same_epoch(cf_dataloader *a, cf_dataloader *b, int epoch) {
    assert_int_equal(cf_dataloader_begin_epoch(a, epoch), CF_OK);
    assert_int_equal(cf_dataloader_begin_epoch(b, epoch), CF_OK);
    int64_t n = 0;
    for (;;) {
        const cf_batch *x = NULL, *y = NULL;
        assert_int_equal(cf_dataloader_next(a, &x), CF_OK);
        assert_int_equal(cf_dataloader_next(b, &y), CF_OK);
        assert_true((x == NULL) == (y == NULL));
        if (!x) break;
        assert_int_equal(x->size, y->size);
        assert_int_equal(x->n_real, y->n_real);
        assert_true(cf_shape_equal(&x->x.shape, &y->x.shape));
        assert_memory_equal(x->idx, y->idx, (size_t)x->size * sizeof(int64_t));
        assert_memory_equal(x->pad, y->pad, (size_t)x->size * sizeof(bool));
        assert_memory_equal(x->y.data, y->y.data, cf_tensor_numel(&x->y) * sizeof(float));
        assert_memory_equal(x->x.data, y->x.data, cf_tensor_numel(&x->x) * sizeof(float));
        n += x->size;
    }
    assert_true(n > 0);
}

/* Squish Resize and aug_transforms: every epoch equals the up-front path, at 1 and 4 decoding
 * threads, with and without prefetching, also sharded (per rank and split batches). */
static void test_stream_equals_memory(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#endif
    const char *root = at("folder");
    make_folder(root, 14);
    cf_item_tfm tfm = cf_resize_tfm(16, CF_RESIZE_SQUISH);
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_dls *mem = make_dls(root, &tfm, CF_IMAGE_LOAD_MEMORY, 0, &aug, 0);
    int threads[] = {1, 4};
    int prefetch[] = {0, -1};
    for (int k = 0; k < 2; k++) {
        cf_dls *st = make_dls(root, &tfm, CF_IMAGE_LOAD_STREAM, threads[k], &aug, prefetch[k]);
        assert_int_equal(st->train_ds->n, mem->train_ds->n);
        assert_memory_equal(st->train_ds->y, mem->train_ds->y,
                            (size_t)mem->train_ds->n * sizeof(float));
        for (int e = 0; e < 2; e++) {
            assert_same_epoch(mem->train, st->train, e);
            assert_same_epoch(mem->valid, st->valid, e);
        }
        cf_shard_mode modes[] = {CF_SHARD_PER_RANK, CF_SHARD_SPLIT_BATCH};
        for (int m = 0; m < 2; m++) {
            assert_int_equal(cf_dataloader_set_shard(mem->train, 1, 3, modes[m]), CF_OK);
            assert_int_equal(cf_dataloader_set_shard(st->train, 1, 3, modes[m]), CF_OK);
            assert_same_epoch(mem->train, st->train, 2);
        }
        assert_int_equal(cf_dataloader_set_shard(mem->train, 0, 1, CF_SHARD_PER_RANK), CF_OK);
        assert_int_equal(cf_dataloader_skipped(st->train), 0);
        cf_dls_free(st);
    }
    cf_dls_free(mem);
}

/* RandomResizedCrop: epoch 0 equals the up-front set (which keeps epoch 0's regions); later
 * epochs draw new regions, the same at 1 and 3 threads; a sample equals cf_dataset_get. */
static void test_stream_random_resized_crop(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#endif
    const char *root = at("rrc");
    make_folder(root, 10);
    cf_item_tfm tfm = cf_random_resized_crop_tfm(12, 0.35f);
    cf_dls *mem = make_dls(root, &tfm, CF_IMAGE_LOAD_MEMORY, 0, NULL, 0);
    cf_dls *one = make_dls(root, &tfm, CF_IMAGE_LOAD_STREAM, 1, NULL, 0);
    cf_dls *three = make_dls(root, &tfm, CF_IMAGE_LOAD_STREAM, 3, NULL, 2);
    assert_same_epoch(mem->train, one->train, 0);
    assert_same_epoch(mem->valid, three->valid, 0);
    assert_same_epoch(one->train, three->train, 1);
    assert_same_epoch(one->train, three->train, 4);

    /* Epoch 1's first sample is the file decoded with epoch 1's region, normalised. */
    const cf_batch *b = NULL;
    assert_int_equal(cf_dataloader_begin_epoch(one->train, 1), CF_OK);
    assert_int_equal(cf_dataloader_next(one->train, &b), CF_OK);
    size_t per = cf_shape_numel(&one->train_ds->sample_shape), hw = per / 3;
    float *x1 = malloc(per * sizeof(float)), *x0 = malloc(per * sizeof(float));
    assert_int_equal(cf_dataset_get(one->train_ds, b->idx[0], 1, x1), CF_OK);
    assert_int_equal(cf_dataset_get(one->train_ds, b->idx[0], 0, x0), CF_OK);
    const float mean[3] = {0.4f, 0.5f, 0.6f}, std[3] = {0.2f, 0.25f, 0.3f};
    for (size_t i = 0; i < per; i++)
        assert_float_equal(b->x.data[i], (x1[i] - mean[i / hw]) / std[i / hw], 1e-5);
    assert_true(memcmp(x0, x1, per * sizeof(float)) != 0); /* a new region */
    while (b) assert_int_equal(cf_dataloader_next(one->train, &b), CF_OK);
    free(x0);
    free(x1);

    /* AUTO streams a training set with a RandomResizedCrop (a region per epoch, as fastai),
     * however small; its validation set, whose region is fixed, is decoded up front. */
    cf_image_folder_options io = {
        .valid_pct = 0.25, .seed = 3, .item_tfm = &tfm, .load = CF_IMAGE_LOAD_AUTO};
    cf_dataset *tr = NULL, *va = NULL;
    assert_int_equal(cf_datasets_from_image_folder(root, &io, &tr, &va), CF_OK);
    assert_true(cf_dataset_is_streamed(tr));
    assert_false(cf_dataset_is_streamed(va));
    cf_dataset_free(tr);
    cf_dataset_free(va);
    cf_item_tfm resize = cf_resize_tfm(12, CF_RESIZE_CROP);
    io.item_tfm = &resize; /* a fixed region: small sets stay up front */
    assert_int_equal(cf_datasets_from_image_folder(root, &io, &tr, &va), CF_OK);
    assert_false(cf_dataset_is_streamed(tr));
    cf_dataset_free(tr);
    cf_dataset_free(va);
    cf_dls_free(mem);
    cf_dls_free(one);
    cf_dls_free(three);
}

/* A truncated JPEG and a text file named .png: without skip_bad the epoch fails with an error
 * naming the file; with it they are left out and counted, the same at 1 and 4 threads. */
static void test_stream_bad_files(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#endif
    const char *root = at("bad");
    make_folder(at("bad/train"), 8);
    /* truncate cat/001.jpg to half, make dog/002.png text */
    const char *jpg = at("bad/train/cat/001.jpg"), *png = at("bad/train/dog/002.png");
    struct stat sb;
    assert_int_equal(stat(jpg, &sb), 0);
    assert_int_equal(truncate(jpg, sb.st_size / 2), 0);
    FILE *f = fopen(png, "w");
    assert_non_null(f);
    fputs("not an image\n", f);
    fclose(f);

    cf_item_tfm tfm = cf_resize_tfm(10, CF_RESIZE_CROP);
    for (int threads = 1; threads <= 4; threads += 3) {
        cf_image_folder_options io = {
            .seed = 1, .item_tfm = &tfm, .load = CF_IMAGE_LOAD_STREAM, .decode_threads = threads};
        cf_dataset *tr = NULL, *va = NULL;
        assert_int_equal(cf_datasets_from_image_folder(root, &io, &tr, &va), CF_OK);
        cf_dataloader *dl = NULL;
        assert_int_equal(cf_dataloader_new(tr, &(cf_dl_options){.bs = 5}, &dl), CF_OK);
        assert_int_equal(cf_dataloader_begin_epoch(dl, 0), CF_OK);
        cf_status st = CF_OK;
        const cf_batch *b = NULL;
        do st = cf_dataloader_next(dl, &b);
        while (st == CF_OK && b);
        assert_int_equal(st, CF_ERR_FORMAT);
        const char *msg = cf_last_error();
        assert_true(strstr(msg, "cat/001.jpg") || strstr(msg, "dog/002.png"));
        assert_non_null(strstr(msg, "corrupt or truncated JPEG") ? msg
                                                                 : strstr(msg, "not an image"));
        /* the loader starts again, and fails the same way (its first batch holds cat/001) */
        assert_int_equal(cf_dataloader_begin_epoch(dl, 0), CF_OK);
        assert_int_equal(cf_dataloader_next(dl, &b), CF_ERR_FORMAT);
        assert_non_null(strstr(cf_last_error(), "cat/001.jpg"));
        cf_dataloader_free(dl);
        cf_dataset_free(tr);
        cf_dataset_free(va);

        io.skip_bad = true;
        assert_int_equal(cf_datasets_from_image_folder(root, &io, &tr, &va), CF_OK);
        assert_int_equal(cf_dataloader_new(tr, &(cf_dl_options){.bs = 5}, &dl), CF_OK);
        for (int e = 0; e < 2; e++) {
            assert_int_equal(cf_dataloader_begin_epoch(dl, e), CF_OK);
            int64_t seen = 0;
            for (;;) {
                assert_int_equal(cf_dataloader_next(dl, &b), CF_OK);
                if (!b) break;
                for (int i = 0; i < b->size; i++) {
                    const char *p = cf_dataset_file(tr, b->idx[i]);
                    assert_null(strstr(p, "cat/001.jpg"));
                    assert_null(strstr(p, "dog/002.png"));
                    assert_int_equal(b->x.shape.dim[0], b->size);
                }
                seen += b->size;
            }
            assert_int_equal(seen, tr->n - 2); /* 24 files, bs 5 with drop_last: all batches */
            assert_int_equal(cf_dataloader_skipped(dl), 2 * (e + 1));
        }
        assert_int_equal(cf_dataset_skipped(tr), 2);
        cf_dataloader_free(dl);
        cf_dataset_free(tr);
        cf_dataset_free(va);
    }
    /* The up-front path names the file too. */
    cf_dataset *tr = NULL, *va = NULL;
    cf_image_folder_options io = {.item_tfm = &tfm, .load = CF_IMAGE_LOAD_MEMORY};
    assert_int_equal(cf_datasets_from_image_folder(root, &io, &tr, &va), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "cat/001.jpg"));
}

/* Images listed in a CSV with an is_valid column; classes from the training rows; a bad row. */
static void test_stream_csv(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#endif
    mkdirs(at("csv/imgs"));
    FILE *f = fopen(at("csv/labels.csv"), "w");
    assert_non_null(f);
    fprintf(f, "name,label,is_valid\n");
    static const char *const labels[] = {"zebra", "ant", "moth"};
    for (int i = 0; i < 12; i++) {
        write_image(at("csv/imgs/%d.jpg", i), 24 + i, 20, (uint64_t)i, false);
        fprintf(f, "%d.jpg,%s,%s\n", i, labels[i % 3], i % 4 == 3 ? "True" : "False");
    }
    fclose(f);
    cf_item_tfm tfm = cf_resize_tfm(8, CF_RESIZE_SQUISH);
    cf_dataset *mt = NULL, *mv = NULL, *st = NULL, *sv = NULL;
    cf_image_folder_options io = {.item_tfm = &tfm, .load = CF_IMAGE_LOAD_MEMORY};
    assert_int_equal(cf_datasets_from_image_csv(at("csv/labels.csv"), "imgs", NULL, "label",
                                                "is_valid", &io, &mt, &mv),
                     CF_OK);
    io.load = CF_IMAGE_LOAD_STREAM;
    assert_int_equal(cf_datasets_from_image_csv(at("csv/labels.csv"), "imgs", "name", NULL,
                                                "is_valid", &io, &st, &sv),
                     CF_OK);
    assert_int_equal(mt->n, 9);
    assert_int_equal(mv->n, 3);
    assert_int_equal(st->n_classes, 3);
    assert_string_equal(st->vocab[0], "ant");
    assert_string_equal(st->vocab[2], "zebra");
    assert_float_equal(st->y[0], 2, 0); /* 0.jpg: zebra */
    assert_non_null(strstr(cf_dataset_file(sv, 0), "imgs/3.jpg"));
    size_t per = cf_shape_numel(&st->sample_shape);
    float *x = malloc(per * sizeof(float));
    for (int64_t i = 0; i < sv->n; i++) {
        assert_int_equal(cf_dataset_get(sv, i, 0, x), CF_OK);
        assert_memory_equal(x, mv->x + i * per, per * sizeof(float));
    }
    free(x);
    cf_dataset_free(mt);
    cf_dataset_free(mv);
    cf_dataset_free(st);
    cf_dataset_free(sv);

    /* a validation row whose class no training row has */
    f = fopen(at("csv/labels.csv"), "a");
    fprintf(f, "0.jpg,yak,1\n");
    fclose(f);
    assert_int_equal(cf_datasets_from_image_csv(at("csv/labels.csv"), "imgs", NULL, NULL,
                                                "is_valid", &io, &st, &sv),
                     CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "labels.csv:14"));
    assert_non_null(strstr(cf_last_error(), "'yak'"));
    assert_null(st);
}

static long vm_size_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1;
    if (f && fscanf(f, "%ld", &pages) != 1) pages = -1;
    if (f) fclose(f);
    return pages * sysconf(_SC_PAGESIZE);
}

static bool can_limit_address_space(void) {
    const char *pre = getenv("LD_PRELOAD");
#if defined(__SANITIZE_ADDRESS__)
    return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return false;
#endif
#endif
    return !(pre && strstr(pre, "vgpreload"));
}

enum { LIMIT_MB = 64, BIG_N = 432, BIG_SIZE = 256 };

/* In a child under an address-space limit of its current size + LIMIT_MB: the folder does not
 * load up front (CF_ERR_NOMEM), and AUTO streams it and fits one epoch. */
static int fit_under_limit(const char *root) {
    /* OpenBLAS maps its work buffer (128 MiB) on its first product and retries for ever when it
     * cannot: do that product before the limit. */
    cf_set_num_threads(1); /* (OpenBLAS lets its buffers go when its thread count is set) */
    enum { N = 256 };      /* large enough for OpenBLAS to use its buffer, not the stack */
    float *a = calloc(2 * N * N, sizeof(float));
    if (!a) return 9;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, a, N, 0.0f,
                a + N * N, N);
    free(a);
    struct rlimit rl = {(rlim_t)(vm_size_bytes() + ((long)LIMIT_MB << 20)),
                        (rlim_t)(vm_size_bytes() + ((long)LIMIT_MB << 20))};
    if (setrlimit(RLIMIT_AS, &rl) != 0) return 10;
    cf_item_tfm tfm = cf_resize_tfm(BIG_SIZE, CF_RESIZE_SQUISH);
    cf_image_folder_options io = {
        .valid_pct = 0.2, .seed = 1, .item_tfm = &tfm, .load = CF_IMAGE_LOAD_MEMORY};
    cf_dls_options o = {.bs = 4, .seed = 1, .prefetch = 2, .normalize = true};
    cf_dls *dls = NULL;
    cf_status st = cf_dls_from_image_folder(root, &io, &o, &dls);
    if (st != CF_ERR_NOMEM) {
        fprintf(stderr, "up front: %s (%d)\n", cf_last_error(), (int)st);
        return 11;
    }
    io.load = CF_IMAGE_LOAD_AUTO;
    io.decode_threads = 2;
    if ((st = cf_dls_from_image_folder(root, &io, &o, &dls))) {
        fprintf(stderr, "streamed: %s\n", cf_last_error());
        return 12;
    }
    if (!cf_dataset_is_streamed(dls->train_ds)) return 13;
    cf_module *layers[] = {cf_maxpool2d(8, 8, 0),
                           cf_conv2d(3, 8, 3, 1, 1, true),
                           cf_relu(),
                           cf_adaptive_avgpool2d(1, 1),
                           cf_flatten(),
                           cf_linear(8, 3, true)};
    cf_model *m = NULL;
    cf_learner *learn = NULL;
    if ((st = cf_model_new(&m, cf_sequential(6, layers), 1)) ||
        (st = cf_learner_new(&learn, dls, m, .quiet = true)) ||
        (st = cf_fit_one_cycle(learn, 1, .lr_max = CF_LR(1e-2)))) {
        fprintf(stderr, "fit: %s\n", cf_last_error());
        return 14;
    }
    double values[2];
    if ((st = cf_validate(learn, values)) || !(values[0] == values[0])) return 15;
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}

static void test_stream_under_address_space_limit(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#endif
    if (!can_limit_address_space()) skip();
    /* BIG_N images of 64 x 64 px on disk (a few KB each), decoded at 256 x 256: 5x the limit */
    assert_true((uint64_t)BIG_N * 3 * BIG_SIZE * BIG_SIZE * sizeof(float) >= (uint64_t)5 * LIMIT_MB
                                                                                 << 20);
    static const char *const classes[] = {"a", "b", "c"};
    for (int c = 0; c < 3; c++) {
        mkdirs(at("big/%s", classes[c]));
        for (int i = 0; i < BIG_N / 3; i++)
            write_image(at("big/%s/%d.jpg", classes[c], i), 64, 64, (uint64_t)(c * 7919 + i),
                        false);
    }
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(fit_under_limit(at("big")));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* corefit train on a folder: streamed with --aug on 2 fork workers; a bad file stops it with its
 * name, unless --skip-bad. */
static void test_stream_cli(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#endif
    make_folder(at("cli"), 6);
    char cmd[2048];
    const char *common = "--load stream --aug --size 24 --epochs 1 --bs 4 --valid-pct 0.25 --quiet";
    snprintf(cmd, sizeof cmd, "%s/corefit train --images %s %s --cores 2 --out %s > %s 2>&1",
             CF_BUILD_DIR, at("cli"), common, at("m.safetensors"), at("log1"));
    assert_int_equal(system(cmd), 0);
    struct stat sb;
    assert_int_equal(stat(at("m.safetensors"), &sb), 0);
    FILE *f = fopen(at("cli/dog/003.jpg"), "w");
    assert_non_null(f);
    fputs("junk", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/corefit train --images %s %s --out %s > %s 2>&1", CF_BUILD_DIR,
             at("cli"), common, at("m2.safetensors"), at("log2"));
    assert_int_not_equal(system(cmd), 0);
    char log[4096] = "";
    f = fopen(at("log2"), "r");
    assert_non_null(f);
    size_t n = fread(log, 1, sizeof log - 1, f);
    log[n] = '\0';
    fclose(f);
    assert_non_null(strstr(log, "dog/003.jpg"));
    snprintf(cmd, sizeof cmd, "%s/corefit train --images %s %s --skip-bad --out %s > %s 2>&1",
             CF_BUILD_DIR, at("cli"), common, at("m3.safetensors"), at("log3"));
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stream_equals_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_random_resized_crop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_bad_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_csv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_under_address_space_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_cli, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
