/* The thread pool's adaptive spin (core/threads.c): how its threads wait between jobs changes
 * nothing in the results (a 2-thread fit of W1's model with the spin off, fixed and adaptive ends
 * with bitwise the same weights), the counters count, a pool left idle sleeps (it takes under 0.1
 * CPU-second in a second of idleness after a burst of jobs), and the lock-free hand-over of jobs
 * runs every part once and shows its stores to the caller however the threads wait, a late
 * worker's part running on the caller with its own chunk and id; the convolutions' weight gradient,
 * added inside the backward's job, is the threads' partial sums added in thread order. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/pool.h"
#include "learn_fixture.h"

static double process_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* one epoch (4 steps and the validation) of W1's model on two threads; its weights and buffers
 * copied out */
static void fit_two_threads(float **weights, int64_t *n_weights, float **buffers,
                            int64_t *n_buffers) {
    cf_set_num_threads(2);
    cf_dls *dls = NULL;
    cf_learner *learn = fixture_w1_learner(&dls);
    assert_int_equal(cf_fit_one_cycle(learn, 1, .lr_max = CF_LR(3e-3)), CF_OK);
    const cf_model *m = learn->model;
    *n_weights = m->n_weights;
    *n_buffers = m->n_buffers;
    *weights = malloc((size_t)m->n_weights * sizeof(float));
    *buffers = malloc((size_t)(m->n_buffers + 1) * sizeof(float));
    memcpy(*weights, m->weights, (size_t)m->n_weights * sizeof(float));
    memcpy(*buffers, m->buffers, (size_t)m->n_buffers * sizeof(float));
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_set_num_threads(0);
}

static void test_fit_identical_whatever_the_spin(void **state) {
    (void)state;
    const double spins[] = {-1 /* adaptive */, 0 /* none */, 20e3 /* 20 us */, 2e6 /* 2 ms */};
    float *w0 = NULL, *b0 = NULL;
    int64_t nw0 = 0, nb0 = 0;
    for (int k = 0; k < 4; k++) {
        cf__pool_set_spin(spins[k]);
        const cf__pool_stats before = cf__pool_get_stats();
        float *w = NULL, *b = NULL;
        int64_t nw = 0, nb = 0;
        fit_two_threads(&w, &nw, &b, &nb);
        const cf__pool_stats after = cf__pool_get_stats();
        assert_true(after.jobs > before.jobs); /* the fit ran on the pool */
        if (spins[k] == 0) /* no spin: a worker blocks between jobs unless the next was there */
            assert_true(after.worker_sleeps > before.worker_sleeps);
        if (k == 0) {
            w0 = w, b0 = b, nw0 = nw, nb0 = nb;
            continue;
        }
        assert_int_equal(nw, nw0);
        assert_int_equal(nb, nb0);
        if (memcmp(w, w0, (size_t)nw * sizeof(float)) != 0)
            fail_msg("spin %.0f ns: the weights differ from the adaptive spin's", spins[k]);
        if (memcmp(b, b0, (size_t)nb * sizeof(float)) != 0)
            fail_msg("spin %.0f ns: the buffers differ from the adaptive spin's", spins[k]);
        free(w);
        free(b);
    }
    free(w0);
    free(b0);
    cf__pool_set_spin(-1);
}

static void add_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    int64_t s = 0;
    for (int64_t i = begin; i < end; i++) s += i;
    atomic_fetch_add((_Atomic int64_t *)ctx, s);
}

/* Each part writes its range of slots with the job's number, in plain stores: the caller must
 * see every slot of every job written once the call returns. */
typedef struct stamp_job {
    int64_t *slot;
    int64_t job;
    _Atomic int64_t runs; /* parts run */
} stamp_job;

static void stamp_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    stamp_job *j = ctx;
    for (int64_t i = begin; i < end; i++) j->slot[i] = j->job;
    atomic_fetch_add(&j->runs, 1);
}

/* The hand-over of jobs without the mutex: with the threads always blocking (spin 0), briefly
 * spinning and adaptive, at 2 and 3 threads, every part of every job runs once, and the caller
 * sees its stores when cf_parallel_for returns; a lost wake-up would hang the test. */
static void test_every_part_runs_once_and_is_seen(void **state) {
    (void)state;
    enum { N = 257, JOBS = 3000 };
    static int64_t slot[N];
    const double spins[] = {0, 20e3, -1};
    for (int threads = 2; threads <= 3; threads++)
        for (size_t k = 0; k < sizeof spins / sizeof spins[0]; k++) {
            cf__pool_set_spin(spins[k]);
            cf_set_num_threads(threads);
            const int64_t n_parts = cf_get_num_threads();
            for (int64_t job = 1; job <= JOBS; job++) {
                stamp_job j = {.slot = slot, .job = job};
                /* sizes that vary give some workers no part on some jobs */
                const int64_t n = job % 5 == 0 ? 1 : N - job % 7;
                cf_parallel_for(n, stamp_range, &j);
                for (int64_t i = 0; i < n; i++)
                    if (slot[i] != job)
                        fail_msg("%d threads, spin %g: job %lld slot %lld holds %lld", threads,
                                 spins[k], (long long)job, (long long)i, (long long)slot[i]);
                const int64_t expect = n < n_parts ? n : n_parts;
                if (atomic_load(&j.runs) != expect)
                    fail_msg("%d threads, spin %g: job %lld ran %lld parts, not %lld", threads,
                             spins[k], (long long)job, (long long)atomic_load(&j.runs),
                             (long long)expect);
            }
        }
    cf__pool_set_spin(-1);
    cf_set_num_threads(0);
}

