#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds a program against it, with pkg-config
# and with CMake's find_package.
set -euo pipefail
build=$1
prefix=$(mktemp -d /tmp/cf-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > "$prefix/install.log"
test -f "$prefix/include/corefit.h"
test -f "$prefix/lib/libcorefit.a"
ls "$prefix"/lib/libcorefit.so* > /dev/null
test -f "$prefix/lib/pkgconfig/corefit.pc"
test -f "$prefix/lib/cmake/corefit/corefitConfig.cmake"
# the converter train --pretrained names for a PyTorch .pth, installed beside the command
test -x "$prefix/bin/corefit-convert-pth"
convert_usage=$("$prefix/bin/corefit-convert-pth" 2>&1 || true)
grep -q "usage: .*IN.pth OUT.safetensors" <<< "$convert_usage"

mkdir -p "$prefix/app"
cat > "$prefix/app/main.c" <<'C'
#include <corefit.h>
#include <stdio.h>
int main(void) {
    cf_module *layers[] = {cf_linear(3, 4, true), cf_relu(), cf_linear(4, 2, true)};
    cf_model *m = NULL;
    if (cf_model_new(&m, cf_sequential(3, layers), 1) != CF_OK) return 1;
    float x[6] = {1, 2, 3, 4, 5, 6};
    const cf_tensor *y;
    cf_tensor in = cf_tensor_view(x, cf_shape2(2, 3));
    if (cf_model_forward(m, &in, &y) != CF_OK) return 1;
    printf("ok %d parameters, output (%d, %d)\n", (int)cf_model_num_weights(m), y->shape.dim[0],
           y->shape.dim[1]);
    cf_model_free(m);
    return 0;
}
C
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# with only corefit's .pc on the path, --cflags and --libs work and name nothing but corefit's
# own folders: the libraries it uses are private to it (Libs.private, not Requires)
only=$(PKG_CONFIG_LIBDIR="$prefix/lib/pkgconfig" pkg-config --cflags --libs corefit) || {
    echo "pkg-config --cflags --libs corefit fails with only corefit.pc on the path"
    exit 1
}
for flag in $only; do
    case "$flag" in
    -I*/include | -L*/lib | -Wl,-rpath,*/lib | -lcorefit) ;;
    *) echo "pkg-config --cflags --libs corefit gives $flag (from: $only)"; exit 1 ;;
    esac
done
# the .pc's run-time path finds libcorefit.so in the prefix (no LD_LIBRARY_PATH, no ldconfig)
gcc -std=c11 -Wall -Wextra -Werror "$prefix/app/main.c" -o "$prefix/app/shared" \
    $(pkg-config --cflags --libs corefit)
env -u LD_LIBRARY_PATH "$prefix/app/shared" | grep -q "ok 26 parameters, output (2, 2)"

# The README's quick start, exactly as printed, is ISO C11 (pedantic, no warnings) and builds
# with the line the README gives; with a wrong data folder it stops with a message naming it.
src=$(dirname "$0")/..
awk '/^## Quick start in C/ {on = 1} on && /^```c$/ {grab = 1; next} grab && /^```$/ {exit}
     grab {print}' "$src/README.md" > "$prefix/app/readme.c"
grep -q "cf_par_fit_one_cycle" "$prefix/app/readme.c"
gcc -std=c11 -pedantic -Wall -Wextra -Werror "$prefix/app/readme.c" -o "$prefix/app/readme" \
    $(pkg-config --cflags --libs corefit)
if command -v clang > /dev/null; then
    clang -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only "$prefix/app/readme.c" \
        $(pkg-config --cflags corefit)
fi
set +e
(cd "$prefix/app" && env -u LD_LIBRARY_PATH ./readme /nonexistent/fmnist) > "$prefix/app/readme.out" 2>&1
rc=$?
set -e
if [ $rc -ne 1 ] || ! grep -q "error: .*/nonexistent/fmnist" "$prefix/app/readme.out"; then
    echo "README quick start with a wrong folder: exit $rc, expected 1 and a message:"
    cat "$prefix/app/readme.out"
    exit 1
fi
gcc -std=c11 "$prefix/app/main.c" -o "$prefix/app/static" \
    $(pkg-config --cflags corefit) "$prefix/lib/libcorefit.a" \
    $(pkg-config --libs --static corefit | sed 's/-lcorefit//')
"$prefix/app/static" | grep -q "ok 26 parameters"

cat > "$prefix/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(app C)
find_package(corefit REQUIRED)
add_executable(app main.c)
target_link_libraries(app PRIVATE corefit::corefit_static)
CM
cmake -S "$prefix/app" -B "$prefix/app/build" -DCMAKE_PREFIX_PATH="$prefix" > "$prefix/cmake.log"
cmake --build "$prefix/app/build" > "$prefix/build.log"
"$prefix/app/build/app" | grep -q "ok 26 parameters"
echo "installed corefit builds and runs with pkg-config (shared, static) and find_package"
