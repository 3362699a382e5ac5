/* fastai's text learners (text/learner.py, callback/rnn.py): language_model_learner with
 * CrossEntropyLossFlat, text_classifier_learner, TextLearner's moms and callbacks (ModelResetter,
 * RNNRegularizer), the Perplexity metric, save_encoder / load_encoder, and LMLearner.predict's
 * generation on ids. */
#include "corefit/learn.h"

#include "corefit/io.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "learn/internal.h"

/* ---- Perplexity ---------------------------------------------------------------------------- */

/* acc = [sum over samples of the sample's mean cross-entropy, samples]: fastai's AvgLoss (each
 * batch's mean loss times its rows), so exp(acc[0] / acc[1]) is exp(valid_loss). */
static void ppl_accumulate(cf_metric *m, const cf_tensor *pred, const cf_tensor *targ,
                           const bool *pad) {
    if (!pred || !targ || !pred->data || !targ->data || pred->shape.ndim < 2) return;
    const int64_t b = pred->shape.dim[0], c = pred->shape.dim[pred->shape.ndim - 1];
    const int64_t rows = (int64_t)cf_tensor_numel(pred) / c;
    if (b <= 0 || rows % b || (int64_t)cf_tensor_numel(targ) != rows) return;
    const int64_t k = rows / b;
    for (int64_t i = 0; i < b; i++) {
        if (pad && pad[i]) continue;
        double sample = 0;
        for (int64_t r = i * k; r < (i + 1) * k; r++) {
            const float *row = pred->data + r * c;
            const float t = targ->data[r];
            if (!(t >= 0.0f && t < (float)c) || t != floorf(t)) return; /* the loss refused it */
            float mx = row[0];
            for (int64_t j = 1; j < c; j++) mx = row[j] > mx ? row[j] : mx;
            double s = 0;
            for (int64_t j = 0; j < c; j++) s += exp((double)row[j] - mx);
            sample += mx + log(s) - row[(int64_t)t];
        }
        m->acc[0] += sample / (double)k;
        m->acc[1] += 1;
    }
}

static double ppl_value(const cf_metric *m) {
    return m->acc[1] > 0 ? exp(m->acc[0] / m->acc[1]) : NAN;
}

static void ppl_free(cf_metric *m) {
    cf_free(m->acc);
    cf_free(m);
}

cf_metric *cf_perplexity(void) {
    cf_metric *m = cf_calloc(1, sizeof *m);
    double *acc = cf_calloc(2, sizeof *acc);
    if (!m || !acc) {
        cf_free(m);
        cf_free(acc);
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "perplexity");
    m->n_acc = 2;
    m->acc = acc;
    m->accumulate = ppl_accumulate;
    m->value = ppl_value;
    m->free = ppl_free;
    m->lower_is_better = true;
    return m;
}

/* ---- ModelResetter ------------------------------------------------------------------------- */

static cf_status reset_model(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_rnn_reset(learn->model->root);
    return CF_OK;
}

static void free_plain_cb(cf_callback *cb) {
    cf_free(cb->state);
    cf_free(cb);
}

cf_callback *cf_model_resetter_cb(void) {
    cf_callback *cb = cf_calloc(1, sizeof *cb);
    if (!cb) return NULL;
    cb->name = "ModelResetter";
    cb->order = CF_ORDER_DEFAULT;
    cb->free = free_plain_cb;
    cb->on[CF_EV_BEFORE_TRAIN] = reset_model;
    cb->on[CF_EV_BEFORE_VALIDATE] = reset_model;
    cb->on[CF_EV_AFTER_FIT] = reset_model;
    return cb;
}

/* ---- RNNRegularizer ------------------------------------------------------------------------ */

/* A thin switch over the language model's own regularizer (cf_rnn_regularizer_set, tested
 * against PyTorch autograd): on for each training backward, off again afterwards, so eval
 * passes and other learners' backwards of the same model add nothing. */
typedef struct rnn_reg_state {
    double alpha, beta;
    double ar, tar; /* the last training batch's terms (before alpha and beta) */
} rnn_reg_state;

static cf_status lm_root(const cf_learner *learn, cf_module **root) {
    *root = learn->model->root;
    if (!cf_awd_lstm_lm_raw_out(*root))
        return cf_fail(CF_ERR_INVALID, "RNNRegularizer: the model is not a language model "
                                       "(cf_awd_lstm_lm) or has not run forward");
    return CF_OK;
}

