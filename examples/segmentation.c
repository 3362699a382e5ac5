/* Segmentation the fastai way: SegmentationDataLoaders.from_label_func (images in a folder,
 * each mask found from its image's name, the codes from codes.txt), unet_learner, fine_tune on
 * every core, then show_results with the masks overlaid and one image's decoded mask.
 *
 *   example_segmentation DATA_DIR [OUT_DIR] [EPOCHS]
 *
 * DATA_DIR holds images/, labels/<stem>_P.png and codes.txt (fastai's CamVid layout), e.g. as
 * written by `corefit fmnist-tasks segmentation DATA_DIR`.
 */
#include <corefit.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cf_status st_ = (call);                                                                    \
        if (st_ != CF_OK) {                                                                        \
            fprintf(stderr, "error: %s\n", cf_last_error());                                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR [OUT_DIR] [EPOCHS]\n", argv[0]);
        return 2;
    }
    const char *data = argv[1], *out = argc > 2 ? argv[2] : ".";
    int epochs = argc > 3 ? atoi(argv[3]) : 1;
    char path[1024], images[1024], labels[1024];
    mkdir(out, 0777);

    /* codes = np.loadtxt(path/'codes.txt', dtype=str) */
    char **codes = NULL;
    int n_codes = 0;
    snprintf(path, sizeof path, "%s/codes.txt", data);
    CHECK(cf_codes_read(path, &codes, &n_codes));

    /* label_func = lambda o: path/'labels'/f'{o.stem}_P{o.suffix}'; valid_pct 0.2 */
    snprintf(images, sizeof images, "%s/images", data);
    snprintf(labels, sizeof labels, "%s/labels", data);
    cf_mask_rule rule = {.dir = labels, .suffix = "_P"};
    cf_image_folder_options io = {.channels = 3, .valid_pct = 0.2, .seed = 42};
    cf_dataset *train = NULL, *valid = NULL;
    CHECK(cf_datasets_from_masks(images, &rule, (const char *const *)codes, n_codes, &io, &train,
                                 &valid));
    printf("%lld training and %lld validation images, %d codes\n", (long long)train->n,
           (long long)valid->n, n_codes);
    cf_codes_free(codes, n_codes);

    /* DataLoaders with the images' own statistics, bs 8 per core */
    cf_dls_options dopt = {.bs = 8, .seed = 42, .n_norm = 3};
    CHECK(cf_dataset_channel_stats(train, dopt.mean, dopt.std));
    cf_dls *dls = NULL;
    CHECK(cf_dls_new(train, valid, &dopt, &dls));

    /* unet_learner(dls, resnet18, metrics=[foreground_acc, DiceMulti()]) */
    cf_metric *metrics[] = {cf_foreground_acc(0), cf_dice_multi(train->n_classes)};
    cf_learner *learn = NULL;
    CHECK(cf_unet_learner(&learn, dls, "resnet18", .metrics = metrics, .n_metrics = 2, .seed = 42));

    /* learn.fine_tune(epochs) on every core (one frozen epoch first) */
    CHECK(cf_par_fine_tune(learn, epochs, .base_lr = 2e-3));
    printf("valid_loss %.4f, foreground_acc %.4f, dice_multi %.4f\n", learn->final_record[0],
           learn->final_record[1], learn->final_record[2]);

    /* learn.show_results(): targets and predicted masks over the validation images */
    cf_preds p = {0};
    CHECK(cf_par_get_preds(learn, &p, .with_input = true));
    snprintf(path, sizeof path, "%s/show_results.png", out);
    int shown = p.n < 4 ? (int)p.n : 4;
    if (shown > 0 && cf_show_results_masks(&p, shown, n_codes, path) == CF_OK)
        printf("wrote %s\n", path);

    /* the first validation image's decoded mask: the class of every pixel */
    const int h = valid->sample_shape.dim[1], w = valid->sample_shape.dim[2];
    int64_t *pixels = calloc((size_t)n_codes, sizeof *pixels);
    for (int q = 0; pixels && p.n > 0 && q < h * w; q++) {
        int best = 0;
        for (int c = 1; c < n_codes; c++)
            if (p.preds.data[(size_t)c * h * w + q] > p.preds.data[(size_t)best * h * w + q])
                best = c;
        pixels[best]++;
    }
    printf("first validation image:");
    for (int c = 0; pixels && c < n_codes; c++)
        if (pixels[c] > 0)
            printf(" %s %.1f%%", dls->train_ds->vocab[c], 100.0 * pixels[c] / (h * w));
    printf("\n");
    free(pixels);
    cf_preds_free(&p);

    snprintf(path, sizeof path, "%s/unet.safetensors", out);
    CHECK(cf_learner_export(learn, path));
    printf("wrote %s\n", path);
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}
