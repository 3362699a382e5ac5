#!/usr/bin/python3
"""W4 (the AWD-LSTM language model on Debian's fortunes corpus) in PyTorch, the reference side
of bench_w4. It trains on the ids bench_w4 exports (`bench_w4 --export DIR`: the same
vocabulary and documents as corefit's), so both sides see the same data.

The model is fastai's, written out in PyTorch (fastai/text/models/awdlstm.py):
  AWD_LSTM(vocab, emb 400, hidden 1152, 3 layers, pad 1) of awd_lstm_lm_config: nn.Embedding
  (uniform +-0.1) behind EmbeddingDropout (embed_p 0.02, whole words), RNNDropout (input_p 0.25),
  three batch-first nn.LSTM (400->1152, 1152->1152, 1152->400), each in a WeightDropout on
  weight_hh_l0 (weight_p 0.2), RNNDropout (hidden_p 0.15) between them, the hidden state carried
  from batch to batch (detached) and reset at each epoch and before validation; LinearDecoder
  (output_p 0.1) tied to the embedding, bias zeroed; RNNRegularizer AR 2 and TAR 1.
Recipe: CrossEntropyLossFlat; fastai's Adam = AdamW(betas (mom, 0.99), eps 1e-5, weight decay
0.1 on every parameter but the decoder's bias); fit_one_cycle(lr_max 1e-2, div 25, div_final
1e5, pct_start 0.25, moms 0.8/0.7/0.8), the schedule set before every batch; bs 64, seq_len 72,
fastai's LMDataLoader (documents shuffled each epoch and concatenated, bs rows of the stream).

Modes:
  w4_torch.py --ids DIR --threads N [--batches B | --epochs E]  one process, N threads
  w4_torch.py --ids DIR --ddp N     [--batches B | --epochs E]  N processes, DDP (gloo), 1 thread
                                                                 each, bs 64 each
  w4_torch.py --ids DIR --recipe [--threads N] [--seed S] [--lm-epochs E] [--clas-epochs E]
              [--emb-sz N] [--n-hid N] [--n-layers N]
      the recipe of bench_w4 --recipe (the sizes change both configs, dropouts kept): the language model, then the topic classifier
      (awd_lstm_clas_config with drop_mult 0.5, SentenceEncoder, masked concat pooling,
      PoolingLinearClassifier [1200, 50, n]) from its encoder with gradual unfreezing.
  --bf16 (any mode): fastai's to_fp16 as PyTorch does it on a CPU, torch.autocast("cpu",
      dtype=torch.bfloat16) around the forward and the loss (fp32 weights and optimizer; the
      backward follows the forward's dtypes), as bench_w4 --bf16 (cf_learner_to_bf16).
Prints one JSON line; "images" are rows of 72 tokens (the fields of w1_torch.py).
"""
import argparse
import json
import math
import os
import sys
import time

import w1_torch

SEQ_LEN = 72
LM_CFG = dict(emb_sz=400, n_hid=1152, n_layers=3, pad=1, output_p=0.1, hidden_p=0.15, input_p=0.25,
              embed_p=0.02, weight_p=0.2)
CLAS_CFG = dict(LM_CFG, output_p=0.4, hidden_p=0.3, input_p=0.4, embed_p=0.05, weight_p=0.5)
LM_LR, WD, CLAS_LR = 1e-2, 0.1, 2e-2
MOMS = (0.8, 0.7, 0.8)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--ddp", type=int, default=0)
    ap.add_argument("--ids", required=True, help="the folder bench_w4 --export wrote")
    ap.add_argument("--batches", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--recipe", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(\"cpu\", torch.bfloat16) around forward + loss")
    ap.add_argument("--lm-epochs", type=int, default=1)
    ap.add_argument("--clas-epochs", type=int, default=1)
    ap.add_argument("--emb-sz", type=int, default=0, help="--recipe: the configs' emb_sz (0: 400)")
    ap.add_argument("--n-hid", type=int, default=0, help="--recipe: the configs' n_hid (0: 1152)")
    ap.add_argument("--n-layers", type=int, default=0, help="--recipe: the configs' n_layers (0: 3)")
    return ap.parse_args()


