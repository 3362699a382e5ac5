/* DataLoader: per-epoch order (shuffle, sharding), batches assembled into a preallocated ring of
 * buffers by a per-epoch background thread, augmentation and normalisation on the fly.
 *
 * Thread model (fork safety): the prefetch thread is created by the first cf_dataloader_next of
 * an epoch and joined when the epoch's batches are exhausted, at the next begin_epoch, and in
 * free; no loader thread outlives an epoch. A process forked mid-epoch detects the new pid on
 * its next call, re-initialises the lock and condition variables (the parent's thread does not
 * exist in the child) and restarts production at the batch it has reached. Batches are a pure
 * function of (seed, epoch, shard, position), so the restart changes nothing. */
#include "data_internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct slot {
    float *x, *y;
    int64_t *idx;
    bool *pad;
    cf_batch batch;
    /* streamed sets: the batch this slot holds, samples still being decoded, whether it is
     * complete, samples found bad (skip_bad) and the first failure (by sample position) */
    int64_t batch_no;
    int remaining;
    bool ready;
    bool *bad;
    cf_status st;
    int err_item;
    char err[1024];
} slot;

typedef struct cf_dataloader cf_dataloader;
typedef struct decoder_arg {
    cf_dataloader *dl;
    int index;
} decoder_arg;

struct cf_dataloader {
    const cf_dataset *ds;
    cf_dl_options opt;
    size_t per; /* floats per sample */
    int td;
    bool image;      /* sample_shape (C, H, W) */
    cf_aug_opts aug; /* batch transforms (opt.aug points here) */
    float scale[4], shift[4];
    /* requested shard (applies at begin_epoch) and the shard of the running epoch */
    int rank, world;
    cf_shard_mode mode;
    int e_rank, e_world;
    cf_shard_mode e_mode;
    int epoch;
    bool in_epoch;
    int64_t *order; /* this epoch's sample list: PER_RANK the rank's chunk, SPLIT the whole perm */
    bool *order_pad;
    int64_t order_cap, n_order, n_batches, next_b;
    int nslots;
    slot *slots;
    /* producer thread */
    pthread_mutex_t mu;
    pthread_cond_t cv_prod, cv_cons;
    pthread_t thread;
    bool threaded, thread_running, stop;
    int64_t produced, released;
    pid_t pid;
    /* streamed sets: decoding threads (per epoch), their scratch images, the next sample to
     * claim (batch, position in it) and the samples left out so far */
    struct cf_image_files *files;
    pthread_t *decoders;
    decoder_arg *decoder_args;
    int n_decoders, n_scratch;
    float **scratch;
    int64_t claim_b;
    int claim_i;
    int64_t skipped;
    /* batches made by other producers (text): their operations and state, or NULL */
    const cf__batch_ops *ops;
    void *ops_ctx;
};

static int64_t batches_for(int64_t n, int bs, bool drop_last) {
    return n / bs + ((!drop_last && n % bs) ? 1 : 0);
}

/* Length of this rank's sample list for the given shard. */
static int64_t chunk_len(int64_t n, int world, cf_shard_mode mode) {
    if (world <= 1 || mode == CF_SHARD_SPLIT_BATCH) return n;
    int64_t total = (n + world - 1) / world * world;
    return total / world;
}

int64_t cf_dataloader_len(const cf_dataloader *dl) {
    if (!dl) return 0;
    if (dl->ops) return dl->ops->len(dl->ops_ctx, &dl->opt, dl->rank, dl->world, dl->mode);
    return batches_for(chunk_len(dl->ds->n, dl->world, dl->mode), dl->opt.bs, dl->opt.drop_last);
}

const cf_dataset *cf_dataloader_dataset(const cf_dataloader *dl) {
    return dl ? dl->ds : NULL;
}
const cf_dl_options *cf_dataloader_options(const cf_dataloader *dl) {
    return dl ? &dl->opt : NULL;
}

static void set_norm_factors(cf_dataloader *dl) {
    const cf_dl_options *o = &dl->opt;
    for (int c = 0; c < 4; c++) {
        int k = o->n_norm == 1 ? 0 : c;
        dl->scale[c] = o->n_norm ? 1.0f / o->std[k] : 1.0f;
        dl->shift[c] = o->n_norm ? -o->mean[k] / o->std[k] : 0.0f;
    }
}

