/* What the bf16 paths do when something fails, and the memory a bf16 Conv2d plans:
 *   - cf_sgemm_bf16 whose level's kernel cannot allocate its packing scratch computes in fp32
 *     (bitwise cf_sgemm's) and says so once on stderr: with the scratch's allocation really
 *     failing (an address-space limit in a child process) and with a kernel that refuses, as
 *     the tests of the packed GEMM simulate it; a product that succeeds says nothing;
 *   - a cf_conv_bf16_* call that fails inside Conv2d's forward or backward (made to fail through
 *     the layer's test hook, call by call, and for real: a pack whose stamp names another layer)
 *     is returned by cf_model_forward / cf_model_backward, naming the layer, the pass and the
 *     cause, and stops a Learner's fit before the optimizer step: the weights stay as they were;
 *   - a Conv2d that takes the bf16 Winograd plans no pack for the implicit bf16 convolution
 *     (and no more memory than in fp32), while an implicit bf16 layer has it and gives
 *     cf_conv_bf16_forward's and _dx's results bitwise.
 * ctest runs it at the best level, capped at each level below, and at the emulated amx level;
 * below avx512_bf16 there is no bf16 kernel to fail, and it checks that nothing is said. */
#include "learn_fixture.h"
#include "oracle.h"

#include "child.h"
#include "corefit/nn.h"
#include "nn/nn_internal.h"
#include "tensor/kernel_table.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define FAULTS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAULTS_ASAN 1
#endif
#endif
#ifndef FAULTS_ASAN
#define FAULTS_ASAN 0
#endif

static const char *const said_fp32 = "corefit: the bf16 GEMM";

/* How many times needle occurs in text. */
static int occurrences(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* ---- cf_sgemm_bf16 without its packing scratch ----------------------------------------------- */

/* In a child: a 2 x 2 x 2^22 product whose packed A (8 or 32 rows of pairs: 64 or 256 MiB) cannot
 * be allocated under an address-space limit 24 MiB above what the process maps, twice, with
 * stderr in a file: both products fp32's bitwise, the file one line saying so. */
static void scratch_refused_child(const char *dir, test_outcome *out) {
    (void)dir;
    const int m = 2, n = 2, k = 1 << 22;
    float *a = malloc((size_t)m * k * sizeof(float)), *b = malloc((size_t)k * n * sizeof(float));
    float want[4], want_acc[4], got[4], got_acc[4];
    fill_uniform(a, (size_t)m * k, 21, -1, 1);
    fill_uniform(b, (size_t)k * n, 22, -1, 1);
    /* fp32's products first, so that OpenBLAS has its buffers before the limit */
    cf_sgemm(false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, want, n);
    memcpy(want_acc, want, sizeof want);
    cf_sgemm(false, false, m, n, k, 1.0f, a, k, b, n, 1.0f, want_acc, n);
    FILE *err = tmpfile();
    const int saved = dup(2);
    if (!err || saved < 0 || dup2(fileno(err), 2) < 0) {
        snprintf(out->msg, sizeof out->msg, "cannot redirect stderr");
        out->status = 1;
        return;
    }
    const rlim_t limit = (rlim_t)(test_vm_size_bytes() + (24l << 20));
    struct rlimit rl = {limit, limit};
    if (setrlimit(RLIMIT_AS, &rl) != 0) {
        dup2(saved, 2);
        snprintf(out->msg, sizeof out->msg, "setrlimit failed");
        out->status = 1;
        return;
    }
    cf_sgemm_bf16(false, false, m, n, k, a, k, b, n, got, n, false);
    memcpy(got_acc, got, sizeof got);
    cf_sgemm_bf16(false, false, m, n, k, a, k, b, n, got_acc, n, true);
    fflush(stderr);
    dup2(saved, 2);
    char text[4096] = "";
    rewind(err);
    const size_t len = fread(text, 1, sizeof text - 1, err);
    text[len] = '\0';
    if (memcmp(got, want, sizeof want) || memcmp(got_acc, want_acc, sizeof want_acc)) {
        snprintf(out->msg, sizeof out->msg,
                 "without its scratch the product is not fp32's: %.9g against %.9g", got[0],
                 want[0]);
        out->status = 1;
    } else if (occurrences(text, said_fp32) != 1 || !strstr(text, "fp32") ||
               !strstr(text, cf_isa_name(cf_isa_active()))) {
        snprintf(out->msg, sizeof out->msg,
                 "two products without their scratch: stderr should say so once, naming the "
                 "level and fp32; it said: \"%.200s\"",
                 text);
        out->status = 1;
    }
}

static void test_scratch_refused(void **state) {
    (void)state;
    if (!cf_bf16_compute()) {
        print_message("no bf16 kernels at %s: no scratch to refuse\n",
                      cf_isa_name(cf_isa_active()));
        skip();
    }
    if (FAULTS_ASAN) {
        print_message("address-space limits cannot be tested under AddressSanitizer\n");
        skip();
    }
    const test_outcome o = test_in_child(scratch_refused_child, ".");
    if (o.status) fail_msg("%s", o.msg);
}

static int refusals;

/* the level's GEMM as when its scratch cannot be had */
static bool gemm_refused(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc, bool accumulate) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb,
        (void)c, (void)ldc, (void)accumulate;
    refusals++;
    return false;
}

