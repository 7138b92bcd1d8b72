#!/usr/bin/env python3
"""test_cli_doc.py - docs/cli.md, the command-line reference generated from
`specdec --help` (scripts/gen-cli-doc.py, `make docs`):

- docs/cli.md is what the script makes from the built binary now: it fails
  while an option's help has changed and the file has not been regenerated
  (the message shows the first line that differs and says to run make docs);
- it has a section for every command that `specdec --help` lists, so a new
  command cannot be left out of the script's list;
- the help does not depend on where or how it is run: the same text from
  another working directory, with another terminal width (COLUMNS) and
  locale, so that the file is the same on every host;
- the script's --check mode accepts the file and refuses a stale copy.

Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh counts them). Needs
build/specdec (SPECDEC_BIN another) built with the server; skipped with the
reason otherwise.
"""
import difflib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
BIN = os.path.abspath(os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec")))
DOC = os.path.join(ROOT, "docs", "cli.md")
SCRIPT = os.path.join(ROOT, "scripts", "gen-cli-doc.py")
gen = None  # scripts/gen-cli-doc.py, loaded by main
CASES = ["cli_doc_up_to_date", "cli_doc_every_command", "help_host_independent", "gen_script_check"]


def load_script():
    spec = importlib.util.spec_from_file_location("gen_cli_doc", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def first_difference(old, new):
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), "docs/cli.md", "--help now", lineterm="", n=0):
        if line.startswith(("-", "+")) and not line.startswith(("---", "+++")):
            return line
    return "(a difference in line endings)"


def helps(env=None, cwd=None):
    """Every command's --help, as one text, run with env and cwd."""
    out = []
    for args in [[]] + [[c] for c in gen.COMMANDS]:
        r = subprocess.run([BIN, *args, "--help"], capture_output=True, text=True, env=env, cwd=cwd, timeout=60)
        out.append(f"{args} exit {r.returncode}\n{r.stdout}")
    return "\n".join(out)


def main():
    global gen
    if not os.access(BIN, os.X_OK):
        for c in CASES:
            print(f"SKIP {c}: {BIN} not built (make build/specdec)")
        return 0
    r = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        for c in CASES:
            print(f"SKIP {c}: this specdec has no serve command (built without libmicrohttpd), "
                  f"so its help cannot match the reference")
        return 0
    gen = load_script()
    now = gen.generate(BIN)
    try:
        with open(DOC, encoding="utf-8") as f:
            doc = f.read()
    except OSError as e:
        doc = None
        report("cli_doc_up_to_date", False, f"cannot read docs/cli.md ({e}); run make docs")
    if doc is not None:
        report("cli_doc_up_to_date", doc == now,
               f"docs/cli.md is out of date with {BIN}; run make docs. First difference: {first_difference(doc, now)}")

    top = subprocess.run([BIN, "--help"], capture_output=True, text=True, timeout=60).stdout
    block = top.split("commands:\n", 1)[1].split("\n\n", 1)[0] if "commands:\n" in top else ""
    listed = re.findall(r"^  (\S+)  ", block, re.M)
    missing = [c for c in listed if f"\n## specdec {c}\n" not in (doc or "")]
    report("cli_doc_every_command", len(listed) >= 7 and not missing and sorted(listed) == sorted(gen.COMMANDS),
           f"specdec --help lists {listed}, the script knows {gen.COMMANDS}, docs/cli.md lacks {missing}")

    base = helps()
    env = dict(os.environ, COLUMNS="40", LINES="10", LC_ALL="C.UTF-8", LANG="C.UTF-8", TERM="dumb")
    with tempfile.TemporaryDirectory() as tmp:
        other = helps(env=env, cwd=tmp)
    report("help_host_independent", base == other,
           f"the help changes with the working directory, COLUMNS or the locale: {first_difference(base, other)}")

    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "cli.md")
        with open(good, "w", encoding="utf-8") as f:
            f.write(now)
        ok = subprocess.run([sys.executable, SCRIPT, "--bin", BIN, "--out", good, "--check"],
                            capture_output=True, text=True, timeout=120)
        stale = os.path.join(tmp, "stale.md")
        with open(stale, "w", encoding="utf-8") as f:
            f.write(now.replace("show this help", "show the help", 1))
        bad = subprocess.run([sys.executable, SCRIPT, "--bin", BIN, "--out", stale, "--check"],
                             capture_output=True, text=True, timeout=120)
        report("gen_script_check", ok.returncode == 0 and bad.returncode == 1 and "out of date" in bad.stderr
               and "make docs" in bad.stderr,
               f"--check on a current file: exit {ok.returncode} {ok.stderr.strip()!r}; "
               f"on a stale one: exit {bad.returncode} {bad.stderr.strip()!r}")
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
