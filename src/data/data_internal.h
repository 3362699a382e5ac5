/* Helpers shared by the data layer's sources (not public API). */
#ifndef CF_DATA_INTERNAL_H
#define CF_DATA_INTERNAL_H

#include "corefit/data.h"

/* A source of samples that are not held in ds->x: dataset.c calls these instead of asking how
 * the samples are stored. */
typedef struct cf_sample_ops {
    /* Sample i as a loader would make it for `epoch` (plain: as a validation sample, no random
     * item transform) into out. With skip_bad, a source that leaves bad samples out marks the
     * sample bad and sets *skipped instead of failing (skipped may be NULL: then it fails). */
    cf_status (*get)(const cf_dataset *ds, int64_t i, int epoch, bool plain, float *out,
                     bool *skipped);
    /* A new data set of the samples idx[0..n) (the source's samples and y; the caller copies
     * the metadata). */
    cf_status (*subset)(const cf_dataset *ds, const int64_t *idx, int64_t n, cf_dataset **out);
    /* Frees what the source holds in ds. */
    void (*free)(cf_dataset *ds);
} cf_sample_ops;

/* Streamed image files (stream.c). */
extern const cf_sample_ops cf__image_files_samples;

/* A dataset with room for n samples of `shape` and target_dim targets (x, y zeroed), or NULL
 * with the error set (sizes are checked for overflow and against a sanity cap). */
cf_dataset *cf__dataset_alloc(int64_t n, cf_shape shape, int target_dim);
/* The same with x and y not initialised, for a caller that writes every value of both: x is
 * cf__malloc_huge's (huge pages for a large set, core/memory.h). */
cf_dataset *cf__dataset_alloc_unset(int64_t n, cf_shape shape, int target_dim);
/* Copies n strings (NULL entries stay NULL); NULL with the error set on failure. */
char **cf__strv_dup(const char *const *v, int n);
void cf__strv_free(char **v, int n);
/* Sets ds->source to a copy of s; false on allocation failure. */
bool cf__dataset_set_source(cf_dataset *ds, const char *s);
/* Copies the tabular metadata (names, vocabularies, statistics) of src into dst. */
cf_status cf__dataset_copy_meta(cf_dataset *dst, const cf_dataset *src);
/* Copies tfm into ds->item_tfm (NULL or kind NONE: none). */
cf_status cf__dataset_set_item_tfm(cf_dataset *ds, const cf_item_tfm *tfm);

/* stb_image_resize without its aborting assertions (resize.c): stbir_resize_uint8, and
 * stbir_resize_float_generic with one channel, the triangle filter and clamped edges applied to
 * `planes` planes (in_plane and out_plane floats apart; output rows packed), the filters computed
 * once: each plane's pixels are those of one stbir_resize_float_generic call. Strides in bytes
 * (0: packed). Nonzero on success (0: out of memory). */
int cf__resize_uint8(const unsigned char *in, int in_w, int in_h, int in_stride, unsigned char *out,
                     int out_w, int out_h, int out_stride, int channels);
int cf__resize_planes_triangle(const float *in, int in_w, int in_h, int in_stride, size_t in_plane,
                               float *out, int out_w, int out_h, size_t out_plane, int planes);

/* ---- image files (image_decode.c, image_list.c) --------------------------------------------- */

/* Image files larger than this are refused before reading. */
#define CF_IMAGE_MAX_FILE ((int64_t)1 << 28)

/* The size of an encoded image without decoding it (left as it is without stb_image); an error
 * naming the file when it is not an image corefit reads or has more pixels than it takes. */
cf_status cf__image_size(const void *data, size_t n, const char *name, int *w, int *h);

/* Labelled image files, in the order they were found. */
typedef struct cf__image_item {
    char *path;
    int label;
} cf__image_item;
typedef struct cf__image_items {
    cf__image_item *v;
    int64_t n, cap;
} cf__image_items;
void cf__image_items_free(cf__image_items *items);
/* Sets o's default channels (3) and checks its fields; an error names the source and what
 * ("<source>: <what>: channels ..."), e.g. "image options" or "image folder options". */
cf_status cf__image_options_check(cf_image_folder_options *o, const char *source, const char *what);
/* qsort comparison of char * (strcmp order). */
int cf__cmp_str(const void *a, const void *b);
/* The classes of labels[0..n): sorted, each once, copied into *vocab (*n_vocab of them).
 * Reorders labels (the strings are borrowed). With no labels: CF_ERR_FORMAT "<source><why>",
 * e.g. source "x.csv", why " has no training rows". */
cf_status cf__sorted_vocab(const char **labels, int64_t n, const char *source, const char *why,
                           char ***vocab, int *n_vocab);

/* ---- image CSVs (image_csv.c, multilabel.c) ------------------------------------------------- */

