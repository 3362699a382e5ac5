#!/bin/sh
# The arm64 checks of tests/neon.cmake, on any machine with Debian's cross compiler and
# user-mode QEMU:
#
#   neon_run.sh kernels CC QEMU SRC OUT
#       builds tests/neon_kernels.c with every source of the tensor layer for arm64 (static, -O3,
#       warnings as errors) into OUT and runs it under QEMU: the instruction-set choice under
#       CF_ISA, then the NEON kernel table against the portable one.
#   neon_run.sh compile CC SRC FLAGS...
#       every other C file of the library, the command-line tool, the examples and the
#       benchmarks (all of which a build compiles) through the arm64 compiler's front end (-fsyntax-only, warnings as errors; FLAGS: the build's defines and
#       the host's header folders, searched after the arm64 C library's), so that an arm64 build
#       keeps compiling without an arm64 OpenBLAS at hand.
set -eu
mode=$1
shift
case $mode in
kernels)
    cc=$1 qemu=$2 src=$3 out=$4
    mkdir -p "$out"
    start=$(date +%s)
    "$cc" -std=c11 -D_GNU_SOURCE -O3 -fno-math-errno -Wall -Wextra -Werror -static \
        -I"$src/include" -I"$src/src" -I"$src/tests/neon" \
        "$src/tests/neon_kernels.c" "$src"/src/tensor/*.c -lm -o "$out/neon_kernels"
    echo "built for arm64 in $(($(date +%s) - start)) s"
    for cap in generic avx2 neon; do # the choice at load, capped as users cap it
        CF_ISA=$cap "$qemu" "$out/neon_kernels" dispatch
    done
    exec "$qemu" "$out/neon_kernels"
    ;;
compile)
    cc=$1 src=$2
    shift 2
    status=0 files=0
    for f in "$src"/src/*/*.c "$src"/tools/*.c "$src"/examples/*.c "$src"/bench/*.c; do
        case $f in "$src"/src/tensor/*) continue ;; esac # compiled whole by the kernels test
        files=$((files + 1))
        if ! "$cc" -std=c11 -D_GNU_SOURCE -fsyntax-only -Wall -Wextra -Werror \
            -I"$src/include" -I"$src/src" "$@" "$f"; then
            echo "arm64: $f does not compile" >&2
            status=1
        fi
    done
    echo "$files files checked for arm64"
    exit $status
    ;;
*)
    echo "neon_run.sh: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
