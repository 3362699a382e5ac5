#!/usr/bin/python3
"""W3 (fine_tune of a resnet18 on a folder of photos) in PyTorch, the reference side of
bench_images.

The same data, model and recipe as corefit's bench/bench_images.c:
  torchvision.datasets.ImageFolder over DIR/train and DIR/valid (bench/make_images.py), decoded
  by PIL in a DataLoader with --workers worker processes (persistent); fastai's item transform
  RandomResizedCrop(128, min_scale 0.5) as torchvision's RandomResizedCrop(128, scale (0.5, 1)),
  and for validation fastai's choice for it (squish to 152 x 152, centre crop 128);
  fastai's aug_transforms() (--aug batch, the default): ported to batch tensors as fastai runs
  them: flip p 0.5, rotation +-10 degrees, zoom 1-1.1 and perspective warp 0.2 (each p 0.75)
  composed into one grid, sampled once with grid_sample (bilinear, reflection padding, corners
  aligned), then brightness and contrast on the logits (each p 0.75); --aug item instead runs
  the nearest torchvision transforms per image in the workers (RandomHorizontalFlip, one
  RandomAffine for rotation and zoom, RandomPerspective, ColorJitter brightness 0.2 and contrast
  (0.8, 1.25), each but the flip with p 0.75; zero padding); then ImageNet's normalisation;
  torchvision's resnet18(weights=None) cut before its pooling (fastai's create_body, cut -2) and
  fastai's create_head(512, 10): AdaptiveConcatPool2d (max, avg), Flatten, BatchNorm1d(1024),
  Dropout(0.25), Linear(1024, 512, no bias), ReLU, BatchNorm1d(512), Dropout(0.5),
  Linear(512, 10, no bias); head Linear weights kaiming_normal_, its BatchNorm1d weight 1 and
  bias 1e-3; fastai's three parameter groups (body[:6], body[6:], head);
  fastai's Adam = AdamW(betas (mom, 0.99), eps 1e-5, weight_decay 0.01), none on BatchNorm
  parameters; fine_tune(E, base_lr 2e-3): freeze (body frozen but its BatchNorm layers, fastai's
  train_bn), fit_one_cycle(1, slice(2e-3), pct_start 0.99); unfreeze, fit_one_cycle(E,
  slice(1e-5, 1e-3), pct_start 0.3, div 5); moms 0.95/0.85/0.95; the optimizer state cleared at
  each freeze/unfreeze (a new optimizer), the schedule set before every step; bs 64 per process,
  shuffled, drop_last.

Modes (as w1_torch.py):
  images_torch.py --threads N [--batches B | --epochs E]   one process, N intra-op threads
  images_torch.py --ddp N     [--batches B | --epochs E]   N processes, DDP (gloo), 1 thread each
--batches B times B steps of the unfrozen phase alone (no frozen phase, no validation), as
bench_images; --epochs E runs the whole fine_tune and reports the validation accuracy.
--bf16 runs the forward pass and loss under torch.autocast("cpu", torch.bfloat16), in training
and evaluation (as w1_torch.py; bench_images --bf16 is corefit's cf_learner_to_bf16).

CPU time and memory count the DataLoader's worker processes too: their CPU seconds (from /proc)
in the timed window, their peak RSS (VmHWM) and PSS at the end of training.
Prints one JSON line (see bench/README.md for the fields).
"""
import math
import os
import sys
import time

import torch_common

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 128
MIN_SCALE = 0.5
BASE_LR = 2e-3
MOMS = (0.95, 0.85, 0.95)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# fastai's aug_transforms() defaults
MAX_ROTATE, MIN_ZOOM, MAX_ZOOM, MAX_LIGHTING, MAX_WARP, P_AFFINE, P_LIGHTING = 10.0, 1.0, 1.1, 0.2, 0.2, 0.75, 0.75