/* At the active level a product says nothing; with the level's GEMM refusing (a table that has
 * only that bf16 kernel below avx512_bf16), three products are fp32's bitwise and stderr says so
 * once. Runs in this process after the child above, which says it in its own. */
static void test_gemm_refused(void **state) {
    (void)state;
    enum { M = 19, N = 37, K = 45 };
    float a[M * K], b[K * N], want[M * N], got[M * N], c0[M * N];
    fill_uniform(a, sizeof a / sizeof a[0], 31, -1, 1);
    fill_uniform(b, sizeof b / sizeof b[0], 32, -1, 1);
    fill_uniform(c0, sizeof c0 / sizeof c0[0], 33, -1, 1);
    test_stderr_capture();
    cf_sgemm_bf16(false, false, M, N, K, a, K, b, N, got, N, false);
    char *text = test_stderr_release();
    if (text[0]) fail_msg("a product at %s said: \"%s\"", cf_isa_name(cf_isa_active()), text);
    free(text);

    const cf_kernel_table *before = cf_active_kernels;
    static cf_kernel_table table;
    static cf_bf16_kernels refusing;
    table = *before;
    refusing = table.bf16 ? *table.bf16 : (cf_bf16_kernels){0};
    refusing.gemm = gemm_refused;
    table.bf16 = &refusing;
    refusals = 0;
    test_stderr_capture();
    cf_active_kernels = &table;
    bool same = true;
    for (int t = 0; t < 3; t++) { /* plain, transposed B, accumulated */
        const bool tb = t == 1, acc = t == 2;
        memcpy(want, c0, sizeof want);
        memcpy(got, c0, sizeof got);
        cf_sgemm(false, tb, M, N, K, 1.0f, a, K, b, tb ? K : N, acc ? 1.0f : 0.0f, want, N);
        cf_sgemm_bf16(false, tb, M, N, K, a, K, b, tb ? K : N, got, N, acc);
        same = same && memcmp(got, want, sizeof want) == 0;
    }
    cf_active_kernels = before;
    text = test_stderr_release();
    const int said = occurrences(text, said_fp32);
    print_message("%s", text);
    free(text);
    assert_int_equal(refusals, 3);
    if (!same) fail_msg("with its GEMM refusing, cf_sgemm_bf16 is not cf_sgemm's product");
    if (said != 1) fail_msg("three refused products were said %d times, not once", said);
}

/* ---- Conv2d's bf16 calls that fail ----------------------------------------------------------- */

#define MAX_CALLS 16
static const char *calls_seen[MAX_CALLS];
static int n_calls_seen;
static const char *failing; /* the call made to fail (NULL: none) */
static int failures;

/* Records each call's name; fails the one named `failing` as a failed kernel would (its own
 * message in cf_last_error). */
static cf_status fault(cf_status status, const char *call) {
    bool seen = false;
    for (int i = 0; i < n_calls_seen; i++) seen = seen || strcmp(calls_seen[i], call) == 0;
    if (!seen && n_calls_seen < MAX_CALLS) calls_seen[n_calls_seen++] = call;
    if (failing && strcmp(call, failing) == 0) {
        failures++;
        return cf_fail(CF_ERR_STATE, "%s: made to fail by the test", call);
    }
    return status;
}

