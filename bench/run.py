#!/usr/bin/python3
"""corefit's benchmark suite (`make bench`): the W1 workload, corefit against PyTorch
on the same machine in one run, each configuration run alternately and quoted as medians.

    /usr/bin/python3 bench/run.py --build build [--quick] [--pairs 3] [--batches 200]
                                  [--cores N] [--accuracy [--epochs 5]] [--out FILE]
                                  [--isa avx512,avx2] [--workload w1|vgg|images|w4|unet]
                                  [--torch-workers 0,1]

Configurations (N = the cores this process may run on, or --cores):
  1t    one process, 1 thread          bench_w1 --threads 1    w1_torch.py --threads 1
  Nt    one process, N threads         bench_w1 --threads N    w1_torch.py --threads N
  dp    data-parallel, N processes     bench_w1 --cores N      w1_torch.py --ddp N (gloo)
  mpi   mpirun -np N                   bench_w1 --mpi          (against torch DDP)
plus the single-thread SGEMM rate (bench/sgemm.c, per instruction set) at the start and at the
end of the run, and
with --accuracy the test accuracy of both after --epochs epochs of the recipe (one process,
N threads, bs 64, seed 42).

Instruction sets (--isa, default: every vector set this CPU has; for w4, and with --isa all,
generic too): each configuration runs once
per set, both sides capped alike: corefit with CF_ISA, PyTorch with ATEN_CPU_CAPABILITY and
ONEDNN_MAX_CPU_ISA. corefit selects OpenBLAS's kernels for its set itself (SkylakeX or
OpenBLAS's own AVX-512 choice at avx512, Haswell at avx2; src/tensor/isa.c), and PyTorch runs
with OPENBLAS_CORETYPE set to the same kernels. OPENBLAS_CORETYPE in run.py's own environment is
not passed on. A capped AVX-512 machine is not an AVX2 machine (clock and FMA ports differ):
quote both where you have both.

Workloads (--workload): w1, the mini-resnet (bench_w1, w1_torch.py); vgg, a plain VGG-style
CNN with a large Linear layer and SGD with momentum (bench_vgg, vgg_torch.py); images (W3),
fastai's fine_tune of a resnet18 on a folder of RGB JPEGs at 128 px with aug_transforms
(bench_images, images_torch.py), whose folder bench/make_images.py writes into BUILD/w3-images
first when it is missing (from Fashion-MNIST; about 10 s). For images, --torch-workers lists the
DataLoader worker counts PyTorch is measured with (each a variant; the faster median is
compared), and --accuracy reports the validation accuracy of fine_tune(--epochs) (one frozen
epoch first). unet (W5): fastai's unet_learner on a resnet18 body (DynamicUnet) over 64 x 64
segmentation scenes of Fashion-MNIST garments, bs 16 per process (bench_unet, unet_torch.py),
whose scenes `BUILD/corefit fmnist-tasks segmentation` writes into BUILD/w5-seg first when they
are missing; its --accuracy is DiceMulti on the held-out scenes. For w4, --accuracy runs the
ULMFiT recipe on both sides for every --seeds (W4's corpus and sizes, --lm-epochs, --epochs);
--accuracy --recipe parity runs only the short parity recipe of bench/w4_text_parity.py instead
(its own slice, sizes and epochs; --jobs runs at once, each 1 thread) and prints its table.

Builds nothing: expects bench_w1 (bench_vgg, bench_images) and sgemm in --build (`make build`).
The OpenBLAS kernels of each set are those sgemm reports under its CF_ISA (cf_blas_core());
every corefit run must report the same ones.
See bench/README.md for what each number means.
"""
import argparse
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="CMake build directory with bench_w1 and sgemm")
    ap.add_argument("--quick", action="store_true", help="about 2 minutes on an idle 2-core machine")
    ap.add_argument("--pairs", type=int, default=3, help="alternating corefit/PyTorch pairs per configuration")
    ap.add_argument("--batches", type=int, default=0, help="training steps per measurement (200; --quick 60)")
    ap.add_argument("--cores", type=int, default=0, help="N (default: the cores this process may use)")
    ap.add_argument("--only", default="", help="comma-separated subset of 1t,Nt,dp,mpi")
    ap.add_argument("--accuracy", action="store_true", help="also the test accuracy after --epochs epochs")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    ap.add_argument("--out", default="", help="raw results as JSON (default: BUILD/bench-WORKLOAD.json)")
    ap.add_argument("--isa", default="", help="comma-separated instruction sets (or all) to compare at "
                    "(generic, avx2, avx512; default: every vector set this CPU has, and generic for w4)")
    ap.add_argument("--workload", default="w1", choices=["w1", "vgg", "images", "w4", "unet"], help="the model to train")
    ap.add_argument("--seeds", default="1,2,3", help="w4 --accuracy: the seeds of the recipe, each run by both")
    ap.add_argument("--lm-epochs", type=int, default=1, help="w4 --accuracy: language-model epochs")
    ap.add_argument("--recipe", default="full", choices=["full", "parity"],
                    help="w4 --accuracy: full (W4's corpus and sizes, --lm-epochs, --epochs) or parity (the short "
                    "recipe of bench/README.md's \"W4 recipe\": its own slice, sizes and epochs; no throughput runs)")
    ap.add_argument("--jobs", type=int, default=1, help="w4 --accuracy --recipe parity: runs at once (each 1 thread)")
    ap.add_argument("--torch-workers", default="0,1", help="images: comma-separated DataLoader worker counts "
                    "to measure PyTorch with (each a variant; the faster is compared)")
    return ap.parse_args()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_json(cmd, env=None, timeout=1800):
    """Runs cmd, returns the last JSON line it printed (or a dict with 'error')."""
    t = time.time()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "cmd": " ".join(cmd)}
    wall = time.time() - t
    for line in reversed(p.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                r = json.loads(line)
                r["run_s"] = wall
                if p.returncode != 0:
                    r["error"] = f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
                return r
            except json.JSONDecodeError:
                pass
    return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-500:]}", "cmd": " ".join(cmd)}


