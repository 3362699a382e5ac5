"""fastai's text batches, written from the formulas of fastai's LMDataLoader, SortedDL and
pad_input_chunk (fastai/text/data.py), with corefit's random generator (xoshiro256** seeded
through splitmix64; Fisher-Yates with rejection sampling) for the random draws, so that the
batches can be compared exactly. Reads <dir>/corpus.txt (one document a line: label, then ids)
and <dir>/got.txt (what corefit made, one run per 'cfg' line); exits 1 at the first difference.
"""
import sys

M64 = (1 << 64) - 1


class Rng:
    def __init__(self, seed):
        st = seed & M64
        self.s = []
        for _ in range(4):
            st = (st + 0x9E3779B97F4A7C15) & M64
            z = st
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    def next(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M64
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):
        if n <= 1:
            return 0
        limit = M64 - (M64 % n)
        while True:
            x = self.next()
            if x < limit:
                return x % n

    def shuffle(self, a):
        for i in range(len(a) - 1, 0, -1):
            j = self.below(i + 1)
            a[i], a[j] = a[j], a[i]


def lm_batches(docs, bs, seq_len, shuffle, seed, epoch, world, mode):
    order = list(range(len(docs)))
    if shuffle:
        Rng(seed + epoch).shuffle(order)
    stream = [t for d in order for t in docs[d][1]]
    B = bs * world if mode == "per_rank" else bs
    corpus = (len(stream) - 1) // B * B if stream else 0
    bl = corpus // B
    n_batches = bl // seq_len + int(bl % seq_len != 0)
    last_len = bl - (n_batches - 1) * seq_len
    out = {r: [] for r in range(world)}
    for i in range(n_batches):
        sl = last_len if i == n_batches - 1 else seq_len
        rows = []
        for j in range(B):
            st = j * bl + i * seq_len
            txt = stream[st:st + sl + 1]
            rows.append((txt[:-1], txt[1:], i * B + j))
        for r in range(world):
            r0, r1 = r * B // world, (r + 1) * B // world
            pad = r1 == r0
            sel = rows[0:1] if pad else rows[r0:r1]
            out[r].append(dict(x=[s[0] for s in sel], y=[s[1] for s in sel],
                               idx=[s[2] for s in sel], pad=[int(pad)] * len(sel),
                               n_real=0 if pad else len(sel), global_size=B))
    return out


def sorted_order(docs, bs, shuffle, seed, epoch):
    n = len(docs)
    res = [len(d[1]) for d in docs]
    if not shuffle:
        return sorted(range(n), key=lambda i: res[i], reverse=True)
    rng = Rng(seed + epoch)
    idxs = list(range(n))
    rng.shuffle(idxs)  # np.random.permutation(len(self.dataset))
    idx_max = max(range(n), key=lambda i: (res[i], -i))  # np.argmax: the first maximum
    p = idxs.index(idx_max)
    idxs[0], idxs[p] = idxs[p], idxs[0]
    sz = bs * 50
    chunks = [idxs[i:i + sz] for i in range(0, n, sz)]
    chunks = [sorted(s, key=lambda i: res[i], reverse=True) for s in chunks]
    sort_idx = [i for c in chunks for i in c]
    batches = [sort_idx[i:i + bs] for i in range(0, n, bs)]
    if len(batches) > 2:
        perm = list(range(len(batches) - 2))
        rng.shuffle(perm)
        middle = [batches[1 + k] for k in perm]
    else:
        middle = []
    allb = [batches[0]] + middle + ([batches[-1]] if len(batches) > 1 else [])
    return [i for b in allb for i in b]


def pad_chunk(x, max_len, pad_idx, pad_first, seq_len):
    l = max_len - len(x)
    chunk = [pad_idx] * ((l // seq_len) * seq_len)
    res = [pad_idx] * (l % seq_len)
    return chunk + x + res if pad_first else x + chunk + res


def clas_batches(docs, bs, seq_len, shuffle, drop_last, seed, epoch, world, mode, pad_first):
    order = sorted_order(docs, bs, shuffle, seed, epoch)
    n = len(order)
    n_gb = n // bs + int(not drop_last and n % bs != 0)
    glob = [order[b * bs:(b + 1) * bs] for b in range(n_gb)]

    def make(items, rows, pad):
        M = max(len(docs[d][1]) for d in items)
        sel = [items[r] for r in rows]
        return dict(x=[pad_chunk(docs[d][1], M, 1, pad_first, seq_len) for d in sel],
                    y=[[docs[d][0]] for d in sel], idx=sel, pad=[int(pad)] * len(sel))

    out = {r: [] for r in range(world)}
    for r in range(world):
        if world > 1 and mode == "per_rank":
            for k in range((n_gb + world - 1) // world):
                g = k * world + r
                pad = g >= n_gb
                items = glob[g % n_gb]
                b = make(items, range(len(items)), pad)
                b.update(n_real=0 if pad else len(items), global_size=0 if pad else len(items))
                out[r].append(b)
        else:
            for items in glob:
                B = len(items)
                r0, r1 = (r * B // world, (r + 1) * B // world) if world > 1 else (0, B)
                pad = r1 == r0
                b = make(items, [0] if pad else range(r0, r1), pad)
                b.update(n_real=0 if pad else r1 - r0, global_size=B if world > 1 else len(b["idx"]))
                out[r].append(b)
    return out


def render(cfg, batches, rank, start):
    lines = [cfg]
    for i, b in enumerate(batches[start:]):
        T = len(b["x"][0])
        lines.append("batch %d size %d T %d n_real %d global %d" % (
            start + i, len(b["x"]), T, b["n_real"], b["global_size"]))
        for row, yv in zip(b["x"], b["y"]):
            lines.append("x " + " ".join(map(str, row)) + " | y " + " ".join(map(str, yv)))
        lines.append("idx " + " ".join(map(str, b["idx"])) + " pad " + " ".join(map(str, b["pad"])))
    return lines


def main():
    d = sys.argv[1]
    docs = []
    with open(d + "/corpus.txt") as f:
        for line in f:
            v = [int(t) for t in line.split()]
            docs.append((v[0], v[1:]))
    got = open(d + "/got.txt").read().split("\n")
    want = []
    cfgs = [l for l in got if l.startswith("cfg ")]
    for cfg in cfgs:
        k = dict(zip(cfg.split()[1::2], cfg.split()[2::2]))
        kind, bs, sl = k["kind"], int(k["bs"]), int(k["seq_len"])
        shuffle, drop, seed, epoch = int(k["shuffle"]), int(k["drop_last"]), int(k["seed"]), int(k["epoch"])
        world, rank, mode, start = int(k["world"]), int(k["rank"]), k["mode"], int(k["start"])
        if kind == "lm":
            out = lm_batches(docs, bs, sl, shuffle, seed, epoch, world, mode)
        else:
            out = clas_batches(docs, bs, sl, shuffle, drop, seed, epoch, world, mode,
                               not int(k["pad_last"]))
        want += render(cfg, out[rank], rank, start)
    got = [l for l in got if l]
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            print("line %d differs:\n corefit: %s\n fastai:  %s" % (i + 1, a[:400], b[:400]))
            sys.exit(1)
    if len(got) != len(want):
        print("corefit wrote %d lines, the formulas give %d" % (len(got), len(want)))
        sys.exit(1)
    print("text batches: %d lines equal over %d runs" % (len(want), len(cfgs)))


main()