def sized(cfg, args):
    """The config with --emb-sz, --n-hid, --n-layers (bench_w4's w4_config); dropouts unchanged."""
    c = dict(cfg)
    for key, v in (("emb_sz", args.emb_sz), ("n_hid", args.n_hid), ("n_layers", args.n_layers)):
        if v > 0:
            c[key] = v
    return c


def unigram_perplexity(docs, vdocs, vocab, bs):
    """The baseline a language model must beat: exp of the mean cross-entropy over the validation
    targets (lm_batches' order) of the training stream's word frequencies (add-one smoothed)."""
    import numpy as np

    counts = np.bincount(np.concatenate(docs), minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    ys = np.concatenate([y.reshape(-1) for _, y in lm_batches(vdocs, bs, False, None)])
    return float(np.exp(-logp[ys].mean()))


def read_ids(path):
    """A corefit id file (include/corefit/data.h): the documents as a list of int64 arrays."""
    import numpy as np

    raw = np.fromfile(path, dtype=np.uint8)
    if raw[:8].tobytes() != b"CFTEXTID":
        sys.exit(f"w4_torch.py: {path}: not a corefit id file")
    vocab = int(raw[12:16].view(np.int32)[0])
    n_docs, n_tokens = (int(v) for v in raw[16:32].view(np.uint64))
    ids = raw[32 : 32 + 4 * n_tokens].view(np.int32).astype(np.int64)
    off0 = (32 + 4 * n_tokens + 7) // 8 * 8
    offsets = raw[off0 : off0 + 8 * (n_docs + 1)].view(np.int64)
    return vocab, [ids[offsets[d] : offsets[d + 1]] for d in range(n_docs)]


def read_labels(path):
    with open(path) as f:
        return [int(line) for line in f]


# ---- fastai's AWD-LSTM modules ---------------------------------------------------------------


def build_modules():
    import torch
    import torch.nn.functional as F
    from torch import nn

    def dropout_mask(x, size, p):
        return x.new_empty(*size).bernoulli_(1 - p).div_(1 - p)

    class RNNDropout(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.p = p

        def forward(self, x):
            if not self.training or self.p == 0:
                return x
            return x * dropout_mask(x.data, (x.size(0), 1, *x.shape[2:]), self.p)

    class WeightDropout(nn.Module):
        def __init__(self, module, weight_p, layer="weight_hh_l0"):
            super().__init__()
            self.module, self.weight_p, self.layer = module, weight_p, layer
            w = getattr(module, layer)
            delattr(module, layer)
            self.register_parameter(f"{layer}_raw", nn.Parameter(w.data))
            setattr(module, layer, w.clone())
            module.flatten_parameters = lambda *a, **k: None

        def forward(self, *args):
            raw = getattr(self, f"{self.layer}_raw")
            setattr(self.module, self.layer, F.dropout(raw, p=self.weight_p) if self.training else raw.clone())
            return self.module(*args)

    class EmbeddingDropout(nn.Module):
        def __init__(self, emb, embed_p):
            super().__init__()
            self.emb, self.embed_p = emb, embed_p

        def forward(self, words):
            w = self.emb.weight
            if self.training and self.embed_p != 0:
                w = w * dropout_mask(w.data, (w.size(0), 1), self.embed_p)
            return F.embedding(words, w, self.emb.padding_idx)

    class AWDLSTM(nn.Module):
        def __init__(self, vocab, c):
            super().__init__()
            self.n_layers, self.n_hid, self.emb_sz = c["n_layers"], c["n_hid"], c["emb_sz"]
            self.encoder = nn.Embedding(vocab, c["emb_sz"], padding_idx=c["pad"])
            self.encoder_dp = EmbeddingDropout(self.encoder, c["embed_p"])
            self.rnns = nn.ModuleList([
                WeightDropout(nn.LSTM(c["emb_sz"] if l == 0 else c["n_hid"],
                                      c["n_hid"] if l != c["n_layers"] - 1 else c["emb_sz"], 1, batch_first=True),
                              c["weight_p"]) for l in range(c["n_layers"])])
            self.encoder.weight.data.uniform_(-0.1, 0.1)
            self.input_dp = RNNDropout(c["input_p"])
            self.hidden_dps = nn.ModuleList([RNNDropout(c["hidden_p"]) for _ in range(c["n_layers"])])
            self.bs = 1
            self.reset()

        def _size(self, l):
            return self.n_hid if l != self.n_layers - 1 else self.emb_sz

        def reset(self):
            w = self.encoder.weight
            self.hidden = [(w.new_zeros(1, self.bs, self._size(l)), w.new_zeros(1, self.bs, self._size(l)))
                           for l in range(self.n_layers)]

        def forward(self, inp):
            bs = inp.shape[0]
            if bs != self.bs:  # fastai's _change_hidden
                if bs < self.bs:
                    self.hidden = [(h[:, :bs].contiguous(), c[:, :bs].contiguous()) for h, c in self.hidden]
                else:
                    self.hidden = [(torch.cat([h, h.new_zeros(1, bs - self.bs, h.size(2))], 1),
                                    torch.cat([c, c.new_zeros(1, bs - self.bs, c.size(2))], 1)) for h, c in self.hidden]
                self.bs = bs
            out = self.input_dp(self.encoder_dp(inp))
            new = []
            for l, (rnn, dp) in enumerate(zip(self.rnns, self.hidden_dps)):
                out, h = rnn(out, self.hidden[l])
                new.append(h)
                if l != self.n_layers - 1:
                    out = dp(out)
            self.hidden = [(h.detach(), c.detach()) for h, c in new]
            return out

    class LanguageModel(nn.Module):
        """SequentialRNN(AWD_LSTM, LinearDecoder(tied)): (logits, raw last output, dropped)."""

        def __init__(self, vocab, c):
            super().__init__()
            self.encoder = AWDLSTM(vocab, c)
            self.decoder = nn.Linear(c["emb_sz"], vocab)
            self.decoder.weight.data.uniform_(-0.1, 0.1)
            self.decoder.bias.data.zero_()
            self.decoder.weight = self.encoder.encoder.weight
            self.output_dp = RNNDropout(c["output_p"])

        def reset(self):
            self.encoder.reset()

        def forward(self, x):
            raw = self.encoder(x)
            dp = self.output_dp(raw)
            return self.decoder(dp), raw, dp

    class Classifier(nn.Module):
        """SequentialRNN(SentenceEncoder(72, AWD_LSTM, max_len 1440), PoolingLinearClassifier)."""

        def __init__(self, vocab, c, n_class, drop_mult=0.5, lin_ftrs=(50,), bptt=SEQ_LEN, max_len=SEQ_LEN * 20):
            super().__init__()
            c = {k: v * drop_mult if k.endswith("_p") else v for k, v in c.items()}
            self.encoder = AWDLSTM(vocab, c)
            self.bptt, self.max_len, self.pad = bptt, max_len, c["pad"]
            dims = [c["emb_sz"] * 3, *lin_ftrs, n_class]
            ps = [c["output_p"]] + [0.1] * len(lin_ftrs)
            layers = []
            for i, (ni, no, p) in enumerate(zip(dims[:-1], dims[1:], ps)):  # LinBnDrop
                bn = nn.BatchNorm1d(ni)
                bn.weight.data.fill_(1.0)
                bn.bias.data.fill_(1e-3)
                layers += [bn] + ([nn.Dropout(p)] if p else []) + [nn.Linear(ni, no, bias=False)]
                if i < len(dims) - 2:
                    layers.append(nn.ReLU(inplace=True))
            self.head = nn.Sequential(*layers)

        def reset(self):
            self.encoder.reset()

        def forward(self, inp):
            bs, sl = inp.shape
            self.encoder.reset()
            mask = inp == self.pad
            outs, masks = [], []
            for i in range(0, sl, self.bptt):
                real_bs = int((inp[:, i] != self.pad).long().sum())
                o = self.encoder(inp[:real_bs, i : min(i + self.bptt, sl)])
                if self.max_len is None or sl - i <= self.max_len:
                    outs.append(torch.cat([o, o.new_zeros(bs - o.size(0), *o.shape[1:])]) if o.size(0) < bs else o)
                    masks.append(mask[:, i : min(i + self.bptt, sl)])
            out, mask = torch.cat(outs, 1), torch.cat(masks, 1)
            lens = out.shape[1] - mask.long().sum(1)
            last_lens = mask[:, -self.bptt :].long().sum(1)
            avg = out.masked_fill(mask[:, :, None], 0).sum(1) / lens.type(out.dtype)[:, None]
            mx = out.masked_fill(mask[:, :, None], -float("inf")).max(1)[0]
            x = torch.cat([out[torch.arange(0, bs), -last_lens - 1], mx, avg], 1)
            return self.head(x)

    return LanguageModel, Classifier


# ---- fastai's loaders -----------------------------------------------------------------------


def lm_batches(docs, bs, shuffle, rng, rank=0, world=1):
    """fastai's LMDataLoader: (x, y) int64 arrays of (bs, <= 72). With world > 1 each rank takes
    its own bs rows of a stream of bs * world rows (CF_SHARD_PER_RANK's layout)."""
    import numpy as np

    order = rng.permutation(len(docs)) if shuffle else range(len(docs))
    stream = np.concatenate([docs[i] for i in order])
    rows = bs * world
    corpus = (len(stream) - 1) // rows * rows
    bl = corpus // rows
    n_batches = math.ceil(bl / SEQ_LEN)
    r0 = rank * bs
    for i in range(n_batches):
        sl = min(SEQ_LEN, bl - i * SEQ_LEN)
        starts = (np.arange(r0, r0 + bs) * bl + i * SEQ_LEN)[:, None] + np.arange(sl + 1)[None, :]
        chunk = stream[starts]
        yield chunk[:, :-1], chunk[:, 1:]


def clas_batches(docs, labels, bs, shuffle, rng, pad=1):
    """fastai's SortedDL + pad_input_chunk (pad first, in whole seq_len chunks)."""
    import numpy as np

    lens = np.array([len(d) for d in docs])
    if shuffle:
        idx = rng.permutation(len(docs))
        first = idx[np.argmax(lens[idx])]
        k = int(np.where(idx == first)[0][0])
        idx[0], idx[k] = idx[k], idx[0]
        chunks = [sorted(idx[i : i + bs * 50], key=lambda j: -lens[j]) for i in range(0, len(idx), bs * 50)]
        idx = [j for c in chunks for j in c]
        batches = [idx[i : i + bs] for i in range(0, len(idx), bs)]
        if len(batches[-1]) < bs:  # drop_last
            batches = batches[:-1]
        mid = batches[1:-1]
        batches = batches[:1] + [mid[j] for j in rng.permutation(len(mid))] + batches[-1:] if len(batches) > 1 else batches
    else:
        idx = sorted(range(len(docs)), key=lambda j: -lens[j])
        batches = [idx[i : i + bs] for i in range(0, len(idx), bs)]
    for b in batches:
        m = max(lens[j] for j in b)
        x = np.full((len(b), m), pad, dtype=np.int64)
        for r, j in enumerate(b):
            l = m - lens[j]
            front = l // SEQ_LEN * SEQ_LEN
            x[r, front : front + lens[j]] = docs[j]
        yield x, np.array([labels[j] for j in b], dtype=np.int64)


# ---- training ---------------------------------------------------------------------------------


def adam(params_groups):
    import torch

    return torch.optim.AdamW(params_groups, lr=1e-3, betas=(0.9, 0.99), eps=1e-5)


def lm_optimizer(model):
    nodecay = [model.decoder.bias]
    other = [p for p in model.parameters() if p is not model.decoder.bias]
    return adam([{"params": other, "weight_decay": WD}, {"params": nodecay, "weight_decay": 0.0}])


def lm_loss(model, out, y, training):
    import torch.nn.functional as F

    logits, raw, dp = out
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    if not training:
        return loss, loss
    reg = 2.0 * dp.float().pow(2).mean() + 1.0 * (raw[:, 1:] - raw[:, :-1]).float().pow(2).mean()
    return loss + reg, loss


def one_cycle(model, opt, groups_lr, n_iter, epochs, batches_of, loss_of, valid_of, max_steps=0, stamps=None, cpus=None,
              log_epochs=False, bf16=False):
    """fit_one_cycle(epochs): groups_lr holds each parameter group's lr_max. Returns the last
    epoch's validation (loss, metric) or None when stopped by max_steps."""
    import torch

    total = epochs * n_iter
    lr_fs = [w1_torch.combined_cos(0.25, lr / 25, lr, lr / 1e5) for lr in groups_lr]
    mom_f = w1_torch.combined_cos(0.25, *MOMS)
    it = 0
    smooth, res = 0.0, None  # fastai's AvgSmoothLoss (beta 0.98, debiased): the table's train_loss
    for epoch in range(epochs):
        model.train()
        net = model.module if hasattr(model, "module") else model
        net.reset()
        for x, y in batches_of(epoch):
            if max_steps and it >= max_steps:
                return None
            pct = it / total
            for g, f in zip(opt.param_groups, lr_fs):
                g["lr"] = f(pct)
                g["betas"] = (mom_f(pct), 0.99)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss, plain = loss_of(model(torch.from_numpy(x)), torch.from_numpy(y), True)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            it += 1
            smooth = 0.98 * smooth + 0.02 * float(plain)
            if stamps is not None:
                stamps.append(time.perf_counter())
                cpus.append(w1_torch.cpu_s())
        if max_steps and it >= max_steps:
            return None
        if log_epochs:  # fastai validates after every epoch; the recipe logs each as its table row
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # MixedPrecision validates so too
                res = valid_of()
            print(f"epoch {epoch}: train_loss {smooth / (1 - 0.98 ** it):.5f} valid {res[0]:.5f} metric {res[1]:.5f}",
                  file=sys.stderr, flush=True)
    if log_epochs:
        return res
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return valid_of()


def lm_validate(model, docs, bs):
    import numpy as np
    import torch

    model.eval()
    model.reset()
    losses, accs, n = 0.0, 0.0, 0
    with torch.no_grad():
        for x, y in lm_batches(docs, bs, False, None):
            logits = model(torch.from_numpy(x))[0]
            yt = torch.from_numpy(y)
            losses += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), yt.reshape(-1))) * len(x)
            accs += float((logits.argmax(-1) == yt).float().mean()) * len(x)
            n += len(x)
    model.reset()
    return losses / n, accs / n


