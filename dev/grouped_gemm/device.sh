#!/usr/bin/env bash
# Grouped expert GEMM device checks (issue 9, issue 16 item 6): builds dev/grouped_gemm/wgmma_bench with nvcc (no
# CMake; variants.cuh instantiates every measured version from the product's headers grouped_gemm_mma.cuh and
# grouped_gemm_sm90.cuh: mma.sync m1-m6, sm90 wgmma + TMA v1-v11, the product's m1 / m3 / v10 among them); runs its
# small CPU-reference cases for every version, versions at flash-l4 / small-s6 shapes against one cuBLAS GEMM per
# expert, the small cases under compute-sanitizer, then the library tests (GroupedGemmGpu.*: the product's
# dispatch and each of its paths). Versions without clusters run apart from the cluster ones (v4 v5 v7 v8), so a
# hang in one group (each step has a timeout) does not hide the other's numbers. Every result line starts PASS /
# FAIL / BENCH. About 110 s.
# Usage (repo root, device): bash dev/grouped_gemm/device.sh
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
step "small cases, mma.sync m1-m6" 15 GG_CASE=small GG_V=m1,m2,m3,m4,m5,m6
step "small cases, sm90 v1 v2 v3 v6 v9 v10 v11" 15 GG_CASE=small GG_V=1,2,3,6,9,10,11
step "small cases, cluster versions v4 v5 v7 v8" 15 GG_CASE=small GG_V=4,5,7,8
step "small cases, sm90 fwd/dx walk in n-tile groups of 2, v6 v10" 15 GG_CASE=small GG_V=6,10 GG_NGROUP=2
step "flash-l4 shapes, v6 v10 (walk in groups of 4 n-tiles, the product's), m3" 40 GG_CASE=flash GG_V=6,10,m3
step "flash-l4 shapes, v10 with the ungrouped walk" 25 GG_CASE=flash GG_V=10 GG_NGROUP=0
step "small-s6 shapes, v10, m1, m3" 25 GG_CASE=small-s6 GG_V=10,m1,m3
step "decode-sized steps (24 rows per expert), v10" 15 GG_CASE=decode GG_V=10
echo "== small cases under compute-sanitizer (memcheck) (after $(( $(date +%s) - T0 )) s)"
GG_CASE=small GG_V=m1,m3,1,4,5,6,10 timeout 40 compute-sanitizer --tool memcheck --print-limit 5 $B/wgmma_bench 1 2>&1 | tail -8
if [ -x build-dev/tests/test_kernels_gpu ]; then
  echo "== test_kernels_gpu --gtest_filter='GroupedGemmGpu.*' (CPU reference; public entry points + each dispatch path) (after $(( $(date +%s) - T0 )) s)"
  timeout 60 build-dev/tests/test_kernels_gpu --gtest_filter='GroupedGemmGpu.*' 2>&1 |
    grep -E "^\[  |Failure|Expected|Which is|path|error|sm90" | head -40
  echo "test_kernels_gpu GroupedGemmGpu rc=${PIPESTATUS[0]} (0 = PASS)"
  echo "== library benchmark (the product's dispatch) vs the model's cuBLASLt Gemm per expert"
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
