/* Internal to src/nn: what the AWD-LSTM modules (awd_lstm.c) and the tests need from the
 * recurrent layers (lstm.c, rnn_dropout.c) beyond the public API. */
#ifndef COREFIT_RNN_INTERNAL_H
#define COREFIT_RNN_INTERNAL_H

#include "corefit/nn.h"

bool cf_nn_is_lstm(const cf_module *m);
/* Floats cf_nn_rnn_state_save writes for every LSTM under m with up to `rows` state rows. */
size_t cf_nn_rnn_state_floats(const cf_module *m, int rows);
/* Copies the hidden state (rows and values) of every LSTM under m into buf, and back. */
void cf_nn_rnn_state_save(const cf_module *m, float *buf);
void cf_nn_rnn_state_restore(cf_module *m, const float *buf);
/* The random streams of every module under m (pre-order), and back; n: the count. */
int cf_nn_count_modules(const cf_module *m);
void cf_nn_rng_save(const cf_module *m, cf_rng *out);
void cf_nn_rng_restore(cf_module *m, const cf_rng *in);

/* The keyed draws of the text dropouts: when m's model has a draw key whose ids cover `rows`
 * rows (cf_model_set_draw_key), seeds *rng from (m's stream, key, step, sub, row) and returns
 * true; row is a dataset index from the key's ids, or -1 for a draw shared by the whole batch
 * (then the same on every process holding rows of it). Keyed draws never advance m->rng.
 * False (rng untouched) without a key: m then draws from its own stream. */
bool cf_nn_keyed_rng(const cf_module *m, int rows, int64_t row, cf_rng *rng);

/* The masks of the last training forward, scaled (0 or 1 / (1 - p)); NULL when the last
 * forward applied none (eval, p = 0). RNNDropout: (B, F) of its input (B, ..., F);
 * EmbeddingDropout: (vocab); WeightDropout: (4H, H). */
const float *cf_nn_rnn_dropout_mask(const cf_module *m);
const float *cf_nn_embedding_dropout_mask(const cf_module *m);
const float *cf_nn_weight_dropout_mask(const cf_module *m);

/* AWD_LSTM (awd_lstm.c): whether m is one, and its number of layers (0 when it is not); its
 * children are 0 "encoder", 1..n "rnns.<l>", then "input_dp" and "hidden_dps.<l>". */
bool cf_nn_is_awd_lstm(const cf_module *m);
int cf_nn_awd_lstm_layers(const cf_module *m);
/* Its children: the (dropped) embedding and layer l's WeightDropout LSTM. */
cf_module *cf_nn_awd_lstm_encoder(const cf_module *m);
cf_module *cf_nn_awd_lstm_rnn(const cf_module *m, int l);

/* SentenceEncoder (text_classifier.c): fn(ctx, chunk, awd) runs after the AWD_LSTM's forward on
 * each chunk of each forward (not on the recomputations backward runs), so that a test can read
 * every chunk's dropout masks; fn NULL: none. */
void cf_nn_sentence_encoder_on_chunk(cf_module *encoder,
                                     void (*fn)(void *ctx, int chunk, const cf_module *awd),
                                     void *ctx);

/* C (m x n) (+)= op(A) . op(B) through cf_sgemm, the rows of C split over the thread pool. */
void cf_nn_par_sgemm(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc);
/* The same through cf_sgemm_bf16 when bf16 (operands rounded to bfloat16, fp32 sums), else
 * cf_sgemm; accumulate: C += instead of C =. */
void cf_nn_par_gemm(bool bf16, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                    int lda, const float *b, int ldb, bool accumulate, float *c, int ldc);
/* Sets one LSTM's whole-sequence products to bf16 (on) or fp32; false when m is not an LSTM
 * (cf_lstm_set_bf16, language_model.c, walks a model). */
bool cf_nn_lstm_set_bf16(cf_module *m, bool on);

#endif
