#!/usr/bin/env python3
"""test_train_data.py - scripts/make-train-data.py end to end on a tiny budget
(a few documentation pages and library files, a handful of prompts answered
with 8 tokens by the default model): the records are valid JSONL of the
trainer's two kinds, prompts planted from the exclusion file
(tests/data/exclude-prompts.jsonl: 16 prompts in the Spec-Bench format,
written for this test; ../shared/prompts/dev.jsonl is excluded as well where
it is there) - verbatim, re-cased, embedded in a longer text, sharing 8 words
- are dropped and counted, a second run adds nothing and starts no server, a
larger budget continues without touching what is there, a torn last line is
repaired, Ctrl-C keeps every finished answer and stops the server, and the
licences are recorded.

Prints PASS/FAIL/SKIP lines (scripts/run-tests.sh counts them). Needs
build/specdec with the server, the default model (SPECDEC_MODEL another, with a
chat template: the tiny stories260K model has none) and the `openai` package;
otherwise every case is skipped with the reason.
The network is not needed: apt is never run (--no-apt; the documentation case
is skipped when python3-doc is not installed) and chitchat-dataset comes from
data/cache when an earlier run downloaded it (else one `pip download` is
tried, and its case is skipped when that fails).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402
SCRIPT = os.path.join(ROOT, "scripts", "make-train-data.py")
BIN = os.environ.get("SPECDEC_BIN", os.path.join(ROOT, "build", "specdec"))
MODEL = os.environ.get("SPECDEC_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
EXCLUDE = os.path.join(ROOT, "tests", "data", "exclude-prompts.jsonl")
SHARED = os.environ.get("SD_SHARED") or os.path.join(ROOT, "..", "shared")
DEV = os.path.normpath(os.path.join(SHARED, "prompts", "dev.jsonl"))
EXCLUDES = [EXCLUDE] + ([DEV] if os.path.exists(DEV) else [])
CACHE = os.path.join(ROOT, "data", "cache")

CASES = ["first_run", "records_valid", "spec_bench_excluded", "rerun_adds_nothing", "rerun_continues",
         "torn_line_repaired", "foreign_answers_warned", "interrupt_keeps_work", "licence_pystdlib",
         "source_chitchat", "source_pydoc", "source_tasks"]


def skip_all(why):
    for c in CASES:
        print(f"SKIP {c}: {why}")
    sys.exit(0)


def norm(s):
    return " ".join(re.findall(r"[^\W_]+", s.lower()))


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


def run(out, *extra, timeout=300):
    cmd = [sys.executable, SCRIPT, "--out", out, "--cache", CACHE, "--bin", BIN, "--model", MODEL,
           "--no-apt", "--sample-files", "4", "--max-tokens", "8", "--parallel", "2", "--sampled-share", "0.5",
           "--progress", "1", "--extra-prompts", os.path.join(out, "..", "planted.jsonl")] \
        + [a for e in EXCLUDES for a in ("--exclude", e)] + list(extra)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return r.returncode, r.stdout


def check_records(out):
    """None if chat.jsonl and text.jsonl are valid, else what is wrong."""
    ids = set()
    for fname, kind in (("chat.jsonl", "chat"), ("text.jsonl", "text")):
        for i, ln in enumerate(lines(os.path.join(out, fname))):
            where = f"{fname}:{i + 1}"
            try:
                r = json.loads(ln)
            except ValueError:
                return f"{where} is not JSON: {ln[:80]!r}"
            if not ln.endswith(b"\n"):
                return f"{where} has no newline"
            if not isinstance(r.get("id"), str) or r["id"] in ids:
                return f"{where}: missing or repeated id"
            ids.add(r["id"])
            if r.get("source") not in ("extra", "chitchat", "pydoc", "pystdlib", "tasks", "tasks2"):
                return f"{where}: source {r.get('source')!r}"
            if kind == "chat":
                m = r.get("messages")
                if not (isinstance(m, list) and len(m) == 2 and m[0].get("role") == "user"
                        and m[1].get("role") == "assistant"
                        and all(isinstance(x.get("content"), str) and x["content"].strip() for x in m)):
                    return f"{where}: bad messages {m!r:.200}"
                if r.get("meta", {}).get("mode") not in ("greedy", "sampled"):
                    return f"{where}: meta.mode {r.get('meta')!r:.200}"
                if "text" in r:
                    return f"{where}: a chat record with text"
            else:
                if not (isinstance(r.get("text"), str) and r["text"].strip()) or "messages" in r:
                    return f"{where}: bad text record"
    return None


def main():
    if not os.path.exists(MODEL):
        skip_all(f"model {MODEL} not found (scripts/fetch-models.sh); the tiny stories260K model has no chat "
                 "template to answer chat prompts with")
    if not os.access(BIN, os.X_OK):
        skip_all(f"{BIN} not built")
    h = subprocess.run([BIN, "serve", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if h.returncode != 0:
        skip_all("specdec was built without the server: " + h.stderr.decode().strip())
    try:
        import openai  # noqa: F401
    except ImportError:
        skip_all("the openai package is not installed (python3 -m pip install openai)")
    with open(EXCLUDE, encoding="utf-8") as f:
        planted_from = [json.loads(l)["turns"][0] for l in f if l.strip()]
    dev = []
    if os.path.exists(DEV):
        with open(DEV, encoding="utf-8") as f:
            dev = [json.loads(l)["turns"][0] for l in f if l.strip()]
    tmp = tempfile.mkdtemp(prefix="test_train_data.")
    try:
        cases(tmp, planted_from, planted_from + dev)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(exit_status())


def cases(tmp, src, dev):
    """src: the prompts of the exclusion file to plant; dev: every excluded prompt."""
    t0 = time.time()
    out = os.path.join(tmp, "train")
    w4 = src[3].split()
    planted = [src[6],                                        # verbatim
               src[0].upper() + "!!",                         # other case and punctuation
               "Please help me with this: " + src[14] + " Thank you.",  # embedded in a longer text
               " ".join(w4[:8]) + " while it is raining hard outside"]  # 8 words in a row shared
    innocent = ["What is a Python list comprehension?", "Tell me a fun fact about owls."]
    with open(os.path.join(tmp, "planted.jsonl"), "w", encoding="utf-8") as f:
        for p in innocent[:1] + planted + innocent[1:]:
            f.write(json.dumps({"prompt": p}) + "\n")

    rc, log = run(out, "--max-prompts", "6", "--max-raw", "8")
    ok = rc == 0 and len(lines(os.path.join(out, "chat.jsonl"))) == 6 \
        and len(lines(os.path.join(out, "text.jsonl"))) == 8
    report("first_run", ok, f"exit {rc}, {len(lines(os.path.join(out, 'chat.jsonl')))} chat and "
           f"{len(lines(os.path.join(out, 'text.jsonl')))} text records; log tail: {log[-1500:]}")
    if rc != 0:
        for c in CASES[1:]:
            print(f"SKIP {c}: the first run failed")
        return
    why = check_records(out)
    report("records_valid", why is None, why or "")

    # Spec-Bench: the planted prompts are gone (and counted), the innocent ones answered
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        man = json.load(f)
    prompts = [json.loads(l)["prompt"] for l in lines(os.path.join(out, "prompts.jsonl"))]
    chats = [json.loads(l) for l in lines(os.path.join(out, "chat.jsonl"))]
    texts = [json.loads(l)["text"] for l in lines(os.path.join(out, "text.jsonl"))]
    dev_n = [norm(d) for d in dev]
    leaked = [p for p in prompts + texts + [c["messages"][0]["content"] for c in chats]
              if any(d in norm(p) for d in dev_n)]
    leaked += [p for p in prompts if norm(p) in {norm(x) for x in planted}]
    answered = {c["messages"][0]["content"] for c in chats}
    st = man["stages"]["prompts"]
    ok = not leaked and all(i in answered for i in innocent) and st["per_source"]["extra"]["spec_bench"] == 4 \
        and st["spec_bench_dropped"] >= 4 and re.search(r"\b\d+ dropped for overlapping the Spec-Bench", log)
    report("spec_bench_excluded", ok, f"leaked {leaked!r:.300}; innocent answered: "
           f"{[i in answered for i in innocent]}; manifest: {st['per_source'].get('extra')}")

    # the same command again: nothing added, no server started
    before = {f: lines(os.path.join(out, f)) for f in ("prompts.jsonl", "chat.jsonl", "text.jsonl")}
    rc, log2 = run(out, "--max-prompts", "6", "--max-raw", "8")
    after = {f: lines(os.path.join(out, f)) for f in before}
    report("rerun_adds_nothing", rc == 0 and before == after and " serve -m " not in log2
           and "0 to answer" in log2, f"exit {rc}, changed: {[f for f in before if before[f] != after[f]]}; "
           f"log: {log2[-800:]}")

    # a larger budget continues: what is there stays byte for byte
    rc, log3 = run(out, "--max-prompts", "9", "--max-raw", "10")
    chat3, text3 = lines(os.path.join(out, "chat.jsonl")), lines(os.path.join(out, "text.jsonl"))
    pids = [json.loads(l)["meta"]["prompt_id"] for l in chat3]
    ok = rc == 0 and len(chat3) == 9 and chat3[:6] == before["chat.jsonl"] and len(text3) == 10 \
        and text3[:8] == before["text.jsonl"] and len(set(pids)) == 9 and check_records(out) is None
    report("rerun_continues", ok, f"exit {rc}, {len(chat3)} chat, {len(text3)} text records, "
           f"{len(set(pids))} distinct prompts; {check_records(out)}; log: {log3[-800:]}")

    # a run killed while writing left half a line: it is cut, the rest kept
    with open(os.path.join(out, "chat.jsonl"), "ab") as f:
        f.write(b'{"id": "torn-by-a-kill", "source": "py')
    rc, log4 = run(out, "--max-prompts", "10", "--max-raw", "10")
    chat4 = lines(os.path.join(out, "chat.jsonl"))
    report("torn_line_repaired", rc == 0 and len(chat4) == 10 and chat4[:9] == chat3 and check_records(out) is None,
           f"exit {rc}, {len(chat4)} records; {check_records(out)}; log: {log4[-800:]}")

    # answers to another prompt list (the committed shards after a source changed): said before answering
    other = os.path.join(tmp, "other")
    os.makedirs(other)
    for f in ("prompts.jsonl", "manifest.json"):
        shutil.copy(os.path.join(out, f), other)
    with open(os.path.join(other, "chat.jsonl"), "wb") as f:
        for i, l in enumerate(chat4):
            r = json.loads(l)
            r["id"], r["meta"]["prompt_id"] = f"gone-{i}", f"gone-{i}"
            f.write((json.dumps(r) + "\n").encode())
    rc, log6 = run(other, "--stages", "b", "--max-prompts", "2")
    report("foreign_answers_warned", rc == 0 and "10 answers to prompts that are not among the first 2" in log6
           and len(lines(os.path.join(other, "chat.jsonl"))) == 12, f"exit {rc}; log: {log6[-800:]}")

    # Ctrl-C while answering: exit 130, finished answers kept, the server stopped
    # (answers of 64 tokens to 390 new prompts, so that they cannot all be
    # done before the signal lands: with 8 tokens, and once with 50 prompts on
    # a loaded host, the run finished first)
    cmd = [sys.executable, SCRIPT, "--out", out, "--cache", CACHE, "--bin", BIN, "--model", MODEL, "--no-apt",
           "--sample-files", "4", "--max-tokens", "64", "--parallel", "2", "--max-prompts", "400", "--max-raw", "10",
           "--progress", "1", "--extra-prompts", os.path.join(tmp, "planted.jsonl")] \
        + [a for e in EXCLUDES for a in ("--exclude", e)]
    # (Ctrl-C's default restored in the child: a shell's background job, as a CI runner may start it, ignores
    # SIGINT, and Python then never turns it into KeyboardInterrupt)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120   # only against a hang: a slow host may take a while to answer the first two
    while time.time() < deadline and len(lines(os.path.join(out, "chat.jsonl"))) < 12 and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    try:
        log5, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        log5, _ = p.communicate()
    chat5 = lines(os.path.join(out, "chat.jsonl"))
    m = re.search(r"serve -m .* --port 0", log5)
    ok = p.returncode == 130 and 12 <= len(chat5) < 400 and chat5[:10] == chat4 and check_records(out) is None \
        and "server stopped (exit status 0)" in log5 and m is not None
    report("interrupt_keeps_work", ok, f"exit {p.returncode}, {len(chat5)} records; {check_records(out)}; "
           f"log: {log5[-800:]}")

    lic = man.get("licences", {})
    report("licence_pystdlib", bool(lic.get("pystdlib", {}).get("verified")), f"{lic.get('pystdlib')}")
    srcs = {c["source"] for c in chats} | {json.loads(l)["source"] for l in lines(os.path.join(out, "prompts.jsonl"))}
    if "chitchat" in lic:
        report("source_chitchat", "chitchat" in srcs and lic["chitchat"].get("license") == "MIT"
               and bool(lic["chitchat"].get("verified")), f"{lic['chitchat']}")
    else:
        why = re.search(r"chitchat: skipped: (.*)", log)
        print(f"SKIP source_chitchat: chitchat-dataset could not be had: {why.group(1) if why else log[-300:]}")
    if "pydoc" in lic:
        report("source_pydoc", "pydoc" in srcs and bool(lic["pydoc"].get("verified")), f"{lic['pydoc']}")
    else:
        print("SKIP source_pydoc: python3-doc is not installed (apt-get install python3-doc; the test runs "
              "no apt)")
    # the generated instructions: writing, arithmetic, coding and reasoning
    # always; translation, rewriting and role play draw on chitchat,
    # extraction, summaries and passage questions on the documentation
    kinds, order = {}, []
    for ln in lines(os.path.join(out, "prompts.jsonl")):
        r = json.loads(ln)
        order.append(r["source"])
        if r["source"] in ("tasks", "tasks2"):
            kinds.setdefault(r["meta"]["kind"], []).append(r["prompt"])
    # tasks2 (added later) comes after every other prompt: the earlier ones keep their places
    first2 = order.index("tasks2") if "tasks2" in order else -1
    report("tasks2_last", first2 > 0 and all(s == "tasks2" for s in order[first2:]),
           f"tasks2 from prompt {first2} of {len(order)}; after it: {sorted(set(order[first2:]))}")
    want = {"writing", "math", "coding", "reasoning"} \
        | ({"translation", "rewriting", "roleplay"} if "chitchat" in lic else set()) \
        | ({"extraction", "summary", "passage-qa"} if "pydoc" in lic else set())
    math_ok = all(re.search(r"\d", t) for t in kinds.get("math", []))
    report("source_tasks", want <= set(kinds) and math_ok,
           f"kinds {sorted(kinds)} (want {sorted(want)}), math prompts with numbers: {math_ok}")
    print(f"# {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
