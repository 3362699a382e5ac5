/* corefit/data.h — datasets, transforms, splitters and DataLoaders with fastai's defaults,
 * sharding for data-parallel training, and a background thread that prepares batches ahead.
 * Samples and targets are float32 (images (C, H, W) in [0, 1]; class codes or values). An option
 * field left 0 / NULL / false takes fastai's default. Readers validate what they read; on failure
 * they return a status with cf_last_error() naming file, position and value, and leave *out NULL.
 * Longer notes (sharding, text pipeline, loader order): docs/api.md. */
#ifndef COREFIT_DATA_H
#define COREFIT_DATA_H

#include <stdio.h>

#include "corefit/core.h"
#include "corefit/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets ------------------------------------------------------------------------------ */

/* An in-memory dataset: n samples of sample_shape (x) and target_dim targets each (y). */
typedef struct cf_dataset {
    int64_t n;
    cf_shape sample_shape; /* without the batch dim: (C, H, W) or (F) */
    int target_dim;        /* 1 for class codes */
    float *x;              /* n * numel(sample_shape) */
    float *y;              /* n * target_dim */
    int n_classes;         /* 0 for regression */
    char **vocab;          /* n_classes class names (sorted, as fastai's Categorize), or NULL */
    /* multi-label sets have target_dim == n_classes (multi-hot rows, cf_dataset_is_multi_label);
     * point sets hold n_points (x, y) pairs per sample scaled to -1..1 (target_dim 2 * n_points,
     * n_classes 0), which flips move with the images */
    int n_points;
    /* tabular: the first n_cat features are category codes with these cardinalities */
    int n_cat, n_cont;
    int *cat_cardinality;
    char *source; /* where it came from (for messages) */
    /* tabular only (NULL otherwise): */
    char **feature_names; /* n_cat + n_cont column names; `<name>_na` flags follow the caller's
                             categorical columns */
    char ***cat_vocab;    /* per categorical feature, cat_cardinality[i] names; [0] = "#na#" */
    float *cont_mean, *cont_std, *cont_fill; /* training-set statistics per continuous column:
                                                Normalize's mean/std, FillMissing's median */
    char *y_name;                            /* the target column */
    int64_t n_unseen; /* categorical values the training set never had, made #na# (validation) */
    /* A streamed image set (cf_image_load CF_IMAGE_LOAD_STREAM): x is NULL and the loaders
     * decode each sample from its file when a batch needs it; y, the vocabulary and
     * sample_shape are as for an in-memory set. NULL for in-memory sets. */
    struct cf_image_files *files;
    /* Where the samples come from when they are not in x (get, subset, free; streamed image
     * files are one such source); NULL for in-memory sets. Internal to the data layer. */
    const struct cf_sample_ops *samples;
    /* Segmentation (cf_datasets_from_masks): y holds each sample's mask, H * W class ids
     * (target_dim H * W, n_classes the codes), which flips and crops move with the image. */
    bool masks;
    /* Image sets made with an item transform (Resize, RandomResizedCrop): that transform, so
     * that an exported model records how its images were made (kind 0, CF_ITEM_TFM_NONE: a
     * plain squish to the sample size, or not an image set). */
    struct cf_item_tfm *item_tfm;
} cf_dataset;

/* Frees everything the dataset owns (NULL is a no-op). */
void cf_dataset_free(cf_dataset *ds);

/* From caller memory (copied). y holds n * target_dim values; n_classes 0 for regression. */
cf_status cf_dataset_from_arrays(const float *x, const float *y, int64_t n, cf_shape sample_shape,
                                 int target_dim, int n_classes, cf_dataset **out);
/* Sets (copies) the class names; n must equal ds->n_classes. */
cf_status cf_dataset_set_vocab(cf_dataset *ds, const char *const *names, int n);
/* A new dataset holding the samples idx[0..n) of ds, in that order (vocab and tabular metadata
 * are copied). */
cf_status cf_dataset_subset(const cf_dataset *ds, const int64_t *idx, int64_t n, cf_dataset **out);
/* Replaces *ds by a new dataset of its first n samples (n <= 0 or >= its size: unchanged); on
 * error *ds is left as it was. */
cf_status cf_dataset_keep_first(cf_dataset **ds, int64_t n);
/* Per-channel mean and std (unbiased, + 1e-7 as fastai's Normalize) of an image dataset
 * (sample_shape (C, H, W), C <= 4); mean and std receive C values. A streamed set is measured
 * on at most 256 images spread evenly over it (as fastai's Normalize measures one batch),
 * decoded as validation images. */
cf_status cf_dataset_channel_stats(const cf_dataset *ds, float *mean, float *std);

/* fastai's RandomSplitter(valid_pct, seed): a permutation of n drawn from seed, cut =
 * (int64)(valid_pct * n); valid = the first cut indices of the permutation, train = the rest.
 * Both arrays are allocated with cf_malloc (free with cf_free). */
cf_status cf_random_split(int64_t n, double valid_pct, uint64_t seed, int64_t **train_idx,
                          int64_t *n_train, int64_t **valid_idx, int64_t *n_valid);

/* ---- IDX files ----------------------------------------------------------------------------- */

/* One IDX file of unsigned bytes (magic 0x00 0x00 0x08 ndim, big-endian int32 dims). */
typedef struct cf_idx {
    int ndim; /* 1..4 */
    int64_t dim[4];
    uint8_t *data; /* prod(dim) bytes, cf_malloc'd */
} cf_idx;

/* Largest IDX payload accepted from a gzip'd file (raw files are checked against their size). */
#define CF_IDX_MAX_BYTES ((int64_t)1 << 34)

/* Parses an in-memory IDX image; `name` is used in messages. The payload must match the header
 * exactly (no trailing bytes). */
cf_status cf_idx_parse(const void *bytes, size_t size, const char *name, cf_idx *out);
/* Reads an IDX file, gzip'd or raw (zlib's gzread reads both). */
cf_status cf_idx_read(const char *path, cf_idx *out);
/* The same for the first max_items items (dimension 0; 0: all): only their bytes are read and
 * decompressed, and the rest of the file is not checked. */
cf_status cf_idx_read_first(const char *path, int64_t max_items, cf_idx *out);
void cf_idx_free(cf_idx *idx);

/* IDX files, gzip'd or raw (idx3 images, idx1 labels), e.g. Fashion-MNIST. Pixels / 255; sample
 * shape (1, H, W) (idx2 images give (F)); n_classes = largest label + 1; vocab "0", "1", ... */
cf_status cf_dataset_from_idx(const char *images_path, const char *labels_path, cf_dataset **out);
/* The same for the first max_items samples only (0: all), reading only their bytes (a --limit
 * that costs what it keeps). */
cf_status cf_dataset_from_idx_first(const char *images_path, const char *labels_path,
                                    int64_t max_items, cf_dataset **out);
/* The same from two in-memory IDX images (for fuzzing and embedding). */
cf_status cf_dataset_from_idx_memory(const void *images, size_t images_size, const void *labels,
                                     size_t labels_size, const char *name, cf_dataset **out);

/* ---- image folders (PNG, JPEG, BMP through stb_image) -------------------------------------- *
 * JPEG through libjpeg-turbo when built with it (CF_HAVE_JPEG; faster, see bench/README.md). */

