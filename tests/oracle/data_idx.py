"""Independent read of Fashion-MNIST's IDX files with gzip + numpy: labels, the training-set pixel
mean and a few images, for test_data_fmnist.c. Usage: data_idx.py <dir> <dataset folder>"""
import gzip
import os
import struct
import sys

import numpy as np

from common import folder, put


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    assert zero == 0 and dtype == 8
    dims = struct.unpack(">%dI" % ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data[4 + 4 * ndim:], dtype=np.uint8).reshape(dims)


def main():
    d, src = folder(), sys.argv[2]
    for part in ("train", "t10k"):
        images = read_idx(os.path.join(src, part + "-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(src, part + "-labels-idx1-ubyte.gz"))
        put(d, part + "_labels", labels.astype(np.float32))
        put(d, part + "_count", np.array([images.shape[0], images.shape[1], images.shape[2]]))
        pix = images.astype(np.float64) / 255.0
        put(d, part + "_mean", np.array([pix.mean()]))
        put(d, part + "_some", (images[[0, 1, 12345 % images.shape[0], -1]] / 255.0).astype(np.float32))


main()
