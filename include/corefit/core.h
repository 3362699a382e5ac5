/* corefit/core.h — status codes and errors, random numbers, arenas, the thread pool. Every
 * fallible call returns a cf_status and sets cf_last_error() (per thread) naming file, position
 * and value; the library never exits or aborts on a user's error. Notes: docs/api.md. */
#ifndef COREFIT_CORE_H
#define COREFIT_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cf_status {
    CF_OK = 0,
    CF_ERR_INVALID,     /* an argument or option is out of range or inconsistent */
    CF_ERR_IO,          /* a file could not be opened, read or written */
    CF_ERR_FORMAT,      /* a file's contents are malformed, truncated or inconsistent */
    CF_ERR_NOMEM,       /* an allocation failed or a size was refused as absurd */
    CF_ERR_STATE,       /* the object is not in a state that allows the call */
    CF_ERR_UNSUPPORTED, /* the feature is not built in or not available here */
    CF_ERR_WORKER,      /* a parallel worker failed, crashed, was killed or timed out */
    CF_ERR_INTERRUPTED, /* the call was interrupted (SIGINT) */
    CF_ERR_NONFINITE,   /* a loss or value became NaN or infinite */
} cf_status;

/* The message of the last failure on this thread ("" when none). Valid until the next call on
 * this thread that fails. */
const char *cf_last_error(void);
/* A short fixed name for a status, e.g. "invalid argument". */
const char *cf_status_str(cf_status status);
/* Records a printf-style message for this thread and returns `status` (for `return cf_fail(...)`).
 */
