/* fastai's AWD-LSTM language model (fastai/text/models/core.py, awdlstm.py): the tied
 * LinearDecoder (RNNDropout(output_p), then a Linear whose weight may be the encoder's table),
 * get_language_model (the AWD_LSTM encoder + decoder), its splitter, the (raw_out, out) of the
 * last forward and fastai's RNNRegularizer (AR/TAR) added by training backwards. */
#include "corefit/nn.h"
#include "rnn_internal.h"

#include <math.h>
#include <string.h>

/* ---- the language model -------------------------------------------------------------------- */

cf_module *cf_awd_lstm_lm(int vocab_size, const cf_awd_lstm_config *config, float drop_mult) {
    const cf_awd_lstm_config c = config ? *config : cf_awd_lstm_lm_config();
    cf_module *enc = cf_awd_lstm(vocab_size, &c, drop_mult);
    if (!enc) return NULL;
    cf_module *dec =
        cf_linear_decoder(vocab_size, c.emb_sz, c.output_p * drop_mult,
                          c.tie_weights ? cf_nn_awd_lstm_encoder(enc) : NULL, c.out_bias);
    if (!dec) {
        cf_module_free(enc);
        return NULL;
    }
    cf_module *lm = cf_sequential(2, (cf_module *[]){enc, dec});
    /* every layer of it runs fewer time steps than planned (fastai's LMDataLoader keeps the
     * short last batch): one plan an epoch */
    if (lm) lm->seq_within_plan = true;
    return lm;
}

/* ---- LinearDecoder ------------------------------------------------------------------------- */

typedef struct decoder_impl {
    int n_out, n_hid;
    bool bias;
    const cf_module *tied; /* the encoder whose table is the weight (NULL: own "decoder.weight") */
    float ar_alpha, tar_beta; /* fastai's RNNRegularizer, added by training backwards (0: off) */
    bool bf16;                /* the three products in bf16 with fp32 sums (cf_lstm_set_bf16) */
} decoder_impl;

static cf_module *dec_dropout(const cf_module *m) {
    return m->children[0];
}

static cf_status dec_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    decoder_impl *d = m->impl;
    if (in->ndim != 3 || in->dim[2] != d->n_hid) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "LinearDecoder(%d, %d): input %s does not fit (expected (B, T, %d))",
                       d->n_out, d->n_hid, cf_shape_str(in, s, sizeof s), d->n_hid);
    }
    *out = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], d->n_out}};
    return CF_OK;
}

static void dec_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    decoder_impl *d = m->impl;
    cf_module *dp = dec_dropout(m);
    dp->ops->plan(dp, in, arena);
    const size_t rows = (size_t)in->dim[0] * in->dim[1];
    m->out.data = cf_arena_floats(arena, rows * d->n_out);
    m->out.shape = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], d->n_out}};
    m->dx.data = cf_arena_floats(arena, rows * d->n_hid);
    m->dx.shape = *in;
    m->grad_arena = NULL;
}

/* fastai's LinearDecoder init: weight U(-0.1, 0.1) (when not tied), bias 0 */
static void dec_init(cf_module *m, cf_rng *rng) {
    decoder_impl *d = m->impl;
    for (int i = 0; i < m->n_params; i++) {
        cf_param *p = &m->params[i];
        const bool is_bias = d->bias && i == m->n_params - 1;
        for (size_t k = 0; k < p->numel; k++)
            p->data[k] = is_bias ? 0.0f : (float)(0.2 * cf_rng_uniform(rng) - 0.1);
    }
}

static cf_param *dec_weight(cf_module *m) {
    decoder_impl *d = m->impl;
    return d->tied ? (cf_param *)&d->tied->params[0] : &m->params[0];
}

static const cf_tensor *dec_forward(cf_module *m, const cf_tensor *x) {
    decoder_impl *d = m->impl;
    m->in = x;
    cf_module *dp = dec_dropout(m);
    dp->in = x;
    const cf_tensor *xd = dp->ops->forward(dp, x);
    const int rows = x->shape.dim[0] * x->shape.dim[1];
    cf_tensor *y = cf_module_output(
        m, &(cf_shape){.ndim = 3, .dim = {x->shape.dim[0], x->shape.dim[1], d->n_out}});
    if (d->bias) {
        const float *b = m->params[m->n_params - 1].data;
        for (int r = 0; r < rows; r++) memcpy(y->data + (size_t)r * d->n_out, b, d->n_out * 4);
    }
    cf_nn_par_gemm(d->bf16, false, true, rows, d->n_out, d->n_hid, xd->data, d->n_hid,
                   dec_weight(m)->data, d->n_hid, d->bias, y->data, d->n_out);
    return y;
}

