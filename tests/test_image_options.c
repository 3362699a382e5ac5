/* The image options every image source checks the same way (image folders, image CSVs by class,
 * by label set, by point and by value, image names): out-of-range channels, size, valid_pct,
 * load and decode_threads are refused with CF_ERR_INVALID before any file is read, naming the
 * source and the values, leaving no data sets; channels 0 means 3; options in range pass the
 * check (the error is then about the missing file). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "corefit/data.h"

#define SRC "/nonexistent/cf_img_src"

typedef enum source { FOLDER, CSV, CSV_OPTS, NAMES, CSV_MULTI, POINTS, VALUES, N_SOURCES } source;

static const char *const source_names[N_SOURCES] = {
    "image folder",    "image CSV",  "image CSV (opts)", "image names",
    "multi-label CSV", "points CSV", "values CSV"};

static cf_status open_source(source s, const cf_image_folder_options *o, cf_dataset **tr,
                             cf_dataset **va) {
    switch (s) {
    case FOLDER:
        return cf_datasets_from_image_folder(SRC, o, tr, va);
    case CSV:
        return cf_datasets_from_image_csv(SRC, NULL, NULL, NULL, NULL, o, tr, va);
    case CSV_OPTS:
        return cf_datasets_from_image_csv_opts(SRC, &(cf_image_csv_options){.suffix = ".png"}, o,
                                               tr, va);
    case NAMES:
        return cf_datasets_from_image_names(SRC, "^(.+)_[0-9]+\\.png$", o, tr, va);
    case CSV_MULTI:
        return cf_datasets_from_image_csv_multi(SRC, NULL, NULL, NULL, NULL, ";", o, tr, va);
    case POINTS:
        return cf_datasets_from_image_points_csv(SRC, NULL, NULL, NULL, NULL, NULL, o, tr, va);
    case VALUES:
        return cf_datasets_from_image_csv_values(SRC, NULL, NULL, NULL, NULL, o, tr, va);
    default:
        return CF_ERR_INVALID;
    }
}

static void test_out_of_range_options_refused(void **state) {
    (void)state;
    static const struct {
        cf_image_folder_options o;
        const char *says;
    } bad[] = {
        {{.channels = 2}, "channels 2 (1 or 3), size 0, valid_pct 0, load 0, decode_threads 0"},
        {{.channels = 4}, "channels 4 (1 or 3)"},
        {{.size = -1}, "channels 3 (1 or 3), size -1,"},
        {{.size = 65537}, "size 65537,"},
        {{.valid_pct = 1}, "valid_pct 1,"},
        {{.valid_pct = -0.25}, "valid_pct -0.25,"},
        {{.load = (cf_image_load)(CF_IMAGE_LOAD_STREAM + 1)}, "load 3,"},
        {{.load = (cf_image_load)-1}, "load -1,"},
        {{.decode_threads = -1}, "decode_threads -1"},
        {{.decode_threads = 1025}, "decode_threads 1025"},
    };
    for (int s = 0; s < N_SOURCES; s++)
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            static cf_dataset stale;
            cf_dataset *tr = &stale, *va = &stale; /* the call clears them */
            const cf_status st = open_source((source)s, &bad[i].o, &tr, &va);
            const char *msg = cf_last_error();
            char want[128];
            snprintf(want, sizeof want,
                     SRC ": %s: ", s == FOLDER ? "image folder options" : "image options");
            if (st != CF_ERR_INVALID || strncmp(msg, want, strlen(want)) != 0 ||
                !strstr(msg, bad[i].says) || tr || va)
                fail_msg("%s, case %zu: status %d, message '%s', want '%s...%s' and no sets",
                         source_names[s], i, (int)st, msg, want, bad[i].says);
        }
}

static void test_options_in_range_pass_the_check(void **state) {
    (void)state;
    static const cf_image_folder_options good[] = {
        {0},
        {.channels = 1,
         .size = 65536,
         .valid_pct = 0.999,
         .load = CF_IMAGE_LOAD_STREAM,
         .decode_threads = 1024},
        {.channels = 3, .size = 0, .valid_pct = 0, .load = CF_IMAGE_LOAD_AUTO},
    };
    for (int s = 0; s < N_SOURCES; s++)
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
            cf_dataset *tr = NULL, *va = NULL;
            const cf_status st = open_source((source)s, &good[i], &tr, &va);
            const char *msg = cf_last_error();
            /* the source does not exist: an error, but not the options' */
            if (st == CF_OK || strstr(msg, "options:") || tr || va)
                fail_msg("%s, good options %zu: status %d, message '%s'", source_names[s], i,
                         (int)st, msg);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_range_options_refused),
        cmocka_unit_test(test_options_in_range_pass_the_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
