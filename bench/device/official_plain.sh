#!/usr/bin/env bash
# Issue 9's side by side without timing instrumentation (no --sections: no CUDA events between sections), GPU 0:
# `trex bench train` (default expert GEMMs = grouped) then the Hugging Face baseline, flash-l4 @8192 and small-s6
# @4096; first the expert-parallel GPU test on both GPUs (its noise floor was re-derived after the 01:50 call).
set -uo pipefail
B=build-dev
T0=$(date +%s)
timeout 40 $B/tests/test_train_gpu --gtest_filter='MoeEpGpu.*' 2>&1 | grep -E "loss all-local|OK \]|FAILED|Failure" | head -12
export CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1
for spec in "flash-l4.json 8192 75" "small-s6.json 4096 45"; do
  set -- $spec
  echo "== trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 10 --warmup 3 --device cuda"
  timeout 40 $B/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 10 --warmup 3 --device cuda 2>&1 |
    grep -E '^\{|rror' | tail -2
  echo "== python3 .devdeps/hf_baseline.py .devdeps/$1 --seq $2 --batch 1  [$(( $(date +%s) - T0 )) s]"
  timeout $3 python3 .devdeps/hf_baseline.py .devdeps/$1 --seq $2 --batch 1 2>&1 | grep -E '^\{|rror' | tail -2
  echo "[$(( $(date +%s) - T0 )) s]"
done
