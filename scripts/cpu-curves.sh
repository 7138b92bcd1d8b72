#!/usr/bin/env bash
# cpu-curves.sh - the CPU engine's cost curve (one forward of 1-16 tokens)
# on synthetic models shaped like SmolLM2-135M and Qwen2.5-1.5B (Q8_0, as the
# files users fetch), at several thread counts: how speculation pays on a
# machine with more cores than the development host, where no real model can
# travel (docs/performance.md). JSON lines, one per shape and thread count.
#
#   bash scripts/cpu-curves.sh [OUT_DIR] [THREADS...]   (default: $OUT or /tmp/cpu-curves; all cores, half, 2)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-/tmp/cpu-curves}}"
shift || true
M="${GPU_MODELS:-$OUT_DIR/models}"
mkdir -p "$OUT_DIR" "$M"
N=$(nproc)
THREADS=("$@")
[ ${#THREADS[@]} -gt 0 ] || read -r -a THREADS <<<"$(printf "%s\n" "$N" $((N / 2)) 2 | awk '$1 > 0 && !seen[$1]++' | tr "\n" " ")"
[ -x build/specdec ] || { echo "cpu-curves: no build/specdec (run make first)" >&2; exit 1; }
[ -f "$M/smol.gguf" ] || build/tests/tool_synth_shape "$M/smol.gguf" llama 576 30 9 3 1536 49152 Q8_0 || exit 1
[ -f "$M/q15.gguf" ] || build/tests/tool_synth_shape "$M/q15.gguf" qwen2 1536 28 12 2 8960 151936 Q8_0 || exit 1
for shape in smol q15; do
    for t in "${THREADS[@]}"; do
        echo "== $shape, $t threads" >&2
        timeout 120 build/specdec bench-forward -m "$M/$shape.gguf" -t "$t" --batch 1,2,4,8,16 --reps 9 --decode 32 --json |
            python3 -c "import json,sys; d=json.load(sys.stdin); d['shape']='$shape'; print(json.dumps(d))" |
            tee -a "$OUT_DIR/cpu-curves.jsonl"
    done
done
