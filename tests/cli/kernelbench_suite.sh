#!/usr/bin/env bash
# kevo-suite over four of the project's KernelBench-format problems at a small scale, on the CPU with Debian's
# PyTorch: three searched offline, one that no family matches named as needing --llm; the table as text, JSON
# and HTML; killed in the middle of a search, it continues that search from the store when run again, and reads
# back the finished ones. Also kevo-search on a .py: a family problem searched, the LLM-only one refused by name.
set -euo pipefail
suite=$1 search=$2 problems=$3
work=$(mktemp -d /tmp/kevo-suite-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/set"
cp "$problems/01_relu.py" "$problems/11_argmax.py" "$problems/17_linear.py" "$problems/19_scaled_residual.py" "$work/set/"
export XDG_CACHE_HOME="$work/cache"
args=("$work/set" --budget 2 --jobs 2 --size-scale 0.02 --out "$work/out")

# Killed (SIGKILL) once the second problem's search has stored an evaluation: its search dies with it.
"$suite" "${args[@]}" > "$work/first.txt" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  n=$(sqlite3 "$work/out/suite.db" "SELECT count(*) FROM evaluations e JOIN nodes n ON e.node_id = n.id JOIN runs r ON n.run_id = r.id WHERE r.problem = '11_argmax'" 2>/dev/null || echo 0)
  [ "${n:-0}" -ge 1 ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.5
done
kill -9 $pid 2>/dev/null || { echo "the suite ended before it could be killed"; cat "$work/first.txt"; exit 1; }
wait $pid 2>/dev/null || true
sleep 1
pgrep -f "kevo-search $work/set" >/dev/null && { echo "a search outlived the killed suite"; exit 1; }

"$suite" "${args[@]}" > "$work/second.txt" 2>&1 || { echo "the second run failed"; cat "$work/second.txt"; exit 1; }
grep -q "finished earlier" "$work/second.txt" || { echo "the first problem was not read back"; cat "$work/second.txt"; exit 1; }
grep -q "continuing its unfinished search" "$work/second.txt" || { echo "the killed search did not continue"; cat "$work/second.txt"; exit 1; }
runs=$(sqlite3 "$work/out/suite.db" "SELECT count(*) FROM runs WHERE problem = '11_argmax'")
[ "$runs" = 1 ] || { echo "11_argmax has $runs runs: the killed search began again rather than continuing"; exit 1; }
grep -q "19_scaled_residual.py: no template family matches it; it needs --llm" "$work/second.txt"

python3 - "$work/out/suite.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["problem"]: r for r in d["problems"]}
assert set(rows) == {"01_relu.py", "11_argmax.py", "17_linear.py", "19_scaled_residual.py"}, rows
for name in ("01_relu.py", "11_argmax.py", "17_linear.py"):
    assert rows[name]["correct"] and rows[name]["speedup_over_eager"] > 0, rows[name]
assert not rows["19_scaled_residual.py"]["correct"] and rows["19_scaled_residual.py"]["stopped_because"] == "needs --llm"
s = d["score"]
assert s["problems"] == 4 and s["correct"] == 3 and abs(s["over_eager"]["fast_0"] - 0.75) < 1e-9, s
assert s["geomean_over_eager"] > 0 and s["compile_timed"] == 0, s
assert d["settings"]["size_scale"] == 0.02
PY
grep -q "over PyTorch eager:   fast_0 75%" "$work/out/suite.txt"
grep -q "<svg" "$work/out/suite.html"
grep -q "01_relu.py" "$work/out/suite.html"

# A third run searches nothing: every problem is read back.
"$suite" "${args[@]}" > "$work/third.txt" 2>&1
[ "$(grep -c "finished earlier" "$work/third.txt")" = 3 ] || { echo "a finished search ran again"; cat "$work/third.txt"; exit 1; }

# kevo-search on a .py: --describe says what PyTorch taught it and searches nothing; the family problem
# searched; the one no family matches refused by name (exit 2).
cd "$work"
"$search" "$problems/04_softmax.py" --size-scale 0.02 --describe > described.txt
grep -q "^04_softmax: KernelBench-format problem .*04_softmax.py, the softmax family" described.txt &&
  grep -q "^  input x: float of " described.txt && grep -q "^  knob " described.txt ||
  { echo "--describe did not describe 04_softmax.py"; cat described.txt; exit 1; }
[ ! -e kevo-runs ] || { echo "--describe searched"; exit 1; }
"$search" "$problems/04_softmax.py" --size-scale 0.02 --budget 1 --json softmax.json > softmax.txt
tail -1 softmax.txt | grep -Eq '^best: [0-9]+\.[0-9]x over PyTorch eager \(verified\)$' || { echo "bad last line"; cat softmax.txt; exit 1; }
grep -q '"speedup_over_eager":' softmax.json && grep -q '"family":"softmax"' softmax.json && grep -q '"size_scale":0.02' softmax.json
set +e
"$search" "$problems/19_scaled_residual.py" --size-scale 0.02 > llm_only.txt 2>&1
code=$?
set -e
[ $code = 2 ] || { echo "expected exit 2, got $code"; cat llm_only.txt; exit 1; }
grep -q "kevo-search: KernelBench-format problem .*19_scaled_residual.py: no template family matches its forward (its forward calls sigmoid, mul, add), so an LLM writes its kernels, sizes scaled by 0.02; kevo-llm-search takes it" llm_only.txt || { cat llm_only.txt; exit 1; }
echo "ok: $(tail -2 "$work/out/suite.txt" | head -1)"
