"""Oracle for tests/test_models.c: builds corefit's zoo models in PyTorch exactly as fastai builds
them (fastai's layers.py / xresnet.py / vision learner.py / tabular model.py, re-stated here in
plain torch because fastai is not installed), loads corefit's state by name, runs one forward and
backward of L = sum(out * r), and writes back what PyTorch computed.

usage: models.py DIR MODEL key=value ...
  MODEL: w1 | xresnet | simple_cnn | tabular | head | emb_sz_rule
  common keys: mode=train|eval
Inputs in DIR: names.txt (corefit's parameter names, one a line), s<i>.f32 (corefit's state, in
that order), x.f32, r.f32. Outputs, computed in float64: torch_names.txt (state_dict keys in
order), out.f32, g<i>.f32 (gradient of each trainable entry of names.txt), b<i>.f32 (each buffer
after the forward); torch_err.f32 (for each entry, then the output: the largest absolute error of
PyTorch's own float32 run against float64); nweights.f32 / nbuffers.f32 (element counts).
"""
import copy
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- fastai's layers ---------------------------------------------------------------------------


class Flatten(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1)


class AdaptiveConcatPool2d(nn.Module):
    def __init__(self, size=None):
        super().__init__()
        self.size = size or 1
        self.ap = nn.AdaptiveAvgPool2d(self.size)
        self.mp = nn.AdaptiveMaxPool2d(self.size)

    def forward(self, x):
        return torch.cat([self.mp(x), self.ap(x)], 1)


class SigmoidRange(nn.Module):
    def __init__(self, low, high):
        super().__init__()
        self.low, self.high = low, high

    def forward(self, x):
        return torch.sigmoid(x) * (self.high - self.low) + self.low


def BatchNorm(nf, ndim=2, zero=False):
    bn = nn.BatchNorm1d(nf) if ndim == 1 else nn.BatchNorm2d(nf)
    bn.bias.data.fill_(1e-3)
    bn.weight.data.fill_(0.0 if zero else 1.0)
    return bn


class LinBnDrop(nn.Sequential):
    def __init__(self, n_in, n_out, bn=True, p=0.0, act=None, lin_first=False):
        layers = [BatchNorm(n_out if lin_first else n_in, ndim=1)] if bn else []
        if p != 0:
            layers.append(nn.Dropout(p))
        lin = [nn.Linear(n_in, n_out, bias=not bn)]
        if act is not None:
            lin.append(act)
        layers = lin + layers if lin_first else layers + lin
        super().__init__(*layers)


class ConvLayer(nn.Sequential):
    """fastai's ConvLayer with norm_type Batch/BatchZero/None and act ReLU or None."""

    def __init__(self, ni, nf, ks=3, stride=1, norm=True, zero=False, act=True):
        padding = (ks - 1) // 2
        conv = nn.Conv2d(ni, nf, kernel_size=ks, bias=not norm, stride=stride, padding=padding)
        layers = [conv]
        act_bn = []
        if act:
            act_bn.append(nn.ReLU())
        if norm:
            act_bn.append(BatchNorm(nf, zero=zero))
        act_bn.reverse()  # bn_1st
        layers += act_bn
        super().__init__(*layers)


class ResBlock(nn.Module):
    def __init__(self, expansion, ni, nf, stride=1):
        super().__init__()
        nh2 = nf
        nh1 = nh2
        nf, ni = nf * expansion, ni * expansion
        if expansion == 1:
            convpath = [ConvLayer(ni, nh2, 3, stride=stride),
                        ConvLayer(nh2, nf, 3, zero=True, act=False)]
        else:
            convpath = [ConvLayer(ni, nh1, 1),
                        ConvLayer(nh1, nh2, 3, stride=stride),
                        ConvLayer(nh2, nf, 1, zero=True, act=False)]
        self.convpath = nn.Sequential(*convpath)
        idpath = []
        if ni != nf:
            idpath.append(ConvLayer(ni, nf, 1, act=False))
        if stride != 1:
            idpath.insert(0, nn.AvgPool2d(stride, ceil_mode=True))
        self.idpath = nn.Sequential(*idpath)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.convpath(x) + self.idpath(x))


