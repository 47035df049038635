#!/usr/bin/env bash
# Multi-GPU checks and numbers for the NCCL communicator and data-parallel (ZeRO-1) GPU training, on a 2-GPU
# host, assuming build-dev is built (targets trex, test_comm_gpu, test_train_gpu) and .devdeps/ holds the
# shared bench configs. Prints PASS/FAIL lines and one JSON line per benchmark run: tests, then on CONFIG one GPU,
# DP=2 (mpirun), EP=2 (mpirun), DP=2 (torchrun --no-python), then the DP loss parity on small-s6. About 120 s.
# Usage (repo root, device): bash bench/device/nccl.sh [CONFIG] [SEQ]
set -uo pipefail
CFG=${1:-.devdeps/flash-l4.json}
SEQ=${2:-8192}
B=build-dev
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
nvidia-smi -L
echo "mpirun: $(command -v mpirun || echo none); torchrun: $(command -v torchrun || echo none)"

echo "== test_comm_gpu (NCCL collectives vs host, split, TCP rendezvous, stream ordering, hung-peer abort)"
timeout 60 $B/tests/test_comm_gpu 2>&1 | grep -vE "^\[ RUN|^\[       OK" | tail -25
[ "${PIPESTATUS[0]}" = 0 ] && echo "PASS test_comm_gpu" || echo "FAIL test_comm_gpu"
echo "== test_train_gpu: DataParallelGpu (ZeRO-1 on 2 GPUs vs 1 GPU) and Dsv4Gpu (single-GPU parity, new param layout)"
timeout 60 $B/tests/test_train_gpu --gtest_filter='DataParallelGpu.*:Dsv4Gpu.*' >/tmp/nccl_tt.log 2>&1
rc=$?
grep -E "loss one GPU|Failure|FAILED|rank [01]:" /tmp/nccl_tt.log | head -20
tail -4 /tmp/nccl_tt.log
[ "$rc" = 0 ] && echo "PASS test_train_gpu (DataParallelGpu, Dsv4Gpu)" || echo "FAIL test_train_gpu (rc $rc)"
echo "[$(el)]"

# Launch 2 ranks: mpirun when trex links MPI, else torchrun --no-python (TCP rendezvous for the NCCL id).
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

echo "== single GPU: trex bench train --config $CFG --seq $SEQ --batch 1 --steps 3 --warmup 2"
CUDA_VISIBLE_DEVICES=0 timeout 60 $B/trex bench train --config $CFG --seq $SEQ --batch 1 --steps 3 --warmup 2 >/tmp/nccl_one.log 2>&1
tail -4 /tmp/nccl_one.log
ONE=$(json </tmp/nccl_one.log)
echo "[$(el)]"
echo "== DP=2 (ZeRO-1): ${L[*]} trex bench train --config $CFG --seq $SEQ --batch 1 --steps 3 --warmup 2 --mesh dp=2"
timeout 90 "${L[@]}" $B/trex bench train --config $CFG --seq $SEQ --batch 1 --steps 3 --warmup 2 --mesh dp=2 >/tmp/nccl_dp.log 2>&1
tail -12 /tmp/nccl_dp.log
DP=$(json </tmp/nccl_dp.log)
one_tps=$(field "$ONE" tokens_per_s); dp_tps=$(field "$DP" tokens_per_s_per_gpu)
python3 - "$one_tps" "$dp_tps" "$(field "$DP" exposed_comm_ms)" "$(field "$DP" step_s)" <<'PY'
import sys
one, dp, exposed, step = (float(x) if x not in ("", "nan", "None") else float("nan") for x in sys.argv[1:5])
eff = dp / one if one == one and one > 0 else float("nan")
print(f"single-GPU tokens/s {one:.0f}; DP=2 tokens/s per GPU {dp:.0f}; efficiency {eff:.3f} (target >= 0.90); "
      f"exposed comm {exposed:.2f} ms of a {step*1000:.1f} ms step")
