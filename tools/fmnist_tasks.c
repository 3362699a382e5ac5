/* corefit fmnist-tasks: data sets for fastai's other vision tasks built from Fashion-MNIST
 * (Debian's fashion-mnist package), so that they need no download:
 *   multi-label  2x2 mosaics of 28 px garments (some tiles empty), labelled with the set of
 *                garment classes present: OUT/images/NNNNN.png and OUT/labels.csv
 *                (fname,labels,is_valid; labels space-delimited), fastai's from_csv layout
 *                with label_delim=' '.
 *   points       one garment placed at random on a larger blank canvas, the target its centre
 *                in pixels: OUT/images/NNNNN.png and OUT/points.csv (fname,x,y,is_valid).
 *   segmentation 1-3 garments placed at random on a larger blank canvas, later ones on top;
 *                OUT/images/NNNNN.png, OUT/labels/NNNNN_P.png (each pixel its garment's class
 *                + 1, background 0) and OUT/codes.txt: fastai's CamVid layout (label_func
 *                `path/'labels'/f'{o.stem}_P{o.suffix}'`).
 * Everything is drawn from --seed, so the same options write the same files. */
#include "corefit.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef CF_HAVE_STB
#include <stb_image_write.h>
#endif

/* Fashion-MNIST's classes, one word each so that a space can separate them in a label list. */
static const char *const garment_names[10] = {"tshirt", "trouser", "pullover", "dress", "coat",
                                              "sandal", "shirt",   "sneaker",  "bag",   "boot"};

typedef struct tasks_args {
    const char *data;
    int n, size;
    double valid_pct;
    uint64_t seed;
} tasks_args;

static void tasks_usage(FILE *f, const cli_opt *opts) {
    fprintf(f,
            "Usage: corefit fmnist-tasks multi-label|points|segmentation OUT [options]\n"
            "\n"
            "Writes a small image data set for another vision task from Fashion-MNIST's\n"
            "training images (no download):\n"
            "  multi-label  56x56 2x2 mosaics of garments, some tiles empty, labelled with the\n"
            "               classes present: OUT/images/*.png, OUT/labels.csv\n"
            "               (fname,labels,is_valid; labels separated by spaces)\n"
            "  points       one garment at random on a SIZE x SIZE canvas, the target its\n"
            "               centre in pixels: OUT/images/*.png, OUT/points.csv\n"
            "               (fname,x,y,is_valid)\n"
            "  segmentation 1-3 garments at random on a SIZE x SIZE canvas, later ones on\n"
            "               top: OUT/images/*.png, masks OUT/labels/*_P.png (pixel = class + 1,\n"
            "               background 0), OUT/codes.txt\n"
            "\nOptions:\n");
    cli_print_options(f, opts);
}

static int make_dir(const char *cmd, const char *path) {
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return cli_error(CLI_FAIL, cmd, "cannot create %s: %s", path, strerror(errno));
    return CLI_OK;
}

/* Copies garment g (28x28) into the canvas (w wide) at (left, top). */
static void paste(uint8_t *canvas, int w, const uint8_t *garment, int left, int top) {
    for (int y = 0; y < 28; y++)
        memcpy(canvas + (size_t)(top + y) * w + left, garment + y * 28, 28);
}

static bool write_png(const char *path, const uint8_t *px, int w, int h) {
#ifdef CF_HAVE_STB
    return stbi_write_png(path, w, h, 1, px, w) != 0;
#else
    (void)path, (void)px, (void)w, (void)h;
    return false;
#endif
}

/* Segmentation scenes: each garment's nonzero pixels drawn over the canvas and labelled in the
 * mask with its class + 1, so a later garment covers an earlier one where they overlap. */
