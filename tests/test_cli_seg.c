/* Segmentation from the command line: fmnist-tasks segmentation writes scenes, masks in
 * labels/ and codes.txt (seeded: the same files twice), which cf_datasets_from_masks reads back
 * with fastai's CamVid rule; every garment pixel is labelled with its class + 1 and the
 * background 0. train --masks fits a U-Net on them and exports it; eval --masks, predict --out
 * (the decoded mask as a gray PNG, the library's prediction pixel for pixel) and info read it
 * back; the options' usage and data errors; the mask colours; the U-Net's --self-attention and
 * --blur through the model file. */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CLI_FIXTURE_PREFIX "cf_cli_seg_"
#include "cli_fixture.h"
#include "corefit.h"
#include "corefit/io.h"
#include "corefit/plot.h"
#include "plot/plot_internal.h"

static void test_segmentation_scenes(void **state) {
    (void)state;
    run_fmnist_tasks(COREFIT " fmnist-tasks segmentation seg --n 24 --size 32 --seed 3");
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

/* Writes the scenes once for the tests below (skips without stb or Fashion-MNIST). */
static void make_scenes(void) {
    run_fmnist_tasks("test -f seg/codes.txt || " COREFIT
                     " fmnist-tasks segmentation seg --n 24 --size 32 --seed 3");
}

/* The number after `key` on train's "result:" line (NAN when absent). */
static double value_after(const char *key) {
    const char *r = strstr(out, "result:");
    const char *p = r ? strstr(r, key) : NULL;
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

static void test_train_eval_predict_masks(void **state) {
    (void)state;
    make_scenes();
    /* fastai's CamVid layout: masks in labels/ beside images/, named <stem>_P.png, codes.txt
     * (--deadline: a sanitizer build on a busy machine spends minutes on a batch) */
    int rc = run(COREFIT " train --images seg/images --masks --mask-dir labels --mask-suffix "
                         "_P.png --codes seg/codes.txt --arch resnet18 --size 32 --bs 8 --epochs 1 "
                         "--cores 2 --deadline 900 --out m/unet.safetensors --plots plots 2>&1");
    if (rc != 0) print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "11 codes from seg/codes.txt (background, tshirt"));
    assert_non_null(strstr(out, "model: unet-resnet18"));
    assert_non_null(strstr(out, "worker processes (fork)")); /* the cf_par_ twins */
    assert_non_null(strstr(out, "foreground_acc  dice_multi"));
    const double loss = value_after("valid_loss "), fg = value_after("foreground_acc "),
                 dice = value_after("dice_multi ");
    assert_true(isfinite(loss) && loss > 0);
    assert_true(fg >= 0 && fg <= 1);
    assert_true(dice >= 0 && dice <= 1);
    if (cf_plot_available()) {
        assert_non_null(strstr(out, "figure: plots/show_batch.png"));
        assert_non_null(strstr(out, "figure: plots/show_results.png"));
        /* show_results: Target | Prediction rows for the 4 validation images, taller than wide */
        char path[512];
        snprintf(path, sizeof path, "%s/plots/show_results.png", g_dir);
        int w, h;
        unsigned char *px = test_png_load_rgb(path, &w, &h);
        free(px);
        assert_true(h > w);
    }
    /* info: a U-Net over the codes */
    assert_int_equal(run(COREFIT " info m/unet.safetensors"), 0);
    assert_non_null(strstr(out, "arch:        unet-resnet18"));
    assert_non_null(strstr(out, "targets:     masks of 32 x 32 class ids (segmentation"));
    assert_non_null(strstr(out, "classes:     background, tshirt, trouser"));
    /* eval: every image of the folder with the training metrics */
    assert_int_equal(run(COREFIT " eval m/unet.safetensors --images seg/images --masks --json "
                                 "--plots eval_plots 2>/dev/null"),
                     0);
    if (!strstr(out, "\"n\":\t24")) fail_msg("eval --masks: %s", out);
    assert_non_null(strstr(out, "\"foreground_acc\""));
    assert_non_null(strstr(out, "\"dice_multi\""));
    if (cf_plot_available()) assert_int_equal(run("test -s eval_plots/show_results.png"), 0);
    /* predict --out: the decoded mask, the library's argmax pixel for pixel */
    assert_int_equal(run(COREFIT " predict m/unet.safetensors seg/images/00003.png --out "
                                 "mask.png"),
                     0);
    assert_non_null(strstr(out, "seg/images/00003.png\tmask.png\t"));
    char path[512], image[512];
    snprintf(path, sizeof path, "%s/m/unet.safetensors", g_dir);
    snprintf(image, sizeof image, "%s/seg/images/00003.png", g_dir);
    cf_learner *learn = NULL;
    assert_int_equal(cf_load_learner(path, &learn), CF_OK);
    float *probs = malloc(sizeof(float) * 11 * 32 * 32);
    assert_int_equal(cf_predict_image_file(learn, image, probs, NULL), CF_OK);
    snprintf(path, sizeof path, "%s/mask.png", g_dir);
    int w, h;
    unsigned char *px = test_png_load_rgb(path, &w, &h);
    assert_int_equal(w, 32);
    assert_int_equal(h, 32);
    int64_t shares[11] = {0};
    for (int p = 0; p < 32 * 32; p++) {
        int best = 0;
        for (int c = 1; c < 11; c++)
            if (probs[c * 1024 + p] > probs[best * 1024 + p]) best = c;
        assert_int_equal(px[3 * p], best); /* gray: r = g = b = class id */
        assert_int_equal(px[3 * p + 1], best);
        shares[best]++;
    }
    free(px);
    free(probs);
    cf_learner_free(learn);
    /* the printed shares are the mask's, largest first */
    int64_t top = 0;
    for (int c = 1; c < 11; c++)
        if (shares[c] > shares[top]) top = c;
    char expect[64];
    snprintf(expect, sizeof expect, "\tmask.png\t%s:%.4f",
             (const char *[]){"background", "tshirt", "trouser", "pullover", "dress", "coat",
                              "sandal", "shirt", "sneaker", "bag", "boot"}[top],
             (double)shares[top] / 1024);
    if (!strstr(out, expect)) fail_msg("'%s' not in: %s", expect, out);
    /* several images: --out is a folder of <stem>.png */
    assert_int_equal(run(COREFIT " predict m/unet.safetensors seg/images/00001.png "
                                 "seg/images/00002.png --out masks --json"),
                     0);
    assert_non_null(strstr(out, "\"mask\":\t\"masks/00002.png\""));
    assert_int_equal(run("cmp -s masks/00001.png masks/00001.png && test -s masks/00002.png"), 0);
}

