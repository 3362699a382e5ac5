#include "oracle.h"

#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "corefit/nn.h"

void test_tmpdir_make(char *dir, size_t size, const char *prefix) {
    snprintf(dir, size, "/tmp/%sXXXXXX", prefix);
    assert_non_null(mkdtemp(dir));
}

int test_tmpdir_remove(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "could not remove %s\n", dir);
    return rc == 0 ? 0 : -1;
}

void oracle_init(oracle *o) {
    test_tmpdir_make(o->dir, sizeof o->dir, "cf-oracle-");
}

void oracle_cleanup(oracle *o) {
    test_tmpdir_remove(o->dir);
}

void oracle_put(oracle *o, const char *name, const float *data, cf_shape shape) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.f32", o->dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    int32_t nd = shape.ndim;
    fwrite(&nd, 4, 1, f);
    for (int i = 0; i < shape.ndim; i++) {
        int32_t d = shape.dim[i];
        fwrite(&d, 4, 1, f);
    }
    fwrite(data, sizeof(float), cf_shape_numel(&shape), f);
    assert_int_equal(fclose(f), 0);
}

void oracle_put_values(oracle *o, const char *name, int n, ...) {
    float *v = calloc((size_t)n + 1, sizeof(float));
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) v[i] = (float)va_arg(ap, double);
    va_end(ap);
    oracle_put(o, name, v, cf_shape1(n));
    free(v);
}

/* The persistent oracle of oracle_serve_begin: its script, process and pipes. */
static struct {
    char script[128];
    pid_t pid;
    FILE *to, *from;
} served;

void oracle_serve_begin(const char *script) {
    int in[2], out[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    /* only the child's ends survive exec, so that no other child holds the requests open */
    fcntl(in[1], F_SETFD, FD_CLOEXEC);
    fcntl(out[0], F_SETFD, FD_CLOEXEC);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/oracle/%s", CF_SOURCE_DIR, script);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(out[1]);
        execl("/usr/bin/python3", "python3", path, "--serve", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    signal(SIGPIPE, SIG_IGN); /* a server that died fails the request instead */
    snprintf(served.script, sizeof served.script, "%s", script);
    served.pid = pid;
    served.to = fdopen(in[1], "w");
    served.from = fdopen(out[0], "r");
    assert_non_null(served.to);
    assert_non_null(served.from);
}

void oracle_serve_end(void) {
    if (!served.pid) return;
    fclose(served.to); /* end of requests: the server exits */
    fclose(served.from);
    int status;
    waitpid(served.pid, &status, 0);
    memset(&served, 0, sizeof served);
}

/* One request to the server; fails the test with the server's message on an error. */
static void oracle_request(oracle *o, const char *script, const char *args) {
    char reply[4096];
    if (fprintf(served.to, "'%s' %s\n", o->dir, args ? args : "") < 0 || fflush(served.to) != 0)
        fail_msg("oracle server %s is gone (request %s)", script, args ? args : "");
    if (!fgets(reply, sizeof reply, served.from))
        fail_msg("oracle server %s exited without answering %s", script, args ? args : "");
    reply[strcspn(reply, "\n")] = 0;
    if (strcmp(reply, "ok") != 0)
        fail_msg("oracle %s %s failed: %s", script, args ? args : "", reply);
}

void oracle_run(oracle *o, const char *script, const char *args) {
    if (served.pid && strcmp(script, served.script) == 0) {
        oracle_request(o, script, args);
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/oracle/%s %s %s", CF_SOURCE_DIR, script,
             o->dir, args ? args : "");
    int rc = system(cmd);
    if (rc != 0) fail_msg("oracle %s failed (status %d): %s", script, rc, cmd);
}

cf_tensor oracle_get(oracle *o, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.f32", o->dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("oracle output %s missing", path);
    int32_t nd = 0;
    assert_int_equal(fread(&nd, 4, 1, f), 1);
    assert_true(nd >= 0 && nd <= CF_MAX_DIMS);
    cf_shape s = {.ndim = nd};
    for (int i = 0; i < nd; i++) {
        int32_t d;
        assert_int_equal(fread(&d, 4, 1, f), 1);
        s.dim[i] = d;
    }
    size_t n = nd ? cf_shape_numel(&s) : 1;
    float *data = malloc((n + 1) * sizeof(float));
    assert_int_equal(fread(data, sizeof(float), n, f), n);
    fclose(f);
    return cf_tensor_view(data, s);
}

void fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)cf_rng_uniform(&rng);
}