static const cf_tensor *dec_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    decoder_impl *d = m->impl;
    cf_module *dp = dec_dropout(m);
    const cf_tensor *xd = &dp->out; /* the dropped input */
    const int rows = m->in->shape.dim[0] * m->in->shape.dim[1];
    cf_param *w = dec_weight(m);
    if (w->trainable) /* dW += dy^T x */
        cf_nn_par_gemm(d->bf16, true, false, d->n_out, d->n_hid, rows, dy->data, d->n_out, xd->data,
                       d->n_hid, true, w->grad, d->n_hid);
    if (d->bias && m->params[m->n_params - 1].trainable) {
        float *restrict db = m->params[m->n_params - 1].grad;
        for (int r = 0; r < rows; r++) {
            const float *g = dy->data + (size_t)r * d->n_out;
            for (int j = 0; j < d->n_out; j++) db[j] += g[j];
        }
    }
    if (!need_dx) return NULL;
    /* dx of the dropped input, then through the dropout */
    cf_tensor *dxd = cf_module_input_grad(m);
    cf_nn_par_gemm(d->bf16, false, false, rows, d->n_hid, d->n_out, dy->data, d->n_out, w->data,
                   d->n_hid, false, dxd->data, d->n_hid);
    /* AR: alpha * mean(out^2), out the dropped input */
    const bool reg = m->training && (d->ar_alpha != 0.0f || d->tar_beta != 0.0f);
    if (reg && d->ar_alpha != 0.0f) {
        const size_t n = (size_t)rows * d->n_hid;
        const float s = 2.0f * d->ar_alpha / (float)n;
        for (size_t i = 0; i < n; i++) dxd->data[i] += s * xd->data[i];
    }
    cf_tensor *dx = (cf_tensor *)dp->ops->backward(dp, dxd, true);
    /* TAR: beta * mean((raw[:, 1:] - raw[:, :-1])^2) over (B, T - 1, n_hid), raw the input */
    const int B = m->in->shape.dim[0], T = m->in->shape.dim[1], H = d->n_hid;
    if (reg && d->tar_beta != 0.0f && T > 1) {
        const float s = 2.0f * d->tar_beta / ((float)B * (float)(T - 1) * (float)H);
        for (int b = 0; b < B; b++)
            for (int t = 0; t + 1 < T; t++) {
                const float *r0 = m->in->data + ((size_t)b * T + t) * H, *r1 = r0 + H;
                float *g0 = dx->data + ((size_t)b * T + t) * H, *g1 = g0 + H;
                for (int j = 0; j < H; j++) {
                    const float diff = s * (r1[j] - r0[j]);
                    g1[j] += diff;
                    g0[j] -= diff;
                }
            }
    }
    return dx;
}

static const cf_module_ops decoder_ops = {
    .kind = "LinearDecoder",
    .out_shape = dec_out_shape,
    .plan = dec_plan,
    .init = dec_init,
    .forward = dec_forward,
    .backward = dec_backward,
};

static bool linear_decoder_set_bf16(cf_module *m, bool on) {
    if (!m || m->ops != &decoder_ops) return false;
    ((decoder_impl *)m->impl)->bf16 = on;
    return true;
}

/* Here rather than in lstm.c, so that the LSTM does not depend on the decoder (lstm.c only
 * switches one LSTM, cf_nn_lstm_set_bf16). */
int cf_lstm_set_bf16(cf_module *root, bool on) {
    if (!root) return 0;
    int count = cf_nn_lstm_set_bf16(root, on) || linear_decoder_set_bf16(root, on) ? 1 : 0;
    for (int i = 0; i < root->n_children; i++) count += cf_lstm_set_bf16(root->children[i], on);
    return count;
}

