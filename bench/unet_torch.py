#!/usr/bin/python3
"""W5 (unet_learner on a resnet18 body over Fashion-MNIST segmentation scenes) in PyTorch, the
reference side of bench_unet.
The same data, model and recipe as corefit's bench/bench_unet.c:
  DIR/images/*.png and their masks DIR/labels/<stem>_P.png with DIR/codes.txt (`corefit
  fmnist-tasks segmentation DIR --n 1000 --size 64`), decoded up front by PIL as RGB (fastai's
  PILImage), 20% of the scenes held out at random (seed), ImageNet's normalisation, no
  augmentation;
  fastai's DynamicUnet(create_body(resnet18), n_out=len(codes), (64, 64)) with its defaults, the
  module written out from fastai in tests/oracle/unet.py (the one tests/test_unet.c checks
  corefit's against), torchvision's initialisation in the body and fastai's in the decoder;
  CrossEntropyLossFlat(axis=1) (nn.CrossEntropyLoss over (N, C, H, W) against (N, H, W));
  fastai's Adam = AdamW(betas (mom, 0.99), eps 1e-5, weight_decay 0.01), none on BatchNorm
  parameters and biases (wd_bn_bias False); fit_one_cycle(lr_max 1e-3, pct_start 0.25, div 25,
  div_final 1e5, moms 0.95/0.85/0.95), the schedule set before every step; bs 16 per process,
  shuffled, drop_last.
Modes (as w1_torch.py):
  unet_torch.py --threads N [--batches B | --epochs E]   one process, N intra-op threads
  unet_torch.py --ddp N     [--batches B | --epochs E]   N processes, DDP (gloo), 1 thread each
--epochs E reports fastai's DiceMulti over the held-out scenes in test_acc.
Prints one JSON line (see bench/README.md for the fields).
"""
import math
import os
import sys
import time

import torch_common

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))

SIZE = 64
LR_MAX = 1e-3
MOMS = (0.95, 0.85, 0.95)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def parse_args():
    return torch_common.mode_parser(__doc__, 16, os.path.join(HERE, "..", "build", "w5-seg"), 29519).parse_args()


def load_scenes(data, seed):
    """(x_train, y_train, x_valid, y_valid, n_codes): images as float (N, 3, H, W) in [0, 1],
    masks as int64 (N, H, W)."""
    import numpy as np
    import torch
    from PIL import Image

    with open(os.path.join(data, "codes.txt")) as f:
        codes = [line.strip() for line in f if line.strip()]
    names = sorted(n for n in os.listdir(os.path.join(data, "images")) if n.endswith(".png"))
    xs, ys = [], []
    for n in names:
        img = Image.open(os.path.join(data, "images", n)).convert("RGB")
        stem, ext = os.path.splitext(n)
        mask = Image.open(os.path.join(data, "labels", f"{stem}_P{ext}"))
        xs.append(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1))
        ys.append(np.asarray(mask, dtype=np.uint8))
    x = torch.from_numpy(np.stack(xs)).float() / 255.0
    y = torch.from_numpy(np.stack(ys).astype(np.int64))
    perm = np.random.default_rng(seed).permutation(len(names))
    n_valid = int(0.2 * len(names))
    vi, ti = torch.from_numpy(perm[:n_valid]), torch.from_numpy(perm[n_valid:])
    return x[ti], y[ti], x[vi], y[vi], len(codes)


