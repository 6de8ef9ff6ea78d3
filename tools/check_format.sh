#!/usr/bin/env bash
# Every C++ and CUDA file git tracks must be as clang-format (.clang-format) writes it.
#   tools/check_format.sh         lists the files that differ and exits 1 if any does
#   tools/check_format.sh --fix   rewrites them in place
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null ||
  { echo "check_format: clang-format is not installed (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format "$f" | cmp -s - "$f" || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} file(s) differ from clang-format ($(clang-format --version)):"
  printf '  %s\n' "${bad[@]}"
  echo "run tools/check_format.sh --fix"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
