/* Text readers: from_folder on real text (Debian's fortunes, laid out by scripts/fortunes-folder),
 * from_csv (single, delimited and column multi-labels), the numericalizer seam into DataLoaders,
 * show_batch, and bad input (empty and binary files, missing columns, validation-only labels).
 * The numericalizer here is a plain space splitter with its own vocabulary: the seam's stand-in
 * for the real tokenizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "corefit/data.h"
#include "oracle.h"
#include "text_fixture.h"

typedef struct split_vocab {
    char *words[4096];
    int n;
} split_vocab;

static int32_t word_id(split_vocab *v, const char *w, size_t len, bool add) {
    for (int i = 0; i < v->n; i++)
        if (strlen(v->words[i]) == len && !strncmp(v->words[i], w, len)) return i;
    if (!add || v->n >= 4096) return CF_TEXT_UNK;
    v->words[v->n] = strndup(w, len);
    return v->n++;
}

static cf_status sv_fit(void *ctx, const char *const *texts, int64_t n) {
    split_vocab *v = ctx;
    for (int64_t i = 0; i < n; i++)
        for (const char *p = texts[i]; *p;) {
            size_t len = strcspn(p, " \n\t");
            if (len) word_id(v, p, len, true);
            p += len + (p[len] != 0);
        }
    return CF_OK;
}

static cf_status sv_encode(void *ctx, const char *text, int32_t **ids, int64_t *n_ids) {
    split_vocab *v = ctx;
    int32_t *out = cf_malloc((strlen(text) + 2) * sizeof(int32_t));
    int64_t n = 0;
    out[n++] = CF_TEXT_BOS;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, " \n\t");
        if (len) out[n++] = word_id(v, p, len, false);
        p += len + (p[len] != 0);
    }
    *ids = out;
    *n_ids = n;
    return CF_OK;
}

static const char *sv_token(void *ctx, int32_t id) {
    split_vocab *v = ctx;
    return id >= 0 && id < v->n ? v->words[id] : NULL;
}

static int32_t sv_size(void *ctx) {
    return ((split_vocab *)ctx)->n;
}

static cf_text_numericalizer make_nz(split_vocab *v) {
    const char *spec[] = {"xxunk", "xxpad", "xxbos"};
    for (int i = 0; i < 3; i++) v->words[v->n++] = strdup(spec[i]);
    return (cf_text_numericalizer){v, sv_fit, sv_encode, sv_token, sv_size};
}

static void vocab_free(split_vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->words[i]);
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void test_fortunes_folder(void **state) {
    (void)state;
    if (!have_fortunes()) {
        print_message("fortunes is not installed (scripts/install-deps): skipped\n");
        skip();
    }
    char dir[256];
    test_tmpdir_make(dir, sizeof dir, "cf_fortunes");
    assert_int_equal(fortunes_folder(dir, 40), 0);
    cf_text_raw *raw = NULL;
    assert_int_equal(cf_text_read_folder(dir, NULL, &raw), CF_OK);
    assert_int_equal(raw->n, 120);
    assert_int_equal(raw->n_classes, 3);
    assert_string_equal(raw->classes[0], "food");
    assert_string_equal(raw->classes[2], "science");
    int n_valid = 0;
    for (int64_t i = 0; i < raw->n; i++) {
        n_valid += raw->is_valid[i];
        /* the label is the parent folder */
        assert_non_null(strstr(raw->where[i], raw->classes[(int)raw->targets[i]]));
    }
    assert_int_equal(n_valid, 30);
    split_vocab v = {0};
    cf_text_numericalizer nz = make_nz(&v);
    cf_dls *dls = NULL;
    assert_int_equal(cf_text_dls_from_raw(raw, &nz, &(cf_text_dls_options){.bs = 8}, &dls), CF_OK);
    assert_int_equal(dls->train_ds->n, 90);
    assert_int_equal(dls->valid_ds->n, 30);
    assert_int_equal(dls->train_ds->n_classes, 3);
    assert_int_equal(cf_dataloader_len(dls->train), 11);
    assert_int_equal(cf_dataloader_begin_epoch(dls->valid, 0), CF_OK);
    const cf_batch *b;
    assert_int_equal(cf_dataloader_next(dls->valid, &b), CF_OK);
    /* validation: longest first, every row starting with xxbos after its front padding */
    assert_true(b->x.data[0] == CF_TEXT_BOS);
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    assert_int_equal(cf_text_show_batch(dls->valid, b, &nz, 3, 20, f), CF_OK);
    fclose(f);
    assert_non_null(strstr(buf, "text\tcategory"));
    assert_non_null(strstr(buf, "xxbos"));
    assert_null(strstr(buf, "xxpad"));
    assert_non_null(strstr(buf, raw->classes[(int)b->y.data[0]]));
    print_message("%s", buf);
    free(buf);
    cf_dls_free(dls);

    /* the same texts as a language model, shown with the shifted target */
    assert_int_equal(
        cf_text_dls_from_raw(raw, &nz, &(cf_text_dls_options){.bs = 4, .seq_len = 12, .is_lm = 1},
                             &dls),
        CF_OK);
    assert_int_equal(cf_dataloader_begin_epoch(dls->train, 0), CF_OK);
    assert_int_equal(cf_dataloader_next(dls->train, &b), CF_OK);
    assert_int_equal(b->x.shape.dim[1], 12);
    assert_true(b->y.data[0] == b->x.data[1]);
    f = open_memstream(&buf, &size);
    assert_int_equal(cf_text_show_batch(dls->train, b, &nz, 2, 0, f), CF_OK);
    fclose(f);
    assert_non_null(strstr(buf, "text\ttext_"));
    free(buf);
    cf_dls_free(dls);
    vocab_free(&v);
    cf_text_raw_free(raw);

    /* one folder with valid_pct */
    char train[300];
    snprintf(train, sizeof train, "%s/train", dir);
    cf_text_folder_options o = {.valid_pct = 0.5, .seed = 3};
    assert_int_equal(cf_text_read_folder(train, &o, &raw), CF_OK);
    n_valid = 0;
    for (int64_t i = 0; i < raw->n; i++) n_valid += raw->is_valid[i];
    assert_int_equal(n_valid, (int)(0.5 * (double)raw->n));
    cf_text_raw_free(raw);
    assert_int_equal(test_tmpdir_remove(dir), 0);
}

