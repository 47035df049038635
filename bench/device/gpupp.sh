#!/usr/bin/env bash
# Pipeline parallelism (PP=2, 1F1B) of the GPU model on a 2-GPU host, assuming build-dev is built (targets trex,
# test_train_gpu) and .devdeps/ holds the shared bench configs. Prints PASS/FAIL lines and one JSON line per run:
#  1. test_train_gpu: PipelineGpu.* (PP=2 x 4 micro-batches == one GPU accumulating them: losses + gradients by
#     name) and the suites this change must not break (DataParallelGpu, MoeEpGpu, MoeGpuPaths, Dsv4Gpu).
#  2. CONFIG @ SEQ on one GPU with the micro-batch shape (--batch 1): the reference tokens/s.
#  3. PP=2: --batch 8 cut into 8 micro-batches of one SEQ-token sequence (ideal bubble (P-1)/(M+P-1) = 1/9),
#     layers split 2+2, then 3+1 (the last stage also carries the head), then the better split with 16
#     micro-batches (--batch 16, bubble 1/17) if time allows; 4. the same under torchrun --no-python.
# Usage (repo root, device): bash bench/device/gpupp.sh [CONFIG] [SEQ]
set -uo pipefail
CFG=${1:-.devdeps/flash-l4.json}
SEQ=${2:-8192}
B=build-dev
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
nvidia-smi -L

echo "== test_train_gpu: PipelineGpu (PP=2 vs one GPU), DataParallelGpu, MoeEpGpu, MoeGpuPaths, Dsv4Gpu"
timeout 60 $B/tests/test_train_gpu \
  --gtest_filter='PipelineGpu.*:DataParallelGpu.*:MoeEpGpu.*:MoeGpuPaths.*:Dsv4Gpu.*' >/tmp/gpupp_tt.log 2>&1
rc=$?
grep -E "^loss|^step|^gradients|Failure|FAILED|stage [01]:|rank [01]:|Expected|Which is|error" /tmp/gpupp_tt.log | head -40
grep -E "^\[  (PASSED|FAILED)|^\[  SKIPPED|^\[       OK|^\[  FAILED" /tmp/gpupp_tt.log | head -12
[ "$rc" = 0 ] && echo "PASS test_train_gpu (PipelineGpu, DataParallelGpu, MoeEpGpu, MoeGpuPaths, Dsv4Gpu)" \
  || { echo "FAIL test_train_gpu (rc $rc)"; tail -15 /tmp/gpupp_tt.log; }
echo "[$(el)]"

if command -v mpirun >/dev/null && ldd $B/trex | grep -q libmpi; then
  L=(env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
     mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
elif command -v torchrun >/dev/null; then
  L=(torchrun --no-python --standalone --nproc-per-node 2)
else
  L=(false no-launcher)
fi
echo "launcher: ${L[*]}"
json() { grep -E '^\{' | tail -1; }
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2], 'nan'))" "$1" "$2" 2>/dev/null; }

echo "== single GPU, the micro-batch shape: trex bench train --config $CFG --seq $SEQ --batch 1 --steps 3 --warmup 2"
CUDA_VISIBLE_DEVICES=0 timeout 60 $B/trex bench train --config $CFG --seq $SEQ --batch 1 --steps 3 --warmup 2 \
  >/tmp/gpupp_one.log 2>&1
tail -3 /tmp/gpupp_one.log
ONE=$(json </tmp/gpupp_one.log)
echo "[$(el)]"

