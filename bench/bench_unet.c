/* Trains W5, fastai's unet_learner on a resnet18 body (DynamicUnet) over segmentation scenes
 * made from Fashion-MNIST garments, and prints the same JSON line as bench_w1 (bench_common.h:
 * options, what is measured, memory). W5 exercises what W1-W3 do not: the U-Net decoder
 * (PixelShuffle_ICNR upsampling, skip concatenations, nearest resizes, the final ResBlock at
 * full resolution) and CrossEntropyLossFlat over every pixel.
 *
 *   bench_unet [--threads N | --cores N | --mpi] [--batches B | --epochs E] [--skip S]
 *              [--data DIR] [--seed S]
 *
 * --data defaults to w5-seg next to this program, where bench/run.py writes it with
 * `corefit fmnist-tasks segmentation DIR --n 1000 --size 64` (1000 scenes of 64 x 64: 1-3
 * garments on a blank canvas, masks labels/<stem>_P.png, 11 codes).
 *
 * Data (bench/unet_torch.py does the same in PyTorch):
 *   SegmentationDataLoaders.from_label_func(DIR/images, label_func=lambda o:
 *       DIR/'labels'/f'{o.stem}_P{o.suffix}', codes, valid_pct=0.2, seed=S, bs=16)
 *   the PNGs decoded up front as RGB (fastai's PILImage), ImageNet's normalisation (what
 *   unet_learner adds for a pretrained body), no augmentation.
 * Model: unet_learner(dls, resnet18, pretrained=False): fastai's DynamicUnet(create_body(resnet18),
 *   n_out=11, (64, 64)) with its defaults (blur False, self_attention False, last_cross True,
 *   norm_type None in the decoder), torchvision's initialisation in the body, fastai's in the
 *   decoder; three parameter groups (encoder[:6], encoder[6:], decoder), nothing frozen.
 * Recipe: CrossEntropyLossFlat(axis=1); fastai's Adam (wd 0.01, none on BatchNorm parameters
 *   and biases); fit_one_cycle(lr_max 1e-3, moms 0.95/0.85/0.95); bs 16 per process.
 *   --epochs E reports DiceMulti on the validation scenes in test_acc.
 *
 * GFLOP/s counts 2 FLOPs per multiply-add of every convolution (encoder, middle, the UnetBlocks'
 * PixelShuffle 1x1 and 3x3 convolutions, the final PixelShuffle_ICNR, ResBlock and 1x1 output
 * convolution), three times per training step (forward, input gradient, weight gradient) less the
 * stem's input gradient, which is never computed; element-wise layers (BatchNorm, ReLU, shuffles,
 * concatenations, resizes, the loss, Adam) are not counted. */
#include "bench_common.h"
#include "bench_path.h"

#define W5_SIZE 64 /* the scenes' side (a multiple of 32) */
#define W5_BS 16
#define W5_LR 1e-3
#define W5_CODES 11 /* background and the ten garments */

static double conv_flop(int ci, int co, int k, int side) {
    return 2.0 * ci * co * k * k * side * side;
}