cf_status cf_dataloader_set_normalize(cf_dataloader *dl, int n_norm, const float *mean,
                                      const float *std) {
    if (!dl) return cf_fail(CF_ERR_INVALID, "cf_dataloader_set_normalize: loader is NULL");
    if (dl->in_epoch)
        return cf_fail(CF_ERR_STATE, "cf_dataloader_set_normalize: an epoch is running");
    int channels = dl->image ? dl->ds->sample_shape.dim[0] : 1;
    if (n_norm < 0 || n_norm > 4 || (n_norm > 1 && n_norm != channels) ||
        (n_norm > 0 && (!mean || !std)))
        return cf_fail(CF_ERR_INVALID,
                       "cf_dataloader_set_normalize: %d channels for samples with %d channels",
                       n_norm, channels);
    for (int c = 0; c < n_norm; c++)
        if (!(std[c] > 0) || mean[c] != mean[c])
            return cf_fail(CF_ERR_INVALID, "cf_dataloader_set_normalize: std[%d] = %g", c,
                           (double)std[c]);
    dl->opt.n_norm = n_norm;
    for (int c = 0; c < 4; c++) {
        dl->opt.mean[c] = c < n_norm ? mean[c] : 0.0f;
        dl->opt.std[c] = c < n_norm ? std[c] : 0.0f;
    }
    set_norm_factors(dl);
    return CF_OK;
}

static void free_slots(cf_dataloader *dl) {
    for (int i = 0; i < dl->n_scratch; i++) cf_free(dl->scratch[i]);
    cf_free(dl->scratch);
    cf_free(dl->decoders);
    cf_free(dl->decoder_args);
    dl->scratch = NULL;
    dl->n_scratch = 0;
    if (!dl->slots) return;
    for (int i = 0; i < dl->nslots; i++) {
        cf_free(dl->slots[i].bad);
        cf_free(dl->slots[i].x);
        cf_free(dl->slots[i].y);
        cf_free(dl->slots[i].idx);
        cf_free(dl->slots[i].pad);
    }
    cf_free(dl->slots);
    dl->slots = NULL;
}

/* At least n scratch images for decoding (one per decoding thread). */
static bool ensure_scratch(cf_dataloader *dl, int n) {
    if (n <= dl->n_scratch) return true;
    float **v = cf_calloc((size_t)n, sizeof *v);
    pthread_t *t = cf_calloc((size_t)n, sizeof *t);
    decoder_arg *a = cf_calloc((size_t)n, sizeof *a);
    if (!v || !t || !a) {
        cf_free(v);
        cf_free(t);
        cf_free(a);
        return false;
    }
    for (int i = 0; i < dl->n_scratch; i++) v[i] = dl->scratch[i];
    for (int i = dl->n_scratch; i < n; i++)
        if (!(v[i] = cf_malloc(dl->per * sizeof(float)))) {
            for (int k = dl->n_scratch; k < i; k++) cf_free(v[k]);
            cf_free(v);
            cf_free(t);
            cf_free(a);
            return false;
        }
    cf_free(dl->scratch);
    cf_free(dl->decoders);
    cf_free(dl->decoder_args);
    dl->scratch = v;
    dl->decoders = t;
    dl->decoder_args = a;
    dl->n_scratch = n;
    return true;
}

/* What the batch buffers of a loader take: inputs, targets, indices, padding and bad flags. */
static double dl_nslots_bytes(int bs, int64_t per, int64_t td, int nslots) {
    return (double)nslots * (double)bs *
           ((double)per * sizeof(float) + (double)td * sizeof(float) + sizeof(int64_t) + 2.0);
}

/* The widest mask the loaders move (one row is copied through the stack). */
#define CF_MASK_MAX_W 4096

