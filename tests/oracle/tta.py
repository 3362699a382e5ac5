"""Oracle for tests/test_tta.c: fastai's Learner.tta blend of the passes' probabilities.

usage: tta.py DIR BETA      plain (n, C) and aug (passes, n, C) ->
                            blend = torch.lerp(aug.mean(0), plain, BETA)   (fastai's default)
                            blend_max = torch.stack([plain, aug.max(0)[0]], 0).max(0)[0]  (use_max)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    d, beta = sys.argv[1], float(sys.argv[2])
    plain, aug = common.tensor(d, "plain"), common.tensor(d, "aug")
    common.put(d, "blend", torch.lerp(aug.mean(0), plain, beta).numpy())
    common.put(d, "blend_max", torch.stack([plain, aug.max(0)[0]], 0).max(0)[0].numpy())


if __name__ == "__main__":
    main()
