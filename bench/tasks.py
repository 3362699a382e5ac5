#!/usr/bin/python3
"""Task parity: each of fastai's other vision tasks trained a few epochs with corefit and with
the same recipe in PyTorch (bench/tasks_torch.py), seed by seed, reporting mean ± std per task
and side and whether the two agree within the seeds' noise.

  /usr/bin/python3 bench/tasks.py --build build [--seeds 1,2,3] [--tasks LIST] [--jobs N]

Tasks (all at one thread per run, fit_one_cycle, fastai's Adam, wd 0.01):
  multi-label    fmnist-tasks multi-label (56x56 mosaics): corefit train --multi-label;
                 BCEWithLogitsLossFlat, accuracy_multi
  points         fmnist-tasks points (2000 images, 48x48): corefit train --points; MSELossFlat
                 on PointScaler's -1..1 coordinates, y_range (-1, 1), mae; 12 epochs at bs 32
  regression     the points data's x column as one value: corefit train --regression;
                 MSELossFlat, y_range the training range + 5%, mae; 12 epochs at bs 32
  fmnist         Fashion-MNIST, single label, CrossEntropyLossFlat, accuracy
  label-smooth   the same with LabelSmoothingCrossEntropy(eps 0.1) (corefit --label-smoothing 0.1)
  mixup          the same with MixUp(0.4) (corefit --mixup 0.4)
  cutmix         the same with CutMix(1.0) (corefit --cutmix 1.0)
  segmentation   fmnist-tasks segmentation (400 training and 100 validation 32x32 scenes, from
                 separate seeds): build/bench_seg (cf_unet_learner, resnet18 body);
                 CrossEntropyLossFlat(axis=1), foreground_acc, DiceMulti; 6 epochs at bs 16

The data is written once under BUILD/tasks-data. Runs go --jobs at a time (the PyTorch and the
corefit run of a seed side by side); the raw results go to BUILD/tasks-results.json and the
table to stdout. "agree" means |mean difference| <= 2 * sqrt(sd_c^2/n + sd_t^2/n) (about a
two-sided 95% band for the difference of two means).
"""
import argparse
import concurrent.futures as cf
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
FMNIST = "/usr/share/datasets/fashion-mnist"

# task: the metric compared, lr_max, epochs and batch size (the same on both sides). Points,
# regression and segmentation get longer fits on more data than the others so that both sides
# clearly learn (with 36-48 steps they had barely started: a constant prediction scored as well)
TASKS = {
    "multi-label": dict(metric="accuracy_multi", lr=3e-3, epochs=4, bs=64),
    "points": dict(metric="mae", lr=1e-2, epochs=12, bs=32),
    "regression": dict(metric="mae", lr=3e-3, epochs=12, bs=32),
    "fmnist": dict(metric="accuracy", lr=3e-3, epochs=3, bs=64),
    "label-smooth": dict(metric="accuracy", lr=3e-3, epochs=3, bs=64),
    "mixup": dict(metric="accuracy", lr=3e-3, epochs=3, bs=64),
    "cutmix": dict(metric="accuracy", lr=3e-3, epochs=3, bs=64),
    "segmentation": dict(metric="dice_multi", lr=1e-2, epochs=6, bs=16),
}
# the data sets: multi-label mosaics; point images (2000 of 48x48, 20% validation) for points and
# regression; segmentation scenes (training and validation written from different seeds)
ML_N = 1000
PT_N, PT_SIZE = 2000, 48
SEG_TRAIN, SEG_VALID, SEG_SIZE = 400, 100, 32
FMNIST_LIMIT = 2000
TRICK = {"fmnist": [], "label-smooth": ["--label-smoothing", "0.1"], "mixup": ["--mixup", "0.4"],
         "cutmix": ["--cutmix", "1.0"]}


def make_data(corefit, root):
    """The fmnist-tasks data sets, written once."""
    def run(*a):
        subprocess.run([corefit, "fmnist-tasks", *a], check=True, stderr=subprocess.DEVNULL)

    os.makedirs(root, exist_ok=True)
    ml, pt, seg = data_dirs(root)
    if not os.path.exists(os.path.join(ml, "labels.csv")):
        run("multi-label", ml, "--n", str(ML_N), "--seed", "42")
    if not os.path.exists(os.path.join(pt, "points.csv")):
        run("points", pt, "--n", str(PT_N), "--size", str(PT_SIZE), "--seed", "42")
    os.makedirs(seg, exist_ok=True)
    if not os.path.exists(os.path.join(seg, "valid", "codes.txt")):
        run("segmentation", os.path.join(seg, "train"), "--n", str(SEG_TRAIN), "--size", str(SEG_SIZE),
            "--seed", "42")
        run("segmentation", os.path.join(seg, "valid"), "--n", str(SEG_VALID), "--size", str(SEG_SIZE),
            "--seed", "43")