static cf_status reg_after_loss(cf_callback *cb, cf_learner *learn) {
    rnn_reg_state *s = cb->state;
    cf_module *root = NULL;
    cf_status st = lm_root(learn, &root);
    if (st != CF_OK) return st;
    s->ar = cf_rnn_regularizer_loss(root, 1.0f, 0.0f);
    s->tar = cf_rnn_regularizer_loss(root, 0.0f, 1.0f);
    return CF_OK;
}

/* fastai adds the terms to loss_grad before GradientAccumulation scales it, so the terms take
 * the loop's loss_grad_scale as the cross-entropy's gradient does. */
static cf_status reg_before_backward(cf_callback *cb, cf_learner *learn) {
    const rnn_reg_state *s = cb->state;
    cf_module *root = NULL;
    cf_status st = lm_root(learn, &root);
    if (st != CF_OK) return st;
    const double scale = learn->loss_grad_scale != 0.0f ? learn->loss_grad_scale : 1.0;
    return cf_rnn_regularizer_set(root, (float)(s->alpha * scale), (float)(s->beta * scale));
}

static cf_status reg_after_backward(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    cf_module *root = NULL;
    return lm_root(learn, &root) == CF_OK ? cf_rnn_regularizer_set(root, 0.0f, 0.0f) : CF_OK;
}

cf_callback *cf_rnn_regularizer_cb(double alpha, double beta) {
    cf_callback *cb = cf_calloc(1, sizeof *cb);
    rnn_reg_state *s = cf_calloc(1, sizeof *s);
    if (!cb || !s) {
        cf_free(cb);
        cf_free(s);
        return NULL;
    }
    s->alpha = alpha;
    s->beta = beta;
    cb->name = "RNNRegularizer";
    cb->order = CF_ORDER_DEFAULT;
    cb->skip_valid = true; /* fastai: training only */
    cb->state = s;
    cb->free = free_plain_cb;
    cb->on[CF_EV_AFTER_LOSS] = reg_after_loss;
    cb->on[CF_EV_BEFORE_BACKWARD] = reg_before_backward;
    cb->on[CF_EV_AFTER_BACKWARD] = reg_after_backward;
    cb->on[CF_EV_AFTER_CANCEL_BACKWARD] = reg_after_backward;
    return cb;
}

cf_status cf_rnn_regularizer_terms(const cf_callback *cb, double *ar, double *tar) {
    if (!cb || !cb->name || strcmp(cb->name, "RNNRegularizer") != 0)
        return cf_fail(CF_ERR_INVALID, "cf_rnn_regularizer_terms: not an RNNRegularizer");
    const rnn_reg_state *s = cb->state;
    if (ar) *ar = s->ar;
    if (tar) *tar = s->tar;
    return CF_OK;
}

/* ---- what both text learners share --------------------------------------------------------- */

/* A constructor that failed before its learner existed: frees the model and the caller's
 * metrics and callbacks (the learner would have owned them), returns st. */
static cf_status drop_model_and_opts(cf_status st, cf_model *model, cf_metric **metrics,
                                     int n_metrics, cf_callback **cbs, int n_cbs) {
    cf_model_free(model);
    for (int i = 0; i < n_metrics; i++) cf_metric_free(metrics[i]);
    for (int i = 0; i < n_cbs; i++) cf_callback_free(cbs[i]);
    return st;
}

/* fastai's TextLearner over model: the loss `loss` unless the caller set one, moms (0.8, 0.7,
 * 0.8) unless given, and the ModelResetter. */
static cf_status text_learner_new(cf_learner **out, cf_dls *dls, cf_model *model,
                                  cf_learner_opts *lo, cf_loss_kind loss) {
    if (!lo->loss_set) lo->loss = (cf_loss){.kind = loss};
    lo->loss_set = true;
    if (!(lo->moms[0] > 0)) {
        lo->moms[0] = 0.8;
        lo->moms[1] = 0.7;
        lo->moms[2] = 0.8;
    }
    cf_status st = cf_learner_new_(out, dls, model, lo);
    if (st != CF_OK) return st;
    if ((st = cf_learner_add_cb(*out, cf_model_resetter_cb())) != CF_OK) {
        cf_learner_free(*out);
        *out = NULL;
    }
    return st;
}

/* ---- language_model_learner ---------------------------------------------------------------- */

