#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every CPU test (ctest -LE gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then bash scripts/setup.sh; fi
bash scripts/build.sh
cd build
ctest -LE gpu --output-on-failure -j"$(nproc)" --timeout 1500
