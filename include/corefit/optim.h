/* corefit/optim.h — fastai's SGD and Adam (decoupled weight decay) over a model's flat parameter
 * block, with per-group hyper-parameters; only trainable parameters are stepped, and biases and
 * BatchNorm get no weight decay unless wd_bn_bias. Update formulas: docs/api.md. */
#ifndef COREFIT_OPTIM_H
#define COREFIT_OPTIM_H

#include "corefit/core.h"
#include "corefit/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cf_opt_kind { CF_OPT_SGD, CF_OPT_ADAM } cf_opt_kind;

/* Hyper-parameters of one parameter group. */
typedef struct cf_hypers {
    double lr, mom, sqr_mom, eps, wd;
} cf_hypers;

typedef struct cf_opt_config {
    cf_opt_kind kind;
    cf_hypers hypers; /* defaults for every group */
    bool decouple_wd; /* true: true weight decay (fastai's default); false: L2 */
    bool wd_bn_bias;  /* apply weight decay to biases and BatchNorm parameters too */
} cf_opt_config;

/* fastai's defaults: Adam(mom 0.9, sqr_mom 0.99, eps 1e-5, wd 0.01), SGD(mom 0, wd 0),
 * lr 1e-3, decoupled weight decay. */
cf_opt_config cf_opt_adam_defaults(void);
cf_opt_config cf_opt_sgd_defaults(void);

typedef struct cf_optimizer {
    cf_opt_config config;
    cf_model *model; /* borrowed */
    int n_groups;
    cf_hypers *hypers; /* per group */
    float *grad_avg;   /* n_weights, or NULL when unused */
    float *sqr_avg;    /* n_weights, or NULL when unused */
    float *steps;      /* per parameter (model->n_params entries; buffers stay 0) */
    bool *do_wd;       /* per parameter */
    void *work;        /* internal: per-parameter coefficients of the current step */
} cf_optimizer;

/* Groups are model->n_groups at creation. As in fastai, SGD keeps a momentum average only when
 * created with mom != 0. Results do not depend on the thread count; no allocation after this. */
cf_status cf_optimizer_new(cf_optimizer **out, cf_model *model, const cf_opt_config *config);
void cf_optimizer_free(cf_optimizer *opt);
/* One step over every trainable parameter, using model->grads. */
void cf_optimizer_step(cf_optimizer *opt);
void cf_optimizer_zero_grad(cf_optimizer *opt);
/* Forgets moving averages and step counts (fastai's clear_state). */
void cf_optimizer_clear_state(cf_optimizer *opt);
/* Sets one hyper-parameter for every group from n values: n == 1 sets all groups alike,
 * n == n_groups sets each. name: "lr", "mom", "sqr_mom", "eps", "wd". */
cf_status cf_optimizer_set_hyper(cf_optimizer *opt, const char *name, const double *values, int n);
/* fastai's slice expansion over n groups into out[n]: start > 0 geometric from start to stop;
 * start <= 0 (slice(stop)): stop/10 for all but the last, stop for the last. */
void cf_hyper_slice(double start, double stop, int n, double *out);
/* Copies state (hypers, moving averages, steps) between optimizers of the same model shape. */
cf_status cf_optimizer_copy_state(cf_optimizer *dst, const cf_optimizer *src);
/* Size in floats of the optimizer state (grad_avg, sqr_avg, steps), for transfer. */
size_t cf_optimizer_state_floats(const cf_optimizer *opt);
/* The optimizer's state as versioned bytes. Export returns the size needed (buf NULL to ask; 0
 * for a NULL optimizer). Import returns CF_ERR_INVALID naming offset and values on any mismatch,
 * optimizer unchanged. */
size_t cf_optimizer_export(const cf_optimizer *opt, void *buf, size_t size);
cf_status cf_optimizer_import(cf_optimizer *opt, const void *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
