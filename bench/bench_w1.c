/* Trains the W1 workload (mini-resnet on Fashion-MNIST, fastai's Adam,
 * fit_one_cycle lr_max 3e-3, batch 64 per process) and prints one JSON line: training images/s,
 * achieved GFLOP/s, test accuracy (epoch runs), peak memory of the whole run.
 *
 *   bench_w1 [--threads N | --cores N | --mpi] [--batches B | --epochs E] [--skip S]
 *            [--data DIR] [--seed S]
 *
 *   --threads N   one process, N threads (cf_set_num_threads)            (default: 1)
 *   --cores N     cf_par_fit_one_cycle over N forked workers, bs 64 each
 *   --mpi         cf_par_fit_one_cycle with start_method mpi: run it under mpirun -np N;
 *                 rank 0 prints the line
 *   --batches B   stop the fit after B training steps (the schedule still spans --epochs
 *                 epochs); no validation. Default: whole epochs and the test accuracy.
 *
 * What is measured: a callback on every replica takes a timestamp at the end of each training
 * batch (after_batch: forward, loss, backward, gradient all-reduce, optimizer step and the
 * scheduler); images/s = (steps - S) * bs * world / (time from the end of step S to the end of
 * the last step), on rank 0 (steps are synchronised by the all-reduce, so every rank agrees).
 * This includes waiting for the next batch from the loader. call_s is the wall time of the whole
 * fit call (process start-up, sharding, validation, bringing results home) for comparison.
 *
 * Memory: peak_rss_mb is the sum over every process of its own peak resident set (this process
 * plus every worker): an upper bound, since pages forked workers share with their parent are
 * counted in each. pss_mb is the sum of the proportional set sizes (shared pages divided among
 * their sharers) read from /proc at the end of training: the memory the run really held then.
 *
 * GFLOP/s counts 2 FLOPs per multiply-add of the convolutions and linear layers, three times per
 * training step (forward, input gradient, weight gradient) less the stem's input gradient, which
 * is never computed; element-wise layers are not counted. */
#include <corefit.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

typedef enum mode { MODE_THREADS, MODE_FORK, MODE_MPI } mode;

/* What rank 0 reports. In fork mode it lives in a shared mapping made before the workers are
 * forked, so that the supervisor can read what rank 0 wrote. */
typedef struct report {
    int steps;     /* training steps seen */
    int world;     /* replicas */
    double t_skip; /* end of step `skip` */
    double t_last; /* end of the last step */
    double cpu_s;  /* sum over replicas of CPU seconds (user + system) in the timed window */
    double rss_kb; /* sum over replicas of their peak RSS (KiB) */
    double pss_kb; /* sum over replicas of their PSS at the end of training (KiB) */
    int done;
} report;

/* Per process (each worker has its own copy); rank 0 copies it into the report. */
typedef struct timing {
    int skip, max_steps;
    int steps;
    double t_skip, t_last;
    double cpu_skip, cpu_last;
    bool done;
    report *out;
} timing;

static double pss_kb_self(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Pss:", 4) == 0) {
            kb = atof(line + 4);
            break;
        }
    fclose(f);
    return kb;
}

