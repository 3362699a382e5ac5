/* Times one training step of workload W1 (mini-resnet on Fashion-MNIST-sized images, batch 64):
 * forward, cross-entropy, backward and fastai's Adam step, single process, on random data, and
 * prints ms/step, images/s and the achieved GFLOP/s beside the single-thread SGEMM rate measured
 * in the same run, then a per-layer breakdown.
 *
 *   bench_step [--threads N] [--steps S] [--reps R] [--batch B] [--no-breakdown] [--check]
 *              [--bf16]
 *
 *   --threads N      cf_set_num_threads(N)                                      (default 1)
 *   --steps S        steps per timed repetition                                 (default 20)
 *   --reps R         timed repetitions; the median and the best are printed     (default 7)
 *   --no-breakdown   skip the per-layer table (it runs extra steps with timers around every
 *                    module's forward and backward)
 *   --check          after the timing, re-seed and run 10 steps from the same start, and print
 *                    the final loss and a checksum of the weights (same thread count, same
 *                    build: the same line on every run; it is the determinism check; with
 *                    --bf16, in mixed precision too)
 *   --bf16           the convolutions and Linear layers in mixed precision (cf_conv_set_bf16,
 *                    cf_linear_set_bf16) where the kernel level computes in bf16
 *
 * Times: the median and best wall time per step over the repetitions, and the median CPU time per
 * step (process CPU time, all threads): on a machine shared with other jobs the one-thread CPU
 * time is close to what a step takes on an idle core. The SGEMM rate is measured both ways.
 *
 * GFLOP/s counts 2 FLOPs per multiply-add of the convolutions and linear layers, three products
 * per training step (forward, input gradient, weight gradient) less the stem's input gradient,
 * which is never computed; element-wise layers are not counted (the convention of bench_w1).
 * Nothing here reads the dataset: a step's cost does not depend on the pixel values. */
#include <corefit.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

/* ---- per-module timers ---------------------------------------------------------------------- */

typedef struct timed {
    cf_module_ops ops; /* first: a module's ops pointer leads back to its entry */
    const cf_module_ops *orig;
    cf_module *m;
    char name[200];
    int depth;
    bool leaf;
    double fwd, bwd;         /* inclusive seconds */
    double fwd_kid, bwd_kid; /* seconds of the children (for self time) */
    int parent;
} timed;

#define MAX_TIMED 128
static timed timers[MAX_TIMED];
static int n_timers;
static int stack[64], depth_now; /* entries being timed */

static timed *entry_of(cf_module *m) {
    return (timed *)((char *)m->ops - offsetof(timed, ops));
}

/* The breakdown's clock: CPU time of the process, all threads (see cpu_now). */
static double cpu_now(void);

static const cf_tensor *timed_forward(cf_module *m, const cf_tensor *x) {
    timed *t = entry_of(m);
    m->ops = t->orig; /* layers that inspect m->ops->kind see the original */
    stack[depth_now++] = (int)(t - timers);
    double t0 = cpu_now();
    const cf_tensor *y = t->orig->forward(m, x);
    double dt = cpu_now() - t0;
    depth_now--;
    t->fwd += dt;
    if (t->parent >= 0) timers[t->parent].fwd_kid += dt;
    m->ops = &t->ops;
    return y;
}

static const cf_tensor *timed_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    timed *t = entry_of(m);
    m->ops = t->orig;
    stack[depth_now++] = (int)(t - timers);
    double t0 = cpu_now();
    const cf_tensor *dx = t->orig->backward(m, dy, need_dx);
    double dt = cpu_now() - t0;
    depth_now--;
    t->bwd += dt;
    if (t->parent >= 0) timers[t->parent].bwd_kid += dt;
    m->ops = &t->ops;
    return dx;
}

static void install_timers(cf_module *m, const char *name, int depth, int parent) {
    if (n_timers >= MAX_TIMED) return;
    int id = n_timers++;
    timed *t = &timers[id];
    t->orig = m->ops;
    t->ops = *m->ops;
    t->ops.forward = timed_forward;
    t->ops.backward = timed_backward;
    t->m = m;
    t->depth = depth;
    t->leaf = m->n_children == 0;
    t->parent = parent;
    snprintf(t->name, sizeof t->name, "%s", name);
    m->ops = &t->ops;
    for (int i = 0; i < m->n_children; i++) {
        char child[200];
        snprintf(child, sizeof child, "%.120s%s%.60s", name, *name ? "." : "", m->child_names[i]);
        install_timers(m->children[i], child, depth + 1, id);
    }
}

static void remove_timers(void) {
    for (int i = 0; i < n_timers; i++) timers[i].m->ops = timers[i].orig;
}

