#!/bin/sh
# Usage: isa_objects.sh OBJDUMP OBJECT... — fails when an object outside the vector kernel
# tables uses ymm/zmm registers or AVX-512 masks, or when the AVX2 table uses AVX-512.
objdump=$1
shift
status=0
checked=0
for obj in "$@"; do
  case "$obj" in
    *isa_avx512.c.o | *isa_avx512_bf16.c.o | *isa_avx512_bf16_wino.c.o | *isa_amx.c.o) continue ;;
    *isa_avx2.c.o) pattern='%zmm|%k[0-7]' ;;
    *) pattern='%ymm|%zmm|%k[0-7]' ;;
  esac
  checked=$((checked + 1))
  hits=$("$objdump" -d --no-show-raw-insn "$obj" | grep -E "$pattern" | head -3)
  if [ -n "$hits" ]; then
    echo "FAIL: $obj uses instructions beyond its instruction set:"
    echo "$hits"
    status=1
  fi
done
if [ "$checked" -lt 10 ]; then
  echo "FAIL: only $checked objects checked"
  exit 1
fi
[ $status -eq 0 ] && echo "$checked objects: none uses an instruction set above its own"
exit $status
