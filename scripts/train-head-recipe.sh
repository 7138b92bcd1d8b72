#!/usr/bin/env bash
# train-head-recipe.sh - the recipe of a shipped draft head (heads/README.md):
# the training corpus, the mix the head was trained on, and the train-head
# command, each step resumable (rerun the script after an interruption).
#
#   bash scripts/train-head-recipe.sh smollm2|qwen [WORK_DIR]
#
# qwen (Qwen2.5-Coder-1.5B-Instruct, scripts/fetch-models.sh --pair) trains
# on the same corpus by teacher forcing: SmolLM2's answered conversations
# (the first CHAT_RECORDS) and standard-library code and documentation from
# text.jsonl, with the 1.5B model's own distribution as the soft labels (the
# 1.5B model answering thousands of prompts would take hours here). Its mix:
# every RAW_EVERY_PYSTDLIB-th pystdlib record and every RAW_EVERY_PYDOC-th
# pydoc record (counted per source), after the conversations.
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
qwen)
    model=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    out=heads/Qwen2.5-Coder-1.5B-Instruct.eagle3.gguf
    corpus_model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/qwen}"
    corpus="${CORPUS:-data/train}"   # the SmolLM2 corpus (shared with the smollm2 recipe)
    : "${CHAT_RECORDS:=180}" "${RAW_EVERY_PYSTDLIB:=10}" "${RAW_EVERY_PYDOC:=120}" "${TOKENS:=QWEN_TOKENS}"
    : "${LR:=QWEN_LR}" "${FF:=3072}" "${PROMPTS:=200}"
    ;;
*)
    echo "usage: $0 smollm2|qwen [WORK_DIR]" >&2
    exit 1
    ;;
esac
threads="${THREADS:-$(nproc)}"
corpus_model="${corpus_model:-$model}"
corpus="${corpus:-${CORPUS:-$work/train}}"
ff="${FF:-0}"
prompts="${PROMPTS:-3000}"
chat_records="${CHAT_RECORDS:-0}"
raw_every="${RAW_EVERY:-10}"
raw_records="${RAW_RECORDS:-0}"
tokens="${TOKENS:-600000}"
lr="${LR:-1e-3}"

make build/specdec >/dev/null
[ -f "$model" ] || bash scripts/fetch-models.sh
[ -f "$model" ] || bash scripts/fetch-models.sh --pair
mkdir -p "$work" heads

# 1. The corpus: prompts answered by the target itself, raw text (resumable).
python3 scripts/make-train-data.py --model "$corpus_model" --out "$corpus" --max-prompts "$prompts" \
    --parallel 4 --max-tokens 256

# 2. The mix: the answered conversations (the first CHAT_RECORDS), then every
#    RAW_EVERY-th raw text record (or, with RAW_EVERY_PYSTDLIB /
#    RAW_EVERY_PYDOC, every N-th record of each source). Written once; a
#    rerun keeps it (the cache built from it checks every record).
mix="$work/mix.jsonl"
if [ ! -f "$mix" ]; then
    python3 - "$corpus" "$mix" "$chat_records" "$raw_every" "$raw_records" \
        "${RAW_EVERY_PYSTDLIB:-0}" "${RAW_EVERY_PYDOC:-0}" <<'EOF'
import json, os, sys
src, out = sys.argv[1], sys.argv[2]
n_chat, every, n_raw, ev_lib, ev_doc = (int(a) for a in sys.argv[3:8])
per_source = {"pystdlib": ev_lib, "pydoc": ev_doc} if ev_lib or ev_doc else None
with open(out + ".tmp", "w") as f:
    n = 0
    for line in open(f"{src}/chat.jsonl"):
        if n_chat and n >= n_chat:
            break
        f.write(line)
        n += 1
    k, seen = 0, {}
    for i, line in enumerate(open(f"{src}/text.jsonl")):
        if n_raw and k >= n_raw:
            break
        if per_source is not None:
            s = json.loads(line)["source"]
            j = seen.get(s, 0)
            seen[s] = j + 1
            take = per_source.get(s, 0) > 0 and j % per_source[s] == 0
        else:
            take = every > 0 and i % every == 0
        if take:
            f.write(line)
            k += 1
print(f"mix: {n} conversations, {k} raw text records", file=sys.stderr)
os.replace(out + ".tmp", out)
EOF
fi

# 3. The head (resumes from its checkpoint when one exists).
resume=()
[ -f "$work/head.ckpt" ] && resume=(--resume)
build/specdec train-head -m "$model" --data "$mix" --out "$out" --cache "$work/head.cache" \
    --ckpt "$work/head.ckpt" --tokens "$tokens" --lr "$lr" --ff "$ff" --seed 42 -t "$threads" "${resume[@]}"
