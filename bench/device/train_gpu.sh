#!/usr/bin/env bash
# One device call for the GPU training step: CMake build of test_train_gpu, test_kernels_gpu and trex, the GPU
# tests, then `trex bench train` on small-s6 (4096 x 1) and flash-l4 (8192 x 1) and the Hugging Face baseline
# (hf_baseline.py, copied with model_flops.py into .devdeps/) on small-s6. Logs go to $OUT.
# Usage (repo root, device): bash bench/device/train_gpu.sh [BASELINE_SECONDS]
set -uo pipefail
OUT=${OUT:-/tmp/train_gpu_out}
BASE_S=${1:-150}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREX_SOLVERS=OFF >"$OUT/configure.log" 2>&1 ||
  { echo "== configure FAILED"; grep -iE "error" -A3 "$OUT/configure.log" | head -20; }
timeout 330 cmake --build build-dev -j16 --target test_train_gpu test_kernels_gpu trex >"$OUT/build.log" 2>&1 ||
  { echo "== build FAILED"; grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; }
echo "== build done after $(( $(date +%s) - T0 )) s"
for t in test_train_gpu test_kernels_gpu; do
  [ -x build-dev/tests/$t ] || continue
  echo "== $t"
  timeout 90 build-dev/tests/$t 2>&1 | tee "$OUT/$t.log" | grep -vE "^\[ RUN|^\[       OK" | tail -70
done
if [ -x build-dev/trex ]; then
  for spec in "small-s6.json 4096 5" "flash-l4.json 8192 3"; do
    set -- $spec
    echo "== ./build-dev/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps $3 --warmup 2 --sections --device cuda"
    timeout 120 ./build-dev/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps $3 --warmup 2 --sections \
      --device cuda 2>&1 | tee "$OUT/bench_$1.log" | tail -5
  done
fi
echo "== python3 .devdeps/hf_baseline.py .devdeps/small-s6.json --seq 4096 --batch 1 (limit ${BASE_S} s)"
timeout "$BASE_S" python3 .devdeps/hf_baseline.py .devdeps/small-s6.json --seq 4096 --batch 1 2>&1 | tail -3 | tee "$OUT/baseline_small.log"
echo "== total $(( $(date +%s) - T0 )) s"
