#!/usr/bin/env bash
# device-check.sh - what a session lent a device machine runs, in one call
# (docs/gpu.md): the CUDA path's check (gpu-check.sh), where a pass's time
# goes (gpu-profile.sh) and the CPU engine's cost curves at all cores
# (cpu-curves.sh). Into OUT_DIR (default $OUT; at most 8 files come back from
# a device call): gpu-check.json, timing.log, kernels.log, cpu-curves.jsonl
# and logs.tgz (every step's log).
#
# Here first:   GPU_DEPS_MARCH=icelake-server bash scripts/gpu-deps.sh --bin
# The call:     command "bash scripts/device-check.sh", carry [".gpudeps"],
#               timeout_s 420 (about 2.5 minutes with the carried binaries;
#               the device builds for 100 s more when they do not run there)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-/tmp/device-check}}"
W="${DEVICE_CHECK_WORK:-/tmp/device-check-work}"
mkdir -p "$OUT_DIR" "$W"
if [ -f .gpudeps/bin.tgz ] && [ ! -x build/specdec ]; then
    tar xzf .gpudeps/bin.tgz
    build/specdec --help >/dev/null 2>&1 || { echo "device-check: the carried binaries do not run here; building" >&2; rm -rf build; }
fi
timeout 240 bash scripts/gpu-check.sh "$W/gc"
GPU_MODELS="$W/gc/models" timeout 120 bash scripts/gpu-profile.sh "$W/gp"
GPU_MODELS="$W/gc/models" timeout 150 bash scripts/cpu-curves.sh "$W/cc" >/dev/null
for f in "$W/gc/gpu-check.json" "$W/gp/timing.log" "$W/gp/kernels.log" "$W/cc/cpu-curves.jsonl"; do
    [ -f "$f" ] && cp "$f" "$OUT_DIR/"
done
(cd "$W" && tar czf "$OUT_DIR/logs.tgz" gc/*.log gp/*.log 2>/dev/null)
echo "device-check: results in $OUT_DIR" >&2
