/* fastai's text application end to end: what an exported text model carries (vocabulary,
 * tokenizer settings, the AWD-LSTM's sizes) and how cf_load_learner rebuilds it, and predict
 * on raw text (a classifier's label and probabilities, a language model's generated text). */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- what an exported text model carries --------------------------------------------------- */

bool cf__is_text_arch(const char *arch) {
    return strcmp(arch, "awd_lstm_lm") == 0 || strcmp(arch, "awd_lstm_clas") == 0;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

cf_status cf__text_learner_info(const cf_learner *learn, cf_model_info *m) {
    const cf_text_corpus *c = cf_text_loader_corpus(learn->dls->train);
    const bool lm = cf_text_loader_is_lm(learn->dls->train);
    const cf_text_vocab *v = cf_text_numericalizer_vocab(learn->dls->text_nz);
    const cf_text_tok_options *tok = cf_text_numericalizer_tok(learn->dls->text_nz);
    if (!v || !tok)
        return cf_fail(CF_ERR_STATE,
                       "export: a text model carries its vocabulary and tokenizer, which these "
                       "DataLoaders lack (make them with cf_text_dls_from_folder / from_csv)");
    snprintf(m->recipe.arch, sizeof m->recipe.arch, "%s", lm ? "awd_lstm_lm" : "awd_lstm_clas");
    snprintf(m->input, sizeof m->input, "text");
    m->tok = *tok;
    m->n_text_vocab = (int)cf_text_vocab_len(v);
    m->n_in = m->n_text_vocab;
    if (m->n_text_vocab != c->vocab_size)
        return cf_fail(CF_ERR_STATE, "export: the vocabulary has %d words, the corpus %d",
                       m->n_text_vocab, (int)c->vocab_size);
    if (!(m->text_vocab = cf_calloc((size_t)m->n_text_vocab + 1, sizeof(char *))))
        return CF_ERR_NOMEM;
    for (int i = 0; i < m->n_text_vocab; i++)
        if (!(m->text_vocab[i] = cf_strdup(cf_text_vocab_word(v, i)))) return CF_ERR_NOMEM;
    /* the AWD-LSTM's sizes, read off its parameters (whatever config built it) */
    const cf_model *model = learn->model;
    int n_hid0 = 0, n_lin = 0, outs[CF_HEAD_MAX_LAYERS + 2];
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        if (ends_with(p->full_name, "encoder.weight") && p->shape.ndim == 2) {
            m->emb_sz = p->shape.dim[1];
        } else if (ends_with(p->full_name, "weight_hh_l0_raw")) {
            if (m->n_layers++ == 0) n_hid0 = p->shape.dim[1];
        } else if (!lm && strncmp(p->full_name, "1.layers.", 9) == 0 && p->shape.ndim == 2 &&
                   n_lin < CF_HEAD_MAX_LAYERS + 2) {
            outs[n_lin++] = p->shape.dim[0];
        }
    }
    if (!m->emb_sz || !m->n_layers)
        return cf_fail(CF_ERR_STATE, "export: the text model has no AWD-LSTM encoder");
    m->n_hid = m->n_layers > 1 ? n_hid0 : cf_awd_lstm_lm_config().n_hid;
    if (lm) {
        m->recipe.n_out = m->n_text_vocab;
        m->n_vocab = 0; /* no class names */
    } else {
        m->recipe.n_lin_ftrs = n_lin > 0 ? n_lin - 1 : 0;
        for (int i = 0; i + 1 < n_lin && i < CF_HEAD_MAX_LAYERS; i++)
            m->recipe.lin_ftrs[i] = outs[i];
        if (!m->recipe.text_seq_len) m->recipe.text_seq_len = 72;
        if (!m->recipe.text_max_len) m->recipe.text_max_len = 72 * 20;
    }
    return CF_OK;
}

static cf_awd_lstm_config info_config(const cf_model_info *m, bool lm) {
    cf_awd_lstm_config c = lm ? cf_awd_lstm_lm_config() : cf_awd_lstm_clas_config();
    c.emb_sz = m->emb_sz;
    c.n_hid = m->n_hid;
    c.n_layers = m->n_layers;
    return c;
}

cf_status cf__text_learner_from_info(const cf_model_info *m, cf_dls *dls, cf_metric **metrics,
                                     int n_metrics, cf_learner **out) {
    const bool lm = strcmp(m->recipe.arch, "awd_lstm_lm") == 0;
    const cf_awd_lstm_config config = info_config(m, lm);
    if (lm)
        return cf_language_model_learner(out, dls, .config = &config, .metrics = metrics,
                                         .n_metrics = n_metrics, .quiet = true);
    return cf_text_classifier_learner(
        out, dls, .config = &config, .metrics = metrics, .n_metrics = n_metrics, .quiet = true,
        .seq_len = m->recipe.text_seq_len, .max_len = m->recipe.text_max_len,
        .lin_ftrs = m->recipe.n_lin_ftrs ? m->recipe.lin_ftrs : NULL,
        .n_lin_ftrs = m->recipe.n_lin_ftrs);
}

/* One short text ("xxbos xxbos") as training and validation data, labelled with the model's
 * classes, and the model's tokenizer and vocabulary: what predict needs. */
