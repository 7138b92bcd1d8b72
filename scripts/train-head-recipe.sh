#!/usr/bin/env bash
# train-head-recipe.sh - the recipe of a shipped draft head (heads/README.md):
# the training corpus, the mix the head was trained on, and the train-head
# command, each step resumable (rerun the script after an interruption).
#
#   bash scripts/train-head-recipe.sh smollm2 [WORK_DIR]
#
# WORK_DIR (default data/) holds the corpus, the feature cache and the
# checkpoint; the head is written to heads/. Environment: THREADS (default:
# all cores), PROMPTS (answered prompts, default 3000), CHAT_RECORDS (how many
# answered conversations the mix takes, default all), RAW_EVERY (every Nth
# raw text record joins the mix, default 10; 0 = none), RAW_RECORDS (most raw
# records in the mix, default all), TOKENS (positions trained, default
# 600000), LR (default 1e-3).
set -euo pipefail
cd "$(dirname "$0")/.."

which="${1:-}"
work="${2:-data}"
case "$which" in
smollm2)
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    out=heads/SmolLM2-135M-Instruct.eagle3.gguf
    ;;
*)
    echo "usage: $0 smollm2 [WORK_DIR]" >&2
    exit 1
    ;;
esac
threads="${THREADS:-$(nproc)}"
prompts="${PROMPTS:-3000}"
chat_records="${CHAT_RECORDS:-0}"
raw_every="${RAW_EVERY:-10}"
raw_records="${RAW_RECORDS:-0}"
tokens="${TOKENS:-600000}"
lr="${LR:-1e-3}"

make build/specdec >/dev/null
[ -f "$model" ] || bash scripts/fetch-models.sh
mkdir -p "$work" heads

# 1. The corpus: prompts answered by the target itself, raw text (resumable).
python3 scripts/make-train-data.py --model "$model" --out "$work/train" --max-prompts "$prompts" \
    --parallel 4 --max-tokens 256

# 2. The mix: the answered conversations (the first CHAT_RECORDS), then every
#    RAW_EVERY-th raw text record. Written once; a rerun keeps it (the cache
#    built from it checks every record).
mix="$work/mix.jsonl"
if [ ! -f "$mix" ]; then
    python3 - "$work/train" "$mix" "$chat_records" "$raw_every" "$raw_records" <<'EOF'
import sys
src, out, n_chat, every, n_raw = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with open(out + ".tmp", "w") as f:
    n = 0
    for line in open(f"{src}/chat.jsonl"):
        if n_chat and n >= n_chat:
            break
        f.write(line)
        n += 1
    k = 0
    if every > 0:
        for i, line in enumerate(open(f"{src}/text.jsonl")):
            if n_raw and k >= n_raw:
                break
            if i % every == 0:
                f.write(line)
                k += 1
print(f"mix: {n} conversations, {k} raw text records", file=sys.stderr)
import os
os.replace(out + ".tmp", out)
EOF
fi

# 3. The head (resumes from its checkpoint when one exists).
resume=()
[ -f "$work/head.ckpt" ] && resume=(--resume)
build/specdec train-head -m "$model" --data "$mix" --out "$out" --cache "$work/head.cache" \
    --ckpt "$work/head.ckpt" --tokens "$tokens" --lr "$lr" --seed 42 -t "$threads" "${resume[@]}"
