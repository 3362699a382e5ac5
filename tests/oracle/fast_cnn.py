"""Oracle for tests/test_fast_cnn.c: the fast-cnn (corefit train --recipe fast's model) as the
benchmark's PyTorch twin builds it (bench/fast_torch.py), so that the test also holds the twin to
corefit's model.

usage: fast_cnn.py DIR SEED
Creates the model with torch.manual_seed(SEED) and writes its state as p_<name>, and n_state.
Then, on the C test's x (16, 1, 28, 28) and target (16): in train mode forward, cross-entropy
with label smoothing 0.1, backward -> train_logits, train_loss, g_<param>, s_<buffer>; then eval
mode forward -> eval_logits.
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import common  # noqa: E402
import fast_torch  # noqa: E402


def main():
    torch.set_num_threads(1)
    d = common.folder()
    torch.manual_seed(int(sys.argv[2]))
    model = fast_torch.build_model()
    state = model.state_dict()
    common.put_state(d, state)
    x = common.tensor(d, "x")
    target = common.tensor(d, "target").long()
    model.train()
    logits = model(x)
    loss = F.cross_entropy(logits, target, label_smoothing=0.1)
    loss.backward()
    common.put(d, "train_logits", logits.detach().numpy())
    common.put(d, "train_loss", loss.detach().reshape(1).numpy())
    for name, p in model.named_parameters():
        common.put(d, "g_" + name, p.grad.numpy())
    for name, b in model.named_buffers():
        common.put(d, "s_" + name, b.to(torch.float32).reshape(-1).numpy())
    model.eval()
    with torch.no_grad():
        common.put(d, "eval_logits", model(x).numpy())


main()
