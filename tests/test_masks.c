/* Segmentation data: codes read as fastai's np.loadtxt, masks found by the label rule with
 * their pixels as class ids (nearest resize, ids >= n_codes refused by file, x, y and value),
 * and the loaders' flip and crop moving each mask with its image. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "child.h"
#include "corefit.h"

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#endif

static char dir[256];

static const char *at(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

#define write_text(name, text) test_write_in(dir, name, text)

static void test_codes_read(void **state) {
    (void)state;
    write_text("codes.txt", "background\r\n\n  road \ncar");
    char **codes = NULL;
    int n = 0;
    assert_int_equal(cf_codes_read(at("codes.txt"), &codes, &n), CF_OK);
    assert_int_equal(n, 3);
    assert_string_equal(codes[0], "background");
    assert_string_equal(codes[1], "road");
    assert_string_equal(codes[2], "car");
    cf_codes_free(codes, n);
    write_text("empty.txt", "\n \n");
    assert_int_equal(cf_codes_read(at("empty.txt"), &codes, &n), CF_ERR_FORMAT);
    assert_null(codes);
}

#ifdef CF_HAVE_STB
/* A w x h mask whose pixel (x, y) is (x + 2y) % k, and its image (pixel * 40). */
static void write_pair(const char *stem, int w, int h, int k) {
    uint8_t m[64 * 64], im[64 * 64];
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            m[y * w + x] = (uint8_t)((x + 2 * y) % k);
            im[y * w + x] = (uint8_t)(m[y * w + x] * 40);
        }
    char name[128];
    snprintf(name, sizeof name, "images/%s.png", stem);
    assert_true(stbi_write_png(at(name), w, h, 1, im, w));
    snprintf(name, sizeof name, "labels/%s_P.png", stem);
    assert_true(stbi_write_png(at(name), w, h, 1, m, w));
}
#endif

static void test_masks_by_rule(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    char images[512], labels[512];
    snprintf(images, sizeof images, "%s/images", dir);
    snprintf(labels, sizeof labels, "%s/labels", dir);
    assert_int_equal(mkdir(images, 0777), 0);
    assert_int_equal(mkdir(labels, 0777), 0);
    write_pair("b", 8, 6, 3);
    write_pair("a", 8, 6, 3);
    const char *codes[] = {"bg", "one", "two"};
    cf_mask_rule rule = {labels, "_P", ".png"};
    cf_image_folder_options o = {.channels = 1};
    cf_dataset *tr = NULL, *va = NULL;
    assert_int_equal(cf_datasets_from_masks(images, &rule, codes, 3, &o, &tr, &va), CF_OK);
    assert_int_equal(tr->n, 2);
    assert_int_equal(va->n, 0);
    assert_true(tr->masks);
    assert_int_equal(tr->n_classes, 3);
    assert_string_equal(tr->vocab[2], "two");
    assert_int_equal(tr->target_dim, 48);
    for (int64_t i = 0; i < tr->n; i++)
        for (int y = 0; y < 6; y++)
            for (int x = 0; x < 8; x++) {
                const float id = tr->y[i * 48 + y * 8 + x];
                assert_float_equal(id, (float)((x + 2 * y) % 3), 0);
                assert_float_equal(tr->x[i * 48 + y * 8 + x], id * 40 / 255.0f, 1e-6);
            }
    cf_dataset_free(tr);
    cf_dataset_free(va);

    /* resized to 4x4: PIL's NEAREST takes source pixel floor((o + 0.5) * in / out) */
    o.size = 4;
    o.valid_pct = 0.5;
    o.seed = 1;
    assert_int_equal(cf_datasets_from_masks(images, &rule, codes, 3, &o, &tr, &va), CF_OK);
    assert_int_equal(tr->n, 1);
    assert_int_equal(va->n, 1);
    assert_true(va->masks);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++) {
            const int sx = (int)((x + 0.5) * 8 / 4), sy = (int)((y + 0.5) * 6 / 4);
            assert_float_equal(va->y[y * 4 + x], (float)((sx + 2 * sy) % 3), 0);
        }
    cf_dataset_free(tr);
    cf_dataset_free(va);

    /* a class id beyond the codes is refused by file, position and value */
    write_pair("c", 8, 6, 5);
    o.size = 0;
    o.valid_pct = 0;
    assert_int_equal(cf_datasets_from_masks(images, &rule, codes, 3, &o, &tr, &va), CF_ERR_FORMAT);
    assert_null(tr);
    assert_null(va);
    assert_non_null(strstr(cf_last_error(), "c_P.png"));
    /* the first pixel >= 3 in row order: (x + 2y) % 5 == 3 at x=3, y=0 */
    assert_non_null(strstr(cf_last_error(), "x=3 y=0 is 3"));
    unlink(at("images/c.png"));
    unlink(at("labels/c_P.png"));

    /* a missing mask names its path */
    uint8_t px[48] = {0};
    assert_true(stbi_write_png(at("images/d.png"), 8, 6, 1, px, 8));
    assert_int_equal(cf_datasets_from_masks(images, &rule, codes, 3, &o, &tr, &va), CF_ERR_IO);
    assert_non_null(strstr(cf_last_error(), "d_P.png"));
    /* a mask of another size than its image */
    assert_true(stbi_write_png(at("labels/d_P.png"), 6, 8, 1, px, 6));
    assert_int_equal(cf_datasets_from_masks(images, &rule, codes, 3, &o, &tr, &va), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "6x8"));
    unlink(at("images/d.png"));
    unlink(at("labels/d_P.png"));