/* ---- FLOPs of a step ------------------------------------------------------------------------ */

typedef struct flops {
    double fwd, step;
    bool first_conv_seen;
} flops;

static void count_flops(const cf_module *m, flops *f) {
    const char *kind = m->ops->kind;
    if (strcmp(kind, "Conv2d") == 0 || strcmp(kind, "Linear") == 0) {
        const cf_shape *w = &m->params[0].shape;
        double macs = (double)m->out.shape.dim[0] * (double)cf_shape_sample_numel(&m->out.shape);
        for (int i = 1; i < w->ndim; i++) macs *= w->dim[i]; /* inputs per output */
        f->fwd += 2 * macs;
        bool first = !f->first_conv_seen;
        f->first_conv_seen = true;
        f->step += 2 * macs * (first ? 2 : 3); /* no input gradient for the first layer */
    }
    for (int i = 0; i < m->n_children; i++) count_flops(m->children[i], f);
}

/* ---- the step ------------------------------------------------------------------------------- */

typedef struct bench {
    cf_model *model;
    cf_optimizer *opt;
    cf_loss loss;
    cf_tensor x, y, dpred;
    float last_loss;
    double t_loss, t_opt, t_zero; /* accumulated by timed steps */
} bench;

static int train_step(bench *b, bool timed_parts) {
    const cf_tensor *pred;
    double t0 = timed_parts ? cpu_now() : 0;
    cf_optimizer_zero_grad(b->opt);
    double t1 = timed_parts ? cpu_now() : 0;
    if (cf_model_forward(b->model, &b->x, &pred) != CF_OK) return 1;
    double t2 = timed_parts ? cpu_now() : 0;
    if (cf_loss_forward(&b->loss, pred, &b->y, &b->last_loss, NULL) != CF_OK) return 1;
    b->dpred.shape = pred->shape;
    cf_loss_backward(&b->loss, pred, &b->y, &b->dpred);
    double t3 = timed_parts ? cpu_now() : 0;
    if (cf_model_backward(b->model, &b->dpred) != CF_OK) return 1;
    double t4 = timed_parts ? cpu_now() : 0;
    cf_optimizer_step(b->opt);
    if (timed_parts) {
        double t5 = cpu_now();
        b->t_zero += t1 - t0;
        b->t_loss += t3 - t2;
        b->t_opt += t5 - t4;
    }
    return 0;
}

static int setup(bench *b, int batch, uint64_t seed) {
    memset(b, 0, sizeof *b);
    if (cf_model_new(&b->model, cf_mini_resnet(1, 10), seed) != CF_OK) return 1;
    cf_opt_config oc = cf_opt_adam_defaults();
    oc.hypers.lr = 1e-3;
    oc.hypers.mom = 0.9;
    if (cf_optimizer_new(&b->opt, b->model, &oc) != CF_OK) return 1;
    b->loss = (cf_loss){.kind = CF_LOSS_CROSS_ENTROPY};
    b->x = cf_tensor_view(cf_malloc((size_t)batch * 28 * 28 * sizeof(float)),
                          cf_shape4(batch, 1, 28, 28));
    b->y = cf_tensor_view(cf_malloc((size_t)batch * sizeof(float)), cf_shape1(batch));
    b->dpred = cf_tensor_view(cf_malloc((size_t)batch * 10 * sizeof(float)), cf_shape2(batch, 10));
    if (!b->x.data || !b->y.data || !b->dpred.data) return 1;
    cf_rng rng;
    cf_rng_seed(&rng, seed + 17);
    for (size_t i = 0; i < cf_tensor_numel(&b->x); i++) {
        /* Fashion-MNIST-like: many zero pixels (after normalisation, -0.81), the rest spread */
        double u = cf_rng_uniform(&rng);
        float v = u < 0.5 ? 0.0f : (float)cf_rng_uniform(&rng);
        b->x.data[i] = (v - 0.2860f) / 0.3530f;
    }
    for (int i = 0; i < batch; i++) b->y.data[i] = (float)cf_rng_below(&rng, 10);
    return 0;
}

static void teardown(bench *b) {
    cf_optimizer_free(b->opt);
    cf_model_free(b->model);
    cf_free(b->x.data);
    cf_free(b->y.data);
    cf_free(b->dpred.data);
}

/* Single-thread SGEMM 512^3 through OpenBLAS: the best repetition by wall time and by CPU
 * time (*cpu_rate). */
