#!/usr/bin/env bash
# Scores the answers of the end-to-end run (docs/e2e.md) HERE, where the solvers are: `trex eval score` over the
# evaluation subset of .devdeps/e2e/eval with the responses.jsonl that bench/device/e2e.sh wrote (fetched from the
# device's $OUT/e2e/). Each benchmark is scored under its own rule (trex eval picks it by file stem: NL4OPT-289
# and OptiBench use T-Rex's absolute 1e-6 on the objective); items without an answer count as no_code.
# Writes RESPONSES_DIR/score/ (results.jsonl, summary.json, report.html) and prints the Pass@1 table.
# Usage (repo root): scripts/e2e_score.sh RESPONSES_DIR|e2e.tgz [TREX_BINARY]   (default ./build-e2e/trex, solvers ON)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: scripts/e2e_score.sh RESPONSES_DIR|e2e.tgz [TREX_BINARY]}
# The device run's single file (bench/device/e2e.sh writes $OUT/e2e.tgz): unpack it next to itself when possible.
if [ -f "$DIR" ]; then
  dest=$(dirname "$DIR")/e2e_unpacked
  mkdir -p "$dest" 2>/dev/null && [ -w "$dest" ] || dest=$(mktemp -d /tmp/e2e_unpacked.XXXXXX)
  tar -xzf "$DIR" -C "$dest"
  DIR=$dest/e2e
  echo "== unpacked into $DIR"
fi
TREX=${2:-./build-e2e/trex}
EVAL=${E2E_EVAL_DIR:-.devdeps/e2e/eval}
[ -x "$TREX" ] || { echo "e2e_score: $TREX is not an executable trex binary" >&2; exit 1; }
[ -s "$DIR/responses.jsonl" ] || { echo "e2e_score: $DIR/responses.jsonl missing or empty" >&2; exit 1; }
OUTD=${E2E_SCORE_OUT:-$DIR/score}
# The fetched directory may be read-only (the device runner's files_at): fall back to a sibling directory.
if ! mkdir -p "$OUTD" 2>/dev/null || [ ! -w "$OUTD" ]; then OUTD=$(mktemp -d /tmp/e2e_score.XXXXXX); fi
echo "== $(wc -l <"$DIR/responses.jsonl") responses from $DIR; benchmarks: $(ls "$EVAL"/*.jsonl | xargs -n1 basename | tr '\n' ' ')"
"$TREX" eval score --benchmark "$EVAL"/*.jsonl --responses "$DIR/responses.jsonl" --out "$OUTD" --no-progress \
  --jobs "${E2E_SCORE_JOBS:-2}" --timeout "${E2E_SCORE_TIMEOUT:-30}"
python3 - "$OUTD/summary.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
print("== Pass@1 summary (" + sys.argv[1] + ")")
for b in s.get("benchmarks", []):
    print(f"{b.get('benchmark')}: Pass@1 {b.get('pass_at_1', 0):.2f}% ({b.get('correct')}/{b.get('scored')}, rule "
          f"{b.get('rule')}); status {b.get('status_counts')}; failures {b.get('failure_details')}")
if "overall" in s:
    print("overall:", json.dumps(s["overall"]))
PYEOF
echo "== report: $OUTD/report.html"
