/* What the text tests share: a slice of Debian's fortunes laid out as a fastai text folder, and
 * the AWD-LSTM's exchanges with tests/oracle/lstm.py (dropout masks in, gradients compared). */
#ifndef CF_TEST_TEXT_FIXTURE_H
#define CF_TEST_TEXT_FIXTURE_H

#include <stdbool.h>

#include "corefit/nn.h"
#include "oracle.h"

/* Whether Debian's fortunes are installed (the tests that read them skip otherwise). */
bool have_fortunes(void);

/* Lays out the topics food, love and science of the fortunes in dir as a text folder
 * (scripts/fortunes-folder: train/ and valid/ with a folder a class, a quarter of each topic's
 * max_per_topic files in valid/). Returns 0 on success. */
int fortunes_folder(const char *dir, int max_per_topic);

/* Writes every parameter of m to the oracle as p_<full name>. */
void oracle_put_params(oracle *o, const cf_model *m);

/* Writes a dropout mask to the oracle under name; all ones of that shape when no mask was drawn
 * (p = 0). */
void oracle_put_mask(oracle *o, const char *name, const float *mask, cf_shape shape);

/* Writes the dropout masks an AWD-LSTM (vocab words, emb_sz, n_hid, n_layers) drew in its last
 * forward over `rows` sequences, as <prefix>_emb, _in, _w<layer> and _h<layer> (what lstm.py
 * reads). */
void oracle_put_awd_masks(oracle *o, const char *prefix, const cf_module *awd, int rows, int vocab,
                          int emb_sz, int n_hid, int n_layers);

/* Compares the gradient of every trainable parameter of m (grads: all of them one after the
 * other, in the model's parameter order; NULL: each parameter's own) with the oracle's
 * g_<full name>, to 1e-4 relative and 1e-5 absolute. */
void assert_grads_match_oracle(oracle *o, const cf_model *m, const float *grads);

#endif
