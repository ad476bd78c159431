#!/usr/bin/env bash
# A signal in the middle of a search, then --resume: it finishes the budget, losing and repeating
# nothing. KILL (the default) stops it dead; INT (Ctrl-C) lets it stop cleanly, and leaves the run
# open for --resume.
set -euo pipefail
search=$1 problem=$2 signal=${3:-KILL}
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
tail -1 second.txt
