#!/usr/bin/python3
"""Whole-run scaling of `corefit train` (W1: the mini-resnet on Fashion-MNIST, one epoch of
fit_one_cycle), as wall-time ratios against the one-core one-thread run:

  1t   corefit train --cores 1 --threads 1         (the reference)
  Nc   corefit train --cores N                     (N fork workers, one core each)
  Nt   corefit train --cores 1 --threads N         (one process, N threads)

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
    ap.add_argument("--only", default="1t,Nc,Nt", help="a subset of 1t,Nc,Nt")
    ap.add_argument("--args", default="", help="more options for every corefit train, e.g. '--checkpoint-every 0'")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the commands (repeatable)")
    ap.add_argument("--goal", type=float, default=0.55)
    ap.add_argument("--max-load", type=float, default=0, help="refuse at this load average [the cores]")
    ap.add_argument("--force", action="store_true", help="measure even on a loaded machine")
    ap.add_argument("--show", action="store_true", help="print each command's output")
    ap.add_argument("--timeout", type=float, default=1800)
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
    }
    names = [c for c in a.only.split(",") if c in configs]
    corefit = os.path.join(a.build, "corefit")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model.safetensors")
        for isa in [x for x in a.isa.split(",") if x]:
            env = dict(base, CF_ISA=isa)
            res = {c: [] for c in names}
            for r in range(a.runs):
                for c in names:
                    cmd = [corefit, "train", "--idx", a.data, "--arch", "mini-resnet", "--epochs",
                           str(a.epochs), "--seed", "42", "--out", out, "--quiet"] + configs[c] + a.args.split()
                    if a.limit:
                        cmd += ["--limit", str(a.limit)]
                    wall, cpu, text = run(cmd, env, a.timeout)
                    res[c].append((wall, cpu))
                    print("%-7s %-3s run %d: wall %6.2f s  cpu %6.2f s  load %.2f   %s" % (
                        isa, c.replace("N", str(n)), r + 1, wall, cpu, os.getloadavg()[0], " ".join(cmd)),
                        flush=True)
                    if a.show:
                        print(text.rstrip())
            med = {c: (statistics.median(w for w, _ in v), statistics.median(u for _, u in v))
                   for c, v in res.items()}
            for c, (w, u) in med.items():
                print("%-7s %-3s median wall %6.2f s  cpu %6.2f s" % (isa, c.replace("N", str(n)), w, u))
            if "1t" in med:
                for c in ("Nc", "Nt"):
                    if c not in med:
                        continue
                    rw = med[c][0] / med["1t"][0]
                    ru = med[c][1] / med["1t"][1]
                    good = rw <= a.goal
                    ok &= good
                    print("%-7s %-3s / 1t: wall %.3f (goal <= %.2f: %s), cpu %.3f" % (
                        isa, c.replace("N", str(n)), rw, a.goal, "met" if good else "missed", ru))
    print("load average at the end %.2f" % os.getloadavg()[0])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
