"""Expected tabular processing (fastai's Categorify, FillMissing(median), Normalize) of a CSV,
computed independently with Python's csv module and numpy, for test_data_readers.c.
Usage: data_tabular.py <dir> <csv> <cat,names> <cont,names> <target> <valid rows>"""
import csv
import sys

import numpy as np

from common import folder, put

NA = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
      "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}


def num(s):
    try:
        return float(s.strip())
    except ValueError:
        return None


def sorted_vocab(values):
    vals = sorted(set(v for v in values if v not in NA))
    if all(num(v) is not None for v in vals):
        vals.sort(key=lambda v: (num(v), v))
    return vals


def main():
    d = folder()
    path, cats, conts, target, valid = sys.argv[2:7]
    cats = [c for c in cats.split(",") if c]
    conts = [c for c in conts.split(",") if c]
    valid = [int(v) for v in valid.split(",") if v]
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], [r for r in rows[1:] if r]
    col = {n: header.index(n) for n in header[::-1]}
    train = [i for i in range(len(rows)) if i not in valid]
    parts = {"train": train, "valid": valid}
    vocab = {c: ["#na#"] + sorted_vocab([rows[i][col[c]] for i in train]) for c in cats}
    stats, flags = {}, []
    for c in conts:
        tv = [rows[i][col[c]].strip() for i in train]
        have = np.array([float(v) for v in tv if v not in NA])
        med = float(np.median(have))
        filled = np.array([float(v) if v not in NA else med for v in tv])
        stats[c] = (med, filled.mean(), filled.std() + 1e-7)
        if any(v in NA for v in tv):
            flags.append(c)
    yvocab = sorted_vocab([rows[i][col[target]] for i in train])
    for name, idx in parts.items():
        xs, ys = [], []
        for i in idx:
            r = rows[i]
            x = []
            for c in cats:
                v = r[col[c]]
                x.append(vocab[c].index(v) if v in vocab[c][1:] else 0)
            for c in flags:
                x.append(2 if r[col[c]].strip() in NA else 1)
            for c in conts:
                med, mu, sd = stats[c]
                v = r[col[c]].strip()
                x.append(((float(v) if v not in NA else med) - mu) / sd)
            xs.append(x)
            ys.append(yvocab.index(r[col[target]]))
        put(d, name + "_x", np.array(xs, dtype=np.float64))
        put(d, name + "_y", np.array(ys))
    put(d, "cardinality", np.array([len(vocab[c]) for c in cats] + [3] * len(flags)))


main()