/* A part records its chunk, its id and the thread that ran it. */
typedef struct part_record {
    int64_t begin[4], end[4];
    pthread_t ran_on[4];
    _Atomic int runs[4];
} part_record;

static void record_part(void *ctx, int64_t begin, int64_t end, int thread) {
    part_record *r = ctx;
    r->begin[thread] = begin;
    r->end[thread] = end;
    r->ran_on[thread] = pthread_self();
    atomic_fetch_add(&r->runs[thread], 1);
}

/* A worker that has not started its part when the caller's own part is done (here always
 * asleep: no spin) has the part run by the caller, with the part's own chunk and id: every id
 * runs once, over the chunk a fixed split gives it, and some of the workers' parts ran on the
 * calling thread. (Its effect on a real fit is test_fit_identical_whatever_the_spin's.) */
static void test_late_workers_part_runs_on_the_caller(void **state) {
    (void)state;
    enum { JOBS = 2000 };
    const double spins[] = {0, -1};
    for (int threads = 2; threads <= 3; threads++)
        for (size_t k = 0; k < sizeof spins / sizeof spins[0]; k++) {
            cf__pool_set_spin(spins[k]);
            cf_set_num_threads(threads);
            int taken_over = 0;
            for (int job = 0; job < JOBS; job++) {
                part_record r;
                memset(&r, 0, sizeof r);
                const int64_t n = 10 + job % 7;
                cf_parallel_for(n, record_part, &r);
                for (int id = 0; id < threads; id++) {
                    const int64_t base = n / threads, extra = n % threads;
                    const int64_t b = id * base + (id < extra ? id : extra);
                    const int64_t e = b + base + (id < extra ? 1 : 0);
                    if (atomic_load(&r.runs[id]) != 1 || r.begin[id] != b || r.end[id] != e)
                        fail_msg("%d threads, spin %g, job %d: part %d ran %d times over [%lld, "
                                 "%lld), not once over [%lld, %lld)",
                                 threads, spins[k], job, id, atomic_load(&r.runs[id]),
                                 (long long)r.begin[id], (long long)r.end[id], (long long)b,
                                 (long long)e);
                    if (id > 0 && pthread_equal(r.ran_on[id], pthread_self())) taken_over++;
                }
                if (!pthread_equal(r.ran_on[0], pthread_self()))
                    fail_msg("job %d: part 0 ran on another thread than the caller's", job);
            }
            print_message("%d threads, spin %g: %d of %d workers' parts ran on the caller\n",
                          threads, spins[k], taken_over, JOBS * (threads - 1));
            if (spins[k] == 0 && taken_over == 0)
                fail_msg("%d threads, no spin: no late worker's part ran on the caller", threads);
        }
    cf__pool_set_spin(-1);
    cf_set_num_threads(0);
}

/* A burst of back-to-back jobs grows the spin's budget to its largest; then the pool is left
 * idle for a second: its worker spins at most that long (a millisecond) before it blocks. */
static void test_idle_pool_sleeps(void **state) {
    (void)state;
    cf__pool_set_spin(-1);
    cf_set_num_threads(2);
    _Atomic int64_t total = 0;
    for (int i = 0; i < 2000; i++) cf_parallel_for(1000, add_range, &total);
    assert_int_equal(atomic_load(&total), 2000 * (int64_t)(999 * 1000 / 2));
    const double cpu0 = process_cpu_seconds();
    struct timespec second = {1, 0};
    while (nanosleep(&second, &second) != 0) {
    }
    const double idle_cpu = process_cpu_seconds() - cpu0;
    print_message("CPU time of the idle pool over 1 s: %.4f s\n", idle_cpu);
    if (!(idle_cpu < 0.1)) fail_msg("an idle pool took %.3f CPU-s in one second", idle_cpu);
    cf_set_num_threads(0);
}

/* ---- the convolutions' weight gradient, added inside the backward's job ---------------------
 * conv.c adds the threads' partial sums of the implicit weight gradient into the gradient inside
 * the backward's job, in slices of output channels taken by whichever part ends once every
 * image's partial sums are written. Each thread's partial sum is a one-thread backward over its
 * chunk of the batch, so the gradient at T threads must be, bitwise, the in-order sum of the T
 * chunks' one-thread gradients (0 + P_0 + P_1 ...), whatever the spin (no spin: the workers'
 * parts mostly run on the caller, one after another; 2 ms: the threads run them side by side). */
typedef struct conv_case {
    int in, out, k, stride, pad, n, h, w;
    bool bf16;
} conv_case;

