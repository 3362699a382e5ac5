/* CF_TIMING=1: where a fit's time goes, phase by phase (the loader's batches, forward, loss,
 * backward, the optimizer step, each event's callbacks, the replicas' cancel agreement), in wall
 * seconds and in this process's CPU seconds (every thread: the pool's parts count), for the
 * training and the validation batches apart. Printed on stderr at the end of each fit (each fork
 * worker prints its own); bench/scaling.py --env CF_TIMING=1 --show shows it. Off: one branch. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "core/pool.h"
#include "learn/internal.h"

enum { SLOTS = CF__PH_COUNT + CF_EV_COUNT };

typedef struct phase_sum {
    double wall, cpu;
    long n;
} phase_sum;

static int on = -1;              /* -1: not read yet */
static phase_sum sums[2][SLOTS]; /* [training][slot] */

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool cf__phases_on(void) {
    if (on < 0) on = cf__timing_requested();
    return on;
}

cf__phase_mark cf__phase_begin(void) {
    if (!cf__phases_on()) return (cf__phase_mark){0, 0};
    return (cf__phase_mark){clock_s(CLOCK_MONOTONIC), clock_s(CLOCK_PROCESS_CPUTIME_ID)};
}

void cf__phase_end(const cf_learner *learn, cf__phase_mark m, int slot) {
    if (!cf__phases_on() || slot < 0 || slot >= SLOTS) return;
    phase_sum *s = &sums[learn->training ? 1 : 0][slot];
    s->wall += clock_s(CLOCK_MONOTONIC) - m.wall;
    s->cpu += clock_s(CLOCK_PROCESS_CPUTIME_ID) - m.cpu;
    s->n++;
}

void cf__phases_reset(void) {
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < SLOTS; i++) sums[t][i] = (phase_sum){0, 0, 0};
}

static const char *const phase_names[CF__PH_COUNT] = {"data",     "forward", "loss",
                                                      "backward", "step",    "sync"};

/* Appends to the report (whole lines, written at once: fork workers print side by side). */
typedef struct report {
    char text[8192];
    size_t len;
} report;

static void add(report *r, const char *fmt, ...) {
    if (r->len >= sizeof r->text) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->text + r->len, sizeof r->text - r->len, fmt, ap);
    va_end(ap);
    if (n > 0) r->len += (size_t)n < sizeof r->text - r->len ? (size_t)n : sizeof r->text - r->len;
}

void cf__phases_report(const cf_learner *learn, cf__phase_mark fit) {
    if (!cf__phases_on()) return;
    const double wall = clock_s(CLOCK_MONOTONIC) - fit.wall;
    const double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - fit.cpu;
    double timed_wall = 0, timed_cpu = 0;
    char who[32] = "";
    if (learn->replica.world > 1) snprintf(who, sizeof who, " (rank %d)", learn->replica.rank);
    static report r; /* 8 KiB: not on a worker's stack */
    r.len = 0;
    add(&r, "timing: fit%s: wall %.3f s, CPU %.3f s\n", who, wall, cpu);
    for (int t = 1; t >= 0; t--) {
        add(&r, "timing: fit%s %s (wall/CPU s, calls):", who, t ? "train" : "valid");
        double w = 0, c = 0;
        for (int i = 0; i < SLOTS; i++) {
            const phase_sum *s = &sums[t][i];
            w += s->wall;
            c += s->cpu;
            if (i < CF__PH_COUNT)
                add(&r, " %s %.3f/%.3f %ld,", phase_names[i], s->wall, s->cpu, s->n);
        }
        double ew = 0, ec = 0;
        for (int i = CF__PH_COUNT; i < SLOTS; i++) {
            ew += sums[t][i].wall;
            ec += sums[t][i].cpu;
        }
        add(&r, " events %.3f/%.3f; all %.3f/%.3f\n", ew, ec, w, c);
        for (int i = CF__PH_COUNT; i < SLOTS; i++) {
            const phase_sum *s = &sums[t][i];
            if (s->wall >= 1e-3)
                add(&r, "timing: fit%s %s event %s: %.3f/%.3f s, %ld calls\n", who,
                    t ? "train" : "valid", cf_event_name((cf_event)(i - CF__PH_COUNT)), s->wall,
                    s->cpu, s->n);
        }
        timed_wall += w;
        timed_cpu += c;
    }
    add(&r, "timing: fit%s untimed (the loop itself, epoch set-up): %.3f/%.3f s\n", who,
        wall - timed_wall, cpu - timed_cpu);
    fwrite(r.text, 1, r.len, stderr);
    cf__phases_reset();
}
