/* Aligned allocation and the activation arena. */
#include "corefit/core.h"

#include <stdlib.h>
#include <string.h>

#define CF_ALIGN 64

void *cf_malloc(size_t bytes) {
    void *ptr = NULL;
    if (bytes == 0) bytes = 1;
    if (posix_memalign(&ptr, CF_ALIGN, bytes) != 0) {
        cf_fail(CF_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    return ptr;
}

void *cf_calloc(size_t count, size_t size) {
    if (size != 0 && count > SIZE_MAX / size) {
        cf_fail(CF_ERR_NOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    void *ptr = cf_malloc(count * size);
    if (ptr) memset(ptr, 0, count * size);
    return ptr;
}

void cf_free(void *ptr) {
    free(ptr);
}

char *cf_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = cf_malloc(n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

void cf_arena_begin_measure(cf_arena *arena) {
    arena->measuring = true;
    arena->used = 0;
}

cf_status cf_arena_commit(cf_arena *arena) {
    size_t need = arena->used;
    arena->measuring = false;
    arena->used = 0;
    if (need <= arena->capacity) {
        if (arena->base) memset(arena->base, 0, arena->capacity);
        return CF_OK;
    }
    void *base = cf_calloc(1, need);
    if (!base) return cf_fail_context(CF_ERR_NOMEM, "activation arena");
    cf_free(arena->base);
    arena->base = base;
    arena->capacity = need;
    return CF_OK;
}

void *cf_arena_bytes(cf_arena *arena, size_t bytes) {
    size_t size = (bytes + CF_ALIGN - 1) & ~(size_t)(CF_ALIGN - 1);
    size_t at = arena->used;
    arena->used += size;
    if (arena->measuring) return NULL;
    /* The second pass must request exactly what the measuring pass counted. */
    if (arena->used > arena->capacity) return NULL;
    return arena->base + at;
}

float *cf_arena_floats(cf_arena *arena, size_t count) {
    return cf_arena_bytes(arena, count * sizeof(float));
}

void cf_arena_release(cf_arena *arena) {
    cf_free(arena->base);
    memset(arena, 0, sizeof *arena);
}
