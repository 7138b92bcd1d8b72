#!/usr/bin/env python3
"""make-train-data.py - the training corpus for specdec's draft heads (EAGLE-3,
Medusa; issue 16), built from what this machine reaches and what is licensed
for it: a public dataset on the Python package index, Debian's Python
documentation and the Python standard library. Never the Spec-Bench prompts.

Stages (each resumable: a rerun skips what is done and appends the rest):
  a  prompts  prompts.jsonl: first user turns of chitchat-dataset (PyPI, MIT),
              questions about the Python documentation (Debian's python3-doc,
              PSF licence) and about standard-library functions (PSF licence);
              deduplicated, and anything overlapping the Spec-Bench prompts
              (--exclude, default ../shared/prompts/dev.jsonl) dropped.
  c  text     text.jsonl: raw documentation sections and standard-library
              functions for teacher forcing, at most --max-raw records.
  b  answers  chat.jsonl: the first --max-prompts prompts answered by the
              target itself through `specdec serve` (self-distillation):
              greedy, and a --sampled-share of them at temperature 0.7 with a
              seed per prompt.
The trainer reads chat.jsonl and text.jsonl; prompts.jsonl is an intermediate.
Records (one JSON object a line):
  {"id", "source", "messages": [{"role": "user", ...}, {"role": "assistant", ...}], "meta"}
  {"id", "source", "text", "meta"}
("meta" is informative; the trainer ignores it). manifest.json beside them
records the licences, the exclusion counts, each run's throughput and sizes.

Python standard library plus the `openai` client (stage b). chitchat-dataset is
fetched with `pip download` (no install; the wheel's METADATA and LICENSE are
read and recorded), python3-doc with `apt-get install` (as root);
--no-pip / --no-apt / --offline use only what is present already.
See docs/training-data.md.
"""
import argparse
import ast
import email.parser
import glob
import hashlib
import html.parser
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_BIN = os.path.join(ROOT, "build", "specdec")
DEFAULT_EXCLUDE = os.path.normpath(os.path.join(ROOT, "..", "shared", "prompts", "dev.jsonl"))
CHITCHAT_PKG = "chitchat-dataset==0.9.0"
PYDOC_DIRS = ["/usr/share/doc/python3-doc/html", "/usr/share/doc/python3/html"]
SHINGLE = 8  # words: a candidate sharing any 8-word run with a Spec-Bench prompt is dropped
# documentation pages that are not prose about Python (indexes, legal text, the change log)
PYDOC_SKIP = re.compile(r"^(genindex.*|py-modindex|search|contents|copyright|license|bugs|about|download"
                        r"|whatsnew/changelog)\.html$")
# what a signature line of the documentation starts with before the name
API_KEYWORDS = re.compile(r"^((abstractmethod|async|await|class|classmethod|coroutine|exception|final|method"
                          r"|property|staticmethod|attribute|data)\s+)+")
STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}


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


# ---------------------------------------------------------------- JSONL files