static double cpu_s_self(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static double peak_rss_kb_self(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss;
}

static cf_status finish(timing *t, cf_learner *learn) {
    if (t->done) return CF_OK;
    t->done = true;
    double sums[3] = {peak_rss_kb_self(), pss_kb_self(), t->cpu_last - t->cpu_skip};
    /* every replica runs this callback at the same event, so the collective matches */
    if (learn->replica.comm && cf_comm_size(learn->replica.comm) > 1) {
        cf_status st = cf_comm_allreduce_sum_f64(learn->replica.comm, sums, 3);
        if (st != CF_OK) return st;
    }
    if (!learn->replica.comm || cf_comm_rank(learn->replica.comm) == 0) {
        report *r = t->out;
        r->steps = t->steps;
        r->t_skip = t->t_skip;
        r->t_last = t->t_last;
        r->rss_kb = sums[0];
        r->pss_kb = sums[1];
        r->cpu_s = sums[2];
        r->world = learn->replica.comm ? cf_comm_size(learn->replica.comm) : 1;
        r->done = 1;
    }
    return CF_OK;
}

static cf_status timing_after_batch(cf_callback *cb, cf_learner *learn) {
    timing *t = cb->state;
    if (!learn->training) return CF_OK;
    double now = cf_now();
    t->steps++;
    double cpu = cpu_s_self();
    if (t->steps == t->skip) {
        t->t_skip = now;
        t->cpu_skip = cpu;
    }
    t->t_last = now;
    t->cpu_last = cpu;
    if (t->max_steps > 0 && t->steps >= t->max_steps) {
        cf_status st = finish(t, learn);
        if (st != CF_OK) return st;
        cf_learner_cancel(learn, CF_CANCEL_FIT);
    }
    return CF_OK;
}

static cf_status timing_after_train(cf_callback *cb, cf_learner *learn) {
    timing *t = cb->state;
    /* end of the last epoch's training: memory before validation */
    if (learn->epoch == learn->n_epoch - 1) return finish(t, learn);
    return CF_OK;
}

/* Exact FLOPs per image per training step of W1 (see the header comment). */
static double w1_train_flop_per_image(void) {
    static const int convs[][5] = {/* c_in, c_out, k, h_out, w_out */
                                   {1, 16, 3, 28, 28},  {16, 32, 3, 14, 14}, {32, 32, 3, 14, 14},
                                   {16, 32, 1, 14, 14}, {32, 64, 3, 7, 7},   {64, 64, 3, 7, 7},
                                   {32, 64, 1, 7, 7}};
    double fwd = 0, stem = 0;
    for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) {
        const int *c = convs[i];
        double f = 2.0 * c[0] * c[1] * c[2] * c[2] * c[3] * c[4];
        if (i == 0) stem = f;
        fwd += f;
    }
    fwd += 2.0 * 128 * 256 + 2.0 * 256 * 10;
    return 3 * fwd - stem;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_w1 [--threads N | --cores N | --mpi] [--batches B | --epochs E] "
                    "[--skip S] [--data DIR] [--seed S]\n");
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != CF_OK) {                                                                     \
            fprintf(stderr, "bench_w1: %s\n", cf_last_error());                                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    mode md = MODE_THREADS;
    int n = 1, batches = 0, epochs = 1, skip = 5;
    unsigned long long seed = 42;
    const char *data = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--mpi")) {
            md = MODE_MPI;
            continue;
        }
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(a, "--threads")) {
            md = MODE_THREADS;
            n = atoi(v);
        } else if (!strcmp(a, "--cores")) {
            md = MODE_FORK;
            n = atoi(v);
        } else if (!strcmp(a, "--batches"))
            batches = atoi(v);
        else if (!strcmp(a, "--epochs"))
            epochs = atoi(v);
        else if (!strcmp(a, "--skip"))
            skip = atoi(v);
        else if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else {
            usage();
            return 2;
        }
        i++;
    }
    if (n < 1 || epochs < 1 || batches < 0 || skip < 1 || (batches && batches <= skip)) {
        fprintf(stderr, "bench_w1: need N >= 1, E >= 1, 1 <= S < B\n");
        return 2;
    }
    const int bs = 64;
    cf_set_num_threads(md == MODE_THREADS ? n : 1);
    /* Under mpirun: initialise MPI here (so that this world finalises it at the end); the fit
     * joins the same MPI_COMM_WORLD. */
    cf_comm *mpi = NULL;
    if (md == MODE_MPI) CHECK(cf_comm_mpi_new(&mpi));
    bool is_rank0 = !mpi || cf_comm_rank(mpi) == 0;

    report *rep =
        mmap(NULL, sizeof(report), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == MAP_FAILED) {
        perror("bench_w1: mmap");
        return 1;
    }
    memset(rep, 0, sizeof *rep);
    timing tstate = {.skip = skip, .max_steps = batches, .out = rep};
    static cf_callback tcb = {.name = "BenchTiming", .skip_valid = true};
    tcb.on[CF_EV_AFTER_BATCH] = timing_after_batch;
    tcb.on[CF_EV_AFTER_TRAIN] = timing_after_train;
    tcb.state = &tstate;

    double t0 = cf_now();
    cf_dls *dls = NULL;
    CHECK(cf_dls_from_idx_dir(
        data,
        &(cf_dls_options){.bs = bs, .seed = seed, .n_norm = 1, .mean = {0.2860f}, .std = {0.3530f}},
        &dls));
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    CHECK(cf_vision_learner(&learn, dls, CF_ARCH_MINI_RESNET, .metrics = metrics, .n_metrics = 1,
                            .quiet = true, .seed = seed, .path = "/tmp"));
    cf_callback *cbs[] = {&tcb};
    double t_fit = cf_now();
    cf_status st;
    if (md == MODE_THREADS)
        st = cf_fit_one_cycle(learn, epochs, .lr_max = CF_LR(3e-3), .cbs = cbs, .n_cbs = 1);
    else
        st = cf_par_fit_one_cycle(
            learn, epochs, .lr_max = CF_LR(3e-3), .cbs = cbs, .n_cbs = 1,
            .par = {.num_cores = md == MODE_FORK ? n : 0,
                    .start_method = md == MODE_MPI ? CF_START_MPI : CF_START_FORK});
    double t_end = cf_now();
    CHECK(st);

    if (is_rank0) {
        int world = rep->world > 0 ? rep->world : 1;
        double rss_kb = rep->rss_kb, pss_kb = rep->pss_kb;
        if (md == MODE_FORK) { /* the supervisor itself */
            rss_kb += peak_rss_kb_self();
            pss_kb += pss_kb_self();
        }
        int timed = rep->steps - skip;
        double span = rep->t_last - rep->t_skip;
        double ips = timed > 0 && span > 0 ? (double)timed * bs * world / span : 0;
        double flop = w1_train_flop_per_image();
        double acc = NAN;
        if (!batches && learn->final_record && learn->n_final_record >= 2)
            acc = learn->final_record[1];
        const char *mode_name = md == MODE_THREADS ? "threads" : md == MODE_FORK ? "fork" : "mpi";
        printf("{\"impl\": \"corefit\", \"mode\": \"%s\", \"procs\": %d, \"threads\": %d, "
               "\"bs\": %d, \"steps\": %d, \"timed_steps\": %d, \"images_per_s\": %.3f, "
               "\"measured\": \"wall time from the end of training step %d to the end of the "
               "last step on rank 0 (after_batch callback), %d*%d images per step; includes "
               "waiting for the loader\", \"gflops\": %.3f, \"mflop_per_image\": %.6f, ",
               mode_name, world, md == MODE_THREADS ? n : 1, bs, rep->steps, timed, ips, skip, bs,
               world, ips * flop / 1e9, flop / 1e6);
        if (isnan(acc))
            printf("\"test_acc\": null, ");
        else
            printf("\"test_acc\": %.4f, ", acc);
        printf("\"cpu_s\": %.3f, \"images_per_cpu_s\": %.3f, ", rep->cpu_s,
               rep->cpu_s > 0 ? (double)timed * bs * world / rep->cpu_s : 0);
        printf("\"call_s\": %.3f, \"setup_s\": %.3f, \"peak_rss_mb\": %.1f, \"pss_mb\": %.1f, "
               "\"blas_core\": \"%s\"}\n",
               t_end - t_fit, t_fit - t0, rss_kb / 1024, pss_kb / 1024, cf_blas_core());
        fflush(stdout);
    }
    cf_learner_free(learn);
    cf_dls_free(dls);
    munmap(rep, sizeof *rep);
    cf_comm_free(mpi);
    return 0;
}
