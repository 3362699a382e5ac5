/* LSTM (one layer, batch first, PyTorch's nn.LSTM gates i, f, g, o) with its hidden state
 * carried between forwards and detached, and fastai's WeightDropout on its hidden-to-hidden
 * weights.
 *
 * Forward over a batch (B, T, I): the input projection of the whole sequence is one GEMM,
 * G = X W_ih^T + b_ih + b_hh (B*T rows of 4H); then each row of the batch runs through time on
 * its own (the rows are independent, so the thread pool splits them once for all T steps): at
 * step t, G_t += h_{t-1} W_hh^T (a GEMM over the thread's rows) and the cell kernel
 * (cf_lstm_cell_forward) turns G_t into the gate activations, c_t and h_t. Backward runs the
 * rows back through time the same way (cell backward, then dh_{t-1} = dG_t W_hh), leaving dG in
 * place of the activations, and then the weight gradients and dX are large GEMMs over dG. */
#include "corefit/nn.h"
#include "rnn_internal.h"

#include <math.h>
#include <string.h>

/* ---- GEMM with the rows of C split over the pool ------------------------------------------- */

typedef struct par_gemm {
    bool ta, tb, bf16;
    int m, n, k, lda, ldb, ldc;
    const float *a, *b;
    float beta;
    float *c;
} par_gemm;

static void par_gemm_range(void *ctx, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const par_gemm *g = ctx;
    if (hi <= lo) return;
    /* row i of op(A): row i of A, or column i of A transposed */
    const float *a = g->a + (g->ta ? (size_t)lo : (size_t)lo * g->lda);
    if (g->bf16) { /* beta is 0 or 1 here */
        cf_sgemm_bf16(g->ta, g->tb, (int)(hi - lo), g->n, g->k, a, g->lda, g->b, g->ldb,
                      g->c + (size_t)lo * g->ldc, g->ldc, g->beta != 0.0f);
        return;
    }
    cf_sgemm(g->ta, g->tb, (int)(hi - lo), g->n, g->k, 1.0f, a, g->lda, g->b, g->ldb, g->beta,
             g->c + (size_t)lo * g->ldc, g->ldc);
}

static void par_gemm_run(bool bf16, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                         int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    par_gemm g = {trans_a, trans_b, bf16, m, n, k, lda, ldb, ldc, a, b, beta, c};
    if (cf_get_num_threads() <= 1 || (int64_t)m * n * k < (1 << 20))
        par_gemm_range(&g, 0, m, 0);
    else
        cf_parallel_for(m, par_gemm_range, &g);
}

void cf_nn_par_sgemm(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc) {
    par_gemm_run(false, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

void cf_nn_par_gemm(bool bf16, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                    int lda, const float *b, int ldb, bool accumulate, float *c, int ldc) {
    par_gemm_run(bf16, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

/* ---- LSTM ---------------------------------------------------------------------------------- */

typedef struct lstm_impl {
    int in, hid;
    /* parameters (indices into m->params; hh -1 when WeightDropout holds the weight) */
    int p_ih, p_hh, p_bih, p_bhh;
    const float *w_hh; /* set by WeightDropout for each forward (NULL: own parameter) */
    float *dw_hh;      /* where WeightDropout wants dW_hh added (NULL: no gradient) */
    bool wrapped;      /* the weight belongs to a WeightDropout */
    bool bf16;         /* the whole-sequence products in bf16 with fp32 sums (cf_lstm_set_bf16) */
    /* the carried state (heap: it outlives re-plans), state_rows rows in use */
    float *h, *c;
    int state_rows, state_cap;
    /* arena, for the planned capacity */
    float *gates, *cells, *h0, *c0, *dhr, *dc;
    int batch, steps; /* of the last forward */
    /* W_hh packed for cf_sgemm_packed (heap; NULL: cf_sgemm packs at every step) */
    float *packed;
    size_t packed_cap;
} lstm_impl;

static cf_status lstm_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    lstm_impl *l = m->impl;
    if (in->ndim != 3 || in->dim[2] != l->in) {
        char s[64];
        return cf_fail(CF_ERR_INVALID, "LSTM(%d, %d): input %s does not fit (expected (B, T, %d))",
                       l->in, l->hid, cf_shape_str(in, s, sizeof s), l->in);
    }
    *out = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], l->hid}};
    return CF_OK;
}

