#!/usr/bin/env bash
# Helper "attnops" device checks (issue 9): where the GPU attention sub-layer's time goes outside the core
# kernels. The op tests this helper's kernels feed (GpuOps.*, GpuIndexer*), the GPU-vs-CPU model tests
# (Dsv4Gpu.*, ParityGpu.*), then `trex bench train --sections` on flash-l4 @8192 and small-s6 @4096 with the
# attention sub-sections ("fwd.attn.csa/q.gemm", ...) printed as a table. Assumes build-dev is built (trex,
# test_kernels_gpu, test_train_gpu). GPU 0; <= 60 s. Result lines start PASS / FAIL / SKIP / BENCH.
# Usage (repo root, device): bash bench/device/attnops.sh
set -uo pipefail
export CUDA_VISIBLE_DEVICES=0
B=build-dev
T0=$(date +%s)
LIMIT=${ATTNOPS_LIMIT:-58}
. bench/device/lib.sh
RUN_TEST_SHOW='^\[  FAILED|^\[       OK|^\[  PASSED|Failure|Expected|Which is|error:|SKIPPED \['
RUN_TEST_LINES=40
# The attention gradients' errors vs the CPU model (fused vs unfused comparable line by line).
run_test_extra() {
  echo "$1" | grep -E "^loss cpu|grad layers\.[0-9]+\.attn\.(wq_b|wkv|kv_norm|wo_a|compressor\.(wkv|ape))" | head -14
}
run_test "GpuOps + GpuIndexer + GpuRopeOps + GpuCompressor kernels" 15 $B/tests/test_kernels_gpu \
  --gtest_filter='GpuOps.*:GpuIndexer*:GpuRopeOps.*:GpuCompressor.*'
run_test "GPU vs CPU model, fused attention ops (Dsv4Gpu.*, ParityGpu.*)" 15 $B/tests/test_train_gpu \
  --gtest_filter='Dsv4Gpu.*:ParityGpu.*'
TREX_ATTN_UNFUSED=1 run_test "GPU vs CPU model, TREX_ATTN_UNFUSED=1 (the old sequence; baseline)" 15 \
  $B/tests/test_train_gpu --gtest_filter='Dsv4Gpu.*:ParityGpu.*'
echo "== after $(( $(date +%s) - T0 )) s"
table() {  # JSON line on stdin -> the attention sections as a table (ms per step)
  python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"): continue
    j = json.loads(line)
    s = j.get("section_ms_per_step", {})
    print("BENCH %s seq %s: step %.1f ms, mfu %.4f, loss_first %.5f" % (j["config"], j["seq"], 1e3 * j["step_s"], j["mfu"], j["loss_first"]))
    tot = {}
    for k, v in sorted(s.items()):
        if "/" in k: continue
        print("  %-34s %8.2f" % (k, v))
    for d in ("fwd", "bwd"):
        subs = {}
        for k, v in s.items():
            if k.startswith(d + ".attn.") and "/" in k:
                kind, part = k.split("/", 1)
                subs[part] = subs.get(part, 0.0) + v
        if not subs: continue
        whole = sum(v for k, v in s.items() if k.startswith(d + ".attn.") and "/" not in k)
        print("  %s.attn parts (all kinds; whole %.2f, parts sum %.2f):" % (d, whole, sum(subs.values())))
        for part, v in sorted(subs.items(), key=lambda kv: -kv[1]):
            per = "  ".join("%s %.2f" % (k.split(".")[2].split("/")[0], s[k]) for k in sorted(s) if k.startswith(d + ".attn.") and k.endswith("/" + part))
            print("    %-22s %8.2f   (%s)" % (part, v, per))
' || cat
}
if [ -x $B/trex ]; then
  # Fused (default) and TREX_ATTN_UNFUSED=1 (the separate launches: the "before" table) per config.
  for spec in "flash-l4.json 8192 0" "flash-l4.json 8192 1" "small-s6.json 4096 0" "small-s6.json 4096 1"; do
    set -- $spec
    left=$(( LIMIT - ($(date +%s) - T0) ))
    [ $left -lt 10 ] && { echo "SKIP bench $1 unfused=$3: only ${left} s left"; continue; }
    echo "== TREX_ATTN_UNFUSED=$3 trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 1 --sections (limit ${left} s)"
    out=$(TREX_ATTN_UNFUSED=$3 timeout $left ./$B/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 1 \
      --sections --device cuda 2>&1)
    echo "$out" | tail -2
    echo "$out" | table
  done
else
  echo "FAIL bench: $B/trex not built"
fi
echo "== total $(( $(date +%s) - T0 )) s"
