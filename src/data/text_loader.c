/* fastai's text loaders over numericalized corpora: LMDataLoader (one stream read by bs rows
 * across batches) and SortedDL with pad_input_chunk (length-sorted, front-padded classifier
 * batches). Batches are made in cf_dataloader_next through loader.c's batch operations; they
 * are a pure function of (corpus, options, seed, epoch, shard, position). */
#include "data_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct text_dl {
    cf_text_corpus *c; /* one reference */
    bool lm;
    cf_text_dl_options topt;
    cf_dataset *ds; /* what cf_dataloader_dataset shows: documents, classes (no samples) */
    int64_t max_len;
    /* the epoch: its order (language model: documents; classifier: one process's sample list),
     * language model: cumulative lengths along the order and the stream's shape */
    int64_t *order, *cum;
    int64_t B, bl, n_gb, last_len;
    int bs, rank, world;
    cf_shard_mode mode;
    /* batch buffers */
    float *x, *y;
    int64_t *idx;
    bool *pad;
    int32_t *tmp;
    size_t x_cap, y_cap, row_cap, tmp_cap;
    cf_batch batch;
} text_dl;

static void text_dl_free(void *ctx) {
    text_dl *t = ctx;
    if (!t) return;
    cf_text_corpus_free(t->c);
    cf_dataset_free(t->ds);
    cf_free(t->order);
    cf_free(t->cum);
    cf_free(t->x);
    cf_free(t->y);
    cf_free(t->idx);
    cf_free(t->pad);
    cf_free(t->tmp);
    cf_free(t);
}

static int64_t doc_len(const cf_text_corpus *c, int64_t d) {
    return c->offsets[d + 1] - c->offsets[d];
}

/* Rows of the global language-model batch and their count. */
static int64_t lm_global_rows(const cf_dl_options *opt, int world, cf_shard_mode mode) {
    return mode == CF_SHARD_PER_RANK ? (int64_t)opt->bs * world : opt->bs;
}

static void lm_shape(const text_dl *t, int64_t B, int64_t *bl, int64_t *n_gb, int64_t *last) {
    int64_t total = t->c->n_tokens;
    int64_t corpus = total > 0 ? (total - 1) / B * B : 0;
    int64_t sl = t->topt.seq_len;
    *bl = corpus / B;
    *n_gb = *bl / sl + (*bl % sl != 0);
    *last = *bl - (*n_gb - 1) * sl;
}

static int64_t clas_global_batches(int64_t n, int bs, bool drop_last) {
    return n / bs + ((!drop_last && n % bs) ? 1 : 0);
}

static int64_t text_len(void *ctx, const cf_dl_options *opt, int rank, int world,
                        cf_shard_mode mode) {
    (void)rank;
    text_dl *t = ctx;
    if (t->lm) {
        int64_t bl, n_gb, last;
        lm_shape(t, lm_global_rows(opt, world, mode), &bl, &n_gb, &last);
        return n_gb;
    }
    int64_t n_gb = clas_global_batches(t->c->n_docs, opt->bs, opt->drop_last);
    if (world > 1 && mode == CF_SHARD_PER_RANK) return (n_gb + world - 1) / world;
    return n_gb;
}

cf_status cf_text_epoch_order(int64_t n, bool shuffle, uint64_t seed, int epoch, int64_t *order) {
    if (n < 0 || (n > 0 && !order))
        return cf_fail(CF_ERR_INVALID, "cf_text_epoch_order: %lld items", (long long)n);
    for (int64_t i = 0; i < n; i++) order[i] = i;
    if (shuffle) {
        cf_rng rng;
        cf_rng_seed(&rng, seed + (uint64_t)(int64_t)epoch);
        cf_rng_shuffle(&rng, order, n);
    }
    return CF_OK;
}

/* Sorting by length, longest first, ties in the order given (Python's stable sorted with
 * reverse=True): pairs of (length, position). */
