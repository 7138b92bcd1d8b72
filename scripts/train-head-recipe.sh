#!/usr/bin/env bash
# train-head-recipe.sh - the recipe of a shipped draft head (heads/README.md):
# the training corpus, the mix the head was trained on, and the train-head
# command, each step resumable (rerun the script after an interruption).
#
#   bash scripts/train-head-recipe.sh smollm2|smollm2-v1|smollm2-v3|smollm2-v4|smollm2-v5|smollm2-v6|smollm2-v7|smollm2-v8|smollm2-v9|smollm2-moa|qwen|qwen-sd|qwen-own|qwen-05b|qwen-1m|qwen-16k|qwen-v4 [WORK_DIR]
#
# The shipped SmolLM2-135M-Instruct head has six stages: smollm2-v1,
# smollm2, smollm2-v3, smollm2-v4, smollm2-v5 and smollm2-v6 (each made
# first by the next when missing).
# smollm2 (stage 2, the shipped head from 2026-11-25 to -30) has two stages:
# smollm2-v1 (session 11's head: the corpus's first 543 conversations
# answered by SmolLM2 itself and raw documentation text, written to
# data/SmolLM2-135M-Instruct.eagle3-v1.gguf; run first when that file is
# missing), then that head fine-tuned (--init; INIT names another start) on
# SmolLM2's answers to the corpus's first 4000 prompts, whose prompt list
# also holds generated instructions (writing, arithmetic, translation,
# rewriting, role play, extraction: make-train-data's "tasks" source).
#
# qwen (Qwen2.5-Coder-1.5B-Instruct, scripts/fetch-models.sh --pair; the
# first stage of the shipped head, session 13's head, written to
# data/qwen/Qwen2.5-Coder-1.5B-Instruct.eagle3-v1.gguf) trains by teacher forcing on the same
# corpus: SmolLM2's answered conversations and standard-library code and
# documentation from text.jsonl, with the 1.5B model's own distribution as
# the soft labels; two mix files, the second appended to the first's feature
# cache. About 68 minutes here.
#
# qwen-sd (not shipped: over the 2-hour budget, heads/README.md) fine-tunes
# the first stage (--init; INIT names another start) by
# self-distillation: the corpus's first prompts answered by the 1.5B model
# itself (make-train-data stage b with it as the server's model, 8 slots, no
# drafts: about 40 tokens/s when the machine is left to it, so ANSWERS=682
# answers take 1-1.5 hours; the step resumes; SD_PROMPTS, default 688, is
# how many prompts it answers) in data/qwen-sd, with a share of
# standard-library code. Writes WORK_DIR/Qwen2.5-Coder-1.5B-Instruct.eagle3-sd.gguf.
# qwen-own (the shipped Qwen head 2026-11-28 to 29, qwen-1m's start) and qwen-05b (issue 29's
# comparison, not shipped) fine-tune that first stage on the answers to the corpus's first 640 prompts written
# by the 1.5B target itself (data/qwen15) or by the 0.5B model (data/qwen05),
# the 1.5B model's distribution as the labels either way; the answers come
# from data/corpus/qwen2.5-coder-{1.5b,0.5b} when committed.
# qwen-1m (issue 29's 1 M-token Qwen corpus; the shipped Qwen head since
# 2026-11-29) fine-tunes the qwen-own head (run first when missing) on all
# 6,900 answers of the 0.5B model
# (data/corpus/qwen2.5-coder-0.5b, 915 k generated tokens, 1.52 M with the
# prompts; the prompts past the first 3,000 are the list's lines 3,001-5,400
# and its first 1,500 "tasks2" prompts, interleaved by source), 1 M
# positions, writing heads/Qwen2.5-Coder-1.5B-Instruct.eagle3.gguf.
# The 1.5B's feature cache over it takes about 4 hours here, the training
# about 1.5: run it in several sittings (every step resumes).
# qwen-v4 (prepared on 2026-12-01, not yet run) fine-tunes the shipped Qwen
# head on the 0.5B model's answers to prompts 6,901-10,900, which no Qwen
# head has seen (about 2.3 hours of feature cache, 1.5 of training here).
# smollm2-v3 fine-tunes stage 2 (smollm2) on conversations 4,488-16,127
# of the committed corpus (1.42 M tokens); smollm2-v4 fine-tunes v3's head
# (made first when missing) on conversations 16,128-32,594 (the rest: 7,249
# conversations, 1.82 M tokens); smollm2-v5 (the shipped head) trains v4's
# head once more on v4's data and feature cache (1.6 M positions, seed 43;
# its checkpoint and head in data/smollm2-v5); smollm2-v6 (the shipped head)
# trains v5's head once more on v3's data and feature cache (1.2 M
# positions, seed 44; its checkpoint and head in data/smollm2-v6).
# smollm2-moa (issue 29; not shipped until measured) trains an MoA drafter,
# TLI 0 without LSA with full-text SA, from scratch on the shipped SmolLM2 head's data through
# the reduced MoA feature cache (docs/moa.md), writing
# WORK_DIR/SmolLM2-135M-Instruct.moa.gguf (3 M positions).
# WORK_DIR (default data/smollm2-ft for smollm2, data/ for smollm2-v1,
# data/KIND for smollm2-v3, smollm2-v4, smollm2-moa, qwen, qwen-own, qwen-05b,
# qwen-1m, qwen-16k and qwen-v4, data/qwen-sd/ft for qwen-sd, data/smollm2-v4 for smollm2-v5 and
# data/smollm2-v3 for smollm2-v6, which write their checkpoints and heads to
# data/smollm2-v5 and data/smollm2-v6) holds the mix,
# the feature cache and the checkpoint; the corpus is data/train (CORPUS to move it); the shipped
# heads are written to heads/. Environment: THREADS (default: all cores),
# PROMPTS (prompts SmolLM2 answers in step 1, default 4000 for smollm2 and
# smollm2-moa, 3000 for smollm2-v1, 16128 for smollm2-v3 and -v4, 400 for the qwen
# kinds), SD_PROMPTS (prompts the Qwen writer answers in step 1b: 688 for
# qwen-sd, 640 for qwen-own and qwen-05b, 6900 for qwen-1m and qwen-16k, 10900
# for qwen-v4), ANSWERS (qwen-sd:
# the 1.5B model's answers used, default 682), INIT (the head a fine-tune
# starts from: smollm2, smollm2-v3 to -v6 and the qwen kinds but qwen), TOKENS
# (positions trained), LR, FF (the head's feed-forward width; 0 = the
# target's). A first stage made on the way runs with its own defaults.
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