cf_status cf_language_model_learner_(cf_learner **out, cf_dls *dls, const cf_lm_learner_opts *o) {
    *out = NULL;
    cf_status st = CF_OK;
    const cf_text_corpus *corpus = dls && dls->train ? cf_text_loader_corpus(dls->train) : NULL;
    if (!corpus || !cf_text_loader_is_lm(dls->train))
        st = cf_fail(CF_ERR_INVALID, "language_model_learner: the training loader is not a "
                                     "language-model text loader (cf_text_dls_new with is_lm)");
    cf_awd_lstm_config config = o->config ? *o->config : cf_awd_lstm_lm_config();
    const float drop_mult = o->drop_mult > 0 ? o->drop_mult : 1.0f;
    cf_model *model = NULL;
    if (st == CF_OK) {
        cf_module *root = cf_awd_lstm_lm(corpus->vocab_size, &config, drop_mult);
        st = root ? cf_model_new(&model, root, o->seed)
                  : cf_fail_context(CF_ERR_INVALID, "language_model_learner");
    }
    if (st == CF_OK) st = cf_split_awd_lstm_lm(model);
    if (st != CF_OK)
        return drop_model_and_opts(st, model, o->metrics, o->n_metrics, o->cbs, o->n_cbs);
    cf_learner_opts lo = {0};
    COPY_LEARNER_FIELDS(lo, o);
    cf_learner *learn = NULL;
    /* CrossEntropyLossFlat over tokens */
    if ((st = text_learner_new(&learn, dls, model, &lo, CF_LOSS_CROSS_ENTROPY)) != CF_OK) return st;
    snprintf(learn->recipe.arch, sizeof learn->recipe.arch, "awd_lstm_lm");
    learn->recipe.n_out = corpus->vocab_size;
    const double alpha = o->alpha == 0 ? 2.0 : o->alpha, beta = o->beta == 0 ? 1.0 : o->beta;
    if (alpha > 0 || beta > 0)
        st = cf_learner_add_cb(learn,
                               cf_rnn_regularizer_cb(alpha > 0 ? alpha : 0, beta > 0 ? beta : 0));
    if (st != CF_OK) {
        cf_learner_free(learn);
        return st;
    }
    *out = learn;
    return CF_OK;
}

/* ---- text_classifier_learner -------------------------------------------------------------- */

cf_status cf_text_classifier_learner_(cf_learner **out, cf_dls *dls,
                                      const cf_text_clas_learner_opts *o) {
    *out = NULL;
    cf_status st = CF_OK;
    const cf_text_corpus *corpus = dls && dls->train ? cf_text_loader_corpus(dls->train) : NULL;
    if (!corpus || cf_text_loader_is_lm(dls->train))
        st = cf_fail(CF_ERR_INVALID, "text_classifier_learner: the training loader is not a "
                                     "classifier text loader (cf_text_dls_new without is_lm)");
    else if (corpus->target_dim < 1 || corpus->n_classes < 1)
        st =
            cf_fail(CF_ERR_INVALID, "text_classifier_learner: the training corpus %s has no labels",
                    corpus->source ? corpus->source : "(in memory)");
    const bool multi_label = st == CF_OK && corpus->target_dim > 1;
    const int n_out = st != CF_OK ? 0 : o->n_out > 0 ? o->n_out : corpus->n_classes;
    if (st == CF_OK && multi_label && n_out != corpus->target_dim)
        st = cf_fail(CF_ERR_INVALID,
                     "text_classifier_learner: n_out %d does not match the %d multi-hot labels",
                     n_out, corpus->target_dim);
    cf_awd_lstm_config config = o->config ? *o->config : cf_awd_lstm_clas_config();
    const float drop_mult = o->drop_mult > 0 ? o->drop_mult : 0.5f;
    const cf_text_classifier_opts copts = {.seq_len = o->seq_len > 0 ? o->seq_len : 72,
                                           .max_len = o->max_len != 0 ? o->max_len : 72 * 20,
                                           .lin_ftrs = o->lin_ftrs,
                                           .n_lin_ftrs = o->n_lin_ftrs,
                                           .ps = o->ps};
    cf_model *model = NULL;
    if (st == CF_OK) {
        cf_module *root = cf_text_classifier(corpus->vocab_size, n_out, &config, drop_mult, &copts);
        st = root ? cf_model_new(&model, root, o->seed)
                  : cf_fail_context(CF_ERR_INVALID, "text_classifier_learner");
    }
    if (st == CF_OK) st = cf_split_text_classifier(model);
    if (st != CF_OK)
        return drop_model_and_opts(st, model, o->metrics, o->n_metrics, o->cbs, o->n_cbs);
    cf_learner_opts lo = {0};
    COPY_LEARNER_FIELDS(lo, o);
    cf_learner *learn = NULL;
    /* CrossEntropyLossFlat, or BCEWithLogitsLossFlat for multi-hot labels */
    st = text_learner_new(&learn, dls, model, &lo,
                          multi_label ? CF_LOSS_BCE_LOGITS : CF_LOSS_CROSS_ENTROPY);
    if (st != CF_OK) return st;
    snprintf(learn->recipe.arch, sizeof learn->recipe.arch, "awd_lstm_clas");
    learn->recipe.n_out = n_out;
    learn->recipe.text_seq_len = copts.seq_len; /* what an exported model rebuilds */
    learn->recipe.text_max_len = copts.max_len;
    *out = learn;
    return CF_OK;
}

