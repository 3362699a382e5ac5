#!/usr/bin/python3
"""W4's parity recipe: ULMFiT on a slice of the fortunes corpus, corefit (bench_w4 --recipe)
against PyTorch (w4_torch.py --recipe), several seeds, each run at 1 thread. The full recipe
(W4's corpus, awd_lstm_lm_config's sizes) needs about an hour of CPU a side per seed; this one
needs a few minutes and still learns (perplexity well below the unigram baseline, the classifier
far above chance), so the two implementations can be compared over several seeds.

The recipe (PARITY below; bench/README.md, "W4 recipe"):
  data    the six topics of W4's classifier (people, definitions, cookie, computers, songs-poems,
          politics), the first 500 quotations of each (scripts/fortunes-folder --max-per-topic
          500, its seed 42 split: 400 train, 100 valid a topic). The language model trains on the
          2,400 training quotations and is validated on the 600 others; the classifier has the
          same split. corefit's tokenizer and vocabulary (min_freq 3: 4,376 words) for both
          (bench_w4 --export).
  models  AWD-LSTM with emb_sz 128, n_hid 384, 3 layers; every dropout as fastai's
          awd_lstm_lm_config (LM) and awd_lstm_clas_config x drop_mult 0.5 (classifier); tied
          decoder; classifier head [384, 50, 6], seq_len 72, max_len 1440.
  LM      bs 32, seq_len 72, fit_one_cycle(8, 1e-2) (--lm-epochs; with 4 most seeds stay on the unigram plateau), wd 0.1, AR 2 / TAR 1, moms (0.8, 0.7, 0.8).
  clas    bs 32, the encoder loaded, fit_one_cycle(1, 2e-2); freeze_to(-2)
          slice(1e-2/2.6^4, 1e-2); freeze_to(-3) slice(5e-3/2.6^4, 5e-3); unfreeze()
          fit_one_cycle(2, slice(1e-3/2.6^4, 1e-3)); wd 0.01.

    w4_text_parity.py --build build [--seeds 1,2,3] [--jobs 6]    runs, then the table
    w4_text_parity.py --build build --seeds 1,2,3 --summarize      the table of the last runs
    bench/run.py --build build --workload w4 --accuracy --recipe parity [--seeds] [--jobs]

Runs write BUILD/w4p-runs/{cf,torch}-SEED.{out,err} (the JSON line, each fit's epoch table; the
.err ends with the run's CPU-seconds and peak RSS); accuracy does not depend on load, so the runs
may share the cores (--jobs).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable or "/usr/bin/python3"  # the interpreter running this script runs PyTorch's side
TOPICS = ["people", "definitions", "cookie", "computers", "songs-poems", "politics"]
PARITY = dict(max_per_topic=500, emb_sz=128, n_hid=384, n_layers=3, bs=32, lm_epochs=8, clas_epochs=2)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def prepare(build):
    """BUILD/w4p-topics (the slice) and BUILD/w4p-ids (the ids both sides train on)."""
    topics = os.path.join(build, "w4p-topics")
    if not os.path.isdir(os.path.join(topics, "train")):
        log(f"[parity] writing {topics} (scripts/fortunes-folder)")
        script = os.path.join(os.path.dirname(HERE), "scripts", "fortunes-folder")
        if subprocess.run([PY, script, topics, "--max-per-topic", str(PARITY["max_per_topic"]), "--topics",
                           ",".join(TOPICS)], stdout=sys.stderr).returncode != 0:
            sys.exit(f"w4_text_parity.py: scripts/fortunes-folder {topics} failed (is Debian's fortunes installed?)")
    ids = os.path.join(build, "w4p-ids")
    if not os.path.exists(os.path.join(ids, "vocab.txt")):
        os.makedirs(ids, exist_ok=True)
        log(f"[parity] writing {ids} (bench_w4 --export)")
        r = subprocess.run([os.path.join(build, "bench_w4"), "--export", ids, "--data", topics, "--topics", topics],
                           stdout=sys.stderr)
        if r.returncode != 0:
            sys.exit(f"w4_text_parity.py: bench_w4 --export {ids} failed")
    return topics, ids


def commands(build, seed, topics, ids, torch_threads=1):
    p = PARITY
    common = ["--recipe", "--seed", str(seed), "--emb-sz", str(p["emb_sz"]), "--n-hid",
              str(p["n_hid"]), "--n-layers", str(p["n_layers"]), "--bs", str(p["bs"]), "--lm-epochs",
              str(p["lm_epochs"]), "--clas-epochs", str(p["clas_epochs"])]
    return {"cf": [os.path.join(build, "bench_w4"), "--threads", "1"] + common + ["--data", topics, "--topics", topics],
            "torch": [PY, os.path.join(HERE, "w4_torch.py"), "--ids", ids, "--threads", str(torch_threads)] + common}


def run_one(cmd, out, err, env):
    """Runs cmd with stdout/stderr to files; appends its CPU-seconds and peak RSS to err."""
    t0 = time.time()
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    with open(err, "a") as fe:
        fe.write(f"cpu {ru.ru_utime:.2f} {ru.ru_stime:.2f} maxrss_kb {ru.ru_maxrss} wall {time.time() - t0:.2f} "
                 f"exit {p.returncode}\n")


def run_all(build, seeds, jobs, torch_threads=1):
    topics, ids = prepare(build)
    runs_dir = os.path.join(build, "w4p-runs")
    os.makedirs(runs_dir, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update(OMP_NUM_THREADS=str(torch_threads), OPENBLAS_NUM_THREADS="1")
    todo = []
    for i, s in enumerate(seeds):
        cmds = commands(build, s, topics, ids, torch_threads)
        order = ["cf", "torch"] if i % 2 == 0 else ["torch", "cf"]
        todo += [(impl, s, cmds[impl]) for impl in order]
    sem = threading.Semaphore(max(1, jobs))
    threads = []

    def job(impl, s, cmd):
        with sem:
            log(f"[parity] start {impl} seed {s}: {' '.join(cmd)}")
            base = os.path.join(runs_dir, f"{impl}-{s}")
            run_one(cmd, base + ".out", base + ".err", env)
            log(f"[parity] done {impl} seed {s}")

    for t in todo:
        th = threading.Thread(target=job, args=t)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return summarize(build, seeds)


def parse_run(base):
    """The run's JSON line, its epoch rows [(train_loss, valid_loss, metric)] and its CPU line."""
    r = {"error": f"{base}.out: no JSON line"}
    rows, cpu = [], None
    try:
        out = open(base + ".out").read().splitlines()
        err = open(base + ".err").read().splitlines()
    except OSError as e:
        return {"error": str(e)}, rows
    for line in out:
        if line.startswith("{"):
            r = json.loads(line)
        f = line.split()
        if len(f) >= 4 and f[0].isdigit():  # corefit's table: epoch train_loss valid_loss metric...
            rows.append(tuple(float(x) for x in f[1:4]))
    for line in err:
        f = line.split()
        if line.startswith("epoch "):  # w4_torch.py: epoch E: train_loss X valid Y metric Z
            rows.append((float(f[3]), float(f[5]), float(f[7])))
        if line.startswith("cpu "):  # run_one's line (or /usr/bin/time -f "cpu %U %S maxrss_kb %M wall %e")
            cpu = (float(f[1]) + float(f[2]), int(f[4]) / 1024, int(f[f.index("exit") + 1]) if "exit" in f else 0)
    if cpu:
        r["cpu_s"], r["peak_rss_mb"] = cpu[0], cpu[1]
        if cpu[2] != 0:
            r["error"] = f"exit {cpu[2]}"
    return r, rows


