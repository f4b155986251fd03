#!/usr/bin/env bash
# Sets up a fresh Debian machine and builds dilocod (Release) into build/,
# binaries in build/bin/. Idempotent: installs only missing packages and
# rebuilds incrementally.
#   scripts/setup.sh                  # CUDA backend if nvcc is found (AUTO)
#   DILOCO_CUDA=OFF scripts/setup.sh  # never build CUDA code
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ cmake ninja-build pkg-config
  libopenblas-dev                        # CBLAS sgemm for the CPU engine
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev catch2
  libzmq3-dev cppzmq-dev libsodium-dev   # transport and CURVE security
  libgloo-dev                            # the local ring over processes (kernels/comm/gloo_comm.h; optional)
  libflatbuffers-dev flatbuffers-compiler
  libcpp-httplib-dev                     # the Prometheus /metrics endpoint
  fortunes                               # the demo corpus: /usr/share/games/fortunes
  iproute2 jq                            # tests: the network-namespace cluster (scripts/netns-cluster.sh)
  prometheus                             # tests: promtool checks /metrics and the example scrape configs
  chromium                               # tests: the report rendered in a real browser
  python3-torch                          # tests: exports loaded by PyTorch
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDILOCO_CUDA="${DILOCO_CUDA:-AUTO}"
cmake --build build -j "$(nproc)"
echo "setup: built $(ls build/bin | tr '\n' ' ')in build/bin"
