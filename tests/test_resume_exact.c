/* Exact resume from a checkpoint taken at any batch boundary (corefit/learn.h, "checkpoints"):
 * a fit stopped on request (cf_checkpoint_request, what SIGTERM raises) writes a checkpoint, and
 * a new learner with other initial weights that resumes from it ends with bitwise the same
 * weights, BatchNorm buffers, optimizer state and Recorder as the fit that was never stopped —
 * with dropout and augmentation (random crop, flip and fastai's batch transforms) on, in one
 * process and with 1, 2 and 3 fork workers. A resume with other parameters, or from a damaged
 * file, is refused with a clear error and leaves the learner as it was. */
#include "child.h"
#include "learn_fixture.h"
#include "resume_fixture.h"
#include "same_fit.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corefit/par.h"

enum { N_EPOCH = RESUME_N_EPOCH };

static cf_aug_opts aug;

static cf_dls *image_dls(void) {
    cf_dls *dls = resume_dls(&aug);
    if (!dls) fail_msg("data: %s", cf_last_error());
    return dls;
}

static cf_learner *learner(cf_dls *dls, uint64_t seed, const char *path) {
    cf_learner *learn = resume_learner(dls, seed, path);
    if (!learn) fail_msg("learner: %s", cf_last_error());
    return learn;
}

/* workers 0: in this process; else cf_par_ with that many fork workers. */
static cf_status run_fit(cf_learner *learn, int workers, cf_callback **cbs, int n_cbs, double lr,
                         const char *resume) {
    cf_one_cycle_opts o = {.lr_max = CF_LR(lr), .cbs = cbs, .n_cbs = n_cbs, .resume = resume};
    if (!workers) return cf_fit_one_cycle_(learn, N_EPOCH, &o);
    o.par.num_cores = workers;
    return cf_par_fit_one_cycle_(learn, N_EPOCH, &o);
}

static void run_exact(int workers) {
    oracle dir;
    oracle_init(&dir);
    cf_dls *dls = image_dls();
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/fit.ckpt", dir.dir);

    cf_learner *full = learner(dls, 3, dir.dir);
    cf_callback *cbs0[] = {cf_checkpoint_cb(.fname = ckpt)};
    assert_int_equal(run_fit(full, workers, cbs0, 1, 2e-2, NULL), CF_OK);
    int64_t per_epoch = cf_dataloader_len(dls->train);
    if (workers > 1) per_epoch = full->recorder.n_batches / N_EPOCH;
    assert_int_equal(full->recorder.n_batches, per_epoch * N_EPOCH);

    /* stops: after the first batch, mid-epoch, after the last training batch of an epoch
     * (before its validation), and mid-way through the last epoch */
    int64_t stops[] = {1, per_epoch / 2 + 1, per_epoch, per_epoch + per_epoch / 2};
    for (size_t k = 0; k < sizeof stops / sizeof *stops; k++) {
        char what[96];
        snprintf(what, sizeof what, "%d workers, stopped after batch %lld", workers,
                 (long long)stops[k]);
        cf_learner *stopped = learner(dls, 3, dir.dir);
        cf_callback *cbs1[] = {resume_request_cb(stops[k]), cf_checkpoint_cb(.fname = ckpt)};
        cf_status st = run_fit(stopped, workers, cbs1, 2, 2e-2, NULL);
        if (st != (workers ? CF_ERR_WORKER : CF_ERR_INTERRUPTED))
            fail_msg("%s: status %d: %s", what, st, cf_last_error());
        assert_non_null(strstr(cf_last_error(), "resume"));
        assert_non_null(strstr(cf_last_error(), ckpt));
        cf_learner_free(stopped);

        /* a new learner, other initial weights; the same call with .resume */
        cf_learner *resumed = learner(dls, 1000 + k, dir.dir);
        cf_callback *cbs2[] = {resume_request_cb(-1), cf_checkpoint_cb(.fname = ckpt)};
        st = run_fit(resumed, workers, cbs2, 2, 2e-2, ckpt);
        if (st != CF_OK) fail_msg("%s: resume failed: %s", what, cf_last_error());
        assert_same_fit(full, resumed, what);
        cf_learner_free(resumed);
    }

    /* Another learning rate: refused, naming the parameter; the learner is unchanged. */
    cf_learner *other = learner(dls, 5, dir.dir);
    float *before = malloc(other->model->n_weights * sizeof(float));
    memcpy(before, other->model->weights, other->model->n_weights * sizeof(float));
    cf_callback *cbs3[] = {cf_checkpoint_cb(.fname = ckpt)};
    cf_status st = run_fit(other, workers, cbs3, 1, 1e-2, ckpt);
    assert_int_not_equal(st, CF_OK);
    if (!strstr(cf_last_error(), "lr_max=0.02") || !strstr(cf_last_error(), "lr_max=0.01"))
        fail_msg("unclear error for another lr: %s", cf_last_error());
    assert_memory_equal(before, other->model->weights, other->model->n_weights * sizeof(float));
    assert_int_equal(other->recorder.n_batches, 0);
    free(before);
    cf_learner_free(other);

    cf_learner_free(full);
    cf_dls_free(dls);
    oracle_cleanup(&dir);
}

