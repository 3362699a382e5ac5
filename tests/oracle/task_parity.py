"""PyTorch's side of tests/test_task_parity.c: one of fastai's vision tasks trained with
bench/tasks_torch.py's recipe (its own file readers, normalisation, losses, fastai's Adam and
fit_one_cycle, metrics) from corefit's initial weights and in corefit's batch order, so that
the two fits differ only by floating-point rounding.

    task_parity.py DIR task=T data=PATH epochs=E lr=X bs=B [limit=N] [ls=EPS]

T: multi-label | points | regression (data: the fmnist-tasks folder) | segmentation (data: a
folder with train/ and valid/) | fmnist (data: the Fashion-MNIST idx folder, the first `limit`
training and limit/5 test images; ls: LabelSmoothingCrossEntropy's eps).
Inputs in DIR: names.txt and p<i>.f32 (corefit's initial state, state_dict order), f<i>.f32
(corefit's state after its fit), order.f32 (the training samples of each step, bs a step, as
corefit drew them).
Outputs: losses.f32 (each step's training loss, before its update), result.f32 (valid_loss and
the task's metric: accuracy_multi, mae, mae, dice_multi then foreground_acc, accuracy) of
PyTorch's fit, and result_corefit.f32, the same of corefit's trained weights."""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import common  # noqa: E402
import models  # noqa: E402
import tasks_torch  # noqa: E402
import unet  # noqa: E402


def load_state(model, d, prefix="p"):
    with open(os.path.join(d, "names.txt")) as f:
        names = [ln.rstrip("\n") for ln in f if ln.strip()]
    sd = model.state_dict()
    if sorted(names) != sorted(sd.keys()):
        extra = sorted(set(names) - set(sd.keys()))[:5]
        missing = sorted(set(sd.keys()) - set(names))[:5]
        sys.exit("state names differ: corefit only %s, torch only %s" % (extra, missing))
    with torch.no_grad():
        for i, name in enumerate(names):
            v = torch.tensor(common.get(d, "%s%d" % (prefix, i)))
            sd[name].copy_(v.reshape(sd[name].shape).to(sd[name].dtype))


def build(task, n_out, y_range, size):
    if task == "segmentation":
        body = nn.Sequential(*list(unet.torchvision.models.resnet18().children())[:-2])
        body[0] = nn.Conv2d(1, 64, 7, 2, 3, bias=False)  # fastai's n_in 1 stem
        return unet.DynamicUnet(body, n_out, (size, size))
    a = {"n_out": str(n_out), "ps": "0,0"}  # no dropout: the two sides draw different masks
    if y_range is not None:
        a["y_range"] = "%r,%r" % (float(np.float32(y_range[0])), float(np.float32(y_range[1])))
    return models.build("w1", a)


def main():
    d = common.folder()
    a = dict(kv.split("=", 1) for kv in sys.argv[2:])
    task = a["task"]
    args = argparse.Namespace(epochs=int(a["epochs"]), lr=float(a["lr"]), bs=int(a["bs"]), seed=0,
                              label_smoothing=float(a.get("ls", "0")), mixup=0.0, cutmix=0.0)
    torch.set_num_threads(1)
    n_codes, y_range = 0, None
    if task == "fmnist":
        xtr, ytr, xva, yva = tasks_torch.load_fmnist(a["data"], int(a["limit"]))
        n_out = 10
    elif task == "segmentation":
        xtr, ytr = tasks_torch.load_masks(os.path.join(a["data"], "train"))
        xva, yva = tasks_torch.load_masks(os.path.join(a["data"], "valid"))
        with open(os.path.join(a["data"], "train", "codes.txt")) as f:
            n_codes = n_out = len([ln for ln in f.read().split("\n") if ln.strip()])
    else:
        xtr, ytr, xva, yva, n_out, y_range = tasks_torch.load_task(task, a["data"], args)
    xtr, xva = tasks_torch.normalise(xtr, xva)
    xtr, xva = np.ascontiguousarray(xtr, np.float32), np.ascontiguousarray(xva, np.float32)
    model = build(task, n_out, y_range, xtr.shape[-1])
    load_state(model, d)
    loss_fn = tasks_torch.make_loss(task, args)
    order = common.get(d, "order").astype(np.int64).reshape(-1, args.bs)
    n_iter = len(xtr) // args.bs
    if len(order) != args.epochs * n_iter:
        sys.exit("order has %d steps, expected %d" % (len(order), args.epochs * n_iter))
    opt = tasks_torch.optimizer(model, args.lr)
    total = len(order)
    lr_f = tasks_torch.w1_torch.combined_cos(0.25, args.lr / 25, args.lr, args.lr / 1e5)
    mom_f = tasks_torch.w1_torch.combined_cos(0.25, 0.95, 0.85, 0.95)
    losses = []
    model.train()
    for it, idx in enumerate(order):
        xb, yb = torch.from_numpy(xtr[idx]), torch.from_numpy(ytr[idx])
        for grp in opt.param_groups:
            grp["lr"] = lr_f(it / total)
            grp["betas"] = (mom_f(it / total), 0.99)
        loss = loss_fn(model(xb), yb)
        losses.append(float(loss))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    res = tasks_torch.validate(model, xva, yva, loss_fn, task, n_codes, args.bs)
    key = {"multi-label": ["accuracy_multi"], "points": ["mae"], "regression": ["mae"],
           "segmentation": ["dice_multi", "foreground_acc"], "fmnist": ["accuracy"]}[task]
    common.put(d, "losses", losses)
    common.put(d, "result", [res["valid_loss"]] + [res[k] for k in key])
    # corefit's trained weights (f<i>) validated here: the loss and metrics of the same model
    model = build(task, n_out, y_range, xtr.shape[-1])
    load_state(model, d, "f")
    res = tasks_torch.validate(model, xva, yva, loss_fn, task, n_codes, args.bs)
    common.put(d, "result_corefit", [res["valid_loss"]] + [res[k] for k in key])


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:  # one process for all the tasks (oracle_serve_begin)
        common.serve(main)
    else:
        main()
