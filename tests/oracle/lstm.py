"""Oracle for tests/test_lstm.c: PyTorch's nn.LSTM and a PyTorch implementation of fastai's
AWD-LSTM language model (fastai/text/models/awdlstm.py, core.py) run on the C test's weights and
dropout masks, in float64.

usage: lstm.py DIR lstm I H N      nn.LSTM(I, H, batch_first) over batches x<k>, dy<k> (k < N) with
                                   the state carried and detached (and cut or zero-padded when a
                                   batch has another size); outputs y<k>, dx<k>, g_<param>
       lstm.py DIR lm V E NH L N [ALPHA BETA]
                                   the language model over batches x<k> (ids) and t<k> (targets)
                                   with masks m<k>_emb, m<k>_in, m<k>_w<l>, m<k>_h<l>, m<k>_out;
                                   and the RNNRegularizer's AR/TAR (alpha, beta) added to the
                                   loss back-propagated; outputs logits<k>, loss<k> (cross-entropy),
                                   reg<k>, g_<param>
       lstm.py DIR clas V E NH L BPTT MAX_LEN N D1 .. Dn
                                   fastai's text classifier (SentenceEncoder, masked_concat_pool,
                                   PoolingLinearClassifier with dims [3E, D1, .., Dn]) over
                                   batches x<k> (ids padded in front), t<k> (classes), with masks
                                   b<k>c<c>_emb, _in, _w<l>, _h<l> for chunk c and b<k>_hd<i> for
                                   the head's dropouts; outputs logits<k>, loss<k>, g_<param>
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


def run_lm(d, v, e, nh, nl, n, alpha=0.0, beta=0.0):
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
        # fastai's RNNRegularizer on (raw_out, out) = (x, dec_in)
        reg = alpha * dec_in.pow(2).mean() + beta * (x[:, 1:] - x[:, :-1]).pow(2).mean()
        (loss + reg).backward()
        common.put(d, "logits%d" % k, logits.detach().numpy())
        common.put(d, "loss%d" % k, loss.detach().reshape(1).numpy())
        common.put(d, "reg%d" % k, reg.detach().reshape(1).numpy())
    for name in names:
        common.put(d, "g_" + name, p[name].grad.numpy())


def masked_concat_pool(output, mask, bptt):
    """fastai/text/models/core.py, verbatim."""
    lens = output.shape[1] - mask.long().sum(dim=1)
    last_lens = mask[:, -bptt:].long().sum(dim=1)
    avg_pool = output.masked_fill(mask[:, :, None], 0).sum(dim=1)
    avg_pool.div_(lens.type(avg_pool.dtype)[:, None])
    max_pool = output.masked_fill(mask[:, :, None], -float("inf")).max(dim=1)[0]
    return torch.cat([output[torch.arange(0, output.size(0)), -last_lens - 1], max_pool, avg_pool],
                     1)


def run_clas(d, v, e, nh, nl, bptt, max_len, n, *head):
    dims = [3 * e] + list(head)
    names = ["0.module.encoder.weight"]
    for l in range(nl):
        pre = "0.module.rnns.%d." % l
        names += [pre + "weight_hh_l0_raw", pre + "module.weight_ih_l0",
                  pre + "module.bias_ih_l0", pre + "module.bias_hh_l0"]
    for i in range(len(dims) - 1):
        names += ["1.layers.%d.0.weight" % i, "1.layers.%d.0.bias" % i, "1.layers.%d.2.weight" % i]
    p = {name: t(d, "p_" + name).requires_grad_(True) for name in names}
    sizes = [nh if l < nl - 1 else e for l in range(nl)]
    for k in range(n):
        ids = torch.tensor(common.get(d, "x%d" % k)).long()
        tgt = torch.tensor(common.get(d, "t%d" % k)).long()
        bs, sl = ids.shape
        # SentenceEncoder.forward: reset, then the chunks
        state = [(torch.zeros(0, hs, dtype=torch.float64),) * 2 for hs in sizes]
        mask = ids == 1
        outs, masks = [], []
        for c, i in enumerate(range(0, sl, bptt)):
            real_bs = int((ids[:, i] != 1).long().sum())
            inp = ids[:real_bs, i:min(i + bptt, sl)]
            state = [tuple(fit_state(s[None], real_bs)[0] for s in st) for st in state]
            pre = "b%dc%d_" % (k, c)
            w = p["0.module.encoder.weight"] * t(d, pre + "emb")[:, None]
            x = F.embedding(inp, w, padding_idx=1) * t(d, pre + "in")[:, None, :]
            new_state = []
            for l in range(nl):
                q = "0.module.rnns.%d." % l
                whh = p[q + "weight_hh_l0_raw"] * t(d, pre + "w%d" % l)
                x, h, cc = lstm_steps(x, state[l][0], state[l][1], p[q + "module.weight_ih_l0"],
                                      whh, p[q + "module.bias_ih_l0"], p[q + "module.bias_hh_l0"])
                new_state.append((h.detach(), cc.detach()))
                if l < nl - 1:
                    x = x * t(d, pre + "h%d" % l)[:, None, :]
            state = new_state
            if sl - i <= max_len:
                outs.append(torch.cat([x, x.new_zeros(bs - real_bs, *x.shape[1:])], 0))
                masks.append(mask[:, i:min(i + bptt, sl)])
        out = torch.cat(outs, 1)
        h = masked_concat_pool(out, torch.cat(masks, 1), bptt)
        for i in range(len(dims) - 1):
            h = F.batch_norm(h, None, None, p["1.layers.%d.0.weight" % i],
                             p["1.layers.%d.0.bias" % i], training=True, eps=1e-5)
            h = h * t(d, "b%d_hd%d" % (k, i))
            h = h @ p["1.layers.%d.2.weight" % i].t()
            if i < len(dims) - 2:
                h = F.relu(h)
        loss = F.cross_entropy(h, tgt)
        loss.backward()
        common.put(d, "logits%d" % k, h.detach().numpy())
        common.put(d, "loss%d" % k, loss.detach().reshape(1).numpy())
    for name in names:
        common.put(d, "g_" + name, p[name].grad.numpy())


def main():
    torch.set_num_threads(1)
    d = common.folder()
    mode = sys.argv[2]
    args = [float(a) if "." in a else int(a) for a in sys.argv[3:]]
    if mode == "lstm":
        run_lstm(d, *args)
    elif mode == "lm":
        run_lm(d, *args)
    elif mode == "clas":
        run_clas(d, *args)
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
