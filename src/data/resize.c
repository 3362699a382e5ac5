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
#include "data/stb_resize.h"

int cf__resize_uint8(const unsigned char *in, int in_w, int in_h, int in_stride, unsigned char *out,
                     int out_w, int out_h, int out_stride, int channels) {
    return stbir_resize_uint8(in, in_w, in_h, in_stride, out, out_w, out_h, out_stride, channels);
}

/* ---- one-channel float planes through stb's filters ----------------------------------------
 * stbir_resize_float_generic (one channel, linear, clamped edges) does, per row, a decode of the
 * input row into a margin-padded buffer, the horizontal filter, the vertical filter through a
 * ring buffer of rows, and an encode of each output row. For float pixels in linear space the
 * decode and the encode are copies (with the clamped edge repeated): below, they are memcpy and a
 * fill instead of stb's per-pixel loops, and the vertical filter of an upsampled height adds
 * straight into the output row (stb adds into a zeroed row and copies it). The filters, the
 * horizontal passes and the ring buffer are stb's own functions: the same products added in
 * the same order, so the same bits as stb's call. */

/* stbir__decode_scanline for one float channel, linear, STBIR_EDGE_CLAMP: the row n (clamped)
 * and its margin of repeated edge pixels. */
static void plane_decode_row(stbir__info *info, int n) {
    const int w = info->input_w, margin = info->horizontal_filter_pixel_margin;
    const int row = n < 0 ? 0 : n >= info->input_h ? info->input_h - 1 : n;
    const float *in =
        (const float *)((const char *)info->input_data + (size_t)row * info->input_stride_bytes);
    float *d = stbir__get_decode_buffer(info);
    for (int x = -margin; x < 0; x++) d[x] = in[0];
    memcpy(d, in, (size_t)w * sizeof(float));
    for (int x = w; x < w + margin; x++) d[x] = in[w - 1];
}

/* Drops the ring buffer's first scanline (stb's loops inline this): false when that was its
 * last one, the ring then empty. */
static bool ring_pop(stbir__info *info) {
    if (info->ring_buffer_first_scanline == info->ring_buffer_last_scanline) {
        info->ring_buffer_begin_index = -1;
        info->ring_buffer_first_scanline = 0;
        info->ring_buffer_last_scanline = 0;
        return false;
    }
    info->ring_buffer_first_scanline++;
    info->ring_buffer_begin_index =
        (info->ring_buffer_begin_index + 1) % info->ring_buffer_num_entries;
    return true;
}

/* stbir__buffer_loop_upsample with the vertical pass of stbir__resample_vertical_upsample
 * adding into the output row. */
static void plane_loop_upsample(stbir__info *info) {
    const float scale_ratio = info->vertical_scale;
    const float out_scanlines_radius =
        stbir__filter_info_table[info->vertical_filter].support(1 / scale_ratio) * scale_ratio;
    const int ring_length = info->ring_buffer_length_bytes / sizeof(float);
    for (int y = 0; y < info->output_h; y++) {
        float in_center_of_out = 0;
        int in_first_scanline = 0, in_last_scanline = 0;
        stbir__calculate_sample_range_upsample(y, out_scanlines_radius, scale_ratio,
                                               info->vertical_shift, &in_first_scanline,
                                               &in_last_scanline, &in_center_of_out);
        if (info->ring_buffer_begin_index >= 0) {
            while (in_first_scanline > info->ring_buffer_first_scanline && ring_pop(info)) {
            }
        }
        int next = info->ring_buffer_begin_index < 0 ? in_first_scanline
                                                     : info->ring_buffer_last_scanline + 1;
        for (bool first = info->ring_buffer_begin_index < 0;
             first || in_last_scanline > info->ring_buffer_last_scanline; first = false) {
            plane_decode_row(info, next); /* stbir__decode_and_resample_upsample */
            float *entry = stbir__add_empty_ring_buffer_entry(info, next);
            if (stbir__use_width_upsampling(info))
                stbir__resample_horizontal_upsample(info, entry);
            else
                stbir__resample_horizontal_downsample(info, entry);
            next = info->ring_buffer_last_scanline + 1;
        }
        /* stbir__resample_vertical_upsample, one channel */
        const stbir__contributors *vc = &info->vertical_contributors[y];
        const float *coef = info->vertical_coefficients + info->vertical_coefficient_width * y;
        float *out = (float *)((char *)info->output_data + (size_t)y * info->output_stride_bytes);
        memset(out, 0, (size_t)info->output_w * sizeof(float));
        for (int k = vc->n0; k <= vc->n1; k++) {
            const float *entry = stbir__get_ring_buffer_scanline(
                k, info->ring_buffer, info->ring_buffer_begin_index,
                info->ring_buffer_first_scanline, info->ring_buffer_num_entries, ring_length);
            const float c = coef[k - vc->n0];
            for (int x = 0; x < info->output_w; x++) out[x] += entry[x] * c;
        }
    }
}