def mean_sd(xs):
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {sd:.3f}"


def summarize(build, seeds):
    runs_dir = os.path.join(build, "w4p-runs")
    res = {impl: [parse_run(os.path.join(runs_dir, f"{impl}-{s}")) for s in seeds] for impl in ("cf", "torch")}
    ok = {impl: [r for r, _ in res[impl] if "error" not in r] for impl in res}
    p = PARITY
    print(f"W4 parity recipe ({p['max_per_topic']} quotations a topic, emb {p['emb_sz']}, n_hid {p['n_hid']}, "
          f"{p['n_layers']} layers, bs {p['bs']}, LM {p['lm_epochs']} epochs, classifier 1+1+1+{p['clas_epochs']}), "
          f"1 thread a run, seeds {', '.join(map(str, seeds))}")
    print()
    print("| side | seed | LM valid loss | perplexity | LM accuracy | classifier valid loss | classifier accuracy "
          "| CPU s | peak RSS MB |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for impl, name in (("cf", "corefit"), ("torch", "PyTorch")):
        for s, (r, _) in zip(seeds, res[impl]):
            if "error" in r:
                print(f"| {name} | {s} | {r['error']} | | | | | | |")
                continue
            print(f"| {name} | {s} | {r['lm_valid_loss']:.4f} | {r['perplexity']:.1f} | {r['lm_accuracy']:.4f} "
                  f"| {r['clas_valid_loss']:.4f} | {r['clas_accuracy']:.4f} | {r.get('cpu_s', 0):.0f} "
                  f"| {r.get('peak_rss_mb', 0):.0f} |")
    print()
    print("| mean ± sd over seeds | corefit | PyTorch |")
    print("|---|--:|--:|")
    for key, label in (("perplexity", "LM perplexity"), ("lm_valid_loss", "LM valid loss"),
                       ("lm_accuracy", "LM accuracy"), ("clas_accuracy", "classifier accuracy"),
                       ("clas_valid_loss", "classifier valid loss"), ("cpu_s", "CPU-seconds")):
        print(f"| {label} | {mean_sd([r[key] for r in ok['cf'] if key in r])} | "
              f"{mean_sd([r[key] for r in ok['torch'] if key in r])} |")
    uni = [r["unigram_perplexity"] for r in ok["torch"] if "unigram_perplexity" in r]
    if uni:
        print(f"| unigram perplexity (train frequencies, add-one) | {uni[0]:.1f} | {uni[0]:.1f} |")
        print(f"| chance accuracy | {1 / 6:.3f} | {1 / 6:.3f} |")
    print()
    print("Epoch rows (train_loss smoothed as fastai's, valid_loss, accuracy), mean over seeds; each seed's "
          "valid_loss:")
    print()
    print("| fit row | corefit train / valid / acc | PyTorch train / valid / acc | corefit valid each | PyTorch valid each |")
    print("|---|--:|--:|--:|--:|")
    n = max((len(rows) for impl in res for _, rows in res[impl]), default=0)
    names = [f"LM {e + 1}" for e in range(p["lm_epochs"])] + ["frozen", "freeze_to(-2)", "freeze_to(-3)"] + \
            [f"unfrozen {e + 1}" for e in range(p["clas_epochs"])]
    for k in range(n):
        cells = []
        for impl in ("cf", "torch"):
            vals = [rows[k] for _, rows in res[impl] if len(rows) > k]
            cell = " / ".join(f"{statistics.mean(v[j] for v in vals):.3f}" for j in range(3)) if vals else "—"
            cells.append(cell + (f" ({len(vals)} seeds)" if vals and len(vals) < len(seeds) else ""))
        each = [" ".join(f"{rows[k][1]:.3f}" if len(rows) > k else "—" for _, rows in res[impl]) for impl in ("cf", "torch")]
        print(f"| {names[k] if k < len(names) else k} | {cells[0]} | {cells[1]} | {each[0]} | {each[1]} |")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each 1 thread)")
    ap.add_argument("--summarize", action="store_true", help="only the table of the runs in BUILD/w4p-runs")
    ap.add_argument("--lm-epochs", type=int, default=PARITY["lm_epochs"],
                    help="the language model's epochs (the recipe's one-cycle spans them)")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="PyTorch's threads a run (accuracy does not depend on them; on a machine "
                         "with many cores, 2 shorten its runs to corefit's length)")
    a = ap.parse_args()
    PARITY["lm_epochs"] = a.lm_epochs
    build = os.path.abspath(a.build)
    seeds = [int(x) for x in a.seeds.split(",") if x]
    if a.summarize:
        summarize(build, seeds)
    else:
        run_all(build, seeds, a.jobs, a.torch_threads)


if __name__ == "__main__":
    main()
