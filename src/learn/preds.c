/* validate, get_preds and predict: inference passes through the same loop and callbacks. */
#include "corefit/learn.h"

#include <math.h>
#include <string.h>

#include "learn/internal.h"

/* The callbacks given to an inference call belong to it: a call that stops before the loop
 * (which frees them) frees them here. */
static cf_status free_call_cbs(cf_callback *const *cbs, int n_cbs, cf_status st) {
    for (int i = 0; i < n_cbs; i++) cf_callback_free(cbs[i]);
    return st;
}

cf_status cf_validate_(cf_learner *learn, double *values, const cf_validate_opts *o) {
    cf_dataloader *dl = o->train_set ? learn->dls->train : learn->dls->valid;
    if (!dl)
        return free_call_cbs(o->cbs, o->n_cbs,
                             cf_fail(CF_ERR_INVALID, "validate: no %s set",
                                     o->train_set ? "training" : "validation"));
    cf_status st = cf__run_inference(learn, dl, o->cbs, o->n_cbs, NULL, NULL);
    if (st != CF_OK) return st;
    if (values) memcpy(values, learn->final_record, (size_t)learn->n_final_record * sizeof(double));
    return CF_OK;
}

typedef struct gather_ctx {
    cf_preds *out;
    const cf_get_preds_opts *opts;
    int64_t pred_cols, targ_cols, input_cols;
    /* a language model's stream: global batch rows, tokens per row (bl), seq_len */
    int64_t lm_rows, lm_row_len, lm_seq_len;
    cf_tensor act; /* activation scratch, sized on the first batch */
    cf_status status;
} gather_ctx;

static void gather_batch(cf_learner *learn, const cf_batch *b, const cf_tensor *pred,
                         const float *per_item_loss, void *vctx) {
    gather_ctx *g = vctx;
    cf_preds *out = g->out;
    if (g->status != CF_OK) return;
    const float *rows = pred->data;
    if (!g->opts->raw) {
        size_t need = cf_tensor_numel(pred);
        if (!g->act.data || cf_tensor_numel(&g->act) < need) {
            cf_free(g->act.data);
            g->act.data = cf_malloc(need * sizeof(float));
            if (!g->act.data) {
                g->status = CF_ERR_NOMEM;
                return;
            }
        }
        g->act.shape = pred->shape;
        cf_loss_activation(&learn->loss, pred, &g->act);
        rows = g->act.data;
    }
    if (g->lm_rows > 0) { /* row j of batch k holds stream positions j * bl + k * seq_len + t */
        const int64_t T = pred->shape.dim[1], V = g->pred_cols;
        for (int i = 0; i < b->size; i++) {
            if (b->pad && b->pad[i]) continue;
            const int64_t k = b->idx[i] / g->lm_rows, j = b->idx[i] % g->lm_rows;
            for (int64_t t = 0; t < T; t++) {
                const int64_t at = j * g->lm_row_len + k * g->lm_seq_len + t;
                if (at < 0 || at >= out->n) continue;
                const float *logits = pred->data + ((size_t)i * T + t) * V;
                const float *r = rows + ((size_t)i * T + t) * V;
                const float target = b->y.data[(size_t)i * T + t];
                memcpy(out->preds.data + at * V, r, (size_t)V * sizeof(float));
                out->targs.data[at] = target;
                int64_t best = 0;
                float mx = logits[0];
                for (int64_t c = 1; c < V; c++)
                    if (logits[c] > mx) mx = logits[best = c];
                if (out->decoded) out->decoded[at] = best;
                if (out->losses) { /* the token's cross-entropy */
                    double s = 0;
                    for (int64_t c = 0; c < V; c++) s += exp((double)logits[c] - mx);
                    const int64_t tc = (int64_t)target;
                    out->losses[at] = tc >= 0 && tc < V ? (float)(mx + log(s) - logits[tc]) : NAN;
                }
            }
        }
        return;
    }
    for (int i = 0; i < b->size; i++) {
        if (b->pad && b->pad[i]) continue;
        int64_t at = b->idx[i];
        if (at < 0 || at >= out->n) continue;
        memcpy(out->preds.data + at * g->pred_cols, rows + i * g->pred_cols,
               (size_t)g->pred_cols * sizeof(float));
        memcpy(out->targs.data + at * g->targ_cols, b->y.data + i * g->targ_cols,
               (size_t)g->targ_cols * sizeof(float));
        if (out->inputs.data)
            memcpy(out->inputs.data + at * g->input_cols, b->x.data + i * g->input_cols,
                   (size_t)g->input_cols * sizeof(float));
        if (out->losses) out->losses[at] = per_item_loss[i];
        if (out->decoded) {
            const float *r = rows + i * g->pred_cols;
            int64_t best = 0;
            for (int64_t c = 1; c < g->pred_cols; c++)
                if (r[c] > r[best]) best = c;
            out->decoded[at] = g->pred_cols == 1 ? (r[0] > (g->opts->raw ? 0.0f : 0.5f)) : best;
        }
    }
}

