"""Oracle for tests/test_mix.c: fastai's MixUp/CutMix mixing and mixed loss with PyTorch, given
the lam and permutation the C side drew.

usage: mix.py DIR
Inputs: x (B, C, H, W), logits (B, K), codes (B), multi (B, K) 0/1 targets, lam (B), perm (B),
box (x1, y1, x2, y2), cut_lam (1), eps (1).
Outputs: mixup_x, cutmix_x, loss (fastai's mixed LabelSmoothingCrossEntropy), grad,
bce_targets (lerp of the multi-label targets), beta_mean/beta_std (of max(L, 1 - L), L ~
Beta(0.4, 0.4), 2e6 draws).
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def ls_ce(logits, target, eps):
    """fastai's LabelSmoothingCrossEntropy(eps, reduction='none')."""
    c = logits.size()[1]
    log_preds = F.log_softmax(logits, dim=1)
    loss = -log_preds.sum(dim=1)
    return loss * eps / c + (1 - eps) * F.nll_loss(log_preds, target.long(), reduction="none")


def main():
    torch.set_num_threads(1)
    d = common.folder()
    x = common.tensor(d, "x")
    lam = common.tensor(d, "lam")
    perm = common.tensor(d, "perm").long()
    x1, y1, x2, y2 = [int(v) for v in common.get(d, "box")]
    eps = float(common.get(d, "eps")[0])
    # MixUp (fastai MixUp.before_batch): xb1 = x[shuffle]; lerp(xb1, x, lam)
    lam4 = lam.view(-1, 1, 1, 1)
    common.put(d, "mixup_x", torch.lerp(x[perm], x, lam4).numpy())
    # CutMix: paste x[perm] into the box
    xc = x.clone()
    xc[..., y1:y2, x1:x2] = x[perm][..., y1:y2, x1:x2]
    common.put(d, "cutmix_x", xc.numpy())
    # MixHandler.lf: torch.lerp(lf(pred, y[perm]), lf(pred, y), lam), then the mean
    logits = common.tensor(d, "logits", requires_grad=True)
    codes = common.tensor(d, "codes")
    loss = torch.lerp(ls_ce(logits, codes[perm], eps), ls_ce(logits, codes, eps), lam).mean()
    loss.backward()
    common.put(d, "loss", loss.detach().reshape(1).numpy())
    common.put(d, "grad", logits.grad.numpy())
    multi = common.tensor(d, "multi")
    common.put(d, "bce_targets", torch.lerp(multi[perm], multi, lam.view(-1, 1)).numpy())
    torch.manual_seed(0)
    b = torch.distributions.Beta(torch.tensor(0.4), torch.tensor(0.4)).sample((2000000,))
    m = torch.max(b, 1 - b)
    common.put(d, "beta_stats", torch.stack([m.mean(), m.std()]).numpy())


main()
