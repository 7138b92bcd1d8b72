#!/usr/bin/env python3
"""test_doc_links.py - every relative link of the project's Markdown resolves.

A link [text](path) or [text](path#anchor) in a tracked .md file (README,
docs/, heads/, data/ manifests) must name a file or folder that exists, and an
anchor into a Markdown file must be one of its headings (GitHub's rule: lower
case, punctuation dropped, spaces to hyphens). Links with a scheme (https:,
mailto:) are not followed. A first case checks the checker itself on a
made-up page with one good and two broken links.

Prints PASS/FAIL lines (scripts/run-tests.sh counts them)."""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+\s+(.*?)\s*$")


def anchors(path):
    out, fenced = set(), False
    for line in open(path, encoding="utf-8", errors="replace"):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else HEADING.match(line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return out


def broken(md, root):
    """The links of file md (a path under root) that do not resolve."""
    bad = []
    text = open(md, encoding="utf-8", errors="replace").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)   # code blocks hold no links
    for u in LINK.findall(text):
        if re.match(r"[a-zA-Z][a-zA-Z+.-]*:", u):
            continue
        path, _, anchor = u.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
        if not os.path.exists(target) or not os.path.abspath(target).startswith(os.path.abspath(root)):
            bad.append(f"{os.path.relpath(md, root)}: {u} (no such file)")
        elif anchor and target.endswith(".md") and anchor not in anchors(target):
            bad.append(f"{os.path.relpath(md, root)}: {u} (no such heading)")
    return bad


def self_check():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "b.md"), "w") as f:
            f.write("# Title\n\n## The cost, per token\n")
        with open(os.path.join(d, "a.md"), "w") as f:
            f.write("[ok](b.md#the-cost-per-token) [web](https://example.org/x) [gone](c.md) "
                    "[anchor](b.md#the-costs)\n```\n[in code](nowhere.md)\n```\n")
        bad = broken(os.path.join(d, "a.md"), d)
    report("checker_finds_broken_links", len(bad) == 2 and "c.md" in bad[0] and "the-costs" in bad[1],
           f"found {bad}")


def main():
    self_check()
    files = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, stdout=subprocess.PIPE,
                           universal_newlines=True).stdout.split()
    bad = []
    for f in files:
        bad += broken(os.path.join(ROOT, f), ROOT)
    report("doc_links_resolve", len(files) > 10 and not bad,
           f"{len(bad)} broken of {len(files)} files: " + "; ".join(bad[:10]))


if __name__ == "__main__":
    main()
    sys.exit(exit_status())
