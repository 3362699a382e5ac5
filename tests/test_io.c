/* safetensors files and model save/load: round trips, files read and written on the Python side
 * (json + numpy, tests/oracle/io.py), every kind of malformed file rejected with a clear message
 * and the model left unchanged, atomic writes, and a saved model loaded by torch. */
#include "oracle.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "corefit/io.h"
#include "corefit/nn.h"
#include "corefit/optim.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static void path_in(char *buf, size_t size, const oracle *o, const char *name) {
    snprintf(buf, size, "%s/%s", o->dir, name);
}

static void write_file(const char *path, const void *data, size_t n) {
    unlink(path); /* a fresh file: truncating one just written makes ext4 flush it */
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static unsigned char *read_whole(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* An image: 8-byte length, the header text, then `data_len` bytes of data (0x3f pattern). */
static unsigned char *make_image(const char *header, size_t data_len, size_t *size) {
    size_t h = strlen(header);
    *size = 8 + h + data_len;
    unsigned char *b = malloc(*size + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, 0x3f, data_len);
    return b;
}

/* Linear, BatchNorm1d, Linear: weights, biases, norm affine, buffers and a counter. */
static cf_model *small_model(uint64_t seed) {
    cf_module *c[3] = {cf_linear(4, 3, true), cf_batchnorm1d(3), cf_linear(3, 2, true)};
    cf_model *m;
    assert_int_equal(cf_model_new(&m, cf_sequential(3, c), seed), CF_OK);
    fill_uniform(m->weights, m->n_weights, seed + 1, -1.0f, 1.0f);
    fill_uniform(m->buffers, m->n_buffers, seed + 2, 0.5f, 2.0f);
    cf_param *nbt = cf_model_param(m, "1.num_batches_tracked");
    assert_non_null(nbt);
    nbt->data[0] = (float)(seed % 1000 + 7);
    return m;
}

typedef struct snapshot {
    float *w, *b;
    size_t nw, nb;
} snapshot;

static snapshot snap(const cf_model *m) {
    snapshot s = {malloc(m->n_weights * sizeof(float) + 4),
                  malloc(m->n_buffers * sizeof(float) + 4), m->n_weights, m->n_buffers};
    memcpy(s.w, m->weights, s.nw * sizeof(float));
    memcpy(s.b, m->buffers, s.nb * sizeof(float));
    return s;
}

static bool same(const cf_model *m, const snapshot *s) {
    return memcmp(m->weights, s->w, s->nw * sizeof(float)) == 0 &&
           memcmp(m->buffers, s->b, s->nb * sizeof(float)) == 0;
}

static void snap_free(snapshot *s) {
    free(s->w);
    free(s->b);
}

static int count_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* ---- safetensors round trips ---------------------------------------------------------------- */

typedef struct sample {
    float a[6], b[4], c[1], z[1], d[16];
    cf_st_entry e[5];
} sample;

static void make_sample(sample *s) {
    fill_uniform(s->a, 6, 1, -3.0f, 3.0f);
    const float b[4] = {-5.0f, 0.0f, 16777216.0f, 123456.0f};
    memcpy(s->b, b, sizeof b);
    s->c[0] = 0.25f;
    fill_uniform(s->d, 16, 2, -1.0f, 1.0f);
    s->e[0] = (cf_st_entry){"a", CF_DTYPE_F32, cf_shape2(2, 3), 6, s->a};
    s->e[1] = (cf_st_entry){"b.int", CF_DTYPE_I64, cf_shape1(4), 4, s->b};
    s->e[2] = (cf_st_entry){"c.scalar", CF_DTYPE_F32, {.ndim = 0}, 1, s->c};
    s->e[3] = (cf_st_entry){"empty", CF_DTYPE_F32, {.ndim = 2, .dim = {0, 3}}, 0, s->z};
    s->e[4] = (cf_st_entry){"d4", CF_DTYPE_F32, cf_shape4(1, 2, 2, 4), 16, s->d};
}

static const char *meta_k[2] = {"format", "note"};
static const char *meta_v[2] = {"pt", "caf\xc3\xa9 \"quoted\""};

static void check_sample(const cf_st_file *f, const sample *s) {
    assert_int_equal(f->n_entries, 5);
    for (int i = 0; i < 5; i++) {
        const cf_st_entry *e = cf_st_find(f, s->e[i].name);
        assert_non_null(e);
        assert_int_equal(e->dtype, s->e[i].dtype);
        assert_true(cf_shape_equal(&e->shape, &s->e[i].shape));
        assert_int_equal(e->numel, s->e[i].numel);
        if (e->numel) assert_memory_equal(e->data, s->e[i].data, e->numel * sizeof(float));
    }
    assert_null(cf_st_find(f, "nope"));
    assert_string_equal(cf_st_meta(f, "format"), "pt");
    assert_string_equal(cf_st_meta(f, "note"), meta_v[1]);
    assert_null(cf_st_meta(f, "absent"));
}

static void test_st_round_trip(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512];
    path_in(path, sizeof path, &o, "s.safetensors");
    sample s;
    make_sample(&s);
    assert_int_equal(cf_st_write(path, s.e, 5, meta_k, meta_v, 2), CF_OK);
    cf_st_file *f = NULL;
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    check_sample(f, &s);
    cf_st_free(f);
    /* data starts at a multiple of 8 */
    size_t n;
    unsigned char *raw = read_whole(path, &n);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | raw[i];
    assert_int_equal((8 + h) % 8, 0);
    free(raw);
    /* overwriting replaces the file; nothing else is left in the folder */
    assert_int_equal(cf_st_write(path, s.e, 1, NULL, NULL, 0), CF_OK);
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    assert_int_equal(f->n_entries, 1);
    assert_int_equal(f->n_meta, 0);
    cf_st_free(f);
    assert_int_equal(count_dir_entries(o.dir), 1);
    /* the writer refuses bad entries */
    cf_st_entry dup[2] = {s.e[0], s.e[0]};
    assert_int_equal(cf_st_write(path, dup, 2, NULL, NULL, 0), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "'a' appears twice"));
    cf_st_entry badn = s.e[0];
    badn.numel = 5;
    assert_int_equal(cf_st_write(path, &badn, 1, NULL, NULL, 0), CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "numel 5"));
    oracle_cleanup(&o);
}