# first_stage FILE KIND: the head a fine-tune starts from. INIT names it
# (it must exist); else FILE, made first by this script's KIND when absent
# (with its own defaults: TOKENS, LR, FF and PROMPTS are this run's).
first_stage() {
    if [ -n "${INIT:-}" ]; then
        [ -f "$INIT" ] || { echo "train-head-recipe: INIT=$INIT: no such head file" >&2; exit 1; }
        v1=$INIT
    else
        v1=$1
        [ -f "$v1" ] || CORPUS="$corpus" env -u TOKENS -u LR -u FF -u PROMPTS bash "$self" "$2"
    fi
}

which="${1:-}"
corpus="${CORPUS:-data/train}"
case "$which" in
smollm2-v1)
    # the first stage of the shipped SmolLM2 head (session 11's head)
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data}"
    out="$work/SmolLM2-135M-Instruct.eagle3-v1.gguf"
    # the first 543 conversations, then every 10th record of text.jsonl (at most 162)
    mixes=("mix.jsonl 0 543 all:10:0:162")
    prompts="${PROMPTS:-3000}" tokens="${TOKENS:-600000}" lr="${LR:-1e-3}" ff="${FF:-0}" batch=8
    ;;
smollm2)
    # stage 2 (the shipped head until 2026-11-30): the first stage fine-tuned on every answered
    # conversation of the first 4000 prompts (generated instructions included),
    # then every 20th record of text.jsonl (at most 300)
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-ft}"
    out="$work/SmolLM2-135M-Instruct.eagle3-v2.gguf"
    # (the first 4,488 conversations of the corpus: the shards unpack more)
    mixes=("mix.jsonl 0 4488 all:20:0:300")
    prompts="${PROMPTS:-4000}" tokens="${TOKENS:-1000000}" lr="${LR:-5e-4}" ff="${FF:-0}" batch=8
    first_stage data/SmolLM2-135M-Instruct.eagle3-v1.gguf smollm2-v1
    init=(--init "$v1")
    ;;
