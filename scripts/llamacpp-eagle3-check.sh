#!/usr/bin/env bash
# llamacpp-eagle3-check.sh - does a specdec EAGLE-3 head draft as well in
# llama.cpp as in specdec? (docs/heads.md, "The heads in llama.cpp"). Not part
# of CI: the llama.cpp build takes 12+ minutes on 2 cores (once; cached).
#
#   bash scripts/llamacpp-eagle3-check.sh [N_PROMPTS]
#
# 1. Builds llama.cpp 0c1e570 (the sources vendored in the llama-cpp-python
#    0.3.36 sdist, fetched with pip) on the CPU, only the target
#    llama-speculative-simple, in $LLAMACPP_DIR (default build/llamacpp;
#    reused when the binary is there).
# 2. Runs the same prompts (the first N_PROMPTS, default 4, of every 5th line
#    of $PROMPTS, default ../shared/prompts/dev.jsonl, wrapped in ChatML with
#    the system message $SYSTEM) greedily, $N_PREDICT (128) tokens, a chain
#    of $DRAFT (3) draft tokens, through
#    - llama-speculative-simple --spec-type draft-eagle3 (the head file as the
#      draft model, --spec-draft-p-min 0 so that every chain is full), and
#    - specdec generate --method eagle3:chain:$DRAFT --head-bits 8 (the head's
#      matrices in Q8_0 as the file holds them).
# 3. Prints one JSON object: per prompt and overall, drafted and accepted
#    tokens and the acceptance (accepted / drafted) of each engine, and the
#    prompt's token count in each (they must agree: the same input).
#
# Environment: MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf), HEAD
# (default heads/<model name>.eagle3.gguf), THREADS (2), LLAMACPP_SDIST (a
# llama-cpp-python sdist already downloaded), SYSTEM (default SmolLM2's own
# system message). A ChatML target only (SmolLM2, Qwen2.5); note that
# llama.cpp 0c1e570 extracts hidden states only from some architectures
# (llama: yes; qwen2: no, it aborts), so the Qwen2.5 head cannot be checked
# there.
set -euo pipefail
cd "$(dirname "$0")/.."

N_PROMPTS=${1:-4}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
base=$(basename "$MODEL" .gguf)
HEAD=${HEAD:-heads/${base%.*}.eagle3.gguf}
PROMPTS=${PROMPTS:-../shared/prompts/dev.jsonl}
N_PREDICT=${N_PREDICT:-128}
DRAFT=${DRAFT:-3}
THREADS=${THREADS:-2}
SYSTEM=${SYSTEM:-You are a helpful AI assistant named SmolLM, trained by Hugging Face}
LLAMACPP_DIR=${LLAMACPP_DIR:-build/llamacpp}
VERSION=0.3.36

for f in "$MODEL" "$HEAD" "$PROMPTS" build/specdec; do
    [ -e "$f" ] || { echo "llamacpp-eagle3-check: $f not found (make; scripts/fetch-models.sh)" >&2; exit 1; }
done

# ---- 1. llama.cpp
SRC="$LLAMACPP_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
BIN="$SRC/build/bin/llama-speculative-simple"
if [ ! -x "$BIN" ]; then
    mkdir -p "$LLAMACPP_DIR"
    sdist=${LLAMACPP_SDIST:-$LLAMACPP_DIR/llama_cpp_python-$VERSION.tar.gz}
    if [ ! -f "$sdist" ]; then
        echo "llamacpp-eagle3-check: fetching the llama-cpp-python $VERSION sdist" >&2
        pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$LLAMACPP_DIR" >&2
    fi
    [ -d "$SRC" ] || tar xzf "$sdist" -C "$LLAMACPP_DIR"
    echo "llamacpp-eagle3-check: building llama-speculative-simple (12+ minutes on 2 cores)" >&2
    nice cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF >&2
    nice cmake --build "$SRC/build" -j "$THREADS" --target llama-speculative-simple >&2
fi

