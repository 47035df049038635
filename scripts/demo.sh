#!/usr/bin/env bash
# The embedded default job behind the README's run command (README item 8), run from the repository root
# into demo/: a small OR corpus made by `trex ordata`, a tokenizer trained on it, CPT then SFT of a tiny
# DeepSeek-V4 (configs/demo.yaml, configs/demo-sft.yaml) on the CPU, a Hugging Face export, and one greedy
# answer to a question no training stage has seen. Re-running skips the finished data stages and resumes
# (or skips) the training runs.
# Usage: scripts/demo.sh [TREX_BINARY]   (default ./build/trex)
set -euo pipefail
cd "$(dirname "$0")/.."
TREX=${1:-./build/trex}
[ -x "$TREX" ] || { echo "demo: $TREX is not an executable trex binary (build first: scripts/build.sh)" >&2; exit 1; }
PY=$(command -v python3)
# One thread unless asked otherwise: the model is so small that a second OpenMP thread gains little, and on a
# busy machine its barriers cost up to 8x (measured: 4 CPT steps 3.5 s with 1 thread, 27 s with 2, load 14).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
N_SAMPLES=120          # verified OR problems: SFT chats, each with a CPT worked example
SEED=1234
HELDOUT_SEED=987654    # a separate run: its problem instance is not in the training corpus
D=demo
mkdir -p "$D"
# Decontamination against the OR benchmarks needs ../shared/benchmarks (or $TREX_SHARED/benchmarks); on a machine
# without them the corpus is still made and verified, only that check is skipped (and said so).
SHARED=${TREX_SHARED:-../shared}
DECONTAM=()
if [ ! -d "$SHARED/benchmarks" ]; then
  DECONTAM=(--benchmarks none)
  echo "demo: $SHARED/benchmarks not found: benchmark decontamination of the demo corpus is skipped" >&2
fi
t_all=$SECONDS
stage() { printf '\n== %s\n' "$*"; }
took() { printf -- '-- %s: %d s\n' "$1" $((SECONDS - $2)); }

t=$SECONDS
if [ ! -s "$D/data/sft.jsonl" ] || [ ! -s "$D/data/cpt.jsonl" ]; then
  stage "OR corpus: $N_SAMPLES solver-verified samples (seed $SEED) -> $D/data"
  "$TREX" ordata generate --profile demo --n "$N_SAMPLES" --seed "$SEED" --out "$D/data" --no-progress "${DECONTAM[@]}"
else
  stage "OR corpus: $D/data exists, kept"
fi
if [ ! -s "$D/heldout/question.txt" ]; then
  stage "held-out question (seed $HELDOUT_SEED) -> $D/heldout"
  "$TREX" ordata generate --profile demo --n 1 --seed "$HELDOUT_SEED" --out "$D/heldout" --no-progress "${DECONTAM[@]}" >/dev/null
  "$PY" - "$D/heldout/sft.jsonl" "$D/heldout/question.txt" <<'PYEOF'
import json, sys
sample = json.loads(open(sys.argv[1]).readline())
question = next(m["content"] for m in sample["messages"] if m["role"] == "user")
open(sys.argv[2], "w").write(question)
PYEOF
fi
# The question must not occur in any training document (a different seed makes a different instance).
"$PY" - "$D/heldout/question.txt" "$D/data/sft.jsonl" "$D/data/cpt.jsonl" <<'PYEOF'
import json, sys
q = open(sys.argv[1]).read()
for path in sys.argv[2:]:
    for n, line in enumerate(open(path), 1):
        doc = json.loads(line)
        texts = [m["content"] for m in doc["messages"]] if "messages" in doc else [doc["text"]]
        if any(q in t for t in texts):
            sys.exit(f"demo: the held-out question occurs in {path}:{n}")
PYEOF
took data $t

t=$SECONDS
if [ ! -s "$D/data/tokenizer.json" ]; then
  stage "tokenizer: byte-level BPE, 1024 tokens -> $D/data/tokenizer.json"
  "$TREX" tokenizer train --input "$D/data/cpt.jsonl" "$D/data/sft.jsonl" --vocab-size 1024 \
    --out "$D/data/tokenizer.json"
else
  stage "tokenizer: $D/data/tokenizer.json exists, kept"
fi
took tokenizer $t

t=$SECONDS
stage "CPT: trex train configs/demo.yaml --out $D/cpt"
"$TREX" train configs/demo.yaml --out "$D/cpt"
took CPT $t
t=$SECONDS
stage "SFT (from the CPT weights): trex train configs/demo-sft.yaml --out $D/sft"
"$TREX" train configs/demo-sft.yaml --out "$D/sft"
took SFT $t

t=$SECONDS
stage "Hugging Face export of the SFT run -> $D/hf"
"$TREX" export-hf "$D/sft" --out "$D/hf" --dtype bf16 --dialect transformers
cp "$D/data/tokenizer.json" "$D/hf/tokenizer.json"
took export $t

t=$SECONDS
stage "held-out question (greedy, chat format)"
cat "$D/heldout/question.txt"; echo
stage "answer of $D/hf"
"$TREX" generate --model "$D/hf" --chat --prompt "$(cat "$D/heldout/question.txt")" --max-new-tokens 160 \
  | tee "$D/answer.txt"
took generate $t

stage "summary (total $((SECONDS - t_all)) s)"
"$PY" - "$D" <<'PYEOF'
import json, os, sys
d = sys.argv[1]
def losses(run):
    rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
    return rows[0], rows[-1]
for name in ("cpt", "sft"):
    run = os.path.join(d, name)
    first, last = losses(run)
    plots = [p for p in sorted(os.listdir(run)) if p.startswith("loss")]
    rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
    k = min(10, len(rows))
    head = sum(r["loss"] for r in rows[:k]) / k
    tail = sum(r["loss"] for r in rows[-k:]) / k
    print(f"{name.upper()}: loss {first['loss']:.3f} (step {first['step']}) -> {last['loss']:.3f} (step {last['step']});"
          f" mean of the first/last {k} steps {head:.3f} -> {tail:.3f}")
    print(f"  checkpoints: {os.path.join(run, 'checkpoints')}  ({', '.join(sorted(os.listdir(os.path.join(run, 'checkpoints'))))})")
    print(f"  metrics:     {os.path.join(run, 'metrics.jsonl')}")
    print(f"  loss plot:   {', '.join(os.path.join(run, p) for p in plots)}")
print(f"HF export:     {os.path.join(d, 'hf')}  (config.json, safetensors, tokenizer.json)")
print(f"answer:        {os.path.join(d, 'answer.txt')}  (held-out question: {os.path.join(d, 'heldout', 'question.txt')})")
PYEOF