def build_model(n_out):
    import torch
    import torchvision
    from torch import nn
    from unet import DynamicUnet

    body = nn.Sequential(*list(torchvision.models.resnet18(weights=None).children())[:-2])
    model = DynamicUnet(body, n_out, (SIZE, SIZE))
    no_wd = {id(p) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for p in m.parameters()}
    no_wd |= {id(m.bias) for m in model.modules() if isinstance(m, nn.Conv2d) and m.bias is not None}
    params = list(model.parameters())
    groups = [{"params": [p for p in params if id(p) not in no_wd], "weight_decay": 0.01},
              {"params": [p for p in params if id(p) in no_wd], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR_MAX / 25, betas=(MOMS[0], 0.99), eps=1e-5)
    return model, opt


def conv_flop(ci, co, k, side):
    return 2 * ci * co * k * k * side * side


def train_mflop_per_image(n_out=11):
    """The count of bench_unet.c's w5_train_flop_per_image: every convolution forward (2 FLOPs per
    multiply-add), times 3, less the stem's input gradient."""
    s, n_in = SIZE, 3
    stem = conv_flop(n_in, 64, 7, s // 2)
    fwd = stem
    side, ci = s // 4, 64
    for stage in range(4):
        c = 64 << stage
        for block in range(2):
            down = stage > 0 and block == 0
            out = side // 2 if down else side
            fwd += conv_flop(ci, c, 3, out) + conv_flop(c, c, 3, out) + (conv_flop(ci, c, 1, out) if down else 0)
            side, ci = out, c
    fwd += conv_flop(512, 1024, 3, side) + conv_flop(1024, 512, 3, side)
    c = 512
    for k, skip_c in enumerate((256, 128, 64, 64)):
        fwd += conv_flop(c, c // 2 * 4, 1, side)
        side *= 2
        ni = c // 2 + skip_c
        nf = ni if k < 3 else ni // 2
        fwd += conv_flop(ni, nf, 3, side) + conv_flop(nf, nf, 3, side)
        c = nf
    fwd += conv_flop(c, 4 * c, 1, side)
    side *= 2
    c += n_in
    fwd += 2 * conv_flop(c, c, 3, side) + conv_flop(c, n_out, 1, side)
    return (3 * fwd - stem) / 1e6


def dice_multi(model, x, y, n_codes, mean, std):
    """fastai's DiceMulti over the held-out scenes: per class (background included) 2 * inter /
    (pred + target pixels), summed over the set, averaged over the classes present."""
    import torch

    inter = torch.zeros(n_codes, dtype=torch.float64)
    union = torch.zeros(n_codes, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for i in range(0, len(x), 32):
            pred = model((x[i:i + 32] - mean) / std).argmax(1)
            t = y[i:i + 32]
            for c in range(n_codes):
                p, q = pred == c, t == c
                inter[c] += float((p & q).sum())
                union[c] += float(p.sum() + q.sum())
    present = union > 0
    return float((2 * inter[present] / union[present]).mean())


def train(rank, world, args, result_q=None):
    import torch
    from torch import nn

    torch_common.start_rank(rank, world, args)
    xt, yt, xv, yv, n_codes = load_scenes(args.data, args.seed)
    ds = torch.utils.data.TensorDataset(xt, yt)
    if world > 1:
        sampler = torch.utils.data.distributed.DistributedSampler(ds, world, rank, shuffle=True, seed=args.seed)
    else:
        sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(args.seed))
    loader = torch.utils.data.DataLoader(ds, batch_size=args.bs, sampler=sampler, drop_last=True)
    n_iter = len(loader)
    if n_iter < 1:
        raise SystemExit(f"unet_torch.py: {len(ds)} scenes are under one batch of {args.bs} per process")
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    model, opt = build_model(n_codes)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    loss_fn = nn.CrossEntropyLoss()
    n_epoch = max(args.epochs, math.ceil(args.batches / n_iter)) if args.batches else args.epochs
    total = n_epoch * n_iter
    stop = args.batches if args.batches else total
    lr_f = torch_common.combined_cos(0.25, LR_MAX / 25, LR_MAX, LR_MAX / 25 / 1e5)
    mom_f = torch_common.combined_cos(0.25, *MOMS)
    stamps, cpus = [], []
    t_fit = time.perf_counter()
    it = 0
    loss = None
    for epoch in range(n_epoch):
        if it >= stop:
            break
        if world > 1:
            sampler.set_epoch(epoch)
        net.train()
        for xb, yb in loader:
            if it >= stop:
                break
            xb = (xb - mean) / std
            pct = it / total
            for grp in opt.param_groups:
                grp["lr"] = lr_f(pct)
                grp["betas"] = (mom_f(pct), 0.99)
            loss = loss_fn(net(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            it += 1
            stamps.append(time.perf_counter())
            cpus.append(torch_common.cpu_s())
    t_train_end = time.perf_counter()
    pss_end = torch_common.pss_mb()
    acc = None
    if not args.batches:
        acc = dice_multi(model, xv, yv, n_codes, mean, std)
    out = {
        "rank": rank,
        **torch_common.timed(stamps, cpus, args.skip),
        "pss_mb": pss_end,
        "train_s": t_train_end - t_fit,
        "acc": acc,
        "final_loss": float(loss.item()),
        "n_train": len(xt),
        "n_valid": len(xv),
    }
    return torch_common.finish_rank(world, out, result_q)


def main():
    args = parse_args()
    if not os.path.isfile(os.path.join(args.data, "codes.txt")):
        sys.exit(f"unet_torch.py: no {args.data}/codes.txt; make the scenes with "
                 f"corefit fmnist-tasks segmentation {args.data} --n 1000 --size {SIZE}")
    fit = torch_common.run(args, train)
    r = fit["ranks"][0]
    torch_common.print_json(fit, args, train_mflop_per_image(), "",
                            after_acc={"acc_set": "valid", "metric": "dice_multi", "n_train": r["n_train"],
                                       "n_valid": r["n_valid"]})


if __name__ == "__main__":
    main()