typedef struct len_pos {
    int64_t len, pos, item;
} len_pos;

static int by_len_desc(const void *a, const void *b) {
    const len_pos *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static void sort_desc(const cf_text_corpus *c, int64_t *items, int64_t n, len_pos *scratch) {
    for (int64_t i = 0; i < n; i++) scratch[i] = (len_pos){doc_len(c, items[i]), i, items[i]};
    qsort(scratch, (size_t)n, sizeof *scratch, by_len_desc);
    for (int64_t i = 0; i < n; i++) items[i] = scratch[i].item;
}

/* fastai's SortedDL order for one epoch into t->order (n documents). */
static cf_status clas_order(text_dl *t, const cf_dl_options *opt, int epoch) {
    const cf_text_corpus *c = t->c;
    int64_t n = c->n_docs, bs = opt->bs;
    len_pos *scratch = cf_malloc((size_t)(n ? n : 1) * sizeof *scratch);
    if (!scratch) return cf_fail(CF_ERR_NOMEM, "text loader: order of %lld texts", (long long)n);
    int64_t *o = t->order;
    for (int64_t i = 0; i < n; i++) o[i] = i;
    if (!opt->shuffle) {
        sort_desc(c, o, n, scratch);
        cf_free(scratch);
        return CF_OK;
    }
    cf_rng rng;
    cf_rng_seed(&rng, opt->seed + (uint64_t)(int64_t)epoch);
    cf_rng_shuffle(&rng, o, n);
    int64_t idx_max = 0; /* np.argmax: the first longest */
    for (int64_t i = 1; i < n; i++)
        if (doc_len(c, i) > doc_len(c, idx_max)) idx_max = i;
    for (int64_t p = 0; p < n; p++)
        if (o[p] == idx_max) {
            o[p] = o[0];
            o[0] = idx_max;
            break;
        }
    int64_t chunk = bs * 50;
    for (int64_t s = 0; s < n; s += chunk)
        sort_desc(c, o + s, n - s < chunk ? n - s : chunk, scratch);
    int64_t nb = (n + bs - 1) / bs;
    if (nb > 2) { /* the batches between the first and the last, permuted */
        int64_t m = nb - 2;
        int64_t *perm = cf_malloc((size_t)m * sizeof *perm);
        int64_t *copy = cf_malloc((size_t)(m * bs) * sizeof *copy);
        if (!perm || !copy) {
            cf_free(perm);
            cf_free(copy);
            cf_free(scratch);
            return cf_fail(CF_ERR_NOMEM, "text loader: %lld batches", (long long)nb);
        }
        for (int64_t i = 0; i < m; i++) perm[i] = i;
        cf_rng_shuffle(&rng, perm, m);
        memcpy(copy, o + bs, (size_t)(m * bs) * sizeof *copy);
        for (int64_t i = 0; i < m; i++)
            memcpy(o + bs + i * bs, copy + perm[i] * bs, (size_t)bs * sizeof *copy);
        cf_free(perm);
        cf_free(copy);
    }
    cf_free(scratch);
    return CF_OK;
}

static cf_status text_begin_epoch(void *ctx, const cf_dl_options *opt, int epoch, int rank,
                                  int world, cf_shard_mode mode, int64_t *n_batches) {
    text_dl *t = ctx;
    t->bs = opt->bs;
    t->rank = rank;
    t->world = world;
    t->mode = mode;
    cf_status st =
        cf_text_epoch_order(t->c->n_docs, t->lm && opt->shuffle, opt->seed, epoch, t->order);
    if (st != CF_OK) return st;
    if (t->lm) {
        t->B = lm_global_rows(opt, world, mode);
        lm_shape(t, t->B, &t->bl, &t->n_gb, &t->last_len);
        t->cum[0] = 0;
        for (int64_t k = 0; k < t->c->n_docs; k++)
            t->cum[k + 1] = t->cum[k] + doc_len(t->c, t->order[k]);
    } else {
        st = clas_order(t, opt, epoch);
        if (st != CF_OK) return st;
        t->n_gb = clas_global_batches(t->c->n_docs, opt->bs, opt->drop_last);
    }
    *n_batches = text_len(ctx, opt, rank, world, mode);
    return CF_OK;
}

/* Copies n tokens of the epoch's stream from position `at` into out. */
static cf_status stream_read(text_dl *t, int64_t at, int64_t n, int32_t *out) {
    int64_t lo = 0, hi = t->c->n_docs; /* the last k with cum[k] <= at */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (t->cum[mid] <= at)
            lo = mid;
        else
            hi = mid;
    }
    int64_t k = lo, from = at - t->cum[k];
    while (n > 0) {
        if (k >= t->c->n_docs)
            return cf_fail(CF_ERR_STATE, "text loader: stream position %lld past the corpus",
                           (long long)at);
        int64_t d = t->order[k], take = doc_len(t->c, d) - from;
        if (take > n) take = n;
        if (take > 0) {
            cf_status st = cf_text_corpus_read(t->c, d, from, take, out);
            if (st != CF_OK) return st;
            out += take;
            n -= take;
        }
        k++;
        from = 0;
    }
    return CF_OK;
}

