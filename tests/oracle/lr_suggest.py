"""fastai's lr_find suggestion functions (callback/schedule.py: valley, slide, minimum, steep) on
a recorded curve. Usage: lr_suggest.py DIR num_it  (reads lrs, losses; writes suggest.f32 =
[valley, slide, minimum, steep])."""
import sys

import numpy as np

from common import get, put


def valley(lrs, losses):
    n = len(losses)
    max_start, max_end = 0, 0
    lds = [1] * n
    for i in range(1, n):
        for j in range(0, i):
            if losses[i] < losses[j] and lds[i] < lds[j] + 1:
                lds[i] = lds[j] + 1
            if lds[max_end] < lds[i]:
                max_end = i
                max_start = max_end - lds[max_end]
    sections = (max_end - max_start) / 3
    idx = max_start + int(sections) + int(sections / 2)
    return float(lrs[idx])


def slide(lrs, losses, lr_diff=15, thresh=.005, adjust_value=1.):
    loss_grad = np.gradient(losses)
    r_idx = -1
    l_idx = r_idx - lr_diff
    local_min_lr = lrs[l_idx]
    while (l_idx >= -len(losses)) and (abs(loss_grad[r_idx] - loss_grad[l_idx]) > thresh):
        local_min_lr = lrs[l_idx]
        r_idx -= 1
        l_idx -= 1
    return float(local_min_lr) * adjust_value


def minimum(lrs, losses):
    return float(lrs[np.argmin(losses)]) / 10


def steep(lrs, losses):
    grads = (losses[1:] - losses[:-1]) / (np.log(lrs[1:]) - np.log(lrs[:-1]))
    return float(lrs[np.argmin(grads)])


def main():
    d, num_it = sys.argv[1], int(sys.argv[2])
    lrs = get(d, "lrs").astype(np.float64)
    losses = get(d, "losses").astype(np.float64)
    lrs, losses = lrs[num_it // 10:-5], losses[num_it // 10:-5]
    try:
        sl = slide(lrs, losses)
    except IndexError:  # fastai's slide fails on curves shorter than lr_diff + 1 points
        sl = float("nan")
    put(d, "suggest", [valley(lrs, losses), sl, minimum(lrs, losses), steep(lrs, losses)])


main()