cf_module *cf_linear_decoder(int n_out, int n_hid, float output_p, const cf_module *tied_encoder,
                             bool bias) {
    if (n_out < 1 || n_hid < 1) {
        cf_fail(CF_ERR_INVALID, "cf_linear_decoder: n_out %d and n_hid %d must be >= 1", n_out,
                n_hid);
        return NULL;
    }
    if (tied_encoder && (tied_encoder->n_params < 1 || tied_encoder->params[0].shape.ndim != 2 ||
                         tied_encoder->params[0].shape.dim[0] != n_out ||
                         tied_encoder->params[0].shape.dim[1] != n_hid)) {
        cf_fail(CF_ERR_INVALID,
                "cf_linear_decoder: the tied encoder's table is not (%d, %d) (n_out, n_hid)", n_out,
                n_hid);
        return NULL;
    }
    cf_module *dp = cf_rnn_dropout(output_p);
    if (!dp) return NULL;
    decoder_impl *d = cf_calloc(1, sizeof *d);
    if (!d) {
        cf_module_free(dp);
        return NULL;
    }
    *d = (decoder_impl){.n_out = n_out, .n_hid = n_hid, .bias = bias, .tied = tied_encoder};
    cf_module *m = cf_module_new(&decoder_ops, d);
    if (!m) {
        cf_module_free(dp);
        return NULL;
    }
    if (!tied_encoder)
        cf_module_add_param(m, "decoder.weight", CF_PARAM_WEIGHT, cf_shape2(n_out, n_hid));
    if (bias) cf_module_add_param(m, "decoder.bias", CF_PARAM_BIAS, cf_shape1(n_out));
    if (cf_module_add_child(m, dp, "output_dp") != CF_OK) {
        cf_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- fastai's RNNRegularizer on the language model ----------------------------------------- */

static decoder_impl *lm_decoder(const cf_module *lm) {
    if (!lm || lm->n_children != 2 || !cf_nn_is_awd_lstm(lm->children[0]) ||
        lm->children[1]->ops != &decoder_ops)
        return NULL;
    return lm->children[1]->impl;
}

const cf_tensor *cf_awd_lstm_lm_raw_out(const cf_module *lm) {
    return lm_decoder(lm) ? lm->children[1]->in : NULL;
}

const cf_tensor *cf_awd_lstm_lm_out(const cf_module *lm) {
    if (!lm_decoder(lm) || !lm->children[1]->in) return NULL;
    return &dec_dropout(lm->children[1])->out;
}

double cf_rnn_regularizer_loss(const cf_module *lm, float alpha, float beta) {
    const cf_tensor *raw = cf_awd_lstm_lm_raw_out(lm), *out = cf_awd_lstm_lm_out(lm);
    if (!raw || !out) return 0.0;
    const int B = raw->shape.dim[0], T = raw->shape.dim[1], H = raw->shape.dim[2];
    double ar = 0.0, tar = 0.0;
    const size_t n = (size_t)B * T * H;
    for (size_t i = 0; i < n; i++) ar += (double)out->data[i] * out->data[i];
    for (int b = 0; b < B; b++)
        for (int t = 0; t + 1 < T; t++) {
            const float *r0 = raw->data + ((size_t)b * T + t) * H, *r1 = r0 + H;
            for (int j = 0; j < H; j++) tar += ((double)r1[j] - r0[j]) * ((double)r1[j] - r0[j]);
        }
    double loss = alpha * ar / (double)n;
    if (T > 1) loss += beta * tar / ((double)B * (T - 1) * H);
    return loss;
}

cf_status cf_rnn_regularizer_set(cf_module *lm, float alpha, float beta) {
    decoder_impl *d = lm_decoder(lm);
    if (!d)
        return cf_fail(CF_ERR_INVALID, "cf_rnn_regularizer_set: the module is not an AWD-LSTM "
                                       "language model (cf_awd_lstm_lm)");
    if (!(alpha >= 0.0f && beta >= 0.0f && isfinite(alpha) && isfinite(beta)))
        return cf_fail(CF_ERR_INVALID,
                       "cf_rnn_regularizer_set: alpha %g and beta %g must be finite and >= 0",
                       (double)alpha, (double)beta);
    d->ar_alpha = alpha;
    d->tar_beta = beta;
    return CF_OK;
}

cf_status cf_split_awd_lstm_lm(cf_model *model) {
    cf_module *root = model->root;
    if (root->n_children != 2 || !cf_nn_is_awd_lstm(root->children[0]))
        return cf_fail(CF_ERR_INVALID, "cf_split_awd_lstm_lm: the model is not an AWD-LSTM "
                                       "language model (cf_awd_lstm_lm)");
    cf_module *awd = root->children[0];
    const int n = cf_nn_awd_lstm_layers(awd);
    for (int l = 0; l < n; l++) cf_model_set_group(model, cf_nn_awd_lstm_rnn(awd, l), l);
    cf_model_set_group(model, cf_nn_awd_lstm_encoder(awd), n);
    cf_model_set_group(model, root->children[1], n);
    model->n_groups = n + 1;
    return CF_OK;
}
