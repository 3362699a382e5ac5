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

/* A bump allocator for activations. Two phases: a measuring pass (cf_arena_begin_measure, then
 * cf_arena_floats returns NULL and counts), then cf_arena_commit allocates the counted size and
 * a second identical pass hands out real pointers. Nothing is freed individually. */
typedef struct cf_arena {
    char *base;
    size_t capacity; /* bytes allocated */
    size_t used;     /* bytes handed out (or counted, while measuring) */
    bool measuring;
} cf_arena;

void cf_arena_begin_measure(cf_arena *arena);
cf_status cf_arena_commit(cf_arena *arena); /* allocates `used` bytes (if larger), rewinds */
float *cf_arena_floats(cf_arena *arena, size_t count); /* 64-byte aligned, zeroed */
void *cf_arena_bytes(cf_arena *arena, size_t bytes);
void cf_arena_release(cf_arena *arena);

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

/* The number of threads a single-process fit uses. Default: the cores this process may run on.
 * cf_set_num_threads(1) also holds the BLAS library to one thread (parallel workers use it). */
void cf_set_num_threads(int n);
int cf_get_num_threads(void);
/* The cores in this process's affinity mask. */
int cf_available_cores(void);

/* Runs fn(ctx, begin, end, thread) over [0, n) split into contiguous chunks, one per thread,
 * on a persistent pool started lazily in the process that uses it (re-created after fork).
 * Chunks are a deterministic function of n and the thread count. */
typedef void (*cf_range_fn)(void *ctx, int64_t begin, int64_t end, int thread);
void cf_parallel_for(int64_t n, cf_range_fn fn, void *ctx);

/* The BLAS kernels in use ("SkylakeX", "Haswell", ...). On CPUs the system's OpenBLAS does not
 * recognise (it would fall back to slow generic kernels), corefit selects kernels for the
 * instruction set the CPU reports, unless OPENBLAS_CORETYPE is set. */
const char *cf_blas_core(void);

/* Seconds from a monotonic clock. */
double cf_now(void);

#ifdef __cplusplus
}
#endif
#endif