cf_status cf_dataloader_new(const cf_dataset *ds, const cf_dl_options *opt, cf_dataloader **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_dataloader_new: out is NULL");
    *out = NULL;
    if (!ds) return cf_fail(CF_ERR_INVALID, "cf_dataloader_new: dataset is NULL");
    cf_dl_options o = opt ? *opt : (cf_dl_options){0};
    if (o.bs == 0) o.bs = 64;
    if (o.prefetch == 0) o.prefetch = 3;
    if (o.prefetch > 0 && o.prefetch < 2) o.prefetch = 2;
    if (o.bs < 0 || o.bs > (1 << 20))
        return cf_fail(CF_ERR_INVALID, "cf_dataloader_new: batch size %d outside [1, 2^20]", o.bs);
    if (o.prefetch > 64)
        return cf_fail(CF_ERR_INVALID, "cf_dataloader_new: prefetch %d above 64", o.prefetch);
    bool image = ds->sample_shape.ndim == 3;
    int channels = image ? ds->sample_shape.dim[0] : 1;
    if ((o.crop_pad || o.flip || o.mirror || o.aug) && !image)
        return cf_fail(CF_ERR_INVALID,
                       "cf_dataloader_new: crop/flip augmentation needs an image dataset (C, H, "
                       "W), %s has %d dims",
                       ds->source ? ds->source : "dataset", ds->sample_shape.ndim);
    if (o.aug && ds->n_points > 0)
        return cf_fail(CF_ERR_UNSUPPORTED,
                       "cf_dataloader_new: %s holds points, which the affine batch transforms "
                       "would not move (use flip and crop_pad)",
                       ds->source ? ds->source : "dataset");
    if (ds->masks && image && ds->sample_shape.dim[2] > CF_MASK_MAX_W)
        return cf_fail(CF_ERR_UNSUPPORTED, "cf_dataloader_new: masks wider than %d pixels",
                       CF_MASK_MAX_W);
    if (o.aug && ds->masks)
        return cf_fail(CF_ERR_UNSUPPORTED,
                       "cf_dataloader_new: %s holds segmentation masks; the affine batch "
                       "transforms are not applied to masks (use flip and crop_pad)",
                       ds->source ? ds->source : "dataset");
    if (o.crop_pad < 0 || o.crop_pad > 1024)
        return cf_fail(CF_ERR_INVALID, "cf_dataloader_new: crop_pad %d outside [0, 1024]",
                       o.crop_pad);
    if (o.n_norm < 0 || o.n_norm > 4 || (o.n_norm > 1 && o.n_norm != channels))
        return cf_fail(CF_ERR_INVALID,
                       "cf_dataloader_new: %d normalisation channels for samples with %d "
                       "channels",
                       o.n_norm, channels);
    for (int c = 0; c < o.n_norm; c++)
        if (!(o.std[c] > 0) || o.mean[c] != o.mean[c])
            return cf_fail(CF_ERR_INVALID, "cf_dataloader_new: normalisation std[%d] = %g", c,
                           (double)o.std[c]);

    cf_dataloader *dl = cf_calloc(1, sizeof *dl);
    if (!dl) return CF_ERR_NOMEM;
    dl->ds = ds;
    dl->opt = o;
    if (o.aug) {
        dl->aug = *o.aug;
        dl->opt.aug = &dl->aug;
    }
    dl->per = cf_shape_numel(&ds->sample_shape);
    dl->td = ds->target_dim;
    dl->image = image;
    set_norm_factors(dl);
    dl->world = 1;
    dl->mode = CF_SHARD_PER_RANK;
    dl->threaded = o.prefetch > 0;
    dl->nslots = o.prefetch > 0 ? o.prefetch + 1 : 1;
    dl->pid = getpid();
    pthread_mutex_init(&dl->mu, NULL);
    pthread_cond_init(&dl->cv_prod, NULL);
    pthread_cond_init(&dl->cv_cons, NULL);
    dl->slots = cf_calloc((size_t)dl->nslots, sizeof(slot));
    bool ok = dl->slots != NULL;
    for (int i = 0; ok && i < dl->nslots; i++) {
        slot *s = &dl->slots[i];
        s->x = cf_malloc((size_t)o.bs * dl->per * sizeof(float));
        s->y = cf_malloc((size_t)o.bs * (size_t)dl->td * sizeof(float));
        s->idx = cf_malloc((size_t)o.bs * sizeof(int64_t));
        s->pad = cf_malloc((size_t)o.bs * sizeof(bool));
        s->bad = cf_calloc((size_t)o.bs, sizeof(bool));
        ok = s->x && s->y && s->idx && s->pad && s->bad;
    }
    dl->files = ds->files;
    if (ok && dl->files && !ds->x) ok = ensure_scratch(dl, 1);
    if (!ok) {
        const int nslots = dl->nslots;
        const int64_t per = (int64_t)dl->per, td = (int64_t)dl->td;
        cf_dataloader_free(dl);
        const double mb = (double)dl_nslots_bytes(o.bs, per, td, nslots) / 1e6;
        return cf_fail(CF_ERR_NOMEM,
                       "cf_dataloader_new: out of memory for %d batch buffer%s of %d samples of "
                       "%lld values (%.1f MB)",
                       nslots, nslots == 1 ? "" : "s", o.bs, (long long)per, mb);
    }
    *out = dl;
    return CF_OK;
}

cf_status cf__dataloader_new_ops(const cf_dataset *ds, const cf_dl_options *opt,
                                 const cf__batch_ops *ops, void *ctx, cf_dataloader **out) {
    *out = NULL;
    cf_dataloader *dl = cf_calloc(1, sizeof *dl);
    if (!dl) {
        ops->free(ctx);
        return cf_fail(CF_ERR_NOMEM, "cf_dataloader_new");
    }
    dl->ds = ds;
    dl->opt = *opt;
    dl->ops = ops;
    dl->ops_ctx = ctx;
    dl->world = 1;
    dl->mode = CF_SHARD_PER_RANK;
    dl->pid = getpid();
    pthread_mutex_init(&dl->mu, NULL);
    pthread_cond_init(&dl->cv_prod, NULL);
    pthread_cond_init(&dl->cv_cons, NULL);
    *out = dl;
    return CF_OK;
}

void *cf__dataloader_ops_ctx(const cf_dataloader *dl, const cf__batch_ops *ops) {
    return dl && dl->ops == ops ? dl->ops_ctx : NULL;
}

