/* torchvision's ResNet and fastai's cut body of it (create_body). */
#include "corefit/nn.h"
#include "nn_internal.h"
#include "zoo.h"

#include <string.h>

/* ---- torchvision's ResNet ------------------------------------------------------------------ *
 * A block is cf_residual(main path, downsample, ReLU after the add) whose main path is a
 * Sequential of conv1, bn1, relu, conv2, bn2 (Bottleneck: ..., relu, conv3, bn3) joined under
 * an empty name, so the names are torchvision's: "layer1.0.conv1.weight",
 * "layer2.0.downsample.0.weight". */

static bool resnet_layout(int depth, bool *bottleneck, int layers[4]) {
    static const struct {
        int depth, bottleneck, layers[4];
    } table[] = {{18, 0, {2, 2, 2, 2}},
                 {34, 0, {3, 4, 6, 3}},
                 {50, 1, {3, 4, 6, 3}},
                 {101, 1, {3, 4, 23, 3}},
                 {152, 1, {3, 8, 36, 3}}};
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (table[i].depth == depth) {
            *bottleneck = table[i].bottleneck;
            memcpy(layers, table[i].layers, sizeof table[i].layers);
            return true;
        }
    return false;
}

int cf_resnet_nf(int depth) {
    bool bottleneck;
    int layers[4];
    return resnet_layout(depth, &bottleneck, layers) ? (bottleneck ? 2048 : 512) : 0;
}

static void named_add(cf_module *parent, bool *ok, const char *name, cf_module *child) {
    if (!*ok || !parent || !child) {
        cf_module_free(child);
        *ok = false;
        return;
    }
    if (cf_module_add_child(parent, child, name) != CF_OK) *ok = false;
}

static bool rename_child(cf_module *m, int i, const char *name) {
    char *copy = cf_strdup(name);
    if (!copy) return false;
    cf_free(m->child_names[i]);
    m->child_names[i] = copy;
    return true;
}

/* BasicBlock / Bottleneck (torchvision >= 0.4: the stride on the 3x3 conv). */
static cf_module *tv_block(int inplanes, int planes, int stride, bool bottleneck) {
    const int out = bottleneck ? 4 * planes : planes;
    bool ok = true;
    cf_module *main = cf_sequential(0, NULL);
    if (bottleneck) {
        named_add(main, &ok, "conv1", cf_conv2d(inplanes, planes, 1, 1, 0, false));
        named_add(main, &ok, "bn1", cf_batchnorm2d(planes));
        named_add(main, &ok, "relu", cf_relu());
        named_add(main, &ok, "conv2", cf_conv2d(planes, planes, 3, stride, 1, false));
        named_add(main, &ok, "bn2", cf_batchnorm2d(planes));
        named_add(main, &ok, "relu", cf_relu());
        named_add(main, &ok, "conv3", cf_conv2d(planes, out, 1, 1, 0, false));
        named_add(main, &ok, "bn3", cf_batchnorm2d(out));
    } else {
        named_add(main, &ok, "conv1", cf_conv2d(inplanes, planes, 3, stride, 1, false));
        named_add(main, &ok, "bn1", cf_batchnorm2d(planes));
        named_add(main, &ok, "relu", cf_relu());
        named_add(main, &ok, "conv2", cf_conv2d(planes, planes, 3, 1, 1, false));
        named_add(main, &ok, "bn2", cf_batchnorm2d(planes));
    }
    cf_module *down = NULL;
    if (stride != 1 || inplanes != out) {
        down = cf_sequential(0, NULL);
        cf_zoo_add(down, &ok, cf_conv2d(inplanes, out, 1, stride, 0, false));
        cf_zoo_add(down, &ok, cf_batchnorm2d(out));
    }
    if (!ok) {
        cf_module_free(main);
        cf_module_free(down);
        return NULL;
    }
    cf_module *block = cf_residual(main, down, true);
    if (block && (!rename_child(block, 0, "") || (down && !rename_child(block, 1, "downsample")))) {
        cf_module_free(block);
        return NULL;
    }
    return block;
}

