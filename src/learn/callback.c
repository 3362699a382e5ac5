/* The callback object itself: made and freed here, below every file that defines a callback. */
#include "corefit/learn.h"

static void free_with_state(cf_callback *cb) {
    if (!cb) return;
    cf_free(cb->state);
    cf_free(cb);
}

cf_callback *cf_callback_new(const char *name, int order, size_t state_size) {
    cf_callback *cb = cf_calloc(1, sizeof *cb);
    void *state = state_size ? cf_calloc(1, state_size) : NULL;
    if (!cb || (state_size && !state)) {
        cf_free(cb);
        cf_free(state);
        return NULL;
    }
    cb->name = name;
    cb->order = order;
    cb->state = state;
    cb->free = free_with_state;
    cb->running = true;
    return cb;
}

void cf_callback_free(cf_callback *cb) {
    if (cb && cb->free) cb->free(cb);
}
