/* DataLoaders options for a quick run and a readable vocabulary: n_train / n_valid (fastai's
 * dls.train.n) keep the first samples, and an IDX folder named like Fashion-MNIST gets its class
 * names. */
#include "oracle.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "corefit.h"

static char dir[256];

static void test_n_train_n_valid(void **state) {
    (void)state;
    enum { N = 40, F = 3 };
    float x[N * F], y[N];
    fill_uniform(x, N * F, 5, -1, 1);
    for (int i = 0; i < N; i++) y[i] = (float)(i % 4);
    cf_dataset *a = NULL, *b = NULL;
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape1(F), 1, 4, &a), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape1(F), 1, 4, &b), CF_OK);
    cf_dls *dls = NULL;
    assert_int_equal(
        cf_dls_new(a, b, &(cf_dls_options){.bs = 4, .n_train = 12, .n_valid = 5}, &dls), CF_OK);
    assert_int_equal(dls->train_ds->n, 12);
    assert_int_equal(dls->valid_ds->n, 5);
    /* the first samples, in order */
    assert_memory_equal(dls->train_ds->x, x, 12 * F * sizeof(float));
    assert_memory_equal(dls->valid_ds->y, y, 5 * sizeof(float));
    assert_int_equal(cf_dataloader_len(dls->train), 3); /* 12 // 4, drop_last */
    cf_dls_free(dls);
    /* more than there is: everything */
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape1(F), 1, 4, &a), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape1(F), 1, 4, &b), CF_OK);
    assert_int_equal(cf_dls_new(a, b, &(cf_dls_options){.n_train = 1000}, &dls), CF_OK);
    assert_int_equal(dls->train_ds->n, N);
    assert_int_equal(dls->valid_ds->n, N);
    cf_dls_free(dls);
    /* negative: refused */
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape1(F), 1, 4, &a), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(x, y, N, cf_shape1(F), 1, 4, &b), CF_OK);
    assert_int_equal(cf_dls_new(a, b, &(cf_dls_options){.n_valid = -1}, &dls), CF_ERR_INVALID);
    assert_null(dls);
    assert_non_null(strstr(cf_last_error(), "n_valid -1"));
}

/* An image dataset's normalisation statistics come from the kept samples only. */
static void test_n_train_normalize(void **state) {
    (void)state;
    enum { N = 8 };
    float x[N * 4], y[N] = {0};
    for (int i = 0; i < N * 4; i++) x[i] = i < 4 * 4 ? 0.25f : 0.75f;
    cf_dataset *a = NULL, *b = NULL;
    cf_shape s = cf_shape_make(3, (int[]){1, 2, 2});
    assert_int_equal(cf_dataset_from_arrays(x, y, N, s, 1, 1, &a), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(x, y, N, s, 1, 1, &b), CF_OK);
    cf_dls *dls = NULL;
    assert_int_equal(
        cf_dls_new(a, b, &(cf_dls_options){.bs = 2, .normalize = true, .n_train = 4}, &dls), CF_OK);
    assert_float_equal(cf_dataloader_options(dls->train)->mean[0], 0.25f, 1e-6);
    cf_dls_free(dls);
}

static void write_idx(const char *path, const unsigned char *header, size_t hn,
                      const unsigned char *body, size_t bn) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(header, 1, hn, f), hn);
    assert_int_equal(fwrite(body, 1, bn, f), bn);
    fclose(f);
}

/* A tiny IDX folder (10 classes) named `name`. */
static void make_idx_dir(const char *name, char *path, size_t size) {
    snprintf(path, size, "%s/%s", dir, name);
    mkdir(path, 0777);
    unsigned char img_h[16] = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 2, 0, 0, 0, 2};
    unsigned char lab_h[8] = {0, 0, 8, 1, 0, 0, 0, 10};
    unsigned char px[40] = {0}, lab[10];
    for (int i = 0; i < 10; i++) lab[i] = (unsigned char)i;
    static const char *const parts[] = {"train", "t10k"};
    for (int k = 0; k < 2; k++) {
        char f[600];
        snprintf(f, sizeof f, "%s/%s-images-idx3-ubyte", path, parts[k]);
        write_idx(f, img_h, 16, px, 40);
        snprintf(f, sizeof f, "%s/%s-labels-idx1-ubyte", path, parts[k]);
        write_idx(f, lab_h, 8, lab, 10);
    }
}

static void test_fashion_mnist_names(void **state) {
    (void)state;
    char path[512];
    make_idx_dir("Fashion-MNIST", path, sizeof path);
    cf_dls *dls = NULL;
    assert_int_equal(cf_dls_from_idx_dir(path, &(cf_dls_options){.bs = 2}, &dls), CF_OK);
    assert_string_equal(dls->train_ds->vocab[2], "Pullover");
    assert_string_equal(dls->valid_ds->vocab[9], "Ankle boot");
    assert_string_equal(cf_fashion_mnist_classes[0], "T-shirt/top");
    cf_dls_free(dls);
    /* another IDX folder keeps the label numbers */
    make_idx_dir("digits", path, sizeof path);
    assert_int_equal(cf_dls_from_idx_dir(path, &(cf_dls_options){.bs = 2}, &dls), CF_OK);
    assert_string_equal(dls->train_ds->vocab[2], "2");
    cf_dls_free(dls);
}

/* Categories the training rows never had become #na# (as fastai's Categorify) and are counted. */
static void test_unseen_categories_counted(void **state) {
    (void)state;
    const char csv[] = "city,size,y\n"
                       "Paris,1,a\n"
                       "Rome,2,b\n"
                       "Paris,3,a\n"
                       "Rome,4,b\n"
                       "Lisbon,5,a\n" /* validation: unseen */
                       "Oslo,6,b\n"   /* validation: unseen */
                       ",7,a\n"       /* validation: missing, not unseen */
                       "Rome,8,b\n";  /* validation: seen */
    const char *cat[] = {"city"}, *cont[] = {"size"};
    int64_t valid_idx[] = {4, 5, 6, 7};
    cf_tabular_options o = {.cat_names = cat,
                            .n_cat = 1,
                            .cont_names = cont,
                            .n_cont = 1,
                            .y_name = "y",
                            .valid_idx = valid_idx,
                            .n_valid_idx = 4};
    cf_dataset *train = NULL, *valid = NULL;
    assert_int_equal(
        cf_tabular_from_csv_buffer(csv, sizeof csv - 1, "cities.csv", &o, &train, &valid), CF_OK);
    assert_int_equal(train->n_unseen, 0);
    assert_int_equal(valid->n_unseen, 2);
    assert_float_equal(valid->x[0], 0, 0); /* #na# */
    assert_string_equal(valid->y_name, "y");
    cf_dataset_free(train);
    cf_dataset_free(valid);
}

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(dir, sizeof dir, "cf_dls_options_");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_n_train_n_valid),
        cmocka_unit_test(test_n_train_normalize),
        cmocka_unit_test(test_fashion_mnist_names),
        cmocka_unit_test(test_unseen_categories_counted),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
