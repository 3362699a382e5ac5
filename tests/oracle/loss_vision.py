"""Oracle for tests/test_loss_vision.c: fastai's vision losses written with PyTorch.

usage: loss_vision.py DIR CASE...   with CASE = "i:kind:eps:axis:soft:pw"
kind ce (CrossEntropyLossFlat(axis) or, with eps > 0, fastai's LabelSmoothingCrossEntropy
formula moved to the class axis), or bce (BCEWithLogitsLossFlat, pos_weight when pw is 1).
Inputs (prefix c<i>_): pred, target, and pos_weight for bce with pw. Outputs: loss, per_item
(mean per sample), grad, act (softmax over the class axis / sigmoid), decoded (argmax over the
class axis / sigmoid > 0.5).
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def label_smoothing_ce(logits, target, eps, reduction):
    """fastai.losses.LabelSmoothingCrossEntropy.forward for (N, C) logits and (N) targets."""
    c = logits.size()[1]
    log_preds = F.log_softmax(logits, dim=1)
    if reduction == "sum":
        loss = -log_preds.sum()
    else:
        loss = -log_preds.sum(dim=1)
        if reduction == "mean":
            loss = loss.mean()
    return loss * eps / c + (1 - eps) * F.nll_loss(log_preds, target.long(), reduction=reduction)


def soft_ce(logits, target, eps, reduction):
    """Cross-entropy against class probabilities, smoothed as PyTorch's label_smoothing."""
    c = logits.size()[1]
    t = target * (1 - eps) + eps / c
    loss = -(F.log_softmax(logits, dim=1) * t).sum(1)
    return loss.mean() if reduction == "mean" else loss


def main():
    torch.set_num_threads(1)
    d = common.folder()
    for spec in sys.argv[2:]:
        idx, kind, eps, axis, soft, pw = spec.split(":")
        eps, axis, soft, pw = float(eps), int(axis), int(soft), int(pw)
        pre = "c%s_" % idx
        pred = common.tensor(d, pre + "pred", requires_grad=True)
        target = common.tensor(d, pre + "target")
        n = pred.shape[0]
        if kind == "ce":
            # fastai's flat losses: class axis moved last (fastai transposes the target alike,
            # which pairs the same pixels), then (rows, C) against (rows)
            moved = pred.movedim(axis, -1)
            c = moved.shape[-1]
            flat = moved.contiguous().view(-1, c)
            if soft:
                t = target.movedim(axis, -1).contiguous().view(-1, c)
                loss = soft_ce(flat, t, eps, "mean")
                per = soft_ce(flat.detach(), t, eps, "none").view(n, -1).mean(1)
            else:
                t = target.contiguous().view(-1)
                loss = label_smoothing_ce(flat, t, eps, "mean")
                per = label_smoothing_ce(flat.detach(), t, eps, "none").view(n, -1).mean(1)
            act = torch.softmax(pred.detach(), dim=axis)
            decoded = act.argmax(dim=axis).float()
        else:
            weight = common.tensor(d, pre + "pos_weight") if pw else None
            loss = F.binary_cross_entropy_with_logits(pred.view(-1), target.view(-1),
                                                      pos_weight=None)
            if pw:  # fastai: pos_weight disables flattening (broadcast over the last axis)
                loss = F.binary_cross_entropy_with_logits(pred, target, pos_weight=weight)
                per = F.binary_cross_entropy_with_logits(pred.detach(), target,
                                                         pos_weight=weight,
                                                         reduction="none").view(n, -1).mean(1)
            else:
                per = F.binary_cross_entropy_with_logits(pred.detach(), target,
                                                         reduction="none").view(n, -1).mean(1)
            act = torch.sigmoid(pred.detach())
            decoded = (act > 0.5).float()
        loss.backward()
        common.put(d, pre + "loss", loss.detach().reshape(1).numpy())
        common.put(d, pre + "per_item", per.numpy())
        common.put(d, pre + "grad", pred.grad.numpy())
        common.put(d, pre + "act", act.numpy())
        common.put(d, pre + "decoded", decoded.numpy())


main()