def parse_args():
    ap = torch_common.mode_parser(__doc__, 64, os.path.join(HERE, "..", "build", "w3-images"), 29517,
                                  batches_help="train this many batches (per process) of the unfrozen phase and stop",
                                  epochs_help="unfrozen epochs of fine_tune")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per training process "
                    "(bench/run.py measures 0 and 1)")
    ap.add_argument("--aug", choices=("batch", "item"), default="batch",
                    help="aug_transforms as fastai (batch tensors, main process) or torchvision per item (workers)")
    ap.add_argument("--bf16", action="store_true",
                    help="CPU autocast to torch.bfloat16 around the forward pass and loss (training and evaluation)")
    return ap.parse_args()


# ---- processes: CPU time and memory of this process and its DataLoader workers ---------------

def descendants(pid=None):
    pid = pid or os.getpid()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def proc_cpu_s(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def proc_status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def proc_pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def tree_cpu_s(kids):
    return torch_common.cpu_s() + sum(proc_cpu_s(k) for k in kids)


# ---- data ----------------------------------------------------------------------------------

class FastaiAffine:
    """--aug item: rotation and zoom as one torchvision affine, each drawn with p 0.75 as fastai's."""

    def __call__(self, img):
        import random

        import torchvision.transforms.functional as TF

        deg = random.uniform(-MAX_ROTATE, MAX_ROTATE) if random.random() < P_AFFINE else 0.0
        zoom = random.uniform(MIN_ZOOM, MAX_ZOOM) if random.random() < P_AFFINE else 1.0
        if deg == 0.0 and zoom == 1.0:
            return img
        return TF.affine(img, angle=deg, translate=[0, 0], scale=zoom, shear=[0.0],
                         interpolation=TF.InterpolationMode.BILINEAR)


def item_transforms(train, aug):
    import torchvision.transforms as T

    if not train:  # fastai's RandomResizedCrop in validation: squish to size + extra, centre crop
        xtra = math.ceil(SIZE * 0.14 / 8) * 8
        return T.Compose([T.Resize((SIZE + xtra, SIZE + xtra)), T.CenterCrop(SIZE), T.ToTensor()])
    tf = [T.RandomResizedCrop(SIZE, scale=(MIN_SCALE, 1.0), ratio=(3 / 4, 4 / 3))]
    if aug == "item":
        tf += [
            T.RandomHorizontalFlip(0.5),
            FastaiAffine(),
            T.RandomPerspective(distortion_scale=MAX_WARP, p=P_AFFINE),
            T.RandomApply([T.ColorJitter(brightness=MAX_LIGHTING)], p=P_LIGHTING),
            T.RandomApply([T.ColorJitter(contrast=(1 - MAX_LIGHTING, 1 / (1 - MAX_LIGHTING)))], p=P_LIGHTING),
        ]
    return T.Compose(tf + [T.ToTensor()])


def warp_coeffs(xt, yt):
    """fastai's find_coeffs for _WarpCoord: the perspective taking the corners to the moved ones."""
    import numpy as np

    p1 = [(-1, -1), (-1, 1), (1, -1), (1, 1)]
    p2 = [(-1 - yt, -1 - xt), (-1 + yt, 1 + xt), (1 + yt, -1 + xt), (1 - yt, 1 - xt)]
    a, b = [], []
    for (x1, y1), (X, Y) in zip(p1, p2):
        a.append([X, Y, 1, 0, 0, 0, -x1 * X, -x1 * Y])
        a.append([0, 0, 0, X, Y, 1, -y1 * X, -y1 * Y])
        b += [x1, y1]
    return np.linalg.solve(np.array(a, dtype=np.float64), np.array(b, dtype=np.float64))


def batch_aug(x, rng):
    """fastai's aug_transforms() on a batch (B, C, H, W) in [0, 1]: flip, rotate, zoom and warp
    composed into one grid and sampled once, then brightness and contrast on the logits."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    B, _, H, W = x.shape
    flip = np.where(rng.random(B) < 0.5, -1.0, 1.0)
    deg = np.where(rng.random(B) < P_AFFINE, rng.uniform(-MAX_ROTATE, MAX_ROTATE, B), 0.0)
    zoom = np.where(rng.random(B) < P_AFFINE, 1.0 / rng.uniform(MIN_ZOOM, MAX_ZOOM, B), 1.0)
    col, row = rng.random(B), rng.random(B)
    wx = np.where(rng.random(B) < P_AFFINE, rng.uniform(-MAX_WARP, MAX_WARP, B), 0.0)
    wy = np.where(rng.random(B) < P_AFFINE, rng.uniform(-MAX_WARP, MAX_WARP, B), 0.0)
    bright = np.where(rng.random(B) < P_LIGHTING, rng.uniform(0.5 * (1 - MAX_LIGHTING), 0.5 * (1 + MAX_LIGHTING), B), 0.5)
    lo = math.log(1 - MAX_LIGHTING)
    contrast = np.where(rng.random(B) < P_LIGHTING, np.exp(rng.uniform(lo, -lo, B)), 1.0)
    th = np.deg2rad(deg)
    m = np.zeros((B, 3, 3))
    m[:, 0, 0], m[:, 1, 1], m[:, 2, 2] = flip, 1.0, 1.0
    r = np.zeros((B, 3, 3))
    r[:, 0, 0], r[:, 0, 1], r[:, 1, 0], r[:, 1, 1], r[:, 2, 2] = np.cos(th), np.sin(th), -np.sin(th), np.cos(th), 1.0
    z = np.zeros((B, 3, 3))
    z[:, 0, 0], z[:, 1, 1], z[:, 2, 2] = zoom, zoom, 1.0
    z[:, 0, 2], z[:, 1, 2] = (1 - zoom) * (2 * col - 1), (1 - zoom) * (2 * row - 1)
    m = m @ r @ z
    m[:, 0, 1] *= H / W  # fastai's _prepare_mat
    m[:, 1, 0] *= W / H
    theta = torch.from_numpy(m[:, :2, :].astype(np.float32))
    grid = F.affine_grid(theta, list(x.shape), align_corners=True)
    warped = (wx != 0) | (wy != 0)
    if warped.any():
        k = np.zeros((B, 8))
        for i in np.flatnonzero(warped):
            k[i] = warp_coeffs(wx[i], wy[i])
        k = torch.from_numpy(k.astype(np.float32))[:, None, None, :]
        gx, gy = grid[..., 0], grid[..., 1]
        X = k[..., 0] * gx + k[..., 1] * gy + k[..., 2]
        Y = k[..., 3] * gx + k[..., 4] * gy + k[..., 5]
        Zd = k[..., 6] * gx + k[..., 7] * gy + 1.0
        sel = torch.from_numpy(warped)[:, None, None]
        grid = torch.where(sel[..., None], torch.stack([X / Zd, Y / Zd], -1), grid)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=True)
    b = torch.from_numpy(bright.astype(np.float32))[:, None, None, None]
    c = torch.from_numpy(contrast.astype(np.float32))[:, None, None, None]
    x = torch.logit(x.clamp(1e-7, 1 - 1e-7)) + torch.logit(b)
    return torch.sigmoid(x * c)


# ---- model and recipe ------------------------------------------------------------------------

def build_model():
    import torch
    import torchvision
    from torch import nn

    class AdaptiveConcatPool2d(nn.Module):
        def forward(self, x):
            return torch.cat([nn.functional.adaptive_max_pool2d(x, 1), nn.functional.adaptive_avg_pool2d(x, 1)], 1)

    body = nn.Sequential(*list(torchvision.models.resnet18(weights=None).children())[:-2])
    head = nn.Sequential(
        AdaptiveConcatPool2d(), nn.Flatten(),
        nn.BatchNorm1d(1024), nn.Dropout(0.25), nn.Linear(1024, 512, bias=False), nn.ReLU(inplace=True),
        nn.BatchNorm1d(512), nn.Dropout(0.5), nn.Linear(512, 10, bias=False),
    )
    for m in head.modules():  # fastai: apply_init(head, kaiming_normal_), BatchNorm(): w 1, b 1e-3
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight)
        elif isinstance(m, nn.BatchNorm1d):
            nn.init.ones_(m.weight)
            nn.init.constant_(m.bias, 1e-3)
    model = nn.Sequential(body, head)
    groups = [list(body[:6].parameters()), list(body[6:].parameters()), list(head.parameters())]
    bn_ids = {id(p) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for p in m.parameters()}
    return model, groups, bn_ids


def set_trainable(groups, bn_ids, frozen):
    """fastai's freeze (all but the last group, BatchNorm parameters still train) or unfreeze."""
    for gi, ps in enumerate(groups):
        for p in ps:
            p.requires_grad_(not frozen or gi == len(groups) - 1 or id(p) in bn_ids)


def optimizer(groups, bn_ids):
    """fastai's Adam per layer group: wd 0.01 on weights, none on BatchNorm parameters."""
    import torch

    pg = []
    for gi, ps in enumerate(groups):
        ps = [p for p in ps if p.requires_grad]
        pg.append({"params": [p for p in ps if id(p) not in bn_ids], "weight_decay": 0.01, "layer_group": gi})
        pg.append({"params": [p for p in ps if id(p) in bn_ids], "weight_decay": 0.0, "layer_group": gi})
    pg = [g for g in pg if g["params"]]
    return torch.optim.AdamW(pg, lr=1e-3, betas=(MOMS[0], 0.99), eps=1e-5)


def group_lrs(start, stop, n):
    """fastai's lr for each of n groups: slice(stop) (start None) or slice(start, stop)."""
    if start is None:
        return [stop / 10] * (n - 1) + [stop]
    return [start * (stop / start) ** (i / (n - 1)) for i in range(n)]


def train_mflop_per_image():
    """Exact multiply-add FLOPs (2 per MAC) per image of an unfrozen step: the 20 convolutions and
    2 Linear layers forward, times 3 (forward, input gradient, weight gradient), minus the stem's
    input gradient which is never computed. Elementwise ops are not counted."""
    side = (SIZE + 1) // 2
    stem = 2 * 3 * 64 * 49 * side * side
    fwd = stem
    side = (side + 1) // 2
    ci = 64
    for stage in range(4):
        c = 64 << stage
        for block in range(2):
            down = stage > 0 and block == 0
            out = (side + 1) // 2 if down else side
            fwd += 2 * ci * c * 9 * out * out + 2 * c * c * 9 * out * out + (2 * ci * c * out * out if down else 0)
            side, ci = out, c
    fwd += 2 * 1024 * 512 + 2 * 512 * 10
    return (3 * fwd - stem) / 1e6


# ---- training --------------------------------------------------------------------------------

def train(rank, world, args, result_q=None):
    import numpy as np
    import torch
    import torchvision
    from torch import nn

    torch_common.start_rank(rank, world, args)
    train_ds = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), transform=item_transforms(True, args.aug))
    if world > 1:
        sampler = torch.utils.data.distributed.DistributedSampler(train_ds, world, rank, shuffle=True, seed=args.seed)
    else:
        sampler = torch.utils.data.RandomSampler(train_ds, generator=torch.Generator().manual_seed(args.seed))
    loader = torch.utils.data.DataLoader(train_ds, batch_size=args.bs, sampler=sampler, drop_last=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0)
    n_iter = len(loader)
    if n_iter < 1:
        raise SystemExit(f"images_torch.py: {len(train_ds)} images are under one batch of {args.bs} per process")
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    aug_rng = np.random.default_rng([args.seed, rank])
    model, groups, bn_ids = build_model()
    loss_fn = nn.CrossEntropyLoss()
    lr_half = BASE_LR / 2
    if args.batches:  # a timing run: the unfrozen phase alone, stopped after B steps
        phases = [("unfrozen", max(args.epochs, math.ceil(args.batches / n_iter)), group_lrs(lr_half / 100, lr_half, 3), 0.3, 5.0)]
    else:
        phases = [("frozen", 1, group_lrs(None, BASE_LR, 3), 0.99, 25.0),
                  ("unfrozen", args.epochs, group_lrs(lr_half / 100, lr_half, 3), 0.3, 5.0)]
    stamps, cpus = [], []
    kids = None  # the loader's worker processes, once they run
    epoch_seen = 0
    t_fit = time.perf_counter()
    loss = None
    for name, n_epoch, lrs, pct_start, div in phases:
        timed = name == "unfrozen"
        set_trainable(groups, bn_ids, frozen=name == "frozen")
        net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
        opt = optimizer(groups, bn_ids)  # fastai clears the optimizer state at freeze/unfreeze
        total = n_epoch * n_iter
        stop = args.batches if args.batches else total
        lr_f = [torch_common.combined_cos(pct_start, lr / div, lr, lr / 1e5) for lr in lrs]
        mom_f = torch_common.combined_cos(pct_start, *MOMS)
        it = 0
        for epoch in range(n_epoch):
            if it >= stop:
                break
            if world > 1:
                sampler.set_epoch(epoch_seen)
            epoch_seen += 1
            net.train()
            for xb, yb in loader:
                if it >= stop:
                    break
                if args.aug == "batch":
                    xb = batch_aug(xb, aug_rng)
                xb = (xb - mean) / std
                pct = it / total
                for grp in opt.param_groups:
                    grp["lr"] = lr_f[grp["layer_group"]](pct)
                    grp["betas"] = (mom_f(pct), 0.99)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                    loss = loss_fn(net(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                it += 1
                if timed:
                    if kids is None:
                        kids = descendants()
                    stamps.append(time.perf_counter())
                    cpus.append(tree_cpu_s(kids))
    t_train_end = time.perf_counter()
    kids = descendants()  # the loader's workers are alive until the loader goes
    pss_end = (torch_common.pss_mb() * 1024 + sum(proc_pss_kb(k) for k in kids)) / 1024
    rss_kids = sum(proc_status_kb(k, "VmHWM") for k in kids) / 1024
    acc = None
    if not args.batches:
        acc = evaluate(model, args, mean, std)
    out = {
        "rank": rank,
        **torch_common.timed(stamps, cpus, args.skip),
        "pss_mb": pss_end,
        "rss_kids_mb": rss_kids,
        "train_s": t_train_end - t_fit,
        "acc": acc,
        "final_loss": float(loss.item()),
    }
    del loader
    return torch_common.finish_rank(world, out, result_q, rss_kids)


def evaluate(model, args, mean, std):
    import torch
    import torchvision

    ds = torchvision.datasets.ImageFolder(os.path.join(args.data, "valid"), transform=item_transforms(False, args.aug))
    loader = torch.utils.data.DataLoader(ds, batch_size=128, shuffle=False, num_workers=args.workers)
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        for xb, yb in loader:
            correct += int((model((xb - mean) / std).argmax(1) == yb).sum())
    return correct / len(ds)


def main():
    args = parse_args()
    if not os.path.isdir(os.path.join(args.data, "train")):
        sys.exit(f"images_torch.py: no {args.data}/train; make it with /usr/bin/python3 bench/make_images.py --out {args.data}")
    fit = torch_common.run(args, train, rss_kids_key="rss_kids_mb")
    torch_common.print_json(fit, args, train_mflop_per_image(), "; includes waiting for the loader",
                            after_threads={"workers": args.workers, "aug": args.aug, "bf16": bool(args.bf16)}, after_acc={"acc_set": "valid"})


if __name__ == "__main__":
    main()
