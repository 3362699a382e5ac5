/* Aligned allocation, the activation arena and the memory check. */
#include "core/memory.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define CF_ALIGN 64

/* Under AddressSanitizer the transient pool is poisoned except for the blocks taken, so that a
 * layer that reads a gradient after its container gave it back is reported where it happens,
 * and a block taken is filled with NaN. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POOL_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define POOL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#define POOL_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define POOL_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define POOL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#define POOL_SANITIZED 1
#endif
#endif
#ifndef POOL_POISON
#define POOL_POISON(p, n) ((void)(p), (void)(n))
#define POOL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* ---- large blocks straight from the kernel ------------------------------------------------
 *
 * Fresh anonymous pages read as zero, so a large cf_calloc maps its block instead of clearing
 * a heap block (posix_memalign + memset touched every page twice: once faulting it in, once
 * more in the caller). cf_malloc_huge also asks for transparent huge pages on its block: on a
 * KVM guest a page fault costs microseconds, and a 188 MB data set filled 4 KiB at a time
 * takes 46,000 of them against under 100 of 2 MiB.
 *
 * Mapped blocks are recorded in a table sorted by address; cf_free looks there only for a
 * page-aligned pointer (a mapped block always is), so freeing a heap block costs a mask test. */

/* cf_calloc maps from 32 MiB, where glibc's posix_memalign always maps anyway (its largest
 * mmap threshold), so a mapping never costs page faults that a reused heap block would not
 * have; a data set, allocated once, from 4 MiB. */
#define MAP_MIN_DEFAULT ((size_t)32 << 20)
#define HUGE_MIN_DEFAULT ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

typedef struct {
    uintptr_t at;
    size_t len; /* what was mapped, a whole number of pages */
} mapped_block;

static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static mapped_block *map_table;
static size_t map_count, map_cap;
static pthread_once_t map_once = PTHREAD_ONCE_INIT;
static size_t map_min = MAP_MIN_DEFAULT, huge_min = HUGE_MIN_DEFAULT, page_size = 4096;

static void map_lock_take(void) {
    pthread_mutex_lock(&map_lock);
}
static void map_lock_drop(void) {
    pthread_mutex_unlock(&map_lock);
}

static void map_init(void) {
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0) page_size = (size_t)ps;
#ifdef POOL_SANITIZED
    /* AddressSanitizer sees neither overruns nor leaks in mapped blocks: there, only where asked */
    map_min = huge_min = SIZE_MAX;
#endif
    const char *e = getenv("CF_MAP_MIN_BYTES");
    if (e && *e) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(e, &end, 10);
        if (errno == 0 && *end == '\0') map_min = huge_min = v > SIZE_MAX ? SIZE_MAX : (size_t)v;
    }
    /* a fork while another thread edits the table must not leave the child's lock held */
    pthread_atfork(map_lock_take, map_lock_drop, map_lock_drop);
}

static size_t map_min_bytes(void) {
    pthread_once(&map_once, map_init);
    return map_min;
}

