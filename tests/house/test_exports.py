#!/usr/bin/env python3
"""test_exports.py - the shared library build/libspecdec.so exports exactly
the functions that include/*.h declares (no internal sd_* function leaks, no
declared function is missing), and a program that sees only include/ links
against it and runs.

Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh counts them)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402

SO = os.path.join(ROOT, "build", "libspecdec.so")
INCLUDE = os.path.join(ROOT, "include")


def declared():
    """Function names declared in the public headers (C comments removed)."""
    names = set()
    for f in sorted(os.listdir(INCLUDE)):
        if not f.endswith(".h"):
            continue
        text = open(os.path.join(INCLUDE, f), encoding="utf-8").read()
        text = re.sub(r"//[^\n]*", "", text)
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        # a declaration: a statement ending in ');' whose called name is sd_*
        # (function-pointer typedefs name '(*sd_x)' and are not functions)
        for stmt in text.split(";"):
            s = " ".join(stmt.split())
            if s.startswith("typedef") or s.startswith("#"):
                s = s.split("\n")[-1]
            m = re.search(r"(?:^|[\s*])(sd_[a-z0-9_]+)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*(?:__attribute__.*)?$", s)
            if m and not s.lstrip().startswith("typedef") and "(*" + m.group(1) not in s:
                names.add(m.group(1))
    return names


def exported():
    out = subprocess.run(["nm", "-D", "--defined-only", SO], capture_output=True, text=True, check=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWiDdBbRr":
            syms.add(parts[2].split("@")[0])
    return syms


def main():
    if not os.path.exists(SO):
        report("exports_match_headers", False, f"{SO} is missing (make builds it)")
        return
    if shutil.which("nm") is None:
        print("SKIP exports_match_headers: nm (binutils) is not installed")
    else:
        want, got = declared(), exported()
        extra = sorted(got - want)
        missing = sorted(want - got)
        report("exports_match_headers", len(want) > 80 and not extra and not missing,
               f"{len(want)} declared, {len(got)} exported; exported but not declared: {extra[:12]}; "
               f"declared but not exported: {missing[:12]}")
    # a program that sees include/ alone links against the shared library
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "v.c")
        with open(src, "w") as f:
            f.write('#include <stdio.h>\n#include <string.h>\n#include "specdec.h"\n#include "specdec_spec.h"\n'
                    'int main(void) {\n'
                    '    char err[256];\n    sd_model *m = NULL;\n'
                    '    int rc = sd_model_load(&m, "/nonexistent.gguf", err, sizeof err);\n'
                    '    printf("%s %d %s\\n", sd_version(), rc < 0, strcmp(sd_version(), SPECDEC_VERSION) ? "x" : "ok");\n'
                    '    return 0;\n}\n')
        exe = os.path.join(d, "v")
        cc = os.environ.get("CC", "cc")
        r = subprocess.run([cc, "-std=c11", "-I", INCLUDE, src, "-L", os.path.dirname(SO), "-lspecdec", "-o", exe],
                           capture_output=True, text=True)
        if r.returncode != 0:
            report("links_against_shared_library", False, r.stderr[-800:])
        else:
            env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(SO))
            r = subprocess.run([exe], capture_output=True, text=True, env=env)
            report("links_against_shared_library", r.returncode == 0 and r.stdout.strip().endswith(" 1 ok"),
                   f"exit {r.returncode}: {r.stdout!r} {r.stderr[-300:]!r}")


if __name__ == "__main__":
    main()
    sys.exit(exit_status())