smollm2-v3)
    # the shipped head on 2026-11-30 (first tried on 2026-11-28): stage 2
    # fine-tuned again on answers it never saw:
    # conversations 4488-16127 of the 5.05 M-token corpus (data/corpus/smollm2),
    # every one of the generated tasks and chitchat, every 8th of pydoc and
    # pystdlib (6,550 conversations, 1.42 M tokens)
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-v3}"
    out="$work/SmolLM2-135M-Instruct.eagle3-v3.gguf"
    mixes=("mix.jsonl 4488 16128 none:1:0:0 tasks:1,chitchat:1,pydoc:8,pystdlib:8")
    prompts="${PROMPTS:-16128}" tokens="${TOKENS:-600000}" lr="${LR:-5e-4}" ff="${FF:-0}" batch=8
    first_stage data/smollm2-ft/SmolLM2-135M-Instruct.eagle3-v2.gguf smollm2
    init=(--init "$v1")
    ;;
smollm2-v4)
    # the shipped head on 2026-11-30 (sessions 35-38): smollm2-v3's head
    # fine-tuned once more on the rest of the corpus:
    # conversations 16128-32594 of data/corpus/smollm2 (shards 0001-0003),
    # every one of the generated tasks ("tasks", "tasks2": coding, reasoning,
    # summaries of a given text, questions about a given passage) and
    # chitchat, every 8th of pydoc and pystdlib
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-v4}"
    out="$work/SmolLM2-135M-Instruct.eagle3-v4.gguf"
    ship=heads/SmolLM2-135M-Instruct.eagle3.gguf
    mixes=("mix.jsonl 16128 32595 none:1:0:0 tasks:1,tasks2:1,chitchat:1,pydoc:8,pystdlib:8")
    prompts="${PROMPTS:-16128}" tokens="${TOKENS:-600000}" lr="${LR:-5e-4}" ff="${FF:-0}" batch=8
    first_stage data/smollm2-v3/SmolLM2-135M-Instruct.eagle3-v3.gguf smollm2-v3
    init=(--init "$v1")
    ;;
smollm2-v5)
    # the shipped head on 2026-11-30 (session 39): smollm2-v4's head (its
    # Q8_0 file) trained once more on v4's data and feature cache (0.9 epochs
    # more; another seed, so another order): held-back agreement on the
    # answers 47.2 / 39.0 / 34.8% -> 50.4 / 42.3 / 37.8% (heads/README.md)
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-v4}"   # v4's mix and feature cache
    out=data/smollm2-v5/SmolLM2-135M-Instruct.eagle3-v5.gguf
    ckpt=data/smollm2-v5/head.ckpt
    ship=heads/SmolLM2-135M-Instruct.eagle3.gguf
    mixes=("mix.jsonl 16128 32595 none:1:0:0 tasks:1,tasks2:1,chitchat:1,pydoc:8,pystdlib:8")
    prompts="${PROMPTS:-16128}" tokens="${TOKENS:-1600000}" lr="${LR:-3e-4}" ff="${FF:-0}" batch=8 seed=43
    first_stage data/smollm2-v4/SmolLM2-135M-Instruct.eagle3-v4.gguf smollm2-v4
    init=(--init "$v1")
    ;;
smollm2-v6)
    # the shipped head on 2026-11-30 (session 40): smollm2-v5's head
    # (its Q8_0 file) trained once more on smollm2-v3's
    # data and feature cache (conversations 4,488-16,127, which it had seen
    # 0.43 epochs of, three stages before; 1.2 M positions, seed 44): held-back
    # agreement on the answers of v3's split 55.7 / 49.2 / 45.3% -> 58.0 /
    # 51.9 / 47.8%, of v4's split 50.4 / 42.3 / 37.8% -> 50.5 / 42.6 / 38.7%
    # (heads/README.md)
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-v3}"   # v3's mix and feature cache
    out=data/smollm2-v6/SmolLM2-135M-Instruct.eagle3-v6.gguf
    ckpt=data/smollm2-v6/head.ckpt
    ship=heads/SmolLM2-135M-Instruct.eagle3.gguf
    mixes=("mix.jsonl 4488 16128 none:1:0:0 tasks:1,chitchat:1,pydoc:8,pystdlib:8")
    prompts="${PROMPTS:-16128}" tokens="${TOKENS:-1200000}" lr="${LR:-3e-4}" ff="${FF:-0}" batch=8 seed=44
    first_stage data/smollm2-v5/SmolLM2-135M-Instruct.eagle3-v5.gguf smollm2-v5
    init=(--init "$v1")
    ;;