static void test_mask_option_errors(void **state) {
    (void)state;
    make_scenes();
    assert_int_equal(run(COREFIT " train --masks --size 32"), 2);
    assert_non_null(strstr(out, "--masks reads a folder of images: give --images DIR"));
    assert_int_equal(run(COREFIT " train --images seg/images --mask-dir labels"), 2);
    assert_non_null(strstr(out, "--mask-dir, --mask-suffix and --codes need --masks"));
    assert_int_equal(run(COREFIT " train --images seg/images --masks --arch mini-resnet"), 2);
    assert_non_null(strstr(out, "not --arch mini-resnet"));
    assert_int_equal(run(COREFIT " train --images seg/images --masks --metrics accuracy"), 2);
    assert_non_null(strstr(out, "unknown --metrics name 'accuracy' for --masks"));
    assert_int_equal(run(COREFIT " train --images seg/images --masks --aug"), 2);
    /* no codes: the file looked for is named */
    assert_int_equal(run("mkdir -p bare/images bare/labels && cp seg/images/00001.png "
                         "bare/images/ && cp seg/labels/00001_P.png bare/labels/"),
                     0);
    assert_int_equal(run(COREFIT " train --images bare/images --masks --size 32 --quiet"), 1);
    assert_non_null(strstr(out, "bare/codes.txt"));
    /* a mask pixel beyond the codes: the file, the pixel and its value */
    test_write_in(g_dir, "bare/codes.txt", "background\ntshirt\n");
    assert_int_equal(run(COREFIT " train --images bare/images --masks --size 32 --quiet"), 1);
    assert_non_null(strstr(out, "bare/labels/00001_P.png: pixel x="));
    assert_non_null(strstr(out, "not a class id (2 codes: 0..1)"));
}

