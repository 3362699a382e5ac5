/* The optimizers' element-wise updates (cf_sgd_update, cf_adam_update in corefit/tensor.h),
 * written once in plain C and compiled into each kernel table with that table's instruction set
 * (the compiler vectorises the loops). Floating-point contraction is off (ISO C), so every table
 * gives bitwise the same weights. */
#ifndef COREFIT_OPTIM_LOOPS_H
#define COREFIT_OPTIM_LOOPS_H

#include "tensor/kernel_table.h"

#include <math.h>

static void loops_sgd_update(const cf_opt_update *u, float *restrict wt, const float *restrict gr,
                             float *restrict ga, size_t n) {
    const float decay = u->decay, wd = u->wd, lr = u->lr, mom = u->mom;
    if (!ga) {
        if (u->decoupled)
            for (size_t i = 0; i < n; i++) wt[i] = wt[i] * decay - lr * gr[i];
        else if (u->l2)
            for (size_t i = 0; i < n; i++) wt[i] = wt[i] - lr * (gr[i] + wd * wt[i]);
        else
            for (size_t i = 0; i < n; i++) wt[i] = wt[i] - lr * gr[i];
        return;
    }
    if (u->decoupled)
        for (size_t i = 0; i < n; i++) {
            float p = wt[i] * decay;
            float m = mom * ga[i] + gr[i];
            ga[i] = m;
            wt[i] = p - lr * m;
        }
    else if (u->l2)
        for (size_t i = 0; i < n; i++) {
            float p = wt[i];
            float m = mom * ga[i] + (gr[i] + wd * p);
            ga[i] = m;
            wt[i] = p - lr * m;
        }
    else
        for (size_t i = 0; i < n; i++) {
            float m = mom * ga[i] + gr[i];
            ga[i] = m;
            wt[i] = wt[i] - lr * m;
        }
}

/* The three cases are separate loops so that each vectorises without a branch per element. */
#define ADAM_LOOP(prepare)                                                                         \
    for (size_t i = 0; i < n; i++) {                                                               \
        float p = wt[i];                                                                           \
        float g = gr[i];                                                                           \
        prepare;                                                                                   \
        float m = mom * ga[i] + mom_w * g;                                                         \
        float v = sqr_mom * sa[i] + sqr_w * g * g;                                                 \
        ga[i] = m;                                                                                 \
        sa[i] = v;                                                                                 \
        wt[i] = p - step_size * m / (sqrtf(v) / debias2_sqrt + eps);                               \
    }

static void loops_adam_update(const cf_opt_update *u, float *restrict wt, const float *restrict gr,
                              float *restrict ga, float *restrict sa, size_t n) {
    const float decay = u->decay, wd = u->wd, mom = u->mom, mom_w = u->mom_w;
    const float sqr_mom = u->sqr_mom, sqr_w = u->sqr_w, step_size = u->step_size;
    const float debias2_sqrt = u->debias2_sqrt, eps = u->eps;
    if (u->l2 && u->decoupled) {
        ADAM_LOOP(g += wd * p; p *= decay)
    } else if (u->l2) {
        ADAM_LOOP(g += wd * p)
    } else if (u->decoupled) {
        ADAM_LOOP(p *= decay)
    } else {
        ADAM_LOOP((void)0)
    }
}
#undef ADAM_LOOP

static const cf_optim_kernels loops_optim = {
    .sgd = loops_sgd_update,
    .adam = loops_adam_update,
};

#endif
