/* corefit's side of the segmentation row of bench/tasks.py: fastai's unet_learner (DynamicUnet
 * on a resnet body, CrossEntropyLossFlat(axis=1)) trained with fit_one_cycle on the scenes that
 * `corefit fmnist-tasks segmentation` writes, then validated: one JSON line with valid_loss,
 * foreground_acc (background code 0) and dice_multi. PyTorch's side: bench/tasks_torch.py
 * segmentation.
 *
 *   bench_seg --data DIR [--arch resnet18] [--epochs E] [--lr X] [--bs B] [--seed S]
 *             [--threads N]
 *
 * DIR holds train/ and valid/, each as fmnist-tasks writes it (images/NNNNN.png,
 * labels/NNNNN_P.png, codes.txt); the images are read in grayscale at their own size and normalised
 * by the training images' mean and std. */
#include "corefit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One fmnist-tasks folder as a data set (all of it; valid_pct 0). */
static cf_status load_split(const char *data, const char *part, char **codes, int n_codes,
                            cf_dataset **out) {
    char images[4096], labels[4096];
    snprintf(images, sizeof images, "%s/%s/images", data, part);
    snprintf(labels, sizeof labels, "%s/%s/labels", data, part);
    cf_mask_rule rule = {.dir = labels, .suffix = "_P", .ext = NULL};
    cf_image_folder_options o = {.channels = 1, .valid_pct = 0, .seed = 42};
    cf_dataset *none = NULL;
    cf_status st =
        cf_datasets_from_masks(images, &rule, (const char *const *)codes, n_codes, &o, out, &none);
    cf_dataset_free(none);
    return st;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_seg: %s: %s\n", what, cf_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *data = NULL, *arch = "resnet18";
    int epochs = 5, bs = 16, threads = 1;
    double lr = 1e-3;
    unsigned long long seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_seg: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--arch"))
            arch = v;
        else if (!strcmp(a, "--epochs"))
            epochs = atoi(v);
        else if (!strcmp(a, "--lr"))
            lr = atof(v);
        else if (!strcmp(a, "--bs"))
            bs = atoi(v);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else {
            fprintf(stderr,
                    "usage: bench_seg --data DIR [--arch resnet18] [--epochs E] [--lr X] [--bs B] "
                    "[--seed S] [--threads N]\n");
            return 2;
        }
        i++;
    }
    if (!data || epochs < 1 || bs < 1 || threads < 1 || !(lr > 0)) {
        fprintf(stderr, "bench_seg: --data DIR is needed; epochs, bs, threads and lr positive\n");
        return 2;
    }
    cf_set_num_threads(threads);
    double t0 = now_s();
    char path[4096];
    snprintf(path, sizeof path, "%s/train/codes.txt", data);
    char **codes = NULL;
    int n_codes = 0;
    if (cf_codes_read(path, &codes, &n_codes)) return fail(path);
    cf_dataset *train = NULL, *valid = NULL;
    if (load_split(data, "train", codes, n_codes, &train) ||
        load_split(data, "valid", codes, n_codes, &valid)) {
        cf_dataset_free(train);
        cf_codes_free(codes, n_codes);
        return fail("reading the scenes");
    }
    const int64_t n_train = train->n, n_valid = valid->n;
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = bs, .seed = seed, .normalize = true};
    if (cf_dls_new(train, valid, &o, &dls)) {
        cf_codes_free(codes, n_codes);
        return fail("DataLoaders");
    }
    cf_metric *metrics[] = {cf_foreground_acc(0), cf_dice_multi(n_codes)};
    cf_learner *learn = NULL;
    if (cf_unet_learner(&learn, dls, arch, .metrics = metrics, .n_metrics = 2, .quiet = true,
                        .seed = seed)) {
        cf_dls_free(dls);
        cf_codes_free(codes, n_codes);
        return fail("unet_learner");
    }
    double v[3] = {0};
    int rc = 0;
    if (cf_fit_one_cycle(learn, epochs, .lr_max = CF_LR(lr)) || cf_validate(learn, v))
        rc = fail("fit");
    else
        printf(
            "{\"impl\": \"corefit\", \"task\": \"segmentation\", \"arch\": \"%s\", \"seed\": %llu, "
            "\"epochs\": %d, \"lr\": %g, \"bs\": %d, \"n_train\": %lld, \"n_valid\": %lld, "
            "\"valid_loss\": %.6f, \"foreground_acc\": %.6f, \"dice_multi\": %.6f, "
            "\"seconds\": %.2f}\n",
            arch, seed, epochs, lr, bs, (long long)n_train, (long long)n_valid, v[0], v[1], v[2],
            now_s() - t0);
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_codes_free(codes, n_codes);
    return rc;
}
