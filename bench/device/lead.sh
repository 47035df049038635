#!/usr/bin/env bash
# Lead's checks (session 3): the GEMM plan cache test, then `trex bench train --sections` on flash-l4 @8192 and
# small-s6 @4096 (the step breakdown every engineer reads). Assumes build-dev (trex, test_kernels_gpu). ~70 s.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=0
T0=$(date +%s)
echo "== device libs: $(ldconfig -p | grep -oE 'lib(ssl|z|brotlidec)\.so\.[0-9]+' | sort -u | tr '\n' ' ')"
echo "== trex links: $(ldd build-dev/trex 2>/dev/null | grep -E 'httplib|brotli|not found' | tr -s ' ' | tr '\n' ';')"
timeout 60 build-dev/tests/test_kernels_gpu --gtest_filter='GpuOps.Gemm*' 2>&1 | grep -E "OK|FAILED|Failure|Expected|Which|PASSED" | head -20
if [ "${LEAD_BENCH:-0}" = 1 ]; then
for spec in "flash-l4.json 8192" "small-s6.json 4096"; do
  set -- $spec
  timeout 90 build-dev/trex bench train --config .devdeps/$1 --seq $2 --batch 1 --steps 3 --warmup 2 --sections \
    --device cuda 2>&1 | grep -E '^\{|rror' | tail -2
  echo "[$(( $(date +%s) - T0 )) s]"
done
fi
