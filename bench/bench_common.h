/* The measuring harness shared by the workload benchmarks (bench_w1, bench_vgg, bench_images):
 * command line, timing callback, memory accounting and the one JSON line. A workload supplies
 * its learner, its one-cycle recipe (or its own fit and loaders) and its FLOP count; everything
 * else is identical between workloads, so that bench/run.py reads every workload's line alike.
 *
 *   PROG [--threads N | --cores N | --mpi] [--batches B | --epochs E] [--skip S]
 *        [--data DIR] [--seed S] [--checkpoint-every K] [--bf16] [--check] [workload options]
 *
 *   --threads N   one process, N threads (cf_set_num_threads)            (default: 1)
 *   --cores N     cf_par_fit_one_cycle over N forked workers, bs 64 each
 *   --mpi         cf_par_fit_one_cycle with start_method mpi: run it under mpirun -np N;
 *                 rank 0 prints the line
 *   --batches B   stop the fit after B training steps (the schedule still spans --epochs
 *                 epochs, or as many as B steps need when an epoch has fewer); no validation.
 *                 Default: whole epochs and the test accuracy.
 *   --checkpoint-every K  a checkpoint (cf_checkpoint_cb) every K training steps, to a file in
 *                 /tmp removed at the end (0, the default: no checkpoint callback at all)
 *   --bf16        cf_learner_to_bf16 before the fit (mixed precision; the JSON line's bf16_compute
 *                 says whether the kernel level computed in bf16)
 *   --check       the determinism check: after the fit, print the last training batch's loss and
 *                 a hash of the model's weights and buffers (one process only; with --batches B,
 *                 B steps from the seed's start: the same line on every run of one build and
 *                 thread count, so a change that should be bitwise can be checked against it)
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
 * Header-only (static functions): every benchmark source file is a program of its own. */
#ifndef COREFIT_BENCH_COMMON_H
#define COREFIT_BENCH_COMMON_H

#include <corefit.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

/* What a workload program supplies to bench_main. */
typedef struct bench_workload {
    const char *prog;            /* program name, for usage and error messages */
    double train_flop_per_image; /* FLOPs of one training step per image (for gflops) */
    double lr_max;               /* fit_one_cycle's lr_max */
    const double *moms;          /* fit_one_cycle's moms (3 values); NULL: the learner's */
    /* Builds the learner on dls, with the test accuracy as its only metric (the JSON line reads
     * final_record[1]) and .quiet set. */
    cf_status (*make_learner)(cf_learner **out, cf_dls *dls, uint64_t seed);
    /* Optional; NULL takes the default given. */
    const char *default_data; /* --data (NULL: Debian's Fashion-MNIST folder) */
    /* The loaders, bs per process (NULL: Fashion-MNIST through cf_dls_from_idx_dir, normalised
     * with its statistics). */
    cf_status (*make_dls)(cf_dls **out, const char *data, int bs, uint64_t seed);
    /* The fit, with the harness's callbacks (NULL: fit_one_cycle(lr_max, moms)). timing is true
     * for --batches, when the callbacks stop the fit. par is NULL for one process, else the
     * options of the parallel twin to call. */
    cf_status (*fit)(cf_learner *learn, int epochs, bool timing, cf_callback **cbs, int n_cbs,
                     const cf_par_opts *par);
    /* Options of the workload's own: 1 when it took NAME VALUE, 0 when NAME is not its own, -1
     * for a bad VALUE (it says why on stderr). usage_extra lists them for the usage line. */
    int (*parse_opt)(const char *name, const char *value);
    const char *usage_extra;
    /* Fields of the workload's own for the JSON line, each written as `"key": value, `. */
    void (*json_extra)(FILE *f, const cf_dls *dls);
    int bs; /* batch size per process (0: 64) */
} bench_workload;

typedef enum bench_mode { BENCH_THREADS, BENCH_FORK, BENCH_MPI } bench_mode;

/* What rank 0 reports. In fork mode it lives in a shared mapping made before the workers are
 * forked, so that the supervisor can read what rank 0 wrote. */
typedef struct bench_report {
    int steps;     /* training steps seen */
    int world;     /* replicas */
    double t_skip; /* end of step `skip` */
    double t_last; /* end of the last step */
    double cpu_s;  /* sum over replicas of CPU seconds (user + system) in the timed window */
    double rss_kb; /* sum over replicas of their peak RSS (KiB) */
    double pss_kb; /* sum over replicas of their PSS at the end of training (KiB) */
    float loss;    /* the last training batch's loss (--check) */
    int done;
} bench_report;

