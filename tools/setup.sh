#!/usr/bin/env bash
# Installs what keel needs on Debian (apt packages it lacks), then configures and builds into
# ./build with ninja (and ccache when present). Safe to rerun: only missing packages are installed
# and the build is incremental.
#   tools/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ ccache pkg-config libeigen3-dev libprotobuf-dev protobuf-compiler
          libgflags-dev libgoogle-glog-dev libgtest-dev libgmock-dev libgloo-dev libdnnl-dev
          zlib1g-dev libssl-dev python3 python3-pip clang-format
          openmpi-bin iproute2)  # mpirun tests; two-host tests in network namespaces
# CI's ASan job also wants clang: KEEL_SETUP_EXTRA="clang".
read -r -a extra <<<"${KEEL_SETUP_EXTRA:-}"
packages+=("${extra[@]}")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Optional: the real safetensors and TensorBoard readers, which the io and summary tests use to
# check keel's files (those checks skip when the packages are absent).
if ! python3 -c 'import safetensors, numpy, tensorboard' 2>/dev/null; then
  python3 -m pip install -q safetensors numpy tensorboard 2>/dev/null ||
    python3 -m pip install -q --break-system-packages safetensors numpy tensorboard 2>/dev/null ||
    echo "setup: python safetensors/tensorboard not installed; their cross-check tests will skip"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