report() {  # $1 = PP JSON line, $2 = label
  python3 - "$ONE" "$1" "$2" <<'PY'
import json, sys
try:
    one = json.loads(sys.argv[1]); pp = json.loads(sys.argv[2])
except Exception:
    print(f"FAIL {sys.argv[3]}: no JSON line"); sys.exit(0)
lab = sys.argv[3]
t1, tg = one["tokens_per_s"], pp["tokens_per_s_per_gpu"]
eff = tg / t1
print(f"{lab}: step {pp['step_s']*1000:.1f} ms for {pp['batch']} x {pp['seq']} tokens in {pp['micro_batches']} micro-batches; "
      f"tokens/s total {pp['tokens_per_s']}, per GPU {tg} vs one GPU {t1} (one GPU step {one['step_s']*1000:.1f} ms, "
      f"per micro-batch shape): efficiency {eff:.3f}; MFU {pp['mfu']}; peak GiB {pp['peak_gib']} (one GPU {one['peak_gib']})")
print(f"{lab}: bubble ideal (P-1)/(M+P-1) = {pp['bubble_ideal']}; 1F1B schedule of the measured stage times "
      f"{pp['schedule_ms']} ms; exposed comm (step beyond that schedule) {pp['exposed_comm_ms']} ms per step; "
      f"one boundary tensor alone {pp['boundary_transfer_ms']} ms")
for i, s in enumerate(pp["stages"]):
    print(f"{lab}: stage {i} layers {s['layers']}: fwd {s['fwd_ms']} + bwd {s['bwd_ms']} + opt {s['opt_ms']} ms per step "
          f"({s['fwd_bwd_ms_per_micro_batch']} ms per micro-batch), recv wait {s['recv_wait_ms']} ms, idle {s['idle_ms']} ms, "
          f"bubble measured (idle / step) {s['bubble_measured']}, peak {s['peak_gib']} GiB, params {s['params']}")
print(("PASS" if eff >= 0.90 else "FAIL") + f" {lab} per-GPU throughput >= 90% of one GPU ({eff:.3f})")
PY
}

BEST=2+2; BEST_TPS=0; PPFAIL=0
for SPLIT in 2+2 3+1; do
  MESH="pp=2,micro_batches=8,stage_layers=$SPLIT"
  echo "== PP=2: ${L[*]} trex bench train --config $CFG --seq $SEQ --batch 8 --steps 2 --warmup 2 --mesh $MESH"
  timeout 50 "${L[@]}" $B/trex bench train --config $CFG --seq $SEQ --batch 8 --steps 2 --warmup 2 --mesh $MESH \
    >/tmp/gpupp_pp.log 2>&1
  PP=$(json </tmp/gpupp_pp.log)
  echo "$PP"
  if [ -z "$PP" ]; then tail -15 /tmp/gpupp_pp.log; PPFAIL=1; report "" "PP=2 split $SPLIT M=8"; break; fi
  report "$PP" "PP=2 split $SPLIT M=8"
  tps=$(field "$PP" tokens_per_s); tps=${tps%.*}
  if [ -n "$tps" ] && [ "$tps" != nan ] && [ "$tps" -gt "$BEST_TPS" ] 2>/dev/null; then BEST=$SPLIT; BEST_TPS=$tps; fi
  echo "[$(el)]"
done
if [ $PPFAIL = 0 ] && [ $(( $(date +%s) - T0 )) -lt 75 ]; then
  MESH="pp=2,micro_batches=16,stage_layers=$BEST"
  echo "== PP=2, 16 micro-batches: ${L[*]} trex bench train --config $CFG --seq $SEQ --batch 16 --steps 2 --warmup 2 --mesh $MESH"
  timeout 40 "${L[@]}" $B/trex bench train --config $CFG --seq $SEQ --batch 16 --steps 2 --warmup 2 --mesh $MESH \
    >/tmp/gpupp_pp16.log 2>&1
  PP=$(json </tmp/gpupp_pp16.log)
  echo "$PP"
  [ -z "$PP" ] && tail -15 /tmp/gpupp_pp16.log
  report "$PP" "PP=2 split $BEST M=16"
else
  echo "SKIP PP=2 with 16 micro-batches (time budget)"
fi
echo "[$(el)]"
if [ $PPFAIL = 0 ] && command -v torchrun >/dev/null && [ $(( $(date +%s) - T0 )) -lt 90 ]; then
  MESH="pp=2,micro_batches=8,stage_layers=$BEST"
  echo "== PP=2 via torchrun --no-python: trex bench train --config $CFG --seq $SEQ --batch 8 --steps 1 --warmup 2 --mesh $MESH"
  timeout 28 torchrun --no-python --standalone --nproc-per-node 2 $B/trex bench train --config $CFG --seq $SEQ \
    --batch 8 --steps 1 --warmup 2 --mesh $MESH >/tmp/gpupp_tr.log 2>&1
  TR=$(json </tmp/gpupp_tr.log)
  echo "$TR"
  [ "$(field "$TR" launcher)" = torchrun ] && echo "PASS PP=2 torchrun launch: tokens/s per GPU $(field "$TR" tokens_per_s_per_gpu)" \
    || { echo "FAIL PP=2 torchrun launch"; tail -8 /tmp/gpupp_tr.log; }
else
  echo "SKIP PP=2 via torchrun (no torchrun or time budget)"
fi
echo "== total $(el)"