/* How an image set's pixels are held. */
typedef enum cf_image_load {
    /* Streamed when the decoded set would exceed CF_IMAGE_MEMORY_BUDGET or a quarter of the
     * memory this process may use, or for a training set with RandomResizedCrop; else in memory. */
    CF_IMAGE_LOAD_AUTO,
    CF_IMAGE_LOAD_MEMORY, /* decode every image up front into one float array (ds->x) */
    /* Only file names and labels are kept; images are decoded when a batch needs them, on
     * `decode_threads` threads, at most prefetch + 1 batches ahead. Training item transforms are
     * drawn anew every epoch (fastai's RandomResizedCrop). Same batches for any decode_threads. */
    CF_IMAGE_LOAD_STREAM,
} cf_image_load;

/* The AUTO threshold on the decoded size of one set (training or validation). */
#define CF_IMAGE_MEMORY_BUDGET ((uint64_t)2 << 30)

typedef struct cf_image_folder_options {
    int size;          /* resize every image to size x size with stbir_resize_uint8 (0: keep the
                          size; all images must then share it) */
    int channels;      /* 1 (grayscale) or 3 (RGB); 0: 3 */
    const char *train; /* GrandparentSplitter folders: "train" */
    const char *valid; /* "valid" */
    double valid_pct;  /* > 0: RandomSplitter(valid_pct, seed) over root/<class>/ instead */
    uint64_t seed;
    bool follow_symlinks; /* false: refuse links that lead out of root (realpath + prefix) */
    /* fastai's item transform (cf_resize_tfm, cf_random_resized_crop_tfm), applied as each image
     * is decoded; `size` is then unused. Sets decoded once keep epoch 0's region. NULL: none. */
    const struct cf_item_tfm *item_tfm;
    cf_image_load load; /* AUTO (above) */
    int decode_threads; /* streamed sets: threads decoding for each loader (0: the fit's thread
                           count, cf_get_num_threads(), which is 1 in a parallel worker) */
    /* Streamed sets: a file that cannot be read or decoded is left out of its batch (the batch
     * is one sample shorter) and counted (cf_dataloader_skipped) instead of failing the epoch
     * with an error naming it. A batch left with no sample fails. Up-front sets always fail
     * on a bad file. */
    bool skip_bad;
} cf_image_folder_options;

/* Decodes one PNG/JPEG/BMP image from memory into out (channels * size * size floats in [0, 1],
 * CHW), resizing when size > 0 (size 0: the image must be exactly *w x *h when they are > 0;
 * w and h receive the decoded size). `name` is used in messages. */
cf_status cf_image_decode(const void *bytes, size_t n, const char *name, int channels, int size,
                          float *out, int *w, int *h);
/* The same from a file, read with the image folders' limit on its size (256 MiB; a pipe or a
 * device is read up to it, a FIFO nobody writes to is refused after 10 s). */
cf_status cf_image_read(const char *path, int channels, int size, float *out, int *w, int *h);
/* One subfolder per class (vocab sorted, from the training set). train and valid are new
 * datasets; *valid is empty (n 0) when valid_pct is 0 and there is no valid folder. */
cf_status cf_datasets_from_image_folder(const char *root, const cf_image_folder_options *opt,
                                        cf_dataset **train, cf_dataset **valid);

/* ---- segmentation masks (fastai's SegmentationDataLoaders.from_label_func) --------------------
 */

/* Where an image's mask is: dir/<image stem><suffix><ext>, e.g. {"labels", "_P", NULL} for
 * fastai's `lambda o: path/'labels'/f'{o.stem}_P{o.suffix}'`. ext NULL: the image's own. */
typedef struct cf_mask_rule {
    const char *dir, *suffix, *ext;
} cf_mask_rule;

/* Reads codes (class names) from a text file, one a line, as fastai's np.loadtxt(codes.txt):
 * blank lines skipped, line ends (LF or CRLF) and surrounding spaces dropped. Free with
 * cf_codes_free. */
cf_status cf_codes_read(const char *path, char ***codes, int *n_codes);
void cf_codes_free(char **codes, int n_codes);

/* The images in images_dir (.png/.jpg/.jpeg/.bmp, sorted by name) with their masks found by
 * rule: x (C, H, W) as image folders decode them (opt: size, channels, valid_pct, seed; the
 * images are decoded up front), y each mask's pixels as class ids, resized nearest-neighbour
 * to the images' size. A mask pixel >= n_codes is refused naming the file, x, y and value; a
 * mask whose size differs from its image's is refused. RandomSplitter(valid_pct, seed) makes
 * *valid (empty when valid_pct is 0). The loaders' flip and crop_pad move masks with their
 * images (padding is class 0); the affine batch transforms (aug) are refused for masks. */
cf_status cf_datasets_from_masks(const char *images_dir, const cf_mask_rule *rule,
                                 const char *const *codes, int n_codes,
                                 const cf_image_folder_options *opt, cf_dataset **train,
                                 cf_dataset **valid);

/* fastai's ImageDataLoaders.from_csv: one image a row; fn_col (NULL: first column) names files
 * relative to `folder` (NULL: the CSV's folder), label_col the class (NULL: second column).
 * valid_col (NULL: none) marks validation rows with booleans; else opt->valid_pct splits at
 * random. Classes: the sorted training labels; an unknown validation label is refused. */
cf_status cf_datasets_from_image_csv(const char *csv_path, const char *folder, const char *fn_col,
                                     const char *label_col, const char *valid_col,
                                     const cf_image_folder_options *opt, cf_dataset **train,
                                     cf_dataset **valid);
/* from_csv's columns and names (NULL members: the defaults above). suffix (fastai's suffix) is
 * appended to every file name, e.g. ".jpg". A label_delim for multi-label rows belongs here. */
typedef struct cf_image_csv_options {
    const char *folder, *fn_col, *label_col, *valid_col, *suffix;
} cf_image_csv_options;
cf_status cf_datasets_from_image_csv_opts(const char *csv_path, const cf_image_csv_options *csv,
                                          const cf_image_folder_options *opt, cf_dataset **train,
                                          cf_dataset **valid);
/* fastai's ImageDataLoaders.from_name_re: every image under dir (recursively), labelled by the
 * first group of the POSIX extended regex `pattern` in its file name (e.g.
 * "^(.+)_[0-9]+\\.jpg$"); a name it does not match is an error. opt->valid_pct splits at random. */
cf_status cf_datasets_from_image_names(const char *dir, const char *pattern,
                                       const cf_image_folder_options *opt, cf_dataset **train,
                                       cf_dataset **valid);
/* fastai's ImageDataLoaders.from_csv(label_delim) with a MultiCategoryBlock: label_col holds
 * labels separated by label_delim (NULL: one label a cell); targets are multi-hot over the sorted
 * union of training labels. Other arguments as cf_datasets_from_image_csv. */
cf_status cf_datasets_from_image_csv_multi(const char *csv_path, const char *folder,
                                           const char *fn_col, const char *label_col,
                                           const char *valid_col, const char *label_delim,
                                           const cf_image_folder_options *opt, cf_dataset **train,
                                           cf_dataset **valid);
/* True for a multi-label set (multi-hot targets, one per class). */
bool cf_dataset_is_multi_label(const cf_dataset *ds);
/* The names of the classes set in a multi-hot row (values > 0.5) joined by sep (NULL: ";", as
 * fastai shows them), vocab NULL: the class ids. Writes at most size bytes (NUL-terminated);
 * returns the length the whole string needs. */
size_t cf_label_set_str(const float *multi_hot, int n_classes, char *const *vocab, const char *sep,
                        char *buf, size_t size);

/* fastai's PointBlock from a CSV: one point per image in x_col, y_col (NULL: "x", "y"), in pixels,
 * scaled to -1..1 as fastai's PointScaler. Only squashing resizes; flips move the points; affine
 * aug is refused. Other arguments as cf_datasets_from_image_csv; target_dim 2, n_points 1. */
