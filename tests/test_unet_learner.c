/* unet_learner: CrossEntropyLossFlat(axis=1) and the unet splitter's groups on a DynamicUnet,
 * and a short fit on tiny 24x24 scenes that raises foreground accuracy and DiceMulti (the
 * decoder's cost grows with the pixels; 16x16 would leave the xresnet body 1x1 maps, below
 * AvgPool2d's H, W >= 2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "corefit.h"

enum { S = 24, N_CODES = 3 };

/* n scenes of S x S: a bright 6x6 square (class 1) and a dim 8x3 bar (class 2) at random places
 * on a dark background (class 0); the image's pixels say the class with noise. */
static cf_dataset *scenes(int n, uint64_t seed) {
    float *x = malloc(sizeof(float) * n * S * S), *y = calloc((size_t)n * S * S, sizeof(float));
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) {
        float *m = y + (size_t)i * S * S;
        const int l = (int)cf_rng_below(&rng, S - 6), t = (int)cf_rng_below(&rng, S - 6);
        for (int r = t; r < t + 6; r++)
            for (int c = l; c < l + 6; c++) m[r * S + c] = 1;
        const int bl = (int)cf_rng_below(&rng, S - 8), bt = (int)cf_rng_below(&rng, S - 3);
        for (int r = bt; r < bt + 3; r++)
            for (int c = bl; c < bl + 8; c++) m[r * S + c] = 2;
        for (int p = 0; p < S * S; p++)
            x[(size_t)i * S * S + p] = (m[p] == 1   ? 0.9f
                                        : m[p] == 2 ? 0.5f
                                                    : 0.1f) +
                                       0.1f * (float)cf_rng_uniform(&rng);
    }
    cf_dataset *ds = NULL;
    assert_int_equal(
        cf_dataset_from_arrays(x, y, n, cf_shape_make(3, (int[]){1, S, S}), S * S, N_CODES, &ds),
        CF_OK);
    ds->masks = true;
    free(x);
    free(y);
    return ds;
}

static void test_unet_learner_fit(void **state) {
    (void)state;
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 16, .seed = 3, .prefetch = -1, .flip = true};
    assert_int_equal(cf_dls_new(scenes(64, 1), scenes(16, 2), &o, &dls), CF_OK);
    cf_metric *metrics[] = {cf_foreground_acc(0), cf_dice_multi(N_CODES)};
    cf_learner *learn = NULL;
    cf_status made = cf_unet_learner(&learn, dls, "xresnet18", .metrics = metrics, .n_metrics = 2,
                                     .quiet = true, .seed = 5);
    if (made) print_message("%s\n", cf_last_error());
    assert_int_equal(made, CF_OK);
    assert_int_equal(learn->model->n_groups, 3);
    assert_int_equal(learn->loss.kind, cf_cross_entropy_loss_flat(1).kind);
    double before[3], after[3];
    cf_status st = cf_validate(learn, before);
    if (st) print_message("%s\n", cf_last_error());
    assert_int_equal(st, CF_OK);
    assert_int_equal(cf_fit_one_cycle(learn, 4, .lr_max = 1e-2), CF_OK);
    assert_int_equal(cf_validate(learn, after), CF_OK);
    printf("unet: loss %.4f -> %.4f, foreground_acc %.4f -> %.4f, dice_multi %.4f -> %.4f\n",
           before[0], after[0], before[1], after[1], before[2], after[2]);
    assert_true(after[0] < before[0]);
    assert_true(after[1] > before[1] + 0.2);
    assert_true(after[2] > before[2] + 0.2 && after[2] > 0.5);
    /* exported and loaded back: the same U-Net, the same validation */
    char path[256];
    snprintf(path, sizeof path, "/tmp/cf_unet_model_%d.safetensors", (int)getpid());
    assert_int_equal(cf_learner_export(learn, path), CF_OK);
    cf_learner *back = NULL;
    st = cf_load_learner(path, &back);
    if (st) print_message("%s\n", cf_last_error());
    assert_int_equal(st, CF_OK);
    unlink(path);
    assert_true(cf_is_dynamic_unet(back->model->root));
    assert_int_equal(back->model->n_params, learn->model->n_params);
    assert_int_equal(back->model->n_groups, 3);
    for (int i = 0; i < learn->model->n_params; i++) {
        const cf_param *p = learn->model->params[i], *q = back->model->params[i];
        assert_string_equal(p->full_name, q->full_name);
        assert_int_equal(p->numel, q->numel);
        assert_memory_equal(p->data, q->data, p->numel * sizeof(float));
    }
    cf_learner_free(back);
    cf_learner_free(learn);
    cf_dls_free(dls);

    /* a data set without masks is refused, and the caller's metrics are taken over */
    assert_int_equal(cf_dls_new(scenes(4, 3), scenes(4, 4), &o, &dls), CF_OK);
    ((cf_dataset *)dls->train_ds)->masks = false;
    cf_metric *m1[] = {cf_foreground_acc(0)};
    assert_int_equal(cf_unet_learner(&learn, dls, "xresnet18", .metrics = m1, .n_metrics = 1),
                     CF_ERR_INVALID);
    assert_null(learn);
    cf_dls_free(dls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unet_learner_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