static void lstm_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    lstm_impl *l = m->impl;
    const size_t bt = (size_t)in->dim[0] * in->dim[1], b = (size_t)in->dim[0], h = l->hid;
    m->out.data = cf_arena_floats(arena, bt * h);
    m->out.shape = (cf_shape){.ndim = 3, .dim = {in->dim[0], in->dim[1], l->hid}};
    m->dx.data = cf_arena_floats(arena, cf_shape_numel(in)); /* own memory (grad_arena NULL) */
    m->dx.shape = *in;
    m->grad_arena = NULL;
    l->gates = cf_arena_floats(arena, bt * 4 * h);
    l->cells = cf_arena_floats(arena, bt * h);
    l->h0 = cf_arena_floats(arena, b * h);
    l->c0 = cf_arena_floats(arena, b * h);
    l->dhr = cf_arena_floats(arena, b * h);
    l->dc = cf_arena_floats(arena, b * h);
}

/* PyTorch's reset_parameters: every parameter U(-1/sqrt(hidden), 1/sqrt(hidden)). */
static void lstm_init(cf_module *m, cf_rng *rng) {
    lstm_impl *l = m->impl;
    const double bound = 1.0 / sqrt((double)l->hid);
    for (int i = 0; i < m->n_params; i++) {
        cf_param *p = &m->params[i];
        for (size_t k = 0; k < p->numel; k++)
            p->data[k] = (float)(bound * (2.0 * cf_rng_uniform(rng) - 1.0));
    }
}

/* fastai's _change_hidden: a batch of other size keeps the first rows or zero-pads new ones. */
static bool lstm_resize_state(lstm_impl *l, int rows) {
    const size_t h = l->hid;
    if (rows > l->state_cap) {
        float *nh = cf_calloc((size_t)rows * h, sizeof(float));
        float *nc = cf_calloc((size_t)rows * h, sizeof(float));
        if (!nh || !nc) {
            cf_free(nh);
            cf_free(nc);
            return false;
        }
        if (l->h) {
            memcpy(nh, l->h, (size_t)l->state_rows * h * sizeof(float));
            memcpy(nc, l->c, (size_t)l->state_rows * h * sizeof(float));
        }
        cf_free(l->h);
        cf_free(l->c);
        l->h = nh;
        l->c = nc;
        l->state_cap = rows;
    }
    if (rows > l->state_rows) {
        memset(l->h + (size_t)l->state_rows * h, 0, (size_t)(rows - l->state_rows) * h * 4);
        memset(l->c + (size_t)l->state_rows * h, 0, (size_t)(rows - l->state_rows) * h * 4);
    }
    l->state_rows = rows;
    return true;
}

typedef struct lstm_pass {
    lstm_impl *l;
    const float *w_hh;
    const float *packed; /* w_hh packed (W_hh^T forward, W_hh backward), or NULL */
    const float *dy;     /* backward */
    float *y;
} lstm_pass;

