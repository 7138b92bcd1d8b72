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
This script is the command line; scripts/traindata/ beside it does the work
(a module per source and stage). See docs/training-data.md.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))  # scripts/traindata, from any cwd
from traindata import say  # noqa: E402
from traindata.answers import Server, post_json, stage_answers  # noqa: E402
from traindata.jsonl import Manifest, read_jsonl  # noqa: E402
from traindata.prompts import Excluder, Sources, stage_prompts  # noqa: E402
from traindata.raw import stage_text  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_BIN = os.path.join(ROOT, "build", "specdec")
DEFAULT_EXCLUDE = os.path.normpath(os.path.join(ROOT, "..", "shared", "prompts", "dev.jsonl"))


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
    ap.add_argument("--sources", default="", help="stage b: answer only prompts of these sources (comma-separated: "
                    "chitchat, pydoc, pystdlib, tasks, tasks2, extra); --max-prompts then counts within them. "
                    "tasks2 (coding, reasoning, summaries, questions about a passage; added 2026-11-28) comes "
                    "after every other prompt in the list: --sources tasks2 answers it alone")
    ap.add_argument("--sampled-share", type=float, default=0.3,
                    help="share of prompts answered at temperature 0.7 with a seed per prompt (default 0.3)")
    ap.add_argument("--max-tokens", type=int, default=256, help="answer length limit (default 256)")
    ap.add_argument("--parallel", type=int, default=4, help="server slots and concurrent requests (default 4)")
    ap.add_argument("--threads", type=int, default=0, help="server threads (default 0: all cores)")
    ap.add_argument("--ctx", type=int, default=2048, help="server KV cache per slot (default 2048)")
    ap.add_argument("--method", default="ar",
                    help="the server's speculation method (default ar, no drafts: the answers are the same with any lossless "
                         "method, and a batch of slots is fastest without drafts on a CPU)")
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
