/* Vision models: fastai's create_head, the W1 mini-resnet, fastai's xresnet18/34/50 and the
 * choice of a vision model by name. */
#include "corefit/nn.h"
#include "nn_internal.h"
#include "zoo.h"

#include <string.h>

/* ---- create_head --------------------------------------------------------------------------- */

cf_head_opts cf_head_defaults(void) {
    return (cf_head_opts){
        .n_lin_ftrs = 1,
        .lin_ftrs = {512},
        .n_ps = 1,
        .ps = {0.5f},
        .pool = true,
        .concat_pool = true,
        .first_bn = true,
        .bn_final = false,
        .lin_first = false,
        .y_range = false,
        .init = true,
    };
}

void cf_zoo_lin_bn_drop(cf_module *seq, cf_module *hook, bool *ok, int n_in, int n_out, bool bn,
                        float p, bool act, bool lin_first) {
    cf_module *bn_m = NULL, *drop = NULL;
    if (bn) {
        bn_m = cf_batchnorm1d(lin_first ? n_out : n_in);
        if (!bn_m || !cf_zoo_hook_mark(hook, bn_m, CF_ZOO_MARK_BN)) *ok = false;
    }
    if (p != 0.0f && !(drop = cf_dropout(p))) *ok = false;
    cf_module *lin = cf_linear(n_in, n_out, !bn);
    cf_module *relu = act ? cf_relu() : NULL;
    if (!lin || (act && !relu)) *ok = false;
    if (lin_first) {
        cf_zoo_add(seq, ok, lin);
        if (act) cf_zoo_add(seq, ok, relu);
        if (bn) cf_zoo_add(seq, ok, bn_m);
        if (drop) cf_zoo_add(seq, ok, drop);
    } else {
        if (bn) cf_zoo_add(seq, ok, bn_m);
        if (drop) cf_zoo_add(seq, ok, drop);
        cf_zoo_add(seq, ok, lin);
        if (act) cf_zoo_add(seq, ok, relu);
    }
}

cf_module *cf_create_head(int nf, int n_out, const cf_head_opts *opts) {
    cf_head_opts o = opts ? *opts : cf_head_defaults();
    if (nf < 1 || n_out < 1)
        return cf_fail(CF_ERR_INVALID, "create_head: nf %d and n_out %d must be positive", nf,
                       n_out),
               NULL;
    if (o.n_lin_ftrs < 0 || o.n_lin_ftrs > CF_HEAD_MAX_LAYERS)
        return cf_fail(CF_ERR_INVALID, "create_head: %d hidden layers (0..%d)", o.n_lin_ftrs,
                       CF_HEAD_MAX_LAYERS),
               NULL;
    int n_blocks = o.n_lin_ftrs + 1; /* len(lin_ftrs) - 1 */
    if (o.n_ps != 1 && o.n_ps != n_blocks)
        return cf_fail(CF_ERR_INVALID,
                       "create_head: %d dropout values for %d blocks (give 1 or %d)", o.n_ps,
                       n_blocks, n_blocks),
               NULL;
    int sizes[CF_HEAD_MAX_LAYERS + 2];
    float ps[CF_HEAD_MAX_LAYERS + 1];
    sizes[0] = o.pool && o.concat_pool ? 2 * nf : nf;
    for (int i = 0; i < o.n_lin_ftrs; i++) {
        if (o.lin_ftrs[i] < 1)
            return cf_fail(CF_ERR_INVALID, "create_head: lin_ftrs[%d] = %d", i, o.lin_ftrs[i]),
                   NULL;
        sizes[i + 1] = o.lin_ftrs[i];
    }
    sizes[n_blocks] = n_out;
    for (int i = 0; i < n_blocks; i++) {
        ps[i] = o.n_ps == 1 ? (i < n_blocks - 1 ? o.ps[0] / 2 : o.ps[0]) : o.ps[i];
        if (!(ps[i] >= 0.0f && ps[i] < 1.0f))
            return cf_fail(CF_ERR_INVALID, "create_head: dropout p %g for block %d not in [0, 1)",
                           ps[i], i),
                   NULL;
    }
    bool ok = true;
    cf_module *seq = cf_sequential(0, NULL);
    cf_module *hook = cf_zoo_hook_new(o.init ? CF_ZOO_PASS_APPLY_INIT : CF_ZOO_PASS_NONE);
    if (!seq || !hook) ok = false;
    if (o.pool) {
        cf_zoo_add(seq, &ok,
                   o.concat_pool ? cf_adaptive_concat_pool2d() : cf_adaptive_avgpool2d(1, 1));
        cf_zoo_add(seq, &ok, cf_flatten());
    }
    int first_p = 0;
    if (o.lin_first) cf_zoo_add(seq, &ok, cf_dropout(ps[first_p++])); /* ps.pop(0) */
    /* zip(lin_ftrs[:-1], lin_ftrs[1:], bns, ps, actns): as many blocks as ps values left */
    int n_zip = n_blocks - first_p;
    for (int i = 0; i < n_zip && ok; i++)
        cf_zoo_lin_bn_drop(seq, hook, &ok, sizes[i], sizes[i + 1], i == 0 ? o.first_bn : true,
                           ps[first_p + i], i < n_blocks - 1, o.lin_first);
    if (o.lin_first) cf_zoo_add(seq, &ok, cf_linear(sizes[n_blocks - 1], n_out, true));
    if (o.bn_final) cf_zoo_add(seq, &ok, cf_batchnorm_ex(n_out, false, 1e-5f, 0.01f));
    if (o.y_range) cf_zoo_add(seq, &ok, cf_nn_sigmoid_range(o.y_lo, o.y_hi));
    if (!cf_zoo_finish(seq, hook, ok)) {
        cf_module_free(seq);
        cf_fail_context(CF_ERR_INVALID, "create_head(nf %d, n_out %d)", nf, n_out);
        return NULL;
    }
    return seq;
}

