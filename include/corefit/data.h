/* corefit/data.h — datasets, transforms, splitters and DataLoaders with fastai's defaults,
 * sharding for data-parallel training, and a background thread that prepares batches ahead.
 *
 * Samples are float32: images (C, H, W) scaled to [0, 1] (then normalised), tabular rows
 * (n_cat codes as floats, then n_cont values). Targets are floats: class codes for classifiers,
 * values for regression.
 *
 * Option structs: a field left 0 / NULL / false takes fastai's default (noted per field), so
 * `&(cf_dls_options){.bs = 128}` reads like keyword arguments.
 *
 * Readers validate everything they read (magic numbers, sizes against the file, counts, values)
 * before trusting it. On failure they return a status, set cf_last_error() to a message naming
 * the file, the line or byte offset and the value, leave *out NULL and free all they built. */
#ifndef COREFIT_DATA_H
#define COREFIT_DATA_H

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
 * JPEG files are decoded with libjpeg-turbo when corefit is built with it (libjpeg62-turbo-dev;
 * CF_HAVE_JPEG), PNG and BMP with stb_image. On W3's 128-160 px RGB JPEGs libjpeg-turbo decodes
 * 1.3x as fast as stb_image (bench/bench_decode; bench/README.md). */

/* How an image set's pixels are held. */
typedef enum cf_image_load {
    /* CF_IMAGE_LOAD_STREAM when the decoded set (n x C x H x W floats) would take more than
     * CF_IMAGE_MEMORY_BUDGET bytes or more than a quarter of the memory this process may use
     * (ulimit -v / -d, physical memory), or when it is a training set with a RandomResizedCrop
     * item transform (drawn anew each epoch, as fastai does, only when streamed); else
     * CF_IMAGE_LOAD_MEMORY: a set that fits is faster decoded once (each later epoch copies
     * floats instead of decoding files again). */
    CF_IMAGE_LOAD_AUTO,
    CF_IMAGE_LOAD_MEMORY, /* decode every image up front into one float array (ds->x) */
    /* Keep only the file names and labels; the loaders decode each image when a batch needs it,
     * on `decode_threads` threads, at most prefetch + 1 batches ahead: memory does not grow
     * with the number of images. Training images get their item transform drawn anew every
     * epoch from (seed, epoch, index) (fastai's RandomResizedCrop/Resize), where an up-front
     * set keeps epoch 0's region. Same batches for any decode_threads. */
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
    /* fastai's item transform (cf_resize_tfm, cf_random_resized_crop_tfm), applied as each
     * image is decoded; the data set holds the transform's size (`size` is then unused).
     * Training images get the region drawn from (seed, epoch 0, index in the training set),
     * validation images fastai's validation choice. Images decoded once keep that one region
     * for every epoch. NULL: none. */
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

/* fastai's ImageDataLoaders.from_csv: a CSV with a header row lists one image a row. fn_col
 * names the column of file names (NULL: the first column), relative to `folder` (NULL: the
 * CSV's own folder; a relative folder is taken from the CSV's folder), label_col the class
 * (NULL: the second column). valid_col (NULL: none) names a column of booleans (1/0, true/false,
 * True/False) marking the validation rows; without it opt->valid_pct splits at random, and with
 * neither every row is training. The classes are the sorted labels of the training rows; a
 * validation label outside them is refused with its line. Loading (up front or streamed) and
 * decoding follow opt as for folders (opt->train/valid are unused). */
cf_status cf_datasets_from_image_csv(const char *csv_path, const char *folder, const char *fn_col,
                                     const char *label_col, const char *valid_col,
                                     const cf_image_folder_options *opt, cf_dataset **train,
                                     cf_dataset **valid);
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
void cf_csv_table_free(cf_csv_table *table);
/* The index of the first column named `name` (exactly), or -1. */
int cf_csv_column(const cf_csv_table *table, const char *name);

/* ---- tabular processing (src/data/tabular.c) ------------------------------------------------ */

/* True for the strings pandas reads as missing ("", "NA", "NaN", "null", "#N/A", ...). */
bool cf_csv_is_missing(const char *s);

/* fastai's TabularPandas with procs [Categorify, FillMissing, Normalize]:
 * - categorical columns get a sorted vocabulary of the training values (numerically sorted when
 *   every value is a number) with "#na#" at code 0; missing and unseen values get code 0;
 * - continuous columns with missing values in the training set are filled with the training
 *   median and get a `<name>_na` categorical flag (vocab #na#, false, true: codes 1 and 2)
 *   appended after the caller's categorical columns (missing values in other columns, seen only
 *   in validation, are filled with the median too, without a flag);
 * - continuous columns are normalised with the training mean and std (ddof 0, + 1e-7).
 * Missing values: empty fields and pandas' NA strings (NA, NaN, nan, null, NULL, None, N/A, n/a,
 * #N/A, <NA>, ...). The target is a class (vocab sorted, no #na#) or a float (regression); a
 * missing target is refused. */
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

/* fastai's aug_transforms(): options with fastai's defaults from cf_aug_transforms_defaults().
 * The flip/dihedral, rotation and zoom matrices are multiplied (in that order) and the warp is
 * applied to the grid they give, so each image is sampled once (bilinear, pad_mode, corners
 * aligned) as fastai's combined AffineCoordTfm does; brightness and contrast then act on the
 * logits (sigmoid((logit(x) + logit(b)) * c)). Training loaders only, as fastai. */
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

/* Samples of a streamed set (ds->files) are decoded by the set's decode_threads threads, which
 * take the samples of the batches ahead in order, each into its place in the batch, so that
 * at most prefetch + 1 batches are held whatever the data set's size; with prefetch < 0 the
 * samples are decoded in next(). A file that fails fails that batch's next() with the error
 * naming it (the first failing sample of the batch), unless the set skips bad files.
 *
 * The loader keeps a pointer to ds (not owned; it must outlive the loader). Buffers for
 * `prefetch` batches are allocated here; iterating allocates nothing per batch.
 *
 * Threads: the prefetch thread is started lazily by the first cf_dataloader_next of an epoch,
 * in the process that iterates, and is joined when the epoch ends (next returns NULL), at the
 * next begin_epoch and in free. So no loader thread lives between epochs, and a fork between
 * epochs is safe. A process forked in the middle of an epoch notices (getpid) on its next call,
 * re-creates the loader's lock and condition variables and restarts production from the batch
 * it is at (batches are a pure function of seed, epoch and position, so nothing changes). */
cf_status cf_dataloader_new(const cf_dataset *ds, const cf_dl_options *opt, cf_dataloader **out);
void cf_dataloader_free(cf_dataloader *dl);
/* Batches per epoch for this rank, as fastai computes it (n//bs + (n%bs && !drop_last)), where
 * n is this rank's chunk for CF_SHARD_PER_RANK. */
int64_t cf_dataloader_len(const cf_dataloader *dl);
/* Shard for data-parallel training (world 1 = off). Takes effect at the next begin_epoch.
 *
 * CF_SHARD_PER_RANK: every rank draws the same permutation (seed + epoch; identity without
 * shuffle), pads it to total = ceil(n/world)*world with perm[i % n] (pad = true), and takes the
 * contiguous chunk [rank*total/world, (rank+1)*total/world); batches of bs from the chunk
 * (drop_last applies to the chunk).
 *
 * CF_SHARD_SPLIT_BATCH: global batches of bs are drawn from the whole permutation as one process
 * would draw them (same count, same drop_last); a global batch of B rows is cut so that rank r
 * takes rows [r*B/world, (r+1)*B/world) (integer division: slices differ by at most one row and
 * concatenating them in rank order gives the global batch). A rank whose slice would be empty
 * (B < world) gets one padding row (the global batch's first sample, pad = true, n_real 0).
 * Weight losses/gradients by n_real / global_size to reproduce one process. */
cf_status cf_dataloader_set_shard(cf_dataloader *dl, int rank, int world, cf_shard_mode mode);
/* Starts an epoch: draws the permutation from seed + epoch. Prefetching starts with the first
 * cf_dataloader_next. */
cf_status cf_dataloader_begin_epoch(cf_dataloader *dl, int epoch);
/* Moves the epoch just started (before its first cf_dataloader_next) to batch `batch` of
 * cf_dataloader_len's: the next call returns that batch, exactly as it would have come after
 * the ones skipped (batches are a pure function of seed, epoch and position), without making
 * the skipped ones. batch == len gives an epoch with nothing left. CF_ERR_STATE outside that
 * point, CF_ERR_INVALID for a batch outside [0, len]. */
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

#ifdef __cplusplus
}
#endif
#endif
