/* Fine-tuning a pretrained model on a folder of images, the fastai way: the pretrained body is
 * loaded and frozen (vision_learner's pretrained), then fine_tune trains the new head for a
 * frozen epoch and the whole model after, on every core, with aug_transforms() on the training
 * images; then the figures (show_batch, show_results, the confusion matrix) and most_confused,
 * and the export that example_predict loads.
 *
 *   example_fine_tune PRETRAINED.safetensors IMAGE_DIR [OUT_DIR] [EPOCHS]
 *
 * PRETRAINED is a model corefit exported, or torchvision's / timm's ImageNet ResNet-18, 34 or
 * 50 as safetensors (tools/convert_pth.py converts a torchvision .pth): then the model is
 * fastai's resnet with a new head, the images are RGB, cut to squares of COREFIT_EXAMPLE_SIZE
 * pixels (224) by Resize's crop, and ImageNet's statistics normalise them.
 * IMAGE_DIR holds train/CLASS/NAME.png and valid/CLASS/NAME.png (fastai's GrandparentSplitter).
 * For a corefit model the images are read with as many channels and resized to the size it was
 * trained on (its corefit.n_in and corefit.image_size metadata; 1 and 28 when it has none).
 * COREFIT_EXAMPLE_CORES=N sets the worker processes (default: every core). */
#include <corefit.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    if (argc < 3) {
        fprintf(stderr, "usage: %s PRETRAINED.safetensors IMAGE_DIR [OUT_DIR] [EPOCHS]\n", argv[0]);
        return 2;
    }
    const char *pretrained = argv[1], *images = argv[2], *out = argc > 3 ? argv[3] : ".";
    int epochs = argc > 4 ? atoi(argv[4]) : 1;
    const char *cores = getenv("COREFIT_EXAMPLE_CORES");
    if (mkdir(out, 0777) != 0 && errno != EEXIST) { /* the model goes here */
        fprintf(stderr, "error: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }

    /* What the pretrained model expects: a corefit export says so in its metadata; a
     * torchvision/timm ResNet is told apart by its tensors. */
    int channels = 1, size = 28;
    cf_arch arch = CF_ARCH_MINI_RESNET;
    cf_st_file *file = NULL;
    CHECK(cf_st_read(pretrained, &file));
    const char *n_in = cf_st_meta(file, "corefit.n_in"),
               *hw = cf_st_meta(file, "corefit.image_size");
    if (n_in) channels = atoi(n_in);
    if (hw) size = atoi(hw);
    if (!cf_st_meta(file, "corefit.arch") && cf_st_find(file, "conv1.weight")) {
        arch = cf_st_find(file, "layer1.0.conv3.weight")   ? CF_ARCH_RESNET50
               : cf_st_find(file, "layer3.5.conv1.weight") ? CF_ARCH_RESNET34
                                                           : CF_ARCH_RESNET18;
        const char *sz = getenv("COREFIT_EXAMPLE_SIZE");
        channels = 3;
        size = sz ? atoi(sz) : 224;
        printf("torchvision %s weights, images at %d px\n", cf_arch_name(arch), size);
    }
    cf_st_free(file);

    /* ImageDataLoaders.from_folder(..., batch_tfms=aug_transforms()): the statistics of the new
     * images normalise them (a pretrained resnet gets ImageNet's from vision_learner). */
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_item_tfm resize = cf_resize_tfm(size, CF_RESIZE_CROP); /* item_tfms=Resize(size) */
    cf_dls *dls = NULL;
    CHECK(cf_dls_from_image_folder(
        images,
        &(cf_image_folder_options){.size = size,
                                   .channels = channels,
                                   .item_tfm = arch == CF_ARCH_MINI_RESNET ? NULL : &resize,
                                   .seed = 42},
        &(cf_dls_options){
            .bs = 8, .seed = 42, .normalize = arch == CF_ARCH_MINI_RESNET, .aug = &aug},
        &dls));
    printf("%lld training and %lld validation images of %d classes\n", (long long)dls->train_ds->n,
           (long long)dls->valid_ds->n, dls->train_ds->n_classes);

    /* vision_learner with the saved body (frozen) and a new head for these classes. */
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    CHECK(cf_vision_learner(&learn, dls, arch, .metrics = metrics, .n_metrics = 1,
                            .pretrained = pretrained, .seed = 42));

    /* fine_tune on every core: one frozen epoch, then `epochs` unfrozen. */
    CHECK(cf_par_fine_tune(learn, epochs, .base_lr = 2e-3, .freeze_epochs = 1,
                           .par.num_cores = cores ? atoi(cores) : 0));
    double values[2];
    CHECK(cf_validate(learn, values));
    printf("fine-tuned: valid_loss %.4f, accuracy %.4f\n", values[0], values[1]);

    /* get_preds on the validation set: the first image's class with its name. */
    int cls = 0;
    const cf_dataset *v = dls->valid_ds;
    cf_preds p = {0};
    CHECK(cf_get_preds(learn, &p, .with_input = true));
    for (int k = 1; k < p.preds.shape.dim[1]; k++)
        if (p.preds.data[k] > p.preds.data[cls]) cls = k;
    printf("first validation image: %s (%.3f), actually %s\n", v->vocab[cls], p.preds.data[cls],
           v->vocab[(int)v->y[0]]);

    /* ClassificationInterpretation: the pairs most often confused, and the figures */
    char path[1024];
    int nc = v->n_classes;
    int64_t *counts = calloc((size_t)nc * nc, sizeof *counts);
    cf_confused_pair pairs[5];
    if (!counts) return 1;
    CHECK(cf_confusion_from_preds(&p, nc, counts));
    int64_t n_pairs = cf_most_confused(counts, nc, 1, pairs, 5);
    printf("most confused:%s\n", n_pairs ? "" : " none");
    for (int64_t i = 0; i < n_pairs && i < 5; i++)
        printf("  %s predicted as %s: %lld\n", v->vocab[pairs[i].actual],
               v->vocab[pairs[i].predicted], (long long)pairs[i].count);
    if (cf_plot_available()) {
        const cf_batch *b = NULL; /* show_batch: a training batch as the model sees it */
        CHECK(cf_dataloader_begin_epoch(dls->train, 0));
        CHECK(cf_dataloader_next(dls->train, &b));
        snprintf(path, sizeof path, "%s/show_batch.png", out);
        if (b) CHECK(cf_show_batch(b, b->size < 9 ? b->size : 9, dls->train_ds->vocab, path));
        while (b) CHECK(cf_dataloader_next(dls->train, &b)); /* end the epoch */
        snprintf(path, sizeof path, "%s/show_results.png", out);
        CHECK(cf_show_results(&p, p.n < 9 ? (int)p.n : 9, v->vocab, path));
        snprintf(path, sizeof path, "%s/confusion.png", out);
        CHECK(cf_plot_confusion_matrix(counts, nc, v->vocab, path, false));
        printf("figures: show_batch.png, show_results.png, confusion.png in %s\n", out);
    }
    free(counts);
    cf_preds_free(&p);

    snprintf(path, sizeof path, "%s/fine_tuned.safetensors", out);
    CHECK(cf_learner_export(learn, path));
    printf("wrote %s\n", path);
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}