/* W1's model (mini-resnet: implicit bf16 layers, stride-2 layers paired with their 1x1
 * shortcuts) in bf16, trained on 12 images of W1's size. */
static cf_learner *w1_learner(cf_dls **dls) {
    cf_learner *learn = fixture_w1_learner(dls);
    assert_int_equal(cf_learner_to_bf16(learn), CF_OK);
    return learn;
}

/* One forward and backward of learn's model; the statuses returned. */
static void passes(cf_learner *learn, const float *x, cf_status *fwd, cf_status *bwd) {
    cf_model *m = learn->model;
    cf_model_train(m, true);
    cf_tensor xt = cf_tensor_view((float *)x, cf_shape4(12, 1, 28, 28));
    const cf_tensor *y = NULL;
    *fwd = cf_model_forward(m, &xt, &y);
    static float dy[12 * 10];
    fill_uniform(dy, 12 * 10, 41, -1, 1);
    cf_tensor dyt = cf_tensor_view(dy, cf_shape2(12, 10));
    *bwd = cf_model_backward(m, &dyt);
}

/* Every cf_conv_bf16_* call W1's model makes in a pass, made to fail in turn: the pass that made
 * it returns the failure (a forward call in the forward, the others in the backward), its message
 * naming Conv2d, the pass and the call; the next passes without the failure succeed. Below
 * avx512_bf16 the model makes no such call. */
static void test_conv_calls_fail(void **state) {
    (void)state;
    cf_dls *dls = NULL;
    cf_learner *learn = w1_learner(&dls);
    float *x = malloc(12 * 28 * 28 * sizeof(float));
    fill_uniform(x, 12 * 28 * 28, 42, -1, 1);
    n_calls_seen = 0;
    failing = NULL;
    cf__conv_bf16_set_fault(fault);
    cf_status fwd, bwd;
    passes(learn, x, &fwd, &bwd);
    assert_int_equal(fwd, CF_OK);
    assert_int_equal(bwd, CF_OK);
    const int n_calls = n_calls_seen;
    for (int i = 0; i < n_calls; i++) print_message("the model calls %s\n", calls_seen[i]);
    if (!cf_bf16_compute()) {
        assert_int_equal(n_calls, 0);
    } else {
        bool forward = false, backward = false;
        for (int i = 0; i < n_calls; i++) {
            const bool f = strstr(calls_seen[i], "forward") != NULL;
            forward = forward || f;
            backward = backward || !f;
        }
        if (!forward || !backward) fail_msg("the model made no bf16 forward or backward call");
    }
    for (int i = 0; i < n_calls; i++) {
        const char *call = calls_seen[i];
        const bool in_forward = strstr(call, "forward") != NULL;
        failing = call;
        failures = 0;
        passes(learn, x, &fwd, &bwd);
        const cf_status st = in_forward ? fwd : bwd;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cf_last_error());
        failing = NULL;
        if (failures == 0) fail_msg("%s was not called again", call);
        if (st != CF_ERR_STATE)
            fail_msg("%s failed but the %s returned %s", call, in_forward ? "forward" : "backward",
                     cf_status_str(st));
        if (!in_forward && fwd != CF_OK)
            fail_msg("%s failed in the backward, yet the forward returned %s", call,
                     cf_status_str(fwd));
        if (!strstr(msg, "Conv2d(") || !strstr(msg, in_forward ? " forward: " : " backward: ") ||
            !strstr(msg, call) || !strstr(msg, "made to fail by the test"))
            fail_msg("the error of a failed %s does not name the layer, pass and cause: %s", call,
                     msg);
        passes(learn, x, &fwd, &bwd); /* the error does not stay */
        assert_int_equal(fwd, CF_OK);
        assert_int_equal(bwd, CF_OK);
    }
    cf__conv_bf16_set_fault(NULL);
    free(x);
    cf_learner_free(learn);
    cf_dls_free(dls);
}

/* A fit whose first backward has a bf16 call failing stops with that error, before the
 * optimizer step: the weights are those it started from. Without bf16 kernels it trains. */