static cf_status lm_make(text_dl *t, int64_t b, const cf_batch **out) {
    int64_t sl = b == t->n_gb - 1 ? t->last_len : t->topt.seq_len;
    int64_t r0 = t->rank * t->B / t->world, r1 = (t->rank + 1) * t->B / t->world;
    bool pad_row = r1 == r0;
    if (pad_row) {
        r0 = 0;
        r1 = 1;
    }
    int count = (int)(r1 - r0);
    for (int i = 0; i < count; i++) {
        int64_t j = r0 + i;
        cf_status st = stream_read(t, j * t->bl + b * t->topt.seq_len, sl + 1, t->tmp);
        if (st != CF_OK) return st;
        float *x = t->x + (size_t)i * (size_t)sl, *y = t->y + (size_t)i * (size_t)sl;
        for (int64_t k = 0; k < sl; k++) {
            x[k] = (float)t->tmp[k];
            y[k] = (float)t->tmp[k + 1];
        }
        t->idx[i] = b * t->B + j;
        t->pad[i] = pad_row;
    }
    cf_batch *bt = &t->batch;
    bt->x = cf_tensor_view(t->x, cf_shape2(count, (int)sl));
    bt->y = cf_tensor_view(t->y, cf_shape2(count, (int)sl));
    bt->idx = t->idx;
    bt->pad = t->pad;
    bt->size = count;
    bt->n_real = pad_row ? 0 : count;
    bt->global_size = (int)t->B;
    *out = bt;
    return CF_OK;
}

