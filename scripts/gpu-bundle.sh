#!/usr/bin/env bash
# Packs a CUDA build of dilocod for a GPU machine that has the CUDA driver and
# runtime but not Debian's -dev packages (ZeroMQ, yaml-cpp, OpenBLAS, ...):
# the binaries gpu-check.sh runs, plus every shared library they load that is
# neither glibc, the C++ runtime nor a CUDA library (those come from the GPU
# machine: its driver, toolkit or Python wheels).
#
#   scripts/gpu-bundle.sh [OUT.tar.xz]      # default .gpu-bundle/bundle.tar.xz
#   BUILD_DIR=build scripts/gpu-bundle.sh   # reuse a CUDA-enabled build
# Then, on the GPU machine: scripts/gpu-check.sh --prebuilt .gpu-bundle/bundle.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-gpu}
CUDA_ARCH=${CUDA_ARCH:-90}
out=${1:-.gpu-bundle/bundle.tar.xz}
targets=(cuda_tests cuda_bench dilococtl)

[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH=/usr/local/cuda/bin:$PATH
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDILOCO_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"
fi
grep -q "^CMAKE_CUDA_COMPILER:.*nvcc" "$BUILD_DIR/CMakeCache.txt" ||
  { echo "gpu-bundle: $BUILD_DIR is not a CUDA build (configure with -DDILOCO_CUDA=ON)" >&2; exit 2; }
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for t in "${targets[@]}"; do
  strip -o "$stage/bin/$t" "$BUILD_DIR/bin/$t"
done
# Libraries the GPU machine provides itself, by soname prefix.
system='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnccl|libnvidia)'
for t in "${targets[@]}"; do ldd "$BUILD_DIR/bin/$t"; done |
  awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r name path; do
    [[ $name =~ $system ]] || cp -L "$path" "$stage/lib/$name"
  done
git rev-parse HEAD >"$stage/commit" 2>/dev/null || true
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" .
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1)): ${targets[*]} + $(ls "$stage/lib" | wc -l) libraries"