static void lstm_forward_rows(void *ctx, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const lstm_pass *p = ctx;
    const lstm_impl *l = p->l;
    const int T = l->steps, H = l->hid, rows = (int)(hi - lo);
    if (rows <= 0) return;
    const size_t gs = (size_t)T * 4 * H, hs = (size_t)T * H; /* row strides over the batch */
    for (int t = 0; t < T; t++) {
        float *g = l->gates + (size_t)lo * gs + (size_t)t * 4 * H;
        const float *hp = t == 0 ? l->h0 + (size_t)lo * H : p->y + (size_t)lo * hs + (t - 1) * H;
        const int ldh = t == 0 ? H : (int)hs;
        if (p->packed)
            cf_sgemm_packed(rows, 4 * H, H, hp, ldh, p->packed, g, (int)gs, true);
        else
            cf_sgemm(false, true, rows, 4 * H, H, 1.0f, hp, ldh, p->w_hh, H, 1.0f, g, (int)gs);
        for (int64_t b = lo; b < hi; b++) {
            const float *cp = t == 0 ? l->c0 + b * H : l->cells + b * hs + (t - 1) * H;
            cf_lstm_cell_forward(H, l->gates + b * gs + (size_t)t * 4 * H, cp,
                                 l->cells + b * hs + (size_t)t * H, p->y + b * hs + (size_t)t * H);
        }
    }
}

static const float *lstm_w_hh(const cf_module *m) {
    const lstm_impl *l = m->impl;
    return l->wrapped ? l->w_hh : m->params[l->p_hh].data;
}

/* ---- the recurrent weight packed once a pass ------------------------------------------------ *
 * The recurrent products of all T steps share W_hh (WeightDropout's mask is drawn once a
 * forward), so it is packed once: forward as W_hh^T (H x 4H), backward as W_hh (4H x H) for
 * dh = dG W_hh, into the same buffer. Column panels are packed in parallel. */

typedef struct pack_job {
    bool trans;
    int n, k, ldb, nr;
    const float *b;
    float *packed;
} pack_job;

static void pack_range(void *ctx, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const pack_job *j = ctx;
    const int64_t j0 = lo * j->nr, j1 = hi * j->nr < j->n ? hi * j->nr : j->n;
    if (j1 <= j0) return;
    cf_sgemm_pack_b(j->trans, (int)(j1 - j0), j->k, j->trans ? j->b + j0 * j->ldb : j->b + j0,
                    j->ldb, j->packed + (size_t)lo * j->k * j->nr);
}

/* Packs op(W_hh) (trans: W_hh^T, k = H, n = 4H; else W_hh, k = 4H, n = H); NULL when there is
 * no memory for it (the products then go to cf_sgemm). */
static const float *lstm_pack(lstm_impl *l, const float *w_hh, bool trans) {
    const int H = l->hid, n = trans ? 4 * H : H, k = trans ? H : 4 * H;
    const size_t need = cf_sgemm_packed_floats(n, k);
    if (need > l->packed_cap) {
        /* both layouts fit, whichever comes first */
        const size_t both =
            need > cf_sgemm_packed_floats(k, n) ? need : cf_sgemm_packed_floats(k, n);
        float *buf = cf_malloc(both * sizeof(float));
        if (!buf) return NULL;
        cf_free(l->packed);
        l->packed = buf;
        l->packed_cap = both;
    }
    pack_job j = {trans, n, k, H, cf_sgemm_packed_nr(), w_hh, l->packed};
    const int64_t panels = (n + j.nr - 1) / j.nr;
    if (cf_get_num_threads() <= 1)
        pack_range(&j, 0, panels, 0);
    else
        cf_parallel_for(panels, pack_range, &j);
    return l->packed;
}