static int write_segmentation(const char *cmd, const tasks_args *a, const char *out,
                              const cf_idx *images, const cf_idx *labels, int64_t n_garments) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/labels", out);
    int rc = make_dir(cmd, dir);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/codes.txt", out);
    FILE *f = fopen(path, "w");
    if (!f) return cli_error(CLI_FAIL, cmd, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "background\n");
    for (int c = 0; c < 10; c++) fprintf(f, "%s\n", garment_names[c]);
    if (fclose(f) != 0) return cli_error(CLI_FAIL, cmd, "writing %s failed", path);
    const int side = a->size;
    uint8_t *canvas = cf_malloc((size_t)side * side), *mask = cf_malloc((size_t)side * side);
    if (!canvas || !mask) {
        cf_free(canvas);
        cf_free(mask);
        return cli_error(CLI_FAIL, cmd, "out of memory");
    }
    cf_rng rng;
    cf_rng_seed(&rng, a->seed);
    for (int i = 0; i < a->n && rc == CLI_OK; i++) {
        memset(canvas, 0, (size_t)side * side);
        memset(mask, 0, (size_t)side * side);
        const int count = 1 + (int)cf_rng_below(&rng, 3);
        for (int k = 0; k < count; k++) {
            const int64_t g = (int64_t)cf_rng_below(&rng, (uint64_t)n_garments);
            const int left = (int)cf_rng_below(&rng, (uint64_t)(side - 28 + 1));
            const int top = (int)cf_rng_below(&rng, (uint64_t)(side - 28 + 1));
            const uint8_t *px = images->data + g * 784;
            for (int y = 0; y < 28; y++)
                for (int x = 0; x < 28; x++) {
                    if (!px[y * 28 + x]) continue;
                    const size_t o = (size_t)(top + y) * side + left + x;
                    canvas[o] = px[y * 28 + x];
                    mask[o] = (uint8_t)(labels->data[g] % 10 + 1);
                }
        }
        snprintf(path, sizeof path, "%s/images/%05d.png", out, i);
        if (!write_png(path, canvas, side, side)) {
            rc = cli_error(CLI_FAIL, cmd, "cannot write %s", path);
            break;
        }
        snprintf(path, sizeof path, "%s/labels/%05d_P.png", out, i);
        if (!write_png(path, mask, side, side))
            rc = cli_error(CLI_FAIL, cmd, "cannot write %s", path);
    }
    if (rc == CLI_OK) fprintf(stderr, "corefit %s: %d segmentation scenes in %s\n", cmd, a->n, out);
    cf_free(canvas);
    cf_free(mask);
    return rc;
}

