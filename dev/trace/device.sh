#!/usr/bin/env bash
# Traces one command's device timeline with CUPTI (kernel_trace.cpp, injected through CUDA_INJECTION64_PATH; the
# program is not rebuilt) and prints analyze.py's summary: device idle time, its gaps and the host calls behind
# them, device time by kernel. The record structs' versions are read off the installed cupti_activity.h.
# Usage (repo root, device): bash dev/trace/device.sh NAME STEPS -- command args...
#   writes $OUT/NAME.txt (the summary) and $OUT/NAME.tsv.gz (the records); STEPS: timed steps in the window.
set -uo pipefail
name=$1 steps=$2; shift 2; [ "${1:-}" = "--" ] && shift
OUT=${OUT:-/tmp/trace_out}; mkdir -p "$OUT"
lib=/tmp/kernel_trace/libkernel_trace.so
if [ ! -f $lib ]; then
  mkdir -p /tmp/kernel_trace
  hdr=$(find /usr/local/cuda/ /usr/local/cuda-*/ /usr/lib /opt -name cupti_activity.h 2>/dev/null | head -1)
  so=$(find /usr/local/cuda/ /usr/local/cuda-*/ /usr/lib /opt -name "libcupti.so*" 2>/dev/null | head -1)
  [ -n "$hdr" ] && [ -n "$so" ] || { echo "FAIL no CUPTI (header '$hdr', library '$so')"; exit 1; }
  inc=$(dirname "$hdr") libdir=$(dirname "$so")
  last() { grep -ohE "\} $1[0-9]*;" "$inc"/cupti_activity.h | tr -d '}; ' | sort -V | tail -1; }
  K=$(last CUpti_ActivityKernel) M=$(last CUpti_ActivityMemcpy) S=$(last CUpti_ActivityMemset)
  echo "CUPTI $inc ($K $M $S), $so"
  g++ -std=c++17 -O2 -shared -fPIC -I"$inc" -I/usr/local/cuda/include -DTRACE_KERNEL_RECORD=$K \
    -DTRACE_MEMCPY_RECORD=$M -DTRACE_MEMSET_RECORD=$S dev/trace/kernel_trace.cpp -L"$libdir" -l:$(basename "$so") \
    -Wl,-rpath,"$libdir" -o $lib 2>&1 | tail -20
  [ -f $lib ] || { echo "FAIL build kernel_trace"; exit 1; }
fi
CUDA_INJECTION64_PATH=$lib TREX_TRACE_OUT=/tmp/kernel_trace/$name.tsv "$@" > "$OUT/$name.run.log" 2>&1
echo "$name: rc $?"; tail -2 "$OUT/$name.run.log" | cut -c1-400
python3 dev/trace/analyze.py /tmp/kernel_trace/$name.tsv --steps "$steps" > "$OUT/$name.txt" 2>&1
head -60 "$OUT/$name.txt"
gzip -c /tmp/kernel_trace/$name.tsv > "$OUT/$name.tsv.gz"
