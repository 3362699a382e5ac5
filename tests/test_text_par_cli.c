/* corefit's text commands beyond training, on a slice of Debian's fortunes: eval --text of a
 * language model and a classifier (a folder's valid/ texts and a CSV file) equals the last
 * epoch's validation that train printed for the same texts, perplexity is exp(valid_loss); a
 * label the model lacks is refused. train --text --plots writes a classifier's figures,
 * show_results and top losses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "child.h"
#include "corefit/core.h"
#include "oracle.h"

#define COREFIT CF_BUILD_DIR "/corefit"

static char g_dir[256];
static char out[1 << 16];

/* Runs a shell command in g_dir; its output (stdout and stderr) into out; the exit status. */
#define run(...) test_shell(g_dir, out, sizeof out, __VA_ARGS__)

/* The value after `key` in out (a "key: value" line or a JSON member). */
static double value_of(const char *key) {
    const char *p = strstr(out, key);
    if (!p) fail_msg("no %s in: %s", key, out);
    p += strlen(key);
    while (*p == '"' || *p == ':' || *p == ' ') p++;
    return strtod(p, NULL);
}

/* train's epoch table: the values of the last row (columns after the epoch number). */
static int last_epoch_row(double *values, int max) {
    const char *row = NULL;
    for (const char *p = out; (p = strchr(p, '\n')); p++)
        if (p[1] >= '0' && p[1] <= '9') row = p + 1;
    if (!row) fail_msg("no epoch row in: %s", out);
    char *end;
    strtol(row, &end, 10);
    int n = 0;
    while (n < max) {
        const char *s = end;
        double v = strtod(s, &end);
        if (end == s) break;
        values[n++] = v;
    }
    return n;
}

static void assert_rel(double a, double b, double tol, const char *what) {
    if (!(fabs(a - b) <= tol * fmax(1, fabs(b)))) fail_msg("%s: %.9g, expected %.9g", what, a, b);
}

/* train --text --plots p of a classifier: the figures are PNGs; show_results has 9 rows of text,
 * target and prediction; top_losses 9 rows, losses largest first, each at least -log of the
 * predicted class's probability (equal when the prediction is right), no more right
 * predictions among them than the accuracy allows. */
static void check_plots(double accuracy) {
    const char *pngs[] = {"show_batch", "loss", "schedule", "confusion_matrix"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(run("head -c 8 p/%s.png | od -An -tx1", pngs[i]), 0);
        assert_non_null(strstr(out, "89 50 4e 47 0d 0a 1a 0a"));
    }
    assert_int_equal(run("cat p/show_results.txt"), 0);
    assert_true(strncmp(out, "     text\tcategory\tcategory_\n", 29) == 0);
    int rows = 0;
    for (char *line = strchr(out, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
        char *tab = strchr(line + 1, '\t'), *tab2 = tab ? strchr(tab + 1, '\t') : NULL;
        assert_non_null(tab2);
        assert_true(strncmp(line + 1 + 5, "xxbos", 5) == 0);
        rows++;
    }
    assert_int_equal(rows, 9);
    assert_int_equal(run("cat p/top_losses.txt"), 0);
    assert_true(strncmp(out, "     input\ttarget\tpredicted\tprobability\tloss\n", 45) == 0);
    rows = 0;
    int right = 0;
    double last = INFINITY;
    for (char *line = strchr(out, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
        char target[64], predicted[64];
        double prob, loss;
        const char *cols = strchr(line + 1, '\t');
        assert_non_null(cols);
        assert_int_equal(
            sscanf(cols, "\t%63[^\t]\t%63[^\t]\t%lf\t%lf", target, predicted, &prob, &loss), 4);
        assert_true(loss <= last + 1e-12);
        last = loss;
        assert_true(loss >= -log(prob) - 1e-3);
        if (strcmp(target, predicted) == 0) {
            assert_true(fabs(loss + log(prob)) <= 1e-3);
            right++;
        }
        rows++;
    }
    assert_int_equal(rows, 9);
    assert_true(right <= (int)(accuracy * 30 + 0.5));
}

static void test_eval_text(void **state) {
    (void)state;
    struct stat sb;
    if (stat("/usr/share/games/fortunes/food", &sb) != 0) skip();
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_text_par_cli");
    assert_int_equal(run("/usr/bin/python3 %s/scripts/fortunes-folder f --topics food,love,science "
                         "--max-per-topic 40 --valid-pct 0.25",
                         CF_SOURCE_DIR),
                     0);
    const char *small = "--emb-sz 16 --n-hid 24 --n-layers 2 --bs 8 --seq-len 16";
    double row[8];
    /* the language model: train prints valid_loss, accuracy and perplexity of f/valid */
    assert_int_equal(
        run(COREFIT " train --text f --lm %s --min-freq 2 --cores 2 --out lm.safetensors", small),
        0);
    assert_int_equal(last_epoch_row(row, 8), 5); /* and the time's minutes */
    assert_int_equal(run(COREFIT " eval lm.safetensors --text f --bs 8 --seq-len 16 --cores 2"), 0);
    assert_true(value_of("texts") == 30);
    assert_rel(value_of("valid_loss"), row[1], 1e-5, "language model valid_loss");
    assert_rel(value_of("accuracy"), row[2], 1e-5, "language model accuracy");
    assert_rel(value_of("perplexity"), exp(value_of("valid_loss")), 1e-6, "perplexity");
    /* the classifier from its encoder */
    assert_int_equal(run(COREFIT " train --text f --encoder lm.safetensors --bs 8 --seq-len 16 "
                                 "--cores 2 --out clas.safetensors --plots p"),
                     0);
    assert_int_equal(last_epoch_row(row, 8), 4);
    check_plots(row[2]);
    assert_int_equal(run(COREFIT " eval clas.safetensors --text f --bs 8 --json"), 0);
    assert_non_null(strstr(out, "\"texts\": 30"));
    assert_rel(value_of("\"valid_loss\""), row[1], 1e-5, "classifier valid_loss");
    assert_rel(value_of("\"accuracy\""), row[2], 1e-5, "classifier accuracy");
    /* the same texts as a CSV file: every row is evaluated; one more row labelled with a class
     * the model lacks is refused, naming the file, the line and the label */
    assert_int_equal(run("/usr/bin/python3 -c \"import csv,os\n"
                         "w=csv.writer(open('v.csv','w',newline=''))\n"
                         "w.writerow(['text','label'])\n"
                         "for l in sorted(os.listdir('f/valid')):\n"
                         "  for n in sorted(os.listdir('f/valid/'+l)):\n"
                         "    w.writerow([open('f/valid/'+l+'/'+n).read(),l])\n\" && "
                         "cp v.csv bad.csv && echo 'Some words.,art' >> bad.csv"),
                     0);
    assert_int_equal(run(COREFIT " eval clas.safetensors --text v.csv --bs 8"), 0);
    assert_true(value_of("texts") == 30);
    assert_rel(value_of("valid_loss"), row[1], 1e-5, "classifier valid_loss from CSV");
    assert_int_equal(run(COREFIT " eval clas.safetensors --text bad.csv --bs 8"), 1);
    assert_non_null(strstr(out, "bad.csv:")); /* the row's line (texts span several) */
    assert_non_null(strstr(out, "label 'art' is not one of the model's 3 classes"));
    /* bad input: a text option on another kind of model, a missing model */
    assert_int_equal(
        run("cp lm.safetensors x.safetensors && " COREFIT " eval no-such.safetensors --text f"), 1);
    assert_non_null(strstr(out, "no-such.safetensors"));
    test_tmpdir_remove(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eval_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
