#!/usr/bin/env bash
# gpu-check.sh - the CUDA path's check on a machine with a GPU, in one run of
# at most ~8 minutes (docs/gpu.md). The model files cannot travel to such a
# machine, so it writes synthetic ones on the spot: a tiny llama and one
# shaped like Qwen2.5-1.5B (28 layers, 1536 wide, 12/2 heads, 8960 FFN, 151936
# tokens; Q8_0 file, bf16 on the device), plus a 2-layer draft model and a
# random EAGLE-3 head for it.
#
#   bash scripts/gpu-check.sh [OUT_DIR]      (default: $OUT, else /tmp/gpu-check)
#
# Steps (each logged in OUT_DIR/<step>.log; a failed step does not stop the
# others): build (make CUDA=1, or reuse a CUDA build already in build/),
# nvidia-smi, models, tests/gpu/test_gpu (every kernel against host code, the
# forward's logits against the CPU engine, greedy speculation = plain on the
# GPU), greedy equality through the CLI on the 1.5B shape (ar against
# chain / tree drafts of the draft model, prompt lookup and the EAGLE-3 head),
# compute-sanitizer on the tiny model (when the toolkit has it), and the
# timings: bench-forward --gpu for 1-64 rows with and without CUDA graphs and
# batch invariance, and the CPU engine at all cores for comparison. Writes
# OUT_DIR/gpu-check.json (the figures and every step's status) and prints it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-/tmp/gpu-check}}"
mkdir -p "$OUT_DIR"
M="$OUT_DIR/models"
mkdir -p "$M"
J=$(nproc)
export M OUT_DIR J
T0=$(date +%s)
declare -A STATUS
step() { # step NAME TIMEOUT_S CMD...: runs CMD, logs, records ok/fail
    local name=$1 to=$2
    shift 2
    local t=$(date +%s)
    echo "== $name ($(($t - T0)) s into the check)" >&2
    # shell functions run in a child bash (timeout runs programs only; they are exported below)
    if declare -F "$1" >/dev/null; then set -- bash -c "$1"; fi
    if timeout "$to" "$@" >"$OUT_DIR/$name.log" 2>&1; then STATUS[$name]=ok; else STATUS[$name]="fail rc=$?"; fi
    echo "   ${STATUS[$name]} in $(($(date +%s) - t)) s" >&2
}

# 1. build
build() {
    if [ -x build/specdec ] && grep -q 'sd_cu_forward' build/specdec 2>/dev/null && [ -x build/tests/gpu/test_gpu ]; then
        echo "reusing the CUDA build in build/"
    else
        # jansson: from pkg-config, else the copy scripts/gpu-deps.sh puts in
        # .gpudeps/ (device machines have no package registry)
        local jf=()
        if ! pkg-config --exists jansson 2>/dev/null && [ -f .gpudeps/libjansson.a ]; then
            jf=(HAVE_JSON=1 "JSON_CFLAGS=-I$PWD/.gpudeps/include" "JSON_LIBS=$PWD/.gpudeps/libjansson.a")
            echo "jansson from .gpudeps/"
        fi
        make clean >/dev/null
        if ! make -j"$J" CUDA=1 HAVE_SERVE= HAVE_CLIENT= "${jf[@]}" \
            build/specdec build/tests/gpu/test_gpu build/tests/tool_synth_shape build/tests/tool_random_head; then
            # the binaries `scripts/gpu-deps.sh --bin` built elsewhere, if carried
            [ -f .gpudeps/bin.tgz ] || return 1
            echo "the build failed here: using the binaries of .gpudeps/bin.tgz"
            tar xzf .gpudeps/bin.tgz || return 1
        fi
    fi
    nm -D build/specdec 2>/dev/null | grep -q cublas || ldd build/specdec | grep -q cublas
}
export -f build
step build 150 build
step nvidia_smi 20 nvidia-smi

# 2. models
models() {
    build/tests/tool_synth_shape "$M/tiny.gguf" llama 64 2 4 2 128 320 F32 &&
    build/tests/tool_synth_shape "$M/q15.gguf" qwen2 1536 28 12 2 8960 151936 Q8_0 &&
    build/tests/tool_synth_shape "$M/draft.gguf" qwen2 256 2 4 2 512 151936 Q8_0 7 &&
    build/tests/tool_random_head "$M/q15.gguf" "$M/q15.eagle3.gguf" eagle3
}
export -f models
step models 120 models

# 3. the tests of the CUDA path
step test_gpu 100 build/tests/gpu/test_gpu

