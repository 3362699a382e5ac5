/* Sequential: its children in order. */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <stdio.h>

static cf_status seq_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    cf_shape s = *in;
    for (int i = 0; i < m->n_children; i++) {
        cf_shape next;
        cf_status st = cf_nn_module_out_shape(m->children[i], &s, &next);
        if (st != CF_OK) return cf_fail_context(st, "in Sequential child %s", m->child_names[i]);
        s = next;
    }
    *out = s;
    return CF_OK;
}

static void seq_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    m->grad_arena = arena; /* where the children's gradients are given back */
    cf_shape s = *in;
    for (int i = 0; i < m->n_children; i++) {
        cf_shape next;
        cf_nn_module_plan(m->children[i], &s, arena);
        cf_nn_module_out_shape(m->children[i], &s, &next);
        s = next;
    }
}

const cf_tensor *cf_nn_seq_forward_range(cf_module *m, const cf_tensor *x, int lo, int hi) {
    for (int i = lo; i < hi; i++) {
        cf_module *c = m->children[i];
        c->in = x;
        x = c->ops->forward(c, x);
    }
    return x;
}

static const cf_tensor *seq_forward(cf_module *m, const cf_tensor *x) {
    m->in = x;
    return cf_nn_seq_forward_range(m, x, 0, m->n_children);
}

const cf_tensor *cf_nn_seq_backward_range(cf_module *m, const cf_tensor *dy, int lo, int hi,
                                          bool need_dx) {
    const float *given = dy->data; /* the caller's */
    /* a BatchNorm's upstream gradient that the convolution before it still reads, making the
     * BatchNorm's dx from it in its own backward (the stem dx link, nn_internal.h) */
    const float *held = NULL;
    for (int i = hi - 1; i >= lo; i--) {
        cf_module *c = m->children[i];
        cf_nn_bn_dy_held(c, i > lo ? m->children[i - 1] : NULL); /* held below until then */
        const cf_tensor *dx = c->ops->backward(c, dy, i > lo || need_dx);
        if (held) cf_module_give_grad(m, held, dx ? dx->data : NULL);
        held = NULL;
        /* the child has read its upstream gradient: a block a later child returned is dead
         * unless it passed through (the same memory) */
        if (dy->data != given && cf_nn_bn_left_dx(c))
            held = dy->data;
        else if (dy->data != given)
            cf_module_give_grad(m, dy->data, dx ? dx->data : NULL);
        dy = dx;
    }
    return need_dx ? dy : NULL;
}

static const cf_tensor *seq_backward(cf_module *m, const cf_tensor *dy, bool need_dx) {
    return cf_nn_seq_backward_range(m, dy, 0, m->n_children, need_dx);
}

static const cf_module_ops sequential_ops = {
    .kind = "Sequential",
    .out_shape = seq_out_shape,
    .plan = seq_plan,
    .forward = seq_forward,
    .backward = seq_backward,
};

bool cf_nn_is_sequential(const cf_module *m) {
    return m && m->ops == &sequential_ops;
}

cf_module *cf_sequential(int n, cf_module *const *children) {
    cf_module *m = cf_module_new(&sequential_ops, NULL);
    for (int i = 0; i < n; i++) {
        if (!m || !children[i] || cf_sequential_append(m, children[i]) != CF_OK) {
            for (int j = i + (m && children[i] ? 1 : 0); j < n; j++) cf_module_free(children[j]);
            cf_module_free(m);
            if (!children[i]) cf_fail_context(CF_ERR_INVALID, "Sequential child %d", i);
            return NULL;
        }
    }
    return m;
}

cf_status cf_sequential_append(cf_module *seq, cf_module *child) {
    if (!child) return cf_fail(CF_ERR_INVALID, "cf_sequential_append: NULL child");
    char name[16];
    snprintf(name, sizeof name, "%d", seq->n_children);
    return cf_module_add_child(seq, child, name);
}
