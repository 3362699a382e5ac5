"""Oracle for tests/test_fold_words.c: Sequential(W1's block 0.3, W1's block 0.4) in fp32,
training mode, one backward.

usage: fold_words.py DIR   x, dy, and per block b (0, 1): cab, bnab_w, bnab_b, cbb, bnbb_w,
                           bnbb_b, csb, bnsb_w, bnsb_b -> y, dx
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    d = sys.argv[1]
    F = torch.nn.functional
    x = torch.from_numpy(common.get(d, "x")).requires_grad_(True)
    dy = torch.from_numpy(common.get(d, "dy"))

    def p(name):
        return torch.from_numpy(common.get(d, name))

    def bn(v, name):
        return F.batch_norm(v, None, None, p(name + "_w"), p(name + "_b"), training=True, eps=1e-5)

    h = x
    for b in range(2):
        a = F.relu(bn(F.conv2d(h, p("ca%d" % b), stride=2, padding=1), "bna%d" % b))
        a = bn(F.conv2d(a, p("cb%d" % b), stride=1, padding=1), "bnb%d" % b)
        s = bn(F.conv2d(h, p("cs%d" % b), stride=2), "bns%d" % b)
        h = F.relu(a + s)
    h.backward(dy)
    common.put(d, "y", h.detach().numpy())
    common.put(d, "dx", x.grad.numpy())


if __name__ == "__main__":
    main()
