/* Helpers shared by the data layer's sources (not public API). */
#ifndef CF_DATA_INTERNAL_H
#define CF_DATA_INTERNAL_H

#include "corefit/data.h"

/* A dataset with room for n samples of `shape` and target_dim targets (x, y zeroed), or NULL
 * with the error set (sizes are checked for overflow and against a sanity cap). */
cf_dataset *cf__dataset_alloc(int64_t n, cf_shape shape, int target_dim);
/* Copies n strings (NULL entries stay NULL); NULL with the error set on failure. */
char **cf__strv_dup(const char *const *v, int n);
void cf__strv_free(char **v, int n);
/* Sets ds->source to a copy of s; false on allocation failure. */
bool cf__dataset_set_source(cf_dataset *ds, const char *s);
/* Copies the tabular metadata (names, vocabularies, statistics) of src into dst. */
cf_status cf__dataset_copy_meta(cf_dataset *dst, const cf_dataset *src);

#endif