/* The stem and the four stages, appended to seq (names from `names`, or "0".."7"). */
static void resnet_features(cf_module *seq, bool *ok, int depth, int c_in, bool named) {
    bool bottleneck = false;
    int layers[4] = {0};
    resnet_layout(depth, &bottleneck, layers);
    static const char *const names[8] = {"conv1",  "bn1",    "relu",   "maxpool",
                                         "layer1", "layer2", "layer3", "layer4"};
    cf_module *stem[4] = {cf_conv2d(c_in, 64, 7, 2, 3, false), cf_batchnorm2d(64), cf_relu(),
                          cf_maxpool2d(3, 2, 1)};
    int next = 0;
    for (int i = 0; i < 4; i++, next++) {
        if (named)
            named_add(seq, ok, names[next], stem[i]);
        else
            cf_zoo_add(seq, ok, stem[i]);
    }
    int inplanes = 64;
    for (int s = 0; s < 4; s++, next++) {
        int planes = 64 << s;
        cf_module *stage = cf_sequential(0, NULL);
        bool sok = stage != NULL;
        for (int b = 0; b < layers[s] && sok; b++) {
            cf_zoo_add(stage, &sok,
                       tv_block(inplanes, planes, b == 0 && s > 0 ? 2 : 1, bottleneck));
            inplanes = bottleneck ? 4 * planes : planes;
        }
        if (!sok) {
            cf_module_free(stage);
            stage = NULL;
        }
        if (named)
            named_add(seq, ok, names[next], stage);
        else
            cf_zoo_add(seq, ok, stage);
    }
}

static bool resnet_args(int depth, int c_in, const char *what) {
    if (!cf_resnet_nf(depth))
        return cf_fail(CF_ERR_INVALID, "%s: depth %d (18, 34, 50, 101 or 152)", what, depth), false;
    if (c_in < 1) return cf_fail(CF_ERR_INVALID, "%s: c_in %d", what, c_in), false;
    return true;
}

cf_module *cf_resnet(int depth, int c_in, int num_classes) {
    if (!resnet_args(depth, c_in, "resnet")) return NULL;
    if (num_classes < 1)
        return cf_fail(CF_ERR_INVALID, "resnet: num_classes %d", num_classes), NULL;
    bool ok = true;
    cf_module *model = cf_sequential(0, NULL);
    cf_module *hook = cf_zoo_hook_new(CF_ZOO_PASS_TORCHVISION);
    if (!model || !hook) ok = false;
    resnet_features(model, &ok, depth, c_in, true);
    named_add(model, &ok, "avgpool", cf_adaptive_avgpool2d(1, 1));
    named_add(model, &ok, "flatten", cf_flatten());
    named_add(model, &ok, "fc", cf_linear(cf_resnet_nf(depth), num_classes, true));
    if (!cf_zoo_finish(model, hook, ok)) {
        cf_module_free(model);
        cf_fail_context(CF_ERR_INVALID, "resnet%d", depth);
        return NULL;
    }
    return model;
}

cf_module *cf_resnet_body(int depth, int c_in) {
    if (!resnet_args(depth, c_in, "resnet body")) return NULL;
    bool ok = true;
    cf_module *body = cf_sequential(0, NULL);
    cf_module *hook = cf_zoo_hook_new(CF_ZOO_PASS_TORCHVISION);
    if (!body || !hook) ok = false;
    resnet_features(body, &ok, depth, c_in, false);
    if (!cf_zoo_finish(body, hook, ok)) {
        cf_module_free(body);
        cf_fail_context(CF_ERR_INVALID, "resnet%d body", depth);
        return NULL;
    }
    return body;
}

cf_module *cf_resnet_learner_model(int depth, int c_in, int n_out, const cf_head_opts *head) {
    if (!resnet_args(depth, c_in, "resnet")) return NULL;
    return cf_zoo_body_head(cf_resnet_body(depth, c_in),
                            cf_create_head(cf_resnet_nf(depth), n_out, head));
}
