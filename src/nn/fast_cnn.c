/* The "fast-cnn": a small, wide and shallow net for 28x28 images, built for the shortest time
 * to Fashion-MNIST's 92% (corefit train --recipe fast; docs/api.md). The airbench habit: a
 * stem convolution at full resolution on the few input channels (cheap), then convolution
 * groups that pool early, so the costly convolutions run at 14x14 and 7x7; and, as airbench's
 * ConvGroup, each group pools right after its convolution, so that BatchNorm and ReLU run on a
 * quarter of the pixels:
 *
 *   stem:     Conv2d(c_in, 24, 3, pad 1), MaxPool2d(2), BatchNorm2d, ReLU          28 -> 14
 *   group 1:  Conv2d(24, 48, 3, pad 1), MaxPool2d(2), BatchNorm2d, ReLU            14 -> 7
 *   group 2:  Conv2d(48, 96, 3, pad 1), MaxPool2d(2), BatchNorm2d, ReLU            7 -> 3
 *   head:     fastai's create_head(96, n_out) as the caller asks (the arch's default:
 *             AdaptiveConcatPool2d, Flatten, BatchNorm1d(192), Linear(192, n_out))
 *
 * 4.2 M multiply-adds per image forward against the mini-resnet's 5.6 M. Pooling before
 * BatchNorm (max commutes with ReLU, and with BatchNorm's affine map wherever its scale is
 * positive; only the batch statistics differ) took a training step from 23.0 to 20.7 CPU ms
 * (batch 64, 1 thread; BatchNorm's share from 3.7 to 1.1 ms) at the same 3-epoch accuracy
 * (bench/README.md, "Time to accuracy"). Wider groups (32/64/128), strided residual blocks and
 * a stride-2 stem (no 28 px pool) reached less accuracy for the CPU time. PyTorch's default
 * initialisation (kaiming_uniform_(a=sqrt(5))) for the convolutions, fastai's for the head. The
 * PyTorch twin: bench/fast_torch.py. */
#include "corefit/nn.h"

#include "zoo.h"

static const int fast_widths[] = {24, 48, 96};
enum { FAST_GROUPS = sizeof fast_widths / sizeof *fast_widths };

/* Conv2d(ni, nf, 3, pad 1, no bias), MaxPool2d(2), BatchNorm2d(nf), ReLU, appended to seq. */
static void conv_group(cf_module *seq, bool *ok, int ni, int nf) {
    cf_zoo_add(seq, ok, cf_conv2d(ni, nf, 3, 1, 1, false));
    cf_zoo_add(seq, ok, cf_maxpool2d(2, 2, 0));
    cf_zoo_add(seq, ok, cf_batchnorm2d(nf));
    cf_zoo_add(seq, ok, cf_relu());
}

int cf_fast_cnn_nf(void) {
    return fast_widths[FAST_GROUPS - 1];
}

cf_module *cf_fast_cnn_body(int c_in) {
    if (c_in < 1) return cf_fail(CF_ERR_INVALID, "fast-cnn: c_in %d", c_in), NULL;
    bool ok = true;
    cf_module *body = cf_sequential(0, NULL);
    if (!body) ok = false;
    int ni = c_in;
    for (int g = 0; g < FAST_GROUPS; g++) {
        cf_module *group = cf_sequential(0, NULL);
        if (!group) ok = false;
        conv_group(group, &ok, ni, fast_widths[g]);
        cf_zoo_add(body, &ok, group);
        ni = fast_widths[g];
    }
    if (!ok) {
        cf_module_free(body);
        cf_fail_context(CF_ERR_INVALID, "fast-cnn body");
        return NULL;
    }
    return body;
}

cf_head_opts cf_fast_cnn_head(void) {
    cf_head_opts h = cf_head_defaults();
    h.n_lin_ftrs = 0; /* one LinBnDrop: BatchNorm1d, Linear */
    h.n_ps = 1;
    h.ps[0] = 0.0f; /* no dropout: the fit is a few epochs */
    return h;
}

cf_module *cf_fast_cnn_ex(int c_in, int n_out, const cf_head_opts *head) {
    cf_head_opts h = head ? *head : cf_fast_cnn_head();
    return cf_zoo_body_head(cf_fast_cnn_body(c_in), cf_create_head(cf_fast_cnn_nf(), n_out, &h));
}

cf_module *cf_fast_cnn(int c_in, int n_out) {
    return cf_fast_cnn_ex(c_in, n_out, NULL);
}
