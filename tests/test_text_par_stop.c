/* Stop requests (cf_checkpoint_request, what SIGTERM raises under corefit train) belong to the
 * fit that runs when they come: one a fit does not act on (it came while the last epoch was
 * being validated) is dropped when that fit ends, so a later fit of the same process, such as
 * the next stage of ULMFiT's gradual unfreezing, runs whole; one made while no fit runs still
 * stops the next fit after its first batch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "learn_fixture.h"

static char g_dir[256];

/* Requests a stop at the first validation batch of the last epoch. */
static cf_status request_in_validation(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (!learn->training && learn->epoch == learn->n_epoch - 1 && learn->iter == 0)
        cf_checkpoint_request();
    return CF_OK;
}

static cf_learner *make_learner(cf_dls *dls) {
    cf_learner *learn = NULL;
    assert_int_equal(
        cf_learner_new(&learn, dls, fixture_model(3, false), .quiet = true, .path = g_dir), CF_OK);
    assert_int_equal(cf_learner_add_cb(learn, cf_checkpoint_cb(.fname = "stop")), CF_OK);
    return learn;
}

static void test_request_outlives_no_fit(void **state) {
    (void)state;
    test_tmpdir_make(g_dir, sizeof g_dir, "cf_text_par_stop");
    cf_dls *dls = fixture_dls(64, 16, 8); /* 8 training batches an epoch */
    cf_learner *learn = make_learner(dls);
    cf_callback late = {.name = "late", .on = {[CF_EV_AFTER_BATCH] = request_in_validation}};
    cf_callback *extra[] = {&late};
    /* the request comes after the last training batch: the fit ends normally */
    assert_int_equal(cf_fit(learn, 2, .lr = CF_LR(1e-2), .cbs = extra, .n_cbs = 1), CF_OK);
    assert_int_equal(learn->recorder.n_batches, 16);
    /* ... and does not stop the next fit */
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    assert_int_equal(learn->recorder.n_batches, 8);
    /* a request made between fits is kept for the next one, which stops after a batch */
    cf_checkpoint_request();
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_ERR_INTERRUPTED);
    assert_non_null(strstr(cf_last_error(), "stopped on request after batch 1"));
    /* ... and only that one */
    assert_int_equal(cf_fit(learn, 1, .lr = CF_LR(1e-2)), CF_OK);
    assert_int_equal(learn->recorder.n_batches, 8);
    cf_learner_free(learn);
    cf_dls_free(dls);
    test_tmpdir_remove(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_outlives_no_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
