/* corefit train --valid-every N: the validation set runs after every N-th epoch of a fit and
 * after its last one; N = 0 leaves it out of the fit altogether (the recipe's --tta pass after
 * the fit then gives the accuracy). A callback that cancels the validation phase at
 * before_validate, as fastai's CancelValidException from a callback does: the table and the
 * Recorder show nan for an epoch without validation. Every replica of a parallel fit cancels the
 * same epochs (the rule reads only the epoch), so their collectives stay matched. */
#include "train.h"

static cf_status skip_some_valid(cf_callback *cb, cf_learner *learn) {
    const int every = *(const int *)cb->state;
    const bool last = learn->epoch == learn->n_epoch - 1;
    if (every <= 0 || (!last && (learn->epoch + 1) % every != 0))
        cf_learner_cancel(learn, CF_CANCEL_VALIDATE);
    return CF_OK;
}

cf_callback *cli_valid_every_cb(int every) {
    cf_callback *cb = cf_callback_new("ValidEvery", 70, sizeof(int));
    if (!cb) return NULL;
    *(int *)cb->state = every;
    cb->on[CF_EV_BEFORE_VALIDATE] = skip_some_valid;
    return cb;
}