static void test_st_python_reads_ours(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512], args[600];
    path_in(path, sizeof path, &o, "ours.safetensors");
    sample s;
    make_sample(&s);
    assert_int_equal(cf_st_write(path, s.e, 5, meta_k, meta_v, 2), CF_OK);
    snprintf(args, sizeof args, "read '%s'", path);
    oracle_run(&o, "io.py", args);
    char listing[512];
    path_in(listing, sizeof listing, &o, "read.txt");
    size_t n;
    char *text = (char *)read_whole(listing, &n);
    text[n] = '\0';
    assert_non_null(strstr(text, "a F32 2,3\n"));
    assert_non_null(strstr(text, "b.int I64 4\n"));
    assert_non_null(strstr(text, "c.scalar F32 \n"));
    assert_non_null(strstr(text, "empty F32 0,3\n"));
    assert_non_null(strstr(text, "d4 F32 1,2,2,4\n"));
    assert_non_null(strstr(text, "meta format pt\n"));
    free(text);
    for (int i = 0; i < 5; i++) {
        if (!s.e[i].numel) continue;
        char name[64];
        snprintf(name, sizeof name, "t_%s", s.e[i].name);
        cf_tensor t = oracle_get(&o, name);
        assert_memory_equal(t.data, s.e[i].data, s.e[i].numel * sizeof(float));
        free(t.data);
    }
    oracle_cleanup(&o);
}

static void test_st_reads_python_file(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    float a[12], b[3] = {-7.0f, 3.0f, 1000000.0f}, c[1] = {-1.5f};
    fill_uniform(a, 12, 3, -2.0f, 2.0f);
    oracle_put(&o, "a", a, cf_shape2(3, 4));
    oracle_put(&o, "b", b, cf_shape1(3));
    oracle_put(&o, "c", c, cf_shape1(1));
    char path[512], args[600];
    path_in(path, sizeof path, &o, "theirs.safetensors");
    snprintf(args, sizeof args, "write '%s'", path);
    oracle_run(&o, "io.py", args);
    cf_st_file *f = NULL;
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    assert_int_equal(f->n_entries, 3);
    const cf_st_entry *ea = cf_st_find(f, "a"), *eb = cf_st_find(f, "b"), *ec = cf_st_find(f, "c");
    assert_non_null(ea);
    assert_non_null(eb);
    assert_non_null(ec);
    cf_shape s34 = cf_shape2(3, 4);
    assert_true(cf_shape_equal(&ea->shape, &s34));
    assert_memory_equal(ea->data, a, sizeof a);
    assert_int_equal(eb->dtype, CF_DTYPE_I64);
    assert_memory_equal(eb->data, b, sizeof b);
    assert_int_equal(ec->shape.ndim, 0);
    assert_true(ec->data[0] == c[0]);
    assert_string_equal(cf_st_meta(f, "source"), "numpy");
    cf_st_free(f);
    oracle_cleanup(&o);
}