cf_status cf_dataloader_new_like(const cf_dataloader *like, const cf_dl_options *opt,
                                 cf_dataloader **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_dataloader_new_like: out is NULL");
    *out = NULL;
    if (!like) return cf_fail(CF_ERR_INVALID, "cf_dataloader_new_like: loader is NULL");
    if (like->ops) return like->ops->new_like(like->ops_ctx, opt ? opt : &like->opt, out);
    return cf_dataloader_new(like->ds, opt ? opt : &like->opt, out);
}

/* A process forked mid-epoch has no producer thread: reset the synchronisation state. */
static void after_fork_check(cf_dataloader *dl) {
    pid_t now = getpid();
    if (now == dl->pid) return;
    dl->pid = now;
    pthread_mutex_init(&dl->mu, NULL);
    pthread_cond_init(&dl->cv_prod, NULL);
    pthread_cond_init(&dl->cv_cons, NULL);
    dl->thread_running = false;
    dl->n_decoders = 0; /* the parent's decoding threads do not exist here */
    dl->stop = false;
    dl->produced = dl->released = dl->next_b;
}

static void stop_thread(cf_dataloader *dl) {
    if (!dl->thread_running) return;
    pthread_mutex_lock(&dl->mu);
    dl->stop = true;
    pthread_cond_broadcast(&dl->cv_prod);
    pthread_mutex_unlock(&dl->mu);
    if (dl->n_decoders > 0)
        for (int i = 0; i < dl->n_decoders; i++) pthread_join(dl->decoders[i], NULL);
    else
        pthread_join(dl->thread, NULL);
    dl->n_decoders = 0;
    dl->thread_running = false;
    dl->stop = false;
}

void cf_dataloader_free(cf_dataloader *dl) {
    if (!dl) return;
    after_fork_check(dl);
    stop_thread(dl);
    if (dl->ops) dl->ops->free(dl->ops_ctx);
    free_slots(dl);
    cf_free(dl->order);
    cf_free(dl->order_pad);
    pthread_mutex_destroy(&dl->mu);
    pthread_cond_destroy(&dl->cv_prod);
    pthread_cond_destroy(&dl->cv_cons);
    cf_free(dl);
}