/* stbir__empty_ring_buffer with the encode a copy. */
static void plane_empty_ring(stbir__info *info, int first_necessary_scanline) {
    const int ring_length = info->ring_buffer_length_bytes / sizeof(float);
    if (info->ring_buffer_begin_index < 0) return;
    while (first_necessary_scanline > info->ring_buffer_first_scanline) {
        const int row = info->ring_buffer_first_scanline;
        if (row >= 0 && row < info->output_h)
            memcpy((char *)info->output_data + (size_t)row * info->output_stride_bytes,
                   stbir__get_ring_buffer_entry(info->ring_buffer, info->ring_buffer_begin_index,
                                                ring_length),
                   (size_t)info->output_w * sizeof(float));
        if (!ring_pop(info)) break;
    }
}

/* stbir__buffer_loop_downsample with the copies above. */
static void plane_loop_downsample(stbir__info *info) {
    const float scale_ratio = info->vertical_scale;
    const int output_h = info->output_h;
    const float in_pixels_radius =
        stbir__filter_info_table[info->vertical_filter].support(scale_ratio) / scale_ratio;
    const int pixel_margin = info->vertical_filter_pixel_margin;
    const int max_y = info->input_h + pixel_margin;
    for (int y = -pixel_margin; y < max_y; y++) {
        float out_center_of_in;
        int out_first_scanline, out_last_scanline;
        stbir__calculate_sample_range_downsample(y, in_pixels_radius, scale_ratio,
                                                 info->vertical_shift, &out_first_scanline,
                                                 &out_last_scanline, &out_center_of_in);
        if (out_last_scanline < 0 || out_first_scanline >= output_h) continue;
        plane_empty_ring(info, out_first_scanline);
        plane_decode_row(info, y); /* stbir__decode_and_resample_downsample */
        memset(info->horizontal_buffer, 0, (size_t)info->output_w * sizeof(float));
        if (stbir__use_width_upsampling(info))
            stbir__resample_horizontal_upsample(info, info->horizontal_buffer);
        else
            stbir__resample_horizontal_downsample(info, info->horizontal_buffer);
        if (info->ring_buffer_begin_index < 0)
            stbir__add_empty_ring_buffer_entry(info, out_first_scanline);
        while (out_last_scanline > info->ring_buffer_last_scanline)
            stbir__add_empty_ring_buffer_entry(info, info->ring_buffer_last_scanline + 1);
        stbir__resample_vertical_downsample(info, y);
    }
    plane_empty_ring(info, info->output_h);
}