static cf_status clas_make(text_dl *t, int64_t b, const cf_batch **out) {
    const cf_text_corpus *c = t->c;
    int64_t g = b;
    bool all_pad = false;
    if (t->world > 1 && t->mode == CF_SHARD_PER_RANK) {
        g = b * t->world + t->rank;
        if (g >= t->n_gb) { /* wrap round so that every rank has as many batches */
            g %= t->n_gb;
            all_pad = true;
        }
    }
    int64_t g0 = g * t->bs, g1 = g0 + t->bs < c->n_docs ? g0 + t->bs : c->n_docs;
    int64_t B = g1 - g0, r0 = 0, r1 = B;
    bool pad_row = false;
    if (t->world > 1 && t->mode == CF_SHARD_SPLIT_BATCH) {
        r0 = t->rank * B / t->world;
        r1 = (t->rank + 1) * B / t->world;
        if (r1 == r0) {
            r0 = 0;
            r1 = 1;
            pad_row = true;
        }
    }
    int64_t M = 0; /* the global batch's length, so that slices equal one process's rows */
    for (int64_t i = g0; i < g1; i++)
        if (doc_len(c, t->order[i]) > M) M = doc_len(c, t->order[i]);
    int count = (int)(r1 - r0), td = c->target_dim, sl = t->topt.seq_len;
    float pad = (float)t->topt.pad_idx;
    for (int i = 0; i < count; i++) {
        int64_t d = t->order[g0 + r0 + i], n = doc_len(c, d), l = M - n;
        int64_t front = t->topt.pad_last ? 0 : l / sl * sl;
        float *x = t->x + (size_t)i * (size_t)M;
        cf_status st = cf_text_corpus_read(c, d, 0, n, t->tmp);
        if (st != CF_OK) return st;
        for (int64_t k = 0; k < front; k++) x[k] = pad;
        for (int64_t k = 0; k < n; k++) x[front + k] = (float)t->tmp[k];
        for (int64_t k = front + n; k < M; k++) x[k] = pad;
        memcpy(t->y + (size_t)i * td, c->targets + (size_t)d * td, (size_t)td * sizeof(float));
        t->idx[i] = d;
        t->pad[i] = all_pad || pad_row;
    }
    cf_batch *bt = &t->batch;
    bt->x = cf_tensor_view(t->x, cf_shape2(count, (int)M));
    bt->y = cf_tensor_view(t->y, td == 1 ? cf_shape1(count) : cf_shape2(count, td));
    bt->idx = t->idx;
    bt->pad = t->pad;
    bt->size = count;
    bt->n_real = all_pad || pad_row ? 0 : count;
    bt->global_size = t->world > 1 && t->mode == CF_SHARD_SPLIT_BATCH ? (int)B : bt->n_real;
    *out = bt;
    return CF_OK;
}

/* Batch buffers for the largest batch of this shard. */
static cf_status ensure_buffers(text_dl *t) {
    int64_t rows = t->lm ? (t->B + t->world - 1) / t->world : t->bs;
    if (rows < 1) rows = 1;
    int64_t cols = t->lm ? t->topt.seq_len : t->max_len;
    int64_t tmp = t->lm ? t->topt.seq_len + 1 : t->max_len;
    size_t x_need = (size_t)(rows * (cols > 0 ? cols : 1));
    size_t y_need =
        t->lm ? x_need : (size_t)rows * (size_t)(t->c->target_dim > 0 ? t->c->target_dim : 1);
    if (x_need > t->x_cap) {
        cf_free(t->x);
        if (!(t->x = cf_malloc(x_need * sizeof(float)))) return CF_ERR_NOMEM;
        t->x_cap = x_need;
    }
    if (y_need > t->y_cap) {
        cf_free(t->y);
        if (!(t->y = cf_malloc(y_need * sizeof(float)))) return CF_ERR_NOMEM;
        t->y_cap = y_need;
    }
    if ((size_t)rows > t->row_cap) {
        cf_free(t->idx);
        cf_free(t->pad);
        t->idx = cf_malloc((size_t)rows * sizeof(int64_t));
        t->pad = cf_malloc((size_t)rows * sizeof(bool));
        if (!t->idx || !t->pad) return CF_ERR_NOMEM;
        t->row_cap = (size_t)rows;
    }
    if ((size_t)tmp + 1 > t->tmp_cap) {
        cf_free(t->tmp);
        if (!(t->tmp = cf_malloc(((size_t)tmp + 1) * sizeof(int32_t)))) return CF_ERR_NOMEM;
        t->tmp_cap = (size_t)tmp + 1;
    }
    return CF_OK;
}

static cf_status text_make(void *ctx, int64_t b, const cf_batch **out) {
    text_dl *t = ctx;
    if (ensure_buffers(t) != CF_OK)
        return cf_fail(CF_ERR_NOMEM, "text loader: batch buffers of %d rows", t->bs);
    return t->lm ? lm_make(t, b, out) : clas_make(t, b, out);
}

