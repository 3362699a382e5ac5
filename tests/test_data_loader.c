/* DataLoader: fastai's lengths and defaults, sharding (per rank and split batch), determinism,
 * prefetch on/off, augmentation, normalisation, fork in the middle of an epoch. */
#include "oracle.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "corefit/data.h"

/* A dataset whose sample i holds the value i (shape (1)) and target i. */
static cf_dataset *index_dataset(int64_t n) {
    float *x = malloc((size_t)(n + 1) * sizeof(float)),
          *y = malloc((size_t)(n + 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = y[i] = (float)i;
    cf_dataset *ds;
    assert_int_equal(cf_dataset_from_arrays(x, y, n, cf_shape1(1), 1, 0, &ds), CF_OK);
    free(x);
    free(y);
    return ds;
}

/* A small image dataset (C, H, W) with distinct values. */
static cf_dataset *image_dataset(int64_t n, int c, int h, int w) {
    size_t per = (size_t)c * h * w;
    float *x = malloc((size_t)n * per * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    fill_uniform(x, (size_t)n * per, 7, 0.0f, 1.0f);
    for (int64_t i = 0; i < n; i++) y[i] = (float)(i % 3);
    cf_dataset *ds;
    assert_int_equal(cf_dataset_from_arrays(x, y, n, cf_shape_make(3, (int[]){c, h, w}), 1, 3, &ds),
                     CF_OK);
    free(x);
    free(y);
    return ds;
}

/* Every (idx, pad) the loader yields in one epoch, in order; returns the count. */
static int64_t drain(cf_dataloader *dl, int epoch, int64_t *idx, bool *pad, int64_t *n_batches) {
    assert_int_equal(cf_dataloader_begin_epoch(dl, epoch), CF_OK);
    const cf_batch *b;
    int64_t k = 0, nb = 0;
    for (;;) {
        assert_int_equal(cf_dataloader_next(dl, &b), CF_OK);
        if (!b) break;
        int real = 0;
        for (int i = 0; i < b->size; i++) {
            if (idx) idx[k] = b->idx[i];
            if (pad) pad[k] = b->pad[i];
            real += !b->pad[i];
            assert_true(b->y.data[i] == cf_dataloader_dataset(dl)->y[b->idx[i]]);
            k++;
        }
        assert_int_equal(real, b->n_real);
        nb++;
    }
    if (n_batches) *n_batches = nb;
    return k;
}

static void test_fastai_lengths(void **state) {
    (void)state;
    cf_dataset *ds = index_dataset(130);
    int64_t nb;
    for (int drop = 0; drop < 2; drop++) {
        for (int bs = 1; bs <= 70; bs += 3) {
            cf_dataloader *dl;
            assert_int_equal(
                cf_dataloader_new(
                    ds, &(cf_dl_options){.bs = bs, .drop_last = drop, .shuffle = true}, &dl),
                CF_OK);
            int64_t want = 130 / bs + ((!drop && 130 % bs) ? 1 : 0);
            assert_int_equal(cf_dataloader_len(dl), want);
            int64_t k = drain(dl, 0, NULL, NULL, &nb);
            assert_int_equal(nb, want);
            assert_int_equal(k, drop ? 130 / bs * bs : 130);
            cf_dataloader_free(dl);
        }
    }
    /* Defaults: bs 64, in order without shuffle. */
    cf_dataloader *dl;
    assert_int_equal(cf_dataloader_new(ds, NULL, &dl), CF_OK);
    assert_int_equal(cf_dataloader_options(dl)->bs, 64);
    assert_int_equal(cf_dataloader_len(dl), 3);
    int64_t idx[130];
    assert_int_equal(drain(dl, 0, idx, NULL, NULL), 130);
    for (int i = 0; i < 130; i++) assert_int_equal(idx[i], i);
    cf_dataloader_free(dl);
    cf_dataset_free(ds);
}

/* fastai's RandomSplitter: valid = the first int(pct*n) of a permutation. */
static void test_random_split(void **state) {
    (void)state;
    int64_t *tr, *va, nt, nv;
    assert_int_equal(cf_random_split(101, 0.2, 5, &tr, &nt, &va, &nv), CF_OK);
    assert_int_equal(nv, 20);
    assert_int_equal(nt, 81);
    int seen[101] = {0};
    for (int64_t i = 0; i < nt; i++) seen[tr[i]]++;
    for (int64_t i = 0; i < nv; i++) seen[va[i]]++;
    for (int i = 0; i < 101; i++) assert_int_equal(seen[i], 1);
    /* The same permutation as a shuffle drawn from the seed. */
    int64_t perm[101];
    for (int i = 0; i < 101; i++) perm[i] = i;
    cf_rng rng;
    cf_rng_seed(&rng, 5);
    cf_rng_shuffle(&rng, perm, 101);
    for (int i = 0; i < 20; i++) assert_int_equal(va[i], perm[i]);
    for (int i = 0; i < 81; i++) assert_int_equal(tr[i], perm[20 + i]);
    cf_free(tr);
    cf_free(va);
    assert_int_not_equal(cf_random_split(10, 1.5, 0, &tr, &nt, &va, &nv), CF_OK);
}

/* Per-rank sharding: the ranks' chunks concatenated are the permutation plus wrap-around
 * padding; real samples never overlap; drop_last applies to each rank's chunk. */
static void test_shard_per_rank(void **state) {
    (void)state;
    const int64_t sizes[] = {1, 2, 7, 13, 31, 69};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int64_t n = sizes[si];
        cf_dataset *ds = index_dataset(n);
        for (int shuffle = 0; shuffle < 2; shuffle++) {
            /* The single-process permutation. */
            cf_dataloader *one;
            assert_int_equal(
                cf_dataloader_new(
                    ds,
                    &(cf_dl_options){.bs = 1000, .shuffle = shuffle, .seed = 11, .prefetch = -1},
                    &one),
                CF_OK);
            int64_t perm[80];
            assert_int_equal(drain(one, 3, perm, NULL, NULL), n);
            cf_dataloader_free(one);
            for (int world = 1; world <= 5; world++) {
                int64_t total = (n + world - 1) / world * world, chunk = total / world;
                int64_t all[100];
                bool allpad[100];
                int64_t k = 0;
                for (int rank = 0; rank < world; rank++) {
                    for (int drop = 0; drop < 2; drop++) {
                        cf_dataloader *dl;
                        assert_int_equal(cf_dataloader_new(ds,
                                                           &(cf_dl_options){.bs = 3,
                                                                            .shuffle = shuffle,
                                                                            .drop_last = drop,
                                                                            .seed = 11},
                                                           &dl),
                                         CF_OK);
                        assert_int_equal(
                            cf_dataloader_set_shard(dl, rank, world, CF_SHARD_PER_RANK), CF_OK);
                        int64_t want_len = chunk / 3 + ((!drop && chunk % 3) ? 1 : 0), nb;
                        assert_int_equal(cf_dataloader_len(dl), want_len);
                        int64_t got =
                            drain(dl, 3, drop ? NULL : all + k, drop ? NULL : allpad + k, &nb);
                        assert_int_equal(nb, want_len);
                        assert_int_equal(got, drop ? chunk / 3 * 3 : chunk);
                        if (!drop) k += got;
                        cf_dataloader_free(dl);
                    }
                }
                assert_int_equal(k, total);
                int seen[80] = {0};
                for (int64_t i = 0; i < total; i++) {
                    assert_int_equal(all[i], perm[i % n]);
                    assert_int_equal(allpad[i], i >= n);
                    if (!allpad[i]) seen[all[i]]++;
                }
                for (int64_t i = 0; i < n; i++) assert_int_equal(seen[i], 1);
            }
        }
        cf_dataset_free(ds);
    }
}

/* Split-batch sharding: the ranks' slices of every batch concatenated (without padding) give
 * the single-process batch exactly. */
static void test_shard_split_batch(void **state) {
    (void)state;
    const int64_t sizes[] = {1, 3, 13, 29};
    cf_dataset *img = NULL;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int64_t n = sizes[si];
        cf_dataset_free(img);
        img = image_dataset(n, 1, 4, 4);
        for (int bs = 1; bs <= 7; bs++) {
            for (int train = 0; train < 2; train++) {
                cf_dl_options o = {.bs = bs,
                                   .shuffle = train,
                                   .drop_last = train,
                                   .seed = 3,
                                   .crop_pad = train ? 1 : 0,
                                   .flip = train};
                cf_dataloader *one;
                assert_int_equal(cf_dataloader_new(img, &o, &one), CF_OK);
                assert_int_equal(cf_dataloader_begin_epoch(one, 2), CF_OK);
                int64_t nb = cf_dataloader_len(one);
                for (int world = 1; world <= 5; world++) {
                    cf_dataloader *dl[5];
                    for (int r = 0; r < world; r++) {
                        assert_int_equal(cf_dataloader_new(img, &o, &dl[r]), CF_OK);
                        assert_int_equal(
                            cf_dataloader_set_shard(dl[r], r, world, CF_SHARD_SPLIT_BATCH), CF_OK);
                        assert_int_equal(cf_dataloader_len(dl[r]), nb);
                        assert_int_equal(cf_dataloader_begin_epoch(dl[r], 2), CF_OK);
                    }
                    if (world > 1) assert_int_equal(cf_dataloader_begin_epoch(one, 2), CF_OK);
                    for (int64_t b = 0; b <= nb; b++) {
                        const cf_batch *ref;
                        assert_int_equal(cf_dataloader_next(one, &ref), CF_OK);
                        int at = 0;
                        for (int r = 0; r < world; r++) {
                            const cf_batch *s;
                            assert_int_equal(cf_dataloader_next(dl[r], &s), CF_OK);
                            if (!ref) {
                                assert_null(s);
                                continue;
                            }
                            assert_non_null(s);
                            assert_int_equal(s->global_size, ref->size);
                            int want = (r + 1) * ref->size / world - r * ref->size / world;
                            assert_int_equal(s->n_real, want);
                            assert_int_equal(s->size, want ? want : 1);
                            for (int i = 0; i < s->size; i++) {
                                if (s->pad[i]) continue;
                                assert_int_equal(s->idx[i], ref->idx[at]);
                                assert_memory_equal(s->x.data + i * 16, ref->x.data + at * 16,
                                                    16 * sizeof(float));
                                at++;
                            }
                        }
                        if (ref) assert_int_equal(at, ref->size);
                    }
                    for (int r = 0; r < world; r++) cf_dataloader_free(dl[r]);
                }
                cf_dataloader_free(one);
            }
        }
    }
    cf_dataset_free(img);
}

static bool batches_equal(const cf_batch *a, const cf_batch *b) {
    return a->size == b->size && a->n_real == b->n_real &&
           cf_shape_equal(&a->x.shape, &b->x.shape) &&
           memcmp(a->x.data, b->x.data, cf_tensor_numel(&a->x) * sizeof(float)) == 0 &&
           memcmp(a->y.data, b->y.data, cf_tensor_numel(&a->y) * sizeof(float)) == 0 &&
           memcmp(a->idx, b->idx, (size_t)a->size * sizeof(int64_t)) == 0 &&
           memcmp(a->pad, b->pad, (size_t)a->size * sizeof(bool)) == 0;
}

/* Same seed -> same batches; prefetch thread on or off -> same batches; another seed or epoch
 * -> another order. */
static void test_determinism(void **state) {
    (void)state;
    cf_dataset *ds = image_dataset(203, 3, 6, 5);
    cf_dl_options base = {.bs = 16,
                          .shuffle = true,
                          .drop_last = true,
                          .seed = 42,
                          .crop_pad = 2,
                          .flip = true,
                          .n_norm = 3,
                          .mean = {0.4f, 0.5f, 0.6f},
                          .std = {0.2f, 0.3f, 0.25f}};
    cf_dl_options threaded = base, sync = base, other = base, deep = base;
    threaded.prefetch = 2;
    sync.prefetch = -1;
    other.seed = 43;
    deep.prefetch = 9;
    cf_dataloader *a, *b, *c, *d;
    assert_int_equal(cf_dataloader_new(ds, &threaded, &a), CF_OK);
    assert_int_equal(cf_dataloader_new(ds, &sync, &b), CF_OK);
    assert_int_equal(cf_dataloader_new(ds, &other, &c), CF_OK);
    assert_int_equal(cf_dataloader_new(ds, &deep, &d), CF_OK);
    const float *buffers[16];
    int n_buffers = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        assert_int_equal(cf_dataloader_begin_epoch(a, epoch), CF_OK);
        assert_int_equal(cf_dataloader_begin_epoch(b, epoch), CF_OK);
        assert_int_equal(cf_dataloader_begin_epoch(c, epoch), CF_OK);
        assert_int_equal(cf_dataloader_begin_epoch(d, epoch), CF_OK);
        int differs = 0;
        for (;;) {
            const cf_batch *ba, *bb, *bc, *bd;
            assert_int_equal(cf_dataloader_next(a, &ba), CF_OK);
            assert_int_equal(cf_dataloader_next(b, &bb), CF_OK);
            assert_int_equal(cf_dataloader_next(c, &bc), CF_OK);
            assert_int_equal(cf_dataloader_next(d, &bd), CF_OK);
            if (!ba) {
                assert_null(bb);
                assert_null(bc);
                break;
            }
            if (epoch > 0 && epoch < 2) usleep(200); /* let the producer run ahead */
            assert_true(batches_equal(ba, bb));
            assert_true(batches_equal(ba, bd));
            differs += !batches_equal(ba, bc);
            /* The ring buffers are reused: no new buffer appears after the first epoch. */
            bool known = false;
            for (int i = 0; i < n_buffers; i++) known |= buffers[i] == ba->x.data;
            if (!known) {
                assert_int_equal(epoch, 0);
                assert_true(n_buffers < 16);
                buffers[n_buffers++] = ba->x.data;
            }
        }
        assert_true(differs > 0);
    }
    assert_int_equal(n_buffers, 3); /* prefetch 2: two batches ahead plus the one handed out */
    /* Epochs reorder. */
    int64_t e0[203], e1[203];
    drain(b, 0, e0, NULL, NULL);
    drain(b, 1, e1, NULL, NULL);
    assert_true(memcmp(e0, e1, sizeof(int64_t) * 192) != 0);
    /* Stopping in the middle of an epoch and starting another is fine. */
    const cf_batch *x;
    assert_int_equal(cf_dataloader_begin_epoch(a, 5), CF_OK);
    assert_int_equal(cf_dataloader_next(a, &x), CF_OK);
    assert_int_equal(cf_dataloader_begin_epoch(a, 6), CF_OK);
    assert_int_equal(cf_dataloader_next(a, &x), CF_OK);
    assert_non_null(x);
    cf_dataloader_free(a); /* mid-epoch: joins the thread */
    cf_dataloader_free(b);
    cf_dataloader_free(c);
    cf_dataloader_free(d);
    /* next before begin_epoch is a state error. */
    assert_int_equal(cf_dataloader_new(ds, &base, &a), CF_OK);
    assert_int_equal(cf_dataloader_next(a, &x), CF_ERR_STATE);
    assert_true(strstr(cf_last_error(), "begin_epoch") != NULL);
    cf_dataloader_free(a);
    cf_dataset_free(ds);
}