void cf_preds_free(cf_preds *p) {
    if (!p) return;
    cf_free(p->preds.data);
    cf_free(p->targs.data);
    cf_free(p->inputs.data);
    cf_free(p->decoded);
    cf_free(p->losses);
    memset(p, 0, sizeof *p);
}

/* A loader over a dataset in order, without dropping, without augmentation unless tfms gives
 * some, sharded as this replica is (fastai's dl.new(shuffle=False, drop_last=False)). */
static cf_status ordered_loader(cf_learner *learn, cf_dataloader *like, const cf__preds_tfms *tfms,
                                cf_dataloader **out) {
    cf_dl_options opt = *cf_dataloader_options(like);
    opt.shuffle = false;
    opt.drop_last = false;
    opt.crop_pad = tfms ? tfms->crop_pad : 0;
    opt.flip = tfms && tfms->flip;
    opt.mirror = tfms && tfms->mirror;
    opt.aug = tfms ? tfms->aug : NULL;
    if (tfms) opt.seed = tfms->seed;
    cf_status st = cf_dataloader_new_like(like, &opt, out);
    if (st == CF_OK && learn->replica.world > 1)
        st = cf_dataloader_set_shard(*out, learn->replica.rank, learn->replica.world,
                                     learn->replica.shard_mode);
    if (st != CF_OK) {
        cf_dataloader_free(*out);
        *out = NULL;
    }
    return st;
}

cf_status cf_get_preds_(cf_learner *learn, cf_preds *out, const cf_get_preds_opts *o) {
    return cf__get_preds_tfms(learn, out, o, NULL);
}

