/* Multi-label images: label lists from a CSV with label_delim into multi-hot targets, the
 * learner's default BCEWithLogitsLossFlat, accuracy_multi rising above the all-empty guess on
 * tiny Fashion-MNIST mosaics, label-set decoding, and the fit and get_preds on 2 split-batch
 * workers against one process. */
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
#include "oracle.h"

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

static void test_multi_hot_from_csv(void **state) {
    (void)state;
#ifndef CF_HAVE_STB
    skip();
#else
    test_tmpdir_make(dir, sizeof dir, "cf_multilabel_");
    uint8_t px[64];
    const char *names[] = {"a.png", "b.png", "c.png", "d.png", "e.png"};
    for (int i = 0; i < 5; i++) {
        memset(px, 40 * i, sizeof px);
        assert_true(stbi_write_png(at(names[i]), 8, 8, 1, px, 8) != 0);
    }
    /* b's double space leaves an empty label, which is skipped; c has none */
    write_text("labels.csv", "fname,tags,is_valid\n"
                             "a.png,cat dog,0\n"
                             "b.png,dog  bird,0\n"
                             "c.png,,0\n"
                             "d.png,dog cat,1\n"
                             "e.png,cat,false\n");
    cf_dataset *tr = NULL, *va = NULL;
    cf_image_folder_options o = {.channels = 1};
    assert_int_equal(cf_datasets_from_image_csv_multi(at("labels.csv"), NULL, "fname", "tags",
                                                      "is_valid", " ", &o, &tr, &va),
                     CF_OK);
    assert_int_equal(tr->n, 4);
    assert_int_equal(va->n, 1);
    assert_int_equal(tr->n_classes, 3);
    assert_int_equal(tr->target_dim, 3);
    assert_true(cf_dataset_is_multi_label(tr) && cf_dataset_is_multi_label(va));
    assert_string_equal(tr->vocab[0], "bird");
    assert_string_equal(tr->vocab[1], "cat");
    assert_string_equal(tr->vocab[2], "dog");
    const float want_train[] = {0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0};
    assert_memory_equal(tr->y, want_train, sizeof want_train);
    const float want_valid[] = {0, 1, 1};
    assert_memory_equal(va->y, want_valid, sizeof want_valid);
    /* the pixels are the files' (row order kept) */
    assert_float_equal(tr->x[64 * 3], 160.0f / 255.0f, 1e-6);
    char buf[64];
    assert_int_equal(cf_label_set_str(tr->y, 3, tr->vocab, NULL, buf, sizeof buf), 7);
    assert_string_equal(buf, "cat;dog");
    cf_label_set_str(tr->y + 3, 3, tr->vocab, " ", buf, sizeof buf);
    assert_string_equal(buf, "bird dog");
    cf_label_set_str(tr->y + 6, 3, tr->vocab, NULL, buf, sizeof buf);
    assert_string_equal(buf, "");
    cf_dataset_free(tr);
    cf_dataset_free(va);

    /* the same through ';' and a streamed load */
    write_text("semi.csv", "fname,labels\na.png,cat;dog\nb.png,dog\n");
    o.load = CF_IMAGE_LOAD_STREAM;
    assert_int_equal(
        cf_datasets_from_image_csv_multi(at("semi.csv"), NULL, NULL, NULL, NULL, ";", &o, &tr, &va),
        CF_OK);
    assert_true(cf_dataset_is_streamed(tr));
    const float want_semi[] = {1, 1, 0, 1};
    assert_memory_equal(tr->y, want_semi, sizeof want_semi);
    assert_int_equal(va->n, 0);
    cf_dataset_free(tr);
    cf_dataset_free(va);

    /* a validation label the training rows never had: refused with its line and value */
    write_text("bad.csv", "fname,labels,is_valid\na.png,cat,0\nb.png,cat,0\nd.png,cat cow,1\n");
    tr = va = (cf_dataset *)1;
    assert_int_equal(cf_datasets_from_image_csv_multi(at("bad.csv"), NULL, NULL, NULL, "is_valid",
                                                      " ", &o, &tr, &va),
                     CF_ERR_FORMAT);
    assert_null(tr);
    assert_null(va);
    assert_non_null(strstr(cf_last_error(), "bad.csv:4"));
    assert_non_null(strstr(cf_last_error(), "'cow'"));
    /* a missing column names itself */
    assert_int_equal(cf_datasets_from_image_csv_multi(at("bad.csv"), NULL, NULL, "tags", NULL, " ",
                                                      &o, &tr, &va),
                     CF_ERR_FORMAT);
    assert_non_null(strstr(cf_last_error(), "'tags'"));
    assert_int_equal(test_tmpdir_remove(dir), 0);
#endif
}