cf_status cf_dataloader_set_shard(cf_dataloader *dl, int rank, int world, cf_shard_mode mode) {
    if (!dl) return cf_fail(CF_ERR_INVALID, "cf_dataloader_set_shard: loader is NULL");
    if (world < 1 || rank < 0 || rank >= world ||
        (mode != CF_SHARD_PER_RANK && mode != CF_SHARD_SPLIT_BATCH))
        return cf_fail(CF_ERR_INVALID, "cf_dataloader_set_shard: rank %d, world %d, mode %d", rank,
                       world, (int)mode);
    dl->rank = rank;
    dl->world = world;
    dl->mode = mode;
    return CF_OK;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

cf_status cf_dataloader_begin_epoch(cf_dataloader *dl, int epoch) {
    if (!dl) return cf_fail(CF_ERR_INVALID, "cf_dataloader_begin_epoch: loader is NULL");
    after_fork_check(dl);
    stop_thread(dl);
    if (dl->ops) {
        int64_t nb = 0;
        cf_status st =
            dl->ops->begin_epoch(dl->ops_ctx, &dl->opt, epoch, dl->rank, dl->world, dl->mode, &nb);
        dl->in_epoch = st == CF_OK;
        dl->epoch = epoch;
        dl->n_batches = nb;
        dl->next_b = dl->produced = dl->released = 0;
        return st;
    }
    int64_t n = dl->ds->n;
    int world = dl->world, rank = dl->rank;
    cf_shard_mode mode = dl->mode;
    int64_t total = world > 1 && mode == CF_SHARD_PER_RANK ? (n + world - 1) / world * world : n;
    int64_t cap = total > n ? total : n;
    if (cap > dl->order_cap) {
        int64_t *order = cf_malloc((size_t)(cap > 0 ? cap : 1) * sizeof(int64_t));
        bool *pad = cf_malloc((size_t)(cap > 0 ? cap : 1) * sizeof(bool));
        if (!order || !pad) {
            cf_free(order);
            cf_free(pad);
            return cf_fail_context(CF_ERR_NOMEM, "cf_dataloader_begin_epoch");
        }
        cf_free(dl->order);
        cf_free(dl->order_pad);
        dl->order = order;
        dl->order_pad = pad;
        dl->order_cap = cap;
    }
    /* The whole (padded) permutation, then this rank's contiguous chunk moved to the front. */
    int64_t *perm = dl->order;
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    if (dl->opt.shuffle) {
        cf_rng rng;
        cf_rng_seed(&rng, dl->opt.seed + (uint64_t)(int64_t)epoch);
        cf_rng_shuffle(&rng, perm, n);
    }
    for (int64_t i = 0; i < total; i++) dl->order_pad[i] = i >= n;
    for (int64_t i = n; i < total; i++) perm[i] = perm[i % n];
    if (world > 1 && mode == CF_SHARD_PER_RANK) {
        int64_t len = total / world, start = (int64_t)rank * len;
        memmove(perm, perm + start, (size_t)len * sizeof(int64_t));
        memmove(dl->order_pad, dl->order_pad + start, (size_t)len * sizeof(bool));
        dl->n_order = len;
    } else {
        dl->n_order = n;
    }
    dl->e_rank = rank;
    dl->e_world = world;
    dl->e_mode = mode;
    dl->epoch = epoch;
    dl->n_batches = batches_for(dl->n_order, dl->opt.bs, dl->opt.drop_last);
    dl->next_b = dl->produced = dl->released = 0;
    dl->in_epoch = true;
    return CF_OK;
}

cf_status cf_dataloader_seek(cf_dataloader *dl, int64_t batch) {
    if (!dl) return cf_fail(CF_ERR_INVALID, "cf_dataloader_seek: loader is NULL");
    after_fork_check(dl);
    if (!dl->in_epoch || dl->next_b != 0 || dl->thread_running)
        return cf_fail(CF_ERR_STATE, "cf_dataloader_seek: only right after "
                                     "cf_dataloader_begin_epoch");
    if (batch < 0 || batch > dl->n_batches)
        return cf_fail(CF_ERR_INVALID, "cf_dataloader_seek: batch %lld of an epoch of %lld",
                       (long long)batch, (long long)dl->n_batches);
    dl->next_b = dl->produced = dl->released = batch;
    return CF_OK;
}

/* The random crop's shift and the flip of sample src this epoch. Augmentation draws depend
 * only on (seed, epoch, sample index). */
static void draw_crop_flip(const cf_dataloader *dl, int64_t src, int *dx, int *dy, bool *flip) {
    int p = dl->opt.crop_pad, ox = p, oy = p;
    *flip = false;
    if (p > 0 || dl->opt.flip) {
        cf_rng rng;
        cf_rng_seed(&rng, mix64(dl->opt.seed ^ mix64((uint64_t)(int64_t)dl->epoch + 0x9e37u) ^
                                mix64((uint64_t)src * 0xd1b54a32d192ed03ULL + 1)));
        if (p > 0) {
            ox = (int)cf_rng_below(&rng, (uint64_t)(2 * p + 1));
            oy = (int)cf_rng_below(&rng, (uint64_t)(2 * p + 1));
        }
        if (dl->opt.flip) *flip = (cf_rng_next(&rng) >> 63) != 0;
    }
    if (dl->opt.mirror) *flip = true;
    *dx = ox - p;
    *dy = oy - p;
}

/* A point set's targets move with its images: out(x') = in(x' + dx) puts a point at x - dx,
 * then the flip (pixel i to W - 1 - i, so a position x in pixel units, centres at i + 0.5, to
 * W - x) maps it to -x in PointScaler's -1..1 units. */
static void move_points(const cf_dataloader *dl, int64_t src, float *y) {
    int dx, dy;
    bool flip;
    draw_crop_flip(dl, src, &dx, &dy, &flip);
    const float W = (float)dl->ds->sample_shape.dim[2], H = (float)dl->ds->sample_shape.dim[1];
    for (int k = 0; k < dl->ds->n_points; k++) {
        y[2 * k] -= 2.0f * (float)dx / W;
        y[2 * k + 1] -= 2.0f * (float)dy / H;
        if (flip) cf_points_flip_lr(y + 2 * k, 1);
    }
}

/* A mask moves with its image: the same crop offset and flip as make_sample, class 0
 * (background) where the crop reaches past the edge. In place: rows are visited in the order
 * that reads each source row before it is overwritten. */
static void move_mask(const cf_dataloader *dl, int64_t src, float *y) {
    int dx, dy;
    bool flip;
    draw_crop_flip(dl, src, &dx, &dy, &flip);
    if (dx == 0 && dy == 0 && !flip) return;
    const int H = dl->ds->sample_shape.dim[1], W = dl->ds->sample_shape.dim[2];
    float row[CF_MASK_MAX_W];
    for (int k = 0; k < H; k++) {
        const int r = dy >= 0 ? k : H - 1 - k, sy = r + dy;
        float *out = y + (size_t)r * W;
        if (sy < 0 || sy >= H) {
            memset(out, 0, (size_t)W * sizeof(float));
            continue;
        }
        memcpy(row, y + (size_t)sy * W, (size_t)W * sizeof(float));
        for (int xo = 0; xo < W; xo++) {
            const int sx = (flip ? W - 1 - xo : xo) + dx;
            out[xo] = sx >= 0 && sx < W ? row[sx] : 0.0f;
        }
    }
}

/* Writes sample `src` of the dataset, whose pixels are x, into dst with augmentation and
 * normalisation. */
static void make_sample(const cf_dataloader *dl, int64_t src, const float *x, float *dst) {
    if (!dl->image) {
        float a = dl->scale[0], b = dl->shift[0];
        if (dl->opt.n_norm)
            for (size_t i = 0; i < dl->per; i++) dst[i] = x[i] * a + b;
        else
            memcpy(dst, x, dl->per * sizeof(float));
        return;
    }
    int C = dl->ds->sample_shape.dim[0], H = dl->ds->sample_shape.dim[1],
        W = dl->ds->sample_shape.dim[2];
    if (dl->opt.aug) { /* fastai's batch transforms, then normalisation */
        cf_aug_params prm;
        cf_aug_draw(dl->opt.aug, dl->opt.seed, dl->epoch, src, H, W, &prm);
        cf_aug_apply(&prm, dl->opt.aug->pad_mode, x, C, H, W, dst);
        for (int c = 0; c < C && dl->opt.n_norm; c++)
            for (size_t i = (size_t)c * H * W; i < (size_t)(c + 1) * H * W; i++)
                dst[i] = dst[i] * dl->scale[c] + dl->shift[c];
        return;
    }
    int dx, dy;
    bool flip;
    draw_crop_flip(dl, src, &dx, &dy, &flip); /* out(y, x) = in(y + dy, x' + dx), x' = flipped x */
    for (int c = 0; c < C; c++) {
        const float a = dl->scale[c], b = dl->shift[c];
        const float *in = x + (size_t)c * H * W;
        float *out = dst + (size_t)c * H * W;
        if (dx == 0 && dy == 0 && !flip) {
            for (int i = 0; i < H * W; i++) out[i] = in[i] * a + b;
            continue;
        }
        for (int y = 0; y < H; y++) {
            float *orow = out + (size_t)y * W;
            int sy = y + dy;
            if (sy < 0 || sy >= H) {
                for (int i = 0; i < W; i++) orow[i] = b;
                continue;
            }
            const float *irow = in + (size_t)sy * W;
            for (int xo = 0; xo < W; xo++) {
                int sx = (flip ? W - 1 - xo : xo) + dx;
                orow[xo] = (sx >= 0 && sx < W) ? irow[sx] * a + b : b;
            }
        }
    }
}

/* Sets up batch b of the current epoch in slot s: which samples, their targets and flags; the
 * samples themselves are made by the caller. */
static void setup_batch(cf_dataloader *dl, int64_t b, slot *s) {
    int bs = dl->opt.bs;
    int64_t start, count;
    bool pad_slice = false;
    int global = 0;
    if (dl->e_world > 1 && dl->e_mode == CF_SHARD_SPLIT_BATCH) {
        int64_t g0 = b * bs, B = dl->n_order - g0 < bs ? dl->n_order - g0 : bs;
        int64_t r = dl->e_rank, w = dl->e_world;
        start = g0 + r * B / w;
        count = g0 + (r + 1) * B / w - start;
        global = (int)B;
        if (count == 0) { /* one padding row: the global batch's first sample */
            start = g0;
            count = 1;
            pad_slice = true;
        }
    } else {
        start = b * bs;
        count = dl->n_order - start < bs ? dl->n_order - start : bs;
    }
    int n_real = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t src = dl->order[start + i];
        bool pad = pad_slice || dl->order_pad[start + i];
        s->idx[i] = src;
        s->pad[i] = pad;
        n_real += !pad;
        memcpy(s->y + (size_t)i * dl->td, dl->ds->y + (size_t)src * dl->td,
               (size_t)dl->td * sizeof(float));
        if (dl->ds->n_points > 0 && dl->image &&
            (dl->opt.flip || dl->opt.mirror || dl->opt.crop_pad > 0))
            move_points(dl, src, s->y + (size_t)i * dl->td);
        if (dl->ds->masks && dl->image && (dl->opt.flip || dl->opt.mirror || dl->opt.crop_pad > 0))
            move_mask(dl, src, s->y + (size_t)i * dl->td);
    }
    cf_batch *bt = &s->batch;
    const cf_shape *ss = &dl->ds->sample_shape;
    bt->x.data = s->x;
    bt->x.shape.ndim = ss->ndim + 1;
    bt->x.shape.dim[0] = (int)count;
    for (int d = 0; d < ss->ndim; d++) bt->x.shape.dim[d + 1] = ss->dim[d];
    bt->y.data = s->y;
    bt->y.shape = dl->td == 1 ? cf_shape1((int)count) : cf_shape2((int)count, dl->td);
    if (dl->ds->masks && dl->image) /* (N, H, W), the shape CrossEntropyLossFlat(axis=1) takes */
        bt->y.shape = cf_shape_make(3, (int[]){(int)count, ss->dim[1], ss->dim[2]});
    bt->idx = s->idx;
    bt->pad = s->pad;
    bt->size = (int)count;
    bt->n_real = n_real;
    bt->global_size = global ? global : n_real;
    s->batch_no = b;
    s->remaining = (int)count;
    s->ready = false;
    s->st = CF_OK;
    s->err_item = INT_MAX;
    memset(s->bad, 0, (size_t)count * sizeof(bool));
}