static const cf_tensor *lstm_forward(cf_module *m, const cf_tensor *x) {
    lstm_impl *l = m->impl;
    m->in = x;
    const int B = x->shape.dim[0], T = x->shape.dim[1], H = l->hid, I = l->in;
    cf_tensor *y = cf_module_output(m, &(cf_shape){.ndim = 3, .dim = {B, T, H}});
    l->batch = B;
    l->steps = T;
    if (!lstm_resize_state(l, B)) { /* out of memory: start from zeros without carrying */
        memset(l->h0, 0, (size_t)B * H * sizeof(float));
        memset(l->c0, 0, (size_t)B * H * sizeof(float));
    } else {
        memcpy(l->h0, l->h, (size_t)B * H * sizeof(float));
        memcpy(l->c0, l->c, (size_t)B * H * sizeof(float));
    }
    const float *bih = m->params[l->p_bih].data, *bhh = m->params[l->p_bhh].data;
    const size_t rows = (size_t)B * T;
    for (size_t r = 0; r < rows; r++) {
        float *g = l->gates + r * 4 * H;
        for (int j = 0; j < 4 * H; j++) g[j] = bih[j] + bhh[j];
    }
    cf_nn_par_gemm(l->bf16, false, true, (int)rows, 4 * H, I, x->data, I, m->params[l->p_ih].data,
                   I, true, l->gates, 4 * H);
    lstm_pass p = {.l = l, .w_hh = lstm_w_hh(m), .y = y->data};
    p.packed = lstm_pack(l, p.w_hh, true);
    if (cf_get_num_threads() <= 1)
        lstm_forward_rows(&p, 0, B, 0);
    else
        cf_parallel_for(B, lstm_forward_rows, &p);
    if (l->state_rows == B) /* the new state, detached: the last step's h and c */
        for (int b = 0; b < B; b++) {
            memcpy(l->h + (size_t)b * H, y->data + ((size_t)b * T + T - 1) * H, H * 4);
            memcpy(l->c + (size_t)b * H, l->cells + ((size_t)b * T + T - 1) * H, H * 4);
        }
    return y;
}

static void lstm_backward_rows(void *ctx, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const lstm_pass *p = ctx;
    const lstm_impl *l = p->l;
    const int T = l->steps, H = l->hid, rows = (int)(hi - lo);
    if (rows <= 0) return;
    const size_t gs = (size_t)T * 4 * H, hs = (size_t)T * H;
    memset(l->dc + (size_t)lo * H, 0, (size_t)rows * H * sizeof(float));
    for (int t = T - 1; t >= 0; t--) {
        for (int64_t b = lo; b < hi; b++) {
            const float *cp = t == 0 ? l->c0 + b * H : l->cells + b * hs + (t - 1) * H;
            cf_lstm_cell_backward(H, l->gates + b * gs + (size_t)t * 4 * H, cp,
                                  l->cells + b * hs + (size_t)t * H, p->dy + b * hs + (size_t)t * H,
                                  t == T - 1 ? NULL : l->dhr + b * H, l->dc + b * H);
        }
        if (t > 0 && p->packed) /* dh_{t-1} through the recurrence (none into the detached state) */
            cf_sgemm_packed(rows, H, 4 * H, l->gates + (size_t)lo * gs + t * 4 * H, (int)gs,
                            p->packed, l->dhr + (size_t)lo * H, H, false);
        else if (t > 0)
            cf_sgemm(false, false, rows, H, 4 * H, 1.0f, l->gates + (size_t)lo * gs + t * 4 * H,
                     (int)gs, p->w_hh, H, 0.0f, l->dhr + (size_t)lo * H, H);
    }
}