/* Mosaics of 2x2 Fashion-MNIST garments halved to 14 px (28 x 28 images); each tile empty with
 * probability 1/4; labels the classes present (10 classes, multi-hot). */
static void mosaics(int64_t n, uint64_t seed, int64_t first, cf_dataset **out) {
    const char *d = getenv("CF_FASHION_MNIST_DIR");
    char images[512], labels[512];
    snprintf(images, sizeof images, "%s/train-images-idx3-ubyte.gz",
             d ? d : "/usr/share/datasets/fashion-mnist");
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte.gz",
             d ? d : "/usr/share/datasets/fashion-mnist");
    cf_dataset *fm = NULL;
    assert_int_equal(cf_dataset_from_idx_first(images, labels, 3000, &fm), CF_OK);
    float *x = calloc((size_t)n * 784, sizeof(float)), *y = calloc((size_t)n * 10, sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (int64_t i = 0; i < n; i++)
        for (int t = 0; t < 4; t++) {
            if (cf_rng_uniform(&rng) < 0.25) continue;
            const int64_t g = first + (int64_t)cf_rng_below(&rng, 1500);
            const float *img = fm->x + g * 784;
            for (int r = 0; r < 14; r++)
                for (int c = 0; c < 14; c++)
                    x[i * 784 + (size_t)((t / 2) * 14 + r) * 28 + (t % 2) * 14 + c] =
                        0.25f * (img[(2 * r) * 28 + 2 * c] + img[(2 * r) * 28 + 2 * c + 1] +
                                 img[(2 * r + 1) * 28 + 2 * c] + img[(2 * r + 1) * 28 + 2 * c + 1]);
            y[i * 10 + (int)fm->y[g]] = 1;
        }
    assert_int_equal(
        cf_dataset_from_arrays(x, y, n, cf_shape_make(3, (int[]){1, 28, 28}), 10, 10, out), CF_OK);
    free(x);
    free(y);
    cf_dataset_free(fm);
}

static cf_dls *mosaic_dls(int64_t n_train, int64_t n_valid) {
    cf_dataset *tr = NULL, *va = NULL;
    mosaics(n_train, 1, 0, &tr);
    mosaics(n_valid, 2, 1500, &va);
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 32, .seed = 3, .prefetch = -1};
    assert_int_equal(cf_dls_new(tr, va, &o, &dls), CF_OK);
    return dls;
}

static cf_learner *mosaic_learner(cf_dls *dls) {
    cf_metric *metrics[] = {cf_accuracy_multi(0.5f, false)};
    cf_learner *learn = NULL;
    assert_int_equal(cf_vision_learner(&learn, dls, CF_ARCH_SIMPLE_CNN, .metrics = metrics,
                                       .n_metrics = 1, .quiet = true, .seed = 7),
                     CF_OK);
    return learn;
}

/* The share of label values an all-empty guess gets right: 1 - mean of the targets. */
static double empty_guess_accuracy(const cf_dataset *ds) {
    double s = 0;
    for (int64_t i = 0; i < ds->n * 10; i++) s += ds->y[i];
    return 1.0 - s / (double)(ds->n * 10);
}

