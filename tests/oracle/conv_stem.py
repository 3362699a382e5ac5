"""Oracle for tests/test_conv_stem.c: the direct stem (3x3, stride 1, padding 1) in float64.

usage: conv_stem.py DIR N   for case i < N: x<i>, w<i>, dy<i> ->
    y<i>, gw<i>      the convolution's output and weight gradient
    ya<i>, gwa<i>    the same of the absolute values (the error bounds' sums)
and for the stem with its BatchNorm and ReLU (case "net": x, w, dy of Conv2d(c, 16) ->
BatchNorm2d(16) (training, momentum 0.1, eps 1e-5) -> ReLU):
    net_out, net_gw, net_rmean, net_rvar
all computed in float64 (stored as float32)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def conv(x, w, dy):
    wg = w.clone().requires_grad_(True)
    y = torch.nn.functional.conv2d(x, wg, None, stride=1, padding=1)
    y.backward(dy)
    return y.detach().numpy(), wg.grad.numpy()


def main():
    d, n = sys.argv[1], int(sys.argv[2])
    for i in range(n):
        x, w, dy = (common.tensor(d, "%s%d" % (name, i)).double() for name in ("x", "w", "dy"))
        for suffix, (a, b, c) in (("", (x, w, dy)), ("a", (x.abs(), w.abs(), dy.abs()))):
            y, gw = conv(a, b, c)
            common.put(d, "y%s%d" % (suffix, i), y)
            common.put(d, "gw%s%d" % (suffix, i), gw)
    if os.path.exists(common.path(d, "net_x")):
        x, w, dy = (common.tensor(d, "net_" + name).double() for name in ("x", "w", "dy"))
        conv_m = torch.nn.Conv2d(w.shape[1], w.shape[0], 3, padding=1, bias=False).double()
        bn = torch.nn.BatchNorm2d(w.shape[0]).double()
        with torch.no_grad():
            conv_m.weight.copy_(w)
        net = torch.nn.Sequential(conv_m, bn, torch.nn.ReLU()).train()
        out = net(x)
        out.backward(dy)
        common.put(d, "net_out", out.detach().numpy())
        common.put(d, "net_gw", conv_m.weight.grad.numpy())
        common.put(d, "net_rmean", bn.running_mean.numpy())
        common.put(d, "net_rvar", bn.running_var.numpy())


if __name__ == "__main__":
    main()
