#!/usr/bin/env bash
# Helper "head" device checks (issue 9): the LM head + CE without the backward recompute (HeadMode::LossAndGrad,
# lm_head_ce_fwd_grad). 1) GpuLmHeadCe* kernel tests (training pass vs double CPU reference and vs the recompute
# path) plus the DISABLED timing at flash-l4's head shape (n 8192, d 4096, V 129280): recompute fwd/bwd ms vs
# the training pass per row-block size; 2) the training tests (HeadGradGpu.*: training forward vs recompute in
# the model and in stage-step mode; Dsv4Gpu.*: GPU vs CPU step; ParityGpu.*: trex parity --device cuda);
# 3) `trex bench train --sections` on flash-l4 @8192 and small-s6 @4096 (fwd.head now carries the head's whole
# gradient GEMM work; bwd.head only the norm / hc_head backward). Assumes build-dev is built (trex,
# test_kernels_gpu, test_train_gpu). GPU 0; about 90 s. Result lines start PASS / FAIL / SKIP / LMHEAD / BENCH.
# Usage (repo root, device): bash bench/device/head.sh
set -uo pipefail
export CUDA_VISIBLE_DEVICES=0
B=build-dev
T0=$(date +%s)
. bench/device/lib.sh
RUN_TEST_SHOW='LMHEAD|loss|rel L2 .* \(|Failure|Expected|Which is|error|FAILED|PASSED|SKIPPED|OK \]'
RUN_TEST_LINES=60
run_test "LM head CE kernels (training pass vs CPU double / recompute) + timing" 30 $B/tests/test_kernels_gpu \
  --gtest_filter="*GpuLmHeadCe*" --gtest_also_run_disabled_tests
echo "== after $(( $(date +%s) - T0 )) s"
run_test "training tests (HeadGradGpu.*, Dsv4Gpu.*, ParityGpu.*)" 40 $B/tests/test_train_gpu \
  --gtest_filter='HeadGradGpu.*:Dsv4Gpu.*:ParityGpu.*'
echo "== after $(( $(date +%s) - T0 )) s"
if [ -x $B/trex ]; then
  for spec in "flash-l4.json 8192" "small-s6.json 4096"; do
    set -- $spec
    left=$(( 88 - ($(date +%s) - T0) ))
    [ $left -lt 12 ] && { echo "SKIP bench $1: only ${left} s left"; continue; }
    echo "== trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 2 --sections (limit ${left} s)"
    timeout $left ./$B/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 2 --sections \
      --device cuda 2>&1 | tail -3
    echo "(BENCH train $1: fwd.head + bwd.head before (recompute) flash-l4 13.35 + 40.15, small-s6 3.92 + 11.03 ms;"
    echo " 00:25 (training pass, rows 1024, no dW groups) flash-l4 39.81 + 1.08, small-s6 11.07 + 0.38 ms;"
    echo " 01:11 (rows 1024, dW groups 4096) flash-l4 36.98 + 0.85 (step 218.8 ms, MFU 0.400), small-s6 10.39 + 0.26)"
  done
fi
echo "== total $(( $(date +%s) - T0 )) s"
