#!/usr/bin/env python3
"""heldout-prompts.py - prompts of the training corpus's list that no recipe
answered, in the Spec-Bench format `specdec bench --prompts` reads, to measure
a head on text like its training data but never trained on.

  python3 scripts/heldout-prompts.py --from 640 -n 40 > data/heldout-640.jsonl

--from N skips the list's first N prompts (those the recipes answered);
one prompt of each source in turn, in list order, until -n are written.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="data/train/prompts.jsonl", help="make-train-data's prompt list")
    ap.add_argument("--from", dest="start", type=int, required=True, help="skip the list's first N prompts")
    ap.add_argument("-n", type=int, default=40, help="prompts to write (default 40)")
    ap.add_argument("--max-chars", type=int, default=1500, help="longest prompt kept (default 1500)")
    a = ap.parse_args()
    by_src = {}
    try:
        with open(a.prompts) as f:
            for i, line in enumerate(f):
                if i < a.start:
                    continue
                r = json.loads(line)
                if len(r["prompt"]) <= a.max_chars:
                    by_src.setdefault(r["source"], []).append(r)
    except OSError as e:
        sys.exit(f"heldout-prompts: {e} (make-train-data.py --stages a writes the list)")
    out, k = [], 0
    while len(out) < a.n and any(k < len(v) for v in by_src.values()):
        for src in sorted(by_src):
            if k < len(by_src[src]) and len(out) < a.n:
                out.append(by_src[src][k])
        k += 1
    if len(out) < a.n:
        sys.exit(f"heldout-prompts: only {len(out)} prompts after the first {a.start}")
    for q, r in enumerate(out, 1):
        print(json.dumps({"question_id": q, "category": r["source"], "turns": [r["prompt"]], "id": r["id"]}))


if __name__ == "__main__":
    main()
