#!/usr/bin/env bash
# One device call for several engineers' GPU checks: configure + build build-dev once (trex, every GPU test
# binary and any extra targets), then run each named script bench/device/<name>.sh with a wall-time cap,
# its output to $OUT/<name>.log. Usage (repo root, on the device):
#   bash bench/device/batch.sh CAP_SECONDS name1[:cap] name2[:cap] ... [-- extra_target ...]
set -uo pipefail
OUT=${OUT:-/tmp/batch_out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CAP=$1; shift
names=(); extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  names+=("$1"); shift
done
T0=$(date +%s)
# The device has no cpp-httplib package: a git-ignored drop-in (.devdeps/httplib: Debian 12's libcpp-httplib .so,
# its header and a .pc, see its comment) lets `trex serve` build and run there for the HTTP load test.
if [ -f .devdeps/httplib/pkgconfig/cpp-httplib.pc ] && [ "${TREX_DEV_HTTPLIB:-1}" != 0 ]; then
  export PKG_CONFIG_PATH=$PWD/.devdeps/httplib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$PWD/.devdeps/httplib/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "== cpp-httplib drop-in: $(pkg-config --modversion cpp-httplib 2>&1)"
fi
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B build-dev "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DTREX_SOLVERS=OFF >"$OUT/build.log" 2>&1 ||
  { echo "== configure FAILED"; tail -30 "$OUT/build.log"; }
gpu_tests=$(ninja -C build-dev -t targets all 2>/dev/null | grep -oE "^tests/test_[a-z]+_gpu:" | sed "s#^tests/##; s#:##" | sort -u | tr '\n' ' ')
echo "== targets: trex $gpu_tests ${extra[*]}"
# Build what compiles; a failing target does not stop the others (-k 0 / -k).
timeout 360 cmake --build build-dev -j16 --target trex $gpu_tests "${extra[@]}" -- -k 0 >>"$OUT/build.log" 2>&1 ||
  { echo "== build had FAILURES:"; grep -E "error|FAILED" -A3 "$OUT/build.log" | head -80; }
echo "== build done after $(( $(date +%s) - T0 )) s"
for spec in "${names[@]}"; do
  n=${spec%%:*}; cap=$CAP
  [ "$spec" != "$n" ] && cap=${spec#*:}
  echo "== $n (cap ${cap} s) at $(( $(date +%s) - T0 )) s"
  timeout -k 5 "$cap" bash "bench/device/$n.sh" >"$OUT/$n.log" 2>&1
  echo "== $n exit $? after $(( $(date +%s) - T0 )) s"; tail -4 "$OUT/$n.log"
done
echo "== total $(( $(date +%s) - T0 )) s"