class XResNet(nn.Sequential):
    def __init__(self, expansion, layers, c_in=3, n_out=1000, p=0.0):
        stem_szs = [c_in, 32, 32, 64]
        stem = [ConvLayer(stem_szs[i], stem_szs[i + 1], 3, stride=2 if i == 0 else 1)
                for i in range(3)]
        block_szs = [64 // expansion, 64, 128, 256, 512]
        blocks = [nn.Sequential(*[ResBlock(expansion, block_szs[i] if j == 0 else block_szs[i + 1],
                                           block_szs[i + 1], stride=(1 if i == 0 else 2) if j == 0 else 1)
                                  for j in range(l)])
                  for i, l in enumerate(layers)]
        super().__init__(*stem, nn.MaxPool2d(kernel_size=3, stride=2, padding=1), *blocks,
                         nn.AdaptiveAvgPool2d(1), Flatten(), nn.Dropout(p),
                         nn.Linear(block_szs[-1] * expansion, n_out))


def create_head(nf, n_out, lin_ftrs=None, ps=0.5, pool=True, concat_pool=True, first_bn=True,
                bn_final=False, lin_first=False, y_range=None):
    if pool and concat_pool:
        nf *= 2
    lin_ftrs = [nf, 512, n_out] if lin_ftrs is None else [nf] + lin_ftrs + [n_out]
    bns = [first_bn] + [True] * len(lin_ftrs[1:])
    ps = list(ps) if isinstance(ps, (list, tuple)) else [ps]
    if len(ps) == 1:
        ps = [ps[0] / 2] * (len(lin_ftrs) - 2) + ps
    actns = [nn.ReLU(inplace=True)] * (len(lin_ftrs) - 2) + [None]
    layers = []
    if pool:
        layers += [AdaptiveConcatPool2d() if concat_pool else nn.AdaptiveAvgPool2d(1), Flatten()]
    if lin_first:
        layers.append(nn.Dropout(ps.pop(0)))
    for ni, no, bn, p, actn in zip(lin_ftrs[:-1], lin_ftrs[1:], bns, ps, actns):
        layers += LinBnDrop(ni, no, bn=bn, p=p, act=actn, lin_first=lin_first)
    if lin_first:
        layers.append(nn.Linear(lin_ftrs[-2], n_out))
    if bn_final:
        layers.append(nn.BatchNorm1d(lin_ftrs[-1], momentum=0.01))
    if y_range is not None:
        layers.append(SigmoidRange(*y_range))
    return nn.Sequential(*layers)


class SimpleCNN(nn.Sequential):
    def __init__(self, filters, kernel_szs=None, strides=None, bn=True):
        nl = len(filters) - 1
        kernel_szs = kernel_szs or [3] * nl
        strides = strides or [2] * nl
        layers = [ConvLayer(filters[i], filters[i + 1], kernel_szs[i], stride=strides[i],
                            norm=bn and i < nl - 1) for i in range(nl)]
        layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), Flatten()))
        super().__init__(*layers)


def emb_sz_rule(n_cat):
    return min(600, round(1.6 * n_cat ** 0.56))