static void test_fit_stops(void **state) {
    (void)state;
    cf_dls *dls = NULL;
    cf_learner *learn = w1_learner(&dls);
    cf_model *m = learn->model;
    float *start = malloc(m->n_weights * sizeof(float));
    memcpy(start, m->weights, m->n_weights * sizeof(float));
    n_calls_seen = 0;
    /* a training step reads dy as the words its BatchNorms write (W1's stride-2 layers at every
     * bf16 level; cf_nn_conv_dy_words) */
    failing = "cf_conv_bf16_backward_words";
    failures = 0;
    cf__conv_bf16_set_fault(fault);
    const cf_status st = cf_fit(learn, 1, .lr = CF_SLICE(1e-2));
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cf_last_error());
    cf__conv_bf16_set_fault(NULL);
    failing = NULL;
    const bool same = memcmp(start, m->weights, m->n_weights * sizeof(float)) == 0;
    free(start);
    cf_learner_free(learn);
    cf_dls_free(dls);
    if (!cf_bf16_compute()) {
        assert_int_equal(st, CF_OK);
        assert_int_equal(failures, 0);
        assert_false(same);
        return;
    }
    if (failures == 0) fail_msg("the fit made no cf_conv_bf16_backward_words call");
    if (st != CF_ERR_STATE) fail_msg("the fit returned %s: %s", cf_status_str(st), msg);
    if (!strstr(msg, "cf_conv_bf16_backward_words: made to fail by the test"))
        fail_msg("the fit's error does not say what failed: %s", msg);
    if (!same) fail_msg("the fit took a step on the gradients of a failed backward");
}

/* For real: after the forward, the stamp of a layer's pack says it was made for another layer
 * (one more input channel). The backward's repack refuses it, and so does each call that reads
 * it: cf_model_backward returns CF_ERR_STATE saying so. */
static void test_foreign_pack(void **state) {
    (void)state;
    if (!cf_bf16_compute()) skip();
    const int n = 4, c = 16, o = 32, hw = 14;
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_conv2d(c, o, 3, 2, 1, false), 5), CF_OK);
    assert_int_equal(cf_conv_set_bf16(m->root, true), 1);
    const size_t nx = (size_t)n * c * hw * hw;
    float *x = malloc(nx * sizeof(float));
    fill_uniform(x, nx, 43, -1, 1);
    cf_tensor xt = cf_tensor_view(x, cf_shape4(n, c, hw, hw));
    const cf_tensor *y = NULL;
    assert_int_equal(cf_model_forward(m, &xt, &y), CF_OK);
    float *pack = (float *)cf__conv_bf16_packed(m->root);
    assert_non_null(pack);
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, hw, hw, 3, 3, 2, 2, 1, 1));
    uint32_t *stamp = (uint32_t *)pack + cf_conv_bf16_packed_floats(&g, o) - 4;
    assert_int_equal(stamp[1], (uint32_t)c); /* the stamp's layout: conv_bf16.c's stamp_make */
    stamp[1] = (uint32_t)c + 1;
    const size_t ny = cf_tensor_numel(y);
    float *dy = malloc(ny * sizeof(float));
    fill_uniform(dy, ny, 44, -1, 1);
    cf_tensor dyt = cf_tensor_view(dy, y->shape);
    const cf_status st = cf_model_backward(m, &dyt);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cf_last_error());
    free(x), free(dy);
    cf_model_free(m);
    if (st != CF_ERR_STATE) fail_msg("a foreign pack's backward returned %s", cf_status_str(st));
    if (!strstr(msg, "Conv2d(16, 32") || !strstr(msg, "not made by cf_conv_bf16_pack"))
        fail_msg("a foreign pack's backward said: %s", msg);
}

/* ---- the pack a bf16 layer plans ------------------------------------------------------------- */

/* A lone Conv2d(c, o, 3, stride, 1) on n x c x hw x hw in fp32 and in bf16: the bf16 one's pack
 * (NULL or not, as `packed`) and the persistent memory both plan (equal unless packed); where
 * packed, its output and input gradient are cf_conv_bf16_forward's and _dx's, bitwise. */
