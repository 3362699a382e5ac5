#include "same_fit.h"

#include <string.h>

#include "oracle.h"

static void same_doubles(const double *a, const double *b, int64_t n, const char *what,
                         const char *part) {
    if (n && memcmp(a, b, (size_t)n * sizeof(double)))
        fail_msg("%s: the Recorder's %s differ from the reference fit", what, part);
}

void assert_same_model_state(const cf_learner *a, const cf_learner *b, const char *what) {
    const cf_model *ma = a->model, *mb = b->model;
    if (ma->n_weights != mb->n_weights || ma->n_buffers != mb->n_buffers ||
        ma->n_params != mb->n_params)
        fail_msg("%s: models of %zu weights, %zu buffers, %d params against %zu, %zu, %d", what,
                 (size_t)mb->n_weights, (size_t)mb->n_buffers, mb->n_params, (size_t)ma->n_weights,
                 (size_t)ma->n_buffers, ma->n_params);
    assert_all_finite(what, ma->weights, ma->n_weights);
    size_t nw = ma->n_weights * sizeof(float);
    if (memcmp(ma->weights, mb->weights, nw))
        fail_msg("%s: weights differ from the reference fit (max rel err %.3g)", what,
                 max_rel_err(mb->weights, ma->weights, ma->n_weights, 1e-6));
    if (ma->n_buffers && memcmp(ma->buffers, mb->buffers, ma->n_buffers * sizeof(float)))
        fail_msg("%s: BatchNorm buffers differ from the reference fit", what);
    const cf_optimizer *oa = a->opt, *ob = b->opt;
    if (!oa || !ob) fail_msg("%s: a learner without an optimizer", what);
    if (oa->n_groups != ob->n_groups || !oa->grad_avg != !ob->grad_avg ||
        !oa->sqr_avg != !ob->sqr_avg)
        fail_msg("%s: optimizers of another shape (%d groups against %d)", what, ob->n_groups,
                 oa->n_groups);
    if ((oa->grad_avg && memcmp(oa->grad_avg, ob->grad_avg, nw)) ||
        (oa->sqr_avg && memcmp(oa->sqr_avg, ob->sqr_avg, nw)) ||
        memcmp(oa->steps, ob->steps, (size_t)ma->n_params * sizeof(float)) ||
        memcmp(oa->hypers, ob->hypers, (size_t)oa->n_groups * sizeof(cf_hypers)))
        fail_msg("%s: optimizer state differs from the reference fit", what);
}

void assert_same_fit(const cf_learner *a, const cf_learner *b, const char *what) {
    assert_same_model_state(a, b, what);
    const cf_recorder *ra = &a->recorder, *rb = &b->recorder;
    if (ra->n_batches != rb->n_batches || ra->n_epochs != rb->n_epochs || ra->n_hps != rb->n_hps ||
        ra->n_values != rb->n_values)
        fail_msg("%s: the Recorder has %lld batches, %d epochs, %lld hps, %d values (reference: "
                 "%lld, %d, %lld, %d)",
                 what, (long long)rb->n_batches, rb->n_epochs, (long long)rb->n_hps, rb->n_values,
                 (long long)ra->n_batches, ra->n_epochs, (long long)ra->n_hps, ra->n_values);
    same_doubles(ra->lrs, rb->lrs, ra->n_batches, what, "lrs");
    same_doubles(ra->moms, rb->moms, ra->n_batches, what, "moms");
    same_doubles(ra->losses, rb->losses, ra->n_batches, what, "smoothed losses");
    same_doubles(ra->hp_lr, rb->hp_lr, ra->n_hps, what, "scheduled lrs");
    same_doubles(ra->hp_mom, rb->hp_mom, ra->n_hps, what, "scheduled moms");
    same_doubles(ra->values, rb->values, (int64_t)ra->n_epochs * ra->n_values, what,
                 "per-epoch values");
    if (ra->n_epochs && memcmp(ra->iters, rb->iters, (size_t)ra->n_epochs * sizeof *ra->iters))
        fail_msg("%s: the Recorder's iterations differ from the reference fit", what);
    if (ra->smooth_val != rb->smooth_val || ra->smooth_count != rb->smooth_count)
        fail_msg("%s: the smoothed loss state is %.17g after %lld batches (reference %.17g, %lld)",
                 what, rb->smooth_val, (long long)rb->smooth_count, ra->smooth_val,
                 (long long)ra->smooth_count);
    if (a->n_final_record != b->n_final_record)
        fail_msg("%s: a final record of %d values (reference %d)", what, b->n_final_record,
                 a->n_final_record);
    same_doubles(a->final_record, b->final_record, a->n_final_record, what, "final record");
}
