#!/usr/bin/python3
"""PyTorch's side of bench/tasks.py: fastai's recipes for the other vision tasks, written out
(fastai itself is not a Debian package), on the data `corefit fmnist-tasks` writes and on
Fashion-MNIST, with the model, normalisation, schedule and optimizer corefit's CLI uses.

  tasks_torch.py multi-label DIR    labels.csv (fname,labels,is_valid): BCEWithLogitsLossFlat,
                                    accuracy_multi (thresh 0.5, sigmoid)
  tasks_torch.py points DIR         points.csv (fname,x,y,is_valid): PointScaler (p*2/size - 1),
                                    MSELossFlat, y_range (-1, 1)
  tasks_torch.py regression DIR     points.csv, the x column as one value per image:
                                    MSELossFlat, y_range the training range widened by 5% a side
  tasks_torch.py fmnist IDXDIR      single-label Fashion-MNIST (--limit N training images, the
                                    first N/5 test images to validate): CrossEntropyLossFlat, or
                                    --label-smoothing 0.1 (LabelSmoothingCrossEntropy),
                                    --mixup 0.4 (MixUp), --cutmix 1.0 (CutMix); accuracy
  tasks_torch.py segmentation DIR   DIR/train and DIR/valid as fmnist-tasks writes them
                                    (images/*.png, labels/*_P.png, codes.txt): DynamicUnet on a
                                    resnet18 body (1 input channel), CrossEntropyLossFlat(axis=1),
                                    foreground_acc (bkg 0), DiceMulti

Model (all but segmentation): corefit's mini-resnet (bench/w1_torch.py's W1 model) with n_in 1,
n_out the task's outputs and SigmoidRange on the head when a y_range is set.
Recipe: normalisation by the training images' mean and std (as corefit's CLI), fastai's Adam
(AdamW 0.9/0.99, eps 1e-5, wd 0.01, none on BatchNorm parameters and biases), fit_one_cycle(E,
lr_max) (div 25, div_final 1e5, pct_start 0.25, moms 0.95/0.85/0.95), batch --bs, shuffled,
drop_last, one thread. Prints one JSON line: valid_loss and the task's metrics.
"""
import argparse
import csv
import json
import math
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import w1_torch  # noqa: E402

# ---- data ----


def read_png(path):
    return np.asarray(Image.open(path).convert("L"), dtype=np.float32) / 255.0


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def image_rows(root, rows):
    x = np.stack([read_png(os.path.join(root, r["fname"])) for r in rows])[:, None]
    valid = np.array([r["is_valid"].strip() in ("1", "true", "True") for r in rows])
    return x, valid


def normalise(xtr, xva):
    """corefit's cf_dataset_channel_stats: mean and (n - 1) std of the training pixels + 1e-7."""
    m = float(xtr.astype(np.float64).mean())
    s = float(xtr.astype(np.float64).std(ddof=1)) + 1e-7
    return (xtr - m) / s, (xva - m) / s


def load_task(task, root, args):
    """(xtr, ytr, xva, yva, n_out, y_range) for a CSV task."""
    if task == "multi-label":
        rows = read_csv(os.path.join(root, "labels.csv"))
        x, valid = image_rows(root, rows)
        sets = [r["labels"].split(" ") if r["labels"].strip() else [] for r in rows]
        vocab = sorted({c for s, v in zip(sets, valid) if not v for c in s})  # training split only
        y = np.zeros((len(rows), len(vocab)), np.float32)
        for i, s in enumerate(sets):
            for c in s:
                y[i, vocab.index(c)] = 1.0  # an unknown validation label raises, as fastai
        return x[~valid], y[~valid], x[valid], y[valid], len(vocab), None
    rows = read_csv(os.path.join(root, "points.csv"))
    x, valid = image_rows(root, rows)
    h, w = x.shape[2], x.shape[3]
    px = np.array([[float(r["x"]), float(r["y"])] for r in rows], np.float32)
    if task == "points":  # PointScaler: p * 2 / (W, H) - 1; y_range (-1, 1)
        y = px * 2.0 / np.array([w, h], np.float32) - 1.0
        return x[~valid], y[~valid], x[valid], y[valid], 2, (-1.0, 1.0)
    y = px[:, :1].copy()  # regression: the x column
    lo, hi = float(y[~valid].min()), float(y[~valid].max())
    pad = 0.05 * (hi - lo) if hi > lo else abs(hi) * 0.05 + 1
    return x[~valid], y[~valid], x[valid], y[valid], 1, (lo - pad, hi + pad)