def clas_validate(model, docs, labels, bs):
    import torch

    model.eval()
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in clas_batches(docs, labels, bs, False, None):
            out = model(torch.from_numpy(x))
            yt = torch.from_numpy(y)
            loss += float(torch.nn.functional.cross_entropy(out, yt)) * len(x)
            correct += int((out.argmax(1) == yt).sum())
            n += len(x)
    return loss / n, correct / n


def train(rank, world, args, result_q=None):
    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(1 if world > 1 else args.threads)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    vocab, docs = read_ids(os.path.join(args.ids, "lm_train.ids"))
    LanguageModel, _ = build_modules()
    model = LanguageModel(vocab, LM_CFG)
    opt = lm_optimizer(model)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    rng = np.random.default_rng(args.seed)  # one stream for every rank: each takes its own rows
    n_iter = sum(1 for _ in lm_batches(docs, args.bs, False, None, 0, world))
    stamps, cpus = [], []
    t0 = time.perf_counter()
    one_cycle(model, opt, [LM_LR, LM_LR], n_iter, max(args.epochs, math.ceil(args.batches / n_iter)),
              lambda e: lm_batches(docs, args.bs, True, rng, rank, world),
              lambda out, y, tr: lm_loss(model, out, y, tr), lambda: None, args.batches, stamps, cpus,
              bf16=args.bf16)
    t_end = time.perf_counter()
    pss = w1_torch.pss_mb()
    skip = min(args.skip, len(stamps) - 1)
    out = {"rank": rank, "steps": len(stamps), "timed_steps": len(stamps) - skip,
           "span_s": stamps[-1] - stamps[skip - 1], "cpu_s": cpus[-1] - cpus[skip - 1], "pss_mb": pss,
           "train_s": t_end - t0, "acc": None, "final_loss": 0.0, "vocab": vocab}
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if result_q is not None:
        out["rss_mb"] = w1_torch.peak_rss_mb()[0]
        result_q.put(out)
    return out


