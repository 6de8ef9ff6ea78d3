#!/usr/bin/env bash
# Installs what keel needs on Debian (apt packages it lacks), then configures and builds into
# ./build with ninja (and ccache when present). Safe to rerun: only missing packages are installed
# and the build is incremental.
#   tools/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ ccache pkg-config libeigen3-dev libprotobuf-dev protobuf-compiler
          libgflags-dev libgoogle-glog-dev libgtest-dev libgmock-dev libgloo-dev libdnnl-dev
          zlib1g-dev python3 python3-pip)
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

# Optional: the real safetensors reader, used by the io tests to check our files (skipped if absent).
if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
  python3 -m pip install -q safetensors numpy 2>/dev/null ||
    python3 -m pip install -q --break-system-packages safetensors numpy 2>/dev/null ||
    echo "setup: python safetensors not installed; its cross-check tests will skip"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