int cmd_fmnist_tasks(int argc, char **argv) {
    const char *cmd = "fmnist-tasks";
    tasks_args a = {.n = 200, .size = 64, .valid_pct = 0.2, .seed = 42};
    cli_opt opts[] = {{"--data", OPT_STR, &a.data, "DIR",
                       "Fashion-MNIST's IDX files (default: " CF_FASHION_MNIST_DEFAULT_DIR ")", 1,
                       0, false},
                      {"--n", OPT_INT, &a.n, "N", "images to write (200)", 1, 1000000, false},
                      {"--size", OPT_INT, &a.size, "PX",
                       "points, segmentation: the canvas's side (64)", 28, 4096, false},
                      {"--valid-pct", OPT_DOUBLE, &a.valid_pct, "P",
                       "share of rows marked is_valid, drawn at random (0.2)", 0, 0.99, false},
                      {"--seed", OPT_U64, &a.seed, "S", "random seed (42)", 1, 0, false},
                      {NULL, 0, NULL, NULL, NULL, 0, 0, false}};
    const char *pos[2];
    int n_pos = 0;
    bool help;
    int rc = cli_parse_or_usage(cmd, argc, argv, opts, pos, 2, &n_pos, tasks_usage, &help);
    if (rc || help) return rc;
    if (n_pos != 2 || (strcmp(pos[0], "multi-label") != 0 && strcmp(pos[0], "points") != 0 &&
                       strcmp(pos[0], "segmentation") != 0)) {
        tasks_usage(stderr, opts);
        return CLI_USAGE;
    }
#ifndef CF_HAVE_STB
    return cli_error(CLI_FAIL, cmd, "this corefit was built without stb_image_write (libstb-dev)");
#endif
    const bool multi = strcmp(pos[0], "multi-label") == 0;
    const char *out = pos[1];
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/images", out);
    if ((rc = make_dir(cmd, out)) || (rc = make_dir(cmd, dir))) return rc;
    const char *root = a.data ? a.data : CF_FASHION_MNIST_DEFAULT_DIR;
    char images_path[4096], labels_path[4096];
    snprintf(images_path, sizeof images_path, "%s/train-images-idx3-ubyte.gz", root);
    snprintf(labels_path, sizeof labels_path, "%s/train-labels-idx1-ubyte.gz", root);
    /* the garments come from the first 10,000 training images (only those are read) */
    cf_idx images = {0}, labels = {0};
    if (cf_idx_read_first(images_path, 10000, &images) ||
        cf_idx_read_first(labels_path, 10000, &labels)) {
        cf_idx_free(&images);
        return cli_lib_error(cmd, "reading Fashion-MNIST");
    }
    const int64_t n_garments = images.dim[0] < labels.dim[0] ? images.dim[0] : labels.dim[0];
    if (images.ndim != 3 || images.dim[1] != 28 || images.dim[2] != 28 || n_garments < 1) {
        cf_idx_free(&images);
        cf_idx_free(&labels);
        return cli_error(CLI_FAIL, cmd, "%s: expected 28x28 images", images_path);
    }
    if (strcmp(pos[0], "segmentation") == 0) {
        rc = write_segmentation(cmd, &a, out, &images, &labels, n_garments);
        cf_idx_free(&images);
        cf_idx_free(&labels);
        return rc;
    }
    const int side = multi ? 56 : a.size;
    uint8_t *canvas = cf_malloc((size_t)side * side);
    snprintf(path, sizeof path, "%s/%s", out, multi ? "labels.csv" : "points.csv");
    FILE *csv = canvas ? fopen(path, "w") : NULL;
    if (!csv) {
        cf_free(canvas);
        cf_idx_free(&images);
        cf_idx_free(&labels);
        return cli_error(CLI_FAIL, cmd, "cannot write %s: %s", path, strerror(errno));
    }
    fprintf(csv, multi ? "fname,labels,is_valid\n" : "fname,x,y,is_valid\n");
    cf_rng rng;
    cf_rng_seed(&rng, a.seed);
    rc = CLI_OK;
    for (int i = 0; i < a.n && rc == CLI_OK; i++) {
        memset(canvas, 0, (size_t)side * side);
        char row[256];
        if (multi) {
            bool present[10] = {false};
            /* each tile is empty with probability 1/4; a mosaic keeps at least one garment */
            int filled = 0;
            bool tile_on[4];
            for (int t = 0; t < 4; t++) filled += tile_on[t] = cf_rng_uniform(&rng) >= 0.25;
            if (!filled) tile_on[cf_rng_below(&rng, 4)] = true;
            for (int t = 0; t < 4; t++) {
                if (!tile_on[t]) continue;
                const int64_t g = (int64_t)cf_rng_below(&rng, (uint64_t)n_garments);
                paste(canvas, side, images.data + g * 784, (t % 2) * 28, (t / 2) * 28);
                present[labels.data[g] % 10] = true;
            }
            int k = 0;
            row[0] = '\0';
            for (int c = 0; c < 10; c++)
                if (present[c])
                    k += snprintf(row + k, sizeof row - (size_t)k, "%s%s", k ? " " : "",
                                  garment_names[c]);
        } else {
            const int64_t g = (int64_t)cf_rng_below(&rng, (uint64_t)n_garments);
            const int left = (int)cf_rng_below(&rng, (uint64_t)(side - 28 + 1));
            const int top = (int)cf_rng_below(&rng, (uint64_t)(side - 28 + 1));
            paste(canvas, side, images.data + g * 784, left, top);
            /* the garment's box spans [left, left + 28): its centre is left + 14 */
            snprintf(row, sizeof row, "%d,%d", left + 14, top + 14);
        }
        const bool valid = cf_rng_uniform(&rng) < a.valid_pct;
        char name[32];
        snprintf(name, sizeof name, "images/%05d.png", i);
        snprintf(path, sizeof path, "%s/%s", out, name);
        if (!write_png(path, canvas, side, side))
            rc = cli_error(CLI_FAIL, cmd, "cannot write %s", path);
        else
            fprintf(csv, "%s,%s,%d\n", name, row, valid ? 1 : 0);
    }
    if (fclose(csv) != 0 && rc == CLI_OK)
        rc = cli_error(CLI_FAIL, cmd, "writing %s/%s failed", out,
                       multi ? "labels.csv" : "points.csv");
    if (rc == CLI_OK) fprintf(stderr, "corefit %s: %d %s images in %s\n", cmd, a.n, pos[0], out);
    cf_free(canvas);
    cf_idx_free(&images);
    cf_idx_free(&labels);
    return rc;
}
