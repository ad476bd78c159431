#!/usr/bin/env bash
# A signal in the middle of a search, then --resume: it finishes the budget, losing and repeating
# nothing, and says what it found as any search does (last line, JSON summary, best kernel, report).
# KILL (the default) stops it dead; INT (Ctrl-C) lets it stop cleanly, and leaves the run open for
# --resume. (The report's checks ride on this search rather than a third one: issue 50.)
# The problem is the Quick start's, timed on an eighth of its ads: what is checked is what a signal
# leaves behind, and the full size made each evaluation ~8 s of two cores (issue 50).
set -euo pipefail
search=$1 shipped=$2 signal=${3:-KILL}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
problem=$work/cpu_scoring
cp -r "$shipped" "$problem"
python3 - "$problem/problem.json" <<'PY'
import json, sys
path = sys.argv[1]
spec = json.load(open(path))
spec["timing_shape"]["N"] //= 8
json.dump(spec, open(path, "w"), indent=1)
PY
"$search" "$problem" --budget 12 --jobs 2 --seed 8 --store runs.db > first.txt 2>&1 &
pid=$!
count() { sqlite3 runs.db 'select count(*) from evaluations' 2>/dev/null || echo 0; }
for _ in $(seq 1 600); do
  [ "$(count)" -ge 4 ] && break
  kill -0 $pid 2>/dev/null || { echo "the search ended before it could be killed"; cat first.txt; exit 1; }
  sleep 0.1
done
kill -s "$signal" $pid
status=0
wait $pid 2>/dev/null || status=$?
before=$(count)
echo "stopped by SIG$signal after $before stored evaluations (exit status $status)"
[ "$before" -lt 13 ] || { echo "the search finished before the signal"; exit 1; }
if [ "$signal" = INT ]; then
  [ "$status" = 130 ] || { echo "expected exit status 130 after Ctrl-C"; cat first.txt; exit 1; }
  grep -q -- "--resume continues the run" first.txt || { echo "no word of --resume after Ctrl-C"; cat first.txt; exit 1; }
  [ -z "$(sqlite3 runs.db "select coalesce(stopped_because, '') from runs")" ] || { echo "the interrupted run was closed"; exit 1; }
fi
"$search" "$problem" --store runs.db --resume --json summary.json > second.txt 2>&1 || { cat second.txt; exit 1; }
grep -q '"evaluations":13' summary.json || { echo "expected 13 evaluations"; cat summary.json second.txt; exit 1; }
# Every node has at most one evaluation, and every node has one now.
[ "$(sqlite3 runs.db 'select count(*) from nodes')" = 13 ]
[ "$(sqlite3 runs.db 'select count(distinct node_id) from evaluations')" = 13 ]
[ "$(sqlite3 runs.db 'select count(*) from evaluations')" = 13 ]
[ "$(sqlite3 runs.db "select stopped_because from runs")" = evaluation_budget ]
# What it found, said alike everywhere: the last line, the summary, the best kernel and the report,
# with one best node, the verified one, named alike by the console, the JSON summary and the report.
tail -1 second.txt | grep -Eq '^best: [0-9]+\.[0-9]x over reference \(verified\)$' || { echo "bad last line"; cat second.txt; exit 1; }
for key in problem target evaluations best_speedup best_candidate stopped_because store; do
  grep -q "\"$key\":" summary.json || { echo "summary lacks $key"; cat summary.json; exit 1; }
done
grep -q '"stopped_because":"evaluation_budget"' summary.json
grep -q 'void kernel' kevo-runs/cpu_scoring.best.cpp
grep -q '<svg' kevo-runs/cpu_scoring.html
node=$(grep -o '"node":[0-9]*' summary.json | cut -d: -f2)
grep -q "^best kernel: .* (node $node, " second.txt || { echo "the console names another best node than the JSON ($node)"; cat second.txt; exit 1; }
grep -q "(verified: node $node, " kevo-runs/cpu_scoring.html || { echo "the report names another best node than the JSON ($node)"; exit 1; }
echo "ok: $(tail -1 second.txt)"
