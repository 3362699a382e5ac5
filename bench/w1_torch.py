#!/usr/bin/python3
"""W1 (mini-resnet on Fashion-MNIST) in PyTorch, the reference side of `make bench`.

The same model, data, normalisation and recipe as corefit's bench_w1:
  fastai's Adam = AdamW(betas 0.9/0.99, eps 1e-5, weight_decay 0.01), no weight decay on
  BatchNorm parameters (fastai wd_bn_bias=False; the model has no other biases);
  fit_one_cycle(lr_max 3e-3, div 25, div_final 1e5, pct_start 0.25, moms 0.95/0.85/0.95), the
  schedule set before every training batch at pct = iteration / total iterations;
  batch 64 per process, shuffled, drop_last; PyTorch default init except the head's Linear layers
  (kaiming_normal_) and the head's BatchNorm1d (weight 1, bias 1e-3), as fastai's create_head.

Modes:
  w1_torch.py --threads N [--batches B | --epochs E]   one process, N intra-op threads
  w1_torch.py --ddp N     [--batches B | --epochs E]   N processes, DistributedDataParallel (gloo),
                                                        each with 1 thread and bs 64
  --bf16                                                torch.autocast("cpu", torch.bfloat16)
Prints one JSON line (see bench/README.md for the fields).

Thread settings give PyTorch its best configuration: OMP_NUM_THREADS=N and OPENBLAS_NUM_THREADS=1 are set
before torch is imported, then torch.set_num_threads(N). OPENBLAS_CORETYPE is passed through
(bench/run.py sets it to the kernel set corefit selects).
"""
import argparse
import gzip
import json
import math
import os
import resource
import sys
import time

MEAN, STD = 0.2860, 0.3530
DATA = "/usr/share/datasets/fashion-mnist"


def parse_args(workload):
    ap = argparse.ArgumentParser(description=workload["doc"], formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--threads", type=int, default=1, help="one process with N threads")
    g.add_argument("--ddp", type=int, default=0, help="N processes, DDP over gloo")
    ap.add_argument("--batches", type=int, default=0, help="train this many batches (per process) and stop")
    ap.add_argument("--epochs", type=int, default=1, help="epochs of the one-cycle schedule")
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--lr", type=float, default=workload["lr"])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--skip", type=int, default=5, help="batches excluded from the timing")
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--label-smoothing", type=float, default=0.0,
                    help="CrossEntropyLoss(label_smoothing=EPS), as fastai's LabelSmoothingCrossEntropy")
    ap.add_argument("--save", default="", help="after the fit, rank 0 writes the model's state_dict here")
    ap.add_argument("--bf16", action="store_true",
                    help="CPU autocast to torch.bfloat16 around the forward pass and loss (training and evaluation)")
    args = ap.parse_args()
    args.workload = workload
    return args


def read_idx(path):
    import numpy as np

    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data, split):
    import numpy as np

    pre = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data, f"{pre}-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    x = ((x - MEAN) / STD).reshape(-1, 1, 28, 28)
    y = read_idx(os.path.join(data, f"{pre}-labels-idx1-ubyte.gz")).astype(np.int64)
    return np.ascontiguousarray(x), y


def build_model():
    import torch
    from torch import nn

    def block(ni, nf):
        return Res(
            nn.Sequential(
                nn.Conv2d(ni, nf, 3, 2, 1, bias=False), nn.BatchNorm2d(nf), nn.ReLU(),
                nn.Conv2d(nf, nf, 3, 1, 1, bias=False), nn.BatchNorm2d(nf),
            ),
            nn.Sequential(nn.Conv2d(ni, nf, 1, 2, 0, bias=False), nn.BatchNorm2d(nf)),
        )

    class Res(nn.Module):
        def __init__(self, conv, idp):
            super().__init__()
            self.convs, self.idpath = conv, idp

        def forward(self, x):
            return torch.relu(self.convs(x) + self.idpath(x))

    class ConcatPool(nn.Module):
        def forward(self, x):
            return torch.cat([nn.functional.adaptive_max_pool2d(x, 1), nn.functional.adaptive_avg_pool2d(x, 1)], 1)

    body = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), block(16, 32), block(32, 64))
    head = nn.Sequential(
        ConcatPool(), nn.Flatten(),
        nn.BatchNorm1d(128), nn.Dropout(0.25), nn.Linear(128, 256, bias=False), nn.ReLU(),
        nn.BatchNorm1d(256), nn.Dropout(0.5), nn.Linear(256, 10, bias=False),
    )
    for m in head.modules():  # fastai: apply_init(head, kaiming_normal_) and BatchNorm(): w 1, b 1e-3
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight)
        elif isinstance(m, nn.BatchNorm1d):
            nn.init.ones_(m.weight)
            nn.init.constant_(m.bias, 1e-3)
    return nn.Sequential(body, head)