/* Index of the first entry at or above `at` (the caller holds map_lock). */
static size_t map_find(uintptr_t at) {
    size_t lo = 0, hi = map_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (map_table[mid].at < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Maps `bytes` of zeroed memory, 2 MiB-aligned and madvised for huge pages when `huge`; NULL
 * (nothing recorded) when the kernel says no. */
static void *map_block(size_t bytes, bool huge) {
    size_t len = (bytes + page_size - 1) / page_size * page_size;
    if (len < bytes) return NULL;
    size_t extra = huge && len >= HUGE_PAGE ? HUGE_PAGE : 0;
    if (len + extra < len) return NULL;
    char *raw = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = raw;
    if (extra) { /* a huge page needs a 2 MiB-aligned range: trim the mapping to one */
        p = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
        if (p > raw) munmap(raw, (size_t)(p - raw));
        if (raw + len + extra > p + len) munmap(p + len, (size_t)(raw + len + extra - (p + len)));
    }
#ifdef MADV_HUGEPAGE
    if (huge) madvise(p, len, MADV_HUGEPAGE); /* a hint: where unsupported, 4 KiB pages */
#endif
    pthread_mutex_lock(&map_lock);
    if (map_count == map_cap) {
        size_t cap = map_cap ? 2 * map_cap : 16;
        mapped_block *t = realloc(map_table, cap * sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&map_lock);
            munmap(p, len);
            return NULL;
        }
        map_table = t;
        map_cap = cap;
    }
    size_t i = map_find((uintptr_t)p);
    memmove(map_table + i + 1, map_table + i, (map_count - i) * sizeof *map_table);
    map_table[i] = (mapped_block){.at = (uintptr_t)p, .len = len};
    map_count++;
    pthread_mutex_unlock(&map_lock);
    return p;
}

/* Unmaps ptr and returns true when it is a mapped block. */
static bool unmap_block(void *ptr) {
    if ((uintptr_t)ptr & 4095) return false; /* pages are 4 KiB or larger */
    pthread_mutex_lock(&map_lock);
    size_t i = map_find((uintptr_t)ptr);
    bool found = i < map_count && map_table[i].at == (uintptr_t)ptr;
    size_t len = found ? map_table[i].len : 0;
    if (found) {
        memmove(map_table + i, map_table + i + 1, (map_count - i - 1) * sizeof *map_table);
        map_count--;
    }
    pthread_mutex_unlock(&map_lock);
    if (found) munmap(ptr, len);
    return found;
}

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
    size_t bytes = count * size;
    if (bytes >= map_min_bytes()) {
        void *p = map_block(bytes, false); /* zero already */
        if (p) return p;
    }
    void *ptr = cf_malloc(bytes);
    if (ptr) memset(ptr, 0, bytes);
    return ptr;
}

void *cf__malloc_huge(size_t bytes) {
    map_min_bytes(); /* reads the environment once */
    if (bytes >= huge_min) {
        void *p = map_block(bytes, true);
        if (p) return p;
    }
    return cf_malloc(bytes);
}

void cf_free(void *ptr) {
    if (ptr && !unmap_block(ptr)) free(ptr);
}

/* ---- faulting a block in on a helper thread ----------------------------------------------- */

#define PREFAULT_MIN ((size_t)8 << 20)
#define PREFAULT_PIECE ((size_t)8 << 20)

struct cf__prefault {
    pthread_t thread;
    char *lo, *hi;
    atomic_bool stop;
};

static void *prefault_run(void *arg) {
#ifdef MADV_POPULATE_WRITE
    cf__prefault *pf = arg;
    for (char *at = pf->lo; at < pf->hi && !atomic_load_explicit(&pf->stop, memory_order_relaxed);
         at += PREFAULT_PIECE) {
        size_t len =
            (size_t)(pf->hi - at) < PREFAULT_PIECE ? (size_t)(pf->hi - at) : PREFAULT_PIECE;
        /* a simulated write fault: a page already there (the caller got to it first) keeps its
         * content; unsupported (before Linux 5.14) or out of memory: the caller faults alone */
        if (madvise(at, len, MADV_POPULATE_WRITE) != 0) break;
    }
#else
    (void)arg;
#endif
    return NULL;
}

cf__prefault *cf__prefault_start(void *p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    if (!p || bytes < PREFAULT_MIN || cf_get_num_threads() < 2) return NULL;
    /* whole pages inside the block only (madvise wants a page-aligned start) */
    uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095,
              hi = ((uintptr_t)p + bytes) & ~(uintptr_t)4095;
    if (hi <= lo) return NULL;
    cf__prefault *pf = malloc(sizeof *pf);
    if (!pf) return NULL;
    pf->lo = (char *)lo;
    pf->hi = (char *)hi;
    atomic_init(&pf->stop, false);
    /* A small stack: glibc keeps a joined thread's stack mapped for the next thread, and fork
     * workers inherit this process's address space (ulimit -v holds each of them). The helper
     * never calls malloc, so it adds no malloc arena either. */
    pthread_attr_t attr;
    bool made = pthread_attr_init(&attr) == 0;
    if (made) pthread_attr_setstacksize(&attr, (size_t)64 << 10);
    int rc = pthread_create(&pf->thread, made ? &attr : NULL, prefault_run, pf);
    if (made) pthread_attr_destroy(&attr);
    if (rc != 0) {
        free(pf);
        return NULL;
    }
    return pf;
#else
    (void)p, (void)bytes;
    return NULL;
#endif
}

void cf__prefault_stop(cf__prefault *pf) {
    if (!pf) return;
    atomic_store(&pf->stop, true);
    pthread_join(pf->thread, NULL);
    free(pf);
}

