#!/usr/bin/env python3
"""Converts a PyTorch checkpoint (.pth, e.g. torchvision's resnet18-f37072fd.pth) into a
safetensors file that corefit's cf_resnet_load_pretrained reads.

    corefit-convert-pth resnet18-f37072fd.pth resnet18.safetensors
    (in a source tree: python3 tools/convert_pth.py ...)

then: corefit train --images DIR --pretrained resnet18.safetensors --schedule fine-tune

Accepts a plain state_dict or a checkpoint holding one under "state_dict", "model" or
"model_state". Floating-point tensors are written as F32 (F16, BF16 and F64 converted), integer
ones as I64; names are kept as they are (corefit maps torchvision's and timm's names itself).
Uses the `safetensors` package when it is installed, otherwise writes the format directly
(an 8-byte little-endian header length, a JSON header, the raw little-endian data).
"""
import json
import os
import struct
import sys


def _unwrap(obj):
    for key in ("state_dict", "model", "model_state"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            return obj[key]
    return obj


def _tensors(state):
    import torch

    out = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            continue
        t = t.detach().cpu().contiguous()
        if t.is_floating_point():
            t = t.to(torch.float32)
        else:
            t = t.to(torch.int64)
        out[name] = t
    return out


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: torch tensor (float32 or int64)} as safetensors, atomically."""
    import torch

    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        dtype = "F32" if t.dtype == torch.float32 else "I64"
        raw = t.numpy().astype("<f4" if dtype == "F32" else "<i8").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def convert(src, dst):
    import torch

    state = _unwrap(torch.load(src, map_location="cpu"))
    if not isinstance(state, dict):
        raise SystemExit("%s: not a state_dict (a %s)" % (src, type(state).__name__))
    tensors = _tensors(state)
    if not tensors:
        raise SystemExit("%s: no tensors found" % src)
    try:
        from safetensors.torch import save_file
    except ImportError:
        write_safetensors(dst, tensors, {"format": "pt"})
    else:
        save_file(tensors, dst, metadata={"format": "pt"})
    return len(tensors)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: %s IN.pth OUT.safetensors" % argv[0], file=sys.stderr)
        return 2
    n = convert(argv[1], argv[2])
    print("%s: %d tensors written" % (argv[2], n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