cf_status cf__get_preds_tfms(cf_learner *learn, cf_preds *out, const cf_get_preds_opts *o,
                             const cf__preds_tfms *tfms) {
    memset(out, 0, sizeof *out);
    cf_dataloader *like = o->train_set ? learn->dls->train : learn->dls->valid;
    if (!like)
        return free_call_cbs(o->cbs, o->n_cbs,
                             cf_fail(CF_ERR_INVALID, "get_preds: no %s set",
                                     o->train_set ? "training" : "validation"));
    const cf_dataset *ds = cf_dataloader_dataset(like);
    const cf_text_corpus *corpus = cf_text_loader_corpus(like);
    if (corpus && o->with_input)
        return free_call_cbs(o->cbs, o->n_cbs,
                             cf_fail(CF_ERR_INVALID,
                                     "get_preds: with_input is not available for text (the "
                                     "documents have different lengths; read them from the "
                                     "corpus in the order of the predictions)"));
    cf_dataloader *dl = NULL;
    cf_status st = ordered_loader(learn, like, tfms, &dl);
    if (st != CF_OK) return free_call_cbs(o->cbs, o->n_cbs, st);
    /* The prediction width comes from the model: one forward on a single item. */
    cf_model_train(learn->model, false);
    cf_shape one = ds->sample_shape;
    int in_shape[CF_MAX_DIMS] = {1};
    for (int i = 0; i < one.ndim && i + 1 < CF_MAX_DIMS; i++) in_shape[i + 1] = one.dim[i];
    cf_shape probe_shape = cf_shape_make(one.ndim + 1, in_shape);
    float *probe = cf_calloc(cf_shape_numel(&probe_shape), sizeof(float));
    const cf_tensor *y = NULL;
    if (!probe) st = CF_ERR_NOMEM;
    if (st == CF_OK) {
        cf_tensor x = cf_tensor_view(probe, probe_shape);
        st = cf_model_forward(learn->model, &x, &y);
    }
    gather_ctx g = {.out = out, .opts = o};
    int64_t n = ds->n;
    if (st == CF_OK && corpus && cf_text_loader_is_lm(like)) {
        /* the stream layout: one row per token the loader predicts, in stream order */
        const cf_replica *r = &learn->replica;
        g.lm_rows = cf_dataloader_options(dl)->bs *
                    (r->world > 1 && r->shard_mode == CF_SHARD_PER_RANK ? r->world : 1);
        g.lm_row_len = corpus->n_tokens > 1 ? (corpus->n_tokens - 1) / g.lm_rows : 0;
        g.lm_seq_len = ds->sample_shape.dim[0];
        n = g.lm_rows * g.lm_row_len;
        if (n < 1 || n > INT32_MAX)
            st = cf_fail(CF_ERR_INVALID,
                         "get_preds: the language-model stream %s gives %lld "
                         "predictions (1 to %d)",
                         corpus->source ? corpus->source : "(in memory)", (long long)n, INT32_MAX);
    }
    if (st == CF_OK) {
        g.pred_cols = (int64_t)(g.lm_rows > 0 ? (size_t)y->shape.dim[y->shape.ndim - 1]
                                              : cf_shape_sample_numel(&y->shape));
        g.targ_cols = g.lm_rows > 0 ? 1 : ds->target_dim;
        g.input_cols = (int64_t)cf_shape_numel(&ds->sample_shape);
        out->n = n;
        out->preds = cf_tensor_view(cf_calloc((size_t)(n * g.pred_cols) + 1, sizeof(float)),
                                    g.pred_cols > 1 ? cf_shape2((int)n, (int)g.pred_cols)
                                                    : cf_shape1((int)n));
        out->targs =
            cf_tensor_view(cf_calloc((size_t)(n * g.targ_cols) + 1, sizeof(float)),
                           g.targ_cols > 1 ? cf_shape2((int)n, ds->target_dim) : cf_shape1((int)n));
        if (o->with_input) {
            int dims[CF_MAX_DIMS] = {(int)n};
            for (int i = 0; i < ds->sample_shape.ndim && i + 1 < CF_MAX_DIMS; i++)
                dims[i + 1] = ds->sample_shape.dim[i];
            out->inputs = cf_tensor_view(cf_calloc((size_t)(n * g.input_cols) + 1, sizeof(float)),
                                         cf_shape_make(ds->sample_shape.ndim + 1, dims));
        }
        if (o->with_decoded) out->decoded = cf_calloc((size_t)n + 1, sizeof(int64_t));
        if (o->with_loss) out->losses = cf_calloc((size_t)n + 1, sizeof(float));
        if (!out->preds.data || !out->targs.data || (o->with_input && !out->inputs.data) ||
            (o->with_decoded && !out->decoded) || (o->with_loss && !out->losses))
            st = cf_fail(CF_ERR_NOMEM, "get_preds: %lld predictions", (long long)n);
    }
    if (st == CF_OK)
        st = cf__run_inference(learn, dl, o->cbs, o->n_cbs, gather_batch, &g);
    else
        free_call_cbs(o->cbs, o->n_cbs, st);
    if (st == CF_OK) st = g.status;
    cf_free(g.act.data);
    cf_free(probe);
    cf_dataloader_free(dl);
    if (st != CF_OK) cf_preds_free(out);
    return st;
}

cf_status cf_predict(cf_learner *learn, const float *item, float *probs, int *decoded) {
    const cf_dataset *ds = learn->dls->train_ds ? learn->dls->train_ds : learn->dls->valid_ds;
    if (!ds) return cf_fail(CF_ERR_STATE, "predict: the learner has no data set for shapes");
    int dims[CF_MAX_DIMS] = {1};
    for (int i = 0; i < ds->sample_shape.ndim && i + 1 < CF_MAX_DIMS; i++)
        dims[i + 1] = ds->sample_shape.dim[i];
    cf_tensor x = cf_tensor_view((float *)item, cf_shape_make(ds->sample_shape.ndim + 1, dims));
    cf_model_train(learn->model, false);
    const cf_tensor *y = NULL;
    cf_status st = cf_model_forward(learn->model, &x, &y);
    if (st != CF_OK) return st;
    cf_tensor out = cf_tensor_view(probs, y->shape);
    cf_loss_activation(&learn->loss, y, &out);
    if (decoded) {
        size_t n = cf_tensor_numel(y);
        int best = 0;
        for (size_t c = 1; c < n; c++)
            if (probs[c] > probs[best]) best = (int)c;
        *decoded = n == 1 ? probs[0] > 0.5f : best;
    }
    return CF_OK;
}

/* ---- predictions as bytes ------------------------------------------------------------------ */

