/* Readers: IDX (raw and gzip'd), CSV tables with fastai's tabular processing, image folders;
 * and every kind of bad input, checked for its message. */
#include "child.h"
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "corefit/data.h"

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#endif

static char tmp[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/cf-data-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *at(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", tmp, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n, bool gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, data, (unsigned)n), (int)n);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, n, f), n);
        fclose(f);
    }
}

static void expect_error(cf_status st, cf_status want, const char *a, const char *b) {
    if (st != want)
        fail_msg("status %d (%s), wanted %d; message: %s", st, cf_status_str(st), want,
                 cf_last_error());
    if (a && !strstr(cf_last_error(), a)) fail_msg("'%s' not in: %s", a, cf_last_error());
    if (b && !strstr(cf_last_error(), b)) fail_msg("'%s' not in: %s", b, cf_last_error());
}

/* IDX header + payload. */
static size_t make_idx(uint8_t *buf, int ndim, const uint32_t *dims, const uint8_t *data) {
    buf[0] = buf[1] = 0;
    buf[2] = 8;
    buf[3] = (uint8_t)ndim;
    size_t n = 1, k = 4;
    for (int i = 0; i < ndim; i++) {
        buf[k++] = (uint8_t)(dims[i] >> 24);
        buf[k++] = (uint8_t)(dims[i] >> 16);
        buf[k++] = (uint8_t)(dims[i] >> 8);
        buf[k++] = (uint8_t)dims[i];
        n *= dims[i];
    }
    if (data) memcpy(buf + k, data, n);
    return k + (data ? n : 0);
}