# ---- 2. the prompts, both engines
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$PROMPTS" "$N_PROMPTS" "$work" <<'EOF'
import json, sys
path, n, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [l for l in open(path, encoding="utf-8") if l.strip()]
picked = [json.loads(l) for i, l in enumerate(lines) if i % 5 == 0][:n]
for i, rec in enumerate(picked):
    open(f"{work}/q{i}.txt", "w", encoding="utf-8").write(rec["turns"][0])
    open(f"{work}/id{i}", "w").write(str(rec.get("question_id", i)))
EOF
n=$(ls "$work"/q*.txt | wc -l)
for ((i = 0; i < n; i++)); do
    q=$(cat "$work/q$i.txt")
    # (-f drops one trailing newline: the file ends in two so that the prompt ends in "assistant\n";
    # --no-repack: llama.cpp's repacked AMX kernels die of SIGILL on a Sapphire Rapids VM, 2026-11-29)
    printf '<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n\n' "$SYSTEM" "$q" \
        > "$work/p$i.txt"
    echo "llamacpp-eagle3-check: prompt $((i + 1))/$n" >&2
    "$BIN" -m "$MODEL" -md "$HEAD" --spec-type draft-eagle3 --spec-draft-n-max "$DRAFT" --spec-draft-n-min 0 \
        --spec-draft-p-min 0 -f "$work/p$i.txt" -n "$N_PREDICT" --temp 0 -t "$THREADS" -c 2048 --no-repack \
        > "$work/llama$i.log" 2>&1 || { tail -20 "$work/llama$i.log" >&2; exit 1; }
    build/specdec generate -m "$MODEL" --head "$HEAD" --head-bits 8 --method "eagle3:chain:$DRAFT" --chat \
        --system "$SYSTEM" -p "$q" -n "$N_PREDICT" --temp 0 -t "$THREADS" --json > "$work/specdec$i.json" 2> /dev/null
done

# ---- 3. the report
python3 - "$work" "$n" "$MODEL" "$HEAD" "$DRAFT" "$N_PREDICT" <<'EOF'
import json, re, sys
work, n, model, head, draft, n_predict = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
def grab(pat, text):
    m = re.search(pat, text)
    return int(m.group(1)) if m else None
rows, tot = [], {"llama.cpp": [0, 0], "specdec": [0, 0]}
for i in range(n):
    log = open(f"{work}/llama{i}.log", encoding="utf-8", errors="replace").read()
    sd = json.load(open(f"{work}/specdec{i}.json"))
    l_d, l_a = grab(r"n_drafted\s*=\s*(\d+)", log), grab(r"n_accept\s*=\s*(\d+)", log)
    s_d, s_a = sd.get("n_draft_nodes", 0), sd.get("n_draft_accepted", 0)
    tot["llama.cpp"][0] += l_d or 0; tot["llama.cpp"][1] += l_a or 0
    tot["specdec"][0] += s_d; tot["specdec"][1] += s_a
    rows.append({"question_id": int(open(f"{work}/id{i}").read()),
                 "llama.cpp": {"prompt_tokens": grab(r"encoded\s+(\d+) tokens", log),
                               "generated": grab(r"decoded\s+(\d+) tokens", log),
                               "drafted": l_d, "accepted": l_a,
                               "acceptance": round(l_a / l_d, 4) if l_d else None},
                 "specdec": {"prompt_tokens": sd.get("n_prompt_tokens"), "generated": sd.get("n_generated"),
                             "drafted": s_d, "accepted": s_a, "acceptance": round(s_a / s_d, 4) if s_d else None,
                             "acceptance_by_depth": sd.get("acceptance_by_depth")}})
out = {"model": model, "head": head, "draft_chain": draft, "n_predict": n_predict, "prompts": rows}
for k, (d, a) in tot.items():
    out[k] = {"drafted": d, "accepted": a, "acceptance": round(a / d, 4) if d else None}
print(json.dumps(out, indent=1))
EOF
