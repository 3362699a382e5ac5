/* Trains W3, fastai's fine_tune of a resnet18 on a folder of photos (RGB JPEGs of assorted sizes,
 * bench/make_images.py), and prints the same JSON line as bench_w1 (bench_common.h: options,
 * what is measured, memory). W3 exercises what W1 and W2 do not: image decoding and resizing,
 * fastai's item and batch transforms, a 3-channel ImageNet-style network at 128 px and
 * discriminative learning rates over three parameter groups.
 *
 *   bench_images [--threads N | --cores N | --mpi] [--batches B | --epochs E] [--skip S]
 *                [--data DIR] [--seed S] [--load auto|memory|stream]
 *
 * --data defaults to w3-images next to this program (where bench/run.py writes it).
 *
 * Data (bench/images_torch.py does the same in PyTorch):
 *   ImageDataLoaders.from_folder(DIR, item_tfms=RandomResizedCrop(128, min_scale=0.5),
 *       batch_tfms=[*aug_transforms(), Normalize.from_stats(*imagenet_stats)], bs=64)
 *   with GrandparentSplitter's train/ and valid/ folders; the images are decoded up front or
 *   streamed from disk as cf_image_load's AUTO decides (--load overrides).
 * Model: vision_learner(dls, resnet18, pretrained=False): torchvision's resnet18 cut before its
 *   pooling (create_body, cut -2) with fastai's create_head(512, 10) (concat pool, BatchNorm,
 *   Dropout 0.25, Linear(1024, 512), ReLU, BatchNorm, Dropout 0.5, Linear(512, 10)), the three
 *   parameter groups of fastai's _resnet_split. Random weights stand in for pretrained ones:
 *   torchvision's initialisation in the body, kaiming_normal in the head.
 * Recipe: fastai's Adam (wd 0.01, none on BatchNorm) and fine_tune(E, base_lr 2e-3): freeze,
 *   fit_one_cycle(1, slice(2e-3), pct_start 0.99), unfreeze, fit_one_cycle(E,
 *   slice(1e-5, 1e-3), pct_start 0.3, div 5). --epochs E runs all of it and reports the
 *   validation accuracy; --batches B times B steps of the unfrozen phase alone (its schedule
 *   over the epochs the B steps need), which is where a fine_tune spends its time.
 *
 * GFLOP/s counts 2 FLOPs per multiply-add of the 20 convolutions and the two Linear layers,
 * three times per unfrozen training step (forward, input gradient, weight gradient) less the
 * stem's input gradient, which is never computed; element-wise layers (BatchNorm, ReLU, pools,
 * the residual adds, Adam) and the data pipeline are not counted. */
#include "bench_common.h"
#include "bench_path.h"

#define W3_SIZE 128
#define W3_MIN_SCALE 0.5f
#define W3_BASE_LR 2e-3

static cf_image_load w3_load = CF_IMAGE_LOAD_AUTO;

/* Exact FLOPs per image per unfrozen training step of W3 at W3_SIZE (see the header comment). */
static double w3_train_flop_per_image(void) {
    int side = (W3_SIZE + 1) / 2; /* conv1, stride 2 */
    double stem = 2.0 * 3 * 64 * 7 * 7 * side * side;
    double fwd = stem;
    side = (side + 1) / 2; /* maxpool 3, stride 2, pad 1 */
    int c_in = 64;
    for (int stage = 0; stage < 4; stage++) {
        int c = 64 << stage;
        for (int block = 0; block < 2; block++) {
            bool down = stage > 0 && block == 0;
            int out = down ? (side + 1) / 2 : side;
            fwd += 2.0 * c_in * c * 9 * out * out + 2.0 * c * c * 9 * out * out;
            if (down) fwd += 2.0 * c_in * c * out * out; /* the 1x1 downsample */
            side = out;
            c_in = c;
        }
    }
    fwd += 2.0 * 1024 * 512 + 2.0 * 512 * 10; /* the head's Linear layers (no bias) */
    return 3 * fwd - stem;
}

