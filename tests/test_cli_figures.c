/* The figures of `corefit train --plots` and `corefit eval --plots` (show_batch, show_results,
 * top_losses, the confusion matrix: files and pixels) and the most_confused lines they print;
 * `corefit eval --tta` (beta 1 gives the plain loss and accuracy, the default blend does not);
 * tables get the confusion matrix only. */
#include "oracle.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "corefit.h"

#define COREFIT CF_BUILD_DIR "/corefit"
#define FMNIST "/usr/share/datasets/fashion-mnist"

static char dir[256];
static const char *const fmnist_names[10] = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                             "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                             "Bag",         "Ankle boot"};

typedef struct run_result {
    int status;
    char *out, *err;
} run_result;

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

/* Runs `corefit <args>` in the test folder, capturing stdout and stderr. */
static run_result run(const char *args) {
    char cmd[8192], out[600], err[600];
    snprintf(out, sizeof out, "%s/stdout.txt", dir);
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >'%s' 2>'%s' </dev/null", dir, COREFIT, args, out,
             err);
    int s = system(cmd);
    run_result r = {.status = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s)};
    r.out = slurp(out);
    r.err = slurp(err);
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static void run_free(run_result *r) {
    free(r->out);
    free(r->err);
}

static void expect(const run_result *r, int status, const char *in_out, const char *in_err) {
    if (r->status != status || (in_out && !strstr(r->out, in_out)) ||
        (in_err && !strstr(r->err, in_err)))
        fail_msg("exit %d (expected %d)\nstdout: %s\nstderr: %s\nexpected stdout to hold '%s' and "
                 "stderr '%s'",
                 r->status, status, r->out, r->err, in_out ? in_out : "", in_err ? in_err : "");
}

