/* Fine-tuning a saved model on a folder of images, the fastai way: the saved model's body is
 * loaded and frozen (vision_learner's pretrained), then fine_tune trains the new head for a
 * frozen epoch and the whole model after, on every core.
 *
 *   example_fine_tune PRETRAINED.safetensors IMAGE_DIR [OUT_DIR] [EPOCHS]
 *
 * IMAGE_DIR holds train/CLASS/NAME.png and valid/CLASS/NAME.png (fastai's GrandparentSplitter).
 * The images are read with as many channels and resized to the size the pretrained model was
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

    /* What the pretrained model expects. */
    int channels = 1, size = 28;
    cf_st_file *file = NULL;
    CHECK(cf_st_read(pretrained, &file));
    const char *n_in = cf_st_meta(file, "corefit.n_in"),
               *hw = cf_st_meta(file, "corefit.image_size");
    if (n_in) channels = atoi(n_in);
    if (hw) size = atoi(hw);
    cf_st_free(file);

    /* ImageDataLoaders.from_folder: the statistics of the new images normalise them. */
    cf_dls *dls = NULL;
    CHECK(cf_dls_from_image_folder(
        images, &(cf_image_folder_options){.size = size, .channels = channels},
        &(cf_dls_options){.bs = 8, .seed = 42, .normalize = true}, &dls));
    printf("%lld training and %lld validation images of %d classes\n", (long long)dls->train_ds->n,
           (long long)dls->valid_ds->n, dls->train_ds->n_classes);

    /* vision_learner with the saved body (frozen) and a new head for these classes. */
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    CHECK(cf_vision_learner(&learn, dls, CF_ARCH_MINI_RESNET, .metrics = metrics, .n_metrics = 1,
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
    CHECK(cf_get_preds(learn, &p));
    for (int k = 1; k < p.preds.shape.dim[1]; k++)
        if (p.preds.data[k] > p.preds.data[cls]) cls = k;
    printf("first validation image: %s (%.3f), actually %s\n", v->vocab[cls], p.preds.data[cls],
           v->vocab[(int)v->y[0]]);
    cf_preds_free(&p);

    char path[1024];
    snprintf(path, sizeof path, "%s/fine_tuned.safetensors", out);
    CHECK(cf_learner_export(learn, path));
    printf("wrote %s\n", path);
    cf_learner_free(learn);
    cf_dls_free(dls);
    return 0;
}