#endif
}

static void test_flip_and_crop_move_masks(void **state) {
    (void)state;
    /* each image's pixel is its mask's class / 10, so a moved image and mask agree pixel by
     * pixel; a crop's padding is 0 in both */
    const int n = 32, s = 8;
    float *x = malloc(sizeof(float) * n * s * s), *y = malloc(sizeof(float) * n * s * s);
    for (int i = 0; i < n * s * s; i++) {
        y[i] = (float)((i * 7 + i / 13) % 4);
        x[i] = y[i] / 10.0f;
    }
    cf_dataset *ds = NULL;
    assert_int_equal(
        cf_dataset_from_arrays(x, y, n, cf_shape_make(3, (int[]){1, s, s}), s * s, 4, &ds), CF_OK);
    ds->masks = true;
    cf_dl_options o = {.bs = n, .flip = true, .crop_pad = 2, .seed = 4, .prefetch = -1};
    cf_dataloader *dl = NULL;
    assert_int_equal(cf_dataloader_new(ds, &o, &dl), CF_OK);
    int moved = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        assert_int_equal(cf_dataloader_begin_epoch(dl, epoch), CF_OK);
        const cf_batch *b = NULL;
        assert_int_equal(cf_dataloader_next(dl, &b), CF_OK);
        for (int i = 0; i < b->size; i++) {
            const float *bx = b->x.data + (size_t)i * s * s, *by = b->y.data + (size_t)i * s * s;
            for (int p = 0; p < s * s; p++) assert_float_equal(bx[p] * 10.0f, by[p], 1e-5);
            moved += memcmp(by, y + (size_t)b->idx[i] * s * s, sizeof(float) * s * s) != 0;
        }
    }
    assert_true(moved > n); /* most samples were flipped or shifted */
    assert_memory_equal(ds->y, y, sizeof(float) * n * s * s); /* the set itself untouched */
    cf_dataloader_free(dl);
    /* the affine batch transforms are refused for masks */
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    o.aug = &aug;
    assert_int_equal(cf_dataloader_new(ds, &o, &dl), CF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cf_last_error(), "masks"));
    cf_dataset_free(ds);
    free(x);
    free(y);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cf_test_masks_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes_read),
        cmocka_unit_test(test_masks_by_rule),
        cmocka_unit_test(test_flip_and_crop_move_masks),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) rc = rc ? rc : 1;
    return rc;
}