cf_status cf_datasets_from_image_points_csv(const char *csv_path, const char *folder,
                                            const char *fn_col, const char *x_col,
                                            const char *y_col, const char *valid_col,
                                            const cf_image_folder_options *opt, cf_dataset **train,
                                            cf_dataset **valid);
/* fastai's RegressionBlock on images from a CSV: one number per image in value_col (NULL: the
 * second column), kept as it is (target_dim 1, n_classes 0). Other arguments as
 * cf_datasets_from_image_csv. */
cf_status cf_datasets_from_image_csv_values(const char *csv_path, const char *folder,
                                            const char *fn_col, const char *value_col,
                                            const char *valid_col,
                                            const cf_image_folder_options *opt, cf_dataset **train,
                                            cf_dataset **valid);
/* PointScaler: pixels -> -1..1 (p * 2 / size - 1) and back ((p + 1) * size / 2), in place on
 * n_points (x, y) pairs; a horizontal flip of the image maps x to -x. */
void cf_points_scale(float *xy, int n_points, int width, int height);
void cf_points_unscale(float *xy, int n_points, int width, int height);
void cf_points_flip_lr(float *xy, int n_points);
/* Whether the set is streamed (ds->files), and how many of its files a loader has skipped as
 * unreadable in this process so far (skip_bad; each file counted once). */
bool cf_dataset_is_streamed(const cf_dataset *ds);
int64_t cf_dataset_skipped(const cf_dataset *ds);
/* The path of sample i of a streamed set (NULL for in-memory sets or i out of range). */
const char *cf_dataset_file(const cf_dataset *ds, int64_t i);
/* Decodes sample i of a set into out (numel(sample_shape) floats, [0, 1], before
 * normalisation), as a loader would for `epoch` (streamed training sets draw their item
 * transform from (seed, epoch, i)); an in-memory set's sample is copied. */
cf_status cf_dataset_get(const cf_dataset *ds, int64_t i, int epoch, float *out);

/* ---- CSV tables ---------------------------------------------------------------------------- */

/* A parsed CSV: a header row, then rows of n_cols fields (RFC 4180 quoting: fields in double
 * quotes may hold commas, newlines and "" for a quote). */
typedef struct cf_csv_table {
    int n_cols;
    int64_t n_rows;
    char **header;       /* n_cols names */
    char **cells;        /* n_rows * n_cols fields (point into one block) */
    int64_t *row_line;   /* 1-based line number where each row starts (for messages) */
    char *source, *text; /* owned */
} cf_csv_table;

/* Parses CSV text; rows with a different field count than the header are refused with the line
 * number. A final empty line is ignored. */
cf_status cf_csv_parse_buffer(const char *text, size_t size, const char *name, char delimiter,
                              cf_csv_table **out);
cf_status cf_csv_read(const char *path, char delimiter, cf_csv_table **out);
/* The header and the first max_rows rows of a CSV file (all of them when max_rows <= 0, as
 * cf_csv_read). A regular file is read only as far as those rows need (a few MiB past them at
 * most); the rows after them are not parsed or checked. *rest_unread (may be NULL) is set when
 * the file may hold more rows than were read. */
cf_status cf_csv_read_first(const char *path, char delimiter, int64_t max_rows, cf_csv_table **out,
                            bool *rest_unread);
void cf_csv_table_free(cf_csv_table *table);
/* The index of the first column named `name` (exactly), or -1. */
int cf_csv_column(const cf_csv_table *table, const char *name);

/* ---- tabular processing (src/data/tabular.c) ------------------------------------------------ */

/* True for the strings pandas reads as missing ("", "NA", "NaN", "null", "#N/A", ...). */
bool cf_csv_is_missing(const char *s);

/* fastai's TabularPandas with procs [Categorify, FillMissing, Normalize], fitted on the training
 * rows (vocabularies with "#na#" at 0, median fill with `<name>_na` flags, mean/std). The target
 * is a class or a float; a missing target is refused. Details: docs/api.md. */
typedef struct cf_tabular_options {
    const char *const *cat_names;
    int n_cat;
    const char *const *cont_names;
    int n_cont;
    const char *y_name;
    bool y_regression; /* false: the target is a class */
    char delimiter;    /* ',' */
    double valid_pct;  /* RandomSplitter(valid_pct, seed) over the rows; 0: no validation */
    uint64_t seed;
    const int64_t *valid_idx; /* rows (0-based, after the header) of the validation set;
                                 overrides valid_pct */
    int64_t n_valid_idx;
} cf_tabular_options;

/* What the procs learn from a training set, and all that encoding a row needs: the training
 * sets, an exported model (cf_model_info) and its inputs at inference use the same state and the
 * same encoder (cf_tabular_apply). */
typedef struct cf_tabular_state {
    int n_cat, n_cont;    /* n_cat counts the `<name>_na` flags too */
    char **feature_names; /* n_cat + n_cont: categorical (flags after the caller's), continuous */
    char ***cat_vocab;    /* per categorical feature, cat_cardinality[i] names; [0] = "#na#" */
    int *cat_cardinality;
    char **flag_of; /* per categorical feature: the continuous column a flag marks, or NULL */
    double *cont_mean, *cont_std, *cont_fill; /* Normalize's mean, std; FillMissing's median */
    char *y_name;                             /* the target column */
    bool regression;
    char **y_vocab; /* n_classes class names (sorted as Categorize), classifiers only */
    int n_classes;
} cf_tabular_state;

/* A state of n_cat categorical and n_cont continuous features with every array allocated and
 * zeroed (for readers that fill one in); free with cf_tabular_state_free. */
cf_status cf_tabular_state_alloc(cf_tabular_state *state, int n_cat, int n_cont);
void cf_tabular_state_free(cf_tabular_state *state);
/* Fits the procs on the rows rows[0..n) of the table (the training set); every continuous cell
 * of the whole table must be a number or missing (the error names the first that is not). */
cf_status cf_tabular_fit(const cf_csv_table *table, const cf_tabular_options *opt,
                         const int64_t *rows, int64_t n, cf_tabular_state *out);
/* Encodes rows rows[0..n) of the table (rows NULL: the first n) with the state: x receives n *
 * (n_cat + n_cont) features, y (with need_target) n targets. Columns are found by name;
 * missing and unseen categories get code 0, *n_unseen (may be NULL) how many were unseen. */
cf_status cf_tabular_apply(const cf_tabular_state *state, const cf_csv_table *table,
                           const int64_t *rows, int64_t n, bool need_target, float *x, float *y,
                           int64_t *n_unseen);
/* A new data set of those rows encoded (cf_tabular_apply) and carrying the state
 * (cf_tabular_state_save); ds->n_unseen counts the unseen categories. */
cf_status cf_tabular_dataset(const cf_tabular_state *state, const cf_csv_table *table,
                             const int64_t *rows, int64_t n, bool need_target, cf_dataset **out);
/* Saves the state into a data set's tabular fields (feature names, vocabularies, statistics as
 * float, target name, classes), which must be empty; cf_tabular_state_load reads it back (a
 * flag is a categorical feature named after a continuous one with "_na"). */
cf_status cf_tabular_state_save(const cf_tabular_state *state, cf_dataset *ds);
cf_status cf_tabular_state_load(const cf_dataset *ds, cf_tabular_state *out);

/* TabularPandas: splits the rows, fits the procs on the training rows and encodes both sets. */
cf_status cf_tabular_from_table(const cf_csv_table *table, const cf_tabular_options *opt,
                                cf_dataset **train, cf_dataset **valid);
