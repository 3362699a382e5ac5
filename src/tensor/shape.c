#include "corefit/tensor.h"

#include <stdio.h>
#include <string.h>

cf_shape cf_shape_make(int ndim, const int *dims) {
    cf_shape s = {.ndim = ndim};
    for (int i = 0; i < ndim && i < CF_MAX_DIMS; i++) s.dim[i] = dims[i];
    return s;
}
cf_shape cf_shape1(int a) {
    return (cf_shape){.ndim = 1, .dim = {a}};
}
cf_shape cf_shape2(int a, int b) {
    return (cf_shape){.ndim = 2, .dim = {a, b}};
}
cf_shape cf_shape4(int n, int c, int h, int w) {
    return (cf_shape){.ndim = 4, .dim = {n, c, h, w}};
}

bool cf_shape_equal(const cf_shape *a, const cf_shape *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->dim[i] != b->dim[i]) return false;
    return true;
}

const char *cf_shape_str(const cf_shape *s, char *buf, size_t size) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, size - at, "(");
    for (int i = 0; i < s->ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, i ? ", %d" : "%d", s->dim[i]);
    if (at < size) snprintf(buf + at, size - at, ")");
    return buf;
}

cf_tensor cf_tensor_view(float *data, cf_shape shape) {
    return (cf_tensor){data, shape};
}
