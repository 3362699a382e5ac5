/* Image decoding, the leaf the image readers, transforms and streamed sets build on: PNG and BMP
 * with stb_image, JPEG with libjpeg-turbo when built with it (else stb_image), resized with
 * stb_image_resize; damaged files are named with what is wrong before a decoder sees them. */
#include "data_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

cf_status cf__image_size(const void *data, size_t n, const char *name, int *w, int *h) {
#ifdef CF_HAVE_STB
    int comp;
    if (n > INT_MAX || !stbi_info_from_memory(data, (int)n, w, h, &comp))
        return undecodable(data, n, name);
    if ((int64_t)*w * *h > CF_IMAGE_MAX_PIXELS)
        return cf_fail(CF_ERR_FORMAT, "%s: image size %d x %d refused", name, *w, *h);
#else
    (void)data, (void)n, (void)name, (void)w, (void)h;
#endif
    return CF_OK;
}

cf_status cf_image_read(const char *path, int channels, int size, float *out, int *w, int *h) {
    if (!path) return cf_fail(CF_ERR_INVALID, "cf_image_read: NULL path");
    void *data;
    size_t n;
    cf_status st = cf_read_file(path, CF_IMAGE_MAX_FILE, &data, &n);
    if (st != CF_OK) return st;
    st = cf_image_decode(data, n, path, channels, size, out, w, h);
    cf_free(data);
    return st;
}