def ddp_worker(rank, world, args, q):
    try:
        train(rank, world, args, q)
    except Exception as e:
        q.put({"rank": rank, "error": repr(e)})
        raise


def recipe(args):
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    vocab, docs = read_ids(os.path.join(args.ids, "lm_train.ids"))
    _, vdocs = read_ids(os.path.join(args.ids, "lm_valid.ids"))
    LanguageModel, Classifier = build_modules()
    lm_cfg, clas_cfg = sized(LM_CFG, args), sized(CLAS_CFG, args)
    lm = LanguageModel(vocab, lm_cfg)
    opt = lm_optimizer(lm)
    n_iter = sum(1 for _ in lm_batches(docs, args.bs, False, None))
    lm_loss_v, lm_acc = one_cycle(lm, opt, [LM_LR, LM_LR], n_iter, args.lm_epochs,
                                  lambda e: lm_batches(docs, args.bs, True, rng),
                                  lambda out, y, tr: lm_loss(lm, out, y, tr),
                                  lambda: lm_validate(lm, vdocs, args.bs), log_epochs=True, bf16=args.bf16)
    t_lm = time.perf_counter() - t0

    _, cdocs = read_ids(os.path.join(args.ids, "clas_train.ids"))
    _, cvdocs = read_ids(os.path.join(args.ids, "clas_valid.ids"))
    labels = read_labels(os.path.join(args.ids, "clas_train.labels"))
    vlabels = read_labels(os.path.join(args.ids, "clas_valid.labels"))
    n_class = max(labels) + 1
    clas = Classifier(vocab, clas_cfg, n_class)
    clas.encoder.load_state_dict(lm.encoder.state_dict())  # load_encoder
    enc = clas.encoder
    groups = [[enc.encoder.weight]] + [list(r.parameters()) for r in enc.rnns] + [list(clas.head.parameters())]
    # fastai's Adam with wd 0.01 (text_classifier_learner's default), none on BatchNorm
    bn = {id(p) for m in clas.head if isinstance(m, torch.nn.BatchNorm1d) for p in m.parameters()}
    pgroups = []
    for g in groups:
        pgroups.append({"params": [p for p in g if id(p) not in bn], "weight_decay": 0.01})
        pgroups.append({"params": [p for p in g if id(p) in bn], "weight_decay": 0.0})
    n_iter = sum(1 for _ in clas_batches(cdocs, labels, args.bs, True, np.random.default_rng(0)))

    def stage(trainable, epochs, lrs):
        for i, g in enumerate(groups):
            for p in g:
                p.requires_grad_(i >= len(groups) - trainable)
        opt = adam([dict(pg) for pg in pgroups])
        per_pg = [lr for lr in lrs for _ in range(2)]
        return one_cycle(clas, opt, per_pg, n_iter, epochs,
                         lambda e: clas_batches(cdocs, labels, args.bs, True, rng),
                         lambda out, y, tr: (torch.nn.functional.cross_entropy(out, y),) * 2,
                         lambda: clas_validate(clas, cvdocs, vlabels, args.bs), log_epochs=True,
                         bf16=args.bf16)

    def sl(hi):  # slice(hi / 2.6^4, hi) over the 5 groups (fastai's even_mults)
        lo = hi / 2.6 ** 4
        return [lo * (hi / lo) ** (i / 4) for i in range(5)]

    stage(1, 1, [CLAS_LR] * 5)
    stage(2, 1, sl(CLAS_LR / 2))
    stage(3, 1, sl(CLAS_LR / 4))
    c_loss, c_acc = stage(5, args.clas_epochs, sl(CLAS_LR / 20))
    print(json.dumps({"impl": "torch", "mode": "recipe", "seed": args.seed, "threads": args.threads, "bs": args.bs,
                      "lm_epochs": args.lm_epochs, "clas_epochs": args.clas_epochs, "vocab": vocab,
                      "lm_valid_loss": lm_loss_v, "lm_accuracy": lm_acc, "perplexity": math.exp(lm_loss_v),
                      "clas_valid_loss": c_loss, "clas_accuracy": c_acc, "classes": n_class,
                      "bf16": args.bf16, "lm_s": t_lm, "total_s": time.perf_counter() - t0, "emb_sz": lm_cfg["emb_sz"],
                      "n_hid": lm_cfg["n_hid"], "n_layers": lm_cfg["n_layers"], "lm_train_docs": len(docs),
                      "clas_train_docs": len(cdocs), "clas_valid_docs": len(cvdocs),
                      "unigram_perplexity": unigram_perplexity(docs, vdocs, vocab, args.bs)}), flush=True)


