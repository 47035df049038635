#!/usr/bin/env bash
# Sparse attention kernels on one H200 (issue 9): the GPU-vs-CPU op tests, then dev/attention/attention_bench
# (every kernel version at the model's shapes: correctness vs a double reference and vs v1, ms and TFLOP/s;
# sparse attention fwd / bwd for CSA, sliding, HCA, and the CSA indexer top-k).
# Assumes build-dev was configured + built with test_kernels_gpu (the lead's batched call); the benchmark is
# built here with nvcc directly. Usage (repo root, device): bash bench/device/attn.sh
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
B=${ATTN_BUILD:-/tmp/attn-bench}
mkdir -p "$B"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
INC="-Isrc"
[ -d .devdeps/include ] && INC="$INC -I.devdeps/include"
F="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo $INC -DFMT_HEADER_ONLY"
t0=$(date +%s)
nvcc $F -c src/kernels/cuda/attention_sparse.cu -o $B/a.o 2>$B/a.err &
nvcc $F -c src/kernels/cuda/attention_sparse_mma.cu -o $B/m.o 2>$B/m.err &
nvcc $F -c src/kernels/cuda/indexer.cu -o $B/i.o 2>$B/i.err &
nvcc $F -c dev/attention/attention_bench.cu -o $B/b.o 2>$B/b.err &
wait
if nvcc -arch=sm_90a $B/a.o $B/m.o $B/i.o $B/b.o -o $B/attention_bench 2>$B/l.err; then
  echo "PASS build attention_bench ($(( $(date +%s) - t0 )) s)"
else
  echo "FAIL build attention_bench"; cat $B/*.err | grep -E "error" -A3 | head -30
fi
if [ -x build-dev/tests/test_kernels_gpu ]; then
  echo "== test_kernels_gpu --gtest_filter='GpuSparseAttention*:GpuIndexer*'"
  timeout 60 build-dev/tests/test_kernels_gpu --gtest_filter='GpuSparseAttention*:GpuIndexer*' 2>&1 |
    grep -E "^\[  |Failure|Expected|Which is|rel_err|error|CSA|HCA" | head -40
else
  echo "SKIP test_kernels_gpu: build-dev/tests/test_kernels_gpu missing"
fi
if [ -x $B/attention_bench ]; then
  echo "== attention_bench flash-l4 shapes: N=8192 H=64 c=512 (reps 3) [t=$(( $(date +%s) - t0 )) s]"
  timeout 120 $B/attention_bench 8192 64 512 3
  echo "== attention_bench small-s6 shapes: N=4096 H=16 c=512 (reps 3) [t=$(( $(date +%s) - t0 )) s]"
  timeout 60 $B/attention_bench 4096 16 512 3
  # Where the tensor-core kernels' time goes: one v2 forward and one v2 backward launch (CSA, N=2048, H=64).
  if command -v ncu >/dev/null 2>&1; then
    echo "== ncu: v2 fwd_kernel + bwd_kernel, CSA N=2048 H=64 c=512 [t=$(( $(date +%s) - t0 )) s]"
    ATTN_CASE=csa timeout 20 ncu -k 'regex:^(fwd|bwd)_kernel' -c 2 --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats $B/attention_bench 2048 64 512 1 2>&1 |
      grep -E "fwd_kernel|bwd_kernel|Duration|Throughput|Registers|Shared Memory Config|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Issued Warp|Stall|stall|WRN|OPT" | cut -c1-200 | head -60
  else
    echo "SKIP ncu: not installed"
  fi
fi
echo "== attn.sh done [t=$(( $(date +%s) - t0 )) s]"