smollm2-v7)
    # the shipped head since 2026-12-01 (session 42; session 40's first try
    # was lost with its machine): the stage-6 head (its Q5_0 file, or INIT)
    # trained once more on smollm2-v4's data and feature cache
    # (conversations 16,128-32,594, which v6 saw 1.9 epochs of two and three
    # stages before; 1.2 M positions, a lower rate, seed 45): held-back
    # agreement 58.6 / 52.2 / 49.7% (stage 5 there 56.6 / 50.0 / 47.0%),
    # fixed-shape tau +2.0-2.3% (heads/README.md). INIT defaults to the
    # shipped file, which this stage then replaces: keep stage 6's file
    # (git history) as INIT to run it again.
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-v4}"   # v4's mix and feature cache
    out=data/smollm2-v7/SmolLM2-135M-Instruct.eagle3-v7.gguf
    ckpt=data/smollm2-v7/head.ckpt
    mixes=("mix.jsonl 16128 32595 none:1:0:0 tasks:1,tasks2:1,chitchat:1,pydoc:8,pystdlib:8")
    prompts="${PROMPTS:-16128}" tokens="${TOKENS:-1200000}" lr="${LR:-2e-4}" ff="${FF:-0}" batch=8 seed=45
    v1="${INIT:-heads/SmolLM2-135M-Instruct.eagle3.gguf}"
    init=(--init "$v1")
    ship=heads/SmolLM2-135M-Instruct.eagle3.gguf
    ;;
smollm2-v8)
    # a trial (not shipped): the shipped stage-7 head once more on
    # smollm2-v3's data (conversations 4,488-16,127; 1.2 M positions, lr
    # 2e-4, seed 46), to see whether another pass still pays: held-back
    # agreement on v3's split 63.7 / 58.2 / 55.9% (stage 6 63.0 / 57.2 /
    # 54.4%), but fixed-shape tau on the dev prompts 1.640 -> 1.637 (chain:3)
    # and 2.040 -> 2.019 (dyn:3-4-12): it no longer pays (heads/README.md)
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-v3}"   # v3's mix and feature cache
    out=data/smollm2-v8/SmolLM2-135M-Instruct.eagle3-v8.gguf
    ckpt=data/smollm2-v8/head.ckpt
    mixes=("mix.jsonl 4488 16128 none:1:0:0 tasks:1,chitchat:1,pydoc:8,pystdlib:8")
    prompts="${PROMPTS:-16128}" tokens="${TOKENS:-1200000}" lr="${LR:-2e-4}" ff="${FF:-0}" batch=8 seed=46
    v1="${INIT:-heads/SmolLM2-135M-Instruct.eagle3.gguf}"
    init=(--init "$v1")
    ;;
smollm2-v9)
    # a trial (not shipped): the stage-7 head (INIT: its Q8_0 file,
    # data/smollm2-v7/SmolLM2-135M-Instruct.eagle3-v7.gguf, else the shipped
    # file) with its draft vocabulary grown from 8,192 to 16,384 tokens
    # (--draft-vocab: its tokens and rows kept, the tokens SmolLM2 predicts
    # most often in v4's data added, their rows the target's), trained on
    # smollm2-v4's data and feature cache (1.2 M positions, lr 2e-4, seed
    # 47; 30 min): held-back agreement 59.9 / 53.4 / 50.2% (stage 7 58.6 /
    # 52.2 / 49.7%), fixed-shape tau +0.2% (chain:3) and +1.0%
    # (dyn:3-4-12) for a head 49% dearer per drafted node (heads/README.md)
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-v4}"   # v4's mix and feature cache
    out=data/smollm2-v9/SmolLM2-135M-Instruct.eagle3-v9.gguf
    ckpt=data/smollm2-v9/head.ckpt
    mixes=("mix.jsonl 16128 32595 none:1:0:0 tasks:1,tasks2:1,chitchat:1,pydoc:8,pystdlib:8")
    prompts="${PROMPTS:-16128}" tokens="${TOKENS:-1200000}" lr="${LR:-2e-4}" ff="${FF:-0}" batch=8 seed=47
    v1="${INIT:-heads/SmolLM2-135M-Instruct.eagle3.gguf}"
    init=(--init "$v1")
    extra=(--draft-vocab 16384)
    ;;
