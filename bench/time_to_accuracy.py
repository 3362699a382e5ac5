#!/usr/bin/python3
"""Time to accuracy (the airbench habit) on W1's data: wall time from the command's start to the
saved model, and the test accuracy (the 10,000 t10k images), over several seeds, for corefit and
for PyTorch given the same recipe, on all cores.

usage: time_to_accuracy.py --time-to-accuracy [--build DIR] [--seeds 5] [--cores N] [--epochs E]
                           [--bs B] [--lr X] [--label-smoothing EPS] [--bf16] [--target 0.92]
                           [--recipe fast]

--recipe fast: corefit runs `corefit train --recipe fast` (tools/recipe.c) and PyTorch the same
options spelled out (FAST below: 4 epochs, bs 128 per process, lr 6e-3, label smoothing 0.1);
--epochs, --bs, --lr, --label-smoothing and --bf16 given here still win, on both sides.

  corefit: corefit train --idx DATA --arch mini-resnet --epochs E --bs B --lr X --cores N
           [--label-smoothing EPS] [--bf16] --seed S --out FILE --quiet
  PyTorch: w1_torch.py --ddp N (--threads 1 when N is 1) --epochs E --bs B --lr X
           [--label-smoothing EPS] [--bf16] --seed S --save FILE
Both: fit_one_cycle (div 25, div_final 1e5, pct_start 0.25), fastai's Adam, bs per process,
the run timed from the process's start to its exit (the model written before it exits).

Prints, for each program, every seed's seconds and accuracy, the mean accuracy, the mean time,
and whether the mean reached --target. Measure on a quiet machine only (load average under 2):
the script prints the load average and refuses above --max-load unless --force.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/usr/share/datasets/fashion-mnist"
# corefit train --recipe fast (tools/recipe.c), spelled out for PyTorch
FAST = {"epochs": 4, "bs": 128, "lr": 6e-3, "label_smoothing": 0.1}


def timed(cmd, env):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return took, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-to-accuracy", action="store_true", required=True)
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--epochs", type=int, default=None, help="[5; --recipe fast: 4]")
    ap.add_argument("--bs", type=int, default=None, help="[64; --recipe fast: 128]")
    ap.add_argument("--lr", type=float, default=None, help="[3e-3 * bs / 64]")
    ap.add_argument("--label-smoothing", type=float, default=None, help="[0; --recipe fast: 0.1]")
    ap.add_argument("--recipe", choices=["fast"], default=None, help="corefit train's --recipe")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--target", type=float, default=0.92)
    ap.add_argument("--only", default="corefit,torch")
    ap.add_argument("--max-load", type=float, default=2.0)
    ap.add_argument("--force", action="store_true", help="measure even on a loaded machine")
    args = ap.parse_args()
    plain = {"epochs": 5, "bs": 64, "lr": None, "label_smoothing": 0.0}
    for k, v in (FAST if args.recipe == "fast" else plain).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.lr is None:
        args.lr = 3e-3 * args.bs / 64
    load = os.getloadavg()[0]
    print("load average %.1f%s" % (load, "" if load < args.max_load else " (a loaded machine: times are not comparable)"))
    if load >= args.max_load and not args.force:
        sys.exit("refusing to measure above load %.1f (--force to measure anyway)" % args.max_load)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    recipe = ["--epochs", str(args.epochs), "--bs", str(args.bs), "--lr", repr(args.lr)]
    if args.label_smoothing > 0:
        recipe += ["--label-smoothing", repr(args.label_smoothing)]
    if args.bf16:
        recipe += ["--bf16"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(1, args.seeds + 1):
            if "corefit" in args.only:
                out = os.path.join(tmp, "cf-%d.safetensors" % s)
                cmd = [os.path.join(args.build, "corefit"), "train", "--idx", args.data, "--arch", "mini-resnet",
                       "--cores", str(args.cores), "--seed", str(s), "--out", out, "--quiet"] + recipe
                if args.recipe:
                    cmd += ["--recipe", args.recipe]
                took, text = timed(cmd, env)
                m = re.search(r"accuracy ([0-9.]+)", text)
                if not m or not os.path.exists(out):
                    sys.exit("no accuracy or model from: " + " ".join(cmd) + "\n" + text[-1000:])
                results.setdefault("corefit", []).append((took, float(m.group(1))))
                print("corefit seed %d: %.1f s, accuracy %.4f   %s" % (s, took, float(m.group(1)), " ".join(cmd)),
                      flush=True)
            if "torch" in args.only:
                out = os.path.join(tmp, "torch-%d.pt" % s)
                mode = ["--threads", "1"] if args.cores == 1 else ["--ddp", str(args.cores)]
                cmd = ["/usr/bin/python3", os.path.join(HERE, "w1_torch.py")] + mode + [
                    "--seed", str(s), "--save", out, "--data", args.data] + recipe
                took, text = timed(cmd, dict(env, OMP_NUM_THREADS="1"))
                m = re.search(r'"test_acc": ([0-9.]+)', text)
                if not m or not os.path.exists(out):
                    sys.exit("no accuracy or model from: " + " ".join(cmd) + "\n" + text[-1000:])
                results.setdefault("torch", []).append((took, float(m.group(1))))
                print("torch   seed %d: %.1f s, accuracy %.4f   %s" % (s, took, float(m.group(1)), " ".join(cmd)),
                      flush=True)
    for name, rs in results.items():
        acc = statistics.mean(a for _, a in rs)
        t = statistics.mean(t for t, _ in rs)
        print("%-8s mean %.1f s (process start to saved model), mean test accuracy %.4f over %d seeds: %s %.3f" % (
            name, t, acc, len(rs), "reaches" if acc >= args.target else "misses", args.target))


if __name__ == "__main__":
    main()
