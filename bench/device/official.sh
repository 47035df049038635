#!/usr/bin/env bash
# The issue 9 / issue 10 comparison, side by side in one device call on the same machine: `trex bench train`
# and the Hugging Face baseline (../shared/bench/hf_baseline.py, copied into .devdeps/) on flash-l4 @8192 and
# small-s6 @4096 on one H200, then the FSDP2 baseline on two H200s (torchrun). One JSON line per run.
# T-Rex's own 2-GPU layouts are in bench/device/nccl.sh. Assumes build-dev is built (trex).
# Usage (repo root, device): bash bench/device/official.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
one() {  # limit, command...
  local lim=$1; shift
  echo "== $*"
  timeout "$lim" "$@" 2>&1 | grep -E '^\{|rror|Traceback|out of memory' | tail -3
  el
}
export CUDA_VISIBLE_DEVICES=0
one 90 ./build-dev/trex bench train --config .devdeps/flash-l4.json --seq 8192 --batch 1 --steps 5 --warmup 2 --sections --device cuda
one 150 python3 .devdeps/hf_baseline.py .devdeps/flash-l4.json --seq 8192 --batch 1
one 60 ./build-dev/trex bench train --config .devdeps/small-s6.json --seq 4096 --batch 1 --steps 5 --warmup 2 --sections --device cuda
one 90 python3 .devdeps/hf_baseline.py .devdeps/small-s6.json --seq 4096 --batch 1
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && [ "${OFFICIAL_FSDP:-1}" = 1 ]; then
export CUDA_VISIBLE_DEVICES=0,1
one 150 torchrun --standalone --nproc-per-node 2 .devdeps/hf_baseline.py .devdeps/flash-l4.json --seq 8192 --batch 1
fi
echo "== official.sh done"; el
