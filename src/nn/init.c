/* fastai's apply_init(m, nn.init.kaiming_normal_): on every module that is not a normalisation
 * layer, has a "weight" and requires grad, weight ~ N(0, gain / sqrt(fan_in)) with the ReLU gain
 * sqrt(2) (kaiming_normal_'s defaults: a = 0, mode fan_in, leaky_relu), and bias = 0.
 * fan_in = numel(weight) / weight.shape[0] (in_features, or in_channels * kh * kw). */
#include "corefit/nn.h"

#include <math.h>
#include <string.h>

static bool is_norm(const cf_module *m) {
    return m->ops && m->ops->kind && strncmp(m->ops->kind, "BatchNorm", 9) == 0;
}

static void init_module(cf_module *m, cf_rng *rng) {
    if (!is_norm(m) && m->n_params > 0 && m->params[0].trainable) {
        for (int i = 0; i < m->n_params; i++) {
            cf_param *p = &m->params[i];
            if (!p->data) continue; /* not part of a model yet */
            if (strcmp(p->name, "weight") == 0 && p->shape.dim[0] > 0) {
                double fan_in = (double)p->numel / p->shape.dim[0];
                double std = sqrt(2.0) / sqrt(fan_in);
                for (size_t k = 0; k < p->numel; k++)
                    p->data[k] = (float)(std * cf_rng_normal(rng));
            }
        }
        for (int i = 0; i < m->n_params; i++) {
            cf_param *p = &m->params[i];
            if (p->data && strcmp(p->name, "bias") == 0)
                for (size_t k = 0; k < p->numel; k++) p->data[k] = 0.0f;
        }
    }
    for (int i = 0; i < m->n_children; i++) init_module(m->children[i], rng);
}

void cf_init_kaiming_normal(cf_module *m, cf_rng *rng) {
    if (m && rng) init_module(m, rng);
}
