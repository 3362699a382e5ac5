"""Oracle for tests/test_layers.c: runs single PyTorch layers on the C test's inputs.

usage: layers.py DIR CASE...   with CASE = "i:kind:arg,arg,...:mode"
  kind/args: linear:in,out,bias  bn1d:F,eps,momentum  bn2d:C,eps,momentum  relu  leaky:slope
             flatten  embedding:num,dim
  mode: train or eval
Inputs per case (prefix c<i>_): p_<state_dict name> (the C model's parameters and buffers),
optional x0 (a first forward without gradient, e.g. to move BatchNorm's running statistics),
x and dy. Outputs: y, dx (when x is differentiable), g_<parameter> (gradients), s_<buffer>
(buffers after both forwards).
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class CodesEmbedding(nn.Embedding):
    """nn.Embedding on float codes, (N) or (N, k) -> (N, k*dim) as corefit's Embedding."""

    def forward(self, x):
        return super().forward(x.long()).reshape(x.shape[0], -1)


def build(kind, args):
    if kind == "linear":
        return nn.Linear(int(args[0]), int(args[1]), bias=bool(int(args[2])))
    if kind == "bn1d":
        return nn.BatchNorm1d(int(args[0]), eps=float(args[1]), momentum=float(args[2]))
    if kind == "bn2d":
        return nn.BatchNorm2d(int(args[0]), eps=float(args[1]), momentum=float(args[2]))
    if kind == "relu":
        return nn.ReLU()
    if kind == "leaky":
        return nn.LeakyReLU(float(args[0]))
    if kind == "flatten":
        return nn.Flatten()
    if kind == "embedding":
        return CodesEmbedding(int(args[0]), int(args[1]))
    raise SystemExit("unknown layer kind " + kind)


def main():
    torch.set_num_threads(1)
    d = common.folder()
    for spec in sys.argv[2:]:
        idx, kind, args, mode = spec.split(":")
        pre = "c%s_" % idx
        mod = build(kind, [a for a in args.split(",") if a])
        state = mod.state_dict()
        for name, t in state.items():
            v = common.get(d, pre + "p_" + name)
            state[name] = torch.tensor(v.astype(np.int64) if t.dtype == torch.int64 else v).reshape(t.shape)
        mod.load_state_dict(state)
        mod.train(mode == "train")
        if os.path.exists(common.path(d, pre + "x0")):
            with torch.no_grad():
                mod(common.tensor(d, pre + "x0"))
        differentiable = kind != "embedding"
        x = common.tensor(d, pre + "x", requires_grad=differentiable)
        y = mod(x)
        y.backward(common.tensor(d, pre + "dy"))
        common.put(d, pre + "y", y.detach().numpy())
        if differentiable:
            common.put(d, pre + "dx", x.grad.numpy())
        for name, p in mod.named_parameters():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            common.put(d, pre + "g_" + name, g.numpy())
        for name, b in mod.named_buffers():
            common.put(d, pre + "s_" + name, b.detach().to(torch.float32).reshape(-1).numpy())


main()