/* ---- save_encoder / load_encoder ----------------------------------------------------------- */

/* The state_dict prefix of the AWD-LSTM in a model ("0." in a language model, the encoder's in
 * a classifier), found as the text before its "encoder.weight"; written into buf. */
static cf_status encoder_prefix(const cf_model *m, char *buf, size_t size) {
    static const char key[] = "encoder.weight";
    const size_t k = sizeof key - 1;
    for (int i = 0; i < m->n_params; i++) {
        const char *name = m->params[i]->full_name;
        size_t n = strlen(name);
        if (n >= k && strcmp(name + n - k, key) == 0 && (n == k || name[n - k - 1] == '.') &&
            n - k < size) {
            snprintf(buf, size, "%.*s", (int)(n - k), name);
            return CF_OK;
        }
    }
    return cf_fail(CF_ERR_INVALID, "the model has no AWD-LSTM encoder (no \"encoder.weight\")");
}

cf_status cf_learner_save_encoder(cf_learner *learn, const char *name) {
    char path[4096], prefix[256];
    cf_status st = encoder_prefix(learn->model, prefix, sizeof prefix);
    if (st == CF_OK) st = cf__model_file(learn, name, true, path, sizeof path);
    if (st != CF_OK) return st;
    const cf_model *m = learn->model;
    const size_t plen = strlen(prefix);
    cf_st_entry *entries = cf_calloc((size_t)m->n_params + 1, sizeof *entries);
    if (!entries) return CF_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const cf_param *p = m->params[i];
        if (strncmp(p->full_name, prefix, plen) != 0) continue;
        entries[n++] = (cf_st_entry){.name = p->full_name + plen,
                                     .dtype = CF_DTYPE_F32,
                                     .shape = p->shape,
                                     .numel = p->numel,
                                     .data = p->data};
    }
    const char *keys[] = {"corefit.encoder"}, *values[] = {"AWD_LSTM"};
    st = cf_st_write(path, entries, n, keys, values, 1);
    cf_free(entries);
    return st;
}

cf_status cf_learner_load_encoder(cf_learner *learn, const char *name) {
    char path[4096], want[256];
    cf_status st = encoder_prefix(learn->model, want, sizeof want);
    if (st == CF_OK) st = cf__model_file(learn, name, false, path, sizeof path);
    if (st != CF_OK) return st;
    const cf_model *m = learn->model;
    const size_t plen = strlen(want);
    cf_st_file *file = NULL;
    if ((st = cf_st_read(path, &file)) != CF_OK) return st;
    /* every check before anything is copied: the learner is unchanged on error */
    int used = 0;
    for (int i = 0; i < m->n_params && st == CF_OK; i++) {
        const cf_param *p = m->params[i];
        if (strncmp(p->full_name, want, plen) != 0) continue;
        const cf_st_entry *e = cf_st_find(file, p->full_name + plen);
        char a[64], b[64];
        if (!e)
            st = cf_fail(CF_ERR_INVALID, "load_encoder %s: no tensor \"%s\"", path,
                         p->full_name + plen);
        else if (e->numel != p->numel || e->shape.ndim != p->shape.ndim ||
                 memcmp(e->shape.dim, p->shape.dim, sizeof(int) * (size_t)p->shape.ndim) != 0)
            st = cf_fail(CF_ERR_INVALID,
                         "load_encoder %s: tensor \"%s\" is %s, the model's is %s (the "
                         "vocabularies and encoder sizes must match)",
                         path, e->name, cf_shape_str(&e->shape, a, sizeof a),
                         cf_shape_str(&p->shape, b, sizeof b));
        else
            used++;
    }
    if (st == CF_OK && used != file->n_entries)
        st = cf_fail(CF_ERR_INVALID,
                     "load_encoder %s: the file holds %d tensors, the model's encoder %d", path,
                     file->n_entries, used);
    for (int i = 0; i < m->n_params && st == CF_OK; i++) {
        const cf_param *p = m->params[i];
        if (strncmp(p->full_name, want, plen) != 0) continue;
        memcpy(p->data, cf_st_find(file, p->full_name + plen)->data, p->numel * sizeof(float));
    }
    cf_st_free(file);
    if (st == CF_OK) cf_rnn_reset(m->root);
    return st == CF_OK ? cf_learner_freeze(learn) : st;
}

