#!/usr/bin/env bash
# Regenerates the golden program texts under tests/golden/ from the current code. Run it only when
# a change to a pass or the printer is intended, then review `git diff tests/golden`.
set -euo pipefail
build=${1:-build}
for t in "$build"/tests/*_test; do
  KEEL_UPDATE_GOLDEN=1 "$t" --gtest_brief=1 >/dev/null || true
done
git -C "$(dirname "$0")/.." status --short tests/golden
