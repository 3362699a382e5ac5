#!/usr/bin/python3
"""Whole-run scaling of `corefit train` (W1: the mini-resnet on Fashion-MNIST, one epoch of
fit_one_cycle), as wall-time ratios against the one-core one-thread run:

  1t   corefit train --cores 1 --threads 1         (the reference)
  Nc   corefit train --cores N                     (N fork workers, one core each)
  Nt   corefit train --cores 1 --threads N         (one process, N threads)
  Ncs  corefit train --cores N --split-batch       (only with --only: N workers of --bs/N
                                                    images; other results, so no goal)

Each run is the whole command: process start, data load, model build, the fit with its
validation, the hand-over of the workers' results and the saved model. The three commands run
alternately, --runs times each, per instruction set (CF_ISA), and the script prints every run's
wall and CPU seconds (user + system of the command and all its children) and the medians, then
the ratios median(Nc)/median(1t) and median(Nt)/median(1t) against --goal (0.55, issue 32).
CPU seconds per run show what the extra core costs: on an ideal machine Nc's CPU seconds equal
1t's and its wall time is half of it.

    /usr/bin/python3 bench/scaling.py --build build [--cores 2] [--runs 3] [--isa avx512,avx2]
                                      [--epochs 1] [--limit N] [--env CF_TIMING=1] [--args '...']

The commands run with train's defaults (a checkpoint every 100 batches included), as a user
runs them; --args adds options to all three. --env CF_TIMING=1 --show prints where each run's
time went: the phases of the command (start-up, fit, hand-over, save), each fork worker's time
in barriers (with the waits that outlasted the spin and the futex naps they took) and the
in-process thread pool's jobs and sleeps.

Wall ratios are only meaningful on a quiet machine: the script prints the load average and
refuses to measure at --max-load (default 2 on a 2-core machine: the number of cores) or above
unless --force. With --force on a loaded machine, read the CPU seconds rather than the walls.

A quiet guest is not enough on a virtual machine: the host can slow one virtual CPU for seconds
at a time (its other tenants; seen on the 2-core KVM guest of bench/README.md at 26-39 G
multiply-adds per CPU-second of a loop that never leaves L1, at any load), and an N-core run then
waits for its slowest core while a one-core run does not. So before and after each run the
script times a fixed loop of loads from L1 and multiply-adds on each CPU (--probe-ms each,
pinned; --no-probe to skip) and prints its rate per CPU-second; a run whose probes show a CPU
more than --probe-tol below the best rate seen is marked "SLOW CPU": its figures are suspect
whatever the load average says, and the medians and ratios are printed again over the runs
not marked.

The host also decides where the virtual CPUs sit: on the 2-vCPU KVM guest two vCPUs are at
times close (a shared L3: a cache line written on one and read on the other costs 54-76 ns round
trip) and at times far apart (another CCD or socket: about 300 ns; on 2026-12-04 it switched
every few minutes), and a `--threads 2` run on far CPUs took up to 22% more CPU time in its pool
parts for the same jobs: every cache line one thread writes and the other reads costs that much
more. So beside the speed probe the script times a cache-line ping-pong between each pair of the
CPUs used (two threads pinned to the pair, bouncing one atomic counter on its own line;
--pingpong-ms per pair; the round trip is the fastest of many batches of 1,000, as preemption
can only make a batch slower) before and after each run, and marks an N-core run whose round
trip on any pair exceeded --far-tol times the best seen on that pair as "FAR CPUS". On
2026-12-04 the host also put the two vCPUs on the two hardware threads of one core at times: a
26 ns round trip against 61, where a run's two halves share one core's vector units. A round
trip under --shared-ns marks a run "SHARED CORE", and such trips are not the pair's best (one of
them would mark every other run FAR). The one-thread run does not care where the CPUs are. The
medians and ratios over the unmarked runs leave out runs marked SLOW CPU, FAR CPUS or SHARED
CORE.
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist"


PROBE_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef float v8 __attribute__((vector_size(32)));
static double clk(clockid_t id) { struct timespec t; clock_gettime(id, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char **argv) {
    const double ms = atof(argv[1]);
    for (int i = 2; i < argc; i++) {
        cpu_set_t set; CPU_ZERO(&set); CPU_SET(atoi(argv[i]), &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) { printf("%s -1\n", argv[i]); continue; }
        /* 12 independent chains of 8-float multiply-adds, each with a load from a table in L1,
         * as in the kernels' inner loops: bound by the core's throughput, not by a latency.
         * Measured on the 2-core KVM guest: the same loop without the loads runs at a steady
         * rate (55-57 G multiply-adds per CPU-second), with them its rate drifts by 20-40%
         * over seconds on either CPU, whatever the guest runs on the other (most likely host
         * work sharing the cores' load ports); the kernels, fed by loads too, drift with it */
        volatile float seed = 1e-3f;
        static v8 w[256]; /* 8 KiB: stays in L1 */
        v8 a = {0}, b = {0};
        a += 0.999999f;
        b += seed;
        for (int q = 0; q < 256; q++) w[q] = a;
        v8 x0 = b, x1 = b * 2, x2 = b * 3, x3 = b * 4, x4 = b * 5, x5 = b * 6, x6 = b * 7,
           x7 = b * 8, x8 = b * 9, x9 = b * 10, x10 = b * 11, x11 = b * 12;
        long n = 0;
        const double c0 = clk(CLOCK_THREAD_CPUTIME_ID);
        double c1 = c0;
        while (c1 - c0 < ms * 1e-3) {
            for (int k = 0; k < 20000; k++) {
                x0 = x0 * w[(k + 0) & 255] + b;
                x1 = x1 * w[(k + 1) & 255] + b;
                x2 = x2 * w[(k + 2) & 255] + b;
                x3 = x3 * w[(k + 3) & 255] + b;
                x4 = x4 * w[(k + 4) & 255] + b;
                x5 = x5 * w[(k + 5) & 255] + b;
                x6 = x6 * w[(k + 6) & 255] + b;
                x7 = x7 * w[(k + 7) & 255] + b;
                x8 = x8 * w[(k + 8) & 255] + b;
                x9 = x9 * w[(k + 9) & 255] + b;
                x10 = x10 * w[(k + 10) & 255] + b;
                x11 = x11 * w[(k + 11) & 255] + b;
            }
            n += 20000L * 12 * 8;
            c1 = clk(CLOCK_THREAD_CPUTIME_ID);
        }
        v8 t = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11;
        float s = 0;
        for (int l = 0; l < 8; l++) s += t[l];
        printf("%s %.1f %g\n", argv[i], 1e-6 * n / (c1 - c0), s);
    }
    return 0;
}
"""


