/* A photo task through the command line, as a fastai user walks it: a folder of RGB JPEGs and
 * PNGs of assorted sizes, torchvision's resnet18 weights (random, made here by Debian's
 * python3-torchvision, saved as a .pth and converted by tools/convert_pth.py), fine-tuned on 2
 * cores with augmentation, exported, then eval and predict, and this program's own
 * cf_load_learner giving predict's classes. Also: images listed in a CSV, labels from file names,
 * the Resize options, and the refusal of a --pretrained file corefit cannot use. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "child.h"
#include "corefit.h"
#include "oracle.h"

#define COREFIT CF_BUILD_DIR "/corefit"

static char g_dir[256];

/* Runs a shell command in g_dir; its output (stdout and stderr) into out; the exit status. */
#define run(out, size, ...) test_shell(g_dir, out, size, __VA_ARGS__)

/* Three classes told apart by their colour (red, green, blue dominant, with noise), JPEG and
 * PNG, 40 to 90 px, not square: photos/<class>/ and, for the other sources, flat/<class>_<i>.png
 * with labels.csv beside it. */
static const char *make_photos_py =
    "import os, random\n"
    "from PIL import Image\n"
    "random.seed(7)\n"
    "cols = {'cat': (200, 40, 40), 'dog': (40, 200, 40), 'fish': (40, 40, 200)}\n"
    "os.makedirs('flat', exist_ok=True)\n"
    "rows = ['file,label,is_valid']\n"
    "for c, base in cols.items():\n"
    "    os.makedirs('photos/' + c, exist_ok=True)\n"
    "    for i in range(14):\n"
    "        w, h = random.randint(40, 90), random.randint(40, 90)\n"
    "        im = Image.new('RGB', (w, h))\n"
    "        px = im.load()\n"
    "        for y in range(h):\n"
    "            for x in range(w):\n"
    "                px[x, y] = tuple(max(0, min(255, v + random.randint(-40, 40))) for v in "
    "base)\n"
    "        ext = 'jpg' if i % 2 else 'png'\n"
    "        im.save('photos/%s/%s_%d.%s' % (c, c, i, ext))\n"
    "        if i < 8:\n"
    "            im.save('flat/%s_%d.png' % (c, i))\n"
    "            rows.append('%s_%d,%s,%d' % (c, i, c, 1 if i >= 6 else 0))\n"
    "open('flat/labels.csv', 'w').write('\\n'.join(rows) + '\\n')\n";

/* torchvision's resnet18 with random weights, as a .pth (its state_dict). */
static const char *make_resnet_py = "import torch, torchvision\n"
                                    "torch.manual_seed(0)\n"
                                    "m = torchvision.models.resnet18(weights=None)\n"
                                    "torch.save(m.state_dict(), 'r18.pth')\n";

static int setup_dir(void **state) {
    (void)state;
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_cli_photo");
    static char out[1 << 14];
    test_write_in(g_dir, "make_photos.py", make_photos_py);
    if (run(out, sizeof out, "/usr/bin/python3 make_photos.py") != 0) {
        fprintf(stderr, "%s\n", out);
        return -1;
    }
    return 0;
}

static int remove_dir(void **state) {
    (void)state;
    return test_tmpdir_remove(g_dir);
}

/* The class predict printed for `file` (the field after the input, tab-separated). */
static bool predicted_class(const char *out, const char *file, char *cls, size_t size) {
    char key[512];
    snprintf(key, sizeof key, "%s\t", file);
    const char *p = strstr(out, key);
    if (!p) return false;
    p += strlen(key);
    size_t n = strcspn(p, "\t\n");
    snprintf(cls, size, "%.*s", (int)n, p);
    return true;
}

