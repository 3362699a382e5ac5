/* fastai's AWD-LSTM (fastai/text/models/awdlstm.py) and the models built on it: the language
 * model (encoder + tied decoder) and its splitter. */
#include "corefit/nn.h"
#include "rnn_internal.h"

#include <stdio.h>
#include <string.h>

cf_awd_lstm_config cf_awd_lstm_lm_config(void) {
    return (cf_awd_lstm_config){.emb_sz = 400,
                                .n_hid = 1152,
                                .n_layers = 3,
                                .pad_token = 1,
                                .output_p = 0.1f,
                                .hidden_p = 0.15f,
                                .input_p = 0.25f,
                                .embed_p = 0.02f,
                                .weight_p = 0.2f,
                                .tie_weights = true,
                                .out_bias = true};
}

cf_awd_lstm_config cf_awd_lstm_clas_config(void) {
    return (cf_awd_lstm_config){.emb_sz = 400,
                                .n_hid = 1152,
                                .n_layers = 3,
                                .pad_token = 1,
                                .output_p = 0.4f,
                                .hidden_p = 0.3f,
                                .input_p = 0.4f,
                                .embed_p = 0.05f,
                                .weight_p = 0.5f,
                                .tie_weights = true,
                                .out_bias = true};
}

/* ---- AWD_LSTM ------------------------------------------------------------------------------ *
 * Children in fastai's order: 0 encoder, 1..n the WeightDropout LSTMs, n+1 input_dp, then the
 * n - 1 hidden_dps used between layers (fastai builds n, the last never runs). */

typedef struct awd_impl {
    int n_layers, emb_sz, n_hid;
} awd_impl;

static cf_module *awd_encoder(const cf_module *m) {
    return m->children[0];
}
static cf_module *awd_rnn(const cf_module *m, int l) {
    return m->children[1 + l];
}
static cf_module *awd_input_dp(const cf_module *m) {
    return m->children[1 + ((awd_impl *)m->impl)->n_layers];
}
static cf_module *awd_hidden_dp(const cf_module *m, int l) {
    return m->children[2 + ((awd_impl *)m->impl)->n_layers + l];
}

static cf_status awd_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    awd_impl *a = m->impl;
    if (in->ndim != 2) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "AWD_LSTM: input %s does not fit (expected (B, T) token ids)",
                       cf_shape_str(in, s, sizeof s));
    }
    *out = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], a->emb_sz}};
    return CF_OK;
}

static void plan_child(cf_module *c, cf_shape *s, cf_arena *arena) {
    cf_shape next;
    if (c->ops->plan)
        c->ops->plan(c, s, arena);
    else
        cf_module_plan_default(c, s, arena);
    c->ops->out_shape(c, s, &next);
    *s = next;
}

static void awd_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    awd_impl *a = m->impl;
    m->grad_arena = NULL;
    cf_shape s = *in;
    plan_child(awd_encoder(m), &s, arena);
    plan_child(awd_input_dp(m), &s, arena);
    for (int l = 0; l < a->n_layers; l++) {
        plan_child(awd_rnn(m, l), &s, arena);
        if (l < a->n_layers - 1) plan_child(awd_hidden_dp(m, l), &s, arena);
    }
}

static const cf_tensor *run(cf_module *c, const cf_tensor *x) {
    c->in = x;
    return c->ops->forward(c, x);
}

static const cf_tensor *awd_forward(cf_module *m, const cf_tensor *x) {
    awd_impl *a = m->impl;
    m->in = x;
    const cf_tensor *h = run(awd_input_dp(m), run(awd_encoder(m), x));
    for (int l = 0; l < a->n_layers; l++) {
        h = run(awd_rnn(m, l), h);
        if (l < a->n_layers - 1) h = run(awd_hidden_dp(m, l), h);
    }
    return h;
}

static const cf_tensor *awd_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    awd_impl *a = m->impl;
    for (int l = a->n_layers - 1; l >= 0; l--) {
        if (l < a->n_layers - 1) {
            cf_module *hd = awd_hidden_dp(m, l);
            dy = hd->ops->backward(hd, dy, true);
        }
        cf_module *r = awd_rnn(m, l);
        /* the first LSTM needs its input gradient only when the embedding trains */
        dy = r->ops->backward(r, dy, l > 0 || awd_encoder(m)->params[0].trainable || need_dx);
        if (!dy) return NULL;
    }
    cf_module *ip = awd_input_dp(m), *enc = awd_encoder(m);
    dy = ip->ops->backward(ip, dy, true);
    return enc->ops->backward(enc, dy, need_dx);
}

