#!/usr/bin/env bash
# The whole training loop on one H200 against the bare step (issue 17's bar: `trex train --device cuda` within 3%
# of `trex bench train`'s tokens/s on flash-l4 @8192), in one call: `trex bench train` (random tokens), then
# `trex train --device cuda` on packed CPT rows of a synthetic corpus (AdamW, clipping, cosine schedule,
# router-bias update, metrics; median tokens/s of the steps after the first three), each with recompute none and
# full, and the bare step with train.deterministic's fixed-order attention backward.
# Usage (repo root, device, after bench/device/batch.sh built build-dev): bash bench/device/train_loop.sh [CONFIG] [SEQ]
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
CFG=${1:-.devdeps/flash-l4.json} SEQ=${2:-8192} STEPS=${STEPS:-10}
B=build-dev/trex W=/tmp/train_loop
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
bench() {  # extra args...
  echo "== trex bench train --config $CFG --seq $SEQ $*"
  timeout 120 $B bench train --config $CFG --seq $SEQ --batch 1 --steps 6 --warmup 2 --device cuda "$@" 2>&1 |
    grep -E '^\{|rror' | tail -1 | python3 -c 'import json,sys
for l in sys.stdin:
    try: j=json.loads(l)
    except Exception: print(l.strip()); continue
    print("BENCH tokens/s %d MFU %.4f peak %.1f GiB step %.4f s recompute %s deterministic %s" % (j["tokens_per_s"], j["mfu"], j["peak_gib"], j["step_s"], j.get("recompute"), j.get("deterministic")))'
  el
}
bench
bench --recompute full
bench --recompute selective
bench --deterministic
rm -rf $W && mkdir -p $W
python3 - $W/corpus.jsonl <<'PYEOF'
import json, random, sys
rng = random.Random(7)
words = ["minimise", "maximise", "cost", "profit", "subject", "to", "capacity", "demand", "supply", "route", "plant",
         "warehouse", "shift", "worker", "machine", "product", "integer", "binary", "flow", "node", "arc", "budget"]
with open(sys.argv[1], "w") as f:
    for d in range(600):
        text = " ".join(rng.choice(words) + (str(rng.randrange(100)) if rng.random() < 0.2 else "")
                        for _ in range(rng.randrange(400, 2400)))
        f.write(json.dumps({"text": text}) + "\n")
PYEOF
timeout 60 $B tokenizer train --input $W/corpus.jsonl --vocab-size 2048 --out $W/tok.json 2>&1 | tail -1
for rc in none full; do
  cat >$W/run_$rc.yaml <<YEOF
seed: 1
device: cuda
recompute: $rc
model: {type: dsv4, config: $CFG, balance_alpha: 0, use_mtp: false, bias_update_speed: 0.001}
data: {jsonl: [$W/corpus.jsonl], tokenizer: $W/tok.json, format: cpt, seq_len: $SEQ, batch_size: 1}
optimizer: {kind: adamw, clip_grad_norm: 1.0, adamw: {beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.1}}
schedule: {kind: cosine, lr: 3.0e-4, min_lr: 3.0e-5, warmup_steps: 2}
train: {max_steps: $STEPS}
checkpoint: {every: 100000, keep_last: 1}
logging: {plot: false}
YEOF
  echo "== trex train --device cuda ($CFG @$SEQ, recompute $rc, $STEPS steps)"
  t=$(date +%s)
  timeout 200 $B train $W/run_$rc.yaml --out $W/run_$rc --no-progress 2>&1 | grep -vE "^\s*$" | tail -3
  echo "trex train exit ${PIPESTATUS[0]} after $(( $(date +%s) - t )) s (init + steps + final checkpoint)"
  python3 - $W/run_$rc/metrics.jsonl $rc <<'PYEOF'
import json, statistics, sys
try:
    m = [json.loads(l) for l in open(sys.argv[1])]
except OSError as e:
    print("FAIL no metrics:", e); sys.exit(0)
late = m[3:]
print("TRAIN recompute %s: steps %d-%d median %.0f tok/s, MFU %.4f; loss %.4f -> %.4f" % (sys.argv[2],
      late[0]["step"], late[-1]["step"], statistics.median(r["tokens_per_s"] for r in late),
      statistics.median(r["mfu"] for r in late), m[0]["loss"], m[-1]["loss"]))
PYEOF
  el
done