static double sgemm_rate(int n, double seconds, double *cpu_rate) {
    float *a = cf_malloc((size_t)n * n * sizeof(float)), *bm = cf_malloc((size_t)n * n * 4),
          *c = cf_malloc((size_t)n * n * 4);
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = bm[i] = 0.001f * (float)(i % 1000);
    cf_sgemm(false, false, n, n, n, 1, a, n, bm, n, 0, c, n);
    double best = 1e30, best_cpu = 1e30, start = cf_now();
    while (cf_now() - start < seconds) {
        double t = cf_now(), u = cpu_now();
        cf_sgemm(false, false, n, n, n, 1, a, n, bm, n, 0, c, n);
        t = cf_now() - t;
        u = cpu_now() - u;
        if (t < best) best = t;
        if (u > 0 && u < best_cpu) best_cpu = u;
    }
    cf_free(a);
    cf_free(bm);
    cf_free(c);
    *cpu_rate = 2.0 * n * n * n / best_cpu * 1e-9;
    return 2.0 * n * n * n / best * 1e-9;
}

/* CPU seconds of the whole process (every thread): on a machine shared with other jobs, the
 * one-thread CPU time per step is close to what the step takes on an idle core, while the wall
 * time also counts the time the scheduler gave the core to others. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_breakdown(bench *b, int steps, double step_ms) {
    printf("\nper-layer breakdown (%d steps with timers; CPU ms per step summed over threads, self "
           "time; %% of the median CPU time per step)\n",
           steps);
    printf("%-28s %-22s %8s %8s %8s %6s\n", "module", "kind", "fwd", "bwd", "total", "%");
    double sum = 0;
    for (int i = 0; i < n_timers; i++) {
        timed *t = &timers[i];
        double f = (t->fwd - t->fwd_kid) / steps * 1e3, bw = (t->bwd - t->bwd_kid) / steps * 1e3;
        sum += f + bw;
        if (f + bw < 0.005 && !t->leaf) continue;
        printf("%-28s %-22s %8.3f %8.3f %8.3f %6.1f\n", *t->name ? t->name : "(root)",
               t->orig->kind, f, bw, f + bw, 100 * (f + bw) / step_ms);
    }
    double zl = b->t_zero / steps * 1e3, lo = b->t_loss / steps * 1e3, op = b->t_opt / steps * 1e3;
    printf("%-28s %-22s %8s %8s %8.3f %6.1f\n", "zero_grad", "", "", "", zl, 100 * zl / step_ms);
    printf("%-28s %-22s %8s %8s %8.3f %6.1f\n", "loss fwd+bwd", "", "", "", lo, 100 * lo / step_ms);
    printf("%-28s %-22s %8s %8s %8.3f %6.1f\n", "Adam step", "", "", "", op, 100 * op / step_ms);
    sum += zl + lo + op;
    /* by kind */
    const char *kinds[32];
    double kf[32] = {0}, kb[32] = {0};
    int nk = 0;
    for (int i = 0; i < n_timers; i++) {
        timed *t = &timers[i];
        int k = 0;
        while (k < nk && strcmp(kinds[k], t->orig->kind) != 0) k++;
        if (k == nk && nk < 32) kinds[nk++] = t->orig->kind;
        if (k < 32) {
            kf[k] += (t->fwd - t->fwd_kid) / steps * 1e3;
            kb[k] += (t->bwd - t->bwd_kid) / steps * 1e3;
        }
    }
    printf("\nby kind (CPU ms per step, self time)\n");
    for (int k = 0; k < nk; k++) {
        if (kf[k] + kb[k] < 0.005) continue;
        printf("%-28s %-22s %8.3f %8.3f %8.3f %6.1f\n", kinds[k], "", kf[k], kb[k], kf[k] + kb[k],
               100 * (kf[k] + kb[k]) / step_ms);
    }
    printf("%-28s %-22s %8s %8s %8.3f %6.1f\n", "sum of parts", "", "", "", sum,
           100 * sum / step_ms);
}

