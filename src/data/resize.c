/* stb_image_resize compiled into corefit with its assertions off.
 *
 * Debian's libstb (stb_image_resize 0.97) is built with assert() on, and its triangle filter
 * asserts that every source pixel's weights sum to within 10% of 1 when it shrinks an image:
 * for many ordinary sizes they do not (17 to 12 px, 21 to 16, 27 to 20, 45 to 32, ...) and
 * the assertion aborts the program. The function renormalises the weights right after the
 * check, so the result is right without it. The copy here is private (static functions, no
 * symbol clashes with libstb). */
#include "data_internal.h"

#ifdef CF_HAVE_STB
#define STB_IMAGE_RESIZE_STATIC
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#define STBIR_ASSERT(x) ((void)0)
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#endif
#include <stb_image_resize.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

int cf__resize_uint8(const unsigned char *in, int in_w, int in_h, int in_stride, unsigned char *out,
                     int out_w, int out_h, int out_stride, int channels) {
    return stbir_resize_uint8(in, in_w, in_h, in_stride, out, out_w, out_h, out_stride, channels);
}

int cf__resize_float_triangle(const float *in, int in_w, int in_h, int in_stride, float *out,
                              int out_w, int out_h, int out_stride) {
    return stbir_resize_float_generic(in, in_w, in_h, in_stride, out, out_w, out_h, out_stride, 1,
                                      STBIR_ALPHA_CHANNEL_NONE, 0, STBIR_EDGE_CLAMP,
                                      STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, NULL);
}
#endif
