#!/usr/bin/env bash
# Sparse attention kernels on one H200 (issue 9): the GPU-vs-CPU op tests, then dev/attention/attention_bench
# (every kernel version at the model's shapes: correctness vs a double reference, vs the production dispatch and,
# at small-s6 size, vs v1; ms and TFLOP/s per variant; fwd / bwd for CSA, sliding, HCA, and the CSA indexer
# top-k), small-s6 first, then flash-l4, then ncu on the split-dims kernels if time is left. Budget: <= 150 s.
# The backward's cost of determinism: "TIME <case> prod ... bwd" (the product: per-slot dK + dV rows + the
# fixed-order reduction) against "TIME <case> v13 bwd" (the same kernels with fp32 atomics, the product before);
# "PASS <case> prod bwd bitwise identical over 3 runs" checks the product, "INFO ... v13 (atomic)" counts how many
# dK + dV elements two atomic runs disagree on.
# The benchmark (attention_bench.cu + the numbered variants, dev/attention/sparse_variants.cu, both compiled
# here) links build-dev's objects of the product kernels (already compiled by the batch) when they are there and
# newer than the sources; else it compiles those with nvcc here too (~70 s).
# Usage (repo root, device): bash dev/attention/device.sh
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
el() { echo $(( $(date +%s) - t0 )); }
OBJ=build-dev/CMakeFiles/trex_kernels.dir/src/kernels/cuda
built=0
nvcc $F -c dev/attention/attention_bench.cu -o $B/b.o 2>$B/b.err &
nvcc $F -c dev/attention/sparse_variants.cu -o $B/v.o 2>$B/v.err &
fresh=1
for f in attention_sparse attention_sparse_mma attention_dkv_reduce indexer; do
  for dep in src/kernels/cuda/$f.cu src/kernels/cuda/attention_sparse_mma.h src/kernels/cuda/attention_sparse_mma.cuh \
             src/kernels/cuda/attention_dkv_reduce.h src/kernels/cuda/attention_keys.cuh src/kernels/cuda/attention_sparse.h; do
    { [ -f $OBJ/$f.cu.o ] && [ $OBJ/$f.cu.o -nt $dep ]; } || fresh=0
  done
done
wait
if [ $fresh = 1 ] && nvcc -arch=sm_90a $OBJ/attention_sparse.cu.o $OBJ/attention_sparse_mma.cu.o \
     $OBJ/attention_dkv_reduce.cu.o $OBJ/indexer.cu.o $B/b.o $B/v.o -o $B/attention_bench -L.devdeps/lib -lfmt 2>$B/l.err; then
  echo "PASS build attention_bench from build-dev objects ($(el) s)"; built=1
else
  echo "INFO build-dev objects not usable (fresh=$fresh: $(head -c 300 $B/l.err 2>/dev/null)); compiling"
  nvcc $F -c src/kernels/cuda/attention_sparse.cu -o $B/a.o 2>$B/a.err &
  nvcc $F -c src/kernels/cuda/attention_sparse_mma.cu -o $B/m.o 2>$B/m.err &
  nvcc $F -c src/kernels/cuda/indexer.cu -o $B/i.o 2>$B/i.err &
  nvcc $F -c src/kernels/cuda/attention_dkv_reduce.cu -o $B/r.o 2>$B/r.err &
  wait
  if nvcc -arch=sm_90a $B/a.o $B/m.o $B/r.o $B/i.o $B/b.o $B/v.o -o $B/attention_bench 2>$B/l.err; then
    echo "PASS build attention_bench ($(el) s)"; built=1
  else
    echo "FAIL build attention_bench"; cat $B/*.err | grep -E "error" -A3 | head -30
  fi
fi
if [ -x build-dev/tests/test_kernels_gpu ]; then
  echo "== test_kernels_gpu --gtest_filter='GpuSparseAttention*' [t=$(el) s]"
  timeout 60 build-dev/tests/test_kernels_gpu --gtest_filter='GpuSparseAttention*' 2>&1 |
    grep -E "^\[  |Failure|Expected|Which is|rel_err|error|CSA|HCA|tiling" | head -60
else
  echo "SKIP test_kernels_gpu: build-dev/tests/test_kernels_gpu missing"
fi
if [ $built = 1 ]; then
  echo "== attention_bench small-s6 shapes: N=4096 H=16 c=512 (reps 3) [t=$(el) s]"
  timeout 50 $B/attention_bench 4096 16 512 3 | grep -v -E "^PASS (csa|sliding|hca|indexer)"
  echo "== attention_bench flash-l4 shapes: N=8192 H=64 c=512 (reps 3; no v1) [t=$(el) s]"
  for cs in csa sliding hca; do
    ATTN_V1=0 ATTN_CASE=$cs ATTN_VARIANTS=${ATTN_L4_VARIANTS:-2,8,11,12,13} timeout 40 $B/attention_bench 8192 64 512 3 |
      grep -v -E "^PASS (csa|sliding|hca|indexer)"
  done
  # Where the split-dims kernels' time goes (v6 fwd + bwd, CSA, N=2048 H=16, c=512), if time is left.
  if command -v ncu >/dev/null 2>&1 && [ $(el) -lt 110 ]; then
    echo "== ncu: sd_fwd_kernel + sd_bwd_kernel, CSA N=2048 H=16 c=512 [t=$(el) s]"
    ATTN_V1=0 ATTN_CASE=csa ATTN_VARIANTS=6 timeout 25 ncu -k 'regex:sd_(fwd|bwd)_kernel' -c 2 --section SpeedOfLight \
      --section WarpStateStats --section Occupancy --section LaunchStats $B/attention_bench 2048 16 512 1 2>&1 |
      grep -E "sd_fwd_kernel|sd_bwd_kernel|Duration|Throughput|Registers Per|Dynamic Shared|Block Limit|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued" | cut -c1-160 | head -40
  fi
  if command -v ncu >/dev/null 2>&1 && [ $(el) -lt 110 ]; then
    echo "== ncu: wg_fwd_kernel (v11) + bwd_kernel (v8), CSA N=2048 H=64 c=512 [t=$(el) s]"
    ATTN_V1=0 ATTN_CASE=csa ATTN_VARIANTS=11,8 timeout 25 ncu -k 'regex:^(wg_fwd|bwd)_kernel' -c 2 --section SpeedOfLight \
      --section WarpStateStats --section Occupancy --section LaunchStats $B/attention_bench 2048 64 512 1 2>&1 |
      grep -E "wg_fwd_kernel|bwd_kernel|Duration|Throughput|Registers Per|Dynamic Shared|Achieved Occupancy|Warp Cycles Per Issued" | cut -c1-160 | head -30
  fi
fi
echo "== attn.sh done [t=$(el) s]"
