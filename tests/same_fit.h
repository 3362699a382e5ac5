/* Comparing two learners after fits that must have ended in bitwise the same state (a resumed or
 * recovered fit against one that ran undisturbed). */
#ifndef CF_TEST_SAME_FIT_H
#define CF_TEST_SAME_FIT_H

#include "corefit/learn.h"

/* Fails the test (naming what) unless b's weights, BatchNorm buffers and optimizer state
 * (gradient and square averages, step counts, per-group hypers) are bitwise a's, and a's weights
 * are all finite (two fits that both diverged to NaN are not the same fit). a is the reference. */
void assert_same_model_state(const cf_learner *a, const cf_learner *b, const char *what);

/* assert_same_model_state, and the whole Recorder (lrs, moms, smoothed losses, the scheduled lrs
 * and moms, per-epoch values and iterations, the smoothing state) and the final record. */
void assert_same_fit(const cf_learner *a, const cf_learner *b, const char *what);

#endif