/* ---- model save / load ---------------------------------------------------------------------- */

static void train_steps(cf_model *m, cf_optimizer *opt, int steps, uint64_t seed) {
    for (int s = 0; s < steps; s++) {
        fill_uniform(m->grads, m->n_weights, seed + (uint64_t)s, -1.0f, 1.0f);
        cf_optimizer_step(opt);
    }
}

static void test_model_round_trip(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512];
    path_in(path, sizeof path, &o, "m.safetensors");
    cf_model *a = small_model(1), *b = small_model(2);
    cf_opt_config cfg = cf_opt_adam_defaults();
    cf_optimizer *oa, *ob;
    assert_int_equal(cf_optimizer_new(&oa, a, &cfg), CF_OK);
    assert_int_equal(cf_optimizer_new(&ob, b, &cfg), CF_OK);
    train_steps(a, oa, 3, 50);
    double lrs[1] = {3e-3};
    assert_int_equal(cf_optimizer_set_hyper(oa, "lr", lrs, 1), CF_OK);
    assert_int_equal(cf_model_save(a, oa, path), CF_OK);

    /* the file: state_dict names, num_batches_tracked an I64 scalar, optimizer entries */
    cf_st_file *f;
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    const cf_st_entry *nbt = cf_st_find(f, "1.num_batches_tracked");
    assert_non_null(nbt);
    assert_int_equal(nbt->dtype, CF_DTYPE_I64);
    assert_int_equal(nbt->shape.ndim, 0);
    assert_non_null(cf_st_find(f, "opt.0.weight.grad_avg"));
    assert_non_null(cf_st_find(f, "opt.1.bias.sqr_avg"));
    assert_non_null(cf_st_find(f, "opt.2.bias.step"));
    assert_null(cf_st_find(f, "opt.1.running_mean.step"));
    assert_string_equal(cf_st_meta(f, "format"), "pt");
    assert_string_equal(cf_st_meta(f, "corefit.optimizer"), "Adam");
    cf_st_free(f);

    /* load into another model and optimizer: identical state */
    assert_false(same(b, &(snapshot){a->weights, a->buffers, a->n_weights, a->n_buffers}));
    assert_int_equal(cf_model_load(b, ob, path), CF_OK);
    assert_memory_equal(a->weights, b->weights, a->n_weights * sizeof(float));
    assert_memory_equal(a->buffers, b->buffers, a->n_buffers * sizeof(float));
    assert_memory_equal(oa->grad_avg, ob->grad_avg, a->n_weights * sizeof(float));
    assert_memory_equal(oa->sqr_avg, ob->sqr_avg, a->n_weights * sizeof(float));
    assert_memory_equal(oa->steps, ob->steps, (size_t)a->n_params * sizeof(float));
    /* hypers come back exactly (from the metadata text; the tensor holds float32) */
    assert_memory_equal(oa->hypers, ob->hypers, (size_t)oa->n_groups * sizeof *oa->hypers);
    /* and they keep training alike */
    train_steps(a, oa, 2, 90);
    train_steps(b, ob, 2, 90);
    assert_memory_equal(a->weights, b->weights, a->n_weights * sizeof(float));

    /* hypers text that disagrees with the opt.hypers tensor is refused */
    assert_int_equal(cf_model_save(a, oa, path), CF_OK);
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    const char *mk[3] = {"format", "corefit.optimizer", "corefit.opt.hypers"};
    const char *mv[3] = {"pt", "Adam", "0.5 0.9 0.99 1e-5 0.01"};
    char other[600];
    snprintf(other, sizeof other, "%s.other", path);
    assert_int_equal(cf_st_write(other, f->entries, f->n_entries, mk, mv, 3), CF_OK);
    cf_st_free(f);
    fill_uniform(b->weights, b->n_weights, 76, -1, 1);
    snapshot pre = snap(b);
    assert_int_equal(cf_model_load(b, ob, other), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "corefit.opt.hypers value 0 (\"0.5"));
    assert_true(same(b, &pre));
    snap_free(&pre);

    /* a model-only file leaves the optimizer alone */
    assert_int_equal(cf_model_save(a, NULL, path), CF_OK);
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    assert_int_equal(f->n_entries, a->n_params);
    cf_st_free(f);
    float step0 = ob->steps[0];
    fill_uniform(b->weights, b->n_weights, 77, -1, 1);
    assert_int_equal(cf_model_load(b, ob, path), CF_OK);
    assert_memory_equal(a->weights, b->weights, a->n_weights * sizeof(float));
    assert_true(ob->steps[0] == step0);

    /* optimizer state of another kind is refused, and nothing changes */
    assert_int_equal(cf_model_save(a, oa, path), CF_OK);
    cf_opt_config sgd = cf_opt_sgd_defaults();
    sgd.hypers.mom = 0.9;
    cf_optimizer *os;
    assert_int_equal(cf_optimizer_new(&os, b, &sgd), CF_OK);
    fill_uniform(b->weights, b->n_weights, 78, -1, 1);
    snapshot before = snap(b);
    assert_int_equal(cf_model_load(b, os, path), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "holds Adam optimizer state but the optimizer is SGD"));
    assert_true(same(b, &before));
    snap_free(&before);
    cf_optimizer_free(os);

    cf_optimizer_free(oa);
    cf_optimizer_free(ob);
    cf_model_free(a);
    cf_model_free(b);
    oracle_cleanup(&o);
}

