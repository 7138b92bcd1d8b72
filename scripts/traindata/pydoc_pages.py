"""The Python HTML documentation (Debian's python3-doc, PSF licence): prompts
about its sections, APIs and paragraphs, and its sections as Markdown text."""
import glob
import html.parser
import os
import re
import subprocess

from . import pick_files, say, unit

PYDOC_DIRS = ["/usr/share/doc/python3-doc/html", "/usr/share/doc/python3/html"]
# documentation pages that are not prose about Python (indexes, legal text, the change log)
PYDOC_SKIP = re.compile(r"^(genindex.*|py-modindex|search|contents|copyright|license|bugs|about|download"
                        r"|whatsnew/changelog)\.html$")
# what a signature line of the documentation starts with before the name
API_KEYWORDS = re.compile(r"^((abstractmethod|async|await|class|classmethod|coroutine|exception|final|method"
                          r"|property|staticmethod|attribute|data)\s+)+")


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
