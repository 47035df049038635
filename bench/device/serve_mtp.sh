#!/usr/bin/env bash
# Speculative decoding with the MTP layer on the GPU (issue 20 item 1), about 150 s on GPU 0, everything on stdout:
#  1. test_infer_gpu, the SpeculativeMtp tests (speculation == plain greedy on a random tiny model with an MTP
#     layer, through generate() and the scheduler with a sampled neighbour; the flash-l4 shapes with an MTP layer;
#     the demo's export when .devdeps/demo-hf holds it: GPU greedy vs the CPU engine, speculation == plain, the
#     trained MTP's acceptance);
#  2. `trex bench-serve` on flash-l4 with one MTP layer (random bf16 weights), --speculative off and mtp, 16 and
#     64 sequences (P=512, G=64): decode tok/s, the drafts and acceptance, decode steps;
#  3. the same on the demo's export (its trained MTP: the acceptance rate of a trained module), P=64, G=128;
#  4. with the time left, the plain engine's tests (GpuEngine*: no regression without speculation).
# Assumes build-dev holds trex and tests/test_infer_gpu (`bash bench/device/batch.sh 160 serve_mtp` builds them) and
# .devdeps/flash-l4.json. Usage (repo root, device): bash bench/device/serve_mtp.sh [BUDGET_SECONDS] [all|tests|bench]
set -uo pipefail
B=${B:-build-dev}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
[ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ] && export TREX_SHARED=$PWD/.devdeps
T0=$(date +%s)
BUDGET=${1:-150}
PART=${2:-all}
left() { local l=$(( BUDGET - ($(date +%s) - T0) )); [ "$l" -lt 5 ] && l=5; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
CFG=$(mktemp --suffix .json)
python3 - .devdeps/flash-l4.json "$CFG" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_nextn_predict_layers"] = 1
c["compress_ratios"] = c["compress_ratios"] + [0]  # the MTP block: sliding
json.dump(c, open(sys.argv[2], "w"))
PYEOF

if [ "$PART" != bench ]; then
echo "== test_infer_gpu SpeculativeMtp.* [$(( $(date +%s) - T0 )) s]"
timeout "$(left 70)" $B/tests/test_infer_gpu --gtest_filter='SpeculativeMtp.*' 2>&1 | grep -vE "^\[ RUN|^\[       OK"
echo "SpeculativeMtp exit ${PIPESTATUS[0]}"
fi
[ "$PART" = tests ] && { rm -f "$CFG"; echo "== serve_mtp tests total $(( $(date +%s) - T0 )) s"; exit 0; }

bench() {  # label, limit, args...
  local label=$1 lim=$2; shift 2
  for s in off mtp; do
    echo "== bench-serve $label --speculative $s [$(( $(date +%s) - T0 )) s]"
    timeout "$(left "$lim")" $B/trex bench-serve --device cuda --concurrency 16,64 --speculative $s "$@" 2>&1 |
      grep -E "^C=|BENCH_SERVE|PASS|FAIL|rror" | tail -8
  done
}
bench "flash-l4 + MTP (random weights)" 40 --config "$CFG" --seed 1 --prompt-tokens 512 --gen-tokens 64
if [ -f .devdeps/demo-hf/config.json ]; then
  bench "demo export" 30 --model .devdeps/demo-hf --prompt-tokens 64 --gen-tokens 128
else
  echo "SKIP bench-serve on the demo export: .devdeps/demo-hf missing"
fi
# The plain engine's own tests last (no regression of the engine without speculation), with the time left.
if [ "$PART" = all ] && [ "$(( BUDGET - ($(date +%s) - T0) ))" -gt 20 ]; then
  echo "== test_infer_gpu GpuEngine* [$(( $(date +%s) - T0 )) s]"
  timeout "$(left 45)" $B/tests/test_infer_gpu --gtest_filter='GpuEngine*' 2>&1 | grep -E "FAILED|PASSED|Failure|rror" | head -20
  echo "GpuEngine exit ${PIPESTATUS[0]}"
fi
rm -f "$CFG"
echo "== serve_mtp total $(( $(date +%s) - T0 )) s"
