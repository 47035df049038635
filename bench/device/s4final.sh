#!/usr/bin/env bash
# Session 4's closing device check, one H200, after bench/device/batch.sh built build-dev: every GPU test binary in
# full (the two-GPU tests skip on one GPU), then `trex train --device cuda` against `trex bench train` on small-s6
# (bench/device/s4train.sh without its tests). Usage (repo root, device): bash bench/device/s4final.sh
set -uo pipefail
. bench/device/lib.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
B=build-dev
T0=$(date +%s)
RUN_TEST_SHOW='Failure|Expected|Which is|FAILED|PASSED|SKIPPED \]'
RUN_TEST_LINES=30
for t in test_kernels_gpu test_train_gpu test_infer_gpu test_comm_gpu; do
  run_test "$t" 100 $B/tests/$t
  echo "[$(( $(date +%s) - T0 )) s]"
done
S4_TESTS=0 S4_STEPS=16 bash bench/device/s4train.sh