static void test_exact_in_process(void **state) {
    (void)state;
    run_exact(0);
}
static void test_exact_fork_1(void **state) {
    (void)state;
    run_exact(1);
}
static void test_exact_fork_2(void **state) {
    (void)state;
    run_exact(2);
}
static void test_exact_fork_3(void **state) {
    (void)state;
    run_exact(3);
}

/* A damaged checkpoint (one byte changed) is refused by its CRC; a truncated one by its size. */
static void test_damaged_checkpoint(void **state) {
    (void)state;
    oracle dir;
    oracle_init(&dir);
    cf_dls *dls = image_dls();
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/fit.ckpt", dir.dir);
    cf_learner *a = learner(dls, 3, dir.dir);
    cf_callback *cbs[] = {resume_request_cb(3), cf_checkpoint_cb(.fname = ckpt)};
    assert_int_equal(run_fit(a, 0, cbs, 2, 2e-2, NULL), CF_ERR_INTERRUPTED);
    cf_learner_free(a);
    void *bytes = NULL;
    size_t size = 0;
    assert_int_equal(cf_read_file(ckpt, 1 << 30, &bytes, &size), CF_OK);
    ((unsigned char *)bytes)[size / 2] ^= 0x10;
    FILE *f = fopen(ckpt, "wb");
    fwrite(bytes, 1, size, f);
    fclose(f);
    cf_learner *b = learner(dls, 4, dir.dir);
    assert_int_equal(run_fit(b, 0, NULL, 0, 2e-2, ckpt), CF_ERR_INVALID);
    if (!strstr(cf_last_error(), "CRC") || !strstr(cf_last_error(), ckpt))
        fail_msg("unclear error for a damaged file: %s", cf_last_error());
    f = fopen(ckpt, "wb");
    fwrite(bytes, 1, 6, f);
    fclose(f);
    assert_int_equal(run_fit(b, 0, NULL, 0, 2e-2, ckpt), CF_ERR_INVALID);
    assert_int_equal(b->recorder.n_batches, 0);
    cf_free(bytes);
    cf_learner_free(b);
    cf_dls_free(dls);
    oracle_cleanup(&dir);
}

/* Dropout's masks are keyed by (model seed, module, key, sample): the same sample gives the same
 * mask whatever batch it is in and however many forwards ran before; another key or sample
 * another mask. */
static void test_dropout_keyed(void **state) {
    (void)state;
    enum { F = 64 };
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_dropout(0.5f), 9), CF_OK);
    cf_model_train(m, true);
    float x[3 * F];
    for (int i = 0; i < 3 * F; i++) x[i] = 1.0f;
    cf_tensor tx = {.shape = cf_shape2(3, F), .data = x};
    const cf_tensor *y = NULL;
    float first[3 * F], again[3 * F];
    int64_t ids[3] = {5, 6, 7}, other[3] = {7, 5, 6};
    cf_model_set_draw_key(m, 1, ids, 3);
    assert_int_equal(cf_model_forward(m, &tx, &y), CF_OK);
    memcpy(first, y->data, sizeof first);
    assert_int_equal(cf_model_forward(m, &tx, &y), CF_OK); /* a second forward: the same */
    assert_memory_equal(first, y->data, sizeof first);
    cf_model_set_draw_key(m, 1, other, 3); /* rows moved: the masks move with their samples */
    assert_int_equal(cf_model_forward(m, &tx, &y), CF_OK);
    memcpy(again, y->data, sizeof again);
    assert_memory_equal(first + 2 * F, again, F * sizeof(float));
    assert_memory_equal(first, again + F, 2 * F * sizeof(float));
    cf_model_set_draw_key(m, 2, ids, 3); /* another epoch: other masks */
    assert_int_equal(cf_model_forward(m, &tx, &y), CF_OK);
    assert_true(memcmp(first, y->data, sizeof first) != 0);
    int kept = 0;
    for (int i = 0; i < 3 * F; i++) kept += first[i] != 0;
    assert_in_range(kept, 3 * F / 4, 3 * F * 3 / 4);
    cf_model_free(m);
}

