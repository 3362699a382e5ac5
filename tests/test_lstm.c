/* The recurrent layers and fastai's AWD-LSTM language model against PyTorch (tests/oracle/
 * lstm.py): nn.LSTM over several sizes with the state carried and detached across batches
 * (truncated BPTT, a batch of another size among them), and the language model with the C
 * model's weights and dropout masks (logits, loss and every gradient); the dropouts' semantics.
 * Run at every instruction set (tests/isa.cmake). */
#include "oracle.h"
#include "text_fixture.h"

#include "corefit/nn.h"
#include "nn/rnn_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void check_grads(oracle *o, const cf_model *model, double rtol, double atol) {
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        char name[300];
        snprintf(name, sizeof name, "g_%s", p->full_name);
        cf_tensor g = oracle_get(o, name);
        assert_int_equal(cf_tensor_numel(&g), p->numel);
        assert_close(name, p->grad, g.data, p->numel, rtol, atol);
        free(g.data);
    }
}

/* nn.LSTM(I, H) over batches of the given sizes, the state carried */
static void check_lstm(int in, int hid, int n, const int *bs, const int *steps) {
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, cf_lstm(in, hid), 11 + in), CF_OK);
    oracle o;
    oracle_init(&o);
    oracle_put_params(&o, model);
    cf_model_zero_grad(model);
    float *ys[8], *dxs[8];
    for (int k = 0; k < n; k++) {
        const cf_shape xs = {.ndim = 3, .dim = {bs[k], steps[k], in}};
        const cf_shape ys_shape = {.ndim = 3, .dim = {bs[k], steps[k], hid}};
        float *x = malloc(cf_shape_numel(&xs) * sizeof(float));
        float *dy = malloc(cf_shape_numel(&ys_shape) * sizeof(float));
        fill_uniform(x, cf_shape_numel(&xs), 100 + k, -1.5f, 1.5f);
        fill_uniform(dy, cf_shape_numel(&ys_shape), 200 + k, -1.0f, 1.0f);
        char name[32];
        snprintf(name, sizeof name, "x%d", k);
        oracle_put(&o, name, x, xs);
        snprintf(name, sizeof name, "dy%d", k);
        oracle_put(&o, name, dy, ys_shape);
        cf_tensor xt = cf_tensor_view(x, xs), dyt = cf_tensor_view(dy, ys_shape);
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
        ys[k] = malloc(cf_tensor_numel(y) * sizeof(float));
        memcpy(ys[k], y->data, cf_tensor_numel(y) * sizeof(float));
        /* cf_model_backward does not hand out the input gradient: run the root's backward */
        const cf_tensor *dx = model->root->ops->backward(model->root, &dyt, true);
        assert_non_null(dx);
        dxs[k] = malloc(cf_shape_numel(&xs) * sizeof(float));
        memcpy(dxs[k], dx->data, cf_shape_numel(&xs) * sizeof(float));
        free(x);
        free(dy);
    }
    char args[64];
    snprintf(args, sizeof args, "lstm %d %d %d", in, hid, n);
    oracle_run(&o, "lstm.py", args);
    for (int k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof name, "y%d", k);
        cf_tensor yr = oracle_get(&o, name);
        assert_close(name, ys[k], yr.data, cf_tensor_numel(&yr), 1e-4, 1e-5);
        free(yr.data);
        free(ys[k]);
        snprintf(name, sizeof name, "dx%d", k);
        cf_tensor dxr = oracle_get(&o, name);
        assert_close(name, dxs[k], dxr.data, cf_tensor_numel(&dxr), 1e-4, 1e-5);
        free(dxr.data);
        free(dxs[k]);
    }
    check_grads(&o, model, 1e-4, 1e-5);
    oracle_cleanup(&o);
    cf_model_free(model);
}

static void test_lstm_sizes(void **state) {
    (void)state;
    /* one batch; several sizes, hidden sizes on and off every vector width */
    check_lstm(5, 7, 1, (int[]){3}, (int[]){4});
    check_lstm(16, 33, 1, (int[]){4}, (int[]){6});
    check_lstm(24, 64, 1, (int[]){2}, (int[]){1});
}

