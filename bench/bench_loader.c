/* Loader throughput on the W1 input pipeline: Fashion-MNIST training set, bs 64, shuffled,
 * drop_last, random crop after 2-pixel zero padding, horizontal flip, normalisation
 * (0.2860, 0.3530). The process is pinned to one core; batches are consumed without work, so
 * the figure is what the loader alone can feed. Prints batches/s and images/s, best of the
 * epochs, for the prefetch thread and for synchronous batches.
 *   bench_loader [fashion-mnist dir] [epochs (3)] */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "corefit/data.h"

#ifndef CF_FASHION_MNIST_DEFAULT_DIR
#define CF_FASHION_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#endif

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : CF_FASHION_MNIST_DEFAULT_DIR;
    int epochs = argc > 2 ? atoi(argv[2]) : 3;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int first = 0;
        while (first < CPU_SETSIZE && !CPU_ISSET(first, &set)) first++;
        CPU_ZERO(&set);
        CPU_SET(first, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
    }
    char ti[1024], tl[1024];
    snprintf(ti, sizeof ti, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(tl, sizeof tl, "%s/train-labels-idx1-ubyte.gz", dir);
    double t0 = cf_now();
    cf_dataset *ds;
    if (cf_dataset_from_idx(ti, tl, &ds) != CF_OK) {
        fprintf(stderr, "bench_loader: %s\n", cf_last_error());
        return 1;
    }
    printf("loaded %lld images in %.2f s\n", (long long)ds->n, cf_now() - t0);
    for (int mode = 0; mode < 2; mode++) {
        cf_dl_options o = {.bs = 64,
                           .shuffle = true,
                           .drop_last = true,
                           .seed = 0,
                           .crop_pad = 2,
                           .flip = true,
                           .n_norm = 1,
                           .mean = {0.2860f},
                           .std = {0.3530f},
                           .prefetch = mode == 0 ? 3 : -1};
        cf_dataloader *dl;
        if (cf_dataloader_new(ds, &o, &dl) != CF_OK) {
            fprintf(stderr, "bench_loader: %s\n", cf_last_error());
            return 1;
        }
        double best = 0;
        float sink = 0;
        for (int e = 0; e < epochs; e++) {
            double s = cf_now();
            cf_dataloader_begin_epoch(dl, e);
            const cf_batch *b;
            int64_t nb = 0;
            while (cf_dataloader_next(dl, &b) == CF_OK && b) {
                sink += b->x.data[nb % 784];
                nb++;
            }
            double rate = nb / (cf_now() - s);
            if (rate > best) best = rate;
        }
        printf("loader (%s, 1 core): %.0f batches/s, %.0f images/s (W1 pipeline, bs 64)%s\n",
               mode == 0 ? "prefetch thread" : "synchronous", best, best * 64,
               sink == 12345.f ? " " : "");
        cf_dataloader_free(dl);
    }
    cf_dataset_free(ds);
    return 0;
}
