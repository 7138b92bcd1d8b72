"""The Python standard library (PSF licence): its functions as text and as
prompts (explain, review, write a docstring, implement from a docstring)."""
import ast
import glob
import os
import re
import textwrap

from . import pick_files, unit

STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}


def stdlib_dir(args):
    if args.stdlib_dir:
        return args.stdlib_dir if os.path.isfile(os.path.join(args.stdlib_dir, "os.py")) else None
    cands = [d for d in glob.glob("/usr/lib/python3.*") if os.path.isfile(os.path.join(d, "os.py"))]
    if cands:
        return max(cands, key=lambda d: [int(x) for x in re.findall(r"\d+", os.path.basename(d))])
    import sysconfig
    d = sysconfig.get_paths()["stdlib"]
    return d if os.path.isfile(os.path.join(d, "os.py")) else None


def stdlib_extract(d, args):
    """(prompts, texts) from the standard library's functions."""
    files = []
    for dirpath, dirnames, filenames in os.walk(d):
        dirnames[:] = sorted(x for x in dirnames if x not in STDLIB_SKIP_DIRS and not x.startswith("config-"))
        files += [os.path.relpath(os.path.join(dirpath, f), d) for f in filenames
                  if f.endswith(".py") and not f.startswith("test_")]
    files = pick_files(files, args.sample_files, args.seed, "pystdlib")
    prompts, texts = [], []
    for rel in files:
        try:
            with open(os.path.join(d, rel), encoding="utf-8") as f:
                src = f.read()
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = src.splitlines(keepends=True)
        mod = rel[:-3].replace(os.sep, ".")
        mod = mod[:-len(".__init__")] if mod.endswith(".__init__") else mod
        for qual, node in functions(tree, mod):
            if node.name.startswith("test"):
                continue
            start = min([x.lineno for x in node.decorator_list] + [node.lineno])
            n_lines = node.end_lineno - start + 1
            code = textwrap.dedent("".join(lines[start - 1:node.end_lineno])).rstrip()
            if not (4 <= n_lines <= 60 and 120 <= len(code) <= args.max_code_chars):
                continue
            if not has_code(node):
                continue
            texts.append((f"# {rel}\n{code}", "function", rel))
            doc = ast.get_docstring(node)
            tmpl = ["explain", "review"]
            bare = None
            if doc and len(node.body) > 1:
                b0 = node.body[0]
                cut = set(range(b0.lineno, b0.end_lineno + 1))
                bare = textwrap.dedent("".join(l for i, l in enumerate(lines[start - 1:node.end_lineno], start)
                                               if i not in cut)).rstrip()
                tmpl += ["docstring", "implement"]
            kind = tmpl[int(unit(rel, qual) * len(tmpl))]
            if kind == "explain":
                p = f"Explain what this Python function does:\n\n```python\n{code}\n```"
            elif kind == "review":
                p = f"Review this Python function and suggest improvements:\n\n```python\n{code}\n```"
            elif kind == "docstring":
                p = f"Write a docstring for this Python function:\n\n```python\n{bare}\n```"
            else:
                first = doc.strip().split("\n\n")[0].replace("\n", " ")
                try:
                    sig = f"{node.name}({ast.unparse(node.args)})"
                except Exception:  # noqa: BLE001 - unparse of odd defaults
                    sig = node.name
                p = f"Write a Python function `{sig}`. Its docstring says: \"{first}\""
            prompts.append((p, kind, rel))
    return prompts, texts, len(files)


def functions(tree, mod):
    """(qualified name, node) of every function and method, nested ones too."""
    stack = [(mod, n) for n in tree.body]
    while stack:
        prefix, n = stack.pop(0)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            q = f"{prefix}.{n.name}"
            yield q, n
            stack += [(q, c) for c in n.body]
        elif isinstance(n, ast.ClassDef):
            stack += [(f"{prefix}.{n.name}", c) for c in n.body]
        elif isinstance(n, (ast.If, ast.Try, ast.With)):
            stack += [(prefix, c) for c in getattr(n, "body", [])]


def has_code(fn):
    """False for a function whose body is only a docstring, pass, ... or raise."""
    for st in fn.body:
        if isinstance(st, ast.Pass) or isinstance(st, ast.Raise):
            continue
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue
        return True
    return False


def stdlib_licence(d):
    lic = {"dir": d, "license": "PSF License Agreement (Python standard library)"}
    try:
        with open(os.path.join(d, "LICENSE.txt"), encoding="utf-8", errors="replace") as f:
            t = f.read()
        lic["verified"] = "LICENSE.txt: 'PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2'" \
            if "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in t else False
    except OSError:
        lic["verified"] = False
    return lic