static void test_model_load_mismatch(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512];
    path_in(path, sizeof path, &o, "m.safetensors");
    cf_model *m = small_model(3);
    snapshot before = snap(m);
    float w[12] = {0}, x[1] = {0};

    /* a file from a different architecture */
    cf_module *c[1] = {cf_linear(4, 2, true)};
    cf_model *other;
    assert_int_equal(cf_model_new(&other, cf_sequential(1, c), 1), CF_OK);
    assert_int_equal(cf_model_save(other, NULL, path), CF_OK);
    assert_int_equal(cf_model_load(m, NULL, path), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), path));
    assert_non_null(strstr(cf_last_error(), "'0.weight' has shape (2, 4) in the file but (3, 4)"));
    assert_true(same(m, &before));
    cf_model_free(other);

    /* NaN and infinite weights: refused, naming the tensor and the element */
    cf_model *diverged = small_model(4);
    for (int k = 0; k < 2; k++) {
        diverged->weights[5] = k ? -INFINITY : NAN;
        assert_int_equal(cf_model_save(diverged, NULL, path), CF_OK);
        assert_int_equal(cf_model_load(m, NULL, path), CF_ERR_NONFINITE);
        assert_non_null(strstr(cf_last_error(), path));
        assert_non_null(strstr(cf_last_error(), k ? "an infinity at element" : "NaN at element"));
        assert_true(same(m, &before));
    }
    /* a negative running variance: refused, naming the tensor, the element and the value */
    diverged->weights[5] = 0.5f;
    cf_model_param(diverged, "1.running_var")->data[2] = -0.25f;
    assert_int_equal(cf_model_save(diverged, NULL, path), CF_OK);
    assert_int_equal(cf_model_load(m, NULL, path), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), path));
    assert_non_null(
        strstr(cf_last_error(), "'1.running_var' holds the negative variance -0.25 at element 2"));
    assert_true(same(m, &before));
    cf_model_free(diverged);

    /* a missing tensor */
    cf_st_entry e[1] = {{"0.weight", CF_DTYPE_F32, cf_shape2(3, 4), 12, w}};
    assert_int_equal(cf_st_write(path, e, 1, NULL, NULL, 0), CF_OK);
    assert_int_equal(cf_model_load(m, NULL, path), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "tensor '0.bias' (shape (3)) is missing"));
    assert_true(same(m, &before));

    /* an unexpected tensor (PyTorch's strict loading) */
    assert_int_equal(cf_model_save(m, NULL, path), CF_OK);
    cf_st_file *f;
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    cf_st_entry *all = calloc((size_t)f->n_entries + 1, sizeof *all);
    memcpy(all, f->entries, (size_t)f->n_entries * sizeof *all);
    all[f->n_entries] = (cf_st_entry){"extra", CF_DTYPE_F32, cf_shape1(1), 1, x};
    fill_uniform(m->weights, m->n_weights, 9, -1, 1); /* so that a load would show */
    snap_free(&before);
    before = snap(m);
    assert_int_equal(cf_st_write(path, all, f->n_entries + 1, NULL, NULL, 0), CF_OK);
    assert_int_equal(cf_model_load(m, NULL, path), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "unexpected tensor 'extra'"));
    assert_true(same(m, &before));
    free(all);
    cf_st_free(f);

    /* a missing file */
    path_in(path, sizeof path, &o, "absent.safetensors");
    assert_int_equal(cf_model_load(m, NULL, path), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), path));
    assert_true(same(m, &before));
    snap_free(&before);
    cf_model_free(m);
    oracle_cleanup(&o);
}

