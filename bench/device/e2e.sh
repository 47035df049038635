#!/usr/bin/env bash
# End-to-end CPT -> SFT -> export -> serve -> zero-shot answers on one H200 (docs/e2e.md). Runs from the repo root
# on the device after bench/device/batch.sh built build-dev/trex; needs .devdeps/e2e from scripts/e2e_prepare.sh
# (corpus, tokenizer, evaluation subset). The device has no solvers, so answers are only generated here; score them
# on the dev machine with scripts/e2e_score.sh. Every stage runs under `timeout` and the summary is always printed.
# Writes to "$OUT/e2e/" (default /tmp/e2e_out/e2e): cpt_metrics.jsonl, sft_metrics.jsonl, cpt_loss.html,
# sft_loss.html, responses.jsonl, serve.log, eval_client.json, summary.txt.
#
# Env: E2E_DEVICE=cuda|cpu (cpu: the same flow on the CPU with a tiny model, short rows and few steps: the local
#      check), TREX (default build-dev/trex, falls back to build-e2e/trex), E2E_WORK (run directory, default
#      local/e2e; wiped at start), E2E_CPT_STEPS / E2E_SFT_STEPS (override the configs' max_steps),
#      E2E_EVAL_ITEMS (answer only the first N items of the interleaved subset; default all), E2E_MAX_TOKENS
#      (default 1536 on cuda, 64 on cpu), E2E_CONCURRENCY (64), E2E_PORT (default 8931), caps in seconds: E2E_CAP_CPT (200),
#      E2E_CAP_SFT (100), E2E_CAP_EXPORT (30), E2E_CAP_SERVE_UP (40), E2E_CAP_EVAL (45), E2E_CAP_PROBE (45);
#      E2E_PROBE=0 skips the throughput probe, E2E_CPT_SECONDS / E2E_SFT_SECONDS (140 / 60) are its targets
#      (the 03:10 run: a stage's start-up + checkpoints took 20-26 s on top of its steps).
#      On cuda the caps add up to 8 min; a stage that hits its cap is killed and the next one goes on with what
#      exists (SFT from the CPT run's newest checkpoint: CPT checkpoints at thirds, SFT halfway and at the end).
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
DEV=${E2E_DEVICE:-cuda}
OUT=${OUT:-/tmp/e2e_out}
R=$OUT/e2e
W=${E2E_WORK:-local/e2e}
D=.devdeps/e2e
PORT=${E2E_PORT:-8931}
CAP_PROBE=${E2E_CAP_PROBE:-45}
CONC=${E2E_CONCURRENCY:-64}   # requests in flight = the server's slots (--max-batch): 100 items in two waves
TREX=${TREX:-build-dev/trex}
[ -x "$TREX" ] || TREX=build-e2e/trex
mkdir -p "$R"
if [ "$DEV" = cpu ]; then
  CAP_CPT=${E2E_CAP_CPT:-600} CAP_SFT=${E2E_CAP_SFT:-600} CAP_EXPORT=${E2E_CAP_EXPORT:-120}
  CAP_UP=${E2E_CAP_SERVE_UP:-120} CAP_EVAL=${E2E_CAP_EVAL:-300} MAXTOK=${E2E_MAX_TOKENS:-64} MAXCTX=2048
else
  CAP_CPT=${E2E_CAP_CPT:-200} CAP_SFT=${E2E_CAP_SFT:-100} CAP_EXPORT=${E2E_CAP_EXPORT:-30}
  CAP_UP=${E2E_CAP_SERVE_UP:-40} CAP_EVAL=${E2E_CAP_EVAL:-45} MAXTOK=${E2E_MAX_TOKENS:-1536} MAXCTX=4096
fi
# The device has no cpp-httplib package: batch.sh exports the .devdeps drop-in; repeated here for a direct call.
[ -d .devdeps/httplib/lib ] && export LD_LIBRARY_PATH=$PWD/.devdeps/httplib/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SERVE_PID=
# Stops the server this script started (by its pid): TERM, then KILL after 10 s.
cleanup() {
  [ -n "$SERVE_PID" ] || return 0
  kill "$SERVE_PID" 2>/dev/null
  for _ in $(seq 1 20); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$SERVE_PID" 2>/dev/null
  SERVE_PID=
}
trap cleanup EXIT