static cf_status text_loader_new(cf_text_corpus *c, bool lm, const cf_dl_options *opt,
                                 const cf_text_dl_options *topt, cf_dataloader **out);

static cf_status text_new_like(void *ctx, const cf_dl_options *opt, cf_dataloader **out) {
    text_dl *t = ctx;
    return text_loader_new(t->c, t->lm, opt, &t->topt, out);
}

static const cf__batch_ops text_ops = {
    .len = text_len,
    .begin_epoch = text_begin_epoch,
    .make = text_make,
    .new_like = text_new_like,
    .free = text_dl_free,
};

static cf_status text_loader_new(cf_text_corpus *c, bool lm, const cf_dl_options *opt,
                                 const cf_text_dl_options *topt, cf_dataloader **out) {
    const char *what = lm ? "cf_text_lm_loader_new" : "cf_text_clas_loader_new";
    if (!out) return cf_fail(CF_ERR_INVALID, "%s: out is NULL", what);
    *out = NULL;
    if (!c) return cf_fail(CF_ERR_INVALID, "%s: corpus is NULL", what);
    cf_dl_options o = opt ? *opt : (cf_dl_options){0};
    cf_text_dl_options to = topt ? *topt : (cf_text_dl_options){0};
    if (o.bs == 0) o.bs = 64;
    if (to.seq_len == 0) to.seq_len = 72;
    if (!topt) to.pad_idx = CF_TEXT_PAD;
    if (o.bs < 0 || o.bs > (1 << 20))
        return cf_fail(CF_ERR_INVALID, "%s: batch size %d outside [1, 2^20]", what, o.bs);
    if (to.seq_len < 1 || to.seq_len > (1 << 20))
        return cf_fail(CF_ERR_INVALID, "%s: seq_len %d outside [1, 2^20]", what, to.seq_len);
    if (to.pad_idx < 0 || to.pad_idx >= c->vocab_size)
        return cf_fail(CF_ERR_INVALID, "%s: pad_idx %d outside the vocabulary of %d", what,
                       to.pad_idx, (int)c->vocab_size);
    if (!lm && c->target_dim == 0)
        return cf_fail(CF_ERR_INVALID, "%s: %s has no labels", what,
                       c->source ? c->source : "the corpus");
    text_dl *t = cf_calloc(1, sizeof *t);
    if (!t) return cf_fail(CF_ERR_NOMEM, "%s", what);
    cf__text_corpus_retain(c);
    t->c = c;
    t->lm = lm;
    t->topt = to;
    t->world = 1;
    for (int64_t d = 0; d < c->n_docs; d++)
        if (doc_len(c, d) > t->max_len) t->max_len = doc_len(c, d);
    t->order = cf_malloc((size_t)(c->n_docs + 1) * sizeof(int64_t));
    t->cum = lm ? cf_malloc((size_t)(c->n_docs + 1) * sizeof(int64_t)) : NULL;
    t->ds = cf_calloc(1, sizeof *t->ds);
    bool ok = t->order && (!lm || t->cum) && t->ds;
    if (ok) {
        cf_dataset *ds = t->ds;
        ds->n = c->n_docs;
        ds->sample_shape = cf_shape1(to.seq_len);
        ds->target_dim = lm || c->target_dim == 0 ? 1 : c->target_dim;
        if (!lm && c->n_classes > 0) {
            ds->vocab = cf__strv_dup((const char *const *)c->classes, c->n_classes);
            ds->n_classes = ds->vocab ? c->n_classes : 0;
            ok = ds->vocab != NULL;
        }
        if (ok && c->source) ok = cf__dataset_set_source(ds, c->source);
    }
    if (!ok) {
        text_dl_free(t);
        return cf_fail(CF_ERR_NOMEM, "%s: %lld documents", what, (long long)c->n_docs);
    }
    return cf__dataloader_new_ops(t->ds, &o, &text_ops, t, out);
}