double max_rel_err(const float *a, const float *b, size_t n, double floor) {
    /* fmax drops a NaN operand, so a NaN is looked for explicitly: any value that is not finite
     * on either side makes the error infinite, which no tolerance accepts. */
    double worst = 0, scale = floor;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        scale = fmax(scale, fabs(b[i]));
    }
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]) / scale);
    return worst;
}

void assert_rel_err_within(const char *what, const float *a, const float *b, size_t n, double floor,
                           double rtol) {
    double err = max_rel_err(a, b, n, floor);
    if (!(err <= rtol)) {
        for (size_t i = 0; i < n; i++)
            if (!isfinite(a[i]) || !isfinite(b[i]))
                fail_msg("%s: element %zu is %.9g against %.9g (not finite)", what, i, a[i], b[i]);
        fail_msg("%s: max relative error %.3g > %.3g", what, err, rtol);
    }
}

void assert_all_finite(const char *what, const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) fail_msg("%s: element %zu of %zu is %.9g", what, i, n, a[i]);
}

void assert_close(const char *what, const float *a, const float *b, size_t n, double rtol,
                  double atol) {
    size_t worst = 0;
    double worst_excess = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)a[i] - b[i]), tol = atol + rtol * fabs(b[i]);
        if (!(diff <= tol)) {
            bad++;
            if (diff - tol > worst_excess || bad == 1) {
                worst_excess = diff - tol;
                worst = i;
            }
        }
    }
    if (bad)
        fail_msg("%s: %d of %zu elements differ; worst at %zu: %.9g vs reference %.9g", what, bad,
                 n, worst, a[worst], b[worst]);
}

unsigned char *test_png_load_rgb(const char *path, int *width, int *height) {
    png_image image;
    memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&image, path))
        fail_msg("cannot read %s as PNG: %s", path, image.message);
    image.format = PNG_FORMAT_RGB; /* any PNG, composed onto black when it has alpha */
    unsigned char *px = malloc(PNG_IMAGE_SIZE(image));
    assert_non_null(px);
    if (!png_image_finish_read(&image, NULL, px, 0, NULL))
        fail_msg("cannot decode %s: %s", path, image.message);
    *width = (int)image.width;
    *height = (int)image.height;
    return px;
}

void oracle_assert_param_names(oracle *o, const cf_model *m, const char *what) {
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/torch_names.txt", o->dir);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("%s: cannot open %s", what, path);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) continue;
        if (n < m->n_params && strcmp(m->params[n]->full_name, line) != 0) {
            fclose(f);
            fail_msg("%s: parameter %d is %s in corefit, %s in torch", what, n,
                     m->params[n]->full_name, line);
        }
        n++;
    }
    fclose(f);
    if (n != m->n_params)
        fail_msg("%s: %d parameters in corefit, %d in torch", what, m->n_params, n);
}

void oracle_put_model_state(oracle *o, const cf_model *m, char prefix) {
    char path[512];
    snprintf(path, sizeof path, "%s/names.txt", o->dir);
    FILE *f = fopen(path, "w");
    if (!f) fail_msg("cannot write %s", path);
    for (int i = 0; i < m->n_params; i++) {
        const cf_param *p = m->params[i];
        char name[16];
        snprintf(name, sizeof name, "%c%d", prefix, i);
        oracle_put(o, name, p->data, cf_shape1((int)p->numel));
        fprintf(f, "%s\n", p->full_name);
    }
    if (fclose(f) != 0) fail_msg("cannot write %s", path);
}

void fill_bf16_specials(float *x, size_t n, uint64_t seed) {
    static const uint32_t bits[] = {0x00000001u, 0x807fffffu, 0x00400000u, 0x7fc00001u,
                                    0xffa00000u, 0x7f800001u, 0x7f800000u, 0xff800000u,
                                    0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff7fffffu,
                                    0x00000000u, 0x80000000u, 0x3f7fffffu, 0x00800000u};
    fill_uniform(x, n, seed, -3, 3);
    for (size_t i = 0; i < n; i += 7) memcpy(&x[i], &bits[(i / 7) % 16], sizeof(float));
}
