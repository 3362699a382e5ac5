"""PyTorch's side of bench_conv: times Conv2d forward + backward on W1's convolutions (batch 64,
one thread; PyTorch's CPU convolutions come from oneDNN) and prints the same table as
bench_conv, so the two can be read side by side, layer shape by layer shape:

    build/bench_conv 1 1 && /usr/bin/python3 bench/conv_torch.py --seconds 1

Times are the best repetition per shape and the median of the totals, as bench_conv's. The
stem's backward computes no input gradient (nothing before it needs one), as in training.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402

SHAPES = [  # name, in, out, kernel, stride, padding, size, input gradient
    ("stem 1->16 3x3 28x28", 1, 16, 3, 1, 1, 28, False),
    ("b1 16->32 3x3 s2 28x28", 16, 32, 3, 2, 1, 28, True),
    ("b1 32->32 3x3 14x14", 32, 32, 3, 1, 1, 14, True),
    ("b1 short 16->32 1x1 s2", 16, 32, 1, 2, 0, 28, True),
    ("b2 32->64 3x3 s2 14x14", 32, 64, 3, 2, 1, 14, True),
    ("b2 64->64 3x3 7x7", 64, 64, 3, 1, 1, 7, True),
    ("b2 short 32->64 1x1 s2", 32, 64, 1, 2, 0, 14, True),
]

VGG_SHAPES = [  # W2, the VGG-style CNN (bench_conv ... vgg)
    ("vgg0 1->32 3x3 28x28", 1, 32, 3, 1, 1, 28, False),
    ("vgg0 32->32 3x3 28x28", 32, 32, 3, 1, 1, 28, True),
    ("vgg1 32->64 3x3 14x14", 32, 64, 3, 1, 1, 14, True),
    ("vgg1 64->64 3x3 14x14", 64, 64, 3, 1, 1, 14, True),
    ("vgg2 64->128 3x3 7x7", 64, 128, 3, 1, 1, 7, True),
    ("vgg2 128->128 3x3 7x7", 128, 128, 3, 1, 1, 7, True),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="time per shape")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workload", choices=["w1", "vgg"], default="w1")
    args = ap.parse_args()
    what = "W2" if args.workload == "vgg" else "W1"
    torch.set_num_threads(args.threads)
    torch.manual_seed(5)
    batch = 64
    print(f"PyTorch {torch.__version__} Conv2d, batch {batch}, {args.threads} thread(s); "
          f"mkldnn available: {torch.backends.mkldnn.is_available()}")
    print(f"{'shape':<26} {'fwd ms':>9} {'bwd ms':>9} {'fwd GF/s':>9} {'bwd GF/s':>9} "
          f"{'all GF/s':>9}")
    total_flops = total_best = total_median = 0.0
    for name, cin, cout, k, s, p, hw, need_dx in VGG_SHAPES if args.workload == "vgg" else SHAPES:
        conv = torch.nn.Conv2d(cin, cout, k, stride=s, padding=p, bias=False)
        x = torch.randn(batch, cin, hw, hw, requires_grad=need_dx)
        y = conv(x)
        dy = torch.randn_like(y)
        kk, pp = cin * k * k, y.shape[2] * y.shape[3]
        gemm = 2.0 * batch * cout * kk * pp
        fwd_flops, bwd_flops = gemm, gemm * (2 if need_dx else 1)
        tf, tb = [], []
        for _ in range(2):  # warm-up
            conv(x).backward(dy)
        start = time.perf_counter()
        while len(tf) < 5 or time.perf_counter() - start < args.seconds:
            conv.zero_grad(set_to_none=False)
            t0 = time.perf_counter()
            y = conv(x)
            t1 = time.perf_counter()
            y.backward(dy)
            t2 = time.perf_counter()
            tf.append(t1 - t0)
            tb.append(t2 - t1)
        tf.sort()
        tb.sort()
        f, b = tf[0], tb[0]
        total_median += tf[len(tf) // 2] + tb[len(tb) // 2]
        print(f"{name:<26} {1e3 * f:9.3f} {1e3 * b:9.3f} {fwd_flops / f * 1e-9:9.1f} "
              f"{bwd_flops / b * 1e-9:9.1f} {(fwd_flops + bwd_flops) / (f + b) * 1e-9:9.1f}")
        total_flops += fwd_flops + bwd_flops
        total_best += f + b
    print(f"{'all ' + what + ' convs (best)':<26} {1e3 * total_best:19.3f} ms "
          f"{total_flops / total_best * 1e-9:29.1f}")
    print(f"{'all ' + what + ' convs (median)':<26} {1e3 * total_median:19.3f} ms "
          f"{total_flops / total_median * 1e-9:29.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