def read_jsonl(path, repair=True):
    """The records of a JSONL file. A torn last line (a run killed while
    writing) is cut off the file; a bad line elsewhere is an error."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    recs, pos = [], 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl
        line = data[pos:end]
        if line.strip():
            try:
                recs.append(json.loads(line))
            except ValueError:
                if nl < 0 or not data[nl + 1:].strip():
                    if repair:
                        say(f"  {os.path.basename(path)}: cutting a torn last line ({len(line)} bytes)")
                        with open(path, "r+b") as f:
                            f.truncate(pos)
                    break
                raise SystemExit(f"make-train-data: {path}: line {len(recs) + 1} is not JSON; "
                                 "fix or remove the file")
        if nl < 0:
            if repair and line.strip():  # a complete record without its newline
                with open(path, "ab") as f:
                    f.write(b"\n")
            break
        pos = nl + 1
    return recs


def write_jsonl_atomic(path, recs):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Manifest:
    def __init__(self, path):
        self.path = path
        self.d = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.d = json.load(f)

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.d, f, indent=1, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, self.path)


# ------------------------------------------------------- Spec-Bench exclusion

class Excluder:
    """Spec-Bench prompts (never trained on): a text is dropped when its
    normalized form equals one, contains one, or shares an 8-word run with one."""

    def __init__(self, files):
        self.files, self.texts = files, []
        for path in files:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        o = json.loads(line)
                    except ValueError:
                        self.texts.append(line)
                        continue
                    if isinstance(o, str):
                        self.texts.append(o)
                        continue
                    for k in ("turns", "prompt", "text", "question", "content"):
                        v = o.get(k) if isinstance(o, dict) else None
                        if isinstance(v, str):
                            self.texts.append(v)
                        elif isinstance(v, list):
                            self.texts += [t for t in v if isinstance(t, str)]
        self.norms = [n for n in (norm(t) for t in self.texts) if n]
        self.exact = set(self.norms)
        self.shingles = set()
        for n in self.norms:
            w = n.split()
            for i in range(len(w) - SHINGLE + 1):
                self.shingles.add(" ".join(w[i:i + SHINGLE]))

    def why(self, text):
        """None if the text may be used, else the reason it may not."""
        n = norm(text)
        if n in self.exact:
            return "same text"
        padded = " " + n + " "
        for d in self.norms:
            if len(d) >= 12 and (" " + d + " ") in padded:
                return "contains a Spec-Bench prompt"
        w = n.split()
        for i in range(len(w) - SHINGLE + 1):
            if " ".join(w[i:i + SHINGLE]) in self.shingles:
                return "shares 8 words in a row"
        return None


# ------------------------------------------------------------ chitchat-dataset

def chitchat_load(args):
    """(conversations dict, licence record) or (None, reason)."""
    if args.chitchat_json:
        with open(args.chitchat_json, encoding="utf-8") as f:
            return json.load(f), {"package": None, "file": args.chitchat_json,
                                  "license": "not checked (--chitchat-json)"}
    wdir = os.path.join(args.cache, "pip")
    wheels = sorted(glob.glob(os.path.join(wdir, "chitchat_dataset-*.whl")))
    if not wheels and not args.no_pip:
        os.makedirs(wdir, exist_ok=True)
        say(f"  pip download {CHITCHAT_PKG} -> {wdir}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--timeout", "20", "--retries", "1", "-q", "-d", wdir, CHITCHAT_PKG]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            return None, "pip download failed: " + " | ".join(r.stdout.strip().splitlines()[-2:])
        wheels = sorted(glob.glob(os.path.join(wdir, "chitchat_dataset-*.whl")))
    if not wheels:
        return None, f"no chitchat-dataset wheel in {wdir} (and --no-pip)"
    whl = wheels[-1]
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode("utf-8"), headersonly=True)
        lic_names = [n for n in names if re.search(r"\.dist-info/(LICEN[CS]E|COPYING)", n)]
        lic_text = z.read(lic_names[0]).decode("utf-8", "replace") if lic_names else ""
        data = json.loads(z.read("chitchat_dataset/dataset.json"))
    classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    lic = {"package": meta["Name"], "version": meta["Version"], "wheel": os.path.basename(whl),
           "license": meta.get("License"), "classifiers": classifiers,
           "license_file": " / ".join(l.strip() for l in lic_text.splitlines()[:3] if l.strip()),
           "home": meta.get("Home-page")}
    mit = lic["license"] == "MIT" and "License :: OSI Approved :: MIT License" in classifiers \
        and lic_text.startswith("MIT License")
    lic["verified"] = "MIT (License field, classifier and LICENSE file agree)" if mit else False
    if not mit:
        return None, f"chitchat-dataset's licence is not the expected MIT: {lic}"
    return data, lic


def chitchat_prompts(data):
    """The first turn of every conversation (its first speaker's messages
    joined) and the conversation starters the collectors gave."""
    out, starters = [], set()
    for cid in sorted(data):
        conv = data[cid]
        msgs = conv.get("messages") or []
        if msgs and msgs[0]:
            t = " ".join(u.get("text", "").strip() for u in msgs[0]).strip()
            if 2 <= len(t) <= 600:  # longer: a speaker who went on alone for long
                out.append((t, "first-turn"))
        s = conv.get("prompt")
        if isinstance(s, str) and s.strip() and s not in starters:
            starters.add(s)
            out.append((s.strip(), "starter"))
    return out


# ----------------------------------------------------- Python documentation

class DocParser(html.parser.HTMLParser):
    """The blocks of a Sphinx page's main part, in order: ("h", level, text),
    ("p", text), ("pre", text), ("dt", id, text)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks, self.main, self.cap, self.skip = [], 0, None, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if not self.main:
            if tag == "div" and a.get("role") == "main":
                self.main = 1
            return
        if tag == "div":
            self.main += 1
        if self.skip:
            if tag == self.skip[0]:
                self.skip[1] += 1
            return
        if tag in ("script", "style") or (tag == "a" and "headerlink" in (a.get("class") or "")):
            self.skip = [tag, 1]
            return
        if self.cap:
            if tag == self.cap["tag"]:
                self.cap["nest"] += 1
            elif tag == "br":
                self.cap["buf"].append("\n" if self.cap["kind"] == "pre" else " ")
            return
        kind = None
        if tag in ("h1", "h2", "h3", "h4"):
            kind = "h"
        elif tag in ("p", "pre"):
            kind = tag
        elif tag == "dt" and a.get("id"):
            kind = "dt"
        if kind:
            self.cap = {"kind": kind, "tag": tag, "nest": 1, "buf": [], "id": a.get("id")}

    def handle_endtag(self, tag):
        if not self.main:
            return
        if self.skip:
            if tag == self.skip[0]:
                self.skip[1] -= 1
                if self.skip[1] == 0:
                    self.skip = 0
            return
        if self.cap and tag == self.cap["tag"]:
            self.cap["nest"] -= 1
            if self.cap["nest"] == 0:
                c, self.cap = self.cap, None
                raw = "".join(c["buf"])
                if c["kind"] == "pre":
                    text = raw.strip("\n")
                else:
                    text = re.sub(r"\s+", " ", raw).strip()
                if text:
                    if c["kind"] == "h":
                        self.blocks.append(("h", int(c["tag"][1]), text))
                    elif c["kind"] == "dt":
                        self.blocks.append(("dt", c["id"], text))
                    else:
                        self.blocks.append((c["kind"], text))
        if tag == "div":
            self.main -= 1

    def handle_data(self, data):
        if self.main and self.cap and not self.skip:
            self.cap["buf"].append(data)


