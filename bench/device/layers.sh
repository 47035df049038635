#!/usr/bin/env bash
# The GPU tests of the layering work (the GPU model moved to src/model/cuda, its optimiser to train/cuda, the
# parameter table behind the GPU arena, the CUDA engine's reference paths as options, the parity check in the
# library, one device buffer, one vector load / store and block sum), one H200, after
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
run_test "GPU model and optimiser" 45 $B/tests/test_train_gpu \
  --gtest_filter='Dsv4Gpu.*:OptimizerGpu.*:HeadGradGpu.*:GpuTrainer.*:MoeGpuPaths.*'
# The inference-only GPU model inside the CUDA engine, and its fast paths against the reference options.
run_test "CUDA engine" 30 $B/tests/test_infer_gpu --gtest_filter='GpuEngine.*:GpuEngineFixture*'
# The kernels whose vector load / store and block sum now come from vec_io.cuh / block_reduce.cuh, and the
# stream-ordered DeviceBuffer every kernel test allocates through.
run_test "kernels" 25 $B/tests/test_kernels_gpu \
  --gtest_filter='GpuOps.*:GpuRopeOps.*:GpuRouter.*:GpuSparseAttention.*:GpuAttentionGeneric.*:GpuMhc.*:GpuMhcGeneric.*:GpuMhcNorm.*:GroupedGemmGpu.*'
# The GPU parity check through the library (dsv4::parity_cuda) on the three golden fixtures.
run_test "GPU parity" 20 $B/tests/test_train_gpu --gtest_filter='ParityGpu.*'