static const cf_tensor *lstm_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    lstm_impl *l = m->impl;
    const cf_tensor *x = m->in;
    const int B = l->batch, T = l->steps, H = l->hid, I = l->in;
    const float *w_hh = lstm_w_hh(m);
    lstm_pass p = {.l = l, .w_hh = w_hh, .dy = dy->data, .y = m->out.data};
    p.packed = T > 1 ? lstm_pack(l, w_hh, false) : NULL;
    if (cf_get_num_threads() <= 1)
        lstm_backward_rows(&p, 0, B, 0);
    else
        cf_parallel_for(B, lstm_backward_rows, &p);
    const float *dg = l->gates; /* now dL/d(pre-activations), (B*T, 4H) */
    const int rows = B * T;
    cf_param *wih = &m->params[l->p_ih];
    if (wih->trainable) /* dW_ih += dG^T X */
        cf_nn_par_gemm(l->bf16, true, false, 4 * H, I, rows, dg, 4 * H, x->data, I, true, wih->grad,
                       I);
    float *dwhh =
        l->wrapped ? l->dw_hh : (m->params[l->p_hh].trainable ? m->params[l->p_hh].grad : NULL);
    if (dwhh) { /* dW_hh += sum over b, t of dG[b, t]^T h[b, t - 1] */
        /* As rows r = b * T + t of (B * T, .), h[b, t - 1] is y's row r - 1 except at t = 0,
         * where the row before is y[b - 1, T - 1] instead of h0[b]: one GEMM over every row
         * pair (r, r - 1), then the t = 0 rows corrected with h0[b] - y[b - 1, T - 1] (in dhr,
         * free now). One large GEMM instead of one per batch row, each of which read and
         * wrote the whole 4H x H gradient. */
        const size_t gs = (size_t)T * 4 * H, hs = (size_t)T * H;
        const float *y = m->out.data;
        float *corr = l->dhr;
        if (l->bf16) {
            /* bf16(h0 - y) is not bf16(h0) - bf16(y): the t = 0 rows get dG^T h0 and
             * dG^T (-y[b - 1, T - 1]) as two products, so every term is bf16(dG) bf16(h_prev)
             * (a product of two bf16 values is exact in fp32: the wrong pairs cancel) */
            cf_nn_par_gemm(true, true, false, 4 * H, H, B, dg, (int)gs, l->h0, H, true, dwhh, H);
            for (int b = 0; b < B; b++)
                for (int j = 0; j < H; j++)
                    corr[(size_t)b * H + j] = b > 0 ? -y[(size_t)(b - 1) * hs + hs - H + j] : 0.0f;
        } else
            for (int b = 0; b < B; b++)
                for (int j = 0; j < H; j++)
                    corr[(size_t)b * H + j] = l->h0[(size_t)b * H + j] -
                                              (b > 0 ? y[(size_t)(b - 1) * hs + hs - H + j] : 0);
        cf_nn_par_gemm(l->bf16, true, false, 4 * H, H, B, dg, (int)gs, corr, H, true, dwhh, H);
        if (rows > 1)
            cf_nn_par_gemm(l->bf16, true, false, 4 * H, H, rows - 1, dg + 4 * H, 4 * H, y, H, true,
                           dwhh, H);
    }
    cf_param *bi = &m->params[l->p_bih], *bh = &m->params[l->p_bhh];
    if (bi->trainable || bh->trainable)
        for (int r = 0; r < rows; r++) {
            const float *g = dg + (size_t)r * 4 * H;
            if (bi->trainable)
                for (int j = 0; j < 4 * H; j++) bi->grad[j] += g[j];
            if (bh->trainable)
                for (int j = 0; j < 4 * H; j++) bh->grad[j] += g[j];
        }
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m); /* dX = dG W_ih */
    cf_nn_par_gemm(l->bf16, false, false, rows, I, 4 * H, dg, 4 * H, wih->data, I, false, dx->data,
                   I);
    return dx;
}

static void lstm_destroy(cf_module *m) {
    lstm_impl *l = m->impl;
    cf_free(l->h);
    cf_free(l->c);
    cf_free(l->packed);
}

static const cf_module_ops lstm_ops = {
    .kind = "LSTM",
    .out_shape = lstm_out_shape,
    .plan = lstm_plan,
    .init = lstm_init,
    .forward = lstm_forward,
    .backward = lstm_backward,
    .destroy = lstm_destroy,
};

bool cf_nn_is_lstm(const cf_module *m) {
    return m && m->ops == &lstm_ops;
}

bool cf_nn_lstm_set_bf16(cf_module *m, bool on) {
    if (!cf_nn_is_lstm(m)) return false;
    ((lstm_impl *)m->impl)->bf16 = on;
    return true;
}

