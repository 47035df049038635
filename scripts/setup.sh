#!/usr/bin/env bash
# Installs everything T-Rex needs on Debian 12 (bookworm), as root. Idempotent.
# The CUDA toolkit (with NCCL) is optional: when /usr/local/cuda exists the build adds the CUDA backend.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libopenblas-dev libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  libcpp-httplib-dev libssl-dev zlib1g-dev libpng-dev
  coinor-libcbc-dev coinor-libclp-dev coinor-libcgl-dev coinor-libosi-dev coinor-libcoinutils-dev coinor-cbc
  libglpk-dev glpk-utils coinor-libipopt-dev
  python3 python3-numpy bubblewrap
  nodejs
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Debian's npm is a package of its own; a nodejs from elsewhere (e.g. NodeSource) bundles npm and conflicts with it.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The official OpenAI Node client, for the serving test through a real client
# (tests/infer/test_server_openai_node.cpp; it skips when this is missing). Into git-ignored local/node.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -f "$repo/local/node/node_modules/openai/package.json" ]]; then
  npm install --prefix "$repo/local/node" --no-audit --no-fund --loglevel=error openai@4.95.0 ||
    echo "setup.sh: npm install openai failed; the OpenAI Node client test will be skipped" >&2
fi
