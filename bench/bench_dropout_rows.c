/* W1's two keyed Dropouts (the head's Dropout(0.25) on 64 x 128 and Dropout(0.5) on 64 x 256, a
 * fit's draws) forward through the module, against the same draws and product as activation.c
 * made them before cf_dropout_keyed_row (scalar words a pair, then the product), in one process:
 *
 *   bench_dropout_rows [--reps R]
 *
 * R repetitions (default 61) of 200 forwards of both layers, the module (B) and the scalar loops
 * (A) alternating A B B A; prints the median microseconds a step's pair of forwards takes each
 * way and B / A, and checks that both give the same bytes. */
#include <corefit.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* activation.c's keyed forward before the kernel */
static void scalar_forward(const cf_rng *g, uint64_t key, const int64_t *ids, int rows, size_t per,
                           float p, const float *x, uint8_t *mask, float *y) {
    const uint64_t threshold = (uint64_t)llround((double)p * 4294967296.0);
    const uint64_t base = mix(mix(g->s[0] ^ mix(g->s[1])) ^ mix(key + 0x9e3779b97f4a7c15ULL));
    for (int b = 0; b < rows; b++) {
        const uint64_t row = mix(base ^ mix((uint64_t)ids[b] + 0x632be59bd9b4e019ULL));
        uint8_t *mr = mask + (size_t)b * per;
        for (size_t i = 0; i < per; i += 2) {
            uint64_t r = mix(row + (uint64_t)(i / 2 + 1) * 0x9e3779b97f4a7c15ULL);
            mr[i] = (r & 0xffffffffu) >= threshold;
            if (i + 1 < per) mr[i + 1] = (r >> 32) >= threshold;
        }
    }
    const float scale = 1.0f / (1.0f - p);
    const size_t n = (size_t)rows * per;
    for (size_t i = 0; i < n; i++) {
        const float v = x[i] * scale;
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        u &= 0u - (uint32_t)mask[i];
        memcpy(&y[i], &u, sizeof u);
    }
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int reps = 61;
    if (argc == 3 && strcmp(argv[1], "--reps") == 0) reps = atoi(argv[2]);
    if (reps < 2 || reps > 1000 || (argc != 1 && argc != 3)) {
        fprintf(stderr, "usage: %s [--reps R (2..1000)]\n", argv[0]);
        return 2;
    }
    static const int cols[2] = {128, 256};
    static const float ps[2] = {0.25f, 0.5f};
    enum { ROWS = 64 };
    int64_t ids[ROWS];
    for (int i = 0; i < ROWS; i++) ids[i] = 40000 + 13 * i;
    cf_model *m[2];
    float *x[2], *y[2];
    uint8_t *mask[2];
    for (int l = 0; l < 2; l++) {
        if (cf_model_new(&m[l], cf_dropout(ps[l]), 42) != CF_OK) return 1;
        cf_model_train(m[l], true);
        cf_model_set_draw_key(m[l], 0, ids, ROWS);
        const size_t n = (size_t)ROWS * cols[l];
        x[l] = malloc(n * 4), y[l] = malloc(n * 4), mask[l] = malloc(n);
        for (size_t i = 0; i < n; i++) x[l][i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    }
    double t[2][1000];
    int nr[2] = {0, 0};
    for (int r = 0; r < reps; r++) {
        const int side = ((r + 1) / 2) % 2; /* A B B A */
        const double t0 = cpu_now();
        for (int k = 0; k < 200; k++)
            for (int l = 0; l < 2; l++) {
                if (side) {
                    const cf_tensor tx = cf_tensor_view(x[l], cf_shape2(ROWS, cols[l]));
                    const cf_tensor *ty;
                    if (cf_model_forward(m[l], &tx, &ty) != CF_OK) return 1;
                } else
                    scalar_forward(&m[l]->root->rng, 0, ids, ROWS, (size_t)cols[l], ps[l], x[l],
                                   mask[l], y[l]);
            }
        t[side][nr[side]++] = (cpu_now() - t0) / 200;
    }
    for (int l = 0; l < 2; l++) { /* the same bytes both ways */
        const cf_tensor tx = cf_tensor_view(x[l], cf_shape2(ROWS, cols[l]));
        const cf_tensor *ty;
        if (cf_model_forward(m[l], &tx, &ty) != CF_OK) return 1;
        scalar_forward(&m[l]->root->rng, 0, ids, ROWS, (size_t)cols[l], ps[l], x[l], mask[l], y[l]);
        if (memcmp(ty->data, y[l], (size_t)ROWS * cols[l] * 4)) {
            fprintf(stderr, "bench_dropout_rows: the two ways differ\n");
            return 1;
        }
    }
    const double a = median(t[0], nr[0]), b = median(t[1], nr[1]);
    printf(
        "W1's two keyed Dropout forwards, kernels %s, %d reps of 200 a side: scalar (A) %.2f us, "
        "cf_dropout_keyed_row (B) %.2f us of thread CPU; B / A %.3f; the same bytes\n",
        cf_isa_name(cf_isa_active()), nr[1], a * 1e6, b * 1e6, b / a);
    for (int l = 0; l < 2; l++) {
        cf_model_free(m[l]);
        free(x[l]), free(y[l]), free(mask[l]);
    }
    return 0;
}