static void put_tensor(cf__writer *w, const cf_tensor *t) {
    bool present = t->data != NULL;
    cf__put_u64(w, present);
    if (!present) return;
    cf__put_u64(w, (uint64_t)t->shape.ndim);
    for (int i = 0; i < t->shape.ndim; i++) cf__put_u64(w, (uint64_t)t->shape.dim[i]);
    cf__put_array(w, t->data, (int64_t)cf_tensor_numel(t), sizeof(float));
}

/* A tensor whose first dimension is n (or absent when optional). */
static void get_tensor(cf__reader *r, const char *field, int64_t n, bool optional, cf_tensor *t) {
    uint64_t present = cf__get_u64(r);
    if (r->st != CF_OK) return;
    if (!present) {
        if (!optional) cf__reader_fail(r, "%s is missing", field);
        return;
    }
    uint64_t ndim = cf__get_u64(r);
    if (r->st == CF_OK && (ndim < 1 || ndim > CF_MAX_DIMS)) {
        cf__reader_fail(r, "%s has %llu dimensions (1 to %d allowed)", field,
                        (unsigned long long)ndim, CF_MAX_DIMS);
        return;
    }
    int dims[CF_MAX_DIMS] = {0};
    for (uint64_t i = 0; r->st == CF_OK && i < ndim; i++) {
        uint64_t d = cf__get_u64(r);
        if (r->st == CF_OK && (d > INT32_MAX || (i == 0 && d != (uint64_t)n)))
            cf__reader_fail(r, "%s dimension %llu is %llu (%lld rows)", field,
                            (unsigned long long)i, (unsigned long long)d, (long long)n);
        dims[i] = (int)d;
    }
    if (r->st != CF_OK) return;
    cf_shape shape = cf_shape_make((int)ndim, dims);
    int64_t count = 0;
    float *data = cf__get_array(r, field, INT64_MAX / 8, sizeof(float), &count);
    if (r->st == CF_OK && (size_t)count != cf_shape_numel(&shape))
        cf__reader_fail(r, "%s holds %lld values for a shape of %zu", field, (long long)count,
                        cf_shape_numel(&shape));
    if (r->st != CF_OK) {
        cf_free(data);
        return;
    }
    *t = cf_tensor_view(data, shape);
}

static void put_preds(const void *obj, cf__writer *w) {
    const cf_preds *p = obj;
    cf__put_header(w, "CFPR", 1);
    cf__put_u64(w, (uint64_t)p->n);
    put_tensor(w, &p->preds);
    put_tensor(w, &p->targs);
    put_tensor(w, &p->inputs);
    cf__put_u64(w, p->decoded != NULL);
    if (p->decoded) cf__put_array(w, p->decoded, p->n, sizeof(int64_t));
    cf__put_u64(w, p->losses != NULL);
    if (p->losses) cf__put_array(w, p->losses, p->n, sizeof(float));
}

size_t cf_preds_export(const cf_preds *p, void *buf, size_t size) {
    return cf__export(put_preds, p, buf, size);
}

cf_status cf_preds_import(cf_preds *out, const void *buf, size_t size) {
    cf__reader rd = cf__reader_make(buf, size, "predictions");
    cf_preds t = {0};
    cf__get_header(&rd, "CFPR", 1);
    uint64_t n = cf__get_u64(&rd);
    if (rd.st == CF_OK && n > INT32_MAX)
        cf__reader_fail(&rd, "%llu rows exceed the %d allowed", (unsigned long long)n, INT32_MAX);
    t.n = (int64_t)n;
    get_tensor(&rd, "preds", t.n, false, &t.preds);
    get_tensor(&rd, "targs", t.n, false, &t.targs);
    get_tensor(&rd, "inputs", t.n, true, &t.inputs);
    int64_t count = t.n;
    if (cf__get_u64(&rd)) t.decoded = cf__get_array(&rd, "decoded", INT32_MAX, 8, &count);
    if (rd.st == CF_OK && count != t.n)
        cf__reader_fail(&rd, "%lld decoded rows for %lld", (long long)count, (long long)t.n);
    if (cf__get_u64(&rd)) t.losses = cf__get_array(&rd, "losses", INT32_MAX, 4, &count);
    if (rd.st == CF_OK && count != t.n)
        cf__reader_fail(&rd, "%lld losses for %lld rows", (long long)count, (long long)t.n);
    cf__get_end(&rd);
    if (rd.st != CF_OK) {
        cf_preds_free(&t);
        return rd.st;
    }
    cf_preds_free(out);
    *out = t;
    return CF_OK;
}
