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
(bench/run.py sets it to the kernel set corefit selects). The harness (modes, DDP, timing,
memory, the JSON line) is bench/torch_common.py, shared with vgg_torch.py, images_torch.py and
unet_torch.py.
"""
import gzip
import math
import os
import time

import torch_common
# the harness's pieces, also used from here by w4_torch.py and tasks_torch.py
from torch_common import combined_cos, cpu_s, peak_rss_mb, pss_mb, run_ddp  # noqa: F401

MEAN, STD = 0.2860, 0.3530
DATA = "/usr/share/datasets/fashion-mnist"


def parse_args(workload):
    ap = torch_common.mode_parser(workload["doc"], 64, DATA, 29517, epochs_help="epochs of the one-cycle schedule")
    ap.add_argument("--lr", type=float, default=workload["lr"])
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


def train(rank, world, args, result_q=None):
    import numpy as np
    import torch
    from torch import nn

    torch_common.start_rank(rank, world, args)
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
    out = {
        "rank": rank,
        **torch_common.timed(stamps, cpus, args.skip),
        "pss_mb": pss_end,
        "train_s": t_train_end - t_fit,
        "acc": acc,
        "final_loss": float(loss.item()),
    }
    return torch_common.finish_rank(world, out, result_q)


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


def main(workload=None):
    """Runs a workload (a dict as W1 below; default W1) and prints its JSON line."""
    args = parse_args(workload or W1)
    fit = torch_common.run(args, train)
    torch_common.print_json(fit, args, args.workload["mflop_per_image"](), "; includes batch assembly",
                            last={"bf16": bool(args.bf16)})


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
