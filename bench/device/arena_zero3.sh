#!/usr/bin/env bash
# The activation arena's memory (packed by lifetime) and ZeRO-3's gather overlap, one JSON line per run: on one
# H200 the arena runs (`activation_arena`: arena, sum of region peaks, simultaneous peak; `device_used_gib` beside
# `peak_gib`) and the emulated rank at zero 2 and zero 3 (`zero3_weight_gather`: the emulated group's gathers are
# copies on the compute stream, exposed whole); with two GPUs (nvidia-h200-x2) the real DP=2 step at zero 2 and
# zero 3 over NCCL (the gathers' own time and the part the compute stream waited for).
# Usage (repo root, device, after bench/device/batch.sh built build-dev): bash bench/device/arena_zero3.sh [x2]
set -uo pipefail
B=build-dev/trex
T0=$(date +%s)
one() {  # limit, command...
  local lim=$1; shift
  echo "== $*"
  timeout "$lim" "$@" 2>&1 | grep -E '^\{|rror|out of memory|need' | tail -3
  echo "[$(( $(date +%s) - T0 )) s]"
}
if [ "${1:-}" != x2 ]; then
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  one 120 $B bench train --config .devdeps/flash-l4.json --seq 8192 --batch 1 --warmup 2 --steps 5 --device cuda
  one 120 $B bench train --config .devdeps/small-s6.json --seq 4096 --batch 1 --warmup 2 --steps 5 --device cuda
  for z in 2 3; do
    one 240 $B bench train --config .devdeps/v4-flash.json --seq 4096 --batch 128 --mode cpt --emulate-rank 0 \
      --layout pp=4,dp=32,ep=32 --recompute selective --zero $z --warmup 2 --steps 2
  done
  exit 0
fi
L=(env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
command -v mpirun >/dev/null && ldd $B | grep -q libmpi || L=(torchrun --no-python --standalone --nproc-per-node 2)
for z in 2 3; do
  one 180 "${L[@]}" $B bench train --config .devdeps/flash-l4.json --seq 8192 --batch 1 --warmup 2 --steps 5 \
    --mesh dp=2 --zero $z
done
