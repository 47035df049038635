#!/usr/bin/env bash
# Helper "ggemm" device checks (issue 9): the grouped expert GEMMs (tests vs a CPU reference for the mma.sync
# variants 1-6 and the sm90 wgmma + TMA variants 7-11, then the benchmark of the fastest mma.sync tiles and every
# sm90 variant against one cuBLASLt GEMM per expert at flash-l4 / small-s6 shapes: "BENCH <shape> <form>
# tiles=<variant> ... grouped X ms Y TFLOP/s | cuBLASLt per-expert ..."), the router
# tests, the GPU-vs-CPU training step parity, the model's grouped vs per-expert expert paths, expert parallelism on
# 2 GPUs (when two are visible), and the MoE / optimizer sections of `trex bench train` on flash-l4 and small-s6
# (model default path: one cuBLASLt GEMM per expert until GpuModelOptions::moe_grouped_gemm flips). Assumes
# build-dev is built
# (trex, test_kernels_gpu, test_train_gpu). GPU 0, plus GPU 1 for the EP test when visible; about 20-30 s of
# tests and benchmarks, then the two training benchmarks. Every result line starts PASS / FAIL / SKIP / BENCH.
# Usage (repo root, device): bash bench/device/ggemm.sh
set -uo pipefail
export CUDA_VISIBLE_DEVICES=0
B=build-dev
T0=$(date +%s)
. bench/device/lib.sh
RUN_TEST_SHOW='BENCH|Failure|Expected|Which is|error|FAILED|PASSED|SKIPPED|loss|worst|expert tensors|\(.* ms\)$'
RUN_TEST_LINES=70
run_test "grouped GEMM + router tests (+ benchmark: mma.sync 3, sm90 12, sm90 14 = auto)" 45 $B/tests/test_kernels_gpu \
  --gtest_filter='GroupedGemmGpu.*:GpuRouter.*' --gtest_also_run_disabled_tests
echo "== after $(( $(date +%s) - T0 )) s"
run_test "GPU vs CPU training step parity + grouped vs per-expert expert GEMMs (Dsv4Gpu.*:MoeGpuPaths.*)" 25 \
  $B/tests/test_train_gpu --gtest_filter='Dsv4Gpu.*:MoeGpuPaths.*'
echo "== after $(( $(date +%s) - T0 )) s"
# Expert parallel on two GPUs (skips itself with one visible GPU).
CUDA_VISIBLE_DEVICES=0,1 run_test "expert-parallel MoE on 2 GPUs vs all-local (MoeEpGpu.*)" 20 $B/tests/test_train_gpu \
  --gtest_filter='MoeEpGpu.*'
echo "== after $(( $(date +%s) - T0 )) s"
if [ -x $B/trex ]; then
  for spec in "flash-l4.json 8192" "small-s6.json 4096"; do
    set -- $spec
    left=$(( 88 - ($(date +%s) - T0) ))
    [ $left -lt 15 ] && { echo "SKIP bench $1: only ${left} s left"; continue; }
    echo "== trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 2 --warmup 1 --sections (limit ${left} s)"
    timeout $left ./$B/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 2 --warmup 1 --sections \
      --device cuda 2>&1 | tail -3
    echo "(BENCH train $1: one JSON line above; section_ms_per_step has fwd.moe / bwd.moe in ms per step)"
  done
fi
echo "== total $(( $(date +%s) - T0 )) s"