smollm2-moa)
    # issue 29's MoA drafter at scale: TLI 0 without LSA, SA over the whole
    # text (--sa-full; the kind above EAGLE-3 in the same-time comparisons of
    # 2026-11-29; verified points every 2-5 positions, which train the first
    # drafted tokens more) and a feed-forward of 768 (half the target's:
    # accepted as often as the full width, a drafted token 15-20% cheaper;
    # FF=0 for the full width), trained from scratch on the
    # corpus's first 16,128 answered conversations (about 4.2 M tokens) and
    # every 20th text record (at most 300) through the reduced MoA feature
    # cache (1.9 KB a token: 8.0 GB; 69 minutes at 1,040 tok/s on the
    # 2-vCPU Intel host of 2026-11-29), then 3 M positions (51 minutes there,
    # partly beside other jobs); docs/moa-measured.md, "At scale": as good as
    # the shipped EAGLE-3 head, not better, so not shipped
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    work="${2:-data/smollm2-moa}"
    out="$work/SmolLM2-135M-Instruct.moa.gguf"
    mixes=("mix.jsonl 0 16128 all:20:0:300")
    prompts="${PROMPTS:-4000}" tokens="${TOKENS:-3000000}" lr="${LR:-1e-3}" ff="${FF:-768}" batch=4
    extra=(--type moa --no-lsa --sa-full --seq-len 128 --moa-block 2-5)
    ;;
qwen)
    # the first stage of the shipped Qwen head (session 13's head, shipped
    # until 2026-11-28)
    model=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    work="${2:-data/qwen}"
    out="$work/Qwen2.5-Coder-1.5B-Instruct.eagle3-v1.gguf"
    # mix.jsonl: conversations 0-179, every 10th pystdlib record, every 120th pydoc record;
    # mix2.jsonl: conversations 180-359, the pystdlib records 5, 25, 45, ... (every 20th from the 6th)
    mixes=("mix.jsonl 0 180 pystdlib:10:0:0,pydoc:120:0:0" "mix2.jsonl 180 360 pystdlib:20:5:0")
    prompts="${PROMPTS:-400}" tokens="${TOKENS:-400000}" lr="${LR:-1e-3}" ff="${FF:-3072}" batch=4
    ;;
qwen-sd)
    # the shipped head fine-tuned on the 1.5B model's own answers (not shipped)
    model=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    work="${2:-data/qwen-sd/ft}"
    out="$work/Qwen2.5-Coder-1.5B-Instruct.eagle3-sd.gguf"
    answers=data/qwen-sd   # the 1.5B model's own answers (chat.jsonl)
    n_sd="${ANSWERS:-682}"
    # mix.jsonl: answers 0-339, the pystdlib records 3, 33, 63, ...;
    # mix2.jsonl: answers 340 on, the pystdlib records 18, 48, 78, ...
    mixes=("mix.jsonl 0 340 pystdlib:30:3:0" "mix2.jsonl 340 $n_sd pystdlib:30:18:0")
    prompts=400 tokens="${TOKENS:-300000}" lr="${LR:-5e-4}" ff="${FF:-3072}" batch=4
    init=(--init "${INIT:-data/qwen/Qwen2.5-Coder-1.5B-Instruct.eagle3-v1.gguf}")
    ;;
qwen-own|qwen-05b)
    # qwen-own: the shipped Qwen head of 2026-11-28, the first stage fine-tuned
    # on the 1.5B model's own answers. qwen-05b, issue 29's question: do
    # answers written by the 0.5B model, labelled by the 1.5B target through
    # teacher forcing, train its head as well? Both fine-tune the first stage
    # on the answers to the same first 640 prompts of the corpus
    # (conversations only), the same positions and options; only the writer
    # differs.
    model=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    work="${2:-data/$which}"
    if [ "$which" = qwen-own ]; then
        writer=$model answers=data/qwen15 shards=data/corpus/qwen2.5-coder-1.5b
        out="$work/Qwen2.5-Coder-1.5B-Instruct.eagle3-qwen-own.gguf"   # (shipped 2026-11-28 to -29; qwen-1m's start)
    else
        writer=models/Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf answers=data/qwen05
        shards=data/corpus/qwen2.5-coder-0.5b
        out="$work/Qwen2.5-Coder-1.5B-Instruct.eagle3-$which.gguf"
    fi
    first_stage data/qwen/Qwen2.5-Coder-1.5B-Instruct.eagle3-v1.gguf qwen
    sd_prompts=640 sd_parallel=16
    mixes=("mix.jsonl 0 640 none:1:0:0")
    prompts=400 tokens="${TOKENS:-160000}" lr="${LR:-5e-4}" ff="${FF:-3072}" batch=4
    init=(--init "$v1")
    ;;