/* ---- generation (LMLearner.predict on ids) ------------------------------------------------- */

cf_status cf_lm_generate_(cf_learner *learn, const int32_t *ids, int64_t n_ids, int32_t **out,
                          int64_t *n_out, const cf_lm_generate_opts *o) {
    *out = NULL;
    *n_out = 0;
    const int n_words = o->n_words > 0 ? o->n_words : 1;
    const double temperature = o->temperature > 0 ? o->temperature : 1.0;
    if (!ids || n_ids < 1)
        return cf_fail(CF_ERR_INVALID, "lm_generate: no input ids (give at least xxbos)");
    if (n_ids + n_words > (int64_t)1 << 30)
        return cf_fail(CF_ERR_INVALID, "lm_generate: %lld ids and %d words are too many",
                       (long long)n_ids, n_words);
    float *x = cf_malloc((size_t)(n_ids + n_words) * sizeof(float));
    int32_t *res = cf_malloc((size_t)(n_ids + n_words) * sizeof(int32_t));
    double *prob = NULL;
    if (!x || !res) {
        cf_free(x);
        cf_free(res);
        return CF_ERR_NOMEM;
    }
    for (int64_t i = 0; i < n_ids; i++) {
        res[i] = ids[i];
        x[i] = (float)ids[i];
    }
    cf_rng rng;
    cf_rng_seed(&rng, o->seed);
    cf_model_train(learn->model, false);
    cf_status st = CF_OK;
    int64_t len = n_ids;
    for (int w = 0; w < n_words && st == CF_OK; w++) {
        cf_rnn_reset(learn->model->root);
        cf_tensor in = cf_tensor_view(x, cf_shape2(1, (int)len));
        const cf_tensor *y = NULL;
        if ((st = cf_model_forward(learn->model, &in, &y)) != CF_OK) break;
        const int v = y->shape.dim[y->shape.ndim - 1];
        if (!prob && !(prob = cf_malloc((size_t)v * sizeof(double)))) {
            st = CF_ERR_NOMEM;
            break;
        }
        const float *last = y->data + (size_t)(len - 1) * v;
        float mx = last[0];
        for (int j = 1; j < v; j++) mx = last[j] > mx ? last[j] : mx;
        double sum = 0;
        for (int j = 0; j < v; j++) sum += prob[j] = exp((double)last[j] - mx);
        for (int j = 0; j < v; j++) prob[j] /= sum;
        if (!o->allow_unk) prob[CF_TEXT_UNK] = 0;
        if (o->min_p > 0) { /* fastai: only when some probability reaches min_p */
            bool any = false;
            for (int j = 0; j < v && !any; j++) any = prob[j] >= o->min_p;
            if (any)
                for (int j = 0; j < v; j++)
                    if (prob[j] < o->min_p) prob[j] = 0;
        }
        if (temperature != 1.0)
            for (int j = 0; j < v; j++) prob[j] = pow(prob[j], 1.0 / temperature);
        double total = 0;
        for (int j = 0; j < v; j++) total += prob[j];
        if (!(total > 0)) {
            st = cf_fail(CF_ERR_INVALID, "lm_generate: no word has a probability left at word %d",
                         w + 1);
            break;
        }
        /* torch.multinomial(res, 1): a draw proportional to the weights */
        double u = cf_rng_uniform(&rng) * total, acc = 0;
        int pick = -1;
        for (int j = 0; j < v; j++) {
            if (prob[j] <= 0) continue;
            pick = j;
            acc += prob[j];
            if (u < acc) break;
        }
        res[len] = pick;
        x[len] = (float)pick;
        len++;
    }
    cf_rnn_reset(learn->model->root);
    cf_free(prob);
    cf_free(x);
    if (st != CF_OK) {
        cf_free(res);
        return st;
    }
    *out = res;
    *n_out = len;
    return CF_OK;
}