/* ---- malformed files ------------------------------------------------------------------------ */

/* Every truncation of a saved model is refused, by the parser and by cf_model_load. */
static void test_truncated_files(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512], cut[512];
    path_in(path, sizeof path, &o, "m.safetensors");
    path_in(cut, sizeof cut, &o, "cut.safetensors");
    cf_model *m = small_model(4);
    cf_optimizer *opt;
    cf_opt_config cfg = cf_opt_adam_defaults();
    assert_int_equal(cf_optimizer_new(&opt, m, &cfg), CF_OK);
    train_steps(m, opt, 1, 5);
    assert_int_equal(cf_model_save(m, opt, path), CF_OK);
    size_t size;
    unsigned char *img = read_whole(path, &size);
    fill_uniform(m->weights, m->n_weights, 11, -1, 1);
    snapshot before = snap(m);
    for (size_t len = 0; len < size; len++) {
        cf_st_file *f = (cf_st_file *)1;
        cf_status st = cf_st_parse(img, len, "cut", &f);
        if (st != CF_ERR_FORMAT)
            fail_msg("truncation to %zu of %zu bytes: status %d", len, size, st);
        assert_null(f);
        assert_non_null(strstr(cf_last_error(), "cut: "));
        write_file(cut, img, len);
        assert_int_equal(cf_model_load(m, opt, cut), CF_ERR_FORMAT);
        assert_true(same(m, &before));
    }
    /* the whole file still loads */
    cf_st_file *f;
    assert_int_equal(cf_st_parse(img, size, "whole", &f), CF_OK);
    cf_st_free(f);
    free(img);
    snap_free(&before);
    cf_optimizer_free(opt);
    cf_model_free(m);
    oracle_cleanup(&o);
}

/* Each header byte replaced by a few values: the load fails with a message and no change, or
 * succeeds (metadata edits) with exactly the saved weights. */
static void test_corrupted_header_bytes(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512], bad[512];
    path_in(path, sizeof path, &o, "m.safetensors");
    path_in(bad, sizeof bad, &o, "bad.safetensors");
    cf_model *m = small_model(5);
    snapshot saved = snap(m);
    assert_int_equal(cf_model_save(m, NULL, path), CF_OK);
    size_t size;
    unsigned char *img = read_whole(path, &size);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | img[i];
    const unsigned char values[] = {'{', '}', '"', '9', '-', ',', 0x00, 0xff, 'x', '['};
    int failures = 0, successes = 0;
    for (size_t at = 0; at < 8 + h; at++) {
        for (size_t v = 0; v < sizeof values; v++) {
            if (img[at] == values[v]) continue;
            unsigned char keep = img[at];
            img[at] = values[v];
            write_file(bad, img, size);
            fill_uniform(m->weights, m->n_weights, 1000 + at, -1, 1);
            snapshot before = snap(m);
            cf_status st = cf_model_load(m, NULL, bad);
            if (st == CF_OK) {
                assert_true(same(m, &saved));
                successes++;
            } else {
                if (!same(m, &before))
                    fail_msg("byte %zu = 0x%02x changed the model", at, values[v]);
                assert_non_null(strstr(cf_last_error(), bad));
                failures++;
            }
            snap_free(&before);
            img[at] = keep;
        }
    }
    assert_true(failures > 0);
    assert_true(successes > 0); /* e.g. the "format" metadata value */
    free(img);
    snap_free(&saved);
    cf_model_free(m);
    oracle_cleanup(&o);
}

typedef struct bad_case {
    const char *header;
    size_t data;
    const char *expect;
} bad_case;

