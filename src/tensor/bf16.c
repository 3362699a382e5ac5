/* bfloat16 conversions and the mixed-precision GEMM: the portable code and the entry points that
 * consult the active kernel table's bf16 kernels (kernel_table.h). */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* PyTorch's round_to_nearest_even (c10/util/BFloat16.h): add 0x7fff plus the lowest kept bit,
 * keep the upper half; a NaN is made quiet (the carry could otherwise turn it into infinity). */
static uint16_t bf16_of(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if (x != x) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void cf_fp32_to_bf16(const float *x, uint16_t *y, size_t n) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    if (k && k->from_fp32) {
        k->from_fp32(x, y, n);
        return;
    }
    for (size_t i = 0; i < n; i++) y[i] = bf16_of(x[i]);
}

/* BatchNorm's dx pass in bf16 words (tensor.h): here beside the rounding it applies. */
void cf_bn_planes_dx_bf16(const float *dy, const float *x, uint16_t *dxh, int64_t s, int nc,
                          const float *mean, const float *k1, const float *k2, const float *k3,
                          bool relu, const float *scale, const float *shift, ptrdiff_t ahead) {
    /* a chunk of a plane in fp32 (in L1), then its words: the one-plane kernel is elementwise,
     * so a chunk's values are bitwise those of the whole plane's call (chunks of whole vectors) */
    enum { CHUNK = 512 };
    _Alignas(64) float buf[CHUNK];
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    if (bn->dx_bf16_n) { /* rounded in registers */
        bn->dx_bf16_n(dy, x, dxh, s, nc, mean, k1, k2, k3, relu, scale, shift, ahead);
        return;
    }
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(dxh + at + ahead, (size_t)s * sizeof(uint16_t), true, true);
        for (int64_t j = 0; j < s; j += CHUNK) {
            const int64_t n = s - j < CHUNK ? s - j : CHUNK;
            bn->dx(dy + at + j, x + at + j, buf, n, mean[i], k1[i], k2[i], k3[i], relu, scale[i],
                   shift[i]);
            cf_fp32_to_bf16(buf, dxh + at + j, (size_t)n);
        }
    }
}

/* The masked form (tensor.h), as cf_bn_planes_dx_bf16: chunks of whole mask words. */
void cf_bn_planes_dx_bf16_mask(const float *dy, const float *x, uint16_t *dxh, int64_t s, int nc,
                               const float *mean, const float *k1, const float *k2, const float *k3,
                               const uint16_t *mask, ptrdiff_t ahead) {
    enum { CHUNK = 512 };
    _Alignas(64) float buf[CHUNK];
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    if (bn->dx_mask_bf16_n) {
        bn->dx_mask_bf16_n(dy, x, dxh, s, nc, mean, k1, k2, k3, mask, ahead);
        return;
    }
    const size_t words = CF_MASK_WORDS((size_t)s);
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(dxh + at + ahead, (size_t)s * sizeof(uint16_t), true, true);
        for (int64_t j = 0; j < s; j += CHUNK) {
            const int64_t n = s - j < CHUNK ? s - j : CHUNK;
            bn->dx_mask_n(dy + at + j, x + at + j, buf, n, 1, mean + i, k1 + i, k2 + i, k3 + i,
                          mask + (size_t)i * words + (size_t)j / 16, 0);
            cf_fp32_to_bf16(buf, dxh + at + j, (size_t)n);
        }
    }
}

/* BatchNorm's output pass in bf16 words (tensor.h), as cf_bn_planes_dx_bf16. */
void cf_bn_planes_affine_bf16(const float *x, uint16_t *yh, int64_t s, int nc, const float *scale,
                              const float *shift, bool relu, ptrdiff_t ahead) {
    enum { CHUNK = 2048 };
    _Alignas(64) float buf[CHUNK];
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    if (bn->affine_bf16_n) { /* rounded in registers */
        bn->affine_bf16_n(x, yh, s, nc, scale, shift, relu, ahead);
        return;
    }
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(yh + at + ahead, (size_t)s * sizeof(uint16_t), true, true);
        for (int64_t j = 0; j < s; j += CHUNK) {
            const int64_t n = s - j < CHUNK ? s - j : CHUNK;
            bn->affine(x + at + j, NULL, buf, n, scale[i], shift[i], relu);
            cf_fp32_to_bf16(buf, yh + at + j, (size_t)n);
        }
    }
}

/* The fold's output in bf16 words (tensor.h), as cf_bn_planes_affine_bf16; the chunks are a
 * multiple of 16 values, so that each starts a mask word. */
void cf_bn_planes_fold_mask_bf16(const float *x, const float *add, const float *x2, uint16_t *yh,
                                 int64_t s, int nc, const float *scale, const float *shift,
                                 const float *scale2, const float *shift2, uint16_t *mask,
                                 ptrdiff_t ahead) {
    enum { CHUNK = 2048 };
    _Alignas(64) float buf[CHUNK];
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    if (bn->fold_mask_bf16_n) { /* rounded in registers */
        bn->fold_mask_bf16_n(x, add, x2, yh, s, nc, scale, shift, scale2, shift2, mask, ahead);
        return;
    }
    const size_t words = CF_MASK_WORDS((size_t)s);
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(yh + at + ahead, (size_t)s * sizeof(uint16_t), true, true);
        for (int64_t j = 0; j < s; j += CHUNK) {
            const int64_t n = s - j < CHUNK ? s - j : CHUNK;
            bn->fold_mask_n(x + at + j, x2 ? NULL : add + at + j, x2 ? x2 + at + j : NULL, buf, n,
                            1, scale + i, shift + i, x2 ? scale2 + i : NULL, x2 ? shift2 + i : NULL,
                            mask + (size_t)i * words + (size_t)j / 16, 0);
            cf_fp32_to_bf16(buf, yh + at + j, (size_t)n);
        }
    }
}

void cf_bf16_to_fp32(const uint16_t *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const uint32_t bits = (uint32_t)x[i] << 16;
        memcpy(&y[i], &bits, sizeof bits);
    }
}

float cf_bf16_round(float x) {
    const uint32_t bits = (uint32_t)bf16_of(x) << 16;
    float y;
    memcpy(&y, &bits, sizeof y);
    return y;
}

bool cf_bf16_compute(void) {
    const cf_bf16_kernels *k = cf_active_kernels->bf16;
    return k && k->gemm;
}

void cf_sgemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                   const float *b, int ldb, float *c, int ldc, bool accumulate) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (!accumulate)
            for (int i = 0; i < m; i++) memset(c + (size_t)i * ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    const cf_bf16_kernels *kt = cf_active_kernels->bf16;
    if (kt && kt->gemm) {
        if (kt->gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate)) return;
        /* The level's kernel refused: its packing scratch (cf__bf16_pack_scratch) could not be
         * allocated. fp32's product is valid and more precise, but not what was asked for: said
         * once per process on stderr, as to_bf16 says it on a CPU without bf16 kernels. */
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            fprintf(stderr,
                    "corefit: the bf16 GEMM (%s level) could not allocate its packing scratch "
                    "for a %d x %d x %d product (out of memory): computed in fp32, as is any "
                    "later product in that case (said once)\n",
                    cf_isa_name(cf_isa_active()), m, n, k);
    }
    cf_sgemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}