qwen-1m)
    model=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    work="${2:-data/qwen-1m}"
    writer=models/Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf answers=data/qwen05
    shards=data/corpus/qwen2.5-coder-0.5b
    out=heads/Qwen2.5-Coder-1.5B-Instruct.eagle3.gguf   # (the shipped head since 2026-11-29)
    ship=$out
    first_stage data/qwen-own/Qwen2.5-Coder-1.5B-Instruct.eagle3-qwen-own.gguf qwen-own
    sd_prompts=6900 sd_parallel=16
    mixes=("mix.jsonl 0 6900 none:1:0:0")
    prompts=400 tokens="${TOKENS:-1000000}" lr="${LR:-5e-4}" ff="${FF:-3072}" batch=4
    init=(--init "$v1")
    ;;
qwen-16k)
    # a trial (not shipped; heads/README.md): tau +1.0-1.7%, a drafted node
    # 31% dearer, speed within the noise. The shipped Qwen head (stage 3; INIT: its Q8_0 file, in git
    # history: git show b93d9a6:heads/Qwen2.5-Coder-1.5B-Instruct.eagle3.gguf,
    # else the shipped Q5_0 file) with its draft vocabulary grown from 8,192 to
    # 16,384 tokens (--draft-vocab: its tokens and rows kept, the tokens the
    # 1.5B model predicts most often in this data added, their rows the
    # target's), trained on every 4th answer of the 0.5B model's corpus
    # (1,725 conversations from the second on, 382 k tokens; 240 k positions,
    # lr 3e-4, seed 48)
    model=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    work="${2:-data/qwen-16k}"
    writer=models/Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf answers=data/qwen05
    shards=data/corpus/qwen2.5-coder-0.5b
    out="$work/Qwen2.5-Coder-1.5B-Instruct.eagle3-16k.gguf"
    sd_prompts=6900 sd_parallel=16
    mixes=("mix.jsonl 0 6900 none:1:0:0 all:4:1")
    prompts=400 tokens="${TOKENS:-240000}" lr="${LR:-3e-4}" ff="${FF:-3072}" batch=4 seed=48
    v1="${INIT:-heads/Qwen2.5-Coder-1.5B-Instruct.eagle3.gguf}"
    init=(--init "$v1")
    extra=(--draft-vocab 16384)
    ;;
qwen-v4)
    # stage 4 of the Qwen head, made ready on 2026-12-01 (session 44) and not
    # yet run (about 2.3 hours of feature cache and 1.5 of training here: a
    # later session's): the shipped head (stage 3; INIT: its Q8_0 file, git
    # show b93d9a6:heads/Qwen2.5-Coder-1.5B-Instruct.eagle3.gguf, else the
    # shipped Q5_0 file) fine-tuned on the 0.5B model's 4,000 answers to
    # prompts 6,901-10,900 (shard 0003 of data/corpus/qwen2.5-coder-0.5b: the
    # list's remaining 1,138 tasks2 prompts and its next 2,862 from line 5,401
    # on), which no Qwen head has seen, as smollm2-v3 and -v4 did for SmolLM2
    model=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    work="${2:-data/qwen-v4}"
    writer=models/Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf answers=data/qwen05
    shards=data/corpus/qwen2.5-coder-0.5b
    out="$work/Qwen2.5-Coder-1.5B-Instruct.eagle3-v4.gguf"
    sd_prompts=10900 sd_parallel=16
    mixes=("mix.jsonl 6900 10900 none:1:0:0")
    prompts=400 tokens="${TOKENS:-900000}" lr="${LR:-3e-4}" ff="${FF:-3072}" batch=4 seed=49
    v1="${INIT:-heads/Qwen2.5-Coder-1.5B-Instruct.eagle3.gguf}"
    init=(--init "$v1")
    ;;