static void test_bad_folders(void **state) {
    (void)state;
    char dir[256], path[512];
    test_tmpdir_make(dir, sizeof dir, "cf_textbad");
    snprintf(path, sizeof path, "%s/train", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/train/pos", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/valid", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/valid/neg", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/train/pos/a.txt", dir);
    write_file(path, "good text", 9);
    snprintf(path, sizeof path, "%s/valid/neg/b.txt", dir);
    write_file(path, "other text", 10);
    cf_text_raw *raw = NULL;
    /* a label only in validation */
    assert_int_equal(cf_text_read_folder(dir, NULL, &raw), CF_ERR_FORMAT);
    assert_null(raw);
    assert_non_null(strstr(cf_last_error(), "valid/neg/b.txt"));
    assert_non_null(strstr(cf_last_error(), "\"neg\""));
    remove(path);
    /* an empty file */
    snprintf(path, sizeof path, "%s/train/pos/empty.txt", dir);
    write_file(path, "", 0);
    assert_int_equal(cf_text_read_folder(dir, NULL, &raw), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "empty.txt: empty"));
    remove(path);
    /* a binary file, then bytes that are not UTF-8 */
    snprintf(path, sizeof path, "%s/train/pos/bin.txt", dir);
    write_file(path, "PK\3\4\0\0", 6);
    assert_int_equal(cf_text_read_folder(dir, NULL, &raw), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "bin.txt: byte 4 (0x00)"));
    write_file(path, "caf\xc3\xa9 ok \xff!", 11);
    assert_int_equal(cf_text_read_folder(dir, NULL, &raw), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "bin.txt: byte 9 (0xff): not UTF-8"));
    write_file(path, "caf\xc3\xa9 \xe2\x82\xac", 9); /* valid: e-acute, euro sign */
    assert_int_equal(cf_text_read_folder(dir, NULL, &raw), CF_OK);
    assert_int_equal(raw->n, 2);
    cf_text_raw_free(raw);
    assert_int_equal(test_tmpdir_remove(dir), 0);
}