/* ---- the command line: SIGTERM, then --resume ------------------------------------------------
 * A pre-empted `corefit train` (SIGTERM once its first checkpoint exists, so mid-fit) exits
 * non-zero saying how to continue; the command it prints finishes the fit with a model file of
 * the same bytes as a fit never stopped. In this process (--cores 1) and with 2 fork workers. */

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define TRAIN_ARGS "train --limit 640 --bs 32 --epochs 2 --quiet --checkpoint-every 3"

static void run_cli_resume(int cores) {
    struct stat sb;
    if (stat(FMNIST_DIR, &sb) != 0) skip();
    oracle dir;
    oracle_init(&dir);
    char args[1024];
    snprintf(args, sizeof args, TRAIN_ARGS " --cores %d --out full.safetensors", cores);
    assert_int_equal(test_cli_wait(test_cli_start(dir.dir, args, false)), 0);

    snprintf(args, sizeof args, TRAIN_ARGS " --cores %d --out part.safetensors", cores);
    pid_t pid = test_cli_start(dir.dir, args, false);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/part.ckpt", dir.dir);
    /* liveness, not timing: wait for the first checkpoint (batch 3 of 40), however long */
    while (stat(ckpt, &sb) != 0) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) fail_msg("corefit ended before a checkpoint");
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    kill(pid, SIGTERM);
    int rc = test_cli_wait(pid);
    char *err = test_read_in(dir.dir, "err.txt", NULL);
    assert_non_null(err);
    if (rc == 0 || !strstr(err, "SIGTERM") || !strstr(err, "--resume ./part.ckpt"))
        fail_msg("after SIGTERM: exit %d, stderr: %s", rc, err);
    snprintf(ckpt, sizeof ckpt, "%s/part.safetensors", dir.dir);
    assert_int_not_equal(stat(ckpt, &sb), 0); /* no model from a fit that did not finish */
    /* the command it printed */
    const char *hint = strstr(err, "  corefit ");
    assert_non_null(hint);
    char resume[1024];
    snprintf(resume, sizeof resume, "%.*s", (int)strcspn(hint + 10, "\n"), hint + 10);
    cf_free(err);
    rc = test_cli_wait(test_cli_start(dir.dir, resume, false));
    if (rc != 0) fail_msg("resume: exit %d: %s", rc, test_read_in(dir.dir, "err.txt", NULL));
    size_t n_full = 0, n_part = 0;
    char *full = test_read_in(dir.dir, "full.safetensors", &n_full);
    char *part = test_read_in(dir.dir, "part.safetensors", &n_part);
    assert_non_null(full);
    assert_non_null(part);
    assert_int_equal(n_full, n_part);
    if (memcmp(full, part, n_full))
        fail_msg("the resumed fit's model file differs (%d cores)", cores);
    cf_free(full);
    cf_free(part);
    oracle_cleanup(&dir);
}

static void test_cli_sigterm_resume_in_process(void **state) {
    (void)state;
    run_cli_resume(1);
}
static void test_cli_sigterm_resume_fork(void **state) {
    (void)state;
    run_cli_resume(2);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_keyed),
        cmocka_unit_test(test_exact_in_process),
        cmocka_unit_test(test_damaged_checkpoint),
        cmocka_unit_test(test_exact_fork_1),
        cmocka_unit_test(test_exact_fork_2),
        cmocka_unit_test(test_exact_fork_3),
        cmocka_unit_test(test_cli_sigterm_resume_in_process),
        cmocka_unit_test(test_cli_sigterm_resume_fork),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