STATUS_CPT=not_run STATUS_SFT=not_run STATUS_EXPORT=not_run STATUS_SERVE=not_run STATUS_EVAL=not_run
stage() { echo "== [$(el) s] $*"; }
# run_capped NAME CAP CMD...: the command under timeout, its output to $R/NAME.log (tail shown); sets RC.
run_capped() {
  local name=$1 cap=$2; shift 2
  local t=$(date +%s)
  timeout -k 5 "$cap" "$@" >"$R/$name.log" 2>&1
  RC=$?
  echo "-- $name: exit $RC after $(( $(date +%s) - t )) s (cap $cap s)"
  [ $RC -eq 0 ] || tail -15 "$R/$name.log"
}

stage "e2e on $DEV with $TREX; work dir $W"
ok=1
for f in "$D/cpt.jsonl.gz" "$D/sft.jsonl.gz" "$D/tokenizer.json" configs/e2e-cpt.yaml configs/e2e-sft.yaml; do
  [ -s "$f" ] || { echo "FAIL: $f missing (run scripts/e2e_prepare.sh on the dev machine)"; ok=0; }
done
[ -x "$TREX" ] || { echo "FAIL: no trex binary ($TREX)"; ok=0; }
command -v nvidia-smi >/dev/null && [ "$DEV" = cuda ] && nvidia-smi --query-gpu=name,memory.used --format=csv,noheader

if [ $ok = 1 ]; then
  rm -rf "$W"
  mkdir -p "$W/data"
  gzip -dc "$D/cpt.jsonl.gz" >"$W/data/cpt.jsonl"
  gzip -dc "$D/sft.jsonl.gz" >"$W/data/sft.jsonl"
  cp -r "$D/eval" "$W/eval"
  # The run configs: the checked-in ones with the paths pointed at $W (and on the CPU a tiny model: 2 layers of
  # hidden 64, 256-token rows, a few steps), so the CPU check exercises the same files and keys.
  python3 - "$DEV" "$W" "$D" "${E2E_CPT_STEPS:-}" "${E2E_SFT_STEPS:-}" <<'PYEOF'
import re, sys
dev, work, deps, cpt_steps, sft_steps = sys.argv[1:6]
tiny = {"hidden_size": "64", "num_hidden_layers": "2", "num_attention_heads": "4", "head_dim": "32",
        "qk_rope_head_dim": "8", "q_lora_rank": "32", "o_groups": "2", "o_lora_rank": "16", "n_routed_experts": "8",
        "num_experts_per_tok": "2", "moe_intermediate_size": "32", "index_n_heads": "4", "index_head_dim": "16",
        "index_topk": "8", "sliding_window": "16", "compress_ratios": "[16, 4]", "num_hash_layers": "1",
        "max_position_embeddings": "2048", "seq_len": "256", "batch_size": "2", "every": "1000000",
        "warmup_steps": "2"}
def rewrite(text, values):
    for key, val in values.items():
        text, n = re.subn(rf"(?m)^(\s*{key}:)[ \t]*[^#\n]*?([ \t]*#.*)?$", rf"\g<1> {val}\g<2>", text, count=1)
        assert n == 1, f"e2e: no '{key}:' line to rewrite"
    return text
for stage, steps in (("cpt", cpt_steps), ("sft", sft_steps)):
    text = open(f"configs/e2e-{stage}.yaml").read()
    text = text.replace("local/e2e/", work.rstrip("/") + "/").replace(".devdeps/e2e/", deps.rstrip("/") + "/")
    values = {"device": dev}
    if dev == "cpu":
        values.update(tiny)
        values["rope_scaling"] = "{type: yarn, factor: 4, original_max_position_embeddings: 256, beta_fast: 32, beta_slow: 1}"
    if not steps and dev == "cpu":
        steps = {"cpt": "30", "sft": "20"}[stage]  # the CPU check: a few steps of the tiny model
    if steps:
        values["max_steps"] = steps
    text = rewrite(text, values)
    open(f"{work}/{stage}.yaml", "w").write(text)
# The model section as an official config.json (for the `trex bench train` throughput probe): the dsv4 mapping's
# "key: value" lines, flow lists / mappings turned into JSON.
import json
model, inside = {"model_type": "deepseek_v4"}, False
for line in open(f"{work}/cpt.yaml"):
    if re.match(r"^\s+dsv4:", line):
        inside = True
        continue
    if inside:
        m = re.match(r"^\s{4}(\w+):\s*(.*?)\s*(#.*)?$", line)
        if not m:
            break
        v = re.sub(r"([{,]\s*)(\w+):", r'\1"\2":', m.group(2))
        v = re.sub(r':\s*([A-Za-z_]\w*)\s*([,}])', lambda t: t.group(0) if t.group(1) in ("true", "false", "null") else f': "{t.group(1)}"{t.group(2)}', v)
        try:
            model[m.group(1)] = json.loads(v)
        except json.JSONDecodeError:
            model[m.group(1)] = v
