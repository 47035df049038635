#!/usr/bin/env bash
# Configures and builds T-Rex into build/ (CUDA backend included when nvcc is found).
# Extra arguments go to the CMake configure step, e.g. scripts/build.sh -DTREX_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
cmake --preset release "$@" >/dev/null
cmake --build --preset release -j"$(nproc)"
