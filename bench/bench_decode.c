/* JPEG decoding speed: libjpeg-turbo (what corefit's image folders use when built with it)
 * against stb_image, and corefit's whole cf_image_decode (decode to float CHW), on the JPEGs of a
 * folder tree (W3's, bench/make_images.py). One thread, each file read into memory first, the
 * best of --reps passes over all files.
 *
 *   bench_decode FOLDER [--reps R] [--limit N]
 *
 * Prints one JSON line: files, mean pixels, and ms per image for each decoder. Images over
 * 4096 x 4096 pixels are skipped. */
#define _XOPEN_SOURCE 700
#include <corefit.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if __has_include(<jpeglib.h>) && __has_include(<jconfig.h>) /* jconfig.h: the target's own */
#include <jpeglib.h>
#define HAVE_LIBJPEG 1
#endif
#if __has_include(<stb_image.h>)
#include <stb_image.h>
#define HAVE_STB 1
#endif

typedef struct blob {
    unsigned char *data;
    size_t size;
} blob;

static blob *files;
static int n_files, cap_files, limit = 1000;

static int add_file(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)ftw;
    const size_t len = strlen(path);
    if (type != FTW_F || len < 4 || strcmp(path + len - 4, ".jpg") != 0) return 0;
    if (n_files == limit) return 1;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    blob b = {.data = malloc((size_t)sb->st_size), .size = (size_t)sb->st_size};
    if (!b.data || fread(b.data, 1, b.size, f) != b.size) {
        free(b.data);
        fclose(f);
        return 0;
    }
    fclose(f);
    if (n_files == cap_files) {
        cap_files = cap_files ? 2 * cap_files : 256;
        files = realloc(files, (size_t)cap_files * sizeof *files);
    }
    files[n_files++] = b;
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define MAX_PIXELS (4096 * 4096) /* larger images are skipped */
static unsigned char pixels[MAX_PIXELS * 3];
static float floats[MAX_PIXELS * 3];
static double total_pixels;

#ifdef HAVE_LIBJPEG
static int decode_libjpeg(const blob *b) {
    struct jpeg_decompress_struct d;
    struct jpeg_error_mgr err;
    d.err = jpeg_std_error(&err);
    jpeg_create_decompress(&d);
    jpeg_mem_src(&d, b->data, (unsigned long)b->size);
    jpeg_read_header(&d, TRUE);
    d.out_color_space = JCS_RGB;
    if ((double)d.image_width * d.image_height > MAX_PIXELS) {
        jpeg_destroy_decompress(&d);
        return 0;
    }
    jpeg_start_decompress(&d);
    const size_t row = (size_t)d.output_width * 3;
    while (d.output_scanline < d.output_height) {
        JSAMPROW r = pixels + (size_t)d.output_scanline * row;
        jpeg_read_scanlines(&d, &r, 1);
    }
    const int px = (int)(d.output_width * d.output_height);
    jpeg_finish_decompress(&d);
    jpeg_destroy_decompress(&d);
    return px;
}
#endif

#ifdef HAVE_STB
static int decode_stb(const blob *b) {
    int w, h, c;
    unsigned char *p = stbi_load_from_memory(b->data, (int)b->size, &w, &h, &c, 3);
    if (!p) return 0;
    stbi_image_free(p);
    return w * h;
}
#endif

#ifdef HAVE_STB
static int decode_corefit(const blob *b) { /* sizes checked first: out holds MAX_PIXELS */
    int w = 0, h = 0, c;
    if (!stbi_info_from_memory(b->data, (int)b->size, &w, &h, &c) || (double)w * h > MAX_PIXELS)
        return 0;
    w = h = 0;
    if (cf_image_decode(b->data, b->size, "bench", 3, 0, floats, &w, &h) != CF_OK) {
        cf_clear_error();
        return 0;
    }
    return w * h;
}
#endif

/* ms per image, best of reps passes */
static double time_decoder(int (*decode)(const blob *), int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double px = 0, t = now();
        for (int i = 0; i < n_files; i++) px += decode(&files[i]);
        t = now() - t;
        if (t < best) best = t;
        total_pixels = px;
    }
    return 1e3 * best / n_files;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FOLDER [--reps R] [--limit N]\n", argv[0]);
        return 2;
    }
    int reps = 3;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--limit")) limit = atoi(argv[i + 1]);
    }
    if (nftw(argv[1], add_file, 16, FTW_PHYS) < 0 || n_files == 0) {
        fprintf(stderr, "%s: no .jpg files found\n", argv[1]);
        return 1;
    }
    printf("{\"files\": %d", n_files);
#ifdef HAVE_LIBJPEG
    printf(", \"libjpeg_ms\": %.4f", time_decoder(decode_libjpeg, reps));
#endif
#ifdef HAVE_STB
    printf(", \"stb_image_ms\": %.4f", time_decoder(decode_stb, reps));
    printf(", \"cf_image_decode_ms\": %.4f", time_decoder(decode_corefit, reps));
#endif
    printf(", \"mean_pixels\": %.0f}\n", total_pixels / n_files);
    return 0;
}
