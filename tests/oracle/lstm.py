"""Oracle for tests/test_lstm.c: PyTorch's nn.LSTM and a PyTorch implementation of fastai's
AWD-LSTM language model (fastai/text/models/awdlstm.py, core.py) run on the C test's weights and
dropout masks, in float64.

usage: lstm.py DIR lstm I H N      nn.LSTM(I, H, batch_first) over batches x<k>, dy<k> (k < N) with
                                   the state carried and detached (and cut or zero-padded when a
                                   batch has another size); outputs y<k>, dx<k>, g_<param>
       lstm.py DIR lm V E NH L N   the language model over batches x<k> (ids) and t<k> (targets)
                                   with masks m<k>_emb, m<k>_in, m<k>_w<l>, m<k>_h<l>, m<k>_out;
                                   outputs logits<k>, loss<k>, g_<param>
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def t(d, name):
    return torch.tensor(common.get(d, name), dtype=torch.float64)


def fit_state(s, bs):
    """fastai's _change_hidden: keep the first rows or zero-pad."""
    if s.shape[1] >= bs:
        return s[:, :bs]
    return torch.cat([s, s.new_zeros(s.shape[0], bs - s.shape[1], s.shape[2])], 1)


def run_lstm(d, i, h, n):
    lstm = nn.LSTM(i, h, batch_first=True).double()
    with torch.no_grad():
        for name in ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]:
            getattr(lstm, name).copy_(t(d, "p_" + name))
    state = None
    for k in range(n):
        x = t(d, "x%d" % k).requires_grad_(True)
        bs = x.shape[0]
        if state is None:
            state = (x.new_zeros(1, bs, h), x.new_zeros(1, bs, h))
        state = tuple(fit_state(s, bs) for s in state)
        y, new = lstm(x, state)
        (y * t(d, "dy%d" % k)).sum().backward()
        state = tuple(s.detach() for s in new)
        common.put(d, "y%d" % k, y.detach().numpy())
        common.put(d, "dx%d" % k, x.grad.numpy())
    for name, p in lstm.named_parameters():
        common.put(d, "g_" + name, p.grad.numpy())


def lstm_steps(x, h, c, wih, whh, bih, bhh):
    outs = []
    for s in range(x.shape[1]):
        g = x[:, s] @ wih.t() + bih + h @ whh.t() + bhh
        i, f, gg, o = g.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs, 1), h, c


def run_lm(d, v, e, nh, nl, n):
    names = ["0.encoder.weight"]
    for l in range(nl):
        pre = "0.rnns.%d." % l
        names += [pre + "weight_hh_l0_raw", pre + "module.weight_ih_l0",
                  pre + "module.bias_ih_l0", pre + "module.bias_hh_l0"]
    names.append("1.decoder.bias")
    p = {name: t(d, "p_" + name).requires_grad_(True) for name in names}
    sizes = [nh if l < nl - 1 else e for l in range(nl)]
    state = None
    for k in range(n):
        ids = torch.tensor(common.get(d, "x%d" % k)).long()
        tgt = torch.tensor(common.get(d, "t%d" % k)).long()
        bs = ids.shape[0]
        if state is None:
            state = [(torch.zeros(bs, hs, dtype=torch.float64),) * 2 for hs in sizes]
        state = [tuple(fit_state(s[None], bs)[0] for s in st) for st in state]
        # EmbeddingDropout: whole rows, padding_idx 1 gets no gradient
        w = p["0.encoder.weight"] * t(d, "m%d_emb" % k)[:, None]
        x = F.embedding(ids, w, padding_idx=1)
        x = x * t(d, "m%d_in" % k)[:, None, :]
        new_state = []
        for l in range(nl):
            pre = "0.rnns.%d." % l
            whh = p[pre + "weight_hh_l0_raw"] * t(d, "m%d_w%d" % (k, l))
            x, h, c = lstm_steps(x, state[l][0], state[l][1], p[pre + "module.weight_ih_l0"], whh,
                                 p[pre + "module.bias_ih_l0"], p[pre + "module.bias_hh_l0"])
            new_state.append((h.detach(), c.detach()))
            if l < nl - 1:
                x = x * t(d, "m%d_h%d" % (k, l))[:, None, :]
        state = new_state
        dec_in = x * t(d, "m%d_out" % k)[:, None, :]
        logits = dec_in @ p["0.encoder.weight"].t() + p["1.decoder.bias"]
        loss = F.cross_entropy(logits.reshape(-1, v), tgt.reshape(-1))
        loss.backward()
        common.put(d, "logits%d" % k, logits.detach().numpy())
        common.put(d, "loss%d" % k, loss.detach().reshape(1).numpy())
    for name in names:
        common.put(d, "g_" + name, p[name].grad.numpy())


def main():
    torch.set_num_threads(1)
    d = common.folder()
    mode = sys.argv[2]
    args = [int(a) for a in sys.argv[3:]]
    if mode == "lstm":
        run_lstm(d, *args)
    elif mode == "lm":
        run_lm(d, *args)
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