/* The weight gradient of one backward of the case's layer over images [b, e) of x and dy. */
static float *conv_wgrad(const conv_case *cc, const float *x, const float *dy, int b, int e,
                         size_t *numel) {
    cf_module *layer = cf_conv2d(cc->in, cc->out, cc->k, cc->stride, cc->pad, false);
    assert_non_null(layer);
    if (cc->bf16) cf_conv_set_bf16(layer, true);
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, layer, 7), CF_OK);
    const size_t in_n = (size_t)cc->in * cc->h * cc->w;
    cf_tensor xt =
        cf_tensor_view((float *)x + (size_t)b * in_n, cf_shape4(e - b, cc->in, cc->h, cc->w));
    const cf_tensor *y = NULL;
    if (cf_model_forward(model, &xt, &y) != CF_OK) fail_msg("forward: %s", cf_last_error());
    const size_t out_n = cf_shape_numel(&y->shape) / (size_t)(e - b);
    cf_tensor dyt = cf_tensor_view((float *)dy + (size_t)b * out_n, y->shape);
    cf_model_zero_grad(model);
    /* with dx, which the parts compute after their partial sums (cf_model_backward asks the
     * root for none) */
    assert_non_null(model->root->ops->backward(model->root, &dyt, true));
    const cf_param *w = cf_model_param(model, "weight");
    *numel = w->numel;
    float *g = malloc(w->numel * sizeof(float));
    memcpy(g, w->grad, w->numel * sizeof(float));
    cf_model_free(model);
    return g;
}

static void test_conv_wgrad_reduced_in_the_job(void **state) {
    (void)state;
    const conv_case cases[] = {
        {16, 20, 3, 2, 1, 7, 14, 14, false}, /* implicit, stride 2 */
        {8, 12, 3, 1, 1, 5, 9, 7, false},    /* implicit, stride 1 */
        {16, 24, 1, 2, 0, 6, 10, 10, false}, /* 1x1 stride 2: dx, then the weight gradient */
        {16, 20, 3, 1, 1, 7, 8, 8, true},    /* bf16 implicit (fp32 where the CPU has no bf16) */
        {16, 20, 3, 2, 1, 7, 14, 14, true},
    };
    const double spins[] = {-1, 0, 2e6};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const conv_case *cc = &cases[ci];
        cf_conv_geom g;
        cf_conv_geom_init(&g, cc->in, cc->h, cc->w, cc->k, cc->k, cc->stride, cc->stride, cc->pad,
                          cc->pad);
        if (!cf_conv_implicit_supported(&g)) { /* this level lowers: no implicit kernels */
            print_message("case %zu: no implicit kernels at this level, not checked\n", ci);
            continue;
        }
        const int oh = (cc->h + 2 * cc->pad - cc->k) / cc->stride + 1,
                  ow = (cc->w + 2 * cc->pad - cc->k) / cc->stride + 1;
        const size_t nx = (size_t)cc->n * cc->in * cc->h * cc->w,
                     ny = (size_t)cc->n * cc->out * oh * ow;
        float *x = malloc(nx * sizeof(float)), *dy = malloc(ny * sizeof(float));
        fill_uniform(x, nx, 11 + ci, -1, 1);
        fill_uniform(dy, ny, 21 + ci, -1, 1);
        for (int threads = 2; threads <= 3; threads++) {
            /* the expected gradient: the chunks' one-thread gradients added in thread order */
            cf_set_num_threads(1);
            size_t numel = 0;
            float *want = NULL;
            for (int t = 0; t < threads; t++) {
                const int base = cc->n / threads, extra = cc->n % threads;
                const int b = t * base + (t < extra ? t : extra), e = b + base + (t < extra);
                float *part = conv_wgrad(cc, x, dy, b, e, &numel);
                if (!want) {
                    want = calloc(numel, sizeof(float));
                }
                for (size_t i = 0; i < numel; i++) want[i] += part[i];
                free(part);
            }
            cf_set_num_threads(threads);
            for (size_t k = 0; k < sizeof spins / sizeof spins[0]; k++) {
                cf__pool_set_spin(spins[k]);
                size_t got_n = 0;
                float *got = conv_wgrad(cc, x, dy, 0, cc->n, &got_n);
                assert_int_equal(got_n, numel);
                for (size_t i = 0; i < numel; i++)
                    if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                        fail_msg("case %zu, %d threads, spin %g: dW[%zu] = %.9g, the chunks' sum "
                                 "%.9g",
                                 ci, threads, spins[k], i, got[i], want[i]);
                free(got);
            }
            free(want);
        }
        free(x);
        free(dy);
    }
    cf__pool_set_spin(-1);
    cf_set_num_threads(0);
}

int main(void) {
    unsetenv("CF_POOL_TAKE_OVER"); /* read when the pool starts: these tests need the default */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fit_identical_whatever_the_spin),
        cmocka_unit_test(test_idle_pool_sleeps),
        cmocka_unit_test(test_every_part_runs_once_and_is_seen),
        cmocka_unit_test(test_late_workers_part_runs_on_the_caller),
        cmocka_unit_test(test_conv_wgrad_reduced_in_the_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