static void test_lstm_truncated_bptt(void **state) {
    (void)state;
    /* the state carried over four batches, detached; the third is smaller (rows kept), the
     * fourth larger again (zero-padded), the last shorter in time */
    check_lstm(12, 20, 4, (int[]){4, 4, 3, 5}, (int[]){5, 5, 5, 2});
}

/* ---- the AWD-LSTM language model ---- */

/* Each of n batches' logits (freed here), loss and, when regs, regularizer term against the
 * oracle's logits<k>, loss<k> and reg<k>. */
static void check_batches(oracle *o, int n, float **logits, const float *losses,
                          const float *regs) {
    for (int k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof name, "logits%d", k);
        cf_tensor r = oracle_get(o, name);
        assert_close(name, logits[k], r.data, cf_tensor_numel(&r), 1e-4, 1e-5);
        free(r.data);
        free(logits[k]);
        snprintf(name, sizeof name, "loss%d", k);
        r = oracle_get(o, name);
        assert_close(name, &losses[k], r.data, 1, 1e-4, 1e-6);
        free(r.data);
        if (!regs) continue;
        snprintf(name, sizeof name, "reg%d", k);
        r = oracle_get(o, name);
        assert_close(name, &regs[k], r.data, 1, 1e-4, 1e-6);
        free(r.data);
    }
}

/* the language model over three batches; alpha, beta: fastai's RNNRegularizer added to the loss
 * back-propagated (cf_rnn_regularizer_set) */
static void check_awd_lstm_lm(float alpha, float beta) {
    const int V = 37, E = 8, NH = 12, L = 3, n = 3;
    cf_awd_lstm_config cfg = cf_awd_lstm_lm_config();
    cfg.emb_sz = E;
    cfg.n_hid = NH;
    cfg.n_layers = L;
    /* large dropouts, so that every mask matters */
    cf_module *root = cf_awd_lstm_lm(V, &cfg, 2.0f);
    assert_non_null(root);
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, root, 5), CF_OK);
    cf_module *awd = model->root->children[0], *dec = model->root->children[1];
    assert_null(cf_awd_lstm_lm_raw_out(model->root)); /* no forward yet */
    assert_int_equal(cf_rnn_regularizer_set(model->root, alpha, beta), CF_OK);
    assert_int_equal(cf_rnn_regularizer_set(awd, alpha, beta), CF_ERR_INVALID);
    assert_int_equal(cf_rnn_regularizer_set(model->root, -1.0f, beta), CF_ERR_INVALID);
    oracle o;
    oracle_init(&o);
    oracle_put_params(&o, model);
    cf_model_zero_grad(model);
    const int bs[3] = {3, 3, 2}, steps[3] = {6, 6, 4};
    float *logits[3], losses[3], regs[3];
    for (int k = 0; k < n; k++) {
        const cf_shape xs = cf_shape2(bs[k], steps[k]);
        const size_t nt = cf_shape_numel(&xs);
        float *x = malloc(nt * sizeof(float)), *tg = malloc(nt * sizeof(float));
        cf_rng rng;
        cf_rng_seed(&rng, 40 + k);
        for (size_t i = 0; i < nt; i++) {
            x[i] = (float)cf_rng_below(&rng, V);
            tg[i] = (float)cf_rng_below(&rng, V);
        }
        x[1] = 1.0f; /* padding tokens: looked up, no gradient */
        x[nt - 1] = 1.0f;
        char name[32];
        snprintf(name, sizeof name, "x%d", k);
        oracle_put(&o, name, x, xs);
        snprintf(name, sizeof name, "t%d", k);
        oracle_put(&o, name, tg, xs);
        cf_tensor xt = cf_tensor_view(x, xs);
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
        assert_int_equal(y->shape.ndim, 3);
        assert_int_equal(y->shape.dim[2], V);
        /* the short last batch (fewer rows, fewer steps) runs within the first plan, and its
         * results are checked against PyTorch below */
        assert_int_equal(model->n_plans, 1);
        /* the masks this forward drew */
        snprintf(name, sizeof name, "m%d", k);
        oracle_put_awd_masks(&o, name, awd, bs[k], V, E, NH, L);
        snprintf(name, sizeof name, "m%d_out", k);
        oracle_put_mask(&o, name, cf_nn_rnn_dropout_mask(dec->children[0]), cf_shape2(bs[k], E));
        logits[k] = malloc(nt * V * sizeof(float));
        memcpy(logits[k], y->data, nt * V * sizeof(float));
        /* fastai's (logits, raw_out, out): out is raw_out times the output dropout's mask */
        const cf_tensor *raw = cf_awd_lstm_lm_raw_out(model->root);
        const cf_tensor *out = cf_awd_lstm_lm_out(model->root);
        assert_non_null(raw);
        assert_non_null(out);
        assert_int_equal(raw->shape.dim[0], bs[k]);
        assert_int_equal(raw->shape.dim[1], steps[k]);
        assert_int_equal(raw->shape.dim[2], E);
        const float *out_mask = cf_nn_rnn_dropout_mask(dec->children[0]);
        for (int b = 0; b < bs[k]; b++)
            for (int t = 0; t < steps[k]; t++)
                for (int j = 0; j < E; j++) {
                    const size_t i = ((size_t)b * steps[k] + t) * E + j;
                    assert_float_equal(out->data[i], raw->data[i] * out_mask[b * E + j], 1e-6);
                }
        regs[k] = (float)cf_rnn_regularizer_loss(model->root, alpha, beta);
        /* mean cross-entropy over the tokens, and its gradient */
        cf_loss loss = {.kind = CF_LOSS_CROSS_ENTROPY};
        cf_tensor pred = cf_tensor_view(y->data, cf_shape2((int)nt, V));
        cf_tensor target = cf_tensor_view(tg, cf_shape1((int)nt));
        assert_int_equal(cf_loss_forward(&loss, &pred, &target, &losses[k], NULL), CF_OK);
        float *dl = malloc(nt * V * sizeof(float));
        cf_tensor dpred = cf_tensor_view(dl, cf_shape2((int)nt, V));
        cf_loss_backward(&loss, &pred, &target, &dpred);
        cf_tensor dy = cf_tensor_view(dl, y->shape);
        assert_int_equal(cf_model_backward(model, &dy), CF_OK);
        free(dl);
        free(x);
        free(tg);
    }
    char args[96];
    snprintf(args, sizeof args, "lm %d %d %d %d %d %.3f %.3f", V, E, NH, L, n, (double)alpha,
             (double)beta);
    oracle_run(&o, "lstm.py", args);
    check_batches(&o, n, logits, losses, regs);
    check_grads(&o, model, 1e-4, 1e-5);
    oracle_cleanup(&o);
    cf_model_free(model);
}

