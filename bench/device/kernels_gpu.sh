#!/usr/bin/env bash
# One device call: build and run the CUDA kernel tests (test_kernels_gpu), then `trex bench ops` at a config's
# shapes. The normal CMake build comes first. When the device image lacks the project's Debian packages (the
# configure fails), it falls back to a direct nvcc / g++ build of the same sources against headers and static
# libraries carried in .devdeps/ (fmt, gtest, nlohmann headers; libgtest; a relocatable object holding OpenBLAS's
# cblas_sgemm / cblas_dgemm, made with `ld -r -u cblas_sgemm -u cblas_dgemm libopenblas.a`).
# Usage (repo root, device): bash bench/device/kernels_gpu.sh CONFIG TOKENS [REPS]; logs go to $OUT.
set -uo pipefail
CONFIG=${1:?config.json}
TOKENS=${2:-8192}
REPS=${3:-10}
OUT=${OUT:-/tmp/kernels_gpu_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
nvcc --version | tail -1
TEST=""
BENCH=()
if cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREX_SOLVERS=OFF >"$OUT/configure.log" 2>&1; then
  echo "== CMake configure OK"
  if cmake --build build-dev -j16 --target test_kernels_gpu >"$OUT/build.log" 2>&1; then
    TEST=./build-dev/tests/test_kernels_gpu
  else
    grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40
  fi
else
  echo "== CMake configure FAILED on the device; falling back to the direct build"
  grep -iE "error|not found|could not" "$OUT/configure.log" | head -10
  D=.devdeps
  B=build-direct
  mkdir -p $B
  NVFLAGS="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Isrc -I$D/include -DFMT_HEADER_ONLY"
  CXXFLAGS="-std=c++20 -O2 -fopenmp -Isrc -Itests -Iapps/trex -I$D/include -I/usr/local/cuda/include -DFMT_HEADER_ONLY -DTREX_HAVE_CUDA=1"
  ok=1
  for f in src/kernels/cuda/*.cu; do
    nvcc $NVFLAGS -c "$f" -o "$B/$(basename "$f").o" &
  done
  wait
  LIBS="$D/lib/blas_min.o -L/usr/local/cuda/lib64 -lcudart -lcublasLt -lcublas -lpthread -ldl"
  KSRC="src/kernels/cuda/gemm_cuda.cpp src/kernels/cpu/matmul.cpp src/kernels/cpu/attention_sparse.cpp"
  g++ $CXXFLAGS tests/kernels/*_gpu.cpp $KSRC $B/*.cu.o $D/lib/libgtest_main.a $D/lib/libgtest.a $LIBS \
    -o $B/test_kernels_gpu >"$OUT/build.log" 2>&1 || { ok=0; grep -E "error" -A3 "$OUT/build.log" | head -40; }
  [ $ok = 1 ] && TEST=$B/test_kernels_gpu
  printf '#include <cstdlib>\n#include <string>\n#include "bench_ops.h"\nint main(int c, char** v) { trex::bench::bench_ops(v[1], std::stoll(v[2]), std::atoi(v[3])); }\n' >$B/bench_main.cpp
  if g++ $CXXFLAGS -DTREX_SHARED_DIR='"/tmp"' -DTREX_SOURCE_DIR='"."' $B/bench_main.cpp apps/trex/bench_ops.cpp \
       src/core/files.cpp src/kernels/cuda/gemm_cuda.cpp $B/*.cu.o $LIBS -o $B/bench_ops >>"$OUT/build.log" 2>&1; then
    BENCH=($B/bench_ops "$CONFIG" "$TOKENS" "$REPS")
  else
    grep -E "error" -A3 "$OUT/build.log" | tail -20
  fi
fi
if [ -n "$TEST" ]; then
  echo "== test_kernels_gpu"
  $TEST 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  |Failure|Expected|Which is|rel_err|error" | head -80
fi
if [ ${#BENCH[@]} -eq 0 ] && [ -f build-dev/build.ninja ]; then
  if cmake --build build-dev -j16 --target trex >>"$OUT/build.log" 2>&1; then
    BENCH=(./build-dev/trex bench ops --config "$CONFIG" --tokens "$TOKENS" --reps "$REPS")
  else
    echo "== trex did not build (see build.log); bench skipped"
    grep -E "error" -A2 "$OUT/build.log" | head -20
  fi
fi
if [ ${#BENCH[@]} -gt 0 ]; then
  echo "== ${BENCH[*]}"
  "${BENCH[@]}" 2>&1 | tee "$OUT/bench.log"
fi