static const char *path_in(const char *name) {
    static char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static bool file_exists(const char *name) {
    struct stat sb;
    return stat(path_in(name), &sb) == 0;
}

/* The value after "key: " on its own line of text. */
static double value_of(const char *text, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s: ", key);
    if (strncmp(text, pat + 1, strlen(pat + 1)) == 0) /* the first line */
        return strtod(text + strlen(pat + 1), NULL);
    const char *p = strstr(text, pat);
    if (!p) fail_msg("no '%s' in:\n%s", pat + 1, text);
    return strtod(p + strlen(pat), NULL);
}

static int class_of(const char *name, int n, const char *const *names) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

/* The rows under "most_confused (actual, predicted, count):", each "  ('A', 'B', N)" with two
 * different class names, in non-increasing count. Returns the sum of the counts. */
static int64_t most_confused_total(const char *out, int n_classes, const char *const *names) {
    const char *p = strstr(out, "most_confused (actual, predicted, count):");
    if (!p) fail_msg("no most_confused in:\n%s", out);
    p = strchr(p, '\n');
    int64_t total = 0, last = INT64_MAX;
    int rows = 0;
    while (p && strncmp(p + 1, "  (", 3) == 0) {
        char a[64], b[64];
        long long count = 0;
        if (sscanf(p + 1, "  ('%63[^']', '%63[^']', %lld)", a, b, &count) != 3)
            fail_msg("most_confused line not (actual, predicted, count): %.80s", p + 1);
        int ia = class_of(a, n_classes, names), ib = class_of(b, n_classes, names);
        if (ia < 0 || ib < 0 || ia == ib || count < 1 || count > last)
            fail_msg("most_confused line %d wrong: %.80s", rows, p + 1);
        last = count;
        total += count;
        rows++;
        p = strchr(p + 1, '\n');
    }
    return total;
}

/* Pixels of the figure that are dark (every channel < 40) in each cell of a 3 x 3 split of the
 * area under the title: Fashion-MNIST tiles have black backgrounds. */
static void dark_per_cell(const char *name, int64_t cells[9], int *w, int *h) {
    unsigned char *px = test_png_load_rgb(path_in(name), w, h);
    memset(cells, 0, 9 * sizeof *cells);
    for (int y = 0; y < *h; y++)
        for (int x = 0; x < *w; x++) {
            const unsigned char *p = px + 3 * ((int64_t)y * *w + x);
            if (p[0] < 40 && p[1] < 40 && p[2] < 40) cells[(y * 3 / *h) * 3 + x * 3 / *w]++;
        }
    free(px);
}

/* 9 images in a 3 x 3 grid: every cell holds a good part of a 28 x 28 black-background tile. */
static void expect_nine_tiles(const char *name) {
    int64_t cells[9];
    int w, h;
    dark_per_cell(name, cells, &w, &h);
    assert_true(w >= 64 && h >= 64);
    for (int c = 0; c < 9; c++)
        if (cells[c] < (int64_t)w * h / 9 / 20)
            fail_msg("%s: grid cell %d holds %lld dark pixels of %d", name, c, (long long)cells[c],
                     w * h / 9);
}

/* Pixels of a clearly blue shade (the confusion matrix's cells), and of green and red text
 * (show_results' titles). */
static void count_colours(const char *name, int64_t *blue, int64_t *green, int64_t *red) {
    int w, h;
    unsigned char *px = test_png_load_rgb(path_in(name), &w, &h);
    *blue = *green = *red = 0;
    for (int64_t i = 0; i < (int64_t)w * h; i++) {
        const unsigned char *p = px + 3 * i;
        if (p[2] > 120 && p[0] + 40 < p[2]) ++*blue;
        if (p[1] > 90 && p[0] < 60 && p[2] < 60) ++*green;
        if (p[0] > 150 && p[1] < 60 && p[2] < 60) ++*red;
    }
    free(px);
}

/* train --plots on 300 Fashion-MNIST images (2 fork workers: the predictions and their losses
 * come home), then eval --plots of the model on the same 60 validation images: each figure is
 * a PNG showing what it should, the most_confused rows add up to the misclassified images
 * (samples x (1 - accuracy)). */
static void test_train_and_eval_figures(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    run_result r = run("train --idx " FMNIST " --limit 300 --epochs 1 --arch simple-cnn --aug "
                       "--cores 2 --quiet --out m.safetensors --plots train_figs");
    expect(&r, 0, "figure: train_figs/show_batch.png", NULL);
    static const char *const train_figs[] = {"show_batch", "show_results", "top_losses",
                                             "confusion"};
    for (int i = 0; i < 4; i++) {
        char line[96], file[96];
        snprintf(line, sizeof line, "figure: train_figs/%s.png\n", train_figs[i]);
        snprintf(file, sizeof file, "train_figs/%s.png", train_figs[i]);
        if (!strstr(r.out, line) || !file_exists(file))
            fail_msg("train --plots: no %s\nstdout: %s\nstderr: %s", file, r.out, r.err);
    }
    expect_nine_tiles("train_figs/show_batch.png");
    expect_nine_tiles("train_figs/show_results.png");
    expect_nine_tiles("train_figs/top_losses.png");
    int64_t blue, green, red;
    count_colours("train_figs/confusion.png", &blue, &green, &red);
    assert_true(blue > 500);
    count_colours("train_figs/show_results.png", &blue, &green, &red);
    assert_true(green + red > 50);
    /* the validation accuracy of the only epoch: 60 images */
    const char *res = strstr(r.out, "result:");
    assert_non_null(res);
    const char *acc = strstr(res, " accuracy ");
    assert_non_null(acc);
    double accuracy = strtod(acc + 10, NULL);
    int64_t wrong = most_confused_total(r.out, 10, fmnist_names);
    assert_int_equal(wrong, (int64_t)(60 * (1 - accuracy) + 0.5));
    run_free(&r);

    r = run("eval m.safetensors --idx " FMNIST " --limit 300 --plots eval_figs");
    expect(&r, 0, "figure: eval_figs/show_results.png", NULL);
    assert_non_null(strstr(r.out, "figure: eval_figs/top_losses.png"));
    assert_non_null(strstr(r.out, "figure: eval_figs/confusion.png"));
    assert_false(file_exists("eval_figs/show_batch.png")); /* train's only */
    expect_nine_tiles("eval_figs/show_results.png");
    expect_nine_tiles("eval_figs/top_losses.png");
    count_colours("eval_figs/confusion.png", &blue, &green, &red);
    assert_true(blue > 500);
    int64_t n = (int64_t)value_of(r.out, "samples");
    assert_int_equal(n, 60);
    wrong = most_confused_total(r.out, 10, fmnist_names);
    assert_int_equal(wrong, (int64_t)(n * (1 - value_of(r.out, "accuracy")) + 0.5));
    run_free(&r);

    /* the same as JSON: the figures and [actual, predicted, count] rows */
    r = run("eval m.safetensors --idx " FMNIST " --limit 300 --plots eval_figs --json");
    expect(&r, 0, NULL, NULL);
    cJSON *j = cJSON_Parse(r.out);
    if (!j) fail_msg("eval --json printed no JSON: %s", r.out);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "figures")), 3);
    const cJSON *mc = cJSON_GetObjectItem(j, "most_confused"), *row;
    int64_t sum = 0;
    cJSON_ArrayForEach(row, mc) {
        assert_int_equal(cJSON_GetArraySize(row), 3);
        assert_true(class_of(cJSON_GetArrayItem(row, 0)->valuestring, 10, fmnist_names) >= 0);
        sum += (int64_t)cJSON_GetArrayItem(row, 2)->valuedouble;
    }
    assert_int_equal(sum, wrong);
    cJSON_Delete(j);
    run_free(&r);
}

/* eval --tta: with beta 1 the blend is the plain predictions (the plain loss and accuracy
 * again); fastai's default (4 passes, beta 0.25) moves the loss; bad values are usage errors. */
