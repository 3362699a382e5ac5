/* fastai's TabularModel. */
#include "corefit/nn.h"
#include "nn_internal.h"
#include "zoo.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- TabularModel -------------------------------------------------------------------------- */

/* Children: "embeds" (ModuleList of Embedding), "emb_drop" (Dropout), "bn_cont" (BatchNorm1d,
 * when there are continuous columns and bn_cont), "layers" (Sequential of LinBnDrop blocks),
 * and the init hook. The input (N, n_cat + n_cont) is split here: column i feeds embeds.i. */
typedef struct tabular_impl {
    int n_cat, n_cont, n_emb, max_dim;
    int *dims; /* n_cat embedding sizes */
    cf_module *embeds, *emb_drop, *bn_cont, *layers;
    cf_tensor *codes; /* n_cat views (N): the code columns */
    /* arena memory; the tensors live here because layers keep a pointer to their input */
    cf_tensor emb, cont, feat, g_emb, g_slice, g_cont;
} tabular_impl;

static void tabular_destroy(cf_module *m) {
    tabular_impl *t = m->impl;
    if (!t) return;
    cf_free(t->dims);
    cf_free(t->codes);
}

static cf_status child_out_shape(cf_module *c, const cf_shape *in, cf_shape *out) {
    return c->ops->out_shape(c, in, out);
}

static void child_plan(cf_module *c, const cf_shape *in, cf_arena *arena) {
    if (c->ops->plan)
        c->ops->plan(c, in, arena);
    else
        cf_module_plan_default(c, in, arena);
}

static cf_status tabular_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    tabular_impl *t = m->impl;
    int f = t->n_cat + t->n_cont;
    if (in->ndim != 2 || in->dim[1] != f) {
        char s[64];
        return cf_fail(CF_ERR_INVALID,
                       "TabularModel: input %s is not (N, %d) (%d category codes, then %d "
                       "continuous values)",
                       cf_shape_str(in, s, sizeof s), f, t->n_cat, t->n_cont);
    }
    cf_shape feat = cf_shape2(in->dim[0], t->n_emb + t->n_cont);
    cf_status st = child_out_shape(t->layers, &feat, out);
    return st == CF_OK ? CF_OK : cf_fail_context(st, "in TabularModel layers");
}

static void tabular_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    tabular_impl *t = m->impl;
    int n = in->dim[0];
    size_t un = (size_t)n;
    cf_shape codes = cf_shape1(n);
    for (int i = 0; i < t->n_cat; i++) {
        child_plan(t->embeds->children[i], &codes, arena);
        t->codes[i].data = cf_arena_floats(arena, un);
        t->codes[i].shape = codes;
    }
    if (t->n_emb) {
        cf_shape es = cf_shape2(n, t->n_emb);
        child_plan(t->emb_drop, &es, arena);
        t->emb.data = cf_arena_floats(arena, un * (size_t)t->n_emb);
        t->g_emb.data = cf_arena_floats(arena, un * (size_t)t->n_emb);
        t->g_slice.data = cf_arena_floats(arena, un * (size_t)t->max_dim);
    }
    if (t->n_cont) {
        cf_shape cs = cf_shape2(n, t->n_cont);
        if (t->bn_cont) child_plan(t->bn_cont, &cs, arena);
        t->cont.data = cf_arena_floats(arena, un * (size_t)t->n_cont);
        t->g_cont.data = cf_arena_floats(arena, un * (size_t)t->n_cont);
    }
    cf_shape fs = cf_shape2(n, t->n_emb + t->n_cont);
    child_plan(t->layers, &fs, arena);
    t->feat.data = cf_arena_floats(arena, un * (size_t)(t->n_emb + t->n_cont));
    m->dx.data = cf_arena_floats(arena, cf_shape_numel(in));
    m->dx.shape = *in;
}

static const cf_tensor *run_forward(cf_module *c, const cf_tensor *x) {
    c->in = x;
    return c->ops->forward(c, x);
}

/* Copies columns [src_off, src_off + w) of an (n, src_cols) matrix into columns
 * [dst_off, dst_off + w) of an (n, dst_cols) one. */
static void copy_cols(float *dst, int dst_cols, int dst_off, const float *src, int src_cols,
                      int src_off, int n, int w) {
    for (int r = 0; r < n; r++)
        memcpy(dst + (size_t)r * dst_cols + dst_off, src + (size_t)r * src_cols + src_off,
               (size_t)w * sizeof(float));
}

