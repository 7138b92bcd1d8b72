#!/usr/bin/env python3
"""make-datastore.py - a retrieval datastore for prompt lookup (REST-style
drafting, `--datastore FILE` of generate, bench and serve): the target's own
answers from make-train-data's chat.jsonl, one after another as plain text.

The n-gram drafter looks the last tokens of the text so far up in this corpus
(a suffix array, built by specdec into FILE.sdsa on first use) and proposes
what followed them there. A model's own answers to many prompts hold the
phrases it writes again ("Here's a Python function that ...", list layouts,
closing lines), which the prompt of one request does not.

Never built from the Spec-Bench prompts: make-train-data.py drops any prompt
overlapping them, and this script only reads its output.

  python3 scripts/make-datastore.py --data data/train --out data/datastore/smollm2.txt
  python3 scripts/make-datastore.py --corpus data/corpus/smollm2 \
      --out data/datastore/SmolLM2-135M-Instruct.txt      (what `make datastore` runs)

--corpus reads a committed corpus (data/corpus/NAME: shards NNNN.jsonl.xz,
the records of chat.jsonl) without unpacking it. The file name
data/datastore/NAME.txt, NAME the model file's name without its quantisation
(as heads/ names the heads), is where `--datastore auto` (and `--head auto`
in generate and serve) finds it.
"""
import argparse
import glob
import json
import lzma
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", action="append", default=[],
                    help="a make-train-data output directory (its chat.jsonl); repeat for several")
    ap.add_argument("--corpus", action="append", default=[],
                    help="a committed corpus directory (its NNNN.jsonl.xz shards, in name order); repeat for several")
    ap.add_argument("--out", required=True, help="the corpus file to write (a text file)")
    ap.add_argument("--greedy-only", action="store_true",
                    help="only the answers generated greedily (meta.mode == 'greedy')")
    ap.add_argument("--max-answers", type=int, default=0, help="at most N answers (0 = all)")
    args = ap.parse_args()
    if not args.data and not args.corpus:
        ap.error("give --data DIR or --corpus DIR")
    sources = []   # (path, opener, hint when it cannot be read)
    for d in args.data:
        path = os.path.join(d, "chat.jsonl")
        sources.append((path, lambda p=path: open(p, encoding="utf-8"),
                        "run scripts/make-train-data.py first"))
    for d in args.corpus:
        shards = sorted(glob.glob(os.path.join(d, "*.jsonl.xz")))
        if not shards:
            sys.exit(f"make-datastore: no NNNN.jsonl.xz shards in {d}")
        for path in shards:
            sources.append((path, lambda p=path: lzma.open(p, "rt", encoding="utf-8"), "a damaged shard?"))

    n = chars = skipped = 0
    tmp = args.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as out:
        for path, opener, hint in sources:
            try:
                f = opener()
            except OSError as e:
                sys.exit(f"make-datastore: cannot read {path}: {e.strerror} ({hint})")
            try:
                with f:
                    for lineno, line in enumerate(f, 1):
                        if args.max_answers and n >= args.max_answers:
                            break
                        try:
                            rec = json.loads(line)
                            msgs = rec["messages"]
                        except (ValueError, KeyError, TypeError):
                            sys.exit(f"make-datastore: {path}:{lineno}: not a chat record")
                        if args.greedy_only and rec.get("meta", {}).get("mode") != "greedy":
                            skipped += 1
                            continue
                        for m in msgs:
                            if m.get("role") == "assistant" and m.get("content", "").strip():
                                out.write(m["content"].strip() + "\n\n")
                                chars += len(m["content"])
                                n += 1
            except (OSError, EOFError, lzma.LZMAError) as e:
                out.close()
                os.unlink(tmp)
                sys.exit(f"make-datastore: cannot read {path}: {e} ({hint})")
    if n == 0:
        os.unlink(tmp)
        sys.exit("make-datastore: no answers found in " + ", ".join(args.data + args.corpus))
    os.replace(tmp, args.out)
    print(f"make-datastore: {n} answers, {chars} characters -> {args.out}"
          + (f" ({skipped} sampled answers left out)" if skipped else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
