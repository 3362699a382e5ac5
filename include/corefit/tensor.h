/* corefit/tensor.h — float32 tensors (up to 4 dims, row-major, images NCHW) and the CPU kernels
 * the layers are built from. A cf_tensor is a view: it never owns its data. */
#ifndef COREFIT_TENSOR_H
#define COREFIT_TENSOR_H

#include "corefit/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CF_MAX_DIMS 4

/* A shape without data: ndim in 1..4, dim[i] > 0. */
typedef struct cf_shape {
    int ndim;
    int dim[CF_MAX_DIMS];
} cf_shape;

typedef struct cf_tensor {
    float *data;
    cf_shape shape;
} cf_tensor;

static inline size_t cf_shape_numel(const cf_shape *s) {
    size_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= (size_t)s->dim[i];
    return n;
}
static inline size_t cf_tensor_numel(const cf_tensor *t) { return cf_shape_numel(&t->shape); }
/* Elements per sample (all dims but the first). */
static inline size_t cf_shape_sample_numel(const cf_shape *s) {
    size_t n = 1;
    for (int i = 1; i < s->ndim; i++) n *= (size_t)s->dim[i];
    return n;
}
cf_shape cf_shape_make(int ndim, const int *dims);
cf_shape cf_shape1(int a);
cf_shape cf_shape2(int a, int b);
cf_shape cf_shape4(int n, int c, int h, int w);
bool cf_shape_equal(const cf_shape *a, const cf_shape *b);
/* Writes "(64, 16, 28, 28)" into buf; returns buf. */
const char *cf_shape_str(const cf_shape *s, char *buf, size_t size);
cf_tensor cf_tensor_view(float *data, cf_shape shape);

#ifdef __cplusplus
}
#endif
#endif
