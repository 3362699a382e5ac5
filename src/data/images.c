/* Image folders: one subfolder per class, PNG/JPEG/BMP decoded with stb_image and resized with
 * stb_image_resize; GrandparentSplitter (train/ and valid/) or RandomSplitter. */
#include "data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#ifdef CF_HAVE_STB
#include <stb_image.h>
#endif
#ifdef CF_HAVE_JPEG
#include <jpeglib.h>
#include <jerror.h>
#include <setjmp.h>
#endif

/* Images with more pixels than this are refused before decoding (the fuzzer builds with less). */
#ifndef CF_IMAGE_MAX_PIXELS
#define CF_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
#endif
/* Image files larger than this are refused before reading. */
#define CF_IMAGE_MAX_FILE ((int64_t)1 << 28)

/* stb_image 2.27 (Debian 12's libstb) does not check that a JPEG Huffman table (DHT) holds at
 * most 256 codes, and writes past its tables when one holds more. Walk the JPEG's marker
 * segments and refuse such tables before stb sees them; returns the byte offset of the bad
 * table, or -1. Non-JPEG data passes. */
static int64_t jpeg_bad_huffman_table(const uint8_t *b, size_t n) {
    /* stb's marker reader skips 0xFF fill bytes, also before the start-of-image marker. */
    size_t i = 0;
    if (n < 2 || b[0] != 0xFF) return -1;
    while (i < n && b[i] == 0xFF) i++;
    if (i >= n || b[i] != 0xD8) return -1;
    i++;
    while (i + 4 <= n) {
        if (b[i] != 0xFF) { /* entropy-coded data, or bytes stb skips between markers */
            i++;
            continue;
        }
        uint8_t m = b[i + 1];
        if (m == 0xFF) {
            i++;
            continue;
        }
        if (m == 0x00 || m == 0x01 || (m >= 0xD0 && m <= 0xD8)) {
            i += 2;
            continue;
        }
        if (m == 0xD9) break;
        size_t len = (size_t)b[i + 2] << 8 | b[i + 3];
        if (m == 0xC4) {
            /* As stb reads it: tables of 1 + 16 count bytes + codes while the length lasts,
             * bytes past the end reading as 0. */
            int64_t left = (int64_t)len - 2;
            size_t p = i + 4;
            while (left > 0) {
                unsigned codes = 0;
                for (size_t k = 1; k <= 16; k++) codes += p + k < n ? b[p + k] : 0;
                if (codes > 256) return (int64_t)p;
                p += 17 + codes;
                left -= 17 + (int64_t)codes;
            }
        }
        if (len < 2) return -1; /* stb refuses it */
        i += 2 + len;
    }
    return -1;
}

/* stb_image grows its buffer for a PNG's image data to the length a chunk header declares
 * before reading it: a 100-byte file can make it allocate 512 MiB. Walk the chunks and refuse one
 * that runs past the end of the data; returns its byte offset and length, or -1. */
static int64_t png_bad_chunk(const uint8_t *b, size_t n, uint32_t *len_out) {
    if (n < 8 || memcmp(b, "\x89PNG\r\n\x1a\n", 8) != 0) return -1;
    size_t i = 8;
    while (i + 8 <= n) {
        uint32_t len =
            (uint32_t)b[i] << 24 | (uint32_t)b[i + 1] << 16 | (uint32_t)b[i + 2] << 8 | b[i + 3];
        if ((uint64_t)len + 12 > (uint64_t)(n - i)) {
            *len_out = len;
            return (int64_t)i;
        }
        if (memcmp(b + i + 4, "IEND", 4) == 0) break;
        i += 12 + (size_t)len;
    }
    return -1;
}

/* The format the first bytes announce ("PNG", "JPEG", "BMP"), or NULL. stb_image tries every
 * decoder in turn and reports the last one's complaint ("bad png sig" for a truncated JPEG): the
 * messages name the format the file claims instead. */
static const char *image_kind(const uint8_t *b, size_t n) {
    if (n >= 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) return "PNG";
    if (n >= 2 && b[0] == 0xFF && b[1] == 0xD8) return "JPEG";
    if (n >= 2 && b[0] == 'B' && b[1] == 'M') return "BMP";
    return NULL;
}

/* Width and height from a PNG's IHDR chunk (bytes 16..23), so that an oversized PNG is named as
 * such; false when the header is not there. */
static bool png_size(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h) {
    if (n < 24 || memcmp(b + 12, "IHDR", 4) != 0) return false;
    *w = (uint32_t)b[16] << 24 | (uint32_t)b[17] << 16 | (uint32_t)b[18] << 8 | b[19];
    *h = (uint32_t)b[20] << 24 | (uint32_t)b[21] << 16 | (uint32_t)b[22] << 8 | b[23];
    return true;
}