static void test_bce_accuracy_multi_fit(void **state) {
    (void)state;
    cf_dls *dls = mosaic_dls(2048, 128);
    cf_learner *learn = mosaic_learner(dls);
    /* multi-hot data take fastai's BCEWithLogitsLossFlat, threshold 0.5 */
    assert_int_equal(learn->loss.kind, CF_LOSS_BCE_LOGITS);
    assert_float_equal(learn->loss.thresh, 0.5f, 0);
    double before[2], after[2];
    assert_int_equal(cf_validate(learn, before), CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 4, .lr_max = CF_LR(1e-2)), CF_OK);
    assert_int_equal(cf_validate(learn, after), CF_OK);
    const double guess = empty_guess_accuracy(dls->valid_ds);
    printf("accuracy_multi: %.4f before, %.4f after; all-empty guess %.4f; loss %.4f -> %.4f\n",
           before[1], after[1], guess, before[0], after[0]);
    assert_true(after[0] < before[0]);
    assert_true(after[1] > guess + 0.03);

    /* get_preds: sigmoid probabilities, decoded into label sets by the loss's threshold */
    cf_preds p;
    assert_int_equal(cf_get_preds(learn, &p), CF_OK);
    assert_int_equal(p.preds.shape.dim[1], 10);
    assert_int_equal(p.targs.shape.dim[1], 10);
    float *sets = malloc((size_t)p.n * 10 * sizeof(float));
    assert_int_equal(cf_learner_decodes(learn, p.preds.data, p.n, 0, 0, sets), (size_t)p.n * 10);
    int64_t right = 0;
    for (int64_t i = 0; i < p.n * 10; i++) {
        assert_true(p.preds.data[i] >= 0 && p.preds.data[i] <= 1);
        assert_float_equal(sets[i], p.preds.data[i] > 0.5f ? 1.0f : 0.0f, 0);
        right += sets[i] == p.targs.data[i];
    }
    /* accuracy_multi is the same count */
    assert_float_equal((double)right / (double)(p.n * 10), after[1], 1e-6);
    free(sets);
    cf_preds_free(&p);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_decodes_label_sets(void **state) {
    (void)state;
    cf_dls *dls = mosaic_dls(32, 32);
    cf_learner *learn = mosaic_learner(dls);
    const float probs[20] = {0.7f, 0.2f, 0.5f, 0.9f, 0, 0, 0, 0, 0, 0.51f,
                             0,    0,    0,    0,    0, 0, 0, 0, 0, 0};
    float sets[20];
    assert_int_equal(cf_learner_decodes(learn, probs, 2, 0, 0, sets), 20);
    const float want[20] = {1, 0, 0, 1, 0, 0, 0, 0, 0, 1};
    assert_memory_equal(sets, want, sizeof want);
    char *names[10] = {"tshirt", "trouser", "pullover", "dress", "coat",
                       "sandal", "shirt",   "sneaker",  "bag",   "boot"};
    char buf[64];
    cf_label_set_str(sets, 10, names, NULL, buf, sizeof buf);
    assert_string_equal(buf, "tshirt;dress;boot");
    /* a short buffer is cut and NUL-terminated; the length needed comes back */
    assert_int_equal(cf_label_set_str(sets, 10, names, NULL, buf, 8), 17);
    assert_string_equal(buf, "tshirt;");
    cf_label_set_str(sets + 10, 10, names, NULL, buf, sizeof buf);
    assert_string_equal(buf, "");
    /* predict: sigmoid probabilities of one item */
    float out[10];
    int decoded = -1;
    assert_int_equal(cf_predict(learn, dls->valid_ds->x, out, &decoded), CF_OK);
    for (int c = 0; c < 10; c++) assert_true(out[c] > 0 && out[c] < 1);
    /* export / load_learner keep the multi-label model: BCE, the same probabilities */
    char path[256];
    snprintf(path, sizeof path, "/tmp/cf_multilabel_model_%d.safetensors", (int)getpid());
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    cf_learner *back = NULL;
    assert_int_equal(cf_load_learner(path, &back), CF_OK);
    unlink(path);
    assert_int_equal(back->loss.kind, CF_LOSS_BCE_LOGITS);
    assert_true(back->recipe.multi_label);
    assert_true(cf_dataset_is_multi_label(back->dls->train_ds));
    float again[10];
    assert_int_equal(cf_predict(back, dls->valid_ds->x, again, NULL), CF_OK);
    assert_close("loaded learner's probabilities", out, again, 10, 1e-5, 1e-6);
    cf_learner_free(back);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_par_split_batch_equals_one_process(void **state) {
    (void)state;
    cf_dls *dls = mosaic_dls(128, 70);
    cf_learner *one = mosaic_learner(dls), *two = mosaic_learner(dls);
    assert_int_equal(cf_fit(one, 1, .lr = CF_LR(3e-3)), CF_OK);
    assert_int_equal(cf_par_fit(two, 1, .lr = CF_LR(3e-3),
                                .par = {.num_cores = 2, .split_batch = true, .sync_bn = true}),
                     CF_OK);
    assert_int_equal(one->model->n_weights, two->model->n_weights);
    assert_close("weights, 2 split-batch workers against one process", one->model->weights,
                 two->model->weights, one->model->n_weights, 1e-4, 1e-5);
    cf_preds a, b;
    assert_int_equal(cf_get_preds(one, &a), CF_OK);
    assert_int_equal(cf_par_get_preds(one, &b, .par = {.num_cores = 2}), CF_OK);
    assert_int_equal(a.n, 70);
    assert_int_equal(b.n, 70);
    /* in dataset order: the targets are the validation set's rows */
    assert_memory_equal(b.targs.data, dls->valid_ds->y, 70 * 10 * sizeof(float));
    assert_close("get_preds on 2 workers", a.preds.data, b.preds.data, 700, 1e-5, 1e-6);
    cf_preds_free(&a);
    cf_preds_free(&b);
    cf_learner_free(one);
    cf_learner_free(two);
    cf_dls_free(dls);
}

/* Clearly green (a right label set's title) and clearly red (a wrong one's) pixels. */
static void title_colours(const char *path, int64_t *green, int64_t *red) {
    int w, h;
    unsigned char *px = test_png_load_rgb(path, &w, &h);
    assert_non_null(px);
    *green = *red = 0;
    for (int64_t i = 0; i < (int64_t)w * h; i++) {
        const unsigned char *p = px + 3 * i;
        if (p[1] > 90 && p[0] < 60 && p[2] < 60) ++*green;
        if (p[0] > 150 && p[1] < 60 && p[2] < 60) ++*red;
    }
    free(px);
}

static void test_show_label_sets(void **state) {
    (void)state;
    if (!cf_plot_available()) skip();
    enum { N = 4, H = 16, W = 16, K = 3 };
    char *vocab[K] = {"cat", "dog", "owl"};
    float x[N * H * W], preds[N * K], targs[N * K];
    for (int i = 0; i < N * H * W; i++) x[i] = (float)(i % 7) / 7.0f; /* grey */
    for (int i = 0; i < N * K; i++) {
        targs[i] = (float)((i * 5 / 3) % 2);
        preds[i] = targs[i] > 0.5f ? 0.9f : 0.2f;
    }
    char png[256];
    snprintf(png, sizeof png, "/tmp/cf_multilabel_show_%d.png", (int)getpid());
    cf_preds p = {.n = N,
                  .preds = cf_tensor_view(preds, cf_shape2(N, K)),
                  .targs = cf_tensor_view(targs, cf_shape2(N, K)),
                  .inputs = cf_tensor_view(x, cf_shape4(N, 1, H, W))};
    int64_t green, red;
    assert_int_equal(cf_show_results(&p, N, vocab, png), CF_OK);
    title_colours(png, &green, &red);
    assert_true(green > 20 && red == 0); /* every predicted set is the target's */
    for (int i = 0; i < N * K; i++) preds[i] = 1.0f - preds[i];
    assert_int_equal(cf_show_results(&p, N, vocab, png), CF_OK);
    title_colours(png, &green, &red);
    assert_true(red > 20 && green == 0);
    /* show_batch titles the multi-hot rows with their sets */
    cf_batch b = {.x = p.inputs, .y = p.targs};
    assert_int_equal(cf_show_batch(&b, N, vocab, png), CF_OK);
    unlink(png);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_hot_from_csv),
        cmocka_unit_test(test_bce_accuracy_multi_fit),
        cmocka_unit_test(test_decodes_label_sets),
        cmocka_unit_test(test_par_split_batch_equals_one_process),
        cmocka_unit_test(test_show_label_sets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