static cf_status w3_dls(cf_dls **out, const char *data, int bs, uint64_t seed) {
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f); /* the loader keeps a copy */
    cf_item_tfm tfm = cf_random_resized_crop_tfm(W3_SIZE, W3_MIN_SCALE);
    /* random weights stand in for pretrained ones, so the input is prepared as a pretrained
     * model's: ImageNet's statistics, as vision_learner adds them */
    cf_status st = cf_dls_from_image_folder(
        data,
        &(cf_image_folder_options){.channels = 3, .item_tfm = &tfm, .seed = seed, .load = w3_load},
        &(cf_dls_options){.bs = bs,
                          .seed = seed,
                          .n_norm = 3,
                          .mean = {0.485f, 0.456f, 0.406f},
                          .std = {0.229f, 0.224f, 0.225f},
                          .aug = &aug},
        out);
    if (st != CF_OK && access(data, F_OK) != 0)
        fprintf(stderr,
                "bench_images: make the folder with /usr/bin/python3 bench/make_images.py "
                "--out %s\n",
                data);
    return st;
}

static cf_status w3_learner(cf_learner **out, cf_dls *dls, uint64_t seed) {
    cf_metric *metrics[] = {cf_accuracy()};
    return cf_vision_learner(out, dls, CF_ARCH_RESNET18, .metrics = metrics, .n_metrics = 1,
                             .quiet = true, .seed = seed, .path = "/tmp");
}

static cf_status w3_fit(cf_learner *learn, int epochs, bool timing, cf_callback **cbs, int n_cbs,
                        const cf_par_opts *par) {
    if (!timing)
        return par ? cf_par_fine_tune(learn, epochs, .base_lr = W3_BASE_LR, .freeze_epochs = 1,
                                      .cbs = cbs, .n_cbs = n_cbs, .par = *par)
                   : cf_fine_tune(learn, epochs, .base_lr = W3_BASE_LR, .freeze_epochs = 1,
                                  .cbs = cbs, .n_cbs = n_cbs);
    /* fine_tune's unfrozen phase: base_lr halved, slice(base_lr / lr_mult, base_lr) */
    cf_status st = cf_learner_unfreeze(learn);
    if (st != CF_OK) return st;
    const double lr = W3_BASE_LR / 2;
    const cf_lr lrs = CF_SLICE2(lr / 100, lr);
    return par ? cf_par_fit_one_cycle(learn, epochs, .lr_max = lrs, .pct_start = 0.3, .div = 5,
                                      .cbs = cbs, .n_cbs = n_cbs, .par = *par)
               : cf_fit_one_cycle(learn, epochs, .lr_max = lrs, .pct_start = 0.3, .div = 5,
                                  .cbs = cbs, .n_cbs = n_cbs);
}

static int w3_parse_opt(const char *name, const char *value) {
    if (strcmp(name, "--load") != 0) return 0;
    if (!strcmp(value, "auto"))
        w3_load = CF_IMAGE_LOAD_AUTO;
    else if (!strcmp(value, "memory"))
        w3_load = CF_IMAGE_LOAD_MEMORY;
    else if (!strcmp(value, "stream"))
        w3_load = CF_IMAGE_LOAD_STREAM;
    else {
        fprintf(stderr, "bench_images: --load %s: auto, memory or stream\n", value);
        return -1;
    }
    return 1;
}

static void w3_json(FILE *f, const cf_dls *dls) {
    fprintf(f,
            "\"load\": \"%s\", \"n_train\": %lld, \"n_valid\": %lld, \"image_size\": %d, "
            "\"acc_set\": \"valid\", ",
            cf_dataset_is_streamed(dls->train_ds) ? "stream" : "memory",
            (long long)dls->train_ds->n, (long long)dls->valid_ds->n, W3_SIZE);
}

int main(int argc, char **argv) {
    /* the folder run.py makes: BUILD/w3-images beside BUILD/bench_images */
    static char data[4096];
    bench_beside_self("w3-images", data, sizeof data);
    const bench_workload w3 = {.prog = "bench_images",
                               .train_flop_per_image = w3_train_flop_per_image(),
                               .lr_max = W3_BASE_LR / 2,
                               .make_learner = w3_learner,
                               .default_data = data,
                               .make_dls = w3_dls,
                               .fit = w3_fit,
                               .parse_opt = w3_parse_opt,
                               .usage_extra = "[--load auto|memory|stream]",
                               .json_extra = w3_json};
    return bench_main(argc, argv, &w3);
}