static void test_specific_errors(void **state) {
    (void)state;
    const bad_case cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4,
         "not valid JSON: error at byte"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}xyz", 4,
         "unexpected byte 0x78 at byte"},
        {"[1,2]", 0, "must start with '{', found byte 0x5b"},
        {"{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a': dtype F16 is not supported"},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a': unknown dtype \"Q4\""},
        {"{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "\"dtype\" must be a string, got 7"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,400]}}", 4,
         "tensor 'a': data_offsets [0, 400] run past the data area of 4 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
         "data_offsets [4, 0] begin after end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
         "data_offsets[0] is -4"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 4,
         "data_offsets[1] is 4.5"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
         "\"data_offsets\" must be an array [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a': shape (2) of dtype F32 needs 8 bytes but data_offsets [0, 4] hold 4"},
        {"{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "of dtype I64 needs 8 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
         "shape has 5 dimensions"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
         "shape dimension 0 is -1"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2147483647,2147483647,2147483647,2147483647],"
         "\"data_offsets\":[0,4]}}",
         4, "needs more than"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":\"3\",\"data_offsets\":[0,4]}}", 4,
         "\"shape\" must be an array"},
        {"{\"a\":5}", 0, "tensor 'a': expected an object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "tensor 'a' appears twice"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "tensor 'b': data_offsets [4, 8] overlap tensor 'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, "bytes 4..8 of the data area"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
         "bytes 4..8 of the data area"},
        {"{\"__metadata__\":{\"format\":1}}", 0, "metadata \"format\" must be a string"},
        {"{\"__metadata__\":[]}", 0, "\"__metadata__\" must be an object"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        size_t size;
        unsigned char *img = make_image(cases[i].header, cases[i].data, &size);
        cf_st_file *f = NULL;
        cf_status st = cf_st_parse(img, size, "case.st", &f);
        if (st != CF_ERR_FORMAT || !strstr(cf_last_error(), cases[i].expect) ||
            strncmp(cf_last_error(), "case.st: ", 9) != 0)
            fail_msg("case %d (%s): status %d, message \"%s\", expected \"%s\"", i, cases[i].header,
                     st, cf_last_error(), cases[i].expect);
        assert_null(f);
        free(img);
    }
    /* header lengths */
    unsigned char img[16] = {0};
    cf_st_file *f = NULL;
    assert_int_equal(cf_st_parse(img, 7, "x.st", &f), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "7 bytes is too short"));
    img[7] = 0x40; /* 2^62 */
    assert_int_equal(cf_st_parse(img, 16, "x.st", &f), CF_ERR_FORMAT);
    assert_non_null(
        strstr(cf_last_error(), "header length 4611686018427387904 (bytes 0..7) is absurd"));
    assert_non_null(strstr(cf_last_error(), "x.st: not a safetensors file: header length"));
    /* files given in place of a model say what they are */
    static const struct {
        const char *bytes;
        const char *what;
    } others[] = {
        {"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01", "it is a JPEG image"},
        {"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "it is a PNG image"},
        {"PK\x03\x04\x00\x00\x08\x08\x00\x00\x00\x00\x00\x00\x00", "tools/convert_pth.py"},
    };
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        assert_int_equal(cf_st_parse((const unsigned char *)others[i].bytes, 16, "x.jpg", &f),
                         CF_ERR_FORMAT);
        if (!strstr(cf_last_error(), "x.jpg: not a safetensors file: ") ||
            !strstr(cf_last_error(), others[i].what))
            fail_msg("case %zu: \"%s\"", i, cf_last_error());
    }
    img[7] = 0;
    img[0] = 9;
    assert_int_equal(cf_st_parse(img, 16, "x.st", &f), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "header length 9 (bytes 0..7) runs past the end"));
    /* a valid minimal file with an empty header object and metadata only */
    size_t size;
    unsigned char *ok = make_image("{\"__metadata__\":{\"k\":\"v\"}}  ", 0, &size);
    assert_int_equal(cf_st_parse(ok, size, "ok.st", &f), CF_OK);
    assert_int_equal(f->n_entries, 0);
    assert_string_equal(cf_st_meta(f, "k"), "v");
    cf_st_free(f);
    free(ok);
}

/* ---- atomic writes ------------------------------------------------------------------------- */

/* The writer refuses a header that the reader would refuse (over 100 MiB of JSON), naming the
 * metadata value that makes it so, and writes nothing. */