/* fastai's mask colours: tab20 over vmin 0, vmax len(codes), blended at alpha 0.5. */
static void test_mask_colours(void **state) {
    (void)state;
    float rgb[3];
    cf_plot__mask_colour(0, 11, rgb); /* tab20's first: #1f77b4 */
    assert_float_equal(rgb[0], 31 / 255.0f, 1e-6);
    assert_float_equal(rgb[2], 180 / 255.0f, 1e-6);
    cf_plot__mask_colour(10, 11, rgb); /* 10/11 * 20 = 18.2: #17becf */
    assert_float_equal(rgb[0], 23 / 255.0f, 1e-6);
    assert_float_equal(rgb[1], 190 / 255.0f, 1e-6);
    cf_plot__mask_colour(1, 2, rgb); /* 1/2 * 20 = 10: #8c564b */
    assert_float_equal(rgb[0], 140 / 255.0f, 1e-6);
    cf_plot__mask_colour(2, 2, rgb); /* vmax: the last colour, #9edae5 */
    assert_float_equal(rgb[0], 158 / 255.0f, 1e-6);
    /* a 2x2 tile of a 4x4 mask: each tile pixel takes the mask at its centre, half and half */
    float tile[2 * 2 * 3], mask[16] = {0};
    for (int i = 0; i < 12; i++) tile[i] = 1.0f;
    mask[3 * 4 + 3] = 1; /* the bottom-right tile pixel samples (floor(1.5 * 2), floor(1.5 * 2)) */
    cf_plot__mask_overlay(tile, 2, 2, mask, 4, 4, 2);
    assert_float_equal(tile[0], 0.5f + 0.5f * 31 / 255.0f, 1e-6);
    assert_float_equal(tile[9], 0.5f + 0.5f * 140 / 255.0f, 1e-6);
    assert_float_equal(tile[11], 0.5f + 0.5f * 75 / 255.0f, 1e-6);
}

/* unet_learner(resnet18, pretrained): torchvision's weights (random here, made by Debian's
 * python3-torchvision and converted by tools/convert_pth.py) fill the U-Net's encoder, tensor
 * by tensor, and the learner is frozen (the encoder's groups do not train). */