def loadavg():
    try:
        return float(open("/proc/loadavg").read().split()[0])
    except OSError:
        return float("nan")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# How PyTorch (ATen's kernels, oneDNN) and OpenBLAS are held to each set.
TORCH_ISA_ENV = {
    "generic": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
ISA_ORDER = ["generic", "avx2", "avx512"]


def cpu_isas():
    """The vector instruction sets this CPU reports, as corefit's dispatch checks them."""
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    have = ["generic"]
    if {"avx2", "fma"} <= flags:
        have.append("avx2")
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "bmi2"} <= flags:
            have.append("avx512")
    return have


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".0f"):
    return "—" if x is None else format(x, spec)


def ratio(a, b):
    return a / b if a is not None and b else None


def w4_data(build):
    """W4's corpus (BUILD/w4-fortunes, every fortune file), its topic classifier's corpus
    (BUILD/w4-topics, the six largest files) and the ids both sides train on (BUILD/w4-ids,
    written by bench_w4 --export), each made when missing."""
    script = os.path.join(os.path.dirname(HERE), "scripts", "fortunes-folder")
    for name, extra in (("w4-fortunes", []), ("w4-topics", ["--topics", ",".join(W4_TOPICS)])):
        d = os.path.join(build, name)
        if not os.path.isdir(os.path.join(d, "train")):
            log(f"[bench] writing {d} (scripts/fortunes-folder)")
            if subprocess.run([PY, script, d] + extra, stdout=sys.stderr).returncode != 0:
                sys.exit(f"run.py: scripts/fortunes-folder {d} failed (is Debian's fortunes installed?)")
    ids = os.path.join(build, "w4-ids")
    if not os.path.exists(os.path.join(ids, "vocab.txt")):
        os.makedirs(ids, exist_ok=True)
        log(f"[bench] writing {ids} (bench_w4 --export: tokenizes the corpus)")
        r = run_json([os.path.join(build, "bench_w4"), "--export", ids], timeout=1800)
        if "error" in r:
            sys.exit(f"run.py: bench_w4 --export {ids}: {r['error']}")


W4_TOPICS = ["people", "definitions", "cookie", "computers", "songs-poems", "politics"]


