/* corefit's other vision tasks end to end on tiny generated data: fmnist-tasks writes
 * multi-label mosaics and point images (seeded: the same files twice), train --images-csv
 * --multi-label / --points fits them, predict prints label sets and points; and the usage errors
 * of the task options. */
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CLI_FIXTURE_PREFIX "cf_cli_tasks_"
#include "cli_fixture.h"
#include "corefit/core.h"

static void test_multi_label_end_to_end(void **state) {
    (void)state;
    run_fmnist_tasks(COREFIT " fmnist-tasks multi-label ml --n 192 --seed 5");
    assert_int_equal(run(COREFIT " fmnist-tasks multi-label again --n 192 --seed 5"), 0);
    /* seeded: the same table and images */
    assert_int_equal(run("cmp ml/labels.csv again/labels.csv && cmp ml/images/00007.png "
                         "again/images/00007.png"),
                     0);
    assert_int_equal(run("head -1 ml/labels.csv; wc -l < ml/labels.csv"), 0);
    assert_non_null(strstr(out, "fname,labels,is_valid\n193"));
    assert_int_equal(run(COREFIT " train --images-csv ml/labels.csv --multi-label --valid-col "
                                 "is_valid --epochs 1 --bs 32 --cores 1 --seed 1 --out ml.st"),
                     0);
    assert_non_null(strstr(out, "accuracy_multi"));
    /* predict: the label set, then name=probability for the 10 garments; the set holds exactly
     * those above 0.5 */
    assert_int_equal(run(COREFIT " predict ml.st ml/images/00000.png"), 0);
    char *tab = strchr(out, '\t');
    assert_non_null(tab);
    char set[256];
    size_t k = strcspn(tab + 1, "\t");
    assert_true(k < sizeof set);
    memcpy(set, tab + 1, k);
    set[k] = 0;
    int n_probs = 0, n_set = 0;
    for (char *p = tab + 1 + k; (p = strchr(p, '\t')) != NULL; p++) {
        char name[32];
        float prob;
        assert_int_equal(sscanf(p + 1, "%31[^=]=%f", name, &prob), 2);
        assert_true(prob > 0 && prob < 1);
        n_probs++;
        bool in_set = false;
        for (char *q = set; *q;) { /* set is name;name;... */
            size_t len = strcspn(q, ";");
            in_set |= len == strlen(name) && strncmp(q, name, len) == 0;
            q += len + (q[len] == ';');
        }
        assert_int_equal(in_set, prob > 0.5f);
        n_set += in_set;
    }
    assert_int_equal(n_probs, 10);
    assert_int_equal(n_set == 0, set[0] == 0);
    /* eval on the validation rows: accuracy_multi, the model's metric */
    assert_int_equal(run(COREFIT " eval ml.st --images-csv ml/labels.csv --multi-label --valid-col "
                                 "is_valid"),
                     0);
    assert_non_null(strstr(out, "accuracy_multi: 0."));
    /* an exported multi-label model says so in its metadata */
    assert_int_equal(run(COREFIT " predict --json ml.st ml/images/00001.png"), 0);
    assert_non_null(strstr(out, "\"labels\""));
    assert_non_null(strstr(out, "\"probabilities\""));
}

static void test_points_end_to_end(void **state) {
    (void)state;
    if (run(COREFIT " fmnist-tasks points pt --n 128 --size 48 --seed 2") != 0) {
        print_message("%s", out);
        skip();
    }
    assert_int_equal(run("head -1 pt/points.csv"), 0);
    assert_string_equal(out, "fname,x,y,is_valid\n");
    assert_int_equal(run(COREFIT " train --images-csv pt/points.csv --points --epochs 1 --bs 32 "
                                 "--cores 2 --split-batch --seed 1 --out pt.st"),
                     0);
    assert_non_null(strstr(out, "y_range: [-1, 1]"));
    assert_int_equal(run(COREFIT " eval pt.st --images-csv pt/points.csv --points"), 0);
    assert_non_null(strstr(out, "mae: "));
    assert_null(strstr(out, "accuracy"));
    assert_int_equal(run(COREFIT " info pt.st"), 0);
    assert_non_null(strstr(out, "targets:     1 point (x, y scaled to -1..1)"));
    assert_non_null(strstr(out, "y_range:     [-1, 1]"));
    assert_int_equal(run(COREFIT " predict pt.st pt/images/00003.png"), 0);
    float x, y;
    assert_int_equal(sscanf(out, "pt/images/00003.png\t%f\t%f", &x, &y), 2);
    /* inside the 48 x 48 image (y_range keeps the scaled point in -1..1) */
    assert_true(x >= 0 && x <= 48 && y >= 0 && y <= 48);
}

static void test_task_usage_errors(void **state) {
    (void)state;
    assert_int_equal(run(COREFIT " train --multi-label --epochs 1"), 2);
    assert_non_null(strstr(out, "need --images-csv"));
    assert_int_equal(run(COREFIT " train --images-csv x.csv --multi-label --points"), 2);
    assert_non_null(strstr(out, "one of --multi-label, --points and --regression"));
    assert_int_equal(run(COREFIT " train --images-csv x.csv --label-delim ';'"), 2);
    assert_non_null(strstr(out, "--label-delim is for --multi-label"));
    assert_int_equal(run(COREFIT " train --images-csv x.csv --multi-label --metrics accuracy"), 2);
    assert_non_null(strstr(out, "'accuracy' for --multi-label"));
    assert_int_equal(run(COREFIT " train --images-csv x.csv --points --limit 10"), 2);
    assert_non_null(strstr(out, "--limit is not available with --images-csv"));
    /* a file that is not there is a failure naming it */
    assert_int_equal(run(COREFIT " train --images-csv missing.csv --multi-label"), 1);
    assert_non_null(strstr(out, "missing.csv"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_label_end_to_end),
        cmocka_unit_test(test_points_end_to_end),
        cmocka_unit_test(test_task_usage_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
