"""Stage a (prompts.jsonl) and the sources it reads: chitchat-dataset (PyPI),
the Python documentation (pydoc_pages.py), the standard library
(stdlib_funcs.py), generated instructions (tasks.py) and --extra-prompts;
deduplication and the Spec-Bench exclusion, which stage c (raw.py) uses too."""
import email.parser
import glob
import json
import os
import random
import re
import subprocess
import sys
import time
import zipfile

from . import h12, norm, say
from .jsonl import write_jsonl_atomic
from .pydoc_pages import pydoc_dir, pydoc_extract, pydoc_licence
from .stdlib_funcs import stdlib_dir, stdlib_extract, stdlib_licence
from .tasks import tasks_prompts

CHITCHAT_PKG = "chitchat-dataset==0.9.0"
SHINGLE = 8  # words: a candidate sharing any 8-word run with a Spec-Bench prompt is dropped


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


# ------------------------------------------------------------------- sources

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
        elif name == "tasks":
            cc = self.get("chitchat")
            pd = self.get("pydoc")
            chit = [t for t, k, _ in cc[0] if k == "first-turn"] if cc else []
            paras = [t.split("\n\n", 1)[1] for t, k, _ in pd[0] if k == "paragraph" and "\n\n" in t] if pd else []
            old, more = tasks_prompts(chit, paras, a.seed)
            res = (old, [])
            self.cache["tasks2"] = (more, [])
            say(f"  tasks: {len(old)} generated instructions (writing, math, translation, rewriting, role play, "
                f"extraction; {len(chit)} chitchat turns and {len(paras)} documentation paragraphs to draw on); "
                f"tasks2: {len(more)} more (coding, reasoning, summary, passage-qa)")
        elif name == "tasks2":
            self.get("tasks")
            return self.cache.get("tasks2")
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
    for name in ("extra", "chitchat", "pydoc", "pystdlib", "tasks", "tasks2"):
        r = srcs.get(name)
        if r and r[0]:
            groups[name] = [{"id": f"{name}-{h12(name, norm(t))}", "source": name, "prompt": t.strip(),
                             "meta": {"kind": k, "from": f}} for t, k, f in r[0]]
    stats, seen = {}, set()
    late = groups.pop("tasks2", [])
    kept = interleave({k: filter_items(v, excl, seen, stats, args.max_prompt_chars) for k, v in groups.items()},
                      args.seed)
    # the sources added later (tasks2, 2026-11-28) come after the rest, shuffled,
    # so that the list's earlier prompts keep their places (the answers in
    # data/corpus/ and the recipes' --max-prompts prefixes refer to them);
    # stage b's --sources answers them without the prompts before them
    if late:
        late = filter_items(late, excl, seen, stats, args.max_prompt_chars)
        random.Random(f"{args.seed}:tasks2").shuffle(late)
        kept += late
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
