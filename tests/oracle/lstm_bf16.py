"""Oracle for tests/test_lstm_bf16.c: nn.LSTM's forward and backward in float64 as corefit's
mixed precision computes it (cf_lstm_set_bf16), and exactly.

usage: lstm_bf16.py DIR I H N    over batches x<k>, dy<k> (k < N) with the state carried and
                                 detached (cut or zero-padded when a batch has another size):
                                 y<k>, dx<k>, g_<param> exactly; yb<k>, dxb<k>, gb_<param> with
                                 the whole-sequence products on bf16-rounded operands (x W_ih^T,
                                 dX = dG W_ih, dW_ih = dG^T x, dW_hh = dG^T h_prev) and the
                                 recurrent step (h W_hh^T, dh = dG W_hh), gates, cell state and
                                 bias gradients unrounded
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def r(t):
    """bf16(t) of the float32 value corefit holds, widened back to float64."""
    return t.to(torch.float32).to(torch.bfloat16).to(torch.float64)


class InputProduct(torch.autograd.Function):
    """x W^T with both operands rounded; backward rounds dG and the operands again."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return r(x) @ r(w).t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return r(g) @ r(w), r(g).t() @ r(x)


class RecurrentProduct(torch.autograd.Function):
    """h W^T and dh unrounded; dW = bf16(dG)^T bf16(h)."""

    @staticmethod
    def forward(ctx, h, w):
        ctx.save_for_backward(h, w)
        return h @ w.t()

    @staticmethod
    def backward(ctx, g):
        h, w = ctx.saved_tensors
        return g @ w, r(g).t() @ r(h)


def fit_state(s, bs):
    if s.shape[0] >= bs:
        return s[:bs]
    return torch.cat([s, s.new_zeros(bs - s.shape[0], s.shape[1])], 0)


def run(d, i, h, n, bf16):
    names = ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    p = {k: torch.tensor(common.get(d, "p_" + k), dtype=torch.float64, requires_grad=True) for k in names}
    inp = InputProduct.apply if bf16 else (lambda a, w: a @ w.t())
    rec = RecurrentProduct.apply if bf16 else (lambda a, w: a @ w.t())
    hs = cs = None
    sfx = "b" if bf16 else ""
    for k in range(n):
        x = torch.tensor(common.get(d, "x%d" % k), dtype=torch.float64, requires_grad=True)
        bs, steps = x.shape[0], x.shape[1]
        if hs is None:
            hs, cs = x.new_zeros(bs, h), x.new_zeros(bs, h)
        hs, cs = fit_state(hs, bs), fit_state(cs, bs)
        g_all = inp(x.reshape(bs * steps, i), p["weight_ih_l0"]).reshape(bs, steps, 4 * h)
        g_all = g_all + p["bias_ih_l0"] + p["bias_hh_l0"]
        hh, cc, outs = hs, cs, []
        for s in range(steps):
            g = g_all[:, s] + rec(hh, p["weight_hh_l0"])
            gi, gf, gg, go = g.chunk(4, 1)
            cc = torch.sigmoid(gf) * cc + torch.sigmoid(gi) * torch.tanh(gg)
            hh = torch.sigmoid(go) * torch.tanh(cc)
            outs.append(hh)
        y = torch.stack(outs, 1)
        dy = torch.tensor(common.get(d, "dy%d" % k), dtype=torch.float64)
        (y * dy).sum().backward()
        hs, cs = hh.detach(), cc.detach()
        common.put(d, "y%s%d" % (sfx, k), y.detach().numpy())
        common.put(d, "dx%s%d" % (sfx, k), x.grad.numpy())
    for k in names:
        common.put(d, "g%s_%s" % (sfx, k), p[k].grad.numpy())


def main():
    argv = sys.argv
    d, i, h, n = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    run(d, i, h, n, False)
    run(d, i, h, n, True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        common.serve(main)
    else:
        main()