static void test_writer_keeps_to_the_readers_limits(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512];
    path_in(path, sizeof path, &o, "big-header.safetensors");
    size_t n = (size_t)101 << 20;
    char *value = malloc(n + 1);
    assert_non_null(value);
    memset(value, 'v', n);
    value[n] = '\0';
    float x[2] = {1, 2};
    cf_st_entry e = {
        .name = "w", .dtype = CF_DTYPE_F32, .shape = cf_shape1(2), .numel = 2, .data = x};
    const char *keys[] = {"small", "vocab"}, *values[] = {"1", value};
    assert_int_equal(cf_st_write(path, &e, 1, keys, values, 2), CF_ERR_INVALID);
    if (!strstr(cf_last_error(), "over the limit") || !strstr(cf_last_error(), "'vocab'"))
        fail_msg("unclear message: %s", cf_last_error());
    assert_int_equal(access(path, F_OK), -1);
    /* Just under the limit: written and read back. */
    value[(size_t)99 << 20] = '\0';
    assert_int_equal(cf_st_write(path, &e, 1, keys, values, 2), CF_OK);
    cf_st_file *f = NULL;
    assert_int_equal(cf_st_read(path, &f), CF_OK);
    cf_st_free(f);
    free(value);
    oracle_cleanup(&o);
}

/* A save's target is checked before a long job: missing folder, a directory, a read-only
 * folder (unless root, who may write anyway); nothing is left behind. */
static void test_check_writable(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512], ro[512];
    path_in(path, sizeof path, &o, "m.safetensors");
    assert_int_equal(cf_st_check_writable(path), CF_OK);
    assert_int_equal(access(path, F_OK), -1);
    DIR *d = opendir(o.dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));) entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 0);
    path_in(path, sizeof path, &o, "missing/m.safetensors");
    assert_int_equal(cf_st_check_writable(path), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), "missing/m.safetensors"));
    assert_non_null(strstr(cf_last_error(), "No such file"));
    assert_int_equal(cf_st_check_writable(o.dir), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), "is a directory"));
    path_in(ro, sizeof ro, &o, "ro");
    assert_int_equal(mkdir(ro, 0500), 0);
    path_in(path, sizeof path, &o, "ro/m.safetensors");
    if (geteuid() != 0) {
        assert_int_equal(cf_st_check_writable(path), CF_ERR_IO);
        assert_non_null(strstr(cf_last_error(), "Permission denied"));
    }
    chmod(ro, 0700);
    oracle_cleanup(&o);
}

static void test_atomic_write(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    char path[512];
    path_in(path, sizeof path, &o, "m.safetensors");
    cf_model *m = small_model(6);
    snapshot old = snap(m);
    assert_int_equal(cf_model_save(m, NULL, path), CF_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    fill_uniform(m->weights, m->n_weights, 12, -1, 1);
    cf_optimizer *opt;
    cf_opt_config cfg = cf_opt_adam_defaults();
    assert_int_equal(cf_optimizer_new(&opt, m, &cfg), CF_OK);

    /* A child whose file size limit is smaller than the new file: the write fails midway. */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {(rlim_t)sb.st_size / 2, (rlim_t)sb.st_size / 2};
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        cf_status st = cf_model_save(m, opt, path);
        if (st != CF_ERR_IO) _exit(1);
        if (!strstr(cf_last_error(), path) || !strstr(cf_last_error(), "File too large")) {
            fprintf(stderr, "unexpected message: %s\n", cf_last_error());
            _exit(2);
        }
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(count_dir_entries(o.dir), 1); /* no temporary file left */
    cf_model *back = small_model(60);
    assert_int_equal(cf_model_load(back, NULL, path), CF_OK);
    assert_true(same(back, &old));

    /* A folder that does not exist. */
    char missing[600];
    snprintf(missing, sizeof missing, "%s/no/such/dir/m.safetensors", o.dir);
    assert_int_equal(cf_model_save(m, NULL, missing), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), missing));
    /* A target that is a folder: the rename fails and the temporary file goes. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/adir", o.dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(cf_model_save(m, NULL, dir), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), "cannot rename"));
    assert_int_equal(count_dir_entries(o.dir), 2);
    assert_int_equal(rmdir(dir), 0);
    /* the old file is still the old one, and a good save replaces it */
    assert_int_equal(cf_model_load(back, NULL, path), CF_OK);
    assert_true(same(back, &old));
    assert_int_equal(cf_model_save(m, NULL, path), CF_OK);
    assert_int_equal(cf_model_load(back, NULL, path), CF_OK);
    assert_memory_equal(back->weights, m->weights, m->n_weights * sizeof(float));
    assert_int_equal(count_dir_entries(o.dir), 1);

    snap_free(&old);
    cf_optimizer_free(opt);
    cf_model_free(back);
    cf_model_free(m);
    oracle_cleanup(&o);
}

