/* The LSTM step against torch.nn.LSTM on the AWD-LSTM language model's shapes
 * (awd_lstm_lm_config: emb 400, hidden 1152, 3 layers; batch 64, seq_len 72): each layer's
 * forward and backward (input and weight gradients, the state carried), one thread, best of
 * REPS; PyTorch's side is bench/lstm_torch.py, run by this program.
 *
 *     build/bench_lstm [REPS [PEER]]   from the source folder (PEER: bench/lstm_torch.py);
 *                                      CF_ISA caps the instruction set */
#include "corefit/nn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void cpu_name(char *out, size_t size) {
    snprintf(out, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            if (v) {
                snprintf(out, size, "%s", v + 2);
                out[strcspn(out, "\n")] = 0;
            }
            break;
        }
    fclose(f);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 5, bs = 64, steps = 72;
    const int shapes[3][2] = {{400, 1152}, {1152, 1152}, {1152, 400}};
    cf_set_num_threads(1);
    double ours[3];
    for (int s = 0; s < 3; s++) {
        const int in = shapes[s][0], hid = shapes[s][1];
        cf_model *model = NULL;
        if (cf_model_new(&model, cf_lstm(in, hid), 1) != CF_OK) {
            fprintf(stderr, "bench_lstm: %s\n", cf_last_error());
            return 1;
        }
        const cf_shape xs = {.ndim = 3, .dim = {bs, steps, in}};
        const cf_shape ys = {.ndim = 3, .dim = {bs, steps, hid}};
        float *x = malloc(cf_shape_numel(&xs) * sizeof(float));
        float *dy = malloc(cf_shape_numel(&ys) * sizeof(float));
        for (size_t i = 0; i < cf_shape_numel(&xs); i++)
            x[i] = (float)((i * 7919) % 1000) / 500 - 1;
        for (size_t i = 0; i < cf_shape_numel(&ys); i++)
            dy[i] = (float)((i * 104729) % 1000) / 1e4f;
        cf_tensor xt = cf_tensor_view(x, xs), dyt = cf_tensor_view(dy, ys);
        double best = 1e30;
        for (int r = 0; r < reps + 1; r++) { /* the first is a warm-up */
            const double t0 = now_s();
            const cf_tensor *y;
            cf_model_forward(model, &xt, &y);
            /* the input gradient too, as a layer above the first needs it */
            model->root->ops->backward(model->root, &dyt, true);
            const double t = now_s() - t0;
            if (r > 0 && t < best) best = t;
        }
        ours[s] = best * 1e3;
        free(x);
        free(dy);
        cf_model_free(model);
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %d %d %d 400:1152 1152:1152 1152:400",
             argc > 2 ? argv[2] : "bench/lstm_torch.py", reps, bs, steps);
    FILE *p = popen(cmd, "r");
    double theirs[3] = {0, 0, 0};
    for (int s = 0; p && s < 3; s++)
        if (fscanf(p, "%lf", &theirs[s]) != 1) theirs[s] = 0;
    if (p) pclose(p);
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    printf("LSTM forward + backward, batch %d, seq_len %d, 1 thread, %s, corefit at %s (BLAS %s)\n",
           bs, steps, cpu, cf_isa_name(cf_isa_active()), cf_blas_core());
    printf("%-14s %12s %12s %8s\n", "layer", "corefit ms", "torch ms", "ratio");
    double to = 0, tt = 0;
    for (int s = 0; s < 3; s++) {
        char name[32];
        snprintf(name, sizeof name, "%d->%d", shapes[s][0], shapes[s][1]);
        printf("%-14s %12.2f %12.2f %8.2f\n", name, ours[s], theirs[s],
               ours[s] > 0 ? theirs[s] / ours[s] : 0);
        to += ours[s];
        tt += theirs[s];
    }
    printf("%-14s %12.2f %12.2f %8.2f   (ratio: torch time / corefit time)\n", "all 3 layers", to,
           tt, tt / to);
    return 0;
}