/* Each augmented sample is one of the (2p+1)^2 crops of the zero-padded image, flipped or not,
 * normalised per channel; without augmentation samples are just normalised. The draw depends on
 * (seed, epoch, index) only, not on the shard. */
static void test_augmentation_and_normalisation(void **state) {
    (void)state;
    const int C = 2, H = 5, W = 6, p = 2;
    cf_dataset *ds = image_dataset(40, C, H, W);
    float mean[2] = {0.3f, 0.6f}, sd[2] = {0.5f, 0.25f};
    cf_dl_options o = {.bs = 8,
                       .shuffle = true,
                       .seed = 9,
                       .crop_pad = p,
                       .flip = true,
                       .n_norm = 2,
                       .mean = {0.3f, 0.6f},
                       .std = {0.5f, 0.25f}};
    cf_dataloader *dl, *sharded, *plain;
    assert_int_equal(cf_dataloader_new(ds, &o, &dl), CF_OK);
    assert_int_equal(cf_dataloader_new(ds, &o, &sharded), CF_OK);
    assert_int_equal(cf_dataloader_set_shard(sharded, 1, 3, CF_SHARD_PER_RANK), CF_OK);
    cf_dl_options po = {.bs = 8, .n_norm = 2, .mean = {0.3f, 0.6f}, .std = {0.5f, 0.25f}};
    assert_int_equal(cf_dataloader_new(ds, &po, &plain), CF_OK);
    size_t per = (size_t)C * H * W;
    float *seen = calloc(40 * per, sizeof(float));
    assert_int_equal(cf_dataloader_begin_epoch(dl, 4), CF_OK);
    const cf_batch *b;
    int flips = 0, shifted = 0;
    while (cf_dataloader_next(dl, &b) == CF_OK && b) {
        for (int i = 0; i < b->size; i++) {
            const float *src = ds->x + b->idx[i] * per, *got = b->x.data + i * per;
            memcpy(seen + b->idx[i] * per, got, per * sizeof(float));
            int matches = 0;
            for (int f = 0; f < 2; f++)
                for (int oy = 0; oy <= 2 * p; oy++)
                    for (int ox = 0; ox <= 2 * p; ox++) {
                        bool ok = true;
                        for (int c = 0; c < C && ok; c++)
                            for (int y = 0; y < H && ok; y++)
                                for (int x = 0; x < W && ok; x++) {
                                    int sx = (f ? W - 1 - x : x) + ox - p, sy = y + oy - p;
                                    float v = (sx >= 0 && sx < W && sy >= 0 && sy < H)
                                                  ? src[(c * H + sy) * W + sx]
                                                  : 0.0f;
                                    float want = (v - mean[c]) / sd[c];
                                    ok = fabsf(got[(c * H + y) * W + x] - want) < 1e-5f;
                                }
                        if (ok) {
                            matches++;
                            flips += f;
                            shifted += (ox != p || oy != p);
                        }
                    }
            assert_true(matches >= 1);
        }
    }
    assert_true(flips > 0 && flips < 40);
    assert_true(shifted > 20);
    /* The sharded loader gives the same augmentation for the same sample and epoch. */
    assert_int_equal(cf_dataloader_begin_epoch(sharded, 4), CF_OK);
    int compared = 0;
    while (cf_dataloader_next(sharded, &b) == CF_OK && b)
        for (int i = 0; i < b->size; i++, compared++)
            assert_memory_equal(b->x.data + i * per, seen + b->idx[i] * per, per * sizeof(float));
    assert_true(compared > 10);
    /* No augmentation: normalisation only, in order. */
    assert_int_equal(cf_dataloader_begin_epoch(plain, 0), CF_OK);
    int64_t at = 0;
    while (cf_dataloader_next(plain, &b) == CF_OK && b)
        for (int i = 0; i < b->size; i++, at++) {
            assert_int_equal(b->idx[i], at);
            for (size_t j = 0; j < per; j++) {
                int c = (int)(j / (H * W));
                assert_true(fabsf(b->x.data[i * per + j] -
                                  (ds->x[at * per + j] - mean[c]) / sd[c]) < 1e-5f);
            }
            assert_int_equal(b->x.shape.ndim, 4);
            assert_int_equal(b->x.shape.dim[1], C);
        }
    assert_int_equal(at, 40);
    /* Training statistics: per channel mean and unbiased std. */
    float m[2], s[2];
    assert_int_equal(cf_dataset_channel_stats(ds, m, s), CF_OK);
    for (int c = 0; c < C; c++) {
        double sum = 0, sq = 0;
        int cnt = 40 * H * W;
        for (int i = 0; i < 40; i++)
            for (int j = 0; j < H * W; j++) sum += ds->x[i * per + c * H * W + j];
        double mu = sum / cnt;
        for (int i = 0; i < 40; i++)
            for (int j = 0; j < H * W; j++) {
                double d = ds->x[i * per + c * H * W + j] - mu;
                sq += d * d;
            }
        assert_true(fabs(m[c] - mu) < 1e-6);
        assert_true(fabs(s[c] - sqrt(sq / (cnt - 1))) < 1e-6);
    }
    free(seen);
    cf_dataloader_free(dl);
    cf_dataloader_free(sharded);
    cf_dataloader_free(plain);
    cf_dataset_free(ds);
}