def pydoc_dir(args):
    if args.pydoc_dir:
        return args.pydoc_dir if os.path.isdir(args.pydoc_dir) else None
    for d in PYDOC_DIRS:
        if os.path.isdir(d):
            return d
    if args.no_apt:
        return None
    say("  apt-get install python3-doc")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "-q", "python3-doc"],
                ["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "python3-doc"]):
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        except OSError as e:
            say(f"  {cmd[0]}: {e}")
            return None
        if cmd[1] == "install" and r.returncode == 0:
            break
    for d in PYDOC_DIRS:
        if os.path.isdir(d):
            return d
    return None


def pick_files(files, n, seed, tag):
    files = sorted(files)
    if n and len(files) > n:
        rng = random.Random(f"{seed}:{tag}")
        files = sorted(rng.sample(files, n))
    return files


def words(s):
    return len(s.split())


def pydoc_extract(d, args):
    """(prompts, texts, licence) from the HTML documentation under d."""
    pages = []
    for p in glob.glob(os.path.join(d, "**", "*.html"), recursive=True):
        rel = os.path.relpath(p, d)
        if rel.startswith("_") or PYDOC_SKIP.match(rel):
            continue
        pages.append(rel)
    pages = pick_files(pages, args.sample_files, args.seed, "pydoc")
    parsed = []
    for rel in pages:
        with open(os.path.join(d, rel), encoding="utf-8", errors="replace") as f:
            p = DocParser()
            p.feed(f.read())
            p.close()
        parsed.append((rel, p.blocks))
    # headings used on many pages ("Examples", "Notes") are named with their page
    hcount = {}
    for _, blocks in parsed:
        for b in {b[2] for b in blocks if b[0] == "h"}:
            hcount[b] = hcount.get(b, 0) + 1
    prompts, texts = [], []
    for rel, blocks in parsed:
        title = next((b[2] for b in blocks if b[0] == "h"), rel)
        sections, cur = [], None
        for b in blocks:
            if b[0] == "h":
                cur = {"level": b[1], "title": b[2], "blocks": []}
                sections.append(cur)
            elif cur is not None:
                cur["blocks"].append(b)
        for s in sections:
            paras = [b[1] for b in s["blocks"] if b[0] == "p"]
            topic = s["title"] if hcount.get(s["title"], 0) < 3 or s["title"] == title \
                else f"{s['title']} ({title})"
            if any(words(p) >= 8 for p in paras):
                t = [f"Explain {topic} in Python.",
                     f"What should a Python programmer know about {topic}?",
                     f"Give an overview of {topic} in Python, with a short example."]
                prompts.append((t[int(unit(rel, topic) * len(t))], "section", rel))
            # raw text: the section as Markdown, cut at block boundaries
            parts = ["#" * s["level"] + " " + s["title"]]
            for b in s["blocks"]:
                if b[0] == "p":
                    parts.append(b[1])
                elif b[0] == "pre":
                    parts.append("```\n" + b[1] + "\n```")
                elif b[0] == "dt":
                    parts.append("`" + b[2] + "`")
            texts += [(c, "section", rel) for c in chunks(parts, args.max_text_chars) if len(c) >= 200]
        for i, b in enumerate(blocks):
            if b[0] == "dt" and re.match(r"^[A-Za-z_][\w.]*\.[A-Za-z_]\w*$", b[1]):
                name, sig = b[1], API_KEYWORDS.sub("", b[2]).strip()
                if sig.startswith(name.rsplit(".", 1)[1]) and not sig.startswith(name):
                    sig = name.rsplit(".", 1)[0] + "." + sig  # a method's dt names it without its class
                t = [f"What does `{name}` do in Python?",
                     f"Show how to use `{name}` in Python with a short example.",
                     f"Explain the Python API `{sig}`."]
                prompts.append((t[int(unit(rel, name) * len(t))], "api", rel))
            elif b[0] == "p" and 25 <= words(b[1]) <= 220:
                t = ["Explain this passage from the Python documentation in simpler words:\n\n",
                     "Summarize this passage from the Python documentation:\n\n",
                     "Give an example that illustrates this passage from the Python documentation:\n\n"]
                prompts.append((t[int(unit(rel, b[1]) * len(t))] + b[1], "paragraph", rel))
    return prompts, texts, len(pages)


def pydoc_licence(d):
    lic = {"dir": os.path.realpath(d), "license": "PSF License Agreement (Python documentation); "
           "code examples in it also under the Zero-Clause BSD licence"}
    try:
        with open(os.path.join(d, "license.html"), encoding="utf-8", errors="replace") as f:
            page = re.sub(r"\s+", " ", re.sub(r"<[^>]*>", "", f.read()))
        lic["verified"] = ("license.html: 'Python software and documentation are licensed under the "
                           "PSF License Agreement'") if "documentation are licensed under the PSF License" \
            in page else False
    except OSError:
        lic["verified"] = False
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}", "python3-doc"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if r.returncode == 0:
            lic["package"] = r.stdout.strip()
            lic["copyright"] = "/usr/share/doc/python3-doc/copyright"
    except OSError:
        pass
    return lic