*)
    echo "usage: $0 smollm2|smollm2-v1|smollm2-v3|smollm2-v4|smollm2-v5|smollm2-v6|smollm2-v7|smollm2-v8|smollm2-v9|smollm2-moa|qwen|qwen-sd|qwen-own|qwen-05b|qwen-1m|qwen-16k|qwen-v4 [WORK_DIR]" >&2
    exit 1
    ;;
esac
threads="${THREADS:-$(nproc)}"
answers="${answers:-$corpus}"
init=("${init[@]+"${init[@]}"}")

make build/specdec >/dev/null
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || bash scripts/fetch-models.sh
[ -f "$model" ] || bash scripts/fetch-models.sh --pair
[ -f "${writer:-$model}" ] || bash scripts/fetch-models.sh --pair
[ -f "${writer:-$model}" ] || { echo "train-head-recipe: the answers' writer ${writer:-} is missing" >&2; exit 1; }
ckpt="${ckpt:-$work/head.ckpt}"
mkdir -p "$work" heads "$(dirname "$ckpt")" "$(dirname "$out")"

# 1. The corpus: prompts answered by SmolLM2 itself, raw text (resumable).
#    The answers committed in data/corpus/ come first, so that a fresh machine
#    does not answer them again.
python3 scripts/corpus-shards.py unpack --out "$corpus"
python3 scripts/make-train-data.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --out "$corpus" \
    --max-prompts "$prompts" --parallel 4 --max-tokens 256

# 1b. qwen-sd: the corpus's first 688 prompts answered by the target itself
#     (resumable; session 17 had 682 of them, the other 6 timed out);
#     qwen-own / qwen-05b: the first 640, by the target or the 0.5B model,
#     starting from the answers committed in data/corpus/ when there are any.
if [ "$answers" != "$corpus" ]; then
    mkdir -p "$answers"
    [ -f "$answers/prompts.jsonl" ] || head -n 3000 "$corpus/prompts.jsonl" >"$answers/prompts.jsonl"
    # qwen-1m: prompts 3,001-6,900 (the list's lines 3,001-5,400 and its first
    # 1,500 tasks2 prompts, interleaved by source), appended once
    if { [ "$which" = qwen-1m ] || [ "$which" = qwen-16k ] || [ "$which" = qwen-v4 ]; } &&
        [ "$(wc -l <"$answers/prompts.jsonl")" -lt 6900 ]; then
        python3 - "$corpus/prompts.jsonl" "$answers/prompts.jsonl" <<'PY'
import collections, json, sys
src, dst = sys.argv[1], sys.argv[2]
lines = open(src).read().splitlines()
by = collections.defaultdict(list)
for l in lines[3000:5400]:
    by[json.loads(l)["source"]].append(l)
by["tasks2"] = [l for l in lines if json.loads(l)["source"] == "tasks2"][:1500]
out = []
while any(by.values()):
    for s in ("tasks2", "chitchat", "pydoc", "pystdlib", "tasks"):
        if by[s]:
            out.append(by[s].pop(0))
have = {json.loads(l)["id"] for l in open(dst)}
with open(dst, "a") as f:
    f.writelines(l + "\n" for l in out if json.loads(l)["id"] not in have)
PY
    fi
    # qwen-v4: prompts 6,901-10,900 (the list's remaining 1,138 tasks2 prompts
    # and its next 2,862 from line 5,401 on, a tasks2 prompt after every 2-3
    # others), appended once
    if [ "$which" = qwen-v4 ] && [ "$(wc -l <"$answers/prompts.jsonl")" -lt 10900 ]; then
        python3 - "$corpus/prompts.jsonl" "$answers/prompts.jsonl" <<'PY'
import json, sys
src, dst = sys.argv[1], sys.argv[2]
lines = open(src).read().splitlines()
src_of = [json.loads(l)["source"] for l in lines]
a = [l for l, s in zip(lines, src_of) if s == "tasks2"][1500:]
b = [l for l, s in zip(lines[5400:], src_of[5400:]) if s != "tasks2"][:2862]
out, i, j = [], 0, 0
while i < len(a) or j < len(b):
    if j < len(b):
        out.append(b[j])
        j += 1
    if i < len(a) and (j * len(a) >= (i + 1) * len(b) or j >= len(b)):
        out.append(a[i])
        i += 1
have = {json.loads(l)["id"] for l in open(dst)}
with open(dst, "a") as f:
    f.writelines(l + "\n" for l in out if json.loads(l)["id"] not in have)