def load_fmnist(root, limit):
    """corefit train --idx DIR --limit N: the first N training images, the first N/5 test ones."""
    def part(pre, n):
        xi = w1_torch.read_idx(os.path.join(root, f"{pre}-images-idx3-ubyte.gz"))[:n]
        yi = w1_torch.read_idx(os.path.join(root, f"{pre}-labels-idx1-ubyte.gz"))[:n]
        return xi.astype(np.float32)[:, None] / 255.0, yi.astype(np.int64)

    xtr, ytr = part("train", limit)
    xva, yva = part("t10k", max(1, limit // 5))
    return xtr, ytr, xva, yva


def load_masks(root):
    names = sorted(f for f in os.listdir(os.path.join(root, "images")) if f.endswith(".png"))
    x = np.stack([read_png(os.path.join(root, "images", f)) for f in names])[:, None]
    y = np.stack([np.asarray(Image.open(os.path.join(root, "labels", f[:-4] + "_P.png")), dtype=np.int64)
                  for f in names])
    return x, y


# ---- models ----


class SigmoidRange(nn.Module):
    def __init__(self, lo, hi):
        super().__init__()
        self.lo, self.hi = lo, hi

    def forward(self, x):
        return torch.sigmoid(x) * (self.hi - self.lo) + self.lo


def mini_resnet(n_out, y_range):
    """W1's model (bench/w1_torch.py) with n_out outputs and fastai's y_range on the head."""
    m = w1_torch.build_model()
    head = m[1]
    old = head[-1]
    head[-1] = nn.Linear(old.in_features, n_out, bias=False)
    nn.init.kaiming_normal_(head[-1].weight)
    if y_range is not None:
        head.append(SigmoidRange(*y_range))
    return m


# fastai's DynamicUnet (fastai/vision/models/unet.py, fastai/layers.py), as tests/oracle/unet.py
# writes it out for the layer tests.


def _init_default(m, func=nn.init.kaiming_normal_):
    if func and hasattr(m, "weight"):
        func(m.weight)
    with torch.no_grad():
        if getattr(m, "bias", None) is not None:
            m.bias.fill_(0.0)


def _apply_init(m, func=nn.init.kaiming_normal_):
    for mod in m.modules():
        if not isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)) and any(
                p.requires_grad for p in mod.parameters(recurse=False)):
            _init_default(mod, func)


def _bn(nf):
    bn = nn.BatchNorm2d(nf)
    with torch.no_grad():
        bn.bias.fill_(1e-3)
        bn.weight.fill_(1.0)
    return bn


