/* libFuzzer target for the CSV reader and the tabular processing. The header of the input
 * decides which columns are found; columns a, b (categorical), c, d (continuous) and y (target)
 * are asked for, as a class and as a regression target. */
#include <stdint.h>
#include <string.h>

#include "corefit/data.h"
#include "expansion.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cf_csv_table *t;
    expansion_begin();
    if (cf_csv_parse_buffer((const char *)data, size, "fuzz.csv", ',', &t) != CF_OK) return 0;
    /* the text, a pointer per field (a field can be one byte) and a line number per row */
    expansion_check("cf_csv_parse_buffer", size, 1 + 2 * sizeof(char *) + sizeof(int64_t), 4096);
    const char *cats[] = {"a", "b"}, *conts[] = {"c", "d"};
    for (int mode = 0; mode < 2; mode++) {
        cf_tabular_options o = {.cat_names = cats,
                                .n_cat = 2,
                                .cont_names = conts,
                                .n_cont = 2,
                                .y_name = "y",
                                .y_regression = mode == 1,
                                .valid_pct = 0.25,
                                .seed = 1};
        cf_dataset *tr = NULL, *va = NULL;
        expansion_begin();
        if (cf_tabular_from_table(t, &o, &tr, &va) == CF_OK) {
            /* a float per field, the vocabularies (copies of fields) and the statistics */
            expansion_check("cf_tabular_from_table", size, 64, 1 << 16);
            cf_dls *dls;
            if (cf_dls_new(tr, va, &(cf_dls_options){.bs = 2, .prefetch = -1}, &dls) == CF_OK) {
                const cf_batch *b;
                cf_dataloader_begin_epoch(dls->train, 0);
                while (cf_dataloader_next(dls->train, &b) == CF_OK && b) {
                }
                cf_dls_free(dls);
            }
        }
    }
    cf_csv_table_free(t);
    return 0;
}