/* Exact FLOPs per image per training step of W5 at W5_SIZE (see the header comment). */
static double w5_train_flop_per_image(void) {
    const int s = W5_SIZE, n_in = 3;
    const double stem = conv_flop(n_in, 64, 7, s / 2);
    double fwd = stem;
    int side = s / 4, c_in = 64; /* after the max-pool */
    for (int stage = 0; stage < 4; stage++) {
        const int c = 64 << stage;
        for (int block = 0; block < 2; block++) {
            const bool down = stage > 0 && block == 0;
            const int out = down ? side / 2 : side;
            fwd += conv_flop(c_in, c, 3, out) + conv_flop(c, c, 3, out);
            if (down) fwd += conv_flop(c_in, c, 1, out);
            side = out;
            c_in = c;
        }
    }
    /* middle: ConvLayer(512, 1024), ConvLayer(1024, 512) at s/32 */
    fwd += conv_flop(512, 1024, 3, side) + conv_flop(1024, 512, 3, side);
    /* UnetBlocks, deepest first: skips layer3 (256 @ s/16), layer2 (128 @ s/8), layer1 (64 @
     * s/4), relu (64 @ s/2) */
    const int skip_c[4] = {256, 128, 64, 64};
    int c = 512;
    for (int k = 0; k < 4; k++) {
        fwd += conv_flop(c, c / 2 * 4, 1, side); /* PixelShuffle_ICNR's 1x1 conv */
        side *= 2;
        const int ni = c / 2 + skip_c[k], nf = k < 3 ? ni : ni / 2;
        fwd += conv_flop(ni, nf, 3, side) + conv_flop(nf, nf, 3, side);
        c = nf;
    }
    fwd += conv_flop(c, 4 * c, 1, side); /* the final PixelShuffle_ICNR(c) to s */
    side *= 2;
    c += n_in;                              /* MergeLayer(dense) */
    fwd += 2 * conv_flop(c, c, 3, side);    /* ResBlock(1, c, c) */
    fwd += conv_flop(c, W5_CODES, 1, side); /* the output ConvLayer */
    return 3 * fwd - stem;
}

static cf_status w5_dls(cf_dls **out, const char *data, int bs, uint64_t seed) {
    char images[4096], labels[4096], codes_path[4096];
    snprintf(images, sizeof images, "%s/images", data);
    snprintf(labels, sizeof labels, "%s/labels", data);
    snprintf(codes_path, sizeof codes_path, "%s/codes.txt", data);
    char **codes = NULL;
    int n_codes = 0;
    cf_status st = cf_codes_read(codes_path, &codes, &n_codes);
    if (st != CF_OK) {
        fprintf(stderr,
                "bench_unet: make the scenes with corefit fmnist-tasks segmentation %s --n 1000 "
                "--size %d\n",
                data, W5_SIZE);
        return st;
    }
    const cf_mask_rule rule = {labels, "_P", NULL};
    cf_dataset *train = NULL, *valid = NULL;
    st = cf_datasets_from_masks(
        images, &rule, (const char *const *)codes, n_codes,
        &(cf_image_folder_options){.channels = 3, .valid_pct = 0.2, .seed = seed}, &train, &valid);
    cf_codes_free(codes, n_codes);
    if (st != CF_OK) return st;
    /* random weights stand in for pretrained ones: ImageNet's statistics, as unet_learner adds */
    return cf_dls_new(train, valid,
                      &(cf_dls_options){.bs = bs,
                                        .seed = seed,
                                        .n_norm = 3,
                                        .mean = {0.485f, 0.456f, 0.406f},
                                        .std = {0.229f, 0.224f, 0.225f}},
                      out);
}

static cf_status w5_learner(cf_learner **out, cf_dls *dls, uint64_t seed) {
    cf_metric *metrics[] = {cf_dice_multi(W5_CODES)};
    return cf_unet_learner(out, dls, "resnet18", .metrics = metrics, .n_metrics = 1, .quiet = true,
                           .seed = seed, .path = "/tmp");
}

static void w5_json(FILE *f, const cf_dls *dls) {
    fprintf(f,
            "\"n_train\": %lld, \"n_valid\": %lld, \"image_size\": %d, \"acc_set\": \"valid\", "
            "\"metric\": \"dice_multi\", ",
            (long long)dls->train_ds->n, (long long)dls->valid_ds->n, W5_SIZE);
}

int main(int argc, char **argv) {
    /* the folder run.py makes: BUILD/w5-seg beside BUILD/bench_unet */
    static char data[4096];
    bench_beside_self("w5-seg", data, sizeof data);
    const bench_workload w5 = {.prog = "bench_unet",
                               .train_flop_per_image = w5_train_flop_per_image(),
                               .lr_max = W5_LR,
                               .make_learner = w5_learner,
                               .default_data = data,
                               .make_dls = w5_dls,
                               .json_extra = w5_json,
                               .bs = W5_BS};
    return bench_main(argc, argv, &w5);
}