static void test_awd_lstm_lm(void **state) {
    (void)state;
    check_awd_lstm_lm(0.0f, 0.0f);
}

/* AR and TAR (fastai's alpha 2, beta 1; and each alone) against PyTorch autograd */
static void test_rnn_regularizer(void **state) {
    (void)state;
    check_awd_lstm_lm(2.0f, 1.0f);
    check_awd_lstm_lm(0.0f, 3.0f);
}

/* WeightDropout: the mask is element-wise, 0 or 1 / (1 - p), about p of it 0, redrawn at each
 * training forward; eval runs the raw weight; cf_rnn_reset gives the same output again. */
static void test_weight_dropout_semantics(void **state) {
    (void)state;
    const int I = 6, H = 16;
    const float p = 0.3f;
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, cf_weight_dropout(cf_lstm(I, H), p), 3), CF_OK);
    assert_non_null(cf_model_param(model, "weight_hh_l0_raw"));
    assert_non_null(cf_model_param(model, "module.weight_ih_l0"));
    assert_null(cf_model_param(model, "module.weight_hh_l0"));
    float x[2 * 3 * 6];
    fill_uniform(x, sizeof x / sizeof x[0], 9, -1, 1);
    cf_tensor xt = cf_tensor_view(x, (cf_shape){.ndim = 3, .dim = {2, 3, I}});
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
    const float *mask = cf_nn_weight_dropout_mask(model->root);
    assert_non_null(mask);
    const size_t n = (size_t)4 * H * H;
    float *first = malloc(n * sizeof(float));
    memcpy(first, mask, n * sizeof(float));
    size_t zeros = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(mask[i] == 0.0f || fabsf(mask[i] - 1.0f / (1.0f - p)) < 1e-6f);
        zeros += mask[i] == 0.0f;
    }
    assert_true(zeros > n * 0.2 && zeros < n * 0.4);
    assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
    assert_true(memcmp(first, cf_nn_weight_dropout_mask(model->root), n * sizeof(float)) != 0);
    free(first);
    /* eval: no mask, and the output of a plain LSTM holding the raw weight */
    cf_model_train(model, false);
    cf_rnn_reset(model->root);
    assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
    assert_null(cf_nn_weight_dropout_mask(model->root));
    float *ye = malloc(cf_tensor_numel(y) * sizeof(float));
    memcpy(ye, y->data, cf_tensor_numel(y) * sizeof(float));
    cf_model *plain = NULL;
    assert_int_equal(cf_model_new(&plain, cf_lstm(I, H), 4), CF_OK);
    memcpy(cf_model_param(plain, "weight_ih_l0")->data,
           cf_model_param(model, "module.weight_ih_l0")->data, (size_t)4 * H * I * sizeof(float));
    memcpy(cf_model_param(plain, "weight_hh_l0")->data,
           cf_model_param(model, "weight_hh_l0_raw")->data, n * sizeof(float));
    memcpy(cf_model_param(plain, "bias_ih_l0")->data,
           cf_model_param(model, "module.bias_ih_l0")->data, (size_t)4 * H * sizeof(float));
    memcpy(cf_model_param(plain, "bias_hh_l0")->data,
           cf_model_param(model, "module.bias_hh_l0")->data, (size_t)4 * H * sizeof(float));
    const cf_tensor *yp;
    assert_int_equal(cf_model_forward(plain, &xt, &yp), CF_OK);
    assert_memory_equal(ye, yp->data, cf_tensor_numel(yp) * sizeof(float));
    /* the state carried: a second forward differs; after a reset it repeats the first */
    assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
    assert_true(memcmp(ye, y->data, cf_tensor_numel(y) * sizeof(float)) != 0);
    cf_rnn_reset(model->root);
    assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
    assert_memory_equal(ye, y->data, cf_tensor_numel(y) * sizeof(float));
    free(ye);
    cf_model_free(plain);
    cf_model_free(model);
}

