#!/usr/bin/env bash
# T-Rex vs Hugging Face transformers logits on a `trex export-hf` checkpoint (docs/hf_check.md). From the repo root
# on the device: bash bench/device/hf_check.sh. Inputs, made on a CPU machine by python/hf_check/prepare.sh and
# carried in the git-ignored .devdeps/hfcheck/ (a few MB):
#   demo_hf/   the demo's export (config.json, model.safetensors, tokenizer.json)
#   fixture/   the golden fixture model (config.json, model.safetensors): the comparer's own control
#   *.fp32.safetensors / *.fp64.safetensors   `trex record-forward` of those models on fixed ids
# When build-dev/trex exists (batch.sh built it; or $TREX names a binary), the records are made again with it on the
# carried ids, so the check runs the code of this checkout; else the carried records are used. transformers runs on the CPU in fp32
# (and fp64 for the fp64 records). Exit 1 when python/hf_check/compare.py fails a criterion. Results: $OUT/hf_check/.
set -uo pipefail
OUT=${OUT:-/tmp/hf_check_out}
R=$OUT/hf_check
D=.devdeps/hfcheck
mkdir -p "$R"
PY=${PYTHON:-python3}
[ -d "$D/demo_hf" ] || { echo "FAIL hf_check: $D/demo_hf missing (run python/hf_check/prepare.sh first)"; exit 1; }
REC=$D
TREX=${TREX:-build-dev/trex}
if [ -e "$TREX" ] && ! "$TREX" record-forward --help >/dev/null 2>"$R/trex_help.err"; then
  echo "NOTE: $TREX does not run record-forward: $(head -c 300 "$R/trex_help.err")"
fi
if [ -x "$TREX" ] && "$TREX" record-forward --help >/dev/null 2>&1; then
  REC=$R/records
  mkdir -p "$REC"
  for f in "$D"/*.fp32.safetensors; do
    name=$(basename "$f" .fp32.safetensors)
    model=$D/demo_hf
    case $name in fixture*) model=$D/fixture ;; esac
    ids=$("$PY" -c 'import sys,json
from safetensors import safe_open
with safe_open(sys.argv[1], "pt") as f: print(json.dumps(f.get_tensor("input_ids").tolist()))' "$f")
    for prec in fp32 fp64; do
      flag=(); [ $prec = fp64 ] && flag=(--fp64)
      "$TREX" record-forward --model "$model" --ids "$ids" "${flag[@]}" --out "$REC/$name.$prec.safetensors" \
        >/dev/null || { echo "FAIL hf_check: trex record-forward $name $prec"; exit 1; }
    done
  done
  echo "records made by $TREX"
else
  echo "records: the carried ones in $D (no $TREX with record-forward)"
fi
rc=0
for model in demo_hf fixture; do
  pat=demo; [ $model = fixture ] && pat=fixture
  r32=(); r64=()
  for f in "$REC"/$pat*.fp32.safetensors; do r32+=(--record "$f"); done
  for f in "$REC"/$pat*.fp64.safetensors; do r64+=(--record64 "$f"); done
  timeout 75 "$PY" python/hf_check/compare.py --model "$D/$model" "${r32[@]}" "${r64[@]}" --out "$R/$model.json" \
    >"$R/$model.log" 2>&1
  s=$?
  "$PY" - "$R/$model.json" "$model" <<'PYEOF' || true
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["records"]:
    if "error" in x:
        print(sys.argv[2], x["record"], "ERROR", x["error"][-600:]); continue
    n, i = x["natural"], x["injected"]
    print(f'{sys.argv[2]} {x["record"].split("/")[-1]} {x["dtype"]}: natural logits {n["logits_max_rel_err"]:.2e} '
          f'loss {n["loss_hf"]:.6f} vs {n["loss_trex"]:.6f} greedy {n["greedy_agree"]:.4f} '
          f'flips {sum(n["selections_differing"].values())} first {n["first_flip"]} | injected logits '
          f'{i["logits_max_rel_err"]:.2e} hidden {max(i["hidden_max_rel_err_per_layer"]):.2e} loss |d| '
          f'{i["loss_abs_diff"]:.1e} worst tie {i["worst_tie_rel_gap"]:.1e} -> {"PASS" if x["pass"] else "FAIL"}')
if r.get("load_problems"): print("load problems:", r["load_problems"])
PYEOF
  if [ $s -ne 0 ]; then rc=1; echo "FAIL hf_check $model (rc $s)"; tail -20 "$R/$model.log"; else echo "PASS hf_check $model"; fi
done
exit $rc
