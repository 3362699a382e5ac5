"""Oracle for tests/test_w1_model.c: the W1 model (the mini-resnet benchmark workload) in PyTorch, with the
state_dict names corefit gives its module tree.

usage: w1.py DIR SEED P1 P2
Creates the model with torch.manual_seed(SEED) (PyTorch's default initialisation; dropout p P1
and P2) and writes its state as p_<name>, and n_state. Then, on the C test's x (16, 1, 28, 28)
and target (16): in train mode forward, cross-entropy, backward -> train_logits, train_loss,
g_<param>, s_<buffer> (after the forward); then zeroed gradients, eval mode, the same ->
eval_logits, eval_loss, eg_<param>.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Residual(nn.Module):
    def __init__(self, convpath, idpath):
        super().__init__()
        self.convpath = convpath
        self.idpath = idpath

    def forward(self, x):
        return F.relu(self.convpath(x) + self.idpath(x))


class AdaptiveConcatPool2d(nn.Module):
    def forward(self, x):
        return torch.cat([F.adaptive_max_pool2d(x, 1), F.adaptive_avg_pool2d(x, 1)], 1)


def block(ni, nf):
    convpath = nn.Sequential(
        nn.Conv2d(ni, nf, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(nf), nn.ReLU(),
        nn.Conv2d(nf, nf, 3, padding=1, bias=False), nn.BatchNorm2d(nf))
    idpath = nn.Sequential(nn.Conv2d(ni, nf, 1, stride=2, bias=False), nn.BatchNorm2d(nf))
    return Residual(convpath, idpath)


def w1(p1, p2):
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        block(16, 32), block(32, 64),
        AdaptiveConcatPool2d(), nn.Flatten(),
        nn.BatchNorm1d(128), nn.Dropout(p1), nn.Linear(128, 256, bias=False), nn.ReLU(),
        nn.BatchNorm1d(256), nn.Dropout(p2), nn.Linear(256, 10, bias=False))


def main():
    torch.set_num_threads(1)
    d = common.folder()
    seed, p1, p2 = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    torch.manual_seed(seed)
    model = w1(p1, p2)
    state = model.state_dict()
    common.put_state(d, state)
    x = common.tensor(d, "x")
    target = common.tensor(d, "target").long()
    for mode in ("train", "eval"):
        model.train(mode == "train")
        model.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, target)
        loss.backward()
        common.put(d, mode + "_logits", logits.detach().numpy())
        common.put(d, mode + "_loss", loss.detach().reshape(1).numpy())
        prefix = "g_" if mode == "train" else "eg_"
        for name, p in model.named_parameters():
            common.put(d, prefix + name, p.grad.numpy())
        if mode == "train":
            for name, b in model.named_buffers():
                common.put(d, "s_" + name, b.to(torch.float32).reshape(-1).numpy())


main()