static void test_idx(void **state) {
    (void)state;
    uint8_t pix[5 * 3 * 2], lab[5] = {2, 0, 1, 2, 4};
    for (int i = 0; i < 30; i++) pix[i] = (uint8_t)(i * 8);
    uint8_t im[64], lb[32];
    size_t nim = make_idx(im, 3, (uint32_t[]){5, 3, 2}, pix);
    size_t nlb = make_idx(lb, 1, (uint32_t[]){5}, lab);
    for (int gz = 0; gz < 2; gz++) {
        write_bytes(at("im"), im, nim, gz);
        write_bytes(at("lb"), lb, nlb, gz);
        cf_dataset *ds;
        assert_int_equal(cf_dataset_from_idx(at("im"), at("lb"), &ds), CF_OK);
        assert_int_equal(ds->n, 5);
        assert_int_equal(ds->sample_shape.ndim, 3);
        assert_int_equal(ds->sample_shape.dim[1], 3);
        assert_int_equal(ds->sample_shape.dim[2], 2);
        assert_int_equal(ds->n_classes, 5);
        for (int i = 0; i < 30; i++) assert_true(fabsf(ds->x[i] - pix[i] / 255.0f) < 1e-7f);
        for (int i = 0; i < 5; i++) assert_true(ds->y[i] == lab[i]);
        cf_dataset_free(ds);
    }
    cf_dataset *ds = (cf_dataset *)1;
    test_stderr_capture();
    assert_int_equal(cf_dataset_from_idx_memory(im, nim, lb, nlb, "mem", &ds), CF_OK);
    char *quiet = test_stderr_release();
    assert_string_equal(quiet, ""); /* five classes, four seen: no warning */
    free(quiet);
    assert_int_equal(ds->n, 5);
    cf_dataset_free(ds);

    /* a label of 255 among 0..2 makes 256 classes, four of them seen: a warning naming it */
    uint8_t stray[5] = {0, 1, 255, 2, 1};
    nlb = make_idx(lb, 1, (uint32_t[]){5}, stray);
    test_stderr_capture();
    assert_int_equal(cf_dataset_from_idx_memory(im, nim, lb, nlb, "mem", &ds), CF_OK);
    char *warned = test_stderr_release();
    assert_int_equal(ds->n_classes, 256);
    assert_non_null(strstr(warned, "warning"));
    assert_non_null(strstr(warned, "labels run to 255"));
    assert_non_null(strstr(warned, "only 4 distinct labels"));
    free(warned);
    cf_dataset_free(ds);
    nlb = make_idx(lb, 1, (uint32_t[]){5}, lab);

    /* Missing file. */
    expect_error(cf_dataset_from_idx(at("nope"), at("lb"), &ds), CF_ERR_IO, at("nope"),
                 "No such file");
    assert_null(ds);
    /* Wrong magic number. */
    uint8_t bad[64];
    memcpy(bad, im, nim);
    bad[0] = 0x12, bad[1] = 0x34, bad[2] = 0x56, bad[3] = 0x78;
    for (int gz = 0; gz < 2; gz++) {
        write_bytes(at("bad"), bad, nim, gz);
        expect_error(cf_dataset_from_idx(at("bad"), at("lb"), &ds), CF_ERR_FORMAT, "0x12345678",
                     at("bad"));
        assert_null(ds);
    }
    bad[0] = 0, bad[1] = 0, bad[2] = 0x0D, bad[3] = 3; /* floats */
    write_bytes(at("bad"), bad, nim, false);
    expect_error(cf_dataset_from_idx(at("bad"), at("lb"), &ds), CF_ERR_FORMAT, "0x0d",
                 "not supported");
    /* Truncated: raw, gzip'd, and a gzip stream cut short. */
    write_bytes(at("short"), im, nim - 3, false);
    expect_error(cf_dataset_from_idx(at("short"), at("lb"), &ds), CF_ERR_FORMAT, at("short"),
                 "need 30 bytes of data, there are 27");
    write_bytes(at("short"), im, nim - 3, true);
    expect_error(cf_dataset_from_idx(at("short"), at("lb"), &ds), CF_ERR_FORMAT, "truncated",
                 "byte offset 43");
    write_bytes(at("short"), im, 10, false);
    expect_error(cf_dataset_from_idx(at("short"), at("lb"), &ds), CF_ERR_FORMAT, "truncated header",
                 at("short"));
    {
        /* A gzip file cut in its middle. */
        uint8_t big[4096 + 16];
        for (int i = 0; i < 4096; i++) big[16 + i] = (uint8_t)(i * 7919 >> 3);
        make_idx(big, 3, (uint32_t[]){4, 32, 32}, NULL);
        write_bytes(at("cut.gz"), big, sizeof big, true);
        struct stat sb;
        assert_int_equal(stat(at("cut.gz"), &sb), 0);
        assert_int_equal(truncate(at("cut.gz"), sb.st_size / 2), 0);
        expect_error(cf_dataset_from_idx(at("cut.gz"), at("lb"), &ds), CF_ERR_FORMAT, "truncated",
                     at("cut.gz"));
    }
    {
        /* A bad CRC-32 in the gzip trailer (the data itself complete): named as such, with the
         * trailer's offset; a damaged byte in the compressed data: named as corrupt data. */
        write_bytes(at("crc.gz"), im, nim, true);
        struct stat sb;
        assert_int_equal(stat(at("crc.gz"), &sb), 0);
        FILE *f = fopen(at("crc.gz"), "r+b");
        assert_non_null(f);
        fseek(f, sb.st_size - 8, SEEK_SET);
        int c = fgetc(f);
        fseek(f, sb.st_size - 8, SEEK_SET);
        fputc(c ^ 0xFF, f);
        fclose(f);
        char want[64];
        snprintf(want, sizeof want, "trailer at byte offset %lld", (long long)sb.st_size - 8);
        expect_error(cf_dataset_from_idx(at("crc.gz"), at("lb"), &ds), CF_ERR_FORMAT,
                     "corrupt gzip file: incorrect data check", want);
        assert_null(ds);
        /* --limit: only the first images, raw and gzip'd. */
        for (int gz = 0; gz < 2; gz++) {
            write_bytes(at("im"), im, nim, gz);
            write_bytes(at("lb"), lb, nlb, gz);
            assert_int_equal(cf_dataset_from_idx_first(at("im"), at("lb"), 2, &ds), CF_OK);
            assert_int_equal(ds->n, 2);
            for (int i = 0; i < 12; i++) assert_true(fabsf(ds->x[i] - pix[i] / 255.0f) < 1e-7f);
            for (int i = 0; i < 2; i++) assert_true(ds->y[i] == lab[i]);
            cf_dataset_free(ds);
            ds = NULL;
        }
        expect_error(cf_dataset_from_idx_first(at("im"), at("lb"), -1, &ds), CF_ERR_INVALID,
                     "max_items = -1", NULL);
        cf_idx first;
        assert_int_equal(cf_idx_read_first(at("im"), 3, &first), CF_OK);
        assert_int_equal(first.dim[0], 3);
        assert_int_equal(memcmp(first.data, pix, 18), 0);
        cf_idx_free(&first);
    }
    /* Image/label count mismatch. */
    size_t n4 = make_idx(lb, 1, (uint32_t[]){4}, lab);
    write_bytes(at("lb4"), lb, n4, true);
    expect_error(cf_dataset_from_idx(at("im"), at("lb4"), &ds), CF_ERR_FORMAT, "5 images",
                 "4 labels");
    /* Absurd sizes (10^12 images) are refused before allocating: raw and gzip'd. */
    uint8_t hdr[16];
    size_t nh = make_idx(hdr, 3, (uint32_t[]){1000000, 1000000, 1}, NULL);
    write_bytes(at("huge"), hdr, nh, false);
    expect_error(cf_dataset_from_idx(at("huge"), at("lb"), &ds), CF_ERR_FORMAT,
                 "(1000000 x 1000000 x 1) need 1000000000000 bytes", "there are 0");
    write_bytes(at("huge"), hdr, nh, true);
    expect_error(cf_dataset_from_idx(at("huge"), at("lb"), &ds), CF_ERR_FORMAT, "gzip", at("huge"));
    /* Trailing bytes in memory; zero dimension. */
    uint8_t more[64];
    memcpy(more, im, nim);
    more[nim] = 1;
    cf_idx idx;
    expect_error(cf_idx_parse(more, nim + 1, "m", &idx), CF_ERR_FORMAT, "31 bytes", "say 30");
    expect_error(cf_idx_parse(im, nim - 1, "m", &idx), CF_ERR_FORMAT, "truncated", "need 30");
    nh = make_idx(hdr, 1, (uint32_t[]){0}, NULL);
    expect_error(cf_idx_parse(hdr, nh, "z", &idx), CF_ERR_FORMAT, "dimension 0", "is 0");
    /* Labels must be idx1, images idx2/idx3. */
    expect_error(cf_dataset_from_idx(at("im"), at("im"), &ds), CF_ERR_FORMAT, "idx1", at("im"));
}

