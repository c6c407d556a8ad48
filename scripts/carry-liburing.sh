#!/usr/bin/env bash
# Copies this machine's liburing (headers, static library) into build-deps/liburing with a pkg-config
# file of its own, for a build machine that lacks liburing-dev and cannot install it (the GPU
# machine): carried there with the working tree, it lets scripts/gpu-cuda-check.sh build the NVMe
# offload. Needs liburing-dev here (scripts/setup-debian.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
lib=$(pkg-config --variable=libdir liburing)
include=$(pkg-config --variable=includedir liburing)
version=$(pkg-config --modversion liburing)
out=build-deps/liburing
rm -rf "$out"
mkdir -p "$out/include" "$out/lib/pkgconfig"
cp -r "$include/liburing" "$include/liburing.h" "$out/include/"
cp "$lib/liburing.a" "$out/lib/"  # static only: nothing to find at run time on the other machine
cat > "$out/lib/pkgconfig/liburing.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: liburing
Version: $version
Description: io_uring library (a static copy for another build machine)
Libs: -L\${libdir} -luring
Cflags: -I\${includedir}
PC
echo "$out: liburing $version"
