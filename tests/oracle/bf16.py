"""Oracle for tests/test_bf16.c: PyTorch's bfloat16 rounding and products of rounded inputs.

usage: bf16.py DIR convert         x -> y = x.to(torch.bfloat16) widened to float32
       bf16.py DIR gemm N          for i < N: a<i>, b<i> (as stored) and t<i> = (trans_a, trans_b)
                                   -> c<i> = op(a).bf16 @ op(b).bf16 in float32 (torch.matmul)
                                      f<i> = op(a) @ op(b) in float32 (no rounding)
       bf16.py DIR linear          x, w, b, dy -> y, dx, gw, gb of nn.Linear under
                                   torch.autocast("cpu", torch.bfloat16), and ye, dxe, gwe: the
                                   same products of bf16-rounded operands summed in float64
       bf16.py DIR conv N          for i < N: x<i>, w<i>, b<i>, dy<i> and g<i> = (stride, pad,
                                   bias) -> ye<i>, dxe<i>, gwe<i>: conv2d's output and gradients
                                   from bf16-rounded x, w and dy in float64 (the bias exact);
                                   y<i>, dx<i>, gw<i>: torch.autocast("cpu", torch.bfloat16);
                                   yf<i>, dxf<i>, gwf<i>: fp32 without rounding
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def rounded(t):
    return t.to(torch.bfloat16).to(torch.float32)


def main():
    d, mode = sys.argv[1], sys.argv[2]
    if mode == "convert":
        common.put(d, "y", rounded(common.tensor(d, "x")).numpy())
    elif mode == "gemm":
        for i in range(int(sys.argv[3])):
            a, b = common.tensor(d, "a%d" % i), common.tensor(d, "b%d" % i)
            ta, tb = (int(v) for v in common.get(d, "t%d" % i))
            a, b = (a.t() if ta else a), (b.t() if tb else b)
            common.put(d, "c%d" % i, torch.matmul(rounded(a), rounded(b)).numpy())
            common.put(d, "f%d" % i, torch.matmul(a, b).numpy())
    elif mode == "linear":
        x, w, b, dy = (common.tensor(d, n) for n in ("x", "w", "b", "dy"))
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        xg = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(xg)
        assert y.dtype == torch.bfloat16
        y.backward(dy.to(y.dtype))
        common.put(d, "y", y.float().detach().numpy())
        common.put(d, "dx", xg.grad.float().numpy())
        common.put(d, "gw", lin.weight.grad.numpy())
        common.put(d, "gb", lin.bias.grad.numpy())
        xr, wr, dyr = (rounded(t).double() for t in (x, w, dy))
        common.put(d, "ye", (xr @ wr.t() + b.double()).numpy())
        common.put(d, "dxe", (dyr @ wr).numpy())
        common.put(d, "gwe", (dyr.t() @ xr).numpy())
    elif mode == "conv":
        F = torch.nn.functional
        for i in range(int(sys.argv[3])):
            x, w, b, dy = (common.tensor(d, "%s%d" % (n, i)) for n in ("x", "w", "b", "dy"))
            stride, pad, bias = (int(v) for v in common.get(d, "g%d" % i))
            b = b if bias else None

            def run(xv, wv, bv, dyv, suffix, cast=False):
                xg, wg = xv.clone().requires_grad_(True), wv.clone().requires_grad_(True)
                if cast:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        y = F.conv2d(xg, wg, bv, stride=stride, padding=pad)
                    assert y.dtype == torch.bfloat16
                    dyv = dyv.to(y.dtype)
                else:
                    y = F.conv2d(xg, wg, bv, stride=stride, padding=pad)
                y.backward(dyv)
                common.put(d, "y%s%d" % (suffix, i), y.detach().float().numpy())
                common.put(d, "dx%s%d" % (suffix, i), xg.grad.float().numpy())
                common.put(d, "gw%s%d" % (suffix, i), wg.grad.float().numpy())

            run(*(rounded(t).double() for t in (x, w)), b.double() if bias else None,
                rounded(dy).double(), "e")
            run(x, w, b, dy, "", cast=True)
            run(x, w, b, dy, "f")
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
