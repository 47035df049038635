#!/usr/bin/env bash
# One device call for the GPU inference engine (issue 8), about 150 s on GPU 0, everything on stdout:
#  1. test_infer_gpu (GPU engine vs the CPU engine and vs the uncached full forward; tiny config);
#  2. `trex bench-serve --device cuda` on flash-l4 random bf16 weights: client threads against the scheduler + GPU
#     engine at 1, 16 and 64 concurrent sequences: prefill tok/s, decode tok/s, TTFT and ITL p50/p90/p99, with the
#     engine's per-phase device times per step kind (TREX_INFER_PROFILE=1: PROFILE lines); then again with the
#     routed experts as one grouped GEMM (--moe-grouped: no host read of the expert counts) at 16 and 64 (and the
#     HTTP server + stdlib client infer_load.py where the build has cpp-httplib);
#  3. transformers' generate on the same config at 16 sequences (hf_generate.py), with what time is left, and the
#     ratios of the engine's C=16 throughput to it (issue 8 asks for >= 5x).
# Assumes build-dev was built on the device (targets trex, test_infer_gpu) and .devdeps/ holds flash-l4.json and
# model_flops.py. Usage (repo root): bash bench/device/infer.sh [PROMPT_TOKENS] [GEN_TOKENS]
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
P=${1:-512}
G=${2:-64}
PORT=8123
T0=$(date +%s)
left() { echo $((145 - ($(date +%s) - T0))); }
SUM=$(mktemp)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

echo "== test_infer_gpu"
if [ -x build-dev/tests/test_infer_gpu ]; then
  timeout 25 build-dev/tests/test_infer_gpu 2>&1 | grep -vE "^\[ RUN|^\[       OK" | tail -60
  rc=${PIPESTATUS[0]}
  echo "test_infer_gpu exit code: $rc ($([ $rc -eq 0 ] && echo PASS || echo FAIL))"
else
  echo "FAIL test_infer_gpu: build-dev/tests/test_infer_gpu missing"
fi

echo "== trex bench-serve --device cuda --config .devdeps/flash-l4.json (random bf16 weights; scheduler + GPU engine" \
  "in process, the objects trex serve runs), P=$P G=$G, concurrency 1,16,64"
if [ -x build-dev/trex ]; then
  TREX_INFER_PROFILE=1 timeout $(( $(left) - 60 )) build-dev/trex bench-serve --device cuda \
    --config .devdeps/flash-l4.json --seed 1 --concurrency 1,16,64 --prompt-tokens $P --gen-tokens $G 2>&1 |
    grep -E "^C=|BENCH_SERVE|PROFILE|PASS|FAIL|rror" | tee -a "$SUM" | tail -20
  echo "bench-serve exit code: ${PIPESTATUS[0]}"
  echo "== bench-serve --moe-grouped (routed experts as one grouped GEMM), concurrency 16,64"
  TREX_INFER_PROFILE=1 timeout $(( $(left) - 45 )) build-dev/trex bench-serve --device cuda --moe-grouped \
    --config .devdeps/flash-l4.json --seed 1 --concurrency 16,64 --prompt-tokens $P --gen-tokens $G 2>&1 |
    grep -E "^C=|BENCH_SERVE|PROFILE|PASS|FAIL|rror" | tee -a "$SUM" | tail -20
  echo "bench-serve --moe-grouped exit code: ${PIPESTATUS[0]}"
  # The HTTP path too, where the build has cpp-httplib.
  if build-dev/trex serve --help 2>&1 | grep -q -- --device && [ "$(left)" -gt 70 ]; then
    LOG=$(mktemp)
    build-dev/trex serve --device cuda --config .devdeps/flash-l4.json --seed 1 --port $PORT --max-batch 16 \
      --max-context $((P + G + 64)) --prefill-chunk $P >"$LOG" 2>&1 &
    SRV=$!
    sleep 1
    if kill -0 $SRV 2>/dev/null; then
      timeout $(( $(left) - 35 )) python3 bench/device/infer_load.py --port $PORT --prompt $P --gen $G --levels 1,16 \
        --wait 30
      echo "HTTP load test exit code: $?"
    else
      echo "SKIP HTTP load test: $(tail -1 "$LOG")"
    fi
    kill $SRV 2>/dev/null
    wait $SRV 2>/dev/null
  fi
else
  echo "FAIL bench-serve: build-dev/trex missing"
fi

L=$(left)
echo "== transformers generate, 16 sequences (limit $L s)"
if [ "$L" -gt 8 ]; then
  timeout $L python3 bench/device/hf_generate.py .devdeps/flash-l4.json --batch 16 --prompt $P --gen $G 2>&1 |
    grep -vE "Warning|warn\(" | tee -a "$SUM" | tail -6
  rc=${PIPESTATUS[0]}
  echo "hf generate exit code: $rc"
  # Engine vs transformers at 16 sequences: decode tok/s, and end to end (C*G tokens over the decode round's wall
  # time, which includes its prefill, as HF's generate_s does).
  python3 - "$SUM" <<'PYEOF'
import json, sys
eng, hf = [], None
for line in open(sys.argv[1]):
    if line.startswith("BENCH_SERVE "):
        eng.append(json.loads(line[len("BENCH_SERVE "):]))
    elif line.startswith("HF "):
        hf = json.loads(line[3:])
if hf is None:
    print("SKIP ratio: no transformers result")
for e in eng:
    if e["concurrency"] != 16 or hf is None:
        continue
    e2e = e["completion_tokens"] / e["decode_round_s"]
    r_dec, r_e2e = e["decode_tok_s"] / hf["decode_tok_s"], e2e / hf["end_to_end_tok_s"]
    print("RATIO moe_grouped=%s C=16: decode %.0f vs HF %.0f tok/s = %.2fx; end to end %.0f vs HF %.0f tok/s = %.2fx"
          " (%s >= 5x)" % (e.get("moe_grouped"), e["decode_tok_s"], hf["decode_tok_s"], r_dec, e2e,
                           hf["end_to_end_tok_s"], r_e2e, "PASS" if min(r_dec, r_e2e) >= 5 else "FAIL"))
PYEOF
else
  echo "SKIP hf generate: no time left"
fi
rm -f "$SUM"
echo "== infer.sh done after $(( $(date +%s) - T0 )) s"