/* The error for data stb_image could not read. */
static cf_status undecodable(const uint8_t *b, size_t n, const char *name) {
    const char *kind = image_kind(b, n);
    uint32_t pw, ph;
    if (kind && strcmp(kind, "PNG") == 0 && png_size(b, n, &pw, &ph) &&
        (uint64_t)pw * ph > (uint64_t)CF_IMAGE_MAX_PIXELS)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: PNG image size %u x %u (byte offset 16) refused (more than %lld "
                       "pixels)",
                       name, pw, ph, (long long)CF_IMAGE_MAX_PIXELS);
    if (kind)
        return cf_fail(CF_ERR_FORMAT, "%s: corrupt or truncated %s image (%zu bytes)", name, kind,
                       n);
    return cf_fail(CF_ERR_FORMAT,
                   "%s: not an image corefit reads (%zu bytes; PNG, JPEG or BMP expected)", name,
                   n);
}

#ifdef CF_HAVE_JPEG
/* libjpeg reports errors through a callback that must not return: jump back instead, and keep
 * the message. A premature end of the data is only a warning to libjpeg (it fills the rest with
 * grey); corefit refuses such a file as truncated. */
typedef struct jpeg_errors {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    bool truncated;
    char message[JMSG_LENGTH_MAX];
} jpeg_errors;

static void jpeg_error_jump(j_common_ptr cinfo) {
    jpeg_errors *e = (jpeg_errors *)cinfo->err;
    cinfo->err->format_message(cinfo, e->message);
    longjmp(e->jump, 1);
}

static void jpeg_message(j_common_ptr cinfo, int level) {
    jpeg_errors *e = (jpeg_errors *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) e->truncated = true;
}

/* Decodes a JPEG with libjpeg-turbo into interleaved 8-bit pixels of `channels` channels (free
 * with free()); NULL when libjpeg cannot read it (then *message says why). */
