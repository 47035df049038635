#!/usr/bin/env bash
# The lead's batch runs bench/device/<name>.sh; the sparse attention kernels' device check is attn.sh.
exec bash bench/device/attn.sh "$@"
