/* libFuzzer target for the text readers: the input is read as a CSV by from_csv (single label
 * with an is_valid column, delimited multi-labels, 0/1 label columns), and written as a .txt
 * file in a train/<label> folder for from_folder. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corefit/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *cols[] = {"a", "b"}, *one[] = {"label"};
    cf_text_csv_options opts[] = {
        {.valid_col = "is_valid"},
        {.label_cols = one, .n_label_cols = 1, .label_delim = ";", .valid_pct = 0.3},
        {.label_cols = cols, .n_label_cols = 2},
    };
    for (int k = 0; k < 3; k++) {
        cf_text_raw *raw = NULL;
        if (cf_text_read_csv_buffer((const char *)data, size, "fuzz.csv", &opts[k], &raw) == CF_OK)
            cf_text_raw_free(raw);
    }
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_text_%d", (int)getpid());
        char sub[128];
        snprintf(sub, sizeof sub, "%s/train", dir);
        mkdir(dir, 0700);
        mkdir(sub, 0700);
        snprintf(sub, sizeof sub, "%s/train/x", dir);
        mkdir(sub, 0700);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/train/x/a.txt", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    cf_text_raw *raw = NULL;
    if (cf_text_read_folder(dir, NULL, &raw) == CF_OK) cf_text_raw_free(raw);
    return 0;
}
