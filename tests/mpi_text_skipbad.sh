#!/bin/bash
# corefit train --skip-bad under mpirun: every rank reads the image folder and leaves out the
# same unreadable file, and only rank 0 says so (one "left out" line, one line naming the file).
# Usage: mpi_text_skipbad.sh COREFIT MPIEXEC [mpirun options...]
set -u
corefit=$1 mpiexec=$2
shift 2
dir=$(mktemp -d "${TMPDIR:-/tmp}/cf_mpi_skipbad_XXXXXX")
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 - "$dir" <<'PY' || exit 1
import os, sys, torch, torchvision.io as io
root = sys.argv[1]
g = torch.Generator().manual_seed(0)
for split, n in (("train", 12), ("valid", 4)):
    for label in ("a", "b"):
        d = os.path.join(root, "imgs", split, label)
        os.makedirs(d)
        for i in range(n):
            img = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g)
            io.write_png(img, os.path.join(d, f"{i}.png"))
open(os.path.join(root, "imgs", "train", "a", "bad.png"), "w").write("not an image\n")
PY
cd "$dir" || exit 1
"$mpiexec" "$@" -np 2 "$corefit" train --images imgs --size 16 --skip-bad --start mpi --bs 4 \
    --epochs 1 --out m.safetensors >out.txt 2>err.txt
rc=$?
cat out.txt err.txt
[ $rc -eq 0 ] || { echo "FAIL: corefit exited with $rc"; exit 1; }
left=$(grep -c "skip-bad: left out 1 of 25 training images" err.txt)
named=$(grep -c "skip-bad: .*imgs/train/a/bad.png" err.txt)
[ "$left" -eq 1 ] && [ "$named" -eq 1 ] || {
    echo "FAIL: the skip-bad summary printed $left times and the file named $named times (once each)"
    exit 1
}
echo "skip-bad under 2 MPI ranks: said once"
