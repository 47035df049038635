#!/usr/bin/env bash
# One device call for the GPU inference engine (issue 8), at most about 190 s on GPU 0 (INFER_BUDGET), everything on stdout:
#  1. test_infer_gpu (GPU engine vs the CPU engine and vs the uncached full forward; tiny config; greedy and seeded
#     decoding of the golden fixtures);
#  2. `trex bench-serve --device cuda` on flash-l4 random bf16 weights: client threads against the scheduler + GPU
#     engine at 1, 16 and 64 concurrent sequences: prefill tok/s, decode tok/s, TTFT and ITL p50/p90/p99, with the
#     engine's per-phase device times per step kind (--profile: PROFILE lines). The engine runs the routed experts
#     of every step as one grouped GEMM and the tensor-core attention (their reference paths are test options,
#     compared in test_infer_gpu); the HTTP server + stdlib client infer_load.py run where the build has
#     cpp-httplib;
#  3. transformers' generate on the same config at 16 sequences (hf_generate.py, at most 40 s, after the engine
#     run and before the HTTP test), and at the end the ratios of every C=16 engine run to it
#     (RATIO lines; issue 8 asks for >= 5x, decode and end to end).
# Assumes build-dev was built on the device (targets trex, test_infer_gpu) and .devdeps/ holds flash-l4.json and
# model_flops.py. Usage (repo root): bash bench/device/infer.sh [PROMPT_TOKENS] [GEN_TOKENS]
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# The shared golden fixture (tiny) travels in .devdeps (../shared does not reach the device).
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
P=${1:-512}
G=${2:-64}
PORT=8123
T0=$(date +%s)
left() { echo $((${INFER_BUDGET:-190} - ($(date +%s) - T0))); }
SUM=$(mktemp)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

echo "== test_infer_gpu"
if [ -x build-dev/tests/test_infer_gpu ]; then
  timeout 45 build-dev/tests/test_infer_gpu 2>&1 | grep -vE "^\[ RUN|^\[       OK" | tail -60
  rc=${PIPESTATUS[0]}
  echo "test_infer_gpu exit code: $rc ($([ $rc -eq 0 ] && echo PASS || echo FAIL))"
else
  echo "FAIL test_infer_gpu: build-dev/tests/test_infer_gpu missing"
fi

echo "== trex bench-serve --device cuda --config .devdeps/flash-l4.json (random bf16 weights; scheduler + GPU engine" \
  "in process, the objects trex serve runs), P=$P G=$G, concurrency 1,16,64"
HAVE_TREX=0
[ -x build-dev/trex ] && HAVE_TREX=1
if [ $HAVE_TREX = 1 ]; then
  echo "VARIANT default" >>"$SUM"
  timeout $(( $(left) - 100 )) build-dev/trex bench-serve --device cuda --profile \
    --config .devdeps/flash-l4.json --seed 1 --concurrency 1,16,64 --prompt-tokens $P --gen-tokens $G 2>&1 |
    grep -E "^C=|BENCH_SERVE|PROFILE|PASS|FAIL|rror" | tee -a "$SUM" | tail -24
  echo "bench-serve exit code: ${PIPESTATUS[0]}"
else
  echo "FAIL bench-serve: build-dev/trex missing"
fi

L=$(( $(left) < 40 ? $(left) : 40 ))
echo "== transformers generate, 16 sequences (limit $L s)"
if [ "$L" -gt 8 ]; then
  timeout $L python3 bench/device/hf_generate.py .devdeps/flash-l4.json --batch 16 --prompt $P --gen $G 2>&1 |
    grep -vE "Warning|warn\(" | tee -a "$SUM" | tail -6
  echo "hf generate exit code: ${PIPESTATUS[0]}"
else
  echo "SKIP hf generate: no time left"
fi

# The HTTP path too, where the build has cpp-httplib.
if [ $HAVE_TREX = 1 ] && build-dev/trex serve --help 2>&1 | grep -q -- --device && [ "$(left)" -gt 40 ]; then
  LOG=$(mktemp)
  build-dev/trex serve --device cuda --config .devdeps/flash-l4.json --seed 1 --port $PORT --max-batch 64 \
    --max-context $((P + G + 64)) --prefill-chunk $P >"$LOG" 2>&1 &
  SRV=$!
  sleep 1
  if kill -0 $SRV 2>/dev/null; then
    timeout $(( $(left) - 10 < 60 ? $(left) - 10 : 60 )) python3 bench/device/infer_load.py --port $PORT --prompt $P \
      --gen $G --levels 1,16,64 --wait 30 --pid $SRV
    echo "HTTP load test exit code: $?"
  else
    echo "SKIP HTTP load test: $(tail -1 "$LOG")"
  fi
  kill $SRV 2>/dev/null
  wait $SRV 2>/dev/null
fi

# Engine vs transformers at 16 sequences: decode tok/s, and end to end (C*G tokens over the decode round's wall
# time, which includes its prefill, as HF's generate_s does).
python3 - "$SUM" <<'PYEOF'
import json, sys
eng, hf, variant = [], None, "default"
for line in open(sys.argv[1]):
    if line.startswith("VARIANT "):
        variant = line.split()[1]
    elif line.startswith("BENCH_SERVE "):
        eng.append(json.loads(line[len("BENCH_SERVE "):]))
        eng[-1]["variant"] = variant
    elif line.startswith("HF "):
        hf = json.loads(line[3:])
if hf is None:
    print("SKIP ratio: no transformers result")
for e in eng:
    if e["concurrency"] != 16 or hf is None:
        continue
    e2e = e["completion_tokens"] / e["decode_round_s"]
    r_dec, r_e2e = e["decode_tok_s"] / hf["decode_tok_s"], e2e / hf["end_to_end_tok_s"]
    print("RATIO %s C=16: decode %.0f vs HF %.0f tok/s = %.2fx; end to end %.0f vs HF %.0f tok/s = %.2fx"
          " (%s >= 5x)" % (e["variant"], e["decode_tok_s"], hf["decode_tok_s"], r_dec, e2e,
                           hf["end_to_end_tok_s"], r_e2e, "PASS" if min(r_dec, r_e2e) >= 5 else "FAIL"))
# transformers' own numbers vary between calls (decode 425-661, end to end 401-601 tok/s at 16 so far): 5x its
# best seen is the robust bar.
for e in eng:
    if e["concurrency"] != 16:
        continue
    e2e = e["completion_tokens"] / e["decode_round_s"]
    ok = e["decode_tok_s"] >= 5 * 661 and e2e >= 5 * 601
    print("ROBUST %s C=16: decode %.0f tok/s (bar 3305), end to end %.0f tok/s (bar 3005): %s"
          % (e["variant"], e["decode_tok_s"], e2e, "PASS" if ok else "FAIL"))
PYEOF
rm -f "$SUM"
echo "== infer.sh done after $(( $(date +%s) - T0 )) s"