class TabularModel(nn.Module):
    def __init__(self, emb_szs, n_cont, out_sz, layers, ps=None, embed_p=0.0, y_range=None,
                 use_bn=True, bn_final=False, bn_cont=True, lin_first=True):
        super().__init__()
        ps = ps if ps is not None else [0] * len(layers)
        if not isinstance(ps, list):
            ps = [ps] * len(layers)
        self.embeds = nn.ModuleList([nn.Embedding(ni, nf) for ni, nf in emb_szs])
        self.emb_drop = nn.Dropout(embed_p)
        self.bn_cont = nn.BatchNorm1d(n_cont) if bn_cont else None
        n_emb = sum(e.embedding_dim for e in self.embeds)
        self.n_emb, self.n_cont = n_emb, n_cont
        sizes = [n_emb + n_cont] + layers + [out_sz]
        act = nn.ReLU(inplace=True)
        actns = [act for _ in range(len(sizes) - 2)] + [None]
        _layers = [LinBnDrop(sizes[i], sizes[i + 1], bn=use_bn and (i != len(actns) - 1 or bn_final),
                             p=p, act=a, lin_first=lin_first)
                   for i, (p, a) in enumerate(zip(ps + [0.0], actns))]
        if y_range is not None:
            _layers.append(SigmoidRange(*y_range))
        self.layers = nn.Sequential(*_layers)

    def forward(self, x_cat, x_cont=None):
        if self.n_emb != 0:
            x = [e(x_cat[:, i]) for i, e in enumerate(self.embeds)]
            x = torch.cat(x, 1)
            x = self.emb_drop(x)
        if self.n_cont != 0:
            if self.bn_cont is not None:
                x_cont = self.bn_cont(x_cont)
            x = torch.cat([x, x_cont], 1) if self.n_emb != 0 else x_cont
        return self.layers(x)


# ---- corefit's W1 ------------------------------------------------------------------------------