PINGPONG_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
/* the counter on a cache line of its own */
static _Alignas(128) _Atomic long flag;
static char pad[128] __attribute__((used));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); return pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
static int pong_cpu, pong_ok;
/* answers each odd value with the next even one; stops at -1 */
static void *pong(void *v) {
    (void)v;
    pong_ok = pin(pong_cpu) == 0;
    long expect = 1;
    for (;;) {
        long f;
        while ((f = atomic_load_explicit(&flag, memory_order_acquire)) != expect) {
            if (f < 0) return NULL;
            relax();
        }
        atomic_store_explicit(&flag, expect + 1, memory_order_release);
        expect += 2;
    }
}
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
/* argv: ms per pair, then pairs "a:b"; prints "a b fastest-batch-ns median-batch-ns" per pair
 * (-1 where a CPU cannot be used) */
int main(int argc, char **argv) {
    const double budget = atof(argv[1]) * 1e-3;
    enum { ROUNDS = 1000, MAXB = 4096 };
    static double ns[MAXB];
    for (int i = 2; i < argc; i++) {
        int a, b;
        if (sscanf(argv[i], "%d:%d", &a, &b) != 2) continue;
        atomic_store(&flag, 0);
        pong_cpu = b;
        pthread_t t;
        if (pin(a) != 0 || pthread_create(&t, NULL, pong, NULL) != 0) { printf("%d %d -1 -1\n", a, b); continue; }
        long v = 0;
        int nb = 0;
        const double start = now();
        while (nb < MAXB && (nb < 5 || now() - start < budget)) {
            const double t0 = now();
            for (int r = 0; r < ROUNDS; r++) {
                atomic_store_explicit(&flag, v + 1, memory_order_release);
                while (atomic_load_explicit(&flag, memory_order_acquire) != v + 2) relax();
                v += 2;
            }
            ns[nb++] = (now() - t0) * 1e9 / ROUNDS;
        }
        atomic_store(&flag, -1);
        pthread_join(t, NULL);
        qsort(ns, nb, sizeof ns[0], cmp);
        if (pong_ok) printf("%d %d %.1f %.1f\n", a, b, ns[0], ns[nb / 2]);
        else printf("%d %d -1 -1\n", a, b);
    }
    return 0;
}
"""


def compile_c(tmp, name, code, flags, what):
    """Compiles a probe's C code into tmp; None (with a note) where no C compiler works."""
    src, exe = os.path.join(tmp, name + ".c"), os.path.join(tmp, name)
    with open(src, "w") as f:
        f.write(code)
    for cc in ("cc", "gcc", "clang"):
        try:
            if subprocess.run([cc, "-O2"] + flags + ["-o", exe, src], capture_output=True).returncode == 0:
                return exe
        except OSError:
            pass
    print("no C compiler: running without the " + what)
    return None


