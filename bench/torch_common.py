"""The harness the PyTorch side of the benchmarks shares (w1_torch.py, vgg_torch.py,
images_torch.py, unet_torch.py): the command line's modes, the thread settings made before torch
is imported, one process or DDP ranks forked over gloo, the timing that leaves out the first
steps, CPU time and memory from the kernel, and the JSON line.

A script's main(), with torch not imported yet:
    args = mode_parser(...) plus its own options, parsed
    fit = run(args, train)         # sets the threads, then train(rank, world, args, result_q=None)
    print_json(fit, args, mflop, measured, ...)

and its train() calls start_rank() first, timed() on the steps' stamps, finish_rank() last.
"""
import argparse
import functools
import json
import math
import os
import resource
import sys


def mode_parser(doc, bs, data, port, batches_help="train this many batches (per process) and stop",
                epochs_help=None):
    """The options every script takes: --threads N | --ddp N, --batches, --epochs, --bs, --seed,
    --data, --skip and --port (the script adds its own)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--threads", type=int, default=1, help="one process with N threads")
    g.add_argument("--ddp", type=int, default=0, help="N processes, DDP over gloo")
    ap.add_argument("--batches", type=int, default=0, help=batches_help)
    ap.add_argument("--epochs", type=int, default=1, help=epochs_help)
    ap.add_argument("--bs", type=int, default=bs)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data", default=data)
    ap.add_argument("--skip", type=int, default=5, help="batches excluded from the timing")
    ap.add_argument("--port", type=int, default=port)
    return ap


def set_threads(args):
    """(world, threads per process) of the mode; sets OMP_NUM_THREADS to the threads and
    OPENBLAS_NUM_THREADS to 1 (MKL_NUM_THREADS unless set), which must come before torch is
    imported to take effect. OPENBLAS_CORETYPE is passed through."""
    world = args.ddp if args.ddp else 1
    nthreads = 1 if world > 1 else args.threads
    os.environ["OMP_NUM_THREADS"] = str(nthreads)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ.setdefault("MKL_NUM_THREADS", str(nthreads))
    return world, nthreads


def combined_cos(pct, start, middle, end):
    """fastai's combined_cos: cosine from start to middle over [0, pct), then to end."""
    def cos(a, b, p):
        return a + (1 + math.cos(math.pi * (1 - p))) * (b - a) / 2

    def f(p):
        if p < pct:
            return cos(start, middle, p / pct)
        return cos(middle, end, (p - pct) / (1 - pct))

    return f


def cpu_s():
    """This process's CPU seconds, user and system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pss_mb():
    """This process's proportional set size now, in MiB (0 where /proc has none)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def peak_rss_mb():
    """Peak RSS of this process plus its waited-for children, in MiB (ru_maxrss is KiB)."""
    s = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return s / 1024.0, c / 1024.0


def start_rank(rank, world, args):
    """A rank's (or the one process's) start: its intra-op threads, the gloo process group on
    127.0.0.1:args.port where world > 1, and torch's seed (the same initial weights on every
    rank; DDP broadcasts rank 0's anyway)."""
    import torch

    torch.set_num_threads(1 if world > 1 else args.threads)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    torch.manual_seed(args.seed)


def timed(stamps, cpus, skip):
    """The timed window of a fit from the wall-clock stamps and CPU seconds taken at the end of
    each step: from the end of step `skip` (at most all but one) to the end of the last."""
    skip = min(skip, len(stamps) - 1)
    return {
        "steps": len(stamps),
        "timed_steps": len(stamps) - skip,
        "span_s": stamps[-1] - stamps[skip - 1],
        "cpu_s": cpus[-1] - cpus[skip - 1],
    }


def finish_rank(world, out, result_q, rss_extra_mb=None):
    """A rank's end: leaves the process group (after a barrier); a forked rank adds its peak RSS
    (plus rss_extra_mb, its children's) to out as rss_mb and sends out to the parent."""
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if result_q is not None:
        rss = peak_rss_mb()[0]
        out["rss_mb"] = rss if rss_extra_mb is None else rss + rss_extra_mb
        result_q.put(out)
    return out