cf_status cf_fail(cf_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with context ("loading x.safetensors: ..."); returns `status`. */
cf_status cf_fail_context(cf_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void cf_clear_error(void);

/* ---- memory ------------------------------------------------------------------------------ */

/* Allocation wrappers that record CF_ERR_NOMEM with the size on failure. Memory is 64-byte
 * aligned; free with cf_free, never free() or realloc(): from 32 MiB (CF_MAP_MIN_BYTES=n in the
 * environment), cf_calloc maps fresh pages, zero already, instead of clearing a heap block. */
void *cf_malloc(size_t bytes);
void *cf_calloc(size_t count, size_t size);
void cf_free(void *ptr);
char *cf_strdup(const char *s);

/* Whether `bytes` more may be allocated for `what`: CF_OK, or CF_ERR_NOMEM naming what, size and
 * limit (ulimit -v / -d, physical memory). Call before allocations sized by input. */
cf_status cf_memory_check(uint64_t bytes, const char *what);

/* Reads a whole file into a new buffer (free with cf_free), NUL-terminated after *size bytes.
 * Files, pipes and devices beyond max_bytes (at most 1 GiB for streams), directories and FIFOs
 * without a writer (10 s) are refused, naming path, size and limit. */
cf_status cf_read_file(const char *path, size_t max_bytes, void **data, size_t *size);
/* Writes path atomically (temporary file beside it, fsync, rename), as every library save does;
 * a character device is written through. CF_ERR_IO naming the path and why. */
cf_status cf_write_file_atomic(const char *path, const void *data, size_t size);
/* What a save may do with path: a regular file (or none) is replaced atomically; a character
 * device is written through (*write_through); a FIFO, socket or block device is refused with
 * CF_ERR_IO naming the path and its kind. */
cf_status cf_output_check(const char *path, bool *write_through);

/* A bump allocator for activations: a measuring pass counts (cf_arena_floats returns NULL), then
 * cf_arena_commit allocates and an identical pass hands out pointers; nothing is freed singly.
 * Beside it, a pool of transient blocks taken and given back in any order during a pass.
 * Details: docs/api.md. */
typedef struct cf_arena_block {
    size_t at, size;   /* bytes from the pool's base */
    const void *owner; /* who took it (cf_arena_holds) */
    char *heap;        /* a block served from the heap (the pool had no gap), else NULL */
} cf_arena_block;

typedef struct cf_arena {
    char *base;
    size_t capacity; /* bytes allocated */
    size_t used;     /* bytes handed out (or counted, while measuring) */
    bool measuring;
    /* the transient pool */
    char *pool;
    size_t pool_capacity;   /* bytes mapped */
    size_t pool_reserved;   /* bytes reserved by this pass */
    size_t pool_high;       /* the highest end of a block taken since the pool was mapped */
    cf_arena_block *blocks; /* blocks taken now, by offset */
    int n_blocks, max_blocks, blocks_reserved;
    cf_arena_block *spilled; /* blocks taken now from the heap */
    int n_spilled;
    long spills; /* takes served from the heap since the pool was mapped */
} cf_arena;

void cf_arena_begin_measure(cf_arena *arena);
cf_status cf_arena_commit(cf_arena *arena); /* allocates `used` bytes (if larger), rewinds */
float *cf_arena_floats(cf_arena *arena, size_t count); /* 64-byte aligned, zeroed */
void *cf_arena_bytes(cf_arena *arena, size_t bytes);
void cf_arena_release(cf_arena *arena);
/* Counts one transient block of up to `bytes` (in both passes, like cf_arena_bytes). */
void cf_arena_reserve_transient(cf_arena *arena, size_t bytes);
/* A 64-byte aligned block of `bytes` for owner, not zeroed: from the pool, or from the heap when
 * the pool has no gap that fits; NULL only when more blocks are taken at once than were reserved
 * or the heap is out of memory. */
void *cf_arena_take(cf_arena *arena, size_t bytes, const void *owner);
/* True when p is the start of a block that owner took and that is not given back. */
bool cf_arena_holds(const cf_arena *arena, const void *p, const void *owner);
/* Gives back the block that starts at p, unless `keep` points into it (a result that is a view
 * of the block); any other pointer (not from the pool, or not a block's start) is ignored. */
void cf_arena_give(cf_arena *arena, const void *p, const void *keep);
/* Gives back every block (the start of a pass); pointers taken before must not be used. */
void cf_arena_give_all(cf_arena *arena);

/* ---- random numbers ------------------------------------------------------------------------ */

/* xoshiro256** seeded through splitmix64: fast, small, reproducible across platforms. */
typedef struct cf_rng {
    uint64_t s[4];
} cf_rng;

void cf_rng_seed(cf_rng *rng, uint64_t seed);
uint64_t cf_rng_next(cf_rng *rng);
double cf_rng_uniform(cf_rng *rng);             /* [0, 1) */
uint64_t cf_rng_below(cf_rng *rng, uint64_t n); /* [0, n), unbiased */
double cf_rng_normal(cf_rng *rng);              /* standard normal */
/* Fisher–Yates shuffle of an index array. */
void cf_rng_shuffle(cf_rng *rng, int64_t *idx, int64_t n);

/* ---- threads ------------------------------------------------------------------------------- */

/* The number of threads a single-process fit uses (default: the cores this process may run on,
 * the fast configuration). BLAS is held to one thread; corefit's pool splits the work. */
void cf_set_num_threads(int n);
int cf_get_num_threads(void);
/* The cores in this process's affinity mask. */
int cf_available_cores(void);
/* Reserves, before the first BLAS call, OpenBLAS's work buffers for `concurrent` BLAS calls at
 * once (one per thread): CF_OK, or CF_ERR_NOMEM naming size and limit (instead of OpenBLAS
 * spinning on a mapping that cannot succeed). */
cf_status cf_blas_reserve(int concurrent);

/* Runs fn(ctx, begin, end, part) over [0, n) split into contiguous chunks, one per thread,
 * on a persistent pool started lazily in the process that uses it (re-created after fork).
 * Chunks are a deterministic function of n and the thread count. `part` is the chunk's number
 * (0 .. threads-1), for per-part scratch: a part runs once, usually on its own thread, but the
 * caller, its own part done, runs a part whose thread has not started it yet (docs/api.md,
 * "How pool threads and fork workers wait"), so fn must not rely on the running thread. */
typedef void (*cf_range_fn)(void *ctx, int64_t begin, int64_t end, int part);
void cf_parallel_for(int64_t n, cf_range_fn fn, void *ctx);

/* The BLAS kernels in use ("SkylakeX", "Haswell", ...), chosen to match cf_isa_active() unless
 * OPENBLAS_CORETYPE is set. */
const char *cf_blas_core(void);

/* Seconds from a monotonic clock. */
double cf_now(void);

/* ---- keyword-argument macros ----------------------------------------------------------------
 * Helpers that keep the option macros (cf_fit_one_cycle(learn, 5, .lr_max = ...)) valid ISO C11
 * when no option is given. Not for direct use. */
#define CF_PICK64_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17,     \
                   _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, _33, \
                   _34, _35, _36, _37, _38, _39, _40, _41, _42, _43, _44, _45, _46, _47, _48, _49, \
                   _50, _51, _52, _53, _54, _55, _56, _57, _58, _59, _60, _61, _62, _63, _64, ...) \
    _64
/* 1 when the arguments hold a top-level comma (up to 63 of them), else 0 */
#define CF_HAS_COMMA_(...)                                                                         \
    CF_PICK64_(__VA_ARGS__, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,   \
               1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, \
               1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0)
#define CF_CAT_(a, b) CF_CAT2_(a, b)
#define CF_CAT2_(a, b) a##b
#define CF_COMMA_(...) ,
/* &(T){options}, or &(T){0} when there are none. The callers below append a comma after the
 * options, so "none" is exactly "no top-level comma". */
#define CF_OPTS_(T, ...) CF_CAT_(CF_OPTS_IF_, CF_HAS_COMMA_(__VA_ARGS__))(T, __VA_ARGS__)
#define CF_OPTS_IF_0(T, ...) (&(T){0})
#define CF_OPTS_IF_1(T, ...) (&(T){__VA_ARGS__})
/* For macros whose only arguments are options (no comma appended): empty when there is no
 * comma and `CF_COMMA_ <args> ()` makes one. */
#define CF_OPTS0_(T, ...) CF_CAT_(CF_OPTS0_A, CF_HAS_COMMA_(__VA_ARGS__))(T, __VA_ARGS__)
#define CF_OPTS0_A1(T, ...) (&(T){__VA_ARGS__})
#define CF_OPTS0_A0(T, ...)                                                                        \
    CF_CAT_(CF_OPTS0_B, CF_HAS_COMMA_(CF_COMMA_ __VA_ARGS__()))(T, __VA_ARGS__)
#define CF_OPTS0_B0(T, ...) (&(T){__VA_ARGS__})
#define CF_OPTS0_B1(T, ...) (&(T){0})
/* fn(a, [b, [c,]] options): the fixed arguments, then the options struct */
#define CF_CALL1_(fn, T, a, ...) fn((a), CF_OPTS_(T, __VA_ARGS__))
#define CF_CALL2_(fn, T, a, b, ...) fn((a), (b), CF_OPTS_(T, __VA_ARGS__))
#define CF_CALL3_(fn, T, a, b, c, ...) fn((a), (b), (c), CF_OPTS_(T, __VA_ARGS__))

#ifdef __cplusplus
}
#endif
#endif