cf_module *cf_lstm(int input_size, int hidden_size) {
    if (input_size < 1 || hidden_size < 1) {
        cf_fail(CF_ERR_INVALID, "cf_lstm: input_size %d and hidden_size %d must be >= 1",
                input_size, hidden_size);
        return NULL;
    }
    lstm_impl *l = cf_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->in = input_size;
    l->hid = hidden_size;
    l->p_ih = 0;
    l->p_hh = 1;
    l->p_bih = 2;
    l->p_bhh = 3;
    cf_module *m = cf_module_new(&lstm_ops, l);
    if (!m) return NULL;
    cf_module_add_param(m, "weight_ih_l0", CF_PARAM_WEIGHT, cf_shape2(4 * hidden_size, input_size));
    cf_module_add_param(m, "weight_hh_l0", CF_PARAM_WEIGHT,
                        cf_shape2(4 * hidden_size, hidden_size));
    /* weight decay applies to an LSTM's biases (fastai skips only norm and Linear biases) */
    cf_module_add_param(m, "bias_ih_l0", CF_PARAM_WEIGHT, cf_shape1(4 * hidden_size));
    cf_module_add_param(m, "bias_hh_l0", CF_PARAM_WEIGHT, cf_shape1(4 * hidden_size));
    return m;
}

/* ---- the carried state --------------------------------------------------------------------- */

static void rnn_reset_tree(cf_module *m) {
    if (cf_nn_is_lstm(m)) {
        lstm_impl *l = m->impl;
        if (l->h) {
            memset(l->h, 0, (size_t)l->state_cap * l->hid * sizeof(float));
            memset(l->c, 0, (size_t)l->state_cap * l->hid * sizeof(float));
        }
    }
    for (int i = 0; i < m->n_children; i++) rnn_reset_tree(m->children[i]);
}

void cf_rnn_reset(cf_module *m) {
    if (m) rnn_reset_tree(m);
}

size_t cf_nn_rnn_state_floats(const cf_module *m, int rows) {
    size_t n = 0;
    if (cf_nn_is_lstm(m)) n += 1 + 2 * (size_t)rows * ((const lstm_impl *)m->impl)->hid;
    for (int i = 0; i < m->n_children; i++) n += cf_nn_rnn_state_floats(m->children[i], rows);
    return n;
}

static float *state_save(const cf_module *m, float *buf) {
    if (cf_nn_is_lstm(m)) {
        const lstm_impl *l = m->impl;
        const size_t n = (size_t)l->state_rows * l->hid;
        *buf++ = (float)l->state_rows;
        if (n) {
            memcpy(buf, l->h, n * sizeof(float));
            memcpy(buf + n, l->c, n * sizeof(float));
        }
        buf += 2 * n;
    }
    for (int i = 0; i < m->n_children; i++) buf = state_save(m->children[i], buf);
    return buf;
}

void cf_nn_rnn_state_save(const cf_module *m, float *buf) {
    state_save(m, buf);
}

static const float *state_restore(cf_module *m, const float *buf) {
    if (cf_nn_is_lstm(m)) {
        lstm_impl *l = m->impl;
        const int rows = (int)*buf++;
        /* rows never exceed what the state held when it was saved: no allocation here */
        if (rows <= l->state_cap) {
            l->state_rows = rows;
            const size_t n = (size_t)rows * l->hid;
            if (n) {
                memcpy(l->h, buf, n * sizeof(float));
                memcpy(l->c, buf + n, n * sizeof(float));
            }
        }
        buf += 2 * (size_t)rows * l->hid;
    }
    for (int i = 0; i < m->n_children; i++) buf = state_restore(m->children[i], buf);
    return buf;
}

void cf_nn_rnn_state_restore(cf_module *m, const float *buf) {
    state_restore(m, buf);
}

int cf_nn_count_modules(const cf_module *m) {
    int n = 1;
    for (int i = 0; i < m->n_children; i++) n += cf_nn_count_modules(m->children[i]);
    return n;
}

