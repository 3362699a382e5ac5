/* The vision models by name (the CLI's and exported models' --arch): mini-resnet, fast-cnn,
 * fastai's xresnets and torchvision's ResNets. Apart from xresnet.c and resnet.c so that
 * neither of them depends on the other. */
#include "corefit/nn.h"

#include <stdio.h>
#include <string.h>

cf_module *cf_vision_model(const char *arch, int c_in, int n_out) {
    if (!arch) return cf_fail(CF_ERR_INVALID, "vision model: no architecture name"), NULL;
    if (strcmp(arch, "mini-resnet") == 0) return cf_mini_resnet(c_in, n_out);
    if (strcmp(arch, "fast-cnn") == 0) return cf_fast_cnn(c_in, n_out);
    static const int depths[3] = {18, 34, 50};
    for (int i = 0; i < 3; i++) {
        char plain[32], small[32];
        snprintf(plain, sizeof plain, "xresnet%d", depths[i]);
        snprintf(small, sizeof small, "xresnet%d-small", depths[i]);
        bool is_small = strcmp(arch, small) == 0;
        if (is_small || strcmp(arch, plain) == 0) {
            cf_xresnet_opts o = cf_xresnet_defaults();
            o.c_in = c_in;
            o.small_images = is_small;
            return cf_xresnet(depths[i], n_out, &o);
        }
    }
    int depth = 0;
    char tail = 0;
    if (sscanf(arch, "resnet%d%c", &depth, &tail) == 1 && cf_resnet_nf(depth))
        return cf_resnet_learner_model(depth, c_in, n_out, NULL);
    return cf_fail(CF_ERR_INVALID,
                   "unknown architecture '%s' (mini-resnet, fast-cnn, xresnet18, xresnet34, "
                   "xresnet50, xresnetNN-small, resnet18, resnet34, resnet50, resnet101 or "
                   "resnet152)",
                   arch),
           NULL;
}
