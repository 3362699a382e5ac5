"""Oracle for tests/test_bf16_winograd.c: 3x3 stride-1 padding-1 convolutions in float64.

usage: bf16_winograd.py DIR N   for i < N: x<i>, w<i>, dy<i> -> y<i>, dx<i>, gw<i>: conv2d's
                                output, input and weight gradients of the unrounded operands,
                                computed in float64 (stored as float32)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    d, n = sys.argv[1], int(sys.argv[2])
    F = torch.nn.functional
    for i in range(n):
        x, w, dy = (common.tensor(d, "%s%d" % (name, i)).double() for name in ("x", "w", "dy"))
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = F.conv2d(xg, wg, None, stride=1, padding=1)
        y.backward(dy)
        common.put(d, "y%d" % i, y.detach().numpy())
        common.put(d, "dx%d" % i, xg.grad.numpy())
        common.put(d, "gw%d" % i, wg.grad.numpy())


if __name__ == "__main__":
    main()