static const cf_rng *rng_restore(cf_module *m, const cf_rng *in) {
    m->rng = *in++;
    for (int i = 0; i < m->n_children; i++) in = rng_restore(m->children[i], in);
    return in;
}

static cf_rng *rng_save(const cf_module *m, cf_rng *out) {
    *out++ = m->rng;
    for (int i = 0; i < m->n_children; i++) out = rng_save(m->children[i], out);
    return out;
}

void cf_nn_rng_save(const cf_module *m, cf_rng *out) {
    rng_save(m, out);
}

void cf_nn_rng_restore(cf_module *m, const cf_rng *in) {
    rng_restore(m, in);
}

/* ---- WeightDropout ------------------------------------------------------------------------- *
 * fastai's WeightDropout(module, weight_p, 'weight_hh_l0'): the LSTM's hidden-to-hidden weight
 * becomes this module's parameter "weight_hh_l0_raw"; every training forward draws a fresh
 * element-wise mask (inside a fit from the model's draw key: epoch, batch position and run, the
 * same on every process) (PyTorch's F.dropout: kept with probability 1 - p, scaled by 1 / (1 - p))
 * and runs the LSTM (child "module") on raw * mask; eval runs it on raw. The gradient of raw is
 * the LSTM's weight gradient times the mask. */

typedef struct weight_dropout_impl {
    float p;
    size_t n;            /* 4H * H */
    float *mask;         /* scaled mask of the last training forward (heap) */
    float *dropped, *dw; /* the weights the LSTM ran on, and its gradient of them (heap) */
    bool masked;
} weight_dropout_impl;

static cf_module *wd_lstm(const cf_module *m) {
    return m->children[0];
}

static cf_status wd_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    cf_module *c = wd_lstm(m);
    return c->ops->out_shape(c, in, out);
}

static void wd_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    cf_module *c = wd_lstm(m);
    c->ops->plan(c, in, arena);
    m->grad_arena = NULL;
}

/* the raw weight starts as the LSTM's own would (U(+-1/sqrt(H))) */
static void wd_init(cf_module *m, cf_rng *rng) {
    const lstm_impl *l = wd_lstm(m)->impl;
    const double bound = 1.0 / sqrt((double)l->hid);
    cf_param *p = &m->params[0];
    for (size_t k = 0; k < p->numel; k++)
        p->data[k] = (float)(bound * (2.0 * cf_rng_uniform(rng) - 1.0));
}

static const cf_tensor *wd_forward(cf_module *m, const cf_tensor *x) {
    weight_dropout_impl *w = m->impl;
    cf_module *c = wd_lstm(m);
    lstm_impl *l = c->impl;
    const float *raw = m->params[0].data;
    m->in = x;
    w->masked = m->training && w->p > 0.0f;
    if (w->masked) {
        const uint64_t threshold = (uint64_t)llround((double)w->p * 4294967296.0);
        const float scale = w->p < 1.0f ? 1.0f / (1.0f - w->p) : 0.0f;
        /* inside a fit, from (module, epoch, batch position): the same on every process */
        cf_rng keyed;
        cf_rng *rng = cf_nn_keyed_rng(m, x->shape.dim[0], -1, &keyed) ? &keyed : &m->rng;
        for (size_t i = 0; i < w->n; i += 2) {
            const uint64_t r = cf_rng_next(rng);
            w->mask[i] = (r & 0xffffffffu) >= threshold ? scale : 0.0f;
            if (i + 1 < w->n) w->mask[i + 1] = (r >> 32) >= threshold ? scale : 0.0f;
        }
        for (size_t i = 0; i < w->n; i++) w->dropped[i] = raw[i] * w->mask[i];
        l->w_hh = w->dropped;
    } else {
        l->w_hh = raw;
    }
    c->in = x;
    return c->ops->forward(c, x);
}

