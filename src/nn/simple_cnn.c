/* fastai's SimpleCNN. */
#include "corefit/nn.h"
#include "nn_internal.h"
#include "zoo.h"

/* ---- SimpleCNN ----------------------------------------------------------------------------- */

cf_module *cf_simple_cnn(int n_filters, const int *filters, const int *kernel_szs,
                         const int *strides, bool bn) {
    if (n_filters < 2 || !filters)
        return cf_fail(CF_ERR_INVALID, "simple_cnn: needs at least 2 filter sizes, got %d",
                       n_filters),
               NULL;
    int nl = n_filters - 1;
    bool ok = true;
    cf_module *seq = cf_sequential(0, NULL);
    cf_module *hook = cf_zoo_hook_new(CF_ZOO_PASS_NONE);
    if (!seq || !hook) ok = false;
    for (int i = 0; i < nl && ok; i++) {
        int ks = kernel_szs ? kernel_szs[i] : 3, st = strides ? strides[i] : 2;
        bool with_bn = bn && i < nl - 1;
        if (ks < 1 || st < 1 || filters[i] < 1 || filters[i + 1] < 1) {
            cf_fail(CF_ERR_INVALID, "simple_cnn: layer %d: %d -> %d, kernel %d, stride %d", i,
                    filters[i], filters[i + 1], ks, st);
            ok = false;
            break;
        }
        cf_module *layer = cf_sequential(0, NULL);
        bool lok = layer != NULL;
        cf_module *conv = cf_conv2d(filters[i], filters[i + 1], ks, st, (ks - 1) / 2, !with_bn);
        if (!conv || !cf_zoo_hook_mark(hook, conv, CF_ZOO_MARK_CONV_RELU)) lok = false;
        cf_zoo_add(layer, &lok, conv);
        if (with_bn) {
            cf_module *b = cf_batchnorm2d(filters[i + 1]);
            if (!b || !cf_zoo_hook_mark(hook, b, CF_ZOO_MARK_BN)) lok = false;
            cf_zoo_add(layer, &lok, b);
        }
        cf_zoo_add(layer, &lok, cf_relu());
        if (!lok) {
            cf_module_free(layer);
            layer = NULL;
        }
        cf_zoo_add(seq, &ok, layer);
    }
    cf_module *pf = NULL;
    if (ok) {
        cf_module *parts[2] = {cf_adaptive_avgpool2d(1, 1), cf_flatten()};
        if (!parts[0] || !parts[1]) {
            cf_module_free(parts[0]);
            cf_module_free(parts[1]);
        } else {
            pf = cf_sequential(2, parts);
        }
    }
    cf_zoo_add(seq, &ok, pf);
    if (!cf_zoo_finish(seq, hook, ok)) {
        cf_module_free(seq);
        cf_fail_context(CF_ERR_INVALID, "simple_cnn");
        return NULL;
    }
    return seq;
}
