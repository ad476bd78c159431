#!/usr/bin/env bash
# kevo-search runs a short search and says what it found: last line, JSON summary, best kernel, report.
set -euo pipefail
search=$1 problem=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$search" "$problem" --budget 6 --jobs 2 --json summary.json --seed 5 > out.txt
tail -1 out.txt | grep -Eq '^best: [0-9]+\.[0-9]x over reference \(verified\)$' || { echo "bad last line"; cat out.txt; exit 1; }
for key in problem target evaluations best_speedup best_candidate stopped_because store; do
  grep -q "\"$key\":" summary.json || { echo "summary lacks $key"; cat summary.json; exit 1; }
done
grep -q '"evaluations":7' summary.json || { echo "expected 7 evaluations"; cat summary.json; exit 1; }
grep -q '"stopped_because":"evaluation_budget"' summary.json
grep -q 'void kernel' kevo-runs/cpu_scoring.best.cpp
grep -q '<svg' kevo-runs/cpu_scoring.html
# One best node, the verified one, named alike by the console, the JSON summary and the report.
node=$(grep -o '"node":[0-9]*' summary.json | cut -d: -f2)
grep -q "^best kernel: .* (node $node, " out.txt || { echo "the console names another best node than the JSON ($node)"; cat out.txt; exit 1; }
grep -q "(verified: node $node, " kevo-runs/cpu_scoring.html || { echo "the report names another best node than the JSON ($node)"; exit 1; }
echo "ok: $(tail -1 out.txt)"
