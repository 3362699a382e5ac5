/* libFuzzer target for the safetensors reader: any byte string must be either accepted as a
 * consistent file or refused with CF_ERR_FORMAT, without reading out of bounds or leaking. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/io.h"
#include "expansion.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cf_st_file *file = NULL;
    expansion_begin();
    cf_status st = cf_st_parse(data, size, "fuzz", &file);
    if (st == CF_OK) {
        /* the tensors as float32 (at most the input's bytes), names, metadata and shapes */
        expansion_check("cf_st_parse", size, 4, 1 << 16);
        /* a file that parses is internally consistent */
        for (int i = 0; i < file->n_entries; i++) {
            const cf_st_entry *e = &file->entries[i];
            size_t numel = 1;
            for (int d = 0; d < e->shape.ndim; d++) numel *= (size_t)e->shape.dim[d];
            if (numel != e->numel || cf_st_find(file, e->name) != e) abort();
            volatile float sink = 0;
            for (size_t k = 0; k < e->numel; k++) sink += e->data[k];
            (void)sink;
        }
        for (int i = 0; i < file->n_meta; i++)
            if (strcmp(cf_st_meta(file, file->meta_keys[i]), file->meta_values[i]) != 0) abort();
        cf_st_free(file);
    } else if (file != NULL || st != CF_ERR_FORMAT) {
        abort();
    }
    return 0;
}