/* ---- W1: a model saved by corefit loads into the equivalent PyTorch module ----------------- */

/* Saves m (with an Adam state, which torch must not need), runs it in eval mode on x and checks
 * that torch, loading the file with load_state_dict(strict=True), gives the same outputs. */
static void check_torch_loads(cf_model *m, const char *arch, cf_shape xs) {
    oracle o;
    oracle_init(&o);
    /* BatchNorm affine and running statistics away from their defaults */
    for (int i = 0; i < m->n_params; i++) {
        cf_param *p = m->params[i];
        if (p->kind == CF_PARAM_NORM)
            fill_uniform(p->data, p->numel, 100 + (uint64_t)i, 0.5f, 1.5f);
        if (p->kind == CF_PARAM_BUFFER)
            fill_uniform(p->data, p->numel, 200 + (uint64_t)i,
                         strstr(p->full_name, "running_var") ? 0.5f : -0.5f, 1.5f);
        if (p->kind == CF_PARAM_COUNTER) p->data[0] = 17.0f;
    }
    cf_optimizer *opt;
    cf_opt_config cfg = cf_opt_adam_defaults();
    assert_int_equal(cf_optimizer_new(&opt, m, &cfg), CF_OK);
    char path[512], args[600];
    path_in(path, sizeof path, &o, "model.safetensors");
    assert_int_equal(cf_model_save(m, opt, path), CF_OK);

    size_t n = cf_shape_numel(&xs);
    float *x = malloc(n * sizeof(float));
    fill_uniform(x, n, 7, -1.0f, 1.0f);
    cf_tensor xt = cf_tensor_view(x, xs);
    cf_model_train(m, false);
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_OK);
    oracle_put(&o, "x", x, xs);
    snprintf(args, sizeof args, "torch '%s' %s", path, arch);
    oracle_run(&o, "io.py", args);
    cf_tensor ref = oracle_get(&o, "y");
    assert_true(cf_shape_equal(&ref.shape, &y->shape));
    char what[128];
    snprintf(what, sizeof what, "eval outputs of the saved %s in torch", arch);
    assert_close(what, y->data, ref.data, cf_tensor_numel(y), 1e-4, 1e-5);
    free(ref.data);
    free(x);
    cf_optimizer_free(opt);
    oracle_cleanup(&o);
}

static void test_torch_loads_saved_model(void **state) {
    (void)state;
    cf_module *c[9] = {
        cf_conv2d(3, 8, 3, 1, 1, false), cf_batchnorm2d(8),  cf_relu(),
        cf_conv2d(8, 6, 3, 2, 1, true),  cf_relu(),          cf_flatten(),
        cf_linear(6 * 4 * 4, 10, true),  cf_batchnorm1d(10), cf_linear(10, 5, true),
    };
    cf_model *m;
    assert_int_equal(cf_model_new(&m, cf_sequential(9, c), 42), CF_OK);
    check_torch_loads(m, "small", cf_shape4(2, 3, 8, 8));
    cf_model_free(m);
}

/* W1, the mini-resnet, as the fit would save it. */
static void test_torch_loads_saved_w1(void **state) {
    (void)state;
    cf_model *m;
    assert_int_equal(cf_model_new(&m, cf_mini_resnet(1, 10), 43), CF_OK);
    check_torch_loads(m, "mini_resnet", cf_shape4(4, 1, 28, 28));
    cf_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_st_round_trip),
        cmocka_unit_test(test_st_python_reads_ours),
        cmocka_unit_test(test_st_reads_python_file),
        cmocka_unit_test(test_model_round_trip),
        cmocka_unit_test(test_model_load_mismatch),
        cmocka_unit_test(test_truncated_files),
        cmocka_unit_test(test_corrupted_header_bytes),
        cmocka_unit_test(test_specific_errors),
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_writer_keeps_to_the_readers_limits),
        cmocka_unit_test(test_check_writable),
        cmocka_unit_test(test_torch_loads_saved_model),
        cmocka_unit_test(test_torch_loads_saved_w1),
    };
    if (getenv("CF_TEST_FILTER")) cmocka_set_test_filter(getenv("CF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