int cf__resize_planes_triangle(const float *in, int in_w, int in_h, int in_stride, size_t in_plane,
                               float *out, int out_w, int out_h, size_t out_plane, int planes) {
    if (planes < 1) return 1;
    /* stbir__resize_arbitrary's set-up, once */
    stbir__info info;
    stbir__setup(&info, in_w, in_h, out_w, out_h, 1);
    stbir__calculate_transform(&info, 0, 0, 1, 1, NULL);
    stbir__choose_filter(&info, STBIR_FILTER_TRIANGLE, STBIR_FILTER_TRIANGLE);
    const size_t bytes = stbir__calculate_memory(&info);
    unsigned char *mem = STBIR_MALLOC(bytes, NULL);
    if (!mem) return 0;
    /* stbir__resize_allocated's, without its loop: zeroed memory, the layout, the filters */
    memset(mem, 0, bytes);
    info.input_stride_bytes = in_stride ? in_stride : in_w * (int)sizeof(float);
    info.output_stride_bytes = out_w * (int)sizeof(float);
    info.alpha_channel = STBIR_ALPHA_CHANNEL_NONE;
    info.flags = STBIR_FLAG_ALPHA_USES_COLORSPACE | STBIR_FLAG_ALPHA_PREMULTIPLIED;
    info.type = STBIR_TYPE_FLOAT;
    info.edge_horizontal = info.edge_vertical = STBIR_EDGE_CLAMP;
    info.colorspace = STBIR_COLORSPACE_LINEAR;
    info.horizontal_coefficient_width =
        stbir__get_coefficient_width(info.horizontal_filter, info.horizontal_scale);
    info.vertical_coefficient_width =
        stbir__get_coefficient_width(info.vertical_filter, info.vertical_scale);
    info.horizontal_filter_pixel_width =
        stbir__get_filter_pixel_width(info.horizontal_filter, info.horizontal_scale);
    info.vertical_filter_pixel_width =
        stbir__get_filter_pixel_width(info.vertical_filter, info.vertical_scale);
    info.horizontal_filter_pixel_margin =
        stbir__get_filter_pixel_margin(info.horizontal_filter, info.horizontal_scale);
    info.vertical_filter_pixel_margin =
        stbir__get_filter_pixel_margin(info.vertical_filter, info.vertical_scale);
    info.ring_buffer_length_bytes = info.output_w * (int)sizeof(float);
    info.decode_buffer_pixels = info.input_w + info.horizontal_filter_pixel_margin * 2;
    unsigned char *at = mem;
    info.horizontal_contributors = (stbir__contributors *)at;
    at += info.horizontal_contributors_size;
    info.horizontal_coefficients = (float *)at;
    at += info.horizontal_coefficients_size;
    info.vertical_contributors = (stbir__contributors *)at;
    at += info.vertical_contributors_size;
    info.vertical_coefficients = (float *)at;
    at += info.vertical_coefficients_size;
    info.decode_buffer = (float *)at;
    at += info.decode_buffer_size;
    const bool up = stbir__use_height_upsampling(&info);
    info.horizontal_buffer = up ? NULL : (float *)at;
    at += up ? 0 : info.horizontal_buffer_size;
    info.ring_buffer = (float *)at;
    info.encode_buffer = NULL; /* the vertical upsampling adds into the output row */
    stbir__calculate_filters(info.horizontal_contributors, info.horizontal_coefficients,
                             info.horizontal_filter, info.horizontal_scale, info.horizontal_shift,
                             info.input_w, info.output_w);
    stbir__calculate_filters(info.vertical_contributors, info.vertical_coefficients,
                             info.vertical_filter, info.vertical_scale, info.vertical_shift,
                             info.input_h, info.output_h);
    unsigned char *buffers = (unsigned char *)info.decode_buffer;
    for (int p = 0; p < planes; p++) {
        if (p > 0) memset(buffers, 0, bytes - (size_t)(buffers - mem)); /* as stb starts */
        info.ring_buffer_begin_index = -1;
        info.ring_buffer_first_scanline = 0;
        info.ring_buffer_last_scanline = 0;
        info.input_data = in + (size_t)p * in_plane;
        info.output_data = out + (size_t)p * out_plane;
        if (up)
            plane_loop_upsample(&info);
        else
            plane_loop_downsample(&info);
    }
    STBIR_FREE(mem, NULL);
    return 1;
}
#endif
