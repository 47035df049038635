#!/usr/bin/env bash
# Standalone: configure + build what the multi-GPU checks need, then run bench/device/nccl.sh (2 GPUs).
# Usage (repo root, device with 2 GPUs): bash bench/device/dist_gpu.sh [CONFIG] [SEQ]
set -uo pipefail
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTREX_SOLVERS=OFF >/tmp/dist_configure.log 2>&1 ||
  { echo "== configure FAILED"; tail -20 /tmp/dist_configure.log; }
cmake --build build-dev -j16 --target trex test_comm_gpu test_train_gpu >/tmp/dist_build.log 2>&1 ||
  { echo "== build FAILED"; grep -E "error|FAILED" -A3 /tmp/dist_build.log | head -40; }
exec bash bench/device/nccl.sh "$@"
