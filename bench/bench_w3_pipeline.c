/* W3's input pipeline alone: the loaders bench_images trains on (the photo folder streamed from
 * disk, RandomResizedCrop(128, min_scale 0.5), aug_transforms(), ImageNet normalisation, bs 64,
 * seed 42), their batches consumed without training. Prints, per training epoch, the CPU time
 * per image of the whole process (the loader's decoding thread: read, JPEG decode, crop and
 * resize, augmentation, normalisation) and a hash of every batch's pixels, then the validation
 * set's hash: the hashes are the check that a change to the pipeline kept its output bit for bit.
 *
 *   bench_w3_pipeline [--data DIR] [--epochs E (2)] [--threads N (1)]
 *
 * --data defaults to w3-images next to this program (bench/make_images.py writes it). */
#include <corefit.h>
#include "bench_path.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* FNV-1a over 64-bit words. */
static uint64_t hash_words(uint64_t h, const void *p, size_t bytes) {
    const unsigned char *c = p;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, c + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
    }
    return h;
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    static char data[4096];
    bench_beside_self("w3-images", data, sizeof data);
    const char *dir = data;
    int epochs = 2, threads = 1;
    for (int i = 1; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL; /* NULL: an option without its value */
        if (v && !strcmp(argv[i], "--data"))
            dir = v;
        else if (v && !strcmp(argv[i], "--epochs"))
            epochs = atoi(v);
        else if (v && !strcmp(argv[i], "--threads"))
            threads = atoi(v);
        else {
            fprintf(stderr, "usage: bench_w3_pipeline [--data DIR] [--epochs E] [--threads N]\n");
            return 2;
        }
    }
    if (epochs < 1 || threads < 1) {
        fprintf(stderr, "bench_w3_pipeline: need E >= 1, N >= 1\n");
        return 2;
    }
    cf_set_num_threads(threads); /* the loader decodes on as many threads */
    cf_aug_opts aug = cf_aug_transforms_defaults(1.0f);
    cf_item_tfm tfm = cf_random_resized_crop_tfm(128, 0.5f);
    cf_dls *dls = NULL;
    if (cf_dls_from_image_folder(
            dir, &(cf_image_folder_options){.channels = 3, .item_tfm = &tfm, .seed = 42},
            &(cf_dls_options){.bs = 64,
                              .seed = 42,
                              .n_norm = 3,
                              .mean = {0.485f, 0.456f, 0.406f},
                              .std = {0.229f, 0.224f, 0.225f},
                              .aug = &aug},
            &dls) != CF_OK) {
        fprintf(stderr, "bench_w3_pipeline: %s\n", cf_last_error());
        return 1;
    }
    const cf_batch *b;
    for (int e = 0; e < epochs; e++) {
        uint64_t h = 0xcbf29ce484222325ULL;
        long n = 0;
        double c0 = cpu_seconds(), t0 = cf_now();
        if (cf_dataloader_begin_epoch(dls->train, e) != CF_OK) {
            fprintf(stderr, "bench_w3_pipeline: %s\n", cf_last_error());
            return 1;
        }
        cf_status st;
        while ((st = cf_dataloader_next(dls->train, &b)) == CF_OK && b) {
            h = hash_words(h, b->x.data, cf_tensor_numel(&b->x) * sizeof(float));
            n += b->size;
        }
        if (st != CF_OK || n == 0) {
            fprintf(stderr, "bench_w3_pipeline: %s\n", st ? cf_last_error() : "no batches");
            return 1;
        }
        printf("train epoch %d: %ld images, %.3f CPU ms and %.3f wall ms per image, hash %016llx\n",
               e, n, (cpu_seconds() - c0) * 1e3 / (double)n, (cf_now() - t0) * 1e3 / (double)n,
               (unsigned long long)h);
    }
    uint64_t h = 0xcbf29ce484222325ULL;
    if (cf_dataloader_begin_epoch(dls->valid, 0) != CF_OK) return 1;
    cf_status st;
    while ((st = cf_dataloader_next(dls->valid, &b)) == CF_OK && b)
        h = hash_words(h, b->x.data, cf_tensor_numel(&b->x) * sizeof(float));
    if (st != CF_OK) { /* a hash of part of the set would not be the set's */
        fprintf(stderr, "bench_w3_pipeline: %s\n", cf_last_error());
        return 1;
    }
    printf("valid: hash %016llx\n", (unsigned long long)h);
    cf_dls_free(dls);
    return 0;
}
