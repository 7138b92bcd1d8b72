#!/usr/bin/env python3
"""compare-prompt-paths.py - what the 8-bit prompt path does to the text.

For every prompt of a Spec-Bench-style file, runs `specdec generate --json`
greedy twice: with the prompt evaluated with 8-bit activations (the default)
and with float activations (--precise-prompt). Prints one JSON object: how
many texts are identical, how many leading tokens agree on average (in
characters, as the texts differ only after the first differing token), and
the prompt speed of each path.

usage: scripts/compare-prompt-paths.py [-m MODEL] [--prompts FILE] [-n N] [-t T] [--limit K]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(bin_, model, prompt, n, threads, precise):
    args = [bin_, "generate", "-m", model, "--chat", "-p", prompt, "-n", str(n), "--temp", "0", "--json"]
    if threads:
        args += ["-t", str(threads)]
    if precise:
        args.append("--precise-prompt")
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", default=os.path.join(ROOT, "../shared/prompts/dev.jsonl"))
    ap.add_argument("-n", type=int, default=128, help="tokens per text (default 128)")
    ap.add_argument("-t", type=int, default=0, help="threads (default: all cores)")
    ap.add_argument("--limit", type=int, default=0, help="only the first K prompts")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/specdec"))
    a = ap.parse_args()
    prompts = []
    with open(a.prompts, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                prompts.append(json.loads(line)["turns"][0])
    if a.limit:
        prompts = prompts[: a.limit]
    same, prefix, total, pp = 0, 0, 0, {"8bit": [0, 0.0], "float": [0, 0.0]}
    diverged = []
    for i, p in enumerate(prompts):
        fast = run(a.bin, a.model, p, a.n, a.t, False)
        prec = run(a.bin, a.model, p, a.n, a.t, True)
        for k, r in (("8bit", fast), ("float", prec)):
            pp[k][0] += r["n_prompt_tokens"]
            pp[k][1] += r["prompt_ms"]
        x, y = fast["text"], prec["text"]
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        if x == y:
            same += 1
        else:
            diverged.append({"prompt": i + 1, "chars_agreeing": k, "chars": max(len(x), len(y))})
        prefix += k
        total += max(len(x), len(y))
        print(f"prompt {i + 1}/{len(prompts)}: {'same' if x == y else f'differs after {k} chars'}", file=sys.stderr)
    print(json.dumps({
        "model": os.path.basename(a.model), "prompts": len(prompts), "n_predict": a.n,
        "identical_texts": same, "chars_agreeing_fraction": round(prefix / max(total, 1), 4),
        "prompt_tok_per_s": {k: round(v[0] * 1000.0 / v[1], 1) if v[1] else None for k, v in pp.items()},
        "diverged": diverged}, indent=1))


if __name__ == "__main__":
    main()
