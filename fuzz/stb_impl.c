/* stb_image and stb_image_resize compiled into the fuzz targets (with the fuzzer's coverage
 * instrumentation and AddressSanitizer) in place of libstb's uninstrumented copy, so that
 * coverage guides the fuzzer through the decoders too. fuzz/run builds this file with
 * -fno-sanitize=pointer-overflow,nonnull-attribute: for a PNG whose first IDAT chunk is empty,
 * stb 2.27 computes NULL + 0 and calls memcpy(NULL, p, 0), which UBSan reports though nothing is
 * read or written. AddressSanitizer still checks every access. */
#ifdef CF_HAVE_STB
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb_image.h>
#include <stb_image_resize.h>
#endif