PY
    fi
    [ -n "${shards:-}" ] && [ -f "$shards/manifest.json" ] && \
        python3 scripts/corpus-shards.py unpack --dir "$shards" --out "$answers"
    python3 scripts/make-train-data.py --model "${writer:-$model}" --out "$answers" --stages b --offline \
        --max-prompts "${SD_PROMPTS:-${sd_prompts:-688}}" --parallel "${sd_parallel:-8}" --max-tokens 256 \
        --progress 60
fi

# 2. The mixes. Each: answered conversations [FROM, TO) of chat.jsonl, then
#    raw records of text.jsonl by RULE: "all:EVERY:OFFSET:MAX" (record i of
#    the file when i % EVERY == OFFSET, at most MAX, 0 = no limit) or
#    "SOURCE:EVERY:OFFSET:MAX,..." (counted within each source). Written
#    once; a rerun keeps them (the feature cache checks every record). An
#    optional fifth field "SOURCE:EVERY,..." keeps, of the conversations in
#    [FROM, TO), every EVERY-th of each source (counted within the source;
#    sources not named are left out); "SOURCE:EVERY:OFFSET" keeps those at
#    OFFSET of every EVERY, and source "all" counts every conversation alike.
data=()
for spec in "${mixes[@]}"; do
    read -r name from to rule crule <<<"$spec"
    mix="$work/$name"
    data+=(--data "$mix")
    [ -f "$mix" ] && continue
    python3 - "$corpus" "$mix" "$from" "$to" "$rule" "$answers" "${crule:-}" <<'EOF'
import json, os, sys
src, out, c0, c1, rule, chats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
crule = {}  # SOURCE -> (EVERY, OFFSET); SOURCE "all" counts every conversation
for part in sys.argv[7].split(",") if sys.argv[7] else []:
    s, e, *o = part.split(":")
    crule[s] = (int(e), int(o[0]) if o else 0)
crule = crule or None
cseen = {}
rules = {}
for part in rule.split(","):
    s, every, off, most = part.split(":")
    rules[s] = (int(every), int(off), int(most))
with open(out + ".tmp", "w") as f:
    n = 0
    for i, line in enumerate(open(f"{chats}/chat.jsonl")):
        if c0 <= i < c1:
            if crule is not None:
                s = "all" if "all" in crule else json.loads(line)["source"]
                j = cseen.get(s, 0)
                cseen[s] = j + 1
                if s not in crule or j % crule[s][0] != crule[s][1]:
                    continue
            f.write(line)
            n += 1
    seen, taken = {}, {}
    for i, line in enumerate(open(f"{src}/text.jsonl")):
        key = "all" if "all" in rules else json.loads(line)["source"]
        if key not in rules:
            continue
        every, off, most = rules[key]
        j = i if key == "all" else seen.get(key, 0)
        seen[key] = j + 1
        if j % every == off and (not most or taken.get(key, 0) < most):
            f.write(line)
            taken[key] = taken.get(key, 0) + 1
print(f"{out}: {n} conversations, {sum(taken.values())} raw text records", file=sys.stderr)
if crule is None and n < c1 - c0:
    print(f"warning: {out}: {n} conversations where the recipe takes {c1 - c0} (fewer answered in "
          f"{chats}/chat.jsonl; a failed prompt stays in failed.jsonl); the mix is written once: delete it "
          "to rebuild it after more answers", file=sys.stderr)
os.replace(out + ".tmp", out)
EOF
done

# 3. The head (resumes from its checkpoint when one exists).
resume=()
[ -f "$ckpt" ] && resume=(--resume)
build/specdec train-head -m "$model" "${data[@]}" --out "$out" --cache "$work/head.cache" \
    --ckpt "$ckpt" --tokens "$tokens" --batch "$batch" --lr "$lr" --ff "$ff" --seed "${seed:-42}" -t "$threads" \
    "${init[@]+"${init[@]}"}" "${resume[@]+"${resume[@]}"}" "${extra[@]+"${extra[@]}"}"

# 4. The shipped file: heads/ holds the drafters in Q5_0, the type they run
#    at by default (heads/README.md; the same drafts as the Q8_0 file).
if [ -n "${ship:-}" ]; then
    build/specdec head-convert -m "$model" --type q5_0 "$out" "$ship"
fi
