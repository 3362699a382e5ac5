"""Oracle for tests/test_words_restore.c: Sequential(BatchNorm2d(16), W1's block 0.3) in fp32,
training mode, one backward.

usage: words_restore.py DIR   x, dy, bn0_w, bn0_b, ca, bna_w, bna_b, cb, bnb_w, bnb_b, cs,
                              bns_w, bns_b -> y, gcs (the shortcut's weight gradient),
                              gcs_abs (the sum of the magnitudes of gcs's products: |its
                              input| and |its output gradient|)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    d = sys.argv[1]
    t = {n: common.tensor(d, n) for n in ("x", "dy", "bn0_w", "bn0_b", "ca", "bna_w", "bna_b",
                                          "cb", "bnb_w", "bnb_b", "cs", "bns_w", "bns_b")}
    F = torch.nn.functional
    ca, cb, cs = (t[n].clone().requires_grad_(True) for n in ("ca", "cb", "cs"))

    def bn(v, name):
        return F.batch_norm(v, None, None, t[name + "_w"], t[name + "_b"], training=True, eps=1e-5)

    h = bn(t["x"], "bn0")
    a = F.relu(bn(F.conv2d(h, ca, stride=2, padding=1), "bna"))
    a = bn(F.conv2d(a, cb, stride=1, padding=1), "bnb")
    zs = F.conv2d(h, cs, stride=2)
    zs.retain_grad()
    s = bn(zs, "bns")
    y = F.relu(a + s)
    y.backward(t["dy"])
    common.put(d, "y", y.detach().numpy())
    common.put(d, "gcs", cs.grad.numpy())
    # the sum of the products' magnitudes, the scale of the bf16 rounding's error
    gabs = torch.nn.grad.conv2d_weight(h.detach().abs(), cs.shape, zs.grad.abs(), stride=2)
    common.put(d, "gcs_abs", gabs.numpy())


if __name__ == "__main__":
    main()