json.dump(model, open(f"{work}/model.json", "w"), indent=1)
PYEOF
  [ $? -eq 0 ] || { echo "FAIL: could not write the run configs"; ok=0; }
  echo "-- corpus: $(wc -l <"$W/data/cpt.jsonl") CPT documents, $(wc -l <"$W/data/sft.jsonl") SFT chats; eval: $(cat "$W"/eval/*.jsonl | wc -l) items"
fi

# Step counts from a throughput probe: the GPU step of this model (`trex bench train`, random tokens, Muon as in
# the configs) sets max_steps so CPT steps ~E2E_CPT_SECONDS and SFT ~E2E_SFT_SECONDS at 80% of the probed rate
# (the trainer also loads batches, logs and checkpoints). Without a probe (CPU, E2E_PROBE=0, a failed probe, or
# explicit E2E_CPT_STEPS / E2E_SFT_STEPS) the configs' counts stay.
if [ $ok = 1 ] && [ "$DEV" = cuda ] && [ "${E2E_PROBE:-1}" = 1 ] && [ -z "${E2E_CPT_STEPS:-}${E2E_SFT_STEPS:-}" ]; then
  SEQ=$(sed -nE 's/^ *seq_len: *([0-9]+).*/\1/p' "$W/cpt.yaml"); BATCH=$(sed -nE 's/^ *batch_size: *([0-9]+).*/\1/p' "$W/cpt.yaml")
  stage "throughput probe: trex bench train --config $W/model.json --seq $SEQ --batch $BATCH --optimizer muon"
  run_capped probe "$CAP_PROBE" "$TREX" bench train --config "$W/model.json" --seq "$SEQ" --batch "$BATCH" --steps 4 \
    --warmup 2 --optimizer muon --device cuda
  STEPS=$(python3 - "$R/probe.log" "$((SEQ * BATCH))" "${E2E_CPT_SECONDS:-140}" "${E2E_SFT_SECONDS:-60}" <<'PYEOF'
import json, sys
rate = None
for line in open(sys.argv[1]):
    if line.startswith("{") and "tokens_per_s" in line:
        rate = json.loads(line)["tokens_per_s"]
if rate:
    tok, cpt_s, sft_s = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    clamp = lambda n: max(50, min(20000, int(n)))
    print(rate, clamp(0.8 * rate * cpt_s / tok), clamp(0.8 * rate * sft_s / tok))
PYEOF
  )
  if [ -n "$STEPS" ]; then
    set -- $STEPS
    echo "-- probe: $1 tokens/s -> CPT max_steps $2, SFT max_steps $3"
    # Checkpoints at thirds of CPT and halfway through SFT: a stage cut by its cap still leaves one to go on from.
    sed -i -E "s/^( *max_steps:).*/\1 $2/; s/^( *every:).*/\1 $(( ($2 + 2) / 3 ))/" "$W/cpt.yaml"
    sed -i -E "s/^( *max_steps:).*/\1 $3/; s/^( *every:).*/\1 $(( ($3 + 1) / 2 ))/" "$W/sft.yaml"
  else
    echo "-- probe gave no rate: the configs' step counts stay"
  fi
fi
grep -hE "^ *(max_steps|every):" "$W/cpt.yaml" "$W/sft.yaml" 2>/dev/null | sed 's/#.*//' | tr -s ' ' | paste -sd' ' |
  sed 's/^/-- steps (cpt, sft):/'

