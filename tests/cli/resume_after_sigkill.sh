#!/usr/bin/env bash
# kill -9 in the middle of a search, then --resume: it finishes the budget, losing and repeating nothing.
set -euo pipefail
search=$1 problem=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$search" "$problem" --budget 12 --jobs 2 --seed 8 --store runs.db > first.txt 2>&1 &
pid=$!
count() { sqlite3 runs.db 'select count(*) from evaluations' 2>/dev/null || echo 0; }
for _ in $(seq 1 600); do
  [ "$(count)" -ge 4 ] && break
  kill -0 $pid 2>/dev/null || { echo "the search ended before it could be killed"; cat first.txt; exit 1; }
  sleep 0.1
done
kill -9 $pid
wait $pid 2>/dev/null || true
before=$(count)
echo "killed after $before stored evaluations"
[ "$before" -lt 13 ] || { echo "the search finished before the kill"; exit 1; }
"$search" "$problem" --store runs.db --resume --json summary.json > second.txt 2>&1 || { cat second.txt; exit 1; }
grep -q '"evaluations":13' summary.json || { echo "expected 13 evaluations"; cat summary.json second.txt; exit 1; }
# Every node has at most one evaluation, and every node has one now.
[ "$(sqlite3 runs.db 'select count(*) from nodes')" = 13 ]
[ "$(sqlite3 runs.db 'select count(distinct node_id) from evaluations')" = 13 ]
[ "$(sqlite3 runs.db 'select count(*) from evaluations')" = 13 ]
[ "$(sqlite3 runs.db "select stopped_because from runs")" = evaluation_budget ]
tail -1 second.txt
