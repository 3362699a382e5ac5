/* The example programs (the examples folder), each run on small data: exit status, output and
 * files. The MPI example runs under mpirun from tests/examples.cmake. */
#include "oracle.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "corefit.h"

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#endif

static char dir[256];

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t k = fread(s, 1, (size_t)n, f);
    s[k] = '\0';
    fclose(f);
    return s;
}

/* Runs `env example_<name> args` in the test folder; *out and *err receive its output. */
static int run_example(const char *env, const char *name, const char *args, char **out,
                       char **err) {
    char cmd[4096], o[600], e[600];
    snprintf(o, sizeof o, "%s/%s.out", dir, name);
    snprintf(e, sizeof e, "%s/%s.err", dir, name);
    snprintf(cmd, sizeof cmd, "cd '%s' && %s '%s/example_%s' %s >'%s' 2>'%s' </dev/null", dir, env,
             CF_BUILD_DIR, name, args, o, e);
    int s = system(cmd);
    *out = slurp(o);
    *err = slurp(e);
    assert_non_null(*out);
    assert_non_null(*err);
    int status = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
    if (status != 0)
        fail_msg("example_%s exited %d\nstdout: %s\nstderr: %s", name, status, *out, *err);
    return status;
}

static bool is_png(const char *path) {
    FILE *f = fopen(path, "rb");
    unsigned char b[8] = {0};
    bool ok = f && fread(b, 1, 8, f) == 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0;
    if (f) fclose(f);
    return ok;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A mini-resnet for 1x28x28 images and n_out classes over a random data set. */
static cf_learner *mini_learner(int n_out, cf_dls **dls) {
    enum { N = 8 };
    float *x = malloc(N * 784 * sizeof(float)), y[N];
    fill_uniform(x, N * 784, 9, 0, 1);
    for (int i = 0; i < N; i++) y[i] = (float)(i % n_out);
    cf_dataset *a = NULL, *b = NULL;
    assert_int_equal(
        cf_dataset_from_arrays(x, y, N, cf_shape_make(3, (int[]){1, 28, 28}), 1, n_out, &a), CF_OK);
    assert_int_equal(
        cf_dataset_from_arrays(x, y, N, cf_shape_make(3, (int[]){1, 28, 28}), 1, n_out, &b), CF_OK);
    free(x);
    assert_int_equal(cf_dls_new(a, b, &(cf_dls_options){.bs = 4}, dls), CF_OK);
    cf_learner *learn = NULL;
    assert_int_equal(cf_vision_learner(&learn, *dls, CF_ARCH_MINI_RESNET, .quiet = true, .seed = 3),
                     CF_OK);
    return learn;
}

static void test_quickstart(void **state) {
    (void)state;
    char *out, *err, path[600];
    run_example("COREFIT_EXAMPLE_LIMIT=512", "quickstart", "qs 1", &out, &err);
    assert_non_null(strstr(out, "lr_find: valley "));
    double valley = strtod(strstr(out, "lr_find: valley ") + 16, NULL);
    assert_true(valley > 0 && valley < 10);
    /* fastprogress's table came from rank 0 only: one header, one epoch row */
    const char *h = strstr(out, "epoch     train_loss  valid_loss  accuracy  time");
    assert_non_null(h);
    assert_null(strstr(h + 1, "epoch     train_loss"));
    /* the master callback (SaveModel) wrote its file; the weights came home */
    assert_non_null(strstr(out, "Better model found at epoch 0 with accuracy value"));
    snprintf(path, sizeof path, "%s/qs/models/model.safetensors", dir);
    assert_true(file_exists(path));
    snprintf(path, sizeof path, "%s/qs/model.safetensors", dir);
    cf_dls *dls = NULL;
    cf_learner *learn = mini_learner(10, &dls);
    assert_int_equal(cf_model_load(learn->model, NULL, path), CF_OK);
    cf_learner_free(learn);
    cf_dls_free(dls);
    if (cf_plot_available()) {
        snprintf(path, sizeof path, "%s/qs/lr_find.png", dir);
        assert_true(is_png(path));
        assert_non_null(strstr(out, "wrote qs/lr_find.png"));
        snprintf(path, sizeof path, "%s/qs/schedule.png", dir);
        assert_true(is_png(path));
    }
    free(out);
    free(err);
}

static void test_fine_tune(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    char path[700];
    /* a saved model to start from */
    cf_dls *dls = NULL;
    cf_learner *learn = mini_learner(10, &dls);
    snprintf(path, sizeof path, "%s/pre.safetensors", dir);
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    cf_learner_free(learn);
    cf_dls_free(dls);
    /* a tiny image folder: train/ and valid/, two classes */
    static const char *const parts[] = {"train", "valid"}, *const classes[] = {"cat", "dog"};
    snprintf(path, sizeof path, "%s/pics", dir);
    mkdir(path, 0777);
    cf_rng rng;
    cf_rng_seed(&rng, 4);
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/pics/%s", dir, parts[s]);
        mkdir(path, 0777);
        for (int c = 0; c < 2; c++) {
            snprintf(path, sizeof path, "%s/pics/%s/%s", dir, parts[s], classes[c]);
            mkdir(path, 0777);
            for (int k = 0; k < (s ? 4 : 12); k++) {
                unsigned char px[28 * 28];
                for (int i = 0; i < 28 * 28; i++)
                    px[i] = (unsigned char)((i % 28 < 14) == c ? 200 : cf_rng_below(&rng, 80));
                snprintf(path, sizeof path, "%s/pics/%s/%s/%d.png", dir, parts[s], classes[c], k);
                assert_true(stbi_write_png(path, 28, 28, 1, px, 28) != 0);
            }
        }
    }
    char *out, *err;
    /* the output folder does not exist yet: the example creates it */
    run_example("COREFIT_EXAMPLE_CORES=2", "fine_tune", "pre.safetensors pics ft_out 1", &out,
                &err);
    assert_non_null(strstr(out, "24 training and 8 validation images of 2 classes"));
    assert_non_null(strstr(out, "fine-tuned: valid_loss "));
    const char *first = strstr(out, "first validation image: ");
    assert_non_null(first);
    char first_class[64];
    double first_prob;
    assert_int_equal(sscanf(first + 24, "%63s (%lf)", first_class, &first_prob), 2);
    /* fine_tune's two fits: the frozen one and the unfrozen one (two tables) */
    const char *h = strstr(out, "epoch     train_loss");
    assert_non_null(h);
    assert_non_null(strstr(h + 1, "epoch     train_loss"));
    /* the new head has two outputs; the body was trained on from the saved one */
    snprintf(path, sizeof path, "%s/ft_out/fine_tuned.safetensors", dir);
    cf_st_file *ft = NULL, *pre = NULL;
    assert_int_equal(cf_st_read(path, &ft), CF_OK);
    snprintf(path, sizeof path, "%s/pre.safetensors", dir);
    assert_int_equal(cf_st_read(path, &pre), CF_OK);
    const cf_st_entry *last = cf_st_find(ft, "1.8.weight");
    assert_non_null(last);
    assert_int_equal(last->shape.dim[0], 2);
    const cf_st_entry *a = cf_st_find(ft, "0.0.weight"), *b = cf_st_find(pre, "0.0.weight");
    assert_int_equal(a->numel, b->numel);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a->numel; i++) {
        diff += fabs(a->data[i] - b->data[i]);
        norm += fabs(b->data[i]);
    }
    assert_true(diff > 0 && diff < 0.5 * norm); /* moved, but from the saved weights */
    cf_st_free(ft);
    cf_st_free(pre);
    free(out);
    free(err);
    /* another program loads the exported learner and predicts: the same class and probability
     * as the fine-tuned model's get_preds gave for the first validation image */
    run_example("", "predict", "ft_out/fine_tuned.safetensors pics/valid/cat/0.png", &out, &err);
    char want[128];
    snprintf(want, sizeof want, "pics/valid/cat/0.png\t%s\t", first_class);
    if (strncmp(out, want, strlen(want)) != 0) fail_msg("'%s' does not start '%s'", out, want);
    assert_float_equal(strtod(out + strlen(want), NULL), first_prob, 6e-4); /* printed %.3f */
    free(out);
    free(err);
