#!/usr/bin/env bash
# Pipeline stages x data x expert parallelism on one GPU (ranks as threads over the thread-group communicator) and
# the emulated rank's allocation check, then the regression tests of the code they share (issue 17).
# Usage (repo root, device, after bench/device/batch.sh built build-dev): bash bench/device/ppmesh.sh
set -uo pipefail
. bench/device/lib.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
B=build-dev
RUN_TEST_SHOW='Failure|Expected|Which is|FAILED|PASSED|SKIPPED \]|step [0-9]|worst|rank [0-9]|rror|what\(\)'
RUN_TEST_LINES=60
run_test "pp x dp x ep as threads, emulated rank" 200 $B/tests/test_train_gpu --gtest_filter='*PpMeshGpu.*:EmulatedRankGpu.*'
run_test "regression: ep shards, pipeline, head, mesh engine, dp" 200 $B/tests/test_train_gpu \
  --gtest_filter='Ranks/EpShardGpu*:EpShardGpuState*:PipelineGpu*:HeadGrad*:GpuMeshEngine*:DataParallelGpu*'