static const cf_tensor *wd_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    weight_dropout_impl *w = m->impl;
    cf_module *c = wd_lstm(m);
    lstm_impl *l = c->impl;
    cf_param *raw = &m->params[0];
    if (!raw->trainable)
        l->dw_hh = NULL;
    else if (w->masked) {
        memset(w->dw, 0, w->n * sizeof(float));
        l->dw_hh = w->dw;
    } else
        l->dw_hh = raw->grad;
    const cf_tensor *dx = c->ops->backward(c, dy, need_dx);
    if (raw->trainable && w->masked)
        for (size_t i = 0; i < w->n; i++) raw->grad[i] += w->dw[i] * w->mask[i];
    return dx;
}

static void wd_destroy(cf_module *m) {
    weight_dropout_impl *w = m->impl;
    cf_free(w->mask);
    cf_free(w->dropped);
    cf_free(w->dw);
}

static const cf_module_ops weight_dropout_ops = {
    .kind = "WeightDropout",
    .out_shape = wd_out_shape,
    .plan = wd_plan,
    .init = wd_init,
    .forward = wd_forward,
    .backward = wd_backward,
    .destroy = wd_destroy,
};

cf_module *cf_weight_dropout(cf_module *lstm, float weight_p) {
    if (!cf_nn_is_lstm(lstm) || ((lstm_impl *)lstm->impl)->wrapped) {
        cf_fail(CF_ERR_INVALID, "cf_weight_dropout: the module is not an unwrapped LSTM");
        cf_module_free(lstm);
        return NULL;
    }
    if (!(weight_p >= 0.0f && weight_p <= 1.0f)) {
        cf_fail(CF_ERR_INVALID, "cf_weight_dropout: weight_p %g must be in [0, 1]",
                (double)weight_p);
        cf_module_free(lstm);
        return NULL;
    }
    lstm_impl *l = lstm->impl;
    const size_t n = (size_t)4 * l->hid * l->hid;
    weight_dropout_impl *w = cf_calloc(1, sizeof *w);
    float *mask = cf_malloc(n * sizeof(float)), *dropped = cf_malloc(n * sizeof(float)),
          *dw = cf_malloc(n * sizeof(float));
    if (!w || !mask || !dropped || !dw) {
        cf_free(w);
        cf_free(mask);
        cf_free(dropped);
        cf_free(dw);
        cf_module_free(lstm);
        cf_fail(CF_ERR_NOMEM, "cf_weight_dropout: no memory for a %d x %d mask", 4 * l->hid,
                l->hid);
        return NULL;
    }
    *w = (weight_dropout_impl){.p = weight_p, .n = n, .mask = mask, .dropped = dropped, .dw = dw};
    cf_module *m = cf_module_new(&weight_dropout_ops, w);
    if (!m) { /* cf_module_new freed w */
        cf_free(mask);
        cf_free(dropped);
        cf_free(dw);
        cf_module_free(lstm);
        return NULL;
    }
    cf_module_add_param(m, "weight_hh_l0_raw", CF_PARAM_WEIGHT, cf_shape2(4 * l->hid, l->hid));
    /* the LSTM gives its hidden-to-hidden weight up: weight_ih_l0, bias_ih_l0, bias_hh_l0 */
    lstm->params[1] = lstm->params[2];
    lstm->params[2] = lstm->params[3];
    lstm->n_params = 3;
    l->p_hh = -1;
    l->p_bih = 1;
    l->p_bhh = 2;
    l->wrapped = true;
    if (cf_module_add_child(m, lstm, "module") != CF_OK) {
        cf_module_free(m);
        return NULL;
    }
    return m;
}

const float *cf_nn_weight_dropout_mask(const cf_module *m) {
    if (!m || m->ops != &weight_dropout_ops) return NULL;
    const weight_dropout_impl *w = m->impl;
    return w->masked ? w->mask : NULL;
}
