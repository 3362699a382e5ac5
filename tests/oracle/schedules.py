"""fastai's schedule formulas (callback/schedule.py) evaluated the way the fit loop reaches them:
pct_train starts at epoch/n_epoch in before_train and grows by 1/(n_iter*n_epoch) per batch.
Usage: schedules.py DIR kind n_epoch n_iter n_groups params...  -> DIR/lr.f32 (batches x groups),
DIR/mom.f32 (batches).
       schedules.py DIR formulas start end n  -> DIR/sched_{lin,cos,no,exp}.f32: each formula at
the positions DIR/pos.f32 (n values)."""
import math
import sys

import numpy as np

from common import get, put


def sched_lin(s, e, p): return s + p * (e - s)


def sched_cos(s, e, p): return s + (1 + math.cos(math.pi * (1 - p))) * (e - s) / 2


def sched_no(s, e, p): return s


def sched_exp(s, e, p): return s * (e / s) ** p


def combine(pcts, scheds, pos):
    P = np.cumsum([0.0] + list(pcts))
    idx = max(i for i in range(len(P)) if pos >= P[i])
    idx = min(idx, len(P) - 2)
    return scheds[idx]((pos - P[idx]) / (P[idx + 1] - P[idx]))


def combined_cos(pct, start, middle, end):
    return lambda pos: combine([pct, 1 - pct], [lambda p: sched_cos(start, middle, p),
                                                lambda p: sched_cos(middle, end, p)], pos)


def even_mults(start, stop, n):
    if n == 1: return [stop]
    mult = stop / start
    step = mult ** (1 / (n - 1))
    return [start * step ** i for i in range(n)]


def lr_groups(start, stop, n):
    if start > 0: return even_mults(start, stop, n)
    return [stop / 10] * (n - 1) + [stop]


def positions(n_epoch, n_iter):
    out = []
    for epoch in range(n_epoch):
        pct = epoch / n_epoch
        for _ in range(n_iter):
            out.append(pct)
            pct += 1 / (n_iter * n_epoch)
    return out


def main():
    d, kind = sys.argv[1], sys.argv[2]
    if kind == "formulas":
        start, end = float(sys.argv[3]), float(sys.argv[4])
        pos = [float(p) for p in get(d, "pos")]
        for name, f in (("lin", sched_lin), ("cos", sched_cos), ("no", sched_no),
                        ("exp", sched_exp)):
            put(d, "sched_" + name, np.array([f(start, end, p) for p in pos]))
        return
    n_epoch, n_iter, n_groups = map(int, sys.argv[3:6])
    a = [float(x) for x in sys.argv[6:]]
    pos = positions(n_epoch, n_iter)
    moms = None
    if kind == "one_cycle":  # start stop pct div div_final mom0 mom1 mom2
        start, stop, pct, div, div_final = a[:5]
        lrs = lr_groups(start, stop, n_groups)
        scheds = [combined_cos(pct, l / div, l, l / div_final) for l in lrs]
        mom = combined_cos(pct, a[5], a[6], a[7])
        moms = [mom(p) for p in pos]
    elif kind == "flat_cos":  # start stop pct div_final
        start, stop, pct, div_final = a[:4]
        lrs = lr_groups(start, stop, n_groups)
        scheds = [combined_cos(pct, l, l, l / div_final) for l in lrs]
    elif kind == "sgdr":  # start stop n_cycles cycle_len cycle_mult
        start, stop = a[:2]
        n_cycles, cycle_len, mult = int(a[2]), int(a[3]), int(a[4])
        total = cycle_len * (mult ** n_cycles - 1) // (mult - 1)
        pcts = [cycle_len * mult ** i / total for i in range(n_cycles)]
        lrs = lr_groups(start, stop, n_groups)
        scheds = [(lambda l: lambda p: combine(pcts, [lambda q: sched_cos(l, 0, q)] * n_cycles, p))(l)
                  for l in lrs]
    else:
        raise SystemExit("unknown kind " + kind)
    put(d, "lr", np.array([[s(p) for s in scheds] for p in pos], dtype=np.float64))
    if moms is not None:
        put(d, "mom", np.array(moms))


main()
