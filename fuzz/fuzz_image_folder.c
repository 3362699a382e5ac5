/* libFuzzer target for the image reader: in-memory decoding (gray and RGB, with and without
 * resizing), and the folder reader over a folder holding the input as an image file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/data.h"
#include "expansion.h"

/* stb's decoders are linked from fuzz/stb_impl.c, instrumented (see fuzz/run). */

static char root[64];

static void cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(root, sizeof root, "/tmp/cf-fuzz-img-XXXXXX");
    if (!mkdtemp(root)) abort();
    char p[128];
    snprintf(p, sizeof p, "%s/train", root);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/train/cls", root);
    mkdir(p, 0700);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static float out[3 * 64 * 64];
    int w = 0, h = 0;
    cf_image_decode(data, size, "fuzz", 3, 16, out, &w, &h);
    /* Keep-size decoding, for 16 x 16 images only (the size the buffer holds). */
    w = h = 16;
    cf_image_decode(data, size, "fuzz", 1, 0, out, &w, &h);
    /* The folder reader (file I/O: slower) for a quarter of the inputs. */
    if (size % 4 != 0) return 0;
    char path[128];
    snprintf(path, sizeof path, "%s/train/cls/x.png", root);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    cf_dataset *tr = NULL, *va = NULL;
    cf_image_folder_options o = {.size = 8, .channels = size % 2 ? 1 : 3};
    expansion_begin();
    if (cf_datasets_from_image_folder(root, &o, &tr, &va) == CF_OK) {
        /* one 8 x 8 image of floats, whatever the file declared */
        expansion_check("cf_datasets_from_image_folder", size, 1, 1 << 16);
        cf_dataset_free(tr);
        cf_dataset_free(va);
    }
    return 0;
}