/* Assembles batch b of an in-memory set into slot s. */
static void fill_batch(cf_dataloader *dl, int64_t b, slot *s) {
    setup_batch(dl, b, s);
    for (int i = 0; i < s->batch.size; i++) {
        int64_t src = s->idx[i];
        make_sample(dl, src, dl->ds->x + (size_t)src * dl->per, s->x + (size_t)i * dl->per);
    }
    s->remaining = 0;
    s->ready = true;
}

/* Decodes sample i of the batch in slot s (streamed sets) through the scratch image; a failure
 * is returned with its message in the thread's last error, or noted in s->bad (skip_bad). */
static cf_status decode_item(cf_dataloader *dl, slot *s, int i, float *scratch) {
    int64_t src = s->idx[i];
    struct cf_image_files *f = dl->files;
    if (f->skip_bad && atomic_load(&f->bad[src])) { /* known bad: not read again */
        s->bad[i] = true;
        return CF_OK;
    }
    cf_status st = cf__image_files_decode(f, src, dl->epoch, scratch);
    if (st != CF_OK) {
        if (!f->skip_bad) return st;
        cf__image_files_mark_bad(f, src);
        s->bad[i] = true;
        return CF_OK;
    }
    make_sample(dl, src, scratch, s->x + (size_t)i * dl->per);
    return CF_OK;
}