/* A figure that exists and is drawn: both dark (text, axes) and light pixels. */
static void expect_drawn(const char *path) {
    int w = 0, h = 0;
    unsigned char *px = test_png_load_rgb(path, &w, &h);
    if (!px) fail_msg("%s: not a PNG", path);
    int64_t dark = 0, light = 0;
    for (int64_t i = 0; i < (int64_t)w * h; i++) {
        int sum = px[3 * i] + px[3 * i + 1] + px[3 * i + 2];
        dark += sum < 150;
        light += sum > 600;
    }
    free(px);
    if (dark < 50 || light < 50)
        fail_msg("%s: %lld dark and %lld light pixels of %d x %d", path, (long long)dark,
                 (long long)light, w, h);
}

static void test_photo_task_end_to_end(void **state) {
    (void)state;
    static char out[1 << 17];
    if (run(out, sizeof out, "/usr/bin/python3 -c 'import torchvision'") != 0) skip();
    test_write_in(g_dir, "make_resnet.py", make_resnet_py);
    assert_int_equal(run(out, sizeof out, "/usr/bin/python3 make_resnet.py"), 0);
    /* a .pth as it is: refused, saying how to convert it */
    assert_int_equal(run(out, sizeof out,
                         COREFIT " train --images photos --valid-pct 0.25 --pretrained r18.pth "
                                 "--epochs 1"),
                     1);
    assert_non_null(strstr(out, "corefit-convert-pth"));
    assert_non_null(strstr(out, "r18.pth"));
    assert_int_equal(run(out, sizeof out,
                         "/usr/bin/python3 %s/tools/convert_pth.py r18.pth r18.safetensors",
                         CF_SOURCE_DIR),
                     0);
    /* another depth than the weights: refused before any data is read */
    assert_int_equal(run(out, sizeof out,
                         COREFIT " train --images photos --arch resnet34 --pretrained "
                                 "r18.safetensors"),
                     2);
    assert_non_null(strstr(out, "resnet18"));
    /* fine_tune from the torchvision weights on 2 cores, with aug_transforms */
    int rc = run(out, sizeof out,
                 COREFIT " train --images photos --valid-pct 0.25 --size 32 --arch resnet18 "
                         "--pretrained r18.safetensors --schedule fine-tune --epochs 1 --aug "
                         "--cores 2 --bs 8 --lr 1e-2 --out m/photo.safetensors --plots m/plots");
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "model: resnet18"));
    /* 32 px, far below the weights' 224: a note says so */
    assert_non_null(strstr(out, "trained on 224 x 224 images; fine-tuning them at 32 x 32"));
    assert_non_null(strstr(out, "squished to 32 x 32"));
    /* ImageNet's statistics kept (fastai's vision_learner with pretrained weights) */
    assert_non_null(strstr(out, "mean 0.485 0.456 0.406, std 0.229 0.224 0.225"));
    assert_non_null(strstr(out, "2 epochs: 1 frozen, 1 unfrozen"));
    struct stat sb;
    char path[512];
    snprintf(path, sizeof path, "%s/m/plots/confusion.png", g_dir);
    if (cf_plot_available()) assert_int_equal(stat(path, &sb), 0);
    /* the class figures of train --plots: written, and drawn (dark and light pixels) */
    static const char *const figs[] = {"show_batch", "show_results", "top_losses", "confusion"};
    for (int i = 0; i < 4 && cf_plot_available(); i++) {
        char line[128];
        snprintf(line, sizeof line, "figure: m/plots/%s.png", figs[i]);
        assert_non_null(strstr(out, line));
        snprintf(path, sizeof path, "%s/m/plots/%s.png", g_dir, figs[i]);
        expect_drawn(path);
    }
    assert_int_equal(run(out, sizeof out, COREFIT " info m/photo.safetensors"), 0);
    assert_non_null(strstr(out, "resnet18"));
    assert_non_null(strstr(out, "cat, dog, fish"));
    /* the exported model keeps ImageNet's statistics for eval, predict and cf_load_learner */
    assert_non_null(strstr(out, "normalize:   mean 0.485 0.456 0.406, std 0.229 0.224 0.225"));
    /* eval on the folder's images, with TTA (the recorded aug_transforms) and the figures */
    assert_int_equal(run(out, sizeof out,
                         COREFIT " eval m/photo.safetensors --images photos --tta --plots "
                                 "m/eval_plots"),
                     0);
    assert_non_null(strstr(out, "valid_loss: "));
    assert_non_null(strstr(out, "accuracy: "));
    assert_non_null(strstr(out, "tta_accuracy: "));
    assert_non_null(strstr(out, "aug_transforms as in training"));
    assert_non_null(strstr(out, "most_confused (actual, predicted, count):"));
    for (int i = 1; i < 4 && cf_plot_available(); i++) {
        snprintf(path, sizeof path, "%s/m/eval_plots/%s.png", g_dir, figs[i]);
        expect_drawn(path);
    }
    /* predict: one line per file */
    static const char *files[] = {"photos/cat/cat_1.jpg", "photos/dog/dog_2.png",
                                  "photos/fish/fish_3.jpg", "photos/cat/cat_4.png"};
    assert_int_equal(run(out, sizeof out, COREFIT " predict m/photo.safetensors %s %s %s %s",
                         files[0], files[1], files[2], files[3]),
                     0);
    /* this program's cf_load_learner gives the same classes */
    char model[512];
    snprintf(model, sizeof model, "%s/m/photo.safetensors", g_dir);
    cf_learner *learn = NULL;
    assert_int_equal(cf_load_learner(model, &learn), CF_OK);
    const cf_dataset *ds = learn->dls->train_ds;
    assert_int_equal(ds->n_classes, 3);
    for (int i = 0; i < 4; i++) {
        float probs[3];
        int decoded = -1;
        snprintf(path, sizeof path, "%s/%s", g_dir, files[i]);
        assert_int_equal(cf_predict_image_file(learn, path, probs, &decoded), CF_OK);
        assert_true(decoded >= 0 && decoded < 3);
        char cls[64];
        assert_true(predicted_class(out, files[i], cls, sizeof cls));
        assert_string_equal(cls, ds->vocab[decoded]);
    }
    cf_learner_free(learn);
}

