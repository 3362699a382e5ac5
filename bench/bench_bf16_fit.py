#!/usr/bin/python3
"""W1 in mixed precision: corefit fp32, corefit bf16 (cf_learner_to_bf16, `bench_w1 --bf16`) and
PyTorch's CPU autocast bfloat16 (`w1_torch.py --bf16`, and PyTorch fp32 beside it), run
alternately on the same machine, medians of --pairs rounds, and the ratios.

usage: bench_bf16_fit.py [--build DIR] [--pairs P] [--batches B] [--cores N] [--only 1t,dp]
                         [--accuracy --seeds S --epochs E] [--isa LEVEL]

  1t   one process, 1 thread       bench_w1 --threads 1   w1_torch.py --threads 1
  dp   N processes, bs 64 each     bench_w1 --cores N     w1_torch.py --ddp N (gloo)
  --accuracy: the test accuracy after E epochs of W1's recipe (1 thread each) for seeds
              1..S, corefit fp32, corefit bf16 and PyTorch autocast bf16; mean and spread.

img/s is wall time (the programs' own window: from the end of step 5 to the last step);
img/CPU-s the steadier column on a shared machine. The JSON lines name the kernel level (isa) and
whether it computed in bf16 (bf16_compute): below avx512_bf16, corefit's --bf16 runs fp32.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--only", default="1t,dp")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--isa", default="", help="CF_ISA for corefit (and OPENBLAS_CORETYPE unchanged)")
    args = ap.parse_args()
    w1 = os.path.join(args.build, "bench_w1")
    torch_py = ["/usr/bin/python3", os.path.join(HERE, "w1_torch.py")]
    base = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    if args.isa:
        base["CF_ISA"] = args.isa
    print("CPU: %s; load average at start %.1f (numbers taken under this load are noisy)" % (
        next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
        os.getloadavg()[0]))
    for key in [k for k in args.only.split(",") if k]:
        n = 1 if key == "1t" else args.cores
        cf_mode = ["--threads", "1"] if key == "1t" else ["--cores", str(n)]
        th_mode = ["--threads", "1"] if key == "1t" else ["--ddp", str(n)]
        env = dict(base, OMP_NUM_THREADS="1")
        progs = [
            ("corefit fp32", [w1] + cf_mode + ["--batches", str(args.batches)]),
            ("corefit bf16", [w1] + cf_mode + ["--batches", str(args.batches), "--bf16"]),
            ("torch autocast bf16", torch_py + th_mode + ["--batches", str(args.batches), "--bf16"]),
            ("torch fp32", torch_py + th_mode + ["--batches", str(args.batches)]),
        ]
        res = {name: [] for name, _ in progs}
        for p in range(args.pairs):
            order = progs if p % 2 == 0 else progs[::-1]
            for name, cmd in order:
                res[name].append(run(cmd, env))
        print("\n%s (%d process%s, %d batches, %d rounds; medians)" % (key, n, "" if n == 1 else "es",
                                                                       args.batches, args.pairs))
        print("| program | img/s | img/CPU-s | level |")
        print("|---|---|---|---|")
        med = {}
        for name, _ in progs:
            ips = statistics.median(r["images_per_s"] for r in res[name])
            ipc = statistics.median(r["images_per_cpu_s"] for r in res[name])
            med[name] = (ips, ipc)
            r0 = res[name][0]
            level = r0.get("isa", "torch %s" % r0.get("torch", ""))
            if "bf16_compute" in r0:
                level += ", bf16 compute" if r0["bf16_compute"] else ""
            print("| %s | %.0f | %.0f | %s |" % (name, ips, ipc, level))
        cf16, cf32, th16 = med["corefit bf16"], med["corefit fp32"], med["torch autocast bf16"]
        print("corefit bf16 / corefit fp32: %.2fx (wall), %.2fx (CPU); corefit bf16 / torch autocast bf16: "
              "%.2fx (wall), %.2fx (CPU)" % (cf16[0] / cf32[0], cf16[1] / cf32[1], cf16[0] / th16[0],
                                            cf16[1] / th16[1]))
        print("commands: " + "; ".join(" ".join(c) for _, c in progs))
    if args.accuracy:
        env = dict(base, OMP_NUM_THREADS="1")
        accs = {"corefit fp32": [], "corefit bf16": [], "torch autocast bf16": []}
        for s in range(1, args.seeds + 1):
            e = ["--epochs", str(args.epochs), "--seed", str(s)]
            accs["corefit fp32"].append(run([w1, "--threads", "1"] + e, env)["test_acc"])
            accs["corefit bf16"].append(run([w1, "--threads", "1", "--bf16"] + e, env)["test_acc"])
            accs["torch autocast bf16"].append(run(torch_py + ["--threads", "1", "--bf16"] + e, env)["test_acc"])
        print("\ntest accuracy after %d epoch%s of W1's recipe, seeds 1..%d" % (
            args.epochs, "" if args.epochs == 1 else "s", args.seeds))
        for name, a in accs.items():
            print("  %-20s mean %.4f  (%s)" % (name, statistics.mean(a), ", ".join("%.4f" % v for v in a)))


if __name__ == "__main__":
    main()