# 4. greedy equality through the CLI on the 1.5B shape
cli_equal() {
    local p="w12 w7 w99 w12 w7 w99 w5 w6 w12 w7" ref out fail=0
    ref=$(build/specdec generate --gpu -m "$M/q15.gguf" -p "$p" -n 64 --method ar 2>/dev/null) || return 1
    echo "ar: $ref"
    for spec in "chain:4 --draft $M/draft.gguf" "tree:3-2-1 --draft $M/draft.gguf" "dyn:3-4-12 --draft $M/draft.gguf" \
                "ngram:2-4" "eagle3:chain:3 --head $M/q15.eagle3.gguf" "eagle3:dyn:3-4-12 --head $M/q15.eagle3.gguf"; do
        set -- $spec
        out=$(build/specdec generate --gpu -m "$M/q15.gguf" -p "$p" -n 64 --method "$@" 2>"$OUT_DIR/cli_equal.err") || {
            echo "FAIL $spec: $(tail -1 "$OUT_DIR/cli_equal.err")"; fail=1; continue; }
        if [ "$out" = "$ref" ]; then echo "PASS equal: $spec"; else echo "FAIL differs: $spec: $out"; fail=1; fi
    done
    return $fail
}
export -f cli_equal
step cli_equal 120 cli_equal

# 5. compute-sanitizer on the tiny model
sanitize() {
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    [ -n "$cs" ] || { echo "SKIP: compute-sanitizer not found on this machine"; return 0; }
    "$cs" --tool memcheck --error-exitcode 9 build/specdec generate --gpu -m "$M/tiny.gguf" -p "w5 w6" -n 16 \
        --method chain:3 --draft "$M/tiny.gguf"
}
export -f sanitize
step sanitizer 75 sanitize

# 6. timings (JSON)
step bench_gpu 75 build/specdec bench-forward --gpu -m "$M/q15.gguf" --batch 1,2,4,8,16,32,64 --reps 11 --decode 64 --json
cp "$OUT_DIR/bench_gpu.log" "$OUT_DIR/bench_gpu.json" 2>/dev/null
SPECDEC_CUDA_GRAPHS=0 step bench_gpu_nographs 50 build/specdec bench-forward --gpu -m "$M/q15.gguf" --batch 1,16,64 --reps 11 --decode 32 --json
SPECDEC_CUDA_INVARIANT=0 step bench_gpu_buckets 60 build/specdec bench-forward --gpu -m "$M/q15.gguf" --batch 1,2,4,8,16,32,64 --reps 11 --decode 32 --json
step bench_cpu 60 build/specdec bench-forward -m "$M/q15.gguf" --batch 1,16 --reps 5 --decode 16 --json

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
python3 - "$OUT_DIR" "$(declare -p STATUS)" "$GPU_NAME" <<'EOF'
import json, os, re, sys
out = sys.argv[1]
status = dict(re.findall(r'\[(\w+)\]="([^"]*)"', sys.argv[2]))
def load(name):
    try:
        txt = open(os.path.join(out, name + ".log")).read()
        return json.loads(txt[txt.index("{"):txt.rindex("}") + 1])
    except Exception:
        return None
gpu = sys.argv[3]
res = {"gpu": gpu, "status": status}
# the bf16 weights of the 1.5B shape, read once per token, over the HBM's
# datasheet bandwidth (H200 4.8 TB/s, H100 SXM 3.35 TB/s, A100 80 GB 2.0 TB/s)
hbm = 4.8e12 if "H200" in gpu else 2.0e12 if "A100" in gpu else 3.35e12
E, L, F, V, qd, kvd = 1536, 28, 8960, 151936, 1536, 256
params = L * (E * (qd + 2 * kvd) + qd * E + 3 * E * F) + V * E
res["bf16_bytes"] = 2 * params
res["hbm_bytes_per_s"] = hbm
res["hbm_floor_ms"] = round(2 * params / hbm * 1e3, 4)
for k in ("bench_gpu", "bench_gpu_nographs", "bench_gpu_buckets", "bench_cpu"):
    j = load(k)
    if j:
        res[k] = {"batches": j.get("batches"), "decode_tokens_per_s": j.get("decode_tokens_per_s")}
g = res.get("bench_gpu")
if g and g["batches"]:
    ms = {b["n"]: b["ms"] for b in g["batches"]}
    if 1 in ms:
        res["decode_share_of_floor"] = round(res["hbm_floor_ms"] / ms[1], 3)
        res["goal_decode_60pct"] = res["decode_share_of_floor"] >= 0.6
    if 1 in ms and 16 in ms:
        res["tree16_over_1"] = round(ms[16] / ms[1], 3)
        res["goal_tree16_1p3"] = res["tree16_over_1"] <= 1.3
for k in ("test_gpu", "cli_equal", "sanitizer"):
    try:
        lines = open(os.path.join(out, k + ".log")).read().splitlines()
        res[k + "_lines"] = [l for l in lines if l.startswith(("PASS", "FAIL", "SKIP", "  "))][:60]
    except Exception:
        pass
res["goal_greedy_equal"] = status.get("cli_equal") == "ok" and status.get("test_gpu") == "ok"
json.dump(res, open(os.path.join(out, "gpu-check.json"), "w"), indent=1)
print(json.dumps(res, indent=1))
EOF
echo "gpu-check: $(($(date +%s) - T0)) s; results in $OUT_DIR/gpu-check.json" >&2