static void test_csv(void **state) {
    (void)state;
    const char *csv = "text,label,is_valid,tags\n"
                      "\"good, really\",pos,0,a;b\n"
                      "bad,neg,0,b\n"
                      "fine,pos,1,a\n";
    cf_text_raw *raw = NULL;
    cf_text_csv_options o = {.valid_col = "is_valid"};
    assert_int_equal(cf_text_read_csv_buffer(csv, strlen(csv), "t.csv", &o, &raw), CF_OK);
    assert_int_equal(raw->n, 3);
    assert_string_equal(raw->texts[0], "good, really");
    assert_int_equal(raw->n_classes, 2);
    assert_string_equal(raw->classes[0], "neg");
    assert_true(raw->targets[0] == 1 && raw->targets[1] == 0 && raw->targets[2] == 1);
    assert_true(raw->is_valid[2] && !raw->is_valid[0]);
    assert_string_equal(raw->where[1], "t.csv:3");
    cf_text_raw_free(raw);
    /* label_delim: multi-hot over the sorted training names */
    const char *cols[] = {"tags"};
    o = (cf_text_csv_options){
        .label_cols = cols, .n_label_cols = 1, .label_delim = ";", .valid_col = "is_valid"};
    assert_int_equal(cf_text_read_csv_buffer(csv, strlen(csv), "t.csv", &o, &raw), CF_OK);
    assert_int_equal(raw->target_dim, 2);
    float want[] = {1, 1, 0, 1, 1, 0};
    for (int i = 0; i < 6; i++) assert_true(raw->targets[i] == want[i]);
    cf_text_raw_free(raw);
    /* several 0/1 columns */
    const char *csv2 = "text,x,y\none,1,0\ntwo,1,1\n";
    const char *cols2[] = {"x", "y"};
    o = (cf_text_csv_options){.label_cols = cols2, .n_label_cols = 2};
    assert_int_equal(cf_text_read_csv_buffer(csv2, strlen(csv2), "m.csv", &o, &raw), CF_OK);
    assert_int_equal(raw->n_classes, 2);
    assert_true(raw->targets[0] == 1 && raw->targets[1] == 0 && raw->targets[3] == 1);
    cf_text_raw_free(raw);
    /* a missing column */
    o = (cf_text_csv_options){.text_col = "review"};
    assert_int_equal(cf_text_read_csv_buffer(csv, strlen(csv), "t.csv", &o, &raw), CF_ERR_FORMAT);
    assert_null(raw);
    assert_non_null(strstr(cf_last_error(), "t.csv: line 1: no text column \"review\""));
    /* a label seen only in validation, a bad boolean */
    const char *csv3 = "text,label,is_valid\na,pos,0\nb,neu,1\n";
    o = (cf_text_csv_options){.valid_col = "is_valid"};
    assert_int_equal(cf_text_read_csv_buffer(csv3, strlen(csv3), "v.csv", &o, &raw), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "v.csv:3: label \"neu\""));
    const char *csv4 = "text,label,is_valid\na,pos,maybe\n";
    assert_int_equal(cf_text_read_csv_buffer(csv4, strlen(csv4), "w.csv", &o, &raw), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "w.csv:2: is_valid is \"maybe\""));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fortunes_folder),
        cmocka_unit_test(test_bad_folders),
        cmocka_unit_test(test_csv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
