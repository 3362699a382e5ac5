"""Oracle for tests/test_metrics.c and the progress/CSV formatting in tests/test_progress.c.

metrics.py DIR class K      pred (N, C), targ (N), pad (N), splits -> values: fastai's AvgMetric
                            (accuracy, error_rate, top_k_accuracy) batch by batch, then sklearn's
                            macro precision / recall / f1 (zero_division 0, labels = those seen
                            in targets or predictions) written out by hand.
metrics.py DIR binary       pred (N, C) with C 1 (one logit: > 0) or 2 (argmax), targ, pad ->
                            binary precision / recall / f1 with pos_label 1.
metrics.py DIR regression   pred (N, T), targ (N, T), pad, splits -> mse, mae (AvgMetric batch by
                            batch) and _rmse (AccumMetric over everything).
metrics.py DIR pyfloat      x (n, float64 written as pairs of float32 bits) -> repr of each, one a
                            line in DIR/pyfloat.txt
metrics.py DIR clip         g (n), max_norm (1) -> out: torch.nn.utils.clip_grad_norm_ applied to
                            g as the .grad of one parameter (the norm over all of them).
metrics.py DIR table        names.txt, values (E, V), times (E) -> table.txt in fastprogress's
                            console table format and history.csv as fastai's CSVLogger writes it.
Padding rows (pad != 0) are dropped before anything is computed.
"""
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from common import get, put  # noqa: E402


def batches(d, n):
    splits = [int(s) for s in get(d, "splits")]
    assert sum(splits) == n
    out, start = [], 0
    for s in splits:
        out.append((start, start + s))
        start += s
    return out


def avg_metric(fn, pred, targ, keep, spans):
    """fastai's AvgMetric: total += fn(pred, targ) * bs; count += bs (padding removed)."""
    total, count = 0.0, 0
    for a, b in spans:
        k = keep[a:b]
        p, t = pred[a:b][k], targ[a:b][k]
        bs = p.shape[0]
        if bs == 0:
            continue
        total += float(fn(p, t)) * bs
        count += bs
    return total / count


def accuracy(inp, targ):
    return (inp.argmax(dim=-1) == targ).float().mean()


def top_k_accuracy(k):
    def f(inp, targ):
        top = inp.topk(k=k, dim=-1)[1]
        t = targ.unsqueeze(dim=-1).expand_as(top)
        return (top == t).sum(dim=-1).float().mean()
    return f


def prf(y_true, y_pred, labels):
    """Per-label precision, recall, f1 with zero_division 0."""
    out = []
    for c in labels:
        tp = int(np.sum((y_true == c) & (y_pred == c)))
        fp = int(np.sum((y_true != c) & (y_pred == c)))
        fn = int(np.sum((y_true == c) & (y_pred != c)))
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        out.append((p, r, f))
    return np.array(out)


def py_repr_lines(d):
    raw = get(d, "x")  # float32 pairs holding float64 bits
    xs = np.frombuffer(raw.astype("<f4").tobytes(), dtype="<f8")
    with open(os.path.join(d, "pyfloat.txt"), "w") as f:
        for x in xs:
            f.write(repr(float(x)) + "\n")


def format_time(t):
    t = int(t)
    h, m, s = t // 3600, (t // 60) % 60, t % 60
    if h != 0:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m:02d}:{s:02d}"


def table(d):
    with open(os.path.join(d, "names.txt")) as f:
        names = f.read().split()
    epochs = [int(e) for e in get(d, "epochs")]
    raw = get(d, "values")
    values = np.frombuffer(raw.astype("<f4").tobytes(), dtype="<f8").reshape(len(epochs), -1)
    rawt = get(d, "times")
    times = np.frombuffer(rawt.astype("<f4").tobytes(), dtype="<f8")
    # fastprogress ConsoleMasterBar.write(table=True), fed by ProgressCallback._write_stats
    lines = []
    padded = [n + " " * (8 - len(n)) if len(n) < 8 else n for n in names]
    lines.append("  ".join(padded))
    csv = [",".join(names)]
    for e, row in enumerate(values):
        log = [epochs[e]] + [float(v) for v in row] + [format_time(times[e])]
        cells = [f"{v:.6f}" if isinstance(v, float) else str(v) for v in log]
        text = ""
        for t, name in zip(cells, padded):
            # fastprogress pads with " " * (2 + len(name) - len(t)), which is nothing for a value
            # wider than its column; corefit keeps one space there (README: where corefit
            # differs), so the reference does too
            text += t + " " * max(1, 2 + len(name) - len(t))
        lines.append(text)
        csv.append(",".join(str(t) for t in log))
    with open(os.path.join(d, "table.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(d, "history.csv"), "w") as f:
        f.write("\n".join(csv) + "\n")


def main():
    d, mode = sys.argv[1], sys.argv[2]
    if mode == "pyfloat":
        return py_repr_lines(d)
    if mode == "table":
        return table(d)
    if mode == "clip":
        p = torch.nn.Parameter(torch.zeros(get(d, "g").shape))
        p.grad = torch.tensor(get(d, "g"))
        torch.nn.utils.clip_grad_norm_([p], float(get(d, "max_norm")[0]), 2.0)
        return put(d, "out", p.grad.numpy())
    pred = torch.tensor(get(d, "pred"))
    targ = torch.tensor(get(d, "targ"))
    keep = torch.tensor(get(d, "pad")) == 0
    if mode == "class":
        k = int(sys.argv[3])
        targ = targ.long()
        spans = batches(d, pred.shape[0])
        acc = avg_metric(accuracy, pred, targ, keep, spans)
        err = avg_metric(lambda p, t: 1 - accuracy(p, t), pred, targ, keep, spans)
        topk = avg_metric(top_k_accuracy(k), pred, targ, keep, spans)
        y_true = targ[keep].numpy()
        y_pred = pred[keep].argmax(dim=-1).numpy()
        labels = np.unique(np.concatenate([y_true, y_pred]))
        macro = prf(y_true, y_pred, labels).mean(axis=0)
        put(d, "out", np.array([acc, err, topk, *macro], dtype=np.float64))
    elif mode == "binary":
        targ = targ.long()
        y_true = targ[keep].numpy()
        p = pred[keep]
        y_pred = (p[:, 0] > 0).long().numpy() if p.shape[1] == 1 else p.argmax(dim=-1).numpy()
        put(d, "out", prf(y_true, y_pred, [1])[0])
    elif mode == "regression":
        spans = batches(d, pred.shape[0])
        mse = avg_metric(lambda p, t: F.mse_loss(p.double(), t.double()), pred, targ, keep, spans)
        mae = avg_metric(lambda p, t: torch.abs(p.double() - t.double()).mean(), pred, targ, keep,
                         spans)
        rmse = torch.sqrt(F.mse_loss(pred[keep].double(), targ[keep].double())).item()
        put(d, "out", np.array([mse, mae, rmse], dtype=np.float64))
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