static void test_pretrained_torchvision_encoder(void **state) {
    (void)state;
    if (run("/usr/bin/python3 -c 'import torchvision'") != 0) skip();
    test_write_in(g_dir, "make_resnet.py",
                  "import torch, torchvision\n"
                  "torch.manual_seed(0)\n"
                  "m = torchvision.models.resnet18(weights=None)\n"
                  "torch.save(m.state_dict(), 'r18.pth')\n");
    if (run("/usr/bin/python3 make_resnet.py && /usr/bin/python3 " CF_SOURCE_DIR
            "/tools/convert_pth.py r18.pth r18.safetensors") != 0)
        fail_msg("%s", out);
    enum { N = 4, S = 32 };
    float *x = calloc((size_t)N * 3 * S * S, sizeof(float)), *y = calloc((size_t)N * S * S, 4);
    for (int i = 0; i < N * 3 * S * S; i++) x[i] = (float)(i % 7) / 7;
    cf_dataset *a = NULL, *b = NULL;
    cf_shape shape = cf_shape_make(3, (int[]){3, S, S});
    assert_int_equal(cf_dataset_from_arrays(x, y, N, shape, S * S, 2, &a), CF_OK);
    assert_int_equal(cf_dataset_from_arrays(x, y, N, shape, S * S, 2, &b), CF_OK);
    a->masks = b->masks = true;
    free(x);
    free(y);
    cf_dls *dls = NULL;
    assert_int_equal(cf_dls_new(a, b, &(cf_dls_options){.bs = 2, .prefetch = -1}, &dls), CF_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/r18.safetensors", g_dir);
    cf_learner *learn = NULL;
    cf_status st = cf_unet_learner(&learn, dls, "resnet18", .pretrained = path, .quiet = true);
    if (st) fail_msg("%s", cf_last_error());
    cf_st_file *file = NULL;
    assert_int_equal(cf_st_read(path, &file), CF_OK);
    static const char *const pairs[][2] = {{"layers.0.0.weight", "conv1.weight"},
                                           {"layers.0.1.running_var", "bn1.running_var"},
                                           {"layers.0.4.0.conv1.weight", "layer1.0.conv1.weight"},
                                           {"layers.0.7.1.bn2.bias", "layer4.1.bn2.bias"}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        const cf_param *p = cf_model_param(learn->model, pairs[i][0]);
        const cf_st_entry *e = cf_st_find(file, pairs[i][1]);
        if (!p || !e) fail_msg("%s or %s missing", pairs[i][0], pairs[i][1]);
        assert_int_equal(p->numel, e->numel);
        assert_memory_equal(p->data, e->data, p->numel * sizeof(float));
    }
    cf_st_free(file);
    /* frozen: the encoder's weights do not train, the decoder's do */
    assert_false(cf_model_param(learn->model, "layers.0.4.0.conv1.weight")->trainable);
    int trainable = 0;
    for (int i = 0; i < learn->model->n_params; i++)
        trainable += learn->model->params[i]->trainable &&
                     strncmp(learn->model->params[i]->full_name, "layers.0.", 9) != 0;
    assert_true(trainable > 0);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* --self-attention and --blur build fastai's DynamicUnet with self_attention=True and
 * blur=True; the model file records them, info prints them, and predict rebuilds that U-Net
 * (its SelfAttention's gamma among the tensors) and writes the library's mask pixel for pixel;
 * without --masks they are refused. */
static void test_unet_options(void **state) {
    (void)state;
    make_scenes();
    int rc = run(COREFIT " train --images seg/images --masks --codes seg/codes.txt --arch "
                         "xresnet18 --size 32 --bs 4 --epochs 1 --limit 8 --cores 1 "
                         "--self-attention --blur --deadline 900 --out m/sa.safetensors 2>&1");
    if (rc != 0) print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_int_equal(run(COREFIT " info m/sa.safetensors"), 0);
    if (!strstr(out, "unet:        blur=True, blur_final=True, self_attention=True, "
                     "y_range=None, last_cross=True, bottle=False, norm_type=None, "
                     "act_cls=ReLU"))
        fail_msg("info: %s", out);
    assert_int_equal(run(COREFIT " info m/sa.safetensors --json"), 0);
    assert_non_null(strstr(out, "\"corefit.unet\""));
    assert_int_equal(run(COREFIT " predict m/sa.safetensors seg/images/00003.png --out sa.png"), 0);
    char path[512], image[512];
    snprintf(path, sizeof path, "%s/m/sa.safetensors", g_dir);
    snprintf(image, sizeof image, "%s/seg/images/00003.png", g_dir);
    cf_learner *learn = NULL;
    assert_int_equal(cf_load_learner(path, &learn), CF_OK);
    assert_true(learn->recipe.unet.self_attention && learn->recipe.unet.blur);
    bool gamma = false;
    for (int i = 0; i < learn->model->n_params; i++)
        gamma |= strstr(learn->model->params[i]->full_name, ".gamma") != NULL;
    assert_true(gamma);
    float *probs = malloc(sizeof(float) * 11 * 32 * 32);
    assert_int_equal(cf_predict_image_file(learn, image, probs, NULL), CF_OK);
    snprintf(path, sizeof path, "%s/sa.png", g_dir);
    int w, h;
    unsigned char *px = test_png_load_rgb(path, &w, &h);
    assert_int_equal(w * h, 32 * 32);
    for (int p = 0; p < 32 * 32; p++) {
        int best = 0;
        for (int c = 1; c < 11; c++)
            if (probs[c * 1024 + p] > probs[best * 1024 + p]) best = c;
        assert_int_equal(px[3 * p], best);
    }
    free(px);
    free(probs);
    cf_learner_free(learn);
    assert_int_equal(run(COREFIT " train --images seg/images --self-attention"), 2);
    assert_non_null(strstr(out, "--self-attention and --blur are the U-Net's: they need --masks"));
    assert_int_equal(run(COREFIT " lr-find --images seg/images --blur"), 2);
    assert_non_null(strstr(out, "they need --masks"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segmentation_scenes),
        cmocka_unit_test(test_mask_colours),
        cmocka_unit_test(test_train_eval_predict_masks),
        cmocka_unit_test(test_mask_option_errors),
        cmocka_unit_test(test_unet_options),
        cmocka_unit_test(test_pretrained_torchvision_encoder),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
