#!/usr/bin/env bash
# Helper "wgmma" device checks (issue 9): the Hopper grouped expert GEMMs (src/kernels/cuda/grouped_gemm_sm90.cuh,
# wgmma + TMA + mbarrier pipeline, persistent warp-specialised). Builds dev/grouped_gemm/wgmma_bench with nvcc
# (no CMake); runs its small CPU-reference cases, every variant at flash-l4 / small-s6 shapes against one cuBLAS
# GEMM per expert, the small cases under compute-sanitizer, then the library tests (GroupedGemmGpu.*).
# Variants without clusters (1 2 3 6) run apart from the cluster ones (4 5 7 8), so a hang in one group (each step
# has a timeout) does not hide the other's numbers. Every result line starts PASS / FAIL / BENCH. About 100 s.
# Usage (repo root, device): bash bench/device/wgmma.sh
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
B=${WGMMA_BUILD:-/tmp/wgmma-bench}
mkdir -p "$B"
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Isrc -Xptxas -v \
    dev/grouped_gemm/wgmma_bench.cu -lcublas -o $B/wgmma_bench >$B/build.log 2>&1; then
  echo "PASS build wgmma_bench ($(( $(date +%s) - T0 )) s)"
  grep -E "registers|spill" $B/build.log | sort | uniq -c | head -8
else
  echo "FAIL build wgmma_bench"; grep -E "error" -A3 $B/build.log | head -30; exit 1
fi
step() {  # label, timeout, env..., -- args
  local label=$1 lim=$2; shift 2
  echo "== $label (after $(( $(date +%s) - T0 )) s)"
  env "$@" timeout "$lim" $B/wgmma_bench 10 2>&1 | grep -vE "^$" | tail -40
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "FAIL $label: timeout (hang?)"
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && echo "FAIL $label: rc $rc"
}
step "small cases, variants 1 2 3 6 9 10 11" 15 GG_CASE=small GG_V=1,2,3,6,9,10,11
step "small cases, cluster variants 4 5 7 8" 15 GG_CASE=small GG_V=4,5,7,8
step "small cases, fwd/dx walk in n-tile groups of 2, variants 6 10" 15 GG_CASE=small GG_V=6,10 GG_NGROUP=2
step "flash-l4 shapes, variants 6 10 (walk in groups of 4 n-tiles, the default)" 30 GG_CASE=flash GG_V=6,10
step "flash-l4 shapes, variant 10 with the ungrouped walk" 25 GG_CASE=flash GG_V=10 GG_NGROUP=0
step "small-s6 shapes, variant 10" 20 GG_CASE=small-s6 GG_V=10
step "decode-sized steps (24 rows per expert), variant 10" 15 GG_CASE=decode GG_V=10
echo "== small cases under compute-sanitizer (memcheck) (after $(( $(date +%s) - T0 )) s)"
GG_CASE=small GG_V=1,4,5,6,10 timeout 30 compute-sanitizer --tool memcheck --print-limit 5 $B/wgmma_bench 1 2>&1 | tail -8
if [ -x build-dev/tests/test_kernels_gpu ]; then
  echo "== test_kernels_gpu --gtest_filter='GroupedGemmGpu.*' (CPU reference; mma.sync 1-6 + sm90 7-14) (after $(( $(date +%s) - T0 )) s)"
  timeout 30 build-dev/tests/test_kernels_gpu --gtest_filter='GroupedGemmGpu.*' 2>&1 |
    grep -E "^\[  |Failure|Expected|Which is|variant|error|sm90" | head -40
  echo "test_kernels_gpu GroupedGemmGpu rc=${PIPESTATUS[0]} (0 = PASS)"
  echo "== library benchmark vs the model's cuBLASLt Gemm per expert: mma.sync 3, sm90 12, sm90 14 (= auto)"
  timeout 50 build-dev/tests/test_kernels_gpu --gtest_filter='GroupedGemmGpu.DISABLED_Bench' \
    --gtest_also_run_disabled_tests 2>&1 | grep -E "BENCH|Failure|Expected|Which is|OK|FAILED" | head -40
else
  echo "SKIP test_kernels_gpu: build-dev/tests/test_kernels_gpu missing"
fi
if [ -x build-dev/tests/test_train_gpu ]; then
  echo "== test_train_gpu --gtest_filter='MoeGpuPaths.*' (model: grouped expert GEMMs, sm90 for fwd/dx, vs per-expert)"
  timeout 30 build-dev/tests/test_train_gpu --gtest_filter='MoeGpuPaths.*' 2>&1 |
    grep -E "^\[  |Failure|Expected|Which is|error|worst|expert tensors" | head -20
  echo "test_train_gpu MoeGpuPaths rc=${PIPESTATUS[0]} (0 = PASS)"
fi
echo "== total $(( $(date +%s) - T0 )) s"
