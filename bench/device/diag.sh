#!/usr/bin/env bash
# Lead's follow-up: the expert-parallel GPU test in full (its printed errors), the skipped list of test_train_gpu,
# and flash-l4 @8192 without --sections (the headline number without CUDA-event overhead), both expert-GEMM paths.
set -uo pipefail
B=build-dev
timeout 60 $B/tests/test_train_gpu --gtest_filter='MoeEpGpu.*:MoeGpuPaths.*' 2>&1 | grep -vE "^\[ RUN" | cut -c1-300 | head -60
timeout 60 $B/tests/test_train_gpu --gtest_filter='-MoeEpGpu.*' 2>&1 | grep -E "SKIPPED|FAILED|PASSED|OK \]" | head -30
export CUDA_VISIBLE_DEVICES=0
for m in default per-expert default; do
  timeout 60 $B/trex bench train --config .devdeps/flash-l4.json --seq 8192 --batch 1 --steps 10 --warmup 3 \
    --device cuda --moe-gemm $m 2>&1 | grep -E '^\{|rror' | tail -2
done
