#!/usr/bin/env bash
# gpu-profile.sh - where the CUDA path's pass spends its time, on a machine
# with a GPU (docs/gpu.md), in one device call of about 2-3 minutes. Needs a
# CUDA build in build/ (gpu-check.sh makes one; or unpack the binaries of
# `scripts/gpu-deps.sh --bin`). Writes the synthetic 1.5B shape of gpu-check.sh
# if absent, then:
#   timing.log / timing_buckets.log  SPECDEC_CUDA_TIMING=1: host staging,
#       uploads, layer stack, logits, downloads, by rows per pass (with batch
#       invariance, and with power-of-two buckets)
#   kernels.log  Nsight Compute's time per kernel over two one-row decode
#       passes (graphs off, so that each launch is its own), when ncu is there
#
#   bash scripts/gpu-profile.sh [OUT_DIR]      (default: $OUT, else /tmp/gpu-profile)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-/tmp/gpu-profile}}"
M="${GPU_MODELS:-$OUT_DIR/models}"
mkdir -p "$OUT_DIR" "$M"
[ -x build/specdec ] || { echo "gpu-profile: no build/specdec (build with make CUDA=1 first)" >&2; exit 1; }
[ -f "$M/q15.gguf" ] || build/tests/tool_synth_shape "$M/q15.gguf" qwen2 1536 28 12 2 8960 151936 Q8_0 || exit 1
B="build/specdec bench-forward --gpu -m $M/q15.gguf"
echo "== timing" >&2
SPECDEC_CUDA_TIMING=1 timeout 90 $B --batch 1,2,4,16,64 --reps 11 --decode 32 --json >"$OUT_DIR/timing.json" 2>"$OUT_DIR/timing.log"
echo "== timing, buckets" >&2
SPECDEC_CUDA_TIMING=1 SPECDEC_CUDA_INVARIANT=0 timeout 90 $B --batch 1,2,4,16,64 --reps 11 --decode 32 --json \
    >"$OUT_DIR/timing_buckets.json" 2>"$OUT_DIR/timing_buckets.log"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
    echo "== kernels ($NCU)" >&2
    # --ctx 16: the context fill is one 16-row pass (about 310 launches), then
    # one-row passes; skip the fill, time the next two passes
    SPECDEC_CUDA_GRAPHS=0 timeout 150 "$NCU" --clock-control none --metrics gpu__time_duration.sum \
        --kernel-name regex:'^(?!k_dequant)' --launch-skip 320 --launch-count 620 --print-summary per-kernel \
        $B --ctx 16 --batch 1 --reps 1 --decode 1 >"$OUT_DIR/kernels.log" 2>&1
    echo "   rc=$?" >&2
else
    echo "SKIP kernels: ncu not found on this machine" | tee "$OUT_DIR/kernels.log" >&2
fi
grep -h -A8 'CUDA pass timing' "$OUT_DIR/timing.log" "$OUT_DIR/timing_buckets.log"
