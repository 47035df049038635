#!/usr/bin/env bash
# The GPU tests of the training stack in one pass (one H200, after bench/device/batch.sh built build-dev; about
# 350 s): several ranks on one GPU through the thread-group communicator, expert sharding, the streamed checkpoint
# load, the GPU step engine under the trainer loop, the GPU model on the block program (MTP included), parity,
# data-parallel / pipeline tests (they skip on one GPU), the grouped GEMM, the whole CUDA engine suite.
# Usage (repo root, device): bash bench/device/batch.sh 300 stack_gpu
set -uo pipefail
. bench/device/lib.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
B=build-dev
RUN_TEST_SHOW='Failure|Expected|Which is|FAILED|PASSED|SKIPPED \]|^EP |tensors,|rror'
RUN_TEST_LINES=40
run_test "communicators on one GPU" 60 $B/tests/test_comm_gpu --gtest_filter='Device/CommCases.*:ThreadGroupGpu.*'
run_test "expert sharding" 90 $B/tests/test_train_gpu \
  --gtest_filter='Ranks/EpShardGpu.*:EpShardGpuState.*:Backends/MoeEpGpu.*'
run_test "streamed checkpoint load" 60 $B/tests/test_train_gpu --gtest_filter='GpuCheckpointLoad.*'
run_test "GPU step engine and trainer" 240 $B/tests/test_train_gpu --gtest_filter='GpuStepEngine.*:GpuTrainer.*:GpuMeshEngine.*'
run_test "expert parallelism under the trainer" 300 $B/tests/test_train_gpu \
  --gtest_filter='Layouts/GpuMeshEp.*:GpuMeshEpCheckpoint.*:GpuMeshEpMemory.*:GpuMeshEpLayout.*:GpuMeshEpMuon.*'
run_test "GPU model regression" 120 $B/tests/test_train_gpu \
  --gtest_filter='Dsv4Gpu.*:ParityGpu.*:DataParallelGpu.*:OptimizerGpu.*:PipelineGpu.*:MoeGpuPaths.*:HeadGradGpu.*:MtpGpu.*'
run_test "grouped GEMM" 60 $B/tests/test_kernels_gpu --gtest_filter='GroupedGemmGpu.*'
run_test "CUDA engine (all)" 120 $B/tests/test_infer_gpu