int main(int argc, char **argv) {
    int threads = 1, steps = 20, reps = 7, batch = 64;
    bool breakdown = true, check = false, bf16 = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-breakdown") == 0)
            breakdown = false;
        else if (strcmp(argv[i], "--check") == 0)
            check = true;
        else if (strcmp(argv[i], "--bf16") == 0)
            bf16 = true;
        else {
            fprintf(stderr,
                    "usage: %s [--threads N] [--steps S] [--reps R] [--batch B] "
                    "[--no-breakdown] [--check] [--bf16]\n",
                    argv[0]);
            return 2;
        }
    }
    if (threads < 1 || steps < 1 || reps < 1 || reps > 1000 || batch < 2) {
        fprintf(stderr, "bench_step: bad arguments\n");
        return 2;
    }
    cf_set_num_threads(threads);
    double sgemm_cpu, sgemm = sgemm_rate(512, 0.5, &sgemm_cpu);

    bench b;
    if (setup(&b, batch, 42) != 0) {
        fprintf(stderr, "bench_step: %s\n", cf_last_error());
        return 1;
    }
    if (bf16) { /* as cf_learner_to_bf16: where the kernel level has bf16 compute */
        cf_conv_set_bf16(b.model->root, true);
        cf_linear_set_bf16(b.model->root, true);
        printf("bf16: %s\n", cf_bf16_compute() ? "convolutions and Linear layers in bf16"
                                               : "no bf16 kernels at this level: fp32");
    }
    for (int i = 0; i < 5; i++)
        if (train_step(&b, false)) {
            fprintf(stderr, "bench_step: %s\n", cf_last_error());
            return 1;
        }
    flops f = {0};
    count_flops(b.model->root, &f);

    double per_step[1000], cpu_step[1000];
    for (int r = 0; r < reps; r++) {
        double t0 = cf_now(), c0 = cpu_now();
        for (int s = 0; s < steps; s++) train_step(&b, false);
        per_step[r] = (cf_now() - t0) / steps;
        cpu_step[r] = (cpu_now() - c0) / steps;
    }
    qsort(per_step, (size_t)reps, sizeof(double), cmp_double);
    qsort(cpu_step, (size_t)reps, sizeof(double), cmp_double);
    double cpu_med =
        reps % 2 ? cpu_step[reps / 2] : 0.5 * (cpu_step[reps / 2 - 1] + cpu_step[reps / 2]);
    double med =
        reps % 2 ? per_step[reps / 2] : 0.5 * (per_step[reps / 2 - 1] + per_step[reps / 2]);
    double best = per_step[0];
    printf("W1 training step (mini-resnet, batch %d, fwd+loss+bwd+Adam), %d thread(s), kernels %s, "
           "OpenBLAS core %s\n",
           batch, threads, cf_isa_name(cf_isa_active()), cf_blas_core());
    printf("FLOPs per image per step: %.1f M (forward %.1f M)\n", f.step / batch * 1e-6,
           f.fwd / batch * 1e-6);
    printf("single-thread SGEMM 512^3: %.1f GFLOP/s (wall), %.1f GFLOP/s (CPU time)\n", sgemm,
           sgemm_cpu);
    printf("median %.3f ms/step  %.0f img/s  %.1f GFLOP/s (%.0f%% of SGEMM)\n", med * 1e3,
           batch / med, f.step / med * 1e-9, 100 * f.step / med * 1e-9 / sgemm);
    printf("best   %.3f ms/step  %.0f img/s  %.1f GFLOP/s (%.0f%% of SGEMM)\n", best * 1e3,
           batch / best, f.step / best * 1e-9, 100 * f.step / best * 1e-9 / sgemm);

    printf("cpu    %.3f ms/step of CPU time (all threads; median), %.3f per thread: %.0f img/s "
           "per core, %.1f GFLOP/s per core (%.0f%% of SGEMM by CPU time)\n",
           cpu_med * 1e3, cpu_med * 1e3 / threads, batch / cpu_med, f.step / cpu_med * 1e-9,
           100 * f.step / cpu_med * 1e-9 / sgemm_cpu);
    if (breakdown) {
        install_timers(b.model->root, "", 0, -1);
        b.t_loss = b.t_opt = b.t_zero = 0;
        int n = steps * (reps < 3 ? reps : 3);
        for (int s = 0; s < n; s++) train_step(&b, true);
        remove_timers();
        print_breakdown(&b, n, cpu_med * 1e3);
    }
    teardown(&b);

    if (check) {
        bench c;
        if (setup(&c, batch, 7) != 0) return 1;
        if (bf16) {
            cf_conv_set_bf16(c.model->root, true);
            cf_linear_set_bf16(c.model->root, true);
        }
        for (int s = 0; s < 10; s++) train_step(&c, false);
        uint64_t h = 1469598103934665603ULL;
        for (size_t i = 0; i < c.model->n_weights; i++) {
            uint32_t u;
            memcpy(&u, &c.model->weights[i], 4);
            h = (h ^ u) * 1099511628211ULL;
        }
        for (size_t i = 0; i < c.model->n_buffers; i++) {
            uint32_t u;
            memcpy(&u, &c.model->buffers[i], 4);
            h = (h ^ u) * 1099511628211ULL;
        }
        printf("check: 10 steps, loss %.7f, weights+buffers hash %016llx\n", (double)c.last_loss,
               (unsigned long long)h);
        teardown(&c);
    }
    return 0;
}