def build_pingpong(tmp):
    """Compiles the placement probe (cache-line ping-pong)."""
    return compile_c(tmp, "pingpong", PINGPONG_C, ["-pthread"], "placement probe")


def pingpong(exe, cpus, ms):
    """Round-trip nanoseconds of a cache line between each pair of CPUs: {(a, b): (fastest, median)}."""
    pairs = ["%d:%d" % (x, y) for i, x in enumerate(cpus) for y in cpus[i + 1:]]
    if not pairs:
        return {}
    p = subprocess.run([exe, str(ms)] + pairs, capture_output=True, text=True)
    trips = {}
    for line in p.stdout.split("\n"):
        f = line.split()
        if len(f) >= 4 and float(f[2]) > 0:
            trips[(int(f[0]), int(f[1]))] = (float(f[2]), float(f[3]))
    return trips


def build_probe(tmp):
    """Compiles the CPU-speed probe."""
    return compile_c(tmp, "probe", PROBE_C, ["-march=native"], "CPU-speed probe")


def probe(exe, cpus, ms):
    """Million multiply-adds per CPU-second of the probe's L1-bound loop on each CPU."""
    p = subprocess.run([exe, str(ms)] + [str(c) for c in cpus], capture_output=True, text=True)
    rates = {}
    for line in p.stdout.split("\n"):
        f = line.split()
        if len(f) >= 2:
            rates[int(f[0])] = float(f[1])
    return rates


