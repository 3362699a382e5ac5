"""Oracle for tests/test_bf16_stem.c: stride-2 convolutions with padding (k - 1) / 2 in float64.

usage: bf16_stem.py DIR K0 K1 ...   for case i (kernel size Ki): x<i>, w<i>, dy<i> ->
    y<i>, gw<i>      the output and weight gradient of the unrounded operands
    yr<i>, gwr<i>    the same of the operands rounded to torch.bfloat16 (x, w; x, dy)
    ya<i>, gwa<i>    the same of their absolute values (the error bounds' sums)
all computed in float64 (stored as float32)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def conv(x, w, dy, k):
    F = torch.nn.functional
    wg = w.clone().requires_grad_(True)
    y = F.conv2d(x, wg, None, stride=2, padding=(k - 1) // 2)
    y.backward(dy)
    return y.detach().numpy(), wg.grad.numpy()


def main():
    d, ks = sys.argv[1], [int(a) for a in sys.argv[2:]]
    for i, k in enumerate(ks):
        x, w, dy = (common.tensor(d, "%s%d" % (name, i)).double() for name in ("x", "w", "dy"))
        r = [t.to(torch.bfloat16).double() for t in (x, w, dy)]
        for suffix, (a, b, c) in (("", (x, w, dy)), ("r", r), ("a", (x.abs(), w.abs(), dy.abs()))):
            y, gw = conv(a, b, c, k)
            common.put(d, "y%s%d" % (suffix, i), y)
            common.put(d, "gw%s%d" % (suffix, i), gw)


if __name__ == "__main__":
    main()