cf_status cf_tabular_from_csv(const char *path, const cf_tabular_options *opt, cf_dataset **train,
                              cf_dataset **valid);
cf_status cf_tabular_from_csv_buffer(const char *text, size_t size, const char *name,
                                     const cf_tabular_options *opt, cf_dataset **train,
                                     cf_dataset **valid);

/* ---- transforms (src/data/transforms.c): fastai's item and batch transforms ----------------- *
 * Images are float CHW. Every random choice for an item is drawn from (seed, epoch, item index)
 * alone, never from a generator shared across items, so results do not depend on how items are
 * spread over threads or processes. */

typedef enum cf_resize_method {
    CF_RESIZE_CROP,   /* fastai's ResizeMethod.Crop (default): the largest region of the target
                         aspect, random position in training, centred in validation */
    CF_RESIZE_PAD,    /* ResizeMethod.Pad: the smallest region of the target aspect holding the
                         whole image, padded */
    CF_RESIZE_SQUISH, /* ResizeMethod.Squish: the whole image, aspect not kept */
} cf_resize_method;

typedef enum cf_pad_mode {
    CF_PAD_REFLECTION, /* fastai's default: mirror without repeating the edge */
    CF_PAD_ZEROS,
    CF_PAD_BORDER, /* repeat the edge pixel */
} cf_pad_mode;

/* A region of a w x h source image in pixels; it may reach outside (then padded). */
typedef struct cf_crop_box {
    int left, top, width, height;
} cf_crop_box;

/* Cuts box out of img (c planes of h x w), padding what lies outside with pad, and resizes it
 * to out_w x out_h with stb_image_resize's triangle filter (bilinear, averaging when it shrinks,
 * as PIL's BILINEAR that fastai uses). out holds c * out_h * out_w floats. */
cf_status cf_crop_pad_resize(const float *img, int c, int h, int w, cf_crop_box box,
                             cf_pad_mode pad, int out_w, int out_h, float *out);

typedef enum cf_item_tfm_kind {
    CF_ITEM_TFM_NONE,
    CF_ITEM_TFM_RESIZE,              /* fastai's Resize(size, method, pad_mode) */
    CF_ITEM_TFM_RANDOM_RESIZED_CROP, /* RandomResizedCrop(size, min_scale, ratio, val_xtra) */
} cf_item_tfm_kind;

typedef struct cf_item_tfm {
    cf_item_tfm_kind kind;
    int width, height; /* output size */
    cf_resize_method method;
    cf_pad_mode pad_mode;
    /* RandomResizedCrop: area fraction in [min_scale, max_scale] (0.08, 1), log-uniform aspect
     * in [ratio_lo, ratio_hi] (3/4, 4/3); validation: squish to size + ceil(size * val_xtra / 8)
     * * 8 (val_xtra 0.14), then a centre crop */
    float min_scale, max_scale, ratio_lo, ratio_hi, val_xtra;
} cf_item_tfm;

/* fastai's defaults for Resize(size, method) and RandomResizedCrop(size). */
cf_item_tfm cf_resize_tfm(int size, cf_resize_method method);
cf_item_tfm cf_random_resized_crop_tfm(int size, float min_scale);
/* The source region the transform takes from a w x h image, as fastai computes it (train: drawn
 * from (seed, epoch, item); valid: the deterministic choice). For RandomResizedCrop in
 * validation the region is the whole image (then resized to size + extra and centre-cropped by
 * cf_item_tfm_apply). */
cf_crop_box cf_item_tfm_box(const cf_item_tfm *t, int w, int h, bool train, uint64_t seed,
                            int epoch, int64_t item);
/* Decodes one PNG/JPEG/BMP image from memory at its own size and applies the transform
 * (as cf_image_decode, then cf_item_tfm_apply); out holds channels * height * width floats. */
cf_status cf_image_decode_tfm(const void *bytes, size_t n, const char *name, int channels,
                              const cf_item_tfm *t, bool train, uint64_t seed, int epoch,
                              int64_t item, float *out);
/* Applies the transform to one image: out holds c * t->height * t->width floats. */
cf_status cf_item_tfm_apply(const cf_item_tfm *t, const float *img, int c, int h, int w, bool train,
                            uint64_t seed, int epoch, int64_t item, float *out);

/* fastai's aug_transforms(), defaults from cf_aug_transforms_defaults(): one combined affine
 * resample per image, then brightness and contrast. Training loaders only, as fastai. */
typedef struct cf_aug_opts {
    bool do_flip;         /* true: Flip(p=0.5), horizontal */
    bool flip_vert;       /* true: Dihedral(p=0.5) instead (the 8 flips/rotations by 90 degrees) */
    float max_rotate;     /* 10 degrees, drawn uniform in [-max, max] */
    float min_zoom;       /* 1 */
    float max_zoom;       /* 1.1 */
    float max_lighting;   /* 0.2: brightness uniform in 0.5 * (1 -+ max), contrast log-uniform in
                             [1 - max, 1 / (1 - max)] */
    float max_warp;       /* 0.2: perspective warp, corner moves uniform in [-max, max] */
    float p_affine;       /* 0.75: probability of each of rotate, zoom, warp */
    float p_lighting;     /* 0.75: probability of each of brightness, contrast */
    cf_pad_mode pad_mode; /* reflection */
} cf_aug_opts;

/* fastai's defaults; mult scales max_rotate, max_lighting and max_warp (aug_transforms' mult). */
cf_aug_opts cf_aug_transforms_defaults(float mult);

/* What was drawn for one item, and the transform it gives. */
typedef struct cf_aug_params {
    /* draws (for tests and show_batch): flip -1/1, dihedral index 0..7, rotation in degrees,
     * zoom scale (1 / zoom factor as fastai's s), zoom centre (col, row) in [0, 1), warp
     * magnitudes, brightness change (0.5 neutral), contrast change (1 neutral) */
    float flip;
    int dihedral;
    float rotate_deg, zoom, col_pct, row_pct, warp_x, warp_y, brightness, contrast;
    /* the result: mat maps output grid coordinates (x, y in [-1, 1], corners aligned) to source
     * coordinates, after fastai's _prepare_mat aspect correction; warp (8 perspective
     * coefficients, fastai's find_coeffs) is applied to those when has_warp */
    float mat[2][3];
    bool has_affine, has_warp, has_lighting;
    double warp[8];
} cf_aug_params;

/* Draws item's parameters for an h x w image from (seed, epoch, item). */
void cf_aug_draw(const cf_aug_opts *o, uint64_t seed, int epoch, int64_t item, int h, int w,
                 cf_aug_params *out);
/* out = the augmented image (c planes of h x w); in and out must not overlap. */
void cf_aug_apply(const cf_aug_params *p, cf_pad_mode pad, const float *in, int c, int h, int w,
                  float *out);

/* ---- DataLoaders --------------------------------------------------------------------------- */

typedef enum cf_shard_mode {
    CF_SHARD_PER_RANK,    /* each rank takes its contiguous chunk of the padded permutation and
                             batches it with bs (global batch = bs * world) */
    CF_SHARD_SPLIT_BATCH, /* each global batch of bs is cut into world slices (results equal
                             one process) */
} cf_shard_mode;

typedef struct cf_batch {
    cf_tensor x;        /* (B, ...) */
    cf_tensor y;        /* (B) or (B, target_dim) */
    const int64_t *idx; /* dataset index of each sample */
    const bool *pad;    /* true for samples that are wrap-around padding (sharding) */
    int size;           /* B */
    int n_real;         /* samples that are not padding */
    int global_size;    /* CF_SHARD_SPLIT_BATCH: real samples in the whole global batch (sum of
                           n_real over ranks); otherwise n_real */
} cf_batch;

