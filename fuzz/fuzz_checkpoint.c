/* libFuzzer target for checkpoint loading (cf_model_load with an optimizer): any byte string
 * must either load into the model and optimizer, or be refused with an error that leaves both
 * exactly as they were, without reading out of bounds or leaking. The model has weights,
 * BatchNorm buffers and a counter; the optimizer is Adam (both averages and step counts). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "corefit/io.h"

static cf_model *model;
static cf_optimizer *opt;
static float *w0, *b0, *g0, *s0, *st0;
static cf_hypers *h0;
static int fd = -1;
static char path[64];

static void *copy_of(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (n) memcpy(q, p, n);
    return q;
}

static void setup(void) {
    cf_module *layers[] = {cf_linear(3, 4, true), cf_batchnorm1d(4), cf_relu(),
                           cf_linear(4, 2, true)};
    if (cf_model_new(&model, cf_sequential(4, layers), 1) != CF_OK) abort();
    if (cf_optimizer_new(&opt, model, &(cf_opt_config){.kind = CF_OPT_ADAM}) != CF_OK) abort();
    size_t nw = model->n_weights * sizeof(float);
    for (size_t i = 0; i < model->n_weights; i++) opt->grad_avg[i] = 0.5f, opt->sqr_avg[i] = 0.25f;
    for (int i = 0; i < model->n_params; i++) opt->steps[i] = 3;
    w0 = copy_of(model->weights, nw);
    b0 = copy_of(model->buffers, model->n_buffers * sizeof(float));
    g0 = copy_of(opt->grad_avg, nw);
    s0 = copy_of(opt->sqr_avg, nw);
    st0 = copy_of(opt->steps, (size_t)model->n_params * sizeof(float));
    h0 = copy_of(opt->hypers, (size_t)opt->n_groups * sizeof *opt->hypers);
    fd = memfd_create("checkpoint", MFD_CLOEXEC);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    /* CF_FUZZ_WRITE_SEED=file: write a valid checkpoint of this model (for the seed corpus). */
    const char *seed = getenv("CF_FUZZ_WRITE_SEED");
    if (seed && cf_model_save(model, opt, seed) != CF_OK) abort();
}

static int unchanged(void) {
    size_t nw = model->n_weights * sizeof(float);
    return !memcmp(model->weights, w0, nw) &&
           !memcmp(model->buffers, b0, model->n_buffers * sizeof(float)) &&
           !memcmp(opt->grad_avg, g0, nw) && !memcmp(opt->sqr_avg, s0, nw) &&
           !memcmp(opt->steps, st0, (size_t)model->n_params * sizeof(float)) &&
           !memcmp(opt->hypers, h0, (size_t)opt->n_groups * sizeof *opt->hypers);
}

static void reset(void) {
    size_t nw = model->n_weights * sizeof(float);
    memcpy(model->weights, w0, nw);
    memcpy(model->buffers, b0, model->n_buffers * sizeof(float));
    memcpy(opt->grad_avg, g0, nw);
    memcpy(opt->sqr_avg, s0, nw);
    memcpy(opt->steps, st0, (size_t)model->n_params * sizeof(float));
    memcpy(opt->hypers, h0, (size_t)opt->n_groups * sizeof *opt->hypers);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!model) setup();
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    cf_status st = cf_model_load(model, opt, path);
    if (st == CF_OK) {
        reset();
    } else {
        if (st == CF_ERR_INVALID || !cf_last_error()[0]) abort();
        if (!unchanged()) abort(); /* a refused file must not touch the model or optimizer */
    }
    return 0;
}
