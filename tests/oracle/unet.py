"""fastai's U-Net layers for tests/test_unet.c, written out from fastai/layers.py,
fastai/vision/models/unet.py and fastai/callback/hook.py (fastai itself is not a Debian package).

    unet.py DIR mode=shuffle scale=S           nn.PixelShuffle on DIR/x
    unet.py DIR mode=psicnr ni= nf= blur=0|1   PixelShuffle_ICNR with corefit's weights
    unet.py DIR mode=unet n_out= h= w= train=0|1 [arch=resnet18] [sa=0|1]
                                               DynamicUnet(create_body(resnet), n_out, (h, w),
                                               self_attention=sa)
    unet.py DIR mode=sa c= train=0|1           SelfAttention(c); also writes the spectral norms'
                                               u and v after the forward (u<k>, v<k>)
    unet.py --serve                            the above, one request line ("DIR ARGS...") at
                                               a time from stdin, one reply line each

corefit writes its parameters in state_dict order (p<i>.f32) and their names (names.txt); the
script checks that the names are fastai's, loads the values, runs x forward in float64 and
float32 and L = sum(out * r) backward, and writes out, dx, g<i> (the gradient of the i-th
trainable entry, in state_dict order) and torch_err (PyTorch's own float32 error: the output's,
dx's, then each gradient's)."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# ---- fastai/layers.py ----


def init_default(m, func=nn.init.kaiming_normal_):
    if func and hasattr(m, 'weight'): func(m.weight)
    with torch.no_grad():
        if getattr(m, 'bias', None) is not None: m.bias.fill_(0.)
    return m


def cond_init(m, func):
    if (not isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))) and any(p.requires_grad for p in m.parameters(recurse=False)):
        init_default(m, func)


def apply_init(m, func=nn.init.kaiming_normal_):
    for mod in m.modules():
        cond_init(mod, func)


def BatchNorm(nf):
    bn = nn.BatchNorm2d(nf)
    with torch.no_grad():
        bn.bias.fill_(1e-3)
        bn.weight.fill_(1.)
    return bn


class ConvLayer(nn.Sequential):
    "fastai's ConvLayer with norm_type None (the U-Net decoder's): conv with bias, then act."
    def __init__(self, ni, nf, ks=3, stride=1, padding=None, act_cls=nn.ReLU, bias_std=0.01, xtra=None):
        if padding is None: padding = (ks - 1) // 2
        conv = nn.Conv2d(ni, nf, kernel_size=ks, stride=stride, padding=padding, bias=True)
        act = None if act_cls is None else act_cls()
        if act_cls is not None: nn.init.kaiming_uniform_(conv.weight)
        with torch.no_grad():
            if bias_std != 0: conv.bias.normal_(0, bias_std)
            else: conv.bias.zero_()
        layers = [conv]
        if act is not None: layers.append(act)
        if xtra: layers.append(xtra)
        super().__init__(*layers)


def icnr_init(x, scale=2, init=nn.init.kaiming_normal_):
    ni, nf, h, w = x.shape
    ni2 = int(ni / (scale ** 2))
    k = init(x.new_zeros([ni2, nf, h, w])).transpose(0, 1)
    k = k.contiguous().view(ni2, nf, -1)
    k = k.repeat(1, 1, scale ** 2)
    return k.contiguous().view([nf, ni, h, w]).transpose(0, 1)


class PixelShuffle_ICNR(nn.Sequential):
    def __init__(self, ni, nf=None, scale=2, blur=False, act_cls=nn.ReLU):
        super().__init__()
        nf = nf if nf is not None else ni
        layers = [ConvLayer(ni, nf * (scale ** 2), ks=1, act_cls=act_cls, bias_std=0),
                  nn.PixelShuffle(scale)]
        with torch.no_grad():
            layers[0][0].weight.copy_(icnr_init(layers[0][0].weight.data))
        if blur: layers += [nn.ReplicationPad2d((1, 0, 1, 0)), nn.AvgPool2d(2, stride=1)]
        super().__init__(*layers)


class ResBlock(nn.Module):
    "ResBlock(1, ni, nf) with norm_type None, stride 1 (the U-Net's last cross)."
    def __init__(self, expansion, ni, nf, act_cls=nn.ReLU, ks=3):
        super().__init__()
        nf, ni = nf * expansion, ni * expansion
        convpath = [ConvLayer(ni, nf, ks, act_cls=act_cls), ConvLayer(nf, nf, ks, act_cls=None)]
        self.convpath = nn.Sequential(*convpath)
        idpath = []
        if ni != nf: raise NotImplementedError
        self.idpath = nn.Sequential(*idpath)
        self.act = act_cls()

    def forward(self, x): return self.act(self.convpath(x) + self.idpath(x))


class MergeLayer(nn.Module):
    def __init__(self, dense=False):
        super().__init__()
        self.dense = dense

    def forward(self, x): return torch.cat([x, x.orig], dim=1) if self.dense else (x + x.orig)


class SequentialEx(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        res = x
        for l in self.layers:
            res.orig = x
            nres = l(res)
            res.orig, nres.orig = None, None
            res = nres
        return res


class SelfAttention(nn.Module):
    "fastai's SelfAttention: 1x1 Conv1d query/key/value under spectral_norm (ConvLayer with norm_type Spectral, no act, no bias)."
    def __init__(self, n_channels):
        super().__init__()
        self.query, self.key, self.value = [self._conv(n_channels, c) for c in (n_channels // 8, n_channels // 8, n_channels)]
        self.gamma = nn.Parameter(torch.tensor([0.]))

    def _conv(self, n_in, n_out):
        conv = nn.Conv1d(n_in, n_out, kernel_size=1, bias=False)
        return nn.Sequential(nn.utils.spectral_norm(conv))

    def forward(self, x):
        size = x.size()
        x = x.view(*size[:2], -1)
        f, g, h = self.query(x), self.key(x), self.value(x)
        beta = F.softmax(torch.bmm(f.transpose(1, 2), g), dim=1)
        o = self.gamma * torch.bmm(h, beta) + x
        return o.view(*size).contiguous()


class SigmoidRange(nn.Module):
    def __init__(self, low, high):
        super().__init__()
        self.low, self.high = low, high

    def forward(self, x): return torch.sigmoid(x) * (self.high - self.low) + self.low

# ---- fastai/callback/hook.py ----


class Hook:
    def __init__(self, m, detach=True):
        self.stored, self.detach = None, detach
        self.hook = m.register_forward_hook(self.hook_fn)

    def hook_fn(self, module, input, output):
        self.stored = output.detach() if self.detach else output


def hook_outputs(modules, detach=True): return [Hook(m, detach) for m in modules]


def in_channels(m):
    for l in m.modules():
        if getattr(l, 'weight', None) is not None and l.weight.ndim == 4: return l.weight.shape[1]


def dummy_eval(m, size=(64, 64)):
    ch_in = in_channels(m)
    x = next(m.parameters()).new(1, ch_in, *size).requires_grad_(False).uniform_(-1., 1.)
    with torch.no_grad(): return m.eval()(x)


def model_sizes(m, size=(64, 64)):
    hooks = hook_outputs(list(m.children()), detach=True)
    dummy_eval(m, size=size)
    sizes = [o.stored.shape for o in hooks]
    for h in hooks: h.hook.remove()
    return sizes

# ---- fastai/vision/models/unet.py ----


def _get_sz_change_idxs(sizes):
    feature_szs = [size[-1] for size in sizes]
    sz_chg_idxs = [i for i in range(len(feature_szs) - 1) if feature_szs[i] != feature_szs[i + 1]]
    return sz_chg_idxs


class UnetBlock(nn.Module):
    def __init__(self, up_in_c, x_in_c, hook, final_div=True, blur=False, act_cls=nn.ReLU,
                 self_attention=False, init=nn.init.kaiming_normal_):
        super().__init__()
        self.hook = hook
        self.shuf = PixelShuffle_ICNR(up_in_c, up_in_c // 2, blur=blur, act_cls=act_cls)
        self.bn = BatchNorm(x_in_c)
        ni = up_in_c // 2 + x_in_c
        nf = ni if final_div else ni // 2
        self.conv1 = ConvLayer(ni, nf, act_cls=act_cls)
        self.conv2 = ConvLayer(nf, nf, act_cls=act_cls, xtra=SelfAttention(nf) if self_attention else None)
        self.relu = act_cls()
        apply_init(nn.Sequential(self.conv1, self.conv2), init)

    def forward(self, up_in):
        s = self.hook.stored
        up_out = self.shuf(up_in)
        ssh = s.shape[-2:]
        if ssh != up_out.shape[-2:]:
            up_out = F.interpolate(up_out, s.shape[-2:], mode='nearest')
        cat_x = self.relu(torch.cat([up_out, self.bn(s)], dim=1))
        return self.conv2(self.conv1(cat_x))


class ResizeToOrig(nn.Module):
    def __init__(self, mode='nearest'):
        super().__init__()
        self.mode = mode

    def forward(self, x):
        if x.orig.shape[-2:] != x.shape[-2:]:
            x = F.interpolate(x, x.orig.shape[-2:], mode=self.mode)
        return x


class DynamicUnet(SequentialEx):
    def __init__(self, encoder, n_out, img_size, blur=False, blur_final=True, self_attention=False,
                 y_range=None, last_cross=True, bottle=False, act_cls=nn.ReLU,
                 init=nn.init.kaiming_normal_):
        imsize = img_size
        sizes = model_sizes(encoder, size=imsize)
        sz_chg_idxs = list(reversed(_get_sz_change_idxs(sizes)))
        sfs = hook_outputs([encoder[i] for i in sz_chg_idxs], detach=False)
        x = dummy_eval(encoder, imsize).detach()

        ni = sizes[-1][1]
        middle_conv = nn.Sequential(ConvLayer(ni, ni * 2, act_cls=act_cls),
                                    ConvLayer(ni * 2, ni, act_cls=act_cls)).eval()
        x = middle_conv(x)
        layers = [encoder, BatchNorm(ni), nn.ReLU(), middle_conv]

        for i, idx in enumerate(sz_chg_idxs):
            not_final = i != len(sz_chg_idxs) - 1
            up_in_c, x_in_c = int(x.shape[1]), int(sizes[idx][1])
            do_blur = blur and (not_final or blur_final)
            sa = self_attention and (i == len(sz_chg_idxs) - 3)
            unet_block = UnetBlock(up_in_c, x_in_c, sfs[i], final_div=not_final, blur=do_blur,
                                   self_attention=sa, act_cls=act_cls, init=init).eval()
            layers.append(unet_block)
            x = unet_block(x)

        ni = x.shape[1]
        if imsize != sizes[0][-2:]: layers.append(PixelShuffle_ICNR(ni, act_cls=act_cls))
        layers.append(ResizeToOrig())
        if last_cross:
            layers.append(MergeLayer(dense=True))
            ni += in_channels(encoder)
            layers.append(ResBlock(1, ni, ni // 2 if bottle else ni, act_cls=act_cls))
        layers += [ConvLayer(ni, n_out, ks=1, act_cls=None)]
        apply_init(nn.Sequential(layers[3], layers[-2]), init)
        if y_range is not None: layers.append(SigmoidRange(*y_range))
        super().__init__(*layers)
        self.sfs = sfs

# ---- the oracle ----


def load(model, d):
    with open(os.path.join(d, "names.txt")) as f:
        names = f.read().split()
    sd = model.state_dict()
    if list(sd.keys()) != names:
        mine = list(sd.keys())
        for i, (a, b) in enumerate(zip(mine, names)):
            if a != b:
                sys.exit("parameter %d: fastai has %s, corefit %s" % (i, a, b))
        sys.exit("fastai has %d entries, corefit %d" % (len(mine), len(names)))
    with torch.no_grad():
        for i, name in enumerate(names):
            sd[name].copy_(torch.tensor(common.get(d, "p%d" % i)).reshape(sd[name].shape))


def run(build, d, dtype, train):
    torch.manual_seed(0)
    m = build()
    load(m, d)
    m = m.to(dtype)
    m.train(train)
    x = torch.tensor(common.get(d, "x"), dtype=dtype, requires_grad=True)
    r = torch.tensor(common.get(d, "r"), dtype=dtype)
    out = m(x)
    run.last = m
    (out * r).sum().backward()
    grads = [p.grad.detach().double() for p in m.parameters()]
    return out.detach().double(), x.grad.detach().double(), grads


def main():
    d = common.folder()
    args = dict(a.split("=", 1) for a in sys.argv[2:])
    mode = args["mode"]
    if mode == "shuffle":
        s = int(args["scale"])
        x = common.tensor(d, "x", requires_grad=True).double()
        x.retain_grad()
        y = nn.PixelShuffle(s)(x)
        (y * common.tensor(d, "r").double()).sum().backward()
        common.put(d, "out", y.detach().numpy())
        common.put(d, "dx", x.grad.numpy())
        return
    if mode == "psicnr":
        ni, nf, blur = int(args["ni"]), int(args["nf"]), args["blur"] == "1"
        build = lambda: PixelShuffle_ICNR(ni, nf, blur=blur)  # noqa: E731
        train = True
    elif mode == "resconv":
        c = int(args["c"])
        build = lambda: nn.Sequential(ResBlock(1, c, c), ConvLayer(c, 3, ks=1, act_cls=None))  # noqa: E731
        train = True
    elif mode == "sa":
        c = int(args["c"])
        build = lambda: SelfAttention(c)  # noqa: E731
        train = args["train"] == "1"
    elif mode == "unet":
        n_out, h, w = int(args["n_out"]), int(args["h"]), int(args["w"])
        arch = args.get("arch", "resnet18")
        sa = args.get("sa", "0") == "1"

        def build():
            body = nn.Sequential(*list(getattr(torchvision.models, arch)().children())[:-2])
            return DynamicUnet(body, n_out, (h, w), self_attention=sa)
        train = args["train"] == "1"
    else:
        sys.exit("mode " + mode)
    out, dx, grads = run(build, d, torch.float64, train)
    if mode == "sa":  # the power iteration's buffers after the float64 forward
        for k, conv in enumerate((run.last.query[0], run.last.key[0], run.last.value[0])):
            common.put(d, "u%d" % k, conv.weight_u.detach().numpy())
            common.put(d, "v%d" % k, conv.weight_v.detach().numpy())
    out32, dx32, grads32 = run(build, d, torch.float32, train)
    common.put(d, "out", out.numpy())
    common.put(d, "dx", dx.numpy())
    err = [float((out - out32).abs().max()), float((dx - dx32).abs().max())]
    for i, (g, g32) in enumerate(zip(grads, grads32)):
        common.put(d, "g%d" % i, g.numpy().reshape(-1))
        err.append(float((g - g32).abs().max()))
    common.put(d, "torch_err", err)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:  # one process for many requests (oracle_serve_begin)
        common.serve(main)
    else:
        main()