/* ---- CSV ---------------------------------------------------------------------------------- */

static const char *fixture = "id,city,grade,age,income,note,label\n"
                             "1,\"Paris, FR\",B,34,52000.5,\"said \"\"hi\"\"\",yes\n"
                             "2,Berlin,A,,61000,plain,no\r\n"
                             "3,Oslo,,45,,x,yes\n"
                             "4,\"Paris, FR\",C,29,48000,y,no\n"
                             "5,Berlin,B,51,NA,\"multi\nline\",yes\n"
                             "\n"
                             "6,Rome,A,38,55000,z,no\n"
                             "7,Lisbon,B,,70000,w,yes\n"
                             "8,Madrid,C, 41 ,39000,v,no\n";

static void test_csv_table(void **state) {
    (void)state;
    cf_csv_table *t;
    assert_int_equal(cf_csv_parse_buffer(fixture, strlen(fixture), "fx.csv", ',', &t), CF_OK);
    assert_int_equal(t->n_cols, 7);
    assert_int_equal(t->n_rows, 8);
    assert_string_equal(t->header[6], "label");
    assert_string_equal(t->cells[0 * 7 + 1], "Paris, FR");
    assert_string_equal(t->cells[0 * 7 + 5], "said \"hi\"");
    assert_string_equal(t->cells[1 * 7 + 6], "no");
    assert_string_equal(t->cells[4 * 7 + 5], "multi\nline");
    assert_string_equal(t->cells[2 * 7 + 2], "");
    assert_int_equal(t->row_line[5], 9); /* after the two-line field and the blank line */
    cf_csv_table_free(t);
    /* No final newline; a trailing empty field. */
    const char *s = "a,b\n1,";
    assert_int_equal(cf_csv_parse_buffer(s, strlen(s), "s", ',', &t), CF_OK);
    assert_int_equal(t->n_rows, 1);
    assert_string_equal(t->cells[1], "");
    cf_csv_table_free(t);
}

/* One processor: the training sets are cf_tabular_fit + cf_tabular_apply; the state a data set
 * carries (as a model file does) reads back and encodes new rows as training did, numeric
 * categories matched as in training (a number written otherwise is a category of its own). */
static void test_tabular_state(void **state) {
    (void)state;
    const char *text = "k,v,y\n"
                       "1,0.5,a\n"
                       "2, 1.5 ,b\n"
                       "10,NA,a\n"
                       "2,2.5,b\n"
                       "1,,a\n"
                       "3,4,b\n";
    cf_csv_table *t;
    assert_int_equal(cf_csv_parse_buffer(text, strlen(text), "st", ',', &t), CF_OK);
    assert_int_equal(cf_csv_column(t, "v"), 1);
    assert_int_equal(cf_csv_column(t, "missing"), -1);
    const char *cats[] = {"k"}, *conts[] = {"v"};
    int64_t vrows[] = {5};
    cf_tabular_options o = {.cat_names = cats,
                            .n_cat = 1,
                            .cont_names = conts,
                            .n_cont = 1,
                            .y_name = "y",
                            .valid_idx = vrows,
                            .n_valid_idx = 1};
    cf_dataset *tr, *va;
    assert_int_equal(cf_tabular_from_table(t, &o, &tr, &va), CF_OK);
    int64_t rows[] = {0, 1, 2, 3, 4};
    cf_tabular_state fit;
    assert_int_equal(cf_tabular_fit(t, &o, rows, 5, &fit), CF_OK);
    assert_int_equal(fit.n_cat, 2); /* k, v_na */
    assert_string_equal(fit.flag_of[1], "v");
    assert_null(fit.flag_of[0]);
    assert_string_equal(fit.cat_vocab[0][3], "10"); /* sorted by value: 1, 2, 10 */
    float x[5 * 3], y[5];
    int64_t unseen = -1;
    assert_int_equal(cf_tabular_apply(&fit, t, rows, 5, true, x, y, &unseen), CF_OK);
    assert_int_equal(unseen, 0);
    assert_memory_equal(x, tr->x, sizeof x);
    assert_memory_equal(y, tr->y, sizeof y);
    assert_true(x[2 * 3 + 1] == 2.0f && x[0 * 3 + 1] == 1.0f); /* NA flagged True, else False */
    /* the state a data set carries, as an exported model: the same codes, values within float
     * rounding of the statistics */
    cf_tabular_state back;
    assert_int_equal(cf_tabular_state_load(tr, &back), CF_OK);
    assert_string_equal(back.flag_of[1], "v");
    assert_string_equal(back.y_vocab[1], "b");
    const char *fresh = "y,v,k\n"
                        "b,7,2\n"
                        "a,,2.0\n"
                        "a,1,4\n";
    cf_csv_table *u;
    assert_int_equal(cf_csv_parse_buffer(fresh, strlen(fresh), "fresh", ',', &u), CF_OK);
    cf_dataset *enc;
    assert_int_equal(cf_tabular_dataset(&back, u, NULL, 3, true, &enc), CF_OK);
    assert_int_equal(enc->n_unseen, 2); /* "2.0" is not the category "2"; 4 was never seen */
    assert_true(enc->x[0] == 2.0f && enc->x[3] == 0.0f && enc->x[6] == 0.0f);
    assert_true(enc->x[1] == 1.0f && enc->x[4] == 2.0f);
    double want = (7 - fit.cont_mean[0]) / fit.cont_std[0];
    assert_true(fabs(enc->x[2] - want) < 1e-5);
    assert_true(enc->y[0] == 1.0f && enc->y[1] == 0.0f);
    cf_dataset_free(enc);
    /* bad cells are named with their line */
    const char *bad = "y,v,k\nb,x1,2\n";
    cf_csv_table *w;
    assert_int_equal(cf_csv_parse_buffer(bad, strlen(bad), "bad", ',', &w), CF_OK);
    assert_int_equal(cf_tabular_dataset(&back, w, NULL, 1, false, &enc), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "bad: line 2, continuous column 'v': 'x1'"));
    cf_csv_table_free(w);
    cf_tabular_state_free(&back);
    cf_tabular_state_free(&fit);
    cf_csv_table_free(u);
    cf_csv_table_free(t);
    cf_dataset_free(tr);
    cf_dataset_free(va);
}