def w4_recipes(a, bench, torch_py, torch_args, envs, n):
    """The recipe of bench_w4 --recipe and w4_torch.py --recipe for every seed, alternately."""
    cf_env, torch_env = envs
    out = {"cf": [], "torch": [], "seeds": [int(x) for x in a.seeds.split(",") if x], "n": n}
    ep = ["--lm-epochs", str(a.lm_epochs), "--clas-epochs", str(a.epochs)]
    for i, seed in enumerate(out["seeds"]):
        runs = [("cf", [bench, "--recipe", "--threads", str(n), "--seed", str(seed)] + ep, cf_env),
                ("torch", [PY, torch_py, "--recipe", "--threads", str(n), "--seed", str(seed)] + ep + torch_args,
                 torch_env)]
        for impl, cmd, env in runs if i % 2 == 0 else runs[::-1]:
            r = run_json(cmd, env=env, timeout=max(a.timeout, 14400))
            out[impl].append(r)
            log(f"[bench] recipe seed {seed} {impl}: " + (r.get("error") or
                f"perplexity {r['perplexity']:.2f}, classifier accuracy {100 * r['clas_accuracy']:.2f}%"))
    return out


def w4_print_recipes(acc):
    def stats(rs, key, scale=1):
        xs = [scale * r[key] for r in rs if "error" not in r]
        if not xs:
            return "—"
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return f"{statistics.mean(xs):.2f} ± {sd:.2f} ({', '.join(f'{x:.2f}' for x in xs)})"

    print()
    print(f"The recipe, 1 process, {acc['n']} threads, seeds {', '.join(map(str, acc['seeds']))} (mean ± sd, each seed):")
    print()
    print("| after the recipe | corefit | PyTorch |")
    print("|---|--:|--:|")
    print(f"| language model: validation perplexity | {stats(acc['cf'], 'perplexity')} | {stats(acc['torch'], 'perplexity')} |")
    print(f"| language model: validation accuracy % | {stats(acc['cf'], 'lm_accuracy', 100)} | "
          f"{stats(acc['torch'], 'lm_accuracy', 100)} |")
    print(f"| topic classifier: validation accuracy % | {stats(acc['cf'], 'clas_accuracy', 100)} | "
          f"{stats(acc['torch'], 'clas_accuracy', 100)} |")