/* ---- W1: mini-resnet ----------------------------------------------------------------------- */

static cf_module *mini_block(int ni, int nf) {
    bool ok = true;
    cf_module *conv = cf_sequential(0, NULL), *id = cf_sequential(0, NULL);
    if (!conv || !id) ok = false;
    cf_zoo_add(conv, &ok, cf_conv2d(ni, nf, 3, 2, 1, false));
    cf_zoo_add(conv, &ok, cf_batchnorm2d(nf));
    cf_zoo_add(conv, &ok, cf_relu());
    cf_zoo_add(conv, &ok, cf_conv2d(nf, nf, 3, 1, 1, false));
    cf_zoo_add(conv, &ok, cf_batchnorm2d(nf));
    cf_zoo_add(id, &ok, cf_conv2d(ni, nf, 1, 2, 0, false));
    cf_zoo_add(id, &ok, cf_batchnorm2d(nf));
    if (!ok) {
        cf_module_free(conv);
        cf_module_free(id);
        return NULL;
    }
    return cf_residual(conv, id, true);
}

cf_module *cf_mini_resnet_body(int c_in) {
    if (c_in < 1) return cf_fail(CF_ERR_INVALID, "mini-resnet: c_in %d", c_in), NULL;
    bool ok = true;
    cf_module *body = cf_sequential(0, NULL);
    cf_zoo_add(body, &ok, cf_conv2d(c_in, 16, 3, 1, 1, false));
    cf_zoo_add(body, &ok, cf_batchnorm2d(16));
    cf_zoo_add(body, &ok, cf_relu());
    cf_zoo_add(body, &ok, mini_block(16, 32));
    cf_zoo_add(body, &ok, mini_block(32, 64));
    if (!ok) {
        cf_module_free(body);
        cf_fail_context(CF_ERR_INVALID, "mini-resnet body");
        return NULL;
    }
    return body;
}

cf_module *cf_mini_resnet_ex(int c_in, int n_out, const cf_head_opts *head) {
    return cf_zoo_body_head(cf_mini_resnet_body(c_in), cf_create_head(64, n_out, head));
}

cf_module *cf_mini_resnet(int c_in, int n_out) {
    cf_head_opts h = cf_head_defaults();
    h.n_lin_ftrs = 1;
    h.lin_ftrs[0] = 256;
    h.n_ps = 2;
    h.ps[0] = 0.25f;
    h.ps[1] = 0.5f;
    return cf_mini_resnet_ex(c_in, n_out, &h);
}

/* ---- xresnet ------------------------------------------------------------------------------- */

cf_xresnet_opts cf_xresnet_defaults(void) {
    return (cf_xresnet_opts){.c_in = 3, .small_images = false, .head = cf_head_defaults()};
}

/* fastai's ConvLayer(ni, nf, ks, stride) with BatchNorm: Sequential(Conv2d(no bias),
 * BatchNorm2d, [ReLU]); zero_bn: NormType.BatchZero. */
static cf_module *conv_layer(cf_module *hook, int ni, int nf, int ks, int stride, bool act,
                             bool zero_bn) {
    bool ok = true;
    cf_module *seq = cf_sequential(0, NULL);
    cf_module *conv = cf_conv2d(ni, nf, ks, stride, (ks - 1) / 2, false);
    cf_module *bn = cf_batchnorm2d(nf);
    if (!conv || !bn || !cf_zoo_hook_mark(hook, bn, zero_bn ? CF_ZOO_MARK_BN_ZERO : CF_ZOO_MARK_BN))
        ok = false;
    cf_zoo_add(seq, &ok, conv);
    cf_zoo_add(seq, &ok, bn);
    if (act) cf_zoo_add(seq, &ok, cf_relu());
    if (!ok) {
        cf_module_free(seq);
        return NULL;
    }
    return seq;
}