typedef struct cf_dataloader cf_dataloader;

typedef struct cf_dl_options {
    int bs;         /* 64 */
    bool shuffle;   /* train: true */
    bool drop_last; /* train: true */
    uint64_t seed;  /* order: seed + epoch; augmentation: (seed, epoch, sample index) */
    /* augmentation (image datasets): random crop after zero padding, horizontal flip */
    int crop_pad; /* 0: off */
    bool flip;
    bool mirror; /* every image mirrored left to right, no draw (flip TTA's pass; beats flip) */
    /* normalisation of image channels: mean/std per channel, n_norm channels (0: none; 1:
     * the same for every channel) */
    int n_norm;
    float mean[4], std[4];
    int prefetch; /* batches prepared ahead by the background thread (>= 2; 0: default 3;
                     < 0: no thread, batches are made in next()) */
    /* fastai's batch transforms (aug_transforms) for image datasets, drawn per sample from
     * (seed, epoch, sample index), applied before normalisation (NULL: none; copied) */
    const cf_aug_opts *aug;
} cf_dl_options;

/* A loader over ds (borrowed; must outlive the loader). Buffers for `prefetch` batches are
 * allocated here; iterating allocates nothing. A streamed file that fails fails that batch's
 * next() naming it. No loader thread lives between epochs, so forking there is safe.
 * Threads and fork: docs/api.md. */
cf_status cf_dataloader_new(const cf_dataset *ds, const cf_dl_options *opt, cf_dataloader **out);
void cf_dataloader_free(cf_dataloader *dl);
/* Batches per epoch for this rank, as fastai computes it (n//bs + (n%bs && !drop_last)), where
 * n is this rank's chunk for CF_SHARD_PER_RANK. */
int64_t cf_dataloader_len(const cf_dataloader *dl);
/* Shard for data-parallel training (world 1 = off), from the next begin_epoch. PER_RANK: each
 * rank a contiguous chunk of the padded permutation; SPLIT_BATCH: each global batch cut across
 * ranks (weight by n_real / global_size to reproduce one process). Details: docs/api.md. */
cf_status cf_dataloader_set_shard(cf_dataloader *dl, int rank, int world, cf_shard_mode mode);
/* Starts an epoch: draws the permutation from seed + epoch. Prefetching starts with the first
 * cf_dataloader_next. */
cf_status cf_dataloader_begin_epoch(cf_dataloader *dl, int epoch);
/* Moves the epoch just started (before its first next) to batch `batch`, as if the earlier ones
 * had been read. CF_ERR_STATE after the first next; CF_ERR_INVALID outside [0, len]. */
cf_status cf_dataloader_seek(cf_dataloader *dl, int64_t batch);
/* The next batch, or *batch = NULL at the end of the epoch. The batch stays valid until the
 * next call. */
cf_status cf_dataloader_next(cf_dataloader *dl, const cf_batch **batch);
const cf_dataset *cf_dataloader_dataset(const cf_dataloader *dl);
/* Samples this loader left out of its batches (bad files of a streamed set with skip_bad),
 * counted every time one is left out, since the loader was made. */
int64_t cf_dataloader_skipped(const cf_dataloader *dl);
const cf_dl_options *cf_dataloader_options(const cf_dataloader *dl);
/* Sets the channel normalisation (n_norm 1 or the samples' channels; 0 removes it) for the
 * batches made from the next epoch on; CF_ERR_STATE during an epoch. */
cf_status cf_dataloader_set_normalize(cf_dataloader *dl, int n_norm, const float *mean,
                                      const float *std);

/* fastai's DataLoaders: a training and a validation loader over their datasets. */
typedef struct cf_dls {
    cf_dataset *train_ds, *valid_ds; /* owned */
    cf_dataloader *train, *valid;    /* owned */
    /* text data made by cf_text_dls_from_folder / from_csv: the tokenizer and vocabulary (owned,
     * freed with the DataLoaders); NULL otherwise */
    struct cf_text_numericalizer *text_nz;
    void (*free_text_nz)(struct cf_text_numericalizer *nz); /* private: frees text_nz */
} cf_dls;

typedef struct cf_dls_options {
    int bs, val_bs; /* 64; val_bs 0 = bs */
    uint64_t seed;
    int crop_pad; /* augmentation of the training set */
    bool flip;
    bool normalize; /* true: statistics from the training set unless given (n_norm > 0) */
    int n_norm;     /* given statistics (used whenever n_norm > 0) */
    float mean[4], std[4];
    int prefetch; /* as cf_dl_options.prefetch */
    /* fastai's dls.train.n / dls.valid.n: use only the first n_train training and n_valid
     * validation samples (0: all), e.g. for a quick run */
    int64_t n_train, n_valid;
    const cf_aug_opts *aug; /* batch transforms of the training set (NULL: none) */
} cf_dls_options;

/* Takes ownership of both datasets (also on failure). Train: shuffle + drop_last; valid: in
 * order, not dropped. */
cf_status cf_dls_new(cf_dataset *train, cf_dataset *valid, const cf_dls_options *opt, cf_dls **out);
/* Fashion-MNIST style folder: train-images-idx3-ubyte(.gz) etc.; t10k files are validation.
 * When the folder's name holds "fashion" (any case) and there are 10 classes, the vocabulary is
 * Fashion-MNIST's class names (cf_fashion_mnist_classes), else "0", "1", ... */
extern const char *const cf_fashion_mnist_classes[10];
cf_status cf_dls_from_idx_dir(const char *dir, const cf_dls_options *opt, cf_dls **out);
/* ImageDataLoaders.from_folder. */
cf_status cf_dls_from_image_folder(const char *root, const cf_image_folder_options *iopt,
                                   const cf_dls_options *opt, cf_dls **out);
/* TabularDataLoaders.from_csv (augmentation and image normalisation options are ignored). */
cf_status cf_dls_from_csv(const char *path, const cf_tabular_options *topt,
                          const cf_dls_options *opt, cf_dls **out);
void cf_dls_free(cf_dls *dls);

/* ---- text: tokenizer and vocabulary ------------------------------------------------------
 * fastai's text pipeline up to token ids: the eight rules, a spaCy-like English splitter,
 * corpora tokenized on every core and cached on disk, and the vocabulary (Numericalize). Text is
 * UTF-8; invalid bytes or NUL are an error naming source and offset (or U+FFFD with
 * replace_invalid). Splitter rules and Unicode details: docs/text.md and docs/api.md. */

/* fastai's special tokens, in vocabulary order (ids 0-8). */
#define CF_TEXT_N_SPECIAL 9
extern const char *const cf_text_special_tokens[CF_TEXT_N_SPECIAL];
enum {
    CF_TEXT_UNK = 0, /* xxunk: unknown word */
    CF_TEXT_PAD,     /* xxpad: padding (pad_idx 1) */
    CF_TEXT_BOS,     /* xxbos: start of every text */
    CF_TEXT_EOS,     /* xxeos: end of text (only with add_eos) */
    CF_TEXT_FLD,     /* xxfld: next field of a multi-column text */
    CF_TEXT_REP,     /* xxrep: repeated character */
    CF_TEXT_WREP,    /* xxwrep: repeated word */
    CF_TEXT_UP,      /* xxup: the next word was all capitals */
    CF_TEXT_MAJ,     /* xxmaj: the next word was capitalised */
};

