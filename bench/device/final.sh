#!/usr/bin/env bash
# The session's closing device checks, in one call (after bench/device/batch.sh built build-dev), most important
# first so that a time cap cuts the least important part:
#  1. issue 9 side by side on GPU 0: `trex bench train` (default = grouped expert GEMMs, then --moe-gemm per-expert,
#     both with --sections) and the Hugging Face baseline, flash-l4 @8192 and small-s6 @4096, one JSON line each;
#  2. issue 8: bench/device/infer.sh (engine tests, bench-serve at 1/16/64, HTTP load test, transformers generate);
#  3. `trex parity --device cuda` on the fixtures (gpuparity.sh);
#  4. every GPU test binary in full (PASS/FAIL per binary; the multi-GPU tests need two GPUs and skip on one).
# Usage (repo root, device): bash bench/device/final.sh [TOTAL_SECONDS]
set -uo pipefail
export PYTHONUNBUFFERED=1
B=build-dev
T0=$(date +%s)
TOTAL=${1:-470}
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { local l=$(( TOTAL - ($(date +%s) - T0) )); [ $l -lt 1 ] && l=1; [ $1 -lt $l ] && echo $1 || echo $l; }
one() {  # limit, command...
  local lim; lim=$(left $1); shift
  echo "== $*"
  timeout "$lim" "$@" 2>&1 | grep -E '^\{|rror|Traceback|out of memory' | tail -3
  el
}
export CUDA_VISIBLE_DEVICES=0
for spec in "flash-l4.json 8192" "small-s6.json 4096"; do
  set -- $spec
  one 50 $B/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 8 --warmup 3 --sections --device cuda
  one 50 $B/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 8 --warmup 3 --sections --device cuda \
    --moe-gemm per-expert
  one 100 python3 .devdeps/hf_baseline.py .devdeps/$1 --seq $2 --batch 1
done
timeout "$(left 150)" bash bench/device/infer.sh
el
timeout "$(left 40)" bash bench/device/gpuparity.sh 2>&1 | grep -vE "^\s*$" | tail -25
el
unset CUDA_VISIBLE_DEVICES
echo "== GPUs: $(nvidia-smi -L | wc -l)"
for t in test_kernels_gpu test_train_gpu test_infer_gpu test_comm_gpu; do
  if [ ! -x $B/tests/$t ]; then echo "FAIL $t: not built"; continue; fi
  log=$(timeout "$(left 90)" $B/tests/$t 2>&1); rc=$?
  echo "$log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" | head -12
  echo "$( [ $rc -eq 0 ] && echo PASS || echo FAIL ) $t (rc $rc, $(echo "$log" | grep -cE '^\[       OK') ok, $(echo "$log" | grep -cE '^\[  SKIPPED \]') skipped)"
  el
done
