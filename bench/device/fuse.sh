#!/usr/bin/env bash
# Helper "fuse" device checks (issue 9): the mHC / RMSNorm / hc_head / LM-head CE kernels against their CPU
# references (GpuMhc.*, GpuOps.RmsNorm*, GpuHcHead.*, GpuLmHeadCe.*), the GPU-vs-CPU training step parity
# (Dsv4Gpu.*), then `trex bench train --sections` on flash-l4 @8192 and small-s6 @4096 (the fwd/bwd mhc+norm and
# head sections are this helper's). Assumes build-dev is built (trex, test_kernels_gpu, test_train_gpu). GPU 0;
# about 90 s. Every result line starts PASS / FAIL / SKIP / BENCH.
# Usage (repo root, device): bash bench/device/fuse.sh
set -uo pipefail
export CUDA_VISIBLE_DEVICES=0
B=build-dev
T0=$(date +%s)
. bench/device/lib.sh
RUN_TEST_SHOW='BENCH|Failure|Expected|Which is|error|FAILED|PASSED|SKIPPED|worst|\(.* ms\)$'
RUN_TEST_LINES=60
run_test "mHC / RMSNorm / hc_head / LM head CE kernels vs CPU" 30 $B/tests/test_kernels_gpu \
  --gtest_filter="GpuMhc.*:GpuMhcGeneric*:GpuOps.RmsNorm*:GpuHcHead.*:GpuLmHeadCe.*"
echo "== after $(( $(date +%s) - T0 )) s"
run_test "GPU vs CPU training step parity (Dsv4Gpu.*)" 25 $B/tests/test_train_gpu --gtest_filter='Dsv4Gpu.*'
echo "== after $(( $(date +%s) - T0 )) s"
if [ -x $B/trex ]; then
  for spec in "flash-l4.json 8192" "small-s6.json 4096"; do
    set -- $spec
    left=$(( 88 - ($(date +%s) - T0) ))
    [ $left -lt 15 ] && { echo "SKIP bench $1: only ${left} s left"; continue; }
    echo "== trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 1 --sections (limit ${left} s)"
    timeout $left ./$B/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 1 --sections \
      --device cuda 2>&1 | tail -3
    echo "(BENCH train $1: JSON above; section_ms_per_step in ms per step; compare fwd/bwd mhc+norm and"
    echo " fwd/bwd head with the 21:38 run: flash-l4 10.78 / 41.23 and 13.10 / 41.94, small-s6 4.33 / 22.89 and 3.90 / 12.51;"
    echo " loss_first then: flash-l4 12.26698, small-s6 12.25848 -- should agree to ~1e-3)"
  done
fi
echo "== total $(( $(date +%s) - T0 )) s"