/* fastai's rules, in order; bit (1 << rule) of cf_text_tok_options.skip_rules skips one. */
typedef enum cf_text_rule {
    CF_TEXT_FIX_HTML = 0,
    CF_TEXT_REPLACE_REP,
    CF_TEXT_REPLACE_WREP,
    CF_TEXT_SPEC_ADD_SPACES,
    CF_TEXT_RM_USELESS_SPACES,
    CF_TEXT_REPLACE_ALL_CAPS,
    CF_TEXT_REPLACE_MAJ,
    CF_TEXT_LOWERCASE, /* also adds xxbos (and xxeos) */
    CF_TEXT_N_RULES
} cf_text_rule;
extern const char *const cf_text_rule_names[CF_TEXT_N_RULES]; /* "fix_html", ... */

typedef enum cf_text_splitter {
    CF_TEXT_SPLIT_SPACY = 0, /* SpacyTokenizer's English rules (above) */
    CF_TEXT_SPLIT_SPACES,    /* BaseTokenizer: split on ' ' only */
} cf_text_splitter;

/* The tokenizer's settings; all zero = fastai's defaults. They travel with a model
 * (cf_text_tok_options_to_json) so that prediction tokenizes as training did. */
typedef struct cf_text_tok_options {
    unsigned skip_rules;  /* bits (1 << cf_text_rule) of rules not to run; 0: all eight */
    bool no_bos;          /* the lowercase rule does not prefix xxbos */
    bool add_eos;         /* the lowercase rule appends xxeos */
    bool replace_invalid; /* invalid UTF-8 and NUL bytes become U+FFFD instead of an error */
    cf_text_splitter splitter;
} cf_text_tok_options;

/* A list of tokens: token i is the NUL-terminated string data + start[i]. */
typedef struct cf_text_tokens {
    char *data;
    int64_t *start;
    int64_t n;
    size_t len, cap; /* bytes used and allocated in data */
    int64_t start_cap;
} cf_text_tokens;

static inline const char *cf_text_token(const cf_text_tokens *toks, int64_t i) {
    return toks->data + toks->start[i];
}
/* Appends one token (len bytes, copied; it should hold no NUL). */
cf_status cf_text_tokens_push(cf_text_tokens *toks, const char *token, size_t len);
/* Empties the list, keeping its memory. */
void cf_text_tokens_clear(cf_text_tokens *toks);
/* Frees the list's memory and zeroes it (the struct itself is the caller's). */
void cf_text_tokens_free(cf_text_tokens *toks);

/* Runs fastai's rules on text (len bytes; `source` names it in errors, e.g. a file name) and
 * gives the result as a new NUL-terminated UTF-8 string (*out, free with cf_free; *out_len
 * bytes). opt NULL: defaults. */
cf_status cf_text_apply_rules(const char *text, size_t len, const char *source,
                              const cf_text_tok_options *opt, char **out, size_t *out_len);
/* The rules, then the splitter: appends the tokens of text to *toks (which starts zeroed or
 * cleared). Errors: CF_ERR_FORMAT for bytes that are not UTF-8, naming source and offset. */
cf_status cf_text_tokenize(const char *text, size_t len, const char *source,
                           const cf_text_tok_options *opt, cf_text_tokens *toks);

/* The settings as a JSON object (a new string, free with cf_free), and back. from_json refuses
 * (CF_ERR_FORMAT, naming source) a tokenizer or field it does not know. */
cf_status cf_text_tok_options_to_json(const cf_text_tok_options *opt, char **json);
cf_status cf_text_tok_options_from_json(const char *json, size_t len, const char *source,
                                        cf_text_tok_options *opt);

/* Token counts in first-seen order (Python's Counter). */
typedef struct cf_text_counter cf_text_counter;
cf_text_counter *cf_text_counter_new(void); /* NULL when out of memory */
void cf_text_counter_free(cf_text_counter *counter);
cf_status cf_text_counter_add(cf_text_counter *counter, const cf_text_tokens *toks);
/* Adds src's counts to dst; words new to dst are appended in src's order. */
cf_status cf_text_counter_merge(cf_text_counter *dst, const cf_text_counter *src);
int64_t cf_text_counter_len(const cf_text_counter *counter);                 /* distinct words */
const char *cf_text_counter_word(const cf_text_counter *counter, int64_t i); /* i-th seen */
int64_t cf_text_counter_count(const cf_text_counter *counter, int64_t i);
int64_t cf_text_counter_get(const cf_text_counter *counter, const char *word); /* 0 if unseen */

/* Tokenizes n in-memory texts on every core (fastai's Tokenizer.from_df): *per_text receives a
 * new array of n token lists (free each with cf_text_tokens_free, then the array with cf_free)
 * and *counts, when not NULL, their counts (texts in order). sources[i] (or NULL: "text <i>")
 * names text i in errors; the first failing text's error is returned. */
cf_status cf_text_tokenize_texts(const char *const *texts, const size_t *lens,
                                 const char *const *sources, int64_t n,
                                 const cf_text_tok_options *opt, cf_text_tokens **per_text,
                                 cf_text_counter **counts);

/* A tokenized corpus of files (fastai's Tokenizer.from_folder): counts and lengths, with each
 * file's tokens kept in a cache file, read back with cf_text_tok_files_tokens. */
typedef struct cf_text_tok_files_options {
    cf_text_tok_options tok;
    /* Folder of the tokenized copies (made if missing), e.g. "<path>_tok" as fastai does. A
     * copy is reused while its source keeps its size and modification time and the tokenizer's
     * settings are the same; else the file is tokenized again and the copy replaced (written
     * atomically). NULL: no cache; cf_text_tok_files_tokens then tokenizes again. */
    const char *cache_dir;
    int num_workers;       /* threads; 0: cf_get_num_threads() (every core) */
    size_t max_file_bytes; /* a larger file is refused; 0: 1 GiB */
} cf_text_tok_files_options;

typedef struct cf_text_tok_files {
    int64_t n;               /* files */
    char **paths;            /* the sources, as given */
    int64_t *lens;           /* tokens per file */
    cf_text_counter *counts; /* all files' tokens, files in order */
    int64_t n_reused;        /* files whose cached copy was valid */
    cf_text_tok_options tok;
    char *cache_dir; /* NULL when not cached */
} cf_text_tok_files;

/* Tokenizes each file (one text per file) on every core. Errors name the first failing file
 * (in order) and its byte offset. */
cf_status cf_text_tokenize_files(const char *const *paths, int64_t n,
                                 const cf_text_tok_files_options *opt, cf_text_tok_files **out);
/* File i's tokens, appended to *toks: read from its cached copy (checked again against the
 * source), else tokenized again. */
cf_status cf_text_tok_files_tokens(const cf_text_tok_files *corpus, int64_t i,
                                   cf_text_tokens *toks);
void cf_text_tok_files_free(cf_text_tok_files *corpus);

/* fastai's vocabulary (make_vocab and Numericalize). */
typedef struct cf_text_vocab cf_text_vocab;
typedef struct cf_text_vocab_options {
    int64_t min_freq;  /* a word needs this many occurrences; 0: 3 */
    int64_t max_vocab; /* at most this many words before the xxfake padding; 0: 60000 */
} cf_text_vocab_options;
/* make_vocab: the max_vocab most common words (count descending, ties in first-seen order)
 * with count >= min_freq; the special tokens moved (or added) to ids 0-8; cut to max_vocab;
 * then 1-8 "xxfake" so that the length is a multiple of 8. */
cf_status cf_text_vocab_new(const cf_text_counter *counts, const cf_text_vocab_options *opt,
                            cf_text_vocab **out);
/* A given vocabulary, used verbatim (fastai's text_vocab); a repeated word maps to its last
 * id, as in fastai. */