/* --resize crop is recorded in the model: predict, eval and cf_load_learner take the centre
 * crop of a non-square image (as the validation images in training), not a squish; --aug is
 * recorded too, and eval --tta says it uses it. */
static void test_resize_recorded(void **state) {
    (void)state;
    static char out[1 << 16];
    int rc = run(out, sizeof out,
                 COREFIT " train --images photos --valid-pct 0.25 --size 24 --resize crop --aug "
                         "--arch simple-cnn --cores 1 --bs 8 --epochs 1 --out crop.safetensors");
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "Resize(24, crop)"));
    char model[512], image[512];
    snprintf(model, sizeof model, "%s/crop.safetensors", g_dir);
    cf_model_info info;
    assert_int_equal(cf_model_info_read(model, &info), CF_OK);
    assert_int_equal(info.item_tfm.kind, CF_ITEM_TFM_RESIZE);
    assert_int_equal(info.item_tfm.method, CF_RESIZE_CROP);
    assert_int_equal(info.item_tfm.width, 24);
    assert_true(info.has_batch_tfms && info.has_aug);
    assert_true(info.aug.do_flip);
    assert_float_equal(info.aug.max_rotate, 10.0f, 1e-6);
    cf_model_info_free(&info);
    /* a non-square photo (make_photos.py draws 40-90 px sides: pick one that is not square) */
    void *bytes = NULL;
    size_t len = 0;
    int iw = 0, ih = 0;
    const char *file = NULL;
    static const char *candidates[] = {"photos/cat/cat_1.jpg", "photos/dog/dog_2.png",
                                       "photos/fish/fish_3.jpg", "photos/cat/cat_4.png"};
    for (int i = 0; i < 4 && !file; i++) {
        snprintf(image, sizeof image, "%s/%s", g_dir, candidates[i]);
        assert_int_equal(cf_read_file(image, 1 << 24, &bytes, &len), CF_OK);
        int w = 0, h = 0;
        float *full = cf_malloc((size_t)3 * 90 * 90 * sizeof(float));
        assert_int_equal(cf_image_decode(bytes, len, image, 3, 0, full, &w, &h), CF_OK);
        cf_free(full);
        if (w != h) {
            file = candidates[i];
            iw = w;
            ih = h;
        } else {
            cf_free(bytes);
        }
    }
    assert_non_null(file);
    assert_true(iw != ih);
    cf_learner *learn = NULL;
    assert_int_equal(cf_load_learner(model, &learn), CF_OK);
    /* the item as the in-memory learner sees it: Resize crop's validation (centre) crop,
     * normalised as its loader */
    cf_item_tfm crop = cf_resize_tfm(24, CF_RESIZE_CROP);
    float x[3 * 24 * 24], squish[3 * 24 * 24];
    assert_int_equal(cf_image_decode_tfm(bytes, len, image, 3, &crop, false, 0, 0, 0, x), CF_OK);
    int sw = 0, sh = 0;
    assert_int_equal(cf_image_decode(bytes, len, image, 3, 24, squish, &sw, &sh), CF_OK);
    cf_free(bytes);
    const cf_dl_options *lo = cf_dataloader_options(learn->dls->train);
    assert_true(lo->n_norm == 3);
    double differ = 0;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 24 * 24; i++) {
            float *v = &x[c * 24 * 24 + i], *q = &squish[c * 24 * 24 + i];
            *v = *v * (1.0f / lo->std[c]) + (-lo->mean[c] / lo->std[c]);
            *q = *q * (1.0f / lo->std[c]) + (-lo->mean[c] / lo->std[c]);
            differ += fabs(*v - *q);
        }
    assert_true(differ > 1.0); /* a crop and a squish of a non-square image differ */
    float want[3], got[3], squished[3];
    int want_class = -1, got_class = -1;
    assert_int_equal(cf_predict(learn, x, want, &want_class), CF_OK);
    assert_int_equal(cf_predict(learn, squish, squished, NULL), CF_OK);
    assert_int_equal(cf_predict_image_file(learn, image, got, &got_class), CF_OK);
    assert_int_equal(got_class, want_class);
    for (int k = 0; k < 3; k++) assert_float_equal(got[k], want[k], 1e-6);
    bool same_as_squish = true;
    for (int k = 0; k < 3; k++) same_as_squish &= fabsf(got[k] - squished[k]) < 1e-7f;
    assert_false(same_as_squish);
    /* predict on the command line gives that class */
    assert_int_equal(run(out, sizeof out, COREFIT " predict crop.safetensors %s", file), 0);
    char cls[64];
    assert_true(predicted_class(out, file, cls, sizeof cls));
    assert_string_equal(cls, learn->dls->train_ds->vocab[want_class]);
    cf_learner_free(learn);
    /* eval --tta with the recorded augmentation */
    assert_int_equal(
        run(out, sizeof out, COREFIT " eval crop.safetensors --images photos --tta --tta-n 2"), 0);
    assert_non_null(strstr(out, "tta_accuracy: "));
    assert_non_null(strstr(out, "aug_transforms as in training"));
}

