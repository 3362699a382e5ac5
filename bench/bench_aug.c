/* The batch augmentation's bilinear sampling (cf_aug_apply without the lighting) against the
 * per-chunk scalar sampler it replaced (copied below as it stood), in one process, alternating
 * image set by image set, so that both see the same load; the outputs are compared bit for bit.
 *
 *   bench_aug [--rounds N] [--images B] [--size S] [--pad reflection|zeros|border]
 *
 * Each round samples B images of 3 x S x S (default 64 of 128 x 128, W3's batch) with
 * aug_transforms' default draws, once by each path (the first alternating); prints the CPU time
 * per batch of each path, medians over the rounds, their ratio, and the lighting's time per batch
 * (cf_aug_apply with the affine part off) for scale. */
#include <corefit.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* grid_sample's source coordinate (align_corners) for a grid value g over n pixels. */
static float source_coord(float g, int n, cf_pad_mode pad) {
    float x = (g + 1.0f) * 0.5f * (float)(n - 1);
    /* Past one pixel outside the image every tap reads zero padding, so the coordinate is held
     * at -2 or n: the same zeros, and no float-to-int conversion out of range (a perspective
     * warp's divisor near zero, or a NaN, would otherwise reach one). */
    if (pad == CF_PAD_ZEROS) return x >= -2.0f ? (x <= (float)n ? x : (float)n) : -2.0f;
    if (pad == CF_PAD_REFLECTION) { /* PyTorch's reflect_coordinates(x, 0, 2 (n - 1)) */
        if (n == 1) return 0.0f;
        float span = (float)(n - 1);
        x = fabsf(x);
        /* inside [0, span] the reflection is x itself (fmodf(x, span) is exact: x below span,
         * 0 at span with one flip, span - 0); past it, the general arithmetic */
        if (!(x <= span)) {
            float extra = fmodf(x, span);
            int flips = (int)floorf(x / span);
            x = flips % 2 == 0 ? extra : span - extra;
        }
    }
    return x < 0 ? 0.0f : x > (float)(n - 1) ? (float)(n - 1) : x;
}

/* The pixels of a row are sampled in chunks: their taps and weights first, then each plane. */
enum { AUG_CHUNK = 256 };

/* One chunk of output row i, pixels j0 .. j0 + n - 1: the top-left tap's offset, the four
 * bilinear weights, and whether all four taps lie in the image (else the per-tap checks). */
typedef struct aug_taps {
    int x0[AUG_CHUNK], y0[AUG_CHUNK];
    float wt[4][AUG_CHUNK];
    bool inside[AUG_CHUNK];
} aug_taps;

static void chunk_taps(const cf_aug_params *p, cf_pad_mode pad, int h, int w, int i, int j0, int n,
                       aug_taps *t) {
    const float yn = h > 1 ? -1.0f + 2.0f * (float)i / (float)(h - 1) : -1.0f;
    for (int q = 0; q < n; q++) {
        const int j = j0 + q;
        const float xn = w > 1 ? -1.0f + 2.0f * (float)j / (float)(w - 1) : -1.0f;
        float gx = p->mat[0][0] * xn + p->mat[0][1] * yn + p->mat[0][2];
        float gy = p->mat[1][0] * xn + p->mat[1][1] * yn + p->mat[1][2];
        if (p->has_warp) {
            const double *k = p->warp;
            double X = k[0] * gx + k[1] * gy + k[2], Y = k[3] * gx + k[4] * gy + k[5];
            double Z = k[6] * gx + k[7] * gy + 1.0;
            if (Z != 0.0) {
                gx = (float)(X / Z);
                gy = (float)(Y / Z);
            }
        }
        const float ix = source_coord(gx, w, pad), iy = source_coord(gy, h, pad);
        /* floorf, which a non-negative coordinate's truncation equals */
        const int x0 = ix >= 0.0f ? (int)ix : (int)floorf(ix);
        const int y0 = iy >= 0.0f ? (int)iy : (int)floorf(iy);
        const float ax = ix - (float)x0, ay = iy - (float)y0;
        t->x0[q] = x0;
        t->y0[q] = y0;
        t->wt[0][q] = (1 - ax) * (1 - ay);
        t->wt[1][q] = ax * (1 - ay);
        t->wt[2][q] = (1 - ax) * ay;
        t->wt[3][q] = ax * ay;
        t->inside[q] = x0 >= 0 && x0 < w - 1 && y0 >= 0 && y0 < h - 1;
    }
}

/* Samples one plane for a chunk: the taps in the order (x0, y0), (x0 + 1, y0), (x0, y0 + 1),
 * (x0 + 1, y0 + 1), added to 0 as products with their weights; a tap outside the image adds
 * nothing (grid_sample's zeros; the padding modes moved the coordinate inside before). */
