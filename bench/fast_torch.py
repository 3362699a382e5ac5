#!/usr/bin/python3
"""corefit train --recipe fast in PyTorch: the same model (fast-cnn), data, normalisation and
recipe, for bench/time_to_accuracy.py.

Model (src/nn/fast_cnn.c): three groups Conv2d(3x3, pad 1, no bias), MaxPool2d(2), BatchNorm2d,
ReLU of 24, 48 and 96 channels (28 -> 14 -> 7 -> 3 px), then fastai's
create_head(96, 10, lin_ftrs=[], ps=0): AdaptiveConcatPool2d, Flatten, BatchNorm1d(192),
Linear(192, 10, bias=False); PyTorch's default init for the body, fastai's for the head.
Training as w1_torch.py (fastai's Adam, fit_one_cycle, bs per process, drop_last), with
--flip: each training image mirrored left to right with probability 0.5, --small-epochs K: the
first K epochs on the training images at half size (avg_pool2d(x, 2), corefit train
--small-epochs), and --tta: the test accuracy with every image predicted plain and mirrored, the
probabilities averaged (corefit train --tta).

  fast_torch.py --ddp N | --threads N  --epochs E --bs B --lr X [--label-smoothing EPS]
                [--flip] [--tta] [--small-epochs K] [--bf16] [--seed S] [--save FILE]

Prints one JSON line: test_acc (with --tta, the flip-TTA accuracy), test_acc_plain, train_s,
cpu_s.
"""
import functools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_common  # noqa: E402  (threads before torch, DDP ranks)
import w1_torch  # noqa: E402  (the shared loop helpers: data, schedule, optimizer)


def build_model():
    import torch
    from torch import nn

    class ConcatPool(nn.Module):
        def forward(self, x):
            return torch.cat([nn.functional.adaptive_max_pool2d(x, 1), nn.functional.adaptive_avg_pool2d(x, 1)], 1)

    layers, ni = [], 1
    for nf in (24, 48, 96):
        layers.append(nn.Sequential(nn.Conv2d(ni, nf, 3, 1, 1, bias=False), nn.MaxPool2d(2),
                                    nn.BatchNorm2d(nf), nn.ReLU()))
        ni = nf
    body = nn.Sequential(*layers)
    head = nn.Sequential(ConcatPool(), nn.Flatten(), nn.BatchNorm1d(192), nn.Linear(192, 10, bias=False))
    nn.init.kaiming_normal_(head[3].weight)  # fastai: apply_init(head, kaiming_normal_)
    nn.init.ones_(head[2].weight)  # fastai's BatchNorm(): weight 1, bias 1e-3
    nn.init.constant_(head[2].bias, 1e-3)
    return nn.Sequential(body, head)


def train(rank, world, args, q=None):
    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(1 if world > 1 else args.threads)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    xtr, ytr = w1_torch.load(args.data, "train")
    if args.limit:
        xtr, ytr = xtr[: args.limit], ytr[: args.limit]
    model = build_model()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = w1_torch.w1_optimizer(model, args.lr)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    n_local = len(xtr) // world
    n_iter = n_local // args.bs
    total = args.epochs * n_iter
    lr_f = w1_torch.combined_cos(0.25, args.lr / 25, args.lr, args.lr / 1e5)
    mom_f = w1_torch.combined_cos(0.25, 0.95, 0.85, 0.95)
    g = np.random.default_rng(args.seed)
    t0, c0 = time.perf_counter(), w1_torch.cpu_s()
    it = 0
    for epoch in range(args.epochs):
        model.train()
        perm = g.permutation(len(xtr))[rank::world][:n_local]
        for b in range(n_iter):
            idx = perm[b * args.bs : (b + 1) * args.bs]
            xb = torch.from_numpy(xtr[idx])
            if args.flip:
                m = torch.from_numpy(g.random(len(idx)) < 0.5).view(-1, 1, 1, 1)
                xb = torch.where(m, xb.flip(3), xb)
            if epoch < args.small_epochs:  # progressive resizing: 2x2 averages, half size
                xb = nn.functional.avg_pool2d(xb, 2)
            yb = torch.from_numpy(ytr[idx])
            pct = it / total
            for grp in opt.param_groups:
                grp["lr"] = lr_f(pct)
                w1_torch.w1_set_mom(grp, mom_f(pct))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = loss_fn(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            it += 1
    train_s, cpu = time.perf_counter() - t0, w1_torch.cpu_s() - c0
    out = {"rank": rank, "train_s": train_s, "cpu_s": cpu, "final_loss": float(loss.item())}
    if rank == 0:
        out["acc"], out["acc_plain"] = evaluate(model, args)
        if args.save:
            torch.save((model.module if hasattr(model, "module") else model).state_dict(), args.save)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if q is not None:
        q.put(out)
    return out


def evaluate(model, args):
    import torch

    xte, yte = w1_torch.load(args.data, "test")
    if args.limit:
        xte, yte = xte[: args.limit // 5], yte[: args.limit // 5]
    net = model.module if hasattr(model, "module") else model
    net.eval()
    right = right_plain = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        for i in range(0, len(xte), 256):
            xb = torch.from_numpy(xte[i : i + 256])
            p = net(xb).float().softmax(1)
            y = torch.from_numpy(yte[i : i + 256])
            right_plain += int((p.argmax(1) == y).sum())
            if args.tta:
                p = p + net(xb.flip(3)).float().softmax(1)
            right += int((p.argmax(1) == y).sum())
    return right / len(xte), right_plain / len(xte)


def main():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--ddp", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--flip", action="store_true")
    ap.add_argument("--tta", action="store_true")
    ap.add_argument("--small-epochs", type=int, default=0,
                    help="the first K epochs on the training images at half size (2x2 averages)")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data", default=w1_torch.DATA)
    ap.add_argument("--port", type=int, default=29519)
    ap.add_argument("--save", default="")
    ap.add_argument("--limit", type=int, default=0, help="the first N training and N/5 test images (a quick check)")
    args = ap.parse_args()
    world, nthreads = torch_common.set_threads(args)
    import torch

    if world == 1:
        ranks = [train(0, 1, args)]
    else:
        ranks = torch_common.run_ddp(functools.partial(torch_common.rank_main, train), world, args)
    r = ranks[0]
    print(json.dumps({"impl": "torch", "torch": torch.__version__, "model": "fast-cnn", "procs": world,
                      "threads": nthreads, "bs": args.bs, "epochs": args.epochs, "test_acc": r["acc"],
                      "test_acc_plain": r["acc_plain"], "tta": args.tta, "train_s": r["train_s"],
                      "cpu_s": sum(x["cpu_s"] for x in ranks), "final_loss": r["final_loss"],
                      "bf16": bool(args.bf16)}), flush=True)


if __name__ == "__main__":
    main()