static unsigned char *jpeg_turbo_decode(const uint8_t *bytes, size_t n, int channels, int *w,
                                        int *h, char *message, size_t message_size) {
    struct jpeg_decompress_struct cinfo;
    jpeg_errors err = {0};
    unsigned char *volatile pix = NULL;
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_error_jump;
    err.mgr.emit_message = jpeg_message;
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(pix);
        snprintf(message, message_size, "%s", err.message);
        return NULL;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, bytes, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    int ow = (int)cinfo.output_width, oh = (int)cinfo.output_height;
    if (ow <= 0 || oh <= 0 || (int64_t)ow * oh > CF_IMAGE_MAX_PIXELS ||
        cinfo.output_components != channels) {
        snprintf(message, message_size, "image size %d x %d with %d channels refused", ow, oh,
                 cinfo.output_components);
        jpeg_destroy_decompress(&cinfo);
        return NULL;
    }
    size_t stride = (size_t)ow * (size_t)channels;
    pix = malloc(stride * (size_t)oh);
    if (!pix) {
        snprintf(message, message_size, "out of memory for %d x %d pixels", ow, oh);
        jpeg_destroy_decompress(&cinfo);
        return NULL;
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = pix + (size_t)cinfo.output_scanline * stride;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (err.truncated) {
        free(pix);
        snprintf(message, message_size, "the data ends before the image does");
        return NULL;
    }
    *w = ow;
    *h = oh;
    return pix;
}
#endif

/* Whether JPEGs are decoded with libjpeg-turbo (for benchmarks: CF_JPEG_DECODER=stb turns it
 * off in this process). */
static bool use_jpeg_turbo(void) {
#ifdef CF_HAVE_JPEG
    static int use = -1;
    if (use < 0) {
        const char *e = getenv("CF_JPEG_DECODER");
        use = !(e && strcmp(e, "stb") == 0);
    }
    return use;
#else
    return false;
#endif
}

cf_status cf_image_decode(const void *bytes, size_t n, const char *name, int channels, int size,
                          float *out, int *w, int *h) {
    if (!name) name = "image";
    if (!bytes || !out || (channels != 1 && channels != 3) || size < 0 || size > 65536)
        return cf_fail(CF_ERR_INVALID, "%s: cf_image_decode: bad arguments (channels %d, size %d)",
                       name, channels, size);
#ifndef CF_HAVE_STB
    (void)n;
    (void)w;
    (void)h;
    return cf_fail(CF_ERR_UNSUPPORTED, "%s: corefit was built without stb (libstb-dev)", name);
#else
    if (n > INT_MAX)
        return cf_fail(CF_ERR_FORMAT, "%s: %zu bytes is too large for an image file", name, n);
    int64_t bad = jpeg_bad_huffman_table(bytes, n);
    if (bad >= 0)
        return cf_fail(
            CF_ERR_FORMAT,
            "%s: corrupt JPEG: Huffman table at byte offset %lld has more than 256 codes", name,
            (long long)bad);
    uint32_t chunk_len = 0;
    int64_t bad_chunk = png_bad_chunk(bytes, n, &chunk_len);
    if (bad_chunk >= 0)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: corrupt or truncated PNG image: the chunk at byte offset %lld declares "
                       "%u bytes, the file has %lld after its header",
                       name, (long long)bad_chunk, chunk_len,
                       (long long)n - (long long)bad_chunk - 8);
    int iw = 0, ih = 0, comp = 0;
    if (!stbi_info_from_memory(bytes, (int)n, &iw, &ih, &comp)) return undecodable(bytes, n, name);
    if (iw <= 0 || ih <= 0 || (int64_t)iw * ih > CF_IMAGE_MAX_PIXELS)
        return cf_fail(CF_ERR_FORMAT, "%s: image size %d x %d refused (more than %lld pixels)",
                       name, iw, ih, (long long)CF_IMAGE_MAX_PIXELS);
    int expect_w = w ? *w : 0, expect_h = h ? *h : 0;
    if (size == 0 && expect_w > 0 && expect_h > 0 && (iw != expect_w || ih != expect_h))
        return cf_fail(CF_ERR_FORMAT,
                       "%s: image is %d x %d, the others are %d x %d (pass a size to resize)", name,
                       iw, ih, expect_w, expect_h);
    int dw = 0, dh = 0, dc = 0;
    unsigned char *pix = NULL;
    bool from_stb = true;
#ifdef CF_HAVE_JPEG
    const char *kind = image_kind(bytes, n);
    if (kind && strcmp(kind, "JPEG") == 0 && use_jpeg_turbo()) {
        char why[JMSG_LENGTH_MAX + 64] = "";
        pix = jpeg_turbo_decode(bytes, n, channels, &dw, &dh, why, sizeof why);
        if (!pix)
            return cf_fail(CF_ERR_FORMAT, "%s: corrupt or truncated JPEG image (%zu bytes): %s",
                           name, n, why);
        from_stb = false;
    }
#endif
    if (from_stb && !(pix = stbi_load_from_memory(bytes, (int)n, &dw, &dh, &dc, channels)))
        return undecodable(bytes, n, name);
    if (dw != iw || dh != ih) {
        from_stb ? stbi_image_free(pix) : free(pix);
        return cf_fail(CF_ERR_FORMAT, "%s: decoded size %d x %d differs from the header's %d x %d",
                       name, dw, dh, iw, ih);
    }
    const unsigned char *src = pix;
    unsigned char *resized = NULL;
    int ow = dw, oh = dh;
    if (size > 0 && (dw != size || dh != size)) {
        resized = malloc((size_t)size * size * channels);
        if (!resized) {
            from_stb ? stbi_image_free(pix) : free(pix);
            return cf_fail(CF_ERR_NOMEM, "%s: out of memory resizing to %d x %d", name, size, size);
        }
        if (!cf__resize_uint8(pix, dw, dh, 0, resized, size, size, 0, channels)) {
            free(resized);
            from_stb ? stbi_image_free(pix) : free(pix);
            return cf_fail(CF_ERR_FORMAT, "%s: cannot resize %d x %d to %d x %d", name, dw, dh,
                           size, size);
        }
        src = resized;
        ow = oh = size;
    }
    float lut[256];
    for (int v = 0; v < 256; v++) lut[v] = (float)(v / 255.0);
    size_t hw = (size_t)ow * oh;
    for (int c = 0; c < channels; c++)
        for (size_t i = 0; i < hw; i++) out[c * hw + i] = lut[src[i * channels + c]];
    free(resized);
    from_stb ? stbi_image_free(pix) : free(pix);
    if (w) *w = dw;
    if (h) *h = dh;
    return CF_OK;
#endif
}

/* ---- walking the folders ------------------------------------------------------------------ */

typedef struct item {
    char *path;
    int label;
} item;

typedef struct items {
    item *v;
    int64_t n, cap;
} items;

static void items_free(items *it) {
    for (int64_t i = 0; i < it->n; i++) cf_free(it->v[i].path);
    cf_free(it->v);
    memset(it, 0, sizeof *it);
}

