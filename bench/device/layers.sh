#!/usr/bin/env bash
# The GPU tests of the layering work (the GPU model moved to src/model/cuda, its optimiser to train/cuda, the
# parameter table behind the GPU arena, the CUDA engine's reference paths as options), one H200, after
# bench/device/batch.sh built build-dev; under 120 s. Usage (repo root, device): bash bench/device/layers.sh
set -uo pipefail
. bench/device/lib.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
B=build-dev
RUN_TEST_SHOW='Failure|Expected|Which is|FAILED|PASSED|SKIPPED \]|identical|loss'
RUN_TEST_LINES=30
# The GPU model against the CPU model (forward, gradients by name, the optimiser step), the head pass, the GPU
# trainer (checkpoints of GpuOptimizer's moments), the attention without the unfused A/B path.
run_test "GPU model and optimiser" 60 $B/tests/test_train_gpu \
  --gtest_filter='Dsv4Gpu.*:OptimizerGpu.*:HeadGradGpu.*:GpuTrainer.*:MoeGpuPaths.*'
# The inference-only GPU model inside the CUDA engine, and its fast paths against the reference options.
run_test "CUDA engine" 45 $B/tests/test_infer_gpu --gtest_filter='GpuEngine.*:GpuEngineFixture*'
run_test "mHC / grouped GEMM kernels" 20 $B/tests/test_kernels_gpu --gtest_filter='GpuMhc.*:GpuMhcGeneric.*:GpuMhcNorm.*:GroupedGemmGpu.*'
