/* libFuzzer target for the IDX reader. Input: a 4-byte little-endian split point, then the
 * bytes of an image file and a label file (split at that point). */
#include <stdint.h>
#include <string.h>

#include "corefit/data.h"
#include "expansion.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cf_idx idx;
    expansion_begin();
    if (cf_idx_parse(data, size, "fuzz", &idx) == CF_OK) {
        expansion_check("cf_idx_parse", size, 1, 4096); /* the bytes, at most the input's */
        cf_idx_free(&idx);
    }
    if (size < 4) return 0;
    uint32_t split = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                     (uint32_t)data[3] << 24;
    size_t rest = size - 4;
    size_t cut = rest ? split % (rest + 1) : 0;
    cf_dataset *ds = NULL;
    expansion_begin();
    if (cf_dataset_from_idx_memory(data + 4, cut, data + 4 + cut, rest - cut, "fuzz", &ds) ==
        CF_OK) {
        /* float32 samples and targets: 4 bytes per input byte, and the vocabulary */
        expansion_check("cf_dataset_from_idx_memory", size, 8, 1 << 16);
        /* A short walk through a loader over what was read. */
        cf_dataloader *dl;
        if (cf_dataloader_new(
                ds,
                &(cf_dl_options){
                    .bs = 3, .shuffle = true, .prefetch = -1, .crop_pad = 1, .flip = true},
                &dl) == CF_OK) {
            const cf_batch *b;
            cf_dataloader_begin_epoch(dl, 0);
            while (cf_dataloader_next(dl, &b) == CF_OK && b) {
            }
            cf_dataloader_free(dl);
        }
        cf_dataset_free(ds);
    }
    return 0;
}