static cf_status items_push(items *it, const char *path, int label) {
    if (it->n == it->cap) {
        int64_t cap = it->cap ? it->cap * 2 : 64;
        item *v = cf_malloc((size_t)cap * sizeof *v);
        if (!v) return CF_ERR_NOMEM;
        if (it->n) memcpy(v, it->v, (size_t)it->n * sizeof *v);
        cf_free(it->v);
        it->v = v;
        it->cap = cap;
    }
    char *p = cf_strdup(path);
    if (!p) return CF_ERR_NOMEM;
    it->v[it->n].path = p;
    it->v[it->n].label = label;
    it->n++;
    return CF_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorted names of the entries of dir (no "." entries, no hidden files). */
static cf_status list_dir(const char *dir, char ***names, int *count) {
    *names = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return cf_fail(CF_ERR_IO, "cannot open folder %s: %s", dir, strerror(errno));
    int n = 0, cap = 0;
    char **v = NULL;
    struct dirent *e;
    cf_status st = CF_OK;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            int ncap = cap ? cap * 2 : 32;
            char **nv = cf_malloc((size_t)ncap * sizeof *nv);
            if (!nv) {
                st = CF_ERR_NOMEM;
                break;
            }
            if (n) memcpy(nv, v, (size_t)n * sizeof *nv);
            cf_free(v);
            v = nv;
            cap = ncap;
        }
        if (!(v[n] = cf_strdup(e->d_name))) {
            st = CF_ERR_NOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (st) {
        cf__strv_free(v, n);
        return cf_fail_context(st, "listing %s", dir);
    }
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_str);
    *names = v;
    *count = n;
    return CF_OK;
}

/* Checks that path does not lead out of root_real (unless allowed); fills *st_out. */
static cf_status check_inside(const char *path, const char *root_real, bool follow,
                              struct stat *st_out) {
    if (stat(path, st_out) != 0)
        return cf_fail(CF_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    if (follow) return CF_OK;
    struct stat lst;
    if (lstat(path, &lst) != 0)
        return cf_fail(CF_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    if (!S_ISLNK(lst.st_mode)) return CF_OK;
    char *real = realpath(path, NULL);
    if (!real) return cf_fail(CF_ERR_IO, "cannot resolve %s: %s", path, strerror(errno));
    size_t rl = strlen(root_real);
    bool inside = strncmp(real, root_real, rl) == 0 && (real[rl] == '/' || real[rl] == '\0');
    if (!inside) {
        cf_status s = cf_fail(CF_ERR_IO,
                              "%s is a symbolic link leading out of the data root %s (to %s); "
                              "set follow_symlinks to allow it",
                              path, root_real, real);
        free(real);
        return s;
    }
    free(real);
    return CF_OK;
}

static bool is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return false;
    static const char *const ext[] = {".png", ".jpg", ".jpeg", ".bmp"};
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
        if (strcasecmp(dot, ext[i]) == 0) return true;
    return false;
}

static cf_status join(char *buf, size_t size, const char *a, const char *b) {
    int k = snprintf(buf, size, "%s/%s", a, b);
    if (k < 0 || (size_t)k >= size) return cf_fail(CF_ERR_INVALID, "path too long: %s/%s", a, b);
    return CF_OK;
}

/* Class folders of dir: their sorted names. */
static cf_status class_folders(const char *dir, const char *root_real, bool follow, char ***classes,
                               int *n_classes) {
    char **names;
    int n;
    cf_status st = list_dir(dir, &names, &n);
    if (st) return st;
    int k = 0;
    char path[PATH_MAX];
    for (int i = 0; i < n; i++) {
        struct stat sb;
        if ((st = join(path, sizeof path, dir, names[i])) ||
            (st = check_inside(path, root_real, follow, &sb))) {
            cf__strv_free(names, n);
            return st;
        }
        if (S_ISDIR(sb.st_mode)) {
            char *keep = names[i];
            names[i] = NULL;
            names[k++] = keep;
        } else {
            cf_free(names[i]);
            names[i] = NULL;
        }
    }
    *classes = names;
    *n_classes = k;
    return CF_OK;
}

/* Adds the images of dir/<class>/ for every class folder, labelled by its index in vocab. */
static cf_status collect(const char *dir, const char *root_real, bool follow, char **vocab,
                         int n_vocab, items *out) {
    char **classes;
    int n_classes;
    cf_status st = class_folders(dir, root_real, follow, &classes, &n_classes);
    if (st) return st;
    char cdir[PATH_MAX], path[PATH_MAX];
    for (int c = 0; c < n_classes && !st; c++) {
        int label = -1;
        for (int v = 0; v < n_vocab; v++)
            if (strcmp(vocab[v], classes[c]) == 0) label = v;
        if (label < 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s/%s: class '%s' is not among the training classes", dir,
                         classes[c], classes[c]);
            break;
        }
        if ((st = join(cdir, sizeof cdir, dir, classes[c]))) break;
        char **files;
        int n_files;
        if ((st = list_dir(cdir, &files, &n_files))) break;
        int64_t before = out->n;
        for (int f = 0; f < n_files && !st; f++) {
            struct stat sb;
            if (!is_image_name(files[f])) continue;
            if ((st = join(path, sizeof path, cdir, files[f]))) break;
            if ((st = check_inside(path, root_real, follow, &sb))) break;
            if (!S_ISREG(sb.st_mode)) continue;
            if ((st = items_push(out, path, label))) cf_fail_context(st, "listing %s", cdir);
        }
        cf__strv_free(files, n_files);
        if (!st && out->n == before)
            st = cf_fail(CF_ERR_FORMAT, "class folder %s has no images (.png, .jpg, .jpeg, .bmp)",
                         cdir);
    }
    cf__strv_free(classes, n_classes);
    return st;
}

