#!/usr/bin/python3
"""W4 in mixed precision: corefit's cf_learner_to_bf16 (bench_w4 --bf16) against PyTorch's CPU
autocast bfloat16 (w4_torch.py --bf16), each beside its own fp32, one process and 1 thread.

    w4_bf16.py --build build [--pairs 3] [--batches 4] [--skip 1]

Runs the four variants (corefit fp32, corefit bf16, PyTorch fp32, PyTorch bf16) one after the
other, --pairs times, at the CPU's best level (corefit computes in bf16 only at avx512_bf16 and
amx: capped below, bench_w4 --bf16 runs fp32 and its JSON line says bf16_compute false), and
prints the medians: tokens per second of wall time and per CPU-second (rows of 72 tokens, the
first --skip steps excluded), peak RSS, and the ratios. Needs BUILD/w4-fortunes and BUILD/w4-ids
(bench/run.py --workload w4 makes them). Every run's JSON line goes to BUILD/bench-w4-bf16.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
SEQ_LEN = 72


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_json(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--skip", type=int, default=1)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    ids = os.path.join(build, "w4-ids")
    if not os.path.exists(os.path.join(ids, "vocab.txt")):
        sys.exit(f"w4_bf16.py: {ids} is missing: run bench/run.py --build {a.build} --workload w4 once")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "CF_ISA")}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    steps = ["--threads", "1", "--batches", str(a.batches), "--skip", str(a.skip)]
    variants = {
        "corefit fp32": [os.path.join(build, "bench_w4")] + steps,
        "corefit bf16": [os.path.join(build, "bench_w4")] + steps + ["--bf16"],
        "PyTorch fp32": [PY, os.path.join(HERE, "w4_torch.py"), "--ids", ids] + steps,
        "PyTorch bf16": [PY, os.path.join(HERE, "w4_torch.py"), "--ids", ids] + steps + ["--bf16"],
    }
    res = {v: [] for v in variants}
    loads = [loadavg()]
    t0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(os.path.join(build, "bench-w4-bf16.json"), "w") as out:
        for pair in range(a.pairs):
            for name, cmd in variants.items():
                r = run_json(cmd, env)
                r.update(variant=name, pair=pair, load=loadavg())
                loads.append(r["load"])
                out.write(json.dumps(r) + "\n")
                out.flush()
                print(f"[w4_bf16] pair {pair + 1} {name}: "
                      + (r["error"] if "error" in r else
                         f"{r['images_per_s'] * SEQ_LEN:.0f} tok/s, {r['images_per_cpu_s'] * SEQ_LEN:.0f} tok/CPU-s"),
                      file=sys.stderr, flush=True)
                res[name].append(r)

    def med(name, key):
        xs = [r[key] for r in res[name] if "error" not in r and key in r]
        return statistics.median(xs) if xs else None

    cf16 = [r for r in res["corefit bf16"] if "error" not in r]
    print(f"W4, 1 process, 1 thread, {a.batches} steps ({a.skip} skipped), medians of {a.pairs} alternating runs; "
          f"started {t0}, load average {min(loads):.1f}-{max(loads):.1f}; corefit's level "
          f"{cf16[0].get('isa') if cf16 else '?'}, bf16 compute {cf16[0].get('bf16_compute') if cf16 else '?'}")
    print()
    print("| variant | tok/s | tok/CPU-s | peak RSS MB |")
    print("|---|--:|--:|--:|")
    for name in variants:
        ips, ipc, rss = med(name, "images_per_s"), med(name, "images_per_cpu_s"), med(name, "peak_rss_mb")
        f = lambda x, s=1: f"{x * s:.0f}" if x is not None else "—"  # noqa: E731
        print(f"| {name} | {f(ips, SEQ_LEN)} | {f(ipc, SEQ_LEN)} | {f(rss)} |")
    print()

    def ratio(a_, b_, key):
        x, y = med(a_, key), med(b_, key)
        return f"{x / y:.2f}" if x and y else "—"

    print("| ratio (medians) | wall | CPU |")
    print("|---|--:|--:|")
    for a_, b_ in (("corefit bf16", "corefit fp32"), ("PyTorch bf16", "PyTorch fp32"),
                   ("corefit fp32", "PyTorch fp32"), ("corefit bf16", "PyTorch bf16")):
        print(f"| {a_} / {b_} | {ratio(a_, b_, 'images_per_s')} | {ratio(a_, b_, 'images_per_cpu_s')} |")


if __name__ == "__main__":
    main()