static void chunk_sample(const aug_taps *t, const float *src, int h, int w, int n, float *out) {
    for (int q = 0; q < n; q++) {
        const int x0 = t->x0[q], y0 = t->y0[q];
        float v = 0.0f;
        if (t->inside[q]) {
            const float *s = src + (size_t)y0 * w + x0;
            v += s[0] * t->wt[0][q];
            v += s[1] * t->wt[1][q];
            v += s[w] * t->wt[2][q];
            v += s[w + 1] * t->wt[3][q];
        } else {
            const int tx[4] = {x0, x0 + 1, x0, x0 + 1}, ty[4] = {y0, y0, y0 + 1, y0 + 1};
            for (int k = 0; k < 4; k++)
                if (tx[k] >= 0 && tx[k] < w && ty[k] >= 0 && ty[k] < h)
                    v += src[(size_t)ty[k] * w + tx[k]] * t->wt[k][q];
        }
        out[q] = v;
    }
}

static void old_sample(const cf_aug_params *p, cf_pad_mode pad, const float *in, int c, int h,
                       int w, float *out) {
    const size_t plane = (size_t)h * w;
    aug_taps t;
    for (int i = 0; i < h; i++)
        for (int j0 = 0; j0 < w; j0 += AUG_CHUNK) {
            const int n = w - j0 < AUG_CHUNK ? w - j0 : AUG_CHUNK;
            chunk_taps(p, pad, h, w, i, j0, n, &t);
            for (int ch = 0; ch < c; ch++)
                chunk_sample(&t, in + (size_t)ch * plane, h, w, n,
                             out + (size_t)ch * plane + (size_t)i * w + j0);
        }
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int rounds = 40, images = 64, size = 128;
    cf_pad_mode pad = CF_PAD_REFLECTION;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--rounds") && a + 1 < argc)
            rounds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--images") && a + 1 < argc)
            images = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--size") && a + 1 < argc)
            size = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--pad") && a + 1 < argc) {
            a++;
            pad = !strcmp(argv[a], "zeros")    ? CF_PAD_ZEROS
                  : !strcmp(argv[a], "border") ? CF_PAD_BORDER
                                               : CF_PAD_REFLECTION;
        } else {
            fprintf(stderr, "usage: bench_aug [--rounds N] [--images B] [--size S] [--pad P]\n");
            return 2;
        }
    }
    if (rounds < 1 || images < 1 || size < 1) return 2;
    const int c = 3, h = size, w = size;
    const size_t per = (size_t)c * h * w;
    float *img = malloc(per * images * sizeof(float)), *a = malloc(per * images * sizeof(float)),
          *b = malloc(per * images * sizeof(float));
    double *t_old = malloc(rounds * sizeof(double)), *t_new = malloc(rounds * sizeof(double)),
           *t_light = malloc(rounds * sizeof(double));
    if (!img || !a || !b || !t_old || !t_new || !t_light) return 1;
    uint64_t s = 12345;
    for (size_t i = 0; i < per * images; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        img[i] = (float)(s >> 40) / (float)(1 << 24);
    }
    const cf_aug_opts o = cf_aug_transforms_defaults(1.0f);
    size_t differ = 0;
    for (int r = 0; r < rounds; r++) {
        cf_aug_params *ps = malloc(images * sizeof *ps);
        for (int k = 0; k < images; k++) {
            cf_aug_draw(&o, 7, r, k, h, w, &ps[k]);
            ps[k].has_affine = true; /* every image sampled (the draws skip a quarter) */
        }
        for (int m = 0; m < 2; m++) {
            const bool use_new = (m == 0) == (r % 2 == 0);
            const double t0 = cpu_s();
            for (int k = 0; k < images; k++) {
                cf_aug_params p = ps[k];
                p.has_lighting = false;
                if (use_new)
                    cf_aug_apply(&p, pad, img + per * k, c, h, w, a + per * k);
                else
                    old_sample(&p, pad, img + per * k, c, h, w, b + per * k);
            }
            (use_new ? t_new : t_old)[r] = cpu_s() - t0;
        }
        if (memcmp(a, b, per * images * sizeof(float))) differ++;
        const double t0 = cpu_s();
        for (int k = 0; k < images; k++) {
            cf_aug_params p = ps[k];
            p.has_affine = p.has_warp = false;
            p.has_lighting = true;
            cf_aug_apply(&p, pad, a + per * k, c, h, w, b + per * k);
        }
        t_light[r] = cpu_s() - t0;
        free(ps);
    }
    const double mo = median(t_old, rounds), mn = median(t_new, rounds),
                 ml = median(t_light, rounds);
    printf("bench_aug: %d rounds of %d images 3 x %d x %d, pad %d, table %s\n", rounds, images, h,
           w, (int)pad, cf_isa_name(cf_isa_active()));
    printf("sampling per batch (CPU ms, medians): old %.2f new %.2f ratio new/old %.3f\n", 1e3 * mo,
           1e3 * mn, mn / mo);
    printf("lighting per batch (CPU ms, median): %.2f\n", 1e3 * ml);
    printf("bitwise: %s\n", differ ? "DIFFERENT" : "same bits in every round");
    free(img);
    free(a);
    free(b);
    free(t_old);
    free(t_new);
    free(t_light);
    return differ ? 1 : 0;
}
