#!/usr/bin/env bash
# Session 4: the GPU tests of the session's changes (balance loss kernel and model step, the GPU trainer, the CUDA
# engine on the golden fixtures and on the generic attention path), one H200, after bench/device/batch.sh built
# build-dev. Usage (repo root, device): bash bench/device/s4tests.sh
set -uo pipefail
. bench/device/lib.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
B=build-dev
RUN_TEST_SHOW='Failure|Expected|Which is|error|FAILED|PASSED|SKIPPED|  step [0-9]|loss cpu|all gradients|identical|generated positions|picks'
RUN_TEST_LINES=60
run_test "test_kernels_gpu GpuBalance + GpuIndexer + SumSquares" 60 $B/tests/test_kernels_gpu \
  --gtest_filter='GpuBalance.*:GpuIndexer.*:GpuOps.SumSquares*'
run_test "test_train_gpu Dsv4Gpu + GpuTrainer" 150 $B/tests/test_train_gpu --gtest_filter='Dsv4Gpu.*:GpuTrainer.*'
run_test "test_infer_gpu" 90 $B/tests/test_infer_gpu