/* EmbeddingDropout: a dropped token's whole row is 0, a kept one is scaled; the padding row is
 * looked up but gets no gradient. */
static void test_embedding_dropout_semantics(void **state) {
    (void)state;
    const int V = 40, D = 5;
    const float p = 0.5f;
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, cf_embedding_dropout(V, D, p, 1), 8), CF_OK);
    const float *w = model->params[0]->data;
    for (size_t i = 0; i < (size_t)V * D; i++) assert_true(w[i] >= -0.1f && w[i] <= 0.1f);
    float ids[2 * 20];
    for (int i = 0; i < 40; i++) ids[i] = (float)(i % V);
    ids[3] = 1.0f;
    cf_tensor xt = cf_tensor_view(ids, cf_shape2(2, 20));
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
    const float *mask = cf_nn_embedding_dropout_mask(model->root);
    assert_non_null(mask);
    int dropped = 0;
    for (int i = 0; i < 40; i++) {
        const int c = (int)ids[i];
        assert_true(mask[c] == 0.0f || mask[c] == 2.0f);
        dropped += mask[c] == 0.0f;
        for (int j = 0; j < D; j++)
            assert_float_equal(y->data[i * D + j], w[c * D + j] * mask[c], 0);
    }
    assert_true(dropped > 0 && dropped < 40);
    float dy[2 * 20 * 5];
    for (int i = 0; i < 200; i++) dy[i] = 1.0f;
    cf_model_zero_grad(model);
    cf_tensor dyt = cf_tensor_view(dy, y->shape);
    assert_int_equal(cf_model_backward(model, &dyt), CF_OK);
    const float *g = model->params[0]->grad;
    for (int j = 0; j < D; j++) assert_float_equal(g[1 * D + j], 0.0f, 0); /* padding */
    for (int c = 2; c < V; c++) /* once each (ids 0..39 but 3, which became padding) */
        for (int j = 0; j < D; j++) assert_float_equal(g[c * D + j], c == 3 ? 0.0f : mask[c], 1e-6);
    cf_model_free(model);
}

/* ---- the ULMFiT classifier ---- */