/* Records sample i's failure in its slot when it comes first in the batch. Under the lock. */
static void note_failure(slot *s, int i, cf_status st) {
    if (st == CF_OK || i > s->err_item) return;
    s->err_item = i;
    s->st = st;
    snprintf(s->err, sizeof s->err, "%s", cf_last_error());
}

/* One decoding thread: claims the next sample of the batches ahead (at most nslots batches past
 * the one the consumer holds), decodes it into its place, and marks batches complete in order. */
static void *decoder(void *arg) {
    decoder_arg *a = arg;
    cf_dataloader *dl = a->dl;
    float *scratch = dl->scratch[a->index];
    pthread_mutex_lock(&dl->mu);
    for (;;) {
        while (!dl->stop && dl->claim_b < dl->n_batches && dl->claim_b - dl->released >= dl->nslots)
            pthread_cond_wait(&dl->cv_prod, &dl->mu);
        if (dl->stop || dl->claim_b >= dl->n_batches) break;
        int64_t b = dl->claim_b;
        slot *s = &dl->slots[b % dl->nslots];
        if (dl->claim_i == 0) setup_batch(dl, b, s);
        int i = dl->claim_i++;
        if (dl->claim_i >= s->batch.size) {
            dl->claim_b++;
            dl->claim_i = 0;
        }
        pthread_mutex_unlock(&dl->mu);
        cf_status st = decode_item(dl, s, i, scratch);
        pthread_mutex_lock(&dl->mu);
        note_failure(s, i, st);
        if (--s->remaining == 0) {
            s->ready = true;
            while (dl->produced < dl->n_batches) {
                slot *p = &dl->slots[dl->produced % dl->nslots];
                if (!p->ready || p->batch_no != dl->produced) break;
                dl->produced++;
            }
            pthread_cond_broadcast(&dl->cv_cons);
        }
    }
    pthread_mutex_unlock(&dl->mu);
    return NULL;
}

/* Assembles batch b of a streamed set in the caller's thread (no prefetching). */
static void fill_batch_inline(cf_dataloader *dl, int64_t b, slot *s) {
    setup_batch(dl, b, s);
    for (int i = 0; i < s->batch.size; i++)
        note_failure(s, i, decode_item(dl, s, i, dl->scratch[0]));
    s->remaining = 0;
    s->ready = true;
}

/* A complete streamed batch before it is handed out: the first failure, or the bad samples
 * left out (the rows after them move up). */