static cf_status read_file(const char *path, unsigned char **data, size_t *size) {
    return cf_read_file(path, CF_IMAGE_MAX_FILE, (void **)data, size);
}

cf_status cf_image_read(const char *path, int channels, int size, float *out, int *w, int *h) {
    if (!path) return cf_fail(CF_ERR_INVALID, "cf_image_read: NULL path");
    unsigned char *data;
    size_t n;
    cf_status st = read_file(path, &data, &n);
    if (st != CF_OK) return st;
    st = cf_image_decode(data, n, path, channels, size, out, w, h);
    cf_free(data);
    return st;
}

/* Decodes the items into a new dataset. w and h carry the common size when opt size is 0. */
static cf_status build(const items *it, int channels, int size, int *w, int *h, char **vocab,
                       int n_vocab, const char *source, const cf_item_tfm *tfm, bool train,
                       const cf_image_folder_options *o, cf_dataset **out) {
    *out = NULL;
    uint64_t seed = o->seed;
    /* The size of the images: size, or the first image's. */
    if (!tfm && size == 0 && *w == 0 && it->n > 0) {
        unsigned char *data;
        size_t n;
        cf_status st = read_file(it->v[0].path, &data, &n);
        if (st) return st;
#ifdef CF_HAVE_STB
        int comp;
        int ok = n <= INT_MAX && stbi_info_from_memory(data, (int)n, w, h, &comp);
        if (!ok) {
            st = undecodable(data, n, it->v[0].path);
            cf_free(data);
            return st;
        }
        if ((int64_t)*w * *h > CF_IMAGE_MAX_PIXELS) {
            cf_free(data);
            return cf_fail(CF_ERR_FORMAT, "%s: image size %d x %d refused", it->v[0].path, *w, *h);
        }
#endif
        cf_free(data);
        if (*w <= 0) return cf_fail(CF_ERR_FORMAT, "%s: cannot read the image size", it->v[0].path);
    }
    int ow = size ? size : (*w > 0 ? *w : 1), oh = size ? size : (*h > 0 ? *h : 1);
    if (tfm) ow = tfm->width, oh = tfm->height;
    uint64_t bytes =
        (uint64_t)it->n * (uint64_t)channels * (uint64_t)oh * (uint64_t)ow * sizeof(float);
    bool stream = o->load == CF_IMAGE_LOAD_STREAM;
    if (o->load == CF_IMAGE_LOAD_AUTO) {
        /* Up front only when the set takes at most the budget and a quarter of what this
         * process may allocate, and no training region is drawn at random: a decoded set would
         * keep epoch 0's RandomResizedCrop for every epoch, where fastai draws one per epoch. */
        stream = bytes > CF_IMAGE_MEMORY_BUDGET || cf_memory_check(bytes * 4, source) != CF_OK ||
                 (train && tfm && tfm->kind == CF_ITEM_TFM_RANDOM_RESIZED_CROP);
        cf_clear_error();
    }
    if (stream) {
        const char **paths = cf_malloc((size_t)(it->n > 0 ? it->n : 1) * sizeof *paths);
        int *labels = cf_malloc((size_t)(it->n > 0 ? it->n : 1) * sizeof *labels);
        cf_status st = paths && labels ? CF_OK : CF_ERR_NOMEM;
        for (int64_t i = 0; i < it->n && !st; i++) {
            paths[i] = it->v[i].path;
            labels[i] = it->v[i].label;
        }
        struct cf_image_files proto = {.channels = channels,
                                       .size = size,
                                       .w = *w,
                                       .h = *h,
                                       .has_tfm = tfm != NULL,
                                       .tfm = tfm ? *tfm : (cf_item_tfm){0},
                                       .train = train,
                                       .seed = seed,
                                       .skip_bad = o->skip_bad,
                                       .decode_threads = o->decode_threads};
        cf_dataset *ds = st ? NULL
                            : cf__dataset_stream_new(it->n, paths, labels, &proto,
                                                     cf_shape_make(3, (int[]){channels, oh, ow}));
        cf_free(paths);
        cf_free(labels);
        if (!ds) return cf_fail_context(CF_ERR_NOMEM, "%s", source);
        ds->n_classes = n_vocab;
        if (!(ds->vocab = cf__strv_dup((const char *const *)vocab, n_vocab)) ||
            !cf__dataset_set_source(ds, source)) {
            cf_dataset_free(ds);
            return CF_ERR_NOMEM;
        }
        *out = ds;
        return CF_OK;
    }
    cf_status check = cf_memory_check(bytes, source);
    if (check != CF_OK) return check;
    cf_dataset *ds = cf__dataset_alloc(it->n, cf_shape_make(3, (int[]){channels, oh, ow}), 1);
    if (!ds) return cf_fail_context(CF_ERR_NOMEM, "%s", source);
    size_t per = cf_shape_numel(&ds->sample_shape);
    cf_status st = CF_OK;
    for (int64_t i = 0; i < it->n && !st; i++) {
        unsigned char *data;
        size_t n;
        if ((st = read_file(it->v[i].path, &data, &n))) break;
        int iw = size ? 0 : *w, ih = size ? 0 : *h;
        st = tfm ? cf_image_decode_tfm(data, n, it->v[i].path, channels, tfm, train, seed, 0, i,
                                       ds->x + (size_t)i * per)
                 : cf_image_decode(data, n, it->v[i].path, channels, size, ds->x + (size_t)i * per,
                                   &iw, &ih);
        cf_free(data);
        ds->y[i] = (float)it->v[i].label;
    }
    if (!st) {
        ds->n_classes = n_vocab;
        if (!(ds->vocab = cf__strv_dup((const char *const *)vocab, n_vocab)) ||
            !cf__dataset_set_source(ds, source))
            st = CF_ERR_NOMEM;
    }
    if (st) {
        cf_dataset_free(ds);
        return st;
    }
    *out = ds;
    return CF_OK;
}

