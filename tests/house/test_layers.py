#!/usr/bin/env python3
"""test_layers.py - the library's folders depend one way only.

The chain (docs/architecture.md): kernels -> model -> runtime -> spec (trees,
verification, cost curve, sizing) -> head -> draft -> train -> gen (the step
API and the method registry) -> programs (tools/, examples/). A file may
include headers of its own folder and of folders before it in the chain,
never of a folder after it; the public headers (include/) are open to all.
A file under src/ that is in no folder of the chain fails the test too, so
that a new folder is placed in the chain on purpose.

Prints PASS/FAIL lines (scripts/run-tests.sh counts them)."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402

CHAIN = ["kernels", "model", "runtime", "spec", "head", "draft", "train", "gen"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    src = os.path.join(ROOT, "src")
    bad, unplaced, n_files = [], [], 0
    for dirpath, _, files in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        for f in sorted(files):
            if not f.endswith((".c", ".h")):
                continue
            n_files += 1
            folder = rel.split(os.sep)[0] if rel != "." else ""
            if folder and folder not in CHAIN:
                unplaced.append(os.path.join("src", rel, f))
                continue
            rank = CHAIN.index(folder) if folder else -1   # src/common.*: below everything
            text = open(os.path.join(dirpath, f), encoding="utf-8", errors="replace").read()
            for inc in INCLUDE.findall(text):
                top = inc.split("/")[0] if "/" in inc else ""
                if top in CHAIN and CHAIN.index(top) > rank:
                    bad.append(f"src/{rel}/{f} includes {inc} ({top} comes after {folder or 'common'})")
    report("layers_one_way", n_files > 50 and not bad,
           f"{len(bad)} includes point up the chain: " + "; ".join(bad[:10]))
    report("every_folder_in_the_chain", not unplaced, "folders not in the chain: " + ", ".join(unplaced[:10]))


if __name__ == "__main__":
    main()
    sys.exit(exit_status())