/* Per process (each worker has its own copy); rank 0 copies it into the report. */
typedef struct bench_timing {
    int skip, max_steps;
    int steps;
    double t_skip, t_last;
    double cpu_skip, cpu_last;
    float loss; /* the last training batch's */
    bool done;
    bench_report *out;
} bench_timing;

static double bench_pss_kb_self(void) {
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

static double bench_cpu_s_self(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static double bench_peak_rss_kb_self(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss;
}

static cf_status bench_finish(bench_timing *t, cf_learner *learn) {
    if (t->done) return CF_OK;
    t->done = true;
    double sums[3] = {bench_peak_rss_kb_self(), bench_pss_kb_self(), t->cpu_last - t->cpu_skip};
    /* every replica runs this callback at the same event, so the collective matches */
    if (learn->replica.comm && cf_comm_size(learn->replica.comm) > 1) {
        cf_status st = cf_comm_allreduce_sum_f64(learn->replica.comm, sums, 3);
        if (st != CF_OK) return st;
    }
    if (!learn->replica.comm || cf_comm_rank(learn->replica.comm) == 0) {
        bench_report *r = t->out;
        r->steps = t->steps;
        r->t_skip = t->t_skip;
        r->t_last = t->t_last;
        r->rss_kb = sums[0];
        r->pss_kb = sums[1];
        r->cpu_s = sums[2];
        r->loss = t->loss;
        r->world = learn->replica.comm ? cf_comm_size(learn->replica.comm) : 1;
        r->done = 1;
    }
    return CF_OK;
}

static cf_status bench_timing_after_batch(cf_callback *cb, cf_learner *learn) {
    bench_timing *t = cb->state;
    if (!learn->training) return CF_OK;
    double now = cf_now();
    t->steps++;
    t->loss = learn->loss_value;
    double cpu = bench_cpu_s_self();
    if (t->steps == t->skip) {
        t->t_skip = now;
        t->cpu_skip = cpu;
    }
    t->t_last = now;
    t->cpu_last = cpu;
    if (t->max_steps > 0 && t->steps >= t->max_steps) {
        cf_status st = bench_finish(t, learn);
        if (st != CF_OK) return st;
        cf_learner_cancel(learn, CF_CANCEL_FIT);
    }
    return CF_OK;
}

static cf_status bench_timing_after_train(cf_callback *cb, cf_learner *learn) {
    bench_timing *t = cb->state;
    /* end of the last epoch's training: memory before validation */
    if (learn->epoch == learn->n_epoch - 1) return bench_finish(t, learn);
    return CF_OK;
}

/* A timing run measures training only: a fit of several short epochs skips their validation. */
static cf_status bench_timing_before_validate(cf_callback *cb, cf_learner *learn) {
    bench_timing *t = cb->state;
    if (t->max_steps > 0) cf_learner_cancel(learn, CF_CANCEL_VALIDATE);
    return CF_OK;
}

static void bench_usage(const bench_workload *w) {
    fprintf(stderr,
            "usage: %s [--threads N | --cores N | --mpi] [--batches B | --epochs E] "
            "[--skip S] [--data DIR] [--seed S] [--checkpoint-every K] [--bf16] [--check]%s%s\n",
            w->prog, w->usage_extra ? " " : "", w->usage_extra ? w->usage_extra : "");
}

/* The training batches per epoch of each of `world` replicas (fastai's drop_last, after
 * CF_SHARD_PER_RANK's padding to a multiple of world). */
static int64_t bench_batches_per_epoch(const cf_dls *dls, int bs, int world) {
    int64_t n = dls->train_ds->n;
    int64_t chunk = (n + world - 1) / world;
    return chunk / bs;
}

#define BENCH_CHECK(prog, call)                                                                    \
    do {                                                                                           \
        if ((call) != CF_OK) {                                                                     \
            fprintf(stderr, "%s: %s\n", (prog), cf_last_error());                                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Parses the command line, trains the workload on its data (Fashion-MNIST unless it has
 * make_dls; bs 64 per process unless the workload sets it) and prints the JSON line on rank 0.
 * Returns the process's exit status: 0, 1 on a failed call, 2 on a bad command line. */
static int bench_main(int argc, char **argv, const bench_workload *w) {
    const char *prog = w->prog;
    bench_mode md = BENCH_THREADS;
    int n = 1, batches = 0, epochs = 1, skip = 5, ckpt_every = 0;
    unsigned long long seed = 42;
    bool bf16 = false;  /* --bf16: cf_learner_to_bf16 before the fit */
    bool check = false; /* --check: the loss and the weights' hash after the fit */
    const char *data = w->default_data ? w->default_data : "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--mpi")) {
            md = BENCH_MPI;
            continue;
        }
        if (!strcmp(a, "--bf16")) {
            bf16 = true;
            continue;
        }
        if (!strcmp(a, "--check")) {
            check = true;
            continue;
        }
        if (!v) {
            bench_usage(w);
            return 2;
        }
        if (!strcmp(a, "--threads")) {
            md = BENCH_THREADS;
            n = atoi(v);
        } else if (!strcmp(a, "--cores")) {
            md = BENCH_FORK;
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
        else if (!strcmp(a, "--checkpoint-every"))
            ckpt_every = atoi(v);
        else {
            int took = w->parse_opt ? w->parse_opt(a, v) : 0;
            if (took < 0) return 2;
            if (took == 0) {
                bench_usage(w);
                return 2;
            }
        }
        i++;
    }
    if (n < 1 || epochs < 1 || batches < 0 || skip < 1 || (batches && batches <= skip)) {
        fprintf(stderr, "%s: need N >= 1, E >= 1, 1 <= S < B\n", prog);
        return 2;
    }
    if (check && md != BENCH_THREADS) {
        fprintf(stderr, "%s: --check runs in one process (--threads N)\n", prog);
        return 2;
    }
    const int bs = w->bs > 0 ? w->bs : 64;
    cf_set_num_threads(md == BENCH_THREADS ? n : 1);
    /* Under mpirun: initialise MPI here (so that this world finalises it at the end); the fit
     * joins the same MPI_COMM_WORLD. */
    cf_comm *mpi = NULL;
    if (md == BENCH_MPI) BENCH_CHECK(prog, cf_comm_mpi_new(&mpi));
    bool is_rank0 = !mpi || cf_comm_rank(mpi) == 0;

    bench_report *rep =
        mmap(NULL, sizeof(bench_report), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == MAP_FAILED) {
        fprintf(stderr, "%s: mmap: %s\n", prog, strerror(errno));
        return 1;
    }
    memset(rep, 0, sizeof *rep);
    bench_timing tstate = {.skip = skip, .max_steps = batches, .out = rep};
    static cf_callback tcb = {.name = "BenchTiming", .skip_valid = true};
    tcb.on[CF_EV_AFTER_BATCH] = bench_timing_after_batch;
    tcb.on[CF_EV_AFTER_TRAIN] = bench_timing_after_train;
    tcb.on[CF_EV_BEFORE_VALIDATE] = bench_timing_before_validate;
    tcb.state = &tstate;

    double t0 = cf_now();
    cf_dls *dls = NULL;
    if (w->make_dls)
        BENCH_CHECK(prog, w->make_dls(&dls, data, bs, seed));
    else
        BENCH_CHECK(
            prog, cf_dls_from_idx_dir(
                      data,
                      &(cf_dls_options){
                          .bs = bs, .seed = seed, .n_norm = 1, .mean = {0.2860f}, .std = {0.3530f}},
                      &dls));
    /* A timing run needs its B steps inside the schedule: more epochs when one is shorter. */
    int world = md == BENCH_FORK ? n : md == BENCH_MPI ? cf_comm_size(mpi) : 1;
    int64_t per_epoch = bench_batches_per_epoch(dls, bs, world);
    if (per_epoch < 1) {
        fprintf(stderr, "%s: %lld training images are under one batch of %d per replica\n", prog,
                (long long)dls->train_ds->n, bs);
        return 1;
    }
    if (batches && (int64_t)epochs * per_epoch < batches)
        epochs = (int)((batches + per_epoch - 1) / per_epoch);
    cf_learner *learn = NULL;
    BENCH_CHECK(prog, w->make_learner(&learn, dls, seed));
    if (bf16) BENCH_CHECK(prog, cf_learner_to_bf16(learn));
    char ckpt[64];
    snprintf(ckpt, sizeof ckpt, "/tmp/%s-%ld.ckpt", prog, (long)getpid());
    cf_callback *cbs[] = {
        &tcb, ckpt_every > 0 ? cf_checkpoint_cb(.fname = ckpt, .every_batches = ckpt_every) : NULL};
    int n_cbs = ckpt_every > 0 ? 2 : 1;
    double t_fit = cf_now();
    cf_status st;
    const cf_par_opts par = {.num_cores = md == BENCH_FORK ? n : 0,
                             .start_method = md == BENCH_MPI ? CF_START_MPI : CF_START_FORK};
    if (w->fit)
        st = w->fit(learn, epochs, batches > 0, cbs, n_cbs, md == BENCH_THREADS ? NULL : &par);
    else if (md == BENCH_THREADS)
        st = cf_fit_one_cycle(learn, epochs, .lr_max = CF_LR(w->lr_max), .moms = w->moms,
                              .cbs = cbs, .n_cbs = n_cbs);
    else
        st = cf_par_fit_one_cycle(learn, epochs, .lr_max = CF_LR(w->lr_max), .moms = w->moms,
                                  .cbs = cbs, .n_cbs = n_cbs, .par = par);
    double t_end = cf_now();
    if (ckpt_every > 0 && is_rank0) unlink(ckpt);
    BENCH_CHECK(prog, st);

    if (is_rank0) {
        world = rep->world > 0 ? rep->world : 1;
        double rss_kb = rep->rss_kb, pss_kb = rep->pss_kb;
        if (md == BENCH_FORK) { /* the supervisor itself */
            rss_kb += bench_peak_rss_kb_self();
            pss_kb += bench_pss_kb_self();
        }
        int timed = rep->steps - skip;
        double span = rep->t_last - rep->t_skip;
        double ips = timed > 0 && span > 0 ? (double)timed * bs * world / span : 0;
        double flop = w->train_flop_per_image;
        double acc = NAN;
        if (!batches && learn->final_record && learn->n_final_record >= 2)
            acc = learn->final_record[1];
        const char *mode_name = md == BENCH_THREADS ? "threads" : md == BENCH_FORK ? "fork" : "mpi";
        printf("{\"impl\": \"corefit\", \"mode\": \"%s\", \"procs\": %d, \"threads\": %d, "
               "\"bs\": %d, \"steps\": %d, \"timed_steps\": %d, \"images_per_s\": %.3f, "
               "\"measured\": \"wall time from the end of training step %d to the end of the "
               "last step on rank 0 (after_batch callback), %d*%d images per step; includes "
               "waiting for the loader\", \"gflops\": %.3f, \"mflop_per_image\": %.6f, ",
               mode_name, world, md == BENCH_THREADS ? n : 1, bs, rep->steps, timed, ips, skip, bs,
               world, ips * flop / 1e9, flop / 1e6);
        if (isnan(acc))
            printf("\"test_acc\": null, ");
        else
            printf("\"test_acc\": %.4f, ", acc);
        printf("\"checkpoint_every\": %d, \"epochs\": %d, ", ckpt_every, epochs);
        if (w->json_extra) w->json_extra(stdout, dls);
        printf("\"cpu_s\": %.3f, \"images_per_cpu_s\": %.3f, ", rep->cpu_s,
               rep->cpu_s > 0 ? (double)timed * bs * world / rep->cpu_s : 0);
        printf("\"call_s\": %.3f, \"setup_s\": %.3f, \"peak_rss_mb\": %.1f, \"pss_mb\": %.1f, "
               "\"blas_core\": \"%s\", \"isa\": \"%s\", \"bf16\": %s, \"bf16_compute\": %s}\n",
               t_end - t_fit, t_fit - t0, rss_kb / 1024, pss_kb / 1024, cf_blas_core(),
               cf_isa_name(cf_isa_active()), bf16 ? "true" : "false",
               bf16 && cf_bf16_compute() ? "true" : "false");
        if (check) {
            /* FNV-1a over the fp32 words, as bench_step --check */
            const cf_model *m = learn->model;
            uint64_t h = 1469598103934665603ULL;
            for (size_t i = 0; i < m->n_weights; i++) {
                uint32_t u;
                memcpy(&u, &m->weights[i], 4);
                h = (h ^ u) * 1099511628211ULL;
            }
            for (size_t i = 0; i < m->n_buffers; i++) {
                uint32_t u;
                memcpy(&u, &m->buffers[i], 4);
                h = (h ^ u) * 1099511628211ULL;
            }
            printf("check: %d steps, loss %.7f, weights+buffers hash %016llx\n", rep->steps,
                   (double)rep->loss, (unsigned long long)h);
        }
        fflush(stdout);
    }
    cf_learner_free(learn);
    cf_dls_free(dls);
    munmap(rep, sizeof *rep);
    cf_comm_free(mpi);
    return 0;
}

#endif
