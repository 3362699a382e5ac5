"""Reference forward/backward for the convolution and pooling layers.

usage: conv_pool.py DIR SPEC...   where SPEC i (0-based) is one of
    conv:STRIDE:PAD:BIAS            reads c<i>_x, c<i>_dy, c<i>_w (and c<i>_b when BIAS is 1)
    maxpool:K:STRIDE:PAD  avgpool:K:STRIDE:PAD  avgceil:K:STRIDE:PAD  amax:OH:OW  aavg:OH:OW
    concat
(avgceil: AvgPool2d with ceil_mode=True, as fastai's xresnet shortcut)
writes c<i>_y, c<i>_dx (and c<i>_dw, c<i>_db for conv).

The float32 inputs are promoted to float64 so that the reference carries no rounding of its own:
what the C test's tolerance absorbs is corefit's float32 arithmetic alone.
"""
import sys

import torch
import torch.nn.functional as F

from common import folder, get, put


def t(d, name, grad=False):
    return torch.tensor(get(d, name), dtype=torch.float64, requires_grad=grad)


def main():
    d = folder()
    for i, spec in enumerate(sys.argv[2:]):
        parts = spec.split(":")
        op, args = parts[0], [int(a) for a in parts[1:]]
        p = "c%d_" % i
        x = t(d, p + "x", True)
        dy = t(d, p + "dy")
        w = b = None
        if op == "conv":
            stride, pad, bias = args
            w = t(d, p + "w", True)
            b = t(d, p + "b", True) if bias else None
            y = F.conv2d(x, w, b, stride=stride, padding=pad)
        elif op == "maxpool":
            y = F.max_pool2d(x, args[0], args[1], args[2])
        elif op == "avgpool":
            y = F.avg_pool2d(x, args[0], args[1], args[2], count_include_pad=True)
        elif op == "avgceil":
            y = F.avg_pool2d(x, args[0], args[1], args[2], ceil_mode=True, count_include_pad=True)
        elif op == "amax":
            y = F.adaptive_max_pool2d(x, (args[0], args[1]))
        elif op == "aavg":
            y = F.adaptive_avg_pool2d(x, (args[0], args[1]))
        elif op == "concat":  # fastai's AdaptiveConcatPool2d: max first, then average
            y = torch.cat([F.adaptive_max_pool2d(x, 1), F.adaptive_avg_pool2d(x, 1)], 1)
        else:
            raise SystemExit("unknown op " + op)
        if tuple(y.shape) != tuple(dy.shape):
            raise SystemExit("%s: output %s but dy %s" % (spec, tuple(y.shape), tuple(dy.shape)))
        y.backward(dy)
        put(d, p + "y", y.detach().numpy())
        put(d, p + "dx", x.grad.numpy())
        if w is not None:
            put(d, p + "dw", w.grad.numpy())
        if b is not None:
            put(d, p + "db", b.grad.numpy())


if __name__ == "__main__":
    main()