static cf_status finish_batch(cf_dataloader *dl, slot *s) {
    if (s->st != CF_OK) return cf_fail(s->st, "%s", s->err);
    int n = s->batch.size, k = 0, n_real = 0;
    for (int i = 0; i < n; i++) {
        if (s->bad[i]) continue;
        if (k != i) {
            memmove(s->x + (size_t)k * dl->per, s->x + (size_t)i * dl->per,
                    dl->per * sizeof(float));
            memmove(s->y + (size_t)k * dl->td, s->y + (size_t)i * dl->td,
                    (size_t)dl->td * sizeof(float));
            s->idx[k] = s->idx[i];
            s->pad[k] = s->pad[i];
        }
        n_real += !s->pad[k];
        k++;
    }
    if (k == n) return CF_OK;
    if (k == 0)
        return cf_fail(CF_ERR_FORMAT,
                       "batch %lld of epoch %d: none of its %d images could be read (%s, ...)",
                       (long long)s->batch_no, dl->epoch, n, dl->files->paths[s->idx[0]]);
    dl->skipped += n - k;
    cf_batch *bt = &s->batch;
    bt->x.shape.dim[0] = k;
    bt->y.shape.dim[0] = k;
    bt->size = k;
    if (bt->global_size == bt->n_real) bt->global_size = n_real;
    bt->n_real = n_real;
    memset(s->bad, 0, (size_t)n * sizeof(bool));
    return CF_OK;
}

int64_t cf_dataloader_skipped(const cf_dataloader *dl) {
    return dl ? dl->skipped : 0;
}

static void *producer(void *arg) {
    cf_dataloader *dl = arg;
    for (;;) {
        pthread_mutex_lock(&dl->mu);
        while (!dl->stop && dl->produced < dl->n_batches &&
               dl->produced - dl->released >= dl->nslots)
            pthread_cond_wait(&dl->cv_prod, &dl->mu);
        if (dl->stop || dl->produced >= dl->n_batches) {
            pthread_mutex_unlock(&dl->mu);
            return NULL;
        }
        int64_t b = dl->produced;
        pthread_mutex_unlock(&dl->mu);
        fill_batch(dl, b, &dl->slots[b % dl->nslots]);
        pthread_mutex_lock(&dl->mu);
        dl->produced = b + 1;
        pthread_cond_signal(&dl->cv_cons);
        pthread_mutex_unlock(&dl->mu);
    }
}

cf_status cf_dataloader_next(cf_dataloader *dl, const cf_batch **batch) {
    if (!batch) return cf_fail(CF_ERR_INVALID, "cf_dataloader_next: batch is NULL");
    *batch = NULL;
    if (!dl) return cf_fail(CF_ERR_INVALID, "cf_dataloader_next: loader is NULL");
    after_fork_check(dl);
    if (!dl->in_epoch)
        return cf_fail(CF_ERR_STATE, "cf_dataloader_next: no epoch started (call "
                                     "cf_dataloader_begin_epoch)");
    int64_t b = dl->next_b;
    if (b >= dl->n_batches) {
        stop_thread(dl);
        dl->in_epoch = false;
        return CF_OK;
    }
    if (dl->ops) {
        cf_status st = dl->ops->make(dl->ops_ctx, b, batch);
        if (st != CF_OK) {
            *batch = NULL;
            dl->in_epoch = false;
            return st;
        }
        dl->next_b = b + 1;
        return CF_OK;
    }
    slot *s = &dl->slots[b % dl->nslots];
    bool stream = dl->files && !dl->ds->x;
    if (dl->threaded && !dl->thread_running) {
        dl->produced = dl->released = dl->claim_b = b;
        dl->claim_i = 0;
        dl->stop = false;
        for (int i = 0; i < dl->nslots; i++) { /* no slot holds a batch of this run yet */
            dl->slots[i].ready = false;
            dl->slots[i].batch_no = -1;
        }
        if (stream) {
            int n =
                dl->files->decode_threads > 0 ? dl->files->decode_threads : cf_get_num_threads();
            if (n > 256) n = 256;
            dl->n_decoders = 0;
            if (ensure_scratch(dl, n))
                for (int i = 0; i < n; i++) {
                    dl->decoder_args[i] = (decoder_arg){dl, i};
                    if (pthread_create(&dl->decoders[i], NULL, decoder, &dl->decoder_args[i]) != 0)
                        break;
                    dl->n_decoders++;
                }
            dl->thread_running = dl->n_decoders > 0;
        } else if (pthread_create(&dl->thread, NULL, producer, dl) == 0) {
            dl->thread_running = true;
        }
    }
    if (dl->thread_running) {
        pthread_mutex_lock(&dl->mu);
        dl->released = b; /* the batch handed out last time is free again */
        pthread_cond_broadcast(&dl->cv_prod);
        while (dl->produced <= b) pthread_cond_wait(&dl->cv_cons, &dl->mu);
        pthread_mutex_unlock(&dl->mu);
    } else if (stream) {
        fill_batch_inline(dl, b, s); /* no thread (prefetch < 0, or none could be created) */
    } else {
        fill_batch(dl, b, s);
    }
    if (stream) {
        cf_status st = finish_batch(dl, s);
        if (st != CF_OK) {
            stop_thread(dl);
            dl->in_epoch = false;
            return st;
        }
    }
    dl->next_b = b + 1;
    *batch = &s->batch;
    return CF_OK;
}
