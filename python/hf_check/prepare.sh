#!/usr/bin/env bash
# Makes the inputs of bench/device/hf_check.sh on a CPU machine, into the git-ignored .devdeps/hfcheck/ (a few MB):
# the demo's Hugging Face export, the golden fixture model (a control the comparer must pass tightly), and
# `trex record-forward` records (fp32 and fp64) on fixed ids:
#   demo_question  the demo's held-out OR question in the chat format (one row)
#   demo_docs      two CPT documents of the demo corpus, BOS + their first 255 tokens (two rows)
#   fixture        the fixture's own input_ids [2, 160]
# Usage (repo root, after scripts/demo.sh): python/hf_check/prepare.sh [TREX_BINARY] [DEMO_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
TREX=${1:-./build/trex}
DEMO=${2:-demo}
FIX=${TREX_SHARED:-../shared}/fixtures/deepseek-v4/tiny
D=.devdeps/hfcheck
for f in "$DEMO/hf/config.json" "$DEMO/heldout/question.txt" "$DEMO/data/cpt.jsonl" "$FIX/model.safetensors"; do
  [ -s "$f" ] || { echo "hf_check prepare: $f is missing (run scripts/demo.sh; fixtures from ../shared)" >&2; exit 1; }
done
rm -rf "$D.tmp"
mkdir -p "$D.tmp/demo_hf" "$D.tmp/fixture"
cp "$DEMO"/hf/config.json "$DEMO"/hf/*.safetensors "$DEMO"/hf/tokenizer.json "$D.tmp/demo_hf/"
cp "$DEMO"/hf/*.index.json "$D.tmp/demo_hf/" 2>/dev/null || true
cp "$FIX/config.json" "$FIX/model.safetensors" "$D.tmp/fixture/"

record() {  # name model args...
  local name=$1 model=$2
  shift 2
  "$TREX" record-forward --model "$model" "$@" --out "$D.tmp/$name.fp32.safetensors"
  "$TREX" record-forward --model "$model" "$@" --fp64 --out "$D.tmp/$name.fp64.safetensors"
}
record demo_question "$D.tmp/demo_hf" --prompt-file "$DEMO/heldout/question.txt" --chat

TOK=$D.tmp/demo_hf/tokenizer.json
BOS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bos_token_id"])' "$D.tmp/demo_hf/config.json")
for r in 0 1; do
  python3 - "$DEMO/data/cpt.jsonl" $r >"$D.tmp/doc$r.txt" <<'PYEOF'
import json, sys
long_docs = (d["text"] for d in map(json.loads, open(sys.argv[1])) if len(d["text"]) > 2000)
for _ in range(int(sys.argv[2])):
    next(long_docs)
sys.stdout.write(next(long_docs))
PYEOF
  "$TREX" tokenizer encode --tokenizer "$TOK" "$(cat "$D.tmp/doc$r.txt")" >"$D.tmp/doc$r.ids"
done
ids=$(python3 - "$BOS" "$D.tmp/doc0.ids" "$D.tmp/doc1.ids" <<'PYEOF'
import json, sys
rows = [json.load(open(p)) for p in sys.argv[2:]]
assert all(len(r) >= 255 for r in rows), f"CPT documents too short: {[len(r) for r in rows]} tokens"
print(json.dumps([[int(sys.argv[1])] + r[:255] for r in rows]))
PYEOF
)
rm -f "$D.tmp"/doc*
record demo_docs "$D.tmp/demo_hf" --ids "$ids"

fix_ids=$(python3 - "$FIX/io.safetensors" <<'PYEOF'
import array, json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    e = hdr["input_ids"]
    a, b = e["data_offsets"]
    f.seek(8 + n + a)
    v = array.array({"I64": "q", "I32": "i"}[e["dtype"]])
    v.frombytes(f.read(b - a))
B, S = e["shape"]
print(json.dumps([list(v[r * S:(r + 1) * S]) for r in range(B)]))
PYEOF
)
record fixture "$D.tmp/fixture" --ids "$fix_ids"
rm -rf "$D"
mv "$D.tmp" "$D"
du -sh "$D"