/* fastai's ResBlock(expansion, ni, nf, stride) with the default options. */
static cf_module *res_block(cf_module *hook, int expansion, int ni, int nf, int stride) {
    int nh = nf;
    nf *= expansion;
    ni *= expansion;
    bool ok = true;
    cf_module *conv = cf_sequential(0, NULL);
    if (expansion == 1) {
        cf_zoo_add(conv, &ok, conv_layer(hook, ni, nh, 3, stride, true, false));
        cf_zoo_add(conv, &ok, conv_layer(hook, nh, nf, 3, 1, false, true));
    } else {
        cf_zoo_add(conv, &ok, conv_layer(hook, ni, nh, 1, 1, true, false));
        cf_zoo_add(conv, &ok, conv_layer(hook, nh, nh, 3, stride, true, false));
        cf_zoo_add(conv, &ok, conv_layer(hook, nh, nf, 1, 1, false, true));
    }
    cf_module *id = NULL;
    if (ni != nf || stride != 1) {
        id = cf_sequential(0, NULL);
        if (stride != 1) cf_zoo_add(id, &ok, cf_nn_avgpool2d_ceil(stride, stride, 0));
        if (ni != nf) cf_zoo_add(id, &ok, conv_layer(hook, ni, nf, 1, 1, false, false));
    }
    if (!ok) {
        cf_module_free(conv);
        cf_module_free(id);
        return NULL;
    }
    return cf_residual(conv, id, true);
}

static bool xresnet_layout(int depth, int *expansion, int layers[4]) {
    static const int l18[4] = {2, 2, 2, 2}, l34[4] = {3, 4, 6, 3};
    switch (depth) {
    case 18:
        *expansion = 1;
        memcpy(layers, l18, sizeof l18);
        return true;
    case 34:
        *expansion = 1;
        memcpy(layers, l34, sizeof l34);
        return true;
    case 50:
        *expansion = 4;
        memcpy(layers, l34, sizeof l34);
        return true;
    default:
        return false;
    }
}

int cf_xresnet_nf(int depth) {
    int e, l[4];
    return xresnet_layout(depth, &e, l) ? 512 * e : 0;
}

cf_module *cf_xresnet_body(int depth, const cf_xresnet_opts *opts) {
    cf_xresnet_opts o = opts ? *opts : cf_xresnet_defaults();
    int expansion, layers[4];
    if (!xresnet_layout(depth, &expansion, layers))
        return cf_fail(CF_ERR_INVALID, "xresnet: depth %d (18, 34 or 50)", depth), NULL;
    if (o.c_in < 1) return cf_fail(CF_ERR_INVALID, "xresnet: c_in %d", o.c_in), NULL;
    bool ok = true;
    cf_module *body = cf_sequential(0, NULL);
    cf_module *hook = cf_zoo_hook_new(CF_ZOO_PASS_INIT_CNN);
    if (!body || !hook) ok = false;
    const int stem[4] = {o.c_in, 32, 32, 64};
    for (int i = 0; i < 3 && ok; i++)
        cf_zoo_add(body, &ok,
                   conv_layer(hook, stem[i], stem[i + 1], 3, i == 0 && !o.small_images ? 2 : 1,
                              true, false));
    cf_zoo_add(body, &ok, cf_maxpool2d(3, 2, 1));
    const int szs[5] = {64 / expansion, 64, 128, 256, 512};
    for (int s = 0; s < 4 && ok; s++) {
        cf_module *stage = cf_sequential(0, NULL);
        bool sok = stage != NULL;
        for (int b = 0; b < layers[s] && sok; b++)
            cf_zoo_add(stage, &sok,
                       res_block(hook, expansion, b == 0 ? szs[s] : szs[s + 1], szs[s + 1],
                                 b == 0 && s > 0 ? 2 : 1));
        if (!sok) {
            cf_module_free(stage);
            stage = NULL;
        }
        cf_zoo_add(body, &ok, stage);
    }
    if (!cf_zoo_finish(body, hook, ok)) {
        cf_module_free(body);
        cf_fail_context(CF_ERR_INVALID, "xresnet%d body", depth);
        return NULL;
    }
    return body;
}

cf_module *cf_xresnet(int depth, int n_out, const cf_xresnet_opts *opts) {
    cf_xresnet_opts o = opts ? *opts : cf_xresnet_defaults();
    if (!cf_xresnet_nf(depth))
        return cf_fail(CF_ERR_INVALID, "xresnet: depth %d (18, 34 or 50)", depth), NULL;
    return cf_zoo_body_head(cf_xresnet_body(depth, &o),
                            cf_create_head(cf_xresnet_nf(depth), n_out, &o.head));
}

static cf_module *xresnet_plain(int depth, int c_in, int n_out) {
    cf_xresnet_opts o = cf_xresnet_defaults();
    o.c_in = c_in;
    return cf_xresnet(depth, n_out, &o);
}

cf_module *cf_xresnet18(int c_in, int n_out) {
    return xresnet_plain(18, c_in, n_out);
}
cf_module *cf_xresnet34(int c_in, int n_out) {
    return xresnet_plain(34, c_in, n_out);
}
cf_module *cf_xresnet50(int c_in, int n_out) {
    return xresnet_plain(50, c_in, n_out);
}