def combined_cos(pct, start, middle, end):
    def cos(a, b, p):
        return a + (1 + math.cos(math.pi * (1 - p))) * (b - a) / 2

    def f(p):
        if p < pct:
            return cos(start, middle, p / pct)
        return cos(middle, end, (p - pct) / (1 - pct))

    return f


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pss_mb():
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


def train(rank, world, args, result_q=None):
    import numpy as np
    import torch
    from torch import nn

    nthreads = 1 if world > 1 else args.threads
    torch.set_num_threads(nthreads)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    xtr, ytr = load(args.data, "train")
    wl = args.workload
    model = wl["build_model"]()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = wl["optimizer"](model, args.lr)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    n_local = len(xtr) // world  # DistributedSampler-like shard, same size on every rank
    n_iter = n_local // args.bs
    n_epoch = args.epochs
    total = n_epoch * n_iter
    if args.batches:  # a timing run: stop after this many steps, no evaluation
        total = args.batches
        n_epoch = math.ceil(total / n_iter)
    # the schedule spans the whole fit (epochs * n_iter) even when stopped early by --batches
    sched_total = max(args.epochs * n_iter, total)
    lr_f = combined_cos(0.25, args.lr / 25, args.lr, args.lr / 1e5)
    mom_f = combined_cos(0.25, *wl["moms"])
    g = np.random.default_rng(args.seed)
    stamps = []  # end of each training step
    cpus = []  # this process's CPU seconds at the end of each step
    it = 0
    t_fit = time.perf_counter()
    for epoch in range(n_epoch):
        model.train()
        perm = g.permutation(len(xtr))[rank::world][:n_local]
        for b in range(n_iter):
            if it >= total:
                break
            idx = perm[b * args.bs : (b + 1) * args.bs]
            xb = torch.from_numpy(xtr[idx])
            yb = torch.from_numpy(ytr[idx])
            pct = it / sched_total
            for grp in opt.param_groups:
                grp["lr"] = lr_f(pct)
                wl["set_mom"](grp, mom_f(pct))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = loss_fn(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stamps.append(time.perf_counter())
            cpus.append(cpu_s())
            it += 1
    t_train_end = time.perf_counter()
    pss_end = pss_mb()
    acc = None
    if not args.batches:
        acc = evaluate(model, args)
    if args.save and rank == 0:
        torch.save((model.module if hasattr(model, "module") else model).state_dict(), args.save)
    skip = min(args.skip, len(stamps) - 1)
    span = stamps[-1] - stamps[skip - 1]
    cpu = cpus[-1] - cpus[skip - 1]
    steps = len(stamps) - skip
    out = {
        "rank": rank,
        "steps": len(stamps),
        "timed_steps": steps,
        "span_s": span,
        "cpu_s": cpu,
        "pss_mb": pss_end,
        "train_s": t_train_end - t_fit,
        "acc": acc,
        "final_loss": float(loss.item()),
    }
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if result_q is not None:
        out["rss_mb"] = peak_rss_mb()[0]
        result_q.put(out)
    return out


def evaluate(model, args):
    import torch

    xte, yte = load(args.data, "test")
    net = model.module if hasattr(model, "module") else model
    net.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        for i in range(0, len(xte), 128):
            pred = net(torch.from_numpy(xte[i : i + 128])).argmax(1)
            correct += int((pred.numpy() == yte[i : i + 128]).sum())
    return correct / len(xte)


def ddp_worker(rank, world, args, q):
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        train(rank, world, args, q)
    except Exception as e:  # report, don't hang the parent
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


def main(workload=None):
    """Runs a workload (a dict as W1 below; default W1) and prints its JSON line."""
    args = parse_args(workload or W1)
    world = args.ddp if args.ddp else 1
    nthreads = 1 if world > 1 else args.threads
    os.environ["OMP_NUM_THREADS"] = str(nthreads)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ.setdefault("MKL_NUM_THREADS", str(nthreads))
    import torch

    if world == 1:
        r = train(0, 1, args)
        rss_total = peak_rss_mb()[0]
        pss_total = r["pss_mb"]
        ranks = [r]
    else:
        ranks = run_ddp(ddp_worker, world, args)
        r = ranks[0]
        # sum of each process's own peak: an upper bound on the simultaneous total
        rss_total = peak_rss_mb()[0] + sum(x["rss_mb"] for x in ranks)
        pss_total = pss_mb() + sum(x["pss_mb"] for x in ranks)
    span = max(x["span_s"] for x in ranks)
    imgs = r["timed_steps"] * args.bs * world
    ips = imgs / span if span > 0 else 0.0
    cpu_total = sum(x["cpu_s"] for x in ranks)
    mflop = args.workload["mflop_per_image"]()
    print(
        json.dumps(
            {
                "impl": "torch",
                "torch": torch.__version__,
                "mode": "ddp" if world > 1 else "threads",
                "procs": world,
                "threads": nthreads,
                "bs": args.bs,
                "steps": r["steps"],
                "timed_steps": r["timed_steps"],
                "images_per_s": ips,
                "measured": f"wall time from the end of training step {args.skip} to the end of the last step"
                f" (slowest rank), {args.bs}*{world} images per step; includes batch assembly",
                "gflops": ips * mflop / 1e3,
                "mflop_per_image": mflop,
                "test_acc": r["acc"],
                "cpu_s": cpu_total,
                "images_per_cpu_s": imgs / cpu_total if cpu_total > 0 else 0.0,
                "final_loss": r["final_loss"],
                "train_s": r["train_s"],
                "peak_rss_mb": rss_total,
                "pss_mb": pss_total,
                "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
                "bf16": bool(args.bf16),
            }
        ),
        flush=True,
    )


def w1_train_mflop_per_image():
    """Exact multiply-add FLOPs (2 per MAC) of W1 per image: forward convs/linears, times 3 for a
    training step (forward, input gradient, weight gradient), minus the first conv's input
    gradient which is never computed. Elementwise ops (BN, ReLU, pool) are not counted."""
    convs = [  # (c_in, c_out, k, h_out, w_out)
        (1, 16, 3, 28, 28),
        (16, 32, 3, 14, 14), (32, 32, 3, 14, 14), (16, 32, 1, 14, 14),
        (32, 64, 3, 7, 7), (64, 64, 3, 7, 7), (32, 64, 1, 7, 7),
    ]
    fwd = [2 * ci * co * k * k * h * w for ci, co, k, h, w in convs] + [2 * 128 * 256, 2 * 256 * 10]
    return (3 * sum(fwd) - fwd[0]) / 1e6


def w1_optimizer(model, lr):
    """fastai's Adam: AdamW(0.9/0.99, eps 1e-5, wd 0.01), no weight decay on BatchNorm."""
    import torch
    from torch import nn

    bn_params = [p for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for p in m.parameters()]
    bn_ids = {id(p) for p in bn_params}
    other = [p for p in model.parameters() if id(p) not in bn_ids]
    return torch.optim.AdamW(
        [{"params": other, "weight_decay": 0.01}, {"params": bn_params, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.99), eps=1e-5,
    )


def w1_set_mom(group, mom):
    group["betas"] = (mom, 0.99)


# What the shared training loop needs from a workload: the default lr_max, the model, the
# optimizer for (model, lr), the one-cycle momentum (start, middle, end) and how to set it on a
# parameter group, and the FLOP count of a training step per image.
W1 = {
    "doc": __doc__,
    "lr": 3e-3,
    "build_model": build_model,
    "optimizer": w1_optimizer,
    "moms": (0.95, 0.85, 0.95),
    "set_mom": w1_set_mom,
    "mflop_per_image": w1_train_mflop_per_image,
}

if __name__ == "__main__":
    main()