def rank_main(train, rank, world, args, q):
    """A forked rank: one thread, train(rank, world, args, q), any failure reported on q (so the
    parent does not wait for a result that never comes). run_ddp's worker, through
    functools.partial(rank_main, train)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        train(rank, world, args, q)
    except BaseException as e:  # report, don't hang the parent
        q.put({"rank": rank, "error": repr(e)})
        raise


def run_ddp(worker, world, args):
    """Forks `world` processes running worker(rank, world, args, queue) and returns their results
    in rank order; prints the errors and exits if any rank failed."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(i, world, args, q)) for i in range(world)]
    for p in procs:
        p.start()
    ranks = [q.get() for _ in range(world)]
    for p in procs:
        p.join()
    errs = [x for x in ranks if "error" in x]
    if errs:
        print(json.dumps({"impl": "torch", "error": errs}))
        sys.exit(1)
    return sorted(ranks, key=lambda x: x["rank"])


def run(args, train, rss_kids_key=None):
    """Runs train(rank, world, args, result_q) in this process (--threads) or on --ddp forked
    ranks and returns the fit: world, threads, the ranks' results, and the memory of all the
    processes: peak_rss_mb, the sum of each process's own peak (an upper bound on the
    simultaneous total), and pss_mb at the end of training. One process adds its result's
    rss_kids_key (its children's peak) where given; a rank adds its own in finish_rank."""
    world, nthreads = set_threads(args)
    if world == 1:
        r = train(0, 1, args)
        rss = peak_rss_mb()[0]
        if rss_kids_key is not None:
            rss += r[rss_kids_key]
        ranks, pss = [r], r["pss_mb"]
    else:
        ranks = run_ddp(functools.partial(rank_main, train), world, args)
        rss = peak_rss_mb()[0] + sum(x["rss_mb"] for x in ranks)
        pss = pss_mb() + sum(x["pss_mb"] for x in ranks)
    return {"world": world, "threads": nthreads, "ranks": ranks, "peak_rss_mb": rss, "pss_mb": pss}


def print_json(fit, args, mflop, measured, after_threads=None, after_acc=None, last=None):
    """The JSON line of a fit (bench/README.md lists the fields): images per second over the
    slowest rank's timed window, CPU seconds of all ranks, the memory, rank 0's accuracy and
    loss; the script's own fields go after "threads", after "test_acc" and last."""
    import torch

    world, ranks = fit["world"], fit["ranks"]
    r = ranks[0]
    span = max(x["span_s"] for x in ranks)
    imgs = r["timed_steps"] * args.bs * world
    ips = imgs / span if span > 0 else 0.0
    cpu_total = sum(x["cpu_s"] for x in ranks)
    line = {
        "impl": "torch",
        "torch": torch.__version__,
        "mode": "ddp" if world > 1 else "threads",
        "procs": world,
        "threads": fit["threads"],
    }
    line.update(after_threads or {})
    line.update({
        "bs": args.bs,
        "steps": r["steps"],
        "timed_steps": r["timed_steps"],
        "images_per_s": ips,
        "measured": f"wall time from the end of training step {args.skip} to the end of the last step"
        f" (slowest rank), {args.bs}*{world} images per step{measured}",
        "gflops": ips * mflop / 1e3,
        "mflop_per_image": mflop,
        "test_acc": r["acc"],
    })
    line.update(after_acc or {})
    line.update({
        "cpu_s": cpu_total,
        "images_per_cpu_s": imgs / cpu_total if cpu_total > 0 else 0.0,
        "final_loss": r["final_loss"],
        "train_s": r["train_s"],
        "peak_rss_mb": fit["peak_rss_mb"],
        "pss_mb": fit["pss_mb"],
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
    })
    line.update(last or {})
    print(json.dumps(line), flush=True)
