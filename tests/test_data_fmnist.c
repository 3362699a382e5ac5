/* Fashion-MNIST through the IDX reader, checked against an independent read (gzip + numpy). */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "corefit/data.h"

static const char *fmnist_dir(void) {
    const char *d = getenv("CF_FASHION_MNIST_DIR");
    return d ? d : "/usr/share/datasets/fashion-mnist";
}

static void test_fashion_mnist(void **state) {
    (void)state;
    char probe[512];
    struct stat sb;
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", fmnist_dir());
    if (stat(probe, &sb) != 0) {
        print_message("Fashion-MNIST not installed in %s (dataset-fashion-mnist)\n", fmnist_dir());
        skip();
    }
    double t0 = cf_now();
    cf_dls *dls;
    assert_int_equal(cf_dls_from_idx_dir(fmnist_dir(), &(cf_dls_options){.normalize = true}, &dls),
                     CF_OK);
    print_message("loaded in %.2f s\n", cf_now() - t0);
    oracle o;
    oracle_init(&o);
    char args[600];
    snprintf(args, sizeof args, "%s", fmnist_dir());
    oracle_run(&o, "data_idx.py", args);
    const char *parts[2] = {"train", "t10k"};
    const cf_dataset *sets[2] = {dls->train_ds, dls->valid_ds};
    int64_t want_n[2] = {60000, 10000};
    for (int p = 0; p < 2; p++) {
        const cf_dataset *ds = sets[p];
        char name[64];
        assert_int_equal(ds->n, want_n[p]);
        assert_int_equal(ds->sample_shape.ndim, 3);
        assert_int_equal(ds->sample_shape.dim[0], 1);
        assert_int_equal(ds->sample_shape.dim[1], 28);
        assert_int_equal(ds->sample_shape.dim[2], 28);
        assert_int_equal(ds->n_classes, 10);
        assert_string_equal(ds->vocab[9], "Ankle boot"); /* the folder is named like it */
        snprintf(name, sizeof name, "%s_count", parts[p]);
        cf_tensor cnt = oracle_get(&o, name);
        assert_int_equal((int64_t)cnt.data[0], ds->n);
        free(cnt.data);
        snprintf(name, sizeof name, "%s_labels", parts[p]);
        cf_tensor lab = oracle_get(&o, name);
        assert_int_equal(cnt.shape.dim[0], 3);
        assert_memory_equal(lab.data, ds->y, (size_t)ds->n * sizeof(float));
        free(lab.data);
        double sum = 0;
        for (int64_t i = 0; i < ds->n * 784; i++) sum += ds->x[i];
        snprintf(name, sizeof name, "%s_mean", parts[p]);
        cf_tensor mean = oracle_get(&o, name);
        assert_true(fabs(sum / (ds->n * 784.0) - mean.data[0]) < 1e-6);
        if (p == 0) assert_true(fabs(sum / (ds->n * 784.0) - 0.2860) < 1e-4);
        free(mean.data);
        snprintf(name, sizeof name, "%s_some", parts[p]);
        cf_tensor some = oracle_get(&o, name);
        int64_t which[4] = {0, 1, 12345 % ds->n, ds->n - 1};
        for (int k = 0; k < 4; k++)
            assert_memory_equal(some.data + k * 784, ds->x + which[k] * 784, 784 * sizeof(float));
        free(some.data);
    }
    /* Normalisation statistics from the training set (W1: mean 0.2860, std 0.3530). */
    const cf_dl_options *opt = cf_dataloader_options(dls->train);
    assert_int_equal(opt->n_norm, 1);
    assert_true(fabsf(opt->mean[0] - 0.2860f) < 1e-4f);
    assert_true(fabsf(opt->std[0] - 0.3530f) < 1e-4f);
    assert_int_equal(cf_dataloader_len(dls->train), 60000 / 64);
    assert_int_equal(cf_dataloader_len(dls->valid), 10000 / 64 + 1);
    oracle_cleanup(&o);
    cf_dls_free(dls);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fashion_mnist)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