def main():
    a = parse_args()
    build = os.path.abspath(a.build)
    programs = {"w1": ("bench_w1", "w1_torch.py"), "vgg": ("bench_vgg", "vgg_torch.py"),
                "images": ("bench_images", "images_torch.py"), "w4": ("bench_w4", "w4_torch.py"),
                "unet": ("bench_unet", "unet_torch.py")}
    bench = os.path.join(build, programs[a.workload][0])
    sgemm = os.path.join(build, "sgemm")
    parity = a.workload == "w4" and a.accuracy and a.recipe == "parity"  # only the recipe (w4_text_parity.py)
    for exe in (bench,) if parity else (bench, sgemm):
        if not os.access(exe, os.X_OK):
            sys.exit(f"run.py: {exe} not found; build first (make build, or cmake --build {a.build})")
    torch_py = os.path.join(HERE, programs[a.workload][1])
    if parity:
        import w4_text_parity

        w4_text_parity.run_all(build, [int(x) for x in a.seeds.split(",") if x], a.jobs)
        return 0
    data_args = []  # both sides' --data
    cf_args, torch_args = [], []  # one side's own
    unit, per_row = "img", 1  # W4 counts tokens: each row ("image") of a batch is 72 tokens
    torch_variants = [("default", [], {})]  # (name, extra PyTorch arguments, extra environment)
    if a.workload == "images":
        images = os.path.join(build, "w3-images")
        if not os.path.exists(os.path.join(images, "w3.json")):
            log(f"[bench] writing W3's image folder {images} (bench/make_images.py)")
            p = subprocess.run([PY, os.path.join(HERE, "make_images.py"), "--out", images], stdout=sys.stderr)
            if p.returncode != 0:
                sys.exit(f"run.py: bench/make_images.py --out {images} failed")
        data_args = ["--data", images]
        workers = [int(x) for x in a.torch_workers.split(",") if x]
        torch_variants = [(f"workers={w}", ["--workers", str(w)], {}) for w in workers]
    if a.workload == "unet":
        scenes = os.path.join(build, "w5-seg")
        if not os.path.exists(os.path.join(scenes, "codes.txt")):
            log(f"[bench] writing W5's segmentation scenes {scenes} (corefit fmnist-tasks)")
            p = subprocess.run([os.path.join(build, "corefit"), "fmnist-tasks", "segmentation", scenes,
                                "--n", "1000", "--size", "64"], stdout=sys.stderr)
            if p.returncode != 0:
                sys.exit(f"run.py: corefit fmnist-tasks segmentation {scenes} failed")
        data_args = ["--data", scenes]
    if a.workload == "w4":
        w4_data(build)
        torch_args = ["--ids", os.path.join(build, "w4-ids")]
        unit, per_row = "tok", 72
    have = cpu_isas()
    # W4 (issue 29) is compared at every level, generic (SSE: OpenBLAS's Nehalem kernels) included;
    # the other workloads at every vector set by default. --isa all: every level for any workload.
    if a.isa == "all" or (not a.isa and a.workload == "w4"):
        isas = list(have)
    else:
        isas = [x for x in a.isa.split(",") if x] if a.isa else [x for x in have if x != "generic"] or ["generic"]
    for x in isas:
        if x not in have:
            sys.exit(f"run.py: --isa {x}: this CPU supports {', '.join(have)}")
    isas.sort(key=ISA_ORDER.index, reverse=True)
    n = a.cores or len(os.sched_getaffinity(0))
    batches = a.batches or ((8 if a.quick else 15) if a.workload == "w4" else 60 if a.quick else 200)
    pairs = a.pairs
    only = set(a.only.split(",")) if a.only else {"1t", "Nt", "dp", "mpi"}
    if n < 2:
        only -= {"Nt", "dp", "mpi"}

    started = datetime.datetime.now().astimezone()
    load0 = loadavg()
    log(f"[bench] {cpu_model()}, {n} cores, load average {load0:.2f}; {pairs} pairs of {batches} steps")

    # corefit chooses OpenBLAS's kernels for each set; an inherited OPENBLAS_CORETYPE would pin them
    base_env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if "OPENBLAS_CORETYPE" in os.environ:
        log(f"[bench] OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} in the environment is not passed on")

    def sgemm_run(isa):
        r = run_json([sgemm, "0.5" if a.quick else "1"], env=dict(base_env, CF_ISA=isa), timeout=120)
        if "error" not in r and r.get("isa", isa) != isa:
            r["error"] = f"ran with {r.get('isa')} kernels, not {isa}"
        return r

    sg = {isa: [sgemm_run(isa)] for isa in isas}
    core = {}
    for isa in isas:
        if "error" in sg[isa][0]:
            sys.exit(f"run.py: sgemm failed at {isa}: {sg[isa][0]['error']}")
        core[isa] = sg[isa][0]["blas_core"]
        log(f"[bench] {isa}: SGEMM 1 thread: {sg[isa][0]['sgemm_gflops_cpu']:.1f} GFLOP/CPU-s, "
            f"{sg[isa][0]['sgemm_gflops']:.1f} best wall; OpenBLAS kernels {core[isa]} "
            f"(PyTorch runs with OPENBLAS_CORETYPE={core[isa]})")

    def envs(isa):
        cf = dict(base_env, CF_ISA=isa)
        torch = dict(base_env, OPENBLAS_CORETYPE=core[isa], **TORCH_ISA_ENV[isa])
        return cf, torch

    mpirun = shutil.which("mpirun")
    mpi_cmd = None
    if mpirun and "mpi" in only:
        mpi_cmd = [mpirun, "-np", str(n), "--oversubscribe"]
        if os.geteuid() == 0:
            mpi_cmd.insert(1, "--allow-run-as-root")
    notes = []
    if "mpi" in only and not mpirun:
        notes.append("mpirun not found: the mpi configuration was skipped")
        only.discard("mpi")

    steps = ["--batches", str(batches)] + data_args + (["--skip", "3"] if a.workload == "w4" else [])

    def tv(cmd, name=None, env=None):  # PyTorch's variants of one command, with a setting of its own
        out = []
        for v, args, e in torch_variants:
            label = v if not name else name if v == "default" else f"{v}, {name}"
            out.append((label, cmd + args, dict(e, **(env or {}))))
        return out

    configs = []  # (key, label, corefit cmd, [(PyTorch variant, cmd, extra env)], isa)
    for isa in isas:
        tag = f"{isa}: " if len(isas) > 1 else ""
        if "1t" in only:
            configs.append((f"{isa}:1t", f"{tag}1 process, 1 thread", [bench, "--threads", "1"] + steps,
                            tv([PY, torch_py, "--threads", "1"] + steps + torch_args), isa))
        if "Nt" in only:
            # libgomp's threads spin while they wait (OMP_WAIT_POLICY active): on a machine whose
            # cores are busy with other work that can cost PyTorch 10x; passive waiting is its best
            # setting there. Both are measured and the faster one is compared.
            t_cmd = [PY, torch_py, "--threads", str(n)] + steps + torch_args
            configs.append((f"{isa}:Nt", f"{tag}1 process, {n} threads", [bench, "--threads", str(n)] + steps,
                            tv(t_cmd) + tv(t_cmd, "OMP_WAIT_POLICY=passive", {"OMP_WAIT_POLICY": "passive"}),
                            isa))
        if "dp" in only:
            configs.append((f"{isa}:dp", f"{tag}data-parallel, {n} processes (fork / DDP gloo)",
                            [bench, "--cores", str(n)] + steps,
                            tv([PY, torch_py, "--ddp", str(n)] + steps + torch_args), isa))
        if "mpi" in only:
            configs.append((f"{isa}:mpi", f"{tag}mpirun -np {n} (vs DDP gloo)", mpi_cmd + [bench, "--mpi"] + steps,
                            [], isa))

    results = {c[0]: {"cf": [], "torch": {v[0]: [] for v in c[3]}} for c in configs}
    for i in range(pairs):
        for key, label, cf_cmd, variants, isa in configs:
            cf_env, torch_env = envs(isa)
            order = [("cf", "", cf_cmd, cf_env)] + [("torch", v, cmd, dict(torch_env, **extra)) for v, cmd, extra in variants]
            if i % 2:
                order.reverse()  # alternate who goes first, so that drift hits both alike
            for impl, variant, cmd, env in order:
                if impl == "torch":
                    cmd = cmd + ["--port", str(random.randint(20000, 60000))]
                r = run_json(cmd, env=env, timeout=a.timeout)
                r["load"] = loadavg()
                (results[key]["cf"] if impl == "cf" else results[key]["torch"][variant]).append(r)
                msg = r.get("error") or f"{r['images_per_s'] * per_row:.0f} {unit}/s, {r['images_per_cpu_s'] * per_row:.0f} {unit}/CPU-s"
                if impl == "cf" and "error" not in r and r.get("isa", isa) != isa:
                    r["error"] = f"ran with {r.get('isa')} kernels, not {isa}"
                    msg = r["error"]
                if impl == "cf" and "error" not in r and r.get("blas_core", core[isa]) != core[isa]:
                    r["error"] = f"ran with OpenBLAS kernels {r.get('blas_core')}, not {core[isa]}"
                    msg = r["error"]
                who = "corefit" if impl == "cf" else "PyTorch" + ("" if variant == "default" else f" ({variant})")
                log(f"[bench] pair {i + 1}/{pairs} {label:<44} {who:<8} {msg}")

    sgemm_cpu, sgemm_wall = {}, {}
    for isa in isas:
        sg[isa].append(sgemm_run(isa))
        sg_ok = [s for s in sg[isa] if "error" not in s]
        sgemm_cpu[isa] = max(s["sgemm_gflops_cpu"] for s in sg_ok)
        sgemm_wall[isa] = max(s["sgemm_gflops"] for s in sg_ok)

    acc = {}
    if a.accuracy and a.workload == "w4":
        acc = w4_recipes(a, bench, torch_py, torch_args, envs(isas[0]), n)
    elif a.accuracy:
        ep = ["--epochs", str(a.epochs)] + data_args
        log(f"[bench] accuracy: {a.epochs} epochs, 1 process, {n} threads, each")
        cf_env, torch_env = envs(isas[0])
        acc["cf"] = run_json([bench, "--threads", str(n)] + ep, env=cf_env, timeout=max(a.timeout, 7200))
        # PyTorch's first variant (for images: the first --torch-workers)
        acc["torch"] = run_json([PY, torch_py, "--threads", str(n)] + ep + torch_variants[0][1],
                                env=torch_env, timeout=max(a.timeout, 7200))
        for k, v in acc.items():
            log(f"[bench] accuracy {k}: {v.get('error') or v.get('test_acc')}")

    # ---- summary -----------------------------------------------------------------------------
    def summary(rs):
        ok = [r for r in rs if "error" not in r]
        if not ok:
            return None
        return {
            "n": len(ok),
            "ips": med([r["images_per_s"] * per_row for r in ok]),
            "ips_all": [round(r["images_per_s"] * per_row, 1) for r in ok],
            "ipc": med([r["images_per_cpu_s"] for r in ok]),
            "gflops": med([r["gflops"] for r in ok]),
            "rss": med([r["peak_rss_mb"] for r in ok]),
            "pss": med([r["pss_mb"] for r in ok]),
            "mflop": ok[0]["mflop_per_image"],
            "procs": ok[0]["procs"],
            "threads": ok[0]["threads"],
        }

    summ = {}
    for k, v in results.items():
        best, best_v = None, None
        for variant, rs in v["torch"].items():
            sv = summary(rs)
            if sv and (best is None or sv["ips"] > best["ips"]):
                best, best_v = sv, variant
        summ[k] = {"cf": summary(v["cf"]), "torch": best}
        if len(v["torch"]) > 1:
            alt = ", ".join(f"{var}: {fmt(summary(rs) and summary(rs)['ips'])} img/s" for var, rs in v["torch"].items())
            notes.append(f"{k}: PyTorch medians per setting ({alt}); the table shows the faster ({best_v})")
    for isa in isas:
        if f"{isa}:mpi" in summ and f"{isa}:dp" in summ:
            summ[f"{isa}:mpi"]["torch"] = summ[f"{isa}:dp"]["torch"]

    rows = []
    for key, label, _, _, isa in configs:
        s = summ[key]
        cf, tt = s["cf"], s["torch"]
        one = summ.get(f"{isa}:1t", {})
        cores = 1 if key.endswith(":1t") else n

        def eff(x, base):
            if x is None or base is None or key.endswith(":1t"):
                return None
            return x["ips"] / (cores * base["ips"])

        def pct(x):  # achieved GFLOP per CPU-second against SGEMM's, per core
            return None if x is None else 100 * x["ipc"] * x["mflop"] / 1e3 / sgemm_cpu[isa]

        rows.append({
            "key": key, "label": label, "isa": isa,
            "cf_ips": cf and cf["ips"], "torch_ips": tt and tt["ips"],
            "ratio": ratio(cf and cf["ips"], tt and tt["ips"]),
            "cf_ipc": cf and cf["ipc"] * per_row, "torch_ipc": tt and tt["ipc"] * per_row,
            "ratio_cpu": ratio(cf and cf["ipc"], tt and tt["ipc"]),
            "cf_eff": eff(cf, one.get("cf")), "torch_eff": eff(tt, one.get("torch")),
            "cf_gflops": cf and cf["gflops"], "torch_gflops": tt and tt["gflops"],
            "cf_pct": pct(cf), "torch_pct": pct(tt),
            "cf_rss": cf and cf["rss"], "torch_rss": tt and tt["rss"],
            "cf_pss": cf and cf["pss"], "torch_pss": tt and tt["pss"],
        })

    load1 = loadavg()
    cmdline = "/usr/bin/python3 bench/run.py " + " ".join(sys.argv[1:])
    print()
    title = {"w1": "W1 (mini-resnet, Fashion-MNIST", "vgg": "W2 (VGG-style CNN, Fashion-MNIST",
             "images": "W3 (resnet18 fine_tune, unfrozen phase, RGB JPEG folder at 128 px",
             "w4": "W4 (AWD-LSTM language model, awd_lstm_lm_config, fortunes corpus, seq_len 72",
             "unet": "W5 (unet_learner, DynamicUnet on resnet18, 64 x 64 Fashion-MNIST scenes, 11 codes"}[a.workload]
    print(f"{title}, bs {16 if a.workload == 'unet' else 64} per process), {started:%Y-%m-%d %H:%M %Z}; `{cmdline}`")
    print(f"{cpu_model()}, {n} cores; load average {load0:.1f} at start, {load1:.1f} at end; "
          f"medians of {pairs} alternating pairs of {batches} training steps "
          f"(first {3 if a.workload == 'w4' else 5} excluded)")
    for isa in isas:
        print(f"{isa}: SGEMM 1 thread (OpenBLAS {core[isa]} kernels, 1024^3): {sgemm_cpu[isa]:.1f} GFLOP per "
              f"CPU-second ({sgemm_wall[isa]:.1f} best wall); PyTorch ran with OPENBLAS_CORETYPE={core[isa]}")
    print()
    print(f"| configuration | corefit {unit}/s | PyTorch {unit}/s | ratio | corefit {unit}/CPU-s | PyTorch {unit}/CPU-s "
          "| ratio (CPU) "
          "| scaling eff. corefit / PyTorch | GFLOP/s corefit / PyTorch | % of SGEMM (per CPU-s) corefit / PyTorch "
          "| peak RSS MB corefit / PyTorch | PSS MB corefit / PyTorch |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        torch_note = " (DDP)" if r["key"].endswith(":mpi") else ""
        print(
            f"| {r['label']} | {fmt(r['cf_ips'])} | {fmt(r['torch_ips'])}{torch_note} | {fmt(r['ratio'], '.2f')} "
            f"| {fmt(r['cf_ipc'])} | {fmt(r['torch_ipc'])} | {fmt(r['ratio_cpu'], '.2f')} "
            f"| {fmt(r['cf_eff'], '.2f')} / {fmt(r['torch_eff'], '.2f')} "
            f"| {fmt(r['cf_gflops'], '.1f')} / {fmt(r['torch_gflops'], '.1f')} "
            f"| {fmt(r['cf_pct'], '.0f')}% / {fmt(r['torch_pct'], '.0f')}% "
            f"| {fmt(r['cf_rss'])} / {fmt(r['torch_rss'])} | {fmt(r['cf_pss'])} / {fmt(r['torch_pss'])} |"
        )
    if acc and a.workload == "w4":
        w4_print_recipes(acc)
    elif acc:
        ca, ta = acc.get("cf", {}).get("test_acc"), acc.get("torch", {}).get("test_acc")
        what = (f"validation accuracy after fine_tune({a.epochs}), 1 frozen + {a.epochs} epochs" if a.workload == "images"
                else f"validation DiceMulti after {a.epochs} epochs" if a.workload == "unet"
                else f"test accuracy after {a.epochs} epochs")
        print(f"| {what} (1 process, {n} threads, seed 42) | "
              f"{fmt(ca and 100 * ca, '.2f')}% | {fmt(ta and 100 * ta, '.2f')}% | | | | | | | | | |")
    print()
    errors = [(k, "corefit", r["error"]) for k, v in results.items() for r in v["cf"] if "error" in r]
    errors += [(k, f"PyTorch {var}", r["error"]) for k, v in results.items() for var, rs in v["torch"].items()
               for r in rs if "error" in r]
    for k, impl, e in errors:
        notes.insert(0, f"{k} {impl} failed: {e}")
    notes.append("img/s: wall time; img/CPU-s: images per CPU-second of all the run's processes in the timed window "
                 "(less sensitive to other load on a shared machine). Scaling eff. = N-core img/s / (N x 1-thread img/s). "
                 "% of SGEMM = achieved GFLOP per CPU-second / SGEMM's at the same instruction set. Peak RSS sums each process's own peak "
                 "(pages shared after fork counted in each); PSS is the sum at the end of training. "
                 "mpirun's own processes are not counted.")
    for note in notes:
        print(f"- {note}")

    notes.append("Instruction sets: corefit capped with CF_ISA; PyTorch with ATEN_CPU_CAPABILITY and "
                 "ONEDNN_MAX_CPU_ISA; OpenBLAS kernels chosen by corefit for each set, and PyTorch given the same "
                 "with OPENBLAS_CORETYPE. "
                 "A capped machine is not a machine without the set (clock, ports): quote real ones too.")
    out = a.out or os.path.join(build, f"bench-{a.workload}.json")
    with open(out, "w") as f:
        json.dump({"started": started.isoformat(), "command": cmdline, "cpu": cpu_model(), "cores": n,
                   "workload": a.workload, "isas": isas, "batches": batches, "pairs": pairs, "load_start": load0, "load_end": load1,
                   "sgemm": sg, "rows": rows, "raw": results, "accuracy": acc, "notes": notes}, f, indent=1)
    log(f"[bench] raw results: {out}")
    return 1 if errors and not any(r["cf_ips"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
