/* No heap allocation in a training step: malloc and friends are counted (this program
 * interposes them over glibc's) from the 4th to the 9th training batch of a fit. The model has
 * convolutions, BatchNorm, pooling, a residual block, dropout and linear layers; the learner has
 * the default callbacks, a metric and a one-cycle schedule; the loader prefetches in its thread.
 *
 * Allocations made inside OpenBLAS are counted apart and printed, not failed: with its SkylakeX
 * kernels, OpenBLAS 0.3.21's small-matrix SGEMM path allocates a packing buffer on each call
 * for some small shapes, which corefit cannot prevent short of avoiding those shapes. */
#include "oracle.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "corefit.h"

#if defined(__SANITIZE_ADDRESS__)
/* AddressSanitizer owns malloc; this program's counting malloc cannot stand in for it. */
int main(void) {
    printf("skipped under AddressSanitizer\n");
    return 0;
}
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static atomic_bool counting;
static atomic_long allocations, blas_allocations;

/* Counts an allocation requested from `caller` (a return address). dladdr does not allocate. */
static void count(void *caller) {
    if (!atomic_load(&counting)) return;
    Dl_info info;
    if (dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "libopenblas"))
        atomic_fetch_add(&blas_allocations, 1);
    else
        atomic_fetch_add(&allocations, 1);
}

void *malloc(size_t n) {
    count(__builtin_return_address(0));
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t size) {
    count(__builtin_return_address(0));
    return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n) {
    count(__builtin_return_address(0));
    return __libc_realloc(p, n);
}
int posix_memalign(void **out, size_t align, size_t n) {
    count(__builtin_return_address(0));
    *out = __libc_memalign(align, n);
    return *out ? 0 : 12;
}
void *aligned_alloc(size_t align, size_t n) {
    count(__builtin_return_address(0));
    return __libc_memalign(align, n);
}
void free(void *p) {
    __libc_free(p);
}

static long counted_steps;

static cf_status start_counting(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (learn->train_iter == 3) atomic_store(&counting, true);
    return CF_OK;
}

static cf_status stop_counting(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (atomic_load(&counting)) counted_steps++;
    if (learn->train_iter == 9) atomic_store(&counting, false);
    return CF_OK;
}

static void run(int threads) {
    cf_set_num_threads(threads);
    int n = 256;
    float *x = __libc_malloc((size_t)n * 144 * sizeof(float)),
          *y = __libc_malloc(n * sizeof(float));
    fill_uniform(x, (size_t)n * 144, 3, 0, 1);
    for (int i = 0; i < n; i++) y[i] = (float)(i % 4);
    cf_dataset *train = NULL, *valid = NULL;
    assert_int_equal(
        cf_dataset_from_arrays(x, y, n, cf_shape_make(3, (int[]){1, 12, 12}), 1, 4, &train), CF_OK);
    assert_int_equal(
        cf_dataset_from_arrays(x, y, 64, cf_shape_make(3, (int[]){1, 12, 12}), 1, 4, &valid),
        CF_OK);
    __libc_free(x);
    __libc_free(y);
    cf_dls *dls = NULL;
    assert_int_equal(
        cf_dls_new(train, valid, &(cf_dls_options){.bs = 16, .flip = true, .crop_pad = 1}, &dls),
        CF_OK);
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    assert_int_equal(cf_vision_learner(&learn, dls, CF_ARCH_MINI_RESNET, .metrics = metrics,
                                       .n_metrics = 1, .quiet = true),
                     CF_OK);
    cf_callback counter = {.name = "AllocCounter", .order = -100, .skip_valid = true};
    counter.on[CF_EV_BEFORE_BATCH] = start_counting;
    cf_callback stopper = {.name = "AllocStopper", .order = 100, .skip_valid = true};
    stopper.on[CF_EV_AFTER_BATCH] = stop_counting;
    cf_callback *cbs[] = {&counter, &stopper};
    atomic_store(&allocations, 0);
    atomic_store(&blas_allocations, 0);
    counted_steps = 0;
    assert_int_equal(cf_fit_one_cycle(learn, 1, .cbs = cbs, .n_cbs = 2), CF_OK);
    assert_int_equal(counted_steps, 6);
    printf("%d thread(s): %ld allocations in corefit, %ld inside OpenBLAS (%s kernels) in 6 "
           "steps\n",
           threads, atomic_load(&allocations), atomic_load(&blas_allocations), cf_blas_core());
    if (atomic_load(&allocations) != 0)
        fail_msg("%ld heap allocations in 6 training steps on %d thread(s)",
                 atomic_load(&allocations), threads);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

static void test_no_allocation_one_thread(void **state) {
    (void)state;
    run(1);
}

static void test_no_allocation_two_threads(void **state) {
    (void)state;
    run(2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_allocation_one_thread),
        cmocka_unit_test(test_no_allocation_two_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