/* A process forked in the middle of an epoch continues with the same batches (the parent's
 * prefetch thread does not exist in the child). */
static void test_fork_mid_epoch(void **state) {
    (void)state;
    cf_dataset *ds = index_dataset(500);
    cf_dl_options o = {.bs = 10, .shuffle = true, .drop_last = true, .seed = 1};
    int64_t want[500];
    cf_dataloader *ref, *dl;
    o.prefetch = -1;
    assert_int_equal(cf_dataloader_new(ds, &o, &ref), CF_OK);
    assert_int_equal(drain(ref, 2, want, NULL, NULL), 500);
    cf_dataloader_free(ref);
    o.prefetch = 3;
    assert_int_equal(cf_dataloader_new(ds, &o, &dl), CF_OK);
    assert_int_equal(cf_dataloader_begin_epoch(dl, 2), CF_OK);
    const cf_batch *b;
    for (int i = 0; i < 5; i++) assert_int_equal(cf_dataloader_next(dl, &b), CF_OK);
    usleep(2000);
    pid_t pid = fork();
    assert_true(pid >= 0);
    int64_t at = 50;
    while (cf_dataloader_next(dl, &b) == CF_OK && b) {
        for (int i = 0; i < b->size; i++, at++)
            if (b->idx[i] != want[at]) {
                if (pid == 0) _exit(2);
                fail_msg("batch differs at %lld", (long long)at);
            }
    }
    if (pid == 0) {
        /* A second epoch in the child starts its own thread. */
        int64_t again[500];
        int64_t k = 0;
        assert_int_equal(cf_dataloader_begin_epoch(dl, 2), CF_OK);
        while (cf_dataloader_next(dl, &b) == CF_OK && b)
            for (int i = 0; i < b->size; i++) again[k++] = b->idx[i];
        _exit(at == 500 && k == 500 && memcmp(again, want, sizeof again) == 0 ? 0 : 3);
    }
    assert_int_equal(at, 500);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    cf_dataloader_free(dl);
    cf_dataset_free(ds);
}

