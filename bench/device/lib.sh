# Shared helpers of the device scripts (sourced, never run): bash bench/device/<name>.sh does `. bench/device/lib.sh`.

# run_test NAME LIMIT BINARY [gtest args...]: runs one test binary under a time limit and prints the lines of its
# output that match $RUN_TEST_SHOW (an extended regex; at most $RUN_TEST_LINES of them), then whatever the
# script's own run_test_extra prints from the log (when it defines one), then one PASS / FAIL / SKIP line.
run_test() {
  local name=$1 lim=$2 bin=$3
  shift 3
  if [ ! -x "$bin" ]; then echo "FAIL $name: $bin not built"; return; fi
  local log rc
  log=$(timeout "$lim" "$bin" "$@" 2>&1)
  rc=$?
  echo "$log" | grep -E "${RUN_TEST_SHOW:-Failure|Expected|Which is|error|FAILED|PASSED|SKIPPED}" | head -"${RUN_TEST_LINES:-60}"
  if declare -F run_test_extra >/dev/null; then run_test_extra "$log"; fi
  if [ $rc -ne 0 ]; then echo "FAIL $name (rc $rc)"
  elif echo "$log" | grep -q "SKIPPED \["; then echo "SKIP $name: $(echo "$log" | grep -m1 -iE 'needs|skipped')"
  else echo "PASS $name"; fi
}
