"""Oracle for tests/test_loss.c: PyTorch's losses and activations on the C test's inputs.

usage: loss.py DIR CASE...   with CASE = "i:kind:label_smoothing", kind ce, mse or bce
Inputs per case (prefix c<i>_): pred, target. Outputs: loss (mean), per_item (reduction='none',
averaged over each sample's values for mse/bce), grad (d mean loss / d pred), act (softmax over
the last dim for ce, sigmoid for bce, identity for mse).
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    torch.set_num_threads(1)
    d = common.folder()
    for spec in sys.argv[2:]:
        idx, kind, smoothing = spec.split(":")
        pre = "c%s_" % idx
        pred = common.tensor(d, pre + "pred", requires_grad=True)
        target = common.tensor(d, pre + "target")
        n = pred.shape[0]
        if kind == "ce":
            t = target.reshape(n).long()
            ls = float(smoothing)
            loss = nn.CrossEntropyLoss(label_smoothing=ls)(pred, t)
            per = nn.CrossEntropyLoss(reduction="none", label_smoothing=ls)(pred.detach(), t)
            act = torch.softmax(pred.detach(), dim=-1)
        else:
            p, t = pred.reshape(n, -1), target.reshape(n, -1)
            fn = nn.MSELoss if kind == "mse" else nn.BCEWithLogitsLoss
            loss = fn()(p, t)
            per = fn(reduction="none")(p.detach(), t).mean(1)
            act = torch.sigmoid(pred.detach()) if kind == "bce" else pred.detach()
        loss.backward()
        common.put(d, pre + "loss", loss.detach().reshape(1).numpy())
        common.put(d, pre + "per_item", per.numpy())
        common.put(d, pre + "grad", pred.grad.numpy())
        common.put(d, pre + "act", act.numpy())


main()
