#!/usr/bin/env bash
# The README's run command: installs dependencies, builds, and runs the embedded default job (scripts/demo.sh:
# OR corpus -> tokenizer -> CPT -> SFT of a tiny DeepSeek-V4 on the CPU -> HF export -> one greedy answer to a
# held-out question), all into demo/. Re-running skips or resumes the finished stages.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then bash scripts/setup.sh; fi
bash scripts/build.sh
bash scripts/demo.sh ./build/trex
