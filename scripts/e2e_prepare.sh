#!/usr/bin/env bash
# The data side of the end-to-end run (docs/e2e.md), run HERE (this machine has the COIN-OR / GLPK solvers that
# `trex ordata generate` verifies every sample with; the device has none). Writes .devdeps/e2e/ (git-ignored; it
# travels to the device with every call):
#   cpt.jsonl.gz, sft.jsonl.gz   the solver-verified OR corpus (sft stripped to id + messages: what training reads)
#   tokenizer.json               a byte-level BPE trained on that corpus (vocab E2E_VOCAB, default 8192)
#   eval/<bench>.jsonl           the evaluation subset: a seeded choice of items with ground truth from public OR
#                                benchmarks (file stems kept: `trex eval` picks each benchmark's rule by stem)
#   ordata_stats.json, ordata_report.html, manifest.json   generation / decontamination statistics, what was made
# Usage (repo root): scripts/e2e_prepare.sh [TREX_BINARY]   (default ./build-e2e/trex, built with solvers ON)
# Env: E2E_N (verified samples, default 12000), E2E_SEED (1130), E2E_VOCAB (8192), E2E_EVAL ("nl4opt_289:50
#      optibench:50"), E2E_WORK (scratch dir, default /tmp/e2e_work), TREX_SHARED (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."
TREX=${1:-./build-e2e/trex}
[ -x "$TREX" ] || { echo "e2e_prepare: $TREX is not an executable trex binary" >&2; exit 1; }
N=${E2E_N:-12000}
SEED=${E2E_SEED:-1130}
VOCAB=${E2E_VOCAB:-8192}
EVAL_SPEC=${E2E_EVAL:-"nl4opt_289:50 optibench:50"}
WORK=${E2E_WORK:-/tmp/e2e_work}
SHARED=${TREX_SHARED:-../shared}
BENCH=$SHARED/benchmarks
DEST=.devdeps/e2e
[ -d "$BENCH" ] || { echo "e2e_prepare: $BENCH not found (set TREX_SHARED)" >&2; exit 1; }
# One core (--workers 1). Measured on the 2-core dev machine with a build running beside it: 6,000 samples in 217 s
# wall (27.6 verified samples/s; 200 samples take 12 s, mostly loading the benchmarks for decontamination), so
# 12,000 take ~7-8 minutes; gzip -9 keeps both files at ~2.1 KB per sample (~26 MB for 12,000).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$WORK"
t0=$SECONDS
if [ ! -s "$WORK/ordata/sft.jsonl" ] || [ ! -s "$WORK/ordata/cpt.jsonl" ] ||
   [ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kept"])' "$WORK/ordata/stats.json" 2>/dev/null)" != "$N" ]; then
  rm -rf "$WORK/ordata"
  echo "== trex ordata generate --n $N --seed $SEED --workers 1 (decontamination against $BENCH)"
  "$TREX" ordata generate --n "$N" --seed "$SEED" --workers 1 --out "$WORK/ordata" --benchmarks "$BENCH" --no-progress
else
  echo "== $WORK/ordata holds $N samples of an earlier run: kept"
fi
echo "-- corpus: $((SECONDS - t0)) s"

mkdir -p "$DEST.tmp/eval"
# SFT: only id + messages travel (the lp / files / verification fields are for `trex ordata check`, not training).
python3 - "$WORK/ordata/sft.jsonl" "$DEST.tmp/sft.jsonl" <<'PYEOF'
import json, sys
with open(sys.argv[1]) as src, open(sys.argv[2], "w") as dst:
    for line in src:
        d = json.loads(line)
        dst.write(json.dumps({"id": d["id"], "messages": d["messages"]}, ensure_ascii=False) + "\n")
PYEOF
cp "$WORK/ordata/cpt.jsonl" "$DEST.tmp/cpt.jsonl"
t=$SECONDS
"$TREX" tokenizer train --input "$DEST.tmp/cpt.jsonl" "$DEST.tmp/sft.jsonl" --vocab-size "$VOCAB" --out "$DEST.tmp/tokenizer.json"
echo "-- tokenizer: $((SECONDS - t)) s"
gzip -9 -n "$DEST.tmp/cpt.jsonl" "$DEST.tmp/sft.jsonl"
cp "$WORK/ordata/stats.json" "$DEST.tmp/ordata_stats.json"
cp "$WORK/ordata/report.html" "$DEST.tmp/ordata_report.html"

# The evaluation subset: a seeded choice (without replacement) of items that have a ground truth.
python3 - "$BENCH" "$DEST.tmp" "$SEED" "$EVAL_SPEC" "$N" "$VOCAB" <<'PYEOF'
import json, os, random, sys
bench, dest, seed, spec, n, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(), sys.argv[5], sys.argv[6]
stats = json.load(open(os.path.join(dest, "ordata_stats.json")))
tok = json.load(open(os.path.join(dest, "tokenizer.json")))
vocab_real = len(tok["model"]["vocab"])
manifest = {"seed": seed, "samples": int(n), "kept": stats.get("kept"), "attempts": stats.get("attempts"),
            "decontamination": stats.get("decontamination"), "tokenizer_vocab_requested": int(vocab), "tokenizer_vocab": vocab_real, "eval": {}}
for item in spec:
    name, k = item.split(":")
    rows = [json.loads(l) for l in open(os.path.join(bench, name + ".jsonl")) if l.strip()]
    graded = [r for r in rows if r.get("answer") is not None or r.get("answer_type") in ("infeasible", "unbounded")]
    rng = random.Random(f"{seed}:{name}")
    pick = sorted(rng.sample(range(len(graded)), min(int(k), len(graded))))
    with open(os.path.join(dest, "eval", name + ".jsonl"), "w") as f:
        for i in pick:
            f.write(json.dumps(graded[i], ensure_ascii=False) + "\n")
    manifest["eval"][name] = {"items": len(pick), "of_graded": len(graded), "of_total": len(rows),
                              "ids": [graded[i]["id"] for i in pick]}
json.dump(manifest, open(os.path.join(dest, "manifest.json"), "w"), indent=1)
d = stats.get("decontamination", {})
print(f"== decontamination ({d.get('benchmarks')} benchmarks, {d.get('benchmark_questions')} questions, "
      f"{d.get('ngram')}-gram containment, drop at >= {d.get('threshold')}): scored {d.get('scored')}, "
      f"dropped {d.get('dropped')}, max containment {d.get('max_containment')}, histogram {d.get('histogram')}")
print("== eval subset: " + ", ".join(f"{k} {v['items']} of {v['of_graded']} graded" for k, v in manifest["eval"].items()))
PYEOF
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
ls -la "$DEST" "$DEST/eval"
du -sh "$DEST"; du -sh .devdeps
size_kb=$(du -sk .devdeps | cut -f1)
[ "$size_kb" -le $((50 * 1024)) ] || echo "e2e_prepare: WARNING .devdeps is ${size_kb} KiB, over the ~50 MiB budget" >&2
echo "== e2e_prepare done in $((SECONDS - t0)) s"