cf_status cf_datasets_from_image_folder(const char *root, const cf_image_folder_options *opt,
                                        cf_dataset **train, cf_dataset **valid) {
    if (!train || !valid || !root)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_image_folder: NULL argument");
    *train = *valid = NULL;
    cf_image_folder_options o = opt ? *opt : (cf_image_folder_options){0};
    if (o.channels == 0) o.channels = 3;
    if (!o.train) o.train = "train";
    if (!o.valid) o.valid = "valid";
    if (o.item_tfm &&
        (o.item_tfm->kind == CF_ITEM_TFM_NONE || o.item_tfm->width < 1 || o.item_tfm->height < 1 ||
         o.item_tfm->width > 65536 || o.item_tfm->height > 65536))
        return cf_fail(CF_ERR_INVALID, "%s: image folder options: item transform %d, size %d x %d",
                       root, o.item_tfm ? (int)o.item_tfm->kind : 0, o.item_tfm->width,
                       o.item_tfm->height);
    if ((o.channels != 1 && o.channels != 3) || o.size < 0 || o.size > 65536 ||
        !(o.valid_pct >= 0 && o.valid_pct < 1) || o.load < CF_IMAGE_LOAD_AUTO ||
        o.load > CF_IMAGE_LOAD_STREAM || o.decode_threads < 0 || o.decode_threads > 1024)
        return cf_fail(CF_ERR_INVALID,
                       "%s: image folder options: channels %d (1 or 3), size %d, valid_pct %g, "
                       "load %d, decode_threads %d",
                       root, o.channels, o.size, o.valid_pct, (int)o.load, o.decode_threads);
#ifndef CF_HAVE_STB
    return cf_fail(CF_ERR_UNSUPPORTED, "%s: corefit was built without stb (libstb-dev)", root);
#endif
    char *root_real = realpath(root, NULL);
    if (!root_real) return cf_fail(CF_ERR_IO, "cannot open folder %s: %s", root, strerror(errno));
    char tdir[PATH_MAX], vdir[PATH_MAX];
    char **vocab = NULL;
    int n_vocab = 0, w = 0, h = 0;
    items tr = {0}, va = {0}, all = {0};
    int64_t *ti = NULL, *vi = NULL;
    cf_status st = CF_OK;
    if (o.valid_pct > 0) {
        snprintf(tdir, sizeof tdir, "%s", root);
        if ((st = class_folders(tdir, root_real, o.follow_symlinks, &vocab, &n_vocab))) goto done;
        if (n_vocab == 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s has no class folders", tdir);
            goto done;
        }
        if ((st = collect(tdir, root_real, o.follow_symlinks, vocab, n_vocab, &all))) goto done;
        int64_t nt, nv;
        if ((st = cf_random_split(all.n, o.valid_pct, o.seed, &ti, &nt, &vi, &nv))) goto done;
        for (int64_t i = 0; i < nt && !st; i++)
            st = items_push(&tr, all.v[ti[i]].path, all.v[ti[i]].label);
        for (int64_t i = 0; i < nv && !st; i++)
            st = items_push(&va, all.v[vi[i]].path, all.v[vi[i]].label);
        if (st) goto done;
    } else {
        if ((st = join(tdir, sizeof tdir, root, o.train)) ||
            (st = join(vdir, sizeof vdir, root, o.valid)))
            goto done;
        if ((st = class_folders(tdir, root_real, o.follow_symlinks, &vocab, &n_vocab))) goto done;
        if (n_vocab == 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s has no class folders", tdir);
            goto done;
        }
        if ((st = collect(tdir, root_real, o.follow_symlinks, vocab, n_vocab, &tr))) goto done;
        struct stat sb;
        if (stat(vdir, &sb) == 0 &&
            (st = collect(vdir, root_real, o.follow_symlinks, vocab, n_vocab, &va)))
            goto done;
    }
    if ((st = build(&tr, o.channels, o.size, &w, &h, vocab, n_vocab, tdir, o.item_tfm, true, &o,
                    train)))
        goto done;
    if ((st = build(&va, o.channels, o.size, &w, &h, vocab, n_vocab, o.valid_pct > 0 ? tdir : vdir,
                    o.item_tfm, false, &o, valid)))
        goto done;
done:
    if (st) {
        cf_dataset_free(*train);
        cf_dataset_free(*valid);
        *train = *valid = NULL;
    }
    free(root_real);
    cf__strv_free(vocab, n_vocab);
    items_free(&tr);
    items_free(&va);
    items_free(&all);
    cf_free(ti);
    cf_free(vi);
    return st;
}

