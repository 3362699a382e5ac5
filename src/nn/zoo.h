/* Internal to src/nn: what the model zoo's constructors share (zoo.c).
 *
 * Initialisation. cf_model_new initialises each module when its walk reaches it, parents before
 * children (PyTorch's state_dict order), so a module cannot re-initialise its children from its
 * own init. fastai's model-level initialisation (init_cnn, apply_init, the BatchNorm helper's
 * bias 1e-3, zeroed BatchNorm weights) therefore runs from an "init hook": a parameterless
 * pass-through module appended as the last child of the subtree it initialises. It has no
 * parameters (so no names), reserves no memory and returns its input untouched. */
#ifndef COREFIT_NN_ZOO_H
#define COREFIT_NN_ZOO_H

#include "corefit/nn.h"

typedef enum cf_zoo_mark_kind {
    CF_ZOO_MARK_BN,         /* fastai's BatchNorm(): weight 1, bias 1e-3 */
    CF_ZOO_MARK_BN_ZERO,    /* BatchNorm(norm_type=BatchZero): weight 0, bias 1e-3 */
    CF_ZOO_MARK_CONV_RELU,  /* ConvLayer's init_linear (ReLU): kaiming_uniform_, bias N(0, .01) */
    CF_ZOO_MARK_EMBEDDING,  /* fastai's Embedding: trunc_normal_(std 0.01) */
    CF_ZOO_MARK_APPLY_INIT, /* apply_init(subtree, kaiming_normal_): weights N(0, 2/fan_in),
                               biases 0, norm layers untouched */
    CF_ZOO_MARK_ICNR, /* PixelShuffle_ICNR's conv: icnr_init (scale: the mark's arg), bias 0 */
} cf_zoo_mark_kind;

typedef enum cf_zoo_init_pass {
    CF_ZOO_PASS_NONE,
    CF_ZOO_PASS_APPLY_INIT,  /* vision_learner's apply_init(head, kaiming_normal_) */
    CF_ZOO_PASS_INIT_CNN,    /* xresnet's init_cnn */
    CF_ZOO_PASS_TORCHVISION, /* torchvision's ResNet: conv weights kaiming_normal_(fan_out, relu) */
} cf_zoo_init_pass;

/* A hook that runs `pass` over its target (set by cf_zoo_finish or cf_zoo_hook_target) after
 * the marked layers' own fastai initialisation. NULL when out of memory. */
cf_module *cf_zoo_hook_new(cf_zoo_init_pass pass);
/* Marks target for the hook's initialisation `kind`; false when target is NULL or out of
 * memory. */
bool cf_zoo_hook_mark(cf_module *hook, cf_module *target, cf_zoo_mark_kind kind);
/* The same with an argument for the kind (CF_ZOO_MARK_ICNR: the scale). */
bool cf_zoo_hook_mark_arg(cf_module *hook, cf_module *target, cf_zoo_mark_kind kind, int arg);
/* The subtree the hook initialises (not owned), for a container that appends the hook itself. */
void cf_zoo_hook_target(cf_module *hook, cf_module *target);
/* Appends the hook to seq as the subtree's last child, which it initialises; frees the hook and
 * returns false when !ok or seq is NULL. */
bool cf_zoo_finish(cf_module *seq, cf_module *hook, bool ok);
/* Appends child to seq while *ok; frees it and clears *ok otherwise (or when child is NULL or
 * the append fails). */
void cf_zoo_add(cf_module *seq, bool *ok, cf_module *child);
/* A pass-through container (PyTorch's ModuleList: its children are run by the parent). */
cf_module *cf_zoo_module_list(void);
/* Sequential(body, head) as fastai's vision_learner builds it; frees both on failure. */
cf_module *cf_zoo_body_head(cf_module *body, cf_module *head);
/* fastai's LinBnDrop(n_in, n_out, bn, p, act, lin_first) appended flat to seq (`layers +=`). */
void cf_zoo_lin_bn_drop(cf_module *seq, cf_module *hook, bool *ok, int n_in, int n_out, bool bn,
                        float p, bool act, bool lin_first);

#endif