/* fastai's from_csv on the command line: the file names with a suffix, the is_valid column. */
static void test_images_csv(void **state) {
    (void)state;
    static char out[1 << 16];
    int rc =
        run(out, sizeof out,
            COREFIT " train --images-csv flat/labels.csv --fn-col file --label-col label "
                    "--valid-col is_valid --suffix .png --size 24 --resize pad --pad-mode "
                    "zeros --arch simple-cnn --cores 1 --bs 6 --epochs 1 --out csv.safetensors");
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    /* 6 training and 2 validation rows per class, padded with zeros */
    assert_non_null(strstr(out, "data: 18 training and 6 validation samples"));
    assert_non_null(strstr(out, "Resize(24, pad, zeros)"));
    assert_int_equal(run(out, sizeof out, COREFIT " info csv.safetensors"), 0);
    assert_non_null(strstr(out, "cat, dog, fish"));
    /* a validation column that is not boolean: its line and value named */
    test_write_in(g_dir, "flat/bad.csv", "file,label,is_valid\ncat_0,cat,0\ndog_0,dog,maybe\n");
    assert_int_equal(run(out, sizeof out,
                         COREFIT " train --images-csv flat/bad.csv --valid-col is_valid --suffix "
                                 ".png --out x.safetensors"),
                     1);
    assert_non_null(strstr(out, "bad.csv:3"));
    assert_non_null(strstr(out, "'maybe'"));
    /* CSV-only options without --images-csv */
    assert_int_equal(run(out, sizeof out, COREFIT " train --images photos --fn-col file"), 2);
    assert_non_null(strstr(out, "--images-csv"));
}

