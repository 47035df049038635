#!/usr/bin/env bash
# Expert tensor parallelism (parallel.etp = tp) on one H200, after bench/device/batch.sh built build-dev: the GPU
# tests of tensor parallelism (the model against one rank, the trainer's layouts, resume, the planner's per-rank
# bytes, the combine kernel), then the emulated ranks of the layouts the planner ranks first among those T-Rex runs:
# V4-Pro SFT 4096 on 512 H200 (tp=2, etp=2, dp=256, ep=128; one stage, so rank 0 is every rank's shape) and V4-Flash
# SFT 8192 on 128 H200, each with copies and with --emulate-comm none.
# Usage (repo root, device): bash bench/device/etp.sh [tests|pro|flash]...   (all three when none is given)
set -uo pipefail
. bench/device/lib.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
B=build-dev
D=.devdeps/bench; [ -f $D/v4-pro.json ] || D=.devdeps
T0=$(date +%s)
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(tests pro flash)
one() {  # limit, args...
  local lim=$1; shift
  echo "== trex bench train $*"
  timeout "$lim" $B/trex bench train "$@" 2>&1 | grep -E '^\{|rror|out of memory|warning|does not fit' | tail -3
  echo "[$(( $(date +%s) - T0 )) s]"
}
for part in "${parts[@]}"; do
  case $part in
    tests)
      RUN_TEST_SHOW='Failure|Expected|Which is|FAILED|PASSED|SKIPPED \]|etp|worst rel'
      RUN_TEST_LINES=60
      run_test test_train_gpu 280 $B/tests/test_train_gpu --gtest_filter='TpGpu*:GpuMeshTp*:TpGpuMuon*:TpGpuShards*'
      run_test test_kernels_gpu 60 $B/tests/test_kernels_gpu --gtest_filter='GpuRouter*'
      echo "[$(( $(date +%s) - T0 )) s]" ;;
    pro)
      for c in copies none; do
        e=(); [ $c = none ] && e=(--emulate-comm none)
        one 300 --config $D/v4-pro.json --seq 4096 --batch 256 --mode sft --emulate-rank 0 \
          --layout tp=2,dp=256,ep=128,etp=2 --recompute full --recompute-full-layers 60 --zero 2 "${e[@]}" \
          --warmup 2 --steps 2
      done ;;
    flash)
      for c in copies none; do
        e=(); [ $c = none ] && e=(--emulate-comm none)
        one 240 --config $D/v4-flash.json --seq 8192 --batch 128 --mode sft --emulate-rank 0 \
          --layout pp=1,dp=128,ep=128 --recompute full --recompute-full-layers 23 --zero 2 "${e[@]}" \
          --warmup 2 --steps 2
      done ;;
  esac
done
echo "== etp.sh done after $(( $(date +%s) - T0 )) s"
