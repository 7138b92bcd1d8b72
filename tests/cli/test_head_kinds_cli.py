#!/usr/bin/env python3
"""test_head_kinds_cli.py - `specdec generate` with each kind of head file,
on the default model (SmolLM2-135M):

- medusa_generate_lossless: `generate --head MEDUSA.gguf --method
  medusa:2-2 --temp 0` (a random Medusa head from
  build/tests/tool_random_head) drafts with it and prints plain decoding's
  text (generate refused every Medusa method until 2026-11-29: it planned
  them as if the head file were an EAGLE-3 head);
- head_auto_kind_missing: `--head auto --method medusa:2-2` where heads/
  holds no Medusa head for the model fails and says so (--head auto, the
  kind, how to train one), instead of decoding plainly without a word;
- head_wrong_kind: a method for one kind with a file of another fails and
  names both (`medusa:2-2` with the EAGLE-3 head, `eagle3:chain:2` with the
  Medusa head).
- head_auto_none_says_so: `--head auto` where no heads/ folder holds a head
  for the model (a copy of the binary in an empty folder, run there) decodes
  plainly, as without `--head`, and says on stderr that it found none, also
  without -v (until 2026-11-30 only -v said it).

Prints PASS/FAIL/SKIP lines. Skipped without the model or the tool.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
BIN = os.path.abspath(os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec")))
TOOL = os.path.join(ROOT, "build", "tests", "tool_random_head")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
EAGLE = os.path.join(ROOT, "heads", "SmolLM2-135M-Instruct.eagle3.gguf")
CASES = ["medusa_generate_lossless", "head_auto_kind_missing", "head_wrong_kind", "head_auto_none_says_so"]
PROMPT = "Name three colours of the rainbow."


def generate(*extra, binary=BIN, cwd=ROOT, verbose=True):
    args = [binary, "generate", "-m", MODEL, "--chat", "-p", PROMPT, "-n", "40", "--temp", "0", "-t", "2",
            *(["-v"] if verbose else []), *extra]
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600, cwd=cwd)


def main():
    for path, what in ((MODEL, "the default model (make run fetches it)"), (TOOL, "build/tests/tool_random_head"),
                       (EAGLE, "the shipped EAGLE-3 head")):
        if not os.path.exists(path):
            for c in CASES:
                print(f"SKIP {c}: {what} not found: {path}")
            return exit_status()
    with tempfile.TemporaryDirectory() as tmp:
        med = os.path.join(tmp, "medusa.gguf")
        r = subprocess.run([TOOL, MODEL, med, "medusa", "5"], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            for c in CASES:
                report(c, False, f"tool_random_head failed: {r.stderr[-300:]}")
            return exit_status()
        plain = generate("--method", "ar")
        r = generate("--head", med, "--method", "medusa:2-2")
        report("medusa_generate_lossless", plain.returncode == 0 and r.returncode == 0 and
               r.stdout == plain.stdout and "speculative medusa:2-2" in r.stderr,
               f"rc {plain.returncode} {r.returncode} {r.stdout!r} {plain.stdout!r} {r.stderr[-300:]}")
        r = generate("--head", "auto", "--method", "medusa:2-2")
        report("head_auto_kind_missing", r.returncode != 0 and "--head auto found none" in r.stderr and
               "Medusa head" in r.stderr and "train-head --type medusa" in r.stderr and r.stdout == "",
               f"rc {r.returncode} {r.stdout[-100:]!r} {r.stderr[-300:]}")
        r1 = generate("--head", EAGLE, "--method", "medusa:2-2")
        r2 = generate("--head", med, "--method", "eagle3:chain:2")
        report("head_wrong_kind", r1.returncode != 0 and "needs a Medusa head; the head given is an EAGLE-3 head" in
               r1.stderr and r2.returncode != 0 and
               "needs an EAGLE-3 head; the head given is a Medusa head" in r2.stderr,
               f"{r1.returncode} {r1.stderr[-200:]} | {r2.returncode} {r2.stderr[-200:]}")
        # heads/ is looked for in the working directory and beside the binary's folder: neither exists here
        alone = os.path.join(tmp, "bin", "specdec")
        os.makedirs(os.path.dirname(alone))
        shutil.copy2(BIN, alone)
        r = generate("--head", "auto", binary=alone, cwd=tmp, verbose=False)
        report("head_auto_none_says_so", r.returncode == 0 and r.stdout == plain.stdout and
               "--head auto: no head in heads/ was made for" in r.stderr and "train-head" in r.stderr,
               f"rc {r.returncode} {r.stdout[-100:]!r} {plain.stdout[-100:]!r} {r.stderr[-300:]}")
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
