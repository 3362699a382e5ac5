#!/usr/bin/python3
"""Time to accuracy (the airbench habit) on W1's data: wall time from the command's start to the
saved model, and the test accuracy (the 10,000 t10k images), over several seeds, for corefit and
for PyTorch given the same recipe, on all cores.

usage: time_to_accuracy.py --time-to-accuracy [--build DIR] [--seeds 5] [--cores N] [--epochs E]
                           [--bs B] [--lr X] [--label-smoothing EPS] [--arch A] [--[no-]flip] [--[no-]tta]
                           [--small-epochs K] [--[no-]bf16] [--target 0.92] [--recipe fast]

--recipe fast: corefit runs `corefit train --recipe fast` (tools/recipe.c) and PyTorch the same
options spelled out (FAST below); --epochs, --bs, --lr, --label-smoothing, --arch, --small-epochs
and --[no-]bf16 given here still win, on both sides.

  corefit: corefit train --idx DATA --arch A --epochs E --bs B --lr X --cores N
           [--label-smoothing EPS] [--flip] [--tta] [--small-epochs K] [--bf16] --seed S
           --valid-every V --out FILE --quiet
  PyTorch: w1_torch.py (--arch mini-resnet) or fast_torch.py (--arch fast-cnn) --ddp N
           (--threads 1 when N is 1) --epochs E --bs B --lr X [--label-smoothing EPS] [--flip]
           [--tta] [--small-epochs K] [--bf16] --seed S --save FILE
As PyTorch's side, corefit validates only at the end: --valid-every E (after the last epoch)
without --tta, --valid-every 0 with it (the TTA pass after the fit measures).
Both: fit_one_cycle (div 25, div_final 1e5, pct_start 0.25), fastai's Adam, bs per process,
the run timed from the process's start to its exit (the model written before it exits). With
--tta the accuracy is the flip-TTA one (corefit train --tta: plain and mirrored test images,
probabilities averaged), computed inside the timed run.

Prints, for each program, every seed's seconds and accuracy, the mean accuracy, the mean time,
and whether the mean reached --target. Measure on a quiet machine only (load average under 2):
the script prints the load average and refuses above --max-load unless --force. Each run's CPU
seconds (user + system, all its processes) are printed too: on a loaded machine they, not the
wall times, say what a run costs.
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/usr/share/datasets/fashion-mnist"
# corefit train --recipe fast (tools/recipe.c), spelled out for PyTorch
FAST = {"epochs": 4, "small_epochs": 1, "bs": 64, "lr": None, "label_smoothing": 0.1, "arch": "fast-cnn",
        "flip": False, "tta": False, "bf16": True}


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, env):
    t0, c0 = time.perf_counter(), children_cpu()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    took, cpu = time.perf_counter() - t0, children_cpu() - c0
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return took, cpu, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-to-accuracy", action="store_true", required=True)
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--epochs", type=int, default=None, help="[5; --recipe fast: 4]")
    ap.add_argument("--bs", type=int, default=None, help="[64]")
    ap.add_argument("--lr", type=float, default=None, help="[3e-3 * bs / 64; --recipe fast: 1e-2 * bs / 64]")
    ap.add_argument("--label-smoothing", type=float, default=None, help="[0; --recipe fast: 0.1]")
    ap.add_argument("--recipe", choices=["fast"], default=None, help="corefit train's --recipe")
    ap.add_argument("--arch", choices=["mini-resnet", "fast-cnn"], default=None,
                    help="[mini-resnet; --recipe fast: fast-cnn]")
    ap.add_argument("--flip", action=argparse.BooleanOptionalAction, default=None,
                    help="train --flip (both sides) [off]")
    ap.add_argument("--tta", action=argparse.BooleanOptionalAction, default=None,
                    help="train --tta: report the flip-TTA accuracy (both sides) [off]")
    ap.add_argument("--small-epochs", type=int, default=None,
                    help="train --small-epochs K: the first K epochs at half size (both sides) [0; --recipe fast: 1]")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="train --bf16, PyTorch's CPU autocast in bfloat16 [off; --recipe fast: on]")
    ap.add_argument("--target", type=float, default=0.92)
    ap.add_argument("--only", default="corefit,torch")
    ap.add_argument("--max-load", type=float, default=2.0)
    ap.add_argument("--force", action="store_true", help="measure even on a loaded machine")
    args = ap.parse_args()
    plain = {"epochs": 5, "bs": 64, "lr": None, "label_smoothing": 0.0, "arch": "mini-resnet", "flip": False,
             "tta": False, "small_epochs": 0, "bf16": False}
    for k, v in (FAST if args.recipe == "fast" else plain).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.lr is None:
        args.lr = (1e-2 if args.recipe == "fast" else 3e-3) * args.bs / 64
    if args.arch == "mini-resnet" and (args.flip or args.tta or args.small_epochs) and "torch" in args.only:
        sys.exit("--flip, --tta and --small-epochs need --arch fast-cnn on the PyTorch side (fast_torch.py);"
                 " w1_torch.py has none of them")
    load = os.getloadavg()[0]
    print("load average %.1f%s" % (load, "" if load < args.max_load else " (a loaded machine: times are not comparable)"))
    if load >= args.max_load and not args.force:
        sys.exit("refusing to measure above load %.1f (--force to measure anyway)" % args.max_load)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    recipe = ["--epochs", str(args.epochs), "--bs", str(args.bs), "--lr", repr(args.lr)]
    if args.bf16:
        recipe += ["--bf16"]
    if args.flip:
        recipe += ["--flip"]
    if args.tta:
        recipe += ["--tta"]
    torch_extra = ["--label-smoothing", repr(args.label_smoothing)] if args.label_smoothing > 0 else []
    if args.small_epochs > 0:
        torch_extra += ["--small-epochs", str(args.small_epochs)]
    # corefit: every value spelled out, 0 too (beside --recipe, a missing option takes the
    # recipe's), and validation at the end only, as PyTorch's side (with --tta the TTA pass
    # measures)
    cf_extra = ["--label-smoothing", repr(args.label_smoothing), "--small-epochs", str(args.small_epochs),
                "--valid-every", "0" if args.tta else str(args.epochs)]
    # flags of the recipe cannot be taken back on corefit's command line: --recipe only with all on
    all_flags = all(getattr(args, k) for k in ("flip", "tta", "bf16") if FAST[k] is True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(1, args.seeds + 1):
            if "corefit" in args.only:
                out = os.path.join(tmp, "cf-%d.safetensors" % s)
                cmd = [os.path.join(args.build, "corefit"), "train", "--idx", args.data, "--arch", args.arch,
                       "--cores", str(args.cores), "--seed", str(s), "--out", out, "--quiet"] + recipe + cf_extra
                if args.recipe:  # the recipe's options are all spelled out; its flags cannot be taken
                    # back on corefit's command line, so --no-flip/--no-tta/--no-bf16 leave --recipe out
                    cmd += ["--checkpoint-every", "0"] + (["--recipe", args.recipe] if all_flags else [])
                took, cpu, text = timed(cmd, env)
                m = re.search(r"tta: accuracy ([0-9.]+)" if args.tta else r"accuracy ([0-9.]+)", text)
                if not m or not os.path.exists(out):
                    sys.exit("no accuracy or model from: " + " ".join(cmd) + "\n" + text[-1000:])
                results.setdefault("corefit", []).append((took, float(m.group(1)), cpu))
                print("corefit seed %d: %.1f s (%.1f CPU s), accuracy %.4f   %s" % (
                    s, took, cpu, float(m.group(1)), " ".join(cmd)), flush=True)
            if "torch" in args.only:
                out = os.path.join(tmp, "torch-%d.pt" % s)
                mode = ["--threads", "1"] if args.cores == 1 else ["--ddp", str(args.cores)]
                script = "fast_torch.py" if args.arch == "fast-cnn" else "w1_torch.py"
                cmd = ["/usr/bin/python3", os.path.join(HERE, script)] + mode + [
                    "--seed", str(s), "--save", out, "--data", args.data] + recipe + torch_extra
                took, cpu, text = timed(cmd, dict(env, OMP_NUM_THREADS="1"))
                m = re.search(r'"test_acc": ([0-9.]+)', text)
                if not m or not os.path.exists(out):
                    sys.exit("no accuracy or model from: " + " ".join(cmd) + "\n" + text[-1000:])
                results.setdefault("torch", []).append((took, float(m.group(1)), cpu))
                print("torch   seed %d: %.1f s (%.1f CPU s), accuracy %.4f   %s" % (
                    s, took, cpu, float(m.group(1)), " ".join(cmd)), flush=True)
    for name, rs in results.items():
        acc = statistics.mean(a for _, a, _ in rs)
        t = statistics.mean(t for t, _, _ in rs)
        cpu = statistics.mean(c for _, _, c in rs)
        print("%-8s mean %.1f s (process start to saved model; %.1f CPU s), mean test accuracy %.4f over %d seeds:"
              " %s %.3f" % (name, t, cpu, acc, len(rs), "reaches" if acc >= args.target else "misses", args.target))


if __name__ == "__main__":
    main()