/* fastai's from_name_re: labels from the file names, in the library and on the command line. */
static void test_label_re(void **state) {
    (void)state;
    static char out[1 << 16];
    char dir[512];
    snprintf(dir, sizeof dir, "%s/flat", g_dir);
    cf_image_folder_options o = {.size = 16, .valid_pct = 0.25, .seed = 1};
    cf_dataset *train = NULL, *valid = NULL;
    assert_int_equal(
        cf_datasets_from_image_names(dir, "^([a-z]+)_[0-9]+\\.png$", &o, &train, &valid), CF_OK);
    assert_int_equal(train->n + valid->n, 24);
    assert_int_equal(valid->n, 6);
    assert_int_equal(train->n_classes, 3);
    assert_string_equal(train->vocab[0], "cat");
    assert_string_equal(train->vocab[2], "fish");
    /* each label is the class the file name starts with */
    for (int k = 0; k < 2; k++) {
        const cf_dataset *d = k ? valid : train;
        for (int64_t i = 0; i < d->n; i++) {
            const char *file = cf_dataset_file(d, i);
            if (!file) continue; /* decoded up front: no names kept */
            const char *name = strrchr(file, '/') + 1;
            assert_int_equal(strncmp(name, d->vocab[(int)d->y[i]], 3), 0);
        }
    }
    cf_dataset_free(train);
    cf_dataset_free(valid);
    /* a name the pattern does not match: named, and nothing returned */
    assert_int_not_equal(cf_datasets_from_image_names(dir, "^(cat|dog)_", &o, &train, &valid),
                         CF_OK);
    assert_null(train);
    assert_non_null(strstr(cf_last_error(), "fish_0.png"));
    /* not a regular expression */
    assert_int_equal(cf_datasets_from_image_names(dir, "([a-z", &o, &train, &valid),
                     CF_ERR_INVALID);
    assert_non_null(strstr(cf_last_error(), "([a-z"));
    /* the command line: --label-re over a flat folder, RandomResizedCrop */
    int rc = run(out, sizeof out,
                 COREFIT " train --images flat --label-re '^([a-z]+)_' --valid-pct 0.25 --size 24 "
                         "--random-resized-crop 0.35 --arch simple-cnn --cores 1 --bs 6 "
                         "--out re.safetensors");
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "data: 18 training and 6 validation samples"));
    assert_non_null(strstr(out, "RandomResizedCrop(24, min_scale 0.35)"));
    assert_int_equal(run(out, sizeof out, COREFIT " info re.safetensors"), 0);
    assert_non_null(strstr(out, "cat, dog, fish"));
    /* option mistakes are usage errors naming the option */
    assert_int_equal(run(out, sizeof out, COREFIT " train --images flat --resize stretch"), 2);
    assert_non_null(strstr(out, "'stretch'"));
    assert_int_equal(run(out, sizeof out,
                         COREFIT " train --images flat --resize crop --random-resized-crop 0.5"),
                     2);
    assert_int_equal(run(out, sizeof out, COREFIT " train --label-re x"), 2);
}

/* A safetensors file without corefit's metadata and without ResNet names: refused, saying what
 * to give instead. */