static void test_eval_tta(void **state) {
    (void)state;
    run_result r = run("train --idx " FMNIST " --limit 300 --epochs 1 --arch simple-cnn --cores 1 "
                       "--quiet --out t.safetensors");
    expect(&r, 0, "model: t.safetensors", NULL);
    run_free(&r);
    r = run("eval t.safetensors --idx " FMNIST " --limit 300 --tta-beta 1");
    expect(&r, 0,
           "tta: 4 augmented passes (aug_transforms(): the model was trained without "
           "augmentation), beta 1\n",
           NULL);
    double loss = value_of(r.out, "valid_loss"), tta_loss = value_of(r.out, "tta_valid_loss");
    if (!(fabs(tta_loss - loss) <= 1e-5 * loss))
        fail_msg("beta 1: tta_valid_loss %.9g, valid_loss %.9g", tta_loss, loss);
    assert_true(value_of(r.out, "tta_accuracy") == value_of(r.out, "accuracy"));
    run_free(&r);
    r = run("eval t.safetensors --idx " FMNIST " --limit 300 --tta");
    expect(&r, 0,
           "tta: 4 augmented passes (aug_transforms(): the model was trained without "
           "augmentation), beta 0.25\n",
           NULL);
    loss = value_of(r.out, "valid_loss");
    tta_loss = value_of(r.out, "tta_valid_loss");
    double tta_acc = value_of(r.out, "tta_accuracy");
    if (!(isfinite(tta_loss) && fabs(tta_loss - loss) > 1e-6 && tta_acc >= 0 && tta_acc <= 1))
        fail_msg("--tta: tta_valid_loss %.9g (valid_loss %.9g), tta_accuracy %g", tta_loss, loss,
                 tta_acc);
    run_free(&r);
    r = run("eval t.safetensors --idx " FMNIST " --limit 300 --tta-n 2 --tta-beta 0 --json");
    expect(&r, 0, "\"tta_n\":\t2", NULL);
    assert_non_null(strstr(r.out, "\"tta_beta\":\t0"));
    assert_non_null(strstr(r.out, "\"tta_valid_loss\":"));
    run_free(&r);
    r = run("eval t.safetensors --idx " FMNIST " --tta-n 0");
    expect(&r, 2, NULL, "--tta-n expects a whole number in [1,");
    run_free(&r);
    r = run("eval t.safetensors --idx " FMNIST " --tta-beta 2");
    expect(&r, 2, NULL, "--tta-beta expects a number in");
    run_free(&r);
}

/* A table: train --plots and eval --plots draw the confusion matrix and print most_confused,
 * and no image figure; --tta is refused. */
static void test_tabular_figures(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    FILE *f = fopen(path_in("table.csv"), "w");
    fprintf(f, "color,size,label\n");
    static const char *const colors[] = {"red", "green", "blue"};
    cf_rng rng;
    cf_rng_seed(&rng, 5);
    for (int i = 0; i < 200; i++) {
        const char *c = colors[cf_rng_below(&rng, 3)];
        double size = cf_rng_uniform(&rng) * 10;
        /* labels with a quote, to see them printed as Python does */
        fprintf(f, "%s,%.3f,%s\n", c, size, (size > 5) != (c[0] == 'b') ? "it's" : "no");
    }
    fclose(f);
    run_result r = run("train --csv table.csv --cat color --cont size --target label --epochs 1 "
                       "--cores 1 --bs 16 --quiet --out tab.safetensors --plots tab_figs");
    expect(&r, 0, "figure: tab_figs/confusion.png", NULL);
    assert_non_null(strstr(r.out, "most_confused (actual, predicted, count):"));
    assert_false(file_exists("tab_figs/show_batch.png"));
    assert_false(file_exists("tab_figs/show_results.png"));
    assert_false(file_exists("tab_figs/top_losses.png"));
    int64_t blue, green, red;
    count_colours("tab_figs/confusion.png", &blue, &green, &red);
    assert_true(blue > 500);
    run_free(&r);
    r = run("eval tab.safetensors --csv table.csv --plots tab_eval");
    expect(&r, 0, "figure: tab_eval/confusion.png", NULL);
    assert_false(file_exists("tab_eval/show_results.png"));
    /* every misclassified row is in a most_confused line, named as Python prints the class */
    int64_t n = (int64_t)value_of(r.out, "samples");
    int64_t wrong = (int64_t)(n * (1 - value_of(r.out, "accuracy")) + 0.5);
    int64_t listed = 0;
    const char *p = r.out;
    long long count;
    while ((p = strstr(p, "  (")) != NULL) {
        if (sscanf(p, "  (\"it's\", 'no', %lld)", &count) == 1 ||
            sscanf(p, "  ('no', \"it's\", %lld)", &count) == 1)
            listed += count;
        else
            fail_msg("most_confused line: %.60s", p);
        p += 3;
    }
    assert_int_equal(listed, wrong);
    run_free(&r);
    r = run("eval tab.safetensors --csv table.csv --tta");
    expect(&r, 2, NULL, "--tta is for image classifiers (a table has no augmentation)");
    run_free(&r);
}

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(dir, sizeof dir, "cf_cli_figures_");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_and_eval_figures),
        cmocka_unit_test(test_eval_tta),
        cmocka_unit_test(test_tabular_figures),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