/* ---- images listed in a CSV ---------------------------------------------------------------- */

/* The column named `name`, or without a name the column at `fallback`; -1 if none. */
static int find_col(const cf_csv_table *t, const char *name, int fallback) {
    if (!name) return fallback < t->n_cols ? fallback : -1;
    return cf_csv_column(t, name);
}

/* 1 for a true value, 0 for false, -1 for anything else. */
static int parse_bool(const char *v) {
    static const char *const yes[] = {"1", "true", "True", "TRUE"};
    static const char *const no[] = {"0", "false", "False", "FALSE"};
    for (size_t i = 0; i < 4; i++) {
        if (strcmp(v, yes[i]) == 0) return 1;
        if (strcmp(v, no[i]) == 0) return 0;
    }
    return -1;
}

cf_status cf_datasets_from_image_csv(const char *csv_path, const char *folder, const char *fn_col,
                                     const char *label_col, const char *valid_col,
                                     const cf_image_folder_options *opt, cf_dataset **train,
                                     cf_dataset **valid) {
    if (!train || !valid || !csv_path)
        return cf_fail(CF_ERR_INVALID, "cf_datasets_from_image_csv: NULL argument");
    *train = *valid = NULL;
    cf_image_folder_options o = opt ? *opt : (cf_image_folder_options){0};
    if (o.channels == 0) o.channels = 3;
    if ((o.channels != 1 && o.channels != 3) || o.size < 0 || o.size > 65536 ||
        !(o.valid_pct >= 0 && o.valid_pct < 1) || o.load < CF_IMAGE_LOAD_AUTO ||
        o.load > CF_IMAGE_LOAD_STREAM || o.decode_threads < 0 || o.decode_threads > 1024)
        return cf_fail(CF_ERR_INVALID,
                       "%s: image options: channels %d (1 or 3), size %d, valid_pct %g, load %d, "
                       "decode_threads %d",
                       csv_path, o.channels, o.size, o.valid_pct, (int)o.load, o.decode_threads);
    cf_csv_table *t = NULL;
    cf_status st = cf_csv_read(csv_path, ',', &t);
    if (st) return st;
    int fc = find_col(t, fn_col, 0), lc = find_col(t, label_col, 1);
    int vc = valid_col ? find_col(t, valid_col, -1) : -1;
    char base[PATH_MAX], path[PATH_MAX];
    char **vocab = NULL;
    int n_vocab = 0, w = 0, h = 0;
    items tr = {0}, va = {0};
    int64_t *ti = NULL, *vi = NULL, nt = 0, nv = 0;
    int8_t *is_valid = NULL;
    if (fc < 0 || lc < 0 || (valid_col && vc < 0)) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header", csv_path,
                     fc < 0   ? (fn_col ? fn_col : "(first)")
                     : lc < 0 ? (label_col ? label_col : "(second)")
                              : valid_col);
        goto done;
    }
    /* The folder the names are relative to. */
    {
        const char *slash = strrchr(csv_path, '/');
        int dir_len = slash ? (int)(slash - csv_path) : 1;
        const char *dir = slash ? csv_path : ".";
        int k = folder && folder[0] == '/' ? snprintf(base, sizeof base, "%s", folder)
                : folder ? snprintf(base, sizeof base, "%.*s/%s", dir_len, dir, folder)
                         : snprintf(base, sizeof base, "%.*s", dir_len, dir);
        if (k < 0 || (size_t)k >= sizeof base) {
            st = cf_fail(CF_ERR_INVALID, "%s: folder path too long", csv_path);
            goto done;
        }
    }
    if (!(is_valid = cf_calloc((size_t)(t->n_rows > 0 ? t->n_rows : 1), 1))) {
        st = CF_ERR_NOMEM;
        goto done;
    }
    if (vc >= 0) {
        for (int64_t r = 0; r < t->n_rows; r++) {
            const char *v = t->cells[r * t->n_cols + vc];
            int b = parse_bool(v);
            if (b < 0) {
                st = cf_fail(CF_ERR_FORMAT, "%s:%lld: column %s is '%s', not a boolean", csv_path,
                             (long long)t->row_line[r], valid_col, v);
                goto done;
            }
            is_valid[r] = (int8_t)b;
        }
    } else if (o.valid_pct > 0) {
        if ((st = cf_random_split(t->n_rows, o.valid_pct, o.seed, &ti, &nt, &vi, &nv))) goto done;
        for (int64_t i = 0; i < nv; i++) is_valid[vi[i]] = 1;
    }
    /* The classes: the sorted labels of the training rows. */
    {
        char **labels = cf_malloc((size_t)(t->n_rows > 0 ? t->n_rows : 1) * sizeof *labels);
        if (!labels) {
            st = CF_ERR_NOMEM;
            goto done;
        }
        int64_t m = 0;
        for (int64_t r = 0; r < t->n_rows; r++)
            if (!is_valid[r]) labels[m++] = t->cells[r * t->n_cols + lc];
        if (m > 1) qsort(labels, (size_t)m, sizeof *labels, cmp_str);
        int64_t u = 0;
        for (int64_t i = 0; i < m; i++)
            if (u == 0 || strcmp(labels[u - 1], labels[i]) != 0) labels[u++] = labels[i];
        if (u == 0 || u > INT_MAX) {
            cf_free(labels);
            st = cf_fail(CF_ERR_FORMAT, "%s has no training rows", csv_path);
            goto done;
        }
        vocab = cf__strv_dup((const char *const *)labels, (int)u);
        cf_free(labels);
        if (!vocab) {
            st = CF_ERR_NOMEM;
            goto done;
        }
        n_vocab = (int)u;
    }
    for (int64_t r = 0; r < t->n_rows && !st; r++) {
        const char *fn = t->cells[r * t->n_cols + fc], *lab = t->cells[r * t->n_cols + lc];
        int label = -1, lo = 0, hi = n_vocab - 1;
        while (lo <= hi) { /* vocab is sorted */
            int mid = (lo + hi) / 2, c = strcmp(vocab[mid], lab);
            if (c == 0) {
                label = mid;
                break;
            }
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid - 1;
        }
        if (label < 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s:%lld: class '%s' is not among the training classes",
                         csv_path, (long long)t->row_line[r], lab);
            break;
        }
        if (fn[0] == '\0') {
            st = cf_fail(CF_ERR_FORMAT, "%s:%lld: empty file name", csv_path,
                         (long long)t->row_line[r]);
            break;
        }
        if ((st = join(path, sizeof path, base, fn))) break;
        st = items_push(is_valid[r] ? &va : &tr, path, label);
    }
    if (st) goto done;
    if ((st = build(&tr, o.channels, o.size, &w, &h, vocab, n_vocab, csv_path, o.item_tfm, true, &o,
                    train)) ||
        (st = build(&va, o.channels, o.size, &w, &h, vocab, n_vocab, csv_path, o.item_tfm, false,
                    &o, valid))) {
        cf_dataset_free(*train);
        cf_dataset_free(*valid);
        *train = *valid = NULL;
    }
done:
    cf_csv_table_free(t);
    cf__strv_free(vocab, n_vocab);
    items_free(&tr);
    items_free(&va);
    cf_free(ti);
    cf_free(vi);
    cf_free(is_valid);
    return st;
}
