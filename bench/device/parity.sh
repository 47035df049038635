#!/usr/bin/env bash
# `trex parity` on every golden fixture, on the CPU and with --device cuda (the GPU training step against the CPU
# model and the fixture), after bench/device/batch.sh built build-dev. The shared fixture is read from
# $TREX_SHARED (default .devdeps, where it is copied beside the other ../shared files); the two more live in
# tests/fixtures. Prints one PASS / FAIL line per fixture and device and the JSON's loss and worst errors.
# Usage (repo root, device): bash bench/device/parity.sh
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
B=build-dev
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
fail=0
for F in "${TREX_SHARED:-../shared}/fixtures/deepseek-v4/tiny" tests/fixtures/deepseek-v4/v4-tiny-b \
         tests/fixtures/deepseek-v4/v4-tiny-c; do
  name=$(basename "$F")
  if [ ! -f "$F/io.safetensors" ]; then echo "FAIL parity $name: fixture not found at $F"; fail=1; continue; fi
  for dev in cpu cuda; do
    out=$(timeout 120 $B/trex parity --device $dev --model "$F" --io "$F/io.safetensors" --grads "$F/grads.safetensors" 2>&1)
    rc=$?
    echo "$out" | grep -v '^{' | tail -3
    echo "$out" | python3 -c '
import json, sys
j = None
for line in sys.stdin:
    if line.startswith("{"):
        try: j = json.loads(line)
        except Exception: pass
if j: print("  " + ", ".join("%s %s" % (k, j[k]) for k in sorted(j) if k.startswith("loss") or k.endswith("max_rel_err")))'
    if [ $rc -eq 0 ]; then echo "PASS parity --device $dev $name"; else echo "FAIL parity --device $dev $name (rc=$rc)"; fail=1; fi
  done
done
exit $fail
