/* corefit/optim.h — optimizers over a model's flat parameter block, with per-group
 * hyper-parameters, exactly as fastai's optimizer.py (see the formulas below).
 *
 * SGD:  if do_wd: p *= 1 - lr*wd (decoupled) or g += wd*p (L2);
 *       mom != 0: grad_avg = mom*grad_avg + g (no dampening); p -= lr*grad_avg
 *       mom == 0: p -= lr*g
 * Adam (fastai's, AdamW behaviour): if do_wd: p *= 1 - lr*wd (decoupled, first) or g += wd*p;
 *       grad_avg = mom*grad_avg + (1-mom)*g;  sqr_avg = sqr_mom*sqr_avg + (1-sqr_mom)*g^2;
 *       step += 1;  p -= lr/(1-mom^step) * grad_avg / (sqrt(sqr_avg/(1-sqr_mom^step)) + eps)
 * Only trainable parameters (not frozen) are stepped; their step counters advance per parameter.
 * do_wd is false for biases and BatchNorm parameters unless wd_bn_bias. */
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

/* Groups are model->n_groups at creation (parameters in groups added later use the last group's
 * hypers). As in fastai, SGD keeps a momentum average only when created with mom != 0 (a mom
 * set later on an SGD created with mom 0 is ignored). Large models are stepped on the thread
 * pool; the result does not depend on the thread count. No allocation after creation. */
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
/* fastai's slice expansion of a hyper-parameter over n groups, into out[n]:
 * start > 0: even_mults(start, stop, n), start*(stop/start)^(i/(n-1)) (stop when n == 1);
 * start <= 0 (slice(None, stop), e.g. slice(lr)): stop/10 for every group but the last, stop for
 * the last. Feed the result to cf_optimizer_set_hyper for discriminative learning rates. */
void cf_hyper_slice(double start, double stop, int n, double *out);
/* Copies state (hypers, moving averages, steps) between optimizers of the same model shape. */
cf_status cf_optimizer_copy_state(cf_optimizer *dst, const cf_optimizer *src);
/* Size in floats of the optimizer state (grad_avg, sqr_avg, steps), for transfer. */
size_t cf_optimizer_state_floats(const cf_optimizer *opt);
/* The optimizer's state (hypers, moving averages, steps) as bytes, in a versioned format that
 * names its kind and shape. Export returns the bytes needed and writes them only when size is
 * at least that (buf may be NULL to ask); 0 for a NULL optimizer. Import checks the magic, the
 * version, that kind, groups, weights and parameters match this optimizer and that size is
 * exact; on any mismatch it returns CF_ERR_INVALID naming the offset and the values, and
 * leaves the optimizer unchanged. */
size_t cf_optimizer_export(const cf_optimizer *opt, void *buf, size_t size);
cf_status cf_optimizer_import(cf_optimizer *opt, const void *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
