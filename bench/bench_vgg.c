/* Trains W2, a plain VGG-style CNN on Fashion-MNIST, and prints the same JSON line as bench_w1
 * (bench_common.h: options, what is measured, memory). W2 has no residuals and no pooling head:
 * 3x3 convolutions with BatchNorm and ReLU, max-pools, then a large Linear layer, trained with
 * SGD with momentum; it exercises other kernels than W1 (max-pool, a 1152x1024 GEMM, SGD).
 *
 *   bench_vgg [--threads N | --cores N | --mpi] [--batches B | --epochs E] [--skip S]
 *             [--data DIR] [--seed S]
 *
 * Model (bench/vgg_torch.py builds the same one in PyTorch, with the same parameter names):
 *   0, 1, 2: blocks of [Conv2d(ci, c, 3, p1, no bias), BatchNorm2d(c), ReLU,
 *                       Conv2d(c, c, 3, p1, no bias), BatchNorm2d(c), ReLU, MaxPool2d(2)]
 *            with c = 32, 64, 128: 1x28x28 -> 32x14x14 -> 64x7x7 -> 128x3x3
 *   3: Flatten, Linear(1152, 1024), ReLU, Dropout(0.5), Linear(1024, 10)
 * PyTorch's default initialisation everywhere.
 * Recipe: cross-entropy; SGD with momentum 0.9 (no dampening) and L2 weight decay 5e-4 on the
 * conv and Linear weights (none on biases and BatchNorm parameters, fastai's wd_bn_bias=False);
 * fit_one_cycle(lr_max 0.02, div 25, div_final 1e5, pct_start 0.25) with the momentum held at
 * 0.9 (moms 0.9/0.9/0.9); batch 64 per process.
 *
 * GFLOP/s counts 2 FLOPs per multiply-add of the six convolutions and two Linear layers, three
 * times per training step (forward, input gradient, weight gradient) less the first
 * convolution's input gradient, which is never computed; element-wise layers (BatchNorm, ReLU,
 * max-pool, dropout, biases, SGD) are not counted. */
#include "bench_common.h"

enum { VGG_N_BLOCKS = 3 };
static const int vgg_channels[VGG_N_BLOCKS] = {32, 64, 128};
#define VGG_HIDDEN 1024
#define VGG_LR_MAX 0.02
#define VGG_MOM 0.9
#define VGG_WD 5e-4

/* Exact FLOPs per image per training step of W2 (see the header comment). */
static double vgg_train_flop_per_image(void) {
    double fwd = 0, first = 0;
    int c_in = 1, side = 28;
    for (int b = 0; b < VGG_N_BLOCKS; b++) {
        int c = vgg_channels[b];
        double conv1 = 2.0 * c_in * c * 9 * side * side, conv2 = 2.0 * c * c * 9 * side * side;
        if (b == 0) first = conv1;
        fwd += conv1 + conv2;
        c_in = c;
        side /= 2; /* MaxPool2d(2) floors: 28 -> 14 -> 7 -> 3 */
    }
    int flat = c_in * side * side; /* 1152 */
    fwd += 2.0 * flat * VGG_HIDDEN + 2.0 * VGG_HIDDEN * 10;
    return 3 * fwd - first;
}

static cf_module *vgg_block(int c_in, int c) {
    cf_module *layers[] = {cf_conv2d(c_in, c, 3, 1, 1, false),
                           cf_batchnorm2d(c),
                           cf_relu(),
                           cf_conv2d(c, c, 3, 1, 1, false),
                           cf_batchnorm2d(c),
                           cf_relu(),
                           cf_maxpool2d(2, 2, 0)};
    return cf_sequential((int)(sizeof layers / sizeof *layers), layers);
}

/* The model of the header comment; NULL with cf_last_error when a constructor fails. */
static cf_module *vgg_model(int n_out) {
    cf_module *children[VGG_N_BLOCKS + 1];
    int c_in = 1, side = 28;
    for (int b = 0; b < VGG_N_BLOCKS; b++) {
        children[b] = vgg_block(c_in, vgg_channels[b]);
        c_in = vgg_channels[b];
        side /= 2;
    }
    cf_module *head[] = {cf_flatten(), cf_linear(c_in * side * side, VGG_HIDDEN, true), cf_relu(),
                         cf_dropout(0.5f), cf_linear(VGG_HIDDEN, n_out, true)};
    children[VGG_N_BLOCKS] = cf_sequential((int)(sizeof head / sizeof *head), head);
    return cf_sequential(VGG_N_BLOCKS + 1, children);
}

static cf_status vgg_learner(cf_learner **out, cf_dls *dls, uint64_t seed) {
    cf_module *root = vgg_model(10);
    if (!root) return CF_ERR_INVALID;
    cf_model *model = NULL;
    cf_status st = cf_model_new(&model, root, seed);
    if (st != CF_OK) return st;
    cf_opt_config sgd = cf_opt_sgd_defaults();
    sgd.hypers.mom = VGG_MOM; /* non-zero at creation, so that SGD keeps a momentum average */
    sgd.hypers.wd = VGG_WD;
    sgd.decouple_wd = false; /* L2 (g += wd*p), as torch.optim.SGD's weight_decay */
    cf_metric *metrics[] = {cf_accuracy()};
    return cf_learner_new(out, dls, model, .opt = sgd, .opt_set = true, .lr = VGG_LR_MAX,
                          .wd = VGG_WD, .metrics = metrics, .n_metrics = 1, .quiet = true,
                          .seed = seed, .path = "/tmp");
}

int main(int argc, char **argv) {
    static const double moms[3] = {VGG_MOM, VGG_MOM, VGG_MOM};
    const bench_workload vgg = {.prog = "bench_vgg",
                                .train_flop_per_image = vgg_train_flop_per_image(),
                                .lr_max = VGG_LR_MAX,
                                .moms = moms,
                                .make_learner = vgg_learner};
    return bench_main(argc, argv, &vgg);
}
