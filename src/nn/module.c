/* The module base type: parameters, children, activation memory. The containers are in
 * sequential.c and residual.c, models in model.c, fusion in fuse.c. */
#include "corefit/nn.h"
#include "nn_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

cf_module *cf_module_new(const cf_module_ops *ops, void *impl) {
    cf_module *m = cf_calloc(1, sizeof *m);
    if (!m) {
        cf_free(impl);
        return NULL;
    }
    m->ops = ops;
    m->impl = impl;
    m->training = true;
    return m;
}

cf_param *cf_module_add_param(cf_module *m, const char *name, cf_param_kind kind, cf_shape shape) {
    if (m->n_params >= CF_MODULE_MAX_PARAMS) return NULL;
    cf_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    p->name = name;
    p->kind = kind;
    p->shape = shape;
    p->numel = cf_shape_numel(&shape);
    p->trainable = kind != CF_PARAM_BUFFER && kind != CF_PARAM_COUNTER;
    return p;
}

void cf_module_free(cf_module *m) {
    if (!m) return;
    for (int i = 0; i < m->n_children; i++) {
        cf_module_free(m->children[i]);
        cf_free(m->child_names[i]);
    }
    cf_free(m->children);
    cf_free(m->child_names);
    for (int i = 0; i < m->n_params; i++) cf_free(m->params[i].full_name);
    if (m->ops && m->ops->destroy) m->ops->destroy(m);
    cf_free(m->impl);
    cf_free(m);
}

cf_status cf_nn_module_out_shape(cf_module *m, const cf_shape *in, cf_shape *out) {
    return m->ops->out_shape(m, in, out);
}

void cf_module_plan_default(cf_module *m, const cf_shape *in, cf_arena *arena) {
    cf_shape out;
    if (cf_nn_module_out_shape(m, in, &out) != CF_OK) return; /* checked before planning */
    m->out.data = cf_arena_floats(arena, cf_shape_numel(&out));
    m->out.shape = out;
    m->dx.data = NULL;
    m->dx.shape = *in;
    cf_arena_reserve_transient(arena, cf_shape_numel(in) * sizeof(float));
    m->grad_arena = arena;
}

void cf_nn_module_plan(cf_module *m, const cf_shape *in, cf_arena *arena) {
    if (m->ops->plan)
        m->ops->plan(m, in, arena);
    else
        cf_module_plan_default(m, in, arena);
}

cf_tensor *cf_module_output(cf_module *m, const cf_shape *shape) {
    m->out.shape = *shape;
    return &m->out;
}

cf_tensor *cf_module_input_grad(cf_module *m) {
    m->dx.shape = m->in->shape;
    cf_arena *pool = m->grad_arena;
    if (pool && !cf_arena_holds(pool, m->dx.data, m))
        m->dx.data = cf_arena_take(pool, cf_shape_numel(&m->dx.shape) * sizeof(float), m);
    return &m->dx;
}

void cf_module_give_grad(const cf_module *m, const float *p, const float *keep) {
    if (m->grad_arena) cf_arena_give(m->grad_arena, p, keep);
}

cf_status cf_module_add_child(cf_module *parent, cf_module *child, const char *name) {
    int n = parent->n_children;
    cf_module **children = cf_calloc((size_t)n + 1, sizeof *children);
    char **names = cf_calloc((size_t)n + 1, sizeof *names);
    char *copy = cf_strdup(name);
    if (!children || !names || !copy) {
        cf_free(children);
        cf_free(names);
        cf_free(copy);
        cf_module_free(child);
        return CF_ERR_NOMEM;
    }
    if (n) {
        memcpy(children, parent->children, (size_t)n * sizeof *children);
        memcpy(names, parent->child_names, (size_t)n * sizeof *names);
    }
    children[n] = child;
    names[n] = copy;
    cf_free(parent->children);
    cf_free(parent->child_names);
    parent->children = children;
    parent->child_names = names;
    parent->n_children = n + 1;
    return CF_OK;
}

/* ---- errors of a pass ----------------------------------------------------------------------
 * forward and backward return no status (containers run their children without checking), so a
 * layer that could not compute its result records the failure here and the pass runs to its end;
 * cf_model_forward / cf_model_backward return the first one. Per thread: a model's pass runs its
 * modules on the thread that called it (their own threads report through the layer, which
 * records the failure once they are done). */
static _Thread_local cf_status pass_status;
static _Thread_local char pass_message[1024];

cf_status cf_module_fail(cf_status status, const char *fmt, ...) {
    char msg[sizeof pass_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (status != CF_OK && pass_status == CF_OK) {
        pass_status = status;
        memcpy(pass_message, msg, sizeof msg);
    }
    return cf_fail(status, "%s", msg);
}

void cf__nn_pass_begin(void) {
    pass_status = CF_OK;
}

cf_status cf__nn_pass_end(void) {
    const cf_status st = pass_status;
    pass_status = CF_OK;
    return st == CF_OK ? CF_OK : cf_fail(st, "%s", pass_message);
}
