#!/usr/bin/python3
"""Writes W3's image folder: RGB JPEGs of assorted sizes in fastai's layout, made from
Fashion-MNIST without any download.

    /usr/bin/python3 bench/make_images.py --out build/w3-images [--train-per-class 300]
        [--valid-per-class 60] [--seed 42] [--data /usr/share/datasets/fashion-mnist]

OUT/train/<class>/NNNNN.jpg and OUT/valid/<class>/NNNNN.jpg (fastai's GrandparentSplitter
layout), 10 classes named after Fashion-MNIST's. Each image takes one Fashion-MNIST item (the
first N of each class: training items from the training file, validation items from the test
file), upscales it to a random size, tints it with a random colour and lays it at a random
place on a random colour gradient with noise; width and height are drawn independently in
[--min-size, --max-size] (128-160 px). Colours and placement do not depend on the class, so the
shape is what a model has to learn. Every draw comes from (seed, split, index): the same
arguments give the same files, byte for byte (PIL's JPEG encoder, quality 90).

The folder is written under a temporary name and renamed when complete; OUT/w3.json records
the arguments (bench/run.py regenerates the folder when it is missing or differs).
"""
import argparse
import gzip
import json
import os
import shutil
import sys

CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"]
DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    import numpy as np

    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def make_image(item, rng, lo, hi):
    """One RGB image (H, W, 3 uint8) from a 28x28 Fashion-MNIST item."""
    import numpy as np
    from PIL import Image

    w, h = int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1))
    # background: a linear gradient between two random colours at a random angle, plus noise
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    ang = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    t = (np.cos(ang) * xx / w + np.sin(ang) * yy / h + 1) / 2
    t = np.clip(t, 0, 1)[..., None]
    bg = c0 * (1 - t) + c1 * t + rng.normal(0, 8, (h, w, 3))
    # the item: upscaled to 60-90% of the shorter side, at a random place, in a random colour
    s = int(rng.uniform(0.6, 0.9) * min(w, h))
    a = np.asarray(Image.fromarray(item).resize((s, s), Image.BICUBIC), dtype=np.float32) / 255.0
    a = np.clip(a, 0, 1)
    x0, y0 = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
    fg = rng.uniform(0, 255, 3)
    shade = (0.55 + 0.45 * a)[..., None] * fg  # keeps the item's inner texture
    alpha = np.clip(1.3 * a, 0, 1)[..., None]
    patch = bg[y0 : y0 + s, x0 : x0 + s]
    bg[y0 : y0 + s, x0 : x0 + s] = patch * (1 - alpha) + shade * alpha
    return np.clip(bg + 0.5, 0, 255).astype(np.uint8)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default=DATA, help="Fashion-MNIST's IDX files")
    ap.add_argument("--train-per-class", type=int, default=300)
    ap.add_argument("--valid-per-class", type=int, default=60)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--min-size", type=int, default=128)
    ap.add_argument("--max-size", type=int, default=160)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--force", action="store_true", help="rewrite the folder even when it matches")
    a = ap.parse_args()
    import numpy as np
    from PIL import Image

    params = {"train_per_class": a.train_per_class, "valid_per_class": a.valid_per_class, "seed": a.seed,
              "min_size": a.min_size, "max_size": a.max_size, "quality": a.quality, "version": 1}
    marker = os.path.join(a.out, "w3.json")
    if not a.force and os.path.exists(marker):
        with open(marker) as f:
            if json.load(f).get("params") == params:
                print(f"make_images: {a.out} is up to date")
                return 0
    if not (16 <= a.min_size <= a.max_size):
        sys.exit("make_images: need 16 <= --min-size <= --max-size")
    tmp = a.out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    counts = {}
    for split_id, (split, pre, per) in enumerate([("train", "train", a.train_per_class), ("valid", "t10k", a.valid_per_class)]):
        x = read_idx(os.path.join(a.data, f"{pre}-images-idx3-ubyte.gz"))
        y = read_idx(os.path.join(a.data, f"{pre}-labels-idx1-ubyte.gz"))
        for c, name in enumerate(CLASSES):
            idx = np.flatnonzero(y == c)[:per]
            if len(idx) < per:
                sys.exit(f"make_images: {pre}: only {len(idx)} items of class {c}")
            d = os.path.join(tmp, split, name)
            os.makedirs(d)
            for j, i in enumerate(idx):
                rng = np.random.default_rng([a.seed, split_id, int(i)])
                img = make_image(x[i], rng, a.min_size, a.max_size)
                Image.fromarray(img, "RGB").save(os.path.join(d, f"{int(i):05d}.jpg"), quality=a.quality)
            counts[f"{split}/{name}"] = len(idx)
    with open(os.path.join(tmp, "w3.json"), "w") as f:
        json.dump({"params": params, "classes": CLASSES, "counts": counts}, f, indent=1)
    shutil.rmtree(a.out, ignore_errors=True)
    os.rename(tmp, a.out)
    n_tr, n_va = 10 * a.train_per_class, 10 * a.valid_per_class
    print(f"make_images: wrote {n_tr} training and {n_va} validation images to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
