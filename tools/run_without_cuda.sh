#!/usr/bin/env bash
# Runs a command where no CUDA library can be opened, as on a machine without CUDA:
#   tools/run_without_cuda.sh CMD [ARGS...]
# In a private mount namespace, an empty folder is mounted over each folder that holds CUDA
# libraries (the toolkit's under /usr/local, Python's nvidia wheels), so the loader's cache and
# RUNPATHs point at nothing. Needs root or unprivileged user namespaces; exits 77 when neither
# works (CTest counts that as skipped).
set -euo pipefail
if [ "${KEEL_CUDA_HIDDEN:-}" != 1 ]; then
  args=(--mount --propagation private)
  [ "$(id -u)" -ne 0 ] && args+=(--map-root-user)
  if ! unshare "${args[@]}" true 2>/dev/null; then
    echo "run_without_cuda: cannot make a mount namespace (unshare ${args[*]}); skipped" >&2
    exit 77
  fi
  exec unshare "${args[@]}" env KEEL_CUDA_HIDDEN=1 "$0" "$@"
fi
empty=$(mktemp -d /tmp/keel-no-cuda.XXXXXX)
hidden=()
for d in /usr/local/cuda /usr/local/cuda-* /usr/local/lib64 /usr/local/targets \
         $(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) + "/nvidia")' \
           2>/dev/null || true); do
  [ -e "$d" ] || continue
  real=$(realpath "$d")
  [ -d "$real" ] || continue
  case " ${hidden[*]} " in *" $real "*) continue ;; esac  # two names of one folder
  mount --bind "$empty" "$real"
  hidden+=("$real")
done
# Check the hiding: the CUDA runtime must not open now.
if python3 -c 'import ctypes; ctypes.CDLL("libcudart.so.13")' 2>/dev/null ||
   python3 -c 'import ctypes; ctypes.CDLL("libcudart.so")' 2>/dev/null; then
  echo "run_without_cuda: libcudart still opens after hiding ${hidden[*]}" >&2
  exit 1
fi
echo "run_without_cuda: hidden ${hidden[*]:-nothing (no CUDA here)}" >&2
exec "$@"