cf_status cf_text_vocab_from_words(const char *const *words, int64_t n, cf_text_vocab **out);
void cf_text_vocab_free(cf_text_vocab *vocab);
int64_t cf_text_vocab_len(const cf_text_vocab *vocab);
const char *cf_text_vocab_word(const cf_text_vocab *vocab, int64_t id); /* NULL if out of range */
/* The id of word: unknown words and xxfake give CF_TEXT_UNK (0). */
int64_t cf_text_vocab_id(const cf_text_vocab *vocab, const char *word);
/* ids[i] = the id of token i (toks->n of them); *n_unknown (when not NULL) counts the tokens
 * that were not in the vocabulary. */
void cf_text_numericalize(const cf_text_vocab *vocab, const cf_text_tokens *toks, int64_t *ids,
                          int64_t *n_unknown);
/* The vocabulary as a JSON array of strings (a new string, free with cf_free), and back; from
 * JSON refuses (CF_ERR_FORMAT, naming source and the element) anything but an array of
 * strings. */
cf_status cf_text_vocab_to_json(const cf_text_vocab *vocab, char **json);
cf_status cf_text_vocab_from_json(const char *json, size_t len, const char *source,
                                  cf_text_vocab **out);

/* ---- text: corpora and DataLoaders ------------------------------------------------------- *
 * fastai's TextDataLoaders: the language-model stream (LMDataLoader) and length-sorted classifier
 * batches (SortedDL), as cf_dataloader / cf_batch. x (B, T) token ids as floats; y (B, T) next ids
 * or class codes / multi-hot. */

/* The special tokens' ids (CF_TEXT_UNK, CF_TEXT_PAD, CF_TEXT_BOS, ...) are those of the
 * tokenizer section above. */

/* Documents as token offsets and ids, in memory or in a memory-mapped id file (then memory does
 * not grow with the corpus: pages read are dropped from the mapping as reading moves on).
 * Labels are optional. Reference counted: loaders keep the corpus alive. */
typedef struct cf_text_corpus {
    int64_t n_docs, n_tokens;
    const int64_t *offsets; /* n_docs + 1; document d is ids[offsets[d] .. offsets[d + 1]) */
    const int32_t *ids;     /* n_tokens ids in [0, vocab_size) */
    int32_t vocab_size;
    int target_dim; /* 0: no labels; 1: class codes; n_classes: multi-hot (multi-label) */
    float *targets; /* n_docs * target_dim */
    int n_classes;  /* label vocabulary (sorted, as fastai's Categorize / MultiCategorize) */
    char **classes;
    char *source;                /* where it came from (for messages) */
    struct cf_text_store *store; /* private: memory or mapping, reference count */
} cf_text_corpus;

/* A corpus in memory from n_docs documents of lens[d] ids each, docs[d] (copied). Every id must
 * be in [0, vocab_size). */
cf_status cf_text_corpus_from_docs(const int32_t *const *docs, const int64_t *lens, int64_t n_docs,
                                   int32_t vocab_size, cf_text_corpus **out);
/* Sets (copies) the labels: n_docs * target_dim targets, n_classes names. */
cf_status cf_text_corpus_set_labels(cf_text_corpus *c, const float *targets, int target_dim,
                                    int n_classes, const char *const *classes);
/* The documents idx[0..n) of c, in that order, as a new corpus in memory (labels copied). */
cf_status cf_text_corpus_subset(const cf_text_corpus *c, const int64_t *idx, int64_t n,
                                cf_text_corpus **out);
/* Drops a reference (the last frees; NULL is a no-op). */
void cf_text_corpus_free(cf_text_corpus *c);
/* Copies n ids of document doc from position `from` into out (range-checked); in a mapped
 * corpus, pages already read are given back as reading goes on. */
cf_status cf_text_corpus_read(const cf_text_corpus *c, int64_t doc, int64_t from, int64_t n,
                              int32_t *out);

/* Id files: "CFTEXTID" magic, u32 version 1, i32 vocab_size, u64 n_docs, u64 n_tokens (little
 * endian), then n_tokens int32 ids, then (from the next multiple of 8 bytes) n_docs + 1 int64
 * offsets (0 first, n_tokens last, non-decreasing). Written document by document (the ids are not
 * held in memory), atomically (a temporary file renamed over path at close). */
typedef struct cf_text_idfile_writer cf_text_idfile_writer;
cf_status cf_text_idfile_open(const char *path, int32_t vocab_size, cf_text_idfile_writer **out);
cf_status cf_text_idfile_add(cf_text_idfile_writer *w, const int32_t *ids, int64_t n);
/* Finishes the file (or, with abandon, removes the temporary file); frees w either way. */
cf_status cf_text_idfile_close(cf_text_idfile_writer *w, bool abandon);
/* Writes a corpus's documents (not its labels) as an id file. */
cf_status cf_text_corpus_write(const cf_text_corpus *c, const char *path);
/* Maps an id file read-only. The header, the sizes against the file, the offsets and every id
 * (against vocab_size) are checked first; the error names the file, the byte offset and the
 * value. */
cf_status cf_text_corpus_map(const char *path, cf_text_corpus **out);

/* Options of the text loaders (cf_dl_options gives bs, shuffle, drop_last, seed). */
typedef struct cf_text_dl_options {
    int seq_len;   /* 72: language-model sequence length; classifier padding chunk */
    int pad_idx;   /* CF_TEXT_PAD (1) */
    bool pad_last; /* false: fastai's pad_first=True (pad chunks before the text) */
} cf_text_dl_options;

/* fastai's LMDataLoader over the corpus (retained): the documents concatenated (shuffled per
 * epoch), cut into bs rows read seq_len tokens a batch; y is x shifted by one. Sharded ranks
 * together read exactly one process's batches. Layout: docs/api.md. */
cf_status cf_text_lm_loader_new(cf_text_corpus *c, const cf_dl_options *opt,
                                const cf_text_dl_options *topt, cf_dataloader **out);
/* fastai's SortedDL + Pad_Chunk over a labelled corpus (retained): batches of similar-length
 * documents, longest first, padded in seq_len chunks at the front (pad_last: at the end). idx
 * holds document indices (get_preds order). Order, padding and sharding: docs/api.md. */
cf_status cf_text_clas_loader_new(cf_text_corpus *c, const cf_dl_options *opt,
                                  const cf_text_dl_options *topt, cf_dataloader **out);
/* The document order of an epoch: identity, or cf_rng_shuffle with cf_rng seeded seed + epoch. */
cf_status cf_text_epoch_order(int64_t n, bool shuffle, uint64_t seed, int epoch, int64_t *order);
/* Whether the loader is a text loader, and over which corpus (NULL otherwise). */
const cf_text_corpus *cf_text_loader_corpus(const cf_dataloader *dl);
bool cf_text_loader_is_lm(const cf_dataloader *dl);
/* A loader of the same kind over the same data with other options (e.g. get_preds' ordered
 * loader: no shuffle, no drop_last); for image and tabular loaders cf_dataloader_new on the
 * same dataset. The shard is not copied. */
cf_status cf_dataloader_new_like(const cf_dataloader *like, const cf_dl_options *opt,
                                 cf_dataloader **out);

/* The seam where a tokenizer and vocabulary plug in. fit (may be NULL when the vocabulary is
 * already built) sees the training texts once; encode turns one raw text into ids (xxbos first,
 * as fastai), cf_malloc'd into *ids; token names an id (for show_batch). */
