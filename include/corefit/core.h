/* corefit/core.h — status codes and errors, random numbers, arenas, the thread pool.
 *
 * Every fallible call in corefit returns a cf_status. On failure it also records a message for
 * the calling thread, read with cf_last_error(), that names the file, position and value at
 * fault. The library never exits or aborts on a user's error. */
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
 * aligned; free with cf_free. */
void *cf_malloc(size_t bytes);
void *cf_calloc(size_t count, size_t size);
void cf_free(void *ptr);
char *cf_strdup(const char *s);

/* Whether `bytes` more may be allocated for `what`: CF_OK, or CF_ERR_NOMEM naming what, the size
 * and the limit when it exceeds this process's address-space or data limit (ulimit -v / -d) or
 * the machine's physical memory. Readers call it before an allocation sized by their input, so
 * that a file that would need more memory than there is gets a clear error instead of a swap
 * storm or the out-of-memory killer. */
cf_status cf_memory_check(uint64_t bytes, const char *what);

/* Reads a whole file into a new buffer (free with cf_free), NUL-terminated after *size bytes.
 * A regular file larger than max_bytes is refused before anything is allocated; a pipe, FIFO,
 * socket or character device (/dev/stdin, a process substitution, /dev/zero) is read up to
 * max_bytes (at most 1 GiB) and refused beyond it; a FIFO that no writer opens within 10 s and a
 * directory are refused. Errors name the path, the size and the limit. */
cf_status cf_read_file(const char *path, size_t max_bytes, void **data, size_t *size);
/* Writes `size` bytes to path the way the library writes every file (a model file, a
 * checkpoint): a temporary file beside it (O_EXCL, removed on failure or on a signal that ends
 * the process), fsync, rename, so the path holds either its old content or all of the new; a
 * character device is written through (cf_output_check). CF_ERR_IO naming the path and why. */
cf_status cf_write_file_atomic(const char *path, const void *data, size_t size);
/* What a save may do with an existing path: a regular file (or none) is replaced atomically;
 * a character device such as /dev/null is written through (*write_through set: no temporary
 * file, no rename, the device stays); a FIFO, a socket or a block device is refused with
 * CF_ERR_IO naming the path and its kind, and never replaced. (A directory passes: the save's
 * rename fails on it and says so.) */
cf_status cf_output_check(const char *path, bool *write_through);

/* A bump allocator for activations. Two phases: a measuring pass (cf_arena_begin_measure, then
 * cf_arena_floats returns NULL and counts), then cf_arena_commit allocates the counted size and
 * a second identical pass hands out real pointers. Nothing is freed individually.
 *
 * Beside it, a pool of transient blocks: memory that is live for part of a pass only (backward's
 * input gradients, dead once the layer before has read them; a layer's per-call scratch). Each
 * pass reserves what may be taken (cf_arena_reserve_transient, one call per owner's block); at
 * run time blocks are taken and given back in any order, first fit from the bottom of the pool,
 * so that a long chain of layers reuses a few blocks' memory. The pool's pages are mapped on
 * first touch: a process holds the pool up to the highest end of a block ever taken, about the
 * most that is live at once, not the sum of what was reserved. A take that finds no gap (the
 * pool fragmented) is served from the heap instead and freed when given back. */
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

/* The number of threads a single-process fit uses. Default: the cores this process may run on,
 * with no call needed: that default is the fast configuration. corefit owns the threading of
 * every kernel it calls: its pool splits work over the batch, and the BLAS library is held to one
 * thread from the moment the library is loaded (a BLAS call inside a pool job must not start
 * threads of its own), in one process, in fork workers and under MPI alike. */
void cf_set_num_threads(int n);
int cf_get_num_threads(void);
/* The cores in this process's affinity mask. */
int cf_available_cores(void);
/* Makes room, before the first BLAS call, for the work buffers OpenBLAS keeps for `concurrent`
 * BLAS calls in flight at once (one per thread of a fit: cf_get_num_threads()): CF_OK, or
 * CF_ERR_NOMEM with a message naming the size and the limit. Without it, OpenBLAS retries a
 * mapping that cannot succeed for ever, at full CPU. Cheap once done; the buffers (128 MiB of
 * address space each, touched only as used) stay for the life of the process and its forks. */
cf_status cf_blas_reserve(int concurrent);

/* Runs fn(ctx, begin, end, thread) over [0, n) split into contiguous chunks, one per thread,
 * on a persistent pool started lazily in the process that uses it (re-created after fork).
 * Chunks are a deterministic function of n and the thread count. */
typedef void (*cf_range_fn)(void *ctx, int64_t begin, int64_t end, int thread);
void cf_parallel_for(int64_t n, cf_range_fn fn, void *ctx);

/* The BLAS kernels in use ("SkylakeX", "Haswell", ...). Unless OPENBLAS_CORETYPE is set,
 * corefit selects OpenBLAS's kernels for the instruction set of its own (cf_isa_active(): the
 * CPU's best, or the CF_ISA cap): SkylakeX at avx512, Haswell at avx2, Nehalem at generic. */
const char *cf_blas_core(void);

/* Seconds from a monotonic clock. */
double cf_now(void);

/* ---- keyword-argument macros ----------------------------------------------------------------
 * The option macros (cf_fit_one_cycle(learn, 5, .lr_max = ...), cf_save_model_cb(), ...) pass
 * their optional arguments as a compound literal of the options struct. These helpers keep them
 * valid ISO C11 (-std=c11 -pedantic) when no option is given: the struct is then written {0}
 * (an empty initializer `{}` is not C11), and a variadic macro is never left without an
 * argument. Not for direct use. */
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
