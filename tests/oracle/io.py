"""safetensors oracle for tests/test_io.c, with json + numpy only (the safetensors package is not
installed), following https://huggingface.co/docs/safetensors.

usage:
  io.py DIR read FILE     parse FILE written by corefit; write every tensor as t_<name>.f32 (I64
                          converted to float) and DIR/read.txt: one line "name dtype shape" per
                          tensor in header order, then "meta key value" lines. Asserts the layout
                          rules: 8-byte little-endian length, JSON object, data area starting at a
                          multiple of 8 and covered exactly by the tensors.
  io.py DIR write FILE    write FILE the way the reference implementation does (tensors sorted by
                          dtype alignment then name, header padded with spaces to 8 bytes) from
                          a.f32 (F32 tensor), b.f32 (written as I64) and c.f32 (F32 scalar), with
                          metadata {"format": "pt", "source": "numpy"}.
  io.py DIR torch FILE ARCH
                          load FILE (without its "opt." entries) into the torch module equivalent
                          to test_io.c's model ARCH ("small": conv/bn/linear; "mini_resnet": W1, the
                          mini-resnet, built here from its description with corefit's state_dict
                          names) with load_state_dict(strict=True), run it in eval mode on x.f32,
                          write y.f32.
"""
import json
import os
import struct
import sys

import numpy as np

from common import get, put

DTYPES = {"F32": "<f4", "I64": "<i8", "F64": "<f8", "F16": "<f2", "I32": "<i4", "U8": "u1"}


def parse(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header length past the end"
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    assert isinstance(header, dict)
    meta = header.pop("__metadata__", {})
    data = raw[8 + n :]
    assert (8 + n) % 8 == 0, "data area not aligned to 8 bytes"
    tensors = {}
    spans = []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dt = np.dtype(DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        assert end - begin == count * dt.itemsize, name
        tensors[name] = (info["dtype"], np.frombuffer(data[begin:end], dtype=dt).reshape(shape))
        spans.append((begin, end))
    spans.sort()
    at = 0
    for b, e in spans:
        assert b == at, "gap or overlap at %d" % b
        at = e
    assert at == len(data), "data area not covered"
    return header, meta, tensors


def cmd_read(d, path):
    header, meta, tensors = parse(path)
    with open(os.path.join(d, "read.txt"), "w") as out:
        for name in header:
            dtype, a = tensors[name]
            out.write("%s %s %s\n" % (name, dtype, ",".join(str(s) for s in a.shape)))
            put(d, "t_" + name, a.astype(np.float32))
        for k, v in meta.items():
            out.write("meta %s %s\n" % (k, v))


def cmd_write(d, path):
    tensors = {
        "a": get(d, "a").astype("<f4"),
        "b": get(d, "b").astype("<i8"),
        "c": np.asarray(get(d, "c"), dtype="<f4").reshape(()),
    }
    names = sorted(tensors, key=lambda k: (-tensors[k].dtype.itemsize, k))
    header = {"__metadata__": {"format": "pt", "source": "numpy"}}
    at = 0
    blobs = []
    for k in names:
        a = tensors[k]
        b = a.tobytes()
        header[k] = {
            "dtype": "I64" if a.dtype.kind == "i" else "F32",
            "shape": list(a.shape),
            "data_offsets": [at, at + len(b)],
        }
        at += len(b)
        blobs.append(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def mini_resnet():
    """W1: stem, two residual blocks, fastai's concat-pool head (names as corefit's tree)."""
    import torch
    import torch.nn as nn

    class Residual(nn.Module):
        def __init__(self, ni, nf):
            super().__init__()
            self.convpath = nn.Sequential(
                nn.Conv2d(ni, nf, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(nf),
                nn.ReLU(),
                nn.Conv2d(nf, nf, 3, padding=1, bias=False),
                nn.BatchNorm2d(nf),
            )
            self.idpath = nn.Sequential(nn.Conv2d(ni, nf, 1, stride=2, bias=False), nn.BatchNorm2d(nf))

        def forward(self, x):
            return torch.relu(self.convpath(x) + self.idpath(x))

    class ConcatPool(nn.Module):
        def forward(self, x):
            return torch.cat([nn.functional.adaptive_max_pool2d(x, 1), nn.functional.adaptive_avg_pool2d(x, 1)], 1)

    body = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), Residual(16, 32), Residual(32, 64)
    )
    head = nn.Sequential(
        ConcatPool(),
        nn.Flatten(),
        nn.BatchNorm1d(128),
        nn.Dropout(0.25),
        nn.Linear(128, 256, bias=False),
        nn.ReLU(),
        nn.BatchNorm1d(256),
        nn.Dropout(0.5),
        nn.Linear(256, 10, bias=False),
    )
    return nn.Sequential(body, head)


def cmd_torch(d, path, arch):
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    _, _, tensors = parse(path)
    state = {k: torch.tensor(a.copy()) for k, (_, a) in tensors.items() if not k.startswith("opt.")}
    model = mini_resnet() if arch == "mini_resnet" else nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 6, 3, stride=2, padding=1, bias=True),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 4 * 4, 10),
        nn.BatchNorm1d(10),
        nn.Linear(10, 5),
    )
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        y = model(torch.tensor(get(d, "x")))
    put(d, "y", y.numpy())


def main():
    d, cmd, path = sys.argv[1], sys.argv[2], sys.argv[3]
    {"read": cmd_read, "write": cmd_write, "torch": cmd_torch}[cmd](d, path, *sys.argv[4:])


if __name__ == "__main__":
    main()
