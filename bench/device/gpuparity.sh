#!/usr/bin/env bash
# `trex parity --device cuda` on the golden fixtures (issue 9), one H200: the generic sparse-attention and mHC tests
# (any head dim / stream count, vs the CPU kernels), the ParityGpu tests, then the command on each fixture with a compact summary
# of its JSON (loss, final normed hidden state, gradients vs the bf16-weight CPU model and vs the fixture).
# Assumes build-dev was configured + built with trex, test_kernels_gpu and test_train_gpu (the lead's batched
# call). The shared tiny fixture is read from $TREX_SHARED (default: .devdeps, where it is copied beside the other
# ../shared files). Usage (repo root, device): bash bench/device/gpuparity.sh
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
B=${GPUPARITY_BUILD:-build-dev}
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
echo "gpuparity: build $B, TREX_SHARED=${TREX_SHARED:-<build default>}"
t0=$(date +%s)
# Every step's timeout is capped so the whole script stays within 88 s of wall time (the batched call's 90 s).
cap() { local left=$(( 88 - ($(date +%s) - t0) )); [ $left -lt 1 ] && left=1; [ $1 -lt $left ] && echo $1 || echo $left; }

if [ -x $B/tests/test_kernels_gpu ]; then
  echo "== test_kernels_gpu --gtest_filter='GpuAttentionGeneric*:GpuMhcGeneric*'"
  timeout $(cap 15) $B/tests/test_kernels_gpu --gtest_filter='GpuAttentionGeneric*:GpuMhcGeneric*' 2>&1 |
    grep -E "^\[  |^\[==|Failure|Expected|Which is|generic|error" | head -40
  echo "test_kernels_gpu GpuAttentionGeneric+GpuMhcGeneric rc=${PIPESTATUS[0]} (0 = PASS)"
else
  echo "FAIL missing $B/tests/test_kernels_gpu"
fi

summ() {  # compact summary of one parity JSON line on stdin
  python3 -c '
import json, sys
j = None
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        try: j = json.loads(line)
        except Exception: pass
if j is None:
    print("  (no JSON)"); sys.exit(0)
keys = ["loss_gpu", "loss_cpu_bf16_weights", "loss_ref", "loss_rel_vs_cpu", "loss_rel_vs_ref",
        "loss_rel_cpu_bf16_weights_vs_ref", "final_normed_rel_l2_vs_cpu", "final_normed_rel_l2_vs_ref",
        "final_normed_rel_l2_cpu_bf16_weights_vs_ref", "injected_topk_match_vs_ref", "gpu_step_ms"]
for k in keys: print("  %-28s %s" % (k, j.get(k)))
for side in ["grads_vs_cpu", "grads_vs_ref"]:
    g = j.get(side, {})
    per = sorted(g.get("per_tensor", {}).items(), key=lambda kv: -(kv[1] if kv[1] is not None else 1e9))
    cpu = g.get("per_tensor_cpu_bf16_weights", {})
    print("  %s: all rel L2 (without mHC params) %s, with mHC %s (cpu bf16-weights vs ref: %s), %d tensors, "
          "worst 8 [gpu, cpu_bf16w]:" % (side, g.get("all_rel_l2"), g.get("all_rel_l2_with_mhc", "-"),
                                          g.get("all_rel_l2_cpu_bf16_weights", "-"), len(per)))
    for n, e in per[:8]: print("     %-52s %s %s" % (n, e, cpu.get(n, "")))
    if g.get("failing"): print("  %s FAILING: %s" % (side, json.dumps(g["failing"])))
    if g.get("missing_reference_grad"): print("  missing reference grads: %s" % g["missing_reference_grad"])
print("  tolerances: %s" % json.dumps(j.get("tolerances", {})))
'
}

for F in "${TREX_SHARED:-../shared}/fixtures/deepseek-v4/tiny" tests/fixtures/deepseek-v4/v4-tiny-b \
         tests/fixtures/deepseek-v4/v4-tiny-c; do
  name=$(basename "$F")
  if [ ! -f "$F/io.safetensors" ]; then echo "SKIP parity $name: fixture not found at $F"; continue; fi
  echo "== trex parity --device cuda --model $F"
  out=$(timeout $(cap 15) $B/trex parity --device cuda --model "$F" --io "$F/io.safetensors" --grads "$F/grads.safetensors" 2>&1)
  rc=$?
  echo "$out" | grep -v '^{' | tail -5
  echo "$out" | summ
  if [ $rc -eq 0 ]; then echo "PASS parity --device cuda $name"; else echo "FAIL parity --device cuda $name (rc=$rc)"; fi
done
if [ -x $B/tests/test_train_gpu ]; then
  echo "== test_train_gpu --gtest_filter='ParityGpu.*'"
  timeout $(cap 35) $B/tests/test_train_gpu --gtest_filter='ParityGpu.*' 2>&1 |
    grep -E "^\[  |^\[==|Failure|Expected|Which is|loss gpu|Skipped|skip|hc_mult|error" | head -60
  echo "test_train_gpu ParityGpu rc=${PIPESTATUS[0]} (0 = PASS)"
else
  echo "FAIL missing $B/tests/test_train_gpu"
fi

echo "gpuparity: done in $(( $(date +%s) - t0 )) s"
