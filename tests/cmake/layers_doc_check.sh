#!/usr/bin/env bash
# docs/architecture.md's layer table (between <!-- layers:begin --> and <!-- layers:end -->) must
# name the same layers, paths and uses, in the same order, as the build's (CMakeLists.txt's
# keel_layer calls, written to BUILD/keel_layers.md). Usage: layers_doc_check.sh DOC BUILD_TABLE
set -euo pipefail
doc=$1 table=$2
# The first three cells of each row, spaces trimmed; the header and separator rows dropped.
cells() { awk -F'|' '{ for (i = 2; i <= 4; ++i) { gsub(/^ +| +$/, "", $i) } print $2 "|" $3 "|" $4 }'; }
want=$(cells < "$table")
have=$(sed -n '/<!-- layers:begin -->/,/<!-- layers:end -->/p' "$doc" | grep '^|' | tail -n +3 | cells)
if [[ "$want" != "$have" ]]; then
  echo "docs/architecture.md's layer table differs from the build's (CMakeLists.txt keel_layer):"
  diff <(echo "$want") <(echo "$have") | sed 's/^</build:/; s/^>/doc:  /'
  exit 1
fi
echo "layer table: $(echo "$want" | wc -l) layers agree"
