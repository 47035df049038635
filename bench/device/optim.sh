#!/usr/bin/env bash
# Helper "optim" device checks (issue 9: fused AdamW, batched Newton-Schulz Muon): the Muon / AdamW kernel tests
# (MuonGpu.*: batched NS vs a double reference, NS throughput at flash-l4 shapes, AdamW's folded gradient zeroing + its cost vs a memset pass), the
# GPU optimiser step vs the CPU optimiser (OptimizerGpu.*) and the AdamW check of the GPU training-step parity test,
# then `trex bench train --sections` with --optimizer adamw and muon on flash-l4 @8192 and small-s6 @4096.
# Assumes build-dev is built (trex, test_kernels_gpu, test_train_gpu). GPU 0; about 90 s. Every result line starts
# PASS / FAIL / SKIP / BENCH.
# Usage (repo root, device): bash bench/device/optim.sh
set -uo pipefail
export CUDA_VISIBLE_DEVICES=0
B=build-dev
T0=$(date +%s)
. bench/device/lib.sh
RUN_TEST_SHOW='^NS |NS throughput|AdamW 256M|Muon tensors|Failure|Expected|Which is|error|FAILED|PASSED|SKIPPED|\(.* ms\)$'
RUN_TEST_LINES=60
# The per-tensor lines of the Muon step comparison: the worst few.
run_test_extra() { echo "$1" | grep -E "^muon " | sort -g -k5 | tail -4; }
run_test "Muon NS / AdamW zero-fold kernels (MuonGpu.*)" 25 $B/tests/test_kernels_gpu --gtest_filter='MuonGpu.*'
echo "== after $(( $(date +%s) - T0 )) s"
run_test "GPU optimizer step vs CPU optimizer (OptimizerGpu.*) + training-step parity" 25 $B/tests/test_train_gpu \
  --gtest_filter='OptimizerGpu.*:Dsv4Gpu.TrainingStepMatchesCpuModel'
echo "== after $(( $(date +%s) - T0 )) s"
if [ -x $B/trex ]; then
  for spec in "flash-l4.json 8192 muon" "flash-l4.json 8192 adamw" "small-s6.json 4096 muon" "small-s6.json 4096 adamw"; do
    set -- $spec
    left=$(( 88 - ($(date +%s) - T0) ))
    [ $left -lt 12 ] && { echo "SKIP bench $1 $3: only ${left} s left"; continue; }
    echo "== trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 2 --sections --optimizer $3 (limit ${left} s)"
    timeout $left ./$B/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 2 --sections \
      --optimizer $3 --device cuda 2>&1 | tail -3
    echo "(BENCH train $1 $3: section optimizer = the optimiser step in ms (gradient memset outside the sections). 01:11"
    echo " run: flash-l4 adamw 28.35 (zeroing folded in) / muon 504.9 ms (expert NS batches of 4), small-s6 16.59 / 208.3)"
  done
fi
echo "== total $(( $(date +%s) - T0 )) s"
