"""traindata - the parts of scripts/make-train-data.py (the training corpus
for specdec's draft heads; see that script's docstring and
docs/training-data.md). The script is the command line (options, stages,
summary); this package does the work:

  jsonl.py         resumable JSONL files (a torn last line is cut), manifest.json
  prompts.py       stage a: the sources read once per run, chitchat-dataset,
                   --extra-prompts, deduplication, the Spec-Bench exclusion
  pydoc_pages.py   the Python HTML documentation (python3-doc): prompts, text
  stdlib_funcs.py  the Python standard library's functions: prompts, text
  tasks.py         generated instructions (writing, arithmetic, translation,
                   rewriting, role play, extraction) drawing on the above
  tasks_more.py    the source tasks2: coding, reasoning, summaries, questions
                   about a passage (added later: last in prompts.jsonl)
  raw.py           stage c: text.jsonl for teacher forcing
  answers.py       stage b: `specdec serve` and the openai client, chat.jsonl

This file: the small helpers all of them use.
"""
import hashlib
import random
import re


def say(*a):
    print(*a, flush=True)


def norm(s):
    """Lower case, letters and digits only, single spaces: the key for
    deduplication and for the Spec-Bench check."""
    return " ".join(re.findall(r"[^\W_]+", s.lower()))


def h12(*parts):
    return hashlib.sha1("\x1f".join(parts).encode("utf-8")).hexdigest()[:12]


def unit(*parts):
    """A number in [0, 1) fixed by the parts (a seeded, order-free coin)."""
    return int(hashlib.sha1("\x1f".join(parts).encode("utf-8")).hexdigest()[:13], 16) / float(1 << 52)


def pick_files(files, n, seed, tag):
    files = sorted(files)
    if n and len(files) > n:
        rng = random.Random(f"{seed}:{tag}")
        files = sorted(rng.sample(files, n))
    return files