static void test_dls_defaults_and_arrays(void **state) {
    (void)state;
    cf_dataset *tr = image_dataset(150, 1, 4, 4), *va = image_dataset(70, 1, 4, 4);
    const char *names[] = {"a", "b", "c"};
    assert_int_equal(cf_dataset_set_vocab(tr, names, 3), CF_OK);
    assert_string_equal(tr->vocab[2], "c");
    assert_int_not_equal(cf_dataset_set_vocab(tr, names, 2), CF_OK);
    /* Subsets keep the vocab. */
    cf_dataset *sub;
    int64_t pick[] = {5, 1};
    assert_int_equal(cf_dataset_subset(tr, pick, 2, &sub), CF_OK);
    assert_string_equal(sub->vocab[1], "b");
    assert_memory_equal(sub->x + 16, tr->x + 16, 16 * sizeof(float));
    assert_true(sub->y[0] == tr->y[5]);
    cf_dataset_free(sub);
    cf_dls *dls;
    assert_int_equal(cf_dls_new(tr, va, &(cf_dls_options){.val_bs = 32, .normalize = true}, &dls),
                     CF_OK);
    const cf_dl_options *t = cf_dataloader_options(dls->train),
                        *v = cf_dataloader_options(dls->valid);
    assert_int_equal(t->bs, 64);
    assert_true(t->shuffle && t->drop_last);
    assert_int_equal(v->bs, 32);
    assert_true(!v->shuffle && !v->drop_last);
    assert_int_equal(cf_dataloader_len(dls->train), 2);
    assert_int_equal(cf_dataloader_len(dls->valid), 3);
    float m, s;
    assert_int_equal(cf_dataset_channel_stats(dls->train_ds, &m, &s), CF_OK);
    assert_int_equal(t->n_norm, 1);
    assert_true(t->mean[0] == m && t->std[0] == s && v->mean[0] == m);
    cf_dls_free(dls);
    /* Bad arguments. */
    cf_dataset *ds = index_dataset(5);
    cf_dataloader *dl;
    assert_int_equal(cf_dataloader_new(ds, &(cf_dl_options){.bs = -1}, &dl), CF_ERR_INVALID);
    assert_int_equal(cf_dataloader_new(ds, &(cf_dl_options){.flip = true}, &dl), CF_ERR_INVALID);
    assert_int_equal(cf_dataloader_new(ds, NULL, &dl), CF_OK);
    assert_int_equal(cf_dataloader_set_shard(dl, 3, 3, CF_SHARD_PER_RANK), CF_ERR_INVALID);
    cf_dataloader_free(dl);
    float y = 7;
    cf_dataset *bad;
    assert_int_equal(cf_dataset_from_arrays(&y, &y, 1, cf_shape1(1), 1, 3, &bad), CF_ERR_INVALID);
    assert_null(bad);
    cf_dataset_free(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fastai_lengths),
        cmocka_unit_test(test_random_split),
        cmocka_unit_test(test_shard_per_rank),
        cmocka_unit_test(test_shard_split_batch),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_augmentation_and_normalisation),
        cmocka_unit_test(test_fork_mid_epoch),
        cmocka_unit_test(test_dls_defaults_and_arrays),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
