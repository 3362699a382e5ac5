"""Optimizer oracle: replays the optimizer steps of tests/test_optim.c.

usage: optim.py DIR CASE...   For each case prefix P the test wrote
  P_w0    (n_weights)             initial flat weight block
  P_grads (steps, n_weights)      the gradient of every step
  P_meta  (n_params, 5)           offset, numel, group, do_wd, trainable of each parameter
  P_cfg   (4)                     kind (0 SGD, 1 Adam), decouple_wd, steps, n_groups
  P_hyp   (steps, n_groups, 5)    lr, mom, sqr_mom, eps, wd of each group at each step
and this script writes
  P_formula  the weights after all steps by fastai's formulas, in float64 (optimizer.py)
  P_torch    the weights after all steps by the equivalent torch.optim optimizer, when one
             exists: SGD(momentum, weight_decay) for SGD with L2, AdamW for Adam with decoupled
             weight decay, Adam(weight_decay) for Adam with L2. SGD with decoupled weight decay
             has no torch twin (unless no parameter decays).
"""
import sys

import numpy as np

from common import get, put


def formula(w0, grads, meta, kind, decouple, hyp):
    w = w0.astype(np.float64).copy()
    grad_avg = np.zeros_like(w)
    sqr_avg = np.zeros_like(w)
    steps = np.zeros(len(meta))
    for s in range(grads.shape[0]):
        for k, (off, n, group, do_wd, trainable) in enumerate(meta):
            if not trainable:
                continue
            sl = slice(int(off), int(off) + int(n))
            lr, mom, sqr_mom, eps, wd = hyp[s, int(group)].astype(np.float64)
            p = w[sl]
            g = grads[s, sl].astype(np.float64).copy()
            if do_wd and wd != 0:
                if decouple:
                    p *= 1 - lr * wd
                else:
                    g += wd * p
            if kind == 0:  # SGD
                if mom != 0:
                    grad_avg[sl] = mom * grad_avg[sl] + g
                    p -= lr * grad_avg[sl]
                else:
                    p -= lr * g
            else:  # Adam
                grad_avg[sl] = mom * grad_avg[sl] + (1 - mom) * g
                sqr_avg[sl] = sqr_mom * sqr_avg[sl] + (1 - sqr_mom) * g * g
                steps[k] += 1
                debias1 = 1 - mom ** steps[k]
                debias2 = 1 - sqr_mom ** steps[k]
                p -= (lr / debias1) * grad_avg[sl] / (np.sqrt(sqr_avg[sl] / debias2) + eps)
    return w


def with_torch(w0, grads, meta, kind, decouple, hyp):
    import torch

    torch.set_num_threads(1)
    w = torch.tensor(w0.astype(np.float32))
    params, groups = [], []
    for off, n, group, do_wd, trainable in meta:
        if not trainable:
            continue
        p = torch.nn.Parameter(w[int(off) : int(off) + int(n)].clone())
        params.append((p, int(off), int(n), int(group), bool(do_wd)))
        groups.append({"params": [p]})

    def set_hypers(opt, s):
        for pg, (_, _, _, group, do_wd) in zip(opt.param_groups, params):
            lr, mom, sqr_mom, eps, wd = [float(v) for v in hyp[s, group]]
            pg["lr"] = lr
            pg["weight_decay"] = wd if do_wd else 0.0
            if kind == 0:
                pg["momentum"] = mom
            else:
                pg["betas"] = (mom, sqr_mom)
                pg["eps"] = eps

    if kind == 0:
        opt = torch.optim.SGD(groups, lr=1.0, momentum=float(hyp[0, 0, 1]))
    elif decouple:
        opt = torch.optim.AdamW(groups, lr=1.0)
    else:
        opt = torch.optim.Adam(groups, lr=1.0)
    for s in range(grads.shape[0]):
        set_hypers(opt, s)
        for p, off, n, _, _ in params:
            p.grad = torch.tensor(grads[s, off : off + n].astype(np.float32))
        opt.step()
    out = w.clone()
    with torch.no_grad():
        for p, off, n, _, _ in params:
            out[off : off + n] = p
    return out.numpy()


def main():
    d = sys.argv[1]
    for case in sys.argv[2:]:
        w0 = get(d, case + "_w0")
        grads = get(d, case + "_grads")
        meta = get(d, case + "_meta")
        cfg = get(d, case + "_cfg")
        kind, decouple, steps, n_groups = (int(v) for v in cfg)
        hyp = get(d, case + "_hyp").reshape(steps, n_groups, 5)
        grads = grads.reshape(steps, -1)
        meta = meta.reshape(-1, 5)
        put(d, case + "_formula", formula(w0, grads, meta, kind, decouple, hyp))
        any_decay = any(m[3] and m[4] for m in meta) and hyp[:, :, 4].any()
        if kind == 1 or not decouple or not any_decay:
            put(d, case + "_torch", with_torch(w0, grads, meta, kind, decouple, hyp))


if __name__ == "__main__":
    main()
