#!/usr/bin/env bash
# Every GPU test binary in full on one H200 (the two-GPU tests skip there; dist_gpu.sh runs them on two), after
# bench/device/batch.sh built build-dev. Usage (repo root, device): bash bench/device/tests.sh
set -uo pipefail
. bench/device/lib.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
B=build-dev
T0=$(date +%s)
RUN_TEST_SHOW='Failure|Expected|Which is|FAILED|PASSED|SKIPPED \]'
RUN_TEST_LINES=30
for t in $(ls $B/tests/ | grep -E '^test_.*_gpu$'); do
  run_test "$t" 150 $B/tests/$t
  echo "[$(( $(date +%s) - T0 )) s]"
done