def data_dirs(root):
    """The data sets' folders, named by their sizes so that changed sizes write new ones."""
    return (os.path.join(root, f"ml{ML_N}"), os.path.join(root, f"pt{PT_N}-{PT_SIZE}"),
            os.path.join(root, f"seg{SEG_TRAIN}-{SEG_VALID}-{SEG_SIZE}"))


def commands(task, seed, build, data, tmp):
    """(corefit argv, torch argv, corefit csv log or None) for one seed."""
    t = TASKS[task]
    ml, pt, seg = data_dirs(data)
    common = ["--epochs", str(t["epochs"]), "--lr", str(t["lr"]), "--bs", str(t["bs"]), "--seed", str(seed)]
    torch_cmd = [PY, os.path.join(HERE, "tasks_torch.py")]
    if task == "segmentation":
        c = [os.path.join(build, "bench_seg"), "--data", seg, *common]
        return c, torch_cmd + ["segmentation", seg, *common], None
    log = os.path.join(tmp, f"{task}-{seed}.csv")
    c = [os.path.join(build, "corefit"), "train", *common, "--cores", "1", "--threads", "1", "--quiet",
         "--out", os.path.join(tmp, f"{task}-{seed}.safetensors"), "--csv-log", log]
    if task == "multi-label":
        c += ["--images-csv", os.path.join(ml, "labels.csv"), "--multi-label", "--valid-col",
              "is_valid", "--size", "56", "--channels", "1", "--arch", "mini-resnet"]
        tc = ["multi-label", ml]
    elif task in ("points", "regression"):
        c += ["--images-csv", os.path.join(pt, "points.csv"), "--valid-col", "is_valid", "--size", str(PT_SIZE),
              "--channels", "1", "--arch", "mini-resnet", "--metrics", "mae"]
        c += ["--points"] if task == "points" else ["--regression", "--label-col", "x"]
        tc = [task, pt]
    else:
        c += ["--idx", FMNIST, "--limit", str(FMNIST_LIMIT), "--arch", "mini-resnet", *TRICK[task]]
        tc = ["fmnist", FMNIST, "--limit", str(FMNIST_LIMIT), *TRICK[task]]
    return c, torch_cmd + tc + common, log


def run_one(argv, log):
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": f"{' '.join(argv)}: exit {p.returncode}: {p.stderr[-2000:]}"}
    if log:  # corefit train: the last row of its CSVLogger table
        with open(log, newline="") as f:
            rows = list(csv.DictReader(f))
        return {k: float(v) for k, v in rows[-1].items() if k not in ("epoch", "time")}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": f"{' '.join(argv)}: no JSON line"}


def summary(vals):
    m = statistics.fmean(vals)
    s = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return m, s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    data = os.path.join(build, "tasks-data")
    make_data(os.path.join(build, "corefit"), data)
    seeds = [int(s) for s in args.seeds.split(",")]
    tasks = args.tasks.split(",")
    for t in tasks:
        if t not in TASKS:
            sys.exit(f"unknown task {t} (one of {', '.join(TASKS)})")
    tmp = tempfile.mkdtemp(prefix="cf-tasks-")
    jobs = []
    for seed in seeds:  # seed-major: every task's first seed runs early
        for task in tasks:
            c, t, log = commands(task, seed, build, data, tmp)
            jobs += [(task, seed, "corefit", c, log), (task, seed, "torch", t, None)]
    results = {}
    with cf.ThreadPoolExecutor(args.jobs) as ex:
        futs = {ex.submit(run_one, argv, log): (task, seed, side) for task, seed, side, argv, log in jobs}
        for f in cf.as_completed(futs):
            task, seed, side = futs[f]
            r = f.result()
            results.setdefault(task, {}).setdefault(side, {})[seed] = r
            print(f"{task} seed {seed} {side}: {json.dumps(r)}", file=sys.stderr, flush=True)
    with open(os.path.join(build, "tasks-results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("| task | metric | corefit mean ± std | PyTorch mean ± std | difference | agree | "
          "valid_loss corefit / PyTorch |")
    print("|---|---|--:|--:|--:|---|--:|")
    for task in tasks:
        key = TASKS[task]["metric"]
        row = {}
        for side in ("corefit", "torch"):
            rs = [results[task][side][s] for s in seeds]
            bad = [r["error"] for r in rs if "error" in r]
            if bad:
                print(f"{task} {side}: {bad[0]}", file=sys.stderr)
                row = None
                break
            row[side] = (summary([r[key] for r in rs]), summary([r["valid_loss"] for r in rs]))
        if not row:
            print(f"| {task} | {key} | failed | | | | |")
            continue
        (mc, sc), (lc, _) = row["corefit"]
        (mt, st), (lt, _) = row["torch"]
        band = 2 * math.sqrt((sc ** 2 + st ** 2) / len(seeds))
        agree = "yes" if abs(mc - mt) <= band else "NO"
        print(f"| {task} | {key} | {mc:.4f} ± {sc:.4f} | {mt:.4f} ± {st:.4f} | {mc - mt:+.4f} (band {band:.4f}) | "
              f"{agree} | {lc:.4f} / {lt:.4f} |")


if __name__ == "__main__":
    main()