typedef struct cf_text_numericalizer {
    void *ctx;
    cf_status (*fit)(void *ctx, const char *const *texts, int64_t n);
    cf_status (*encode)(void *ctx, const char *text, int32_t **ids, int64_t *n_ids);
    const char *(*token)(void *ctx, int32_t id);
    int32_t (*vocab_size)(void *ctx);
} cf_text_numericalizer;

/* Raw labelled texts as the readers find them. */
typedef struct cf_text_raw {
    int64_t n;
    char **texts; /* UTF-8 */
    char **where; /* the file, or "file.csv:line", of each text (for messages) */
    bool *is_valid;
    int target_dim; /* 1: class codes; n_classes: multi-hot; 0: unlabelled */
    float *targets; /* n * target_dim */
    int n_classes;
    char **classes; /* sorted labels of the training texts */
} cf_text_raw;
void cf_text_raw_free(cf_text_raw *r);

typedef struct cf_text_folder_options {
    const char *train, *valid; /* "train", "valid" (GrandparentSplitter) */
    double valid_pct; /* > 0: every root/<label>/<name>.txt, RandomSplitter(valid_pct, seed) */
    uint64_t seed;
    bool unlabelled;   /* language models: labels are not needed (none checked) */
    int64_t max_bytes; /* largest file read (0: 64 MiB) */
} cf_text_folder_options;
/* fastai's TextDataLoaders.from_folder layout: root/{train,valid}/<label>/<name>.txt, or
 * root/<label>/<name>.txt with valid_pct; sorted order. Empty, binary or non-UTF-8 files and
 * unknown validation labels are refused naming the file. */
cf_status cf_text_read_folder(const char *root, const cf_text_folder_options *o, cf_text_raw **out);

typedef struct cf_text_csv_options {
    const char *text_col;          /* "text" */
    const char *const *label_cols; /* one column: single label, or split by label_delim; several
                                      columns of 0/1: multi-label, the columns are the classes */
    int n_label_cols;              /* 0: the column "label" */
    const char *label_delim;       /* NULL: single label */
    const char *valid_col;         /* NULL: valid_pct */
    double valid_pct;
    uint64_t seed;
    char delimiter; /* ',' */
} cf_text_csv_options;
/* fastai's TextDataLoaders.from_csv (cf_csv_read, a header row). A missing column, an empty
 * text, an unreadable boolean or label: refused with the file, line and value. */
cf_status cf_text_read_csv(const char *path, const cf_text_csv_options *o, cf_text_raw **out);
cf_status cf_text_read_csv_buffer(const char *text, size_t size, const char *name,
                                  const cf_text_csv_options *o, cf_text_raw **out);

/* The training (valid false) or validation texts of raw, numericalized through nz (fit must
 * have run), with their labels, as a corpus in memory. */
cf_status cf_text_corpus_from_raw(const cf_text_raw *raw, bool valid,
                                  const cf_text_numericalizer *nz, cf_text_corpus **out);

typedef struct cf_text_dls_options {
    int bs, val_bs; /* 64; val_bs 0 = bs */
    int seq_len;    /* 72 */
    uint64_t seed;
    bool is_lm;   /* language model (labels ignored) */
    int prefetch; /* as cf_dl_options.prefetch */
} cf_text_dls_options;
/* fastai's TextDataLoaders: training loader shuffled with drop_last, validation in order. Takes
 * a reference to each corpus (the caller still frees its own). The datasets (train_ds,
 * valid_ds) describe the corpora: n documents, the classes, target_dim, sample shape
 * (seq_len); they hold no samples. */
cf_status cf_text_dls_new(cf_text_corpus *train, cf_text_corpus *valid,
                          const cf_text_dls_options *o, cf_dls **out);
/* Readers' output -> nz->fit on the training texts -> corpora -> cf_text_dls_new. */
cf_status cf_text_dls_from_raw(const cf_text_raw *raw, const cf_text_numericalizer *nz,
                               const cf_text_dls_options *o, cf_dls **out);

/* Writes one token to out as text tables show it: line breaks, tabs and carriage returns as \n,
 * \t and \r, so a row stays one line and its columns stay apart. */
void cf_text_put_token(FILE *out, const char *tok);

/* fastai's show_batch for text: the first max_rows rows (0: 9) of a batch of a text loader,
 * each its first max_tokens tokens (0: 150) named by nz->token, padding left out as fastai's
 * decoding does (other special tokens as they are: xxbos, xxmaj, xxunk ...), then the label(s)
 * (classifier: category; language model: the shifted target, text_). Written as a table to out. */
cf_status cf_text_show_batch(const cf_dataloader *dl, const cf_batch *b,
                             const cf_text_numericalizer *nz, int max_rows, int max_tokens,
                             FILE *out);

/* ---- text: TextDataLoaders with fastai's tokenizer and vocabulary ------------------------- */

/* fastai's Tokenizer + Numericalize: encode tokenizes and maps unknown words to xxunk; fit makes
 * the vocabulary on every core unless text_vocab (copied, used as is) was given. NULL: defaults. */
cf_status cf_text_numericalizer_new(const cf_text_tok_options *tok,
                                    const cf_text_vocab_options *vocab_opt,
                                    const cf_text_vocab *text_vocab, cf_text_numericalizer **out);
/* Frees a numericalizer made by cf_text_numericalizer_new (anything else, NULL included: no-op). */
void cf_text_numericalizer_free(cf_text_numericalizer *nz);
/* The vocabulary and the tokenizer's settings of a numericalizer made by
 * cf_text_numericalizer_new (NULL for any other, and the vocabulary before fit): what an exported
 * text model carries. */
const cf_text_vocab *cf_text_numericalizer_vocab(const cf_text_numericalizer *nz);
const cf_text_tok_options *cf_text_numericalizer_tok(const cf_text_numericalizer *nz);

typedef struct cf_text_loaders_options {
    cf_text_dls_options dls;         /* bs 64, seq_len 72, is_lm, seed */
    cf_text_tok_options tok;         /* fastai's tokenizer (all zero: defaults) */
    cf_text_vocab_options vocab;     /* min_freq 3, max_vocab 60000 */
    const cf_text_vocab *text_vocab; /* given: used verbatim (copied), no vocabulary is made */
    /* from_folder: folder of the tokenized copies; NULL: "<path>_tok" (fastai's), "": none */
    const char *cache_dir;
    int num_workers; /* tokenizer threads; 0: every core */
} cf_text_loaders_options;

/* fastai's TextDataLoaders.from_folder: texts of cf_text_read_folder tokenized on every core
 * (cached in "<path>_tok"), vocabulary from every file, then cf_text_dls_new's loaders.
 * dls->text_nz holds the tokenizer and vocabulary. */
cf_status cf_text_dls_from_folder(const char *path, const cf_text_folder_options *fo,
                                  const cf_text_loaders_options *o, cf_dls **out);
/* fastai's TextDataLoaders.from_csv(path, text_col, label_col, valid_col, valid_pct 0.2, seed,
 * label_delim, text_vocab, is_lm, seq_len, bs): the rows of cf_text_read_csv tokenized on every
 * core (fastai's Tokenizer.from_df keeps no copy on disk), the vocabulary from every row's
 * counts; valid_pct 0 without valid_col means fastai's 0.2. */
cf_status cf_text_dls_from_csv(const char *path, const cf_text_csv_options *co,
                               const cf_text_loaders_options *o, cf_dls **out);

/* fastai's decode_spec_tokens joined with spaces into *out (free with cf_free): xxbos, xxpad
 * dropped; xxmaj, xxup, xxrep, xxwrep applied (a repetition applies to its one token). */
cf_status cf_text_decode_spec_tokens(const char *const *tokens, int64_t n, char **out);

#ifdef __cplusplus
}
#endif
#endif