static void test_tabular_against_numpy(void **state) {
    (void)state;
    write_bytes(at("fx.csv"), fixture, strlen(fixture), false);
    const char *cats[] = {"city", "grade"}, *conts[] = {"age", "income"};
    int64_t vrows[] = {1, 6};
    cf_tabular_options o = {.cat_names = cats,
                            .n_cat = 2,
                            .cont_names = conts,
                            .n_cont = 2,
                            .y_name = "label",
                            .valid_idx = vrows,
                            .n_valid_idx = 2};
    cf_dataset *tr, *va;
    assert_int_equal(cf_tabular_from_csv(at("fx.csv"), &o, &tr, &va), CF_OK);
    oracle orc;
    oracle_init(&orc);
    char args[600];
    snprintf(args, sizeof args, "%s city,grade age,income label 1,6", at("fx.csv"));
    oracle_run(&orc, "data_tabular.py", args);
    /* Layout: city, grade, income_na (age has no missing value in training), age, income. */
    assert_int_equal(tr->n, 6);
    assert_int_equal(va->n, 2);
    assert_int_equal(tr->n_cat, 3);
    assert_int_equal(tr->n_cont, 2);
    assert_int_equal(tr->sample_shape.dim[0], 5);
    assert_string_equal(tr->feature_names[2], "income_na");
    assert_string_equal(tr->feature_names[3], "age");
    assert_string_equal(tr->cat_vocab[0][0], "#na#");
    assert_string_equal(tr->cat_vocab[0][1], "Berlin");
    assert_string_equal(tr->cat_vocab[0][4], "Paris, FR");
    assert_int_equal(tr->n_classes, 2);
    assert_string_equal(tr->vocab[0], "no");
    assert_string_equal(va->vocab[1], "yes");
    cf_tensor card = oracle_get(&orc, "cardinality");
    assert_int_equal(card.shape.dim[0], 3);
    for (int j = 0; j < 3; j++) assert_int_equal(tr->cat_cardinality[j], (int)card.data[j]);
    free(card.data);
    const char *names[2] = {"train", "valid"};
    cf_dataset *sets[2] = {tr, va};
    for (int p = 0; p < 2; p++) {
        char nm[32];
        snprintf(nm, sizeof nm, "%s_x", names[p]);
        cf_tensor x = oracle_get(&orc, nm);
        assert_int_equal(x.shape.dim[1], 5);
        assert_close(nm, sets[p]->x, x.data, cf_tensor_numel(&x), 1e-5, 1e-5);
        free(x.data);
        snprintf(nm, sizeof nm, "%s_y", names[p]);
        cf_tensor y = oracle_get(&orc, nm);
        assert_memory_equal(y.data, sets[p]->y, (size_t)sets[p]->n * sizeof(float));
        free(y.data);
    }
    /* Statistics kept for new data: the median fill of income over the training rows. */
    assert_true(fabsf(tr->cont_fill[1] - 50000.25f) < 1e-2f);
    /* Lisbon (unseen) gets #na#; the missing age in validation is filled, not flagged. */
    assert_true(va->x[5 + 0] == 0.0f);
    oracle_cleanup(&orc);
    cf_dataset_free(tr);
    cf_dataset_free(va);
    /* Regression target, random split, numeric categories sorted by value. */
    const char *cats2[] = {"id"};
    cf_tabular_options r = {.cat_names = cats2,
                            .n_cat = 1,
                            .cont_names = conts,
                            .n_cont = 1,
                            .y_name = "id",
                            .y_regression = true,
                            .valid_pct = 0.25,
                            .seed = 3};
    assert_int_equal(cf_tabular_from_csv_buffer(fixture, strlen(fixture), "fx", &r, &tr, &va),
                     CF_OK);
    assert_int_equal(tr->n, 6);
    assert_int_equal(va->n, 2);
    assert_int_equal(tr->n_classes, 0);
    for (int64_t i = 0; i < tr->n; i++) {
        int id = (int)tr->y[i];
        int code = (int)tr->x[i * tr->sample_shape.dim[0]];
        char want[4] = {(char)('0' + id), 0};
        assert_string_equal(tr->cat_vocab[0][code], want);
    }
    for (int j = 2; j < tr->cat_cardinality[0]; j++)
        assert_true(atoi(tr->cat_vocab[0][j - 1]) < atoi(tr->cat_vocab[0][j]));
    cf_dataset_free(tr);
    cf_dataset_free(va);
    /* cf_dls_from_csv: tabular batches (n_cat codes then n_cont values). */
    cf_dls *dls;
    assert_int_equal(cf_dls_from_csv(at("fx.csv"), &o, &(cf_dls_options){.bs = 4}, &dls), CF_OK);
    assert_int_equal(cf_dataloader_len(dls->train), 1);
    assert_int_equal(cf_dataloader_len(dls->valid), 1);
    cf_dls_free(dls);
}