static const cf_tensor *tabular_forward(cf_module *m, const cf_tensor *x) {
    tabular_impl *t = m->impl;
    m->in = x;
    int n = x->shape.dim[0], f = t->n_cat + t->n_cont, nf = t->n_emb + t->n_cont;
    t->feat.shape = cf_shape2(n, nf);
    if (t->n_emb) {
        t->emb.shape = cf_shape2(n, t->n_emb);
        for (int i = 0, off = 0; i < t->n_cat; off += t->dims[i], i++) {
            cf_tensor *c = &t->codes[i];
            c->shape = cf_shape1(n);
            for (int r = 0; r < n; r++) c->data[r] = x->data[(size_t)r * f + i];
            const cf_tensor *e = run_forward(t->embeds->children[i], c);
            copy_cols(t->emb.data, t->n_emb, off, e->data, t->dims[i], 0, n, t->dims[i]);
        }
        const cf_tensor *de = run_forward(t->emb_drop, &t->emb);
        copy_cols(t->feat.data, nf, 0, de->data, t->n_emb, 0, n, t->n_emb);
    }
    if (t->n_cont) {
        t->cont.shape = cf_shape2(n, t->n_cont);
        copy_cols(t->cont.data, t->n_cont, 0, x->data, f, t->n_cat, n, t->n_cont);
        const cf_tensor *c = t->bn_cont ? run_forward(t->bn_cont, &t->cont) : &t->cont;
        copy_cols(t->feat.data, nf, t->n_emb, c->data, t->n_cont, 0, n, t->n_cont);
    }
    return run_forward(t->layers, &t->feat);
}

static const cf_tensor *tabular_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    tabular_impl *t = m->impl;
    int n = dy->shape.dim[0], f = t->n_cat + t->n_cont, nf = t->n_emb + t->n_cont;
    const cf_tensor *g = t->layers->ops->backward(t->layers, dy, true);
    if (t->n_emb) {
        t->g_emb.shape = cf_shape2(n, t->n_emb);
        copy_cols(t->g_emb.data, t->n_emb, 0, g->data, nf, 0, n, t->n_emb);
        const cf_tensor *gd = t->emb_drop->ops->backward(t->emb_drop, &t->g_emb, true);
        for (int i = 0, off = 0; i < t->n_cat; off += t->dims[i], i++) {
            int d = t->dims[i];
            t->g_slice.shape = cf_shape2(n, d);
            copy_cols(t->g_slice.data, d, 0, gd->data, t->n_emb, off, n, d);
            cf_module *e = t->embeds->children[i];
            e->ops->backward(e, &t->g_slice, false);
        }
    }
    const cf_tensor *gc = NULL;
    if (t->n_cont) {
        t->g_cont.shape = cf_shape2(n, t->n_cont);
        copy_cols(t->g_cont.data, t->n_cont, 0, g->data, nf, t->n_emb, n, t->n_cont);
        gc = t->bn_cont ? t->bn_cont->ops->backward(t->bn_cont, &t->g_cont, need_dx) : &t->g_cont;
    }
    if (!need_dx) return NULL;
    cf_tensor *dx = cf_module_input_grad(m);
    for (int r = 0; r < n; r++)
        memset(dx->data + (size_t)r * f, 0, (size_t)t->n_cat * sizeof(float));
    if (gc) copy_cols(dx->data, f, t->n_cat, gc->data, t->n_cont, 0, n, t->n_cont);
    return dx;
}

static const cf_module_ops tabular_ops = {
    .kind = "TabularModel",
    .out_shape = tabular_out_shape,
    .plan = tabular_plan,
    .forward = tabular_forward,
    .backward = tabular_backward,
    .destroy = tabular_destroy,
};

cf_tabular_opts cf_tabular_defaults(void) {
    return (cf_tabular_opts){
        .n_layers = 2,
        .layers = {200, 100},
        .n_ps = 0,
        .embed_p = 0.0f,
        .use_bn = true,
        .bn_final = false,
        .bn_cont = true,
        .lin_first = true,
        .y_range = false,
    };
}

int cf_emb_sz_rule(int n_cat) {
    double v = rint(1.6 * pow((double)n_cat, 0.56)); /* Python's round: half to even */
    return v > 600.0 ? 600 : (int)v;
}