char *cf_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = cf_malloc(n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

/* ---- the memory check --------------------------------------------------------------------- */

#define MB(x) ((double)(x) / 1e6)

/* Bytes this process maps now (VmSize), or 0 when unknown. */
static uint64_t mapped_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1) pages = 0;
        fclose(f);
    }
    return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

cf_status cf_memory_check(uint64_t bytes, const char *what) {
    if (!what) what = "data";
    struct {
        int resource;
        const char *name;
    } limits[] = {{RLIMIT_AS, "address-space limit (ulimit -v)"},
                  {RLIMIT_DATA, "data limit (ulimit -d)"}};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        struct rlimit rl;
        if (getrlimit(limits[i].resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
        uint64_t used = mapped_bytes(), cap = (uint64_t)rl.rlim_cur;
        uint64_t left = used < cap ? cap - used : 0;
        if (bytes > left)
            return cf_fail(CF_ERR_NOMEM,
                           "%s needs %.1f MB of memory, the %s of %.1f MB leaves %.1f MB", what,
                           MB(bytes), limits[i].name, MB(cap), MB(left));
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && bytes > (uint64_t)pages * (uint64_t)page)
        return cf_fail(CF_ERR_NOMEM,
                       "%s needs %.1f MB of memory, more than this machine has (%.1f MB)", what,
                       MB(bytes), MB((uint64_t)pages * (uint64_t)page));
    return CF_OK;
}

/* ---- the arena ----------------------------------------------------------------------------- */

void cf_arena_begin_measure(cf_arena *arena) {
    arena->measuring = true;
    arena->used = 0;
    arena->pool_reserved = 0;
    arena->blocks_reserved = 0;
}

/* Maps the transient pool (and its block list) for what the measuring pass reserved. Its pages
 * are the kernel's zero pages until a block is first written, so only what is live at once
 * becomes resident. */
static cf_status pool_commit(cf_arena *arena) {
    size_t need = arena->pool_reserved;
    int blocks = arena->blocks_reserved;
    arena->pool_reserved = 0;
    arena->blocks_reserved = 0;
    cf_arena_give_all(arena);
    if (need <= arena->pool_capacity && blocks <= arena->max_blocks) {
        if (arena->pool) POOL_POISON(arena->pool, arena->pool_capacity);
        return CF_OK;
    }
    cf_arena_block *list = cf_calloc(2 * ((size_t)blocks + 1), sizeof *list);
    void *pool = need ? mmap(NULL, need, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                      : NULL;
    if (!list || pool == MAP_FAILED) {
        cf_free(list);
        if (pool && pool != MAP_FAILED) munmap(pool, need);
        return cf_fail(CF_ERR_NOMEM, "out of memory mapping %zu bytes of transient activations",
                       need);
    }
    if (arena->pool) {
        POOL_UNPOISON(arena->pool, arena->pool_capacity);
        munmap(arena->pool, arena->pool_capacity);
    }
    cf_free(arena->blocks);
    arena->pool = pool;
    arena->pool_capacity = need;
    if (pool) POOL_POISON(pool, need);
    arena->pool_high = 0;
    arena->blocks = list;
    arena->spilled = list + blocks + 1;
    arena->max_blocks = blocks;
    arena->spills = 0;
    return CF_OK;
}

cf_status cf_arena_commit(cf_arena *arena) {
    size_t need = arena->used;
    arena->measuring = false;
    arena->used = 0;
    if (pool_commit(arena) != CF_OK) return cf_fail_context(CF_ERR_NOMEM, "activation arena");
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

void cf_arena_reserve_transient(cf_arena *arena, size_t bytes) {
    const size_t size = (bytes + CF_ALIGN - 1) & ~(size_t)(CF_ALIGN - 1);
    arena->pool_reserved += size ? size : CF_ALIGN; /* as cf_arena_take counts it */
    arena->blocks_reserved++;
}

/* A block from the heap, for a take that found no gap in the pool. */
static void *spill(cf_arena *arena, size_t size, const void *owner) {
    char *p = cf_malloc(size);
    if (!p) return NULL;
    arena->spilled[arena->n_spilled++] = (cf_arena_block){.size = size, .owner = owner, .heap = p};
    arena->spills++;
#ifdef POOL_SANITIZED
    memset(p, 0xff, size);
#endif
    return p;
}

/* The index of the spilled block at p, or -1. */
static int spilled_at(const cf_arena *arena, const void *p) {
    for (int i = 0; p && i < arena->n_spilled; i++)
        if (arena->spilled[i].heap == p) return i;
    return -1;
}

void *cf_arena_take(cf_arena *arena, size_t bytes, const void *owner) {
    size_t size = (bytes + CF_ALIGN - 1) & ~(size_t)(CF_ALIGN - 1);
    if (size == 0) size = CF_ALIGN;
    if (arena->n_blocks + arena->n_spilled >= arena->max_blocks) return NULL;
    /* first fit: the lowest gap between the blocks (kept by offset) that holds size */
    size_t at = 0;
    int i = 0;
    for (; i < arena->n_blocks; i++) {
        if (arena->blocks[i].at - at >= size) break;
        at = arena->blocks[i].at + arena->blocks[i].size;
    }
    if (at + size > arena->pool_capacity) return spill(arena, size, owner);
    memmove(arena->blocks + i + 1, arena->blocks + i,
            (size_t)(arena->n_blocks - i) * sizeof *arena->blocks);
    arena->blocks[i] = (cf_arena_block){.at = at, .size = size, .owner = owner};
    arena->n_blocks++;
    if (at + size > arena->pool_high) arena->pool_high = at + size;
    POOL_UNPOISON(arena->pool + at, size);
#ifdef POOL_SANITIZED
    /* a block is not zeroed: NaN in every float flushes out a layer that reads before writing */
    memset(arena->pool + at, 0xff, size);
#endif
    return arena->pool + at;
}

/* The index of the block that starts at p, or -1. */
static int block_at(const cf_arena *arena, const void *p) {
    const char *c = p;
    if (!c || !arena->pool || c < arena->pool || c >= arena->pool + arena->pool_capacity) return -1;
    size_t at = (size_t)(c - arena->pool);
    int lo = 0, hi = arena->n_blocks;
    while (lo < hi) { /* blocks are kept by offset */
        int mid = (lo + hi) / 2;
        if (arena->blocks[mid].at < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < arena->n_blocks && arena->blocks[lo].at == at ? lo : -1;
}

bool cf_arena_holds(const cf_arena *arena, const void *p, const void *owner) {
    int i = block_at(arena, p);
    if (i >= 0) return arena->blocks[i].owner == owner;
    i = spilled_at(arena, p);
    return i >= 0 && arena->spilled[i].owner == owner;
}

void cf_arena_give(cf_arena *arena, const void *p, const void *keep) {
    uintptr_t at = (uintptr_t)p, k = (uintptr_t)keep;
    int i = block_at(arena, p);
    if (i < 0) {
        if ((i = spilled_at(arena, p)) < 0) return;
        if (keep && k >= at && k < at + arena->spilled[i].size) return;
        cf_free(arena->spilled[i].heap);
        arena->spilled[i] = arena->spilled[--arena->n_spilled];
        return;
    }
    if (keep && k >= at && k < at + arena->blocks[i].size) return;
    POOL_POISON(arena->pool + arena->blocks[i].at, arena->blocks[i].size);
    memmove(arena->blocks + i, arena->blocks + i + 1,
            (size_t)(arena->n_blocks - i - 1) * sizeof *arena->blocks);
    arena->n_blocks--;
}

void cf_arena_give_all(cf_arena *arena) {
    for (int i = 0; i < arena->n_blocks; i++) /* the rest of the pool is poisoned already */
        POOL_POISON(arena->pool + arena->blocks[i].at, arena->blocks[i].size);
    arena->n_blocks = 0;
    for (int i = 0; i < arena->n_spilled; i++) cf_free(arena->spilled[i].heap);
    arena->n_spilled = 0;
}

float *cf_arena_floats(cf_arena *arena, size_t count) {
    return cf_arena_bytes(arena, count * sizeof(float));
}

void cf_arena_release(cf_arena *arena) {
    cf_arena_give_all(arena);
    cf_free(arena->base);
    if (arena->pool) {
        POOL_UNPOISON(arena->pool, arena->pool_capacity);
        munmap(arena->pool, arena->pool_capacity);
    }
    cf_free(arena->blocks);
    memset(arena, 0, sizeof *arena);
}