cf_status cf__text_placeholder_dls(const cf_model_info *m, cf_dls **out) {
    *out = NULL;
    const bool lm = strcmp(m->recipe.arch, "awd_lstm_lm") == 0;
    cf_text_vocab *v = NULL;
    cf_text_numericalizer *nz = NULL;
    cf_text_corpus *c = NULL;
    const int32_t doc[2] = {CF_TEXT_BOS, CF_TEXT_BOS};
    const int32_t *docs[1] = {doc};
    const int64_t lens[1] = {2};
    cf_status st =
        cf_text_vocab_from_words((const char *const *)m->text_vocab, m->n_text_vocab, &v);
    if (st == CF_OK) st = cf_text_numericalizer_new(&m->tok, NULL, v, &nz);
    if (st == CF_OK) st = cf_text_corpus_from_docs(docs, lens, 1, m->n_text_vocab, &c);
    if (st == CF_OK && !lm) {
        const float target = 0;
        if (m->n_vocab != m->recipe.n_out)
            st = cf_fail(CF_ERR_FORMAT, "a text classifier of %d outputs with %d class names",
                         m->recipe.n_out, m->n_vocab);
        else
            st =
                cf_text_corpus_set_labels(c, &target, 1, m->n_vocab, (const char *const *)m->vocab);
    }
    if (st == CF_OK)
        st = cf_text_dls_new(c, c, &(cf_text_dls_options){.bs = 1, .is_lm = lm, .prefetch = -1},
                             out);
    if (st == CF_OK) {
        (*out)->text_nz = nz;
        (*out)->free_text_nz = cf_text_numericalizer_free;
        nz = NULL;
    }
    cf_text_corpus_free(c);
    cf_text_numericalizer_free(nz);
    cf_text_vocab_free(v);
    return st;
}

/* ---- predict on raw text -------------------------------------------------------------------- */

static cf_status encode_text(cf_learner *learn, const char *text, const char *who, int32_t **ids,
                             int64_t *n) {
    const cf_text_numericalizer *nz = learn && learn->dls ? learn->dls->text_nz : NULL;
    if (!nz || !nz->encode)
        return cf_fail(CF_ERR_STATE,
                       "%s: the learner has no tokenizer and vocabulary (DataLoaders from "
                       "cf_text_dls_from_folder / from_csv, or cf_load_learner of a text model)",
                       who);
    if (!text) return cf_fail(CF_ERR_INVALID, "%s: the text is NULL", who);
    return nz->encode(nz->ctx, text, ids, n);
}

cf_status cf_predict_text(cf_learner *learn, const char *text, float *probs, int *decoded,
                          int64_t *n_unknown) {
    int32_t *ids = NULL;
    int64_t n = 0;
    const cf_text_corpus *c = learn && learn->dls ? cf_text_loader_corpus(learn->dls->train) : NULL;
    if (!c || cf_text_loader_is_lm(learn->dls->train))
        return cf_fail(CF_ERR_STATE, "predict_text: the learner is not a text classifier");
    if (!probs) return cf_fail(CF_ERR_INVALID, "predict_text: probs is NULL");
    cf_status st = encode_text(learn, text, "predict_text", &ids, &n);
    if (st != CF_OK) return st;
    float *x = cf_malloc((size_t)n * sizeof(float));
    if (!x) {
        cf_free(ids);
        return CF_ERR_NOMEM;
    }
    int64_t unknown = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)ids[i];
        unknown += ids[i] == CF_TEXT_UNK;
    }
    cf_free(ids);
    cf_model_train(learn->model, false);
    cf_rnn_reset(learn->model->root);
    cf_tensor in = cf_tensor_view(x, cf_shape2(1, (int)n));
    const cf_tensor *y = NULL;
    st = cf_model_forward(learn->model, &in, &y);
    if (st == CF_OK) {
        const int k = (int)cf_tensor_numel(y);
        int best = 0;
        if (learn->loss.kind == CF_LOSS_BCE_LOGITS) {
            for (int j = 0; j < k; j++) probs[j] = 1.0f / (1.0f + expf(-y->data[j]));
        } else {
            float mx = y->data[0];
            for (int j = 1; j < k; j++) mx = y->data[j] > mx ? y->data[j] : mx;
            double sum = 0;
            for (int j = 0; j < k; j++) sum += exp((double)y->data[j] - mx);
            for (int j = 0; j < k; j++) probs[j] = (float)(exp((double)y->data[j] - mx) / sum);
        }
        for (int j = 1; j < k; j++) best = probs[j] > probs[best] ? j : best;
        if (decoded) *decoded = best;
        if (n_unknown) *n_unknown = unknown;
    }
    cf_rnn_reset(learn->model->root);
    cf_free(x);
    return st;
}

cf_status cf_lm_predict_text(cf_learner *learn, const char *text, const cf_lm_generate_opts *opts,
                             char **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "lm_predict_text: out is NULL");
    *out = NULL;
    if (!learn || !learn->dls || !cf_text_loader_is_lm(learn->dls->train))
        return cf_fail(CF_ERR_STATE, "lm_predict_text: the learner is not a language model");
    int32_t *ids = NULL, *gen = NULL;
    int64_t n = 0, n_gen = 0;
    cf_status st = encode_text(learn, text, "lm_predict_text", &ids, &n);
    const cf_lm_generate_opts o = opts ? *opts : (cf_lm_generate_opts){0};
    if (st == CF_OK) st = cf_lm_generate_(learn, ids, n, &gen, &n_gen, &o);
    cf_free(ids);
    if (st != CF_OK) return st;
    const cf_text_numericalizer *nz = learn->dls->text_nz;
    const char **toks = cf_malloc((size_t)(n_gen ? n_gen : 1) * sizeof(char *));
    if (!toks) {
        cf_free(gen);
        return CF_ERR_NOMEM;
    }
    for (int64_t i = 0; i < n_gen; i++) {
        const char *t = nz->token ? nz->token(nz->ctx, gen[i]) : NULL;
        toks[i] = t ? t : "xxunk";
    }
    st = cf_text_decode_spec_tokens(toks, n_gen, out);
    cf_free(toks);
    cf_free(gen);
    return st;
}