typedef struct chunk_masks {
    oracle *o;
    int batch, V, E, NH, L;
} chunk_masks;

/* every chunk's dropout masks, as the SentenceEncoder runs it */
static void put_chunk_masks(void *ctx, int chunk, const cf_module *awd) {
    const chunk_masks *c = ctx;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "b%dc%d", c->batch, chunk);
    oracle_put_awd_masks(c->o, prefix, awd, awd->in->shape.dim[0], c->V, c->E, c->NH, c->L);
}

/* a row of T columns holding a text of len tokens as fastai's Pad_Chunk(pad_first) lays it out:
 * whole chunks of padding, the text, then the rest of the padding */
static void chunk_padded_row(float *row, int T, int len, int bptt, int V, cf_rng *rng) {
    const int l = T - len, lead = l / bptt * bptt;
    for (int t = 0; t < T; t++)
        row[t] = t >= lead && t < lead + len ? (float)(2 + cf_rng_below(rng, V - 2)) : 1.0f;
}

static void test_text_classifier(void **state) {
    (void)state;
    const int V = 37, E = 8, NH = 12, L = 3, bptt = 4, max_len = 8, n_class = 3, n = 3;
    cf_awd_lstm_config cfg = cf_awd_lstm_clas_config();
    cfg.emb_sz = E;
    cfg.n_hid = NH;
    cfg.n_layers = L;
    const int lin_ftrs[] = {6};
    const float ps[] = {0.3f};
    cf_text_classifier_opts opts = {
        .seq_len = bptt, .max_len = max_len, .lin_ftrs = lin_ftrs, .n_lin_ftrs = 1, .ps = ps};
    cf_module *root = cf_text_classifier(V, n_class, &cfg, 1.0f, &opts);
    assert_non_null(root);
    cf_model *model = NULL;
    assert_int_equal(cf_model_new(&model, root, 17), CF_OK);
    /* fastai's names and BatchNorm init */
    assert_non_null(cf_model_param(model, "0.module.encoder.weight"));
    assert_non_null(cf_model_param(model, "0.module.rnns.2.weight_hh_l0_raw"));
    assert_non_null(cf_model_param(model, "1.layers.1.2.weight"));
    assert_null(cf_model_param(model, "1.layers.0.2.bias"));
    const cf_param *bn_bias = cf_model_param(model, "1.layers.0.0.bias");
    assert_non_null(bn_bias);
    assert_int_equal(bn_bias->numel, 3 * E);
    for (size_t i = 0; i < bn_bias->numel; i++) {
        assert_float_equal(bn_bias->data[i], 1e-3f, 0);
        assert_float_equal(cf_model_param(model, "1.layers.0.0.weight")->data[i], 1.0f, 0);
    }
    /* the 5 groups of awd_lstm_clas_split */
    assert_int_equal(cf_split_text_classifier(model), CF_OK);
    assert_int_equal(model->n_groups, 5);
    assert_int_equal(cf_model_param(model, "0.module.encoder.weight")->group, 0);
    assert_int_equal(cf_model_param(model, "0.module.rnns.0.module.weight_ih_l0")->group, 1);
    assert_int_equal(cf_model_param(model, "0.module.rnns.2.weight_hh_l0_raw")->group, 3);
    assert_int_equal(cf_model_param(model, "1.layers.0.0.weight")->group, 4);

    cf_module *enc = model->root->children[0], *head = model->root->children[1];
    cf_module *awd = enc->children[0];
    oracle o;
    oracle_init(&o);
    oracle_put_params(&o, model);
    cf_model_zero_grad(model);
    /* batch 0: T 14 in chunks of 4 (real_bs 2, 3, 4, 4; the first two only warm the state, the
     * last two are kept), rows with padding behind the text; batch 1: T 5, every chunk kept;
     * batch 2: T 8, shorter than batch 0 but keeping more columns (8 against 6) */
    const int bs[3] = {4, 3, 4}, steps[3] = {14, 5, 8};
    const int lens[3][4] = {{14, 13, 10, 5}, {5, 5, 1, 0}, {8, 6, 3, 2}};
    const int kept[3] = {6, 5, 8};
    float *logits[3], losses[3];
    const int n_mod = cf_nn_count_modules(awd);
    cf_rng *rng_after = malloc((size_t)n_mod * sizeof(cf_rng));
    cf_rng *rng_now = malloc((size_t)n_mod * sizeof(cf_rng));
    for (int k = 0; k < n; k++) {
        const int B = bs[k], T = steps[k];
        float *x = malloc((size_t)B * T * sizeof(float)), tg[4];
        cf_rng rng;
        cf_rng_seed(&rng, 70 + k);
        for (int b = 0; b < B; b++) {
            chunk_padded_row(x + b * T, T, lens[k][b], bptt, V, &rng);
            tg[b] = (float)cf_rng_below(&rng, n_class);
        }
        char name[32];
        snprintf(name, sizeof name, "x%d", k);
        oracle_put(&o, name, x, cf_shape2(B, T));
        snprintf(name, sizeof name, "t%d", k);
        oracle_put(&o, name, tg, cf_shape1(B));
        chunk_masks cm = {.o = &o, .batch = k, .V = V, .E = E, .NH = NH, .L = L};
        cf_nn_sentence_encoder_on_chunk(enc, put_chunk_masks, &cm);
        cf_tensor xt = cf_tensor_view(x, cf_shape2(B, T));
        const cf_tensor *y;
        assert_int_equal(cf_model_forward(model, &xt, &y), CF_OK);
        /* the shorter second batch runs within the first's plan (checked against PyTorch) */
        assert_int_equal(model->n_plans, 1);
        assert_int_equal(enc->out.shape.dim[1], kept[k]);
        assert_int_equal(y->shape.dim[0], B);
        assert_int_equal(y->shape.dim[1], n_class);
        /* the head's dropout masks, read off its dropouts' outputs */
        cf_module *layers = head->children[0];
        for (int i = 0; i < 2; i++) {
            const cf_module *drop = layers->children[i]->children[1];
            const float p = i == 0 ? cfg.output_p : ps[0];
            const size_t nf = cf_tensor_numel(&drop->out);
            float *mask = malloc(nf * sizeof(float));
            for (size_t j = 0; j < nf; j++) mask[j] = drop->out.data[j] == 0.0f ? 0 : 1 / (1 - p);
            snprintf(name, sizeof name, "b%d_hd%d", k, i);
            oracle_put(&o, name, mask, drop->out.shape);
            free(mask);
        }
        logits[k] = malloc((size_t)B * n_class * sizeof(float));
        memcpy(logits[k], y->data, (size_t)B * n_class * sizeof(float));
        cf_loss loss = {.kind = CF_LOSS_CROSS_ENTROPY};
        cf_tensor target = cf_tensor_view(tg, cf_shape1(B));
        assert_int_equal(cf_loss_forward(&loss, y, &target, &losses[k], NULL), CF_OK);
        float dl[4 * 3];
        cf_tensor dpred = cf_tensor_view(dl, y->shape);
        cf_loss_backward(&loss, y, &target, &dpred);
        cf_nn_rng_save(awd, rng_after);
        assert_int_equal(cf_model_backward(model, &dpred), CF_OK);
        /* the recomputation backward ran leaves the random streams as the forward did */
        cf_nn_rng_save(awd, rng_now);
        assert_memory_equal(rng_after, rng_now, (size_t)n_mod * sizeof(cf_rng));
        free(x);
    }
    cf_nn_sentence_encoder_on_chunk(enc, NULL, NULL);
    free(rng_after);
    free(rng_now);
    char args[96];
    snprintf(args, sizeof args, "clas %d %d %d %d %d %d %d %d %d", V, E, NH, L, bptt, max_len, n,
             lin_ftrs[0], n_class);
    oracle_run(&o, "lstm.py", args);
    check_batches(&o, n, logits, losses, NULL);
    assert_grads_match_oracle(&o, model, NULL);
    oracle_cleanup(&o);
    cf_model_free(model);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lstm_sizes),
        cmocka_unit_test(test_lstm_truncated_bptt),
        cmocka_unit_test(test_awd_lstm_lm),
        cmocka_unit_test(test_rnn_regularizer),
        cmocka_unit_test(test_weight_dropout_semantics),
        cmocka_unit_test(test_embedding_dropout_semantics),
        cmocka_unit_test(test_text_classifier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
