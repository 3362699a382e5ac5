"""PyTorch's side of bench_lstm: torch.nn.LSTM forward + backward (batch first, one layer each)
on the shapes bench_lstm passes, one thread; prints the best time of each shape in ms, one per
line, for bench_lstm to read.

    /usr/bin/python3 bench/lstm_torch.py REPS BS T IN:HID [IN:HID ...]
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402


def main():
    torch.set_num_threads(1)
    reps, bs, steps = (int(a) for a in sys.argv[1:4])
    for shape in sys.argv[4:]:
        i, h = (int(v) for v in shape.split(":"))
        lstm = torch.nn.LSTM(i, h, batch_first=True)
        x = torch.randn(bs, steps, i, requires_grad=True)
        dy = torch.randn(bs, steps, h)
        state = (torch.zeros(1, bs, h), torch.zeros(1, bs, h))
        best = float("inf")
        for _ in range(reps + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            y, state = lstm(x, state)
            y.backward(dy)
            state = tuple(s.detach() for s in state)
            best = min(best, time.perf_counter() - t0)
        print("%.3f" % (best * 1e3))


if __name__ == "__main__":
    main()