/* The column named `name`, or without a name the column at `fallback`; -1 if none. */
int cf__image_csv_col(const cf_csv_table *t, const char *name, int fallback);
/* 1 for a true value (1, true, True, TRUE), 0 for false, -1 for anything else. */
int cf__parse_bool(const char *v);
cf_status cf__image_items_push(cf__image_items *items, const char *path, int label);
/* buf = a "/" b; an error naming both when it does not fit. */
cf_status cf__path_join(char *buf, size_t size, const char *a, const char *b);
/* The items as a new data set (source names it in messages) of channels x size x size images
 * (size 0: the common size, *w x *h, taken from the first image when 0), or of tfm's size; the
 * set is streamed or decoded up front as o->load says. train: the training set (random item
 * transforms). */
cf_status cf__image_items_build(const cf__image_items *items, int channels, int size, int *w,
                                int *h, char **vocab, int n_vocab, const char *source,
                                const cf_item_tfm *tfm, bool train,
                                const cf_image_folder_options *o, cf_dataset **out);
/* The training set from tr (named train_source in messages) and the validation set from va
 * (valid_source), both of one size (o's, or the first training image's), as
 * cf__image_items_build makes them; on failure neither is left (*train = *valid = NULL). */
cf_status cf__image_sets_build(const cf__image_items *tr, const cf__image_items *va, char **vocab,
                               int n_vocab, const char *train_source, const char *valid_source,
                               const cf_image_folder_options *o, cf_dataset **train,
                               cf_dataset **valid);

/* ---- streamed image sets (stream.c) --------------------------------------------------------- */

#include <stdatomic.h>

/* What a streamed set needs to decode sample i: its path and how to decode it. */
struct cf_image_files {
    int64_t n;
    char **paths;       /* n paths */
    int channels;       /* 1 or 3 */
    int size;           /* resize to size x size (0: keep; then all images are w x h) */
    int w, h;           /* the common size when size is 0 and there is no item transform */
    bool has_tfm;       /* tfm applies (then size is unused) */
    cf_item_tfm tfm;    /* item transform, drawn from (seed, epoch, i) for a training set */
    bool train;         /* the training set (random item transforms) */
    uint64_t seed;      /* item transforms */
    bool skip_bad;      /* loaders leave bad files out of their batches */
    int decode_threads; /* 0: cf_get_num_threads() */
    atomic_uchar *bad;  /* per file: found bad (skip_bad) */
    atomic_llong n_bad; /* distinct files found bad in this process */
};

/* A new streamed dataset of n images (paths copied, labels as class codes); NULL with the error
 * set on failure. proto's decoding fields (channels .. decode_threads) are copied. */
cf_dataset *cf__dataset_stream_new(int64_t n, const char *const *paths, const int *labels,
                                   const struct cf_image_files *proto, cf_shape shape);
void cf__image_files_free(struct cf_image_files *f);
/* The files idx[0..n) of f, in that order, as a new set of files. */
struct cf_image_files *cf__image_files_subset(const struct cf_image_files *f, const int64_t *idx,
                                              int64_t n);
/* Decodes file i of f for `epoch` into out (channels * H * W floats in [0, 1]); the error names
 * the file. Thread-safe. */
cf_status cf__image_files_decode(const struct cf_image_files *f, int64_t i, int epoch, float *out);
/* Marks file i bad (skip_bad); true the first time. */
bool cf__image_files_mark_bad(struct cf_image_files *f, int64_t i);

/* ---- batch producers other than the sample loader (text_loader.c) -------------------------- */

/* A loader whose batches come from these operations instead of a dataset's samples: loader.c
 * keeps the epoch, seek and shard bookkeeping and calls them; batches are made in
 * cf_dataloader_next (no prefetch thread). */
typedef struct cf__batch_ops {
    /* Batches per epoch for this shard. */
    int64_t (*len)(void *ctx, const cf_dl_options *opt, int rank, int world, cf_shard_mode mode);
    /* Prepares the epoch; *n_batches receives its batch count. */
    cf_status (*begin_epoch)(void *ctx, const cf_dl_options *opt, int epoch, int rank, int world,
                             cf_shard_mode mode, int64_t *n_batches);
    /* Batch b of the epoch begun last (valid until the next call). */
    cf_status (*make)(void *ctx, int64_t b, const cf_batch **out);
    cf_status (*new_like)(void *ctx, const cf_dl_options *opt, cf_dataloader **out);
    void (*free)(void *ctx);
} cf__batch_ops;

/* A loader over ops and ctx (ctx freed with ops->free by cf_dataloader_free, and here on
 * failure); ds describes the data (not owned). */
cf_status cf__dataloader_new_ops(const cf_dataset *ds, const cf_dl_options *opt,
                                 const cf__batch_ops *ops, void *ctx, cf_dataloader **out);
/* ctx when dl was made with ops, else NULL. */
void *cf__dataloader_ops_ctx(const cf_dataloader *dl, const cf__batch_ops *ops);
/* Text corpora: one more reference (released by cf_text_corpus_free). */
void cf__text_corpus_retain(cf_text_corpus *c);

#endif