static void check_plan(int c, int o, int stride, int hw, bool winograd) {
    const int n = 4;
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, hw, hw, 3, 3, stride, stride, 1, 1));
    /* the premise: which path the layer takes at this level */
    assert_int_equal(cf_conv_winograd_pays(&g, o), winograd);
    const bool packed = !winograd && cf_bf16_compute() && cf_conv_bf16_supported(&g, o);
    cf_model *m32 = NULL, *m16 = NULL;
    assert_int_equal(cf_model_new(&m32, cf_conv2d(c, o, 3, stride, 1, false), 5), CF_OK);
    assert_int_equal(cf_model_new(&m16, cf_conv2d(c, o, 3, stride, 1, false), 5), CF_OK);
    assert_int_equal(cf_conv_set_bf16(m16->root, true), 1);
    const size_t nx = (size_t)n * c * hw * hw;
    float *x = malloc(nx * sizeof(float));
    fill_uniform(x, nx, 45, -1, 1);
    cf_tensor xt = cf_tensor_view(x, cf_shape4(n, c, hw, hw));
    const cf_tensor *y32 = NULL, *y16 = NULL;
    assert_int_equal(cf_model_forward(m32, &xt, &y32), CF_OK);
    assert_int_equal(cf_model_forward(m16, &xt, &y16), CF_OK);
    const float *pack = cf__conv_bf16_packed(m16->root);
    print_message("Conv2d(%d, %d, 3, stride %d) on %dx%d at %s: %s, pack %s, %zu bytes planned "
                  "(fp32 %zu)\n",
                  c, o, stride, hw, hw, cf_isa_name(cf_isa_active()),
                  winograd ? "Winograd" : "implicit", pack ? "planned" : "none", m16->arena.used,
                  m32->arena.used);
    if (winograd && pack) fail_msg("a bf16 Winograd layer planned the implicit kernel's pack");
    if (!winograd && cf_bf16_compute() && !pack) fail_msg("an implicit bf16 layer has no pack");
    if (!pack && m16->arena.used != m32->arena.used)
        fail_msg("without a pack the bf16 layer plans %zu bytes, fp32's %zu", m16->arena.used,
                 m32->arena.used);
    const size_t ny = cf_tensor_numel(y16);
    float *dy = malloc(ny * sizeof(float));
    fill_uniform(dy, ny, 46, -1, 1);
    cf_tensor dyt = cf_tensor_view(dy, y16->shape);
    const cf_tensor *dx16 = m16->root->ops->backward(m16->root, &dyt, true);
    if (packed) { /* the layer's passes are the calls' on the whole batch */
        const float *w = m16->root->params[0].data;
        float *p = malloc(cf_conv_bf16_packed_floats(&g, o) * sizeof(float)),
              *scratch = malloc(cf_conv_bf16_scratch(&g, o) * sizeof(float)),
              *y = malloc(ny * sizeof(float)), *dx = malloc(nx * sizeof(float));
        cf_conv_bf16_pack(&g, o, w, p);
        assert_int_equal(cf_conv_bf16_forward(&g, o, p, x, n, y, scratch), CF_OK);
        assert_int_equal(cf_conv_bf16_dx(&g, o, p, dy, n, dx, scratch), CF_OK);
        const bool same_y = memcmp(y, y16->data, ny * sizeof(float)) == 0,
                   same_dx = memcmp(dx, dx16->data, nx * sizeof(float)) == 0,
                   fp32_y = memcmp(y32->data, y16->data, ny * sizeof(float)) == 0;
        free(p), free(scratch), free(y), free(dx);
        if (!same_y || !same_dx)
            fail_msg("the implicit bf16 layer's %s is not cf_conv_bf16_%s's",
                     same_y ? "input gradient" : "output", same_y ? "dx" : "forward");
        if (fp32_y) fail_msg("the implicit bf16 layer gave fp32's output");
    }
    free(x), free(dy);
    cf_model_free(m32), cf_model_free(m16);
}

static void test_winograd_no_pack(void **state) {
    (void)state;
    /* 28 pixels wide: rows of 14 tiles, Winograd at every level that has it; stride 2 never */
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, 32, 28, 28, 3, 3, 1, 1, 1, 1));
    const bool wino = cf_conv_winograd_pays(&g, 32);
    if (!wino) print_message("no Winograd at %s\n", cf_isa_name(cf_isa_active()));
    check_plan(32, 32, 1, 28, wino);
    check_plan(16, 32, 2, 14, false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* first: the child says it in a process that has not said it yet */
        cmocka_unit_test(test_scratch_refused), cmocka_unit_test(test_gemm_refused),
        cmocka_unit_test(test_conv_calls_fail), cmocka_unit_test(test_fit_stops),
        cmocka_unit_test(test_foreign_pack),    cmocka_unit_test(test_winograd_no_pack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