def run(cmd, env, timeout):
    """Wall seconds, CPU seconds (user + system, the command and its children) and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="N [the machine's cores]")
    ap.add_argument("--runs", type=int, default=3, help="runs of each command per instruction set")
    ap.add_argument("--isa", default="avx512,avx2", help="comma-separated CF_ISA caps [avx512,avx2]")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N images only (quick looks)")
    ap.add_argument("--only", default="1t,Nc,Nt",
                    help="a subset of 1t,Nc,Nt,Ncs (Ncs: --cores N --split-batch) [1t,Nc,Nt]")
    ap.add_argument("--args", default="", help="more options for every corefit train, e.g. '--checkpoint-every 0'")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the commands (repeatable)")
    ap.add_argument("--goal", type=float, default=0.55)
    ap.add_argument("--max-load", type=float, default=0, help="refuse at this load average [the cores]")
    ap.add_argument("--force", action="store_true", help="measure even on a loaded machine")
    ap.add_argument("--show", action="store_true", help="print each command's output")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--no-probe", action="store_true", help="skip the per-CPU speed probe")
    ap.add_argument("--probe-ms", type=float, default=50, help="CPU milliseconds of each probe [50]")
    ap.add_argument("--probe-tol", type=float, default=0.05,
                    help="a probe this fraction below the best seen marks the run [0.05]")
    ap.add_argument("--no-pingpong", action="store_true", help="skip the placement probe")
    ap.add_argument("--pingpong-ms", type=float, default=20, help="milliseconds of ping-pong per CPU pair [20]")
    ap.add_argument("--far-tol", type=float, default=2.0,
                    help="a round trip above this multiple of the pair's best marks the run [2.0]")
    ap.add_argument("--shared-ns", type=float, default=40.0,
                    help="a round trip below this many ns: the two CPUs are one core's hardware threads [40]")
    a = ap.parse_args()
    max_load = a.max_load or float(os.cpu_count())
    load = os.getloadavg()[0]
    print("load average %.2f %.2f %.2f (1, 5, 15 min) on %d CPUs" % (os.getloadavg() + (os.cpu_count(),)))
    if load >= max_load and not a.force:
        sys.exit("refusing to measure at load %.1f >= %.1f (--force to measure anyway; then read CPU seconds)"
                 % (load, max_load))
    base = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    for kv in a.env:
        k, _, v = kv.partition("=")
        base[k] = v
    n = a.cores
    configs = {
        "1t": ["--cores", "1", "--threads", "1"],
        "Nc": ["--cores", str(n)],
        "Nt": ["--cores", "1", "--threads", str(n)],
        # not in the default --only: N workers of --bs/N images each, a global batch of --bs
        # (the default Nc runs --bs per worker, N times the batch): the per-core batch's cost
        # without the rest of the run changing; its results differ from Nc's, so no goal
        "Ncs": ["--cores", str(n), "--split-batch"],
    }
    names = [c for c in a.only.split(",") if c in configs]
    corefit = os.path.join(a.build, "corefit")
    ok = True
    cpus = sorted(os.sched_getaffinity(0))
    best = {}  # the best probe rate seen per CPU
    best_trip = {}  # the fastest round trip seen per pair of CPUs
    slow_runs = []
    trips_of = {}  # (isa, config, run) -> (round trips before, after)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model.safetensors")
        probe_exe = None if a.no_probe else build_probe(tmp)
        pingpong_exe = None if a.no_pingpong else build_pingpong(tmp)
        for isa in [x for x in a.isa.split(",") if x]:
            env = dict(base, CF_ISA=isa)
            res = {c: [] for c in names}
            for r in range(a.runs):
                for c in names:
                    cmd = [corefit, "train", "--idx", a.data, "--arch", "mini-resnet", "--epochs",
                           str(a.epochs), "--seed", "42", "--out", out, "--quiet"] + configs[c] + a.args.split()
                    if a.limit:
                        cmd += ["--limit", str(a.limit)]
                    before = probe(probe_exe, cpus, a.probe_ms) if probe_exe else {}
                    trip0 = pingpong(pingpong_exe, cpus, a.pingpong_ms) if pingpong_exe else {}
                    wall, cpu, text = run(cmd, env, a.timeout)
                    trip1 = pingpong(pingpong_exe, cpus, a.pingpong_ms) if pingpong_exe else {}
                    after = probe(probe_exe, cpus, a.probe_ms) if probe_exe else {}
                    res[c].append((wall, cpu))
                    print("%-7s %-3s run %d: wall %6.2f s  cpu %6.2f s  load %.2f   %s" % (
                        isa, c.replace("N", str(n)), r + 1, wall, cpu, os.getloadavg()[0], " ".join(cmd)),
                        flush=True)
                    if probe_exe:
                        for pr in (before, after):
                            for k, v in pr.items():
                                best[k] = max(best.get(k, 0.0), v)
                        print("%-7s %-3s run %d: probe Mfma/CPU-s before %s, after %s" % (
                            isa, c.replace("N", str(n)), r + 1,
                            " ".join("cpu%d %.0f" % kv for kv in sorted(before.items())),
                            " ".join("cpu%d %.0f" % kv for kv in sorted(after.items()))), flush=True)
                    slow_runs.append(((isa, c, r + 1), before, after, wall, cpu))
                    if pingpong_exe:
                        for tr in (trip0, trip1):
                            for k, (fast, _) in tr.items():
                                if fast >= a.shared_ns:
                                    best_trip[k] = min(best_trip.get(k, fast), fast)
                        trips_of[(isa, c, r + 1)] = (trip0, trip1)
                        print("%-7s %-3s run %d: ping-pong round trip ns (fastest/median batch) before %s, after %s" % (
                            isa, c.replace("N", str(n)), r + 1,
                            " ".join("cpu%d-%d %.0f/%.0f" % (k + v) for k, v in sorted(trip0.items())),
                            " ".join("cpu%d-%d %.0f/%.0f" % (k + v) for k, v in sorted(trip1.items()))), flush=True)
                    if a.show:
                        print(text.rstrip())
            med = {c: (statistics.median(w for w, _ in v), statistics.median(u for _, u in v))
                   for c, v in res.items()}
            for c, (w, u) in med.items():
                print("%-7s %-3s median wall %6.2f s  cpu %6.2f s" % (isa, c.replace("N", str(n)), w, u))
            if "1t" in med:
                for c in ("Nc", "Nt", "Ncs"):
                    if c not in med:
                        continue
                    rw = med[c][0] / med["1t"][0]
                    ru = med[c][1] / med["1t"][1]
                    if c == "Ncs":  # other results: no goal
                        print("%-7s %-3s / 1t: wall %.3f, cpu %.3f" % (isa, c.replace("N", str(n)), rw, ru))
                        continue
                    good = rw <= a.goal
                    ok &= good
                    print("%-7s %-3s / 1t: wall %.3f (goal <= %.2f: %s), cpu %.3f" % (
                        isa, c.replace("N", str(n)), rw, a.goal, "met" if good else "missed", ru))
    if best:
        print("probe: best Mfma/CPU-s %s" % " ".join("cpu%d %.0f" % kv for kv in sorted(best.items())))
    if best_trip:
        print("placement: fastest round trip ns %s" % " ".join(
            "cpu%d-%d %.0f" % (k + (v,)) for k, v in sorted(best_trip.items())))
    if best or best_trip:
        kept = {}
        for (isa, c, r), before, after, wall, cpu in slow_runs:
            marked = False
            low = [(k, v) for pr in (before, after) for k, v in pr.items() if v < (1 - a.probe_tol) * best[k]]
            if low:
                marked = True
                print("%-7s %-3s run %d: SLOW CPU (%s below the best by more than %.0f%%): suspect" % (
                    isa, c.replace("N", str(n)), r, ", ".join("cpu%d %.0f" % kv for kv in low), 100 * a.probe_tol))
            # placement matters only to runs on more than one CPU
            trips = [(k, v[0]) for tr in trips_of.get((isa, c, r), ()) for k, v in tr.items()] if c != "1t" else []
            far = [(k, v) for k, v in trips if k in best_trip and v > a.far_tol * best_trip[k]]
            shared = [(k, v) for k, v in trips if v < a.shared_ns]
            if shared:
                marked = True
                print("%-7s %-3s run %d: SHARED CORE (round trip %s ns, under %.0f): suspect" % (
                    isa, c.replace("N", str(n)), r, ", ".join("cpu%d-%d %.0f" % (k + (v,)) for k, v in shared),
                    a.shared_ns))
            if far:
                marked = True
                print("%-7s %-3s run %d: FAR CPUS (round trip %s ns, above %.1fx the pair's best): suspect" % (
                    isa, c.replace("N", str(n)), r, ", ".join("cpu%d-%d %.0f" % (k + (v,)) for k, v in far),
                    a.far_tol))
            if not marked:
                kept.setdefault(isa, {}).setdefault(c, []).append((wall, cpu))
        # the same medians and ratios over the runs no probe marked
        for isa, runs in kept.items():
            med = {c: (statistics.median(w for w, _ in v), statistics.median(u for _, u in v))
                   for c, v in runs.items()}
            for c, (w, u) in med.items():
                print("%-7s %-3s median of %d unmarked: wall %6.2f s  cpu %6.2f s" % (
                    isa, c.replace("N", str(n)), len(runs[c]), w, u))
            for c in ("Nc", "Nt", "Ncs"):
                if c in med and "1t" in med:
                    print("%-7s %-3s / 1t over unmarked runs: wall %.3f, cpu %.3f" % (
                        isa, c.replace("N", str(n)), med[c][0] / med["1t"][0], med[c][1] / med["1t"][1]))
    print("load average at the end %.2f" % os.getloadavg()[0])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
