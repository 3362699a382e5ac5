/* stb_image_resize compiled into corefit with its assertions off.
 *
 * Debian's libstb (stb_image_resize 0.97) is built with assert() on, and its triangle filter
 * asserts that every source pixel's weights sum to within 10% of 1 when it shrinks an image:
 * for many ordinary sizes they do not (17 to 12 px, 21 to 16, 27 to 20, 45 to 32, ...) and
 * the assertion aborts the program. The function renormalises the weights right after the
 * check, so the result is right without it. The copy here is private (static functions, no
 * symbol clashes with libstb). */
#include "data_internal.h"

#include <string.h>

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

/* stbir_resize_float_generic's steps for one plane (stbir__resize_arbitrary and
 * stbir__resize_allocated) with the filters and the working memory set up once for all the
 * planes: each plane after the first starts from the state stb starts from (buffers zeroed, the
 * ring buffer empty) and goes through stb's own loops, so every plane's pixels are those of a
 * call of cf__resize_float_triangle. */
int cf__resize_planes_triangle(const float *in, int in_w, int in_h, int in_stride, size_t in_plane,
                               float *out, int out_w, int out_h, size_t out_plane, int planes) {
    if (planes < 1) return 1;
    stbir__info info;
    stbir__setup(&info, in_w, in_h, out_w, out_h, 1);
    stbir__calculate_transform(&info, 0, 0, 1, 1, NULL);
    stbir__choose_filter(&info, STBIR_FILTER_TRIANGLE, STBIR_FILTER_TRIANGLE);
    const size_t bytes = stbir__calculate_memory(&info);
    unsigned char *mem = STBIR_MALLOC(bytes, NULL);
    if (!mem) return 0;
    /* the first plane as stb does it: zeroed memory, the filters, the loop */
    int ok = stbir__resize_allocated(&info, in, in_stride, out, 0, STBIR_ALPHA_CHANNEL_NONE, 0,
                                     STBIR_TYPE_FLOAT, STBIR_EDGE_CLAMP, STBIR_EDGE_CLAMP,
                                     STBIR_COLORSPACE_LINEAR, mem, bytes);
    /* the buffers follow the filters in the memory block */
    unsigned char *buffers = (unsigned char *)info.decode_buffer;
    for (int p = 1; ok && p < planes; p++) {
        memset(buffers, 0, bytes - (size_t)(buffers - mem));
        info.ring_buffer_begin_index = -1;
        info.ring_buffer_first_scanline = 0;
        info.ring_buffer_last_scanline = 0;
        info.input_data = in + (size_t)p * in_plane;
        info.output_data = out + (size_t)p * out_plane;
        if (stbir__use_height_upsampling(&info))
            stbir__buffer_loop_upsample(&info);
        else
            stbir__buffer_loop_downsample(&info);
    }
    STBIR_FREE(mem, NULL);
    return ok;
}
#endif
