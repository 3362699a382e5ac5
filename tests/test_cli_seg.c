/* Segmentation data from the command line: fmnist-tasks segmentation writes scenes, masks in
 * labels/ and codes.txt (seeded: the same files twice), which cf_datasets_from_masks reads back
 * with fastai's CamVid rule; every garment pixel is labelled with its class + 1 and the
 * background 0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "child.h"
#include "oracle.h"
#include "corefit.h"

#define COREFIT CF_BUILD_DIR "/corefit"

static char g_dir[256];
static char out[1 << 16];

/* Runs a shell command in g_dir; its output (stdout and stderr) into out; the exit status. */
#define run(...) test_shell(g_dir, out, sizeof out, __VA_ARGS__)

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_cli_seg_");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_tmpdir_remove(g_dir);
}

static void test_segmentation_scenes(void **state) {
    (void)state;
    if (run(COREFIT " fmnist-tasks segmentation seg --n 24 --size 32 --seed 3") != 0) {
        print_message("%s", out);
        if (strstr(out, "stb_image_write") || strstr(out, "Fashion-MNIST")) skip();
        fail();
    }
    assert_int_equal(run(COREFIT " fmnist-tasks segmentation again --n 24 --size 32 --seed 3"), 0);
    assert_int_equal(run("cmp seg/codes.txt again/codes.txt && cmp seg/images/00005.png "
                         "again/images/00005.png && cmp seg/labels/00005_P.png "
                         "again/labels/00005_P.png"),
                     0);
    char path[512], images[512], labels[512];
    snprintf(path, sizeof path, "%s/seg/codes.txt", g_dir);
    snprintf(images, sizeof images, "%s/seg/images", g_dir);
    snprintf(labels, sizeof labels, "%s/seg/labels", g_dir);
    char **codes = NULL;
    int n_codes = 0;
    assert_int_equal(cf_codes_read(path, &codes, &n_codes), CF_OK);
    assert_int_equal(n_codes, 11);
    assert_string_equal(codes[0], "background");
    assert_string_equal(codes[10], "boot");
    cf_mask_rule rule = {labels, "_P", NULL};
    cf_image_folder_options o = {.channels = 1};
    cf_dataset *tr = NULL, *va = NULL;
    assert_int_equal(
        cf_datasets_from_masks(images, &rule, (const char *const *)codes, n_codes, &o, &tr, &va),
        CF_OK);
    assert_int_equal(tr->n, 24);
    assert_int_equal(tr->target_dim, 32 * 32);
    int several = 0;
    for (int64_t i = 0; i < tr->n; i++) {
        bool seen[11] = {false};
        int classes = 0;
        for (int p = 0; p < 32 * 32; p++) {
            const float id = tr->y[i * 1024 + p], px = tr->x[i * 1024 + p];
            assert_true(id >= 0 && id <= 10);
            assert_int_equal(id > 0, px > 0); /* garment pixels labelled, background 0 */
            if (id > 0 && !seen[(int)id]) seen[(int)id] = true, classes++;
        }
        assert_true(classes >= 1);
        several += classes >= 2;
    }
    assert_true(several >= 3); /* 1-3 garments a scene: some hold two classes or more */
    cf_dataset_free(tr);
    cf_dataset_free(va);
    cf_codes_free(codes, n_codes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segmentation_scenes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