#endif
}

static void test_tabular(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/people.csv", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "job,age,hours,rich\n");
    static const char *const jobs[] = {"baker", "pilot", "clerk", "\"smith, jr\""};
    cf_rng rng;
    cf_rng_seed(&rng, 8);
    for (int i = 0; i < 200; i++) {
        int j = (int)cf_rng_below(&rng, 4);
        double age = 20 + cf_rng_uniform(&rng) * 40, hours = 20 + cf_rng_uniform(&rng) * 30;
        bool rich = (j == 1) || hours > 40;
        if (i % 13 == 0)
            fprintf(f, "%s,,%.1f,%s\n", jobs[j], hours, rich ? "yes" : "no");
        else
            fprintf(f, "%s,%.1f,%.1f,%s\n", jobs[j], age, hours, rich ? "yes" : "no");
    }
    fclose(f);
    char *out, *err;
    run_example("", "tabular", "people.csv rich job age,hours 3", &out, &err);
    /* job, plus age_na (age has missing values) */
    assert_non_null(strstr(out, "160 training and 40 validation rows, 2 categorical columns"));
    assert_non_null(strstr(out, "epoch     train_loss  valid_loss  accuracy  time"));
    for (int i = 0; i < 5; i++) {
        char row[32];
        snprintf(row, sizeof row, "row %d: predicted ", i);
        assert_non_null(strstr(out, row));
    }
    free(out);
    free(err);
}

static void test_custom_callback(void **state) {
    (void)state;
    char *out, *err;
    run_example("COREFIT_EXAMPLE_LIMIT=512", "custom_callback", "1", &out, &err);
    /* the custom metric is a column of the table; the callback printed once, on the master */
    assert_non_null(strstr(out, "epoch     train_loss  valid_loss  accuracy  true_prob  time"));
    const char *cb = strstr(err, "callback: epoch 0 done, ");
    assert_non_null(cb);
    assert_null(strstr(cb + 1, "callback: epoch 0 done"));
    long batches = strtol(cb + strlen("callback: epoch 0 done, "), NULL, 10);
    assert_true(batches >= 1 && batches <= 512 / 64);
    const char *fin = strstr(out, "final: accuracy ");
    assert_non_null(fin);
    double acc, tp;
    assert_int_equal(sscanf(fin, "final: accuracy %lf, true_prob %lf", &acc, &tp), 2);
    assert_true(tp > 0 && tp < 1);
    free(out);
    free(err);
}

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(dir, sizeof dir, "cf_examples_");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quickstart),
        cmocka_unit_test(test_fine_tune),
        cmocka_unit_test(test_tabular),
        cmocka_unit_test(test_custom_callback),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
