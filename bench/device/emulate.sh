#!/usr/bin/env bash
# One rank of the released models' large layouts alone on this H200 (issue 17, "rank emulation"): `trex bench train
# --emulate-rank R --layout ...` builds rank R's partition of ../shared/bench/v4-flash.json / v4-pro.json (copied
# into .devdeps/) and runs its 1F1B step with the collectives as local copies of the real sizes, printing the rank's
# peak memory, step time and MFU beside the planner's prediction for that rank. First and last pipeline stage of
# each layout (the first keeps the most micro-batches in flight, the last holds the LM head). One JSON line per run.
# Usage (repo root, device, after bench/device/batch.sh built build-dev): bash bench/device/emulate.sh [flash|pro]
# (both models when no argument is given). Every run adds --no-mtp: these are the planner's calibration records
# (docs/measurements/measurements.jsonl), measured without the MTP module.
set -uo pipefail
which=${1:-all}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
B=build-dev/trex
T0=$(date +%s)
one() {  # limit, args...
  local lim=$1; shift
  echo "== trex bench train $*"
  timeout "$lim" $B bench train "$@" --no-mtp 2>&1 | grep -E '^\{|rror|out of memory|need' | tail -3
  echo "[$(( $(date +%s) - T0 )) s]"
}
F=.devdeps/v4-flash.json P=.devdeps/v4-pro.json
if [ "$which" != pro ]; then
# V4-Flash on 128 H200, global batch 128: the best layout `trex plan --search --runnable --no-mtp` finds among those
# trex train runs (pp=1 x dp=128, ep=128, recompute full), CPT at 4096 and SFT at 8192; then the founding report's
# pp=4 x dp=32 x ep=32 (first and last stage) with recompute full and selective.
one 150 --config $F --seq 4096 --batch 128 --mode cpt --emulate-rank 0 --layout pp=1,dp=128,ep=128 --recompute full --warmup 2 --steps 2
one 150 --config $F --seq 8192 --batch 128 --mode sft --emulate-rank 0 --layout pp=1,dp=128,ep=128 --recompute full --warmup 2 --steps 2
for r in 0 96; do
  one 120 --config $F --seq 4096 --batch 128 --mode cpt --emulate-rank $r --layout pp=4,dp=32,ep=32 --recompute full --warmup 2 --steps 2
done
one 120 --config $F --seq 4096 --batch 128 --mode cpt --emulate-rank 0 --layout pp=4,dp=32,ep=32 --recompute selective --warmup 2 --steps 2
# The rank's own compute (the collectives counted, no bytes moved: --emulate-comm none), what its MFU is judged on.
for L in pp=4,dp=32,ep=32 pp=8,dp=16,ep=16; do
  one 120 --config $F --seq 4096 --batch 128 --mode cpt --emulate-rank 0 --layout $L --recompute selective --emulate-comm none --warmup 2 --steps 2
done
one 150 --config $F --seq 4096 --batch 128 --mode cpt --emulate-rank 0 --layout pp=1,dp=128,ep=128 --recompute full --emulate-comm none --warmup 2 --steps 2
fi
if [ "$which" != flash ]; then
# V4-Pro on 512 H200, global batch 256, SFT at 4096 (pp=8 x dp=64, ep=64), first and last stage.
for r in 0 448; do
  one 180 --config $P --seq 4096 --batch 256 --mode sft --emulate-rank $r --layout pp=8,dp=64,ep=64 --recompute full --warmup 2 --steps 2
done
# The same V4-Pro ranks with the dense gradients sharded (ZeRO-2: persistent gradients of the rank's 1/64 dense
# slice, transient bucket buffers), fp32 and bf16 reduction.
for r in 0 448; do
  one 180 --config $P --seq 4096 --batch 256 --mode sft --emulate-rank $r --layout pp=8,dp=64,ep=64 --recompute full --zero 2 --warmup 2 --steps 2
done
one 180 --config $P --seq 4096 --batch 256 --mode sft --emulate-rank 0 --layout pp=8,dp=64,ep=64 --recompute full --zero 2 --grad-reduce bf16 --warmup 2 --steps 2
fi
echo "== emulate.sh done after $(( $(date +%s) - T0 )) s"