if [ $ok = 1 ]; then
  stage "CPT: trex train $W/cpt.yaml --device $DEV"
  run_capped cpt "$CAP_CPT" "$TREX" train "$W/cpt.yaml" --out "$W/cpt" --no-progress
  STATUS_CPT=$([ $RC -eq 0 ] && echo ok || echo "exit_$RC")
  ls "$W/cpt/checkpoints" 2>/dev/null | tail -2
  if ls "$W/cpt/checkpoints" 2>/dev/null | grep -q .; then
    stage "SFT: trex train $W/sft.yaml (init_from_run $W/cpt)"
    run_capped sft "$CAP_SFT" "$TREX" train "$W/sft.yaml" --out "$W/sft" --no-progress
    STATUS_SFT=$([ $RC -eq 0 ] && echo ok || echo "exit_$RC")
  else
    echo "FAIL: the CPT run left no checkpoint; SFT skipped"
  fi
  # Export the SFT run when it has a checkpoint, else the CPT run (so serving is still exercised).
  SRC=""
  ls "$W/sft/checkpoints" 2>/dev/null | grep -q . && SRC=$W/sft
  [ -z "$SRC" ] && ls "$W/cpt/checkpoints" 2>/dev/null | grep -q . && SRC=$W/cpt
  if [ -n "$SRC" ]; then
    stage "export: trex export-hf $SRC"
    run_capped export "$CAP_EXPORT" "$TREX" export-hf "$SRC" --out "$W/hf"
    STATUS_EXPORT=$([ $RC -eq 0 ] && echo "ok ($SRC)" || echo "exit_$RC")
  fi
  if [ -s "$W/hf/config.json" ]; then
    stage "serve: trex serve --device $DEV --model $W/hf --tokenizer $D/tokenizer.json --port $PORT"
    "$TREX" serve --device "$DEV" --model "$W/hf" --tokenizer "$D/tokenizer.json" --port "$PORT" --name e2e \
      --max-batch "$CONC" --max-context "$MAXCTX" >"$R/serve.log" 2>&1 &
    SERVE_PID=$!
    up=0
    for _ in $(seq 1 $((CAP_UP * 2))); do
      # python, not curl: the device image is not known to have curl
      python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && { up=1; break; }
      kill -0 "$SERVE_PID" 2>/dev/null || break
      sleep 0.5
    done
    if [ $up = 1 ]; then
      STATUS_SERVE=ok
      echo "-- server up after $(el) s"
      stage "answers: $(cat "$W"/eval/*.jsonl | wc -l) items, temperature 0, max_tokens $MAXTOK, cap $CAP_EVAL s"
      # A stdlib client (the device has no solvers, so `trex eval run` could not score here): the prompt is
      # trex eval's "trex" format (src/orkit/eval/prompts.cpp, PromptFormat::Trex, the report's NL4OPT/OptiBench
      # prompt); items of the benchmarks are interleaved so a cut-off run still covers both.
      timeout -k 5 $((CAP_EVAL + 10)) python3 - "http://127.0.0.1:$PORT/v1" "$MAXTOK" "$CAP_EVAL" \
        "${E2E_EVAL_ITEMS:-0}" "$R/responses.jsonl" "$R/eval_client.json" "$CONC" "$W"/eval/*.jsonl <<'PYEOF' 2>&1 | tee "$R/eval_client.log"
import json, sys, threading, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
base, max_tokens, cap, limit, out_path, stats_path = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
concurrency = int(sys.argv[7])
SYSTEM = ("You are a helpful assistant with expertise in operations research and the Gurobi solver. When given an "
          "operations research question, analyse it, build a detailed mathematical model and give Gurobi code "
          "(compatible with gurobipy 12.x) that solves it. Answer in Markdown in three steps, each enclosed in its "
          "tags:\n1. <think> Analyse the problem: identify the decision variables, the objective and the constraints. "
          "</think>\n2. <model> The complete mathematical model: Sets, Parameters, Decision Variables (with their "
          "types), Objective Function, Constraints. </model>\n3. <python> The corresponding gurobipy code in a "
          "```python block; the model must be in a variable named `model`. </python>")
lists = [[json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[8:]]
items = [lst[i] for i in range(max(map(len, lists))) for lst in lists if i < len(lst)]
if limit > 0:
    items = items[:limit]
t0 = time.time()
deadline = t0 + cap
lock = threading.Lock()
stats = {"items": len(items), "answered": 0, "failed": 0, "not_sent": 0, "completion_tokens": 0,
         "prompt_tokens": 0, "finish": {}, "latency_s": []}
out = open(out_path, "w")
def ask(item):
    left = deadline - time.time()
    if left < 1:
        with lock:
            stats["not_sent"] += 1
        return
    body = {"model": "e2e", "temperature": 0.0, "top_p": 1.0, "seed": 42, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "Answer the following mathematical modeling question:\n" +
                          item["question"] + "\nPlease think step by step."}]}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=left) as r:
            resp = json.load(r)
        text = resp["choices"][0]["message"].get("content") or ""
        usage = resp.get("usage", {})
        fin = resp["choices"][0].get("finish_reason")
    except Exception as e:  # timeouts at the cap land here too: the item is simply not answered
        with lock:
            stats["failed"] += 1
            stats.setdefault("errors", []).append(f"{item['id']}: {str(e)[:160]}")
        return
    with lock:
        out.write(json.dumps({"id": item["id"], "benchmark": item.get("benchmark"), "response": text,
                              "completion_tokens": usage.get("completion_tokens"),
                              "prompt_tokens": usage.get("prompt_tokens"), "finish_reason": fin,
                              "seconds": round(time.time() - t, 3)}, ensure_ascii=False) + "\n")
        out.flush()
        stats["answered"] += 1
        stats["completion_tokens"] += usage.get("completion_tokens") or 0
        stats["prompt_tokens"] += usage.get("prompt_tokens") or 0
        stats["finish"][fin] = stats["finish"].get(fin, 0) + 1
        stats["latency_s"].append(time.time() - t)
with ThreadPoolExecutor(concurrency) as pool:
    list(pool.map(ask, items))
wall = time.time() - t0
lat = sorted(stats.pop("latency_s"))
stats.update(wall_s=round(wall, 2), completion_tokens_per_s=round(stats["completion_tokens"] / wall, 1) if wall else 0,
             latency_p50_s=round(lat[len(lat) // 2], 2) if lat else None, latency_max_s=round(lat[-1], 2) if lat else None,
             max_tokens=max_tokens, concurrency=concurrency)
stats["errors"] = stats.get("errors", [])[:5]
json.dump(stats, open(stats_path, "w"), indent=1)
print(f"answers {stats['answered']}/{stats['items']} (failed {stats['failed']}, not sent {stats['not_sent']}) in "
      f"{wall:.1f} s: {stats['completion_tokens']} completion tokens, {stats['completion_tokens_per_s']} tok/s "
      f"(prompt tokens {stats['prompt_tokens']}), finish {stats['finish']}, latency p50 {stats['latency_p50_s']} s")
for e in stats["errors"]:
    print("  error:", e)
PYEOF
      STATUS_EVAL=$([ -s "$R/eval_client.json" ] && echo ok || echo failed)
      # Sanity check of train -> export -> serve: greedy answers to three SFT training prompts should start like
      # the trained answers (the SFT loss ends well below 1); a model that learned something else (e.g. labels
      # shifted by two tokens) or a serving mismatch shows up as a short common prefix.
      timeout -k 5 40 python3 - "http://127.0.0.1:$PORT/v1" "$W/data/sft.jsonl" <<'PYEOF' 2>&1 | tee "$R/echo_check.log"
import json, sys, urllib.request
n, total = 0, 0
for line in list(open(sys.argv[2]))[:3]:
    msgs = json.loads(line)["messages"]
    body = {"model": "e2e", "temperature": 0.0, "max_tokens": 64, "messages": msgs[:-1]}
    try:
        req = urllib.request.Request(sys.argv[1] + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        got = json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["message"]["content"] or ""
    except Exception as e:
        print(f"echo check: request failed: {e}")
        continue
    want = msgs[-1]["content"]
    k = 0
    while k < min(len(got), len(want)) and got[k] == want[k]:
        k += 1
    n, total = n + 1, total + k
    print(f"echo check: common prefix {k} chars; got {got[:90]!r}; trained {want[:90]!r}")
if n:
    print(f"ECHO {'PASS' if total / n >= 20 else 'FAIL'}: mean common prefix {total / n:.0f} chars over {n} training prompts")
PYEOF
    else
      STATUS_SERVE=failed
      echo "FAIL: the server did not answer /health within $CAP_UP s"; tail -20 "$R/serve.log"
    fi
    cleanup
    grep -E "tok/s|tokens/s|step" "$R/serve.log" | tail -3
  fi
fi

# Copy what the lead fetches, then the summary (always).
for s in cpt sft; do
  [ -f "$W/$s/metrics.jsonl" ] && cp "$W/$s/metrics.jsonl" "$R/${s}_metrics.jsonl"
  [ -f "$W/$s/loss.html" ] && cp "$W/$s/loss.html" "$R/${s}_loss.html"
  [ -f "$W/$s/config.json" ] && cp "$W/$s/config.json" "$R/${s}_config.json"
done
[ -f "$W/hf/config.json" ] && cp "$W/hf/config.json" "$R/hf_config.json"
python3 - "$R" "$STATUS_CPT" "$STATUS_SFT" "$STATUS_EXPORT" "$STATUS_SERVE" "$STATUS_EVAL" "$(el)" <<'PYEOF' | tee "$R/summary.txt"
import json, os, sys
r = sys.argv[1]
print(f"== e2e SUMMARY (wall {sys.argv[7]} s): cpt {sys.argv[2]}, sft {sys.argv[3]}, export {sys.argv[4]}, "
      f"serve {sys.argv[5]}, answers {sys.argv[6]}")
p = os.path.join(r, "probe.log")
if os.path.exists(p):
    for line in open(p):
        if line.startswith("{") and "tokens_per_s" in line:
            j = json.loads(line)
            print(f"probe (trex bench train, random tokens, {j.get('optimizer')}): {j['tokens_per_s']:,.0f} tokens/s, "
                  f"MFU {100 * j.get('mfu', 0):.2f}%, step {j.get('step_s')} s, peak {j.get('peak_gib')} GiB, "
                  f"{j.get('params', 0):,} params")
for stage in ("cpt", "sft"):
    p = os.path.join(r, f"{stage}_metrics.jsonl")
    if not os.path.exists(p):
        print(f"{stage}: no metrics")
        continue
    rows = [json.loads(l) for l in open(p) if l.strip()]
    if not rows:
        print(f"{stage}: empty metrics")
        continue
    steady = rows[1:] if len(rows) > 1 else rows  # the first step carries the warm-up (allocation, autotuning)
    tps = sorted(x["tokens_per_s"] for x in steady)
    mfu = sorted(x["mfu"] for x in steady)
    losses = [x["loss"] for x in rows if x.get("loss") is not None]
    k = min(10, len(losses))
    print(f"{stage}: {len(rows)} steps, {rows[-1]['tokens']} tokens; tokens/s median {tps[len(tps)//2]:,.0f} "
          f"(min {tps[0]:,.0f}, max {tps[-1]:,.0f}); MFU median {100*mfu[len(mfu)//2]:.2f}%; loss first {losses[0]:.4f} "
          f"-> last {losses[-1]:.4f} (mean of first {k}: {sum(losses[:k])/k:.4f}, last {k}: {sum(losses[-k:])/k:.4f})"
          + (f"; skipped {sum(1 for x in rows if x.get('skipped'))}" if any(x.get("skipped") for x in rows) else ""))
p = os.path.join(r, "eval_client.json")
if os.path.exists(p):
    s = json.load(open(p))
    print(f"serve: {s['answered']}/{s['items']} answers collected in {s['wall_s']} s, {s['completion_tokens']} completion "
          f"tokens = {s['completion_tokens_per_s']} tok/s at concurrency {s['concurrency']} (max_tokens {s['max_tokens']}), "
          f"latency p50 {s['latency_p50_s']} s; finish reasons {s['finish']}")
else:
    print("serve: no answers collected")
p = os.path.join(r, "echo_check.log")
if os.path.exists(p):
    lines = [l.strip() for l in open(p) if l.startswith("ECHO")]
    print(lines[-1] if lines else "ECHO: no result")
ok = sys.argv[2] == "ok" and sys.argv[3] == "ok" and sys.argv[4].startswith("ok") and sys.argv[5] == "ok" and sys.argv[6] == "ok"
print("PASS: e2e pipeline ran end to end" if ok else "FAIL: e2e pipeline incomplete (see the stages above)")
print(f"files in {r}: " + " ".join(sorted(os.listdir(r))))
PYEOF
grep -q "^PASS" "$R/summary.txt"; RESULT=$?
# One file back from the device (its runner returns at most 8 files per call): $OUT/e2e.tgz holds $OUT/e2e/.
if [ "${E2E_TAR:-1}" = 1 ]; then
  tar -czf "$OUT/e2e.tgz.tmp" -C "$OUT" e2e && mv "$OUT/e2e.tgz.tmp" "$OUT/e2e.tgz" && rm -rf "$R" &&
    echo "-- $OUT/e2e.tgz ($(du -k "$OUT/e2e.tgz" | cut -f1) KiB): tar -xzf it and run scripts/e2e_score.sh on e2e/"
fi
exit $RESULT
