"""torchvision's ResNets for tests/test_resnet.c.

    resnet.py DIR depth=18 mode=train|eval layout=body|full [variant=tv|timm|missing|pth]

Builds torchvision.models.resnet<depth>(num_classes=10) with random weights (BatchNorm affine
parameters and running statistics randomised too), writes them to DIR/weights.safetensors
(variant tv: torchvision's names; timm: a "module." prefix and no num_batches_tracked, as
timm's hub files; missing: layer3.1.bn2.running_var left out; pth: saved with torch.save and
converted by tools/convert_pth.py), then runs fastai's cut body (layout body:
Sequential(*children[:-2])) or the whole model on DIR/x.f32 in float64 and float32, and writes
L = sum(out * r)'s reference: out, g<i> (gradient of the i-th state_dict entry, or b<i>, the
buffer after the step), torch_err (PyTorch's own float32 error per entry, then the output's)
and torch_names.txt."""
import os
import subprocess
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import common  # noqa: E402
import convert_pth  # noqa: E402

d = common.folder()
args = dict(a.split("=", 1) for a in sys.argv[2:])
depth = int(args["depth"])
mode = args["mode"]
layout = args["layout"]
variant = args.get("variant", "tv")

torch.manual_seed(depth)
model = getattr(torchvision.models, "resnet%d" % depth)(num_classes=10)
g = torch.Generator().manual_seed(depth + 1)
with torch.no_grad():
    for name, t in model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            t.fill_(3)
        elif "bn" in name or "downsample.1" in name:
            u = torch.rand(t.shape, generator=g)
            if name.endswith("weight") or name.endswith("running_var"):
                t.copy_(0.5 + u)
            else:
                t.copy_(0.4 * u - 0.2)

state = model.state_dict()
path = os.path.join(d, "weights.safetensors")
if variant == "pth":
    pth = os.path.join(d, "weights.pth")
    torch.save({"state_dict": state}, pth)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(convert_pth.__file__),
                                                 "convert_pth.py"), pth, path], check=True,
                   stdout=subprocess.DEVNULL)
else:
    tensors = {}
    for name, t in state.items():
        if variant == "timm" and name.endswith("num_batches_tracked"):
            continue
        if variant == "missing" and name == "layer3.1.bn2.running_var":
            continue
        tensors[("module." if variant == "timm" else "") + name] = t
    convert_pth.write_safetensors(path, convert_pth._tensors(tensors), {"format": "pt"})


def run(dtype):
    m = getattr(torchvision.models, "resnet%d" % depth)(num_classes=10)
    m.load_state_dict(state)
    net = torch.nn.Sequential(*list(m.children())[:-2]) if layout == "body" else m
    net = net.to(dtype)
    net.train(mode == "train")
    x = torch.tensor(common.get(d, "x"), dtype=dtype)
    r = torch.tensor(common.get(d, "r"), dtype=dtype)
    out = net(x)
    (out * r).sum().backward()
    sd = net.state_dict(keep_vars=True)
    vals = []
    for name, t in sd.items():
        if t.requires_grad:
            vals.append(t.grad.detach().double())
        else:
            vals.append(t.detach().double())
    return list(sd.keys()), vals, out.detach().double()


names, ref, out = run(torch.float64)
_, ref32, out32 = run(torch.float32)
common.put(d, "out", out.numpy())
sd = dict(zip(names, ref))
err = []
for i, name in enumerate(names):
    kind = "b" if name.endswith(("running_mean", "running_var", "num_batches_tracked")) else "g"
    common.put(d, "%s%d" % (kind, i), ref[i].numpy().reshape(-1))
    err.append(float((ref[i] - ref32[i]).abs().max()))
err.append(float((out - out32).abs().max()))
common.put(d, "torch_err", err)
with open(os.path.join(d, "torch_names.txt"), "w") as f:
    f.write("\n".join(names) + "\n")
