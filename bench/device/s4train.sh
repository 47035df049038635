#!/usr/bin/env bash
# Session 4, one H200: the new GPU tests, then `trex train --device cuda` (the whole training loop on one GPU: packed
# data, clipping, schedule, router-bias update, metrics, the final checkpoint) against `trex bench train` (the bare
# GPU step on random tokens) on small-s6 @4096 with AdamW, in the same call.
# Assumes bench/device/batch.sh built build-dev. Usage (repo root, device): bash bench/device/s4train.sh
# S4_TESTS=0 skips the tests, S4_BENCH=0 the `trex bench train` comparison; S4_STEPS sets the training steps (16),
# S4_RESUME=1 adds a resumed run of 4 more steps.
set -uo pipefail
. bench/device/lib.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
if [ -z "${TREX_SHARED:-}" ] && [ -d .devdeps/fixtures ]; then export TREX_SHARED=$PWD/.devdeps; fi
B=build-dev
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }

RUN_TEST_SHOW='Failure|Expected|Which is|error|FAILED|PASSED|SKIPPED|  step [0-9]|worst|argmax|token [0-9]|identical|row [0-9]'
RUN_TEST_LINES=80
if [ "${S4_TESTS:-1}" = 1 ]; then
  run_test "test_kernels_gpu indexer + sum of squares" 60 $B/tests/test_kernels_gpu \
    --gtest_filter='GpuIndexer.*:GpuOps.SumSquares*'
  el
  run_test "test_train_gpu GpuTrainer" 150 $B/tests/test_train_gpu --gtest_filter='GpuTrainer.*'
  el
  run_test "test_infer_gpu" 60 $B/tests/test_infer_gpu
  el
fi

# A CPT corpus of pseudo-sentences (only the step's speed is measured here; the end-to-end run uses OR data).
W=/tmp/s4train
rm -rf $W && mkdir -p $W
python3 - $W/corpus.jsonl <<'PYEOF'
import json, random, sys
rng = random.Random(7)
words = ["minimise", "maximise", "cost", "profit", "subject", "to", "capacity", "demand", "supply", "route",
         "plant", "warehouse", "shift", "worker", "machine", "product", "integer", "binary", "flow", "node",
         "arc", "budget", "time", "period", "inventory", "order", "truck", "load", "limit", "each"]
with open(sys.argv[1], "w") as f:
    for d in range(3000):
        n = rng.randrange(200, 1200)
        text = " ".join(rng.choice(words) + (str(rng.randrange(100)) if rng.random() < 0.2 else "") for _ in range(n))
        f.write(json.dumps({"text": text}) + "\n")
PYEOF
timeout 60 $B/trex tokenizer train --input $W/corpus.jsonl --vocab-size 4096 --out $W/tok.json 2>&1 | tail -1
cat >$W/run.yaml <<EOF
seed: 1
device: cuda
model: {type: dsv4, config: .devdeps/small-s6.json, balance_alpha: 0, use_mtp: false, bias_update_speed: 0.001}
data: {jsonl: [$W/corpus.jsonl], tokenizer: $W/tok.json, format: cpt, seq_len: 4096, batch_size: 1}
optimizer: {kind: adamw, clip_grad_norm: 1.0, adamw: {beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.1}}
schedule: {kind: cosine, lr: 3.0e-4, min_lr: 3.0e-5, warmup_steps: 2}
train: {max_steps: ${S4_STEPS:-16}}
checkpoint: {every: 1000, keep_last: 1}
logging: {plot: true}
EOF
echo "== trex train --device cuda (small-s6 @4096, AdamW, ${S4_STEPS:-16} steps, final checkpoint)"
t=$(date +%s)
timeout 240 $B/trex train $W/run.yaml --out $W/run --no-progress 2>&1 | grep -vE "^\s*$" | tail -8
echo "trex train exit ${PIPESTATUS[0]} after $(( $(date +%s) - t )) s (host init + GPU steps + checkpoint write)"
python3 - $W/run/metrics.jsonl <<'PYEOF'
import json, statistics, sys
try:
    m = [json.loads(l) for l in open(sys.argv[1])]
except OSError as e:
    print("FAIL no metrics:", e); sys.exit(0)
for r in m:
    print("  step %2d loss %.4f gnorm %s tok/s %.0f MFU %.2f%%" % (r["step"], r["loss"], r["grad_norm"],
          r["tokens_per_s"], 100 * r["mfu"]))
late = m[3:]
if late:
    print("TRAIN_CUDA steps %d-%d: median %.0f tok/s, MFU %.2f%%; loss %.4f -> %.4f" % (late[0]["step"], late[-1]["step"],
          statistics.median(r["tokens_per_s"] for r in late), 100 * statistics.median(r["mfu"] for r in late),
          m[0]["loss"], m[-1]["loss"]))
PYEOF
ls -la $W/run/checkpoints/*/ 2>/dev/null | head -8
el
if [ "${S4_RESUME:-0}" = 1 ]; then
  R=$(( ${S4_STEPS:-16} + 4 ))
  echo "== resume: the same command with --max-steps $R (loads the step-${S4_STEPS:-16} checkpoint: weights, moments, sampler)"
  t=$(date +%s)
  timeout 150 $B/trex train $W/run.yaml --out $W/run --no-progress --max-steps $R 2>&1 | grep -E "resum|start_step|rror" | tail -4
  echo "resume exit ${PIPESTATUS[0]} after $(( $(date +%s) - t )) s"
  tail -5 $W/run/metrics.jsonl | python3 -c "import json,sys; [print('  step %d loss %.4f tok/s %.0f' % (j['step'], j['loss'], j['tokens_per_s'])) for j in map(json.loads, sys.stdin)]"
  el
fi
[ "${S4_BENCH:-1}" = 0 ] && exit 0
echo "== trex bench train (the bare GPU step, random tokens) on the same config"
timeout 90 $B/trex bench train --config .devdeps/small-s6.json --seq 4096 --batch 1 --steps 10 --warmup 3 \
  --device cuda 2>&1 | grep -E '^\{|rror' | tail -2
el
