/* stb_image_resize (Debian's libstb-dev), compiled into the including file as its own static
 * copy: src/data/resize.c, and the test that keeps the replaced per-plane resize as its
 * reference. Include only where CF_HAVE_STB is defined. Debian's copy asserts when shrinking;
 * the assertions are off. */
#ifndef CF_DATA_STB_RESIZE_H
#define CF_DATA_STB_RESIZE_H

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

#endif