print(("PASS" if eff >= 0.90 else "FAIL") + " DP=2 per-GPU throughput >= 90% of one GPU")
PY
echo "[$(el)]"
if [ $(( $(date +%s) - T0 )) -lt 150 ]; then
  echo "== EP=2 folded in DP=2: ${L[*]} trex bench train --config $CFG --seq $SEQ --batch 1 --steps 3 --warmup 2 --mesh ep=2"
  timeout 45 "${L[@]}" $B/trex bench train --config $CFG --seq $SEQ --batch 1 --steps 3 --warmup 2 --mesh ep=2 >/tmp/nccl_ep.log 2>&1
  tail -12 /tmp/nccl_ep.log
  EP=$(json </tmp/nccl_ep.log)
  python3 - "$one_tps" "$(field "$EP" tokens_per_s_per_gpu)" "$(field "$EP" exposed_comm_ms)" "$(field "$EP" loss_first)" "$(field "$DP" loss_first)" <<'PY'
import sys
one, ep, exposed, l_ep, l_dp = (float(x) if x not in ("", "nan", "None") else float("nan") for x in sys.argv[1:6])
eff = ep / one if one == one and one > 0 else float("nan")
print(f"EP=2: tokens/s per GPU {ep:.0f}; efficiency {eff:.3f} (target >= 0.90); exposed DP comm {exposed:.2f} ms; "
      f"first loss EP {l_ep:.6f} vs DP {l_dp:.6f} (same global batch and weights)")
print(("PASS" if eff >= 0.90 else "FAIL") + " EP=2 per-GPU throughput >= 90% of one GPU")
print(("PASS" if abs(l_ep - l_dp) <= 2e-3 * abs(l_dp) else "FAIL") + " EP=2 first loss == DP=2 first loss (rel 2e-3)")
PY
else
  echo "SKIP EP=2 run (time budget)"
fi
echo "[$(el)]"
echo "PP=2: see bench/device/gpupp.sh (GpuModel stages + 1F1B over NCCL send/recv)"

if command -v torchrun >/dev/null && [ $(( $(date +%s) - T0 )) -lt 160 ]; then
  echo "== DP=2 via torchrun --no-python (TCP rendezvous at MASTER_ADDR:MASTER_PORT+1 for the NCCL id)"
  timeout 60 torchrun --no-python --standalone --nproc-per-node 2 $B/trex bench train --config $CFG --seq $SEQ --batch 1 \
    --steps 3 --warmup 2 --mesh dp=2 >/tmp/nccl_tr.log 2>&1
  tail -4 /tmp/nccl_tr.log
  TR=$(json </tmp/nccl_tr.log)
  [ "$(field "$TR" launcher)" = torchrun ] && echo "PASS torchrun launch: tokens/s per GPU $(field "$TR" tokens_per_s_per_gpu), exposed comm $(field "$TR" exposed_comm_ms) ms" || echo "FAIL torchrun launch"
fi
echo "[$(el)]"

if [ $(( $(date +%s) - T0 )) -lt 170 ]; then
  echo "== loss parity on .devdeps/small-s6.json seq 4096: one GPU --batch 2 vs DP=2 --batch 1 (same global batch)"
  CUDA_VISIBLE_DEVICES=0 timeout 40 $B/trex bench train --config .devdeps/small-s6.json --seq 4096 --batch 2 --steps 2 \
    --warmup 2 >/tmp/nccl_p1.log 2>&1
  timeout 40 "${L[@]}" $B/trex bench train --config .devdeps/small-s6.json --seq 4096 --batch 1 --steps 2 --warmup 2 \
    --mesh dp=2 >/tmp/nccl_p2.log 2>&1
  P1=$(json </tmp/nccl_p1.log); P2=$(json </tmp/nccl_p2.log)
  echo "$P1"; echo "$P2"
  [ -z "$P2" ] && tail -5 /tmp/nccl_p2.log
  python3 - "$(field "$P1" loss_first)" "$(field "$P2" loss_first)" "$(field "$P1" loss_last)" "$(field "$P2" loss_last)" <<'PY'
import sys
a, b, c, d = (float(x) if x not in ("", "nan", "None") else float("nan") for x in sys.argv[1:5])
print(f"loss step 1: one GPU {a:.6f} DP=2 {b:.6f}; loss step 3: one GPU {c:.6f} DP=2 {d:.6f}")
ok = abs(a - b) <= 2e-3 * abs(a) and abs(c - d) <= 5e-3 * abs(c)
print(("PASS" if ok else "FAIL") + " DP=2 losses == one GPU on the same global batch (rel 2e-3 / 5e-3)")
PY
fi
echo "== total $(el)"
