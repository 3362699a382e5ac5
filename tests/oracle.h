/* Test helpers: exchanging tensors with the PyTorch oracle scripts in tests/oracle/, and
 * comparing floats. A C test writes its inputs into a temporary folder, runs a script with
 * /usr/bin/python3 (Debian's python3-torch), and reads the reference outputs back. */
#ifndef CF_TEST_ORACLE_H
#define CF_TEST_ORACLE_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "corefit/core.h"
#include "corefit/tensor.h"

typedef struct oracle {
    char dir[256];
} oracle;

/* Creates a fresh temporary folder. */
void oracle_init(oracle *o);
/* Removes the folder and everything in it. */
void oracle_cleanup(oracle *o);
/* A fresh temporary folder /tmp/<prefix>XXXXXX in dir (size bytes); removed with everything in
 * it by test_tmpdir_remove. */
void test_tmpdir_make(char *dir, size_t size, const char *prefix);
int test_tmpdir_remove(const char *dir); /* 0 on success */
/* Writes a tensor as <dir>/<name>.f32: int32 ndim, int32 dims[ndim], float32 data. */
void oracle_put(oracle *o, const char *name, const float *data, cf_shape shape);
/* Writes a small integer/float scalar list as <dir>/<name>.f32 with shape (n). */
void oracle_put_values(oracle *o, const char *name, int n, ...); /* doubles */
/* Runs /usr/bin/python3 tests/oracle/<script> <dir> [args]; fails the test on non-zero exit. */
void oracle_run(oracle *o, const char *script, const char *args);
/* Starts one /usr/bin/python3 tests/oracle/<script> --serve process (tests/oracle/common.py's
 * serve) that answers every later oracle_run of that script, so that a test with many oracle
 * calls imports torch once; the results are the same as separate runs. oracle_serve_end stops it
 * (the script's requests then run separately again). One server at a time. */
void oracle_serve_begin(const char *script);
void oracle_serve_end(void);
/* Reads <dir>/<name>.f32; the caller frees t.data with free(). Fails the test if missing. */
cf_tensor oracle_get(oracle *o, const char *name);

/* Fills with uniform values in [lo, hi) from a seeded generator. */
void fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi);
/* fill_uniform's values in [-3, 3) with the bf16 rounding's special cases every 7th value:
 * subnormals (the conversion instructions read them as zero), NaNs of both signs and payloads,
 * infinities, ties to even, the largest finite values (rounding up to infinity), zeros of both
 * signs. */
void fill_bf16_specials(float *x, size_t n, uint64_t seed);
/* Asserts |a-b| <= atol + rtol*|b| elementwise, reporting the worst element. */
void assert_close(const char *what, const float *a, const float *b, size_t n, double rtol,
                  double atol);
/* Decodes a PNG file (libpng) as 8-bit RGB, row by row; fails the test naming the file when it is
 * not a readable PNG. The caller frees the pixels with free(). */
unsigned char *test_png_load_rgb(const char *path, int *width, int *height);

/* Time limits in tests (fault reaction, liveness) are multiplied by CF_TEST_TIME_SCALE when set
 * (make test-valgrind sets it: everything runs tens of times slower there), and by 3 by default
 * in an AddressSanitizer build (unoptimised, every access checked: test_limits' readers took 22 s
 * against their 20 s bound there beside another test on 2 cores). */
static inline double test_time_scale(void) {
#if defined(__SANITIZE_ADDRESS__)
    const double build = 3.0;
#else
    const double build = 1.0;
#endif
    const char *s = getenv("CF_TEST_TIME_SCALE");
    double v = s ? atof(s) : build;
    return v >= 1.0 ? v : 1.0;
}

/* Largest relative error max|a-b| / max(|b|, floor); INFINITY when an element of a or b is NaN or
 * infinite, so that a test comparing with `err <= tol` fails on it. */
double max_rel_err(const float *a, const float *b, size_t n, double floor);
/* Fails the test (naming what) unless max_rel_err(a, b, n, floor) <= rtol; a value that is not
 * finite is reported with its index. */
void assert_rel_err_within(const char *what, const float *a, const float *b, size_t n, double floor,
                           double rtol);
/* Fails the test (naming what and the index) when an element is NaN or infinite. */
void assert_all_finite(const char *what, const float *a, size_t n);

/* Fails the test (naming what) unless m's parameters are named, in order, as the lines of the
 * oracle's torch_names.txt (a script's state_dict keys; blank lines skipped). */
struct cf_model;
void oracle_assert_param_names(oracle *o, const struct cf_model *m, const char *what);

/* Puts every state_dict entry of m as <prefix><i> (flat) and writes their names, in order, to the
 * oracle's names.txt, for a script that loads the same weights into its model. */
void oracle_put_model_state(oracle *o, const struct cf_model *m, char prefix);

#endif