def main():
    args = parse_args()
    world = args.ddp if args.ddp else 1
    nthreads = 1 if world > 1 else args.threads
    os.environ["OMP_NUM_THREADS"] = str(nthreads)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ.setdefault("MKL_NUM_THREADS", str(nthreads))
    import torch

    if args.recipe:
        return recipe(args)
    if world == 1:
        r = train(0, 1, args)
        ranks, rss, pss = [r], w1_torch.peak_rss_mb()[0], r["pss_mb"]
    else:
        ranks = w1_torch.run_ddp(ddp_worker, world, args)
        r = ranks[0]
        rss = w1_torch.peak_rss_mb()[0] + sum(x["rss_mb"] for x in ranks)
        pss = w1_torch.pss_mb() + sum(x["pss_mb"] for x in ranks)
    span = max(x["span_s"] for x in ranks)
    rows = r["timed_steps"] * args.bs * world
    ips = rows / span if span > 0 else 0.0
    cpu = sum(x["cpu_s"] for x in ranks)
    c = LM_CFG
    per_token = sum(2 * 4 * h * (i + h) for i, h in ((c["emb_sz"], c["n_hid"]), (c["n_hid"], c["n_hid"]), (c["n_hid"], c["emb_sz"])))
    mflop = 3 * (per_token + 2 * c["emb_sz"] * r["vocab"]) * SEQ_LEN / 1e6
    print(json.dumps({
        "impl": "torch", "torch": torch.__version__, "mode": "ddp" if world > 1 else "threads", "procs": world,
        "threads": nthreads, "bs": args.bs, "steps": r["steps"], "timed_steps": r["timed_steps"],
        "images_per_s": ips, "tokens_per_row": SEQ_LEN,
        "measured": f"wall time from the end of training step {args.skip} to the end of the last step (slowest rank), "
                    f"{args.bs}*{world} rows of {SEQ_LEN} tokens per step",
        "gflops": ips * mflop / 1e3, "mflop_per_image": mflop, "test_acc": None, "cpu_s": cpu,
        "images_per_cpu_s": rows / cpu if cpu > 0 else 0.0, "train_s": r["train_s"], "peak_rss_mb": rss,
        "pss_mb": pss, "vocab": r["vocab"], "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        "bf16": args.bf16,
    }), flush=True)


if __name__ == "__main__":
    main()