class MiniBlock(nn.Module):
    def __init__(self, ni, nf):
        super().__init__()
        self.convpath = nn.Sequential(nn.Conv2d(ni, nf, 3, 2, 1, bias=False), nn.BatchNorm2d(nf),
                                      nn.ReLU(), nn.Conv2d(nf, nf, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(nf))
        self.idpath = nn.Sequential(nn.Conv2d(ni, nf, 1, 2, 0, bias=False), nn.BatchNorm2d(nf))

    def forward(self, x):
        return F.relu(self.convpath(x) + self.idpath(x))


# ---- arguments and building ----------------------------------------------------------------------


def ints(s):
    return [int(v) for v in s.split(",")] if s else []


def floats(s):
    return [float(v) for v in s.split(",")] if s else []


def head_kwargs(a):
    kw = {}
    if "lin_ftrs" in a:
        kw["lin_ftrs"] = ints(a["lin_ftrs"])
    if "ps" in a:
        ps = floats(a["ps"])
        kw["ps"] = ps if len(ps) > 1 else ps[0]
    for k in ("pool", "concat_pool", "first_bn", "bn_final", "lin_first"):
        if k in a:
            kw[k] = a[k] == "1"
    if "y_range" in a:
        kw["y_range"] = tuple(floats(a["y_range"]))
    return kw


def build(kind, a):
    n_out = int(a.get("n_out", "10"))
    if kind == "w1":
        c_in = int(a.get("c_in", "1"))
        body = nn.Sequential(nn.Conv2d(c_in, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                             nn.ReLU(), MiniBlock(16, 32), MiniBlock(32, 64))
        kw = {"lin_ftrs": [256], "ps": [0.25, 0.5]}
        kw.update(head_kwargs(a))
        return nn.Sequential(body, create_head(64, n_out, **kw))
    if kind == "xresnet":
        depth = int(a["depth"])
        expansion, layers = {18: (1, [2, 2, 2, 2]), 34: (1, [3, 4, 6, 3]),
                             50: (4, [3, 4, 6, 3])}[depth]
        xr = XResNet(expansion, layers, c_in=int(a.get("c_in", "3")), n_out=1000)
        if a.get("small") == "1":
            xr[0][0].stride = (1, 1)
        body = nn.Sequential(*list(xr.children())[:-4])  # vision_learner's cut for xresnet
        return nn.Sequential(body, create_head(512 * expansion, n_out, **head_kwargs(a)))
    if kind == "simple_cnn":
        return SimpleCNN(ints(a["filters"]), ints(a.get("ks")) or None,
                         ints(a.get("strides")) or None, bn=a.get("bn", "1") == "1")
    if kind == "tabular":
        cards = ints(a.get("cards"))
        dims = ints(a.get("dims")) or [emb_sz_rule(c) for c in cards]
        kw = {}
        if "ps" in a:
            ps = floats(a["ps"])
            kw["ps"] = ps if len(ps) > 1 else ps[0]
        if "embed_p" in a:
            kw["embed_p"] = float(a["embed_p"])
        for k in ("use_bn", "bn_final", "bn_cont", "lin_first"):
            if k in a:
                kw[k] = a[k] == "1"
        if "y_range" in a:
            kw["y_range"] = tuple(floats(a["y_range"]))
        n_cont = int(a.get("n_cont", "0"))
        if n_cont == 0:
            kw["bn_cont"] = False  # corefit leaves bn_cont out without continuous columns
        m = TabularModel(list(zip(cards, dims)), n_cont, n_out, ints(a.get("layers", "200,100")),
                         **kw)
        m.n_cat = len(cards)
        return m
    if kind == "head":
        return create_head(int(a["nf"]), n_out, **head_kwargs(a))
    raise SystemExit("unknown model " + kind)


def run(model, kind, x):
    if kind == "tabular":
        n_cat = model.n_cat
        return model(x[:, :n_cat].long(), x[:, n_cat:])
    return model(x)


def main():
    d = common.folder()
    kind = sys.argv[2]
    a = dict(kv.split("=", 1) for kv in sys.argv[3:])
    if kind == "emb_sz_rule":
        n = int(a["n"])
        common.put(d, "rule", [emb_sz_rule(i) for i in range(1, n + 1)])
        return
    model = build(kind, a)
    sd = model.state_dict()
    keys = list(sd.keys())
    with open(os.path.join(d, "torch_names.txt"), "w") as f:
        f.write("".join(k + "\n" for k in keys))
    with open(os.path.join(d, "names.txt")) as f:
        names = [line.rstrip("\n") for line in f if line.strip()]
    missing = [n for n in names if n not in sd]
    if missing:
        print("models.py: corefit names not in torch's state_dict:", missing[:10], file=sys.stderr)
        sys.exit(3)
    new_sd = {}
    for i, n in enumerate(names):
        v = torch.tensor(common.get(d, "s%d" % i))
        if sd[n].dim() == 0 and v.numel() == 1:  # num_batches_tracked: corefit stores (1)
            v = v.reshape(())
        if tuple(v.shape) != tuple(sd[n].shape):
            print("models.py: %s has shape %s in corefit, %s in torch" %
                  (n, tuple(v.shape), tuple(sd[n].shape)), file=sys.stderr)
            sys.exit(3)
        new_sd[n] = v.to(sd[n].dtype)
    model.load_state_dict(new_sd, strict=len(names) == len(keys))
    x = common.tensor(d, "x")
    r = common.tensor(d, "r")
    train = a.get("mode", "train") == "train"
    # The reference is float64 (the exact answer both float32 implementations approximate);
    # PyTorch's own float32 error against it is reported so the test can tell rounding (as
    # large in PyTorch as in corefit, e.g. BatchNorm over a handful of values) from a bug.
    m32 = copy.deepcopy(model)
    model.double()
    results = {}
    for m, dt in ((model, torch.float64), (m32, torch.float32)):
        m.train(train)
        out = run(m, kind, x.to(dt))
        (out * r.to(dt)).sum().backward()
        params = dict(m.named_parameters())
        state = m.state_dict()
        vals = []
        for n in names:
            if n in params:
                g = params[n].grad
                vals.append(torch.zeros(params[n].shape, dtype=dt) if g is None else g.detach())
            else:
                vals.append(state[n].to(dt))
        vals.append(out.detach())
        results[dt] = vals
    ref, f32 = results[torch.float64], results[torch.float32]
    for i, n in enumerate(names):
        common.put(d, ("g%d" if n in dict(model.named_parameters()) else "b%d") % i,
                   ref[i].float().numpy())
    common.put(d, "out", ref[-1].float().numpy())
    common.put(d, "torch_err", [(a32.double() - a64).abs().max().item() if a64.numel() else 0.0
                                for a32, a64 in zip(f32, ref)])
    common.put(d, "nweights", [sum(p.numel() for p in model.parameters())])
    common.put(d, "nbuffers", [sum(b.numel() for b in model.buffers())])


if __name__ == "__main__":
    main()