static const cf_module_ops awd_ops = {
    .kind = "AWD_LSTM",
    .out_shape = awd_out_shape,
    .plan = awd_plan,
    .forward = awd_forward,
    .backward = awd_backward,
};

static bool config_ok(const char *who, const cf_awd_lstm_config *c, float drop_mult) {
    const float ps[] = {c->output_p, c->hidden_p, c->input_p, c->embed_p, c->weight_p};
    bool ok = c->emb_sz >= 1 && c->n_hid >= 1 && c->n_layers >= 1 && c->n_layers <= 16 &&
              drop_mult >= 0.0f;
    for (int i = 0; i < 5; i++) ok = ok && ps[i] * drop_mult >= 0.0f && ps[i] * drop_mult <= 1.0f;
    if (!ok)
        cf_fail(CF_ERR_INVALID,
                "%s: config out of range (emb_sz %d, n_hid %d, n_layers %d in 1..16, dropouts "
                "times drop_mult %g must lie in [0, 1])",
                who, c->emb_sz, c->n_hid, c->n_layers, (double)drop_mult);
    return ok;
}

cf_module *cf_awd_lstm(int vocab_size, const cf_awd_lstm_config *config, float drop_mult) {
    const cf_awd_lstm_config c = config ? *config : cf_awd_lstm_lm_config();
    if (!config_ok("cf_awd_lstm", &c, drop_mult)) return NULL;
    if (vocab_size < 1) {
        cf_fail(CF_ERR_INVALID, "cf_awd_lstm: vocab_size %d must be >= 1", vocab_size);
        return NULL;
    }
    awd_impl *a = cf_calloc(1, sizeof *a);
    if (!a) return NULL;
    *a = (awd_impl){.n_layers = c.n_layers, .emb_sz = c.emb_sz, .n_hid = c.n_hid};
    cf_module *m = cf_module_new(&awd_ops, a);
    if (!m) return NULL;
    cf_module *enc = cf_embedding_dropout(vocab_size, c.emb_sz, c.embed_p * drop_mult, c.pad_token);
    if (!enc || cf_module_add_child(m, enc, "encoder") != CF_OK) goto fail;
    for (int l = 0; l < c.n_layers; l++) {
        const int in = l == 0 ? c.emb_sz : c.n_hid, hid = l == c.n_layers - 1 ? c.emb_sz : c.n_hid;
        cf_module *r = cf_weight_dropout(cf_lstm(in, hid), c.weight_p * drop_mult);
        char name[32];
        snprintf(name, sizeof name, "rnns.%d", l);
        if (!r || cf_module_add_child(m, r, name) != CF_OK) goto fail;
    }
    cf_module *ip = cf_rnn_dropout(c.input_p * drop_mult);
    if (!ip || cf_module_add_child(m, ip, "input_dp") != CF_OK) goto fail;
    for (int l = 0; l < c.n_layers - 1; l++) {
        cf_module *hd = cf_rnn_dropout(c.hidden_p * drop_mult);
        char name[32];
        snprintf(name, sizeof name, "hidden_dps.%d", l);
        if (!hd || cf_module_add_child(m, hd, name) != CF_OK) goto fail;
    }
    return m;
fail:
    cf_module_free(m);
    return NULL;
}

static bool is_awd(const cf_module *m) {
    return m && m->ops == &awd_ops;
}

bool cf_nn_is_awd_lstm(const cf_module *m) {
    return is_awd(m);
}

int cf_nn_awd_lstm_layers(const cf_module *m) {
    return is_awd(m) ? ((const awd_impl *)m->impl)->n_layers : 0;
}

cf_module *cf_nn_awd_lstm_encoder(const cf_module *m) {
    return awd_encoder(m);
}

cf_module *cf_nn_awd_lstm_rnn(const cf_module *m, int l) {
    return awd_rnn(m, l);
}