cf_module *cf_tabular_model(int n_cat, const int *cardinalities, const int *emb_dims, int n_cont,
                            int out_sz, const cf_tabular_opts *opts) {
    cf_tabular_opts o = opts ? *opts : cf_tabular_defaults();
    if (n_cat < 0 || n_cont < 0 || n_cat + n_cont < 1 || out_sz < 1 ||
        (n_cat > 0 && !cardinalities))
        return cf_fail(CF_ERR_INVALID,
                       "TabularModel: %d categorical and %d continuous columns, %d outputs", n_cat,
                       n_cont, out_sz),
               NULL;
    if (o.n_layers < 0 || o.n_layers > CF_TABULAR_MAX_LAYERS)
        return cf_fail(CF_ERR_INVALID, "TabularModel: %d layers (0..%d)", o.n_layers,
                       CF_TABULAR_MAX_LAYERS),
               NULL;
    if (o.n_ps != 0 && o.n_ps != 1 && o.n_ps != o.n_layers)
        return cf_fail(CF_ERR_INVALID, "TabularModel: %d dropout values for %d layers", o.n_ps,
                       o.n_layers),
               NULL;
    if (!(o.embed_p >= 0.0f && o.embed_p < 1.0f))
        return cf_fail(CF_ERR_INVALID, "TabularModel: embed_p %g not in [0, 1)", o.embed_p), NULL;
    tabular_impl *t = cf_calloc(1, sizeof *t);
    cf_module *m = t ? cf_module_new(&tabular_ops, t) : NULL;
    if (!m) return NULL;
    t->n_cat = n_cat;
    t->n_cont = n_cont;
    t->dims = cf_calloc((size_t)n_cat + 1, sizeof *t->dims);
    t->codes = cf_calloc((size_t)n_cat + 1, sizeof *t->codes);
    bool ok = t->dims && t->codes;
    cf_module *hook = cf_zoo_hook_new(CF_ZOO_PASS_NONE);
    if (!hook) ok = false;
    cf_module *embeds = ok ? cf_zoo_module_list() : NULL;
    if (!embeds) ok = false;
    for (int i = 0; i < n_cat && ok; i++) {
        if (cardinalities[i] < 1) {
            cf_fail(CF_ERR_INVALID, "TabularModel: category %d has %d classes", i,
                    cardinalities[i]);
            ok = false;
            break;
        }
        int d = emb_dims && emb_dims[i] > 0 ? emb_dims[i] : cf_emb_sz_rule(cardinalities[i]);
        t->dims[i] = d;
        t->n_emb += d;
        if (d > t->max_dim) t->max_dim = d;
        cf_module *e = cf_embedding(cardinalities[i], d);
        if (!e || !cf_zoo_hook_mark(hook, e, CF_ZOO_MARK_EMBEDDING)) {
            cf_module_free(e);
            ok = false;
            break;
        }
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        if (cf_module_add_child(embeds, e, name) != CF_OK) ok = false;
    }
    if (ok) {
        t->embeds = embeds;
        ok = cf_module_add_child(m, embeds, "embeds") == CF_OK;
    } else {
        cf_module_free(embeds);
    }
    if (ok) {
        t->emb_drop = cf_dropout(o.embed_p);
        ok = t->emb_drop && cf_module_add_child(m, t->emb_drop, "emb_drop") == CF_OK;
    }
    if (ok && n_cont > 0 && o.bn_cont) {
        t->bn_cont = cf_batchnorm1d(n_cont);
        ok = t->bn_cont && cf_module_add_child(m, t->bn_cont, "bn_cont") == CF_OK;
    }
    cf_module *layers = ok ? cf_sequential(0, NULL) : NULL;
    if (!layers) ok = false;
    int sizes[CF_TABULAR_MAX_LAYERS + 2];
    sizes[0] = t->n_emb + n_cont;
    for (int i = 0; i < o.n_layers; i++) sizes[i + 1] = o.layers[i];
    sizes[o.n_layers + 1] = out_sz;
    for (int i = 0; i <= o.n_layers && ok; i++) {
        bool last = i == o.n_layers;
        float p = last || o.n_ps == 0 ? 0.0f : o.ps[o.n_ps == 1 ? 0 : i];
        if (sizes[i + 1] < 1 || !(p >= 0.0f && p < 1.0f)) {
            cf_fail(CF_ERR_INVALID, "TabularModel: layer %d has %d units and dropout %g", i,
                    sizes[i + 1], p);
            ok = false;
            break;
        }
        cf_module *block = cf_sequential(0, NULL);
        bool bok = block != NULL;
        cf_zoo_lin_bn_drop(block, hook, &bok, sizes[i], sizes[i + 1],
                           o.use_bn && (!last || o.bn_final), p, !last, o.lin_first);
        if (!bok) {
            cf_module_free(block);
            block = NULL;
        }
        cf_zoo_add(layers, &ok, block);
    }
    if (o.y_range) cf_zoo_add(layers, &ok, cf_nn_sigmoid_range(o.y_lo, o.y_hi));
    if (ok) {
        t->layers = layers;
        ok = cf_module_add_child(m, layers, "layers") == CF_OK;
    } else {
        cf_module_free(layers);
    }
    if (ok) {
        cf_zoo_hook_target(hook, m);
        ok = cf_module_add_child(m, hook, "init") == CF_OK;
    } else {
        cf_module_free(hook);
    }
    if (!ok) {
        cf_module_free(m);
        cf_fail_context(CF_ERR_INVALID, "TabularModel(%d categories, %d continuous)", n_cat,
                        n_cont);
        return NULL;
    }
    return m;
}
