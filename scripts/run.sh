#!/usr/bin/env bash
# The README's run command: installs dependencies, builds, and runs the embedded default job.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then bash scripts/setup.sh; fi
bash scripts/build.sh
./build/trex demo "$@"