def _conv(ni, nf, ks=3, act=True, bias_std=0.01):
    """fastai's ConvLayer with norm_type None: conv with bias, then ReLU."""
    conv = nn.Conv2d(ni, nf, ks, padding=(ks - 1) // 2, bias=True)
    if act:
        nn.init.kaiming_uniform_(conv.weight)
    with torch.no_grad():
        if bias_std:
            conv.bias.normal_(0, bias_std)
        else:
            conv.bias.zero_()
    return nn.Sequential(conv, nn.ReLU()) if act else nn.Sequential(conv)


def _icnr(x, scale=2):
    ni, nf, h, w = x.shape
    ni2 = int(ni / (scale ** 2))
    k = nn.init.kaiming_normal_(x.new_zeros([ni2, nf, h, w])).transpose(0, 1)
    k = k.contiguous().view(ni2, nf, -1).repeat(1, 1, scale ** 2)
    return k.contiguous().view([nf, ni, h, w]).transpose(0, 1)


def _ps_icnr(ni, nf=None, scale=2):
    nf = nf if nf is not None else ni
    c = _conv(ni, nf * scale ** 2, ks=1, bias_std=0)
    with torch.no_grad():
        c[0].weight.copy_(_icnr(c[0].weight.data))
    return nn.Sequential(c, nn.PixelShuffle(scale))


class _UnetBlock(nn.Module):
    def __init__(self, up_in_c, x_in_c, store, idx, final_div=True):
        super().__init__()
        self.store, self.idx = store, idx
        self.shuf = _ps_icnr(up_in_c, up_in_c // 2)
        self.bn = _bn(x_in_c)
        ni = up_in_c // 2 + x_in_c
        nf = ni if final_div else ni // 2
        self.conv1, self.conv2 = _conv(ni, nf), _conv(nf, nf)
        _apply_init(nn.Sequential(self.conv1, self.conv2))

    def forward(self, up_in):
        s = self.store[self.idx]
        up = self.shuf(up_in)
        if s.shape[-2:] != up.shape[-2:]:
            up = F.interpolate(up, s.shape[-2:], mode="nearest")
        return self.conv2(self.conv1(F.relu(torch.cat([up, self.bn(s)], dim=1))))


class DynamicUnet(nn.Module):
    """DynamicUnet(encoder, n_out, img_size) with fastai's defaults (no blur, no self-attention,
    last_cross, no bottle, kaiming_normal_ init)."""

    def __init__(self, encoder, n_out, img_size):
        super().__init__()
        self.encoder = encoder
        self.store = {}
        with torch.no_grad():
            x = torch.empty(1, 1, *img_size).uniform_(-1, 1)
            sizes = []
            encoder.eval()
            for m in encoder.children():
                x = m(x)
                sizes.append(x.shape)
        widths = [s[-1] for s in sizes]
        idxs = list(reversed([i for i in range(len(widths) - 1) if widths[i] != widths[i + 1]]))
        self.idxs = idxs
        ni = sizes[-1][1]
        self.bn = _bn(ni)
        self.middle = nn.Sequential(_conv(ni, ni * 2), _conv(ni * 2, ni))
        blocks = []
        up_c = ni
        for i, idx in enumerate(idxs):
            not_final = i != len(idxs) - 1
            b = _UnetBlock(up_c, sizes[idx][1], self.store, idx, final_div=not_final)
            blocks.append(b)
            ni_b = up_c // 2 + sizes[idx][1]
            up_c = ni_b if not_final else ni_b // 2
        self.blocks = nn.ModuleList(blocks)
        self.shuf = _ps_icnr(up_c) if tuple(img_size) != tuple(sizes[0][-2:]) else None
        ni = up_c + 1  # last_cross: + the raw input's channel
        self.res = nn.ModuleList([_conv(ni, ni), _conv(ni, ni, act=False)])
        self.final = _conv(ni, n_out, ks=1, act=False)
        _apply_init(nn.Sequential(self.middle, self.res))

    def forward(self, inp):
        x = inp
        for i, m in enumerate(self.encoder.children()):
            x = m(x)
            if i in self.idxs:
                self.store[i] = x
        x = self.middle(F.relu(self.bn(x)))
        for b in self.blocks:
            x = b(x)
        if self.shuf is not None:
            x = self.shuf(x)
        if x.shape[-2:] != inp.shape[-2:]:
            x = F.interpolate(x, inp.shape[-2:], mode="nearest")
        x = torch.cat([x, inp], dim=1)
        x = F.relu(self.res[1](self.res[0](x)) + x)
        self.store.clear()
        return self.final(x)


def unet_resnet18(n_out, size):
    import torchvision

    r = torchvision.models.resnet18()
    # fastai's _update_first_layer for n_in = 1 (not pretrained): a new 1-channel conv1
    r.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    nn.init.kaiming_normal_(r.conv1.weight, mode="fan_out", nonlinearity="relu")
    body = nn.Sequential(*list(r.children())[:-2])
    return DynamicUnet(body, n_out, (size, size))


# ---- losses and the training tricks (fastai/losses.py, fastai/callback/mixup.py) ----


def ls_ce(logits, target, eps, reduction="mean"):
    """LabelSmoothingCrossEntropy(eps)."""
    c = logits.size(1)
    logp = F.log_softmax(logits, dim=1)
    loss = (-logp.sum(dim=1)) * eps / c + (1 - eps) * F.nll_loss(logp, target, reduction="none")
    return loss.mean() if reduction == "mean" else loss


def make_loss(task, args):
    if task == "multi-label":
        return lambda p, t, red="mean": F.binary_cross_entropy_with_logits(p, t)
    if task in ("points", "regression"):
        return lambda p, t, red="mean": F.mse_loss(p.reshape(-1), t.reshape(-1))
    if task == "segmentation":
        return lambda p, t, red="mean": F.cross_entropy(p, t)
    if args.label_smoothing > 0:
        return lambda p, t, red="mean": ls_ce(p, t, args.label_smoothing, red)
    return lambda p, t, red="mean": F.cross_entropy(p, t, reduction=red)


def mix_batch(xb, yb, args, gen):
    """fastai's MixUp/CutMix before_batch: returns (x, y_perm, lam) with lam per sample (MixUp)
    or one per batch (CutMix)."""
    b = xb.size(0)
    if args.mixup > 0:
        d = torch.distributions.Beta(torch.tensor(args.mixup), torch.tensor(args.mixup))
        lam = d.sample((b,))
        lam = torch.stack([lam, 1 - lam], 1).max(1)[0]
        perm = torch.randperm(b, generator=gen)
        x = torch.lerp(xb[perm], xb, lam.view(-1, 1, 1, 1))
        return x, yb[perm], lam
    d = torch.distributions.Beta(torch.tensor(args.cutmix), torch.tensor(args.cutmix))
    lam = float(d.sample((1,)))
    perm = torch.randperm(b, generator=gen)
    h, w = xb.size(2), xb.size(3)
    r = math.sqrt(1.0 - lam)
    cw, ch = int(round(w * r)), int(round(h * r))
    cx = int(torch.randint(0, w, (1,), generator=gen))
    cy = int(torch.randint(0, h, (1,), generator=gen))
    x1, x2 = min(max(cx - cw // 2, 0), w), min(max(cx + cw // 2, 0), w)
    y1, y2 = min(max(cy - ch // 2, 0), h), min(max(cy + ch // 2, 0), h)
    x = xb.clone()
    x[..., y1:y2, x1:x2] = xb[perm][..., y1:y2, x1:x2]
    lam = 1.0 - (x2 - x1) * (y2 - y1) / float(w * h)
    return x, yb[perm], torch.full((b,), lam)


# ---- the fit ----


def optimizer(model, lr):
    """fastai's Adam with true weight decay; none on BatchNorm parameters and biases."""
    no_wd = set()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            no_wd.update(id(p) for p in m.parameters(recurse=False))
        elif getattr(m, "bias", None) is not None and isinstance(m.bias, nn.Parameter):
            no_wd.add(id(m.bias))
    wd = [p for p in model.parameters() if id(p) not in no_wd]
    rest = [p for p in model.parameters() if id(p) in no_wd]
    return torch.optim.AdamW([{"params": wd, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.99), eps=1e-5)


def fit(model, xtr, ytr, args, loss_fn, task):
    opt = optimizer(model, args.lr)
    n_iter = len(xtr) // args.bs
    total = args.epochs * n_iter
    lr_f = w1_torch.combined_cos(0.25, args.lr / 25, args.lr, args.lr / 1e5)
    mom_f = w1_torch.combined_cos(0.25, 0.95, 0.85, 0.95)
    g = np.random.default_rng(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    mixing = task == "fmnist" and (args.mixup > 0 or args.cutmix > 0)
    it = 0
    for _ in range(args.epochs):
        model.train()
        perm = g.permutation(len(xtr))
        for b in range(n_iter):
            idx = perm[b * args.bs:(b + 1) * args.bs]
            xb, yb = torch.from_numpy(xtr[idx]), torch.from_numpy(ytr[idx])
            for grp in opt.param_groups:
                grp["lr"] = lr_f(it / total)
                grp["betas"] = (mom_f(it / total), 0.99)
            if mixing:
                xb, yb1, lam = mix_batch(xb, yb, args, gen)
                out = model(xb)
                loss = torch.lerp(loss_fn(out, yb1, "none"), loss_fn(out, yb, "none"), lam).mean()
            else:
                loss = loss_fn(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            it += 1


@torch.no_grad()
def validate(model, xva, yva, loss_fn, task, n_codes=0, bs=64):
    """fastai's validation: batches of bs (the valid loader's bs is the training one), the loss
    and foreground_acc (an AvgMetric) averaged over the batches weighted by their sizes; the
    other metrics over the whole set."""
    model.eval()
    losses, outs, fg_accs = [], [], []
    for i in range(0, len(xva), bs):
        xb, yb = torch.from_numpy(xva[i:i + bs]), torch.from_numpy(yva[i:i + bs])
        out = model(xb)
        losses.append((float(loss_fn(out, yb)), len(xb)))
        outs.append(out)
        if task == "segmentation":
            fg = yb != 0
            fg_accs.append((float((out.argmax(1)[fg] == yb[fg]).float().mean()), len(xb)))
    out = torch.cat(outs)
    y = torch.from_numpy(yva)
    res = {"valid_loss": sum(l * n for l, n in losses) / sum(n for _, n in losses)}
    if task == "multi-label":
        res["accuracy_multi"] = float(((torch.sigmoid(out) > 0.5).float() == y).float().mean())
    elif task == "fmnist":
        res["accuracy"] = float((out.argmax(1) == y).float().mean())
    elif task in ("points", "regression"):  # points: in PointScaler's -1..1 units
        res["mae"] = float((out.reshape(-1) - y.reshape(-1)).abs().mean())
    elif task == "segmentation":
        pred = out.argmax(1)
        res["foreground_acc"] = sum(a * n for a, n in fg_accs) / sum(n for _, n in fg_accs)
        dice = []
        for c in range(n_codes):
            p, t = pred == c, y == c
            union = int(p.sum()) + int(t.sum())
            if union:
                dice.append(2.0 * int((p & t).sum()) / union)
        res["dice_multi"] = sum(dice) / len(dice)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", choices=["multi-label", "points", "regression", "fmnist", "segmentation"])
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--limit", type=int, default=5000, help="fmnist: training images")
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--mixup", type=float, default=0.0)
    ap.add_argument("--cutmix", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    task = args.task
    n_codes = 0
    if task == "fmnist":
        xtr, ytr, xva, yva = load_fmnist(args.data, args.limit)
        n_out, y_range = 10, None
    elif task == "segmentation":
        xtr, ytr = load_masks(os.path.join(args.data, "train"))
        xva, yva = load_masks(os.path.join(args.data, "valid"))
        with open(os.path.join(args.data, "train", "codes.txt")) as f:
            n_codes = len([ln for ln in f.read().split("\n") if ln.strip()])
    else:
        xtr, ytr, xva, yva, n_out, y_range = load_task(task, args.data, args)
    xtr, xva = normalise(xtr, xva)
    xtr, xva = np.ascontiguousarray(xtr, np.float32), np.ascontiguousarray(xva, np.float32)
    model = unet_resnet18(n_codes, xtr.shape[-1]) if task == "segmentation" else mini_resnet(n_out, y_range)
    loss_fn = make_loss(task, args)
    fit(model, xtr, ytr, args, loss_fn, task)
    res = validate(model, xva, yva, loss_fn, task, n_codes, args.bs)
    res.update({"impl": "torch", "task": task, "seed": args.seed, "epochs": args.epochs, "lr": args.lr,
                "bs": args.bs, "n_train": len(xtr), "n_valid": len(xva), "seconds": time.time() - t0})
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
