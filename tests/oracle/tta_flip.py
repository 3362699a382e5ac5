"""Oracle for tests/test_cli_recipe.c: corefit train --tta's flip test-time augmentation, in
PyTorch. Loads a fast-cnn model file corefit wrote into bench/fast_torch.py's model, normalises
the first N test images of the IDX folder with the file's statistics, and writes the plain
accuracy and the accuracy with each image predicted plain and mirrored (probabilities averaged):
"plain P tta T" on stdout.

usage: tta_flip.py MODEL IDX_DIR N
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import fast_torch  # noqa: E402
import importlib.util  # noqa: E402

spec = importlib.util.spec_from_file_location("oracle_io", os.path.join(HERE, "io.py"))
oracle_io = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oracle_io)
import w1_torch  # noqa: E402


def main():
    torch.set_num_threads(1)
    model_path, data, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    _, meta, tensors = oracle_io.parse(model_path)
    norm = json.loads(meta["corefit.normalize"])
    model = fast_torch.build_model()
    state = {k: torch.from_numpy(v.copy()) for k, (_, v) in tensors.items()}
    model.load_state_dict(state)
    model.eval()
    x = w1_torch.read_idx(os.path.join(data, "t10k-images-idx3-ubyte.gz"))[:n].astype(np.float32) / 255.0
    y = torch.from_numpy(w1_torch.read_idx(os.path.join(data, "t10k-labels-idx1-ubyte.gz"))[:n].astype(np.int64))
    x = torch.from_numpy(((x - norm["mean"][0]) / norm["std"][0]).reshape(-1, 1, 28, 28))
    with torch.no_grad():
        p = model(x).softmax(1)
        q = model(x.flip(3)).softmax(1)
    plain = (p.argmax(1) == y).float().mean().item()
    tta = ((p + q).argmax(1) == y).float().mean().item()
    print("plain %.6f tta %.6f" % (plain, tta))


main()