cf_status cf_text_lm_loader_new(cf_text_corpus *c, const cf_dl_options *opt,
                                const cf_text_dl_options *topt, cf_dataloader **out) {
    return text_loader_new(c, true, opt, topt, out);
}

cf_status cf_text_clas_loader_new(cf_text_corpus *c, const cf_dl_options *opt,
                                  const cf_text_dl_options *topt, cf_dataloader **out) {
    return text_loader_new(c, false, opt, topt, out);
}

const cf_text_corpus *cf_text_loader_corpus(const cf_dataloader *dl) {
    text_dl *t = cf__dataloader_ops_ctx(dl, &text_ops);
    return t ? t->c : NULL;
}

bool cf_text_loader_is_lm(const cf_dataloader *dl) {
    text_dl *t = cf__dataloader_ops_ctx(dl, &text_ops);
    return t && t->lm;
}

/* ---- DataLoaders --------------------------------------------------------------------------- */

/* A descriptor of the corpus for cf_dls (the learner reads n, classes, target_dim). */
static cf_dataset *describe(const cf_text_corpus *c, const cf_text_dls_options *o) {
    cf_dataset *ds = cf_calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->n = c->n_docs;
    ds->sample_shape = cf_shape1(o->seq_len ? o->seq_len : 72);
    ds->target_dim = o->is_lm || c->target_dim == 0 ? 1 : c->target_dim;
    if (!o->is_lm && c->n_classes > 0) {
        if (!(ds->vocab = cf__strv_dup((const char *const *)c->classes, c->n_classes))) {
            cf_dataset_free(ds);
            return NULL;
        }
        ds->n_classes = c->n_classes;
    }
    if (c->source && !cf__dataset_set_source(ds, c->source)) {
        cf_dataset_free(ds);
        return NULL;
    }
    return ds;
}

cf_status cf_text_dls_new(cf_text_corpus *train, cf_text_corpus *valid,
                          const cf_text_dls_options *opt, cf_dls **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_text_dls_new: out is NULL");
    *out = NULL;
    if (!train) return cf_fail(CF_ERR_INVALID, "cf_text_dls_new: no training corpus");
    cf_text_dls_options o = opt ? *opt : (cf_text_dls_options){0};
    if (o.bs == 0) o.bs = 64;
    if (o.val_bs == 0) o.val_bs = o.bs;
    if (o.seq_len == 0) o.seq_len = 72;
    if (valid && !o.is_lm && valid->n_classes != train->n_classes)
        return cf_fail(CF_ERR_INVALID,
                       "cf_text_dls_new: the validation corpus has %d classes, training %d",
                       valid->n_classes, train->n_classes);
    cf_dls *dls = cf_calloc(1, sizeof *dls);
    if (!dls) return cf_fail(CF_ERR_NOMEM, "cf_text_dls_new");
    cf_text_dl_options to = {.seq_len = o.seq_len, .pad_idx = CF_TEXT_PAD};
    cf_dl_options tr = {
        .bs = o.bs, .shuffle = true, .drop_last = true, .seed = o.seed, .prefetch = o.prefetch};
    cf_dl_options va = {.bs = o.val_bs, .seed = o.seed, .prefetch = o.prefetch};
    cf_status st = CF_OK;
    if (!(dls->train_ds = describe(train, &o)) || (valid && !(dls->valid_ds = describe(valid, &o))))
        st = cf_fail(CF_ERR_NOMEM, "cf_text_dls_new");
    if (st == CF_OK) st = text_loader_new(train, o.is_lm, &tr, &to, &dls->train);
    if (st == CF_OK && valid) st = text_loader_new(valid, o.is_lm, &va, &to, &dls->valid);
    if (st != CF_OK) {
        cf_dls_free(dls);
        return st;
    }
    *out = dls;
    return CF_OK;
}