static void test_csv_bad_input(void **state) {
    (void)state;
    const char *cats[] = {"c"}, *conts[] = {"v"};
    cf_tabular_options o = {
        .cat_names = cats, .n_cat = 1, .cont_names = conts, .n_cont = 1, .y_name = "y"};
    cf_dataset *tr = (cf_dataset *)1, *va = (cf_dataset *)1;
    const char *ragged = "c,v,y\na,1,0\nb,2\nc,3,1\n";
    expect_error(cf_tabular_from_csv_buffer(ragged, strlen(ragged), "r.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "r.csv: line 3", "has 2 fields, the header has 3");
    assert_null(tr);
    assert_null(va);
    const char *nonnum = "c,v,y\na,1,0\nb,\"1,5\",1\nc,abc,1\n";
    expect_error(cf_tabular_from_csv_buffer(nonnum, strlen(nonnum), "n.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "n.csv: line 3", "'1,5' is not a number");
    const char *nonnum2 = "c,v,y\na,1,0\nc,abc,1\n";
    expect_error(cf_tabular_from_csv_buffer(nonnum2, strlen(nonnum2), "n.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "line 3, continuous column 'v'", "'abc'");
    const char *quote = "c,v,y\na,1,0\n\"b,2,1\n";
    expect_error(cf_tabular_from_csv_buffer(quote, strlen(quote), "q.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "q.csv: line 3", "never closed");
    const char *after = "c,v,y\n\"a\"x,1,0\n";
    expect_error(cf_tabular_from_csv_buffer(after, strlen(after), "q.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "line 2", "after a closing quote");
    const char *nocol = "c,w,y\na,1,0\n";
    expect_error(cf_tabular_from_csv_buffer(nocol, strlen(nocol), "h.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "no column 'v'", "h.csv");
    const char *noy = "c,v,y\na,1,0\nb,2,\n";
    expect_error(cf_tabular_from_csv_buffer(noy, strlen(noy), "y.csv", &o, &tr, &va), CF_ERR_FORMAT,
                 "line 3", "target 'y' is missing");
    expect_error(cf_tabular_from_csv_buffer("", 0, "e.csv", &o, &tr, &va), CF_ERR_FORMAT, "e.csv",
                 "no header");
    expect_error(cf_tabular_from_csv(at("absent.csv"), &o, &tr, &va), CF_ERR_IO, "absent.csv",
                 NULL);
    /* An embedded NUL byte: refused with its place (a field would silently end there). */
    const char nul[] = "c,v,y\na,1,0\nb\0x,2,1\n";
    expect_error(cf_tabular_from_csv_buffer(nul, sizeof nul - 1, "z.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "z.csv: line 3, byte offset 13", "NUL byte");
    /* Categories that a saved model could not carry: one of 5000 bytes, and 3000 categories of
     * 3000 bytes (9 MB in all). Refused before training, naming the line and the column. */
    size_t big = 3000 * 3010 + 64;
    char *text = malloc(big);
    assert_non_null(text);
    int at_ = snprintf(text, big, "c,v,y\na,1,0\n");
    memset(text + at_, 'x', 5000);
    at_ += 5000;
    at_ += snprintf(text + at_, big - (size_t)at_, ",2,1\n");
    expect_error(cf_tabular_from_csv_buffer(text, (size_t)at_, "long.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "long.csv: line 3, column 'c'", "category of 5000 bytes");
    at_ = snprintf(text, big, "c,v,y\n");
    for (int i = 0; i < 3000; i++) {
        memset(text + at_, 'a' + i % 26, 2990);
        at_ += 2990;
        at_ += snprintf(text + at_, big - (size_t)at_, "%05d,1,%d\n", i, i % 2);
    }
    expect_error(cf_tabular_from_csv_buffer(text, (size_t)at_, "many.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "many.csv", "vocabularies hold");
    free(text);
    const char *allna = "c,v,y\na,,0\nb,NA,1\n";
    expect_error(cf_tabular_from_csv_buffer(allna, strlen(allna), "a.csv", &o, &tr, &va),
                 CF_ERR_FORMAT, "'v'", "no values in the training set");
    assert_null(tr);
}

/* ---- image folders ------------------------------------------------------------------------ */

#ifdef CF_HAVE_STB
static void mkdirs(const char *rel) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/%s'", tmp, rel);
    assert_int_equal(system(cmd), 0);
}

/* An 8x8 RGB image: a gradient seeded by k, or a constant colour. */
static void rgb(uint8_t *p, int k, bool constant) {
    for (int i = 0; i < 64; i++)
        for (int c = 0; c < 3; c++)
            p[i * 3 + c] = constant ? (uint8_t)(40 + 60 * c + k) : (uint8_t)(i * 3 + c * 50 + k);
}

static void test_image_folder(void **state) {
    (void)state;
    uint8_t a[192], b[192], c[192], d[192], e[192];
    rgb(a, 1, false);
    rgb(b, 5, true);
    rgb(c, 9, false);
    rgb(d, 13, false);
    rgb(e, 17, true);
    mkdirs("img/train/zebra");
    mkdirs("img/train/ant");
    mkdirs("img/valid/zebra");
    mkdirs("img/valid/ant");
    assert_true(stbi_write_png(at("img/train/zebra/a.png"), 8, 8, 3, a, 24));
    assert_true(stbi_write_jpg(at("img/train/zebra/b.jpg"), 8, 8, 3, b, 95));
    assert_true(stbi_write_png(at("img/train/ant/c.PNG"), 8, 8, 3, c, 24));
    write_bytes(at("img/train/ant/notes.txt"), "skip me", 7, false);
    assert_true(stbi_write_png(at("img/valid/ant/d.png"), 8, 8, 3, d, 24));
    assert_true(stbi_write_bmp(at("img/valid/zebra/e.bmp"), 8, 8, 3, e));
    cf_dataset *tr, *va;
    assert_int_equal(cf_datasets_from_image_folder(at("img"), NULL, &tr, &va), CF_OK);
    assert_int_equal(tr->n, 3);
    assert_int_equal(va->n, 2);
    assert_int_equal(tr->n_classes, 2);
    assert_string_equal(tr->vocab[0], "ant");
    assert_string_equal(tr->vocab[1], "zebra");
    assert_int_equal(tr->sample_shape.dim[0], 3);
    assert_int_equal(tr->sample_shape.dim[1], 8);
    /* Order: classes sorted, files sorted: ant/c, zebra/a, zebra/b. */
    assert_true(tr->y[0] == 0 && tr->y[1] == 1 && tr->y[2] == 1);
    const uint8_t *png[2] = {c, a};
    for (int k = 0; k < 2; k++)
        for (int ch = 0; ch < 3; ch++)
            for (int i = 0; i < 64; i++)
                assert_true(tr->x[k * 192 + ch * 64 + i] == (float)(png[k][i * 3 + ch] / 255.0));
    for (int ch = 0; ch < 3; ch++) /* JPEG: a constant colour comes back within a few levels */
        for (int i = 0; i < 64; i++)
            assert_true(fabsf(tr->x[2 * 192 + ch * 64 + i] * 255.0f - b[ch]) <= 3.0f);
    assert_true(va->y[0] == 0 && va->y[1] == 1);
    for (int ch = 0; ch < 3; ch++) /* BMP is lossless */
        assert_true(va->x[192 + ch * 64 + 5] == (float)(e[ch] / 255.0));
    cf_dataset_free(tr);
    cf_dataset_free(va);
    /* Resized to 4x4 and grayscale; a constant image stays constant. */
    cf_image_folder_options o = {.size = 4, .channels = 1};
    assert_int_equal(cf_datasets_from_image_folder(at("img"), &o, &tr, &va), CF_OK);
    assert_int_equal(tr->sample_shape.dim[0], 1);
    assert_int_equal(tr->sample_shape.dim[1], 4);
    assert_int_equal(tr->sample_shape.dim[2], 4);
    float gray = (float)(((77 * e[0] + 150 * e[1] + 29 * e[2]) >> 8) / 255.0);
    for (int i = 0; i < 16; i++) assert_true(fabsf(va->x[16 + i] - gray) < 1.5f / 255);
    cf_dataset_free(tr);
    cf_dataset_free(va);
    /* Random split over root/<class>/ with a DataLoaders on top. */
    mkdirs("flat/one");
    mkdirs("flat/two");
    for (int i = 0; i < 10; i++) {
        char name[64];
        snprintf(name, sizeof name, "flat/%s/%d.png", i % 2 ? "two" : "one", i);
        uint8_t p[192];
        rgb(p, i, true);
        assert_true(stbi_write_png(at(name), 8, 8, 3, p, 24));
    }
    cf_dls *dls;
    assert_int_equal(cf_dls_from_image_folder(
                         at("flat"), &(cf_image_folder_options){.valid_pct = 0.2, .seed = 1},
                         &(cf_dls_options){.bs = 4}, &dls),
                     CF_OK);
    assert_int_equal(dls->train_ds->n, 8);
    assert_int_equal(dls->valid_ds->n, 2);
    float seen[10] = {0};
    for (int s = 0; s < 2; s++) {
        cf_dataset *ds = s ? dls->valid_ds : dls->train_ds;
        for (int64_t i = 0; i < ds->n; i++) {
            int k = (int)lroundf(ds->x[i * 192] * 255.0f) - 40; /* the image's seed */
            assert_true(k >= 0 && k < 10);
            assert_true(ds->y[i] == (k % 2 ? 1.0f : 0.0f));
            seen[k]++;
        }
    }
    for (int k = 0; k < 10; k++) assert_true(seen[k] == 1);
    cf_dls_free(dls);
}

static void test_image_folder_bad_input(void **state) {
    (void)state;
    uint8_t a[192];
    rgb(a, 0, false);
    cf_dataset *tr = (cf_dataset *)1, *va = (cf_dataset *)1;
    /* Empty class folder. */
    mkdirs("e/train/full");
    mkdirs("e/train/empty");
    assert_true(stbi_write_png(at("e/train/full/a.png"), 8, 8, 3, a, 24));
    expect_error(cf_datasets_from_image_folder(at("e"), NULL, &tr, &va), CF_ERR_FORMAT,
                 "e/train/empty", "has no images");
    assert_null(tr);
    assert_null(va);
    /* Undecodable image. */
    mkdirs("u/train/x");
    write_bytes(at("u/train/x/broken.png"), "\x89PNG\r\n\x1a\nnot really", 18, false);
    expect_error(cf_datasets_from_image_folder(at("u"), NULL, &tr, &va), CF_ERR_FORMAT,
                 "u/train/x/broken.png", "corrupt or truncated PNG image");
    /* A symbolic link that leads out of the root is refused unless asked for. */
    mkdirs("s/train/x");
    mkdirs("outside");
    assert_true(stbi_write_png(at("outside/o.png"), 8, 8, 3, a, 24));
    assert_true(stbi_write_png(at("s/train/x/in.png"), 8, 8, 3, a, 24));
    assert_int_equal(symlink(at("outside/o.png"), at("s/train/x/link.png")), 0);
    assert_int_equal(symlink("in.png", at("s/train/x/inner.png")), 0);
    expect_error(cf_datasets_from_image_folder(at("s"), NULL, &tr, &va), CF_ERR_IO,
                 "s/train/x/link.png", "leading out of the data root");
    assert_int_equal(cf_datasets_from_image_folder(
                         at("s"), &(cf_image_folder_options){.follow_symlinks = true}, &tr, &va),
                     CF_OK);
    assert_int_equal(tr->n, 3);
    cf_dataset_free(tr);
    cf_dataset_free(va);
    /* Images of different sizes without a size to resize to. */
    mkdirs("z/train/x");
    assert_true(stbi_write_png(at("z/train/x/a.png"), 8, 8, 3, a, 24));
    assert_true(stbi_write_png(at("z/train/x/b.png"), 4, 4, 3, a, 12));
    expect_error(cf_datasets_from_image_folder(at("z"), NULL, &tr, &va), CF_ERR_FORMAT,
                 "z/train/x/b.png", "4 x 4");
    /* A valid class that training does not have; a missing root. */
    mkdirs("v/train/x");
    mkdirs("v/valid/y");
    assert_true(stbi_write_png(at("v/train/x/a.png"), 8, 8, 3, a, 24));
    assert_true(stbi_write_png(at("v/valid/y/a.png"), 8, 8, 3, a, 24));
    expect_error(cf_datasets_from_image_folder(at("v"), NULL, &tr, &va), CF_ERR_FORMAT, "'y'",
                 "not among the training classes");
    expect_error(cf_datasets_from_image_folder(at("none"), NULL, &tr, &va), CF_ERR_IO, at("none"),
                 NULL);
    /* A JPEG Huffman table with more than 256 codes (stb 2.27 would write past its tables). */
    uint8_t dht[2 + 4 + 17 + 2] = {0xFF, 0xD8, 0xFF, 0xC4, 0x00, 19, 0x00};
    memset(dht + 7, 0xFF, 16);
    dht[23] = 0xFF, dht[24] = 0xD9;
    expect_error(cf_image_decode(dht, sizeof dht, "dht.jpg", 3, 8, (float[192]){0}, NULL, NULL),
                 CF_ERR_FORMAT, "dht.jpg", "more than 256 codes");
    /* In-memory decoding refuses garbage with the name. */
    float out[192];
    expect_error(cf_image_decode("abc", 3, "mem.png", 3, 8, out, NULL, NULL), CF_ERR_FORMAT,
                 "mem.png", "not an image corefit reads");
    /* A truncated JPEG is named as one (stb_image's own last complaint is "bad png sig"). */
    assert_true(stbi_write_jpg(at("t.jpg"), 8, 8, 3, a, 90));
    FILE *jf = fopen(at("t.jpg"), "rb");
    assert_non_null(jf);
    uint8_t jpg[4096];
    size_t jn = fread(jpg, 1, sizeof jpg, jf);
    fclose(jf);
    assert_true(jn > 200);
    expect_error(cf_image_decode(jpg, jn / 2, "t.jpg", 3, 8, out, NULL, NULL), CF_ERR_FORMAT,
                 "t.jpg", "corrupt or truncated JPEG image");
    assert_int_equal(cf_image_decode(jpg, jn, "t.jpg", 3, 8, out, NULL, NULL), CF_OK);
    /* A 68-byte PNG whose image-data chunk declares 512 MiB (stb_image would allocate that much
     * before reading it; found by the fuzzer under -malloc_limit_mb). */
    static const uint8_t png_bomb[] = {
        0x89, 0x50, 0x4e, 0x47, 0xd,  0xa,  0x1a, 0xa,  0x0,  0x0,  0x0,  0xd,  0x49,
        0x48, 0x44, 0x52, 0x0,  0x0,  0x0,  0x4,  0x0,  0x0,  0x0,  0x4,  0x8,  0x6,
        0x0,  0x0,  0x0,  0xa9, 0xf1, 0x9e, 0x7e, 0x20, 0x0,  0x0,  0x22, 0x49, 0x44,
        0x41, 0x54, 0x78, 0x5e, 0x63, 0x64, 0x60, 0xe7, 0x13, 0x95, 0x41, 0x0,  0x0,
        0x0,  0x4,  0x0,  0x0,  0x0,  0x0,  0x6,  0x0,  0x8,  0x0,  0xfd, 0x60, 0x82};
    expect_error(cf_image_decode(png_bomb, sizeof png_bomb, "bomb.png", 3, 8, out, NULL, NULL),
                 CF_ERR_FORMAT, "bomb.png: corrupt or truncated PNG image", "byte offset 33");
    /* cf_image_read: the same from a file, and a directory refused. */
    assert_int_equal(cf_image_read(at("t.jpg"), 3, 8, out, NULL, NULL), CF_OK);
    expect_error(cf_image_read(at("u"), 3, 8, out, NULL, NULL), CF_ERR_IO, at("u"),
                 "is a directory");
}
#endif

/* cf_csv_read_first: rows kept whole across the 1 MiB reads (a quoted field with a line break
 * that straddles one), what follows the rows is not parsed (a NUL byte), and a NUL before them
 * is refused with its line. */
static void test_csv_read_first(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/first.csv", tmp);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fprintf(f, "id,note\n");
    size_t at = 8;
    int rows = 0;
    while (at < ((size_t)1 << 20) - 10) { /* short rows up to just before the first read's end */
        at += (size_t)fprintf(f, "%d,x\n", rows);
        rows++;
    }
    fprintf(f, "%d,\"%0990d\nsecond line\"\n", rows, 0); /* across the end of the first read */
    rows++;
    fprintf(f, "%d,last\n", rows++);
    fputc('\0', f);
    fclose(f);
    cf_csv_table *t = NULL;
    bool more = false;
    assert_int_equal(cf_csv_read_first(path, ',', rows, &t, &more), CF_OK);
    assert_int_equal(t->n_rows, rows);
    assert_true(more);
    assert_string_equal(t->cells[(rows - 2) * 2 + 1] + 990, "\nsecond line");
    assert_string_equal(t->cells[(rows - 1) * 2 + 1], "last");
    cf_csv_table_free(t);
    assert_int_equal(cf_csv_read_first(path, ',', 3, &t, NULL), CF_OK);
    assert_int_equal(t->n_rows, 3);
    cf_csv_table_free(t);
    /* whole, or one row more than precede the NUL: refused */
    assert_int_equal(cf_csv_read(path, ',', &t), CF_ERR_FORMAT);
    assert_int_equal(cf_csv_read_first(path, ',', rows + 1, &t, NULL), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "a NUL byte"));
    assert_null(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx),           cmocka_unit_test(test_csv_table),
        cmocka_unit_test(test_tabular_state), cmocka_unit_test(test_tabular_against_numpy),
        cmocka_unit_test(test_csv_bad_input), cmocka_unit_test(test_csv_read_first),
#ifdef CF_HAVE_STB
        cmocka_unit_test(test_image_folder),  cmocka_unit_test(test_image_folder_bad_input),
#endif
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
