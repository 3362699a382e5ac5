/* libFuzzer target for the learner's state format (cf_learner_import_state, which nests the
 * optimizer's, the Recorder's and the callbacks' formats): any byte string must either read
 * back, or be refused with an error that leaves the learner exactly as it was (its exported
 * state unchanged), without reading out of bounds or leaking. The learner has weights,
 * BatchNorm buffers, Adam's state, a Recorder with epochs and metric names, a figure path and
 * two trackers. CF_FUZZ_WRITE_SEED=file writes a valid state (for the seed corpus). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/learn.h"

static cf_learner *learn;
static unsigned char *state0;
static size_t state0_n;

static void setup(void) {
    float x[32 * 3], y[32];
    for (int i = 0; i < 32 * 3; i++) x[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < 32; i++) y[i] = (float)(i % 2);
    cf_dataset *tr = NULL, *va = NULL;
    cf_dls *dls = NULL;
    if (cf_dataset_from_arrays(x, y, 32, cf_shape1(3), 1, 2, &tr) != CF_OK ||
        cf_dataset_from_arrays(x, y, 16, cf_shape1(3), 1, 2, &va) != CF_OK ||
        cf_dls_new(tr, va, &(cf_dls_options){.bs = 8, .seed = 1}, &dls) != CF_OK)
        abort();
    cf_module *layers[] = {cf_linear(3, 4, true), cf_batchnorm1d(4), cf_relu(),
                           cf_linear(4, 2, true)};
    cf_model *model = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    cf_callback *cbs[] = {cf_early_stopping_cb(.patience = 3), cf_reduce_lr_on_plateau_cb()};
    if (cf_model_new(&model, cf_sequential(4, layers), 1) != CF_OK ||
        cf_learner_new(&learn, dls, model, .quiet = true, .metrics = metrics, .n_metrics = 1,
                       .cbs = cbs, .n_cbs = 2) != CF_OK ||
        cf_fit(learn, 2) != CF_OK || cf_learner_note_figure(learn, "loss.png") != CF_OK)
        abort();
    state0_n = cf_learner_export_state(learn, NULL, 0);
    state0 = malloc(state0_n);
    if (cf_learner_export_state(learn, state0, state0_n) != state0_n) abort();
    const char *seed = getenv("CF_FUZZ_WRITE_SEED");
    if (seed) {
        FILE *f = fopen(seed, "wb");
        if (!f || fwrite(state0, 1, state0_n, f) != state0_n) abort();
        fclose(f);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!learn) setup();
    cf_status st = cf_learner_import_state(learn, data, size);
    size_t n = cf_learner_export_state(learn, NULL, 0);
    unsigned char *now = malloc(n ? n : 1);
    if (cf_learner_export_state(learn, now, n) != n) abort();
    if (st != CF_OK) {
        /* refused: nothing changed */
        if (n != state0_n || memcmp(now, state0, n) != 0) abort();
    } else {
        /* read back: exporting it gives a state that reads back again, then back to the start */
        if (cf_learner_import_state(learn, now, n) != CF_OK) abort();
        if (cf_learner_import_state(learn, state0, state0_n) != CF_OK) abort();
    }
    free(now);
    return 0;
}
