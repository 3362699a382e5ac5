/* A user's callback with state that outlives a fit: the training batches and epochs it saw. Its
 * state exports and imports, so a parallel fit must bring it home. Shared by the fork and MPI
 * tests of the parallel twins. */
#ifndef CF_TEST_TALLY_CB_H
#define CF_TEST_TALLY_CB_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/learn.h"

typedef struct tally {
    int64_t batches, epochs;
} tally;

static cf_status tally_batch(cf_callback *cb, cf_learner *learn) {
    if (learn->training) ((tally *)cb->state)->batches++;
    return CF_OK;
}
static cf_status tally_epoch(cf_callback *cb, cf_learner *learn) {
    (void)learn;
    ((tally *)cb->state)->epochs++;
    return CF_OK;
}
static size_t tally_export(const cf_callback *cb, void *buf, size_t size) {
    if (buf && size >= sizeof(tally)) memcpy(buf, cb->state, sizeof(tally));
    return sizeof(tally);
}
static cf_status tally_import(cf_callback *cb, const void *buf, size_t size) {
    if (size != sizeof(tally)) return cf_fail(CF_ERR_INVALID, "Tally: %zu bytes", size);
    memcpy(cb->state, buf, sizeof(tally));
    return CF_OK;
}
static void tally_free(cf_callback *cb) {
    free(cb->state);
    free(cb);
}
/* A new Tally callback (counts at zero). */
static cf_callback *tally_cb(void) {
    cf_callback *cb = calloc(1, sizeof *cb);
    cb->name = "Tally";
    cb->state = calloc(1, sizeof(tally));
    cb->free = tally_free;
    cb->export_state = tally_export;
    cb->import_state = tally_import;
    cb->on[CF_EV_AFTER_BATCH] = tally_batch;
    cb->on[CF_EV_AFTER_EPOCH] = tally_epoch;
    return cb;
}

#endif
