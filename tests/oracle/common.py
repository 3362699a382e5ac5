"""Shared helpers for the oracle scripts: read and write the .f32 tensors the C tests exchange."""
import os
import struct
import sys

import numpy as np


def path(d, name):
    return os.path.join(d, name + ".f32")


def get(d, name):
    with open(path(d, name), "rb") as f:
        (nd,) = struct.unpack("<i", f.read(4))
        shape = struct.unpack("<%di" % nd, f.read(4 * nd)) if nd else ()
        data = np.frombuffer(f.read(), dtype="<f4").copy()
    return data.reshape(shape)


def put(d, name, array):
    a = np.ascontiguousarray(np.asarray(array, dtype="<f4"))
    with open(path(d, name), "wb") as f:
        f.write(struct.pack("<i", a.ndim))
        if a.ndim:
            f.write(struct.pack("<%di" % a.ndim, *a.shape))
        f.write(a.tobytes())


def put_state(d, state):
    """Every entry of a torch state_dict as p_<name>, and their count as n_state, for a test that
    compares its model's parameters (and their names) with the script's."""
    for name, t in state.items():
        put(d, "p_" + name, t.float().numpy())
    put(d, "n_state", np.array([len(state)], dtype=np.float32))


def tensor(d, name, requires_grad=False):
    import torch
    return torch.tensor(get(d, name), requires_grad=requires_grad)


def folder():
    return sys.argv[1]


def serve(main):
    """Runs main once per request line on stdin ("DIR ARGS...", as the command line would give
    them) in this one process, so that a test making many oracle calls imports torch once.
    Replies one line on stdout per request: "ok", or "error <message>". Anything main prints
    goes to stderr, so that it cannot be taken for a reply."""
    import shlex
    import traceback

    reply = sys.stdout
    sys.stdout = sys.stderr
    script = sys.argv[0]
    for line in sys.stdin:
        if not line.strip():
            continue
        sys.argv = [script] + shlex.split(line)
        try:
            main()
            msg = "ok"
        except SystemExit as e:
            msg = "ok" if e.code in (None, 0) else "error %s" % e.code
        except Exception:  # noqa: BLE001 - reported to the test, which fails with it
            msg = "error " + traceback.format_exc().replace("\n", " | ")
        sys.stderr.flush()
        reply.write(msg.replace("\n", " ") + "\n")
        reply.flush()
