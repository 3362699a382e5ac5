#!/usr/bin/python3
"""W2 (a plain VGG-style CNN on Fashion-MNIST) in PyTorch, the reference side of bench_vgg.

The same model, data, normalisation and recipe as corefit's bench/bench_vgg.c:
  three blocks [Conv2d(ci, c, 3, p1, no bias), BatchNorm2d, ReLU, Conv2d(c, c, 3, p1, no bias),
  BatchNorm2d, ReLU, MaxPool2d(2)] with c = 32, 64, 128 (28 -> 14 -> 7 -> 3), then Flatten,
  Linear(1152, 1024), ReLU, Dropout(0.5), Linear(1024, 10); PyTorch's default init;
  cross-entropy; SGD(momentum 0.9, no dampening), L2 weight decay 5e-4 on conv and Linear weights
  only (fastai wd_bn_bias=False); fit_one_cycle(lr_max 0.02, div 25, div_final 1e5,
  pct_start 0.25) with the momentum held at 0.9, the lr set before every training batch at
  pct = iteration / total iterations; batch 64 per process, shuffled, drop_last.

Modes, options, thread settings and the JSON line are w1_torch.py's (this script runs its loop):
  vgg_torch.py --threads N [--batches B | --epochs E]   one process, N intra-op threads
  vgg_torch.py --ddp N     [--batches B | --epochs E]   N processes, DDP (gloo), 1 thread each
"""
import w1_torch

CHANNELS = (32, 64, 128)
HIDDEN = 1024
MOM = 0.9
WD = 5e-4


def build_model():
    from torch import nn

    def block(ci, c):
        return nn.Sequential(
            nn.Conv2d(ci, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.MaxPool2d(2),
        )

    blocks, ci, side = [], 1, 28
    for c in CHANNELS:
        blocks.append(block(ci, c))
        ci, side = c, side // 2
    head = nn.Sequential(nn.Flatten(), nn.Linear(ci * side * side, HIDDEN), nn.ReLU(), nn.Dropout(0.5), nn.Linear(HIDDEN, 10))
    return nn.Sequential(*blocks, head)


def optimizer(model, lr):
    """SGD with momentum; weight decay on conv and Linear weights, not on biases or BatchNorm."""
    import torch
    from torch import nn

    decay, no_decay = [], []
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            decay.append(m.weight)
            if m.bias is not None:
                no_decay.append(m.bias)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            no_decay += list(m.parameters())
    assert len(decay) + len(no_decay) == len(list(model.parameters()))
    return torch.optim.SGD(
        [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, momentum=MOM, dampening=0, nesterov=False,
    )


def set_mom(group, mom):
    group["momentum"] = mom


def train_mflop_per_image():
    """Exact multiply-add FLOPs (2 per MAC) per image: forward convs/linears, times 3 for a
    training step (forward, input gradient, weight gradient), minus the first conv's input
    gradient which is never computed. Elementwise ops (BN, ReLU, pool, biases) are not counted."""
    fwd, ci, side = [], 1, 28
    for c in CHANNELS:
        fwd += [2 * ci * c * 9 * side * side, 2 * c * c * 9 * side * side]
        ci, side = c, side // 2
    fwd += [2 * ci * side * side * HIDDEN, 2 * HIDDEN * 10]
    return (3 * sum(fwd) - fwd[0]) / 1e6


VGG = {
    "doc": __doc__,
    "lr": 0.02,
    "build_model": build_model,
    "optimizer": optimizer,
    "moms": (MOM, MOM, MOM),
    "set_mom": set_mom,
    "mflop_per_image": train_mflop_per_image,
}

if __name__ == "__main__":
    w1_torch.main(VGG)
