/* Trains the W1 workload (mini-resnet on Fashion-MNIST, fastai's Adam,
 * fit_one_cycle lr_max 3e-3, batch 64 per process) and prints one JSON line: training images/s,
 * achieved GFLOP/s, test accuracy (epoch runs), peak memory of the whole run.
 *
 *   bench_w1 [--threads N | --cores N | --mpi] [--batches B | --epochs E] [--skip S]
 *            [--data DIR] [--seed S] [--checkpoint-every K]
 *
 * The options, what is measured and the JSON line are bench_common.h's (shared with the other
 * workloads).
 *
 * GFLOP/s counts 2 FLOPs per multiply-add of the convolutions and linear layers, three times per
 * training step (forward, input gradient, weight gradient) less the stem's input gradient, which
 * is never computed; element-wise layers are not counted. */
#include "bench_common.h"

/* Exact FLOPs per image per training step of W1 (see the header comment). */
static double w1_train_flop_per_image(void) {
    static const int convs[][5] = {/* c_in, c_out, k, h_out, w_out */
                                   {1, 16, 3, 28, 28},  {16, 32, 3, 14, 14}, {32, 32, 3, 14, 14},
                                   {16, 32, 1, 14, 14}, {32, 64, 3, 7, 7},   {64, 64, 3, 7, 7},
                                   {32, 64, 1, 7, 7}};
    double fwd = 0, stem = 0;
    for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) {
        const int *c = convs[i];
        double f = 2.0 * c[0] * c[1] * c[2] * c[2] * c[3] * c[4];
        if (i == 0) stem = f;
        fwd += f;
    }
    fwd += 2.0 * 128 * 256 + 2.0 * 256 * 10;
    return 3 * fwd - stem;
}

/* fastai's vision_learner with the mini-resnet and its default Adam. */
static cf_status w1_learner(cf_learner **out, cf_dls *dls, uint64_t seed) {
    cf_metric *metrics[] = {cf_accuracy()};
    return cf_vision_learner(out, dls, CF_ARCH_MINI_RESNET, .metrics = metrics, .n_metrics = 1,
                             .quiet = true, .seed = seed, .path = "/tmp");
}

int main(int argc, char **argv) {
    const bench_workload w1 = {.prog = "bench_w1",
                               .train_flop_per_image = w1_train_flop_per_image(),
                               .lr_max = 3e-3,
                               .make_learner = w1_learner};
    return bench_main(argc, argv, &w1);
}