static void test_pretrained_refused(void **state) {
    (void)state;
    static char out[1 << 14];
    char path[512];
    snprintf(path, sizeof path, "%s/other.safetensors", g_dir);
    float w[4] = {1, 2, 3, 4};
    char name[] = "encoder.weight";
    cf_st_entry e = {.name = name,
                     .dtype = CF_DTYPE_F32,
                     .shape = cf_shape_make(2, (int[]){2, 2}),
                     .numel = 4,
                     .data = w};
    assert_int_equal(cf_st_write(path, &e, 1, NULL, NULL, 0), CF_OK);
    int depth = -1;
    assert_int_equal(cf_resnet_weights_depth(path, &depth), CF_ERR_FORMAT);
    assert_int_equal(depth, 0);
    assert_int_equal(
        run(out, sizeof out, COREFIT " train --images photos --pretrained other.safetensors"), 1);
    assert_non_null(strstr(out, "other.safetensors"));
    assert_non_null(strstr(out, "corefit-convert-pth"));
    assert_non_null(strstr(out, "ResNet"));
}

/* Writes a safetensors file holding one 1-element tensor per name of a ResNet whose stages
 * have blocks[0..n_stages) blocks (bottleneck: conv3 too), names prefixed with `prefix`. */
static void write_resnet_names(const char *path, const char *prefix, const int *blocks,
                               int n_stages, bool bottleneck) {
    enum { MAX = 512 };
    static char names[MAX][96];
    static cf_st_entry e[MAX];
    static float one = 1;
    int n = 0;
    const char *stem[] = {"conv1.weight", "bn1.weight", "bn1.bias", "fc.weight"};
    for (int i = 0; i < 4; i++) snprintf(names[n++], 96, "%s%s", prefix, stem[i]);
    for (int s = 0; s < n_stages; s++)
        for (int b = 0; b < blocks[s]; b++)
            for (int c = 1; c <= (bottleneck ? 3 : 2); c++)
                snprintf(names[n++], 96, "%slayer%d.%d.conv%d.weight", prefix, s + 1, b, c);
    for (int i = 0; i < n; i++)
        e[i] = (cf_st_entry){.name = names[i],
                             .dtype = CF_DTYPE_F32,
                             .shape = cf_shape_make(1, (int[]){1}),
                             .numel = 1,
                             .data = &one};
    assert_int_equal(cf_st_write(path, e, n, NULL, NULL, 0), CF_OK);
}

/* The depth of torchvision's and timm's ResNets told from their names and block counts. */
static void test_resnet_weights_depth(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/names.safetensors", g_dir);
    static const struct {
        int blocks[4];
        bool bottleneck;
        const char *prefix;
        int depth;
    } cases[] = {{{2, 2, 2, 2}, false, "", 18},
                 {{3, 4, 6, 3}, false, "module.", 34},
                 {{3, 4, 6, 3}, true, "", 50},
                 {{3, 4, 23, 3}, true, "model.", 101}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_resnet_names(path, cases[i].prefix, cases[i].blocks, 4, cases[i].bottleneck);
        int depth = 0;
        assert_int_equal(cf_resnet_weights_depth(path, &depth), CF_OK);
        assert_int_equal(depth, cases[i].depth);
    }
    /* block counts of no torchvision ResNet, and a ResNet without layer4 */
    int odd[4] = {2, 3, 2, 2};
    write_resnet_names(path, "", odd, 4, false);
    int depth = -1;
    assert_int_equal(cf_resnet_weights_depth(path, &depth), CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "names.safetensors"));
    write_resnet_names(path, "", odd, 3, false);
    assert_int_equal(cf_resnet_weights_depth(path, &depth), CF_ERR_FORMAT);
    assert_int_equal(depth, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resnet_weights_depth),
        cmocka_unit_test(test_pretrained_refused),
        cmocka_unit_test(test_label_re),
        cmocka_unit_test(test_images_csv),
        cmocka_unit_test(test_resize_recorded),
        cmocka_unit_test(test_photo_task_end_to_end),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