def chunks(parts, limit):
    """Join parts with blank lines into pieces of at most `limit` characters
    (a part longer than that is cut at line ends)."""
    out, cur = [], ""
    for p in parts:
        while len(p) > limit:
            cut = p.rfind("\n", 0, limit)
            cut = cut if cut > limit // 2 else limit
            if cur:
                out.append(cur)
                cur = ""
            out.append(p[:cut])
            p = p[cut:].lstrip("\n")
        if cur and len(cur) + 2 + len(p) > limit:
            out.append(cur)
            cur = ""
        cur = cur + "\n\n" + p if cur else p
    if cur:
        out.append(cur)
    return out


# ------------------------------------------------------ Python standard library

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


def extra_prompts(path):
    """--extra-prompts: JSONL ({"prompt"} or {"turns"}) or plain lines."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                o = json.loads(line)
            except ValueError:
                out.append((line, "extra"))
                continue
            if isinstance(o, dict):
                if isinstance(o.get("prompt"), str):
                    out.append((o["prompt"], "extra"))
                elif isinstance(o.get("turns"), list) and o["turns"]:
                    out.append((o["turns"][0], "extra"))
            elif isinstance(o, str):
                out.append((o, "extra"))
    return out


# ------------------------------------------------------------------- sources

class Sources:
    """Reads each source once per run, when a stage needs it."""

    def __init__(self, args, manifest):
        self.args, self.m = args, manifest
        self.cache = {}

    def licences(self):
        return self.m.d.setdefault("licences", {})

    def get(self, name):
        if name in self.cache:
            return self.cache[name]
        a, t0, res = self.args, time.time(), None
        if name == "chitchat":
            data, lic = chitchat_load(a)
            if data is None:
                say(f"  chitchat: skipped: {lic}")
            else:
                self.licences()["chitchat"] = lic
                res = ([(t, k, "dataset.json") for t, k in chitchat_prompts(data)], [])
                say(f"  chitchat: {len(data)} conversations, {len(res[0])} first turns and starters "
                    f"({lic.get('package') or lic.get('file')} {lic.get('version') or ''}, licence "
                    f"{lic.get('license')}) [{time.time() - t0:.1f} s]")
        elif name == "pydoc":
            d = pydoc_dir(a)
            if not d:
                say("  pydoc: skipped: no Python HTML documentation (apt-get install python3-doc)"
                    + (" and --no-apt" if a.no_apt else ""))
            else:
                p, t, n = pydoc_extract(d, a)
                self.licences()["pydoc"] = pydoc_licence(d)
                res = (p, t)
                say(f"  pydoc: {n} pages of {d}: {len(p)} prompts, {len(t)} text pieces [{time.time() - t0:.1f} s]")
        elif name == "pystdlib":
            d = stdlib_dir(a)
            if not d:
                say("  pystdlib: skipped: no standard library found")
            else:
                p, t, n = stdlib_extract(d, a)
                self.licences()["pystdlib"] = stdlib_licence(d)
                res = (p, t)
                say(f"  pystdlib: {n} files of {d}: {len(p)} prompts, {len(t)} functions [{time.time() - t0:.1f} s]")
        elif name == "extra":
            res = ([(t, k, a.extra_prompts) for t, k in extra_prompts(a.extra_prompts)], []) \
                if a.extra_prompts else None
            if res:
                say(f"  extra: {len(res[0])} prompts from {a.extra_prompts}")
        self.cache[name] = res
        return res


def interleave(groups, seed):
    """One list from several (deduplicated already): each group shuffled
    (seeded), then taken in turn so that any prefix holds the groups in equal
    shares ("extra" first)."""
    order = []
    if "extra" in groups:
        order += groups.pop("extra")
    lists = []
    for name in sorted(groups):
        g = list(groups[name])
        random.Random(f"{seed}:{name}").shuffle(g)
        lists.append(g)
    i = 0
    while any(lists):
        for g in lists:
            if i < len(g):
                order.append(g[i])
        i += 1
        lists = [g for g in lists if i < len(g)]
    return order


def filter_items(items, excl, seen, stats, max_chars):
    """Deduplicate (normalized text) and drop Spec-Bench overlaps; counts in stats."""
    kept = []
    for it in items:
        text = it["prompt"] if "prompt" in it else it["text"]
        src = stats.setdefault(it["source"], {"candidates": 0, "duplicates": 0, "spec_bench": 0,
                                              "too_long": 0, "kept": 0})
        src["candidates"] += 1
        if len(text) > max_chars:
            src["too_long"] += 1
            continue
        n = norm(text)
        if not n or n in seen:
            src["duplicates"] += 1
            continue
        why = excl.why(text) if excl else None
        if why:
            src["spec_bench"] += 1
            stats.setdefault("_dropped_examples", [])
            if len(stats["_dropped_examples"]) < 10:
                stats["_dropped_examples"].append({"source": it["source"], "why": why, "text": text[:160]})
            continue
        seen.add(n)
        src["kept"] += 1
        kept.append(it)
    return kept


# ------------------------------------------------------------------ stage a

def stage_prompts(args, m, srcs, excl):
    path = os.path.join(args.out, "prompts.jsonl")
    st = m.d.get("stages", {}).get("prompts")
    if st and st.get("done") and os.path.exists(path) and not args.redo_prompts:
        say(f"stage a (prompts): done already, {st['kept']} prompts in {path} (--redo-prompts rebuilds)")
        return
    say("stage a (prompts): reading the sources")
    groups = {}
    for name in ("extra", "chitchat", "pydoc", "pystdlib"):
        r = srcs.get(name)
        if r and r[0]:
            groups[name] = [{"id": f"{name}-{h12(name, norm(t))}", "source": name, "prompt": t.strip(),
                             "meta": {"kind": k, "from": f}} for t, k, f in r[0]]
    stats, seen = {}, set()
    kept = interleave({k: filter_items(v, excl, seen, stats, args.max_prompt_chars) for k, v in groups.items()},
                      args.seed)
    write_jsonl_atomic(path, kept)
    examples = stats.pop("_dropped_examples", [])
    dropped = sum(s["spec_bench"] for s in stats.values())
    m.d.setdefault("stages", {})["prompts"] = {
        "done": True, "kept": len(kept), "per_source": stats, "spec_bench_dropped": dropped,
        "spec_bench_dropped_examples": examples, "exclude_files": excl.files if excl else [],
        "max_prompt_chars": args.max_prompt_chars, "sample_files": args.sample_files}
    m.save()
    for name, s in sorted(stats.items()):
        say(f"  {name:9s} {s['candidates']:7d} candidates, {s['duplicates']:6d} duplicates, "
            f"{s['too_long']:5d} too long, {s['spec_bench']:3d} Spec-Bench overlaps dropped, {s['kept']:7d} kept")
    say(f"  {len(kept)} prompts -> {path}; {dropped} dropped for overlapping the Spec-Bench prompts")


# ------------------------------------------------------------------ stage c

def stage_text(args, m, srcs, excl):
    path = os.path.join(args.out, "text.jsonl")
    have = read_jsonl(path)
    if len(have) >= args.max_raw:
        say(f"stage c (text): done already, {len(have)} records in {path} (--max-raw {args.max_raw})")
        return
    say(f"stage c (text): {len(have)} records present, up to {args.max_raw}")
    groups = {}
    for name in ("pydoc", "pystdlib"):
        r = srcs.get(name)
        if r and r[1]:
            groups[name] = [{"id": f"{name}-t-{h12(name, t)}", "source": name, "text": t,
                             "meta": {"kind": k, "from": f}} for t, k, f in r[1]]
    seen = {norm(r["text"]) for r in have}
    stats = {}
    items = interleave({k: filter_items(v, excl, seen, stats, args.max_text_chars * 2) for k, v in groups.items()},
                       args.seed)
    new = items[:args.max_raw - len(have)]
    with open(path, "a", encoding="utf-8") as f:
        for r in new:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    stats.pop("_dropped_examples", None)
    dropped = sum(s["spec_bench"] for s in stats.values())
    m.d.setdefault("stages", {})["text"] = {"records": len(have) + len(new), "max_raw": args.max_raw,
                                            "available": len(items) + len(have),
                                            "spec_bench_dropped": dropped}
    m.save()
    say(f"  +{len(new)} records -> {path} ({len(have) + len(new)} in all, {len(items) + len(have)} available; "
        f"{dropped} dropped for overlapping the Spec-Bench prompts)")


# ------------------------------------------------------------------ stage b

class Server:
    """`specdec serve` on a free port (--port 0: the port is read from its log)."""

    def __init__(self, args):
        cmd = [args.bin, "serve", "-m", args.model, "--port", str(args.port), "--parallel", str(args.parallel),
               "--fast-prompt", "--max-tokens", str(max(args.max_tokens, 1)), "-c", str(args.ctx),
               "--queue", str(max(16, 2 * args.parallel))]
        if args.threads:
            cmd += ["-t", str(args.threads)]
        say("  " + " ".join(cmd))
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)  # Ctrl-C reaches us alone; we stop it
        self.log, self.port = [], None
        ready = threading.Event()

        def drain():
            for line in self.p.stderr:
                self.log.append(line.rstrip("\n"))
                del self.log[:-50]
                mm = re.search(r"listening on http://[^:]+:(\d+)", line)
                if mm:
                    self.port = int(mm.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        try:
            ready.wait(180)
        except BaseException:  # Ctrl-C while it loads
            self.stop()
            raise
        if not self.port:
            self.stop()
            raise SystemExit("make-train-data: the server did not start: " + " | ".join(self.log[-5:]))
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def post_json(url, path, body, timeout=120):
    import urllib.request
    req = urllib.request.Request(url + path, data=json.dumps(body).encode("utf-8"),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def stage_answers(args, m, stop):
    """Returns the server (still running, for token counts) or None."""
    ppath = os.path.join(args.out, "prompts.jsonl")
    cpath = os.path.join(args.out, "chat.jsonl")
    fpath = os.path.join(args.out, "failed.jsonl")
    if not os.path.exists(ppath):
        raise SystemExit(f"make-train-data: {ppath} missing: run stage a (prompts) first")
    prompts = read_jsonl(ppath, repair=False)[:args.max_prompts]
    done = {r.get("meta", {}).get("prompt_id") for r in read_jsonl(cpath)}
    failed = {r.get("prompt_id") for r in read_jsonl(fpath)} if not args.retry_failed else set()
    todo = [p for p in prompts if p["id"] not in done and p["id"] not in failed]
    say(f"stage b (answers): {len(prompts)} prompts wanted (--max-prompts {args.max_prompts}), "
        f"{len(prompts) - len(todo)} answered or failed before, {len(todo)} to answer")
    if not todo:
        return None
    try:
        import openai  # noqa: F401
    except ImportError:
        raise SystemExit("make-train-data: stage b needs the openai package (python3 -m pip install openai)")
    for what, p in (("binary", args.bin), ("model", args.model)):
        if not os.path.exists(p):
            raise SystemExit(f"make-train-data: {what} {p} not found"
                             + (" (make build/specdec)" if what == "binary" else " (--model FILE)"))
    srv = Server(args)
    try:
        return answer_all(args, m, stop, srv, prompts, todo, cpath, fpath)
    except BaseException:
        rc = srv.stop()
        say(f"  server stopped (exit status {rc})")
        raise


def answer_all(args, m, stop, srv, prompts, todo, cpath, fpath):
    """Sends the prompts to the server; returns it still running."""
    import openai
    from concurrent.futures import ThreadPoolExecutor
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=600, max_retries=1)
    model_id = client.models.list().data[0].id
    lock = threading.Lock()
    counts = {"new": 0, "greedy": 0, "sampled": 0, "tokens": 0, "prompt_tokens": 0, "failed": 0, "empty": 0}
    t0 = time.time()
    cf = open(cpath, "a", encoding="utf-8")
    ff = open(fpath, "a", encoding="utf-8")

    def answer(p):
        if stop.is_set():
            return
        sampled = unit(str(args.seed), p["id"], "mode") < args.sampled_share
        seed = int(unit(str(args.seed), p["id"], "seed") * 2 ** 31)
        kw = dict(model=model_id, messages=[{"role": "user", "content": p["prompt"]}],
                  max_tokens=args.max_tokens, temperature=0.7 if sampled else 0.0)
        if sampled:
            kw["seed"] = seed
        try:
            r = client.chat.completions.create(**kw)
            text = r.choices[0].message.content or ""
            err = None if text.strip() else "empty answer"
        except Exception as e:  # noqa: BLE001 - any failure is recorded and the run goes on
            if stop.is_set():
                return
            r, text, err = None, "", f"{type(e).__name__}: {e}"
        with lock:
            if stop.is_set():
                return
            if err:
                counts["failed" if r is None else "empty"] += 1
                ff.write(json.dumps({"prompt_id": p["id"], "error": err[:300]}) + "\n")
                ff.flush()
                return
            u = r.usage
            rec = {"id": p["id"] + ("-s" if sampled else "-g"), "source": p["source"],
                   "messages": [{"role": "user", "content": p["prompt"]},
                                {"role": "assistant", "content": text}],
                   "meta": {"prompt_id": p["id"], "kind": p.get("meta", {}).get("kind"),
                            "mode": "sampled" if sampled else "greedy",
                            "temperature": kw["temperature"], "seed": seed if sampled else None,
                            "max_tokens": args.max_tokens, "finish_reason": r.choices[0].finish_reason,
                            "prompt_tokens": u.prompt_tokens if u else None,
                            "completion_tokens": u.completion_tokens if u else None,
                            "model": os.path.basename(args.model)}}
            cf.write(json.dumps(rec, ensure_ascii=False) + "\n")
            cf.flush()
            counts["new"] += 1
            counts["sampled" if sampled else "greedy"] += 1
            counts["tokens"] += (u.completion_tokens or 0) if u else 0
            counts["prompt_tokens"] += (u.prompt_tokens or 0) if u else 0

    pool = ThreadPoolExecutor(max_workers=args.parallel)
    futs = [pool.submit(answer, p) for p in todo]
    interrupted = False
    last = 0.0
    try:
        while True:
            n_done = sum(f.done() for f in futs)
            now = time.time()
            if n_done == len(futs) or now - last >= args.progress:
                last = now
                el = max(now - t0, 1e-6)
                rate = counts["new"] / el * 60
                eta = (len(todo) - n_done) / (n_done / el) if n_done else 0
                say(f"  answers {len(prompts) - len(todo) + counts['new']}/{len(prompts)}: +{counts['new']} "
                    f"(greedy {counts['greedy']}, sampled {counts['sampled']}, failed "
                    f"{counts['failed'] + counts['empty']}) {rate:.1f}/min, {counts['tokens'] / el:.1f} tok/s, "
                    f"{el:.0f} s, ETA {eta / 60:.1f} min")
            if n_done == len(futs):
                break
            time.sleep(0.5)
        for f in futs:
            f.result()
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        say("  interrupted: stopping (every finished answer is already in chat.jsonl)")
    el = time.time() - t0
    pool.shutdown(wait=not interrupted, cancel_futures=True)
    with lock:
        cf.flush()
        os.fsync(cf.fileno())
        cf.close()
        ff.close()
    run = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "answers": counts["new"], "greedy": counts["greedy"],
           "sampled": counts["sampled"], "failed": counts["failed"], "empty": counts["empty"],
           "completion_tokens": counts["tokens"], "prompt_tokens": counts["prompt_tokens"],
           "seconds": round(el, 1), "answers_per_min": round(counts["new"] / el * 60, 2) if el else None,
           "tokens_per_s": round(counts["tokens"] / el, 2) if el else None, "parallel": args.parallel,
           "max_tokens": args.max_tokens, "model": os.path.basename(args.model), "cores": os.cpu_count(),
           "interrupted": interrupted}
    m.d.setdefault("runs", []).append(run)
    m.save()
    say(f"  this run: {counts['new']} answers in {el:.0f} s = {run['answers_per_min']}/min, "
        f"{counts['tokens']} tokens = {run['tokens_per_s']} tok/s (parallel {args.parallel}, {os.cpu_count()} cores)")
    if interrupted:
        raise KeyboardInterrupt
    return srv


# ------------------------------------------------------------------ summary

def summary(args, m, srv):
    tpath = os.path.join(args.out, "tokens.json")
    tok = {}
    if os.path.exists(tpath):
        with open(tpath, encoding="utf-8") as f:
            tok = json.load(f)
    per, total_c, total_t, exact = {}, 0, 0, True
    for fname, kind in (("chat.jsonl", "chat"), ("text.jsonl", "text")):
        recs = read_jsonl(os.path.join(args.out, fname), repair=False)
        if kind == "text" and srv:
            missing = [r for r in recs if r["id"] not in tok]
            for r in missing:
                try:
                    tok[r["id"]] = len(post_json(srv.url, "/tokenize", {"content": r["text"]})["tokens"])
                except Exception:  # noqa: BLE001 - an estimate is used instead
                    break
            if missing:
                with open(tpath + ".tmp", "w", encoding="utf-8") as f:
                    json.dump(tok, f)
                os.replace(tpath + ".tmp", tpath)
        for r in recs:
            key = f"{kind}/{r['source']}"
            s = per.setdefault(key, {"records": 0, "chars": 0, "tokens": 0})
            s["records"] += 1
            if kind == "chat":
                c = sum(len(x["content"]) for x in r["messages"])
                mt = r.get("meta", {})
                t = (mt.get("prompt_tokens") or 0) + (mt.get("completion_tokens") or 0)
                if not mt.get("completion_tokens"):
                    t, exact = c // 4, False
            else:
                c = len(r["text"])
                t = tok.get(r["id"])
                if t is None:
                    t, exact = c // 4, False
            s["chars"] += c
            s["tokens"] += t
            total_c += c
            total_t += t
    sizes = {f: os.path.getsize(os.path.join(args.out, f)) for f in ("prompts.jsonl", "chat.jsonl", "text.jsonl")
             if os.path.exists(os.path.join(args.out, f))}
    m.d["summary"] = {"per": per, "chars": total_c, "tokens": total_t,
                      "tokens_exact": exact, "bytes": sizes}
    m.save()
    say(f"summary of {args.out}:")
    for k in sorted(per):
        s = per[k]
        say(f"  {k:16s} {s['records']:7d} records {s['chars']:11d} chars {s['tokens']:10d} tokens")
    say(f"  total {total_c} chars, {'' if exact else '~'}{total_t} tokens "
        f"({'server /tokenize and usage' if exact else 'some estimated as chars/4'}); files: "
        + ", ".join(f"{f} {b / 1e6:.1f} MB" for f, b in sizes.items()))
    for k, lic in sorted(m.d.get("licences", {}).items()):
        say(f"  licence {k}: {lic.get('license')}" + (f" [verified: {lic['verified']}]" if lic.get("verified")
                                                       else " [NOT verified]"))
    sp = m.d.get("stages", {}).get("prompts", {})
    if sp:
        say(f"  Spec-Bench: {sp.get('spec_bench_dropped')} prompts dropped (exclude: "
            f"{', '.join(sp.get('exclude_files') or ['none'])})")


# --------------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="make-train-data.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
        epilog="example:\n  python3 scripts/make-train-data.py --out /work/data/train --max-prompts 3000 "
               "--parallel 4\nsee docs/training-data.md")
    ap.add_argument("--out", default=os.path.join(ROOT, "data", "train"), help="output directory (default data/train)")
    ap.add_argument("--cache", default=os.path.join(ROOT, "data", "cache"),
                    help="where the downloaded wheel is kept (default data/cache)")
    ap.add_argument("--stages", default="a,b,c",
                    help="stages to run: a (prompts), b (answers), c (text) (default a,b,c; run in the order a, c, b; "
                         "'none': only the summary)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="target model (default models/SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--bin", default=DEFAULT_BIN, help="specdec binary (default build/specdec)")
    ap.add_argument("--max-prompts", type=int, default=3000, help="prompts to answer (the first N of prompts.jsonl; default 3000)")
    ap.add_argument("--sampled-share", type=float, default=0.3,
                    help="share of prompts answered at temperature 0.7 with a seed per prompt (default 0.3)")
    ap.add_argument("--max-tokens", type=int, default=256, help="answer length limit (default 256)")
    ap.add_argument("--parallel", type=int, default=4, help="server slots and concurrent requests (default 4)")
    ap.add_argument("--threads", type=int, default=0, help="server threads (default 0: all cores)")
    ap.add_argument("--ctx", type=int, default=2048, help="server KV cache per slot (default 2048)")
    ap.add_argument("--port", type=int, default=0, help="server port (default 0: any free port)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the shuffles, the sampled share and the sampling seeds (default 1)")
    ap.add_argument("--max-raw", type=int, default=6000, help="text records for teacher forcing (default 6000)")
    ap.add_argument("--max-text-chars", type=int, default=4000, help="longest text record (default 4000)")
    ap.add_argument("--max-code-chars", type=int, default=2500, help="longest function taken (default 2500)")
    ap.add_argument("--max-prompt-chars", type=int, default=3000, help="longest prompt kept (default 3000)")
    ap.add_argument("--sample-files", type=int, default=0,
                    help="read only N (seeded) documentation pages and N library files (default 0: all; for tests)")
    ap.add_argument("--exclude", action="append", default=None,
                    help=f"Spec-Bench prompt file(s) never to train on (default {DEFAULT_EXCLUDE})")
    ap.add_argument("--extra-prompts", help="more prompts (JSONL with \"prompt\" or \"turns\", or plain lines), put first")
    ap.add_argument("--chitchat-json", help="use this chitchat dataset.json instead of the PyPI package")
    ap.add_argument("--pydoc-dir", help="Python HTML documentation (default /usr/share/doc/python3-doc/html)")
    ap.add_argument("--stdlib-dir", help="Python standard library (default the newest /usr/lib/python3.N)")
    ap.add_argument("--no-pip", action="store_true", help="no pip download (use the cached wheel only)")
    ap.add_argument("--no-apt", action="store_true", help="no apt-get install (use python3-doc only if installed)")
    ap.add_argument("--offline", action="store_true", help="--no-pip and --no-apt")
    ap.add_argument("--redo-prompts", action="store_true", help="rebuild prompts.jsonl (answers are kept: ids are content hashes)")
    ap.add_argument("--retry-failed", action="store_true", help="answer again prompts that failed before")
    ap.add_argument("--tokenize", action="store_true",
                    help="count the text records' tokens with the server's /tokenize even when stage b does not "
                         "run (starts the server); otherwise those not counted before are estimated as chars/4")
    ap.add_argument("--progress", type=float, default=10, help="seconds between progress lines (default 10)")
    a = ap.parse_args(argv)
    if a.offline:
        a.no_pip = a.no_apt = True
    st = set()
    for s in a.stages.split(","):
        s = s.strip()
        if s in ("", "none"):
            continue
        s = {"prompts": "a", "answers": "b", "text": "c"}.get(s, s)
        if s not in ("a", "b", "c"):
            ap.error(f"--stages: unknown stage '{s}' (a, b, c)")
        st.add(s)
    a.stage_set = st
    if not 0 <= a.sampled_share <= 1:
        ap.error("--sampled-share must be in [0, 1]")
    for k in ("max_prompts", "max_raw", "max_tokens", "parallel"):
        if getattr(a, k) < (1 if k in ("max_tokens", "parallel") else 0):
            ap.error(f"--{k.replace('_', '-')} too small")
    if a.exclude is None:
        a.exclude = [DEFAULT_EXCLUDE]
    a.exclude = [e for e in a.exclude if e]
    for e in a.exclude:
        if not os.path.isfile(e):
            ap.error(f"Spec-Bench prompt file {e} not found: pass --exclude FILE (--exclude '' builds without "
                     "the check, which the project never does)")
    return a


def on_sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, on_sigterm)
    m = Manifest(os.path.join(args.out, "manifest.json"))
    excl = Excluder(args.exclude) if args.exclude else None
    if excl:
        say(f"Spec-Bench exclusion: {len(excl.norms)} prompts from {', '.join(args.exclude)}")
    else:
        say("warning: no Spec-Bench exclusion file")
    srcs = Sources(args, m)
    srv = None
    t0 = time.time()
    try:
        if "a" in args.stage_set:
            stage_prompts(args, m, srcs, excl)
        if "c" in args.stage_set:
            stage_text(args, m, srcs, excl)
        if "b" in args.stage_set:
            srv = stage_answers(args, m, stop)
        if not srv and args.tokenize and os.path.exists(os.path.join(args.out, "text.jsonl")):
            say("counting tokens: starting the server for /tokenize")
            srv = Server(args)
        summary(args, m, srv)
    except KeyboardInterrupt:
        say(f"interrupted after {time.time() - t0:.0f} s; rerun the same command to continue")
        return 130
    finally:
        if srv:
            rc = srv.stop()
            say(f"server stopped (exit status {rc})")
    say(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
